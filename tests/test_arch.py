"""The architecture seam (``cooktop.model.arch``): the registry, the llama descriptor, and
optional tensors: present -> validated, placed, budgeted, uploaded and used; absent -> their
op is skipped.

The optional-tensor tests register a variant of llama with one optional norm per block
(``blk.{i}.attn_post_norm.weight``, applied to the attention output before the residual
add, as Gemma's post-attention norm) in place of ``llama``, and run it on numpy.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import rewrite_gguf

from cooktop import Llama
from cooktop.backends.base import OPS
from cooktop.backends.optable import MOE_OPS, RECURRENT_OPS
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model import arch as arch_pkg
from cooktop.model.arch import ARCHITECTURES, architecture, builders
from cooktop.model.arch.base import BLOCK, HEAD, INPUT, MATRIX, NORM, norm
from cooktop.model.arch.descriptor import OpRecorder
from cooktop.model.arch.llama import LLAMA
from cooktop.model.config import load_config
from cooktop.runtime.budget import weight_bytes
from cooktop.runtime.placement import plan, unit_types
from cooktop.tools import synth

SMALL = synth.Shape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=64, n_vocab=260, n_ctx_train=64)
TOKENS = [1, 70, 80, 90, 100, 110, 120]


def test_registry_and_unknown_architecture_lists_the_supported_ones():
    assert ARCHITECTURES["llama"] is LLAMA and architecture("llama") is LLAMA
    with pytest.raises(UnsupportedModelError) as e:
        architecture("gpt2", "m.gguf")
    assert str(e.value) == (f"m.gguf: unsupported architecture 'gpt2'; cooktop runs {', '.join(sorted(ARCHITECTURES))} "
                            f"(general.architecture)")
    assert {"gemma3", "llama", "phi3", "qwen2", "qwen3"} <= set(ARCHITECTURES)


def test_synth_unknown_arch_is_refused(tmp_path):
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'mamba'"):
        synth.write(tmp_path / "x.gguf", SMALL, "F32", arch="mamba")
    assert not list(tmp_path.iterdir())


def test_llama_descriptor_matches_llama_cpp():
    """Tensor names, units, kinds and shapes of llama.cpp's LLM_ARCH_LLAMA (dense), numpy order."""
    cfg = synth.config(SMALL)
    got = {s.name: (s.unit, s.kind, s.required, s.shape(cfg)) for s in LLAMA.tensors}
    E, Q, K, F, V = 64, 64, 32, 64, 260
    assert got == {
        "token_embd.weight": (INPUT, MATRIX, True, (V, E)),
        "output_norm.weight": (HEAD, NORM, True, (E,)),
        "output.weight": (HEAD, MATRIX, False, (V, E)),
        "blk.{i}.attn_norm.weight": (BLOCK, NORM, True, (E,)),
        "blk.{i}.attn_q.weight": (BLOCK, MATRIX, True, (Q, E)),
        "blk.{i}.attn_k.weight": (BLOCK, MATRIX, True, (K, E)),
        "blk.{i}.attn_v.weight": (BLOCK, MATRIX, True, (K, E)),
        "blk.{i}.attn_output.weight": (BLOCK, MATRIX, True, (E, Q)),
        "blk.{i}.ffn_norm.weight": (BLOCK, NORM, True, (E,)),
        "blk.{i}.ffn_gate.weight": (BLOCK, MATRIX, True, (F, E)),
        "blk.{i}.ffn_up.weight": (BLOCK, MATRIX, True, (F, E)),
        "blk.{i}.ffn_down.weight": (BLOCK, MATRIX, True, (E, F)),
        "rope_freqs.weight": (BLOCK, NORM, False, (8,)),  # n_rot / 2, one tensor for every block
    }
    assert LLAMA.rope_mode == 0 and cfg.rope_mode == 0
    assert LLAMA.spec("blk.7.ffn_up.weight").key == "ffn_up" and LLAMA.spec("blk.7.ffn_up.bias") is None


