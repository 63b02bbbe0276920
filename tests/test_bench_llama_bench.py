"""``cooktop bench --vs llama.cpp --llama-bench PATH`` (cooktop/bench/llama_bench.py).

A stand-in llama-bench (a Python script) records its arguments and environment and prints
llama-bench's ``-o json`` records, so the command line, the pairing of runs and the error
records are checked without building llama.cpp; the last test runs a real binary when
COOKTOP_LLAMA_BENCH names one (scripts/build-llamacpp-vulkan.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cooktop.bench import llama_bench
from cooktop.bench.runner import make_tests
from cooktop.errors import CooktopError

FAKE = """#!{python}
import json, os, sys
a = sys.argv[1:]
json.dump({{"argv": a, "vk": os.environ.get("GGML_VK_VISIBLE_DEVICES")}}, open({log!r}, "w"))
if {fail}:
    print("ggml_vulkan: no device", file=sys.stderr)
    sys.exit(3)
get = lambda k: a[a.index(k) + 1]
reps = int(get("-r"))
recs = []
for p in [int(x) for x in get("-p").split(",") if int(x)]:
    recs.append(dict(n_prompt=p, n_gen=0, samples_ts=[100.0 + i for i in range(reps)]))
for n in [int(x) for x in get("-n").split(",") if int(x)]:
    recs.append(dict(n_prompt=0, n_gen=n, samples_ts=[10.0] * reps))
for r in recs:
    r.update(backends="Vulkan", gpu_info="llvmpipe (LLVM 15.0.6, 256 bits)", avg_ts=sum(r["samples_ts"]) / reps)
