"""``ssm_conv`` (the short causal convolution with a carried state) and ``mul`` on numpy against a
plain loop written from ggml's formula (ggml-cpu/ops.cpp ``ssm_conv_f32``), at odd shapes: one
token, many tokens, a state carried across two chunks, and several sequences' rows in one call.
The OpenCL kernels (``kernels/recurrent.cl``) and the Vulkan shaders (``glsl/ssm_conv.comp``,
``mul.comp``) against numpy at the same shapes."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends.cpu.device import CpuBackend
from cooktop.backends.optable import MOE_OPS, OPS, RECURRENT_OPS
from cooktop.errors import ShapeError


@pytest.fixture(scope="module")
def dev():
    return CpuBackend().open(0)


def loop_conv(x, state, w, slots):
    """The reference: row by row, tap by tap, float32 (ggml: ``sumf += s[i0] * c[i0]``)."""
    x, state, w = np.asarray(x, np.float32), np.array(state, np.float32), np.asarray(w, np.float32)
    n, c = x.shape
    k = w.shape[1]
    out = np.zeros((n, c), np.float32)
    for i in range(n):
        s = int(slots[i])
        win = np.concatenate([state[s].reshape(k - 1, c), x[i:i + 1]])
        for ch in range(c):
            acc = np.float32(0.0)
            for t in range(k):
                acc = np.float32(acc + win[t, ch] * w[ch, t])
            out[i, ch] = acc
        state[s] = win[1:].reshape(-1)
    return out, state


def run(dev, x, state, w, slots):
    buf = dev.buffer("t")
    try:
        tx, ts, tw = buf.empty(x.shape), buf.empty(state.shape), buf.empty(w.shape)
        tsl, to = buf.empty(slots.shape, T.I32), buf.empty(x.shape)
        dev.write(tx, x)
        dev.write(ts, state)
        dev.write(tw, w)
        dev.write(tsl, slots.astype(np.int32))
        dev.ssm_conv(to, tx, ts, tw, tsl)
        return dev.read(to), dev.read(ts)
    finally:
        buf.release()


CASES = [  # (n tokens, channels, kernel length, slots of the rows)
    ("one token", 1, 7, 3, [0]),
    ("many tokens", 37, 13, 3, [0] * 37),
    ("kernel of 4", 9, 5, 4, [1] * 9),
    ("several sequences", 12, 11, 3, [2] * 5 + [0] * 4 + [3] * 3),
    ("interleaved", 6, 3, 2, [0, 1, 0, 1, 1, 0]),
]


@pytest.mark.parametrize("name,n,c,k,slots", CASES, ids=[c[0] for c in CASES])
def test_ssm_conv_matches_the_loop(dev, name, n, c, k, slots):
    rng = np.random.default_rng(n * 31 + c)
    x = rng.normal(size=(n, c)).astype(np.float32)
    w = rng.normal(size=(c, k)).astype(np.float32)
    state = rng.normal(size=(4, (k - 1) * c)).astype(np.float32)
    sl = np.array(slots)
    out, st = run(dev, x, state, w, sl)
    want_out, want_st = loop_conv(x, state, w, sl)
    np.testing.assert_allclose(out, want_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(st, want_st)  # the state rows are copies of inputs: exact
    untouched = sorted(set(range(4)) - set(slots))
    np.testing.assert_array_equal(st[untouched], state[untouched])


def test_state_carried_across_two_chunks_equals_one_call(dev):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(23, 9)).astype(np.float32)
    w = rng.normal(size=(9, 3)).astype(np.float32)
    state = np.zeros((2, 18), np.float32)
    whole, st_whole = run(dev, x, state, w, np.ones(23))
    a, st = run(dev, x[:10], state, w, np.ones(10))
    b, st = run(dev, x[10:], st, w, np.ones(13))
    np.testing.assert_array_equal(np.concatenate([a, b]), whole)
    np.testing.assert_array_equal(st, st_whole)
    # the state matters: a fresh state for the second chunk gives other outputs at its first rows
    fresh, _ = run(dev, x[10:], state, w, np.ones(13))
    assert not np.allclose(fresh[:2], b[:2])
    np.testing.assert_array_equal(fresh[2:], b[2:])  # past d_conv - 1 rows the window is the chunk's own


def test_mul(dev):
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=(3, 5)).astype(np.float32)
    buf = dev.buffer("t")
    ta, tb, to = buf.empty((3, 5)), buf.empty((3, 5)), buf.empty((3, 5))
    dev.write(ta, a)
    dev.write(tb, b)
    dev.mul(to, ta, tb)
    np.testing.assert_array_equal(dev.read(to), a * b)
    buf.release()


def test_shape_errors(dev):
    buf = dev.buffer("t")
    x, out, w = buf.empty((3, 4)), buf.empty((3, 4)), buf.empty((4, 3))
    slots = buf.empty((3,), T.I32)
    with pytest.raises(ShapeError, match="ssm_conv"):
        dev.ssm_conv(out, x, buf.empty((2, 12)), w, slots)  # state of 3 rows, kernel of 3 wants 2
    with pytest.raises(ShapeError, match="ssm_conv"):
        dev.ssm_conv(out, x, buf.empty((2, 8)), buf.empty((4, 1)), slots)  # a kernel of one tap
    buf.release()


def test_recurrent_ops_are_apart_from_the_default_and_moe_ops():
    assert RECURRENT_OPS == ("ssm_conv", "mul", "silu", "sigmoid_mul", "l2_norm", "gdn_gate", "gated_delta_net",
                             "ssm_scan", "ssm_norm", "scale")
    assert not set(RECURRENT_OPS) & (set(OPS) | set(MOE_OPS))
    assert set(RECURRENT_OPS) <= set(CpuBackend().open(0).info.ops)


@pytest.fixture(scope="module", params=["opencl", "vulkan"])
def opencl(request):
    """Each device family with recurrent kernels (OpenCL ``kernels/recurrent.cl``, Vulkan
    ``glsl/ssm_conv.comp`` and ``mul.comp``)."""
    from conftest import open_family_device
    return open_family_device(request.param)


def _run_on(d, x, state, w, slots):
    buf = d.buffer("t")
    try:
        tx, ts, tw = buf.empty(x.shape), buf.empty(state.shape), buf.empty(w.shape)
        tsl, to = buf.empty(slots.shape, T.I32), buf.empty(x.shape)
        d.write(tx, x)
        d.write(ts, state)
        d.write(tw, w)
        d.write(tsl, slots.astype(np.int32))
        d.ssm_conv(to, tx, ts, tw, tsl)
        return d.read(to), d.read(ts)
    finally:
        buf.release()


@pytest.mark.parametrize("name,n,c,k,slots", CASES + [("wide", 5, 1000, 3, [1, 1, 0, 0, 0])],
                         ids=[c[0] for c in CASES] + ["wide"])
def test_device_ssm_conv_matches_numpy(dev, opencl, name, n, c, k, slots):
    assert set(RECURRENT_OPS) <= set(opencl.info.ops)
    rng = np.random.default_rng(n * 7 + c)
    x = rng.normal(size=(n, c)).astype(np.float32)
    w = rng.normal(size=(c, k)).astype(np.float32)
    state = rng.normal(size=(4, (k - 1) * c)).astype(np.float32)
    sl = np.array(slots)
    out, st = _run_on(opencl, x, state, w, sl)
    want_out, want_st = run(dev, x, state, w, sl)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(st, want_st)


def test_device_state_across_two_chunks_and_mul(dev, opencl):
    rng = np.random.default_rng(9)
    x = rng.normal(size=(17, 33)).astype(np.float32)
    w = rng.normal(size=(33, 3)).astype(np.float32)
    state = np.zeros((2, 66), np.float32)
    whole, _ = run(dev, x, state, w, np.zeros(17))
    a, st = _run_on(opencl, x[:6], state, w, np.zeros(6))
    b, _ = _run_on(opencl, x[6:], st, w, np.zeros(11))
    np.testing.assert_allclose(np.concatenate([a, b]), whole, rtol=1e-5, atol=1e-5)
    buf = opencl.buffer("m")
    ta, tb, to = buf.empty((17, 33)), buf.empty((17, 33)), buf.empty((17, 33))
    opencl.write(ta, x)
    opencl.write(tb, x[::-1].copy())
    opencl.mul(to, ta, tb)
    np.testing.assert_array_equal(opencl.read(to), x * x[::-1])
    buf.release()
