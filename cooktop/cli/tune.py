"""``cooktop tune``: time the kernel variants of the search space on a device at a model's shapes,
keep the fastest that give the default's results, and cache the choice for the device
(:mod:`cooktop.backends.tune`)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from tabulate import tabulate

from ..backends import registry
from ..backends.tune import cache, space, tuner
from ..errors import CooktopError
from ..quantize.rows import quantize_rows
from .common import resolve_model
from .group import cli


def _devices(selector: str | None) -> list[str]:
    """The OpenCL / Vulkan devices ``--device`` names (default: every usable one)."""
    if selector is not None:
        sels = registry.resolve(selector)
    else:
        sels = [d.selector for fam in ("opencl", "vulkan") for d in registry.probe(fam).devices
                if registry.probe(fam).available]
    out = [s for s in sels if s.split(":")[0] in ("opencl", "vulkan")]
    if not out:
        raise CooktopError(f"cooktop tune: no OpenCL or Vulkan device in {selector or 'this machine'} "
                           "(the numpy backend has no launch parameters to tune)")
    return out


def _bar(total: int, desc: str) -> Any:
    """A tqdm bar on stderr (tqdm is a dependency), or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="candidate", file=sys.stderr, leave=False)


def _params(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in p.items()) or "-"


@cli.command("tune")
@click.option("-m", "--model", "model", default=None, type=click.Path(exists=True, dir_okay=False),
              help="GGUF model whose weight shapes (and data) are timed (default: 1.1B-llama shapes, "
                   "Q4_0, Q4_K, Q6_K, Q8_0).")
@click.option("--device", "-dev", "device", default=None,
              help="Device(s) to tune, e.g. opencl:0 or vulkan:0,opencl:0 (default: every OpenCL and Vulkan device).")
@click.option("--budget", type=click.FloatRange(min=1.0), default=120.0, show_default=True,
              help="Seconds of tuning per device at most (kernel compiles included).")
@click.option("--runs", type=click.IntRange(min=1, max=50), default=5, show_default=True,
              help="Timings per candidate (the median is kept).")
@click.option("--prompt-tokens", type=click.IntRange(min=2, max=4096), default=64, show_default=True,
              help="Tokens of the prompt-matmul and rmsnorm cases.")
@click.option("--reset", is_flag=True, help="Forget the cached choice of the device(s) (today's defaults) and exit.")
@click.option("--space", "show_space", is_flag=True, help="Print the search space and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the tuning records as JSON.")
def tune_cmd(model: str | None, device: str | None, budget: float, runs: int, prompt_tokens: int, reset: bool,
             show_space: bool, as_json: bool) -> None:
    """Tune launch parameters (work-group sizes, rows per work-item, prefetch distance) per device.

    Each candidate of the search space (`cooktop tune --space`) is timed on the device at the
    model's real shapes (warm-up, median of --runs) and checked against the default's output
    (bit for bit where the kernel promises it, else within the op's parity bound) before it may be
    chosen. The choice is cached per device and driver version and used whenever the device
    opens; `cooktop --no-tune` or COOKTOP_NO_TUNE=1 opens it with the defaults.
    """
    if show_space:
        rows = [[r["flavour"], r["family"], "per type" if r["per_type"] else "device",
                 _params({k: "/".join(map(str, v)) for k, v in r["params"].items()}) if r["params"] else r["note"],
                 "bit for bit" if r["exact"] else "parity bound"] for r in space.table()]
        click.echo(tabulate(rows, headers=["backend", "family", "choice", "values", "check"]))
        return
    sels = _devices(device)
    if reset:
        for sel in sels:
            info = registry.device_info(sel)
            click.echo(f"{sel}: {'forgot the tuned choice' if cache.forget(info) else 'was not tuned'}")
        return
    path = resolve_model(model, None, None) if model else None
    records = {}
    for sel in sels:
        dev = registry.open_device(sel)
        try:
            weights = (tuner.model_shapes(path, [t for t in _types(path) if dev.info.supports("matmul", t)])
                       if path else tuner.synthetic_shapes(quantize_rows))
            types = [w[0] for w in weights]
            bar = _bar(tuner.total_candidates(dev, types), f"tuning {sel}")
            seen: dict[str, int] = {}

            def progress(key: str, i: int, n: int, bar: Any = bar, seen: dict[str, int] = seen) -> None:
                if bar is not None:
                    bar.set_postfix_str(key)
                    bar.update(i - seen.get(key, 0))
                seen[key] = i

            rec = tuner.tune(dev, weights, budget_s=budget, runs=runs, n_prompt=prompt_tokens, progress=progress)
            if bar is not None:
                bar.close()
            rec["model"] = path
            where = cache.store(dev.info, merge(cache.load(dev.info), rec))
        finally:
            dev.synchronize()  # the registry's device: it stays open, running the chosen parameters
        records[sel] = dict(rec, cache=where)
        if not as_json:
            _print(sel, dev.info.name, rec, where)
    if as_json:
        click.echo(json.dumps(records, indent=2, default=str))


def merge(old: dict | None, new: dict) -> dict:
    """The record to cache after tuning ``new``'s kernels: ``old``'s choice and report for the kernels
    ``new`` did not tune (another model's weight types) kept, ``new``'s for the ones it did."""
    if not old:
        return new
    tuned = {r["kernel"] for r in new["report"]}
    choice = {k: v for k, v in old.get("choice", {}).items() if k not in tuned}
    choice.update(new["choice"])
    report = [r for r in old.get("report", []) if r.get("kernel") not in tuned] + new["report"]
    return dict(new, choice=choice, report=report)


def _types(path: str) -> list[Any]:
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader

    return sorted({T(int(t.tensor_type)) for t in GGUFReader(path).tensors if len(t.shape) == 2}, key=int)


def _print(sel: str, name: str, rec: dict, where: str) -> None:
    rows = [[r["kernel"], r["shape"], _params(r["chosen"]) + ("" if r["chosen"] != r["default"] else " (default)"),
             f"{r['default_ms']:.3f}", f"{r['chosen_ms']:.3f}", f"{r['speedup']:.2f}x",
             f"{r['tried']}" + (f" ({len(r['rejected'])} rejected)" if r["rejected"] else "")
             + (f", {r['skipped']} skipped" if r["skipped"] else "")]
            for r in rec["report"]]
    click.echo(f"{sel} ({str(name).strip()}): tuned in {rec['tuning_s']:.1f} s (budget {rec['budget_s']:.0f} s"
               + ("" if rec["complete"] else ", ran out: the rest stays default") + ")")
    click.echo(tabulate(rows, headers=["kernel", "shape", "chosen", "default ms", "tuned ms", "speedup", "tried"]))
    click.echo(f"cached in {where}")
