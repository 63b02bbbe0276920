"""The qwen35 and qwen35moe architectures (``general.architecture = qwen35`` / ``qwen35moe``): Qwen3.5
and Qwen3.6 dense models (0.8B-27B) and mixtures of experts (Qwen3.6-35B-A3B, 122B-A10B, 397B-A17B),
hybrids of Gated DeltaNet (linear attention) blocks and gated full-attention blocks.

Sources: llama.cpp src/models/qwen35.cpp and qwen35moe.cpp (``load_arch_hparams``, ``load_arch_tensors``, the graph:
``build_layer_attn``, ``build_layer_attn_linear``, ``build_norm_gated``), src/models/delta-net-base.cpp
(``build_conv_state``, ``build_recurrent_attn``), src/models/models.h (``build_gdn_l2_norm``),
src/llama-arch.cpp (tensor and key names), src/llama-model.cpp (rope type IMROPE) and src/llama-graph.cpp
(``llm_graph_input_pos::set_input``: a text token's four rope positions are ``p, p, p, 0``).

Which blocks are recurrent: ``attention.recurrent_layers`` (one bool per block) when present, else every
block but each ``full_attention_interval``-th (default 4: blocks 3, 7, 11... attend). Every block::

    xn = rmsnorm(x) * attn_norm
    x += linear_attn(xn)  or  gated_attn(xn)
    xn = rmsnorm(x) * post_attention_norm
    x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T          qwen35
    x += moe_ffn(xn) + sigmoid(xn . g_shexp) ffn_shexp(xn) qwen35moe (``builders.build_moe_ffn``: softmax
                                                          router, top-k weights renormalised, shared expert)

The linear attention (``d`` = ``ssm.state_size``, ``H_k`` = ``ssm.group_count`` key heads, ``H_v`` =
``ssm.time_step_rank`` value heads, ``ssm.inner_size`` = ``H_v * d``)::

    q, k, v = xn @ attn_qkv^T            (three row ranges: H_k d, H_k d, H_v d)
    z = xn @ attn_gate^T ;  b = xn @ ssm_beta^T ;  a = xn @ ssm_alpha^T          [n, H_v d], [n, H_v] x 2
    g, beta = softplus(a + ssm_dt.bias) * ssm_a, sigmoid(b)                     (op gdn_gate)
    q, k, v = silu(ssm_conv(q)), silu(ssm_conv(k)), silu(ssm_conv(v))            (ssm_conv1d's channel ranges;
                                                                                  a state per range)
    q, k = l2_norm(q), l2_norm(k)        per head, epsilon rms_eps
    o = gated_delta_net(q, k, v, g, beta)                                        (the delta-rule state)
    x += (silu(z) * (rmsnorm_per_head(o) * ssm_norm)) @ ssm_out^T

llama.cpp convolves the three ranges as one ``[conv_dim]`` channel set with one state; a depthwise
convolution is channel by channel, so three calls on the ranges give the same values.

The gated attention: ``attn_q`` holds, per head, the head's query rows then its gate's (uploaded as
``attn_q`` and ``attn_q_gate``, ``TensorSpec.groups``); per-head RMS norms of Q and K, multi-section
rope, attention, then ``a * sigmoid(gate)`` before ``attn_output``. For text tokens (every position of
the four sections ``p, p, p, 0``), IMROPE rotates each pair by ``p`` except pairs whose sector falls to
the fourth section, which ``p = 0`` leaves unrotated (ggml-cpu/ops.cpp ``ggml_mrope_cache_init``);
the released models' sections (11, 11, 10, 0 of 32 pairs) put none there, so the rope is NeoX rope on
``rope.dimension_count`` dims, as :func:`hparams` checks (a file that puts text dimensions in the
fourth section is refused).

The multi-token-prediction block some files carry after the trunk (``nextn_predict_layers``) is not
part of the trunk: its tensors are skipped here (``ModelConfig.n_layer_nextn``) and the trunk runs as
llama.cpp's main pass does; ``--spec-type draft-mtp`` runs it as a draft (``model/mtp.py``).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...backends.base import ROPE_NEOX, Device, DeviceTensor
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from . import builders, moe
from .base import BLOCK, KV, TensorSpec, Weights, matrix, norm
from .builders import SILU, build_attn_core, build_ffn, build_moe_ffn, build_norm, moe_scratch_i32, moe_shared_scratch
from .descriptor import Architecture
from .skeleton import FFN, OUTPUT, OUTPUT_NORM, QK_NORM, TOKEN_EMBD, moe_ffn


def _attn(c: ModelConfig, il: int) -> bool:
    return not c.is_recurrent(il)


def _recr(c: ModelConfig, il: int) -> bool:
    return c.is_recurrent(il)


def key_dim(c: ModelConfig) -> int:
    """Width of the linear attention's queries and keys: ``H_k * d`` (llama.cpp ``key_dim``)."""
    return c.ssm_n_group * c.ssm_d_state


