"""The mixture-of-experts ops on OpenCL and Vulkan against the numpy reference at odd shapes:
``matmul_id`` for every weight type the device runs (MXFP4 included; broadcast and per-slot
inputs; experts that receive zero rows), routing for every gating function, ``add_id``,
``moe_combine``, ``swiglu_oai``, gemma4's per-expert weight scale; MXFP4 ``matmul`` / ``get_rows``; and a qwen3moe model
entirely on each device with the logits of numpy. Vulkan runs these under the validation layer
too: ``python tests/vulkan_validation.py -q -k test_moe_ops_devices``."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device
from gguf import GGMLQuantizationType as T
from pathsutil import eval_three_ways
from test_arch_moe import PROMPT, SHAPES

from cooktop import Llama
from cooktop.backends.base import nmse
from cooktop.backends.cpu.device import CpuDevice, cpu_info
from cooktop.format.quants import random_weight
from cooktop.tools import synth


@pytest.fixture(scope="module", params=["opencl", "vulkan"])
def ocl(request):
    """A device of each family with MoE kernels (the name is historical: OpenCL came first)."""
    return open_family_device(request.param)


@pytest.fixture(scope="module")
def ref():
    d = CpuDevice(cpu_info(), cache_budget=0)
    yield d
    d.close()


def _put(d, a, ty=T.F32):
    t = d.empty(a.shape, ty)
    d.write(t, a)
    return t


def _both(ocl, ref, fn):
    return ocl.read(fn(ocl)), ref.read(fn(ref))


TYPES = [T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4, T.Q2_K, T.Q3_K]


@pytest.mark.parametrize("n", [1, 5], ids=["decode", "prompt"])
@pytest.mark.parametrize("per_slot", [False, True], ids=["broadcast", "per-slot"])
@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.name)
def test_matmul_id(ocl, ref, ty, per_slot, n):
    """One row (OpenCL: mul_mv_id) and several (OpenCL: grouped by expert, mul_mm_id)."""
    rng = np.random.default_rng(int(ty) + 3)
    E, n_out, k = 7, 37, 3
    n_in = 256 if ty.name.endswith("_K") else (70 if ty in (T.F32, T.F16) else 96)  # F32/F16: a partial unit
    raw = np.concatenate([random_weight(ty, (n_out, n_in), rng) for _ in range(E)])
    ids = np.stack([rng.choice([0, 2, 3, 6], k, replace=False) for _ in range(n)]).astype(np.int32)  # 1, 4, 5 unused
    x = rng.standard_normal((n, k * n_in if per_slot else n_in)).astype(np.float32)

    def run(d):
        out = d.empty((n, k * n_out))
        d.matmul_id(out, _put(d, x), d.upload(raw, ty, (E, n_out, n_in)), _put(d, ids, T.I32))
        return out

    got, want = _both(ocl, ref, run)
    assert nmse(got, want) < 1e-10, ty.name


EXACT_TYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.Q2_K, T.F32]


@pytest.mark.parametrize("per_slot", [False, True], ids=["broadcast", "per-slot"])
@pytest.mark.parametrize("ty", EXACT_TYPES, ids=lambda t: t.name)
def test_matmul_id_prompt_is_the_one_row_sums_bit_for_bit(ocl, ty, per_slot):
    """A prompt's matmul_id (OpenCL: grouped by expert, mul_mm_id) gives every slot exactly what the
    one-row call (mul_mv_id) gives it: 11 rows (an expert's slots are not a multiple of its 8-slot
    tile), 6 experts, 37 outputs (not a multiple of 16), the F32 matrix with a partial unit. Q8_0,
    Q4_0 and the K-quants' one-row blocks fold the scale out of the products, which a dequantize
    then fma prompt kernel rounds otherwise (Q4_0: up to 7.6e-6 here, 4.1e-3 in a model's logits)."""
    rng = np.random.default_rng(int(ty) + 11)
    E, n_out, k, n = 6, 37, 3, 11
    n_in = 512 if ty.name.endswith("_K") else (166 if ty == T.F32 else 160)
    raw = np.concatenate([random_weight(ty, (n_out, n_in), rng) for _ in range(E)])
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(n)]).astype(np.int32)
    ids[:9, 0] = 4  # expert 4 gets 9 or more slots: a full tile of 8 and a partial one
    x = rng.standard_normal((n, k * n_in if per_slot else n_in)).astype(np.float32)
    w = ocl.upload(raw, ty, (E, n_out, n_in))
    out = ocl.empty((n, k * n_out))
    ocl.matmul_id(out, _put(ocl, x), w, _put(ocl, ids, T.I32))
    batch = ocl.read(out)
    one = []
    for i in range(n):
        o = ocl.empty((1, k * n_out))
        ocl.matmul_id(o, _put(ocl, x[i:i + 1]), w, _put(ocl, ids[i:i + 1], T.I32))
        one.append(ocl.read(o))
    one = np.concatenate(one)
    assert np.abs(one).max() > 1.0  # real sums, not zeros on both sides
    np.testing.assert_array_equal(batch, one, err_msg=ty.name)


