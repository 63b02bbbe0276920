"""OpenAI's Responses API: ``POST /v1/responses`` (and ``/responses``), text, tools and streaming events.

A request becomes a chat completion: ``instructions`` the system message,
``input`` (a string, or items: messages with ``input_text`` / ``output_text``
parts, ``function_call`` and ``function_call_output``) the conversation,
``tools`` (``{"type": "function", "name", "parameters"}``) and ``tool_choice``
as in chat, ``max_output_tokens`` the token limit. The answer's blocks become
``output`` items: ``reasoning``, ``message`` (``output_text``) and
``function_call``; ``text.format`` (``json_schema`` / ``json_object``) constrains the text
as ``response_format`` does. A stream sends the API's events (``response.created``,
``response.output_item.added``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ..., ``response.completed``), each
with its ``sequence_number``, as llama-server's ``/v1/responses`` does. Errors
are OpenAI-shaped (400 for a malformed field).

No response is stored (llama-server stores none either): ``previous_response_id`` is a
400 (send the whole conversation in ``input``), and ``store: true`` is accepted but the
response says ``"store": false``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from . import protocol as P
from .bridge import Blocks, Bridge, sse_event


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text") or \
                    not isinstance(p.get("text"), str):
                raise P.bad(f"{where}[{j}]", "expected {'type': 'input_text', 'text': ...} (only text is supported)")
            parts.append(p["text"])
        return "".join(parts)
    raise P.bad(where, "expected a string or a list of input_text parts")


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of a ``/v1/responses`` body.

    Raises:
        HTTPError: 400 for a missing or malformed field.
    """
    if body.get("previous_response_id") is not None:
        raise P.bad("previous_response_id", "cooktop does not store responses (as llama-server does not), so "
                    "there is no state to continue from: send the whole conversation in input")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise P.bad("instructions", "expected a string")
        messages.append({"role": "system", "content": instructions})
    inp = body.get("input")
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list) and inp:
        for i, item in enumerate(inp):
            if not isinstance(item, dict):
                raise P.bad(f"input[{i}]", "expected an object")
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise P.bad(f"input[{i}].role", f"expected user, assistant, system or developer, got {role!r}")
                messages.append({"role": "system" if role == "developer" else role,
                                 "content": _text_of(item.get("content"), f"input[{i}].content")})
            elif kind == "function_call":
                if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                    raise P.bad(f"input[{i}]", "a function_call needs name and call_id")
                call = {"id": item["call_id"], "type": "function",
                        "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
                if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                    messages[-1]["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                if not isinstance(item.get("call_id"), str):
                    raise P.bad(f"input[{i}].call_id", "expected a string")
                messages.append({"role": "tool", "tool_call_id": item["call_id"],
                                 "content": _text_of(item.get("output", ""), f"input[{i}].output")})
            elif kind == "reasoning":
                continue
            else:
                raise P.bad(f"input[{i}].type", f"{kind!r} items are not supported (message, function_call, "
                            "function_call_output)")
    else:
        raise P.bad("input", "expected a string or a non-empty list of input items")
    out: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise P.bad("tools", "expected a list")
        conv = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
                raise P.bad(f"tools[{i}]", "expected {'type': 'function', 'name': ..., 'parameters': {...}} "
                            "(built-in tools are not available)")
            fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
            conv.append({"type": "function", "function": fn})
        out["tools"] = conv
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.get("name"),
                                                                         "schema": fmt.get("schema")}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        out["tool_choice"] = choice
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("parallel_tool_calls", "parallel_tool_calls"), ("seed", "seed"), ("top_k", "top_k"),
                     ("min_p", "min_p"), ("chat_template_kwargs", "chat_template_kwargs"),
                     ("reasoning_format", "reasoning_format")):
        if body.get(src) is not None:
            out[dst] = body[src]
    return out


