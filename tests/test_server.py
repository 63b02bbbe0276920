"""``cooktop serve`` driven by the official ``openai`` client and by raw HTTP (httpx) on 127.0.0.1.

One in-process server (uvicorn on a thread, ephemeral port) serves stories260K
(no chat template: the chatml fallback) for the module; others are started
for the API key, a model with a template, loading and overload cases.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import threading
import time

import pytest
from conftest import with_chat_template
from serverutil import RunningServer

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def srv(stories, server_deps):
    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), n_parallel=2,
                                   endpoint_metrics=True))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv, openai_client_dep):
    from openai import OpenAI
    c = OpenAI(api_key="unused", base_url=srv.base + "/v1", max_retries=0, timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(srv):
    import httpx
    with httpx.Client(base_url=srv.base, timeout=120) as c:
        yield c


# -- the openai client ---------------------------------------------------------------------
def test_chat_stream_equals_non_stream(client):
    kw = dict(model="stories260K.gguf", messages=CHAT, max_tokens=40, temperature=0)
    whole = client.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert len(text) > 10 and whole.usage.completion_tokens == 40 and whole.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked
    from cooktop.version import __version__  # llama-server's b<build>-<source> shape, in the stream too
    assert whole.system_fingerprint == f"b{__version__}-cooktop"
    assert chunks[0].system_fingerprint == whole.system_fingerprint


def test_chat_stream_usage_chunk_once_before_done(client, http):
    chunks = list(client.chat.completions.create(model="stories260K.gguf", messages=CHAT, max_tokens=12,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    usage = [c for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0] is chunks[-1] and chunks[-1].choices == []
    assert usage[0].usage.completion_tokens == 12 and usage[0].usage.total_tokens == usage[0].usage.prompt_tokens + 12
    raw = http.post("/v1/chat/completions", json=dict(messages=CHAT, max_tokens=5, temperature=0, stream=True,
                                                      stream_options={"include_usage": True})).text
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and '"usage"' in events[-2] and raw.count('"usage"') == 1


def test_completion_stream_and_stop_strings_never_leak(client):
    base = client.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=40, temperature=0)
    full = base.choices[0].text
    assert "Lily" in full
    stop = "Lily"
    whole = client.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=40, temperature=0,
                                      stop=[stop, "zzz"])
    text = whole.choices[0].text
    assert text == full[:full.index(stop)] and whole.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=40,
                                            temperature=0, stop=[stop, "zzz"], stream=True))
    deltas = [c.choices[0].text for c in chunks]
    assert "".join(deltas) == text
    assert stop not in "".join(deltas)


def test_n_choices(client):
    out = client.chat.completions.create(model="stories260K.gguf", messages=CHAT, max_tokens=8, temperature=0, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.message.content for c in out.choices}) == 1  # greedy: the same three times
    chunks = list(client.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=6, n=2,
                                            temperature=1.0, seed=5, stream=True))
    assert {c.choices[0].index for c in chunks} == {0, 1}


def test_logprobs(client):
    out = client.chat.completions.create(model="stories260K.gguf", messages=CHAT, max_tokens=5, temperature=0,
                                         logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert math.isclose(e.logprob, e.top_logprobs[0].logprob)  # greedy picks the most likely
    assert "".join(e.token for e in content) == out.choices[0].message.content
    comp = client.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.top_logprobs[0]) == 2 and lp.text_offset[0] == 0


def test_embeddings(client):
    out = client.embeddings.create(model="stories260K.gguf", input=["a cat", "a dog sat"])
    assert [d.index for d in out.data] == [0, 1]
    for d in out.data:
        assert len(d.embedding) == 64
        assert math.isclose(sum(x * x for x in d.embedding), 1.0, rel_tol=1e-5)
    assert out.data[0].embedding != out.data[1].embedding
    assert out.usage.prompt_tokens > 0


def test_models(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["stories260K.gguf"]


def test_json_response_format(client):
    out = client.chat.completions.create(model="stories260K.gguf", messages=CHAT, max_tokens=60, temperature=0,
                                         response_format={"type": "json_schema", "json_schema": {
                                             "name": "x", "schema": {"type": "object", "properties": {
                                                 "name": {"type": "string", "maxLength": 10}},
                                                 "required": ["name"], "additionalProperties": False}}})
    obj = json.loads(out.choices[0].message.content)
    assert list(obj) == ["name"] and isinstance(obj["name"], str)


# -- raw HTTP: llama-server endpoints and errors -----------------------------------------------
def test_health_props_metrics_tokenize(http):
    assert http.get("/health").json() == {"status": "ok"}
    props = http.get("/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    assert props["default_generation_settings"]["params"]["seed"] == 0xFFFFFFFF  # -1, random: llama.cpp's value
    assert "<|im_start|>" in props["chat_template"]
    toks = http.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    assert http.post("/detokenize", json={"tokens": toks}).json()["content"].strip() == PROMPT
    pieces = http.post("/tokenize", json={"content": PROMPT, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == toks and "".join(p["piece"] for p in pieces).strip() == PROMPT
    prompt = http.post("/apply-template", json={"messages": CHAT}).json()["prompt"]
    assert prompt == "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"
    metrics = http.get("/metrics").text
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:predicted_tokens_seconds", "llamacpp:requests_deferred", 'cooktop:requests_total{',
                 "cooktop:slots_busy", "cooktop:slots_total 2", "cooktop:batch_size", "cooktop:batch_tokens",
                 "cooktop:tokens_per_second"):
        assert name in metrics
    r = http.get("/metrics")
    assert int(r.headers["Process-Start-Time-Unix"]) > 0
    values = {ln.split()[0]: float(ln.split()[1]) for ln in r.text.splitlines() if ln.startswith("llamacpp:")}
    before = values["llamacpp:n_decode_total"]
    http.post("/completion", json={"prompt": PROMPT, "n_predict": 3, "cache_prompt": False})
    after = {ln.split()[0]: float(ln.split()[1]) for ln in http.get("/metrics").text.splitlines()
             if ln.startswith("llamacpp:")}
    assert after["llamacpp:n_decode_total"] == before + 3  # one pass for the prompt, one per later token
    assert 1 <= after["llamacpp:n_busy_slots_per_decode"] <= 2


def test_metrics_need_the_flag(stories, server_deps):
    """Without ``--metrics`` ``/metrics`` is llama-server's 501."""
    from fastapi.testclient import TestClient

    from cooktop.server.app import ServerConfig, create_app
    with TestClient(create_app(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=64, device="cpu")))) as c:
        while c.get("/health").status_code == 503:
            pass
        r = c.get("/metrics")
    assert r.status_code == 501 and "Start it with `--metrics`" in r.json()["error"]["message"]


