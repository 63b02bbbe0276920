"""Malformed model files: every one ends ``cooktop info`` and ``cooktop run`` with
exit code 1 and a single ``error: ...`` line naming the problem.

The files are made here, in ``tmp_path``: by rewriting stories260K with
``gguf.GGUFWriter`` (metadata changes) or by patching bytes of a copy of it at
offsets taken from its parsed header (tensor-info fields).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import rewrite_gguf
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from cooktop.errors import GGUFError, UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config

COOKTOP = [str(pathlib.Path(sys.executable).parent / "cooktop")]


# -- builders -----------------------------------------------------------------
def rewrite(src: pathlib.Path, dst: pathlib.Path, drop: tuple[str, ...] = (), arch: str | None = None,
            extra: list[tuple[str, object, GGUFValueType]] = ()) -> None:
    """Copy ``src`` to ``dst`` dropping metadata keys ``drop``, adding ``extra`` and
    optionally changing ``general.architecture`` (conftest.rewrite_gguf)."""
    rewrite_gguf(src, dst, drop=drop, arch=arch, extra_kv=extra)


def tensor_info_offsets(path: pathlib.Path, name: str) -> dict[str, int]:
    """File offsets of the fields of tensor ``name``'s info record (GGUF spec:
    name (u64 len + bytes), n_dims u32, dims u64[n_dims], type u32, offset u64)."""
    r = GGUFReader(path)
    t = next(t for t in r.tensors if t.name == name)
    start = t.field.offset
    n_dims_at = start + 8 + len(name.encode())
    dims_at = n_dims_at + 4
    type_at = dims_at + 8 * len(t.shape)
    return {"n_dims": n_dims_at, "dims": dims_at, "type": type_at, "offset": type_at + 4,
            "data_offset": int(r.data_offset), "data_start": int(t.data_offset), "n_bytes": int(t.n_bytes)}


def kv_value_offset(path: pathlib.Path, key: str) -> int:
    """File offset of the (scalar) value of metadata ``key``."""
    r = GGUFReader(path)
    f = r.fields[key]
    return f.offset + 8 + len(key.encode()) + 4


def patched(src: pathlib.Path, dst: pathlib.Path, patches: list[tuple[int, bytes]], size: int | None = None):
    data = bytearray(src.read_bytes())
    for off, b in patches:
        data[off:off + len(b)] = b
    if size is not None:
        data = data[:size]
    dst.write_bytes(bytes(data))
    return dst


LAST = "output.weight"  # the tensor whose offset is patched


def make_case(name: str, stories: pathlib.Path, d: pathlib.Path) -> pathlib.Path:
    """Write the malformed file of case ``name`` under ``d``; return its path."""
    p = d / f"{name}.gguf"
    if name == "text_file":
        p.write_text("This is not a model.\nJust some text.\n")
    elif name == "safetensors":
        header = b'{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
        p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    elif name == "empty":
        p.write_bytes(b"")
    elif name == "header_few_bytes":
        p.write_bytes(b"GGUF\x03\x00")
    elif name == "version_4":
        patched(stories, p, [(4, struct.pack("<I", 4))])
    elif name == "big_endian":  # what gguf-py writes with endianess=BIG (llama.cpp's s390x files)
        from gguf import GGUFEndian
        w = GGUFWriter(p, arch="llama", endianess=GGUFEndian.BIG)
        w.add_uint32("llama.block_count", 1)
        w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    elif name == "header_cut":  # magic/version/counts fine, file ends inside the metadata
        patched(stories, p, [], size=1000)
    elif name == "array_count":  # 2**40 scores: gguf's reader alone would loop (and allocate) for ever
        at = kv_value_offset(stories, "tokenizer.ggml.scores") + 4  # after the element type
        patched(stories, p, [(at, struct.pack("<Q", 2**40))])
    elif name == "data_cut":  # valid header, file ends in the middle of the tensor data
        info = tensor_info_offsets(stories, LAST)
        patched(stories, p, [], size=(info["data_offset"] + stories.stat().st_size) // 2)
    elif name == "past_end":  # one tensor's offset points beyond the end of the file
        info = tensor_info_offsets(stories, LAST)
        far = (stories.stat().st_size - info["data_offset"] + 4096) // 32 * 32
        patched(stories, p, [(info["offset"], struct.pack("<Q", far))])
    elif name == "zero_dim":
        info = tensor_info_offsets(stories, "blk.0.attn_q.weight")
        patched(stories, p, [(info["dims"] + 8, struct.pack("<Q", 0))])
    elif name == "huge_dim":  # 2**62 rows: the byte count must not overflow into something that fits
        info = tensor_info_offsets(stories, "blk.0.attn_q.weight")
        patched(stories, p, [(info["dims"] + 8, struct.pack("<Q", 2**62))])
    elif name == "unknown_type":
        info = tensor_info_offsets(stories, "blk.0.attn_q.weight")
        patched(stories, p, [(info["type"], struct.pack("<I", 99))])
    elif name == "alignment_48":
        base = d / "aligned_base.gguf"
        r = GGUFReader(stories)
        w = GGUFWriter(base, arch="llama")
        w.add_custom_alignment(64)
        for key, field in r.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
        for t in r.tensors:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        patched(base, p, [(kv_value_offset(base, "general.alignment"), struct.pack("<I", 48))])
    elif name == "missing_key":
        rewrite(stories, p, drop=("llama.embedding_length",))
    elif name == "arch_gpt2":
        rewrite(stories, p, arch="gpt2")
    elif name == "arch_mamba":
        rewrite(stories, p, arch="mamba")
    elif name == "ff_mismatch":  # metadata n_ff 100, tensors built for 172
        patched(stories, p, [(kv_value_offset(stories, "llama.feed_forward_length"), struct.pack("<I", 100))])
    elif name == "layers_missing":  # block_count 9, tensors for 5 blocks
        patched(stories, p, [(kv_value_offset(stories, "llama.block_count"), struct.pack("<I", 9))])
    elif name == "context_zero":
        patched(stories, p, [(kv_value_offset(stories, "llama.context_length"), struct.pack("<I", 0))])
    elif name == "embd_string":  # a number stored as a string
        rewrite(stories, p, drop=("llama.embedding_length",),
                extra=[("llama.embedding_length", "sixty-four", GGUFValueType.STRING)])
    elif name == "directory":
        p = d / "model_dir.gguf"
        p.mkdir()
    elif name == "nonexistent":
        p = d / "does_not_exist.gguf"
    else:  # pragma: no cover
        raise KeyError(name)
    return p


#: case -> (words the message must contain (lower case), error type raised by open_gguf/load_config)
CASES: dict[str, tuple[tuple[str, ...], type]] = {
    "text_file": (("not a gguf", "magic"), GGUFError),
    "safetensors": (("not a gguf", "magic", "safetensors"), GGUFError),
    "empty": (("empty",), GGUFError),
    "header_few_bytes": (("truncated", "header"), GGUFError),
    "version_4": (("version 4", "not supported"), GGUFError),
    "big_endian": (("big-endian gguf (version 3)", "gguf-convert-endian", "little"), GGUFError),
    "header_cut": (("truncated", "header"), GGUFError),
    "array_count": (("corrupt", "tokenizer.ggml.scores"), GGUFError),
    "data_cut": (("truncated", "past the end"), GGUFError),
    "past_end": (("past the end", LAST), GGUFError),
    "zero_dim": (("zero-size", "blk.0.attn_q.weight"), GGUFError),
    "huge_dim": (("past the end", "blk.0.attn_q.weight"), GGUFError),
    "unknown_type": (("unknown ggml type", "99", "blk.0.attn_q.weight"), GGUFError),
    "alignment_48": (("general.alignment", "48", "power of two"), GGUFError),
    "missing_key": (("missing", "llama.embedding_length"), UnsupportedModelError),
    "arch_gpt2": (("unsupported architecture", "gpt2"), UnsupportedModelError),
    "arch_mamba": (("unsupported architecture", "mamba"), UnsupportedModelError),
    "ff_mismatch": (("blk.0.ffn_gate.weight", "shape", "n_ff 100"), UnsupportedModelError),
    "layers_missing": (("missing tensor", "blk.5.", "block_count = 9"), UnsupportedModelError),
    "context_zero": (("llama.context_length", "= 0"), UnsupportedModelError),
    "embd_string": (("llama.embedding_length", "sixty-four", "not a single number"), UnsupportedModelError),
    "directory": (("directory",), GGUFError),
    "nonexistent": (("no such file",), GGUFError),
}


@pytest.fixture(scope="module")
def cases(stories, tmp_path_factory) -> dict[str, pathlib.Path]:
    d = tmp_path_factory.mktemp("bad_gguf")
    return {name: make_case(name, stories, d) for name in CASES}


def _check_message(msg: str, words: tuple[str, ...]) -> None:
    low = msg.lower()
    for w in words:
        assert w.lower() in low, f"{w!r} not in {msg!r}"


# -- the loader ---------------------------------------------------------------
def test_builders_start_from_a_valid_file(stories, tmp_path):
    """The rewrite helper itself produces a loadable model (so the cases test one defect each)."""
    p = tmp_path / "copy.gguf"
    rewrite(stories, p)
    cfg = load_config(open_gguf(p))
    assert (cfg.n_embd, cfg.n_layer, cfg.n_vocab) == (64, 5, 512)


@pytest.mark.parametrize("case", list(CASES))
def test_open_raises_typed_error(cases, case):
    words, etype = CASES[case]
    with pytest.raises(etype) as ei:
        load_config(open_gguf(cases[case]))
    msg = str(ei.value)
    assert "\n" not in msg
    assert str(cases[case]) in msg
    _check_message(msg, words)


# -- the CLI ------------------------------------------------------------------
# Every case runs through the real entry point (cooktop.cli.main:main, what the
# ``cooktop`` script calls) in one Python process (_DRIVER), which costs one import
# instead of one per command; a subset also runs as separate ``cooktop`` processes,
# and the two must agree.

#: Cases also run as one ``cooktop`` process per command.
SUBPROCESS_CASES = ("text_file", "data_cut", "arch_gpt2", "directory")

_DRIVER = r"""
import contextlib, io, json, logging, sys, traceback
from cooktop.cli.main import main
results = []
for args in json.loads(sys.stdin.read()):
    logging.root.handlers.clear()  # the CLI's basicConfig binds the sys.stderr of its first call
    err, out, rc = io.StringIO(), io.StringIO(), 0
    sys.argv = ["cooktop", *args]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what the interpreter would do with an uncaught exception
            traceback.print_exc()
            rc = 1
    results.append({"returncode": rc, "stderr": err.getvalue()})
