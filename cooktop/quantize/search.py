"""The scale searches of llama.cpp's K-quant reference quantizers, in float32 numpy, bit for bit.

Source: ggml/src/ggml-quants.c (``nearest_int``, ``make_qx_quants``, ``make_q3_quants``,
``make_qkx2_quants``). Each function takes many groups at once, laid out **transposed**:
``x: float32 [n, M]``, one group of ``n`` values (16 or 32) per column, so that the C loops over a
group's values (``for (int i = 0; i < n; ++i) sum += ...``) become ``n`` vector operations over the
``M`` columns, in the same order. Bit-exactness rests on three facts of the reference build (ggml-base
is compiled without ``-march=native`` and without ``-ffast-math``): every operation is an IEEE float32
operation (SSE, no x87 excess precision), sums run left to right from ``0.0f`` (no reassociation),
and ``a*b + c`` is not fused into an FMA. The float32 scalars here are ``np.float32`` so that no
intermediate becomes float64.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
#: GROUP_MAX_EPS (ggml-quants.c): a group whose largest magnitude is below it quantizes to zero.
GROUP_MAX_EPS = F32(1e-15)
_MAGIC = F32(12582912.0)  # 1.5 * 2^23


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: round float32 to int32 with its bit trick (``v + 1.5*2^23``, mantissa bits).

    Equal to round-half-even for ``|v| <= 4194303``; outside that range it reproduces the trick's
    wrapped values too (the reference only asserts the range in debug builds).

    Args:
        v: float32, any shape.

    Returns:
        int32, same shape.
    """
    b = (np.asarray(v, dtype=F32) + _MAGIC).view(np.int32)
    return (b & 0x007FFFFF) - 0x00400000


def sum0(terms: np.ndarray) -> np.ndarray:
    """``float s = 0; for (i...) s += terms[i];`` over axis 0 of ``terms: float32 [n, M]`` -> ``[M]``.

    numpy reduces a non-inner axis row by row (pairwise summation applies only along the contiguous
    inner axis), so this is the C loop's order; ``initial=0`` gives its ``0.0f + t0`` start.
    """
    return np.add.reduce(terms, axis=0, initial=F32(0))


