"""The phi3 architecture (``general.architecture = phi3``): Phi-3 / Phi-3.5 mini and medium,
Phi-4 mini (dense).

Sources: llama.cpp src/models/phi3.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph), src/llama-graph.cpp (``build_qkv``'s fused path, ``build_ffn`` with
``LLM_FFN_SWIGLU``/``ggml_swiglu``), src/llama-model.cpp (``get_rope_factors``),
src/llama-context.cpp (``n_ctx`` padding, attn_factor), conversion/phi.py (the converter).

Block: llama's (``llama.block``), with NeoX rope::

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
(default n_ctx_train), else the short ones (``builders.rope_factors``, as for every block).
``rope.scaling.attn_factor`` (the converter's ``sqrt(1 + ln(scale) / ln(n_ctx_orig))``) multiplies
cos and sin (``rope_params``).
A sliding window in the file is ignored, as llama.cpp does (it warns "Phi SWA is currently
disabled").

Not implemented (refused by ``load_config``): separate ``attn_q/k/v`` weights (llama.cpp
accepts them; converted Phi-3 files have the fused one), QKV and output biases, and
PhiMoE's experts.
"""

from __future__ import annotations

from ...backends.base import ROPE_NEOX
from . import llama
from .base import TensorSpec, rms_eps_hparams
from .descriptor import Architecture
from .skeleton import FFN_DOWN, FUSED_QKV, LONGROPE, llama_tensors

#: the fused gate and up matrices, uploaded as ``ffn_gate`` and ``ffn_up`` (gate first, ``ggml_swiglu``)
FUSED_UP = TensorSpec("blk.{i}.ffn_up.weight", lambda c: (2 * c.n_ff, c.n_embd),
                      parts=(("ffn_gate", lambda c: c.n_ff), ("ffn_up", lambda c: c.n_ff)))

#: llama.cpp ``llama_model_phi3::load_arch_tensors`` (fused QKV): llama's with LongRoPE factors
#: and fused matrices.
TENSORS = llama_tensors(shared=LONGROPE, qkv=FUSED_QKV, ffn=(FFN_DOWN, FUSED_UP))

PHI3 = Architecture(name="phi3", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=rms_eps_hparams, block=llama.block)
