"""The gpt-oss architecture (``general.architecture = gpt-oss``): OpenAI's gpt-oss-20b and -120b.

Sources: llama.cpp src/models/openai-moe.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph), src/llama-graph.cpp ``build_moe_ffn`` (``LLM_FFN_SWIGLU_OAI_MOE``,
``LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT``) and ``build_attn`` (attention sinks),
src/llama-hparams.cpp ``set_swa_pattern`` (period 2: even blocks slide), ggml-cpu/ops.cpp
``swiglu_oai``.

Block ``il`` (``swa`` = ``cfg.swa_layers[il]``: every even block by default)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T + bq, xn @ Wk^T + bk, xn @ Wv^T + bv
    rope(q), rope(k)    NeoX, YaRN (rope.scaling.*); base rope.freq_base_swa on SWA blocks
    a = attention(q, cache, scale 1/sqrt(head_dim), window n_swa if swa, sinks = attn_sinks)
    x += a @ Wo^T + bo
    xn = rmsnorm(x) * post_attention_norm
    x += moe_ffn(xn)    router bias; top-k of the logits, softmax over the k; expert biases;
                        swiglu_oai (alpha 1.702, clamp 7); weights not renormalised

Head: ``(rmsnorm(x) * output_norm) @ output^T`` (output required, not tied).
Experts are MXFP4 in OpenAI's files (any type the device runs works).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NEOX, Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from . import moe
from .base import HEAD, INPUT, KV, Architecture, Weights, bias, matrix, norm
from .gemma3 import swa_pattern
from .llama import final_norm, lm_head

#: llama.cpp's default period of gpt-oss's sliding-window pattern (``load_swa_pattern(ml, 2)``).
SWA_PERIOD = 2


def hparams(m: Metadata) -> dict[str, Any]:
    """The gpt-oss keys (llama.cpp ``llama_model_openai_moe::load_arch_hparams``): rms epsilon,
    ``expert_feed_forward_length`` and ``attention.sliding_window`` (all required), the pattern
    (default period 2), ``rope.freq_base_swa`` (default the model's base), the MoE keys.

    Raises:
        UnsupportedModelError: a required key missing, a bad pattern (see ``moe.hparams`` too).
    """
    n_layer = m.num("block_count", required=True, minimum=1)
    out: dict[str, Any] = {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True,
                                                  minimum=0.0))}
    out.update(moe.hparams(m, "softmax_weight", norm=False, ff_exp_required=True))
    n_swa = m.num("attention.sliding_window", int, required=True, minimum=0)
    raw = m.get("attention.sliding_window_pattern", SWA_PERIOD)
    try:
        layers = swa_pattern(n_layer, raw)
    except (TypeError, ValueError) as e:
        key = m.key("attention.sliding_window_pattern")
        raise UnsupportedModelError(f"{m.path}: metadata key {key!r} {e}") from None
    base = float(m.num("rope.freq_base", float, 10000.0, minimum=1e-30))
    out.update(n_swa=n_swa, swa_layers=layers if n_swa > 0 else (),
               rope_freq_base_swa=float(m.num("rope.freq_base_swa", float, base, minimum=1e-30)))
    return out


#: llama.cpp ``llama_model_openai_moe::load_arch_tensors``, numpy order (Q width n_head * head_dim).
TENSORS = (
    matrix("token_embd.weight", lambda c: (c.n_vocab, c.n_embd), unit=INPUT),
    norm("output_norm.weight", lambda c: (c.n_embd,), unit=HEAD),
    matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD),
    norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.attn_q.weight", lambda c: (c.n_embd_q, c.n_embd)),
    matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    bias("blk.{i}.attn_q.bias", lambda c: (c.n_embd_q,), required=False),
    bias("blk.{i}.attn_k.bias", lambda c: (c.n_embd_kv,), required=False),
    bias("blk.{i}.attn_v.bias", lambda c: (c.n_embd_kv,), required=False),
    matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd_q)),
    bias("blk.{i}.attn_output.bias", lambda c: (c.n_embd,), required=True),
    norm("blk.{i}.attn_sinks.weight", lambda c: (c.n_head,)),
) + moe.tensors(biases=True)


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers of :func:`block`."""
    E, Q, K = cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv
    return {"x": E, "xn": E, "q": Q, "att": Q, "o": E, "k": K, "v": K, **moe.scratch(cfg)}


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> None:
    """One gpt-oss block (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place)."""
    block_attn(d, cfg, w, s, kv)
    block_ffn(d, cfg, w, s)


def block_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> None:
    """The attention half of :func:`block`: ``x += attention(rmsnorm(x)) @ Wo^T + bo``."""
    x, xn, q, k, v, att, o = s.x, s.xn, s.q, s.k, s.v, s.att, s.o
    swa = bool(cfg.swa_layers) and cfg.swa_layers[s.il]
    rope = cfg.rope_params()
    if swa:
        rope["freq_base"] = cfg.rope_freq_base_swa
    d.rmsnorm(xn, x, w["attn_norm"], cfg.rms_eps)
    for y, name in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")):
        d.matmul(y, xn, w[name])
        if name + ".bias" in w:
            d.add_bias(y, y, w[name + ".bias"])
    d.rope(q, q, kv.pos, **rope)
    d.rope(k, k, kv.pos, **rope)
    d.kv_store(kv.k, k, kv.cells)
    d.kv_store(kv.v, v, kv.cells)
    d.attention_sinks(att, q, kv.k, kv.v, kv.cells, w["attn_sinks"], cfg.n_head, cfg.n_head_kv,
                      1.0 / math.sqrt(cfg.head_dim), cfg.n_swa if swa else 0, kv_start=kv.kv_start)
    d.matmul(o, att, w["attn_output"])
    d.add_bias(o, o, w["attn_output.bias"])
    d.add(x, x, o)


def block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace) -> None:
    """The MoE half of :func:`block`: ``x += moe.ffn(rmsnorm(x) * post_attention_norm)``."""
    d.rmsnorm(s.xn, s.x, w["post_attention_norm"], cfg.rms_eps)
    moe.ffn(d, cfg, w, s, act="swiglu_oai")
    d.add(s.x, s.x, s.o)


GPT_OSS = Architecture(name="gpt-oss", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, scratch=scratch,
                       block=block, final_norm=final_norm, lm_head=lm_head,
                       block_ops=("rmsnorm", "rope", "kv_store", "attention_sinks", "add_bias", "add_id",
                                  "swiglu_oai") + tuple(op for op in moe.MOE_BLOCK_OPS if op != "silu_mul"),
                       head_ops=("get_rows", "rmsnorm", "matmul"), scratch_i32=moe.scratch_i32,
                       block_attn=block_attn, block_ffn=block_ffn, ffn_keys=("post_attention_norm",),
                       attn_ops=("rmsnorm", "matmul", "rope", "kv_store", "attention_sinks", "add_bias", "add"),
                       ffn_ops=("rmsnorm", "add_bias", "add_id", "swiglu_oai")
                       + tuple(op for op in moe.MOE_BLOCK_OPS if op != "silu_mul"))
