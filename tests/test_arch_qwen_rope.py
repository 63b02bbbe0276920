"""qwen2, qwen3 and llama with rope scaling against llama.cpp (llama-cpp-python at test
time): tiny synthetic models in F32 and a quantized type give llama.cpp's logits on numpy,
OpenCL and Vulkan (nmse <= 5e-6 F32, <= 3e-3 quantized), also when the prompt is evaluated in
several n_batch chunks, and the greedy continuation wherever llama.cpp's top-2 margin is clear
of the numerical error; ``cooktop info`` / ``run`` / ``plan`` on each; the hyper-parameters and
refusals of the rope scaling keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import open_family_device, rewrite_gguf, skip_or_fail
from gguf import GGUFValueType

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config
from cooktop.runtime.placement import plan
from cooktop.tools import synth

BOUND = {"F32": 5e-6, "Q8_0": 3e-3, "Q4_K": 3e-3}
N_CTX = 64
PROMPT = [1, 70, 80, 90, 100, 110, 120, 130, 140, 5, 6, 7, 8, 9, 299, 280, 270, 33, 44]
N_GREEDY = 8
#: sharper attention than synth's default weights, so that positions (rope) change the logits
SCALES = {"attn_q": 0.3, "attn_k": 0.3}

TINY = synth.Shape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=N_CTX)
WIDE = dataclasses.replace(TINY, n_embd=256, n_ff=256)  # K-quant rows are 256 values

#: name -> (shape, file type): each architecture in F32 and one quantized type; tied and untied
CASES = {
    "qwen2-F32": (dataclasses.replace(TINY, arch="qwen2"), "F32"),
    "qwen2-Q4_K-tied": (dataclasses.replace(WIDE, arch="qwen2", tied=True), "Q4_K"),
    # head_dim 32 with 4 heads: Q is 128 wide, n_embd 64 (as Qwen3-0.6B: 16 x 128 vs 1024)
    "qwen3-F32": (dataclasses.replace(TINY, arch="qwen3", head_dim=32), "F32"),
    "qwen3-Q8_0-tied": (dataclasses.replace(TINY, arch="qwen3", head_dim=32, tied=True), "Q8_0"),
    "llama-rope_freqs-F32": (dataclasses.replace(TINY, rope_freqs=True, rope_freq_base=500000.0), "F32"),
    "llama-rope_freqs-Q8_0-tied": (dataclasses.replace(TINY, rope_freqs=True, tied=True), "Q8_0"),
    "llama-factor-only-F32": (dataclasses.replace(TINY, rope_scaling_factor=4.0), "F32"),
    "llama-linear-Q4_K": (dataclasses.replace(WIDE, rope_scaling="linear", rope_scaling_factor=2.0), "Q4_K"),
    "llama-yarn-F32": (dataclasses.replace(TINY, rope_scaling="yarn", rope_scaling_factor=4.0, n_ctx_orig=16), "F32"),
    "llama-yarn-Q8_0": (dataclasses.replace(TINY, rope_scaling="yarn", rope_scaling_factor=8.0), "Q8_0"),
}

#: the cases whose scaling must change llama.cpp's numbers (else the test could not see it missing)
PLAIN_OF = {"llama-rope_freqs-F32": dataclasses.replace(TINY, rope_freq_base=500000.0),
            "llama-factor-only-F32": TINY, "llama-yarn-F32": TINY}


#: rope_freqs values replacing synth's Llama 3.1 factors (n_rot / 2 = 8)
FREQS = {"llama-rope_freqs-F32": np.linspace(0.1, 8.0, 8, dtype=np.float32)}


def _llama_cpp():
    if importlib.util.find_spec("llama_cpp") is None:
        skip_or_fail("llama_cpp", "llama-cpp-python is not installed (pip install -e .[compare])")
    import llama_cpp
    return llama_cpp


def _greedy(eval_fn, prompt: list[int], n: int) -> tuple[list[int], list[float], np.ndarray]:
    """Greedy continuation with ``eval_fn(tokens) -> logits of the last token``: (tokens, top-2
    margin of each choice, the logits of the prompt's last token)."""
    toks, margins = [], []
    logits = eval_fn(prompt)
    first = logits.copy()
    for _ in range(n):
        top = np.sort(logits)[-2:]
        toks.append(int(np.argmax(logits)))
        margins.append(float(top[1] - top[0]))
        logits = eval_fn([toks[-1]])
    return toks, margins, first


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """name -> (model path, llama.cpp's logits of PROMPT [n, n_vocab], greedy tokens, margins)."""
    llama_cpp = _llama_cpp()
    tmp = tmp_path_factory.mktemp("qwen_rope")
    out = {}
    for name, (shape, ft) in CASES.items():
        path = tmp / f"{name}.gguf"
        synth.write(path, shape, ft, seed=3, scales=SCALES)
        if name in FREQS:  # factors that also speed rotations up, so that they show at small positions
            path = rewrite_gguf(path, tmp / f"{name}-ff.gguf", replace={"rope_freqs.weight": (FREQS[name], None)})
        ref = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=N_CTX, verbose=False)
        try:
            ref.eval(PROMPT)
            logits = np.array(ref.scores[:len(PROMPT)], dtype=np.float32)

            def step(toks, ref=ref):
                ref.eval(toks)
                return np.array(ref.scores[ref.n_tokens - 1], dtype=np.float32)

            ref.reset()
            greedy, margins, _ = _greedy(step, PROMPT, N_GREEDY)
        finally:
            ref.close()
        out[name] = (path, logits, greedy, margins)
    for name, plain_shape in PLAIN_OF.items():  # the scaling is visible in llama.cpp's own numbers
        path = tmp / f"plain-{name}.gguf"
        synth.write(path, plain_shape, CASES[name][1], seed=3, scales=SCALES)
        ref = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=N_CTX, verbose=False)
        try:
            ref.eval(PROMPT)
            plain = np.array(ref.scores[:len(PROMPT)], dtype=np.float32)
        finally:
            ref.close()
        assert nmse(plain, out[name][1]) > 100 * BOUND["F32"], name
    return out


