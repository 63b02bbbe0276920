"""granitehybrid (Granite 4.0-H: Mamba-2 blocks + attention blocks with Granite's multipliers) and mamba2
end to end against llama.cpp (llama-cpp-python at test time), and the two state tensors per Mamba-2 block
beside the KV cache.

Tiny synthetic models (``tools/synth.py``, the granite-4.0-h-micro preset's structure with fewer and
narrower blocks: Mamba-2 at blocks 0, 1 and 3, NoPE attention at 2; 8 heads of 16 in 2 groups with a
state of 8; the multipliers; F32, Q8_0 and Q4_K), the -tiny preset's experts with a shared expert
(F32, Q8_0) and a pure mamba2, match llama.cpp's logits with the prompt in chunks of 7 (llama.cpp: 16),
so the convolution and scan states cross chunk boundaries; bounds: nmse <= 1e-5 (F32), <= 3e-3
(quantized). Then, on the F32 model (cooktop against itself at float32 rounding): one batch, token by
token and after a cached prefix; four sequences in one batch each equal to alone; a checkpoint restored
equals recomputing; file errors.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import rewrite_gguf, skip_or_fail
from pathsutil import eval_three_ways

from cooktop import Llama
from cooktop.backends.base import nmse
from cooktop.engine import generate as G
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = dataclasses.replace(synth.SHAPES["granite-4.0-h-micro"], n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
                            n_ff=96, n_vocab=300, n_ctx_train=256, attn_layers=(2,), ssm_d_state=8, ssm_n_group=2,
                            ssm_dt_rank=8, ssm_d_inner=128, logit_scale=0.5)
WIDE = dataclasses.replace(SMALL, n_embd=256, n_ff=512, ssm_d_inner=512, ssm_d_state=16, ssm_n_group=1)  # Q4_K
MOE = dataclasses.replace(SMALL, n_expert=4, n_expert_used=2, n_ff_shexp=64)
MAMBA2 = dataclasses.replace(synth.SHAPES["mamba2-2.7b"], n_embd=64, n_layer=3, n_vocab=300, n_ctx_train=256,
                             ssm_d_state=8, ssm_n_group=2, ssm_dt_rank=8, ssm_d_inner=128, tied=False)
SHAPES = {"small": SMALL, "wide": WIDE, "moe": MOE, "mamba2": MAMBA2}
CASES = [("small", "F32"), ("small", "Q8_0"), ("wide", "Q4_K"), ("moe", "F32"), ("moe", "Q8_0"), ("mamba2", "F32"),
         ("mamba2", "Q8_0")]
#: sharper attention (NoPE: the attention block sees the order only through the Mamba-2 blocks before it)
SCALES = {"attn_q": 0.2, "attn_k": 0.2, "ssm_in": 0.1}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 30)]
N_CTX = 64
N_GREEDY = 4


def bound(ft: str) -> float:
    return 1e-5 if ft == "F32" else 3e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("granite")
    out = {}
    for shape, ft in CASES:
        p = d / f"{shape}-{ft}.gguf"
        synth.write(p, SHAPES[shape], ft, seed=3, scales=SCALES)
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
    """llama.cpp's logits and greedy continuation per model (one load each)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    refs = {}
    for case in CASES:
        llm = llama_cpp.Llama(model_path=str(models[case]), logits_all=True, n_ctx=N_CTX, n_batch=16,
                              verbose=False)
        refs[case] = _greedy(llm, PROMPT, N_GREEDY)
        llm.close()
    return refs


@pytest.mark.parametrize("shape,ft", CASES)
def test_logits_and_greedy_match_llama_cpp(models, reference, shape, ft):
    llm = Llama(model_path=str(models[shape, ft]), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False,
                device="cpu")
    try:
        logits, tokens, _ = _greedy(llm, PROMPT, N_GREEDY)
    finally:
        llm.close()
    ref_logits, ref_tokens, margins = reference[shape, ft]
    err = nmse(logits, ref_logits)
    print(f"{SHAPES[shape].arch} {shape} {ft}: nmse {err:.3g} vs llama.cpp")
    assert err <= bound(ft)
    scale = float(np.abs(ref_logits).max())
    for got, want, margin in zip(tokens, ref_tokens, margins):
        if margin < 1e-2 * scale:  # not clear of the numerical error: the continuations may part here
            break
        assert got == want


def test_the_scan_state_matters(models, reference, tmp_path):
    """The same file with the Mamba-2 blocks' decay made total (``ssm_a`` very negative: each token's
    scan state forgets the past) runs far from llama.cpp's logits, so the match above checks the
    carried scan state, not only the convolution's."""
    p = rewrite_gguf(models["small", "F32"], tmp_path / "forget.gguf", replace={
        f"blk.{i}.ssm_a": (np.full((8, 1), -1e4, np.float32), None) for i in (0, 1, 3)})
    llm = Llama(model_path=str(p), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False, device="cpu")
    try:
        logits, _, _ = _greedy(llm, PROMPT, 0)
    finally:
        llm.close()
    assert nmse(logits, reference["small", "F32"][0]) > 1e-4


@pytest.fixture(scope="module")
def engine(models):
    eng = G.load(str(models["small", "F32"]), n_ctx=N_CTX, n_batch=32, device="cpu", logits_all=True)
    yield eng
    eng.close()


def close(a, b):
    return nmse(np.asarray(a, np.float64), np.asarray(b, np.float64)) <= 1e-10


def test_one_batch_token_by_token_and_cached_prefix_agree(engine):
    batch, one, rest = eval_three_ways(engine, PROMPT, 11)
    assert close(one, batch)
    assert close(rest, batch[11:])


