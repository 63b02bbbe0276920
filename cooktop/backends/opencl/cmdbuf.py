"""``cl_khr_command_buffer`` through ctypes (pyopencl does not wrap the extension): create a
command buffer on a queue, record kernel launches into it, finalize it, enqueue it.

The entry points come from ``clGetExtensionFunctionAddressForPlatform`` of the ICD loader
pyopencl itself links (its bundled ``libOpenCL``, else the system's ``libOpenCL.so.1``); every
OpenCL object is passed by its ``int_ptr``, so the handles are pyopencl's own. Signatures and
constants are those of the Khronos registry's extension text (revision 0.9.x, ``cl_ext.h``):
``clCreateCommandBufferKHR``, ``clCommandNDRangeKernelKHR``, ``clFinalizeCommandBufferKHR``,
``clEnqueueCommandBufferKHR``, ``clReleaseCommandBufferKHR``.

Two driver facts shape the use (:mod:`.replay`): a recorded launch keeps the kernel *object*,
and PoCL 3.1 reads its arguments when the buffer runs, not when it was recorded, so every
recorded launch gets a kernel object of its own (``clCloneKernel``, which copies the arguments
set so far); and there is no mutable dispatch there, so a recording replays exactly what it
recorded (values that change come from device buffers). Each recorded command waits on the
previous one's sync point, so the buffer runs in recording order on any queue type.

:func:`probe` never raises: it returns the API or the reason there is none.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

from ...errors import DeviceError

EXTENSION = "cl_khr_command_buffer"

# cl_ext.h (cl_khr_command_buffer)
CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR = 0x12A9
CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR = 0x12AA
CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR = 1 << 2
CL_COMMAND_BUFFER_FLAGS_KHR = 0x1293
CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR = 1 << 0

_c = ctypes
_vp, _u32, _i32, _u64, _sz = _c.c_void_p, _c.c_uint32, _c.c_int32, _c.c_uint64, _c.c_size_t
_SIGNATURES: dict[str, tuple] = {
    # cl_command_buffer_khr clCreateCommandBufferKHR(num_queues, queues, properties, errcode_ret)
    "clCreateCommandBufferKHR": (_vp, _u32, _c.POINTER(_vp), _c.POINTER(_u64), _c.POINTER(_i32)),
    # clCommandNDRangeKernelKHR(cmdbuf, queue, properties, kernel, work_dim, offset, global, local,
    #                           n_sync, sync_wait_list, sync_point, mutable_handle)
    "clCommandNDRangeKernelKHR": (_i32, _vp, _vp, _vp, _vp, _u32, _vp, _c.POINTER(_sz), _c.POINTER(_sz), _u32,
                                  _c.POINTER(_u32), _c.POINTER(_u32), _vp),
    "clFinalizeCommandBufferKHR": (_i32, _vp),
    # clEnqueueCommandBufferKHR(num_queues, queues, cmdbuf, n_events, event_wait_list, event)
    "clEnqueueCommandBufferKHR": (_i32, _u32, _c.POINTER(_vp), _vp, _u32, _vp, _vp),
    "clReleaseCommandBufferKHR": (_i32, _vp),
}

_loader: Any = None


def _load_loader() -> Any:
    """The ICD loader pyopencl links (its wheel's bundled copy first), loaded once."""
    global _loader
    if _loader is None:
        import pyopencl

        here = os.path.dirname(pyopencl.__file__)
        names = sorted(glob.glob(os.path.join(here, ".libs", "libOpenCL*.so*"))) + ["libOpenCL.so.1", "libOpenCL.so"]
        err: Exception | None = None
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as e:
                err = e
        else:
            raise OSError(f"no OpenCL ICD loader found ({err})")
        lib.clGetExtensionFunctionAddressForPlatform.restype = _vp
        lib.clGetExtensionFunctionAddressForPlatform.argtypes = (_vp, ctypes.c_char_p)
        lib.clGetDeviceInfo.restype = _i32
        lib.clGetDeviceInfo.argtypes = (_vp, _u32, _sz, _vp, _c.POINTER(_sz))
        _loader = lib
    return _loader


class CommandBufferAPI:
    """The extension's entry points on one platform, and whether buffers may be enqueued while a
    previous enqueue of them is pending (``simultaneous``).

    Raises (constructor):
        DeviceError: an entry point is missing.
    """

    def __init__(self, platform: Any, simultaneous: bool):
        lib = _load_loader()
        self.simultaneous = simultaneous
        self._fn: dict[str, Any] = {}
        for name, (res, *args) in _SIGNATURES.items():
            addr = lib.clGetExtensionFunctionAddressForPlatform(platform.int_ptr, name.encode())
            if not addr:
                raise DeviceError(f"{EXTENSION}: the driver lists the extension but has no {name}")
            self._fn[name] = ctypes.CFUNCTYPE(res, *args)(addr)

    def create(self, queue: Any) -> int:
        """A new command buffer recording for ``queue`` (``pyopencl.CommandQueue``); its handle.

        Raises:
            DeviceError: the driver refused.
        """
        qs = (_vp * 1)(queue.int_ptr)
        props = (_u64 * 3)(CL_COMMAND_BUFFER_FLAGS_KHR, CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR, 0)
        err = _i32(0)
        h = self._fn["clCreateCommandBufferKHR"](1, qs, props if self.simultaneous else None, ctypes.byref(err))
        if err.value or not h:
            raise DeviceError(f"clCreateCommandBufferKHR failed: error {err.value}")
        return int(h)

    def ndrange(self, cmdbuf: int, kernel: Any, gsize: tuple[int, ...], lsize: tuple[int, ...] | None,
                after: int | None) -> int:
        """Record ``kernel`` (a ``pyopencl.Kernel`` whose arguments are set; the buffer keeps the
        object, so it must stay alive and unchanged) over ``gsize`` / ``lsize`` work-items, after the
        command of sync point ``after`` (None: the first). Returns the command's sync point.

        Raises:
            DeviceError: the driver refused (the code names why, e.g. -54 a bad work-group size).
        """
        dim = len(gsize)
        g = (_sz * dim)(*gsize)
        loc = (_sz * dim)(*lsize) if lsize is not None else None
        wait = (_u32 * 1)(after) if after is not None else None
        sp = _u32(0)
        r = self._fn["clCommandNDRangeKernelKHR"](cmdbuf, None, None, kernel.int_ptr, dim, None, g, loc,
                                                  0 if after is None else 1, wait, ctypes.byref(sp), None)
        if r:
            raise DeviceError(f"clCommandNDRangeKernelKHR ({kernel.function_name}) failed: error {r}")
        return int(sp.value)

    def finalize(self, cmdbuf: int) -> None:
        """End the recording (the buffer becomes executable).

        Raises:
            DeviceError: the driver refused.
        """
        r = self._fn["clFinalizeCommandBufferKHR"](cmdbuf)
        if r:
            raise DeviceError(f"clFinalizeCommandBufferKHR failed: error {r}")

    def enqueue(self, cmdbuf: int) -> None:
        """Enqueue the finalized buffer on the queue it was recorded for (after everything enqueued
        there before, before everything after: an in-order queue).

        Raises:
            DeviceError: the driver refused.
        """
        r = self._fn["clEnqueueCommandBufferKHR"](0, None, cmdbuf, 0, None, None)
        if r:
            raise DeviceError(f"clEnqueueCommandBufferKHR failed: error {r}")

    def release(self, cmdbuf: int) -> None:
        """Give the buffer back (its queue must have finished it)."""
        self._fn["clReleaseCommandBufferKHR"](cmdbuf)


def _device_u64(device: Any, param: int) -> int | None:
    lib = _load_loader()
    out = _u64(0)
    if lib.clGetDeviceInfo(device.int_ptr, param, 8, ctypes.byref(out), None):
        return None
    return int(out.value)


def probe(platform: Any, device: Any) -> tuple[CommandBufferAPI | None, str]:
    """``(api, "")`` when ``device`` of ``platform`` (pyopencl objects) records command buffers on a
    plain in-order queue, else ``(None, reason)``; never raises."""
    try:
        exts = str(device.extensions).split()
        if EXTENSION not in exts:
            return None, f"the driver has no {EXTENSION}"
        required = _device_u64(device, CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR)
        if required is None:
            return None, f"{EXTENSION}: CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR unreadable"
        if required:
            return None, f"{EXTENSION} needs queue properties {required:#x} (the device's queue has none)"
        caps = _device_u64(device, CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR) or 0
        return CommandBufferAPI(platform, bool(caps & CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR)), ""
    except Exception as e:  # noqa: BLE001 - a probe never raises
        return None, f"{EXTENSION}: {type(e).__name__}: {e}"
