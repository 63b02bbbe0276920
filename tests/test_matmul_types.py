"""Every GGML type of the numpy backend, end to end: a weight written to a GGUF
with ``gguf.GGUFWriter``, opened with ``open_gguf``, uploaded to the numpy
device, then ``matmul`` and ``get_rows`` checked against
``gguf.quants.dequantize`` + float64 numpy. Odd shapes (n_out 1, 3, 129;
n_in 1 or 7 blocks) catch row/stride mistakes; rows that are not whole blocks
are rejected with an error naming the block size.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import nmse, row_bytes
from cooktop.backends.cpu.device import CPU_TYPES
from cooktop.errors import GGUFError, UnsupportedOpError
from cooktop.format.gguf import open_gguf
from cooktop.format.quants import random_weight

#: (n_out, n_in in blocks)
SHAPES = ((1, 1), (3, 7), (129, 1), (129, 7))


def _name(n_out: int, n_blocks: int) -> str:
    return f"w_{n_out}x{n_blocks}"


def _write(path, tensors: dict[str, tuple[np.ndarray, T, tuple[int, ...] | None]]) -> None:
    """GGUF holding ``name -> (data, type, raw_shape)``; raw_shape None = from the data."""
    w = GGUFWriter(path, arch="llama")
    for name, (data, ty, raw_shape) in tensors.items():
        if ty == T.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=raw_shape, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _reference(raw: np.ndarray, ty: T, shape: tuple[int, int]) -> np.ndarray:
    """float64 [n_out, n_in] of a raw weight, via gguf.quants.dequantize."""
    if ty == T.F32:
        return np.asarray(raw, dtype=np.float64).reshape(shape)
    return np.asarray(quants.dequantize(raw, ty), dtype=np.float64).reshape(shape)


@pytest.fixture(scope="module")
def gguf_per_type(tmp_path_factory):
    """type -> (open GGUFFile, {tensor name: float64 reference weight})."""
    d = tmp_path_factory.mktemp("types")
    rng = np.random.default_rng(1234)
    out = {}
    for ty in CPU_TYPES:
        block = GGML_QUANT_SIZES[ty][0]
        tensors, refs = {}, {}
        for n_out, n_blocks in SHAPES:
            shape = (n_out, n_blocks * block)
            raw = random_weight(ty, shape, rng)
            tensors[_name(n_out, n_blocks)] = (raw, ty, None)
            refs[_name(n_out, n_blocks)] = _reference(raw, ty, shape)
        path = d / f"{ty.name}.gguf"
        _write(path, tensors)
        out[ty] = (open_gguf(path), refs)
    return out


def _upload(dev, gf, name):
    t = gf.tensors[name]
    return dev.upload(t.data, t.ggml_type, t.shape)


@pytest.mark.parametrize("ty", CPU_TYPES, ids=lambda t: t.name)
def test_gguf_roundtrip_metadata(gguf_per_type, ty):
    gf, refs = gguf_per_type[ty]
    block = GGML_QUANT_SIZES[ty][0]
    for n_out, n_blocks in SHAPES:
        t = gf.tensors[_name(n_out, n_blocks)]
        assert t.ggml_type == ty
        assert t.shape == (n_out, n_blocks * block)
        assert t.n_bytes == n_out * row_bytes(ty, n_blocks * block) == t.data.nbytes
        assert np.all(np.isfinite(refs[t.name]))


@pytest.mark.parametrize("ty", CPU_TYPES, ids=lambda t: t.name)
def test_matmul_matches_dequantize(cpu_device, gguf_per_type, ty):
    gf, refs = gguf_per_type[ty]
    rng = np.random.default_rng(7)
    bound = 1e-10 if ty == T.F32 else 1e-6
    for n_out, n_blocks in SHAPES:
        name = _name(n_out, n_blocks)
        w = _upload(cpu_device, gf, name)
        ref_w = refs[name]
        n_in = ref_w.shape[1]
        for n_tokens in (1, 7):
            x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
            xt = cpu_device.empty((n_tokens, n_in))
            cpu_device.write(xt, x)
            out = cpu_device.empty((n_tokens, n_out))
            cpu_device.matmul(out, xt, w)
            got = cpu_device.read(out)
            ref = x.astype(np.float64) @ ref_w.T
            assert got.shape == (n_tokens, n_out)
            err = nmse(got, ref)
            assert err <= bound, f"{ty.name} {name} n_tokens={n_tokens}: nmse {err:.3g} > {bound}"


@pytest.mark.parametrize("ty", CPU_TYPES, ids=lambda t: t.name)
def test_get_rows_matches_dequantize(cpu_device, gguf_per_type, ty):
    gf, refs = gguf_per_type[ty]
    for n_out, n_blocks in SHAPES:
        name = _name(n_out, n_blocks)
        table = _upload(cpu_device, gf, name)
        ref_w = refs[name]
        ids = np.array([n_out - 1, 0, n_out // 2, 0], dtype=np.int32)
        idt = cpu_device.empty((len(ids),), T.I32)
        cpu_device.write(idt, ids)
        out = cpu_device.empty((len(ids), ref_w.shape[1]))
        cpu_device.get_rows(out, table, idt)
        np.testing.assert_array_equal(cpu_device.read(out), ref_w[ids].astype(np.float32))


def test_weights_with_equal_bytes_stay_distinct(cpu_device):
    """Two weights uploaded one after the other (the first freed) must not share a cached dequantization."""
    rng = np.random.default_rng(3)
    results = []
    for _ in range(4):
        raw = random_weight(T.Q8_0, (8, 64), rng)
        w = cpu_device.upload(raw, T.Q8_0, (8, 64))
        x = cpu_device.empty((1, 64))
        cpu_device.write(x, np.ones((1, 64), np.float32))
        out = cpu_device.empty((1, 8))
        cpu_device.matmul(out, x, w)
        ref = quants.dequantize(raw, T.Q8_0).astype(np.float64).sum(axis=1)
        results.append(nmse(cpu_device.read(out)[0], ref))
        del w, raw
    assert max(results) <= 1e-10, results


# -- rows that are not whole blocks -------------------------------------------------
BAD = ((T.Q4_0, 40), (T.Q8_0, 48), (T.Q4_K, 288), (T.IQ4_NL, 16))


@pytest.mark.parametrize("ty,n_in", BAD, ids=lambda v: getattr(v, "name", str(v)))
def test_gguf_rejects_partial_blocks(tmp_path, ty, n_in):
    block, size = GGML_QUANT_SIZES[ty]
    n_out = 3
    n_bytes = n_out * (-(-n_in // block)) * size  # enough bytes to cover the bogus shape
    raw = np.zeros(n_bytes, dtype=np.int8)  # int8: GGUFWriter keeps raw_shape as values, not bytes
    path = tmp_path / "bad_rows.gguf"
    _write(path, {"w": (raw, ty, (n_out, n_in))})
    with pytest.raises(GGUFError) as ei:
        open_gguf(path)
    msg = str(ei.value)
    assert "'w'" in msg and ty.name in msg and f"block size {block}" in msg and str(n_in) in msg


@pytest.mark.parametrize("ty,n_in", BAD, ids=lambda v: getattr(v, "name", str(v)))
def test_upload_rejects_partial_blocks(cpu_device, ty, n_in):
    block, size = GGML_QUANT_SIZES[ty]
    raw = np.zeros(3 * (-(-n_in // block)) * size, dtype=np.uint8)
    with pytest.raises(UnsupportedOpError) as ei:
        cpu_device.upload(raw, ty, (3, n_in))
    assert f"block size {block}" in str(ei.value) and ty.name in str(ei.value)


def test_upload_rejects_wrong_byte_count(cpu_device):
    raw = random_weight(T.Q4_0, (4, 64), np.random.default_rng(0))
    with pytest.raises(UnsupportedOpError) as ei:
        cpu_device.upload(raw[:3], T.Q4_0, (4, 64))
    assert "bytes" in str(ei.value)


def test_dequantized_cache_released_with_weight(cpu_device):
    """The float32 copy of a quantized weight is dropped when the weight is (budget accounting too)."""
    import gc

    raw = random_weight(T.Q4_0, (16, 64), np.random.default_rng(5))
    before = cpu_device.cache_bytes
    w = cpu_device.upload(raw, T.Q4_0, (16, 64))
    if cpu_device.cache_budget < before + 16 * 64 * 4:
        pytest.skip("COOKTOP_CPU_CACHE budget too small to cache this weight")
    cpu_device.weight_f32(w)
    assert cpu_device.cache_bytes == before + 16 * 64 * 4
    del w
    gc.collect()
    assert cpu_device.cache_bytes == before
