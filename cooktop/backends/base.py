"""The backend contract: Backend (a family), Device (one stove and its stream), and,
re-exported, DeviceTensor / DeviceBuffer (:mod:`.tensor`), DeviceInfo (:mod:`.info`).

Every backend (numpy ``cpu``, ``opencl``, ``vulkan``) implements the same
small op set, written the llama2.c way: each op writes into its first
argument ``out`` and returns nothing. Ops are *enqueued*; :meth:`Device.read`
and :meth:`Device.synchronize` wait for the device. The public ops check
their arguments once (:mod:`.ops`, the op half of the contract) and call the
backend's ``_op`` (see :class:`Device`). The forward pass (``cooktop.model.forward``) is written once
against this contract.

Shapes are numpy order (row-major, outermost first): a weight is
``[n_out, n_in]`` (GGUF lists the same tensor as ``ne = (n_in, n_out)``), an
activation is float32 ``[n_tokens, n]``. Quantized weights keep GGML block
layout (ggml-common.h): each row of ``n_in`` values is ``n_in / block_size``
blocks of ``type_size`` bytes.

The op set is declared once, in :mod:`.optable` (argument roles, shape rules, what each op
computes, its llama.cpp / ggml source; ``docs/DESIGN.md`` shows the table). The op sizes come
from the shapes of ``out`` and the inputs, so one preallocated buffer of ``n_batch`` rows serves
every chunk through :meth:`DeviceTensor.head`. The mixture-of-experts ops (``MOE_OPS``:
routing, ``matmul_id``, per-expert bias, weighted sum, ``swiglu_oai``, attention with sinks;
:mod:`.moe_ops`) are in the table too, claimed only by the backends that implement them.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from typing import ClassVar

import numpy as np
from gguf import GGMLQuantizationType

from .. import settings
from ..errors import DeviceError, ShapeError, UnsupportedOpError
from ..format.quants import row_bytes, type_name  # noqa: F401  (part of the backend contract)
from . import chunked
from .info import DeviceInfo, ProbeResult  # noqa: F401  (part of the backend contract)
from .ops import ROPE_NEOX, ROPE_NORMAL, DeviceOps  # noqa: F401  (part of the backend contract)
from .optable import MOE_OPS, OPS, RECURRENT_OPS, VISION_OPS  # noqa: F401  (part of the backend contract)
from .tensor import DeviceBuffer, DeviceTensor  # noqa: F401  (part of the backend contract)

T = GGMLQuantizationType


#: The weight types every device backend must run (the device contract).
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


class Device(DeviceOps):
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

    :attr:`buffer_limit` is the largest buffer the device takes: a weight matrix over it is
    uploaded in row chunks, as is an activation made with ``empty(..., split=True)``
    (:mod:`.chunked`, which runs the ops taking such tensors; backends only add ``_copy_rect``).
    """

    info: DeviceInfo

    def __init__(self, info: DeviceInfo):
        self.info = info
        caps = [c for c in (info.max_buffer_bytes, info.max_alloc_bytes) if c]
        simulated = settings.device_memory().get(info.selector.lower())
        if simulated is not None and simulated[1]:
            caps.append(simulated[1])
        #: the largest buffer in bytes (``info.max_buffer_bytes`` / ``max_alloc_bytes``, or the smaller
        #: ``/MAX`` of ``COOKTOP_DEVICE_MEMORY``); None: no limit known
        self.buffer_limit: int | None = min(caps) if caps else None
        self._chunk_scratch: dict = {}  # chunked.scratch
        self._chunk_retired: list = []  # scratch buffers replaced inside a graph scope, released later
        self.kv_types = frozenset(T.__members__[n] for n in info.kv_types) | {_F32}
        self.n_allocs = 0
        self.allocated_bytes = 0
        #: verify every replayed graph against its recording (``COOKTOP_GRAPH_CHECK=1``; :meth:`graph`)
        self.graph_check = os.environ.get("COOKTOP_GRAPH_CHECK", "") not in ("", "0")
        self._in_graph = False
        #: held by whoever runs a pass on this device (``Segment.run``: its inputs, graph scope and
        #: result) or edits state tensors between passes (``model/recurrent.py``): several models
        #: (a target and its draft) may share one device, each under its own model lock
        self.lock = threading.RLock()

    def _count_alloc(self, nbytes: int) -> None:
        self.n_allocs += 1
        self.allocated_bytes += int(nbytes)

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
            if t.is_weight:
                raise DeviceError(f"{what}: {t!r} is a weight; only F32/I32 tensors made by empty() can be "
                                  f"written and read")
        raise DeviceError(f"{what}: {t!r} is a {type_name(t.ggml_type)} KV cache: only kv_store writes it "
                          f"and attention reads it")

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
            a tensor with ``is_weight`` set (never written or read back); a matrix (or a 3-D
            expert tensor) over :attr:`buffer_limit` is stored in row chunks (:mod:`.chunked`).
        Raises:
            UnsupportedOpError: the device cannot hold this type, or ``data`` has the wrong size.
            DeviceOutOfMemoryError: the allocation does not fit (a vector over :attr:`buffer_limit`;
                one row over it; the memory is full).
        """
        ggml_type, shape, arr, nbytes = self._weight_data(data, ggml_type, shape)
        if self.buffer_limit is not None and nbytes > self.buffer_limit - chunked.PAD_BYTES and len(shape) in (2, 3):
            t = chunked.upload(self, arr, ggml_type, shape, row_bytes(ggml_type, shape[-1]))
        else:
            chunked.check_limit(self, nbytes, f"{type_name(ggml_type)} weight {list(shape)}")
            t = self._upload(arr, ggml_type, shape, nbytes)
        t.is_weight = True
        return t

    @abstractmethod
    def _upload(self, arr: np.ndarray, ggml_type: T, shape: tuple[int, ...], nbytes: int) -> DeviceTensor:
        """Backend part of :meth:`upload`: ``arr`` is contiguous and holds exactly ``nbytes``."""

    def empty(self, shape: tuple[int, ...], ggml_type: T = T.F32, split: bool = False) -> DeviceTensor:
        """Allocate an uninitialized F32 (activations, KV cache) or I32 (ids, positions) tensor, or a
        KV cache [n_cells, n_kv_dim] of another type the device stores (``info.kv_types``: F16, Q8_0...;
        zero bytes, GGML block layout along each row), which only ``kv_store`` writes and ``attention``
        reads (``write``/``read`` refuse it).

        ``split``: when the tensor is over :attr:`buffer_limit`, store it in row chunks (:mod:`.chunked`;
        for tensors that only matmul's ``out``, the row-wise ops and read / write touch: the logits).

        Raises:
            UnsupportedOpError: any other type; a KV cache row that is not whole blocks.
            ShapeError: no dimensions, or a negative one.
            DeviceOutOfMemoryError: the allocation does not fit.
        """
        ggml_type = T(ggml_type)
        if ggml_type is not _F32 and ggml_type is not _I32 and ggml_type not in self.kv_types:
            raise UnsupportedOpError(f"empty() makes F32 or I32 tensors or a KV cache of a type "
                                     f"{self.info.selector} stores (DeviceInfo.kv_types), not {type_name(ggml_type)}")
        shape = tuple(int(s) for s in shape)
        if not shape or min(shape) < 0:
            raise ShapeError(f"empty(): bad shape {list(shape)}")
        if ggml_type is not _F32 and ggml_type is not _I32:
            if len(shape) != 2:
                raise ShapeError(f"empty(): a {type_name(ggml_type)} KV cache is [n_cells, n_kv_dim], "
                                 f"not {list(shape)}")
            nbytes = shape[0] * row_bytes(ggml_type, shape[1])  # whole blocks, else UnsupportedOpError
        else:
            nbytes = 4 * math.prod(shape)
            if split and self.buffer_limit is not None and len(shape) > 1 and (
                    nbytes > self.buffer_limit - chunked.PAD_BYTES):
                return chunked.empty(self, shape, ggml_type)
        chunked.check_limit(self, nbytes, f"{type_name(ggml_type)} tensor {list(shape)}")
        return self._empty(shape, ggml_type)

    @abstractmethod
    def _empty(self, shape: tuple[int, ...], ggml_type: T) -> DeviceTensor:
        """Backend part of :meth:`empty` (``ggml_type`` is F32 or I32, ``shape`` ints >= 0, or a KV
        cache type of :attr:`kv_types` with a 2-D shape of whole blocks: zero-filled)."""

    def write(self, t: DeviceTensor, data: np.ndarray) -> None:
        """Enqueue a host-to-device copy of ``data`` (``t``'s element count; converted to its dtype).

        Raises:
            DeviceError: ``t`` is a weight, of another device or released; inside a :meth:`graph` scope.
            ShapeError: ``data`` has another element count than ``t``.
        """
        if t.device is not self or t.is_weight or self._in_graph or (t.ggml_type is not _F32
                                                                     and t.ggml_type is not _I32):
            self._refuse_io("write", t)
        arr = np.asarray(data)
        if arr.size != math.prod(t.shape):
            raise ShapeError(f"write of {arr.size} values into a tensor of shape {list(t.shape)}")
        if t.chunks is not None:
            chunked.write(self, t, arr)
            return
        self._write(t, arr)

    @abstractmethod
    def _write(self, t: DeviceTensor, data: np.ndarray) -> None:
        """Backend part of :meth:`write` (``data`` has ``t``'s element count)."""

    def read(self, t: DeviceTensor) -> np.ndarray:
        """Wait for all enqueued work and return ``t`` as a new host array of ``t.shape``.

        Raises:
            DeviceError: ``t`` is a weight, of another device or released; inside a :meth:`graph` scope.
        """
        if t.device is not self or t.is_weight or self._in_graph or (t.ggml_type is not _F32
                                                                     and t.ggml_type is not _I32):
            self._refuse_io("read", t)
        if t.chunks is not None:
            return chunked.read(self, t)
        return self._read(t)

    @abstractmethod
    def _read(self, t: DeviceTensor) -> np.ndarray:
        """Backend part of :meth:`read`."""

    def copy_rows(self, t: DeviceTensor, src_row: int, dst_row: int, n_rows: int) -> None:
        """Enqueue ``t[dst_row + r] = t[src_row + r]`` for ``r < n_rows``: whole rows of one 2-D
        allocation of any type (a KV cache's cells: one sequence's prefix copied to another, as
        llama.cpp's ``llama_memory_seq_cp``), the two ranges not overlapping. Ordered with the
        device's other work; not inside a :meth:`graph` scope. ``n_rows`` 0 does nothing.

        Raises:
            DeviceError: ``t`` is of another device, released, a weight or a view; inside a graph scope.
            ShapeError: ``t`` is not 2-D, a range is outside its rows, or the ranges overlap.
            UnsupportedOpError: the backend has no row copy (:attr:`has_copy_rows`), ``t`` is stored in row
                chunks, or (Vulkan) its rows are not whole 32-bit words.
        """
        if t.device is not self or t.is_weight or self._in_graph or t.base is not None:
            if t.base is not None and t.device is self and not self._in_graph and not t.is_weight:
                raise DeviceError(f"copy_rows: {t!r} is a view; copy rows of its allocation")
            self._refuse_io("copy_rows", t)
        if len(t.shape) != 2:
            raise ShapeError(f"copy_rows takes a 2-D tensor, not one of shape {list(t.shape)}")
        rows = t.shape[0]
        if n_rows < 0 or min(src_row, dst_row) < 0 or max(src_row, dst_row) + n_rows > rows:
            raise ShapeError(f"copy_rows: rows {src_row}..+{n_rows} -> {dst_row}..+{n_rows} are outside the "
                             f"{rows} rows of {list(t.shape)}")
        if abs(src_row - dst_row) < n_rows:
            raise ShapeError(f"copy_rows: the ranges {src_row}..+{n_rows} and {dst_row}..+{n_rows} overlap")
        if n_rows == 0:
            return
        if t.chunks is not None:
            raise UnsupportedOpError(f"copy_rows: {t!r} is stored in row chunks")
        self._copy_rows(t, src_row, dst_row, n_rows)

    @property
    def has_copy_rows(self) -> bool:
        """True when this backend implements :meth:`copy_rows` (a KV cache's sliding-window layers
        keep only their window where it does: ``cooktop.model.swa``)."""
        return type(self)._copy_rows is not Device._copy_rows

    def _copy_rows(self, t: DeviceTensor, src_row: int, dst_row: int, n_rows: int) -> None:
        """Backend part of :meth:`copy_rows` (checked). Default: UnsupportedOpError (callers fall back:
        the server's slots then evaluate a shared prefix again)."""
        raise UnsupportedOpError(f"{self.info.selector} ({self.info.name}): copy_rows is not supported on "
                                 f"this backend")

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every op enqueued so far has finished (``ggml_backend_synchronize``).

        The forward pass never needs it (:meth:`read` waits); benchmarks time with it.
        """

    # -- graphs (a fixed op list handed over whole) -------------------------
    @property
    def graph_uses_before_replay(self) -> int:
        """How many times a :meth:`graph` key runs its ops before the backend replays it (0: it
        never replays, as this base implementation; OpenCL: 2, the key is recorded the second time
        it is seen). The server runs its decode steps this many times at start (``BatchDriver.prepare_steps``)."""
        return 0

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
        if self._chunk_retired:  # scratch of chunked ops replaced inside the scope (chunked.scratch)
            retired, self._chunk_retired = self._chunk_retired, []
            self.release(retired)

    def _graph_begin(self, key: Hashable) -> bool:
        """Backend part of entering :meth:`graph`: whether the caller must issue its ops (default True)."""
        return True

    def _graph_end(self, key: Hashable) -> None:  # noqa: B027 - an optional hook
        """Backend part of leaving :meth:`graph` normally (default: nothing; the ops were enqueued)."""

    def _graph_abort(self, key: Hashable) -> None:  # noqa: B027 - an optional hook
        """Backend part of leaving :meth:`graph` by an exception (default: nothing)."""

    def zeros(self, shape: tuple[int, ...], ggml_type: T = T.F32) -> DeviceTensor:
        """``empty`` then fill with zeros (a KV cache of a block type comes zero-filled from ``empty``)."""
        t = self.empty(shape, ggml_type)
        if t.ggml_type is not _F32 and t.ggml_type is not _I32:
            return t
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
        roots += [p for t in roots if t.chunks is not None for _, p in t.chunks if p.device is self]
        if any(t.chunks is None for t in roots):
            self._release([t for t in roots if t.chunks is None])
        for t in roots:
            t.device = None
            t.extra = None

    def _release(self, tensors: list[DeviceTensor]) -> None:  # noqa: B027 - an optional hook
        """Backend part of :meth:`release` (allocations of this device only); default: nothing."""

    def _copy_rect(self, dst: DeviceTensor, dst_row: int, dst_col: int, src: DeviceTensor, src_row: int,
                   src_col: int, n_rows: int, n_cols: int) -> None:
        """Enqueue ``dst[dst_row + r, dst_col + c] = src[src_row + r, src_col + c]`` for ``r < n_rows``,
        ``c < n_cols``: 32-bit values (F32 / I32) of two row-major 2-D tensors (allocations or views) of
        this device, not overlapping; how :mod:`.chunked` assembles results of row chunks. Default:
        UnsupportedOpError (a backend without it cannot hold tensors past :attr:`buffer_limit`)."""
        raise UnsupportedOpError(f"{self.info.selector} ({self.info.name}): tensors stored in row chunks are not "
                                 f"supported on this backend")

    def prebuild(self, types: tuple[T, ...] = ()) -> None:  # noqa: B027 - an optional hook
        """Compile now what the ops (and matmuls / get_rows of weight ``types``) will need, as one
        batch, so a first run can say so once (OpenCL builds programs at run time). Default:
        nothing to build (numpy; Vulkan ships SPIR-V).

        Raises:
            DeviceError: a build failed.
        """

    def max_attention_keys(self, head_dim: int) -> int | None:
        """Most keys (cache cells) one attention row may read on this device and still be computed
        right, for heads of ``head_dim``; None (the default): no limit below the cache. The loader
        caps ``n_ctx`` at it (with a warning) rather than let a long context go silently wrong."""
        return None

    def quantizes_activations(self, ggml_type: T, n_tokens: int, shape: tuple[int, ...] | None = None) -> bool:
        """True when ``matmul`` of ``n_tokens`` rows with weights of ``ggml_type`` (and ``shape``
        [n_out, n_in]; needed for n_tokens > 1) multiplies 8-bit copies of the activations
        (:func:`.reference.quantize_q8_ref`, llama.cpp's ``block_q8_1``) with integer dot products;
        False when it computes in float32 (the default). Exactness tests compare against the
        reference on the same 8-bit activations when it is True."""
        return False

    def activation_format(self, ggml_type: T, n_tokens: int, shape: tuple[int, ...] | None = None) -> str | None:
        """The activations :meth:`quantizes_activations` makes: ``"q8_1"``
        (:func:`.reference.quantize_q8_ref`) by default, ``"q8_K"`` where a backend's K-quant
        kernels read llama.cpp's block_q8_K (:func:`.reference.quantize_q8_K_ref`), None for
        float32 (:func:`.reference.dequantize_activations_ref` applies either)."""
        return "q8_1" if self.quantizes_activations(ggml_type, n_tokens, shape) else None

    def close(self) -> None:  # noqa: B027 - an optional hook (default: nothing to release)
        """Release device resources (buffers, queues). The device is unusable afterwards."""



class Backend(ABC):
    """A backend family's code: probes its devices (never raising) and opens one.

    Subclasses set ``name``; what the family says of itself (install hint, driver files...)
    is its package's :class:`~.family.Family`.
    """

    name: ClassVar[str]

    @abstractmethod
    def probe(self) -> ProbeResult:
        """Find the devices of this family. Never raises: failures become ``reason``."""

    @abstractmethod
    def open(self, index: int) -> Device:
        """Open device ``index`` of the last probe.

        Raises:
            DeviceError: no such device, or it cannot be opened.
        """
