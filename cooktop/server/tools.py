"""llama-server's built-in agent tools (``--tools``, experimental there: tools/server/server-tools.cpp,
routes in server.cpp): ``GET /tools`` lists the enabled tools, ``POST /tools`` runs one.

``POST /tools`` body: ``{"tool": NAME, "params": {...}, "stream": bool}``. A tool's own answer is HTTP 200:
``{"plain_text_response": ...}`` (plus ``entries`` / ``base`` for ``file_glob_search``, ``result`` /
``path`` / ``bytes`` / ``edits_applied`` for the writers, ``os`` / ``cwd`` for ``get_info``) or
``{"error": MESSAGE}``. A body that is not JSON or lacks a field: 400 ``invalid_request_error``; an unknown
tool or ``stream`` on a tool that cannot stream: 404 (``code`` 400, ``invalid_request_error``, as
llama-server); a bad runtime: 500 ``server_error``. ``stream: true`` (``exec_shell_command`` only) answers
``text/event-stream``: ``data: {"chunk": TEXT}`` events, then ``data: {"done": true}`` (with ``error``
when it failed). With ``--tools`` unset both routes answer 403 ``feature_disabled``.

Headers (a model-sent ``cwd`` / ``runtime`` / ``resp_type`` param is dropped, as llama-server):
``x-tool-cwd`` the folder relative paths resolve against and the shell runs in, ``x-tool-runtime`` an
isolate (validated only, :func:`.tools_io.check_runtime`), ``x-resp-type: base64`` ``read_file``'s raw
bytes. Unlike llama-server, the file tools are confined to that folder (or the server's working folder):
see :mod:`.tools_io`. ``exec_shell_command`` runs any command the server's user may run; only its working
folder, output size (16 KB) and time (60 s) are bounded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import subprocess
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from .mcp_servers import from_config, tool_entry
from .tools_edit import apply_edits
from .tools_io import (
    RuntimeSpecError,
    ToolError,
    ToolRoot,
    check_runtime,
    list_entries,
    path_glob_match,
    run_shell,
    shown,
)

log = logging.getLogger("cooktop.server")

READ_FILE_MAX_SIZE = 16 * 1024  # SERVER_TOOL_READ_FILE_MAX_SIZE (bytes)
READ_FILE_MAX_SIZE_BASE64 = 32 * 1024 * 1024
FILE_SEARCH_MAX_RESULTS = 100
GREP_SEARCH_MAX_RESULTS = 100
SHELL_MAX_OUTPUT = 16 * 1024  # SERVER_TOOL_EXEC_SHELL_COMMAND_MAX_OUTPUT_SIZE (bytes)
SHELL_MAX_TIMEOUT = 60  # seconds
GET_INFO_TIMEOUT = 5

#: (name, display name, write permission, can stream, description, properties, required), in llama-server's order
SPECS: list[tuple[str, str, bool, bool, str, dict[str, Any], list[str]]] = [
    ("read_file", "Read file", False, False,
     "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, each line "
     "is prefixed with its line number (e.g. \"1\u2192...\").",
     {"path": ("string", "Path to the file"),
      "start_line": ("integer", "First line to read, 1-based (default: 1)"),
      "end_line": ("integer", "Last line to read, 1-based inclusive (default: end of file)"),
      "append_loc": ("boolean", "Prefix each line with its line number")}, ["path"]),
    ("file_glob_search", "File search", False, False,
     "Recursively search for files matching a glob pattern under a directory. Automatically skips files "
     "ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, "
     "node_modules, build, dist, etc.) otherwise. A pattern with no '/' (e.g. \"*.cpp\") matches the file's "
     "basename at any depth. A pattern containing '/' matches the full relative path; unless already anchored "
     "with \"**/\" or a leading '/', it is automatically prefixed with \"**/\". Use type=\"dir\" or \"all\" to "
     "also list directories; directory entries are suffixed with '/' in the output. Note: directory listings "
     "do not apply .gitignore filtering.",
     {"path": ("string", "Base directory to search in"),
      "include": ("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"),
      "exclude": ("string", "Glob pattern for files to exclude"),
      "type": ("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
      "max_depth": ("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = "
                               "direct children only)"),
      "limit": ("integer", f"Maximum number of results to return, capped at {FILE_SEARCH_MAX_RESULTS} "
                           f"(default {FILE_SEARCH_MAX_RESULTS})")}, ["path"]),
    ("grep_search", "Grep search", False, False,
     "Search for a pattern in files under a path. Returns matching lines with file paths (and, unless "
     "searching a single file, paths relative to the given directory). Automatically skips files ignored by "
     ".gitignore (when the directory is inside a git repo) and common junk directories (.git, node_modules, "
     "build, dist, etc.) otherwise. include/exclude: a pattern with no '/' matches the basename at any depth; "
     "a pattern containing '/' matches the full relative path (auto-anchored with \"**/\" unless already "
     "anchored).",
     {"path": ("string", "File or directory to search in"),
      "pattern": ("string", "Pattern to search for (regular expression unless literal is true)"),
      "include": ("string", "Glob pattern to filter files (default: **)"),
      "exclude": ("string", "Glob pattern to exclude files"),
      "return_line_numbers": ("boolean", "If true, include line numbers in results"),
      "literal": ("boolean", "Treat pattern as a literal string instead of a regular expression (default: false)"),
      "ignore_case": ("boolean", "Case-insensitive search (default: false)"),
      "context_lines": ("integer", "Number of lines of context to show before and after each match (default: 0)")},
     ["path", "pattern"]),
    ("exec_shell_command", "Execute shell command", True, True,
     "Execute a shell command and return its output (stdout and stderr combined).",
     {"command": ("string", "Shell command to execute"),
      "timeout": ("integer", f"Timeout in seconds (default 10, max {SHELL_MAX_TIMEOUT})"),
      "max_output_size": ("integer", f"Maximum output size in bytes (default {SHELL_MAX_OUTPUT})")}, ["command"]),
    ("write_file", "Write file", True, False,
     "Write content to a file, creating it (including parent directories) if it does not exist. May use with "
     "edit_file for more complex edits.",
     {"path": ("string", "Path of the file to write"), "content": ("string", "Content to write")},
     ["path", "content"]),
    ("edit_file", "Edit file", True, False,
     "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and is matched "
     "against the original content, not incrementally. Merge nearby changes into one edit instead of "
     "overlapping edits. Use write_file to replace the whole file.",
     {"path": ("string", "Path to the file to edit"),
      "edits": ("array", "One or more exact text replacements to apply")},
     ["path", "edits"]),
    ("get_info", "Get Runtime Info", False, False,
     "Returns runtime info: the OS name/version and the current working directory", {}, []),
]
TOOL_NAMES = [s[0] for s in SPECS]


class BadRequest(Exception):
    """A required param missing or of the wrong type (llama-server: a JSON exception, HTTP 400)."""


def enabled_tools(spec: str) -> list[str]:
    """The tools ``--tools SPEC`` enables (``all`` or comma-separated names), in llama-server's order.

    Raises:
        ValueError: ``unknown tool "X". available tools: read_file, ...`` (llama-server's startup error).
    """
    names = [n.strip() for n in spec.split(",") if n.strip()]
    for n in names:
        if n != "all" and n not in TOOL_NAMES:
            raise ValueError(f'unknown tool "{n}". available tools: {", ".join(TOOL_NAMES)}')
    return [t for t in TOOL_NAMES if t in names or "all" in names]


def check_tools_runtime(spec: str) -> None:
    """Validate ``--tools-runtime SPEC`` as llama-server does at startup, then refuse it: cooktop runs the
    tools on the host only.

    Raises:
        ValueError: llama-server's messages (:func:`.tools_io.check_runtime`), or ``--tools-runtime SPEC:
            running tools in a container or over ssh is not supported by cooktop``.
    """
    if not spec:
        return
    try:
        check_runtime(spec, per_call=False)
    except RuntimeSpecError as e:
        raise ValueError(str(e)) from None
    raise ValueError(f"--tools-runtime {spec}: running tools in a container or over ssh is not supported by cooktop")


def definition(spec: tuple[str, str, bool, bool, str, dict[str, Any], list[str]]) -> dict[str, Any]:
    """``GET /tools``'s entry of one tool (server-tools.cpp ``server_tool::to_json``)."""
    name, display, write, _stream, desc, props, required = spec
    properties: dict[str, Any] = {k: {"type": t, "description": d} for k, (t, d) in props.items()}
    if name == "edit_file":
        properties["edits"]["items"] = {"type": "object", "properties": {
            "old_text": {"type": "string", "description": "Exact text to find; must be unique in the file and must "
                                                          "not overlap with other edits"},
            "new_text": {"type": "string", "description": "Text to replace old_text with"}},
            "required": ["old_text", "new_text"]}
    params: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        params["required"] = required
    return {"display_name": display, "tool": name, "type": "server", "permissions": {"write": write},
            "uses_cwd": True, "definition": {"type": "function", "function": {
                "name": name, "description": desc, "parameters": params}}}


def _req(params: dict[str, Any], key: str, typ: type) -> Any:
    v = params.get(key)
    if not isinstance(v, typ) or (typ is not bool and isinstance(v, bool)):
        raise BadRequest(f'missing or invalid parameter "{key}" (expected {typ.__name__})')
    return v


def _opt(params: dict[str, Any], key: str, default: Any) -> Any:
    """llama.cpp's ``json_value``: the default when the key is missing or of another type."""
    v = params.get(key)
    if v is None or type(v) is not type(default):
        return default
    return v


def _lines(data: bytes) -> list[bytes]:
    """``std::getline`` pieces: split at ``\\n``, no trailing empty piece."""
    parts = data.split(b"\n")
    return parts[:-1] if parts and parts[-1] == b"" else parts


def read_file(p: dict[str, Any], root: ToolRoot) -> dict[str, Any]:
    """server-tools.cpp ``server_tool_read_file`` (16 KB text, 32 MB base64)."""
    path = _req(p, "path", str)
    start, end, loc = _opt(p, "start_line", 1), _opt(p, "end_line", -1), _opt(p, "append_loc", False)
    real = root.resolve(path)
    if not os.path.isfile(real):
        raise ToolError(f"cannot stat file: {path}")
    size = os.path.getsize(real)
    b64 = p.get("resp_type") == "base64"
    limit = READ_FILE_MAX_SIZE_BASE64 if b64 else READ_FILE_MAX_SIZE
    if size > limit and (b64 or end == -1):
        hint = "" if b64 else ". Use start_line/end_line to read a portion."
        raise ToolError(f"file too large ({size} bytes, max {limit}){hint}")
    try:
        with open(real, "rb") as f:
            data = f.read()
    except OSError:
        raise ToolError(f"failed to open file: {path}") from None
    if b64:
        return {"base64": base64.b64encode(data).decode("ascii"), "size_bytes": len(data)}
    out = bytearray()
    for n, line in enumerate(_lines(data), 1):
        if n < start:
            continue
        if end != -1 and n > end:
            break
        piece = (f"{n}\u2192".encode() if loc else b"") + line + b"\n"
        if len(out) + len(piece) > READ_FILE_MAX_SIZE:
            out += b"[output truncated]"
            break
        out += piece
    return {"plain_text_response": out.decode("utf-8", "replace")}


def file_glob_search(p: dict[str, Any], root: ToolRoot) -> dict[str, Any]:
    """server-tools.cpp ``server_tool_file_glob_search`` (at most 100 results)."""
    path = _req(p, "path", str)
    base = root.resolve(path)
    include, exclude, kind = _opt(p, "include", "**"), _opt(p, "exclude", ""), _opt(p, "type", "file")
    max_depth = max(0, _opt(p, "max_depth", 0))
    limit_req = _opt(p, "limit", FILE_SEARCH_MAX_RESULTS)
    if limit_req < 1:
        raise ToolError(f"invalid limit: {limit_req} (expected 1 or more)")
    if kind not in ("file", "dir", "all"):
        raise ToolError(f'invalid type: {kind} (expected "file", "dir" or "all")')
    try:
        entries, truncated = list_entries(root, base, max_depth, kind)
    except ToolError as e:
        raise ToolError(f"{e}: {path}") from None
    matches = [(r, d) for r, d in entries
               if path_glob_match(include, r) and not (exclude and path_glob_match(exclude, r))]
    top = [(shown(r), d) for r, d in matches[:min(limit_req, FILE_SEARCH_MAX_RESULTS)]]
    text = "".join(r + ("/" if d else "") + "\n" for r, d in top)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(top):
        text += (f"[{len(top)} results limit reached ({len(matches)} total matches). Refine the glob pattern "
                 "to narrow the search.]\n")
    if truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    return {"plain_text_response": text, "entries": [{"path": r, "type": "dir" if d else "file"} for r, d in top],
            "base": shown(base)}


def grep_search(p: dict[str, Any], root: ToolRoot) -> dict[str, Any]:
    """server-tools.cpp ``server_tool_grep_search`` (Python ``re`` for ECMAScript; at most 100 matches)."""
    path, pat = _req(p, "path", str), _req(p, "pattern", str)
    include, exclude = _opt(p, "include", "**"), _opt(p, "exclude", "")
    ctx = max(0, _opt(p, "context_lines", 0))
    show_num = _opt(p, "return_line_numbers", False) or ctx > 0
    try:
        rx = re.compile(re.escape(pat) if _opt(p, "literal", False) else pat,
                        re.IGNORECASE if _opt(p, "ignore_case", False) else 0)
    except re.error as e:
        raise ToolError(f"invalid regex: {e}") from None
    real = root.resolve(path)
    if os.path.isfile(real):
        files = [(real, path)]
    elif os.path.isdir(real):
        try:
            entries, _ = list_entries(root, real, 0, "file")
        except ToolError as e:
            raise ToolError(f"{e}: {path}") from None
        files = [(os.path.join(real, r), r) for r, _d in entries
                 if path_glob_match(include, r) and not (exclude and path_glob_match(exclude, r))]
    else:
        raise ToolError(f"path does not exist: {path}")
    out: list[str] = []
    total, full = 0, False
    for fpath, name in files:
        if full:
            break
        try:
            with open(fpath, "rb") as f:
                lines = [x.decode("utf-8", "replace") for x in _lines(f.read())]
        except OSError:
            continue
        for i, line in enumerate(lines):
            if total >= GREP_SEARCH_MAX_RESULTS:
                full = True
                break
            if not rx.search(line):
                continue
            for j in range(max(0, i - ctx), min(len(lines) - 1, i + ctx) + 1):
                sep = ":" if j == i else "-"
                out.append(f"{shown(name)}{sep}{f'{j + 1}{sep}' if show_num else ''}{lines[j]}\n")
            if ctx > 0:
                out.append("--\n")
            total += 1
    text = "".join(out) + f"\n---\nTotal matches: {total}\n"
    if full:
        text += f"[{GREP_SEARCH_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}


def write_file(p: dict[str, Any], root: ToolRoot) -> dict[str, Any]:
    """server-tools.cpp ``server_tool_write_file`` (parent folders created)."""
    path, content = _req(p, "path", str), _req(p, "content", str)
    real = root.resolve(path)
    data = content.encode("utf-8", "surrogateescape")
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
        with open(real, "wb") as f:
            f.write(data)
    except OSError:
        raise ToolError(f"failed to write file: {path}") from None
    return {"result": "file written successfully", "path": path, "bytes": len(data)}


def edit_file(p: dict[str, Any], root: ToolRoot) -> dict[str, Any]:
    """server-tools.cpp ``server_tool_edit_file`` (:func:`.tools_edit.apply_edits`)."""
    path = _req(p, "path", str)
    if "edits" not in p:
        raise BadRequest('missing or invalid parameter "edits" (expected list)')
    real = root.resolve(path)
    try:
        with open(real, "rb") as f:
            original = f.read().decode("utf-8", "surrogateescape")
    except OSError:
        raise ToolError(f"failed to open file: {path}") from None
    new, n = apply_edits(original, p["edits"], path)
    try:
        with open(real, "wb") as f:
            f.write(new.encode("utf-8", "surrogateescape"))
    except OSError:
        raise ToolError(f"failed to write file: {path}") from None
    return {"result": "file edited successfully", "path": path, "edits_applied": n}


def get_info(p: dict[str, Any], root: ToolRoot) -> dict[str, Any]:
    """server-tools.cpp ``server_tool_get_info``: ``uname -a`` and the tools root."""
    try:
        r = subprocess.run(["uname", "-a"], capture_output=True, timeout=GET_INFO_TIMEOUT, stdin=subprocess.DEVNULL)
        os_info = r.stdout.decode("utf-8", "replace").strip() if r.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        os_info = "unknown"
    return {"os": os_info, "cwd": shown(root.root)}


FILE_TOOLS: dict[str, Callable[[dict[str, Any], ToolRoot], dict[str, Any]]] = {
    "read_file": read_file, "file_glob_search": file_glob_search, "grep_search": grep_search,
    "write_file": write_file, "edit_file": edit_file, "get_info": get_info}


def _shell_args(p: dict[str, Any]) -> tuple[str, int, int]:
    command = _req(p, "command", str)
    timeout = min(_opt(p, "timeout", 10), SHELL_MAX_TIMEOUT)
    size = _opt(p, "max_output_size", SHELL_MAX_OUTPUT)
    return command, timeout, SHELL_MAX_OUTPUT if size < 0 else min(size, SHELL_MAX_OUTPUT)


def _tail(code: int, timed_out: bool) -> str:
    return f"\n[exit code: {code}]" + (" [exit due to timed out]" if timed_out else "")


def _sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


def _params(body: dict[str, Any], request: Request, runtime: str) -> dict[str, Any]:
    """The call's params with ``cwd`` / ``runtime`` / ``resp_type`` taken from the headers only."""
    params = body.get("params", {})
    if not isinstance(params, dict):
        raise BadRequest('"params" must be an object')
    params = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
    for key, header in (("cwd", "x-tool-cwd"), ("runtime", "x-tool-runtime"), ("resp_type", "x-resp-type")):
        if request.headers.get(header):
            params[key] = request.headers[header]
    if "runtime" not in params and runtime:
        params["runtime"] = runtime
    return params


def _check_runtime(params: dict[str, Any]) -> None:
    spec = params.get("runtime")
    if spec:
        check_runtime(spec)
        raise RuntimeSpecError(f"tool runtime {spec}: running tools in a container or over ssh is not "
                               "supported by cooktop")


def tools_app(config: Any) -> FastAPI:
    """A FastAPI app with only ``GET`` / ``POST /tools`` for ``config`` (a ``ServerConfig``): router mode's
    (llama-server's router serves ``/tools`` itself, no model named).

    Raises:
        ValueError: as :func:`register`.
    """
    import types

    app = FastAPI()
    register(app, types.SimpleNamespace(config=config))
    return app


def register(app: FastAPI, bridge: Any) -> None:
    """Add ``GET`` / ``POST /tools`` to ``app`` (403 unless ``bridge.config.tools`` names some or MCP
    servers are configured: :mod:`.mcp_servers`, warmed up here, their manager left in ``app.state.mcp``).

    Raises:
        ValueError: an unknown tool in ``config.tools``, or a ``config.tools_runtime`` (see
            :func:`check_tools_runtime`); McpConfigError (a ValueError): an unreadable MCP config.
    """
    names = enabled_tools(bridge.config.tools or "")
    runtime = bridge.config.tools_runtime or ""
    check_tools_runtime(runtime)
    specs = {s[0]: s for s in SPECS if s[0] in names}
    app.state.mcp = mcp = from_config(bridge.config)  # closed by the app's lifespan
    mcp_tools: dict[str, Any] = {}  # "<server>_<tool>" -> McpToolDef, a name already taken skipped
    for d in mcp.list_tools() if mcp else []:
        if f"{d.server}_{d.name}" in specs or f"{d.server}_{d.name}" in mcp_tools:
            log.warning('MCP tool "%s_%s" collides with an existing tool, skipping', d.server, d.name)
            continue
        mcp_tools[f"{d.server}_{d.name}"] = d

    def disabled() -> JSONResponse:
        return JSONResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
                            status_code=403)

    def fail(status: int, message: str, kind: str) -> JSONResponse:
        code = 400 if kind == "invalid_request_error" else 500
        return JSONResponse({"error": {"code": code, "message": message, "type": kind}}, status_code=status)

    @app.get("/tools")
    async def tools_get():
        if not specs and mcp is None:
            return disabled()
        return JSONResponse([definition(s) for s in specs.values()] + [tool_entry(d) for d in mcp_tools.values()])

    @app.post("/tools")
    async def tools_post(request: Request):
        if not specs and mcp is None:
            return disabled()
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict) or not isinstance(body.get("tool"), str):
                raise BadRequest('missing or invalid field "tool" (expected a string)')
            name, stream = body["tool"], body.get("stream", False) is True
            params = _params(body, request, runtime)
            if name in mcp_tools and mcp is not None and not stream:
                d, args = mcp_tools[name], {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
                return JSONResponse(await run_in_threadpool(mcp.call_tool, d.server, d.name, args))
            if name in mcp_tools:
                return fail(404, f'tool "{name}" does not support stream = true', "invalid_request_error")
            if name not in specs:
                return fail(404, f'unknown tool "{name}"', "invalid_request_error")
            if stream and not specs[name][3]:
                return fail(404, f'tool "{name}" does not support stream = true', "invalid_request_error")
            if stream:
                return StreamingResponse(_stream(params), media_type="text/event-stream")
            _check_runtime(params)
            if name == "exec_shell_command":
                root = ToolRoot(params.get("cwd", ""))
                command, timeout, size = _shell_args(params)
                out, code, timed_out = await run_shell(command, root.root, size, timeout)
                return JSONResponse({"plain_text_response": out + _tail(code, timed_out)})
            return JSONResponse(await run_in_threadpool(FILE_TOOLS[name], params, ToolRoot(params.get("cwd", ""))))
        except ToolError as e:
            return JSONResponse({"error": str(e)})
        except (json.JSONDecodeError, UnicodeDecodeError, BadRequest) as e:
            return fail(400, str(e), "invalid_request_error")
        except RuntimeSpecError as e:
            return fail(500, str(e), "server_error")
        except OSError as e:  # the shell could not be spawned (llama-server: "failed to spawn process")
            return fail(500, f"failed to spawn process: {e}", "server_error")

    async def _stream(params: dict[str, Any]):
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def work() -> None:
            done: dict[str, Any] = {"done": True}
            try:
                _check_runtime(params)
                root = ToolRoot(params.get("cwd", ""))
                command, timeout, size = _shell_args(params)

                async def push(chunk: str) -> None:
                    await queue.put({"chunk": chunk})

                _, code, timed_out = await run_shell(command, root.root, size, timeout, push)
                await queue.put({"chunk": _tail(code, timed_out)})
            except (ToolError, BadRequest, RuntimeSpecError, OSError) as e:
                done["error"] = str(e)
            await queue.put(done)

        task = asyncio.create_task(work())
        try:
            while True:
                event = await queue.get()
                yield _sse(event)
                if event.get("done"):
                    break
        finally:  # the client left: the task's cancellation kills the command's process group
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

