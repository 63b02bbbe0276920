"""Evaluate one sequence's tokens the three ways whose logits must agree: one batch, one token
at a time, and a cached prefix followed by the rest."""

from __future__ import annotations

from typing import Any

import numpy as np


def eval_three_ways(engine: Any, tokens: list[int], n_prefix: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logits of ``tokens`` from a fresh sequence of ``engine``, evaluated three ways.

    Args:
        engine: a loaded :class:`~cooktop.engine.generate.Engine`.
        tokens: the token ids, n of them.
        n_prefix: how many tokens are evaluated first as the cached prefix (0 < n_prefix < n).
    Returns:
        (batch float32 [n, n_vocab]: all tokens in one call; one float32 [n, n_vocab]: one call per
        token; rest float32 [n - n_prefix, n_vocab]: the tokens after the prefix, in one call once
        the prefix is cached). The sequence is reset between the ways.
    """
    seq = engine.new_sequence()
    batch = seq.eval(tokens, logits_all=True)
    seq.reset()
    one = np.stack([seq.eval([t])[-1] for t in tokens])
    seq.reset()
    seq.eval(tokens[:n_prefix])
    rest = seq.eval(tokens[n_prefix:], logits_all=True)
    return batch, one, rest
