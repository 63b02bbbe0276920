"""The reference log-probabilities of ``--kl-divergence-base FILE``: llama.cpp's file format.

What is stored, and why: the file llama-perplexity writes (tools/perplexity/perplexity.cpp,
``perplexity()`` with ``logits_file`` and ``log_softmax(n_vocab, logits, uint16_t *, tok)``; the
layout and rounding are taken from that source; not checked against a file llama-perplexity wrote,
but against a C transcription of that function on random logits (n_vocab 501, 512, 32000): the
same uint16 values, and the float32 offset one ulp apart in about 1 row in 400, from the order of
the sum), so a base made by llama.cpp can be compared against by cooktop and the other way round,
and the figures are those llama.cpp computes from the same base. Layout, little-endian:

- ``b"_logits_"``, int32 ``n_ctx``, int32 ``n_vocab``, int32 ``n_chunk``;
- int32 tokens [n_chunk * n_ctx] (the text's tokens, BOS not substituted);
- for each chunk, for each of its ``n_ctx - 1 - n_ctx // 2`` scored positions, one row of
  ``nv = 2 * ((n_vocab + 1) // 2) + 4`` uint16: float32 ``scale`` and float32 ``min_log_prob``
  (4 uint16), then ``n_vocab`` uint16 ``q`` with log p(token) = scale * q + min_log_prob (then
  one zero pad when n_vocab is odd).

The range is the 16 nats below the most likely token (``min_logit = max(min, max - 16)``),
quantized to 65535 steps: a step is at most 16 / 65535 = 2.4e-4 nats; tokens more than 16 nats
below the top read as the range's floor and are left out of the KL sum (p < 1.1e-7 each).
That is 2 bytes per vocabulary entry per scored token (half of float32 logits) and keeps the
whole distribution, which a top-k file could not: KL divergence, "same top p" and the base's
own perplexity all come from it.
"""

from __future__ import annotations

import dataclasses
import io
import os

import numpy as np

from ..errors import CooktopError

MAGIC = b"_logits_"

#: Log-probabilities more than this many nats below the top one are not resolved (llama.cpp's 16).
RANGE_NATS = 16.0


def row_width(n_vocab: int) -> int:
    """uint16 values per stored row: ``2 * ((n_vocab + 1) // 2) + 4`` (llama.cpp's ``nv``)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def quantize_rows(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's ``log_softmax(n_vocab, logits, uint16_t *, tok)`` over rows.

    Args:
        logits: float32 [n, n_vocab]; targets: int [n], the token that follows each row.
    Returns:
        (rows uint16 [n, row_width(n_vocab)], nll float64 [n]: -log p(target), computed as
        llama.cpp does it while quantizing, in float32).
    """
    lg = np.ascontiguousarray(logits, dtype=np.float32)
    n, n_vocab = lg.shape
    mx = lg.max(axis=1)
    mn = np.maximum(lg.min(axis=1), mx - np.float32(RANGE_NATS))
    sum_exp = np.exp(lg - mx[:, None]).astype(np.float64).sum(axis=1)
    lse = np.log(sum_exp).astype(np.float32)
    min_log_prob = (mn - mx - lse).astype(np.float32)
    scale = ((mx - mn) / np.float32(65535.0)).astype(np.float32)
    out = np.zeros((n, row_width(n_vocab)), dtype=np.uint16)
    head = np.stack([scale, min_log_prob], axis=1).astype("<f4")
    out[:, :4] = head.view("<u2").reshape(n, 4)
    ok = scale != 0
    with np.errstate(divide="ignore"):
        inv = np.where(ok, np.float32(1.0) / np.where(ok, scale, np.float32(1.0)), np.float32(0.0)).astype(np.float32)
    q = np.rint(inv[:, None] * (lg - mn[:, None])).astype(np.int64) & 0xFFFF  # nearest_int: ties to even
    q = np.where(lg > mn[:, None], q, 0)
    q[~ok] = 0
    out[:, 4:4 + n_vocab] = q.astype(np.uint16)
    nll = (mx + lse - lg[np.arange(n), np.asarray(targets, dtype=np.int64)]).astype(np.float64)
    return out, nll


