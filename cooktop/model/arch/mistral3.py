"""The mistral3 architecture (``general.architecture = mistral3``): the text model of Mistral Small
3.1 / 3.2, Ministral 3 and Devstral Small 2 (dense).

Sources: llama.cpp src/models/mistral3.cpp (``load_arch_hparams``, ``load_arch_tensors``, the
graph), src/llama-graph.cpp (``llm_graph_input_attn_temp::set_input``: the attention temperature),
src/llama-context.cpp (YaRN's ``yarn_attn_factor`` with ``rope_yarn_log_mul``),
src/llama-model.cpp (``create_tensor_qkv``; the rope type, ``LLAMA_ROPE_TYPE_NORM``),
conversion/mistral3.py (``Ministral3Model``: llama's converter plus YaRN's ``mscale_all_dim`` and
``llama_4_scaling_beta``).

Block: llama's (``llama.block``)::

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

The attention temperature: the query factor ``1 + beta * ln(1 + floor(pos / n_ctx_orig))`` is
exactly 1 below position ``n_ctx_orig`` (``rope.scaling.original_context_length``: 16384 for
Ministral 3), so a context no longer than that needs no op; cooktop refuses a longer context for
such a file (``runtime/loader.default_n_ctx``) rather than run it without the factor.

Not implemented (refused by ``load_config``): the MoE branch (``expert_count`` > 0), the
feed-forward biases, a fused ``attn_qkv``, LongRoPE factors, and contexts past ``n_ctx_orig``
with a temperature scale (above).
"""

from __future__ import annotations

import math
from typing import Any

from ...backends.base import ROPE_NORMAL
from ...errors import UnsupportedModelError
from ..hparams import Metadata, rope_scaling
from . import llama
from .base import bias, rms_eps_hparams
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

MISTRAL3 = Architecture(name="mistral3", tensors=TENSORS, rope_mode=ROPE_NORMAL, hparams=hparams,
                        block=llama.block)
