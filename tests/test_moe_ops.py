"""The mixture-of-experts ops on the numpy reference (backends/moe_ops.py, cpu_moe.py) against
plain float64 formulas at odd shapes: routing for every gating function, ``matmul_id`` for every
weight type the numpy backend runs (experts with zero rows included; only the selected experts'
blocks read), ``add_id``, ``moe_combine``, ``swiglu_oai``, attention with sinks, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import nmse
from cooktop.backends.cpu import moe as cpu_moe
from cooktop.backends.cpu import quants as cpu_quants
from cooktop.backends.cpu.device import CpuDevice, cpu_info
from cooktop.errors import ShapeError, UnsupportedOpError
from cooktop.format.quants import dequantize, random_weight


@pytest.fixture
def dev():
    d = CpuDevice(cpu_info(), cache_budget=0)
    yield d
    d.close()


def _put(d, a, ty=T.F32):
    t = d.empty(a.shape, ty)
    d.write(t, a)
    return t


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("gating,norm", [("softmax", True), ("softmax", False), ("softmax_weight", False),
                                         ("sigmoid", True)])
def test_route(dev, gating, norm):
    rng = np.random.default_rng(1)
    n, E, k = 13, 11, 3
    logits = rng.standard_normal((n, E)).astype(np.float32) * 2
    ids, w = dev.empty((n, k), T.I32), dev.empty((n, k))
    dev.moe_route(ids, w, _put(dev, logits), gating, norm=norm, scale=2.5 if gating == "sigmoid" else 0.0)
    l64 = logits.astype(np.float64)
    p = {"softmax": _softmax(l64), "sigmoid": 1 / (1 + np.exp(-l64)), "softmax_weight": l64}[gating]
    want_ids = np.argsort(-p, axis=1)[:, :k]
    want = np.take_along_axis(p, want_ids, axis=1)
    if gating == "softmax_weight":
        want = _softmax(want)
    if norm:
        want = want / want.sum(axis=1, keepdims=True)
    if gating == "sigmoid":
        want = want * 2.5
    np.testing.assert_array_equal(dev.read(ids), want_ids)
    np.testing.assert_allclose(dev.read(w), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("gating,norm", [("sigmoid", True), ("softmax", False)])
def test_route_selection_bias(dev, gating, norm):
    """The selection bias (GLM-4.5 / DeepSeek-V3 ``exp_probs_b``) picks the experts by ``p + bias`` and
    leaves their weights ``p`` (llama.cpp build_moe_ffn's ``selection_probs``); large enough here to change
    most rows' choice."""
    rng = np.random.default_rng(7)
    n, E, k = 11, 13, 4
    logits = rng.standard_normal((n, E)).astype(np.float32) * 2
    bias = (rng.standard_normal(E) * 0.3).astype(np.float32)
    ids, w = dev.empty((n, k), T.I32), dev.empty((n, k))
    dev.moe_route(ids, w, _put(dev, logits), gating, norm=norm, scale=2.5 if norm else 0.0, bias=_put(dev, bias))
    l64 = logits.astype(np.float64)
    p = 1 / (1 + np.exp(-l64)) if gating == "sigmoid" else _softmax(l64)
    want_ids = np.argsort(-(p + bias), axis=1)[:, :k]
    assert (want_ids != np.argsort(-p, axis=1)[:, :k]).any(axis=1).sum() >= n // 2
    want = np.take_along_axis(p, want_ids, axis=1)
    if norm:
        want = want / want.sum(axis=1, keepdims=True) * 2.5
    np.testing.assert_array_equal(dev.read(ids), want_ids)
    np.testing.assert_allclose(dev.read(w), want, rtol=1e-5, atol=1e-7)


def test_route_one_expert_is_a_sigmoid_gate(dev):
    """qwen2moe's shared-expert gate: one logit per row, k = 1, sigmoid."""
    g = np.array([[-3.0], [0.0], [2.0]], np.float32)
    ids, w = dev.empty((3, 1), T.I32), dev.empty((3, 1))
    dev.moe_route(ids, w, _put(dev, g), "sigmoid")
    np.testing.assert_array_equal(dev.read(ids), 0)
    np.testing.assert_allclose(dev.read(w), 1 / (1 + np.exp(-g)), rtol=1e-6)


TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.MXFP4]


