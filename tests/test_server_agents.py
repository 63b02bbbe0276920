"""What agents and chat clients need from ``cooktop serve``, through the official ``openai`` and ``anthropic``
clients on 127.0.0.1: any model name, tool calls in every template format (forced by tool_choice, whose
grammar makes the tiny model write each format), multi-turn with tool results, reasoning split, the
Responses and Anthropic Messages APIs, reranking, 400s in each API's shape, and 32 concurrent clients.

The model is stories260K with the chat template of each family (from ../shared/templates) written into a
copy of its GGUF; its answers are constrained, never scripted, so the real generation path runs.
"""

from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest
from conftest import require_modules, rewrite_gguf, with_chat_template
from serverutil import RunningServer

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string", "enum": ["CET", "UTC"]}},
        "required": ["tz"], "additionalProperties": False}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FAMILIES = {"hermes": "Qwen-Qwen3-0.6B", "llama3": "meta-llama-Llama-3.1-8B-Instruct",
            "mistral": "mistralai-Mistral-Nemo-Instruct-2407", "gpt-oss": "openai-gpt-oss-120b", "generic": None}


@pytest.fixture(scope="module")
def servers(stories, shared, server_deps, openai_client_dep, tmp_path_factory):
    """One server per tool-call format (started on first use), stopped at the end."""
    from cooktop.server.app import ServerConfig
    tmp = tmp_path_factory.mktemp("agents")
    running: dict[str, RunningServer] = {}

    def get(fmt: str) -> RunningServer:
        if fmt not in running:
            name = FAMILIES.get(fmt, fmt)
            path = stories
            if name is not None:
                path = with_chat_template(stories, tmp / f"{name}.gguf",
                                          (shared / "templates" / f"{name}.jinja").read_text())
            running[fmt] = RunningServer(ServerConfig(str(path), llama_kwargs=dict(n_ctx=2048, device="cpu"),
                                                      n_parallel=4))
        return running[fmt]

    yield get
    for s in running.values():
        s.stop()


def openai_client(srv):
    from openai import OpenAI
    return OpenAI(api_key="unused", base_url=srv.base + "/v1", max_retries=0, timeout=120)


def joined_stream(chunks):
    """(content, {index: (id, name, arguments)}, finish_reason) of a streamed chat answer."""
    content, calls, finish = "", {}, None
    for c in chunks:
        if not c.choices:
            continue
        ch = c.choices[0]
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            if tc.id:
                assert tc.index not in calls and tc.function.name and tc.type == "function"
                calls[tc.index] = [tc.id, tc.function.name, ""]
            calls[tc.index][2] += tc.function.arguments or ""
        finish = ch.finish_reason or finish
    return content, {i: tuple(v) for i, v in calls.items()}, finish


def test_any_model_name_is_accepted_and_echoed(servers):
    srv = servers("generic")
    with openai_client(srv) as c:
        r = c.chat.completions.create(model="gpt-4o-mini", messages=ASK, max_tokens=3, temperature=0)
        assert r.model == "gpt-4o-mini" and r.choices[0].message.content
        assert [m.id for m in c.models.list().data] == ["stories260K.gguf"]


@pytest.mark.parametrize("fmt", list(FAMILIES))
def test_tool_call_each_format_whole_and_streamed(servers, fmt):
    srv = servers(fmt)
    kw = dict(model="any", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=200)
    with openai_client(srv) as c:
        r = c.chat.completions.create(**kw)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        (call,) = ch.message.tool_calls
        assert call.type == "function" and call.id and call.function.name in ("get_weather", "get_time")
        args = json.loads(call.function.arguments)
        assert args in ({"city": "Paris"}, {"city": "Tokyo"}, {"tz": "CET"}, {"tz": "UTC"})
        if fmt == "mistral":
            assert len(call.id) == 9 and call.id.isalnum()  # what the Mistral template accepts back
        content, calls, finish = joined_stream(c.chat.completions.create(stream=True, **kw))
        assert finish == "tool_calls" and not content.strip()
        ((cid, name, arguments),) = calls.values()
        assert name == call.function.name and json.loads(arguments) == args


