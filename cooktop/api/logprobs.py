"""Log-probabilities for OpenAI's ``logprobs``: from the raw logits each token was sampled from.

llama-server and llama-cpp-python report ``log_softmax`` of the model's
logits (before sampling filters and penalties); so does cooktop.
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 [n_vocab] log-probabilities of raw logits float32 [n_vocab]."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def top_k(logprobs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely ``(id, logprob)`` pairs, best first (ties: lower id first)."""
    if k <= 0:
        return []
    k = min(k, len(logprobs))
    ids = np.argpartition(-logprobs, k - 1)[:k]
    ids = ids[np.lexsort((ids, -logprobs[ids]))]
    return [(int(i), float(logprobs[i])) for i in ids]
