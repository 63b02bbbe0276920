"""mistral3 (Mistral Small 3.x / Ministral 3 / Devstral Small 2 text models) end to end against llama.cpp
(llama-cpp-python at test time) on numpy, OpenCL and Vulkan.

Tiny synthetic models in the ministral-3-3b preset's structure: YaRN x16 from an original context of
8 with ``rope.scaling.yarn_log_multiplier`` 1 (llama.cpp's attention factor then cancels ggml's
``1 + 0.1 ln f``), the attention temperature (beta 0.1: the 21 prompt positions cross three of its
steps of 8), head_dim 32 with 4 heads (n_head * head_dim = 128 != n_embd 64), GQA 4/2, tied
embeddings, and the optional Q/K/V and output biases. F32 and Q8_0 64 wide, Q4_K 256 wide. Vulkan runs
F32 with the greedy continuation and Q8_0's prompt logits (lavapipe's cold pipeline builds).
"""

from __future__ import annotations

import dataclasses
import math

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
from cooktop.model.arch.mistral3 import attn_temperature
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = dataclasses.replace(synth.SHAPES["ministral-3-3b"], n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                            head_dim=32, n_ff=96, n_vocab=300, n_ctx_train=1024, n_ctx_orig=8)
WIDE = dataclasses.replace(SMALL, n_embd=256, head_dim=64, n_ff=512)
CASES = {"F32": (SMALL, "F32"), "Q8_0": (SMALL, "Q8_0"), "Q4_K": (WIDE, "Q4_K")}
N_CTX = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mistral3")
    out = write_models(d, "mistral3", CASES)
    # the same F32 model without the log multiplier: llama.cpp's own numbers differ (test below)
    out["plain"] = d / "mistral3-plain.gguf"
    synth.write(out["plain"], dataclasses.replace(SMALL, yarn_log_mul=None), "F32", seed=3, scales=SCALES)
    # and without the attention temperature
    out["notemp"] = d / "mistral3-notemp.gguf"
    synth.write(out["notemp"], dataclasses.replace(SMALL, attn_temp_scale=None), "F32", seed=3, scales=SCALES)
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
    check_against_llama_cpp(models[case], reference[case], ft, family, N_CTX, n_greedy, "mistral3")


def test_the_yarn_log_multiplier_matters_and_matches(models, reference):
    """Without ``yarn_log_multiplier`` llama.cpp's YaRN attention factor is mscale(16) (ggml's own), with
    it 1: the two files' logits differ in llama.cpp, and cooktop matches the plain one too."""
    assert nmse(reference["plain"][0], reference["F32"][0]) > 100 * bound("F32")
    check_against_llama_cpp(models["plain"], reference["plain"], "F32", "cpu", N_CTX, 0, "mistral3 plain")


def test_hparams(models):
    cfg = load_config(open_gguf(str(models["F32"])))
    assert (cfg.arch, cfg.rope_mode, cfg.head_dim, cfg.n_rot, cfg.n_embd_q) == ("mistral3", 0, 32, 32, 128)
    assert (cfg.rope_scaling_type, cfg.rope_ext_factor, cfg.n_ctx_orig_yarn, cfg.attn_temp_scale) == (
        "yarn", 1.0, 8, pytest.approx(0.1))
    assert cfg.rope_attn_factor == pytest.approx(1 / (1 + 0.1 * math.log(16)))
    plain = load_config(open_gguf(str(models["plain"])))
    assert plain.rope_attn_factor == pytest.approx(1.0)
    keys = {s.key for s in ARCHITECTURES["mistral3"].tensors}
    assert {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "rope_freqs"} <= keys


def test_the_attention_temperature_matters_and_matches(models, reference):
    """The queries' factor 1 + 0.1 ln(1 + floor(p / 8)) (positions 8-20 of the prompt): without it
    llama.cpp's own logits differ, and cooktop matches the file without it too."""
    cfg = load_config(open_gguf(str(models["F32"])))
    got = attn_temperature(cfg, np.array([0, 7, 8, 15, 16, 20], np.int32))
    want = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(3)]
    np.testing.assert_allclose(got, want, rtol=1e-7)
    assert got.dtype == np.float32
    assert nmse(reference["notemp"][0], reference["F32"][0]) > 50 * bound("F32")  # 9e-4
    check_against_llama_cpp(models["notemp"], reference["notemp"], "F32", "cpu", N_CTX, 0, "mistral3 no temperature")
    assert "mul" in ARCHITECTURES["mistral3"].ops(cfg, 0)
    assert "mul" not in ARCHITECTURES["mistral3"].ops(load_config(open_gguf(str(models["notemp"]))), 0)


def test_one_batch_token_by_token_and_cached_prefix_agree(models):
    eng = G.load(str(models["F32"]), n_ctx=N_CTX, n_batch=32, device="cpu", logits_all=True)
    try:
        batch, one, rest = eval_three_ways(eng, PROMPT, 9)
    finally:
        eng.close()
    assert nmse(one, batch) <= 1e-10 and nmse(rest, batch[9:]) <= 1e-10


@pytest.mark.parametrize("kv,message", [
    (("mistral3.expert_count", 4, "UINT32"), "mistral3.expert_count = 4: mistral3's mixture-of-experts branch"),
    (("mistral3.rope.dimension_count", 16, "UINT32"), "mistral3.rope.dimension_count = 16 differs from head_dim"),
])
def test_refusals(models, tmp_path, kv, message):
    from gguf import GGUFValueType
    key, value, kind = kv
    bad = rewrite_gguf(models["F32"], tmp_path / "bad.gguf", drop=(key,),
                       extra_kv=[(key, value, getattr(GGUFValueType, kind))])
    with pytest.raises(UnsupportedModelError, match=message):
        load_config(open_gguf(bad))
