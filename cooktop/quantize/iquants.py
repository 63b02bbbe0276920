"""llama.cpp's row quantizers **with an importance matrix** in numpy, bit for bit.

Source: ggml/src/ggml-quants.c ``quantize_row_q4_0_impl`` ... ``quantize_row_q6_K_impl`` (what
``ggml_quantize_chunk`` runs when ``quant_weights`` is given; Q8_0 ignores it). ``qw`` is the tensor's
importance vector, one weight per column (``float32 [n_per_row]``, the same for every row). Each function
takes ``x: float32 [n_rows, n_per_row]`` and returns ``uint8 [n_rows, row_bytes]``. The sums and searches
are :mod:`.search`'s (same exactness argument); the block packing is :mod:`.kquants`' where it is shared.
"""

from __future__ import annotations

import numpy as np

from .kquants import QK_K, _f16, _pack2, _pack_scale_min_k4, _requant, _sub, _unsub, quantize_q6_k
from .search import F32, make_qkx2_quants, make_qp_quants, make_qx_quants_rmse1, sum0


def _row_sigma2(x: np.ndarray) -> np.ndarray:
    """``sum_x2 / n_per_row`` per row (the legacy types' sigma²), summed in order: float32 [n_rows]."""
    return sum0(np.ascontiguousarray((x * x).T)) / F32(x.shape[1])


def _block_sum_x2(x: np.ndarray) -> np.ndarray:
    """Per super-block ``sum x²`` in order: ``x [nb, 256]`` -> float32 [nb]."""
    return sum0(np.ascontiguousarray((x * x).T))


