"""Per-op parity of every device backend with the numpy reference (ggml test-backend-ops style).

Each op runs on ``gpu_device`` (OpenCL, Vulkan) and on the numpy ``cpu_device``
from the same inputs (for weights: the same raw GGML blocks), and the results
are compared by ``nmse``: <= 1e-7 for float ops and F32/F16 weights, <= 5e-4
for quantized matmul (ggml's bounds). Buffers are allocated for the largest
chunk and used through ``head(n)`` views, as the engine does.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import DEVICE_WEIGHT_TYPES, ROPE_NEOX, ROPE_NORMAL, nmse
from cooktop.backends.reference import dequantize_activations_ref
from cooktop.format.quants import dequantize, random_weight

FLOAT_BOUND = 1e-7
QUANT_BOUND = 5e-4
FLOAT_WEIGHTS = (T.F32, T.F16)
K_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K)
N_ROWS = (1, 3, 129, 1000)
#: On a simulated GPU (Oclgrind checks every access of every work-item: 1000 rows x 64 tokens took
#: 70-87 s per K-quant there) 257 rows stand for 1000: still several full row tiles and a partial
#: one of every launch shape (row tiles of 16 to 128), so every work-group arrangement is checked.
N_ROWS_SIMULATED = (1, 3, 129, 257)
MAX_TOK = 64


def _rows(dev) -> tuple[int, ...]:
    """The output row counts a matmul test covers on ``dev``."""
    return N_ROWS_SIMULATED if "oclgrind" in dev.info.name.lower() else N_ROWS

def _n_ins(ty: T) -> tuple[int, ...]:
    """Odd row lengths: 7 blocks of 32, or 1 and 3 super-blocks of 256 for K-quants;
    float rows also end in a partial 32-value unit (100)."""
    if ty in K_TYPES:
        return (256, 512 + 256)
    if ty == T.Q4_0:  # 3 groups of 128 too: OpenCL repacks those rows (and multiplies 8-bit x with VNNI)
        return (32 * 7, 128 * 3)
    return (32 * 7, 100) if ty in FLOAT_WEIGHTS else (32 * 7,)


def _quantizes(dev, ty: T, n_tok: int, shape: tuple[int, int]) -> bool:
    """True when ``dev``'s matmul quantizes activations to 8 bits for these weights (OpenCL's
    integer-dot kernels, ``quantizes_activations``)."""
    fn = getattr(dev, "quantizes_activations", None)
    return bool(fn and fn(ty, n_tok, shape))


def _fmt(dev, ty: T, n_tok: int, shape: tuple[int, int]) -> str | None:
    """The activation format of ``dev``'s matmul for these weights (``Device.activation_format``)."""
    fn = getattr(dev, "activation_format", None)
    return fn(ty, n_tok, shape) if fn else None


def _bound(ty: T) -> float:
    return FLOAT_BOUND if ty in FLOAT_WEIGHTS else QUANT_BOUND


def _act(dev, data: np.ndarray, rows: int | None = None):
    """A device tensor of ``rows`` (default: len(data)) rows holding ``data`` in its head; returns the head view."""
    data = np.asarray(data)
    rows = rows or data.shape[0]
    ty = T.I32 if data.dtype == np.int32 else T.F32
    t = dev.empty((rows,) + data.shape[1:], ty)
    v = t.head(data.shape[0])
    dev.write(v, data)
    return v


def _out(dev, shape, rows: int | None = None):
    t = dev.empty(((rows or shape[0]),) + tuple(shape[1:]))
    return t.head(shape[0])


def _both(gpu_device, cpu_device, fn):
    """Run ``fn(dev)`` (which returns the output tensor) on both devices; return (device, reference) arrays."""
    got = gpu_device.read(fn(gpu_device))
    ref = cpu_device.read(fn(cpu_device))
    return got, ref


