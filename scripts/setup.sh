#!/usr/bin/env bash
# Set up cooktop on a Debian/Ubuntu machine; `make setup` runs this.
#
# Steps (each skipped when already done, so a second run takes seconds):
#   1. system packages (apt-get, as root or through sudo), checked with dpkg first;
#      `apt-get update` runs only when something is missing;
#   2. the virtual environment .venv (Python >= 3.10, from $PYTHON, default python3);
#   3. the project, editable, with extras opencl,server,dev,bench,quality;
#   4. Kompute's `kp` 0.9.0 with cooktop's patch, built offline by scripts/install-kompute.sh
#      (a kp without the patch, from an older setup, is rebuilt), then the optional extras
#      named in $COOKTOP_EXTRAS;
#   5. the default model (stories260K.gguf) seeded into the Hugging Face cache
#      from ../shared/models when that folder exists, so `cooktop run` works offline.
#
# Environment:
#   PYTHON           interpreter used to create the venv (default python3)
#   COOKTOP_VENV     venv folder (default <repo>/.venv)
#   COOKTOP_EXTRAS   more extras, comma list (e.g. compare: llama-cpp-python with libmtmd, which
#                    builds llama.cpp: 10-26 min on 2 busy cores, once per set of build flags
#                    (scripts/build-llama-cpp-python.sh keeps the wheel in ~/.cache/cooktop/wheels);
#                    ray: Ray + Ray Serve for cooktop.cluster, an ~80 MB wheel)
#   COOKTOP_SHARED   shared data folder (default <repo>/../shared)
#   COOKTOP_REQUIRE  comma list (as in tests/conftest.py): a failed step that provides
#                    a named resource (opencl, vulkan, glslc, shared, vulkan_validation,
#                    llama_cpp for the compare extra, ray for the ray extra) makes setup fail;
#                    otherwise setup warns and goes
#                    on, since the numpy backend works without any of them.
#   COOKTOP_SETUP_STRICT=1  every failed step is fatal.
set -euo pipefail

t0=$(date +%s)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${COOKTOP_VENV:-$root/.venv}"
py_sys="${PYTHON:-python3}"
shared="${COOKTOP_SHARED:-$root/../shared}"
base_extras="opencl,server,dev,bench,quality"
more_extras="${COOKTOP_EXTRAS:-}"
more_extras="${more_extras// /}"
problems=()

say() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }

# is_required RESOURCE: true when COOKTOP_REQUIRE names it or strict mode is on.
is_required() {
    [ "${COOKTOP_SETUP_STRICT:-0}" = 1 ] && return 0
    case ",${COOKTOP_REQUIRE:-}," in *",$1,"*) return 0 ;; esac
    return 1
}

# failed RESOURCE MESSAGE: fatal when the resource is required, else a warning.
failed() {
    if is_required "$1"; then
        printf 'setup: ERROR: %s (required by COOKTOP_REQUIRE=%s)\n' "$2" "${COOKTOP_REQUIRE:-}" >&2
        exit 1
    fi
    warn "$2"
    problems+=("$1")
}

# ---------------------------------------------------------------- 1. system packages
# Debian 12 / Ubuntu names. Runtime: PoCL (OpenCL on the CPU) and Mesa lavapipe
# (Vulkan on the CPU); build: compilers, cmake and the headers kp is built against;
# test: the Khronos validation layer (make test-vulkan-validation; kp is built so
# that it never loads the layer by itself), Oclgrind (the simulated GPU of
# make test-opencl-validation; it does not register itself in /etc/OpenCL/vendors) and
# chromium + chromium-driver (the web page's browser test, tests/test_webui.py).
apt_pkgs=(
    python3-dev build-essential cmake patch
    pocl-opencl-icd ocl-icd-libopencl1 clinfo
    mesa-vulkan-drivers libvulkan1 libvulkan-dev vulkan-tools glslc vulkan-validationlayers
    libfmt-dev oclgrind
    iproute2 util-linux
    chromium chromium-driver
)
if ! command -v "$py_sys" >/dev/null 2>&1; then
    apt_pkgs+=(python3 python3-venv)
elif ! "$py_sys" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    apt_pkgs+=(python3-venv)   # Debian's python3 lacks ensurepip without it
fi

pkg_installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