def test_named_tool_choice_and_required_always_calls(servers):
    srv = servers("hermes")
    with openai_client(srv) as c:
        r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=200,
                                      tool_choice={"type": "function", "function": {"name": "get_time"}})
        assert r.choices[0].message.tool_calls[0].function.name == "get_time"
        for seed in range(6):  # sampled at temperature 1.5: the grammar still forces a call every time
            r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                          temperature=1.5, seed=seed, max_tokens=200)
            assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls, seed
        # a schema without additionalProperties is closed (llama.cpp's default): no invented keys
        open_tool = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        r = c.chat.completions.create(model="m", messages=ASK, tools=open_tool, tool_choice="required",
                                      temperature=0, max_tokens=300)
        assert r.choices[0].finish_reason == "tool_calls"
        assert list(json.loads(r.choices[0].message.tool_calls[0].function.arguments)) == ["city"]
        # auto: the story model answers in text, no call
        r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=20)
        assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"
        assert r.choices[0].message.content
        # none: plain text, nothing parsed
        r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                      max_tokens=5)
        assert r.choices[0].message.tool_calls is None


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "generic"])
def test_multi_turn_with_tool_results(servers, fmt):
    srv = servers(fmt)
    with openai_client(srv) as c:
        first = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                          temperature=0, max_tokens=200)
        call = first.choices[0].message.tool_calls[0]
        convo = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                       {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"}]
        r = c.chat.completions.create(model="m", messages=convo, tools=TOOLS, temperature=0, max_tokens=8)
        assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens > first.usage.prompt_tokens
    # the tool result and the call (arguments as an object) reach the prompt in the template's syntax
    llm = srv.state.llm
    from cooktop.api.chat_plan import plan_chat
    plan = plan_chat(llm, convo, tools=TOOLS, tool_choice="auto", grammar=None, parallel_tool_calls=None,
                     reasoning_format=None, chat_template_kwargs=None, reasoning_budget=None)
    prompt = llm._chat_render(plan.messages, plan.tools)[0]
    assert "22 degrees and sunny" in prompt and call.function.name in prompt
    assert json.loads(call.function.arguments)[next(iter(json.loads(call.function.arguments)))] in prompt
    if fmt == "hermes":
        assert "<tool_response>\n22 degrees and sunny\n</tool_response>" in prompt
        assert f'{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}' in prompt


def test_python_api_tools(servers):
    llm = servers("llama3").state.llm
    r = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {
        "name": "get_weather"}}, temperature=0, max_tokens=200)
    call = r["choices"][0]["message"]["tool_calls"][0]
    assert r["choices"][0]["finish_reason"] == "tool_calls" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Tokyo")


THINK = 'root ::= "<think>" [a-z ]{4,24} "</think>" [a-z]{2,12}'


def test_reasoning_split_both_modes(servers):
    srv = servers("hermes")
    with openai_client(srv) as c:
        kw = dict(model="m", messages=ASK, temperature=0, max_tokens=60)
        r = c.chat.completions.create(**kw, extra_body={"grammar": THINK})
        msg = r.choices[0].message
        thought = msg.model_extra["reasoning_content"]
        assert thought and "<think>" not in msg.content and msg.content.isalpha()
        content, think = "", ""
        for ch in c.chat.completions.create(stream=True, **kw, extra_body={"grammar": THINK}):
            d = ch.choices[0].delta
            content += d.content or ""
            think += (d.model_extra or {}).get("reasoning_content") or ""
        assert (think, content) == (thought, msg.content)
        raw = c.chat.completions.create(**kw, extra_body={"grammar": THINK, "reasoning_format": "none"})
        text = raw.choices[0].message.content  # the same answer, the thinking left in place
        assert text.startswith("<think>") and f"{thought}" in text and text.endswith(f"</think>{msg.content}")
        assert "reasoning_content" not in (raw.choices[0].message.model_extra or {})


