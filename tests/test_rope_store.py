"""Device.rope_store (rope of K, then kv_store into the cache, as one op): on OpenCL one launch
(kv_store.cl rope_store) whose cache bytes equal, bit for bit, those of rope then kv_store, for every
cache type, both rope modes, partial rotary, frequency factors and YaRN, at odd shapes; every
backend's stored rows follow the two ops."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import ROPE_NEOX, ROPE_NORMAL
from cooktop.format.quants import row_bytes

#: (head_dim, n_rot, n_head_kv): whole 32-value blocks per row (96, 192, 32: heads of 8 share a
#: block), and a row of 120 values (float types only); a partial rotary dimension.
SHAPES = [(48, 32, 2), (64, 64, 3), (8, 8, 4), (40, 40, 3)]
#: (frequency factors, ext_factor, attn_factor, freq_scale): plain, Llama 3.1 factors, YaRN.
CASES = [(False, 0.0, 1.0, 1.0), (True, 0.0, 1.0, 1.0), (False, 1.0, 1.0, 0.25)]
N_CTX, N_TOK = 19, 5


@pytest.fixture(scope="module")
def ocl():
    return open_family_device("opencl")


def _raw(d, t) -> np.ndarray:
    """The cache's bytes as stored (OpenCL buffer)."""
    import pyopencl as cl

    host = np.empty(t.shape[0] * row_bytes(t.ggml_type, t.shape[1]), np.uint8)
    cl.enqueue_copy(d.queue, host, t.handle, is_blocking=True)
    return host


@pytest.mark.parametrize("kt", [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_opencl_rope_store_is_rope_then_kv_store_bit_for_bit(ocl, kt):
    d = ocl
    rng = np.random.default_rng(int(kt))
    n_launch = calls = 0
    for head_dim, n_rot, n_kv in SHAPES:
        dim = head_dim * n_kv
        if kt in (T.Q8_0, T.Q4_0) and dim % 32:
            continue
        for mode in (ROPE_NORMAL, ROPE_NEOX):
            for use_ff, ext, attn, scale in CASES:
                x = (rng.standard_normal((N_TOK, dim)) * 3).astype(np.float32)
                pos = np.array([0, 3, 17, 250, 4001], np.int32)
                cells = rng.permutation(N_CTX)[:N_TOK].astype(np.int32)
                cells[2] = N_CTX  # a cell past the cache is skipped by both
                ff = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)
                ff_t = d.upload(ff, T.F32, ff.shape) if use_ff else None
                rope = dict(head_dim=head_dim, n_rot=n_rot, freq_base=10000.0, freq_scale=scale, mode=mode,
                            freq_factors=ff_t, ext_factor=ext, attn_factor=attn, beta_fast=32.0, beta_slow=1.0,
                            n_ctx_orig=64)
                xt, pt, ct = d.empty(x.shape), d.empty((N_TOK,), T.I32), d.empty((N_TOK,), T.I32)
                d.write(xt, x)
                d.write(pt, pos)
                d.write(ct, cells)
                fused, apart = d.zeros((N_CTX, dim), kt), d.zeros((N_CTX, dim), kt)
                l0 = d.n_launches
                d.rope_store(fused, xt, pt, ct, **rope)
                n_launch += d.n_launches - l0
                calls += 1
                np.testing.assert_array_equal(d.read(xt), x)  # x is left alone
                d.rope(xt, xt, pt, **rope)
                d.kv_store(apart, xt, ct)
                got, want = _raw(d, fused), _raw(d, apart)
                assert np.array_equal(got, want), (head_dim, n_rot, mode, use_ff, ext)
                assert want.any()
                d.release([xt, pt, ct, fused, apart] + ([ff_t] if ff_t is not None else []))
    assert calls and n_launch == calls  # one launch each


def test_opencl_rope_store_one_launch_and_numpy_default(ocl, cpu_device):
    """OpenCL: one launch; numpy (the default composite): rope then kv_store, x rotated in place."""
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    for d in (ocl, cpu_device):
        xt, pt, ct = d.empty(x.shape), d.empty((2,), T.I32), d.empty((2,), T.I32)
        d.write(xt, x)
        d.write(pt, np.array([5, 6], np.int32))
        d.write(ct, np.array([1, 0], np.int32))
        cache, ref = d.zeros((4, 64)), d.zeros((4, 64))
        rope = dict(head_dim=16, n_rot=16, freq_base=10000.0, freq_scale=1.0, mode=ROPE_NORMAL)
        l0 = getattr(d, "n_launches", 0)
        d.rope_store(cache, xt, pt, ct, **rope)
        if d is ocl:
            assert d.n_launches - l0 == 1
        yt = d.empty(x.shape)
        d.write(yt, x)
        d.rope(yt, yt, pt, **rope)
        d.kv_store(ref, yt, ct)
        np.testing.assert_array_equal(d.read(cache), d.read(ref))
