"""glm4 (GLM-4-0414 dense) end to end against llama.cpp (llama-cpp-python at test time) on numpy,
OpenCL and Vulkan.

Tiny synthetic models in the glm-4-9b preset's structure: Q/K/V biases, partial rotary (normal rope
of 16 of each head's 32 dimensions), the post-attention and post-FFN norms (written 1 + N(0, 0.1)),
the fused gate/up matrix (``ffn_up`` of 2 n_ff rows), GQA 4/2, n_head * head_dim = 128 != n_embd 64.
F32 and Q8_0 64 wide, Q4_K 256 wide. Vulkan runs F32 with the greedy continuation and Q8_0's prompt
logits (lavapipe's cold pipeline builds).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import open_family_device, rewrite_gguf
from densefamily import PROMPT, SCALES, bound, check_against_llama_cpp, llama_cpp_reference, write_models
from pathsutil import eval_three_ways

from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.engine import generate as G
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.arch import ARCHITECTURES
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = dataclasses.replace(synth.SHAPES["glm-4-9b"], n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32,
                            n_rot=16, n_ff=96, n_vocab=300, n_ctx_train=256)
WIDE = dataclasses.replace(SMALL, n_embd=256, head_dim=64, n_rot=32, n_ff=512)
CASES = {"F32": (SMALL, "F32"), "Q8_0": (SMALL, "Q8_0"), "Q4_K": (WIDE, "Q4_K")}
N_CTX = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("glm4")
    out = write_models(d, "glm4", CASES)
    # every dimension rotated: llama.cpp's own numbers differ from the partial rotary's (test below)
    out["full"] = d / "glm4-full.gguf"
    synth.write(out["full"], dataclasses.replace(SMALL, n_rot=32), "F32", seed=3, scales=SCALES)
    return out


@pytest.fixture(scope="module")
def reference(models):
    return llama_cpp_reference(models, N_CTX)


@pytest.fixture(scope="module", params=list(registry.FAMILIES))
def family(request):
    if request.param != "cpu":
        open_family_device(request.param)
    return request.param


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_match_llama_cpp(family, models, reference, case):
    ft = CASES[case][1]
    if family == "vulkan" and ft == "Q4_K":
        pytest.skip("Vulkan: F32 and Q8_0 only (lavapipe's cold pipeline builds; Q4_K runs on numpy and OpenCL)")
    n_greedy = 0 if family == "vulkan" and ft != "F32" else 4
    check_against_llama_cpp(models[case], reference[case], ft, family, N_CTX, n_greedy, "glm4")


def test_partial_rotary_matters_and_matches(models, reference):
    assert nmse(reference["full"][0], reference["F32"][0]) > 100 * bound("F32")
    check_against_llama_cpp(models["full"], reference["full"], "F32", "cpu", N_CTX, 0, "glm4 full rotary")


def test_one_batch_token_by_token_and_cached_prefix_agree(models):
    eng = G.load(str(models["F32"]), n_ctx=N_CTX, n_batch=32, device="cpu", logits_all=True)
    try:
        batch, one, rest = eval_three_ways(eng, PROMPT, 9)
    finally:
        eng.close()
    assert nmse(one, batch) <= 1e-10 and nmse(rest, batch[9:]) <= 1e-10


def test_descriptor_and_config(models):
    cfg = load_config(open_gguf(str(models["F32"])))
    assert (cfg.arch, cfg.rope_mode, cfg.head_dim, cfg.n_rot, cfg.n_layer, cfg.n_layer_nextn) == (
        "glm4", 0, 32, 16, 2, 0)
    a = ARCHITECTURES["glm4"]
    up = a.spec("blk.0.ffn_up.weight")
    assert up.shape(cfg) == (192, 64) and up.part_rows(cfg) == [("ffn_gate", [(0, 96)]), ("ffn_up", [(96, 192)])]
    names = [s.name for s in a.tensors if s.per_block]
    assert names == ["blk.{i}.attn_norm.weight", "blk.{i}.attn_q.weight", "blk.{i}.attn_k.weight",
                     "blk.{i}.attn_v.weight", "blk.{i}.attn_q.bias", "blk.{i}.attn_k.bias", "blk.{i}.attn_v.bias",
                     "blk.{i}.attn_output.weight", "blk.{i}.post_attention_norm.weight", "blk.{i}.ffn_norm.weight",
                     "blk.{i}.ffn_down.weight", "blk.{i}.ffn_up.weight", "blk.{i}.post_ffw_norm.weight"]


def test_nextn_blocks_are_skipped(models, reference, tmp_path):
    """``nextn_predict_layers`` 1: the last block is a multi-token-prediction block, not run (llama.cpp
    loads it with TENSOR_SKIP); the trunk's logits are llama.cpp's."""
    from gguf import GGUFValueType
    p = rewrite_gguf(models["F32"], tmp_path / "nextn.gguf", drop=("glm4.block_count",),
                     extra_kv=[("glm4.block_count", 3, GGUFValueType.UINT32),
                               ("glm4.nextn_predict_layers", 1, GGUFValueType.UINT32)],
                     add={f"blk.2.{n}.weight": (np.ones(64, np.float32), None) for n in ("attn_norm", "ffn_norm")})
    cfg = load_config(open_gguf(str(p)))
    assert (cfg.n_layer, cfg.n_layer_nextn) == (2, 1)
    check_against_llama_cpp(p, reference["F32"], "F32", "cpu", N_CTX, 0, "glm4 nextn")


def test_multi_section_rope_is_refused(models, tmp_path):
    from gguf import GGUFValueType
    bad = rewrite_gguf(models["F32"], tmp_path / "bad.gguf",
                       extra_kv=[("glm4.rope.dimension_sections", [4, 2, 2, 0], GGUFValueType.ARRAY)])
    with pytest.raises(UnsupportedModelError, match="glm4's multi-section rope"):
        load_config(open_gguf(bad))
