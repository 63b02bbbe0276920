"""llama.cpp's LoRA options on ``run``, ``chat``, ``serve`` and ``perplexity`` (common/arg.cpp names).

``--lora FNAME`` (repeatable; comma-separated values load several) loads adapters at scale 1,
``--lora-scaled FNAME:SCALE`` (repeatable, comma-separated; the older two-value spelling
``--lora-scaled FNAME SCALE`` too) at their scale, ``--lora-init-without-apply`` (llama-server)
loads them all at scale 0, to be set later (``POST /lora-adapters``, a request's ``lora``).
Adapter ids follow llama.cpp's order: the ``--lora`` files, then the ``--lora-scaled`` ones.
The decorator hands the command one ``lora`` argument: ``[(path, scale), ...]``.
"""

from __future__ import annotations

import functools
import math

import click

from ..errors import CooktopError


def _scale(text: str, item: str) -> float:
    try:
        s = float(text)
    except ValueError:
        raise CooktopError(f"--lora-scaled {item!r}: the scale {text!r} is not a number "
                           "(format: FNAME:SCALE)") from None
    if not math.isfinite(s):
        raise CooktopError(f"--lora-scaled {item!r}: the scale must be a finite number")
    return s


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _ScaledOption(click.Option):
    """``--lora-scaled``: one ``FNAME:SCALE[,...]`` value, or two (``FNAME SCALE``, llama.cpp's older
    spelling) when the first has no ``:SCALE`` and the next argument is a number."""

    def add_to_parser(self, parser, ctx):
        super().add_to_parser(parser, ctx)
        for spelling in self.opts:
            opt = parser._long_opt.get(spelling) or parser._short_opt.get(spelling)
            if opt is None or getattr(opt, "_lora_wrapped", False):
                continue
            process = opt.process

            def take(value, state, process=process):
                last = value.split(",")[-1]
                if (":" not in last or not _is_number(last.rsplit(":", 1)[1])) and state.rargs and \
                        _is_number(state.rargs[0]):
                    value = f"{value}:{state.rargs.pop(0)}"
                process(value, state)

            opt.process = take
            opt._lora_wrapped = True


def parse_lora(lora: tuple[str, ...], scaled: tuple[str, ...], init_without_apply: bool) -> list[tuple[str, float]]:
    """``[(path, scale)]`` of ``--lora`` values (comma lists, scale 1), then ``--lora-scaled`` ones
    (``FNAME:SCALE`` comma lists); every scale 0 with ``init_without_apply``.

    Raises:
        CooktopError: a ``--lora-scaled`` item without ``:SCALE`` or with a scale that is no finite number.
    """
    out = [(p, 1.0) for v in lora for p in v.split(",") if p]
    for v in scaled:
        for item in v.split(","):
            if not item:
                continue
            if ":" not in item:
                raise CooktopError(f"--lora-scaled {item!r}: format FNAME:SCALE (or --lora-scaled FNAME SCALE)")
            path, s = item.rsplit(":", 1)
            out.append((path, _scale(s, item)))
    if init_without_apply:
        out = [(p, 0.0) for p, _ in out]
    return out


def lora_options(f):
    """Add the options of the module doc; the command gets ``lora=[(path, scale), ...]``."""
    command = f

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        kwargs["lora"] = parse_lora(kwargs.pop("lora_files"), kwargs.pop("lora_scaled"),
                                    kwargs.pop("lora_init_without_apply"))
        return command(*args, **kwargs)

    f = click.option("--lora-init-without-apply", "lora_init_without_apply", is_flag=True,
                     help="Load the LoRA adapters at scale 0 (set them later: POST /lora-adapters, a "
                          "request's lora field).")(wrapper)
    f = click.option("--lora-scaled", "lora_scaled", multiple=True, metavar="FNAME:SCALE", cls=_ScaledOption,
                     help="A LoRA adapter at a scale (FNAME:SCALE, comma list, or FNAME SCALE); repeatable.")(f)
    f = click.option("--lora", "lora_files", multiple=True, metavar="FNAME",
                     help="A LoRA adapter (GGUF) at scale 1; repeatable, or a comma list.")(f)
    return f
