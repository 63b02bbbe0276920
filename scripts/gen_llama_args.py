"""Regenerate ``cooktop/cli/llama_args.json``: every option of llama.cpp's ``common/arg.cpp``.

Usage::

    pip download --no-binary :all: --no-deps llama-cpp-python -d /tmp/lcpp-sdist
    tar xzf /tmp/lcpp-sdist/llama_cpp_python-*.tar.gz -C /tmp/lcpp-src
    python scripts/gen_llama_args.py NEWEST/vendor/llama.cpp/common/arg.cpp [OLDER/.../arg.cpp ...]

Reads each ``add_opt(common_arg(...))`` of ``common_params_parser_init``: its spellings
(``args``), negated spellings (``args_neg``), how many values it takes (from its handler's
signature: ``(params)`` / ``(params, bool)`` 0, ``(params, string)`` / ``(params, int)`` 1,
``(params, string, string)`` 2), the programs it belongs to (``set_examples``, default
``COMMON``; ``set_excludes``) and its environment variable (``set_env``). Options marked
``set_preset_only`` are not command-line options and are left out. Older files add the
spellings the newer ones no longer have (``--mlock`` and ``--no-mmap`` became ``--load-mode``),
each with ``removed`` set; the JSON was made from llama-cpp-python 0.3.36's and 0.3.16's. The JSON is what
``cooktop/cli/llama_flags.py`` reads at run time; this script runs at development time only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "cooktop" / "cli" / "llama_args.json"
_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesis that closes the one at ``text[start]`` (strings skipped)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "'":
            i += 3 if text[i + 1] != "\\" else 4
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced parentheses")


def _brace_strings(text: str, i: int) -> tuple[list[str], int]:
    """The string literals of the ``{...}`` list starting at ``text[i]`` and the index after it."""
    end = text.index("}", i)
    return _STR.findall(text[i:end]), end + 1


def _enums(text: str) -> list[str]:
    return [e.removeprefix("LLAMA_EXAMPLE_") for e in re.findall(r"LLAMA_EXAMPLE_\w+", text)]


def parse(src: str) -> list[dict]:
    """Every command-line option of arg.cpp, in its order."""
    at = src.index("mmproj_examples")
    groups = {"mmproj_examples": _enums(src[at:src.index("};", at)])}
    options = []
    for m in re.finditer(r"add_opt\(common_arg\(", src):
        inner_start = m.end() - 1
        inner_end = _balanced(src, inner_start)
        body = src[inner_start + 1:inner_end - 1]
        j = body.index("{")
        args, k = _brace_strings(body, j)
        rest = body[k:].lstrip().lstrip(",").lstrip()
        neg: list[str] = []
        if rest.startswith("{"):
            neg, k2 = _brace_strings(rest, 0)
        lam = re.search(r"\[\]\s*\(([^)]*)\)", body)
        if lam is None:
            raise ValueError(f"no handler for {args}")
        n_params = len([p for p in lam.group(1).split(",") if p.strip()])
        kind = lam.group(1)
        nargs = 0 if n_params == 1 or "bool" in kind else n_params - 1
        outer_end = _balanced(src, m.end() - len("common_arg(") - 1)
        chain = src[inner_end:outer_end - 1]
        if "set_preset_only" in chain:
            continue
        examples, excludes, env = ["COMMON"], [], None
        ex = re.search(r"set_examples\(([^)]*)\)", chain)
        if ex:
            named = ex.group(1).strip()
            examples = groups.get(named, _enums(named))
        exc = re.search(r"set_excludes\(([^)]*)\)", chain)
        if exc:
            excludes = _enums(exc.group(1))
        en = re.search(r'set_env\("([^"]+)"\)', chain)
        if en:
            env = en.group(1)
        options.append({"args": args, "neg": neg, "nargs": nargs, "examples": examples,
                        "excludes": excludes, "env": env})
    return options


def _version(path: Path) -> str:
    for parent in path.parents:
        if parent.name.startswith("llama_cpp_python-"):
            return parent.name
    return str(path)


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    options = parse(paths[0].read_text())
    seen = {s for o in options for s in o["args"] + o["neg"]}
    for older in paths[1:]:
        for o in parse(older.read_text()):
            o["args"] = [s for s in o["args"] if s not in seen]
            o["neg"] = [s for s in o["neg"] if s not in seen]
            if o["args"] or o["neg"]:
                if not o["args"]:
                    o["args"], o["neg"] = o["neg"], []
                o["removed"] = True
                seen.update(o["args"] + o["neg"])
                options.append(o)
    sources = ", ".join(f"{_version(p)}/vendor/llama.cpp/common/arg.cpp" for p in paths)
    data = {"source": f"{sources} (scripts/gen_llama_args.py)", "options": options}
    OUT.write_text(json.dumps(data, indent=0) + "\n")
    print(f"{OUT}: {len(options)} options from {sources}")


if __name__ == "__main__":
    main()
