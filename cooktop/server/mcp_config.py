"""llama-server's MCP server config (``--mcp-servers-config FILE`` / ``--mcp-servers-json JSON``,
tools/server/server-mcp.cpp ``server_mcp_server_config``), the Cursor / Claude-desktop shape:
``{"mcpServers": {NAME: {"command": ..., "args": [...], "env": {...}, "cwd": ..., "timeout_ms": 30000}}}``.
An entry without ``command`` is skipped, a missing ``mcpServers`` means none; the file's servers come
first, then the inline JSON's, a name seen twice skipped. Run by :mod:`.mcp_servers`.
"""

from __future__ import annotations

import dataclasses
import json
import logging

log = logging.getLogger("cooktop.server")

DEFAULT_TIMEOUT_MS = 30000  # per call (server_mcp_server_config::timeout_ms)


class McpConfigError(ValueError):
    """An MCP config that cannot be read or is not JSON (llama-server: "failed to parse MCP config JSON")."""


@dataclasses.dataclass(frozen=True)
class McpServerConfig:
    """One ``mcpServers`` entry: ``name`` (the key), ``command`` and ``args`` to spawn, ``env`` merged over
    the server's own environment, ``cwd`` ("" the server's), ``timeout_ms`` per call (milliseconds)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""
    timeout_ms: int = DEFAULT_TIMEOUT_MS


def parse_servers(text: str) -> list[McpServerConfig]:
    """The servers of one config text (server_mcp_server_config::parse_cursor_format).

    Raises:
        McpConfigError: not JSON, or a field of the wrong type (``args`` not strings, ...).
    """
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise McpConfigError(f"failed to parse MCP config JSON: {e}") from None
    servers = obj.get("mcpServers") if isinstance(obj, dict) else None
    if not isinstance(servers, dict):
        return []
    out = []
    for name, cfg in servers.items():
        if not isinstance(cfg, dict):
            raise McpConfigError(f"failed to parse MCP config JSON: server '{name}' is not an object")
        command, args, env = cfg.get("command", ""), cfg.get("args", []), cfg.get("env", {})
        cwd, timeout = cfg.get("cwd", ""), cfg.get("timeout_ms", DEFAULT_TIMEOUT_MS)
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args) \
                or not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()) \
                or not isinstance(command, str) or not isinstance(cwd, str) \
                or not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise McpConfigError(f"failed to parse MCP config JSON: server '{name}': command and cwd must be "
                                 "strings, args a list of strings, env an object of strings, timeout_ms a "
                                 "positive integer")
        if not command:
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        out.append(McpServerConfig(name, command, tuple(args), tuple(env.items()), cwd, timeout))
    return out


def load_servers(config_path: str = "", config_json: str = "") -> list[McpServerConfig]:
    """The servers of ``--mcp-servers-config`` (a file) then ``--mcp-servers-json``, a repeated name skipped
    (server_mcp::start). [] when both are "".

    Raises:
        McpConfigError: the file cannot be read, or either text as :func:`parse_servers`.
    """
    texts = []
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError) as e:
            raise McpConfigError(f"failed to open MCP config file: {config_path} ({e})") from None
    if config_json:
        texts.append(config_json)
    out: list[McpServerConfig] = []
    for text in texts:
        parsed = parse_servers(text)
        if not parsed:
            log.warning("MCP config: no servers found in JSON")
        for cfg in parsed:
            if any(c.name == cfg.name for c in out):
                log.warning("MCP config: duplicate server name '%s', skipping", cfg.name)
                continue
            out.append(cfg)
    return out
