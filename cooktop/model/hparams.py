"""ModelConfig (the hyper-parameters of a model) and Metadata (typed reads of GGUF keys).

This is the bottom of ``model/``: the architecture descriptors (``model/arch/``) and
``model/config.py`` (``load_config``) both build on it, as llama.cpp's per-architecture
code builds on ``llama_hparams`` (src/llama-hparams.h). ``ModelConfig`` is re-exported
by ``model/config.py``, where most callers import it from.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..errors import UnsupportedModelError


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters (llama.cpp names).

    Attributes:
        arch: ``general.architecture`` (a key of ``model.arch.ARCHITECTURES``).
        n_vocab: vocabulary size (tokens).
        n_ctx_train: context length the model was trained with (tokens).
        n_embd: embedding width; n_layer: repeating blocks; n_head / n_head_kv:
            query / key-value heads (GQA when different); n_ff: feed-forward width.
        n_rot: rotary dimensions per head (``rope.dimension_count``, default head_dim).
        head_dim: ``n_embd / n_head`` (or ``attention.key_length``).
        rope_freq_base: theta base (default 10000); rope_freq_scale: 1 / ``rope.scaling.factor``
            (1 without scaling or with type ``none``).
        rope_scaling_type: ``rope.scaling.type`` as llama.cpp reads it (``linear`` when absent).
        rope_ext_factor, rope_attn_factor, rope_yarn_beta_fast, rope_yarn_beta_slow, n_ctx_orig_yarn:
            ggml_rope_ext's YaRN arguments as llama.cpp's context derives them
            (src/llama-context.cpp: ext_factor 1 for YaRN else 0; attn_factor corrected for YaRN
            and times ``rope.scaling.attn_factor``; n_ctx_orig from
            ``rope.scaling.original_context_length``, default n_ctx_train).
        rms_eps: epsilon of RMSNorm.
        rope_mode: ggml rope mode of the architecture (0 normal, 2 NeoX; ``Architecture.rope_mode``).
        tied_output: True when there is no ``output.weight`` and ``token_embd`` is reused.
        n_swa: sliding window of the SWA layers (tokens; ``attention.sliding_window``), 0 = none.
        swa_layers: per block, True when it is a sliding-window layer (llama.cpp ``is_swa(il)``).
        rope_freq_base_swa, rope_freq_scale_swa: rope base and scale of the SWA layers
            (llama.cpp ``rope_freq_base_train_swa``: ``rope.freq_base_swa``, default 10000; scale 1).
        attn_scale: the query scale when the architecture sets one (gemma3:
            ``1/sqrt(attention.key_length)``); 0 means ``1/sqrt(head_dim)``.
        n_expert, n_expert_used: experts per MoE block and experts each token uses (``expert_count``,
            ``expert_used_count``); 0 for dense models.
        n_ff_exp, n_ff_shexp: feed-forward width of one expert (``expert_feed_forward_length``) and of
            the shared expert (``expert_shared_feed_forward_length``).
        expert_gating: the router's gating function (``backends.moe_ops.GATING``).
        expert_weights_norm: renormalise the selected experts' weights to sum 1.
        expert_weights_scale: factor of the selected experts' weights (0 or 1: none).
        n_layer_dense_lead: the first blocks with a dense feed-forward in place of the experts
            (``leading_dense_block_count``, llama.cpp ``n_layer_dense_lead``: glm4moe); 0: none.
        recurrent_layers: per block, True when it is a recurrent layer (llama.cpp ``is_recr(il)``;
            lfm2: the blocks whose ``attention.head_count_kv`` entry is 0); () when none is.
        n_conv: the short convolution's kernel length (lfm2 ``shortconv.l_cache``, qwen35
            ``ssm.conv_kernel``: its state keeps the last ``n_conv - 1`` inputs); 0 without recurrent layers.
        ssm_d_state, ssm_n_group, ssm_dt_rank, ssm_d_inner: the gated delta-net's head width (``ssm.state_size``),
            key heads (``ssm.group_count``), value heads (``ssm.time_step_rank``) and value width
            (``ssm.inner_size`` = value heads x head width); llama.cpp ``hparams.ssm_*``; 0 without.
        n_layer_nextn: multi-token-prediction blocks after the ``n_layer`` trunk blocks
            (``nextn_predict_layers``; their tensors are skipped); 0 without.
        rope_sections: multi-section rope's sections (``rope.dimension_sections``, 4 values; () without).
            Mamba-2 (granitehybrid, mamba2) reads the ``ssm_*`` fields as llama.cpp does: ``ssm_d_state`` the
            state size N, ``ssm_n_group`` the groups of B and C, ``ssm_dt_rank`` the heads, ``ssm_d_inner``
            heads x head width.
        embedding_scale, residual_scale, logit_scale: Granite's multipliers (``embedding_scale``: the token
            embeddings times it; ``residual_scale``: each block's attention / SSM and FFN outputs times it
            before the residual add; ``logit_scale``: the logits divided by it); 0 means none (llama.cpp
            ``f_embedding_scale``, ``f_residual_scale``, ``f_logit_scale``).
        attn_temp_scale: the attention temperature's beta (mistral3 ``attention.temperature_scale``,
            llama.cpp ``f_attn_temp_scale``): queries at position p are scaled by
            ``1 + beta * ln(1 + floor(p / n_ctx_orig_yarn))``; 0 means none.
        use_rope: False when the attention blocks rotate nothing (Granite 4.0-H's NoPE attention:
            ``rope.scaling.finetuned`` false, llama.cpp ``hparams.rope_pattern`` / ``has_rope``).
        head_dim_swa, n_rot_swa: head width and rotated dimensions of the sliding-window layers when they
            differ from the others' (gemma4: ``attention.key_length_swa``, ``rope.dimension_count_swa``;
            llama.cpp ``n_embd_head_k_swa``, ``n_rot_swa``); 0: ``head_dim`` / ``n_rot``.
        n_ff_layers, n_head_kv_layers: per block, the feed-forward width and KV heads when they vary
            (gemma4's ``feed_forward_length`` / ``attention.head_count_kv`` arrays: double-wide MLPs,
            fewer KV heads on full-attention layers); (): ``n_ff`` / ``n_head_kv`` everywhere (those
            fields then hold the largest value).
        n_layer_kv: blocks ``0 .. n_layer_kv - 1`` keep their own K/V, the later ones read an earlier
            block's cache (gemma4 ``attention.shared_kv_layers``; llama.cpp ``n_layer_kv_from_start``
            and the KV cache's ``reuse`` callback); 0: every block keeps its own.
        n_embd_per_layer: width of each block's per-layer token embedding input (gemma4
            ``embedding_length_per_layer_input``); 0: none.
        final_logit_softcap: ``c`` of ``logits = c * tanh(logits / c)`` (``final_logit_softcapping``);
            0: no cap.
        layer_out_scales: per block, the scalar its output is multiplied by (gemma4's
            ``blk.N.layer_output_scale`` tensors, read at load); (): none.

    A hyper-parameter that only some architectures have (a sliding window, a logit
    softcap) is added here with a neutral default, as llama.cpp's ``llama_hparams``
    does, and set by that architecture's ``hparams`` function.
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
    rope_scaling_type: str = "linear"
    rope_ext_factor: float = 0.0
    rope_attn_factor: float = 1.0
    rope_yarn_beta_fast: float = 32.0
    rope_yarn_beta_slow: float = 1.0
    n_ctx_orig_yarn: int = 0
    rms_eps: float = 1e-5
    rope_mode: int = 0
    tied_output: bool = False
    n_swa: int = 0
    swa_layers: tuple[bool, ...] = ()
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale_swa: float = 1.0
    attn_scale: float = 0.0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    expert_gating: str = "softmax"
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0
    n_layer_dense_lead: int = 0
    recurrent_layers: tuple[bool, ...] = ()
    n_conv: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    ssm_d_inner: int = 0
    rope_sections: tuple[int, ...] = ()
    n_layer_nextn: int = 0
    embedding_scale: float = 0.0
    residual_scale: float = 0.0
    logit_scale: float = 0.0
    use_rope: bool = True
    attn_temp_scale: float = 0.0
    head_dim_swa: int = 0
    n_rot_swa: int = 0
    n_ff_layers: tuple[int, ...] = ()
    n_head_kv_layers: tuple[int, ...] = ()
    n_layer_kv: int = 0
    n_embd_per_layer: int = 0
    final_logit_softcap: float = 0.0
    layer_out_scales: tuple[float, ...] = ()

    @property
    def per_layer_shapes(self) -> bool:
        """True when some block's head width, rotation, KV heads or feed-forward width differ from
        the model-wide fields (:meth:`layer`)."""
        return bool(self.head_dim_swa or self.n_rot_swa or self.n_ff_layers or self.n_head_kv_layers)

    def layer(self, il: int) -> ModelConfig:
        """The config as block ``il`` sees it: ``head_dim``, ``n_rot``, ``n_head_kv`` and ``n_ff`` that
        block's (llama.cpp ``n_embd_head_k(il)``, ``n_rot(il)``, ``n_head_kv(il)``, ``n_ff(il)``); the
        per-layer fields are cleared in the view, so ``layer`` of a view is the view. ``self`` when
        nothing varies per block."""
        if not self.per_layer_shapes:
            return self
        swa = bool(self.swa_layers) and self.swa_layers[il]
        return dataclasses.replace(
            self, head_dim=(self.head_dim_swa or self.head_dim) if swa else self.head_dim,
            n_rot=(self.n_rot_swa or self.n_rot) if swa else self.n_rot,
            n_head_kv=self.n_head_kv_layers[il] if self.n_head_kv_layers else self.n_head_kv,
            n_ff=self.n_ff_layers[il] if self.n_ff_layers else self.n_ff,
            head_dim_swa=0, n_rot_swa=0, n_ff_layers=(), n_head_kv_layers=())

    def has_kv(self, il: int) -> bool:
        """True when block ``il`` keeps K/V of its own (llama.cpp ``hparams.has_kv(il)``): not a
        recurrent block and not one that reads an earlier block's cache (:attr:`n_layer_kv`)."""
        return not self.is_recurrent(il) and (not self.n_layer_kv or il < self.n_layer_kv)

    def kv_source(self, il: int) -> int:
        """The block whose cache block ``il`` attends over: ``il`` itself, or for a block past
        :attr:`n_layer_kv` the last earlier block of its kind, ``n_layer_kv - 2`` for a sliding-window
        block and ``n_layer_kv - 1`` for a full-attention one (llama.cpp src/llama-model.cpp, the
        gemma3n / gemma4 ``reuse`` callback of the KV cache)."""
        if not self.n_layer_kv or il < self.n_layer_kv:
            return il
        swa = bool(self.swa_layers) and self.swa_layers[il]
        return self.n_layer_kv - (2 if swa else 1)

    def kv_width(self, il: int) -> int:
        """Values per K (or V) cache row of block ``il``: its ``n_head_kv * head_dim``; 0 when it keeps
        no K/V (:meth:`has_kv`)."""
        return self.layer(il).n_embd_kv if self.has_kv(il) else 0

    def is_recurrent(self, il: int) -> bool:
        """True when block ``il`` is a recurrent layer (llama.cpp ``hparams.is_recr(il)``)."""
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    @property
    def n_embd_q(self) -> int:
        """Width of one query row (and of the attention output): ``n_head * head_dim``."""
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        """Width of one K (or V) row: ``n_head_kv * head_dim``."""
        return self.n_head_kv * self.head_dim

    def rope_params(self) -> dict[str, Any]:
        """Keyword arguments of ``Device.rope`` for this model (all but ``freq_factors``):
        ``d.rope(q, q, pos, **cfg.rope_params(), freq_factors=w.get("rope_freqs"))``."""
        return {"head_dim": self.head_dim, "n_rot": self.n_rot, "freq_base": self.rope_freq_base,
                "freq_scale": self.rope_freq_scale, "mode": self.rope_mode, "ext_factor": self.rope_ext_factor,
                "attn_factor": self.rope_attn_factor, "beta_fast": self.rope_yarn_beta_fast,
                "beta_slow": self.rope_yarn_beta_slow, "n_ctx_orig": self.n_ctx_orig_yarn or self.n_ctx_train}

    def kv_cache_bytes(self, n_ctx: int, bytes_per_element: int = 4) -> int:
        """KV cache size: 2 x n_ctx x bytes per element x the K widths of the blocks that keep K/V
        (:meth:`kv_width`: recurrent blocks and blocks reading another's cache hold none), in bytes."""
        return 2 * n_ctx * bytes_per_element * sum(self.kv_width(il) for il in range(self.n_layer))

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (``cooktop info``)."""
        return dataclasses.asdict(self)


class Metadata:
    """Typed reads of a GGUF's ``{arch}.*`` metadata keys, with errors that name the file and key.

    Args:
        md: the GGUF metadata (key -> decoded value).
        arch: ``general.architecture``; ``name`` arguments below omit the ``{arch}.`` prefix
            (``"attention.head_count"`` reads ``llama.attention.head_count``).
        path: the file, for messages.
    """

    def __init__(self, md: dict[str, Any], arch: str, path: str):
        self.md, self.arch, self.path = md, arch, path

    def key(self, name: str) -> str:
        """The full GGUF key of ``name``: ``{arch}.{name}``."""
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        """True when the file has ``{arch}.{name}``."""
        return self.key(name) in self.md

    def get(self, name: str, default: Any = None, required: bool = False) -> Any:
        """The raw value of ``{arch}.{name}``, or ``default`` when absent.

        Raises:
            UnsupportedModelError: absent and ``required``.
        """
        key = self.key(name)
        if key in self.md:
            return self.md[key]
        if required:
            raise UnsupportedModelError(f"{self.path}: missing required metadata key {key!r}")
        return default

    def num(self, name: str, kind: type = int, default: Any = None, required: bool = False,
            minimum: float | None = None) -> Any:
        """``{arch}.{name}`` as ``kind`` (int or float), checked against ``minimum``; ``default`` when absent.

        Raises:
            UnsupportedModelError: missing (when required), not a number (e.g. a string or a
                per-layer array), not an integer for ``kind=int``, or below ``minimum``.
        """
        key = self.key(name)
        v = self.get(name, default, required)
        if v is None or v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            text = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
            raise UnsupportedModelError(f"{self.path}: metadata key {key!r} = {text} is not a single number")
        if kind is int and float(v) != int(v):
            raise UnsupportedModelError(f"{self.path}: metadata key {key!r} = {v!r} is not an integer")
        v = kind(v)
        if minimum is not None and v < minimum:
            raise UnsupportedModelError(
                f"{self.path}: metadata key {key!r} = {v!r} is invalid (must be >= {minimum:g})")
        return v


#: ``rope.scaling.type`` values llama.cpp knows (src/llama-model.cpp LLAMA_ROPE_SCALING_TYPES).
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


def rope_scaling(m: Metadata, n_ctx_train: int) -> dict[str, Any]:
    """The rope scaling fields of :class:`ModelConfig`, as llama.cpp derives them.

    ``llama_model_base::load_hparams`` (src/llama-model.cpp): the type defaults to
    ``linear``; the factor is ``rope.scaling.factor`` (else the old ``rope.scale_linear``),
    ``freq_scale = 1 / factor`` (1 when absent or 0); ``rope.scaling.attn_factor`` and
    ``rope.scaling.original_context_length`` (default n_ctx_train) are optional.
    ``llama_context`` (src/llama-context.cpp): type ``none`` forces freq_scale 1; YaRN sets
    ext_factor 1 and attn_factor ``mscale(factor) / (1 + 0.1 ln factor)`` (which ggml's
    rope_yarn multiplies back by ``1 + 0.1 ln factor``), then times ``rope.scaling.attn_factor``.

    Raises:
        UnsupportedModelError: a scaling type llama.cpp does not know, or a non-numeric value.
    """
    kind = m.get("rope.scaling.type", "linear")
    if kind not in ROPE_SCALING_TYPES:
        raise UnsupportedModelError(f"{m.path}: rope scaling type {kind!r} ({m.key('rope.scaling.type')}) is "
                                    f"not supported ({', '.join(ROPE_SCALING_TYPES)})")
    factor = m.num("rope.scaling.factor", float, None, minimum=0.0)
    if factor is None:
        factor = m.num("rope.scale_linear", float, 0.0, minimum=0.0)
    scale = 1.0 if not factor or kind == "none" else 1.0 / factor
    ext_factor = 1.0 if kind == "yarn" else 0.0
    attn_factor = 1.0
    if ext_factor != 0.0:
        f = 1.0 / scale
        mscale = 1.0 if f <= 1.0 else 0.1 * math.log(f) + 1.0
        attn_factor = mscale / (1.0 + 0.1 * math.log(f))
    attn_factor *= m.num("rope.scaling.attn_factor", float, 1.0)
    n_ctx_orig = m.num("rope.scaling.original_context_length", int, 0, minimum=0) or n_ctx_train
    return {"rope_freq_scale": scale, "rope_scaling_type": str(kind), "rope_ext_factor": ext_factor,
            "rope_attn_factor": attn_factor, "n_ctx_orig_yarn": n_ctx_orig}
