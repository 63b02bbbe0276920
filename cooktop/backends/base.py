"""The backend contract: Backend (a family), Device (one stove), DeviceTensor, DeviceInfo.

Every backend (numpy ``cpu``, ``opencl``, ``vulkan``) implements the same
small op set, written the llama2.c way: each op writes into its first
argument ``out`` and returns nothing. Ops are *enqueued*; only
:meth:`Device.read` waits for the device. The forward pass
(``cooktop.model.llama``) is written once against this contract.

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
rmsnorm    out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w        (w f32 [n_embd])
rope       rotate pairs of each head of x f32 [n, n_head*head_dim] by pos
           (ggml_rope_ext: mode 0 = adjacent pairs, 2 = NeoX halves)
kv_store   cache[pos[i], :] = x[i, :]    (cache f32 [n_ctx, n_head_kv*head_dim])
attention  causal softmax(q k^T * scale) v over cache rows 0..pos[i], GQA
silu_mul   out = silu(gate) * up
add        out = a + b
get_rows   out[i] = dequantize(table[ids[i]])   (table any supported type)
=========  ==============================================================
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import UnsupportedOpError
from ..format.quants import row_bytes, type_name  # noqa: F401  (part of the backend contract)

T = GGMLQuantizationType

#: Op names of the contract, in the order above.
OPS: tuple[str, ...] = ("matmul", "rmsnorm", "rope", "kv_store", "attention", "silu_mul", "add", "get_rows")

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


@dataclasses.dataclass
class DeviceInfo:
    """What a device is and can do, as probed.

    Memory fields are bytes; ``None`` means the driver did not tell.
    ``device_type`` is one of ``gpu``, ``igpu``, ``cpu``, ``accelerator``.
    ``types`` lists GGML type names the backend runs there, ``ops`` the op names.
    """

    backend: str
    index: int
    name: str
    vendor: str = ""
    device_type: str = "cpu"
    platform: str = ""
    driver_version: str = ""
    global_mem_bytes: int | None = None
    max_alloc_bytes: int | None = None
    compute_units: int | None = None
    max_workgroup_size: int | None = None
    subgroup_size: int | None = None
    fp16: bool = False
    int8: bool = False
    types: tuple[str, ...] = ()
    ops: tuple[str, ...] = OPS
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def supports(self, op: str, ggml_type: T | None = None) -> bool:
        """True when ``op`` runs on this device with weights (or table) of ``ggml_type``.

        ``ggml_type`` matters for ``matmul`` and ``get_rows``; other ops take float32.
        """
        if op not in self.ops:
            return False
        if ggml_type is None or op not in ("matmul", "get_rows"):
            return True
        return type_name(ggml_type) in self.types

    @property
    def selector(self) -> str:
        """The ``--device`` name of this device, e.g. ``opencl:0``."""
        return self.backend if self.backend == "cpu" else f"{self.backend}:{self.index}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field plus ``selector``."""
        d = dataclasses.asdict(self)
        d["types"] = list(self.types)
        d["ops"] = list(self.ops)
        d["selector"] = self.selector
        return d


@dataclasses.dataclass
class ProbeResult:
    """A backend family's probe: its devices, or why there are none usable.

    ``available`` is H_k AND F_k: the package and runtime load (F_k) and at least
    one device was found (H_k). ``reason`` says why not; ``hint`` how to fix it.
    ``errors`` maps a device index that failed to open to its error.
    """

    backend: str
    available: bool
    devices: list[DeviceInfo] = dataclasses.field(default_factory=list)
    reason: str = ""
    hint: str = ""
    errors: dict[int, str] = dataclasses.field(default_factory=dict)


