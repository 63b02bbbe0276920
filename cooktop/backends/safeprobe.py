"""Driver probes in a child process: a driver that aborts or hangs takes down the child, not the caller.

Some driver calls end the process in C/C++ where no ``except`` can catch them:
``kp.Manager()`` aborts (SIGABRT) when the Vulkan loader has no driver, a
broken ICD can segfault inside ``vkCreateInstance`` or ``clGetPlatformIDs``,
and a driver can hang; a driver can also list a device, fail every kernel build on it and
abort at interpreter exit (PyPI's PoCL 3.0-rc2 on some AMD CPUs: "unknown target CPU
'generic'", then "still have references to IRs - can't release LLVM context"). So before the
registry probes a family in the user's process, :func:`check` runs the same probe in a child
(:func:`child_main`, started by :func:`_child_argv`) with a timeout: the child probes, then
opens every device it found (``Family.open_call``: for Vulkan ``kp.Manager(i)``, the call that
aborts), runs the family's check on it (``Family.check_device``: OpenCL builds and runs one
small kernel) and closes it, reporting each step on stdout.

- The child finished and found nothing usable: its :class:`ProbeResult` (reason
  and hint) is the answer; the user's process makes no driver call.
- The child finished with devices: the caller probes in-process (the same calls
  just succeeded with the same drivers). A device that failed to open or failed its check is
  in the result's ``errors`` (index -> reason, with the driver's first line on stderr): the
  registry lists it as unusable and never opens it in the user's process.
- The child died while opening or checking one device: that device is unusable (the signal is
  its reason) and a new child goes on from the next device.
- The child died elsewhere (a signal, an exit without a result) or did not answer within
  ``COOKTOP_PROBE_TIMEOUT`` seconds (default :data:`TIMEOUT_S`): the family is
  unavailable, with a reason naming the step, the signal and the drivers found.

Before a process first opens a device, :func:`check_use` runs the family's slower check on that
one device in a child (``Family.check_use``: OpenCL launches one real kernel, whose compile aborts
PyPI's PoCL 3.0-rc2 on an AMD EPYC VM where the probe's small kernel built); a failure, a crash
(named with the driver's first error line, captured to the file ``COOKTOP_PROBE_STDERR`` names,
which survives the abort) or a timeout makes the device unusable, kept like a probe verdict.

Verdicts are kept per *driver set* (memory, and ``<cache_dir>/probe/*.json``):
the key holds the environment variables that steer loaders and drivers
(``VK_*``, ``OCL_*``, ``POCL_*``, ``LD_LIBRARY_PATH``... see :func:`driver_key`),
the driver manifest files with their sizes and modification times (and those of
the libraries they name), the Python executable, the backend modules, and the
boot id, so a new driver, a changed variable or a reboot probes again; a
timeout is never kept. ``COOKTOP_PROBE_ISOLATION=0`` turns the child off
(probes run in-process, devices unchecked: a driver that crashes or aborts takes the process
down). A child killed by the timeout before its first report makes the family unavailable
(never an unchecked in-process probe); each new child after a crash gets the whole timeout.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from .. import settings
from ..errors import CooktopError
from ..notices import cache_dir
from .base import ProbeResult
from .families import FAMILIES
from .family import Family

log = logging.getLogger("cooktop")

#: Seconds a probe child may take (``COOKTOP_PROBE_TIMEOUT`` overrides).
TIMEOUT_S = 60.0

#: Marker of the child's report lines on stdout (drivers may print there too).
MARK = "@@cooktop-probe "

#: Variables that steer every family's drivers (each family adds its own, ``Family.env_prefixes``).
_ENV_PREFIXES = ("ZE_", "XDG_", "__GLX_", "DRI_")
_ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
              "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "PATH", "COOKTOP_PROBE_TIMEOUT")

_memo: dict[str, ProbeResult] = {}


def _stat(path: str) -> list:
    try:
        st = os.stat(path)
        return [path, st.st_size, st.st_mtime_ns]
    except OSError:
        return [path, None, None]


def driver_key(family: str, target: str) -> dict[str, Any]:
    """What a probe verdict depends on (see the module docstring); JSON-ready.

    Raises:
        KeyError: ``family`` is not in the registry's family list.
    """
    fam = _family(family)
    prefixes = _ENV_PREFIXES + fam.env_prefixes
    env = {k: v for k, v in os.environ.items() if k.startswith(prefixes) or k in _ENV_NAMES}
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    here = os.path.dirname(os.path.abspath(__file__))
    modules = [os.path.join(here, n) for n in ("safeprobe.py", "family.py", "base.py")] + fam.module_files()
    mod_file = importlib.util.find_spec(target.split(":")[0])
    if mod_file and mod_file.origin and mod_file.origin not in modules:
        modules.append(mod_file.origin)
    return {"family": family, "target": target, "python": sys.executable, "version": sys.version,
            "env": dict(sorted(env.items())), "files": [_stat(p) for p in fam.files()],
            "modules": [_stat(p) for p in modules], "boot": boot}


def _family(name: str) -> Family:
    return FAMILIES[name]


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _cache_path(digest: str, folder: str = "probe") -> str:
    """A verdict's file: ``<cache>/probe`` (families) or ``<cache>/probe-use`` (:func:`check_use`)."""
    return os.path.join(cache_dir(folder), f"{digest}.json")


