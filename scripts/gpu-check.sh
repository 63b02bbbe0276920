#!/usr/bin/env bash
# One command on a machine with a real GPU: build what is missing from what
# scripts/gpu-prepare.sh put into .gpu/, probe the devices, run the OpenCL and
# Vulkan parity and end-to-end tests on the GPU devices, run Vulkan tests under
# the validation layer, and bench the 1.1B Q4_0 shape with -p 512 -n 128
# (against llama.cpp when it is there). About 5-8 minutes; every step has a
# time limit and the whole run stops starting new steps after GPU_CHECK_BUDGET.
#
# Usage:  bash scripts/gpu-check.sh [RESULTS_DIR]
#         (default: $OUT when set, as on the lent GPU machine, else ./gpu-results)
#
# Planned for the lent GPU machine (NVIDIA H200): Python 3.12 with numpy 2, pytest,
# cmake and a C++ compiler of its own, no pyopencl, no kp, maybe no Vulkan
# loader, no internet. So:
#   - Debian .debs from .gpu/debs are unpacked (dpkg -x) under $GPU_WORK/prefix,
#     never into /: the Vulkan loader (used only when the system has none), the
#     Vulkan and fmt headers kp is built against, libfmt, patch, the validation layer;
#   - a venv with --system-site-packages gets the wheels of .gpu/wheels (pyopencl, gguf,
#     pybind11) and kp, built by scripts/install-kompute.sh from .gpu/src against
#     those headers (cooktop's patch; pybind11 >= 2.12, so numpy 2 is fine);
#   - NVIDIA's driver is found through ICD files: an existing Vulkan ICD JSON
#     (nvidia_icd.json under /usr/share, /etc, /usr/local/nvidia/share) or one
#     written for libGLX_nvidia.so.0, and an OpenCL .icd for libnvidia-opencl.so.1,
#     both put in $GPU_WORK/icd and named by VK_DRIVER_FILES / OCL_ICD_VENDORS.
#
# Results (8 files at most, the device tool's limit): summary.md (each step, its
# status and time), env.txt, steps.log (every step's output), devices.json
# (cooktop devices --json), tests.log, validation.log, bench.json, bench.md,
# report/report.json and report/index.html (cooktop report --full, last: it gets what is left
# of the budget; raise GPU_CHECK_BUDGET for all of it).
#
# Environment: GPU_DIR (default .gpu), GPU_WORK (default /tmp/cooktop-gpu),
# GPU_CHECK_BUDGET (seconds, default 450), GPU_CHECK_ROOT (prefix for the ICD
# search, for testing the search on a fake tree), GPU_CHECK_SKIP (comma list of
# tests,validation,bench,report: leave those steps out, e.g. to try the rest on a machine
# without a GPU), PYTHON (default python3).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"
res="${1:-${OUT:-$root/gpu-results}}"
gpu="${GPU_DIR:-$root/.gpu}"
work="${GPU_WORK:-/tmp/cooktop-gpu}"
budget="${GPU_CHECK_BUDGET:-450}"
fake="${GPU_CHECK_ROOT:-}"
py_sys="${PYTHON:-python3}"
t0=$(date +%s)
venv="$work/venv"
py="$venv/bin/python"
model="$work/tinyllama-1.1b-Q4_0.gguf"
export root res gpu work py_sys venv py model   # the step functions run in child shells
mkdir -p "$res" "$work"
: > "$res/steps.log"
printf '# cooktop gpu-check\n\n| step | status | seconds |\n| --- | --- | ---: |\n' > "$res/summary.md"
notes=()

elapsed() { echo $(( $(date +%s) - t0 )); }
note() { notes+=("$*"); printf '[%4ss] %s\n' "$(elapsed)" "$*" | tee -a "$res/steps.log"; }

# step NAME LIMIT CMD...: run CMD with at most LIMIT seconds (less when the budget is
# nearly spent), output appended to steps.log; records status in summary.md.
step() {
    local name=$1 limit=$2; shift 2
    case ",${GPU_CHECK_SKIP:-}," in
        *",$(echo "$name" | cut -d' ' -f1 | tr -d :),"*)
            printf '| %s | skipped (GPU_CHECK_SKIP) | 0 |\n' "$name" >> "$res/summary.md"; return 98 ;;
    esac
    local left=$(( budget - $(elapsed) ))
    if [ "$left" -lt 15 ]; then
        printf '| %s | skipped: time budget spent | 0 |\n' "$name" >> "$res/summary.md"
        note "$name: skipped (budget of ${budget}s spent)"
        return 99
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local s=$(date +%s)
    printf '\n===== %s (limit %ss) =====\n' "$name" "$limit" >> "$res/steps.log"
    if declare -F "$1" >/dev/null; then  # a shell function: timeout runs it in a child bash
        timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); $(printf '%q ' "$@")" >> "$res/steps.log" 2>&1
    else
        timeout --kill-after=10 "$limit" "$@" >> "$res/steps.log" 2>&1
    fi
    local rc=$?
    local status=ok
    [ $rc -eq 124 ] && status="timed out after ${limit}s"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && status="FAILED (exit $rc)"
    printf '| %s | %s | %s |\n' "$name" "$status" "$(( $(date +%s) - s ))" >> "$res/summary.md"
    printf '[%4ss] %s: %s\n' "$(elapsed)" "$name" "$status"
    return $rc
}

