"""Benchmark output: llama-bench's md / csv / json / jsonl, and the ``--plot`` bar chart.

Columns follow llama-bench: model, size, params, backend, device, ngl,
n_batch, test, t/s ("mean ± sd"), plus ``vs llama.cpp`` (cooktop t/s over
the llama.cpp runs interleaved with it) under ``--vs``. A record that failed
shows ``error`` in the t/s cell with a numbered note under the table.

json is an array of records (llama-bench's layout), jsonl one record per
line; each record carries its per-run samples (``samples_ts`` tokens/s,
``samples_s`` seconds) and the machine description (``machine``).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
from typing import Any

from ..format.kvtypes import KVConfig
from .runner import Result

#: Record fields (json/jsonl/csv), in order.
FIELDS = ("model", "model_path", "model_type", "model_size", "model_n_params", "backend", "device", "device_name",
          "n_gpu_layers", "n_batch", "tensor_split", "type_k", "type_v", "flash_attn", "test", "n_prompt", "n_gen",
          "n_depth", "reps", "avg_ts", "stddev_ts",
          "avg_s", "samples_ts", "samples_s", "llama_cpp_ts", "ratio", "error", "placement", "load_ms",
          "timestamp")


def size_text(n: int) -> str:
    """llama-bench's size column: ``606.53 MiB``, ``1.20 GiB``."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def params_text(n: int) -> str:
    """llama-bench's params column: ``1.10 B``, ``292.35 K``."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.2f} K"


def ts_text(r: Result) -> str:
    """``mean ± sd`` tokens/s with llama-bench's two decimals (three below 1 t/s)."""
    if r.avg_ts is None:
        return "error" if r.error else "-"
    d = 2 if r.avg_ts >= 1 else 3
    return f"{r.avg_ts:.{d}f} ± {r.stddev_ts:.{d}f}"