def dequantize_rows(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """Log-probabilities float32 [n, n_vocab] of stored rows (uint16 [n, row_width(n_vocab)]):
    ``scale * q + min_log_prob`` in float32, as llama.cpp reads them."""
    head = np.ascontiguousarray(rows[:, :4]).view("<f4").reshape(-1, 2)
    scale, mlp = head[:, 0:1], head[:, 1:2]
    return (scale * rows[:, 4:4 + n_vocab].astype(np.float32) + mlp).astype(np.float32)


class LogitsWriter:
    """Writes a base file chunk by chunk (module doc).

    Args:
        path: the file (created or truncated); n_ctx, n_vocab, n_chunk: ints;
        tokens: int [>= n_chunk * n_ctx], the evaluated text's tokens.
    Raises:
        CooktopError: the file cannot be written.
    """

    def __init__(self, path: str | os.PathLike, n_ctx: int, n_vocab: int, n_chunk: int,
                 tokens: np.ndarray | list[int]):
        self.path, self.n_vocab = str(path), n_vocab
        try:
            self._f: io.BufferedWriter = open(path, "wb")  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise CooktopError(f"cannot write {path}: {e.strerror}") from None
        self._f.write(MAGIC)
        self._f.write(np.array([n_ctx, n_vocab, n_chunk], dtype="<i4").tobytes())
        self._f.write(np.asarray(tokens[:n_chunk * n_ctx], dtype="<i4").tobytes())

    def write(self, rows: np.ndarray) -> None:
        """Append a chunk's rows (uint16 [n_ctx - 1 - n_ctx // 2, row_width(n_vocab)])."""
        self._f.write(np.ascontiguousarray(rows, dtype="<u2").tobytes())

    def close(self) -> None:
        """Flush and close the file."""
        self._f.close()


@dataclasses.dataclass
class LogitsFile:
    """A base file opened for reading: its header, tokens and the memory-mapped rows.

    Attributes:
        path; n_ctx, n_vocab, n_chunk: ints; tokens: int32 [n_chunk * n_ctx];
        rows: uint16 [n_chunk, n_ctx - 1 - n_ctx // 2, row_width(n_vocab)] (a memory map).
    """

    path: str
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray
    rows: np.ndarray

    @property
    def n_scored(self) -> int:
        """Scored positions per chunk: ``n_ctx - 1 - n_ctx // 2``."""
        return self.n_ctx - 1 - self.n_ctx // 2


def read_logits_file(path: str | os.PathLike) -> LogitsFile:
    """Open a base file (module doc).

    Raises:
        CooktopError: the file is missing, is not a log-probabilities file, or is truncated.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError as e:
        raise CooktopError(f"cannot read {path}: {e.strerror}") from None
    if len(head) < 20 or head[:8] != MAGIC:
        raise CooktopError(f"{path} does not look like a file containing log-probabilities "
                           f"(made by --kl-divergence-base): it does not start with {MAGIC.decode()}")
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(head[8:20], dtype="<i4"))
    if n_ctx < 2 or n_vocab < 1 or n_chunk < 1:
        raise CooktopError(f"{path}: bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})")
    n_scored = n_ctx - 1 - n_ctx // 2
    tok_bytes = 4 * n_ctx * n_chunk
    want = 20 + tok_bytes + 2 * n_chunk * n_scored * row_width(n_vocab)
    if size < want:
        raise CooktopError(f"{path} is truncated: {size:,} bytes, its header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                           f"{n_chunk} chunks) needs {want:,}")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    tokens = np.frombuffer(mm[20:20 + tok_bytes], dtype="<i4")
    rows = np.frombuffer(mm[20 + tok_bytes:want], dtype="<u2").reshape(n_chunk, n_scored, row_width(n_vocab))
    return LogitsFile(str(path), n_ctx, n_vocab, n_chunk, tokens, rows)
