"""Options and helpers shared by the CLI commands (llama.cpp flag names)."""

from __future__ import annotations

import functools

import click

from ..errors import CooktopError
from ..format.kvtypes import KV_DEFAULT, KV_TYPES, KVConfig, kv_type_name
from ..runtime.placement import (
    TensorPlacement,
    parse_ngl,  # noqa: F401  (re-exported for the commands)
)
from ..tools import hub


def model_options(f):
    """``-m/--model``, ``-hf/--hf-repo``, ``--hf-file``, ``--offline`` (llama.cpp names)."""
    def offline(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            hub.set_offline(True)

    f = click.option("--offline", is_flag=True, expose_value=False, callback=offline, envvar="LLAMA_ARG_OFFLINE",
                     help="Use only models already in the Hugging Face cache: no download.")(f)
    f = click.option("--hf-file", "hf_file", default=None, help="File in the -hf repository.")(f)
    f = click.option("-hf", "--hf-repo", "hf_repo", default=None,
                     help="Hugging Face repo OWNER/REPO[:QUANT] (default quant Q4_K_M) or OWNER/REPO:FILE.gguf, "
                          "fetched into the HF cache.")(f)
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
        repo, file, tag = hub.parse_hf_spec(hf_repo, hf_file)
        return hub.download(repo, file, tag=tag)
    return hub.resolve()


def device_options(f):
    """``--device``, ``-ngl/--n-gpu-layers``, ``--split/--tensor-split`` and llama.cpp's expert
    placement ``--n-cpu-moe/-ncmoe``, ``--cpu-moe/-cmoe``, ``-ot/--override-tensor`` (several), which
    reach the command as one ``tensors`` argument (``runtime.placement.TensorPlacement``)."""
    command = f

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        kwargs["tensors"] = TensorPlacement.parse(kwargs.pop("n_cpu_moe"), kwargs.pop("cpu_moe"),
                                                  kwargs.pop("override_tensor"))
        return command(*args, **kwargs)

    f = click.option("-ot", "--override-tensor", "override_tensor", multiple=True, metavar="REGEX=DEVICE",
                     help="Put the tensors whose name matches REGEX on DEVICE (cpu, opencl:0...); "
                          "a block's experts or attention move as a half (see README).")(wrapper)
    f = click.option("-cmoe", "--cpu-moe", "cpu_moe", is_flag=True,
                     help="Keep the experts (feed-forward) of every MoE block on the host.")(f)
    f = click.option("-ncmoe", "--n-cpu-moe", "n_cpu_moe", type=int, default=0,
                     help="Keep the experts of the first N MoE blocks on the host.")(f)
    f = click.option("--split", "--tensor-split", "-ts", "split", default=None,
                     help="Proportions of offloaded layers per device, e.g. 3,1.")(f)
    f = click.option("-ngl", "--n-gpu-layers", "--gpu-layers", "n_gpu_layers", default="-1",
                     help="Layers to offload: N, -1 = all (default), auto = as many as fit.")(f)
    f = click.option("--device", "-dev", "device", default=None, envvar="COOKTOP_DEVICE",
                     help="auto, cpu, opencl, opencl:1, vulkan:0, or a comma list (COOKTOP_DEVICE).")(f)
    return f


def kv_options(f):
    """llama.cpp's ``-ctk/--cache-type-k``, ``-ctv/--cache-type-v``, ``-fa/--flash-attn [on|off|auto]`` and
    ``--swa-full`` (also read from ``LLAMA_ARG_CACHE_TYPE_K`` / ``_V`` / ``LLAMA_ARG_FLASH_ATTN`` /
    ``LLAMA_ARG_SWA_FULL``), reaching the command as one ``kv`` argument
    (``cooktop.format.kvtypes.KVConfig``; bad values are a one-line error)."""
    command = f

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        kwargs["kv"] = KVConfig.parse(kwargs.pop("cache_type_k"), kwargs.pop("cache_type_v"),
                                      kwargs.pop("flash_attn"), kwargs.pop("swa_full"))
        return command(*args, **kwargs)

    names = ", ".join(kv_type_name(t) for t in KV_TYPES)
    f = click.option("--swa-full", "swa_full", is_flag=True, default=False, envvar="LLAMA_ARG_SWA_FULL",
                     help="Sliding-window layers keep the whole context's K/V (default: only their window, "
                          "llama.cpp's iSWA cache).")(wrapper)
    f = click.option("-fa", "--flash-attn", "flash_attn", default="auto",
                     envvar="LLAMA_ARG_FLASH_ATTN", show_default=True, metavar="[on|off|auto]",
                     help="Flash attention (a quantized V cache requires it; auto: on).")(f)
    f = click.option("-ctv", "--cache-type-v", "cache_type_v", default=None, envvar="LLAMA_ARG_CACHE_TYPE_V",
                     metavar="TYPE", help=f"KV cache type of V: {names} (default {kv_type_name(KV_DEFAULT)}).")(f)
    f = click.option("-ctk", "--cache-type-k", "cache_type_k", default=None, envvar="LLAMA_ARG_CACHE_TYPE_K",
                     metavar="TYPE", help=f"KV cache type of K: {names} (default {kv_type_name(KV_DEFAULT)}).")(f)
    return f


def kv_kwargs(kv: KVConfig) -> dict:
    """``Llama(...)`` keyword arguments of a :class:`KVConfig` (``type_k``, ``type_v``, ``flash_attn``,
    ``swa_full``)."""
    return {"type_k": int(kv.type_k), "type_v": int(kv.type_v), "flash_attn": kv.flash_attn,
            "swa_full": kv.swa_full}


def moe_kwargs(tensors: TensorPlacement | None) -> dict:
    """``Llama(...)`` keyword arguments of a :class:`TensorPlacement` (none when it is the default)."""
    if tensors is None or tensors == TensorPlacement():
        return {}
    return {"n_cpu_moe": tensors.n_cpu_moe, "override_tensor": [f"{p}={d}" for p, d in tensors.override_tensor]}


def ray_option(f):
    """``--ray ADDRESS`` (``COOKTOP_RAY``): work across the nodes of a Ray cluster (cooktop.cluster)."""
    return click.option("--ray", "ray_address", default=None, envvar="COOKTOP_RAY", metavar="ADDRESS",
                        help="Ray cluster (HOST:PORT of its head node, or auto): devices become NODE/DEVICE "
                             "(e.g. alpha/opencl:0), auto = every node's auto device (COOKTOP_RAY; "
                             "pip install 'cooktop[ray]').")(f)


def threads_option(f):
    """``-t/--threads`` and ``-tb/--threads-batch``: BLAS threads of the numpy backend."""
    f = click.option("-tb", "--threads-batch", "threads_batch", type=int, default=None,
                     help="Threads for prompt processing (numpy backend; default: as -t).")(f)
    f = click.option("-t", "--threads", "threads", type=int, default=None,
                     help="CPU threads of the numpy backend (BLAS); default: all cores.")(f)
    return f


def read_prompt_file(prompt_file) -> str:
    """The text of ``-f FILE`` without one trailing newline (as llama-cli reads it).

    Raises:
        CooktopError: the file is not UTF-8 text.
    """
    try:
        text = prompt_file.read()
    except UnicodeDecodeError as err:
        raise CooktopError(f"{prompt_file.name}: not valid UTF-8 text at byte {err.start}") from None
    return text[:-1] if text.endswith("\n") else text
