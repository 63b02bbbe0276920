"""End to end against llama.cpp's own outputs (../shared/reference), on every device backend.

Bounds (shared/reference/README.md): stories260K logits nmse
<= 1e-6 and the exact greedy continuation; tiny-F32/F16 <= 5e-6; quantized
tiny models <= 3e-3 (llama.cpp quantizes activations to 8 bits), the K-quants on OpenCL
<= 1e-3 (they quantize activations as llama.cpp does, to block_q8_K).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED, open_family_device

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse

TINY = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"]
FAMILIES = list(registry.FAMILIES)


def bound(name: str, family: str = "cpu") -> float:
    if name == "stories260K":
        return 1e-6
    if name in ("tiny-F32", "tiny-F16"):
        return 5e-6
    if family == "opencl" and "_K" in name:  # llama.cpp's block_q8_K activations, as llama.cpp (7.4e-4 measured)
        return 1e-3
    return 3e-3


def model_path(name: str):
    return SHARED / "models" / (f"{name}.gguf" if name == "stories260K" else f"tiny/{name}.gguf")


def load_ref(name: str):
    with open(SHARED / "reference" / f"{name}.json") as f:
        ref = json.load(f)
    return ref, np.load(SHARED / "reference" / f"{name}.npz")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, shared):
    if request.param != "cpu":
        open_family_device(request.param)  # skip (or fail under COOKTOP_REQUIRE) when unusable
    return request.param


@pytest.mark.parametrize("name", ["stories260K"] + [f"tiny-{t}" for t in TINY])
def test_logits_match_llama_cpp(family, name):
    """API path: eval(prompt + greedy) with logits_all, every position within the bound."""
    ref, npz = load_ref(name)
    llm = Llama(model_path=str(model_path(name)), n_ctx=512, logits_all=True, verbose=False,
                device=family, n_gpu_layers=-1)
    try:
        if family != "cpu":
            assert llm._engine.placement.n_offloaded() == llm._engine.cfg.n_layer + 1, \
                llm._engine.placement.notes
        for case in ref["cases"]:
            assert llm.tokenize(case["prompt"].encode(), add_bos=True) == case["prompt_tokens"]
            llm.reset()
            toks = case["prompt_tokens"] + case["greedy_tokens"]
            llm.eval(toks)
            got = llm.scores
            want = npz[case["logits_key"]]
            assert got.shape == want.shape
            err = nmse(got, want)
            assert err <= bound(name, family), f"{name} on {family}: nmse {err:.3e} > {bound(name, family):.0e}"
            if name == "stories260K":
                n_p = len(case["prompt_tokens"])
                assert got[n_p - 1:-1].argmax(1).tolist() == case["greedy_tokens"]
    finally:
        llm.close()


def test_greedy_continuation_stories(family, stories):
    """create_completion at temperature 0 reproduces llama.cpp's 64 tokens and text exactly."""
    ref, _ = load_ref("stories260K")
    case = ref["cases"][0]
    llm = Llama(model_path=str(stories), n_ctx=512, verbose=False, device=family, n_gpu_layers=-1)
    out = llm.create_completion(case["prompt"], max_tokens=len(case["greedy_tokens"]), temperature=0)
    assert out["choices"][0]["text"] == case["greedy_text"]
    assert out["usage"]["completion_tokens"] == len(case["greedy_tokens"])
    assert out["usage"]["prompt_tokens"] == len(case["prompt_tokens"])
    assert out["choices"][0]["finish_reason"] == "length"
    assert llm._last.tokens == case["greedy_tokens"]
    llm.close()


@pytest.mark.parametrize("name", ["stories260K", "tiny-Q4_K_M"])
def test_chunked_prefill_matches_llama_cpp(family, name):
    """Prompt evaluated in chunks of 5 (n_past > 0 with n > 1 per forward) still matches the reference."""
    ref, npz = load_ref(name)
    case = ref["cases"][0]
    llm = Llama(model_path=str(model_path(name)), n_ctx=512, n_batch=5, logits_all=True, verbose=False,
                device=family, n_gpu_layers=-1)
    llm.eval(case["prompt_tokens"] + case["greedy_tokens"])
    err = nmse(llm.scores, npz[case["logits_key"]])
    llm.close()
    assert err <= bound(name), f"{name} on {family} in chunks of 5: nmse {err:.3e}"
