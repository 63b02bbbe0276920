"""Shared steps of the dense-family tests (tests/test_arch_smollm3.py, test_arch_mistral3.py,
test_arch_glm4.py): synthesize a family's tiny models once, take llama.cpp's logits and greedy
continuation (llama-cpp-python at test time), and compare cooktop's on a device family.

Each test file keeps its own module-scoped fixtures and calls these; the bounds are the brief's:
logits nmse <= 1e-5 (F32) and <= 3e-3 (quantized), and the greedy continuation equal wherever
llama.cpp's top-2 margin is clear of the numerical error.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
from conftest import skip_or_fail

from cooktop import Llama
from cooktop.backends.base import nmse
from cooktop.tools import synth

#: 21 prompt tokens: three chunks of 7 in cooktop (one chunk size, so lavapipe builds one set of
#: prompt pipelines), two of 16 in llama.cpp
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 21)]
N_BATCH = 7
N_GREEDY = 4
#: sharper attention so that positions (rope, its absence on NoPE blocks) visibly change the logits
SCALES = {"attn_q": 0.2, "attn_k": 0.2}


def bound(ft: str) -> float:
    """The logits' nmse bound of file type ``ft`` against llama.cpp."""
    return 1e-5 if ft == "F32" else 3e-3


def write_models(d: pathlib.Path, arch: str, cases: dict[str, tuple[synth.Shape, str]]) -> dict[str, pathlib.Path]:
    """Synthesize each case ``name -> (shape, file type)`` once under ``d``; returns name -> path."""
    out = {}
    for name, (shape, ft) in cases.items():
        p = d / f"{arch}-{name}.gguf"
        synth.write(p, shape, ft, seed=3, scales=SCALES)
        out[name] = p
    return out


def greedy(llm, tokens: list[int], n: int) -> tuple[np.ndarray, list[int], list[float]]:
    """Logits of ``tokens`` (every position) from a reset ``llm`` (cooktop's or llama-cpp-python's
    ``Llama``), then ``n`` greedy steps: (logits float64 [len, n_vocab], tokens, top-2 margins)."""
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


def llama_cpp_reference(paths: dict[str, pathlib.Path], n_ctx: int) -> dict[str, tuple]:
    """llama.cpp's :func:`greedy` of :data:`PROMPT` for each model (one load each, n_batch 16)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    refs = {}
    for name, p in paths.items():
        llm = llama_cpp.Llama(model_path=str(p), logits_all=True, n_ctx=n_ctx, n_batch=16, n_ubatch=16,
                              verbose=False)
        try:
            refs[name] = greedy(llm, PROMPT, N_GREEDY)
        finally:
            llm.close()
    return refs


def check_against_llama_cpp(path: pathlib.Path, ref: tuple, ft: str, family: str, n_ctx: int,
                            n_greedy: int = N_GREEDY, label: str = "") -> float:
    """Run :data:`PROMPT` in chunks of :data:`N_BATCH` on ``family`` (every block and the head on
    it), assert the logits within :func:`bound` of llama.cpp's and the first ``n_greedy`` greedy
    tokens equal while llama.cpp's margin is clear; returns the nmse."""
    ref_logits, ref_tokens, margins = ref
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=N_BATCH, logits_all=True, verbose=False,
                device=family, n_gpu_layers=-1)
    try:
        if family != "cpu":
            pl = llm._engine.placement
            assert pl.n_offloaded() == llm._engine.cfg.n_layer + 1, pl.notes
        logits, tokens, _ = greedy(llm, PROMPT, n_greedy)
    finally:
        llm.close()
    err = nmse(logits, ref_logits)
    print(f"{label} {ft} on {family}: nmse {err:.3g} vs llama.cpp")
    assert err <= bound(ft), f"{label} {ft} on {family}: nmse {err:.3g} > {bound(ft):g}"
    clear = 4 * math.sqrt(bound(ft)) * float(np.sqrt(np.mean(ref_logits ** 2)))
    for i, (got, want, margin) in enumerate(zip(tokens, ref_tokens, margins)):
        if margin <= clear:  # a near tie: the continuations may part here
            break
        assert got == want, f"{label} {ft} on {family}: greedy token {i} is {got}, llama.cpp {want}"
    return err
