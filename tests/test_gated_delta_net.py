"""``gated_delta_net`` (the gated delta rule with a carried state) and the small ops around it
(``silu``, ``sigmoid_mul``, ``l2_norm``, ``gdn_gate``) on numpy against plain loops written from
ggml's formulas (ggml-cpu/ops.cpp ``ggml_compute_forward_gated_delta_net_one_chunk``, unary-ops.cpp
``op_softplus`` / ``op_sigmoid``, llama.cpp src/models/models.h ``build_gdn_l2_norm``), at odd shapes:
one token, many tokens, head widths that are no power of two, key heads shared by value heads,
several sequences' rows interleaved in one call and a state carried across two chunks.
The OpenCL kernels (``kernels/recurrent.cl``) and the Vulkan shaders (``glsl/gated_delta_net.comp``,
``gdn_gate.comp``, ``l2_norm.comp``, ``silu.comp``, ``sigmoid_mul.comp``) against numpy at the same
shapes and at the real head width (d = 128), in place and on head views, OpenCL's at GPU launch
shapes, and a block's decode steps recorded and replayed as a graph."""

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


# -- references: plain loops from ggml's formulas (float64) -------------------------------------
def loop_gdn(q, k, v, g, beta, state, slots, h_k, h_v, d, interleaved=False):
    """The gated delta rule row by row, head by head, element by element, on ggml's state
    ``S_h[i][j]`` (the tensor's ``M[h, j, i]``), in float64: for each row ``t`` of slot ``s``::

        S_h = exp(g[t, h]) * S_h
        u[j] = (v[t, h, j] - sum_i S_h[i][j] k[t, h', i]) * beta[t, h]
        S_h[i][j] += k[t, h', i] u[j]
        out[t, h, j] = sum_i S_h[i][j] q[t, h', i] / sqrt(d)      (h' = h mod H_k)

    With ``interleaved``, ``h' = h // (H_v / H_k)`` (llama.cpp src/models/qwen3next.cpp repeats q and k
    interleaved: ``ggml_repeat_4d`` of a ``[d, 1, H_k]`` view).
    """
    n = len(slots)
    st = [[[[float(x) for x in row] for row in np.asarray(state[s], np.float64).reshape(h_v, d, d)[h].T]
           for h in range(h_v)] for s in range(state.shape[0])]  # st[s][h][i][j] = S_h[i][j]
    out = np.zeros((n, h_v * d))
    scale = 1.0 / math.sqrt(d)
    for t in range(n):
        s = int(slots[t])
        for h in range(h_v):
            hk = h // (h_v // h_k) if interleaved else h % h_k
            kk = [float(k[t, hk * d + i]) for i in range(d)]
            qq = [float(q[t, hk * d + i]) for i in range(d)]
            S = st[s][h]
            decay = math.exp(float(g[t, h]))
            for i in range(d):
                for j in range(d):
                    S[i][j] *= decay
            u = [(float(v[t, h * d + j]) - sum(S[i][j] * kk[i] for i in range(d))) * float(beta[t, h])
                 for j in range(d)]
            for i in range(d):
                for j in range(d):
                    S[i][j] += kk[i] * u[j]
            for j in range(d):
                out[t, h * d + j] = sum(S[i][j] * qq[i] for i in range(d)) * scale
    new = np.array([[np.array(st[s][h]).T for h in range(h_v)] for s in range(state.shape[0])])
    return out, new.reshape(state.shape[0], -1)


def loop_l2_norm(x, group, eps):
    """``build_gdn_l2_norm``: rms_norm with eps / group, then a scale by 1 / sqrt(group), per group."""
    out = np.zeros(x.shape)
    for r in range(x.shape[0]):
        for c0 in range(0, x.shape[1], group):
            xs = [float(a) for a in x[r, c0:c0 + group]]
            ms = sum(a * a for a in xs) / group
            out[r, c0:c0 + group] = [a / math.sqrt(ms + eps / group) / math.sqrt(group) for a in xs]
    return out


