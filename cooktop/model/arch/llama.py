"""The llama architecture (``general.architecture = llama``): Llama 1/2/3/3.1/3.2, Mistral 7B,
TinyLlama, SmolLM2...; its :func:`block` also serves qwen2, qwen3 (``qwen.py``) and phi3.

Sources: llama.cpp src/models/llama.cpp (``load_arch_hparams``, ``load_arch_tensors``
and the graph), src/llama-arch.cpp (tensor names); mlx-lm ``mlx_lm/models/llama.py``.

Block (``builders.py``; optional steps in brackets run when the unit has the tensor)::

    xn = rmsnorm(x) * attn_norm
    x += build_attn(xn):  q, k, v = xn @ Wq^T [+ bq], xn @ Wk^T [+ bk], xn @ Wv^T [+ bv]
                          [q, k = rmsnorm_per_head(q) * attn_q_norm, rmsnorm_per_head(k) * attn_k_norm]
                          rope(q), rope(k)  [with rope_freqs or LongRoPE factors]
                          cache[pos] = k, v ; (attention(q, cache)) @ Wo^T
    xn = rmsnorm(x) * ffn_norm
    x += build_ffn(xn):   (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T

Head: ``logits = (rmsnorm(x) * output_norm) @ Wout^T [+ output.bias]`` (Wout = token_embd when tied).

Rope scaling (``rope.scaling.*`` keys, ``model/config.py``): linear, YaRN, and Llama 3.1's
frequency factors (the global ``rope_freqs`` tensor, llama.cpp ``get_rope_factors``).

Not implemented yet (a file with them is refused by ``load_config``, never run without
them): llama.cpp's optional llama biases (``attn_q``/``attn_output``/``ffn_*``) and llama's
mixture-of-experts variant (Mixtral; the MoE architectures are in ``qwen_moe.py``, ``gpt_oss.py``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NORMAL, Device
from ..hparams import Metadata, ModelConfig
from .base import KV, Weights
from .builders import SILU, build_attn, build_ffn, build_norm
from .descriptor import Architecture
from .skeleton import ROPE_FREQS, llama_tensors


def hparams(m: Metadata) -> dict[str, Any]:
    """The llama-only keys (llama.cpp ``llama_model_llama::load_arch_hparams``).

    ``attention.layer_norm_rms_epsilon`` is required by llama.cpp; cooktop has always
    accepted its absence with 1e-5 and keeps doing so.
    """
    return {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, 1e-5, minimum=0.0))}


#: llama.cpp ``llama_model_llama::load_arch_tensors`` (dense feed-forward).
TENSORS = llama_tensors(shared=(ROPE_FREQS,))


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` of the llama family on the ``n`` rows of ``s.x`` (f32 [n, n_embd], updated in place).

    Runs the optional steps of the module doc when ``w`` has their tensors: Q/K/V biases
    (``attn_q.bias``...: qwen2), per-head Q/K norms (``attn_q_norm``, ``attn_k_norm`` of
    head_dim values: qwen3) and rope frequency factors (``rope_freqs``: Llama 3.1; LongRoPE's:
    phi3, whose fused weights arrive split).

    Args:
        w: this block's weights (keys as in the architecture's tensors).
        s: scratch buffers of ``builders.scratch`` cut to ``n`` rows.
        kv: positions and this block's cache (:class:`~.base.KV`); cells ``kv.cells`` are written.
        il: the block's index in the model.
    """
    attn_half(d, cfg, w, s, kv, il)
    build_norm(d, cfg, s.xn, s.x, w["ffn_norm"])
    d.add(s.x, s.x, build_ffn(d, cfg, w, s, SILU))


def attn_half(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """The attention half of :func:`block`: ``x += build_attn(rmsnorm(x) * attn_norm)`` (the MoE
    blocks' too: ``moe.block_attn``)."""
    build_norm(d, cfg, s.xn, s.x, w["attn_norm"])
    d.add(s.x, s.x, build_attn(d, cfg, w, s, kv, il))


LLAMA = Architecture(name="llama", tensors=TENSORS, rope_mode=ROPE_NORMAL, hparams=hparams, block=block)
