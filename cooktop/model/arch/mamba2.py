"""Mamba-2 and its hybrids: ``granitehybrid`` (IBM Granite 4.0-H: Micro, Tiny, Small, 1B, 350M; Mamba-2
blocks and attention blocks, Granite's multipliers, a dense FFN or experts with a shared expert) and
``mamba2`` (pure Mamba-2: Mamba-Codestral, the state-spaces checkpoints).

Sources: llama.cpp src/models/granite-hybrid.cpp (``load_arch_hparams``, ``load_arch_tensors``, the graph:
``build_attention_layer``, ``build_layer_ffn``), src/models/mamba2.cpp and mamba.cpp (mamba2's
tensors and graph), src/models/mamba-base.cpp (``build_mamba2_layer``), src/llama-graph.cpp
(``build_inp_embd``'s embedding scale), src/llama-hparams.cpp (``n_embd_r``, ``n_embd_s``: the state
widths) and conversion/granite.py, conversion/mamba.py (what the keys and tensors hold).

Which blocks are recurrent: those whose ``attention.head_count_kv`` entry is 0 (granitehybrid,
llama.cpp ``is_recr_impl[i] = n_head_kv(i) == 0``); every block of mamba2. A granitehybrid block::

    xn = rmsnorm(x) * attn_norm
    o  = mamba2_layer(xn)  or  attention(xn)        (NoPE unless rope.scaling.finetuned: Granite 4.0-H
                                                     attends without rope; kq scale attention.scale)
    x += o * residual_scale
    xn = rmsnorm(x) * ffn_norm
    o  = swiglu_ffn(xn)  or  moe_ffn(xn) + swiglu_ffn_shexp(xn)   (softmax router, top-k renormalised;
                                                                    the shared expert ungated)
    x += o * residual_scale

with the token embeddings times ``embedding_scale`` and the logits divided by ``logit_scale`` (each
multiplier skipped when the file has none). A mamba2 block is ``x += mamba2_layer(rmsnorm(x) * attn_norm)``.

The Mamba-2 layer (``H`` = ``ssm.time_step_rank`` heads of ``P = ssm.inner_size / H`` values, ``G`` =
``ssm.group_count`` groups, ``N`` = ``ssm.state_size``)::

    z, xBC, dt = xn @ ssm_in^T                 (three row ranges: H P, H P + 2 G N, H)
    xBC = silu(ssm_conv(xBC) [+ ssm_conv1d.bias])                            (one state: n_embd_r)
    y = ssm_scan(xBC, dt, ssm_a, ssm_d, ssm_dt.bias)   softplus(dt + bias), the scan, + x * D   (n_embd_s)
    o = ssm_norm(y, z) @ ssm_out^T             rmsnorm of y * silu(z) over each of the G groups, * ssm_norm

llama.cpp multiplies by the whole ``ssm_in`` and views column ranges; the row ranges give the same values.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NORMAL, Device, DeviceTensor
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from . import builders
from .base import BLOCK, KV, TensorSpec, Weights, bias, matrix, norm
from .builders import SILU, build_attn_core, build_ffn, build_moe_ffn, build_norm
from .descriptor import Architecture
from .skeleton import FFN, MOE, OUTPUT, OUTPUT_NORM, ROPE_FREQS, TOKEN_EMBD


def _attn(c: ModelConfig, il: int) -> bool:
    return not c.is_recurrent(il)


def _recr(c: ModelConfig, il: int) -> bool:
    return c.is_recurrent(il)


def _dense(c: ModelConfig, il: int) -> bool:
    return c.n_expert == 0


def _moe(c: ModelConfig, il: int) -> bool:
    return c.n_expert > 0


def _shexp(c: ModelConfig, il: int) -> bool:
    return c.n_expert > 0 and c.n_ff_shexp > 0


def conv_dim(c: ModelConfig) -> int:
    """Channels of the convolution: ``x``, ``B`` and ``C``, ``H P + 2 G N`` (llama.cpp
    ``d_inner + 2*n_group*d_state``)."""
    return c.ssm_d_inner + 2 * c.ssm_n_group * c.ssm_d_state


def _only(specs: tuple[TensorSpec, ...], layers: Any, ffn: bool = False) -> tuple[TensorSpec, ...]:
    return tuple(dataclasses.replace(s, layers=layers, ffn=ffn) for s in specs)


def mamba2_tensors(conv_bias_required: bool) -> tuple[TensorSpec, ...]:
    """The Mamba-2 layer's tensors (module doc); ``ssm_a``, ``ssm_d`` are ``[H, 1]`` (GGUF ``ne = (1, H)``)
    and ``ssm_norm`` ``[G, H P / G]`` (GGUF ``ne = (H P / G, G)``), as llama.cpp creates them."""
    return (
        TensorSpec("blk.{i}.ssm_in.weight", lambda c: (c.ssm_d_inner + conv_dim(c) + c.ssm_dt_rank, c.n_embd), BLOCK,
                   parts=(("ssm_in_z", lambda c: c.ssm_d_inner), ("ssm_in_xbc", conv_dim),
                          ("ssm_in_dt", lambda c: c.ssm_dt_rank))),
        norm("blk.{i}.ssm_conv1d.weight", lambda c: (conv_dim(c), c.n_conv)),
        bias("blk.{i}.ssm_conv1d.bias", lambda c: (conv_dim(c),), required=conv_bias_required),
        bias("blk.{i}.ssm_dt.bias", lambda c: (c.ssm_dt_rank,), required=True),
        norm("blk.{i}.ssm_a", lambda c: (c.ssm_dt_rank, 1)),
        norm("blk.{i}.ssm_d", lambda c: (c.ssm_dt_rank, 1)),
        norm("blk.{i}.ssm_norm.weight", lambda c: (c.ssm_n_group, c.ssm_d_inner // c.ssm_n_group)),
        matrix("blk.{i}.ssm_out.weight", lambda c: (c.n_embd, c.ssm_d_inner)),
    )


#: granitehybrid's attention tensors (attention blocks): separate Q, K, V, the output and its optional bias
GRANITE_ATTN = _only((
    matrix("blk.{i}.attn_q.weight", lambda c: (c.n_embd_q, c.n_embd)),
    matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd_q)),
    bias("blk.{i}.attn_output.bias", lambda c: (c.n_embd,), required=False),
), _attn)

#: llama.cpp ``llama_model_granite_hybrid::load_arch_tensors``, in file order: the dense FFN when the
#: file has no experts, else the experts and (``expert_shared_feed_forward_length`` > 0) the shared expert
GRANITE_TENSORS = (
    TOKEN_EMBD, OUTPUT_NORM, OUTPUT, ROPE_FREQS,
    norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    *_only(mamba2_tensors(False), _recr),
    *GRANITE_ATTN,
    *_only((norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),), None, ffn=True),
    *_only(FFN, _dense, ffn=True),
    *_only(MOE, _moe, ffn=True),
    *_only((matrix("blk.{i}.ffn_gate_shexp.weight", lambda c: (c.n_ff_shexp, c.n_embd)),
            matrix("blk.{i}.ffn_up_shexp.weight", lambda c: (c.n_ff_shexp, c.n_embd)),
            matrix("blk.{i}.ffn_down_shexp.weight", lambda c: (c.n_embd, c.n_ff_shexp))), _shexp, ffn=True),
)

#: llama.cpp ``llama_model_mamba2::load_arch_tensors``
MAMBA2_TENSORS = (TOKEN_EMBD, OUTPUT_NORM, OUTPUT, norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
                  *mamba2_tensors(True))


def ssm_hparams(m: Metadata) -> dict[str, Any]:
    """The Mamba-2 keys (llama.cpp ``load_arch_hparams``, all required): ``ssm.conv_kernel``,
    ``ssm.inner_size``, ``ssm.state_size``, ``ssm.time_step_rank`` (the heads), ``ssm.group_count``, and
    the RMS epsilon.

    Raises:
        UnsupportedModelError: a key missing or out of range, heads not dividing ``ssm.inner_size``,
            groups not dividing the heads.
    """
    out = {
        "rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0)),
        "n_conv": int(m.num("ssm.conv_kernel", int, required=True, minimum=2)),
        "ssm_d_inner": int(m.num("ssm.inner_size", int, required=True, minimum=1)),
        "ssm_d_state": int(m.num("ssm.state_size", int, required=True, minimum=1)),
        "ssm_dt_rank": int(m.num("ssm.time_step_rank", int, required=True, minimum=1)),
        "ssm_n_group": int(m.num("ssm.group_count", int, required=True, minimum=1)),
    }
    h, g, d_inner = out["ssm_dt_rank"], out["ssm_n_group"], out["ssm_d_inner"]
    if d_inner % h or h % g:
        raise UnsupportedModelError(f"{m.path}: Mamba-2 heads inconsistent: {m.key('ssm.time_step_rank')} = {h} "
                                    f"heads must divide {m.key('ssm.inner_size')} = {d_inner} and be a multiple "
                                    f"of {m.key('ssm.group_count')} = {g} groups")
    return out


def granite_hparams(m: Metadata) -> dict[str, Any]:
    """llama.cpp ``llama_model_granite_hybrid::load_arch_hparams``: :func:`ssm_hparams`, the multipliers
    (``logit_scale``, ``residual_scale``, ``embedding_scale``, ``attention.scale``; optional),
    ``rope.scaling.finetuned`` (default true: rope on the attention blocks) and the experts
    (``expert_count``, ``expert_used_count``; each expert ``feed_forward_length`` wide, the shared
    expert ``expert_shared_feed_forward_length``, default none). The recurrent blocks come from the
    per-layer ``attention.head_count_kv`` (``config._head_count_kv``).

    Raises:
        UnsupportedModelError: as :func:`ssm_hparams`; a bad expert count.
    """
    out = ssm_hparams(m)
    for field, key in (("logit_scale", "logit_scale"), ("residual_scale", "residual_scale"),
                       ("embedding_scale", "embedding_scale"), ("attn_scale", "attention.scale")):
        out[field] = float(m.num(key, float, 0.0, minimum=0.0))
    out["use_rope"] = bool(m.get("rope.scaling.finetuned", True))
    n_expert = int(m.num("expert_count", int, 0, minimum=0))
    if n_expert:
        n_used = int(m.num("expert_used_count", int, required=True, minimum=1))
        if n_used > n_expert:
            raise UnsupportedModelError(f"{m.path}: {m.key('expert_used_count')} = {n_used} exceeds "
                                        f"{m.key('expert_count')} = {n_expert}")
        out.update(n_expert=n_expert, n_expert_used=n_used,
                   n_ff_exp=int(m.num("feed_forward_length", int, required=True, minimum=1)),
                   n_ff_shexp=int(m.num("expert_shared_feed_forward_length", int, 0, minimum=0)),
                   expert_gating="softmax", expert_weights_norm=True, expert_weights_scale=0.0)
    return out


def state_widths(cfg: ModelConfig, il: int) -> tuple[int, ...]:
    """A Mamba-2 block's state tensors, floats per sequence: the convolution's last ``n_conv - 1`` inputs
    of its ``H P + 2 G N`` channels (llama.cpp ``n_embd_r()``) and the scan's ``H P N`` (``n_embd_s()``);
    () for an attention block."""
    if not cfg.is_recurrent(il):
        return ()
    return ((cfg.n_conv - 1) * conv_dim(cfg), cfg.ssm_d_inner * cfg.ssm_d_state)


def _ssm_scratch(cfg: ModelConfig) -> dict[str, int]:
    return {"mz": cfg.ssm_d_inner, "mxbc": conv_dim(cfg), "mconv": conv_dim(cfg), "mdt": cfg.ssm_dt_rank,
            "my": cfg.ssm_d_inner}


def granite_scratch(cfg: ModelConfig) -> dict[str, int]:
    """The builders' buffers (with a MoE block's and its shared expert's when the model has experts:
    ``builders.moe_shared_scratch``) and the Mamba-2 layer's: ``mz``, ``my`` [H P]; ``mxbc``, ``mconv``
    [H P + 2 G N]; ``mdt`` [H] (f32 [n_batch, width] each)."""
    base = builders.moe_shared_scratch(cfg) if cfg.n_expert else builders.scratch(cfg)
    return {**base, **_ssm_scratch(cfg)}


def granite_scratch_i32(cfg: ModelConfig) -> dict[str, int]:
    """The selected experts (``builders.moe_scratch_i32``) when the model has experts; none else."""
    return builders.moe_scratch_i32(cfg) if cfg.n_expert else {}


def mamba2_scratch(cfg: ModelConfig) -> dict[str, int]:
    """mamba2: ``x``, ``xn``, ``o`` [n_embd] and the Mamba-2 layer's buffers (:func:`granite_scratch`)."""
    return {"x": cfg.n_embd, "xn": cfg.n_embd, "o": cfg.n_embd, **_ssm_scratch(cfg)}