def test_reasoning_opened_by_template_and_budget(servers, stories, shared, tmp_path):
    from cooktop.api import Llama
    path = with_chat_template(stories, tmp_path / "r1.gguf",
                              (shared / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text())
    llm = Llama(str(path), n_ctx=512, verbose=False)
    g = 'root ::= [a-z ]{3,12} "</think>" [a-z]{2,8}'
    r = llm.create_chat_completion(ASK, temperature=0, max_tokens=40, grammar=g,
                                   chat_template_kwargs={"enable_thinking": True})
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"].isalpha()
    # a budget of 4 thinking tokens: </think> is forced after them
    free = 'root ::= "<think>" [a-z ]* ("\\n</think>\\n\\n" [a-z ]{1,8})?'
    r = llm.create_chat_completion(ASK, temperature=0, max_tokens=60, grammar=free, reasoning_budget=4,
                                   chat_template_kwargs={"enable_thinking": False})
    msg = r["choices"][0]["message"]
    assert len(llm.tokenize(msg["reasoning_content"].encode(), add_bos=False)) <= 4 and msg["content"]
    llm.close()


def test_responses_api_text_stream_and_tools(servers):
    srv = servers("hermes")
    with openai_client(srv) as c:
        r = c.responses.create(model="gpt-4.1", input="Tell me a story.", instructions="Be brief.",
                               max_output_tokens=12, temperature=0)
        assert r.status == "incomplete" and r.model == "gpt-4.1" and len(r.output_text) > 5
        assert r.usage.output_tokens == 12
        events = list(c.responses.create(model="gpt-4.1", input="Tell me a story.", instructions="Be brief.",
                                         max_output_tokens=12, temperature=0, stream=True))
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
        assert "response.output_item.added" in kinds and "response.output_text.done" in kinds
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
        assert [e.sequence_number for e in events] == list(range(len(events)))
        t = c.responses.create(model="m", input="Weather in Paris?", tools=[
            {"type": "function", **TOOLS[0]["function"]}], tool_choice="required", temperature=0,
            max_output_tokens=200)
        (fc,) = [o for o in t.output if o.type == "function_call"]
        assert fc.name == "get_weather" and json.loads(fc.arguments)["city"] in ("Paris", "Tokyo")
        # the call and its output fed back
        t2 = c.responses.create(model="m", input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
            {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}],
            max_output_tokens=4, temperature=0)
        assert t2.output_text


T0 = {"temperature": 0}  # the anthropic client has no temperature argument any more


def test_anthropic_messages_text_stream_and_tools(servers):
    require_modules("anthropic", "anthropic")
    import anthropic
    srv = servers("hermes")
    with anthropic.Anthropic(api_key="unused", base_url=srv.base, max_retries=0, timeout=120) as c:
        m = c.messages.create(model="claude-sonnet-4-5", max_tokens=12, extra_body=T0, system="Be brief.",
                              messages=[{"role": "user", "content": "Tell me a story."}])
        assert m.model == "claude-sonnet-4-5" and m.stop_reason == "max_tokens" and m.usage.output_tokens == 12
        text = m.content[0].text
        assert m.content[0].type == "text" and len(text) > 5
        with c.messages.stream(model="c", max_tokens=12, extra_body=T0, system="Be brief.",
                               messages=[{"role": "user", "content": "Tell me a story."}]) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        assert streamed == text == final.content[0].text
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in TOOLS]
        m = c.messages.create(model="c", max_tokens=200, extra_body=T0, tools=tools, tool_choice={"type": "any"},
                              messages=[{"role": "user", "content": "Weather in Paris?"}])
        (use,) = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and use.name in ("get_weather", "get_time") and isinstance(use.input, dict)
        with c.messages.stream(model="c", max_tokens=200, extra_body=T0, tools=tools,
                               tool_choice={"type": "tool", "name": "get_time"},
                               messages=[{"role": "user", "content": "Time?"}]) as s:
            final = s.get_final_message()
        assert final.content[-1].type == "tool_use" and final.content[-1].input["tz"] in ("CET", "UTC")
        m2 = c.messages.create(model="c", max_tokens=4, extra_body=T0, tools=tools, messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                               "input": use.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}])
        assert m2.content
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(model="c", max_tokens=0, messages=[{"role": "user", "content": "x"}])
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def reranker(stories, server_deps, tmp_path_factory):
    """stories260K with a rank head (cls.output [1, n_embd]) and pooling_type rank, served."""
    from gguf import GGUFValueType

    from cooktop.server.app import ServerConfig
    w = np.random.default_rng(7).standard_normal((1, 64)).astype(np.float32)
    path = rewrite_gguf(stories, tmp_path_factory.mktemp("rr") / "reranker.gguf",
                        extra_kv=[("llama.pooling_type", 4, GGUFValueType.UINT32)],
                        add={"cls.output.weight": (w, None), "cls.output.bias": (np.array([0.5], np.float32), None)})
    s = RunningServer(ServerConfig(str(path), llama_kwargs=dict(n_ctx=256, device="cpu")))
    yield s, w
    s.stop()


