"""Perplexity as llama.cpp's llama-perplexity computes it (tools/perplexity/perplexity.cpp, ``perplexity()``).

The method: tokenize the whole text once (BOS in front when the vocabulary adds one), cut it
into ``n_chunk = len(tokens) // n_ctx`` chunks of ``n_ctx`` tokens (at most ``--chunks``), and
evaluate each chunk from an empty KV cache in batches of ``n_batch`` tokens, its first token
replaced by BOS (when the vocabulary adds one). The first half of each chunk is context only:
the logits at positions ``first = n_ctx // 2 .. n_ctx - 2`` score the token that follows each,
``n_ctx - 1 - first`` tokens per chunk. With ``nll`` the negative log-likelihoods (nats),
``PPL = exp(mean(nll))`` and its uncertainty ``PPL * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1))``
(llama.cpp's "Final estimate: PPL = x +/- y"). Chunks are evaluated one at a time (llama.cpp
evaluates ``n_batch / n_ctx`` of them side by side; each is its own sequence, so the figures are
the same).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import CooktopError
from ..model.placed import PlacedModel
from ..text.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Chunking:
    """How a token list is cut: ``n_ctx`` tokens per chunk, ``n_chunk`` chunks, ``n_batch`` per pass,
    ``bos``: the id put at each chunk's first position (None: the vocabulary adds no BOS)."""

    n_ctx: int
    n_chunk: int
    n_batch: int
    bos: int | None

    @property
    def first(self) -> int:
        """First scored position of a chunk: ``n_ctx // 2``."""
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:
        """Tokens scored per chunk: ``n_ctx - 1 - n_ctx // 2``."""
        return self.n_ctx - 1 - self.first


def tokenize_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """The text's tokens as llama-perplexity takes them: ``common_tokenize(ctx, text, add_special=true,
    parse_special=false)`` (BOS when the vocabulary adds one; special-token text stays text).

    Raises:
        CooktopError: the vocabulary adds EOS (llama.cpp asserts it does not).
    """
    if tokenizer.vocab.add_eos:
        raise CooktopError("perplexity needs a vocabulary that does not add EOS (llama.cpp asserts the same)")
    return tokenizer.tokenize(text, add_bos=True, special=False)


def chunking(tokenizer: Tokenizer, n_tokens: int, n_ctx: int, n_batch: int, n_chunks: int = -1) -> Chunking:
    """The chunks of ``n_tokens`` tokens (module doc).

    Args:
        n_ctx: tokens per chunk (``-c``), >= 4; n_batch: tokens per pass (``-b``; min(n_batch, n_ctx) used);
        n_chunks: at most this many chunks (< 0: all).
    Raises:
        CooktopError: ``n_ctx`` < 4 or ``n_batch`` < 1, or fewer than ``2 * n_ctx`` tokens (llama.cpp's
            "you need at least 2*n_ctx tokens").
    """
    if n_ctx < 4:
        raise CooktopError(f"perplexity needs -c/--ctx-size >= 4, got {n_ctx}")
    if n_batch < 1:
        raise CooktopError(f"-b/--batch-size must be positive, got {n_batch}")
    if n_tokens < 2 * n_ctx:
        raise CooktopError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                           f"{n_ctx}; the text tokenizes to only {n_tokens} tokens (use a longer -f or a smaller -c)")
    n_max = n_tokens // n_ctx
    n_chunk = n_max if n_chunks < 0 else min(n_chunks, n_max)
    if n_chunk < 1:
        raise CooktopError(f"--chunks must be positive or -1 (all), got {n_chunks}")
    v = tokenizer.vocab
    return Chunking(n_ctx, n_chunk, min(n_batch, n_ctx), v.bos_id if v.add_bos else None)


def chunk_logits(model: PlacedModel, tokens: np.ndarray, ch: Chunking) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Evaluate each chunk (module doc) and yield what it scores.

    Args:
        model: a placed model with ``n_ctx >= ch.n_ctx`` and ``n_batch >= ch.n_batch``;
        tokens: int [>= ch.n_chunk * ch.n_ctx].
    Yields:
        per chunk (logits float32 [n_scored, n_vocab] at positions first .. n_ctx - 2,
        targets int64 [n_scored], the token after each).
    Raises:
        whatever the model's forward raises (DeviceError, ClusterError).
    """
    cache = model.new_cache()
    try:
        for i in range(ch.n_chunk):
            start = i * ch.n_ctx
            chunk = np.array(tokens[start:start + ch.n_ctx], dtype=np.int64)
            if ch.bos is not None:
                chunk[0] = ch.bos
            rows: list[np.ndarray] = []
            for j in range(0, ch.n_ctx, ch.n_batch):
                part = chunk[j:j + ch.n_batch]
                want = j + len(part) > ch.first
                out = model.forward(part, j, cache, logits_all=want)
                if want:
                    rows.append(np.asarray(out)[max(0, ch.first - j):])
            logits = np.concatenate(rows)[:ch.n_scored]
            targets = np.asarray(tokens[start + ch.first + 1:start + ch.n_ctx], dtype=np.int64)
            yield logits, targets
    finally:
        cache.close()


def nll_rows(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row, float64 [n] (nats) for float32 [n, n_vocab] logits and
    int [n] targets (llama.cpp's ``log_softmax(n_vocab, logits, tok)``: max-shifted, sum in double)."""
    lg = np.asarray(logits, dtype=np.float32)
    mx = lg.max(axis=1)
    lse = np.log(np.exp(lg - mx[:, None]).astype(np.float64).sum(axis=1))
    return mx.astype(np.float64) + lse - lg[np.arange(len(lg)), np.asarray(targets, dtype=np.int64)]


