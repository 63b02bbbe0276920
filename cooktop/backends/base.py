"""The backend contract: Backend (a family), Device (one stove and its stream), and,
re-exported, DeviceTensor / DeviceBuffer (:mod:`.tensor`), DeviceInfo (:mod:`.info`).

Every backend (numpy ``cpu``, ``opencl``, ``vulkan``) implements the same
small op set, written the llama2.c way: each op writes into its first
argument ``out`` and returns nothing. Ops are *enqueued*; :meth:`Device.read`
and :meth:`Device.synchronize` wait for the device. The public ops check
their arguments once, here, and call the backend's ``_op`` (see
:class:`Device`). The forward pass (``cooktop.model.forward``) is written once
against this contract.

Shapes are numpy order (row-major, outermost first): a weight is
``[n_out, n_in]`` (GGUF lists the same tensor as ``ne = (n_in, n_out)``), an
activation is float32 ``[n_tokens, n]``. Quantized weights keep GGML block
layout (ggml-common.h): each row of ``n_in`` values is ``n_in / block_size``
blocks of ``type_size`` bytes.

Op set (``pos`` is an int32 ``[n_tokens]`` device tensor of positions; the
op sizes come from the shapes of ``out`` and the inputs, so one preallocated
buffer of ``n_batch`` rows serves every chunk through :meth:`DeviceTensor.head`):

=========  ==============================================================
matmul     out f32 [n, n_out] = x f32 [n, n_in] @ w[n_out, n_in]^T
rmsnorm    out = x / sqrt(mean(x^2) + eps) * w over each group of g values of a row
           (w f32 [g], g dividing the row width: g = n_embd is the usual norm,
           g = head_dim normalises each head: ggml_rms_norm on a [g, width/g, n] view)
rope       rotate pairs of each head of x f32 [n, n_head*head_dim] by pos
           (ggml_rope_ext: mode 0 = adjacent pairs, 2 = NeoX halves; optional
           frequency factors and YaRN parameters)
kv_store   cache[pos[i], :] = x[i, :]    (cache f32 [n_cells, n_head_kv*head_dim])
attention  causal softmax(q k^T * scale) v over cache rows kv_start[i]..pos[i], GQA
           (window > 0: rows pos[i]-window < j <= pos[i] only, llama.cpp's standard SWA;
           kv_start optional, default 0: several sequences' rows in one call)
silu_mul   out = silu(gate) * up
gelu_mul   out = gelu_tanh(gate) * up                    (GeGLU, ggml_geglu_split)
add        out = a + b
add_bias   out[i, :] = x[i, :] + b        (b f32 [n]: a bias row broadcast over rows)
get_rows   out[i] = dequantize(table[ids[i]])   (table any supported type)
=========  ==============================================================
"""

from __future__ import annotations

import contextlib
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from typing import ClassVar, NoReturn

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import DeviceError, ShapeError, UnsupportedOpError
from ..format.quants import row_bytes, type_name  # noqa: F401  (part of the backend contract)
from .info import OPS, DeviceInfo, ProbeResult  # noqa: F401  (part of the backend contract)
from .tensor import DeviceBuffer, DeviceTensor  # noqa: F401  (part of the backend contract)

T = GGMLQuantizationType

#: ggml rope modes (ggml.h GGML_ROPE_TYPE_*).
ROPE_NORMAL = 0
ROPE_NEOX = 2

#: The weight types every device backend must run (issue #3/#4 contract).
DEVICE_WEIGHT_TYPES: tuple[T, ...] = (T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K)


def nmse(a: np.ndarray, ref: np.ndarray) -> float:
    """Normalized mean squared error ``sum((a - ref)^2) / sum(ref^2)`` (ggml test-backend-ops)."""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = float(np.sum(ref * ref))
    num = float(np.sum((a - ref) ** 2))
    return num / den if den > 0 else num


_F32, _I32 = T.F32, T.I32


