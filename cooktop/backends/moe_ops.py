"""The mixture-of-experts half of the op contract: expert routing, the expert-indexed matmul
(ggml's ``mul_mat_id``), per-expert biases, the weighted sum over the selected experts, gpt-oss's
clamped SwiGLU and attention with sinks.

Layout (numpy order, as the rest of the contract): ``n`` rows (tokens), ``k`` experts used per
row, an expert tensor ``w`` of ``[n_expert, n_out, n_in]`` (GGUF ``ne = (n_in, n_out, n_expert)``).
The ``k`` per-expert results of a row sit side by side in one activation row: ``y f32 [n, k * m]``,
slot ``j`` of row ``i`` (columns ``j*m .. (j+1)*m - 1``) belonging to expert ``ids[i, j]``. This is
ggml's ``[m, k, n]`` tensor of ``build_moe_ffn`` (src/llama-graph.cpp), flattened, so the segment's
2-D scratch buffers and :meth:`DeviceTensor.head` serve it unchanged.

:class:`MoeOps` is a base of :class:`~cooktop.backends.ops.DeviceOps`: the public methods check
their arguments with their specs of the op table (``optable.py``, same errors as every op) and
call ``_op`` hooks whose default raises :class:`UnsupportedOpError`; a backend that implements
them lists ``optable.MOE_OPS`` in its ``DeviceInfo.ops`` (placement keeps a block's half on the
host when its device lacks one).
"""

from __future__ import annotations

from typing import NoReturn

from ..errors import UnsupportedOpError
from . import chunked
from .optable import SPECS
from .tensor import DeviceTensor

_ROUTE, _MATMUL_ID, _ADD_ID, _COMBINE, _SWIGLU_OAI, _SINKS = (
    SPECS[n] for n in ("moe_route", "matmul_id", "add_id", "moe_combine", "swiglu_oai", "attention_sinks"))

#: Gating functions of :meth:`MoeOps.moe_route` (llama.cpp ``llama_expert_gating_func_type``):
#: ``softmax`` over all experts then top-k (qwen3moe, qwen2moe, olmoe); ``softmax_weight``:
#: top-k of the logits, softmax over the k selected (gpt-oss); ``sigmoid`` of every logit then
#: top-k (also the shared-expert gate of qwen2moe with one "expert").
GATING = ("softmax", "softmax_weight", "sigmoid")


