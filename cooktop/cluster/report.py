"""What ``cooktop devices --ray`` and ``cooktop plan --ray`` report about a cluster.

Devices: each live node runs the same device report as ``cooktop devices`` (the
registry probe and smoke tests, there), and the selectors gain the node's name.

Plan: the placement over ``NODE/DEVICE`` selectors (``cluster/load.py``), and for
one token of decoding the bytes each hop carries — float32 activations
``4 x n_embd`` from the driver to the first segment and between segments,
float32 logits ``4 x n_vocab`` from the last segment back to the driver — with
each hop's latency measured as the median round trip of a Ray actor call to the
receiving node carrying that payload (from this process, as the pipeline's calls go).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..model.config import ModelConfig
from .connect import get, import_ray
from .load import ClusterPlan
from .nodes import Node, NodeProbe, list_nodes, pinned, run_on_nodes


def cluster_devices(report: Callable[[bool], dict], smoke: bool = True) -> dict[str, Any]:
    """``report(smoke)`` (``cooktop devices``'s report) run on every live node.

    Returns:
        ``{"nodes": [{"node", "node_id", "address", "report"}]}`` in node order.
    Raises:
        ClusterError: a node failed or did not answer.
    """
    nodes = list_nodes()
    reps = run_on_nodes(nodes, report, smoke)
    return {"nodes": [{"node": n.name, "node_id": n.node_id, "address": n.address, "report": r}
                      for n, r in zip(nodes, reps)]}


def hop_latency_ms(node: Node, payload: np.ndarray, to_node: bool = True, repeats: int = 20) -> float:
    """Median milliseconds of an actor call that carries ``payload`` to ``node`` (``to_node``) or
    back from it, as one hop of the pipeline does.

    Raises:
        ClusterError: the node died or did not answer.
    """
    ray = import_ray()
    actor = ray.remote(NodeProbe).options(**pinned(node)).remote()
    where = f"node {node.name}"
    try:
        get(actor.take.remote(None), where)  # start-up is not a hop
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            get(actor.take.remote(payload) if to_node else actor.give.remote(payload.shape), where)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    finally:
        ray.kill(actor)


def transfer_hops(plan: ClusterPlan, cfg: ModelConfig, measure: bool = True) -> list[dict[str, Any]]:
    """The hops of one decoded token through ``plan``'s segments (module doc).

    Returns:
        per hop ``{"from", "to", "node", "bytes_per_token", "latency_ms"}``: ``from``/``to``
        are selectors or ``driver``, ``node`` the node whose call was timed (the receiving
        segment's; for the logits, the last segment's); latency None when not measured.
    """
    segs = plan.placement.segments()
    act = np.zeros((1, cfg.n_embd), dtype=np.float32)
    logits = np.zeros((1, cfg.n_vocab), dtype=np.float32)
    legs: list[tuple[str, str, Node, np.ndarray, bool]] = []  # (from, to, timed node, payload, towards it)
    prev = "driver"
    for sel, _blocks, _head in segs:
        legs.append((prev, sel, plan.node_of[sel], act, True))
        prev = sel
    legs.append((prev, "driver", plan.node_of[prev], logits, False))
    cache: dict[tuple[str, int, bool], float] = {}
    hops: list[dict[str, Any]] = []
    for src, dst, node, payload, to_node in legs:
        latency = None
        if measure:
            key = (node.node_id, payload.nbytes, to_node)
            if key not in cache:
                cache[key] = hop_latency_ms(node, payload, to_node)
            latency = cache[key]
        hops.append({"from": src, "to": dst, "node": node.name, "bytes_per_token": payload.nbytes,
                     "latency_ms": latency})
    return hops
