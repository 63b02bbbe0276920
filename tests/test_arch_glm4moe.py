"""glm4moe (GLM-4.5 / GLM-4.5-Air / GLM-4.6) end to end against llama.cpp (llama-cpp-python at test
time) on numpy, OpenCL and Vulkan.

Tiny synthetic models in the glm-4.5-air preset's structure: Q/K/V biases, partial rotary (NeoX rope of
16 of each head's 32 dimensions), GQA 4/2 with n_head * head_dim = 128 != n_embd 64, block 0 dense
(``leading_dense_block_count`` 1, FFN 96), blocks 1-2 of 8 experts 32 wide with 3 used: sigmoid router,
the ``exp_probs_b`` selection bias (N(0, 0.1): it changes choices), weights renormalised and scaled by
2.5 (``expert_weights_scale``), and one ungated shared expert. F32 with per-head Q/K norms (GLM-4.5
355B), Q8_0 without (the Air). Vulkan runs F32 with the greedy continuation and Q8_0's prompt logits.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from conftest import open_family_device, rewrite_gguf
from densefamily import PROMPT, SCALES, bound, check_against_llama_cpp, greedy, llama_cpp_reference, write_models
from pathsutil import eval_three_ways

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.engine import generate as G
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.arch import ARCHITECTURES
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = dataclasses.replace(synth.SHAPES["glm-4.5-air"], n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=32,
                            n_rot=16, n_ff=96, n_vocab=300, n_ctx_train=256, n_expert=8, n_expert_used=3,
                            n_ff_exp=32, expert_weights_scale=2.5, qk_norm=True)
CASES = {"F32": (SMALL, "F32"), "Q8_0": (dataclasses.replace(SMALL, qk_norm=False), "Q8_0")}
N_CTX = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("glm4moe")
    out = write_models(d, "glm4moe", CASES)
    # the same trunk (the MTP block's tensors are drawn after it) with one nextn block written after it
    out["nextn"] = d / "glm4moe-nextn.gguf"
    synth.write(out["nextn"], dataclasses.replace(SMALL, n_nextn=1), "F32", seed=3, scales=SCALES)
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
    n_greedy = 0 if family == "vulkan" and ft != "F32" else 4
    check_against_llama_cpp(models[case], reference[case], ft, family, N_CTX, n_greedy, "glm4moe")


def test_selection_bias_matters(models, reference, tmp_path):
    """Without ``exp_probs_b`` (zeros) the logits are far from llama.cpp's (about 1e-3 against the
    model's own 1e-7): the bias changes the choice."""
    f = open_gguf(str(models["F32"]))
    zeros = {n: (np.zeros(t.shape, np.float32), None) for n, t in f.tensors.items() if n.endswith("exp_probs_b.bias")}
    assert len(zeros) == 2
    p = rewrite_gguf(models["F32"], tmp_path / "nobias.gguf", replace=zeros)
    llm = Llama(model_path=str(p), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False, device="cpu")
    try:
        logits, _, _ = greedy(llm, PROMPT, 0)
    finally:
        llm.close()
    assert nmse(logits, reference["F32"][0]) > 20 * bound("F32")


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
        "glm4moe", 2, 32, 16, 3, 0)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff_shexp, cfg.n_layer_dense_lead) == (8, 3, 32, 32, 1)
    assert (cfg.expert_gating, cfg.expert_weights_norm, cfg.expert_weights_scale) == ("sigmoid", True, 2.5)
    a = ARCHITECTURES["glm4moe"]
    present = open_gguf(str(models["F32"])).tensors
    dense, moe = a.unit_tensors(present, 0), a.unit_tensors(present, 1)
    assert {"ffn_gate", "ffn_up", "ffn_down"} <= set(dense) and "ffn_gate_inp" not in dense
    assert {"ffn_gate_inp", "exp_probs_b.bias", "ffn_up_exps", "ffn_up_shexp", "attn_q_norm"} <= set(moe)
    assert "ffn_gate" not in moe and "ffn_gate_inp_shexp" not in moe
    assert "moe_route" not in a.ops(cfg, 0, present) and "moe_route" in a.ops(cfg, 1, present)
    assert "attn_q_norm" not in a.unit_tensors(open_gguf(str(models["Q8_0"])).tensors, 1)


