"""Bad input a fresh user tried on the CLI: each is refused in one line (exit 1) before any work,
or named clearly when it can only show while running."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import SHARED


def cooktop(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    """The ``error: ...`` line of a command that must have failed with exit 1 and no traceback."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_bench_plot_format_refused_before_any_work(stories, tmp_path):
    (tmp_path / "b.json").write_text("[]")
    for args in (["--from", str(tmp_path / "b.json")],
                 ["-m", str(stories), "--device", "cpu", "-p", "8", "-n", "0", "-r", "1"]):
        r = cooktop("bench", *args, "--plot", str(tmp_path / "x.txt"))
        line = one_line_error(r)
        assert "--plot" in line and "'.txt'" in line and "png" in line and "svg" in line
        assert r.stdout == ""  # nothing was measured or read
    assert not (tmp_path / "x.txt").exists()


@pytest.mark.parametrize("name,value,words", [
    ("COOKTOP_DEQUANT_THREADS", "0", "integer 1..256"), ("COOKTOP_DEQUANT_THREADS", "-1", "integer 1..256"),
    ("COOKTOP_DEQUANT_THREADS", "x", "integer 1..256"), ("COOKTOP_DEQUANT_THREADS", "1000", "integer 1..256"),
    ("COOKTOP_OPENCL_Q8", "maybe", "not a boolean"), ("COOKTOP_OPENCL_VNNI", "banana", "not a boolean"),
    ("COOKTOP_OPENCL_MMQ_K", "2", "not a boolean"), ("COOKTOP_OPENCL_Q8K", "k", "not a boolean"),
    ("COOKTOP_OPENCL_REPLAY", "maybe", "not a boolean"), ("COOKTOP_VULKAN_Q8K", "kay", "not a boolean"),
    ("COOKTOP_PROBE_TIMEOUT", "abc", "number >= 1"), ("COOKTOP_PROBE_TIMEOUT", "0", "number >= 1"),
    ("COOKTOP_PROBE_TIMEOUT", "-5", "number >= 1"), ("COOKTOP_PROBE_ISOLATION", "maybe", "not a boolean"),
    ("COOKTOP_DISABLE", "foo", "unknown 'foo'"),
])
def test_bad_env_settings_are_refused_in_one_line(stories, name, value, words):
    r = cooktop("plan", "-m", str(stories), "--device", "cpu", env={name: value})
    line = one_line_error(r)
    assert line.startswith(f"error: {name}") and words in line, line
    assert r.stdout == ""


