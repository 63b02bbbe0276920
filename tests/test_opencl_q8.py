"""OpenCL integer-dot matmuls on 8-bit activations (dotq8.cl, quant.cl, opencl/q8.py) on PoCL.

Both builds are checked: the host-ISA one (x86 pmaddubsw code where clang predefines
__AVX2__) and the portable OpenCL C one (``-DCOOKTOP_PORTABLE=1``). Each is exact
against numpy on the same 8-bit activations (``quantize_q8_ref``) and within the
quantized bound of the float product; the fused producers (rmsnorm, silu_mul) give the
same 8-bit copy as the standalone quantize kernel, and a copy is never used after its
activation changed.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import skip_or_fail
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.backends.opencl.programs import Q8_TYPES
from cooktop.backends.reference import dequantize_activations_ref, dequantize_q8_ref, quantize_q8_ref
from cooktop.errors import ShapeError
from cooktop.format.quants import dequantize, random_weight

QUANT_BOUND = 5e-4


def _pocl(portable: bool, monkeypatch):
    res = registry.probe("opencl")
    if not res.available:
        skip_or_fail("opencl", f"{res.reason}; to enable: {res.hint}")
    info = next((d for d in res.devices if "Portable Computing Language" in d.platform and d.device_type == "cpu"),
                None)
    if info is None:
        skip_or_fail("opencl", "no PoCL device (apt-get install pocl-opencl-icd)")
    if portable:
        monkeypatch.setenv("COOKTOP_OPENCL_OPTIONS", "-DCOOKTOP_PORTABLE=1")
    dev = registry.open_device(info.selector)
    if portable:  # a fresh device object reads the options when it is made
        dev = type(dev)(dev.info, dev.cl_device)
    return dev


@pytest.fixture(params=[False, True], ids=["native", "portable"], scope="module")
def q8dev(request):
    mp = pytest.MonkeyPatch()
    try:
        yield _pocl(request.param, mp)
    finally:
        mp.undo()


def _n_in(ty: T) -> int:
    return 768 if ty.name.endswith("_K") else 32 * 7


def test_reference_quantizer():
    """quantize_q8_ref: |q| <= 127, d = max|x| / 127, s = d * sum(q), zero blocks stay zero."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[1, 32:64] = 0
    q, d, s = quantize_q8_ref(x)
    assert q.dtype == np.int8 and np.abs(q.astype(int)).max() == 127
    np.testing.assert_allclose(d[0], np.abs(x[0].reshape(3, 32)).max(axis=1) / 127, rtol=1e-6)
    assert d[1, 1] == 0 and not q[1, 32:64].any() and s[1, 1] == 0
    np.testing.assert_allclose(s, d * q.reshape(3, 3, 32).sum(-1), rtol=1e-6)
    assert np.abs(dequantize_q8_ref(x) - x).max() <= d.max() / 2 + 1e-7
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_ref(np.zeros((1, 40), np.float32))


@pytest.mark.parametrize("ty", Q8_TYPES, ids=lambda t: t.name)
def test_matvec_exact_on_8bit_activations(q8dev, ty):
    dev = q8dev
    assert dev.quantizes_activations(ty, 1) and dev.quantizes_activations(ty, 2)  # prompts too (mul_mvt_q8)
    rng = np.random.default_rng(int(ty))
    n_in = _n_in(ty)
    for n_out in (1, 3, 129, 1000):
        raw = random_weight(ty, (n_out, n_in), rng)
        x = (rng.standard_normal((1, n_in)) * 2).astype(np.float32)
        xt, y = dev.empty((5, n_in)).head(1), dev.empty((1, n_out))
        dev.write(xt, x)
        dev.matmul(y, xt, dev.upload(raw, ty, (n_out, n_in)))
        got = dev.read(y)
        wf = dequantize(raw, ty, (n_out, n_in)).astype(np.float64)
        exact = dequantize_activations_ref(x, dev.activation_format(ty, 1)) @ wf.T
        assert nmse(got, exact) <= 1e-10, (ty.name, n_out, nmse(got, exact))
        if n_out >= 129:
            assert nmse(got, x.astype(np.float64) @ wf.T) <= QUANT_BOUND, (ty.name, n_out)


