"""Backend discovery and device selection.

Each family of :data:`.families.FAMILIES` (each ``backends/<family>/`` package's description of
itself) is probed once per process; nothing here names a family. A
probe never raises: a missing package (F_k false), a missing driver or no
device (H_k false), or ``COOKTOP_DISABLE`` becomes an unavailable
:class:`ProbeResult` with a reason and an install hint. A family is usable
when H_k AND F_k; numpy ``cpu`` always is.

Driver calls can abort or hang the process (``kp.Manager()`` with no Vulkan
driver raises SIGABRT in C++), so each family is first probed in a child
process (:mod:`.safeprobe`, verdict kept per driver set); only when the child
found usable devices does the probe (and later ``open``) run here.

The child also opens each device and runs its family's check (``Family.check_device``: OpenCL
builds and runs one small kernel); a device that fails it, or crashes the child, is listed with
the reason (``ProbeResult.errors``, FAIL in ``cooktop devices``) and never opened here. Before
the first open of a device here, a child runs its family's ``check_use`` on it (OpenCL: one real
kernel launched), with the same outcome on failure: a driver
whose build fails may also abort the process at exit, or abort inside its compiler on a real
kernel after the small one built (PyPI's PoCL 3.0-rc2 on some AMD CPUs).

Every opened device is smoke-tested once (a small matmul per supported weight
type and an rmsnorm, against the numpy reference); a device that computes
wrong answers is marked FAIL and never chosen by ``auto``.

Selectors (``--device`` / ``COOKTOP_DEVICE``): ``auto``, ``cpu``, ``opencl``
(its first device), ``opencl:1``, ``vulkan:0``, or a comma list of these.
"""

from __future__ import annotations

import logging
import os
import threading

from .. import notices, settings
from ..errors import DeviceError
from . import safeprobe
from .base import Backend, Device, DeviceInfo, ProbeResult
from .families import DEVICE_FAMILIES, FAMILIES  # noqa: F401  (the registry's interface)
from .family import Family  # noqa: F401

log = logging.getLogger("cooktop")
_lock = threading.RLock()
_backends: dict[str, Backend] = {}
_probes: dict[str, ProbeResult] = {}
_devices: dict[str, Device] = {}
_smoke: dict[str, SmokeResult] = {}
_gates: dict[str, ProbeResult | None] = {}
_use_checked: set[str] = set()


def disabled_families() -> set[str]:
    """Families named in ``COOKTOP_DISABLE`` (comma list), lower-case.

    Raises:
        SettingError: a name that is no family of :data:`FAMILIES`.
    """
    return settings.env_names("COOKTOP_DISABLE", tuple(FAMILIES))


def _load_backend(family: str) -> Backend:
    return FAMILIES[family].load_backend()


def probe(family: str, refresh: bool = False) -> ProbeResult:
    """Probe one family once (cached). Never raises, never crashes or hangs the process: the
    driver calls run in a child process first (:mod:`.safeprobe`)."""
    with _lock:
        if family in _probes and not refresh:
            return _probes[family]
        if refresh:
            _gates.pop(family, None)
        hint = FAMILIES[family].install_hint if family in FAMILIES else ""
        if family not in FAMILIES:
            res = ProbeResult(family, False, reason=f"unknown backend {family!r}")
        elif not FAMILIES[family].reference and family in disabled_families():
            res = ProbeResult(family, False, reason="disabled by COOKTOP_DISABLE", hint="unset COOKTOP_DISABLE")
        elif (gate := _gate(family)) is not None and not gate.available:
            res = gate  # the child found nothing usable (or the driver crashed it): no driver call here
            res.hint = res.hint or hint
        else:
            try:
                backend = _load_backend(family)
            except Exception as e:  # noqa: BLE001 - a probe never raises
                res = ProbeResult(family, False, reason=f"cannot load the {family} backend: "
                                  f"{type(e).__name__}: {e}", hint=hint)
            else:
                try:
                    res = backend.probe()
                except Exception as e:  # noqa: BLE001
                    res = ProbeResult(family, False, reason=f"probe failed: {type(e).__name__}: {e}")
                _backends[family] = backend
                if gate is not None:  # devices the child found unusable: listed, never opened here
                    res.errors = {**gate.errors, **res.errors}
                if not res.hint:
                    res.hint = hint
                if res.available and not res.devices:
                    res.available = False
                    res.reason = res.reason or "no device found"
        _probes[family] = res
        return res


