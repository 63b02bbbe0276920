"""report.json -> index.html: one self-contained page (inline CSS and SVG, no script, no network),
rendered with jinja2 from ``templates/report.html``; ``compare.html`` for ``--compare``."""

from __future__ import annotations

import os
from typing import Any

from ..errors import CooktopError
from . import charts


def fmt(v: Any, digits: int = 3) -> str:
    """A figure for a table cell: ``digits`` significant digits, ``-`` for None."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"
    return str(v)


def anchor(selector: str) -> str:
    """The HTML id of a device's section (``device-opencl-0``)."""
    return "device-" + "".join(c if c.isalnum() else "-" for c in selector)


def _plot(fn: Any, *args: Any) -> Any:
    """A chart's inline SVG, or one line saying why there is none (matplotlib missing)."""
    from markupsafe import Markup, escape

    try:
        return Markup(fn(*args))
    except CooktopError as e:
        return Markup(f'<p class="err">no plot: {escape(str(e))}</p>')


def _env() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = fmt
    env.filters["anchor"] = anchor
    env.filters["basename"] = os.path.basename
    return env


def render(doc: dict) -> str:
    """The report page of one report dict (``schema.py``): a summary, the plots, one section per
    device (its capability, roofline rows, bench figures, KLD, plans and any failed step's reason)."""
    measured = [d for d in doc["devices"] if d.get("measured")]
    sections = []
    for d in measured:
        sel = d["selector"]
        sections.append({
            "dev": d,
            "ops": [r for r in doc["ops"] if r["device"] == sel],
            "bench": [b for b in doc["bench"] if b["device"] == sel],
            "kld": [k for k in doc["kld"] if k["device"] == sel],
            "plans": [p for p in doc["plans"] if p["device"] == sel],
            "failed": [s for s in doc["steps"] if s["device"] == sel and not s["ok"]],
            "plot_ts": _plot(charts.throughput, doc, sel),
            "plot_roof": _plot(charts.roofline, doc, sel),
        })
    plots = {"throughput": _plot(charts.throughput, doc), "roofline": _plot(charts.roofline, doc),
             "kld": _plot(charts.kld, doc)}
    return _env().get_template("report.html").render(doc=doc, sections=sections, plots=plots,
                                                     failed=[s for s in doc["steps"] if not s["ok"]])


def render_compare(cmp: dict) -> str:
    """The side-by-side page of :func:`cooktop.report.compare.compare`'s result."""
    return _env().get_template("compare.html").render(cmp=cmp)
