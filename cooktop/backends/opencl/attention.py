"""OpenCL attention without flash attention (``-fa off``): llama.cpp's ``build_attn_mha`` path with
the scores materialised (``kernels/attention_kq.cl``: ``attn_kq``, ``attn_softmax``, ``attn_kqv``).

The scores of a chunk of tokens and heads live in one scratch buffer (``chunked.scratch``, role
``"attention scores"``) of ``tc x hc x n_ctx`` floats, kept under ``chunked.SCORES_CAP_BYTES`` and the
device's largest buffer (``chunked.score_chunks``): the tokens (and, when one token's heads alone are over the cap, the
heads) are processed in chunks, three launches per chunk. The columns a row reads are bounded by
``pos`` on the device, so a row costs its own ``n_kv``, not ``n_ctx``. On the serial (CPU) flavour
KQ and KQV run one work-item per (head, token) row that reads whole K / V rows as vectors (KQV:
all ``head_dim`` values of the output at once, not one work-item per value striding over V).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from .. import chunked
from .programs import PROGRAMS, build_program, read_source


class KQKernels:
    """The three kernels of one (head_dim, K type, V type), built on first use by :func:`kernels`."""

    def __init__(self, prg: Any):
        i, f = np.int32, np.float32
        self.kq = prg.attn_kq
        self.kq.set_scalar_arg_dtypes([None, None, None, None, None, i, i, i, f, i, i, i, i, i])
        self.softmax = prg.attn_softmax
        self.softmax.set_scalar_arg_dtypes([None, None, None, i, i, i, i, i, i, None, i])
        self.kqv = prg.attn_kqv
        self.kqv.set_scalar_arg_dtypes([None, None, None, None, None, i, i, i, i, i, i, i, i])


def kernels(kc: Any, head_dim: int, kt: T, vt: T, ls: int) -> KQKernels:
    """The :class:`KQKernels` for ``head_dim`` and cache types ``kt``/``vt`` on the KernelCache ``kc``
    (``ls``: the softmax work-group size, a power of two), cached on it."""
    cache = kc.__dict__.setdefault("_attn_kq", {})
    key = (head_dim, int(kt), int(vt), ls)
    k = cache.get(key)
    if k is None:
        with kc._lock:
            opts = f"{kc.options} -DHEAD_DIM={head_dim} -DKTYPE={int(kt)} -DVTYPE={int(vt)} -DNF_LS={ls}"
            prg = build_program(kc.ctx, kc.device, read_source(*PROGRAMS["attention_kq"]), opts,
                                f"attention without flash (head_dim {head_dim})", kc._label)
            k = cache[key] = KQKernels(prg)
    return k


def attention_kq(dev: Any, out, q, k_cache, v_cache, pos, n_head: int, n_head_kv: int, scale: float, window: int,
                 kv_start, sinks) -> None:
    """Enqueue ``out = softmax(K^T q * scale + mask) V`` on the OpenCL device ``dev`` through the
    score scratch (module doc). Arguments as ``Device.attention`` / ``attention_sinks`` (checked).

    Raises:
        DeviceOutOfMemoryError: the scratch cannot be allocated.
    """
    n_tok, width = q.shape
    head_dim = width // n_head
    n_ctx = k_cache.shape[0]
    ls = 1 if dev.shape.at_serial else dev.shape.at_ls
    kn = kernels(dev.kernels, head_dim, k_cache.ggml_type, v_cache.ggml_type, ls)
    tc, hc = chunked.score_chunks(dev, n_tok, n_head, n_ctx)
    s = chunked.scratch(dev, "attention scores", tc * hc, n_ctx).handle
    start, has_start = (kv_start.handle, 1) if kv_start is not None else (pos.handle, 0)
    sk, has_sinks = (sinks.handle, 1) if sinks is not None else (pos.handle, 0)
    dev.q8.dirty(out.handle)
    launch = dev._launch  # every launch through the device (recorded in a graph scope: replay.py)
    for t0 in range(0, n_tok, tc):
        nt = min(tc, n_tok - t0)
        for h0 in range(0, n_head, hc):
            nh = min(hc, n_head - h0)
            launch(kn.kq, (ls, nh, nt), (ls, 1, 1), s, q.handle, k_cache.handle, pos.handle, start, has_start,
                   n_head, n_head_kv, scale, window, n_ctx, t0, h0, nh)
            launch(kn.softmax, (ls, nh, nt), (ls, 1, 1), s, pos.handle, start, has_start, window, n_ctx, t0, h0,
                   nh, sk, has_sinks)
            kqv_items = 1 if dev.shape.at_serial else head_dim  # CPU flavour: a whole row per work-item
            launch(kn.kqv, (kqv_items, nh, nt), None, out.handle, s, v_cache.handle, pos.handle, start, has_start,
                   n_head, n_head_kv, window, n_ctx, t0, h0, nh)


#: Query-tile shapes of ``attention_tiled`` (queries QT, value slices per query DS, keys per tile KT),
#: the first whose local memory fits the device is taken.
TILES = ((16, 4, 16), (16, 4, 8), (8, 8, 8), (4, 16, 4))


def tile_shape(head_dim: int, local_mem: int | None) -> tuple[int, int, int] | None:
    """``(QT, DS, KT)`` of the query-tiled flash kernel for ``head_dim`` within ``local_mem`` bytes of
    local memory (None: OpenCL's minimum, 32 KiB), or None when no tile fits."""
    cap = local_mem or 32 << 10
    for qt, ds, kt in TILES:
        if 4 * (qt * head_dim + 2 * kt * head_dim + qt * kt) + 8 * qt <= cap:
            return qt, ds, kt
    return None


def attention_tiled(dev: Any, out, q, k_cache, v_cache, pos, n_head: int, n_head_kv: int, scale: float,
                    window: int, kv_start, sinks) -> bool:
    """Enqueue the query-tiled flash kernel (``attention.cl`` ``attention_tiled``) for a prompt on the GPU
    flavour; False (nothing enqueued) where it does not apply: the serial (CPU) flavour, one token, or no
    tile fitting the local memory. Arguments as ``Device.attention`` (checked)."""
    n_tok, width = q.shape
    head_dim = width // n_head
    tile = tile_shape(head_dim, dev.info.extra.get("local_mem_bytes"))
    if dev.shape.at_serial or n_tok < 2 or tile is None:
        return False
    qt, ds, kt = tile
    kc = dev.kernels
    cache = kc.__dict__.setdefault("_attn_tiled", {})
    key = (head_dim, int(k_cache.ggml_type), int(v_cache.ggml_type), sinks is not None, tile)
    knl = cache.get(key)
    if knl is None:
        with kc._lock:
            opts = (f"{kc.options} -DHEAD_DIM={head_dim} -DKTYPE={int(k_cache.ggml_type)} "
                    f"-DVTYPE={int(v_cache.ggml_type)} -DAT_TILED=1 -DQT={qt} -DDS={ds} -DKT={kt}"
                    + (" -DSINKS=1" if sinks is not None else ""))
            prg = build_program(kc.ctx, kc.device, read_source(*PROGRAMS["attention"]), opts,
                                f"tiled attention (head_dim {head_dim})", kc._label)
            knl = prg.attention_tiled
            i = np.int32
            knl.set_scalar_arg_dtypes([None] * 6 + [i, i, i, np.float32, i] + ([None] if sinks is not None else [])
                                      + [i])
            cache[key] = knl
    start, has_start = (kv_start.handle, 1) if kv_start is not None else (pos.handle, 0)
    args = (out.handle, q.handle, k_cache.handle, v_cache.handle, pos.handle, start, has_start, n_head, n_head_kv,
            scale, window) + ((sinks.handle,) if sinks is not None else ()) + (n_tok,)
    dev.q8.dirty(out.handle)
    ls = qt * ds
    dev._launch(knl, (ls * -(-n_tok // qt), n_head), (ls, 1), *args)
    return True
