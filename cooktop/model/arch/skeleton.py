"""The tensor skeleton every architecture here starts from: llama's, and the pieces others add.

llama.cpp writes the same ``create_tensor`` calls in each ``llama_model_<arch>::load_arch_tensors``
(src/models/<arch>.cpp) and shares only the Q/K/V part (``create_tensor_qkv``, src/llama-model.cpp);
here :func:`llama_tensors` is the skeleton once, and an architecture passes what it adds or swaps:

- ``head``: tensors of the output head beyond ``output_norm`` and ``output`` (qwen2's ``output.bias``),
- ``shared``: global tensors every block reads (:data:`ROPE_FREQS`, :data:`LONGROPE`),
- ``q_width``, ``qkv_bias``: the width of Q and of the attention output (qwen2: ``n_embd``), and
  the optional Q/K/V biases (:func:`attn_qkv`); or ``qkv``: other Q/K/V tensors (:data:`FUSED_QKV`),
- ``attn``: per-block tensors after ``attn_output`` (:data:`QK_NORM`, gemma3's post-attention norm),
- ``output``: the LM head matrix in place of :data:`OUTPUT` (:data:`OUTPUT_UNTIED`: required),
- ``ffn_norm``: the pre-FFN norm in place of :data:`FFN_NORM` (gpt-oss's ``post_attention_norm``),
- ``ffn``: the feed-forward matrices in place of :data:`FFN` (phi3's fused ``ffn_up``; a
  mixture-of-experts FFN's router and expert tensors: :func:`moe_ffn`),
- ``post_ffn``: per-block tensors after them (gemma3's post-FFN norm).

The FFN norm, the FFN and ``post_ffn`` are marked ``TensorSpec.ffn``: the block's feed-forward half,
which placement may put on another device than the attention half (a MoE block's experts).

The order is llama.cpp's (file order; ``tools/synth.py`` draws random weights in it). Shapes are
numpy order ``[n_out, n_in]`` (GGUF ``ne`` reversed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..hparams import ModelConfig
from .base import BLOCK, HEAD, INPUT, TensorSpec, bias, matrix, norm

#: A width from the config (``lambda c: c.n_embd``).
Width = Callable[[ModelConfig], int]


def n_embd(c: ModelConfig) -> int:
    """``n_embd``."""
    return c.n_embd


def n_embd_q(c: ModelConfig) -> int:
    """``n_head * head_dim`` (llama.cpp ``n_embd_head_k * n_head``)."""
    return c.n_embd_q


TOKEN_EMBD = matrix("token_embd.weight", lambda c: (c.n_vocab, c.n_embd), unit=INPUT)
OUTPUT_NORM = norm("output_norm.weight", lambda c: (c.n_embd,), unit=HEAD)
#: the LM head; the token embedding when the file has none (llama.cpp ``TENSOR_DUPLICATED``)
OUTPUT = matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD, required=False,
                tied_to="token_embd.weight")
#: the LM head, required (llama.cpp creates it without ``TENSOR_DUPLICATED``: qwen2moe, olmoe, gpt-oss)
OUTPUT_UNTIED = matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD)
OUTPUT_BIAS = bias("output.bias", lambda c: (c.n_vocab,), unit=HEAD, required=False)

#: Llama 3.1 rope frequency factors: one global tensor every block uses (TENSOR_DUPLICATED)
ROPE_FREQS = norm("rope_freqs.weight", lambda c: (c.n_rot // 2,), unit=BLOCK, required=False)
#: LongRoPE factors (Phi-3 128k): global tensors every block uses, long and short
LONGROPE = (norm("rope_factors_long.weight", lambda c: (c.n_rot // 2,), unit=BLOCK, required=False),
            norm("rope_factors_short.weight", lambda c: (c.n_rot // 2,), unit=BLOCK, required=False))

ATTN_NORM = norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,))
#: per-head RMS norms of K and Q (head_dim values; before rope), llama.cpp's order
QK_NORM = (norm("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,)),
           norm("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,)))
#: one fused Q/K/V matrix, uploaded as ``attn_q``, ``attn_k``, ``attn_v`` (``TensorSpec.parts``)
FUSED_QKV = (TensorSpec("blk.{i}.attn_qkv.weight", lambda c: (c.n_embd_q + 2 * c.n_embd_kv, c.n_embd),
                        parts=(("attn_q", lambda c: c.n_embd_q), ("attn_k", lambda c: c.n_embd_kv),
                               ("attn_v", lambda c: c.n_embd_kv))),)

FFN_NORM = norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,))
FFN_DOWN = matrix("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff))
#: the dense gated feed-forward: gate, up, down
FFN = (matrix("blk.{i}.ffn_gate.weight", lambda c: (c.n_ff, c.n_embd)),
       matrix("blk.{i}.ffn_up.weight", lambda c: (c.n_ff, c.n_embd)),
       FFN_DOWN)


#: the gated MoE feed-forward's router and experts (llama.cpp ``ffn_gate_inp``, ``ffn_*_exps``); the
#: expert tensors are 3-D [n_expert, n_out, n_in] (GGUF ``ne = (n_in, n_out, n_expert)``)
MOE = (matrix("blk.{i}.ffn_gate_inp.weight", lambda c: (c.n_expert, c.n_embd)),
       matrix("blk.{i}.ffn_gate_exps.weight", lambda c: (c.n_expert, c.n_ff_exp, c.n_embd)),
       matrix("blk.{i}.ffn_down_exps.weight", lambda c: (c.n_expert, c.n_embd, c.n_ff_exp)),
       matrix("blk.{i}.ffn_up_exps.weight", lambda c: (c.n_expert, c.n_ff_exp, c.n_embd)))
#: gpt-oss's router and expert biases (required), [n_expert] and [n_expert, n_out]
MOE_BIASES = (bias("blk.{i}.ffn_gate_inp.bias", lambda c: (c.n_expert,), required=True),
              bias("blk.{i}.ffn_gate_exps.bias", lambda c: (c.n_expert, c.n_ff_exp), required=True),
              bias("blk.{i}.ffn_down_exps.bias", lambda c: (c.n_expert, c.n_embd), required=True),
              bias("blk.{i}.ffn_up_exps.bias", lambda c: (c.n_expert, c.n_ff_exp), required=True))
#: qwen2moe's shared expert: its gate (``[n_embd]`` in the file: one row of a [1, n_embd] matrix)
#: and a dense gated FFN ``expert_shared_feed_forward_length`` wide
MOE_SHARED = (matrix("blk.{i}.ffn_gate_inp_shexp.weight", lambda c: (1, c.n_embd)),
              matrix("blk.{i}.ffn_gate_shexp.weight", lambda c: (c.n_ff_shexp, c.n_embd)),
              matrix("blk.{i}.ffn_down_shexp.weight", lambda c: (c.n_embd, c.n_ff_shexp)),
              matrix("blk.{i}.ffn_up_shexp.weight", lambda c: (c.n_ff_shexp, c.n_embd)))


def moe_ffn(biases: bool = False, shared: bool = False) -> tuple[TensorSpec, ...]:
    """The ``ffn`` of a mixture-of-experts block (``builders.build_moe_ffn``): :data:`MOE`, then
    (``biases``) :data:`MOE_BIASES`, then (``shared``) :data:`MOE_SHARED`."""
    return MOE + (MOE_BIASES if biases else ()) + (MOE_SHARED if shared else ())


def attn_qkv(q_width: Width = n_embd_q, biases: bool = False) -> tuple[TensorSpec, ...]:
    """Separate Q, K, V matrices [q_width | n_embd_kv, n_embd], then (``biases``) their optional
    biases (llama.cpp ``create_tensor_qkv``, separate path)."""
    mats = (matrix("blk.{i}.attn_q.weight", lambda c: (q_width(c), c.n_embd)),
            matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
            matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)))
    if not biases:
        return mats
    return mats + (bias("blk.{i}.attn_q.bias", lambda c: (q_width(c),), required=False),
                   bias("blk.{i}.attn_k.bias", lambda c: (c.n_embd_kv,), required=False),
                   bias("blk.{i}.attn_v.bias", lambda c: (c.n_embd_kv,), required=False))


def llama_tensors(*, head: Sequence[TensorSpec] = (), shared: Sequence[TensorSpec] = (),
                  q_width: Width = n_embd_q, qkv_bias: bool = False, qkv: Sequence[TensorSpec] | None = None,
                  attn: Sequence[TensorSpec] = (), output: TensorSpec = OUTPUT,
                  ffn_norm: Sequence[TensorSpec] = (FFN_NORM,), ffn: Sequence[TensorSpec] = FFN,
                  post_ffn: Sequence[TensorSpec] = ()) -> tuple[TensorSpec, ...]:
    """llama's tensors (llama.cpp ``llama_model_llama::load_arch_tensors``, dense) with an
    architecture's additions (module doc), global tensors first::

        token_embd, output_norm, output, *head, *shared,
        blk.{i}: attn_norm, *qkv (attn_q, attn_k, attn_v [+ biases]), attn_output [n_embd, q_width],
                 *attn, *ffn_norm, *ffn (ffn_gate, ffn_up, ffn_down), *post_ffn

    The last three are marked ``ffn`` (the feed-forward half, module doc).
    """
    half = tuple(dataclasses.replace(s, ffn=True) for s in (*ffn_norm, *ffn, *post_ffn))
    return (TOKEN_EMBD, OUTPUT_NORM, output, *head, *shared,
            ATTN_NORM, *(attn_qkv(q_width, qkv_bias) if qkv is None else qkv),
            matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, q_width(c))), *attn, *half)
