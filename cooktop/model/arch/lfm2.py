"""The lfm2 architecture (``general.architecture = lfm2``): Liquid AI's LFM2 (350M-2.6B), a hybrid
of short-convolution blocks and grouped-query attention blocks.

Sources: llama.cpp src/models/lfm2.cpp (``load_arch_hparams``, ``load_arch_tensors``, the graph:
``build_shortconv_block``, ``build_attn_block``), src/llama-arch.cpp (tensor names; the output norm
is stored as ``token_embd_norm``, ``LLM_TENSOR_OUTPUT_NORM_LFM2``), src/llama-model.cpp (NeoX rope),
conversion/lfm2.py (``attention.head_count_kv`` per layer, 0 for the convolution blocks).

Which blocks are recurrent: those whose ``attention.head_count_kv`` entry is 0 (llama.cpp
``is_recr_impl[il] = n_head_kv(il) == 0``; ``model/config.py`` reads the array). Every block::

    xn = rmsnorm(x) * attn_norm
    recurrent:  b, c, u = xn @ in_proj^T  (in_proj [3 n_embd, n_embd], split in three row ranges, in that order)
                v = ssm_conv(b * u)      (kernel shortconv.conv [n_embd, l_cache], state: the last l_cache - 1
                                          values of b * u per sequence, model/recurrent.py)
                x += (c * v) @ out_proj^T
    attention:  x += build_attn(xn)      (per-head Q/K RMS norms, NeoX rope, scale 1/sqrt(head_dim))
    xn = rmsnorm(x) * ffn_norm
    x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T

Head: ``logits = (rmsnorm(x) * token_embd_norm) @ output^T`` (``output`` tied to ``token_embd``
when absent). ``attention.sliding_window`` (LFM2's SWA variant) makes the attention blocks
sliding-window ones, as llama.cpp does.

Not implemented (refused by ``load_config``): lfm2moe (its own architecture name), the
bidirectional LFM2 embedding models (``attention.causal = false``) and the ColBERT ``dense_2``
projection (an unknown tensor).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...backends.base import ROPE_NEOX, Device, DeviceTensor
from ...errors import UnsupportedModelError
from ..hparams import Metadata, ModelConfig
from . import builders
from .base import BLOCK, HEAD, KV, TensorSpec, Weights, matrix, norm
from .builders import SILU, build_attn, build_ffn, build_norm
from .descriptor import Architecture
from .skeleton import FFN, FFN_NORM, OUTPUT, QK_NORM, TOKEN_EMBD, attn_qkv


def _attn(c: ModelConfig, il: int) -> bool:
    return not c.is_recurrent(il)


def _recr(c: ModelConfig, il: int) -> bool:
    return c.is_recurrent(il)


def _in_attn(specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    return tuple(dataclasses.replace(s, layers=_attn) for s in specs)


#: llama.cpp ``llama_model_lfm2::load_arch_tensors`` (dense), in file order: the FFN of every block, the
#: operator norm, then the attention tensors (attention blocks) or the short convolution (recurrent ones).
TENSORS: tuple[TensorSpec, ...] = (
    TOKEN_EMBD,
    norm("token_embd_norm.weight", lambda c: (c.n_embd,), unit=HEAD),
    OUTPUT,
    FFN_NORM, *FFN,
    norm("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    *_in_attn(QK_NORM),
    *_in_attn(attn_qkv()),
    *_in_attn((matrix("blk.{i}.attn_output.weight", lambda c: (c.n_embd, c.n_embd_q)),)),
    # the kernel: one row of l_cache taps per channel (GGUF ne = (l_cache, n_embd)), uploaded as f32
    norm("blk.{i}.shortconv.conv.weight", lambda c: (c.n_embd, c.n_conv), layers=_recr),
    TensorSpec("blk.{i}.shortconv.in_proj.weight", lambda c: (3 * c.n_embd, c.n_embd), BLOCK, layers=_recr,
               parts=(("conv_b", lambda c: c.n_embd), ("conv_c", lambda c: c.n_embd),
                      ("conv_x", lambda c: c.n_embd))),
    matrix("blk.{i}.shortconv.out_proj.weight", lambda c: (c.n_embd, c.n_embd), layers=_recr),
)


def hparams(m: Metadata) -> dict[str, Any]:
    """llama.cpp ``llama_model_lfm2::load_arch_hparams``: ``shortconv.l_cache`` (required, > 1) and the
    RMS epsilon (required); ``attention.sliding_window`` (optional, > 0) for the attention blocks.
    The recurrent blocks come from ``attention.head_count_kv`` (``model/config.py``).

    Raises:
        UnsupportedModelError: a key missing or out of range, or a non-causal (embedding) model.
    """
    n_conv = int(m.num("shortconv.l_cache", int, required=True, minimum=2))
    if not m.get("attention.causal", True):
        raise UnsupportedModelError(f"{m.path}: {m.key('attention.causal')} = false (a bidirectional LFM2 "
                                    "embedding model) is not supported; cooktop runs the causal lfm2 models")
    out: dict[str, Any] = {"n_conv": n_conv,
                           "rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True,
                                                  minimum=0.0))}
    n_swa = int(m.num("attention.sliding_window", int, 0, minimum=0))
    if n_swa > 0:  # the attention blocks (head_count_kv > 0) are the sliding-window ones
        kv = m.get("attention.head_count_kv")
        n_layer = int(m.num("block_count", required=True, minimum=1))
        attn = [int(v) != 0 for v in kv] if isinstance(kv, (list, tuple, np.ndarray)) else [True] * n_layer
        out.update(n_swa=n_swa, swa_layers=tuple(attn))
    return out


def state_widths(cfg: ModelConfig, il: int) -> tuple[int, ...]:
    """Floats per sequence of block ``il``'s one state tensor: ``(l_cache - 1) * n_embd`` for a
    convolution block (llama.cpp ``hparams.n_embd_r()``); () for an attention block."""
    return ((cfg.n_conv - 1) * cfg.n_embd,) if cfg.is_recurrent(il) else ()


def scratch(cfg: ModelConfig) -> dict[str, int]:
    """The builders' buffers and the convolution's ``cb``, ``cc``, ``cx``, ``cv`` (f32 [n_batch, n_embd])."""
    E = cfg.n_embd
    return {**builders.scratch(cfg), "cb": E, "cc": E, "cx": E, "cv": E}


def shortconv(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV) -> DeviceTensor:
    """The short-convolution operator on the normed rows ``s.xn`` (llama.cpp ``build_shortconv_block``):
    returns ``s.o`` f32 [n, n_embd] = ``(c * ssm_conv(b * u)) @ out_proj^T``; ``kv.state[0]`` (f32
    [n_seq, (l_cache - 1) * n_embd]) is read and updated at the rows' sequences ``kv.slots``."""
    d.matmuls(s.xn, (s.cb, w["conv_b"]), (s.cc, w["conv_c"]), (s.cx, w["conv_x"]))
    d.mul(s.cb, s.cb, s.cx)
    d.ssm_conv(s.cv, s.cb, kv.state[0], w["shortconv.conv"], kv.slots)  # type: ignore[index,arg-type]
    d.mul(s.cv, s.cc, s.cv)
    d.matmul(s.o, s.cv, w["shortconv.out_proj"])
    return s.o


def block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
    """Block ``il`` on the ``n`` rows of ``s.x`` (f32 [n, n_embd], updated in place): the operator
    (short convolution or attention, module doc), then the SwiGLU feed-forward."""
    build_norm(d, cfg, s.xn, s.x, w["attn_norm"])
    if cfg.is_recurrent(il):
        d.add(s.x, s.x, shortconv(d, cfg, w, s, kv))
    else:
        d.add(s.x, s.x, build_attn(d, cfg, w, s, kv, il))
    build_norm(d, cfg, s.xn, s.x, w["ffn_norm"])
    d.add(s.x, s.x, build_ffn(d, cfg, w, s, SILU))


def final_norm(d: Device, cfg: ModelConfig, w: Weights, xn: DeviceTensor, x: DeviceTensor) -> None:
    """``xn = rmsnorm(x) * token_embd_norm`` (LFM2's output norm under its stored name)."""
    build_norm(d, cfg, xn, x, w["token_embd_norm"])


LFM2 = Architecture(name="lfm2", tensors=TENSORS, rope_mode=ROPE_NEOX, hparams=hparams, block=block,
                    scratch=scratch, final_norm=final_norm, state_widths=state_widths)
