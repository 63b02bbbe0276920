"""glm4moe (GLM-4.5 / GLM-4.5-Air / GLM-4.6) end to end against llama.cpp (llama-cpp-python at test
time) on numpy, OpenCL and Vulkan.

Tiny synthetic models in the glm-4.5-air preset's structure: Q/K/V biases, partial rotary (NeoX rope of
16 of each head's 32 dimensions), GQA 4/2 with n_head * head_dim = 128 != n_embd 64, block 0 dense
(``leading_dense_block_count`` 1, FFN 96), blocks 1-2 of 8 experts 32 wide with 3 used: sigmoid router,
the ``exp_probs_b`` selection bias (N(0, 0.1): it changes choices), weights renormalised and scaled by
2.5 (``expert_weights_scale``), and one ungated shared expert. F32 with per-head Q/K norms (GLM-4.5
355B), Q8_0 without (the Air). Vulkan runs F32 with the greedy continuation and Q8_0's prompt logits.
A copy with GLM-4.5's MTP block (``nextn_predict_layers`` 1): skipped by the trunk in both, its logits as
the draft model against a numpy reference (llama-cpp-python exports no MTP API), ``draft-mtp`` output
equal to the plain output.
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


def test_nextn_block_loads_and_is_skipped_by_the_trunk(models, reference):
    """``nextn_predict_layers`` 1: block 3 is GLM-4.5's multi-token-prediction block (a MoE block with
    ``nextn.eh_proj``, ``enorm``, ``hnorm``), loaded by both and not run by either's main pass: the trunk's
    logits are the F32 model's, in llama.cpp and in cooktop; ``info`` and ``plan`` count it for draft-mtp."""
    f = open_gguf(str(models["nextn"]))
    assert "blk.3.nextn.eh_proj.weight" in f.tensors and "blk.3.ffn_up_exps.weight" in f.tensors
    cfg = load_config(f)
    assert (cfg.n_layer, cfg.n_layer_nextn) == (3, 1)
    assert nmse(reference["nextn"][0], reference["F32"][0]) <= 1e-12
    check_against_llama_cpp(models["nextn"], reference["F32"], "F32", "cpu", N_CTX, 0, "glm4moe nextn")
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "info", str(models["nextn"])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "MTP block:      blk.3 (nextn_predict_layers 1)" in r.stdout and "(--spec-type draft-mtp)" in r.stdout
    assert ("experts:        8, 3 used per token, 32 wide, shared expert 32 wide; gating sigmoid, selection bias, "
            "weights renormalised, weights x 2.5; layers 0-0 dense (FFN 96)") in r.stdout
    from cooktop.cli.plan import plan_report
    want = sum(t.n_bytes for n, t in f.tensors.items() if n.startswith("blk.3."))
    assert plan_report(str(models["nextn"]), N_CTX, 32, "cpu", -1, None)["mtp"]["weight_bytes"] == want


