"""OpenCL K-quant matmuls on llama.cpp's block_q8_K activations (quant.cl store_q8k, dotq8k.cl, mmq8.cl).

On PoCL, in the host-ISA build (AVX-512 code where clang predefines it) and the portable one
(``-DCOOKTOP_PORTABLE=1``, the kernels GPUs run) and the GPU launch shape: the quantize kernel is byte for byte
``quantize_q8_K_ref`` (llama.cpp's quantize_row_q8_K_ref); Q4_K / Q5_K / Q6_K matmuls are exact
against numpy on the same q8_K activations (float64); a prompt gives each token the one-token
sums bit for bit; the fused producers (rmsnorm, silu_mul) write the same copy as the standalone
kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import skip_or_fail
from gguf import GGMLQuantizationType as T
from test_opencl_q8 import _pocl

from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.backends.opencl.programs import GPU_SHAPE, KernelCache
from cooktop.backends.reference import dequantize_activations_ref, dequantize_q8_K_ref, quantize_q8_K_ref
from cooktop.format.quants import dequantize, random_weight

K_TYPES = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K]
EXACT = 1e-12  # nmse against float64 on the same 8-bit activations (float32 sums of exact int32s)


def _device(kind: str, mp):
    """PoCL's host-ISA build, its portable build, or the GPU launch shape (work-groups sharing a
    row) on PoCL; where another OpenCL device is listed (Oclgrind, a simulated GPU, in
    ``make test-opencl-validation``; a real GPU), that device for each kind."""
    res = registry.probe("opencl")
    if not res.available:
        skip_or_fail("opencl", f"{res.reason}; to enable: {res.hint}")
    other = [d for d in res.devices if "Portable Computing Language" not in d.platform]
    if other:
        return registry.open_device(other[0].selector)
    if kind != "gpu-shape":
        return _pocl(kind == "portable", mp)
    dev = _pocl(False, mp)
    gpu = type(dev)(dev.info, dev.cl_device)
    gpu.shape = GPU_SHAPE
    gpu.kernels = KernelCache(gpu.ctx, gpu.cl_device, GPU_SHAPE)
    return gpu


@pytest.fixture(params=["native", "portable", "gpu-shape"], scope="module")
def kdev(request):
    mp = pytest.MonkeyPatch()
    mp.setenv("COOKTOP_OPENCL_Q8K", "1")
    try:
        yield _device(request.param, mp)
    finally:
        mp.undo()


def _read_q8k(dev, slot, n_rows: int, n: int):
    q = np.empty(n_rows * n, np.int8)
    rec = np.empty(n_rows * n // 256 * 16, np.float32)
    dev._cl.enqueue_copy(dev.queue, q, slot.xq)
    dev._cl.enqueue_copy(dev.queue, rec, slot.xd, is_blocking=True)
    rec = rec.reshape(n_rows, n // 256, 16)
    bsums = rec[..., :8].copy().view(np.int16).reshape(n_rows, -1)
    return q.reshape(n_rows, n), rec[..., 8], bsums


def test_reference_q8_K():
    """ggml's conventions: d = -max / 127 for the first value of largest |x| (which gets -127),
    q <= 127, bsums per 16, zero super-blocks all zero, whole super-blocks only."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    x[0, 5], x[0, 9] = 4.0, -4.0  # a tie in |x|: the first one sets the sign
    x[1, 256:] = 0
    q, d, bs = quantize_q8_K_ref(x)
    assert q[0, 5] == -127 and q[0, 9] == 127 and d[0, 0] == np.float32(1.0) / np.float32(-127.0 / 4.0)
    assert q.dtype == np.int8 and q.astype(int).max() <= 127 and q.astype(int).min() >= -127
    assert d[1, 1] == 0 and not q[1, 256:].any() and not bs[1, 16:].any()
    np.testing.assert_array_equal(bs, q.reshape(2, 32, 16).astype(int).sum(-1))
    assert np.abs(dequantize_q8_K_ref(x) - x).max() <= np.abs(d).max() / 2 + 1e-6
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q8_K_ref(np.zeros((1, 288), np.float32))


