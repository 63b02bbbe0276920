"""The server on a hybrid model (lfm2: recurrent convolution states beside the KV cache): concurrent
requests in shared forward passes each answer as alone, and a repeated prompt reuses its slot's
state checkpoint (only the last token is read again) with the same answer."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import pytest
from serverutil import RunningServer

from cooktop.tools import synth

SHAPE = dataclasses.replace(synth.SHAPES["lfm2-1.2b"], n_embd=64, n_layer=4, n_head=4, n_head_kv=2, n_ff=96,
                            n_vocab=300, n_ctx_train=1024, attn_layers=(1, 3))
PROMPTS = ["the cat", "a dog ran", "on", "she said to him", "it was a day", "big red", "go home now", "why"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory, server_deps):
    from cooktop.server.app import ServerConfig
    p = tmp_path_factory.mktemp("hybrid") / "lfm2.gguf"
    synth.write(p, SHAPE, "F32", seed=3)
    s = RunningServer(ServerConfig(str(p), llama_kwargs=dict(n_ctx=1024, device="cpu"), n_parallel=8))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(srv):
    import httpx
    with httpx.Client(base_url=srv.base, timeout=120) as c:
        yield c


def _ask(http, prompt: str, **kw) -> dict:
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_eight_concurrent_requests_each_equal_alone(srv, http):
    alone = {p: _ask(http, p, cache_prompt=False)["choices"][0]["text"] for p in PROMPTS}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: _ask(http, p)["choices"][0]["text"], PROMPTS))
    assert got == [alone[p] for p in PROMPTS]
    assert srv.state.scheduler.driver.stats.max_seqs > 1  # slots decoded in shared forward passes


def test_a_repeated_prompt_reuses_the_state_checkpoint(http):
    prompt = "once there was a little girl who went"
    first = _ask(http, prompt)
    again = _ask(http, prompt)
    assert again["timings"]["prompt_n"] == 1  # the checkpoint before the last token
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    whole = _ask(http, prompt, cache_prompt=False)
    assert whole["timings"]["prompt_n"] == whole["usage"]["prompt_tokens"]
    assert whole["choices"][0]["text"] == first["choices"][0]["text"]
