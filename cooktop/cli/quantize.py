"""``cooktop quantize``: llama-quantize's command line (tools/quantize/quantize.cpp) over :mod:`cooktop.quantize`."""

from __future__ import annotations

import os
import sys

import click

from ..errors import CooktopError
from ..quantize import ftypes
from ..quantize.model import parse_kv_override, plan, quantize_file
from .group import cli


def _tensor_type(value: str | None):
    return None if value is None else ftypes.tensor_type(value)


def _is_ftype(s: str) -> bool:
    try:
        ftypes.file_type(s)
    except CooktopError:
        return False
    return True


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:8.2f} MiB"


@cli.command("quantize")
@click.option("--allow-requantize", is_flag=True,
              help="Allow requantizing tensors that are already quantized (this loses quality compared to "
                   "quantizing from 16 or 32 bits).")
@click.option("--pure", is_flag=True, help="Disable the k-quant mixtures: every quantized tensor gets TYPE.")
@click.option("--leave-output-tensor", is_flag=True, help="Leave output.weight un(re)quantized.")
@click.option("--output-tensor-type", metavar="GGML_TYPE", default=None,
              help="Type of output.weight (e.g. q8_0, f16).")
@click.option("--token-embedding-type", metavar="GGML_TYPE", default=None,
              help="Type of the token embeddings (token_embd.weight).")
@click.option("--imatrix", "imatrix_file", metavar="FILE", default=None,
              help="Importance matrix (llama-imatrix's GGUF or legacy .dat) for the quantizers and the mixture.")
@click.option("--include-weights", multiple=True, metavar="NAME",
              help="Use the importance matrix only for tensors whose name contains NAME (repeatable).")
@click.option("--exclude-weights", multiple=True, metavar="NAME",
              help="Do not use the importance matrix for tensors whose name contains NAME (repeatable).")
@click.option("--tensor-type", "tensor_type_args", multiple=True, metavar="NAME=TYPE",
              help="Quantize tensors whose name matches the regular expression NAME to TYPE (repeatable), "
                   "e.g. attn_v=q8_0.")
@click.option("--tensor-type-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A file of NAME=TYPE entries separated by spaces or newlines.")
@click.option("--override-kv", multiple=True, metavar="KEY=TYPE:VALUE",
              help="Set a metadata key in the output (TYPE int, float, bool or str; repeatable).")