def test_nextn_block_loads_and_is_skipped(models, reference):
    """``nextn_predict_layers`` 1: block 3 is GLM-4.5's multi-token-prediction block (a MoE block with
    ``nextn.eh_proj``, ``enorm``, ``hnorm``), loaded by both and run by neither's main pass: the trunk's
    logits are the F32 model's, in llama.cpp and in cooktop; ``info`` says it is skipped."""
    f = open_gguf(str(models["nextn"]))
    assert "blk.3.nextn.eh_proj.weight" in f.tensors and "blk.3.ffn_up_exps.weight" in f.tensors
    cfg = load_config(f)
    assert (cfg.n_layer, cfg.n_layer_nextn) == (3, 1)
    assert nmse(reference["nextn"][0], reference["F32"][0]) <= 1e-12
    check_against_llama_cpp(models["nextn"], reference["F32"], "F32", "cpu", N_CTX, 0, "glm4moe nextn")
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "info", str(models["nextn"])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "not run by cooktop" in r.stdout
    assert ("experts:        8, 3 used per token, 32 wide, shared expert 32 wide; gating sigmoid, selection bias, "
            "weights renormalised, weights x 2.5; layers 0-0 dense (FFN 96)") in r.stdout
    from cooktop.cli.plan import plan_report
    assert plan_report(str(models["nextn"]), N_CTX, 32, "cpu", -1, None)["mtp"] is None


def test_experts_on_the_host_attention_on_opencl(models, reference):
    """``--cpu-moe``: every block's feed-forward half (block 0's dense FFN included: ``-ot exps`` matches
    only the experts, ``cpu_moe`` the halves) on numpy, the attention halves and the head on OpenCL;
    llama.cpp's logits still."""
    sel = open_family_device("opencl").info.selector
    llm = Llama(model_path=str(models["F32"]), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False, device=sel,
                n_gpu_layers=-1, cpu_moe=True)
    try:
        assert llm._engine.placement.experts == ["cpu"] * 3
        logits, _, _ = greedy(llm, PROMPT, 0)
    finally:
        llm.close()
    assert nmse(logits, reference["F32"][0]) <= bound("F32")


def test_synth_knobs_write_a_leading_dense_block_and_a_shared_expert(tmp_path):
    from click.testing import CliRunner

    from cooktop.cli.main import _register, cli
    _register()
    out = tmp_path / "t.gguf"
    r = CliRunner().invoke(cli, ["synth", "--arch", "glm4moe", "--n-embd", "64", "--n-layer", "3", "--n-head", "4",
                                 "--n-ff", "96", "--n-vocab", "300", "--n-expert", "4", "--n-expert-used", "2",
                                 "--n-ff-exp", "32", "--n-expert-shared", "2", "--n-dense-lead", "2", "--type", "F32",
                                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    f = open_gguf(str(out))
    cfg = load_config(f)
    assert (cfg.n_layer_dense_lead, cfg.n_ff_shexp, cfg.expert_gating) == (2, 64, "sigmoid")
    assert "blk.1.ffn_gate.weight" in f.tensors and "blk.1.ffn_gate_inp.weight" not in f.tensors
    assert tuple(f.tensors["blk.2.ffn_up_shexp.weight"].shape) == (64, 64)
    r = CliRunner().invoke(cli, ["synth", "--shape", "glm-4.5-air", "--n-layer", "2", "--n-dense-lead", "3",
                                 "-o", str(tmp_path / "bad.gguf")])
    assert r.exit_code != 0 and "n_dense_lead = 3 must be in 0..n_layer (2)" in f"{r.output} {r.exception}"


@pytest.mark.parametrize("key,value,match", [
    ("glm4moe.rope.dimension_sections", [4, 2, 2, 0], "multi-section rope"),
    ("glm4moe.expert_gating_func", 4, "expert gating"),
    ("glm4moe.leading_dense_block_count", 5, "exceeds the 3 trunk blocks"),
])
def test_refusals(models, tmp_path, key, value, match):
    from gguf import GGUFValueType
    vtype = GGUFValueType.ARRAY if isinstance(value, list) else GGUFValueType.UINT32
    bad = rewrite_gguf(models["F32"], tmp_path / "bad.gguf", drop=(key,), extra_kv=[(key, value, vtype)])
    with pytest.raises(UnsupportedModelError, match=match):
        load_config(open_gguf(bad))
