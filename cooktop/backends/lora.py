"""LoRA adapters in the matmul path: ``y = W x + sum_adapters scale * (B (A x))``, not merged
into the weights, so their scales change between passes.

A weight tensor carries its adapters in :attr:`DeviceTensor.lora <.tensor.DeviceTensor>`, one
:class:`LoraDelta` per adapter that names it (``model/lora.py`` attaches them when an adapter
is loaded). :meth:`DeviceOps.matmul <.ops.DeviceOps.matmul>` (and ``matmuls``) calls
:func:`apply` after the weight's own product, so every architecture's projections, and the
output head, get them without block code knowing. :func:`apply` composes ops every backend
has (``matmul`` with F32 weights, ``scale``, ``add``), so it runs on numpy, OpenCL and Vulkan
without kernels of its own; its two intermediates are device scratch buffers kept per width
(``chunked.scratch``). Formula: llama.cpp src/llama-graph.cpp ``build_lora_mm`` (the product
``B (A x)``, then ``ggml_scale``, then ``ggml_add`` to the weight's result) with the scale of
src/llama-adapter.h ``llama_adapter_lora_weight::get_scale``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UnsupportedOpError
from . import chunked
from .tensor import DeviceTensor


@dataclasses.dataclass(frozen=True, eq=False)
class LoraDelta:
    """One adapter's low-rank update of one weight ``W [n_out, n_in]``.

    Attributes:
        a: f32 [rank, n_in] on the weight's device (GGUF ``<name>.lora_a``, ne ``[n_in, rank]``).
        b: f32 [n_out, rank] (GGUF ``<name>.lora_b``, ne ``[rank, n_out]``; a fused weight's part
            holds its rows of it).
        alpha: the adapter's ``adapter.lora.alpha`` (0: none).
        scales: the adapter scales of the model, shared and changed in place by the model's
            :class:`~cooktop.model.lora.LoraSet` (what ``llama_set_adapters_lora`` sets).
        index: this adapter's entry in ``scales``.
    """

    a: DeviceTensor
    b: DeviceTensor
    alpha: float
    scales: list[float]
    index: int

    @property
    def rank(self) -> int:
        """The adapter's rank for this weight (llama.cpp: ``b->ne[0]``)."""
        return self.b.shape[1]

    def scale(self) -> float:
        """``adapter_scale * alpha / rank`` (``adapter_scale`` when alpha is 0): llama.cpp
        ``llama_adapter_lora_weight::get_scale``."""
        s = float(self.scales[self.index])
        return s * self.alpha / self.rank if self.alpha else s


def apply(dev: Any, out: DeviceTensor, x: DeviceTensor, deltas: tuple[LoraDelta, ...]) -> None:
    """``out += scale_i * (x @ a_i^T) @ b_i^T`` for each delta with a scale other than 0.

    dev: the :class:`~.base.Device` running the matmul (not imported here: ``ops`` imports this module).
    out: f32 [n, n_out] (the weight's product, already written); x: f32 [n, n_in]. An adapter
    at scale 0 adds nothing and is skipped, so its result is the base weight's exactly.

    Raises:
        UnsupportedOpError: ``out`` stored in row chunks (logits past the device's largest buffer).
        DeviceError / ShapeError: from the ops.
    """
    n = x.shape[0]
    for d in deltas:
        s = d.scale()
        if s == 0.0:
            continue
        if out.chunks is not None:
            raise UnsupportedOpError(f"LoRA: the output {out!r} is stored in row chunks; an adapter of this "
                                     "weight needs it in one buffer (fewer rows: a smaller -b)")
        ax = chunked.scratch(dev, "lora ax", n, d.rank)
        dev.matmul(ax, x, d.a)
        bax = chunked.scratch(dev, "lora bax", n, out.shape[1])
        dev.matmul(bax, ax, d.b)
        dev.scale(bax, bax, s)
        dev.add(out, out, bax)