def test_prompt_prefix_reuse_reports_cached_tokens(http):
    """A request whose prompt starts with a prompt cached in a free slot reuses it (llama-server's
    prompt cache); usage.prompt_tokens_details.cached_tokens says how many tokens."""
    system = "Once upon a time there was a little girl named Lily who loved to play in the park with her dog"
    n_sys = len(http.post("/tokenize", json={"content": system, "add_special": True}).json()["tokens"])
    first = http.post("/v1/completions", json={"prompt": system + " and", "max_tokens": 4, "temperature": 0})
    http.post("/v1/completions", json={"prompt": "Tom", "max_tokens": 2, "temperature": 0})  # the other slot
    again = http.post("/v1/completions", json={"prompt": system + " but", "max_tokens": 4, "temperature": 0})
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < n_sys
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_sys - 1


def test_empty_slot_gets_the_shared_prefix_copied(stories, server_deps):
    """A prompt sharing a prefix with a free slot whose cache that would mostly discard goes to an
    empty slot (the other prompt is kept) and reads only its own tail: the prefix's K/V cells are
    copied from the similar slot (timings.prompt_n, cached_tokens); its answer is the one it gets
    reading the whole prompt (``cache_prompt: false``)."""
    import httpx

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), n_parallel=2))
    try:
        with httpx.Client(base_url=s.base, timeout=120) as http:
            system = "Once upon a time there was a little girl"
            n_sys = len(http.post("/tokenize", json={"content": system, "add_special": True}).json()["tokens"])

            def ask(words, **kw):
                return http.post("/v1/completions", json={"prompt": system + words, "max_tokens": 3 * n_sys,
                                                          "temperature": 0, **kw}).json()

            first = ask(" named Lily")
            second = ask(" who")  # slot 0 would keep under half of its cache: the empty slot 1
            assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_sys - 1
            assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - second["timings"]["cache_n"]
            assert second["timings"]["prompt_n"] <= second["usage"]["prompt_tokens"] - n_sys + 1
            slots = http.get("/slots").json()
            assert sorted(x["id_task"] for x in slots) == sorted({x["id_task"] for x in slots})  # both used
            whole = ask(" who", cache_prompt=False)
            assert whole["timings"]["prompt_n"] == whole["usage"]["prompt_tokens"]
            assert second["choices"][0]["text"] == whole["choices"][0]["text"]
    finally:
        s.stop()


