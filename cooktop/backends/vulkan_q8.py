"""8-bit activations for the Vulkan integer-dot mat-vec (``mul_mat_vec_*_q8`` variants).

On devices where kp enabled ``shaderIntegerDotProduct`` (and 16-bit storage), the
mat-vec of Q4_0 / Q8_0 weights runs on an 8-bit copy of its input: llama.cpp's
Q8_1 idea (ggml-common.h ``block_q8_1``, ``quantize_row_q8_1`` in ggml-quants.c;
ggml-vulkan's ``mul_mat_vecq``). ``quantize_q8_1.comp`` writes, per 32 values of
``x``, the int8 ``qs = roundEven(x / d)`` with ``d = max|x| / 127`` and the block
sum ``s = d * sum(qs)``, and ``mul_mat_vec_q8.comp`` computes each block dot with
packed 4x8-bit integer dot products (SPIR-V ``OpSDot``).

**One quantization per mat-vec input**: :class:`Q8Inputs` keeps one 8-bit buffer per
activation (its root tensor) and reuses the copy made earlier in the same pending op
list when no op recorded since then writes the activation (the q, k, v projections
of a layer, gate and up of the FFN read one copy). A new pending list (after a flush)
quantizes again.

The variant a device runs is chosen by :func:`.vulkan_shaders.pick_variant`; a variant
whose manifest entry has ``"input": "q8_1"`` takes this 8-bit copy as binding 1
(:func:`takes_q8_1`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .vulkan_shaders import bucket, variant_info, workgroups

#: uint32 words per 32-value block of the 8-bit copy: 8 words of int8 qs, then d, s, 0, 0.
Q8_1_BLOCK_WORDS = 12

#: Values per block.
Q8_1_BLOCK = 32

#: Max workgroups (of 64 invocations, one block each) of the quantize dispatch (grid-stride).
MAX_QUANT_GROUPS = 256


def takes_q8_1(variant: str) -> bool:
    """Whether shader variant ``variant`` reads the 8-bit copy of x (manifest ``"input": "q8_1"``)."""
    return variant_info(variant).get("input") == "q8_1"


def quantize_q8_1_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The numpy reference of quantize_q8_1.comp.

    Args:
        x: float32 [n, n_in], n_in a multiple of 32.
    Returns:
        (qs int8 [n, n_in], d float32 [n, n_in / 32], s float32 [n, n_in / 32]) with
        ``d = max|x| / 127`` per block, ``qs = rint(x * (1 / d))`` (0 where d == 0),
        ``s = d * sum(qs)``.
    Raises:
        ValueError: n_in is not a multiple of 32.
    """
    x = np.asarray(x, dtype=np.float32)
    n, n_in = x.reshape(-1, x.shape[-1]).shape
    if n_in % Q8_1_BLOCK:
        raise ValueError(f"quantize_q8_1_ref: row length {n_in} is not a multiple of 32")
    b = x.reshape(n, n_in // Q8_1_BLOCK, Q8_1_BLOCK)
    d = (np.abs(b).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv[..., None]).astype(np.int8)
    s = (d * q.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float32)
    return q.reshape(n, n_in), d, s


def dequantize_q8_1_ref(x: np.ndarray) -> np.ndarray:
    """``x`` as the integer-dot mat-vec sees it: float64 [n, n_in] of ``d * qs`` per block."""
    q, d, _ = quantize_q8_1_ref(x)
    n, n_in = q.shape
    return (q.reshape(n, -1, Q8_1_BLOCK).astype(np.float64) * d[..., None].astype(np.float64)).reshape(n, n_in)


class Q8Inputs:
    """The 8-bit copies of one Vulkan device's activations (module docstring).

    ``dev`` is the :class:`.vulkan.VulkanDevice`; this uses its ``_tensor``,
    ``_alloc_check``, ``_count_alloc``, ``_dispatch_raw`` and its pending op list.
    Counter for tests: ``n_quantized`` (quantize dispatches enqueued).
    """

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self._bufs: dict[Any, Any] = {}      # x root kp tensor -> 8-bit copy kp tensor
        # x root -> (pending list, index after the quantize dispatch, rows, that dispatch's entry)
        self._fresh: dict[Any, tuple[list, int, int, Any]] = {}
        self.n_quantized = 0

    def input(self, x: Any, n: int, n_in: int, row_cap: int) -> Any:
        """The kp tensor with the 8-bit copy of the first ``n`` rows of activation ``x``
        (a DeviceTensor f32 [n, n_in] view of a root of ``row_cap`` rows), enqueueing its
        quantization unless the copy made earlier in this pending list is still current.

        Raises:
            DeviceOutOfMemoryError: no room for the copy (``row_cap * n_in / 32 * 48`` bytes).
        """
        dev = self.dev
        root = x.handle
        pending = dev._pending
        fresh = self._fresh.get(root)
        if (fresh is not None and fresh[0] is pending and fresh[2] >= n and len(pending) >= fresh[1]
                and pending[fresh[1] - 1] is fresh[3]
                and not any(kind == "algo" and root in obj[3] for kind, obj, _ in pending[fresh[1]:])):
            return self._bufs[root]
        buf = self._bufs.get(root)
        n_blocks_cap = row_cap * n_in // Q8_1_BLOCK
        if buf is None or int(buf.size()) < n_blocks_cap * Q8_1_BLOCK_WORDS:
            nbytes = 4 * n_blocks_cap * Q8_1_BLOCK_WORDS
            dev._alloc_check(nbytes, f"8-bit copy of activation [{row_cap}, {n_in}]")
            buf = dev._tensor(np.zeros(n_blocks_cap * Q8_1_BLOCK_WORDS, dtype=np.uint32), "storage")
            dev._count_alloc(nbytes)
            self._bufs[root] = buf
        n_blocks = n * n_in // Q8_1_BLOCK
        groups = (bucket(n, row_cap) * n_in // Q8_1_BLOCK + 63) // 64
        dev._dispatch_raw("quantize_q8_1", (root, buf), workgroups(min(MAX_QUANT_GROUPS, groups)), (n_blocks,))
        self.n_quantized += 1
        self._fresh[root] = (pending, len(pending), n, pending[-1])
        return buf

    def drop(self, roots: set[Any]) -> set[Any]:
        """Forget the copies of activations ``roots`` (kp tensors being released); returns
        the copies' kp tensors for the caller to destroy with them."""
        out = set()
        for r in roots:
            self._fresh.pop(r, None)
            buf = self._bufs.pop(r, None)
            if buf is not None:
                out.add(buf)
        return out
