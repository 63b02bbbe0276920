"""Tool calls in a model's answer: which syntax a chat template uses, and parsing it (whole or streamed).

Formats (detected from the template source the way llama.cpp ``common/chat.cpp``
tells them apart):

* ``hermes`` (Hermes 2 Pro, Qwen 2.5 / 3, SmolLM3): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>``, one block per call;
* ``qwen3-coder`` (Qwen3-Coder, Qwen3.5 / 3.6, Nemotron Nano 3; llama.cpp's ``QWEN3_CODER_XML``):
  ``<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>``;
  a value that reads as JSON (a number, ``true``, an object...) is that value, any other text a
  string (the arguments are the JSON object of the parameters, in order);
* ``llama3`` (Llama 3.1 / 3.2 / 3.3): a bare ``{"name": ..., "parameters": {...}}``
  answer, or ``<|python_tag|>`` followed by such JSON (``;``-separated) or a
  built-in ``tool.call(key="value")``;
* ``mistral`` (Mistral Nemo / Small): ``[TOOL_CALLS][{"name": ..., "arguments": {...},
  "id": ...}, ...]`` or the newer ``[TOOL_CALLS]name[ARGS]{...}``;
* ``gpt-oss`` (harmony): ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}``;
  the ``analysis`` channel is reasoning, ``final`` the answer;
* ``gemma4`` (Gemma 4): ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`` in Gemma 4's
  own value syntax, the ``<|channel>thought ... <channel|>`` channel reasoning
  (:mod:`cooktop.text.gemma4_calls`);
* ``generic`` (any other template, e.g. chatml): llama.cpp's generic fallback, the
  whole answer one JSON object ``{"tool_call": {"name", "arguments"}}``,
  ``{"tool_calls": [...]}`` or ``{"response": "..."}``, asked for in a system
  message and enforced by a JSON-schema grammar (:mod:`cooktop.text.tool_grammar`).

:func:`parse` works on a whole answer or on the prefix streamed so far
(``partial=True``): then text that may still become a marker is held back and a
call whose JSON is unfinished has the arguments seen so far. Arguments are the
model's own JSON text of the value (so a streamed call's pieces join to exactly
the final ``arguments``). :class:`MessageStream` turns successive parses into
OpenAI chat deltas the way llama-server streams them (``common_chat_msg_diff``):
``content`` / ``reasoning_content`` pieces, then per call a first delta with
``index``, ``id``, ``type`` and ``function.name`` and argument pieces after it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import uuid
from typing import Any

from ..errors import CooktopError
from . import gemma4_calls
from .json_scan import object_members, scan_value, skip_ws
from .reasoning import ReasoningSplit, held_prefix, split_think

FORMATS = ("hermes", "qwen3-coder", "llama3", "mistral", "gpt-oss", "gemma4", "generic")


class ToolCallError(CooktopError):
    """Malformed ``tools`` / ``tool_choice`` / tool messages in a request."""


def detect_format(source: str) -> str:
    """The tool-call format of a chat template's jinja source (one of :data:`FORMATS`).

    Semantics: llama.cpp common/chat.cpp template detection (``'<|tool_call>call:'`` Gemma 4,
    ``<|channel|>`` gpt-oss,
    ``<tool_call>`` with ``<function=`` and ``<parameter=`` Qwen3-Coder's XML, other ``<tool_call>``
    Hermes/Qwen, ``[TOOL_CALLS]`` Mistral, ``<|python_tag|>`` / ``ipython`` Llama 3.x, anything else
    the generic JSON fallback).
    """
    if gemma4_calls.DETECT in source:
        return "gemma4"
    if "<|channel|>" in source:
        return "gpt-oss"
    if "<tool_call>" in source and "<function=" in source and "<parameter=" in source:
        return "qwen3-coder"
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or ("ipython" in source and "<|start_header_id|>" in source):
        return "llama3"
    return "generic"


@dataclasses.dataclass
class ToolCall:
    """One parsed call: ``arguments`` is JSON text (a prefix of it while streaming)."""

    name: str
    arguments: str
    id: str | None = None
    complete: bool = True


@dataclasses.dataclass
class Parsed:
    """An answer split into content, reasoning and tool calls."""

    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = dataclasses.field(default_factory=list)


def _string_at(s: str, span: tuple[int, int | None] | None) -> str | None:
    if span is None or span[1] is None:
        return None
    try:
        v = json.loads(s[span[0]:span[1]])
    except ValueError:
        return None
    return v if isinstance(v, str) else None


def _call_from_object(s: str, i: int, arg_keys: tuple[str, ...] = ("arguments", "parameters"),
                      ) -> tuple[ToolCall | None, int | None]:
    """A call from the JSON object at ``s[i]`` with a ``name`` and arguments (None until the name is known)."""
    members, end = object_members(s, i)
    name = _string_at(s, members.get("name"))
    if name is None:
        return None, end
    span = next((members[k] for k in arg_keys if k in members), None)
    if span is None:
        args, done = ("{}" if end is not None else ""), end is not None
    else:
        raw = s[span[0]:span[1]] if span[1] is not None else s[span[0]:].rstrip()
        done = span[1] is not None
        if raw.startswith('"'):  # arguments given as a JSON string: its decoded text, once whole
            try:
                raw = json.loads(raw) if done else ""
            except ValueError:
                raw = ""
        args = raw
    return ToolCall(name, args, _string_at(s, members.get("id")), done and end is not None), end


def _call_id(fmt: str) -> str:
    """A new call id: 9 letters and digits for Mistral (its template refuses others), else ``call_...``."""
    return uuid.uuid4().hex[:9] if fmt == "mistral" else "call_" + uuid.uuid4().hex[:24]


# ------------------------------------------------------------------ the formats
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"


def _hermes(text: str, partial: bool) -> Parsed:
    out = Parsed()
    content: list[str] = []
    pos = 0
    while True:
        k = text.find(HERMES_OPEN, pos)
        if k < 0:
            rest = text[pos:]
            content.append(rest[:len(rest) - held_prefix(rest, (HERMES_OPEN,))] if partial else rest)
            break
        content.append(text[pos:k])
        j = skip_ws(text, k + len(HERMES_OPEN))
        close = text.find(HERMES_CLOSE, j)
        body_end = close if close >= 0 else len(text)
        if j < body_end and text[j] == "{":
            call, _ = _call_from_object(text[:body_end], j)
            if call is not None:
                out.calls.append(call)
            elif close >= 0 or not partial:
                content.append(text[k:body_end + (len(HERMES_CLOSE) if close >= 0 else 0)])
        elif close >= 0 or not partial:
            content.append(text[k:body_end + (len(HERMES_CLOSE) if close >= 0 else 0)])
        if close < 0:
            break
        pos = close + len(HERMES_CLOSE)
    out.content = "".join(content).strip() if out.calls else "".join(content)
    return out


_XML_FUNC = re.compile(r"<function=([^<>\n]+)>")
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?")
XML_PARAM_CLOSE, XML_FUNC_CLOSE = "</parameter>", "</function>"


def xml_value(raw: str) -> Any:
    """A Qwen3-Coder parameter's value: its text without the newline the format puts around it, as
    JSON when it reads as a JSON number, literal, object or array, else as a string."""
    text = raw[1:] if raw.startswith("\n") else raw
    text = text[:-1] if text.endswith("\n") else text
    stripped = text.strip()
    if stripped and (stripped[0] in "{[-0123456789" or stripped in ("true", "false", "null")):
        try:
            value = json.loads(stripped)
            json.dumps(value, allow_nan=False)  # 1e999 reads as inf, which is no JSON: keep the text
            return value
        except ValueError:
            pass
    return text


def _xml_call(body: str, partial: bool) -> ToolCall | None:
    """One ``<function=NAME>`` block (``body``: the text after ``<tool_call>``); None until the name is read.
    While streaming, the arguments are the parameters closed so far (JSON text without its ``}``); a
    whole answer cut inside the block (``max_tokens``, an unclosed parameter) keeps the call with those
    parameters, ``complete`` False, so that it agrees with what was streamed."""
    m = _XML_FUNC.match(body, skip_ws(body, 0))
    if m is None or not m.group(1).strip():
        return None
    name, pos = m.group(1).strip(), m.end()
    parts: list[str] = []
    done = False
    while True:
        j = skip_ws(body, pos)
        if body.startswith(XML_FUNC_CLOSE, j):
            done = True
            break
        p = _XML_PARAM.match(body, j)
        if p is None:
            break
        close = body.find(XML_PARAM_CLOSE, p.end())
        if close < 0:
            break
        key = p.group(1).strip()
        parts.append(json.dumps(key, ensure_ascii=False) + ": "
                     + json.dumps(xml_value(body[p.end():close]), ensure_ascii=False))
        pos = close + len(XML_PARAM_CLOSE)
    args = "{" + ", ".join(parts) + ("}" if done or not partial else "")
    return ToolCall(name, args, None, done)


def _qwen3_coder(text: str, partial: bool) -> Parsed:
    """``<tool_call>`` blocks holding ``<function=...>`` (module doc); other text is content."""
    out = Parsed()
    content: list[str] = []
    pos = 0
    while True:
        k = text.find(HERMES_OPEN, pos)
        if k < 0:
            rest = text[pos:]
            content.append(rest[:len(rest) - held_prefix(rest, (HERMES_OPEN,))] if partial else rest)
            break
        content.append(text[pos:k])
        close = text.find(HERMES_CLOSE, k)
        body = text[k + len(HERMES_OPEN):close if close >= 0 else len(text)]
        call = _xml_call(body, partial and close < 0)
        if call is not None:
            out.calls.append(call)
        elif close >= 0 or not partial:
            content.append(text[k:close + len(HERMES_CLOSE) if close >= 0 else len(text)])
        if close < 0:
            break
        pos = close + len(HERMES_CLOSE)
    out.content = "".join(content).strip() if out.calls else "".join(content)
    return out


def _python_call(src: str) -> ToolCall | None:
    """``tool.call(key=value, ...)`` (Llama 3.1 built-in tools) as a call with JSON arguments."""
    m = re.fullmatch(r"\s*([A-Za-z_][\w]*)\.call\((.*)\)\s*", src, re.S)
    if not m:
        return None
    try:
        node = ast.parse(f"f({m.group(2)})", mode="eval").body
        assert isinstance(node, ast.Call)
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except (SyntaxError, ValueError, AssertionError):
        return None
    return ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))


def _json_calls(text: str, start: int, partial: bool, sep: str = ";") -> tuple[list[ToolCall], bool]:
    """Calls from JSON objects at ``text[start:]`` separated by ``sep``/whitespace (False: not all JSON calls)."""
    calls: list[ToolCall] = []
    j = skip_ws(text, start)
    while j < len(text):
        if text[j] != "{":
            return calls, False
        call, end = _call_from_object(text, j)
        if call is None:
            return calls, partial and end is None
        calls.append(call)
        if end is None:  # unfinished (cut off): still a call, with the arguments written so far
            return calls, True
        j = skip_ws(text, end)
        if j < len(text) and text[j] == sep:
            j = skip_ws(text, j + 1)
    return calls, True


def _llama3(text: str, partial: bool) -> Parsed:
    k = text.find(PYTHON_TAG)
    if k >= 0:
        before, after = text[:k], text[k + len(PYTHON_TAG):]
        calls, ok = _json_calls(after, 0, partial)
        if ok and calls:
            return Parsed(before.strip(), "", calls)
        builtin = _python_call(after)
        if builtin is not None:
            return Parsed(before.strip(), "", [builtin])
        if partial:
            return Parsed(before, "", [])
        return Parsed(text)
    j = skip_ws(text, 0)
    if j < len(text) and text[j] == "{":
        calls, ok = _json_calls(text, j, partial)
        if ok and calls:
            return Parsed("", "", calls)
        if partial and ok:  # still undecided (the name not read yet): hold everything back
            return Parsed("")
        return Parsed(text)
    if partial:
        return Parsed(text[:len(text) - held_prefix(text, (PYTHON_TAG,))] if j < len(text) else "")
    return Parsed(text)


def _mistral(text: str, partial: bool) -> Parsed:
    k = text.find(MISTRAL_TAG)
    if k < 0:
        return Parsed(text[:len(text) - held_prefix(text, (MISTRAL_TAG,))] if partial else text)
    before, j = text[:k].strip(), skip_ws(text, k + len(MISTRAL_TAG))
    calls: list[ToolCall] = []
    if j < len(text) and text[j] == "[":
        j = skip_ws(text, j + 1)
        while j < len(text) and text[j] == "{":
            call, end = _call_from_object(text, j)
            if call is None:
                break
            calls.append(call)
            if end is None:
                break
            j = skip_ws(text, end)
            if j < len(text) and text[j] == ",":
                j = skip_ws(text, j + 1)
        return Parsed(before, "", calls) if calls or partial else Parsed(text)
    while j < len(text):  # [TOOL_CALLS]name[ARGS]{...} (repeated)
        a = text.find(MISTRAL_ARGS, j)
        if a < 0:
            break
        name = text[j:a].strip()
        v = skip_ws(text, a + len(MISTRAL_ARGS))
        end = scan_value(text, v) if v < len(text) else None
        calls.append(ToolCall(name, text[v:end] if end is not None else text[v:].rstrip(), None, end is not None))
        if end is None:
            break
        j = skip_ws(text, end)
        if text.startswith(MISTRAL_TAG, j):
            j = skip_ws(text, j + len(MISTRAL_TAG))
    return Parsed(before, "", calls) if calls or partial else Parsed(text)


_HARMONY_END = ("<|end|>", "<|call|>", "<|return|>")

#: the marker texts of each format (the answer must show them: :func:`parse` reads them)
MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": (HERMES_OPEN, HERMES_CLOSE),
    "qwen3-coder": (HERMES_OPEN, HERMES_CLOSE, "<function=", XML_FUNC_CLOSE),
    "llama3": (PYTHON_TAG,),
    "mistral": (MISTRAL_TAG, MISTRAL_ARGS),
    "gpt-oss": ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"),
    "gemma4": gemma4_calls.MARKERS,
    "generic": (),
}


def _gpt_oss(text: str, partial: bool, reasoning: bool) -> Parsed:
    """Harmony messages: ``[<|start|>assistant]<|channel|>NAME[ to=functions.X][ <|constrain|>json]<|message|>BODY``
    then ``<|end|>`` / ``<|call|>`` / ``<|return|>``."""
    out = Parsed()
    content, thoughts, pos = [], [], 0
    if "<|channel|>" not in text and "<|message|>" not in text:
        body = text if not partial else text[:len(text) - held_prefix(text, ("<|channel|>", "<|start|>"))]
        return Parsed(body)
    while pos < len(text):
        m = text.find("<|message|>", pos)
        if m < 0:
            break
        header = text[pos:m]
        b = m + len("<|message|>")
        ends = [e for e in (text.find(t, b) for t in _HARMONY_END) if e >= 0]
        e = min(ends) if ends else len(text)
        body = text[b:e]
        if not ends and partial:
            body = body[:len(body) - held_prefix(body, _HARMONY_END)]
        target = re.search(r"to=functions\.([^\s<]+)", header)
        channel = re.search(r"<\|channel\|>\s*(\w+)", header)
        ch = channel.group(1) if channel else "final"
        if target:
            args = body.strip() if ends or not partial else body.lstrip()
            out.calls.append(ToolCall(target.group(1), args.rstrip(), None, bool(ends)))
        elif ch == "analysis" and reasoning:
            thoughts.append(body)
        elif reasoning:
            content.append(body)
        else:
            content.append(text[pos:e + (len(next(t for t in _HARMONY_END if text.startswith(t, e))) if ends else 0)])
        if not ends:
            break
        pos = e + len(next(t for t in _HARMONY_END if text.startswith(t, e)))
        if text.startswith("<|start|>assistant", pos):
            pos += len("<|start|>assistant")
    out.content, out.reasoning = "".join(content), "".join(thoughts)
    return out


def _generic(text: str, partial: bool) -> Parsed:
    """llama.cpp's generic format: the answer is one JSON object (held back until it is whole)."""
    j = skip_ws(text, 0)
    if j >= len(text) or text[j] != "{":
        return Parsed("" if partial and j >= len(text) else text)
    end = scan_value(text, j)
    if end is None:
        return Parsed("" if partial else text)
    try:
        obj = json.loads(text[j:end])
    except ValueError:
        return Parsed(text)
    if not isinstance(obj, dict):
        return Parsed(text)
    raw = [obj["tool_call"]] if isinstance(obj.get("tool_call"), dict) else obj.get("tool_calls")
    if isinstance(raw, list) and raw and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in raw):
        return Parsed("", "", [ToolCall(c["name"], json.dumps(c.get("arguments", {}), ensure_ascii=False),
                                        c.get("id") if isinstance(c.get("id"), str) else None) for c in raw])
    if isinstance(obj.get("response"), str):
        return Parsed(obj["response"])
    return Parsed(text)


