"""The nodes of a Ray cluster, their names, and what runs on one of them.

A node's *name* is Ray's ``NodeName`` (``ray start --node-name``; the node's IP
address by default); when several live nodes share one (several nodes on one
host), each gets ``-<first 8 hex digits of its node id>`` appended. A selector
may also name a node by a prefix (6+ hex digits) of its id.

Cluster device selectors are ``NODE/DEVICE`` with DEVICE a local selector
(``cpu``, ``opencl:0``, ``vulkan:1``, ``auto``), e.g. ``alpha/opencl:0``; plain
``auto`` means every live node's ``auto`` device.

Work on a node runs in a Ray task or actor pinned to it
(``NodeAffinitySchedulingStrategy``, hard) that asks for no CPU, so probing
never waits behind a busy node's CPU slots.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from typing import Any

from ..errors import ClusterError
from .connect import get, import_ray


@dataclasses.dataclass(frozen=True)
class Node:
    """One live node of the cluster: ``name`` (see module doc), ``node_id`` (hex), ``address`` (IP)."""

    name: str
    node_id: str
    address: str


def list_nodes() -> list[Node]:
    """The live nodes, head node first, then by name, with unique names (module doc).

    Raises:
        ClusterError: not connected, or no live node.
    """
    ray = import_ray()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    alive.sort(key=lambda n: ("node:__internal_head__" not in n.get("Resources", {}),
                              str(n.get("NodeName") or ""), n["NodeID"]))
    if not alive:
        raise ClusterError("the Ray cluster has no live node")
    names = [str(n.get("NodeName") or n.get("NodeManagerAddress") or n["NodeID"][:8]) for n in alive]
    out = []
    for n, name in zip(alive, names):
        if names.count(name) > 1:
            name = f"{name}-{n['NodeID'][:8]}"
        out.append(Node(name, n["NodeID"], str(n.get("NodeManagerAddress", ""))))
    return out


def find_node(name: str, nodes: list[Node]) -> Node:
    """The node called ``name`` (case-insensitive), or whose id starts with it (6+ hex digits).

    Raises:
        ClusterError: no such live node (the message lists the live ones).
    """
    key = name.strip().lower()
    for n in nodes:
        if n.name.lower() == key:
            return n
    if len(key) >= 6:
        hits = [n for n in nodes if n.node_id.lower().startswith(key)]
        if len(hits) == 1:
            return hits[0]
    raise ClusterError(f"no live node {name!r} in the Ray cluster; its nodes are: "
                       f"{', '.join(n.name for n in nodes)}")


def split_selector(sel: str) -> tuple[str | None, str]:
    """``"alpha/opencl:0"`` -> ``("alpha", "opencl:0")``; ``"cpu"`` -> ``(None, "cpu")``."""
    node, slash, local = sel.strip().rpartition("/")
    return (node, local) if slash else (None, sel.strip())


def is_cluster_selector(device: str | None) -> bool:
    """True when a ``--device`` value names a node (any comma-separated part has ``NODE/``)."""
    return bool(device) and any("/" in p for p in str(device).split(","))


def pinned(node: Node) -> dict[str, Any]:
    """Ray ``.options(...)`` that run a task or actor on ``node`` and on no other, without a CPU slot."""
    import_ray()  # a clear error when Ray is missing
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False), "num_cpus": 0}


# -- what runs on a node -------------------------------------------------------------------------

def probe_here(smoke: bool = True) -> dict[str, Any]:
    """This node's usable devices (runs on the node).

    Returns:
        ``{"devices": {selector: DeviceInfo}, "smoke": {selector: (ok, detail)}, "auto": [selectors]}``;
        a device whose smoke test fails is left out of ``devices``.
    """
    from ..backends import registry

    devices, tests = {}, {}
    for _fam, res in registry.probe_all().items():
        if not res.available:
            continue
        for info in res.devices:
            if smoke and info.selector != "cpu":
                st = registry.smoke_test(info.selector)
                tests[info.selector] = (st.ok, st.detail)
                if not st.ok:
                    continue
            devices[info.selector] = info
    try:
        auto = registry.auto_selectors()
    except Exception:  # noqa: BLE001 - a probe never fails
        auto = ["cpu"]
    return {"devices": devices, "smoke": tests, "auto": auto}


def file_fingerprint(path: str) -> str | None:
    """``size:sha256(first MiB + last MiB)`` of a file, or None when it cannot be read.

    Tells whether a node's copy of a GGUF is the driver's without reading all of it.
    """
    try:
        size = os.path.getsize(path)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 1 << 20:
                f.seek(max(size - (1 << 20), 1 << 20))
                h.update(f.read())
        return f"{size}:{h.hexdigest()}"
    except OSError:
        return None


def _call(fn: Callable, *args: Any) -> Any:
    return fn(*args)


def run_each(calls: list[tuple[Node, Callable, tuple]], timeout: float | None = None) -> list[Any]:
    """``fn(*args)`` for each ``(node, fn, args)``, as Ray tasks pinned to their nodes, all at once;
    results in order. ``fn`` must be importable on the nodes (a module-level function of cooktop).

    Raises:
        ClusterError, or the CooktopError ``fn`` raised on a node (naming the node).
    """
    ray = import_ray()
    task = ray.remote(_call)
    refs = [task.options(**pinned(n), max_retries=0).remote(fn, *args) for n, fn, args in calls]
    return [get(r, f"node {n.name}", timeout) for (n, _f, _a), r in zip(calls, refs)]


def run_on_nodes(nodes: list[Node], fn: Callable, *args: Any, timeout: float | None = None) -> list[Any]:
    """``fn(*args)`` on each node (see :func:`run_each`), results in ``nodes`` order."""
    return run_each([(n, fn, args) for n in nodes], timeout)


class NodeProbe:
    """A small actor on a node, to measure what an actor call to that node costs (the hop latency)."""

    def take(self, x: Any) -> int:
        """Receive ``x`` (float32 activations in practice); returns its byte size."""
        return int(getattr(x, "nbytes", 0))

    def give(self, shape: tuple[int, ...]) -> Any:
        """Send back float32 zeros of ``shape`` (logits in practice)."""
        import numpy as np

        return np.zeros(shape, dtype=np.float32)


_probes: dict[str, Any] = {}


def probe_nodes(nodes: list[Node], smoke: bool = True) -> dict[str, dict[str, Any]]:
    """:func:`probe_here` on each node, cached per process: node_id -> probe."""
    todo = [n for n in nodes if n.node_id not in _probes]
    if todo:
        for n, res in zip(todo, run_on_nodes(todo, probe_here, smoke)):
            _probes[n.node_id] = res
    return {n.node_id: _probes[n.node_id] for n in nodes}


def resolve(device: str | None, nodes: list[Node], probes: Callable[[list[Node]], dict[str, dict]]) -> list[str]:
    """Expand a cluster ``--device`` value into ``NODE/SELECTOR`` items (module doc).

    ``auto`` (or nothing) is each live node's ``auto`` device, in node order;
    ``NODE/auto`` that node's; ``NODE/opencl`` its first OpenCL device.

    Raises:
        ClusterError: an unknown node. DeviceError: a part without a node, or a device the node lacks.
    """
    from ..errors import DeviceError

    parts = [p.strip() for p in (device or "auto").split(",") if p.strip()] or ["auto"]
    out: list[str] = []
    for p in parts:
        node_name, local = split_selector(p)
        if node_name is None:
            if local.lower() != "auto":
                raise DeviceError(f"device {p!r} has no node: with --ray, name devices as NODE/DEVICE "
                                  f"(e.g. {nodes[0].name}/{local}) or use auto (every node's auto device)")
            for n in nodes:
                out += [f"{n.name}/{s}" for s in probes([n])[n.node_id]["auto"]]
            continue
        node = find_node(node_name, nodes)
        probe = probes([node])[node.node_id]
        local = local.lower()
        if local == "auto":
            sels = probe["auto"]
        else:
            fam, _, idx = local.partition(":")
            sels = [f"{fam}:{idx or 0}" if fam != "cpu" else "cpu"]
            if sels[0] not in probe["devices"]:
                why = ""
                if sels[0] in probe["smoke"] and not probe["smoke"][sels[0]][0]:
                    why = f" (it failed its smoke test: {probe['smoke'][sels[0]][1]})"
                raise DeviceError(f"node {node.name} has no usable device {local!r}{why}; its devices are: "
                                  f"{', '.join(probe['devices']) or 'none'}")
        out += [f"{node.name}/{s}" for s in sels]
    return out
