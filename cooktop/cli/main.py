"""The ``cooktop`` console script: registers the command modules on the group (``group.py``) and runs it.

Usage errors and :class:`~cooktop.errors.CooktopError` end with ``error: <message>`` on one line, exit 1.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from .group import cli

#: Command modules, each adding its command to ``cli`` when imported.

COMMANDS = ("info", "run", "chat", "serve", "devices", "plan", "bench", "synth", "setup_vulkan", "quantize",
            "perplexity", "report", "tune")


def _register() -> None:
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}")


def _from_env(e: click.ClickException) -> str | None:
    """The environment variable a bad option value came from (``LLAMA_ARG_*``), or None when the
    value was given on the command line (click names the flag then)."""
    if not isinstance(e, click.BadParameter) or e.ctx is None or not isinstance(e.param, click.Option):
        return None
    if e.param.name is None or e.ctx.get_parameter_source(e.param.name) != click.core.ParameterSource.ENVIRONMENT:
        return None
    names = [e.param.envvar] if isinstance(e.param.envvar, str) else list(e.param.envvar or [])
    return next((str(n) for n in names if n and n in os.environ), None)


def main() -> None:
    """Console-script entry point.

    Usage errors (a bad option value, a missing file for ``-f``) end like every
    other bad input: ``error: <message>`` on one line and exit code 1.
    """
    _register()
    try:
        rc = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        hint = ""
        if isinstance(e, click.UsageError) and e.ctx is not None:
            hint = f" (see: {e.ctx.command_path} --help)"
        msg = e.format_message()
        var = _from_env(e)
        if var is not None:  # name the variable, not the flag it stands for
            assert isinstance(e, click.BadParameter) and e.param is not None
            msg = f"{var}={os.environ[var]!r} is no valid value of {e.param.opts[-1]}: {e.message}"
        click.echo(f"error: {msg}{hint}".replace("\n", " "), err=True)
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)