@pytest.mark.parametrize("per_slot", [False, True], ids=["broadcast", "per-slot"])
@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.name)
def test_matmul_id_every_type(dev, ty, per_slot, monkeypatch):
    monkeypatch.setattr(cpu_quants, "CHUNK_VALUES", 2000)  # several row blocks per expert
    rng = np.random.default_rng(int(ty))
    E, n_out, k, n = 7, 37, 3, 9
    n_in = 512 if ty.name.endswith("_K") else 96
    raw = np.concatenate([random_weight(ty, (n_out, n_in), rng) for _ in range(E)])
    wf = dequantize(raw, ty, (E, n_out, n_in)).astype(np.float64)
    w = dev.upload(raw, ty, (E, n_out, n_in))
    ids = np.stack([rng.choice([0, 2, 3, 6], k, replace=False) for _ in range(n)]).astype(np.int32)  # 1, 4, 5 unused
    x = rng.standard_normal((n, k * n_in if per_slot else n_in)).astype(np.float32)
    out = dev.empty((n, k * n_out))
    dev.matmul_id(out, _put(dev, x), w, _put(dev, ids, T.I32))
    x3 = x.reshape(n, k, n_in) if per_slot else np.repeat(x[:, None], k, axis=1)
    want = np.einsum("nki,nkoi->nko", x3.astype(np.float64), wf[ids]).reshape(n, k * n_out)
    assert nmse(dev.read(out), want) < 1e-10


def test_matmul_id_reads_only_the_selected_experts(dev, monkeypatch):
    """Two of 64 experts selected: exactly their rows are dequantized, once per call."""
    rng = np.random.default_rng(3)
    E, n_out, n_in = 64, 40, 64
    raw = np.concatenate([random_weight(T.Q4_0, (n_out, n_in), rng) for _ in range(E)])
    w = dev.upload(raw, T.Q4_0, (E, n_out, n_in))
    seen = []
    real = cpu_quants.dequantize_rows

    def spy(r, ty, n, out):
        seen.append(r.shape[0])
        return real(r, ty, n, out)

    monkeypatch.setattr(cpu_quants, "dequantize_rows", spy)
    ids = np.array([[5, 60], [60, 5], [5, 60]], np.int32)
    out = dev.empty((3, 2 * n_out))
    dev.matmul_id(out, _put(dev, rng.standard_normal((3, n_in)).astype(np.float32)), w, _put(dev, ids, T.I32))
    assert sum(seen) == 2 * n_out
    assert w.extra is None  # no float32 copy kept