def test_four_sequences_in_one_batch_each_equal_alone(engine):
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 300, n)] for n in (5, 9, 1, 6)]
    model = engine.model
    alone = []
    for p in prompts:
        seq = engine.new_sequence()
        first = seq.eval(p[:-1], logits_all=True) if len(p) > 1 else None
        alone.append((first, seq.eval(p[-1:])[-1]))
    cache = model.new_cache(4)
    first = [(s, 0, p[:-1], len(p) - 1) for s, p in enumerate(prompts) if len(p) > 1]
    got = model.forward_batch(cache, first)
    for (s, _, _, _), rows in zip(first, got):
        assert close(rows, alone[s][0])
    got = model.forward_batch(cache, [(s, len(p) - 1, p[-1:], True) for s, p in enumerate(prompts)])
    for s, rows in enumerate(got):
        assert close(rows[-1], alone[s][1])
    cache.close()


def test_checkpoint_restore_equals_recomputing(engine):
    seq = engine.new_sequence()
    seq.eval(PROMPT[:12])
    assert seq.cache.checkpoint(0) == 12
    seq.eval(PROMPT[12:20])
    other = [5, 6, 7, 8, 9]
    assert seq.common_prefix(PROMPT[:15] + other) == 12  # only the checkpoint's 12 can be reused
    logits, n_eval = seq.prefill(PROMPT[:15] + other)
    assert n_eval == 8
    assert close(logits, engine.new_sequence().eval(PROMPT[:15] + other)[-1])


def test_state_tensors(engine):
    cache = engine.model.new_cache(2)
    conv, scan = 3 * (128 + 2 * 2 * 8), 128 * 8  # (d_conv - 1) x (x, B, C channels); H P N
    assert cache.state_bytes == 2 * 3 * (conv + scan) * 4  # sequences x Mamba-2 blocks x floats x f32
    blocks = cache.recurrent.tensors[0]
    assert [None if b is None else [t.shape for t in b] for b in blocks][1:3] == [[(2, conv), (2, scan)], None]
    cache.close()


def test_config_reads_the_pattern_the_heads_and_the_multipliers(models):
    cfg = load_config(open_gguf(str(models["small", "F32"])))
    assert cfg.recurrent_layers == (True, True, False, True)
    assert (cfg.n_conv, cfg.ssm_d_state, cfg.ssm_n_group, cfg.ssm_dt_rank, cfg.ssm_d_inner) == (4, 8, 2, 8, 128)
    assert (cfg.embedding_scale, cfg.residual_scale, cfg.logit_scale, cfg.use_rope) == (12.0, np.float32(0.246),
                                                                                       0.5, False)
    assert cfg.attn_scale == 0.0078125
    moe = load_config(open_gguf(str(models["moe", "F32"])))
    assert (moe.n_expert, moe.n_expert_used, moe.n_ff_exp, moe.n_ff_shexp, moe.expert_weights_norm) == (
        4, 2, 96, 64, True)
    m2 = load_config(open_gguf(str(models["mamba2", "F32"])))
    assert m2.recurrent_layers == (True,) * 3 and m2.n_head == 0


def _set(src, dst, **keys):
    """``src`` with ``granitehybrid.<key>`` set to each (uint32) value."""
    from gguf import GGUFValueType as V
    kv = [(f"granitehybrid.{k}", v, V.UINT32) for k, v in keys.items()]
    return rewrite_gguf(src, dst, drop=tuple(k for k, _, _ in kv), extra_kv=kv)


def test_file_errors(models, tmp_path):
    src = models["small", "F32"]
    for i, (keys, msg) in enumerate([({"ssm.time_step_rank": 3}, "must divide"),
                                     ({"ssm.group_count": 3}, "multiple of"),
                                     ({"ssm.inner_size": 96}, "shape")]):
        with pytest.raises(UnsupportedModelError, match=msg):
            load_config(open_gguf(str(_set(src, tmp_path / f"bad{i}.gguf", **keys))))
    p = rewrite_gguf(src, tmp_path / "noscan.gguf", drop=("granitehybrid.ssm.state_size",))
    with pytest.raises(UnsupportedModelError, match="ssm.state_size"):
        load_config(open_gguf(str(p)))


@pytest.mark.slow(reason="lavapipe compiles the granitehybrid pipelines cold")
@pytest.mark.parametrize("family", ["opencl", "vulkan"])
def test_on_a_device(models, reference, family):
    """OpenCL and Vulkan run every block (their ssm_scan, ssm_norm, scale, ssm_conv and small-op kernels: the
    two state tensors live on the device); the logits are numpy's and match llama.cpp's."""
    from conftest import open_family_device
    from gguf import GGMLQuantizationType as T
    sel = open_family_device(family).info.selector

    def run(path, **kw):
        llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False,
                    type_k=T.F32, type_v=T.F32, **kw)
        try:
            return _greedy(llm, PROMPT, 0)[0], llm._engine.placement
        finally:
            llm.close()

    for case in (("small", "F32"), ("mamba2", "F32")):
        ref, _ = run(models[case], device="cpu")
        got, p = run(models[case], device=sel, n_gpu_layers=-1)
        assert p.blocks == [sel] * SHAPES[case[0]].n_layer, p.summary()
        err = nmse(got, reference[case][0])
        print(f"{case} on {sel}: nmse {err:.3g} vs llama.cpp, {nmse(got, ref):.3g} vs numpy")
        assert nmse(got, ref) < 1e-6
        assert err <= bound(case[1])
