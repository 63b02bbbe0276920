"""Gemma 4's mixture-of-experts feed-forward (26B-A4B, ``gemma4.expert_count`` > 0): the MoE keys, the
expert tensors and the block's feed-forward half when the block has experts (``gemma4.py`` calls it).

Sources: llama.cpp src/models/gemma4.cpp (``load_arch_hparams``: ``expert_feed_forward_length``;
``load_arch_tensors``: the router, its scale, the extra norms, fused or separate gate/up experts; the
graph's ``is_moe_layer`` branch), src/llama-model.cpp (``ffn_down_exps.scale``, per expert, loaded for
every architecture), src/llama-graph.cpp ``build_moe_ffn`` (``probs_in``, ``gate_up_exps``,
``down_exps_s``), conversion/gemma.py ``Gemma4Model`` (``router.scale`` -> ``ffn_gate_inp.scale``,
``router.per_expert_scale`` -> ``ffn_down_exps.scale``), gguf-py tensor_mapping.py (``experts.gate_up_proj``
-> ``ffn_gate_up_exps``: the converter writes the fused form).

A block is a MoE block when the file has its ``ffn_gate_inp`` (llama.cpp ``is_moe_layer``); its dense
MLP stays, as a shared expert, and the two branches are added (``a`` = x after the attention)::

    mlp  = rmsnorm(gelu_ffn(rmsnorm(a) * ffn_norm)) * post_ffw_norm_1           dense MLP (n_ff)
    r    = rmsnorm(a) / sqrt(n_embd) * ffn_gate_inp.scale                        router input (no weight
                                                                                 norm, then the scale)
    ids, wts = top-k of softmax(r @ ffn_gate_inp^T), wts renormalised to sum 1   (norm_w, scale 1)
    h    = gelu(xe @ gate_e^T) * (xe @ up_e^T),  xe = rmsnorm(a) * pre_ffw_norm_2   per selected expert
    moe  = rmsnorm(sum_j wts_j * s[ids_j] * (h @ down_e^T)) * post_ffw_norm_2    s = ffn_down_exps.scale
    x    = a + rmsnorm(mlp + moe) * post_ffw_norm

Fused experts (``ffn_gate_up_exps`` [n_expert, 2 n_ff_exp, n_embd]: per expert its gate rows, then its up
rows, as llama.cpp views the product) are uploaded as the two halves of every expert
(``TensorSpec.parts`` with ``groups`` = n_expert), so the separate layout's path runs unchanged.

The per-expert scale multiplies the selected experts' weights, not the down product (llama.cpp
multiplies ``down`` by ``s[ids]`` and then by the weights: the same float products up to one rounding).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...backends.base import Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from .base import TensorSpec, Weights, matrix, norm
from .builders import GELU, build_ffn, build_moe_ffn, build_norm


def has_experts(c: ModelConfig, il: int) -> bool:
    """True when a model of ``c`` may have experts in its blocks (``expert_count`` > 0); the file says
    which blocks do (their ``ffn_gate_inp``)."""
    return c.n_expert > 0


def hparams(m: Metadata, n_layer: int) -> dict[str, Any]:
    """The MoE keys of a gemma4 file: ``{}`` without experts; else ``n_expert`` (``expert_count``),
    ``n_expert_used`` (``expert_used_count``), ``n_ff_exp`` (``expert_feed_forward_length``, one value or a
    per-layer array of one value) and llama.cpp's gating for gemma4 (softmax, weights renormalised, no
    weight scale: ``build_moe_ffn(..., LLM_FFN_GELU, true, 1.0f, SOFTMAX)``).

    Raises:
        UnsupportedModelError: ``expert_count`` of 1, ``expert_used_count`` missing, 0 or above the
            count, ``expert_feed_forward_length`` missing or < 1, or a per-layer array of several values.
    """
    n_expert = m.num("expert_count", default=0, minimum=0)
    if not n_expert:
        return {}
    if n_expert < 2:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_count')} = {n_expert}: a mixture of experts needs 2 "
                                    "or more")
    n_used = m.num("expert_used_count", required=True, minimum=1)
    if n_used > n_expert:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_used_count')} = {n_used} exceeds "
                                    f"{m.key('expert_count')} = {n_expert}")
    raw = m.get("expert_feed_forward_length", required=True)
    vals = {int(v) for v in np.atleast_1d(raw)}
    if isinstance(raw, (list, tuple, np.ndarray)) and len(raw) != n_layer:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_feed_forward_length')} has {len(raw)} entries for "
                                    f"block_count = {n_layer}")
    if len(vals) != 1 or min(vals) < 1:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_feed_forward_length')} = {sorted(vals)}: cooktop needs "
                                    "one expert width (>= 1) for every block")
    return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": vals.pop(), "expert_gating": "softmax",
            "expert_weights_norm": True, "expert_weights_scale": 0.0}


def _moe(spec: TensorSpec) -> TensorSpec:
    """``spec`` in the blocks of a model with experts, optional (a block is MoE when it has its router)."""
    return dataclasses.replace(spec, required=False, layers=has_experts)


#: The fused gate/up experts: per expert ``n_ff_exp`` gate rows then ``n_ff_exp`` up rows, uploaded as
#: ``ffn_gate_exps`` and ``ffn_up_exps`` [n_expert, n_ff_exp, n_embd] (what the converter writes).
GATE_UP_EXPS = TensorSpec("blk.{i}.ffn_gate_up_exps.weight", lambda c: (c.n_expert, 2 * c.n_ff_exp, c.n_embd),
                          parts=(("ffn_gate_exps", lambda c: c.n_ff_exp), ("ffn_up_exps", lambda c: c.n_ff_exp)),
                          groups=lambda c: c.n_expert, layout="fused")

#: llama.cpp ``llama_model_gemma4::load_arch_tensors``, ``has_expert`` (file order), and the per-expert
#: scale of ``ffn_down_exps`` (src/llama-model.cpp: ``{n_expert}``; uploaded as [n_expert, 1] for ``add_id``).
TENSORS = tuple(_moe(s) for s in (
    matrix("blk.{i}.ffn_gate_inp.weight", lambda c: (c.n_expert, c.n_embd)),
    norm("blk.{i}.ffn_gate_inp.scale", lambda c: (c.n_embd,)),
    norm("blk.{i}.pre_ffw_norm_2.weight", lambda c: (c.n_embd,)),
    norm("blk.{i}.post_ffw_norm_1.weight", lambda c: (c.n_embd,)),
    norm("blk.{i}.post_ffw_norm_2.weight", lambda c: (c.n_embd,)),
    GATE_UP_EXPS,
    matrix("blk.{i}.ffn_gate_exps.weight", lambda c: (c.n_expert, c.n_ff_exp, c.n_embd), layout="split"),
    matrix("blk.{i}.ffn_up_exps.weight", lambda c: (c.n_expert, c.n_ff_exp, c.n_embd), layout="split"),
    matrix("blk.{i}.ffn_down_exps.weight", lambda c: (c.n_expert, c.n_embd, c.n_ff_exp)),
    norm("blk.{i}.ffn_down_exps.scale", lambda c: (c.n_expert, 1))))

#: What a MoE block must hold beside its router (the gate/up experts in one of the two layouts).
_NEEDED = ("ffn_gate_inp.scale", "pre_ffw_norm_2.weight", "post_ffw_norm_1.weight", "post_ffw_norm_2.weight",
           "ffn_down_exps.weight")
_ALL = tuple(s.name.removeprefix("blk.{i}.") for s in TENSORS)


def check_tensors(present: Container[str], cfg: ModelConfig, path: str) -> None:
    """A block with a router (``ffn_gate_inp``) holds the rest of the MoE branch (:data:`_NEEDED`) and its
    gate/up experts either fused (``ffn_gate_up_exps``) or as ``ffn_gate_exps`` and ``ffn_up_exps``, not
    both; a block without one holds no MoE tensor.

    Raises:
        UnsupportedModelError: naming the block and the tensor.
    """
    if not cfg.n_expert:
        return
    for il in range(cfg.n_layer):
        has = {n for n in _ALL if f"blk.{il}.{n}" in present}
        if "ffn_gate_inp.weight" not in has:
            if has:
                raise UnsupportedModelError(f"{path}: block {il} has {sorted(has)[0]!r} but no router "
                                            f"('blk.{il}.ffn_gate_inp.weight')")
            continue
        fused, split = "ffn_gate_up_exps.weight" in has, {"ffn_gate_exps.weight", "ffn_up_exps.weight"} & has
        missing = [n for n in _NEEDED if n not in has]
        if not fused and len(split) < 2:
            missing += sorted({"ffn_gate_exps.weight", "ffn_up_exps.weight"} - split) if split else \
                ["ffn_gate_up_exps.weight"]
        if missing:
            raise UnsupportedModelError(f"{path}: missing tensor 'blk.{il}.{missing[0]}' (block {il} has experts: "
                                        "'ffn_gate_inp')")
        if fused and split:
            raise UnsupportedModelError(f"{path}: block {il} has both 'ffn_gate_up_exps' and separate "
                                        f"{sorted(split)[0]!r}: one layout of the gate/up experts, not both")


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """The f32 row widths the MoE branch adds (``k`` = n_expert_used, ``F`` = n_ff_exp): ``rin``, ``moe``
    [n_embd] (router input, branch output), ``router`` [n_expert], ``ewts``, ``escale`` [k], ``eup``,
    ``egate`` [k * F], ``edown`` [k * n_embd]; {} without experts."""
    if not cfg.n_expert:
        return {}
    k, F, E = cfg.n_expert_used, cfg.n_ff_exp, cfg.n_embd
    return {"rin": E, "moe": E, "router": cfg.n_expert, "ewts": k, "escale": k, "eup": k * F, "egate": k * F,
            "edown": k * E}


def scratch_i32(cfg: ModelConfig) -> dict[str, int]:
    """The I32 row widths: ``eids`` [n_expert_used] (the selected experts); {} without experts."""
    return {"eids": cfg.n_expert_used} if cfg.n_expert else {}


def ffn(d: Device, lc: ModelConfig, w: Weights, s: SimpleNamespace, gate: Any, up: Any) -> None:
    """The feed-forward half of a MoE block (module doc) on ``s.x`` (f32 [n, n_embd], the attention's
    output added, in place): ``x += rmsnorm(mlp + moe) * post_ffw_norm``.

    Args:
        lc: the block's config (``ModelConfig.layer``).
        w: the block's weights (``ffn_gate_inp`` among them).
        s: the block's scratch (``gemma4.scratch`` and :func:`scratch`, cut to ``n`` rows).
        gate, up: the dense MLP's buffers, f32 [n, n_ff of the block].
    """
    x, xn, o = s.x, s.xn, s.o
    build_norm(d, lc, xn, x, w["ffn_norm"])
    build_ffn(d, lc, w, SimpleNamespace(xn=xn, o=o, gate=gate, up=up), GELU)
    build_norm(d, lc, o, o, w["post_ffw_norm_1"])
    # the router reads rmsnorm(a) / sqrt(n_embd) * scale (llama.cpp: ggml_rms_norm, ggml_scale, ggml_mul)
    build_norm(d, lc, s.rin, x, w["ffn_gate_inp.scale"])
    d.scale(s.rin, s.rin, float(np.float32(1.0) / np.sqrt(np.float32(lc.n_embd))))
    d.matmul(s.router, s.rin, w["ffn_gate_inp"])
    build_norm(d, lc, xn, x, w["pre_ffw_norm_2"])
    m = SimpleNamespace(xn=xn, o=s.moe, router=s.router, ewts=s.ewts, escale=s.escale, eup=s.eup, egate=s.egate,
                        edown=s.edown, eids=s.eids)
    build_norm(d, lc, s.moe, build_moe_ffn(d, lc, w, m, GELU, routed=True), w["post_ffw_norm_2"])
    d.add(o, o, s.moe)
    d.add(x, x, build_norm(d, lc, o, o, w["post_ffw_norm"]))
