"""The qwen3next architecture (``general.architecture = qwen3next``): Qwen3-Next-80B-A3B, a hybrid of
Gated DeltaNet (linear attention) blocks and gated full-attention blocks, every block's feed-forward a
mixture of experts with a sigmoid-gated shared expert.

Sources: llama.cpp src/models/qwen3next.cpp (``load_arch_hparams``, ``load_arch_tensors``, the graph:
``build_layer_attn``, ``build_qkvz``, ``build_layer_attn_linear``, ``build_norm_gated``,
``build_layer_ffn``), src/models/delta-net-base.cpp (``build_conv_state``, ``build_recurrent_attn``),
src/llama-arch.cpp (tensor names), src/llama-model.cpp (rope type NEOX), gguf-py/gguf/constants.py and
conversion/qwen.py (``Qwen3NextModel``: the converter's tensor layouts).

The block is qwen35moe's (``qwen35.py``: the same norms, gated attention, gdn gates, convolution,
L2 norms, delta rule, gated output norm and MoE feed-forward with the shared expert), with three
differences, each checked against qwen3next.cpp:

* The rope is plain NeoX rope on ``rope.dimension_count`` dims (``LLAMA_ROPE_TYPE_NEOX``; no
  ``rope.dimension_sections``).
* Value head ``h`` reads key head ``h // (H_v / H_k)``: llama.cpp reshapes q and k to
  ``[d, 1, H_k]`` and ``ggml_repeat_4d`` repeats them to ``[d, H_v / H_k, H_k]`` (a repeat-interleave)
  before ``ggml_gated_delta_net``, where qwen35 tiles them (``h mod H_k``). cooktop passes
  ``interleaved=True`` to ``Device.gated_delta_net`` instead of materialising the repeat.
* The projections come in one of two layouts. The converter's current one (conversion/qwen.py
  splits HF's ``in_proj_qkvz``): ``attn_qkv`` [2 H_k d + H_v d, n_embd] (all q heads, all k heads,
  all v heads) and ``attn_gate`` (z) [H_v d, n_embd], as qwen35's. The legacy one: ``ssm_in``
  [2 H_k d + 2 H_v d, n_embd] holding, per key head ``g``, its q rows (d), k rows (d), then the v rows
  and the z rows of its ``r = H_v / H_k`` value heads ``g r .. g r + r - 1`` (r d each); llama.cpp
  views it as ``[2 d + 2 r d, H_k]`` and concatenates the q, k, v views (``build_qkvz``). Here it is
  uploaded per part (``TensorSpec.groups`` = H_k), giving the same ``gdn_q``, ``gdn_k``, ``gdn_v``,
  ``attn_gate`` as the current layout. Either way ``ssm_ba`` (llama.cpp ``LLM_TENSOR_SSM_BETA_ALPHA``)
  [2 H_v, n_embd] holds, per key head, the ``r`` beta rows then the ``r`` alpha rows of its value
  heads (the ``[2 r, H_k]`` view of ``build_layer_attn_linear``), uploaded as ``ssm_beta`` and
  ``ssm_alpha``. A file has one layout; one that holds both is refused (llama.cpp would use
  ``attn_qkv``).

In llama.cpp the convolution and the delta rule see the channels in the order
``q (H_k d), k (H_k d), v (H_v d)`` with v head-major in value-head order, which is the order of
``ssm_conv1d``'s rows and of the parts above, so qwen35's three channel ranges carry over unchanged.

The feed-forward: llama.cpp ``build_moe_ffn(..., LLM_FFN_SILU, true, expert_weights_scale,
SOFTMAX)``: a softmax router over ``ffn_gate_inp``, the top-k weights renormalised, no scale
(``expert_weights_scale`` is not read for qwen3next: 0); plus the shared expert
``sigmoid(xn . ffn_gate_inp_shexp) * ffn_shexp(xn)`` (``builders.build_moe_ffn``). The file must
have experts (llama.cpp refuses ``expert_count = 0``).

Not implemented, as for qwen35: the multi-token-prediction block after the trunk
(``nextn_predict_layers``): its tensors are skipped and the trunk runs as llama.cpp's main pass does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NEOX, Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from . import moe, qwen35
from .base import BLOCK, KV, TensorSpec, Weights, matrix, norm
from .builders import build_norm, moe_scratch_i32
from .descriptor import Architecture
from .qwen35 import block_ffn, gated_attn, key_dim, linear_attn, value_dim
from .skeleton import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, moe_ffn


def head_ratio(c: ModelConfig) -> int:
    """``r = H_v / H_k``: the value heads sharing one key head (``ssm.time_step_rank / ssm.group_count``)."""
    return c.ssm_dt_rank // c.ssm_n_group


def _group_v(c: ModelConfig) -> int:
    """One key head's value (or z) rows in the legacy ``ssm_in``: ``r * d``."""
    return head_ratio(c) * c.ssm_d_state


