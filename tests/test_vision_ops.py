"""The vision encoders' ops (``backends/vision_ops.py``: ``layer_norm``, ``gelu``, ``gelu_erf``,
``gelu_quick``, ``attention_full``, ``avg_pool2d``) on numpy against direct float64 formulas
(ggml's ``ggml_norm``, ggml-cpu/vec.h's GELUs, clip.cpp's ``build_attn`` without a mask,
``ggml_pool_2d`` with ``GGML_OP_POOL_AVG``) at odd shapes: rows of 77 values, head widths 40 and 72,
1, 13 and 197 tokens, pool grids that are not square. ggml's CPU f32 GELUs read fp16 tables
(``GGML_GELU_FP16``): an emulation of those tables bounds how far ggml is from the formula.
The device kernels (OpenCL ``kernels/vision.cl``, Vulkan ``glsl/layer_norm.comp``, ``gelu.comp``,
``attention_full.comp``, ``avg_pool2d.comp``) against numpy at the same shapes, on head views of
taller buffers, with more tokens than one tile of keys (the online softmax) and of queries.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import nmse
from cooktop.backends.cpu.device import CpuBackend
from cooktop.backends.optable import MOE_OPS, OPS, RECURRENT_OPS, VISION_OPS
from cooktop.errors import ShapeError

#: nmse bound of a device against numpy (tests/test_ops_parity.py's float bound).
FLOAT_BOUND = 1e-7


@pytest.fixture(scope="module")
def dev():
    return CpuBackend().open(0)


@pytest.fixture(scope="module", params=["opencl", "vulkan"])
def gpu(request):
    """Each device family with vision kernels (OpenCL ``kernels/vision.cl``, Vulkan ``glsl/``)."""
    from conftest import open_family_device
    return open_family_device(request.param)


def _tensor(d, buf, a, pad=0):
    """A tensor holding ``a`` (I32 for int32 data); with ``pad`` and ``a`` 2-D float, the head view of one
    ``pad`` rows taller (a batch buffer's chunk)."""
    ty = T.I32 if a.dtype == np.int32 else T.F32
    pad = pad if a.ndim == 2 and ty == T.F32 else 0
    t = buf.empty((a.shape[0] + pad,) + a.shape[1:], ty)
    v = t.head(a.shape[0]) if pad else t
    d.write(v, a if ty == T.I32 else np.asarray(a, np.float32))
    return v


def _empty(buf, shape, pad=0):
    t = buf.empty((shape[0] + pad,) + tuple(shape[1:]))
    return t.head(shape[0]) if pad else t


def run(d, op, arrays, out_shape, *scalars, pad=0, in_place=False, **kw):
    """``d.<op>(out, *arrays, *scalars, **kw)`` on fresh tensors (``pad``: head views of taller ones);
    ``in_place``: ``out`` is the first input."""
    buf = d.buffer("vision")
    try:
        ts = [None if a is None else _tensor(d, buf, a, pad) for a in arrays]
        out = ts[0] if in_place else _empty(buf, out_shape, pad)
        getattr(d, op)(out, *ts, *scalars, **kw)
        return d.read(out)
    finally:
        buf.release()


# -- references: direct float64 formulas ---------------------------------------------------------
def ref_layer_norm(x, w, b, eps):
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * w
    return y + b if b is not None else y


def ref_gelu(x):
    return np.vectorize(lambda v: 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3))))(
        x.astype(np.float64))


def ref_gelu_erf(x):
    return np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))(x.astype(np.float64))


def ref_gelu_quick(x):
    def f(v):
        return v / (1.0 + math.exp(-1.702 * v)) if v > -40 else 0.0
    return np.vectorize(f)(x.astype(np.float64))


def ggml_table(f, x, clamp):
    """ggml's CPU f32 GELU path (ggml-cpu/vec.h, ``GGML_GELU_FP16``): x rounded to fp16, f in float32
    of that value, rounded to fp16 (the table ggml-cpu.c fills); with ``clamp`` (``gelu``), 0 for
    x <= -10 and x for x >= 10 (``gelu_quick`` has no clamp)."""
    h = x.astype(np.float16).astype(np.float32)
    y = f(h).astype(np.float32).astype(np.float16).astype(np.float32)
    if clamp:
        y = np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))
    return y


def ref_attention(q, k, v, n_head, scale):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    n, width = q.shape
    d = width // n_head
    out = np.zeros((n, width))
    for h in range(n_head):
        c = slice(h * d, (h + 1) * d)
        s = q[:, c] @ k[:, c].T * scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, c] = (p / p.sum(axis=1, keepdims=True)) @ v[:, c]
    return out


