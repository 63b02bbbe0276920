"""gemma4 end to end against llama.cpp (llama-cpp-python at test time), on every backend.

Tiny synthetic models (``tools/synth.py``) with what Gemma 4 adds to Gemma 3: per-layer token
inputs, the last blocks reading earlier blocks' K/V (no K/V of their own), heads of 32 on the
sliding-window layers and 64 on the full ones (a quarter rotated: proportional rope factors), fewer
KV heads on the full layers, V = K there (no ``attn_v``), a double-wide MLP on the shared-KV blocks,
per-block output scalars and a final logit soft-cap (0.5: well inside tanh's curve, so the cap is
exercised). Bounds: logits nmse <= 1e-5 (F32) and <= 3e-3 (quantized), the greedy continuation equal
wherever llama.cpp's top-2 margin is clear of the numerical error.

- ``small``: 9 blocks (SWA, SWA, full, ...), blocks 6-8 share the K/V of blocks 4 (SWA) and 5 (full);
  a 40-token prompt (5 sliding windows of 8) in chunks of 7 (llama.cpp: 16), F32 and Q8_0.
- ``kq``: 5 blocks 256 wide (every row a multiple of Q4_K's 256), blocks 3-4 share block 1's K/V; Q4_K.
- ``dense``: ``small`` without per-layer inputs and KV sharing (the 31B's layout); F32.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import open_family_device, rewrite_gguf, skip_or_fail

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.cli.info import model_info
from cooktop.cli.plan import plan_report
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.format.kvtypes import KVConfig
from cooktop.model.arch import ARCHITECTURES
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = synth.Shape(n_embd=64, n_layer=9, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=256,
                    rope_freq_base=1e6, tied=True, head_dim=64, arch="gemma4", n_swa=8, swa_pattern=3,
                    rope_freq_base_swa=10000.0, head_dim_swa=32, n_kv_shared=3, n_embd_per_layer=32,
                    double_wide=True, n_head_kv_full=1, k_eq_v=True, rope_partial_full=0.25, out_scales=True,
                    final_logit_softcap=0.5)
KQ = dataclasses.replace(SMALL, n_embd=256, n_layer=5, n_ff=256, head_dim=128, head_dim_swa=64, n_kv_shared=2,
                         n_embd_per_layer=256, n_head_kv_full=None, k_eq_v=False, final_logit_softcap=5.0)
#: 31B-like: no per-layer inputs, no KV sharing (V = K and fewer KV heads on the full layers, as 31B)
DENSE = dataclasses.replace(SMALL, n_embd_per_layer=0, n_kv_shared=0, double_wide=False)
SHAPES = {"small": SMALL, "kq": KQ, "dense": DENSE}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 40)]
#: (shape, file type, cooktop n_batch)
CASES = [("small", "F32", 7), ("small", "Q8_0", 7), ("kq", "Q4_K", 16), ("dense", "F32", 7)]
N_CTX, N_GREEDY = 128, 6


def bound(ft: str) -> float:
    return 1e-5 if ft == "F32" else 3e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4")
    out = {}
    for shape, ft, _ in CASES:
        p = d / f"gemma4-{shape}-{ft}.gguf"
        synth.write(p, SHAPES[shape], ft, seed=3)
        out[shape, ft] = p
    return out


def _greedy(llm, tokens: list[int], n: int) -> tuple[np.ndarray, list[int], list[float]]:
    """Logits of ``tokens`` (every position), then ``n`` greedy steps: (logits, tokens, top-2 margins)."""
    llm.reset()
    llm.eval(tokens)
    logits = np.array(llm.scores[:len(tokens)], dtype=np.float64)
    out, margins = [], []
    last = logits[-1]
    for _ in range(n):
        top = np.sort(last)[-2:]
        margins.append(float(top[1] - top[0]))
        t = int(np.argmax(last))
        out.append(t)
        llm.eval([t])
        last = np.array(llm.scores[len(tokens) + len(out) - 1], dtype=np.float64)
    return logits, out, margins


@pytest.fixture(scope="module")
def reference(models):
    """llama.cpp's logits and greedy continuation per case (computed once)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    refs = {}
    for shape, ft, _ in CASES:
        llm = llama_cpp.Llama(model_path=str(models[shape, ft]), logits_all=True, n_ctx=N_CTX, n_batch=16,
                              n_ubatch=16, verbose=False)
        refs[shape, ft] = _greedy(llm, PROMPT, N_GREEDY)
        llm.close()
    return refs


#: Vulkan runs the small F32 case only: on lavapipe (a CPU driver) the quantized matmul pipelines take a minute
#: or more to build and run; those kernels are checked by the Vulkan op tests.
RUNS = [pytest.param(fam, *case, id=f"{fam}-{case[0]}-{case[1]}",
                     marks=[pytest.mark.slow(reason="lavapipe builds its Vulkan pipelines in 15-30 s")]
                     if fam == "vulkan" else [])
        for fam in registry.FAMILIES for case in CASES if fam != "vulkan" or case[:2] == ("small", "F32")]


