"""``cooktop bench``: llama-bench-style sweeps, output formats, plot, --ops roofline, --vs llama.cpp.

The CLI runs as a user runs it (subprocess). Devices that are missing are
skipped through ``skip_or_fail`` (COOKTOP_REQUIRE turns that into a failure);
devices that are present must produce measurements.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import skip_or_fail

from cooktop.backends import registry
from cooktop.backends.base import DEVICE_WEIGHT_TYPES, type_name
from cooktop.bench.report import to_markdown
from cooktop.bench.runner import ModelFacts, Result, TestSpec, make_tests
from cooktop.errors import CooktopError


def cooktop(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def _usable(family: str) -> tuple[bool, str]:
    """(usable, why not) for the first device of a family: probed and smoke-tested."""
    res = registry.probe(family)
    if not res.available:
        return False, f"{res.reason}; to enable: {res.hint}"
    st = registry.smoke_test(res.devices[0].selector)
    return st.ok, st.detail


def _check_samples(rec: dict, reps: int) -> None:
    n = rec["n_prompt"] + rec["n_gen"]
    assert rec["error"] is None, rec["error"]
    assert len(rec["samples_ts"]) == reps and len(rec["samples_s"]) == reps
    for ts, s in zip(rec["samples_ts"], rec["samples_s"]):
        assert s > 0 and ts == pytest.approx(n / s)
    assert rec["avg_ts"] == pytest.approx(np.mean(rec["samples_ts"]))
    assert rec["stddev_ts"] == pytest.approx(np.std(rec["samples_ts"], ddof=1), abs=1e-9)


# -- units --------------------------------------------------------------------

def test_make_tests_names_follow_llama_bench():
    tests = make_tests([512, 0], [128], [(512, 128)])
    assert [t.name for t in tests] == ["pp512", "tg128", "pp512+tg128"]
    assert [t.n_tokens for t in tests] == [512, 128, 640]
    with pytest.raises(CooktopError):
        make_tests([0], [0], [])
    with pytest.raises(CooktopError):
        make_tests([-1], [1], [])


def test_result_statistics_and_markdown_error_note():
    mf = ModelFacts("/x.gguf", "llama 1.1B Q4_0", 606 << 20, 1_100_048_384, 32000, "Q4_0")
    ok = Result(mf, "numpy", "cpu", "cpu", -1, 512, None, TestSpec(0, 10), samples_s=[0.5, 0.25])
    assert ok.samples_ts == [20.0, 40.0]
    assert ok.avg_ts == 30.0 and ok.stddev_ts == pytest.approx(14.1421356)
    bad = Result(mf, "vulkan", "vulkan:0", "?", -1, 512, None, TestSpec(0, 10), error="device 'vulkan' is unavailable")
    md = to_markdown([ok, bad])
    lines = md.splitlines()
    assert lines[0].split("|")[1:-1] == [c.ljust(len(c)) for c in lines[0].split("|")[1:-1]]
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "model", "size", "params", "backend", "device", "ngl", "n_batch", "test", "t/s"]
    assert "30.00 ± 14.14" in lines[2] and "606.00 MiB" in lines[2] and "1.10 B" in lines[2]
    assert "error [1]" in lines[3]
    assert "[1] device 'vulkan' is unavailable" in md


# -- the command ----------------------------------------------------------------

@pytest.mark.vulkan
def test_bench_json_one_record_per_device_and_test(stories, tmp_path):
    r = cooktop("bench", "-m", str(stories), "--device", "cpu,opencl,vulkan", "-p", "64", "-n", "16", "-r", "2",
                "-o", "json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    recs = json.loads(r.stdout)
    assert len(recs) == 6
    by_dev: dict[str, list[dict]] = {}
    for rec in recs:
        by_dev.setdefault(rec["backend"], []).append(rec)
        m = rec["machine"]
        assert m["cpu"] and m["cores_logical"] >= 1 and m["python"] and m["packages"]["numpy"] == np.__version__
        assert rec["model_n_params"] > 0 and rec["model_size"] > 0
    assert sorted(by_dev) == ["numpy", "opencl", "vulkan"]
    missing = []
    for backend, family in (("numpy", "cpu"), ("opencl", "opencl"), ("vulkan", "vulkan")):
        rs = by_dev[backend]
        assert sorted(x["test"] for x in rs) == ["pp64", "tg16"]
        ok, why = _usable(family)
        if not ok:
            assert all(x["error"] and x["samples_ts"] == [] for x in rs)  # reported, not crashed
            missing.append((family, why))
            continue
        for x in rs:
            _check_samples(x, 2)
    saved = tmp_path / "bench.json"
    saved.write_text(r.stdout)
    again = cooktop("bench", "--from", str(saved), "-o", "md")  # re-rendered, not re-measured
    assert again.returncode == 0, again.stderr
    table = [ln for ln in again.stdout.splitlines() if ln.startswith("| llama")]
    assert len(table) == 6
    assert all(f"{x['avg_ts']:.2f} ± " in again.stdout for x in recs if x["avg_ts"] and x["avg_ts"] >= 1)
    for family, why in missing:
        skip_or_fail(family, why)


def test_bench_md_table_and_plot(stories, tmp_path):
    png = tmp_path / "bench.png"
    r = cooktop("bench", "-m", str(stories), "--device", "cpu,opencl:9", "-p", "32", "-n", "8", "-r", "1",
                "--plot", str(png))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "model", "size", "params", "backend", "device", "ngl", "n_batch", "test", "t/s"]
    assert re.fullmatch(r"\|[ -:|]+\|", lines[1])
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    assert [(x[3], x[4], x[7]) for x in rows] == [("numpy", "cpu", "pp32"), ("numpy", "cpu", "tg8"),
                                                 ("opencl", "opencl:9", "pp32"), ("opencl", "opencl:9", "tg8")]
    assert all(re.fullmatch(r"\d+\.\d\d\d? ± \d+\.\d\d\d?", x[8]) for x in rows[:2])
    assert rows[2][8] == "error [1]" and "[1] " in r.stdout  # a missing device is a row, not a crash
    from PIL import Image
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (1200, 675)
        px = np.asarray(im.convert("L"))
    assert px.std() > 10  # something was drawn


def test_bench_bad_model_is_one_line_error(tmp_path):
    r = cooktop("bench", "-m", str(tmp_path / "nope.gguf"), "--device", "cpu", "-p", "8", "-n", "0", "-r", "1")
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_cpu_copy_op(cpu_device):
    x = cpu_device.empty((4, 8))
    out = cpu_device.empty((4, 8))
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    cpu_device.write(x, data)
    cpu_device.copy(out, x)
    np.testing.assert_array_equal(cpu_device.read(out), data)


def test_ops_cpu_json_percentages():
    r = cooktop("bench", "--ops", "--device", "cpu", "--quick", "--types", "Q4_0,Q8_0", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    copy = [x for x in recs if x["op"] == "copy"][0]
    assert copy["gbps"] > 0.1 and copy["peak_source"] == "copy"
    assert copy["gbps"] == pytest.approx(copy["bytes"] / copy["seconds"] / 1e9)
    mm = [x for x in recs if x["op"] == "matmul"]
    assert {x["type"] for x in mm} == {"Q4_0", "Q8_0"}
    for x in mm:
        assert x["pct_of_peak"] == pytest.approx(100 * x["gbps"] / copy["gbps"])
        assert x["gflops"] == pytest.approx(2 * x["n_tokens"] * 2048 * int(x["shape"].split()[0]) / x["seconds"] / 1e9)
    assert {x["n_tokens"] for x in recs if x["op"] == "rmsnorm"} == {1, 32}


def test_ops_opencl_quick():
    ok, why = _usable("opencl")
    if not ok:
        skip_or_fail("opencl", why)
    r = cooktop("bench", "--ops", "--device", "opencl", "--quick")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    m = re.search(r"copy: (\d+\.\d+) GB/s", out)
    assert m or "copy: not supported on this backend" in out
    pct_col = "% of copy peak" if m else "% of best matmul BW"
    assert pct_col in out
    info = registry.probe("opencl").devices[0]
    for t in DEVICE_WEIGHT_TYPES:
        if type_name(t) in info.types:
            rows = [ln for ln in out.splitlines() if ln.startswith(f"| matmul | {type_name(t)} |")]
            assert rows, f"no row for {type_name(t)}"
            pct = float(rows[0].strip("|").split("|")[-1])
            assert 0 < pct < 1000
    assert "| rmsnorm | F32 |" in out


def _has_llama_cpp() -> bool:
    import importlib

    try:
        importlib.import_module("llama_cpp")
    except Exception:  # noqa: BLE001 - ImportError, or OSError from its shared library
        return False
    return True


def test_vs_llama_cpp_records_and_ratios(stories):
    if not _has_llama_cpp():
        skip_or_fail("llama_cpp", "llama-cpp-python not installed (pip install 'cooktop[compare]')")
    r = cooktop("bench", "--vs", "llama.cpp", "-m", str(stories), "--device", "cpu", "-p", "32", "-n", "8",
                "-r", "2", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    ours = [x for x in recs if x["backend"] == "numpy"]
    theirs = [x for x in recs if x["backend"] == "llama.cpp"]
    assert sorted(x["test"] for x in ours) == sorted(x["test"] for x in theirs) == ["pp32", "tg8"]
    for x in ours + theirs:
        _check_samples(x, 2)
    for x in ours:
        assert x["llama_cpp_ts"] > 0
        assert x["ratio"] == pytest.approx(x["avg_ts"] / x["llama_cpp_ts"])
        ref = next(y for y in theirs if y["test"] == x["test"])
        assert x["llama_cpp_ts"] == pytest.approx(ref["avg_ts"])  # the same interleaved runs


def test_vs_without_llama_cpp_says_how_to_install(stories, tmp_path):
    fake = tmp_path / "llama_cpp"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = cooktop("bench", "--vs", "llama.cpp", "-m", str(stories), "--device", "cpu", "-p", "8", "-n", "2", "-r", "1",
                env=env)
    assert r.returncode == 1
    assert "pip install 'cooktop[compare]'" in r.stderr and "CMAKE_ARGS" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: ")


class _FakeRef:
    """A reference engine that logs its calls (for the interleaving order) and takes a fixed time."""

    backend, device, device_name, placement, load_ms = "llama.cpp", "cpu", "fake", "", 0.0

    def __init__(self, log: list):
        self.log = log

    def reset(self):
        self.log.append("ref")

    def prompt(self, tokens):
        time.sleep(0.002 * len(tokens))

    def decode(self, token):
        time.sleep(0.002)

    def close(self):
        pass


def test_vs_runs_alternate_with_cooktop(stories, monkeypatch):
    from cooktop.bench import runner

    log: list[str] = []
    monkeypatch.setattr(runner, "SETTLE_S", 0.0)
    orig_reset = runner.CooktopRunner.reset
    monkeypatch.setattr(runner.CooktopRunner, "reset", lambda self: (log.append("ours"), orig_reset(self)))
    params = runner.BenchParams(models=[str(stories)], tests=make_tests([16], [4], []), devices=["cpu"], ngl=[-1],
                                n_batch=[512], reps=3)
    res = runner.run_bench(params, vs=lambda path, n_ctx, n_batch, kv=None: _FakeRef(log))
    assert log == ["ours", "ref"] * 8  # warm-up + 3 reps, per test, strictly alternating
    ours = [r for r in res if r.backend == "numpy"]
    ref = [r for r in res if r.backend == "llama.cpp"]
    assert [r.test.name for r in ours] == [r.test.name for r in ref] == ["pp16", "tg4"]
    for o, f in zip(ours, ref):
        assert len(o.samples_s) == len(f.samples_s) == 3 and o.paired_ts == f.samples_ts
        assert o.ratio == pytest.approx(o.avg_ts / f.avg_ts)
    assert 0 < ref[0].avg_ts <= 16 / 0.032 * 1.05  # sleeps only last longer


def test_vs_llama_cpp_that_crashes_is_an_error_record(stories, tmp_path):
    fake = tmp_path / "llama_cpp"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os, signal\n__version__ = '0.0-fake'\n"
        "class Llama:\n"
        "    def __init__(self, **kw):\n"
        "        os.kill(os.getpid(), signal.SIGILL)  # what an AMX build does in a VM without AMX state\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = cooktop("bench", "--vs", "llama.cpp", "-m", str(stories), "--device", "cpu", "-p", "8", "-n", "2", "-r", "1",
                "-o", "json", env=env)
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    ours = [x for x in recs if x["backend"] == "numpy"]
    theirs = [x for x in recs if x["backend"] == "llama.cpp"]
    assert len(ours) == len(theirs) == 2
    assert all(x["error"] is None and x["ratio"] is None for x in ours)
    assert all("crashed with SIGILL" in x["error"] and "GGML_NATIVE=OFF" in x["error"] for x in theirs)


def test_batched_bench_json_md_and_plot(stories, tmp_path):
    """--batched: one record per (PP, TG, B) with llama-batched-bench's quantities; the md table; the plot."""
    r = cooktop("bench", "--batched", "-m", str(stories), "--device", "cpu", "-npp", "16", "-ntg", "4",
                "-npl", "1,3", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    assert [(x["backend"], x["pp"], x["tg"], x["pl"]) for x in recs] == [("numpy", 16, 4, 1), ("numpy", 16, 4, 3)]
    for x in recs:
        assert x["error"] is None and x["n_kv"] == x["pl"] * 20
        assert x["s_tg"] == pytest.approx(x["pl"] * 4 / x["t_tg"])
        assert x["s_pp"] == pytest.approx(x["pl"] * 16 / x["t_pp"])
        assert x["s"] == pytest.approx(x["n_kv"] / (x["t_pp"] + x["t_tg"]))
        assert x["s_tg_seq"] == pytest.approx(x["s_tg"] / x["pl"])
    png = tmp_path / "b.png"
    r = cooktop("bench", "--batched", "-m", str(stories), "--device", "cpu,opencl:9", "-npp", "8", "-ntg", "2",
                "-npl", "2", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")][:6] == ["backend", "device", "PP", "TG", "B", "N_KV"]
    assert "numpy" in lines[2]
    assert "error:" in lines[3]  # a missing device is a row, not a crash
    assert png.stat().st_size > 1000
    r = cooktop("bench", "--batched", "-m", str(stories), "-npl", "0")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "-npl" in r.stderr