def _legacy_weights(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``weight[j] = qw[j] * sqrtf(sigma2 + x[j]*x[j])`` with the row's sigma², as [n_rows, n_per_row]."""
    return qw[None, :] * np.sqrt(_row_sigma2(x)[:, None] + x * x)


def _pack_q5_high(L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """5-bit quants [nb, 32] -> (qh uint8 [nb, 4] little-endian u32, qs [nb, 16])."""
    qs = ((L[:, :16] & 0xF) | ((L[:, 16:] & 0xF) << 4)).astype(np.uint8)
    bits = ((L >> 4) & 1).astype(np.uint32)  # value j's fifth bit at bit j (j + 16 for the second half)
    qh = np.bitwise_or.reduce(bits << np.arange(32, dtype=np.uint32)[None, :], axis=1).astype("<u4")
    return qh.view(np.uint8).reshape(-1, 4), qs


def quantize_q4_0_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_0_impl``: -> uint8 [n_rows, n/32 * 18] (d, qs[16])."""
    n_rows = x.shape[0]
    w = _legacy_weights(x, qw)
    d, L = make_qx_quants_rmse1(_sub32(x), 8, _sub32(w))
    L = np.ascontiguousarray(L.T)
    d_b, _ = _f16(d)
    qs = (L[:, :16] | (L[:, 16:] << 4)).astype(np.uint8)
    return np.concatenate([d_b, qs], axis=1).reshape(n_rows, -1)


def quantize_q5_0_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q5_0_impl``: -> uint8 [n_rows, n/32 * 22] (d, qh[4], qs[16])."""
    n_rows = x.shape[0]
    w = _legacy_weights(x, qw)
    d, L = make_qx_quants_rmse1(_sub32(x), 16, _sub32(w))
    d_b, _ = _f16(d)
    qh, qs = _pack_q5_high(np.ascontiguousarray(L.T))
    return np.concatenate([d_b, qh, qs], axis=1).reshape(n_rows, -1)


def _q1_search(x: np.ndarray, qw: np.ndarray, nmax: int):
    w = _legacy_weights(x, qw)
    scale, the_min, L = make_qkx2_quants(_sub32(x), _sub32(w), nmax, -0.9, 0.05, 36, False)
    d_b, _ = _f16(scale)
    m_b, _ = _f16(-the_min)
    return d_b, m_b, np.ascontiguousarray(L.T)


def quantize_q4_1_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_1_impl`` (``make_qkx3_quants`` = make_qkx2's search with given weights):
    -> uint8 [n_rows, n/32 * 20] (d, m, qs[16])."""
    d_b, m_b, L = _q1_search(x, qw, 15)
    qs = (L[:, :16] | (L[:, 16:] << 4)).astype(np.uint8)
    return np.concatenate([d_b, m_b, qs], axis=1).reshape(x.shape[0], -1)


def quantize_q5_1_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q5_1_impl``: -> uint8 [n_rows, n/32 * 24] (d, m, qh[4], qs[16])."""
    d_b, m_b, L = _q1_search(x, qw, 31)
    qh, qs = _pack_q5_high(L)
    return np.concatenate([d_b, m_b, qh, qs], axis=1).reshape(x.shape[0], -1)


def _sub32(v: np.ndarray) -> np.ndarray:
    """Rows -> blocks of 32 transposed: [n_rows, n] -> [32, n_rows * n/32]."""
    return np.ascontiguousarray(v.reshape(-1, 32).T)


def _kblocks(x: np.ndarray, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows -> super-blocks [nb, 256], and the importance weights per super-block [nb, 256]."""
    xb = x.reshape(-1, QK_K)
    qb = np.broadcast_to(qw.reshape(1, -1, QK_K), (x.shape[0], x.shape[1] // QK_K, QK_K)).reshape(-1, QK_K)
    return xb, np.ascontiguousarray(qb, dtype=np.float32)


def _k_weights(xb: np.ndarray, qb: np.ndarray, two: bool) -> np.ndarray:
    """``qw * sqrtf(sigma2 + x*x)`` with the super-block's ``sigma2 = [2*]sum_x2/QK_K``."""
    s = _block_sum_x2(xb)
    sigma2 = (F32(2) * s if two else s) / F32(QK_K)
    return qb * np.sqrt(sigma2[:, None] + xb * xb)


def quantize_q2_k_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q2_K_impl``: -> uint8 [n_rows, n/256 * 84]."""
    xb, qb = _kblocks(x, qw)
    nb = xb.shape[0]
    w = _k_weights(xb, qb, False)
    xs, ws = _sub(xb, 16), _sub(w, 16)
    scales, mins, L = make_qkx2_quants(xs, ws, 3, -0.9, 0.05, 36, False)
    sw = sum0(ws).reshape(nb, 16)
    dm, Ls = _qp_over_blocks(scales.reshape(nb, 16), 15, sw)
    mm, Lm = _qp_over_blocks(mins.reshape(nb, 16), 15, sw)
    d_b, d = _f16(dm)
    m_b, dmin = _f16(mm)
    sc = (Ls | (Lm << 4)).astype(np.uint8)
    dd = d[:, None] * (sc & 0xF).astype(F32)
    dmm = dmin[:, None] * (sc >> 4).astype(F32)
    L = _requant(xb.reshape(nb, 16, 16), dd, dmm, _unsub(L, nb).reshape(nb, 16, 16), 0, 3)
    return np.concatenate([sc, _pack2(L.reshape(nb, QK_K)), d_b, m_b], axis=1).reshape(x.shape[0], -1)


def _qp_over_blocks(v: np.ndarray, nmax: int, sw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """make_qp_quants over each super-block's sub-block values: v, sw [nb, S] -> (scale [nb], L uint8 [nb, S])."""
    scale, L = make_qp_quants(np.ascontiguousarray(v.T), nmax, np.ascontiguousarray(sw.T))
    return scale, np.ascontiguousarray(L.T)


def quantize_q3_k_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q3_K_impl``: -> uint8 [n_rows, n/256 * 110]."""
    xb, qb = _kblocks(x, qw)
    nb = xb.shape[0]
    w = _k_weights(xb, qb, True)
    xs, ws = _sub(xb, 16), _sub(w, 16)
    scales, L = make_qx_quants_rmse1(xs, 4, ws)
    sw = sum0(ws).reshape(nb, 16)
    d_block, Ls = make_qx_quants_rmse1(np.ascontiguousarray(scales.reshape(nb, 16).T), 32,
                                       np.ascontiguousarray(sw.T))
    lq = np.ascontiguousarray(Ls.T)  # 0..63
    s = np.zeros((nb, 12), np.uint8)
    s[:, 0:8] = lq[:, 0:8] & 0xF
    s[:, 0:8] = s[:, 0:8] | ((lq[:, 8:16] & 0xF) << 4).astype(np.uint8)
    hi = lq >> 4
    for j in range(16):
        s[:, 8 + j % 4] = s[:, 8 + j % 4] | (hi[:, j] << (2 * (j // 4))).astype(np.uint8)
    d_b, d = _f16(d_block)
    dd = d[:, None] * (lq.astype(np.int32) - 32).astype(F32)
    Lb = _requant(xb.reshape(nb, 16, 16), dd, np.zeros_like(dd), _unsub(L, nb).reshape(nb, 16, 16), -4, 3, 4)
    Lb = Lb.reshape(nb, QK_K)
    high = Lb > 3
    Lb = np.where(high, Lb - 4, Lb).astype(np.uint8)
    hm = high.reshape(nb, 8, 32).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]
    hmask = np.bitwise_or.reduce(hm, axis=1)
    return np.concatenate([hmask, _pack2(Lb), s, d_b], axis=1).reshape(x.shape[0], -1)


def _q45_k_w(x: np.ndarray, qw: np.ndarray, nmax: int, clamp: bool):
    xb, qb = _kblocks(x, qw)
    nb = xb.shape[0]
    w = _k_weights(xb, qb, True)
    xs, ws = _sub(xb, 32), _sub(w, 32)
    scales, mins, L = make_qkx2_quants(xs, ws, nmax, -0.9, 0.05, 36, False)
    sw = sum0(ws).reshape(nb, 8)
    d_block, Ls = _qp_over_blocks(scales.reshape(nb, 8), 63, sw)
    m_block, Lm = _qp_over_blocks(mins.reshape(nb, 8), 63, sw)
    if clamp:
        Ls, Lm = np.minimum(Ls, 63), np.minimum(Lm, 63)
    packed = _pack_scale_min_k4(Ls, Lm)
    d_b, d = _f16(d_block)
    m_b, dmin = _f16(m_block)
    # the read-back of get_scale_min_k4 keeps 6 bits
    dd = d[:, None] * (Ls & 63).astype(F32)
    dmm = dmin[:, None] * (Lm & 63).astype(F32)
    L = _requant(xb.reshape(nb, 8, 32), dd, dmm, _unsub(L, nb).reshape(nb, 8, 32), 0, nmax).reshape(nb, QK_K)
    return d_b, m_b, packed, L


def quantize_q4_k_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_K_impl``: -> uint8 [n_rows, n/256 * 144]."""
    d_b, m_b, packed, L = _q45_k_w(x, qw, 15, False)
    q = L.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([d_b, m_b, packed, qs], axis=1).reshape(x.shape[0], -1)


def quantize_q5_k_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q5_K_impl``: -> uint8 [n_rows, n/256 * 176]."""
    d_b, m_b, packed, L = _q45_k_w(x, qw, 31, True)
    q = L.reshape(-1, 4, 2, 32)
    hi = (q >> 4).astype(np.uint8)
    lo = q & 0xF
    qs = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    qh = np.bitwise_or.reduce((hi[:, :, 0] << shifts) | (hi[:, :, 1] << (shifts + 1)), axis=1)
    return np.concatenate([d_b, m_b, packed, qh, qs], axis=1).reshape(x.shape[0], -1)


def quantize_q6_k_w(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """``quantize_row_q6_K_impl`` (``make_qx_quants`` weighted by ``qw`` itself): -> uint8 [n_rows, n/256 * 210]."""
    xb, qb = _kblocks(x, qw)
    return quantize_q6_k(xb, qb).reshape(x.shape[0], -1)