@pytest.mark.parametrize("path,body,status,words", [
    ("/v1/chat/completions", b"{not json", 400, ["not valid JSON"]),
    ("/v1/chat/completions", b"[1, 2]", 400, ["JSON object"]),
    ("/v1/chat/completions", {"messages": "hi"}, 400, ["messages"]),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": "hot"}, 400, ["temperature"]),
    ("/v1/chat/completions", {"messages": CHAT, "n": 0}, 400, ["n"]),
    ("/v1/chat/completions", {"messages": CHAT, "n": 99}, 400, ["n"]),
    ("/v1/completions", {"prompt": "word " * 400}, 400, ["n_ctx = 256", "tokens"]),
    ("/v1/completions", {"prompt": PROMPT, "grammar": "root ::= ("}, 400, ["grammar"]),
    ("/v1/completions", {"prompt": 5}, 400, ["prompt"]),
    ("/v1/embeddings", {"input": []}, 400, ["input"]),
    ("/v1/nope", {}, 404, ["/v1/nope"]),
])
def test_errors_are_openai_shaped(http, path, body, status, words):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = http.post(path, headers={"content-type": "application/json"}, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and isinstance(err["type"], str)
    for w in words:
        assert w in err["message"], err["message"]


def test_stream_error_before_first_byte_is_json(http):
    r = http.post("/v1/completions", json={"prompt": "word " * 400, "stream": True})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")


def test_client_disconnect_stops_generation(srv):
    import httpx
    sched = srv.state.scheduler
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 100000, "temperature": 1,
                                                       "stream": True}) as r:
            it = r.iter_lines()
            assert next(it).startswith("data: ")
    deadline = time.monotonic() + 20
    while sched.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sched.busy == 0 and sched.queue_depth == 0
    with httpx.Client(base_url=srv.base, timeout=60) as c:  # the server goes on
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}).status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": CHAT}),
])
def test_client_disconnect_stops_a_non_streamed_generation(srv, path, body, monkeypatch):
    """A non-streamed request whose client goes away (here: a 0.5 s read timeout) cancels its job,
    as llama-server does: the slot is idle long before its tokens are done. Each token is slowed to
    20 ms (about 5 s for the 256 of the context), so the job cannot finish before the client leaves,
    and it emits a token far more often than every 0.5 s."""
    import httpx

    from cooktop.server import slots
    real_init = slots.Job.__init__

    def slow_init(self, make, *a, **k):
        def slow(llm):
            for item in make(llm):
                time.sleep(0.02)
                yield item
        real_init(self, slow, *a, **k)
    monkeypatch.setattr(slots.Job, "__init__", slow_init)
    sched = srv.state.scheduler
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.base + path, json={**body, "max_tokens": 100000, "temperature": 0, "ignore_eos": True},
                   timeout=0.5)
    deadline = time.monotonic() + 2
    while sched.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sched.busy == 0 and sched.queue_depth == 0
    assert not any(s["is_processing"] for s in httpx.get(srv.base + "/slots").json())


