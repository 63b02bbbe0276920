"""qwen3next (Qwen3-Next: Gated DeltaNet linear-attention blocks with repeat-interleaved key heads, gated
attention blocks, experts with a sigmoid-gated shared expert) end to end against llama.cpp
(llama-cpp-python at test time).

Tiny synthetic models (``tools/synth.py``, the qwen3-next-80b-a3b preset's structure with fewer and
narrower blocks: linear attention at blocks 0-2, full attention at 3; 2 key heads shared by 6 value
heads (8 in the Q4_K model), so that value head ``h`` reading key head ``h // 3`` and not ``h mod 2``
shows in the logits; 4 experts, 2 used): F32 and Q8_0 in the legacy ``ssm_in`` layout, F32 in the
converter's ``attn_qkv`` + ``attn_gate`` layout, and Q4_K (256-wide rows), with the prompt in chunks
of 7 (llama.cpp: 16), so the convolution and delta-rule states cross chunk boundaries. Bounds: nmse
<= 1e-5 (F32), <= 3e-3 (quantized), on numpy, OpenCL (F32, Q8_0) and Vulkan (F32). With qwen35's tiled
key heads instead, the logits are far off. Then, on the F32 model (cooktop against itself): one batch,
chunks of 3 and token by token agree; four sequences in one batch each equal alone; an MTP block after
the trunk is skipped; the layout checks and the file errors; the preset's real shapes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import rewrite_gguf, skip_or_fail
from pathsutil import eval_three_ways

from cooktop import Llama
from cooktop.backends.base import ROPE_NEOX, nmse
from cooktop.engine import generate as G
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = dataclasses.replace(synth.SHAPES["qwen3-next-80b-a3b"], n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
                            head_dim=16, n_ff=96, n_vocab=300, n_ctx_train=256, ssm_d_state=16, ssm_n_group=2,
                            ssm_dt_rank=6, n_rot=8, n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64)
WIDE = dataclasses.replace(SMALL, n_embd=256, head_dim=64, ssm_d_state=32, ssm_dt_rank=8, n_rot=16,
                           n_ff_exp=256, n_ff_shexp=256)  # Q4_K rows are 256 wide
QKV = dataclasses.replace(SMALL, layout="attn_qkv")
SHAPES = {"small": SMALL, "wide": WIDE, "qkv": QKV}
CASES = [("small", "F32"), ("small", "Q8_0"), ("qkv", "F32"), ("wide", "Q4_K")]
#: sharper attention so that positions (rope) visibly change the logits
SCALES = {"attn_q": 0.2, "attn_k": 0.2}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 30)]
N_CTX = 64


def bound(ft: str) -> float:
    return 1e-5 if ft == "F32" else 3e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3next")
    out = {}
    for shape, ft in CASES:
        p = d / f"qwen3next-{shape}-{ft}.gguf"
        synth.write(p, SHAPES[shape], ft, seed=3, scales=SCALES)
        out[shape, ft] = p
    return out


def _logits(llm, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float64)


@pytest.fixture(scope="module")
def reference(models):
    """llama.cpp's logits of the prompt per model (one load each)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    refs = {}
    for case in CASES:
        llm = llama_cpp.Llama(model_path=str(models[case]), logits_all=True, n_ctx=N_CTX, n_batch=16,
                              verbose=False)
        refs[case] = _logits(llm, PROMPT)
        llm.close()
    return refs


def _run(path, **kw) -> np.ndarray:
    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False, **kw)
    try:
        return _logits(llm, PROMPT)
    finally:
        llm.close()


