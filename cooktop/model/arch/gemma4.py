"""The gemma4 architecture (``general.architecture = gemma4``): Gemma 4's dense text models
(E2B, E4B with per-layer embeddings and shared-KV layers; 31B) and its mixture-of-experts 26B-A4B
(``expert_count`` > 0: blocks with a router add experts beside the dense MLP, ``gemma4_moe.py``).

Sources: llama.cpp src/models/gemma4.cpp (``load_arch_hparams``, ``load_arch_tensors``, the graph,
``build_inp_per_layer``, ``project_per_layer_inputs``), src/llama-hparams.cpp (``n_embd_head_k(il)``,
``n_rot(il)``, ``has_kv``), src/llama-model.cpp (the KV cache's ``reuse`` callback for gemma4,
``get_rope_freq_base``), conversion/gemma.py (``Gemma4Model``: the keys written, ``rope_freqs``).

Block ``il`` (``swa`` = ``cfg.swa_layers[il]``; widths are the block's, ``ModelConfig.layer(il)``:
head_dim ``attention.key_length_swa`` on SWA layers, ``attention.key_length`` on the others; n_ff
and n_head_kv per layer when the file gives arrays)::

    xn = rmsnorm(x) * attn_norm
    q = rope(rmsnorm_per_head(xn @ Wq^T) * attn_q_norm)          NeoX; SWA: rope.freq_base_swa,
                                                                 n_rot_swa; full: rope_freqs factors
    if block keeps K/V (il < n_layer - shared_kv_layers):
        k = xn @ Wk^T ; v = xn @ Wv^T, or k itself when attn_v is absent (before k's norm)
        k = rope(rmsnorm_per_head(k) * attn_k_norm) ; v = rmsnorm_per_head(v)   (no weight)
        cache[pos] = k, v
    a = attention(q, cache of kv_source(il), scale 1, window n_swa on SWA layers)
    x += rmsnorm(a @ Wo^T) * post_attention_norm
    xn = rmsnorm(x) * ffn_norm
    x += rmsnorm((gelu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T) * post_ffw_norm
         [a block with ffn_gate_inp: the dense MLP and the experts, gemma4_moe.ffn]
    [per-layer input: x += rmsnorm((gelu(x @ inp_gate^T) * layer_in) @ proj^T) * post_norm]
    [x *= layer_output_scale]

A block past ``n_layer_kv`` (``ModelConfig.kv_source``) stores nothing and attends over the cache
of the last earlier block of its kind (``n_layer_kv - 2`` SWA, ``n_layer_kv - 1`` full), which the
KV cache hands it (``model/forward.py`` ``KVCache``: no K/V of its own, so 0 bytes in the budgets).

Input: ``token_embd[tokens] * sqrt(n_embd)`` (float32), and per block a per-layer input
(:func:`layer_inputs`, on the host)::

    proj   = rmsnorm((x0 @ per_layer_model_proj^T) / sqrt(n_embd), per P-wide slice) * per_layer_proj_norm
    layer_in = (proj + per_layer_token_embd[tokens] * sqrt(P)) / sqrt(2)        [n, n_layer, P]

Head: ``logits = (rmsnorm(x) * output_norm) @ Wout^T`` (tied to ``token_embd`` when absent), then
``c * tanh(logits / c)`` with ``c = final_logit_softcapping`` (on the host, ``model/forward.py``).

Conventions checked against llama.cpp:

- Norm weights are used as stored (the converter's ``norm_shift`` is 0 for Gemma 4).
- No query scaling: the attention scale is 1 (``f_attention_scale = 1``).
- The V norm has no weight: ``rmsnorm(v)`` is run as ``l2_norm`` with epsilon ``g * eps`` times
  ``sqrt(g)`` (g = head_dim), which equals ``v / sqrt(mean(v^2) + eps)``.
- The layer output scalars (``blk.N.layer_output_scale``, one value each) are read at load into
  ``ModelConfig.layer_out_scales`` and applied with the ``scale`` op (ggml_mul by a one-value tensor
  is the same float32 product).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from ...backends.base import ROPE_NEOX, Device
from ...errors import UnsupportedModelError
from ...format.quants import dequantize
from ..hparams import Metadata, ModelConfig
from . import gemma4_moe
from .base import INPUT, KV, Weights, matrix, norm
from .builders import GELU, build_ffn, build_norm, is_swa, rope_args
from .descriptor import Architecture
from .gemma3 import embd_scale
from .skeleton import llama_tensors


def _layer_array(m: Metadata, name: str, n_layer: int, default: int) -> tuple[int, ...]:
    """A per-layer int key (llama.cpp ``get_key_or_arr``) as n_layer values; () when it is one number
    or absent.

    Raises:
        UnsupportedModelError: an array of another length than block_count, or with a value < 1.
    """
    raw = m.get(name, default)
    if not isinstance(raw, (list, tuple, np.ndarray)):
        return ()
    vals = tuple(int(v) for v in raw)
    if len(vals) != n_layer or min(vals) < 1:
        raise UnsupportedModelError(f"{m.path}: metadata key {m.key(name)!r} has {len(vals)} entries (each >= 1 "
                                    f"needed) for block_count = {n_layer}")
    return vals if len(set(vals)) > 1 else ()


def hparams(m: Metadata) -> dict[str, Any]:
    """The gemma4 keys (llama.cpp ``llama_model_gemma4::load_arch_hparams``).

    Returns ``ModelConfig`` fields: rms_eps, n_swa, swa_layers (``attention.sliding_window_pattern``,
    a per-layer bool array), rope_freq_base_swa, head_dim_swa, n_rot_swa, n_ff_layers,
    n_head_kv_layers, n_layer_kv (``block_count - attention.shared_kv_layers``), n_embd_per_layer,
    final_logit_softcap and attn_scale 1; with ``expert_count`` > 0 the MoE keys (``gemma4_moe.hparams``).

    Raises:
        UnsupportedModelError: a required key missing (``attention.layer_norm_rms_epsilon``,
            ``attention.sliding_window``, ``attention.sliding_window_pattern``,
            ``attention.key_length_swa``, ``embedding_length_per_layer_input``), a pattern that is not
            one bool per block, value and key widths that differ, KV sharing whose source blocks are not
            of the sharing blocks' kind (or fewer than 2 blocks keep K/V), bad MoE keys (``gemma4_moe.hparams``).
    """
    n_layer = m.num("block_count", required=True, minimum=1)
    moe = gemma4_moe.hparams(m, n_layer)
    pattern = m.get("attention.sliding_window_pattern", required=True)
    if not isinstance(pattern, (list, tuple, np.ndarray)) or len(pattern) != n_layer:
        raise UnsupportedModelError(f"{m.path}: metadata key {m.key('attention.sliding_window_pattern')!r} must "
                                    f"be one bool per block ({n_layer})")
    swa = tuple(bool(v) for v in pattern)
    n_head = m.num("attention.head_count", required=True, minimum=1)
    head_dim = m.num("attention.key_length", default=m.num("embedding_length", required=True) // n_head, minimum=2)
    head_dim_swa = m.num("attention.key_length_swa", required=True, minimum=2)
    if m.num("attention.value_length_swa", default=head_dim_swa) != head_dim_swa:
        raise UnsupportedModelError(f"{m.path}: {m.key('attention.value_length_swa')} differs from "
                                    f"{m.key('attention.key_length_swa')} (llama.cpp requires them equal)")
    n_rot_swa = m.num("rope.dimension_count_swa", default=m.num("rope.dimension_count", default=head_dim),
                      minimum=2)
    if n_rot_swa % 2 or n_rot_swa > head_dim_swa:
        raise UnsupportedModelError(f"{m.path}: {m.key('rope.dimension_count_swa')} = {n_rot_swa} must be even "
                                    f"and <= {head_dim_swa}")
    shared = m.num("attention.shared_kv_layers", default=0, minimum=0)
    n_layer_kv = n_layer - shared if shared else 0
    if shared:
        if n_layer_kv < 2 or swa[n_layer_kv - 1] or not swa[n_layer_kv - 2]:
            raise UnsupportedModelError(
                f"{m.path}: {m.key('attention.shared_kv_layers')} = {shared}: the shared-KV blocks read blocks "
                f"{n_layer_kv - 2} (sliding-window) and {n_layer_kv - 1} (full attention), which this file's "
                "pattern does not have")
    n_head_kv = _layer_array(m, "attention.head_count_kv", n_layer, n_head)
    if any(n_head % k for k in n_head_kv):
        raise UnsupportedModelError(f"{m.path}: a per-layer {m.key('attention.head_count_kv')} does not divide "
                                    f"n_head = {n_head}")
    return {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0)),
            "n_swa": m.num("attention.sliding_window", required=True, minimum=0),
            "swa_layers": swa,
            "rope_freq_base_swa": float(m.num("rope.freq_base_swa", float, 10000.0, minimum=1e-30)),
            "head_dim_swa": head_dim_swa, "n_rot_swa": n_rot_swa,
            "n_ff_layers": _layer_array(m, "feed_forward_length", n_layer, 0),
            "n_head_kv_layers": n_head_kv, "n_layer_kv": n_layer_kv,
            "n_embd_per_layer": m.num("embedding_length_per_layer_input", required=True, minimum=0),
            "final_logit_softcap": float(m.num("final_logit_softcapping", float, 0.0, minimum=0.0)),
            "attn_scale": 1.0, **moe}


def tensor_hparams(f: Any, cfg: ModelConfig) -> dict[str, Any]:
    """``{"layer_out_scales": per-block scalar}`` from the ``blk.N.layer_output_scale`` tensors (one
    value each; 1 for a block without one), or {} when no block has one.

    Raises:
        UnsupportedModelError: such a tensor with another number of values than 1.
    """
    names = [f"blk.{i}.layer_output_scale.weight" for i in range(cfg.n_layer)]
    if not any(n in f.tensors for n in names):
        return {}
    out = []
    for n in names:
        t = f.tensors.get(n)
        if t is None:
            out.append(1.0)
            continue
        if int(np.prod(t.shape)) != 1:
            raise UnsupportedModelError(f"{f.path}: tensor {n!r} has shape {list(t.shape)}, not one value")
        out.append(float(np.asarray(dequantize(t.data, t.ggml_type, (1,)), dtype=np.float32).reshape(-1)[0]))
    return {"layer_out_scales": tuple(out)}


def _n_pl(c: ModelConfig) -> int:
    """``n_layer * n_embd_per_layer``: the width of the per-layer token embedding."""
    return c.n_layer * c.n_embd_per_layer


def _has_ple(c: ModelConfig, il: int) -> bool:
    """True when the blocks take per-layer inputs (``n_embd_per_layer`` > 0): their inp_gate, proj, post_norm."""
    return c.n_embd_per_layer > 0


#: llama.cpp ``llama_model_gemma4::load_arch_tensors`` (dense): gemma3's with optional K/V (a shared-KV
#: block may lack them; V is K when attn_v is absent), proportional-rope factors for the full-attention
#: layers, a per-block output scalar, the MoE branch (``gemma4_moe.TENSORS``: blocks with a router) and the
#: per-layer input tensors.
TENSORS = (*llama_tensors(
    shared=(norm("rope_freqs.weight", lambda c: (c.head_dim // 2,), required=False),),
    qkv=(matrix("blk.{i}.attn_q.weight", lambda c: (c.n_embd_q, c.n_embd)),
         matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd), required=False),
         matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd), required=False)),
    attn=(norm("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,)),
          norm("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,), required=False),
          norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)),
          # read into ModelConfig.layer_out_scales at load; with the feed-forward half, which applies it
          norm("blk.{i}.layer_output_scale.weight", lambda c: (1,), required=False, ffn=True)),
    post_ffn=(norm("blk.{i}.post_ffw_norm.weight", lambda c: (c.n_embd,)), *gemma4_moe.TENSORS)),
    matrix("per_layer_token_embd.weight", lambda c: (c.n_vocab, _n_pl(c)), unit=INPUT, required=False),
    matrix("per_layer_model_proj.weight", lambda c: (_n_pl(c), c.n_embd), unit=INPUT, required=False),
    norm("per_layer_proj_norm.weight", lambda c: (c.n_embd_per_layer,), unit=INPUT, required=False),
    # the per-layer input follows the feed-forward, in its half (block_ffn)
    matrix("blk.{i}.inp_gate.weight", lambda c: (c.n_embd_per_layer, c.n_embd), layers=_has_ple, ffn=True),
    matrix("blk.{i}.proj.weight", lambda c: (c.n_embd, c.n_embd_per_layer), layers=_has_ple, ffn=True),
    norm("blk.{i}.post_norm.weight", lambda c: (c.n_embd,), layers=_has_ple, ffn=True))

#: The global per-layer input tensors a model with ``n_embd_per_layer`` > 0 needs.
PLE_GLOBAL = ("per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight")


def check_tensors(present: Any, cfg: ModelConfig, path: str) -> None:
    """Tensors whose need depends on the config: the per-layer input ones (:data:`PLE_GLOBAL`) when
    ``n_embd_per_layer`` > 0; ``rope_freqs`` when a layer attends fully; ``attn_k`` and ``attn_k_norm``
    in every block that keeps K/V; a MoE block's tensors (``gemma4_moe.check_tensors``).

    Raises:
        UnsupportedModelError: naming the first missing tensor.
    """
    need = list(PLE_GLOBAL) if cfg.n_embd_per_layer else []
    if not all(cfg.swa_layers):  # llama.cpp creates rope_freqs with the first full-attention layer
        need.append("rope_freqs.weight")
    for il in range(cfg.n_layer):
        if cfg.has_kv(il):
            need += [f"blk.{il}.attn_k.weight", f"blk.{il}.attn_k_norm.weight"]
    for name in need:
        if name not in present:
            raise UnsupportedModelError(f"{path}: missing tensor {name!r} ({cfg.arch}.block_count = {cfg.n_layer})")
    gemma4_moe.check_tensors(present, cfg, path)


def _widths(cfg: ModelConfig) -> tuple[set[int], set[int], set[int]]:
    """The distinct query, K/V and feed-forward row widths of the blocks."""
    ls = [cfg.layer(il) for il in range(cfg.n_layer)]
    return ({c.n_embd_q for c in ls}, {c.n_embd_kv for il, c in enumerate(ls) if cfg.has_kv(il)},
            {c.n_ff for c in ls})


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers of the blocks: ``x``, ``xn``, ``o`` [n_embd];
    per distinct block width W, ``q{W}`` and ``att{W}`` (queries), ``k{W}`` and ``v{W}`` (K/V),
    ``gate{W}`` and ``up{W}`` (feed-forward); ``pl`` [n_embd_per_layer] when there are per-layer inputs;
    the MoE branch's (``gemma4_moe.scratch``) when the model has experts."""
    qs, ks, fs = _widths(cfg)
    out = {"x": cfg.n_embd, "xn": cfg.n_embd, "o": cfg.n_embd}
    for w in sorted(qs):
        out.update({f"q{w}": w, f"att{w}": w})
    for w in sorted(ks):
        out.update({f"k{w}": w, f"v{w}": w})
    for w in sorted(fs):
        out.update({f"gate{w}": w, f"up{w}": w})
    if cfg.n_embd_per_layer:
        out["pl"] = cfg.n_embd_per_layer
    return {**out, **gemma4_moe.scratch(cfg)}


