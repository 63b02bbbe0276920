"""A sequence's logits do not depend on how its prompt was evaluated: in one batch, token by token,
or after a cached prefix, on every backend (numpy, OpenCL, Vulkan).

The paths must do the same arithmetic: on OpenCL and Vulkan a weight type whose one-token
matmul runs on 8-bit activations runs its prompt matrices on the same 8-bit activations with
the same sums (OpenCL ``mul_mvt_q8``, or the AVX-512 VNNI prompt kernels of Q4_0, Q4_K, Q5_K and Q6_K,
which do the 64-byte mat-vec's float operations per lane in its order; Vulkan's mat-vec for
every row count), so they agree to the float bound (1e-4 in a logprob; most are bit-identical).
llama.cpp's own batched and one-at-a-time evaluations of the same files differ by 0.14, 0.06
and 0.18 on tiny-Q4_K / tiny-Q6_K / tiny-Q4_K_M (llama-cpp-python 0.3.36).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHARED, skip_or_fail
from gguf import GGMLQuantizationType as T
from pathsutil import eval_three_ways

from cooktop.engine import generate as G

TOKENS = [1, 403, 407, 261, 378, 261, 410, 432, 298, 315, 421, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309,
          310, 311, 312, 313, 314, 316, 317, 318, 319, 320, 321]
FLOAT_BOUND = 1e-4
MODELS = ["stories260K.gguf", "tiny/tiny-F16.gguf", "tiny/tiny-Q8_0.gguf", "tiny/tiny-Q4_1.gguf",
          "tiny/tiny-Q5_0.gguf", "tiny/tiny-Q5_K.gguf", "tiny/tiny-Q4_0.gguf", "tiny/tiny-Q4_K_M.gguf",
          "tiny/tiny-Q6_K.gguf"]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _paths(path: str, device: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, object]:
    """(one batch, token by token, cached prefix + rest) logits float32 [n, n_vocab], and the engine.

    With an f32 KV cache: a rounded one (f16, the default) makes the paths agree only to its rounding
    (a K value 1e-7 apart at a rounding boundary of f16 is one ulp apart, ~1e-3 in logprob later)."""
    from cooktop.format.kvtypes import KVConfig
    eng = G.load(path, n_ctx=128, n_batch=64, device=device, n_gpu_layers=-1, kv=KVConfig(T.F32, T.F32))
    batch, one, rest = eval_three_ways(eng, TOKENS, 13)
    return batch, one, np.concatenate([batch[:13], rest]), eng


#: Every (family, model) pair: tiny-Q6_K on Vulkan, once left out as the costliest case on lavapipe
#: (33 s: about 130 pipelines compiled per load), costs a few seconds since kp shares pipelines.
SAME_PIPELINES: set[tuple[str, str]] = set()
PATH_CASES = [(f, m) for f in ("cpu", "opencl", "vulkan") for m in MODELS if (f, m) not in SAME_PIPELINES]


@pytest.mark.parametrize("family,model", PATH_CASES, ids=[f"{f}-{m}" for f, m in PATH_CASES])
def test_batch_token_by_token_and_cached_prefix_agree(family, model):
    from cooktop.backends import registry
    path = SHARED / "models" / model
    if not path.exists():
        skip_or_fail("shared", f"{path} missing")
    if family != "cpu":
        res = registry.probe(family)
        if not res.available or not res.devices:
            skip_or_fail(family, f"{res.reason}; to enable: {res.hint}")
    batch, one, prefix, eng = _paths(str(path), family)
    try:
        bound = FLOAT_BOUND
        d_one = float(np.abs(_log_softmax(batch) - _log_softmax(one)).max())
        d_prefix = float(np.abs(_log_softmax(batch) - _log_softmax(prefix)).max())
        assert d_one <= bound, (family, model, d_one, bound)
        assert d_prefix <= bound, (family, model, d_prefix, bound)
    finally:
        eng.close()


def test_every_pair_runs():
    """No (family, model) pair of the prompt paths is left out."""
    assert PATH_CASES == [(f, m) for f in ("cpu", "opencl", "vulkan") for m in MODELS]


@pytest.mark.parametrize("model", ["stories260K.gguf", "tiny/tiny-Q4_0.gguf", "tiny/tiny-Q4_K_M.gguf",
                                   "tiny/tiny-F16.gguf"])
def test_numpy_paths_bit_for_bit(model):
    """numpy, the reference, gives a token the same logits bit for bit in one batch, one at a time and
    after a cached prefix: its weight products always run with at least ``MIN_ROWS`` token rows
    (OpenBLAS's gemv and small-matrix kernels round otherwise than its gemm) and its attention sums
    in fixed orders (cpu/device.py ``_attend``). Before, 2e-4 apart on the 1.1B shape (prefix + tail)
    and 8.5e-4 one at a time; and, the default f16 KV cache, the cached prefix holds the same bits."""
    path = SHARED / "models" / model
    if not path.exists():
        skip_or_fail("shared", f"{path} missing")
    batch, one, prefix, eng = _paths(str(path), "cpu")
    eng.close()
    assert np.abs(batch).max() > 0.1
    np.testing.assert_array_equal(one, batch)
    np.testing.assert_array_equal(prefix, batch)


def test_split_numpy_and_opencl_cached_prefix_bit_for_bit():
    """Layers split between OpenCL and numpy (``n_gpu_layers`` 2 of 3: block 1 and the head on
    OpenCL, f16 KV cache): the last token's logits of a whole prompt and of its prefix then the
    rest are the same bits (each side is exact)."""
    from cooktop.backends import registry
    res = registry.probe("opencl")
    if not res.available or not res.devices:
        skip_or_fail("opencl", f"{res.reason}; to enable: {res.hint}")
    path = SHARED / "models" / "tiny" / "tiny-Q4_0.gguf"
    if not path.exists():
        skip_or_fail("shared", f"{path} missing")
    eng = G.load(str(path), n_ctx=128, n_batch=64, device=res.devices[0].selector, n_gpu_layers=2)
    try:
        assert len(set(eng.placement.blocks)) == 2, eng.placement.summary()
        whole, one, rest = eval_three_ways(eng, TOKENS, 13)
    finally:
        eng.close()
    np.testing.assert_array_equal(rest, whole[13:])
    np.testing.assert_array_equal(one, whole)


def test_numpy_row_layout_holds_on_other_shapes():
    """The token-row layout numpy measured on this machine (cpu/quants.py ``row_layout``) gives a token's
    row of a weight product the same bits alone, in a batch and in a batch's prefix at shapes other
    than those it was measured on (a 1.1B FFN's n_in, stories260K's, an odd one)."""
    from cooktop.backends.cpu import quants

    lay = quants.row_layout()
    rng = np.random.default_rng(7)
    with quants.blas_single_thread():
        for n_out, n_in in ((600, 2048), (512, 64), (333, 172)):
            w = rng.standard_normal((n_out, n_in)).astype(np.float32)
            x = rng.standard_normal((37, n_in)).astype(np.float32)
            assert quants._layout_holds(lay, w, x), (lay, n_out, n_in)