def _gate(family: str) -> ProbeResult | None:
    """The child-process verdict on ``family`` (:mod:`.safeprobe`); None for ``cpu``."""
    if family not in FAMILIES or FAMILIES[family].reference:  # numpy: no driver
        return None
    if family not in _gates:
        try:
            _gates.update(safeprobe.check_many({family: FAMILIES[family].backend}))
        except settings.SettingError:  # a malformed COOKTOP_PROBE_* setting is the user's to fix
            raise
        except Exception as e:  # noqa: BLE001 - a probe never raises; probe in-process as before
            log.warning("the %s probe child failed (%s: %s); probing in-process", family, type(e).__name__, e)
            _gates[family] = None
    return _gates[family]


def probe_all(refresh: bool = False) -> dict[str, ProbeResult]:
    """Probe every family; dict in the order of :data:`FAMILIES` with ``cpu`` last.

    The child-process checks of the families not probed yet run in parallel first.
    """
    with _lock:
        if refresh:
            _gates.clear()
        todo = {n: f.backend for n, f in FAMILIES.items() if not f.reference and n not in _gates
                and n not in disabled_families() and (refresh or n not in _probes)}
        try:
            _gates.update(safeprobe.check_many(todo) if todo else {})
        except settings.SettingError:
            raise
        except Exception as e:  # noqa: BLE001 - each family retries alone in probe()
            log.warning("probe children failed (%s: %s)", type(e).__name__, e)
    return {f: probe(f, refresh) for f in FAMILIES}


def reset() -> None:
    """Forget probes, opened devices and smoke tests (tests use this after changing the environment)."""
    with _lock:
        for d in _devices.values():
            try:
                d.close()
            except Exception:  # noqa: BLE001
                pass
        _backends.clear()
        _probes.clear()
        _gates.clear()
        safeprobe.forget()
        _devices.clear()
        _smoke.clear()
        _use_checked.clear()


def valid_selectors() -> list[str]:
    """Every selector naming a usable device now, e.g. ``["cpu", "opencl:0"]``."""
    out = []
    for res in probe_all().values():
        if res.available:
            out += [d.selector for d in res.devices]
    return out


def parse_selector(sel: str) -> tuple[str, int]:
    """``"opencl:1"`` -> ``("opencl", 1)``; ``"opencl"`` -> ``("opencl", 0)``; ``"cpu"`` -> ``("cpu", 0)``.

    Raises:
        DeviceError: not a valid selector, the family is unusable, or the index is out of range.
    """
    s = sel.strip().lower()
    if "/" in s:  # NODE/DEVICE: a device of a Ray cluster's node (cooktop.cluster)
        raise DeviceError(f"device {sel!r} names a node of a Ray cluster: give --ray ADDRESS (or COOKTOP_RAY, "
                          "or Llama(ray_address=...)) to use it; needs pip install 'cooktop[ray]'")
    fam, _, idx = s.partition(":")
    if fam not in FAMILIES:
        raise DeviceError(f"unknown device {sel!r}: valid devices are {', '.join(valid_selectors())} "
                          f"(or auto)")
    try:
        index = int(idx) if idx else 0
    except ValueError:
        raise DeviceError(f"bad device index in {sel!r}: expected e.g. {fam}:0") from None
    res = probe(fam)
    if not res.available:
        raise DeviceError(f"device {sel!r} is unavailable: {res.reason}"
                          + (f"; to enable: {res.hint}" if res.hint else ""))
    if not any(d.index == index for d in res.devices):
        raise DeviceError(f"no device {sel!r}: valid devices are {', '.join(valid_selectors())}")
    return fam, index


def _check_before_use(fam: str, index: int) -> None:
    """Before this process first opens ``fam:index``: the family's check in a child
    (``Family.check_use``, :func:`.safeprobe.check_use`); a device that fails it joins
    ``probe(fam).errors`` (never opened here). Never raises."""
    key = f"{fam}:{index}"
    if key in _use_checked or key in _devices or index in probe(fam).errors:
        return
    _use_checked.add(key)
    if fam in FAMILIES and not FAMILIES[fam].reference:
        why = safeprobe.check_use(fam, FAMILIES[fam].backend, index)
        if why:
            probe(fam).errors[index] = why


def known_unusable(fam: str, index: int) -> str | None:
    """Why ``fam:index`` is unusable, from what is known without running anything: the probe's
    ``errors`` or a kept verdict of its check before use (:func:`.safeprobe.check_use`); None if
    nothing says so. Never raises."""
    try:
        err = probe(fam).errors.get(index)
        if err or fam not in FAMILIES or FAMILIES[fam].reference:
            return err
        return safeprobe.check_use(fam, FAMILIES[fam].backend, index, spawn=False)
    except Exception:  # noqa: BLE001 - a report never fails over this
        return None


