"""End to end against llama-cpp-python with the same ``type_k`` / ``type_v`` / ``flash_attn``, on every
device backend: the logits of a prompt plus a continuation (every position) within the float bound for
f32/f16/bf16 caches and the quantized bound for q8_0/q4_0, and the greedy continuation equal while
llama.cpp's top-2 margin is clear of the numerical error."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device, skip_or_fail

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.format.kvtypes import KVTypeError, T

N_CTX = 128
PROMPT = list(range(1, 40))
N_GREEDY = 12
#: (type_k, type_v, flash_attn): GGML ids (0 f32, 1 f16, 30 bf16, 8 q8_0, 2 q4_0)
CASES = [(1, 1, False), (1, 1, True), (30, 30, True), (8, 8, True), (2, 2, True), (8, 1, False)]
#: the cases the device backends run too (the parity tests of test_kv_cache.py cover every type there)
DEVICE_CASES = [(1, 1, False), (8, 8, True), (2, 2, True), (8, 1, False)]


def bound(tk: int, tv: int) -> float:
    """nmse bound: tiny-F32's float bound (5e-6, tests/test_reference.py) for f32/f16 caches, 5e-5 for
    bf16 (8-bit mantissas; llama.cpp's flash attention also rounds q to bf16); llama.cpp's
    quantized-activation bound (3e-3) for block-quantized caches."""
    if {tk, tv} <= {0, 1}:
        return 5e-6
    return 5e-5 if {tk, tv} <= {0, 1, 30} else 3e-3


def _greedy(llm):
    llm.reset()
    llm.eval(PROMPT)
    out: list[int] = []
    margins = []
    for _ in range(N_GREEDY):
        last = np.array(llm.scores[len(PROMPT) + len(out) - 1], dtype=np.float64)
        top = np.sort(last)[-2:]
        margins.append(float(top[1] - top[0]))
        out.append(int(np.argmax(last)))
        llm.eval([out[-1]])
    return np.array(llm.scores[:len(PROMPT) + N_GREEDY], dtype=np.float64), out, margins


@pytest.fixture(scope="module")
def reference(shared):
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    path = str(shared / "models" / "tiny" / "tiny-F32.gguf")
    refs = {}
    for tk, tv, fa in CASES:
        llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, logits_all=True, verbose=False, type_k=tk, type_v=tv,
                              flash_attn=fa)
        refs[tk, tv, fa] = _greedy(llm)
        llm.close()
    return path, refs


#: numpy runs every case; the devices DEVICE_CASES (kept short: test_kv_cache.py checks every type there)
PAIRS = [(f, c) for f in registry.FAMILIES for c in CASES if f == "cpu" or c in DEVICE_CASES]


@pytest.mark.parametrize("family,case", PAIRS, ids=lambda p: p if isinstance(p, str) else
                         f"k{p[0]}-v{p[1]}-fa{int(p[2])}")
def test_logits_and_greedy_match_llama_cpp(family, reference, case):
    if family != "cpu":
        open_family_device(family)
    path, refs = reference
    tk, tv, fa = case
    want, want_tokens, margins = refs[case]
    llm = Llama(model_path=path, n_ctx=N_CTX, n_batch=16, logits_all=True, verbose=False, device=family,
                n_gpu_layers=-1, type_k=tk, type_v=tv, flash_attn=fa)
    try:
        if family != "cpu":
            stores = {T(tk).name, T(tv).name} <= set(open_family_device(family).info.kv_types)
            if not stores:  # the blocks stay on the host, saying why
                assert "KV cache" in " ".join(llm._engine.placement.notes)
                return
        assert llm._engine.placement.n_offloaded() == (0 if family == "cpu" else 3), llm._engine.placement.notes
        llm.eval(PROMPT + want_tokens)  # llama.cpp's continuation: the same rows on both sides
        got = np.array(llm.scores[:len(PROMPT) + N_GREEDY], dtype=np.float64)
    finally:
        llm.close()
    err = nmse(got, want)
    assert err <= bound(tk, tv), f"{case} on {family}: nmse {err:.2e}"
    scale = float(np.abs(want).max())
    tokens = got[len(PROMPT) - 1:-1].argmax(1).tolist()  # greedy choices after each row
    for g, w, m in zip(tokens, want_tokens, margins):
        if m < 1e-2 * scale:  # not clear of the numerical error: the continuations may part here
            break
        assert g == w


def test_quantized_v_needs_flash_attention(reference):
    """llama-cpp-python's flash_attn=False is llama.cpp's disabled: a quantized V cache is refused."""
    path, _ = reference
    with pytest.raises(KVTypeError, match="requires flash attention"):
        Llama(model_path=path, n_ctx=N_CTX, verbose=False, device="cpu", type_k=8, type_v=8)


def test_serve_uses_the_cache_types(reference, server_deps):
    """``cooktop serve -ctk q8_0 -ctv q8_0`` (ServerConfig's llama_kwargs, as cli/serve.py builds them): the
    served model's cache is q8_0 and a greedy completion equals the API's with the same types."""
    import httpx
    from serverutil import RunningServer

    from cooktop.cli.common import kv_kwargs
    from cooktop.format.kvtypes import KVConfig
    from cooktop.server.app import ServerConfig

    path, _ = reference
    kw = dict(n_ctx=N_CTX, device="cpu", **kv_kwargs(KVConfig.parse("q8_0", "q8_0", "auto")))
    srv = RunningServer(ServerConfig(path, llama_kwargs=kw))
    try:
        r = httpx.post(f"{srv.base}/v1/completions", json={"prompt": "Once upon", "max_tokens": 6,
                                                           "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        served = r.json()["choices"][0]["text"]
    finally:
        srv.stop()
    llm = Llama(model_path=path, verbose=False, **kw)
    try:
        assert llm._engine.model.kv.type_v == T.Q8_0
        assert llm.create_completion("Once upon", max_tokens=6, temperature=0)["choices"][0]["text"] == served
    finally:
        llm.close()


@pytest.mark.parametrize("family", registry.DEVICE_FAMILIES)
def test_flash_attention_off_is_on(shared, family):
    """``-fa off`` (scores materialised, softmax, then V) and ``-fa on`` (the fused kernel) on one device: the
    logits of a prompt and its continuation within the float bound of each other, the greedy tokens equal."""
    open_family_device(family)
    path = str(shared / "models" / "tiny" / "tiny-F32.gguf")
    runs = []
    for fa in (True, False):
        llm = Llama(model_path=path, n_ctx=64, n_batch=16, logits_all=True, verbose=False, device=family,
                    n_gpu_layers=-1, type_k=8, type_v=1, flash_attn=fa)
        try:
            assert llm._engine.model.flash_attn is fa
            toks = llm.tokenize(b"Once upon a time", add_bos=True)
            out: list[int] = []
            llm.eval(toks)
            for _ in range(8):
                out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
                llm.eval([out[-1]])
            runs.append((np.array(llm.scores[:llm.n_tokens], dtype=np.float64), out))
        finally:
            llm.close()
    (on, tok_on), (off, tok_off) = runs
    assert nmse(off, on) < 1e-8, nmse(off, on)  # float32 summation orders only (1e-9 seen): far under 5e-6
    assert tok_on == tok_off
