"""``cooktop info``: what a GGUF holds (architecture, parameters, types, KV cache size)."""

from __future__ import annotations

import collections
import json
import os

import click
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from ..errors import CooktopError, UnsupportedModelError
from ..format.gguf import open_gguf
from ..format.kvtypes import KV_TYPES, KVConfig, kv_type_name
from ..model import swa
from ..model.config import load_config
from ..runtime.budget import recurrent_state_bytes
from ..settings import device_memory
from ..units import format_params
from .common import kv_options
from .group import cli


def _kv_bytes(cfg, n_ctx: int, kv: KVConfig, n_batch: int = 512) -> int:
    # recurrent blocks and blocks that read another block's cache (gemma4) hold no K/V; a sliding-window
    # block keeps its window's cells only, unless --swa-full (model/swa.py; n_batch: -b's default)
    b = swa.swa_cells(cfg, n_ctx, n_batch, kv.swa_full, (kv.type_k, kv.type_v))
    return sum(swa.kv_cells(cfg, i, n_ctx, b) * sum(kv.row_bytes(cfg.kv_width(i))) for i in range(cfg.n_layer)
               if cfg.has_kv(i))


def model_info(path: str, n_ctx: int, kv: KVConfig | None = None) -> dict:
    """Summary dict of a GGUF: architecture, config, parameter count, file size (bytes),
    tensor-type histogram (type -> tensor count and bytes), the largest tensor (name, bytes) and
    the ``COOKTOP_DEVICE_MEMORY`` devices it is past the largest buffer of (``largest_tensor_chunked_on``),
    KV cache bytes for ``n_ctx``: ``kv_cache`` for the cache types of ``kv`` (``-ctk``/``-ctv``,
    default f16 as llama.cpp's; ``swa_cells``: the sliding-window layers' cells at ``-b`` 512, 0 when they
    keep n_ctx, ``model/swa.py``) and ``kv_cache_bytes`` per cache type (K and V of one type; block
    types whose block divides head_dim), and ``moe_layers``: the blocks with experts (their router,
    ``ffn_gate_inp``; [] for a dense model).

    A readable GGUF that cooktop cannot run (an unknown architecture, say) still gets its
    header, architecture metadata and tensor types, with ``config`` None, ``supported`` False
    and ``unsupported`` the reason.

    Raises:
        GGUFError (not a readable GGUF); CooktopError for a negative ``n_ctx``.
    """
    gf = open_gguf(path)
    if n_ctx < 0:
        raise CooktopError(f"n_ctx (-c) must be >= 0 (0 = n_ctx_train), got {n_ctx}")
    try:
        cfg = load_config(gf)
    except UnsupportedModelError as e:
        return _unsupported_info(gf, path, str(e))
    n_params = sum(t.n_elements for t in gf.tensors.values())
    n_ctx = n_ctx if n_ctx > 0 else cfg.n_ctx_train
    kv = kv if kv is not None else KVConfig(T.F16, T.F16)
    return {
        "supported": True,
        "path": os.path.abspath(path),
        "name": gf.metadata.get("general.name", ""),
        "architecture": cfg.arch,
        "gguf_version": gf.version,
        "file_size_bytes": gf.file_size,
        "n_params": n_params,
        "n_tensors": len(gf.tensors),
        "config": cfg.to_dict(),
        "tensor_types": _histogram(gf),
        # what meets a device's largest buffer (maxStorageBufferRange, CL_DEVICE_MAX_MEM_ALLOC_SIZE):
        # past it, a matrix is stored in row chunks (backends/chunked.py)
        "largest_tensor": _largest(gf),
        "largest_tensor_chunked_on": _chunked_on(_largest(gf)),
        "rope_freqs": "rope_freqs.weight" in gf.tensors,
        # glm4moe's router picks by probs + exp_probs_b (llama.cpp build_moe_ffn's selection bias)
        "expert_selection_bias": any(n.endswith(".exp_probs_b.bias") for n in gf.tensors),
        "tokenizer": gf.metadata.get("tokenizer.ggml.model", ""),
        "n_ctx": n_ctx,
        "kv_cache": {"type_k": kv_type_name(kv.type_k), "type_v": kv_type_name(kv.type_v), "flash_attn": kv.flash_attn,
                     "bytes": _kv_bytes(cfg, n_ctx, kv),
                     # cells per sequence of the sliding-window layers (model/swa.py; 0: n_ctx, as the others)
                     "swa_cells": swa.swa_cells(cfg, n_ctx, 512, kv.swa_full, (kv.type_k, kv.type_v)),
                     "swa_full": kv.swa_full},
        # one sequence's recurrent state (model/recurrent.py): f32, whatever n_ctx
        "recurrent_state_bytes": recurrent_state_bytes(cfg),
        "kv_cache_bytes": {kv_type_name(t): _kv_bytes(cfg, n_ctx, KVConfig(t, t, swa_full=kv.swa_full))
                           for t in KV_TYPES
                           if not cfg.head_dim % GGML_QUANT_SIZES[t][0]},
        "mtp": _mtp_info(gf, cfg, n_ctx, kv),
        "moe_layers": [i for i in range(cfg.n_layer) if f"blk.{i}.ffn_gate_inp.weight" in gf.tensors]
        if cfg.n_expert else [],
    }