if command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    missing=()
    for p in "${apt_pkgs[@]}"; do
        pkg_installed "$p" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "system packages: all ${#apt_pkgs[@]} installed"
    else
        sudo_cmd=()
        can_install=1
        if [ "$(id -u)" -ne 0 ]; then
            if command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
                sudo_cmd=(sudo)
            else
                can_install=0
            fi
        fi
        if [ $can_install = 1 ]; then
            say "installing system packages: ${missing[*]}"
            export DEBIAN_FRONTEND=noninteractive
            if "${sudo_cmd[@]}" apt-get update -qq \
                && "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
                    apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
                say "system packages installed"
            else
                warn "apt-get could not install: ${missing[*]}"
                problems+=(apt)
            fi
        else
            warn "not root and no usable sudo; install these as root, then rerun:"
            warn "  apt-get install ${missing[*]}"
            problems+=(apt)
        fi
    fi
else
    warn "no apt-get/dpkg here; install the equivalents of: ${apt_pkgs[*]}"
    warn "(OpenCL: an ICD loader + PoCL or a GPU driver; Vulkan: loader, driver, headers, glslc; fmt, pybind11, cmake, a C++ compiler)"
    problems+=(apt)
fi

# ---------------------------------------------------------------- 2. the venv
if ! command -v "$py_sys" >/dev/null 2>&1; then
    echo "setup: ERROR: no $py_sys found; install Python >= 3.10 (apt-get install python3 python3-venv) or set PYTHON" >&2
    exit 1
fi
if ! "$py_sys" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "setup: ERROR: $py_sys is Python $("$py_sys" -c 'import platform; print(platform.python_version())'); cooktop needs >= 3.10 (set PYTHON=python3.11)" >&2
    exit 1
fi
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c 'import sys, pip; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
    say "venv: $venv ($("$py" -c 'import platform; print(platform.python_version())'))"
else
    if [ -e "$venv" ]; then
        warn "$venv is broken or too old; recreating it"
        rm -rf "$venv"
    fi
    say "creating venv $venv with $py_sys"
    "$py_sys" -m venv "$venv"
    "$py" -m pip install -q --upgrade pip setuptools wheel
fi

# ---------------------------------------------------------------- 3. the project
# A stamp (hash of pyproject.toml + extras) makes the second run skip pip entirely.
stamp_of() {
    { cat "$root/pyproject.toml"; echo "extras=$1"; "$py" -c 'import sys; print(sys.version)'; } \
        | sha256sum | cut -d' ' -f1
}
base_stamp_file="$venv/.cooktop-setup-base"
base_stamp="$(stamp_of "$base_extras")"
if [ "$(cat "$base_stamp_file" 2>/dev/null)" = "$base_stamp" ] && "$py" -c 'import cooktop' >/dev/null 2>&1; then
    say "project: installed (pyproject.toml unchanged)"
else
    say "installing cooktop (editable) with extras [$base_extras]"
    "$py" -m pip install -q -e "$root[$base_extras]"
    echo "$base_stamp" > "$base_stamp_file"
fi
# numpy < 2 is the tested stack here (kp with cooktop's patch, built with pybind11 >= 2.12,
# also runs under numpy 2: scripts/gpu-check.sh uses the GPU machine's numpy 2).
if ! "$py" -c 'import numpy, sys; sys.exit(int(numpy.__version__.split(".")[0]) >= 2)'; then
    say "numpy >= 2 found; installing numpy<2"
    "$py" -m pip install -q "numpy<2"
fi

# ---------------------------------------------------------------- 4. Kompute (kp)
if [ -f "$here/install-kompute.sh" ]; then
    if ! bash "$here/install-kompute.sh" "$py"; then
        failed vulkan "kp (Kompute 0.9.0) did not build/install; the Vulkan backend is off (see the output above)"
    fi
else
    failed vulkan "scripts/install-kompute.sh is missing; kp (Vulkan backend) not installed"
fi

# ---------------------------------------------------------------- checks
if ! "$py" -c 'import pyopencl' >/dev/null 2>&1; then
    failed opencl "pyopencl does not import"
elif ! "$py" -c 'import pyopencl as cl, sys; sys.exit(not cl.get_platforms())' >/dev/null 2>&1; then
    failed opencl "pyopencl finds no OpenCL platform (install pocl-opencl-icd or a GPU driver)"
fi
if ! command -v glslc >/dev/null 2>&1; then
    failed glslc "glslc (GLSL -> SPIR-V compiler) not found (apt-get install glslc)"
fi
if ! "$py" -c 'import sys; sys.path.insert(0, sys.argv[1])
from cooktop.backends.vulkan.info import instance_layers
sys.exit("VK_LAYER_KHRONOS_validation" not in instance_layers())' "$root" >/dev/null 2>&1; then
    failed vulkan_validation "the Vulkan loader finds no VK_LAYER_KHRONOS_validation (apt-get install vulkan-validationlayers)"
