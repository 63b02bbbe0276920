"""What a benchmark ran on: CPU model, cores, OS, Python, package versions, device drivers.

Everything here is read without opening a device (probes only), and never
raises: an unknown value is ``None`` or ``""``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

#: Distributions whose versions go into every benchmark record.
PACKAGES = ("cooktop", "numpy", "gguf", "pyopencl", "kp", "llama_cpp_python", "matplotlib")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` "model name", else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def physical_cores() -> int | None:
    """Physical core count (psutil when installed), else ``None``."""
    try:
        import psutil
        return psutil.cpu_count(logical=False)
    except Exception:  # noqa: BLE001 - optional dependency, optional answer
        return None


def package_versions() -> dict[str, str | None]:
    """Installed version of each distribution in :data:`PACKAGES` (``None`` when absent)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_drivers() -> dict[str, dict[str, str]]:
    """Per usable device selector: name and driver/platform version, from the registry's probes."""
    from ..backends import registry

    out: dict[str, dict[str, str]] = {}
    for fam, res in registry.probe_all().items():
        if not res.available:
            out[fam] = {"unavailable": res.reason}
            continue
        for d in res.devices:
            out[d.selector] = {"name": d.name, "platform": d.platform, "driver_version": d.driver_version}
    return out


def machine_info() -> dict[str, Any]:
    """JSON-ready description of this machine (keys: cpu, cores_logical, cores_physical, memory_bytes,
    os, python, packages, devices)."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {
        "cpu": cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": physical_cores(),
        "memory_bytes": mem,
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "devices": device_drivers(),
    }


def short_label(info: dict[str, Any]) -> str:
    """One line for plot titles, e.g. ``Intel Xeon ... (2 cores), Linux``."""
    cpu = " ".join(str(info.get("cpu", "")).replace("(R)", "").replace("(TM)", "").split())
    return f"{cpu} ({info.get('cores_logical')} threads), {platform.system()}"