def test_rerank_orders_by_the_rank_head(reranker, servers):
    import httpx
    srv, w = reranker
    docs = ["The cat sat on the mat.", "Lily went to the park.", "A big red ball.", "Once upon a time"]
    for path in ("/v1/rerank", "/rerank"):
        r = httpx.post(srv.base + path, json={"model": "x", "query": "a cat", "documents": docs, "top_n": 3},
                       timeout=60)
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert len(res) == 3 and [x["relevance_score"] for x in res] == sorted(
            (x["relevance_score"] for x in res), reverse=True)
    # the scores are the head on the last token's output-normed hidden state
    llm = srv.state.llm
    from cooktop.api.rerank import pair_tokens
    seq = llm._engine.new_sequence()
    want = [float(w[0] @ seq.hidden_states(pair_tokens(llm, "a cat", d))[-1] + 0.5) for d in docs]
    got = {x["index"]: x["relevance_score"] for x in httpx.post(srv.base + "/v1/rerank", json={
        "query": "a cat", "documents": docs}, timeout=60).json()["results"]}
    assert np.allclose([got[i] for i in range(4)], want, rtol=1e-4, atol=1e-4)
    assert httpx.post(srv.base + "/v1/rerank", json={"query": 3, "documents": docs}).status_code == 400
    # a model without a rank head is refused
    plain = servers("generic")
    r = httpx.post(plain.base + "/v1/rerank", json={"query": "a", "documents": ["b"]}, timeout=60)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert "rerank" in r.json()["error"]["message"]


BAD = [
    ("/v1/chat/completions", {"messages": ASK, "tools": "nope"}, "tools"),
    ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {
        "name": "launch_rockets"}}}, "launch_rockets"),
    ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}]}, "strin"),
    ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": "object"}}]}, "parameters"),
    ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "grammar": "root ::= \"a\""}, "grammar"),
    ("/v1/chat/completions", {"messages": ASK, "reasoning_format": "loud"}, "reasoning_format"),
    ("/v1/chat/completions", {"messages": ASK, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ("/v1/responses", {"model": "m"}, "input"),
    ("/v1/responses", {"input": [{"type": "web_search_call"}]}, "web_search_call"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ("/v1/responses", {"input": "x", "max_output_tokens": "ten"}, "max_tokens"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
]


@pytest.mark.parametrize("path,body,word", BAD)
def test_bad_input_is_a_400_in_the_apis_shape(servers, path, body, word):
    import httpx
    srv = servers("hermes")
    r = httpx.post(srv.base + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and word in err["message"], err


@pytest.mark.parametrize("body,word", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "image"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t", "input_schema": 3}]},
     "input_schema"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}},
     "tool_choice"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "zz"},
      "tools": [{"name": "t", "input_schema": {"type": "object"}}]}, "zz"),
])
def test_anthropic_bad_input_is_anthropic_shaped(servers, body, word):
    import httpx
    r = httpx.post(servers("hermes").base + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400, r.text
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error" and word in j["error"]["message"]


def test_api_key_errors_in_each_shape(stories, server_deps):
    require_modules("anthropic", "anthropic")
    import anthropic
    import openai

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), api_key="sekrit"))
    try:
        with anthropic.Anthropic(api_key="wrong", base_url=s.base, max_retries=0) as c:
            with pytest.raises(anthropic.AuthenticationError) as e:
                c.messages.create(model="c", max_tokens=2, messages=[{"role": "user", "content": "x"}])
            assert e.value.body["error"]["type"] == "authentication_error"
        with anthropic.Anthropic(api_key="sekrit", base_url=s.base, max_retries=0) as c:  # x-api-key
            assert c.messages.create(model="c", max_tokens=2, messages=[{"role": "user", "content": "x"}]).content
        with openai.OpenAI(api_key="wrong", base_url=s.base + "/v1", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError):
                c.responses.create(model="m", input="x", max_output_tokens=2)
    finally:
        s.stop()


def test_32_concurrent_clients_mixing_endpoints(servers):
    import httpx
    srv = servers("hermes")

    def one(i: int):
        kind = i % 4
        with httpx.Client(base_url=srv.base, timeout=300) as h:
            if kind == 0:
                r = h.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 6, "temperature": 0})
                return kind, r.status_code, r.json()["choices"][0]["message"]["content"]
            if kind == 1:
                r = h.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS, "tool_choice": "required",
                                                         "max_tokens": 200, "temperature": 0, "stream": True})
                return kind, r.status_code, r.text.count('"tool_calls"') > 0 and r.text.endswith("data: [DONE]\n\n")
            if kind == 2:
                r = h.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 6, "temperature": 0})
                return kind, r.status_code, r.json()["output"][0]["content"][0]["text"]
            r = h.post("/v1/messages", json={"max_tokens": 6, "temperature": 0, "stream": True,
                                             "messages": [{"role": "user", "content": "Hi"}]})
            return kind, r.status_code, r.text.count("event: message_stop") == 1

    with concurrent.futures.ThreadPoolExecutor(32) as ex:
        results = list(ex.map(one, range(32)))
    assert len(results) == 32 and all(status == 200 and out for _, status, out in results), results
    texts = {out for kind, _, out in results if kind == 0}
    assert len(texts) == 1  # temperature 0: every chat client got the same answer