def _result_dict(res: ProbeResult) -> dict:
    return {"backend": res.backend, "available": res.available, "reason": res.reason, "hint": res.hint,
            "errors": {str(k): v for k, v in res.errors.items()}}


def _result_from(d: dict, family: str | None = None) -> ProbeResult:
    """A ProbeResult from a verdict's JSON (the cache's, or the child's ``result`` message)."""
    errors = {int(k): v for k, v in (d.get("errors") or {}).items()}
    if not isinstance(d["available"], bool) or not all(isinstance(v, str) and v for v in errors.values()):
        raise ValueError(f"malformed probe verdict: {d!r}"[:200])
    return ProbeResult(family or d["backend"], d["available"], reason=str(d.get("reason", "")),
                       hint=str(d.get("hint", "")), errors=errors)


def _load_cached(digest: str, folder: str = "probe") -> ProbeResult | None:
    try:
        with open(_cache_path(digest, folder), encoding="utf-8") as f:
            return _result_from(json.load(f)["result"])
    except Exception:  # noqa: BLE001 - any unreadable or malformed verdict is probed again
        return None


def _store(digest: str, key: dict, res: ProbeResult, folder: str = "probe") -> None:
    path = _cache_path(digest, folder)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"key": key, "result": _result_dict(res)}, f, indent=1, default=str)
        os.replace(tmp, path)
    except OSError as e:  # a read-only home only costs a child per process
        log.debug("cannot keep the probe verdict in %s: %s", path, e)


def _timeout() -> float:
    return settings.probe_timeout(TIMEOUT_S)


def _child_argv(family: str, target: str, start: int = 0) -> list[str]:
    """The command of a probe child that opens and checks the devices from index ``start`` on
    (tests replace it to simulate crashes and hangs)."""
    # not ``-m cooktop.backends.safeprobe``: runpy warns when the package imported the module first
    return [sys.executable, "-c", "import sys; from cooktop.backends.safeprobe import child_main; "
            "sys.exit(child_main(sys.argv[1:]))", family, target, str(start)]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["COOKTOP_PROBE_CHILD"] = "1"
    return env


