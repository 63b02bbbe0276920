"""Cluster case: ``cooktop kld-table --ray`` covers every device of every node, and a node's numpy
gives this machine's numpy figures.

Run by tests/test_cluster.py inside a network namespace (see conftest.py here).
"""

from __future__ import annotations

import json

import pytest
from conftest import SHARED

from .conftest import cli

TINY = SHARED / "models" / "tiny"
TEXT = "/usr/share/common-licenses/GPL-3"


def test_kld_table_covers_every_device_of_every_node(address, tmp_path):
    base = tmp_path / "base.kld"
    args = ["kld-table", "--kl-divergence-base", str(base), "-m", str(TINY / "tiny-Q8_0.gguf"), "--json"]
    r = cli(*args, "--base-model", str(TINY / "tiny-F32.gguf"), "-f", TEXT, "-c", "128", "--chunks", "1",
            "--device", "cpu,opencl:0")
    assert r.returncode == 0, r.stderr
    here = {c["device"]: c["summary"] for c in json.loads(r.stdout)}
    probe = json.loads(cli("devices", "--ray", address, "--json").stdout)
    want = [f"{n['node']}/{d['selector']}" for n in probe["nodes"]
            for fam in n["report"]["families"].values() for d in fam.get("devices", []) if d.get("usable")
            and d.get("smoke_test", "PASS") == "PASS"]
    r = cli(*args, "--ray", address, "--device", "all")
    assert r.returncode == 0, r.stderr
    cells = json.loads(r.stdout)
    assert sorted(c["device"] for c in cells) == sorted(want)
    assert {"alpha/cpu", "beta/cpu", "alpha/opencl:0"} <= {c["device"] for c in cells}
    assert all(not c["error"] and c["summary"]["count"] == 63 for c in cells), cells
    by = {c["device"]: c["summary"] for c in cells}
    for node in ("alpha", "beta"):  # numpy on a node gives this machine's numpy figures
        assert by[f"{node}/cpu"]["kld"] == here["cpu"]["kld"] and by[f"{node}/cpu"]["ppl"] == here["cpu"]["ppl"]
    assert by["alpha/opencl:0"]["kld"] == pytest.approx(here["opencl:0"]["kld"], rel=1e-4)
    assert by["alpha/opencl:0"]["kld"] > 1.2 * here["cpu"]["kld"]  # its 8-bit activations: larger than numpy's
