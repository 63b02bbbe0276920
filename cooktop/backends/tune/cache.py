"""The tuned-choice cache: one JSON file per device identity and driver version, beside the probe
cache (``<cache_dir>/tune/<digest>.json``; ``<cache_dir>/probe`` holds safeprobe's verdicts).

The key is the device's backend, name, vendor, platform, driver version, device type, compute units
and the search space's :data:`~.space.SPACE_VERSION`: a new driver, another card in the same
slot or a changed space makes the old file unused (it stays on disk, harmless). A device opens with
its cached choice (:func:`load_choice`), or with today's defaults when there is none, when the file
cannot be read, or with ``COOKTOP_NO_TUNE=1`` (``cooktop --no-tune``). Nothing here ever tunes:
only ``cooktop tune`` (:mod:`.tuner`) writes the cache.

File layout: ``{"key": {...}, "choice": {family key: {param: value}}, "report": [...],
"tuning_s": float, "budget_s": float, "complete": bool, "cooktop": version}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

from ... import settings
from ...notices import cache_dir
from .space import SPACE_VERSION

log = logging.getLogger(__name__)


def device_key(info: Any) -> dict[str, Any]:
    """What a tuned choice depends on: the device's identity and driver version (JSON-ready)."""
    return {"backend": info.backend, "name": str(info.name).strip(), "vendor": str(info.vendor).strip(),
            "platform": str(info.platform).strip(), "driver_version": str(info.driver_version).strip(),
            "device_type": info.device_type, "compute_units": info.compute_units, "space": SPACE_VERSION}


def path_for(info: Any) -> str:
    """The cache file of ``info``'s device (it may not exist)."""
    digest = hashlib.sha256(json.dumps(device_key(info), sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(cache_dir("tune"), f"{digest}.json")


def load(info: Any) -> dict[str, Any] | None:
    """The cached tuning record of ``info``'s device, or None (none, unreadable, another key).
    Never raises; ignores ``COOKTOP_NO_TUNE`` (:func:`load_choice` honours it)."""
    path = path_for(info)
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.info("ignoring the tuning cache %s: %s", path, e)
        return None
    if not isinstance(rec, dict) or rec.get("key") != device_key(info) or not isinstance(rec.get("choice"), dict):
        return None
    return rec


def load_choice(info: Any) -> dict[str, dict[str, int]]:
    """The choice a device opens with: the cache's, or ``{}`` (today's defaults) when there is none
    or ``COOKTOP_NO_TUNE`` is on. Never raises (a malformed setting reads as off here;
    ``cooktop`` refuses it before any command runs)."""
    try:
        if settings.no_tune():
            return {}
    except settings.SettingError:
        return {}
    rec = load(info)
    return dict(rec["choice"]) if rec else {}


def store(info: Any, record: dict[str, Any]) -> str:
    """Write ``record`` (``choice``, ``report``...; the key is added) as ``info``'s device's cache
    file, atomically. Returns its path.

    Raises:
        OSError: the cache folder cannot be written.
    """
    from ...version import __version__

    path = path_for(info)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rec = dict(record, key=device_key(info), cooktop=__version__)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def forget(info: Any) -> bool:
    """Remove ``info``'s device's cache file (``cooktop tune --reset``); True if there was one."""
    try:
        os.remove(path_for(info))
        return True
    except FileNotFoundError:
        return False


def summary(info: Any) -> dict[str, Any] | None:
    """What ``cooktop devices --json`` shows under ``tuned``: ``{"choice", "speedups", "tuning_s",
    "complete", "active"}`` (``active``: False under ``COOKTOP_NO_TUNE``), or None (never tuned)."""
    rec = load(info)
    if rec is None:
        return None
    try:
        active = not settings.no_tune()
    except settings.SettingError:
        active = False
    return {"choice": rec["choice"], "active": active, "tuning_s": rec.get("tuning_s"),
            "complete": rec.get("complete"), "path": path_for(info),
            "speedups": {r["kernel"]: r.get("speedup") for r in rec.get("report", []) if "kernel" in r}}
