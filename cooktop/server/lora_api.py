"""llama-server's LoRA endpoints: ``GET /lora-adapters`` and ``POST /lora-adapters``, and the
per-request ``lora`` field (:func:`request_scales`) of ``/completion`` and ``/v1/chat/completions``.

``GET`` answers ``[{"id", "path", "scale", "task_name", "prompt_prefix"}]`` (llama-server
server-task.cpp ``server_task_result_get_lora::to_json``): the adapters loaded with ``--lora`` /
``--lora-scaled`` and the scale a request without a ``lora`` field gets. ``POST`` takes
``[{"id": int, "scale": float}]`` and sets those scales, the adapters left out at 0 (server-context.cpp
``construct_lora_list``), answering ``{"success": true}``; a body that is not an array, an unknown id
or a scale that is no finite number is 400. A request takes its scales when it is received
(``Scheduler.submit``): a ``POST`` changes the next requests, not those already queued or running.
Requests with different scales are not batched together (``engine/batch.py``), as in llama-server.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import CooktopError
from ..model.lora import parse_lora_request
from . import protocol as P
from .bridge import Bridge


def _lora_set(llm: Any) -> Any:
    lora = getattr(llm._engine.model, "lora", None)
    if lora is None:
        raise CooktopError("LoRA adapters are not supported on a Ray cluster yet")
    return lora


def lora_entries(body: dict[str, Any]) -> dict[int, float]:
    """A request's ``lora`` field as given: ``{id: scale}`` (empty without one).

    Raises:
        HTTPError: 400 naming ``lora`` for a field that is not ``[{"id": int, "scale": float}]``.
    """
    value = body.get("lora")
    if value is None:
        return {}
    try:
        return parse_lora_request(value)
    except CooktopError as e:
        raise P.bad("lora", str(e)) from None


def request_scales(body: dict[str, Any], llm: Any) -> list[float] | None:
    """The scales of a request's ``lora`` field (``[{"id", "scale"}]``, the adapters left out at 0),
    or None without one or with an empty one (the server's scales then, as llama-server).

    Raises:
        HTTPError: 400 naming ``lora``: not such a list, an unknown id, a scale that is no finite number.
    """
    value = body.get("lora")
    if value is None or value == []:  # an empty list: the server's scales (llama-server)
        return None
    try:
        return _lora_set(llm).construct(parse_lora_request(value))
    except CooktopError as e:
        raise P.bad("lora", str(e)) from None


def register(app: FastAPI, bridge: Bridge) -> None:
    """Add ``GET /lora-adapters`` and ``POST /lora-adapters`` to ``app``."""

    @app.get("/lora-adapters")
    async def get_lora_adapters(request: Request):
        try:
            sched = bridge.state.ready
            lora = _lora_set(sched.llm)
        except Exception as e:  # noqa: BLE001 - OpenAI-shaped (loading: 503)
            return bridge.openai_error(e)
        return [{"id": i, "path": a.path, "scale": float(s), "task_name": a.task_name,
                 "prompt_prefix": a.prompt_prefix}
                for i, (a, s) in enumerate(zip(lora.adapters, sched.lora_scales))]

    @app.post("/lora-adapters")
    async def post_lora_adapters(request: Request):
        try:
            sched = bridge.state.ready
            lora = _lora_set(sched.llm)
            try:
                body = json.loads(await request.body() or b"null")
            except ValueError:
                raise P.bad("body", "not JSON") from None
            if not isinstance(body, list):
                raise P.bad("body", "Request body must be an array")
            try:
                scales = lora.construct(parse_lora_request(body))
            except CooktopError as e:
                raise P.bad("lora", str(e)) from None
            sched.lora_scales = scales
        except Exception as e:  # noqa: BLE001 - OpenAI-shaped errors
            return bridge.openai_error(e)
        return JSONResponse({"success": True})