print(json.dumps(results))
"""


def _env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*COOKTOP, *args], capture_output=True, text=True, timeout=60, env=_env())


def _cli_batch(jobs: list[tuple[str, ...]]) -> list[subprocess.CompletedProcess]:
    """Run each argument list through cooktop's entry point in one subprocess."""
    res = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(jobs), capture_output=True, text=True,
                         timeout=60 + 5 * len(jobs), env=_env())
    assert res.returncode == 0, res.stderr
    return [subprocess.CompletedProcess(args, r["returncode"], "", r["stderr"])
            for args, r in zip(jobs, json.loads(res.stdout.strip().splitlines()[-1]))]


def _assert_one_error_line(res: subprocess.CompletedProcess, words: tuple[str, ...], only_line: bool = True):
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    if only_line:
        assert lines == errors, res.stderr
    _check_message(errors[0], words)


def _jobs(cases) -> dict[tuple[str, str], tuple[str, ...]]:
    jobs = {}
    for case, path in cases.items():
        jobs[(case, "info")] = ("info", str(path))
        jobs[(case, "run")] = ("run", "-m", str(path), "-p", "hi", "-n", "1", "--device", "cpu")
    return jobs


@pytest.fixture(scope="module")
def cli_results(cases) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """``cooktop info`` and ``cooktop run`` on every case (entry point, one process)."""
    jobs = _jobs(cases)
    return dict(zip(jobs, _cli_batch(list(jobs.values()))))


