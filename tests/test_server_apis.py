"""The newer APIs of ``cooktop serve`` as a new user meets them: Anthropic stop sequences and tool
checks, the Responses API's stored state, chat roles, token limits, long embeddings, CORS, the port
in use and the reranker message, each with the status and the message or value asserted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from serverutil import RunningServer
from test_server import CHAT, http, srv  # noqa: F401 - the module's server, shared
from test_server_agents import servers  # noqa: F401 - one server per template family

T0 = {"temperature": 0}
STORY = {"max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": "Tell me a story."}]}


def _sse(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each event of an SSE body."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


# -- Anthropic /v1/messages ------------------------------------------------------------------

def test_anthropic_stop_sequence_is_reported_whole_and_streamed(http):  # noqa: F811
    free = http.post("/v1/messages", json=STORY).json()
    text = free["content"][0]["text"]
    assert free["stop_reason"] == "max_tokens" and free["stop_sequence"] is None and len(text) > 8
    word = text[4:7]  # a piece of what greedy decoding writes anyway: generation stops on it
    assert word.strip(), text
    body = {**STORY, "stop_sequences": ["qqqzzz", word]}
    m = http.post("/v1/messages", json=body).json()
    assert m["stop_reason"] == "stop_sequence" and m["stop_sequence"] == word, m
    assert m["content"][0]["text"] == text[:text.find(word)]
    r = http.post("/v1/messages", json={**body, "stream": True})
    assert r.status_code == 200
    (delta,) = [d for e, d in _sse(r.text) if e == "message_delta"]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": word}
    # the template's own end-of-turn string is end_turn, not a stop_sequence
    m = http.post("/v1/messages", json={**STORY, "max_tokens": 400, "stop_sequences": ["qqqzzz"]}).json()
    assert m["stop_sequence"] is None and m["stop_reason"] in ("end_turn", "max_tokens")


@pytest.mark.parametrize("tool,word", [
    ({"name": "get_weather", "description": "Weather"}, "tools[0].input_schema: required"),
    ({"type": "web_search_20250305", "name": "web_search"}, "not supported"),
])
def test_anthropic_tools_need_input_schema_and_no_server_tools(http, tool, word):  # noqa: F811
    r = http.post("/v1/messages", json={**STORY, "tools": [tool]})
    assert r.status_code == 400, r.text
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error" and word in j["error"]["message"]


def test_anthropic_tool_use_ids_start_with_toolu(servers):  # noqa: F811
    import httpx
    tool = {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"enum": ["CET", "UTC"]}},
                                                 "required": ["tz"], "additionalProperties": False}}
    body = {**STORY, "max_tokens": 60, "tools": [tool], "tool_choice": {"type": "tool", "name": "get_time"}}
    base = servers("hermes").base
    m = httpx.post(base + "/v1/messages", json=body, timeout=120).json()
    (use,) = [b for b in m["content"] if b["type"] == "tool_use"]
    assert use["id"].startswith("toolu_") and use["input"]["tz"] in ("CET", "UTC"), m
    r = httpx.post(base + "/v1/messages", json={**body, "stream": True}, timeout=120)
    starts = [d["content_block"] for e, d in _sse(r.text) if e == "content_block_start"
              and d["content_block"]["type"] == "tool_use"]
    assert len(starts) == 1 and starts[0]["id"].startswith("toolu_")
    from cooktop.server.anthropic import tool_use_id
    assert tool_use_id("call_abc") == "toolu_abc" == tool_use_id("toolu_abc")


# -- the Responses API -----------------------------------------------------------------------

def test_responses_previous_response_id_is_refused_and_store_is_not_pretended(http):  # noqa: F811
    r = http.post("/v1/responses", json={"input": "Hi", "previous_response_id": "resp_123", "max_output_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "previous_response_id"
    assert "does not store" in err["message"] and "whole conversation" in err["message"]
    r = http.post("/v1/responses", json={"input": "Hi", "store": True, "max_output_tokens": 2, **T0})
    assert r.status_code == 200 and r.json()["store"] is False and r.json()["previous_response_id"] is None


def test_responses_stream_ends_with_timings_as_llama_server(http):  # noqa: F811
    """The last event of a /v1/responses stream carries ``timings`` beside the response, as
    llama-server's; its non-streamed response and /v1/messages carry none there either."""
    body = {"input": "Hi", "max_output_tokens": 3, **T0}
    r = http.post("/v1/responses", json=dict(body, stream=True))
    events = _sse(r.text)
    name, last = events[-1]
    assert name == "response.incomplete" and last["timings"]["predicted_n"] == 3
    assert last["timings"]["prompt_n"] + last["timings"]["cache_n"] == last["response"]["usage"]["input_tokens"]
    assert not any("timings" in data for _, data in events[:-1])
    assert "timings" not in http.post("/v1/responses", json=body).json()
    msg = http.post("/v1/messages", json={"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}], **T0})
    assert msg.status_code == 200 and "timings" not in msg.json()


# -- chat messages ---------------------------------------------------------------------------

def test_developer_role_is_system(http):  # noqa: F811
    dev = http.post("/apply-template", json={"messages": [{"role": "developer", "content": "Be brief."}, *CHAT]})
    sys_ = http.post("/apply-template", json={"messages": [{"role": "system", "content": "Be brief."}, *CHAT]})
    assert dev.status_code == 200 and dev.json()["prompt"] == sys_.json()["prompt"]
    assert "<|im_start|>system\nBe brief." in dev.json()["prompt"]
    a = http.post("/v1/chat/completions", json={**STORY, "messages": [{"role": "developer", "content": "Be brief."},
                                                                      *CHAT]}).json()
    b = http.post("/v1/chat/completions", json={**STORY, "messages": [{"role": "system", "content": "Be brief."},
                                                                      *CHAT]}).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]


@pytest.mark.parametrize("messages,word", [
    ([{"role": "bogus", "content": "x"}], "messages[0]['role']: 'bogus' is not a chat role"),
    ([{"role": "system", "content": "s"}, {"role": "user"}], "messages[1]: a user message needs 'content'"),
    ([{"role": "user", "content": None}], "messages[0]: a user message needs 'content'"),
])
def test_unknown_role_or_missing_content_is_a_400(http, messages, word):  # noqa: F811
    r = http.post("/v1/chat/completions", json={**STORY, "messages": messages})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and word in err["message"], err


def test_python_api_checks_roles(srv):  # noqa: F811
    from cooktop.errors import ChatTemplateError
    llm = srv.state.llm
    with pytest.raises(ChatTemplateError, match="'bogus' is not a chat role"):
        llm.create_chat_completion([{"role": "bogus", "content": "x"}], max_tokens=1)
    with pytest.raises(ChatTemplateError, match="a user message needs 'content'"):
        llm.create_chat_completion([{"role": "user"}], max_tokens=1)
    assert llm.apply_chat_template([{"role": "developer", "content": "D"}]).startswith("<|im_start|>system\nD")
    # an assistant turn may have no content beside its tool calls
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert "user" in llm.apply_chat_template([{"role": "user", "content": "x"},
                                              {"role": "assistant", "tool_calls": [call]}])


# -- limits ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path,field", [
    ("/v1/completions", "max_tokens"), ("/v1/chat/completions", "max_tokens"),
    ("/v1/chat/completions", "max_completion_tokens"), ("/v1/responses", "max_tokens"),
])
def test_negative_max_tokens_is_a_400(http, path, field):  # noqa: F811
    body = {"prompt": "Once", "messages": CHAT, "input": "Hi"}
    body["max_output_tokens" if path == "/v1/responses" else field] = -5
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and f"{field}: must be >= 0, got -5" in err["message"]
    ok = http.post("/v1/completions", json={"prompt": "Once", "max_tokens": 0})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == ""  # llama-server's "generate nothing"


