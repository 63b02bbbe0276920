"""The op half of the device contract: the public ops, their one generic argument check, and
the ``_op`` hooks a backend implements (:class:`DeviceOps`, the base of
:class:`~cooktop.backends.base.Device`).

Each op is declared once in :mod:`.optable` (argument roles, shape rule, what it computes);
each public op here hands its arguments to its spec's ``check`` (written out from the table)
and then calls the backend's ``_op``. A failed check goes through :meth:`DeviceOps._refuse`, so one
fault raises one exception type with one message on every backend (``DeviceError``,
``UnsupportedOpError``, ``ShapeError``).

Arguments stored in row chunks (tensors past the device's largest buffer) go to :mod:`.chunked`
after the check: ``matmul`` (weight, output), ``get_rows`` (table) and the row-wise ops
(``add``, ``add_bias``, ``rmsnorm``, ``silu_mul``, ``gelu_mul``, ``copy``); backends never see them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NoReturn

from gguf import GGMLQuantizationType

from ..errors import DeviceError, ShapeError, UnsupportedOpError
from ..format.quants import type_name
from . import chunked, lora
from .info import DeviceInfo
from .moe_ops import MoeOps
from .optable import ACT, F32, KV, SPECS, WEIGHT, OpSpec
from .recurrent_ops import RecurrentOps
from .tensor import DeviceTensor
from .vision_ops import VisionOps

T = GGMLQuantizationType
_F32, _I32 = T.F32, T.I32
_MATMUL, _RMSNORM, _ROPE, _KV_STORE, _ATTENTION = (SPECS[n] for n in ("matmul", "rmsnorm", "rope", "kv_store",
                                                                      "attention"))
_SILU_MUL, _GELU_MUL, _ADD, _ADD_BIAS, _GET_ROWS, _COPY = (SPECS[n] for n in ("silu_mul", "gelu_mul", "add",
                                                                              "add_bias", "get_rows", "copy"))

#: ggml rope modes (ggml.h GGML_ROPE_TYPE_*).
ROPE_NORMAL = 0
ROPE_NEOX = 2


class DeviceOps(MoeOps, RecurrentOps, VisionOps, ABC):
    """The ops of a :class:`~cooktop.backends.base.Device`: public methods that check their
    arguments (errors: see ``Device``) and the abstract ``_op`` methods each backend enqueues.
    The mixture-of-experts ops come from :class:`~.moe_ops.MoeOps`, the recurrent ones from
    :class:`~.recurrent_ops.RecurrentOps`, the vision encoders' from :class:`~.vision_ops.VisionOps`."""

    info: DeviceInfo
    #: the KV cache types of ``info.kv_types`` (what the ``kv`` arguments' check tests)
    kv_types: frozenset[T] = frozenset((_F32,))

    # -- capability -------------------------------------------------------
    def supports(self, op: str, ggml_type: T | None = None) -> bool:
        """True when ``op`` runs here with weights (or table) of ``ggml_type``.

        ``ggml_type`` matters for ``matmul`` and ``get_rows``; other ops take float32.
        """
        return self.info.supports(op, ggml_type)

    def supports_op(self, op: str, ggml_type: T | None = None, **dims: int) -> str:
        """Why ``op`` cannot run here with weights of ``ggml_type`` and these dimensions
        (``head_dim=``, ``n_in=``...: :attr:`~.optable.OpSpec.limits`), or ``""`` when it can
        (:meth:`~.info.DeviceInfo.supports_op`)."""
        return self.info.supports_op(op, ggml_type, **dims)

    def check(self, op: str, ggml_type: T) -> None:
        """Raise :class:`UnsupportedOpError` unless ``supports(op, ggml_type)``."""
        if not self.supports(op, ggml_type):
            raise UnsupportedOpError(
                f"{self.info.selector} ({self.info.name}) cannot run {op} on {type_name(ggml_type)} tensors")

    def _refuse_limit(self, spec: OpSpec, name: str, value: int, cap: int) -> NoReturn:
        """Raise UnsupportedOpError: a dimension of this call is past the device's ``op_limits``."""
        raise UnsupportedOpError(f"{spec.name}: {name} {value} is more than {self.info.selector}'s {cap} "
                                 f"({self.info.name})")

    def _refuse(self, spec: OpSpec, tensors: tuple[DeviceTensor | None, ...], scalars: dict) -> NoReturn:
        """Raise the error of the first fault among ``tensors`` (roles from ``spec``): device,
        then type, else a ShapeError quoting the spec's rule. Called only when a check failed."""
        args = [(a.name, t, a.kind) for a, t in zip(spec.args, tensors) if t is not None]
        op = spec.name
        for name, t, _ in args:
            if t.device is not self:
                if t.device is None:
                    raise DeviceError(f"{op}: {name} {t!r} belongs to a released buffer")
                raise DeviceError(f"{op}: {name} {t!r} lives on another device than {self.info.selector}")
        for name, t, kind in args:
            if kind is WEIGHT:
                if t.ggml_type is not _F32 and not t.is_weight:
                    self.check(op, t.ggml_type)
                    raise UnsupportedOpError(f"{op}: {name} must be F32 or an uploaded weight, not "
                                             f"{type_name(t.ggml_type)}")
            elif kind is KV:
                if t.ggml_type is not _F32 and t.ggml_type not in self.kv_types:
                    raise UnsupportedOpError(f"{op}: {name} must be F32 or a KV cache type {self.info.selector} "
                                             f"stores, not {type_name(t.ggml_type)}")
            elif kind is ACT:
                if t.ggml_type is not _F32 and t.ggml_type is not _I32:
                    raise UnsupportedOpError(f"{op}: {name} must be F32 or I32, not {type_name(t.ggml_type)}")
            elif t.ggml_type is not (_F32 if kind is F32 else _I32):
                raise UnsupportedOpError(f"{op}: {name} must be {kind.upper()}, not {type_name(t.ggml_type)}")
        shapes = ", ".join(f"{name} {list(t.shape)}" for name, t, _ in args)
        raise ShapeError(f"{op}: shapes do not fit: {shapes}; {spec.rule.format(**scalars)}")

    # -- ops (checked here, enqueued by the backend; each writes into `out`) ---
    def matmul(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor) -> None:
        """``out f32 [n, n_out] = x f32 [n, n_in] @ w[n_out, n_in]^T`` for any supported ``w`` type,
        plus the LoRA adapters attached to ``w`` (``w.lora``; :func:`.lora.apply`, llama.cpp
        ``build_lora_mm``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _MATMUL.check(self, out, x, w)
        if w.chunks is not None or out.chunks is not None or x.chunks is not None:
            chunked.matmul(self, out, x, w)
        else:
            self._matmul(out, x, w)
        if w.lora:
            lora.apply(self, out, x, w.lora)

    def matmuls(self, x: DeviceTensor, *pairs: tuple[DeviceTensor, DeviceTensor]) -> None:
        """``out_i = x @ w_i^T`` for each ``(out_i, w_i)`` of ``pairs``: the projections of one input
        (Q/K/V, gate/up; llama.cpp ``build_qkv``, ``build_ffn``), each exactly :meth:`matmul`'s
        result. A backend may run them in fewer launches (OpenCL: one mat-vec for a decode step's
        Q, K and V); by default they are :meth:`matmul` calls, in order.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: as :meth:`matmul`, for the first pair
            that fails (nothing runs then on a backend that fuses them).
        """
        for out, w in pairs:
            self.matmul(out, x, w)

    def rope_store(self, cache: DeviceTensor, x: DeviceTensor, pos: DeviceTensor, cells: DeviceTensor,
                   head_dim: int, n_rot: int, freq_base: float, freq_scale: float, mode: int,
                   freq_factors: DeviceTensor | None = None, ext_factor: float = 0.0, attn_factor: float = 1.0,
                   beta_fast: float = 32.0, beta_slow: float = 1.0, n_ctx_orig: int = 0) -> None:
        """``cache[cells[i], :] = rope(x, pos)[i, :]``: :meth:`rope` of ``x`` (f32 [n, n_kv_dim]) by
        ``pos``, then :meth:`kv_store` of the result in rows ``cells`` (I32 [n]) of ``cache``; the
        stored values are exactly those two ops' (llama.cpp's backends fuse rope and set_rows the
        same way). ``x`` holds the rotated rows or its input afterwards, as the backend does it
        (OpenCL: one launch that leaves ``x`` alone); by default the two ops, ``x`` rotated in place.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: as :meth:`rope` and :meth:`kv_store`.
        """
        self.rope(x, x, pos, head_dim, n_rot, freq_base, freq_scale, mode, freq_factors, ext_factor, attn_factor,
                  beta_fast, beta_slow, n_ctx_orig)
        self.kv_store(cache, x, cells)


    def rmsnorm(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, eps: float) -> None:
        """Per group of ``g`` values of a row: ``out = x / sqrt(mean(x^2) + eps) * w``.

        x, out: f32 [n, width]; w: f32 [g] with ``g`` dividing ``width``. ``g == width`` is
        the usual norm over a row (llama: ``attn_norm``); ``g == head_dim`` normalises each
        head separately with one weight shared by the heads (qwen3 / gemma3 ``attn_q_norm``).
        Formula: llama.cpp ``ggml_rms_norm`` (on a ``[g, width / g, n]`` view) followed by
        ``ggml_mul`` with the norm weight (src/llama-graph.cpp ``build_norm``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _RMSNORM.check(self, out, x, w, eps=eps)
        if out.chunks is not None or x.chunks is not None:
            chunked.refuse("rmsnorm", w)
            chunked.rowwise(self, "rmsnorm", self._rmsnorm, (out, x), w, eps)
            return
        self._rmsnorm(out, x, w, eps)


    def rope(self, out: DeviceTensor, x: DeviceTensor, pos: DeviceTensor, head_dim: int, n_rot: int,
             freq_base: float, freq_scale: float, mode: int, freq_factors: DeviceTensor | None = None,
             ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
             n_ctx_orig: int = 0) -> None:
        """Rotary position embedding, ``ggml_rope_ext`` (ggml/src/ggml-cpu/ops.cpp ``rope_yarn``).

        x, out: f32 [n, n_heads * head_dim] (``out`` may be ``x``); pos: I32 [n];
        freq_factors: None or f32 [>= n_rot/2] (Llama 3.1 ``rope_freqs``, LongRoPE factors).
        For dim pair i < n_rot/2, with ``ff = freq_factors[i]`` (1 without them)::

            t_extrap = pos * freq_base^(-2i/n_rot) / ff ;  t_interp = freq_scale * t_extrap
            ext_factor == 0:  theta = t_interp, mscale = attn_factor
            else (YaRN):      r = (1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)) * ext_factor
                              theta = t_interp * (1 - r) + t_extrap * r
                              mscale = attn_factor * (1 + 0.1 * ln(1 / freq_scale))
            (lo, hi) = ggml_rope_yarn_corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)

        mode 0 rotates (x[2i], x[2i+1]), mode 2 (NeoX) rotates (x[i], x[i + n_rot/2]) by
        ``theta``, both outputs scaled by ``mscale``. Dimensions >= n_rot pass through unchanged.

        Raises:
            UnsupportedOpError: ``mode`` other than 0 / 2.
            ShapeError: odd ``head_dim`` or ``n_rot``, ``n_rot`` not in 1..head_dim, rows not whole
                heads, freq_factors not 1-D or shorter than n_rot/2.
            DeviceError / UnsupportedOpError: see the class doc.
        """
        if mode != ROPE_NORMAL and mode != ROPE_NEOX:
            raise UnsupportedOpError(f"rope mode {mode} is not supported (0 = normal, 2 = NeoX)")
        _ROPE.check(self, out, x, pos, freq_factors, head_dim=head_dim, n_rot=n_rot)
        self._rope(out, x, pos, head_dim, n_rot, float(freq_base), float(freq_scale), mode, freq_factors,
                   float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow), int(n_ctx_orig))


    def kv_store(self, cache: DeviceTensor, x: DeviceTensor, pos: DeviceTensor) -> None:
        """``cache[pos[i], :] = x[i, :]``; cache [n_ctx, n_kv_dim] of a KV cache type, x f32 [n, n_kv_dim],
        pos I32 [n].

        The cache stores its type (``info.kv_types``; :mod:`cooktop.format.kvtypes`): f16 and bf16
        rounded to nearest even, the block types quantized row by row with ggml's
        ``quantize_row_*_ref`` rounding (blocks run along the row, so along each head's head_dim;
        :func:`cooktop.backends.reference.quantize_kv`). Positions outside ``[0, n_ctx)`` are the
        caller's fault (the engine raises ContextOverflowError first); backends may skip or clamp them.
        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _KV_STORE.check(self, cache, x, pos)
        self._kv_store(cache, x, pos)


    def attention(self, out: DeviceTensor, q: DeviceTensor, k_cache: DeviceTensor, v_cache: DeviceTensor,
                  pos: DeviceTensor, n_head: int, n_head_kv: int, scale: float, window: int = 0,
                  kv_start: DeviceTensor | None = None, flash: bool = True) -> None:
        """Causal multi-head attention over the KV cache, with GQA and an optional sliding window.

        q, out: f32 [n, n_head * head_dim]; k_cache, v_cache: [n_ctx, n_head_kv * head_dim] of any KV
        cache type the device stores (each its own), read as stored (no float32 copy of the cache).
        Query row i of head h attends to cache rows 0..pos[i] of kv head
        ``h // (n_head / n_head_kv)`` (llama.cpp's GQA grouping):
        ``out = softmax(q k^T * scale) v`` with the softmax in float32.
        With ``window`` > 0 (tokens) only rows ``pos[i] - window < j <= pos[i]`` are attended:
        llama.cpp's ``LLAMA_SWA_TYPE_STANDARD`` mask (``llama_hparams::is_masked_swa`` masks
        ``p1 - p0 >= n_swa``); 0 means no window. Chunked and symmetric windows are not offered.

        ``pos`` are cache rows (cells), not rope positions. ``kv_start`` (I32 [n], optional,
        default all 0) lets one call serve rows of several sequences sharing one cache, each
        sequence owning a range of rows (llama.cpp's unified KV cache with per-sequence cells;
        see ``model/forward.py``): row i attends to rows ``kv_start[i]..pos[i]`` (and the window).
        ``kv_start[i] <= pos[i]`` is the caller's duty.

        ``flash`` (``-fa``, ``KVConfig.resolve``) picks the kernel, not the result: True, the fused
        kernel with an online softmax that never materialises the scores (llama.cpp
        ``ggml_flash_attn_ext``); False, llama.cpp's path without flash attention
        (``build_attn_mha``: ``KQ = K^T Q`` into a scratch of n_head x n_kv scores per token,
        ``soft_max_ext`` with the scale, mask and sinks, then ``KQV = V KQ``). The numpy reference
        has one path for both.

        Raises:
            ShapeError: the shapes above do not hold, n_head is not a multiple of n_head_kv,
                or ``window`` < 0.
            DeviceError / UnsupportedOpError: see the class doc.
        """
        _ATTENTION.check(self, out, q, k_cache, v_cache, pos, kv_start, n_head=n_head, n_head_kv=n_head_kv,
                         window=window, flash=flash)
        self._attention(out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, int(window), kv_start,
                        flash=bool(flash))


    def silu_mul(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor) -> None:
        """``out = gate * sigmoid(gate) * up`` elementwise, f32 [n, n_ff] (SwiGLU; ``out`` may be ``gate``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _SILU_MUL.check(self, out, gate, up)
        if out.chunks is not None or gate.chunks is not None or up.chunks is not None:
            chunked.rowwise(self, "silu_mul", self._silu_mul, (out, gate, up))
            return
        self._silu_mul(out, gate, up)


    def gelu_mul(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor) -> None:
        """``out = gelu(gate) * up`` elementwise, f32 [n, n_ff] (GeGLU; ``out`` may be ``gate``).

        GELU is ggml's tanh approximation (``ggml_gelu_f32``, ggml-cpu/vec.h):
        ``0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))``, computed in float32. (ggml's CPU
        backend looks it up in a float16 table instead, GGML_GELU_FP16: a ~1e-3 relative
        difference per value that the end-to-end tolerances absorb.)
        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _GELU_MUL.check(self, out, gate, up)
        if out.chunks is not None or gate.chunks is not None or up.chunks is not None:
            chunked.rowwise(self, "gelu_mul", self._gelu_mul, (out, gate, up))
            return
        self._gelu_mul(out, gate, up)


    def add(self, out: DeviceTensor, a: DeviceTensor, b: DeviceTensor) -> None:
        """``out = a + b`` elementwise, f32 (``out`` may be ``a``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _ADD.check(self, out, a, b)
        if out.chunks is not None or a.chunks is not None or b.chunks is not None:
            chunked.rowwise(self, "add", self._add, (out, a, b))
            return
        self._add(out, a, b)


    def add_bias(self, out: DeviceTensor, x: DeviceTensor, b: DeviceTensor) -> None:
        """``out[i, :] = x[i, :] + b`` for every row; x, out f32 [n, m], b f32 [m] (``out`` may be ``x``).

        The bias of a linear layer (llama.cpp ``build_qkv`` / ``build_lora_mm`` followed by
        ``ggml_add`` of a ``[m]`` bias, broadcast over rows). Kept apart from :meth:`add`,
        whose operands have one shape.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _ADD_BIAS.check(self, out, x, b)
        if out.chunks is not None or x.chunks is not None:
            chunked.refuse("add_bias", b)
            chunked.rowwise(self, "add_bias", self._add_bias, (out, x), b)
            return
        self._add_bias(out, x, b)


    def get_rows(self, out: DeviceTensor, table: DeviceTensor, ids: DeviceTensor) -> None:
        """``out[i] = dequantize(table[ids[i]])``; table [n_rows, n] any supported type, ids I32 [k],
        out f32 [k, n]. Ids outside ``[0, n_rows)`` are the caller's fault (backends may clamp).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        _GET_ROWS.check(self, out, table, ids)
        if table.chunks is not None or out.chunks is not None or ids.chunks is not None:
            chunked.refuse("get_rows", ids)
            chunked.get_rows(self, out, table, ids)
            return
        self._get_rows(out, table, ids)


    def copy(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """``out = x`` elementwise, F32 or I32 of equal shapes and types (``cooktop bench --ops``
        measures the device's practical memory bandwidth with it: 2 x nbytes moved per call).

        Not part of the forward pass: a backend without a copy kernel keeps the default ``_copy``.

        Raises:
            UnsupportedOpError: the backend has no copy kernel, or the types differ.
            DeviceError / ShapeError: see the class doc.
        """
        if x.ggml_type is not out.ggml_type and out.device is self and x.device is self:
            raise UnsupportedOpError(f"copy: out is {type_name(out.ggml_type)} but x is {type_name(x.ggml_type)}")
        _COPY.check(self, out, x)
        if out.chunks is not None or x.chunks is not None:
            chunked.rowwise(self, "copy", self._copy, (out, x))
            return
        self._copy(out, x)

    # -- the backend's ops (arguments checked) -----------------------------
    @abstractmethod
    def _matmul(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor) -> None:
        """Enqueue :meth:`matmul`."""

    @abstractmethod
    def _rmsnorm(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, eps: float) -> None:
        """Enqueue :meth:`rmsnorm`."""

    @abstractmethod
    def _rope(self, out: DeviceTensor, x: DeviceTensor, pos: DeviceTensor, head_dim: int, n_rot: int,
              freq_base: float, freq_scale: float, mode: int, freq_factors: DeviceTensor | None,
              ext_factor: float, attn_factor: float, beta_fast: float, beta_slow: float, n_ctx_orig: int) -> None:
        """Enqueue :meth:`rope` (every argument given; floats and ints converted)."""

    @abstractmethod
    def _kv_store(self, cache: DeviceTensor, x: DeviceTensor, pos: DeviceTensor) -> None:
        """Enqueue :meth:`kv_store`."""

    @abstractmethod
    def _attention(self, out: DeviceTensor, q: DeviceTensor, k_cache: DeviceTensor, v_cache: DeviceTensor,
                   pos: DeviceTensor, n_head: int, n_head_kv: int, scale: float, window: int,
                   kv_start: DeviceTensor | None, flash: bool = True) -> None:
        """Enqueue :meth:`attention` (``window`` 0: no sliding window; ``kv_start`` None: rows start at 0;
        ``flash``: which kernel, see :meth:`attention`)."""

    @abstractmethod
    def _silu_mul(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor) -> None:
        """Enqueue :meth:`silu_mul`."""

    @abstractmethod
    def _gelu_mul(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor) -> None:
        """Enqueue :meth:`gelu_mul`."""

    @abstractmethod
    def _add(self, out: DeviceTensor, a: DeviceTensor, b: DeviceTensor) -> None:
        """Enqueue :meth:`add`."""

    @abstractmethod
    def _add_bias(self, out: DeviceTensor, x: DeviceTensor, b: DeviceTensor) -> None:
        """Enqueue :meth:`add_bias`."""

    @abstractmethod
    def _get_rows(self, out: DeviceTensor, table: DeviceTensor, ids: DeviceTensor) -> None:
        """Enqueue :meth:`get_rows`."""

    def _copy(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """Enqueue :meth:`copy`; default: UnsupportedOpError (no copy kernel)."""
        raise UnsupportedOpError(f"{self.info.selector} ({self.info.name}): copy is not supported on this backend")