def test_the_files_have_the_layouts(models):
    """The legacy file holds ``ssm_in`` (no ``attn_qkv``), the other ``attn_qkv`` and ``attn_gate``; both
    hold ``ssm_ba``; every block's feed-forward is experts."""
    legacy = open_gguf(str(models["small", "F32"])).tensors
    qkv = open_gguf(str(models["qkv", "F32"])).tensors
    assert "blk.0.ssm_in.weight" in legacy and "blk.0.attn_qkv.weight" not in legacy
    assert "blk.0.attn_gate.weight" not in legacy and "blk.3.ssm_in.weight" not in legacy
    assert {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight"} <= set(qkv) and "blk.0.ssm_in.weight" not in qkv
    assert all(f"blk.0.{k}.weight" in legacy for k in ("ssm_ba", "ffn_gate_inp", "ffn_gate_inp_shexp"))
    assert tuple(legacy["blk.0.ssm_in.weight"].shape) == (2 * 32 + 2 * 96, 64)  # 2 H_k d + 2 H_v d


@pytest.mark.parametrize("shape,ft", CASES)
def test_logits_match_llama_cpp(models, reference, shape, ft):
    got = _run(models[shape, ft], device="cpu")
    err = nmse(got, reference[shape, ft])
    print(f"qwen3next {shape} {ft} numpy: nmse {err:.3g} vs llama.cpp")
    assert err <= bound(ft)


def test_the_head_mapping_and_the_delta_rule_matter(models, reference, monkeypatch, tmp_path):
    """With qwen35's tiled key heads (``h mod H_k``) the F32 model runs far from llama.cpp, and so does
    the same file with total decay (``ssm_a`` very negative): the match above checks the interleaved
    mapping and the carried state."""
    from cooktop.model.arch import qwen3next
    want = reference["small", "F32"]
    tiled = qwen3next.linear_attn

    def linear_attn(d, cfg, w, s, kv, interleaved=False):
        return tiled(d, cfg, w, s, kv, interleaved=False)

    monkeypatch.setattr(qwen3next, "linear_attn", linear_attn)
    assert nmse(_run(models["small", "F32"], device="cpu"), want) > 1e-3
    monkeypatch.undo()
    p = rewrite_gguf(models["small", "F32"], tmp_path / "forget.gguf", replace={
        f"blk.{i}.ssm_a": (np.full(6, -1e4, np.float32), None) for i in (0, 1, 2)})
    assert nmse(_run(p, device="cpu"), want) > 1e-4


@pytest.fixture(scope="module")
def engine(models):
    eng = G.load(str(models["small", "F32"]), n_ctx=N_CTX, n_batch=32, device="cpu", logits_all=True)
    yield eng
    eng.close()


def close(a, b):
    return nmse(np.asarray(a, np.float64), np.asarray(b, np.float64)) <= 1e-10


def test_one_batch_chunks_and_token_by_token_agree(engine, models):
    batch, one, rest = eval_three_ways(engine, PROMPT, 11)
    assert close(one, batch)
    assert close(rest, batch[11:])
    llm = Llama(model_path=str(models["small", "F32"]), n_ctx=N_CTX, n_batch=3, logits_all=True, verbose=False,
                device="cpu")
    try:
        assert close(_logits(llm, PROMPT), batch)  # ten chunks of 3
    finally:
        llm.close()


def test_four_sequences_in_one_batch_each_equal_alone(engine):
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 300, n)] for n in (5, 9, 1, 6)]
    alone = [engine.new_sequence().eval(p, logits_all=True) for p in prompts]
    cache = engine.model.new_cache(4)
    got = engine.model.forward_batch(cache, [(s, 0, p, len(p)) for s, p in enumerate(prompts)])
    for s, rows in enumerate(got):
        assert close(rows, alone[s])
    cache.close()


def test_an_mtp_block_after_the_trunk_is_skipped(tmp_path):
    """A file whose last block is a multi-token-prediction block (``nextn_predict_layers = 1``) runs its
    trunk only: block 4's tensors are skipped, the logits are those of the 4-block trunk."""
    from gguf import GGUFValueType as V
    five = synth.write(tmp_path / "five.gguf", dataclasses.replace(SMALL, n_layer=5), "F32", seed=3, scales=SCALES)
    assert five
    trunk = tmp_path / "trunk.gguf"
    synth.write(trunk, SMALL, "F32", seed=3, scales=SCALES)
    p = rewrite_gguf(tmp_path / "five.gguf", tmp_path / "mtp.gguf",
                     extra_kv=[("qwen3next.nextn_predict_layers", 1, V.UINT32)])
    cfg = load_config(open_gguf(str(p)))
    assert (cfg.n_layer, cfg.n_layer_nextn) == (4, 1)
    assert close(_run(p, device="cpu")[:9], _run(trunk, device="cpu")[:9])


def test_config(models):
    cfg = load_config(open_gguf(str(models["small", "F32"])))
    assert cfg.recurrent_layers == (True, True, True, False)
    assert (cfg.n_conv, cfg.ssm_d_state, cfg.ssm_n_group, cfg.ssm_dt_rank, cfg.ssm_d_inner) == (4, 16, 2, 6, 96)
    assert (cfg.n_rot, cfg.rope_mode, cfg.n_layer_nextn) == (8, ROPE_NEOX, 0)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff_shexp) == (4, 2, 32, 64)
    assert (cfg.expert_gating, cfg.expert_weights_norm) == ("softmax", True)


def test_state_bytes(engine):
    cache = engine.model.new_cache(1)
    per_block = 3 * (2 * 32 + 96) + 6 * 16 * 16  # (d_conv - 1) x (q, k, v widths) + value heads x d x d
    assert cache.state_bytes == 3 * per_block * 4  # linear blocks x floats x f32
    cache.close()


