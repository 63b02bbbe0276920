"""Quiet by default. Compiler output goes to the ``cooktop`` logger; the first build of
kernels on a device says so in one line (with a progress bar on a terminal); ``verbose=False``
prints nothing at all.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import uuid
import warnings

import pytest
from conftest import ROOT, open_family_device
from gguf import GGMLQuantizationType as T

from cooktop import notices
from cooktop.errors import DeviceError


@pytest.fixture
def ocl():
    return open_family_device("opencl")


@pytest.fixture
def fresh_notices(monkeypatch, tmp_path):
    """Default verbosity, no notice printed yet in this process, first-compile markers under tmp_path."""
    monkeypatch.setenv("COOKTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(notices, "_verbose", None)
    monkeypatch.setattr(notices, "_noticed", set())
    return tmp_path


def _notice(dev) -> str:
    return f"cooktop: compiling OpenCL kernels for {dev.info.selector}, {dev.cl_device.name.strip()} (first run only)\n"


def test_compiler_output_goes_to_the_log(ocl, fresh_notices, caplog, capfd):
    """A kernel with compiler warnings: stderr has only the first-compile notice; the build log,
    clang's "N warnings generated." (written to fd 2 inside PoCL) and pyopencl's CompilerWarning
    end up in one INFO record of the cooktop logger."""
    from cooktop.backends.opencl.programs import build_program

    tag = f"cooktop-quiet-{uuid.uuid4().hex}"  # a new source: no cache anywhere has it
    src = f"#warning {tag}\nkernel void f(global float* x) {{ int unused_{tag[-6:]}; x[0] = 1.0f; }}\n"
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="cooktop"):
        warnings.simplefilter("always")
        build_program(ocl.ctx, ocl.cl_device, src, "", "quiet test", ocl.info.selector)
    out, err = capfd.readouterr()
    assert err == _notice(ocl)
    assert not [w for w in caught if type(w.message).__name__ == "CompilerWarning"]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and tag in r.getMessage()]
    assert len(logged) == 1 and logged[0].startswith("OpenCL compiler output for the quiet test kernels on ")
    if "Portable Computing Language" in ocl.info.platform:
        assert "warning generated." in logged[0]  # clang's own line, caught on fd 2
    # built once: a second build of the same source (another context) prints nothing
    import pyopencl as cl
    ctx2 = cl.Context([ocl.cl_device])
    build_program(ctx2, ocl.cl_device, src, "", "quiet test", ocl.info.selector)
    assert capfd.readouterr().err == ""


def test_build_failure_logs_everything(ocl, fresh_notices, caplog, capfd):
    from cooktop.backends.opencl.programs import build_program

    tag = f"undefined_{uuid.uuid4().hex[:12]}"
    src = f"kernel void f(global float* x) {{ x[0] = {tag}; }}\n"
    with caplog.at_level(logging.INFO, logger="cooktop"):
        with pytest.raises(DeviceError, match=rf"OpenCL build of the broken kernels failed on .*{tag}"):
            build_program(ocl.ctx, ocl.cl_device, src, "", "broken", ocl.info.selector)
        notices.set_verbose(False)
        try:
            with pytest.raises(DeviceError, match="OpenCL build of the broken kernels failed"):
                build_program(ocl.ctx, ocl.cl_device, src + "\n", "", "broken", ocl.info.selector)
        finally:
            notices.set_verbose(None)
    full = [r for r in caplog.records if tag in r.getMessage() and "compiler output" in r.getMessage()]
    assert [r.levelno for r in full] == [logging.WARNING, logging.INFO]  # verbose=False: log only, no WARNING
    assert full[0].getMessage().startswith("OpenCL build of the broken kernels failed on ")
    assert "error" in full[0].getMessage()
    assert capfd.readouterr().err == _notice(ocl)  # the notice of the first attempt only


def test_prebuild_notice_and_progress_bar(ocl, fresh_notices, monkeypatch):
    from cooktop.backends.opencl.programs import KernelCache

    term = io.StringIO()
    term.isatty = lambda: True  # a terminal: bars allowed
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setattr(notices, "BAR_DELAY_S", 0)
    import pyopencl as cl

    # a context of its own: programs come from pyopencl's disk cache, not from this process's
    KernelCache(cl.Context([ocl.cl_device]), ocl.cl_device, ocl.shape, "", ocl.info).prebuild([T.F32, T.Q4_0])
    text = term.getvalue()
    assert text.startswith(_notice(ocl))
    assert f"compiling kernels for {ocl.info.selector}" in text and "program" in text
    # the same programs again (markers written): no notice, no bar
    monkeypatch.setattr(notices, "_noticed", set())
    term.truncate(0)
    term.seek(0)
    KernelCache(cl.Context([ocl.cl_device]), ocl.cl_device, ocl.shape, "", ocl.info).prebuild([T.F32, T.Q4_0])
    assert term.getvalue() == ""


def test_verbose_false_prints_nothing(monkeypatch, capsys):
    monkeypatch.setattr(notices, "_noticed", set())
    notices.set_verbose(False)
    try:
        notices.notice("should not show")
        with notices.progress(3, "nothing") as bar:
            bar.update(3)
    finally:
        notices.set_verbose(None)
    assert capsys.readouterr().err == ""


def _run(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **env})


def test_cooktop_run_first_run_notice_only_once(stories, tmp_path, ocl):
    """First run on a device (no markers): one notice line; the next run: none. No compiler noise."""
    env = {"COOKTOP_CACHE_DIR": str(tmp_path)}
    args = ["-m", "cooktop.cli", "run", "-m", str(stories), "-p", "Once", "-n", "4", "--device", ocl.info.selector]
    first = _run(args, env)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    assert lines[0] + "\n" == _notice(ocl)
    assert sum("compiling" in ln for ln in lines) == 1
    assert not [ln for ln in lines if "warning" in ln.lower()], first.stderr
    second = _run(args, env)
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr and "warning" not in second.stderr.lower()


def test_llama_verbose_false_is_silent_on_a_first_run(stories, tmp_path, ocl):
    """The issue's case: every cache empty (kernels really compile), Llama(verbose=False): no byte on stderr."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "COOKTOP_CACHE_DIR": str(tmp_path / "cooktop")}
    code = ("from cooktop.api import Llama\n"
            f"llm = Llama({str(stories)!r}, verbose=False, device={ocl.info.selector!r}, n_gpu_layers=-1)\n"
            "print(llm('Once upon a time', max_tokens=4, temperature=0)['choices'][0]['text'])\n")
    r = _run(["-c", code], env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert len(r.stdout.split()) >= 2
    assert os.listdir(tmp_path / "cooktop" / "opencl-kernels")  # it did compile for the first time


def test_verbose_false_silences_cooktop_warnings(stories):
    """llama-cpp-python's verbose=False prints nothing: cooktop's own warnings (here llama.cpp's
    "n_ctx_seq > n_ctx_train" one) do not reach logging's last-resort handler either."""
    import subprocess
    import sys

    code = ("from cooktop import Llama\n"
            f"Llama(model_path={str(stories)!r}, n_ctx=4096, verbose=False)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    loud = subprocess.run([sys.executable, "-c", code.replace("verbose=False", "verbose=True")],
                          capture_output=True, text=True, timeout=120)
    assert "n_ctx_seq (4096) > n_ctx_train (2048)" in loud.stderr