def reference_mtp(W, h, toks):
    """Logits float64 [n, n_vocab] and h_mtp [n, n_embd] of GLM-4.5's MTP block for the pairs (h[i], toks[i])
    at positions 0..n-1, in numpy from the file's weights (llama.cpp src/models/glm4-moe.cpp ``graph_mtp``:
    enorm / hnorm, eh_proj, the MoE block, the trunk's output norm and head)."""
    from test_spec_mtp import _rms, _rope_neox
    s, il = SMALL, SMALL.n_layer
    g = lambda k: W[f"blk.{il}.{k}"]  # noqa: E731
    n, D, H, Hk = len(toks), s.head_dim, s.n_head, s.n_head_kv
    e = W["token_embd.weight"][toks]
    x = np.concatenate([_rms(e, g("nextn.enorm.weight")), _rms(h, g("nextn.hnorm.weight"))], -1) @ g(
        "nextn.eh_proj.weight").T
    xn = _rms(x, g("attn_norm.weight"))
    q, k, v = ((xn @ g(f"attn_{t}.weight").T + g(f"attn_{t}.bias")).reshape(n, -1, D) for t in "qkv")
    pos = np.arange(n, dtype=np.float64)
    q = _rope_neox(_rms(q, g("attn_q_norm.weight")), pos, s.n_rot, s.rope_freq_base)
    k = _rope_neox(_rms(k, g("attn_k_norm.weight")), pos, s.n_rot, s.rope_freq_base)
    att = np.zeros((n, H, D))
    mask = np.tril(np.ones((n, n), dtype=bool))
    for hh in range(H):
        kv = hh // (H // Hk)
        sc = np.where(mask, q[:, hh] @ k[:, kv].T / np.sqrt(D), -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        att[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
    x = x + att.reshape(n, H * D) @ g("attn_output.weight").T
    xn = _rms(x, g("post_attention_norm.weight"))

    def swiglu(gate, up, down):
        a, b = xn @ gate.T, xn @ up.T
        return (a / (1 + np.exp(-a)) * b) @ down.T

    prob = 1 / (1 + np.exp(-(xn @ g("ffn_gate_inp.weight").T)))
    sel = np.argsort(-(prob + g("exp_probs_b.bias")), axis=1)[:, :s.n_expert_used]
    wts = np.take_along_axis(prob, sel, 1)
    wts = wts / wts.sum(1, keepdims=True) * s.expert_weights_scale
    out = swiglu(g("ffn_gate_shexp.weight"), g("ffn_up_shexp.weight"), g("ffn_down_shexp.weight"))
    for i in range(n):
        for j, ex in enumerate(sel[i]):
            a, b = xn[i] @ g("ffn_gate_exps.weight")[ex].T, xn[i] @ g("ffn_up_exps.weight")[ex].T
            out[i] += wts[i, j] * ((a / (1 + np.exp(-a)) * b) @ g("ffn_down_exps.weight")[ex].T)
    hm = _rms(x + out, W["output_norm.weight"])
    return hm @ W["output.weight"].T, hm


def test_mtp_block_logits_match_a_numpy_reference(models):
    """The MTP block as the draft model (``model/mtp.py``): its logits for the pairs (h_{p-1}, x_p) are the
    numpy reference's; a pair after a cached prefix gives the same last row."""
    from test_spec_mtp import PROMPT as P24
    from test_spec_mtp import _weights

    from cooktop.model.mtp import MTPModel
    eng = G.load(str(models["nextn"]), n_ctx=96, n_batch=32, device="cpu")
    try:
        mtp = MTPModel(eng.model)
        eng.model.record_hidden = True
        eng.seq.eval(P24)
        h = eng.seq.cache.hidden.get(0, 0, len(P24)).copy()
        hin = np.concatenate([np.zeros((1, SMALL.n_embd), np.float32), h[:-1]])
        cache = mtp.new_cache()
        got = mtp.forward_h(P24, hin, 0, cache, logits_all=True)
        want, hm = reference_mtp(_weights(models["nextn"]), hin.astype(np.float64), np.array(P24))
        err = nmse(got, want)
        print(f"glm4moe MTP logits nmse vs numpy reference: {err:.3e}")
        assert err <= 1e-5 and nmse(cache.hidden.get(0, 0, len(P24)), hm) <= 1e-5
        cache2 = mtp.new_cache()
        mtp.forward_h(P24[:-1], hin[:-1], 0, cache2)
        assert nmse(mtp.forward_h(P24[-1:], hin[-1:], len(P24) - 1, cache2), want[-1:]) <= 1e-5
        mtp.close()
    finally:
        eng.close()


@pytest.mark.parametrize("fam", ["cpu", "opencl"])
def test_draft_mtp_output_is_the_non_speculative_one(models, fam):
    """``--spec-type draft-mtp`` with GLM-4.5's MTP block: the output (greedy, seeded sampling) is the one
    without it, drafts made."""
    from test_spec_mtp import GREEDY, SAMPLED
    from test_spec_mtp import PROMPT as P24

    from cooktop.engine.spec_config import SpecOptions
    sel = "cpu" if fam == "cpu" else open_family_device(fam).info.selector
    eng = G.load(str(models["nextn"]), n_ctx=96, n_batch=32, device=sel, n_gpu_layers=-1)
    try:
        spec, mtp = SpecOptions(spec_type=("draft-mtp",), draft_max=3).build(eng, sel, -1)
        try:
            for params in (GREEDY, SAMPLED):
                plain = eng.generate(P24, 16, params, seq=eng.new_sequence()).drain()
                got = eng.generate(P24, 16, params, seq=eng.new_sequence(), draft=spec).drain()
                assert got.tokens == plain.tokens
                assert got.timings.n_drafted and 0 <= got.timings.n_accepted <= got.timings.n_drafted
        finally:
            mtp.close()
    finally:
        eng.close()


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
