"""The device probe never crashes or hangs the caller, whatever the drivers do.

Each driver failure runs as a user meets it, in a subprocess (``cooktop devices``,
``cooktop run``, ``Llama``) with the environment that provokes it: no Vulkan ICD, an
ICD whose library is missing, a Vulkan loader that cannot be loaded, OpenCL platforms
with zero devices. Each must end with exit 0, ``<family>: unavailable: <reason naming
what was found>``, and ``auto`` falling back. The child-process mechanics (a crash,
a hang, a child that cannot start, the verdict cache) are tested in-process with
stand-in children.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, skip_or_fail

from cooktop.backends import registry, safeprobe
from cooktop.errors import DeviceError

NO_ICD = "vkCreateInstance failed (VK_ERROR_INCOMPATIBLE_DRIVER): no usable Vulkan driver"


def cooktop(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m cooktop.cli ARGS`` with this checkout first on the path and ``env`` added."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          env=full, timeout=timeout, cwd=str(ROOT))


@pytest.fixture
def probe_cache(tmp_path):
    """A fresh folder for probe verdicts, so every subprocess really runs its probe child."""
    return {"COOKTOP_CACHE_DIR": str(tmp_path / "cache")}


def _unavailable_line(out: str, family: str) -> str:
    m = re.search(rf"^{family}: unavailable: (.*)$", out, re.M)
    assert m, f"no '{family}: unavailable' line in:\n{out}"
    return m.group(1)


def _need_kp():
    import importlib.util
    if importlib.util.find_spec("kp") is None:
        skip_or_fail("vulkan", "kp (Kompute) is not installed")


def test_no_vulkan_icd_devices(probe_cache):
    """The issue's reproduction: exit 134 (SIGABRT in kp.Manager()) before; now a reason, exit 0."""
    _need_kp()
    r = cooktop("devices", env={"VK_ICD_FILENAMES": "/nonexistent.json", **probe_cache})
    assert r.returncode == 0, r.stderr
    assert _unavailable_line(r.stdout, "vulkan") == (
        f"{NO_ICD}; 1 ICD manifest(s) in VK_ICD_FILENAMES=/nonexistent.json: /nonexistent.json does not exist")
    assert "to enable: install a Vulkan driver" in r.stdout
    assert "vulkan:0" not in r.stdout
    # the verdict is kept for this driver set: one file per probed family
    assert len(os.listdir(os.path.join(probe_cache["COOKTOP_CACHE_DIR"], "probe"))) == 2