def parse(text: str, fmt: str, *, partial: bool = False, reasoning_format: str = "deepseek",
          thinking_open: bool = False, tools: bool = True) -> Parsed:
    """Split an answer into content, reasoning and tool calls.

    Args:
        text: the answer so far (``partial``) or whole.
        fmt: a tool-call format (:data:`FORMATS`).
        reasoning_format: ``none`` (thinking stays in the content), ``deepseek`` (moved to
            ``reasoning``), ``deepseek-legacy`` (both).
        thinking_open: the prompt ended inside a ``<think>`` block (the answer starts in it).
        tools: parse tool calls (False: tool_choice ``none`` or no tools: content only).
    Returns:
        :class:`Parsed`.
    """
    if fmt == "gpt-oss":
        p = _gpt_oss(text, partial, reasoning_format != "none")
        if not tools and p.calls:
            p = Parsed(text if not partial else p.content, p.reasoning)
        if reasoning_format == "deepseek-legacy":
            p.content = text
        return p
    if fmt == "gemma4":
        content, reasoning, calls = gemma4_calls.parse_gemma4(
            text, partial=partial, reasoning=reasoning_format != "none",
            legacy=reasoning_format == "deepseek-legacy", tools=tools)
        return Parsed(content, reasoning, [ToolCall(n, a, None, done) for n, a, done in calls])
    split = (split_think(text, partial=partial, thinking_open=thinking_open) if reasoning_format != "none"
             else ReasoningSplit("", text, ""))
    body = split.content
    if not tools:
        p = Parsed(body)
    elif fmt == "hermes":
        p = _hermes(body, partial)
    elif fmt == "qwen3-coder":
        p = _qwen3_coder(body, partial)
    elif fmt == "llama3":
        p = _llama3(body, partial)
    elif fmt == "mistral":
        p = _mistral(body, partial)
    elif fmt == "generic":
        p = _generic(body, partial)
    else:
        raise ToolCallError(f"unknown tool-call format {fmt!r}; expected one of {', '.join(FORMATS)}")
    p.reasoning = split.reasoning
    if reasoning_format == "deepseek-legacy":
        p.content = split.raw_reasoning + p.content
    return p


