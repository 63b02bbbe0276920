"""The report page's plots as inline SVG text (matplotlib's SVG backend, ``report`` extra): no file,
no network, pasted into ``index.html`` as ``<svg>`` elements."""

from __future__ import annotations

import io
import re
from typing import Any

from ..errors import CooktopError


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CooktopError("cooktop report's plots need matplotlib: pip install 'cooktop[report]'") from None
    plt.rcParams["svg.fonttype"] = "none"  # text stays text (smaller, searchable)
    return plt


def to_svg(fig: Any) -> str:
    """A matplotlib figure as one ``<svg ...>...</svg>`` element (the XML prolog, DOCTYPE and RDF
    metadata dropped)."""
    plt = _plt()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)  # RDF: creator, date
    return text[text.index("<svg"):]


def grouped_bars(groups: list[str], series: dict[str, list[float | None]], ylabel: str, title: str,
                 log: bool = False, width_in: float = 7.5, height_in: float = 3.2) -> str:
    """Bars of each series (legend) within each group (x axis); ``None`` values are left out.

    Args:
        groups: x labels; series: label -> one value per group (same length as ``groups``).
    Returns:
        the SVG text (``""`` when no value is set: nothing to draw).
    """
    if not any(v is not None for vals in series.values() for v in vals):
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=100)
    width = 0.8 / max(1, len(series))
    cmap = plt.get_cmap("tab10")
    for j, (label, vals) in enumerate(series.items()):
        xs = [i - 0.4 + width * (j + 0.5) for i, v in enumerate(vals) if v is not None]
        ys = [max(v, 1e-9) if log else v for v in vals if v is not None]
        ax.bar(xs, ys, width * 0.92, label=label, color=cmap(j % 10))
    ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, never over a bar
    ax.set_title(title, fontsize=10)
    return to_svg(fig)


def throughput(doc: dict, device: str | None = None) -> str:
    """Tokens/s by weight type, one series per test (of ``device``) or per device and test (all)."""
    rows = [b for b in doc["bench"] if b["avg_ts"] and (device is None or b["device"] == device)]
    types = list(dict.fromkeys(b["weight_type"] for b in rows))
    keys = list(dict.fromkeys(b["test"] if device else f"{b['device']} {b['test']}" for b in rows))
    series: dict[str, list[float | None]] = {k: [None] * len(types) for k in keys}
    for b in rows:
        k = b["test"] if device else f"{b['device']} {b['test']}"
        series[k][types.index(b["weight_type"])] = b["avg_ts"]
    return grouped_bars(types, series, "tokens/s (log)", "throughput by weight type", log=True)


def roofline(doc: dict, device: str | None = None) -> str:
    """Each matmul's GB/s as a % of its device's copy bandwidth, by op row (``bench --ops``)."""
    rows = [r for r in doc["ops"] if r["roofline_pct"] is not None and (device is None or r["device"] == device)]
    labels = list(dict.fromkeys(f"{r['op']} {r['ggml_type']} n={r['n_tokens']}" for r in rows))
    devs = list(dict.fromkeys(r["device"] for r in rows))
    series: dict[str, list[float | None]] = {d: [None] * len(labels) for d in devs}
    for r in rows:
        series[r["device"]][labels.index(f"{r['op']} {r['ggml_type']} n={r['n_tokens']}")] = r["roofline_pct"]
    return grouped_bars(labels, series, "% of copy bandwidth", "roofline fraction")


def kld(doc: dict) -> str:
    """Mean KLD against numpy by weight type, one series per device (log scale)."""
    rows = [k for k in doc["kld"] if k["summary"]]
    types = list(dict.fromkeys(k["weight_type"] for k in rows))
    devs = list(dict.fromkeys(k["device"] for k in rows))
    series: dict[str, list[float | None]] = {d: [None] * len(types) for d in devs}
    for k in rows:
        series[k["device"]][types.index(k["weight_type"])] = k["summary"]["kld"]
    return grouped_bars(types, series, "mean KLD vs numpy (nats, log)", "KLD by weight type", log=True)
