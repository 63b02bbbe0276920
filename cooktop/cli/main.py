"""The ``cooktop`` command: a click group whose subcommands live in sibling modules.

Every :class:`~cooktop.errors.CooktopError` ends the command with
``error: <message>`` on stderr and exit code 1 (no traceback).
"""

from __future__ import annotations

import logging
import sys

import click

from .. import __version__
from ..errors import CooktopError


class CooktopGroup(click.Group):
    """Maps cooktop's typed errors to a one-line message and exit code 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CooktopError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(0)


@click.group(cls=CooktopGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cooktop")
@click.option("-v", "--verbose", is_flag=True, help="Log placement and device details to stderr.")
def cli(verbose: bool) -> None:
    """cooktop: run GGUF language models on any device (OpenCL, Vulkan, numpy)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="cooktop: %(message)s", stream=sys.stderr)


def _register() -> None:
    from . import info, run  # noqa: F401  (each module adds its command to `cli`)
    for name in ("devices", "plan", "bench", "synth"):
        try:
            __import__(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise


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