@pytest.fixture(scope="module")
def cli_subprocess_results(cases) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """The same for SUBPROCESS_CASES, one ``cooktop`` process per command (~0.5 s each)."""
    jobs = {k: v for k, v in _jobs(cases).items() if k[0] in SUBPROCESS_CASES}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {key: pool.submit(_cli, *args) for key, args in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


@pytest.mark.parametrize("command", ["info", "run"])
@pytest.mark.parametrize("case", list(CASES))
def test_cli_fails_cleanly(cli_results, case, command):
    _assert_one_error_line(cli_results[(case, command)], CASES[case][0])


@pytest.mark.parametrize("command", ["info", "run"])
@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_cooktop_process_fails_cleanly(cli_subprocess_results, cli_results, case, command):
    res = cli_subprocess_results[(case, command)]
    _assert_one_error_line(res, CASES[case][0])
    assert res.stderr == cli_results[(case, command)].stderr  # the in-process driver is faithful


def test_prompt_longer_than_context(stories):
    long_prompt = "Once upon a time there was a little girl who liked to play in the park. " * 4
    res = _cli("run", "-m", str(stories), "-c", "16", "-p", long_prompt, "-n", "4", "--device", "cpu")
    _assert_one_error_line(res, ("n_ctx = 16", "prompt"), only_line=False)


def test_random_header_corruption_never_escapes(stories, tmp_path):
    """Byte flips, 64-bit garbage and truncations in the header: each file loads or raises
    a CooktopError, quickly (the gguf reader alone loops for ever on some corrupt counts)."""
    import random
    import time

    from cooktop.errors import CooktopError

    src = stories.read_bytes()
    header_end = tensor_info_offsets(stories, "output.weight")["data_offset"]
    rng = random.Random(2)
    p = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for i in range(200):
        b = bytearray(src)
        mode = i % 3
        if mode == 0:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(header_end)] = rng.randrange(256)
        elif mode == 1:
            pos = rng.randrange(header_end) // 8 * 8
            b[pos:pos + 8] = rng.randrange(2**64).to_bytes(8, "little")
        else:
            b = b[:rng.randrange(len(b))]
        p.write_bytes(bytes(b))
        t0 = time.monotonic()
        try:
            load_config(open_gguf(p))
            outcomes["ok"] += 1
        except CooktopError as e:
            assert "\n" not in str(e)
            outcomes["error"] += 1
        assert time.monotonic() - t0 < 30, f"mutation {i} (mode {mode}) hangs"  # hang guard, not a timing
    assert outcomes["error"] > 100, outcomes
