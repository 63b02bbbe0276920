"""gemma4 with experts (Gemma 4 26B-A4B's layout) end to end against llama.cpp, on every backend.

A tiny synthetic model (``tools/synth.py``): 6 blocks (SWA, SWA, full, ...: heads of 32 on the sliding
layers, of 64 with one KV head and V = K on the full ones), every block with 7 experts of 64 (3 used)
beside its dense MLP of 96, fused gate/up experts (``ffn_gate_up_exps``, what llama.cpp's converter
writes), per-expert down scales and the router's input scale. Bounds: logits nmse <= 1e-5 (F32) and
<= 3e-3 (Q8_0), the greedy continuation equal wherever llama.cpp's top-2 margin is clear of the error.

A 40-token prompt (5 sliding windows of 8) in chunks of 7. The seed is one whose routing is clear:
llama.cpp's CPU GeGLU reads an f16 table (ggml-cpu vec.h ``GGML_GELU_FP16``) and its quantized matmuls
quantize the activations, so its residual stream differs from cooktop's numpy one by ~1e-4 (F32) to
~1e-2 (Q8_0) relative, and a token whose k-th and (k+1)-th router logits are closer than that may pick
another expert there (``test_routing_is_clear_of_ties`` checks the margin this seed leaves).
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
from cooktop.errors import CooktopError, UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.arch import ARCHITECTURES
from cooktop.model.config import load_config
from cooktop.runtime.placement import TensorPlacement
from cooktop.tools import synth

MOE = synth.Shape(n_embd=64, n_layer=6, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=256,
                  rope_freq_base=1e6, tied=True, head_dim=64, arch="gemma4", n_swa=8, swa_pattern=3,
                  rope_freq_base_swa=10000.0, head_dim_swa=32, n_head_kv_full=1, k_eq_v=True, rope_partial_full=0.25,
                  out_scales=True, final_logit_softcap=5.0, n_expert=7, n_expert_used=3, n_ff_exp=64)
SEED = 42
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 40)]
#: (file type, cooktop n_batch)
CASES = [("F32", 7), ("Q8_0", 7)]
N_CTX, N_GREEDY = 128, 6


def bound(ft: str) -> float:
    return 1e-5 if ft == "F32" else 3e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4moe")
    out = {}
    for ft, _ in CASES:
        out[ft] = d / f"gemma4-moe-{ft}.gguf"
        synth.write(out[ft], MOE, ft, seed=SEED)
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


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    return llama_cpp


def _reference(path) -> tuple[np.ndarray, list[int], list[float]]:
    llm = _llama_cpp().Llama(model_path=str(path), logits_all=True, n_ctx=N_CTX, n_batch=16, n_ubatch=16,
                             verbose=False)
    try:
        return _greedy(llm, PROMPT, N_GREEDY)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def reference(models):
    """llama.cpp's logits and greedy continuation per file type (computed once)."""
    return {ft: _reference(models[ft]) for ft, _ in CASES}


#: Vulkan runs F32 only: lavapipe takes a minute or more to build the quantized matmul pipelines (the
#: Vulkan op tests check those kernels).
RUNS = [pytest.param(fam, *case, id=f"{fam}-{case[0]}",
                     marks=[pytest.mark.slow(reason="lavapipe builds its Vulkan pipelines in 15-30 s")]
                     if fam == "vulkan" else [])
        for fam in registry.FAMILIES for case in CASES if fam != "vulkan" or case[0] == "F32"]


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


def _check(logits, tokens, ref, ft: str, what: str) -> None:
    ref_logits, ref_tokens, margins = ref
    err = nmse(logits, ref_logits)
    print(f"gemma4 MoE {what} {ft}: nmse {err:.3g} vs llama.cpp")
    assert err <= bound(ft)
    scale = float(np.abs(ref_logits).max())
    for got, want, margin in zip(tokens, ref_tokens, margins):
        if margin < 1e-2 * scale:  # not clear of the numerical error: the continuations may part here
            break
        assert got == want


@pytest.mark.parametrize("family,ft,n_batch", RUNS)
def test_logits_and_greedy_match_llama_cpp(family, models, reference, ft, n_batch):
    if family != "cpu":
        open_family_device(family)
    logits, tokens = _run(models[ft], family, n_batch)
    _check(logits, tokens, reference[ft], ft, f"on {family}")