@click.option("--dry-run", is_flag=True, help="Print each tensor's type and the sizes; write nothing.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
@click.argument("args", nargs=-1, required=True)
def quantize_cmd(allow_requantize, pure, leave_output_tensor, output_tensor_type, token_embedding_type, imatrix_file,
                 include_weights, exclude_weights, tensor_type_args, tensor_type_file, override_kv, dry_run, progress,
                 args):
    """Quantize an F32/F16/BF16 GGUF model: ``cooktop quantize IN.gguf [OUT.gguf] TYPE [nthreads]``.

    A quantized model is refused unless --allow-requantize.

    TYPE is llama-quantize's: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S
    Q4_K_M Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS (aliases Q3_K, Q4_K, Q5_K; or the ftype number). Each tensor gets the
    type llama.cpp's mixture gives it, and the file's bytes equal llama-quantize's (with or without
    --imatrix). Without OUT the file is IN's folder/ggml-model-TYPE.gguf, as llama-quantize names it.
    nthreads: threads quantizing in parallel (default one per CPU core); the bytes do not depend on it.
    """
    args = list(args)
    if len(args) < 2:
        raise click.UsageError("usage: cooktop quantize IN.gguf [OUT.gguf] TYPE [nthreads]")
    src = args.pop(0)
    if _is_ftype(args[0]):
        ft = ftypes.file_type(args.pop(0))
        dst = os.path.join(os.path.dirname(src), f"ggml-model-{ft.name}.gguf")
    else:
        dst = args.pop(0)
        if not args:
            raise click.UsageError("missing TYPE (e.g. Q4_K_M)")
        ft = ftypes.file_type(args.pop(0))
    n_threads = 0
    if args:
        try:
            n_threads = int(args[0])
            if n_threads < 0:
                raise ValueError
        except ValueError:
            raise click.UsageError(f"invalid nthreads {args[0]!r}") from None
        args.pop(0)
    if args:
        raise click.UsageError(f"unexpected argument {args[0]!r}")
    if os.path.isdir(src):
        raise CooktopError(f"{src}: is a directory, not a GGUF file")
    if not os.path.isfile(src):
        raise CooktopError(f"{src}: no such file")
    if (include_weights or exclude_weights) and not imatrix_file:
        raise click.UsageError("--include-weights / --exclude-weights need --imatrix")
    if include_weights and exclude_weights:
        raise click.UsageError("only one of --include-weights and --exclude-weights can be used")
    im = None
    extra_kv: list = [parse_kv_override(a) for a in override_kv]  # llama-quantize: the user's, then imatrix's
    if imatrix_file:
        from ..quantize import imatrix
        from ..quantize.model import imatrix_kv

        im = imatrix.load(imatrix_file).filter(include_weights, exclude_weights)
        if not im.entries:
            im = None  # llama-quantize: an empty matrix after the filters quantizes without
        else:
            extra_kv += imatrix_kv(im)
    tt_args = list(tensor_type_args)
    if tensor_type_file:
        with open(tensor_type_file, encoding="utf-8", errors="replace") as fh:
            tt_args += fh.read().split()
    tensor_types = tuple(ftypes.tensor_type_option(a) for a in tt_args)
    kw = dict(pure=pure, output_tensor_type=_tensor_type(output_tensor_type),
              token_embedding_type=_tensor_type(token_embedding_type), leave_output_tensor=leave_output_tensor,
              tensor_types=tensor_types, allow_requantize=allow_requantize)
    if dry_run:
        from ..format.gguf import open_gguf
        from ..quantize.mixture import Options

        opts = Options(ft, pure, kw["output_tensor_type"], kw["token_embedding_type"], not leave_output_tensor,
                       im is not None, tensor_types)
        f = open_gguf(src)
        tensors, _ = plan(f, opts, allow_requantize)
        for i, p in enumerate(tensors, 1):
            shape = ", ".join(f"{d:5d}" for d in p.ne)
            click.echo(f"[{i:4d}/{len(tensors):4d}] {p.name:<36s} - [{shape}], {p.src_type.name:>5s} -> "
                       f"{p.dst_type.name:<5s} {_mib(p.n_bytes)}")
        click.echo(f"quant size  = {_mib(sum(p.n_bytes for p in tensors))}")
        return
    bar = None

    def tick(n: int, total: int) -> None:
        nonlocal bar
        if not progress:
            return
        if bar is None:  # opened at the first converted slab: a bad input fails before any bar shows
            from tqdm import tqdm

            bar = tqdm(total=total, file=sys.stderr, unit="val", unit_scale=True, dynamic_ncols=True,
                       desc=f"quantize {ft.name}")
        bar.update(n)

    try:
        res = quantize_file(src, dst, ft, progress=tick, n_threads=n_threads, imatrix=im, extra_kv=extra_kv, **kw)
    finally:
        if bar is not None:
            bar.close()
    groups: dict[tuple[str, str], list[str]] = {}
    for name, want, got in res.fallbacks:
        groups.setdefault((want.name, got.name), []).append(name)
    for (want, got), names in groups.items():  # llama-quantize's "required fallback quantization", grouped
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        click.echo(f"warning: {len(names)} of {len(res.tensors)} tensors have rows that are not whole {want} "
                   f"blocks: {got} instead ({shown})", err=True)
    counts: dict[str, int] = {}
    for p in res.tensors:
        counts[p.dst_type.name] = counts.get(p.dst_type.name, 0) + 1
    types = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    click.echo(f"wrote {dst}: {ft.name} (file_type {ft.ftype}), {len(res.tensors)} tensors ({types})")
    click.echo(f"model size  = {_mib(res.size_in)} ({res.size_in * 8 / res.n_elements:.2f} BPW)")
    click.echo(f"quant size  = {_mib(res.size_out)} ({res.size_out * 8 / res.n_elements:.2f} BPW)")
    click.echo(f"time        = {res.seconds:.2f} s")
