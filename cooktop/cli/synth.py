"""``cooktop synth``: write a GGUF with random weights in a real model's shape."""

from __future__ import annotations

import dataclasses
import time

import click

from ..model.arch import ARCHITECTURES
from ..tools import synth
from ..units import format_params
from .group import cli


class _TypeChoice(click.Choice):
    """A weight type, shown and matched as written (any case, as llama-quantize): the group's
    ``token_normalize_func`` (``_`` -> ``-``, for option names) made the choices read ``Q8-0``."""

    def normalize_choice(self, choice, ctx):  # noqa: ANN001, ANN201 - click's signature
        return str(choice)

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 - click's signature
        upper = {str(c).upper(): c for c in self.choices}
        return super().convert(upper.get(str(value).upper(), value), param, ctx)


@cli.command("synth")
@click.option("--shape", type=click.Choice(sorted(synth.SHAPES)), default=None, help="Named model shape.")
@click.option("--n-embd", type=int, default=None)
@click.option("--n-layer", type=int, default=None)
@click.option("--n-head", type=int, default=None)
@click.option("--n-head-kv", type=int, default=None)
@click.option("--n-ff", type=int, default=None)
@click.option("--n-vocab", type=int, default=None)
@click.option("--head-dim", type=int, default=None, help="attention.key_length (default n_embd / n_head).")
@click.option("--n-expert", type=int, default=None, help="expert_count (mixture-of-experts architectures).")
@click.option("--n-expert-used", type=int, default=None, help="expert_used_count (experts per token).")
@click.option("--n-ff-exp", type=int, default=None, help="expert_feed_forward_length (one expert's width).")
@click.option("--n-expert-shared", type=int, default=None,
              help="glm4moe: expert_shared_count (the ungated shared expert, that many experts wide).")
@click.option("--n-dense-lead", type=int, default=None,
              help="glm4moe: leading_dense_block_count (the first blocks with a dense FFN of --n-ff).")
@click.option("--n-kv-shared", type=int, default=None,
              help="gemma4: attention.shared_kv_layers (the last blocks read earlier blocks' K/V).")
@click.option("--type", "file_type", type=_TypeChoice(synth.FILE_TYPES), default="Q4_0", show_default=True)
@click.option("--arch", type=click.Choice(sorted(ARCHITECTURES)), default=None,
              help="general.architecture (default: the --shape's, else llama): the tensors written are the "
                   "ones model/arch/<arch>.py declares.")
@click.option("--vocab", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Copy the tokenizer.* keys of this vocabulary GGUF (e.g. ../shared/vocab/ggml-vocab-qwen2.gguf); "
                   "n_vocab becomes its token count.")
@click.option("--rope-scaling-type", type=click.Choice(["none", "linear", "yarn"]), default=None,
              help="Write rope.scaling.type.")
@click.option("--rope-scaling-factor", type=float, default=None, help="Write rope.scaling.factor.")
@click.option("--rope-freqs/--no-rope-freqs", default=None,
              help="Write Llama 3.1's rope_freqs tensor (llama; default: the --shape's choice).")
@click.option("--nextn", "n_nextn", type=click.IntRange(0, 1), default=None,
              help="qwen35 / qwen35moe / glm4moe: write a multi-token-prediction block after the trunk "
                   "(nextn_predict_layers; --spec-type draft-mtp drafts with it).")
@click.option("--seed", default=0, show_default=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="GGUF file to write.")
def synth_cmd(shape, n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, head_dim, n_expert, n_expert_used, n_ff_exp,
              n_expert_shared, n_dense_lead, n_kv_shared, file_type, arch, vocab, rope_scaling_type,
              rope_scaling_factor, rope_freqs, n_nextn, seed, output):
    """Write a synthetic GGUF of architecture --arch (random weights; SPM-shaped vocabulary or --vocab's).

    Start from --shape and override any dimension, or give all of
    --n-embd --n-layer --n-head --n-ff (--n-head-kv defaults to --n-head, --n-vocab to 32000), and
    for a mixture of experts --n-expert --n-expert-used (--n-ff-exp: n_ff / n_expert_used).
    MoE shapes with real per-layer dimensions: --shape qwen3-30b-a3b / gpt-oss-20b /
    qwen1.5-moe-a2.7b / olmoe-1b-7b / gemma-4-26b-a4b / glm-4.5-air, with --n-layer to fit the machine
    (gemma-4-e2b: with --n-kv-shared too, e.g. --n-layer 10 --n-kv-shared 5). A tiny glm4moe: --arch glm4moe
    with --n-expert-shared 1 --n-dense-lead 1 (block 0 dense, a shared expert in the others).
    A bad shape (see ``synth.validate``) ends with ``error: ...`` and exit code 1, writing nothing.
    """
    if shape:
        base = synth.SHAPES[shape]
    else:
        missing = [f for f, v in (("--n-embd", n_embd), ("--n-layer", n_layer), ("--n-head", n_head),
                                  ("--n-ff", n_ff)) if v is None]
        if missing:
            raise click.UsageError(f"give --shape or all of {', '.join(missing)}")
        base = synth.Shape(n_embd, n_layer, n_head, n_head_kv or n_head, n_ff, n_vocab or 32000)
    over = {k: v for k, v in dict(n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
                                  n_ff=n_ff, n_vocab=n_vocab, head_dim=head_dim, rope_scaling=rope_scaling_type,
                                  rope_scaling_factor=rope_scaling_factor, rope_freqs=rope_freqs,
                                  n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp,
                                  n_expert_shared=n_expert_shared, n_dense_lead=n_dense_lead,
                                  n_kv_shared=n_kv_shared, arch=arch, n_nextn=n_nextn).items() if v is not None}
    s = dataclasses.replace(base, **over)
    t0 = time.perf_counter()
    n = synth.write(output, s, file_type, seed=seed, name=f"synthetic {shape or 'custom'} {file_type}",
                    vocab=vocab)
    click.echo(f"wrote {output}: {format_params(n)} parameters ({n:,}), {file_type}, "
               f"{time.perf_counter() - t0:.1f} s", err=True)
