"""``cooktop perplexity``: llama-perplexity's perplexity and KL divergence (``cooktop.quality``)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import click

from .. import notices
from ..cluster import is_cluster_selector
from ..errors import CooktopError
from ..format.kvtypes import KVConfig
from ..quality import kld as _kld
from ..quality import perplexity as _ppl
from ..quality.logits_file import read_logits_file, refuse_overwrite
from ..runtime import loader
from .common import (
    device_options,
    kv_options,
    model_options,
    parse_ngl,
    ray_option,
    read_prompt_file,
    resolve_model,
    threads_option,
)
from .group import cli
from .llama_flags import llama_options
from .lora_options import lora_options


def open_model(path: str, n_ctx: int, n_batch: int, device, n_gpu_layers, split, ray_address, tensors,
               kv: KVConfig | None = None, lora: list[tuple[str, float]] | None = None):
    """A ``LoadedModel`` (``runtime.loader``, or ``cluster.load`` with ``--ray`` / a NODE/DEVICE selector)
    of ``n_ctx`` positions that returns every row's logits; ``kv``: the K/V cache types (-ctk/-ctv);
    ``lora``: ``[(path, scale)]`` of --lora / --lora-scaled (``model/lora.py``).

    Raises:
        CooktopError: cache types other than the default, or LoRA adapters, on a Ray cluster.
    """
    kw = dict(n_ctx=n_ctx, n_batch=n_batch, device=device, n_gpu_layers=parse_ngl(n_gpu_layers), split=split,
              logits_all=True)
    if ray_address or is_cluster_selector(device):
        from ..cluster.load import load_model as cluster_load

        if kv is not None and (kv.type_k, kv.type_v) != (KVConfig().type_k, KVConfig().type_v):
            raise CooktopError(f"-ctk/-ctv ({kv.label()}) are not supported on a Ray cluster yet")
        if lora:
            raise CooktopError("--lora: LoRA adapters are not supported on a Ray cluster yet")
        return cluster_load(path, ray_address=ray_address, **kw)
    return loader.load_model(path, tensors=tensors, kv=kv, lora=lora, **kw)


def eta_line(name: str, seconds: float, n_chunk: int) -> str:
    """llama.cpp's ``%.2f seconds per pass - ETA`` line after the first chunk."""
    total = int(seconds * n_chunk)
    hours = f"{total // 3600} hours " if total >= 3600 else ""
    minutes = (total % 3600 if hours else total) / 60.0
    return f"{name}: {seconds:.2f} seconds per pass - ETA {hours}{minutes:.2f} minutes"


@cli.command("perplexity")
@llama_options("perplexity")
@model_options
@click.option("-f", "--file", "text_file", type=click.File("r"), default=None,
              help="Text to evaluate (not needed with --kl-divergence: the base file holds its tokens).")
@click.option("-c", "--ctx-size", "n_ctx", default=512, show_default=True, help="Tokens per chunk.")
@click.option("-b", "--batch-size", "n_batch", default=2048, show_default=True,
              help="Tokens per forward pass (at most -c are used).")
@click.option("--chunks", "n_chunks", default=-1, show_default=True, help="Evaluate at most N chunks (-1 = all).")
@click.option("--kl-divergence-base", "--save-all-logits", "kl_base", default=None, type=click.Path(dir_okay=False),
              help="Without --kl-divergence: save the log-probabilities here (llama.cpp's file format); "
                   "with it: the base to compare against.")
@click.option("--kl-divergence", "kl_divergence", is_flag=True,
              help="Compare against --kl-divergence-base: KL divergence, same top p, Δp, PPL ratio.")
