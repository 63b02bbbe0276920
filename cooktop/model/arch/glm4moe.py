"""The glm4moe architecture (``general.architecture = glm4moe``): GLM-4.5 (355B-A32B), GLM-4.5-Air
(106B-A12B), GLM-4.6 and the other text models converted as ``Glm4MoeForCausalLM``.

Sources: llama.cpp src/models/glm4-moe.cpp (``load_arch_hparams``, ``load_arch_tensors``, the graph),
src/llama-graph.cpp (``build_moe_ffn``: sigmoid gating, the ``exp_probs_b`` selection bias, weights
renormalised and scaled; ``build_ffn`` with ``LLM_FFN_SILU`` / ``LLM_FFN_PAR``), src/llama-model.cpp
(``create_tensor_qkv``; the rope type: ``LLAMA_ROPE_TYPE_NEOX`` unless the file has multi-section rope),
conversion/glm.py (``Glm4MoeModel``: ``rope.dimension_count`` = head_dim x ``partial_rotary_factor``,
0.5 by default; ``first_k_dense_replace`` -> ``leading_dense_block_count``, ``n_shared_experts`` ->
``expert_shared_count``, ``routed_scaling_factor`` -> ``expert_weights_scale``, ``norm_topk_prob`` ->
``expert_weights_norm``, gating sigmoid; the MTP layers appended as ``nextn_predict_layers`` blocks).

Block ``il`` (``builders.py``'s norm, attention, FFN and MoE FFN)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T [+ bq], xn @ Wk^T [+ bk], xn @ Wv^T [+ bv]
    [q, k = rmsnorm_per_head(q) * attn_q_norm, rmsnorm_per_head(k) * attn_k_norm]    (GLM-4.5 355B)
    rope(q), rope(k)     NeoX rope of the first n_rot dimensions of each head (half), the rest passed
    cache[pos] = k, v ; x += attention(q, cache, scale 1/sqrt(head_dim)) @ Wo^T
    xn = rmsnorm(x) * post_attention_norm                       (the FFN's pre-norm, llama.cpp's name)
    il < leading_dense_block_count:  x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T
    else:  p = sigmoid(xn @ ffn_gate_inp^T)                                         [n, n_expert]
           ids = top-k of p + exp_probs_b ; wts = p[ids] / sum, times expert_weights_scale
           x += sum_j wts_j expert_{ids_j}(xn) + ffn_shexp(xn)    (the shared expert, ungated:
                                                                   expert_shared_count x n_ff_exp wide)

Head: ``(rmsnorm(x) * output_norm) @ Wout^T`` (Wout = token_embd when tied). The block runs in the
halves of ``moe.py`` (placement: ``--n-cpu-moe``, ``-ot``). ``nextn_predict_layers`` blocks after the
trunk (GLM-4.5's multi-token prediction: a MoE block with ``nextn.eh_proj``, ``enorm``, ``hnorm``) are
skipped by the trunk as llama.cpp's main pass does; ``model/mtp.py`` runs one as the draft of
``--spec-type draft-mtp`` (llama.cpp's ``graph_mtp``).

Not implemented (refused by ``load_config``): multi-section rope (``rope.dimension_sections`` with its
first two sections > 0: GLM-4.5V's text model, which llama.cpp switches to ``LLAMA_ROPE_TYPE_MROPE``),
per-layer ``expert_feed_forward_length`` arrays, the ``sqrt_softplus`` gating function.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NEOX, Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from . import glm4, moe
from .base import KV, Weights, bias, norm
from .builders import SILU, build_ffn, build_moe_ffn, build_norm, moe_scratch, moe_scratch_i32
from .descriptor import Architecture
from .skeleton import FFN, MOE, MOE_SHARED, llama_tensors

#: ``expert_gating_func`` values (llama.cpp ``llama_expert_gating_func_type``) -> ``moe_route`` gating;
#: 0 (none, or the key absent) is sigmoid for glm4moe (``load_arch_hparams``).
GATING_FUNC = {0: "sigmoid", 1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def hparams(m: Metadata) -> dict[str, Any]:
    """The glm4moe keys (llama.cpp ``llama_model_glm4_moe::load_arch_hparams``): glm4's (RMS epsilon,
    ``nextn_predict_layers``, no multi-section rope: ``glm4.hparams``), the MoE counts (``moe.hparams``;
    ``expert_feed_forward_length`` default ``feed_forward_length / expert_used_count``),
    ``expert_shared_count`` (required; the shared expert is that many experts wide),
    ``leading_dense_block_count`` (default 0), ``expert_weights_scale`` (default 0: none),
    ``expert_weights_norm`` (default false) and ``expert_gating_func`` (default sigmoid).

    Raises:
        UnsupportedModelError: a missing or inconsistent key, an unknown gating function.
    """
    out = glm4.hparams(m)
    g = int(m.num("expert_gating_func", int, 0, minimum=0))
    if g not in GATING_FUNC:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_gating_func')} = {g}: only softmax (1), sigmoid (2) "
                                    "and softmax_weight (3) expert gating are implemented by cooktop")
    norm_w = m.get("expert_weights_norm", False)
    if not isinstance(norm_w, (bool, int)):
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_weights_norm')} = {norm_w!r} is not a boolean")
    out.update(moe.hparams(m, GATING_FUNC[g], norm=bool(norm_w)))
    n_shared = int(m.num("expert_shared_count", int, required=True, minimum=0))
    dense = int(m.num("leading_dense_block_count", int, 0, minimum=0))
    if dense > out["n_layer"]:
        raise UnsupportedModelError(f"{m.path}: {m.key('leading_dense_block_count')} = {dense} exceeds the "
                                    f"{out['n_layer']} trunk blocks")
    out.update(n_ff_shexp=out["n_ff_exp"] * n_shared, n_layer_dense_lead=dense,
               expert_weights_scale=float(m.num("expert_weights_scale", float, 0.0)))
    return out


def _dense(c: ModelConfig, il: int) -> bool:
    return il < c.n_layer_dense_lead


def _moe(c: ModelConfig, il: int) -> bool:
    return il >= c.n_layer_dense_lead


def _shexp(c: ModelConfig, il: int) -> bool:
    return il >= c.n_layer_dense_lead and c.n_ff_shexp > 0


#: the expert selection bias (llama.cpp ``LLM_TENSOR_FFN_EXP_PROBS_B``, ``blk.N.exp_probs_b.bias``)
EXP_PROBS_B = bias("blk.{i}.exp_probs_b.bias", lambda c: (c.n_expert,), required=True)

#: llama.cpp ``llama_model_glm4_moe::load_arch_tensors``: attention with the optional Q/K/V biases and
#: optional per-head Q/K norms, ``post_attention_norm`` before the FFN; the dense FFN in the leading
#: blocks, the router, selection bias, experts and (``expert_shared_count`` > 0) the ungated shared
#: expert in the others.
TENSORS = llama_tensors(
    qkv_bias=True,
    attn=(norm("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,), required=False),
          norm("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,), required=False)),
    ffn_norm=(norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)),),
    ffn=(*(dataclasses.replace(s, layers=_dense) for s in FFN),
         *(dataclasses.replace(s, layers=_moe) for s in (MOE[0], EXP_PROBS_B, *MOE[1:])),
         *(dataclasses.replace(s, layers=_shexp) for s in MOE_SHARED[1:])))


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 buffers (``builders.moe_scratch``'s, the dense blocks' ``gate``, ``up``
    [n_ff] and the shared expert's ``shgate``, ``shup`` [n_ff_shexp], ``shdown`` [n_embd])."""
    S = max(cfg.n_ff_shexp, 1)
    return {**moe_scratch(cfg), "gate": cfg.n_ff, "up": cfg.n_ff, "shgate": S, "shup": S, "shdown": cfg.n_embd}


