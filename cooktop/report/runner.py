"""Run the report's suite (``suite.py``) on this machine's devices, in-process, into one JSON-ready dict.

Steps, in order (each a record in ``steps`` with its seconds, and its error instead of figures when
it fails, so one failing device or step never ends the run):

1. ``devices``: ``cooktop devices --json`` (:func:`cooktop.cli.devices.devices_report`, smoke tests).
2. ``synth``: the default models (``cooktop synth``, :func:`cooktop.tools.synth.write`) unless ``-m``.
3. per device ``ops``: ``cooktop bench --ops`` (:func:`cooktop.bench.ops.bench_ops`): roofline rows.
4. per device ``bench``: ``cooktop bench`` (:func:`cooktop.bench.runner.run_bench`): ``ppP``, ``tgN``,
   ``tgN @ dD`` of each model, ``-ngl -1``.
5. per model ``kld-base``: the numpy reference's logits over :data:`suite.KLD_TEXT`
   (``cooktop perplexity --kl-divergence-base``), then per device ``kld``
   (``cooktop kld-table``, :func:`cooktop.quality.table.measure`).
6. per device ``plan``: ``cooktop plan --json -ngl auto`` (:func:`cooktop.cli.plan.plan_report`) of each model.

Then :func:`recommend` picks a backend and ``-ngl`` per model from these figures.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import CooktopError
from ..version import __version__
from .suite import KLD_TEXT, Suite

#: report.json's schema version (``schema.py``).
REPORT_SCHEMA = 1

#: Largest mean KLD against numpy (nats) at which a device's figures count as the same model's.
KLD_OK = 0.01


def _err_text(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return msg if isinstance(e, CooktopError) else f"{type(e).__name__}: {msg}"


def _cmd(*parts: Any) -> str:
    return " ".join(shlex.quote(str(p)) for p in parts)


def environment() -> dict[str, str]:
    """The settings that change figures: every ``COOKTOP_*`` and ``*_NUM_THREADS`` variable set."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("COOKTOP_") or k.endswith("_NUM_THREADS")}


class Progress:
    """One tqdm line on stderr over the run's steps: ``device step``, elapsed and time left (tqdm's
    estimate from the steps done); a plain line per step where tqdm is off."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc="report", unit="step", file=sys.stderr, dynamic_ncols=True)

    def start(self, label: str) -> None:
        """Show the step now running."""
        if self.bar is not None:
            self.bar.set_description(label)

    def done(self) -> None:
        """Count one step."""
        if self.bar is not None:
            self.bar.update(1)

    def add(self, n: int) -> None:
        """Steps discovered after the start (per model, per device)."""
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def close(self) -> None:
        """Remove the line."""
        if self.bar is not None:
            self.bar.close()


@dataclasses.dataclass
class Run:
    """A report being built: its dict (``doc``) and the step recorder."""

    doc: dict[str, Any]
    progress: Progress

    def step(self, name: str, device: str, fn: Callable[[], Any], command: str = "") -> Any:
        """Run one step: its record goes to ``doc["steps"]`` (``ok``, ``seconds``, ``error``); returns
        ``fn()``'s value, or None when it raised (the reason is kept, the run goes on)."""
        self.progress.start(f"{device} {name}" if device else name)
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"step": name, "device": device, "command": command, "ok": True, "error": ""}
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - a failing step is a record in the page, not the end
            rec["ok"], rec["error"] = False, _err_text(e)
            rec["traceback"] = traceback.format_exc(limit=4)
            out = None
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        self.doc["steps"].append(rec)
        self.progress.done()
        return out


def flat_devices(rep: dict) -> list[dict]:
    """The devices of a ``devices --json`` report, one dict each with ``family`` (families without a
    device give one entry with ``selector`` = the family, ``usable`` False and the family's reason)."""
    out = []
    for fam, e in rep["families"].items():
        if not e["devices"]:
            out.append({"family": fam, "selector": fam, "usable": False, "name": "", "reason": e["reason"]})
        for d in e["devices"]:
            reason = "" if d["usable"] else (d.get("smoke_detail") or e["reason"] or "unusable")
            out.append({**d, "family": fam, "reason": reason})
    return out


