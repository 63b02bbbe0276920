"""The recurrent layers' half of the op contract: the causal depthwise convolution with a carried
state (ggml's ``ssm_conv``) and the elementwise product that gates it (ggml's ``mul``).

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

_SSM_CONV, _MUL = SPECS["ssm_conv"], SPECS["mul"]


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
