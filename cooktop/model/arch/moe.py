"""The mixture-of-experts feed-forward every MoE architecture shares: hyper-parameters, tensors,
scratch buffers and the block's FFN half (llama.cpp src/llama-graph.cpp ``build_moe_ffn``).

Per block, on the normed rows ``xn`` f32 [n, n_embd] (``k`` = n_expert_used, ``F`` = n_ff_exp)::

    logits = xn @ ffn_gate_inp^T [+ ffn_gate_inp.bias]            [n, n_expert]
    ids, wts = moe_route(logits)   top-k by the gating function     [n, k], [n, k]
    up   = matmul_id(xn, ffn_up_exps, ids)   [+ add_id bias]         [n, k * F]
    gate = matmul_id(xn, ffn_gate_exps, ids) [+ add_id bias]         [n, k * F]
    h    = silu(gate) * up   (gpt-oss: swiglu_oai(gate, up, alpha 1.702, limit 7))
    down = matmul_id(h, ffn_down_exps, ids)  [+ add_id bias]         [n, k * n_embd]
    o    = sum_j wts[:, j] * down[:, slot j]                         [n, n_embd]
    [shared expert (qwen2moe): o += sigmoid(xn @ ffn_gate_inp_shexp^T) * ffn(xn, *_shexp)]

Expert tensors are 3-D: ``ffn_up_exps`` [n_expert, F, n_embd] (GGUF ``ne = (n_embd, F, n_expert)``),
their biases 2-D [n_expert, F]. Refused (never run wrong): expert groups
(``expert_group_count`` > 1, DeepSeek-V3's grouped selection), per-layer expert counts (arrays).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...backends.base import Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from .base import TensorSpec, Weights, bias, matrix

#: The ops :func:`ffn` may call (placement keeps a block on the host when its device lacks one).
MOE_BLOCK_OPS = ("matmul", "moe_route", "matmul_id", "moe_combine", "silu_mul", "add")


def hparams(m: Metadata, gating: str, norm: bool, ff_exp_required: bool = False) -> dict[str, Any]:
    """The MoE keys (llama.cpp ``llama_model_base::load_hparams`` and the architecture's
    ``load_arch_hparams``): ``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``
    (default ``feed_forward_length / expert_used_count``), ``expert_shared_feed_forward_length``
    (default ``feed_forward_length``); ``gating`` and ``norm`` are the architecture's (its graph
    passes them to ``build_moe_ffn``; the file's ``expert_gating_func`` is not read by these).

    Raises:
        UnsupportedModelError: a missing or inconsistent count, per-layer arrays, or expert groups.
    """
    n_expert = m.num("expert_count", required=True, minimum=2)
    n_used = m.num("expert_used_count", required=True, minimum=1)
    if n_used > n_expert:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_used_count')} = {n_used} exceeds "
                                    f"{m.key('expert_count')} = {n_expert}")
    groups = m.num("expert_group_count", int, 0, minimum=0)
    if groups > 1:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_group_count')} = {groups}: grouped expert "
                                    f"selection (DeepSeek-V3 style) is not implemented by cooktop")
    n_ff = m.num("feed_forward_length", required=True, minimum=1)
    ff_exp = m.num("expert_feed_forward_length", int, None if ff_exp_required else n_ff // n_used,
                   required=ff_exp_required, minimum=1)
    return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": ff_exp,
            "n_ff_shexp": m.num("expert_shared_feed_forward_length", int, n_ff, minimum=1),
            "expert_gating": gating, "expert_weights_norm": norm, "expert_weights_scale": 0.0}


def tensors(biases: bool = False, shared: bool = False) -> tuple[TensorSpec, ...]:
    """The router and expert tensors of one block (llama.cpp ``load_arch_tensors``), numpy order;
    ``biases``: gpt-oss's router and expert biases (required); ``shared``: qwen2moe's shared expert."""
    out = [
        matrix("blk.{i}.ffn_gate_inp.weight", lambda c: (c.n_expert, c.n_embd)),
        matrix("blk.{i}.ffn_gate_exps.weight", lambda c: (c.n_expert, c.n_ff_exp, c.n_embd)),
        matrix("blk.{i}.ffn_down_exps.weight", lambda c: (c.n_expert, c.n_embd, c.n_ff_exp)),
        matrix("blk.{i}.ffn_up_exps.weight", lambda c: (c.n_expert, c.n_ff_exp, c.n_embd)),
    ]
    if biases:
        out += [
            bias("blk.{i}.ffn_gate_inp.bias", lambda c: (c.n_expert,), required=True),
            bias("blk.{i}.ffn_gate_exps.bias", lambda c: (c.n_expert, c.n_ff_exp), required=True),
            bias("blk.{i}.ffn_down_exps.bias", lambda c: (c.n_expert, c.n_embd), required=True),
            bias("blk.{i}.ffn_up_exps.bias", lambda c: (c.n_expert, c.n_ff_exp), required=True),
        ]
    if shared:  # ffn_gate_inp_shexp is [n_embd] in the file: one row of a [1, n_embd] matrix
        out += [
            matrix("blk.{i}.ffn_gate_inp_shexp.weight", lambda c: (1, c.n_embd)),
            matrix("blk.{i}.ffn_gate_shexp.weight", lambda c: (c.n_ff_shexp, c.n_embd)),
            matrix("blk.{i}.ffn_down_shexp.weight", lambda c: (c.n_embd, c.n_ff_shexp)),
            matrix("blk.{i}.ffn_up_shexp.weight", lambda c: (c.n_ff_shexp, c.n_embd)),
        ]
    return tuple(out)


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers :func:`ffn` uses (the shared expert's only
    when the model has one, ``n_ff_shexp`` > 0 is always true: allocated when asked by the arch)."""
    k, F = cfg.n_expert_used, cfg.n_ff_exp
    return {"router": cfg.n_expert, "ewts": k, "eup": k * F, "egate": k * F, "edown": k * cfg.n_embd}


