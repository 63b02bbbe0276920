#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests of the llama.cpp vendored in llama-cpp-python's
# sdist) against `cooktop serve`, offline, and, with LLAMA_SERVER=PATH (e.g. from `make llamacpp-cpu`),
# against that llama-server in the same run, then the comparison: both pass counts and, by file, the
# cases llama-server passes and cooktop fails.
#
# Usage: scripts/llama_server_suite/run.sh [PYTEST ARGS...]      (make test-llama-server-suite)
# Environment:
#   LLAMACPP_PY_VERSION  the sdist (default 0.3.36); SUITE_DIR  work folder (default /tmp/llama-server-suite)
#   LLAMA_SERVER         a llama-server binary for the baseline run (default: none; /tmp/llama-build/bin/
#                        llama-server when it exists); SUITE_JOBS  pytest-xdist workers (default 2)
#   COOKTOP_SHARED       the shared data folder (stories260K.gguf)
# Offline: the suite's models come from a Hugging Face cache made here with the one model this machine
# has (ggml-org/test-model-stories260K -> shared/models/stories260K.gguf); the suite's download step
# (ServerPreset.load_all) is turned off by plugin.py, so the presets of other models (bert-bge-small,
# stories15M_MOE, jina-reranker, tinygemma3, the infill model, the router's) fail to start on both servers.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
version="${LLAMACPP_PY_VERSION:-0.3.36}"
work="${SUITE_DIR:-/tmp/llama-server-suite}"
jobs="${SUITE_JOBS:-2}"
shared="${COOKTOP_SHARED:-$root/../shared}"
say() { printf 'llama-server-suite: %s\n' "$*" >&2; }
die() { printf 'llama-server-suite: ERROR: %s\n' "$*" >&2; exit 1; }

[ -x "$root/.venv/bin/cooktop" ] || die "no $root/.venv/bin/cooktop: run 'make setup' first"
model="$shared/models/stories260K.gguf"
[ -f "$model" ] || die "no $model (COOKTOP_SHARED)"
vendor="llama_cpp_python-$version/vendor/llama.cpp"
src="$work/$vendor/tools/server/tests"
if [ ! -f "$src/utils.py" ] || [ ! -d "$work/$vendor/models/templates" ]; then
    mkdir -p "$work"
    if [ ! -f "$work/llama_cpp_python-$version.tar.gz" ]; then
        say "downloading llama-cpp-python==$version (sdist)"
        "$root/.venv/bin/python" -m pip download -q --no-binary :all: --no-deps -d "$work" "llama-cpp-python==$version"
    fi
    # the suite, and the chat templates its template tests read (../../../models/templates)
    tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work" "$vendor/tools/server" "$vendor/models/templates"
fi
venv="$work/venv"
if [ ! -x "$venv/bin/pytest" ]; then
    say "the suite's own venv (its requirements.txt, numpy unpinned)"
    python3 -m venv "$venv"
    grep -v '^numpy' "$src/requirements.txt" > "$work/requirements.txt"
    "$venv/bin/pip" install -q -r "$work/requirements.txt" numpy
fi
# the Hugging Face cache of the one model (a snapshot linking to the shared file)
hub="$work/hub"
snap="$hub/models--ggml-org--test-model-stories260K/snapshots/0000000000000000000000000000000000000000"
mkdir -p "$snap" "$hub/models--ggml-org--test-model-stories260K/refs"
ln -sf "$model" "$snap/stories260K-F32.gguf"  # tagged, so router mode lists it as :F32
printf '0000000000000000000000000000000000000000' > "$hub/models--ggml-org--test-model-stories260K/refs/main"
shim="$work/bin/cooktop-llama-server"
mkdir -p "$work/bin"
printf '#!/bin/sh\nexec %q serve "$@"\n' "$root/.venv/bin/cooktop" > "$shim"
chmod +x "$shim"

run_suite() {  # NAME BINARY [PYTEST ARGS]
    local name="$1" bin="$2"; shift 2
    say "$name: pytest -n $jobs unit/ against $bin"
    (cd "$src" && LLAMA_SERVER_BIN_PATH="$bin" LLAMA_CACHE="$hub" HF_HUB_CACHE="$hub" HF_HUB_OFFLINE=1 \
        PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -p plugin -q -n "$jobs" \
        -o addopts="" --junitxml="$work/$name.xml" "$@" > "$work/$name.log" 2>&1) || true
    tail -n 1 "$work/$name.log" >&2
}
base="${LLAMA_SERVER:-}"
[ -z "$base" ] && [ -x /tmp/llama-build/bin/llama-server ] && base=/tmp/llama-build/bin/llama-server
[ $# -gt 0 ] || set -- unit/
run_suite cooktop "$shim" "$@"
reports=("$work/cooktop.xml")
if [ -n "$base" ]; then
    run_suite llama-server "$base" "$@"
    reports+=("$work/llama-server.xml")
fi
"$root/.venv/bin/python" "$here/compare.py" "${reports[@]}"
