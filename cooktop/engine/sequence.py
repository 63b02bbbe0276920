"""One sequence on a loaded model: its KV cache, the tokens it holds, and optionally its logits.

A :class:`Sequence` is what one conversation (or one request, or one
``Llama``) runs on. Several sequences of one :class:`~cooktop.model.placed.PlacedModel`
share its weights and scratch buffers and have a KV cache each, or cells of one
shared cache (``seq_id``; ``Engine.new_sequences``), so their evaluations and
generations can interleave; a sequence with a ``driver``
(:class:`~cooktop.engine.batch.BatchDriver`) has its evaluations batched with the
other sequences of its cache. A sequence has one writer at a
time: :attr:`Sequence.version` changes with every evaluation or truncation, so
a suspended generation notices that someone else moved its sequence.

The sequence holds the model, never the reverse, and takes no callbacks: there
is no reference cycle, so dropping the last reference frees its cache at once.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import ContextOverflowError, CooktopError
from ..model.placed import CacheTokens, PlacedModel, lora_key
from ..text.tokenizer import InvalidTokenError

log = logging.getLogger(__name__)


class Sequence:
    """A KV cache of ``model`` plus what was evaluated into it.

    Args:
        model: the loaded model (not closed).
        keep_scores: record the logits of every evaluated position in :attr:`scores`
            (llama-cpp-python's ``Llama.scores``).
    Attributes:
        model, cache (a :class:`~cooktop.model.placed.CacheTokens`: ``model.forward.KVCache``, or a
        cluster's), version (bumped by every eval and truncation).
    Raises:
        CooktopError: the model is closed. DeviceOutOfMemoryError: the cache does not fit.
    """

    def __init__(self, model: PlacedModel, keep_scores: bool = False, cache: CacheTokens | None = None,
                 seq_id: int = 0):
        self.model = model
        self._owns_cache = cache is None
        self.cache: CacheTokens = model.new_cache() if cache is None else cache
        self.seq_id = seq_id
        self.version = 0
        #: (version, float32 [n_vocab]) the logits after the last image row evaluated, while nothing
        #: has changed the context since: a prompt ending with an image starts generating from them
        #: (mtmd's rule), since its placeholder ids cannot be evaluated again as tokens
        self._image_logits: tuple[int, np.ndarray] | None = None
        #: a :class:`~cooktop.engine.batch.BatchDriver` that runs this sequence's evaluations in
        #: batches with the other sequences of its cache (None: evaluated alone, at once)
        self.driver = None
        #: the LoRA adapter scales this sequence's evaluations use (``model/lora.py``; one per adapter):
        #: set on the model before each of its passes (a batch driver groups sequences by them);
        #: None: whatever the model's are
        self.lora: list[float] | None = None
        self._scores = np.zeros((0, model.cfg.n_vocab), dtype=np.float32) if keep_scores else None

    @property
    def tokens(self) -> list[int]:
        """Ids whose K/V are in the cache (the context), len <= n_ctx. Do not modify."""
        return self.cache.seq_tokens[self.seq_id]

    @property
    def n_past(self) -> int:
        """Tokens in the context."""
        return len(self.cache.seq_tokens[self.seq_id])

    @property
    def scores(self) -> np.ndarray | None:
        """float32 [capacity >= n_past, n_vocab]: row i holds the logits after position i
        (zero where none were computed, and past ``n_past``); None without ``keep_scores``."""
        return self._scores

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of the context (rows past them are forgotten)."""
        self.version += 1
        self.cache.truncate(n, self.seq_id)
        if self._scores is not None:
            self._scores[max(n, 0):] = 0.0

    def rollback(self, n: int) -> None:
        """Keep the first ``n`` tokens of the context on any cache: :meth:`truncate` where the cache can
        cut there; a recurrent state (which cannot, ``CacheTokens.reusable_prefix``) goes back to its
        latest checkpoint at or before ``n`` (or to 0) and the tokens after it are evaluated again.
        Speculative decoding rolls back rejected draft tokens with it (llama.cpp keeps per-token state
        snapshots instead, ``n_rs_seq``; this costs one forward of the accepted tokens on a rejection).

        Raises:
            CooktopError: the model is closed.
        """
        keep = self.cache.reusable_prefix(n, self.seq_id) if 0 < n < self.n_past else n
        if keep >= n:
            self.truncate(n)
            return
        replay = list(self.tokens[keep:n])
        self.truncate(keep)
        self.eval(replay)

    def reset(self) -> None:
        """Forget the context (the cache rows are overwritten by the next eval)."""
        self.truncate(0)

    def eval(self, tokens: list[int], logits_all: bool = False) -> np.ndarray:
        """Append ``tokens`` to the context, evaluating them in ``n_batch`` chunks.

        Returns:
            float32 [len(tokens), n_vocab] when ``logits_all`` (the model must be
            loaded with logits_all), else float32 [1, n_vocab] of the last token.
        Raises:
            ContextOverflowError: the context would exceed ``n_ctx``.
            InvalidTokenError: no tokens, or a token id out of range.
            CooktopError: the model is closed.
        """
        model = self.model
        tokens = [int(t) for t in tokens]
        self.version += 1
        if not tokens:
            raise InvalidTokenError("eval needs at least one token")
        n_past = self.n_past
        if n_past + len(tokens) > model.n_ctx:
            raise ContextOverflowError(
                f"{n_past + len(tokens)} tokens do not fit in the context of n_ctx = {model.n_ctx} "
                f"tokens ({n_past} already in it); raise n_ctx (-c) or shorten the prompt",
                n_past + len(tokens), model.n_ctx)
        n_vocab = model.cfg.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise InvalidTokenError(f"token id {bad[0]} is out of range 0..{n_vocab - 1}")
        if self.driver is not None and (not logits_all or len(tokens) <= model.n_batch):
            # batched with the other sequences of the cache (a speculative draft's rows too)
            pos = self.n_past
            out = self.driver.eval(self, tokens, all_rows=logits_all)
            self._record(pos if logits_all else self.n_past - 1, out)
            return out
        outs = []
        for i in range(0, len(tokens), model.n_batch):
            chunk = tokens[i:i + model.n_batch]
            pos = self.n_past
            model.use_lora(self.lora)
            out = model.forward(np.array(chunk), pos, self.cache, logits_all, seq_id=self.seq_id)
            self._record(pos if logits_all else self.n_past - 1, out)
            outs.append(out)
        return np.concatenate(outs) if logits_all else outs[-1]

    def eval_embd(self, embd: np.ndarray, ids: list[int], non_causal: bool = False) -> np.ndarray:
        """Append input embeddings (an image's, ``cooktop.vision``) to the context, in ``n_batch``
        chunks, each chunk non-causal when asked (llama.cpp mtmd ``mtmd_helper_decode_image_chunk``:
        ``llama_set_causal_attn(false)`` per image batch).

        Args:
            embd: float32 [n, n_embd].
            ids: n placeholder ids the context records for these positions (negative: no text token
                matches them, so a prompt's cached prefix never reaches into another image).
        Returns:
            float32 [1, n_vocab]: the logits after the last row.
        Raises:
            ContextOverflowError: the context would exceed ``n_ctx``.
            CooktopError: the model is closed; ValueError: ``embd`` of the wrong shape.
        """
        model = self.model
        n = len(embd)
        if len(ids) != n or n == 0:
            raise ValueError(f"eval_embd: {n} embeddings need as many ids, not {len(ids)}")
        self.version += 1
        if self.n_past + n > model.n_ctx:
            raise ContextOverflowError(
                f"{self.n_past + n} positions do not fit in the context of n_ctx = {model.n_ctx} "
                f"({self.n_past} already in it, {n} for the image); raise n_ctx (-c) or shorten the prompt")
        if non_causal and n > model.n_batch:
            log.warning("an image of %d positions in batches of n_batch = %d: its rows attend to each other "
                        "within a batch only (as llama.cpp's mtmd helper splits it); raise n_batch (-b) to %d "
                        "for the model's own attention over the whole image", n, model.n_batch, n)
        out = None
        for i in range(0, n, model.n_batch):
            pos = self.n_past
            model.use_lora(self.lora)
            out = model.forward(np.array(ids[i:i + model.n_batch]), pos, self.cache, False, seq_id=self.seq_id,
                                embd=embd[i:i + model.n_batch], non_causal=non_causal)
            self._record(self.n_past - 1, out)
        assert out is not None
        self._image_logits = (self.version, out[-1].copy())
        return out

    def hidden_states(self, tokens: list[int]) -> np.ndarray:
        """Make the context ``tokens`` (from position 0) and return their output-normed hidden states.

        What llama.cpp pools into embeddings (``result_norm``); no logits are computed.

        Returns:
            float32 [len(tokens), n_embd].
        Raises:
            as :meth:`eval`.
        """
        model = self.model
        tokens = [int(t) for t in tokens]
        self.truncate(0)
        if not tokens:
            raise InvalidTokenError("an embedding needs at least one token")
        if len(tokens) > model.n_ctx:
            raise ContextOverflowError(f"{len(tokens)} tokens do not fit in the context of n_ctx = {model.n_ctx} "
                                       "tokens; raise n_ctx (-c) or shorten the input", len(tokens), model.n_ctx)
        n_vocab = model.cfg.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise InvalidTokenError(f"token id {bad[0]} is out of range 0..{n_vocab - 1}")
        outs = [model.forward(np.array(tokens[i:i + model.n_batch]), i, self.cache, embeddings=True,
                              seq_id=self.seq_id)
                for i in range(0, len(tokens), model.n_batch)]
        self.version += 1
        return np.concatenate(outs)

    def common_prefix(self, prompt: list[int], lora: list[float] | None = None) -> int:
        """Tokens of ``prompt`` that :meth:`prefill` would reuse from the cache (at most len - 1): the
        common prefix, or with recurrent layers the longest part of it their states can go back to
        (``CacheTokens.reusable_prefix``: the whole context, a checkpoint, or 0); 0 when the cached
        tokens were evaluated under other LoRA scales than ``lora`` (default :attr:`lora`, else the
        model's), as llama-server clears a slot's cache when its LoRA changes."""
        scales = lora if lora is not None else self.lora if self.lora is not None else self.model.lora_scales()
        if self.cache.lora_of(self.seq_id) != lora_key(scales):
            return 0
        return self.cache.reusable_prefix(self._shared_prefix(prompt), self.seq_id)

    def copy_prefix(self, src: Sequence, n: int) -> bool:
        """Make this sequence's context the first ``n`` tokens of ``src``, a sequence of the same
        shared cache, by copying their K/V cells (:meth:`PlacedModel.copy_prefix
        <cooktop.model.placed.PlacedModel.copy_prefix>`) instead of evaluating them; ``src`` is
        unchanged and must not be evaluated meanwhile. Kept logits (``keep_scores``) of those
        positions are ``src``'s when it keeps them too, else zero.

        Returns:
            True when copied; False when the devices cannot (this sequence is then empty).
        Raises:
            CooktopError: ``src`` is of another cache, or closed. ValueError: ``src`` is this
            sequence, or ``n`` is outside ``0 .. src.n_past``.
        """
        if src.cache is not self.cache:
            raise CooktopError("copy_prefix: the sequences do not share one KV cache (Engine.new_sequences)")
        if src is self or src.seq_id == self.seq_id:
            raise ValueError("copy_prefix: the source and the destination are one sequence")
        if not 0 <= n <= src.n_past:
            raise ValueError(f"copy_prefix: {n} tokens asked of a sequence holding {src.n_past}")
        self.truncate(0)
        ok = self.model.copy_prefix(self.cache, src.seq_id, self.seq_id, n)
        if ok and self._scores is not None and src._scores is not None and n:
            self._record(0, src._scores[:n])
        return ok

    def prefill(self, prompt: list[int]) -> tuple[np.ndarray, int]:
        """Make the context ``prompt``, reusing the longest common prefix with what is cached
        (as llama-cpp-python does) and re-evaluating at least the last token. With recurrent layers
        (``cache.keeps_checkpoints``) the prefix is the longest their states can go back to (logged
        when shorter than the shared one), and a checkpoint is taken before the last token, so the
        same prompt again (a regenerated answer) reuses all but that token, as llama-server's context
        checkpoints do.

        A prompt that ends with an image (a placeholder id, :meth:`eval_embd`) must be the context
        already, its image evaluated last: its logits are those after the image's last row (as
        mtmd samples after a prompt ending with an image), 0 tokens evaluated.

        Returns:
            (float32 [n_vocab] logits of its last token, number of tokens evaluated)
        Raises:
            as :meth:`eval`; CooktopError: a prompt ending with an image that is not the context just
            evaluated.
        """
        if prompt and prompt[-1] < 0:
            if (self._image_logits is not None and self._image_logits[0] == self.version
                    and list(self.tokens) == list(prompt)):
                return self._image_logits[1], 0
            raise CooktopError("a prompt that ends with an image needs that image evaluated just before "
                               "(Sequence.eval_embd): its logits are gone; put text after the image")
        common = self.common_prefix(prompt)
        if self.cache.keeps_checkpoints:
            shared = self._shared_prefix(prompt)
            if common < shared:
                log.info("sequence %d: %d cached tokens match the prompt but its recurrent state can go back "
                         "only to %d of them (a checkpoint, or 0): evaluating from there", self.seq_id, shared,
                         common)
            self.truncate(common)
            if common < len(prompt) - 1:  # a checkpoint before the last token, for the next prompt to reuse
                self.eval(prompt[common:-1])
            self.cache.checkpoint(self.seq_id)
            return self.eval(prompt[-1:])[-1], len(prompt) - common
        self.truncate(common)
        return self.eval(prompt[common:])[-1], len(prompt) - common

    def _shared_prefix(self, prompt: list[int]) -> int:
        """Leading tokens the context and ``prompt`` share, at most ``len(prompt) - 1``."""
        common = 0
        for a, b in zip(self.tokens, prompt):
            if a != b:
                break
            common += 1
        return max(min(common, len(prompt) - 1), 0)

    def _record(self, pos: int, rows: np.ndarray) -> None:
        """Keep ``rows`` as the logits of positions ``pos .. pos + len(rows) - 1`` (keep_scores only)."""
        if self._scores is None:
            return
        end = pos + len(rows)
        if self._scores.shape[0] < end:
            grown = np.zeros((max(end, 2 * self._scores.shape[0]), self._scores.shape[1]), dtype=np.float32)
            grown[: self._scores.shape[0]] = self._scores
            self._scores = grown
        self._scores[pos:end] = rows

    def close(self) -> None:
        """Give the cache's device buffers back when this sequence owns its cache (idempotent;
        also done when collected); a sequence of a shared cache forgets its context."""
        if self._owns_cache:
            self.cache.close()
        elif not self.cache.closed:
            self.cache.truncate(0, self.seq_id)
