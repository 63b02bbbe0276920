"""The Vulkan backend's vision ops (:mod:`cooktop.backends.vision_ops`): ``layer_norm``
(``glsl/layer_norm.comp``), the GELUs (``glsl/gelu.comp``: variants ``gelu``, ``gelu_erf``, ``gelu_quick``),
``avg_pool2d`` (``glsl/avg_pool2d.comp``), ``rope_multi`` (``glsl/rope_multi.comp``) and ``attention_full``
on the flash attention shaders: ``k`` and ``v`` are F32 caches of ``n_tokens`` cells, every row's ``pos``
is ``n_tokens - 1`` (each query attends to all rows, no mask), no KV head shared. Up to
:data:`TILED_MAX_KEYS` rows it runs ``attention_tiled.comp`` (16-query tiles sharing each key tile in
shared memory, head_dim <= 128), else ``attention.comp`` (one workgroup per (row, head), online softmax
over chunks of 256 keys): no ``[n_tokens, n_tokens]`` score matrix is stored, on CPU drivers too (where
the text model's flash attention takes the score kernels: ``attention.scores_flash``). head_dim <= 256
(``info.OP_LIMITS``).
"""

from __future__ import annotations

import math
from typing import Any

from .attention import attention_tiled
from .shaders import bucket, f32_bits, workgroups

#: Most keys (= rows) attention_full runs through attention_tiled.comp. On lavapipe (Mesa 22.3.6, LLVM 15) that
#: shader's result is wrong for a query with more than about 2920 keys (nmse 0.06 at 3072 full rows,
#: 0.4 at 4096; the text model's causal prompts from row ~2928 on when its flash attention takes it),
#: while attention.comp is right there (nmse 2e-12 at 3072); 2048 keys were right (nmse 1e-12).
TILED_MAX_KEYS = 2048


class VulkanVisionOps:
    """The vision ops' hooks of :class:`~cooktop.backends.vulkan.device.VulkanDevice` (mixed in)."""

    def _layer_norm(self: Any, out, x, w, b, eps):
        """layer_norm.comp: one workgroup of 64 per row."""
        n = self._rows(x)
        bias = b.handle if b is not None else self._dummy_tensor()
        self._dispatch_raw("layer_norm", (x.handle, w.handle, bias, out.handle),
                           workgroups(bucket(n, self._row_cap(x))),
                           (x.shape[-1], n, int(b is not None), f32_bits(eps)))

    def _gelu(self: Any, out, x):
        """gelu.comp: ``out = gelu_tanh(x)``, f32 (``out`` may be ``x``)."""
        self._dispatch("gelu", (x, out), self._stride_groups(out), (math.prod(out.shape),))

    def _gelu_erf(self: Any, out, x):
        """gelu.comp with GELU_ERF: ``out = 0.5 x (1 + erf(x / sqrt(2)))``, f32 (``out`` may be ``x``)."""
        self._dispatch("gelu_erf", (x, out), self._stride_groups(out), (math.prod(out.shape),))

    def _gelu_quick(self: Any, out, x):
        """gelu.comp with GELU_QUICK: ``out = x * sigmoid(1.702 x)``, f32 (``out`` may be ``x``)."""
        self._dispatch("gelu_quick", (x, out), self._stride_groups(out), (math.prod(out.shape),))

    def _avg_pool2d(self: Any, out, x, width, height, k):
        """avg_pool2d.comp: one invocation per output value (grid-stride)."""
        n = math.prod(out.shape)
        self._dispatch("avg_pool2d", (x, out), self._stride_groups(out), (width, k, x.shape[1], n))

    def _rope_multi(self: Any, out, x, pos, head_dim, sections, freq_base):
        """rope_multi.comp: one invocation per (row, head, pair) (grid-stride)."""
        n, width = x.shape
        self._dispatch("rope_multi", (x, pos, out), self._stride_grid(n * width // 2, int(out.root.handle.size())),
                       (head_dim, n, width // head_dim, *sections, f32_bits(math.log2(freq_base))))

    def _attention_full(self: Any, out, q, k, v, n_head, scale):
        """The flash attention shaders with every row's pos ``n_tokens - 1`` (module doc)."""
        pos = self._full_attention_pos(q.shape[0])
        if k.shape[0] <= TILED_MAX_KEYS and attention_tiled(self, out, q, k, v, pos, n_head, n_head, scale, 0,
                                                           None, None):
            return
        n = self._rows(q)
        self._dispatch("attention", (q, k, v, pos, pos, out), workgroups(bucket(n, self._row_cap(q)) * n_head),
                       (n, n_head, n_head, q.shape[-1] // n_head, k.shape[0], f32_bits(scale), 0, 0,
                        int(k.ggml_type), int(v.ggml_type)))