@threads_option
@kv_options
@lora_options
@device_options
@ray_option
def perplexity_cmd(model, hf_repo, hf_file, text_file, n_ctx, n_batch, n_chunks, kl_base, kl_divergence, threads,
                   threads_batch, device, n_gpu_layers, split, ray_address, tensors, kv, lora, **_ignored):
    """Perplexity of a text, or KL divergence from a saved base, as llama-perplexity computes them.

    The text is tokenized once and cut into chunks of -c tokens; each chunk starts from an empty
    cache with BOS at its first position and scores the second half of its tokens. The running
    perplexity prints after each chunk ([1]..., as llama.cpp), then ``Final estimate: PPL = x +/- y``.
    --kl-divergence-base FILE also saves every scored token's log-probabilities (llama.cpp's format,
    readable by llama-perplexity); --kl-divergence --kl-divergence-base FILE evaluates the file's
    tokens with this model and prints llama.cpp's KL-divergence statistics.
    """
    from ..api.options import set_threads

    set_threads(threads_batch or threads)
    path = resolve_model(model, hf_repo, hf_file)
    if kl_divergence:
        if not kl_base:
            raise CooktopError("--kl-divergence needs --kl-divergence-base FILE "
                               "(made by a run without --kl-divergence)")
        base = read_logits_file(kl_base)
        given = click.get_current_context().get_parameter_source("n_ctx") != click.core.ParameterSource.DEFAULT
        if given and n_ctx != base.n_ctx:
            _err(f"kl_divergence: -c {n_ctx} is not used: the chunks are the base's, n_ctx={base.n_ctx} "
                 f"(as llama-perplexity)")
        m = open_model(path, base.n_ctx, n_batch, device, n_gpu_layers, split, ray_address, tensors, kv, lora)
        try:
            if text_file is not None:
                _note_unused_text(text_file, m.tokenizer, base)
            _run_kld(path, m, base, n_batch, n_chunks)
        finally:
            m.model.close()
        return
    if text_file is None:
        raise CooktopError("give the text to evaluate with -f FILE")
    if n_ctx < 4:
        raise CooktopError(f"perplexity needs -c/--ctx-size >= 4, got {n_ctx}")
    if kl_base:
        refuse_overwrite(kl_base, [("-m", path), ("-f", text_file.name)])
    text = read_prompt_file(text_file)
    m = open_model(path, n_ctx, n_batch, device, n_gpu_layers, split, ray_address, tensors, kv, lora)
    try:
        _run_ppl(path, m, text, n_ctx, n_batch, n_chunks, kl_base)
    finally:
        m.model.close()


def _err(line: str) -> None:
    click.echo(line, err=True)


def _note_unused_text(text_file, tokenizer, base) -> None:
    """One line when ``-f``'s tokens are not the base's: --kl-divergence evaluates the base's tokens."""
    n = base.n_chunk * base.n_ctx
    tokens = _ppl.tokenize_text(tokenizer, read_prompt_file(text_file))[:n]
    if len(tokens) != n or any(int(a) != int(b) for a, b in zip(tokens, base.tokens, strict=True)):
        _err(f"kl_divergence: -f {text_file.name} is not used: its tokens differ from the base's, "
             f"which are the ones evaluated (as llama-perplexity)")


