"""The device x weight type report: several model files (one model in several weight types) on
several devices, each compared with one base (``logits_file.py``) by :func:`kld.compare`, in one table
and one plot.

Devices are this machine's (``all``: every usable device of every backend family, numpy
included) or, with a Ray cluster, ``NODE/DEVICE`` selectors (``all``: every usable device of every
live node, ``cluster.nodes.probe_nodes``), each run whole on its device (``-ngl -1``). A cell that
cannot run (a load error, an unreadable file, a device fault) is kept with its reason, so one bad
file or driver does not end the report; a cell part of whose model ran elsewhere (a type the device
lacks stays on the host) keeps the placement's reason as its ``note``, a footnote of the table.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable
from typing import Any

from ..backends import registry
from ..bench import report
from ..errors import CooktopError
from ..format.gguf import open_gguf
from ..runtime.placement import Placement
from .kld import compare
from .logits_file import LogitsFile


@dataclasses.dataclass
class Cell:
    """One (device, model file) measurement.

    Attributes:
        device: selector; model: path; wtype: weight type label (:func:`weight_type`);
        placement: the placement's one-line summary; summary: :meth:`KldStats.summary` (None on error);
        error: why it did not run ("" when it did); note: why part of the model ran elsewhere than
        ``device`` (the placement's summary and reasons; "" when all of it ran there).
    """

    device: str
    model: str
    wtype: str
    placement: str = ""
    summary: dict[str, float] | None = None
    error: str = ""
    note: str = ""


def placement_note(placement: Placement, device: str, cluster: bool = False) -> str:
    """Why a cell's figures are not all ``device``'s: ``""`` when the whole model ran there, else the
    placement's summary and its reasons (``offloaded 1/2 layers: ...; block 0 stays on cpu: vulkan:0
    cannot run matmul on BF16``). With ``cluster`` (``NODE/DEVICE`` selectors) only the reasons count."""
    if not placement.notes and (cluster or set(placement.devices()) == {device}):
        return ""
    return "; ".join([placement.summary(), *placement.notes])


def labels(models: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The weight-type label of each file (:func:`weight_type`), with the file name added where two
    files share a label (``Q4_K (a.gguf)``); a file that cannot be read gets ``?`` and its name.

    Returns:
        ``{path: label}``, and ``{path: error}`` of the files that could not be read (one line each).
    """
    types: dict[str, str] = {}
    errors: dict[str, str] = {}
    for m in models:
        try:
            types[m] = weight_type(m)
        except (CooktopError, OSError) as e:
            types[m] = f"? ({os.path.basename(m)})"
            errors[m] = str(e).splitlines()[0] if str(e) else type(e).__name__
    seen: dict[str, int] = {}
    for t in types.values():
        seen[t] = seen.get(t, 0) + 1
    return {m: t if seen[t] == 1 else f"{t} ({os.path.basename(m)})" for m, t in types.items()}, errors


def weight_type(path: str | os.PathLike) -> str:
    """The weight types of a GGUF's 2-D tensors, the most parameters first (``Q4_K+Q6_K`` for a mixture).

    Raises:
        GGUFError: the file is not a readable GGUF.
    """
    gf = open_gguf(path)
    counts: dict[str, int] = {}
    for t in gf.tensors.values():
        if len(t.shape) >= 2:
            name = getattr(t.ggml_type, "name", str(t.ggml_type))
            counts[name] = counts.get(name, 0) + math.prod(t.shape)
    return "+".join(sorted(counts, key=lambda k: -counts[k])) or "?"


def local_devices(spec: str) -> list[str]:
    """Selectors of ``spec`` on this machine: ``all`` = every device that passes its smoke test (numpy
    last); else a comma list of selectors (``cpu,opencl:0,vulkan:0``; ``opencl`` = opencl:0).

    Raises:
        DeviceError: a selector names no device here.
    """
    if spec.strip().lower() != "all":
        out = []
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            out += registry.resolve(part)
        return list(dict.fromkeys(out))
    sels = []
    for fam in registry.FAMILIES:
        res = registry.probe(fam)
        if res.available:
            sels += [d.selector for d in res.devices
                     if d.selector == registry.REFERENCE or registry.smoke_test(d.selector).ok]
    return [s for s in sels if s != registry.REFERENCE] + [registry.REFERENCE]


