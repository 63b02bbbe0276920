"""``cooktop devices``: every backend family and device, usable or why not, smoke test PASS/FAIL."""

from __future__ import annotations

import json
from typing import Any

import click
from tabulate import tabulate

from ..backends import registry
from .common import ray_option
from .group import cli


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.2f} GiB"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def devices_report(smoke: bool = True) -> dict:
    """JSON-ready report: per family ``available``, ``reason``, ``hint``, and per device the
    :class:`~cooktop.backends.base.DeviceInfo` fields plus ``largest_buffer_bytes`` (the largest
    buffer, ``COOKTOP_DEVICE_MEMORY`` applied: past it tensors go in row chunks), ``smoke_test``
    (``PASS``/``FAIL``) and ``smoke_detail``, ``tuned``: the ``cooktop tune`` choice the device opens
    with (:func:`cooktop.backends.tune.cache.summary`; None: never tuned, today's defaults);
    ``auto`` is what ``--device auto`` picks. Never raises.
    """
    from ..backends.tune import cache as tune_cache

    out: dict = {"families": {}, "auto": None}
    for fam, res in registry.probe_all().items():
        entry: dict[str, Any] = {"available": res.available, "reason": res.reason, "hint": res.hint, "devices": []}
        for info in res.devices:
            d = info.to_dict()
            d["largest_buffer_bytes"] = _largest_buffer(d)  # what an opened device cuts tensors by
            try:
                d["tuned"] = tune_cache.summary(info)
            except Exception as e:  # noqa: BLE001 - the report itself never fails
                d["tuned"] = {"error": str(e)}
            err = res.errors.get(info.index) or registry.known_unusable(fam, info.index)
            if smoke and res.available:
                st = registry.smoke_test(info.selector)
                d["smoke_test"] = "PASS" if st.ok else "FAIL"
                d["smoke_detail"] = st.detail
            elif err:
                d["smoke_test"], d["smoke_detail"] = "FAIL", err
            d["usable"] = res.available and d.get("smoke_test", "PASS") == "PASS"
            entry["devices"].append(d)
        out["families"][fam] = entry
    try:
        out["auto"] = registry.auto_selectors()
    except Exception as e:  # noqa: BLE001 - the report itself never fails
        out["auto"] = f"error: {e}"
    return out


def _rows(rep: dict, prefix: str = "") -> list[list]:
    rows = []
    for fam, e in rep["families"].items():
        if not e["devices"]:
            rows.append([f"{prefix}{fam}", "-", "no", _short(e["reason"], 40), "", "", "", "", "", "", ""])
            continue
        for d in e["devices"]:
            rows.append([
                f"{prefix}{d['selector']}", d["device_type"], "yes" if d["usable"] else "no",
                _short(d["name"], 40),
                _short((d.get("extra") or {}).get("driver") or f"{d['platform']} {d['driver_version']}".strip(), 36),
                _gib(d["global_mem_bytes"]), _gib(d.get("largest_buffer_bytes") or _largest_buffer(d)),
                d["compute_units"] or "?", f"{d['max_workgroup_size'] or '?'}/{d['subgroup_size'] or '?'}",
                ("fp16 " if d["fp16"] else "") + ("int8" if d["int8"] else ""),
                d.get("smoke_test", "-"),
            ])
    return rows


def _largest_buffer(d: dict) -> int | None:
    """The largest buffer of a device (its max allocation, the binding range where smaller, and a
    ``COOKTOP_DEVICE_MEMORY`` ``/MAX`` where given): what an opened device cuts tensors by."""
    from ..settings import device_memory

    caps = [c for c in (d.get("max_buffer_bytes"), d.get("max_alloc_bytes"),
                        device_memory().get(d["selector"].lower(), (0, None))[1]) if c]
    return min(caps) if caps else None


def _notes(rep: dict, prefix: str = "") -> None:
    from ..settings import device_memory

    for fam, e in rep["families"].items():
        for d in e["devices"]:
            click.echo(f"{prefix}{d['selector']}: types {' '.join(d['types'])}")
            sim = device_memory().get(d["selector"].lower())
            if sim is not None:
                click.echo(f"{prefix}{d['selector']}: COOKTOP_DEVICE_MEMORY simulates {_gib(sim[0])}"
                           + (f", largest buffer {_gib(sim[1])}" if sim[1] else ""))
            tuned = d.get("tuned")
            if tuned and tuned.get("choice") is not None:
                chosen = ", ".join(f"{k} {v}" for k, v in tuned["choice"].items()) or "the defaults"
                click.echo(f"{prefix}{d['selector']}: tuned ({'' if tuned.get('active') else 'off: COOKTOP_NO_TUNE, '}"
                           f"cooktop tune): {chosen}")
            if d.get("smoke_test") == "FAIL":
                click.echo(f"{prefix}{d['selector']}: smoke test FAILED: {d['smoke_detail']} (never chosen by auto)")
        if not e["available"]:
            click.echo(f"{prefix}{fam}: unavailable: {e['reason']}"
                       + (f"\n  to enable: {e['hint']}" if e["hint"] else ""))


HEADERS = ["device", "type", "usable", "name", "platform / driver", "memory", "max buffer", "CUs", "wg/sg",
           "features", "smoke"]


@cli.command("devices")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke tests (faster).")
@ray_option
def devices_cmd(as_json: bool, no_smoke: bool, ray_address: str | None) -> None:
    """List compute devices of every backend (cpu, opencl, vulkan) and test each one.

    With --ray, every node of the cluster probes and tests its own devices, listed as NODE/DEVICE.
    """
    if ray_address:
        from ..cluster import connect
        from ..cluster.report import cluster_devices

        connect(ray_address)
        rep = cluster_devices(devices_report, smoke=not no_smoke)
        if as_json:
            click.echo(json.dumps(rep, indent=2, default=str))
            return
        rows = [r for n in rep["nodes"] for r in _rows(n["report"], f"{n['node']}/")]
        click.echo(tabulate(rows, headers=HEADERS))
        click.echo("")
        for n in rep["nodes"]:
            _notes(n["report"], f"{n['node']}/")
        for n in rep["nodes"]:
            auto = n["report"]["auto"]
            auto = [f"{n['node']}/{a}" for a in auto] if isinstance(auto, list) else auto
            click.echo(f"node {n['node']} ({n['address']}, id {n['node_id'][:8]}): auto selects {auto}")
        return
    rep = devices_report(smoke=not no_smoke)
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
        return
    click.echo(tabulate(_rows(rep), headers=HEADERS))
    click.echo("")
    _notes(rep)
    click.echo(f"auto selects: {rep['auto']}")