def value_dim(c: ModelConfig) -> int:
    """Width of its values and output: ``H_v * d`` (llama.cpp ``value_dim``, ``ssm.inner_size``)."""
    return c.ssm_d_inner


def _only(specs: tuple[TensorSpec, ...], layers: Any) -> tuple[TensorSpec, ...]:
    return tuple(dataclasses.replace(s, layers=layers) for s in specs)


#: the gated attention's tensors (attention blocks), llama.cpp's order
ATTN_TENSORS = _only((
    TensorSpec("blk.{i}.attn_q.weight", lambda c: (2 * c.n_embd_q, c.n_embd), BLOCK,
               parts=(("attn_q", lambda c: c.head_dim), ("attn_q_gate", lambda c: c.head_dim)),
               groups=lambda c: c.n_head),
    matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd_q)),
    *QK_NORM[::-1],
), _attn)

#: the linear attention's tensors (recurrent blocks), llama.cpp's order
LINEAR_TENSORS = _only((
    TensorSpec("blk.{i}.attn_qkv.weight", lambda c: (2 * key_dim(c) + value_dim(c), c.n_embd), BLOCK,
               parts=(("gdn_q", key_dim), ("gdn_k", key_dim), ("gdn_v", value_dim))),
    matrix("blk.{i}.attn_gate.weight", lambda c: (value_dim(c), c.n_embd)),
    # the kernel: one row of d_conv taps per channel (GGUF ne = (d_conv, conv_dim)), uploaded as f32 in
    # the three channel ranges
    TensorSpec("blk.{i}.ssm_conv1d.weight", lambda c: (2 * key_dim(c) + value_dim(c), c.n_conv), BLOCK,
               kind="norm", parts=(("conv_q", key_dim), ("conv_k", key_dim), ("conv_v", value_dim))),
    TensorSpec("blk.{i}.ssm_dt.bias", lambda c: (c.ssm_dt_rank,), BLOCK, kind="bias"),
    norm("blk.{i}.ssm_a", lambda c: (c.ssm_dt_rank,)),
    matrix("blk.{i}.ssm_beta.weight", lambda c: (c.ssm_dt_rank, c.n_embd)),
    matrix("blk.{i}.ssm_alpha.weight", lambda c: (c.ssm_dt_rank, c.n_embd)),
    norm("blk.{i}.ssm_norm.weight", lambda c: (c.ssm_d_state,)),
    matrix("blk.{i}.ssm_out.weight", lambda c: (c.n_embd, value_dim(c))),
), _recr)

def _tensors(ffn: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    return (TOKEN_EMBD, OUTPUT_NORM, OUTPUT,
            norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
            norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,), ffn=True),
            *ATTN_TENSORS, *LINEAR_TENSORS,
            *(dataclasses.replace(s, ffn=True) for s in ffn))


#: llama.cpp ``llama_model_qwen35::load_arch_tensors`` (the trunk), in file order
TENSORS = _tensors(FFN)
#: llama.cpp ``llama_model_qwen35moe::load_arch_tensors``: the experts and the shared expert in place of the FFN
MOE_TENSORS = _tensors(moe_ffn(shared=True))