@pytest.fixture(scope="module", params=list(registry.FAMILIES))
def family(request):
    open_family_device(request.param)  # skips (or fails under COOKTOP_REQUIRE) when unusable
    return request.param


@pytest.mark.parametrize("name", list(CASES))
def test_logits_and_greedy_match_llama_cpp(oracle, family, name):
    path, ref, greedy, margins = oracle[name]
    bound = BOUND[CASES[name][1]]
    llm = Llama(model_path=str(path), n_ctx=N_CTX, logits_all=True, verbose=False, device=family, n_gpu_layers=-1)
    try:
        llm.eval(PROMPT)
        got = np.array(llm.scores[:len(PROMPT)])
        err = nmse(got, ref)
        assert err <= bound, f"{name} on {family}: nmse {err:.2e} > {bound:g}"

        def step(toks):
            llm.eval(toks)
            return np.array(llm.scores[llm.n_tokens - 1])

        llm.reset()
        toks, _, _ = _greedy(step, PROMPT, N_GREEDY)
    finally:
        llm.close()
    clear = 4 * math.sqrt(bound) * float(np.sqrt(np.mean(ref ** 2)))  # margin beyond the allowed error
    for i, (want, have, margin) in enumerate(zip(greedy, toks, margins)):
        if margin <= clear:
            break  # a near tie: later tokens may legitimately differ
        assert have == want, f"{name} on {family}: greedy token {i} is {have}, llama.cpp {want} (margin {margin:.3g})"


@pytest.mark.parametrize("name", ["qwen2-F32", "qwen3-Q8_0-tied", "llama-yarn-F32", "llama-rope_freqs-Q8_0-tied"])
def test_prompt_in_n_batch_chunks(oracle, family, name):
    path, ref, _, _ = oracle[name]
    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=5, logits_all=True, verbose=False, device=family,
                n_gpu_layers=-1)
    try:
        llm.eval(PROMPT)  # 19 tokens: chunks of 5, 5, 5, 4
        got = np.array(llm.scores[:len(PROMPT)])
    finally:
        llm.close()
    assert nmse(got, ref) <= BOUND[CASES[name][1]]


# -- CLI -----------------------------------------------------------------------


