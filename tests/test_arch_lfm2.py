"""lfm2 (short-convolution blocks + attention blocks) end to end against llama.cpp (llama-cpp-python at
test time), and the recurrent state beside the KV cache (``model/recurrent.py``).

Tiny synthetic models (``tools/synth.py``, the lfm2-1.2b preset's structure with fewer and narrower
blocks: convolution blocks 0 and 2, attention blocks 1 and 3; F32, Q8_0 and Q4_K) match llama.cpp's
logits with the prompt in chunks of 7 (llama.cpp: 16), so the convolution's state crosses chunk
boundaries; bounds as issue's: nmse <= 1e-5 (F32), <= 3e-3 (quantized). Then, on the F32 model
(cooktop alone, against itself at float32 rounding): one batch, token by token and after a cached
prefix; four sequences in one batch each equal to alone; a checkpoint restored equals recomputing;
truncation without a checkpoint refused; the K/V-and-state copy of a prefix; file and option errors.
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
from cooktop.engine.sampling import SamplingParams
from cooktop.errors import RecurrentStateError, UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config
from cooktop.tools import synth

SMALL = dataclasses.replace(synth.SHAPES["lfm2-1.2b"], n_embd=64, n_layer=4, n_head=4, n_head_kv=2, n_ff=96,
                            n_vocab=300, n_ctx_train=256, attn_layers=(1, 3))
WIDE = dataclasses.replace(SMALL, n_embd=256, n_ff=512)  # Q4_K rows are 256 wide
SHAPES = {"small": SMALL, "wide": WIDE}
CASES = [("small", "F32"), ("small", "Q8_0"), ("wide", "Q4_K")]
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 30)]
N_CTX = 64
N_GREEDY = 4


def bound(ft: str) -> float:
    return 1e-5 if ft == "F32" else 3e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfm2")
    out = {}
    for shape, ft in CASES:
        p = d / f"lfm2-{shape}-{ft}.gguf"
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
    """llama.cpp's logits and greedy continuation per model (one load each)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    refs = {}
    for case in CASES:
        llm = llama_cpp.Llama(model_path=str(models[case]), logits_all=True, n_ctx=N_CTX, n_batch=16,
                              n_ubatch=16, verbose=False)
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
    print(f"lfm2 {shape} {ft}: nmse {err:.3g} vs llama.cpp")
    assert err <= bound(ft)
    scale = float(np.abs(ref_logits).max())
    for got, want, margin in zip(tokens, ref_tokens, margins):
        if margin < 1e-2 * scale:  # not clear of the numerical error: the continuations may part here
            break
        assert got == want


def test_the_convolution_matters(models, reference, tmp_path):
    """The same file with its convolution kernels zeroed runs far from llama.cpp's logits, so the
    test above, which matches them, checks the convolution (and its state)."""
    src = models["small", "F32"]
    p = rewrite_gguf(src, tmp_path / "z.gguf", replace={
        f"blk.{i}.shortconv.conv.weight": (np.zeros((64, 3), np.float32), None) for i in (0, 2)})
    llm = Llama(model_path=str(p), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False, device="cpu")
    try:
        logits, _, _ = _greedy(llm, PROMPT, 0)
    finally:
        llm.close()
    assert nmse(logits, reference["small", "F32"][0]) > 1e-3


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


def test_prompt_in_chunks_equals_one_batch(models, engine):
    whole = engine.new_sequence().eval(PROMPT, logits_all=True)
    eng = G.load(str(models["small", "F32"]), n_ctx=N_CTX, n_batch=4, device="cpu", logits_all=True)
    try:
        chunked = eng.new_sequence().eval(PROMPT, logits_all=True)  # 8 chunks of 4 (the last 2)
    finally:
        eng.close()
    assert close(chunked, whole)


def test_four_sequences_in_one_batch_each_equal_alone(engine):
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 300, n)] for n in (5, 9, 1, 6)]
    model = engine.model
    alone = []
    for p in prompts:
        seq = engine.new_sequence()
        alone.append(seq.eval(p[:-1] or p, logits_all=True) if len(p) > 1 else None)
        alone[-1] = (alone[-1], seq.eval([p[-1]])[-1] if len(p) > 1 else seq.eval(p)[-1])
    cache = model.new_cache(4)
    # first the prompts but their last tokens (a seq of one token starts with it), then the last tokens
    first = [(s, 0, p[:-1], len(p) - 1) for s, p in enumerate(prompts) if len(p) > 1]
    got = model.forward_batch(cache, first)
    for (s, _, _, _), rows in zip(first, got):
        assert close(rows, alone[s][0])
    last = [(s, len(p) - 1, p[-1:], True) for s, p in enumerate(prompts)]
    got = model.forward_batch(cache, last)
    for s, rows in enumerate(got):
        assert close(rows[-1], alone[s][1])
    cache.close()


