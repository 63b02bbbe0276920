"""The smollm3 architecture (``general.architecture = smollm3``): SmolLM3 (3B).

Sources: llama.cpp src/models/smollm3.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph), src/llama-model.cpp (``create_tensor_qkv``; the rope type, ``LLAMA_ROPE_TYPE_NORM``),
conversion/llama.py (``SmolLM3Model``: the llama converter, unchanged).

Block ``il``: llama's (``llama.block``) except that every fourth block rotates nothing (NoPE)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T, xn @ Wk^T, xn @ Wv^T
    rope(q), rope(k)     normal (GPT-J) rope, skipped where (il + 1) % 4 == 0
    cache[pos] = k, v ; x += attention(q, cache, scale 1/sqrt(head_dim)) @ Wo^T
    xn = rmsnorm(x) * ffn_norm
    x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T

llama.cpp fixes the period at 4 (``hparams.n_no_rope_layer_step = 4``; the converter writes no
key for it, as SmolLM3's ``no_rope_layer_interval`` is 4) and asserts ``rope.dimension_count`` =
head_dim. Head: ``(rmsnorm(x) * output_norm) @ Wout^T`` (Wout = token_embd when tied, as in
SmolLM3-3B).

Not implemented (refused by ``load_config``): a fused ``attn_qkv`` and Q/K/V biases (llama.cpp's
shared ``create_tensor_qkv`` accepts them; the converter writes neither for SmolLM3).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from ...backends.base import ROPE_NORMAL, Device, DeviceTensor
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from .base import KV, Weights, rms_eps_hparams
from .builders import SILU, build_attn, build_ffn, build_norm, build_qkv
from .descriptor import Architecture
from .skeleton import llama_tensors

#: llama.cpp ``n_no_rope_layer_step``: block ``il`` rotates Q and K unless ``(il + 1) % 4 == 0``.
NO_ROPE_LAYER_STEP = 4


def uses_rope(il: int) -> bool:
    """True when block ``il`` (0-based) rotates Q and K (llama.cpp ``(il + 1) % n_no_rope_layer_step != 0``)."""
    return (il + 1) % NO_ROPE_LAYER_STEP != 0


def hparams(m: Metadata) -> dict[str, Any]:
    """The smollm3 keys (llama.cpp ``llama_model_smollm3::load_arch_hparams``): the RMS epsilon (required).

    Raises:
        UnsupportedModelError: the epsilon missing, or ``rope.dimension_count`` other than head_dim
            (llama.cpp asserts ``n_rot == n_embd_head``).
    """
    n_embd = m.num("embedding_length", required=True, minimum=1)
    n_head = m.num("attention.head_count", required=True, minimum=1)
    head_dim = m.num("attention.key_length", default=n_embd // n_head, minimum=1)
    n_rot = m.num("rope.dimension_count", default=head_dim, minimum=0)
    if n_rot != head_dim:
        raise UnsupportedModelError(f"{m.path}: {m.key('rope.dimension_count')} = {n_rot} differs from head_dim "
                                    f"{head_dim} (llama.cpp's smollm3 graph rotates whole heads)")
    return rms_eps_hparams(m)


#: llama.cpp ``llama_model_smollm3::load_arch_tensors``: llama's (separate Q/K/V, no biases).
TENSORS = llama_tensors()


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` of smollm3 (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place).

    Args:
        w: this block's weights (keys as in :data:`TENSORS`).
        s: scratch buffers of ``builders.scratch`` cut to ``n`` rows.
        kv: positions and this block's cache (:class:`~.base.KV`); cells ``kv.cells`` are written.
        il: the block's index in the model (:func:`uses_rope` picks the NoPE blocks).
    """
    x = s.x
    build_norm(d, cfg, s.xn, x, w["attn_norm"])
    if uses_rope(il):
        o = build_attn(d, cfg, w, s, kv, il)
    else:
        o = nope_attn(d, cfg, w, s, kv)
    d.add(x, x, o)
    build_norm(d, cfg, s.xn, x, w["ffn_norm"])
    d.add(x, x, build_ffn(d, cfg, w, s, SILU))


def nope_attn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> DeviceTensor:
    """Attention without rope on the normed rows ``s.xn`` f32 [n, n_embd]: Q, K, V projected, K and V
    stored unrotated, causal attention with scale ``1/sqrt(head_dim)``; returns ``s.o = a @ Wo^T``
    f32 [n, n_embd] (llama.cpp smollm3.cpp with ``use_rope`` false)."""
    build_qkv(d, w, s.xn, s.q, s.k, s.v)
    kv.attend(d, s.att, s.q, s.k, s.v, cfg.n_head, cfg.n_head_kv, 1.0 / math.sqrt(cfg.head_dim))
    d.matmul(s.o, s.att, w["attn_output"])
    return s.o


SMOLLM3 = Architecture(name="smollm3", tensors=TENSORS, rope_mode=ROPE_NORMAL, hparams=hparams, block=block)
