"""The Vulkan tests under the Khronos validation layer, with synchronization validation.

Run as a script (``make test-vulkan-validation``; ``.ci/run`` runs it after ``make test``)::

    python tests/vulkan_validation.py [--log FILE] [PYTEST ARGS...]   (default args: -k vulkan)

With ``-n N`` (pytest-xdist; ``make test-vulkan-validation`` passes ``-n auto``) each worker gets a
FIFO and a settings file of its own (tests/fifo_log.py), so messages stay attributed to their test.

It runs pytest in a child process with ``VK_LAYER_KHRONOS_validation`` enabled
through the loader (``VK_INSTANCE_LAYERS``) and a ``vk_layer_settings.txt``
(``VK_LAYER_SETTINGS_PATH``) that turns synchronization validation on
(``VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT``), reports
errors and warnings without a duplicate limit, and logs to a FIFO. The layer
``fopen``\\ s its log with mode "w" once per VkInstance and per process, so a
plain file would be truncated by each instance and by every ``cooktop``
subprocess a test starts; a FIFO read by a thread of this (parent) process
takes every message of every process, in order. The child loads this module
as a pytest plugin (``-p vulkan_validation``): it writes a marker line into the
FIFO as each test starts, so messages are attributed to tests, and checks that
the layer really is loaded into the process once a Vulkan device is open.

Exit status: 1 when any message has ERROR severity (every VUID and
SYNC-HAZARD message is one), when the layer was not seen loaded, or pytest's
own status when it failed; 0 otherwise. The report lists the counts per
message id and the tests that produced them; the whole log goes to ``--log``.

Layer missing (Debian: ``apt-get install vulkan-validationlayers``, which
scripts/setup.sh does): exit 0 with a "skipped" line, unless ``COOKTOP_REQUIRE``
names ``vulkan_validation`` (``.ci/run`` does): then exit 1.

Message format parsed (layer 1.3.239, ``debug_action`` LOG_MSG):
``VUID-...(ERROR / SPEC): msgNum: N - text``, continuation lines indented.
Sources: the layer's settings file documentation (vk_layer_settings.txt in
the Vulkan-ValidationLayers repository) and its synchronization validation
guide.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import tempfile

# tests/: the script's folder, or on PYTHONPATH
from fifo_log import mark, run_collecting, use_worker_files, worker_ids, xdist_workers

LAYER = "VK_LAYER_KHRONOS_validation"
RESOURCE = "vulkan_validation"
MARKER = "=== cooktop-vulkan-validation:"
ROOT = pathlib.Path(__file__).resolve().parents[1]

_MSG = re.compile(r"^(?P<id>[A-Za-z0-9_.:-]+)\((?P<sev>ERROR|WARNING|PERF|INFO|VERBOSE)[^)]*\): msgNum: -?\d+ - ")
# newer layers' LOG_MSG format: "Validation Error: [ VUID-... ] ..." / "Validation Warning: [ ... ]"
_MSG_NEW = re.compile(r"^Validation (?P<sev>Error|Warning|Performance Warning|Information): \[ (?P<id>\S+) \]")


@dataclasses.dataclass
class Message:
    """One layer message: its id (VUID-..., SYNC-HAZARD-..., UNASSIGNED-...), severity
    (ERROR, WARNING, ...), the test running when it came (or "" before the first), and its text."""

    id: str
    severity: str
    test: str
    text: str


def parse_log(text: str) -> list[Message]:
    """Messages of a validation-layer log, attributed to the test whose marker precedes them.

    Lines that are neither a message start nor a marker continue the previous message.
    """
    out: list[Message] = []
    test = ""
    for line in text.splitlines():
        if line.startswith(MARKER):
            kind, _, arg = line[len(MARKER):].strip().partition(" ")
            if kind == "test":
                test = arg
            elif kind == "worker":  # the next pytest-xdist worker's section (fifo_log.run_collecting)
                test = ""
            continue
        m = _MSG.match(line) or _MSG_NEW.match(line)
        if m:
            sev = m.group("sev").upper().split()[0]
            out.append(Message(m.group("id"), "ERROR" if sev == "ERROR" else sev, test, line))
        elif out and line.strip():
            out[-1].text += "\n" + line
    return out


def layer_available() -> tuple[bool, str]:
    """Whether the loader finds the validation layer, and why not."""
    sys.path.insert(0, str(ROOT))
    try:
        from cooktop.backends.vulkan.info import VulkanInfoError, instance_layers
    finally:
        sys.path.pop(0)
    try:
        layers = instance_layers()
    except VulkanInfoError as e:
        return False, str(e)
    if LAYER not in layers:
        return False, (f"the Vulkan loader finds no {LAYER} (found: {', '.join(layers) or 'none'}; "
                       f"apt-get install vulkan-validationlayers)")
    return True, ""


#: ``--gpu-assisted``: GPU-assisted validation (the layer instruments every shader to check
#: descriptor indexing and buffer bounds on the device) instead of synchronization validation.
GPU_ASSISTED = "VK_VALIDATION_FEATURE_ENABLE_GPU_ASSISTED_EXT"
SYNCHRONIZATION = "VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT"


def settings_text(log_path: str, enables: str = SYNCHRONIZATION) -> str:
    """The vk_layer_settings.txt used: synchronization validation on (or ``enables``), errors and
    warnings logged to ``log_path`` without a duplicate-message limit."""
    return (f"khronos_validation.enables = {enables}\n"
            f"khronos_validation.report_flags = error,warn\n"
            f"khronos_validation.debug_action = VK_DBG_LAYER_ACTION_LOG_MSG\n"
            f"khronos_validation.log_filename = {log_path}\n"
            f"khronos_validation.duplicate_message_limit = 1000000\n")


def _required() -> bool:
    return RESOURCE in {s.strip().lower() for s in os.environ.get("COOKTOP_REQUIRE", "").split(",")}


def report(messages: list[Message], out=None) -> int:
    """Print counts per id and severity with the tests that produced them (to ``out``, default
    stdout); return the ERROR count."""
    out = out or sys.stdout
    errors = [m for m in messages if m.severity == "ERROR"]
    counts = collections.Counter((m.severity, m.id) for m in messages)
    print(f"vulkan-validation: {len(errors)} error message(s), {len(messages) - len(errors)} other(s)", file=out)
    for (sev, mid), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        tests = collections.Counter(m.test or "(before the first test)" for m in messages if m.id == mid)
        where = ", ".join(f"{t} x{k}" for t, k in tests.most_common(3)) + (" ..." if len(tests) > 3 else "")
        print(f"  {n:6d}  {sev:7s} {mid}   in {where}", file=out)
    if errors:
        first = errors[0]
        print(f"first error (in {first.test or 'setup'}):\n{first.text}", file=out)
    return len(errors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "cooktop-vulkan-validation.log"),
                    help="where the layer's whole log is written (default: %(default)s)")
    ap.add_argument("--gpu-assisted", action="store_true",
                    help="GPU-assisted validation (shader instrumentation: out-of-bounds buffer access) "
                         "instead of synchronization validation")
    args, pytest_args = ap.parse_known_args(argv)
    ok, why = layer_available()
    if not ok:
        if _required():
            print(f"vulkan-validation: FAILED: required resource {RESOURCE!r} missing (COOKTOP_REQUIRE): {why}",
                  file=sys.stderr)
            return 1
        print(f"vulkan-validation: skipped: {why}")
        return 0
    workers = xdist_workers(pytest_args)
    with tempfile.TemporaryDirectory(prefix="cooktop-vkval-") as tmp:
        def run(fifo: str) -> int:
            settings = os.path.join(tmp, "vk_layer_settings.txt")
            enables = GPU_ASSISTED if args.gpu_assisted else SYNCHRONIZATION
            pathlib.Path(settings).write_text(settings_text(fifo, enables))
            for w in worker_ids(workers):  # one settings file per xdist worker, naming its FIFO
                pathlib.Path(f"{settings}.{w}").write_text(settings_text(f"{fifo}.{w}", enables))
            env = dict(os.environ)
            env.update(VK_INSTANCE_LAYERS=LAYER, VK_LAYER_SETTINGS_PATH=settings, COOKTOP_VULKAN_VALIDATION_FIFO=fifo)
            env["COOKTOP_SLOW_LIMIT"] = "0"  # every test runs many times slower under the layer
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tests"), str(ROOT), env.get("PYTHONPATH")) if p)
            cmd = [sys.executable, "-m", "pytest", "-p", "vulkan_validation", *(pytest_args or ["-q", "-k", "vulkan"])]
            print("vulkan-validation: " + " ".join(cmd[2:]), flush=True)
            return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode

        rc, text = run_collecting(tmp, "layer.fifo", run, workers=workers, marker=MARKER)
    pathlib.Path(args.log).write_text(text)
    messages = parse_log(text)
    print(f"vulkan-validation: layer log ({len(text)} bytes) in {args.log}")
    n_err = report(messages)
    loaded = re.findall(rf"^{re.escape(MARKER)} layer (\w+)", text, re.MULTILINE)
    if "loaded" not in loaded:
        print(f"vulkan-validation: FAILED: {LAYER} was never seen loaded in the test process "
              f"(markers: {loaded or 'none'})", file=sys.stderr)
        return 1
    if rc:
        print(f"vulkan-validation: FAILED: pytest exited {rc}", file=sys.stderr)
        return rc
    if n_err:
        print(f"vulkan-validation: FAILED: {n_err} validation error message(s)", file=sys.stderr)
        return 1
    print("vulkan-validation: passed: 0 validation errors, " + ("0 GPU-assisted reports" if args.gpu_assisted
                                                                else "0 synchronization hazards"))
    return 0


# -- pytest plugin, loaded in the child (-p vulkan_validation) --------------------------------------

if __name__ != "__main__":
    # a pytest-xdist worker writes to its own FIFO (fifo_log.use_worker_files), before any device opens
    use_worker_files("COOKTOP_VULKAN_VALIDATION_FIFO", "VK_LAYER_SETTINGS_PATH")


def _mark(line: str) -> None:
    mark("COOKTOP_VULKAN_VALIDATION_FIFO", MARKER, line)


def _layer_loaded() -> bool | None:
    """True / False once a Vulkan device is open in this process (the layer's library is mapped
    or not), None before."""
    reg = sys.modules.get("cooktop.backends.registry")
    if reg is None or not any(str(k).startswith("vulkan") for k in getattr(reg, "_devices", {})):
        return None
    try:
        maps = pathlib.Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return "libVkLayer_khronos_validation" in maps


def pytest_runtest_setup(item):
    _mark(f"test {item.nodeid}")


def pytest_sessionfinish(session, exitstatus):
    loaded = _layer_loaded()
    _mark("layer " + ("loaded" if loaded else "unseen" if loaded is None else "absent"))


if __name__ == "__main__":
    sys.exit(main())