def test_checkpoint_restore_equals_recomputing(engine):
    seq = engine.new_sequence()
    seq.eval(PROMPT[:12])
    assert seq.cache.checkpoint(0) == 12
    seq.eval(PROMPT[12:20])
    other = [5, 6, 7, 8, 9]
    # the prompt shares 15 tokens: only the checkpoint's 12 can be reused
    assert seq.common_prefix(PROMPT[:15] + other) == 12
    logits, n_eval = seq.prefill(PROMPT[:15] + other)
    assert n_eval == 8
    fresh = engine.new_sequence().eval(PROMPT[:15] + other)[-1]
    assert close(logits, fresh)
    # the sequence's whole context is reusable without a checkpoint
    assert seq.common_prefix(PROMPT[:15] + other + [10]) == 20


def test_truncation_without_a_checkpoint_is_refused(engine):
    seq = engine.new_sequence()
    seq.eval(PROMPT[:10])
    with pytest.raises(RecurrentStateError, match="cannot be cut back from 10 to 6"):
        seq.truncate(6)
    assert seq.n_past == 10  # nothing changed: appending still matches a fresh evaluation
    got = seq.eval(PROMPT[10:14])[-1]
    assert close(got, engine.new_sequence().eval(PROMPT[:14])[-1])
    seq.truncate(0)  # 0 clears the state
    assert close(seq.eval(PROMPT[:3])[-1], engine.new_sequence().eval(PROMPT[:3])[-1])


def test_copy_prefix_copies_the_state(engine):
    src, dst, third = engine.new_sequences(3)
    src.eval(PROMPT[:8])
    src.cache.checkpoint(src.seq_id)
    src.eval(PROMPT[8:16])
    assert dst.copy_prefix(src, 16)  # the current state
    assert close(dst.eval(PROMPT[16:20])[-1], engine.new_sequence().eval(PROMPT[:20])[-1])
    assert third.copy_prefix(src, 8)  # the checkpoint's
    assert close(third.eval(PROMPT[8:10])[-1], engine.new_sequence().eval(PROMPT[:10])[-1])
    assert not third.copy_prefix(src, 5)  # no state at 5: the caller evaluates the prefix itself
    assert third.n_past == 0


def test_state_bytes_and_no_kv_for_conv_blocks(engine):
    cache = engine.model.new_cache(3)
    assert cache.state_bytes == 3 * 2 * (3 - 1) * 64 * 4  # sequences x conv blocks x (l_cache - 1) x n_embd
    assert [k.shape[0] for k in cache.k[0]] == [1, 3 * N_CTX, 1, 3 * N_CTX]
    cache.close()


def test_context_shift_is_refused(engine):
    with pytest.raises(RecurrentStateError, match="context shift"):
        engine.generate(PROMPT[:5], 3, SamplingParams(temperature=0.0), n_keep=0)