def record(r: Result, machine: dict[str, Any] | None) -> dict[str, Any]:
    """JSON-ready record of one result (fields :data:`FIELDS` plus ``machine``)."""
    ts = r.samples_ts
    rec = {
        "model": r.model.desc, "model_path": r.model.path, "model_type": r.model.file_type,
        "model_size": r.model.size_bytes, "model_n_params": r.model.n_params,
        "backend": r.backend, "device": r.device, "device_name": r.device_name, "n_gpu_layers": r.ngl,
        "n_batch": r.n_batch, "tensor_split": r.split, "type_k": r.kv_text[0], "type_v": r.kv_text[1],
        "flash_attn": r.kv_text[2], "test": r.test.name, "n_prompt": r.test.n_prompt,
        "n_gen": r.test.n_gen, "n_depth": r.test.n_depth, "reps": len(ts), "avg_ts": r.avg_ts, "stddev_ts": r.stddev_ts,
        "avg_s": sum(r.samples_s) / len(r.samples_s) if r.samples_s else None,
        "samples_ts": ts, "samples_s": list(r.samples_s),
        "llama_cpp_ts": sum(r.paired_ts) / len(r.paired_ts) if r.paired_ts else None,
        "ratio": r.ratio, "error": r.error, "placement": r.placement, "load_ms": r.load_ms,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if machine is not None:
        rec["machine"] = machine
    return rec


def from_records(recs: list[dict[str, Any]]) -> list[Result]:
    """Rebuild results from json/jsonl records (``cooktop bench --from FILE``: re-render without re-measuring).

    Raises:
        CooktopError: a record lacks a field of :data:`FIELDS`.
    """
    from ..errors import CooktopError
    from ..format.kvtypes import KVConfig
    from .runner import ModelFacts, TestSpec

    out = []
    for i, d in enumerate(recs):
        try:
            mf = ModelFacts(d["model_path"], d["model"], d["model_size"], d["model_n_params"], 0, d["model_type"])
            ts = d["samples_ts"]
            n = d["n_prompt"] + d["n_gen"]
            paired = [d["llama_cpp_ts"]] if d.get("llama_cpp_ts") else []
            out.append(Result(mf, d["backend"], d["device"], d["device_name"], d["n_gpu_layers"], d["n_batch"],
                              d["tensor_split"], TestSpec(d["n_prompt"], d["n_gen"], d.get("n_depth", 0)),
                              samples_s=list(d["samples_s"]) or [n / t for t in ts], error=d["error"],
                              placement=d.get("placement", ""), load_ms=d.get("load_ms", 0.0), paired_ts=paired,
                              kv=KVConfig.parse(d.get("type_k"), d.get("type_v"), d.get("flash_attn"))))
        except (KeyError, TypeError) as e:
            raise CooktopError(f"benchmark record {i} is not a cooktop bench record (missing {e})") from None
    return out


def to_json(results: list[Result], machine: dict[str, Any]) -> str:
    """A JSON array of :func:`record` s."""
    return json.dumps([record(r, machine) for r in results], indent=2)


def to_jsonl(results: list[Result], machine: dict[str, Any]) -> str:
    """One :func:`record` per line."""
    return "\n".join(json.dumps(record(r, machine)) for r in results)


def to_csv(results: list[Result]) -> str:
    """CSV with a header of :data:`FIELDS`; sample lists are JSON arrays inside their cells."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    for r in results:
        rec = record(r, None)
        rec["samples_ts"], rec["samples_s"] = json.dumps(rec["samples_ts"]), json.dumps(rec["samples_s"])
        w.writerow(rec)
    return buf.getvalue()


def to_markdown(results: list[Result]) -> str:
    """llama-bench's markdown table, plus numbered error notes under it."""
    with_ratio = any(r.backend == "llama.cpp" for r in results)
    with_split = any(r.split for r in results)
    with_kv = any(r.kv != KVConfig() for r in results)  # llama-bench shows type_k / type_v / fa when set
    head = ["model", "size", "params", "backend", "device", "ngl", "n_batch"] + (["ts"] if with_split else []) + \
        (["type_k", "type_v", "fa"] if with_kv else []) + ["test", "t/s"] + (["vs llama.cpp"] if with_ratio else [])
    right = {"size", "params", "ngl", "n_batch", "t/s", "vs llama.cpp"}
    notes: list[str] = []
    rows = []
    for r in results:
        tps = ts_text(r)
        if r.error:
            if r.error not in notes:
                notes.append(r.error)
            tps = f"error [{notes.index(r.error) + 1}]" if r.avg_ts is None else f"{tps} [{notes.index(r.error) + 1}]"
        row = [r.model.desc, size_text(r.model.size_bytes), params_text(r.model.n_params), r.backend, r.device,
               str(r.ngl), str(r.n_batch)] + ([r.split or "-"] if with_split else []) + \
            (list(r.kv_text) if with_kv else []) + [r.test.name, tps]
        if with_ratio:
            row.append(f"{r.ratio:.2f}" if r.ratio is not None else ("1.00" if r.backend == "llama.cpp"
                                                                     and r.avg_ts is not None else "-"))
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["| " + " | ".join(h.ljust(w) if h not in right else h.rjust(w) for h, w in zip(head, widths)) + " |",
             "| " + " | ".join(("-" * (w - 1) + ":") if h in right else "-" * w for h, w in zip(head, widths)) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(c.rjust(w) if h in right else c.ljust(w)
                                       for c, h, w in zip(row, head, widths)) + " |")
    for i, n in enumerate(notes, 1):
        lines.append(f"\n[{i}] {n}" if i == 1 else f"[{i}] {n}")
    return "\n".join(lines)


def _series_label(r: Result, varied: set[str]) -> str:
    label = r.backend if r.backend == "llama.cpp" else f"{r.backend} ({r.device})" if r.backend != r.device \
        else r.backend
    if r.backend == "numpy":
        label = "numpy (cpu)"
    extra = [f"{k}={v}" for k, v in (("ngl", r.ngl), ("b", r.n_batch), ("ts", r.split))
             if k in varied and r.backend != "llama.cpp"]
    return label + (" " + " ".join(extra) if extra else "")


def check_plot_path(path: str, extra: str = "bench") -> None:
    """Refuse a ``--plot`` path up front (before any measurement): its folder must exist and its
    extension (if any; none means PNG) must be a format matplotlib's Agg canvas writes; ``extra``:
    the cooktop extra that installs matplotlib for this command (``bench``, ``quality``).

    Raises:
        CooktopError: no such folder, matplotlib missing, or an unsupported extension (naming the formats).
    """
    import os

    from ..errors import CooktopError
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CooktopError(f"--plot {path}: folder {folder} does not exist")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise CooktopError(f"--plot needs matplotlib: pip install 'cooktop[{extra}]'") from None
    ext = os.path.splitext(path)[1][1:].lower()
    formats = FigureCanvasAgg.get_supported_filetypes()
    if ext and ext not in formats:
        raise CooktopError(f"--plot {path}: matplotlib cannot write '.{ext}' files; use one of "
                           f"{', '.join(sorted(formats))}")


def plot(results: list[Result], path: str, machine_label: str, width_px: int = 1200, height_px: int = 675,
         dpi: int = 100) -> None:
    """Grouped bar chart of mean t/s (error bar: sd) per test (groups) and backend/device (bars),
    one panel per model, titled with the model(s) and machine; values printed on the bars.
    A log scale is used when the bars span more than 30x. Written as PNG of ``width_px x height_px``.

    Raises:
        CooktopError: matplotlib is not installed, or nothing was measured.
    """
    from ..errors import CooktopError
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CooktopError("--plot needs matplotlib: pip install 'cooktop[bench]'") from None
    ok = [r for r in results if r.avg_ts is not None]
    if not ok:
        raise CooktopError("--plot: no successful measurement to plot")
    varied = {k for k, f in (("ngl", lambda r: r.ngl), ("b", lambda r: r.n_batch), ("ts", lambda r: r.split))
              if len({f(r) for r in ok if r.backend != "llama.cpp"}) > 1}
    models = list(dict.fromkeys(r.model.desc for r in ok))
    fig, axes = plt.subplots(1, len(models), figsize=(width_px / dpi, height_px / dpi), dpi=dpi, squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in ok if r.model.desc == model]
        tests = list(dict.fromkeys(r.test.name for r in rs))
        series = list(dict.fromkeys(_series_label(r, varied) for r in rs))
        vals = [r.avg_ts for r in rs if r.avg_ts is not None]  # all of rs (drawn from ok)
        log = max(vals) / max(min(vals), 1e-9) > 30
        width = 0.8 / len(series)
        cmap = plt.get_cmap("tab10")
        for j, s in enumerate(series):
            xs: list[float] = []
            ys: list[float] = []
            es: list[float] = []
            for i, t in enumerate(tests):
                hit = [r for r in rs if r.test.name == t and _series_label(r, varied) == s]
                if hit:
                    avg = hit[0].avg_ts
                    assert avg is not None  # rs is drawn from ok
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(avg)
                    es.append(hit[0].stddev_ts or 0.0)
            bars = ax.bar(xs, ys, width * 0.92, yerr=es, capsize=3, label=s, color=cmap(j % 10))
            ax.bar_label(bars, labels=[f"{y:.3g}" if y < 100 else f"{y:.0f}" for y in ys], fontsize=8,
                         padding=2)
        ax.set_xticks(range(len(tests)), tests)
        ax.set_xlabel("test")
        ax.set_ylabel("tokens / s" + (" (log scale)" if log else ""))
        if log:
            ax.set_yscale("log")
        ax.margins(y=0.15)
        if len(models) > 1:
            ax.set_title(model, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"cooktop bench: {', '.join(models)}\n{machine_label}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
