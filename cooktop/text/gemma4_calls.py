"""Gemma 4's chat syntax in a model's answer: the thought channel and ``<|tool_call>`` calls.

Semantics: llama.cpp common/parsers/gemma4.cpp (``common_chat_params_init_gemma4``, the PEG
parser of ``COMMON_CHAT_FORMAT_PEG_GEMMA4``) and common/chat-peg-parser.cpp
(``common_chat_peg_gemma4_mapper``, ``gemma4_to_json``):

* thinking is ``<|channel>thought`` + whitespace + the reasoning + ``<channel|>``; a
  ``<|channel>`` not followed by ``thought`` (an empty channel) and a stray ``<channel|>``
  are dropped; an optional leading ``<|turn>model\\n`` is dropped;
* a call is ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, whose values are Gemma 4's
  own syntax: a string is ``<|"|>text<|"|>`` (the text taken literally, no escapes), numbers,
  ``true`` / ``false`` / ``null`` as in JSON, ``[v,...]`` arrays and ``{key:v,...}`` dicts
  whose keys are bare text up to ``:``. The arguments are the compact JSON that
  ``gemma4_to_json`` writes (``{"city":"Paris","n":3}``; numbers keep their spelling).

:func:`parse_gemma4` reads a whole answer or the prefix streamed so far (``partial``): text
that may still become a marker is held back, and a call whose dict is unfinished has the JSON
of what was read (without the closers: ``gemma4_to_json`` on partial nodes), so streamed
argument pieces join to the final arguments. A call that does not read as this syntax stays
in the content as text. :func:`gemma4_tool_responses` is llama.cpp's message rewrite for the
older Gemma 4 templates that read tool results from ``tool_responses``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .reasoning import held_prefix

CHANNEL_OPEN, CHANNEL_CLOSE, THOUGHT = "<|channel>", "<channel|>", "thought"
CALL_OPEN, CALL_CLOSE, CALL_PREFIX = "<|tool_call>", "<tool_call|>", "call:"
QUOTE = '<|"|>'
TURN_MODEL = "<|turn>model\n"
#: the marker texts of the format (llama.cpp's ``preserved_tokens`` for Gemma 4, and the string quote)
MARKERS = (CHANNEL_OPEN, CHANNEL_CLOSE, CALL_OPEN, CALL_CLOSE, "<|turn>", QUOTE)
#: what llama.cpp detects a Gemma 4 template by (common/chat.cpp)
DETECT = "'<|tool_call>call:'"
#: what the current templates carry and the older ones (which need :func:`gemma4_tool_responses`) lack
CURRENT_TEMPLATE = "{#- OpenAI Chat Completions:"

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_START = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_NAME = re.compile(r"[^\s{}<>:,\[\]]+")
_WS = " \t\n\r"


class _Bad(ValueError):
    """The text is not Gemma 4's value syntax."""


