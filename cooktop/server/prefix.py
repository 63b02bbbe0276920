"""llama-server's ``--api-prefix PREFIX``: every route served under ``PREFIX``.

llama-server registers each handler at ``params.api_prefix + path`` (tools/server/server-http.cpp;
the flag is in common/arg.cpp, env ``LLAMA_ARG_API_PREFIX``), so with ``--api-prefix /llm`` the
routes are ``/llm/health``, ``/llm/v1/chat/completions``, the web page at ``/llm/`` ..., and the
unprefixed paths are 404. It does not normalize the prefix: one without a leading ``/`` or with a
trailing ``/`` makes paths no request can reach (``llmhealth``, ``/llm//health``), so cooktop refuses
those (:func:`check_api_prefix`) instead of serving nothing.
"""

from __future__ import annotations

from typing import Any


def check_api_prefix(prefix: str) -> str | None:
    """Why ``prefix`` cannot be an ``--api-prefix`` (a one-line message), or None when it can.

    Accepted: ``""`` (no prefix) or ``/segment[/segment...]`` without a trailing slash.
    """
    if prefix == "":
        return None
    if not prefix.startswith("/"):
        return f"--api-prefix must start with '/' (e.g. /{prefix.rstrip('/')}), got {prefix!r}"
    if prefix.endswith("/"):
        return f"--api-prefix must not end with '/' (e.g. {prefix.rstrip('/') or '/llm'}), got {prefix!r}"
    if any(c in prefix for c in "?#") or any(c.isspace() for c in prefix):
        return f"--api-prefix is a path: no '?', '#' or spaces, got {prefix!r}"
    return None


class ApiPrefix:
    """ASGI middleware: a request to ``PREFIX/rest`` goes on to the app as ``/rest``; any other path
    (``PREFIX`` alone included: llama-server's page is at ``PREFIX/``) is a 404 in the OpenAI error
    shape, as llama-server answers a path it has no handler for. ``prefix`` must pass
    :func:`check_api_prefix`.
    """

    def __init__(self, app: Any, prefix: str) -> None:
        self.app, self.prefix = app, prefix
        self.raw = prefix.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith(self.prefix + "/"):
            raw = scope.get("raw_path")
            scope = dict(scope, path=path[len(self.prefix):])
            if isinstance(raw, bytes) and raw.startswith(self.raw + b"/"):
                scope["raw_path"] = raw[len(self.raw):]
            await self.app(scope, receive, send)
            return
        from fastapi.responses import JSONResponse

        from . import protocol as P
        msg = f"{scope.get('method', 'GET')} {path}: Not Found (the server's routes are under {self.prefix})"
        await JSONResponse(P.error_body(404, msg, "not_found_error"), status_code=404)(scope, receive, send)