def shared_scratch(cfg: ModelConfig) -> dict[str, int]:
    """The shared expert's f32 buffers (qwen2moe)."""
    return {"shg": 1, "shw": 1, "shgate": cfg.n_ff_shexp, "shup": cfg.n_ff_shexp, "shdown": cfg.n_embd,
            "shout": cfg.n_embd}


def scratch_i32(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the I32 [n_batch, width] buffers: the selected experts (and the shared gate's id)."""
    return {"eids": cfg.n_expert_used, "shid": 1}


def ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, act: str = "silu") -> None:
    """``s.o f32 [n, n_embd] = moe_ffn(s.xn)`` (module doc); ``act``: ``silu`` or ``swiglu_oai``.

    Reads the optional router / expert biases and the shared expert when ``w`` has them.
    """
    xn, o, ids = s.xn, s.o, s.eids
    d.matmul(s.router, xn, w["ffn_gate_inp"])
    if "ffn_gate_inp.bias" in w:
        d.add_bias(s.router, s.router, w["ffn_gate_inp.bias"])
    d.moe_route(ids, s.ewts, s.router, cfg.expert_gating, norm=cfg.expert_weights_norm,
                scale=cfg.expert_weights_scale)
    for y, name in ((s.eup, "ffn_up_exps"), (s.egate, "ffn_gate_exps")):
        d.matmul_id(y, xn, w[name], ids)
        if name + ".bias" in w:
            d.add_id(y, y, w[name + ".bias"], ids)
    if act == "swiglu_oai":  # llama.cpp LLM_FFN_SWIGLU_OAI_MOE: alpha 1.702, limit 7 (build_moe_ffn)
        d.swiglu_oai(s.egate, s.egate, s.eup, 1.702, 7.0)
    else:
        d.silu_mul(s.egate, s.egate, s.eup)
    d.matmul_id(s.edown, s.egate, w["ffn_down_exps"], ids)
    if "ffn_down_exps.bias" in w:
        d.add_id(s.edown, s.edown, w["ffn_down_exps.bias"], ids)
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