def _mtp_info(gf, cfg, n_ctx: int, kv: KVConfig) -> dict | None:
    """The multi-token-prediction block (``--spec-type draft-mtp``, ``model/mtp.py``): its block index,
    weight bytes (the ``blk.<n_layer>.*`` tensors), one sequence's K/V bytes at ``n_ctx`` in the
    cache types of ``kv`` and ``draft``: whether cooktop runs it (``mtp.MTP_ARCHS``; glm4's is
    skipped); None when the file has none."""
    from ..model.mtp import MTP_ARCHS, mtp_weight_bytes
    if not cfg.n_layer_nextn:
        return None
    rk, rv = kv.row_bytes(cfg.n_embd_kv)
    return {"n_layer_nextn": cfg.n_layer_nextn, "block": cfg.n_layer, "weight_bytes": mtp_weight_bytes(gf, cfg),
            "kv_bytes": n_ctx * (rk + rv), "draft": cfg.arch in MTP_ARCHS}


def _largest(gf) -> dict | None:
    """``{"name", "bytes"}`` of the file's largest tensor (the first of equals), None without tensors."""
    t = max(gf.tensors.values(), key=lambda t: t.n_bytes, default=None)
    return None if t is None else {"name": t.name, "bytes": int(t.n_bytes)}


def _chunked_on(largest: dict | None) -> list[str]:
    """Selectors of the ``COOKTOP_DEVICE_MEMORY`` devices whose largest buffer (``/MAX``, else the
    memory) the largest tensor is past: there it is stored in row chunks (``backends/chunked.py``).
    No device is probed: a real device's limit is ``cooktop devices``' ``max buffer``."""
    if largest is None:
        return []
    return [sel for sel, (mem, mx) in device_memory().items() if largest["bytes"] > (mx or mem)]


def _histogram(gf) -> dict[str, dict[str, int]]:
    hist: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"tensors": 0, "bytes": 0, "params": 0})
    for t in gf.tensors.values():
        h = hist[t.ggml_type.name]
        h["tensors"] += 1
        h["bytes"] += t.n_bytes
        h["params"] += t.n_elements
    return dict(sorted(hist.items()))


