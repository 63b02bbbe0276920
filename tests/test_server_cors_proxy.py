"""``/cors-proxy`` (llama-server's ``--ui-mcp-proxy``): off by default (403); on, the request goes to
``?url=`` with only the ``x-llama-server-proxy-header-*`` headers, and its answer comes back."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from serverutil import RunningServer


class Target(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.seen = dict(self.headers)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.server.posted = self.rfile.read(n)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def target():
    t = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    threading.Thread(target=t.serve_forever, daemon=True).start()
    yield t
    t.shutdown()
    t.server_close()


def test_cors_proxy(stories, target, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    url = f"http://127.0.0.1:{target.server_port}"
    on = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=64, device="cpu"), api_key="k",
                                    ui_mcp_proxy=True))
    off = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=64, device="cpu")))
    try:
        r = httpx.get(off.base + "/cors-proxy", params={"url": url})
        assert r.status_code == 403 and r.json() == {"error": {"message": "this feature is disabled",
                                                               "type": "feature_disabled"}}
        assert httpx.post(off.base + "/cors-proxy", params={"url": url}).status_code == 403
        with httpx.Client(base_url=on.base, timeout=30) as c:
            r = c.get("/cors-proxy", params={"url": url + "/capture"}, headers={
                "Authorization": "Bearer k", "Proxy-Authorization": "Basic secret", "X-Api-Key": "k",
                "Cookie": "session=secret", "x-llama-server-proxy-header-accept": "application/json",
                "x-llama-server-proxy-header-authorization": "Bearer explicit"})
            assert r.status_code == 200 and r.json() == {"ok": True}
            seen = {k.lower(): v for k, v in target.seen.items()}
            assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
            assert not {"proxy-authorization", "x-api-key", "cookie"} & set(seen)
            r = c.post("/cors-proxy", params={"url": url + "/"}, content=b'{"a": 1}',
                       headers={"Authorization": "Bearer k"})
            assert r.status_code == 204 and r.content == b"" and target.posted == b'{"a": 1}'
            for bad, why in (("ftp://x/", "unsupported URL scheme"), ("http://user:pw@127.0.0.1/", "authentication"),
                             ("http:///x", "missing host"), ("", "missing the url")):
                r = c.get("/cors-proxy", params={"url": bad}, headers={"Authorization": "Bearer k"})
                assert r.status_code == 400 and why in r.json()["error"]["message"], (bad, r.text)
            r = c.get("/cors-proxy", params={"url": "http://127.0.0.1:9/"}, headers={"Authorization": "Bearer k"})
            assert r.status_code == 502 and "cannot reach" in r.json()["error"]["message"]
        assert httpx.get(on.base + "/cors-proxy", params={"url": url}).status_code == 401  # the API key guards it
    finally:
        on.stop()
        off.stop()


def test_the_flag(stories, server_deps, monkeypatch):
    from click.testing import CliRunner

    import cooktop.cli.serve
    import cooktop.server.app as app_module
    from cooktop.cli.group import cli
    seen = []

    def fake_create_app(config, **kw):
        seen.append(config.ui_mcp_proxy)
        raise SystemExit(0)

    monkeypatch.setattr(app_module, "create_app", fake_create_app)
    monkeypatch.setattr(cooktop.cli.serve, "listen_socket", lambda host, port: None)
    for flag, want in (([], False), (["--ui-mcp-proxy"], True), (["--webui-mcp-proxy"], True)):
        assert CliRunner().invoke(cli, ["serve", "-m", str(stories), *flag]).exit_code == 0
        assert seen.pop() is want
