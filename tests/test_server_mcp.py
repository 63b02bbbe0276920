"""llama-server's MCP servers (``--mcp-servers-config`` / ``--mcp-servers-json``, tools/server/server-mcp.cpp
and its tests/unit/test_mcp_servers.py): their tools in ``GET /tools`` as ``<server>_<tool>``, ``POST /tools``
running them, notifications and malformed lines skipped, a crashed server respawned, a bad command leaving
the rest working, the per-call timeout, shutdown cancelling a call in flight, and the config's errors."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
from serverutil import RunningServer

# A tiny MCP server: one JSON-RPC message a line on stdio. Before each tools/call reply it writes a
# notification and a line that is not JSON (both must be skipped).
ECHO_SERVER = r'''
import json, os, sys, time
TOOLS = [
    {"name": "echo", "description": "Echo back the message",
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
    {"name": "add", "description": "Add two numbers",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}},
    {"name": "pid", "description": "The server's process id"},
    {"name": "crash", "description": "Answer, then exit"},
    {"name": "sleep", "description": "Sleep for seconds",
     "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
]
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    req = json.loads(line)
    rid, method, params = req.get("id"), req.get("method"), req.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                                                      "serverInfo": {"name": "echo", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name, args = params["name"], params.get("arguments") or {}
        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}})
        sys.stdout.write("not json\n")
        if name == "echo":
            text = "echo: " + args["message"]
        elif name == "add":
            text = str(args["a"] + args["b"])
        elif name == "pid":
            text = str(os.getpid())
        elif name == "sleep":
            time.sleep(args["seconds"])
            text = "slept"
        else:
            text = "crashing"
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}]}})
        if name == "crash":
            os._exit(1)
'''


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory, server_deps):
    """A router (no models) with --tools read_file and three MCP servers: ``echo``, ``quick`` (the same
    script, a 400 ms timeout) and ``bad`` (a command that does not exist)."""
    from cooktop.server.app import ServerConfig
    from cooktop.server.router import create_router_app

    d = tmp_path_factory.mktemp("mcp")
    script = d / "echo_server.py"
    script.write_text(ECHO_SERVER)
    (d / "models").mkdir()
    servers = {"echo": {"command": sys.executable, "args": [str(script)]},
               "quick": {"command": sys.executable, "args": [str(script)], "timeout_ms": 400},
               "bad": {"command": "this_executable_does_not_exist_12345", "args": []}}
    config = ServerConfig("", tools="read_file", mcp_servers_json=json.dumps({"mcpServers": servers}))
    s = RunningServer(app=create_router_app(config, str(d / "models"), d / "hub"))
    yield s
    s.stop()


def call(s, tool, params):
    import httpx

    r = httpx.post(s.base + "/tools", json={"tool": tool, "params": params}, timeout=30)
    return r.status_code, r.json()


def test_listing(mcp_server):
    import httpx

    listing = httpx.get(mcp_server.base + "/tools").json()
    names = [t["tool"] for t in listing]
    per_server = ["echo", "add", "pid", "crash", "sleep"]
    assert names == ["read_file"] + [f"echo_{n}" for n in per_server] + [f"quick_{n}" for n in per_server]
    echo = listing[1]
    assert echo == {"display_name": "echo_echo", "tool": "echo_echo", "type": "mcp", "permissions": {"write": False},
                    "uses_cwd": False, "definition": {"type": "function", "function": {
                        "name": "echo_echo", "description": "Echo back the message",
                        "parameters": {"type": "object", "properties": {"message": {"type": "string"}},
                                       "required": ["message"]}}}}
    assert listing[3]["definition"]["function"]["parameters"] == {}  # pid: no inputSchema


def test_calls_skip_notifications(mcp_server):
    assert call(mcp_server, "echo_echo", {"message": "hi there"}) == (200, {"plain_text_response": "echo: hi there"})
    assert call(mcp_server, "echo_add", {"a": 3, "b": 5}) == (200, {"plain_text_response": "8"})
    status, body = call(mcp_server, "bad_anything", {})
    assert status == 404 and body["error"]["message"] == 'unknown tool "bad_anything"'


def test_concurrent_calls(mcp_server):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=6) as ex:
        out = list(ex.map(lambda i: call(mcp_server, "echo_echo", {"message": f"m{i}"}), range(6)))
    assert out == [(200, {"plain_text_response": f"echo: m{i}"}) for i in range(6)]


def test_respawn_after_crash(mcp_server):
    pid = call(mcp_server, "echo_pid", {})[1]["plain_text_response"]
    assert call(mcp_server, "echo_pid", {})[1]["plain_text_response"] == pid  # the same child kept
    assert call(mcp_server, "echo_crash", {}) == (200, {"plain_text_response": "crashing"})
    time.sleep(0.3)  # the child's exit seen
    again = call(mcp_server, "echo_pid", {})[1]["plain_text_response"]
    assert again.isdigit() and again != pid
    assert call(mcp_server, "echo_echo", {"message": "back"}) == (200, {"plain_text_response": "echo: back"})


def test_timeout_then_stale_reply_skipped(mcp_server):
    t0 = time.monotonic()
    assert call(mcp_server, "quick_sleep", {"seconds": 1.0}) == (200, {"error": "request timed out"})
    assert time.monotonic() - t0 < 3
    time.sleep(1.2)  # the late reply is waiting in the pipe: the next call must skip it (another id)
    assert call(mcp_server, "quick_echo", {"message": "after"}) == (200, {"plain_text_response": "echo: after"})


def test_shutdown_cancels_call_in_flight(tmp_path):
    """McpServers.shutdown (SIGTERM's) makes a call in flight answer at once; close() ends the children."""
    from cooktop.server.mcp_config import McpServerConfig
    from cooktop.server.mcp_servers import McpServers

    script = tmp_path / "echo_server.py"
    script.write_text(ECHO_SERVER)
    m = McpServers([McpServerConfig("e", sys.executable, (str(script),))])
    m.warmup()
    assert [t.name for t in m.list_tools()] == ["echo", "add", "pid", "crash", "sleep"]
    out: list = []
    th = threading.Thread(target=lambda: out.append(m.call_tool("e", "sleep", {"seconds": 20})))
    th.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    m.shutdown()
    th.join(timeout=5)
    assert out == [{"error": "cancelled"}] and time.monotonic() - t0 < 1
    assert m.call_tool("e", "echo", {"message": "x"}) == {"error": "MCP server unavailable: e"}
    proc = m.transports["e"].proc
    m.close()
    assert proc is not None and proc.poll() is not None and m.transports == {}


def test_config_errors(tmp_path):
    from cooktop.server.mcp_config import McpConfigError, load_servers

    with pytest.raises(McpConfigError, match="failed to parse MCP config JSON: Expecting value"):
        load_servers(config_json="not valid json")
    with pytest.raises(McpConfigError, match="failed to open MCP config file: /nonexistent/path.json"):
        load_servers("/nonexistent/path.json")
    with pytest.raises(McpConfigError, match="server 'x': command and cwd must be strings, args a list of strings"):
        load_servers(config_json='{"mcpServers": {"x": {"command": "c", "args": [1]}}}')
    f = tmp_path / "mcp.json"
    f.write_text(json.dumps({"mcpServers": {"a": {"command": "ca", "env": {"K": "v"}}, "b": {"args": ["no command"]}}}))
    got = load_servers(str(f), '{"mcpServers": {"a": {"command": "dup"}, "c": {"command": "cc", "timeout_ms": 5}}}')
    assert [(c.name, c.command, c.env, c.timeout_ms) for c in got] == [("a", "ca", (("K", "v"),), 30000),
                                                                       ("c", "cc", (), 5)]
    assert load_servers(config_json='{"other": 1}') == []


def test_cli_refuses_bad_config(server_deps):
    """cooktop serve exits with one line for an MCP config it cannot read (llama-server: exit 1)."""
    from click.testing import CliRunner

    import cooktop.cli.serve  # noqa: F401  (registers the command)
    from cooktop.cli.group import cli
    r = CliRunner().invoke(cli, ["serve", "--mcp-servers-config", "/nonexistent/path.json"])
    assert r.exit_code == 1 and "failed to open MCP config file: /nonexistent/path.json" in r.output


def test_single_model_mode(stories, tmp_path, server_deps):
    """With a model (no router) the app's own /tools lists and runs them, MCP servers only (no --tools)."""
    from cooktop.server.app import ServerConfig

    script = tmp_path / "echo_server.py"
    script.write_text(ECHO_SERVER)
    cfg = tmp_path / "mcp.json"
    cfg.write_text(json.dumps({"mcpServers": {"e": {"command": sys.executable, "args": [str(script)]}}}))
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=64, device="cpu"),
                                   mcp_servers_config=str(cfg)))
    try:
        import httpx

        assert [t["tool"] for t in httpx.get(s.base + "/tools").json()] == ["e_echo", "e_add", "e_pid", "e_crash",
                                                                            "e_sleep"]
        assert call(s, "e_add", {"a": 1.5, "b": 2}) == (200, {"plain_text_response": "3.5"})
        mcp = s.app.state.mcp
    finally:
        s.stop()
    assert mcp.stopping.is_set() and mcp.transports == {}  # the lifespan closed the children


DEAF_SERVER = r'''
import json, sys, time
for line in sys.stdin:
    req = json.loads(line)
    if req.get("method") == "initialize":
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": {"protocolVersion": "2024-11-05",
                                     "capabilities": {}, "serverInfo": {"name": "deaf", "version": "1"}}}) + "\n")
        sys.stdout.flush()
    elif req.get("method") == "notifications/initialized":
        time.sleep(60)  # reads nothing more: a big request fills the pipe
'''


def test_child_that_stops_reading_times_out(tmp_path):
    """A request the child never reads (the pipe full) ends at ``timeout_ms``, not never."""
    from cooktop.server.mcp_config import McpServerConfig
    from cooktop.server.mcp_servers import McpServers

    script = tmp_path / "deaf.py"
    script.write_text(DEAF_SERVER)
    m = McpServers([McpServerConfig("d", sys.executable, (str(script),), timeout_ms=500)])
    try:
        t0 = time.monotonic()
        assert m.call_tool("d", "x", {"blob": "y" * (4 << 20)}) == {"error": "request timed out"}
        assert time.monotonic() - t0 < 3
    finally:
        m.close()
