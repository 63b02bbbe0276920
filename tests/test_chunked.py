"""Tensors past a device's largest buffer, stored in row chunks (backends/chunked.py): matmul,
get_rows, row-wise ops, read / write on every family against numpy, at odd shapes with chunk
boundaries that fall anywhere (a small simulated limit forces the chunking on small tensors)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from conftest import open_family_device
from gguf import GGMLQuantizationType as T

from cooktop.backends import chunked, registry
from cooktop.backends.base import nmse
from cooktop.backends.reference import dequantize_activations_ref
from cooktop.errors import DeviceOutOfMemoryError, UnsupportedOpError
from cooktop.format.quants import dequantize, random_weight, row_bytes


@pytest.fixture(scope="module", params=list(registry.FAMILIES))
def device(request):
    return open_family_device(request.param)


@contextlib.contextmanager
def limit(dev, nbytes: int):
    """``dev.buffer_limit`` set to ``nbytes`` inside the block (the scratch buffers reset around it)."""
    old, old_scratch = dev.buffer_limit, dev._chunk_scratch
    dev.buffer_limit, dev._chunk_scratch = nbytes, {}
    try:
        yield
    finally:
        dev.release(list(dev._chunk_scratch.values()) + dev._chunk_retired)
        dev.buffer_limit, dev._chunk_scratch, dev._chunk_retired = old, old_scratch, []


@pytest.mark.parametrize("ty", [T.Q4_K, T.Q5_0], ids=lambda t: t.name)
def test_chunked_matmul(device, ty):
    """A weight of 300 rows cut under a 16 KiB limit (Q4_K: 113 rows a chunk, Q5_0: 92),
    one token and 9 tokens, into a plain output and into an output itself in row chunks
    (4 rows of 300 values per part)."""
    rng = np.random.default_rng(7)
    n_out, n_in = 300, 256
    raw = random_weight(ty, (n_out, n_in), rng)
    ref_w = dequantize(raw, ty, (n_out, n_in)).astype(np.float64)
    per = (16384 - chunked.PAD_BYTES) // row_bytes(ty, n_in)
    for n_tok in (1, 9):
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        xt, y = device.empty((n_tok, n_in)), device.empty((n_tok, n_out))
        device.write(xt, x)
        bias = rng.standard_normal(n_out).astype(np.float32)
        b = device.upload(bias, T.F32, (n_out,))
        xr = dequantize_activations_ref(x, device.activation_format(ty, n_tok, (per, n_in)))
        ref = xr @ ref_w.T
        with limit(device, 16384):
            w = device.upload(raw, ty, (n_out, n_in))
            assert w.chunks is not None and [r0 for r0, _ in w.chunks] == list(range(0, n_out, per))
            device.matmul(y, xt, w)
            assert nmse(device.read(y), ref) < 1e-10, (ty.name, n_tok)
            with limit(device, 4 * 4 * n_out + chunked.PAD_BYTES):
                yc = device.empty((n_tok, n_out), split=True)
                assert (yc.chunks is not None) == (n_tok > 4)
                device.matmul(yc, xt, w)
                assert nmse(device.read(yc), ref) < 1e-10, (ty.name, n_tok, "chunked out")
                device.add_bias(yc, yc, b)
                assert nmse(device.read(yc), ref + bias) < 1e-10
                if n_tok > 4:
                    np.testing.assert_array_equal(device.read(yc.head(6)), device.read(yc)[:6])
            device.release([w, yc])


def test_chunked_output_plain_weight(device):
    """An output in row chunks of a plain weight: each part from its rows of x."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((11, 64)).astype(np.float32)
    wf = rng.standard_normal((40, 64)).astype(np.float32)
    w = device.upload(wf, T.F32, (40, 64))
    xt = device.empty((11, 64))
    device.write(xt, x)
    with limit(device, 3 * 4 * 64 + chunked.PAD_BYTES):  # 4 rows of 40 a part; x's rows 3 at a time
        y = device.empty((11, 40), split=True)
        assert [r0 for r0, _ in y.chunks] == [0, 4, 8]
        device.matmul(y, xt, w)
        np.testing.assert_allclose(device.read(y), x @ wf.T, rtol=1e-4, atol=1e-4)
        device.write(y, np.ones((11, 40)))
        np.testing.assert_array_equal(device.read(y), 1)


@pytest.mark.parametrize("ty", [T.Q6_K, T.Q5_0, T.F32], ids=lambda t: t.name)
def test_chunked_get_rows(device, ty):
    """get_rows from a 53-row table cut every 10 rows: ids across chunks, repeated, out of order."""
    rng = np.random.default_rng(5)
    n_rows, n = 53, 256
    raw = random_weight(ty, (n_rows, n), rng)
    ref = dequantize(raw, ty, (n_rows, n))
    ids = np.array([52, 0, 9, 10, 11, 30, 30, 49, 50, 3], dtype=np.int32)
    it, out = device.empty((len(ids),), T.I32), device.empty((len(ids), n))
    device.write(it, ids)
    with limit(device, 10 * row_bytes(ty, n) + chunked.PAD_BYTES):
        table = device.upload(raw, ty, (n_rows, n))
        assert len(table.chunks) == 6
        device.get_rows(out, table, it)
        np.testing.assert_allclose(device.read(out), ref[ids], rtol=1e-6, atol=1e-6)
        device.release([table])
        assert table.device is None and all(p.device is None for _, p in table.chunks)  # every part freed


