"""The recurrent layers' half of the op contract: the causal depthwise convolution with a carried
state (ggml's ``ssm_conv``), the gated delta rule with its state (ggml's ``gated_delta_net``), Mamba-2's
selective scan with its state (ggml's ``ssm_scan``) and the small ops around them (``mul``, ``silu``,
``sigmoid_mul``, ``l2_norm``, ``gdn_gate``, ``ssm_norm``, ``scale``).

Layout (numpy order, as the rest of the contract): ``n`` rows (tokens, of one or several
sequences), ``C`` channels. A convolution state holds, per *slot* (a sequence's state row), the
last ``d_conv - 1`` inputs of that sequence, oldest first: ``state f32 [n_slots, (d_conv - 1) * C]``,
row ``s`` viewed as ``[d_conv - 1, C]``. ``slots`` (I32 [n]) names each row's slot; the rows of one
slot are taken in order, so a batch may hold several sequences' tokens, each run after the other.
This is llama.cpp's ``ggml_concat(conv_state, x)`` then ``ggml_ssm_conv`` then the copy of the last
``d_conv - 1`` columns back to the state (src/models/lfm2.cpp), one op here.

:class:`RecurrentOps` is a base of :class:`~cooktop.backends.ops.DeviceOps`: the public methods check
their arguments with their specs of the op table (``optable.py``) and call ``_op`` hooks whose
default raises :class:`UnsupportedOpError`; a backend that implements them lists
``optable.RECURRENT_OPS`` in its ``DeviceInfo.ops`` (placement keeps a recurrent block on a device
that has them, with the reason).
"""

from __future__ import annotations

from ..errors import UnsupportedOpError
from .optable import SPECS
from .tensor import DeviceTensor

_SSM_CONV, _MUL, _SILU, _SIGMOID_MUL = SPECS["ssm_conv"], SPECS["mul"], SPECS["silu"], SPECS["sigmoid_mul"]
_L2_NORM, _GDN_GATE, _GDN = SPECS["l2_norm"], SPECS["gdn_gate"], SPECS["gated_delta_net"]
_SSM_SCAN, _SSM_NORM, _SCALE = SPECS["ssm_scan"], SPECS["ssm_norm"], SPECS["scale"]


