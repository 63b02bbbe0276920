"""ModelConfig: the hyperparameters of a llama-family model, from GGUF metadata.

Keys are ``{arch}.*`` as written by llama.cpp's converters (gguf-py
``gguf.constants.Keys``); defaults for optional keys follow llama.cpp's
``llama_model::load_hparams`` (src/llama-model.cpp).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UnsupportedModelError
from .gguf import GGUFFile

#: Architectures whose forward pass is ``model/llama.py`` (rope mode: normal).
SUPPORTED_ARCHITECTURES = ("llama",)


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


def load_config(f: GGUFFile) -> ModelConfig:
    """Build the :class:`ModelConfig` of an opened GGUF.

    Raises:
        UnsupportedModelError: unsupported architecture, a missing required key,
            or inconsistent values (e.g. n_head not dividing n_embd).
    """
    arch = f.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{f.path}: unsupported architecture {arch!r}; cooktop runs llama-family models "
            f"(general.architecture: {', '.join(SUPPORTED_ARCHITECTURES)})")
    md, p = f.metadata, f.path
    n_embd = int(_get(md, f"{arch}.embedding_length", p, required=True))
    n_layer = int(_get(md, f"{arch}.block_count", p, required=True))
    n_head = int(_get(md, f"{arch}.attention.head_count", p, required=True))
    n_ff = int(_get(md, f"{arch}.feed_forward_length", p, required=True))
    n_ctx_train = int(_get(md, f"{arch}.context_length", p, required=True))
    n_head_kv = int(_get(md, f"{arch}.attention.head_count_kv", p, n_head))
    if n_head <= 0 or n_embd % n_head:
        raise UnsupportedModelError(f"{p}: n_head = {n_head} does not divide n_embd = {n_embd}")
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise UnsupportedModelError(f"{p}: n_head_kv = {n_head_kv} does not divide n_head = {n_head}")
    head_dim = int(_get(md, f"{arch}.attention.key_length", p, n_embd // n_head))
    n_rot = int(_get(md, f"{arch}.rope.dimension_count", p, head_dim))
    if n_rot % 2 or n_rot > head_dim:
        raise UnsupportedModelError(f"{p}: rope dimension count {n_rot} must be even and <= head_dim {head_dim}")
    scale = 1.0
    scaling_type = _get(md, f"{arch}.rope.scaling.type", p, "none")
    factor = _get(md, f"{arch}.rope.scaling.factor", p, None)
    if factor is None and f"{arch}.rope.scale_linear" in md:
        factor, scaling_type = md[f"{arch}.rope.scale_linear"], "linear"
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
    return ModelConfig(
        arch=arch, n_vocab=n_vocab, n_ctx_train=n_ctx_train, n_embd=n_embd, n_layer=n_layer,
        n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_rot=n_rot, head_dim=head_dim,
        rope_freq_base=float(_get(md, f"{arch}.rope.freq_base", p, 10000.0)),
        rope_freq_scale=scale,
        rms_eps=float(_get(md, f"{arch}.attention.layer_norm_rms_epsilon", p, 1e-5)),
        rope_mode=0,
        tied_output="output.weight" not in tensors,
    )
