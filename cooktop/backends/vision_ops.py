"""The vision encoders' half of the op contract: what a CLIP / SigLIP ViT (llama.cpp tools/mtmd/clip.cpp
``build_vit``, tools/mtmd/models/*.cpp) runs besides the text model's ops: ``layer_norm`` (ggml's
``ggml_norm`` with its weight and bias), the three GELUs (``gelu``, ``gelu_erf``, ``gelu_quick``),
``attention_full`` (non-causal multi-head attention over one image's patches, no KV cache) and
``avg_pool2d`` (the patch grid's non-overlapping average pool, Gemma 3's projector) and ``rope_multi``
(ggml's multi-section rope in vision mode: Qwen2-VL's 2-D patch positions).

Layout (numpy order, as the rest of the contract): activations f32 ``[n_tokens, n]``, one row per
patch; a patch grid of ``height x width`` patches is token-major, token ``y * width + x``.

:class:`VisionOps` is a base of :class:`~cooktop.backends.ops.DeviceOps`: the public methods check
their arguments with their specs of the op table (``optable.py``) and call ``_op`` hooks whose
default raises :class:`UnsupportedOpError`; a backend that implements them lists
``optable.VISION_OPS`` in its ``DeviceInfo.ops``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import UnsupportedOpError
from .optable import SPECS
from .tensor import DeviceTensor

_LAYER_NORM, _GELU, _GELU_ERF, _GELU_QUICK = (SPECS[n] for n in ("layer_norm", "gelu", "gelu_erf", "gelu_quick"))
_ATTENTION_FULL, _AVG_POOL2D, _ROPE_MULTI = SPECS["attention_full"], SPECS["avg_pool2d"], SPECS["rope_multi"]

#: ggml's GGML_ROPE_TYPE_VISION (ggml.h): the one mode of :meth:`VisionOps.rope_multi`.
ROPE_VISION = 24


class VisionOps:
    """The vision ops (module doc). Mixed into ``DeviceOps``; each public op runs its spec's
    check (``optable``) and then its hook."""

    def layer_norm(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, b: DeviceTensor | None = None,
                   eps: float = 1e-6) -> None:
        """Layer norm of each row, then its weight and bias::

            mean = sum(x[r]) / n;  var = sum((x[r] - mean)^2) / n          (the biased variance)
            out[r] = (x[r] - mean) / sqrt(var + eps) * w + b

        x, out: f32 [n_rows, n] (``out`` may be ``x``); w: f32 [n]; b: f32 [n] or None (no bias);
        eps: float (clip.cpp's ``hparams.eps``, 1e-6 for SigLIP, 1e-5 for CLIP).

        Formula: ggml ``ggml_norm`` (ggml-cpu/ops.cpp ``ggml_compute_forward_norm_f32``: the mean,
        then the mean of the squared deviations, ``1 / sqrtf(variance + eps)``), then ``ggml_mul`` and
        ``ggml_add``: llama.cpp tools/mtmd/clip.cpp ``build_norm`` with ``NORM_TYPE_NORMAL``.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _LAYER_NORM.check(self, out, x, w, b, eps=eps)
        self._layer_norm(out, x, w, b, float(eps))

    def gelu(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """GELU in its tanh form, elementwise: ``out = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``.

        x, out: f32 of one shape (``out`` may be ``x``). Formula: ggml ``ggml_gelu``
        (ggml-cpu/vec.h ``ggml_gelu_f32``). ggml's CPU f32 path (``GGML_GELU_FP16``, defined in vec.h)
        rounds ``x`` to fp16 and reads the result from a table of fp16 values (0 for x <= -10, x for
        x >= 10), so it differs from the formula by fp16 rounding (relative ~5e-4); the backends here
        compute the formula in float32.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _GELU.check(self, out, x)
        self._gelu(out, x)

    def gelu_erf(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """Exact GELU, elementwise: ``out = 0.5 x (1 + erf(x / sqrt(2)))``.

        x, out: f32 of one shape (``out`` may be ``x``). Formula: ggml ``ggml_gelu_erf``
        (ggml-cpu/vec.h ``ggml_vec_gelu_erf_f32``, float32 ``erff``; no table).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _GELU_ERF.check(self, out, x)
        self._gelu_erf(out, x)

    def gelu_quick(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """Quick GELU, elementwise: ``out = x / (1 + exp(-1.702 x))``.

        x, out: f32 of one shape (``out`` may be ``x``). Formula: ggml ``ggml_gelu_quick``
        (ggml-cpu/vec.h ``ggml_gelu_quick_f32``, ``GELU_QUICK_COEF = -1.702``). ggml's CPU f32 path
        (``GGML_GELU_QUICK_FP16``) reads an fp16 table indexed by ``x`` rounded to fp16, as for
        :meth:`gelu`.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _GELU_QUICK.check(self, out, x)
        self._gelu_quick(out, x)

    def attention_full(self, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, n_head: int,
                       scale: float) -> None:
        """Non-causal multi-head attention over all rows, without a KV cache or mask (a ViT's
        self-attention over one image's patches). For each head ``h`` (columns
        ``h * head_dim .. (h + 1) * head_dim``)::

            out[:, h] = softmax(q[:, h] k[:, h]^T * scale) v[:, h]      (softmax over each row, all keys)

        q, k, v, out: f32 [n_tokens, n_head * head_dim] (``out`` not one of them); n_head > 0 dividing
        the width; scale: float (``1 / sqrt(head_dim)`` in clip.cpp). The device kernels never hold an
        ``[n_tokens, n_tokens]`` matrix: they run the softmax online over tiles of keys (flash
        attention), so n_tokens = 4096 (Gemma 3's 64 x 64 patches) runs in the memory of its inputs.

        Formula: llama.cpp tools/mtmd/clip.cpp ``build_attn`` (``ggml_flash_attn_ext`` or ``mul_mat``,
        ``soft_max_ext`` with ``kq_scale``, ``mul_mat``) with no mask.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``; UnsupportedOpError also
            for a head_dim past the device's ``op_limits``.
        """
        _ATTENTION_FULL.check(self, out, q, k, v, n_head=n_head, scale=scale)
        self._attention_full(out, q, k, v, int(n_head), float(scale))

    def avg_pool2d(self, out: DeviceTensor, x: DeviceTensor, width: int, height: int, k: int) -> None:
        """Average pool of a patch grid over non-overlapping ``k x k`` windows (stride k, no padding)::

            out[Y * (width // k) + X, c] = sum_{dy, dx < k} x[(k Y + dy) * width + k X + dx, c] / k^2

        x: f32 [height * width, c], token-major (token ``y * width + x``); out: f32
        [(height // k) * (width // k), c]; width and height divisible by k > 0 (else ShapeError).

        Formula: ggml ``ggml_pool_2d`` with ``GGML_OP_POOL_AVG``, kernel and stride k, no padding
        (ggml-cpu/ops.cpp ``ggml_compute_forward_pool_2d``: the window's sum divided by k * k),
        on the ``[width, height, c]`` view llama.cpp tools/mtmd/models/siglip.cpp builds for Gemma 3's
        projector.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _AVG_POOL2D.check(self, out, x, width=width, height=height, k=k)
        self._avg_pool2d(out, x, int(width), int(height), int(k))

    def rope_multi(self, out: DeviceTensor, x: DeviceTensor, pos: DeviceTensor, head_dim: int,
                   sections: tuple[int, int, int, int], freq_base: float, mode: int = ROPE_VISION) -> None:
        """Multi-section rope of each head in ggml's vision mode (Qwen2-VL / Qwen2.5-VL encoders' 2-D
        rotary positions). With ``n_dims = head_dim / 2`` pairs ``(i, i + n_dims)`` per head and
        ``S = sum(sections)``, pair ``i`` has sector ``c = i mod S``, its section ``s`` (the first ``s``
        with ``c < sections[0] + ... + sections[s]``) and its index ``j = c - (sections[0] + ... +
        sections[s - 1])`` there::

            theta = pos[s, row] * freq_base^(-2 j / n_dims)
            out[i]          = x[i] cos(theta) - x[i + n_dims] sin(theta)
            out[i + n_dims] = x[i] sin(theta) + x[i + n_dims] cos(theta)

        x, out: f32 [n, n_head * head_dim] (``out`` may be ``x``); pos: I32 [4, n], row ``s`` the
        positions of section ``s`` (ggml's flat ``[4 * n]`` positions as 4 rows; clip.cpp's Qwen2-VL
        writes y, x, y, x); head_dim even; sections: four values > 0 (Qwen2-VL: ``head_dim / 4`` each,
        so the ``n_dims`` pairs are the y section then the x section); mode: 24 only
        (``GGML_ROPE_TYPE_VISION``); freq_scale 1, no YaRN, no frequency factors (what clip.cpp passes).

        Formula: ggml ``ggml_rope_multi`` with ``GGML_ROPE_TYPE_VISION`` and ``n_dims = head_dim / 2``
        (ggml-cpu/ops.cpp ``ggml_mrope_cache_init`` with ``indep_sects``: each section's theta restarts
        at its first pair; ``rotate_pairs`` with ``n_offset = n_dims``); llama.cpp
        tools/mtmd/models/qwen2vl.cpp.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps`` (a mode other than 24 or a
            section of 0: ShapeError).
        """
        secs = tuple(int(v) for v in sections)
        _ROPE_MULTI.check(self, out, x, pos, head_dim=head_dim, sections=secs, freq_base=freq_base, mode=mode)
        self._rope_multi(out, x, pos, int(head_dim), secs, float(freq_base))

    # -- for the device backends ----
    def _full_attention_pos(self: Any, n: int) -> DeviceTensor:
        """An I32 [n] tensor of ``n - 1`` everywhere, kept per ``n`` on this device: the ``pos`` that makes
        the causal KV-cache attention kernels (every row attends to rows ``0 .. pos``) attend every row to
        all ``n`` rows, which is :meth:`attention_full` with ``k`` and ``v`` as F32 caches of ``n`` cells."""
        cache = self.__dict__.setdefault("_vision_full_pos", {})
        t = cache.get(n)
        if t is None:
            t = self.empty((n,), GGMLQuantizationType.I32)
            self.write(t, np.full(n, n - 1, dtype=np.int32))
            cache[n] = t
        return t

    # -- the backend's hooks (arguments checked; default: not supported) ----
    def _vision_unsupported(self, op: str) -> None:
        info = getattr(self, "info", None)
        where = f"{info.selector} ({info.name})" if info is not None else "this device"
        raise UnsupportedOpError(f"{where}: {op} is not supported on this backend")

    def _layer_norm(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, b: DeviceTensor | None,
                    eps: float) -> None:
        """Enqueue :meth:`layer_norm`."""
        self._vision_unsupported("layer_norm")

    def _gelu(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """Enqueue :meth:`gelu`."""
        self._vision_unsupported("gelu")

    def _gelu_erf(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """Enqueue :meth:`gelu_erf`."""
        self._vision_unsupported("gelu_erf")

    def _gelu_quick(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """Enqueue :meth:`gelu_quick`."""
        self._vision_unsupported("gelu_quick")

    def _attention_full(self, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, n_head: int,
                        scale: float) -> None:
        """Enqueue :meth:`attention_full`."""
        self._vision_unsupported("attention_full")

    def _avg_pool2d(self, out: DeviceTensor, x: DeviceTensor, width: int, height: int, k: int) -> None:
        """Enqueue :meth:`avg_pool2d`."""
        self._vision_unsupported("avg_pool2d")

    def _rope_multi(self, out: DeviceTensor, x: DeviceTensor, pos: DeviceTensor, head_dim: int,
                    sections: tuple[int, ...], freq_base: float) -> None:
        """Enqueue :meth:`rope_multi`."""
        self._vision_unsupported("rope_multi")
