"""The gpt-oss architecture (``general.architecture = gpt-oss``): OpenAI's gpt-oss-20b and -120b.

Sources: llama.cpp src/models/openai-moe.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph), src/llama-graph.cpp ``build_moe_ffn`` (``LLM_FFN_SWIGLU_OAI_MOE``,
``LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT``) and ``build_attn`` (attention sinks),
src/llama-hparams.cpp ``set_swa_pattern`` (period 2: even blocks slide), ggml-cpu/ops.cpp
``swiglu_oai``.

Block ``il`` (``builders.py``; ``swa`` = ``cfg.swa_layers[il]``: every even block by default)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T + bq, xn @ Wk^T + bk, xn @ Wv^T + bv
    rope(q), rope(k)    NeoX, YaRN (rope.scaling.*); base rope.freq_base_swa on SWA blocks
                        (scale: the model's, llama.cpp ``rope_freq_scale_train_swa``)
    a = attention(q, cache, scale 1/sqrt(head_dim), window n_swa if swa, sinks = attn_sinks)
    x += a @ Wo^T + bo
    xn = rmsnorm(x) * post_attention_norm
    x += moe_ffn(xn)    router bias; top-k of the logits, softmax over the k; expert biases;
                        swiglu_oai (alpha 1.702, clamp 7); weights not renormalised

The attention half is llama's (``builders.build_attn`` reads the sinks and the output bias), the
feed-forward half ``builders.build_moe_ffn`` after ``post_attention_norm`` (``skeleton.llama_tensors``'s
``ffn_norm``). Head: ``(rmsnorm(x) * output_norm) @ output^T`` (output required, not tied).
Experts are MXFP4 in OpenAI's files (any type the device runs works).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NEOX, Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig, rope_scaling
from . import moe
from .base import KV, Weights, bias, norm, rms_eps_hparams
from .builders import SWIGLU_OAI, build_moe_ffn, build_norm, moe_scratch, moe_scratch_i32
from .descriptor import Architecture
from .gemma3 import swa_pattern
from .skeleton import OUTPUT_UNTIED, llama_tensors, moe_ffn

#: llama.cpp's default period of gpt-oss's sliding-window pattern (``load_swa_pattern(ml, 2)``).
SWA_PERIOD = 2


def hparams(m: Metadata) -> dict[str, Any]:
    """The gpt-oss keys (llama.cpp ``llama_model_openai_moe::load_arch_hparams``): rms epsilon,
    ``expert_feed_forward_length`` and ``attention.sliding_window`` (all required), the pattern
    (default period 2), ``rope.freq_base_swa`` (default the model's base; the SWA scale is the
    model's), the MoE keys.

    Raises:
        UnsupportedModelError: a required key missing, a bad pattern (see ``moe.hparams`` too).
    """
    n_layer = m.num("block_count", required=True, minimum=1)
    out: dict[str, Any] = rms_eps_hparams(m)
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
               rope_freq_base_swa=float(m.num("rope.freq_base_swa", float, base, minimum=1e-30)),
               rope_freq_scale_swa=rope_scaling(m, 0)["rope_freq_scale"])
    return out


#: llama.cpp ``llama_model_openai_moe::load_arch_tensors``: Q/K/V biases, the attention output's
#: bias and sinks, ``post_attention_norm`` as the FFN norm, experts with biases; output required.
TENSORS = llama_tensors(output=OUTPUT_UNTIED, qkv_bias=True,
                        attn=(bias("blk.{i}.attn_output.bias", lambda c: (c.n_embd,), required=True),
                              norm("blk.{i}.attn_sinks.weight", lambda c: (c.n_head,))),
                        ffn_norm=(norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)),),
                        ffn=moe_ffn(biases=True))


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """gpt-oss block ``il`` (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place)."""
    moe.block_attn(d, cfg, w, s, kv, il)
    block_ffn(d, cfg, w, s, il)


def block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, il: int) -> None:
    """The MoE half of :func:`block`: ``x += build_moe_ffn(rmsnorm(x) * post_attention_norm)``
    (swiglu_oai experts)."""
    build_norm(d, cfg, s.xn, s.x, w["post_attention_norm"])
    d.add(s.x, s.x, build_moe_ffn(d, cfg, w, s, SWIGLU_OAI))


GPT_OSS = Architecture(name="gpt-oss", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, block=block,
                       scratch=moe_scratch, scratch_i32=moe_scratch_i32, block_attn=moe.block_attn,
                       block_ffn=block_ffn)