def test_client_disconnect_while_queued_cancels_the_job(srv, monkeypatch):
    """A non-streamed request waiting for a slot (both busy) whose client goes away never runs:
    once the slots free, its job is dropped before it reads its prompt."""
    import httpx

    from cooktop.server import slots
    real_init = slots.Job.__init__
    started = []

    def slow_init(self, make, *a, **k):
        def slow(llm):
            for i, item in enumerate(make(llm)):
                if i == 0:  # the job read its prompt and produced a token
                    started.append(1)
                time.sleep(0.02)
                yield item
        real_init(self, slow, *a, **k)
    monkeypatch.setattr(slots.Job, "__init__", slow_init)
    sched = srv.state.scheduler
    release = threading.Event()
    body = {"prompt": PROMPT, "max_tokens": 100000, "temperature": 0, "ignore_eos": True}

    def hold():
        with httpx.Client(base_url=srv.base, timeout=60) as c:
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                lines = r.iter_lines()  # kept: a dropped iterator closes the response
                assert next(lines).startswith("data: ")
                release.wait(30)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for t in holders:
        t.start()
    deadline = time.monotonic() + 20
    while sched.busy < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sched.busy == 2
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.base + "/v1/completions", json=body, timeout=0.5)
    time.sleep(0.5)  # the server notices the client has gone
    release.set()
    for t in holders:
        t.join(30)
    deadline = time.monotonic() + 5
    while (sched.busy or sched.queue_depth) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sched.busy == 0 and sched.queue_depth == 0
    assert len(started) == 2  # the two streams ran; the queued request never produced a token


# -- other servers ---------------------------------------------------------------------------
def test_api_key(stories, server_deps, openai_client_dep):
    import httpx
    from openai import AuthenticationError, OpenAI

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=128, device="cpu"), api_key="s3cret,k2",
                                   endpoint_metrics=True))
    try:
        assert httpx.get(s.base + "/health").status_code == 200  # open
        for key, status in (("k2", 200), ("s3cret,k2", 401), ("s3cre", 401)):  # any one of the keys
            assert httpx.get(s.base + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == status
        for path in ("/v1/models", "/metrics", "/props"):
            r = httpx.get(s.base + path)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.get(s.base + "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        good = OpenAI(api_key="s3cret", base_url=s.base + "/v1", max_retries=0)
        assert good.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=2).choices[0].text
        with pytest.raises(AuthenticationError):
            OpenAI(api_key="nope", base_url=s.base + "/v1", max_retries=0).models.list()
    finally:
        s.stop()


def test_api_key_file(tmp_path):
    """serve's --api-key-file: one key per line, # comments and empty lines skipped, with --api-key's."""
    from cooktop.cli.serve import _api_keys
    from cooktop.errors import CooktopError
    f = tmp_path / "keys"
    f.write_text("# team keys\nalpha\n\nbeta\n")
    assert _api_keys("a,b", str(f)) == "a,b,alpha,beta"
    assert _api_keys(None, str(f)) == "alpha,beta" and _api_keys(None, None) is None and _api_keys(",", None) is None
    with pytest.raises(CooktopError, match="cannot read"):
        _api_keys(None, str(tmp_path / "missing"))
    f.write_text("x,y\n")
    with pytest.raises(CooktopError, match="comma"):
        _api_keys(None, str(f))


def test_health_503_while_loading(stories, server_deps, monkeypatch):
    import httpx

    from cooktop.server.app import ServerConfig, ServerState
    gate = threading.Event()
    real = ServerState.load
    monkeypatch.setattr(ServerState, "load", lambda self: (gate.wait(30), real(self)))
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=128, device="cpu")), wait_loaded=False)
    try:
        r = httpx.get(s.base + "/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
        assert httpx.post(s.base + "/v1/completions", json={"prompt": "x"}).status_code == 503
        gate.set()
        s.wait_loaded()
        assert httpx.get(s.base + "/health").status_code == 200
    finally:
        gate.set()
        s.stop()


def test_overload_is_503(stories, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    # n_ctx 2048: the first stream must still be running when the second request arrives (with 256 it
    # could fill its context and free the slot first on a fast or lucky run)
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=2048, device="cpu"), max_queue=0))
    try:
        with httpx.Client(base_url=s.base, timeout=60) as c:
            with c.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 100000, "seed": 1,
                                                           "temperature": 1.5, "top_k": 0, "logit_bias": {"2": -100},
                                                           "stream": True}) as r:
                lines = r.iter_lines()
                first = next(lines)
                busy = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
                if busy.status_code != 503:  # say why the first stream no longer held the slot
                    rest = [ln for _, ln in zip(range(5), lines)]
                    raise AssertionError(f"second request answered {busy.status_code} while the first stream "
                                         f"should run; its first line {first[:300]!r}, then {rest!r}")
                assert "overloaded" in busy.json()["error"]["message"]
                slots = c.get("/slots").json()
                assert len(slots) == 1 and slots[0]["is_processing"] is True
                none_idle = c.get("/slots", params={"fail_on_no_slot": 1})
                assert none_idle.status_code == 503 and "no slot available" in none_idle.json()["error"]["message"]
    finally:
        s.stop()