def softplus(x):
    """ggml-cpu/unary-ops.cpp ``op_softplus`` (in float64: below about -17 float32's ``1 + exp(x)`` is 1)."""
    return x if x > 20.0 else math.log(1.0 + math.exp(x))


def sigmoid(x):
    """ggml-cpu/unary-ops.cpp ``op_sigmoid``, overflow-safe."""
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


# -- running an op on a device ----------------------------------------------------------------
def _tensor(d, buf, a, rows=None):
    """A tensor holding ``a``; with ``rows``, the head view of a taller one (a batch buffer's chunk)."""
    ty = T.I32 if a.dtype == np.int32 else T.F32
    t = buf.empty(((rows or a.shape[0]),) + a.shape[1:], ty)
    v = t.head(a.shape[0]) if rows else t
    d.write(v, a)
    return v


def run_gdn(d, q, k, v, g, beta, state, slots, rows=None, interleaved=False):
    """``gated_delta_net`` on ``d``: (out, the new state)."""
    buf = d.buffer("gdn")
    try:
        sl = np.asarray(slots, np.int32)
        tq, tk, tv, tg, tb = (_tensor(d, buf, np.asarray(a, np.float32), rows) for a in (q, k, v, g, beta))
        ts, tsl = _tensor(d, buf, np.asarray(state, np.float32)), _tensor(d, buf, sl, rows)
        to = buf.empty(((rows or v.shape[0]),) + v.shape[1:])
        to = to.head(v.shape[0]) if rows else to
        d.gated_delta_net(to, tq, tk, tv, tg, tb, ts, tsl, interleaved=interleaved)
        return d.read(to), d.read(ts)
    finally:
        buf.release()


def gdn_inputs(rng, n, h_k, h_v, d, n_slots=3):
    """Inputs as qwen35.cpp makes them: q and k L2-normed per head, g <= 0 (log decays), beta in (0, 1)."""
    def normed(a):
        a = a.reshape(n, -1, d)
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).reshape(n, -1).astype(np.float32)
    q = normed(rng.normal(size=(n, h_k * d)))
    k = normed(rng.normal(size=(n, h_k * d)))
    v = rng.normal(size=(n, h_v * d)).astype(np.float32)
    g = -rng.uniform(0.01, 2.0, size=(n, h_v)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, size=(n, h_v)).astype(np.float32)
    state = (rng.normal(size=(n_slots, h_v * d * d)) * 0.3).astype(np.float32)
    return q, k, v, g, beta, state


CASES = [  # (name, n tokens, H_k, H_v, d, slots of the rows)
    ("one token", 1, 1, 1, 4, [0]),
    ("many tokens", 37, 1, 2, 4, [1] * 37),
    ("d 12", 5, 1, 1, 12, [0] * 5),
    ("d 20", 3, 1, 2, 20, [2] * 3),
    ("shared key heads", 4, 2, 6, 4, [0, 0, 1, 1]),
    ("interleaved", 6, 2, 4, 6, [2, 2, 0, 1, 0, 2]),
]


@pytest.mark.parametrize("name,n,h_k,h_v,d,slots", CASES, ids=[c[0] for c in CASES])
def test_gated_delta_net_matches_the_loop(dev, name, n, h_k, h_v, d, slots):
    rng = np.random.default_rng(n * 31 + d)
    q, k, v, g, beta, state = gdn_inputs(rng, n, h_k, h_v, d)
    out, st = run_gdn(dev, q, k, v, g, beta, state, slots)
    want_out, want_st = loop_gdn(q, k, v, g, beta, state, slots, h_k, h_v, d)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, want_st, rtol=1e-5, atol=1e-5)
    untouched = sorted(set(range(state.shape[0])) - set(slots))
    np.testing.assert_array_equal(st[untouched], state[untouched])


