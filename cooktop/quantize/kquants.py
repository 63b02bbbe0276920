"""llama.cpp's K-quant reference quantizers (no importance matrix) in numpy, bit for bit.

Source: ggml/src/ggml-quants.c ``quantize_row_q2_K_ref`` ... ``quantize_row_q6_K_ref`` (what
``ggml_quantize_chunk`` runs for these types when no importance matrix is given); block layouts from
ggml-common.h (``block_q2_K`` ...). Each function takes ``x: float32 [nb, 256]`` (``nb`` super-blocks,
any rows concatenated: the reference treats a row as consecutive super-blocks) and returns the blocks
as ``uint8 [nb, block_bytes]``. Work is vectorised over all super-blocks; the loops left are the C
loops over the 16 or 32 values of a sub-block, in their order (see :mod:`.search`). float16 scales are
numpy's float32 -> float16 conversion (round to nearest even, as ``GGML_FP32_TO_FP16``).
"""

from __future__ import annotations

import numpy as np

from .search import F32, GROUP_MAX_EPS, make_q3_quants_rmse, make_qkx2_quants, make_qx_quants_rmse1, nearest_int, sum0

QK_K = 256


def _f16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float16 bytes uint8 [nb, 2], the value back in float32 [nb])."""
    h = np.asarray(v, dtype=F32).astype(np.float16)
    return h.view(np.uint8).reshape(-1, 2), h.astype(F32)


def _sub(x: np.ndarray, size: int) -> np.ndarray:
    """Sub-blocks transposed: ``[nb, 256]`` -> ``[size, nb * 256/size]`` (column c = sub-block c)."""
    return np.ascontiguousarray(x.reshape(-1, size).T)


def _unsub(v: np.ndarray, nb: int) -> np.ndarray:
    """Inverse of :func:`_sub` for per-value arrays: ``[size, nb*S]`` -> ``[nb, 256]``."""
    return np.ascontiguousarray(v.T).reshape(nb, QK_K)


def _pack2(L: np.ndarray) -> np.ndarray:
    """2-bit quants ``[nb, 256]`` -> ``qs [nb, 64]``: byte j/4+l of each 128 holds L[j+l], +32, +64, +96."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins ``[nb, 8]`` -> the 12 bytes of Q4_K/Q5_K (``get_scale_min_k4``'s inverse)."""
    s = np.zeros((ls.shape[0], 12), np.uint8)
    s[:, 0:4] = ls[:, 0:4]
    s[:, 4:8] = lm[:, 0:4]
    s[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    s[:, 0:4] = s[:, 0:4] | ((ls[:, 4:8] >> 4) << 6).astype(np.uint8)
    s[:, 4:8] = s[:, 4:8] | ((lm[:, 4:8] >> 4) << 6).astype(np.uint8)
    return s


def _requant(x: np.ndarray, d: np.ndarray, dm: np.ndarray, L: np.ndarray, lo: int, hi: int,
             offset: int = 0) -> np.ndarray:
    """The final pass: ``l = clamp(nearest_int((x + dm)/d), lo, hi) + offset`` where ``d != 0``, else L kept.

    x, L: [nb, S, n]; d, dm: [nb, S].
    """
    nz = d != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (x + dm[..., None]) / np.where(nz, d, F32(1))[..., None]
    lv = np.clip(nearest_int(v), lo, hi) + offset
    return np.where(nz[..., None], lv, L).astype(np.uint8)


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q2_K_ref``: ``x float32 [nb, 256]`` -> ``uint8 [nb, 84]`` (scales[16], qs[64], d, dmin)."""
    nb = x.shape[0]
    xs = _sub(x, 16)
    scales, mins, L = make_qkx2_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
    scales = scales.reshape(nb, 16)
    mins = mins.reshape(nb, 16)
    L = _unsub(L, nb).reshape(nb, 16, 16)
    q4 = F32(15)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where((max_scale > 0)[:, None], nearest_int((q4 / max_scale)[:, None] * scales), 0)
        mn = np.where((max_min > 0)[:, None], nearest_int((q4 / max_min)[:, None] * mins), 0)
    sc_b = (sc & 0xFF).astype(np.uint8) | ((mn << 4) & 0xFF).astype(np.uint8)
    d_b, d = _f16(np.where(max_scale > 0, max_scale / q4, F32(0)))
    m_b, dmin = _f16(np.where(max_min > 0, max_min / q4, F32(0)))
    dd = d[:, None] * (sc_b & 0xF).astype(F32)
    dmm = dmin[:, None] * (sc_b >> 4).astype(F32)
    L = _requant(x.reshape(nb, 16, 16), dd, dmm, L, 0, 3)
    return np.concatenate([sc_b, _pack2(L.reshape(nb, QK_K)), d_b, m_b], axis=1)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q3_K_ref``: ``x float32 [nb, 256]`` -> ``uint8 [nb, 110]`` (hmask[32], qs[64], scales[12], d)."""
    nb = x.shape[0]
    scales, L = make_q3_quants_rmse(_sub(x, 16), 4)
    scales = scales.reshape(nb, 16)
    L = _unsub(L, nb).reshape(nb, 16, 16)
    a = np.abs(scales)
    imax = np.argmax(a, axis=1)
    max_scale = scales[np.arange(nb), imax]
    nz = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-32) / np.where(nz, max_scale, F32(1))
        l8 = nearest_int(iscale[:, None] * scales).astype(np.int8)  # int8_t l = nearest_int(...)
    lq = (np.clip(l8, -32, 31) + 32).astype(np.uint8)
    lq[~nz] = 0
    s = np.zeros((nb, 12), np.uint8)
    s[:, 0:8] = lq[:, 0:8] & 0xF
    s[:, 0:8] = s[:, 0:8] | ((lq[:, 8:16] & 0xF) << 4).astype(np.uint8)
    hi = lq >> 4
    for j in range(16):
        s[:, 8 + j % 4] = s[:, 8 + j % 4] | (hi[:, j] << (2 * (j // 4))).astype(np.uint8)
    with np.errstate(divide="ignore"):
        d_b, d = _f16(np.where(nz, F32(1) / iscale, F32(0)))
    sc = lq.astype(np.int32) - 32  # the 6-bit scales read back
    dd = d[:, None] * sc.astype(F32)
    L = _requant(x.reshape(nb, 16, 16), dd, np.zeros_like(dd), L, -4, 3, 4).reshape(nb, QK_K)
    high = L > 3
    L = np.where(high, L - 4, L).astype(np.uint8)
    # value j's high bit goes to hmask[j % 32], bit j // 32
    hm = high.reshape(nb, 8, 32).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]
    hmask = np.bitwise_or.reduce(hm, axis=1)
    return np.concatenate([hmask, _pack2(L), s, d_b], axis=1)


def _q45_k(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The common part of Q4_K and Q5_K: per-32 (scale, min) search, 6-bit codes, super-block scales, quants."""
    nb = x.shape[0]
    xs = _sub(x, 32)
    sum_x2 = sum0(xs * xs)
    av_x = np.sqrt(sum_x2 / F32(32))
    w = av_x[None, :] + np.abs(xs)
    scales, mins, L = make_qkx2_quants(xs, w, nmax, rmin, 0.1, nstep, False)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)
    L = _unsub(L, nb).reshape(nb, 8, 32)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    packed = _pack_scale_min_k4(ls, lm)
    d_b, d = _f16(max_scale / F32(63))
    m_b, dmin = _f16(max_min / F32(63))
    dd = d[:, None] * ls.astype(F32)
    dmm = dmin[:, None] * lm.astype(F32)
    L = _requant(x.reshape(nb, 8, 32), dd, dmm, L, 0, nmax).reshape(nb, QK_K)
    return d_b, m_b, packed, L


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_K_ref``: ``x float32 [nb, 256]`` -> ``uint8 [nb, 144]`` (d, dmin, scales[12], qs[128])."""
    d_b, m_b, packed, L = _q45_k(x, 15, -1.0, 20)
    q = L.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([d_b, m_b, packed, qs], axis=1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q5_K_ref``: ``x float32 [nb, 256]`` -> ``uint8 [nb, 176]``
    (d, dmin, scales[12], qh[32], qs[128])."""
    d_b, m_b, packed, L = _q45_k(x, 31, -0.5, 15)
    q = L.reshape(-1, 4, 2, 32)  # [nb, chunk of 64, low/high 32, 32]
    hi = (q >> 4).astype(np.uint8)
    lo = q & 0xF
    qs = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    qh = np.bitwise_or.reduce((hi[:, :, 0] << shifts) | (hi[:, :, 1] << (shifts + 1)), axis=1)
    return np.concatenate([d_b, m_b, packed, qh, qs], axis=1)


def quantize_q6_k(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """``quantize_row_q6_K_ref``: ``x float32 [nb, 256]`` -> ``uint8 [nb, 210]``
    (ql[128], qh[64], scales[16] int8, d); ``qw float32 [nb, 256]``: the importance weights of
    ``quantize_row_q6_K_impl`` (which differs from the reference only in ``make_qx_quants``' weights)."""
    nb = x.shape[0]
    scales, L = make_qx_quants_rmse1(_sub(x, 16), 32, None if qw is None else _sub(qw, 16))
    scales = scales.reshape(nb, 16)
    L = _unsub(L, nb).reshape(nb, 16, 16)
    a = np.abs(scales)
    imax = np.argmax(a, axis=1)
    max_abs = a[np.arange(nb), imax]
    max_scale = scales[np.arange(nb), imax]
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-128) / np.where(zero, F32(1), max_scale)
        d_b, d = _f16(np.where(zero, F32(0), F32(1) / iscale))
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
    sc[zero] = 0
    dd = d[:, None] * sc.astype(F32)
    L = _requant(x.reshape(nb, 16, 16), dd, np.zeros_like(dd), L.astype(np.int32), -32, 31, 32)
    L = L.reshape(nb, 2, 4, 32)  # [nb, half of 128, quarter, 32]
    lo = L & 0xF
    hi = L >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2).reshape(nb, 128)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(nb, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d_b], axis=1)
    out[zero] = 0  # memset of the whole block, d = +0
    return out