def _run(path, family: str, n_batch: int) -> tuple[np.ndarray, list[int]]:
    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=n_batch, logits_all=True, verbose=False, device=family,
                n_gpu_layers=-1)
    try:
        if family != "cpu":
            pl = llm._engine.placement
            assert pl.n_offloaded() == llm._engine.cfg.n_layer + 1, pl.notes
        logits, tokens, _ = _greedy(llm, PROMPT, N_GREEDY)
    finally:
        llm.close()
    return logits, tokens


@pytest.mark.parametrize("family,shape,ft,n_batch", RUNS)
def test_logits_and_greedy_match_llama_cpp(family, models, reference, shape, ft, n_batch):
    if family != "cpu":
        open_family_device(family)
    ref_logits, ref_tokens, margins = reference[shape, ft]
    logits, tokens = _run(models[shape, ft], family, n_batch)
    err = nmse(logits, ref_logits)
    print(f"gemma4 {shape} {ft} on {family}: nmse {err:.3g} vs llama.cpp")
    assert err <= bound(ft)
    scale = float(np.abs(ref_logits).max())
    for got, want, margin in zip(tokens, ref_tokens, margins):
        if margin < 1e-2 * scale:  # not clear of the numerical error: the continuations may part here
            break
        assert got == want


def test_chunks_equal_token_by_token(models, reference):
    """The 40-token prompt (5 windows) in chunks of 7 gives what one token at a time gives, and both match
    llama.cpp: the shared-KV blocks read the cache their source block wrote earlier in the same pass."""
    one, _ = _run(models["small", "F32"], "cpu", 1)
    chunks, _ = _run(models["small", "F32"], "cpu", 7)
    assert nmse(chunks, one) <= 1e-7  # rounding of matmuls over 7 rows or 1, nothing more
    assert nmse(one, reference["small", "F32"][0]) <= bound("F32")


def test_softcap_bounds_the_logits(reference):
    """The cap (0.5) is active: llama.cpp's logits reach near it and never past it."""
    logits = reference["small", "F32"][0]
    assert 0.3 < np.abs(logits).max() < 0.5


# -- hyper-parameters, tensors, budgets --------------------------------------------------
def test_hparams(models):
    cfg = load_config(open_gguf(models["small", "F32"]))
    assert cfg.swa_layers == (True, True, False) * 3 and cfg.n_swa == 8
    assert (cfg.head_dim, cfg.head_dim_swa, cfg.n_rot, cfg.n_rot_swa) == (64, 32, 64, 32)
    assert cfg.n_layer_kv == 6 and [cfg.kv_source(i) for i in range(9)] == [0, 1, 2, 3, 4, 5, 4, 4, 5]
    assert cfg.n_ff_layers == (96,) * 6 + (192,) * 3 and cfg.n_ff == 192
    assert cfg.n_head_kv_layers == (2, 2, 1) * 3 and cfg.n_head_kv == 2
    assert (cfg.n_embd_per_layer, cfg.final_logit_softcap, cfg.attn_scale) == (32, 0.5, 1.0)
    assert len(cfg.layer_out_scales) == 9 and all(0.5 <= s <= 1.0 for s in cfg.layer_out_scales)
    full, swa = cfg.layer(2), cfg.layer(3)
    assert (full.head_dim, full.n_head_kv, full.n_embd_kv) == (64, 1, 64)
    assert (swa.head_dim, swa.n_head_kv, swa.n_embd_kv, swa.n_rot) == (32, 2, 64, 32)
    assert [cfg.kv_width(i) for i in range(9)] == [64] * 6 + [0] * 3


def test_tensors_of_shared_and_full_blocks(models):
    """A shared-KV block has no K/V tensors (nor runs kv_store); a full block has no attn_v (V is K)."""
    gf = open_gguf(models["small", "F32"])
    cfg = load_config(gf)
    a = ARCHITECTURES["gemma4"]
    keys = {i: set(a.unit_tensors(gf.tensors, i)) for i in range(9)}
    assert {"attn_k", "attn_v", "attn_k_norm", "rope_freqs"} <= keys[0]
    assert "attn_v" not in keys[2] and "attn_k" in keys[2]
    assert not {"attn_k", "attn_v", "attn_k_norm"} & keys[7]
    assert {"inp_gate", "proj", "post_norm", "layer_output_scale"} <= keys[7]
    assert "kv_store" in a.ops(cfg, 0, gf.tensors) and "kv_store" not in a.ops(cfg, 7, gf.tensors)
    assert gf.tensors["blk.8.ffn_up.weight"].shape == (192, 64)
    assert gf.tensors["rope_freqs.weight"].shape == (32,)