#: the linear attention's tensors (recurrent blocks), llama.cpp's order; ``ssm_in`` (legacy) or
#: ``attn_qkv`` + ``attn_gate`` (the current converter's), module doc
LINEAR_TENSORS = qwen35._only((
    TensorSpec("blk.{i}.ssm_in.weight", lambda c: (2 * key_dim(c) + 2 * value_dim(c), c.n_embd), BLOCK,
               required=False, layout="ssm_in",
               parts=(("gdn_q", lambda c: c.ssm_d_state), ("gdn_k", lambda c: c.ssm_d_state),
                      ("gdn_v", _group_v), ("attn_gate", _group_v)),
               groups=lambda c: c.ssm_n_group),
    TensorSpec("blk.{i}.attn_qkv.weight", lambda c: (2 * key_dim(c) + value_dim(c), c.n_embd), BLOCK,
               required=False, layout="attn_qkv",
               parts=(("gdn_q", key_dim), ("gdn_k", key_dim), ("gdn_v", value_dim))),
    matrix("blk.{i}.attn_gate.weight", lambda c: (value_dim(c), c.n_embd), required=False, layout="attn_qkv"),
    # the kernel: one row of d_conv taps per channel (GGUF ne = (d_conv, conv_dim)), uploaded as f32 in
    # the three channel ranges
    TensorSpec("blk.{i}.ssm_conv1d.weight", lambda c: (2 * key_dim(c) + value_dim(c), c.n_conv), BLOCK,
               kind="norm", parts=(("conv_q", key_dim), ("conv_k", key_dim), ("conv_v", value_dim))),
    TensorSpec("blk.{i}.ssm_dt.bias", lambda c: (c.ssm_dt_rank,), BLOCK, kind="bias"),
    norm("blk.{i}.ssm_a", lambda c: (c.ssm_dt_rank,)),
    TensorSpec("blk.{i}.ssm_ba.weight", lambda c: (2 * c.ssm_dt_rank, c.n_embd), BLOCK,
               parts=(("ssm_beta", head_ratio), ("ssm_alpha", head_ratio)), groups=lambda c: c.ssm_n_group),
    norm("blk.{i}.ssm_norm.weight", lambda c: (c.ssm_d_state,)),
    matrix("blk.{i}.ssm_out.weight", lambda c: (c.n_embd, value_dim(c))),
), qwen35._recr)

#: llama.cpp ``llama_model_qwen3next::load_arch_tensors`` (the trunk), in file order
TENSORS = (TOKEN_EMBD, OUTPUT_NORM, OUTPUT,
           norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
           norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,), ffn=True),
           *qwen35.ATTN_TENSORS, *LINEAR_TENSORS,
           *(dataclasses.replace(s, ffn=True) for s in moe_ffn(shared=True)))


