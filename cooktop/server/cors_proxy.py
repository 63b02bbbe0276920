"""llama-server's ``/cors-proxy`` (``--ui-mcp-proxy``, experimental there: tools/server/server-cors-proxy.h),
which lets a browser page reach an MCP server that sends no CORS headers.

``GET`` / ``POST /cors-proxy?url=URL`` sends the same request to ``URL`` (http or https; no user or
password in it) and answers with its status, body (streamed) and content type. Only the request headers
named ``x-llama-server-proxy-header-NAME`` are sent on, as ``NAME``: the caller's ``Authorization``,
``X-Api-Key``, cookies and the rest never leave the server. Off by default: then both answer 403
``{"error": {"message": "this feature is disabled", "type": "feature_disabled"}}``. The server's API
key guards it like any route.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from . import protocol as P

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0  # llama-server's read and write timeouts
#: response headers not handed back (hop-by-hop, or describing the upstream's encoding of the body)
DROP = {"connection", "keep-alive", "transfer-encoding", "content-encoding", "content-length", "upgrade"}


def target(url: str | None) -> str:
    """The proxied URL of ``?url=``, checked as llama-server checks it.

    Raises:
        HTTPError: 400 no URL, no host, user or password in it, a scheme other than http / https.
    """
    if not url:
        raise P.HTTPError(400, "missing the url query parameter (/cors-proxy?url=...)", "invalid_request_error")
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https"):
        raise P.HTTPError(400, f"unsupported URL scheme in target URL: {u.scheme}", "invalid_request_error")
    if not u.hostname:
        raise P.HTTPError(400, "invalid target URL: missing host", "invalid_request_error")
    if u.username is not None or u.password is not None:
        raise P.HTTPError(400, "authentication in target URL is not supported", "invalid_request_error")
    return url


def forwarded_headers(headers: Any) -> dict[str, str]:
    """The ``x-llama-server-proxy-header-NAME: V`` request headers as ``NAME: V`` (the others dropped)."""
    out = {}
    for k, v in headers.items():
        low = k.lower()
        if low.startswith(PREFIX) and len(low) > len(PREFIX):
            out[k[len(PREFIX):]] = v
    return out


def register(app: FastAPI, bridge: Any) -> None:
    """Add ``GET`` / ``POST /cors-proxy`` to ``app`` (403 unless ``bridge.config.ui_mcp_proxy``)."""

    @app.get("/cors-proxy")
    @app.post("/cors-proxy")
    async def cors_proxy(request: Request):
        if not bridge.config.ui_mcp_proxy:
            return JSONResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
                                status_code=403)
        try:
            url = target(request.query_params.get("url"))
        except P.HTTPError as e:
            return JSONResponse(P.error_body(e.status, str(e), e.type), status_code=e.status)
        client = httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False)
        try:
            upstream = await client.send(client.build_request(
                request.method, url, headers=forwarded_headers(request.headers),
                content=await request.body() if request.method == "POST" else None), stream=True)
        except httpx.HTTPError as e:
            await client.aclose()
            return JSONResponse(P.error_body(502, f"cannot reach {url}: {e}", "server_error"), status_code=502)

        async def body():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in DROP}
        return StreamingResponse(body(), status_code=upstream.status_code, headers=headers)