def test_state_carried_across_two_chunks_equals_one_call(dev):
    rng = np.random.default_rng(5)
    q, k, v, g, beta, state = gdn_inputs(rng, 23, 2, 4, 8, n_slots=2)
    whole, st_whole = run_gdn(dev, q, k, v, g, beta, state, [1] * 23)
    a, st = run_gdn(dev, q[:10], k[:10], v[:10], g[:10], beta[:10], state, [1] * 10)
    b, st = run_gdn(dev, q[10:], k[10:], v[10:], g[10:], beta[10:], st, [1] * 13)
    # 10 and 13 rows run in closed form (>= GDN_CHUNKED_MIN), as do the 23: float32 rounding apart
    np.testing.assert_allclose(np.concatenate([a, b]), whole, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(st, st_whole, rtol=1e-5, atol=1e-7)
    fresh, _ = run_gdn(dev, q[10:], k[10:], v[10:], g[10:], beta[10:], state, [1] * 13)
    assert not np.allclose(fresh[0], b[0])  # the state matters


@pytest.mark.parametrize("n", [8, 150])
def test_chunked_form_equals_token_by_token(dev, n):
    """A prompt's rows (>= GDN_CHUNKED_MIN of one slot) run chunk by chunk in closed form (150: three
    chunks of GDN_CHUNK = 64, the last partial); one call per row runs ggml's token-by-token loop.
    Same outputs and state within float32 rounding, with decays strong enough to matter."""
    from cooktop.backends.cpu.recurrent import GDN_CHUNK, GDN_CHUNKED_MIN
    assert n >= GDN_CHUNKED_MIN and (n < GDN_CHUNK or n > 2 * GDN_CHUNK)
    rng = np.random.default_rng(n)
    q, k, v, g, beta, state = gdn_inputs(rng, n, 2, 4, 16, n_slots=1)
    g = (g * 3).astype(np.float32)
    whole, st_whole = run_gdn(dev, q, k, v, g, beta, state, [0] * n)
    rows, st = [], state
    for i in range(n):
        o, st = run_gdn(dev, q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1], st, [0])
        rows.append(o)
    np.testing.assert_allclose(whole, np.concatenate(rows), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(st_whole, st, rtol=2e-5, atol=2e-6)


def test_small_ops_match_the_formulas(dev):
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(3, 24)) * 4).astype(np.float32)
    x[0, :3] = (-100.0, 100.0, 0.0)  # exp overflows: silu -0 / x, sigmoid 0 / 1
    y = rng.normal(size=(3, 24)).astype(np.float32)
    buf = dev.buffer("t")
    tx, ty, to = _tensor(dev, buf, x), _tensor(dev, buf, y), buf.empty((3, 24))
    dev.silu(to, tx)
    np.testing.assert_allclose(dev.read(to), [[a * sigmoid(a) for a in r] for r in x.astype(np.float64)],
                               rtol=1e-6, atol=1e-30)
    dev.sigmoid_mul(to, ty, tx)
    np.testing.assert_allclose(dev.read(to), y * np.vectorize(sigmoid)(x.astype(np.float64)), rtol=1e-6, atol=1e-30)
    for group, eps in ((24, 1e-6), (8, 1e-6), (6, 0.5)):
        dev.l2_norm(to, tx, group, eps)
        np.testing.assert_allclose(dev.read(to), loop_l2_norm(x, group, eps), rtol=2e-6, atol=1e-7)
    # the gates: softplus's linear branch past 20, and the decay times a = -exp(A_log)
    alpha = np.array([[-30.0, -1.0, 0.0, 19.0], [20.5, 50.0, 2.0, -3.0]], np.float32)
    b = np.array([[-90.0, -1.0, 0.0, 1.0], [3.0, 90.0, -4.0, 0.5]], np.float32)
    dt_bias = np.array([0.5, -0.25, 1.0, 0.0], np.float32)
    a = -np.exp(np.array([0.1, -2.0, 1.5, 0.0], np.float32))
    tal, tb, tdt, ta = (_tensor(dev, buf, t) for t in (alpha, b, dt_bias, a))
    tg, tbe = buf.empty((2, 4)), buf.empty((2, 4))
    dev.gdn_gate(tg, tbe, tal, tb, tdt, ta)
    want_g = [[softplus(float(alpha[i, h]) + float(dt_bias[h])) * float(a[h]) for h in range(4)] for i in range(2)]
    np.testing.assert_allclose(dev.read(tg), want_g, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(dev.read(tbe), np.vectorize(sigmoid)(b.astype(np.float64)), rtol=1e-6, atol=1e-30)
    buf.release()


def test_shape_errors(dev):
    buf = dev.buffer("t")
    q, v, g, sl = buf.empty((3, 8)), buf.empty((3, 24)), buf.empty((3, 3)), buf.empty((3,), T.I32)
    with pytest.raises(ShapeError, match="gated_delta_net"):  # 3 value heads of 8, 1 key head: state 192 wide
        dev.gated_delta_net(v, q, q, v, g, g, buf.empty((2, 191)), sl)
    with pytest.raises(ShapeError, match="gated_delta_net"):  # 3 value heads do not share 2 key heads
        dev.gated_delta_net(v, buf.empty((3, 16)), buf.empty((3, 16)), v, g, g, buf.empty((2, 192)), sl)
    with pytest.raises(ShapeError, match="l2_norm"):
        dev.l2_norm(v, v, 7, 1e-6)
    buf.release()


def test_recurrent_ops_cover_the_gated_delta_net():
    assert {"silu", "sigmoid_mul", "l2_norm", "gdn_gate", "gated_delta_net"} <= set(RECURRENT_OPS)


#: repeat-interleaved key heads (qwen3next): ratios 3 and 2 at head widths that are no power of two,
#: where ``h // r`` and ``h mod H_k`` differ; chunked (>= GDN_CHUNKED_MIN rows) and row by row
INTERLEAVED_CASES = [  # (name, n tokens, H_k, H_v, d, slots of the rows)
    ("ratio 3", 5, 2, 6, 12, [0, 1, 0, 0, 1]),
    ("ratio 2 many tokens", 37, 3, 6, 4, [2] * 37),
    ("ratio 4 one token", 1, 2, 8, 20, [1]),
]


@pytest.mark.parametrize("name,n,h_k,h_v,d,slots", INTERLEAVED_CASES, ids=[c[0] for c in INTERLEAVED_CASES])
def test_gated_delta_net_interleaved_matches_the_loop(dev, name, n, h_k, h_v, d, slots):
    rng = np.random.default_rng(n * 13 + d)
    q, k, v, g, beta, state = gdn_inputs(rng, n, h_k, h_v, d)
    out, st = run_gdn(dev, q, k, v, g, beta, state, slots, interleaved=True)
    want_out, want_st = loop_gdn(q, k, v, g, beta, state, slots, h_k, h_v, d, interleaved=True)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, want_st, rtol=1e-5, atol=1e-5)
    tiled, _ = run_gdn(dev, q, k, v, g, beta, state, slots)
    assert np.abs(tiled - want_out).max() > 1e-2  # the mapping matters at these shapes


