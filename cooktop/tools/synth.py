"""Synthetic GGUF files with random weights, in the shapes of real models.

So benchmarks need no downloads: ``cooktop synth --shape tinyllama-1.1b --type Q4_0 -o x.gguf``.
The tensors are those the architecture declares (``model/arch/<arch>.py``, llama by
default), every one of them (optional ones included) except a tied ``output``.
Weights are Gaussian (std 0.02; norms 1.0; biases Gaussian std 0.02 in F32) quantized with ``gguf.quants.quantize``
where the gguf package can (F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1); K-quants are
random valid blocks (``format/quants.py``). ``Q4_K_M`` follows llama.cpp's
mixture (src/llama-quant.cpp): Q6_K for ``output`` and for ``attn_v`` /
``ffn_down`` of the blocks where ``use_more_bits`` holds, Q4_K elsewhere.
The vocabulary is SPM-shaped: ``<unk> <s> </s>``, 256 byte tokens
``<0x00>..<0xFF>``, then ``n_vocab - 259`` distinct pieces with descending scores;
or, with ``vocab=`` (``--vocab``), every ``tokenizer.*`` key of a vocabulary GGUF
(``../shared/vocab/ggml-vocab-qwen2.gguf``...), n_vocab becoming its token count.

Optional tensors that change the numbers are written with values that exercise them:
per-head Q/K norm weights (``attn_q_norm``, ``attn_k_norm``) and gemma3's post norms are
``1 + N(0, 0.1)``; the expert selection bias (``exp_probs_b``, glm4moe) N(0, 0.1); phi3's LongRoPE
factors (``Shape.long_rope``) rise from 1 to 16 (long) and from 1 to 1.5 (short);
lfm2's convolution kernels (``shortconv.conv``) are N(0, 0.5) taps and its per-layer
``attention.head_count_kv`` is 0 on the blocks not in ``Shape.attn_layers``;
Llama 3.1's ``rope_freqs`` is written only when the shape asks (``Shape.rope_freqs``),
with the factors llama.cpp's converter computes for Llama 3.1 (factor 8, low/high
frequency factors 1 and 4, original context 8192).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import string
import tempfile
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, ExpertGatingFuncType, GGUFValueType, GGUFWriter, TokenType
from gguf import GGMLQuantizationType as T

from ..errors import CooktopError
from ..format.gguf import read_raw_metadata
from ..format.quants import random_weight
from ..model.arch import architecture
from ..model.arch.base import BIAS, MATRIX
from ..model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Shape:
    """Hyperparameters of a synthetic model (llama.cpp names)."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int = 2048
    rope_freq_base: float = 10000.0
    tied: bool = False
    #: attention.key_length when set (n_head * head_dim may then differ from n_embd: qwen3)
    head_dim: int | None = None
    #: rope.scaling.type written when set (``linear``, ``yarn``, ``none``)
    rope_scaling: str | None = None
    #: rope.scaling.factor written when set (alone: llama.cpp's default type, linear)
    rope_scaling_factor: float | None = None
    #: rope.scaling.original_context_length written when set
    n_ctx_orig: int | None = None
    #: write Llama 3.1's rope_freqs tensor (llama only)
    rope_freqs: bool = False
    #: the architecture a named shape is of (``write``'s default)
    arch: str = "llama"
    #: gemma3: attention.sliding_window written when set (tokens; the SWA layers' window)
    n_swa: int | None = None
    #: gemma3: attention.sliding_window_pattern written when set (period; llama.cpp's default 6)
    swa_pattern: int | None = None
    #: gemma3: rope.freq_base_swa written when set (rope base of the SWA layers)
    rope_freq_base_swa: float | None = None
    #: phi3: write LongRoPE factors (rope_factors_long/short) and rope.scaling.attn_factor
    long_rope: bool = False
    #: mixture of experts (qwen3moe, qwen2moe, olmoe, gpt-oss): expert_count, expert_used_count
    n_expert: int = 0
    n_expert_used: int = 0
    #: expert_feed_forward_length (default n_ff / n_expert_used, llama.cpp's)
    n_ff_exp: int | None = None
    #: expert_shared_feed_forward_length (qwen2moe's shared expert; default n_ff)
    n_ff_shexp: int | None = None
    #: a hybrid (lfm2): the attention blocks (indices >= n_layer ignored, so ``--n-layer`` keeps the
    #: pattern's start); the other blocks are recurrent (head_count_kv 0 in the file's per-layer array)
    attn_layers: tuple[int, ...] = ()
    #: lfm2: shortconv.l_cache; qwen35: ssm.conv_kernel (the convolution's kernel length)
    n_conv: int = 0
    #: qwen35: full_attention_interval (every n-th block attends, the others are linear attention);
    #: written in place of a per-layer head_count_kv
    full_attention_interval: int = 0
    #: qwen35's gated delta-net: head width (ssm.state_size), key heads (ssm.group_count), value heads
    #: (ssm.time_step_rank); ssm.inner_size is value heads x head width
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    #: rope.dimension_count when set (partial rotary: qwen35 rotates a quarter of each head)
    n_rot: int | None = None
    #: rope.dimension_sections written when set (qwen35's multi-section rope, 4 values)
    rope_sections: tuple[int, ...] = ()
    #: Mamba-2 (granitehybrid, mamba2): ssm.inner_size (heads x head width); 0: ssm_dt_rank x ssm_d_state
    #: (qwen35's); its ssm_d_state is the state size, ssm_n_group the groups, ssm_dt_rank the heads
    ssm_d_inner: int = 0
    #: Granite's multipliers (granitehybrid): embedding_scale, residual_scale, attention.scale and
    #: logit_scale, each written when set
    embedding_scale: float | None = None
    residual_scale: float | None = None
    attention_scale: float | None = None
    logit_scale: float | None = None
    #: rope.scaling.finetuned written when set (granitehybrid: False = attention without rope, Granite 4.0-H)
    rope_finetuned: bool | None = None
    #: of alternative tensor layouts (``TensorSpec.layout``: qwen3next's ``ssm_in`` or ``attn_qkv``), the
    #: one written; "": the first the architecture declares
    layout: str = ""
    #: qwen35 / qwen35moe: multi-token-prediction blocks after the trunk (``nextn_predict_layers``; 0 or 1):
    #: block ``n_layer`` is then a gated-attention block with the ``nextn.*`` tensors (``model/mtp.py``),
    #: ``block_count`` = n_layer + n_nextn
    n_nextn: int = 0
    #: mistral3: attention.temperature_scale (the Llama-4-style attention temperature's beta) written when set
    attn_temp_scale: float | None = None
    #: mistral3: rope.scaling.yarn_log_multiplier (YaRN's mscale_all_dim) written when set
    yarn_log_mul: float | None = None
    #: gemma4: attention.key_length_swa (the sliding-window layers' head width; head_dim is the full
    #: layers'); default head_dim
    head_dim_swa: int | None = None
    #: gemma4: rope.dimension_count_swa (default head_dim_swa)
    n_rot_swa: int | None = None
    #: gemma4: attention.shared_kv_layers (the last blocks read earlier blocks' K/V)
    n_kv_shared: int = 0
    #: gemma4: embedding_length_per_layer_input (0: no per-layer inputs)
    n_embd_per_layer: int = 0
    #: gemma4: twice n_ff on the shared-KV blocks (use_double_wide_mlp; a per-layer feed_forward_length)
    double_wide: bool = False
    #: gemma4: KV heads of the full-attention layers (a per-layer head_count_kv) when set
    n_head_kv_full: int | None = None
    #: gemma4: no attn_v on the full-attention layers (attention_k_eq_v: V is K)
    k_eq_v: bool = False
    #: gemma4: the full-attention layers' rotated fraction (proportional rope: rope_freqs of 1 for the
    #: rotated pairs, 1e30 for the others)
    rope_partial_full: float = 1.0
    #: gemma4: blk.N.layer_output_scale tensors written
    out_scales: bool = False
    #: final_logit_softcapping written when set
    final_logit_softcap: float | None = None
    #: glm4moe: expert_shared_count (the ungated shared expert is that many experts wide)
    n_expert_shared: int = 0
    #: glm4moe: leading_dense_block_count (the first blocks have a dense FFN of n_ff)
    n_dense_lead: int = 0
    #: glm4moe: expert_weights_scale (routed_scaling_factor) and expert_weights_norm written when set
    expert_weights_scale: float | None = None
    expert_weights_norm: bool | None = None
    #: write the architecture's optional per-head Q/K norms (glm4moe: GLM-4.5 355B has them, the Air not)
    qk_norm: bool = True
    #: control tokens written as the vocabulary's last entries (e.g. Gemma 3's ``<start_of_image>``
    #: and ``<end_of_image>``, which llama.cpp's mtmd tokenizes around an image)
    control_tokens: tuple[str, ...] = ()

    def swa_layers(self) -> tuple[bool, ...]:
        """Per block, True when it is a sliding-window layer (period :attr:`swa_pattern`: the last
        block of each period attends fully); () without a window."""
        if self.n_swa is None:
            return ()
        n = self.swa_pattern if self.swa_pattern is not None else 6
        return tuple(n == 0 or i % n < n - 1 for i in range(self.n_layer))

    def gemma4_layers(self) -> dict[str, Any]:
        """The per-layer ``ModelConfig`` fields of a gemma4 shape (head widths, KV heads, feed-forward
        widths, KV sharing, per-layer input width)."""
        swa = self.swa_layers() or (False,) * self.n_layer
        n_kv = self.n_layer - self.n_kv_shared if self.n_kv_shared else 0
        ff = tuple(self.n_ff * (2 if self.double_wide and n_kv and i >= n_kv else 1) for i in range(self.n_layer))
        kvh = tuple(self.n_head_kv if w else (self.n_head_kv_full or self.n_head_kv) for w in swa)
        head_dim = self.head_dim or self.n_embd // self.n_head
        return dict(swa_layers=swa, n_swa=self.n_swa or 0, head_dim_swa=self.head_dim_swa or head_dim,
                    n_rot_swa=self.n_rot_swa or self.head_dim_swa or head_dim,
                    n_ff_layers=ff if len(set(ff)) > 1 else (), n_ff=max(ff),
                    n_head_kv_layers=kvh if len(set(kvh)) > 1 else (), n_head_kv=max(kvh), n_layer_kv=n_kv,
                    n_embd_per_layer=self.n_embd_per_layer, attn_scale=1.0)

    def recurrent_layers(self) -> tuple[bool, ...]:
        """Per block, True when it is recurrent (a hybrid: not in :attr:`attn_layers`, or with
        :attr:`full_attention_interval` not an interval-th block); () otherwise."""
        if self.full_attention_interval:
            return tuple((i + 1) % self.full_attention_interval != 0 for i in range(self.n_layer))
        if not self.n_conv:
            return ()
        return tuple(i not in self.attn_layers for i in range(self.n_layer))


