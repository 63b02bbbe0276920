#!/usr/bin/env bash
# Build llama.cpp's own Vulkan backend (only the llama-bench tool) outside the
# repository, for a same-driver comparison: `cooktop bench --vs llama.cpp
# --llama-bench PATH --device vulkan` runs it back to back with cooktop.
#
# The llama.cpp is the one vendored in llama-cpp-python's sdist (the same
# source the `compare` extra builds), version LLAMACPP_PY_VERSION (default
# 0.3.8: it builds against Debian 12's Vulkan headers 1.3.239 and glslc 2023.2;
# newer llama.cpp wants newer headers).
#
# Usage:  scripts/build-llamacpp-vulkan.sh [DIR]     (default: ../llamacpp-vk)
# Prints the path of the built llama-bench as its last line.
#
# Environment:
#   LLAMACPP_PY_VERSION  llama-cpp-python version whose vendor/llama.cpp to build
#   LLAMACPP_SDIST       path of llama_cpp_python-VERSION.tar.gz (default: pip download)
#   PYTHON               python with pip, for the download (default: .venv/bin/python)
#   JOBS                 parallel build jobs (default: 2); the build runs under nice -n 10
#
# Needs (Debian/Ubuntu): cmake g++ libvulkan-dev glslc; a Vulkan driver to run
# (mesa-vulkan-drivers: lavapipe). Idempotent: an existing build is reused
# (cmake only rebuilds what changed). Shader generation takes ~20-40 minutes
# on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
dir="${1:-$root/../llamacpp-vk}"
version="${LLAMACPP_PY_VERSION:-0.3.8}"
py="${PYTHON:-$root/.venv/bin/python}"
jobs="${JOBS:-2}"

say() { printf 'build-llamacpp-vulkan: %s\n' "$*" >&2; }
die() { printf 'build-llamacpp-vulkan: ERROR: %s\n' "$*" >&2; exit 1; }

for tool in cmake glslc c++; do
    command -v "$tool" >/dev/null || die "missing $tool (apt-get install cmake glslc g++ libvulkan-dev)"
done
[ -f /usr/include/vulkan/vulkan.h ] || die "missing Vulkan headers (apt-get install libvulkan-dev)"

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
    sdist="${LLAMACPP_SDIST:-}"
    if [ -z "$sdist" ]; then
        mkdir -p "$dir/dl"
        sdist="$dir/dl/llama_cpp_python-$version.tar.gz"
        if [ ! -f "$sdist" ]; then
            [ -x "$py" ] || py=python3
            say "downloading llama-cpp-python==$version (sdist)"
            "$py" -m pip download --no-binary :all: --no-deps -d "$dir/dl" \
                "llama-cpp-python==$version" >&2
        fi
    fi
    [ -f "$sdist" ] || die "no sdist at $sdist"
    say "unpacking $sdist"
    tar -xzf "$sdist" -C "$dir"
    [ -f "$src/CMakeLists.txt" ] || die "no vendor/llama.cpp in $sdist"
fi

build="$src/build-vulkan"
say "configuring $build"
nice -n 10 cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_VULKAN=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF >&2
say "building llama-bench with $jobs jobs (slow: Vulkan shader generation)"
nice -n 10 cmake --build "$build" --target llama-bench -j "$jobs" >&2
bench="$build/bin/llama-bench"
[ -x "$bench" ] || die "build finished without $bench"
say "built $bench"
echo "$bench"