def ref_avg_pool(x, width, height, k):
    c = x.shape[1]
    out = np.zeros(((height // k) * (width // k), c))
    for yy in range(height // k):
        for xx in range(width // k):
            acc = np.zeros(c)
            for dy in range(k):
                for dx in range(k):
                    acc += x[(k * yy + dy) * width + k * xx + dx]
            out[yy * (width // k) + xx] = acc / (k * k)
    return out


def ref_rope_multi(x, pos, head_dim, sections, freq_base):
    """ggml_rope_multi, GGML_ROPE_TYPE_VISION, in closed form (float64): pair i of each head, sector
    c = i mod sum(sections), section s and index j of c there, theta = pos[s] * base^(-2 j / (head_dim / 2))."""
    nd = head_dim // 2
    starts = np.cumsum((0,) + tuple(sections))
    n, width = x.shape
    out = np.zeros((n, width))
    for i in range(nd):
        c = i % starts[4]
        s = max(t for t in range(4) if starts[t] <= c)
        theta = pos[s].astype(np.float64) * freq_base ** (-2.0 * (c - starts[s]) / nd)
        for h in range(width // head_dim):
            a, b = x[:, h * head_dim + i].astype(np.float64), x[:, h * head_dim + i + nd].astype(np.float64)
            out[:, h * head_dim + i] = a * np.cos(theta) - b * np.sin(theta)
            out[:, h * head_dim + i + nd] = a * np.sin(theta) + b * np.cos(theta)
    return out


def _x(rng, shape, s=3.0):
    return (rng.normal(size=shape) * s).astype(np.float32)


#: (name, n_rows, n, with bias, eps)
NORM_CASES = [("77 wide", 5, 77, True, 1e-6), ("one row no bias", 1, 40, False, 1e-5),
              ("1152 wide", 3, 1152, True, 1e-6)]
#: (name, n_tokens, n_head, head_dim)
ATTN_CASES = [("one token", 1, 2, 40), ("13 tokens d40", 13, 3, 40), ("37 tokens d40", 37, 2, 40),
              ("197 tokens d72", 197, 2, 72),
              ("300 tokens d64", 300, 1, 64), ("1024 tokens d80", 1024, 1, 80)]
#: (name, width, height, k, c)
POOL_CASES = [("12x8 k4", 12, 8, 4, 5), ("6x4 k2", 6, 4, 2, 77), ("5x3 k1", 5, 3, 1, 3), ("16x16 k4", 16, 16, 4, 33)]
#: (name, n_tokens, n_head, head_dim, sections): Qwen2-VL's head_dim / 4 each, and sections that wrap
ROPE_CASES = [("one token d72", 1, 2, 72, (18, 18, 18, 18)), ("13 tokens d40", 13, 3, 40, (10, 10, 10, 10)),
              ("197 tokens d80", 197, 1, 80, (20, 20, 20, 20)), ("odd sections", 7, 2, 40, (3, 5, 2, 4))]
GELUS = [("gelu", ref_gelu), ("gelu_erf", ref_gelu_erf), ("gelu_quick", ref_gelu_quick)]


def _gelu_input(rng, n_rows=3, n=77):
    x = _x(rng, (n_rows, n))
    x[0, :6] = (-12.0, 12.0, 0.0, -60.0, 60.0, -1e-3)  # past the clamp, exp overflowing, near 0
    return x


# -- numpy against the formulas --------------------------------------------------------------------
@pytest.mark.parametrize("name,n_rows,n,bias,eps", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_layer_norm_matches_the_formula(dev, name, n_rows, n, bias, eps):
    rng = np.random.default_rng(n)
    x = _x(rng, (n_rows, n)) + 2.0  # a mean far from 0
    w, b = _x(rng, (n,), 1.0), (_x(rng, (n,), 1.0) if bias else None)
    got = run(dev, "layer_norm", [x, w, b], x.shape, eps)
    np.testing.assert_allclose(got, ref_layer_norm(x, w, b, eps), rtol=2e-6, atol=2e-6)
    assert np.array_equal(run(dev, "layer_norm", [x, w, b], x.shape, eps, in_place=True), got)


@pytest.mark.parametrize("op,ref", GELUS, ids=[g[0] for g in GELUS])
def test_gelus_match_the_formulas(dev, op, ref):
    x = _gelu_input(np.random.default_rng(1))
    got = run(dev, op, [x], x.shape)
    np.testing.assert_allclose(got, ref(x), rtol=2e-6, atol=1e-6)
    assert np.array_equal(run(dev, op, [x], x.shape, in_place=True), got)


@pytest.mark.parametrize("op,ref,clamp", [("gelu", ref_gelu, True), ("gelu_quick", ref_gelu_quick, False)],
                         ids=["gelu", "gelu_quick"])
def test_ggml_fp16_table_is_near_the_formula(dev, op, ref, clamp):
    """ggml's CPU f32 gelu / gelu_quick (fp16 tables) stay within fp16 rounding of the formula that
    numpy (and the device kernels) compute: |diff| <= 2e-3 |x| + 1e-3 (x rounded to fp16, then the
    result: ~2^-11 relative each)."""
    x = _gelu_input(np.random.default_rng(2), 4, 257)
    got = run(dev, op, [x], x.shape)
    table = ggml_table(lambda h: ref(h), x, clamp)
    diff = np.abs(got - table)
    assert (diff <= 2e-3 * np.abs(x) + 1e-3).all(), float(diff.max())
    assert diff.max() > 0  # the table does round


@pytest.mark.parametrize("name,n,n_head,d", ATTN_CASES, ids=[c[0] for c in ATTN_CASES])
def test_attention_full_matches_the_formula(dev, name, n, n_head, d):
    rng = np.random.default_rng(n + d)
    q, k, v = (_x(rng, (n, n_head * d), 1.0) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    got = run(dev, "attention_full", [q, k, v], q.shape, n_head, scale)
    np.testing.assert_allclose(got, ref_attention(q, k, v, n_head, scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,width,height,k,c", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_avg_pool2d_matches_the_loop(dev, name, width, height, k, c):
    x = _x(np.random.default_rng(width * height + c), (width * height, c))
    got = run(dev, "avg_pool2d", [x], ((width // k) * (height // k), c), width, height, k)
    np.testing.assert_allclose(got, ref_avg_pool(x, width, height, k), rtol=1e-6, atol=1e-6)


def _rope_inputs(rng, n, n_head, d):
    return _x(rng, (n, n_head * d), 1.0), rng.integers(0, 100, size=(4, n)).astype(np.int32)


@pytest.mark.parametrize("name,n,n_head,d,sections", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rope_multi_matches_the_formula(dev, name, n, n_head, d, sections):
    x, pos = _rope_inputs(np.random.default_rng(n + d), n, n_head, d)
    got = run(dev, "rope_multi", [x, pos], x.shape, d, sections, 10000.0)
    np.testing.assert_allclose(got, ref_rope_multi(x, pos, d, sections, 10000.0), rtol=1e-4, atol=1e-4)
    assert np.array_equal(run(dev, "rope_multi", [x, pos], x.shape, d, sections, 10000.0, in_place=True), got)


def test_shape_errors_name_the_problem(dev):
    buf = dev.buffer("t")
    try:
        x = buf.empty((10 * 8, 3))
        with pytest.raises(ShapeError, match=r"avg_pool2d: .*with width 10 and height 8 divisible by k 4"):
            dev.avg_pool2d(buf.empty((10, 3)), x, 10, 8, 4)
        with pytest.raises(ShapeError, match=r"avg_pool2d: .*k 0 > 0"):
            dev.avg_pool2d(buf.empty((10, 3)), x, 10, 8, 0)
        with pytest.raises(ShapeError, match=r"attention_full: .*n_head 5 dividing the width"):
            q = buf.empty((4, 12))
            dev.attention_full(q, q, q, q, 5, 1.0)
        with pytest.raises(ShapeError, match=r"rope_multi: .*mode 8 24"):
            dev.rope_multi(q, q, buf.empty((4, 4), T.I32), 4, (1, 1, 1, 1), 1e4, mode=8)
        with pytest.raises(ShapeError, match=r"rope_multi: .*sections \(2, 0, 2, 0\) four values > 0"):
            dev.rope_multi(q, q, buf.empty((4, 4), T.I32), 4, (2, 0, 2, 0), 1e4)
        with pytest.raises(ShapeError, match=r"layer_norm: .*b \[9\]"):
            dev.layer_norm(buf.empty((2, 8)), buf.empty((2, 8)), buf.empty((8,)), buf.empty((9,)), 1e-6)
    finally:
        buf.release()


def test_vision_ops_are_claimed_by_numpy(dev):
    assert set(VISION_OPS) == {"layer_norm", "gelu", "gelu_erf", "gelu_quick", "attention_full", "avg_pool2d",
                               "rope_multi"}
    assert not set(VISION_OPS) & (set(OPS) | set(MOE_OPS) | set(RECURRENT_OPS))  # claimed only where implemented
    assert set(VISION_OPS) <= set(dev.info.ops)


# -- the device kernels against numpy ---------------------------------------------------------------
#: Extra rows of the device tensors: each input and output is the head view of a taller buffer.
PAD = 3


def _parity(got, want, what):
    err, e = float(np.abs(got - want).max()), nmse(got, want)
    assert e <= FLOAT_BOUND, f"{what}: nmse {e:.3g}, max abs {err:.3g}"
    return err, e


@pytest.mark.parametrize("name,n_rows,n,bias,eps", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_device_layer_norm(dev, gpu, name, n_rows, n, bias, eps):
    assert set(VISION_OPS) <= set(gpu.info.ops)
    rng = np.random.default_rng(n + 1)
    x = _x(rng, (n_rows, n)) + 2.0
    w, b = _x(rng, (n,), 1.0), (_x(rng, (n,), 1.0) if bias else None)
    want = run(dev, "layer_norm", [x, w, b], x.shape, eps)
    _parity(run(gpu, "layer_norm", [x, w, b], x.shape, eps, pad=PAD), want, "layer_norm")
    _parity(run(gpu, "layer_norm", [x, w, b], x.shape, eps, in_place=True), want, "layer_norm in place")


@pytest.mark.parametrize("op", [g[0] for g in GELUS])
def test_device_gelus(dev, gpu, op):
    x = _gelu_input(np.random.default_rng(4), 5, 77)
    want = run(dev, op, [x], x.shape)
    _parity(run(gpu, op, [x], x.shape, pad=PAD), want, op)
    np.testing.assert_allclose(run(gpu, op, [x], x.shape, in_place=True), want, rtol=2e-6, atol=1e-6)


#: the flash kernels' tiles: OpenCL's blocks of 16 keys (CPU) and 16-query tiles (GPU), Vulkan's chunks of
#: 256 keys and its 16-query tiles: 300 tokens are more than one of each
@pytest.mark.parametrize("name,n,n_head,d", ATTN_CASES, ids=[c[0] for c in ATTN_CASES])
def test_device_attention_full(dev, gpu, name, n, n_head, d):
    rng = np.random.default_rng(n * 3 + d)
    q, k, v = (_x(rng, (n, n_head * d), 1.0) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    want = run(dev, "attention_full", [q, k, v], q.shape, n_head, scale)
    _parity(run(gpu, "attention_full", [q, k, v], q.shape, n_head, scale, pad=PAD), want, "attention_full")


@pytest.mark.parametrize("name,n,n_head,d,sections", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_device_rope_multi(dev, gpu, name, n, n_head, d, sections):
    x, pos = _rope_inputs(np.random.default_rng(n * 5 + d), n, n_head, d)
    want = run(dev, "rope_multi", [x, pos], x.shape, d, sections, 10000.0)
    _parity(run(gpu, "rope_multi", [x, pos], x.shape, d, sections, 10000.0, pad=PAD), want, "rope_multi")
    _parity(run(gpu, "rope_multi", [x, pos], x.shape, d, sections, 10000.0, in_place=True), want, "in place")


def test_vulkan_attention_full_past_the_tiled_range(dev, monkeypatch):
    """Past ``TILED_MAX_KEYS`` rows Vulkan runs attention.comp (one workgroup per (row, head)); the
    threshold lowered so that 300 tokens take that branch (at 2100 tokens it takes 50 s on lavapipe)."""
    from conftest import open_family_device

    from cooktop.backends.vulkan import vision
    vk = open_family_device("vulkan")
    monkeypatch.setattr(vision, "TILED_MAX_KEYS", 64)
    rng = np.random.default_rng(11)
    q, k, v = (_x(rng, (300, 2 * 72), 1.0) for _ in range(3))
    want = run(dev, "attention_full", [q, k, v], q.shape, 2, 1 / math.sqrt(72))
    _parity(run(vk, "attention_full", [q, k, v], q.shape, 2, 1 / math.sqrt(72), pad=PAD), want, "attention.comp")


@pytest.mark.parametrize("name,width,height,k,c", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_device_avg_pool2d(dev, gpu, name, width, height, k, c):
    x = _x(np.random.default_rng(width + c), (width * height, c))
    shape = ((width // k) * (height // k), c)
    want = run(dev, "avg_pool2d", [x], shape, width, height, k)
    _parity(run(gpu, "avg_pool2d", [x], shape, width, height, k, pad=PAD), want, "avg_pool2d")
