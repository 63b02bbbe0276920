"""llama.cpp's speculative-decoding options on ``run`` and ``serve`` (common/arg.cpp names and defaults).

``-md/--model-draft`` (a draft model: ``--spec-type draft-simple``, implied), ``--spec-type
ngram-simple`` (drafts from the context itself, ``--spec-ngram-simple-size-n/-m``), ``--spec-type
draft-mtp`` (the model file's multi-token-prediction block, ``cooktop.model.mtp``),
``--draft-max`` / ``--spec-draft-n-max``, ``--draft-min`` / ``--spec-draft-n-min``,
``--draft-p-min``, ``-ngld/--gpu-layers-draft``, ``-devd/--device-draft``. The decorator hands
the command one ``speculative`` argument, a :class:`~cooktop.engine.spec_config.SpecOptions`.
"""

from __future__ import annotations

import functools

import click

from ..engine.spec_config import SpecOptions


def speculative_options(f):
    """Add the options of the module doc; the command gets ``speculative=SpecOptions(...)``."""
    command = f

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        kwargs["speculative"] = SpecOptions(
            kwargs.pop("model_draft"), kwargs.pop("draft_max"), kwargs.pop("draft_min"), kwargs.pop("draft_p_min"),
            kwargs.pop("gpu_layers_draft"), kwargs.pop("device_draft"), tuple(kwargs.pop("spec_type")),
            kwargs.pop("spec_ngram_simple_size_n"), kwargs.pop("spec_ngram_simple_size_m"))
        return command(*args, **kwargs)

    f = click.option("--spec-ngram-simple-size-m", "spec_ngram_simple_size_m", type=click.IntRange(1, 1024),
                     default=48, show_default=True,
                     help="ngram-simple: most tokens drafted (the m-gram after the match).")(wrapper)
    f = click.option("--spec-ngram-simple-size-n", "spec_ngram_simple_size_n", type=click.IntRange(1, 1024),
                     default=12, show_default=True, help="ngram-simple: length of the n-gram looked up.")(f)
    f = click.option("--spec-type", "spec_type", multiple=True, metavar="TYPES",
                     help="Speculative decoding: none, draft-simple (-md), draft-mtp (the model file's own "
                          "multi-token-prediction block: Qwen3.5/3.6), ngram-simple (comma list; first "
                          "non-empty draft wins).")(f)
    f = click.option("-devd", "--device-draft", "--spec-draft-device", "device_draft", default=None,
                     help="Device of the draft model (default: --device).")(f)
    f = click.option("-ngld", "--gpu-layers-draft", "--spec-draft-ngl", "--n-gpu-layers-draft", "gpu_layers_draft",
                     default=None, help="Draft model layers to offload (default: -ngl's).")(f)
    f = click.option("--draft-p-min", "--spec-draft-p-min", "draft_p_min", type=float, default=0.0,
                     show_default=True, help="Stop drafting at a draft token less likely than this (greedy).")(f)
    f = click.option("--draft-min", "--spec-draft-n-min", "--draft-n-min", "draft_min", type=int, default=0,
                     show_default=True, help="Drafts shorter than this are not verified.")(f)
    f = click.option("--draft-max", "--spec-draft-n-max", "--draft", "--draft-n", "draft_max", type=int, default=3,
                     show_default=True, help="Tokens to draft with the draft model (or the MTP block) per step.")(f)
    f = click.option("-md", "--model-draft", "--spec-draft-model", "model_draft", default=None, type=click.Path(),
                     help="Draft model for speculative decoding (same vocabulary as -m).")(f)
    return f
