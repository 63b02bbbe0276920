"""How many K/V cells a sliding-window layer keeps: llama.cpp's iSWA cache (src/llama-kv-cache-iswa.cpp).

A sliding-window (SWA) layer attends to the last ``n_swa`` positions only, so keeping every
position of the context in its cache wastes memory: llama.cpp gives such layers a second, smaller
cache of ``size_swa = GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)`` cells per sequence (unless
``--swa-full``) and reuses the cells that fell out of the window. cooktop keeps the same count
(:func:`swa_cells`, ``n_ubatch`` being cooktop's ``n_batch``, the most rows of one pass) with a
layout that needs no change to the attention kernels (``model/forward.py``'s module doc):

- sequence ``s`` owns SWA cells ``s * B .. (s + 1) * B - 1`` and an offset ``o_s``: cell
  ``s * B + p - o_s`` holds its position ``p``. The window mask and ``kv_start`` work on cell
  distances, which a constant offset keeps, so ``kv_store`` and ``attention`` are unchanged;
- before a pass writes ``n`` rows from position ``n_past`` that would pass the ``B`` cells, the
  sequence is *compacted* (:func:`compaction`): the ``n_swa - 1`` rows the first new row still sees
  move to the front (``Device.copy_rows``, in non-overlapping chunks) and ``o_s`` advances;
- a position ``t`` can be resumed (truncated to) only while the window of ``t`` is kept:
  ``o_s == 0`` or ``t >= o_s + n_swa - 1`` (:func:`resumable`); ``reusable_prefix`` says so and the
  callers evaluate again from 0 otherwise, as for a recurrent state.

Only attention-only models split (llama.cpp's hybrid recurrent models keep the whole context in
their SWA layers too); ``swa_full`` (``--swa-full``) keeps today's whole-context cells everywhere.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType

from ..format.quants import row_bytes
from .hparams import ModelConfig

#: llama.cpp pads the SWA cache's cells to a multiple of 256 (``GGML_PAD(..., 256)``); tests lower it
PAD = 256


def is_swa_block(cfg: ModelConfig, il: int) -> bool:
    """True when block ``il`` attends through a sliding window (llama.cpp ``hparams.is_swa(il)`` with
    ``n_swa > 0``)."""
    return cfg.n_swa > 0 and bool(cfg.swa_layers) and bool(cfg.swa_layers[il])


def swa_cells(cfg: ModelConfig, n_ctx: int, n_batch: int, swa_full: bool = False,
              types: tuple[GGMLQuantizationType, ...] = ()) -> int:
    """Cells per sequence of each sliding-window layer's K and V: ``min(n_ctx, GGML_PAD(n_swa + n_batch,
    PAD))`` (llama.cpp ``llama_kv_cache_iswa``'s ``size_swa`` for one sequence, ``n_ubatch`` =
    ``n_batch``); 0 when the SWA layers keep all ``n_ctx`` cells like the others: ``swa_full``, no
    sliding-window layer, a model with recurrent layers, a window cache no smaller than ``n_ctx``, or
    a row of the cache ``types`` (K's, V's) that is not whole 32-bit words (Vulkan copies words)."""
    layers = [i for i in range(cfg.n_layer) if is_swa_block(cfg, i)]
    if swa_full or not layers or any(cfg.recurrent_layers):
        return 0
    if any(row_bytes(t, cfg.layer(i).n_embd_kv) % 4 for t in types for i in layers):
        return 0
    b = -(-(cfg.n_swa + n_batch) // PAD) * PAD
    return b if b < n_ctx else 0


def kv_cells(cfg: ModelConfig, il: int, n_ctx: int, n_swa_cells: int) -> int:
    """Cells per sequence block ``il`` allocates: 0 when it keeps no K/V of its own (a recurrent block,
    a block reading another's cache), ``n_swa_cells`` for a sliding-window block when the cache splits
    (:func:`swa_cells` > 0), else ``n_ctx``."""
    if not cfg.has_kv(il):
        return 0
    return n_swa_cells if n_swa_cells and is_swa_block(cfg, il) else n_ctx


def resumable(n_swa: int, offset: int, t: int) -> bool:
    """True when a sequence whose SWA cells start at position ``offset`` can go back to ``t`` tokens:
    the window of position ``t`` (``t - n_swa + 1 .. t - 1``) is still in its cells, or ``t`` is 0."""
    return t <= 0 or offset == 0 or t - n_swa + 1 >= offset


def compaction(n_swa: int, n_cells: int, offset: int, n_past: int, n: int) -> tuple[int, list[tuple[int, int, int]]]:
    """The new offset and the row moves (``(src, dst, rows)`` within one sequence's cells, in order,
    each pair of ranges disjoint) that make room for ``n`` rows at ``n_past`` in ``n_cells`` cells
    holding positions from ``offset``: none when they fit; else the ``n_swa - 1`` rows before ``n_past``
    go to the front (the largest shift: fewest chunks), moved in chunks no longer than the shift.

    Raises:
        ValueError: ``n`` rows do not fit even then (``n_cells < n_swa - 1 + n``: cannot happen with
        :func:`swa_cells`, which holds ``n_swa + n_batch``), or the window of ``n_past`` is gone.
    """
    if n_past + n - offset <= n_cells:
        return offset, []
    keep = min(n_swa - 1, n_past)
    new = n_past - keep
    if keep + n > n_cells or new < offset or not resumable(n_swa, offset, n_past):
        raise ValueError(f"{n} rows at position {n_past} do not fit in {n_cells} sliding-window cells from "
                         f"position {offset}")
    shift = new - offset
    moves = [(shift + a, a, min(shift, keep - a)) for a in range(0, keep, shift)]
    return new, moves