def cluster_devices(spec: str, ray_address: str | None) -> list[str]:
    """``NODE/DEVICE`` selectors of ``spec`` on a Ray cluster: ``all`` = every usable device of every
    live node (head node first); else a comma list (``alpha/opencl:0,beta/cpu``, ``auto``).

    Raises:
        ClusterError: Ray missing, the cluster unreachable. DeviceError: an unknown device.
    """
    from ..cluster.connect import address_from, connect
    from ..cluster.nodes import list_nodes, probe_nodes, resolve

    connect(address_from(ray_address))
    nodes = list_nodes()
    if spec.strip().lower() != "all":
        return resolve(spec, nodes, probe_nodes)
    probes = probe_nodes(nodes)
    return [f"{n.name}/{d}" for n in nodes for d in probes[n.node_id]["devices"]]


def measure(models: Iterable[str], devices: Iterable[str], base: LogitsFile, n_batch: int, n_chunks: int = -1,
            ray_address: str | None = None, on_cell: Callable[[Cell], None] | None = None) -> list[Cell]:
    """Compare every model file on every device with ``base`` (module doc), devices outer.

    Args:
        models: GGUF paths (the same vocabulary as the base); devices: selectors (``NODE/DEVICE`` with a
        cluster); n_batch: tokens per pass; n_chunks: at most this many of the base's chunks (< 0: all);
        ray_address: the cluster of ``NODE/DEVICE`` selectors (None: this machine);
        on_cell: called with each finished cell.
    Returns:
        the cells, one per (device, model); a file that cannot be read or loaded, or a device that
        fails, gives cells with their ``error`` and the others go on.
    """
    from ..cluster.nodes import is_cluster_selector
    from ..runtime.loader import load_model

    models = list(models)
    types, unreadable = labels(models)
    cells = []
    for dev in devices:
        for path in models:
            cell = Cell(dev, path, types[path])
            if path in unreadable:
                cell.error = unreadable[path]
                cells.append(cell)
                if on_cell is not None:
                    on_cell(cell)
                continue
            try:
                kw: dict[str, Any] = dict(n_ctx=base.n_ctx, n_batch=min(n_batch, base.n_ctx), device=dev,
                                          n_gpu_layers=-1, logits_all=True)
                if ray_address or is_cluster_selector(dev):
                    from ..cluster.load import load_model as cluster_load

                    m = cluster_load(path, ray_address=ray_address, **kw)
                else:
                    m = load_model(path, **kw)
                try:
                    cell.placement = m.placement.summary()
                    cell.note = placement_note(m.placement, dev, bool(ray_address or is_cluster_selector(dev)))
                    v = m.tokenizer.vocab
                    cell.summary = compare(m.model, base, n_batch, v.bos_id if v.add_bos else None, n_chunks).summary
                finally:
                    m.model.close()
            except (CooktopError, OSError) as e:
                cell.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            cells.append(cell)
            if on_cell is not None:
                on_cell(cell)
    return cells


HEADERS = ["device", "weights", "mean KLD", "99% KLD", "same top p", "RMS Δp", "PPL", "ln(PPL/PPL base)"]


def rows(cells: list[Cell]) -> list[list[str]]:
    """The table's rows (:data:`HEADERS`), figures as llama.cpp prints them (± uncertainty); a cell with
    a placement note has ``[n]`` after its device, the n-th of :func:`footnotes`."""
    out = []
    n_note = 0
    for c in cells:
        s = c.summary
        dev = c.device
        if c.note and s is not None:
            n_note += 1
            dev = f"{c.device} [{n_note}]"
        if s is None:
            out.append([dev, c.wtype, f"error: {c.error}", "", "", "", "", ""])
            continue
        out.append([dev, c.wtype, f"{s['kld']:.6f} ± {s['kld_unc']:.6f}", f"{s['kld_p99']:.6f}",
                    f"{100 * s['same_top']:.3f} ± {100 * s['same_top_unc']:.3f} %",
                    f"{100 * s['rms_dp']:.3f} ± {100 * s['rms_dp_unc']:.3f} %",
                    f"{s['ppl']:.4f} ± {s['ppl_unc']:.4f}", f"{s['ln_ratio']:.5f} ± {s['ln_ratio_unc']:.5f}"])
    return out


