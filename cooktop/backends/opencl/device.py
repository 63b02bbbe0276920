"""The OpenCL backend (pyopencl): every device of every OpenCL platform.

Four cut points, tinygrad-style: allocate (``empty``/``upload``: ``cl.Buffer``),
copy in (``write``: non-blocking ``enqueue_copy``), copy out (``read``: the only
blocking ``enqueue_copy``), compile/launch (:mod:`.programs`: programs
built once per device and cached, ``Kernel`` objects kept).

Weights are uploaded once as raw GGML blocks (F32/F16 as plain arrays) and
dequantized inside the kernels; activations and the KV cache are device
buffers. Each device has one in-order queue; ops are enqueued without waiting.
A ``head(n)`` view shares its root's buffer: kernels take their row counts from
the shapes passed at enqueue time.

``probe()`` imports pyopencl lazily and never raises; it builds nothing (a
driver that lists devices but cannot compile is caught by the smoke test).

Kernels come in two flavours chosen by device type (see
:class:`~.programs.LaunchShape`): CPU devices (PoCL) run one output row /
one (head, token) per work-item with explicit float16 vectors and no barriers;
GPU devices share rows and keys across work-groups with local-memory reductions.
Both are tested on PoCL (tests/test_opencl.py). ``COOKTOP_OPENCL_OPTIONS`` adds
build options (e.g. for driver workarounds; ``-DCOOKTOP_PORTABLE=1`` turns the
host-ISA code paths off).

Matrix-vector products with quantized weights (decode) run as llama.cpp's CPU
backend does: the activation row is quantized to 8-bit blocks once
(:mod:`.q8`; ``rmsnorm``, ``silu_mul`` and ``attention`` write that copy
in the same kernel) and each weight block is multiplied with integer dot
products (``dotq8.cl``; pmaddubsw on x86 PoCL, portable OpenCL C elsewhere).
``COOKTOP_OPENCL_Q8=0`` keeps float32 activations. The K-quants read llama.cpp's
``block_q8_K`` (one scale per 256 values; ``dotq8k.cl``, :meth:`activation_format`), the
others ``block_q8_1``. Q4_0 matrices of a multiple of 16 rows are repacked on upload
with 16 rows in the SIMD lanes (``dequant.cl``) where the compiler targets AVX-512BW.

Prompt matrices run on the same 8-bit activations, so that a prompt's logits are those
of its tokens one at a time (a cached prefix, a continued conversation, the same request
again: the same text): ``mul_mvt_q8`` gives each token exactly ``mul_mv_q8``'s sums
(``COOKTOP_OPENCL_EXACT_PROMPT``, default on), and so do the AVX-512 VNNI prompt kernels of
Q8_0, repacked Q4_0, Q4_K, Q5_K and Q6_K (``mul_mm_q8``, ``mmq8.cl``): their integer sums and
float operations per lane are those of the mat-vec rows (``dotq8_row``; Q8_0's 32-byte blocks,
two rows per 16-lane accumulator) in the same order, so a prompt on them is bit for bit
its tokens one at a time. Where the 64-byte x86 code does not build (AVX2 CPUs, portable C) the
K-quants on block_q8_K have ``dotq8k.cl``'s unpack-once ``mul_mm_q8`` on the CPU launch shape:
a super-block's weights unpacked once for a tile of tokens (AVX2: bytes for pmaddubsw), each
token then the mat-vec's exact integers and float operations. Float weights, and every type with
``COOKTOP_OPENCL_EXACT_PROMPT=0`` where no such prompt kernel applies, use ``mul_mm``: weight
units dequantized to float32 registers and reused across 8 tokens and 2 rows per work-item.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ... import settings
from ...errors import DeviceError, DeviceOutOfMemoryError
from .. import lora
from ..base import Backend, Device, DeviceInfo, DeviceTensor, ProbeResult, rope_yarn_params, row_bytes
from ..optable import SPECS
from . import INSTALL_HINT, cmdbuf
from .attention import attention_kq, attention_tiled
from .info import _safe, describe_icds, device_info, empty_platform_hint, launch_shape
from .programs import (
    FLOAT_TYPES,
    MVT_TN,
    Q8_TYPES,
    Q8K_ONLY_TYPES,
    KernelCache,
    clear_cache,
)
from .q8 import Q8Shadows
from .replay import ReplayRecorder
from .tuning import opencl_shapes
from .vision import OpenclVisionOps

_MATMUL, _ROPE, _KV_STORE = SPECS["matmul"], SPECS["rope"], SPECS["kv_store"]

_GATING = {"softmax": 0, "softmax_weight": 1, "sigmoid": 2}

log = logging.getLogger(__name__)


def drop_file_pages(arr: np.ndarray) -> int:
    """Unmap the resident pages of a read-only file mapping that ``arr`` views (madvise
    MADV_DONTNEED on the whole pages inside it), once its bytes are copied to a device.

    For a CPU device the copy is host memory as well; without this the model is resident twice
    (file pages + device copy). The pages stay in the page cache and fault back in if read again,
    so the data is unchanged. Arrays not backed by an ``np.memmap`` opened read-only are left
    alone (on anonymous memory MADV_DONTNEED would zero them). Returns the bytes dropped.
    """
    import ctypes
    import mmap

    base: Any = arr
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    if base is None or getattr(base, "mode", None) != "r" or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    page = mmap.PAGESIZE
    start = arr.__array_interface__["data"][0]
    lo, hi = -(-start // page) * page, (start + arr.nbytes) // page * page
    if hi - lo < (1 << 20):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return hi - lo if libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0 else 0


def _ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def check_build(dev: OpenCLDevice) -> None:
    """Build and run one small kernel on ``dev`` with its real build options (the ISA probe of
    :meth:`~.programs.KernelCache.isa`): the probe child's check (``Family.check_device``) that
    the driver can build kernels at all on this machine.

    Raises:
        DeviceError: the build failed (the build log's first lines), or the built program does not
            hold or run the kernel (some drivers report a failed build as a success).
    """
    try:
        dev.kernels.isa()
    except DeviceError:
        raise
    except Exception as e:  # noqa: BLE001 - pyopencl raises RuntimeError/LogicError/AttributeError...
        raise DeviceError(f"a one-line test kernel does not build and run on {dev.info.selector}: "
                          f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                          ) from e


def check_kernel(dev: OpenCLDevice) -> None:
    """Launch one real kernel, the smoke test's first (``rmsnorm`` of float32 [3, 256]): the check a
    child process runs before a process first opens ``dev`` (``Family.check_use``).

    A driver can build the probe's one-line kernel and still abort inside its compiler on a real
    one: PyPI's PoCL 3.0-rc2 (LLVM 14) on an AMD EPYC VM aborts in LLVM's instruction selection
    ("Cannot select: i64 = fma" in its builtin ``_cl_fma`` on float16 vectors, SIGABRT) compiling
    the first launch of ``rmsnorm_q8``, or takes minutes there. PoCL compiles at the first launch
    of each work-group size, so only a launch finds it; the builtin library is linked into every
    kernel, so one real kernel finds it for all. Whether the answer is right is the smoke test's
    to say.

    Raises:
        DeviceError: the kernel does not build or run.
    """
    try:
        x = dev.empty((3, 256))
        dev.write(x, np.linspace(-1.0, 1.0, 3 * 256, dtype=np.float32).reshape(3, 256))
        w = dev.upload(np.ones(256, dtype=np.float32), T.F32, (256,))
        out = dev.empty((3, 256))
        dev.rmsnorm(out, x, w, 1e-5)
        dev.read(out)
    except DeviceError:
        raise
    except Exception as e:  # noqa: BLE001 - pyopencl raises RuntimeError/LogicError/AttributeError...
        raise DeviceError(f"the rmsnorm kernel does not build and run on {dev.info.selector}: "
                          f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                          ) from e


class OpenCLBackend(Backend):
    """The pyopencl backend family: every device of every platform, indexed across platforms."""

    name = "opencl"

    def __init__(self) -> None:
        self._devices: list[tuple[Any, Any, DeviceInfo]] = []  # (platform, device, info)

    def probe(self) -> ProbeResult:
        """List every OpenCL device; never raises (see module doc)."""
        try:
            try:
                import pyopencl as cl
            except ImportError as e:
                return ProbeResult("opencl", False, reason=f"pyopencl is not installed ({e})", hint=INSTALL_HINT)
            try:
                platforms = cl.get_platforms()
            except Exception as e:  # noqa: BLE001 - PLATFORM_NOT_FOUND_KHR when no ICD is installed
                return ProbeResult("opencl", False, reason=f"no OpenCL platform found ({type(e).__name__}: "
                                   f"{str(e).strip()[:200]}); {describe_icds()}", hint=INSTALL_HINT)
            self._devices = []
            notes = []
            for pi, plat in enumerate(platforms):
                pname = f"{_safe(lambda p=plat: p.name.strip(), '?')} ({_safe(lambda p=plat: p.version.strip(), '?')})"
                try:
                    devs = plat.get_devices()
                except Exception as e:  # noqa: BLE001 - DEVICE_NOT_FOUND on an empty platform
                    notes.append(f"platform {pi} {pname}: {type(e).__name__}: {str(e).strip()[:200]}")
                    continue
                if not devs:
                    notes.append(f"platform {pi} {pname}: 0 devices")
                for di, dev in enumerate(devs):
                    info = device_info(cl, plat, dev, len(self._devices), pi, di)
                    self._devices.append((plat, dev, info))
            infos = [d[2] for d in self._devices]
            if not infos:
                if not platforms:
                    return ProbeResult("opencl", False, reason=f"no OpenCL platform found; {describe_icds()}",
                                       hint=INSTALL_HINT)
                return ProbeResult("opencl", False, reason=f"{len(platforms)} OpenCL platform(s) found, but they "
                                   f"expose no device: {'; '.join(notes)}", hint=empty_platform_hint(platforms))
            return ProbeResult("opencl", True, infos)
        except Exception as e:  # noqa: BLE001 - a probe never raises
            return ProbeResult("opencl", False, reason=f"OpenCL probe failed: {type(e).__name__}: {e}",
                               hint=INSTALL_HINT)

    def open(self, index: int) -> OpenCLDevice:
        """Open device ``index`` of the last probe (probing first if needed).

        Raises:
            DeviceError: no such device, or the context/queue cannot be created.
        """
        if not self._devices:
            res = self.probe()
            if not res.available:
                raise DeviceError(f"cannot open opencl:{index}: {res.reason}")
        if not 0 <= index < len(self._devices):
            raise DeviceError(f"no device opencl:{index}: {len(self._devices)} OpenCL device(s) found")
        _, dev, info = self._devices[index]
        return OpenCLDevice(info, dev)


class OpenCLDevice(OpenclVisionOps, ReplayRecorder, Device):
    """One OpenCL device: a context, one in-order queue, lazily built kernels.

    Tensors' handles are ``cl.Buffer`` objects; a ``head`` view shares its root's buffer.
    Every kernel launch goes through ``_launch`` (:mod:`.replay`: graph scopes are recorded as
    ``cl_khr_command_buffer`` s and replayed where the driver has the extension).
    """

    def __init__(self, info: DeviceInfo, cl_device: Any):
        import pyopencl as cl

        super().__init__(info)
        self._cl = cl
        self.cl_device = cl_device
        try:
            self.ctx = cl.Context([cl_device])
            self.queue = cl.CommandQueue(self.ctx, cl_device)
        except Exception as e:  # noqa: BLE001
            raise DeviceError(f"cannot open {info.selector} ({info.name}): {type(e).__name__}: {e}") from e
        _, shape = launch_shape(info)
        self.default_shape = shape
        #: the tuned choice in use (cooktop.backends.tune: the cache's for this device, {} for the defaults)
        self.tuning: dict[str, dict[str, int]] = {}
        self.shape = shape
        self.kernels = KernelCache(self.ctx, cl_device, shape, os.environ.get("COOKTOP_OPENCL_OPTIONS", ""), info)
        self._mf = cl.mem_flags
        # 8-bit activations for the integer-dot matmuls (q8.py); COOKTOP_OPENCL_Q8=0 turns them off
        self.q8 = Q8Shadows(self._alloc)
        self.use_q8 = settings.opencl_q8()
        self.exact_prompt = self.use_q8 and settings.opencl_exact_prompt()
        self.q8_fmt = "q8_1"  # what the producers write: the format the last integer-dot matmul read
        #: (n_in, weight serials) -> the launches of matmuls (:meth:`_matmuls_plan`)
        self._matmuls_plans: dict[tuple, list[tuple]] = {}
        self._init_replay(*self._replay_api())
        from ..tune import cache as tune_cache  # the device opens with its cached tuned choice, if any

        cached = tune_cache.load_choice(info)
        if cached:
            self.apply_tuning(cached)

    def apply_tuning(self, choice: dict[str, dict[str, int]]) -> None:
        """Run with the launch parameters of ``choice`` (:mod:`cooktop.backends.tune`; ``{}``: the
        defaults): device-wide ones (``rmsnorm``, ``attention``: ``rn_ls``, ``at_ls``) on the ops and
        attention programs, ``mat_vec:<TYPE>`` / ``prompt_matmul:<TYPE>`` ones on that type's
        weight program. Kernels are rebuilt lazily (programs already built are reused); uploaded
        weights stay valid (the repacked layout never depends on a tuned value).

        Raises:
            DeviceError: a parameter is not one of the search space (``tune.space``).
        """
        flavour, _ = launch_shape(self.info)
        base, per_type = opencl_shapes(self.default_shape, f"opencl-{flavour}", choice)
        self._drop_all_recordings()
        self._matmuls_plans.clear()
        self.shape = base
        self.kernels = KernelCache(self.ctx, self.cl_device, base, os.environ.get("COOKTOP_OPENCL_OPTIONS", ""),
                                   self.info, per_type)
        self.tuning = {k: dict(v) for k, v in choice.items()}

    def _replay_api(self) -> tuple[Any, str]:
        """The command-buffer API for :mod:`.replay` (None and the reason when there is none)."""
        if not settings.opencl_replay():
            return None, "COOKTOP_OPENCL_REPLAY=0"
        return cmdbuf.probe(self.cl_device.platform, self.cl_device)

    # -- memory -----------------------------------------------------------
    def _alloc(self, nbytes: int, hostbuf: np.ndarray | None = None, count: bool = True) -> Any:
        cl = self._cl
        size = max(int(nbytes), 4)
        limit = self.buffer_limit  # CL_DEVICE_MAX_MEM_ALLOC_SIZE, or COOKTOP_DEVICE_MEMORY's
        if limit is not None and size > limit:
            raise DeviceOutOfMemoryError(
                f"{self.info.selector} ({self.info.name}): cannot allocate {size} bytes: the device allows at "
                f"most {limit} bytes per buffer (global memory {self.info.global_mem_bytes} bytes)")
        try:
            if hostbuf is not None and hostbuf.nbytes:
                buf = cl.Buffer(self.ctx, self._mf.READ_ONLY | self._mf.COPY_HOST_PTR, hostbuf=hostbuf)
            else:
                buf = cl.Buffer(self.ctx, self._mf.READ_WRITE, size)
        except (cl.MemoryError, cl.RuntimeError, cl.LogicError) as e:
            if isinstance(e, cl.MemoryError) or "ALLOCATION" in str(e).upper() or "OUT_OF" in str(e).upper():
                raise DeviceOutOfMemoryError(
                    f"{self.info.selector} ({self.info.name}): cannot allocate {size} bytes (device limit "
                    f"{limit} bytes per buffer, {self.info.global_mem_bytes} bytes in all): {e}") from e
            raise DeviceError(f"{self.info.selector}: buffer of {size} bytes failed: {e}") from e
        if count:
            self._count_alloc(size)
        return buf

    def _upload(self, arr, ggml_type, shape, nbytes):
        host = arr.view(np.uint8).reshape(-1)
        if len(shape) == 2 and self.kernels.repacks(ggml_type, shape):  # SIMD layout, made on the device
            buf, raw = self._alloc(nbytes), self._alloc(nbytes, host, count=False)  # raw: freed once repacked
            self.kernels.weights(ggml_type, True).repack(self.queue, (shape[1] // 32, shape[0] // 16), None, raw,
                                                         buf, shape[1])
        else:
            buf = self._alloc(nbytes, host)
        self.q8.dirty(buf)
        if self.info.device_type == "cpu":  # the device copy lives in host memory too
            drop_file_pages(arr)
        return DeviceTensor(self, buf, shape, ggml_type)

    def _empty(self, shape, ggml_type):
        if ggml_type is not T.F32 and ggml_type is not T.I32:  # a KV cache of GGML rows, zeroed
            nbytes = shape[0] * row_bytes(ggml_type, shape[1])
            buf = self._alloc(nbytes)
            self._not_recordable("buffer fill")
            self._cl.enqueue_fill_buffer(self.queue, buf, np.uint8(0), 0, max(nbytes, 4))
            return DeviceTensor(self, buf, shape, ggml_type)
        buf = self._alloc(int(np.prod(shape, dtype=np.int64)) * 4)
        self.q8.dirty(buf)
        return DeviceTensor(self, buf, shape, ggml_type)

    def _write(self, t, data):
        dtype = np.int32 if t.ggml_type == T.I32 else np.float32
        host = np.array(data, dtype=dtype, copy=True, order="C")  # owned copy: the copy is asynchronous
        self.q8.dirty(t.handle)
        self._cl.enqueue_copy(self.queue, t.handle, host, is_blocking=False)

    def _read(self, t):
        dtype = np.int32 if t.ggml_type == T.I32 else np.float32
        host = np.empty(t.shape, dtype=dtype)
        self._cl.enqueue_copy(self.queue, host, t.handle, is_blocking=True)
        return host

    def synchronize(self) -> None:
        """Wait for every enqueued command (``clFinish``)."""
        self.queue.finish()

    def _release(self, tensors):
        """Drop the recordings (:mod:`.replay`) that bind a released buffer (the buffers themselves
        go with their last Python reference)."""
        self._drop_recordings_using({t.handle.int_ptr for t in tensors if t.handle is not None})
        gone = {t.serial for t in tensors}
        for key in [k for k in self._matmuls_plans if not gone.isdisjoint(k[1:])]:
            del self._matmuls_plans[key]

    def close(self):
        try:
            self._drop_all_recordings()
            self.queue.finish()
        except Exception:  # noqa: BLE001
            pass
        clear_cache(self.ctx)
        self.q8.clear()
        self.kernels = None

    # -- ops --------------------------------------------------------------
    def _matmul(self, out, x, w):
        n_tok, n_in = x.shape
        n_out = w.shape[0]
        repacked = self.kernels.repacks(w.ggml_type, w.shape)
        k = self.kernels.weights(w.ggml_type, repacked)
        s = self.kernels.shape_for(w.ggml_type)  # the type's tuned launch shape, else the device's
        rows = n_out // 16 if repacked else n_out  # repacked Q4_0: a work-item per group of 16 rows (dequant.cl)
        self.q8.dirty(out.handle)
        if n_tok > 1 and k.mul_mm_q8 is not None and self.use_q8 and not (
                n_tok <= k.mvt_tokens and k.mul_mvt_q8 is not None and self.exact_prompt):  # VNNI (module doc)
            slot = self._q8_input(x, k.act)
            gsize = (_ceil_to(rows if repacked else -(-n_out // s.mmq_r), s.mm_tm), -(-n_tok // (s.mmq_tn * k.mmq_tt)))
            self._launch(k.mul_mm_q8, gsize, (s.mm_tm, 1), w.handle, slot.xq, slot.xd, out.handle, n_in, n_out, n_tok)
        elif n_tok == 1 and k.mul_mv_q8 is not None and self.use_q8:
            slot = self._q8_input(x, k.act)
            self._launch(k.mul_mv_q8, (s.mv_ls, _ceil_to(rows, s.mv_r)), (s.mv_ls, s.mv_r),
                        w.handle, slot.xq, slot.xd, out.handle, n_in, n_out)
        elif n_tok > 1 and k.mul_mvt_q8 is not None and self.exact_prompt:  # the one-token sums, token by token
            slot = self._q8_input(x, k.act)
            self._launch(k.mul_mvt_q8, (s.mv_ls, _ceil_to(rows, s.mv_r), -(-n_tok // MVT_TN)), (s.mv_ls, s.mv_r, 1),
                         w.handle, slot.xq, slot.xd, out.handle, n_in, n_out, n_tok)
        elif n_tok == 1:
            self._launch(k.mul_mv, (s.mv_ls, _ceil_to(n_out, s.mv_r)), (s.mv_ls, s.mv_r),
                     w.handle, x.handle, out.handle, n_in, n_out)
        else:
            gsize = (_ceil_to(-(-n_out // s.mm_r), s.mm_tm), (n_tok + s.mm_tn - 1) // s.mm_tn)
            self._launch(k.mul_mm, gsize, (s.mm_tm, 1), w.handle, x.handle, out.handle, n_in, n_out, n_tok)

    def matmuls(self, x, *pairs):
        """:meth:`~cooktop.backends.ops.DeviceOps.matmuls`: for one token, the weights of each type
        with an 8-bit mat-vec (2 or 3 of them: Q/K/V, gate/up; Q and K alone where V has another
        type, as in Q4_K_M) run in one ``mul_mv_q8_3`` launch, each row with ``mul_mv_q8``'s sums;
        the others, and prompts, one matmul each. Every pair is checked before anything runs."""
        if len(pairs) < 2 or x.shape[0] != 1 or not self.use_q8 or x.chunks is not None or any(
                out.chunks is not None or w.chunks is not None for out, w in pairs):
            super().matmuls(x, *pairs)  # chunked tensors: matmul runs per part
            return
        for out, w in pairs:
            _MATMUL.check(self, out, x, w)
        key = (x.shape[1],) + tuple(w.serial for _, w in pairs)
        plan = self._matmuls_plans.get(key)
        if plan is None:  # worked out once per weight tuple (weights never change)
            plan = self._matmuls_plans[key] = self._matmuls_plan(x, pairs)
        for step in plan:
            if step[0] is None:
                out, w = pairs[step[1]]
                self._matmul(out, x, w)
                continue
            knl, gsize, lsize, idx, n, hw, fmt = step
            ho = [pairs[i][0].handle for i in idx]
            for h in ho:
                self.q8.dirty(h)
            slot = self._q8_input(x, fmt)
            ho += [ho[-1]] * (3 - len(ho))
            self._launch(knl, gsize, lsize, *hw, slot.xq, slot.xd, *ho, x.shape[1], *n)
        for out, w in pairs:  # the LoRA adapters of the weights (backends/lora.py), after their products
            if w.lora:
                lora.apply(self, out, x, w.lora)

    def _matmuls_plan(self, x, pairs) -> list[tuple]:
        """The launches of :meth:`matmuls` for these weights: ``(kernel, global, local, pair
        indices, rows per matrix (3), weight handles (3))`` per ``mul_mv_q8_3`` group (2-3 weights
        of one type with an 8-bit mat-vec), ``(None, index)`` per pair that runs as a matmul."""
        groups: dict[T, list[int]] = {}
        for i, (_, w) in enumerate(pairs):
            groups.setdefault(w.ggml_type, []).append(i)
        plan: list[tuple] = []
        for t, idx in groups.items():
            s = self.kernels.shape_for(t)
            ws = [pairs[i][1] for i in idx]
            rp = {self.kernels.repacks(t, w.shape) for w in ws}  # one layout per launch
            if t in Q8_TYPES and 1 < len(idx) <= 3 and self.quantizes_activations(t, 1) and len(rp) == 1:
                repacked = rp.pop()
                k = self.kernels.weights(t, repacked)
                n = tuple(w.shape[0] for w in ws) + (0,) * (3 - len(ws))
                hw = tuple(w.handle for w in ws) + (ws[-1].handle,) * (3 - len(ws))
                rows = sum(n) // 16 if repacked else sum(n)  # repacked Q4_0: groups of 16 rows
                plan.append((k.mul_mv_q8_3, (s.mv_ls, _ceil_to(rows, s.mv_r)), (s.mv_ls, s.mv_r), tuple(idx), n,
                             hw, k.act))
            else:
                plan += [(None, i) for i in idx]
        return plan

    def _get_rows(self, out, table, ids):
        n_ids = ids.shape[0]
        n_rows, n = table.shape
        k = self.kernels.weights(table.ggml_type, self.kernels.repacks(table.ggml_type, table.shape))
        self.q8.dirty(out.handle)
        nu = n // 32 + (1 if table.ggml_type in FLOAT_TYPES else 0)
        self._launch(k.get_rows, (nu, n_ids), None, table.handle, ids.handle, out.handle, n, n_rows, n_ids)

    def _rmsnorm(self, out, x, w, eps):
        n_rows, width = x.shape
        g = w.shape[0]  # groups of g values are rows of their own (contiguous)
        ls = self.shape.rn_ls
        if g == width and self._fuse_q8(n_rows, width) and self._fuse_q8k(width):
            slot = self.q8.claim(out.handle, n_rows, width, "q8_K")
            self._launch(self.kernels.ops().rmsnorm_q8k, (ls, n_rows), (ls, 1), out.handle, x.handle, w.handle, width,
                         eps, slot.xq, slot.xd)
            return
        if g == width and self._fuse_q8(n_rows, width):  # the next matmul's 8-bit input in the same kernel
            slot = self.q8.claim(out.handle, n_rows, width)
            self._launch(self.kernels.ops().rmsnorm_q8, (ls, n_rows), (ls, 1), out.handle, x.handle, w.handle, width,
                         eps, slot.xq, slot.xd)
            return
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().rmsnorm, (ls, n_rows * (width // g)), (ls, 1), out.handle, x.handle,
                                   w.handle, g, eps)

    def _rope(self, out, x, pos, head_dim, n_rot, freq_base, freq_scale, mode, freq_factors,
              ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig):
        n_tok, width = x.shape
        corr0, corr1, mscale = rope_yarn_params(n_rot, freq_base, freq_scale, ext_factor, attn_factor,
                                                beta_fast, beta_slow, n_ctx_orig)
        ff = freq_factors.handle if freq_factors is not None else x.handle  # not read without factors
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().rope, (head_dim // 2, n_tok), None, out.handle, x.handle, pos.handle,
                                head_dim, n_rot, freq_base, freq_scale, mode, width // head_dim,
                                ff, int(freq_factors is not None), ext_factor, mscale, corr0, corr1)

    def _kv_store(self, cache, x, pos):
        n_tok, dim = x.shape
        self.q8.dirty(cache.handle)
        if cache.ggml_type is not T.F32:  # kv_store.cl: rounded or quantized as it is written
            units = dim if cache.ggml_type in (T.F16, T.BF16) else dim // 32
            self._launch(self.kernels.kv_store(cache.ggml_type), (_ceil_to(units, 16), n_tok), (16, 1),
                                                   cache.handle, x.handle, pos.handle, dim, cache.shape[0])
            return
        self._launch(self.kernels.ops().kv_store, (_ceil_to(dim, 16), n_tok), (16, 1),
                                    cache.handle, x.handle, pos.handle, dim, cache.shape[0])

    def rope_store(self, cache, x, pos, cells, head_dim, n_rot, freq_base, freq_scale, mode, freq_factors=None,
                   ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0):
        """:meth:`~cooktop.backends.ops.DeviceOps.rope_store` in one launch (``kv_store.cl``
        ``rope_store``: rope's arithmetic, the cache type's store; ``x`` is not written)."""
        if mode not in (0, 2) or x.chunks is not None or cache.chunks is not None:
            super().rope_store(cache, x, pos, cells, head_dim, n_rot, freq_base, freq_scale, mode, freq_factors,
                               ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig)
            return
        _ROPE.check(self, x, x, pos, freq_factors, head_dim=head_dim, n_rot=n_rot)
        _KV_STORE.check(self, cache, x, cells)
        n_tok, dim = x.shape
        corr0, corr1, mscale = rope_yarn_params(n_rot, float(freq_base), float(freq_scale), float(ext_factor),
                                                float(attn_factor), float(beta_fast), float(beta_slow),
                                                int(n_ctx_orig))
        ff = freq_factors.handle if freq_factors is not None else x.handle  # not read without factors
        units = head_dim // 2 if cache.ggml_type in (T.F32, T.F16, T.BF16) else dim // 32  # see the kernel
        self.q8.dirty(cache.handle)
        self._launch(self.kernels.rope_store(cache.ggml_type), (_ceil_to(units, 16), n_tok), (16, 1), cache.handle,
                     x.handle, pos.handle, cells.handle, dim, cache.shape[0], head_dim, n_rot, float(freq_base),
                     float(freq_scale), mode, ff, int(freq_factors is not None), float(ext_factor), mscale, corr0,
                     corr1)

    def _gqa_group(self, n_head: int, n_head_kv: int, n_tok: int) -> int:
        """The GQA group size the serial attention runs per work-item (0: one query head each): the
        group shares each K/V row it reads, when the kv heads x rows still keep every compute unit
        busy and the group's accumulators stay small (<= 8 heads)."""
        g = n_head // n_head_kv
        if not self.shape.at_serial or g < 2 or g > 8 or n_head_kv * n_tok < (self.info.compute_units or 1):
            return 0
        return g

    def _attention_sinks(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks,
                         flash=True):
        self._attention(out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, flash, sinks)

    def _attention(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window=0, kv_start=None,
                   flash=True, sinks=None):
        if not flash:  # scores materialised, softmax, then V (attention.py, attention_kq.cl)
            attention_kq(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks)
            return
        if attention_tiled(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks):
            return  # a prompt on the GPU flavour: query tiles sharing each key tile (attention.py)
        n_tok, width = q.shape
        head_dim = width // n_head
        start, has_start = (kv_start.handle, 1) if kv_start is not None else (pos.handle, 0)
        args = (out.handle, q.handle, k_cache.handle, v_cache.handle, pos.handle, start, has_start,
                n_head, n_head_kv, scale, window) + ((sinks.handle,) if sinks is not None else ())
        has_sinks = sinks is not None
        kt, vt = k_cache.ggml_type, v_cache.ggml_type
        group = self._gqa_group(n_head, n_head_kv, n_tok)
        units = (n_head_kv if group else n_head, n_tok)
        if self.shape.at_serial and head_dim % 32 == 0 and self._fuse_q8(n_tok, width) and self.q8_fmt == "q8_1":
            slot = self.q8.claim(out.handle, n_tok, width)  # the output projection's 8-bit input
            knl = self.kernels.attention(head_dim, True, has_sinks, kt, vt, group)
            self._launch(knl, units, (1, 1), *args, slot.xq, slot.xd)
            return
        knl = self.kernels.attention(head_dim, False, has_sinks, kt, vt, group)
        self.q8.dirty(out.handle)
        if self.shape.at_serial:
            self._launch(knl, units, (1, 1), *args)  # many groups: all cores busy
        else:
            ls = self.shape.at_ls
            self._launch(knl, (ls, n_head, n_tok), (ls, 1, 1), *args)

    # -- mixture of experts (kernels in matmul.cl mul_mv_id and elementwise.cl) ---------
    def _moe_route(self, ids, weights, logits, gating, norm, scale, bias=None):
        n, n_expert = logits.shape
        self.q8.dirty(weights.handle)
        b = bias.handle if bias is not None else logits.handle  # not read without a bias
        self._launch(self.kernels.ops().moe_route, (n,), None, ids.handle, weights.handle, logits.handle, b,
                     int(bias is not None), n_expert, ids.shape[1], _GATING[gating], int(norm), scale, n)

    def _matmul_id(self, out, x, w, ids):
        """mul_mv_id for one row (decode); for more, the slots are first grouped by expert on the
        device (moe_group) and mul_mm_id reads each weight block once for up to 8 slots, giving each slot
        mul_mv_id's value bit for bit (kernels/matmul.cl)."""
        n, k = ids.shape
        n_exp, n_out, n_in = w.shape
        self.q8.dirty(out.handle)
        kern = self.kernels.weights(w.ggml_type, False)  # expert tensors are never repacked (3-D)
        per_slot = int(x.shape[1] != n_in)
        if n == 1:
            self._launch(kern.mul_mv_id, (n_out, n * k), None, w.handle, x.handle, ids.handle, out.handle, n_in, n_out,
                           k, per_slot, n_exp)
            return
        offs, order = self._moe_group_buffers(n_exp, n * k)
        self._launch(self.kernels.ops().moe_group, (1,), None, ids.handle, offs, order, n * k, n_exp)
        self._launch(kern.mul_mm_id, (n_out, n_exp), None, w.handle, x.handle, offs, order, out.handle, n_in, n_out, k,
                       per_slot)

    def _moe_group_buffers(self, n_expert: int, n_slots: int) -> tuple[Any, Any]:
        """Device scratch of moe_group (offsets int [n_expert + 1], order int [n_slots]), kept per device
        and grown as calls ask (never freed before the device closes)."""
        have = getattr(self, "_moe_groups", None)
        if have is None or have[0] < n_expert + 1 or have[1] < n_slots:
            ne, ns = max(n_expert + 1, have[0] if have else 0), max(n_slots, have[1] if have else 0)
            self._moe_groups = (ne, ns, self._alloc(4 * ne, count=False), self._alloc(4 * ns, count=False))
        return self._moe_groups[2], self._moe_groups[3]

    def _add_id(self, out, x, b, ids):
        n, k = ids.shape
        n_exp, m = b.shape
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().add_id, (k * m, n), None, out.handle, x.handle, b.handle, ids.handle, k, m,
                                  n_exp)

    def _moe_combine(self, out, y, weights):
        n, m = out.shape
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().moe_combine, (m, n), None, out.handle, y.handle, weights.handle,
                                       weights.shape[1], m)

    def _swiglu_oai(self, out, gate, up, alpha, limit):
        n = math.prod(out.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().swiglu_oai, (_ceil_to(n, ls),), (ls,), out.handle, gate.handle, up.handle, n,
                                      alpha, limit)

    def _elementwise(self, knl, out, a, b):
        n = math.prod(out.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self._launch(knl, (_ceil_to(n, ls),), (ls,), out.handle, a.handle, b.handle, n)

    def _silu_mul(self, out, gate, up):
        n_rows, n = out.shape
        if self._fuse_q8(n_rows, n) and self._fuse_q8k(n):
            slot = self.q8.claim(out.handle, n_rows, n, "q8_K")
            self._launch(self.kernels.ops().silu_mul_q8k, (n // 256, n_rows), None, out.handle, gate.handle,
                         up.handle, n, slot.xq, slot.xd)
            return
        if self._fuse_q8(n_rows, n):  # the down projection's 8-bit input in the same kernel
            slot = self.q8.claim(out.handle, n_rows, n)
            self._launch(self.kernels.ops().silu_mul_q8, (n // 32, n_rows), None, out.handle, gate.handle, up.handle,
                         n, slot.xq, slot.xd)
            return
        self._elementwise(self.kernels.ops().silu_mul, out, gate, up)

    def _gelu_mul(self, out, gate, up):
        self._elementwise(self.kernels.ops().gelu_mul, out, gate, up)

    def _add(self, out, a, b):
        self._elementwise(self.kernels.ops().add, out, a, b)

    def _mul(self, out, a, b):
        self._elementwise(self.kernels.ops().mul, out, a, b)

    def _ssm_conv(self, out, x, state, w, slots):
        """``kernels/recurrent.cl`` ``ssm_conv``: one work-item per channel, the rows in order."""
        n, c = x.shape
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self.q8.dirty(state.handle)
        self._launch(self.kernels.ops().ssm_conv, (_ceil_to(c, ls),), (ls,), out.handle, x.handle, state.handle,
                     w.handle, slots.handle, n, c, w.shape[1])

    def _silu(self, out, x):
        n = math.prod(out.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().silu, (_ceil_to(n, ls),), (ls,), out.handle, x.handle, n)

    def _sigmoid_mul(self, out, a, gate):
        self._elementwise(self.kernels.ops().sigmoid_mul, out, a, gate)

    def _l2_norm(self, out, x, group, eps):
        """``kernels/recurrent.cl`` ``l2_norm``: one work-group per group of ``group`` values (rmsnorm's shape)."""
        n_rows, width = x.shape
        ls = self.shape.rn_ls
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().l2_norm, (ls, n_rows * (width // group)), (ls, 1), out.handle, x.handle,
                     group, eps / group, 1.0 / math.sqrt(group))

    def _gdn_gate(self, g, beta, alpha, b, dt_bias, a):
        n = math.prod(g.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(g.handle)
        self.q8.dirty(beta.handle)
        self._launch(self.kernels.ops().gdn_gate, (_ceil_to(n, ls),), (ls,), g.handle, beta.handle, alpha.handle,
                     b.handle, dt_bias.handle, a.handle, n, g.shape[1])

    def _gated_delta_net(self, out, q, k, v, g, beta, state, slots, interleaved):
        """``kernels/recurrent.cl`` ``gated_delta_net``: one work-item per (value head, column of the state),
        the rows in order (``kdiv``: the head mapping, ``RecurrentOps.gated_delta_net``)."""
        n, h_v = g.shape
        d = v.shape[1] // h_v
        h_k = q.shape[1] // d
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self.q8.dirty(state.handle)
        self._launch(self.kernels.ops().gated_delta_net, (_ceil_to(h_v * d, ls),), (ls,), out.handle, q.handle,
                     k.handle, v.handle, g.handle, beta.handle, state.handle, slots.handle, n, h_v,
                     h_k, d, float(np.float32(1.0 / np.sqrt(np.float32(d)))), h_v // h_k if interleaved else 1)

    def _ssm_scan(self, out, xbc, dt, a, d, dt_bias, state, slots):
        """``kernels/recurrent.cl`` ``ssm_scan``: one work-item per (head, head value), the rows in order."""
        n, h = dt.shape
        d_inner = out.shape[1]
        ns = state.shape[1] // d_inner
        g = (xbc.shape[1] - d_inner) // (2 * ns)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self.q8.dirty(state.handle)
        self._launch(self.kernels.ops().ssm_scan, (_ceil_to(d_inner, ls),), (ls,), out.handle, xbc.handle,
                     dt.handle, a.handle, d.handle, dt_bias.handle, state.handle, slots.handle, n, h, d_inner // h,
                     ns, g)

    def _ssm_norm(self, out, y, z, w, eps):
        """``kernels/recurrent.cl`` ``ssm_norm``: one work-group per group of a row (rmsnorm's shape)."""
        n_groups, gw = w.shape
        ls = self.shape.rn_ls
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().ssm_norm, (ls, out.shape[0] * n_groups), (ls, 1), out.handle, y.handle,
                     z.handle, w.handle, gw, n_groups, eps)

    def _scale(self, out, x, s):
        n = math.prod(out.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().scale, (_ceil_to(n, ls),), (ls,), out.handle, x.handle, n,
                     float(np.float32(s)))

    def _add_bias(self, out, x, b):
        n = math.prod(out.shape)
        ls = self.shape.ew_ls
        self.q8.dirty(out.handle)
        self._launch(self.kernels.ops().add_bias, (_ceil_to(n, ls),), (ls,), out.handle, x.handle, b.handle, n,
                                    b.shape[0])

    def _copy(self, out, x):
        """``out = x``, enqueued: a copy kernel on CPU devices (all cores take part, so ``bench
        --ops`` measures the bandwidth the kernels can reach), a buffer copy command elsewhere
        (the DMA engine of a GPU)."""
        self.q8.dirty(out.handle)
        n = math.prod(x.shape)
        if self.info.device_type == "cpu" and n < 2 ** 31:
            self._launch(self.kernels.ops().copy_f32, (-(-n // 256),), None, out.handle, x.handle, n)
        else:
            self._not_recordable("buffer copy")
            self._cl.enqueue_copy(self.queue, out.handle, x.handle, byte_count=n * 4)

    def _copy_rows(self, t, src_row, dst_row, n_rows):
        """``clEnqueueCopyBuffer`` within ``t``'s buffer (no kernel; :meth:`Device.copy_rows
        <cooktop.backends.base.Device.copy_rows>`): rows of ``row_bytes(type, width)`` bytes,
        the two regions not overlapping (OpenCL's rule for a copy inside one buffer)."""
        rb = row_bytes(t.ggml_type, t.shape[1])
        self.q8.dirty(t.handle)
        self._not_recordable("buffer copy")
        self._cl.enqueue_copy(self.queue, t.handle, t.handle, byte_count=n_rows * rb, src_offset=src_row * rb,
                              dst_offset=dst_row * rb)

    def _copy_rect(self, dst, dst_row, dst_col, src, src_row, src_col, n_rows, n_cols):
        """``clEnqueueCopyBufferRect`` (no kernel; :meth:`Device._copy_rect
        <cooktop.backends.base.Device._copy_rect>`): rows of 4-byte values, pitches the tensors' widths."""
        self.q8.dirty(dst.handle)
        self._not_recordable("rectangle copy")
        self._cl.enqueue_copy(self.queue, dst.handle, src.handle, src_origin=(4 * src_col, src_row, 0),
                              dst_origin=(4 * dst_col, dst_row, 0), region=(4 * n_cols, n_rows, 1),
                              src_pitches=(4 * src.shape[-1], 0), dst_pitches=(4 * dst.shape[-1], 0))

    def prebuild(self, types: tuple[T, ...] = ()) -> None:
        """Build the float-op kernels and those of the weight ``types`` now, as one batch
        (:meth:`.programs.KernelCache.prebuild`: the first-compile notice and a progress bar).

        Raises:
            DeviceError: a build failed.
        """
        self.kernels.prebuild(types)

    # -- 8-bit activations (q8.py) -----------------------------------
    def quantizes_activations(self, ggml_type: T, n_tokens: int, shape: tuple[int, ...] | None = None) -> bool:
        """True when ``matmul`` with ``n_tokens`` rows of activations and weights of ``ggml_type``
        (and ``shape`` [n_out, n_in]; needed for n_tokens > 1) multiplies 8-bit quantized
        activations (``reference.quantize_q8_ref``) with integer dot products, as llama.cpp's CPU
        backend does; False when it computes in float32."""
        if not self.use_q8 or T(ggml_type) not in Q8_TYPES:
            return False
        if T(ggml_type) in Q8K_ONLY_TYPES and not self.kernels.q8k(T(ggml_type)):
            return False
        if n_tokens == 1 or self.exact_prompt:  # mul_mv_q8; a prompt: mul_mvt_q8 or mul_mm_q8
            return True
        return shape is not None and self.kernels.mm_q8(T(ggml_type), tuple(shape))

    def activation_format(self, ggml_type: T, n_tokens: int, shape: tuple[int, ...] | None = None) -> str | None:
        """:meth:`quantizes_activations` with the format: ``"q8_K"`` for the K-quants (llama.cpp's
        block_q8_K, ``reference.quantize_q8_K_ref``; ``COOKTOP_OPENCL_Q8K=0``: block_q8_1),
        ``"q8_1"`` for the other integer-dot types, None for float32 activations."""
        if not self.quantizes_activations(ggml_type, n_tokens, shape):
            return None
        return "q8_K" if self.kernels.q8k(T(ggml_type)) else "q8_1"

    def _fuse_q8k(self, n: int) -> bool:
        """True when a producer should write block_q8_K (the last integer-dot matmul read it and
        whole 256-value super-blocks fit); block_q8_1 otherwise."""
        return self.q8_fmt == "q8_K" and n % 256 == 0

    def _fuse_q8(self, n_rows: int, n: int) -> bool:
        """True when an op producing ``[n_rows, n]`` should also write its 8-bit copy: the
        integer-dot matmuls read it (any number of rows: mul_mv_q8, mul_mm_q8, mul_mvt_q8) and
        whole 32-value blocks fit. The same producer for one row and many keeps a prompt's
        8-bit copies those of its tokens one at a time."""
        return self.use_q8 and (n_rows == 1 or self.kernels.vnni or self.exact_prompt) and n % 32 == 0

    def _q8_input(self, x: DeviceTensor, fmt: str = "q8_1"):
        """The 8-bit copy of ``x`` (f32 [n, n_in], n_in % 32 == 0; % 256 for ``"q8_K"``) in
        format ``fmt``, quantizing it now if no op made one since ``x`` was last written."""
        n, n_in = x.shape
        self.q8_fmt = fmt
        slot = self.q8.lookup(x.handle, n, n_in, fmt)
        if slot is None:
            slot = self.q8.claim(x.handle, n, n_in, fmt, keep_others=True)
            if fmt == "q8_K":
                self._launch(self.kernels.ops().quantize_q8k, (n_in // 256, n), None, x.handle, slot.xq, slot.xd,
                             n_in)
            else:
                self._launch(self.kernels.ops().quantize_q8, (n_in // 32, n), None, x.handle, slot.xq, slot.xd, n_in)
        return slot