def _drivers_found(family: str) -> str:
    """The drivers installed, from their files alone (never raises)."""
    try:
        return _family(family).drivers()
    except Exception as e:  # noqa: BLE001 - a description is best effort
        return f"(drivers not described: {type(e).__name__}: {e})"


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _verdict(family: str, rc: int | None, out: str, err: str, waited: float | None,
             errors: dict[int, str], said: str = "") -> tuple[ProbeResult | None, bool, int | None]:
    """``(result, keep, resume)`` from one child's exit code and output.

    ``said``: what the drivers wrote to stderr while the child checked its last device (the file of
    ``COOKTOP_PROBE_STDERR``); a child that died there is named with its first error line.

    ``result`` None: run the probe in-process (``resume`` None), or start a new child at device
    ``resume``: this one died while opening or checking the device before it, now in ``errors``
    (device index -> why it is unusable; the ``device_error`` reports of the child are added too).
    """
    steps, result, device = [], None, None
    for line in out.splitlines():
        if line.startswith(MARK):
            try:
                msg = json.loads(line[len(MARK):])
            except (ValueError, RecursionError):
                continue
            if not isinstance(msg, dict):
                continue
            if "step" in msg:
                steps.append(msg["step"])
                device = msg.get("device")
            if "device_error" in msg:
                errors[int(msg["device_error"][0])] = str(msg["device_error"][1])
            if "result" in msg:
                result = msg["result"]
    err_tail = " | ".join(ln.strip() for ln in err.strip().splitlines()[-3:] if ln.strip())[:400]
    if err.strip():
        log.info("%s probe child stderr:\n%s", family, err.rstrip())
    if result is not None:
        res = _result_from(result, family)
        res.errors = {**errors, **res.errors}
        return res, True, None
    if waited is not None and not steps:  # killed before its first report: never probe in-process then
        return ProbeResult(family, False, reason=f"the {family} probe process did not report within {waited:g} s "
                           f"(killed; a slow start or a hung driver?); {_drivers_found(family)}",
                           hint="set COOKTOP_PROBE_TIMEOUT=<seconds> to wait longer, or COOKTOP_DISABLE="
                           f"{family} to skip it"), False, None
    if not steps:  # our module never ran (broken install, odd interpreter): cannot isolate
        log.warning("cannot probe %s in a child process (exit %s: %s); probing in-process", family, rc,
                    err_tail or "no output")
        return None, False, None
    where = steps[-1]
    found = _drivers_found(family)
    if waited is not None:
        return ProbeResult(family, False, reason=f"the {family} probe did not finish within {waited:g} s while "
                           f"{where} (a hung driver?); {found}",
                           hint="set COOKTOP_PROBE_TIMEOUT=<seconds> to wait longer, or COOKTOP_DISABLE="
                           f"{family} to skip it"), False, None
    how = f"was killed by {_signal_name(rc)}" if rc is not None and rc < 0 else f"exited with code {rc}"
    crash = f"the {family} driver crashed a probe process: it {how} while {where}" + (
        f" ({err_tail})" if err_tail else "")
    if device is not None:  # one device's open or check: that device is unusable, go on with the next
        lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
        errors[int(device)] = (f"{_family(family).name}:{int(device)} is unusable on this machine: {crash}"
                               + (f" (driver: {first[:200]})" if first else ""))
        return None, False, int(device) + 1
    return ProbeResult(family, False, reason=f"{crash}; {found}"), True, None


def _spawn(family: str, target: str, start: int) -> tuple[subprocess.Popen, str]:
    """A probe child and the file it captures the drivers' stderr into while it checks a device
    (``COOKTOP_PROBE_STDERR``; read with :func:`_take_said`)."""
    fd, said = tempfile.mkstemp(prefix=f"cooktop-probe-{family}-", suffix=".txt")
    os.close(fd)
    try:
        proc = subprocess.Popen(_child_argv(family, target, start), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env={**_child_env(), "COOKTOP_PROBE_STDERR": said},
                                text=True, errors="replace")
    except OSError:
        _take_said(said)
        raise
    return proc, said


