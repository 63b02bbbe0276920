"""The ``cooktop`` click group every command module adds its command to.

Every :class:`~cooktop.errors.CooktopError` ends the command with
``error: <message>`` on stderr and exit code 1 (no traceback).
"""

from __future__ import annotations

import logging
import os
import sys

import click

from ..errors import CooktopError
from ..version import __version__


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


def normalize_token(token: str) -> str:
    """``--ctx_size`` -> ``--ctx-size``: llama.cpp reads ``_`` in a long option as ``-`` (click
    hands this the option name without its dashes; no cooktop or llama.cpp name has a ``_``)."""
    return token.replace("_", "-")


@click.group(cls=CooktopGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                 "token_normalize_func": normalize_token})
@click.version_option(__version__, prog_name="cooktop")
@click.option("-v", "--verbose", is_flag=True, help="Log placement and device details to stderr.")
@click.option("--no-tune", is_flag=True,
              help="Open devices with the default launch parameters, not `cooktop tune`'s (COOKTOP_NO_TUNE=1).")
def cli(verbose: bool, no_tune: bool) -> None:
    """cooktop: run GGUF language models on any device (OpenCL, Vulkan, numpy)."""
    if no_tune:  # read where devices open (backends/tune/cache.py), in this process and its children
        os.environ["COOKTOP_NO_TUNE"] = "1"
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="cooktop: %(message)s", stream=sys.stderr)
    check_settings()


def check_settings() -> None:
    """Refuse a malformed ``COOKTOP_*`` setting before any command runs (README's environment table).

    Raises:
        CooktopError: naming the variable and what it takes.
    """
    from ..backends.registry import disabled_families
    from ..runtime.budget import memory_overrides, reserve_fraction
    from ..settings import check_environment
    check_environment()
    disabled_families()
    memory_overrides()
    reserve_fraction()
