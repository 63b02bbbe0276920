"""llama-quantize's file types: names, ``llama_ftype`` numbers and default tensor types.

Sources: tools/quantize/quantize.cpp (``QUANT_OPTIONS``: the names, aliases included), include/llama.h
(``llama_ftype`` values, written as ``general.file_type``), src/llama-quant.cpp
(``llama_ftype_get_default_type``). Only the types whose quantizers cooktop has (:mod:`.rows`) are offered.
"""

from __future__ import annotations

import dataclasses

from gguf import GGMLQuantizationType

from ..errors import CooktopError

T = GGMLQuantizationType


@dataclasses.dataclass(frozen=True)
class FileType:
    """One llama-quantize type.

    Attributes:
        name: llama-quantize's name, e.g. ``Q4_K_M``.
        ftype: the ``llama_ftype`` number (``general.file_type``).
        default: the tensor type of the mixture's ordinary tensors.
    """

    name: str
    ftype: int
    default: T


_TABLE = (
    ("F32", 0, T.F32), ("F16", 1, T.F16), ("BF16", 32, T.BF16),
    ("Q4_0", 2, T.Q4_0), ("Q4_1", 3, T.Q4_1), ("Q5_0", 8, T.Q5_0), ("Q5_1", 9, T.Q5_1), ("Q8_0", 7, T.Q8_0),
    ("Q2_K", 10, T.Q2_K), ("Q3_K_S", 11, T.Q3_K), ("Q3_K_M", 12, T.Q3_K), ("Q3_K_L", 13, T.Q3_K),
    ("Q4_K_S", 14, T.Q4_K), ("Q4_K_M", 15, T.Q4_K), ("Q5_K_S", 16, T.Q5_K), ("Q5_K_M", 17, T.Q5_K),
    ("Q6_K", 18, T.Q6_K), ("IQ4_NL", 25, T.IQ4_NL), ("IQ4_XS", 30, T.IQ4_XS),
)
#: name -> FileType, llama-quantize's names (case-insensitive lookups via :func:`file_type`).
FILE_TYPES: dict[str, FileType] = {n: FileType(n, f, d) for n, f, d in _TABLE}
#: llama-quantize's aliases (quantize.cpp: "alias for Q4_K_M" ...).
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
#: ftype number -> name.
BY_FTYPE = {f.ftype: f.name for f in FILE_TYPES.values()}

#: ggml type names accepted by --output-tensor-type / --token-embedding-type (quantize.cpp
#: ``parse_ggml_type`` matches ggml_type_name case-insensitively), limited to the types cooktop writes.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS")


def file_type(name: str) -> FileType:
    """The file type named ``name`` (llama-quantize's name or alias, any case, or its ftype number).

    Raises:
        CooktopError: an unknown name (the message lists the known ones).
    """
    key = name.strip().upper()
    if key.isdigit() and int(key) in BY_FTYPE:
        key = BY_FTYPE[int(key)]
    key = ALIASES.get(key, key)
    if key not in FILE_TYPES:
        raise CooktopError(f"unknown quantization type {name!r}: use one of {', '.join(FILE_TYPES)}")
    return FILE_TYPES[key]


def tensor_type(name: str) -> T:
    """The ggml type named ``name`` (``q6_k``, ``Q8_0``...), for the per-tensor overrides.

    Raises:
        CooktopError: not a type cooktop writes.
    """
    key = name.strip().upper()
    if key not in TENSOR_TYPES:
        raise CooktopError(f"unknown tensor type {name!r}: use one of {', '.join(TENSOR_TYPES)}")
    return GGMLQuantizationType[key]


def tensor_type_option(arg: str) -> tuple[str, T]:
    """One ``--tensor-type NAME=TYPE`` (quantize.cpp ``parse_tensor_type``): the name lowercased (a regular
    expression searched in tensor names), the type a ggml type name.

    Raises:
        CooktopError: no ``=``, an empty name or type, an unknown type, or a pattern that does not compile.
    """
    import re

    name, sep, typ = arg.partition("=")
    if not sep:
        raise CooktopError(f"malformed tensor type {arg!r}: use NAME=TYPE, e.g. attn_v=q8_0")
    if not name:
        raise CooktopError(f"missing tensor name in --tensor-type {arg!r}")
    if not typ:
        raise CooktopError(f"missing quantization type in --tensor-type {arg!r}")
    try:
        re.compile(name.lower())
    except re.error as e:
        raise CooktopError(f"--tensor-type {arg!r}: bad pattern: {e}") from None
    return name.lower(), tensor_type(typ)