def test_env_settings_take_llama_style_booleans(monkeypatch):
    from cooktop import settings
    for raw, want in [("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False), ("false", False),
                      ("No", False), ("off", False), ("", True)]:
        monkeypatch.setenv("COOKTOP_OPENCL_Q8", raw)
        assert settings.opencl_q8() is want, raw
    monkeypatch.setenv("COOKTOP_DEQUANT_THREADS", "3")
    assert settings.dequant_threads() == 3
    monkeypatch.setenv("COOKTOP_PROBE_TIMEOUT", "2.5")
    assert settings.probe_timeout(60) == 2.5


@pytest.mark.parametrize("raw,words", [
    ("opencl:0=1GiB/0", "sizes must be positive"), ("opencl:0=-5MiB", "sizes must be positive"),
    ("opencl:0=1GiB/1B", "at least 4 KiB, got 1 bytes"), ("opencl:0=1GiB/4095", "at least 4 KiB"),
    ("opencl:0=1e99GiB", "at most 2^60 bytes"), ("opencl:0=99999999999999999999999999TiB", "at most 2^60"),
    ("opencl:0=1GiB/1048577TiB", "at most 2^60"), ("opencl:0=infGiB", "expected e.g."),
    ("opencl:0=nanGiB", "expected e.g."), ("opencl:0=1GiB/2EiB", "expected e.g."),
    ("=1GiB", "no device selector before '='"), (" =1GiB", "no device selector"),
    ("opencl:0=1GiB,opencl:0=2GiB", "opencl:0 is given twice"), ("OpenCL:0=1GiB,opencl:0=2GiB", "given twice"),
    ("opencl:0", "expected SELECTOR=SIZE"),
])
def test_bad_device_memory_is_refused(monkeypatch, raw, words):
    from cooktop import settings
    from cooktop.errors import DeviceError
    monkeypatch.setenv("COOKTOP_DEVICE_MEMORY", raw)
    with pytest.raises(DeviceError, match="bad COOKTOP_DEVICE_MEMORY entry") as e:
        settings.device_memory()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_device_memory_takes_sane_sizes(monkeypatch):
    from cooktop import settings
    monkeypatch.setenv("COOKTOP_DEVICE_MEMORY", "OpenCL:0=1GiB/4KiB, vulkan:0=1048576TiB/1048576TiB,cpu=2GiB")
    assert settings.device_memory() == {"opencl:0": (1 << 30, 4096), "vulkan:0": (1 << 60, 1 << 60),
                                        "cpu": (2 << 30, None)}


def test_bad_device_memory_is_one_line_in_the_cli(stories):
    r = cooktop("plan", "-m", str(stories), "--device", "cpu", env={"COOKTOP_DEVICE_MEMORY": "=1GiB"})
    line = one_line_error(r)
    assert "no device selector" in line, line


def test_device_memory_for_no_such_device_warns(stories):
    r = cooktop("plan", "-m", str(stories), "--device", "cpu", env={"COOKTOP_DEVICE_MEMORY": "opencl:9=1GiB"})
    assert r.returncode == 0, r.stderr
    assert "COOKTOP_DEVICE_MEMORY names opencl:9, which is no device here" in r.stderr


def test_opencl_options_the_compiler_refuses_fail_before_loading(stories):
    from conftest import open_family_device
    open_family_device("opencl")  # skips (or fails under COOKTOP_REQUIRE) without an OpenCL device
    r = cooktop("run", "-m", str(stories), "-p", "Once", "-n", "4", "--device", "opencl",
                env={"COOKTOP_OPENCL_OPTIONS": "-DNOPE garbage"})
    line = one_line_error(r)
    assert line.startswith("error: COOKTOP_OPENCL_OPTIONS='-DNOPE garbage'") and "refuses these build options" in line
    assert "garbage" in line.split("refuses these build options")[1]
    assert r.stdout == "" and "because it was named" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_weight_type_no_device_runs_is_refused_by_plan_and_run(stories, tmp_path):
    """An NVFP4 output head (no cooktop device runs NVFP4): plan and run name the file and the tensor."""
    import numpy as np
    from conftest import rewrite_gguf
    from gguf import GGMLQuantizationType as T
    raw = np.random.default_rng(0).integers(0, 256, size=(512, 64 // 64 * 36), dtype=np.uint8)
    model = rewrite_gguf(stories, tmp_path / "nvfp4.gguf", replace={"output.weight": (raw, T.NVFP4)})
    want = f"error: {model}: tensor output.weight is NVFP4, a type no device in use (cpu) can run matmul on"
    assert one_line_error(cooktop("plan", "-m", str(model), "--device", "cpu")) == want
    r = cooktop("run", "-m", str(model), "-p", "Once", "-n", "2", "--device", "cpu")
    assert one_line_error(r) == want and r.stdout == ""


def test_nan_weights_are_named_not_blamed_on_logit_bias(stories, tmp_path):
    import numpy as np
    from conftest import rewrite_gguf
    from gguf import GGMLQuantizationType as T

    from cooktop import Llama
    from cooktop.errors import CooktopError
    nan = rewrite_gguf(stories, tmp_path / "nan.gguf",
                       replace={"token_embd.weight": (np.full((512, 64), np.nan, np.float32), T.F32)})
    want = "error: the model produced NaN logits at position 1 (weights or activations not finite)"
    for temp in ("0", "0.8"):
        assert one_line_error(cooktop("run", "-m", str(nan), "-p", "Once", "-n", "4", "--temp", temp,
                                      "--device", "cpu")) == want
    llm = Llama(model_path=str(nan), n_ctx=64, verbose=False, device="cpu")
    with pytest.raises(CooktopError, match="NaN logits at position 1"):
        llm.create_completion("Once", max_tokens=2)


def test_ngl_auto_note_counts_like_the_summary(stories):
    """cpu named in --device takes a share: the note and the summary both count units off the host."""
    import re

    from cooktop.format.gguf import open_gguf
    from cooktop.model.config import load_config
    from cooktop.runtime.placement import place
    gf = open_gguf(stories)
    cfg = load_config(gf)
    p = place(gf, cfg, ["cpu", "opencl:0", "vulkan:0"], "auto", None, lambda *a, **k: "", lambda s: (1 << 30, None),
              256, 64, False)
    summary = re.match(r"offloaded (\d+)/6 layers: ", p.summary())
    assert summary and summary.group(1) == str(p.n_offloaded()) and 0 < p.n_offloaded() < 6, p.summary()
    assert f"-ngl auto offloaded {p.n_offloaded()} of 6 layers (-ngl 6; cpu, named in --device, runs its share)" \
        in p.notes, p.notes


def test_synth_refuses_a_negative_rope_scaling_factor(tmp_path):
    out = tmp_path / "neg.gguf"
    r = cooktop("synth", "--n-embd", "64", "--n-layer", "1", "--n-head", "2", "--n-ff", "128", "--n-vocab", "300",
                "--rope-scaling-factor", "-3", "-o", str(out))
    assert one_line_error(r) == ("error: synthetic shape: rope_scaling_factor = -3.0 must be a finite number >= 0 "
                                 "(0 = no scaling), as the loader requires")
    assert not out.exists()


def test_synth_types_read_as_llama_cpp_writes_them(tmp_path):
    """--type lists Q8_0, not Q8-0 (the group turns "_" into "-" for option names), and takes any case."""
    r = cooktop("synth", "--help")
    assert "Q8_0|Q4_0" in r.stdout and "Q4_K_M|MXFP4_MOE" in r.stdout and "Q8-0" not in r.stdout, r.stdout
    out = tmp_path / "q3.gguf"
    r = cooktop("synth", "--n-embd", "256", "--n-layer", "1", "--n-head", "2", "--n-ff", "256", "--n-vocab", "300",
                "--type", "q3_k", "-o", str(out))
    assert r.returncode == 0 and ", Q3_K, " in r.stdout + r.stderr, r.stderr
    r = cooktop("synth", "--n-embd", "256", "--n-layer", "1", "--n-head", "2", "--n-ff", "256", "--n-vocab", "300",
                "--type", "Q9_0", "-o", str(out))
    assert r.returncode != 0 and "'Q9_0' is not one of 'F32', 'F16', 'Q8_0'" in r.stderr, r.stderr


def test_context_past_the_training_context_warns_like_llama_cpp(stories):
    r = cooktop("run", "-m", str(stories), "-p", "Once", "-n", "2", "-c", "8192", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "cooktop: n_ctx_seq (8192) > n_ctx_train (2048) -- possible training context overflow" in r.stderr
    r = cooktop("run", "-m", str(stories), "-p", "Once", "-n", "2", "-c", "2048", "--device", "cpu")
    assert r.returncode == 0 and "n_ctx_train" not in r.stderr


def test_plan_refuses_what_run_refuses_and_names_the_flash_choice(stories):
    """``plan`` applies llama.cpp's cache-type rules as ``run`` does (a quantized V cache with
    ``-fa off``; a block size not dividing head_dim) and reports the resolved ``-fa``; ``-fa``
    takes llama.cpp's values, ``-1`` (auto) included; ``info`` takes ``-fa`` as the other commands."""
    tiny = SHARED / "models" / "tiny" / "tiny-Q8_0.gguf"
    r = cooktop("plan", "-m", str(tiny), "--device", "cpu", "-ctv", "q8_0", "-fa", "off")
    assert "quantized V cache (q8_0) requires flash attention" in one_line_error(r)
    r = cooktop("plan", "-m", str(stories), "--device", "cpu", "-ctv", "q8_0")
    assert "does not divide head_dim 8" in one_line_error(r)
    for fa, want in (("-1", "on"), ("off", "off"), ("auto", "on")):
        r = cooktop("plan", "-m", str(stories), "--device", "cpu", "-fa", fa, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["flash_attn"] == want
    r = cooktop("info", str(stories), "-fa", "off", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kv_cache"]["flash_attn"] == "off"