def test_qwen3moe_q4_0_prompt_token_by_token_and_cached_prefix_agree(tmp_path):
    """A Q4_0 mixture all on OpenCL: one batch, token by token and a cached prefix + the rest give the
    same logits bit for bit (f32 KV cache, as tests/test_prompt_paths.py). OpenCL only: Vulkan's
    matmul_id passes the op test above, but its whole model is 1 ulp apart between the paths
    (something outside matmul_id; tests/test_prompt_paths.py holds Vulkan to its float bound)."""
    from cooktop.engine import generate as G
    from cooktop.format.kvtypes import KVConfig
    ocl = open_family_device("opencl")
    p = tmp_path / "q3moe-Q4_0.gguf"
    synth.write(p, SHAPES["qwen3moe"], "Q4_0", seed=3)
    toks = PROMPT[:21]
    eng = G.load(str(p), n_ctx=64, n_batch=32, device=ocl.info.selector, n_gpu_layers=-1, kv=KVConfig(T.F32, T.F32))
    try:
        pl = eng.placement
        assert pl.blocks == [ocl.info.selector] * 2 and pl.experts is None, pl.notes
        batch, one, rest = eval_three_ways(eng, toks, 9)
    finally:
        eng.close()
    assert np.abs(batch).max() > 0.1
    np.testing.assert_array_equal(one, batch)
    np.testing.assert_array_equal(rest, batch[9:])


@pytest.mark.parametrize("gating,norm,scale,biased", [("softmax", True, 0.0, False), ("softmax", False, 0.0, False),
                                                      ("softmax_weight", False, 0.0, False),
                                                      ("sigmoid", True, 2.5, False), ("sigmoid", True, 2.5, True),
                                                      ("softmax", False, 0.0, True)])
