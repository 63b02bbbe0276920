"""A tolerant JSON scanner: where a value or an object's members end in text that may stop mid-value.

Used to read tool calls while they stream (:mod:`cooktop.text.tool_calls`): the
span of a value is found without parsing it, so a call's ``arguments`` can be
the model's own text, growing as it arrives.
"""

from __future__ import annotations

import json

_WS = " \t\r\n"


def skip_ws(s: str, i: int) -> int:
    """The index of the first non-whitespace character of ``s`` at or after ``i`` (``len(s)`` if none)."""
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def scan_value(s: str, i: int) -> int | None:
    """End index of the JSON value starting at ``s[i]`` (None if the text ends first).

    Strings, objects and arrays are followed with their nesting and escapes; a number or a
    literal ends at the first character that cannot continue it.
    """
    if i >= len(s):
        return None
    c = s[i]
    if c == '"':
        j = i + 1
        while j < len(s):
            if s[j] == "\\":
                j += 2
                continue
            if s[j] == '"':
                return j + 1
            j += 1
        return None
    if c in "{[":
        depth, j, in_str = 0, i, False
        while j < len(s):
            ch = s[j]
            if in_str:
                if ch == "\\":
                    j += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i
    while j < len(s) and s[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(s) else None


def object_members(s: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None]:
    """The members of the JSON object starting at ``s[i]`` (``{``), as far as the text goes.

    Returns:
        ({key: (value start, value end or None while unfinished)}, the index after ``}`` or None).
    """
    out: dict[str, tuple[int, int | None]] = {}
    j = skip_ws(s, i + 1)
    while j < len(s):
        if s[j] == "}":
            return out, j + 1
        if s[j] == ",":
            j = skip_ws(s, j + 1)
            continue
        if s[j] != '"':
            return out, None
        k_end = scan_value(s, j)
        if k_end is None:
            return out, None
        try:
            key = json.loads(s[j:k_end])
        except ValueError:
            return out, None
        j = skip_ws(s, k_end)
        if j >= len(s) or s[j] != ":":
            return out, None
        v = skip_ws(s, j + 1)
        if v >= len(s):
            return out, None
        v_end = scan_value(s, v)
        out[key] = (v, v_end)
        if v_end is None:
            return out, None
        j = skip_ws(s, v_end)
    return out, None