def test_chunked_refusals(device):
    """One row over the limit, a vector over it and a chunked tensor in an op that takes none:
    clear errors, never a crash."""
    out, w = device.empty((64, 16)), device.upload(np.zeros((16, 16), np.float32), T.F32, (16, 16))
    with limit(device, 1024):
        with pytest.raises(DeviceOutOfMemoryError, match="one row of 2048 bytes"):
            device.empty((4, 512), split=True)
        with pytest.raises(DeviceOutOfMemoryError, match=r"F32 weight \[512\] needs one buffer of 2048 bytes"):
            device.upload(np.zeros(512, np.float32), T.F32, (512,))
        a = device.empty((64, 16), split=True)
        assert a.chunks is not None
        with pytest.raises(UnsupportedOpError, match="row chunks"):
            device.matmul(out, a, w)
        device.release([a])


@pytest.mark.parametrize("per_slot", [False, True], ids=["gate", "down"])
def test_chunked_matmul_id(device, per_slot):
    """An expert tensor [5, 70, 256] Q4_K cut into output rows (of every expert) under a 16 KiB limit
    (22 rows a part), 7 rows x 3 experts: the unsplit tensor's result on the same device; under a
    4 KiB scratch limit the rows go through in groups."""
    rng = np.random.default_rng(11)
    n_exp, n_out, n_in, n, k = 5, 70, 256, 7, 3
    ty = T.Q4_K
    raw = np.stack([random_weight(ty, (n_out, n_in), rng) for _ in range(n_exp)])
    ids = np.stack([rng.choice(n_exp, k, replace=False) for _ in range(n)]).astype(np.int32)
    x = rng.standard_normal((n, k * n_in if per_slot else n_in)).astype(np.float32)
    xt, it = device.empty(x.shape), device.empty((n, k), T.I32)
    device.write(xt, x)
    device.write(it, ids)
    want = device.empty((n, k * n_out))
    w = device.upload(raw, ty, (n_exp, n_out, n_in))
    device.matmul_id(want, xt, w, it)
    ref = device.read(want)
    per = (16384 - chunked.PAD_BYTES) // (n_exp * row_bytes(ty, n_in))
    for cap in (16384, 4096 + chunked.PAD_BYTES):
        got = device.empty((n, k * n_out))
        with limit(device, 16384):
            wc = device.upload(raw, ty, (n_exp, n_out, n_in))
        assert [r0 for r0, _ in wc.chunks] == list(range(0, n_out, per))
        with limit(device, cap):
            device.matmul_id(got, xt, wc, it)
            assert nmse(device.read(got), ref) < 1e-12  # one row at a time may sum in another order
        device.release([wc])


def test_chunked_scratch_grows_inside_graph_scopes(device):
    """A chunked matmul of 1 row, then 9, then 1 again, each inside a graph scope (Vulkan records them):
    the scratch grows inside the second scope (the old buffer is released after it), the results stay
    right, and a replayed scope still gives them."""
    rng = np.random.default_rng(13)
    n_out, n_in, ty = 300, 256, T.Q4_K
    raw = random_weight(ty, (n_out, n_in), rng)
    x = rng.standard_normal((9, n_in)).astype(np.float32)
    xt, y = device.empty((9, n_in)), device.empty((9, n_out))
    device.write(xt, x)
    with limit(device, 16384):
        w = device.upload(raw, ty, (n_out, n_in))
    plain = device.upload(raw, ty, (n_out, n_in))
    want = {}
    for n in (1, 9):
        device.matmul(y.head(n), xt.head(n), plain)
        want[n] = device.read(y.head(n))
    with limit(device, 16384):
        for n in (1, 9, 1, 9):
            with device.graph(("chunked-scratch", n, w.serial)) as issue:
                if issue:
                    device.matmul(y.head(n), xt.head(n), w)
            assert nmse(device.read(y.head(n)), want[n]) < 1e-12, n
        assert not device._chunk_retired
    device.release([w, plain])


def test_chunked_weight_in_matmuls(device):
    """``matmuls`` (one launch for Q/K/V on OpenCL) with one weight in row chunks: each output as
    its own ``matmul`` gives (the chunked one runs per part)."""
    rng = np.random.default_rng(11)
    n_in = 256
    rows = (300, 40, 40)
    raws = [random_weight(T.Q4_0, (n, n_in), rng) for n in rows]
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    xt = device.empty((1, n_in))
    device.write(xt, x)
    with limit(device, 16384):
        ws = [device.upload(r, T.Q4_0, (n, n_in)) for r, n in zip(raws, rows)]
        assert ws[0].chunks is not None and ws[1].chunks is None
        outs = [device.empty((1, w.shape[0])) for w in ws]
        device.matmuls(xt, *zip(outs, ws))
        for o, w in zip(outs, ws):
            one = device.empty((1, w.shape[0]))
            device.matmul(one, xt, w)
            if device.info.backend == "cpu":  # BLAS blocks a part's product differently from the whole's
                assert nmse(device.read(o), device.read(one)) < 1e-12
            else:  # the same kernel rows: the same bits
                np.testing.assert_array_equal(device.read(o), device.read(one))
            device.release([one])
        device.release(ws + outs)
