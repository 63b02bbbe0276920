"""Speculative decoding: cheap drafts of the next tokens, verified by the target in one forward.

A *drafter* proposes up to ``n_max`` tokens that may follow the context (the prompt plus
the tokens generated so far, the one just sampled included); the generation loop
(:meth:`Engine.generate <cooktop.engine.generate.Engine.generate>` with ``draft=``)
evaluates the sampled token and the draft in one batched forward of the target
(logits of every row), then samples the target at each row in turn and keeps the
draft tokens while they equal what it sampled: llama.cpp's
``common_sampler_sample_and_accept_n`` (common/sampling.cpp), the rule of
llama-server and ``llama-speculative-simple``. The first mismatch is the target's
own token; the K/V of the draft tokens past it are dropped (the cache is truncated).
Each emitted token is drawn from the target's logits at its position with the
sampler's next random number, exactly as without speculation, so the output (greedy
or sampled with a seed) is the non-speculative one as long as the batched rows give
the logits of one-at-a-time decoding (tests/test_speculative.py): drafts change the
speed, never the distribution.

Drafters (any callable ``input_ids int [n] -> int [m]`` works, llama-cpp-python's
``LlamaDraftModel`` protocol):

- :class:`LlamaPromptLookupDecoding`: prompt lookup (llama-cpp-python
  ``llama_cpp.llama_speculative``; apoorvumang/prompt-lookup-decoding): the longest
  suffix n-gram (``max_ngram_size`` .. 1) found earlier in the context, and the
  ``num_pred_tokens`` that followed its first occurrence.
- :class:`NgramSimple`: llama.cpp's ``--spec-type ngram-simple``
  (common/ngram-map.cpp ``common_ngram_simple_draft``): the last ``size_n`` tokens
  searched backwards in the context, the ``size_m`` that followed the latest match.
- :class:`MTPDraft`: the target's own multi-token-prediction block (llama.cpp ``--spec-type
  draft-mtp``; Qwen3.5 / Qwen3.6 files with ``nextn_predict_layers`` = 1, :mod:`cooktop.model.mtp`),
  fed the target's final hidden states and chaining its own.
- :class:`DraftModel`: a smaller model of the same vocabulary (``-md``); it drafts
  greedily on a sequence of its own (reusing its cached prefix) and stops at a token
  whose draft probability (top-10, temperature 1) is below ``p_min``
  (common/speculative.cpp ``draft-simple``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import CooktopError

#: A drafter: ``(input_ids int [n]) -> int [m]`` proposed continuation (may be empty).
DraftFn = Callable[..., Any]


class LlamaDraftModel:
    """llama-cpp-python's draft-model interface: ``__call__(input_ids) -> draft ids``.

    Subclasses return int [m] (np.intc) tokens proposed after ``input_ids`` int [n].
    """

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        raise NotImplementedError


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Prompt-lookup drafting (llama-cpp-python ``LlamaPromptLookupDecoding``, same arguments).

    Args:
        max_ngram_size: the longest suffix n-gram searched for (tried from it down to 1).
        num_pred_tokens: tokens proposed after the match.
    Raises:
        CooktopError: a size below 1.
    """

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        if max_ngram_size < 1 or num_pred_tokens < 1:
            raise CooktopError(f"LlamaPromptLookupDecoding needs max_ngram_size >= 1 and num_pred_tokens >= 1, "
                               f"got {max_ngram_size} and {num_pred_tokens}")
        self.max_ngram_size = int(max_ngram_size)
        self.num_pred_tokens = int(num_pred_tokens)

    @staticmethod
    def find_candidate_pred_tokens(input_ids: np.ndarray, max_ngram_size: int, num_pred_tokens: int) -> np.ndarray:
        """The tokens after the first earlier occurrence of the longest matching suffix n-gram.

        Args:
            input_ids: int [n] the context. Returns: np.intc [<= num_pred_tokens] (empty: no match).
        """
        ids = np.asarray(input_ids, dtype=np.intc)
        n = ids.shape[0]
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ids, (size,))
            for idx in np.flatnonzero(np.all(windows == ids[-size:], axis=1)):
                start = int(idx) + size
                end = min(start + num_pred_tokens, n)
                if start < end:
                    return ids[start:end]
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)


