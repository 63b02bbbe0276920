"""``cooktop bench``: llama-bench for cooktop (pp / tg / pg sweeps), ``--ops`` roofline, ``--plot``, ``--vs``.

Every list-valued flag takes comma lists and the sweep is every combination.
``--device cpu,opencl`` benchmarks each device separately; ``opencl:0+vulkan:0``
is one configuration split over both devices (in proportion to ``-ts 3/1``,
default by device memory).
"""

from __future__ import annotations

import os
import sys

import click

from ..backends import registry
from ..errors import CooktopError
from ..runtime.placement import TensorPlacement
from .common import parse_ngl, resolve_model
from .group import cli


def _ints(value: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
        raise CooktopError(f"bad {flag} {value!r}: expected integers separated by commas, e.g. 128,512") from None


def _pg(values: tuple[str, ...]) -> list[tuple[int, int]]:
    out = []
    for v in values:
        parts = _ints(v, "-pg")
        if len(parts) != 2:
            raise CooktopError(f"bad -pg {v!r}: expected PROMPT,GEN token counts, e.g. 512,128")
        out.append((parts[0], parts[1]))
    return out


def _kv_configs(type_k: str, type_v: str, flash_attn: str) -> list:
    """Every (-ctk, -ctv, -fa) combination of the comma lists, as ``KVConfig`` s (llama-bench sweeps them).

    Raises:
        KVTypeError: an unknown type or -fa value.
    """
    import itertools

    from ..format.kvtypes import KVConfig

    def locals_value(flag: str) -> str:
        return {"-ctk": type_k, "-ctv": type_v, "-fa": flash_attn}[flag]

    def items(v: str) -> list[str]:
        return [x.strip() for x in str(v).split(",") if x.strip()]

    from ..format.kvtypes import KVTypeError

    lists = {"-ctk": items(type_k), "-ctv": items(type_v), "-fa": items(flash_attn)}
    for flag, vals in lists.items():
        if not vals:
            raise KVTypeError(f"{flag} needs at least one value, got {locals_value(flag)!r}")
    out = [KVConfig.parse(k, v, fa) for k, v, fa in itertools.product(*lists.values())]
    return list(dict.fromkeys(out))


def _devices(value: str | None) -> list[str]:
    """Sweep elements of ``--device``: ``auto`` expands to what it picks; ``a+b`` stays one element.

    Unavailable devices are kept (they become error records)."""
    out = []
    for part in [p.strip() for p in (value or "auto").split(",") if p.strip()]:
        if part.lower() == "auto":
            out.append("+".join(registry.auto_selectors()))
        else:
            out.append("+".join(_canonical(s) for s in part.split("+")))
    return list(dict.fromkeys(out))


def _canonical(sel: str) -> str:
    """``opencl`` -> ``opencl:0`` when the device exists; anything else unchanged (it will be an error row)."""
    try:
        fam, idx = registry.parse_selector(sel)
    except CooktopError:
        return sel.strip().lower()
    return "cpu" if fam == "cpu" else f"{fam}:{idx}"


def _emit(text: str) -> None:
    click.echo(text)


@cli.command("bench")
@click.option("-m", "--model", "models", multiple=True,
              help="GGUF model path(s); comma list or repeated (default: stories260K, cached download).")
@click.option("-p", "--n-prompt", "n_prompt", default="512", show_default=True, help="Prompt tokens (pp tests).")
@click.option("-n", "--n-gen", "n_gen", default="128", show_default=True, help="Generated tokens (tg tests).")
@click.option("-pg", "pg", multiple=True, help="PROMPT,GEN: a pp+tg test (repeatable).")
@click.option("-d", "--n-depth", "n_depth", default="0", show_default=True,
              help="Tokens already in the KV cache before each test (comma list; llama-bench's -d).")
@click.option("-ctk", "--cache-type-k", "cache_type_k", default="f16", show_default=True,
              help="KV cache type of K (comma list): f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1.")
@click.option("-ctv", "--cache-type-v", "cache_type_v", default="f16", show_default=True,
              help="KV cache type of V (comma list).")
@click.option("-fa", "--flash-attn", "flash_attn", default="auto", show_default=True,
              help="Flash attention: on, off, auto (comma list; a quantized V cache needs on or auto).")
@click.option("-r", "--repetitions", "reps", default=5, show_default=True, help="Timed runs per test.")
@click.option("--no-warmup", "no_warmup", is_flag=True,
              help="Skip the warm-up before each test (llama-bench's --no-warmup; default: the test's prompt "
                   "and one generated token, without the depth).")
@click.option("--device", "-dev", "device", default=None, envvar="COOKTOP_DEVICE",
              help="Comma list swept over: auto, cpu, opencl, opencl:1, vulkan:0, or a split like opencl:0+vulkan:0.")
@click.option("-ngl", "--n-gpu-layers", "ngl", default="-1", show_default=True,
              help="Layers to offload (comma list; -1 = all, auto = as many as fit).")
@click.option("-b", "--batch-size", "n_batch", default="512", show_default=True, help="Prompt chunk size (comma list).")
@click.option("-ts", "--tensor-split", "split", default=None,
              help="Proportions for a + split, slash-separated, e.g. 3/1 (comma list).")
@click.option("-ncmoe", "--n-cpu-moe", "n_cpu_moe", type=int, default=0,
              help="Keep the experts of the first N MoE blocks on the host.")
@click.option("-cmoe", "--cpu-moe", "cpu_moe", is_flag=True, help="Keep the experts of every MoE block on the host.")
@click.option("-ot", "--override-tensor", "override_tensor", multiple=True, metavar="REGEX=DEVICE",
              help="Put the tensors whose name matches REGEX on DEVICE (see cooktop run --help).")
@click.option("-o", "--output", "fmt", type=click.Choice(["md", "csv", "json", "jsonl"]), default="md",
              show_default=True)
@click.option("--progress", is_flag=True, help="Show progress on stderr (tqdm).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Write a bar chart of t/s to this file (matplotlib: .png, .svg, .pdf...; no extension: PNG).")
@click.option("--vs", "vs", default=None, help="Also run llama.cpp (llama-cpp-python) interleaved: --vs llama.cpp.")
@click.option("--llama-bench", "llama_bench", default=None,
              help="With --vs llama.cpp: run this llama-bench binary instead (e.g. llama.cpp's Vulkan build from "
                   "scripts/build-llamacpp-vulkan.sh), back to back on the same tests; default: "
                   "$COOKTOP_LLAMA_BENCH.")
@click.option("--from", "from_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Re-render the records of an earlier -o json/jsonl run (no measuring).")
@click.option("--seed", default=1234, show_default=True, help="Seed of the random token ids.")
@click.option("--ops", is_flag=True, help="Op-level roofline instead: copy bandwidth, matmul per type, rmsnorm.")
@click.option("--quick", is_flag=True, help="--ops: fewer shapes, shorter timing (about 20 s per device).")
@click.option("--shape", default="tinyllama-1.1b", show_default=True,
              help="--ops: model shape of the matmuls (cooktop synth shapes).")
@click.option("--types", default=None, help="--ops: comma list of weight types (default: every supported one).")
@click.option("-t", "--threads", "threads", type=int, default=None,
              help="CPU threads of the numpy backend (BLAS); default: all cores.")
@click.option("--batched", is_flag=True,
              help="llama-batched-bench instead: B parallel sequences (-npl) of PP prompt (-npp) and TG "
                   "generated (-ntg) tokens; aggregate and per-sequence t/s.")
@click.option("-npp", "npp", default="128", show_default=True, help="--batched: prompt tokens per sequence (list).")
@click.option("-ntg", "ntg", default="32", show_default=True, help="--batched: generated tokens per sequence (list).")
@click.option("-npl", "npl", default="1,2,4,8", show_default=True, help="--batched: parallel sequences (list).")
def bench_cmd(models, n_prompt, n_gen, pg, n_depth, cache_type_k, cache_type_v, flash_attn, reps, no_warmup, device,
              ngl, n_batch, split, n_cpu_moe, cpu_moe, override_tensor,
              fmt, progress, plot_path, vs, llama_bench, from_file, seed, ops, quick, shape, types, threads, batched,
              npp, ntg, npl):
    """Measure prompt processing (pp) and generation (tg) speed, like llama.cpp's llama-bench
    (``--batched``: llama-batched-bench; ``--ops``: op roofline)."""
    from ..api.options import set_threads
    set_threads(threads)
    if plot_path:
        from ..bench.report import check_plot_path
        check_plot_path(plot_path)
    if ops:
        _ops(device, quick, shape, types, fmt, progress)
        return
    if batched:
        _batched(models, device, ngl, n_batch, npp, ntg, npl, vs, seed, fmt, plot_path)
        return
    from ..bench import runner

    if from_file:
        _render(*_load_records(from_file), fmt, plot_path)
        return
    vs_factory = None
    ext = None  # an external llama-bench binary (bench/llama_bench.py)
    if llama_bench and not vs:
        raise CooktopError("--llama-bench goes with --vs llama.cpp")
    if vs:
        from ..bench import llama_bench as lb
        from ..bench import vs_llamacpp
        binary = llama_bench or os.environ.get(lb.ENV)
        if binary:
            if vs.strip().lower() not in vs_llamacpp.ENGINES:
                raise CooktopError(f"--vs {vs!r}: only {', '.join(vs_llamacpp.ENGINES)} is supported")
            ext = lb.find_binary(binary)
        else:
            try:
                vs_factory = vs_llamacpp.factory(vs)
            except vs_llamacpp.LlamaCppUnavailable:
                click.echo(f"To compare with llama.cpp, {vs_llamacpp.INSTALL_HINT}", err=True)
                raise
    if reps < 1:
        raise CooktopError(f"-r must be at least 1, got {reps}")
    paths = [p.strip() for m in models for p in m.split(",") if p.strip()] or [resolve_model(None, None, None)]
    tests = runner.make_tests(_ints(n_prompt, "-p"), _ints(n_gen, "-n"), _pg(pg), _ints(n_depth, "-d"))
    kvs = _kv_configs(cache_type_k, cache_type_v, flash_attn)
    batches = _ints(n_batch, "-b")
    if any(b <= 0 for b in batches):
        raise CooktopError(f"-b takes positive chunk sizes, got {n_batch}")
    params = runner.BenchParams(
        models=paths, tests=tests, devices=_devices(device),
        ngl=[parse_ngl(v.strip()) for v in str(ngl).split(",") if v.strip()], n_batch=batches,
        split=[s.strip() for s in split.split(",")] if split else [None], reps=reps, seed=seed,
        tensors=TensorPlacement.parse(n_cpu_moe, cpu_moe, override_tensor) if (n_cpu_moe or cpu_moe or override_tensor)
        else None, kv=kvs, warmup=not no_warmup)
    facts = {p: runner.model_facts(p) for p in paths}  # a bad file fails here, before any work
    refs = []
    if ext:
        from ..bench import llama_bench as lb
        dev = next((d for d in params.devices if d.lower().startswith("vulkan")), params.devices[0])
        for p in paths:
            for b in batches:
                for kv in kvs:
                    click.echo(f"cooktop bench: {ext} on {os.path.basename(p)} ({dev}, -b {b}, {kv.label()}, "
                               f"-fa {kv.flash_attn})", err=True)
                    refs += lb.run(ext, facts[p], tests, reps, b, dev, kv=kv, warmup=not no_warmup)
    results = runner.run_bench(params, vs=vs_factory, progress=progress, facts=facts)
    if ext:
        lb.pair(results, refs)
        results += refs
    _render(results, None, fmt, plot_path)


def _load_records(path: str):
    """(results, recorded machine info) from a json (array) or jsonl file written by ``cooktop bench``."""
    import json

    from ..bench import report

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise CooktopError(f"--from {path}: not a text file (expected the JSON written by cooktop bench -o json)") \
            from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise CooktopError(f"--from {path}: not JSON or JSON lines ({e})") from None
    if not isinstance(data, list) or not data:
        raise CooktopError(f"--from {path}: expected a non-empty JSON array (or JSON lines) of bench records")
    machine = data[0].get("machine") if data and isinstance(data[0], dict) else None
    return report.from_records(data), machine


def _render(results, info: dict | None, fmt: str, plot_path: str | None) -> None:
    """Print ``results`` in ``fmt``, write the plot, exit 1 when nothing was measured.

    ``info``: the machine the results come from (None: this one)."""
    from ..bench import machine, report

    info = info or machine.machine_info()
    if fmt == "md":
        _emit(report.to_markdown(results))
    elif fmt == "csv":
        _emit(report.to_csv(results).rstrip("\n"))
    elif fmt == "json":
        _emit(report.to_json(results, info))
    else:
        _emit(report.to_jsonl(results, info))
    for r in results:
        if r.error and fmt != "md":
            click.echo(f"warning: {r.device} {r.test.name}: {r.error}", err=True)
    if plot_path:
        report.plot(results, plot_path, machine.short_label(info))
        click.echo(f"cooktop: wrote {plot_path}", err=True)
    if all(r.avg_ts is None for r in results):
        click.echo("error: no configuration could be measured (see the errors above)", err=True)
        sys.exit(1)


def _ops(device, quick, shape, types, fmt, progress) -> None:
    """``--ops``: the roofline tables (md) or records (json/jsonl/csv)."""
    import csv
    import io
    import json

    from ..bench import machine, ops

    plan = ops.make_plan(shape, quick, types.split(",") if types else None)
    if device:
        sels = list(dict.fromkeys(_canonical(s) for s in device.split(",") if s.strip()))
    else:
        sels = registry.valid_selectors()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(file=sys.stderr, unit="op", dynamic_ncols=True)

    def tick(msg: str) -> None:
        if bar is not None:
            bar.set_description(msg)
            bar.update(1)

    try:
        res = ops.bench_ops(sels, plan, tick)
    finally:
        if bar is not None:
            bar.close()
    info = machine.machine_info()
    if fmt == "md":
        _emit(f"cooktop bench --ops: {shape} shapes on {machine.short_label(info)}\n")
        _emit(ops.ops_markdown(res))
    elif fmt == "json":
        _emit(json.dumps(ops.ops_records(res, info), indent=2))
    elif fmt == "jsonl":
        _emit("\n".join(json.dumps(r) for r in ops.ops_records(res, info)))
    else:
        recs = ops.ops_records(res)
        buf = io.StringIO()
        keys = list(dict.fromkeys(k for r in recs for k in r))
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(recs)
        _emit(buf.getvalue().rstrip("\n"))
    if all(d.error for d in res):
        click.echo("error: no device could be measured", err=True)
        sys.exit(1)


def _batched(models, device, ngl, n_batch, npp, ntg, npl, vs, seed, fmt, plot_path) -> None:
    """``--batched``: every model x device x (PP, TG, B), then llama.cpp's with ``--vs``."""
    from ..bench import batched as bb
    from ..bench import machine

    pp, tg, pl, nb = _ints(npp, "-npp"), _ints(ntg, "-ntg"), _ints(npl, "-npl"), _ints(n_batch, "-b")
    if not pp or not tg or not pl or min(pp + pl + nb) < 1 or min(tg) < 0:
        raise CooktopError("--batched takes positive -npp, -npl and -b values and -ntg >= 0")
    paths = [p.strip() for m in models for p in m.split(",") if p.strip()] or [resolve_model(None, None, None)]
    results = []
    for path in paths:
        for dev in _devices(device):
            for g in [parse_ngl(v.strip()) for v in str(ngl).split(",") if v.strip()]:
                results += bb.run_cooktop(path, dev, g, nb[0], pp, tg, pl, seed)
        if vs:
            from ..bench import vs_llamacpp
            try:
                results += bb.run_llamacpp(path, nb[0], pp, tg, pl, seed)
            except vs_llamacpp.LlamaCppUnavailable:
                click.echo(f"To compare with llama.cpp, {vs_llamacpp.INSTALL_HINT}", err=True)
                raise
    info = machine.machine_info()
    if fmt == "md":
        _emit(f"cooktop bench --batched on {machine.short_label(info)}\n")
        _emit(bb.to_markdown(results))
    elif fmt == "csv":
        _emit(bb.to_csv(results).rstrip("\n"))
    else:
        _emit(bb.to_json(results, info, lines=fmt == "jsonl"))
    if plot_path:
        bb.plot(results, plot_path, machine.short_label(info))
        click.echo(f"cooktop: wrote {plot_path}", err=True)
    if all(r.error for r in results):
        click.echo("error: no configuration could be measured (see the errors above)", err=True)
        sys.exit(1)
