"""The file system and process side of llama-server's built-in tools (tools/server/server-tools.cpp
``tools_io_basic``, ``make_tools_io``, ``glob_match`` of common/common.cpp), confined to one folder.

Every path a file tool is given is resolved as llama-server resolves it (a leading ``~`` expanded, a
relative path joined to the root, ``.`` / ``..`` dropped) and then, unlike llama-server, *every* symlink
in it followed (``os.path.realpath``): a path whose real location is not the root or under it is refused
with ``path is outside the tools root (ROOT): PATH``. The root is the ``x-tool-cwd`` folder when the
request sends one, else the server's working folder. Listings never descend into a linked folder (as
llama-server) and drop a linked entry that leads outside the root; grep reads only files inside it.

Runtimes (``--tools-runtime`` / ``x-tool-runtime``) are validated as llama-server validates them
(:func:`check_runtime`); running tools inside a container or over ssh is not implemented.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import re
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import CooktopError

#: directories a listing reports but never descends into (server-tools.cpp SERVER_TOOL_JUNK_DIR_NAMES)
JUNK_DIR_NAMES = frozenset({".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist",
                            "build", "target", ".cache", ".idea", ".vscode"})
LIST_TIMEOUT_S = 15  # SERVER_TOOL_LIST_ENTRIES_TIMEOUT: one listing's budget
GIT_LS_FILES_MAX_OUTPUT = 8 * 1024 * 1024  # SERVER_TOOL_GIT_LS_FILES_MAX_OUTPUT (bytes)


class ToolError(CooktopError):
    """A tool call's refusal or failure, answered as ``{"error": message}`` (HTTP 200, as llama-server)."""


class RuntimeSpecError(CooktopError):
    """A bad ``--tools-runtime`` / ``x-tool-runtime`` value (llama-server: HTTP 500 ``server_error``)."""


_SSH_TARGET = re.compile(r"[A-Za-z0-9._@-]+")
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_container_spec(spec: str) -> tuple[str, str, bool] | None:
    """``docker|podman[-container]:ARG`` -> (engine, ARG, attach); None for another spec
    (server-tools.cpp ``container_runtime_spec::parse``)."""
    for engine in ("docker", "podman"):
        if spec.startswith(engine + "-container:"):
            return engine, spec[len(engine) + len("-container:"):], True
        if spec.startswith(engine + ":"):
            return engine, spec[len(engine) + 1:], False
    return None


def check_runtime(spec: str, per_call: bool = True) -> None:
    """Validate a tool runtime as llama-server's ``make_tools_io`` (per call) or ``make_tools_runtime``
    (``--tools-runtime`` at startup, ``per_call=False``) does.

    A container id must start with a letter or digit and hold only ``[A-Za-z0-9._-]``; an ssh target must
    not start with ``-`` and hold only ``[A-Za-z0-9._@-]`` (either would otherwise become an option of
    docker / ssh, e.g. ``-oProxyCommand=...``).

    Raises:
        RuntimeSpecError: ``tool runtime must name a running container: S`` (``docker:IMAGE`` on a call),
            ``--tools-runtime docker:<image> requires an image name``, ``invalid container id: ID``,
            ``invalid ssh target: T``, ``unknown tool runtime: S``.
    """
    parsed = parse_container_spec(spec)
    if parsed is not None:
        engine, arg, attach = parsed
        if not attach:
            if per_call:
                raise RuntimeSpecError(f"tool runtime must name a running container: {spec}")
            if not arg:
                raise RuntimeSpecError(f"--tools-runtime {engine}:<image> requires an image name")
            return
        if not _CONTAINER_ID.fullmatch(arg):
            raise RuntimeSpecError(f"invalid container id: {arg}")
        return
    if spec.startswith("ssh:"):
        target = spec[4:]
        if not target or target[0] == "-" or not _SSH_TARGET.fullmatch(target):
            raise RuntimeSpecError(f"invalid ssh target: {target}")
        return
    raise RuntimeSpecError(f"unknown tool runtime: {spec}")


