"""The OpenCL tests on Oclgrind, a simulated GPU that checks every memory access.

Run as a script (``make test-opencl-validation``; ``.ci/run`` runs it after ``make test``)::

    python tests/opencl_validation.py [--log FILE] [--default-args] [PYTEST ARGS...]   (default: DEFAULT_ARGS)

``--default-args -n auto`` runs DEFAULT_ARGS on pytest-xdist workers (``make test-opencl-validation``
does), each logging to a FIFO of its own (tests/fifo_log.py).

Oclgrind (Debian ``oclgrind``) is an OpenCL 1.2 device simulator that reports data races
(``OCLGRIND_DATA_RACES``), out-of-bounds and other invalid memory accesses, barrier
divergence and API errors (``OCLGRIND_CHECK_API``). It registers as a ``gpu``-type device,
so cooktop runs its GPU launch shapes there (work-groups sharing rows, local-memory
reductions), which CPU drivers such as PoCL execute in an order that hides races.

The child pytest sees only Oclgrind through an ICD file of our own (``OCL_ICD_VENDORS``
pointing at a temporary folder; the system's vendor list is never read), with Vulkan turned
off (``COOKTOP_DISABLE``). Oclgrind writes its reports to ``OCLGRIND_LOG``, a FIFO read by
this (parent) process, so every process of the run (``cooktop`` subprocesses included) adds
to one log; the child loads this module as a plugin (``-p opencl_validation``), marks each
test's start in the FIFO and checks that the OpenCL device it opened is Oclgrind.

A report names its kernel and the line of the program's concatenated source; the summary
maps it back to ``file.cl:N`` (``cooktop.backends.opencl.programs.source_location``).

Exit status: 1 when Oclgrind reported anything, when no test ran on the Oclgrind device,
or pytest's own status when it failed; 0 otherwise. Oclgrind missing: exit 0 with a
"skipped" line, unless ``COOKTOP_REQUIRE`` names ``oclgrind`` (``.ci/run`` does): then 1.

Excluded by name (README "Tests"): ``--uninitialized`` (``OCLGRIND_UNINITIALIZED``) stays off.
Oclgrind 21.10's Uninitialized plugin stops with "OCLGRIND FATAL ERROR" on two things it does not
model, then computes wrong values (rope's output all zeros) or crashes the process (SIGSEGV) later:
LLVM's ``freeze`` instruction (``Unsupported instruction: freeze`` in ``mul_mm``, which clang 14+
emits for ``%i.0.frozen = freeze i32 %i.0`` ahead of a division by a loop index), and ``sincos``
writing its cosine through a pointer to private memory (``Work item needed to access private
memory!`` in ``rope`` at rope.cl:30). Neither is a fault of the kernels.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

# tests/: the script's folder, or on PYTHONPATH
from fifo_log import mark, run_collecting, use_worker_files, xdist_workers

RESOURCE = "oclgrind"
MARKER = "=== cooktop-opencl-validation:"
ROOT = pathlib.Path(__file__).resolve().parents[1]

#: What runs on the simulated GPU: every OpenCL op parity test (odd shapes, every weight type,
#: the op table's contract), the gated delta rule and its small ops (their kernels at the GPU launch
#: shape, several sequences' rows in one call, d = 128), attention with and without flash attention
#: (query tiles, the score scratch in chunks, sinks) and, end to end, stories260K and a tiny quantized
#: model against llama.cpp's logits, and the vision ops (tests/test_vision_ops.py; attention_full up to
#: 37 tokens, past one 16-query tile: its 197- and 300-token cases took 90 s each on Oclgrind and run the
#: same kernels as the 37-token one). (The tiny model's chunked prefill, 80 s here, is left out: its
#: pipelines are stories260K's chunked prefill (attention from kv_start) and the tiny model's whole
#: prompt (its Q4_K / Q6_K prompt matmuls), both run here, and the matmuls at 1, 7 and 64 tokens.)
DEFAULT_ARGS = ["-q", "-p", "no:cacheprovider",
                "tests/test_ops_parity.py", "tests/test_ops_parity_ext.py", "tests/test_device_contract.py",
                "tests/test_opencl_q8.py", "tests/test_opencl_q8k.py", "tests/test_reference.py",
                "tests/test_rope_store.py", "tests/test_gated_delta_net.py", "tests/test_vision_ops.py",
                "tests/test_kv_cache.py::test_kv_types_k_and_v_independent",
                "tests/test_kv_cache.py::test_attention_without_flash_in_chunks",
                *[f"tests/test_kv_cache.py::test_kv_types_attention_parity[opencl-{c}]"
                  for c in ("long-fa-Q4_0", "sinks-fa-F16", "long-nofa-Q8_0", "sinks-nofa-BF16", "window-nofa-F16")],
                "tests/test_opencl.py::test_work_group_sizes_of_real_gpus",
                "tests/test_tune.py",  # every variant of the GPU flavour's search space (Oclgrind is a GPU)
                "-k", "opencl and not greedy and not (tiny and not Q4_K_M) and not (q8k and (portable or gpu-shape))"
                      " and not (chunked_prefill and tiny)"
                      " and not (test_vision_ops.py and (197 or 300 or 1024))"
                      " and not (test_opencl_q8.py and (native or portable or q4_k_prompt_kernel_can_be_turned_off))"]

# test_opencl_q8.py's native / portable cases (and the MMQ_K switch's) open a PoCL device by name (they test PoCL's CPU
# kernels), never Oclgrind: under this harness only pip's PoCL 3.0-rc2 is left for them, whose LLVM
# does not know every host CPU (on an AMD EPYC: "unknown target CPU 'generic'"), so they are left
# out here; `make test` runs them on Debian's PoCL.

#: Where Debian's package puts the ICD library of the Oclgrind runtime.
ICD_LIBRARIES = ("/usr/lib/oclgrind/liboclgrind-rt-icd.so", "/usr/lib/*/oclgrind/liboclgrind-rt-icd.so",
                 "/usr/local/lib/liboclgrind-rt-icd.so")



@dataclasses.dataclass
class Report:
    """One Oclgrind report: its first line, the kernel, the source line, the test running."""

    kind: str
    kernel: str
    line: int | None
    test: str
    text: str


def find_icd_library() -> str | None:
    """The Oclgrind ICD library, or None when Oclgrind is not installed."""
    for pattern in ICD_LIBRARIES:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    exe = shutil.which("oclgrind")
    if exe:
        cand = pathlib.Path(exe).resolve().parents[1] / "lib" / "oclgrind" / "liboclgrind-rt-icd.so"
        if cand.exists():
            return str(cand)
    return None


def parse_log(text: str) -> list[Report]:
    """Reports of an Oclgrind log, attributed to the test whose marker precedes them.
    Indented lines continue the current report; other lines that are no marker start one."""
    out: list[Report] = []
    test = ""
    for line in text.splitlines():
        if line.startswith(MARKER):
            kind, _, arg = line[len(MARKER):].strip().partition(" ")
            if kind == "test":
                test = arg
            elif kind == "worker":  # the next pytest-xdist worker's section (fifo_log.run_collecting)
                test = ""
            continue
        if not line.strip():
            continue
        if line[0] in " \t" and out:
            out[-1].text += "\n" + line
            k = re.search(r"Kernel: (\w+)", line)
            if k and not out[-1].kernel:
                out[-1].kernel = k.group(1)
            n = re.search(r"At line (\d+)", line)
            if n and out[-1].line is None:
                out[-1].line = int(n.group(1))
            continue
        out.append(Report(line.strip(), "", None, test, line))
    return out


def where(r: Report) -> str:
    """``kernel at file.cl:N`` for a report."""
    if not r.kernel:
        return "(no kernel)"
    if r.line is None:
        return r.kernel
    sys.path.insert(0, str(ROOT))
    try:
        from cooktop.backends.opencl.programs import source_location
    finally:
        sys.path.pop(0)
    return f"{r.kernel} at {source_location(r.kernel, r.line)}"


def report(reports: list[Report], out=None) -> int:
    """Print the reports grouped by kind and place, with their tests; return their count."""
    out = out or sys.stdout
    print(f"opencl-validation: {len(reports)} Oclgrind report(s)", file=out)
    groups = collections.Counter((r.kind.split(" at ")[0], where(r)) for r in reports)
    for (kind, place), n in groups.most_common():
        tests = collections.Counter(r.test or "(before the first test)" for r in reports if where(r) == place)
        print(f"  {n:6d}  {kind}  in {place}   ({', '.join(t for t, _ in tests.most_common(3))})", file=out)
    if reports:
        print(f"first report (in {reports[0].test or 'setup'}):\n{reports[0].text}", file=out)
    return len(reports)


def _required() -> bool:
    return RESOURCE in {s.strip().lower() for s in os.environ.get("COOKTOP_REQUIRE", "").split(",")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "cooktop-opencl-validation.log"),
                    help="where Oclgrind's whole log is written (default: %(default)s)")
    ap.add_argument("--default-args", action="store_true",
                    help="DEFAULT_ARGS, then the other arguments (e.g. -n auto for pytest-xdist workers)")
    args, pytest_args = ap.parse_known_args(argv)
    if args.default_args or not pytest_args:
        pytest_args = [*DEFAULT_ARGS, *pytest_args]
    lib = find_icd_library()
    if lib is None:
        why = "Oclgrind is not installed (apt-get install oclgrind)"
        if _required():
            print(f"opencl-validation: FAILED: required resource {RESOURCE!r} missing (COOKTOP_REQUIRE): {why}",
                  file=sys.stderr)
            return 1
        print(f"opencl-validation: skipped: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="cooktop-oclval-") as tmp:
        vendors = os.path.join(tmp, "vendors")
        os.mkdir(vendors)
        pathlib.Path(vendors, "oclgrind.icd").write_text(lib + "\n")
        def run(fifo: str) -> int:
            env = dict(os.environ)
            env.update(OCL_ICD_VENDORS=vendors, OCLGRIND_DATA_RACES="1", OCLGRIND_CHECK_API="1",
                       OCLGRIND_MAX_ERRORS="100000", OCLGRIND_LOG=fifo, COOKTOP_OPENCL_VALIDATION_FIFO=fifo,
                       COOKTOP_DISABLE="vulkan", OCLGRIND_GLOBAL_MEM_SIZE=str(1 << 30))
            env.pop("OCLGRIND_UNINITIALIZED", None)
            env["COOKTOP_SLOW_LIMIT"] = "0"  # every test runs many times slower on Oclgrind
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tests"), str(ROOT), env.get("PYTHONPATH")) if p)
            cmd = [sys.executable, "-m", "pytest", "-p", "opencl_validation", *pytest_args]
            print("opencl-validation: " + " ".join(cmd[2:]), flush=True)
            return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode

        rc, text = run_collecting(tmp, "oclgrind.fifo", run, workers=xdist_workers(pytest_args),
                                  marker=MARKER)
    pathlib.Path(args.log).write_text(text)
    reports = parse_log(text)
    print(f"opencl-validation: Oclgrind log ({len(text)} bytes) in {args.log}")
    n = report(reports)
    devices = re.findall(rf"^{re.escape(MARKER)} device (.*)$", text, re.MULTILINE)
    if not any("Oclgrind" in d for d in devices):
        print(f"opencl-validation: FAILED: no test ran on the Oclgrind device (opened: {devices or 'none'})",
              file=sys.stderr)
        return 1
    if rc:
        print(f"opencl-validation: FAILED: pytest exited {rc}", file=sys.stderr)
        return rc
    if n:
        print(f"opencl-validation: FAILED: {n} Oclgrind report(s)", file=sys.stderr)
        return 1
    print("opencl-validation: passed: 0 data races, 0 invalid accesses, 0 API errors on the simulated GPU")
    return 0


# -- pytest plugin, loaded in the child (-p opencl_validation) --------------------------------------

if __name__ != "__main__":
    # a pytest-xdist worker writes to its own FIFO (fifo_log.use_worker_files), before any device opens
    use_worker_files("COOKTOP_OPENCL_VALIDATION_FIFO", "OCLGRIND_LOG")


def _mark(line: str) -> None:
    mark("COOKTOP_OPENCL_VALIDATION_FIFO", MARKER, line)


#: OpenCL devices seen open at a test's end (a test may reset the registry, closing them).
_seen: set[str] = set()


def _note_devices() -> None:
    reg = sys.modules.get("cooktop.backends.registry")
    for key, dev in sorted(getattr(reg, "_devices", {}).items()) if reg else ():
        if str(key).startswith("opencl"):
            _seen.add(f"{key} {dev.info.name} ({dev.info.device_type})")


def pytest_runtest_setup(item):
    _mark(f"test {item.nodeid}")


def pytest_runtest_call(item):
    _note_devices()


def pytest_runtest_teardown(item):
    _note_devices()


def pytest_sessionfinish(session, exitstatus):
    _note_devices()
    for d in sorted(_seen):
        _mark(f"device {d}")


if __name__ == "__main__":
    sys.exit(main())
