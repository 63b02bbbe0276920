"""The gemma3 architecture (``general.architecture = gemma3``): Gemma 3 text models (270M, 1B,
4B, 12B, 27B; the text part of the multimodal ones).

Sources: llama.cpp src/models/gemma3.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph ``graph<iswa>``), src/llama-model.cpp (``load_swa_pattern``, ``get_rope_freq_base``),
src/llama-hparams.cpp (``set_swa_pattern``), src/llama-hparams.h (``is_masked_swa``),
conversion/gemma.py (the converter).

Block ``il`` (``builders.py``'s norm, attention and FFN; ``swa`` = ``cfg.swa_layers[il]``)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T, xn @ Wk^T, xn @ Wv^T
    q, k = rmsnorm_per_head(q) * attn_q_norm, rmsnorm_per_head(k) * attn_k_norm
    rope(q), rope(k)   NeoX; base rope.freq_base_swa and scale 1 on SWA layers, else the model's
    cache[pos] = k, v ; a = attention(q, cache, scale = attn_scale, window = n_swa if swa else 0)
    x += rmsnorm(a @ Wo^T) * post_attention_norm
    xn = rmsnorm(x) * ffn_norm
    x += rmsnorm((gelu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T) * post_ffw_norm

Input: ``token_embd[tokens] * sqrt(n_embd)`` (float32). Head: ``(rmsnorm(x) * output_norm) @ Wout^T``
(Wout = token_embd when tied, as in every Gemma 3 file).

Conventions checked against llama.cpp:

- Norm weights: Gemma's RMSNorm multiplies by ``1 + w``; llama.cpp's converter stores
  ``w + 1`` in the GGUF (``norm_shift`` in conversion/gemma.py) and the graph multiplies by the
  stored value, so cooktop's plain ``rmsnorm(x) * w`` is right for GGUF files.
- Query scale: ``1/sqrt(attention.key_length)``, except 27B (62 blocks): ``1/sqrt(n_embd / n_head)``
  (llama.cpp ``f_attention_scale``); the graph scales Q before attention, cooktop passes the
  same factor as the attention scale.
- Sliding window: llama.cpp reads ``attention.sliding_window`` (n_swa); when > 0 the layers
  are SWA by ``attention.sliding_window_pattern`` (a per-layer bool array, or a period,
  default 6: every 6th layer, ``il % 6 == 5``, is global) and the mask is the standard one
  (key j seen by query p iff ``p - n_swa < j <= p``). Without the key no layer is SWA.

Not implemented (refused by ``load_config``): ``final_logit_softcapping`` (not written for
Gemma 3 models, whose config has none), a fused ``attn_qkv``, and the embedding model's
``dense_2``/``dense_3`` projections.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NEOX, Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from .base import KV, Weights, norm
from .builders import GELU, build_attn, build_ffn, build_norm
from .descriptor import Architecture
from .skeleton import QK_NORM, llama_tensors

#: llama.cpp's default period of gemma3's sliding-window pattern (``load_swa_pattern(ml, 6)``).
SWA_PERIOD = 6


def swa_pattern(n_layer: int, pattern: Any) -> tuple[bool, ...]:
    """Which of ``n_layer`` blocks are sliding-window layers (llama.cpp ``load_swa_pattern``).

    Args:
        pattern: ``attention.sliding_window_pattern``: a list of per-layer bools, or a period
            ``n`` (``il % n < n - 1`` is SWA: the last layer of each period is global; 0: all SWA),
            or None for the default period :data:`SWA_PERIOD`.
    Raises:
        ValueError: a list of another length than n_layer, or a negative period.
    """
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layer:
            raise ValueError(f"has {len(pattern)} values for {n_layer} blocks")
        return tuple(bool(v) for v in pattern)
    n = SWA_PERIOD if pattern is None else int(pattern)
    if n < 0:
        raise ValueError(f"= {n} is negative")
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


def hparams(m: Metadata) -> dict[str, Any]:
    """The gemma3 keys (llama.cpp ``llama_model_gemma3::load_arch_hparams``).

    Raises:
        UnsupportedModelError: ``attention.layer_norm_rms_epsilon`` missing (llama.cpp requires
            it), a bad sliding-window pattern, or a non-zero ``final_logit_softcapping``.
    """
    n_layer = m.num("block_count", required=True, minimum=1)
    out: dict[str, Any] = {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True,
                                                  minimum=0.0))}
    n_swa = m.num("attention.sliding_window", int, 0, minimum=0)
    if n_swa > 0:
        raw = m.get("attention.sliding_window_pattern")
        try:
            layers = swa_pattern(n_layer, raw)
        except (TypeError, ValueError) as e:
            raise UnsupportedModelError(
                f"{m.path}: metadata key {m.key('attention.sliding_window_pattern')!r} {e}") from None
        out.update(n_swa=n_swa, swa_layers=layers,
                   rope_freq_base_swa=float(m.num("rope.freq_base_swa", float, 10000.0, minimum=1e-30)))
    softcap = m.num("final_logit_softcapping", float, 0.0)
    if softcap:
        raise UnsupportedModelError(f"{m.path}: {m.key('final_logit_softcapping')} = {softcap:g} (a tanh cap of "
                                    f"the logits) is not implemented by cooktop")
    n_embd = m.num("embedding_length", required=True, minimum=1)
    n_head = m.num("attention.head_count", required=True, minimum=1)
    head_dim = m.num("attention.key_length", default=n_embd // n_head, minimum=1)
    # gemma_pytorch config.py: the 27B scales queries by (n_embd / n_head)^-0.5, the others by head_dim^-0.5
    out["attn_scale"] = 1.0 / math.sqrt(n_embd // n_head if n_layer == 62 else head_dim)
    return out


#: llama.cpp ``llama_model_gemma3::load_arch_tensors``: llama's with per-head Q/K norms and the
#: post-attention and post-FFN norms.
TENSORS = llama_tensors(attn=(norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)), *QK_NORM),
                        post_ffn=(norm("blk.{i}.post_ffw_norm.weight", lambda c: (c.n_embd,)),))


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` of gemma3 (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place).

    ``builders.build_attn`` takes the layer's sliding window and rope base from ``cfg`` by ``il``.

    Args:
        w: this block's weights (keys as in :data:`TENSORS`).
        s: scratch buffers of ``builders.scratch`` cut to ``n`` rows.
        kv: positions and this block's cache (:class:`~.base.KV`); cells ``kv.cells`` are written.
        il: the block's index in the model.
    """
    x = s.x
    build_norm(d, cfg, s.xn, x, w["attn_norm"])
    o = build_attn(d, cfg, w, s, kv, il)
    d.add(x, x, build_norm(d, cfg, o, o, w["post_attention_norm"]))
    build_norm(d, cfg, s.xn, x, w["ffn_norm"])
    o = build_ffn(d, cfg, w, s, GELU)
    d.add(x, x, build_norm(d, cfg, o, o, w["post_ffw_norm"]))


def embd_scale(cfg: ModelConfig) -> float:
    """``sqrtf(n_embd)`` in float32, the factor llama.cpp's gemma3 graph scales token embeddings by."""
    import numpy as np

    return float(np.sqrt(np.float32(cfg.n_embd)))


GEMMA3 = Architecture(name="gemma3", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, block=block,
                      embd_scale=embd_scale)
