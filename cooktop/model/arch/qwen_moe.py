"""The qwen3moe, qwen2moe and olmoe architectures: mixture-of-experts models built on the llama
block (``llama.block_with_factors``) with the MoE feed-forward of ``moe.py``.

Sources: llama.cpp src/models/qwen3moe.cpp, qwen2moe.cpp, olmoe.cpp (``load_arch_hparams``,
``load_arch_tensors``, the graphs), src/llama-graph.cpp ``build_moe_ffn``, src/llama-arch.cpp
(tensor names; NeoX rope for all three).

- qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): qwen3's attention (per-head
  Q/K RMS norms, ``attention.key_length`` heads), softmax router over all experts, top-k weights
  renormalised to sum 1.
- qwen2moe (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention (Q/K/V biases), softmax router
  without renormalisation, and a shared expert (a dense SwiGLU FFN of
  ``expert_shared_feed_forward_length``) scaled by ``sigmoid(xn . ffn_gate_inp_shexp)`` and added.
- olmoe (OLMoE-1B-7B): RMS norms of the whole Q and K rows (``attn_q_norm`` / ``attn_k_norm`` of
  n_embd values), softmax router without renormalisation, experts ``feed_forward_length`` wide.

Tied output as in llama.cpp where it allows it (qwen3moe); a file with tensors these do not
declare is refused by ``load_config``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NEOX, Device
from ..hparams import Metadata, ModelConfig
from . import moe
from .base import HEAD, INPUT, KV, Architecture, Weights, bias, matrix, norm
from .llama import attention_half, ffn_half, final_norm, lm_head


def _rms_eps(m: Metadata) -> dict[str, Any]:
    return {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0))}


def qwen3moe_hparams(m: Metadata) -> dict[str, Any]:
    """qwen3moe keys: the rms epsilon (required) and the MoE keys (``moe.hparams``: softmax, renormalised)."""
    return {**_rms_eps(m), **moe.hparams(m, "softmax", norm=True)}


def qwen2moe_hparams(m: Metadata) -> dict[str, Any]:
    """qwen2moe / olmoe keys: the rms epsilon and the MoE keys (softmax, not renormalised)."""
    return {**_rms_eps(m), **moe.hparams(m, "softmax", norm=False)}


def olmoe_hparams(m: Metadata) -> dict[str, Any]:
    """olmoe keys: as qwen2moe, but an expert is ``feed_forward_length`` wide (llama.cpp olmoe.cpp
    creates the expert tensors with n_ff; ``expert_feed_forward_length`` is not read)."""
    return {**qwen2moe_hparams(m), "n_ff_exp": m.num("feed_forward_length", required=True, minimum=1)}


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers of these blocks (attention and ``moe.scratch``)."""
    E, Q, K = cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv
    return {"x": E, "xn": E, "q": Q, "att": Q, "o": E, "k": K, "v": K, **moe.scratch(cfg)}


def scratch_shared(cfg: ModelConfig) -> dict[str, int]:
    """:func:`scratch` plus the shared expert's buffers (qwen2moe)."""
    return {**scratch(cfg), **moe.shared_scratch(cfg)}


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> None:
    """One block on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place): the llama block's
    attention (optional biases and Q/K norms by the tensors present) and ``moe.ffn``."""
    block_attn(d, cfg, w, s, kv)
    block_ffn(d, cfg, w, s)


def block_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> None:
    """The attention half of :func:`block` (``llama.attention_half``)."""
    attention_half(d, cfg, w, s, kv)


def block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace) -> None:
    """The MoE half of :func:`block`: ``x += moe.ffn(rmsnorm(x) * ffn_norm)``."""
    ffn_half(d, cfg, w, s, moe.ffn)


def _attn(q_norm: bool, biases: bool, q_width=lambda c: c.n_embd_q):
    out = [
        norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
        matrix("blk.{i}.attn_q.weight", lambda c: (q_width(c), c.n_embd)),
        matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
        matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)),
        matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, q_width(c))),
        norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    ]
    if biases:
        out += [bias("blk.{i}.attn_q.bias", lambda c: (q_width(c),), required=False),
                bias("blk.{i}.attn_k.bias", lambda c: (c.n_embd_kv,), required=False),
                bias("blk.{i}.attn_v.bias", lambda c: (c.n_embd_kv,), required=False)]
    return out


def _globals(tied: bool):
    return [
        matrix("token_embd.weight", lambda c: (c.n_vocab, c.n_embd), unit=INPUT),
        norm("output_norm.weight", lambda c: (c.n_embd,), unit=HEAD),
        matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD, required=not tied,
               tied_to="token_embd.weight" if tied else None),
    ]


#: llama.cpp ``llama_model_qwen3moe::load_arch_tensors``, numpy order.
QWEN3MOE_TENSORS = tuple(_globals(True) + _attn(False, False) + [
    norm("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,)),
    norm("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,)),
] + list(moe.tensors()))

#: llama.cpp ``llama_model_qwen2moe::load_arch_tensors`` (Q/K/V biases optional there, present in files).
QWEN2MOE_TENSORS = tuple(_globals(False) + _attn(False, True, lambda c: c.n_embd) + list(moe.tensors(shared=True)))

#: llama.cpp ``llama_model_olmoe::load_arch_tensors``: Q and K norms over the whole row.
OLMOE_TENSORS = tuple(_globals(False) + _attn(False, False, lambda c: c.n_embd) + [
    norm("blk.{i}.attn_q_norm.weight", lambda c: (c.n_embd,)),
    norm("blk.{i}.attn_k_norm.weight", lambda c: (c.n_embd,)),
] + list(moe.tensors()))

_ATTN_OPS = ("rmsnorm", "matmul", "rope", "kv_store", "attention", "add")
_FFN_OPS = ("rmsnorm",) + moe.MOE_BLOCK_OPS
_OPS = ("rmsnorm", "rope", "kv_store", "attention") + moe.MOE_BLOCK_OPS
_HEAD_OPS = ("get_rows", "rmsnorm", "matmul")

QWEN3MOE = Architecture(name="qwen3moe", tensors=QWEN3MOE_TENSORS, rope_mode=ROPE_NEOX, hparams=qwen3moe_hparams,
                        scratch=scratch, block=block, final_norm=final_norm, lm_head=lm_head,
                        block_ops=_OPS, head_ops=_HEAD_OPS, scratch_i32=moe.scratch_i32, attn_ops=_ATTN_OPS,
                        block_attn=block_attn, block_ffn=block_ffn, ffn_ops=_FFN_OPS)
QWEN2MOE = Architecture(name="qwen2moe", tensors=QWEN2MOE_TENSORS, rope_mode=ROPE_NEOX, hparams=qwen2moe_hparams,
                        scratch=scratch_shared, block=block, final_norm=final_norm, lm_head=lm_head,
                        block_ops=_OPS + ("add_bias",), head_ops=_HEAD_OPS, scratch_i32=moe.scratch_i32,
                        attn_ops=_ATTN_OPS + ("add_bias",), block_attn=block_attn, block_ffn=block_ffn,
                        ffn_ops=_FFN_OPS)
OLMOE = Architecture(name="olmoe", tensors=OLMOE_TENSORS, rope_mode=ROPE_NEOX, hparams=olmoe_hparams,
                     scratch=scratch, block=block, final_norm=final_norm, lm_head=lm_head,
                     block_ops=_OPS, head_ops=_HEAD_OPS, scratch_i32=moe.scratch_i32, attn_ops=_ATTN_OPS,
                     block_attn=block_attn, block_ffn=block_ffn, ffn_ops=_FFN_OPS)