def _esc(text: str) -> str:
    """``text`` as the inside of a JSON string (llama.cpp ``escape_json_string_inner``)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def value_json(s: str, i: int) -> tuple[str, int | None]:
    """The JSON text of the Gemma 4 value at ``s[i]`` and the index after it.

    Args:
        s: the text; i: where the value starts.
    Returns:
        ``(json_text, end)``; ``end`` is None when ``s`` ends inside the value (then the text
        is the JSON of what was read, without closing quotes / brackets, as ``gemma4_to_json``
        writes a partial node).
    Raises:
        ValueError: the text at ``i`` is no Gemma 4 value.
    """
    if i >= len(s):
        return "", None
    if s.startswith(QUOTE, i):
        start = i + len(QUOTE)
        close = s.find(QUOTE, start)
        if close < 0:
            rest = s[start:]
            return '"' + _esc(rest[:len(rest) - held_prefix(rest, (QUOTE,))]), None
        return '"' + _esc(s[start:close]) + '"', close + len(QUOTE)
    c = s[i]
    if c == "{":
        return _container(s, i, "{", "}", keyed=True)
    if c == "[":
        return _container(s, i, "[", "]", keyed=False)
    m = _NUMBER.match(s, i)
    if m and m.end() > i:
        if m.end() == len(s):
            return m.group(), None
        tail = _NUMBER_START.match(s, i)
        if tail and tail.end() == len(s) and tail.end() > m.end():  # "1." / "2e": a number still being written
            return m.group(), None
        return m.group(), m.end()
    for lit in ("true", "false", "null"):
        if s.startswith(lit, i):
            return lit, i + len(lit)
        if lit.startswith(s[i:]):
            return s[i:], None
    if s[i:] == "-":
        return "-", None
    if QUOTE.startswith(s[i:]):
        return "", None
    raise _Bad(f"no Gemma 4 value at {s[i:i + 20]!r}")


def _container(s: str, i: int, open_: str, close: str, keyed: bool) -> tuple[str, int | None]:
    """A ``{key:value,...}`` dict (``keyed``) or ``[value,...]`` array at ``s[i]`` (see :func:`value_json`)."""
    parts: list[str] = []
    j = _ws(s, i + 1)
    if j >= len(s):
        return open_, None
    if s[j] == close:
        return open_ + close, j + 1
    while True:
        item = ""
        if keyed:
            k = j
            while k < len(s) and s[k] not in ":}":
                k += 1
            if k >= len(s):
                parts.append('"' + _esc(s[j:k]))
                return open_ + ",".join(parts), None
            if s[k] != ":" or k == j:
                raise _Bad(f"a dict key without ':' at {s[j:j + 20]!r}")
            item = '"' + _esc(s[j:k]) + '":'
            j = _ws(s, k + 1)
        text, end = value_json(s, j)
        parts.append(item + text)
        if end is None:
            return open_ + ",".join(parts), None
        if end < len(s) and s[end] == ",":
            j = _ws(s, end + 1)
            continue
        j = _ws(s, end)
        if j >= len(s):
            return open_ + ",".join(parts), None
        if s[j] != close:
            raise _Bad(f"expected ',' or {close!r} at {s[j:j + 20]!r}")
        return open_ + ",".join(parts) + close, j + 1


def _call(s: str, k: int) -> tuple[tuple[str, str, bool] | None, int]:
    """The call whose ``<|tool_call>`` is at ``s[k]``: ``((name, arguments, complete) or None, end)``.

    ``None`` with ``end == len(s)``: the name is not read yet (hold back). ``end`` is after
    ``<tool_call|>``, or ``len(s)`` for a call cut off.
    Raises:
        ValueError: not a call in Gemma 4's syntax.
    """
    j = k + len(CALL_OPEN)
    rest = s[j:j + len(CALL_PREFIX)]
    if rest != CALL_PREFIX:
        if CALL_PREFIX.startswith(rest) and j + len(rest) == len(s):
            return None, len(s)
        raise _Bad("no 'call:' after <|tool_call>")
    j += len(CALL_PREFIX)
    m = _NAME.match(s, j)
    if m is None or m.end() >= len(s):
        if m is None and j < len(s):
            raise _Bad("no function name after 'call:'")
        return None, len(s)
    if s[m.end()] != "{":
        raise _Bad("no '{' after the function name")
    args, end = value_json(s, m.end())
    if end is None:
        return (m.group(), args, False), len(s)
    tail = s[end:end + len(CALL_CLOSE)]
    if tail == CALL_CLOSE:
        return (m.group(), args, True), end + len(CALL_CLOSE)
    if CALL_CLOSE.startswith(tail) and end + len(tail) == len(s):
        return (m.group(), args, False), len(s)
    raise _Bad("no <tool_call|> after the arguments")


def closed_json(text: str) -> str:
    """``text`` (the JSON of a value cut off, from :func:`value_json`) with its open string, arrays
    and objects closed, when that makes it JSON; else ``text`` unchanged."""
    stack: list[str] = []
    in_str = esc = False
    for ch in text:
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    out = text + ('"' if in_str else "") + "".join(reversed(stack))
    try:
        json.loads(out)
    except ValueError:
        return text
    return out


def parse_gemma4(text: str, *, partial: bool = False, reasoning: bool = True, legacy: bool = False,
                 tools: bool = True) -> tuple[str, str, list[tuple[str, str, bool]]]:
    """Split a Gemma 4 answer into (content, reasoning, calls).

    Args:
        text: the answer (whole, or so far when ``partial``).
        reasoning: move the thought channel to the reasoning (False: reasoning_format ``none``,
            the block stays in the content as written).
        legacy: ``deepseek-legacy``: the reasoning is extracted and the block also kept in the content.
        tools: read ``<|tool_call>`` calls (False: they are content text).
    Returns:
        ``(content, reasoning, [(name, JSON arguments, complete), ...])``; the content is stripped
        when the answer has calls.
    """
    content: list[str] = []
    thoughts: list[str] = []
    calls: list[tuple[str, str, bool]] = []
    markers = (CHANNEL_OPEN, CHANNEL_CLOSE) + ((CALL_OPEN,) if tools else ())
    pos = 0
    if text.startswith(TURN_MODEL):
        pos = len(TURN_MODEL)
    elif partial and TURN_MODEL.startswith(text):
        return "", "", []
    while pos < len(text):
        hits = [(h, m) for h, m in ((text.find(m, pos), m) for m in markers) if h >= 0]
        if not hits:
            rest = text[pos:]
            content.append(rest[:len(rest) - held_prefix(rest, markers)] if partial else rest)
            break
        at, marker = min(hits)
        content.append(text[pos:at])
        if marker == CHANNEL_CLOSE:  # a stray close: dropped
            pos = at + len(CHANNEL_CLOSE)
            continue
        if marker == CHANNEL_OPEN:
            after = at + len(CHANNEL_OPEN)
            if not text.startswith(THOUGHT, after):
                if partial and THOUGHT.startswith(text[after:]):
                    break  # may still become <|channel>thought
                pos = after  # an empty channel: dropped
                continue
            body = after + len(THOUGHT)
            close = text.find(CHANNEL_CLOSE, body)
            inner = text[body:close if close >= 0 else len(text)]
            if close < 0 and partial:
                inner = inner[:len(inner) - held_prefix(inner, (CHANNEL_CLOSE,))]
            end = close + len(CHANNEL_CLOSE) if close >= 0 else len(text)
            if reasoning:
                thoughts.append(inner.strip())
            if not reasoning or legacy:
                content.append(text[at:end] if close >= 0 or not partial else text[at:body] + inner)
            pos = end
            continue
        try:  # <|tool_call>
            call, end = _call(text, at)
        except _Bad:
            close = text.find(CALL_CLOSE, at)
            if close < 0 and partial:
                break
            end = close + len(CALL_CLOSE) if close >= 0 else len(text)
            content.append(text[at:end])
            pos = end
            continue
        if call is not None:
            if not partial and not call[2]:  # a whole answer cut inside the call: its JSON closed
                call = (call[0], closed_json(call[1]), False)
            calls.append(call)
        elif not partial:  # the answer ended before the function name: text
            content.append(text[at:])
        pos = end
    out = "".join(content)
    return (out.strip() if calls else out), "".join(thoughts), calls


def gemma4_tool_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for the older Gemma 4 templates: each assistant message with calls, the ``tool``
    messages after it and a following plain assistant answer become one assistant message with
    ``tool_calls``, ``tool_responses`` (``[{"name", "response"}]``, a response read as JSON where it
    is JSON) and that answer's ``content``.

    Semantics: llama.cpp common/parsers/gemma4.cpp ``convert_tool_responses_gemma4`` (applied to
    templates without the ``OpenAI Chat Completions`` branch).
    """
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        calls = m.get("tool_calls")
        if m.get("role") != "assistant" or not isinstance(calls, list) or not calls:
            out.append(m)
            i += 1
            continue
        merged: dict[str, Any] = {"role": "assistant", "tool_calls": list(calls)}
        if isinstance(m.get("reasoning_content"), str):
            merged["reasoning_content"] = m["reasoning_content"]
        responses: list[dict[str, Any]] = []
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            t = messages[i]
            body = t.get("content")
            if isinstance(body, str):
                try:
                    body = json.loads(body)
                except ValueError:
                    pass
            n = len(responses)
            fn = calls[n].get("function") if n < len(calls) and isinstance(calls[n], dict) else None
            name = (fn.get("name") if isinstance(fn, dict) else None) or t.get("tool_call_id") or ""
            responses.append({"name": name, "response": body})
            i += 1
        if responses:
            merged["tool_responses"] = responses
        if i < len(messages) and messages[i].get("role") == "assistant" and not messages[i].get("tool_calls"):
            c = messages[i].get("content")
            if (isinstance(c, str) and c) or (isinstance(c, list) and c):
                merged["content"] = c
                i += 1
        out.append(merged)
    return out
