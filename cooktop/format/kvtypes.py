"""KV cache types: which GGML types a K or V cache may be stored in, their names, and
llama.cpp's rules tying them to flash attention.

llama.cpp's list (common/arg.cpp ``kv_cache_types``) is f32, f16, bf16, q8_0, q4_0, q4_1,
iq4_nl, q5_0, q5_1; its default for both K and V is f16 (``llama_context_default_params``).
cooktop stores all of them but iq4_nl (no reference quantizer in gguf-py). A quantized cache
is whole blocks along each cache row, i.e. along ``n_head_kv * head_dim`` (llama.cpp's
``ggml_set_rows`` into a ``[n_embd_k_gqa, kv_size]`` tensor); llama.cpp requires the block
size to divide ``head_dim`` (src/llama-context.cpp ``llama_init_from_model``), so that a
block never spans two heads.
"""

from __future__ import annotations

import dataclasses

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import CooktopError

T = GGMLQuantizationType

#: The KV cache types cooktop stores, in llama.cpp's order (iq4_nl left out, see the module doc).
KV_TYPES: tuple[T, ...] = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)

#: The default K and V cache type (llama.cpp's, ``llama_context_default_params``).
KV_DEFAULT = T.F16

#: ``-fa`` / ``flash_attn`` values (llama.cpp ``llama_flash_attn_type``: -1 auto, 0 off, 1 on).
FLASH_ATTN = ("auto", "off", "on")


class KVTypeError(CooktopError, ValueError):
    """An unknown KV cache type, or a combination llama.cpp refuses (quantized V without flash attention,
    a block size that does not divide head_dim)."""


def kv_type_name(t: T) -> str:
    """llama.cpp's lower-case name of a cache type (``ggml_type_name``: ``"q8_0"``)."""
    return T(t).name.lower()


def parse_kv_type(value: str | int | T | None, what: str = "cache type") -> T:
    """A cache type from a name (``"q8_0"``, any case) or a GGML type id (``8``); None: f16.

    Raises:
        KVTypeError: not one of :data:`KV_TYPES`.
    """
    if value is None:
        return KV_DEFAULT
    allowed = ", ".join(kv_type_name(t) for t in KV_TYPES)
    try:
        if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
            t = T.__members__[value.strip().upper()]
        else:
            t = T(int(value))
    except (KeyError, ValueError):
        raise KVTypeError(f"unsupported {what} {value!r}; allowed values: {allowed}") from None
    if t not in KV_TYPES:
        raise KVTypeError(f"unsupported {what} {kv_type_name(t)}; allowed values: {allowed}")
    return t


def parse_flash_attn(value: str | bool | int | None) -> str:
    """``"auto"``, ``"off"`` or ``"on"`` from llama.cpp's spellings (on/off/auto, true/false, 1/0, -1)
    or llama-cpp-python's ``flash_attn`` bool; None: auto.

    Raises:
        KVTypeError: anything else.
    """
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    s = str(value).strip().lower()
    if s in ("on", "true", "1", "enabled", "yes"):
        return "on"
    if s in ("off", "false", "0", "disabled", "no"):
        return "off"
    if s in ("auto", "-1"):
        return "auto"
    raise KVTypeError(f"unknown value for --flash-attn: {value!r} (on, off or auto)")


def is_quantized(t: T) -> bool:
    """True for a block-quantized type (ggml_is_quantized): not f32, f16 or bf16."""
    return GGML_QUANT_SIZES[T(t)][0] > 1


@dataclasses.dataclass(frozen=True)
class KVConfig:
    """The cache types of K and V and the flash-attention choice of a context.

    Attributes:
        type_k, type_v: GGML types of the K and V caches (:data:`KV_TYPES`).
        flash_attn: ``"auto"``, ``"off"`` or ``"on"`` as asked; :meth:`resolve` gives the choice made.
        swa_full: sliding-window layers keep every position's K/V (llama.cpp ``--swa-full``,
            llama-cpp-python ``swa_full``); False: only their window (``cooktop.model.swa``).
    """

    type_k: T = KV_DEFAULT
    type_v: T = KV_DEFAULT
    flash_attn: str = "auto"
    swa_full: bool = False

    @classmethod
    def parse(cls, type_k: str | int | T | None = None, type_v: str | int | T | None = None,
              flash_attn: str | bool | int | None = None, swa_full: bool | None = None) -> KVConfig:
        """From CLI / API spellings (see :func:`parse_kv_type`, :func:`parse_flash_attn`; ``swa_full``
        None: False, llama.cpp's default).

        Raises:
            KVTypeError: an unknown type or flash-attention value.
        """
        return cls(parse_kv_type(type_k, "K cache type"), parse_kv_type(type_v, "V cache type"),
                   parse_flash_attn(flash_attn), bool(swa_full))

    def resolve(self, head_dim: int) -> bool:
        """Whether flash attention is on, by llama.cpp's rules (src/llama-context.cpp
        ``llama_init_from_model``): a quantized V cache needs it (auto turns it on, off is an
        error), and with it on a quantized type's block size must divide ``head_dim``. Auto is
        on otherwise too: every cooktop device runs the tiled kernel (llama.cpp's auto asks the
        device whether it has one).

        Raises:
            KVTypeError: quantized V with flash attention off; a block size not dividing ``head_dim``.
        """
        if is_quantized(self.type_v) and self.flash_attn == "off":
            raise KVTypeError(f"quantized V cache ({kv_type_name(self.type_v)}) requires flash attention: "
                              f"use -fa on or -fa auto, or an f16/bf16/f32 V cache (-ctv)")
        fa = self.flash_attn != "off"
        for what, t in (("K", self.type_k), ("V", self.type_v)):
            block = GGML_QUANT_SIZES[t][0]
            if head_dim % block:
                raise KVTypeError(f"{what} cache type {kv_type_name(t)} with block size {block} does not divide "
                                  f"head_dim {head_dim}: choose f16 (-ct{what.lower()} f16)")
        return fa

    def row_bytes(self, n_embd_kv: int) -> tuple[int, int]:
        """Bytes of one cache row of K and of V (``n_embd_kv`` values each, GGML block layout)."""
        bk, sk = GGML_QUANT_SIZES[self.type_k]
        bv, sv = GGML_QUANT_SIZES[self.type_v]
        return n_embd_kv // bk * sk, n_embd_kv // bv * sv

    def label(self) -> str:
        """``"K f16, V q8_0"`` for messages and reports."""
        return f"K {kv_type_name(self.type_k)}, V {kv_type_name(self.type_v)}"
