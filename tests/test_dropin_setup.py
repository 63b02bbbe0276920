"""What a ``pip install cooktop`` user gets: PoCL from PyPI in the ``opencl`` extra, ``cooktop devices``
naming the driver it found, and the kp build inside the package as ``cooktop setup-vulkan``."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

from conftest import skip_or_fail
from test_setup import _pyproject

from cooktop.backends.opencl.info import driver_label
from cooktop.backends.vulkan import INSTALL_HINT
from cooktop.tools import kompute

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGED = ("cooktop/tools/kompute/install-kompute.sh", "cooktop/tools/kompute/kp-0.9.0-cooktop.patch",
            "cooktop/tools/kompute/kompute-offline.cmake", "cooktop/cli/llama_args.json")


def cooktop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True, timeout=300)


def test_opencl_extra_brings_pocl_from_pypi():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert any(d.startswith("pocl-binary-distribution") for d in extras["opencl"])


def test_driver_label_says_which_pocl():
    from importlib.metadata import PackageNotFoundError, version
    try:
        pip = version("pocl-binary-distribution")
    except PackageNotFoundError:
        pip = None
    assert driver_label("Portable Computing Language", "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts") == \
        "PoCL 3.1+debian (system)"
    if pip == "3.0":
        assert driver_label("Portable Computing Language", "OpenCL 3.0 PoCL 3.0-rc2  Linux, Release") == \
            "PoCL 3.0-rc2 (pip)"
    assert driver_label("NVIDIA CUDA", "OpenCL 3.0 CUDA 12.4.131") == "NVIDIA CUDA (OpenCL 3.0 CUDA 12.4.131)"


def test_devices_names_the_pypi_pocl():
    if importlib.util.find_spec("pocl_binary_distribution") is None:
        skip_or_fail("pocl-binary", "pip install pocl-binary-distribution (the opencl extra)")
    from cooktop.backends import registry
    res = registry.probe("opencl")
    if not res.available:
        skip_or_fail("opencl", f"{res.reason}; to enable: {res.hint}")
    r = cooktop("devices", "--no-smoke")
    assert r.returncode == 0, r.stderr
    assert "(pip)" in r.stdout or "(system)" in r.stdout


def test_kp_build_ships_in_the_package(tmp_path):
    """The wheel pip installs holds the kp build and the llama.cpp option table."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("cooktop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(PACKAGED) <= names
    assert kompute.SCRIPT.is_file() and os.access(kompute.SCRIPT, os.X_OK)


def test_setup_vulkan_command_and_hint():
    assert "cooktop setup-vulkan" in INSTALL_HINT
    r = cooktop("setup-vulkan", "--help")
    assert r.returncode == 0 and "kp 0.9.0 with cooktop's patch" in r.stdout
    if importlib.util.find_spec("kp") is None:
        skip_or_fail("vulkan", "kp is not installed (cooktop setup-vulkan builds it)")
    r = cooktop("setup-vulkan")  # kp with the patch is there: nothing to build
    assert r.returncode == 0, r.stderr
    assert "already importable" in r.stdout and "nothing to do" in r.stdout
    wrapper = subprocess.run(["bash", str(ROOT / "scripts" / "install-kompute.sh"), sys.executable],
                             capture_output=True, text=True, timeout=120)
    assert wrapper.returncode == 0 and "nothing to do" in wrapper.stdout