@pytest.mark.parametrize("tied", [False, True])
def test_unit_tensors_resolve_tied_output(tmp_path, tied):
    p = tmp_path / "m.gguf"
    synth.write(p, dataclasses.replace(SMALL, tied=tied), "Q8_0")
    gf = open_gguf(p)
    head = LLAMA.unit_tensors(gf.tensors, HEAD)
    assert head["output"][0] == ("token_embd.weight" if tied else "output.weight")
    assert head["output_norm"][0] == "output_norm.weight"
    assert sorted(LLAMA.unit_tensors(gf.tensors, 1)) == sorted(
        ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"])
    assert load_config(gf).tied_output == tied


#: The ops each architecture's block and head call with every tensor it declares (head: the
#: segment's output-row pick, get_rows, first).
EXPECTED_OPS = {
    "llama": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"},
              {"get_rows", "rmsnorm", "matmul"}),
    "qwen2": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention", "add", "silu_mul"},
              {"get_rows", "rmsnorm", "matmul", "add_bias"}),
    "qwen3": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"},
              {"get_rows", "rmsnorm", "matmul"}),
    "gemma3": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "gelu_mul"},
               {"get_rows", "rmsnorm", "matmul"}),
    "phi3": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"},
             {"get_rows", "rmsnorm", "matmul"}),
    # gemma4's V norm without a weight is l2_norm then scale (SMALL: no per-layer inputs, no shared KV)
    "gemma4": ({"rmsnorm", "matmul", "rope", "kv_store", "l2_norm", "scale", "attention", "add", "gelu_mul"},
               {"get_rows", "rmsnorm", "matmul"}),
    "qwen3moe": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "moe_route", "matmul_id",
                  "silu_mul", "moe_combine"}, {"get_rows", "rmsnorm", "matmul"}),
    "qwen2moe": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention", "add", "moe_route", "matmul_id",
                  "silu_mul", "moe_combine"}, {"get_rows", "rmsnorm", "matmul"}),
    "olmoe": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "moe_route", "matmul_id",
               "silu_mul", "moe_combine"}, {"get_rows", "rmsnorm", "matmul"}),
    "gpt-oss": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention_sinks", "add", "moe_route",
                 "matmul_id", "add_id", "swiglu_oai", "moe_combine"}, {"get_rows", "rmsnorm", "matmul"}),
    # SMALL has no recurrent blocks (n_conv 0): its lfm2 blocks are attention blocks
    "lfm2": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"},
             {"get_rows", "rmsnorm", "matmul"}),
    # likewise qwen35's (no full_attention_interval): gated attention blocks
    "qwen35": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "sigmoid_mul", "silu_mul"},
               {"get_rows", "rmsnorm", "matmul"}),
    "qwen35moe": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "sigmoid_mul", "moe_route",
                   "matmul_id", "silu_mul", "moe_combine"}, {"get_rows", "rmsnorm", "matmul"}),
    "qwen3next": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "sigmoid_mul", "moe_route",
                   "matmul_id", "silu_mul", "moe_combine"}, {"get_rows", "rmsnorm", "matmul"}),
    # likewise granitehybrid's (no recurrent blocks, no multipliers): attention blocks with rope
    "granitehybrid": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "add_bias", "silu_mul"},
                      {"get_rows", "rmsnorm", "matmul"}),
    "smollm3": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"},
                {"get_rows", "rmsnorm", "matmul"}),
    "mistral3": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention", "add", "silu_mul"},
                 {"get_rows", "rmsnorm", "matmul"}),
    "glm4": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention", "add", "silu_mul"},
             {"get_rows", "rmsnorm", "matmul"}),
    # SMALL has no leading dense block: both blocks are MoE blocks (the selection bias is moe_route's)
    "glm4moe": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention", "add", "moe_route", "matmul_id",
                 "silu_mul", "moe_combine"}, {"get_rows", "rmsnorm", "matmul"}),
    # every mamba2 block is a Mamba-2 layer
    "mamba2": ({"rmsnorm", "matmul", "ssm_conv", "add_bias", "silu", "ssm_scan", "ssm_norm", "add"},
               {"get_rows", "rmsnorm", "matmul"}),
}

