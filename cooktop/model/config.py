"""ModelConfig: the hyperparameters of a llama-family model, from GGUF metadata.

Keys are ``{arch}.*`` as written by llama.cpp's converters (gguf-py
``gguf.constants.Keys``); defaults for optional keys follow llama.cpp's
``llama_model::load_hparams`` (src/llama-model.cpp).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from ..errors import UnsupportedModelError
from ..format.gguf import GGUFFile

#: Architectures whose forward pass is ``model/forward.py`` (rope mode: normal).
SUPPORTED_ARCHITECTURES = ("llama",)

#: Global tensors the llama forward pass reads (``output.weight`` optional: tied to token_embd).
GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight")

#: Per-block tensors (``blk.N.<name>.weight``) the llama forward pass reads (llama.cpp LLM_ARCH_LLAMA).
BLOCK_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

#: What a known-but-unused tensor is, for the refusal message (llama.cpp tensor names).
_KNOWN_UNUSED = {
    "rope_freqs.weight": "rope frequency factors (Llama-3.1 rope scaling)",
    "rope_factors_long.weight": "long rope factors (LongRoPE)",
    "rope_factors_short.weight": "short rope factors (LongRoPE)",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters (llama.cpp names).

    Attributes:
        arch: ``general.architecture``.
        n_vocab: vocabulary size (tokens).
        n_ctx_train: context length the model was trained with (tokens).
        n_embd: embedding width; n_layer: repeating blocks; n_head / n_head_kv:
            query / key-value heads (GQA when different); n_ff: feed-forward width.
        n_rot: rotary dimensions per head (``rope.dimension_count``, default head_dim).
        head_dim: ``n_embd / n_head`` (or ``attention.key_length``).
        rope_freq_base: theta base (default 10000); rope_freq_scale: 1 / linear scaling factor.
        rms_eps: epsilon of RMSNorm.
        rope_mode: ggml rope mode (0 normal for llama).
        tied_output: True when there is no ``output.weight`` and ``token_embd`` is reused.
    """

    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_rot: int
    head_dim: int
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rms_eps: float = 1e-5
    rope_mode: int = 0
    tied_output: bool = False

    @property
    def n_embd_kv(self) -> int:
        """Width of one K (or V) row: ``n_head_kv * head_dim``."""
        return self.n_head_kv * self.head_dim

    def kv_cache_bytes(self, n_ctx: int, bytes_per_element: int = 4) -> int:
        """KV cache size: 2 x n_layer x n_head_kv x head_dim x n_ctx x bytes per element (bytes)."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * n_ctx * bytes_per_element

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _get(md: dict, key: str, path: str, default: Any = None, required: bool = False) -> Any:
    if key in md:
        return md[key]
    if required:
        raise UnsupportedModelError(f"{path}: missing required metadata key {key!r}")
    return default


def _num(md: dict, key: str, path: str, kind: type = int, default: Any = None, required: bool = False,
         minimum: float | None = None) -> Any:
    """Metadata number ``key`` as ``kind`` (int or float), checked against ``minimum``.

    Raises:
        UnsupportedModelError: missing (when required), not a number (e.g. a string or a
            per-layer array), not an integer for ``kind=int``, or below ``minimum``.
    """
    v = _get(md, key, path, default, required)
    if v is None or v is default:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        text = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        raise UnsupportedModelError(f"{path}: metadata key {key!r} = {text} is not a single number")
    if kind is int and float(v) != int(v):
        raise UnsupportedModelError(f"{path}: metadata key {key!r} = {v!r} is not an integer")
    v = kind(v)
    if minimum is not None and v < minimum:
        raise UnsupportedModelError(f"{path}: metadata key {key!r} = {v!r} is invalid (must be >= {minimum:g})")
    return v


def _check_unused(f: GGUFFile, cfg: "ModelConfig") -> None:
    """Refuse any tensor the llama forward pass would silently ignore (a bias,
    ``rope_freqs.weight``, an unknown ``blk.N.*`` tensor or a block index >= n_layer):
    running without it would give wrong answers, not an error.

    Raises:
        UnsupportedModelError: naming the first such tensor.
    """
    for name in f.tensors:
        if name in GLOBAL_TENSORS:
            continue
        m = _BLOCK_RE.fullmatch(name)
        if m and m.group(2) in BLOCK_TENSORS and int(m.group(1)) < cfg.n_layer:
            continue
        if name in _KNOWN_UNUSED:
            what = _KNOWN_UNUSED[name]
        elif name.endswith(".bias"):
            what = "a bias"
        elif m and m.group(2) in BLOCK_TENSORS:
            what = f"block {m.group(1)} of a model with {cfg.arch}.block_count = {cfg.n_layer}"
        else:
            what = "a tensor the llama forward pass does not use"
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} ({what}) is not implemented by cooktop")


def _check_tensors(f: GGUFFile, cfg: "ModelConfig") -> None:
    """Check that every tensor the llama forward pass uses exists with the shape the
    metadata implies (numpy order ``[n_out, n_in]``; names from llama.cpp's LLM_ARCH_LLAMA),
    that there is no tensor it does not use, and that ``token_embd.weight`` has a type
    the numpy backend dequantizes (the embedding lookup always runs on the host).

    Norm weights (1-D) may be any float type (F32, F16, BF16): nothing checks them here.

    Raises:
        UnsupportedModelError: a missing or unused tensor, a shape that contradicts the
            metadata, or a token_embd type outside ``cooktop.backends.cpu.CPU_TYPES``.
    """
    from ..format.quants import HOST_TYPES as CPU_TYPES

    _check_unused(f, cfg)
    emb = f.tensors["token_embd.weight"]
    if emb.ggml_type not in CPU_TYPES:
        raise UnsupportedModelError(
            f"{f.path}: tensor 'token_embd.weight' has type {emb.ggml_type.name}, which cooktop cannot "
            f"dequantize on the host for the embedding lookup (supported: {', '.join(t.name for t in CPU_TYPES)})")
    E, F, V = cfg.n_embd, cfg.n_ff, cfg.n_vocab
    Q, K = cfg.n_head * cfg.head_dim, cfg.n_embd_kv

    def expected():  # lazily: a corrupt block_count (say 2**31) must not build a huge table
        yield "token_embd.weight", (V, E)
        yield "output_norm.weight", (E,)
        if not cfg.tied_output:
            yield "output.weight", (V, E)
        for i in range(cfg.n_layer):
            b = f"blk.{i}."
            yield from ((b + "attn_norm.weight", (E,)), (b + "attn_q.weight", (Q, E)), (b + "attn_k.weight", (K, E)),
                        (b + "attn_v.weight", (K, E)), (b + "attn_output.weight", (E, Q)),
                        (b + "ffn_norm.weight", (E,)), (b + "ffn_gate.weight", (F, E)),
                        (b + "ffn_up.weight", (F, E)), (b + "ffn_down.weight", (E, F)))

    for name, shape in expected():
        t = f.tensors.get(name)
        if t is None:
            raise UnsupportedModelError(f"{f.path}: missing tensor {name!r} ({cfg.arch}.block_count = {cfg.n_layer})")
        if tuple(t.shape) != shape:
            raise UnsupportedModelError(
                f"{f.path}: tensor {name!r} has shape {list(t.shape)}, but the metadata implies {list(shape)} "
                f"(n_embd {E}, n_ff {F}, n_head {cfg.n_head}, n_head_kv {cfg.n_head_kv}, head_dim {cfg.head_dim}, "
                f"n_vocab {V}); the file is inconsistent")


def load_config(f: GGUFFile) -> ModelConfig:
    """Build the :class:`ModelConfig` of an opened GGUF.

    Raises:
        UnsupportedModelError: unsupported architecture, a missing required key,
            inconsistent values (e.g. n_head not dividing n_embd), value_length !=
            key_length, or a tensor the forward pass does not use (see :func:`_check_tensors`).
    """
    arch = f.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{f.path}: unsupported architecture {arch!r}; cooktop runs llama-family models "
            f"(general.architecture: {', '.join(SUPPORTED_ARCHITECTURES)})")
    md, p = f.metadata, f.path
    n_embd = _num(md, f"{arch}.embedding_length", p, required=True, minimum=1)
    n_layer = _num(md, f"{arch}.block_count", p, required=True, minimum=1)
    n_head = _num(md, f"{arch}.attention.head_count", p, required=True, minimum=1)
    n_ff = _num(md, f"{arch}.feed_forward_length", p, required=True, minimum=1)
    n_ctx_train = _num(md, f"{arch}.context_length", p, required=True, minimum=1)
    n_head_kv = _num(md, f"{arch}.attention.head_count_kv", p, default=n_head, minimum=1)
    if n_embd % n_head:
        raise UnsupportedModelError(f"{p}: n_head = {n_head} does not divide n_embd = {n_embd}")
    if n_head % n_head_kv:
        raise UnsupportedModelError(f"{p}: n_head_kv = {n_head_kv} does not divide n_head = {n_head}")
    head_dim = _num(md, f"{arch}.attention.key_length", p, default=n_embd // n_head, minimum=1)
    if n_head * head_dim != n_embd:
        raise UnsupportedModelError(f"{p}: attention.key_length = {head_dim} with n_head = {n_head} is not "
                                    f"n_embd = {n_embd}; cooktop needs n_head * head_dim == n_embd")
    v_len = _num(md, f"{arch}.attention.value_length", p, default=head_dim, minimum=1)
    if v_len != head_dim:
        raise UnsupportedModelError(
            f"{p}: metadata key '{arch}.attention.value_length' = {v_len} differs from key_length = {head_dim}; "
            f"cooktop does not implement value heads of another width")
    n_rot = _num(md, f"{arch}.rope.dimension_count", p, default=head_dim, minimum=0)
    if n_rot % 2 or n_rot > head_dim:
        raise UnsupportedModelError(f"{p}: rope dimension count {n_rot} must be even and <= head_dim {head_dim}")
    scale = 1.0
    scaling_type = _get(md, f"{arch}.rope.scaling.type", p, "none")
    factor = _num(md, f"{arch}.rope.scaling.factor", p, float, None, minimum=0.0)
    if factor is None and f"{arch}.rope.scale_linear" in md:
        factor, scaling_type = _num(md, f"{arch}.rope.scale_linear", p, float, minimum=0.0), "linear"
    if scaling_type == "linear" and factor:
        scale = 1.0 / float(factor)
    elif scaling_type not in ("none", "linear"):
        raise UnsupportedModelError(f"{p}: rope scaling type {scaling_type!r} is not supported (none, linear)")
    tensors = f.tensors
    if "token_embd.weight" not in tensors:
        raise UnsupportedModelError(f"{p}: missing tensor 'token_embd.weight'")
    n_vocab = tensors["token_embd.weight"].shape[0]
    toks = md.get("tokenizer.ggml.tokens")
    if toks is not None and len(toks) != n_vocab:
        raise UnsupportedModelError(
            f"{p}: vocabulary has {len(toks)} tokens but token_embd has {n_vocab} rows")
    cfg = ModelConfig(
        arch=arch, n_vocab=n_vocab, n_ctx_train=n_ctx_train, n_embd=n_embd, n_layer=n_layer,
        n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_rot=n_rot, head_dim=head_dim,
        rope_freq_base=float(_num(md, f"{arch}.rope.freq_base", p, float, 10000.0, minimum=1e-30)),
        rope_freq_scale=scale,
        rms_eps=float(_num(md, f"{arch}.attention.layer_norm_rms_epsilon", p, float, 1e-5, minimum=0.0)),
        rope_mode=0,
        tied_output="output.weight" not in tensors,
    )
    _check_tensors(f, cfg)
    return cfg
