"""Token sampling: logits -> probabilities -> one token id.

The chain follows llama.cpp's default sampler order (common/sampling.cpp):
repeat penalty over the last ``repeat_last_n`` tokens, then greedy when
``temperature <= 0``; otherwise top-k, top-p, min-p, temperature, and a draw
from the remaining distribution with the sampler's own RNG.

Repeat penalty (llama.cpp ``llama_sampler_penalties``): for each distinct
token among the last N, a positive logit is divided by the penalty and a
negative one multiplied by it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import CooktopError


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampler settings (llama.cpp names and defaults).

    temperature <= 0 means greedy. top_k <= 0 disables top-k; top_p >= 1 and
    min_p <= 0 disable theirs; repeat_penalty == 1 disables the penalty.
    seed: -1 (or None) draws a random seed; any other value is reproducible.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = -1

    def __post_init__(self) -> None:
        """Validate ranges (llama.cpp's meaningful values).

        Raises:
            CooktopError: a value is not finite, top_p outside [0, 1], min_p outside
                [0, 1], repeat_penalty <= 0, or a seed outside uint32 (other than -1/None).
        """
        for name in ("temperature", "top_p", "min_p", "repeat_penalty"):
            v = getattr(self, name)
            if not math.isfinite(v):
                raise CooktopError(f"{name} must be a finite number, got {v}")
        if not 0.0 <= self.top_p <= 1.0:
            raise CooktopError(f"top_p (--top-p) must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise CooktopError(f"min_p (--min-p) must be in [0, 1], got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise CooktopError(f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}")
        if self.seed is not None and self.seed != -1 and not 0 <= self.seed < 2**32:
            raise CooktopError(f"seed must be -1 (random) or in 0..{2**32 - 1}, got {self.seed}")


class Sampler:
    """Stateful sampler: holds the RNG seeded from ``params.seed``."""

    def __init__(self, params: SamplingParams):
        self.params = params
        seed = params.seed
        if seed is None or seed < 0:
            seed = int(np.random.SeedSequence().entropy % (2**32))
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)

    def apply_penalty(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """Return logits (float32 [n_vocab], a copy) with the repeat penalty applied."""
        p = self.params
        logits = np.array(logits, dtype=np.float32, copy=True)
        if p.repeat_penalty != 1.0 and p.repeat_last_n != 0 and history:
            last = history[-p.repeat_last_n:] if p.repeat_last_n > 0 else history
            ids = np.unique(np.asarray(last, dtype=np.int64))
            ids = ids[(ids >= 0) & (ids < len(logits))]
            v = logits[ids]
            logits[ids] = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
        return logits

    def probabilities(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidates after top-k/top-p/min-p/temperature.

        Args:
            logits: float32 [n_vocab] (penalty already applied).
        Returns:
            (token ids int64 [m], probabilities float64 [m] summing to 1), best first.
        """
        p = self.params
        n = len(logits)
        k = n if p.top_k <= 0 else min(p.top_k, n)
        if k < n:
            ids = np.argpartition(-logits, k - 1)[:k]
        else:
            ids = np.arange(n)
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        lg = logits[ids].astype(np.float64)
        # top-p and min-p on the distribution at temperature 1 (llama.cpp applies temp last)
        probs = np.exp(lg - lg[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            cum = np.cumsum(probs)
            keep = int(np.searchsorted(cum, p.top_p) + 1)
            ids, lg, probs = ids[:keep], lg[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            keep[0] = True  # min_keep = 1 (llama.cpp), even for min_p > 1
            ids, lg = ids[keep], lg[keep]
        probs = np.exp((lg - lg[0]) / p.temperature)
        return ids, probs / probs.sum()

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        """Pick the next token.

        Args:
            logits: float32 [n_vocab] of the last position.
            history: token ids so far (for the repeat penalty).
        Returns:
            the chosen token id.
        """
        logits = self.apply_penalty(logits, history)
        if self.params.temperature <= 0:
            return int(np.argmax(logits))
        ids, probs = self.probabilities(logits)
        return int(ids[self.rng.choice(len(ids), p=probs)])