# -- the device kernels against numpy ------------------------------------------------------------
GPU_CASES = CASES + [("d 128", 5, 2, 2, 128, [0, 0, 1, 0, 1]), ("d 128 many tokens", 37, 1, 2, 128, [2] * 37)]


@pytest.mark.parametrize("name,n,h_k,h_v,d,slots", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_device_gated_delta_net_matches_numpy(dev, gpu, name, n, h_k, h_v, d, slots):
    assert set(RECURRENT_OPS) <= set(gpu.info.ops)
    rng = np.random.default_rng(n * 7 + d)
    q, k, v, g, beta, state = gdn_inputs(rng, n, h_k, h_v, d)
    out, st = run_gdn(gpu, q, k, v, g, beta, state, slots, rows=n + 3)
    want_out, want_st = run_gdn(dev, q, k, v, g, beta, state, slots)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, want_st, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,n,h_k,h_v,d,slots", INTERLEAVED_CASES, ids=[c[0] for c in INTERLEAVED_CASES])
def test_device_gated_delta_net_interleaved_matches_numpy(dev, gpu, name, n, h_k, h_v, d, slots):
    rng = np.random.default_rng(n * 5 + d)
    q, k, v, g, beta, state = gdn_inputs(rng, n, h_k, h_v, d)
    out, st = run_gdn(gpu, q, k, v, g, beta, state, slots, rows=n + 3, interleaved=True)
    want_out, want_st = run_gdn(dev, q, k, v, g, beta, state, slots, interleaved=True)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, want_st, rtol=1e-5, atol=1e-5)


