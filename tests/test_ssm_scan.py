"""``ssm_scan`` (Mamba-2's selective scan with a carried state, the dt bias and the D skip) and the small
ops of a Mamba-2 layer (``ssm_norm``: the gated grouped RMS norm; ``scale``: Granite's multipliers) on
numpy against plain loops written from ggml's formulas (ggml-cpu/ops.cpp ``ggml_compute_forward_ssm_scan_f32``,
the Mamba-2 branch; ggml-impl.h ``ggml_compute_softplus_f32``; llama.cpp src/models/mamba-base.cpp
``build_mamba2_layer``), at odd shapes: one token, many tokens, head widths and state sizes that are no
power of two, heads sharing a group, several sequences' rows interleaved in one call and a state carried
across two calls. The OpenCL kernels (``kernels/recurrent.cl``) and the Vulkan shaders
(``glsl/ssm_scan.comp``, ``ssm_norm.comp``, ``scale.comp``) against numpy at the same shapes and at the
real ones (heads of 64, a state of 128), in place and on head views."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends.cpu.device import CpuBackend
from cooktop.backends.optable import RECURRENT_OPS
from cooktop.errors import ShapeError


@pytest.fixture(scope="module")
def dev():
    return CpuBackend().open(0)


@pytest.fixture(scope="module", params=["opencl", "vulkan"])
def gpu(request):
    """Each device family with recurrent kernels (OpenCL ``kernels/recurrent.cl``, Vulkan ``glsl/``)."""
    from conftest import open_family_device
    return open_family_device(request.param)


def softplus(x):
    """ggml-impl.h ``ggml_compute_softplus_f32`` (in float64)."""
    return x if x > 20.0 else math.log(1.0 + math.exp(x))


def loop_scan(xbc, dt, a, d_skip, dt_bias, state, slots, h, p, g, ns):
    """The Mamba-2 scan row by row, head by head, element by element, in float64, on ggml's state
    ``S[h, p, n]``: for each row ``t`` of slot ``s`` (head ``hd`` reads group ``hd // (h / g)``)::

        dt' = softplus(dt[t, hd] + dt_bias[hd]); dA = exp(dt' * a[hd])
        S[hd, j, i] = S[hd, j, i] * dA + B[t, grp, i] * x[t, hd, j] * dt'
        out[t, hd, j] = sum_i S[hd, j, i] * C[t, grp, i] + x[t, hd, j] * d[hd]
    """
    n = len(slots)
    d_inner = h * p
    st = np.asarray(state, np.float64).reshape(state.shape[0], h, p, ns).copy()
    out = np.zeros((n, d_inner))
    for t in range(n):
        s = int(slots[t])
        for hd in range(h):
            grp = hd // (h // g)
            sp = softplus(float(dt[t, hd]) + float(dt_bias[hd]))
            da = math.exp(sp * float(a[hd, 0]))
            for j in range(p):
                x = float(xbc[t, hd * p + j])
                acc = 0.0
                for i in range(ns):
                    b = float(xbc[t, d_inner + grp * ns + i])
                    c = float(xbc[t, d_inner + g * ns + grp * ns + i])
                    st[s, hd, j, i] = st[s, hd, j, i] * da + b * x * sp
                    acc += st[s, hd, j, i] * c
                out[t, hd * p + j] = acc + x * float(d_skip[hd, 0])
    return out, st.reshape(state.shape[0], -1)


def loop_ssm_norm(y, z, w, eps):
    """``ggml_swiglu_split(z, y)`` then ``build_norm`` (RMS) over each group of ``w.shape[1]`` values times ``w``."""
    out = np.zeros(y.shape)
    n_g, gw = w.shape
    for r in range(y.shape[0]):
        for j in range(n_g):
            v = [float(y[r, j * gw + i]) * float(z[r, j * gw + i]) / (1.0 + math.exp(-float(z[r, j * gw + i])))
                 for i in range(gw)]
            ms = sum(a * a for a in v) / gw
            out[r, j * gw:(j + 1) * gw] = [a / math.sqrt(ms + eps) * float(w[j, i]) for i, a in enumerate(v)]
    return out


# -- running an op on a device ----------------------------------------------------------------
def _tensor(d, buf, a, rows=None):
    """A tensor holding ``a``; with ``rows``, the head view of a taller one (a batch buffer's chunk)."""
    ty = T.I32 if a.dtype == np.int32 else T.F32
    t = buf.empty(((rows or a.shape[0]),) + a.shape[1:], ty)
    v = t.head(a.shape[0]) if rows else t
    d.write(v, a)
    return v


def run_scan(d, xbc, dt, a, d_skip, dt_bias, state, slots, d_inner, rows=None):
    """``ssm_scan`` on ``d`` (``d_inner`` = heads x head width): (out, the new state)."""
    buf = d.buffer("scan")
    try:
        n = xbc.shape[0]
        tx, tdt = (_tensor(d, buf, np.asarray(v, np.float32), rows) for v in (xbc, dt))
        ta, td, tb = (_tensor(d, buf, np.asarray(v, np.float32)) for v in (a, d_skip, dt_bias))
        ts, tsl = _tensor(d, buf, np.asarray(state, np.float32)), _tensor(d, buf, np.asarray(slots, np.int32), rows)
        to = buf.empty(((rows or n), d_inner))
        to = to.head(n) if rows else to
        d.ssm_scan(to, tx, tdt, ta, td, tb, ts, tsl)
        return d.read(to), d.read(ts)
    finally:
        buf.release()


def scan_inputs(rng, n, h, p, g, ns, n_slots=3):
    """Inputs as build_mamba2_layer makes them: xBC after silu, dt before its bias, a = -exp(A_log) < 0,
    D about 1, and a state of the scale a prompt leaves."""
    d_inner = h * p
    xbc = rng.normal(size=(n, d_inner + 2 * g * ns)).astype(np.float32)
    xbc = (xbc / (1.0 + np.exp(-xbc))).astype(np.float32)
    dt = (rng.normal(size=(n, h)) * 2.0).astype(np.float32)
    a = -rng.uniform(0.05, 3.0, size=(h, 1)).astype(np.float32)
    d_skip = (1.0 + rng.normal(size=(h, 1)) * 0.1).astype(np.float32)
    dt_bias = rng.normal(size=h).astype(np.float32)
    state = (rng.normal(size=(n_slots, d_inner * ns)) * 0.3).astype(np.float32)
    return xbc, dt, a, d_skip, dt_bias, state


CASES = [  # (name, n tokens, heads, head width, groups, state size, slots of the rows)
    ("one token", 1, 1, 4, 1, 4, [0]),
    ("many tokens", 37, 2, 4, 1, 6, [1] * 37),
    ("odd widths", 5, 3, 5, 1, 7, [0] * 5),
    ("heads share a group", 4, 6, 4, 2, 8, [0, 0, 1, 1]),
    ("interleaved", 6, 4, 6, 4, 5, [2, 2, 0, 1, 0, 2]),
]


@pytest.mark.parametrize("name,n,h,p,g,ns,slots", CASES, ids=[c[0] for c in CASES])
def test_ssm_scan_matches_the_loop(dev, name, n, h, p, g, ns, slots):
    rng = np.random.default_rng(n * 31 + p)
    xbc, dt, a, d_skip, dt_bias, state = scan_inputs(rng, n, h, p, g, ns)
    dt[0, 0] = 30.0  # softplus's linear branch
    out, st = run_scan(dev, xbc, dt, a, d_skip, dt_bias, state, slots, h * p)
    want_out, want_st = loop_scan(xbc, dt, a, d_skip, dt_bias, state, slots, h, p, g, ns)
    np.testing.assert_allclose(out, want_out, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(st, want_st, rtol=2e-5, atol=2e-6)
    untouched = sorted(set(range(state.shape[0])) - set(slots))
    np.testing.assert_array_equal(st[untouched], state[untouched])


def test_state_carried_across_two_calls_equals_one_call(dev):
    rng = np.random.default_rng(5)
    xbc, dt, a, d_skip, dt_bias, state = scan_inputs(rng, 23, 4, 6, 2, 8, n_slots=2)
    whole, st_whole = run_scan(dev, xbc, dt, a, d_skip, dt_bias, state, [1] * 23, 24)
    first, st = run_scan(dev, xbc[:10], dt[:10], a, d_skip, dt_bias, state, [1] * 10, 24)
    second, st2 = run_scan(dev, xbc[10:], dt[10:], a, d_skip, dt_bias, st, [1] * 13, 24)
    np.testing.assert_array_equal(np.concatenate([first, second]), whole)  # the same float32 steps
    np.testing.assert_array_equal(st2, st_whole)
    fresh, _ = run_scan(dev, xbc[10:], dt[10:], a, d_skip, dt_bias, state, [1] * 13, 24)
    assert not np.allclose(fresh[0], second[0])  # the state matters


def test_small_ops_match_the_formulas(dev):
    rng = np.random.default_rng(3)
    y = (rng.normal(size=(3, 24)) * 2).astype(np.float32)
    z = (rng.normal(size=(3, 24)) * 3).astype(np.float32)
    z[0, :2] = (-100.0, 100.0)  # exp overflows: silu -0 / z
    buf = dev.buffer("t")
    ty, tz, to = _tensor(dev, buf, y), _tensor(dev, buf, z), buf.empty((3, 24))
    for n_g in (1, 2, 3):
        w = (1.0 + rng.normal(size=(n_g, 24 // n_g)) * 0.1).astype(np.float32)
        dev.ssm_norm(to, ty, tz, _tensor(dev, buf, w), 1e-5)
        np.testing.assert_allclose(dev.read(to), loop_ssm_norm(y, z, w, 1e-5), rtol=2e-6, atol=1e-7)
    dev.scale(to, ty, 0.22)
    np.testing.assert_array_equal(dev.read(to), y * np.float32(0.22))
    buf.release()


def test_shape_errors(dev):
    buf = dev.buffer("t")
    out, dt, sl = buf.empty((3, 8)), buf.empty((3, 2)), buf.empty((3,), T.I32)
    a, dt_b = buf.empty((2, 1)), buf.empty((2,))
    with pytest.raises(ShapeError, match="ssm_scan"):  # 2 heads of 4, state 4: 32 wide
        dev.ssm_scan(out, buf.empty((3, 16)), dt, a, a, dt_b, buf.empty((2, 31)), sl)
    with pytest.raises(ShapeError, match="ssm_scan"):  # 3 groups do not divide 2 heads
        dev.ssm_scan(out, buf.empty((3, 8 + 24)), dt, a, a, dt_b, buf.empty((2, 32)), sl)
    with pytest.raises(ShapeError, match="ssm_scan"):  # a [2] where ggml's is {1, n_head}
        dev.ssm_scan(out, buf.empty((3, 16)), dt, dt_b, a, dt_b, buf.empty((2, 32)), sl)
    with pytest.raises(ShapeError, match="ssm_norm"):
        dev.ssm_norm(out, out, out, buf.empty((3, 3)), 1e-5)
    buf.release()


def test_recurrent_ops_cover_the_mamba2_layer():
    assert {"ssm_conv", "silu", "ssm_scan", "ssm_norm", "scale"} <= set(RECURRENT_OPS)


# -- the device kernels against numpy ------------------------------------------------------------
GPU_CASES = CASES + [("real widths", 5, 4, 64, 1, 128, [0, 0, 1, 0, 1]), ("real many tokens", 37, 2, 64, 2, 128,
                                                                          [2] * 37)]


@pytest.mark.parametrize("name,n,h,p,g,ns,slots", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_device_ssm_scan_matches_numpy(dev, gpu, name, n, h, p, g, ns, slots):
    assert set(RECURRENT_OPS) <= set(gpu.info.ops)
    rng = np.random.default_rng(n * 7 + p)
    xbc, dt, a, d_skip, dt_bias, state = scan_inputs(rng, n, h, p, g, ns)
    dt[0, 0] = 30.0
    out, st = run_scan(gpu, xbc, dt, a, d_skip, dt_bias, state, slots, h * p, rows=n + 3)
    want_out, want_st = run_scan(dev, xbc, dt, a, d_skip, dt_bias, state, slots, h * p)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, want_st, rtol=1e-5, atol=1e-5)


def test_device_state_across_two_calls(dev, gpu):
    rng = np.random.default_rng(9)
    xbc, dt, a, d_skip, dt_bias, state = scan_inputs(rng, 17, 3, 16, 1, 16, n_slots=2)
    whole, st_whole = run_scan(dev, xbc, dt, a, d_skip, dt_bias, state, [0] * 17, 48)
    first, st = run_scan(gpu, xbc[:6], dt[:6], a, d_skip, dt_bias, state, [0] * 6, 48)
    second, st = run_scan(gpu, xbc[6:], dt[6:], a, d_skip, dt_bias, st, [0] * 11, 48)
    np.testing.assert_allclose(np.concatenate([first, second]), whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, st_whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,width,n_g", [(1, 4096, 1), (7, 60, 3), (5, 36, 2), (3, 8, 1)])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_device_small_ops_match_numpy(dev, gpu, n, width, n_g, in_place):
    rng = np.random.default_rng(n * width)
    y = (rng.normal(size=(n, width)) * 2).astype(np.float32)
    z = (rng.normal(size=(n, width)) * 3).astype(np.float32)
    z[0, :2] = (-100.0, 100.0)
    w = (1.0 + rng.normal(size=(n_g, width // n_g)) * 0.1).astype(np.float32)

    def ops(d):
        buf = d.buffer("small")
        try:
            rows = n + 2
            ty, tz = _tensor(d, buf, y, rows), _tensor(d, buf, z, rows)
            to = ty if in_place else buf.empty((rows, width)).head(n)
            d.ssm_norm(to, ty, tz, _tensor(d, buf, w), 1e-5)
            got = [d.read(to)]
            tx = _tensor(d, buf, z, rows)
            to = tx if in_place else buf.empty((rows, width)).head(n)
            d.scale(to, tx, 1.0 / 6.0)
            return got + [d.read(to)]
        finally:
            buf.release()

    for got, want in zip(ops(gpu), ops(dev)):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
