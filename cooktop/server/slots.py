"""Slots and the request queue: one worker thread runs every generation of the server.

llama-server's model (``-np`` slots, a queue of deferred requests): the
:class:`Scheduler` owns ``n_parallel`` :class:`Slot` s, each with a sequence
(KV cache) of its own on the one loaded model, and a FIFO of waiting
:class:`Job` s. Its worker thread admits waiting jobs into free slots and
advances the active ones one step each, round-robin, so several requests
progress together and each keeps its cached prompt prefix. Today a step is one
token of one sequence (the forward pass takes one sequence); batched decoding
would advance every active slot in one forward pass from the same loop.

A job is a function ``make(llm) -> iterator`` run on the worker thread (so
nothing else touches the model); its items are posted to the job's asyncio
queue on the server's event loop. A job whose client went away is cancelled:
its iterator is closed at the next step and its slot freed. More than
``max_queue`` waiting jobs: :class:`OverloadedError` (HTTP 503).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CooktopError


class OverloadedError(CooktopError):
    """The queue of waiting requests is full (HTTP 503)."""


#: Kinds of what a job posts: an item, the end, or an error (the exception).
ITEM, END, ERROR = "item", "end", "error"


class Job:
    """One request's work and its way back to the event loop.

    Attributes:
        make: ``make(llm) -> iterator`` (called on the worker thread).
        queue: asyncio.Queue of ``(kind, payload)`` on ``loop``.
        cancelled: set by :meth:`cancel`; the worker stops the job at its next step.
    """

    def __init__(self, make: Callable[[Any], Iterator[Any]], loop: asyncio.AbstractEventLoop):
        self.make, self.loop = make, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()

    def post(self, kind: str, payload: Any = None) -> None:
        """Hand an event to the event loop (dropped when the loop is gone)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: nobody is listening
            self.cancelled.set()

    def cancel(self) -> None:
        """Stop this job (its client went away); idempotent."""
        self.cancelled.set()

    async def events(self):
        """The job's items; raises the job's exception if it failed."""
        while True:
            kind, payload = await self.queue.get()
            if kind == END:
                return
            if kind == ERROR:
                raise payload
            yield payload


@dataclasses.dataclass
class Slot:
    """A place for one running job, with its own sequence (KV cache)."""

    id: int
    seq: Any
    job: Job | None = None
    it: Iterator[Any] | None = None
    n_steps: int = 0


@dataclasses.dataclass
class Metrics:
    """Counters for ``/metrics`` (llama-server's names where it has them)."""

    requests_total: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    prompt_tokens_total: int = 0
    tokens_predicted_total: int = 0
    step_seconds_total: float = 0.0
    errors_total: int = 0


class Scheduler:
    """``n_parallel`` slots on one model, a FIFO of at most ``max_queue`` waiting jobs, one worker thread.

    Args:
        llm: the loaded :class:`cooktop.api.Llama`.
        n_parallel: slots (``-np``); each beyond the first allocates a KV cache.
        max_queue: waiting jobs beyond which :meth:`submit` raises OverloadedError.
    Raises:
        CooktopError: ``n_parallel`` < 1 or ``max_queue`` < 0.
    """

    def __init__(self, llm: Any, n_parallel: int = 1, max_queue: int = 256):
        if n_parallel < 1:
            raise CooktopError(f"-np (parallel slots) must be >= 1, got {n_parallel}")
        if max_queue < 0:
            raise CooktopError(f"--max-queue must be >= 0, got {max_queue}")
        self.llm, self.max_queue = llm, max_queue
        eng = llm._engine
        self.slots = [Slot(i, eng.seq if i == 0 else eng.new_sequence()) for i in range(n_parallel)]
        self.metrics = Metrics()
        self._waiting: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="cooktop-slots", daemon=True)
        self._thread.start()

    # -- outside ----------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Jobs waiting for a slot."""
        return len(self._waiting)

    @property
    def busy(self) -> int:
        """Slots running a job."""
        return sum(s.job is not None for s in self.slots)

    def submit(self, make: Callable[[Any], Iterator[Any]], loop: asyncio.AbstractEventLoop) -> Job:
        """Queue a job.

        Raises:
            OverloadedError: ``max_queue`` jobs are already waiting (and every slot is busy).
        """
        job = Job(make, loop)
        with self._cv:
            free = sum(s.job is None for s in self.slots)
            if len(self._waiting) >= self.max_queue + free:
                raise OverloadedError(f"the server is overloaded: {len(self._waiting)} requests are waiting "
                                      f"for {len(self.slots)} slot(s) (--max-queue {self.max_queue}); retry later")
            self._waiting.append(job)
            self._cv.notify()
        return job

    def close(self) -> None:
        """Stop the worker (running jobs are closed) and wait for it."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)
        for s in self.slots[1:]:
            s.seq.close()

    # -- the worker thread ----------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and all(s.job is None for s in self.slots):
                    self._cv.wait()
                if self._stop:
                    break
                admitted = []
                for slot in self.slots:
                    if slot.job is None and self._waiting:
                        slot.job = self._waiting.popleft()
                        admitted.append(slot)
            for slot in admitted:
                self._start(slot)
            for slot in self.slots:
                if slot.job is not None:
                    self._step(slot)
        for slot in self.slots:
            if slot.job is not None:
                slot.job.post(ERROR, CooktopError("the server is shutting down"))
                self._free(slot)

    def _start(self, slot: Slot) -> None:
        job = slot.job
        if job.cancelled.is_set():
            self._free(slot)
            return
        self.llm._active_seq = slot.seq
        try:
            slot.it = iter(job.make(self.llm))
        except Exception as e:  # noqa: BLE001 - every failure goes back to its request
            job.post(ERROR, e)
            self._free(slot)
        finally:
            self.llm._active_seq = None

    def _step(self, slot: Slot) -> None:
        job = slot.job
        if job.cancelled.is_set():
            self._free(slot)
            return
        t0 = time.perf_counter()
        self.llm._active_seq = slot.seq  # a job may start a completion lazily, inside its iterator
        try:
            item = next(slot.it)
        except StopIteration:
            job.post(END)
            self._free(slot)
            return
        except Exception as e:  # noqa: BLE001
            self.metrics.errors_total += 1
            job.post(ERROR, e)
            self._free(slot)
            return
        finally:
            self.llm._active_seq = None
            self.metrics.step_seconds_total += time.perf_counter() - t0
        slot.n_steps += 1
        job.post(ITEM, item)

    def _free(self, slot: Slot) -> None:
        it, slot.it, slot.job, slot.n_steps = slot.it, None, None, 0
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - closing a finished generator cannot matter to anyone
                pass