def _set(src, dst, **keys):
    """``src`` with ``qwen3next.<key>`` set to each value (a uint32)."""
    from gguf import GGUFValueType as V
    kv = [(f"qwen3next.{k}", v, V.UINT32) for k, v in keys.items()]
    return rewrite_gguf(src, dst, drop=tuple(k for k, _, _ in kv), extra_kv=kv)


def test_file_errors(models, tmp_path):
    src = models["small", "F32"]
    for i, (keys, msg) in enumerate([({"ssm.time_step_rank": 5}, "must be a multiple of 2 key heads"),
                                     ({"ssm.inner_size": 80}, "must be 6 x 16"),
                                     ({"full_attention_interval": 9}, "no full-attention block"),
                                     ({"expert_count": 0}, "needs experts")]):
        with pytest.raises(UnsupportedModelError, match=msg):
            load_config(open_gguf(str(_set(src, tmp_path / f"bad{i}.gguf", **keys))))
    both = rewrite_gguf(src, tmp_path / "both.gguf", add={"blk.1.attn_qkv.weight": (np.zeros((160, 64), np.float32),
                                                                                     None)})
    with pytest.raises(UnsupportedModelError, match=r"block 1 has projections \['attn_qkv', 'ssm_in'\]"):
        load_config(open_gguf(str(both)))


def test_each_linear_block_needs_one_layout(models):
    """``check_layout`` (``Architecture.check_tensors``): ``ssm_in``, or ``attn_qkv`` with ``attn_gate``."""
    from cooktop.model.arch.qwen3next import check_layout
    cfg = load_config(open_gguf(str(models["small", "F32"])))
    legacy = set(open_gguf(str(models["small", "F32"])).tensors)
    qkv = set(open_gguf(str(models["qkv", "F32"])).tensors)
    check_layout(legacy, cfg)
    check_layout(qkv, cfg)
    with pytest.raises(UnsupportedModelError, match="x.gguf: qwen3next block 1 has projections none"):
        check_layout(legacy - {"blk.1.ssm_in.weight"}, cfg, "x.gguf")
    with pytest.raises(UnsupportedModelError, match=r"block 2 has projections \['attn_qkv'\]"):
        check_layout(qkv - {"blk.2.attn_gate.weight"}, cfg)
    with pytest.raises(UnsupportedModelError, match=r"\['attn_gate', 'attn_qkv', 'ssm_in'\]"):
        check_layout(legacy | {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight"}, cfg)


def test_the_preset_has_qwen3_next_80b_a3b_shapes():
    from cooktop.model.arch import architecture
    s = synth.SHAPES["qwen3-next-80b-a3b"]
    synth.validate(s, "Q4_K")
    cfg = synth.config(s)
    assert cfg.recurrent_layers.count(False) == 12 and cfg.n_ff_exp == 512
    shapes = {name: spec.shape(cfg) for name, spec in architecture("qwen3next").expected(cfg)}
    assert shapes["blk.0.ssm_in.weight"] == (2 * 2048 + 2 * 4096, 2048)
    assert shapes["blk.0.ssm_ba.weight"] == (64, 2048)
    assert shapes["blk.3.attn_q.weight"] == (2 * 16 * 256, 2048)
    assert shapes["blk.0.ffn_gate_exps.weight"] == (512, 512, 2048)


@pytest.mark.slow(reason="lavapipe compiles the qwen3next pipelines cold")
@pytest.mark.parametrize("family", ["opencl", "vulkan"])
def test_on_a_device(models, reference, family):
    """OpenCL and Vulkan run every block (their gated_delta_net with interleaved key heads, ssm_conv,
    expert and small-op kernels); the logits match llama.cpp's and numpy's. Vulkan: F32 only (on
    lavapipe each quantized matmul's Kompute algorithm takes about 0.16 s to create, some 45 s for
    this model's Q8_0; its Q8_0 matmul is covered by the matmul tests)."""
    from conftest import open_family_device
    from gguf import GGMLQuantizationType as T
    sel = open_family_device(family).info.selector
    for case in (("small", "F32"), ("small", "Q8_0"))[:1 if family == "vulkan" else 2]:
        ref = _run(models[case], device="cpu")
        llm = Llama(model_path=str(models[case]), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False,
                    type_k=T.F32, type_v=T.F32, device=sel, n_gpu_layers=-1)
        try:
            got = _logits(llm, PROMPT)
            p = llm._engine.placement
        finally:
            llm.close()
        assert p.blocks == [sel] * SMALL.n_layer, p.summary()
        err = nmse(got, reference[case])
        print(f"qwen3next {case[1]} on {sel}: nmse {err:.3g} vs llama.cpp, {nmse(got, ref):.3g} vs numpy")
        assert nmse(got, ref) < (1e-6 if case[1] == "F32" else 3e-4)  # OpenCL: 8-bit activations
        assert err <= bound(case[1])