def open_device(sel: str) -> Device:
    """Open (once, cached) the device a single selector names.

    Raises:
        DeviceError: see :func:`parse_selector`, the probe child found the device unusable
            (``ProbeResult.errors``: it is not opened), or the device fails to open.
    """
    fam, index = parse_selector(sel)
    key = f"{fam}:{index}"
    with _lock:
        _check_before_use(fam, index)
        if index in probe(fam).errors:
            raise DeviceError(probe(fam).errors[index])
        if key not in _devices:
            try:
                _devices[key] = _backends[fam].open(index)
            except DeviceError:
                raise
            except Exception as e:  # noqa: BLE001
                raise DeviceError(f"cannot open {key}: {type(e).__name__}: {e}") from e
        return _devices[key]


#: The numpy reference family's name (its selector has no index).
REFERENCE: str = next(n for n, f in FAMILIES.items() if f.reference)


def auto_selectors() -> list[str]:
    """What ``auto`` means on this machine.

    1. the first GPU / iGPU / accelerator device (families in :data:`FAMILIES`
       order) that passes its smoke test;
    2. else the first CPU-type device of a family that says it beats numpy on CPUs
       (``Family.cpu_default``: OpenCL on PoCL) and passes its smoke test;
    3. else the reference (numpy).
    """
    probes = probe_all()
    for fam, res in probes.items():
        if FAMILIES[fam].reference or not res.available:
            continue
        for info in res.devices:
            if info.device_type in ("gpu", "igpu", "accelerator") and smoke_test(info.selector).ok:
                return [info.selector]
    for fam, res in probes.items():
        if not FAMILIES[fam].cpu_default or not res.available:
            continue
        for info in res.devices:
            if info.device_type == "cpu" and smoke_test(info.selector).ok:
                return [info.selector]
    return [REFERENCE]


def device_info(sel: str) -> DeviceInfo:
    """The probed :class:`DeviceInfo` a single selector names (no device is opened).

    Raises:
        DeviceError: see :func:`parse_selector`.
    """
    fam, idx = parse_selector(sel)
    return next(d for d in probe(fam).devices if d.index == idx)


def resolve(selector: str | None) -> list[str]:
    """Expand a ``--device`` value (or ``COOKTOP_DEVICE``, or ``auto``) into single selectors.

    Raises:
        DeviceError: any element names no usable device (message lists the valid ones).
    """
    sel = selector if selector is not None else os.environ.get("COOKTOP_DEVICE", "auto")
    parts = [p.strip() for p in (sel or "auto").split(",") if p.strip()] or ["auto"]
    out: list[str] = []
    for p in parts:
        if p.lower() == "auto":
            out += auto_selectors()
        else:
            fam, idx = parse_selector(p)
            out.append(fam if fam == REFERENCE else f"{fam}:{idx}")
    return out


class SmokeResult:
    """Outcome of a device smoke test: ``ok`` and a one-line ``detail``."""

    def __init__(self, ok: bool, detail: str):
        self.ok = ok
        self.detail = detail

    def __repr__(self) -> str:
        return f"SmokeResult({'PASS' if self.ok else 'FAIL'}: {self.detail})"


def smoke_test(sel: str) -> SmokeResult:
    """Run (once, cached) the smoke test of a device; never raises.

    What the driver writes to the process's stderr meanwhile (PoCL's compiler diagnostics, e.g. pip
    PoCL 3.0-rc2's "unknown target CPU 'generic'" for every kernel) is taken off it: logged at info,
    and on a FAIL its first line joins the one-line detail. (Anything else written to fd 2 during
    the test goes the same way; ``sys.stderr``, notices included, still reaches it.)"""
    from .smoke import run_smoke_test

    with _lock:
        if sel in _smoke:
            return _smoke[sel]
        try:
            fam, index = parse_selector(sel)
            _check_before_use(fam, index)
            unusable = probe(fam).errors.get(index)
        except DeviceError:  # open_device below says why
            unusable = None
        if unusable:  # found unusable by the probe child: not opened here
            _smoke[sel] = SmokeResult(False, unusable)
            return _smoke[sel]
        with notices.capture_stderr(keep_python=True) as said:
            try:
                dev = open_device(sel)
                ok, detail = run_smoke_test(dev)
            except Exception as e:  # noqa: BLE001 - a broken driver is a FAIL, not a crash
                ok, detail = False, f"{type(e).__name__}: {e}".splitlines()[0][:300]
        text = said.text.strip()
        if text:
            log.info("%s wrote to stderr during its smoke test:\n%s", sel, text)
            if not ok:
                first = next(ln.strip() for ln in text.splitlines() if ln.strip())
                detail = f"{detail} (driver: {first[:200]})"
        _smoke[sel] = SmokeResult(ok, detail)
        return _smoke[sel]
