"""Input validation found missing in review: tensors the llama forward pass would
silently ignore, bad synthetic shapes, ``cooktop run -e`` escapes, and the smoke
test's matmul token counts.

Model files are made here, in ``tmp_path``, with ``cooktop.tools.synth.write``
and copied with extra tensors / metadata through ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import rewrite_gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType

from cooktop.backends.smoke import MATMUL_TOKENS, run_smoke_test
from cooktop.cli.run import process_escapes
from cooktop.errors import CooktopError, UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config
from cooktop.tools import synth

#: A small valid llama: head_dim 16, GQA 2, vocabulary 260 (the SPM minimum).
SMALL = synth.Shape(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, n_ff=64, n_vocab=260, n_ctx_train=64)


def cooktop(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, encoding="utf-8")


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The stderr of a refused command: exit 1 and exactly one ``error: ...`` line, no traceback."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def copy_with(src: pathlib.Path, dst: pathlib.Path, add: dict[str, tuple[np.ndarray, T | None]] = None,
              replace: dict[str, tuple[np.ndarray, T | None]] = None,
              extra_kv: list[tuple[str, object, GGUFValueType]] = ()) -> pathlib.Path:
    """Copy ``src`` to ``dst``, replacing tensors ``replace`` and appending tensors ``add``
    and metadata ``extra_kv`` (conftest.rewrite_gguf)."""
    return rewrite_gguf(src, dst, extra_kv=extra_kv, replace=replace, add=add)


@pytest.fixture
def small(tmp_path) -> pathlib.Path:
    p = tmp_path / "small.gguf"
    synth.write(p, SMALL, "F32")
    return p


def refusal(path: pathlib.Path) -> str:
    with pytest.raises(UnsupportedModelError) as e:
        load_config(open_gguf(path))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# -- 1. config refuses what the forward pass does not implement ----------------
def test_small_synth_loads(small):
    cfg = load_config(open_gguf(small))
    assert (cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_vocab) == (64, 1, 4, 2, 16, 260)


@pytest.mark.parametrize("name, shape, what", [
    ("blk.0.attn_q.bias", (64,), "a bias"),
    ("blk.0.attn_k.bias", (32,), "a bias"),
    ("blk.0.ffn_up.bias", (64,), "a bias"),
    ("output.bias", (260,), "a bias"),
    ("blk.0.attn_sub_norm.weight", (64,), "does not use"),
    ("blk.0.attn_q.extra", (64,), "does not use"),
    ("blk.1.attn_norm.weight", (64,), "block_count = 1"),
    ("something_else.weight", (64,), "does not use"),
])
def test_unused_tensor_refused(small, tmp_path, name, shape, what):
    bad = copy_with(small, tmp_path / "bad.gguf", add={name: (np.ones(shape, np.float32), None)})
    msg = refusal(bad)
    assert repr(name) in msg and what in msg and "not implemented by cooktop" in msg


def test_rope_freqs_of_the_wrong_length_refused_by_cli(small, tmp_path):
    """llama reads rope_freqs (Llama 3.1), of n_rot / 2 = 8 values here; 5 values contradict the metadata."""
    assert load_config(open_gguf(copy_with(small, tmp_path / "ok.gguf",
                                           add={"rope_freqs.weight": (np.ones(8, np.float32), None)}))).n_rot == 16
    bad = copy_with(small, tmp_path / "bad.gguf", add={"rope_freqs.weight": (np.ones(5, np.float32), None)})
    line = one_error_line(cooktop("run", "-m", str(bad), "-p", "a", "-n", "1", "--device", "cpu"))
    assert "'rope_freqs.weight' has shape [5]" in line and "implies [8]" in line


def test_value_length_different_from_key_length_refused(small, tmp_path):
    bad = copy_with(small, tmp_path / "bad.gguf",
                    extra_kv=[("llama.attention.value_length", 32, GGUFValueType.UINT32)])
    msg = refusal(bad)
    assert "'llama.attention.value_length' = 32" in msg and "key_length = 16" in msg


def test_value_length_equal_to_key_length_accepted(small, tmp_path):
    ok = copy_with(small, tmp_path / "ok.gguf", extra_kv=[("llama.attention.value_length", 16, GGUFValueType.UINT32)])
    assert load_config(open_gguf(ok)).head_dim == 16


def test_token_embd_type_without_host_dequantize_refused(small, tmp_path):
    # Q8_1: 32 values in 40 bytes; a valid GGUF type that cooktop.backends.cpu.device cannot dequantize.
    raw = np.zeros((260, 64 // 32 * 40), dtype=np.uint8)
    bad = copy_with(small, tmp_path / "bad.gguf", replace={"token_embd.weight": (raw, T.Q8_1)})
    msg = refusal(bad)
    assert "'token_embd.weight'" in msg and "Q8_1" in msg


@pytest.mark.parametrize("ty", [T.F16, T.BF16])
def test_float_norms_accepted(tmp_path, ty):
    p = tmp_path / "norms.gguf"
    norms = ["output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"]
    synth.write(p, SMALL, "F32", overrides={n: ty for n in norms})
    f = open_gguf(p)
    assert all(f.tensors[n].ggml_type == ty for n in norms)
    assert load_config(f).n_embd == 64


# -- 2. synth validates the shape and leaves nothing behind on failure --------
BAD_SHAPES = [
    (dict(n_embd=0), "n_embd = 0"),
    (dict(n_layer=0), "n_layer = 0"),
    (dict(n_head=-4), "n_head = -4"),
    (dict(n_head_kv=0), "n_head_kv = 0"),
    (dict(n_ff=0), "n_ff = 0"),
    (dict(n_vocab=0), "n_vocab = 0"),
    (dict(n_head=3), "does not divide n_embd"),
    (dict(n_head_kv=3), "does not divide n_head"),
    (dict(n_vocab=259), "n_vocab = 259 must be >= 260"),
    (dict(n_head=64), "head_dim"),
]


@pytest.mark.parametrize("name", sorted(synth.SHAPES))
def test_every_preset_is_a_valid_shape(name):
    """Each ``cooktop synth --shape`` preset passes its own checks (Q8_0: every preset's rows are multiples
    of 32; not all of 256, as K-quants need)."""
    synth.validate(synth.SHAPES[name], "Q8_0")


def test_a_qwen35_shape_needs_its_delta_net_heads():
    import dataclasses
    bad = dataclasses.replace(synth.SHAPES["qwen3.5-0.8b"], ssm_dt_rank=24)  # not a multiple of 16 key heads
    with pytest.raises(CooktopError, match="qwen35 needs ssm_d_state"):
        synth.validate(bad, "F32")


@pytest.mark.parametrize("change, text", BAD_SHAPES)
def test_synth_bad_shape_leaves_no_file(tmp_path, change, text):
    import dataclasses
    with pytest.raises(CooktopError) as e:
        synth.write(tmp_path / "x.gguf", dataclasses.replace(SMALL, **change), "F32")
    assert text in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("file_type, change, text", [
    ("Q4_0", dict(n_embd=48, n_head=4, n_head_kv=2),
     "n_embd = 48 (token_embd.weight) is not a multiple of the Q4_0 block size 32"),
    ("Q8_0", dict(n_ff=80), "n_ff = 80 (blk.0.ffn_down.weight) is not a multiple of the Q8_0 block size 32"),
    ("Q4_K", dict(), "n_embd = 64 (token_embd.weight) is not a multiple of the Q4_K block size 256"),
    ("Q4_K_M", dict(n_embd=256, n_ff=320),
     "n_ff = 320 (blk.0.ffn_down.weight) is not a multiple of the Q6_K block size 256"),
])
def test_synth_block_size_named(tmp_path, file_type, change, text):
    import dataclasses
    with pytest.raises(CooktopError) as e:
        synth.write(tmp_path / "x.gguf", dataclasses.replace(SMALL, **change), file_type)
    assert str(e.value) == "synthetic shape: " + text
    assert list(tmp_path.iterdir()) == []


def test_synth_override_block_size_named(tmp_path):
    with pytest.raises(CooktopError, match="not a multiple of the Q6_K block size 256"):
        synth.write(tmp_path / "x.gguf", SMALL, "F32", overrides={"blk.0.ffn_up.weight": T.Q6_K})
    assert list(tmp_path.iterdir()) == []


def test_synth_failure_mid_write_keeps_old_file_and_no_temp(tmp_path, monkeypatch):
    out = tmp_path / "x.gguf"
    out.write_bytes(b"old")

    def boom(*a, **k):
        raise CooktopError("blk.0.attn_q.weight: broken")
    monkeypatch.setattr(synth, "_write", boom)
    with pytest.raises(CooktopError, match="broken"):
        synth.write(out, SMALL, "F32")
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.gguf"]


def test_synth_success_writes_only_the_output(tmp_path):
    out = tmp_path / "x.gguf"
    n = synth.write(out, SMALL, "Q8_0")
    assert [p.name for p in tmp_path.iterdir()] == ["x.gguf"]
    assert n == 260 * 64 * 2 + 64 + 64 * 64 * 2 + 32 * 64 * 2 + 64 * 64 * 3 + 64 * 2
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert load_config(open_gguf(out)).n_vocab == 260


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


@pytest.mark.parametrize("args, text", [
    (["--n-embd", "64", "--n-layer", "1", "--n-head", "3", "--n-ff", "64"], "n_head = 3 does not divide n_embd = 64"),
    (["--n-embd", "64", "--n-layer", "0", "--n-head", "4", "--n-ff", "64"], "n_layer = 0"),
    (["--n-embd", "64", "--n-layer", "1", "--n-head", "4", "--n-ff", "64", "--n-vocab", "100"], "n_vocab = 100"),
    (["--n-embd", "64", "--n-layer", "1", "--n-head", "4", "--n-ff", "64", "--type", "Q4_K"], "Q4_K block size 256"),
])
def test_synth_cli_bad_shape(tmp_path, args, text):
    out = tmp_path / "x.gguf"
    line = one_error_line(cooktop("synth", *args, "-o", str(out)))
    assert text in line
    assert list(tmp_path.iterdir()) == []


# -- 3. run -e: llama.cpp's string_process_escapes ------------------------------
@pytest.mark.parametrize("src, want", [
    ("a\\x", "a\\x"),                      # incomplete \x: literal
    ("a\\x4", "a\\x4"),
    ("\\x4g", "\\x4g"),                    # not two hex digits: literal
    ("\\u4e2d", "\\u4e2d"),                # unknown escape: literal (llama.cpp has no \u)
    ("h\u00e9llo\\n", "h\u00e9llo\n"),     # non-ASCII text passes through
    ("\u4e2d\\t\u6587", "\u4e2d\t\u6587"),
    ("\\n\\r\\t\\'\\\"\\\\", "\n\r\t'\"\\"),
    ("\\x41\\x62", "Ab"),
    ("\\xe4\\xb8\\xad", "\u4e2d"),          # bytes spelling one UTF-8 character
    ("\\q\\", "\\q\\"),                    # unknown escape and trailing backslash: literal
    ("\\\\n", "\\n"),                      # escaped backslash, then a plain n
    ("\\\u00e9", "\\\u00e9"),              # backslash before a multi-byte character
])
def test_process_escapes(src, want):
    assert process_escapes(src) == want


@pytest.mark.parametrize("src", ["\\xff", "a\\xe4\\xb8", "\\xc3("])
def test_process_escapes_invalid_utf8_is_a_one_line_error(src):
    with pytest.raises(CooktopError, match="not valid UTF-8") as e:
        process_escapes(src)
    assert "\n" not in str(e.value)


def test_process_escapes_surrogateescape_bytes_come_back():
    # argv bytes b"\xc3" b"\xa9" undecodable one by one arrive as surrogates; together they are UTF-8 "é"
    assert process_escapes("\udcc3\udca9\\n") == "\u00e9\n"


@pytest.mark.parametrize("src, want", [
    ("a\\x", "a\\x"),
    ("\\u4e2d", "\\u4e2d"),
    ("h\u00e9llo\\n", "h\u00e9llo\n"),
    ("\\x41\\tb", "A\tb"),
])
def test_run_escape_cli(stories, src, want):
    r = cooktop("run", "-m", str(stories), "-p", src, "-e", "-n", "1", "--temp", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(want)
    assert r.stdout.endswith("\n") and len(r.stdout) > len(want)


def test_run_escape_cli_invalid_utf8(stories):
    line = one_error_line(cooktop("run", "-m", str(stories), "-p", "x\\xff", "-e", "-n", "1", "--device", "cpu"))
    assert "not valid UTF-8" in line


# -- 4. smoke test: matmul with 1, 3 and 8 tokens -------------------------------
class Recording:
    """Wraps a device; records ``(weight type, n_tokens)`` of every matmul; ``corrupt``
    perturbs the result for that token count (a broken kernel)."""

    def __init__(self, dev, corrupt: int | None = None):
        self._dev, self.calls, self.corrupt = dev, [], corrupt

    def __getattr__(self, name):
        return getattr(self._dev, name)

    def matmul(self, out, x, w):
        self.calls.append((w.ggml_type, x.shape[0]))
        self._dev.matmul(out, x, w)
        if x.shape[0] == self.corrupt:
            self._dev.write(out, self._dev.read(out) + 1.0)


def test_smoke_cpu_matmul_token_counts(cpu_device):
    assert MATMUL_TOKENS == (1, 3, 8)
    dev = Recording(cpu_device)
    ok, detail = run_smoke_test(dev)
    assert ok, detail
    assert "n_tokens 1, 3, 8" in detail
    types = {ty for ty, _ in dev.calls}
    assert {T.F32, T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K} <= types
    for ty in types:
        assert sorted(n for t, n in dev.calls if t == ty) == [1, 3, 8], ty.name


@pytest.mark.parametrize("n", [1, 8])
def test_smoke_catches_a_kernel_broken_for_one_token_count(cpu_device, n):
    ok, detail = run_smoke_test(Recording(cpu_device, corrupt=n))
    assert not ok
    assert f"with {n} token(s)" in detail and "matmul F32" in detail


def _cli(*args, env=None):
    import os
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,env,word", [
    (["run", "-m", "{stories}", "-p", "hi", "-n", "-2", "--device", "cpu"], {}, "-n must be"),
    (["run", "-m", "{stories}", "-p", "hi", "-n", "2", "--device", "cpu"], {"COOKTOP_CPU_CACHE": "xyz"},
     "COOKTOP_CPU_CACHE"),
    (["plan", "-m", "{stories}", "--device", "opencl", "-ngl", "auto"], {"COOKTOP_DEVICE_MEMORY": "opencl:0=-5MiB"},
     "sizes must be positive"),
    (["plan", "-m", "{stories}", "--device", "opencl", "-ngl", "auto"], {"COOKTOP_MEMORY_RESERVE": "200"},
     "COOKTOP_MEMORY_RESERVE"),
    (["bench", "-o", "badformat"], {}, "Invalid value for '-o'"),
    (["info", "{stories}", "-c", "-5"], {}, "n_ctx (-c) must be >= 0"),
    (["run", "-m", "{stories}", "-p", "hi", "-c", "-5", "--device", "cpu"], {}, "n_ctx (-c) must be >= 0"),
    (["run", "-f", "/nonexistent-prompt.txt"], {}, "No such file"),
    (["run", "-m", "{stories}", "-p", "hi", "-n", "2", "--repeat-last-n", "-5", "--device", "cpu"], {},
     "repeat_last_n (--repeat-last-n) must be -1 (the context size), 0 (off) or a positive count of tokens, "
     "got -5"),
    (["bench", "-m", "{stories}", "-p", "8", "-n", "2", "-r", "1", "--plot", "/nonexistent-dir/x.png"], {},
     "does not exist"),
])
def test_cli_bad_values_give_one_line_errors(stories, args, env, word):
    r = _cli(*[a.replace("{stories}", str(stories)) for a in args], env=env)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and word in lines[-1], r.stderr
    assert "Traceback" not in r.stderr