#: Named shapes with the dimensions and GQA ratios of the real models.
SHAPES: dict[str, Shape] = {
    "stories15m": Shape(288, 6, 6, 6, 768, 32000, 256),
    "smollm-135m": Shape(576, 30, 9, 3, 1536, 49152, 2048, 10000.0, tied=True),
    "tinyllama-1.1b": Shape(2048, 22, 32, 4, 5632, 32000, 2048),
    "llama-3.2-1b": Shape(2048, 16, 32, 8, 8192, 128256, 131072, 500000.0, tied=True, rope_freqs=True),
    "qwen2.5-0.5b": Shape(896, 24, 14, 2, 4864, 151936, 32768, 1000000.0, tied=True, arch="qwen2"),
    "qwen3-0.6b": Shape(1024, 28, 16, 8, 3072, 151936, 40960, 1000000.0, tied=True, head_dim=128, arch="qwen3"),
    # mixtures of experts: the real per-layer dimensions (pick fewer blocks with --n-layer)
    "qwen3-30b-a3b": Shape(2048, 48, 32, 4, 6144, 151936, 40960, 1000000.0, head_dim=128, arch="qwen3moe",
                           n_expert=128, n_expert_used=8, n_ff_exp=768),
    "qwen1.5-moe-a2.7b": Shape(2048, 24, 16, 16, 5632, 151936, 8192, 1000000.0, arch="qwen2moe",
                               n_expert=60, n_expert_used=4, n_ff_exp=1408, n_ff_shexp=5632),
    "olmoe-1b-7b": Shape(2048, 16, 16, 16, 1024, 50304, 4096, 10000.0, arch="olmoe", n_expert=64,
                         n_expert_used=8, n_ff_exp=1024),
    "gpt-oss-20b": Shape(2880, 24, 64, 8, 2880, 201088, 131072, 150000.0, head_dim=64, arch="gpt-oss",
                         rope_scaling="yarn", rope_scaling_factor=32.0, n_ctx_orig=4096, n_swa=128,
                         n_expert=32, n_expert_used=4, n_ff_exp=2880),
    # hybrids: LFM2-1.2B (HF config: 16 blocks, layer_types with full attention at 2, 5, 8, 10, 12, 14,
    # conv_L_cache 3, block_ff_dim 12288 auto-adjusted to 8192)
    "lfm2-1.2b": Shape(2048, 16, 32, 8, 8192, 65536, 128000, 1000000.0, tied=True, arch="lfm2",
                       attn_layers=(2, 5, 8, 10, 12, 14), n_conv=3),
    # Qwen3.5 (HF configs: every 4th block full attention, head_dim 256 with a quarter rotated,
    # mrope_section 11/11/10, conv kernel 4, linear heads 128 wide)
    "qwen3.5-0.8b": Shape(1024, 24, 8, 2, 3584, 248320, 262144, 10000000.0, tied=True, head_dim=256, arch="qwen35",
                          n_conv=4, full_attention_interval=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=16,
                          n_rot=64, rope_sections=(11, 11, 10, 0)),
    "qwen3.5-9b": Shape(4096, 32, 16, 4, 12288, 248320, 262144, 10000000.0, head_dim=256, arch="qwen35",
                        n_conv=4, full_attention_interval=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=32,
                        n_rot=64, rope_sections=(11, 11, 10, 0)),
    # Granite 4.0-H (granitehybrid; HF configs as IBM publishes them: 40 blocks, 4 of them attention, in
    # groups of 9 Mamba-2 blocks and one attention block (the files' layer_types give the exact indices;
    # these presets put attention at 9, 19, 29, 39), NoPE attention, Mamba-2 heads of 64 with a state of
    # 128 in one group, conv kernel 4, expand 2 (ssm.inner_size = 2 n_embd), vocabulary 100352, and the
    # Granite multipliers). H-Micro: dense, 2048 wide, 32 heads (8 KV), FFN 8192
    "granite-4.0-h-micro": Shape(2048, 40, 32, 8, 8192, 100352, 131072, 10000.0, arch="granitehybrid",
                                 attn_layers=(9, 19, 29, 39), n_conv=4, ssm_d_state=128, ssm_n_group=1,
                                 ssm_dt_rank=64, ssm_d_inner=4096, embedding_scale=12.0, residual_scale=0.246,
                                 attention_scale=0.0078125, logit_scale=8.0, rope_finetuned=False),
    # H-Tiny (7B, 1B active): 1536 wide, 12 heads (4 KV), 64 experts of 512 with 6 used and a shared
    # expert of 1024; 48 Mamba-2 heads
    "granite-4.0-h-tiny": Shape(1536, 40, 12, 4, 512, 100352, 131072, 10000.0, arch="granitehybrid",
                                attn_layers=(9, 19, 29, 39), n_conv=4, ssm_d_state=128, ssm_n_group=1,
                                ssm_dt_rank=48, ssm_d_inner=3072, n_expert=64, n_expert_used=6, n_ff_exp=512,
                                n_ff_shexp=1024, embedding_scale=12.0, residual_scale=0.22,
                                attention_scale=0.0078125, logit_scale=6.0, rope_finetuned=False),
    # Mamba-2 2.7B (state-spaces/mamba2-2.7b: 64 blocks, 2560 wide, expand 2, heads of 64, state 128, one
    # group, conv kernel 4; vocabulary 50288 padded)
    "mamba2-2.7b": Shape(2560, 64, 1, 1, 1, 50288, 1048576, arch="mamba2", n_conv=4, ssm_d_state=128,
                         ssm_n_group=1, ssm_dt_rank=80, ssm_d_inner=5120, tied=True),
    # Qwen3.6-35B-A3B (qwen35moe): 40 blocks, 256 experts of 512, 8 used, a shared expert of 512
    "qwen3.6-35b-a3b": Shape(2048, 40, 16, 2, 512, 248320, 262144, 10000000.0, head_dim=256, arch="qwen35moe",
                             n_conv=4, full_attention_interval=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=32,
                             n_rot=64, rope_sections=(11, 11, 10, 0), n_expert=256, n_expert_used=8, n_ff_exp=512,
                             n_ff_shexp=512),
    # Qwen3-Next-80B-A3B (qwen3next): 48 blocks (every 4th attends), 512 experts of 512, 10 used, a shared
    # expert of 512; 16 key heads and 32 value heads of 128 in the linear attention; a quarter of each
    # attention head rotated (NeoX rope)
    "qwen3-next-80b-a3b": Shape(2048, 48, 16, 2, 5120, 151936, 262144, 10000000.0, head_dim=256, arch="qwen3next",
                                n_conv=4, full_attention_interval=4, ssm_d_state=128, ssm_n_group=16,
                                ssm_dt_rank=32, n_rot=64, n_expert=512, n_expert_used=10, n_ff_exp=512,
                                n_ff_shexp=512),
    # dense llama relatives. SmolLM3-3B (HF config: 36 blocks, 16 heads, 4 KV, FFN 11008, rope theta 5e6,
    # every 4th block without rope, tied embeddings)
    "smollm3-3b": Shape(2048, 36, 16, 4, 11008, 128256, 65536, 5000000.0, tied=True, arch="smollm3"),
    # Mistral Small 3.2 24B's text model (mistral3: 40 blocks, 5120 wide, 32 heads of 128, 8 KV, FFN 32768)
    "mistral-small-3.2-24b": Shape(5120, 40, 32, 8, 32768, 131072, 131072, 1000000000.0, head_dim=128,
                                   arch="mistral3"),
    # Ministral 3 3B (mistral3 with YaRN x16 from 16384 and the attention temperature, beta 0.1)
    "ministral-3-3b": Shape(3072, 26, 32, 8, 9216, 131072, 262144, 1000000.0, tied=True, head_dim=128,
                            arch="mistral3", rope_scaling="yarn", rope_scaling_factor=16.0, n_ctx_orig=16384,
                            attn_temp_scale=0.1, yarn_log_mul=1.0),
    # GLM-4-9B-0414 (glm4: 40 blocks, 32 heads of 128, 2 KV, FFN 13696, half of each head rotated)
    "glm-4-9b": Shape(4096, 40, 32, 2, 13696, 151552, 32768, 10000.0, head_dim=128, arch="glm4", n_rot=64),
    # GLM-4.5-Air (glm4moe; HF config: 46 blocks, 4096 wide, 96 heads of 128 with half rotated (NeoX), 8 KV,
    # Q/K/V biases, no Q/K norm, block 0 dense (FFN 10944), 128 experts of 1408 with 8 used (sigmoid router,
    # selection bias, top-k renormalised, scale 1) and one shared expert; the file's MTP block not written)
    "glm-4.5-air": Shape(4096, 46, 96, 8, 10944, 151552, 131072, 1000000.0, head_dim=128, arch="glm4moe", n_rot=64,
                         n_expert=128, n_expert_used=8, n_ff_exp=1408, n_expert_shared=1, n_dense_lead=1,
                         expert_weights_scale=1.0, expert_weights_norm=True, qk_norm=False),
    # Gemma 3 4B (gemma3; HF text_config: 34 blocks, 5 sliding-window (1024) then 1 full, 8 heads of 256
    # (4 KV), rope bases 1e6 / 10000 on the sliding layers, tied embeddings; the global rope's linear
    # scaling of 8 is left out)
    "gemma-3-4b": Shape(2560, 34, 8, 4, 10240, 262208, 131072, 1000000.0, tied=True, head_dim=256, arch="gemma3",
                        n_swa=1024, swa_pattern=6, rope_freq_base_swa=10000.0),
    # Gemma 4 E2B (gemma4; HF text_config: 35 blocks, 4 sliding-window (512) then 1 full, heads of 256 on
    # the sliding layers and 512 on the full ones (a quarter rotated: proportional rope), 1 KV head, the last
    # 20 blocks reading earlier blocks' K/V with a double-wide MLP (2 x 6144), per-layer inputs of 256,
    # final logit soft-cap 30, tied embeddings)
    "gemma-4-e2b": Shape(1536, 35, 8, 1, 6144, 262144, 131072, 1000000.0, tied=True, head_dim=512, arch="gemma4",
                         n_swa=512, swa_pattern=5, rope_freq_base_swa=10000.0, head_dim_swa=256, n_kv_shared=20,
                         n_embd_per_layer=256, double_wide=True, rope_partial_full=0.25, out_scales=True,
                         final_logit_softcap=30.0),
    # Gemma 4 26B-A4B (gemma4 with experts; HF text_config: 30 blocks, 5 sliding-window (1024) then 1 full,
    # 16 heads of 256 (8 KV) on the sliding layers and of 512 (2 KV, V = K, a quarter rotated) on the full
    # ones, a dense MLP of 2112 beside 128 experts of 704 (8 used) in every block, soft-cap 30, tied)
    "gemma-4-26b-a4b": Shape(2816, 30, 16, 8, 2112, 262144, 262144, 1000000.0, tied=True, head_dim=512,
                             arch="gemma4", n_swa=1024, swa_pattern=6, rope_freq_base_swa=10000.0, head_dim_swa=256,
                             n_head_kv_full=2, k_eq_v=True, rope_partial_full=0.25, out_scales=True,
                             final_logit_softcap=30.0, n_expert=128, n_expert_used=8, n_ff_exp=704),
}

