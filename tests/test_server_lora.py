"""llama-server's LoRA endpoints and fields (``server/lora_api.py``): ``GET``/``POST /lora-adapters``
and a request's ``lora`` on ``/completion`` and ``/v1/chat/completions``, on a server of two slots.

The tiny synthetic model and adapter of tests/test_lora.py (checked against llama.cpp there); the
expected greedy texts come from :class:`cooktop.Llama` at scale 1 (the adapter) and 0 (the base).
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from serverutil import RunningServer

from cooktop import Llama
from cooktop.tools import synth, synth_lora

SHAPE = synth.Shape(64, 2, 4, 2, 96, 300, 256)
PROMPT = [int(t) for t in np.random.default_rng(2).integers(3, 300, 9)]
N = 8
#: a generation long enough to be running while a test changes the scale
N_LONG = 160


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_server")
    model, adapter = d / "base.gguf", d / "adapter.gguf"
    synth.write(model, SHAPE, "F32", seed=3, scales={"attn_q": 0.2, "attn_k": 0.2})
    synth_lora.write_adapter(adapter, model, rank=4, alpha=8.0, seed=1, std=0.1)
    return model, adapter


@pytest.fixture(scope="module")
def expected(files):
    """Greedy text of PROMPT at scales 1 and 0 (one cooktop load)."""
    model, adapter = files
    llm = Llama(model_path=str(model), lora_path=str(adapter), n_ctx=256, verbose=False, device="cpu")
    out = {}
    try:
        for s in (1.0, 0.0):
            llm.set_lora_adapters([{"id": 0, "scale": s}])
            llm.reset()
            out[s] = llm.create_completion(PROMPT, max_tokens=N, temperature=0)["choices"][0]["text"]
    finally:
        llm.close()
    assert out[1.0] != out[0.0]  # the adapter changes the answer
    return out


@pytest.fixture(scope="module")
def http(files, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    model, adapter = files
    s = RunningServer(ServerConfig(str(model), n_parallel=2, llama_kwargs=dict(
        n_ctx=256, device="cpu", chat_template="chatml", lora_adapters=[(str(adapter), 1.0)])))
    with httpx.Client(base_url=s.base, timeout=120) as c:
        yield c
    s.stop()


def complete(http, **body) -> str:
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": N, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["content"]


def test_generation_settings_echo_the_request_lora(http):
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 1, "lora": [{"id": 0, "scale": 0.25}]})
    assert r.json()["generation_settings"]["lora"] == [{"id": 0, "scale": 0.25}]
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 1})
    assert r.json()["generation_settings"]["lora"] == []


def set_scale(http, scale: float) -> None:
    r = http.post("/lora-adapters", json=[{"id": 0, "scale": scale}])
    assert r.status_code == 200 and r.json() == {"success": True}, r.text


def test_get_lists_the_adapters(http, files):
    r = http.get("/lora-adapters")
    assert r.status_code == 200
    assert r.json() == [{"id": 0, "path": str(files[1]), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]


def test_request_field_and_post_set_the_scales(http, expected):
    assert complete(http) == expected[1.0]
    assert complete(http, lora=[{"id": 0, "scale": 0.0}]) == expected[0.0]
    assert complete(http, lora=[]) == expected[1.0]  # empty: the server's scales (llama-server)
    assert complete(http) == expected[1.0]  # a request's lora does not stay (nor its cached prefix)
    set_scale(http, 0.0)
    try:
        assert http.get("/lora-adapters").json()[0]["scale"] == 0.0
        assert complete(http) == expected[0.0]
        assert complete(http, lora=[{"id": 0, "scale": 1}]) == expected[1.0]
    finally:
        set_scale(http, 1.0)
    assert complete(http) == expected[1.0]


def test_chat_takes_the_lora_field(http):
    def chat(**kw) -> str:
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": N, "temperature": 0, **kw})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    full, base = chat(), chat(lora=[{"id": 0, "scale": 0}])
    assert full != base
    set_scale(http, 0.0)
    try:
        assert chat() == base
    finally:
        set_scale(http, 1.0)


def test_post_does_not_change_a_request_in_flight(http, expected):
    """A streamed request still running (``/slots`` says so) when the scale changes keeps its scale."""
    long = {"prompt": PROMPT, "n_predict": N_LONG, "temperature": 0, "ignore_eos": True}
    want = complete(http, **{k: v for k, v in long.items() if k != "prompt"})
    with http.stream("POST", "/completion", json={**long, "stream": True}) as r:
        lines = r.iter_lines()
        text = []
        for line in lines:
            if line.startswith("data: "):
                text.append(json.loads(line[6:])["content"])
                break
        set_scale(http, 0.0)  # after the request started: the next ones get it
        try:
            busy = any(s["is_processing"] for s in http.get("/slots").json())
            for line in lines:
                if line.startswith("data: "):
                    text.append(json.loads(line[6:])["content"])
            assert complete(http) == expected[0.0]
        finally:
            set_scale(http, 1.0)
    assert busy, "the streamed request had finished before the scale changed"
    assert "".join(text) == want


def test_concurrent_requests_with_different_scales(http, expected):
    """Two slots at once, one at each scale: they never share a forward pass (engine/batch.py)."""
    got: dict[float, list[str]] = {0.0: [], 1.0: []}

    def one(s: float) -> None:
        for _ in range(2):
            got[s].append(complete(http, lora=[{"id": 0, "scale": s}]))

    threads = [threading.Thread(target=one, args=(s,)) for s in (0.0, 1.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {0.0: [expected[0.0]] * 2, 1.0: [expected[1.0]] * 2}


@pytest.mark.parametrize("body, where", [
    ({"lora": [{"id": 3, "scale": 1}]}, "id 3 is invalid"),
    ({"lora": [{"id": 0, "scale": "x"}]}, "must be a number"),
    ({"lora": "adapter"}, "must be a list"),
])
def test_bad_lora_fields_are_400(http, body, where):
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 1, **body})
    assert r.status_code == 400 and where in r.text and "lora" in r.text, r.text


def test_bad_post_bodies_are_400(http):
    r = http.post("/lora-adapters", json={"id": 0, "scale": 1})
    assert r.status_code == 400 and "must be an array" in r.text
    r = http.post("/lora-adapters", json=[{"id": 9, "scale": 1}])
    assert r.status_code == 400 and "id 9 is invalid" in r.text
    assert http.get("/lora-adapters").json()[0]["scale"] == 1.0
