"""Slots and the request queue: ``-np`` worker threads, continuous batching, prompt-prefix reuse.

llama-server's model (``-np`` slots, a queue of deferred requests): the
:class:`Scheduler` owns ``n_parallel`` :class:`Slot` s, each a sequence (cells
of one shared KV cache, :meth:`Engine.new_sequences
<cooktop.engine.generate.Engine.new_sequences>`), a FIFO of waiting
:class:`Job` s and ``n_parallel`` worker threads. A free worker takes the next
job and runs it; when the job starts a generation, it gets the free slot whose
cached tokens share the longest prefix with its prompt (llama-server's prompt
cache: a repeated system prompt or a continued conversation is not evaluated
again; ``usage.prompt_tokens_details.cached_tokens`` reports it), except that a
slot whose cache would mostly be discarded is left alone while an empty slot is
free (so conversations sharing a system prompt keep their own slots): the empty
slot then gets a copy of the shared prefix's K/V cells (llama.cpp's
``llama_memory_seq_cp``; llama-server restores such a prefix from its host-memory
prompt cache), so the prefix is not evaluated again; else the least recently used one. Every evaluation goes through one
:class:`~cooktop.engine.batch.BatchDriver`: a step evaluates one token of every
decoding slot and chunks of the prompts being read, in one forward pass, so a
new request joins the running batch at the next step and a finished or
cancelled one leaves it; no request waits for another to finish. With
``-np 1`` there is no driver: the one slot (the ``Llama``'s own sequence)
evaluates directly, as before.

A job is a function ``make(llm) -> iterator`` run on a worker thread (the
``Llama``'s sequence choice is per thread); its items are posted to the job's
asyncio queue on the server's event loop. A job whose client went away is
cancelled: its iterator is closed before its next step and its slot freed. A job's last event
(its end or its error) is posted once its slot is free, so its client finds the slot idle.
More than ``max_queue`` waiting jobs: :class:`OverloadedError` (HTTP 503).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..engine.batch import BatchDriver
from ..errors import CooktopError


class OverloadedError(CooktopError):
    """The queue of waiting requests is full (HTTP 503)."""


#: A free slot is chosen for its cached prefix when that prefix covers more than this share of the
#: prompt (llama-server's ``--slot-prompt-similarity``, default 0.1: llama.cpp common/common.h,
#: compared with ``>`` in tools/server/server-context.cpp); otherwise the least recently used one.
SLOT_PROMPT_SIMILARITY = 0.1

#: A free slot sharing a prefix with the prompt is reused only when that keeps at least this share
#: of what it caches, or when no slot is empty (llama-server's ``f_keep < 0.5``, below which it
#: saves the slot to its host-memory prompt cache before overwriting it; here the empty slots are
#: that cache: distinct prompts sharing a system prompt keep distinct slots).
SLOT_KEEP = 0.5

#: Kinds of what a job posts: an item, the end, or an error (the exception).
ITEM, END, ERROR = "item", "end", "error"


class Job:
    """One request's work and its way back to the event loop.

    Attributes:
        make: ``make(llm) -> iterator`` (called on the worker thread).
        queue: asyncio.Queue of ``(kind, payload)`` on ``loop``.
        cancelled: set by :meth:`cancel`; the worker stops the job at its next step.
        cache_prompt: False (llama-server's request field): each generation evaluates its whole
            prompt instead of reusing what its slot holds.
        id: the task id ``/slots`` reports (``id_task``), counted from 0 per process.
        id_slot: the slot the request asked for (llama-server's ``id_slot``: taken modulo the
            number of slots, waited for while busy); -1: any.
        lora: the LoRA adapter scales its evaluations use (one per adapter), fixed when it is
            submitted: the request's ``lora`` field, else the server's (``POST /lora-adapters``).
    """

    _ids = itertools.count()

    def __init__(self, make: Callable[[Any], Iterator[Any]], loop: asyncio.AbstractEventLoop,
                 cache_prompt: bool = True, id_slot: int = -1, lora: list[float] | None = None):
        self.make, self.loop, self.cache_prompt, self.id_slot = make, loop, cache_prompt, id_slot
        self.lora = lora
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self.id = next(Job._ids)

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
    """A sequence (KV cells) for one running job at a time; keeps its tokens when freed (prefix reuse).
    ``id_task``: the id of the job it runs or last ran (None: never used)."""

    id: int
    seq: Any
    job: Job | None = None
    last_used: int = 0
    id_task: int | None = None


@dataclasses.dataclass
class Metrics:
    """Counters for ``/metrics`` (llama-server's names and meanings where it has them:
    tools/server/server-task.cpp ``server_task_result_metrics::to_metrics``), counted from each
    answer's ``timings`` (:meth:`count_timings`): prompt tokens evaluated (not those read from the
    cache, counted apart), seconds in prompts and in generation, the longest sequence, drafts."""

    requests_total: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_tokens_max: int = 0
    draft_tokens_total: int = 0
    draft_accepted_total: int = 0
    busy_seconds_total: float = 0.0  # wall time with at least one job running
    errors_total: int = 0

    def count_timings(self, t: dict[str, Any]) -> None:
        """Add one answer's llama-server ``timings`` (``prompt_n``, ``cache_n``, ``prompt_ms``,
        ``predicted_n``, ``predicted_ms``, ``draft_n``, ``draft_n_accepted``; ms)."""
        self.prompt_tokens_total += int(t.get("prompt_n", 0))
        self.prompt_tokens_cached_total += int(t.get("cache_n", 0))
        self.prompt_seconds_total += float(t.get("prompt_ms", 0.0)) / 1e3
        self.tokens_predicted_total += int(t.get("predicted_n", 0))
        self.tokens_predicted_seconds_total += float(t.get("predicted_ms", 0.0)) / 1e3
        self.n_tokens_max = max(self.n_tokens_max, int(t.get("cache_n", 0)) + int(t.get("prompt_n", 0))
                                + int(t.get("predicted_n", 0)))
        self.draft_tokens_total += int(t.get("draft_n", 0))
        self.draft_accepted_total += int(t.get("draft_n_accepted", 0))


def slot_context(n_ctx: int, n_parallel: int) -> int:
    """Tokens of context each of ``n_parallel`` slots gets from a total ``n_ctx`` (``-c``), as llama.cpp
    sizes a non-unified cache (src/llama-context.cpp: ``n_ctx`` padded up to a multiple of 256, then
    ``n_ctx_seq = pad256(n_ctx / n_seq_max)``): ``-c 512 -np 2`` gives 256 a slot, ``-c 256 -np 2`` 256 too.

    Raises:
        CooktopError: ``n_ctx`` < 1 or ``n_parallel`` < 1.
    """
    if n_ctx < 1 or n_parallel < 1:
        raise CooktopError(f"slot_context: n_ctx {n_ctx} and n_parallel {n_parallel} must be >= 1")

    def pad(n: int) -> int:
        return (n + 255) // 256 * 256

    return pad(pad(n_ctx) // n_parallel)


def default_context(path: str) -> int:
    """The context ``-c 0`` means for the model at ``path``: its training context capped at 4096
    (``runtime.loader.default_n_ctx``; 4096 when the file does not say)."""
    from ..format.gguf import read_raw_metadata
    arch = read_raw_metadata(path, keys=("general.architecture",)).get("general.architecture")
    if arch is None or not isinstance(arch.value, bytes):
        return 4096
    key = arch.value.decode("utf-8", "replace") + ".context_length"
    v = read_raw_metadata(path, keys=(key,)).get(key)
    return min(int(v.value), 4096) if v is not None and isinstance(v.value, int) and v.value > 0 else 4096


class Scheduler:
    """``n_parallel`` slots and worker threads on one model, a FIFO of at most ``max_queue`` waiting jobs.

    Args:
        llm: the loaded :class:`cooktop.api.Llama`.
        n_parallel: slots (``-np``); more than one allocates one shared KV cache of ``n_parallel``
            sequences and a :class:`~cooktop.engine.batch.BatchDriver`, whose decode steps are run
            now as often as the device needs to replay them (``BatchDriver.prepare_steps``).
        max_queue: waiting jobs beyond which :meth:`submit` raises OverloadedError.
    Attributes:
        slots, metrics, driver (None with one slot).
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
        seqs = [eng.seq] if n_parallel == 1 else eng.new_sequences(n_parallel)
        self.driver: BatchDriver | None = BatchDriver(eng.model, seqs) if n_parallel > 1 else None
        if self.driver is not None:
            self.driver.prepare_steps()  # decode steps of 1..n slots recorded now, not in the first requests
        self.slots = [Slot(i, s) for i, s in enumerate(seqs)]
        #: the LoRA adapters' scales of requests without a ``lora`` field (``GET``/``POST /lora-adapters``;
        #: the loaded ones' at start: ``--lora``, ``--lora-scaled``, ``--lora-init-without-apply``)
        self.lora_scales: list[float] = eng.model.lora_scales()
        self.metrics = Metrics()
        self._waiting: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._running = 0
        self._busy_since = 0.0
        self._tick = 0
        self._threads = [threading.Thread(target=self._work, name=f"cooktop-slot{i}", daemon=True)
                         for i in range(n_parallel)]
        for t in self._threads:
            t.start()

    # -- outside ----------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Jobs waiting for a slot."""
        return len(self._waiting)

    @property
    def busy(self) -> int:
        """Jobs running (each on a slot of its own)."""
        return self._running

    def batch_size(self) -> tuple[int, int]:
        """(sequences, tokens) of the latest forward pass ((busy, busy) without a driver)."""
        if self.driver is None:
            return self._running, self._running
        st = self.driver.stats
        return st.last_seqs, st.last_tokens

    def tokens_per_second(self) -> float:
        """Generated tokens per second: over the last 10 s with a driver, else over the busy time."""
        if self.driver is not None:
            return self.driver.tokens_per_second()
        m = self.metrics
        return m.tokens_predicted_total / m.busy_seconds_total if m.busy_seconds_total > 0 else 0.0

    def slots_info(self, n_ctx: int, speculative: bool) -> tuple[list[dict[str, Any]], int]:
        """llama-server's ``GET /slots`` records and the number of idle slots.

        Each record: ``id``, ``n_ctx`` (``n_ctx`` tokens per slot), ``speculative``, ``is_processing``
        and, once the slot has run a job, ``id_task`` and ``n_prompt_tokens`` (tokens its cache
        holds: prompt and generated so far, as llama-server's ``prompt.tokens``); llama-server
        tools/server/server-context.cpp ``server_slot::to_json`` with metrics only.
        """
        with self._cv:
            out = []
            for s in self.slots:
                rec: dict[str, Any] = {"id": s.id, "n_ctx": n_ctx, "speculative": speculative,
                                       "is_processing": s.job is not None}
                if s.id_task is not None:
                    rec["id_task"] = s.id_task
                    rec["n_prompt_tokens"] = len(s.seq.tokens)
                out.append(rec)
            return out, sum(1 for s in self.slots if s.job is None)

    def submit(self, make: Callable[[Any], Iterator[Any]], loop: asyncio.AbstractEventLoop,
               cache_prompt: bool = True, id_slot: int = -1, lora: list[float] | None = None) -> Job:
        """Queue a job (``cache_prompt``, ``id_slot``, ``lora``: see :class:`Job`; ``lora`` None: the
        server's :attr:`lora_scales` now, so a later ``POST /lora-adapters`` does not change it).

        Raises:
            OverloadedError: ``max_queue`` jobs are already waiting (and every slot is busy).
        """
        job = Job(make, loop, cache_prompt, id_slot, list(lora) if lora is not None else list(self.lora_scales))
        with self._cv:
            free = len(self.slots) - self._running
            if len(self._waiting) >= self.max_queue + free:
                raise OverloadedError(f"the server is overloaded: {len(self._waiting)} requests are waiting "
                                      f"for {len(self.slots)} slot(s) (--max-queue {self.max_queue}); retry later")
            self._waiting.append(job)
            self._cv.notify()
        return job

    def _wait_free(self, slot: Slot) -> None:
        """Wait (holding ``_cv``) until ``slot`` runs no job.

        Raises:
            CooktopError: the server is shutting down.
        """
        while slot.job is not None and not self._stop:
            self._cv.wait()
        if self._stop:
            raise CooktopError("the server is shutting down")

    def erase(self, id_slot: int) -> int:
        """llama-server's ``POST /slots/ID?action=erase``: forget what slot ``id_slot`` (modulo the
        number of slots) caches, once it is idle; returns how many tokens it held (``n_erased``).

        Raises:
            CooktopError: the server is shutting down.
        """
        with self._cv:
            slot = self.slots[id_slot % len(self.slots)]
            self._wait_free(slot)
            n = len(slot.seq.tokens)
            slot.seq.reset()
            return n

    def slot_tokens(self, id_slot: int) -> list[int]:
        """The tokens slot ``id_slot`` (modulo the number of slots) caches, once it is idle
        (``POST /slots/ID?action=save``).

        Raises:
            CooktopError: the server is shutting down.
        """
        with self._cv:
            slot = self.slots[id_slot % len(self.slots)]
            self._wait_free(slot)
            return list(slot.seq.tokens)

    def close(self) -> None:
        """Stop the workers (running jobs end with an error, waiting ones too) and wait for them."""
        with self._cv:
            self._stop = True
            waiting, self._waiting = list(self._waiting), collections.deque()
            self._cv.notify_all()
        for job in waiting:
            job.post(ERROR, CooktopError("the server is shutting down"))
        for t in self._threads:
            t.join(timeout=30)
        if self.driver is not None:
            self.driver.close()
            for s in self.slots:
                s.seq.close()

    # -- the worker threads ---------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting:
                    self._cv.wait()
                if self._stop:
                    return
                job = self._waiting.popleft()
                if self._running == 0:
                    self._busy_since = time.perf_counter()
                self._running += 1
            last = None
            try:
                last = self._run(job)
            finally:
                with self._cv:
                    self._running -= 1
                    if self._running == 0:
                        self.metrics.busy_seconds_total += time.perf_counter() - self._busy_since
                    for slot in self.slots:
                        if slot.job is job:
                            slot.job = None
                    self._cv.notify_all()  # a request (or an erase) waiting for that slot
            if last is not None:  # after the slot is free: the answer's client finds it idle (/slots)
                job.post(*last)

    def _run(self, job: Job) -> tuple[str, Any] | None:
        """Run ``job`` on this thread until its end, an error, its cancellation or shutdown; returns
        the job's last event (END or ERROR, posted by :meth:`_work` once the slot is free), None when
        it was cancelled."""
        if job.cancelled.is_set():
            return None
        if self.driver is not None:
            self.driver.join()
        self.llm._active_seq = lambda prompt: self._choose(job, prompt)
        it = None
        try:
            it = iter(job.make(self.llm))
            while True:
                if self._stop:
                    return ERROR, CooktopError("the server is shutting down")
                if job.cancelled.is_set():
                    return None
                try:
                    item = next(it)
                except StopIteration:
                    return END, None
                if isinstance(item, dict) and isinstance(item.get("timings"), dict):  # an answer's last item
                    self.metrics.count_timings(item["timings"])
                job.post(ITEM, item)
        except Exception as e:  # noqa: BLE001 - every failure goes back to its request
            self.metrics.errors_total += 1
            return ERROR, e
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing a finished generator cannot matter to anyone
                    pass
            self.llm._active_seq = None
            if self.driver is not None:
                self.driver.leave()

    def _choose(self, job: Job, prompt: list[int]) -> Any:
        """The slot sequence a generation of ``job`` runs on: the one it holds; else the one it asks
        for (``id_slot``, waited for while busy); else, among the free
        slots whose prefix shared with ``prompt`` is over :data:`SLOT_PROMPT_SIMILARITY` of the
        prompt, those that keep at least :data:`SLOT_KEEP` of their cache, the one with the longest
        prefix (then the one holding more of the prompt, its last token included; then the least
        recently used); if none keeps enough, the first empty slot, given a
        copy of the longest similar slot's shared prefix (K/V cells copied on the device,
        :meth:`Sequence.copy_prefix <cooktop.engine.sequence.Sequence.copy_prefix>`: not evaluated
        again; where the devices cannot copy rows, it reads the whole prompt), or when none is empty
        the similar slot with the longest prefix; else the least recently used free slot (so a short
        unrelated prompt does not evict a long cached one)."""
        with self._cv:
            for slot in self.slots:
                if slot.job is job:
                    if not job.cache_prompt:
                        slot.seq.reset()
                    slot.seq.lora = job.lora
                    return slot.seq
            if job.id_slot >= 0:  # the asked-for slot, as llama-server (modulo the slots), once free
                asked = self.slots[job.id_slot % len(self.slots)]
                self._wait_free(asked)
                free = [asked]
            else:
                free = [s for s in self.slots if s.job is None]
            if not free:  # cannot happen: one worker thread per slot, a job holds at most one
                raise CooktopError("no free slot for this request")
            common = {id(s): s.seq.common_prefix(prompt, job.lora) for s in free}  # 0 under other LoRA scales
            # ties on the reusable prefix (at most len - 1 tokens: the last is evaluated again) go to
            # the slot holding more of the prompt: its own last token too (a prompt one token past a
            # shared prefix, asked again, finds its own slot, not the least recently used similar one)
            rank = {id(s): (common[id(s)], _shared(s.seq.tokens, prompt), -s.last_used) for s in free}
            similar = [s for s in free if common[id(s)] > SLOT_PROMPT_SIMILARITY * len(prompt)]
            # reusing a slot that keeps under SLOT_KEEP of its cache discards most of another prompt
            # (llama-server saves such a slot to its RAM prompt cache first): an empty slot keeps
            # both, at the prefix's cost; every similar slot is tried before giving up on them
            kept = [s for s in similar if common[id(s)] >= SLOT_KEEP * len(s.seq.tokens)]
            empty = [s for s in free if not s.seq.tokens]
            pool = kept or ([] if empty else similar)
            src = None
            if pool:
                best = max(pool, key=lambda s: rank[id(s)])
            elif similar:  # the empty slot gets the shared prefix's cells copied from the similar one
                best = empty[0]
                src = max(similar, key=lambda s: rank[id(s)])
            else:
                best = min(free, key=lambda s: s.last_used)  # no slot holds enough of it: the LRU one
            self._tick += 1
            best.job, best.last_used, best.id_task = job, self._tick, job.id
            best.seq.lora = job.lora  # its passes run with the job's scales (the driver groups by them)
            if not job.cache_prompt:
                best.seq.reset()
            elif src is not None:  # under the lock: no other job takes src while its cells are read
                best.seq.copy_prefix(src.seq, common[id(src)])  # False (no row copy): read in full
            return best.seq


def _shared(tokens: list[int], prompt: list[int]) -> int:
    """Leading tokens ``tokens`` and ``prompt`` share (uncapped, unlike ``Sequence.common_prefix``)."""
    n = 0
    for a, b in zip(tokens, prompt):
        if a != b:
            break
        n += 1
    return n
