"""llama-server's ``--api-prefix``: every route (API, health, web page) under the prefix, nothing outside it."""

from __future__ import annotations

import pytest
from serverutil import RunningServer


@pytest.fixture(scope="module")
def http(stories, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=128, device="cpu"), api_prefix="/llm/v2"))
    with httpx.Client(base_url=s.base, timeout=120) as c:
        yield c
    s.stop()


def test_routes_under_the_prefix(http):
    assert http.get("/llm/v2/health").json() == {"status": "ok"}
    r = http.post("/llm/v2/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = http.post("/llm/v2/completion", json={"prompt": "Once upon a time", "n_predict": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
    assert http.get("/llm/v2/props").status_code == 200
    page = http.get("/llm/v2/")
    assert page.status_code == 200 and 'src="webui/app.js"' in page.text  # relative: resolves under the prefix
    assert http.get("/llm/v2/webui/app.js").status_code == 200


def test_nothing_outside_the_prefix(http):
    for path in ("/health", "/v1/models", "/", "/llm/v2", "/llm/health", "/llm/v2x/health"):
        r = http.get(path)
        assert r.status_code == 404, path
        assert r.json()["error"]["type"] == "not_found_error"
    r = http.get("/llm/v2/nope")
    assert r.status_code == 404 and "/nope" in r.json()["error"]["message"]


@pytest.mark.parametrize("bad", ["llm", "/llm/", "/"])
def test_bad_prefix_refused(stories, server_deps, bad):
    from click.testing import CliRunner

    import cooktop.cli.serve  # noqa: F401  (registers the command)
    from cooktop.cli.group import cli
    from cooktop.server.app import ServerConfig, create_app
    with pytest.raises(ValueError, match="--api-prefix"):
        create_app(ServerConfig(str(stories), api_prefix=bad))
    r = CliRunner().invoke(cli, ["serve", "-m", str(stories), "--api-prefix", bad])
    assert r.exit_code == 1 and r.output.startswith("error: --api-prefix must") and repr(bad) in r.output
    r = CliRunner().invoke(cli, ["serve", "-m", str(stories)], env={"LLAMA_ARG_API_PREFIX": bad})
    assert r.exit_code == 1 and r.output.startswith("error: --api-prefix must") and repr(bad) in r.output
