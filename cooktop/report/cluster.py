"""``cooktop report --ray ADDRESS``: the suite on every live node of a Ray cluster, one page.

Each node runs :func:`cooktop.report.runner.run_report` on its own devices (a Ray task pinned to it,
``cluster.nodes.run_each``, all nodes at once), in a temporary folder of its own (the synthetic
models are written there: the same seed, so the same bytes on every node); the reports come back
to the driver and are merged (:func:`merge`): every device becomes ``NODE/DEVICE``, every step and
figure row keeps its node's command (to be run on that node), and ``nodes`` holds each node's
machine, environment and time.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from typing import Any

from ..errors import CooktopError

#: Seconds a node's whole report may take before it counts as failed.
NODE_TIMEOUT_S = 3600.0


def node_report(level: str, device: str, models: list[str] | None) -> dict[str, Any]:
    """The report of the node this runs on (``device``: its local ``--device``), made in a temporary
    folder that is removed after."""
    from .runner import run_report
    from .suite import SUITES

    tmp = tempfile.mkdtemp(prefix="cooktop-report-")
    try:
        return run_report(SUITES[level], tmp, models, device, progress=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def node_devices(spec: str, names: list[str]) -> dict[str, str]:
    """``--device`` per node: ``all`` for every node, else the ``NODE/DEVICE`` items grouped by node.

    Raises:
        CooktopError: an item without ``NODE/`` or naming no live node.
    """
    if spec.strip().lower() == "all":
        return {n: "all" for n in names}
    out: dict[str, list[str]] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        node, sep, dev = part.partition("/")
        if not sep or not dev:
            raise CooktopError(f"--device {part!r} with --ray: name a node's device as NODE/DEVICE (or all)")
        hit = next((n for n in names if n.lower() == node.lower()), None)
        if hit is None:
            raise CooktopError(f"--device {part!r}: no live node {node!r} (nodes: {', '.join(names)})")
        out.setdefault(hit, []).append(dev)
    return {n: ",".join(v) for n, v in out.items()}


def _prefix(node: str, device: str) -> str:
    return f"{node}/{device}" if device else node


def merge(reports: list[tuple[dict[str, str], dict[str, Any]]], command: str) -> dict[str, Any]:
    """One report of several nodes' (``({"node", "node_id", "address"}, report)`` pairs, head first):
    the head's suite and machine, every row's device as ``NODE/DEVICE``, ``nodes`` with each node's
    machine, environment and seconds.

    Raises:
        CooktopError: the nodes ran different suites (different cooktop versions).
    """
    head = copy.deepcopy(reports[0][1])
    for node, doc in reports[1:]:
        if doc["suite"] != head["suite"]:
            raise CooktopError(f"node {node['node']} ran another suite (version {doc['suite']['version']} vs "
                               f"{head['suite']['version']}): install the same cooktop on every node")
    out = {k: v for k, v in head.items() if k not in ("steps", "devices", "models", "ops", "bench", "kld", "plans",
                                                        "recommendations")}
    out["command"] = command
    out["nodes"] = [{**node, "machine": doc["machine"], "environment": doc["environment"], "seconds": doc["seconds"]}
                    for node, doc in reports]
    for key in ("steps", "devices", "ops", "bench", "kld", "plans", "recommendations"):
        out[key] = []
        for node, doc in reports:
            for row in copy.deepcopy(doc[key]):
                if key == "devices":
                    row["selector"] = _prefix(node["node"], row["selector"])
                    row["node"] = node["node"]
                elif key == "recommendations":
                    row["device"] = _prefix(node["node"], row["device"]) if row["device"] else None
                else:
                    row["device"] = _prefix(node["node"], row["device"])
                out[key].append(row)
    seen: dict[str, dict] = {}
    for _node, doc in reports:  # the same file name (synthetic models) is one model of the page
        for m in doc["models"]:
            seen.setdefault(os.path.basename(m["path"]), m)
    out["models"] = list(seen.values())
    out["seconds"] = max(doc["seconds"] for _n, doc in reports)
    return out


def cluster_report(level: str, ray_address: str | None, device: str, models: list[str] | None) -> dict[str, Any]:
    """Run the suite on every live node (module doc) and merge the reports.

    Raises:
        ClusterError: Ray missing, the cluster unreachable. CooktopError: a bad ``--device``, or no node
            made its report (a node that fails is a failed ``node`` step; the others' figures stay).
    """
    from ..cluster.connect import address_from, connect, get, import_ray
    from ..cluster.nodes import _call, list_nodes, pinned

    connect(address_from(ray_address))
    nodes = list_nodes()
    per_node = node_devices(device, [n.name for n in nodes])
    todo = [n for n in nodes if n.name in per_node]
    task = import_ray().remote(_call)
    refs = [task.options(**pinned(n), max_retries=0).remote(node_report, level, per_node[n.name], models) for n in todo]
    got: list[tuple[dict[str, str], dict[str, Any]]] = []
    failed: list[dict[str, Any]] = []
    for n, ref in zip(todo, refs):
        info = {"node": n.name, "node_id": n.node_id, "address": n.address}
        try:
            got.append((info, get(ref, f"node {n.name}", NODE_TIMEOUT_S)))
        except CooktopError as e:  # a node that fails is a step of the page, the others' figures stay
            failed.append({"step": "node", "device": n.name, "command": "", "ok": False, "seconds": 0.0,
                           "error": str(e).splitlines()[0] if str(e) else type(e).__name__})
    if not got:
        raise CooktopError("no node of the cluster made its report: " + "; ".join(f["error"] for f in failed))
    cmd = f"cooktop report --{level} --ray {ray_address or '$COOKTOP_RAY'} --device {device}" + "".join(
        f" -m {m}" for m in models or [])
    out = merge(got, cmd)
    out["steps"] += failed
    return out