@pytest.mark.parametrize("n_tok", [1, 7, 64])
@pytest.mark.parametrize("ty", DEVICE_WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul(gpu_device, cpu_device, ty, n_tok):
    rng = np.random.default_rng(100 + int(ty) * 7 + n_tok)
    for n_in in _n_ins(ty):
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        for n_out in _rows(gpu_device):
            raw = random_weight(ty, (n_out, n_in), rng)

            def run(dev, raw=raw, n_out=n_out, n_in=n_in, x=x):  # bind this iteration's values (B023)
                w = dev.upload(raw, ty, (n_out, n_in))
                out = _out(dev, (n_tok, n_out), MAX_TOK)
                dev.matmul(out, _act(dev, x, MAX_TOK), w)
                return out

            got, ref = _both(gpu_device, cpu_device, run)
            assert got.shape == (n_tok, n_out)
            err = nmse(got, ref)
            what = f"{ty.name} n_in={n_in} n_out={n_out} n_tok={n_tok}: nmse {err:.2e}"
            if _quantizes(gpu_device, ty, n_tok, (n_out, n_in)):
                # integer dot products on 8-bit activations (llama.cpp's way): exact against numpy
                # on the same 8-bit x, and within the quantized bound of numpy's float32 product
                # wherever the output has enough values for nmse to be a ratio of sums
                xq = dequantize_activations_ref(x, _fmt(gpu_device, ty, n_tok, (n_out, n_in)))
                exact = xq @ dequantize(raw, ty, (n_out, n_in)).astype(np.float64).T
                assert nmse(got, exact) <= 1e-10, f"{what}; vs 8-bit x {nmse(got, exact):.2e}"
                if got.size >= 100:
                    assert err <= QUANT_BOUND, what
            else:
                assert err <= _bound(ty), what


@pytest.mark.parametrize("n_tok", [1, 5])
def test_matmuls_of_one_input(gpu_device, cpu_device, n_tok):
    """Device.matmuls (Q/K/V-like: two weights of one type and one of another, one input) against
    numpy; on OpenCL one token's same-type pair runs in one mul_mv_q8_3 launch."""
    rng = np.random.default_rng(400 + n_tok)
    n_in = 512
    raws = [(ty, n, random_weight(ty, (n, n_in), rng)) for ty, n in ((T.Q4_K, 67), (T.Q4_K, 9), (T.Q6_K, 9))]
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    got, ref = [], []
    for dev, into in ((gpu_device, got), (cpu_device, ref)):
        outs = [_out(dev, (n_tok, n), MAX_TOK) for _, n, _ in raws]
        dev.matmuls(_act(dev, x, MAX_TOK), *((o, dev.upload(r, ty, (n, n_in))) for o, (ty, n, r) in zip(outs, raws)))
        into += [dev.read(o) for o in outs]
    for (ty, n, raw), g, r in zip(raws, got, ref):
        exact = dequantize_activations_ref(x, _fmt(gpu_device, ty, n_tok, (n, n_in))) \
            @ dequantize(raw, ty, (n, n_in)).astype(np.float64).T
        assert nmse(g, exact) <= 1e-10, (ty.name, n, n_tok)
        assert nmse(g, r) <= QUANT_BOUND, (ty.name, n, n_tok)


@pytest.mark.parametrize("ty", [T.Q2_K, T.Q3_K], ids=lambda t: t.name)
def test_low_bit_k_quants(gpu_device, cpu_device, ty):
    """Q2_K and Q3_K (OpenCL: integer dots on block_q8_K activations, or float kernels over units
    of 32 dequantized values with COOKTOP_OPENCL_Q8K=0; Vulkan: float shaders over units of 32
    dequantized values, glsl/dequant.glsl): matmul at odd rows, tokens (1, 7: mat-vec; 20, 40: Vulkan's
    tiled mul_mm, one and two 32-token tiles) and super-block counts, and get_rows (bit for bit), against numpy."""
    assert gpu_device.supports("matmul", ty) and gpu_device.supports("get_rows", ty)
    assert gpu_device.supports_op("matmul", ty) == ""
    rng = np.random.default_rng(300 + int(ty))
    for n_in in (256, 768):
        for n_out in (1, 129):
            raw = random_weight(ty, (n_out, n_in), rng)
            for n_tok in (1, 7, 20, 40):
                x = rng.standard_normal((n_tok, n_in)).astype(np.float32)

                def run(dev, raw=raw, n_out=n_out, n_in=n_in, x=x, n_tok=n_tok):  # bind (B023)
                    out = _out(dev, (n_tok, n_out), MAX_TOK)
                    dev.matmul(out, _act(dev, x, MAX_TOK), dev.upload(raw, ty, (n_out, n_in)))
                    return out

                got, ref = _both(gpu_device, cpu_device, run)
                fmt = _fmt(gpu_device, ty, n_tok, (n_out, n_in))
                if fmt is None:
                    assert nmse(got, ref) <= 1e-10, (ty.name, n_in, n_out, n_tok)
                else:  # OpenCL's integer dots on block_q8_K: exact on the same 8-bit x
                    exact = dequantize_activations_ref(x, fmt) @ dequantize(raw, ty, (n_out, n_in)).astype(np.float64).T
                    assert nmse(got, exact) <= 1e-10, (ty.name, n_in, n_out, n_tok)
                    if n_out >= 129:
                        assert nmse(got, ref) <= QUANT_BOUND, (ty.name, n_in, n_out, n_tok)
        ids = np.array([0, n_out - 1, 0], dtype=np.int32)

        def rows(dev, raw=raw, n_out=n_out, n_in=n_in, ids=ids):
            out = _out(dev, (3, n_in), MAX_TOK)
            dev.get_rows(out, dev.upload(raw, ty, (n_out, n_in)), _act(dev, ids, MAX_TOK))
            return out

        got, ref = _both(gpu_device, cpu_device, rows)
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("ty", DEVICE_WEIGHT_TYPES, ids=lambda t: t.name)
def test_get_rows(gpu_device, cpu_device, ty):
    rng = np.random.default_rng(200 + int(ty))
    for n_in in _n_ins(ty):
        for n_rows in (3, 1000):
            raw = random_weight(ty, (n_rows, n_in), rng)
            ids = np.array([0, n_rows - 1, 1 % n_rows, *rng.integers(0, n_rows, 4)], dtype=np.int32)

            def run(dev, raw=raw, n_rows=n_rows, n_in=n_in, ids=ids):  # bind this iteration's values (B023)
                table = dev.upload(raw, ty, (n_rows, n_in))
                out = _out(dev, (len(ids), n_in), MAX_TOK)
                dev.get_rows(out, table, _act(dev, ids, MAX_TOK))
                return out

            got, ref = _both(gpu_device, cpu_device, run)
            # dequantization is exact in float32: demand the float bound for every type
            assert nmse(got, ref) <= FLOAT_BOUND, f"{ty.name} n_in={n_in} n_rows={n_rows}"


def test_get_rows_activation_table(gpu_device, cpu_device):
    """get_rows from an F32 activation tensor made with empty/write (not upload)."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((50, 100)).astype(np.float32)
    ids = np.array([49, 0, 7, 7], dtype=np.int32)

    def run(dev):
        out = _out(dev, (4, 100), 8)
        dev.get_rows(out, _act(dev, table), _act(dev, ids, 8))
        return out

    got, ref = _both(gpu_device, cpu_device, run)
    np.testing.assert_array_equal(got, table[ids])
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("n_tok,n", [(1, 224), (7, 4096), (64, 100)])
def test_rmsnorm(gpu_device, cpu_device, n_tok, n):
    rng = np.random.default_rng(n + n_tok)
    x = (rng.standard_normal((n_tok, n)) * 3).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)

    def run(dev):
        out = _out(dev, (n_tok, n), MAX_TOK)
        wt = dev.upload(w, T.F32, (n,))
        dev.rmsnorm(out, _act(dev, x, MAX_TOK), wt, 1e-5)
        return out

    got, ref = _both(gpu_device, cpu_device, run)
    assert nmse(got, ref) <= FLOAT_BOUND


@pytest.mark.parametrize("mode", [ROPE_NORMAL, ROPE_NEOX])
@pytest.mark.parametrize("n_rot", [64, 32])
@pytest.mark.parametrize("n_tok", [1, 7])
def test_rope(gpu_device, cpu_device, mode, n_rot, n_tok):
    head_dim, n_head = 64, 8
    rng = np.random.default_rng(n_rot + n_tok + mode)
    x = rng.standard_normal((n_tok, n_head * head_dim)).astype(np.float32)
    pos = np.arange(5, 5 + n_tok, dtype=np.int32)
    for freq_base, freq_scale in ((10000.0, 1.0), (500000.0, 0.25)):
        for in_place in (False, True):
            def run(dev, in_place=in_place, freq_base=freq_base, freq_scale=freq_scale):  # bind (B023)
                xt = _act(dev, x, MAX_TOK)
                out = xt if in_place else _out(dev, x.shape, MAX_TOK)
                dev.rope(out, xt, _act(dev, pos, MAX_TOK), head_dim, n_rot, freq_base, freq_scale, mode)
                return out

            got, ref = _both(gpu_device, cpu_device, run)
            assert nmse(got, ref) <= FLOAT_BOUND, f"base {freq_base} scale {freq_scale} in_place {in_place}"
            if n_rot < head_dim:  # dimensions past n_rot pass through untouched
                g = got.reshape(n_tok, n_head, head_dim)[..., n_rot:]
                np.testing.assert_array_equal(g, x.reshape(n_tok, n_head, head_dim)[..., n_rot:])


def test_kv_store(gpu_device, cpu_device):
    n_ctx, dim = 32, 128
    rng = np.random.default_rng(5)
    prefill = rng.standard_normal((n_ctx, dim)).astype(np.float32)
    x = rng.standard_normal((7, dim)).astype(np.float32)
    pos = np.arange(5, 12, dtype=np.int32)

    def run(dev):
        cache = _act(dev, prefill)
        dev.kv_store(cache, _act(dev, x, MAX_TOK), _act(dev, pos, MAX_TOK))
        return cache

    got, ref = _both(gpu_device, cpu_device, run)
    expect = prefill.copy()
    expect[5:12] = x
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(8, 2, 64), (4, 4, 48), (8, 8, 8)])
@pytest.mark.parametrize("n_tok,p0", [(1, 0), (7, 5), (64, 0), (1, 100)])
def test_attention(gpu_device, cpu_device, n_head, n_head_kv, head_dim, n_tok, p0):
    """Causal GQA attention of a chunk at positions p0.. over a cache pre-filled before p0."""
    n_ctx = 128
    rng = np.random.default_rng(n_head * 31 + head_dim + n_tok + p0)
    kv_dim = n_head_kv * head_dim
    k = (rng.standard_normal((n_ctx, kv_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((n_ctx, kv_dim)).astype(np.float32)
    q = (rng.standard_normal((n_tok, n_head * head_dim)) * 2).astype(np.float32)
    pos = np.arange(p0, p0 + n_tok, dtype=np.int32)
    scale = 1.0 / np.sqrt(head_dim)

    def run(dev):
        out = _out(dev, q.shape, MAX_TOK)
        dev.attention(out, _act(dev, q, MAX_TOK), _act(dev, k), _act(dev, v), _act(dev, pos, MAX_TOK),
                      n_head, n_head_kv, scale)
        return out

    got, ref = _both(gpu_device, cpu_device, run)
    assert nmse(got, ref) <= FLOAT_BOUND


@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(8, 2, 64), (4, 4, 48)])
def test_attention_kv_start(gpu_device, cpu_device, n_head, n_head_kv, head_dim):
    """Rows of three sequences sharing one cache (sequence s owns rows s*n_ctx..): a prompt chunk,
    a single decode row and a row at the cache's last cell, each attending from its kv_start.
    The device matches numpy, and numpy matches each sequence run alone on its own cache."""
    n_ctx, n_seq = 48, 3
    rng = np.random.default_rng(head_dim + n_head)
    kv_dim = n_head_kv * head_dim
    k = (rng.standard_normal((n_seq * n_ctx, kv_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((n_seq * n_ctx, kv_dim)).astype(np.float32)
    seqs = [(0, 3, 5), (1, 20, 1), (2, n_ctx - 1, 1)]  # (seq, first position, rows)
    start = np.concatenate([np.full(n, s * n_ctx, np.int32) for s, _, n in seqs])
    cells = np.concatenate([s * n_ctx + np.arange(p0, p0 + n, dtype=np.int32) for s, p0, n in seqs])
    q = (rng.standard_normal((len(cells), n_head * head_dim)) * 2).astype(np.float32)
    scale = 1.0 / np.sqrt(head_dim)

    def run(dev):
        out = _out(dev, q.shape, MAX_TOK)
        dev.attention(out, _act(dev, q, MAX_TOK), _act(dev, k), _act(dev, v), _act(dev, cells, MAX_TOK),
                      n_head, n_head_kv, scale, kv_start=_act(dev, start, MAX_TOK))
        return out

    got, ref = _both(gpu_device, cpu_device, run)
    assert nmse(got, ref) <= FLOAT_BOUND
    r = 0
    for s, p0, n in seqs:  # the same rows alone, on a cache of their own sequence
        rows = slice(s * n_ctx, (s + 1) * n_ctx)
        out = _out(cpu_device, (n, q.shape[1]))
        cpu_device.attention(out, _act(cpu_device, q[r:r + n]), _act(cpu_device, k[rows]),
                             _act(cpu_device, v[rows]), _act(cpu_device, np.arange(p0, p0 + n, dtype=np.int32)),
                             n_head, n_head_kv, scale)
        assert nmse(ref[r:r + n], cpu_device.read(out)) <= FLOAT_BOUND
        r += n


@pytest.mark.parametrize("window,n_tok,p0", [(1, 7, 5), (5, 64, 0), (5, 1, 100), (100, 9, 90), (300, 3, 120)])
def test_attention_sliding_window(gpu_device, cpu_device, window, n_tok, p0):
    """Sliding-window attention (llama.cpp's standard SWA: key j seen by query p iff p - window < j <= p),
    window 1 (itself only), windows shorter and longer than the chunk and than the cache."""
    n_ctx, n_head, n_head_kv, head_dim = 128, 6, 2, 40
    rng = np.random.default_rng(window * 7 + n_tok + p0)
    kv_dim = n_head_kv * head_dim
    k = (rng.standard_normal((n_ctx, kv_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((n_ctx, kv_dim)).astype(np.float32)
    q = (rng.standard_normal((n_tok, n_head * head_dim)) * 2).astype(np.float32)
    pos = np.arange(p0, p0 + n_tok, dtype=np.int32)
    scale = 1.0 / np.sqrt(head_dim)

    def run(dev):
        out = _out(dev, q.shape, MAX_TOK)
        dev.attention(out, _act(dev, q, MAX_TOK), _act(dev, k), _act(dev, v), _act(dev, pos, MAX_TOK),
                      n_head, n_head_kv, scale, window)
        return out

    got, ref = _both(gpu_device, cpu_device, run)
    assert nmse(got, ref) <= FLOAT_BOUND
    # the numpy reference against a direct masked softmax (float64)
    g = n_head // n_head_kv
    for t in (0, n_tok - 1):
        p = pos[t]
        j = np.arange(max(0, p - window + 1), p + 1)
        for h in (0, n_head - 1):
            hk = h // g
            qh = q[t, h * head_dim:(h + 1) * head_dim].astype(np.float64)
            s = k[j, hk * head_dim:(hk + 1) * head_dim] @ qh * scale
            w = np.exp(s - s.max())
            expect = (w / w.sum()) @ v[j, hk * head_dim:(hk + 1) * head_dim]
            np.testing.assert_allclose(ref[t, h * head_dim:(h + 1) * head_dim], expect, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["add", "silu_mul", "gelu_mul"])
@pytest.mark.parametrize("shape", [(1, 224), (7, 5632), (64, 1000)])
def test_elementwise(gpu_device, cpu_device, op, shape):
    rng = np.random.default_rng(shape[0])
    a = (rng.standard_normal(shape) * 4).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    for in_place in (False, True):
        def run(dev, in_place=in_place):  # bind this iteration's value (B023)
            at = _act(dev, a, MAX_TOK)
            out = at if in_place else _out(dev, shape, MAX_TOK)
            getattr(dev, op)(out, at, _act(dev, b, MAX_TOK))
            return out

        got, ref = _both(gpu_device, cpu_device, run)
        assert nmse(got, ref) <= FLOAT_BOUND
    if op == "gelu_mul":  # the reference is ggml_gelu_f32 (tanh form) times up
        g = a.astype(np.float64)
        expect = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * g * (1 + 0.044715 * g * g))) * b
        assert nmse(ref, expect) <= 1e-12


@pytest.mark.parametrize("rows,n", [(1, 100), (3, 129), (7, 1000)])
def test_copy(gpu_device, cpu_device, rows, n):
    """copy (bench --ops's bandwidth kernel) is exact, also into/from head() views."""
    rng = np.random.default_rng(rows * n)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    outs = []
    for dev in (cpu_device, gpu_device):
        a, b = dev.empty((rows + 2, n)), dev.zeros((rows + 2, n))
        dev.write(a.head(rows), x)
        dev.copy(b.head(rows), a.head(rows))
        outs.append(dev.read(b))
    assert np.array_equal(outs[1][:rows], x)
    assert np.array_equal(outs[1][rows:], np.zeros((2, n), np.float32))
    assert np.array_equal(outs[0][:rows], outs[1][:rows])