def mamba2_layer(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> DeviceTensor:
    """The Mamba-2 layer on the normed rows ``s.xn`` (module doc; llama.cpp ``build_mamba2_layer``);
    returns ``s.o`` f32 [n, n_embd]. ``kv.state`` (:func:`state_widths`' two tensors, f32 [n_seq, width])
    is read and updated at the rows' sequences ``kv.slots``."""
    st, slots = kv.state, kv.slots
    assert st is not None and slots is not None  # a recurrent block always gets its state
    d.matmuls(s.xn, (s.mz, w["ssm_in_z"]), (s.mxbc, w["ssm_in_xbc"]), (s.mdt, w["ssm_in_dt"]))
    d.ssm_conv(s.mconv, s.mxbc, st[0], w["ssm_conv1d"], slots)
    if "ssm_conv1d.bias" in w:
        d.add_bias(s.mconv, s.mconv, w["ssm_conv1d.bias"])
    d.silu(s.mconv, s.mconv)
    d.ssm_scan(s.my, s.mconv, s.mdt, w["ssm_a"], w["ssm_d"], w["ssm_dt.bias"], st[1], slots)
    d.ssm_norm(s.my, s.my, s.mz, w["ssm_norm"], cfg.rms_eps)
    d.matmul(s.o, s.my, w["ssm_out"])
    return s.o


def granite_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> DeviceTensor:
    """granitehybrid's attention on ``s.xn`` (llama.cpp ``build_attention_layer``): Q, K, V; rope only when
    ``cfg.use_rope`` (``has_rope``); scale ``attention.scale`` (default ``1 / sqrt(head_dim)``); the output
    projection and its optional bias. Returns ``s.o`` f32 [n, n_embd]."""
    d.matmuls(s.xn, (s.q, w["attn_q"]), (s.k, w["attn_k"]), (s.v, w["attn_v"]))
    if cfg.use_rope:
        build_attn_core(d, cfg, w, s, kv, il)
    else:
        scale = cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)
        kv.attend(d, s.att, s.q, s.k, s.v, cfg.n_head, cfg.n_head_kv, scale)
    d.matmul(s.o, s.att, w["attn_output"])
    if "attn_output.bias" in w:
        d.add_bias(s.o, s.o, w["attn_output.bias"])
    return s.o


