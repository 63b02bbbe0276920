"""The numpy backend's recurrent ops (:mod:`cooktop.backends.recurrent_ops`): the short causal
convolution with a carried state (``ssm_conv``), the gated delta rule (``gated_delta_net``), Mamba-2's
selective scan (``ssm_scan``) and the small ops around them (``mul``, ``silu``, ``sigmoid_mul``,
``l2_norm``, ``gdn_gate``, ``ssm_norm``, ``scale``).

``ssm_scan`` runs each slot's rows one token at a time as ggml's CPU kernel does, every head at once
(float32 ``[H, P, N]`` products; the dot product over the state in float32, ggml's order aside).

``ssm_conv`` takes each slot's rows at once: the slot's state and its rows' inputs stacked
(``[d_conv - 1 + m, C]``, llama.cpp's ``ggml_concat``), then the ``d_conv`` shifted products added
in kernel order in float32 (ggml's ``ssm_conv_f32`` sums ``k = 0 .. d_conv - 1`` into a float),
then the last ``d_conv - 1`` rows written back as the slot's state.

``gated_delta_net`` runs each slot's rows in order: a run of fewer than :data:`GDN_CHUNKED_MIN` rows
one token at a time as ggml's CPU kernel does, every value head at once (float32 ``[H_v, d, d]``
products); a longer run (a prompt) in chunks of :data:`GDN_CHUNK` tokens, the chunkwise form of the
delta rule (:func:`gdn_chunk`, llama.cpp src/models/delta-net-base.cpp ``build_delta_net_chunking``:
the same recurrence solved for a chunk at once with a triangular system), in float64. Both equal
ggml's token-by-token result within float32 rounding, not bit for bit.
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


#: Tokens per chunk of the chunkwise delta rule (llama.cpp's ``CHUNK_SIZE`` in build_delta_net_chunking).
GDN_CHUNK = 64
#: Rows of one slot from which the chunkwise form is used (fewer: token by token).
GDN_CHUNKED_MIN = 8


def gdn_chunk(s: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
              beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One chunk of the gated delta rule for every head at once, in closed form.

    s: float64 [H, d, d], ``s[h, i, j]`` the state ``S_h[i][j]`` before the chunk; q, k, v: [C, H, d]
    (the heads' key rows already picked per value head); g, beta: [C, H]. Returns (out [C, H, d] before
    the ``1 / sqrt(d)`` scale, the state after the chunk [H, d, d]). With ``G`` the running sum of ``g``
    over the chunk (``gamma_t = exp(G_t)``) the recurrence of ``RecurrentOps.gated_delta_net`` gives

        u_t = beta_t (v_t - gamma_t S_0^T k_t - sum_{s<t} exp(G_t - G_s) (k_t . k_s) u_s)
        (I + A) U = diag(beta) (V - diag(gamma) K S_0),  A[t, s] = beta_t exp(G_t - G_s) (k_t . k_s), s < t
        o_t = gamma_t S_0^T q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) u_s
        S_C = gamma_C S_0 + K^T diag(exp(G_C - G)) U

    (the WY form of the delta rule: Yang et al., "Gated Delta Networks", 2024; llama.cpp
    src/models/delta-net-base.cpp ``build_delta_net_chunking``).
    """
    n = q.shape[0]
    qh, kh, vh = (np.transpose(x, (1, 0, 2)) for x in (q, k, v))  # [H, C, d]
    G = np.cumsum(g.T, axis=1)  # [H, C]
    diff = G[:, :, None] - G[:, None, :]  # G_t - G_s
    lower = np.tril(np.ones((n, n), dtype=bool))
    decay = np.where(lower, np.exp(np.where(lower, diff, 0.0)), 0.0)  # exp(G_t - G_s), s <= t
    gamma = np.exp(G)
    kk = np.matmul(kh, np.transpose(kh, (0, 2, 1)))  # k_t . k_s
    a = beta.T[:, :, None] * decay * kk
    a[:, np.arange(n), np.arange(n)] = 0.0  # strictly lower
    rhs = beta.T[:, :, None] * (vh - gamma[:, :, None] * np.matmul(kh, s))
    u = np.linalg.solve(a + np.eye(n), rhs)  # [H, C, d]
    qk = np.matmul(qh, np.transpose(kh, (0, 2, 1))) * decay
    out = gamma[:, :, None] * np.matmul(qh, s) + np.matmul(qk, u)
    tail = np.exp(G[:, -1:] - G)  # [H, C]
    s_new = gamma[:, -1, None, None] * s + np.matmul(np.transpose(kh, (0, 2, 1)), tail[:, :, None] * u)
    return np.transpose(out, (1, 0, 2)), s_new


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
                         g: DeviceTensor, beta: DeviceTensor, state: DeviceTensor, slots: DeviceTensor,
                         interleaved: bool) -> None:
        """See :meth:`RecurrentOps.gated_delta_net
        <cooktop.backends.recurrent_ops.RecurrentOps.gated_delta_net>`."""
        qa, ka, va, ga, ba, sa, oa = _a(q), _a(k), _a(v), _a(g), _a(beta), _a(state), _a(out)
        n, h_v = ga.shape
        d = va.shape[1] // h_v
        h_k = qa.shape[1] // d
        # value head h reads key head h mod H_k (tiled), or h // (H_v / H_k) (repeat-interleaved)
        heads = np.arange(h_v) // (h_v // h_k) if interleaved else np.arange(h_v) % h_k
        scale = np.float32(1.0 / np.sqrt(np.float32(d)))
        for i0, i1, s in _runs(np.asarray(_a(slots), dtype=np.int64)):
            if i1 - i0 >= GDN_CHUNKED_MIN:  # a prompt: chunk by chunk, in closed form
                st = sa[s].reshape(h_v, d, d).transpose(0, 2, 1).astype(np.float64)  # st[h, i, j] = S_h[i][j]
                for c0 in range(i0, i1, GDN_CHUNK):
                    c1 = min(c0 + GDN_CHUNK, i1)
                    rows = slice(c0, c1)
                    o, st = gdn_chunk(st, qa[rows].reshape(-1, h_k, d)[:, heads].astype(np.float64),
                                      ka[rows].reshape(-1, h_k, d)[:, heads].astype(np.float64),
                                      va[rows].reshape(-1, h_v, d).astype(np.float64),
                                      ga[rows].astype(np.float64), ba[rows].astype(np.float64))
                    oa[rows] = (o * float(scale)).reshape(c1 - c0, -1)
                sa[s] = st.transpose(0, 2, 1).reshape(-1)
                continue
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

    def _ssm_scan(self, out: DeviceTensor, xbc: DeviceTensor, dt: DeviceTensor, a: DeviceTensor, d: DeviceTensor,
                  dt_bias: DeviceTensor, state: DeviceTensor, slots: DeviceTensor) -> None:
        """See :meth:`RecurrentOps.ssm_scan <cooktop.backends.recurrent_ops.RecurrentOps.ssm_scan>`."""
        xa, dta, sa, oa = _a(xbc), _a(dt), _a(state), _a(out)
        n, h = dta.shape
        d_inner = oa.shape[1]
        p = d_inner // h
        n_state = sa.shape[1] // d_inner
        g = (xa.shape[1] - d_inner) // (2 * n_state)
        groups = np.arange(h) // (h // g)  # head h reads group h // (H / G)
        av, dv, bias = _a(a)[:, 0], _a(d)[:, 0], _a(dt_bias)
        x = xa[:, :d_inner].reshape(n, h, p)
        bm = xa[:, d_inner:d_inner + g * n_state].reshape(n, g, n_state)[:, groups]  # [n, H, N]
        cm = xa[:, d_inner + g * n_state:].reshape(n, g, n_state)[:, groups]
        v = dta + bias
        with np.errstate(over="ignore"):
            sp = np.where(v > 20.0, v, np.log(np.float32(1.0) + np.exp(np.minimum(v, 20.0)))).astype(np.float32)
        decay = np.exp(sp * av).astype(np.float32)  # [n, H]
        xdt = x * sp[:, :, None]  # [n, H, P]
        skip = x * dv[:, None]
        for i0, i1, sl in _runs(np.asarray(_a(slots), dtype=np.int64)):
            st = np.array(sa[sl].reshape(h, p, n_state))
            for i in range(i0, i1):
                st *= decay[i][:, None, None]
                st += xdt[i][:, :, None] * bm[i][:, None, :]
                y = np.matmul(st, cm[i][:, :, None])[:, :, 0]
                oa[i] = (y + skip[i]).reshape(-1)
            sa[sl] = st.reshape(-1)

    def _ssm_norm(self, out: DeviceTensor, y: DeviceTensor, z: DeviceTensor, w: DeviceTensor, eps: float) -> None:
        """See :meth:`RecurrentOps.ssm_norm <cooktop.backends.recurrent_ops.RecurrentOps.ssm_norm>`."""
        za, wa = _a(z), _a(w)
        with np.errstate(over="ignore"):
            gated = _a(y) * (za / (np.float32(1.0) + np.exp(-za)))
        n, width = gated.shape
        grp = gated.reshape(n, wa.shape[0], wa.shape[1])
        ms = np.mean(grp * grp, axis=-1, keepdims=True, dtype=np.float32)
        _a(out)[...] = (grp * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * wa).reshape(n, width)

    def _scale(self, out: DeviceTensor, x: DeviceTensor, s: float) -> None:
        """See :meth:`RecurrentOps.scale <cooktop.backends.recurrent_ops.RecurrentOps.scale>`."""
        np.multiply(_a(x), np.float32(s), out=_a(out))