def _rms_no_weight(d: Device, lc: ModelConfig, t: Any) -> None:
    """``t = t / sqrt(mean(t^2) + eps)`` per head of ``t`` f32 [n, n_head_kv * head_dim] (llama.cpp
    ``ggml_rms_norm`` without a weight): ``l2_norm`` with epsilon ``head_dim * eps``, times sqrt(head_dim)."""
    g = lc.head_dim
    d.l2_norm(t, t, g, g * lc.rms_eps)
    d.scale(t, t, float(np.sqrt(np.float32(g))))


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` of gemma4 (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place):
    :func:`block_attn`, then :func:`block_ffn` (the halves placement may put on two devices: a MoE
    block's experts on the host with ``--n-cpu-moe``)."""
    block_attn(d, cfg, w, s, kv, il)
    block_ffn(d, cfg, w, s, il)


def block_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """The attention half of :func:`block`: ``x += rmsnorm(attention(rmsnorm(x) * attn_norm)) *
    post_attention_norm``.

    Args:
        w: this block's weights (keys as in :data:`TENSORS`).
        s: scratch buffers of :func:`scratch` cut to ``n`` rows, and ``s.layer_in`` (f32 [n,
            n_embd_per_layer]) this block's per-layer input when the model has them.
        kv: positions and the cache this block reads: its own (cells ``kv.cells`` are written) or,
            for a shared-KV block, that of ``cfg.kv_source(il)`` (nothing is written).
        il: the block's index in the model.
    """
    lc = cfg.layer(il)
    swa = is_swa(cfg, il)
    x, xn, o = s.x, s.xn, s.o
    q, att = getattr(s, f"q{lc.n_embd_q}"), getattr(s, f"att{lc.n_embd_q}")
    build_norm(d, lc, xn, x, w["attn_norm"])
    d.matmul(q, xn, w["attn_q"])
    build_norm(d, lc, q, q, w["attn_q_norm"])
    rope = rope_args(lc, il)
    ff = None if swa else w.get("rope_freqs")  # proportional rope: the full-attention layers' factors
    d.rope(q, q, kv.pos, **rope, freq_factors=ff)
    window = cfg.n_swa if swa else 0
    if cfg.has_kv(il):
        k, v = getattr(s, f"k{lc.n_embd_kv}"), getattr(s, f"v{lc.n_embd_kv}")
        # V is K (before K's norm) when the block has no attn_v (31B's full-attention layers)
        d.matmuls(xn, (k, w["attn_k"]), (v, w.get("attn_v", w["attn_k"])))
        build_norm(d, lc, k, k, w["attn_k_norm"])
        _rms_no_weight(d, lc, v)
        kv.attend(d, att, q, k, v, lc.n_head, lc.n_head_kv, 1.0, window, k_rope={**rope, "freq_factors": ff})
    else:  # reads the cache of cfg.kv_source(il), written earlier in this pass
        src = cfg.layer(cfg.kv_source(il))
        d.attention(att, q, kv.k, kv.v, kv.cells, lc.n_head, src.n_head_kv, 1.0, window, kv_start=kv.kv_start,
                    flash=kv.flash)
    d.matmul(o, att, w["attn_output"])
    d.add(x, x, build_norm(d, lc, o, o, w["post_attention_norm"]))


def block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, il: int) -> None:
    """The feed-forward half of :func:`block` on ``s.x`` (f32 [n, n_embd], in place): the dense MLP
    (``x += rmsnorm(gelu_ffn(rmsnorm(x) * ffn_norm)) * post_ffw_norm``) or, in a block with a router,
    the MLP and the experts (``gemma4_moe.ffn``); then the per-layer input and the output scalar."""
    lc = cfg.layer(il)
    x, xn, o = s.x, s.xn, s.o
    gate, up = getattr(s, f"gate{lc.n_ff}"), getattr(s, f"up{lc.n_ff}")
    if lc.n_expert and "ffn_gate_inp" in w:  # a MoE block: the dense MLP and the experts (gemma4_moe.py)
        gemma4_moe.ffn(d, lc, w, s, gate, up)
    else:
        build_norm(d, lc, xn, x, w["ffn_norm"])
        f = SimpleNamespace(xn=xn, o=o, gate=gate, up=up)
        d.add(x, x, build_norm(d, lc, o, build_ffn(d, lc, w, f, GELU), w["post_ffw_norm"]))
    if cfg.n_embd_per_layer:
        d.matmul(s.pl, x, w["inp_gate"])
        d.gelu_mul(s.pl, s.pl, s.layer_in)
        d.matmul(o, s.pl, w["proj"])
        d.add(x, x, build_norm(d, lc, o, o, w["post_norm"]))
    if cfg.layer_out_scales:
        d.scale(x, x, cfg.layer_out_scales[il])


def layer_inputs(cfg: ModelConfig, gf: Any, tokens: np.ndarray, x: np.ndarray, cache: dict) -> np.ndarray:
    """The per-layer inputs of a pass (module doc; llama.cpp ``build_inp_per_layer`` and
    ``project_per_layer_inputs``), on the host in float32.

    Args:
        gf: the model's GGUF file (``per_layer_token_embd``, ``per_layer_model_proj``,
            ``per_layer_proj_norm``); the projection is dequantized once into ``cache``.
        tokens: int [n] token ids; x: float32 [n, n_embd] their scaled embeddings.
    Returns:
        float32 [n, n_layer, n_embd_per_layer].
    """
    L, P, E = cfg.n_layer, cfg.n_embd_per_layer, cfg.n_embd
    if "proj" not in cache:
        t = gf.tensor("per_layer_model_proj.weight")
        cache["proj"] = np.ascontiguousarray(
            np.asarray(dequantize(t.data, t.ggml_type, t.shape), dtype=np.float32).reshape(L * P, E).T)
        nt = gf.tensor("per_layer_proj_norm.weight")
        cache["norm"] = np.asarray(dequantize(nt.data, nt.ggml_type, nt.shape), dtype=np.float32).reshape(P)
    te = gf.tensor("per_layer_token_embd.weight")
    rows = np.asarray(te.data).reshape(te.shape[0], -1)[np.asarray(tokens)]
    emb = np.asarray(dequantize(rows, te.ggml_type, (len(tokens), te.shape[-1])), dtype=np.float32)
    n = len(tokens)
    one = np.float32(1.0)
    proj = (np.asarray(x, dtype=np.float32) @ cache["proj"]) * (one / np.sqrt(np.float32(E)))
    proj = proj.astype(np.float32).reshape(n, L, P)
    ms = np.mean(proj * proj, axis=-1, dtype=np.float32, keepdims=True)
    proj = proj * (np.float32(1.0) / np.sqrt(ms + np.float32(cfg.rms_eps))) * cache["norm"]
    out = (proj + emb.reshape(n, L, P) * np.sqrt(np.float32(P))) * (one / np.sqrt(np.float32(2.0)))
    return np.ascontiguousarray(out, dtype=np.float32)


GEMMA4 = Architecture(name="gemma4", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, block=block,
                      scratch=scratch, scratch_i32=gemma4_moe.scratch_i32, embd_scale=embd_scale,
                      check_tensors=check_tensors, layer_arrays=True, tensor_hparams=tensor_hparams,
                      layer_inputs=layer_inputs, block_attn=block_attn, block_ffn=block_ffn)