class RecurrentOps:
    """The recurrent ops (module doc). Mixed into ``DeviceOps``; each public op runs its spec's
    check (``optable``) and then its hook."""

    def ssm_conv(self, out: DeviceTensor, x: DeviceTensor, state: DeviceTensor, w: DeviceTensor,
                 slots: DeviceTensor) -> None:
        """Causal depthwise 1-D convolution with a carried state, and the state's update.

        x: f32 [n, C] (the rows' inputs); w: f32 [C, d_conv] (one kernel per channel, GGUF
        ``ne = (d_conv, C)``); state: f32 [n_slots, (d_conv - 1) * C] (module doc); slots: I32 [n]
        in ``[0, n_slots)`` (outside: the caller's fault); out: f32 [n, C] (not ``x``).
        For row ``i`` of slot ``s``, with ``win = [state[s] as [d_conv - 1, C]; x[i]]``
        (d_conv rows, oldest first)::

            out[i, c] = sum_{k = 0 .. d_conv - 1} win[k, c] * w[c, k]   (summed in k order, float32)
            state[s] <- win[1:]                                          (x[i] becomes the newest)

        Formula: ggml ``ggml_ssm_conv`` (ggml/src/ggml-cpu/ops.cpp ``ggml_compute_forward_ssm_conv_f32``:
        a float sum in kernel order); the state prepended and written back as llama.cpp
        src/models/lfm2.cpp ``build_shortconv_block`` does.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SSM_CONV.check(self, out, x, state, w, slots)
        self._ssm_conv(out, x, state, w, slots)

    def mul(self, out: DeviceTensor, a: DeviceTensor, b: DeviceTensor) -> None:
        """``out = a * b`` elementwise, f32 of one shape (``out`` may be ``a`` or ``b``; ggml ``ggml_mul``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _MUL.check(self, out, a, b)
        self._mul(out, a, b)

    def silu(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """``out = x / (1 + exp(-x))`` elementwise, f32 of one shape (``out`` may be ``x``; ggml ``ggml_silu``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SILU.check(self, out, x)
        self._silu(out, x)

    def sigmoid_mul(self, out: DeviceTensor, a: DeviceTensor, gate: DeviceTensor) -> None:
        """``out = a * 1 / (1 + exp(-gate))`` elementwise, f32 of one shape (``out`` may be ``a`` or
        ``gate``; llama.cpp src/models/qwen35.cpp: the gated attention's ``ggml_sigmoid`` then ``ggml_mul``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SIGMOID_MUL.check(self, out, a, gate)
        self._sigmoid_mul(out, a, gate)

    def l2_norm(self, out: DeviceTensor, x: DeviceTensor, group: int, eps: float) -> None:
        """L2 norm of each group of ``group`` consecutive values of a row, as llama.cpp writes it
        (src/models/models.h ``build_gdn_l2_norm``: ``ggml_rms_norm`` with ``eps / group``, then
        ``ggml_scale`` by ``1 / sqrt(group)``)::

            out[r, grp] = x[r, grp] * (1 / sqrt(sum(x[r, grp]^2) / group + eps / group)) * (1 / sqrt(group))

        x, out: f32 [n, width] (``out`` may be ``x``), ``group`` dividing ``width`` (one head per group).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _L2_NORM.check(self, out, x, group=group, eps=eps)
        self._l2_norm(out, x, group, eps)

    def gdn_gate(self, g: DeviceTensor, beta: DeviceTensor, alpha: DeviceTensor, b: DeviceTensor,
                 dt_bias: DeviceTensor, a: DeviceTensor) -> None:
        """The gated delta rule's per-head gates (llama.cpp src/models/qwen35.cpp
        ``build_layer_attn_linear``)::

            g[i, h]    = softplus(alpha[i, h] + dt_bias[h]) * a[h]    (the log of the state's decay; a = -exp(A_log))
            beta[i, h] = 1 / (1 + exp(-b[i, h]))                      (the write strength)

        with ``softplus(x) = x if x > 20 else log(1 + exp(x))`` (ggml-cpu/unary-ops.cpp ``op_softplus``).
        alpha, b, g, beta: f32 [n, n_head] (``g`` may be ``alpha``, ``beta`` may be ``b``);
        dt_bias, a: f32 [n_head].

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _GDN_GATE.check(self, g, beta, alpha, b, dt_bias, a)
        self._gdn_gate(g, beta, alpha, b, dt_bias, a)

    def gated_delta_net(self, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor,
                        g: DeviceTensor, beta: DeviceTensor, state: DeviceTensor, slots: DeviceTensor,
                        interleaved: bool = False) -> None:
        """The gated delta rule (Gated DeltaNet's recurrence) with a carried state, and the state's update.

        Shapes (``d`` the head width, ``H_k`` key heads, ``H_v`` value heads, ``H_k`` dividing ``H_v``):
        q, k: f32 [n, H_k * d] (L2-normed by the caller); v, out: f32 [n, H_v * d]; g, beta:
        f32 [n, H_v] (:meth:`gdn_gate`); state: f32 [n_slots, H_v * d * d], row ``s`` viewed as
        ``M[h, j, i]`` = the state ``S_h[i][j]`` of slot ``s`` (ggml's transposed layout);
        slots: I32 [n] in ``[0, n_slots)`` (outside: the caller's fault). Value head ``h`` reads key
        head ``h' = h mod H_k`` (ggml's ``iq1 = iv1 % neq1``: q and k tiled, as llama.cpp
        src/models/qwen35.cpp's ``ggml_repeat``), or with ``interleaved`` key head
        ``h' = h // (H_v / H_k)`` (q and k repeat-interleaved, as llama.cpp src/models/qwen3next.cpp's
        ``ggml_repeat_4d`` on a ``[d, 1, H_k]`` view). The rows of one slot are taken in order,
        each with the state its previous row left::

            S_h  = exp(g[i, h]) * S_h
            u[j] = (v[i, h, j] - sum_i' S_h[i'][j] * k[i, h', i']) * beta[i, h]
            S_h[i'][j] += k[i, h', i'] * u[j]
            out[i, h, j] = (sum_i' S_h[i'][j] * q[i, h', i']) / sqrt(d)

        Formula: ggml ``ggml_gated_delta_net`` with one snapshot (ggml/src/ggml-cpu/ops.cpp
        ``ggml_compute_forward_gated_delta_net_one_chunk``); q, k, v, g and beta as llama.cpp
        src/models/qwen35.cpp builds them.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _GDN.check(self, out, q, k, v, g, beta, state, slots, interleaved=interleaved)
        self._gated_delta_net(out, q, k, v, g, beta, state, slots, bool(interleaved))

    def ssm_scan(self, out: DeviceTensor, xbc: DeviceTensor, dt: DeviceTensor, a: DeviceTensor, d: DeviceTensor,
                 dt_bias: DeviceTensor, state: DeviceTensor, slots: DeviceTensor) -> None:
        """Mamba-2's selective scan with a carried state, the dt bias and the D skip, and the state's update.

        Shapes (``H`` heads of ``P`` values, ``G`` groups dividing ``H``, ``N`` the state size): xbc:
        f32 [n, H * P + 2 * G * N], each row ``x`` [H, P], then ``B`` [G, N], then ``C`` [G, N] (llama.cpp's
        ``xBC`` after the convolution and silu); dt: f32 [n, H] (before its bias); a, d: f32 [H, 1]
        (GGUF ``ne = (1, H)``: ``a = -exp(A_log)``, one decay rate per head, and the skip factor);
        dt_bias: f32 [H]; state: f32 [n_slots, H * P * N], row ``s`` viewed as ``S[h, p, n]`` (ggml's
        ``{d_state, head_dim, n_head}``); slots: I32 [n] in ``[0, n_slots)`` (outside: the caller's
        fault); out: f32 [n, H * P]. Head ``h`` reads group ``g = h // (H / G)`` (ggml's
        repeat_interleave). The rows of one slot are taken in order, each with the state its previous
        row left::

            dt'[h]  = softplus(dt[i, h] + dt_bias[h])       softplus(v) = v if v > 20 else log(1 + exp(v))
            S[h]    = S[h] * exp(dt'[h] * a[h]) + (x[i, h, :] * dt'[h]) B[i, g, :]^T       [P, N]
            out[i, h, p] = sum_n S[h, p, n] * C[i, g, n] + x[i, h, p] * d[h]

        Formula: ggml ``ggml_ssm_scan`` (ggml/src/ggml-cpu/ops.cpp ``ggml_compute_forward_ssm_scan_f32``,
        the Mamba-2 branch: ``A`` a scalar per head, ``ggml_compute_softplus_f32``); the bias added to
        ``dt`` before it and ``y + x * D`` after it as llama.cpp src/models/mamba-base.cpp
        ``build_mamba2_layer`` does (``ggml_add(dt, ssm_dt_b)``, ``ggml_add(y, ggml_mul(x, ssm_d))``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SSM_SCAN.check(self, out, xbc, dt, a, d, dt_bias, state, slots)
        self._ssm_scan(out, xbc, dt, a, d, dt_bias, state, slots)

    def ssm_norm(self, out: DeviceTensor, y: DeviceTensor, z: DeviceTensor, w: DeviceTensor, eps: float) -> None:
        """Mamba-2's gated RMS norm over groups (llama.cpp src/models/mamba-base.cpp ``build_mamba2_layer``:
        ``ggml_swiglu_split(z, y)``, then ``build_norm`` of the ``[width / G, G]`` view by ``ssm_norm``)::

            g = y * silu(z)                        (float32)
            out[r, j] = g[r, j] / sqrt(mean(g[r, j]^2) + eps) * w[j]      for each group j of width / G

        y, z, out: f32 [n, width] (``out`` may be ``y`` or ``z``); w: f32 [G, width / G] (GGUF
        ``ne = (width / G, G)``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SSM_NORM.check(self, out, y, z, w, eps=eps)
        self._ssm_norm(out, y, z, w, eps)

    def scale(self, out: DeviceTensor, x: DeviceTensor, s: float) -> None:
        """``out = x * s`` elementwise in float32, f32 of one shape (``out`` may be ``x``; ggml ``ggml_scale``:
        Granite's residual and logit multipliers, llama.cpp src/models/granite-hybrid.cpp).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SCALE.check(self, out, x, s=s)
        self._scale(out, x, s)

    # -- the backend's hooks (arguments checked; default: not supported) ----
    def _recurrent_unsupported(self, op: str) -> None:
        info = getattr(self, "info", None)
        where = f"{info.selector} ({info.name})" if info is not None else "this device"
        raise UnsupportedOpError(f"{where}: {op} is not supported on this backend")

    def _ssm_conv(self, out: DeviceTensor, x: DeviceTensor, state: DeviceTensor, w: DeviceTensor,
                  slots: DeviceTensor) -> None:
        """Enqueue :meth:`ssm_conv`."""
        self._recurrent_unsupported("ssm_conv")

    def _mul(self, out: DeviceTensor, a: DeviceTensor, b: DeviceTensor) -> None:
        """Enqueue :meth:`mul`."""
        self._recurrent_unsupported("mul")

    def _silu(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """Enqueue :meth:`silu`."""
        self._recurrent_unsupported("silu")

    def _sigmoid_mul(self, out: DeviceTensor, a: DeviceTensor, gate: DeviceTensor) -> None:
        """Enqueue :meth:`sigmoid_mul`."""
        self._recurrent_unsupported("sigmoid_mul")

    def _l2_norm(self, out: DeviceTensor, x: DeviceTensor, group: int, eps: float) -> None:
        """Enqueue :meth:`l2_norm`."""
        self._recurrent_unsupported("l2_norm")

    def _gdn_gate(self, g: DeviceTensor, beta: DeviceTensor, alpha: DeviceTensor, b: DeviceTensor,
                  dt_bias: DeviceTensor, a: DeviceTensor) -> None:
        """Enqueue :meth:`gdn_gate`."""
        self._recurrent_unsupported("gdn_gate")

    def _gated_delta_net(self, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor,
                         g: DeviceTensor, beta: DeviceTensor, state: DeviceTensor, slots: DeviceTensor,
                         interleaved: bool) -> None:
        """Enqueue :meth:`gated_delta_net`."""
        self._recurrent_unsupported("gated_delta_net")

    def _ssm_scan(self, out: DeviceTensor, xbc: DeviceTensor, dt: DeviceTensor, a: DeviceTensor, d: DeviceTensor,
                  dt_bias: DeviceTensor, state: DeviceTensor, slots: DeviceTensor) -> None:
        """Enqueue :meth:`ssm_scan`."""
        self._recurrent_unsupported("ssm_scan")

    def _ssm_norm(self, out: DeviceTensor, y: DeviceTensor, z: DeviceTensor, w: DeviceTensor, eps: float) -> None:
        """Enqueue :meth:`ssm_norm`."""
        self._recurrent_unsupported("ssm_norm")

    def _scale(self, out: DeviceTensor, x: DeviceTensor, s: float) -> None:
        """Enqueue :meth:`scale`."""
        self._recurrent_unsupported("scale")
