"""Parity of the ops the qwen2 / qwen3 / scaled-rope llama blocks added, numpy vs each
device backend at odd shapes, and the numpy rope vs a float32 port of ggml's loop.

- ``add_bias``: a bias row broadcast over rows (qwen2's Q/K/V biases);
- ``rmsnorm`` with a weight of ``g`` values normalising each group of ``g`` (qwen3's per-head
  Q/K norm, ggml_rms_norm on a ``[head_dim, n_head, n]`` view);
- ``rope`` with frequency factors (Llama 3.1 ``rope_freqs``, LongRoPE) and YaRN parameters
  (ggml_rope_ext: ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig).

Bounds as tests/test_ops_parity.py: nmse <= 1e-7 for float ops.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import ROPE_NEOX, ROPE_NORMAL, nmse, rope_yarn_corr_dims

FLOAT_BOUND = 1e-7
MAX_TOK = 64


def _act(dev, data: np.ndarray, rows: int = MAX_TOK):
    data = np.asarray(data)
    ty = T.I32 if data.dtype == np.int32 else T.F32
    t = dev.empty((rows,) + data.shape[1:], ty)
    v = t.head(data.shape[0])
    dev.write(v, data)
    return v


def _out(dev, shape, rows: int = MAX_TOK):
    return dev.empty((rows,) + tuple(shape[1:])).head(shape[0])


def _both(gpu_device, cpu_device, fn):
    return gpu_device.read(fn(gpu_device)), cpu_device.read(fn(cpu_device))


@pytest.mark.parametrize("n_tok,n_group,g", [(1, 8, 64), (7, 3, 48), (64, 5, 100), (3, 1, 224)])
def test_rmsnorm_groups(gpu_device, cpu_device, n_tok, n_group, g):
    rng = np.random.default_rng(n_tok * g)
    x = (rng.standard_normal((n_tok, n_group * g)) * 3).astype(np.float32)
    w = rng.standard_normal(g).astype(np.float32)
    for in_place in (False, True):
        def run(dev, in_place=in_place):
            xt = _act(dev, x)
            out = xt if in_place else _out(dev, x.shape)
            dev.rmsnorm(out, xt, dev.upload(w, T.F32, (g,)), 1e-6)
            return out

        got, ref = _both(gpu_device, cpu_device, run)
        assert nmse(got, ref) <= FLOAT_BOUND, f"in_place {in_place}"
    v = x.reshape(n_tok, n_group, g).astype(np.float64)  # the definition, per group
    want = v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6) * w
    assert nmse(ref, want.reshape(x.shape)) <= 1e-12


@pytest.mark.parametrize("shape", [(1, 224), (7, 1000), (64, 100), (5, 3)])
def test_add_bias(gpu_device, cpu_device, shape):
    rng = np.random.default_rng(shape[1])
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    for in_place in (False, True):
        def run(dev, in_place=in_place):
            xt = _act(dev, x)
            out = xt if in_place else _out(dev, shape)
            dev.add_bias(out, xt, dev.upload(b, T.F32, b.shape))
            return out

        got, ref = _both(gpu_device, cpu_device, run)
        np.testing.assert_array_equal(ref, x + b)
        assert nmse(got, ref) <= FLOAT_BOUND


#: (ff, ext_factor, attn_factor, freq_scale): plain, frequency factors, YaRN, YaRN + factors, attn_factor only
ROPE_CASES = [(False, 0.0, 1.0, 1.0), (True, 0.0, 1.0, 1.0), (False, 1.0, 1.0, 0.25), (True, 1.0, 0.9, 0.125),
              (False, 0.0, 0.7, 0.5)]


def _ggml_rope(x, pos, head_dim, n_rot, freq_base, freq_scale, mode, ff, ext_factor, attn_factor,
               beta_fast, beta_slow, n_ctx_orig):
    """ggml-cpu ops.cpp ``ggml_compute_forward_rope_flt`` in float32, loop for loop (the oracle of the
    numpy backend): theta advances by ``theta_scale`` per pair; ``rope_yarn`` per pair."""
    f32 = np.float32
    n = x.shape[0]
    v = x.reshape(n, -1, head_dim)
    out = v.copy()
    theta_scale = f32(f32(freq_base) ** f32(-2.0 / n_rot))
    lo, hi = rope_yarn_corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)
    for t in range(n):
        theta = f32(pos[t])
        cache = np.zeros((n_rot // 2, 2), f32)
        for i in range(n_rot // 2):
            t_extrap = f32(theta / (f32(ff[i]) if ff is not None else f32(1)))
            t_interp = f32(freq_scale) * t_extrap
            th, mscale = t_interp, f32(attn_factor)
            if ext_factor != 0.0:
                y = (i - f32(lo)) / max(f32(0.001), f32(hi) - f32(lo))
                mix = f32(1 - min(1, max(0, y))) * f32(ext_factor)
                th = t_interp * (1 - mix) + t_extrap * mix
                mscale = f32(mscale * f32(1.0 + 0.1 * math.log(1.0 / freq_scale)))
            cache[i] = (f32(math.cos(th)) * mscale, f32(math.sin(th)) * mscale)
            theta = f32(theta * theta_scale)
        for i in range(n_rot // 2):
            a, b = (i, i + n_rot // 2) if mode == ROPE_NEOX else (2 * i, 2 * i + 1)
            c, s = cache[i]
            out[t, :, a] = v[t, :, a] * c - v[t, :, b] * s
            out[t, :, b] = v[t, :, a] * s + v[t, :, b] * c
    return out.reshape(x.shape)


@pytest.mark.parametrize("case", ROPE_CASES, ids=["plain", "ff", "yarn", "yarn-ff", "attn"])
@pytest.mark.parametrize("mode", [ROPE_NORMAL, ROPE_NEOX])
def test_rope_numpy_matches_ggml(cpu_device, case, mode):
    use_ff, ext, attn, scale = case
    head_dim, n_rot, n_tok = 48, 32, 5
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n_tok, 3 * head_dim)).astype(np.float32)
    pos = np.array([0, 1, 17, 300, 4000], dtype=np.int32)
    ff = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32) if use_ff else None
    d = cpu_device
    out = _out(d, x.shape)
    d.rope(out, _act(d, x), _act(d, pos), head_dim, n_rot, 500000.0, scale, mode,
           d.upload(ff, T.F32, ff.shape) if use_ff else None, ext, attn, 32.0, 1.0, 64)
    want = _ggml_rope(x, pos, head_dim, n_rot, 500000.0, scale, mode, ff, ext, attn, 32.0, 1.0, 64)
    assert nmse(d.read(out), want) <= 1e-8  # ggml accumulates theta in float32: ~1e-10 at pos 4000


@pytest.mark.parametrize("case", ROPE_CASES, ids=["plain", "ff", "yarn", "yarn-ff", "attn"])
@pytest.mark.parametrize("mode", [ROPE_NORMAL, ROPE_NEOX])
@pytest.mark.parametrize("n_tok,head_dim,n_rot", [(1, 64, 64), (7, 48, 32)])
def test_rope_ext(gpu_device, cpu_device, case, mode, n_tok, head_dim, n_rot):
    use_ff, ext, attn, scale = case
    n_head = 5
    rng = np.random.default_rng(n_tok + head_dim + mode)
    x = rng.standard_normal((n_tok, n_head * head_dim)).astype(np.float32)
    pos = np.arange(37, 37 + n_tok, dtype=np.int32)
    ff = rng.uniform(1.0, 8.0, n_rot // 2 + 3).astype(np.float32)  # longer than n_rot/2 is allowed
    for in_place in (False, True):
        def run(dev, in_place=in_place):
            xt = _act(dev, x)
            out = xt if in_place else _out(dev, x.shape)
            dev.rope(out, xt, _act(dev, pos), head_dim, n_rot, 10000.0, scale, mode,
                     dev.upload(ff, T.F32, ff.shape) if use_ff else None, ext, attn, 32.0, 1.0, 128)
            return out

        got, ref = _both(gpu_device, cpu_device, run)
        assert nmse(got, ref) <= FLOAT_BOUND, f"in_place {in_place}"
        if n_rot < head_dim:
            g = got.reshape(n_tok, n_head, head_dim)[..., n_rot:]
            np.testing.assert_array_equal(g, x.reshape(n_tok, n_head, head_dim)[..., n_rot:])