def test_model_with_template_and_template_error(stories, tmp_path, server_deps):
    """A GGUF with a template that refuses system messages (Gemma 2 style): 400 from the server."""
    import httpx

    from cooktop.server.app import ServerConfig
    tmpl = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
            "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    path = with_chat_template(stories, tmp_path / "tmpl.gguf", tmpl)
    s = RunningServer(ServerConfig(str(path), llama_kwargs=dict(n_ctx=256, device="cpu")))
    try:
        with httpx.Client(base_url=s.base, timeout=60) as c:
            assert c.post("/apply-template", json={"messages": CHAT}).json()["prompt"] == \
                "<|user|>Tell me a story.</s><|assistant|>"
            ok = c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 8, "temperature": 0})
            assert ok.status_code == 200, ok.text
            r = c.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "x"}, *CHAT]})
            assert r.status_code == 400
            assert "System role not supported" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_load_32_concurrent_streams(srv, http):
    """32 streaming clients at once (greedy): no failure, no lost chunk, each stream equals its
    request's non-streamed answer."""
    import httpx
    prompts = [f"{PROMPT} {w}" for w in ("there", "a", "the", "Tom", "Lily", "in", "on", "she")] * 4
    expected = {}
    for p in set(prompts):
        r = http.post("/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0})
        expected[p] = r.json()["choices"][0]["text"]

    def one(p: str) -> tuple[str, str, int]:
        text, n_events, done = [], 0, False
        with httpx.Client(base_url=srv.base, timeout=300) as c:
            with c.stream("POST", "/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0,
                                                           "stream": True}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if not line:
                        continue
                    assert line.startswith("data: ")
                    if line == "data: [DONE]":
                        done = True
                        continue
                    event = json.loads(line[6:])
                    assert "error" not in event, event
                    text.append(event["choices"][0]["text"])
                    n_events += 1
        assert done
        return p, "".join(text), n_events

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, prompts))
    assert len(results) == 32
    for p, text, n in results:
        assert text == expected[p], p
        assert n >= 2
    assert srv.state.scheduler.driver.stats.max_seqs == 2  # both slots decoded in shared forward passes


def test_slots_endpoint(srv, http):
    """GET /slots as llama-server's: one record per slot; the slot of the last request holds its
    prompt and what it generated; --no-slots answers 501."""
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "temperature": 0}).json()
    recs = http.get("/slots").json()
    assert [s["id"] for s in recs] == [0, 1]
    assert all(s["n_ctx"] == 256 and s["is_processing"] is False and s["speculative"] is False for s in recs)
    last = max((s for s in recs if "id_task" in s), key=lambda s: s["id_task"])
    usage = r["usage"]  # the last sampled token is not evaluated yet: the slot holds one less
    assert last["n_prompt_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1
    srv.state.config.endpoint_slots = False
    try:
        off = http.get("/slots")
    finally:
        srv.state.config.endpoint_slots = True
    assert off.status_code == 501 and "--slots" in off.json()["error"]["message"]


def test_slot_is_free_when_its_answer_arrives(http):
    """The slot is released before the last event goes out (as llama-server releases it before its
    final response): right after each answer, /slots shows every slot idle."""
    for i in range(6):
        http.post("/v1/completions", json={"prompt": f"{PROMPT} {i}", "max_tokens": 2, "temperature": 0})
        assert not any(s["is_processing"] for s in http.get("/slots").json())


def test_id_slot_and_erase_as_llama_server(http):
    """``id_slot`` runs a request on that slot (modulo the slots); ``POST /slots/ID?action=erase``
    empties its cache (the same prompt then reads all of it again), ``ID`` modulo the slots too
    (llama-server's ``get_slot_by_id``, server-context.cpp: "allow id_slot to be out of bounds (wrap
    around)"); save/restore 501, bad 400."""
    def ask(id_slot):
        body = {"prompt": PROMPT + " a frog", "max_tokens": 2, "temperature": 0, "id_slot": id_slot}
        return http.post("/v1/completions", json=body).json()["usage"]

    def held():
        return {s["id"]: s.get("n_prompt_tokens", 0) for s in http.get("/slots").json()}

    for id_slot in (1, 0, 3):  # 3: slot 1 of 2
        ask(id_slot)
        last = max(http.get("/slots").json(), key=lambda s: s.get("id_task", -1))
        assert last["id"] == id_slot % 2
    assert ask(1)["prompt_tokens_details"]["cached_tokens"] > 0
    n = held()[1]
    r = http.post("/slots/1?action=erase")
    assert r.status_code == 200 and r.json() == {"id_slot": 1, "n_erased": n} and n > 0
    assert held()[1] == 0
    assert ask(1)["prompt_tokens_details"]["cached_tokens"] == 0
    n = held()[1]  # an id past the last slot wraps around, as llama-server's get_slot_by_id
    r = http.post("/slots/3?action=erase")
    assert r.status_code == 200 and r.json() == {"id_slot": 3, "n_erased": n} and n > 0 and held()[1] == 0
    r = http.post("/slots/-1?action=erase")
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid slot ID"
    assert http.post("/slots/0?action=save").status_code == 501
    assert http.post("/slots/0?action=nope").json()["error"]["message"] == "Invalid action"
    assert http.post("/slots/x?action=erase").status_code == 400
    bad = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "id_slot": -2})
    assert bad.status_code == 400 and "id_slot" in bad.text