def test_chunks_equal_token_by_token(models, reference):
    """The prompt in chunks of 7 gives what one token at a time gives (the routing of a row does not
    depend on the other rows of its batch), and both match llama.cpp."""
    one, _ = _run(models["F32"], "cpu", 1)
    chunks, _ = _run(models["F32"], "cpu", 7)
    assert nmse(chunks, one) <= 1e-7  # rounding of matmuls over 7 rows or 1, nothing more
    assert nmse(one, reference["F32"][0]) <= bound("F32")


def test_routing_is_clear_of_ties(models, monkeypatch):
    """Every (token, block) routing decision of the prompt leaves its k-th and (k+1)-th router logits
    apart by more than the residual stream's difference from llama.cpp (module doc)."""
    from cooktop.backends.cpu import moe as cpu_moe
    seen = []
    route = cpu_moe.route

    def spy(logits, *args, **kw):
        seen.append(np.array(logits))
        return route(logits, *args, **kw)

    monkeypatch.setattr(cpu_moe, "route", spy)
    _run(models["Q8_0"], "cpu", 40)
    assert len(seen) >= MOE.n_layer
    k = MOE.n_expert_used
    gaps = [float(np.min(np.diff(np.sort(r, axis=1)[:, -k - 1:-k + 1], axis=1)) / r.std()) for r in seen]
    assert min(gaps) > 5e-3, gaps


def test_split_gate_up_layout_gives_the_same_logits(models, reference, tmp_path):
    """The same experts as separate ``ffn_gate_exps`` / ``ffn_up_exps`` (the other layout llama.cpp loads):
    bit-identical logits in cooktop (the same weights uploaded), and llama.cpp's match them."""
    src = models["F32"]
    gf = open_gguf(src)
    split, drop = {}, []
    for il in range(MOE.n_layer):
        name = f"blk.{il}.ffn_gate_up_exps.weight"
        fused = np.asarray(gf.tensor(name).data).reshape(MOE.n_expert, 2 * MOE.n_ff_exp, MOE.n_embd)
        split[f"blk.{il}.ffn_gate_exps.weight"] = (np.ascontiguousarray(fused[:, :MOE.n_ff_exp]), None)
        split[f"blk.{il}.ffn_up_exps.weight"] = (np.ascontiguousarray(fused[:, MOE.n_ff_exp:]), None)
        drop.append(name)
    path = rewrite_gguf(src, tmp_path / "split.gguf", add=split, drop_tensors=drop)
    cfg = load_config(open_gguf(path))
    assert cfg.n_expert == MOE.n_expert
    got, _ = _run(path, "cpu", 7)
    want, _ = _run(src, "cpu", 7)
    assert np.array_equal(got, want)
    ref_logits = _reference(path)[0]
    assert nmse(ref_logits, reference["F32"][0]) <= 1e-10  # llama.cpp: the same model either way
    assert nmse(got, ref_logits) <= bound("F32")


def test_experts_on_the_host_with_n_cpu_moe(models, reference):
    """``--n-cpu-moe 2``: blocks 0-1 run their attention on OpenCL and their feed-forward half (the MLP,
    the experts, the output scalar) on the host; the logits are the all-OpenCL ones."""
    sel = open_family_device("opencl").info.selector
    whole, _ = _run(models["F32"], sel, 7)
    llm = Llama(model_path=str(models["F32"]), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False, device=sel,
                n_gpu_layers=-1, n_cpu_moe=2)
    try:
        p = llm._engine.placement
        assert p.blocks == [sel] * 6 and p.experts == ["cpu", "cpu"] + [sel] * 4
        logits, _, _ = _greedy(llm, PROMPT, N_GREEDY)
    finally:
        llm.close()
    assert nmse(logits, whole) <= 1e-6  # float32 rounding of numpy against OpenCL in two blocks
    assert nmse(logits, reference["F32"][0]) <= bound("F32")
    halves = plan_report(str(models["F32"]), N_CTX, 16, "opencl", -1, None,
                         tensors=TensorPlacement.parse(n_cpu_moe=2))
    assert halves["experts"][:2] == ["cpu", "cpu"]


