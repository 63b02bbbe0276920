"""The mistral3 architecture (``general.architecture = mistral3``): the text model of Mistral Small
3.1 / 3.2, Ministral 3 and Devstral Small 2 (dense).

Sources: llama.cpp src/models/mistral3.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph), src/llama-graph.cpp (``llm_graph_input_attn_temp::set_input``: the attention temperature),
src/llama-context.cpp (YaRN's ``yarn_attn_factor`` with ``rope_yarn_log_mul``),
src/llama-model.cpp (``create_tensor_qkv``; the rope type, ``LLAMA_ROPE_TYPE_NORM``),
conversion/mistral3.py (``Ministral3Model``: llama's converter plus YaRN's ``mscale_all_dim`` and
``llama_4_scaling_beta``).

Block: llama's (``llama.block``), with the temperature step when the file has one (:func:`block`)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T [+ bq], xn @ Wk^T [+ bk], xn @ Wv^T [+ bv]
    rope(q), rope(k)    normal rope, YaRN when the file says so, [rope_freqs factors]
    [q *= 1 + beta * ln(1 + floor(pos / n_ctx_orig))]     attention temperature (Llama-4 style)
    cache[pos] = k, v ; x += attention(q, cache, scale 1/sqrt(head_dim)) @ Wo^T [+ bo]
    xn = rmsnorm(x) * ffn_norm
    x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T

Hyper-parameters beyond llama's: ``attention.temperature_scale`` (beta; 0 or absent: none),
``rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow`` (YaRN's ramp) and
``rope.scaling.yarn_log_multiplier`` (``mscale_all_dim``: YaRN's attention factor becomes
``mscale(f, 1) / mscale(f, log_mul)`` before ggml's ``1 + 0.1 ln f`` is cancelled, llama-context.cpp).
head_dim is ``attention.key_length`` (Mistral Small: 128 with n_embd 5120 and 32 heads).

The attention temperature (``attention.temperature_scale`` = beta, Ministral 3 / Devstral Small 2's
``llama_4_scaling_beta``): after rope each query row at position p is multiplied by
``1 + beta * ln(1 + floor(p / n_ctx_orig))`` (``rope.scaling.original_context_length``; 1 below it).
The factors are computed on the host from the rows' positions (:func:`row_inputs`, as llama.cpp fills
its ``inp_attn_scale`` input) into the ``qtemp`` scratch buffer, and op ``mul`` applies them.

Not implemented (refused by ``load_config``): the MoE branch (``expert_count`` > 0), the
feed-forward biases, a fused ``attn_qkv`` and LongRoPE factors.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...backends.base import ROPE_NORMAL, Device, DeviceTensor
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig, rope_scaling
from . import builders, llama
from .base import KV, Weights, bias, rms_eps_hparams
from .builders import SILU, build_ffn, build_norm, build_qkv, rope_args, rope_factors
from .descriptor import Architecture
from .skeleton import ROPE_FREQS, llama_tensors


def _mscale(factor: float, mscale: float) -> float:
    """YaRN's magnitude factor (llama.cpp ``get_mscale`` in llama-context.cpp): 1 for ``factor`` <= 1,
    else ``0.1 * mscale * ln(factor) + 1``."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def hparams(m: Metadata) -> dict[str, Any]:
    """The mistral3 keys (llama.cpp ``llama_model_mistral3::load_arch_hparams``, module doc).

    Returns ``rms_eps``, ``attn_temp_scale``, ``rope_yarn_beta_fast`` / ``rope_yarn_beta_slow`` (when
    the file has them) and, with YaRN and ``rope.scaling.yarn_log_multiplier``, ``rope_attn_factor``.

    Raises:
        UnsupportedModelError: the RMS epsilon missing, ``expert_count`` > 0 (the MoE branch),
            ``rope.dimension_count`` other than head_dim (llama.cpp asserts ``n_rot == n_embd_head``),
            or a non-numeric key.
    """
    out = rms_eps_hparams(m)
    n_expert = m.num("expert_count", int, 0, minimum=0)
    if n_expert:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_count')} = {n_expert}: mistral3's mixture-of-"
                                    "experts branch is not implemented by cooktop")
    n_embd = m.num("embedding_length", required=True, minimum=1)
    n_head = m.num("attention.head_count", required=True, minimum=1)
    head_dim = m.num("attention.key_length", default=n_embd // n_head, minimum=1)
    n_rot = m.num("rope.dimension_count", default=head_dim, minimum=0)
    if n_rot != head_dim:
        raise UnsupportedModelError(f"{m.path}: {m.key('rope.dimension_count')} = {n_rot} differs from head_dim "
                                    f"{head_dim} (llama.cpp's mistral3 graph rotates whole heads)")
    out["attn_temp_scale"] = float(m.num("attention.temperature_scale", float, 0.0))
    for key, field in (("rope.scaling.yarn_beta_fast", "rope_yarn_beta_fast"),
                       ("rope.scaling.yarn_beta_slow", "rope_yarn_beta_slow")):
        if m.has(key):
            out[field] = float(m.num(key, float))
    log_mul = float(m.num("rope.scaling.yarn_log_multiplier", float, 0.0))
    rope = rope_scaling(m, int(m.num("context_length", required=True, minimum=1)))
    if log_mul and rope["rope_ext_factor"]:
        f = 1.0 / rope["rope_freq_scale"]
        out["rope_attn_factor"] = (_mscale(f, 1.0) / _mscale(f, log_mul) / (1.0 + 0.1 * math.log(f))
                                   * float(m.num("rope.scaling.attn_factor", float, 1.0)))
    return out


#: llama.cpp ``llama_model_mistral3::load_arch_tensors`` (dense): llama's with the optional Q/K/V
#: biases, an optional attention output bias and Llama 3.1's optional rope frequency factors.
TENSORS = llama_tensors(shared=(ROPE_FREQS,), qkv_bias=True,
                        attn=(bias("blk.{i}.attn_output.bias", lambda c: (c.n_embd,), required=False),))



def attn_temperature(cfg: ModelConfig, pos: np.ndarray) -> np.ndarray:
    """The query factor of each row, f32 [n], for positions ``pos`` (int [n]): ``1 + beta * ln(1 +
    floor(p / n_ctx_orig))`` with beta ``cfg.attn_temp_scale`` and ``n_ctx_orig`` = ``cfg.n_ctx_orig_yarn``
    (llama.cpp ``llm_graph_input_attn_temp::set_input``, offset 0: the floor in float32, the log in
    double, stored as float32)."""
    floor = np.floor(np.asarray(pos, np.float32) / np.float32(cfg.n_ctx_orig_yarn or cfg.n_ctx_train))
    return (np.log(floor.astype(np.float64) + 1.0) * np.float64(np.float32(cfg.attn_temp_scale)) + 1.0
            ).astype(np.float32)


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """The builders' buffers, and with an attention temperature ``qtemp`` [n_embd_q] (each row's query
    factor, repeated across the row: op ``mul`` multiplies elementwise)."""
    out = builders.scratch(cfg)
    return {**out, "qtemp": cfg.n_embd_q} if cfg.attn_temp_scale else out


def row_inputs(cfg: ModelConfig, pos: np.ndarray) -> dict[str, np.ndarray]:
    """``{"qtemp": f32 [n, n_embd_q]}``: :func:`attn_temperature` of the rows' positions, repeated across
    each row; {} without an attention temperature (``Architecture.row_inputs``)."""
    if not cfg.attn_temp_scale:
        return {}
    return {"qtemp": np.repeat(attn_temperature(cfg, pos)[:, None], cfg.n_embd_q, axis=1)}


def temp_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> DeviceTensor:
    """Self-attention on the normed rows ``s.xn`` f32 [n, n_embd] with the attention temperature: Q, K, V
    [+ biases], rope of q (and of k in its store), ``q *= s.qtemp`` (written by :func:`row_inputs`),
    attention with scale ``1/sqrt(head_dim)``; returns ``s.o = a @ Wo^T [+ bo]`` f32 [n, n_embd]
    (llama.cpp mistral3.cpp with ``inp_attn_scale``)."""
    q = s.q
    build_qkv(d, w, s.xn, q, s.k, s.v)
    rope, ff = rope_args(cfg, il), rope_factors(cfg, w, kv.n_ctx)
    d.rope(q, q, kv.pos, **rope, freq_factors=ff)
    d.mul(q, q, s.qtemp)
    kv.attend(d, s.att, q, s.k, s.v, cfg.n_head, cfg.n_head_kv, 1.0 / math.sqrt(cfg.head_dim),
              k_rope={**rope, "freq_factors": ff})
    d.matmul(s.o, s.att, w["attn_output"])
    if "attn_output.bias" in w:
        d.add_bias(s.o, s.o, w["attn_output.bias"])
    return s.o


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` of mistral3 (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place):
    ``llama.block``, or with an attention temperature (``cfg.attn_temp_scale``) :func:`temp_attn` in
    place of its attention.

    Args:
        w: this block's weights (keys as in :data:`TENSORS`).
        s: scratch buffers of :func:`scratch` cut to ``n`` rows (``qtemp`` filled by :func:`row_inputs`).
        kv: positions and this block's cache (:class:`~.base.KV`); cells ``kv.cells`` are written.
        il: the block's index in the model.
    """
    if not cfg.attn_temp_scale:
        llama.block(d, cfg, w, s, kv, il)
        return
    x = s.x
    build_norm(d, cfg, s.xn, x, w["attn_norm"])
    d.add(x, x, temp_attn(d, cfg, w, s, kv, il))
    build_norm(d, cfg, s.xn, x, w["ffn_norm"])
    d.add(x, x, build_ffn(d, cfg, w, s, SILU))


MISTRAL3 = Architecture(name="mistral3", tensors=TENSORS, rope_mode=ROPE_NORMAL, hparams=hparams, block=block,
                        scratch=scratch, row_inputs=row_inputs)
