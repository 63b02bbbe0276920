"""Driver probes in a child process: a driver that aborts or hangs takes down the child, not the caller.

Some driver calls end the process in C/C++ where no ``except`` can catch them:
``kp.Manager()`` aborts (SIGABRT) when the Vulkan loader has no driver, a
broken ICD can segfault inside ``vkCreateInstance`` or ``clGetPlatformIDs``,
and a driver can hang. So before the registry probes a family in the user's
process, :func:`check` runs the same probe in a child (``python -m
cooktop.backends.safeprobe FAMILY module:Class``) with a timeout: the child
probes, then opens and closes every device it found (for Vulkan that is
``kp.Manager(i)``, the call that aborts), reporting each step on stdout.

- The child finished and found nothing usable: its :class:`ProbeResult` (reason
  and hint) is the answer; the user's process makes no driver call.
- The child finished with devices: the caller probes in-process (the same calls
  just succeeded with the same drivers).
- The child died (a signal, an exit without a result) or did not answer within
  ``COOKTOP_PROBE_TIMEOUT`` seconds (default :data:`TIMEOUT_S`): the family is
  unavailable, with a reason naming the step, the signal and the drivers found.

Verdicts are kept per *driver set* (memory, and ``<cache_dir>/probe/*.json``):
the key holds the environment variables that steer loaders and drivers
(``VK_*``, ``OCL_*``, ``POCL_*``, ``LD_LIBRARY_PATH``... see :func:`driver_key`),
the driver manifest files with their sizes and modification times (and those of
the libraries they name), the Python executable, the backend modules, and the
boot id, so a new driver, a changed variable or a reboot probes again; a
timeout is never kept. ``COOKTOP_PROBE_ISOLATION=0`` turns the child off
(probes run in-process).
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
import time
from typing import Any

from .. import settings
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
              "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "PATH")

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


def _cache_path(digest: str) -> str:
    return os.path.join(cache_dir("probe"), f"{digest}.json")


def _load_cached(digest: str) -> ProbeResult | None:
    try:
        with open(_cache_path(digest), encoding="utf-8") as f:
            d = json.load(f)["result"]
        return ProbeResult(d["backend"], bool(d["available"]), reason=d.get("reason", ""), hint=d.get("hint", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(digest: str, key: dict, res: ProbeResult) -> None:
    path = _cache_path(digest)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"key": key, "result": {"backend": res.backend, "available": res.available,
                                              "reason": res.reason, "hint": res.hint}}, f, indent=1, default=str)
        os.replace(tmp, path)
    except OSError as e:  # a read-only home only costs a child per process
        log.debug("cannot keep the probe verdict in %s: %s", path, e)


def _timeout() -> float:
    return settings.probe_timeout(TIMEOUT_S)


def _child_argv(family: str, target: str) -> list[str]:
    """The command of a probe child (tests replace it to simulate crashes and hangs)."""
    return [sys.executable, "-m", "cooktop.backends.safeprobe", family, target]


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


def _verdict(family: str, rc: int | None, out: str, err: str, waited: float | None) -> tuple[ProbeResult | None, bool]:
    """(result, keep) from a child's exit code and output; result None: run the probe in-process."""
    steps, result = [], None
    for line in out.splitlines():
        if line.startswith(MARK):
            try:
                msg = json.loads(line[len(MARK):])
            except ValueError:
                continue
            if "step" in msg:
                steps.append(msg["step"])
            if "result" in msg:
                result = msg["result"]
    err_tail = " | ".join(ln.strip() for ln in err.strip().splitlines()[-3:] if ln.strip())[:400]
    if err.strip():
        log.info("%s probe child stderr:\n%s", family, err.rstrip())
    if result is not None:
        res = ProbeResult(family, bool(result["available"]), reason=result.get("reason", ""),
                          hint=result.get("hint", ""))
        return res, True
    if not steps:  # our module never ran (broken install, odd interpreter): cannot isolate
        log.warning("cannot probe %s in a child process (exit %s: %s); probing in-process", family, rc,
                    err_tail or "no output")
        return None, False
    where = steps[-1]
    found = _drivers_found(family)
    if waited is not None:
        return ProbeResult(family, False, reason=f"the {family} probe did not finish within {waited:g} s while "
                           f"{where} (a hung driver?); {found}",
                           hint="set COOKTOP_PROBE_TIMEOUT=<seconds> to wait longer, or COOKTOP_DISABLE="
                           f"{family} to skip it"), False
    how = f"was killed by {_signal_name(rc)}" if rc is not None and rc < 0 else f"exited with code {rc}"
    return ProbeResult(family, False, reason=f"the {family} driver crashed a probe process: it {how} while "
                       f"{where}" + (f" ({err_tail})" if err_tail else "") + f"; {found}"), True


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
    running: dict[str, tuple[str, dict, subprocess.Popen]] = {}
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
            proc = subprocess.Popen(_child_argv(family, target), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, env=_child_env(), text=True, errors="replace")
        except OSError as e:
            log.warning("cannot start a %s probe process (%s); probing in-process", family, e)
            out[family] = None
            continue
        running[family] = (digest, key, proc)
    limit = _timeout()
    t0 = time.monotonic()
    for family, (digest, key, proc) in running.items():
        waited = None
        try:
            o, err = proc.communicate(timeout=max(0.1, limit - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            o, err = proc.communicate()
            waited = limit
        res, keep = _verdict(family, proc.returncode, o or "", err or "", waited)
        out[family] = res
        if res is not None and keep:
            _memo[digest] = res
            _store(digest, key, res)
    return out


def check(family: str, target: str) -> ProbeResult | None:
    """:func:`check_many` for one family."""
    return check_many({family: target})[family]


def forget() -> None:
    """Drop the in-memory verdicts (the disk cache stays; its key changes with the drivers)."""
    _memo.clear()


# -- the child ------------------------------------------------------------------------------


def _report(**msg: Any) -> None:
    sys.stdout.write(MARK + json.dumps(msg) + "\n")
    sys.stdout.flush()


def child_main(argv: list[str]) -> int:
    """Probe one family and open/close each of its devices, reporting steps and the result."""
    family, target = argv[0], argv[1]
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
    if res.available:
        for info in res.devices:
            _report(step=f"opening {info.selector} ({info.name})" + (" with kp.Manager" if family == "vulkan" else ""))
            try:
                dev = backend.open(info.index)
                dev.close()
            except Exception as e:  # noqa: BLE001 - an error is the in-process open's to report
                _report(note=f"{info.selector}: {type(e).__name__}: {e}")
    _report(result={"available": res.available and bool(res.devices), "reason": res.reason, "hint": res.hint,
                    "devices": len(res.devices)})
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