def _text_pairs_rotate(sections: tuple[int, ...], n_rot: int) -> bool:
    """True when IMROPE with a text token's positions ``(p, p, p, 0)`` rotates every one of the
    ``n_rot / 2`` pairs by ``p`` (none falls to the fourth section; ggml ``ggml_mrope_cache_init``)."""
    s0, s1, s2, s3 = sections
    total = s0 + s1 + s2 + s3
    if total <= 0:
        return False
    for pair in range(n_rot // 2):
        sector = pair % total
        if not ((sector % 3 == 1 and sector < 3 * s1) or (sector % 3 == 2 and sector < 3 * s2)
                or (sector % 3 == 0 and sector < 3 * s0)):
            return False
    return True


def recurrent_pattern(m: Metadata, n_layer: int, n_all: int | None = None) -> tuple[bool, ...]:
    """Per trunk block, True when it is a linear-attention block: ``attention.recurrent_layers`` when
    the file has it, else not every ``full_attention_interval``-th (default 4; llama.cpp
    ``load_arch_hparams``). ``n_all``: the file's blocks with the MTP ones (default ``n_layer``); the
    array may cover the trunk or every block.

    Raises:
        UnsupportedModelError: an array of another length, an interval < 1, or no attention block.
    """
    raw = m.get("attention.recurrent_layers")
    if raw is not None:
        vals = [bool(v) for v in raw] if isinstance(raw, (list, tuple, np.ndarray)) else None
        if vals is None or len(vals) not in (n_layer, n_all or n_layer):
            raise UnsupportedModelError(f"{m.path}: {m.key('attention.recurrent_layers')} must hold one entry per "
                                        f"block ({n_layer})")
        out = tuple(vals[:n_layer])
    else:
        every = int(m.num("full_attention_interval", int, 4, minimum=1))
        out = tuple((i + 1) % every != 0 for i in range(n_layer))
    if all(out):
        raise UnsupportedModelError(f"{m.path}: no full-attention block among the {n_layer} blocks")
    return out


def hparams(m: Metadata) -> dict[str, Any]:
    """llama.cpp ``llama_model_qwen35::load_arch_hparams``: the RMS epsilon, ``rope.dimension_sections``
    (4 values), the gated delta-net's ``ssm.conv_kernel``, ``ssm.inner_size``, ``ssm.state_size``,
    ``ssm.time_step_rank``, ``ssm.group_count`` (all required), the recurrent blocks
    (:func:`recurrent_pattern`) and ``nextn_predict_layers`` (the MTP blocks after the trunk, skipped).

    Raises:
        UnsupportedModelError: a key missing or out of range, inconsistent head counts or widths, or
            sections that leave text dimensions unrotated (module doc).
    """
    n_all = int(m.num("block_count", required=True, minimum=1))
    nextn = int(m.num("nextn_predict_layers", int, 0, minimum=0))
    if nextn >= n_all:
        raise UnsupportedModelError(f"{m.path}: {m.key('nextn_predict_layers')} = {nextn} leaves no trunk "
                                    f"block of {n_all}")
    n_layer = n_all - nextn
    secs = m.get("rope.dimension_sections")
    if (not isinstance(secs, (list, tuple, np.ndarray)) or not 3 <= len(secs) <= 4
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in secs)):
        raise UnsupportedModelError(f"{m.path}: missing or malformed {m.key('rope.dimension_sections')} "
                                    "(3 or 4 integers: the multi-section rope's sections)")
    sections = tuple(int(v) for v in secs) + (0,) * (4 - len(secs))
    if m.has("rope.dimension_count") and int(m.num("rope.dimension_count", int, 0, minimum=0)) == 0:
        raise UnsupportedModelError(f"{m.path}: {m.key('rope.dimension_count')} = 0: the gated attention "
                                    "rotates its heads (multi-section rope); cooktop needs an even count > 0")
    n_rot = int(m.num("rope.dimension_count", int, 0, minimum=0)) or int(
        m.num("attention.key_length", int, 0, minimum=0))
    if any(v < 0 for v in sections) or not _text_pairs_rotate(sections, n_rot):
        raise UnsupportedModelError(f"{m.path}: rope sections {list(sections)} leave some of the {n_rot // 2} "
                                    "rotary pairs of a text token unrotated (the fourth section); cooktop runs "
                                    "multi-section rope only where every text pair rotates")
    out: dict[str, Any] = {
        "rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0)),
        "n_conv": int(m.num("ssm.conv_kernel", int, required=True, minimum=2)),
        "ssm_d_inner": int(m.num("ssm.inner_size", int, required=True, minimum=1)),
        "ssm_d_state": int(m.num("ssm.state_size", int, required=True, minimum=1)),
        "ssm_dt_rank": int(m.num("ssm.time_step_rank", int, required=True, minimum=1)),
        "ssm_n_group": int(m.num("ssm.group_count", int, required=True, minimum=1)),
        "rope_sections": sections,
        "recurrent_layers": recurrent_pattern(m, n_layer, n_all),
        "n_layer": n_layer,
        "n_layer_nextn": nextn,
    }
    h_k, h_v, d = out["ssm_n_group"], out["ssm_dt_rank"], out["ssm_d_state"]
    if h_v % h_k or out["ssm_d_inner"] != h_v * d:
        raise UnsupportedModelError(f"{m.path}: gated delta-net heads inconsistent: {h_v} value heads "
                                    f"({m.key('ssm.time_step_rank')}) must be a multiple of {h_k} key heads "
                                    f"({m.key('ssm.group_count')}) and {m.key('ssm.inner_size')} = "
                                    f"{out['ssm_d_inner']} must be {h_v} x {d} ({m.key('ssm.state_size')})")
    return out