def test_icd_with_missing_library(tmp_path, probe_cache):
    _need_kp()
    icd = tmp_path / "broken_icd.json"
    lib = "/nonexistent/libvulkan_cooktop_test.so"
    icd.write_text(json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": lib, "api_version": "1.3.0"}}))
    r = cooktop("devices", "--no-smoke", env={"VK_ICD_FILENAMES": str(icd), **probe_cache})
    assert r.returncode == 0, r.stderr
    assert _unavailable_line(r.stdout, "vulkan") == (
        f"{NO_ICD}; 1 ICD manifest(s) in VK_ICD_FILENAMES={icd}: {icd} names the driver library "
        "/nonexistent/libvulkan_cooktop_test.so, which does not exist")


def test_vulkan_loader_absent(tmp_path, probe_cache):
    """A libvulkan.so.1 that cannot be loaded (an empty file first on LD_LIBRARY_PATH) stands
    in for an absent loader: kp links it, so its import fails, with the loader named."""
    _need_kp()
    (tmp_path / "libvulkan.so.1").write_bytes(b"")
    r = cooktop("devices", "--no-smoke", env={"LD_LIBRARY_PATH": str(tmp_path), **probe_cache})
    assert r.returncode == 0, r.stderr
    assert _unavailable_line(r.stdout, "vulkan") == (
        "the Vulkan loader cannot be loaded, so kp (Kompute) cannot be imported: "
        f"ImportError: {tmp_path}/libvulkan.so.1: file too short")
    assert "to enable: apt-get install libvulkan1" in r.stdout


def test_opencl_platforms_without_devices(probe_cache):
    """PoCL lists 0 devices when its cache folder cannot be created: say so, not 'install pocl'."""
    pytest.importorskip("pyopencl")
    env = {"POCL_CACHE_DIR": "/proc/cooktop-unwritable", "VK_ICD_FILENAMES": "/nonexistent.json", **probe_cache}
    r = cooktop("devices", env=env)
    assert r.returncode == 0, r.stderr
    reason = _unavailable_line(r.stdout, "opencl")
    if "Portable Computing Language" not in reason:
        skip_or_fail("opencl", f"no PoCL platform: {reason}")
    assert re.fullmatch(r"(\d) OpenCL platform\(s\) found, but they expose no device: "
                        r"platform 0 Portable Computing Language \(OpenCL [^;]*\): 0 devices(; .*)?", reason), reason
    n = int(reason[0])
    assert reason.count(": 0 devices") == n
    assert ("to enable: PoCL lists no device when it cannot create its kernel cache folder /proc/cooktop-unwritable"
            in r.stdout)
    assert "apt-get install pocl" not in r.stdout
    assert r.stdout.rstrip().endswith("auto selects: ['cpu']")  # both device families gone: numpy


def test_run_default_device_without_vulkan_driver(stories, probe_cache):
    """`cooktop run` and `Llama` with the default device (auto) generate text with no Vulkan driver."""
    env = {"VK_ICD_FILENAMES": "/nonexistent.json", **probe_cache}
    r = cooktop("run", "-m", str(stories), "-p", "Once upon a time", "-n", "8", "--temp", "0", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon a time") and len(r.stdout.split()) > 4, r.stdout
    code = ("from cooktop.api import Llama\n"
            f"llm = Llama({str(stories)!r}, verbose=False)\n"
            "print(llm('Once upon a time', max_tokens=8, temperature=0)['choices'][0]['text'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.split()) >= 4, p.stdout


# -- the child-process mechanics, with stand-in children ------------------------------------------

@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """A registry with nothing probed, probe verdicts kept under tmp_path."""
    monkeypatch.setenv("COOKTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("COOKTOP_PROBE_ISOLATION", raising=False)
    monkeypatch.delenv("COOKTOP_PROBE_CHILD", raising=False)
    registry.reset()
    yield tmp_path
    registry.reset()


def _child(monkeypatch, code: str) -> None:
    """Make the probe child run ``code`` (after reporting a step, as the real child does)."""
    step = f"print({safeprobe.MARK!r} + '{{\"step\": \"opening vulkan:0 (Fake GPU) with kp.Manager\"}}', flush=True)"
    monkeypatch.setattr(safeprobe, "_child_argv",
                        lambda family, target, start=0: [sys.executable, "-c", f"{step}\n{code}"])


def test_child_crash_is_a_reason_not_a_crash(isolated, monkeypatch):
    _child(monkeypatch, "import sys, os; sys.stderr.write('terminate called: vk error\\n'); sys.stderr.flush(); "
                        "os.abort()")
    res = registry.probe("vulkan")
    assert not res.available
    assert res.reason.startswith("the vulkan driver crashed a probe process: it was killed by SIGABRT while "
                                 "opening vulkan:0 (Fake GPU) with kp.Manager (terminate called: vk error); ")
    assert "ICD manifest" in res.reason  # the drivers found
    assert res.hint
    assert registry.resolve("auto") != ["vulkan:0"]
    # kept for this driver set: a later process does not run the crashing child again
    registry.reset()
    _child(monkeypatch, "raise SystemExit('the child must not run again')")
    assert registry.probe("vulkan").reason == res.reason


def test_child_dying_on_a_device_names_the_drivers_error_line(isolated, monkeypatch):
    """A child killed while checking a device, whose driver wrote to fd 2 inside the check (captured
    to ``COOKTOP_PROBE_STDERR``, which survives the abort): that device is unusable, its reason ends
    with the driver's error line, the next child goes on, and the capture file is removed."""
    step = ("print({m!r} + '{{\"step\": \"checking opencl:{i} (Fake CPU) with check_build\", "
            "\"device\": {i}}}', flush=True)")
    first = (step.format(m=safeprobe.MARK, i=0) + "\nimport os\nfd = os.open(os.environ['COOKTOP_PROBE_STDERR'], "
             "os.O_WRONLY)\nos.dup2(fd, 2)\nos.write(2, b'noise\\nLLVM ERROR: Cannot select: i64 = fma\\n')\n"
             "os.abort()")
    second = f"print({safeprobe.MARK!r} + json.dumps({{'result': {{'available': False, 'reason': 'none left'}}}}))"
    seen: list[str] = []
    take = safeprobe._take_said

    def take_said(path):
        seen.append(path)
        return take(path)

    monkeypatch.setattr(safeprobe, "_take_said", take_said)
    monkeypatch.setattr(safeprobe, "_child_argv", lambda family, target, start=0: [
        sys.executable, "-c", first if start == 0 else "import json\n" + second])
    res = safeprobe.check("opencl", "cooktop.backends.opencl.device:OpenCLBackend")
    assert res.errors[0] == ("opencl:0 is unusable on this machine: the opencl driver crashed a probe process: it "
                             "was killed by SIGABRT while checking opencl:0 (Fake CPU) with check_build "
                             "(driver: LLVM ERROR: Cannot select: i64 = fma)"), res.errors
    assert len(seen) == 2 and not [p for p in seen if os.path.exists(p)], seen


def test_opencl_check_before_use_launches_a_real_kernel():
    """``check_kernel`` (OpenCL's ``check_use``) launches rmsnorm: a driver whose compiler fails on
    real kernels only is found in the child; a failure is a DeviceError naming the device."""
    from cooktop.backends.families import FAMILIES
    from cooktop.backends.opencl.device import check_kernel
    from cooktop.errors import DeviceError

    assert FAMILIES["opencl"].check_use == "cooktop.backends.opencl.device:check_kernel"

    class Dev:
        info = type("I", (), {"selector": "opencl:7"})()
        calls: list[str] = []

        def empty(self, shape):
            return ("t", shape)

        def write(self, t, a):
            self.calls.append("write")

        def upload(self, a, ty, shape):
            return ("w", shape)

        def rmsnorm(self, out, x, w, eps):
            raise RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE")

        def read(self, t):
            raise AssertionError("not reached")

    with pytest.raises(DeviceError, match=r"^the rmsnorm kernel does not build and run on opencl:7: RuntimeError: "
                                          r"clBuildProgram failed"):
        check_kernel(Dev())


def test_device_whose_check_before_use_crashes_is_never_opened(isolated, monkeypatch):
    """The child of ``check_use`` dies (SIGABRT) on opencl:0, its driver's error line in the
    capture file: ``open_device`` and the smoke test refuse it with that reason, nothing is
    opened here, and the verdict is kept (a later process runs no child)."""
    if not registry.probe("opencl").available:
        skip_or_fail("opencl", "no OpenCL device to check")
    msg = json.dumps({"step": "checking opencl:0 (Fake CPU) with check_kernel before its first use", "device": 0})
    step = f"print({safeprobe.MARK + msg!r}, flush=True)"
    code = (step + "\nimport os\nfd = os.open(os.environ['COOKTOP_PROBE_STDERR'], os.O_WRONLY)\nos.dup2(fd, 2)\n"
            "os.write(2, b'LLVM ERROR: Cannot select: fake\\n')\nos.abort()")
    monkeypatch.setattr(safeprobe, "_use_argv", lambda family, target, index: [sys.executable, "-c", code])
    opened = []
    monkeypatch.setattr(registry._backends["opencl"], "open", lambda index: opened.append(index))
    want = ("opencl:0 is unusable on this machine: the opencl driver crashed a probe process: it was killed by "
            "SIGABRT while checking opencl:0 (Fake CPU) with check_kernel before its first use (driver: LLVM ERROR: "
            "Cannot select: fake)")
    with pytest.raises(DeviceError, match=re.escape(want)):
        registry.open_device("opencl:0")
    smoke = registry.smoke_test("opencl:0")
    assert (smoke.ok, smoke.detail) == (False, want)
    assert opened == []
    registry.reset()
    monkeypatch.setattr(safeprobe, "_use_argv",
                        lambda family, target, index: [sys.executable, "-c", "raise SystemExit(9)"])
    assert safeprobe.check_use("opencl", "cooktop.backends.opencl.device:OpenCLBackend", 0) == want
    registry.reset()  # what `cooktop devices --no-smoke` shows: the kept verdict, no child run
    assert registry.known_unusable("opencl", 0) == want
    assert registry.known_unusable("opencl", 99) is None


def test_child_hang_times_out(isolated, monkeypatch):
    monkeypatch.setenv("COOKTOP_PROBE_TIMEOUT", "1")
    _child(monkeypatch, "import time; time.sleep(120)")
    res = registry.probe("vulkan")
    assert not res.available
    assert res.reason.startswith("the vulkan probe did not finish within 1 s while opening vulkan:0 (Fake GPU) "
                                 "with kp.Manager (a hung driver?); ")
    assert "COOKTOP_PROBE_TIMEOUT" in res.hint
    assert not os.path.exists(os.path.join(isolated, "probe")) or not os.listdir(os.path.join(isolated, "probe"))


def test_child_that_cannot_start_falls_back_in_process(isolated, monkeypatch):
    """No step reported (our module never ran): probe in-process as before, no false 'crash'."""
    monkeypatch.setattr(safeprobe, "_child_argv", lambda f, t, start=0: [sys.executable, "-c", "raise SystemExit(3)"])
    assert safeprobe.check("cpu", "cooktop.backends.cpu.device:CpuBackend") is None
    assert registry.probe("cpu").available


def test_verdict_key_follows_the_drivers(monkeypatch, tmp_path):
    target = registry.FAMILIES["vulkan"].backend
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent.json")
    a = safeprobe.driver_key("vulkan", target)
    monkeypatch.setenv("VK_ICD_FILENAMES", str(tmp_path / "x.json"))
    b = safeprobe.driver_key("vulkan", target)
    assert a != b and b["env"]["VK_ICD_FILENAMES"] == str(tmp_path / "x.json")
    (tmp_path / "x.json").write_text("{}")
    c = safeprobe.driver_key("vulkan", target)
    assert c["files"][0][0] == str(tmp_path / "x.json") and c["files"][0][1] == 2 and c != b


def test_opencl_no_platform_names_the_icd_files(monkeypatch, tmp_path):
    """An ICD folder whose file names a missing library: the reason lists it."""
    from cooktop.backends.opencl import device as opencl

    (tmp_path / "fake.icd").write_text("/nonexistent/libcooktop_fake_cl.so\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(tmp_path))

    class NoPlatform:
        class device_type:  # noqa: N801 - mirrors pyopencl
            CPU, GPU, ACCELERATOR = 2, 4, 8

        @staticmethod
        def get_platforms():
            raise RuntimeError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setitem(sys.modules, "pyopencl", NoPlatform)
    res = opencl.OpenCLBackend().probe()
    assert res.reason == ("no OpenCL platform found (RuntimeError: clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR); "
                          f"1 ICD file(s) in OCL_ICD_VENDORS={tmp_path}: {tmp_path}/fake.icd names "
                          "/nonexistent/libcooktop_fake_cl.so, which does not exist")


# -- an OpenCL platform that lists a device but cannot build on it ---------------------------------

def _failing_pocl(tmp_path, mode: str) -> str:
    """A folder of OpenCL ICD files: Debian's PoCL first, then a copy of PyPI's PoCL 3.0-rc2 that
    lists its CPU but cannot build: ``"error"`` (its OpenCL headers are gone: every build fails
    with a compiler error, as 3.0-rc2 does on CPUs its LLVM does not know) or ``"crash"`` (its
    kernel library is garbage: a build kills the process with SIGSEGV, so any build in the
    user's process would end it). The copy finds its data next to itself (RPATH
    ``$ORIGIN/../../pocl_binary_distribution/.libs``), so the real installation is untouched."""
    import glob
    import importlib.util
    import shutil

    if importlib.util.find_spec("pocl_binary_distribution") is None or importlib.util.find_spec("pyopencl") is None:
        skip_or_fail("pocl-binary", "pip install pyopencl pocl-binary-distribution (the opencl extra)")
    pyocl = os.path.dirname(importlib.util.find_spec("pyopencl").origin)
    data = os.path.join(os.path.dirname(importlib.util.find_spec("pocl_binary_distribution").origin), ".libs")
    libs = glob.glob(os.path.join(pyocl, ".libs", "libpocl*.so*"))
    debian = "/etc/OpenCL/vendors/pocl.icd"
    if not libs or not os.path.exists(debian):
        skip_or_fail("pocl-binary", f"need pyopencl/.libs/libpocl*.so ({libs}) and {debian}")
    root = tmp_path / f"pocl-{mode}"
    (root / "x" / "libs").mkdir(parents=True)
    lib = shutil.copy(libs[0], root / "x" / "libs")
    shutil.copytree(data, root / "pocl_binary_distribution" / ".libs", symlinks=True)
    share = root / "pocl_binary_distribution" / ".libs" / "share" / "pocl"
    if mode == "error":
        shutil.rmtree(share / "include")
    else:
        for bc in share.glob("kernel-*.bc"):
            bc.write_bytes(b"not LLVM bitcode\n")
    vendors = tmp_path / f"vendors-{mode}"
    vendors.mkdir()
    shutil.copy(debian, vendors / "a-debian-pocl.icd")
    (vendors / "b-failing-pocl.icd").write_text(f"{lib}\n")
    return str(vendors)


def _env(tmp_path, vendors: str) -> dict:
    return {"OCL_ICD_VENDORS": vendors, "COOKTOP_DISABLE": "vulkan", "POCL_CACHE_DIR": str(tmp_path / "pocl"),
            "COOKTOP_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.slow(reason="three cooktop processes, Debian's PoCL compiling the smoke test's kernels cold (15 s)")
def test_second_opencl_platform_whose_build_fails(tmp_path):
    """``cooktop devices`` (and ``--json``) exit 0 beside a platform whose every build fails: its
    devices are listed unusable with the compiler's first line, the verdict is kept with the
    driver set, ``auto`` takes Debian's PoCL, and asking for a failing device is a clear error."""
    env = _env(tmp_path, _failing_pocl(tmp_path, "error"))
    r = cooktop("devices", "--json", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    devs = {d["selector"]: d for d in rep["families"]["opencl"]["devices"]}
    bad = [s for s, d in devs.items() if "3.0-rc2" in d["platform"]]
    good = [s for s, d in devs.items() if "3.1" in d["platform"]]
    assert bad and len(good) == 1, devs
    for s in bad:
        assert not devs[s]["usable"] and devs[s]["smoke_test"] == "FAIL"
        assert devs[s]["smoke_detail"].startswith(f"{s} is unusable on this machine (checked in a probe process): "
                                                  "OpenCL build of the ISA probe kernels failed on pthread-"), devs[s]
        assert "pocl_types.h' file not found" in devs[s]["smoke_detail"]
        assert "(driver: 1 error generated.)" in devs[s]["smoke_detail"]
    assert devs[good[0]]["usable"] and devs[good[0]]["smoke_test"] == "PASS"
    assert rep["auto"] == good
    (verdict,) = [json.load(open(os.path.join(env["COOKTOP_CACHE_DIR"], "probe", f)))
                  for f in os.listdir(os.path.join(env["COOKTOP_CACHE_DIR"], "probe"))]
    assert sorted(int(i) for i in verdict["result"]["errors"]) == sorted(devs[s]["index"] for s in bad)
    r = cooktop("devices", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(rf"^{bad[0]} +cpu +no ", r.stdout, re.M), r.stdout
    assert f"{bad[0]}: smoke test FAILED: {bad[0]} is unusable on this machine" in r.stdout
    assert f"auto selects: {good}" in r.stdout
    r = cooktop("run", "-dev", bad[0], "-p", "Once", "-n", "2", env=env)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert f"error: {bad[0]} is unusable on this machine (checked in a probe process): OpenCL build" in r.stderr
    assert "Traceback" not in r.stderr


def test_opencl_platform_whose_build_crashes(tmp_path):
    """A build that kills the probe child (SIGSEGV) makes that device unusable, a new child checks
    the next one, and the user's process, which never builds there, exits 0."""
    env = _env(tmp_path, _failing_pocl(tmp_path, "crash"))
    r = cooktop("devices", env=env)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    bad = re.findall(r"^(opencl:\d+): smoke test FAILED: \1 is unusable on this machine: the opencl driver crashed a "
                     r"probe process: it was killed by SIGSEGV while checking \1 \(pthread-", r.stdout, re.M)
    good = re.findall(r"^(opencl:\d+) +cpu +yes +pthread-.* PoCL 3\.1", r.stdout, re.M)
    assert bad and len(good) == 1, r.stdout
    assert f"auto selects: {good}" in r.stdout


def test_child_killed_before_its_first_report_is_no_in_process_probe(isolated, monkeypatch):
    """A child the timeout kills before it reports a step (a slow start) makes the family
    unavailable, not kept; the user's process never probes unchecked drivers then."""
    monkeypatch.setenv("COOKTOP_PROBE_TIMEOUT", "1")
    monkeypatch.setattr(safeprobe, "_child_argv",
                        lambda family, target, start=0: [sys.executable, "-c", "import time; time.sleep(120)"])
    res = registry.probe("vulkan")
    assert not res.available
    assert res.reason.startswith("the vulkan probe process did not report within 1 s (killed; ")
    assert "COOKTOP_PROBE_TIMEOUT" in res.hint
    assert not os.path.exists(os.path.join(isolated, "probe")) or not os.listdir(os.path.join(isolated, "probe"))


def test_malformed_cached_verdicts_probe_again(tmp_path):
    """A verdict file that is not a well-formed verdict (deep nesting, wrong types) is probed again."""
    for i, text in enumerate(("[" * 200000, '{"result": {"backend": "opencl", "available": "false"}}',
                              '{"result": {"backend": "opencl", "available": true, "errors": {"1": null}}}')):
        path = tmp_path / f"v{i}.json"
        path.write_text(text)
        monkeypatch_path = safeprobe._cache_path
        try:
            safeprobe._cache_path = lambda digest, p=path: str(p)
            assert safeprobe._load_cached("x") is None
        finally:
            safeprobe._cache_path = monkeypatch_path
