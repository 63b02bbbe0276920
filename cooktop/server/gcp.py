"""Google Cloud Vertex AI's custom-container contract (llama-server's GCP compat,
tools/server/server-http.cpp ``gcp_params``, ``register_gcp_compat``).

On when ``AIP_MODE=PREDICTION`` is set (Vertex AI sets it in the container): the server listens on
``AIP_HTTP_PORT`` (default 8080, over ``--port``), ``AIP_HEALTH_ROUTE`` (if set) answers as ``/health``,
and ``POST AIP_PREDICT_ROUTE`` (default ``/predict``) takes ``{"instances": [...]}``: each instance an
object with ``@requestFormat``, a route's camelCase alias (``chatCompletions`` = ``/v1/chat/completions``,
``completion`` = ``/completion``: the path without ``/v1``, each ``/ - _`` capitalising the next letter)
or the path itself, and that route's request body (``stream`` forced off). The instances run
concurrently through the whole app (API key, prefix, sleep and the slots' queue as any request); the
answer is ``{"predictions": [...]}``, each the route's JSON answer (its error body included), or
``{"error": ...}`` for an instance that names no route. At most 128 instances.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse

from . import protocol as P

MAX_INSTANCES = 128  # llama-server's


@dataclasses.dataclass(frozen=True)
class GcpParams:
    """The ``AIP_*`` variables (https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements).

    Attributes:
        enabled: ``AIP_MODE == "PREDICTION"``; health_route: ``AIP_HEALTH_ROUTE`` ("" none);
        predict_route: ``AIP_PREDICT_ROUTE`` (default ``/predict``; a leading ``/`` added);
        port: ``AIP_HTTP_PORT`` (default 8080).
    """

    enabled: bool = False
    health_route: str = ""
    predict_route: str = "/predict"
    port: int = 8080

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GcpParams:
        """Read the variables from ``environ`` (default ``os.environ``).

        Raises:
            CooktopError: ``AIP_HTTP_PORT`` not a port number.
        """
        env = os.environ if environ is None else environ

        def route(name: str, default: str) -> str:
            v = env.get(name, "")
            return default if not v else v if v.startswith("/") else "/" + v

        port = env.get("AIP_HTTP_PORT", "") or "8080"
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise P.CooktopError(f"AIP_HTTP_PORT={port!r}: expected a port number (1-65535)")
        return cls(env.get("AIP_MODE", "") == "PREDICTION", route("AIP_HEALTH_ROUTE", ""),
                   route("AIP_PREDICT_ROUTE", "/predict"), int(port))


def gcp_alias(path: str) -> str:
    """A route's ``@requestFormat`` name: ``/v1/chat/completions`` -> ``chatCompletions``,
    ``/apply-template`` -> ``applyTemplate`` (llama-server's ``path_to_gcp_format``)."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s.removeprefix("/")
    out, cap = [], False
    for c in s.split(":")[0]:
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def register(app: Any, params: GcpParams, api_prefix: str) -> None:
    """Add the predict (and health) routes of ``params`` to ``app`` (a FastAPI app whose other routes are
    registered; ``api_prefix``: its ``--api-prefix``, under which the instances are dispatched).

    Raises:
        CooktopError: ``AIP_PREDICT_ROUTE`` is one of the server's own routes.
    """
    posts = [r.path for r in app.routes if "POST" in getattr(r, "methods", ()) and "{" not in r.path]
    if params.predict_route in posts:
        raise P.CooktopError(f"AIP_PREDICT_ROUTE={params.predict_route} conflicts with a route of the server")
    alias: dict[str, str] = {}
    for path in posts:
        alias.setdefault(gcp_alias(path), path)  # the first registered wins, as there
    if params.health_route:
        health = next(r.endpoint for r in app.routes if getattr(r, "path", None) == "/health")
        app.get(params.health_route)(health)

    def error(message: str, kind: str = "invalid_request_error", status: int = 400) -> dict[str, Any]:
        return {"error": P.error_body(status, message, kind)["error"]}

    async def one(client: httpx.AsyncClient, instance: Any, headers: dict[str, str]) -> Any:
        if not isinstance(instance, dict):
            return error("each instance must be a JSON object")
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            return error("each instance must include a string @requestFormat")
        path = alias.get(fmt) or (fmt if fmt in posts else None)
        if path is None:
            return error(f"no handler registered for @requestFormat: {fmt}")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            payload["stream"] = False  # the predict route answers whole bodies
        r = await client.post(api_prefix + path, content=json.dumps(payload), headers=headers)
        try:
            return r.json()
        except ValueError:
            return r.text or None

    @app.post(params.predict_route)
    async def predict(request: Request):
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            return JSONResponse({"error": error(f"bad JSON: {e}")["error"]}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse(error("request body must be a JSON object"), status_code=400)
        instances = body.get("instances")
        if not isinstance(instances, list):
            return JSONResponse(error("request body must include an array field named instances"), status_code=400)
        if len(instances) > MAX_INSTANCES:
            return JSONResponse(error(f"instances array exceeds maximum size of {MAX_INSTANCES}"), status_code=400)
        headers = {k: v for k, v in request.headers.items() if k in ("authorization", "x-api-key")}
        headers["content-type"] = "application/json"
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gcp.internal", timeout=None) as client:
            predictions = await asyncio.gather(*(one(client, inst, headers) for inst in instances))
        return {"predictions": list(predictions)}