#: Of the MoE architectures, the ops of the attention half and of the feed-forward half.
EXPECTED_HALF_OPS = {
    "qwen3moe": ({"rmsnorm", "matmul", "rope", "kv_store", "attention", "add"},
                 {"rmsnorm", "matmul", "moe_route", "matmul_id", "silu_mul", "moe_combine", "add"}),
    "qwen2moe": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention", "add"},
                 {"rmsnorm", "matmul", "moe_route", "matmul_id", "silu_mul", "moe_combine", "add"}),
    "gpt-oss": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention_sinks", "add"},
                {"rmsnorm", "matmul", "add_bias", "moe_route", "matmul_id", "add_id", "swiglu_oai", "moe_combine",
                 "add"}),
    "glm4moe": ({"rmsnorm", "matmul", "add_bias", "rope", "kv_store", "attention", "add"},
                {"rmsnorm", "matmul", "moe_route", "matmul_id", "silu_mul", "moe_combine", "add"}),
}


def test_every_architecture_has_its_expected_ops():
    assert set(EXPECTED_OPS) == set(ARCHITECTURES)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_ops_are_derived_from_what_block_and_head_call(name):
    """Architecture.ops runs the unit's code on a recording stand-in: every declared tensor present."""
    a = ARCHITECTURES[name]
    cfg = synth.config(SMALL, name)
    block_ops, head_ops = EXPECTED_OPS[name]
    assert set(a.ops(cfg, 0)) == set(a.ops(cfg, 1)) == block_ops
    assert set(a.ops(cfg, HEAD)) == head_ops
    assert a.ops(cfg, HEAD)[0] == "get_rows" and set(a.ops(cfg, 0)) | head_ops <= set(OPS + MOE_OPS + RECURRENT_OPS)


@pytest.mark.parametrize("name", sorted(EXPECTED_HALF_OPS))
def test_ops_of_each_half_of_a_moe_block(name):
    """The halves' ops come from their own code (each half sees only its own tensors) and add up
    to the whole block's."""
    a = ARCHITECTURES[name]
    cfg = synth.config(SMALL, name)
    attn, ffn = EXPECTED_HALF_OPS[name]
    assert set(a.ops(cfg, 0, part="attn")) == attn and set(a.ops(cfg, 0, part="ffn")) == ffn
    assert attn | ffn == set(a.ops(cfg, 0))
    with pytest.raises(ValueError, match="no block part 'ffn'"):
        LLAMA.ops(cfg, 0, part="ffn")