def block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, il: int) -> None:
    """The feed-forward half of block ``il`` (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd],
    in place): ``x += ffn(rmsnorm(x) * post_attention_norm)``, the dense SwiGLU FFN in the leading
    blocks, else the experts plus the ungated shared expert (llama.cpp: ``routed_out + shared_out``,
    then the residual)."""
    build_norm(d, cfg, s.xn, s.x, w["post_attention_norm"])
    if il < cfg.n_layer_dense_lead:
        d.add(s.x, s.x, build_ffn(d, cfg, w, s, SILU))
        return
    o = build_moe_ffn(d, cfg, w, s, SILU)
    if "ffn_up_shexp" in w:
        d.matmuls(s.xn, (s.shgate, w["ffn_gate_shexp"]), (s.shup, w["ffn_up_shexp"]))
        d.silu_mul(s.shgate, s.shgate, s.shup)
        d.matmul(s.shdown, s.shgate, w["ffn_down_shexp"])
        d.add(o, o, s.shdown)
    d.add(s.x, s.x, o)


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` (module doc): ``moe.block_attn`` (llama's attention half: optional biases and
    Q/K norms by the tensors present), then :func:`block_ffn`."""
    moe.block_attn(d, cfg, w, s, kv, il)
    block_ffn(d, cfg, w, s, il)


GLM4MOE = Architecture(name="glm4moe", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, block=block,
                       block_attn=moe.block_attn, block_ffn=block_ffn, scratch=scratch,
                       scratch_i32=moe_scratch_i32)