#: ``--type`` values: a GGML type for every 2-D weight, or a llama.cpp mixture.
FILE_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
              "Q4_K_M", "MXFP4_MOE")

#: llama_ftype values for general.file_type (llama.h).
_FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 15, "Q5_K": 17,
          "Q6_K": 18, "Q2_K": 10, "Q3_K": 11, "Q4_K_M": 15, "MXFP4_MOE": 38}

#: Tensors llama.cpp's quantizer leaves in F32 whatever the file type (llama-quant.cpp: the router).
_KEEP_F32 = ("ffn_gate_inp", "ffn_gate_inp_shexp")


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of blocks that get more bits in the _M mixtures (llama-quant.cpp)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(file_type: str, name: str, layer: int | None, n_layer: int) -> T:
    """GGML type of tensor ``name`` in a file of ``file_type``. The router (``ffn_gate_inp``) stays F32
    as llama.cpp's quantizer leaves it; ``MXFP4_MOE`` (llama.cpp's): MXFP4 experts, Q8_0 elsewhere;
    in ``Q4_K_M``, ``ffn_down_exps`` gets more bits where ``ffn_down`` would (llama-quant.cpp
    matches the name by prefix)."""
    if name in _KEEP_F32:
        return T.F32
    if file_type == "MXFP4_MOE":
        return T.MXFP4 if name.endswith("_exps") else T.Q8_0
    if file_type != "Q4_K_M":
        return T[file_type]
    if name == "output":
        return T.Q6_K
    if name in ("attn_v", "ffn_down", "ffn_down_exps") and layer is not None and use_more_bits(layer, n_layer):
        return T.Q6_K
    return T.Q4_K


