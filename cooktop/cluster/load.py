"""Loading a model across the nodes of a Ray cluster: plan the placement, start a segment actor each.

:func:`plan_cluster` probes each node that the ``--device`` value involves
(the registry probe and smoke test, run there) and places the layers with
``runtime.placement.place`` as on one machine, over selectors ``NODE/DEVICE``:
each device's probed memory sets its share when no ``--split`` is given, and
``-ngl auto`` takes as many layers as every node's budget allows. Units that
stay on the host (``-ngl`` below all) run on the numpy device of the driver's
node. :func:`load` then starts one :class:`~cooktop.cluster.pipeline.SegmentWorker`
per segment on its node and wraps the result in an ``engine.Engine``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from ..engine.generate import Engine
from ..errors import CooktopError, UnsupportedModelError
from ..format.gguf import GGUFFile, open_gguf
from ..format.kvtypes import KVConfig
from ..model.config import ModelConfig, load_config
from ..runtime.budget import device_limits
from ..runtime.loader import LoadedModel, check_batch, default_n_ctx, parse_split
from ..runtime.placement import HOST, Placement, parse_ngl, place
from ..text.tokenizer import Tokenizer
from .connect import address_from, call_timeout, connect, get, import_ray
from .nodes import Node, file_fingerprint, find_node, list_nodes, pinned, probe_nodes, resolve, run_each, split_selector
from .pipeline import ClusterModel, RemoteSegment, SegmentWorker
from .weights import Shipment, metadata_fields, partial_name, tensor_names, where_here

ENV_WEIGHTS = "COOKTOP_RAY_WEIGHTS"


@dataclasses.dataclass
class ClusterPlan:
    """A placement over ``NODE/DEVICE`` selectors and the nodes it uses.

    Attributes:
        placement: as on one machine, selectors prefixed by their node.
        selectors: the resolved ``--device`` selectors, in order.
        nodes: every live node; node_of: selector -> its node; host: where host units run.
    """

    placement: Placement
    selectors: list[str]
    nodes: list[Node]
    node_of: dict[str, Node]
    host: str


def driver_node(nodes: list[Node]) -> Node:
    """The node this process runs on (the first node when it is not one, e.g. a Ray Client)."""
    ray = import_ray()
    try:
        me = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001
        me = None
    return next((n for n in nodes if n.node_id == me), nodes[0])


def plan_cluster(gf: GGUFFile, cfg: ModelConfig, device: str | None, n_gpu_layers: int | str,
                 split: str | list[float] | None, n_ctx: int, n_batch: int, logits_all: bool) -> ClusterPlan:
    """Place ``gf``'s layers on the cluster's devices (module doc). Connect first (:func:`connect`).

    Raises:
        ClusterError: an unknown node. DeviceError: an unknown device on a node, bad ``--split``.
        DeviceOutOfMemoryError: an explicit ``-ngl`` does not fit a device.
    """
    nodes = list_nodes()
    selectors = resolve(device, nodes, probe_nodes)
    node_of = {s: find_node(split_selector(s)[0] or "", nodes) for s in selectors}  # resolve() named each

    def info(sel: str):
        if sel == HOST:  # the host units run on the driver's node (placement counts its memory too)
            me = driver_node(nodes)
            return probe_nodes([me])[me.node_id]["devices"][HOST]
        return probe_nodes([node_of[sel]])[node_of[sel].node_id]["devices"][split_selector(sel)[1]]

    def supports(sel: str, op: str, ty, **dims: int) -> str:
        return info(sel).supports_op(op, ty, **dims)

    def limits(sel: str):
        i = info(sel)
        return device_limits(sel.lower(), i.usable_mem_bytes or i.global_mem_bytes, i.max_alloc_bytes)

    # a cluster's caches keep every position in every layer (RemoteCache: no sliding-window split)
    p = place(gf, cfg, selectors, parse_ngl(n_gpu_layers), parse_split(split), supports, limits, n_ctx, n_batch,
              logits_all, kv=KVConfig(swa_full=True))
    if p.experts is not None:  # a cluster segment runs whole blocks: a block split in halves stays on the host
        for i, (sel, exp) in enumerate(zip(p.blocks, p.experts)):
            if sel != exp:
                p.notes.append(f"block {i} stays on cpu: its halves would run on {sel} and {exp}, and a cluster "
                               f"runs blocks whole")
                p.blocks[i] = HOST
        p.experts = None
    me = driver_node(nodes)
    host = f"{me.name}/cpu"
    node_of[host] = me
    p.blocks = [host if s == HOST else s for s in p.blocks]
    p.head = host if p.head == HOST else p.head
    for b in p.budgets:
        if b.selector == HOST:
            b.selector = host
    return ClusterPlan(p, selectors, nodes, node_of, host)


def _weights_specs(gf: GGUFFile, plan_cfg: ModelConfig, plan: ClusterPlan, weights: str) -> list[tuple]:
    """Per segment, how its node gets the weights: ``("path", file, "local" | "cached")`` or
    ``("ship", Shipment, file)``."""
    segs = plan.placement.segments()
    fingerprint = file_fingerprint(gf.path) or gf.path
    names = [tensor_names(gf, plan_cfg, blocks, head) for _sel, blocks, head in segs]
    partials = [partial_name(fingerprint, n) for n in names]
    found = run_each([(plan.node_of[sel], where_here, (os.path.abspath(gf.path), fingerprint, partial))
                      for (sel, _b, _h), partial in zip(segs, partials)])
    ray = import_ray()
    fields_ref: Any = None
    refs: dict[str, Any] = {}
    out: list[tuple] = []
    for where, n in zip(found, names):
        if where["how"] is not None and weights != "ship":
            out.append(("path", where["path"], where["how"]))
            continue
        if fields_ref is None:
            fields_ref = ray.put(metadata_fields(gf))
        out.append(("ship", Shipment(gf, n, fields_ref, refs), where["cache"]))
    return out


def start_segments(gf: GGUFFile, cfg: ModelConfig, plan: ClusterPlan, n_ctx: int, n_batch: int,
                   logits_all: bool, weights: str = "auto") -> list[RemoteSegment]:
    """Start and wait for one :class:`SegmentWorker` per segment of ``plan`` (module doc).

    Args:
        weights: ``auto`` (the node's own copy of the file when it has the same one, else a
            copy shipped before, else ship now) or ``ship`` (always ship).
    Raises:
        ClusterError: a node died or did not answer; the CooktopError a segment raised while
        loading (e.g. DeviceOutOfMemoryError), naming its node. Started actors are ended.
    """
    ray = import_ray()
    if weights not in ("auto", "ship"):
        raise CooktopError(f"bad weights mode {weights!r} ({ENV_WEIGHTS}): expected auto or ship")
    actor_cls = ray.remote(SegmentWorker)
    segs: list[RemoteSegment] = []
    specs = _weights_specs(gf, cfg, plan, weights)
    try:
        for (sel, blocks, head), w in zip(plan.placement.segments(), specs):
            node = plan.node_of[sel]
            spec = {"selector": split_selector(sel)[1], "blocks": blocks, "head": head, "cfg": cfg, "n_ctx": n_ctx,
                    "n_batch": n_batch, "logits_all": logits_all, "weights": w}
            actor = actor_cls.options(**pinned(node), max_restarts=0, max_concurrency=1).remote(spec)
            segs.append(RemoteSegment(actor, node, sel, blocks, head))
        for s in segs:
            info = get(s.actor.ready.remote(), s.label, timeout=max(call_timeout(), 60.0))
            s.pid, s.how, s.actor_id = info["pid"], info["how"], info["actor_id"]
    except BaseException:
        for s in segs:
            ray.kill(s.actor)
        raise
    return segs


def load_model(model_path: str | os.PathLike, *, ray_address: str | None = None, n_ctx: int = 0, n_batch: int = 512,
               device: str | None = None, n_gpu_layers: int | str = -1, split: str | list[float] | None = None,
               logits_all: bool = False, weights: str | None = None) -> LoadedModel:
    """``runtime.loader.load_model`` over a Ray cluster: a :class:`ClusterModel` in a ``LoadedModel``.

    Args:
        ray_address: the cluster (default ``COOKTOP_RAY``); unused inside a Ray worker.
        device: ``NODE/DEVICE`` selectors (comma list), ``auto`` (every node's auto device) or None (auto).
        weights: ``auto`` or ``ship`` (default ``COOKTOP_RAY_WEIGHTS`` or auto), see :func:`start_segments`.
        Others: as ``runtime.loader.load_model``.
    Raises:
        ClusterError (Ray missing, cluster unreachable, node lost), GGUFError, UnsupportedModelError (also:
        a model with recurrent layers), DeviceError, DeviceOutOfMemoryError.
    """
    t0 = time.perf_counter()
    gf = open_gguf(model_path)
    cfg = load_config(gf)
    if cfg.recurrent_layers:
        raise UnsupportedModelError(f"{model_path}: {cfg.arch} has recurrent layers, whose states a Ray cluster "
                                    "does not hold yet; run it on one machine")
    connect(address_from(ray_address))
    tokenizer = Tokenizer.from_gguf(gf.raw)
    n_ctx = default_n_ctx(cfg, n_ctx)
    n_batch = check_batch(n_batch, n_ctx)
    plan = plan_cluster(gf, cfg, device, n_gpu_layers, split, n_ctx, n_batch, logits_all)
    segs = start_segments(gf, cfg, plan, n_ctx, n_batch, logits_all,
                          weights or os.environ.get(ENV_WEIGHTS, "auto"))
    model = ClusterModel(gf, cfg, segs, n_ctx, n_batch, logits_all)
    return LoadedModel(gf, cfg, tokenizer, model, plan.placement, {}, n_ctx, n_batch,
                       (time.perf_counter() - t0) * 1e3)


def load(model_path: str | os.PathLike, *, keep_scores: bool = False, **kwargs) -> Engine:
    """:func:`load_model` wrapped in an ``engine.Engine`` (same arguments as ``engine.load`` plus
    ``ray_address`` and ``weights``).

    Raises:
        as :func:`load_model`.
    """
    m = load_model(model_path, **kwargs)
    try:
        return Engine(m.gf, m.cfg, m.tokenizer, m.model, m.placement, m.devices, m.load_ms, keep_scores)
    except BaseException:
        m.model.close()
        raise

