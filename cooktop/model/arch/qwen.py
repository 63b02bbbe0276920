"""The qwen2 and qwen3 architectures (``general.architecture = qwen2`` / ``qwen3``): Qwen2,
Qwen2.5 (0.5B-72B) and Qwen3 dense (0.6B-32B) models.

Sources: llama.cpp src/models/qwen2.cpp and src/models/qwen3.cpp (``load_arch_hparams``,
``load_arch_tensors``, the graph), src/llama-model.cpp ``create_tensor_qkv`` (the Q/K/V
biases), src/llama-arch.cpp (tensor names and the NeoX rope type of both).

Both are the llama block (``llama.block``: the optional steps run because these
descriptors declare their tensors) with NeoX rope:

- qwen2: Q, K and V biases (optional in llama.cpp, present in every Qwen2 file), an
  optional ``output.bias``; Q and the attention output are ``n_embd`` wide.
- qwen3: no biases; RMS norms of Q and K per head (``attn_q_norm``, ``attn_k_norm``, of
  ``head_dim`` values, before rope); ``attention.key_length`` may make ``n_head * head_dim``
  differ from ``n_embd`` (Qwen3-0.6B: 16 x 128 = 2048 vs 1024).

Tied output (no ``output.weight``) as in llama.cpp (``TENSOR_DUPLICATED``). Not implemented
(refused by ``load_config``): a fused ``attn_qkv`` weight and qwen3's reranker ``cls_out``.
"""

from __future__ import annotations

from typing import Any

from ...backends.base import ROPE_NEOX
from ..hparams import Metadata
from .base import HEAD, INPUT, Architecture, bias, matrix, norm
from .llama import block, final_norm, lm_head, scratch


def hparams(m: Metadata) -> dict[str, Any]:
    """The qwen2 / qwen3 keys (llama.cpp ``load_arch_hparams``): ``attention.layer_norm_rms_epsilon``,
    required (also the epsilon of qwen3's Q/K norms).

    Raises:
        UnsupportedModelError: the key is missing or not a number >= 0.
    """
    return {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0))}


_COMMON_OPS = ("rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul")

#: llama.cpp ``llama_model_qwen2::load_arch_tensors``, numpy order [n_out, n_in].
QWEN2_TENSORS = (
    matrix("token_embd.weight", lambda c: (c.n_vocab, c.n_embd), unit=INPUT),
    norm("output_norm.weight", lambda c: (c.n_embd,), unit=HEAD),
    matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD, required=False,
           tied_to="token_embd.weight"),
    bias("output.bias", lambda c: (c.n_vocab,), unit=HEAD, required=False),
    norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.attn_q.weight", lambda c: (c.n_embd, c.n_embd)),
    matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    bias("blk.{i}.attn_q.bias", lambda c: (c.n_embd,), required=False),
    bias("blk.{i}.attn_k.bias", lambda c: (c.n_embd_kv,), required=False),
    bias("blk.{i}.attn_v.bias", lambda c: (c.n_embd_kv,), required=False),
    matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd)),
    norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.ffn_gate.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_up.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff)),
)

#: llama.cpp ``llama_model_qwen3::load_arch_tensors`` (dense), numpy order [n_out, n_in].
QWEN3_TENSORS = (
    matrix("token_embd.weight", lambda c: (c.n_vocab, c.n_embd), unit=INPUT),
    norm("output_norm.weight", lambda c: (c.n_embd,), unit=HEAD),
    matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD, required=False,
           tied_to="token_embd.weight"),
    norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.attn_q.weight", lambda c: (c.n_embd_q, c.n_embd)),
    matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd_q)),
    norm("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,)),
    norm("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,)),
    norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.ffn_gate.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_up.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff)),
)

QWEN2 = Architecture(name="qwen2", tensors=QWEN2_TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, scratch=scratch,
                     block=block, final_norm=final_norm, lm_head=lm_head,
                     block_ops=_COMMON_OPS + ("add_bias",), head_ops=("get_rows", "rmsnorm", "matmul", "add_bias"))

QWEN3 = Architecture(name="qwen3", tensors=QWEN3_TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, scratch=scratch,
                     block=block, final_norm=final_norm, lm_head=lm_head,
                     block_ops=_COMMON_OPS, head_ops=("get_rows", "rmsnorm", "matmul"))