class ToolRoot:
    """The folder the file tools are confined to, and the working folder of ``exec_shell_command``.

    Args:
        cwd: the ``x-tool-cwd`` header's folder ("" : the server's working folder).

    Raises:
        ToolError: ``x-tool-cwd is not a directory: CWD``.
    """

    def __init__(self, cwd: str = ""):
        base = cwd or os.getcwd()
        if not os.path.isabs(base):
            base = os.path.join(os.getcwd(), base)
        self.root = os.path.realpath(base)
        if not os.path.isdir(self.root):
            raise ToolError(f"x-tool-cwd is not a directory: {cwd}")

    def lexical(self, path: str) -> str:
        """``path`` as llama-server's ``tools_io_basic::resolve`` makes it: ``~`` / ``~/`` expanded, joined to the
        root when relative, normalized (no symlink followed). The absolute path, a str."""
        p = os.path.expanduser(path) if path == "~" or path.startswith("~/") else path  # not ~user
        return os.path.normpath(os.path.join(self.root, p))

    def inside(self, real: str) -> bool:
        """Whether the real (symlink-free) path ``real`` is the root or under it."""
        return real == self.root or real.startswith(self.root.rstrip(os.sep) + os.sep)

    def resolve(self, path: str) -> str:
        """The real absolute path of ``path`` (every symlink followed; a missing tail kept).

        Raises:
            ToolError: ``path is outside the tools root (ROOT): PATH`` when it leads out of the root.
        """
        real = os.path.realpath(self.lexical(path))
        if not self.inside(real):
            raise ToolError(f"path is outside the tools root ({shown(self.root)}): {path}")
        return real


def shown(name: str) -> str:
    """A file name as it goes into JSON: bytes that are not UTF-8 (``os`` keeps them as surrogates) as U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def glob_match(pattern: str, s: str) -> bool:
    """llama.cpp's ``glob_match`` (common/common.cpp): ``*`` any run of non-``/`` characters, ``**``
    anything (``/`` too), ``?`` one non-``/`` character, ``[a-z]`` / ``[!a-z]`` a class."""
    return _glob_regex(pattern).fullmatch(s) is not None


_GLOB_CACHE: dict[str, re.Pattern[str]] = {}


def _glob_regex(pattern: str) -> re.Pattern[str]:
    if pattern in _GLOB_CACHE:
        return _GLOB_CACHE[pattern]
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append("(?s:.*)")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = i + 1
            neg = j < n and pattern[j] == "!"
            j += neg
            k = j + 1 if j < n and pattern[j] in "]-" else j
            while k < n and pattern[k] != "]":
                k += 1
            if k >= n:  # no closing bracket: a literal '['
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[j:k]
            items, m = [], 0
            while m < len(body):
                if m + 2 < len(body) and body[m + 1] == "-":
                    items.append(re.escape(body[m]) + "-" + re.escape(body[m + 2]))
                    m += 3
                else:
                    items.append(re.escape(body[m]))
                    m += 1
            out.append("[" + ("^" if neg else "") + "".join(items) + "]")
            i = k + 1
        else:
            out.append(re.escape(c))
            i += 1
    rx = re.compile("".join(out))
    _GLOB_CACHE[pattern] = rx
    return rx


def path_glob_match(pattern: str, rel: str) -> bool:
    """server-tools.cpp ``path_glob_match``: a pattern without ``/`` matches the base name at any depth,
    one with ``/`` the whole relative path (``**/`` prefixed unless it starts with ``**`` or ``/``)."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)