def _residual(d: Device, cfg: ModelConfig, s: SimpleNamespace, o: DeviceTensor) -> None:
    """``x += o * residual_scale`` (the scale skipped when the file has none; llama.cpp ``ggml_scale``
    then ``ggml_add``)."""
    if cfg.residual_scale:
        d.scale(o, o, cfg.residual_scale)
    d.add(s.x, s.x, o)


def granite_block_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """The first half of block ``il`` on ``s.x`` (f32 [n, n_embd], in place): ``x += op(rmsnorm(x) *
    attn_norm) * residual_scale``, the op the Mamba-2 layer or the attention."""
    build_norm(d, cfg, s.xn, s.x, w["attn_norm"])
    if cfg.is_recurrent(il):
        _residual(d, cfg, s, mamba2_layer(d, cfg, w, s, kv))
    else:
        _residual(d, cfg, s, granite_attn(d, cfg, w, s, kv, il))


def granite_block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, il: int) -> None:
    """The feed-forward half: ``x += ffn(rmsnorm(x) * ffn_norm) * residual_scale``, the SwiGLU FFN or the
    experts (softmax router, top-k renormalised) plus the ungated shared expert (llama.cpp
    ``build_layer_ffn``)."""
    build_norm(d, cfg, s.xn, s.x, w["ffn_norm"])
    if not cfg.n_expert:
        _residual(d, cfg, s, build_ffn(d, cfg, w, s, SILU))
        return
    o = build_moe_ffn(d, cfg, w, s, SILU)
    if cfg.n_ff_shexp:
        d.matmuls(s.xn, (s.shgate, w["ffn_gate_shexp"]), (s.shup, w["ffn_up_shexp"]))
        d.silu_mul(s.shgate, s.shgate, s.shup)
        d.matmul(s.shdown, s.shgate, w["ffn_down_shexp"])
        d.add(o, o, s.shdown)
    _residual(d, cfg, s, o)