def test_device_state_across_two_chunks(dev, gpu):
    rng = np.random.default_rng(9)
    q, k, v, g, beta, state = gdn_inputs(rng, 17, 1, 3, 16, n_slots=2)
    whole, st_whole = run_gdn(dev, q, k, v, g, beta, state, [0] * 17)
    a, st = run_gdn(gpu, q[:6], k[:6], v[:6], g[:6], beta[:6], state, [0] * 6)
    b, st = run_gdn(gpu, q[6:], k[6:], v[6:], g[6:], beta[6:], st, [0] * 11)
    np.testing.assert_allclose(np.concatenate([a, b]), whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, st_whole, rtol=1e-5, atol=1e-5)


def _small_ops(d, x, y, alpha, b, dt_bias, a, group, eps, in_place):
    """silu, sigmoid_mul, l2_norm and gdn_gate on ``d`` (head views of taller tensors; ``in_place``:
    each output is its first input)."""
    buf = d.buffer("small")
    try:
        rows = x.shape[0] + 2
        res = []
        for op in ("silu", "sigmoid_mul", "l2_norm"):
            tx, ty = _tensor(d, buf, x, rows), _tensor(d, buf, y, rows)
            to = tx if in_place else buf.empty((rows, x.shape[1])).head(x.shape[0])
            if op == "silu":
                d.silu(to, tx)
            elif op == "sigmoid_mul":
                d.sigmoid_mul(to, tx, ty)
            else:
                d.l2_norm(to, tx, group, eps)
            res.append(d.read(to))
        tal, tb = _tensor(d, buf, alpha, rows), _tensor(d, buf, b, rows)
        tdt, ta = _tensor(d, buf, dt_bias), _tensor(d, buf, a)
        if in_place:
            tg, tbe = tal, tb
        else:
            tg, tbe = (buf.empty((rows, alpha.shape[1])).head(alpha.shape[0]) for _ in range(2))
        d.gdn_gate(tg, tbe, tal, tb, tdt, ta)
        return res + [d.read(tg), d.read(tbe)]
    finally:
        buf.release()


