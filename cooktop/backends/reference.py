"""numpy references shared by the device backends' 8-bit activation paths and their tests.

The OpenCL and Vulkan backends quantize a matmul's float32 input to llama.cpp's ``block_q8_1``
(ggml-common.h) the same way (``Device.quantizes_activations`` says when); this is that rounding
in numpy, so the integer-dot matmuls can be checked exactly against it; OpenCL's K-quant kernels
(and Vulkan's with ``COOKTOP_VULKAN_Q8K=1``) read llama.cpp's ``block_q8_K`` instead
(:func:`quantize_q8_K_ref`; ``Device.activation_format`` names the format,
:func:`dequantize_activations_ref` applies it).

The KV cache's types are written the same way on every backend: :func:`quantize_kv` is the
numpy reference of ``kv_store`` (the numpy backend's own, and what the device kernels are
checked against byte for byte).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants

T = GGMLQuantizationType


def quantize_q8_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy reference of the devices' activation quantization (OpenCL ``store_q8``, Vulkan ``quantize_q8_1``).

    Args:
        x: float32 [..., n] with ``n % 32 == 0``.
    Returns:
        (q int8 [..., n], d float32 [..., n / 32], s float32 [..., n / 32]) with
        ``d = max|x| / 127`` per 32 values, ``q = rint(x * (127 / max|x|))`` (0 where the block
        is all zeros) and ``s = d * sum(q)`` (llama.cpp's block_q8_1, ggml-common.h).
    Raises:
        ValueError: ``n`` is not a multiple of 32.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % 32:
        raise ValueError(f"quantize_q8_ref: row length {x.shape[-1]} is not a multiple of 32")
    b = x.reshape(x.shape[:-1] + (-1, 32))
    amax = np.abs(b).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(b * inv).astype(np.int8)
    d = (amax / np.float32(127.0)).astype(np.float32)[..., 0]
    s = (d * q.astype(np.int32).sum(axis=-1)).astype(np.float32)
    return q.reshape(x.shape), d, s


def dequantize_q8_ref(x: np.ndarray) -> np.ndarray:
    """``x`` after the 8-bit round trip of :func:`quantize_q8_ref`, float64 (what the
    integer-dot matmuls multiply the weights with)."""
    q, d, _ = quantize_q8_ref(x)
    return (q.reshape(q.shape[:-1] + (-1, 32)).astype(np.float64) * d[..., None]).reshape(q.shape)


def quantize_q8_K_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy reference of the OpenCL ``store_q8k`` and the Vulkan ``quantize_q8_K`` shader (llama.cpp
    ``quantize_row_q8_K_ref``, ggml-quants.c).

    Per 256 values: ``max`` is the first value of largest magnitude, ``iscale = -127 / max``,
    ``q = min(127, rint(iscale * x))`` (ggml's nearest_int rounds half to even), ``d = 1 / iscale``
    (so ``d`` has the opposite sign of ``max``) and ``bsums`` the sums of ``q`` per 16 values
    (block_q8_K, ggml-common.h); an all-zero block has ``d = 0`` and ``q = 0``.

    Args:
        x: float32 [..., n] with ``n % 256 == 0``.
    Returns:
        (q int8 [..., n], d float32 [..., n / 256], bsums int16 [..., n / 16]).
    Raises:
        ValueError: ``n`` is not a multiple of 256.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % 256:
        raise ValueError(f"quantize_q8_K_ref: row length {x.shape[-1]} is not a multiple of 256")
    b = x.reshape(x.shape[:-1] + (-1, 256))
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=-1)[..., None], axis=-1)  # first of largest |x|
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0.0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)[..., 0]
    q = np.minimum(np.rint(b * iscale), 127).astype(np.int8)
    bsums = q.reshape(q.shape[:-1] + (16, 16)).astype(np.int32).sum(-1).astype(np.int16)
    return q.reshape(x.shape), d, bsums.reshape(x.shape[:-1] + (-1,))


def dequantize_q8_K_ref(x: np.ndarray) -> np.ndarray:
    """``x`` after the round trip of :func:`quantize_q8_K_ref`, float64 ``d * q`` (what the q8_K
    integer-dot matmuls multiply the weights with)."""
    q, d, _ = quantize_q8_K_ref(x)
    return (q.reshape(q.shape[:-1] + (-1, 256)).astype(np.float64) * d[..., None]).reshape(q.shape)


def dequantize_activations_ref(x: np.ndarray, fmt: str | None) -> np.ndarray:
    """``x`` float64 as a matmul with activation format ``fmt`` sees it
    (``Device.activation_format``): None (float32 as is), ``"q8_1"``
    (:func:`dequantize_q8_ref`) or ``"q8_K"`` (:func:`dequantize_q8_K_ref`).

    Raises:
        ValueError: an unknown format.
    """
    if fmt is None:
        return np.asarray(x, dtype=np.float64)
    if fmt == "q8_1":
        return dequantize_q8_ref(x)
    if fmt == "q8_K":
        return dequantize_q8_K_ref(x)
    raise ValueError(f"unknown activation format {fmt!r}")


def quantize_kv(x: np.ndarray, ggml_type: T) -> np.ndarray:
    """Rows of a KV cache as stored: ``x`` float32 [n, n_kv_dim] in ``ggml_type``.

    F32 as is; F16 rounded to nearest even (``GGML_FP32_TO_FP16``); BF16 rounded to nearest even
    with NaNs kept quiet (``ggml_compute_fp32_to_bf16``); the block types with ggml's
    ``quantize_row_*_ref`` (ggml-quants.c: q8_0 ``d = max|x| / 127``, ``q = roundf(x / d)``; q4_0
    ``d = x[argmax |x|] / -8``, ``q = min(15, (int)(x / d + 8.5))``...), blocks running along each
    row. gguf-py's quantizers are bit-exact ports of those.

    Returns:
        float32 [n, n_kv_dim] for F32, else uint8 [n, row_bytes] GGML blocks.
    Raises:
        NotImplementedError: a type gguf-py cannot quantize.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if ggml_type == T.F32:
        return x
    q = np.ascontiguousarray(quants.quantize(x, T(ggml_type)))
    return q.view(np.uint8).reshape(x.shape[0], -1)