def test_timings_as_llama_server(http):
    """Each answer carries llama-server's ``timings`` (the last stream chunk too); no draft counts
    without speculative decoding."""
    r = http.post("/v1/completions", json={"prompt": PROMPT + " there", "max_tokens": 5, "temperature": 0,
                                           "cache_prompt": False}).json()
    t = r["timings"]
    assert t["prompt_n"] == r["usage"]["prompt_tokens"] and t["cache_n"] == 0
    assert t["predicted_n"] == r["usage"]["completion_tokens"] == 5 and t["predicted_ms"] > 0
    # over 4 decode steps: the first token comes from the prompt's last batch, as llama-server counts
    assert t["predicted_per_second"] == pytest.approx(1e3 * 4 / t["predicted_ms"]) and "draft_n" not in t
    with http.stream("POST", "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, "stream": True}) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    assert "timings" in chunks[-1] and chunks[-1]["timings"]["predicted_n"] == 3
    assert not any("timings" in c for c in chunks[:-1])
    with http.stream("POST", "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, "stream": True,
                                                           "stream_options": {"include_usage": True}}) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["timings"]["predicted_n"] == 3  # on the usage chunk
    assert not any("timings" in c for c in chunks[:-1])


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": CHAT, "n": 2}),
    ("/v1/completions", {"prompt": [PROMPT, "The dog"]}),
    ("/v1/completions", {"prompt": [PROMPT + " a cat", "The dog"], "n": 2}),
])
def test_timings_sum_the_choices_as_usage(http, path, body):
    """With several choices the timings count what usage counts: every generated token, each
    prompt once (read or cached)."""
    r = http.post(path, json=dict(body, max_tokens=4, temperature=0)).json()
    t, u = r["timings"], r["usage"]
    assert t["predicted_n"] == u["completion_tokens"] == 4 * len(r["choices"])
    assert t["cache_n"] == u["prompt_tokens_details"]["cached_tokens"]
    assert t["prompt_n"] + t["cache_n"] == u["prompt_tokens"]
    steps = t["predicted_n"] - len(r["choices"])  # each choice's first token is free
    assert t["predicted_per_second"] == pytest.approx(1e3 * steps / t["predicted_ms"])


class _Seq:
    """A stand-in slot sequence (tokens and prefix only) for the slot-choice rules."""

    def __init__(self, cache, model, i):
        self.cache, self.model, self.seq_id, self.tokens, self.driver = cache, model, i, [], None

    def common_prefix(self, prompt, lora=None):  # as Sequence.common_prefix: at most len(prompt) - 1 (no LoRA)
        n = 0
        for a, b in zip(self.tokens, prompt):
            if a != b:
                break
            n += 1
        return max(min(n, len(prompt) - 1), 0)

    def reset(self):
        self.tokens = []

    def copy_prefix(self, src, n):
        self.tokens = list(src.tokens[:n])
        return True

    def close(self):
        pass


