"""Options and helpers shared by the CLI commands (llama.cpp flag names)."""

from __future__ import annotations

import click

from ..errors import CooktopError
from ..tools import hub
from ..runtime.placement import parse_ngl  # noqa: F401  (re-exported for the commands)


def model_options(f):
    """``-m/--model``, ``-hf/--hf-repo``, ``--hf-file`` (llama.cpp names)."""
    f = click.option("--hf-file", "hf_file", default=None, help="File in the -hf repository.")(f)
    f = click.option("-hf", "--hf-repo", "hf_repo", default=None,
                     help="Hugging Face repo OWNER/REPO[:FILE], fetched into the HF cache.")(f)
    f = click.option("-m", "--model", "model", default=None, type=click.Path(),
                     help="Path of a GGUF model (default: stories260K from ggml-org/tiny-llamas).")(f)
    return f


def resolve_model(model: str | None, hf_repo: str | None, hf_file: str | None) -> str:
    """Path of the model to load: ``-m``, else ``-hf``, else the default model (cached download)."""
    if model and hf_repo:
        raise CooktopError("give either -m or -hf, not both")
    if model:
        return model
    if hf_repo:
        return hub.resolve(*hub.parse_hf(hf_repo, hf_file))
    return hub.resolve()


def device_options(f):
    """``--device``, ``-ngl/--n-gpu-layers``, ``--split/--tensor-split``."""
    f = click.option("--split", "--tensor-split", "-ts", "split", default=None,
                     help="Proportions of offloaded layers per device, e.g. 3,1.")(f)
    f = click.option("-ngl", "--n-gpu-layers", "--gpu-layers", "n_gpu_layers", default="-1",
                     help="Layers to offload: N, -1 = all (default), auto = as many as fit.")(f)
    f = click.option("--device", "-dev", "device", default=None, envvar="COOKTOP_DEVICE",
                     help="auto, cpu, opencl, opencl:1, vulkan:0, or a comma list (COOKTOP_DEVICE).")(f)
    return f
