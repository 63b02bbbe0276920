"""Anthropic's Messages API: ``POST /v1/messages`` (text, tools, thinking, streaming) and ``/v1/messages/count_tokens``.

A request becomes a chat completion: ``system`` (a string or text blocks) the
system message; ``messages`` with ``text``, ``tool_use`` (assistant) and
``tool_result`` (user) blocks the conversation; ``tools``
(``{"name", "description", "input_schema"}``) and ``tool_choice``
(``auto`` / ``any`` / ``tool`` / ``none``) as OpenAI tools; ``max_tokens``
(required, as in Anthropic's API), ``stop_sequences``, ``temperature``,
``top_p``, ``top_k``; ``thinking: {"type": "enabled", "budget_tokens": N}``
the reasoning budget (``disabled``: no thinking). Tools need their ``input_schema``;
server tools (``web_search_...`` and other typed tools) are refused. The answer's blocks are
``thinking``, ``text`` and ``tool_use`` (ids ``toolu_...``); ``stop_reason`` ``end_turn``,
``max_tokens``, ``tool_use`` or ``stop_sequence`` (then ``stop_sequence`` is the one of
``stop_sequences`` that matched). A stream sends Anthropic's events (``message_start``,
``content_block_start``, ``content_block_delta`` with ``text_delta`` / ``thinking_delta`` / ``input_json_delta``,
``content_block_stop``, ``message_delta``, ``message_stop``). Errors are
Anthropic-shaped: ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from . import protocol as P
from .bridge import Blocks, Bridge, sse_event
from .responses import prompt_options

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "request_too_large", 503: "overloaded_error"}


def error_response(exc: BaseException) -> JSONResponse:
    """Anthropic's error object for ``exc`` (status as :func:`protocol.classify`)."""
    status, _ = P.classify(exc)
    bug = status == 500 and not isinstance(exc, P.HTTPError)
    msg = f"internal error ({type(exc).__name__}: {exc}); this is a cooktop bug" if bug else str(exc)
    return JSONResponse({"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": msg}},
                        status_code=status)