def vocab(n_vocab: int, control: tuple[str, ...] = ()) -> tuple[list[str], list[float], list[int]]:
    """SPM-shaped tokens, scores and token types (llama.cpp TokenType values); the ``control``
    strings replace the last pieces, as CONTROL tokens (score 0)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    letters = string.ascii_lowercase
    pieces = itertools.chain(
        ("\u2581" + c for c in letters), iter(letters + string.digits + string.punctuation),
        ("\u2581" + "".join(p) for k in itertools.count(2) for p in itertools.product(letters, repeat=k)))
    need = n_vocab - len(tokens)
    tokens += list(itertools.islice(pieces, need))
    types += [TokenType.NORMAL] * need
    scores = [0.0] * 259 + [-float(i) for i in range(need)]
    for i, c in enumerate(control):
        j = n_vocab - len(control) + i
        tokens[j], types[j], scores[j] = c, TokenType.CONTROL, 0.0
    return tokens, scores, [int(t) for t in types]


#: Vocabulary entries before the ordinary pieces: <unk> <s> </s> and 256 byte tokens.
N_SPECIAL_VOCAB = 259


def config(s: Shape, arch: str | None = None) -> ModelConfig:
    """The :class:`ModelConfig` a file written from ``s`` will have (n_rot = head_dim, which is
    ``s.head_dim`` or n_embd / n_head); rope scaling fields as ``load_config`` derives them."""
    a = architecture(arch or s.arch)
    head_dim = s.head_dim or s.n_embd // s.n_head
    moe = s.n_expert > 0
    gdn: dict[str, Any] = dict(ssm_d_state=s.ssm_d_state, ssm_n_group=s.ssm_n_group, ssm_dt_rank=s.ssm_dt_rank,
               ssm_d_inner=s.ssm_d_inner or s.ssm_dt_rank * s.ssm_d_state, rope_sections=s.rope_sections)
    granite = a.name == "granitehybrid"  # its experts are feed_forward_length wide, its shared expert optional
    if a.name == "gemma4":
        g4 = s.gemma4_layers()
        s = dataclasses.replace(s, n_ff=g4.pop("n_ff"), n_head_kv=g4.pop("n_head_kv"))
        gdn.update(g4)
    return ModelConfig(arch=a.name, n_vocab=s.n_vocab, n_ctx_train=s.n_ctx_train, n_embd=s.n_embd,
                       n_layer=s.n_layer, n_head=s.n_head, n_head_kv=s.n_head_kv, n_ff=s.n_ff,
                       n_rot=s.n_rot or head_dim,
                       head_dim=head_dim, rope_freq_base=s.rope_freq_base, rms_eps=1e-5, rope_mode=a.rope_mode,
                       tied_output=s.tied, n_expert=s.n_expert, n_expert_used=s.n_expert_used,
                       n_ff_exp=(s.n_ff if granite else s.n_ff_exp or s.n_ff // max(1, s.n_expert_used))
                       if moe else 0,
                       n_ff_shexp=(s.n_ff_exp or s.n_ff // max(1, s.n_expert_used)) * s.n_expert_shared
                       if a.name == "glm4moe" else
                       ((s.n_ff_shexp or 0) if granite else (s.n_ff_shexp or s.n_ff)) if moe else 0,
                       n_layer_dense_lead=s.n_dense_lead if a.name == "glm4moe" else 0,
                       recurrent_layers=(True,) * s.n_layer if a.name == "mamba2" else s.recurrent_layers(),
                       n_conv=s.n_conv, **gdn)


def _plan(s: Shape, file_type: str, overrides: dict[str, T] | None, arch: str | None = None
          ) -> list[tuple[str, tuple[int, ...], T | None, str]]:
    """(tensor name, numpy-order shape, GGML type or None for F32, kind) of every tensor, in file order.

    Matrices get the file type's choice (:func:`tensor_type`), norm and bias weights None (F32),
    unless ``overrides`` names them. ``rope_freqs`` only when ``s.rope_freqs``.
    """
    cfg = config(s, arch)
    plan: list[tuple[str, tuple[int, ...], T | None, str]] = []
    a = architecture(arch or s.arch)
    layout = s.layout or next((t.layout for t in a.tensors if t.layout), "")
    for name, spec in a.expected(cfg):
        if spec.tied_to is not None and s.tied:
            continue
        if spec.layout and spec.layout != layout:
            continue
        if spec.key == "rope_freqs" and not s.rope_freqs and a.name != "gemma4":
            continue
        if a.name == "gemma4" and not _gemma4_writes(s, cfg, spec.key, name):
            continue
        if spec.key.startswith("rope_factors_") and not s.long_rope:
            continue
        if spec.key in ("attn_q_norm", "attn_k_norm") and not spec.required and not s.qk_norm:
            continue
        layer = int(name.split(".")[1]) if spec.per_block else None
        ty = tensor_type(file_type, spec.key, layer, s.n_layer) if spec.kind == MATRIX else None
        plan.append((name, a.shape_of(spec, cfg, name), ty, spec.kind))
    if s.n_nextn:
        plan += _mtp_plan(cfg, file_type, arch or s.arch)
    if overrides:
        plan = [(n, shp, T(overrides[n]) if n in overrides else ty, k) for n, shp, ty, k in plan]
    return plan


def _mtp_plan(cfg: ModelConfig, file_type: str, arch: str) -> list[tuple[str, tuple[int, ...], T | None, str]]:
    """The MTP block's tensors (block ``cfg.n_layer``; llama.cpp ``load_arch_tensors`` of qwen35 for the
    nextn layer): its attention block and feed-forward, ``nextn.enorm`` / ``hnorm`` and ``nextn.eh_proj``
    [n_embd, 2 n_embd] (the shared head is the trunk's: no ``shared_head_*`` written)."""
    from ..model.mtp import EH_PROJ, mtp_architecture, mtp_config  # noqa: PLC0415 (model imports tools)

    mcfg, il = mtp_config(cfg), cfg.n_layer
    out: list[tuple[str, tuple[int, ...], T | None, str]] = []
    for spec in mtp_architecture(architecture(arch)).tensors:
        if spec.per_block and spec.in_block(mcfg, il):
            ty = tensor_type(file_type, spec.key, il, mcfg.n_layer) if spec.kind == MATRIX else None
            out.append((spec.gguf_name(il), spec.shape(mcfg), ty, spec.kind))
    out.append((f"blk.{il}.{EH_PROJ}.weight", (cfg.n_embd, 2 * cfg.n_embd),
                tensor_type(file_type, "eh_proj", il, mcfg.n_layer), MATRIX))
    return out


def _gemma4_writes(s: Shape, cfg: ModelConfig, key: str, name: str) -> bool:
    """Whether a gemma4 file of ``s`` has tensor ``name`` (key ``key``): no K/V tensors in the shared-KV
    blocks, no ``attn_v`` in the full-attention blocks with :attr:`Shape.k_eq_v`, the per-layer input
    tensors only with :attr:`Shape.n_embd_per_layer`, the output scalars only with :attr:`Shape.out_scales`,
    ``rope_freqs`` only with a full-attention layer (``--n-layer`` below the pattern's period has none)."""
    il = int(name.split(".")[1]) if name.startswith("blk.") else None
    if key in ("attn_k", "attn_k_norm", "attn_v") and il is not None and not cfg.has_kv(il):
        return False
    if key == "attn_v" and il is not None and s.k_eq_v and not cfg.swa_layers[il]:
        return False
    if key.startswith("per_layer_") and not s.n_embd_per_layer:
        return False
    if key == "rope_freqs" and all(cfg.swa_layers):  # llama.cpp loads it with the first full-attention layer
        return False
    return key != "layer_output_scale" or s.out_scales


def llama3_rope_freqs(n_rot: int, freq_base: float, factor: float = 8.0, low_freq_factor: float = 1.0,
                      high_freq_factor: float = 4.0, old_context_len: int = 8192) -> np.ndarray:
    """Llama 3.1's rope frequency factors, f32 [n_rot / 2] (llama.cpp convert_hf_to_gguf.py,
    ``LlamaModel.generate_extra_tensors``: 1 for short wavelengths, ``factor`` for long ones,
    a smooth blend between)."""
    out = []
    low_wavelen, high_wavelen = old_context_len / low_freq_factor, old_context_len / high_freq_factor
    for i in range(0, n_rot, 2):
        wavelen = 2 * math.pi * freq_base ** (i / n_rot)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def validate(shape: Shape, file_type: str, overrides: dict[str, T] | None = None, arch: str | None = None,
             own_vocab: bool = True) -> None:
    """Check that ``shape`` makes a GGUF of ``arch`` (default ``shape.arch``) cooktop (and llama.cpp)
    can load, before writing.

    Rules: every dimension > 0; n_head divides n_embd (unless ``head_dim`` is given) and
    n_head_kv divides n_head; head_dim (n_embd / n_head by default) even (rope rotates pairs);
    n_vocab >= 260 with the synthetic vocabulary (``own_vocab``: 259 SPM special and byte
    tokens plus one piece); every row width (n_embd, n_ff) a multiple of the block size of
    the tensor's GGML type (GGML_QUANT_SIZES).

    Raises:
        CooktopError: unknown ``file_type`` or ``arch`` (UnsupportedModelError), or the first
            rule broken, in one line.
    """
    arch = arch or shape.arch
    architecture(arch)
    if file_type not in FILE_TYPES:
        raise CooktopError(f"unknown --type {file_type!r}; choose one of {', '.join(FILE_TYPES)}")
    s = shape
    for field in ("n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab", "n_ctx_train"):
        v = getattr(s, field)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise CooktopError(f"synthetic shape: {field} = {v!r} must be a positive integer")
    # an architecture of experts only (granitehybrid's experts are optional: its FFN is dense without them)
    moe_arch = arch == "glm4moe" or any(sp.key == "ffn_gate_inp" and sp.layers is None
                                        for sp in architecture(arch).tensors)
    if moe_arch and not 0 < s.n_expert_used <= s.n_expert:
        raise CooktopError(f"synthetic shape: {arch} needs 0 < n_expert_used ({s.n_expert_used}) <= "
                           f"n_expert ({s.n_expert})")
    if s.n_nextn and (arch not in ("qwen35", "qwen35moe", "glm4moe") or s.n_nextn != 1):
        raise CooktopError(f"synthetic shape: n_nextn = {s.n_nextn}: a multi-token-prediction block is written "
                           "for qwen35 / qwen35moe / glm4moe only, and one at most")
    if arch == "glm4moe" and not 0 <= s.n_dense_lead <= s.n_layer:
        raise CooktopError(f"synthetic shape: glm4moe's n_dense_lead = {s.n_dense_lead} must be in 0..n_layer "
                           f"({s.n_layer})")
    if arch in ("qwen35", "qwen35moe") and not (s.ssm_d_state > 0 and s.ssm_n_group > 0 and s.ssm_dt_rank > 0
                                 and s.ssm_dt_rank % s.ssm_n_group == 0 and s.full_attention_interval > 0
                                 and len(s.rope_sections) == 4):
        raise CooktopError(f"synthetic shape: {arch} needs ssm_d_state, ssm_n_group, ssm_dt_rank (a multiple of "
                           "ssm_n_group), full_attention_interval > 0 and four rope_sections")
    if arch == "qwen3next" and not (s.ssm_d_state > 0 and s.ssm_n_group > 0 and s.ssm_dt_rank > 0
                                    and s.ssm_dt_rank % s.ssm_n_group == 0 and s.full_attention_interval > 0
                                    and not s.rope_sections):
        raise CooktopError("synthetic shape: qwen3next needs ssm_d_state, ssm_n_group, ssm_dt_rank (a multiple of "
                           "ssm_n_group), full_attention_interval > 0 and no rope_sections (NeoX rope)")
    if arch == "gemma4":
        swa, n_kv = s.swa_layers() or (False,) * s.n_layer, s.n_layer - s.n_kv_shared
        if s.n_kv_shared and not (0 < s.n_kv_shared and n_kv >= 2 and not swa[n_kv - 1] and swa[n_kv - 2]):
            raise CooktopError(f"synthetic shape: gemma4's {s.n_kv_shared} shared-KV blocks of {s.n_layer} read blocks "
                               f"{n_kv - 2} (sliding-window) and {n_kv - 1} (full attention), as llama.cpp does; "
                               "the pattern must have them (--n-layer past both)")
        if (s.head_dim_swa or 2) % 2 or (s.n_head_kv_full and s.n_head % s.n_head_kv_full):
            raise CooktopError("synthetic shape: gemma4 needs an even head_dim_swa and n_head_kv_full dividing n_head")
        if s.n_expert and not (s.n_expert >= 2 and 0 < s.n_expert_used <= s.n_expert and (s.n_ff_exp or 0) > 0):
            raise CooktopError(f"synthetic shape: gemma4 with experts needs n_expert >= 2, 0 < n_expert_used "
                               f"({s.n_expert_used}) <= n_expert ({s.n_expert}) and n_ff_exp > 0 (its "
                               "expert_feed_forward_length is required)")
    layouts = {t.layout for t in architecture(arch).tensors if t.layout}
    if s.layout and s.layout not in layouts:
        raise CooktopError(f"synthetic shape: layout {s.layout!r} is not one of {arch}'s "
                           f"({', '.join(sorted(layouts)) or 'none'})")
    if arch in ("granitehybrid", "mamba2"):
        d_inner = s.ssm_d_inner or s.ssm_dt_rank * s.ssm_d_state
        if not (s.ssm_d_state > 0 and s.ssm_n_group > 0 and s.ssm_dt_rank > 0 and d_inner % s.ssm_dt_rank == 0
                and s.ssm_dt_rank % s.ssm_n_group == 0 and d_inner % s.ssm_n_group == 0):
            raise CooktopError(f"synthetic shape: {arch} needs ssm_d_state, ssm_n_group and ssm_dt_rank (heads: a "
                               "multiple of ssm_n_group, dividing ssm_d_inner) > 0")
    if architecture(arch).recurrent:
        if s.n_conv < 2:
            raise CooktopError(f"synthetic shape: {arch} needs n_conv (shortconv.l_cache) >= 2, not {s.n_conv}")
        if all(s.recurrent_layers()) and arch != "mamba2":
            raise CooktopError(f"synthetic shape: none of the {s.n_layer} blocks is an attention block "
                               f"(attn_layers {list(s.attn_layers)}); keep at least one")
    if s.head_dim is not None and (isinstance(s.head_dim, bool) or not isinstance(s.head_dim, int)
                                   or s.head_dim <= 0):
        raise CooktopError(f"synthetic shape: head_dim = {s.head_dim!r} must be a positive integer")
    if s.n_embd % s.n_head and s.head_dim is None:
        raise CooktopError(f"synthetic shape: n_head = {s.n_head} does not divide n_embd = {s.n_embd}")
    if s.n_head % s.n_head_kv:
        raise CooktopError(f"synthetic shape: n_head_kv = {s.n_head_kv} does not divide n_head = {s.n_head}")
    f = s.rope_scaling_factor
    if f is not None and not (isinstance(f, (int, float)) and math.isfinite(f) and f >= 0):
        raise CooktopError(f"synthetic shape: rope_scaling_factor = {f!r} must be a finite number >= 0 "
                           "(0 = no scaling), as the loader requires")
    head_dim = s.head_dim or s.n_embd // s.n_head
    if head_dim % 2:
        what = "head_dim" if s.head_dim else "head_dim = n_embd / n_head"
        raise CooktopError(f"synthetic shape: {what} = {head_dim} must be even (rope rotates pairs)")
    if own_vocab and s.n_vocab < N_SPECIAL_VOCAB + 1:
        raise CooktopError(f"synthetic shape: n_vocab = {s.n_vocab} must be >= {N_SPECIAL_VOCAB + 1} "
                           f"(<unk> <s> </s>, 256 byte tokens and at least one piece)")
    seen: set[tuple[int, T]] = set()
    for tname, shp, ty, _ in _plan(s, file_type, overrides, arch):
        if ty is None or (shp[-1], ty) in seen:
            continue
        seen.add((shp[-1], ty))
        block = GGML_QUANT_SIZES[ty][0]
        if shp[-1] % block:
            width = ("n_ff" if tname.endswith("ffn_down.weight") and len(shp) == 2 else
                     "n_ff_exp" if tname.endswith("ffn_down_exps.weight") else "n_embd")
            raise CooktopError(f"synthetic shape: {width} = {shp[-1]} ({tname}) is not a multiple of the "
                               f"{ty.name} block size {block}")


def _vector(values: np.ndarray, ty: T) -> tuple[np.ndarray, T | None]:
    """A norm or bias weight (float32 ``values``) in GGML type ``ty`` (F32, F16 or BF16) and the
    raw_dtype GGUFWriter needs."""
    if ty == T.F32:
        return values.astype(np.float32), None
    if ty == T.F16:
        return values.astype(np.float16), None
    if ty == T.BF16:  # bfloat16 = the high half of float32 (truncated)
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8), T.BF16
    raise CooktopError(f"norm and bias weights can be F32, F16 or BF16, not {ty.name}")


