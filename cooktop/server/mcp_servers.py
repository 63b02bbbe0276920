"""llama-server's MCP servers (``--mcp-servers-config FILE`` / ``--mcp-servers-json JSON``, experimental
there: tools/server/server-mcp.cpp): child processes speaking MCP's JSON-RPC over stdio (one JSON message
a line), whose tools ``GET`` / ``POST /tools`` (:mod:`.tools`) list and run as ``<server>_<tool>``.

The config is :mod:`.mcp_config`'s.

Lifecycle, as llama-server: at startup (:meth:`McpServers.warmup`) each server is spawned, its
``tools/list`` read (at most 10 s) and the child closed; the first call to one of its tools spawns it
again and keeps it. A child that died is respawned on the next call; one that cannot be spawned is
retried only after 5 s. Calls to one server run one at a time (its replies are matched by ``id``;
notifications and stale or malformed lines are skipped); each is bounded by the server's ``timeout_ms``.
:func:`shutdown_all` (on SIGTERM / SIGINT) makes every call in flight answer ``cancelled`` at once.

Written here rather than on the ``mcp`` SDK: its stdio client and session are anyio context managers
that must be opened and closed in one task (a session shared by every request, respawned after a crash,
needs a supervising task per server), and llama-server's semantics (the per-call deadline that skips
stale replies, the polled reader that a grandchild holding the pipes cannot hang, the spawn cooldown)
are this module's few lines of JSON-RPC anyway.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import select
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .mcp_config import McpServerConfig, load_servers

log = logging.getLogger("cooktop.server")

PROTOCOL_VERSION = "2024-11-05"  # MCP_PROTOCOL_VERSION of server-mcp.cpp
COOLDOWN_S = 5.0  # MCP_COOLDOWN_SECONDS: no respawn attempt this long after a failed spawn
WARMUP_TIMEOUT_S = 10.0  # MCP_WARMUP_TIMEOUT_SECONDS: tool discovery per server at startup
POLL_S = 0.05  # the readers' and waiters' poll slice (seconds)
MAX_LINE = 8 * 1024 * 1024  # a longer line from a child is dropped (bytes)
ERR_TAIL_MAX = 4096  # the child's stderr kept for diagnostics (bytes)

_MANAGERS: weakref.WeakSet[McpServers] = weakref.WeakSet()


@dataclasses.dataclass(frozen=True)
class McpToolDef:
    """A tool one server advertised: ``name`` bare (no ``<server>_``), ``input_schema`` its JSON Schema
    (None: none given)."""

    server: str
    name: str
    description: str
    input_schema: Any


def _error_message(reply: dict[str, Any]) -> str:
    e = reply.get("error")
    if isinstance(e, dict):
        return str(e.get("message", "unknown error"))
    return e if isinstance(e, str) else "unknown error"


def _tool_answer(result: Any) -> dict[str, Any]:
    """``POST /tools``'s answer of a ``tools/call`` result: its text parts joined by newlines, an
    ``isError`` result as ``{"error": ...}`` (server-mcp.cpp ``mcp_result_to_response``)."""
    parts = result.get("content") if isinstance(result, dict) else None
    text = "\n".join(str(p.get("text", "")) for p in parts or [] if isinstance(p, dict) and p.get("type") == "text")
    if isinstance(result, dict) and result.get("isError"):
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


class StdioTransport:
    """One spawned MCP server: its JSON-RPC session over the child's stdin / stdout (stderr drained into
    a tail kept for diagnostics). Calls are serialized by a lock; ids restart at 1 per spawn.

    Args:
        cfg: the server; stopping: set when the process shuts down (calls in flight answer at once).
    """

    def __init__(self, cfg: McpServerConfig, stopping: threading.Event):
        self.cfg, self.stopping = cfg, stopping
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.running = threading.Event()
        self.lock = threading.Lock()
        self.next_id, self.initialized, self.last_error, self.err_tail = 1, False, "", b""
        self.tools: list[McpToolDef] | None = None
        self.threads: list[threading.Thread] = []

    def start(self) -> bool:
        """Spawn the child (in a session of its own, so :meth:`close` ends its children too); False with
        :attr:`last_error` set when it cannot be spawned."""
        env = {**os.environ, **dict(self.cfg.env)}
        try:
            self.proc = subprocess.Popen([self.cfg.command, *self.cfg.args], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                         cwd=self.cfg.cwd or None, start_new_session=True)
        except (OSError, ValueError) as e:
            self.last_error = f"failed to spawn '{self.cfg.command}': {e}"
            return False
        self.running.set()
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)  # written by _send's polled loop only
        assert self.proc.stdout is not None and self.proc.stderr is not None
        for fd, sink in ((self.proc.stdout.fileno(), self.lines.put), (self.proc.stderr.fileno(), self._err)):
            t = threading.Thread(target=self._pump, args=(fd, sink, sink == self.lines.put), daemon=True,
                                 name=f"mcp-{self.cfg.name}")
            t.start()
            self.threads.append(t)
        return True

    @property
    def alive(self) -> bool:
        """The child runs and its stdout is open."""
        return self.running.is_set() and self.proc is not None and self.proc.poll() is None

    def _err(self, line: bytes) -> None:
        log.debug("MCP '%s' stderr: %s", self.cfg.name, line.decode("utf-8", "replace"))
        self.err_tail = (self.err_tail + line + b"\n")[-ERR_TAIL_MAX:]

    def _pump(self, fd: int, sink: Callable[[bytes], None], is_stdout: bool) -> None:
        """Hand each line of ``fd`` to ``sink`` until EOF or :meth:`close`; polled, so a grandchild still
        holding the pipe open cannot keep it waiting (server-mcp.cpp ``mcp_pump_ndjson``)."""
        buf, skipping = b"", False
        while self.running.is_set():
            try:
                ready, _, _ = select.select([fd], [], [], POLL_S)
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
            except (OSError, ValueError):
                break
            if not chunk:
                break
            buf += chunk
            if skipping:
                if b"\n" not in buf:
                    buf = b""
                    continue
                buf, skipping = buf.split(b"\n", 1)[1], False
            *done, buf = buf.split(b"\n")
            for line in done:
                if line.strip():
                    sink(line.rstrip(b"\r"))
            if len(buf) > MAX_LINE:
                log.warning("MCP '%s': dropping a line over %d bytes", self.cfg.name, MAX_LINE)
                buf, skipping = b"", True
        if is_stdout:  # EOF on stdout: the session is over
            self.running.clear()

    def diagnostics(self) -> str:
        """The last RPC error and the tail of the child's stderr, for a log line."""
        tail = self.err_tail.decode("utf-8", "replace").strip()
        return "; ".join(s for s in (self.last_error, f"stderr: {tail}" if tail else "") if s) or "no details"

    def _send(self, msg: dict[str, Any], deadline: float) -> str:
        """Write one line to the child's stdin, polled, so a child that stops reading cannot hold the
        lock past ``deadline`` (monotonic seconds) or shutdown: "" once written, else why not
        (``transport closed`` / ``request timed out`` / ``cancelled``)."""
        data = json.dumps(msg).encode() + b"\n"
        if self.proc is None or self.proc.stdin is None:
            return "transport closed"
        fd = self.proc.stdin.fileno()
        while data:
            if self.stopping.is_set():
                return "cancelled"
            if time.monotonic() >= deadline:
                return "request timed out"
            try:
                _, ready, _ = select.select([], [fd], [], POLL_S)
                if ready:
                    data = data[os.write(fd, data):]
            except (OSError, ValueError):
                return "transport closed"
        return ""

    def _rpc(self, method: str, params: Any, stop: Callable[[], bool], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait for the reply of its id (the lock held): the reply, or
        ``{"error": {"message": "request timed out" | "cancelled" | "transport closed"}}``."""
        rid, self.next_id = self.next_id, self.next_id + 1
        req: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            req["params"] = params
        deadline = time.monotonic() + timeout_s
        if why := self._send(req, deadline):
            return {"error": {"code": -32603, "message": why}}
        while True:
            if stop() or self.stopping.is_set():
                return {"error": {"code": -32603, "message": "cancelled"}}
            if time.monotonic() >= deadline:
                return {"error": {"code": -32603, "message": "request timed out"}}
            try:
                line = self.lines.get(timeout=POLL_S)
            except queue.Empty:
                if not self.running.is_set() and self.lines.empty():
                    return {"error": {"code": -32603, "message": "transport closed"}}
                continue
            try:
                reply = json.loads(line)
            except ValueError:
                continue  # a malformed line
            # no id: a notification; another id: the late reply of a request that timed out
            if isinstance(reply, dict) and reply.get("id") == rid and ("result" in reply or "error" in reply):
                return reply

    def _ensure_init(self, stop: Callable[[], bool], timeout_s: float) -> bool:
        if self.initialized:
            return True
        reply = self._rpc("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                         "clientInfo": {"name": "cooktop", "version": "1.0"}}, stop, timeout_s)
        if "result" not in reply:
            self.last_error = f"initialize failed: {_error_message(reply)}"
            return False
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"}, time.monotonic() + timeout_s)
        self.initialized = True
        return True

    def list_tools(self, stop: Callable[[], bool], timeout_s: float) -> list[McpToolDef]:
        """The server's tools (``tools/list``, once per spawn); [] with :attr:`last_error` set on failure."""
        with self.lock:
            if not self._ensure_init(stop, timeout_s):
                return []
            if self.tools is not None:
                return self.tools
            reply = self._rpc("tools/list", None, stop, timeout_s)
            if "result" not in reply:
                self.last_error = f"tools/list failed: {_error_message(reply)}"
                return []
            result = reply["result"]
            tools = result.get("tools") if isinstance(result, dict) else None
            self.tools = [McpToolDef(self.cfg.name, str(t.get("name", "")), str(t.get("description", "")),
                                     t.get("inputSchema")) for t in tools or [] if isinstance(t, dict)]
            return self.tools

    def call_tool(self, name: str, arguments: Any, stop: Callable[[], bool]) -> dict[str, Any]:
        """Run tool ``name`` (bare) with ``arguments``: ``POST /tools``'s answer (:func:`_tool_answer`) or
        ``{"error": MESSAGE}``, within the server's ``timeout_ms``."""
        timeout_s = self.cfg.timeout_ms / 1000
        with self.lock:
            if not self._ensure_init(stop, timeout_s):
                return {"error": self.last_error}
            reply = self._rpc("tools/call", {"name": name, "arguments": arguments}, stop, timeout_s)
            if "error" in reply:
                self.last_error = _error_message(reply)
                return {"error": self.last_error}
            if "result" in reply:
                return _tool_answer(reply["result"])
            return {"error": "invalid response from MCP server"}

    def close(self) -> None:
        """End the child and its process group (SIGKILL, as llama-server), stop the readers, reap it.
        Idempotent; returns within about a second even when a grandchild holds the pipes."""
        self.running.clear()
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        for t in self.threads:
            t.join(timeout=1)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        self.threads = []


class McpServers:
    """Every configured MCP server: the tools found at warmup and the live transports (server_mcp).

    Args:
        configs: the servers (:func:`load_servers`).
    """

    def __init__(self, configs: list[McpServerConfig]):
        self.configs = {c.name: c for c in configs}
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.transports: dict[str, StdioTransport] = {}
        self.dead_until: dict[str, float] = {}
        self.registry: list[McpToolDef] = []
        _MANAGERS.add(self)

    def warmup(self) -> None:
        """Spawn each server, read its tools (at most :data:`WARMUP_TIMEOUT_S` each), close it; a server
        that cannot be spawned or answer is logged and lists no tools."""
        found: list[McpToolDef] = []
        for cfg in self.configs.values():
            t = StdioTransport(cfg, self.stopping)
            if not t.start():
                log.warning("MCP warmup: failed to spawn '%s': %s", cfg.name, t.diagnostics())
                continue
            deadline = time.monotonic() + WARMUP_TIMEOUT_S

            def past(d: float = deadline) -> bool:
                return time.monotonic() >= d

            tools = t.list_tools(past, min(WARMUP_TIMEOUT_S, cfg.timeout_ms / 1000))
            if not tools and t.last_error:
                log.warning("MCP warmup: '%s': %s", cfg.name, t.diagnostics())
            log.info("MCP warmup: '%s' discovered %d tools", cfg.name, len(tools))
            found.extend(tools)
            t.close()
        with self.lock:
            self.registry = found

    def list_tools(self) -> list[McpToolDef]:
        """The tools found at warmup, in config order."""
        with self.lock:
            return list(self.registry)

    def _transport(self, name: str) -> StdioTransport | None:
        """The live transport of server ``name``, (re)spawned when needed; None while shutting down or
        within :data:`COOLDOWN_S` of a failed spawn."""
        stale: list[StdioTransport] = []
        try:
            with self.lock:
                cfg = self.configs.get(name)
                if cfg is None or self.stopping.is_set() or time.monotonic() < self.dead_until.get(name, 0):
                    return None
                t = self.transports.get(name)
                if t is not None:
                    if t.alive:
                        return t
                    log.warning("MCP '%s' is no longer alive: %s", name, t.diagnostics())
                    stale.append(self.transports.pop(name))
                fresh = StdioTransport(cfg, self.stopping)
                if fresh.start():
                    self.transports[name] = fresh
                    return fresh
                log.warning("MCP '%s': failed to start: %s", name, fresh.diagnostics())
                self.dead_until[name] = time.monotonic() + COOLDOWN_S
                return None
        finally:
            for s in stale:
                s.close()

    def call_tool(self, server: str, tool: str, arguments: Any,
                  stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """Run ``tool`` of ``server`` (blocking; call it off the event loop): ``POST /tools``'s answer, or
        ``{"error": "MCP server unavailable: NAME"}`` / the call's own error."""
        t = self._transport(server)
        if t is None:
            return {"error": f"MCP server unavailable: {server}"}
        return t.call_tool(tool, arguments, stop)

    def shutdown(self) -> None:
        """Make the calls in flight answer ``cancelled`` and refuse new ones (idempotent)."""
        self.stopping.set()

    def close(self) -> None:
        """:meth:`shutdown`, then end every live child."""
        self.shutdown()
        with self.lock:
            live, self.transports = list(self.transports.values()), {}
        for t in live:
            t.close()


def shutdown_all() -> None:
    """:meth:`McpServers.shutdown` every manager of this process (the server got SIGTERM / SIGINT: a tool
    call in flight must not hold its graceful shutdown up)."""
    for m in list(_MANAGERS):
        m.shutdown()


def tool_entry(d: McpToolDef) -> dict[str, Any]:
    """``GET /tools``'s entry of an MCP tool (server-tools.cpp ``server_mcp_tool``, ``to_json``): named
    ``<server>_<tool>``, type ``mcp``, its input schema as the function's ``parameters`` ({} if none)."""
    name = f"{d.server}_{d.name}"
    schema = d.input_schema if isinstance(d.input_schema, dict) else {}
    return {"display_name": name, "tool": name, "type": "mcp", "permissions": {"write": False},
            "uses_cwd": False, "definition": {"type": "function", "function": {
                "name": name, "description": d.description, "parameters": schema}}}


def from_config(config: Any) -> McpServers | None:
    """The warmed-up manager of ``config``'s ``mcp_servers_config`` / ``mcp_servers_json`` (a
    ``ServerConfig``); None when neither names a server.

    Raises:
        McpConfigError: as :func:`load_servers`.
    """
    configs = load_servers(getattr(config, "mcp_servers_config", ""), getattr(config, "mcp_servers_json", ""))
    if not configs:
        return None
    manager = McpServers(configs)
    manager.warmup()
    return manager
