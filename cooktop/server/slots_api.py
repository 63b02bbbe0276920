"""llama-server's slot endpoints: ``GET /slots`` (each slot's state) and ``POST /slots/{id}?action=...``.

``GET /slots``: :meth:`~cooktop.server.slots.Scheduler.slots_info`'s records;
``?fail_on_no_slot=1`` answers 503 when none is idle. ``POST /slots/{id}``
with ``action=erase`` forgets what the slot caches once it is idle and answers
``{"id_slot", "n_erased"}``, as llama-server (an id past the last slot wraps around, modulo the
number of slots, as llama-server's ``get_slot_by_id`` in ``tools/server/server-context.cpp``; a
negative or non-integer id is 400 ``Invalid slot ID``). ``save`` with ``{"filename": NAME}``
writes the idle slot's tokens to ``--slot-save-path``/NAME and answers ``{"id_slot", "filename",
"n_saved", "n_written", "timings": {"save_ms"}}``; ``restore`` reads such a file into the slot and
answers ``{"id_slot", "filename", "n_restored", "n_read", "timings": {"restore_ms"}}``
(:mod:`.slot_files`: what the file holds, what is refused); without ``--slot-save-path`` both are
501 ``not_supported_error``, as llama-server. Another action is 400. ``--no-slots`` turns the
endpoints off (501), as there.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from . import protocol as P
from . import slot_files
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
            if bridge.config.slot_save_path is None:
                return JSONResponse(P.error_body(501, "This server does not support slots action. Start it with "
                                                 "`--slot-save-path`", "not_supported_error"), status_code=501)
            try:
                return await (_save if action == "save" else _restore)(bridge, request, n)
            except Exception as e:  # noqa: BLE001 - OpenAI-shaped (bad name 400, loading 503)
                return bridge.openai_error(e)
        if action != "erase":
            return JSONResponse(P.error_body(400, "Invalid action", "invalid_request_error"), status_code=400)
        try:
            sched = bridge.state.ready
            n_erased = await asyncio.to_thread(sched.erase, n)
        except Exception as e:  # noqa: BLE001 - OpenAI-shaped (loading: 503, shutting down)
            return bridge.openai_error(e)
        return {"id_slot": n, "n_erased": n_erased}


async def _save(bridge: Bridge, request: Request, n: int) -> dict[str, Any]:
    """``action=save``: the slot's tokens to ``--slot-save-path``/``filename``, once it is idle."""
    name = slot_files.check_filename(await bridge.body_of(request))
    sched = bridge.state.ready
    tokens = await asyncio.to_thread(sched.slot_tokens, n)  # waits for the slot to be idle, untimed (llama-server)
    t0 = time.perf_counter()
    identity = slot_files.model_identity(bridge.state.llm, bridge.config.model_path)
    path = os.path.join(bridge.config.slot_save_path, name)
    n_written = await asyncio.to_thread(slot_files.write, path, identity, tokens)
    return {"id_slot": n, "filename": name, "n_saved": len(tokens), "n_written": n_written,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


async def _restore(bridge: Bridge, request: Request, n: int) -> dict[str, Any]:
    """``action=restore``: the slot becomes the saved tokens (evaluated again, on the slot's worker)."""
    name = slot_files.check_filename(await bridge.body_of(request))
    llm = bridge.state.ready.llm
    t0 = time.perf_counter()
    path = os.path.join(bridge.config.slot_save_path, name)
    tokens, n_read = await asyncio.to_thread(slot_files.read, path, slot_files.model_identity(
        llm, bridge.config.model_path), llm.n_ctx())

    def make(llm: Any):
        seq = llm._active_seq(tokens or [0])  # this slot (id_slot), emptied (cache_prompt False)
        if tokens:
            seq.prefill(tokens)
        return iter([{"n_restored": len(tokens)}])

    chunks = await bridge.job(make, "slots", cache_prompt=False, id_slot=n)
    async for _ in chunks:
        pass
    return {"id_slot": n, "filename": name, "n_restored": len(tokens), "n_read": n_read,
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}
