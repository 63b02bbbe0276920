"""Recording the Vulkan backend's op lists into ``kp.Sequence`` s: barriers, the sequence
cache and graphs (:meth:`cooktop.backends.base.Device.graph`).

The device (:class:`~.vulkan.VulkanDevice`) enqueues every op as an entry of its
pending list: ``("algo", entry, push)`` (a dispatch: ``entry`` is the cached
``(algorithm, handles, handles read, handles written, variant)`` of
``VulkanDevice._dispatch_raw``), ``("host_read", tensor, ())`` (the host reads a
host tensor after the fence) or ``("graph", graph, ())`` (a recorded graph's ops).
:meth:`SequenceRecorder.flush` runs the list as one sequence:

- **Sequence cache**: the list's signature (kp objects and graphs hash by identity,
  plus push constants) keys an LRU of recorded sequences (:data:`MAX_SEQUENCES`,
  evicted ones destroyed), so a list seen before is replayed without recording.
  Ops issued outside any graph scope (tests, ``bench --ops``) are cached this way.
- **Graphs**: inside ``device.graph(key)`` the ops of a key seen for the first time
  are enqueued as usual and then kept as the graph's op list (:class:`Graph`), in an
  LRU of :data:`MAX_GRAPHS` keyed by ``key``; the pending list holds one
  ``("graph", g, ())`` entry in their place. The next time the key comes, the caller
  issues nothing (``issue`` is False) and the same entry is enqueued, so a decode
  step's signature is a handful of entries (its input writes, the graph, the
  read-back) whatever the number of ops, and no op's Python path runs. Ops issued
  during a replay (``graph_check``) go to a side list compared with the recording;
  a difference raises DeviceError and drops the graph. A graph that uses a
  released tensor is dropped with it, so its key cannot replay freed buffers
  (the kp algorithms it holds are destroyed with them).
- **Barriers** (Vulkan spec 7.6, pipeline barriers; 7.1, execution and memory
  dependencies): :meth:`SequenceRecorder._record` tracks the buffers written and
  read since the last barrier (each variant's binding ``access``) and records one
  global memory barrier (compute shader write -> compute shader read/write, as
  ggml-vulkan's ggml_vk_sync_buffers) only before a dispatch that reads or writes a
  buffer written since then (RAW, WAW) or writes one read since then (WAR). Each
  sequence starts with a barrier from everything earlier on the queue (compute and
  transfer writes: the last sequence, weight uploads) and a read-back ends with a
  compute-write -> host-read barrier. A graph is expanded in place when recorded,
  so the barriers around and inside it are those of the same list issued op by op.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterator
from typing import Any

from ...errors import DeviceError
from .shaders import pack_push

#: Recorded sequences kept per device (LRU).
MAX_SEQUENCES = 64

#: Graphs (op lists by key) kept per device (LRU).
MAX_GRAPHS = 64

# Vulkan enum values (vulkan_core.h): VkAccessFlagBits and VkPipelineStageFlagBits.
ACCESS_SHADER_READ = 0x00000020
ACCESS_SHADER_WRITE = 0x00000040
ACCESS_TRANSFER_READ = 0x00000800
ACCESS_TRANSFER_WRITE = 0x00001000
ACCESS_HOST_READ = 0x00002000
STAGE_COMPUTE_SHADER = 0x00000800
STAGE_TRANSFER = 0x00001000
STAGE_HOST = 0x00004000


class Graph:
    """One recorded graph: its key, its op list (pending-list entries) and the kp tensors
    the list binds (``handles``: a release of any of them drops the graph)."""

    __slots__ = ("key", "ops", "handles")

    def __init__(self, key: Hashable, ops: list[tuple]):
        self.key = key
        self.ops = ops
        self.handles = frozenset(h for kind, e, _ in ops if kind == "algo" for h in e[1])

    def __repr__(self) -> str:
        return f"Graph({self.key!r}, {len(self.ops)} ops)"


def _expand(ops: list[tuple]) -> Iterator[tuple]:
    """The pending-list entries with each graph replaced by its ops."""
    for op in ops:
        if op[0] == "graph":
            yield from op[1].ops
        else:
            yield op


def _describe(op: tuple | None) -> str:
    if op is None:
        return "nothing"
    kind, obj, push = op
    return f"{obj[4]} push {list(push)}" if kind == "algo" else kind


class SequenceRecorder:
    """The recording half of :class:`~.vulkan.VulkanDevice` (a mixin; the device sets
    ``mgr`` and ``_kp`` and calls :meth:`_init_recorder`). Module doc: design.

    Counters: ``n_recordings`` (sequences recorded), ``n_replays`` (cached sequences
    replayed), ``n_barriers`` (barriers recorded), ``n_graphs`` (graphs recorded),
    ``n_graph_replays`` (graph scopes served by a recording). ``record_graphs``:
    False makes :meth:`graph` scopes plain op lists (``COOKTOP_GRAPH=0``).
    """

    mgr: Any
    _kp: Any
    graph_check: bool

    def _init_recorder(self, record_graphs: bool) -> None:
        self._pending: list[tuple] = []
        self._sink = self._pending     # where dispatches go: the pending list, or a replay's check list
        self._seqs: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._graphs: collections.OrderedDict[Hashable, Graph] = collections.OrderedDict()
        self._scope: tuple | None = None  # ("record", start) / ("replay", graph) / ("plain",) in a graph scope
        self.record_graphs = record_graphs
        self.n_recordings = 0
        self.n_replays = 0
        self.n_barriers = 0
        self.n_graphs = 0
        self.n_graph_replays = 0

    def _flushed(self) -> None:
        """Hook: the pending list was submitted (the device resets its per-list write counters)."""

    # -- graphs -------------------------------------------------------------
    def _graph_begin(self, key: Hashable) -> bool:
        g = self._graphs.get(key) if self.record_graphs else None
        if g is None:
            self._scope = ("record", len(self._pending)) if self.record_graphs else ("plain",)
            return True
        self._graphs.move_to_end(key)
        self._scope = ("replay", g)
        self._sink = []
        return self.graph_check

    def _graph_end(self, key: Hashable) -> None:
        scope, self._scope = self._scope, None
        issued, self._sink = self._sink, self._pending
        assert scope is not None
        if scope[0] == "record":
            start = scope[1]
            g = Graph(key, self._pending[start:])
            del self._pending[start:]
            self._graphs[key] = g
            self.n_graphs += 1
            if len(self._graphs) > MAX_GRAPHS:
                self._drop_graph(next(iter(self._graphs.values())))
        elif scope[0] == "replay":
            g = scope[1]
            if issued and issued != g.ops:
                i = next((i for i, (a, b) in enumerate(zip(issued, g.ops)) if a != b), min(len(issued), len(g.ops)))
                self._drop_graph(g)
                raise DeviceError(
                    f"graph {key!r} on {self.info.selector}: the ops issued differ from its recording at op {i} of "  # type: ignore[attr-defined]
                    f"{len(g.ops)} (recorded {_describe(g.ops[i] if i < len(g.ops) else None)}, issued "
                    f"{_describe(issued[i] if i < len(issued) else None)}): the key misses something the op "
                    f"list depends on; nothing of this graph ran and its recording was dropped")
            self.n_graph_replays += 1
        else:
            return
        if g.ops:  # an empty graph enqueues nothing (an empty sequence must not be submitted)
            self._pending.append(("graph", g, ()))

    def _graph_abort(self, key: Hashable) -> None:
        scope, self._scope = self._scope, None
        self._sink = self._pending
        if scope is not None and scope[0] == "record":
            del self._pending[scope[1]:]

    def _drop_graph(self, g: Graph) -> None:
        """Forget ``g`` and destroy the sequences recorded with it."""
        if self._graphs.get(g.key) is g:
            del self._graphs[g.key]
        for sig in [s for s in self._seqs if any(e[1] is g for e in s if e[0] == "graph")]:
            self._seqs.pop(sig).destroy()

    def _drop_graphs_using(self, handles: set) -> None:
        """Drop every graph that binds one of ``handles`` (kp tensors about to be destroyed)."""
        for g in [g for g in self._graphs.values() if not g.handles.isdisjoint(handles)]:
            self._drop_graph(g)

    # -- running ------------------------------------------------------------
    def flush(self) -> None:
        """Execute the pending op list now (replaying its recorded sequence when cached).

        Raises:
            DeviceError: inside a graph scope (its ops are not complete yet).
        """
        if self._scope is not None:
            raise DeviceError("synchronize()/flush() inside a graph scope: the graph's ops are run after the scope")
        if not self._pending:
            return
        # (kind, kp algorithm, tensor or graph, push): kp objects and graphs hash by identity
        sig = tuple((kind, obj[0] if kind == "algo" else obj, push) for kind, obj, push in self._pending)
        seq = self._seqs.get(sig)
        if seq is None:
            seq = self._record(_expand(self._pending))
            self._seqs[sig] = seq
            if len(self._seqs) > MAX_SEQUENCES:
                _, old = self._seqs.popitem(last=False)
                old.destroy()
        else:
            self._seqs.move_to_end(sig)
            self.n_replays += 1
        self._pending.clear()
        self._flushed()
        seq.eval()

    def _record(self, ops: Iterator[tuple]) -> Any:
        """Record ``ops`` (entries, graphs expanded) into a new ``kp.Sequence`` with the barriers
        their data dependencies need.

        Tracking (module doc, "Barriers"): ``written`` / ``read`` hold the buffers (kp tensors)
        that dispatches since the last barrier wrote / read. A dispatch that reads or writes a
        buffer in ``written``, or writes one in ``read``, gets a global compute -> compute memory
        barrier first, which orders it after every earlier dispatch; then both sets restart.
        """
        kp = self._kp
        seq = self.mgr.sequence()
        written: set[Any] = set()
        read: set[Any] = set()
        first = True
        for kind, obj, push in ops:
            if kind == "algo":
                algo, reads, writes = obj[0], obj[2], obj[3]
                if first:
                    # Vulkan spec 7.6: a pipeline barrier's first scope covers all commands
                    # earlier in submission order, so this orders the previous sequences'
                    # dispatches and the weight uploads' copies before this one's.
                    self._barrier(seq, ACCESS_SHADER_WRITE | ACCESS_TRANSFER_WRITE,
                                  ACCESS_SHADER_READ | ACCESS_SHADER_WRITE,
                                  STAGE_COMPUTE_SHADER | STAGE_TRANSFER, STAGE_COMPUTE_SHADER)
                    first = False
                elif not written.isdisjoint(reads) or not written.isdisjoint(writes) or not read.isdisjoint(writes):
                    self._barrier(seq, ACCESS_SHADER_WRITE, ACCESS_SHADER_READ | ACCESS_SHADER_WRITE,
                                  STAGE_COMPUTE_SHADER, STAGE_COMPUTE_SHADER)
                    written.clear()
                    read.clear()
                seq.record(kp.OpDispatch(algo, pack_push(push)))
                written |= writes
                read |= reads
            else:  # host_read: the host reads ``obj`` (a host tensor the last copy wrote) after the fence
                self._barrier(seq, ACCESS_SHADER_WRITE, ACCESS_HOST_READ, STAGE_COMPUTE_SHADER, STAGE_HOST)
        self.n_recordings += 1
        return seq

    def _barrier(self, seq: Any, src_access: int, dst_access: int, src_stage: int, dst_stage: int) -> None:
        seq.record(self._kp.OpGlobalMemoryBarrier(src_access, dst_access, src_stage, dst_stage))
        self.n_barriers += 1

    def _drop_recordings(self) -> None:
        """Destroy every recorded sequence and forget every graph (device close)."""
        for seq in self._seqs.values():
            seq.destroy()
        self._seqs.clear()
        self._graphs.clear()
        self._pending.clear()
        self._sink = self._pending
        self._scope = None
