"""The OpenCL backend's vision ops (:mod:`cooktop.backends.vision_ops`): ``layer_norm``, the GELUs and
``avg_pool2d`` from ``kernels/vision.cl`` (a program of its own, built on first use), ``rope_multi`` there too, and
``attention_full`` on the flash attention kernels of ``kernels/attention.cl``: ``k`` and ``v`` are F32
caches of ``n_tokens`` cells, every row's ``pos`` is ``n_tokens - 1`` (so each query attends to all
rows, no mask) and no KV head is shared. Those kernels run the softmax online over blocks of keys (one
work-item per (head, token) on CPU devices; on GPUs the 16-query tiles of ``attention_tiled`` sharing
each key tile in local memory), so no ``[n_tokens, n_tokens]`` score matrix is ever stored.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .programs import PROGRAMS, build_program, read_source


class VisionKernels:
    """The kernels of ``kernels/vision.cl`` on one device (built by :func:`kernels`)."""

    def __init__(self, prg: Any):
        i32, f32 = np.int32, np.float32
        self.layer_norm = prg.layer_norm
        self.layer_norm.set_scalar_arg_dtypes([None, None, None, None, i32, i32, f32])
        self.gelu = prg.gelu
        self.gelu.set_scalar_arg_dtypes([None, None, i32])
        self.gelu_erf = prg.gelu_erf
        self.gelu_erf.set_scalar_arg_dtypes([None, None, i32])
        self.gelu_quick = prg.gelu_quick
        self.gelu_quick.set_scalar_arg_dtypes([None, None, i32])
        self.avg_pool2d = prg.avg_pool2d
        self.avg_pool2d.set_scalar_arg_dtypes([None, None, i32, i32, i32, i32])
        self.rope_multi = prg.rope_multi
        self.rope_multi.set_scalar_arg_dtypes([None, None, None, i32, i32, i32, i32, i32, i32, f32])


def kernels(kc: Any) -> VisionKernels:
    """The :class:`VisionKernels` of the KernelCache ``kc`` (built on first use, cached on it)."""
    k = kc.__dict__.get("_vision")
    if k is None:
        with kc._lock:
            prg = build_program(kc.ctx, kc.device, read_source(*PROGRAMS["vision"]), kc.options, "vision op",
                                kc._label)
            k = kc.__dict__["_vision"] = VisionKernels(prg)
    return k


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


class OpenclVisionOps:
    """The vision ops' hooks of :class:`~cooktop.backends.opencl.device.OpenCLDevice` (mixed in)."""

    def _layer_norm(self: Any, out, x, w, b, eps):
        """``vision.cl`` ``layer_norm``: one work-group of ``rn_ls`` per row."""
        n_rows, n = x.shape
        ls = self.shape.rn_ls
        self.q8.dirty(out.handle)
        self._launch(kernels(self.kernels).layer_norm, (ls, n_rows), (ls, 1), out.handle, x.handle, w.handle,
                     (b if b is not None else w).handle, int(b is not None), n, eps)

    def _unary(self: Any, knl, out, x):
        n = math.prod(out.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self._launch(knl, (_ceil_to(n, ls),), (ls,), out.handle, x.handle, n)

    def _gelu(self: Any, out, x):
        """``vision.cl`` ``gelu``: one work-item per value."""
        self._unary(kernels(self.kernels).gelu, out, x)

    def _gelu_erf(self: Any, out, x):
        """``vision.cl`` ``gelu_erf``: one work-item per value."""
        self._unary(kernels(self.kernels).gelu_erf, out, x)

    def _gelu_quick(self: Any, out, x):
        """``vision.cl`` ``gelu_quick``: one work-item per value."""
        self._unary(kernels(self.kernels).gelu_quick, out, x)

    def _avg_pool2d(self: Any, out, x, width, height, k):
        """``vision.cl`` ``avg_pool2d``: one work-item per output value."""
        n = math.prod(out.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self._launch(kernels(self.kernels).avg_pool2d, (_ceil_to(n, ls),), (ls,), out.handle, x.handle, width, k,
                     x.shape[1], n)

    def _rope_multi(self: Any, out, x, pos, head_dim, sections, freq_base):
        """``vision.cl`` ``rope_multi``: one work-item per (pair, head, row)."""
        n, width = x.shape
        self.q8.dirty(out.handle)
        self._launch(kernels(self.kernels).rope_multi, (head_dim // 2, width // head_dim, n), None, out.handle,
                     x.handle, pos.handle, head_dim, n, *sections, math.log2(freq_base))

    def _attention_full(self: Any, out, q, k, v, n_head, scale):
        """The flash attention kernels with every row's pos ``n_tokens - 1`` (module doc)."""
        pos = self._full_attention_pos(q.shape[0])
        self._attention(out, q, k, v, pos, n_head, n_head, scale, 0, None, True)
