"""The qwen2 and qwen3 architectures (``general.architecture = qwen2`` / ``qwen3``): Qwen2,
Qwen2.5 (0.5B-72B) and Qwen3 dense (0.6B-32B) models.

Sources: llama.cpp src/models/qwen2.cpp and src/models/qwen3.cpp (``load_arch_hparams``,
``load_arch_tensors``, the graph), src/llama-model.cpp ``create_tensor_qkv`` (the Q/K/V
biases), src/llama-arch.cpp (tensor names and the NeoX rope type of both).

Both are the llama block (``llama.block``: the optional steps run because these
descriptors declare their tensors) with NeoX rope and a required RMS epsilon:

- qwen2 = llama + biases: Q, K and V biases (optional in llama.cpp, present in every Qwen2
  file), an optional ``output.bias``; Q and the attention output are ``n_embd`` wide.
- qwen3 = llama + per-head Q/K norms: RMS norms of Q and K per head (``attn_q_norm``,
  ``attn_k_norm``, of ``head_dim`` values, before rope); ``attention.key_length`` may make
  ``n_head * head_dim`` differ from ``n_embd`` (Qwen3-0.6B: 16 x 128 = 2048 vs 1024).

Tied output (no ``output.weight``) as in llama.cpp (``TENSOR_DUPLICATED``). Not implemented
(refused by ``load_config``): a fused ``attn_qkv`` weight and qwen3's reranker ``cls_out``.
"""

from __future__ import annotations

from ...backends.base import ROPE_NEOX
from . import llama
from .base import rms_eps_hparams
from .descriptor import Architecture
from .skeleton import OUTPUT_BIAS, QK_NORM, llama_tensors, n_embd

#: llama.cpp ``llama_model_qwen2::load_arch_tensors``: llama's, Q n_embd wide, with biases.
QWEN2_TENSORS = llama_tensors(head=(OUTPUT_BIAS,), q_width=n_embd, qkv_bias=True)

#: llama.cpp ``llama_model_qwen3::load_arch_tensors`` (dense): llama's with per-head Q/K norms.
QWEN3_TENSORS = llama_tensors(attn=QK_NORM)

QWEN2 = Architecture(name="qwen2", tensors=QWEN2_TENSORS, rope_mode=ROPE_NEOX, hparams=rms_eps_hparams,
                     block=llama.block)

QWEN3 = Architecture(name="qwen3", tensors=QWEN3_TENSORS, rope_mode=ROPE_NEOX, hparams=rms_eps_hparams,
                     block=llama.block)
