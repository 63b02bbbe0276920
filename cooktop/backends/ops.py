"""The op half of the device contract: what each op computes, the argument checks every
backend shares, and the ``_op`` hooks a backend implements (:class:`DeviceOps`, the base of
:class:`~cooktop.backends.base.Device`; the op table is in :mod:`.base`'s module doc).

Each public op checks devices, types and shapes once and calls the backend's ``_op``; a
failed check goes through :meth:`DeviceOps._refuse`, so one fault raises one exception
type on every backend (``DeviceError``, ``UnsupportedOpError``, ``ShapeError``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NoReturn

from gguf import GGMLQuantizationType

from ..errors import DeviceError, ShapeError, UnsupportedOpError
from ..format.quants import type_name
from .info import DeviceInfo
from .moe_ops import MoeOps
from .tensor import DeviceTensor

T = GGMLQuantizationType
_F32, _I32 = T.F32, T.I32

#: ggml rope modes (ggml.h GGML_ROPE_TYPE_*).
ROPE_NORMAL = 0
ROPE_NEOX = 2


class DeviceOps(MoeOps, ABC):
    """The ops of a :class:`~cooktop.backends.base.Device`: public methods that check their
    arguments (errors: see ``Device``) and the abstract ``_op`` methods each backend enqueues.
    The mixture-of-experts ops come from :class:`~.moe_ops.MoeOps`."""

    info: DeviceInfo

    # -- capability -------------------------------------------------------
    def supports(self, op: str, ggml_type: T | None = None) -> bool:
        """True when ``op`` runs here with weights (or table) of ``ggml_type``.

        ``ggml_type`` matters for ``matmul`` and ``get_rows``; other ops take float32.
        """
        return self.info.supports(op, ggml_type)

    def check(self, op: str, ggml_type: T) -> None:
        """Raise :class:`UnsupportedOpError` unless ``supports(op, ggml_type)``."""
        if not self.supports(op, ggml_type):
            raise UnsupportedOpError(
                f"{self.info.selector} ({self.info.name}) cannot run {op} on {type_name(ggml_type)} tensors")

    def _refuse(self, op: str, rule: str, *args: tuple[str, DeviceTensor, str]) -> NoReturn:
        """Raise the error of the first fault among ``(name, tensor, kind)`` args: device,
        then type (kind ``f32``, ``i32``, ``act`` = F32 or I32, ``weight`` = a type ``op``
        runs here), else a ShapeError quoting ``rule``. Called only when a check failed."""
        for name, t, _ in args:
            if t.device is not self:
                if t.device is None:
                    raise DeviceError(f"{op}: {name} {t!r} belongs to a released buffer")
                raise DeviceError(f"{op}: {name} {t!r} lives on another device than {self.info.selector}")
        for name, t, kind in args:
            if kind == "weight":
                self.check(op, t.ggml_type)
            elif kind == "act":
                if t.ggml_type is not _F32 and t.ggml_type is not _I32:
                    raise UnsupportedOpError(f"{op}: {name} must be F32 or I32, not {type_name(t.ggml_type)}")
            elif t.ggml_type is not (_F32 if kind == "f32" else _I32):
                raise UnsupportedOpError(f"{op}: {name} must be {kind.upper()}, not {type_name(t.ggml_type)}")
        shapes = ", ".join(f"{name} {list(t.shape)}" for name, t, _ in args)
        raise ShapeError(f"{op}: shapes do not fit: {shapes}; {rule}")

    # -- ops (checked here, enqueued by the backend; each writes into `out`) ---
    def matmul(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor) -> None:
        """``out f32 [n, n_out] = x f32 [n, n_in] @ w[n_out, n_in]^T`` for any supported ``w`` type.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        xs, ws = x.shape, w.shape
        if (out.device is not self or x.device is not self or w.device is not self
                or out.ggml_type is not _F32 or x.ggml_type is not _F32
                or (w.ggml_type is not _F32 and not w.is_weight)  # upload() checked a weight's type
                or len(ws) != 2 or xs[1:] != ws[1:] or out.shape != (xs[0], ws[0])):
            self._refuse("matmul", "want out [n, n_out], x [n, n_in], w [n_out, n_in]",
                         ("out", out, "f32"), ("x", x, "f32"), ("w", w, "weight"))
        self._matmul(out, x, w)

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
        xs, ws = x.shape, w.shape
        if (out.device is not self or x.device is not self or w.device is not self
                or out.ggml_type is not _F32 or x.ggml_type is not _F32 or w.ggml_type is not _F32
                or out.shape != xs or len(xs) != 2 or len(ws) != 1 or ws[0] <= 0 or xs[1] % ws[0]):
            self._refuse("rmsnorm", "want out and x [n, width], w [g] with g dividing width",
                         ("out", out, "f32"), ("x", x, "f32"), ("w", w, "f32"))
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
        xs = x.shape
        if (out.device is not self or x.device is not self or pos.device is not self
                or out.ggml_type is not _F32 or x.ggml_type is not _F32 or pos.ggml_type is not _I32
                or len(xs) != 2 or out.shape != xs or pos.shape != xs[:1]
                or head_dim <= 0 or head_dim % 2 or n_rot % 2 or not 0 < n_rot <= head_dim or xs[1] % head_dim):
            self._refuse("rope", f"want out and x [n, n_head * head_dim], pos [n], with head_dim {head_dim} and "
                         f"n_rot {n_rot} even and 0 < n_rot <= head_dim",
                         ("out", out, "f32"), ("x", x, "f32"), ("pos", pos, "i32"))
        if freq_factors is not None and (
                freq_factors.device is not self or freq_factors.ggml_type is not _F32
                or len(freq_factors.shape) != 1 or freq_factors.shape[0] < n_rot // 2):
            self._refuse("rope", f"want freq_factors [>= n_rot / 2] with n_rot {n_rot}",
                         ("x", x, "f32"), ("freq_factors", freq_factors, "f32"))
        self._rope(out, x, pos, head_dim, n_rot, float(freq_base), float(freq_scale), mode, freq_factors,
                   float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow), int(n_ctx_orig))

    def kv_store(self, cache: DeviceTensor, x: DeviceTensor, pos: DeviceTensor) -> None:
        """``cache[pos[i], :] = x[i, :]``; cache f32 [n_ctx, n_kv_dim], x f32 [n, n_kv_dim], pos I32 [n].

        Positions outside ``[0, n_ctx)`` are the caller's fault (the engine raises
        ContextOverflowError first); backends may skip or clamp them.
        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        xs, cs = x.shape, cache.shape
        if (cache.device is not self or x.device is not self or pos.device is not self
                or cache.ggml_type is not _F32 or x.ggml_type is not _F32 or pos.ggml_type is not _I32
                or len(xs) != 2 or cs[1:] != xs[1:] or pos.shape != xs[:1]):
            self._refuse("kv_store", "want cache [n_ctx, n_kv_dim], x [n, n_kv_dim], pos [n]",
                         ("cache", cache, "f32"), ("x", x, "f32"), ("pos", pos, "i32"))
        self._kv_store(cache, x, pos)

    def attention(self, out: DeviceTensor, q: DeviceTensor, k_cache: DeviceTensor, v_cache: DeviceTensor,
                  pos: DeviceTensor, n_head: int, n_head_kv: int, scale: float, window: int = 0,
                  kv_start: DeviceTensor | None = None, sinks: DeviceTensor | None = None) -> None:
        """Causal multi-head attention over the KV cache, with GQA and an optional sliding window.

        q, out: f32 [n, n_head * head_dim]; k_cache, v_cache: f32 [n_ctx, n_head_kv * head_dim].
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

        ``sinks`` (f32 [n_head], optional; op name ``attention_sinks``): gpt-oss's attention sinks,
        one extra logit per head that joins each row's softmax denominator and has no value
        (llama.cpp ``ggml_soft_max_add_sinks``): ``out = sum_j e^(s_j - M) v_j / (e^(sink - M) +
        sum_j e^(s_j - M))`` with ``M = max(sink, max_j s_j)``.

        Raises:
            ShapeError: the shapes above do not hold, n_head is not a multiple of n_head_kv,
                or ``window`` < 0.
            DeviceError / UnsupportedOpError: see the class doc.
        """
        qs, ks = q.shape, k_cache.shape
        if (out.device is not self or q.device is not self or k_cache.device is not self
                or v_cache.device is not self or pos.device is not self
                or out.ggml_type is not _F32 or q.ggml_type is not _F32 or k_cache.ggml_type is not _F32
                or v_cache.ggml_type is not _F32 or pos.ggml_type is not _I32
                or len(qs) != 2 or out.shape != qs or v_cache.shape != ks or pos.shape != qs[:1]
                or n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv or qs[1] % n_head
                or ks[1:] != (n_head_kv * (qs[1] // n_head),) or window < 0
                or (kv_start is not None and (kv_start.device is not self or kv_start.ggml_type is not _I32
                                              or kv_start.shape != qs[:1]))):
            extra = (("kv_start", kv_start, "i32"),) if kv_start is not None else ()
            self._refuse("attention", f"want out and q [n, n_head * head_dim], k_cache and v_cache "
                         f"[n_ctx, n_head_kv * head_dim], pos [n]{', kv_start [n]' if extra else ''}, "
                         f"with n_head {n_head} a multiple of n_head_kv {n_head_kv} and window {window} >= 0",
                         ("out", out, "f32"), ("q", q, "f32"), ("k_cache", k_cache, "f32"),
                         ("v_cache", v_cache, "f32"), ("pos", pos, "i32"), *extra)
        if sinks is not None:
            self._check_sinks(q, n_head, sinks)
            self._attention_sinks(out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, int(window), kv_start,
                                  sinks)
            return
        self._attention(out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, int(window), kv_start)

    def silu_mul(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor) -> None:
        """``out = gate * sigmoid(gate) * up`` elementwise, f32 [n, n_ff] (SwiGLU; ``out`` may be ``gate``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        if (out.device is not self or gate.device is not self or up.device is not self
                or out.ggml_type is not _F32 or gate.ggml_type is not _F32 or up.ggml_type is not _F32
                or gate.shape != out.shape or up.shape != out.shape):
            self._refuse("silu_mul", "want out, gate and up of one shape",
                         ("out", out, "f32"), ("gate", gate, "f32"), ("up", up, "f32"))
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
        if (out.device is not self or gate.device is not self or up.device is not self
                or out.ggml_type is not _F32 or gate.ggml_type is not _F32 or up.ggml_type is not _F32
                or gate.shape != out.shape or up.shape != out.shape):
            self._refuse("gelu_mul", "want out, gate and up of one shape",
                         ("out", out, "f32"), ("gate", gate, "f32"), ("up", up, "f32"))
        self._gelu_mul(out, gate, up)

    def add(self, out: DeviceTensor, a: DeviceTensor, b: DeviceTensor) -> None:
        """``out = a + b`` elementwise, f32 (``out`` may be ``a``).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        if (out.device is not self or a.device is not self or b.device is not self
                or out.ggml_type is not _F32 or a.ggml_type is not _F32 or b.ggml_type is not _F32
                or a.shape != out.shape or b.shape != out.shape):
            self._refuse("add", "want out, a and b of one shape", ("out", out, "f32"), ("a", a, "f32"), ("b", b, "f32"))
        self._add(out, a, b)

    def add_bias(self, out: DeviceTensor, x: DeviceTensor, b: DeviceTensor) -> None:
        """``out[i, :] = x[i, :] + b`` for every row; x, out f32 [n, m], b f32 [m] (``out`` may be ``x``).

        The bias of a linear layer (llama.cpp ``build_qkv`` / ``build_lora_mm`` followed by
        ``ggml_add`` of a ``[m]`` bias, broadcast over rows). Kept apart from :meth:`add`,
        whose operands have one shape.

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        xs = x.shape
        if (out.device is not self or x.device is not self or b.device is not self
                or out.ggml_type is not _F32 or x.ggml_type is not _F32 or b.ggml_type is not _F32
                or out.shape != xs or len(xs) != 2 or b.shape != xs[1:]):
            self._refuse("add_bias", "want out and x [n, m], b [m]",
                         ("out", out, "f32"), ("x", x, "f32"), ("b", b, "f32"))
        self._add_bias(out, x, b)

    def get_rows(self, out: DeviceTensor, table: DeviceTensor, ids: DeviceTensor) -> None:
        """``out[i] = dequantize(table[ids[i]])``; table [n_rows, n] any supported type, ids I32 [k],
        out f32 [k, n]. Ids outside ``[0, n_rows)`` are the caller's fault (backends may clamp).

        Raises:
            DeviceError / UnsupportedOpError / ShapeError: see the class doc.
        """
        ts, ks = table.shape, ids.shape
        if (out.device is not self or table.device is not self or ids.device is not self
                or out.ggml_type is not _F32 or ids.ggml_type is not _I32
                or (table.ggml_type is not _F32 and not table.is_weight)
                or len(ts) != 2 or len(ks) != 1 or out.shape != (ks[0], ts[1])):
            self._refuse("get_rows", "want out [k, n], table [n_rows, n], ids [k]",
                         ("out", out, "f32"), ("table", table, "weight"), ("ids", ids, "i32"))
        self._get_rows(out, table, ids)

    def copy(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """``out = x`` elementwise, F32 or I32 of equal shapes and types (``cooktop bench --ops``
        measures the device's practical memory bandwidth with it: 2 x nbytes moved per call).

        Not part of the forward pass: a backend without a copy kernel keeps the default ``_copy``.

        Raises:
            UnsupportedOpError: the backend has no copy kernel, or the types differ.
            DeviceError / ShapeError: see the class doc.
        """
        if (out.device is not self or x.device is not self or x.ggml_type is not out.ggml_type
                or (out.ggml_type is not _F32 and out.ggml_type is not _I32) or x.shape != out.shape):
            if x.ggml_type is not out.ggml_type and out.device is self and x.device is self:
                raise UnsupportedOpError(f"copy: out is {type_name(out.ggml_type)} but x is {type_name(x.ggml_type)}")
            self._refuse("copy", "want out and x of one shape", ("out", out, "act"), ("x", x, "act"))
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
                   kv_start: DeviceTensor | None) -> None:
        """Enqueue :meth:`attention` (``window`` 0: no sliding window; ``kv_start`` None: rows start at 0)."""

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