class DeviceTensor:
    """A tensor living on a device: a handle plus shape and GGML type.

    Attributes:
        device: the owning :class:`Device`.
        handle: backend storage (numpy array, ``cl.Buffer``, ``kp.Tensor``...).
        shape: numpy-order shape; for weights ``[n_out, n_in]`` in values.
        ggml_type: ``F32`` for activations, ``I32`` for ids/positions, any
            GGML type for weights.
        base: the tensor this one is a view of (``None`` for an allocation).
    """

    __slots__ = ("device", "handle", "shape", "ggml_type", "base", "__weakref__")

    def __init__(self, device: "Device", handle: Any, shape: tuple[int, ...], ggml_type: T,
                 base: "DeviceTensor | None" = None):
        self.device = device
        self.handle = handle
        self.shape = tuple(int(s) for s in shape)
        self.ggml_type = T(ggml_type)
        self.base = base

    @property
    def nbytes(self) -> int:
        """Storage size in bytes (GGML block layout for quantized types)."""
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        return rows * row_bytes(self.ggml_type, self.shape[-1])

    @property
    def root(self) -> "DeviceTensor":
        """The allocation this tensor (or view) lives in."""
        return self.base.root if self.base is not None else self

    def head(self, n: int) -> "DeviceTensor":
        """A view of the first ``n`` rows (same storage), e.g. the current chunk of a batch buffer."""
        if not 0 < n <= self.shape[0]:
            raise ValueError(f"head({n}) of a tensor with {self.shape[0]} rows")
        if n == self.shape[0]:
            return self
        return DeviceTensor(self.device, self.handle, (n,) + self.shape[1:], self.ggml_type, base=self.root)

    def __repr__(self) -> str:
        return f"DeviceTensor({self.device.info.selector}, {type_name(self.ggml_type)}, {list(self.shape)})"


