"""The phi3 architecture (``general.architecture = phi3``): Phi-3 / Phi-3.5 mini and medium,
Phi-4 mini (dense).

Sources: llama.cpp src/models/phi3.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph), src/llama-graph.cpp (``build_qkv``'s fused path, ``build_ffn`` with
``LLM_FFN_SWIGLU``/``ggml_swiglu``), src/llama-model.cpp (``get_rope_factors``),
src/llama-context.cpp (``n_ctx`` padding, attn_factor), conversion/phi.py (the converter).

Block::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wqkv^T split at rows n_embd, n_embd + n_embd_kv   (fused attn_qkv)
    rope(q), rope(k)  NeoX, with LongRoPE factors when the file has them
    cache[pos] = k, v ; x += attention(q, cache) @ Wo^T
    xn = rmsnorm(x) * ffn_norm
    g, u = xn @ Wup^T split at row n_ff            (fused ffn_up: gate first, ggml_swiglu)
    x += (silu(g) * u) @ Wd^T

Head: ``(rmsnorm(x) * output_norm) @ Wout^T`` (Wout = token_embd when tied).

The fused weights are uploaded as row ranges (``TensorSpec.parts``): ``attn_qkv`` as
``attn_q``, ``attn_k``, ``attn_v`` and ``ffn_up`` as ``ffn_gate``, ``ffn_up``.

LongRoPE (Phi-3 128k models): ``rope_factors_long`` / ``rope_factors_short`` (f32 [n_rot/2])
are rope frequency factors; llama.cpp uses the long ones when the context per sequence,
``n_ctx`` padded up to a multiple of 256, exceeds ``rope.scaling.original_context_length``
(default n_ctx_train), else the short ones. ``rope.scaling.attn_factor`` (the converter's
``sqrt(1 + ln(scale) / ln(n_ctx_orig))``) multiplies cos and sin (``rope_params``).
A sliding window in the file is ignored, as llama.cpp does (it warns "Phi SWA is currently
disabled").

Not implemented (refused by ``load_config``): separate ``attn_q/k/v`` weights (llama.cpp
accepts them; converted Phi-3 files have the fused one), QKV and output biases, and
PhiMoE's experts.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NEOX, Device, DeviceTensor
from ..hparams import Metadata, ModelConfig
from .base import BLOCK, HEAD, INPUT, KV, Architecture, TensorSpec, Weights, matrix, norm
from .llama import block_with_factors, final_norm, lm_head

#: llama.cpp pads n_ctx to a multiple of this (``GGML_PAD(cparams.n_ctx, 256)``, llama-context.cpp).
N_CTX_PAD = 256


def hparams(m: Metadata) -> dict[str, Any]:
    """The phi3 keys (llama.cpp ``llama_model_phi3::load_arch_hparams``): the RMS epsilon (required).

    Raises:
        UnsupportedModelError: ``attention.layer_norm_rms_epsilon`` missing or not a number >= 0.
    """
    return {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0))}


#: llama.cpp ``llama_model_phi3::load_arch_tensors`` (fused QKV), numpy order [n_out, n_in].
TENSORS = (
    matrix("token_embd.weight", lambda c: (c.n_vocab, c.n_embd), unit=INPUT),
    norm("output_norm.weight", lambda c: (c.n_embd,), unit=HEAD),
    matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD, required=False,
           tied_to="token_embd.weight"),
    # LongRoPE factors: global tensors every block uses (TENSOR_DUPLICATED past block 0)
    norm("rope_factors_long.weight", lambda c: (c.n_rot // 2,), unit=BLOCK, required=False),
    norm("rope_factors_short.weight", lambda c: (c.n_rot // 2,), unit=BLOCK, required=False),
    norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    TensorSpec("blk.{i}.attn_qkv.weight", lambda c: (c.n_embd_q + 2 * c.n_embd_kv, c.n_embd),
               parts=(("attn_q", lambda c: c.n_embd_q), ("attn_k", lambda c: c.n_embd_kv),
                      ("attn_v", lambda c: c.n_embd_kv))),
    matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd_q)),
    norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff)),
    TensorSpec("blk.{i}.ffn_up.weight", lambda c: (2 * c.n_ff, c.n_embd),
               parts=(("ffn_gate", lambda c: c.n_ff), ("ffn_up", lambda c: c.n_ff))),
)


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers :func:`block` uses."""
    E, Q, K, F = cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv, cfg.n_ff
    return {"x": E, "xn": E, "q": Q, "att": Q, "o": E, "k": K, "v": K, "gate": F, "up": F}


def rope_factors(cfg: ModelConfig, w: Weights, n_ctx: int) -> DeviceTensor | None:
    """The LongRoPE factors llama.cpp picks (``get_rope_factors``) for a cache of ``n_ctx`` rows:
    long when ``n_ctx`` padded to :data:`N_CTX_PAD` exceeds the original context, else short
    (None when the file has neither)."""
    n_ctx_seq = -(-n_ctx // N_CTX_PAD) * N_CTX_PAD
    n_ctx_orig = cfg.n_ctx_orig_yarn or cfg.n_ctx_train
    return w.get("rope_factors_long") if n_ctx_seq > n_ctx_orig else w.get("rope_factors_short")


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> None:
    """One phi3 block (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place).

    Args:
        w: this block's weights: :data:`TENSORS`' keys with the fused ones split
            (``attn_q``, ``attn_k``, ``attn_v``, ``ffn_gate``, ``ffn_up``).
        s: scratch buffers of :func:`scratch` cut to ``n`` rows.
        kv: positions and this block's cache (:class:`~.base.KV`; ``kv.n_ctx``, the context
            length, chooses the LongRoPE factors); cells ``kv.cells`` are written.
    """
    # llama's block: phi3 has none of its optional tensors; only the rope factors differ
    block_with_factors(d, cfg, w, s, kv, rope_factors(cfg, w, kv.n_ctx))


PHI3 = Architecture(name="phi3", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, scratch=scratch,
                    block=block, final_norm=final_norm, lm_head=lm_head,
                    block_ops=("rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"),
                    head_ops=("get_rows", "rmsnorm", "matmul"))
