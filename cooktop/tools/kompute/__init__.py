"""The Kompute (``kp`` 0.9.0) build with cooktop's patch, shipped inside the package.

``install-kompute.sh`` (beside this module, with ``kp-0.9.0-cooktop.patch`` and
``kompute-offline.cmake``) downloads the kp sdist, checks its sha256, applies the patch
and builds it offline against the system's Vulkan headers and fmt; ``cooktop
setup-vulkan`` runs it for the running Python, ``scripts/install-kompute.sh`` in a clone.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

from ...errors import CooktopError

#: The build script, beside this module (package data).
SCRIPT = pathlib.Path(__file__).resolve().parent / "install-kompute.sh"


def build(python: str | None = None) -> int:
    """Run the kp build for ``python`` (default: the running interpreter); its output streams through.

    Returns:
        the script's exit code (0: kp with the patch is importable by ``python``).
    Raises:
        CooktopError: bash is missing, or the script is not in the installed package.
    """
    bash = shutil.which("bash")
    if bash is None:
        raise CooktopError("cooktop setup-vulkan needs bash (and cmake, g++, libvulkan-dev, libfmt-dev)")
    if not SCRIPT.is_file():
        raise CooktopError(f"{SCRIPT} is missing from this cooktop install; reinstall cooktop")
    return subprocess.call([bash, str(SCRIPT), python or sys.executable])