def estimate(nll_sum: float, nll2_sum: float, count: int) -> tuple[float, float]:
    """(PPL, its uncertainty) from the sums of nll and nll^2 over ``count`` tokens (module doc).

    The uncertainty is 0 when the variance is not positive (llama.cpp then prints an error
    instead of the estimate)."""
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = float(np.exp(mean))
    return ppl, float(np.sqrt(var / (count - 1)) * ppl) if var > 0 and count > 1 else 0.0


@dataclasses.dataclass
class PerplexityResult:
    """What :func:`perplexity` measured.

    Attributes:
        ppl, ppl_unc: the final estimate and its uncertainty; running: PPL after each chunk;
        nll: float64 [n_chunk * n_scored], per scored token (nats); n_ctx, n_chunk: the chunking.
    """

    ppl: float
    ppl_unc: float
    running: list[float]
    nll: np.ndarray
    n_ctx: int
    n_chunk: int


def perplexity(model: PlacedModel, tokens: list[int] | np.ndarray, ch: Chunking,
               on_chunk: Callable[[int, float], None] | None = None,
               on_logits: Callable[[np.ndarray, np.ndarray], np.ndarray | None] | None = None) -> PerplexityResult:
    """llama.cpp's perplexity of ``tokens`` (module doc).

    Args:
        model: a placed model (any backend, placement or cluster); tokens: int [>= n_chunk * n_ctx];
        ch: from :func:`chunking`.
        on_chunk: called with (chunk index from 1, running PPL) after each chunk.
        on_logits: called with each chunk's (logits, targets); when it returns float64 nll [n_scored]
            those are used (the base writer computes them while quantizing, as llama.cpp does).
    Raises:
        as :func:`chunk_logits`.
    """
    toks = np.asarray(tokens, dtype=np.int64)
    nlls: list[np.ndarray] = []
    running: list[float] = []
    s = s2 = 0.0
    count = 0
    for i, (logits, targets) in enumerate(chunk_logits(model, toks, ch)):
        nll = on_logits(logits, targets) if on_logits is not None else None
        if nll is None:
            nll = nll_rows(logits, targets)
        nlls.append(nll)
        s += float(nll.sum())
        s2 += float((nll * nll).sum())
        count += len(nll)
        running.append(float(np.exp(s / count)))
        if on_chunk is not None:
            on_chunk(i + 1, running[-1])
    ppl, unc = estimate(s, s2, count)
    return PerplexityResult(ppl, unc, running, np.concatenate(nlls), ch.n_ctx, ch.n_chunk)


def perplexity_saving(model: PlacedModel, tokens: list[int] | np.ndarray, ch: Chunking, path: str,
                      on_chunk: Callable[[int, float], None] | None = None) -> PerplexityResult:
    """:func:`perplexity` that also writes the base file of ``--kl-divergence-base`` (``logits_file.py``):
    every scored row's log-probabilities, quantized as llama.cpp does, the nll taken from the same pass.

    Raises:
        CooktopError: the file cannot be written. As :func:`chunk_logits`.
    """
    from .logits_file import LogitsWriter, quantize_rows

    writer = LogitsWriter(path, ch.n_ctx, model.cfg.n_vocab, ch.n_chunk, tokens)

    step = max(1, (8 << 20) // model.cfg.n_vocab)  # rows per block: float64 temporaries of ~64 MiB at most

    def save(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
        nlls = []
        for r in range(0, len(logits), step):
            rows, nll = quantize_rows(logits[r:r + step], targets[r:r + step])
            writer.write(rows)
            nlls.append(nll)
        return np.concatenate(nlls)
    try:
        return perplexity(model, tokens, ch, on_chunk=on_chunk, on_logits=save)
    finally:
        writer.close()