# -- hyper-parameters, tensors, ops, info / plan -----------------------------------------
def test_hparams_tensors_and_ops(models):
    gf = open_gguf(models["Q8_0"])
    cfg = load_config(gf)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff) == (7, 3, 64, 96)
    assert (cfg.expert_gating, cfg.expert_weights_norm, cfg.expert_weights_scale) == ("softmax", True, 0.0)
    a = ARCHITECTURES["gemma4"]
    w = a.unit_tensors(gf.tensors, 2)
    assert w["ffn_gate_up_exps"][0] == "blk.2.ffn_gate_up_exps.weight"
    assert gf.tensors["blk.2.ffn_gate_up_exps.weight"].shape == (7, 128, 64)
    assert gf.tensors["blk.2.ffn_down_exps.scale"].shape == (7,)
    assert {"ffn_gate", "ffn_up", "ffn_down", "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2",
            "ffn_gate_inp.scale", "ffn_down_exps.scale"} <= set(w)
    ops = a.ops(cfg, 2, gf.tensors)
    assert {"moe_route", "matmul_id", "gelu_mul", "add_id", "mul", "moe_combine", "scale"} <= set(ops)
    # the dense gemma4 blocks still run no expert op
    dense = load_config(open_gguf(models["F32"]))
    assert "moe_route" not in ARCHITECTURES["gemma4"].ops(dataclasses.replace(dense, n_expert=0), 2)


def test_a_block_without_router_runs_dense(models, tmp_path):
    """llama.cpp's ``is_moe_layer``: a block without ``ffn_gate_inp`` (and its MoE tensors) is a dense
    block; one with a router but without the rest of the MoE branch is refused."""
    gf = open_gguf(models["F32"])
    moe_names = [n for n in gf.tensors if n.startswith("blk.1.") and any(
        k in n for k in ("ffn_gate_inp", "_exps", "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"))]
    path = rewrite_gguf(models["F32"], tmp_path / "mixed.gguf", drop_tensors=moe_names)
    gm = open_gguf(path)
    cfg = load_config(gm)
    a = ARCHITECTURES["gemma4"]
    assert "moe_route" not in a.ops(cfg, 1, gm.tensors) and "moe_route" in a.ops(cfg, 2, gm.tensors)
    assert model_info(str(path), N_CTX)["moe_layers"] == [0, 2, 3, 4, 5]
    logits, _ = _run(path, "cpu", 7)
    assert np.isfinite(logits).all()
    bad = rewrite_gguf(models["F32"], tmp_path / "bad.gguf", drop_tensors=["blk.3.pre_ffw_norm_2.weight"])
    with pytest.raises(UnsupportedModelError, match=r"missing tensor 'blk\.3\.pre_ffw_norm_2\.weight'"):
        load_config(open_gguf(bad))


def test_expert_keys_are_checked(models, tmp_path):
    from gguf import GGUFValueType
    bad = rewrite_gguf(models["F32"], tmp_path / "used.gguf", drop=("gemma4.expert_used_count",),
                       extra_kv=[("gemma4.expert_used_count", 9, GGUFValueType.UINT32)])
    with pytest.raises(UnsupportedModelError, match="expert_used_count = 9 exceeds"):
        load_config(open_gguf(bad))
    bad = rewrite_gguf(models["F32"], tmp_path / "ff.gguf", drop=("gemma4.expert_feed_forward_length",))
    with pytest.raises(UnsupportedModelError, match="expert_feed_forward_length"):
        load_config(open_gguf(bad))


def test_info_and_plan_show_the_experts(models, capsys):
    from click.testing import CliRunner

    from cooktop.cli.group import cli
    path = str(models["Q8_0"])
    info = model_info(path, N_CTX)
    assert info["moe_layers"] == list(range(6)) and info["config"]["n_expert"] == 7
    res = CliRunner().invoke(cli, ["info", path])
    assert res.exit_code == 0, res.output
    assert ("experts:        7, 3 used per token, 64 wide, beside the dense MLP (96 wide, a shared expert); "
            "gating softmax, weights renormalised; MoE layers: all 6 of 6") in res.output
    rep = plan_report(path, N_CTX, 16, "cpu", 0, None)
    assert rep["experts"] == ["cpu"] * 6 and rep["blocks"] == ["cpu"] * 6


def test_the_26b_a4b_preset_has_its_shapes(tmp_path):
    cfg = synth.config(synth.SHAPES["gemma-4-26b-a4b"])
    assert (cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == (
        30, 2816, 2112, 128, 8, 704)
    assert (cfg.layer(0).head_dim, cfg.layer(5).head_dim, cfg.layer(0).n_head_kv, cfg.layer(5).n_head_kv) == (
        256, 512, 8, 2)
    assert cfg.swa_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,) + (True,) * 5 + (False,) + (
        True,) * 5 + (False,) + (True,) * 5 + (False,)
    # 2112 and 704: multiples of 32, not of 256
    synth.validate(dataclasses.replace(synth.SHAPES["gemma-4-26b-a4b"], n_layer=2), "Q8_0")
    with pytest.raises(CooktopError, match="n_expert_used"):
        synth.validate(dataclasses.replace(synth.SHAPES["gemma-4-26b-a4b"], n_expert_used=129), "Q8_0")