def _text(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if isinstance(blocks, list) and all(isinstance(b, dict) and b.get("type") == "text" and isinstance(
            b.get("text"), str) for b in blocks):
        return "".join(b["text"] for b in blocks)
    raise P.bad(where, "expected a string or a list of text blocks")


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of a ``/v1/messages`` body.

    Raises:
        HTTPError: 400 for a missing or malformed field.
    """
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise P.bad("max_tokens", "required: a positive integer")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise P.bad("messages", "expected a non-empty list of {role, content} objects")
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise P.bad(f"messages[{i}].role", "expected 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise P.bad(f"messages[{i}].content", "expected a string or a list of content blocks")
        texts, calls = [], []
        for j, b in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text" and isinstance(b.get("text"), str):
                texts.append(b["text"])
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("id"), str):
                    raise P.bad(where, "a tool_use block needs id and name")
                calls.append({"id": b["id"], "type": "function", "function": {
                    "name": b["name"], "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}})
            elif kind == "tool_result" and m["role"] == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise P.bad(where + ".tool_use_id", "expected a string")
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": _text(b.get("content", ""), where + ".content")})
            elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
                continue
            else:
                raise P.bad(where, f"unsupported content block {kind!r} for role {m['role']!r} "
                            "(text, tool_use in assistant turns, tool_result in user turns)")
        if texts or calls:
            msg: dict[str, Any] = {"role": m["role"], "content": "".join(texts) if texts else None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    chat: dict[str, Any] = {"messages": out, "max_tokens": max_tokens}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise P.bad("tools", "expected a list")
        conv = []
        for i, t in enumerate(tools):
            kind = t.get("type") if isinstance(t, dict) else None
            if kind not in (None, "custom"):
                raise P.bad(f"tools[{i}].type", f"server tools such as {kind!r} are not supported: cooktop runs "
                            "client tools only ({'name': ..., 'input_schema': {...}})")
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise P.bad(f"tools[{i}]", "expected {'name': ..., 'input_schema': {...}}")
            schema = t.get("input_schema")
            if schema is None:
                raise P.bad(f"tools[{i}].input_schema", "required: a JSON schema object")
            if not isinstance(schema, dict):
                raise P.bad(f"tools[{i}].input_schema", "expected a JSON schema object")
            conv.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                          "parameters": schema}})
        chat["tools"] = conv
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "auto":
            chat["tool_choice"] = "auto"
        elif kind == "any":
            chat["tool_choice"] = "required"
        elif kind == "none":
            chat["tool_choice"] = "none"
        elif kind == "tool" and isinstance(choice.get("name"), str):
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            raise P.bad("tool_choice", "expected {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}")
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is False:
            chat["parallel_tool_calls"] = True
    stops = body.get("stop_sequences")
    if stops is not None:
        chat["stop"] = stops
    for k in ("temperature", "top_p", "top_k", "chat_template_kwargs"):
        if body.get(k) is not None:
            chat[k] = body[k]
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind == "enabled":
            budget = thinking.get("budget_tokens")
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise P.bad("thinking.budget_tokens", "expected a positive integer")
            chat["reasoning_budget"] = budget
        elif kind == "disabled":
            chat["reasoning_budget"] = 0
        else:
            raise P.bad("thinking", "expected {'type': 'enabled', 'budget_tokens': N} or {'type': 'disabled'}")
    return chat


def tool_use_id(call_id: str) -> str:
    """A chat tool-call id as Anthropic spells tool ids (``toolu_...``); the same id each time."""
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessageBuilder:
    """Chat chunks to Anthropic content blocks and stream events."""

    def __init__(self, model: str, stop_sequences: list[str] | None = None):
        self.id = f"msg_{uuid.uuid4().hex}"
        self.stop_sequences = list(stop_sequences or [])
        self.stop_word: str | None = None
        self.model = model
        self.blocks = Blocks()
        self.n = 0
        self.finish: str | None = None
        self.usage: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0}

    def start(self, n_prompt: int) -> dict[str, Any]:
        return {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": n_prompt, "output_tokens": 0}}}

    @staticmethod
    def _block(b: dict[str, Any], done: bool) -> dict[str, Any]:
        if b["kind"] == "reasoning":
            return {"type": "thinking", "thinking": b["text"] if done else "", "signature": ""}
        if b["kind"] == "text":
            return {"type": "text", "text": b["text"] if done else ""}
        inp: Any = {}
        if done:
            try:
                inp = json.loads(b["text"] or "{}")
            except ValueError:
                inp = {}
        return {"type": "tool_use", "id": tool_use_id(b["id"]), "name": b["name"], "input": inp}

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        ch = chunk["choices"][0]
        if ch.get("finish_reason") is not None:
            self.finish = ch["finish_reason"]
            self.usage = chunk.get("usage") or self.usage
            self.stop_word = chunk.get("stopping_word")
        return self._events(self.blocks.feed(ch["delta"]))

    def _events(self, steps: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
        out = []
        for what, kind, info in steps:
            if what == "open":
                info["block_index"] = self.n
                self.n += 1
                out.append({"type": "content_block_start", "index": info["block_index"],
                            "content_block": self._block(info, False)})
            elif what == "delta":
                block, piece = info
                delta = ({"type": "thinking_delta", "thinking": piece} if kind == "reasoning" else
                         {"type": "text_delta", "text": piece} if kind == "text" else
                         {"type": "input_json_delta", "partial_json": piece})
                out.append({"type": "content_block_delta", "index": block["block_index"], "delta": delta})
            else:
                if kind == "reasoning":
                    out.append({"type": "content_block_delta", "index": info["block_index"],
                                "delta": {"type": "signature_delta", "signature": ""}})
                out.append({"type": "content_block_stop", "index": info["block_index"]})
        return out

    def end(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(the closing events, the whole message)."""
        out = self._events(self.blocks.close())
        stop = _STOP.get(self.finish or "stop", "end_turn")
        # a template's end-of-turn string is end_turn; only the caller's stop_sequences are reported
        seq = self.stop_word if self.finish == "stop" and self.stop_word in self.stop_sequences else None
        if seq is not None:
            stop = "stop_sequence"
        usage = {"input_tokens": self.usage["prompt_tokens"], "output_tokens": self.usage["completion_tokens"]}
        out.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": seq},
                    "usage": {"output_tokens": usage["output_tokens"]}})
        out.append({"type": "message_stop"})
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                   "content": [self._block(b, True) for b in self.blocks.blocks],
                   "stop_reason": stop, "stop_sequence": seq, "usage": usage}
        return out, message


def register(app: FastAPI, bridge: Bridge) -> None:
    """Add ``POST /v1/messages`` and ``/v1/messages/count_tokens`` to ``app``."""

    @app.post("/v1/messages")
    async def messages(request: Request):
        try:
            body = await bridge.body_of(request)
            model = bridge.model_name(body)
            stream = P.field(body, "stream", bool, False)
            chat = chat_body(body)
            args = P.chat_args(chat, bridge.config)
            stops = chat.get("stop")
            builder = MessageBuilder(model, [stops] if isinstance(stops, str) else stops)
            chunks = await bridge.chat(args, model, "messages")
        except Exception as e:  # noqa: BLE001 - an Anthropic-shaped error
            return error_response(e)
        if not stream:
            async for c in chunks:
                builder.feed(c)
            return JSONResponse(builder.end()[1])

        async def events() -> AsyncIterator[str]:
            first = True
            try:
                async for c in chunks:
                    evs = builder.feed(c)
                    if first:
                        first = False
                        yield sse_event("message_start", builder.start(0))
                        yield sse_event("ping", {"type": "ping"})
                    for ev in evs:
                        yield sse_event(ev["type"], ev)
            except Exception as e:  # noqa: BLE001 - reported in the stream, as the API does
                status, _ = P.classify(e)
                yield sse_event("error", {"type": "error", "error": {
                    "type": _ERROR_TYPES.get(status, "api_error"), "message": str(e)}})
                return
            for ev in builder.end()[0]:
                yield sse_event(ev["type"], ev)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            body = await bridge.body_of(request)
            if "max_tokens" not in body:
                body = {**body, "max_tokens": 1}
            args = P.chat_args(chat_body(body), bridge.config)
            llm = bridge.state.llm
            tokens, _ = llm.chat_prompt(args["messages"], args.get("tools"), **prompt_options(args))
        except Exception as e:  # noqa: BLE001 - an Anthropic-shaped error
            return error_response(e)
        return {"input_tokens": len(tokens)}