fi
if ! "$py" -c 'import sys; sys.path.insert(0, sys.argv[1] + "/tests")
from opencl_validation import find_icd_library
sys.exit(find_icd_library() is None)' "$root" >/dev/null 2>&1; then
    failed oclgrind "Oclgrind's OpenCL runtime not found (apt-get install oclgrind)"
fi

# ---------------------------------------------------------------- 4b. optional extras
# ggml_isa_flags: llama.cpp CPU ISA options for this CPU, GGML_NATIVE and AMX off.
ggml_isa_flags() {
    local flags out="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    local pair
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
                avx512_vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
        case "$flags" in *" ${pair%%:*} "*) out+=" -DGGML_${pair##*:}=ON" ;; *) out+=" -DGGML_${pair##*:}=OFF" ;; esac
    done
    printf '%s' "$out"
}

# After kp: the extras (COOKTOP_EXTRAS) are optional, the backends are not.
if [ -n "$more_extras" ]; then
    extra_stamp_file="$venv/.cooktop-setup-extras"
    extra_stamp="$(stamp_of "$base_extras,$more_extras")"
    if [ "$(cat "$extra_stamp_file" 2>/dev/null)" = "$extra_stamp" ]; then
        say "extras [$more_extras]: installed"
    else
        extras_ok=1
        case ",$more_extras," in
            *,compare,*)
                # llama-cpp-python builds llama.cpp from its sdist: CPU only, no
                # downloads (curl, OpenSSL, tools off), libmtmd on (LLAVA_BUILD: the
                # image oracle, llama_cpp.mtmd_cpp).
                # Not -march=native: some VMs report AMX but trap its instructions
                # (SIGILL on any quantized model), so the ISA flags come from
                # /proc/cpuinfo with AMX always off.
                export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_OPENCL=OFF -DGGML_METAL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAVA_BUILD=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON $(ggml_isa_flags)}"
                export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
                # The wheel lives in a folder keyed by these flags (pip's cache keys it by
                # the sdist alone and would hand back an old build without mtmd). Installed
                # over any other build (--force-reinstall, no deps), then again for its
                # dependencies (diskcache, jinja2, ...), which a fresh venv lacks.
                say "extra compare builds llama.cpp from source unless a wheel built with these flags is cached (10+ min on 2 cores)"
                t_x=$(date +%s)
                if llama_whl="$(bash "$here/build-llama-cpp-python.sh" "$py" | tail -n1)" \
                    && "$py" -m pip install -q --no-deps --force-reinstall "$llama_whl" \
                    && "$py" -m pip install -q "$llama_whl" "numpy<2" \
                    && "$py" -c 'import llama_cpp.mtmd_cpp' >/dev/null 2>&1; then
                    say "llama-cpp-python with libmtmd installed from $llama_whl in $(( $(date +%s) - t_x )) s"
                else
                    extras_ok=0
                    failed llama_cpp "llama-cpp-python with libmtmd did not build/install (import llama_cpp.mtmd_cpp fails)"
                fi
                ;;
        esac
        say "installing extras [$more_extras]"
        t_x=$(date +%s)
        if "$py" -m pip install -q -e "$root[$base_extras,$more_extras]" "numpy<2"; then
            [ $extras_ok = 1 ] && echo "$extra_stamp" > "$extra_stamp_file"
            say "extras [$more_extras] installed in $(( $(date +%s) - t_x )) s"
        else
            for x in ${more_extras//,/ }; do
                # the resource the tests name for an extra (tests/test_bench.py: llama_cpp)
                [ "$x" = compare ] && x=llama_cpp
                failed "$x" "pip could not install extra(s) [$more_extras]"
            done
        fi
    fi
fi

# ---------------------------------------------------------------- 5. default model
model="$shared/models/stories260K.gguf"
if [ -f "$model" ]; then
    if "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("cooktop.tools.hub") is None)' >/dev/null 2>&1; then
        if "$py" -m cooktop.tools.hub --seed "$model"; then
            say "default model seeded into the Hugging Face cache from $model"
        else
            failed shared "could not seed the Hugging Face cache from $model"
        fi
    else
        failed shared "cooktop.tools.hub is missing; the Hugging Face cache was not seeded"
    fi
else
    say "no $model; the default model comes from the Hugging Face Hub on first use (needs network)"
fi

dt=$(( $(date +%s) - t0 ))
if [ ${#problems[@]} -eq 0 ]; then
    say "done in ${dt} s; venv: $venv"
else
    say "done in ${dt} s with problems: ${problems[*]} (the numpy backend works regardless)"
fi