class MoeOps:
    """The mixture-of-experts ops (module doc). Mixed into ``DeviceOps``; each public op runs its
    spec's check (``optable``) and then its hook."""

    def _unsupported(self, op: str) -> NoReturn:
        info = getattr(self, "info", None)
        where = f"{info.selector} ({info.name})" if info is not None else "this device"
        raise UnsupportedOpError(f"{where}: {op} is not supported on this backend")

    # -- ops ----------------------------------------------------------------
    def moe_route(self, ids: DeviceTensor, weights: DeviceTensor, logits: DeviceTensor, gating: str,
                  norm: bool = False, scale: float = 0.0, bias: DeviceTensor | None = None) -> None:
        """Choose ``k`` experts per row and their weights (llama.cpp ``build_moe_ffn``, src/llama-graph.cpp).

        logits: f32 [n, n_expert] (router output, its bias already added); ids: I32 [n, k] written
        with the selected experts in descending order of their score (``ggml_argsort_top_k``);
        weights: f32 [n, k] written; bias: f32 [n_expert] or None, the expert selection bias
        (DeepSeek-V3 / GLM-4.5 ``exp_probs_b``). With ``p`` the :data:`GATING` function of the
        logits (``softmax_weight``: the logits themselves), ``ids`` are the top-k of ``p + bias``
        (of ``p`` without one) and ``weights = p[ids]`` (unbiased; ``softmax_weight``: softmax over
        those k). Then ``norm``: weights divided by their sum clamped to >= 6.103515625e-5;
        ``scale`` not 0 or 1: weights times scale.

        Raises:
            UnsupportedOpError: an unknown ``gating``, or the backend has no routing kernel.
            DeviceError / ShapeError: see ``DeviceOps``.
        """
        if gating not in GATING:
            raise UnsupportedOpError(f"moe_route: gating {gating!r} is not one of {', '.join(GATING)}")
        _ROUTE.check(self, ids, weights, logits, bias, gating=gating, norm=norm, scale=scale)
        self._moe_route(ids, weights, logits, gating, bool(norm), float(scale), bias)

    def matmul_id(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, ids: DeviceTensor) -> None:
        """Expert-indexed matmul, ggml's ``mul_mat_id``: slot ``j`` of row ``i`` is
        ``out[i, j*n_out:(j+1)*n_out] = xr @ w[ids[i, j]]^T`` where ``xr`` is ``x[i]`` (x f32 [n, n_in]:
        one input per row, broadcast to its k experts: gate and up) or slot ``j`` of ``x[i]``
        (x f32 [n, k * n_in]: one input per expert: down). out: f32 [n, k * n_out]; w: [n_expert,
        n_out, n_in] of any weight type the device runs (past the device's largest buffer: in row
        chunks, ``chunked.py``); ids: I32 [n, k] in ``[0, n_expert)`` (outside: the caller's fault).
        A backend groups the rows by expert, so each selected expert's matrix is read once per call
        and experts nobody chose are not read at all.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _MATMUL_ID.check(self, out, x, w, ids)
        if w.chunks is not None:  # an expert tensor past the device's largest buffer
            chunked.matmul_id(self, out, x, w, ids)
            return
        self._matmul_id(out, x, w, ids)

    def add_id(self, out: DeviceTensor, x: DeviceTensor, b: DeviceTensor, ids: DeviceTensor) -> None:
        """Per-expert bias, ggml's ``add_id``: ``out[i, j*m:(j+1)*m] = x[i, j*m:(j+1)*m] + b[ids[i, j]]``;
        x, out f32 [n, k * m] (``out`` may be ``x``), b f32 [n_expert, m], ids I32 [n, k].

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _ADD_ID.check(self, out, x, b, ids)
        self._add_id(out, x, b, ids)

    def moe_combine(self, out: DeviceTensor, y: DeviceTensor, weights: DeviceTensor) -> None:
        """``out[i] = sum_j weights[i, j] * y[i, j*m:(j+1)*m]``, summed in slot order j = 0..k-1 in
        float32 (llama.cpp ``build_moe_ffn``: ``ggml_mul`` by the weights, then the views added in
        order); y f32 [n, k * m], weights f32 [n, k], out f32 [n, m].

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _COMBINE.check(self, out, y, weights)
        self._moe_combine(out, y, weights)

    def swiglu_oai(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor, alpha: float = 1.702,
                   limit: float = 7.0) -> None:
        """gpt-oss's clamped SwiGLU, ggml's ``swiglu_oai`` (ggml-cpu/ops.cpp): with
        ``g = min(gate, limit)`` and ``u = clamp(up, -limit, limit)``,
        ``out = g / (1 + exp(-alpha g)) * (u + 1)``, elementwise f32 (``out`` may be ``gate``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SWIGLU_OAI.check(self, out, gate, up, alpha=alpha, limit=limit)
        self._swiglu_oai(out, gate, up, float(alpha), float(limit))

    def attention_sinks(self, out: DeviceTensor, q: DeviceTensor, k_cache: DeviceTensor, v_cache: DeviceTensor,
                        pos: DeviceTensor, sinks: DeviceTensor, n_head: int, n_head_kv: int, scale: float,
                        window: int = 0, kv_start: DeviceTensor | None = None, flash: bool = True) -> None:
        """``attention`` (same arguments and mask) with gpt-oss's attention sinks: one extra logit per
        head (sinks f32 [n_head]) that joins each row's softmax denominator and has no value
        (llama.cpp ``ggml_soft_max_add_sinks``): ``out = sum_j e^(s_j - M) v_j / (e^(sink - M) +
        sum_j e^(s_j - M))`` with ``M = max(sink, max_j s_j)``.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        _SINKS.check(self, out, q, k_cache, v_cache, pos, kv_start, sinks, n_head=n_head, n_head_kv=n_head_kv,
                     scale=scale, window=window, flash=flash)
        self._attention_sinks(out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, int(window), kv_start, sinks,
                              flash=bool(flash))

    # -- the backend's hooks (arguments checked; default: not supported) ----
    def _moe_route(self, ids: DeviceTensor, weights: DeviceTensor, logits: DeviceTensor, gating: str,
                   norm: bool, scale: float, bias: DeviceTensor | None = None) -> None:
        """Enqueue :meth:`moe_route`."""
        self._unsupported("moe_route")

    def _matmul_id(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, ids: DeviceTensor) -> None:
        """Enqueue :meth:`matmul_id`."""
        self._unsupported("matmul_id")

    def _add_id(self, out: DeviceTensor, x: DeviceTensor, b: DeviceTensor, ids: DeviceTensor) -> None:
        """Enqueue :meth:`add_id`."""
        self._unsupported("add_id")

    def _moe_combine(self, out: DeviceTensor, y: DeviceTensor, weights: DeviceTensor) -> None:
        """Enqueue :meth:`moe_combine`."""
        self._unsupported("moe_combine")

    def _swiglu_oai(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor, alpha: float,
                    limit: float) -> None:
        """Enqueue :meth:`swiglu_oai`."""
        self._unsupported("swiglu_oai")

    def _attention_sinks(self, out: DeviceTensor, q: DeviceTensor, k_cache: DeviceTensor, v_cache: DeviceTensor,
                         pos: DeviceTensor, n_head: int, n_head_kv: int, scale: float, window: int,
                         kv_start: DeviceTensor | None, sinks: DeviceTensor, flash: bool = True) -> None:
        """Enqueue ``attention(..., sinks=sinks)`` (op name ``attention_sinks``)."""
        self._unsupported("attention_sinks")
