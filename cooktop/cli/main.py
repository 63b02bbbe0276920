"""The ``cooktop`` console script: registers the command modules on the group (``group.py``) and runs it.

Usage errors and :class:`~cooktop.errors.CooktopError` end with ``error: <message>`` on one line, exit 1.
"""

from __future__ import annotations

import importlib
import sys

import click

from .group import cli

#: Command modules, each adding its command to ``cli`` when imported.

COMMANDS = ("info", "run", "chat", "serve", "devices", "plan", "bench", "synth", "setup_vulkan", "quantize",
            "perplexity")


def _register() -> None:
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}")


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
        click.echo(f"error: {e.format_message()}{hint}".replace("\n", " "), err=True)
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)