class NgramSimple(LlamaDraftModel):
    """llama.cpp's ``ngram-simple`` drafter (``--spec-ngram-simple-size-n/-size-m``, defaults 12 / 48).

    Args:
        size_n: length of the n-gram looked up (the context's last tokens).
        size_m: most tokens proposed (the m-gram after the latest earlier match).
    Raises:
        CooktopError: a size below 1.
    """

    def __init__(self, size_n: int = 12, size_m: int = 48):
        if size_n < 1 or size_m < 1:
            raise CooktopError(f"ngram-simple needs size n >= 1 and size m >= 1, got {size_n} and {size_m}")
        self.size_n, self.size_m = int(size_n), int(size_m)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        """np.intc [<= size_m] drafted after ``input_ids`` int [n] (its last id is the sampled token)."""
        ids = np.asarray(input_ids, dtype=np.intc)
        n, sn, sm = len(ids) - 1, self.size_n, self.size_m  # llama.cpp: tokens before the sampled one
        if n <= sn + sm + 1:
            return np.array([], dtype=np.intc)
        pattern = ids[n - sn + 1:n + 1]
        for j in range(n - sn - 1, 0, -1):  # backwards; position 0 means no match, as llama.cpp
            if np.array_equal(ids[j:j + sn], pattern):
                copy = min(sm, n - (j + sn))
                return ids[j + sn:j + sn + copy] if copy >= sn else np.array([], dtype=np.intc)
        return np.array([], dtype=np.intc)


class DraftModel(LlamaDraftModel):
    """Drafts with a smaller model of the same vocabulary (llama.cpp ``-md`` / ``draft-simple``).

    Args:
        engine: the draft :class:`~cooktop.engine.generate.Engine` (owned by the caller).
        n_max: most tokens drafted per step; p_min: stop drafting at a token whose
            probability (top-10 of the draft's logits, temperature 1) is below it.
        vocab_of: the target engine, to check the vocabularies agree.
    Raises:
        CooktopError: the draft's vocabulary differs from the target's (size, or the text of a token).
    """

    def __init__(self, engine: Any, n_max: int = 16, p_min: float = 0.0, vocab_of: Any | None = None):
        self.engine, self.n_max, self.p_min = engine, int(n_max), float(p_min)
        if vocab_of is not None:
            check_vocab(vocab_of, engine)
        self.seq = engine.new_sequence()

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        """Up to ``n_max`` (or ``kwargs['n_max']``) greedy draft tokens after ``input_ids`` int [n]."""
        n_max = min(int(kwargs.get("n_max", self.n_max)), self.n_max)
        ctx = [int(t) for t in input_ids]
        room = self.engine.n_ctx - len(ctx)
        n_max = min(n_max, room)
        if n_max <= 0 or not ctx:
            return np.array([], dtype=np.intc)
        logits, _ = self.seq.prefill(ctx)
        out: list[int] = []
        while True:
            lg = np.asarray(logits, dtype=np.float64)
            tok = int(np.argmax(lg))
            top = np.sort(lg)[-10:]
            p = 1.0 / float(np.exp(top - lg[tok]).sum())
            if p < self.p_min:
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            logits = self.seq.eval([tok])[-1]
        return np.array(out, dtype=np.intc)

    def fork(self) -> DraftModel:
        """Another drafter on the same engine with a sequence of its own (one per server slot)."""
        return DraftModel(self.engine, self.n_max, self.p_min)

    def close(self) -> None:
        """Free the draft sequence's cache (the engine stays the caller's)."""
        self.seq.close()


