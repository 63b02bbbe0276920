"""OpenAI-shaped messages made renderable by the template at hand (llama.cpp's template capabilities).

Clients send ``content`` as a string, as a list of parts (``[{"type": "text", "text": ...}]``,
what LangChain, Open WebUI and agent SDKs send) or as ``null`` (an assistant turn that only
calls tools). Many model templates concatenate ``message['content']`` as a string, so a list
or ``None`` breaks them (or, through jinja's ``~``, renders a Python repr). As llama.cpp does
(``common/chat.cpp`` with its template capability probes ``supports_typed_content`` and
``requires_non_null_content``), each template is probed once:

- a template that renders a text part's text (and not the list's repr) gets the parts as
  they are; any other gets the text parts joined with a newline;
- a template that fails on, or prints ``None`` for, a null content gets ``""``.

With a multimodal projector (``Llama(chat_handler=...)``, :mod:`cooktop.api.multimodal`),
:func:`images_to_markers` first turns each ``image_url`` part into a text part holding the media
marker ``<__media__>`` (llama-server's ``oaicompat_chat_params_parse`` does the same), so the
marker lands where the image was, joined to the text around it like any text part. Without one,
and always for ``input_audio`` and ``file`` parts, parts other than text are refused with a
:class:`~cooktop.errors.ChatTemplateError` naming the message (llama-server refuses them likewise
without a multimodal projector).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ChatTemplateError

_PROBE = "cooktop-probe-7f3a"
_TEXT_TYPES = ("text", "input_text", "output_text")


def part_text(part: Any, index: int) -> str | None:
    """The text of one content part; None for a part to drop (not a dict).

    Raises:
        ChatTemplateError: an image, audio or file part (``messages[index]`` named).
    """
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind in _TEXT_TYPES:
        return str(part.get("text", ""))
    what = f"a {kind!r} part" if kind is not None else "a part without a 'type'"
    raise ChatTemplateError(f"messages[{index}]['content'] has {what}: this model reads text only "
                            "(no multimodal projector: images need Llama(chat_handler=MTMDChatHandler(...)) in "
                            "the Python API; cooktop reads no audio or files); send text parts")


#: llama.cpp's media marker (``mtmd_default_marker``; :data:`cooktop.vision.prompt.MEDIA_MARKER`).
MEDIA_MARKER = "<__media__>"


def images_to_markers(messages: Sequence[Any], image_types: Sequence[str] = ("image_url",)
                      ) -> tuple[list[Any], list[tuple[int, Mapping[str, Any]]]]:
    """``messages`` with each image part (a part whose ``type`` is in ``image_types``) replaced by
    ``{"type": "text", "text": MEDIA_MARKER}``, and the image parts in prompt order.

    Returns:
        (the messages, copied where a part changed; ``[(message index, image part), ...]``).
        A message that is not a dict, or whose content is not a list, is left as it is (for
        :func:`check_roles` to judge).
    """
    out: list[Any] = []
    found: list[tuple[int, Mapping[str, Any]]] = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list) or not any(isinstance(p, Mapping) and p.get("type") in image_types
                                                    for p in content):
            out.append(m)
            continue
        parts = []
        for p in content:
            if isinstance(p, Mapping) and p.get("type") in image_types:
                found.append((i, p))
                parts.append({"type": "text", "text": MEDIA_MARKER})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out, found


def flatten_content(content: Any, index: int) -> str:
    """One message's content as one string, as llama.cpp's legacy formatter sees it.

    llama.cpp ``common/chat.cpp`` (``common_chat_templates_apply_legacy``): a string as is;
    text parts joined with a newline; no content is empty.

    Raises:
        ChatTemplateError: content of another type, or a non-text part.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes):
        texts = [t for t in (part_text(p, index) for p in content) if t is not None]
        return "\n".join(texts)
    raise ChatTemplateError(
        f"messages[{index}]['content'] must be a string, a list of content parts or null, "
        f"got {type(content).__name__}")


def _check_parts(content: Any, index: int) -> None:
    if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
        for p in content:
            part_text(p, index)


#: the roles a message may have: OpenAI's (``developer`` is its newer name for ``system``, ``function``
#: the legacy tool result) and Llama 3.1's ``ipython`` (tool results in its template)
ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
_NEEDS_CONTENT = ("system", "developer", "user", "tool", "function", "ipython")


def check_roles(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """``messages`` with each role checked and ``developer`` renamed ``system`` (as OpenAI maps it
    for models without a developer role; llama.cpp's templates know no ``developer``).

    Raises:
        ChatTemplateError: a message that is not an object, a role outside :data:`ROLES`, or a
            message other than an assistant's without ``content`` (OpenAI refuses those).
    """
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object with 'role' and 'content', "
                                    f"got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"messages[{i}]['role']: {role!r} is not a chat role (expected one of "
                                    f"{', '.join(ROLES)})")
        if role in _NEEDS_CONTENT and m.get("content") is None:
            raise ChatTemplateError(f"messages[{i}]: a {role} message needs 'content' (a string or a list "
                                    "of text parts)")
        out.append({**m, "role": "system"} if role == "developer" else dict(m))
    return out


def continued_content(message: Mapping[str, Any]) -> str:
    """The text an assistant message left to be continued (``continue_final_message``, llama-server's
    assistant prefill): its ``content`` string, or its text parts joined by a blank line (llama.cpp
    common/chat.cpp ``common_chat_msg::render_content``, delimiter ``"\\n\\n"``); "" for none."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(p["text"] for p in content
                            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def probe_capabilities(render: Callable[[list[dict[str, Any]]], str]) -> tuple[bool, bool]:
    """(typed content works, null content works) for a template's ``render(messages)``."""
    def attempt(messages: list[dict[str, Any]]) -> str | None:
        try:
            return render(messages)
        except Exception:  # noqa: BLE001 - any failure means "not supported"
            return None

    out = attempt([{"role": "user", "content": [{"type": "text", "text": _PROBE}]}])
    typed = out is not None and _PROBE in out and "'text'" not in out and '"text"' not in out
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    out = attempt([{"role": "user", "content": _PROBE},
                   {"role": "assistant", "content": None, "tool_calls": [call]}])
    null = out is not None and "None" not in out
    return typed, null


def normalize(messages: Sequence[Mapping[str, Any]], typed_ok: bool, null_ok: bool) -> list[dict[str, Any]]:
    """``messages`` as the template can render them (module doc).

    Raises:
        ChatTemplateError: a content of a wrong type, or a non-text part.
    """
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if content is None:
            if not null_ok:
                m = {**m, "content": ""}
        elif isinstance(content, str):
            pass
        elif typed_ok and isinstance(content, Sequence) and not isinstance(content, bytes):
            _check_parts(content, i)
        else:
            m = {**m, "content": flatten_content(content, i)}
        out.append(dict(m))
    return out
