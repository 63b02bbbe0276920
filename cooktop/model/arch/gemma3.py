"""The gemma3 architecture (``general.architecture = gemma3``): Gemma 3 text models (270M, 1B,
4B, 12B, 27B; the text part of the multimodal ones).

Sources: llama.cpp src/models/gemma3.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph ``graph<iswa>``), src/llama-model.cpp (``load_swa_pattern``, ``get_rope_freq_base``),
src/llama-hparams.cpp (``set_swa_pattern``), src/llama-hparams.h (``is_masked_swa``),
conversion/gemma.py (the converter).

Block ``il`` (``swa`` = ``cfg.swa_layers[il]``)::

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
from .base import HEAD, INPUT, KV, Architecture, Weights, matrix, norm
from .llama import final_norm, lm_head

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


#: llama.cpp ``llama_model_gemma3::load_arch_tensors``, numpy order [n_out, n_in].
TENSORS = (
    matrix("token_embd.weight", lambda c: (c.n_vocab, c.n_embd), unit=INPUT),
    norm("output_norm.weight", lambda c: (c.n_embd,), unit=HEAD),
    matrix("output.weight", lambda c: (c.n_vocab, c.n_embd), unit=HEAD, required=False,
           tied_to="token_embd.weight"),
    norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.attn_q.weight", lambda c: (c.n_embd_q, c.n_embd)),
    matrix("blk.{i}.attn_k.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_v.weight", lambda c: (c.n_embd_kv, c.n_embd)),
    matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd_q)),
    norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)),
    norm("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,)),
    norm("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,)),
    norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.ffn_gate.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_up.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff)),
    norm("blk.{i}.post_ffw_norm.weight", lambda c: (c.n_embd,)),
)


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers :func:`block` uses."""
    E, Q, K, F = cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv, cfg.n_ff
    return {"x": E, "xn": E, "q": Q, "att": Q, "o": E, "k": K, "v": K, "gate": F, "up": F}


def rope_args(cfg: ModelConfig, il: int) -> dict[str, Any]:
    """``Device.rope`` keyword arguments of block ``il``: the model's rope, with the SWA base and
    scale on sliding-window layers (llama.cpp ``get_rope_freq_base`` / ``get_rope_freq_scale``)."""
    args = cfg.rope_params()
    if cfg.swa_layers and cfg.swa_layers[il]:
        args.update(freq_base=cfg.rope_freq_base_swa, freq_scale=cfg.rope_freq_scale_swa)
    return args


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> None:
    """One gemma3 block (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place).

    Args:
        w: this block's weights (keys as in :data:`TENSORS`).
        s: scratch buffers of :func:`scratch` cut to ``n`` rows; ``s.il`` the block index.
        kv: positions and this block's cache (:class:`~.base.KV`); cells ``kv.cells`` are written.
    """
    x, xn, q, k, v, att, o, gate, up = s.x, s.xn, s.q, s.k, s.v, s.att, s.o, s.gate, s.up
    il = getattr(s, "il", 0)
    swa = bool(cfg.swa_layers) and cfg.swa_layers[il]
    rope = rope_args(cfg, il)
    eps = cfg.rms_eps
    d.rmsnorm(xn, x, w["attn_norm"], eps)
    d.matmul(q, xn, w["attn_q"])
    d.matmul(k, xn, w["attn_k"])
    d.matmul(v, xn, w["attn_v"])
    d.rmsnorm(q, q, w["attn_q_norm"], eps)
    d.rmsnorm(k, k, w["attn_k_norm"], eps)
    d.rope(q, q, kv.pos, **rope)
    d.rope(k, k, kv.pos, **rope)
    scale = cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)
    kv.attend(d, att, q, k, v, cfg.n_head, cfg.n_head_kv, scale, cfg.n_swa if swa else 0)
    d.matmul(o, att, w["attn_output"])
    d.rmsnorm(o, o, w["post_attention_norm"], eps)
    d.add(x, x, o)
    d.rmsnorm(xn, x, w["ffn_norm"], eps)
    d.matmul(gate, xn, w["ffn_gate"])
    d.matmul(up, xn, w["ffn_up"])
    d.gelu_mul(gate, gate, up)
    d.matmul(o, gate, w["ffn_down"])
    d.rmsnorm(o, o, w["post_ffw_norm"], eps)
    d.add(x, x, o)


def embd_scale(cfg: ModelConfig) -> float:
    """``sqrtf(n_embd)`` in float32, the factor llama.cpp's gemma3 graph scales token embeddings by."""
    import numpy as np

    return float(np.sqrt(np.float32(cfg.n_embd)))


GEMMA3 = Architecture(name="gemma3", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, scratch=scratch,
                      block=block, final_norm=final_norm, lm_head=lm_head,
                      block_ops=("rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "gelu_mul"),
                      head_ops=("get_rows", "rmsnorm", "matmul"), embd_scale=embd_scale)