def _vocab_keys(path: str | os.PathLike) -> tuple[list[tuple[str, object, GGUFValueType, GGUFValueType | None]], int]:
    """The ``tokenizer.*`` keys of vocabulary GGUF ``path`` as (key, value, type, element type)
    for ``GGUFWriter.add_key_value``, and its token count.

    Raises:
        CooktopError: not a readable GGUF (GGUFError), or no ``tokenizer.ggml.tokens``.
    """
    raw = read_raw_metadata(path)
    toks = raw.get("tokenizer.ggml.tokens")
    if toks is None or not toks.value:
        raise CooktopError(f"{path}: no tokenizer.ggml.tokens: not a vocabulary GGUF")
    out = []
    for key, v in raw.items():
        if not key.startswith("tokenizer.") or v.value is None:
            continue
        value = v.value.tolist() if isinstance(v.value, np.ndarray) else v.value
        out.append((key, value, v.type, v.sub_type))
    return out, len(toks.value)


def write(path: str | os.PathLike, shape: Shape, file_type: str, seed: int = 0, name: str = "synthetic",
          overrides: dict[str, T] | None = None, arch: str | None = None,
          vocab: str | os.PathLike | None = None, scales: dict[str, float] | None = None) -> int:
    """Write a GGUF of architecture ``arch`` (default ``shape.arch``) with random weights; returns
    the parameter count.

    ``overrides`` maps a tensor name (e.g. ``blk.0.ffn_up.weight``) to a GGML type
    that replaces the file type's choice (tests use it to make mixed files; a norm
    weight may be F32, F16 or BF16). ``vocab`` is a vocabulary GGUF whose ``tokenizer.*``
    keys are copied (n_vocab becomes its token count). The shape is checked by
    :func:`validate` before anything is written; the file is written to a temporary name
    in the same folder and renamed on success, so a failure leaves no file behind.
    ``scales`` maps a matrix key (``attn_q``, ``ffn_up``...) to the standard deviation of its
    weights (default 0.02); tests sharpen attention with larger ``attn_q`` / ``attn_k`` so that
    positions (rope) visibly change the logits.

    Raises:
        CooktopError: unknown ``file_type`` or ``arch``, a bad shape (see :func:`validate`), a
            vocabulary that is not one, or the file cannot be written (OSError).
    """
    arch = arch or shape.arch
    vocab_keys = None
    if vocab is not None:
        vocab_keys, n_vocab = _vocab_keys(vocab)
        shape = dataclasses.replace(shape, n_vocab=n_vocab)
    validate(shape, file_type, overrides, arch, own_vocab=vocab_keys is None)
    path = os.fspath(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                   dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
        umask = os.umask(0)  # mkstemp makes 0600; give the file the mode open() would have
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    except OSError as e:
        raise CooktopError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        n_params = _write(tmp, shape, file_type, seed, name, overrides, arch, vocab_keys, scales or {})
        os.replace(tmp, path)
    except OSError as e:
        raise CooktopError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return n_params


#: Weight std by key where 0.02 would not do: the router's logits spread enough that the top-k
#: choice is clear of float32 rounding (no near ties between cooktop and llama.cpp).
_SCALES = {"ffn_gate_inp": 0.25}


def _write(path: str, s: Shape, file_type: str, seed: int, name: str, overrides: dict[str, T] | None,
           arch: str, vocab_keys: list | None = None, scales: dict[str, float] | None = None) -> int:
    """Body of :func:`write` for a validated shape; writes ``path`` directly."""
    rng = np.random.default_rng(seed)
    cfg = config(s, arch)
    w = GGUFWriter(path, arch)
    w.add_name(name)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer + s.n_nextn)
    if s.n_nextn:
        w.add_uint32(f"{arch}.nextn_predict_layers", s.n_nextn)
    attention_free = arch == "mamba2"  # conversion/mamba.py writes 0 heads and no feed-forward
    g4 = s.gemma4_layers() if arch == "gemma4" else {}
    if g4.get("n_ff_layers"):
        w.add_feed_forward_length(list(g4["n_ff_layers"]))
    else:
        w.add_feed_forward_length(0 if attention_free else s.n_ff)
    w.add_head_count(0 if attention_free else s.n_head)
    recr = s.recurrent_layers()
    per_layer_kv = bool(recr) and not s.full_attention_interval  # lfm2 marks its recurrent blocks so
    if g4.get("n_head_kv_layers"):
        w.add_head_count_kv(list(g4["n_head_kv_layers"]))
    elif not attention_free:
        w.add_head_count_kv([0 if r else s.n_head_kv for r in recr] if per_layer_kv else s.n_head_kv)
    if g4:  # gemma4's keys (conversion/gemma.py Gemma4Model.set_gguf_parameters)
        w.add_uint32(f"{arch}.attention.shared_kv_layers", s.n_kv_shared)
        w.add_uint32(f"{arch}.embedding_length_per_layer_input", s.n_embd_per_layer)
        w.add_uint32(f"{arch}.attention.key_length_swa", g4["head_dim_swa"])
        w.add_uint32(f"{arch}.attention.value_length_swa", g4["head_dim_swa"])
        w.add_uint32(f"{arch}.rope.dimension_count_swa", g4["n_rot_swa"])
        w.add_array(f"{arch}.attention.sliding_window_pattern", list(g4["swa_layers"]))
    if s.final_logit_softcap is not None:
        w.add_float32(f"{arch}.final_logit_softcapping", s.final_logit_softcap)
    if s.full_attention_interval:
        w.add_uint32(f"{arch}.full_attention_interval", s.full_attention_interval)
    if s.ssm_d_state:
        w.add_uint32(f"{arch}.ssm.conv_kernel", s.n_conv)
        w.add_uint32(f"{arch}.ssm.inner_size", s.ssm_d_inner or s.ssm_dt_rank * s.ssm_d_state)
        w.add_uint32(f"{arch}.ssm.state_size", s.ssm_d_state)
        w.add_uint32(f"{arch}.ssm.time_step_rank", s.ssm_dt_rank)
        w.add_uint32(f"{arch}.ssm.group_count", s.ssm_n_group)
    elif s.n_conv:
        w.add_uint32(f"{arch}.shortconv.l_cache", s.n_conv)
    if s.rope_sections:
        w.add_array(f"{arch}.rope.dimension_sections", list(s.rope_sections))
    for key, v in (("embedding_scale", s.embedding_scale), ("residual_scale", s.residual_scale),
                   ("attention.scale", s.attention_scale), ("logit_scale", s.logit_scale)):
        if v is not None:
            w.add_float32(f"{arch}.{key}", v)
    if s.attn_temp_scale is not None:
        w.add_float32(f"{arch}.attention.temperature_scale", s.attn_temp_scale)
    if s.yarn_log_mul is not None:
        w.add_float32(f"{arch}.rope.scaling.yarn_log_multiplier", s.yarn_log_mul)
    if s.rope_finetuned is not None:
        w.add_bool(f"{arch}.rope.scaling.finetuned", s.rope_finetuned)
    if s.head_dim is not None:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    if not attention_free:
        w.add_rope_dimension_count(cfg.n_rot)
    w.add_rope_freq_base(s.rope_freq_base)
    if s.rope_scaling is not None:
        w.add_string(f"{arch}.rope.scaling.type", s.rope_scaling)
    if s.rope_scaling_factor is not None:
        w.add_float32(f"{arch}.rope.scaling.factor", s.rope_scaling_factor)
    if s.n_ctx_orig is not None:
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", s.n_ctx_orig)
    if s.n_swa is not None or g4:  # gemma4 always has one (llama.cpp requires the key)
        w.add_uint32(f"{arch}.attention.sliding_window", s.n_swa or 0)
    if s.swa_pattern is not None and not g4:
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", s.swa_pattern)
    if s.rope_freq_base_swa is not None:
        w.add_float32(f"{arch}.rope.freq_base_swa", s.rope_freq_base_swa)
    if s.long_rope:  # conversion/phi.py: sqrt(1 + ln(scale) / ln(n_ctx_orig)) for LongRoPE
        scale = s.n_ctx_train / (s.n_ctx_orig or s.n_ctx_train)
        w.add_float32(f"{arch}.rope.scaling.attn_factor",
                      math.sqrt(1 + math.log(scale) / math.log(s.n_ctx_orig or s.n_ctx_train)) if scale > 1 else 1.0)
    if s.n_expert:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
        if arch != "granitehybrid":  # its experts are feed_forward_length wide
            w.add_expert_feed_forward_length(cfg.n_ff_exp)
        if s.n_ff_shexp is not None:
            w.add_expert_shared_feed_forward_length(s.n_ff_shexp)
    if arch == "glm4moe":  # conversion/glm.py Glm4MoeModel.set_gguf_parameters
        w.add_expert_shared_count(s.n_expert_shared)
        w.add_leading_dense_block_count(s.n_dense_lead)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    if s.expert_weights_scale is not None:
        w.add_expert_weights_scale(s.expert_weights_scale)
    if s.expert_weights_norm is not None:
        w.add_expert_weights_norm(s.expert_weights_norm)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(_FTYPE[file_type])
    if vocab_keys is not None:
        for key, value, vtype, sub_type in vocab_keys:
            w.add_key_value(key, value, vtype, sub_type)
    else:
        tokens, scores, types = vocab(s.n_vocab, s.control_tokens)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    n_params = 0
    for tname, shp, ty, kind in _plan(s, file_type, overrides, arch):
        n_params += int(np.prod(shp))
        if kind != MATRIX:  # norm weights: ones (per-head Q/K norms: 1 + N(0, 0.1)); biases: Gaussian
            if tname == "rope_freqs.weight" and g4:  # proportional rope: unrotated pairs get 1e30
                n_rot = int(cfg.head_dim * s.rope_partial_full / 2)
                values = np.array([1.0] * n_rot + [1e30] * (shp[0] - n_rot))
            elif tname.endswith("layer_output_scale.weight"):
                values = rng.uniform(0.5, 1.0, shp)
            elif tname.endswith("ffn_down_exps.scale"):  # gemma4's per-expert scale: a vector in the file
                values = rng.uniform(0.5, 1.5, shp[:1])
            elif tname.endswith("ffn_gate_inp.scale"):  # gemma4's router input scale: logits of unit-RMS inputs
                values = np.sqrt(shp[0]) * rng.uniform(0.5, 1.5, shp)
            elif tname == "rope_freqs.weight":
                values = llama3_rope_freqs(cfg.n_rot, s.rope_freq_base)
            elif tname in ("rope_factors_long.weight", "rope_factors_short.weight"):  # LongRoPE-like
                values = (np.linspace(1.0, 16.0, shp[0]) if "long" in tname else 1.0 + np.linspace(0.0, 0.5, shp[0]))
            elif tname.endswith("exp_probs_b.bias"):  # the selection bias: enough to change choices
                values = rng.normal(0.0, 0.1, shp)
            elif kind == BIAS:
                values = rng.normal(0.0, 0.02, shp)
            elif tname.endswith("attn_sinks.weight"):  # a logit per head: N(0, 1)
                values = rng.normal(0.0, 1.0, shp)
            elif tname.endswith(("shortconv.conv.weight", "ssm_conv1d.weight")):  # a kernel: N(0, 0.5) taps
                values = rng.normal(0.0, 0.5, shp)
            elif tname.endswith(".ssm_a"):  # -exp(A_log): a decay rate per head, -U(0.05, 1)
                values = -rng.uniform(0.05, 1.0, shp)
            elif g4 and tname.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
                # gemma4 attends with scale 1: q/k norm weights of head_dim^-1/4 give scores of the usual spread
                values = (1.0 + rng.normal(0.0, 0.1, shp)) * shp[0] ** -0.25
            elif tname.endswith(("attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                                  "post_ffw_norm.weight", "ssm_norm.weight", ".ssm_d", ".post_norm.weight",
                                  "per_layer_proj_norm.weight", "pre_ffw_norm_2.weight", "post_ffw_norm_1.weight",
                                  "post_ffw_norm_2.weight")):
                values = 1.0 + rng.normal(0.0, 0.1, shp)
            else:
                values = np.ones(shp)
            data, raw = _vector(values, T.F32 if ty is None else ty)
            w.add_tensor(tname, data, raw_dtype=raw)
            continue
        assert ty is not None  # _plan gives every MATRIX a type
        n_in = shp[-1]  # matrices are [n_out, n_in], expert tensors [n_expert, n_out, n_in]
        n_out = int(np.prod(shp[:-1]))
        try:
            key = tname.split(".", 2)[2] if tname.startswith("blk.") else tname
            key = key.removesuffix(".weight")
            data = random_weight(ty, (n_out, n_in), rng, scale=(scales or {}).get(key, _SCALES.get(key, 0.02)))
        except CooktopError as e:
            raise CooktopError(f"{tname}: {e}") from None
        if shp[0] == 1 and len(shp) == 2 and key.endswith("_shexp"):
            shp = (n_in,)  # qwen2moe's shared-expert gate: a vector in llama.cpp's files
        if ty in (T.F32, T.F16):
            w.add_tensor(tname, (data.view(np.float32) if ty == T.F32 else data.view(np.float16)).reshape(shp))
        else:
            w.add_tensor(tname, data.reshape(*shp[:-1], -1), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_params