def pick_devices(spec: str, probed: list[dict]) -> tuple[list[str], dict[str, str]]:
    """Selectors to measure: ``all`` = every usable probed device (numpy last), else the comma list.

    Returns:
        (selectors to run, ``{selector: why not}`` of the asked ones that cannot run).
    """
    from ..backends import registry

    usable = [d["selector"] for d in probed if d["usable"]]
    if spec.strip().lower() == "all":
        return [s for s in usable if s != registry.REFERENCE] + [s for s in usable if s == registry.REFERENCE], {}
    run, bad = [], {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        try:
            sels = registry.resolve(part)
        except CooktopError as e:
            bad[part] = _err_text(e)
            continue
        for s in sels:
            if s in usable:
                run.append(s)
            else:
                why = next((d["reason"] for d in probed if d["selector"] == s), "not probed")
                bad[s] = f"unusable: {why}"
    return list(dict.fromkeys(run)), bad


def make_models(suite: Suite, folder: str) -> list[str]:
    """Write the suite's synthetic models into ``folder`` (``synth-v<VERSION>-<LEVEL>-<TYPE>.gguf``, seeded); a file
    already there with the same name is reused. Returns their paths."""
    from ..tools import synth

    os.makedirs(folder, exist_ok=True)
    out = []
    for ty in suite.weight_types:
        path = os.path.join(folder, f"synth-v{suite.version}-{suite.level}-{ty}.gguf")
        if os.path.exists(path) and model_entry(path)["error"]:
            os.unlink(path)  # a damaged or partly written earlier file is made again
        if not os.path.exists(path):
            synth.write(path, suite.shape, ty, seed=suite.seed, name=f"report-{suite.level}")
        out.append(path)
    return out


def run_report(suite: Suite, out_dir: str, models: list[str] | None = None, device: str = "all",
               progress: bool = True, work_dir: str | None = None) -> dict[str, Any]:
    """Measure the suite on this machine (module doc); returns the report dict (``schema.py``).

    Args:
        suite: the suite level; out_dir: the report's folder; work_dir: folder of the synthetic
        models (reused when there), the KLD bases and the text (default ``out_dir``);
        models: GGUF paths (None: the suite's synthetic models); device: ``all`` or a comma list.
    Raises:
        CooktopError: only when a folder cannot be made; everything else becomes step errors.
    """
    from ..bench.machine import machine_info
    from ..cli.devices import devices_report

    out_dir = os.path.abspath(out_dir)
    work_dir = os.path.abspath(work_dir or out_dir)
    for flag, folder in (("-o", out_dir), ("--work-dir", work_dir)):
        try:
            os.makedirs(folder, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()  # writable, before minutes of measuring
        except OSError as e:
            raise CooktopError(f"{flag} {folder}: cannot make or write the folder: {e.strerror or e}") from None
    t_start = time.perf_counter()
    doc: dict[str, Any] = {
        "schema": REPORT_SCHEMA, "suite": suite.to_dict(), "cooktop_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": _cmd("cooktop", "report", f"--{suite.level}", "--device", device,
                        *[x for m in (models or []) for x in ("-m", m)], "-o", out_dir),
        "machine": machine_info(), "environment": environment(), "steps": [], "devices": [], "models": [],
        "ops": [], "bench": [], "kld": [], "plans": [], "recommendations": [],
    }
    run = Run(doc, Progress(3, progress))
    try:
        rep = run.step("devices", "", lambda: devices_report(smoke=True), "cooktop devices --json")
        probed = flat_devices(rep) if rep else []
        sels, bad = pick_devices(device, probed)
        for d in probed:
            d["measured"] = d["selector"] in sels
            if d["selector"] in bad:
                d["reason"] = bad.pop(d["selector"])
        doc["devices"] = probed + [{"family": "", "selector": s, "usable": False, "name": "", "reason": why,
                                    "measured": False} for s, why in bad.items()]
        if models:
            paths = [os.path.abspath(m) for m in models]
            run.progress.done()
        else:
            paths = run.step("synth", "", lambda: make_models(suite, os.path.join(work_dir, "models")),
                             _cmd("cooktop", "synth", "--type", ",".join(suite.weight_types), "..."))
            paths = paths or []
        doc["models"] = [model_entry(p) for p in paths]
        ok_models = [m["path"] for m in doc["models"] if not m["error"]]
        run.progress.add(len(sels) * 3 + len(ok_models) * (1 + len(sels)))
        for sel in sels:
            run.step("ops", sel, functools.partial(_ops, doc, suite, sel), _ops_command(suite, sel))
        for sel in sels:
            run.step("bench", sel, functools.partial(_bench, doc, suite, sel, ok_models),
                     "; ".join(bench_command(suite, m, sel, t) for m in ok_models for t in bench_tests(suite)))
        _kld(run, suite, sels, ok_models, work_dir)
        for sel in sels:
            run.step("plan", sel, functools.partial(_plans, doc, suite, sel, ok_models),
                     "; ".join(plan_command(suite, m, sel) for m in ok_models))
        run.progress.done()
        doc["recommendations"] = recommend(doc)
    finally:
        run.progress.close()
    doc["seconds"] = round(time.perf_counter() - t_start, 1)
    return doc


def model_entry(path: str) -> dict[str, Any]:
    """The report's row of one model file: ``{"path", "name", "desc", "weight_type", "size_bytes",
    "n_params", "error"}``; a file that cannot be read keeps its reason in ``error`` (never raises)."""
    from ..bench.runner import model_facts
    from ..quality.table import weight_type

    try:
        f = model_facts(path)
        return {"path": path, "name": os.path.basename(path), "desc": f.desc, "weight_type": weight_type(path),
                "size_bytes": f.size_bytes, "n_params": f.n_params, "error": ""}
    except Exception as e:  # noqa: BLE001 - an unreadable model is a row of the page
        return {"path": path, "name": os.path.basename(path), "desc": "", "weight_type": "?", "size_bytes": 0,
                "n_params": 0, "error": _err_text(e)}


def _ops_command(suite: Suite, sel: str) -> str:
    return _cmd("cooktop", "bench", "--ops", "--device", sel, "--shape", suite.ops_shape,
                "--types", ",".join(suite.ops_types), *(["--quick"] if suite.ops_quick else []))


def _ops(doc: dict, suite: Suite, sel: str) -> None:
    from ..bench.ops import bench_ops, make_plan

    plan = make_plan(suite.ops_shape, suite.ops_quick, list(suite.ops_types))
    (res,) = bench_ops([sel], plan, seed=0)
    if res.error:
        raise CooktopError(res.error)
    for r in res.rows:
        doc["ops"].append({"device": sel, "op": r.op, "ggml_type": r.ggml_type, "shape": r.shape,
                           "n_tokens": r.n_tokens, "seconds": r.seconds, "gbps": r.gbps, "gflops": r.gflops,
                           "roofline_pct": res.pct(r) if r.op != "copy" else None, "peak_gbps": res.peak_gbps,
                           "peak_source": res.peak_source, "note": r.note, "command": _ops_command(suite, sel)})


def bench_tests(suite: Suite) -> list:
    """The suite's llama-bench tests: ``ppP``, ``tgN``, ``tgN @ dD`` (``bench.runner.TestSpec``)."""
    from ..bench.runner import TestSpec

    return [TestSpec(suite.n_prompt, 0), TestSpec(0, suite.n_gen), TestSpec(0, suite.n_gen, suite.n_depth)]


def bench_command(suite: Suite, model: str, sel: str, test: Any) -> str:
    """The ``cooktop bench`` line that measures one test as the report does."""
    return _cmd("cooktop", "bench", "-m", model, "--device", sel, "-p", test.n_prompt, "-n", test.n_gen,
                *(["-d", test.n_depth] if test.n_depth else []), "-r", suite.reps, "-b", suite.n_batch,
                "-ngl", "-1", "--seed", suite.seed, "-o", "json")


def _bench(doc: dict, suite: Suite, sel: str, models: list[str]) -> None:
    from ..bench.runner import BenchParams, run_bench

    if not models:
        raise CooktopError("no model to measure")
    wt = {m["path"]: m["weight_type"] for m in doc["models"]}
    params = BenchParams(models, bench_tests(suite), [sel], ngl=[-1], n_batch=[suite.n_batch], reps=suite.reps,
                         seed=suite.seed)
    errors = []
    for r in run_bench(params):
        doc["bench"].append({"device": sel, "backend": r.backend, "model": r.model.path,
                             "weight_type": wt[r.model.path],
                             "test": r.test.name, "n_prompt": r.test.n_prompt, "n_gen": r.test.n_gen,
                             "n_depth": r.test.n_depth, "avg_ts": r.avg_ts, "stddev_ts": r.stddev_ts,
                             "samples_ts": r.samples_ts, "placement": r.placement, "error": r.error or "",
                             "command": bench_command(suite, r.model.path, sel, r.test)})
        if r.error:
            errors.append(f"{os.path.basename(r.model.path)} {r.test.name}: {r.error}")
    if errors:
        raise CooktopError("; ".join(dict.fromkeys(errors)))


def kld_text_path(out_dir: str) -> str:
    """Where the KLD text is written (for the commands' ``-f``)."""
    return os.path.join(out_dir, "kld", "text.txt")


def make_base(suite: Suite, model: str, base_path: str) -> str:
    """The numpy reference's logits of ``model`` over :data:`suite.KLD_TEXT` into ``base_path``
    (``cooktop perplexity --kl-divergence-base``: ``kld_chunks`` chunks of ``kld_ctx`` tokens); returns
    ``base_path``.

    Raises:
        CooktopError: the model cannot load on numpy, the text is shorter than one chunk, ...
    """
    from ..quality import perplexity as ppl
    from ..runtime.loader import load_model

    m = load_model(model, n_ctx=suite.kld_ctx, n_batch=suite.kld_ctx, device="cpu", n_gpu_layers=-1, logits_all=True)
    try:
        tokens = ppl.tokenize_text(m.tokenizer, KLD_TEXT)
        ch = ppl.chunking(m.tokenizer, len(tokens), suite.kld_ctx, suite.kld_ctx, suite.kld_chunks)
        ppl.perplexity_saving(m.model, tokens, ch, base_path)
    finally:
        m.model.close()
    return base_path


def _kld(run: Run, suite: Suite, sels: list[str], models: list[str], out_dir: str) -> None:
    from ..quality import table
    from ..quality.logits_file import read_logits_file

    text = kld_text_path(out_dir)
    os.makedirs(os.path.dirname(text), exist_ok=True)
    with open(text, "w") as f:
        f.write(KLD_TEXT)
    wt = {m["path"]: m["weight_type"] for m in run.doc["models"]}
    for i, model in enumerate(models):  # numbered: two models of one file name keep their own bases
        base_path = os.path.join(out_dir, "kld", f"{i}-{os.path.basename(model)}.kld")
        if os.path.exists(base_path):
            os.unlink(base_path)
        made = run.step("kld-base", "cpu", functools.partial(make_base, suite, model, base_path),
                        _cmd("cooktop", "perplexity", "-m", model, "-f", text, "-c", suite.kld_ctx, "-b",
                             suite.kld_ctx, "--chunks", suite.kld_chunks, "--device", "cpu",
                             "--kl-divergence-base", base_path))
        for sel in sels:
            cmd = _cmd("cooktop", "kld-table", "-m", model, "--kl-divergence-base", base_path, "--device", sel,
                       "-b", suite.kld_ctx, "--chunks", suite.kld_chunks, "--json")

            def one(sel=sel, model=model, base_path=base_path, cmd=cmd, made=made) -> None:
                if not made:
                    raise CooktopError("no numpy reference logits (the kld-base step failed)")
                (cell,) = table.measure([model], [sel], read_logits_file(base_path), suite.kld_ctx, suite.kld_chunks)
                run.doc["kld"].append({"device": sel, "model": model, "weight_type": wt[model],
                                       "summary": cell.summary, "placement": cell.placement, "note": cell.note,
                                       "error": cell.error, "command": cmd})
                if cell.error:
                    raise CooktopError(cell.error)
            run.step("kld", sel, one, cmd)


def plan_ctx(suite: Suite) -> int:
    """The context the plans are made for: the depth test's (``n_depth + n_gen`` tokens)."""
    return suite.n_depth + suite.n_gen


def plan_command(suite: Suite, model: str, sel: str) -> str:
    """The ``cooktop plan`` line of one (model, device) plan of the report."""
    return _cmd("cooktop", "plan", "-m", model, "--device", sel, "-ngl", "auto", "-c", plan_ctx(suite), "-b",
                suite.n_batch, "--json")


def _plans(doc: dict, suite: Suite, sel: str, models: list[str]) -> None:
    from ..cli.plan import plan_report

    for model in models:
        cmd = plan_command(suite, model, sel)
        p = plan_report(model, plan_ctx(suite), suite.n_batch, sel, "auto", None)
        doc["plans"].append({"device": sel, "model": model, "n_gpu_layers": p["n_gpu_layers"],
                             "n_offloaded": p["n_offloaded"], "n_layer": p["n_layer"], "summary": p["summary"],
                             "fits": all(d["fits"] for d in p["devices"]), "command": cmd})


def recommend(doc: dict) -> list[dict[str, Any]]:
    """Per model, the device to run it on: the fastest ``tgN`` among the devices whose plan fits and
    whose mean KLD against numpy is at most :data:`KLD_OK` (numpy itself always qualifies), with the
    plan's ``-ngl`` and the reason in words. A model no device qualifies for gets the reasons why."""
    out = []
    tg = doc["suite"]["n_gen"]
    for m in doc["models"]:
        path = m["path"]
        cands, why_not = [], []
        for d in (d for d in doc["devices"] if d.get("measured")):
            sel = d["selector"]
            speed = next((b["avg_ts"] for b in doc["bench"] if b["device"] == sel and b["model"] == path
                          and b["test"] == f"tg{tg}" and b["avg_ts"]), None)
            plan = next((p for p in doc["plans"] if p["device"] == sel and p["model"] == path), None)
            kld = next((k["summary"]["kld"] for k in doc["kld"] if k["device"] == sel and k["model"] == path
                        and k["summary"]), None)
            if speed is None:
                why_not.append(f"{sel}: no tg{tg} figure")
            elif plan is None or not plan["fits"]:
                why_not.append(f"{sel}: the plan does not fit")
            elif sel != "cpu" and (kld is None or kld > KLD_OK):
                why_not.append(f"{sel}: KLD vs numpy {'unmeasured' if kld is None else f'{kld:.2g}'} > {KLD_OK}")
            else:
                cands.append((speed, sel, plan, kld))
        if not cands:
            out.append({"model": path, "device": None, "backend": None, "n_gpu_layers": None,
                        "reason": "no device qualifies: " + ("; ".join(why_not) or "no device was measured")})
            continue
        cands.sort(key=lambda c: -c[0])
        speed, sel, plan, kld = cands[0]
        fam = next(d["family"] for d in doc["devices"] if d["selector"] == sel)
        reason = f"fastest tg{tg}: {speed:.1f} t/s"
        if len(cands) > 1:
            reason += f" ({cands[1][1]}: {cands[1][0]:.1f} t/s)"
        reason += f"; KLD vs numpy {0.0 if kld is None else kld:.2g}; plan: {plan['summary']}"
        if why_not:
            reason += "; not chosen: " + "; ".join(why_not)
        out.append({"model": path, "device": sel, "backend": fam, "n_gpu_layers": plan["n_gpu_layers"],
                    "reason": reason})
    return out