class ResponseBuilder:
    """Chat chunks to Responses ``output`` items and stream events."""

    def __init__(self, body: dict[str, Any], model: str):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.body, self.model = body, model
        self.blocks = Blocks()
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return ev

    def response(self, status: str) -> dict[str, Any]:
        u = self.usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        incomplete = status == "incomplete"
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": self.body.get("instructions"), "model": self.model,
                "output": self.items if status != "in_progress" else [],
                "parallel_tool_calls": bool(self.body.get("parallel_tool_calls", False)),
                "temperature": self.body.get("temperature"), "top_p": self.body.get("top_p"),
                "tool_choice": self.body.get("tool_choice", "auto"), "tools": self.body.get("tools") or [],
                "max_output_tokens": self.body.get("max_output_tokens"), "metadata": {},
                "previous_response_id": None, "store": False,  # nothing is kept, whatever store asked
                "text": self.body.get("text") or {"format": {"type": "text"}},
                "usage": {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                          "total_tokens": u["total_tokens"],
                          "input_tokens_details": {"cached_tokens": (u.get("prompt_tokens_details") or {}).get(
                              "cached_tokens", 0)},
                          "output_tokens_details": {"reasoning_tokens": 0}}}

    def _item(self, block: dict[str, Any], done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        if block["kind"] == "reasoning":
            return {"type": "reasoning", "id": block["item_id"], "summary": [],
                    "content": [{"type": "reasoning_text", "text": block["text"] if done else ""}]}
        if block["kind"] == "text":
            return {"type": "message", "id": block["item_id"], "status": status, "role": "assistant",
                    "content": [{"type": "output_text", "text": block["text"], "annotations": []}] if done else []}
        return {"type": "function_call", "id": block["item_id"], "call_id": block["id"], "name": block["name"],
                "arguments": block["text"] if done else "", "status": status}

    def _steps(self, steps: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
        out = []
        for what, kind, info in steps:
            if what == "open":
                info["item_id"] = {"reasoning": "rs_", "text": "msg_", "call": "fc_"}[kind] + uuid.uuid4().hex
                info["output_index"] = len(self.items)
                self.items.append(self._item(info, False))
                out.append(self.event("response.output_item.added", output_index=info["output_index"],
                                      item=self._item(info, False)))
                if kind == "text":
                    out.append(self.event("response.content_part.added", item_id=info["item_id"],
                                          output_index=info["output_index"], content_index=0,
                                          part={"type": "output_text", "text": "", "annotations": []}))
            elif what == "delta":
                block, piece = info
                name = {"reasoning": "response.reasoning_text.delta", "text": "response.output_text.delta",
                        "call": "response.function_call_arguments.delta"}[kind]
                extra = {} if kind == "call" else {"content_index": 0}
                out.append(self.event(name, item_id=block["item_id"], output_index=block["output_index"],
                                      delta=piece, **extra))
            else:
                item = self._item(info, True)
                self.items[info["output_index"]] = item
                ix = dict(item_id=info["item_id"], output_index=info["output_index"])
                if kind == "text":
                    out.append(self.event("response.output_text.done", **ix, content_index=0, text=info["text"]))
                    out.append(self.event("response.content_part.done", **ix, content_index=0,
                                          part=item["content"][0]))
                elif kind == "reasoning":
                    out.append(self.event("response.reasoning_text.done", **ix, content_index=0, text=info["text"]))
                else:
                    out.append(self.event("response.function_call_arguments.done", **ix, arguments=info["text"]))
                out.append(self.event("response.output_item.done", output_index=info["output_index"], item=item))
        return out

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat chunk."""
        ch = chunk["choices"][0]
        out = self._steps(self.blocks.feed(ch["delta"]))
        if ch.get("finish_reason") is not None:
            self.finish = ch["finish_reason"]
            self.usage = chunk.get("usage")
        if "timings" in chunk:
            self.timings = chunk["timings"]
        return out

    def end(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(the closing events, the finished response)."""
        out = self._steps(self.blocks.close())
        resp = self.response("incomplete" if self.finish == "length" else "completed")
        # llama-server's last event carries the generation's timings beside the response (its
        # non-streamed response has none: tools/server/server-task.cpp to_json_oaicompat_resp*)
        extra = {"timings": self.timings} if self.timings else {}
        out.append(self.event("response.completed" if resp["status"] == "completed" else "response.incomplete",
                              response=resp, **extra))
        return out, resp


def register(app: FastAPI, bridge: Bridge) -> None:
    """Add ``POST /v1/responses`` and ``/responses`` to ``app``."""

    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses(request: Request):
        try:
            body = await bridge.body_of(request)
            model = bridge.model_name(body)
            stream = P.field(body, "stream", bool, False)
            args = P.chat_args(chat_body(body), bridge.config)
            builder = ResponseBuilder(body, model)
            chunks = await bridge.chat(args, model, "responses")
        except Exception as e:  # noqa: BLE001 - an OpenAI-shaped error
            return bridge.openai_error(e)
        if not stream:
            async for c in chunks:
                builder.feed(c)
            return JSONResponse(builder.end()[1])

        async def events() -> AsyncIterator[str]:
            for ev in (builder.event("response.created", response=builder.response("in_progress")),
                       builder.event("response.in_progress", response=builder.response("in_progress"))):
                yield sse_event(ev["type"], ev)
            try:
                async for c in chunks:
                    for ev in builder.feed(c):
                        yield sse_event(ev["type"], ev)
            except Exception as e:  # noqa: BLE001 - reported in the stream, as the API does
                status, kind = P.classify(e)
                ev = builder.event("error", code=kind, message=str(e), param=None)
                yield sse_event("error", ev)
                return
            for ev in builder.end()[0]:
                yield sse_event(ev["type"], ev)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