def moe_hparams(m: Metadata) -> dict[str, Any]:
    """qwen35moe: :func:`hparams` and the MoE keys (``moe.hparams``: softmax router, top-k weights
    renormalised; llama.cpp ``build_moe_ffn(..., LLM_FFN_SILU, true, ...)``)."""
    return {**hparams(m), **moe.hparams(m, "softmax", norm=True)}


def state_widths(cfg: ModelConfig, il: int) -> tuple[int, ...]:
    """Block ``il``'s state tensors, floats per sequence: the three convolutions' last ``n_conv - 1``
    inputs (q, k, v channel ranges; llama.cpp ``n_embd_r()`` together) and the delta rule's
    ``H_v * d * d`` (``n_embd_s()``); () for an attention block."""
    if not cfg.is_recurrent(il):
        return ()
    r = cfg.n_conv - 1
    return (r * key_dim(cfg), r * key_dim(cfg), r * value_dim(cfg), cfg.ssm_dt_rank * cfg.ssm_d_state ** 2)


def _linear_scratch(cfg: ModelConfig) -> dict[str, int]:
    K, V, H = key_dim(cfg), value_dim(cfg), cfg.ssm_dt_rank
    return {"qg": cfg.n_embd_q, "lq": K, "lk": K, "cq": K, "ck": K, "lv": V, "cv": V, "z": V, "lo": V,
            "la": H, "lb": H, "lg": H, "lbeta": H}


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """The builders' buffers, the gate of the attention (``qg`` [n_embd_q]) and the linear attention's:
    ``lq``, ``lk``, ``cq``, ``ck`` [H_k d]; ``lv``, ``cv``, ``z``, ``lo`` [H_v d]; ``la``, ``lb``,
    ``lg``, ``lbeta`` [H_v] (f32 [n_batch, width] each)."""
    return {**builders.scratch(cfg), **_linear_scratch(cfg)}


def moe_scratch(cfg: ModelConfig) -> dict[str, int]:
    """qwen35moe: :func:`scratch`'s own buffers and a MoE block's with its shared expert
    (``builders.moe_shared_scratch``)."""
    return {**moe_shared_scratch(cfg), **_linear_scratch(cfg)}


