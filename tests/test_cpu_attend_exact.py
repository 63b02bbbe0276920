"""numpy's attention (cpu/device.py ``_attend_tiles``) gives a query row the same bits whatever rows
come with it and however many cache rows are read: fixed-shape BLAS products at positions fixed by
the row's own position, fixed-order sums. Random shapes (GQA, windows, sinks) and random
companions; values checked against a float64 softmax attention."""
import numpy as np
import pytest

from cooktop.backends.cpu import device as cpu_device
from cooktop.backends.cpu.device import _attend_tiles


def _reference(qa, kc, vc, p, lo, n_head, n_head_kv, scale, window, sinks):
    """float64 [n, n_head * hd]: softmax attention of each row over cache positions lo..p[i]."""
    n, hd = qa.shape[0], qa.shape[1] // n_head
    g = n_head // n_head_kv
    out = np.zeros((n, n_head * hd))
    for i in range(n):
        js = np.arange(lo, p[i] + 1)
        if window > 0:
            js = js[js > p[i] - window]
        for h in range(n_head):
            c = slice((h // g) * hd, (h // g + 1) * hd)
            s = kc[js - lo, c].astype(np.float64) @ qa[i, h * hd:(h + 1) * hd].astype(np.float64) * scale
            m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            e = np.exp(s - m)
            d = e.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
            out[i, h * hd:(h + 1) * hd] = e @ vc[js - lo, c].astype(np.float64) / d
    return out


@pytest.mark.parametrize("chunk", [None, 1 << 12])
def test_attend_rows_bit_for_bit_with_any_companions(monkeypatch, chunk):
    if chunk is not None:  # steps of one tile or a few: the same bits
        monkeypatch.setattr(cpu_device, "ATTN_CHUNK", chunk)
    rng = np.random.default_rng(7)
    checks = 0
    for _ in range(25):
        hd, nkv, g = int(rng.choice([32, 64, 128])), int(rng.choice([1, 2, 4])), int(rng.choice([1, 2, 4, 8]))
        nh = nkv * g
        lo, total = int(rng.integers(0, 70)), int(rng.integers(1, 300))
        window = int(rng.integers(1, 200)) if rng.random() < 0.3 else 0
        sinks = rng.standard_normal(nh).astype(np.float32) if rng.random() < 0.3 else None
        kc = (rng.standard_normal((total, nkv * hd)) * 2).astype(np.float32)
        vc = rng.standard_normal((total, nkv * hd)).astype(np.float32)
        qa = (rng.standard_normal((total, nh * hd)) * 2).astype(np.float32)
        pos, scale = lo + np.arange(total), float(1 / np.sqrt(hd))
        args = (nh, nkv, scale, window, sinks)
        whole = _attend_tiles(qa, kc, vc, pos, lo, *args)
        last = slice(max(0, total - 3), total)
        np.testing.assert_allclose(whole[last], _reference(qa[last], kc, vc, pos[last], lo, *args), atol=1e-5)
        for i in rng.choice(total, min(total, 6), replace=False):
            one = _attend_tiles(qa[i:i + 1], kc, vc, pos[i:i + 1], lo, *args)  # alone, a shorter cache
            np.testing.assert_array_equal(one[0], whole[i])
            a, b = int(rng.integers(0, i + 1)), int(rng.integers(i + 1, total + 1))  # a prefix's tail
            np.testing.assert_array_equal(_attend_tiles(qa[a:b], kc, vc, pos[a:b], lo, *args)[i - a], whole[i])
            sel = np.union1d(rng.choice(total, int(rng.integers(1, total + 1)), replace=False), [i])
            sp = _attend_tiles(qa[sel], kc, vc, pos[sel], lo, *args)  # scattered companions
            np.testing.assert_array_equal(sp[np.searchsorted(sel, i)], whole[i])
            checks += 3
    assert checks > 200
