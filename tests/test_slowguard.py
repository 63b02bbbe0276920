"""The slow-test guard (tests/slowguard.py) fails an unmarked test past the limit, passes a marked one,
and refuses a ``slow`` marker without a reason."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

CASES = '''
import time
import pytest

def test_fast():
    pass

def test_unmarked():
    time.sleep(0.3)

@pytest.mark.slow(reason="sleeps on purpose")
def test_marked():
    time.sleep(0.3)
'''


def _pytest(tmp_path, body: str, limit: str, strict: bool = True, extra=()) -> subprocess.CompletedProcess:
    (tmp_path / "test_cases.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "COOKTOP_SLOW_LIMIT": limit,
           "COOKTOP_SLOW_STRICT": "1" if strict else "0"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "slowguard", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), *extra, str(tmp_path / "test_cases.py")],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)


def test_unmarked_slow_test_fails_marked_one_passes(tmp_path):
    r = _pytest(tmp_path, CASES, "0.1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 2 passed" in r.stdout, r.stdout
    assert "test_cases.py::test_unmarked: its call took 0.3 s, more than 0.1 s, without @pytest.mark.slow" in r.stdout
    r = _pytest(tmp_path, CASES, "0")  # 0: no guard
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr


def test_by_default_an_unmarked_slow_test_is_reported_not_failed(tmp_path):
    """Without COOKTOP_SLOW_STRICT the outcome does not depend on the machine's speed: the unmarked test
    passes and is listed at the end."""
    r = _pytest(tmp_path, CASES, "0.1", strict=False)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr
    assert "unmarked slow tests (over 0.1 s" in r.stdout and "test_cases.py::test_unmarked" in r.stdout
    assert "test_cases.py::test_marked" not in r.stdout.split("unmarked slow tests")[1]


def test_unmarked_slow_tests_are_listed_under_xdist(tmp_path):
    """`make test` runs on pytest-xdist workers: the controller writes the list from their reports."""
    r = _pytest(tmp_path, CASES, "0.1", strict=False, extra=("-n", "2"))
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr
    listed = r.stdout.split("unmarked slow tests (over 0.1 s")[1]
    assert "test_cases.py::test_unmarked" in listed and "test_cases.py::test_marked" not in listed


def test_slow_marker_needs_a_reason(tmp_path):
    r = _pytest(tmp_path, "import pytest\n\n@pytest.mark.slow\ndef test_x():\n    pass\n", "20")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "@pytest.mark.slow needs reason='why it cannot be cheaper': test_cases.py::test_x" in r.stderr