def footnotes(cells: list[Cell]) -> list[str]:
    """``[n] DEVICE FILE: note`` for each measured cell part of whose model ran on another device."""
    noted = [c for c in cells if c.note and c.summary is not None]
    return [f"[{i}] {c.device} {os.path.basename(c.model)}: {c.note}" for i, c in enumerate(noted, 1)]


def format_table(cells: list[Cell], fmt: str = "github") -> str:
    """The cells as one table (``tabulate`` format ``fmt``: ``github`` for Markdown, ``simple``...), then
    its :func:`footnotes` (after a blank line)."""
    from tabulate import tabulate

    table = tabulate(rows(cells), headers=HEADERS, tablefmt=fmt, disable_numparse=True)
    notes = footnotes(cells)
    return "\n".join([table, "", *notes]) if notes else table


def files_label(paths: list[str]) -> str:
    """A short name for several model files: ``tiny-*.gguf (10 files)`` when they share a prefix, else their names."""
    names = [os.path.basename(p) for p in paths]
    prefix = os.path.commonprefix(names)
    if len(names) > 2 and prefix:
        return f"{prefix}*{os.path.splitext(names[0])[1]} ({len(names)} files)"
    return ", ".join(names)


def check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` path before measuring (:func:`cooktop.bench.report.check_plot_path`,
    matplotlib from the ``quality`` extra).

    Raises:
        CooktopError: no such folder, matplotlib missing (``pip install 'cooktop[quality]'``), or an
            unsupported extension (naming the formats).
    """
    report.check_plot_path(path, extra="quality")


def plot(cells: list[Cell], path: str, title: str, width_px: int = 1200, height_px: int = 560, dpi: int = 100) -> None:
    """Two panels of grouped bars, weight types as groups and devices as bars: mean KLD (log scale,
    error bar: its uncertainty) and "same top p" (%). Written as PNG unless ``path``'s extension says else.

    Raises:
        CooktopError: matplotlib is not installed, or no cell has figures.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CooktopError("--plot needs matplotlib: pip install 'cooktop[quality]'") from None
    ok = [c for c in cells if c.summary is not None]
    if not ok:
        raise CooktopError("--plot: no device ran a model: nothing to plot")
    types = list(dict.fromkeys(c.wtype for c in ok))
    devices = list(dict.fromkeys(c.device for c in ok))
    fig, (ax_k, ax_t) = plt.subplots(1, 2, figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    width = 0.8 / len(devices)
    cmap = plt.get_cmap("tab10")
    for j, dev in enumerate(devices):
        xs, kld, kerr, top, terr = [], [], [], [], []
        for i, t in enumerate(types):
            hit = next((c.summary for c in ok if c.device == dev and c.wtype == t), None)
            if hit is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            kld.append(max(hit["kld"], 1e-7))
            kerr.append(hit["kld_unc"])
            top.append(100 * hit["same_top"])
            terr.append(100 * hit["same_top_unc"])
        ax_k.bar(xs, kld, width * 0.92, yerr=kerr, capsize=2, label=dev, color=cmap(j % 10))
        ax_t.bar(xs, top, width * 0.92, yerr=terr, capsize=2, label=dev, color=cmap(j % 10))
    for ax, label in ((ax_k, "mean KL divergence (nats, log scale)"), (ax_t, "same top p (%)")):
        ax.set_xticks(range(len(types)), types, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    ax_k.set_yscale("log")
    ax_t.set_ylim(0, 105)
    ax_t.legend(fontsize=8, loc="lower left")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