def test_embedding_longer_than_the_context_is_a_400(http):  # noqa: F811
    r = http.post("/v1/embeddings", json={"input": "Once upon a time " * 100})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error" and "n_ctx = 256" in err["message"]
    assert http.post("/v1/embeddings", json={"input": "Once upon a time"}).status_code == 200


# -- the server ------------------------------------------------------------------------------

def test_cors_preflight_and_headers(stories, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=128, device="cpu"), api_key="k",
                                   cors_origins="localhost"))  # llama-server's --cors-origins localhost
    try:
        evil = httpx.get(s.base + "/v1/models", headers={"Origin": "http://evil.example", "Authorization": "Bearer k"})
        assert evil.status_code == 200 and "access-control-allow-origin" not in evil.headers
        origin = {"Origin": "http://localhost:5173"}
        r = httpx.options(s.base + "/v1/chat/completions", headers={
            **origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert r.status_code == 200, r.text  # answered before the API key is asked for
        assert r.headers["access-control-allow-origin"] in ("*", origin["Origin"])
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = httpx.get(s.base + "/v1/models", headers={**origin, "Authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] in ("*", origin["Origin"])
    finally:
        s.stop()


def test_cors_options_as_llama_server(server_deps):
    """--cors-origins / --cors-methods / --cors-headers / --cors-credentials: llama-server's defaults
    (any origin, credentials allowed) and forms (a list, localhost)."""
    from cooktop.server.app import LOCAL_ORIGINS, ServerConfig, cors_options
    d = cors_options(ServerConfig("m.gguf"))
    assert d == {"allow_origins": ["*"], "allow_credentials": True,
                 "allow_methods": ["GET", "POST", "DELETE", "OPTIONS"], "allow_headers": ["*"]}
    c = cors_options(ServerConfig("m.gguf", cors_origins="https://a.example, https://b.example", cors_methods="GET",
                                  cors_headers="content-type,authorization", cors_credentials=False))
    assert c == {"allow_origins": ["https://a.example", "https://b.example"], "allow_credentials": False,
                 "allow_methods": ["GET"], "allow_headers": ["content-type", "authorization"]}
    assert cors_options(ServerConfig("m.gguf", cors_origins="localhost"))["allow_origin_regex"] == LOCAL_ORIGINS


def test_serve_on_a_port_in_use_is_one_error_line(stories, server_deps):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "cooktop.cli", "serve", "-m", str(stories), "--port", str(port),
                            "--device", "cpu"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: the address is already in use (another server on that "
        "port?); choose another --port or --host"]


def test_rerank_without_a_head_names_the_head_not_the_flag(stories, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=128, device="cpu", pooling_type=4)))
    try:
        r = httpx.post(s.base + "/v1/rerank", json={"query": "a", "documents": ["b"]}, timeout=60)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        msg = r.json()["error"]["message"]
        assert "no classification head" in msg and "cls / cls.output" in msg and "reranker GGUF" in msg
        assert "--rerank" not in msg, msg
    finally:
        s.stop()


def test_listen_socket_names_the_address():
    from cooktop.cli.serve import listen_socket
    from cooktop.errors import CooktopError
    with pytest.raises(CooktopError, match=r"cannot listen on no-such-host\.invalid:8080: "):
        listen_socket("no-such-host.invalid", 8080)
    s = listen_socket("127.0.0.1", 0)
    try:
        assert s.getsockname()[0] == "127.0.0.1"
    finally:
        s.close()
