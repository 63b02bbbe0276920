"""llama-server's slot endpoints: ``GET /slots`` (each slot's state) and ``POST /slots/{id}?action=erase``.

``GET /slots``: :meth:`~cooktop.server.slots.Scheduler.slots_info`'s records;
``?fail_on_no_slot=1`` answers 503 when none is idle. ``POST /slots/{id}``
with ``action=erase`` forgets what the slot caches once it is idle and answers
``{"id_slot", "n_erased"}``, as llama-server (an id past the last slot wraps around, modulo the
number of slots, as llama-server's ``get_slot_by_id`` in ``tools/server/server-context.cpp``; a
negative or non-integer id is 400 ``Invalid slot ID``); ``save`` / ``restore`` (slot
files under llama-server's ``--slot-save-path``) are 501 ``not_supported_error``,
another action 400. ``--no-slots`` turns both off (501), as there.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from . import protocol as P
from .bridge import Bridge


def _off() -> JSONResponse:
    return JSONResponse(P.error_body(501, "This server does not support slots endpoint. Start it with `--slots`",
                                     "not_supported_error"), status_code=501)


def register(app: FastAPI, bridge: Bridge) -> None:
    """Add ``GET /slots`` and ``POST /slots/{id_slot}`` to ``app``."""

    @app.get("/slots")
    async def slots(request: Request):
        if not bridge.config.endpoint_slots:
            return _off()
        try:
            sched = bridge.state.ready
            records, idle = sched.slots_info(bridge.state.llm.n_ctx(), bridge.config.speculative is not None)
        except Exception as e:  # noqa: BLE001 - OpenAI-shaped (loading: 503)
            return bridge.openai_error(e)
        if request.query_params.get("fail_on_no_slot") and idle == 0:
            return JSONResponse(P.error_body(503, "no slot available", "unavailable_error"), status_code=503)
        return records

    @app.post("/slots/{id_slot}")
    async def slot_action(request: Request, id_slot: str):
        if not bridge.config.endpoint_slots:
            return _off()
        try:
            n = int(id_slot)
            if n < 0:
                raise ValueError(id_slot)
        except ValueError:
            return JSONResponse(P.error_body(400, "Invalid slot ID", "invalid_request_error"), status_code=400)
        action = request.query_params.get("action")
        if action in ("save", "restore"):
            return JSONResponse(P.error_body(501, f"slot {action} is not supported: cooktop keeps no slot files "
                                             "(llama-server's --slot-save-path)", "not_supported_error"),
                                status_code=501)
        if action != "erase":
            return JSONResponse(P.error_body(400, "Invalid action", "invalid_request_error"), status_code=400)
        try:
            sched = bridge.state.ready
            n_erased = await asyncio.to_thread(sched.erase, n)
        except Exception as e:  # noqa: BLE001 - OpenAI-shaped (loading: 503, shutting down)
            return bridge.openai_error(e)
        return {"id_slot": n, "n_erased": n_erased}