def _without(src, dst, name):
    """A copy of GGUF ``src`` without tensor ``name``."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name != name:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_file_errors(models, tmp_path):
    src = models["small", "F32"]
    p = _without(src, tmp_path / "m.gguf", "blk.2.shortconv.out_proj.weight")
    with pytest.raises(UnsupportedModelError, match="missing tensor 'blk.2.shortconv.out_proj.weight'"):
        load_config(open_gguf(p))
    extra = np.ones(16, np.float32)
    p = rewrite_gguf(src, tmp_path / "x.gguf", add={"blk.0.attn_q_norm.weight": (extra, None)})
    with pytest.raises(UnsupportedModelError, match="does not belong in block 0, a recurrent block"):
        load_config(open_gguf(p))


def test_placement_keeps_conv_blocks_where_ssm_conv_runs(models):
    from cooktop.backends.optable import RECURRENT_OPS
    from cooktop.runtime.placement import plan
    gf = open_gguf(models["small", "F32"])
    cfg = load_config(gf)

    def supports(sel, op, ggml_type=None, **dims):
        return f"{sel} has no {op} kernel" if sel == "gpu" and op in RECURRENT_OPS else ""

    p = plan(gf, cfg, ["gpu"], 99, None, supports)
    assert p.blocks == ["cpu", "gpu", "cpu", "gpu"]
    assert any("block 0" in n and "ssm_conv" in n for n in p.notes), p.notes


def test_derived_ops_of_each_kind_of_block():
    from cooktop.model.arch import ARCHITECTURES
    from cooktop.model.arch.base import HEAD
    a = ARCHITECTURES["lfm2"]
    cfg = synth.config(SMALL)
    assert cfg.recurrent_layers == (True, False, True, False)
    assert set(a.ops(cfg, 0)) == {"rmsnorm", "matmul", "mul", "ssm_conv", "add", "silu_mul"}
    assert set(a.ops(cfg, 1)) == {"rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"}
    assert set(a.ops(cfg, HEAD)) == {"get_rows", "rmsnorm", "matmul"}


def test_info_counts_attention_kv_and_the_state(models):
    from gguf import GGMLQuantizationType as T

    from cooktop.cli.info import model_info
    from cooktop.format.kvtypes import KVConfig
    info = model_info(str(models["small", "F32"]), 128, KVConfig(T.F32, T.F32))
    assert info["kv_cache"]["bytes"] == 2 * 2 * 128 * 2 * 16 * 4  # 2 attention blocks x K and V x n_ctx x 32 x f32
    assert info["recurrent_state_bytes"] == 2 * 2 * 64 * 4  # 2 conv blocks x (l_cache - 1) x n_embd x f32


@pytest.mark.slow(reason="lavapipe compiles the lfm2 pipelines cold (22 s on 2 cores), F32 and Q8_0")
@pytest.mark.parametrize("family", ["opencl", "vulkan"])
def test_on_a_device(models, reference, family):
    """OpenCL and Vulkan run every block (their ``ssm_conv`` kernels: the states live on the device);
    the logits are numpy's and match llama.cpp's."""
    from conftest import open_family_device
    from gguf import GGMLQuantizationType as T
    sel = open_family_device(family).info.selector
    want = [sel] * 4

    def run(path, **kw):
        llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=7, logits_all=True, verbose=False,
                    type_k=T.F32, type_v=T.F32, **kw)
        try:
            return _greedy(llm, PROMPT, 0)[0], llm._engine.placement
        finally:
            llm.close()

    for case in (("small", "F32"), ("small", "Q8_0")):
        ref, _ = run(models[case], device="cpu")
        got, p = run(models[case], device=sel, n_gpu_layers=-1)
        assert p.blocks == want, p.summary()
        err = nmse(got, reference[case][0])
        print(f"lfm2 {case[1]} on {sel}: nmse {err:.3g} vs llama.cpp, {nmse(got, ref):.3g} vs numpy")
        assert nmse(got, ref) < (1e-6 if case[1] == "F32" else 3e-4)  # OpenCL: 8-bit activations
        assert err <= bound(case[1])


@pytest.mark.parametrize("name", ["mamba", "rwkv7", "jamba", "kimi-linear", "nemotron_h", "lfm2moe"])
def test_unsupported_recurrent_families_are_refused_by_name(name):
    from cooktop.model.arch import architecture
    with pytest.raises(UnsupportedModelError, match=f"unsupported architecture '{name}': a recurrent architecture"):
        architecture(name)


def test_prefill_keeps_a_checkpoint_before_the_last_token(engine, caplog):
    import logging
    seq = engine.new_sequence()
    first, n1 = seq.prefill(PROMPT)
    assert n1 == len(PROMPT) and sorted(seq.cache.recurrent.checkpoints[0]) == [len(PROMPT) - 1]
    again, n2 = seq.prefill(PROMPT)  # a regenerated answer: only the last token is evaluated again
    assert n2 == 1 and close(again, first)
    seq.eval([7, 8, 9])
    with caplog.at_level(logging.INFO, logger="cooktop.engine.sequence"):
        other, n3 = seq.prefill(PROMPT[:20] + [11, 12])  # shares 20 tokens, no checkpoint at or before 20
    assert n3 == 22 and "can go back only to 0" in caplog.text
    assert close(other, engine.new_sequence().eval(PROMPT[:20] + [11, 12])[-1])


def test_a_ray_cluster_refuses_recurrent_models(models):
    from cooktop.cluster.load import load_model
    with pytest.raises(UnsupportedModelError, match="recurrent layers, whose states a Ray cluster does not hold"):
        load_model(models["small", "F32"], ray_address="ray://127.0.0.1:1")


def test_eight_generations_batched_each_equal_alone(engine):
    """As the server's slots: 8 sequences of one cache decoded by one BatchDriver from threads, each
    greedy continuation equal to the one it gets alone (the states of 8 sequences in one batch)."""
    from batchutil import run_in_driver
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(3, 300, n)] for n in (3, 7, 1, 12, 5, 9, 2, 6)]
    greedy = SamplingParams(temperature=0.0)
    alone = [engine.generate(p, 5, greedy, seq=engine.new_sequence()).drain().tokens for p in prompts]
    got, drv = run_in_driver(engine, [lambda seq, p=p: engine.generate(p, 5, greedy, seq=seq).drain().tokens
                                      for p in prompts])
    assert got == alone
    assert drv.stats.max_seqs > 1


def test_spec_options_build_for_a_recurrent_target(engine):
    from cooktop.engine.spec_config import SpecOptions
    spec, draft_engine = SpecOptions(spec_type=("ngram-simple",)).build(engine, "cpu", -1)
    assert spec is not None and draft_engine is None