def hparams(m: Metadata) -> dict[str, Any]:
    """llama.cpp ``llama_model_qwen3next::load_arch_hparams``: the RMS epsilon, the gated delta-net's
    ``ssm.conv_kernel``, ``ssm.inner_size``, ``ssm.state_size``, ``ssm.time_step_rank``,
    ``ssm.group_count`` (all required), the recurrent blocks (``qwen35.recurrent_pattern``:
    ``attention.recurrent_layers``, else every ``full_attention_interval``-th block attends),
    ``nextn_predict_layers`` (the MTP blocks after the trunk, skipped) and the MoE keys
    (``moe.hparams``: softmax router, top-k weights renormalised).

    Raises:
        UnsupportedModelError: a key missing or out of range, no experts, value heads that are not a
            multiple of the key heads, or ``ssm.inner_size`` other than value heads x ``ssm.state_size``.
    """
    n_all = int(m.num("block_count", required=True, minimum=1))
    nextn = int(m.num("nextn_predict_layers", int, 0, minimum=0))
    if nextn >= n_all:
        raise UnsupportedModelError(f"{m.path}: {m.key('nextn_predict_layers')} = {nextn} leaves no trunk "
                                    f"block of {n_all}")
    n_layer = n_all - nextn
    if m.has("rope.dimension_count") and int(m.num("rope.dimension_count", int, 0, minimum=0)) == 0:
        raise UnsupportedModelError(f"{m.path}: {m.key('rope.dimension_count')} = 0: the gated attention "
                                    "rotates its heads (NeoX rope); cooktop needs an even count > 0")
    out: dict[str, Any] = {
        "rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0)),
        "n_conv": int(m.num("ssm.conv_kernel", int, required=True, minimum=2)),
        "ssm_d_inner": int(m.num("ssm.inner_size", int, required=True, minimum=1)),
        "ssm_d_state": int(m.num("ssm.state_size", int, required=True, minimum=1)),
        "ssm_dt_rank": int(m.num("ssm.time_step_rank", int, required=True, minimum=1)),
        "ssm_n_group": int(m.num("ssm.group_count", int, required=True, minimum=1)),
        "recurrent_layers": qwen35.recurrent_pattern(m, n_layer, n_all),
        "n_layer": n_layer,
        "n_layer_nextn": nextn,
    }
    h_k, h_v, d = out["ssm_n_group"], out["ssm_dt_rank"], out["ssm_d_state"]
    if h_v % h_k or out["ssm_d_inner"] != h_v * d:
        raise UnsupportedModelError(f"{m.path}: gated delta-net heads inconsistent: {h_v} value heads "
                                    f"({m.key('ssm.time_step_rank')}) must be a multiple of {h_k} key heads "
                                    f"({m.key('ssm.group_count')}) and {m.key('ssm.inner_size')} = "
                                    f"{out['ssm_d_inner']} must be {h_v} x {d} ({m.key('ssm.state_size')})")
    if int(m.num("expert_count", int, 0, minimum=0)) == 0:
        raise UnsupportedModelError(f"{m.path}: qwen3next needs experts ({m.key('expert_count')} > 0; "
                                    "llama.cpp refuses a model with zero experts)")
    return {**out, **moe.hparams(m, "softmax", norm=True)}


def check_layout(present: Container[str], cfg: ModelConfig, path: str = "") -> None:
    """Check that each linear-attention block of a model of ``cfg`` with the tensors ``present`` has
    exactly one projection layout (module doc): ``ssm_in``, or ``attn_qkv`` with ``attn_gate``.

    Raises:
        UnsupportedModelError: a block with neither, with both, or with only one of ``attn_qkv`` /
            ``attn_gate``.
    """
    where = f"{path}: " if path else ""
    for il in range(cfg.n_layer):
        if not cfg.is_recurrent(il):
            continue
        have = {k for k in ("ssm_in", "attn_qkv", "attn_gate") if f"blk.{il}.{k}.weight" in present}
        if have not in ({"ssm_in"}, {"attn_qkv", "attn_gate"}):
            raise UnsupportedModelError(
                f"{where}qwen3next block {il} has projections {sorted(have) or 'none'}: cooktop needs "
                "either blk.N.ssm_in.weight (legacy) or blk.N.attn_qkv.weight with blk.N.attn_gate.weight")


def block_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """The first half of block ``il`` on the rows of ``s.x`` (f32 [n, n_embd], updated in place):
    ``x += operator(rmsnorm(x) * attn_norm)``, the operator the linear attention with repeat-interleaved
    key heads (``qwen35.linear_attn(..., interleaved=True)``) or the gated attention
    (``qwen35.gated_attn``; NeoX rope by the architecture's rope mode)."""
    build_norm(d, cfg, s.xn, s.x, w["attn_norm"])
    if cfg.is_recurrent(il):
        d.add(s.x, s.x, linear_attn(d, cfg, w, s, kv, interleaved=True))
    else:
        d.add(s.x, s.x, gated_attn(d, cfg, w, s, kv, il))


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` on the ``n`` rows of ``s.x`` (f32 [n, n_embd], updated in place): :func:`block_attn`
    then the MoE half (``qwen35.block_ffn``: experts and the sigmoid-gated shared expert)."""
    block_attn(d, cfg, w, s, kv, il)
    block_ffn(d, cfg, w, s, il)


QWEN3NEXT = Architecture(name="qwen3next", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, block=block,
                         block_attn=block_attn, block_ffn=block_ffn, scratch=qwen35.moe_scratch,
                         scratch_i32=moe_scratch_i32, state_widths=qwen35.state_widths,
                         check_tensors=check_layout)
