"""gemma3 and phi3 end to end against llama.cpp (llama-cpp-python at test time), on every backend.

Tiny synthetic models (``tools/synth.py``) in F32 and one quantized type; the bounds are
the issue's: logits nmse <= 5e-6 (F32) and <= 3e-3 (quantized), and the greedy
continuation equal wherever llama.cpp's top-2 margin is clear of the numerical error.

- gemma3: head_dim 48 with n_head 4 (n_head * head_dim != n_embd, like Gemma 3), a sliding
  window of 8 tokens on 2 of every 3 layers with its own rope base, a 40-token prompt
  (longer than the window) evaluated in chunks of 7 (llama.cpp: 16).
- phi3: fused ``attn_qkv`` and ``ffn_up``, LongRoPE factors with an original context of 256:
  n_ctx 128 selects the short factors, n_ctx 300 (padded to 512 by llama.cpp) the long ones.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED, open_family_device, rewrite_gguf, skip_or_fail

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.errors import UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.arch import ARCHITECTURES
from cooktop.model.arch.base import BLOCK, HEAD, INPUT, MATRIX, NORM
from cooktop.model.arch.gemma3 import swa_pattern
from cooktop.model.config import load_config
from cooktop.tools import synth

GEMMA3 = synth.Shape(n_embd=64, n_layer=3, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=256,
                     rope_freq_base=1e6, tied=True, head_dim=48, arch="gemma3", n_swa=8, swa_pattern=3,
                     rope_freq_base_swa=10000.0)
PHI3 = synth.Shape(n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=96, n_vocab=300, n_ctx_train=1024,
                   tied=True, arch="phi3", long_rope=True, n_ctx_orig=256)
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 40)]
#: (arch, file type, n_ctx, cooktop n_batch)
CASES = [("gemma3", "F32", 128, 7), ("gemma3", "Q8_0", 128, 7),
         ("phi3", "F32", 128, 16), ("phi3", "Q4_0", 128, 16), ("phi3", "F32", 300, 16)]
N_GREEDY = 6


def bound(ft: str) -> float:
    return 5e-6 if ft == "F32" else 3e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    out = {}
    for arch, ft, _, _ in CASES:
        if (arch, ft) not in out:
            p = d / f"{arch}-{ft}.gguf"
            synth.write(p, GEMMA3 if arch == "gemma3" else PHI3, ft, seed=3)
            out[arch, ft] = p
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
    """llama.cpp's logits and greedy continuation per case (computed once)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    refs = {}
    for arch, ft, n_ctx, _ in CASES:
        llm = llama_cpp.Llama(model_path=str(models[arch, ft]), logits_all=True, n_ctx=n_ctx, n_batch=16,
                              n_ubatch=16, verbose=False)
        refs[arch, ft, n_ctx] = _greedy(llm, PROMPT, N_GREEDY)
        llm.close()
    return refs


@pytest.fixture(scope="module", params=list(registry.FAMILIES))
def family(request):
    if request.param != "cpu":
        open_family_device(request.param)
    return request.param


@pytest.mark.parametrize("arch,ft,n_ctx,n_batch", CASES)
def test_logits_and_greedy_match_llama_cpp(family, models, reference, arch, ft, n_ctx, n_batch):
    ref_logits, ref_tokens, margins = reference[arch, ft, n_ctx]
    llm = Llama(model_path=str(models[arch, ft]), n_ctx=n_ctx, n_batch=n_batch, logits_all=True, verbose=False,
                device=family, n_gpu_layers=-1)
    try:
        if family != "cpu":
            pl = llm._engine.placement
            assert pl.n_offloaded() == llm._engine.cfg.n_layer + 1, pl.notes
        logits, tokens, _ = _greedy(llm, PROMPT, N_GREEDY)
    finally:
        llm.close()
    assert nmse(logits, ref_logits) <= bound(ft)
    scale = float(np.abs(ref_logits).max())
    for got, want, margin in zip(tokens, ref_tokens, margins):
        if margin < 1e-2 * scale:  # not clear of the numerical error: the continuations may part here
            break
        assert got == want


def test_phi3_long_and_short_factors_differ(models, reference):
    """n_ctx 128 and 300 pick different LongRoPE factors in llama.cpp, and the two differ by more
    than the F32 bound, so the test above (which matches both) tells the choices apart."""
    short, long = reference["phi3", "F32", 128][0], reference["phi3", "F32", 300][0]
    assert nmse(short, long) > 4 * bound("F32")


# -- descriptors, hyper-parameters, synth, CLI ------------------------------------------
def test_gemma3_descriptor_matches_llama_cpp():
    cfg = synth.config(GEMMA3)
    a = ARCHITECTURES["gemma3"]
    got = {s.name: (s.unit, s.kind, s.required, s.shape(cfg)) for s in a.tensors}
    E, Q, K, F, V, D = 64, 192, 96, 96, 300, 48
    assert got == {
        "token_embd.weight": (INPUT, MATRIX, True, (V, E)),
        "output_norm.weight": (HEAD, NORM, True, (E,)),
        "output.weight": (HEAD, MATRIX, False, (V, E)),
        "blk.{i}.attn_norm.weight": (BLOCK, NORM, True, (E,)),
        "blk.{i}.attn_q.weight": (BLOCK, MATRIX, True, (Q, E)),
        "blk.{i}.attn_k.weight": (BLOCK, MATRIX, True, (K, E)),
        "blk.{i}.attn_v.weight": (BLOCK, MATRIX, True, (K, E)),
        "blk.{i}.attn_output.weight": (BLOCK, MATRIX, True, (E, Q)),
        "blk.{i}.post_attention_norm.weight": (BLOCK, NORM, True, (E,)),
        "blk.{i}.attn_k_norm.weight": (BLOCK, NORM, True, (D,)),
        "blk.{i}.attn_q_norm.weight": (BLOCK, NORM, True, (D,)),
        "blk.{i}.ffn_norm.weight": (BLOCK, NORM, True, (E,)),
        "blk.{i}.ffn_gate.weight": (BLOCK, MATRIX, True, (F, E)),
        "blk.{i}.ffn_up.weight": (BLOCK, MATRIX, True, (F, E)),
        "blk.{i}.ffn_down.weight": (BLOCK, MATRIX, True, (E, F)),
        "blk.{i}.post_ffw_norm.weight": (BLOCK, NORM, True, (E,)),
    }


