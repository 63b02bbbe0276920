"""The shared pieces blocks are built of, as llama.cpp's ``llm_graph_context`` builders
(src/llama-graph.cpp ``build_norm``, ``build_qkv``, ``build_attn``, ``build_ffn``) and
``llama_model::get_rope_factors`` (src/llama-model.cpp): an architecture's block
(``<arch>.py``) calls them in its own order and adds what is its own.

Each builder enqueues backend ops on ``d`` for the ``n`` rows of the scratch buffers ``s``
(:func:`scratch`, cut to ``n`` rows). The residual stream is ``s.x``; the sub-layer builders
read their input from ``s.xn`` (the normed rows) and return their output, ``s.o`` (f32 [n, n_embd]),
which the block adds to ``s.x`` (llama.cpp's ``cur``). An optional tensor the unit lacks is
absent from ``w``, and its step is skipped.

The dense feed-forward is :func:`build_ffn`; the mixture-of-experts one (llama.cpp
``build_moe_ffn``) is :func:`build_moe_ffn` beside it, with its tensors (``skeleton.moe_ffn``)
passed to ``skeleton.llama_tensors`` as ``ffn`` and its buffers from :func:`moe_scratch`.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from ...backends.base import Device, DeviceTensor
from ..hparams import ModelConfig
from .base import KV, Weights

#: Gated activations of :func:`build_ffn` (llama.cpp ``LLM_FFN_SILU`` / ``LLM_FFN_GELU`` with
#: ``LLM_FFN_PAR``): backend ops ``silu_mul`` and ``gelu_mul``.
SILU, GELU = "silu", "gelu"

#: The activation of gpt-oss's experts (llama.cpp ``LLM_FFN_SWIGLU_OAI_MOE``): op ``swiglu_oai``
#: with alpha 1.702 and limit 7 (``build_moe_ffn``).
SWIGLU_OAI = "swiglu_oai"

#: llama.cpp pads n_ctx to a multiple of this (``GGML_PAD(cparams.n_ctx, 256)``, llama-context.cpp).
N_CTX_PAD = 256


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers the builders use: ``x``, ``xn``, ``o``
    [n_embd]; ``q``, ``att`` [n_embd_q]; ``k``, ``v`` [n_embd_kv]; ``gate``, ``up`` [n_ff]."""
    E, Q, K, F = cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv, cfg.n_ff
    return {"x": E, "xn": E, "q": Q, "att": Q, "o": E, "k": K, "v": K, "gate": F, "up": F}


def moe_scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 buffers of a MoE block (``k`` = n_expert_used, ``F`` = n_ff_exp):
    :func:`scratch`'s but the dense ``gate``, ``up``; ``router`` [n_expert], ``ewts`` [k],
    ``eup``, ``egate`` [k * F], ``edown`` [k * n_embd]."""
    k, F = cfg.n_expert_used, cfg.n_ff_exp
    out = {n: w for n, w in scratch(cfg).items() if n not in ("gate", "up")}
    return {**out, "router": cfg.n_expert, "ewts": k, "eup": k * F, "egate": k * F, "edown": k * cfg.n_embd}


def moe_shared_scratch(cfg: ModelConfig) -> dict[str, int]:
    """:func:`moe_scratch` and the shared expert's buffers (qwen2moe): ``shg``, ``shw`` [1],
    ``shgate``, ``shup`` [n_ff_shexp], ``shdown``, ``shout`` [n_embd]."""
    S = cfg.n_ff_shexp
    return {**moe_scratch(cfg), "shg": 1, "shw": 1, "shgate": S, "shup": S, "shdown": cfg.n_embd,
            "shout": cfg.n_embd}


def moe_scratch_i32(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the I32 buffers of a MoE block: ``eids`` [n_expert_used] (the selected
    experts), ``shid`` [1] (the shared expert's gate)."""
    return {"eids": cfg.n_expert_used, "shid": 1}


