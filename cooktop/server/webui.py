"""The web chat page at ``/`` (llama-server's web UI; ``--no-webui`` turns it off).

Plain HTML, JavaScript and CSS kept in the package (``server/webui/``, no CDN:
the page works offline): a conversation streamed from ``/v1/chat/completions``,
a stop button (aborts the request; the server cancels the generation), a
system prompt, sampling settings, reasoning (``reasoning_content``) folded in a
``<details>``, and the model's name and context from ``/props``.
"""

from __future__ import annotations

import pathlib

from fastapi import FastAPI
from fastapi.responses import FileResponse

from .bridge import Bridge

FILES = pathlib.Path(__file__).with_name("webui")
#: what the page is made of (served without the API key, as llama-server serves its UI)
PATHS = {"/": "index.html", "/webui/app.js": "app.js", "/webui/style.css": "style.css"}
MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}


def register(app: FastAPI, bridge: Bridge) -> None:
    """Serve the page's files unless the server was started with ``--no-webui``."""
    if not bridge.config.webui:
        return
    def handler(path: pathlib.Path):
        async def page() -> FileResponse:
            return FileResponse(path, media_type=MEDIA[path.suffix], headers={"Cache-Control": "no-cache"})
        return page

    for route, name in PATHS.items():
        app.add_api_route(route, handler(FILES / name), methods=["GET"], include_in_schema=False)
