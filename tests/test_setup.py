"""Fast checks of the setup machinery: scripts parse, Makefile targets, pyproject, numpy < 2.

The full setup (apt, venv, kp build) is checked by running it on a clean clone;
these tests only guard against the cheap mistakes that would break it.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPTS = [ROOT / "scripts" / "setup.sh", ROOT / ".ci" / "run"]


def _pyproject() -> dict:
    """pyproject.toml as a dict (tomllib on 3.11+, tomli on 3.10)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _make_targets() -> dict[str, list[str]]:
    """Rule lines of the Makefile: target -> prerequisites."""
    rules = {}
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z][\w-]*)\s*:(?!=)\s*(.*)$", line)
        if m:
            rules[m.group(1)] = m.group(2).split()
    return rules


@pytest.mark.parametrize("script", SCRIPTS + sorted((ROOT / "scripts").glob("*.sh")), ids=lambda p: p.name)
def test_shell_script_syntax(script):
    assert script.exists(), f"{script} missing"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_ci_run_is_executable_and_calls_make_test():
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    text = ci.read_text()
    assert "set -euo pipefail" in text
    assert re.search(r"^(phase )?make test\s*$", text, re.M), ".ci/run must run the README's test command"
    require = re.search(r'COOKTOP_REQUIRE="([^"]+)"', text)
    assert require and {"shared", "opencl", "vulkan", "glslc"} <= set(require.group(1).split(","))
    assert "HF_HUB_OFFLINE=1" in text


def test_makefile_targets():
    rules = _make_targets()
    for target in ("setup", "run", "test", "shaders", "bench"):
        assert target in rules, f"Makefile has no {target!r} target"
    assert "setup" in rules["run"] and "setup" in rules["test"], "run and test must depend on setup"


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_makefile_dry_run_commands():
    env = {k: v for k, v in os.environ.items() if k != "VULKAN_VALIDATION"}  # .ci/run exports it
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "run", "test"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "bash scripts/setup.sh" in out.stdout
    assert '.venv/bin/cooktop run -p "Once upon a time" -n 64' in out.stdout
    assert ".venv/bin/python -m pytest -q" in out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_ci_runs_every_test_once_and_the_vulkan_ones_validated():
    """.ci/run's `make test` (VULKAN_VALIDATION=1) is two runs whose selections are complements:
    the Vulkan tests under the validation layer and the rest; then the GPU-assisted part and Oclgrind."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^export VULKAN_VALIDATION=1$", ci, re.M)
    for target in ("make test-vulkan-gpu-assisted", "make test-opencl-validation"):
        assert re.search(rf"^phase {target}$", ci, re.M), target
    env = {k: v for k, v in os.environ.items()
           if k not in ("VULKAN_VALIDATION", "TEST_JOBS", "SUITE_JOBS", "PYTEST_ARGS")}
    jobs = len(os.sched_getaffinity(0))  # one worker per CPU (SUITE_JOBS: nproc)
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "test", "VULKAN_VALIDATION=1"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert f'.venv/bin/python -m pytest -q -n {jobs} -k "not vulkan"' in out.stdout
    assert ".venv/bin/python tests/vulkan_validation.py -q -n auto -k vulkan" in out.stdout
    plain = subprocess.run(["make", "-n", "-C", str(ROOT), "test"], capture_output=True, text=True, env=env)
    assert "vulkan" not in plain.stdout and f".venv/bin/python -m pytest -q -n {jobs}" in plain.stdout


def test_pyproject_script_and_extras():
    meta = _pyproject()["project"]
    assert meta["scripts"]["cooktop"] == "cooktop.cli.main:main"
    extras = meta["optional-dependencies"]
    for name in ("opencl", "vulkan", "server", "dev", "bench", "compare"):
        assert name in extras, f"extra {name!r} missing"
    assert any(dep.replace(" ", "") == "kp==0.9.0" for dep in extras["vulkan"])
    numpy_dep = next(d for d in meta["dependencies"] if d.startswith("numpy"))
    assert "<2" in numpy_dep.replace(" ", "")


def test_numpy_below_2():
    import numpy

    major = int(numpy.__version__.split(".")[0])
    assert major < 2, f"numpy {numpy.__version__} in {sys.prefix}: kp 0.9.0 needs numpy < 2"


def _keyed_wheel_dir(root: pathlib.Path, args: str, ver: str = "0.3.36") -> pathlib.Path:
    """The folder scripts/build-llama-cpp-python.sh keeps the wheel of ``args`` in."""
    import hashlib

    key = hashlib.sha256(f"llama-cpp-python=={ver}\n{args}\n".encode()).hexdigest()[:16]
    return root / f"llama-cpp-python-{ver}-{key}"


def test_llama_cpp_python_wheel_is_keyed_by_its_build_flags(tmp_path):
    """A wheel is reused only from the folder of the same CMAKE_ARGS (pip's cache ignores them)."""
    script = ROOT / "scripts" / "build-llama-cpp-python.sh"
    found = {}
    for args in ("-DLLAVA_BUILD=ON -DGGML_AVX2=ON", "-DLLAVA_BUILD=OFF -DGGML_AVX2=ON"):
        d = _keyed_wheel_dir(tmp_path, args)
        d.mkdir()
        whl = d / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
        whl.write_bytes(b"")
        env = {**os.environ, "COOKTOP_WHEELS": str(tmp_path), "CMAKE_ARGS": args}
        res = subprocess.run(["bash", str(script), sys.executable], capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
        assert "reusing" in res.stderr
        found[args] = res.stdout.strip().splitlines()[-1]
        assert found[args] == str(whl)
    assert len(set(found.values())) == 2


def test_setup_builds_llama_cpp_python_with_mtmd():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-DLLAVA_BUILD=ON" in text and "-DLLAVA_BUILD=OFF" not in text
    assert "import llama_cpp.mtmd_cpp" in text and "build-llama-cpp-python.sh" in text