def test_quantize_kernel_is_the_reference(kdev):
    dev = kdev
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 768)) * 3).astype(np.float32)
    x[0, 300], x[0, 301] = -9.0, 9.0
    x[2, :256] = 0
    xt = dev.empty((3, 768))
    dev.write(xt, x)
    got = _read_q8k(dev, dev._q8_input(xt, "q8_K"), 3, 768)
    for g, w in zip(got, quantize_q8_K_ref(x), strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("ty", K_TYPES, ids=lambda t: t.name)
def test_matmul_exact_and_prompt_is_tokens_one_at_a_time(kdev, ty):
    """3 super-blocks per row, row counts off the work-group multiples, prompts of 3, 9, 37 and 70
    tokens (not multiples of the prompt kernel's passes of 16 tokens; 70: Q4_K / Q5_K's work-items
    take 64 tokens each, so two, the second partial): exact on q8_K, prompt rows = one-token rows.
    On the CPU launch shape every type has a prompt kernel (mul_mm_q8: VNNI, or dotq8k.cl's
    unpack-once kernel, whose tiles of 8 tokens x 4 rows these counts also miss)."""
    dev = kdev
    rng = np.random.default_rng(int(ty))
    n_in = 768
    k = dev.kernels.weights(ty, False)
    assert (k.mul_mm_q8 is not None) == dev.kernels.mm_q8(ty, (16, n_in))
    if dev.shape.mv_ls == 1 and (dev.kernels.vnni or not dev.kernels._x86_512()):
        assert k.mul_mm_q8 is not None
    for n_out in (13, 130):
        raw = random_weight(ty, (n_out, n_in), rng)
        w = dev.upload(raw, ty, (n_out, n_in))
        wf = dequantize(raw, ty, (n_out, n_in)).astype(np.float64)
        x = (rng.standard_normal((70, n_in)) * 2).astype(np.float32)
        x[2, 256:512] = 0  # an all-zero super-block (d = 0)
        one = []
        for t in range(70):
            xt, y = dev.empty((1, n_in)), dev.empty((1, n_out))
            dev.write(xt, x[t:t + 1])
            dev.matmul(y, xt, w)
            one.append(dev.read(y))
        one = np.concatenate(one)
        assert dev.activation_format(ty, 1) == "q8_K"
        assert nmse(one, dequantize_q8_K_ref(x) @ wf.T) <= EXACT, (ty.name, n_out)
        for n_tok in (3, 9, 37, 70):
            xt, y = dev.empty((n_tok, n_in)), dev.empty((n_tok, n_out))
            dev.write(xt, x[:n_tok])
            dev.matmul(y, xt, w)
            assert dev.activation_format(ty, n_tok, (n_out, n_in)) == "q8_K"
            np.testing.assert_array_equal(dev.read(y), one[:n_tok], err_msg=f"{ty.name} {n_out} {n_tok}")


def test_fused_producers_write_q8_K(kdev):
    """After a K-quant matmul the producers write block_q8_K: the next matmul's result is the
    standalone quantize kernel's on the same float values, and a Q4_0 matmul of the same
    activation still gets its own block_q8_1 copy."""
    dev = kdev
    rng = np.random.default_rng(5)
    n = 512
    raws = {ty: random_weight(ty, (37, n), rng) for ty in (T.Q4_K, T.Q4_0)}
    ws = {ty: dev.upload(r, ty, (37, n)) for ty, r in raws.items()}
    wf = {ty: dequantize(r, ty, (37, n)).astype(np.float64) for ty, r in raws.items()}
    a = (rng.standard_normal((2, n)) * 3).astype(np.float32)
    b = rng.standard_normal((2, n)).astype(np.float32)
    at, bt, mid, y = dev.empty((2, n)), dev.empty((2, n)), dev.empty((2, n)), dev.empty((2, 37))
    dev.write(at, a)
    dev.write(bt, b)
    normw = dev.upload(rng.standard_normal(n).astype(np.float32), T.F32, (n,))
    for produce in (lambda: dev.rmsnorm(mid, at, normw, 1e-5), lambda: dev.silu_mul(mid, at, bt)):
        dev.matmul(y, at, ws[T.Q4_K])  # the producers follow the last format read
        produce()
        assert dev.q8.lookup(mid.handle, 2, n, "q8_K") is not None  # made by the producer itself
        dev.matmul(y, mid, ws[T.Q4_K])
        fused, mid_f = dev.read(y), dev.read(mid)
        assert nmse(fused, dequantize_q8_K_ref(mid_f) @ wf[T.Q4_K].T) <= EXACT
        dev.matmul(y, mid, ws[T.Q4_0])
        fmt = dev.activation_format(T.Q4_0, 2, (37, n))
        assert nmse(dev.read(y), dequantize_activations_ref(mid_f, fmt) @ wf[T.Q4_0].T) <= EXACT
        dev.write(mid, mid_f)  # same values, copy made by quantize_q8k now
        dev.matmul(y, mid, ws[T.Q4_K])
        np.testing.assert_array_equal(dev.read(y), fused)