@pytest.mark.parametrize("n,width,group", [(1, 256, 128), (7, 60, 20), (5, 36, 12), (3, 8, 8)])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_device_small_ops_match_numpy(dev, gpu, n, width, group, in_place):
    rng = np.random.default_rng(n * width)
    x = (rng.normal(size=(n, width)) * 4).astype(np.float32)
    x[0, :2] = (-100.0, 100.0)
    y = rng.normal(size=(n, width)).astype(np.float32)
    n_head = width // group * 3
    alpha = (rng.normal(size=(n, n_head)) * 12).astype(np.float32)  # both sides of softplus's threshold
    b = (rng.normal(size=(n, n_head)) * 6).astype(np.float32)
    dt_bias = rng.normal(size=n_head).astype(np.float32)
    a = -np.exp(rng.normal(size=n_head)).astype(np.float32)
    got = _small_ops(gpu, x, y, alpha, b, dt_bias, a, group, 1e-6, in_place)
    want = _small_ops(dev, x, y, alpha, b, dt_bias, a, group, 1e-6, in_place)
    for name, gv, wv in zip(("silu", "sigmoid_mul", "l2_norm", "g", "beta"), got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("ls", [32, 128])
def test_opencl_gpu_launch_shapes(dev, ls):
    """The OpenCL kernels with the GPU launch shape at a real GPU's work-group size (l2_norm's
    local-memory reduction over groups wider and narrower than the work-group, head widths that
    are no multiple of it), on the first OpenCL device (PoCL here, Oclgrind under
    tests/opencl_validation.py), against numpy."""
    import dataclasses

    from conftest import open_family_device

    from cooktop.backends.opencl.programs import GPU_SHAPE, KernelCache

    base = open_family_device("opencl")
    gpu_dev = type(base)(base.info, base.cl_device)
    gpu_dev.shape = dataclasses.replace(GPU_SHAPE, rn_ls=ls, ew_ls=ls)
    gpu_dev.kernels = KernelCache(gpu_dev.ctx, gpu_dev.cl_device, gpu_dev.shape)
    rng = np.random.default_rng(ls)
    for n, h_k, h_v, d, slots in ((3, 1, 2, 20, [1, 0, 1]), (2, 2, 2, 128, [0, 0])):
        q, k, v, g, beta, state = gdn_inputs(rng, n, h_k, h_v, d, n_slots=2)
        out, st = run_gdn(gpu_dev, q, k, v, g, beta, state, slots)
        want_out, want_st = run_gdn(dev, q, k, v, g, beta, state, slots)
        np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(st, want_st, rtol=1e-5, atol=1e-5)
    x = rng.normal(size=(3, 256)).astype(np.float32)
    alpha, b = rng.normal(size=(3, 6)).astype(np.float32) * 10, rng.normal(size=(3, 6)).astype(np.float32)
    dt_bias, a = rng.normal(size=6).astype(np.float32), -np.exp(rng.normal(size=6)).astype(np.float32)
    for group in (256, 128, 20):
        xs = x[:, :group * (256 // group)].copy()
        got = _small_ops(gpu_dev, xs, xs[::-1].copy(), alpha, b, dt_bias, a, group, 1e-6, False)
        want = _small_ops(dev, xs, xs[::-1].copy(), alpha, b, dt_bias, a, group, 1e-6, False)
        for name, gv, wv in zip(("silu", "sigmoid_mul", "l2_norm", "g", "beta"), got, want):
            np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6, err_msg=f"{name}, group {group}")


def _decode_steps(d, steps, h_k, h_v, dd, state):
    """A gated delta-net block's decode steps in one ``graph`` scope per step (the same key each
    time: recorded, then replayed where the backend does): the gates, the L2 norms of q and k, the
    recurrence, the output gate; each step's inputs written before the scope, its output read after."""
    buf = d.buffer("decode")
    try:
        q, k = buf.empty((1, h_k * dd)), buf.empty((1, h_k * dd))
        v, z, o = buf.empty((1, h_v * dd)), buf.empty((1, h_v * dd)), buf.empty((1, h_v * dd))
        alpha, b = buf.empty((1, h_v)), buf.empty((1, h_v))
        dt_bias, a, sl = buf.empty((h_v,)), buf.empty((h_v,)), buf.empty((1,), T.I32)
        st = buf.empty(state.shape)
        d.write(st, state)
        d.write(dt_bias, np.linspace(-1, 1, h_v).astype(np.float32))
        d.write(a, -np.exp(np.linspace(-2, 0.5, h_v)).astype(np.float32))
        d.write(sl, np.array([1], np.int32))
        outs = []
        for step in steps:
            for t, x in zip((q, k, v, z, alpha, b), step):
                d.write(t, x)
            with d.graph(("gdn decode", st.serial)) as issue:
                if issue:
                    d.gdn_gate(alpha, b, alpha, b, dt_bias, a)
                    d.l2_norm(q, q, dd, 1e-6)
                    d.l2_norm(k, k, dd, 1e-6)
                    d.gated_delta_net(o, q, k, v, alpha, b, st, sl)
                    d.silu(z, z)
                    d.sigmoid_mul(o, o, z)
            outs.append(d.read(o))
        return np.concatenate(outs), d.read(st)
    finally:
        buf.release()


def test_device_decode_steps_in_a_graph(dev, gpu):
    rng = np.random.default_rng(11)
    h_k, h_v, dd = 1, 2, 16
    steps = [tuple(rng.normal(size=(1, w)).astype(np.float32)
                   for w in (h_k * dd, h_k * dd, h_v * dd, h_v * dd, h_v, h_v)) for _ in range(5)]
    state = (rng.normal(size=(2, h_v * dd * dd)) * 0.3).astype(np.float32)
    out, st = _decode_steps(gpu, steps, h_k, h_v, dd, state)
    want_out, want_st = _decode_steps(dev, steps, h_k, h_v, dd, state)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, want_st, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(st[0], state[0])