def list_entries(root: ToolRoot, base: str, max_depth: int, kind: str) -> tuple[list[tuple[str, bool]], bool]:
    """Entries under the real folder ``base`` as (``/``-separated relative path, is_dir), and whether the
    walk was cut short (server-tools.cpp ``tools_io_basic::list_entries``: ``git ls-files --cached
    --others --exclude-standard`` for files when ``base`` is in a git work tree, else a walk that reports
    but never enters junk folders and never follows a linked folder). ``max_depth`` 0: unlimited, 1: the
    direct children; ``kind``: ``file``, ``dir`` or ``all``. Entries leading out of the root are dropped.

    Raises:
        ToolError: ``path does not exist or is not a directory``.
    """
    if not os.path.isdir(base):
        raise ToolError("path does not exist or is not a directory")
    if kind == "file":
        try:  # argv, no shell; base is absolute so it cannot read as an option
            res = subprocess.run(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                                 capture_output=True, timeout=LIST_TIMEOUT_S, stdin=subprocess.DEVNULL)
            ok = res.returncode == 0 and len(res.stdout) <= GIT_LS_FILES_MAX_OUTPUT
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            out = []
            for line in res.stdout.decode("utf-8", "surrogateescape").splitlines():
                line = line.rstrip("\r").replace("\\", "/")
                if not line or (max_depth > 0 and line.count("/") + 1 > max_depth):
                    continue
                full = os.path.join(base, line)
                if os.path.isfile(full) and root.inside(os.path.realpath(full)):
                    out.append((line, False))
            return out, False
    return _walk(root, base, max_depth, kind)


def _walk(root: ToolRoot, base: str, max_depth: int, kind: str) -> tuple[list[tuple[str, bool]], bool]:
    import time

    deadline = time.monotonic() + LIST_TIMEOUT_S
    result: list[tuple[str, bool]] = []
    truncated = False
    stack = [(base, "", 0)]
    while stack:
        if time.monotonic() >= deadline:
            return result, True
        folder, rel_dir, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            truncated = True
            continue
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            try:
                is_dir = e.is_dir()
                is_file = not is_dir and e.is_file()
                link = e.is_symlink()
            except OSError:
                continue
            if link and not root.inside(os.path.realpath(e.path)):
                continue
            if is_dir:
                if kind in ("dir", "all"):
                    result.append((rel, True))
                if e.name in JUNK_DIR_NAMES:
                    continue
                if not link and (max_depth == 0 or depth + 1 < max_depth):
                    stack.append((e.path, rel, depth + 1))
            elif is_file and kind in ("file", "all"):
                result.append((rel, False))
    return result, truncated


async def run_shell(command: str, cwd: str, max_output: int, timeout_s: int,
                    on_chunk: Callable[[str], Awaitable[Any]] | None = None) -> tuple[str, int, bool]:
    """Run ``sh -c COMMAND`` in ``cwd`` (stdin closed, stderr into stdout, its own process group) as
    server-tools.cpp ``run_subprocess``: at most ``max_output`` bytes kept (then ``\\n[output truncated]``,
    the rest drained), the whole group killed after ``timeout_s`` seconds or when the task is cancelled
    (the client left). ``on_chunk`` gets each decoded piece as it is read.

    Returns:
        (output, exit code (1 when killed by a signal, as llama.cpp's subprocess.h reports it), timed out).
    """
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    kept, parts, truncated, timed_out = 0, [], False, False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                timed_out = True
                kill()
                break
            try:
                buf = await asyncio.wait_for(proc.stdout.read(4096), left)
            except asyncio.TimeoutError:
                timed_out = True
                kill()
                break
            if not buf:
                break
            if truncated:
                continue
            if kept + len(buf) > max_output:
                buf = buf[:max_output - kept]
                truncated = True
            kept += len(buf)
            text = dec.decode(buf)
            parts.append(text)
            if on_chunk is not None and text:
                await on_chunk(text)
        code = await proc.wait()
    except BaseException:
        kill()
        raise
    tail = dec.decode(b"", final=True)
    parts.append(tail)
    out = "".join(parts) + ("\n[output truncated]" if truncated else "")
    return out, (code if code >= 0 else 1), timed_out