class Device(ABC):
    """One opened compute device. Subclasses implement allocation and the op set.

    Allocation counters (``n_allocs``, ``allocated_bytes``) let tests assert that
    ``-ngl 0`` allocates nothing on a device. Subclasses call
    :meth:`_count_alloc` from :meth:`upload` and :meth:`empty`.
    """

    info: DeviceInfo

    def __init__(self, info: DeviceInfo):
        self.info = info
        self.n_allocs = 0
        self.allocated_bytes = 0

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

    @abstractmethod
    def upload(self, data: np.ndarray, ggml_type: T, shape: tuple[int, ...]) -> DeviceTensor:
        """Copy a weight to the device once, as raw GGML blocks.

        Args:
            data: raw bytes (uint8, any shape) or typed values (float32/float16)
                whose bytes are exactly the GGML layout of ``shape``.
            ggml_type: GGML type of the data.
            shape: numpy-order shape in *values*, e.g. ``[n_out, n_in]``.
        Raises:
            UnsupportedOpError: the device cannot hold this type.
            DeviceOutOfMemoryError: the allocation does not fit.
        """

    @abstractmethod
    def empty(self, shape: tuple[int, ...], ggml_type: T = T.F32) -> DeviceTensor:
        """Allocate an uninitialized F32 (activations, KV cache) or I32 (ids, positions) tensor.

        Raises:
            DeviceOutOfMemoryError: the allocation does not fit.
        """

    @abstractmethod
    def write(self, t: DeviceTensor, data: np.ndarray) -> None:
        """Enqueue a host-to-device copy of ``data`` (same element count and dtype as ``t``)."""

    @abstractmethod
    def read(self, t: DeviceTensor) -> np.ndarray:
        """Wait for all enqueued work and return ``t`` as a new host array of ``t.shape``.

        This is the only synchronization point of the contract.
        """

    def zeros(self, shape: tuple[int, ...], ggml_type: T = T.F32) -> DeviceTensor:
        """``empty`` then fill with zeros."""
        t = self.empty(shape, ggml_type)
        self.write(t, np.zeros(shape, dtype=np.int32 if ggml_type == T.I32 else np.float32))
        return t

    def release(self, tensors: list[DeviceTensor]) -> None:
        """Free allocations made by :meth:`upload` / :meth:`empty` (views are ignored).

        The tensors must not be used afterwards. The default relies on the
        backend's storage being freed with its last Python reference (numpy,
        pyopencl); backends that keep their own references (Kompute) override it.
        Allocation counters stay cumulative (``n_allocs``), except where a backend
        uses ``allocated_bytes`` for its own out-of-memory check.
        """

    def close(self) -> None:
        """Release device resources (buffers, queues). The device is unusable afterwards."""

    # -- ops (enqueue, write into `out`) -----------------------------------
    @abstractmethod
    def matmul(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor) -> None:
        """``out f32 [n, n_out] = x f32 [n, n_in] @ w[n_out, n_in]^T`` for any supported ``w`` type."""

    @abstractmethod
    def rmsnorm(self, out: DeviceTensor, x: DeviceTensor, w: DeviceTensor, eps: float) -> None:
        """Per row: ``out = x / sqrt(mean(x^2) + eps) * w``; x, out f32 [n, n_embd], w f32 [n_embd].

        Formula: llama.cpp ``ggml_rms_norm`` followed by ``ggml_mul`` with the norm weight.
        """

    @abstractmethod
    def rope(self, out: DeviceTensor, x: DeviceTensor, pos: DeviceTensor, head_dim: int, n_rot: int,
             freq_base: float, freq_scale: float, mode: int) -> None:
        """Rotary position embedding (ggml_rope_ext with ext_factor 0, attn_factor 1).

        x, out: f32 [n, n_heads * head_dim] (``out`` may be ``x``); pos: I32 [n].
        For dim pair i < n_rot/2: theta = pos * freq_scale * freq_base^(-2i/n_rot);
        mode 0 rotates (x[2i], x[2i+1]), mode 2 (NeoX) rotates (x[i], x[i + n_rot/2]).
        Dimensions >= n_rot pass through unchanged.
        """

    @abstractmethod
    def kv_store(self, cache: DeviceTensor, x: DeviceTensor, pos: DeviceTensor) -> None:
        """``cache[pos[i], :] = x[i, :]``; cache f32 [n_ctx, n_kv_dim], x f32 [n, n_kv_dim]."""

    @abstractmethod
    def attention(self, out: DeviceTensor, q: DeviceTensor, k_cache: DeviceTensor, v_cache: DeviceTensor,
                  pos: DeviceTensor, n_head: int, n_head_kv: int, scale: float) -> None:
        """Causal multi-head attention over the KV cache, with GQA.

        q, out: f32 [n, n_head * head_dim]; k_cache, v_cache: f32 [n_ctx, n_head_kv * head_dim].
        Query row i of head h attends to cache rows 0..pos[i] of kv head
        ``h // (n_head / n_head_kv)`` (llama.cpp's GQA grouping):
        ``out = softmax(q k^T * scale) v`` with the softmax in float32.
        """

    @abstractmethod
    def silu_mul(self, out: DeviceTensor, gate: DeviceTensor, up: DeviceTensor) -> None:
        """``out = gate * sigmoid(gate) * up`` elementwise, f32 [n, n_ff] (SwiGLU)."""

    @abstractmethod
    def add(self, out: DeviceTensor, a: DeviceTensor, b: DeviceTensor) -> None:
        """``out = a + b`` elementwise, f32 (``out`` may be ``a``)."""

    @abstractmethod
    def get_rows(self, out: DeviceTensor, table: DeviceTensor, ids: DeviceTensor) -> None:
        """``out[i] = dequantize(table[ids[i]])``; table [n_rows, n] any supported type, ids I32 [k]."""

    def copy(self, out: DeviceTensor, x: DeviceTensor) -> None:
        """``out = x`` elementwise, f32 of equal shapes (``cooktop bench --ops`` measures the
        device's practical memory bandwidth with it: 2 x nbytes moved per call).

        Not part of the forward pass, so not abstract: a backend without a copy kernel
        keeps this default.

        Raises:
            UnsupportedOpError: the backend has no copy kernel.
        """
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
