"""Token sampling: logits -> probabilities -> one token id.

The chain follows llama.cpp's default sampler order (common/sampling.cpp,
``common_sampler_init``): logits processors (llama-cpp-python's
``logits_processor``), logit bias, a grammar constraint (when one is given),
the penalties over the last ``repeat_last_n`` tokens, then greedy when
``temperature <= 0``; otherwise top-k, typical, top-p, min-p, temperature,
and a draw from the remaining distribution with the sampler's own RNG.

Penalties (llama.cpp ``llama_sampler_penalties``): for each distinct token
among the last N, seen ``c`` times, a positive logit is divided by
``repeat_penalty`` and a negative one multiplied by it, then
``c * frequency_penalty + (c > 0) * presence_penalty`` is subtracted.

Typical sampling (llama.cpp ``llama_sampler_typical``, Meister et al. 2022):
candidates sorted by ``|-log p - H|`` (H the entropy) are kept until their
cumulative probability reaches ``typical_p``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import CooktopError


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampler settings (llama.cpp names and defaults).

    temperature <= 0 means greedy. top_k <= 0 disables top-k; top_p >= 1,
    typical_p >= 1 and min_p <= 0 disable theirs; repeat_penalty == 1 and
    presence/frequency_penalty == 0 disable the penalties (llama.cpp
    ``penalty_repeat``, ``penalty_present``, ``penalty_freq``; window
    ``repeat_last_n``: 0 off, -1 the whole history).
    logit_bias: token id -> value added to its logit (OpenAI ``logit_bias``;
    a dict is accepted and stored as sorted pairs).
    seed: -1 (or None) draws a random seed; any other value is reproducible.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = -1
    typical_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        """Validate ranges (llama.cpp's meaningful values).

        Raises:
            CooktopError: a value is not finite, top_p, typical_p or min_p outside
                [0, 1], repeat_penalty <= 0, a seed outside uint32 (other than -1/None),
                or a logit_bias key that is not a token id or value that is not a number, or
                repeat_last_n below -1 (llama.cpp: -1 is the context size, 0 off).
        """
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "typical_p", "presence_penalty",
                     "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise CooktopError(f"{name} must be a finite number, got {v!r}")
        if isinstance(self.repeat_last_n, bool) or not isinstance(self.repeat_last_n, int) or self.repeat_last_n < -1:
            raise CooktopError(f"repeat_last_n (--repeat-last-n) must be -1 (the context size), 0 (off) or a "
                               f"positive count of tokens, got {self.repeat_last_n!r}")
        if not 0.0 <= self.typical_p <= 1.0:
            raise CooktopError(f"typical_p (--typical) must be in [0, 1], got {self.typical_p}")
        object.__setattr__(self, "logit_bias", bias_pairs(self.logit_bias))
        if not 0.0 <= self.top_p <= 1.0:
            raise CooktopError(f"top_p (--top-p) must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise CooktopError(f"min_p (--min-p) must be in [0, 1], got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise CooktopError(f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}")
        if self.seed is not None and self.seed != -1 and not 0 <= self.seed < 2**32:
            raise CooktopError(f"seed must be -1 (random) or in 0..{2**32 - 1}, got {self.seed}")


def bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """``{id: bias}`` (keys may be digit strings, as OpenAI sends them) -> sorted ``((id, bias), ...)``.

    Pairs are accepted too (returned sorted); empty or None gives ``()``.

    Raises:
        CooktopError: a key that is not a token id, or a value that is not a number (or -inf).
    """
    if not bias:
        return ()
    items = bias.items() if isinstance(bias, Mapping) else bias
    out: dict[int, float] = {}
    try:
        for k, v in items:
            if isinstance(k, bool) or isinstance(v, bool):
                raise ValueError
            tid, val = int(k), float(v)
            if not math.isfinite(val) and val != -math.inf:
                raise ValueError
            out[tid] = val
    except (TypeError, ValueError):
        raise CooktopError(f"logit_bias must map token ids to numbers, e.g. {{\"15043\": -100}}; "
                           f"got {bias!r}") from None
    return tuple(sorted(out.items()))


class Constraint(Protocol):
    """A grammar constraint the sampler consults (``cooktop.engine.grammar``).

    ``allowed(n_vocab)`` returns a bool mask [n_vocab] of the tokens that keep the
    output valid; ``accept(token)`` advances the constraint past the sampled token.
    """

    def allowed(self, n_vocab: int) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...


#: llama-cpp-python's logits processor: ``(input_ids int [n], scores float32 [n_vocab]) -> scores``.
LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Sampler:
    """Stateful sampler: holds the RNG seeded from ``params.seed``.

    The draw is llama.cpp's (src/llama-sampler.cpp ``llama_sampler_dist_apply``), so a seed gives
    llama.cpp's tokens: a ``std::mt19937`` seeded with the seed (numpy's MT19937 with its legacy
    ``init_genrand`` seeding, the same sequence), one ``uniform_real_distribution<double>`` number per
    sampled token (libstdc++'s ``generate_canonical``: two 32-bit outputs, ``(a + b * 2**32) / 2**64``),
    and the first candidate whose running sum of ``expf(logit / temp - max)`` (float32 terms, a double
    sum) reaches that fraction of the total, the candidates in llama.cpp's order: best first once top-k,
    typical or top-p has sorted them, else by token id (its top-k with ``k <= 0`` and min-p keep the
    vocabulary's order).

    Args:
        params: the settings.
        processors: logits processors applied first, in order (llama-cpp-python's
            ``logits_processor``); each gets the history and the logits and returns logits.
        constraint: a grammar (:class:`Constraint`); tokens it disallows get -inf.

    Attributes:
        last_candidates: the distribution the last :meth:`sample` drew from, after the whole chain
            (ids int64 [m], probabilities float64 [m] summing to 1, best first), as llama.cpp's
            ``common_sampler_get_candidates`` after sampling (common/sampling.cpp): with
            ``temperature <= 0`` only the chosen token, probability 1 (llama.cpp's temperature
            sampler leaves the others at -inf, so their probability is 0). None before the first.
    """

    def __init__(self, params: SamplingParams, processors: Sequence[LogitsProcessor] = (),
                 constraint: Constraint | None = None):
        self.params = params
        self.processors = list(processors)
        self.constraint = constraint
        seed = params.seed
        if seed is None or seed < 0:
            entropy = np.random.SeedSequence().entropy  # an int when drawn from the OS (no argument)
            assert isinstance(entropy, int)
            seed = entropy % (2**32)
        self.seed = int(seed)
        self._mt = np.random.RandomState(self.seed)._bit_generator  # std::mt19937(seed)
        self._bias_ids = np.array([i for i, _ in params.logit_bias], dtype=np.int64)
        self._bias_vals = np.array([b for _, b in params.logit_bias], dtype=np.float32)
        self.last_candidates: tuple[np.ndarray, np.ndarray] | None = None

    def apply_penalty(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """Return logits (float32 [n_vocab], a copy) with the repeat, frequency and presence penalties applied."""
        p = self.params
        logits = np.array(logits, dtype=np.float32, copy=True)
        active = p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        if active and p.repeat_last_n != 0 and len(history):
            last = history[-p.repeat_last_n:] if p.repeat_last_n > 0 else history
            ids, counts = np.unique(np.asarray(last, dtype=np.int64), return_counts=True)
            keep = (ids >= 0) & (ids < len(logits))
            ids, counts = ids[keep], counts[keep]
            v = logits[ids]
            if p.repeat_penalty != 1.0:
                v = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
            logits[ids] = v - counts * np.float32(p.frequency_penalty) - np.float32(p.presence_penalty)
        return logits

    def prepare(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """Every step before the draw's filters: processors, logit bias, grammar mask, penalties.

        Args:
            logits: float32 [n_vocab] of the last position (not modified).
            history: token ids so far (prompt and generated).
        Returns:
            float32 [n_vocab], a new array.
        Raises:
            CooktopError: the model's logits hold a NaN (at position ``len(history) - 1``), a
                processor returned logits of another shape, or the grammar allows no token at all.
        """
        if np.isnan(logits).any():  # max() and softmax would hide it: every draw a -inf "ban"
            raise CooktopError(f"the model produced NaN logits at position {len(history) - 1} "
                               "(weights or activations not finite)")
        out = np.array(logits, dtype=np.float32, copy=True)
        if self.processors:
            ids = np.asarray(history, dtype=np.intc)
            for proc in self.processors:
                new = np.asarray(proc(ids, out), dtype=np.float32)
                if new.shape != out.shape:
                    raise CooktopError(f"logits processor {proc!r} returned shape {new.shape}, "
                                       f"expected {out.shape}")
                out = np.array(new, dtype=np.float32, copy=True)
        if len(self._bias_ids):
            ok = (self._bias_ids >= 0) & (self._bias_ids < len(out))
            out[self._bias_ids[ok]] += self._bias_vals[ok]
        if self.constraint is not None:
            allowed = self.constraint.allowed(len(out))
            if not allowed.any():
                raise CooktopError("the grammar allows no token here (the grammar and the model's vocabulary "
                                   "disagree); check the grammar")
            out[~allowed] = -np.inf
        return self.apply_penalty(out, history)

    def probabilities(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidates after top-k/top-p/min-p/temperature.

        Args:
            logits: float32 [n_vocab] (penalty already applied).
        Returns:
            (token ids int64 [m], probabilities float64 [m] summing to 1), best first.
        """
        p = self.params
        finite = np.isfinite(logits)
        pool = np.arange(len(logits)) if finite.all() else np.flatnonzero(finite)  # -inf: banned
        if len(pool) == 0:
            raise CooktopError("every token has a logit of -inf (logit_bias or the grammar banned them all)")
        n = len(pool)
        k = n if p.top_k <= 0 else min(p.top_k, n)
        if k < n:
            ids = pool[np.argpartition(-logits[pool], k - 1)[:k]]
        else:
            ids = pool
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        lg = logits[ids].astype(np.float64)
        # typical, top-p and min-p on the distribution at temperature 1 (llama.cpp applies temp last)
        probs = np.exp(lg - lg[0])
        probs /= probs.sum()
        if p.typical_p < 1.0:
            keep = _typical(probs, p.typical_p)
            ids, lg = ids[keep], lg[keep]
            probs = np.exp(lg - lg[0])
            probs /= probs.sum()
        if p.top_p < 1.0:
            cum = np.cumsum(probs)
            n_keep = int(np.searchsorted(cum, p.top_p) + 1)
            ids, lg, probs = ids[:n_keep], lg[:n_keep], probs[:n_keep]
        if p.min_p > 0.0:
            kept = probs >= p.min_p * probs[0]
            kept[0] = True  # min_keep = 1 (llama.cpp), even for min_p > 1
            ids, lg = ids[kept], lg[kept]
        weights = self._weights(lg)
        return ids, weights.astype(np.float64) / weights.sum(dtype=np.float64)

    def _weights(self, lg: np.ndarray) -> np.ndarray:
        """llama.cpp's unnormalised probabilities of the kept candidates (best first): float32
        ``expf(logit / temp - max)`` after its temperature sampler's float32 division."""
        scaled = lg.astype(np.float32) / np.float32(self.params.temperature)
        return np.exp(scaled - scaled[0])

    def _uniform(self) -> float:
        """One ``std::uniform_real_distribution<double>(0, 1)`` draw from the mt19937 (libstdc++)."""
        a, b = (int(v) for v in self._mt.random_raw(2))
        r = (a + b * 4294967296.0) / 18446744073709551616.0
        return r if r < 1.0 else math.nextafter(1.0, 0.0)

    def _draw(self, probs: np.ndarray) -> int:
        """The index (into the candidates, best first) llama.cpp's dist sampler picks: the first whose
        running sum reaches ``total * uniform``; one uniform drawn even for a single candidate."""
        rnd = self._uniform()
        cum = np.cumsum(probs, dtype=np.float64)
        return min(int(np.searchsorted(cum, cum[-1] * rnd, side="left")), len(probs) - 1)

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        """Pick the next token.

        Args:
            logits: float32 [n_vocab] of the last position.
            history: token ids so far (for the penalties and the processors).
        Returns:
            the chosen token id (the grammar constraint, if any, has accepted it).
        Raises:
            CooktopError: see :meth:`prepare`.
        """
        logits = self.prepare(logits, history)
        if self.params.temperature <= 0:
            tok = int(np.argmax(logits))
            if not np.isfinite(logits[tok]):
                raise CooktopError("every token has a logit of -inf (logit_bias or the grammar banned them all)")
            self.last_candidates = (np.array([tok], dtype=np.int64), np.ones(1))
        else:
            ids, probs = self.probabilities(logits)
            p = self.params
            if p.top_k > 0 or p.typical_p < 1.0 or p.top_p < 1.0:  # llama.cpp has sorted them
                tok = int(ids[self._draw(probs)])
            else:  # in the vocabulary's order
                order = np.argsort(ids, kind="stable")
                tok = int(ids[order[self._draw(probs[order])]])
            self.last_candidates = (ids, probs)
        if self.constraint is not None:
            self.constraint.accept(tok)
        return tok


def _typical(probs: np.ndarray, typical_p: float) -> np.ndarray:
    """Indices (into ``probs``, best first) kept by locally typical sampling, in their original order.

    llama.cpp ``llama_sampler_typical_apply``: sort by ``|-log p - H|``, keep the
    shortest prefix whose cumulative probability exceeds ``typical_p`` (at least one).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(probs)
        ent = -np.nansum(np.where(probs > 0, probs * logp, 0.0))
        shifted = np.abs(-logp - ent)
    order = np.argsort(shifted, kind="stable")
    cum = np.cumsum(probs[order])
    last = int(np.searchsorted(cum, typical_p, side="right")) + 1
    return np.sort(order[:max(1, min(last, len(order)))])
