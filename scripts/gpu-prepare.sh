#!/usr/bin/env bash
# Prepare .gpu/ (ignored by git): everything scripts/gpu-check.sh needs on a GPU
# machine that has no internet, no pyopencl, no kp and maybe no Vulkan loader.
# Run here (a machine that reaches PyPI and Debian's archive); the folder then
# travels with the working tree (about 10 MiB).
#
# Usage:  scripts/gpu-prepare.sh [DIR]      (default: .gpu)
#
# Fills:
#   DIR/wheels/  wheels for CPython $GPU_PY (default 3.12), manylinux x86_64:
#                pyopencl and its pytools, platformdirs, siphash24,
#                typing_extensions; gguf; pybind11 (>= 2.12), setuptools, wheel (kp build).
#                numpy, pytest, click, tabulate, huggingface_hub, pyyaml, tqdm,
#                requests and cmake are the GPU image's own.
#   DIR/debs/    Debian 12 .deb files, unpacked there with dpkg -x (never into /):
#                libvulkan1 (the loader), libvulkan-dev (Vulkan headers, the
#                headers kp is built against), libfmt9 + libfmt-dev, patch,
#                vulkan-validationlayers (the layer, for a validated run on the GPU).
#   DIR/src/     kp-0.9.0.tar.gz, the sdist scripts/install-kompute.sh patches.
#   DIR/shared/  the test data the GPU tests read (../shared does not travel):
#                models/stories260K.gguf, models/tiny/, reference/.
# Idempotent: files already there are kept.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
dir="${1:-$root/.gpu}"
gpu_py="${GPU_PY:-3.12}"
py="${PYTHON:-python3}"
shared="${COOKTOP_SHARED:-$root/../shared}"
say() { printf 'gpu-prepare: %s\n' "$*"; }
die() { printf 'gpu-prepare: ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$dir/wheels" "$dir/debs" "$dir/src" "$dir/shared/models/tiny" "$dir/shared/reference"

# ---- wheels for the GPU machine's Python (no deps resolved: the list is complete)
wheels=(pyopencl pytools platformdirs siphash24 typing_extensions gguf "pybind11>=2.12,<3" setuptools wheel
        jsonschema jsonschema-specifications referencing rpds-py)  # jsonschema: cooktop report's report.json check
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    plat+=(--platform "$p")
done
say "wheels for CPython $gpu_py: ${wheels[*]}"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$gpu_py" --implementation cp \
    "${plat[@]}" -d "$dir/wheels" "${wheels[@]}" 2>&1 | grep -v '^WARNING: Location' || true
for w in pyopencl pytools platformdirs siphash24 typing_extensions gguf pybind11 setuptools wheel \
         jsonschema jsonschema_specifications referencing rpds_py; do
    ls "$dir/wheels/$w"-*.whl >/dev/null 2>&1 || die "no wheel for $w in $dir/wheels"
done

# ---- Debian packages (downloaded, not installed)
debs=(libvulkan1 libvulkan-dev libfmt9 libfmt-dev patch vulkan-validationlayers)
missing=()
for d in "${debs[@]}"; do
    ls "$dir/debs/${d}_"*.deb >/dev/null 2>&1 || missing+=("$d")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "apt-get not found: put ${missing[*]} (.deb) into $dir/debs yourself"
    say "apt-get download ${missing[*]}"
    # _apt cannot write into a folder owned by another user: download in a temp dir
    tmp="$(mktemp -d)"; chmod 777 "$tmp"
    (cd "$tmp" && apt-get download "${missing[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    mv "$tmp"/*.deb "$dir/debs/" 2>/dev/null || true
    rm -rf "$tmp"
    for d in "${missing[@]}"; do
        ls "$dir/debs/${d}_"*.deb >/dev/null 2>&1 || die "apt-get download $d failed (apt-get update first?)"
    done
fi

# ---- the kp sdist (install-kompute.sh checks its sha256)
if [ ! -f "$dir/src/kp-0.9.0.tar.gz" ]; then
    say "kp 0.9.0 sdist"
    "$py" -m pip download -q --no-deps --no-binary :all: -d "$dir/src" "kp==0.9.0" 2>&1 | grep -v '^WARNING: Location' || true
fi
[ -f "$dir/src/kp-0.9.0.tar.gz" ] || die "could not download kp-0.9.0.tar.gz"

# ---- test data
if [ -d "$shared/models" ]; then
    cp -u "$shared/models/stories260K.gguf" "$dir/shared/models/"
    cp -u "$shared/models/tiny/"*.gguf "$dir/shared/models/tiny/"
    cp -u "$shared/reference/"* "$dir/shared/reference/"
else
    say "WARNING: no $shared/models: the GPU tests that need shared data will fail there"
fi

say "ready: $(du -sh "$dir" | cut -f1) in $dir ($(ls "$dir/wheels" | wc -l) wheels, $(ls "$dir/debs" | wc -l) debs)"
say "on the GPU machine: bash scripts/gpu-check.sh [RESULTS_DIR]   (device tool: carry .gpu)"
