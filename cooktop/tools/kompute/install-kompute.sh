#!/usr/bin/env bash
# Install Kompute's Python bindings (kp 0.9.0) with cooktop's patch into a
# virtual environment, offline.
#
# kp ships only as an sdist whose CMake build downloads its dependencies; this
# unpacks the sdist, applies kp-0.9.0-cooktop.patch (beside this script: memory
# barriers for Python, buffer usage flags, device features, numpy 2: see the
# patch's header) and builds it with kompute-offline.cmake (beside it too), which
# uses installed Vulkan headers, fmt and pybind11 (>= 2.12, from PyPI) instead.
# It ships inside the cooktop package (cooktop/tools/kompute/): `cooktop setup-vulkan`
# runs it for the Python running cooktop; scripts/install-kompute.sh in a clone too.
#
# Usage:  install-kompute.sh PYTHON     (scripts/install-kompute.sh: default .venv/bin/python)
#
# Environment:
#   KP_SDIST    path of kp-0.9.0.tar.gz (default: pip download from PyPI)
#   KP_WHEELS   folder of wheels (pybind11, setuptools, wheel): pip uses only it
#   KP_PREFIX   folder with unpacked .deb files (usr/include/vulkan, fmt,
#               usr/lib/<triplet>/libvulkan.so): headers without apt, as on the
#               GPU machine (scripts/gpu-check.sh)
#   KP_FORCE=1  rebuild even when the installed kp has the patch
#   KP_VERBOSE=1  show the CMake build (pip -v)
#
# Needs (Debian/Ubuntu): cmake g++ libvulkan-dev libfmt-dev, patch (or git),
# and a Vulkan driver to run (mesa-vulkan-drivers gives lavapipe on the CPU).
# Idempotent: does nothing when PYTHON imports a kp with this patch level; a
# kp without it (an older setup's venv) is rebuilt.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${1:-$(command -v python3 || true)}"
patch_file="$here/kp-0.9.0-cooktop.patch"
patch_level=3   # python/src/main.cpp of the patch: m.attr("cooktop_patch")
sdist_sha256=98e583dc6e9731ff6d7a3e3317817e4d93f7b2945929619e29a56325db279949

say() { printf 'install-kompute: %s\n' "$*"; }
die() { printf 'install-kompute: ERROR: %s\n' "$*" >&2; exit 1; }

[ -x "$py" ] || die "no python at $py (pass the venv's python as the first argument)"
[ -f "$patch_file" ] || die "missing $patch_file"

have=$("$py" -c 'import kp; print(getattr(kp, "cooktop_patch", 0))' 2>/dev/null || echo none)
if [ "$have" = none ]; then
    say "kp not importable by $py; building it"
elif [ "$have" -ge "$patch_level" ] 2>/dev/null && [ "${KP_FORCE:-0}" != 1 ]; then
    say "kp with cooktop patch level $have already importable by $py; nothing to do"
    exit 0
else
    say "kp in $py has cooktop patch level $have, this script carries $patch_level: rebuilding"
fi

for tool in cmake; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install cmake, or pip install cmake)"
done
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (apt-get install g++)"
inc_dirs=(/usr/include)
[ -n "${KP_PREFIX:-}" ] && inc_dirs=("$KP_PREFIX/usr/include" "${inc_dirs[@]}")
for hdr in vulkan/vulkan.hpp fmt/format.h; do
    found=0
    for d in "${inc_dirs[@]}"; do [ -e "$d/$hdr" ] && found=1; done
    [ $found = 1 ] || die "$hdr not found in ${inc_dirs[*]} (apt-get install libvulkan-dev libfmt-dev)"
done

pip_src=()
[ -n "${KP_WHEELS:-}" ] && pip_src=(--no-index --find-links "$KP_WHEELS")
# build requirements: pybind11 >= 2.12 (numpy 2 support), setuptools, wheel
if ! "$py" -c 'import sys, pybind11, setuptools, wheel
v = tuple(int(x) for x in pybind11.__version__.split(".")[:2])
sys.exit(v < (2, 12))' >/dev/null 2>&1; then
    say "installing build requirements: pybind11>=2.12 setuptools wheel"
    "$py" -m pip install -q "${pip_src[@]}" "pybind11>=2.12,<3" setuptools wheel
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/kp-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
sdist="${KP_SDIST:-}"
if [ -z "$sdist" ]; then
    "$py" -m pip download -q --no-deps --no-binary :all: -d "$work" "kp==0.9.0" \
        || die "could not download the kp 0.9.0 sdist (set KP_SDIST to a local kp-0.9.0.tar.gz)"
    sdist="$work/kp-0.9.0.tar.gz"
fi
[ -f "$sdist" ] || die "no sdist at $sdist"
echo "$sdist_sha256  $sdist" | sha256sum -c --quiet - || die "$sdist is not the kp 0.9.0 sdist (sha256 differs)"
tar -xzf "$sdist" -C "$work"
src="$work/kp-0.9.0"
if command -v patch >/dev/null; then
    patch -s -p1 -d "$src" < "$patch_file" || die "the patch does not apply"
elif command -v git >/dev/null; then
    git -C "$src" apply -p1 "$patch_file" || die "the patch does not apply"
else
    die "neither patch nor git found to apply $patch_file"
fi

export KP_PYTHON="$py"
export KP_PYBIND11_DIR="$("$py" -m pybind11 --cmakedir)"
export CMAKE_TOOLCHAIN_FILE="$here/kompute-offline.cmake"
[ -n "${KP_PREFIX:-}" ] && export KP_PREFIX
say "building patched kp 0.9.0 (about 1-6 minutes on 2 cores)"
# --no-deps: numpy is the project's business, not kp's
verbosity=(-q)
[ "${KP_VERBOSE:-0}" = 1 ] && verbosity=(-v)
"$py" -m pip install "${verbosity[@]}" --no-build-isolation --no-deps --force-reinstall --no-cache-dir "$src"
"$py" - "$patch_level" <<'PY'
import sys
import kp
level = getattr(kp, "cooktop_patch", 0)
if level < int(sys.argv[1]):
    sys.exit(f"install-kompute: ERROR: the installed kp has patch level {level}")
try:
    m = kp.Manager()
    name = m.get_device_properties()["device_name"]
    feats = ", ".join(m.enabled_features()) or "none"
    m.destroy()
    print(f"install-kompute: kp 0.9.0 + cooktop patch {level} (pybind11 {kp.pybind11_version}) on {name}; "
          f"features enabled: {feats}")
except Exception as e:  # no driver here is not a build failure
    print(f"install-kompute: kp 0.9.0 + cooktop patch {level} built; no Vulkan device to try it on: {e}")
PY
