#!/usr/bin/env bash
# Build Kompute's kp 0.9.0 with cooktop's patch into a virtual environment (offline).
# The build ships inside the package (cooktop/tools/kompute/install-kompute.sh, also run by
# `cooktop setup-vulkan`); this wrapper keeps the clone's command and its default venv.
#
# Usage:  scripts/install-kompute.sh [PYTHON]     (default: .venv/bin/python)
# Environment: KP_SDIST, KP_WHEELS, KP_PREFIX, KP_FORCE, KP_VERBOSE (see the packaged script).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
exec bash "$root/cooktop/tools/kompute/install-kompute.sh" "${1:-$root/.venv/bin/python}"
