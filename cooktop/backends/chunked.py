"""Tensors stored in row chunks: how they are cut, and the ops that take them, once for every backend.

A device's largest buffer (:attr:`~.base.Device.buffer_limit`: Vulkan's ``maxStorageBufferRange``
capped by ``maxBufferSize`` / ``maxMemoryAllocationSize``, OpenCL's ``CL_DEVICE_MAX_MEM_ALLOC_SIZE``,
or the ``/MAX`` part of ``COOKTOP_DEVICE_MEMORY``) caps one allocation, not the model: a weight
matrix ``[n_out, n_in]`` over it (the 128k x 2048 output matrix of Llama-3.2-1B on lavapipe's
128 MiB, Gemma 3's 262k-row embedding) is uploaded as consecutive row ranges that each fit
(an expert tensor ``[n_expert, n_out, n_in]``: ranges of output rows, of every expert)
(:func:`row_chunks`), and so is an activation allocated with ``empty(..., split=True)`` (the
logits of ``logits_all``: ``[n_batch, n_vocab]``). :attr:`DeviceTensor.chunks
<.tensor.DeviceTensor.chunks>` lists the parts; each is an ordinary allocation, so a backend
never sees a chunked tensor. What a backend adds is one hook, ``_copy_rect`` (a rectangle of
32-bit words between two row-major matrices: numpy slicing, OpenCL ``clEnqueueCopyBufferRect``,
a Vulkan shader).

The ops (called by :class:`~.ops.DeviceOps` after its checks when an argument has chunks):

- ``matmul(out, x, w)``: per chunk of ``w`` (rows ``r0 .. r0 + c`` of the weight, i.e. output
  columns ``r0 .. r0 + c``) the backend's matmul writes a scratch ``[k, c]`` that
  ``_copy_rect`` puts into those columns of ``out``; ``out`` in row chunks is done per part, the
  part's rows of ``x`` copied to a scratch first (``k`` rows at a time, so the scratch fits too).
  The matmul kernels are the unchunked ones, unchanged: each output value is the same sum.
- ``matmul_id(out, x, w, ids)`` with the expert tensor ``w [n_expert, n_out, n_in]`` in chunks
  (cut along the output rows, the same rows of every expert, so the ids stay as they are):
  per part into a scratch ``[n, k * c]`` whose ``k`` slots are copied to their columns of ``out``.
- ``get_rows(out, table, ids)`` with ``table`` in chunks: the ids are read to the host (one
  wait; so not inside a :meth:`~.base.Device.graph` scope: the forward pass looks its
  embeddings up on the host), grouped per chunk, and each chunk's rows gathered into a scratch
  and copied to their rows of ``out``.
- the row-wise ops ``add``, ``add_bias``, ``rmsnorm``, ``silu_mul``, ``gelu_mul``, ``copy``: once
  per part when every row argument is cut at the same rows (``add_bias(logits, logits, b)``).
- ``read`` / ``write``: part by part.

``matmul`` refuses an input ``x`` in chunks, ``get_rows`` an output in chunks, and the row-wise
ops arguments cut at different rows (UnsupportedOpError). The other ops (rope, kv_store, attention,
the MoE routing ops) are not checked for chunks, to keep their Python path as short as it was: what
gets split (weight matrices, expert tensors, ``split=True`` activations) is never their argument in
the forward pass, and passing one is the caller's fault. Scratch buffers are kept per device, role
and width (:func:`scratch`) and counted in ``allocated_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ..errors import DeviceOutOfMemoryError, UnsupportedOpError
from ..format.quants import type_name
from .tensor import DeviceTensor

#: A :class:`~.base.Device` (which imports this module; its backend hooks are called here).
Device = Any

#: Bytes a backend may add to one allocation (Vulkan pads weights to 16 bytes plus one spare
#: 16-byte word, activations to 4 values): a chunk is cut this much below the limit.
PAD_BYTES = 64

Part = tuple[int, DeviceTensor]


def row_chunks(n_rows: int, row_nbytes: int, limit: int, what: str = "tensor") -> list[tuple[int, int]]:
    """Cut ``n_rows`` rows of ``row_nbytes`` bytes each into ``(first, end)`` ranges of at most
    ``limit - PAD_BYTES`` bytes, all of one size but the last (no block alignment is needed: a
    GGML row is whole blocks).

    Raises:
        DeviceOutOfMemoryError: one row alone is over the limit (``what`` names the tensor).
    """
    per = (limit - PAD_BYTES) // max(1, row_nbytes)
    if per < 1:
        raise DeviceOutOfMemoryError(f"{what}: one row of {row_nbytes} bytes is more than the device's largest "
                                     f"buffer of {limit} bytes")
    return [(r, min(n_rows, r + per)) for r in range(0, n_rows, per)]


def scratch(dev: Device, role: str, rows: int, cols: int | None, ggml_type: T = T.F32) -> DeviceTensor:
    """A scratch ``[rows, cols]`` (``[rows]`` when ``cols`` is None) of ``dev`` for ``role``: a view of a
    buffer kept per role and width, replaced by one twice as large (within the limit) when a call needs
    more rows. A replaced buffer is released at the next call outside a graph scope (releasing waits
    for the device, which a scope being recorded cannot do)."""
    key = (role, cols, ggml_type)
    have = dev._chunk_scratch.get(key)
    if have is None or have.shape[0] < rows:
        cap = rows
        if have is not None:
            dev._chunk_retired.append(have)
            row = 4 * (cols or 1)
            cap = max(rows, min(2 * have.shape[0], ((dev.buffer_limit or (1 << 62)) - PAD_BYTES) // row))
        have = dev._chunk_scratch[key] = dev._empty((cap,) if cols is None else (cap, cols), ggml_type)
    if dev._chunk_retired and not dev._in_graph:
        retired, dev._chunk_retired = dev._chunk_retired, []
        dev.release(retired)
    return have.head(rows)


def release_scratch(dev: Device) -> None:
    """Give back every :func:`scratch` buffer of ``dev`` (when a model on it closes: the next use
    allocates again), outside a graph scope only (releasing waits for the device)."""
    if dev._in_graph:
        return
    held = list(dev._chunk_scratch.values()) + dev._chunk_retired
    dev._chunk_scratch, dev._chunk_retired = {}, []
    if held:
        dev.release(held)


#: Most partial rows of split-K flash attention (``(rows x n_head x splits)``, each ``head_dim + 2``
#: floats, role ``"attention splits"``): splitting stops past this many workgroups.
SPLIT_ROWS_CAP = 256

#: Largest score scratch (bytes) of attention without flash attention; llama.cpp's KQ of one ubatch is
#: n_kv x n_ubatch x n_head floats.
SCORES_CAP_BYTES = 64 << 20


def attention_scratch_bytes(n_head: int, head_dim: int, n_ctx: int, n_batch: int, flash: bool,
                            scores_flash: bool = False) -> int:
    """Upper bound of a device's attention scratch (bytes; counted by ``runtime/budget.py``): without
    flash attention the scores of a chunk (``min(4 n_batch n_head n_ctx, SCORES_CAP_BYTES)``, at least
    one row); with it the split-K partials (``4 SPLIT_ROWS_CAP (head_dim + 2)``), plus those scores when
    ``scores_flash`` (the device may run flash attention through the score kernels: a CPU Vulkan driver
    does, ``vulkan/attention.py``)."""
    row = 4 * max(1, n_ctx)
    scores = max(row, min(n_batch * n_head * row, SCORES_CAP_BYTES))
    if not flash:
        return scores
    return 4 * SPLIT_ROWS_CAP * (head_dim + 2) + (scores if scores_flash else 0)


def score_chunks(dev: Device, n_tok: int, n_head: int, n_ctx: int) -> tuple[int, int]:
    """``(tokens, heads)`` per chunk of attention without flash attention, whose scores are a scratch
    ``[tokens * heads, n_ctx]`` f32 (role ``"attention scores"``): under :data:`SCORES_CAP_BYTES` and
    ``dev.buffer_limit``, all heads of as many tokens as fit, else part of one token's heads, at least one."""
    cap = min(SCORES_CAP_BYTES, (dev.buffer_limit or 1 << 62) - PAD_BYTES)
    row = 4 * max(1, n_ctx)
    hc = max(1, min(n_head, cap // row))
    tc = max(1, min(n_tok, cap // (row * hc))) if hc == n_head else 1
    return tc, hc


def _parts(t: DeviceTensor) -> tuple[Part, ...]:
    return t.chunks if t.chunks is not None else ((0, t),)


def matmul(dev: Device, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor) -> None:
    """``out [n, n_out] = x [n, n_in] @ w^T`` with ``w`` and/or ``out`` in row chunks (module doc).

    Raises:
        UnsupportedOpError: ``x`` in row chunks.
    """
    if x.chunks is not None:
        raise UnsupportedOpError(f"matmul: the input {x!r} is stored in row chunks; only the weight and the "
                                 f"output may be")
    cap = ((dev.buffer_limit or (1 << 62)) - PAD_BYTES) // 4  # values in one scratch buffer
    n_in = x.shape[-1]
    for a, o in _parts(out):
        rows = o.shape[0]
        for r0, wc in _parts(w):
            cols = wc.shape[0]
            step = max(1, min(rows, cap // cols))
            if a != 0 or step < rows:  # x's rows go through a scratch copy too
                step = max(1, min(step, cap // n_in))
            if w.chunks is None and step == rows:  # straight into the part
                dev._matmul(o, _x_rows(dev, x, a, rows, n_in), wc)
                continue
            for i in range(0, rows, step):
                k = min(step, rows - i)
                tmp = scratch(dev, "matmul_out", k, cols)
                dev._matmul(tmp, _x_rows(dev, x, a + i, k, n_in), wc)
                dev._copy_rect(o, i, r0, tmp, 0, 0, k, cols)


def matmul_id(dev: Device, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, ids: DeviceTensor) -> None:
    """``matmul_id`` with the expert tensor ``w [n_expert, n_out, n_in]`` in row chunks (each part: output
    rows ``r0 .. r0 + c`` of every expert): the backend's ``matmul_id`` per part into a scratch
    ``[n, k * c]`` (the ids unchanged), whose ``k`` slots are copied to columns ``j * n_out + r0`` of
    ``out``; rows of ``x`` and ``ids`` go through scratch copies when the scratch holds fewer than ``n`` rows.

    Raises:
        UnsupportedOpError: ``out``, ``x`` or ``ids`` in row chunks.
    """
    refuse("matmul_id", out, x, ids)
    n, k = ids.shape
    n_out = w.shape[1]
    cap = ((dev.buffer_limit or (1 << 62)) - PAD_BYTES) // 4
    for r0, wc in _parts(w):
        c = wc.shape[1]
        step = max(1, min(n, cap // (k * c), cap // x.shape[1]))
        for i in range(0, n, step):
            m = min(step, n - i)
            xs, ids_s = x.head(m), ids.head(m)
            if i:
                xs, ids_s = scratch(dev, "matmul_id_in", m, x.shape[1]), scratch(dev, "matmul_id_ids", m, k, T.I32)
                dev._copy_rect(xs, 0, 0, x, i, 0, m, x.shape[1])
                dev._copy_rect(ids_s, 0, 0, ids, i, 0, m, k)
            tmp = scratch(dev, "matmul_id_out", m, k * c)
            dev._matmul_id(tmp, xs, wc, ids_s)
            for j in range(k):
                dev._copy_rect(out, i, j * n_out + r0, tmp, 0, j * c, m, c)


def _x_rows(dev: Device, x: DeviceTensor, first: int, k: int, n_in: int) -> DeviceTensor:
    """Rows ``first .. first + k`` of ``x`` as a tensor whose rows start at 0 (``x.head`` or a scratch copy)."""
    if first == 0:
        return x.head(k)
    xs = scratch(dev, "matmul_in", k, n_in)
    dev._copy_rect(xs, 0, 0, x, first, 0, k, n_in)
    return xs


def get_rows(dev: Device, out: DeviceTensor, table: DeviceTensor, ids: DeviceTensor) -> None:
    """``out[i] = table[ids[i]]`` with ``table`` in row chunks (module doc); ids clamped to the
    table as the backends clamp them.

    Raises:
        UnsupportedOpError: inside a graph scope (the ids are read on the host), or ``out`` in chunks.
    """
    if dev._in_graph:
        raise UnsupportedOpError(f"get_rows from {table!r}, stored in row chunks, reads its ids on the host: "
                                 f"not inside a graph scope")
    if out.chunks is not None:
        raise UnsupportedOpError(f"get_rows: the output {out!r} is stored in row chunks")
    idx = np.clip(dev._read(ids).reshape(-1).astype(np.int64), 0, table.shape[0] - 1)
    n = table.shape[-1]
    step = max(1, ((dev.buffer_limit or (1 << 62)) - PAD_BYTES) // (4 * n))  # rows of one scratch
    for r0, part in _parts(table):
        hits = np.nonzero((idx >= r0) & (idx < r0 + part.shape[0]))[0]
        for sel in (hits[i:i + step] for i in range(0, len(hits), step)):
            _gather(dev, out, part, sel, idx[sel] - r0, n)


def _gather(dev: Device, out: DeviceTensor, part: DeviceTensor, sel: np.ndarray, rows: np.ndarray, n: int) -> None:
    """``out[sel[j]] = part[rows[j]]`` through a scratch (one get_rows, one copy per run of output rows)."""
    ids_c = scratch(dev, "get_rows_ids", len(sel), None, T.I32)
    dev._write(ids_c, rows.astype(np.int32))
    tmp = scratch(dev, "get_rows_out", len(sel), n)
    dev._get_rows(tmp, part, ids_c)
    # runs of consecutive output rows go in one copy each
    breaks = np.nonzero(np.diff(sel) != 1)[0] + 1
    for j0, j1 in zip([0, *breaks], [*breaks, len(sel)]):
        dev._copy_rect(out, int(sel[j0]), 0, tmp, int(j0), 0, int(j1 - j0), n)


def rowwise(dev: Device, op: str, hook: Callable[..., None], rows: tuple[DeviceTensor, ...], *rest: Any) -> None:
    """Call ``hook(*parts, *rest)`` once per row chunk of the row arguments ``rows`` (``out`` first).

    Raises:
        UnsupportedOpError: the row arguments are not cut at the same rows.
    """
    cuts = [tuple((r0, p.shape[0]) for r0, p in _parts(t)) for t in rows]
    if any(c != cuts[0] for c in cuts):
        raise UnsupportedOpError(f"{op}: arguments stored in row chunks must be cut at the same rows: "
                                 f"{', '.join(repr(t) for t in rows)}")
    for parts in zip(*(_parts(t) for t in rows)):
        hook(*(p for _, p in parts), *rest)


def read(dev: Device, t: DeviceTensor) -> np.ndarray:
    """The host copy of ``t`` in row chunks (each part read in turn)."""
    return np.concatenate([dev._read(p) for _, p in _parts(t)], axis=0)


def write(dev: Device, t: DeviceTensor, data: np.ndarray) -> None:
    """Write ``data`` (``t``'s element count) into ``t`` in row chunks, part by part."""
    arr = np.asarray(data).reshape(t.shape)
    for r0, p in _parts(t):
        dev._write(p, arr[r0:r0 + p.shape[0]])


def upload(dev: Device, arr: np.ndarray, ggml_type: T, shape: tuple[int, ...], row_nbytes: int) -> DeviceTensor:
    """Upload weight bytes ``arr`` of ``shape`` (``[n_out, n_in]``, or ``[n_expert, n_out, n_in]``: then
    each part holds the same output rows of every expert) as row chunks under ``dev.buffer_limit``,
    each part through the backend's ``_upload``; on a failure the parts made so far are released."""
    lead = int(np.prod(shape[:-2], dtype=np.int64))  # experts (1 for a matrix)
    raw = arr.view(np.uint8).reshape(lead, shape[-2], row_nbytes)
    what = f"{type_name(ggml_type)} weight {list(shape)}"
    parts: list[Part] = []
    try:
        for first, end in row_chunks(shape[-2], lead * row_nbytes, dev.buffer_limit or 0, what):
            part_shape = shape[:-2] + (end - first, shape[-1])
            data = np.ascontiguousarray(raw[:, first:end]).reshape(-1)
            p = dev._upload(data, ggml_type, part_shape, data.nbytes)
            p.is_weight = True
            parts.append((first, p))
    except BaseException:
        dev.release([p for _, p in parts])
        raise
    return _whole(dev, parts, shape, ggml_type)


def empty(dev: Device, shape: tuple[int, ...], ggml_type: T) -> DeviceTensor:
    """An F32 / I32 tensor of ``shape`` in row chunks under ``dev.buffer_limit``."""
    row = 4 * int(np.prod(shape[1:], dtype=np.int64))
    parts: list[Part] = []
    try:
        for first, end in row_chunks(shape[0], row, dev.buffer_limit or 0, f"{type_name(ggml_type)} "
                                                                          f"tensor {list(shape)}"):
            parts.append((first, dev._empty((end - first,) + shape[1:], ggml_type)))
    except BaseException:
        dev.release([p for _, p in parts])
        raise
    return _whole(dev, parts, shape, ggml_type)


def _whole(dev: Device, parts: list[Part], shape: tuple[int, ...], ggml_type: T) -> DeviceTensor:
    t = DeviceTensor(dev, None, shape, ggml_type)
    t.chunks = tuple(parts)
    return t


def refuse(op: str, *tensors: DeviceTensor | None) -> None:
    """Raise UnsupportedOpError when one of ``tensors`` is stored in row chunks (``op`` cannot take them)."""
    for t in tensors:
        if t is not None and t.chunks is not None:
            raise UnsupportedOpError(f"{op}: {t!r} is stored in row chunks (larger than the device's largest "
                                     f"buffer); only matmul, get_rows and row-wise ops take such tensors")


def check_limit(dev: Device, nbytes: int, what: str) -> None:
    """Raise DeviceOutOfMemoryError when one buffer of ``nbytes`` is over ``dev.buffer_limit``."""
    if dev.buffer_limit is not None and nbytes > dev.buffer_limit:
        raise DeviceOutOfMemoryError(f"{what} needs one buffer of {nbytes} bytes, more than {dev.info.selector}'s "
                                     f"largest buffer of {dev.buffer_limit} bytes ({dev.info.name})")
