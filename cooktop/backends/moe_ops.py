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
their arguments (same errors as every op) and call ``_op`` hooks whose default raises
:class:`UnsupportedOpError`; a backend that implements them lists :data:`~.info.MOE_OPS` in its
``DeviceInfo.ops`` (placement keeps a block on the host when its device lacks one).
"""

from __future__ import annotations

from typing import NoReturn

from gguf import GGMLQuantizationType

from ..errors import ShapeError, UnsupportedOpError
from .tensor import DeviceTensor

T = GGMLQuantizationType
_F32, _I32 = T.F32, T.I32

#: Gating functions of :meth:`MoeOps.moe_route` (llama.cpp ``llama_expert_gating_func_type``):
#: ``softmax`` over all experts then top-k (qwen3moe, qwen2moe, olmoe); ``softmax_weight``:
#: top-k of the logits, softmax over the k selected (gpt-oss); ``sigmoid`` of every logit then
#: top-k (also the shared-expert gate of qwen2moe with one "expert").
GATING = ("softmax", "softmax_weight", "sigmoid")


class MoeOps:
    """The mixture-of-experts ops (module doc). Mixed into ``DeviceOps``."""

    # DeviceOps (the class this is mixed into) defines these three
    def _refuse(self, op: str, rule: str, *args: tuple[str, DeviceTensor, str]) -> NoReturn:  # pragma: no cover
        raise NotImplementedError

    def supports(self, op: str, ggml_type: T | None = None) -> bool:  # pragma: no cover
        raise NotImplementedError

    def check(self, op: str, ggml_type: T) -> None:  # pragma: no cover
        raise NotImplementedError

    def _unsupported(self, op: str) -> NoReturn:
        info = getattr(self, "info", None)
        where = f"{info.selector} ({info.name})" if info is not None else "this device"
        raise UnsupportedOpError(f"{where}: {op} is not supported on this backend")

    def _mine(self, *ts: DeviceTensor | None) -> bool:
        return all(t is None or t.device is self for t in ts)

    # -- ops ----------------------------------------------------------------
    def moe_route(self, ids: DeviceTensor, weights: DeviceTensor, logits: DeviceTensor, gating: str,
                  norm: bool = False, scale: float = 0.0) -> None:
        """Choose ``k`` experts per row and their weights (llama.cpp ``build_moe_ffn``, src/llama-graph.cpp).

        logits: f32 [n, n_expert] (router output, its bias already added); ids: I32 [n, k] written
        with the selected experts in descending order of their score (``ggml_argsort_top_k``);
        weights: f32 [n, k] written. With ``p`` the :data:`GATING` function of the logits
        (``softmax_weight``: the logits themselves), ``ids`` are the top-k of ``p`` and
        ``weights = p[ids]`` (``softmax_weight``: softmax over those k). Then ``norm``: weights
        divided by their sum clamped to >= 6.103515625e-5; ``scale`` not 0 or 1: weights times scale.

        Raises:
            UnsupportedOpError: an unknown ``gating``, or the backend has no routing kernel.
            DeviceError / ShapeError: see ``DeviceOps``.
        """
        if gating not in GATING:
            raise UnsupportedOpError(f"moe_route: gating {gating!r} is not one of {', '.join(GATING)}")
        ls, is_ = logits.shape, ids.shape
        if (not self._mine(ids, weights, logits) or ids.ggml_type is not _I32 or weights.ggml_type is not _F32
                or logits.ggml_type is not _F32 or len(ls) != 2 or len(is_) != 2 or weights.shape != is_
                or is_[0] != ls[0] or not 0 < is_[1] <= ls[1]):
            self._refuse("moe_route", "want ids and weights [n, k], logits [n, n_expert] with 0 < k <= n_expert",
                         ("ids", ids, "i32"), ("weights", weights, "f32"), ("logits", logits, "f32"))
        self._moe_route(ids, weights, logits, gating, bool(norm), float(scale))

    def matmul_id(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, ids: DeviceTensor) -> None:
        """Expert-indexed matmul, ggml's ``mul_mat_id``: slot ``j`` of row ``i`` is
        ``out[i, j*n_out:(j+1)*n_out] = xr @ w[ids[i, j]]^T`` where ``xr`` is ``x[i]`` (x f32 [n, n_in]:
        one input per row, broadcast to its k experts: gate and up) or slot ``j`` of ``x[i]``
        (x f32 [n, k * n_in]: one input per expert: down). out: f32 [n, k * n_out]; w: [n_expert,
        n_out, n_in] of any weight type the device runs; ids: I32 [n, k] in ``[0, n_expert)``
        (outside: the caller's fault). A backend groups the rows by expert, so each selected
        expert's matrix is read once per call and experts nobody chose are not read at all.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        xs, ws, is_ = x.shape, w.shape, ids.shape
        if (not self._mine(out, x, w, ids) or out.ggml_type is not _F32 or x.ggml_type is not _F32
                or ids.ggml_type is not _I32 or (w.ggml_type is not _F32 and not w.is_weight)
                or len(ws) != 3 or len(is_) != 2 or len(xs) != 2 or xs[0] != is_[0]
                or xs[1] not in (ws[2], is_[1] * ws[2]) or out.shape != (is_[0], is_[1] * ws[1])):
            self._refuse("matmul_id", "want out [n, k * n_out], x [n, n_in] or [n, k * n_in], "
                         "w [n_expert, n_out, n_in], ids [n, k]",
                         ("out", out, "f32"), ("x", x, "f32"), ("w", w, "weight"), ("ids", ids, "i32"))
        if not self.supports("matmul_id", w.ggml_type):
            self.check("matmul_id", w.ggml_type)
        self._matmul_id(out, x, w, ids)

    def add_id(self, out: DeviceTensor, x: DeviceTensor, b: DeviceTensor, ids: DeviceTensor) -> None:
        """Per-expert bias, ggml's ``add_id``: ``out[i, j*m:(j+1)*m] = x[i, j*m:(j+1)*m] + b[ids[i, j]]``;
        x, out f32 [n, k * m] (``out`` may be ``x``), b f32 [n_expert, m], ids I32 [n, k].

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        xs, bs, is_ = x.shape, b.shape, ids.shape
        if (not self._mine(out, x, b, ids) or out.ggml_type is not _F32 or x.ggml_type is not _F32
                or b.ggml_type is not _F32 or ids.ggml_type is not _I32 or len(bs) != 2 or len(is_) != 2
                or out.shape != xs or xs != (is_[0], is_[1] * bs[1])):
            self._refuse("add_id", "want out and x [n, k * m], b [n_expert, m], ids [n, k]",
                         ("out", out, "f32"), ("x", x, "f32"), ("b", b, "f32"), ("ids", ids, "i32"))
        self._add_id(out, x, b, ids)

    def moe_combine(self, out: DeviceTensor, y: DeviceTensor, weights: DeviceTensor) -> None:
        """``out[i] = sum_j weights[i, j] * y[i, j*m:(j+1)*m]``, summed in slot order j = 0..k-1 in
        float32 (llama.cpp ``build_moe_ffn``: ``ggml_mul`` by the weights, then the views added in
        order); y f32 [n, k * m], weights f32 [n, k], out f32 [n, m].

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        ys, os_, ws = y.shape, out.shape, weights.shape
        if (not self._mine(out, y, weights) or out.ggml_type is not _F32 or y.ggml_type is not _F32
                or weights.ggml_type is not _F32 or len(os_) != 2 or len(ws) != 2 or len(ys) != 2
                or ws[0] != os_[0] or ys != (os_[0], ws[1] * os_[1])):
            self._refuse("moe_combine", "want out [n, m], y [n, k * m], weights [n, k]",
                         ("out", out, "f32"), ("y", y, "f32"), ("weights", weights, "f32"))
        self._moe_combine(out, y, weights)

    def swiglu_oai(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor, alpha: float = 1.702,
                   limit: float = 7.0) -> None:
        """gpt-oss's clamped SwiGLU, ggml's ``swiglu_oai`` (ggml-cpu/ops.cpp): with
        ``g = min(gate, limit)`` and ``u = clamp(up, -limit, limit)``,
        ``out = g / (1 + exp(-alpha g)) * (u + 1)``, elementwise f32 (``out`` may be ``gate``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see ``DeviceOps``.
        """
        if (not self._mine(out, gate, up) or out.ggml_type is not _F32 or gate.ggml_type is not _F32
                or up.ggml_type is not _F32 or gate.shape != out.shape or up.shape != out.shape):
            self._refuse("swiglu_oai", "want out, gate and up of one shape",
                         ("out", out, "f32"), ("gate", gate, "f32"), ("up", up, "f32"))
        self._swiglu_oai(out, gate, up, float(alpha), float(limit))

    def _check_sinks(self, q: DeviceTensor, n_head: int, sinks: DeviceTensor) -> None:
        """The extra check of ``attention(..., sinks=)``: f32 [n_head] on this device."""
        if sinks.device is not self or sinks.ggml_type is not _F32 or sinks.shape != (n_head,):
            if sinks.device is self and sinks.ggml_type is _F32:
                raise ShapeError(f"attention: sinks {list(sinks.shape)} must be [n_head] = [{n_head}]")
            self._refuse("attention", f"want sinks [n_head] = [{n_head}]", ("q", q, "f32"), ("sinks", sinks, "f32"))

    # -- the backend's hooks (arguments checked; default: not supported) ----
    def _moe_route(self, ids: DeviceTensor, weights: DeviceTensor, logits: DeviceTensor, gating: str,
                   norm: bool, scale: float) -> None:
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
                         kv_start: DeviceTensor | None, sinks: DeviceTensor) -> None:
        """Enqueue ``attention(..., sinks=sinks)`` (op name ``attention_sinks``)."""
        self._unsupported("attention with sinks")
