"""The Llama facade: llama-cpp-python semantics of scores, eval, reset and errors."""

from __future__ import annotations

import numpy as np
import pytest

from cooktop import Llama
from cooktop.errors import ContextOverflowError, CooktopError
from cooktop.text.tokenizer import InvalidTokenError

PROMPT = "Once upon a time"


@pytest.fixture()
def llm(stories):
    m = Llama(model_path=str(stories), n_ctx=64, n_batch=4, verbose=False, device="cpu")
    yield m
    m.close()


def test_scores_without_logits_all(llm, stories):
    toks = llm.tokenize(PROMPT.encode())
    llm.eval(toks)
    s = llm.scores
    assert s.shape == (len(toks), llm.n_vocab())
    # only the last token of each chunk of n_batch = 4 has logits; the rest are zero
    filled = [i for i in range(len(toks)) if np.any(s[i])]
    assert filled == [3, len(toks) - 1]
    full = Llama(model_path=str(stories), n_ctx=64, logits_all=True, verbose=False, device="cpu")
    full.eval(toks)
    np.testing.assert_allclose(s[-1], full.scores[-1], rtol=1e-5, atol=1e-5)
    full.close()


def test_scores_follow_completion_and_reset(llm):
    out = llm.create_completion(PROMPT, max_tokens=4, temperature=0)
    n = out["usage"]["total_tokens"]
    assert llm.n_tokens == n - 1  # the last generated token is sampled, not evaluated
    s = llm.scores
    assert s.shape[0] == llm.n_tokens and np.any(s[-1])
    assert int(np.argmax(s[-1])) == llm._last.tokens[-1]
    llm.reset()
    assert llm.scores.shape[0] == 0
    llm.eval([1])
    assert llm.scores.shape[0] == 1 and np.any(llm.scores[0])
    assert not np.any(llm._scores[1:])  # nothing stale past the context


def test_eval_errors(llm):
    with pytest.raises(InvalidTokenError, match="out of range"):
        llm.eval([1, 99999])
    with pytest.raises(InvalidTokenError):
        llm.eval([])
    with pytest.raises(ContextOverflowError, match="n_ctx"):
        llm.eval(list(range(3, 70)))
    llm.reset()
    every = llm._engine.eval([1, 403, 407], logits_all=True)  # without logits_all: through the output rows
    llm.reset()
    last = llm._engine.eval([1, 403, 407])
    assert every.shape == (3, llm.n_vocab()) and np.allclose(every[-1], last[-1], atol=1e-5)
    llm.reset()
    assert isinstance(InvalidTokenError("x"), CooktopError)


@pytest.mark.parametrize("kwargs,word", [(dict(n_ctx=-7), "n_ctx"), (dict(n_batch=0), "n_batch"),
                                         (dict(n_gpu_layers="x"), "n_gpu_layers")])
def test_bad_constructor_arguments(stories, kwargs, word):
    with pytest.raises(CooktopError, match=word):
        Llama(model_path=str(stories), verbose=False, **kwargs)


def test_bad_sampling_arguments(llm):
    with pytest.raises(CooktopError, match="top_p"):
        llm.create_completion(PROMPT, top_p=2.0)
    with pytest.raises(CooktopError, match="repeat_penalty"):
        llm.create_completion(PROMPT, repeat_penalty=0.0)


def test_f16_norm_weights_are_converted(tmp_path):
    """A model whose 1-D norm weights are F16 runs and matches the same model with F32 norms."""
    from gguf import GGMLQuantizationType as T

    from cooktop.tools import synth

    shape = synth.Shape(64, 2, 4, 2, 128, 300, 128)
    names = ["output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(2) for n in ("attn_norm", "ffn_norm")]
    a, b = tmp_path / "f32norm.gguf", tmp_path / "f16norm.gguf"
    synth.write(a, shape, "F32", seed=5)
    synth.write(b, shape, "F32", seed=5, overrides={n: T.F16 for n in names})
    outs = []
    for p in (a, b):
        m = Llama(model_path=str(p), n_ctx=32, logits_all=True, verbose=False, device="cpu")
        m.eval([1, 5, 7, 9])
        outs.append(m.scores.copy())
        m.close()
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_suspended_stream_refuses_to_resume_after_another_completion(llm):
    """A half-consumed stream must not silently continue from another completion's state."""
    stream = llm.create_completion("One day", max_tokens=16, temperature=0, stream=True)
    next(stream), next(stream)
    other = llm.create_completion(PROMPT, max_tokens=4, temperature=0)
    assert other["choices"][0]["text"]
    with pytest.raises(CooktopError, match="interrupted"):
        list(stream)
    # a fresh stream is fine and equals the non-streamed text
    text = "".join(c["choices"][0]["text"] for c in llm.create_completion("One day", max_tokens=8, temperature=0,
                                                                           stream=True))
    assert text == llm.create_completion("One day", max_tokens=8, temperature=0)["choices"][0]["text"]