@contextlib.contextmanager
def _slot_chooser(n_parallel):
    """``run(prompt, generated, cache_prompt)``: the slot id a fake scheduler of ``n_parallel`` slots
    chooses for ``prompt``, then leaves holding ``prompt + generated`` (free again); ``run.held``: the
    tokens that slot held when chosen (a prefix copied from another slot, or what it kept)."""
    import asyncio
    import types

    from cooktop.server.slots import Job, Scheduler

    class Engine:
        model = types.SimpleNamespace(n_batch=8, graph_uses_before_replay=0, lora_scales=lambda: [])
        seq = None

        def new_sequences(self, n):
            cache = object()
            return [_Seq(cache, self.model, i) for i in range(n)]

    loop = asyncio.new_event_loop()
    sched = Scheduler(types.SimpleNamespace(_engine=Engine()), n_parallel=n_parallel)
    try:
        def run(prompt, generated=(9, 9, 9, 9, 9, 9), cache_prompt=True):
            job = Job(lambda llm: iter(()), loop, cache_prompt)
            seq = sched._choose(job, prompt)
            run.held = list(seq.tokens)  # what the chosen slot held for the prompt (a copied prefix)
            seq.tokens = list(prompt) + list(generated)
            for s in sched.slots:
                if s.job is job:
                    s.job = None
            return seq.seq_id

        yield run
    finally:
        sched.close()
        loop.close()


def test_slot_choice_keeps_other_prompts_while_a_slot_is_empty():
    """A prompt sharing a prefix with a free slot reuses it (in place) only when that keeps half its
    cache or no slot is empty: prompts with one system prompt get their own slots (as llama-server
    keeps the evicted one in its RAM prompt cache); a continued prompt stays on its slot."""
    with _slot_chooser(3) as run:
        system = [1, 2, 3, 4]
        a = run(system + [10, 11, 12])
        assert run(system + [20, 21, 22]) != a  # would discard 9 of slot a's 13 tokens: the empty slot
        assert run.held == system  # ... given a copy of the shared prefix
        assert run(system + [10, 11, 12, 9, 9, 9, 9, 9, 9, 30]) == a  # a continuation: in place
        third = run(system + [40])
        assert len({a, third}) == 2
        assert run(system + [50, 51, 52]) in range(3)  # no slot empty: the longest prefix, in place


def test_slot_choice_tries_every_tied_slot_before_an_empty_one():
    """Two slots tie on the prefix: the least recently used fails the keep rule, the other keeps
    9 of its 13 tokens and is taken (not an empty slot); an unrelated prompt takes the LRU slot."""
    prompt, gen = [1, 2, 3, 4, 5], list(range(6, 22))
    with _slot_chooser(3) as run:
        a = run(prompt, gen)  # holds 21 tokens
        b = run(prompt, gen[:8])  # would keep 5 of a's 21: the empty slot, holds 13
        assert b != a
        assert run(prompt + gen[:4] + [70, 71], [80]) == b  # 9 of a's 21 fails, 9 of b's 13 keeps
        assert run([90, 91, 92]) not in (a, b)  # nothing similar: the LRU (empty) slot
        assert run.held == []


def test_slot_choice_prefers_the_slot_holding_the_whole_prompt():
    """Prompts one token past a shared prefix tie on the reusable prefix (all but the last token) in
    every slot: the slot holding the prompt itself wins over the least recently used one."""
    system = [1, 2, 3, 4]
    with _slot_chooser(3) as run:
        a = run(system + [10])
        b = run(system + [20])  # a would keep under half: the empty slot (system copied)
        c = run(system + [30])
        assert len({a, b, c}) == 3
        assert run(system + [20]) == b and run(system + [30]) == c and run(system + [10]) == a  # not LRU order


def test_slot_choice_copies_no_prefix_without_cache_prompt():
    """``cache_prompt: false``: the empty slot chosen for a similar prompt is reset, nothing copied."""
    with _slot_chooser(2) as run:
        system = [1, 2, 3, 4]
        a = run(system + [10, 11, 12])
        assert run(system + [20, 21, 22], cache_prompt=False) != a
        assert run.held == []
