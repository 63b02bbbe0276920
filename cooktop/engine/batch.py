"""Continuous batching: the evaluations of several sequences run in shared forward passes.

llama-server's loop (``update_slots``: one ``llama_decode`` per step holding a token of
every decoding slot plus prompt chunks of the slots still reading their prompt),
driven from the outside: each sequence's owner is a thread running an ordinary
generation (:meth:`Engine.generate <cooktop.engine.generate.Engine.generate>`,
``Llama.create_completion``...); when it evaluates (:meth:`Sequence.eval
<cooktop.engine.sequence.Sequence.eval>` on a sequence with a ``driver``), the
call parks the thread and hands the tokens to the :class:`BatchDriver`. The
driver's thread runs a step when every *member* thread is parked (none is still
sampling or sending its previous token), so each step holds one token of every
decoding sequence: one :meth:`Model.forward_batch
<cooktop.model.placed.PlacedModel.forward_batch>` of at most ``n_batch`` tokens,
decoding tokens first, then the prompts' tokens in arrival order, a prompt longer
than what is left of the step going on in the next steps beside the others'
decoding. A thread resumes when its last token's logits are back.

Members are counted, not named: :meth:`BatchDriver.join` before a thread's first
evaluation (or ``join(k)`` on behalf of ``k`` threads about to start), :meth:`leave`
when it is done. A thread that holds a membership but neither evaluates nor
leaves stalls every step (the rule that keeps steps full); a failed step fails
each request it carried, with the same exception.

The sequences must share one :class:`~cooktop.model.forward.KVCache` (made by
:meth:`Engine.new_sequences <cooktop.engine.generate.Engine.new_sequences>`).
Results are those of each sequence evaluated alone within float rounding (the
rows of a batch see the same weights; only the matmul's summation order may
differ with the row count on some backends).

LoRA adapters (``model/lora.py``) have one set of scales per forward pass, so a step holds only
sequences whose :attr:`Sequence.lora <cooktop.engine.sequence.Sequence.lora>` scales are equal
(llama-server's ``can_batch_with``: requests with different LoRA configurations are not batched
together): those of the longest-waiting request, set on the model before the pass; the others
wait for the next step (the groups take turns, as each step's requests park again behind them).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import numpy as np

from ..errors import CooktopError
from ..model.placed import PlacedModel, lora_key


@dataclasses.dataclass(eq=False)
class _Request:
    """One parked evaluation: ``tokens`` to append to ``seq``; ``done`` counts those evaluated."""

    seq: Any
    tokens: list[int]
    all_rows: bool = False  # logits of every token (a speculative draft), not just the last
    done: int = 0
    rows: list[np.ndarray] = dataclasses.field(default_factory=list)
    logits: np.ndarray | None = None
    error: BaseException | None = None
    finished: bool = False


@dataclasses.dataclass
class BatchStats:
    """What the driver did (``/metrics``, benchmarks).

    Attributes:
        steps: forward passes run; tokens: tokens evaluated in them (prompt + decode);
        decode_tokens: of which single-token (decoding) requests; seconds: time in forward passes;
        last_seqs, last_tokens: sequences and tokens of the latest step; max_seqs: the most
        sequences a step held.
    """

    steps: int = 0
    tokens: int = 0
    decode_tokens: int = 0
    seconds: float = 0.0
    last_seqs: int = 0
    last_tokens: int = 0
    max_seqs: int = 0


class BatchDriver:
    """Runs the evaluations of the sequences of one cache in shared forward passes (module doc).

    Args:
        model: the loaded model; sequences: :class:`~cooktop.engine.sequence.Sequence` s of one
            shared cache (their ``driver`` is set to this driver until :meth:`close`).
        n_batch: tokens per step (default and maximum: the model's ``n_batch``).
    Raises:
        CooktopError: the sequences do not share one cache of ``model``, or ``n_batch`` < 1.
    """

    def __init__(self, model: PlacedModel, sequences: list[Any], n_batch: int | None = None):
        caches = {id(s.cache) for s in sequences}
        if len(caches) != 1 or sequences[0].model is not model:
            raise CooktopError("a batch driver runs sequences of one shared KV cache of its model "
                               "(Engine.new_sequences)")
        self.model, self.cache = model, sequences[0].cache
        self.n_batch = min(n_batch or model.n_batch, model.n_batch)
        if self.n_batch < 1:
            raise CooktopError(f"n_batch must be >= 1, got {n_batch}")
        self.stats = BatchStats()
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (end time, decode tokens)
        self._cv = threading.Condition()
        self._pending: list[_Request] = []
        self._running = 0
        self._stop = False
        self._sequences = list(sequences)
        for s in sequences:
            s.driver = self
        self._thread = threading.Thread(target=self._loop, name="cooktop-batch", daemon=True)
        self._thread.start()

    # -- members ------------------------------------------------------------
    def join(self, k: int = 1) -> None:
        """Count ``k`` more member threads (each evaluates through this driver, then :meth:`leave` s)."""
        with self._cv:
            self._running += k

    def leave(self) -> None:
        """A member thread is done: steps no longer wait for it."""
        with self._cv:
            self._running -= 1
            self._cv.notify_all()

    def eval(self, seq: Any, tokens: list[int], all_rows: bool = False) -> np.ndarray:
        """Append ``tokens`` to ``seq`` in the coming steps; park until done (called by a member).

        Returns:
            float32 [1, n_vocab], the logits of the last token; with ``all_rows``
            float32 [len(tokens), n_vocab], every token's (speculative verification).
        Raises:
            CooktopError: the driver is closed; whatever the step raised.
        """
        req = _Request(seq, list(tokens), all_rows)
        with self._cv:
            if self._stop:
                raise CooktopError("the batch driver is closed")
            self._running -= 1
            self._pending.append(req)
            self._cv.notify_all()
            while not req.finished:
                self._cv.wait()  # the driver counted this thread running again when it finished req
        if req.error is not None:
            raise req.error
        assert req.logits is not None  # a finished request without an error has its logits
        return req.logits

    def prepare_steps(self, token: int = 0) -> int:
        """Run the decode steps of 1 .. n of the driver's sequences (one ``token`` each, at position 0;
        n at most ``n_batch``)
        as many times as a device of the model runs a pass's ops before replaying it
        (``graph_uses_before_replay``: OpenCL records a shape the second time it is seen), so that
        the first steps of concurrent requests are replayed instead of issued op by op and recorded;
        the most sequences first (the output rows' buffers grow to their size once). The sequences
        are emptied after. Call before any member evaluates (the server's scheduler does at start).

        Returns:
            the forward passes run (0 where no device replays).
        Raises:
            CooktopError: the driver is closed; whatever a forward pass raises.
        """
        uses = self.model.graph_uses_before_replay
        if self._stop:
            raise CooktopError("the batch driver is closed")
        runs = 0
        with self._cv:  # no step of the driver runs meanwhile (they need parked members anyway)
            for k in range(min(len(self._sequences), self.n_batch), 0, -1) if uses else ():
                items = [(s.seq_id, 0, [int(token)], True) for s in self._sequences[:k]]
                for _ in range(uses):
                    self.model.forward_batch(self.cache, items)
                    runs += 1
            if runs:
                for s in self._sequences:
                    s.truncate(0)
        return runs

    def tokens_per_second(self, window: float = 10.0) -> float:
        """Decoded tokens per second over the last ``window`` seconds (all sequences together)."""
        now = time.perf_counter()
        with self._cv:
            n = sum(k for t, k in self._recent if now - t <= window)
        return n / window

    def close(self) -> None:
        """Stop the driver thread (parked requests fail) and detach the sequences. Idempotent."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        for s in self._sequences:
            if s.driver is self:
                s.driver = None

    # -- the driver thread ----------------------------------------------------
    def _take(self) -> tuple[list[tuple[_Request, int]], list[float] | None]:
        """This step's share of each pending request: decoding ones first, then prompts in order, of
        the requests whose LoRA scales are the longest-waiting one's (module doc); and those scales
        (None: no request named any)."""
        budget = self.n_batch
        scales = next((r.seq.lora for r in self._pending if r.seq.lora is not None), None)
        key = lora_key(scales) if scales is not None else None
        group = [r for r in self._pending if key is None or r.seq.lora is None or lora_key(r.seq.lora) == key]
        order = sorted(group, key=lambda r: len(r.tokens) - r.done > 1)  # stable: decodes first
        out = []
        for r in order:
            if budget == 0:
                break
            k = min(len(r.tokens) - r.done, budget)
            out.append((r, k))
            budget -= k
        return out, scales

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._pending or self._running > 0):
                    self._cv.wait()
                if self._stop:
                    for r in self._pending:
                        r.error, r.finished = CooktopError("the batch driver is closed"), True
                        self._running += 1
                    self._pending.clear()
                    self._cv.notify_all()
                    return
                share, scales = self._take()
            items = [(r.seq.seq_id, r.seq.n_past, r.tokens[r.done:r.done + k],
                      k if r.all_rows else r.done + k == len(r.tokens)) for r, k in share]
            t0 = time.perf_counter()
            error: BaseException | None = None
            try:
                self.model.use_lora(scales)
                outs = self.model.forward_batch(self.cache, items)
            except BaseException as e:  # noqa: BLE001 - handed to every request of the step
                error, outs = e, [None] * len(items)
            t1 = time.perf_counter()
            n_tok = sum(k for _, k in share)
            n_dec = sum(1 for r, k in share if len(r.tokens) == 1)
            with self._cv:
                st = self.stats
                st.steps += 1
                st.tokens += n_tok
                st.decode_tokens += n_dec
                st.seconds += t1 - t0
                st.last_seqs, st.last_tokens = len(share), n_tok
                st.max_seqs = max(st.max_seqs, len(share))
                self._recent.append((t1, n_dec))
                while self._recent and t1 - self._recent[0][0] > 60:
                    self._recent.popleft()
                for (r, k), out in zip(share, outs):
                    if error is not None:
                        r.error, r.finished = error, True
                    else:
                        r.done += k
                        if r.all_rows and out is not None:
                            r.rows.append(out)
                        if r.done == len(r.tokens):
                            r.logits = np.concatenate(r.rows) if r.all_rows else out
                            r.finished = True
                    if r.finished:  # its thread runs again: the next step waits for it (no race)
                        self._pending.remove(r)
                        self._running += 1
                self._cv.notify_all()