print(json.dumps(recs, indent=2))
"""


def _fake(tmp_path, fail=False):
    log = tmp_path / "fake.json"
    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE.format(python=sys.executable, log=str(log), fail=fail))
    exe.chmod(0o755)
    return exe, log


def _cooktop(*args, env=None):
    e = {**os.environ, **(env or {})}
    e.pop("GGML_VK_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=600, env=e)


def test_command_line():
    tests = make_tests([32, 64], [8], [(16, 4)])
    argv, env = llama_bench.command("/x/llama-bench", "/m.gguf", tests, 3, 128, "vulkan:1")
    assert argv[:3] == ["/x/llama-bench", "-m", "/m.gguf"]
    get = lambda k: argv[argv.index(k) + 1]  # noqa: E731
    assert (get("-p"), get("-n"), get("-pg"), get("-r"), get("-b"), get("-ub"), get("-o"), get("-ngl")) == \
        ("32,64", "8", "16,4", "3", "128", "128", "json", "99")
    if "GGML_VK_VISIBLE_DEVICES" not in os.environ:
        assert env == {"GGML_VK_VISIBLE_DEVICES": "1"}
    argv, env = llama_bench.command("b", "/m.gguf", make_tests([8], [], []), 1, 8, "cpu")
    assert argv[argv.index("-n") + 1] == "0" and argv[argv.index("-ngl") + 1] == "0" and env == {}


def test_parse_rejects_other_output():
    with pytest.raises(CooktopError, match="no JSON"):
        llama_bench.parse("| model | size |")
    with pytest.raises(CooktopError, match="samples_ts"):
        llama_bench.parse('[{"n_prompt": 1}]')


def test_records_paired_and_ratio(stories, tmp_path):
    """llama-bench runs first with the same tests; cooktop's records get its runs as the paired
    ones, so ratio = cooktop mean t/s / llama-bench mean t/s; the markdown table has both rows."""
    exe, log = _fake(tmp_path)
    r = _cooktop("bench", "--vs", "llama.cpp", "--llama-bench", str(exe), "-m", str(stories), "--device", "cpu",
                 "-p", "16", "-n", "4", "-r", "2", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    theirs = {x["test"]: x for x in recs if x["backend"] == "llama.cpp"}
    ours = {x["test"]: x for x in recs if x["backend"] != "llama.cpp"}
    assert sorted(theirs) == sorted(ours) == ["pp16", "tg4"]
    assert theirs["pp16"]["samples_ts"] == pytest.approx([100.0, 101.0])
    assert "llvmpipe" in theirs["pp16"]["device_name"] and "Vulkan" in theirs["pp16"]["device_name"]
    for test, x in ours.items():
        assert x["llama_cpp_ts"] == pytest.approx(theirs[test]["avg_ts"])
        assert x["ratio"] == pytest.approx(x["avg_ts"] / theirs[test]["avg_ts"])
    seen = json.loads(log.read_text())
    assert seen["vk"] is None and seen["argv"][seen["argv"].index("-ngl") + 1] == "0"  # --device cpu
    md = _cooktop("bench", "--vs", "llama.cpp", "--llama-bench", str(exe), "-m", str(stories), "--device", "cpu",
                  "-p", "16", "-n", "0", "-r", "1")
    assert md.returncode == 0, md.stderr
    assert "vs llama.cpp" in md.stdout and "| llama.cpp" in md.stdout


def test_vulkan_device_reaches_llama_bench(stories, tmp_path):
    """--device vulkan:0: llama-bench offloads everything and sees that device only (lavapipe is
    not a discrete GPU, which llama.cpp 0.3.x would skip by default)."""
    exe, log = _fake(tmp_path)
    r = _cooktop("bench", "--vs", "llama.cpp", "--llama-bench", str(exe), "-m", str(stories), "--device",
                 "vulkan:0", "-p", "8", "-n", "0", "-r", "1", "-o", "json")
    assert r.returncode == 0, r.stderr
    seen = json.loads(log.read_text())
    assert seen["vk"] == "0" and seen["argv"][seen["argv"].index("-ngl") + 1] == "99"
    theirs = [x for x in json.loads(r.stdout) if x["backend"] == "llama.cpp"]
    assert [x["device"] for x in theirs] == ["vulkan:0"] and theirs[0]["n_gpu_layers"] == 99


def test_failing_binary_is_an_error_record(stories, tmp_path):
    exe, _ = _fake(tmp_path, fail=True)
    r = _cooktop("bench", "--vs", "llama.cpp", "--llama-bench", str(exe), "-m", str(stories), "--device", "cpu",
                 "-p", "8", "-n", "0", "-r", "1")
    assert r.returncode == 0, r.stderr  # cooktop's own rows were measured
    assert "llama-bench exited with status 3: ggml_vulkan: no device" in r.stdout


def test_bad_arguments_are_clear(stories, tmp_path):
    r = _cooktop("bench", "--llama-bench", "/nonexistent/llama-bench", "-m", str(stories), "-p", "8", "-n", "0")
    assert r.returncode != 0 and "--llama-bench goes with --vs llama.cpp" in r.stderr
    r = _cooktop("bench", "--vs", "llama.cpp", "--llama-bench", str(tmp_path / "nope"), "-m", str(stories),
                 "-p", "8", "-n", "0")
    assert r.returncode != 0 and "no such executable" in r.stderr and "build-llamacpp-vulkan.sh" in r.stderr
    assert "Traceback" not in r.stderr


def test_real_llama_bench(stories):
    """With COOKTOP_LLAMA_BENCH naming a built llama-bench (scripts/build-llamacpp-vulkan.sh: against
    cooktop's vulkan:0; scripts/build-llamacpp-cpu.sh, whose --list-devices names no Vulkan device:
    against cooktop's numpy backend), one real comparison on stories260K; skipped otherwise
    (building takes 10-40 minutes)."""
    binary = os.environ.get(llama_bench.ENV)
    if not binary:
        pytest.skip(f"set {llama_bench.ENV} to a llama-bench binary to run this")
    listed = subprocess.run([binary, "--list-devices"], capture_output=True, text=True, timeout=120)
    cpu_only = listed.returncode == 0 and "Vulkan" not in listed.stdout + listed.stderr
    r = _cooktop("bench", "--vs", "llama.cpp", "-m", str(stories), "--device", "cpu" if cpu_only else "vulkan:0",
                 "-p", "16", "-n", "4", "-r", "2", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    theirs = [x for x in recs if x["backend"] == "llama.cpp"]
    assert len(theirs) == 2 and all(x["error"] is None and x["avg_ts"] > 0 for x in theirs), theirs
    assert all(x["ratio"] > 0 for x in recs if x["backend"] != "llama.cpp")