def cooktop(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, encoding="utf-8")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_synth_info_run_with_a_bpe_vocabulary(shared, tmp_path, arch):
    """``cooktop synth --arch A --vocab qwen2`` writes a model llama.cpp's Qwen vocabulary; info and run work."""
    vocab = shared / "vocab" / "ggml-vocab-qwen2.gguf"
    path = tmp_path / f"{arch}.gguf"
    r = cooktop("synth", "--arch", arch, "--n-embd", "64", "--n-layer", "1", "--n-head", "4", "--n-head-kv", "2",
                "--n-ff", "64", "--type", "Q8_0", "--vocab", str(vocab), "-o", str(path))
    assert r.returncode == 0, r.stderr
    gf = open_gguf(path)
    assert gf.metadata["tokenizer.ggml.model"] == "gpt2" and gf.metadata["tokenizer.ggml.pre"] == "qwen2"
    cfg = load_config(gf)
    assert cfg.arch == arch and cfg.n_vocab == len(gf.metadata["tokenizer.ggml.tokens"]) > 150000
    r = cooktop("info", str(path))
    assert r.returncode == 0, r.stderr
    assert arch in r.stdout
    r = cooktop("run", "-m", str(path), "-p", "Hello, world", "-n", "4", "--temp", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Hello, world")


def test_info_shows_the_rope_scaling(tmp_path):
    path = tmp_path / "yarn.gguf"
    synth.write(path, dataclasses.replace(TINY, rope_scaling="yarn", rope_scaling_factor=4.0, n_ctx_orig=16), "F32")
    r = cooktop("info", str(path))
    assert r.returncode == 0, r.stderr
    assert "yarn" in r.stdout and "0.25" in r.stdout


def test_plan_keeps_qwen2_blocks_on_the_host_without_add_bias(tmp_path):
    path = tmp_path / "q.gguf"
    synth.write(path, dataclasses.replace(TINY, arch="qwen2"), "Q8_0")
    gf = open_gguf(path)
    p = plan(gf, load_config(gf), ["fake:0"], -1, None,
             lambda sel, op, ty, **dims: "fake:0 cannot run add_bias" if op == "add_bias" else "")
    assert p.blocks == ["cpu", "cpu"] and p.head == "cpu"
    assert p.notes[:2] == [f"block {i} stays on cpu: fake:0 cannot run add_bias" for i in range(2)]


# -- hyper-parameters and refusals --------------------------------------------------


@pytest.mark.parametrize("kw,want", [
    ({}, dict(rope_scaling_type="linear", rope_freq_scale=1.0, rope_ext_factor=0.0, rope_attn_factor=1.0,
              n_ctx_orig_yarn=N_CTX)),
    ({"rope_scaling_factor": 4.0}, dict(rope_scaling_type="linear", rope_freq_scale=0.25, rope_ext_factor=0.0)),
    ({"rope_scaling": "none", "rope_scaling_factor": 4.0}, dict(rope_scaling_type="none", rope_freq_scale=1.0)),
    ({"rope_scaling": "yarn", "rope_scaling_factor": 4.0, "n_ctx_orig": 16},
     dict(rope_scaling_type="yarn", rope_freq_scale=0.25, rope_ext_factor=1.0, rope_attn_factor=1.0,
          n_ctx_orig_yarn=16)),
])
def test_rope_scaling_hparams_as_llama_cpp(tmp_path, kw, want):
    path = tmp_path / "m.gguf"
    synth.write(path, dataclasses.replace(TINY, **kw), "F32")
    cfg = load_config(open_gguf(path))
    for k, v in want.items():
        assert getattr(cfg, k) == pytest.approx(v) if isinstance(v, float) else getattr(cfg, k) == v, k


def test_unknown_rope_scaling_type_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    synth.write(path, TINY, "F32")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", extra_kv=[("llama.rope.scaling.type", "dynamic",
                                                                GGUFValueType.STRING)])
    with pytest.raises(UnsupportedModelError, match="rope scaling type 'dynamic'.*not supported"):
        load_config(open_gguf(bad))


def test_qwen2_without_rms_epsilon_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    synth.write(path, dataclasses.replace(TINY, arch="qwen2"), "F32")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", drop=["qwen2.attention.layer_norm_rms_epsilon"])
    with pytest.raises(UnsupportedModelError, match="missing required metadata key "
                                                    "'qwen2.attention.layer_norm_rms_epsilon'"):
        load_config(open_gguf(bad))


@pytest.mark.parametrize("arch,name,what", [
    ("qwen2", "blk.0.attn_qkv.weight", "does not use"),  # a fused QKV weight
    ("qwen3", "blk.0.attn_q.bias", "a bias"),
    ("qwen2", "rope_freqs.weight", "rope frequency factors"),
])
def test_tensors_the_architecture_does_not_read_are_refused(tmp_path, arch, name, what):
    path = tmp_path / "m.gguf"
    synth.write(path, dataclasses.replace(TINY, arch=arch, head_dim=16), "F32")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", add={name: (np.ones(8, np.float32), None)})
    with pytest.raises(UnsupportedModelError, match=what):
        load_config(open_gguf(bad))


def test_qwen3_q_norm_of_the_wrong_width_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    synth.write(path, dataclasses.replace(TINY, arch="qwen3", head_dim=32), "F32")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", replace={"blk.1.attn_q_norm.weight":
                                                             (np.ones(16, np.float32), None)})
    with pytest.raises(UnsupportedModelError, match=r"'blk.1.attn_q_norm.weight' has shape \[16\].*implies \[32\]"):
        load_config(open_gguf(bad))