def test_route(ocl, ref, gating, norm, scale, biased):
    """Every gating; with the selection bias (``exp_probs_b``: GLM-4.5's sigmoid router) the choice
    differs from the unbiased one in most rows."""
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((9, 13)) * 3).astype(np.float32)
    bias = (rng.standard_normal(13) * (0.4 if gating == "sigmoid" else 0.1)).astype(np.float32)

    def run(d, which):
        ids, w = d.empty((9, 4), T.I32), d.empty((9, 4))
        d.moe_route(ids, w, _put(d, logits), gating, norm=norm, scale=scale, bias=_put(d, bias) if biased else None)
        return ids if which == "ids" else w

    got, want = _both(ocl, ref, lambda d: run(d, "ids"))
    np.testing.assert_array_equal(got, want)
    got, want = _both(ocl, ref, lambda d: run(d, "w"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_add_id_combine_swiglu_oai(ocl, ref):
    rng = np.random.default_rng(4)
    n, k, m, E = 5, 3, 7, 4
    x = rng.standard_normal((n, k * m)).astype(np.float32)
    b = rng.standard_normal((E, m)).astype(np.float32)
    ids = np.array([[0, 1, 2], [3, 2, 1], [1, 1, 0], [3, 0, 2], [2, 3, 0]], np.int32)
    wts = rng.random((n, k)).astype(np.float32)
    g = (rng.standard_normal((n, m)) * 6).astype(np.float32)
    u = (rng.standard_normal((n, m)) * 6).astype(np.float32)

    def add_id(d):
        t = _put(d, x)
        d.add_id(t, t, _put(d, b), _put(d, ids, T.I32))
        return t

    def combine(d):
        out = d.empty((n, m))
        d.moe_combine(out, _put(d, x), _put(d, wts))
        return out

    def swiglu(d):
        out = d.empty((n, m))
        d.swiglu_oai(out, _put(d, g), _put(d, u), 1.702, 7.0)
        return out

    for fn in (add_id, combine, swiglu):
        got, want = _both(ocl, ref, fn)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=fn.__name__)


def test_per_expert_scale_of_the_weights(ocl, ref):
    """gemma4's per-expert down scale as builders.build_moe_ffn composes it (odd n, k, n_expert):
    ``scale(.., 0)``, ``add_id`` of the scale [n_expert, 1], ``mul``: wts[i, j] * scale[ids[i, j]]."""
    rng = np.random.default_rng(6)
    n, k, E = 5, 3, 7
    wts = rng.random((n, k)).astype(np.float32)
    sc = rng.uniform(0.5, 1.5, (E, 1)).astype(np.float32)
    ids = rng.integers(0, E, (n, k)).astype(np.int32)

    def scaled(d):
        w, t = _put(d, wts), d.empty((n, k))
        d.scale(t, w, 0.0)
        d.add_id(t, t, _put(d, sc), _put(d, ids, T.I32))
        d.mul(w, w, t)
        return w

    got, want = _both(ocl, ref, scaled)
    np.testing.assert_array_equal(want, wts * sc[ids, 0])
    np.testing.assert_array_equal(got, want)


def test_mxfp4_matmul_and_get_rows(ocl, ref):
    rng = np.random.default_rng(9)
    raw = random_weight(T.MXFP4, (45, 96), rng)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    for n_tok in (1, 3):
        def mm(d, n_tok=n_tok):
            out = d.empty((n_tok, 45))
            d.matmul(out, _put(d, x[:n_tok]), d.upload(raw, T.MXFP4, (45, 96)))
            return out

        got, want = _both(ocl, ref, mm)
        assert nmse(got, want) < 1e-10

    def rows(d):
        out = d.empty((4, 96))
        d.get_rows(out, d.upload(raw, T.MXFP4, (45, 96)), _put(d, np.array([0, 44, 7, 7], np.int32), T.I32))
        return out

    got, want = _both(ocl, ref, rows)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("ft", ["F32", "Q8_0"])
def test_qwen3moe_all_on_opencl(ocl, tmp_path, ft):
    p = tmp_path / f"q3moe-{ft}.gguf"
    synth.write(p, SHAPES["qwen3moe"], ft, seed=3)
    out = {}
    for dev in ("cpu", ocl.info.selector):
        llm = Llama(model_path=str(p), n_ctx=64, n_batch=7, logits_all=True, verbose=False, device=dev,
                    n_gpu_layers=-1)
        try:
            llm.eval(PROMPT)
            out[dev] = np.array(llm.scores[:len(PROMPT)])
            if dev != "cpu":
                pl = llm._engine.placement
                assert pl.blocks == [dev, dev] and pl.experts is None and pl.head == dev, pl.notes
        finally:
            llm.close()
    # F32: the same float products; Q8_0: the devices' dense matmuls use 8-bit activations (llama.cpp's way)
    assert nmse(out[ocl.info.selector], out["cpu"]) < (1e-9 if ft == "F32" else 3e-3)


@pytest.mark.parametrize("window,start", [(0, False), (5, False), (0, True)])
@pytest.mark.parametrize("head_dim", [32, 48])
def test_attention_sinks(ocl, ref, head_dim, window, start):
    """gpt-oss's sinks at odd shapes: GQA, a window, several sequences' rows (kv_start), serial and
    vector flavours (head_dim 32 takes the OpenCL 8-bit output path on CPUs, 48 not)."""
    rng = np.random.default_rng(head_dim + window)
    n_head, n_kv, n, n_ctx = 4, 2, 9, 12
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    kc = rng.standard_normal((n_ctx, n_kv * head_dim)).astype(np.float32)
    vc = rng.standard_normal((n_ctx, n_kv * head_dim)).astype(np.float32)
    sinks = (rng.standard_normal(n_head) * 2).astype(np.float32)
    pos = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8] if not start else [0, 1, 2, 3, 6, 7, 8, 9, 10], np.int32)
    kvs = np.array([0] * 4 + [6] * 5, np.int32)

    def run(d):
        out = d.empty((n, n_head * head_dim))
        d.attention_sinks(out, _put(d, q), _put(d, kc), _put(d, vc), _put(d, pos, T.I32), _put(d, sinks), n_head,
                          n_kv, 0.2, window, kv_start=_put(d, kvs, T.I32) if start else None)
        return out

    got, want = _both(ocl, ref, run)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ft", ["F32", "MXFP4_MOE"])
def test_gpt_oss_on_the_device(ocl, tmp_path, ft):
    """gpt-oss all on the device (attention with sinks, MXFP4 experts, the head)."""
    p = tmp_path / f"oss-{ft}.gguf"
    synth.write(p, SHAPES["gpt-oss"], ft, seed=3)
    out = {}
    for dev in ("cpu", ocl.info.selector):
        llm = Llama(model_path=str(p), n_ctx=64, n_batch=7, logits_all=True, verbose=False, device=dev,
                    n_gpu_layers=-1)
        try:
            llm.eval(PROMPT)
            out[dev] = np.array(llm.scores[:len(PROMPT)])
            pl = llm._engine.placement
        finally:
            llm.close()
    sel = ocl.info.selector
    assert pl.blocks == [sel] * 3 and pl.head == sel and pl.experts is None, pl.notes
    assert nmse(out[sel], out["cpu"]) < (1e-9 if ft == "F32" else 3e-3)
