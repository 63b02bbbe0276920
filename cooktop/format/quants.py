"""GGML weight types and their block layouts (ggml-common.h): names, row sizes,
dequantization to float32, the types the host can read, and valid random blocks.

Dequantization is ``gguf.quants.dequantize`` (the gguf package's reference of
the GGML block layouts).

Random weights (for smoke tests, parity tests and synthetic models):

Types that ``gguf.quants.quantize`` handles (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1, MXFP4) are quantized from Gaussian values.

MXFP4 (gpt-oss's expert type; ggml-common.h ``block_mxfp4``, OCP microscaling FP4):
blocks of 32 values in 17 bytes, an E8M0 exponent ``e`` then 16 bytes of 4-bit E2M1
codes (value j in the low nibble of byte j, value j + 16 in its high nibble); value =
``kvalues_mxfp4[code] * 2^(e - 128)`` with the doubled E2M1 table
``0 1 2 3 4 6 8 12 0 -1 -2 -3 -4 -6 -8 -12`` (ggml-quants.c ``dequantize_row_mxfp4``,
``GGML_E8M0_TO_FP32_HALF``). The rest (K-quants, IQ types) are
random bytes whose float16 super-block scales are then set to small finite
values, so every block decodes to finite numbers of moderate size. Scale
offsets are from the block structs of ggml-common.h.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from ..errors import UnsupportedOpError

T = GGMLQuantizationType

def type_name(t: T | int) -> str:
    """GGML type name, e.g. ``"Q4_K"`` for ``GGMLQuantizationType.Q4_K`` or 12."""
    try:
        return T(int(t)).name
    except ValueError:
        return f"type{int(t)}"


def row_bytes(ggml_type: T, n: int) -> int:
    """Bytes of one row of ``n`` values of ``ggml_type`` (GGML block layout, ggml-common.h).

    Raises:
        UnsupportedOpError: ``n`` is not a multiple of the type's block size
            (ggml refuses such rows too).
    """
    block, size = GGML_QUANT_SIZES[ggml_type]
    if n % block:
        raise UnsupportedOpError(
            f"a row of {n} values cannot be stored as {type_name(ggml_type)}: "
            f"its length must be a multiple of the block size {block}")
    return n // block * size


#: Every GGML type the host can dequantize (all that gguf.quants.dequantize handles, tested); the numpy
#: backend runs them all.
HOST_TYPES: tuple[T, ...] = (
    T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
    T.IQ4_NL, T.IQ4_XS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.MXFP4,
)


def dequantize(raw: np.ndarray, ggml_type: T, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize raw GGML data to float32 of numpy-order ``shape`` (gguf.quants.dequantize)."""
    if ggml_type == T.F32:
        return np.asarray(raw).view(np.float32).reshape(shape)
    out = quants.dequantize(np.asarray(raw).view(np.uint8), ggml_type)
    return np.asarray(out, dtype=np.float32).reshape(shape)


#: Byte offsets of the float16 scale fields (d, dmin) in each block (ggml-common.h).
_F16_FIELDS: dict[T, tuple[int, ...]] = {
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,),
    T.IQ3_XXS: (0,), T.IQ3_S: (0,),
}

#: Types gguf.quants.quantize can produce from floats.
QUANTIZABLE: tuple[T, ...] = (T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.MXFP4)


def random_weight(ggml_type: T, shape: tuple[int, int], rng: np.random.Generator,
                  scale: float = 1.0) -> np.ndarray:
    """Random weight of numpy-order ``shape`` ``[n_out, n_in]`` in GGML layout.

    Returns:
        float32 [n_out, n_in] for F32, else uint8 [n_out, row_bytes(n_in)] raw blocks.
    Raises:
        UnsupportedOpError: ``n_in`` is not a multiple of the type's block size.
        NotImplementedError: a type with no known way to make valid blocks.
    """
    ggml_type = T(ggml_type)
    n_out, n_in = shape
    nb = row_bytes(ggml_type, n_in)
    if ggml_type == T.F32:
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    if ggml_type in QUANTIZABLE:
        q = quants.quantize((rng.standard_normal(shape) * scale).astype(np.float32), ggml_type)
        return np.ascontiguousarray(q).view(np.uint8).reshape(n_out, nb)
    if ggml_type not in _F16_FIELDS:
        raise NotImplementedError(f"no random-block generator for {ggml_type.name}")
    block, size = GGML_QUANT_SIZES[ggml_type]
    n_blocks = n_out * (n_in // block)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in _F16_FIELDS[ggml_type]:
        d = (rng.uniform(0.5, 1.0, n_blocks) * scale * 2.0 ** -9).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(n_out, nb)
