"""``Llama.create_completions``: several prompts completed together, batched.

The explicit batch API (llama-cpp-python has none; this is llama.cpp's
``batched`` example and ``llama-server -np N`` behind one call): the prompts
run on ``n_parallel`` sequences of one shared KV cache, each on a thread of its
own running an ordinary :meth:`create_completion <cooktop.api.completion.CompletionMixin.create_completion>`,
and a :class:`~cooktop.engine.batch.BatchDriver` evaluates their tokens in
shared forward passes (one token of every decoding prompt per pass, prompts in
chunks beside them). Each response equals what ``create_completion`` alone
gives for the same arguments and seed, within float rounding of the logits.

The sequences and driver are kept on the ``Llama`` for the next call (a later
prompt sharing a prefix with an earlier one on the same sequence reuses its
K/V); ``close()`` releases them. Calling ``create_completion`` from several
threads on one ``Llama`` is *not* batched: those calls share the default
sequence, and one interrupts the other.
"""

from __future__ import annotations

import threading
from typing import Any

from ..engine.batch import BatchDriver
from ..errors import CooktopError
from .base import LlamaBase
from .types import Completion


class BatchMixin(LlamaBase):
    """Batched completions for :class:`cooktop.api.llama.Llama`."""

    def create_completions(self, prompts: list[str | list[int]], *, n_parallel: int | None = None,
                           **kwargs: Any) -> list[Completion]:
        """Complete every prompt of ``prompts``, ``n_parallel`` at a time in shared forward passes.

        Args:
            prompts: texts or token-id lists.
            n_parallel: sequences decoded together (llama.cpp ``-np``; default: one per prompt).
            kwargs: :meth:`create_completion`'s arguments (not ``stream``), the same for every prompt.
        Returns:
            one ``text_completion`` dict per prompt, in order.
        Raises:
            CooktopError: ``stream=True``, ``n_parallel`` < 1, or the Llama is closed; the
                first error a prompt raised (e.g. ContextOverflowError), after all finished.
        """
        eng = self._engine
        if kwargs.get("stream"):
            raise CooktopError("create_completions returns whole responses: use stream=False (or a server)")
        prompts = list(prompts)
        if not prompts:
            return []
        n = len(prompts) if n_parallel is None else int(n_parallel)
        if n < 1:
            raise CooktopError(f"n_parallel must be >= 1, got {n_parallel}")
        n = min(n, len(prompts))
        seqs, driver = self._batch_sequences(eng, n)
        results: list[Any] = [None] * len(prompts)
        todo = iter(range(len(prompts)))
        lock = threading.Lock()

        def work(seq) -> None:
            self._active_seq = seq
            try:
                while True:
                    with lock:
                        i = next(todo, None)
                    if i is None:
                        return
                    try:
                        results[i] = self.create_completion(prompts[i], **kwargs)
                    except Exception as e:  # noqa: BLE001 - raised in the caller's thread below
                        results[i] = e
            finally:
                driver.leave()

        driver.join(n)
        threads = [threading.Thread(target=work, args=(s,), name=f"cooktop-seq{i}", daemon=True)
                   for i, s in enumerate(seqs[:n])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            if isinstance(r, Exception):
                raise r
        return results

    def _batch_sequences(self, eng: Any, n: int) -> tuple[list[Any], BatchDriver]:
        """The kept sequences and driver, made (again) when fewer than ``n``."""
        kept = self.__dict__.get("_batch")
        if kept is not None and len(kept[0]) >= n and kept[0][0].model is eng.model:
            return kept
        self._close_batch()
        seqs = eng.new_sequences(n)
        kept = (seqs, BatchDriver(eng.model, seqs))
        self.__dict__["_batch"] = kept
        return kept

    def _close_batch(self) -> None:
        """Stop the kept driver and drop its sequences (their shared cache goes with them)."""
        kept = self.__dict__.pop("_batch", None)
        if kept is not None:
            kept[1].close()
