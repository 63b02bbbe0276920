"""The glm4 architecture (``general.architecture = glm4``): GLM-4-0414 (9B, 32B) and the other
dense GLM-4 text models converted as ``Glm4ForCausalLM``.

Sources: llama.cpp src/models/glm4.cpp (``load_arch_hparams``, ``load_arch_tensors``, the graph),
src/llama-graph.cpp (``build_ffn`` with ``LLM_FFN_SWIGLU`` / ``LLM_FFN_SEQ``: ``ggml_swiglu`` of the
fused up projection, gate first), src/llama-model.cpp (``create_tensor_qkv``; the rope type:
``LLAMA_ROPE_TYPE_NORM`` unless the file has multi-section rope), src/llama-hparams.cpp
(``use_mrope``), conversion/glm.py (``Glm4Model``: ``rope.dimension_count`` = head_dim x
``partial_rotary_factor``, 0.5 by default).

Block ``il`` (``builders.py``'s norm, attention and FFN)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T [+ bq], xn @ Wk^T [+ bk], xn @ Wv^T [+ bv]
    rope(q), rope(k)     normal (GPT-J) rope of the first n_rot dimensions of each head (partial
                         rotary: GLM-4-9B-0414 rotates 64 of 128), the rest passed through
    cache[pos] = k, v ; a = attention(q, cache, scale 1/sqrt(head_dim))
    x += rmsnorm(a @ Wo^T) * post_attention_norm
    xn = rmsnorm(x) * ffn_norm
    g, u = xn @ Wup^T split at row n_ff       (fused ffn_up of 2 n_ff rows, gate first)
    x += rmsnorm((silu(g) * u) @ Wd^T) * post_ffw_norm

Head: ``(rmsnorm(x) * output_norm) @ Wout^T`` (Wout = token_embd when tied). The fused ``ffn_up``
is uploaded as its two row ranges (``TensorSpec.parts``, as phi3's). ``nextn_predict_layers``
blocks after the trunk (multi-token prediction) are skipped as llama.cpp's main pass does.

Not implemented (refused by ``load_config``): multi-section rope (``rope.dimension_sections`` with
its first two sections > 0: GLM-4.1V / GLM-4.6V text models, whose rope llama.cpp switches to
``LLAMA_ROPE_TYPE_MROPE``), a fused ``attn_qkv``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from ...backends.base import ROPE_NORMAL, Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from .base import KV, Weights, norm, rms_eps_hparams
from .builders import SILU, build_attn, build_ffn, build_norm
from .descriptor import Architecture
from .phi3 import FUSED_UP
from .skeleton import FFN_DOWN, llama_tensors


def hparams(m: Metadata) -> dict[str, Any]:
    """The glm4 keys (llama.cpp ``llama_model_glm4::load_arch_hparams``): the RMS epsilon (required)
    and ``nextn_predict_layers`` (the multi-token-prediction blocks after the trunk: ``n_layer`` is
    ``block_count`` less them, ``n_layer_nextn`` them).

    Raises:
        UnsupportedModelError: the epsilon missing, multi-section rope (module doc), or
            ``nextn_predict_layers`` >= ``block_count``.
    """
    secs = m.get("rope.dimension_sections")
    if isinstance(secs, (list, tuple, np.ndarray)) and len(secs) >= 2 and int(secs[0]) > 0 and int(secs[1]) > 0:
        raise UnsupportedModelError(f"{m.path}: {m.key('rope.dimension_sections')} = {[int(v) for v in secs]}: "
                                    "glm4's multi-section rope (a vision-language model's text part) is not "
                                    "implemented by cooktop")
    n_all = int(m.num("block_count", required=True, minimum=1))
    nextn = int(m.num("nextn_predict_layers", int, 0, minimum=0))
    if nextn >= n_all:
        raise UnsupportedModelError(f"{m.path}: {m.key('nextn_predict_layers')} = {nextn} leaves no trunk "
                                    f"block of {n_all}")
    return {**rms_eps_hparams(m), "n_layer": n_all - nextn, "n_layer_nextn": nextn}


#: llama.cpp ``llama_model_glm4::load_arch_tensors``: llama's with the optional Q/K/V biases, the
#: post-attention norm, the fused gate/up matrix and the post-FFN norm.
TENSORS = llama_tensors(qkv_bias=True, attn=(norm("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)),),
                        ffn=(FFN_DOWN, FUSED_UP),
                        post_ffn=(norm("blk.{i}.post_ffw_norm.weight", lambda c: (c.n_embd,)),))


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` of glm4 (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place).

    Args:
        w: this block's weights (keys as in :data:`TENSORS`; the fused ``ffn_up`` as ``ffn_gate``
            and ``ffn_up``).
        s: scratch buffers of ``builders.scratch`` cut to ``n`` rows.
        kv: positions and this block's cache (:class:`~.base.KV`); cells ``kv.cells`` are written.
        il: the block's index in the model.
    """
    x = s.x
    build_norm(d, cfg, s.xn, x, w["attn_norm"])
    o = build_attn(d, cfg, w, s, kv, il)
    d.add(x, x, build_norm(d, cfg, o, o, w["post_attention_norm"]))
    build_norm(d, cfg, s.xn, x, w["ffn_norm"])
    o = build_ffn(d, cfg, w, s, SILU)
    d.add(x, x, build_norm(d, cfg, o, o, w["post_ffw_norm"]))


GLM4 = Architecture(name="glm4", tensors=TENSORS, rope_mode=ROPE_NORMAL, hparams=hparams, block=block)