class MessageStream:
    """OpenAI chat deltas from an answer streamed piece by piece (llama-server's ``common_chat_msg_diff``).

    Args:
        fmt, reasoning_format, thinking_open, tools: as for :func:`parse`.
    Attributes:
        text: the answer so far; calls: the calls emitted so far (with their ids).
    """

    def __init__(self, fmt: str, *, reasoning_format: str = "deepseek", thinking_open: bool = False,
                 tools: bool = True):
        self.kw = dict(reasoning_format=reasoning_format, thinking_open=thinking_open, tools=tools)
        self.fmt = fmt
        self.text = ""
        self.content = self.reasoning = ""
        self.calls: list[ToolCall] = []

    def feed(self, piece: str, final: bool = False) -> list[dict[str, Any]]:
        """Deltas (``{"content": ...}``, ``{"reasoning_content": ...}``, ``{"tool_calls": [...]}``) for ``piece``.

        ``final``: the answer is complete (held-back text is released).
        """
        self.text += piece
        p = parse(self.text, self.fmt, partial=not final, **self.kw)  # type: ignore[arg-type]
        out: list[dict[str, Any]] = []
        if p.reasoning.startswith(self.reasoning) and len(p.reasoning) > len(self.reasoning):
            out.append({"reasoning_content": p.reasoning[len(self.reasoning):]})
            self.reasoning = p.reasoning
        content = p.content if final else p.content.rstrip()  # trailing space waits: a call may follow
        if content.startswith(self.content) and len(content) > len(self.content):
            out.append({"content": content[len(self.content):]})
            self.content = content
        for i, call in enumerate(p.calls):
            if i >= len(self.calls):
                cid = call.id or _call_id(self.fmt)
                self.calls.append(ToolCall(call.name, call.arguments, cid, call.complete))
                out.append({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                            "function": {"name": call.name, "arguments": call.arguments}}]})
                continue
            old = self.calls[i]
            if call.arguments.startswith(old.arguments) and len(call.arguments) > len(old.arguments):
                out.append({"tool_calls": [{"index": i, "function": {
                    "arguments": call.arguments[len(old.arguments):]}}]})
                old.arguments = call.arguments
            old.complete = call.complete
        return out
