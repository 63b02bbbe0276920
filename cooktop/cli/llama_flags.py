"""Every llama.cpp command-line option on cooktop's ``run``, ``chat`` and ``serve``.

``llama_args.json`` (beside this module) lists the options of llama.cpp's
``common/arg.cpp``, generated at development time by ``scripts/gen_llama_args.py``
(its ``source`` key names the llama-cpp-python sdists it was read from): each
option's spellings, ``--no-`` spellings, number of values (0, 1 or 2), the
programs it belongs to and its ``LLAMA_ARG_*`` variable.

:func:`llama_options` adds them to a click command, so a llama.cpp command line
parses unchanged:

- a spelling of an option the command implements (``--n-predict`` for ``-n``,
  ``--temperature`` for ``--temp``) becomes an alias of the command's own option
  (a ``--no-`` spelling of a two-way flag its other side; the other ``--no-``
  spellings of a command's own ``--no-x`` flag alias that flag, while the positive
  ones stay separate, ignored options); on ``serve`` that option also reads the
  option's ``LLAMA_ARG_*`` variable, as llama-server does;
- every other option is a hidden option that, when given, prints one line
  ``cooktop: FLAG [VALUE] (ALIAS) is not supported by cooktop, ignored[: why]``
  and changes nothing (values that are what cooktop does anyway pass silently);
- ``-v/--verbose`` turns on cooktop's INFO log.

Multi-letter single-dash spellings (``-cnv``, ``-ngl``, ``-nkvo``, ``-ot``) parse
as one option because click matches a registered spelling whole before it splits
``-abc`` into short options: registering every llama.cpp spelling is what keeps
``-cnv`` from being read as ``-c nv``. An option a command (or another module)
defines itself is never shadowed: its spellings are taken out of the table.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from importlib import resources
from typing import Any

import click

#: llama.cpp programs (``LLAMA_EXAMPLE_*``) whose options each cooktop command accepts
#: (``COMMON`` options belong to all of them).
PROGRAMS = {"run": ("COMPLETION", "CLI"), "chat": ("CLI", "COMPLETION"), "serve": ("SERVER",),
            "perplexity": ("PERPLEXITY",)}

#: Why an option changes nothing here, by one of its spellings.
REASONS = {
    "--model-draft": "speculative decoding is on cooktop run and cooktop serve",
    "--main-gpu": "choose the device with --device (-dev)",
    "--split-mode": "cooktop splits by layer (--split / -ts)",
    "--ubatch-size": "cooktop evaluates -b tokens per forward pass",
    "--parallel": "one conversation runs at a time here; cooktop serve -np has slots",
    "--mlock": "the weights are memory-mapped (the OS may page them)",
    "--no-mmap": "cooktop always memory-maps the model file",
    "--mmap": "cooktop always memory-maps the model file",
    "--interactive": "use conversation mode (-cnv, cooktop chat)",
    "--interactive-first": "use conversation mode (-cnv, cooktop chat)",
    "--hellaswag": "cooktop perplexity computes perplexity and KL divergence only",
    "--winogrande": "cooktop perplexity computes perplexity and KL divergence only",
    "--multiple-choice": "cooktop perplexity computes perplexity and KL divergence only",
    "--ppl-stride": "cooktop perplexity scores llama.cpp's default way: the second half of each chunk",
    "--ppl-output-type": "cooktop perplexity prints llama.cpp's default output",
    "--context-shift": "generation stops when the context is full (finish reason: length)",
    "--keep": "generation stops when the context is full (no context shift), so there is nothing to keep",
    "--mmproj": "images are taken by cooktop run (--mmproj, --image) only so far",
    "--rope-scaling": "rope scaling comes from the model's metadata",
    "--rope-freq-base": "rope scaling comes from the model's metadata",
    "--rope-freq-scale": "rope scaling comes from the model's metadata",
}

#: Values that are what cooktop does anyway: given, they pass without a notice.
HARMLESS: dict[str, set[Any]] = {
    "--main-gpu": {"0"}, "--split-mode": {"layer"}, "--parallel": {"1"},
    "--color": {"off", "auto"}, "--context-shift": {False},
    "--display-prompt": {True}, "--warmup": {False}, "--mmap": {True},
}

#: Accepted without a notice: what cooktop always does (the chat template is always
#: rendered with jinja; serve always batches continuously).
SILENT = {"--jinja", "--cont-batching", "--webui", "--verbose", "--conversation"}

#: Options that take an optional value here (llama.cpp's older spelling was a bare flag):
#: spelling -> the value a bare flag means.
OPTIONAL_VALUE = {"--color": "on"}

#: Never added: click's own help option, and the group-level ``--version``.
SKIP = {"--help", "--version", "--completion-bash"}


@dataclasses.dataclass(frozen=True)
class LlamaOption:
    """One option of llama.cpp's arg.cpp (see ``llama_args.json``).

    args / neg: its spellings and ``--no-`` spellings; nargs: values it takes (0, 1 or 2);
    examples / excludes: the programs (``LLAMA_EXAMPLE_*`` without the prefix);
    env: its ``LLAMA_ARG_*`` variable or None; removed: only in an older llama.cpp.
    """

    args: tuple[str, ...]
    neg: tuple[str, ...]
    nargs: int
    examples: tuple[str, ...]
    excludes: tuple[str, ...]
    env: str | None
    removed: bool = False

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.args + self.neg

    @property
    def long(self) -> str:
        """The longest ``--`` spelling (the key of :data:`REASONS` and friends)."""
        longs = [s for s in self.args if s.startswith("--")] or list(self.args)
        return max(longs, key=len)

    @property
    def dest(self) -> str:
        return "llama_" + re.sub(r"\W", "_", self.long.lstrip("-"))

    def key_of(self, table: dict | set) -> str | None:
        """The spelling of this option that ``table`` has, if any."""
        return next((s for s in self.spellings if s in table), None)


@functools.lru_cache(maxsize=1)
def load_table() -> tuple[str, tuple[LlamaOption, ...]]:
    """(source, options) of ``llama_args.json``."""
    data = json.loads(resources.files(__package__).joinpath("llama_args.json").read_text())
    opts = tuple(LlamaOption(tuple(o["args"]), tuple(o["neg"]), int(o["nargs"]), tuple(o["examples"]),
                             tuple(o["excludes"]), o["env"], bool(o.get("removed", False)))
                 for o in data["options"])
    return data["source"], opts


def options_for(program: str) -> list[LlamaOption]:
    """The llama.cpp options of the programs :data:`PROGRAMS` maps ``program`` to."""
    wanted = PROGRAMS[program]
    out = []
    for o in load_table()[1]:
        if ("COMMON" in o.examples or any(e in o.examples for e in wanted)) and \
                not all(e in o.excludes for e in wanted):
            out.append(o)
    return out


def _hidden_option(o: LlamaOption, taken: set[str]) -> click.Option | None:
    """A hidden click option for ``o``'s spellings that are not in ``taken``."""
    args = [s for s in o.args if s not in taken]
    neg = [s for s in o.neg if s not in taken]
    if not args and not neg:
        return None
    common: dict[str, Any] = dict(default=None, hidden=True, expose_value=True)
    if o.nargs == 0:
        decls = [f"{a}/{n}" for a, n in zip(args, neg)] + args[len(neg):] + [f" /{n}" for n in neg[len(args):]]
        if neg:
            return click.Option([*decls, o.dest], is_flag=True, **common)
        return click.Option([*decls, o.dest], is_flag=True, flag_value=True, **common)
    key = o.key_of(OPTIONAL_VALUE)
    if key is not None:
        return click.Option([*args, o.dest], is_flag=False, flag_value=OPTIONAL_VALUE[key], **common)
    return click.Option([*args, o.dest], nargs=o.nargs, **common)