@pytest.mark.parametrize("ty", [T.F32, T.Q8_0])
def test_matmul_id_bits_do_not_depend_on_thread_counts(ty, monkeypatch):
    """An expert's rows give the same bits under 1 or 2 BLAS threads and 1 or 3 dequantization
    threads, and the bits of the dense matmul of that expert's matrix on the same rows (the same
    fixed row blocks, one-thread BLAS each)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(11)
    E, n_out, n_in, n, k = 3, 301, 512, 7, 2
    mats = [random_weight(ty, (n_out, n_in), rng) if ty is not T.F32
            else rng.standard_normal((n_out, n_in)).astype(np.float32) for _ in range(E)]
    ids = np.array([[0, 2], [2, 1], [1, 0], [0, 1], [2, 0], [1, 2], [0, 2]], np.int32)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    outs = []
    for blas, dq in ((1, 1), (2, 3), (2, 1)):
        monkeypatch.setenv("COOKTOP_DEQUANT_THREADS", str(dq))
        with threadpool_limits(blas, user_api="blas"):
            d = CpuDevice(cpu_info(), cache_budget=0)
            w = d.upload(np.concatenate(mats), ty, (E, n_out, n_in))
            out = d.empty((n, k * n_out))
            d.matmul_id(out, _put(d, x), w, _put(d, ids, T.I32))
            outs.append(d.read(out).reshape(n, k, n_out))
            d.close()
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    d = CpuDevice(cpu_info(), cache_budget=0)
    for e in range(E):
        rows, slots = np.nonzero(ids == e)
        we = d.upload(mats[e], ty, (n_out, n_in))
        o = d.empty((len(rows), n_out))
        d.matmul(o, _put(d, np.ascontiguousarray(x[rows])), we)
        np.testing.assert_array_equal(outs[0][rows, slots], d.read(o))
    d.close()


def test_add_id_combine_swiglu_oai(dev):
    rng = np.random.default_rng(4)
    n, k, m, E = 5, 3, 7, 4
    x = rng.standard_normal((n, k * m)).astype(np.float32)
    b = rng.standard_normal((E, m)).astype(np.float32)
    ids = np.array([[0, 1, 2], [3, 2, 1], [1, 1, 0], [3, 0, 2], [2, 3, 0]], np.int32)
    tx = _put(dev, x)
    dev.add_id(tx, tx, _put(dev, b), _put(dev, ids, T.I32))
    want = (x.reshape(n, k, m) + b[ids]).reshape(n, k * m)
    np.testing.assert_allclose(dev.read(tx), want, rtol=1e-6)
    wts = rng.random((n, k)).astype(np.float32)
    out = dev.empty((n, m))
    dev.moe_combine(out, tx, _put(dev, wts))
    np.testing.assert_allclose(dev.read(out), np.einsum("nkm,nk->nm", want.reshape(n, k, m), wts), rtol=1e-5)
    g = (rng.standard_normal((n, m)) * 6).astype(np.float32)
    u = (rng.standard_normal((n, m)) * 6).astype(np.float32)
    o = dev.empty((n, m))
    dev.swiglu_oai(o, _put(dev, g), _put(dev, u), 1.702, 7.0)
    g64 = np.minimum(g, 7.0)
    want = g64 / (1 + np.exp(-1.702 * g64)) * (np.clip(u, -7, 7) + 1)
    np.testing.assert_allclose(dev.read(o), want, rtol=1e-5, atol=1e-6)


def test_attention_sinks(dev):
    """One extra logit per head in each softmax denominator (no value), GQA and a window."""
    rng = np.random.default_rng(5)
    n_head, n_kv, hd, n, window = 4, 2, 8, 11, 4
    q = rng.standard_normal((n, n_head * hd)).astype(np.float32)
    kc = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    vc = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    sinks = rng.standard_normal(n_head).astype(np.float32) * 2
    pos = np.arange(n, dtype=np.int32)
    out = dev.empty((n, n_head * hd))
    dev.attention_sinks(out, _put(dev, q), _put(dev, kc), _put(dev, vc), _put(dev, pos, T.I32), _put(dev, sinks),
                        n_head, n_kv, 0.3, window)
    want = np.zeros((n, n_head * hd))
    for i in range(n):
        for h in range(n_head):
            kh = h // (n_head // n_kv)
            js = [j for j in range(n) if i - window < j <= i]
            s = np.array([q[i, h * hd:(h + 1) * hd] @ kc[j, kh * hd:(kh + 1) * hd] * 0.3 for j in js])
            mx = max(s.max(), sinks[h])
            e = np.exp(s - mx)
            p = e / (e.sum() + np.exp(sinks[h] - mx))
            want[i, h * hd:(h + 1) * hd] = p @ vc[js, kh * hd:(kh + 1) * hd]
    np.testing.assert_allclose(dev.read(out), want, rtol=1e-4, atol=1e-6)


def test_errors(dev):
    x = dev.empty((3, 8))
    ids = dev.empty((3, 2), T.I32)
    w = dev.upload(np.zeros((4, 5, 8), np.float32), T.F32, (4, 5, 8))
    with pytest.raises(ShapeError, match="matmul_id"):
        dev.matmul_id(dev.empty((3, 9)), x, w, ids)
    with pytest.raises(UnsupportedOpError, match="gating"):
        dev.moe_route(ids, dev.empty((3, 2)), dev.empty((3, 4)), "softplus")
    with pytest.raises(ShapeError, match="k <= n_expert"):
        dev.moe_route(dev.empty((3, 5), T.I32), dev.empty((3, 5)), dev.empty((3, 4)), "softmax")
    with pytest.raises(ShapeError, match="bias \\[n_expert\\]"):
        dev.moe_route(ids, dev.empty((3, 2)), dev.empty((3, 4)), "sigmoid", bias=dev.empty((5,)))
    with pytest.raises(ShapeError, match="sinks"):
        dev.attention_sinks(x, x, x, x, dev.empty((3,), T.I32), dev.empty((3,)), 2, 2, 1.0)


def test_route_helper_matches_op():
    """The module function is what the op runs (used by the memory-bound checks)."""
    lg = np.random.default_rng(6).standard_normal((4, 6)).astype(np.float32)
    ids, w = cpu_moe.route(lg, 2, "softmax", True, 0.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
    assert ids.dtype == np.int32 and ids.shape == (4, 2)