class MTPDraft(LlamaDraftModel):
    """Drafts with the model's own multi-token-prediction block (llama.cpp ``--spec-type draft-mtp``,
    common/speculative.cpp ``common_speculative_impl_draft_mtp``; the block: :mod:`cooktop.model.mtp`).

    MTP position ``p`` holds the pair ``(h_{p-1}, x_p)``: the target's output-normed hidden state
    after position ``p - 1`` (zeros for ``p = 0``) and the token at ``p``. Each call first brings the
    block's own KV cache in step with the target: the positions since the last call that were not
    paired with the target's states (the prompt, the accepted tokens, the sampled one) are evaluated in
    one batch, from the target's rows (``cache.hidden``, recorded because this drafter sets the
    target model's ``record_hidden``); what a rejected draft left there is overwritten, the cache
    being cut back to the first position whose pair changed. Then it drafts greedily: the last
    pair's logits give ``d_1``; ``(h_mtp, d_1)`` at the next position, ``h_mtp`` the block's own
    normed output, gives ``d_2``, and so on, up to ``n_max`` tokens, stopping at a token whose
    probability (top-10 of the logits, temperature 1) is below ``p_min`` as ``draft-simple`` does.

    Args:
        mtp: the MTP block (:class:`~cooktop.model.mtp.MTPModel`, owned by the caller).
        target: the target's placed model (its ``record_hidden`` is set here).
        n_max: most tokens per draft; p_min: see above.
    """

    #: :meth:`Speculation.propose` passes the target's sequence (``seq=``): its hidden rows are read
    wants_sequence = True

    def __init__(self, mtp: Any, target: Any, n_max: int = 16, p_min: float = 0.0):
        self.mtp, self.target, self.n_max, self.p_min = mtp, target, int(n_max), float(p_min)
        target.record_hidden = True
        self.cache = mtp.new_cache()
        self._exact = 0  # leading MTP positions paired with the target's own hidden states

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        """np.intc [<= n_max] drafted after ``input_ids`` int [N + 1] (its last id sampled, not yet
        evaluated by the target). ``kwargs['seq']``: the target's sequence, holding ``input_ids[:N]``
        and their hidden rows; without it, or where the rows are missing (the sequence was evaluated
        before this drafter existed), nothing is drafted."""
        empty = np.array([], dtype=np.intc)
        seq = kwargs.get("seq")
        ids = [int(t) for t in input_ids]
        n = len(ids) - 1
        n_max = min(int(kwargs.get("n_max", self.n_max)), self.n_max, self.mtp.n_ctx - n)
        if seq is None or n_max <= 0 or n < 1 or seq.cache.hidden is None or seq.tokens != ids[:n]:
            return empty
        have = self.cache.seq_tokens[0]
        c = 0
        for a, b in zip(have[:min(self._exact, n)], ids):
            if a != b:
                break
            c += 1
        rows = seq.cache.hidden.get(seq.seq_id, max(c - 1, 0), n)
        if rows is None:
            return empty
        if c == 0:
            rows = np.concatenate([np.zeros((1, rows.shape[1]), dtype=np.float32), rows])
        toks = ids[c:n + 1]
        step = self.mtp.n_batch
        logits = None
        for i in range(0, len(toks), step):
            logits = self.mtp.forward_h(toks[i:i + step], rows[i:i + step], c + i, self.cache)
        self._exact = n + 1
        out: list[int] = []
        pos = n
        while logits is not None:
            lg = np.asarray(logits[-1], dtype=np.float64)
            tok = int(np.argmax(lg))
            top = np.sort(lg)[-10:]
            if 1.0 / float(np.exp(top - lg[tok]).sum()) < self.p_min:
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            h_own = self.cache.hidden.get(0, pos, pos + 1)
            pos += 1
            logits = self.mtp.forward_h([tok], h_own, pos, self.cache)
        return np.array(out, dtype=np.intc)

    def fork(self) -> MTPDraft:
        """Another drafter on the same block with a KV cache of its own (one per server slot)."""
        return MTPDraft(self.mtp, self.target, self.n_max, self.p_min)

    def close(self) -> None:
        """Free this drafter's MTP cache (the block stays the caller's)."""
        self.cache.close()


class LlamaMTPDecoding(MTPDraft):
    """``Llama(draft_model=LlamaMTPDecoding(num_pred_tokens=3))``: draft with the model file's own
    multi-token-prediction block (:class:`MTPDraft`; llama.cpp ``--spec-type draft-mtp``). The block
    is loaded on the model's head device when the ``Llama`` first generates (:meth:`bind`) and freed by
    ``Llama.close()``.

    Args:
        num_pred_tokens: most tokens per draft (``--draft-max``); p_min: ``--draft-p-min``.
    Raises:
        CooktopError: num_pred_tokens < 1 or p_min outside [0, 1]; (when bound) ``NoMTPError``: the
            file has no MTP block or its architecture none.
    """

    def __init__(self, num_pred_tokens: int = 3, p_min: float = 0.0):
        if num_pred_tokens < 1 or not 0.0 <= p_min <= 1.0:
            raise CooktopError(f"LlamaMTPDecoding needs num_pred_tokens >= 1 and p_min in [0, 1], got "
                               f"{num_pred_tokens} and {p_min}")
        self.n_max, self.p_min = int(num_pred_tokens), float(p_min)
        self.mtp: Any = None
        self.target: Any = None

    def bind(self, target: Any) -> None:
        """Load the MTP block of ``target`` (a placed model) unless already loaded for it.

        Raises:
            NoMTPError: see :class:`~cooktop.model.mtp.MTPModel`. CooktopError: bound to another model.
        """
        if self.mtp is not None:
            if self.target is not target:
                raise CooktopError("this LlamaMTPDecoding already drafts for another Llama: give each its own")
            return
        from ..model.mtp import MTPModel  # noqa: PLC0415 (the engine does not import the model's MTP block)
        mtp = MTPModel(target)
        MTPDraft.__init__(self, mtp, target, self.n_max, self.p_min)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        if self.mtp is None:
            raise CooktopError("LlamaMTPDecoding drafts only as Llama(draft_model=...): it reads the model's "
                               "MTP block and hidden states")
        return super().__call__(input_ids, **kwargs)

    def close(self) -> None:
        """Free the drafter's cache and the MTP block (idempotent)."""
        if self.mtp is not None:
            self.cache.close()
            self.mtp.close()


