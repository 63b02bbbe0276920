"""The numpy backend's vision ops (:mod:`cooktop.backends.vision_ops`): ``layer_norm``, the GELUs
(``gelu``, ``gelu_erf``, ``gelu_quick``), ``attention_full``, ``avg_pool2d`` and ``rope_multi``, the
references the device kernels are tested against.

The GELUs follow their formulas in float32 (not ggml's CPU fp16 tables: ``VisionOps.gelu``);
``gelu_erf``'s ``erf`` is :func:`erf` (numpy has none). ``rope_multi`` runs ggml's theta loop in float32.
``layer_norm`` takes the mean and the biased variance of each row in float64, as ggml's ``ggml_norm``
sums in ``ggml_float``. ``attention_full`` runs each head over blocks of :data:`ATTN_ROWS` query rows (a
block's scores ``[rows, n_tokens]`` in float32, the softmax with the row's maximum subtracted), so 4096
tokens cost 16 MiB of scores at a time.
"""

from __future__ import annotations

import numpy as np

from ..tensor import DeviceTensor

#: Query rows per block of ``attention_full`` (scores held: ATTN_ROWS x n_tokens float32).
ATTN_ROWS = 1024

# Abramowitz & Stegun 7.1.26: erf(x) = 1 - (a1 t + ... + a5 t^5) exp(-x^2), t = 1 / (1 + p x), x >= 0
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: np.ndarray) -> np.ndarray:
    """``erf(x)`` elementwise in float64 (Abramowitz & Stegun 7.1.26, absolute error <= 1.5e-7, under
    float32's half ulp at 1), odd in ``x``. x: any float array; returns float64 of its shape."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    t = 1.0 / (1.0 + _ERF_P * a)
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    return np.copysign(1.0 - poly * np.exp(-a * a), x)


def _a(t: DeviceTensor) -> np.ndarray:
    """The numpy view of an activation tensor (honouring ``head`` views)."""
    return t.handle[: t.shape[0]] if t.handle.shape[0] != t.shape[0] else t.handle


class CpuVisionOps:
    """The vision ops' hooks of :class:`~cooktop.backends.cpu.device.CpuDevice` (mixed in)."""

    def _layer_norm(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, b: DeviceTensor | None,
                    eps: float) -> None:
        """See :meth:`VisionOps.layer_norm <cooktop.backends.vision_ops.VisionOps.layer_norm>`."""
        xa = _a(x)
        x64 = xa.astype(np.float64)
        mean = x64.mean(axis=1, keepdims=True)
        d = x64 - mean
        var = np.mean(d * d, axis=1, keepdims=True)
        scale = (1.0 / np.sqrt(var + eps)).astype(np.float32)
        y = d.astype(np.float32) * scale * _a(w)
        if b is not None:
            y += _a(b)
        _a(out)[...] = y

    def _gelu(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """See :meth:`VisionOps.gelu <cooktop.backends.vision_ops.VisionOps.gelu>`."""
        g = _a(x)
        c = np.float32(0.7978845608028654)  # sqrt(2 / pi), ggml's SQRT_2_OVER_PI
        t = np.tanh(c * g * (np.float32(1.0) + np.float32(0.044715) * g * g))
        np.multiply(np.float32(0.5) * g, np.float32(1.0) + t, out=_a(out))

    def _gelu_erf(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """See :meth:`VisionOps.gelu_erf <cooktop.backends.vision_ops.VisionOps.gelu_erf>`."""
        g = _a(x)
        _a(out)[...] = 0.5 * g * (1.0 + erf(g * 0.7071067811865476))  # SQRT_2_INV

    def _gelu_quick(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """See :meth:`VisionOps.gelu_quick <cooktop.backends.vision_ops.VisionOps.gelu_quick>`."""
        g = _a(x)
        with np.errstate(over="ignore"):
            np.divide(g, np.float32(1.0) + np.exp(np.float32(-1.702) * g), out=_a(out))

    def _attention_full(self, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, n_head: int,
                        scale: float) -> None:
        """See :meth:`VisionOps.attention_full <cooktop.backends.vision_ops.VisionOps.attention_full>`."""
        qa, ka, va, oa = _a(q), _a(k), _a(v), _a(out)
        n, width = qa.shape
        d = width // n_head
        s = np.float32(scale)
        for h in range(n_head):
            cols = slice(h * d, (h + 1) * d)
            kh, vh = ka[:, cols], va[:, cols]
            for r0 in range(0, n, ATTN_ROWS):
                r1 = min(r0 + ATTN_ROWS, n)
                sc = (qa[r0:r1, cols] @ kh.T) * s
                sc -= sc.max(axis=1, keepdims=True)
                p = np.exp(sc)
                oa[r0:r1, cols] = (p @ vh) / p.sum(axis=1, keepdims=True)

    def _avg_pool2d(self, out: DeviceTensor, x: DeviceTensor, width: int, height: int, k: int) -> None:
        """See :meth:`VisionOps.avg_pool2d <cooktop.backends.vision_ops.VisionOps.avg_pool2d>`."""
        xa = _a(x)
        c = xa.shape[1]
        win = xa.reshape(height // k, k, width // k, k, c)
        _a(out)[...] = (win.sum(axis=(1, 3), dtype=np.float32) / np.float32(k * k)).reshape(-1, c)

    def _rope_multi(self, out: DeviceTensor, x: DeviceTensor, pos: DeviceTensor, head_dim: int,
                    sections: tuple[int, ...], freq_base: float) -> None:
        """See :meth:`VisionOps.rope_multi <cooktop.backends.vision_ops.VisionOps.rope_multi>`: ggml's
        cache loop (``ggml_mrope_cache_init``) in float32, each section's theta multiplied by
        ``theta_scale`` once per pair and restarted at its section's first pair."""
        xa, pa = _a(x), _a(pos).astype(np.float32)
        n, width = xa.shape
        nd = head_dim // 2
        theta_scale = np.float32(freq_base) ** np.float32(-2.0 / nd)
        starts = np.cumsum((0,) + tuple(sections))  # 0, s0, s0 + s1, s0 + s1 + s2, S
        theta = pa.copy()  # theta[s]: section s's running theta per row
        cos, sin = np.empty((nd, n), np.float32), np.empty((nd, n), np.float32)
        for i in range(nd):
            c = i % int(starts[4])
            for s in range(4):
                if c == starts[s]:
                    theta[s] = pa[s]
            s = int(np.searchsorted(starts[1:], c, side="right"))  # the section of sector c
            cos[i], sin[i] = np.cos(theta[s]), np.sin(theta[s])
            theta *= theta_scale
        xh = xa.reshape(n, width // head_dim, head_dim)
        x0, x1 = xh[:, :, :nd], xh[:, :, nd:]
        ct, st = cos.T[:, None, :], sin.T[:, None, :]
        _a(out)[...] = np.concatenate([x0 * ct - x1 * st, x0 * st + x1 * ct], axis=2).reshape(n, width)