@pytest.mark.parametrize("name", sorted(EXPECTED_HALF_OPS))
def test_the_halves_split_a_blocks_tensors(name):
    """A block's attention and feed-forward tensors (skeleton's TensorSpec.ffn marks) are disjoint
    and together the whole block; the FFN norm belongs to the feed-forward half."""
    a = ARCHITECTURES[name]
    cfg = synth.config(SMALL, name)
    names = {n for n, _ in a.expected(cfg)}
    attn, ffn, whole = (set(a.unit_tensors(names, 1, part)) for part in ("attn", "ffn", "all"))
    assert attn | ffn == whole and not attn & ffn
    assert {"ffn_gate_inp", "ffn_up_exps", "ffn_down_exps"} <= ffn and {"attn_norm", "attn_q"} <= attn
    assert ("post_attention_norm" if name in ("gpt-oss", "glm4moe") else "ffn_norm") in ffn


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_derived_ops_are_the_ops_a_segment_runs(name, tmp_path, cpu_device, monkeypatch):
    """The union over units of ops(cfg, unit, the file's tensors) is what running the model calls on numpy."""
    extra = {"qwen3": {"head_dim": 24}, "gpt-oss": {"n_swa": 4}, "olmoe": {"n_head_kv": SMALL.n_head},
             "lfm2": {"n_conv": 3, "attn_layers": (1,)},
             **dict.fromkeys(("qwen35", "qwen35moe"), {"n_conv": 4, "full_attention_interval": 2, "ssm_d_state": 8,
                                                       "ssm_n_group": 2, "ssm_dt_rank": 4,
                                                       "rope_sections": (2, 1, 1, 0)}),
             "qwen3next": {"n_conv": 4, "full_attention_interval": 2, "ssm_d_state": 8, "ssm_n_group": 2,
                           "ssm_dt_rank": 4},
             **dict.fromkeys(("granitehybrid", "mamba2"), {"n_conv": 4, "attn_layers": (1,), "ssm_d_state": 8,
                                                           "ssm_n_group": 2, "ssm_dt_rank": 4, "ssm_d_inner": 32,
                                                           "residual_scale": 0.5, "logit_scale": 2.0})
             }.get(name, {})
    if name in EXPECTED_OPS and "matmul_id" in EXPECTED_OPS[name][0]:
        extra.update(n_expert=4, n_expert_used=2, n_ff_exp=SMALL.n_ff)  # olmoe: experts n_ff wide
    shape = dataclasses.replace(SMALL, n_ctx_train=512, **extra)
    p = tmp_path / "m.gguf"
    synth.write(p, shape, "F32", arch=name)
    gf = open_gguf(p)
    cfg = load_config(gf)
    seen: set[str] = set()
    for op in OPS + MOE_OPS + RECURRENT_OPS:
        real = getattr(cpu_device, op)
        monkeypatch.setattr(cpu_device, op, lambda *a, _op=op, _real=real, **kw: (seen.add(_op), _real(*a, **kw))[1])
    llm = Llama(model_path=str(p), n_ctx=32, verbose=False, device="cpu")
    try:
        llm.eval(TOKENS)
    finally:
        llm.close()
    derived = {op for u in [*range(cfg.n_layer), HEAD] for op in ARCHITECTURES[name].ops(cfg, u, gf.tensors)}
    assert seen == derived


def test_ops_leave_out_the_optional_tensors_the_file_lacks():
    """A qwen2 file without output.bias runs no add_bias in its head; with one it does."""
    a = ARCHITECTURES["qwen2"]
    cfg = synth.config(SMALL, "qwen2")
    names = {n for n, _ in a.expected(cfg)}
    assert "add_bias" in a.ops(cfg, HEAD, names)
    assert a.ops(cfg, HEAD, names - {"output.bias"}) == ("get_rows", "rmsnorm", "matmul")
    plain = names - {f"blk.0.attn_{x}.bias" for x in "qkv"}
    assert "add_bias" not in a.ops(cfg, 0, plain) and "add_bias" in a.ops(cfg, 1, plain)
    with pytest.raises(ValueError, match="neither a block index nor 'head'"):
        a.ops(cfg, INPUT)


def test_build_ffn_refuses_an_unknown_activation():
    s = SimpleNamespace(xn=1, gate=2, up=3, o=4)
    w = {"ffn_gate": 5, "ffn_up": 6, "ffn_down": 7}
    d = OpRecorder()
    assert builders.build_ffn(d, synth.config(SMALL), w, s, builders.GELU) == 4
    assert d.ops == ("matmul", "gelu_mul")
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        builders.build_ffn(OpRecorder(), synth.config(SMALL), w, s, "relu")


def test_op_recorder_notes_each_op_once_in_order():
    d = OpRecorder()
    d.rmsnorm(1, 2)
    d.matmul(3, x=4)
    d.rmsnorm()
    assert d.ops == ("rmsnorm", "matmul")
    with pytest.raises(AttributeError):
        d._private  # noqa: B018


