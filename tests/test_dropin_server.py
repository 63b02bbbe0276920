"""What OpenAI clients and llama-cpp-python code send, through the official ``openai`` client and the API:
content parts, tool-call turns, ``max_tokens: 0``, ``cache_prompt``, ``models.retrieve``, usage of
several prompts, ``echo`` with ``logprobs``, and ``cooktop serve``'s command-line request defaults."""

from __future__ import annotations

import math

import pytest
from conftest import with_chat_template
from serverutil import RunningServer

from cooktop import Llama
from cooktop.errors import ChatTemplateError

PROMPT = "Once upon a time"
#: A template that concatenates content as a string, as SmolLM's and many others do.
CONCAT = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
#: A template that reads content parts itself.
TYPED = ("{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}"
         "{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}<assistant>")
PARTS = [{"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "a story."}]}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_TURNS = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": None, "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


@pytest.fixture(scope="module")
def concat_model(stories, tmp_path_factory):
    return with_chat_template(stories, tmp_path_factory.mktemp("t") / "concat.gguf", CONCAT)


@pytest.fixture(scope="module")
def srv(concat_model, server_deps):
    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(concat_model), llama_kwargs=dict(n_ctx=256, device="cpu"), n_parallel=1))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv, openai_client_dep):
    from openai import OpenAI
    c = OpenAI(api_key="unused", base_url=srv.base + "/v1", max_retries=0, timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def llm(concat_model):
    m = Llama(model_path=str(concat_model), n_ctx=256, device="cpu", verbose=False)
    yield m
    m.close()


# -- content parts and tool-call turns (the template sees what it can render) ---------------
def test_content_parts_api_and_server(llm, client):
    flat = [{"role": "user", "content": "Tell me\na story."}]
    assert llm.apply_chat_template(PARTS) == llm.apply_chat_template(flat) == \
        "<|im_start|>user\nTell me\na story.<|im_end|>\n<|im_start|>assistant\n"
    want = llm.create_chat_completion(flat, max_tokens=8, temperature=0)["choices"][0]["message"]["content"]
    got = llm.create_chat_completion(PARTS, max_tokens=8, temperature=0)["choices"][0]["message"]["content"]
    r = client.chat.completions.create(model="concat.gguf", messages=PARTS, max_tokens=8, temperature=0)
    assert got == want == r.choices[0].message.content and len(want) > 3


def test_typed_template_gets_the_parts(stories, tmp_path):
    path = with_chat_template(stories, tmp_path / "typed.gguf", TYPED)
    m = Llama(model_path=str(path), n_ctx=128, device="cpu", verbose=False)
    assert m.apply_chat_template(PARTS) == "<user>[Tell me][a story.]<assistant>"
    m.close()


def test_tool_call_turn_api_and_server(llm, client):
    assert llm.apply_chat_template(TOOL_TURNS) == (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")
    out = llm.create_chat_completion(TOOL_TURNS, max_tokens=4, temperature=0)
    assert out["choices"][0]["finish_reason"] == "length"
    r = client.chat.completions.create(model="concat.gguf", messages=TOOL_TURNS, max_tokens=4, temperature=0)
    assert r.choices[0].message.content == out["choices"][0]["message"]["content"]


def test_image_part_refused_clearly(llm, client):
    import openai
    img = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    with pytest.raises(ChatTemplateError, match=r"has a 'image_url' part: this model reads text only"):
        llm.create_chat_completion(img, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="this model reads text only"):
        client.chat.completions.create(model="concat.gguf", messages=img, max_tokens=2)


# -- fields of llama-server ------------------------------------------------------------------
def test_max_tokens_zero_generates_nothing(client):
    c = client.completions.create(model="concat.gguf", prompt=PROMPT, max_tokens=0)
    assert c.choices[0].text == "" and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 0 and c.usage.prompt_tokens == 5
    r = client.chat.completions.create(model="concat.gguf", messages=PARTS, max_tokens=0)
    assert r.choices[0].message.content == "" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens > 5


def test_cache_prompt_false_is_read(client):
    kw = dict(model="concat.gguf", prompt=PROMPT + " there was", max_tokens=2, temperature=0)
    client.completions.create(**kw)
    again = client.completions.create(**kw)
    assert again.usage.prompt_tokens_details.cached_tokens == 6  # all but the last prompt token
    fresh = client.completions.create(**kw, extra_body={"cache_prompt": False})
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0 and fresh.choices[0].text == again.choices[0].text


def test_models_retrieve(client):
    m = client.models.retrieve("concat.gguf")
    assert m.id == "concat.gguf" and m.object == "model" and m.owned_by == "cooktop"
    # one model is served and any name is accepted (as llama-server does): retrieve says which
    assert client.models.retrieve("gpt-4o-mini").id == "concat.gguf"


def test_usage_counts_every_prompt(client):
    prompts = [PROMPT, "One day", "Lily"]
    r = client.completions.create(model="concat.gguf", prompt=prompts, max_tokens=3, temperature=0, n=2)
    n_prompt = sum(client.completions.create(model="concat.gguf", prompt=p, max_tokens=0).usage.prompt_tokens
                   for p in prompts)
    assert n_prompt == 5 + 3 + 2
    assert r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 3 * 2 * 3
    assert r.usage.total_tokens == n_prompt + 18


def test_echo_logprobs_include_the_prompt(llm, client):
    out = llm.create_completion(PROMPT, max_tokens=2, temperature=0, echo=True, logprobs=2)
    lp = out["choices"][0]["logprobs"]
    assert out["choices"][0]["text"].startswith(PROMPT)
    assert len(lp["tokens"]) == 5 + 2 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][:5] == ["", " Once", " upon", " a", " time"]
    assert all(v < 0 for v in lp["token_logprobs"][1:]) and len(lp["top_logprobs"][1]) == 2
    # token 1's logprob is what the one-token context gives it
    llm.reset()
    import numpy as np
    row = llm._engine.eval([1])[-1]
    ref = float(row[403] - np.log(np.exp(row - row.max()).sum()) - row.max())
    assert math.isclose(lp["token_logprobs"][1], ref, abs_tol=1e-4)
    r = client.completions.create(model="concat.gguf", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    assert r.choices[0].text == PROMPT and r.choices[0].logprobs.token_logprobs[0] is None
    assert r.choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp["token_logprobs"][1:5], abs=1e-4)


def test_echo_logprobs_count_the_prompt_as_read_not_cached(llm, srv):
    """Scoring the prompt for ``echo`` with ``logprobs`` is its evaluation: usage and timings say it
    was read in full (``cached_tokens`` / ``cache_n`` 0, ``prompt_n`` all of it, ``prompt_ms`` its
    time), as llama-server evaluates it once, in the API and the server alike."""
    import httpx
    llm.reset()
    out = llm.create_completion(PROMPT, max_tokens=0, echo=True, logprobs=1)
    n = out["usage"]["prompt_tokens"]
    assert n == 5 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert llm.last_timings.prompt_n == n and llm.last_timings.prompt_ms > 0
    body = {"prompt": PROMPT + " there was a little girl", "max_tokens": 0, "echo": True, "logprobs": 1,
            "cache_prompt": False}
    for _ in range(2):  # the second time the slot holds the prompt: still read in full (scored)
        r = httpx.post(srv.base + "/v1/completions", json=body, timeout=60).json()
        n = r["usage"]["prompt_tokens"]
        assert n > 5 and r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert r["timings"]["cache_n"] == 0 and r["timings"]["prompt_n"] == n and r["timings"]["prompt_ms"] > 0
        assert len(r["choices"][0]["logprobs"]["tokens"]) == n


# -- cooktop serve's command line: request defaults -----------------------------------------
def test_serve_flags_are_request_defaults(concat_model, server_deps, openai_client_dep):
    from openai import OpenAI
    from test_llama_flags import parse

    from cooktop.cli.serve import request_defaults
    from cooktop.server.app import ServerConfig
    p = parse("serve", "-n", "5", "--temp", "0", "--top-k", "1", "--ignore-eos", "-r", "zzz", "--jinja",
              "--no-webui", "-cb", "--threads-http", "4")
    gen = {k: v for k, v in p.items() if k not in ("n_predict", "seed")}
    s = RunningServer(ServerConfig(str(concat_model), llama_kwargs=dict(n_ctx=256, device="cpu"),
                                   defaults=request_defaults(p["n_predict"], gen)))
    try:
        c = OpenAI(api_key="unused", base_url=s.base + "/v1", max_retries=0, timeout=120)
        a = c.completions.create(model="concat.gguf", prompt=PROMPT)  # no max_tokens, no temperature
        b = c.completions.create(model="concat.gguf", prompt=PROMPT)
        assert a.usage.completion_tokens == 5 and a.choices[0].text == b.choices[0].text
        import httpx
        params = httpx.get(s.base + "/props", timeout=30).json()["default_generation_settings"]["params"]
        assert params["temperature"] == 0 and params["top_k"] == 1 and params["n_predict"] == 5
        assert params["ignore_eos"] is True
        c.close()
    finally:
        s.stop()


# -- llama-server's chat fields: assistant prefill, __verbose, token counts, error details ----------
def test_assistant_prefill_and_continue_final_message(srv, llm):
    import httpx
    turns = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon"}]
    head = "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"

    def post(path, **body):
        return httpx.post(srv.base + path, json={"messages": turns, **body}, timeout=120)

    # an assistant message last is continued (llama-server's prefill), as continue_final_message asks
    assert post("/apply-template").json()["prompt"] == head + "Once upon"
    assert post("/apply-template", add_generation_prompt=False,
                continue_final_message=True).json()["prompt"] == head + "Once upon"
    parts = [turns[0], {"role": "assistant", "content": [{"type": "text", "text": "Once"},
                                                         {"type": "text", "text": "upon"}]}]
    r = httpx.post(srv.base + "/apply-template", json={"messages": parts}, timeout=60)
    assert r.json()["prompt"] == head + "Once\n\nupon"  # text parts joined as llama.cpp's render_content
    both = post("/v1/chat/completions", add_generation_prompt=True, continue_final_message=True)
    assert both.status_code == 400 and "Cannot set both" in both.json()["error"]["message"]
    two = httpx.post(srv.base + "/v1/chat/completions", json={"messages": turns + [turns[1]]}, timeout=60)
    assert two.status_code == 400 and "2 or more assistant messages" in two.json()["error"]["message"]
    # the continuation itself: the server's greedy answer is the API's with continue_final_message
    r = post("/v1/chat/completions", max_tokens=6, temperature=0, verbose=True).json()
    api = llm.create_chat_completion(turns, max_tokens=6, temperature=0, continue_final_message=True)
    assert r["choices"][0]["message"]["content"] == api["choices"][0]["message"]["content"]
    v = r["__verbose"]
    assert v["prompt"].endswith(head + "Once upon") and v["tokens_predicted"] == 6
    assert v["tokens_evaluated"] == r["usage"]["prompt_tokens"] and v["stop_type"] == "limit"
    assert "__verbose" not in post("/v1/chat/completions", max_tokens=1, verbose=False).json()


def test_input_tokens_context_errors_and_first_stream_chunk(srv):
    import json

    import httpx
    msgs = [{"role": "user", "content": "Tell me a story."}]
    n = httpx.post(srv.base + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 0},
                   timeout=60).json()["usage"]["prompt_tokens"]
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        assert httpx.post(srv.base + path, json={"messages": msgs}, timeout=60).json() == {"input_tokens": n}
    r = httpx.post(srv.base + "/v1/responses/input_tokens", json={"input": "Tell me a story."}, timeout=60)
    assert r.json() == {"input_tokens": n}
    # too long: llama-server's error with the prompt's size and the slot's context
    r = httpx.post(srv.base + "/v1/chat/completions", json={"messages": msgs * 60}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256
    # a response_format it cannot serve is refused even when no token is asked for
    for rf in ({"type": "sound"}, {"type": "json_object", "schema": {"type": "hiccup"}}):
        r = httpx.post(srv.base + "/v1/chat/completions",
                       json={"messages": msgs, "max_tokens": 0, "response_format": rf}, timeout=60)
        assert r.status_code == 400, rf
    # the stream's first chunk: the role with content null, as llama-server sends it
    with httpx.stream("POST", srv.base + "/v1/chat/completions",
                      json={"messages": msgs, "max_tokens": 2, "stream": True}, timeout=60) as s:
        first = json.loads(next(line for line in s.iter_lines() if line.startswith("data: "))[6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