def test_phi3_fused_weights_are_split_into_row_ranges():
    cfg = synth.config(PHI3)
    a = ARCHITECTURES["phi3"]
    qkv, up = a.spec("blk.1.attn_qkv.weight"), a.spec("blk.0.ffn_up.weight")
    assert qkv.shape(cfg) == (64 + 2 * 64, 64) and up.shape(cfg) == (192, 64)
    assert qkv.part_rows(cfg) == [("attn_q", [(0, 64)]), ("attn_k", [(64, 128)]), ("attn_v", [(128, 192)])]
    assert up.part_rows(cfg) == [("ffn_gate", [(0, 96)]), ("ffn_up", [(96, 192)])]
    assert a.spec("rope_factors_long.weight").unit == BLOCK and not a.spec("rope_factors_long.weight").required


def test_gemma3_hparams(models):
    cfg = load_config(open_gguf(models["gemma3", "F32"]))
    assert (cfg.n_swa, cfg.swa_layers, cfg.rope_freq_base_swa, cfg.rope_freq_base) == (8, (True, True, False),
                                                                                       10000.0, 1e6)
    assert cfg.attn_scale == pytest.approx(48 ** -0.5) and cfg.head_dim == 48 and cfg.rope_mode == 2
    assert cfg.tied_output


def test_swa_pattern_as_llama_cpp():
    """llama_hparams::set_swa_pattern(n, dense_first=false): every n-th layer (il % n == n - 1) is global."""
    assert swa_pattern(8, None) == (True,) * 5 + (False, True, True)
    assert swa_pattern(4, 2) == (True, False, True, False)
    assert swa_pattern(3, 0) == (True, True, True)
    assert swa_pattern(2, [True, False]) == (True, False)


@pytest.mark.parametrize("kv,message", [
    (("gemma3.final_logit_softcapping", 30.0, "FLOAT32"),
     "gemma3.final_logit_softcapping = 30 (a tanh cap of the logits) is not implemented by cooktop"),
    (("gemma3.attention.sliding_window_pattern", -1, "INT32"),
     "metadata key 'gemma3.attention.sliding_window_pattern' = -1 is negative"),
])
def test_gemma3_refusals(models, tmp_path, kv, message):
    from gguf import GGUFValueType
    key, value, kind = kv
    bad = rewrite_gguf(models["gemma3", "F32"], tmp_path / "bad.gguf", drop=(key,),
                       extra_kv=[(key, value, getattr(GGUFValueType, kind))])
    with pytest.raises(UnsupportedModelError) as e:
        load_config(open_gguf(bad))
    assert str(e.value) == f"{bad}: {message}"


def test_synth_with_a_shared_vocabulary(tmp_path):
    vocab = SHARED / "vocab" / "ggml-vocab-llama-spm.gguf"
    if not vocab.exists():
        skip_or_fail("shared", f"no {vocab}")
    p = tmp_path / "phi3-spm.gguf"
    synth.write(p, dataclasses.replace(PHI3, long_rope=False), "Q8_0", vocab=vocab)
    llm = Llama(model_path=str(p), n_ctx=64, verbose=False)
    try:
        assert llm.n_vocab() == 32000
        assert llm.tokenize(b"Hello world", add_bos=False) == [15043, 3186]
        assert len(llm.create_completion("Hello", max_tokens=3, temperature=0)["choices"][0]["text"]) > 0
    finally:
        llm.close()


@pytest.mark.parametrize("arch", ["gemma3", "phi3"])
def test_cli_synth_info_run(tmp_path, arch):
    p = tmp_path / f"{arch}.gguf"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                              timeout=120)

    r = cli("synth", "--arch", arch, "--n-embd", "64", "--n-layer", "2", "--n-head", "4", "--n-ff", "64",
            "--n-vocab", "300", "--type", "Q8_0", "-o", str(p))
    assert r.returncode == 0, r.stderr
    n = sum(t.n_elements for t in open_gguf(p).tensors.values())
    assert f"wrote {p}: {n / 1e3:.2f} K parameters ({n:,}), Q8_0, " in r.stderr  # llama.cpp's units, not 0.00 B
    r = cli("info", str(p))
    assert r.returncode == 0, r.stderr
    assert f"architecture:   {arch}" in r.stdout and f"parameters:     {n / 1e3:.2f} K ({n:,})" in r.stdout
    r = cli("run", "-m", str(p), "-p", "hello", "-n", "4", "--temp", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("hello")


def test_cli_info_shows_the_sliding_window(models):
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "info", str(models["gemma3", "F32"])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ("sliding window: 8 tokens on 2 of 3 layers (rope_freq_base_swa 10000); full attention on layers [2]"
            in r.stdout)