def test_device_lacking_a_block_op_keeps_the_blocks_on_the_host(tmp_path):
    p = tmp_path / "m.gguf"
    synth.write(p, SMALL, "Q8_0")
    gf = open_gguf(p)
    cfg = load_config(gf)
    p = plan(gf, cfg, ["fake:0"], -1, None,
             lambda sel, op, ty, **dims: "fake:0 cannot run rope" if op == "rope" else "")
    assert p.blocks == ["cpu", "cpu"] and p.head == "fake:0"
    assert p.notes == [f"block {i} stays on cpu: fake:0 cannot run rope" for i in range(2)]


def info_supports(info):
    return lambda sel, op, ty, **dims: info.supports_op(op, ty, **dims)


def test_a_device_capping_head_dim_keeps_the_blocks_on_the_host(tmp_path):
    """An op limit the device declares (``DeviceInfo.op_limits``, e.g. Vulkan's attention
    head_dim <= 256) keeps the blocks home before anything is allocated, with the reason."""
    from cooktop.backends.info import DeviceInfo

    p = tmp_path / "m.gguf"
    synth.write(p, SMALL, "Q8_0")
    gf = open_gguf(p)
    cfg = load_config(gf)
    capped = DeviceInfo("fake", 0, "fake", types=("Q8_0", "F32"),
                        op_limits={"attention": {"head_dim": cfg.head_dim - 2}})
    roomy = dataclasses.replace(capped, op_limits={"attention": {"head_dim": cfg.head_dim}})
    for info, home in ((capped, True), (roomy, False)):
        pl = plan(gf, cfg, ["fake:0"], -1, None, info_supports(info))
        assert pl.blocks == (["cpu"] * cfg.n_layer if home else ["fake:0"] * cfg.n_layer)
        assert pl.head == "fake:0"
        assert pl.notes == ([f"block {i} stays on cpu: fake:0 runs attention with head_dim <= {cfg.head_dim - 2}, "
                             f"not {cfg.head_dim}" for i in range(cfg.n_layer)] if home else [])


# -- an optional tensor family -------------------------------------------------
def _post_norm_block(d, cfg, w, s, kv, il):
    """LLAMA.block with an optional post-attention norm."""
    x, xn, q, k, v, att, o, gate, up = s.x, s.xn, s.q, s.k, s.v, s.att, s.o, s.gate, s.up
    rope = (cfg.head_dim, cfg.n_rot, cfg.rope_freq_base, cfg.rope_freq_scale, cfg.rope_mode)
    d.rmsnorm(xn, x, w["attn_norm"], cfg.rms_eps)
    d.matmul(q, xn, w["attn_q"])
    d.matmul(k, xn, w["attn_k"])
    d.matmul(v, xn, w["attn_v"])
    d.rope(q, q, kv.pos, *rope)
    d.rope(k, k, kv.pos, *rope)
    kv.attend(d, att, q, k, v, cfg.n_head, cfg.n_head_kv, cfg.head_dim ** -0.5)
    d.matmul(o, att, w["attn_output"])
    if "attn_post_norm" in w:
        d.rmsnorm(o, o, w["attn_post_norm"], cfg.rms_eps)
    d.add(x, x, o)
    d.rmsnorm(xn, x, w["ffn_norm"], cfg.rms_eps)
    d.matmul(gate, xn, w["ffn_gate"])
    d.matmul(up, xn, w["ffn_up"])
    d.silu_mul(gate, gate, up)
    d.matmul(o, gate, w["ffn_down"])
    d.add(x, x, o)


POST_NORM = dataclasses.replace(
    LLAMA, tensors=LLAMA.tensors + (norm("blk.{i}.attn_post_norm.weight", lambda c: (c.n_embd,), required=False),),
    block=_post_norm_block)


@pytest.fixture
def plain(tmp_path):
    p = tmp_path / "plain.gguf"
    synth.write(p, SMALL, "F32", seed=5)
    return p


