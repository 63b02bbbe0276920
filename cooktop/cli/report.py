"""``cooktop report``: measure the report suite on this machine's devices into DIR/report.json and
DIR/index.html, or ``--compare`` several reports (``cooktop.report``)."""

from __future__ import annotations

import json
import os

import click

from ..errors import CooktopError
from .common import ray_option
from .group import cli


def _write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it and ``os.replace``, so an
    interrupted run never leaves a truncated file (an earlier one stays whole)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide a page meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_report(doc: dict, out_dir: str) -> tuple[str, str]:
    """Check ``doc`` against the schema and write ``report.json`` and ``index.html`` into ``out_dir``
    (each through a temporary file: an interrupted write leaves the previous file whole).

    Raises:
        CooktopError: the document does not match its schema, or a file cannot be written.
    """
    from ..report import page, schema

    schema.validate(doc)
    js, html = os.path.join(out_dir, "report.json"), os.path.join(out_dir, "index.html")
    try:
        os.makedirs(out_dir, exist_ok=True)
        text = page.render(doc)
        _write_atomic(js, json.dumps(doc, indent=1, default=str))
        _write_atomic(html, text)
    except OSError as e:
        raise CooktopError(f"-o {out_dir}: cannot write the report: {e.strerror or e}") from None
    return js, html


@cli.command("report")
@click.option("-m", "--model", "models", multiple=True, type=click.Path(dir_okay=False),
              help="A model to measure (repeat; default: the suite's synthetic Q4_0 / Q4_K_M / Q8_0 models).")
@click.option("--device", "-dev", "device", default="all", show_default=True,
              help="all (every usable device here, numpy included) or a comma list of selectors.")
@click.option("--quick", is_flag=True, help="The quick suite (tiny models, few runs: ~1 minute).")
@click.option("--full", is_flag=True, help="The full suite (default; ~15 minutes on numpy, PoCL and lavapipe).")
@click.option("-o", "--output", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Folder of report.json and index.html (and, with --compare, of the comparison page).")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="Folder of the synthetic models (reused when there) and the KLD bases (default: -o DIR).")
@click.option("--compare", "compare_mode", is_flag=True,
              help="Compare the REPORTS (report.json files of one suite) instead of measuring.")
@click.option("--no-progress", is_flag=True, help="No progress line on stderr.")
@ray_option
@click.argument("reports", nargs=-1, type=click.Path(dir_okay=False))
def report_cmd(models, device, quick, full, out_dir, work_dir, compare_mode, no_progress, ray_address, reports):
    """What this machine's devices can do: smoke test, per-op roofline, pp / tg / depth speed per weight
    type, KLD against numpy and the -ngl auto plan, in DIR/report.json and a self-contained DIR/index.html.

    With --ray ADDRESS, every live node runs the suite on its own devices (--device all, or NODE/DEVICE
    items) and one page covers them all. With --compare A/report.json B/report.json ..., one table of
    ratios against the first (same suite only).
    """
    from ..report import compare as cmp_mod
    from ..report import page
    from ..report.runner import run_report
    from ..report.suite import SUITES

    if quick and full:
        raise click.UsageError("--quick and --full exclude each other: give one")
    level = "quick" if quick else "full"
    if compare_mode:
        given = [flag for flag, on in (("-m", models), ("--device", device != "all"), ("--quick", quick),
                                       ("--full", full), ("--work-dir", work_dir), ("--ray", ray_address)) if on]
        if given:
            raise click.UsageError(f"--compare reads finished reports; {given[0]} does not apply to it")
        cmp = cmp_mod.compare(list(reports))
        click.echo(cmp_mod.table(cmp))
        for d in cmp["differences"]:
            click.echo(f"differs: {d['what']}: " + " | ".join("-" if v is None else str(v) for v in d["values"]))
        if out_dir:
            here = os.path.realpath(out_dir)  # links resolved: no way around it through a symlink
            ins = [r for r in reports if os.path.dirname(os.path.realpath(r)) == here]
            if ins:
                raise CooktopError(f"-o {out_dir} holds {ins[0]}, whose index.html the comparison would replace; "
                                   f"give another folder")
            path = os.path.join(out_dir, "index.html")
            try:
                os.makedirs(out_dir, exist_ok=True)
                _write_atomic(path, page.render_compare(cmp))
            except OSError as e:
                raise CooktopError(f"-o {out_dir}: cannot write the comparison: {e.strerror or e}") from None
            click.echo(f"cooktop: wrote {path}", err=True)
        return
    if reports:
        raise CooktopError(f"unexpected argument {reports[0]!r} (report files go with --compare)")
    if not out_dir:
        raise CooktopError("cooktop report needs -o DIR (the folder of report.json and index.html)")
    if not device.strip(" ,"):
        raise click.UsageError("--device is empty: give all or a comma list of selectors")
    if ray_address:  # every node: its own devices, -m paths as that node sees them
        from ..report.cluster import cluster_report

        doc = cluster_report(level, ray_address, device, list(models) or None)
        js, html = write_report(doc, out_dir)
        click.echo(f"cooktop: wrote {js} and {html} ({len(doc['nodes'])} node(s))", err=True)
        return
    from ..report.runner import model_entry

    missing = [m for m in models if not os.path.exists(m)]
    if missing:
        raise CooktopError(f"-m {missing[0]}: no such file")
    for m in models:  # a file that is no readable GGUF is refused before anything is measured
        err = model_entry(os.path.abspath(m))["error"]
        if err:
            raise CooktopError(f"-m {m}: {err}")
    doc = run_report(SUITES[level], out_dir, list(models) or None, device, progress=not no_progress,
                     work_dir=work_dir)
    asked = {p.strip().lower() for p in device.split(",")}
    for d in doc["devices"]:  # the asked devices that could not be measured, and why
        if not d.get("measured") and d.get("reason") and (d["selector"] in asked or not d.get("family")):
            click.echo(f"cooktop: {d['selector']} not measured: {d['reason']}", err=True)
    if not any(d.get("measured") for d in doc["devices"]):  # nothing written: an earlier report stays
        raise CooktopError(f"no device of --device {device} could be measured (each one's reason is above); "
                           f"nothing written to {out_dir}")
    js, html = write_report(doc, out_dir)
    failed = [s for s in doc["steps"] if not s["ok"]]
    for s in failed:
        click.echo(f"cooktop: step {s['step']} {s['device']} failed: {s['error']}", err=True)
    for r in doc["recommendations"]:
        click.echo(f"{os.path.basename(r['model'])}: --device {r['device'] or '-'} -ngl "
                   f"{r['n_gpu_layers'] if r['n_gpu_layers'] is not None else '-'} ({r['reason']})")
    click.echo(f"cooktop: wrote {js} and {html} in {doc['seconds']} s ({len(failed)} failed step(s))", err=True)
