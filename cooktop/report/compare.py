"""``cooktop report --compare A/report.json B/report.json ...``: several machines' reports in one table
of ratios against the first (the baseline), where their suites match.

Reports are comparable only when they ran the same suite: the same :data:`suite.SUITE_VERSION` and
the same settings (level, shape, tests...); otherwise :func:`check_suites` refuses, naming what
differs. The figures compared (higher is better for the first two, lower for KLD):

- ``bench``: mean tokens/s per (device, weight type, test);
- ``ops``: GB/s per (device, op, type, shape, tokens);
- ``kld``: mean KLD against numpy per (device, weight type).

A ratio is ``other / baseline``; a figure missing on either side has none.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import CooktopError
from .schema import validate


def load(path: str) -> dict:
    """Read and check one report.json.

    Raises:
        CooktopError: unreadable, not JSON, or not a report (its schema).
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise CooktopError(f"--compare {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise CooktopError(f"--compare {path}: not JSON: {e}") from None
    try:
        validate(doc)
    except CooktopError as e:
        raise CooktopError(f"--compare {path}: {e}") from None
    return doc


def check_suites(docs: list[dict], names: list[str]) -> None:
    """Refuse reports of different suites.

    Raises:
        CooktopError: a suite version or setting differs from the first report's, naming both values.
    """
    base = docs[0]["suite"]
    for doc, name in zip(docs[1:], names[1:]):
        s = doc["suite"]
        if s["version"] != base["version"]:
            raise CooktopError(f"cannot compare: suite version {base['version']} ({names[0]}) vs {s['version']} "
                               f"({name}); make both reports with the same cooktop")
        diff = [k for k in sorted(set(base) | set(s)) if base.get(k) != s.get(k)]
        if diff:
            what = ", ".join(f"{k} {base.get(k)!r} vs {s.get(k)!r}" for k in diff)
            raise CooktopError(f"cannot compare: the suites differ ({names[0]} vs {name}): {what}")


def _model_items(doc: dict) -> dict[str, str]:
    """Each model path's row label: its weight type, or ``file name weight type`` where two models of
    the report share a weight type (so their figures stay two rows)."""
    types = [m["weight_type"] for m in doc["models"]]
    return {m["path"]: m["weight_type"] if types.count(m["weight_type"]) == 1 else f"{m['name']} {m['weight_type']}"
            for m in doc["models"]}


def _figures(doc: dict) -> dict[tuple[str, ...], float | None]:
    out: dict[tuple[str, ...], float | None] = {}
    item = _model_items(doc)
    for b in doc["bench"]:
        out[("bench t/s", b["device"], item.get(b["model"], b["weight_type"]), b["test"])] = b["avg_ts"]
    for r in doc["ops"]:
        if r["op"] != "copy" or r["gbps"]:
            out[("ops GB/s", r["device"], f"{r['op']} {r['ggml_type']}", f"{r['shape']} n={r['n_tokens']}")] = r["gbps"]
    for k in doc["kld"]:
        kld = k["summary"]["kld"] if k["summary"] else None
        out[("mean KLD", k["device"], item.get(k["model"], k["weight_type"]), "")] = kld
    return out


def differences(docs: list[dict], names: list[str]) -> list[dict[str, Any]]:
    """What differs between the machines beyond the figures: settings (``COOKTOP_*``, threads), CPU,
    cores, memory, package and driver versions; ``{"what", "values": [one per report]}``."""
    def flat(doc: dict) -> dict[str, Any]:
        m = doc["machine"]
        out = {f"env {k}": v for k, v in doc["environment"].items()}
        out.update({"cpu": m["cpu"], "threads": m["cores_logical"], "memory_bytes": m["memory_bytes"],
                    "os": m["os"], "python": m["python"], "cooktop": doc["cooktop_version"]})
        out.update({f"package {k}": v for k, v in m["packages"].items()})
        for path, label in _model_items(doc).items():  # which file each row measured
            e = next(x for x in doc["models"] if x["path"] == path)
            out[f"model {label}"] = f"{e['name']} ({e['n_params']} parameters, {e['size_bytes']} bytes)"
        for sel, d in m["devices"].items():
            out[f"device {sel}"] = d.get("name", "") + (f" {d.get('driver_version', '')}".rstrip())
        return out
    flats = [flat(d) for d in docs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    return [{"what": k, "values": [f.get(k) for f in flats]} for k in keys
            if len({json.dumps(f.get(k), default=str) for f in flats}) > 1]


def compare(paths: list[str]) -> dict[str, Any]:
    """Load, check and line up reports (module doc).

    Returns:
        ``{"names", "suite", "differences", "rows"}``; each row ``{"figure", "device", "item", "test",
        "values": [...], "ratios": [None, other/baseline...]}``.
    Raises:
        CooktopError: fewer than two reports, one unreadable or invalid, or different suites.
    """
    if len(paths) < 2:
        raise CooktopError("--compare needs at least two report.json files")
    docs = [load(p) for p in paths]
    names = [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in paths]
    if len(set(names)) < len(names):
        names = list(paths)
    check_suites(docs, names)
    figs = [_figures(d) for d in docs]
    keys = list(dict.fromkeys(k for f in figs for k in f))
    rows = []
    for k in keys:
        vals = [f.get(k) for f in figs]
        base = vals[0]
        ratios = [None] + [v / base if v is not None and base else None for v in vals[1:]]
        rows.append({"figure": k[0], "device": k[1], "item": k[2], "test": k[3], "values": vals, "ratios": ratios})
    return {"names": names, "paths": [os.path.abspath(p) for p in paths], "suite": docs[0]["suite"],
            "differences": differences(docs, names), "rows": rows}


def table(cmp: dict, fmt: str = "simple") -> str:
    """The comparison as text (``tabulate``): the baseline's figure, then each other report's ratio."""
    from tabulate import tabulate

    names = cmp["names"]
    head = ["figure", "device", "item", "test", names[0]] + [f"{n} / {names[0]}" for n in names[1:]]
    body = [[r["figure"], r["device"], r["item"], r["test"], "-" if r["values"][0] is None else f"{r['values'][0]:.4g}"]
            + ["-" if x is None else f"{x:.3f}" for x in r["ratios"][1:]] for r in cmp["rows"]]
    return tabulate(body, headers=head, tablefmt=fmt, disable_numparse=True)
