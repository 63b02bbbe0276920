"""Replaying the OpenCL backend's graph scopes (:meth:`cooktop.backends.base.Device.graph`) as
``cl_khr_command_buffer`` recordings (:mod:`.cmdbuf`), the way the Vulkan backend replays
``kp.Sequence`` s: a decode step's ~300 launches become one ``clEnqueueCommandBufferKHR``, and
none of their Python path (op checks, launch sizes, ``set_args``) runs.

Every kernel launch of the device goes through ``device._launch(kernel, gsize, lsize, *args)``
(:class:`ReplayRecorder`); outside a recording it is the plain ``kernel(queue, ...)``. A key is
recorded the second time it is seen (a prompt of a one-off length is never recorded; a decode
step's key recurs every token): the scope's launches run as usual and each is also recorded
into a command buffer, with a kernel object of its own (``Kernel.clone``: the arguments as set
for that launch, see :mod:`.cmdbuf`). From the third time on, ``graph()`` yields ``issue``
False and the buffer is enqueued instead. Under ``graph_check`` (the test suite) the ops are
issued into a side list, compared with the recording (kernel, sizes, every argument), and only
then the buffer is enqueued; a difference raises DeviceError and drops the recording.

What a recording must not depend on, and how it does not:

- Per-token values (positions, the KV row written, the number of keys attended) are read by the
  kernels from device buffers (``pos``, ``kv_start``) written before the scope, never passed as
  scalars or launch sizes (the forward pass's graph contract, shared with Vulkan).
- The 8-bit activation copies (:mod:`.q8`): a recorded scope uses slots of its own (a fresh
  :class:`~.q8.Q8Shadows` at each use whose allocations are served, in order, from the buffers
  the recording allocated), so a checked replay claims the very slot buffers it recorded whatever
  ran in between; the device's own slots are forgotten after the scope (its buffers were written).
- A scope that enqueues anything but kernels (buffer copies, fills: tensors in row chunks), a
  driver that refuses a command, or a kernel that cannot be cloned: the key is marked plain and
  runs op by op from then on. So does every key on a device without the extension, or with
  ``COOKTOP_OPENCL_REPLAY=0`` (the comparison switch).
- A recording is dropped when a tensor it binds is released, when the device's queue is
  replaced (profiling), and past :data:`MAX_RECORDINGS` (LRU).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Any

from ...errors import DeviceError
from .q8 import Q8Shadows

#: Recordings kept per device (LRU).
MAX_RECORDINGS = 32

#: Keys remembered as seen once (a key is recorded the second time), and as not recordable.
MAX_SEEN = 256

#: A recording whose own 8-bit slots take more bytes than this is not kept (a long prompt's).
MAX_Q8_BYTES = 32 << 20


class _SlotBuffers:
    """The allocator of a recording's 8-bit slots: the buffers allocated while recording, handed
    out again in the same order (and sizes) at each later use; anything else is a new buffer."""

    def __init__(self, alloc: Any):
        self._alloc = alloc
        self.bufs: list[tuple[int, Any]] = []
        self._i = 0

    def __call__(self, nbytes: int) -> Any:
        i = self._i
        self._i += 1
        if i < len(self.bufs) and self.bufs[i][0] == nbytes:
            return self.bufs[i][1]
        del self.bufs[i:]
        buf = self._alloc(nbytes)
        self.bufs.append((nbytes, buf))
        return buf

    def shadows(self) -> Q8Shadows:
        """Slots as at the start of the recording (none), allocating from the start again."""
        self._i = 0
        return Q8Shadows(self)

    @property
    def nbytes(self) -> int:
        return sum(n for n, _ in self.bufs)


class Recording:
    """One recorded scope: its command buffer, the launches as issued (``sig``: kernel, sizes,
    arguments; compared under ``graph_check``), the kernel clones and buffers it keeps alive,
    the buffer addresses it binds (``handles``), the queue it runs on and its own 8-bit slots."""

    __slots__ = ("key", "cmdbuf", "sig", "keep", "handles", "queue", "slots", "q8", "last", "failed")

    def __init__(self, key: Hashable, cmdbuf: int, queue: Any, alloc: Any):
        self.key, self.cmdbuf, self.queue = key, cmdbuf, queue
        self.slots = _SlotBuffers(alloc)
        self.q8 = self.slots.shadows()
        self.sig: list[tuple] = []
        self.keep: list[Any] = []
        self.handles: set[int] = set()
        self.last: int | None = None
        self.failed = ""


def _describe(op: tuple | None) -> str:
    if op is None:
        return "nothing"
    return f"a {op[1]}" if op[0] is None else f"{op[0].function_name} over {op[1]}"


class ReplayRecorder:
    """The recording half of :class:`~.device.OpenCLDevice` (a mixin; module doc). The device
    sets ``queue``, ``q8``, ``_alloc``, ``info`` and ``graph_check`` and calls :meth:`_init_replay`.

    Counters: ``n_recordings`` (scopes recorded), ``n_replays`` (scopes served by a recording),
    ``n_launches`` (kernel launches enqueued one by one). ``replay``: None when recordings are
    off, else the :class:`~.cmdbuf.CommandBufferAPI`; ``replay_reason`` says why not.
    """

    queue: Any
    q8: Q8Shadows
    graph_check: bool
    info: Any

    def _init_replay(self, api: Any, reason: str) -> None:
        self.replay = api
        self.replay_reason = reason
        self._recordings: collections.OrderedDict[Hashable, Recording] = collections.OrderedDict()
        self._seen: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._plain: collections.OrderedDict[Hashable, None] = collections.OrderedDict()  # keys run op by op
        self._rscope: tuple | None = None
        self._main_q8: Q8Shadows | None = None
        self._issued: list[tuple] = []
        self.n_recordings = 0
        self.n_replays = 0
        self.n_launches = 0
        self._launch = self._launch_plain

    # -- launches -------------------------------------------------------------
    def _launch_plain(self, knl: Any, gsize: tuple, lsize: tuple | None, *args: Any) -> None:
        self.n_launches += 1
        knl(self.queue, gsize, lsize, *args)

    def _launch_record(self, knl: Any, gsize: tuple, lsize: tuple | None, *args: Any) -> None:
        self.n_launches += 1
        knl(self.queue, gsize, lsize, *args)  # runs now; its arguments stay set on knl
        rec = self._rscope[1]  # type: ignore[index]
        if rec.failed:
            return
        try:
            clone = knl.clone()  # clCloneKernel: a kernel object with these arguments
            rec.last = self.replay.ndrange(rec.cmdbuf, clone, gsize, lsize, rec.last)
        except Exception as e:  # noqa: BLE001 - pyopencl or the driver: the key runs plain
            rec.failed = f"{knl.function_name}: {type(e).__name__}: {e}"
            return
        rec.sig.append((knl, gsize, lsize, args))
        rec.keep.append(clone)
        rec.handles.update(a.int_ptr for a in args if hasattr(a, "int_ptr"))

    def _launch_check(self, knl: Any, gsize: tuple, lsize: tuple | None, *args: Any) -> None:
        self._issued.append((knl, gsize, lsize, args))

    def _not_recordable(self, what: str) -> None:
        """Called before anything but a kernel is enqueued (a copy, a fill): inside a recording the
        key runs plain from now on; inside a checked replay it is a difference from the recording."""
        if self._rscope is None:
            return
        if self._rscope[0] == "record":
            self._rscope[1].failed = what
        elif self._rscope[0] == "check":
            self._issued.append((None, what, None, ()))

    # -- graph scopes ---------------------------------------------------------
    @property
    def graph_uses_before_replay(self) -> int:
        """2 (the first use runs op by op, the second records) with recordings on, else 0 (never replays)."""
        return 2 if self.replay is not None else 0

    def _graph_begin(self, key: Hashable) -> bool:
        if self.replay is None or key in self._plain:
            return True
        rec = self._recordings.get(key)
        if rec is not None and rec.queue is not self.queue:
            self._drop_recording(rec)
            rec = None
        if rec is None:
            if key not in self._seen:
                self._seen[key] = None
                if len(self._seen) > MAX_SEEN:
                    self._seen.popitem(last=False)
                return True
            try:
                cmdbuf = self.replay.create(self.queue)
            except DeviceError:
                self._mark_plain(key)
                return True
            rec = Recording(key, cmdbuf, self.queue, self._alloc)  # type: ignore[attr-defined]
            self._enter(("record", rec), self._launch_record)
            return True
        self._recordings.move_to_end(key)
        if self.graph_check:
            rec.q8 = rec.slots.shadows()
            self._issued = []
            self._enter(("check", rec), self._launch_check)
            return True
        try:
            self.replay.enqueue(rec.cmdbuf)
        except DeviceError:
            self._drop_recording(rec)
            self._mark_plain(key)
            return True
        self.n_replays += 1
        self.q8.forget_all()
        self._rscope = ("replayed", rec)
        return False

    def _enter(self, scope: tuple, launch: Any) -> None:
        self._rscope = scope
        self._main_q8, self.q8 = self.q8, scope[1].q8
        self._launch = launch

    def _leave(self) -> tuple | None:
        scope, self._rscope = self._rscope, None
        self._launch = self._launch_plain
        if self._main_q8 is not None:
            self.q8, self._main_q8 = self._main_q8, None
            self.q8.forget_all()  # the scope wrote buffers the device's slots may hold copies of
        return scope

    def _graph_end(self, key: Hashable) -> None:
        scope = self._leave()
        if scope is None or scope[0] == "replayed":
            return
        rec = scope[1]
        if scope[0] == "record":
            if not rec.failed and not rec.sig:
                rec.failed = "no kernel launched"
            if not rec.failed and rec.slots.nbytes > MAX_Q8_BYTES:
                rec.failed = "its 8-bit activation slots are too large to keep"
            if not rec.failed:
                try:
                    self.replay.finalize(rec.cmdbuf)
                except DeviceError as e:
                    rec.failed = str(e)
            if rec.failed:
                self._mark_plain(key)
                self._release_cmdbuf(rec)
                return
            self._recordings[key] = rec
            self.n_recordings += 1
            if len(self._recordings) > MAX_RECORDINGS:
                self._drop_recording(next(iter(self._recordings.values())))
            return
        issued, self._issued = self._issued, []  # a checked replay
        recorded = rec.sig
        if len(issued) != len(recorded) or any(a[0] is not b[0] or a[1:] != b[1:] for a, b in zip(issued, recorded)):
            i = next((i for i, (a, b) in enumerate(zip(issued, recorded)) if a[0] is not b[0] or a[1:] != b[1:]),
                     min(len(issued), len(recorded)))
            msg = (f"graph {key!r} on {self.info.selector}: the ops issued differ from its recording at launch {i} "
                   f"of {len(recorded)} (recorded {_describe(recorded[i] if i < len(recorded) else None)}, issued "
                   f"{_describe(issued[i] if i < len(issued) else None)}): the key misses something the op list "
                   f"depends on; nothing of this graph ran and its recording was dropped")
            self._drop_recording(rec)
            raise DeviceError(msg)
        try:
            self.replay.enqueue(rec.cmdbuf)
        except DeviceError:  # run what was issued, op by op
            self._drop_recording(rec)
            self._mark_plain(key)
            for knl, gsize, lsize, args in issued:
                self._launch_plain(knl, gsize, lsize, *args)
            return
        self.n_replays += 1

    def _graph_abort(self, key: Hashable) -> None:
        scope = self._leave()
        self._issued = []
        if scope is not None and scope[0] == "record":
            self._release_cmdbuf(scope[1])

    def _mark_plain(self, key: Hashable) -> None:
        """From now on ``key`` runs op by op (remembered for the last :data:`MAX_SEEN` such keys)."""
        self._plain[key] = None
        if len(self._plain) > MAX_SEEN:
            self._plain.popitem(last=False)

    # -- dropping -------------------------------------------------------------
    def _release_cmdbuf(self, rec: Recording) -> None:
        if rec.cmdbuf:
            rec.queue.finish()  # a buffer is given back only once nothing of it is pending
            self.replay.release(rec.cmdbuf)
            rec.cmdbuf = 0

    def _drop_recording(self, rec: Recording) -> None:
        if self._recordings.get(rec.key) is rec:
            del self._recordings[rec.key]
        self._release_cmdbuf(rec)
        rec.keep.clear()
        rec.sig.clear()

    def _drop_recordings_using(self, handles: set[int]) -> None:
        """Drop every recording that binds one of the buffer addresses ``handles`` (being released)."""
        for rec in [r for r in self._recordings.values() if not r.handles.isdisjoint(handles)]:
            self._drop_recording(rec)

    def _drop_all_recordings(self) -> None:
        for rec in list(self._recordings.values()):
            self._drop_recording(rec)
        self._seen.clear()
        self._plain.clear()
