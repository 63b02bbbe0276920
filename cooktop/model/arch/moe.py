"""What the mixture-of-experts architectures share (qwen3moe, qwen2moe, olmoe: ``qwen_moe.py``;
gpt-oss: ``gpt_oss.py``): the MoE hyper-parameters and the block in two halves (llama.cpp
src/models/qwen3moe.cpp and the others' graphs, src/llama-graph.cpp ``build_moe_ffn``).

Block ``il`` (``builders.py``; the FFN is ``builders.build_moe_ffn``, its tensors
``skeleton.moe_ffn``)::

    x += build_attn(rmsnorm(x) * attn_norm)          block_attn: llama's attention half
    x += build_moe_ffn(rmsnorm(x) * ffn_norm)        block_ffn: the experts

Placement may run the two halves on different devices (``Architecture.block_attn`` /
``block_ffn``; ``--n-cpu-moe``, ``-ot``). Refused (never run wrong): expert groups
(``expert_group_count`` > 1, DeepSeek-V3's grouped selection), per-layer expert counts (arrays).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...backends.base import Device
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from .base import KV, Weights
from .builders import build_moe_ffn, build_norm
from .llama import attn_half


def hparams(m: Metadata, gating: str, norm: bool, ff_exp_required: bool = False) -> dict[str, Any]:
    """The MoE keys (llama.cpp ``llama_model_base::load_hparams`` and the architecture's
    ``load_arch_hparams``): ``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``
    (default ``feed_forward_length / expert_used_count``), ``expert_shared_feed_forward_length``
    (default ``feed_forward_length``); ``gating`` and ``norm`` are the architecture's (its graph
    passes them to ``build_moe_ffn``; the file's ``expert_gating_func`` is not read by these).

    Raises:
        UnsupportedModelError: a missing or inconsistent count, per-layer arrays, or expert groups.
    """
    n_expert = m.num("expert_count", required=True, minimum=2)
    n_used = m.num("expert_used_count", required=True, minimum=1)
    if n_used > n_expert:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_used_count')} = {n_used} exceeds "
                                    f"{m.key('expert_count')} = {n_expert}")
    groups = m.num("expert_group_count", int, 0, minimum=0)
    if groups > 1:
        raise UnsupportedModelError(f"{m.path}: {m.key('expert_group_count')} = {groups}: grouped expert "
                                    f"selection (DeepSeek-V3 style) is not implemented by cooktop")
    n_ff = m.num("feed_forward_length", required=True, minimum=1)
    ff_exp = m.num("expert_feed_forward_length", int, None if ff_exp_required else n_ff // n_used,
                   required=ff_exp_required, minimum=1)
    return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": ff_exp,
            "n_ff_shexp": m.num("expert_shared_feed_forward_length", int, n_ff, minimum=1),
            "expert_gating": gating, "expert_weights_norm": norm, "expert_weights_scale": 0.0}


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """MoE block ``il`` (module doc) on the ``n`` rows of ``s.x`` (f32 [n, n_embd], in place):
    :func:`block_attn`, then :func:`block_ffn`."""
    block_attn(d, cfg, w, s, kv, il)
    block_ffn(d, cfg, w, s, il)


#: The attention half: llama's (optional Q/K/V biases and Q/K norms by the tensors present).
block_attn = attn_half


def block_ffn(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, il: int) -> None:
    """The feed-forward half of :func:`block`: ``x += build_moe_ffn(rmsnorm(x) * ffn_norm)``
    (SiLU experts, the shared expert when ``w`` has it)."""
    build_norm(d, cfg, s.xn, s.x, w["ffn_norm"])
    d.add(s.x, s.x, build_moe_ffn(d, cfg, w, s))
