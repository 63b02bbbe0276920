"""What the extra APIs (Responses, Anthropic messages, rerank, web page) share with the app: the loaded
model, body parsing, and chat generations run on the scheduler as streams of chat chunks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from .responses import choices_job
from .slots import END, ERROR

DISCONNECT_CHECK_S = 0.25  # how often a non-streamed request checks that its client is still there


class ClientGone(Exception):
    """The client of a request went away before its answer: its job is cancelled."""


def sse_event(event: str, data: Any) -> str:
    """One Server-Sent Event with an ``event:`` name (Responses and Anthropic streams)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class Bridge:
    """The app's state and helpers, handed to each API module's ``register(app, bridge)``.

    Attributes:
        state: the :class:`~cooktop.server.app.ServerState`; config: its ``ServerConfig``.
        body_of: ``await body_of(request)`` -> the JSON object body (HTTPError 400 otherwise).
        model_name: ``model_name(body)`` -> the name to echo.
        openai_error: an exception -> OpenAI-shaped JSONResponse.
    """

    def __init__(self, state: Any, config: Any, body_of: Callable, model_name: Callable, openai_error: Callable):
        self.state, self.config = state, config
        self.body_of, self.model_name, self.openai_error = body_of, model_name, openai_error

    async def chat(self, args: dict[str, Any], model: str, endpoint: str) -> AsyncIterator[dict[str, Any]]:
        """Start one chat generation; its chunks (``chat.completion.chunk``) as an async iterator.

        The first chunk is awaited here, so a bad request raises now (before any response is sent).
        Closing the iterator cancels the job.

        Raises:
            whatever ``create_chat_completion`` raises for the request (template, tools, context).
        """
        make = choices_job(1, args, lambda llm, kw: llm.create_chat_completion(**kw), model)
        return await self.job(make, endpoint)

    async def job(self, make: Callable[[Any], Any], endpoint: str, cache_prompt: bool = True,
                  id_slot: int = -1, lora: list[float] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Run ``make(llm) -> iterator of chunks`` on a slot (``cache_prompt``, ``id_slot``, ``lora``: as
        :class:`~cooktop.server.slots.Job`); its chunks as an async iterator, the first awaited
        here (an error of the request raises now, before any response is sent). Closing the
        iterator cancels the job.

        Raises:
            whatever ``make``'s iterator raises first; OverloadedError when the queue is full.
        """
        sched = self.state.ready
        sched.metrics.requests_total[endpoint] += 1
        job = sched.submit(make, asyncio.get_running_loop(), cache_prompt, id_slot, lora)
        try:
            kind, first = await job.queue.get()
            if kind == ERROR:
                raise first
        except BaseException:
            job.cancel()
            raise

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            kind_, chunk = kind, first
            try:
                while kind_ != END:
                    yield chunk
                    kind_, chunk = await job.queue.get()
                    if kind_ == ERROR:
                        raise chunk
            finally:
                job.cancel()

        return chunks()

    async def collect(self, request: Any, chunks: AsyncIterator[Any]) -> list[Any]:
        """Every chunk of a job's iterator (:meth:`job`) for a non-streamed answer, checking every
        ``DISCONNECT_CHECK_S`` that the client is still there: if it went away the iterator is closed
        (its job cancelled, as llama-server stops a task whose client left) and ClientGone raised.

        Raises:
            ClientGone: the client disconnected; whatever the iterator raises.
        """
        out: list[Any] = []
        it = chunks.__aiter__()
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            while not (await asyncio.wait({nxt}, timeout=DISCONNECT_CHECK_S))[0]:
                if await request.is_disconnected():
                    nxt.cancel()
                    try:
                        await nxt
                    except (asyncio.CancelledError, StopAsyncIteration):
                        pass
                    aclose = getattr(chunks, "aclose", None)
                    if aclose is not None:
                        await aclose()
                    raise ClientGone
            try:
                out.append(nxt.result())
            except StopAsyncIteration:
                return out

    async def run(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(llm)`` on the scheduler's worker (one at a time with generations); its result.

        Raises:
            whatever ``fn`` raises; OverloadedError when the queue is full.
        """
        job = self.state.ready.submit(lambda llm: iter([fn(llm)]), asyncio.get_running_loop())
        try:
            results = [item async for item in job.events()]
        finally:
            job.cancel()
        return results[0]


class Blocks:
    """Chat deltas as a sequence of output blocks: ``reasoning``, ``text`` and ``call`` (one per tool call).

    :meth:`feed` turns one delta into steps ``("open", kind, block)``, ``("delta", kind, (block, piece))``
    and ``("close", kind, block)``; a block closes when another kind (or another call) starts, and at
    :meth:`close`. ``blocks`` holds every block: ``{"kind", "text"}`` plus ``id`` / ``name`` for calls.
    """

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}

    def _start(self, block: dict[str, Any]) -> list[tuple[str, str, Any]]:
        steps = self.close()
        self.blocks.append(block)
        self.open = block
        return steps + [("open", block["kind"], block)]

    def feed(self, delta: dict[str, Any]) -> list[tuple[str, str, Any]]:
        steps: list[tuple[str, str, Any]] = []
        for kind, key in (("reasoning", "reasoning_content"), ("text", "content")):
            piece = delta.get(key)
            if piece:
                if self.open is None or self.open["kind"] != kind:
                    steps += self._start({"kind": kind, "text": ""})
                assert self.open is not None
                self.open["text"] += piece
                steps.append(("delta", kind, (self.open, piece)))
        for c in delta.get("tool_calls") or []:
            fn = c.get("function") or {}
            if c.get("id") and c["index"] not in self.calls:
                block = {"kind": "call", "text": "", "id": c["id"], "name": fn.get("name", ""), "index": c["index"]}
                self.calls[c["index"]] = block
                steps += self._start(block)
            block = self.calls[c["index"]]
            if fn.get("arguments"):
                block["text"] += fn["arguments"]
                steps.append(("delta", "call", (block, fn["arguments"])))
        return steps

    def close(self) -> list[tuple[str, str, Any]]:
        if self.open is None:
            return []
        block, self.open = self.open, None
        return [("close", block["kind"], block)]
