#!/usr/bin/env bash
# Build llama-cpp-python's wheel (the `compare` extra's oracle) with libmtmd, into a
# folder whose name is a hash of the version and the build flags, and print the wheel's path.
#
# pip's own wheel cache keys a built wheel by the sdist alone, not by CMAKE_ARGS, so a
# machine that once built llama-cpp-python without mtmd (-DLLAVA_BUILD=OFF) would reuse
# that wheel silently; here the flags are part of the folder name, and a wheel found there
# is reused (seconds) only when it was built with exactly these flags.
#
# Usage:  scripts/build-llama-cpp-python.sh PYTHON
#         (stdout: the wheel's path, last line; progress on stderr)
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  default 0.3.36
#   CMAKE_ARGS                the build flags (setup.sh sets them; default: CPU only, mtmd on)
#   COOKTOP_WHEELS            wheel folder root (default ~/.cache/cooktop/wheels)
set -euo pipefail
py="${1:?usage: build-llama-cpp-python.sh PYTHON}"
ver="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
args="${CMAKE_ARGS:--DGGML_BLAS=OFF -DLLAVA_BUILD=ON}"
wheels="${COOKTOP_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/cooktop/wheels}"
key="$(printf 'llama-cpp-python==%s\n%s\n' "$ver" "$args" | sha256sum | cut -c1-16)"
dir="$wheels/llama-cpp-python-$ver-$key"
find_wheel() { ls "$dir"/llama_cpp_python-"$ver"-*.whl 2>/dev/null | head -n1; }
whl="$(find_wheel || true)"
if [ -n "$whl" ]; then
    printf 'build-llama-cpp-python: reusing %s (built with these flags)\n' "$whl" >&2
else
    mkdir -p "$dir"
    printf 'build-llama-cpp-python: building llama-cpp-python==%s with CMAKE_ARGS=%s into %s\n' \
        "$ver" "$args" "$dir" >&2
    tmp="$(mktemp -d "$dir/.build.XXXXXX")"
    # --no-cache-dir: never take pip's cached wheel (keyed without the flags).
    CMAKE_ARGS="$args" "$py" -m pip wheel -q --no-cache-dir --no-deps -w "$tmp" \
        "llama-cpp-python==$ver" >&2
    mv "$tmp"/llama_cpp_python-"$ver"-*.whl "$dir"/
    rm -rf "$tmp"
    printf '%s\n' "$args" > "$dir/CMAKE_ARGS"
    whl="$(find_wheel)"
fi
printf '%s\n' "$whl"