def _takes_kwargs(d: Any) -> bool:
    """True for the drafters that read :meth:`Speculation.propose`'s keywords (``n_max``, ``seq``)."""
    return isinstance(d, (DraftModel, FirstOf, MTPDraft))


class FirstOf(LlamaDraftModel):
    """Several drafters in order (llama.cpp's ``--spec-type a,b``): the first non-empty draft."""

    def __init__(self, drafters: list[Any]):
        self.drafters = list(drafters)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        for d in self.drafters:
            out = np.asarray(d(input_ids, **kwargs) if _takes_kwargs(d) else d(input_ids))
            if out.size:
                return out.astype(np.intc).reshape(-1)
        return np.array([], dtype=np.intc)

    def fork(self) -> FirstOf:
        """A copy whose stateful drafters (draft models) have sequences of their own."""
        return FirstOf([d.fork() if hasattr(d, "fork") else d for d in self.drafters])


def check_vocab(target: Any, draft: Any) -> None:
    """Raise unless two engines share a vocabulary (llama.cpp ``common_speculative_are_compatible``:
    same type and size, within 128 tokens' difference there; here: same size and same token texts).

    Raises:
        CooktopError: naming the first difference.
    """
    a, b = target.tokenizer, draft.tokenizer
    na, nb = target.cfg.n_vocab, draft.cfg.n_vocab
    if na != nb:
        raise CooktopError(f"the draft model's vocabulary has {nb} tokens, the target's {na}: speculative "
                           "decoding needs a draft model of the same vocabulary (-md)")
    for t in range(0, na, max(1, na // 64)):
        if a.token_to_piece(t, special=True) != b.token_to_piece(t, special=True):
            raise CooktopError(f"token {t} of the draft model differs from the target's: speculative "
                               "decoding needs a draft model of the same vocabulary (-md)")


@dataclasses.dataclass
class SpecStats:
    """What speculation did in one generation (llama.cpp ``n_drafted`` / ``n_accept``)."""

    n_drafted: int = 0
    n_accepted: int = 0
    n_steps: int = 0  # batched verifications

    @property
    def acceptance(self) -> float:
        """Accepted / drafted (0 when nothing was drafted)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0


@dataclasses.dataclass
class Speculation:
    """How a generation drafts: the drafter and llama.cpp's draft limits.

    Args:
        drafter: a callable ``(input_ids int [n]) -> int [m]`` (the classes above, or any
            llama-cpp-python ``LlamaDraftModel``).
        n_max: most draft tokens verified per step (``--spec-draft-n-max`` / ``--draft-max``);
            n_min: drafts shorter than this are not verified (``--draft-min``).
    Raises:
        CooktopError: n_max < 1 or n_min < 0.
    """

    drafter: DraftFn
    n_max: int = 16
    n_min: int = 0

    def __post_init__(self) -> None:
        if self.n_max < 1 or self.n_min < 0:
            raise CooktopError(f"draft sizes must be --draft-max >= 1 and --draft-min >= 0, got "
                               f"{self.n_max} and {self.n_min}")

    def propose(self, history: list[int], room: int, n_vocab: int, seq: Any = None) -> list[int]:
        """The draft to verify after ``history`` (its last token sampled, not yet evaluated):
        at most ``min(n_max, room)`` ids; empty when shorter than ``n_min``. ``seq``: the target's
        sequence (holding ``history[:-1]``), handed to drafters that read it (:class:`MTPDraft`).

        Raises:
            CooktopError: the drafter returned something that is not a list of token ids below ``n_vocab``.
        """
        k = min(self.n_max, room)
        if k <= 0:
            return []
        ids = np.asarray(history, dtype=np.intc)
        try:
            got = self.drafter(ids, n_max=k, seq=seq) if _takes_kwargs(self.drafter) else self.drafter(ids)
            out = np.asarray(got).reshape(-1)
            draft = [int(t) for t in out[:k]]
        except (TypeError, ValueError) as e:
            raise CooktopError(f"the draft model {self.drafter!r} did not return token ids: {e}") from None
        bad = [t for t in draft if not 0 <= t < n_vocab]
        if bad:
            raise CooktopError(f"the draft model {self.drafter!r} proposed token id {bad[0]}, outside "
                               f"the vocabulary 0..{n_vocab - 1}")
        return draft if len(draft) >= max(self.n_min, 1) else []

    def fork(self) -> Speculation:
        """The same speculation for another sequence (a server slot): stateful drafters (a draft
        model's sequence) are copied, stateless ones (n-gram lookups) shared."""
        d = self.drafter
        return dataclasses.replace(self, drafter=d.fork() if hasattr(d, "fork") else d)