def build_norm(d: Device, cfg: ModelConfig, out: DeviceTensor, x: DeviceTensor, weight: DeviceTensor) -> DeviceTensor:
    """``out = rmsnorm(x) * weight`` (llama.cpp ``build_norm``, ``LLM_NORM_RMS``, epsilon ``cfg.rms_eps``).

    x, out: f32 [n, width] (``out`` may be ``x``); weight: f32 [width], or [head_dim] to norm
    each head of a row on its own. Returns ``out``.
    """
    d.rmsnorm(out, x, weight, cfg.rms_eps)
    return out


def rope_factors(cfg: ModelConfig, w: Weights, n_ctx: int) -> DeviceTensor | None:
    """The rope frequency factors of a block (llama.cpp ``get_rope_factors``): ``rope_freqs``
    (Llama 3.1) when the unit has it, else LongRoPE's long factors when ``n_ctx`` padded to
    :data:`N_CTX_PAD` exceeds the original context (``rope.scaling.original_context_length``,
    default n_ctx_train), else the short ones; None when the unit has none of them."""
    if "rope_freqs" in w:
        return w["rope_freqs"]
    n_ctx_seq = -(-n_ctx // N_CTX_PAD) * N_CTX_PAD
    n_ctx_orig = cfg.n_ctx_orig_yarn or cfg.n_ctx_train
    return w.get("rope_factors_long") if n_ctx_seq > n_ctx_orig else w.get("rope_factors_short")


def is_swa(cfg: ModelConfig, il: int) -> bool:
    """True when block ``il`` is a sliding-window layer (llama.cpp ``hparams.is_swa(il)``)."""
    return bool(cfg.swa_layers) and cfg.swa_layers[il]


def rope_args(cfg: ModelConfig, il: int) -> dict[str, Any]:
    """``Device.rope`` keyword arguments of block ``il`` (all but ``freq_factors``): the model's
    rope, with the SWA base and scale on sliding-window layers (llama.cpp ``get_rope_freq_base`` /
    ``get_rope_freq_scale``)."""
    args = cfg.rope_params()
    if is_swa(cfg, il):
        args.update(freq_base=cfg.rope_freq_base_swa, freq_scale=cfg.rope_freq_scale_swa)
    return args


def build_qkv(d: Device, w: Weights, xn: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor) -> None:
    """``q, k, v = xn @ Wq^T [+ bq], xn @ Wk^T [+ bk], xn @ Wv^T [+ bv]`` (llama.cpp ``build_qkv``).

    xn: f32 [n, n_embd]; q: f32 [n, n_embd_q]; k, v: f32 [n, n_embd_kv]. A fused ``attn_qkv``
    reaches here as its three row ranges (``TensorSpec.parts``), so it takes the same path.
    """
    d.matmuls(xn, (q, w["attn_q"]), (k, w["attn_k"]), (v, w["attn_v"]))  # one launch where a backend can
    for y, name in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")):
        if name + ".bias" in w:
            d.add_bias(y, y, w[name + ".bias"])


def build_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> DeviceTensor:
    """Self-attention of block ``il`` on the normed rows ``s.xn``; returns ``s.o = a @ Wo^T``.

    Steps (optional ones run when ``w`` has their tensors)::

        q, k, v = build_qkv(xn)                                   [+ biases: qwen2]
        [q, k = rmsnorm_per_head(q) * attn_q_norm, rmsnorm_per_head(k) * attn_k_norm]   (qwen3, gemma3)
        rope(q), rope(k)    rope_args(il), with rope_factors() (Llama 3.1, LongRoPE)
        cache[cells] = k, v ; a = attention(q, cache)      scale: cfg.attn_scale or 1/sqrt(head_dim);
                                                           window: n_swa on sliding-window layers;
                                                           [sinks: attn_sinks (gpt-oss)]
        o = a @ Wo^T [+ bo]                                                               (gpt-oss)

    rope(k) and its store are one op (``Device.rope_store``, one launch on OpenCL).

    (llama.cpp: ``build_qkv``, ``ggml_rope_ext`` and ``build_attn`` of src/models/llama.cpp,
    qwen3.cpp, gemma3.cpp, openai-moe.cpp.) ``kv`` holds the rows' positions and this block's cache; the cells
    ``kv.cells`` are written.
    """
    q, k, v = s.q, s.k, s.v
    build_qkv(d, w, s.xn, q, k, v)
    if "attn_q_norm" in w:
        build_norm(d, cfg, q, q, w["attn_q_norm"])
    if "attn_k_norm" in w:
        build_norm(d, cfg, k, k, w["attn_k_norm"])
    build_attn_core(d, cfg, w, s, kv, il)
    d.matmul(s.o, s.att, w["attn_output"])
    if "attn_output.bias" in w:
        d.add_bias(s.o, s.o, w["attn_output.bias"])
    return s.o


def build_attn_core(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> DeviceTensor:
    """The rope and attention steps of :func:`build_attn` on the rows' ``s.q`` f32 [n, n_embd_q] and
    ``s.k``, ``s.v`` f32 [n, n_embd_kv] (projected and normed by the caller): rotate q and k
    (``rope_args(il)``, ``rope_factors``), store k and v in the cache, attend; returns ``s.att``
    f32 [n, n_embd_q] (before the output projection)."""
    rope, ff = rope_args(cfg, il), rope_factors(cfg, w, kv.n_ctx)
    d.rope(s.q, s.q, kv.pos, **rope, freq_factors=ff)
    scale = cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)
    kv.attend(d, s.att, s.q, s.k, s.v, cfg.n_head, cfg.n_head_kv, scale, cfg.n_swa if is_swa(cfg, il) else 0,
              sinks=w.get("attn_sinks"), k_rope={**rope, "freq_factors": ff})
    return s.att


def build_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, act: str = SILU) -> DeviceTensor:
    """The dense gated feed-forward on the normed rows ``s.xn``; returns
    ``s.o = (act(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T`` (llama.cpp ``build_ffn``, ``LLM_FFN_PAR``).

    Args:
        act: :data:`SILU` (op ``silu_mul``) or :data:`GELU` (op ``gelu_mul``, tanh approximation).
    Raises:
        ValueError: another activation.
    """
    gate, up = s.gate, s.up
    d.matmuls(s.xn, (gate, w["ffn_gate"]), (up, w["ffn_up"]))
    if act == SILU:
        d.silu_mul(gate, gate, up)
    elif act == GELU:
        d.gelu_mul(gate, gate, up)
    else:
        raise ValueError(f"build_ffn: unknown activation {act!r} (expected {SILU!r} or {GELU!r})")
    d.matmul(s.o, gate, w["ffn_down"])
    return s.o