def make_qx_quants_rmse1(x: np.ndarray, nmax: int, qw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants(n, nmax, x, L, rmse_type=1, qw)``: symmetric scale search, weights ``qw`` (None: x²).

    Args:
        x: float32 [n, M], one group per column.
        nmax: levels below zero (Q6_K: 32); quants are ``l + nmax`` in ``[0, 2*nmax)``.
        qw: float32 [n, M] weights (importance-matrix paths), or None.

    Returns:
        (scale float32 [M], L uint8 [n, M]).
    """
    n, m = x.shape
    ax = np.abs(x)
    imax = np.argmax(ax, axis=0)  # first of the largest magnitudes, as the strict '>' scan
    cols = np.arange(m)
    amax = ax[imax, cols]
    vmax = x[imax, cols]
    zero = amax < GROUP_MAX_EPS
    safe_max = np.where(zero, F32(1), vmax)
    w = x * x if qw is None else qw
    fnmax = F32(nmax)

    wx = w * x

    def trial(iscale):
        lv = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = lv.astype(F32)
        return lv, sum0(wx * lf), sum0((w * lf) * lf)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = -fnmax / safe_max
        lv, sumlx, suml2 = trial(iscale)
        L = (lv + nmax).astype(np.uint8)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(fnmax + F32(0.1) * F32(step)) / safe_max
            lv, sumlx, suml2 = trial(iscale)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            if better.any():
                L = np.where(better, (lv + nmax).astype(np.uint8), L)
                new_scale = sumlx / suml2
                scale = np.where(better, new_scale, scale)
                best = np.where(better, new_scale * sumlx, best)
    L[:, zero] = 0
    scale = np.where(zero, F32(0), scale).astype(F32)
    return scale, L


def make_q3_quants_rmse(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants(n, nmax, x, L, do_rmse=true)``: scale search with 5 passes of per-value moves.

    Args:
        x: float32 [n, M].
        nmax: 4 (Q3_K); quants are ``l + nmax`` in ``[0, 2*nmax)``.

    Returns:
        (scale float32 [M], L uint8 [n, M]).
    """
    n, m = x.shape
    ax = np.abs(x)
    imax = np.argmax(ax, axis=0)
    cols = np.arange(m)
    amax = ax[imax, cols]
    vmax = x[imax, cols]
    zero = amax < GROUP_MAX_EPS
    safe_max = np.where(zero, F32(1), vmax)
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = -F32(nmax) / safe_max
        L = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        Lf = L.astype(F32)
        sumlx = sum0(wx * Lf)
        suml2 = sum0((w * Lf) * Lf)
        # a group that changed nothing in a pass would change nothing in the next: running all
        # 5 passes for every group equals the reference's early break
        for _ in range(5):
            for i in range(n):
                li = L[i].astype(F32)
                slx = sumlx - wx[i] * li
                pos = slx > 0
                sl2 = suml2 - (w[i] * li) * li
                new_l = np.clip(nearest_int((x[i] * sl2) / np.where(pos, slx, F32(1))), -nmax, nmax - 1)
                cand = pos & (new_l != L[i])
                nf = new_l.astype(F32)
                slx2 = slx + wx[i] * nf
                sl22 = sl2 + (w[i] * nf) * nf
                take = cand & (sl22 > 0) & ((slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22)
                L[i] = np.where(take, new_l, L[i])
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, F32(1)), F32(0)).astype(F32)
    Lq = (L + nmax).astype(np.uint8)
    Lq[:, zero] = 0
    scale = np.where(zero, F32(0), scale).astype(F32)
    return scale, Lq


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
                     use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants``: asymmetric (scale, min) search over ``nstep + 1`` trial scales, weighted.

    Args:
        x: float32 [n, M].
        w: float32 [n, M], the weights.
        nmax: top level (Q2_K 3, Q4_K 15, Q5_K 31); quants in ``[0, nmax]``.
        rmin, rdelta, nstep: the trials ``iscale = (rmin + rdelta*is + nmax) / (max - min)``, is = 0..nstep.
        use_mad: absolute instead of squared error.

    Returns:
        (scale float32 [M], the_min float32 [M] (``-min``, >= 0), L uint8 [n, M]).
    """
    n, m = x.shape
    vmin = np.minimum(x.min(axis=0), F32(0))
    vmax = x.max(axis=0)
    flat = vmax == vmin
    rng = np.where(flat, F32(1), vmax - vmin)
    # the reference starts these two sums from the first value, not from 0
    sum_w = np.add.reduce(w, axis=0)
    sum_x = np.add.reduce(w * x, axis=0)
    fnmax = F32(nmax)

    def err_of(scale, mn, lf):
        d = scale[None, :] * lf  # ((scale*l) + min) - x, then |d| or d*d, times w: in place, same order
        d += mn[None, :]
        d -= x
        if use_mad:
            np.abs(d, out=d)
        else:
            d *= d
        d *= w
        return sum0(d)

    def levels(iscale, xm):
        """clamp(nearest_int(iscale * (x - min)), 0, nmax) as (int32, float32), ops in place."""
        v = iscale[None, :] * xm
        v += _MAGIC
        b = v.view(np.int32)
        b &= 0x007FFFFF
        b -= 0x00400000
        np.clip(b, 0, nmax, out=b)
        return b, b.astype(F32)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = fnmax / rng
        scale = (F32(1) / iscale).astype(F32)
        xm = x - vmin[None, :]
        L, lf0 = levels(iscale, xm)
        best = err_of(scale, vmin, lf0)
        mn = vmin.copy()
        for step in range(nstep + 1):
            # the reference reuses 'min' for the trials: a better trial moves the later ones' origin and range
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + fnmax) / np.where(flat, F32(1), vmax - mn)
            la, lf = levels(iscale, xm)
            wl = w * lf
            sum_l = sum0(wl)
            sum_xl = sum0(wl * x)
            wl *= lf
            sum_l2 = sum0(wl)
            D = sum_w * sum_l2 - sum_l * sum_l
            ok = D > 0
            Ds = np.where(ok, D, F32(1))
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
            clamp = this_min > 0
            if clamp.any():
                this_min = np.where(clamp, F32(0), this_min)
                this_scale = np.where(clamp, sum_xl / np.where(clamp, sum_l2, F32(1)), this_scale)
            cur = err_of(this_scale, this_min, lf)
            take = ok & (cur < best)
            if take.any():
                L = np.where(take, la, L)
                best = np.where(take, cur, best)
                scale = np.where(take, this_scale, scale)
                mn = np.where(take, this_min, mn)
                xm = x - mn[None, :]
    L = L.astype(np.uint8)
    L[:, flat] = 0
    scale = np.where(flat, F32(0), scale).astype(F32)
    mn = np.where(flat, vmin, mn)
    return scale, (-mn).astype(F32), L


def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_qp_quants``: a positive-only scale for the super-block scales and mins (importance-matrix paths).

    Args:
        x: float32 [n, M], values >= 0 (sub-block scales or mins), one group per column.
        nmax: top level (63 for Q4_K/Q5_K, 15 for Q2_K).
        qw: float32 [n, M], the weights (sums of the sub-blocks' weights).

    Returns:
        (scale float32 [M], L uint8 [n, M]); levels are stored in ``uint8_t`` as the reference does.
    """
    n, m = x.shape
    vmax = np.maximum(x.max(axis=0), F32(0))
    zero = vmax < GROUP_MAX_EPS
    safe_max = np.where(zero, F32(1), vmax)
    fnmax = F32(nmax)
    wx = qw * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = fnmax / safe_max
        l0 = (nearest_int(iscale * x) & 0xFF).astype(F32)
        scale = F32(1) / iscale
        d = x - scale * l0
        best = sum0((qw * d) * d)
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (F32(0.1) * F32(step) + fnmax) / safe_max
            scale_is = F32(1) / iscale_is
            lv = np.minimum(nmax, nearest_int(iscale_is * x)).astype(F32)
            d = x - scale_is * lv
            mse = sum0((qw * d) * d)
            better = mse < best
            best = np.where(better, mse, best)
            iscale = np.where(better, iscale_is, iscale)
        li = np.minimum(nmax, nearest_int(iscale * x))
        L = li & 0xFF  # uint8_t L[i] = l
        Lf = L.astype(F32)
        sumlx = sum0(wx * li.astype(F32))
        suml2 = sum0((qw * li.astype(F32)) * li.astype(F32))
        for _ in range(5):
            for i in range(n):
                slx = sumlx - wx[i] * Lf[i]
                sl2 = suml2 - (qw[i] * Lf[i]) * Lf[i]
                ok = (slx > 0) & (sl2 > 0)
                new_l = np.minimum(nmax, nearest_int((x[i] * sl2) / np.where(ok, slx, F32(1))))
                cand = ok & (new_l != L[i])
                nf = new_l.astype(F32)
                slx2 = slx + wx[i] * nf
                sl22 = sl2 + (qw[i] * nf) * nf
                take = cand & ((slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22)
                L[i] = np.where(take, new_l & 0xFF, L[i])
                Lf[i] = L[i].astype(F32)
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, F32(1)), F32(0)).astype(F32)
    L = L.astype(np.uint8)
    L[:, zero] = 0
    return np.where(zero, F32(0), scale).astype(F32), L
