"""llama.cpp's IQ4_NL and IQ4_XS quantizers (non-linear 4-bit levels) in numpy, bit for bit.

Source: ggml/src/ggml-quants.c ``quantize_row_iq4_nl_impl`` as ``quantize_iq4_nl`` / ``quantize_iq4_xs`` call it
(what ``ggml_quantize_chunk`` runs: 7 trial scales each side, with or without an importance matrix),
``best_index_int8``, the table ``kvalues_iq4nl`` (ggml-common.h) and the blocks ``block_iq4_nl`` (d, qs[16])
and ``block_iq4_xs`` (d, scales_h, scales_l[4], qs[128]). Values of a block of 32 are columns of ``[32, M]``
arrays as in :mod:`.search`.
"""

from __future__ import annotations

import numpy as np

from .search import F32, GROUP_MAX_EPS, nearest_int, sum0

#: kvalues_iq4nl (ggml-common.h).
VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_VF = VALUES.astype(F32)
NTRY = 7


# The levels are integers, so v <= x exactly when v <= floor(x): the bracket [v[mu-1], v[mu]) of x comes from
# a table indexed by floor(x) (clamped to [-128, 114]), with mu clamped to [1, 15]; the choice between the
# two is best_index_int8's own float comparison. Below v[0] or above v[15] that comparison already picks
# the end level, so the function's early returns need no separate test.
_FLOORS = np.arange(-128, 115)
_MU = np.clip(np.searchsorted(_VF, _FLOORS.astype(F32), side="right"), 1, 15).astype(np.int32)
_LO = _VF[_MU - 1]
_HI = _VF[_MU]


def _bracket(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    f = np.floor(x)
    np.clip(f, -128, 114, out=f)
    k = f.astype(np.int32)
    k += 128
    lo, hi = _LO[k], _HI[k]
    return k, lo, hi, (x - lo) < (hi - x)


def best_index(x: np.ndarray) -> np.ndarray:
    """``best_index_int8(16, kvalues_iq4nl, x)``: the nearest level's index (ties to the upper one), int32."""
    k, _, _, lower = _bracket(x)
    return _MU[k] - lower


def best_value(x: np.ndarray) -> np.ndarray:
    """``kvalues_iq4nl[best_index_int8(16, kvalues_iq4nl, x)]`` as float32."""
    _, lo, hi, lower = _bracket(x)
    return np.where(lower, lo, hi)


def _block_scales(xb: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The per-32 scale search: ``xb, w: float32 [32, M]`` -> scales float32 [M] (0 for an all-zero block)."""
    ax = np.abs(xb)
    imax = np.argmax(ax, axis=0)
    cols = np.arange(xb.shape[1])
    amax = ax[imax, cols]
    vmax = xb[imax, cols]
    zero = amax < GROUP_MAX_EPS
    safe_max = np.where(zero, F32(1), vmax)
    v0 = F32(VALUES[0])

    def sums(iscale):
        q = best_value(iscale[None, :] * xb)
        wq = w * q
        return sum0(wq * xb), sum0(wq * q)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = -safe_max / v0
        sumqx, sumq2 = sums(F32(1) / d)
        d = np.where(sumq2 > 0, sumqx / np.where(sumq2 > 0, sumq2, F32(1)), F32(0)).astype(F32)
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            sumqx, sumq2 = sums(F32(itry + int(VALUES[0])) / safe_max)
            take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            if take.any():
                nd = sumqx / np.where(take, sumq2, F32(1))
                d = np.where(take, nd, d)
                best = np.where(take, nd * sumqx, best)
    return np.where(zero, F32(0), d).astype(F32)


def _weights(x: np.ndarray, sbs: int, qw: np.ndarray | None) -> np.ndarray:
    """x² without an importance matrix, else ``qw * sqrtf(sigma2 + x²)`` with ``sigma2 = sum x² * (2/sbs)``
    over each super-block of ``sbs`` values: x [nb, sbs] -> [nb, sbs]."""
    if qw is None:
        return x * x
    s = sum0(np.ascontiguousarray((x * x).T)) * F32(2.0 / sbs)
    return qw * np.sqrt(s[:, None] + x * x)


def _pack(L: np.ndarray) -> np.ndarray:
    """Levels [nb, n] -> qs [nb, n/2]: per 32, byte j holds L[j] | L[j+16] << 4."""
    q = L.reshape(L.shape[0], -1, 2, 16).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(L.shape[0], -1)


def quantize_iq4_nl(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """``quantize_iq4_nl``: ``x float32 [n_rows, n]`` (n a multiple of 32), ``qw`` float32 [n] or None ->
    ``uint8 [n_rows, n/32 * 18]``."""
    n_rows, n = x.shape
    xb = x.reshape(-1, 32)
    w = _weights(xb, 32, None if qw is None else np.tile(qw.reshape(-1, 32), (n_rows, 1)))
    xt = np.ascontiguousarray(xb.T)
    scale = _block_scales(xt, np.ascontiguousarray(w.T))
    d_b = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    with np.errstate(divide="ignore"):
        inv = np.where(scale != 0, F32(1) / np.where(scale != 0, scale, F32(1)), F32(0))
    L = best_index(inv[:, None] * xb)
    return np.concatenate([d_b, _pack(L)], axis=1).reshape(n_rows, -1)


def quantize_iq4_xs(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """``quantize_iq4_xs``: ``x float32 [n_rows, n]`` (n a multiple of 256), ``qw`` float32 [n] or None ->
    ``uint8 [n_rows, n/256 * 136]``."""
    n_rows, n = x.shape
    xs = x.reshape(-1, 256)
    nb = xs.shape[0]
    qb = None if qw is None else np.tile(qw.reshape(-1, 256), (n_rows, 1))
    w = _weights(xs, 256, qb)
    scales = _block_scales(np.ascontiguousarray(xs.reshape(-1, 32).T),
                           np.ascontiguousarray(w.reshape(-1, 32).T)).reshape(nb, 8)
    a = np.abs(scales)
    max_scale = np.where(a.max(axis=1) > 0, scales[np.arange(nb), np.argmax(a, axis=1)], F32(0))
    d = -max_scale / F32(32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0))
        ls = np.clip(nearest_int(inv[:, None] * scales), -32, 31)
        dl = d[:, None] * ls.astype(F32)
        idl = np.where(dl != 0, F32(1) / np.where(dl != 0, dl, F32(1)), F32(0))
    L = best_index(idl[:, :, None] * xs.reshape(nb, 8, 32)).reshape(nb, 256)
    lq = (ls + 32).astype(np.uint16)
    scales_l = ((lq[:, 0::2] & 0xF) | ((lq[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    scales_h = np.bitwise_or.reduce((lq >> 4) << (2 * np.arange(8, dtype=np.uint16))[None, :], axis=1)
    d_b = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    sh = scales_h.astype("<u2").view(np.uint8).reshape(-1, 2)
    return np.concatenate([d_b, sh, scales_l, _pack(L)], axis=1).reshape(n_rows, -1)
