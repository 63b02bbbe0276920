"""The qwen3moe, qwen2moe and olmoe architectures: mixture-of-experts models: llama's
attention and the MoE feed-forward, in the halves of ``moe.py`` (``moe.block``).

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

Tensors: ``skeleton.llama_tensors`` with the MoE FFN (``skeleton.moe_ffn``). Tied output as in
llama.cpp where it allows it (qwen3moe); a file with tensors these do not declare is refused by
``load_config``.
"""

from __future__ import annotations

from typing import Any

from ...backends.base import ROPE_NEOX
from ..hparams import Metadata
from . import moe
from .base import norm, rms_eps_hparams
from .builders import moe_scratch, moe_scratch_i32, moe_shared_scratch
from .descriptor import Architecture
from .skeleton import OUTPUT_UNTIED, QK_NORM, llama_tensors, moe_ffn, n_embd


def qwen3moe_hparams(m: Metadata) -> dict[str, Any]:
    """qwen3moe keys: the rms epsilon (required) and the MoE keys (``moe.hparams``: softmax, renormalised)."""
    return {**rms_eps_hparams(m), **moe.hparams(m, "softmax", norm=True)}


def qwen2moe_hparams(m: Metadata) -> dict[str, Any]:
    """qwen2moe / olmoe keys: the rms epsilon and the MoE keys (softmax, not renormalised)."""
    return {**rms_eps_hparams(m), **moe.hparams(m, "softmax", norm=False)}


def olmoe_hparams(m: Metadata) -> dict[str, Any]:
    """olmoe keys: as qwen2moe, but an expert is ``feed_forward_length`` wide (llama.cpp olmoe.cpp
    creates the expert tensors with n_ff; ``expert_feed_forward_length`` is not read)."""
    return {**qwen2moe_hparams(m), "n_ff_exp": m.num("feed_forward_length", required=True, minimum=1)}


#: llama.cpp ``llama_model_qwen3moe::load_arch_tensors``: qwen3's attention (per-head Q/K norms), experts.
QWEN3MOE_TENSORS = llama_tensors(attn=QK_NORM, ffn=moe_ffn())

#: llama.cpp ``llama_model_qwen2moe::load_arch_tensors``: qwen2's attention (Q/K/V biases, optional
#: there, present in files), output required, experts and the shared expert.
QWEN2MOE_TENSORS = llama_tensors(output=OUTPUT_UNTIED, q_width=n_embd, qkv_bias=True, ffn=moe_ffn(shared=True))

#: llama.cpp ``llama_model_olmoe::load_arch_tensors``: Q and K norms over the whole row (n_embd).
OLMOE_TENSORS = llama_tensors(output=OUTPUT_UNTIED, q_width=n_embd, ffn=moe_ffn(),
                              attn=(norm("blk.{i}.attn_q_norm.weight", lambda c: (c.n_embd,)),
                                    norm("blk.{i}.attn_k_norm.weight", lambda c: (c.n_embd,))))

_MOE: dict[str, Any] = dict(rope_mode=ROPE_NEOX, block=moe.block, block_attn=moe.block_attn,
                            block_ffn=moe.block_ffn, scratch=moe_scratch, scratch_i32=moe_scratch_i32)

QWEN3MOE = Architecture(name="qwen3moe", tensors=QWEN3MOE_TENSORS, hparams=qwen3moe_hparams, **_MOE)
QWEN2MOE = Architecture(name="qwen2moe", tensors=QWEN2MOE_TENSORS, hparams=qwen2moe_hparams,
                        **{**_MOE, "scratch": moe_shared_scratch})
OLMOE = Architecture(name="olmoe", tensors=OLMOE_TENSORS, hparams=olmoe_hparams, **_MOE)