class _Quiet:
    def update(self, n: int = 1) -> None:
        pass

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def chunk_bar(total: int, desc: str):
    """The chunks' progress bar (``notices.progress``), unless stdout is a terminal: there the running
    values printed after each chunk are the progress, and a bar redrawn on stderr would cut their line."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return _Quiet() if tty else notices.progress(total, desc, unit="chunk")


def _run_ppl(path, m, text, n_ctx, n_batch, n_chunks, kl_base) -> None:
    _err(f"cooktop: {path}: {m.placement.summary()}")
    _err("perplexity: tokenizing the input ..")
    t0 = time.perf_counter()
    tokens = _ppl.tokenize_text(m.tokenizer, text)
    _err(f"perplexity: tokenization took {(time.perf_counter() - t0) * 1e3:g} ms")
    ch = _ppl.chunking(m.tokenizer, len(tokens), n_ctx, n_batch, n_chunks)
    _err(f"perplexity: calculating perplexity over {ch.n_chunk} chunks, n_ctx={ch.n_ctx}, "
         f"batch_size={ch.n_batch}, n_seq=1")
    if kl_base:
        _err(f"perplexity: saving all logits to {kl_base}")
    t_start = time.perf_counter()
    with chunk_bar(ch.n_chunk, "perplexity") as bar:
        def on_chunk(i: int, ppl: float) -> None:
            if i == 1:
                _err(eta_line("perplexity", time.perf_counter() - t_start, ch.n_chunk))
            sys.stdout.write(f"[{i}]{ppl:.4f},")
            sys.stdout.flush()
            bar.update(1)
        if kl_base:
            res = _ppl.perplexity_saving(m.model, tokens, ch, kl_base, on_chunk=on_chunk)
        else:
            res = _ppl.perplexity(m.model, tokens, ch, on_chunk=on_chunk)
    sys.stdout.write("\n")
    if res.ppl_unc > 0:
        click.echo(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.ppl_unc:.5f}")
    else:
        _err("Unexpected negative standard deviation of log(prob)")


def _run_kld(path, m, base, n_batch, n_chunks) -> None:
    _err(f"cooktop: {path}: {m.placement.summary()}")
    v = m.tokenizer.vocab
    n_chunk = base.n_chunk if n_chunks < 0 else min(n_chunks, base.n_chunk)
    _err(f"kl_divergence: computing over {n_chunk} chunks, n_ctx={base.n_ctx}, "
         f"batch_size={min(n_batch, base.n_ctx)}, n_seq=1")
    t_start = time.perf_counter()
    with chunk_bar(n_chunk, "kl-divergence") as bar:
        def on_chunk(i: int, stats: _kld.KldStats) -> None:
            if i == 1:
                _err(eta_line("kl_divergence", time.perf_counter() - t_start, n_chunk))
                click.echo("")
                click.echo(_kld.CHUNK_HEADER)
            click.echo(stats.chunk_line(i))
            bar.update(1)
        res = _kld.compare(m.model, base, n_batch, v.bos_id if v.add_bos else None, n_chunks, on_chunk=on_chunk)
    click.echo("")
    for line in res.stats.report():
        click.echo(line)


@cli.command("kld-table")
@click.option("-m", "--model", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="A model file to compare (repeat: one model in several weight types).")
@click.option("--kl-divergence-base", "kl_base", required=True, type=click.Path(dir_okay=False),
              help="The base (made by cooktop perplexity --kl-divergence-base, or by llama-perplexity); "
                   "with --base-model and -f it is made first.")
@click.option("--base-model", default=None, type=click.Path(dir_okay=False),
              help="Make the base from this model (the F32/F16 source) on --base-device, over -f.")
@click.option("-f", "--file", "text_file", type=click.File("r"), default=None, help="Text of the base (--base-model).")
@click.option("--base-device", default="cpu", show_default=True, help="Device the base is made on.")
@click.option("-c", "--ctx-size", "n_ctx", default=512, show_default=True, help="Tokens per chunk of a new base.")
@click.option("-b", "--batch-size", "n_batch", default=2048, show_default=True, help="Tokens per forward pass.")
@click.option("--chunks", "n_chunks", default=-1, show_default=True, help="At most N chunks (-1 = all).")
@click.option("--device", "-dev", "device", default="all", show_default=True,
              help="Comma list of devices, or all (every usable device here; with --ray, of every node).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Also draw the table (matplotlib: .png, .svg...; pip install 'cooktop[quality]').")
@click.option("--json", "as_json", is_flag=True, help="Print the cells as JSON instead of the table.")
@ray_option
def kld_table_cmd(models, kl_base, base_model, text_file, base_device, n_ctx, n_batch, n_chunks, device, plot_path,
                  as_json, ray_address):
    """KL divergence, same top p and PPL of each model file on each device against one base: one table
    (device x weight type), optionally a plot. With --ray ADDRESS, --device all covers every device of
    every node of the cluster."""
    import json

    from ..quality import table

    if plot_path:
        table.check_plot_path(plot_path)
    if not ray_address:
        missing = [m for m in models if not os.path.exists(m)]
        if missing:  # refused before the base is made; a file that exists but cannot load is an error cell
            raise CooktopError(f"-m {missing[0]}: no such file" + (f" (and {len(missing) - 1} more)"
                                                                     if len(missing) > 1 else ""))
    if base_model:
        if text_file is None:
            raise CooktopError("--base-model needs -f FILE: the text the base is made from")
        refuse_overwrite(kl_base, [("--base-model", base_model), ("-f", text_file.name)] + [("-m", m) for m in models])
        m = open_model(base_model, n_ctx, n_batch, base_device, "-1", None, None, None)
        try:
            tokens = _ppl.tokenize_text(m.tokenizer, read_prompt_file(text_file))
            ch = _ppl.chunking(m.tokenizer, len(tokens), n_ctx, n_batch, n_chunks)
            with notices.progress(ch.n_chunk, "base", unit="chunk") as bar:
                res = _ppl.perplexity_saving(m.model, tokens, ch, kl_base, on_chunk=lambda i, p: bar.update(1))
        finally:
            m.model.close()
        _err(f"cooktop: base {kl_base}: {base_model} on {base_device}, {ch.n_chunk} chunks of {ch.n_ctx}: "
             f"PPL = {res.ppl:.4f} +/- {res.ppl_unc:.5f}")
    base = read_logits_file(kl_base)
    devices = table.cluster_devices(device, ray_address) if ray_address else table.local_devices(device)
    n_cells = len(devices) * len(models)
    _err(f"cooktop: {len(models)} model(s) x {len(devices)} device(s) ({', '.join(devices)}) against {kl_base} "
         f"({base.n_chunk if n_chunks < 0 else min(n_chunks, base.n_chunk)} chunks of {base.n_ctx})")
    with notices.progress(n_cells, "kld-table", unit="run") as bar:
        def on_cell(c) -> None:
            bar.update(1)
            if c.error:
                _err(f"cooktop: {c.device} {c.model}: {c.error}")
        cells = table.measure(models, devices, base, n_batch, n_chunks, ray_address, on_cell=on_cell)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(c) for c in cells], indent=1))
    else:
        click.echo(table.format_table(cells))
    if plot_path:
        table.plot(cells, plot_path, f"cooktop kld-table: {table.files_label(models)} vs {os.path.basename(kl_base)}")
        _err(f"cooktop: wrote {plot_path}")
