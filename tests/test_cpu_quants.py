"""The numpy backend's fast dequantization (cpu_quants) and its weight policy: bit-for-bit
equal to gguf.quants, a conversion of everything pending at the first matmul, and weights
past the float32 budget multiplied block by block without a whole float32 copy."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import nmse
from cooktop.backends.cpu import quants as cpu_quants
from cooktop.backends.cpu.device import CpuDevice, cpu_info
from cooktop.format.quants import dequantize, random_weight

TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.MXFP4]


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.name)
def test_equal_to_gguf_reference(ty, monkeypatch):
    monkeypatch.setattr(cpu_quants, "CHUNK_VALUES", 1000)  # several chunks on the thread pool
    rng = np.random.default_rng(int(ty))
    n_in = 768 if ty.name.endswith("_K") else 224
    for rows in (1, 7, 61):
        try:
            raw = random_weight(ty, (rows, n_in), rng)
        except NotImplementedError:
            pytest.skip(f"no random blocks for {ty.name}")
        ref = dequantize(raw, ty, (rows, n_in))
        got = cpu_quants.dequantize(raw, ty, (rows, n_in))
        assert got.dtype == np.float32 and got.shape == (rows, n_in)
        np.testing.assert_array_equal(got, ref)
        out = np.full((rows, n_in), np.nan, np.float32)
        done = []
        assert cpu_quants.dequantize(raw, ty, (rows, n_in), out=out, progress=done.append) is not None
        np.testing.assert_array_equal(out, ref)
        assert sum(done) == rows * n_in


def _mxfp4_by_the_c_loop(raw: np.ndarray) -> np.ndarray:
    """ggml-quants.c dequantize_row_mxfp4 written out value by value: d = GGML_E8M0_TO_FP32_HALF(e)
    (2^(e - 128), exact in float64), y[j] = kvalues[qs[j] & 15] * d, y[j + 16] = kvalues[qs[j] >> 4] * d."""
    kv = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    blocks = raw.reshape(-1, 17)
    out = np.empty((len(blocks), 32))
    for i, b in enumerate(blocks):
        d = 2.0 ** (int(b[0]) - 128)
        for j in range(16):
            out[i, j] = kv[b[1 + j] & 15] * d
            out[i, j + 16] = kv[b[1 + j] >> 4] * d
    with np.errstate(over="ignore"):  # 12 * 2^126 overflows float32, as in ggml
        return out.astype(np.float32)


def test_mxfp4_matches_ggml_formula_for_every_exponent():
    """Every E8M0 exponent byte (subnormal halves at e = 0 and 1, the largest at 254) and every
    nibble: the fast kernel, gguf.quants and ggml's C formula agree bit for bit; row bytes 17/32."""
    from cooktop.format.quants import row_bytes
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(255, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(255)
    raw[0, 1:] = np.arange(16) * 17  # both nibbles take every code
    ref = _mxfp4_by_the_c_loop(raw)
    assert row_bytes(T.MXFP4, 64) == 34
    with np.errstate(over="ignore"):  # 12 * 2^126 is inf in float32, as in ggml
        np.testing.assert_array_equal(dequantize(raw, T.MXFP4, (255, 32)), ref)
        np.testing.assert_array_equal(cpu_quants.dequantize(raw, T.MXFP4, (255, 32)), ref)


def test_byte_count_checked():
    raw = random_weight(T.Q4_0, (4, 64), np.random.default_rng(0))
    with pytest.raises(ValueError, match="needs 144 bytes"):
        cpu_quants.dequantize(raw[:3], T.Q4_0, (4, 64))


def test_first_matmul_converts_every_pending_weight():
    """The first matmul starts converting every uploaded weight in the background and streams
    meanwhile; the results are the same before and after, and the budget is respected."""
    dev = CpuDevice(cpu_info(), cache_budget=3 * 32 * 256 * 4 + 100)
    rng = np.random.default_rng(1)
    raws = [random_weight(T.Q4_K, (32, 256), rng) for _ in range(4)]
    ws = [dev.upload(r, T.Q4_K, (32, 256)) for r in raws]
    x, out = dev.empty((1, 256)), dev.empty((1, 32))
    xh = rng.standard_normal((1, 256)).astype(np.float32)
    dev.write(x, xh)
    assert dev.cache_bytes == 0
    dev.matmul(out, x, ws[0])
    first = dev.read(out)
    dev.wait_converted()
    assert dev.cache_bytes == 3 * 32 * 256 * 4  # the fourth does not fit
    assert [isinstance(w.extra, tuple) for w in ws] == [True, True, True, False]
    for w, r in zip(ws, raws):
        dev.matmul(out, x, w)
        ref = xh.astype(np.float64) @ dequantize(r, T.Q4_K, (32, 256)).astype(np.float64).T
        assert nmse(dev.read(out), ref) < 1e-12
    dev.matmul(out, x, ws[0])
    np.testing.assert_array_equal(dev.read(out), first)  # cached: the streamed product's bits
    dev.release(ws[:2])
    assert dev.cache_bytes == 32 * 256 * 4
    dev.close()


def test_conversion_stops_at_close():
    dev = CpuDevice(cpu_info(), cache_budget=1 << 30)
    rng = np.random.default_rng(3)
    ws = [dev.upload(random_weight(T.Q8_0, (64, 512), rng), T.Q8_0, (64, 512)) for _ in range(50)]
    x, out = dev.empty((1, 512)), dev.empty((1, 64))
    dev.write(x, rng.standard_normal((1, 512)).astype(np.float32))
    dev.matmul(out, x, ws[0])
    dev.close()
    assert dev._converter is None or not dev._converter.is_alive()
    done = sum(isinstance(w.extra, tuple) for w in ws)
    assert dev.cache_bytes == done * 64 * 512 * 4


def test_past_budget_streams_in_row_blocks(monkeypatch):
    """A weight that does not fit the budget is never cached; the block-by-block product equals
    the cached one for 1 and many tokens, also into head() views."""
    monkeypatch.setattr(cpu_quants, "CHUNK_VALUES", 3 * 256)  # blocks of 3 rows: a ragged last block
    rng = np.random.default_rng(2)
    for ty in (T.Q4_0, T.Q6_K):
        raw = random_weight(ty, (67, 256), rng)
        small, big = CpuDevice(cpu_info(), cache_budget=0), CpuDevice(cpu_info(), cache_budget=1 << 30)
        for n in (1, 5):
            x = rng.standard_normal((n, 256)).astype(np.float32)
            outs = []
            for dev in (small, big):
                w = dev.upload(raw, ty, (67, 256))
                xt, o = dev.empty((8, 256)).head(n), dev.empty((8, 67)).head(n)
                dev.write(xt, x)
                dev.matmul(o, xt, w)
                outs.append(dev.read(o))
                dev.wait_converted()
                dev.matmul(o, xt, w)  # cached on the big device now
                outs.append(dev.read(o))
            assert small.cache_bytes == 0 and big.cache_bytes > 0
            for o in outs[1:]:  # streamed and cached: the same blocks, the same bits
                np.testing.assert_array_equal(o, outs[0])
            ref = x.astype(np.float64) @ dequantize(raw, ty, (67, 256)).astype(np.float64).T
            assert nmse(outs[0], ref) < 1e-10


@pytest.mark.parametrize("ty", [T.F32, T.Q8_0])
def test_matmul_bits_do_not_depend_on_thread_counts(ty, monkeypatch):
    """A product gives the same bits under 1 or 2 BLAS threads and 1 or 3 dequantization threads,
    streamed or cached (one-thread BLAS per fixed block of rows)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(5)
    raw = random_weight(ty, (301, 512), rng) if ty is not T.F32 else rng.standard_normal((301, 512)).astype(np.float32)
    x = rng.standard_normal((7, 512)).astype(np.float32)
    outs = []
    for blas, dq in ((1, 1), (2, 3), (2, 1)):
        monkeypatch.setenv("COOKTOP_DEQUANT_THREADS", str(dq))
        with threadpool_limits(blas, user_api="blas"):
            for budget in (0, 1 << 30):
                dev = CpuDevice(cpu_info(), cache_budget=budget)
                w = dev.upload(raw, ty, (301, 512))
                xt, o = dev.empty((7, 512)), dev.empty((7, 301))
                dev.write(xt, x)
                dev.matmul(o, xt, w)
                dev.wait_converted()
                outs.append(dev.read(o))
                dev.matmul(o, xt, w)
                outs.append(dev.read(o))
                dev.close()
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
