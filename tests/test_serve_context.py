"""How ``cooktop serve`` sizes each slot's context: ``-c`` split across ``-np`` as llama-server does
(src/llama-context.cpp's padding to 256), the whole of it with ``--kv-unified``, ``-np -1`` = 4 unified."""

from __future__ import annotations

import pytest
from click.testing import CliRunner


def test_slot_context_is_llama_cpps_split():
    from cooktop.server.slots import slot_context
    assert slot_context(512, 2) == 256 and slot_context(256, 2) == 256 and slot_context(4096, 4) == 1024
    assert slot_context(1000, 3) == 512  # 1000 -> 1024; 1024 // 3 = 341 -> 512
    assert slot_context(300, 1) == 512


@pytest.mark.parametrize("args, want", [(["-c", "1024", "-np", "2"], (256 * 2, 2)),
                                        (["-c", "1024", "-np", "2", "-kvu"], (1024, 2)),
                                        (["-c", "1024", "-np", "-1"], (1024, 4)),
                                        (["-np", "2"], (1024, 2))])  # -c 0: stories260K's 2048 capped at 4096
def test_serve_splits_the_context_across_slots(stories, args, want, server_deps, monkeypatch):
    """``cooktop serve -c N -np K``: each slot N / K (llama-server's), the whole N with --kv-unified, and
    -np -1 four slots sharing it; seen by the app the command builds."""
    import cooktop.cli.serve  # noqa: F401  (registers the command)
    import cooktop.server.app as app_module
    from cooktop.cli.group import cli
    seen = {}

    def fake_create_app(config, **kw):
        seen.update(n_ctx=config.llama_kwargs["n_ctx"], n_parallel=config.n_parallel)
        raise SystemExit(0)

    monkeypatch.setattr(app_module, "create_app", fake_create_app)
    monkeypatch.setattr(cooktop.cli.serve, "listen_socket", lambda host, port: None)
    r = CliRunner().invoke(cli, ["serve", "-m", str(stories), "--port", "8080", *args])
    assert r.exit_code == 0, r.output
    assert (seen["n_ctx"], seen["n_parallel"]) == want


def test_several_addresses_and_aliases(stories, server_deps):
    """``--host a,b`` listens on each (one error, nothing left open, when one fails); ``--alias a,b`` and
    ``--tags`` show in ``/v1/models``, the first alias in sorted order as the ``id`` (llama-server's)."""
    import socket

    from fastapi.testclient import TestClient

    from cooktop.cli.serve import listen_sockets, urls
    from cooktop.errors import CooktopError
    from cooktop.server.app import ServerConfig, create_app
    socks = listen_sockets("127.0.0.1, 127.0.0.2", 0)
    try:
        assert [s.getsockname()[0] for s in socks] == ["127.0.0.1", "127.0.0.2"]
        socks[0].listen()  # as uvicorn does
        port = socks[0].getsockname()[1]
        with pytest.raises(CooktopError, match=f"cannot listen on 127.0.0.1:{port}: the address is already in use"):
            listen_sockets("127.0.0.3,127.0.0.1", port)
        probe = socket.socket()
        probe.bind(("127.0.0.3", port))  # the first of the failed pair was closed again
        probe.close()
    finally:
        for s in socks:
            s.close()
    assert urls("127.0.0.1,::1", 8080, "/llm") == "http://127.0.0.1:8080/llm, http://[::1]:8080/llm"
    with TestClient(create_app(ServerConfig(str(stories), alias="tinyllama-2,fim,code", tags="chat, small",
                                            llama_kwargs=dict(n_ctx=64, device="cpu")))) as c:
        while c.get("/health").status_code == 503:
            pass
        m = c.get("/v1/models").json()["data"][0]
    assert (m["id"], m["aliases"], m["tags"]) == ("code", ["code", "fim", "tinyllama-2"], ["chat", "small"])