def rope_yarn_corr_dims(n_rot: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """The YaRN ramp's first and last dimension pair (ggml.c ``ggml_rope_yarn_corr_dims``, in float32
    as ggml computes it): ``corr_dim(b) = n_rot * ln(n_ctx_orig / (b * 2 pi)) / (2 ln freq_base)``,
    ``(max(0, floor(corr_dim(beta_fast))), min(n_rot - 1, ceil(corr_dim(beta_slow))))``.
    Only used when ``ext_factor != 0`` (``n_ctx_orig`` must then be > 0)."""
    f32 = np.float32
    if n_ctx_orig <= 0:
        return 0.0, float(n_rot - 1)

    def corr(b: float) -> np.float32:
        with np.errstate(divide="ignore", invalid="ignore"):
            return f32(n_rot) * np.log(f32(n_ctx_orig) / (f32(b) * f32(2) * f32(math.pi))) / (
                f32(2) * np.log(f32(freq_base)))

    lo, hi = np.floor(corr(beta_fast)), np.ceil(corr(beta_slow))
    return float(max(f32(0), lo)), float(min(f32(n_rot - 1), hi))


def rope_yarn_params(n_rot: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                     beta_fast: float, beta_slow: float, n_ctx_orig: int) -> tuple[float, float, float]:
    """What device rope kernels take instead of the YaRN parameters: ``(corr0, corr1, mscale)``,
    the ramp's dimension range (:func:`rope_yarn_corr_dims`; (0, 0) when ``ext_factor`` is 0)
    and the factor of cos and sin (``attn_factor``, times ``1 + 0.1 ln(1 / freq_scale)`` with YaRN)."""
    if ext_factor == 0.0:
        return 0.0, 0.0, float(attn_factor)
    lo, hi = rope_yarn_corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)
    return lo, hi, float(attn_factor) * (1.0 + 0.1 * math.log(1.0 / float(freq_scale)))