def linear_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV,
                interleaved: bool = False) -> DeviceTensor:
    """The Gated DeltaNet operator on the normed rows ``s.xn`` (module doc); returns ``s.o`` f32
    [n, n_embd]. ``kv.state`` (:func:`state_widths`' four tensors, f32 [n_seq, width]) is read and
    updated at the rows' sequences ``kv.slots``. ``interleaved``: value head ``h`` reads key head
    ``h // (H_v / H_k)`` (qwen3next, llama.cpp src/models/qwen3next.cpp) instead of ``h mod H_k``
    (``Device.gated_delta_net``)."""
    st, slots = kv.state, kv.slots
    assert st is not None and slots is not None  # a recurrent block always gets its state
    d.matmuls(s.xn, (s.lq, w["gdn_q"]), (s.lk, w["gdn_k"]), (s.lv, w["gdn_v"]), (s.z, w["attn_gate"]),
              (s.lb, w["ssm_beta"]), (s.la, w["ssm_alpha"]))
    d.gdn_gate(s.lg, s.lbeta, s.la, s.lb, w["ssm_dt.bias"], w["ssm_a"])
    for out, x, state, kernel in ((s.cq, s.lq, st[0], "conv_q"), (s.ck, s.lk, st[1], "conv_k"),
                                  (s.cv, s.lv, st[2], "conv_v")):
        d.ssm_conv(out, x, state, w[kernel], slots)
        d.silu(out, out)
    d.l2_norm(s.cq, s.cq, cfg.ssm_d_state, cfg.rms_eps)
    d.l2_norm(s.ck, s.ck, cfg.ssm_d_state, cfg.rms_eps)
    d.gated_delta_net(s.lo, s.cq, s.ck, s.cv, s.lg, s.lbeta, st[3], slots, interleaved=interleaved)
    build_norm(d, cfg, s.lo, s.lo, w["ssm_norm"])  # per head (ssm_norm is d wide)
    d.silu_mul(s.lo, s.z, s.lo)
    d.matmul(s.o, s.lo, w["ssm_out"])
    return s.o


def gated_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> DeviceTensor:
    """The gated full attention on ``s.xn`` (module doc); returns ``s.o`` f32 [n, n_embd]."""
    d.matmuls(s.xn, (s.q, w["attn_q"]), (s.qg, w["attn_q_gate"]), (s.k, w["attn_k"]), (s.v, w["attn_v"]))
    build_norm(d, cfg, s.q, s.q, w["attn_q_norm"])
    build_norm(d, cfg, s.k, s.k, w["attn_k_norm"])
    build_attn_core(d, cfg, w, s, kv, il)
    d.sigmoid_mul(s.att, s.att, s.qg)
    d.matmul(s.o, s.att, w["attn_output"])
    return s.o


def block_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """The first half of block ``il`` on the rows of ``s.x`` (f32 [n, n_embd], updated in place):
    ``x += operator(rmsnorm(x) * attn_norm)``, the operator linear or gated attention."""
    build_norm(d, cfg, s.xn, s.x, w["attn_norm"])
    if cfg.is_recurrent(il):
        d.add(s.x, s.x, linear_attn(d, cfg, w, s, kv))
    else:
        d.add(s.x, s.x, gated_attn(d, cfg, w, s, kv, il))


def block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, il: int) -> None:
    """The feed-forward half: ``x += ffn(rmsnorm(x) * post_attention_norm)``, the SwiGLU FFN (qwen35)
    or the experts and the shared expert (qwen35moe: the block holds ``ffn_gate_inp``)."""
    build_norm(d, cfg, s.xn, s.x, w["post_attention_norm"])
    if "ffn_gate_inp" in w:
        d.add(s.x, s.x, build_moe_ffn(d, cfg, w, s, SILU))
    else:
        d.add(s.x, s.x, build_ffn(d, cfg, w, s, SILU))


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` on the ``n`` rows of ``s.x`` (f32 [n, n_embd], updated in place): :func:`block_attn`
    then :func:`block_ffn`."""
    block_attn(d, cfg, w, s, kv, il)
    block_ffn(d, cfg, w, s, il)


QWEN35 = Architecture(name="qwen35", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, block=block,
                      scratch=scratch, state_widths=state_widths)
QWEN35MOE = Architecture(name="qwen35moe", tensors=MOE_TENSORS, rope_mode=ROPE_NEOX, hparams=moe_hparams,
                         block=block, block_attn=block_attn, block_ffn=block_ffn, scratch=moe_scratch,
                         scratch_i32=moe_scratch_i32, state_widths=state_widths)
