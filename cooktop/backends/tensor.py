"""Device memory: DeviceTensor (one allocation or a view of one) and DeviceBuffer (an arena).

ggml separates the device, the buffer type, the buffer and the stream; here a
:class:`~.base.Device` is the device and its stream (ops are enqueued in order,
:meth:`~.base.Device.synchronize` waits), and a :class:`DeviceBuffer` is the
buffer: it owns every tensor allocated through it and gives them back to the
device at once, exactly once (``ggml_backend_buffer_free``). A backend keeps
what it needs per tensor (staging memory, a dequantized copy) on the tensor's
``extra`` (ggml's ``tensor->extra``), never in tables keyed by ``id()``, so a
freed tensor's data goes with it.

A tensor larger than the device's largest buffer (:attr:`~.base.Device.buffer_limit`) is
stored as **row chunks**: :attr:`DeviceTensor.chunks` lists ``(first row, part)`` pairs,
each part an ordinary allocation of consecutive rows, and the tensor itself has no handle.
The generic layer (:mod:`.chunked`) runs the ops that take such tensors once per part;
backends never see one.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

import numpy as np
from gguf import GGMLQuantizationType as T

from ..errors import DeviceError, ShapeError
from ..format.quants import row_bytes, type_name

#: Allocation serials (never reused, unlike ``id()``): see :attr:`DeviceTensor.serial`.
_serials = itertools.count(1)


class _Device(Protocol):
    """What this module uses of :class:`cooktop.backends.base.Device` (which imports this module)."""

    info: Any

    def upload(self, data: np.ndarray, ggml_type: T, shape: tuple[int, ...]) -> DeviceTensor: ...

    def empty(self, shape: tuple[int, ...], ggml_type: T = T.F32, split: bool = False) -> DeviceTensor: ...

    def zeros(self, shape: tuple[int, ...], ggml_type: T = T.F32) -> DeviceTensor: ...

    def release(self, tensors: list[DeviceTensor]) -> None: ...


class DeviceTensor:
    """A tensor living on a device: a handle plus shape and GGML type.

    Attributes:
        device: the owning :class:`~.base.Device`; ``None`` once the tensor was released.
        handle: backend storage (numpy array, ``cl.Buffer``, ``kp.Tensor``...).
        shape: numpy-order shape; for weights ``[n_out, n_in]`` in values.
        ggml_type: ``F32`` for activations, ``I32`` for ids/positions, any
            GGML type for weights.
        base: the tensor this one is a view of (``None`` for an allocation).
        extra: the backend's own data for this allocation (ggml's ``extra``); ``None``
            until the backend sets it. Views leave it ``None``: backends use ``root.extra``.
        is_weight: made by :meth:`~.base.Device.upload` (never written or read back).
        serial: a number identifying the allocation for the process's lifetime (views share
            their root's; never reused, unlike ``id()``): graph keys name buffers by it
            (:meth:`~.base.Device.graph`).
        chunks: ``None`` for one allocation; for a tensor stored in row chunks (module doc) the
            ``(first row, part)`` pairs in row order, each part a tensor of its own of shape
            ``[rows, *shape[1:]]`` (``handle`` is then ``None``).
        lora: a weight's LoRA adapters (:class:`~.lora.LoraDelta` each, applied by ``matmul``;
            ``backends/lora.py``), or ``()``.
    """

    __slots__ = ("device", "handle", "shape", "ggml_type", "base", "extra", "is_weight", "serial", "chunks",
                 "lora", "__weakref__")

    def __init__(self, device: _Device, handle: Any, shape: tuple[int, ...], ggml_type: T,
                 base: DeviceTensor | None = None):
        self.device: _Device | None = device
        self.handle = handle
        self.shape = tuple(int(s) for s in shape)
        self.ggml_type = T(ggml_type)
        self.base = base
        self.extra: Any = None
        self.is_weight: bool = base.is_weight if base is not None else False
        self.serial: int = base.serial if base is not None else next(_serials)
        self.chunks: tuple[tuple[int, DeviceTensor], ...] | None = None
        self.lora: tuple = ()

    @property
    def nbytes(self) -> int:
        """Storage size in bytes (GGML block layout for quantized types)."""
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        return rows * row_bytes(self.ggml_type, self.shape[-1])

    @property
    def root(self) -> DeviceTensor:
        """The allocation this tensor (or view) lives in."""
        return self.base.root if self.base is not None else self

    def head(self, n: int) -> DeviceTensor:
        """A view of the first ``n`` rows (same storage), e.g. the current chunk of a batch buffer.

        Raises:
            ShapeError: ``n`` is not in ``1..shape[0]``.
        """
        if not 0 < n <= self.shape[0]:
            raise ShapeError(f"head({n}) of a tensor with {self.shape[0]} rows")
        if n == self.shape[0]:
            return self
        if self.chunks is not None:
            view = DeviceTensor(self.device, None, (n,) + self.shape[1:], self.ggml_type,  # type: ignore[arg-type]
                                base=self.root)
            view.chunks = tuple((r0, p.head(min(p.shape[0], n - r0))) for r0, p in self.chunks if r0 < n)
            return view
        return DeviceTensor(self.device, self.handle, (n,) + self.shape[1:], self.ggml_type,  # type: ignore[arg-type]
                            base=self.root)

    def __repr__(self) -> str:
        where = self.device.info.selector if self.device is not None else "released"
        parts = f", {len(self.chunks)} chunks" if self.chunks is not None else ""
        return f"DeviceTensor({where}, {type_name(self.ggml_type)}, {list(self.shape)}{parts})"


class DeviceBuffer:
    """Allocations on one device that are owned, counted and released together (an arena).

    Made by :meth:`~.base.Device.buffer`; :meth:`upload`, :meth:`empty` and :meth:`zeros`
    are the device's, plus ownership. :meth:`release` gives every tensor back to the
    device once (later calls do nothing); afterwards the tensors are unusable (an op on
    one raises :class:`~cooktop.errors.DeviceError`) and allocating raises too. Usable as
    a context manager (released on exit).

    Attributes:
        device: the device it allocates on; name: a label for messages (e.g. ``blocks 0-3``).
        tensors: the allocations it owns, in order (a tensor does not point back: no
            reference cycle, so a dropped buffer's tensors go with it).
    """

    def __init__(self, device: _Device, name: str = ""):
        self.device = device
        self.name = name
        self.tensors: list[DeviceTensor] = []
        self.released = False

    def _own(self, t: DeviceTensor) -> DeviceTensor:
        self.tensors.append(t)
        return t

    def _live(self) -> _Device:
        if self.released:
            raise DeviceError(f"{self!r} was released: allocate from a new buffer")
        return self.device

    def upload(self, data: np.ndarray, ggml_type: T, shape: tuple[int, ...]) -> DeviceTensor:
        """:meth:`Device.upload <cooktop.backends.base.Device.upload>` into this buffer (same errors,
        plus DeviceError when released)."""
        return self._own(self._live().upload(data, ggml_type, shape))

    def empty(self, shape: tuple[int, ...], ggml_type: T = T.F32, split: bool = False) -> DeviceTensor:
        """:meth:`Device.empty <cooktop.backends.base.Device.empty>` into this buffer."""
        return self._own(self._live().empty(shape, ggml_type, split))

    def zeros(self, shape: tuple[int, ...], ggml_type: T = T.F32) -> DeviceTensor:
        """:meth:`Device.zeros <cooktop.backends.base.Device.zeros>` into this buffer."""
        return self._own(self._live().zeros(shape, ggml_type))

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors it owns (GGML block layout; backends may pad each allocation)."""
        return sum(t.nbytes for t in self.tensors)

    def release(self) -> None:
        """Give every tensor back to the device (:meth:`Device.release
        <cooktop.backends.base.Device.release>`). Idempotent."""
        if self.released:
            return
        self.released = True
        tensors, self.tensors = self.tensors, []
        self.device.release(tensors)

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else f"{len(self.tensors)} tensors"
        return f"DeviceBuffer({self.device.info.selector}, {self.name!r}, {state})"
