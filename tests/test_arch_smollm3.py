"""smollm3 (SmolLM3: llama with every fourth block NoPE) end to end against llama.cpp (llama-cpp-python
at test time) on numpy, OpenCL and Vulkan.

Tiny synthetic models in the smollm3-3b preset's structure (4 blocks, so block 3 is a NoPE block;
GQA 4/2; tied embeddings): F32 and Q8_0 64 wide, Q4_K 256 wide (K-quant rows are 256 wide). The
prompt runs in chunks of 7 (llama.cpp: 16). Vulkan runs F32 with the greedy continuation and Q8_0's
prompt logits (lavapipe compiles every pipeline cold, and the 8-bit mat-vec's are the slow ones).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import open_family_device, rewrite_gguf
from densefamily import PROMPT, bound, check_against_llama_cpp, llama_cpp_reference, write_models
from pathsutil import eval_three_ways

from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.engine import generate as G
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.arch import ARCHITECTURES, smollm3
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = dataclasses.replace(synth.SHAPES["smollm3-3b"], n_embd=64, n_layer=4, n_head=4, n_head_kv=2, n_ff=96,
                            n_vocab=300, n_ctx_train=256)
WIDE = dataclasses.replace(SMALL, n_embd=256, n_ff=512)
CASES = {"F32": (SMALL, "F32"), "Q8_0": (SMALL, "Q8_0"), "Q4_K": (WIDE, "Q4_K")}
N_CTX = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return write_models(tmp_path_factory.mktemp("smollm3"), "smollm3", CASES)


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
    check_against_llama_cpp(models[case], reference[case], ft, family, N_CTX, n_greedy, "smollm3")


def test_the_nope_blocks_matter(models, reference, monkeypatch):
    """Every fourth block rotates nothing (llama.cpp ``n_no_rope_layer_step = 4``); rotating it too
    runs far from llama.cpp's logits, so the match above checks the NoPE block."""
    assert [smollm3.uses_rope(il) for il in range(8)] == [True, True, True, False] * 2
    monkeypatch.setattr(smollm3, "uses_rope", lambda il: True)
    from cooktop import Llama
    llm = Llama(model_path=str(models["F32"]), n_ctx=N_CTX, logits_all=True, verbose=False, device="cpu")
    try:
        llm.eval(PROMPT)
        got = np.array(llm.scores[:len(PROMPT)], dtype=np.float64)
    finally:
        llm.close()
    assert nmse(got, reference["F32"][0]) > 100 * bound("F32")


def test_one_batch_token_by_token_and_cached_prefix_agree(models):
    eng = G.load(str(models["F32"]), n_ctx=N_CTX, n_batch=32, device="cpu", logits_all=True)
    try:
        batch, one, rest = eval_three_ways(eng, PROMPT, 9)
    finally:
        eng.close()
    assert nmse(one, batch) <= 1e-10 and nmse(rest, batch[9:]) <= 1e-10


def test_descriptor_and_config(models):
    cfg = load_config(open_gguf(str(models["F32"])))
    assert (cfg.arch, cfg.rope_mode, cfg.n_rot, cfg.head_dim, cfg.tied_output) == ("smollm3", 0, 16, 16, True)
    names = [s.name for s in ARCHITECTURES["smollm3"].tensors]
    assert names == ["token_embd.weight", "output_norm.weight", "output.weight", "blk.{i}.attn_norm.weight",
                     "blk.{i}.attn_q.weight", "blk.{i}.attn_k.weight", "blk.{i}.attn_v.weight",
                     "blk.{i}.attn_output.weight", "blk.{i}.ffn_norm.weight", "blk.{i}.ffn_gate.weight",
                     "blk.{i}.ffn_up.weight", "blk.{i}.ffn_down.weight"]


def test_partial_rotary_is_refused(models, tmp_path):
    from gguf import GGUFValueType
    bad = rewrite_gguf(models["F32"], tmp_path / "bad.gguf", drop=("smollm3.rope.dimension_count",),
                       extra_kv=[("smollm3.rope.dimension_count", 8, GGUFValueType.UINT32)])
    with pytest.raises(UnsupportedModelError, match="smollm3.rope.dimension_count = 8 differs from head_dim 16"):
        load_config(open_gguf(bad))