def _unsupported_info(gf, path: str, reason: str) -> dict:
    """:func:`model_info` of a file cooktop cannot run: what the header and metadata say."""
    arch = str(gf.metadata.get("general.architecture", ""))
    meta = {k: v for k, v in gf.metadata.items()  # scalars; not the vocabulary's arrays or its template
            if not k.startswith("tokenizer.") and isinstance(v, (int, float, str, bool))}
    return {"supported": False, "unsupported": reason, "path": os.path.abspath(path),
            "name": gf.metadata.get("general.name", ""), "architecture": arch, "gguf_version": gf.version,
            "file_size_bytes": gf.file_size, "n_params": sum(t.n_elements for t in gf.tensors.values()),
            "n_tensors": len(gf.tensors), "config": None, "metadata": dict(sorted(meta.items())),
            "tensor_types": _histogram(gf), "tokenizer": gf.metadata.get("tokenizer.ggml.model", "")}


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _chunked_note(selectors: list[str]) -> str:
    """`` (past the largest buffer of ...: stored in row chunks there)``, or nothing."""
    if not selectors:
        return ""
    limits = device_memory()
    where = " and ".join(f"{sel}, {_size(limits[sel][1] or limits[sel][0])}" for sel in selectors)
    return f" (past the largest buffer of {where} by COOKTOP_DEVICE_MEMORY: stored in row chunks there)"


