"""Cluster case: ``cooktop kld-table --ray`` covers every device of every node (``--device all``), and a
node's figures are this machine's. The references are computed here, in this (the driver's) process.
Each cell starts Ray actors (seconds each), so the command runs on three devices and ``all`` is
checked through :func:`cooktop.quality.table.cluster_devices`.

Run by tests/test_cluster.py inside a network namespace (see conftest.py here).
"""

from __future__ import annotations

import json

from conftest import SHARED

from .conftest import cli

TINY = SHARED / "models" / "tiny"
STORIES = SHARED / "models" / "stories260K.gguf"
TEXT = "/usr/share/common-licenses/GPL-3"


def local(path, n_chunk: int, base: str | None = None):
    """(PPL result, its chunking) of ``path`` over TEXT on this process' numpy, saving ``base`` if given."""
    from cooktop.quality import perplexity as ppl
    from cooktop.runtime.loader import load_model

    m = load_model(path, n_ctx=128, n_batch=128, device="cpu", logits_all=True)
    try:
        with open(TEXT) as f:
            tokens = ppl.tokenize_text(m.tokenizer, f.read()[:-1])
        ch = ppl.chunking(m.tokenizer, len(tokens), 128, 128, n_chunk)
        return ppl.perplexity_saving(m.model, tokens, ch, base) if base else ppl.perplexity(m.model, tokens, ch)
    finally:
        m.model.close()


def test_kld_table_covers_every_device_of_every_node(address, tmp_path):
    from cooktop.cluster.nodes import list_nodes, probe_nodes
    from cooktop.quality import table
    from cooktop.quality.kld import compare
    from cooktop.quality.logits_file import read_logits_file
    from cooktop.runtime.loader import load_model

    base = str(tmp_path / "base.kld")
    local(TINY / "tiny-F32.gguf", 1, base)
    m = load_model(TINY / "tiny-Q8_0.gguf", n_ctx=128, n_batch=128, device="cpu", logits_all=True)
    try:
        here = compare(m.model, read_logits_file(base), 128, 1).summary
    finally:
        m.model.close()
    nodes = list_nodes()
    probes = probe_nodes(nodes)
    want = [f"{n.name}/{d}" for n in nodes for d in probes[n.node_id]["devices"]]
    assert table.cluster_devices("all", address) == want
    assert {"alpha/cpu", "beta/cpu", "alpha/opencl:0", "alpha/vulkan:0"} <= set(want)
    r = cli("kld-table", "--kl-divergence-base", base, "-m", str(TINY / "tiny-Q8_0.gguf"), "--json",
            "--ray", address, "--device", "alpha/opencl:0,alpha/cpu,beta/cpu")
    assert r.returncode == 0, r.stderr
    cells = json.loads(r.stdout)
    assert [c["device"] for c in cells] == ["alpha/opencl:0", "alpha/cpu", "beta/cpu"]
    assert all(not c["error"] and c["summary"]["count"] == 63 for c in cells), cells
    by = {c["device"]: c["summary"] for c in cells}
    for node in ("alpha", "beta"):  # numpy on a node gives this machine's numpy figures
        assert by[f"{node}/cpu"]["kld"] == here["kld"] and by[f"{node}/cpu"]["ppl"] == here["ppl"]
    assert by["alpha/opencl:0"]["kld"] > 1.2 * here["kld"]  # its 8-bit activations: above numpy's


def test_report_covers_both_nodes(address, tmp_path):
    """``cooktop report --quick --ray``: one page and one report.json with each node's numpy, run on that
    node (its own machine facts), every figure measured, the schema kept."""
    from cooktop.report import schema

    out = tmp_path / "report"
    r = cli("report", "--quick", "--no-progress", "--ray", address, "--device", "alpha/cpu,beta/cpu", "-o", str(out),
            timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "report.json").read_text())
    schema.validate(doc)
    assert [n["node"] for n in doc["nodes"]] == ["alpha", "beta"]
    assert {d["selector"] for d in doc["devices"] if d["measured"]} == {"alpha/cpu", "beta/cpu"}
    assert "beta/opencl" in {d["selector"] for d in doc["devices"] if not d["usable"]}  # COOKTOP_DISABLE there
    assert [s for s in doc["steps"] if not s["ok"]] == []
    for dev in ("alpha/cpu", "beta/cpu"):
        assert {b["test"] for b in doc["bench"] if b["device"] == dev and b["avg_ts"]} == {"pp64", "tg16",
                                                                                          "tg16 @ d64"}
        assert len([k for k in doc["kld"] if k["device"] == dev and k["summary"]]) == 2
        assert [r["device"] for r in doc["recommendations"]].count(dev) == 2
    page = (out / "index.html").read_text()
    assert 'id="device-alpha-cpu"' in page and 'id="device-beta-cpu"' in page and 'id="nodes"' in page
