"""The numpy backend's recurrent ops (:mod:`cooktop.backends.recurrent_ops`): the short causal
convolution with a carried state (``ssm_conv``), the gated delta rule (``gated_delta_net``) and the
small ops around them (``mul``, ``silu``, ``sigmoid_mul``, ``l2_norm``, ``gdn_gate``).

``ssm_conv`` takes each slot's rows at once: the slot's state and its rows' inputs stacked
(``[d_conv - 1 + m, C]``, llama.cpp's ``ggml_concat``), then the ``d_conv`` shifted products added
in kernel order in float32 (ggml's ``ssm_conv_f32`` sums ``k = 0 .. d_conv - 1`` into a float),
then the last ``d_conv - 1`` rows written back as the slot's state.

``gated_delta_net`` runs each slot's rows in order, one token at a time as ggml's CPU kernel does,
every value head at once (float32 ``[H_v, d, d]`` products; sums in numpy's order, so equal to
ggml's within float32 rounding, not bit for bit).
"""

from __future__ import annotations

import numpy as np

from ..tensor import DeviceTensor


def _runs(slots: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first row, end row, slot)`` of each run of consecutive rows of one slot."""
    out, i, n = [], 0, len(slots)
    while i < n:
        j = i + 1
        while j < n and slots[j] == slots[i]:
            j += 1
        out.append((i, j, int(slots[i])))
        i = j
    return out


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

    def _silu(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """See :meth:`RecurrentOps.silu <cooktop.backends.recurrent_ops.RecurrentOps.silu>`."""
        xa = _a(x)
        with np.errstate(over="ignore"):
            np.divide(xa, np.float32(1.0) + np.exp(-xa), out=_a(out))

    def _sigmoid_mul(self, out: DeviceTensor, a: DeviceTensor, gate: DeviceTensor) -> None:
        """See :meth:`RecurrentOps.sigmoid_mul <cooktop.backends.recurrent_ops.RecurrentOps.sigmoid_mul>`."""
        with np.errstate(over="ignore"):
            sig = np.float32(1.0) / (np.float32(1.0) + np.exp(-_a(gate)))
        np.multiply(_a(a), sig, out=_a(out))

    def _l2_norm(self, out: DeviceTensor, x: DeviceTensor, group: int, eps: float) -> None:
        """See :meth:`RecurrentOps.l2_norm <cooktop.backends.recurrent_ops.RecurrentOps.l2_norm>`."""
        xa = _a(x)
        n, width = xa.shape
        xg = xa.reshape(n, width // group, group)
        mean = np.einsum("rgi,rgi->rg", xg, xg, dtype=np.float32) / np.float32(group)
        scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps / group))
        _a(out)[...] = (xg * scale[..., None] * np.float32(1.0 / np.sqrt(group))).reshape(n, width)

    def _gdn_gate(self, g: DeviceTensor, beta: DeviceTensor, alpha: DeviceTensor, b: DeviceTensor,
                  dt_bias: DeviceTensor, a: DeviceTensor) -> None:
        """See :meth:`RecurrentOps.gdn_gate <cooktop.backends.recurrent_ops.RecurrentOps.gdn_gate>`."""
        x = _a(alpha) + _a(dt_bias)
        with np.errstate(over="ignore"):
            sp = np.where(x > 20.0, x, np.log(np.float32(1.0) + np.exp(np.minimum(x, 20.0))))
            bb = np.float32(1.0) / (np.float32(1.0) + np.exp(-_a(b)))
        _a(beta)[...] = bb
        _a(g)[...] = sp.astype(np.float32) * _a(a)

    def _gated_delta_net(self, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor,
                         g: DeviceTensor, beta: DeviceTensor, state: DeviceTensor, slots: DeviceTensor) -> None:
        """See :meth:`RecurrentOps.gated_delta_net
        <cooktop.backends.recurrent_ops.RecurrentOps.gated_delta_net>`."""
        qa, ka, va, ga, ba, sa, oa = _a(q), _a(k), _a(v), _a(g), _a(beta), _a(state), _a(out)
        n, h_v = ga.shape
        d = va.shape[1] // h_v
        h_k = qa.shape[1] // d
        heads = np.arange(h_v) % h_k  # value head h reads key head h mod H_k
        scale = np.float32(1.0 / np.sqrt(np.float32(d)))
        for i0, i1, s in _runs(np.asarray(_a(slots), dtype=np.int64)):
            m = np.array(sa[s].reshape(h_v, d, d))  # m[h, j, i] = S_h[i][j]
            for i in range(i0, i1):
                qh = qa[i].reshape(h_k, d)[heads]
                kh = ka[i].reshape(h_k, d)[heads]
                m *= np.exp(ga[i])[:, None, None]
                sk = np.matmul(m, kh[:, :, None])[:, :, 0]
                u = (va[i].reshape(h_v, d) - sk) * ba[i][:, None]
                m += u[:, :, None] * kh[:, None, :]
                oa[i] = (np.matmul(m, qh[:, :, None])[:, :, 0] * scale).reshape(-1)
            sa[s] = m.reshape(-1)