def _take_said(path: str) -> str:
    """The text of a child's stderr capture file, which is removed; "" when unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        text = ""
    try:
        os.unlink(path)
    except OSError:
        pass
    return text


def check_many(targets: dict[str, str]) -> dict[str, ProbeResult | None]:
    """Run (or recall) the child probe of several families at once.

    Args:
        targets: family -> ``"module:Class"`` of its Backend.
    Returns:
        family -> the child's ProbeResult (``available`` False: use it as the probe result;
        True: the in-process probe is safe), or None when isolation is off or impossible.
        Never raises.
    """
    out: dict[str, ProbeResult | None] = {}
    running: dict[str, tuple[str, dict, subprocess.Popen, str]] = {}
    isolate = settings.probe_isolation() and not os.environ.get("COOKTOP_PROBE_CHILD")
    for family, target in targets.items():
        if not isolate:
            out[family] = None
            continue
        try:
            key = driver_key(family, target)
        except Exception as e:  # noqa: BLE001 - never fail a probe over its cache key
            log.debug("no probe key for %s: %s", family, e)
            key = {"family": family, "target": target, "time": time.time()}
        digest = _digest(key)
        if digest in _memo:
            out[family] = _memo[digest]
            continue
        cached = _load_cached(digest)
        if cached is not None:
            _memo[digest] = out[family] = cached
            continue
        try:
            proc, said = _spawn(family, target, 0)
        except OSError as e:
            log.warning("cannot start a %s probe process (%s); probing in-process", family, e)
            out[family] = None
            continue
        running[family] = (digest, key, proc, said)
    limit = _timeout()
    t0 = time.monotonic()
    for family, (digest, key, proc, said) in running.items():
        errors: dict[int, str] = {}
        while True:
            waited = None
            try:
                o, err = proc.communicate(timeout=max(0.1, limit - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                o, err = proc.communicate()
                waited = limit
            res, keep, resume = _verdict(family, proc.returncode, o or "", err or "", waited, errors,
                                         _take_said(said))
            if resume is None:
                break
            try:  # the child died on one device: a new one checks the devices after it
                proc, said = _spawn(family, targets[family], resume)
            except OSError as e:
                log.warning("cannot start a %s probe process (%s); probing in-process", family, e)
                res, keep = None, False
                break
            t0 = time.monotonic()
        out[family] = res
        if res is not None and keep:
            _memo[digest] = res
            _store(digest, key, res)
    return out


def check(family: str, target: str) -> ProbeResult | None:
    """:func:`check_many` for one family."""
    return check_many({family: target})[family]


def _use_argv(family: str, target: str, index: int) -> list[str]:
    """The command of a child that runs ``Family.check_use`` on device ``index`` (tests replace it)."""
    return [*_child_argv(family, target, index), "use"]


def check_use(family: str, target: str, index: int, spawn: bool = True) -> str | None:
    """Run (or recall) ``Family.check_use`` on device ``index`` in a child process, before the
    caller first opens that device; the verdict is kept per driver set like the probe's.

    Returns:
        None: the device may be opened here (it passed, the family has no such check, isolation
        is off, or no child could run); else why it is unusable: the check's error, the signal
        that killed the child (with the driver's first error line), or the timeout
        (``COOKTOP_PROBE_TIMEOUT``, part of the key; a child killed before it reached the check
        is not kept). ``spawn`` False: only a verdict already kept (no child; None when there is none).
        Never raises.
    """
    fam = _family(family)
    if not fam.check_use or not settings.probe_isolation() or os.environ.get("COOKTOP_PROBE_CHILD"):
        return None
    try:
        key = {**driver_key(family, target), "use": index}
    except Exception as e:  # noqa: BLE001 - never fail a check over its cache key
        log.debug("no check key for %s:%d: %s", family, index, e)
        key = {"family": family, "target": target, "use": index, "time": time.time()}
    digest = _digest(key)
    res = _memo.get(digest) or _load_cached(digest, "probe-use")
    if res is None and not spawn:
        return None
    if res is None:
        try:
            fd, said = tempfile.mkstemp(prefix=f"cooktop-probe-{family}-", suffix=".txt")
            os.close(fd)
            proc = subprocess.Popen(_use_argv(family, target, index), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, errors="replace",
                                    env={**_child_env(), "COOKTOP_PROBE_STDERR": said})
        except OSError as e:
            log.warning("cannot start a child to check %s:%d (%s); opening it unchecked", family, index, e)
            return None
        waited = None
        try:
            o, err = proc.communicate(timeout=_timeout())
        except subprocess.TimeoutExpired:
            proc.kill()
            o, err = proc.communicate()
            waited = _timeout()
        errors: dict[int, str] = {}
        got, keep, resume = _verdict(family, proc.returncode, o or "", err or "", waited, errors, _take_said(said))
        if waited is not None and MARK + '{"step": "checking' in (o or ""):
            # a device that needs over the timeout to build one kernel is unfit: kept (a larger
            # COOKTOP_PROBE_TIMEOUT is another key and checks again)
            res, keep = ProbeResult(family, False, reason=(
                f"{fam.name}:{index} is unusable on this machine: the child process checking it before its first "
                f"use ({fam.check_use}) did not finish within {waited:g} s (a hung or very slow kernel compiler; "
                "set COOKTOP_PROBE_TIMEOUT=<seconds> to wait longer)")), True
        elif got is not None:
            res = got
        elif resume is not None:  # it died while checking the device
            res, keep = ProbeResult(family, False, reason=errors[index]), True
        else:  # our module never ran in the child: cannot isolate
            return None
        if keep:
            _memo[digest] = res
            _store(digest, key, res, "probe-use")
    if res.available:
        return None
    return res.reason or f"{fam.name}:{index} is unusable on this machine (checked in a child process)"


def forget() -> None:
    """Drop the in-memory verdicts (the disk cache stays; its key changes with the drivers)."""
    _memo.clear()


# -- the child ------------------------------------------------------------------------------


def _report(**msg: Any) -> None:
    sys.stdout.write(MARK + json.dumps(msg) + "\n")
    sys.stdout.flush()


def child_main(argv: list[str]) -> int:
    """Probe one family, then open, check (``Family.check_device``) and close each of its devices
    from index ``argv[2]`` (default 0) on, reporting each step, each unusable device and the result.

    What a driver writes to stderr while a device is checked is captured: its first line joins the
    reason of a device that fails (a compiler's "unknown target CPU" says more than the exception).
    """
    from ..notices import capture_stderr, set_verbose

    set_verbose(False)  # the child's stderr is the drivers' (the parent logs it); no notices of ours there
    family, target = argv[0], argv[1]
    start = int(argv[2]) if len(argv) > 2 else 0
    use = len(argv) > 3 and argv[3] == "use"
    fam = _family(family)
    os.environ["COOKTOP_PROBE_CHILD"] = "1"
    _report(step=f"loading the {family} backend ({target})")
    mod_name, cls_name = target.split(":")
    try:
        backend = getattr(importlib.import_module(mod_name), cls_name)()
    except Exception as e:  # noqa: BLE001 - reported as the result, like the registry does
        _report(result={"available": False, "reason": f"cannot load the {family} backend: {type(e).__name__}: {e}"})
        return 0
    _report(step=f"probing {family} (listing platforms and devices)")
    res = backend.probe()
    if use:
        return _use_main(backend, fam, res, start)
    if res.available:
        for info in res.devices:
            if info.index < start:
                continue
            _report(step=f"opening {info.selector} ({info.name})" + (f" with {fam.open_call}" if fam.open_call else ""),
                    device=info.index)
            with capture_stderr(keep_python=True, path=os.environ.get("COOKTOP_PROBE_STDERR")) as said:
                error = _open_and_check(backend, fam, info)
            if error is not None:
                first = next((ln.strip() for ln in said.text.splitlines() if ln.strip()), "")
                _report(device_error=[info.index, error + (f" (driver: {first[:200]})" if first else "")])
    _report(result={"available": res.available and bool(res.devices), "reason": res.reason, "hint": res.hint,
                    "devices": len(res.devices)})
    return 0


def _use_main(backend: Any, fam: Family, res: ProbeResult, index: int) -> int:
    """The ``use`` child: open device ``index``, run ``Family.check_use`` on it, report the result
    (``available`` False with the reason when it failed; True when this child lists no such device:
    the caller's listing is its own)."""
    info = next((d for d in res.devices if d.index == index), None) if res.available else None
    if info is None:
        _report(result={"available": True, "reason": f"no device {index} listed in the check process"})
        return 0
    _report(step=f"checking {info.selector} ({info.name}) with {fam.check_use} before its first use",
            device=index)
    from ..notices import capture_stderr

    error = None
    with capture_stderr(keep_python=True, path=os.environ.get("COOKTOP_PROBE_STDERR")) as said:
        try:
            dev = backend.open(index)
        except Exception as e:  # noqa: BLE001 - reported: the device is unusable, with the reason
            error = _first_line(e)
        else:
            try:
                fam.check_before_use(dev)
            except Exception as e:  # noqa: BLE001
                error = f"{info.selector} is unusable on this machine (checked in a child process): {_first_line(e)}"
            finally:
                try:
                    dev.close()
                except Exception:  # noqa: BLE001 - a close that fails is the next open's problem
                    pass
    if error is not None:
        first = next((ln.strip() for ln in said.text.splitlines() if ln.strip()), "")
        error += f" (driver: {first[:200]})" if first else ""
    _report(result={"available": error is None, "reason": error or ""})
    return 0


def _first_line(e: Exception) -> str:
    text = (str(e) if isinstance(e, CooktopError) else f"{type(e).__name__}: {e}").strip()
    return (text.splitlines() or [type(e).__name__])[0][:400]


def _open_and_check(backend: Any, fam: Family, info: Any) -> str | None:
    """Open, check and close one device in the child; None, or why it is unusable: the open's own
    error (a setting the driver refuses says so itself), else ``SEL is unusable on this machine``."""
    try:
        dev = backend.open(info.index)
    except Exception as e:  # noqa: BLE001 - reported: the device is unusable, with the reason
        return _first_line(e)
    try:
        if fam.check_device:
            _report(step=f"checking {info.selector} ({info.name}) with {fam.check_device}", device=info.index)
        fam.check(dev)
    except Exception as e:  # noqa: BLE001
        return f"{info.selector} is unusable on this machine (checked in a probe process): {_first_line(e)}"
    finally:
        try:
            dev.close()
        except Exception as e:  # noqa: BLE001 - a close that fails is the next open's problem
            _report(note=f"{info.selector}: close: {type(e).__name__}: {e}")
    return None


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
