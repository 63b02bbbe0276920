"""The llama architecture (``general.architecture = llama``): Llama 1/2/3/3.1/3.2, Mistral 7B,
TinyLlama, SmolLM2...; its :func:`block` also serves qwen2 and qwen3 (``qwen.py``).

Sources: llama.cpp src/models/llama.cpp (``load_arch_hparams``, ``load_arch_tensors``
and the graph), src/llama-arch.cpp (tensor names); mlx-lm ``mlx_lm/models/llama.py``.

Block (optional steps in brackets run when the unit has the tensor)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T [+ bq], xn @ Wk^T [+ bk], xn @ Wv^T [+ bv]
    [q, k = rmsnorm_per_head(q) * attn_q_norm, rmsnorm_per_head(k) * attn_k_norm]
    rope(q), rope(k)  [with rope_freqs as frequency factors]
    cache[pos] = k, v ; a = attention(q, cache) ; x += a @ Wo^T
    xn = rmsnorm(x) * ffn_norm ; x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T

Head: ``logits = (rmsnorm(x) * output_norm) @ Wout^T [+ output.bias]`` (Wout = token_embd when tied).

Rope scaling (``rope.scaling.*`` keys, ``model/config.py``): linear, YaRN, and Llama 3.1's
frequency factors (the global ``rope_freqs`` tensor, llama.cpp ``get_rope_factors``).

Not implemented yet (a file with them is refused by ``load_config``, never run without
them): llama.cpp's optional llama biases (``attn_q``/``attn_output``/``ffn_*``) and the
mixture-of-experts feed-forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NORMAL, Device, DeviceTensor
from ..hparams import Metadata, ModelConfig
from .base import BLOCK, HEAD, INPUT, KV, Architecture, Weights, matrix, norm


def hparams(m: Metadata) -> dict[str, Any]:
    """The llama-only keys (llama.cpp ``llama_model_llama::load_arch_hparams``).

    ``attention.layer_norm_rms_epsilon`` is required by llama.cpp; cooktop has always
    accepted its absence with 1e-5 and keeps doing so.
    """
    return {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, 1e-5, minimum=0.0))}


#: llama.cpp ``llama_model_llama::load_arch_tensors`` (dense feed-forward), numpy order [n_out, n_in].
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
    norm("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    matrix("blk.{i}.ffn_gate.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_up.weight", lambda c: (c.n_ff, c.n_embd)),
    matrix("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff)),
    # Llama 3.1 rope frequency factors: one global tensor every block uses (TENSOR_DUPLICATED)
    norm("rope_freqs.weight", lambda c: (c.n_rot // 2,), unit=BLOCK, required=False),
)


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """Row widths of the f32 [n_batch, width] buffers :func:`block` uses."""
    E, Q, K, F = cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv, cfg.n_ff
    return {"x": E, "xn": E, "q": Q, "att": Q, "o": E, "k": K, "v": K, "gate": F, "up": F}


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> None:
    """One llama-family block on the ``n`` rows of ``s.x`` (f32 [n, n_embd], updated in place).

    Runs the optional steps of the module doc when ``w`` has their tensors: Q/K/V biases
    (``attn_q.bias``...: qwen2), per-head Q/K norms (``attn_q_norm``, ``attn_k_norm`` of
    head_dim values: qwen3) and rope frequency factors (``rope_freqs``: Llama 3.1).

    Args:
        w: this block's weights (keys as in the architecture's tensors).
        s: scratch buffers of :func:`scratch` cut to ``n`` rows.
        kv: positions and this block's cache (:class:`~.base.KV`); cells ``kv.cells`` are written.
    """
    block_with_factors(d, cfg, w, s, kv, w.get("rope_freqs"))


def dense_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace) -> None:
    """``s.o f32 [n, n_embd] = (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T`` of the normed rows ``s.xn``."""
    d.matmul(s.gate, s.xn, w["ffn_gate"])
    d.matmul(s.up, s.xn, w["ffn_up"])
    d.silu_mul(s.gate, s.gate, s.up)
    d.matmul(s.o, s.gate, w["ffn_down"])


#: ``ffn(d, cfg, w, s)``: the feed-forward half of a block, ``s.o = ffn(s.xn)``.
FfnFn = Callable[[Device, ModelConfig, Weights, SimpleNamespace], None]


def block_with_factors(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV,
                       ff: DeviceTensor | None, ffn: FfnFn = dense_ffn) -> None:
    """:func:`block` with the rope frequency factors ``ff`` (f32 [n_rot / 2] or None) chosen by the
    caller (phi3 picks its LongRoPE factors by context length) and the feed-forward ``ffn``
    (:func:`dense_ffn`; MoE architectures pass ``moe.ffn``)."""
    attention_half(d, cfg, w, s, kv, ff)
    ffn_half(d, cfg, w, s, ffn)


def attention_half(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV,
                   ff: DeviceTensor | None = None) -> None:
    """The attention half of :func:`block_with_factors`: ``x += attention(rmsnorm(x))`` (its
    tensors are the block's non-``ffn_*`` ones; placement may run it on another device than the
    feed-forward half, the residual rows ``s.x`` crossing between them)."""
    x, xn, q, k, v, att, o = s.x, s.xn, s.q, s.k, s.v, s.att, s.o
    rope = cfg.rope_params()
    d.rmsnorm(xn, x, w["attn_norm"], cfg.rms_eps)
    for y, name in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")):
        d.matmul(y, xn, w[name])
        if name + ".bias" in w:
            d.add_bias(y, y, w[name + ".bias"])
    if "attn_q_norm" in w:
        d.rmsnorm(q, q, w["attn_q_norm"], cfg.rms_eps)
    if "attn_k_norm" in w:
        d.rmsnorm(k, k, w["attn_k_norm"], cfg.rms_eps)
    d.rope(q, q, kv.pos, **rope, freq_factors=ff)
    d.rope(k, k, kv.pos, **rope, freq_factors=ff)
    kv.attend(d, att, q, k, v, cfg.n_head, cfg.n_head_kv, 1.0 / math.sqrt(cfg.head_dim))
    d.matmul(o, att, w["attn_output"])
    d.add(x, x, o)


def ffn_half(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, ffn: FfnFn = dense_ffn) -> None:
    """The feed-forward half of :func:`block_with_factors`: ``x += ffn(rmsnorm(x) * ffn_norm)``."""
    d.rmsnorm(s.xn, s.x, w["ffn_norm"], cfg.rms_eps)
    ffn(d, cfg, w, s)
    d.add(s.x, s.x, s.o)


def final_norm(d: Device, cfg: ModelConfig, w: Weights, xn: DeviceTensor, x: DeviceTensor) -> None:
    """``xn = rmsnorm(x) * output_norm`` on rows f32 [r, n_embd] (``xn`` may be ``x``)."""
    d.rmsnorm(xn, x, w["output_norm"], cfg.rms_eps)


def lm_head(d: Device, cfg: ModelConfig, w: Weights, logits: DeviceTensor, xn: DeviceTensor) -> None:
    """``logits f32 [r, n_vocab] = xn @ output^T [+ output.bias]`` for normed rows xn f32 [r, n_embd]."""
    d.matmul(logits, xn, w["output"])
    if "output.bias" in w:
        d.add_bias(logits, logits, w["output.bias"])


LLAMA = Architecture(name="llama", tensors=TENSORS, rope_mode=ROPE_NORMAL, hparams=hparams, scratch=scratch,
                     block=block, final_norm=final_norm, lm_head=lm_head,
                     block_ops=("rmsnorm", "matmul", "rope", "kv_store", "attention", "add", "silu_mul"),
                     head_ops=("get_rows", "rmsnorm", "matmul"))
