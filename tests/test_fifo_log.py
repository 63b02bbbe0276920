"""The validation harnesses' log collection (tests/fifo_log.py) under pytest-xdist: one FIFO per
worker, each worker's messages in its own section and attributed to its own tests."""

from __future__ import annotations

import os
import subprocess
import sys

import vulkan_validation
from conftest import ROOT
from fifo_log import run_collecting, xdist_workers

# A stand-in for a worker: switch to its own FIFO as the plugin does at import, mark a test, then
# write a "layer message" the way a checker does (open the path named by the environment anew).
_WORKER = r'''
import os, sys
from fifo_log import mark, use_worker_files
use_worker_files("FIFO_UNDER_TEST")
mark("FIFO_UNDER_TEST", sys.argv[1], "test " + sys.argv[2])
with open(os.environ["FIFO_UNDER_TEST"], "w") as f:
    f.write(f"VUID-{sys.argv[3]}(ERROR / SPEC): msgNum: 1 - from {sys.argv[2]}\n")
'''


def test_xdist_workers_reads_the_n_option():
    assert xdist_workers(["-q", "-k", "vulkan"]) == 0
    assert xdist_workers(["-q", "-n", "3", "-k", "x"]) == 3
    assert xdist_workers(["-n4"]) == 4
    assert xdist_workers(["--numprocesses=5"]) == 5
    assert xdist_workers(["-n", "auto"]) == (os.cpu_count() or 1)
    assert xdist_workers(["-n", "0"]) == 0


def test_each_worker_writes_its_own_section(tmp_path):
    marker = vulkan_validation.MARKER

    def run(fifo: str) -> int:
        for wid, test, vuid in (("gw1", "t.py::b", "B"), ("gw0", "t.py::a", "A"), ("gw7", "t.py::c", "C")):
            env = {**os.environ, "FIFO_UNDER_TEST": fifo, "PYTEST_XDIST_WORKER": wid,
                   "PYTHONPATH": str(ROOT / "tests")}
            subprocess.run([sys.executable, "-c", _WORKER, marker, test, vuid], env=env, check=True, timeout=60)
        return 0

    rc, text = run_collecting(str(tmp_path), "log.fifo", run, workers=2, marker=marker)
    assert rc == 0
    # gw7 had no FIFO of its own (a restarted worker): it wrote to the main one, which comes first
    sections = text.split(f"{marker} worker ")
    assert "from t.py::c" in sections[0]
    assert sections[1].startswith("gw0\n") and "from t.py::a" in sections[1]
    assert sections[2].startswith("gw1\n") and "from t.py::b" in sections[2]
    msgs = vulkan_validation.parse_log(text)
    assert [(m.id, m.test) for m in msgs] == [("VUID-C", "t.py::c"), ("VUID-A", "t.py::a"), ("VUID-B", "t.py::b")]


def test_a_worker_section_does_not_inherit_the_last_test():
    text = (f"{vulkan_validation.MARKER} test x.py::one\n"
            f"{vulkan_validation.MARKER} worker gw0\n"
            "VUID-X(ERROR / SPEC): msgNum: 1 - before gw0's first test\n")
    assert [(m.id, m.test) for m in vulkan_validation.parse_log(text)] == [("VUID-X", "")]