def notice(o: LlamaOption, value: Any) -> str | None:
    """The one-line notice for ``o`` given as ``value`` (None: say nothing)."""
    if o.key_of(SILENT) is not None:
        return None
    key = o.key_of(HARMLESS)
    if key is not None and (value if isinstance(value, bool) else str(value).lower()) in HARMLESS[key]:
        return None
    names = o.neg if value is False and o.neg else o.args
    flag = next((s for s in names if not s.startswith("--")), names[0])
    alias = next((s for s in names if s != flag), None)
    shown = "" if isinstance(value, bool) else " " + " ".join(value) if isinstance(value, tuple) else f" {value}"
    why_key = o.key_of(REASONS)
    why = f": {REASONS[why_key]}" if why_key else ""
    aka = f" ({alias})" if alias else ""
    return f"cooktop: {flag}{shown}{aka} is not supported by cooktop, ignored{why}"


def llama_options(program: str):
    """Decorator (innermost-but-one: directly below ``@cli.command``) giving a command
    every llama.cpp option of ``program`` (see the module docstring).

    Raises:
        KeyError: ``program`` is not one of :data:`PROGRAMS` (a programming error).
    """
    table = options_for(program)

    def deco(f):
        params: list[click.Parameter] = getattr(f, "__click_params__", [])
        owner = {s: p for p in params for s in [*p.opts, *p.secondary_opts]}
        ignored: list[tuple[LlamaOption, click.Option]] = []
        for o in table:
            if o.key_of(SKIP) is not None:
                continue
            pos = [s for s in o.args if s in owner]
            neg = [s for s in o.neg if s in owner]
            if pos or neg:  # the command implements it: its missing spellings become aliases
                p = owner[(pos or neg)[0]]
                two_way = isinstance(p, click.Option) and p.is_bool_flag and bool(p.secondary_opts)
                if pos:
                    for s in o.args:
                        if s not in owner:
                            p.opts.append(s)
                            owner[s] = p
                    if program == "serve" and o.env and isinstance(p, click.Option) and p.envvar is None:
                        p.envvar = o.env
                if (pos and two_way) or (neg and not pos):  # a --no- flag of its own takes the others
                    for s in o.neg:
                        if s not in owner:
                            (p.secondary_opts if pos else p.opts).append(s)
                            owner[s] = p
            opt = _hidden_option(o, set(owner))  # spellings still unclaimed (--webui beside --no-webui)
            if opt is None:
                continue
            for s in [*opt.opts, *opt.secondary_opts]:
                owner[s] = opt
            ignored.append((o, opt))
        dests = {opt.name: o for o, opt in ignored}

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            for name, o in dests.items():
                value = kwargs.pop(name, None)
                if value is None:
                    continue
                if o.long == "--verbose":
                    logging.getLogger().setLevel(logging.INFO)
                line = notice(o, value)
                if line:
                    click.echo(line, err=True)
            return f(*args, **kwargs)

        wrapper.__click_params__ = params + [opt for _o, opt in ignored]
        return wrapper
    return deco
