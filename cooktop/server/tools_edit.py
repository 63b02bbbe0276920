"""``edit_file``'s text replacement, as llama-server's ``server_tool_edit_file`` (tools/server/
server-tools.cpp): every ``old_text`` must occur exactly once in the *original* content (not
incrementally), edits may not overlap, and when an ``old_text`` has no exact match it is looked for in a
copy where each line lost its trailing blanks and had smart quotes / dashes / special spaces made ASCII;
then lines no edit touches are kept byte for byte from the original.
"""

from __future__ import annotations

from typing import Any

from .tools_io import ToolError

_FUZZY = [("\u2018", "'"), ("\u2019", "'"), ("\u201a", "'"), ("\u201b", "'"),
          ("\u201c", '"'), ("\u201d", '"'), ("\u201e", '"'), ("\u201f", '"'),
          *[(chr(c), "-") for c in range(0x2010, 0x2016)], ("\u2212", "-"),
          ("\u00a0", " "), *[(chr(c), " ") for c in range(0x2002, 0x200b)],
          ("\u202f", " "), ("\u205f", " "), ("\u3000", " ")]


def normalize_line(line: str) -> str:
    """One line without trailing `` \\t\\r``, its smart quotes, dashes and special spaces made ASCII."""
    s = line.rstrip(" \t\r")
    for a, b in _FUZZY:
        s = s.replace(a, b)
    return s


def normalize(content: str) -> str:
    """:func:`normalize_line` on every ``\\n``-separated line (line count and order kept)."""
    return "\n".join(normalize_line(x) for x in content.split("\n"))


def _split_nl(content: str) -> list[str]:
    out, start = [], 0
    while start < len(content):
        nl = content.find("\n", start)
        if nl < 0:
            out.append(content[start:])
            break
        out.append(content[start:nl + 1])
        start = nl + 1
    return out


def _count(content: str, needle: str) -> int:
    n = pos = 0
    while (pos := content.find(needle, pos)) >= 0:
        n += 1
        pos += len(needle)
    return n


def _apply(content: str, reps: list[tuple[int, int, int, str]], offset: int) -> str:
    for _, idx, length, new in reversed(reps):
        i = idx - offset
        content = content[:i] + new + content[i + length:]
    return content


def _apply_preserving(original: str, base: str, reps: list[tuple[int, int, int, str]]) -> str:
    orig_lines = _split_nl(original)
    spans, off = [], 0
    for line in _split_nl(base):
        spans.append((off, off + len(line)))
        off += len(line)
    groups: list[list[Any]] = []
    for rep in reps:
        start, end = rep[1], rep[1] + rep[2]
        first = next(i for i, (a, b) in enumerate(spans) if a <= start < b)
        last = first
        while last < len(spans) and spans[last][1] < end:
            last += 1
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last + 1)
            groups[-1][2].append(rep)
        else:
            groups.append([first, last + 1, [rep]])
    out, at = [], 0
    for first, end_line, greps in groups:
        out.extend(orig_lines[at:first])
        a, b = spans[first][0], spans[end_line - 1][1]
        out.append(_apply(base[a:b], greps, a))
        at = end_line
    out.extend(orig_lines[at:])
    return "".join(out)


def apply_edits(original: str, edits: Any, path: str) -> tuple[str, int]:
    """The new content of a file and the number of edits applied.

    Args:
        original: the file's text; edits: the request's ``edits`` (a list of ``{old_text, new_text}``);
        path: the path as the request named it (for messages).

    Raises:
        ToolError: llama-server's messages: ``"edits" must be a non-empty array``,
            ``edits[I].old_text must not be empty``, ``could not find edits[I].old_text in PATH, ...``,
            ``found N occurrences of edits[I].old_text in PATH, it must be unique``,
            ``edits[I] and edits[J] overlap in PATH; ...``, ``no changes made: ...``.
    """
    if not isinstance(edits, list) or not edits:
        raise ToolError('"edits" must be a non-empty array')
    reqs = []
    for i, e in enumerate(edits):
        if not isinstance(e, dict) or not isinstance(e.get("old_text"), str) or not isinstance(e.get("new_text"), str):
            raise ToolError(f"edits[{i}] must be an object with string old_text and new_text")
        if not e["old_text"]:
            raise ToolError(f"edits[{i}].old_text must not be empty")
        reqs.append((e["old_text"], e["new_text"]))
    norm_orig = normalize(original)
    fuzzy = False
    for i, (old, _) in enumerate(reqs):
        if old in original:
            continue
        if normalize(old) not in norm_orig:
            raise ToolError(f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                            "content exactly")
        fuzzy = True
    base = norm_orig if fuzzy else original
    matched = []
    for i, (old, new) in enumerate(reqs):
        needle = normalize(old) if fuzzy else old
        n = _count(norm_orig, normalize(old))
        if n > 1:
            raise ToolError(f"found {n} occurrences of edits[{i}].old_text in {path}, it must be unique")
        matched.append((i, base.find(needle), len(needle), new))
    matched.sort(key=lambda m: m[1])
    for a, b in zip(matched, matched[1:]):
        if a[1] + a[2] > b[1]:
            raise ToolError(f"edits[{a[0]}] and edits[{b[0]}] overlap in {path}; merge them into one edit or "
                            "target disjoint regions")
    new_content = _apply_preserving(original, base, matched) if fuzzy else _apply(base, matched, 0)
    if new_content == original:
        raise ToolError("no changes made: the replacement(s) produced identical content")
    return new_content, len(matched)