def build_moe_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, act: str = SILU,
                  routed: bool = False) -> DeviceTensor:
    """The mixture-of-experts feed-forward on the normed rows ``s.xn`` f32 [n, n_embd]; returns
    ``s.o`` f32 [n, n_embd] (llama.cpp ``build_moe_ffn``; ``k`` = n_expert_used, ``F`` = n_ff_exp)::

        logits = xn @ ffn_gate_inp^T [+ ffn_gate_inp.bias]            [n, n_expert]
        ids, wts = moe_route(logits)   top-k by cfg.expert_gating,     [n, k], [n, k]
                                       [picked by probs + exp_probs_b: the selection bias],
                                       [renormalised], [scaled]
        up   = matmul_id(xn, ffn_up_exps, ids)   [+ add_id bias]       [n, k * F]
        gate = matmul_id(xn, ffn_gate_exps, ids) [+ add_id bias]       [n, k * F]
        h    = silu(gate) * up   (SWIGLU_OAI: swiglu_oai(gate, up, alpha 1.702, limit 7);
                                  GELU: gelu(gate) * up)
        down = matmul_id(h, ffn_down_exps, ids)  [+ add_id bias]       [n, k * n_embd]
        [wts *= ffn_down_exps.scale[ids]   per-expert scale (gemma4)]
        o    = sum_j wts[:, j] * down[:, slot j]                       [n, n_embd]
        [shared expert (qwen2moe): o += sigmoid(xn . ffn_gate_inp_shexp^T) * ffn(xn, *_shexp)]

    The per-expert scale (llama.cpp ``down_exps_s``, which multiplies ``down`` by ``scale[ids]`` before
    the weights: the same products up to one rounding) is looked up with ``add_id`` into ``s.escale``
    f32 [n, k] zeroed by ``scale(.., 0)``, then multiplied into the weights (op ``mul``).

    Buffers: :func:`moe_scratch` / :func:`moe_shared_scratch` and :func:`moe_scratch_i32`
    (``s.escale`` f32 [n, k] with a per-expert scale).

    Args:
        act: :data:`SILU`, :data:`SWIGLU_OAI` or :data:`GELU` (gemma4; ggml ``geglu_split``).
        routed: the router's logits are already in ``s.router`` (llama.cpp's ``probs_in``: gemma4
            computes them from another input than ``xn``); ``ffn_gate_inp`` is not applied here.
    Raises:
        ValueError: another activation.
    """
    if act not in (SILU, SWIGLU_OAI, GELU):
        raise ValueError(f"build_moe_ffn: unknown activation {act!r} (expected {SILU!r}, {SWIGLU_OAI!r} or "
                         f"{GELU!r})")
    xn, o, ids = s.xn, s.o, s.eids
    if not routed:
        d.matmul(s.router, xn, w["ffn_gate_inp"])
        if "ffn_gate_inp.bias" in w:
            d.add_bias(s.router, s.router, w["ffn_gate_inp.bias"])
    d.moe_route(ids, s.ewts, s.router, cfg.expert_gating, norm=cfg.expert_weights_norm,
                scale=cfg.expert_weights_scale, bias=w.get("exp_probs_b.bias"))
    for y, name in ((s.eup, "ffn_up_exps"), (s.egate, "ffn_gate_exps")):
        d.matmul_id(y, xn, w[name], ids)
        if name + ".bias" in w:
            d.add_id(y, y, w[name + ".bias"], ids)
    if act == SWIGLU_OAI:
        d.swiglu_oai(s.egate, s.egate, s.eup, 1.702, 7.0)
    elif act == GELU:
        d.gelu_mul(s.egate, s.egate, s.eup)
    else:
        d.silu_mul(s.egate, s.egate, s.eup)
    d.matmul_id(s.edown, s.egate, w["ffn_down_exps"], ids)
    if "ffn_down_exps.bias" in w:
        d.add_id(s.edown, s.edown, w["ffn_down_exps.bias"], ids)
    if "ffn_down_exps.scale" in w:  # wts[i, j] *= scale[ids[i, j]] (scale f32 [n_expert, 1])
        d.scale(s.escale, s.ewts, 0.0)
        d.add_id(s.escale, s.escale, w["ffn_down_exps.scale"], ids)
        d.mul(s.ewts, s.ewts, s.escale)
    d.moe_combine(o, s.edown, s.ewts)
    if "ffn_gate_inp_shexp" in w:  # qwen2moe: o += sigmoid(xn . g) * swiglu ffn(xn)
        d.matmul(s.shg, xn, w["ffn_gate_inp_shexp"])
        d.moe_route(s.shid, s.shw, s.shg, "sigmoid")
        d.matmul(s.shgate, xn, w["ffn_gate_shexp"])
        d.matmul(s.shup, xn, w["ffn_up_shexp"])
        d.silu_mul(s.shgate, s.shgate, s.shup)
        d.matmul(s.shdown, s.shgate, w["ffn_down_shexp"])
        d.moe_combine(s.shout, s.shdown, s.shw)
        d.add(o, o, s.shout)
    return o


def output_norm(d: Device, cfg: ModelConfig, w: Weights, xn: DeviceTensor, x: DeviceTensor) -> None:
    """``xn = rmsnorm(x) * output_norm`` on rows f32 [r, n_embd] leaving the last block (``xn`` may be
    ``x``; llama.cpp's ``result_norm``)."""
    build_norm(d, cfg, xn, x, w["output_norm"])


def lm_head(d: Device, cfg: ModelConfig, w: Weights, logits: DeviceTensor, xn: DeviceTensor) -> None:
    """``logits f32 [r, n_vocab] = xn @ output^T [+ output.bias]`` for normed rows xn f32 [r, n_embd]
    (llama.cpp's ``result_output``; ``output`` is ``token_embd`` when tied)."""
    d.matmul(logits, xn, w["output"])
    if "output.bias" in w:
        d.add_bias(logits, logits, w["output.bias"])
