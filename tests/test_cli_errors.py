"""Bad input a fresh user tried on the CLI: each is refused in one line (exit 1) before any work,
or named clearly when it can only show while running."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


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
