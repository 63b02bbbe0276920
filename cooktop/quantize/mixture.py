"""llama.cpp's per-tensor type choice for a quantization file type (the "mixtures": Q4_K_M, Q3_K_S...).

Source: src/llama-quant.cpp: ``tensor_allows_quantization`` (which tensors are quantized at all: 2-D and
up, names ending in ``weight``, not norms, not MoE routers, not position embeddings...),
``tensor_get_category``, ``llama_tensor_get_type`` and ``llama_tensor_get_type_impl`` (the bumps: output
and tied token embeddings to Q6_K, attn_v / ffn_down by layer with ``use_more_bits``, attn_output for Q2_K
and Q3_K_*), ``tensor_type_fallback`` (a row that is not whole blocks falls back to a 32-block type,
else F16), and the tensor order of llama.cpp's loader (``weight_name_comparer``: layer number, then name).
The branches of the types cooktop does not offer (IQ1-IQ3, Q2_K_S, TQ*, MXFP4) are left out; IQ4_NL and
IQ4_XS are in. ``LLM_TYPE_70B`` (attn_v gets Q5_K for Q3_K/Q4_K) is recognised as src/models/*.cpp
set it: llama with 80 layers and GQA, qwen2 / deci / olmo with 80 layers, jais2 with 68.
"""

from __future__ import annotations

import dataclasses
import re

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .ftypes import FileType

T = GGMLQuantizationType
_FLOAT = (T.F32, T.F16, T.BF16)
_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL}
_NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                  "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                  "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
                  "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
                  "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
                  "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
                  "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
                  "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_CATEGORIES = (("attn_qkv.weight", "qkv"), ("attn_kv_b.weight", "kv_b"), ("attn_v.weight", "attn_v"),
               ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
               ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down"))
_ATTN_V = ("attn_v", "qkv", "kv_b")
_LAYER = re.compile(r"blk\.(-?\d+)\.")
_70B_LAYERS = {"qwen2": 80, "deci": 80, "olmo": 80, "jais2": 68}


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the mixtures read from the model's metadata (llama.cpp's ``hparams``).

    Attributes:
        arch: ``general.architecture``.
        n_layer: ``{arch}.block_count``.
        n_head, n_head_kv: layer 0's head counts (``n_gqa = n_head / n_head_kv``).
        n_expert: ``{arch}.expert_count`` (0 without experts).
    """

    arch: str
    n_layer: int
    n_head: int = 1
    n_head_kv: int = 1
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        """Query heads per KV head (llama.cpp ``hparams.n_gqa()``)."""
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's ``LLM_TYPE_70B`` (src/models/llama.cpp, qwen2.cpp, deci.cpp, olmo.cpp, jais2.cpp)."""
        if self.arch == "llama":
            return self.n_layer == 80 and self.n_head != self.n_head_kv
        return _70B_LAYERS.get(self.arch) == self.n_layer


@dataclasses.dataclass(frozen=True)
class Options:
    """llama-quantize's per-tensor options (``llama_model_quantize_params``).

    Attributes:
        file_type: the target type.
        pure: ``--pure``: every quantized tensor gets the default type (no mixture bumps; fallbacks stay).
        output_tensor_type: ``--output-tensor-type`` (None: the mixture's choice).
        token_embedding_type: ``--token-embedding-type``.
        quantize_output_tensor: False for ``--leave-output-tensor`` (output.weight keeps its type).
        has_imatrix: an importance matrix is given (``--imatrix``: Q4_0 / Q5_0 then guard the first
            eighth of the ffn_down layers with Q4_1 / Q5_1).
        tensor_types: ``--tensor-type PATTERN=TYPE`` pairs, in order: the first pattern found in a
            tensor's name (``re.search``, as llama.cpp's ``std::regex_search``) sets its type, instead
            of the mixture (the block-size fallback still applies).
    """

    file_type: FileType
    pure: bool = False
    output_tensor_type: T | None = None
    token_embedding_type: T | None = None
    quantize_output_tensor: bool = True
    has_imatrix: bool = False
    tensor_types: tuple[tuple[str, T], ...] = ()


def layer_of(name: str) -> int:
    """The block number of ``blk.N.*`` names, -1 for others (llama.cpp ``sscanf(name, "blk.%d.")``)."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def llama_order(names) -> list[str]:
    """Names in llama.cpp's loader order (``weight_name_comparer``): layer -1 first, then by layer, then by name."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode()))


def n_dims(ne: tuple[int, ...]) -> int:
    """``ggml_n_dims``: dimensions up to the last one larger than 1 (GGUF ``ne`` order), at least 1."""
    n = 1
    for i, d in enumerate(ne):
        if d > 1:
            n = i + 1
    return n


def category(name: str) -> str:
    """llama.cpp's ``tensor_get_category``: output, token_embd, attn_v, ffn_down, ... or other."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in _CATEGORIES:
        if part in name:
            return cat
    return "other"


def allows_quantization(name: str, ne: tuple[int, ...], opts: Options) -> bool:
    """llama.cpp's ``tensor_allows_quantization``: is this tensor converted at all (else copied as is)."""
    if n_dims(ne) < 2 or not name.endswith("weight"):
        return False
    if not opts.quantize_output_tensor and name == "output.weight":
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(part in name for part in _NOT_QUANTIZED)


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def fallback(name: str, ne0: int, t: T) -> tuple[T, bool]:
    """``tensor_type_fallback``: a type whose block fits a row of ``ne0`` values; (type, fell back)."""
    if t in _FLOAT or ne0 % GGML_QUANT_SIZES[t][0] == 0:
        return t, False
    ft = _FALLBACK.get(t, t)
    if ne0 % GGML_QUANT_SIZES[ft][0]:
        ft = T.F16
    return ft, True


