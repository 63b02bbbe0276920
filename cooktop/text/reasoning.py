"""Reasoning ("thinking") in a model's answer: ``<think>...</think>`` blocks, llama-server's reasoning formats.

``--reasoning-format`` (llama.cpp common/arg.cpp): ``none`` leaves the thinking in
the content; ``deepseek`` moves it to ``reasoning_content``; ``deepseek-legacy``
does both; ``auto`` (the default) is ``deepseek``. Models such as Qwen3,
SmolLM3 and the DeepSeek-R1 distills write ``<think>`` first, or their template
opens the block in the prompt (then the answer starts inside it:
``thinking_open``). gpt-oss's ``analysis`` channel is split by
:mod:`cooktop.text.tool_calls`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def reasoning_format_name(value: str | None) -> str:
    """The effective format for ``value`` (``auto``/None -> ``deepseek``).

    Raises:
        ValueError: not one of :data:`REASONING_FORMATS`.
    """
    if value is None or value == "auto":
        return "deepseek"
    if value not in REASONING_FORMATS:
        raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got {value!r}")
    return value


def held_prefix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that is a proper start of one of ``markers`` (to hold back)."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a ``<think>`` block (DeepSeek-R1, Qwen3 with thinking forced)."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN)


@dataclasses.dataclass
class ReasoningSplit:
    """``reasoning`` (stripped), ``content`` after the block, ``raw_reasoning`` the block's own text."""

    reasoning: str
    content: str
    raw_reasoning: str


def split_think(text: str, *, partial: bool = False, thinking_open: bool = False) -> ReasoningSplit:
    """Split a leading ``<think>...</think>`` block off an answer.

    Args:
        text: the answer (whole, or so far when ``partial``).
        partial: hold back text that may become ``<think>`` / ``</think>``.
        thinking_open: the answer starts inside the block (its prompt ended with ``<think>``).
    Returns:
        :class:`ReasoningSplit`; no block: reasoning ``""`` and the text as content.
    """
    start = 0
    if not thinking_open:
        lead = len(text) - len(text.lstrip())
        body = text[lead:]
        if not body.startswith(THINK_OPEN):
            if partial and body and THINK_OPEN.startswith(body):
                return ReasoningSplit("", "", "")
            return ReasoningSplit("", text, "")
        start = lead + len(THINK_OPEN)
    end = text.find(THINK_CLOSE, start)
    if end < 0:
        inner = text[start:]
        if partial:
            inner = inner[:len(inner) - held_prefix(inner, (THINK_CLOSE,))]
        return ReasoningSplit(inner.strip(), "", text[:start] + inner)
    after = end + len(THINK_CLOSE)
    return ReasoningSplit(text[start:end].strip(), text[after:].lstrip(), text[:after])