def granite_block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` (module doc): :func:`granite_block_attn` then :func:`granite_block_ffn`."""
    granite_block_attn(d, cfg, w, s, kv, il)
    granite_block_ffn(d, cfg, w, s, il)


def granite_lm_head(d: Device, cfg: ModelConfig, w: Weights, logits: DeviceTensor, xn: DeviceTensor) -> None:
    """``logits = xn @ output^T``, divided by ``logit_scale`` when the file has one (llama.cpp
    ``ggml_scale(cur, 1.0f / f_logit_scale)``)."""
    builders.lm_head(d, cfg, w, logits, xn)
    if cfg.logit_scale:
        d.scale(logits, logits, 1.0 / cfg.logit_scale)


def granite_embd_scale(cfg: ModelConfig) -> float:
    """The token embeddings' factor: ``embedding_scale``, 1 without (llama.cpp ``build_inp_embd``)."""
    return cfg.embedding_scale or 1.0


def mamba2_block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """A mamba2 block (llama.cpp src/models/mamba.cpp): ``x += mamba2_layer(rmsnorm(x) * attn_norm)``."""
    build_norm(d, cfg, s.xn, s.x, w["attn_norm"])
    d.add(s.x, s.x, mamba2_layer(d, cfg, w, s, kv))


def mamba2_hparams(m: Metadata) -> dict[str, Any]:
    """llama.cpp ``llama_model_mamba2::load_arch_hparams``: :func:`ssm_hparams`; every block recurrent."""
    n_layer = int(m.num("block_count", required=True, minimum=1))
    return {**ssm_hparams(m), "recurrent_layers": (True,) * n_layer}


GRANITEHYBRID = Architecture(name="granitehybrid", tensors=GRANITE_TENSORS, rope_mode=ROPE_NORMAL,
                             hparams=granite_hparams, block=granite_block, block_attn=granite_block_attn,
                             block_ffn=granite_block_ffn, scratch=granite_scratch,
                             scratch_i32=granite_scratch_i32, lm_head=granite_lm_head,
                             embd_scale=granite_embd_scale, state_widths=state_widths)
MAMBA2 = Architecture(name="mamba2", tensors=MAMBA2_TENSORS, rope_mode=ROPE_NORMAL, hparams=mamba2_hparams,
                      block=mamba2_block, scratch=mamba2_scratch, state_widths=state_widths)