# ------------------------------------------------------------------ environment
{
    echo "date: $(date -u +%FT%TZ)"; uname -a
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    echo "python: $("$py_sys" -c 'import sys; print(sys.version)' 2>&1)"
    "$py_sys" -c 'import numpy; print("numpy", numpy.__version__)' 2>&1
    echo "cmake: $(cmake --version 2>/dev/null | head -1)"; echo "c++: $(c++ --version 2>/dev/null | head -1)"
    echo "ldconfig:"; ldconfig -p 2>/dev/null | grep -E 'libvulkan|libOpenCL|nvidia-opencl|GLX_nvidia|libcuda\.' | head -20
} > "$res/env.txt" 2>&1

if [ ! -d "$gpu/wheels" ] || [ ! -d "$gpu/debs" ]; then
    note "no $gpu/wheels or $gpu/debs: run scripts/gpu-prepare.sh on a machine with PyPI and Debian access, then carry .gpu"
    exit 1
fi

# ------------------------------------------------------------------ 1. unpack the .debs
unpack() {
    rm -rf "$work/prefix"; mkdir -p "$work/prefix"
    local f
    for f in "$gpu"/debs/*.deb; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$f" "$work/prefix"
        else  # ar + tar: a .deb is an ar archive holding data.tar.*
            (cd "$work/prefix" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x -f - -a 2>/dev/null \
                || ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -xJ)
        fi
    done
    ls "$work/prefix/usr/include/vulkan/vulkan.hpp" "$work/prefix/usr/include/fmt/format.h"
}
step "unpack .debs (Vulkan loader and headers, fmt, patch, validation layer)" 60 unpack
libdir="$work/prefix/usr/lib/x86_64-linux-gnu"
if ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
    note "Vulkan loader: the system's"
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libdir"   # libfmt for kp only
else
    note "Vulkan loader: none on the system; using the carried libvulkan1"
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
command -v patch >/dev/null || export PATH="$work/prefix/usr/bin:$PATH"
# the validation layer: its JSON names the library by file name only; point it at the copy
mkdir -p "$work/layers"
if [ -f "$work/prefix/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json" ]; then
    sed "s#\"library_path\": \"libVkLayer_khronos_validation.so\"#\"library_path\": \"$libdir/libVkLayer_khronos_validation.so\"#" \
        "$work/prefix/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json" \
        > "$work/layers/VkLayer_khronos_validation.json"
    export VK_ADD_LAYER_PATH="$work/layers"
fi

# ------------------------------------------------------------------ 2. ICD files for NVIDIA
find_first() {  # find_first NAME DIR...: the first file NAME under the DIRs (fake-root aware)
    local name=$1 d; shift
    for d in "$@"; do
        [ -d "$fake$d" ] || continue
        local hit
        hit=$(find "$fake$d" -maxdepth 2 -name "$name" 2>/dev/null | head -1)
        [ -n "$hit" ] && { echo "$hit"; return 0; }
    done
    return 1
}
lib_dirs=(/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib
          /usr/local/cuda/lib64 /usr/local/cuda/compat /lib/x86_64-linux-gnu)
mkdir -p "$work/icd/vulkan" "$work/icd/opencl"
vk_icd=$(find_first 'nvidia_icd*.json' /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d \
         /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d) || vk_icd=""
if [ -n "$vk_icd" ]; then
    note "Vulkan ICD: $vk_icd"
else
    glx=$(find_first 'libGLX_nvidia.so.0' "${lib_dirs[@]}") || glx=""
    if [ -n "$glx" ]; then
        vk_icd="$work/icd/vulkan/nvidia_icd.json"
        printf '{\n  "file_format_version": "1.0.0",\n  "ICD": {"library_path": "%s", "api_version": "1.3.0"}\n}\n' \
            "$glx" > "$vk_icd"
        note "Vulkan ICD: wrote $vk_icd for $glx"
    else
        note "Vulkan ICD: no nvidia_icd.json and no libGLX_nvidia.so.0 found; Vulkan sees only what the loader finds"
    fi
fi
if [ -n "$vk_icd" ]; then
    export VK_DRIVER_FILES="$vk_icd" VK_ICD_FILENAMES="$vk_icd"   # newer and older loaders
fi
cl_icd=$(find_first 'nvidia.icd' /etc/OpenCL/vendors /usr/local/nvidia/etc/OpenCL/vendors) || cl_icd=""
cl_lib=$(find_first 'libnvidia-opencl.so.1' "${lib_dirs[@]}") || cl_lib=""
if [ -n "$cl_lib" ]; then
    echo "$cl_lib" > "$work/icd/opencl/nvidia.icd"
    note "OpenCL ICD: wrote $work/icd/opencl/nvidia.icd for $cl_lib${cl_icd:+ (system file: $cl_icd)}"
    export OCL_ICD_VENDORS="$work/icd/opencl"
elif [ -n "$cl_icd" ]; then
    note "OpenCL ICD: $cl_icd"
    export OCL_ICD_VENDORS="$(dirname "$cl_icd")"
else
    note "OpenCL ICD: no libnvidia-opencl.so.1 found; OpenCL sees only what pyopencl's ICD loader finds"
fi
{ echo; echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"; echo "OCL_ICD_VENDORS=${OCL_ICD_VENDORS:-}";
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } >> "$res/env.txt"

# ------------------------------------------------------------------ 3. venv + wheels, 4. kp
mkvenv() {
    [ -x "$py" ] || "$py_sys" -m venv --system-site-packages "$venv"
    "$py" -m pip install -q --no-index --find-links "$gpu/wheels" pyopencl gguf "pybind11>=2.12,<3" setuptools wheel
    "$py" -c 'import pyopencl, gguf, numpy, pybind11; print("pyopencl", pyopencl.VERSION_TEXT, "numpy", numpy.__version__, "pybind11", pybind11.__version__)'
}
step "venv with the carried wheels (pyopencl, gguf, pybind11)" 120 mkvenv
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
step "build kp 0.9.0 + cooktop patch against the carried headers" 240 \
    env KP_PREFIX="$work/prefix" KP_SDIST="$gpu/src/kp-0.9.0.tar.gz" KP_WHEELS="$gpu/wheels" \
    bash scripts/install-kompute.sh "$py"

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" COOKTOP_SHARED="$gpu/shared" HF_HUB_OFFLINE=1
export COOKTOP_DISABLE="${COOKTOP_DISABLE:-}"

# ------------------------------------------------------------------ 5. probe
step "cooktop devices --json" 120 sh -c "'$py' -m cooktop devices --json > '$res/devices.json'"
"$py" - "$res/devices.json" >> "$res/devices.md" 2>&1 <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("devices.json unreadable:", e); sys.exit(0)
gib = lambda b: "?" if not b else f"{b / 2**30:.2f} GiB"
print("| device | type | name | subgroups | sg ops | int dot | coop matrix | fp16/bf16 | max alloc / buffer | usable (unified) | variants |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for fam, e in (d.get("families") or {}).items():
    if not e.get("devices"):
        print(f"| {fam} | - | unavailable: {e.get('reason', '')} | | | | | | | | |")
    for x in e.get("devices", []):
        print(f"| {x.get('selector')} | {x.get('device_type')} | {x.get('name')} | {x.get('subgroup_sizes')} "
              f"| {' '.join(x.get('subgroup_ops') or [])} | {x.get('integer_dot')} | {x.get('cooperative_matrix')} "
              f"| {x.get('fp16')}/{x.get('bf16')} | {gib(x.get('max_alloc_bytes'))} / {gib(x.get('max_buffer_bytes'))} "
              f"| {gib(x.get('usable_mem_bytes'))} ({x.get('unified_memory')}) | {x.get('variants')} |")
PY
cat "$res/devices.md" >> "$res/steps.log"

# ------------------------------------------------------------------ 6. parity + end-to-end tests
gpu_tests() {
    COOKTOP_REQUIRE=shared,opencl,vulkan "$py" -m pytest -q -p no:cacheprovider \
        tests/test_ops_parity.py tests/test_device_contract.py tests/test_reference.py tests/test_vulkan.py \
        tests/test_placement.py "tests/test_opencl.py::test_work_group_sizes_of_real_gpus" \
        tests/test_moe_ops_devices.py tests/test_arch_moe.py tests/test_prompt_paths.py \
        tests/test_chunked.py tests/test_chunked_models.py tests/test_tune.py \
        -k "opencl or vulkan" -x --timeout 120 2>&1 | tee "$res/tests.log" | tail -5
}
step "tests: OpenCL + Vulkan parity, the op table's contract, end-to-end, GPU work-group/subgroup sizes, MoE ops and models, prompt = one token at a time, tensors in row chunks" 300 gpu_tests

# ------------------------------------------------------------------ 7. validation layer on the real driver
validate() {
    "$py" tests/vulkan_validation.py --log "$res/validation.log" -q -p no:cacheprovider \
        tests/test_vulkan.py tests/test_vulkan_validation.py tests/test_tune.py -k "vulkan and not release" --timeout 60 \
        > "$work/validation.out" 2>&1
    local rc=$?
    cat "$work/validation.out" >> "$res/validation.log"
    tail -8 "$work/validation.out"
    return $rc
}
step "validation: Vulkan tests under VK_LAYER_KHRONOS_validation + synchronization validation" 100 validate

# ------------------------------------------------------------------ 8. bench the 1.1B Q4_0 shape
[ -f "$model" ] || step "bench: cooktop synth --shape tinyllama-1.1b --type Q4_0" 150 \
    "$py" -m cooktop synth --shape tinyllama-1.1b --type Q4_0 -o "$model"
vs=""
if "$py" -c 'import llama_cpp' >/dev/null 2>&1; then
    vs="--vs llama.cpp"
    note "llama.cpp: llama-cpp-python is importable: bench --vs llama.cpp"
else
    note "llama.cpp: not available here (no llama-cpp-python; llama-bench on PATH is run after cooktop if present)"
fi
# the tuner first (cooktop tune: its choice is cached per device and used by the tuned bench),
# then the same bench with today's defaults (cooktop --no-tune) and tuned, side by side in bench.md
tune() {
    "$py" -m cooktop tune -m "$model" --device "$1" --budget 60 --runs 3 >> "$work/tune.txt" 2>&1
}
bench() {
    "$py" -m cooktop --no-tune bench -m "$model" --device opencl,vulkan -p 512 -n 128 -r 2 $GPU_CHECK_VS -o json \
        > "$work/bench-default.json" || return 1
    "$py" -m cooktop bench -m "$model" --device opencl,vulkan -p 512 -n 128 -r 2 $GPU_CHECK_VS -o json \
        > "$res/bench.json" || return 1
    {
        printf '### tuned (cooktop tune, then cooktop bench)\n\n'
        "$py" -m cooktop bench --from "$res/bench.json" -o md
        printf '\n### default launch parameters (cooktop --no-tune bench)\n\n'
        "$py" -m cooktop bench --from "$work/bench-default.json" -o md
        printf '\n### cooktop tune\n\n```\n'
        cat "$work/tune.txt" 2>/dev/null
        printf '```\n'
    } | tee "$res/bench.md"
}
export GPU_CHECK_VS="$vs"
if [ -f "$model" ]; then
    step "tune: cooktop tune -m 1.1B Q4_0 --device opencl:0 --budget 60" 90 tune opencl:0
    step "tune: cooktop tune -m 1.1B Q4_0 --device vulkan:0 --budget 60" 90 tune vulkan:0
    step "bench: cooktop bench 1.1B Q4_0 -p 512 -n 128 -r 2 (opencl, vulkan), default then tuned" 400 bench
fi
if [ -f "$model" ] && command -v llama-bench >/dev/null; then
    step "bench: llama-bench -p 512 -n 128 -r 2" 120 sh -c "llama-bench -m '$model' -p 512 -n 128 -r 2 -o md | tee -a '$res/bench.md'"
fi

# ------------------------------------------------------------------ 9. cooktop report --full
# (the models and KLD bases in $work, not in the results: only report.json and index.html come back)
step "report: cooktop report --full (every device)" 400 \
    "$py" -m cooktop report --full --no-progress --work-dir "$work/report" -o "$res/report"

{
    printf '\nTotal: %ss (budget %ss).\n\n' "$(elapsed)" "$budget"
    [ -f "$res/devices.md" ] && { printf 'Devices (cooktop devices --json):\n\n'; cat "$res/devices.md"; printf '\n'; }
    for n in "${notes[@]}"; do printf -- '- %s\n' "$n"; done
    [ -f "$res/tests.log" ] && { printf '\nTests: '; tail -1 "$res/tests.log"; }
    [ -f "$res/bench.md" ] && { printf '\n'; cat "$res/bench.md"; }
    [ -f "$res/report/report.json" ] && printf '\nReport: report/index.html, report/report.json (cooktop report --full).\n'
} >> "$res/summary.md"
echo "gpu-check: results in $res ($(elapsed)s)"
cat "$res/summary.md"
grep -q 'FAILED\|timed out' "$res/summary.md" && exit 1
exit 0
