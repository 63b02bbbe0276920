#!/usr/bin/env bash
# Build llama.cpp's CPU llama-server and llama-bench outside the repository, for the
# same-machine baselines: `cooktop bench --vs llama.cpp --llama-bench PATH` and
# `scripts/serve_concurrency.py --vs-llama-cpp --llama-server PATH`.
#
# The llama.cpp is the one vendored in llama-cpp-python's sdist, version
# LLAMACPP_PY_VERSION (default 0.3.36, the version the `compare` extra installs).
# CPU only, no network at build or run time: no OpenSSL (LLAMA_CURL is gone in
# this version), no prebuilt web UI download. -march=native, but AMX off: on
# this project's Xeon VM (amx_int8 in /proc/cpuinfo) llama-server segfaulted in
# ggml_backend_amx_mul_mat at its first matrix product on the 1.1B Q4_0 shape
# (`-nr`, no extra buffer types, avoided it but also drops the CPU repacking), so
# the binaries use ggml's AVX-512 VNNI repacked CPU kernels instead.
#
# Usage:  scripts/build-llamacpp-cpu.sh [BUILD_DIR]     (default: /tmp/llama-build)
# Prints the directory holding llama-server and llama-bench as its last line.
#
# Environment:
#   LLAMACPP_PY_VERSION  llama-cpp-python version whose vendor/llama.cpp to build (default 0.3.36)
#   LLAMACPP_SRC         an unpacked vendor/llama.cpp (default: unpacked next to BUILD_DIR from the sdist)
#   PYTHON               python with pip, for the sdist download (default: .venv/bin/python)
#   JOBS                 parallel build jobs (default: 2)
#
# Needs: cmake, ninja (or make), g++. ~10 minutes on 2 quiet cores (~30 when shared).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
build="${1:-/tmp/llama-build}"
version="${LLAMACPP_PY_VERSION:-0.3.36}"
py="${PYTHON:-$root/.venv/bin/python}"
jobs="${JOBS:-2}"

say() { printf 'build-llamacpp-cpu: %s\n' "$*" >&2; }
die() { printf 'build-llamacpp-cpu: ERROR: %s\n' "$*" >&2; exit 1; }

for tool in cmake c++; do
    command -v "$tool" >/dev/null || die "missing $tool (apt-get install cmake g++ ninja-build)"
done
src="${LLAMACPP_SRC:-}"
if [ -z "$src" ]; then
    dl="$build-src"
    src="$dl/llama_cpp_python-$version/vendor/llama.cpp"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        mkdir -p "$dl"
        [ -x "$py" ] || py=python3
        say "downloading llama-cpp-python==$version (sdist)"
        "$py" -m pip download --no-binary :all: --no-deps -d "$dl" "llama-cpp-python==$version" >&2
        tar -xzf "$dl/llama_cpp_python-$version.tar.gz" -C "$dl"
    fi
fi
[ -f "$src/CMakeLists.txt" ] || die "no llama.cpp source at $src"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
say "configuring $build from $src"
cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
say "building llama-server and llama-bench with $jobs jobs"
cmake --build "$build" --target llama-server llama-bench -j "$jobs" >&2
for b in llama-server llama-bench; do
    [ -x "$build/bin/$b" ] || die "build finished without $build/bin/$b"
done
say "built $build/bin/llama-server and $build/bin/llama-bench"
echo "$build/bin"