def test_shared_blocks_have_no_kv_bytes(models):
    """plan --json and info count K/V only for the blocks that keep their own: 6 of 9 here, each of
    n_head_kv * head_dim = 64 values per row (f16: 128 bytes a row for K and for V)."""
    path = str(models["small", "F32"])
    kv = KVConfig.parse("f16", "f16", "on")
    rep = plan_report(path, N_CTX, 16, "cpu", 0, None, kv=kv)
    (dev,) = rep["devices"]
    assert dev["kv_bytes"] == 6 * 2 * 128 * N_CTX
    info = model_info(path, N_CTX, kv)
    assert info["kv_cache"]["bytes"] == 6 * 2 * 128 * N_CTX
    assert load_config(open_gguf(path)).kv_cache_bytes(N_CTX, 2) == 6 * 2 * 128 * N_CTX


def test_the_e2b_preset_has_gemma4_e2b_shapes():
    cfg = synth.config(synth.SHAPES["gemma-4-e2b"])
    assert (cfg.n_layer, cfg.n_embd, cfg.n_layer_kv, cfg.n_embd_per_layer) == (35, 1536, 15, 256)
    assert (cfg.layer(0).head_dim, cfg.layer(4).head_dim, cfg.layer(4).n_rot, cfg.layer(34).n_ff) == (256, 512, 512,
                                                                                                   12288)
    assert [cfg.kv_source(i) for i in (15, 19, 34)] == [13, 14, 14]
    assert sum(cfg.has_kv(i) for i in range(35)) == 15


def test_experts_without_their_keys_are_refused(models, tmp_path):
    """expert_count > 0 (26B-A4B, tests/test_arch_gemma4_moe.py) needs expert_used_count too."""
    from gguf import GGUFValueType
    bad = rewrite_gguf(models["small", "F32"], tmp_path / "moe.gguf", drop=(),
                       extra_kv=[("gemma4.expert_count", 128, GGUFValueType.UINT32)])
    with pytest.raises(UnsupportedModelError, match="expert_used_count"):
        load_config(open_gguf(bad))


def test_kv_sharing_of_the_wrong_kinds_is_refused(models, tmp_path):
    """llama.cpp reads blocks n_layer_kv - 2 (SWA) and - 1 (full): 4 shared leave 5 blocks, whose last two
    are SWA, full the wrong way round."""
    from gguf import GGUFValueType
    bad = rewrite_gguf(models["small", "F32"], tmp_path / "bad.gguf", drop=("gemma4.attention.shared_kv_layers",),
                       extra_kv=[("gemma4.attention.shared_kv_layers", 4, GGUFValueType.UINT32)])
    with pytest.raises(UnsupportedModelError, match="shared_kv_layers = 4"):
        load_config(open_gguf(bad))


def test_partial_offload_keeps_shared_blocks_with_their_cache(models):
    """-ngl 3 would put blocks 7 and 8 on the device, away from the caches of blocks 4 and 5 they read:
    they stay on the host with them, with the reason."""
    open_family_device("opencl")
    rep = plan_report(str(models["small", "F32"]), N_CTX, 16, "opencl", 3, None)
    assert rep["blocks"] == ["cpu"] * 9 and rep["head"].startswith("opencl")
    assert "block 7 runs on cpu with block 4, whose KV cache it reads" in rep["host_reasons"]


def test_sequences_in_one_batch_each_equal_alone(models):
    """Three sequences of one cache in one batch (past the window of 8): each row's logits are what the
    sequence gives alone; the shared-KV blocks read their own sequence's cells of the source's cache."""
    from cooktop.engine import generate as G
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 300, n)] for n in (12, 1, 9)]
    eng = G.load(str(models["small", "F32"]), n_ctx=32, n_batch=32, device="cpu", logits_all=True)
    try:
        alone = [eng.new_sequence().eval(p, logits_all=True) for p in prompts]
        cache = eng.model.new_cache(3)
        got = eng.model.forward_batch(cache, [(s, 0, p, len(p)) for s, p in enumerate(prompts)])
        for rows, want in zip(got, alone):
            # float32 rounding of matmuls over other row counts (a cell mix-up would be ~1e-2)
            assert nmse(np.asarray(rows, np.float64), np.asarray(want, np.float64)) <= 1e-7
        cache.close()
    finally:
        eng.close()


def test_synth_refuses_kv_sharing_llama_cpp_cannot_load():
    from cooktop.errors import CooktopError
    with pytest.raises(CooktopError, match="shared-KV blocks of 7 read blocks 2"):
        synth.validate(dataclasses.replace(synth.SHAPES["gemma-4-e2b"], n_layer=7, n_kv_shared=3), "Q8_0")
    synth.validate(dataclasses.replace(synth.SHAPES["gemma-4-e2b"], n_layer=7, n_kv_shared=2), "Q8_0")
