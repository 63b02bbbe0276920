"""The numpy backend's recurrent ops (:mod:`cooktop.backends.recurrent_ops`): the short causal
convolution with a carried state (``ssm_conv``) and the elementwise product (``mul``).

``ssm_conv`` takes each slot's rows at once: the slot's state and its rows' inputs stacked
(``[d_conv - 1 + m, C]``, llama.cpp's ``ggml_concat``), then the ``d_conv`` shifted products added
in kernel order in float32 (ggml's ``ssm_conv_f32`` sums ``k = 0 .. d_conv - 1`` into a float),
then the last ``d_conv - 1`` rows written back as the slot's state.
"""

from __future__ import annotations

import numpy as np

from ..tensor import DeviceTensor


def _a(t: DeviceTensor) -> np.ndarray:
    """The numpy view of an activation tensor (honouring ``head`` views)."""
    return t.handle[: t.shape[0]] if t.handle.shape[0] != t.shape[0] else t.handle


class CpuRecurrentOps:
    """``_ssm_conv`` and ``_mul`` of :class:`~cooktop.backends.cpu.device.CpuDevice` (mixed in)."""

    def _ssm_conv(self, out: DeviceTensor, x: DeviceTensor, state: DeviceTensor, w: DeviceTensor,
                  slots: DeviceTensor) -> None:
        """See :meth:`RecurrentOps.ssm_conv <cooktop.backends.recurrent_ops.RecurrentOps.ssm_conv>`."""
        xa, oa, sa, wa = _a(x), _a(out), _a(state), _a(w)
        sl = np.asarray(_a(slots), dtype=np.int64)
        n, c = xa.shape
        k = wa.shape[1]
        i = 0
        while i < n:  # runs of consecutive rows of one slot (a sequence's tokens)
            j = i + 1
            while j < n and sl[j] == sl[i]:
                j += 1
            s = int(sl[i])
            win = np.concatenate([sa[s].reshape(k - 1, c), xa[i:j]]).astype(np.float32, copy=False)
            m = j - i
            acc = win[0:m] * wa[:, 0]
            for t in range(1, k):
                acc += win[t:t + m] * wa[:, t]
            oa[i:j] = acc
            sa[s] = win[m:].reshape(-1)
            i = j

    def _mul(self, out: DeviceTensor, a: DeviceTensor, b: DeviceTensor) -> None:
        """See :meth:`RecurrentOps.mul <cooktop.backends.recurrent_ops.RecurrentOps.mul>`."""
        np.multiply(_a(a), _a(b), out=_a(out))
