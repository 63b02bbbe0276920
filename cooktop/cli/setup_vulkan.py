"""``cooktop setup-vulkan``: build the Vulkan backend's ``kp`` (Kompute 0.9.0 with cooktop's patch)."""

from __future__ import annotations

import sys

import click

from ..tools import kompute
from .group import cli


@cli.command("setup-vulkan")
@click.option("--python", "python", default=None, type=click.Path(),
              help="Python (virtual environment) to build kp for (default: the one running cooktop).")
def setup_vulkan_cmd(python: str | None) -> None:
    """Build kp 0.9.0 with cooktop's patch for the Vulkan backend (1-6 minutes).

    Needs cmake, a C++ compiler, the Vulkan headers and fmt (Debian/Ubuntu: apt-get install
    cmake g++ libvulkan-dev libfmt-dev) and, to run, a Vulkan driver (mesa-vulkan-drivers
    gives lavapipe on the CPU). KP_SDIST, KP_WHEELS, KP_PREFIX, KP_FORCE=1, KP_VERBOSE=1
    as for scripts/install-kompute.sh. Does nothing when kp with the patch is already there.
    """
    sys.exit(kompute.build(python))
