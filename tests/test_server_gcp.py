"""llama-server's Google Cloud (Vertex AI) compat: with ``AIP_MODE=PREDICTION``, ``POST /predict``
runs each instance on the route its ``@requestFormat`` names and answers what that route answers."""

from __future__ import annotations

import pytest
from serverutil import RunningServer

from cooktop.server.gcp import GcpParams, gcp_alias

CHAT = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 6, "temperature": 0}


def test_aliases_and_params():
    assert gcp_alias("/v1/chat/completions") == "chatCompletions"
    assert gcp_alias("/completion") == "completion"
    assert gcp_alias("/apply-template") == "applyTemplate"
    assert gcp_alias("/v1/messages/count_tokens") == "messagesCountTokens"
    assert GcpParams.from_env({}) == GcpParams(False, "", "/predict", 8080)
    assert GcpParams.from_env({"AIP_MODE": "PREDICTION", "AIP_HEALTH_ROUTE": "ping", "AIP_PREDICT_ROUTE": "/p",
                               "AIP_HTTP_PORT": "9000"}) == GcpParams(True, "/ping", "/p", 9000)
    with pytest.raises(Exception, match="AIP_HTTP_PORT='x'"):
        GcpParams.from_env({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "x"})


@pytest.fixture(scope="module")
def gcp_server(stories, server_deps):
    from cooktop.server.app import ServerConfig
    mp = pytest.MonkeyPatch()
    mp.setenv("AIP_MODE", "PREDICTION")
    mp.setenv("AIP_HEALTH_ROUTE", "/ping")
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), n_parallel=2,
                                   api_key="k", api_prefix="/llm"))
    mp.undo()
    yield s
    s.stop()


def test_predict_runs_each_instance_on_its_route(gcp_server):
    import httpx
    with httpx.Client(base_url=gcp_server.base + "/llm", timeout=120, headers={"Authorization": "Bearer k"}) as c:
        alone = c.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        completion = c.post("/completion", json={"prompt": "Once", "n_predict": 4, "temperature": 0}).json()
        r = c.post("/predict", json={"instances": [
            {"@requestFormat": "chatCompletions", **CHAT},
            {"@requestFormat": "chatCompletions", **CHAT, "stream": True},   # streaming forced off
            {"@requestFormat": "completion", "prompt": "Once", "n_predict": 4, "temperature": 0},
            {"@requestFormat": "/tokenize", "content": "Once"},              # a path works too
            {"@requestFormat": "chatCompletions", "messages": "no"},          # the route's own 400 body
            {"@requestFormat": "nope"}, {"max_tokens": 1}, 7]})
        assert r.status_code == 200, r.text
        p = r.json()["predictions"]
        assert len(p) == 8
        assert [x["choices"][0]["message"]["content"] for x in p[:2]] == [alone, alone]
        assert p[2]["content"] == completion["content"] and p[3]["tokens"]
        assert p[4]["error"]["code"] == 400 and "messages" in p[4]["error"]["message"]
        assert p[5]["error"]["message"] == "no handler registered for @requestFormat: nope"
        assert p[6]["error"]["message"] == "each instance must include a string @requestFormat"
        assert p[7]["error"]["message"] == "each instance must be a JSON object"
        for bad, why in (([], "must be a JSON object"), ({"x": 1}, "array field named instances"),
                         ({"instances": [{}] * 129}, "exceeds maximum size of 128")):
            r = c.post("/predict", json=bad)
            assert r.status_code == 400 and why in r.json()["error"]["message"]
    # the API key guards /predict; AIP_HEALTH_ROUTE answers as /health, open like it
    assert httpx.post(gcp_server.base + "/llm/predict", json={"instances": []}).status_code == 401
    assert httpx.get(gcp_server.base + "/llm/ping").json() == {"status": "ok"}


def test_predict_route_may_not_shadow_a_route(stories, server_deps, monkeypatch):
    from cooktop.server.app import ServerConfig, create_app
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/completion")
    with pytest.raises(Exception, match="AIP_PREDICT_ROUTE=/completion conflicts"):
        create_app(ServerConfig(str(stories)))