@cli.command("info")
@click.argument("model", type=click.Path())
@click.option("-c", "--ctx-size", "n_ctx", default=0, help="Context size for the KV cache figure (0 = n_ctx_train).")
@kv_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info_cmd(model: str, n_ctx: int, kv: KVConfig, as_json: bool) -> None:
    """Describe a GGUF model file (one cooktop cannot run too: what its header, metadata and
    tensors say, then the reason on stderr and exit code 1)."""
    info = model_info(model, n_ctx, kv)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        if not info["supported"]:
            raise CooktopError(info["unsupported"])
        return
    if not info["supported"]:
        lines = [f"model:          {info['path']}",
                 f"name:           {info['name']}",
                 f"architecture:   {info['architecture']} (GGUF v{info['gguf_version']}, tokenizer "
                 f"{info['tokenizer']}): not supported by cooktop",
                 f"parameters:     {format_params(info['n_params'])} ({info['n_params']:,})",
                 f"file size:      {_size(info['file_size_bytes'])} ({info['file_size_bytes']:,} bytes)",
                 "metadata:", *[f"  {k} = {v!r:.80}" for k, v in info["metadata"].items()], "tensor types:"]
        for name, h in info["tensor_types"].items():
            lines.append(f"  {name:<6} {h['tensors']:5d} tensors  {_size(h['bytes']):>12}  "
                         f"{format_params(h['params'])} params")
        click.echo("\n".join(lines))
        raise CooktopError(info["unsupported"])  # after what the file holds: exit 1, the reason on stderr
    c = info["config"]
    lines = [
        f"model:          {info['path']}",
        f"name:           {info['name']}",
        f"architecture:   {info['architecture']} (GGUF v{info['gguf_version']}, tokenizer {info['tokenizer']})",
        f"parameters:     {format_params(info['n_params'])} ({info['n_params']:,})",
        f"file size:      {_size(info['file_size_bytes'])} ({info['file_size_bytes']:,} bytes)",
        *([f"largest tensor: {info['largest_tensor']['name']}, {_size(info['largest_tensor']['bytes'])}"
           + _chunked_note(info["largest_tensor_chunked_on"])] if info["largest_tensor"] else []),
        f"n_ctx_train:    {c['n_ctx_train']}",
        f"n_embd:         {c['n_embd']}    n_layer: {c['n_layer']}    n_ff: {c['n_ff']}    n_vocab: {c['n_vocab']}",
        f"n_head:         {c['n_head']}    n_head_kv: {c['n_head_kv']}    head_dim: {c['head_dim']}    "
        f"n_rot: {c['n_rot']}",
        f"rope_freq_base: {c['rope_freq_base']:g}    rope_freq_scale: {c['rope_freq_scale']:g}    "
        f"rms_eps: {c['rms_eps']:g}    tied output: {c['tied_output']}",
        f"rope scaling:   {c['rope_scaling_type']}    ext_factor: {c['rope_ext_factor']:g}    "
        f"attn_factor: {c['rope_attn_factor']:g}    n_ctx_orig: {c['n_ctx_orig_yarn']}"
        + ("    rope_freqs: yes" if info["rope_freqs"] else ""),
        f"KV cache:       {_size(info['kv_cache']['bytes'])} at n_ctx {info['n_ctx']} (K {info['kv_cache']['type_k']}, "
        f"V {info['kv_cache']['type_v']}; "
        + ", ".join(f"{_size(b)} as {t}" for t, b in info["kv_cache_bytes"].items() if t in ("f32", "f16", "q8_0",
                                                                                           "q4_0")) + ")",
        "tensor types:",
    ]
    if info.get("mtp"):
        m = info["mtp"]
        use = ("per sequence (--spec-type draft-mtp)" if m["draft"] else
               "per sequence if run; not run by cooktop (skipped, as llama.cpp's main pass does)")
        lines.insert(-1, f"MTP block:      blk.{m['block']} (nextn_predict_layers {m['n_layer_nextn']}): "
                         f"{_size(m['weight_bytes'])} weights, {_size(m['kv_bytes'])} K/V at n_ctx {info['n_ctx']} "
                         + use)
    if info.get("recurrent_state_bytes"):
        n_recr = sum(c["recurrent_layers"])
        state = _size(info["recurrent_state_bytes"])
        lines.insert(-1, f"recurrent:      {n_recr} of {c['n_layer']} layers; state {state} per sequence (f32)")
    if c.get("n_swa"):  # gemma3: llama.cpp's print_info says n_swa and the pattern
        swa = [i for i, on in enumerate(c["swa_layers"]) if on]
        lines.insert(-2, f"sliding window: {c['n_swa']} tokens on {len(swa)} of {c['n_layer']} layers "
                         f"(rope_freq_base_swa {c['rope_freq_base_swa']:g}); full attention on layers "
                         f"{[i for i in range(c['n_layer']) if i not in swa]}")
    if c.get("n_layer_kv"):  # gemma4: the last blocks read earlier blocks' K/V (llama.cpp n_layer_kv_from_start)
        lines.insert(-2, f"shared KV:      layers {c['n_layer_kv']}-{c['n_layer'] - 1} keep no K/V of their own "
                         f"(they read layers {c['n_layer_kv'] - 2} and {c['n_layer_kv'] - 1}'s)")
    if c.get("n_embd_per_layer"):  # gemma4
        lines.insert(-2, f"per-layer input: {c['n_embd_per_layer']} wide per layer; final logit soft-cap "
                         f"{c['final_logit_softcap']:g}")
    if c.get("n_expert"):  # llama.cpp's print_info: n_expert, n_expert_used, n_ff_exp, gating
        shared = f", shared expert {c['n_ff_shexp']} wide" if c["arch"] in ("qwen2moe", "glm4moe") else ""
        if c["arch"] == "gemma4":  # llama.cpp keeps the dense MLP beside the experts as a shared expert
            shared = f", beside the dense MLP ({c['n_ff']} wide, a shared expert)"
        scale = c["expert_weights_scale"]
        n_moe = len(info["moe_layers"])
        if c.get("n_layer_dense_lead"):  # glm4moe: the leading blocks are dense
            where = f"; layers 0-{c['n_layer_dense_lead'] - 1} dense (FFN {c['n_ff']})"
        else:
            where = (f"; MoE layers: {'all ' if n_moe == c['n_layer'] else ''}{n_moe} of {c['n_layer']}"
                     + ("" if n_moe in (0, c["n_layer"]) else f" {info['moe_layers']}"))
        lines.insert(-2, f"experts:        {c['n_expert']}, {c['n_expert_used']} used per token, {c['n_ff_exp']} wide"
                         f"{shared}; gating {c['expert_gating']}"
                         f"{', selection bias' if info.get('expert_selection_bias') else ''}"
                         f"{', weights renormalised' if c['expert_weights_norm'] else ''}"
                         f"{f', weights x {scale:g}' if scale not in (0.0, 1.0) else ''}{where}")
    for name, h in info["tensor_types"].items():
        lines.append(f"  {name:<6} {h['tensors']:5d} tensors  {_size(h['bytes']):>12}  "
                     f"{format_params(h['params'])} params")
    click.echo("\n".join(lines))