@pytest.mark.parametrize("ty", [T.Q4_0, T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_fused_producers_match_standalone_quantize(q8dev, ty):
    """rmsnorm and silu_mul write the 8-bit copy themselves; the matmul that follows gives
    exactly what the standalone quantize kernel gives on the same float values."""
    dev = q8dev
    rng = np.random.default_rng(7)
    n = 512
    raw = random_weight(ty, (67, n), rng)
    w = dev.upload(raw, ty, (67, n))
    wf = dequantize(raw, ty, (67, n)).astype(np.float64)
    a = (rng.standard_normal((1, n)) * 3).astype(np.float32)
    b = rng.standard_normal((1, n)).astype(np.float32)
    nw = rng.standard_normal(n).astype(np.float32)
    at, bt, mid, y = dev.empty((1, n)), dev.empty((1, n)), dev.empty((1, n)), dev.empty((1, 67))
    dev.write(at, a)
    dev.write(bt, b)
    normw = dev.upload(nw, T.F32, (n,))
    for produce in (lambda: dev.rmsnorm(mid, at, normw, 1e-5), lambda: dev.silu_mul(mid, at, bt)):
        produce()
        dev.matmul(y, mid, w)
        fused, mid_f = dev.read(y), dev.read(mid)
        exact = dequantize_activations_ref(mid_f, dev.activation_format(ty, 1)) @ wf.T
        assert nmse(fused, exact) <= 1e-10
        dev.write(mid, mid_f)  # same values, copy made by quantize_q8 now
        dev.matmul(y, mid, w)
        np.testing.assert_allclose(dev.read(y), fused, rtol=1e-5, atol=1e-5)


def test_copy_is_never_stale(q8dev):
    """Every way of changing an activation drops its 8-bit copy: write, an op writing it in
    place, an op writing into it, a longer head() view than the copy holds."""
    dev = q8dev
    ty, n = T.Q4_0, 256
    rng = np.random.default_rng(3)
    raw = random_weight(ty, (40, n), rng)
    w = dev.upload(raw, ty, (40, n))
    wf = dequantize(raw, ty, (40, n)).astype(np.float64)
    x = dev.empty((4, n))
    y = dev.empty((4, 40))
    other = dev.empty((1, n))
    normw = dev.upload(np.ones(n, np.float32), T.F32, (n,))

    def check(expect_x):
        dev.matmul(y.head(1), x.head(1), w)
        got = dev.read(y.head(1))
        assert nmse(got, dequantize_q8_ref(expect_x) @ wf.T) <= 1e-10

    a = rng.standard_normal((1, n)).astype(np.float32)
    dev.write(x.head(1), a)
    check(a)
    b = rng.standard_normal((1, n)).astype(np.float32)
    dev.write(x.head(1), b)  # host write
    check(b)
    dev.rmsnorm(x.head(1), x.head(1), normw, 1e-5)  # fused producer, in place
    check(dev.read(x.head(1)))
    dev.write(other, a)
    dev.add(x.head(1), x.head(1), other)  # non-quantizing op writing it
    check(dev.read(x.head(1)))
    dev.copy(x.head(1), other)
    check(a)
    dev.silu_mul(x.head(1), other, other)
    check(dev.read(x.head(1)))
    dev.get_rows(x.head(1), other, _ids(dev, [0]))
    check(a)


def _ids(dev, ids):
    t = dev.empty((len(ids),), T.I32)
    dev.write(t, np.array(ids, dtype=np.int32))
    return t


def test_q4_0_repacked_layout(q8dev):
    """Q4_0 matrices of n_out % 16 == 0 rows are repacked on upload (16 rows in the lanes) where
    the 64-byte SIMD kernels build (AVX-512BW): mat-vec, mat-mat and get_rows read the layout right
    at odd block / row-group counts, other row counts keep block_q4_0, and the temporary raw copy
    is not counted as an allocation."""
    dev = q8dev
    rng = np.random.default_rng(11)
    for n_in in (32, 224, 384):
        assert dev.kernels.repacks(T.Q4_0, (48, n_in)) == (dev.kernels.isa()["avx512bw"]
                                                           and not dev.kernels.isa()["portable"])
        assert not dev.kernels.repacks(T.Q4_0, (5, n_in)) and not dev.kernels.repacks(T.Q4_0, (40, n_in))
        for n_out in (16, 48, 3):
            raw = random_weight(T.Q4_0, (n_out, n_in), rng)
            wf = dequantize(raw, T.Q4_0, (n_out, n_in)).astype(np.float64)
            before = dev.allocated_bytes
            w = dev.upload(raw, T.Q4_0, (n_out, n_in))
            assert dev.allocated_bytes - before == raw.nbytes
            for n_tok in (1, 7):
                x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
                xt, y = dev.empty((n_tok, n_in)), dev.empty((n_tok, n_out))
                dev.write(xt, x)
                dev.matmul(y, xt, w)
                q8 = dev.quantizes_activations(T.Q4_0, n_tok, (n_out, n_in))
                ref = (dequantize_q8_ref(x) if q8 else x.astype(np.float64)) @ wf.T
                assert nmse(dev.read(y), ref) <= (1e-10 if q8 else 1e-12), (n_in, n_out, n_tok)
            ids = np.array([n_out - 1, 0, n_out // 2], dtype=np.int32)
            out = dev.empty((3, n_in))
            dev.get_rows(out, w, _ids(dev, ids))
            np.testing.assert_array_equal(dev.read(out), wf[ids].astype(np.float32))


def test_attention_writes_8bit_copy(q8dev):
    """attention (serial CPU flavour, head_dim % 32 == 0) writes the 8-bit copy of its output
    for the output projection: same product as quantizing the output afterwards."""
    dev = q8dev
    rng = np.random.default_rng(5)
    n_head, n_head_kv, hd, n_ctx = 4, 2, 64, 9
    width = n_head * hd
    raw = random_weight(T.Q4_0, (33, width), rng)
    w = dev.upload(raw, T.Q4_0, (33, width))
    wf = dequantize(raw, T.Q4_0, (33, width)).astype(np.float64)
    q, att, y = dev.empty((1, width)), dev.empty((1, width)), dev.empty((1, 33))
    kc, vc = dev.empty((n_ctx, n_head_kv * hd)), dev.empty((n_ctx, n_head_kv * hd))
    pos = _ids(dev, [6])
    for t, a in ((q, (1, width)), (kc, kc.shape), (vc, vc.shape)):
        dev.write(t, rng.standard_normal(a).astype(np.float32))
    dev.attention(att, q, kc, vc, pos, n_head, n_head_kv, 0.125)
    dev.matmul(y, att, w)
    got, att_f = dev.read(y), dev.read(att)
    assert nmse(got, dequantize_q8_ref(att_f) @ wf.T) <= 1e-10


def test_drop_file_pages(tmp_path):
    """After an upload to a CPU device the file pages of the weight are unmapped (not resident
    twice); the data reads back unchanged; anonymous memory is never touched."""
    from cooktop.backends.opencl.device import drop_file_pages

    data = np.random.default_rng(0).integers(0, 255, 3 << 20, dtype=np.uint8)
    path = tmp_path / "w.bin"
    data.tofile(path)
    mm = np.memmap(path, mode="r")
    view = mm[12345:12345 + (2 << 20)]
    assert int(view.sum()) > 0  # resident now
    assert drop_file_pages(view) >= (2 << 20) - 2 * 4096
    np.testing.assert_array_equal(view, data[12345:12345 + (2 << 20)])
    anon = data.copy()
    assert drop_file_pages(anon) == 0 and np.array_equal(anon, data)
    assert drop_file_pages(np.memmap(path, mode="c")) == 0


@pytest.mark.parametrize("ty", [T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_prompt_matrices_vnni(q8dev, ty):
    """mul_mm_q8 (Q8_0, repacked Q4_0, Q4_K, Q5_K and Q6_K, on a CPU with AVX-512 VNNI; Q4_K, Q5_K and
    Q6_K on block_q8_K also without the 64-byte x86 code: dotq8k.cl's unpack-once kernel): exact against
    numpy on 8-bit activations at odd row/token/group counts, within the quantized bound of the float
    product; Q4_0 matrices of other row counts and builds without VNNI run mul_mvt_q8 (also exact on
    8-bit activations), or the float mul_mm with COOKTOP_OPENCL_EXACT_PROMPT=0."""
    dev = q8dev
    rng = np.random.default_rng(13)
    vnni = dev.kernels.vnni
    unpack_once = (ty in (T.Q4_K, T.Q5_K, T.Q6_K) and dev.kernels.q8k(ty) and dev.kernels.mmq_k
                   and dev.shape.mv_ls == 1 and not dev.kernels._x86_512())
    if not vnni and not unpack_once and not dev.kernels.isa()["portable"]:
        pytest.skip("this CPU has no AVX-512 VNNI (the float mul_mm runs; test_ops_parity covers it)")
    n_ins = {T.Q4_0: (128, 384, 224), T.Q8_0: (32, 224, 2080)}.get(ty, (256, 768, 1280))
    for n_in in n_ins:
        for n_out in (1, 48, 144) if ty == T.Q4_0 else (1, 3, 129):  # Q4_0: repacked for n_out % 16 == 0
            raw = random_weight(ty, (n_out, n_in), rng)
            w = dev.upload(raw, ty, (n_out, n_in))
            wf = dequantize(raw, ty, (n_out, n_in)).astype(np.float64)
            for n_tok in (2, 9, 17) + ((67,) if ty == T.Q8_0 else ()):  # Q8_0: 64 tokens per work-item
                x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
                x[-1, n_in - 32:] = 0  # an all-zero activation block (d = 0)
                xt, y = dev.empty((70, n_in)).head(n_tok), dev.empty((70, n_out)).head(n_tok)
                dev.write(xt, x)
                dev.matmul(y, xt, w)
                got = dev.read(y)
                q8 = dev.quantizes_activations(ty, n_tok, (n_out, n_in))
                mm = unpack_once or (vnni and (ty != T.Q4_0 or n_out % 16 == 0))
                assert q8 == (dev.exact_prompt or mm)
                assert dev.kernels.mm_q8(ty, (n_out, n_in)) == mm
                assert (dev.kernels.weights(ty, dev.kernels.repacks(ty, (n_out, n_in))).mul_mm_q8 is not None) == mm
                if q8:
                    xr = dequantize_activations_ref(x, dev.activation_format(ty, n_tok, (n_out, n_in)))
                    assert nmse(got, xr @ wf.T) <= 1e-10, (n_in, n_out, n_tok)
                    if n_out >= 129:
                        assert nmse(got, x.astype(np.float64) @ wf.T) <= QUANT_BOUND
                else:
                    assert nmse(got, x.astype(np.float64) @ wf.T) <= 1e-12, (n_in, n_out, n_tok)


def test_q4_k_prompt_kernel_can_be_turned_off(monkeypatch):
    """COOKTOP_OPENCL_MMQ_K=0 (with COOKTOP_OPENCL_EXACT_PROMPT=0): Q4_K, Q5_K and Q6_K prompt matrices
    stay on the float mul_mm (Q4_0's VNNI kernel stays)."""
    monkeypatch.setenv("COOKTOP_OPENCL_MMQ_K", "0")
    monkeypatch.setenv("COOKTOP_OPENCL_EXACT_PROMPT", "0")
    dev = _pocl(False, monkeypatch)
    dev = type(dev)(dev.info, dev.cl_device)
    assert not dev.quantizes_activations(T.Q4_K, 8, (64, 256))
    assert not dev.quantizes_activations(T.Q5_K, 8, (64, 256))
    assert not dev.quantizes_activations(T.Q6_K, 8, (64, 256))
    assert dev.kernels.weights(T.Q4_K).mul_mm_q8 is None and dev.kernels.weights(T.Q6_K).mul_mm_q8 is None
    assert dev.quantizes_activations(T.Q4_0, 8, (64, 256)) == dev.kernels.vnni
    assert dev.quantizes_activations(T.Q8_0, 8, (64, 96)) == dev.kernels.vnni
    assert (dev.kernels.weights(T.Q8_0).mul_mm_q8 is not None) == dev.kernels.vnni


def test_fused_producers_many_rows(q8dev):
    """With VNNI, rmsnorm and silu_mul of several rows write the 8-bit copy the prompt matmul reads."""
    dev = q8dev
    rng = np.random.default_rng(17)
    n, rows = 384, 5
    raw = random_weight(T.Q4_0, (40, n), rng)
    w = dev.upload(raw, T.Q4_0, (40, n))
    wf = dequantize(raw, T.Q4_0, (40, n)).astype(np.float64)
    a = rng.standard_normal((rows, n)).astype(np.float32)
    at, mid, y = dev.empty((8, n)).head(rows), dev.empty((8, n)).head(rows), dev.empty((8, 40)).head(rows)
    dev.write(at, a)
    normw = dev.upload(rng.standard_normal(n).astype(np.float32), T.F32, (n,))
    for produce in (lambda: dev.rmsnorm(mid, at, normw, 1e-5), lambda: dev.silu_mul(mid, at, at)):
        produce()
        dev.matmul(y, mid, w)
        got, mid_f = dev.read(y), dev.read(mid)
        xr = dequantize_q8_ref(mid_f) if dev.quantizes_activations(T.Q4_0, rows, (40, n)) else mid_f.astype(np.float64)
        assert nmse(got, xr @ wf.T) <= 1e-10


@pytest.mark.parametrize("ty", [T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_prompt_kernels_equal_one_token_kernels(q8dev, ty):
    """Every prompt matrix on 8-bit activations (mul_mm_q8 where the CPU has AVX-512 VNNI, and for Q4_K,
    Q5_K, Q6_K on block_q8_K dotq8k.cl's unpack-once kernel elsewhere on the CPU launch shape; else
    mul_mvt_q8) gives each token exactly the one-token kernel's floats, at odd row and token
    counts and a zero activation block: a prompt's logits do not depend on how it was split.
    Q8_0 also at 75 tokens (its work-items run 64: a second, partial one)."""
    dev = q8dev
    rng = np.random.default_rng(29)
    n_in = {T.Q4_0: 224, T.Q8_0: 224}.get(ty, 768)
    for n_out in (16, 80) if ty == T.Q4_0 else (3, 67):  # Q4_0: repacked row groups of 16
        raw = random_weight(ty, (n_out, n_in), rng)
        w = dev.upload(raw, ty, (n_out, n_in))
        n_tok = 75 if ty == T.Q8_0 and n_out == 67 else 11
        if dev.kernels.vnni or dev.kernels.mm_q8(ty, (n_out, n_in)):
            assert dev.kernels.weights(ty, dev.kernels.repacks(ty, (n_out, n_in))).mul_mm_q8 is not None
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        x[3, 64:96] = 0
        assert dev.quantizes_activations(ty, n_tok, (n_out, n_in)) == dev.exact_prompt
        xt, y = dev.empty((n_tok, n_in)), dev.empty((n_tok, n_out))
        dev.write(xt, x)
        dev.matmul(y, xt, w)
        batch = dev.read(y)
        x1, y1 = dev.empty((1, n_in)), dev.empty((1, n_out))
        for t in range(n_tok):
            dev.write(x1, x[t:t + 1])
            dev.matmul(y1, x1, w)
            np.testing.assert_array_equal(batch[t], dev.read(y1)[0], err_msg=f"{ty.name} {n_out} token {t}")


def test_short_q4_0_prompts_run_the_one_token_kernel(q8dev, monkeypatch):
    """Repacked Q4_0 prompts of 2-4 tokens run mul_mvt_q8 (its mul_mm_q8 costs a whole tile of 8
    tokens), 5 and more mul_mm_q8 (unrepacked Q4_0, the portable build: mul_mvt_q8 always); every
    token's row is the one-token kernel's either way."""
    dev = q8dev
    rng = np.random.default_rng(37)
    n_in, n_out = 256, 48  # 3 groups of 16 rows: repacked where the 64-byte kernels build
    w = dev.upload(random_weight(T.Q4_0, (n_out, n_in), rng), T.Q4_0, (n_out, n_in))
    repacked = dev.kernels.repacks(T.Q4_0, (n_out, n_in))
    k = dev.kernels.weights(T.Q4_0, repacked)
    assert k.mvt_tokens == (4 if repacked else 1)
    assert (k.mul_mm_q8 is not None) == (repacked and dev.kernels.vnni)
    launched = []
    real = dev._launch
    monkeypatch.setattr(dev, "_launch", lambda kern, *a: (launched.append(kern.function_name), real(kern, *a)))
    x1, y1 = dev.empty((1, n_in)), dev.empty((1, n_out))
    for n_tok in (2, 3, 4, 5, 9):
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        xt, y = dev.empty((n_tok, n_in)), dev.empty((n_tok, n_out))
        dev.write(xt, x)
        launched.clear()
        dev.matmul(y, xt, w)
        assert launched[-1] == ("mul_mm_q8" if k.mul_mm_q8 is not None and n_tok > 4 else "mul_mvt_q8"), (
            n_tok, launched)
        batch = dev.read(y)
        for t in range(n_tok):
            dev.write(x1, x[t:t + 1])
            dev.matmul(y1, x1, w)
            np.testing.assert_array_equal(batch[t], dev.read(y1)[0], err_msg=f"{n_tok} tokens, token {t}")


@pytest.mark.parametrize("ty", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_long_prompt_k_quants_equal_one_token_kernels(q8dev, ty):
    """140 tokens: more than one work-item's span of the K-quant prompt kernel (64 tokens, Q6_K 128)
    and passes of 16 with a partial one at the end; 7 rows (off the 4 rows of a work-item): every
    token's row is the one-token kernel's, bit for bit."""
    dev = q8dev
    rng = np.random.default_rng(31)
    n_in, n_out, n_tok = 512, 7, 140
    raw = random_weight(ty, (n_out, n_in), rng)
    w = dev.upload(raw, ty, (n_out, n_in))
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    x[100, 256:] = 0  # an all-zero super-block
    xt, y = dev.empty((n_tok, n_in)), dev.empty((n_tok, n_out))
    dev.write(xt, x)
    dev.matmul(y, xt, w)
    batch = dev.read(y)
    x1, y1 = dev.empty((1, n_in)), dev.empty((1, n_out))
    one = []
    for t in range(n_tok):
        dev.write(x1, x[t:t + 1])
        dev.matmul(y1, x1, w)
        one.append(dev.read(y1)[0])
    np.testing.assert_array_equal(batch, np.stack(one), err_msg=ty.name)
    wf = dequantize(raw, ty, (n_out, n_in)).astype(np.float64)
    xr = dequantize_activations_ref(x, dev.activation_format(ty, n_tok, (n_out, n_in)))
    assert nmse(batch, xr @ wf.T) <= 1e-10


def test_matmuls_of_one_input_equal_matmul(q8dev):
    """Device.matmuls (Q/K/V, gate/up of one token in one mul_mv_q8_3 launch per weight type, Q4_K_M's
    mixed types included) gives exactly matmul's floats, with the CPU and the GPU launch shapes;
    prompts and bad shapes as matmul."""
    from cooktop.backends.opencl.programs import GPU_SHAPE, KernelCache

    gpu = type(q8dev)(q8dev.info, q8dev.cl_device)
    gpu.shape, gpu.kernels = GPU_SHAPE, KernelCache(gpu.ctx, gpu.cl_device, GPU_SHAPE)
    _check_matmuls(q8dev, ((T.Q4_0,) * 3, (T.Q4_K, T.Q4_K, T.Q6_K), (T.Q8_0, T.Q5_K), (T.Q6_K, T.Q4_K, T.Q6_K)))
    if not q8dev.kernels.isa()["portable"]:
        _check_matmuls(gpu, ((T.Q4_K, T.Q4_K, T.Q6_K),))


def _check_matmuls(dev, combos):
    rng = np.random.default_rng(31)
    n_in = 512
    for types in combos:
        for n_tok in (1, 3):
            ws = [dev.upload(random_weight(t, (n, n_in), rng), t, (n, n_in)) for t, n in zip(types, (67, 9, 17))]
            x = dev.empty((n_tok, n_in))
            dev.write(x, rng.standard_normal((n_tok, n_in)).astype(np.float32))
            outs = [dev.empty((n_tok, w.shape[0])) for w in ws]
            dev.matmuls(x, *zip(outs, ws))
            got = [dev.read(o) for o in outs]
            for o, w, g in zip(outs, ws, got):
                dev.matmul(o, x, w)
                np.testing.assert_array_equal(g, dev.read(o), err_msg=str((types, n_tok)))
    bad = dev.empty((1, 5))
    with pytest.raises(ShapeError):
        dev.matmuls(x.head(1), (outs[0].head(1), ws[0]), (bad, ws[1]))