class Mixture:
    """The per-tensor choice for one model: call :meth:`choose` once per tensor, in llama.cpp's order
    (the attn_v / ffn_down counters depend on it: :func:`llama_order`).

    Args:
        facts: the model's :class:`ModelFacts`.
        opts: the :class:`Options`.
        names: every tensor name of the file (to count attn_v tensors and see whether output.weight exists).
    """

    def __init__(self, facts: ModelFacts, opts: Options, names):
        self.facts, self.opts = facts, opts
        names = list(names)
        self.n_attention_wv = sum(category(n) in _ATTN_V for n in names)
        self.tied = "output.weight" not in names
        self.i_attention_wv = self.i_ffn_down = 0
        self.n_fallback = 0
        self.fallbacks: list[tuple[str, T, T]] = []
        self._patterns = [(re.compile(p), t) for p, t in opts.tensor_types]

    def _manual(self, name: str) -> T | None:
        for pattern, t in self._patterns:
            if pattern.search(name):
                return t
        return None

    def choose(self, name: str, ne: tuple[int, ...], cur: T) -> T:
        """The output type of tensor ``name`` (GGUF ``ne``, current type ``cur``)."""
        opts = self.opts
        if not allows_quantization(name, ne, opts):
            return cur
        cat = category(name)
        if opts.token_embedding_type is not None and cat == "token_embd":
            # per_layer_token_embd follows it too unless a --tensor-type pattern names it
            if name != "per_layer_token_embd.weight" or self._manual(name) is None:
                return opts.token_embedding_type
        if opts.output_tensor_type is not None and cat == "output":
            return opts.output_tensor_type
        t = opts.file_type.default
        if t in _FLOAT:
            return t
        manual = self._manual(name)
        if manual is not None:
            t = manual
        elif not opts.pure:
            t = self._impl(name, ne, t, cat)
        new, fell = fallback(name, ne[0], t)
        if fell:
            self.n_fallback += 1
            self.fallbacks.append((name, t, new))
        return new

    def _impl(self, name: str, ne: tuple[int, ...], t: T, cat: str) -> T:
        """``llama_tensor_get_type_impl`` for the non-IQ file types."""
        f, ft = self.facts, self.opts.file_type.name
        falcon = f.arch == "falcon"
        if cat == "output" or (self.tied and cat == "token_embd"):
            if self.opts.output_tensor_type is not None:
                return self.opts.output_tensor_type
            if falcon or ne[0] % GGML_QUANT_SIZES[t][0]:
                return T.Q8_0
            return t if t == T.Q8_0 else T.Q6_K
        if cat == "token_embd":
            return t  # the per-type token_embd choices are the IQ types'
        if cat in _ATTN_V:
            if ft == "Q2_K":
                t = T.Q4_K if f.n_gqa >= 4 else T.Q3_K
            elif ft == "Q3_K_M":
                t = T.Q5_K if self.i_attention_wv < 2 else T.Q4_K
            elif ft == "Q3_K_L":
                t = T.Q5_K
            elif ft in ("IQ4_NL", "IQ4_XS") and f.n_gqa >= 4:
                t = T.Q5_K
            elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(self.i_attention_wv, self.n_attention_wv):
                t = T.Q6_K
            elif ft == "Q4_K_S" and self.i_attention_wv < 4:
                t = T.Q5_K
            if f.is_70b and t in (T.Q3_K, T.Q4_K):
                t = T.Q5_K
            if f.n_expert == 8:
                t = T.Q8_0
            self.i_attention_wv += 1
        elif cat == "attn_k":
            if f.n_expert == 8:
                t = T.Q8_0
        elif cat == "ffn_down":
            i_layer, n_layer = self.i_ffn_down, f.n_layer
            if f.n_expert > 1:
                i_layer = layer_of(name)
            if ft == "Q2_K":
                t = T.Q3_K
            elif ft == "Q3_K_M":
                t = (T.Q5_K if i_layer < n_layer // 16
                     else T.Q4_K if not falcon or _use_more_bits(i_layer, n_layer) else T.Q3_K)
            elif ft == "Q3_K_L":
                t = T.Q4_K if falcon else T.Q5_K
            elif ft == "Q4_K_M":
                if falcon:
                    t = (T.Q6_K if i_layer < n_layer // 16
                         else T.Q5_K if _use_more_bits(i_layer, n_layer) else T.Q4_K)
                elif _use_more_bits(i_layer, n_layer):
                    t = T.Q6_K
            elif i_layer < n_layer // 8 and ft in ("IQ4_NL", "IQ4_XS") and not self.opts.has_imatrix:
                t = T.Q5_K
            elif ft == "Q5_K_M" and _use_more_bits(i_layer, n_layer):
                t = T.Q6_K
            elif ft == "Q4_K_S" and not falcon and i_layer < n_layer // 8:
                t = T.Q5_K
            elif ft in ("Q4_0", "Q5_0") and self.opts.has_imatrix and i_layer < n_layer // 8:
                t = T.Q4_1 if ft == "Q4_0" else T.Q5_1
            self.i_ffn_down += 1
        elif cat == "attn_output":
            if not falcon:
                if f.n_expert == 8:
                    if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS"):
                        t = T.Q5_K
                else:
                    t = {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(ft, t)
            elif ft == "Q3_K_L":
                t = T.Q4_K
        # (llama.cpp's later attn_qkv branch is unreachable: attn_qkv is attn_v-like and taken above)
        return t
