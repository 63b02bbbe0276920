"""A model whose segments run on the nodes of a Ray cluster (llama.cpp's RPC split, on Ray).

Each segment of the placement (``runtime/placement.py``: consecutive blocks, and
the output head, on one device) lives in a :class:`SegmentWorker` actor pinned
to its node. The actor owns the segment's weights (a ``model.forward.Segment``
built from the node's copy of the GGUF or a shipped one, ``cluster/weights.py``)
and the K/V of every sequence for its blocks. :class:`ClusterModel` is a
``model.placed.PlacedModel``, as ``model.forward.Model`` is: the embedding, the rows of a pass,
``forward``, ``forward_batch`` and the cache checks are theirs, and only how the segments run
differs (:meth:`ClusterModel._run`), so an ``Engine``, its ``Sequence`` s and batched
decoding run on it unchanged.

A forward pass looks up the token embeddings on the driver, then submits one
Ray call per segment at once, each taking the previous call's result (float32
[n_tokens, n_embd] activations) as its argument, and waits for the last one
(float32 logits). Ray moves the activations from node to node; the driver waits
once per forward pass. A segment that dies (its node left the cluster, its
process was killed) fails that wait within seconds with a
:class:`~cooktop.errors.ClusterError` naming its node; a segment that stops
answering fails it after ``COOKTOP_RAY_TIMEOUT`` seconds. The model is then
unusable (its KV caches are gone): load it again.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
import weakref
from typing import Any

import numpy as np

from ..errors import ClusterError, CooktopError
from ..format.gguf import GGUFFile
from ..format.kvtypes import KV_DEFAULT
from ..model.config import ModelConfig
from ..model.placed import CacheTokens, PlacedModel, Rows
from .connect import get, import_ray, translate
from .nodes import Node

log = logging.getLogger("cooktop")


class SegmentWorker:
    """Ray actor body: one segment on one node, with the K/V of each sequence for its blocks.

    Args:
        spec: ``selector`` (the node-local device, e.g. ``opencl:0``), ``blocks``, ``head``,
            ``cfg`` (ModelConfig), ``n_ctx``, ``n_batch``, ``logits_all``, and ``weights``:
            ``("path", file, "local" | "cached")`` to open, or ``("ship", Shipment, file)`` to write first.
    A failure while setting up is kept and raised by :meth:`ready` (so the driver gets
    the CooktopError, e.g. DeviceOutOfMemoryError, rather than a dead actor).
    """

    def __init__(self, spec: dict[str, Any]):
        self._error: BaseException | None = None
        self.segment: Any = None  # model.forward.Segment once set up
        self.caches: dict[int, tuple[Any, list, list]] = {}  # cid -> (DeviceBuffer, k, v)
        try:
            self._setup(spec)
        except Exception as e:  # noqa: BLE001 - handed to the driver by ready()
            self._error = e

    def _setup(self, spec: dict[str, Any]) -> None:
        from ..backends import registry
        from ..format.gguf import open_gguf
        from ..model.forward import Segment
        from .weights import materialize

        self.cfg: ModelConfig = spec["cfg"]
        self.n_ctx = spec["n_ctx"]
        self.device = registry.open_device(spec["selector"])
        if spec["selector"] != "cpu":
            res = registry.smoke_test(spec["selector"])
            if not res.ok:
                log.warning("%s failed its smoke test (%s); using it because it was named", spec["selector"],
                            res.detail)
        weights = spec["weights"]
        if weights[0] == "ship":
            path, self.how = materialize(weights[1], weights[2]), "shipped"
        else:
            path, self.how = weights[1], weights[2]
        gf = open_gguf(path)
        self.segment = Segment(self.device, spec["blocks"], spec["head"], gf, self.cfg, spec["n_batch"],
                               spec["logits_all"])

    def ready(self) -> dict[str, Any]:
        """``{"pid", "how", "actor_id"}`` once the weights are on the device; raises the setup error otherwise."""
        if self._error is not None:
            raise self._error
        ray = import_ray()
        return {"pid": os.getpid(), "how": self.how, "actor_id": ray.get_runtime_context().get_actor_id()}

    def new_cache(self, cid: int, n_seq: int = 1) -> None:
        """Allocate cache ``cid``'s K and V for each block: [n_seq * n_ctx, n_head_kv * head_dim] each of the
        default cache type (f16, ``format.kvtypes.KV_DEFAULT``, what the placement budget counts; the layout
        of ``model.forward.KVCache``; a block reading another block's cache, gemma4's shared-KV blocks, gets
        that block's tensors, which must be in this segment).

        Raises:
            CooktopError: a shared-KV block whose source block is in another segment.
        """
        buf = self.device.buffer(f"KV cache {cid}")
        try:
            k: list = []
            v: list = []
            own: dict[int, int] = {}
            for i in self.segment.blocks:
                src = self.cfg.kv_source(i)
                if src != i:
                    if src not in own:
                        raise CooktopError(f"block {i} reads the KV cache of block {src}, which is in another "
                                           "segment")
                    k.append(k[own[src]])
                    v.append(v[own[src]])
                    continue
                own[i] = len(k)
                shape = (n_seq * self.n_ctx, self.cfg.layer(i).n_embd_kv)
                k.append(buf.zeros(shape, KV_DEFAULT))
                v.append(buf.zeros(shape, KV_DEFAULT))
        except BaseException:
            buf.release()
            raise
        self.caches[cid] = (buf, k, v)

    def drop_cache(self, cid: int) -> None:
        """Give cache ``cid``'s K/V back (unknown ids are ignored)."""
        kv = self.caches.pop(cid, None)
        if kv is not None:
            kv[0].release()

    def run(self, x: np.ndarray, rows: Rows, cid: int, embeddings: bool) -> tuple[np.ndarray, float]:
        """``Segment.run`` with cache ``cid``: (float32 activations or logits, compute milliseconds).

        Args:
            x: float32 [n, n_embd]; rows: the rows' positions, cells and outputs (``model.forward.Rows``).
        Raises:
            CooktopError: ``cid`` has no cache here (the actor was restarted and lost it).
        """
        t0 = time.perf_counter()
        kv = self.caches.get(cid)
        if kv is None:
            raise CooktopError(f"KV cache {cid} is not on this segment (the segment was restarted); "
                               "load the model again")
        out = self.segment.run(np.ascontiguousarray(x, dtype=np.float32), rows, kv[1], kv[2], embeddings)
        return out, (time.perf_counter() - t0) * 1e3

    def ping(self) -> int:
        """This actor's process id (liveness check)."""
        return os.getpid()

    def close(self) -> None:
        """Release every cache and the segment's buffers."""
        for cid in list(self.caches):
            self.drop_cache(cid)
        if self.segment is not None:
            self.segment.release()


@dataclasses.dataclass
class RemoteSegment:
    """A segment's actor and where it runs: ``selector`` is ``NODE/DEVICE``."""

    actor: Any
    node: Node
    selector: str
    blocks: list[int]
    head: bool
    actor_id: str = ""
    pid: int = 0
    how: str = ""

    @property
    def label(self) -> str:
        """e.g. ``node beta (beta/cpu, blocks 4-7 + output)``."""
        b = self.blocks
        what = (f"blocks {b[0]}-{b[-1]}" if len(b) > 1 else f"block {b[0]}") if b else ""
        if self.head:
            what = f"{what} + output" if what else "output"
        return f"node {self.node.name} ({self.selector}, {what})"


class RemoteCache(CacheTokens):
    """The K/V of ``n_seq`` sequences, held by the segment actors; the engine-side view of
    ``model.forward.KVCache`` (same attributes and methods).

    Attributes:
        seq_tokens: per sequence, the ids at positions ``0 .. n_past - 1``; n_ctx: positions per
        sequence; n_seq: sequences; cid: the caches' id on the actors.
    """

    def __init__(self, model: ClusterModel, cid: int, n_seq: int = 1):
        self._model_key = model._key
        self.cid = cid
        self.n_ctx, self.n_seq = model.n_ctx, n_seq
        self.seq_tokens: list[list[int]] = [[] for _ in range(n_seq)]
        self._closed = False
        self._release = weakref.finalize(self, ClusterModel._drop_remote, [s.actor for s in model.segments], cid)
        self._release.atexit = False

    def _free(self) -> None:
        """Free the K/V on every node (once)."""
        self._release()


@dataclasses.dataclass
class HopStats:
    """Decode-step timings (forward passes of one token) of a :class:`ClusterModel`, milliseconds summed.

    ``wall_ms``: driver-measured time of a pass's segment calls (submitting them to the result);
    ``compute_ms[i]``: segment i's own time in ``Segment.run``; the rest is overhead: serialization,
    Ray's calls and the moves of activations and logits over ``n_segments + 1`` hops (driver to
    the first segment, between segments, last segment back to the driver).
    """

    n_tokens: int = 0
    wall_ms: float = 0.0
    compute_ms: list[float] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Per-token means: ``ms_per_token``, ``compute_ms`` per segment, ``overhead_ms``,
        ``overhead_ms_per_hop``, ``n_hops``."""
        n = max(self.n_tokens, 1)
        hops = len(self.compute_ms) + 1
        overhead = (self.wall_ms - sum(self.compute_ms)) / n
        return {"n_tokens": self.n_tokens, "ms_per_token": self.wall_ms / n,
                "compute_ms": [c / n for c in self.compute_ms], "overhead_ms": overhead,
                "n_hops": hops, "overhead_ms_per_hop": overhead / hops}


class ClusterModel(PlacedModel[RemoteCache]):
    """A model placed on the nodes of a Ray cluster (module doc); what ``engine`` runs.

    Args:
        gf, cfg: the driver's GGUF (token embeddings are looked up here) and its config.
        segments: the started, ready segment actors in execution order.
        n_ctx, n_batch, logits_all: as ``model.forward.Model``.
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, segments: list[RemoteSegment], n_ctx: int, n_batch: int,
                 logits_all: bool = False):
        super().__init__(gf, cfg, n_ctx, n_batch, logits_all)
        self.segments = segments
        self._ids = itertools.count(1)
        self._broken: str | None = None
        self.stats = HopStats(compute_ms=[0.0] * len(segments))

    def _check_open(self) -> None:
        super()._check_open()
        if self._broken:
            raise ClusterError(f"this model lost a segment earlier ({self._broken}); load it again")

    def _where(self, err: BaseException) -> str:
        """The label of the segment ``err`` came from (by actor id; else the first one not answering)."""
        aid = getattr(err, "actor_id", None)
        for s in self.segments:
            if aid and s.actor_id == aid:
                return s.label
        ray = import_ray()
        for s in self.segments:
            try:
                ray.get(s.actor.ping.remote(), timeout=2)
            except Exception:  # noqa: BLE001 - this is the one
                return s.label
        return "a segment of the pipeline"

    def _new_cache(self, n_seq: int) -> RemoteCache:
        """Cache ``cid`` allocated by every segment on its node (``new_cache``'s errors, and
        ClusterError: a node failed)."""
        cid = next(self._ids)
        refs = [s.actor.new_cache.remote(cid, n_seq) for s in self.segments]
        try:
            get(refs, self._where)
        except ClusterError as e:
            self._broken = str(e)
            raise
        except CooktopError:
            self._drop_remote([s.actor for s in self.segments], cid)
            raise
        return RemoteCache(self, cid, n_seq)

    @staticmethod
    def _drop_remote(actors: list[Any], cid: int) -> None:
        """Ask every actor to free sequence ``cid`` (fire and forget; nothing if Ray is gone)."""
        try:
            ray = import_ray()
            if not ray.is_initialized():
                return
            for a in actors:
                a.drop_cache.remote(cid)
        except Exception:  # noqa: BLE001 - freeing never raises (it may run from a finalizer)
            pass

    def _run(self, x: np.ndarray, rows: Rows, cache: RemoteCache, embeddings: bool) -> np.ndarray:
        """One Ray call per segment, submitted at once, each taking the previous one's result; one
        wait for the last. Raises ClusterError (naming the node) when a segment dies or does not
        answer; the model is then broken. A one-row pass adds to :attr:`stats`."""
        t0 = time.perf_counter()
        h: Any = x
        timing = []
        for s in self.segments:
            h, t = s.actor.run.options(num_returns=2).remote(h, rows, cache.cid, embeddings)
            timing.append(t)
        try:
            out, *ms = get([h, *timing], self._where)
        except ClusterError as e:
            self._broken = str(e)
            raise
        if len(x) == 1:
            with self._lock:
                self.stats.n_tokens += 1
                self.stats.wall_ms += (time.perf_counter() - t0) * 1e3
                for i, m in enumerate(ms):
                    self.stats.compute_ms[i] += m
        return np.asarray(out)

    def reset_stats(self) -> None:
        """Start :attr:`stats` over (e.g. after a warm-up)."""
        with self._lock:
            self.stats = HopStats(compute_ms=[0.0] * len(self.segments))

    def check(self, timeout: float = 10.0) -> None:
        """Raise unless every segment answers a ping within ``timeout`` seconds (health check).

        Raises:
            ClusterError: naming the first segment that does not answer.
        """
        self._check_open()
        ray = import_ray()
        for s in self.segments:
            try:
                ray.get(s.actor.ping.remote(), timeout=timeout)
            except ray.exceptions.RayError as e:
                self._broken = str(translate(e, s.label))
                raise translate(e, s.label) from None

    def close(self) -> None:
        """Release every segment and end its actor. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            ray = import_ray()
            if ray.is_initialized():
                refs = [s.actor.close.remote() for s in self.segments]
                try:
                    ray.wait(refs, num_returns=len(refs), timeout=10)
                except Exception:  # noqa: BLE001 - a dead actor has nothing to free
                    pass
                for s in self.segments:
                    ray.kill(s.actor)
        except Exception:  # noqa: BLE001 - close never raises
            pass
