"""load_config: a GGUF's :class:`ModelConfig`, checked against its architecture's tensors.

Keys are ``{arch}.*`` as written by llama.cpp's converters (gguf-py
``gguf.constants.Keys``); the keys every architecture shares are read here with
llama.cpp's defaults (``llama_model_base::load_hparams``, src/llama-model.cpp), the
rest by the architecture (``model/arch/<arch>.py``, ``load_arch_hparams``), which
also declares the tensors the file must (or may) hold.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from ..errors import UnsupportedModelError
from ..format.gguf import GGUFFile
from ..format.quants import HOST_TYPES
from .arch import Architecture, architecture
from .arch.base import INPUT, MATRIX
from .hparams import Metadata, ModelConfig, rope_scaling

__all__ = ["ModelConfig", "load_config"]

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")

#: What a known-but-unused tensor is, for the refusal message (llama.cpp tensor names).
_KNOWN_UNUSED = {
    "rope_freqs.weight": "rope frequency factors (Llama-3.1 rope scaling)",
    "rope_factors_long.weight": "long rope factors (LongRoPE)",
    "rope_factors_short.weight": "short rope factors (LongRoPE)",
}


#: A reranker's classification head: applied after the forward pass by pooling ``rank``
#: (cooktop/api/rerank.py, as llama.cpp src/llama-graph.cpp build_pooling).
RANK_HEAD = ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")


def _check_unused(f: GGUFFile, cfg: ModelConfig, arch: Architecture) -> None:
    """Refuse any tensor the forward pass would silently ignore (one ``arch`` does not
    declare: a bias, ``rope_freqs.weight``, an unknown ``blk.N.*`` tensor, or a block
    index >= n_layer): running without it would give wrong answers, not an error.

    Raises:
        UnsupportedModelError: naming the first such tensor.
    """
    for name in f.tensors:
        spec = arch.spec(name)
        m = _BLOCK_RE.fullmatch(name)
        block = int(m.group(1)) if m else None
        if block is not None and cfg.n_layer <= block < cfg.n_layer + cfg.n_layer_nextn:
            continue  # a multi-token-prediction block after the trunk: not run (ModelConfig.n_layer_nextn)
        if spec is not None and (block is None or not spec.per_block or block < cfg.n_layer):
            if block is None or not spec.per_block or spec.in_block(cfg, block):
                continue
            kind = "a recurrent" if cfg.is_recurrent(block) else "an attention"
            raise UnsupportedModelError(f"{f.path}: tensor {name!r} does not belong in block {block}, "
                                        f"{kind} block of this {cfg.arch} model")
        if name in RANK_HEAD:
            continue
        if name in _KNOWN_UNUSED:
            what = _KNOWN_UNUSED[name]
        elif name.endswith(".bias"):
            what = "a bias"
        elif spec is not None:
            what = f"block {block} of a model with {cfg.arch}.block_count = {cfg.n_layer}"
        else:
            what = f"a tensor the {cfg.arch} forward pass does not use"
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} ({what}) is not implemented by cooktop")


def _check_tensors(f: GGUFFile, cfg: ModelConfig, arch: Architecture) -> None:
    """Check the file's tensors against ``arch.tensors``: every required tensor exists, every
    present one has the shape the metadata implies (numpy order ``[n_out, n_in]``), there is
    no tensor the architecture does not declare, and every tensor dequantized on the host
    (the token embedding, looked up there, and norm/bias weights, uploaded as float32) has a
    type the host dequantizes.

    Raises:
        UnsupportedModelError: a missing or unused tensor, a shape that contradicts the
            metadata, or a host-dequantized tensor of a type outside ``format.quants.HOST_TYPES``.
    """
    _check_unused(f, cfg, arch)
    if arch.check_tensors is not None:
        arch.check_tensors(f.tensors.keys(), cfg, f.path)
    E, F, V = cfg.n_embd, cfg.n_ff, cfg.n_vocab
    for name, spec in arch.expected(cfg):
        t = f.tensors.get(name)
        if t is None:
            if spec.required:
                raise UnsupportedModelError(
                    f"{f.path}: missing tensor {name!r} ({cfg.arch}.block_count = {cfg.n_layer})")
            continue
        if (spec.unit == INPUT or spec.kind != MATRIX) and t.ggml_type not in HOST_TYPES:
            use = "the embedding lookup" if spec.unit == INPUT else f"its {spec.kind} weight upload"
            raise UnsupportedModelError(
                f"{f.path}: tensor {name!r} has type {t.ggml_type.name}, which cooktop cannot "
                f"dequantize on the host for {use} (supported: {', '.join(t.name for t in HOST_TYPES)})")
        shape = arch.shape_of(spec, cfg, name)
        # a one-row matrix may be stored 1-D, and a one-column one (gemma4's per-expert scale [n_expert, 1])
        if tuple(t.shape) not in (shape, shape[1:] if shape[:1] == (1,) else None,
                                  shape[:-1] if shape[-1:] == (1,) and len(shape) == 2 else None):
            raise UnsupportedModelError(
                f"{f.path}: tensor {name!r} has shape {list(t.shape)}, but the metadata implies {list(shape)} "
                f"(n_embd {E}, n_ff {F}, n_head {cfg.n_head}, n_head_kv {cfg.n_head_kv}, head_dim {cfg.head_dim}, "
                f"n_vocab {V}); the file is inconsistent")


def _head_count_kv(m: Metadata, arch: Architecture, n_head: int, n_layer: int) -> tuple[int, tuple[bool, ...]]:
    """``(n_head_kv, recurrent_layers)`` from ``attention.head_count_kv`` (default ``n_head``).

    A number is every block's. A per-layer array (llama.cpp ``get_key_or_arr``) is accepted for an
    architecture with recurrent layers (``Architecture.recurrent``): its 0 entries mark the recurrent
    blocks (llama.cpp ``is_recr_impl[il] = n_head_kv(il) == 0``, src/models/lfm2.cpp), the others
    must all be one value, the attention blocks' ``n_head_kv``.

    Raises:
        UnsupportedModelError: an array for another architecture, of another length than
            ``block_count``, with attention blocks of different head counts, or with no attention block.
    """
    raw = m.get("attention.head_count_kv")
    if not isinstance(raw, (list, tuple, np.ndarray)):
        return m.num("attention.head_count_kv", default=n_head, minimum=1), ()
    key = m.key("attention.head_count_kv")
    if not arch.recurrent:
        raise UnsupportedModelError(f"{m.path}: per-layer {key!r} is not supported for {arch.name}")
    vals = [int(v) for v in raw]
    if len(vals) != n_layer:
        raise UnsupportedModelError(f"{m.path}: {key!r} has {len(vals)} entries for block_count = {n_layer}")
    kv = sorted({v for v in vals if v != 0})
    if len(kv) != 1 or kv[0] < 1:
        raise UnsupportedModelError(f"{m.path}: {key!r} = {vals}: cooktop needs one head count (> 0) shared by "
                                    "the attention blocks and 0 for the recurrent ones")
    return kv[0], tuple(v == 0 for v in vals)


def _attention_free(arch: Architecture) -> bool:
    """True when the architecture has no attention tensors (mamba2: every block recurrent; its file's
    ``attention.head_count`` and ``feed_forward_length`` are 0 or absent, and not read)."""
    return not any(s.key.startswith("attn_") and s.key != "attn_norm" for s in arch.tensors)


def load_config(f: GGUFFile) -> ModelConfig:
    """Build the :class:`ModelConfig` of an opened GGUF and check its tensors.

    Raises:
        UnsupportedModelError: unsupported architecture (the message lists the supported
            ones), a missing required key, inconsistent values (e.g. n_head_kv not dividing
            n_head), value_length != key_length, an unknown rope scaling type, or a tensor the
            forward pass does not use (see :func:`_check_tensors`).
    """
    if f.metadata.get("general.type") == "adapter":
        raise UnsupportedModelError(f"{f.path} is an adapter (general.type = adapter, adapter.type = "
                                    f"{f.metadata.get('adapter.type', '?')}), not a model: load its base model and "
                                    "pass this file as the LoRA adapter (--lora FILE, Llama(lora_path=...))")
    if f.metadata.get("general.architecture") == "clip" or f.metadata.get("general.type") == "mmproj":
        raise UnsupportedModelError(f"{f.path} is an mmproj (vision projector, general.architecture = clip), not a "
                                    "language model: pass its language model with -m and this file with --mmproj "
                                    "FILE (in Python: Llama(..., chat_handler=MTMDChatHandler(clip_model_path=FILE)))")
    arch = architecture(f.architecture, f.path)
    p = f.path
    m = Metadata(f.metadata, arch.name, p)
    n_embd = m.num("embedding_length", required=True, minimum=1)
    n_layer = m.num("block_count", required=True, minimum=1)
    n_ctx_train = m.num("context_length", required=True, minimum=1)
    if _attention_free(arch):  # mamba2: conversion/mamba.py writes 0 heads and a feed-forward of 0
        n_head = n_head_kv = head_dim = n_rot = 0
        n_ff = m.num("feed_forward_length", default=0, minimum=0)
        recurrent_layers: tuple[bool, ...] = ()
    else:
        n_head = m.num("attention.head_count", required=True, minimum=1)
        if arch.layer_arrays:  # per-layer arrays (gemma4): the largest here, the arrays in arch.hparams
            n_ff, n_head_kv = (max(int(v) for v in np.atleast_1d(m.get(k, default, required=default is None)))
                               for k, default in (("feed_forward_length", None), ("attention.head_count_kv", n_head)))
            recurrent_layers = ()
        else:
            n_ff = m.num("feed_forward_length", required=True, minimum=1)
            n_head_kv, recurrent_layers = _head_count_kv(m, arch, n_head, n_layer)
        if n_embd % n_head and not m.has("attention.key_length"):
            raise UnsupportedModelError(f"{p}: n_head = {n_head} does not divide n_embd = {n_embd}")
        if n_head % n_head_kv:
            raise UnsupportedModelError(f"{p}: n_head_kv = {n_head_kv} does not divide n_head = {n_head}")
        head_dim = m.num("attention.key_length", default=n_embd // n_head, minimum=1)
        v_len = m.num("attention.value_length", default=head_dim, minimum=1)
        if v_len != head_dim:
            raise UnsupportedModelError(
                f"{p}: metadata key '{m.key('attention.value_length')}' = {v_len} differs from key_length = "
                f"{head_dim}; cooktop does not implement value heads of another width")
        n_rot = m.num("rope.dimension_count", default=head_dim, minimum=0)
        if n_rot % 2 or n_rot > head_dim:
            raise UnsupportedModelError(f"{p}: rope dimension count {n_rot} must be even and <= head_dim "
                                        f"{head_dim}")
    rope = rope_scaling(m, n_ctx_train)
    tensors = f.tensors
    if "token_embd.weight" not in tensors:
        raise UnsupportedModelError(f"{p}: missing tensor 'token_embd.weight'")
    n_vocab = tensors["token_embd.weight"].shape[0]
    toks = f.metadata.get("tokenizer.ggml.tokens")
    if toks is not None and len(toks) != n_vocab:
        raise UnsupportedModelError(
            f"{p}: vocabulary has {len(toks)} tokens but token_embd has {n_vocab} rows")
    fields: dict = dict(
        arch=arch.name, n_vocab=n_vocab, n_ctx_train=n_ctx_train, n_embd=n_embd, n_layer=n_layer,
        n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_rot=n_rot, head_dim=head_dim,
        rope_freq_base=float(m.num("rope.freq_base", float, 10000.0, minimum=1e-30)),
        **rope,
        rope_mode=arch.rope_mode,
        recurrent_layers=recurrent_layers,
        tied_output=any(s.tied_to is not None and s.name not in tensors for s in arch.tensors),
    )
    fields.update(arch.hparams(m))  # an architecture's own reading wins (qwen35: its trunk, its recurrent blocks)
    cfg = ModelConfig(**fields)
    if arch.tensor_hparams is not None:  # gemma4: per-block output scalars
        cfg = dataclasses.replace(cfg, **arch.tensor_hparams(f, cfg))
    _check_tensors(f, cfg, arch)
    return cfg