def _run(path, cpu_device, monkeypatch) -> tuple[np.ndarray, int]:
    """Logits of TOKENS (every position) on numpy, and how many rmsnorm ops ran."""
    calls = []
    real = cpu_device.rmsnorm
    monkeypatch.setattr(cpu_device, "rmsnorm", lambda *a: (calls.append(1), real(*a))[1])
    llm = Llama(model_path=str(path), n_ctx=32, logits_all=True, verbose=False, device="cpu")
    try:
        llm.eval(TOKENS)
        return llm.scores[:len(TOKENS)].copy(), len(calls)
    finally:
        llm.close()
        monkeypatch.setattr(cpu_device, "rmsnorm", real)


def test_absent_optional_tensor_skips_its_op(plain, cpu_device, monkeypatch):
    ref, n_ref = _run(plain, cpu_device, monkeypatch)
    monkeypatch.setitem(arch_pkg.ARCHITECTURES, "llama", POST_NORM)
    got, n_got = _run(plain, cpu_device, monkeypatch)
    assert n_ref == n_got == 2 * SMALL.n_layer + 1  # one chunk: 2 norms per block + the output norm
    np.testing.assert_array_equal(got, ref)


def test_present_optional_tensor_is_checked_placed_budgeted_and_used(plain, tmp_path, cpu_device, monkeypatch):
    ref, _ = _run(plain, cpu_device, monkeypatch)
    monkeypatch.setitem(arch_pkg.ARCHITECTURES, "llama", POST_NORM)
    # synth writes the optional tensors the descriptor declares (norms of ones, matrices as before)
    full = tmp_path / "full.gguf"
    synth.write(full, SMALL, "F32", seed=5)
    gf = open_gguf(full)
    assert {f"blk.{i}.attn_post_norm.weight" for i in range(SMALL.n_layer)} <= set(gf.tensors)
    assert "attn_post_norm" in POST_NORM.unit_tensors(gf.tensors, 0)
    assert unit_types(gf, load_config(gf), 0) == {synth.T.F32}  # norms are not matmul weights
    cfg = load_config(gf)
    assert set(weight_bytes(gf, cfg, [0])) == {n for n, _ in POST_NORM.unit_tensors(gf.tensors, 0).values()}
    assert weight_bytes(gf, cfg, [1])["blk.1.attn_post_norm.weight"] == 4 * SMALL.n_embd
    got, n = _run(full, cpu_device, monkeypatch)
    assert n == 3 * SMALL.n_layer + 1
    assert np.isfinite(got).all() and not np.allclose(got, ref, atol=1e-3)
    # present in block 0 only: that block uses it, block 1 skips it
    half = rewrite_gguf(plain, tmp_path / "half.gguf",
                        add={"blk.0.attn_post_norm.weight": (np.ones(SMALL.n_embd, np.float32), None)})
    _, n = _run(half, cpu_device, monkeypatch)
    assert n == 2 * SMALL.n_layer + 2


def test_optional_tensor_with_wrong_shape_is_refused(plain, tmp_path, monkeypatch):
    monkeypatch.setitem(arch_pkg.ARCHITECTURES, "llama", POST_NORM)
    bad = rewrite_gguf(plain, tmp_path / "bad.gguf",
                       add={"blk.1.attn_post_norm.weight": (np.ones(SMALL.n_embd + 1, np.float32), None)})
    with pytest.raises(UnsupportedModelError) as e:
        load_config(open_gguf(bad))
    assert "'blk.1.attn_post_norm.weight' has shape [65]" in str(e.value) and "implies [64]" in str(e.value)


def test_without_the_variant_the_optional_tensor_is_refused(plain, tmp_path):
    """The plain llama descriptor does not declare it: refused, never silently ignored."""
    extra = rewrite_gguf(plain, tmp_path / "extra.gguf",
                         add={"blk.0.attn_post_norm.weight": (np.ones(SMALL.n_embd, np.float32), None)})
    with pytest.raises(UnsupportedModelError, match="does not use"):
        load_config(open_gguf(extra))