class Device(ABC):
    """One opened compute device and its in-order stream of ops.

    The public methods (:meth:`upload`, :meth:`empty`, :meth:`write`, :meth:`read`,
    the ops) check their arguments here, once for every backend, and then call the
    backend's ``_upload``, ``_empty``, ``_write``, ``_read``, ``_matmul``... (template
    methods), so the same fault raises the same error everywhere:

    - a tensor of another device or of a released buffer, writing or reading a weight:
      :class:`~cooktop.errors.DeviceError`;
    - a weight (or table) type the device does not run, an activation that is not F32
      (positions and ids: I32), a rope mode other than 0 / 2:
      :class:`~cooktop.errors.UnsupportedOpError`;
    - shapes that do not fit together (or a write of the wrong element count):
      :class:`~cooktop.errors.ShapeError` (a ``DeviceError`` and a ``ValueError``), its
      message listing every shape and the op's rule.

    Backends may still refuse what only they cannot do (e.g. Vulkan's head_dim > 256)
    with UnsupportedOpError. Allocation counters (``n_allocs``, ``allocated_bytes``) let
    tests assert that ``-ngl 0`` allocates nothing on a device; backends call
    :meth:`_count_alloc` from ``_upload`` and ``_empty``.

    A fixed op list can be handed over as a whole with :meth:`graph` (recorded once and
    replayed by backends that can; ``graph_check``: replays are verified, see there).
    """

    info: DeviceInfo

    def __init__(self, info: DeviceInfo):
        self.info = info
        self.n_allocs = 0
        self.allocated_bytes = 0
        #: verify every replayed graph against its recording (``COOKTOP_GRAPH_CHECK=1``; :meth:`graph`)
        self.graph_check = os.environ.get("COOKTOP_GRAPH_CHECK", "") not in ("", "0")
        self._in_graph = False

    def _count_alloc(self, nbytes: int) -> None:
        self.n_allocs += 1
        self.allocated_bytes += int(nbytes)

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

    def _refuse_io(self, what: str, t: DeviceTensor) -> None:
        """The checks of :meth:`write` / :meth:`read`: ``t`` lives here and is not a weight, and no
        :meth:`graph` scope is open (its inputs are written before it, its results read after it)."""
        if self._in_graph:
            raise DeviceError(f"{what}() of {t!r} inside a graph scope: write a graph's inputs before "
                              f"`with device.graph(key)` and read its results after it")
        if t.device is not self or t.is_weight:
            if t.device is None:
                raise DeviceError(f"{what}: {t!r} belongs to a released buffer")
            if t.device is not self:
                raise DeviceError(f"{what}: tensor {t!r} lives on another device than {self.info.selector}")
            raise DeviceError(f"{what}: {t!r} is a weight; only F32/I32 tensors made by empty() can be "
                              f"written and read")

    # -- memory -----------------------------------------------------------
    def _weight_data(self, data: np.ndarray, ggml_type: T, shape: tuple[int, ...]
                     ) -> tuple[T, tuple[int, ...], np.ndarray, int]:
        """Common checks of :meth:`upload`: the type runs here and ``data`` holds exactly
        the GGML bytes of ``shape``.

        Returns:
            (GGML type, shape as ints, ``data`` as a contiguous array (no copy when it
            already is), byte count).
        Raises:
            UnsupportedOpError: unsupported type, a row that is not whole blocks, or a byte
                count that does not match the shape.
        """
        ggml_type = T(ggml_type)
        self.check("matmul", ggml_type)
        shape = tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes(ggml_type, shape[-1])
        arr = np.ascontiguousarray(data)
        if arr.nbytes != nbytes:
            raise UnsupportedOpError(
                f"{type_name(ggml_type)} tensor of shape {list(shape)} needs {nbytes} bytes, got {arr.nbytes}")
        return ggml_type, shape, arr, nbytes

    def buffer(self, name: str = "") -> DeviceBuffer:
        """A new, empty :class:`DeviceBuffer` (arena) on this device; ``name`` labels it in messages."""
        return DeviceBuffer(self, name)

    def upload(self, data: np.ndarray, ggml_type: T, shape: tuple[int, ...]) -> DeviceTensor:
        """Copy a weight to the device once, as raw GGML blocks.

        Args:
            data: raw bytes (uint8, any shape) or typed values (float32/float16)
                whose bytes are exactly the GGML layout of ``shape``.
            ggml_type: GGML type of the data.
            shape: numpy-order shape in *values*, e.g. ``[n_out, n_in]``.
        Returns:
            a tensor with ``is_weight`` set (never written or read back).
        Raises:
            UnsupportedOpError: the device cannot hold this type, or ``data`` has the wrong size.
            DeviceOutOfMemoryError: the allocation does not fit.
        """
        ggml_type, shape, arr, nbytes = self._weight_data(data, ggml_type, shape)
        t = self._upload(arr, ggml_type, shape, nbytes)
        t.is_weight = True
        return t

    @abstractmethod
    def _upload(self, arr: np.ndarray, ggml_type: T, shape: tuple[int, ...], nbytes: int) -> DeviceTensor:
        """Backend part of :meth:`upload`: ``arr`` is contiguous and holds exactly ``nbytes``."""

    def empty(self, shape: tuple[int, ...], ggml_type: T = T.F32) -> DeviceTensor:
        """Allocate an uninitialized F32 (activations, KV cache) or I32 (ids, positions) tensor.

        Raises:
            UnsupportedOpError: any other type.
            ShapeError: no dimensions, or a negative one.
            DeviceOutOfMemoryError: the allocation does not fit.
        """
        ggml_type = T(ggml_type)
        if ggml_type is not _F32 and ggml_type is not _I32:
            raise UnsupportedOpError(f"empty() makes F32 or I32 tensors, not {type_name(ggml_type)}")
        shape = tuple(int(s) for s in shape)
        if not shape or min(shape) < 0:
            raise ShapeError(f"empty(): bad shape {list(shape)}")
        return self._empty(shape, ggml_type)

    @abstractmethod
    def _empty(self, shape: tuple[int, ...], ggml_type: T) -> DeviceTensor:
        """Backend part of :meth:`empty` (``ggml_type`` is F32 or I32, ``shape`` ints >= 0)."""

    def write(self, t: DeviceTensor, data: np.ndarray) -> None:
        """Enqueue a host-to-device copy of ``data`` (``t``'s element count; converted to its dtype).

        Raises:
            DeviceError: ``t`` is a weight, of another device or released; inside a :meth:`graph` scope.
            ShapeError: ``data`` has another element count than ``t``.
        """
        if t.device is not self or t.is_weight or self._in_graph:
            self._refuse_io("write", t)
        arr = np.asarray(data)
        if arr.size != math.prod(t.shape):
            raise ShapeError(f"write of {arr.size} values into a tensor of shape {list(t.shape)}")
        self._write(t, arr)

    @abstractmethod
    def _write(self, t: DeviceTensor, data: np.ndarray) -> None:
        """Backend part of :meth:`write` (``data`` has ``t``'s element count)."""

    def read(self, t: DeviceTensor) -> np.ndarray:
        """Wait for all enqueued work and return ``t`` as a new host array of ``t.shape``.

        Raises:
            DeviceError: ``t`` is a weight, of another device or released; inside a :meth:`graph` scope.
        """
        if t.device is not self or t.is_weight or self._in_graph:
            self._refuse_io("read", t)
        return self._read(t)

    @abstractmethod
    def _read(self, t: DeviceTensor) -> np.ndarray:
        """Backend part of :meth:`read`."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every op enqueued so far has finished (``ggml_backend_synchronize``).

        The forward pass never needs it (:meth:`read` waits); benchmarks time with it.
        """

    # -- graphs (a fixed op list handed over whole) -------------------------
    @contextlib.contextmanager
    def graph(self, key: Hashable) -> Iterator[bool]:
        """A scope whose ops are one fixed op list named ``key``, so that a backend can record it
        once and replay it (Vulkan: one ``kp.Sequence``; ggml's graph plans, CUDA graphs).

        The caller's contract: whenever ``key`` recurs, the ops issued inside the scope are the
        same ops, in the same order, on the same tensors (same allocations and views) with the
        same other arguments. Between two uses of a key only tensor *contents* change: the
        inputs written with :meth:`write` before the scope (token embeddings, positions) and
        the results read with :meth:`read` after it. So the key covers everything the op list
        depends on: row counts, modes, constants, and which tensors, named by
        :attr:`DeviceTensor.serial` (never by ``id()``, which Python reuses).

        Yields ``issue``: True when the caller must issue its ops (always in this base
        implementation, and the first time a recording backend sees ``key``); False when
        the backend replays its recording, so the caller skips its op calls::

            with device.graph(key) as issue:
                if issue:
                    run_the_ops()
            out = device.read(result)

        Ops issued during a replay are compared with the recording, and a difference raises
        DeviceError naming the first differing op (nothing of the scope runs, the recording
        is dropped). With :attr:`graph_check` (``COOKTOP_GRAPH_CHECK=1``, set by the test
        suite) ``issue`` is always True, so every replay is checked: a key that misses
        something fails the tests instead of computing a wrong answer. A backend may drop a
        recording at any time (a bounded cache; tensors it uses were released): the next use
        of the key records again. An exception inside the scope discards the ops it enqueued
        on recording backends.

        The base implementation records nothing: the ops run exactly as outside a scope
        (numpy, OpenCL). Backends that record override ``_graph_begin``, ``_graph_end`` and
        ``_graph_abort``.

        Raises:
            DeviceError: a scope opened inside another; :meth:`write` / :meth:`read` inside the
                scope; a replay whose ops differ from the recording.
        """
        if self._in_graph:
            raise DeviceError(f"graph {key!r}: graph scopes do not nest on {self.info.selector}")
        self._in_graph = True
        try:
            issue = self._graph_begin(key)
            try:
                yield issue
            except BaseException:
                self._graph_abort(key)
                raise
            self._graph_end(key)
        finally:
            self._in_graph = False

    def _graph_begin(self, key: Hashable) -> bool:
        """Backend part of entering :meth:`graph`: whether the caller must issue its ops (default True)."""
        return True

    def _graph_end(self, key: Hashable) -> None:  # noqa: B027 - an optional hook
        """Backend part of leaving :meth:`graph` normally (default: nothing; the ops were enqueued)."""

    def _graph_abort(self, key: Hashable) -> None:  # noqa: B027 - an optional hook
        """Backend part of leaving :meth:`graph` by an exception (default: nothing)."""

    def zeros(self, shape: tuple[int, ...], ggml_type: T = T.F32) -> DeviceTensor:
        """``empty`` then fill with zeros."""
        t = self.empty(shape, ggml_type)
        self._write(t, np.zeros(t.shape, dtype=np.int32 if t.ggml_type == _I32 else np.float32))
        return t

    def release(self, tensors: list[DeviceTensor]) -> None:
        """Free allocations made by :meth:`upload` / :meth:`empty` (views and tensors of other
        devices are ignored); the low level of :meth:`DeviceBuffer.release`.

        The tensors are unusable afterwards (``device`` becomes ``None``: an op on one raises
        DeviceError). The backend's ``_release`` frees what it holds beyond the Python
        references (the numpy and pyopencl storage goes with its last reference).
        Allocation counters stay cumulative (``n_allocs``), except where a backend
        uses ``allocated_bytes`` for its own out-of-memory check.
        """
        roots = [t for t in tensors if t.base is None and t.device is self]
        if roots:
            self._release(roots)
        for t in roots:
            t.device = None
            t.extra = None

    def _release(self, tensors: list[DeviceTensor]) -> None:  # noqa: B027 - an optional hook
        """Backend part of :meth:`release` (allocations of this device only); default: nothing."""

    def close(self) -> None:  # noqa: B027 - an optional hook (default: nothing to release)
        """Release device resources (buffers, queues). The device is unusable afterwards."""

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
                  kv_start: DeviceTensor | None = None) -> None:
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


class Backend(ABC):
    """A backend family: probes its devices (never raising) and opens one.

    Subclasses set ``name`` and ``install_hint``.
    """

    name: ClassVar[str]
    install_hint: ClassVar[str] = ""

    @abstractmethod
    def probe(self) -> ProbeResult:
        """Find the devices of this family. Never raises: failures become ``reason``."""

    @abstractmethod
    def open(self, index: int) -> Device:
        """Open device ``index`` of the last probe.

        Raises:
            DeviceError: no such device, or it cannot be opened.
        """
