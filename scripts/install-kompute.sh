#!/usr/bin/env bash
# Install Kompute's Python bindings (kp==0.9.0) into a virtual environment,
# offline: kp ships only as an sdist whose CMake build downloads its
# dependencies, so this points CMake at scripts/kompute-offline.cmake, which
# uses the system's Vulkan headers, fmt and pybind11 instead.
#
# Usage:  scripts/install-kompute.sh [PYTHON]     (default: .venv/bin/python)
#
# Needs (Debian/Ubuntu): cmake g++ libvulkan-dev libfmt-dev pybind11-dev and a
# Vulkan driver to run (mesa-vulkan-drivers gives lavapipe on the CPU).
# Idempotent: does nothing when `import kp` already works in PYTHON.
# kp 0.9.0 needs numpy < 2 (it silently corrupts tensors under numpy 2).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${1:-$root/.venv/bin/python}"
if [ ! -x "$py" ]; then
    echo "install-kompute: no python at $py (pass the venv's python as the first argument)" >&2
    exit 1
fi
if "$py" -c "import kp" >/dev/null 2>&1; then
    echo "install-kompute: kp already importable by $py; nothing to do"
    exit 0
fi
for tool in cmake g++; do
    command -v "$tool" >/dev/null || { echo "install-kompute: $tool not found (apt-get install cmake g++)" >&2; exit 1; }
done
for hdr in /usr/include/vulkan/vulkan.h /usr/include/fmt/format.h /usr/include/pybind11/pybind11.h; do
    [ -e "$hdr" ] || { echo "install-kompute: $hdr missing (apt-get install libvulkan-dev libfmt-dev pybind11-dev)" >&2; exit 1; }
done
export KP_PYTHON="$py"
export CMAKE_TOOLCHAIN_FILE="$here/kompute-offline.cmake"
# pip's default build isolation works too; --no-build-isolation only when the
# venv already has setuptools and wheel (faster: no download of build deps).
if "$py" -c "import setuptools, wheel" >/dev/null 2>&1; then
    iso=(--no-build-isolation)
else
    iso=()
fi
"$py" -m pip install "${iso[@]}" "numpy<2" "kp==0.9.0"
"$py" -c "import kp; print('install-kompute: kp', getattr(kp, '__version__', '0.9.0'), 'on', kp.Manager().get_device_properties()['device_name'])"
