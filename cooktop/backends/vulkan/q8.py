"""8-bit activations for the Vulkan integer-dot mat-vec (``mul_mat_vec_*_q8`` variants).

On devices where kp enabled ``shaderIntegerDotProduct`` (and 16-bit storage), the
mat-vec of Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K weights runs on an 8-bit copy of its input: llama.cpp's
Q8_1 idea (ggml-common.h ``block_q8_1``, ``quantize_row_q8_1`` in ggml-quants.c;
ggml-vulkan's ``mul_mat_vecq``). ``quantize_q8_1.comp`` writes, per 32 values of
``x``, the int8 ``qs = roundEven(x / d)`` with ``d = max|x| / 127`` and the block
sum ``s = d * sum(qs)``, and ``mul_mat_vec_q8.comp`` computes each block dot with
packed 4x8-bit integer dot products (SPIR-V ``OpSDot``).

With ``COOKTOP_VULKAN_Q8K=1`` the K-quants (Q4_K, Q5_K, Q6_K) read llama.cpp's ``block_q8_K``
instead (default off: no faster on lavapipe; variants ``mul_mat_vec_*_q8k``, ``"input": "q8_K"``):
``quantize_q8_K.comp`` writes, per 256 values, the int8 ``qs = min(127, roundEven(x * -127 / max))``
(``max`` the first value of largest magnitude), ``d = 1 / (-127 / max)`` and the int16 sums of ``qs`` per 16 values
(:func:`..reference.quantize_q8_K_ref`; ``quantize_row_q8_K_ref`` in ggml-quants.c), so that a
super-block's dot needs one float scale and its ``-min`` / ``-32`` terms come from the sums.

**One quantization per mat-vec input**: :class:`Q8Inputs` keeps one 8-bit buffer per
activation (its root tensor) and format and reuses the copy made earlier in the same pending op
list when no op recorded since then writes the activation (the q, k, v projections
of a layer, gate and up of the FFN read one copy). A new pending list (after a flush),
a graph scope (a graph quantizes its own inputs, so its replays issue the ops it
recorded) or a graph entry in between quantizes again.

The variant a device runs is chosen by :func:`.shaders.pick_variant`; a variant
whose manifest entry has ``"input": "q8_1"`` or ``"q8_K"`` takes the 8-bit copy in that format
as binding 1 (:func:`input_format`). An activation read in both formats (a model mixing Q4_0 and
K-quant weights) has one copy of each.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..reference import dequantize_q8_ref, quantize_q8_ref
from .shaders import bucket, variant_info, workgroups

#: uint32 words per 32-value block of the 8-bit copy: 8 words of int8 qs, then d, s, 0, 0.
Q8_1_BLOCK_WORDS = 12

#: Values per block.
Q8_1_BLOCK = 32

#: uint32 words per 256-value block of the block_q8_K copy: 64 words of int8 qs, 8 of int16
#: bsums, then d, 0, 0, 0 (quantize_q8_K.comp).
Q8_K_BLOCK_WORDS = 76

#: Values per block_q8_K block.
Q8_K_BLOCK = 256

#: (values per block, uint32 words per block, quantizer variant) of each activation format.
FORMATS: dict[str, tuple[int, int, str]] = {"q8_1": (Q8_1_BLOCK, Q8_1_BLOCK_WORDS, "quantize_q8_1"),
                                            "q8_K": (Q8_K_BLOCK, Q8_K_BLOCK_WORDS, "quantize_q8_K")}

#: Max workgroups (of 64 invocations, one block each) of the quantize dispatch (grid-stride).
MAX_QUANT_GROUPS = 256


def input_format(variant: str) -> str | None:
    """The 8-bit copy of x shader variant ``variant`` reads (manifest ``"input"``): ``"q8_1"``,
    ``"q8_K"``, or None for float32 x."""
    return variant_info(variant).get("input")


def takes_q8_1(variant: str) -> bool:
    """Whether shader variant ``variant`` reads an 8-bit copy of x (``"q8_1"`` or ``"q8_K"``)."""
    return input_format(variant) in FORMATS


#: The numpy reference of quantize_q8_1.comp: the same quantization as the OpenCL backend's
#: (:func:`..reference.quantize_q8_ref`): (qs int8 [..., n], d, s float32 [..., n / 32]).
quantize_q8_1_ref = quantize_q8_ref

#: ``x`` as the integer-dot mat-vec sees it: float64 ``d * qs`` per block (:func:`..reference.dequantize_q8_ref`).
dequantize_q8_1_ref = dequantize_q8_ref

# quantize_q8_K.comp's numpy reference is ..reference.quantize_q8_K_ref (OpenCL's store_q8k too),
# and x as the q8_K mat-vecs see it ..reference.dequantize_q8_K_ref.



class Q8Inputs:
    """The 8-bit copies of one Vulkan device's activations (module docstring).

    ``dev`` is the :class:`.vulkan.VulkanDevice`; this uses its ``_tensor``,
    ``_alloc_check``, ``_count_alloc``, ``_dispatch_raw`` and its pending op list.
    Counter for tests: ``n_quantized`` (quantize dispatches enqueued).
    """

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self._bufs: dict[tuple[Any, str], Any] = {}  # (x root kp tensor, format) -> 8-bit copy kp tensor
        # (x root, format) -> (pending list, index after the quantize dispatch, rows, that dispatch's entry)
        self._fresh: dict[tuple[Any, str], tuple[list, int, int, Any]] = {}
        #: copies replaced by a larger one: pending ops, pipelines or graphs may still bind them, so
        #: the device destroys them after its next flush (:meth:`take_retired`)
        self.retired: list[Any] = []
        self.n_quantized = 0

    def input(self, x: Any, n: int, n_in: int, row_cap: int, fmt: str = "q8_1") -> Any:
        """The kp tensor with the 8-bit copy in format ``fmt`` (``"q8_1"`` or ``"q8_K"``) of the
        first ``n`` rows of activation ``x`` (a DeviceTensor f32 [n, n_in] view of a root of
        ``row_cap`` rows; n_in a multiple of 32, of 256 for q8_K), enqueueing its quantization
        unless the copy made earlier in this pending list is still current.

        Raises:
            DeviceOutOfMemoryError: no room for the copy (``row_cap * n_in / 32 * 48`` bytes for
                q8_1, ``row_cap * n_in / 256 * 304`` for q8_K).
            ValueError: an unknown format, or n_in not a multiple of its block.
        """
        if fmt not in FORMATS:
            raise ValueError(f"unknown 8-bit activation format {fmt!r}")
        block, words, quantizer = FORMATS[fmt]
        if n_in % block:
            raise ValueError(f"{fmt} activations need rows of a multiple of {block} values, not {n_in}")
        dev = self.dev
        root = x.handle
        key = (root, fmt)
        # the list dispatches go to: the pending list, or a graph replay's check list (a
        # graph's recording quantizes its own inputs, so a replay must issue the same ops)
        pending = dev._sink
        fresh = self._fresh.get(key)
        if (fresh is not None and fresh[0] is pending and fresh[2] >= n and len(pending) >= fresh[1]
                and pending[fresh[1] - 1] is fresh[3]
                # a graph entry may write anything: only plain dispatches are looked into
                and not any(kind != "algo" or root in obj[3] for kind, obj, _ in pending[fresh[1]:])):
            return self._bufs[key]
        buf = self._bufs.get(key)
        n_blocks_cap = row_cap * n_in // block
        if buf is None or int(buf.size()) < n_blocks_cap * words:
            nbytes = 4 * n_blocks_cap * words
            dev._alloc_check(nbytes, f"8-bit ({fmt}) copy of activation [{row_cap}, {n_in}]")
            if buf is not None:  # grown (a wider view of the same root): the old copy goes
                self.retired.append(buf)
                self._fresh.pop(key, None)
            buf = dev._tensor(np.zeros(n_blocks_cap * words, dtype=np.uint32), "storage")
            dev._count_alloc(nbytes)
            self._bufs[key] = buf
        n_blocks = n * n_in // block
        groups = (bucket(n, row_cap) * n_in // block + 63) // 64
        dev._dispatch_raw(quantizer, (root, buf), workgroups(min(MAX_QUANT_GROUPS, groups)), (n_blocks,))
        self.n_quantized += 1
        self._fresh[key] = (pending, len(pending), n, pending[-1])
        return buf

    def forget_fresh(self) -> None:
        """Make the next :meth:`input` of every activation quantize again (a graph scope
        begins: what it records must not lean on copies made before it)."""
        self._fresh.clear()

    def take_retired(self) -> set[Any]:
        """The replaced copies (kp tensors) for the caller to destroy, forgotten here."""
        out, self.retired = set(self.retired), []
        return out

    def drop(self, roots: set[Any]) -> set[Any]:
        """Forget the copies (every format) of activations ``roots`` (kp tensors being released);
        returns the copies' kp tensors for the caller to destroy with them."""
        out = set()
        for key in [k for k in self._bufs if k[0] in roots]:
            self._fresh.pop(key, None)
            out.add(self._bufs.pop(key))
        for key in [k for k in self._fresh if k[0] in roots]:
            self._fresh.pop(key)
        return out
