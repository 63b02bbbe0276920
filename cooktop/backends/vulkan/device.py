"""The Vulkan backend, through Kompute's Python bindings (``kp`` 0.9.0).

Modules: this one (backend, device, ops), :mod:`.info` (device facts
through libvulkan, DeviceInfo), :mod:`.shaders` (variants, SPIR-V,
push constants, grid sizes).

Design (DESIGN.md, "Kompute"):

- **Shaders**: GLSL compute shaders in ``glsl/*.comp``, one
  source per op family, variants by ``-D`` defines (``mul_mat_vec_q4_0``,
  ``mul_mm_q4_k``, ...) listed in ``variants.json`` and compiled to SPIR-V by
  ``build.py`` (``make shaders``); the ``.spv`` files ship in the package.
- **kp with cooktop's patch** (``scripts/kompute/kp-0.9.0-cooktop.patch``,
  built by ``cooktop setup-vulkan`` (``cooktop/tools/kompute``); ``kp.cooktop_patch`` >= 1): memory
  barriers bound for Python (``OpGlobalMemoryBarrier``, ``OpMemoryBarrier``),
  ``OpDispatch`` (a dispatch without kp's implicit per-tensor transfer
  barriers), transfer usage on storage buffers, and the logical device
  created with the optional features the shaders can use
  (:data:`.info.KP_FEATURES`, reported by ``Manager.enabled_features()``).
  An unpatched kp is refused by the probe with that hint.
- **Tensors**: weights are raw GGML blocks uploaded once as a uint32 view
  (zero-padded to 16 bytes plus 16) into a ``storage`` (device-only)
  tensor through a temporary host tensor (``OpTensorCopy``: vkCmdCopyBuffer);
  activations and KV cache are ``storage`` tensors too. The baseline shaders
  unpack bytes and halves from 32-bit words, so they need no optional
  feature; variants that need one (``"features"`` in variants.json) stand in
  for them on devices where kp enabled it (:func:`.shaders.pick_variant`).
- **Ops are recorded, not run**: every op appends ``(algorithm, push
  constants)`` to a pending list. :meth:`VulkanDevice.read` appends the
  read-back and executes the list as one ``kp.Sequence``, replayed from an LRU
  cache when the same list was seen before. A fixed op list handed over in a
  :meth:`~.base.Device.graph` scope (the forward pass's blocks and head) is
  kept under its key and enqueued as one entry when the key recurs, without
  the ops' Python path (per-token position and token id live in device tensors
  written through :meth:`write`, never in push constants). Recording, graphs
  and barriers: :mod:`.graph`.
- **write()**: the data goes into a host-visible staging tensor (one per
  destination and per write occurrence in the pending list, kept for reuse)
  and a ``copy`` dispatch inside the sequence moves it into the storage
  tensor; only ``t``'s own elements are copied, so a ``head(n)`` view leaves
  the other rows alone. Host writes before vkQueueSubmit are visible to the
  device without a barrier (Vulkan spec 7.9, host write ordering guarantees).
  **read()**: a ``copy`` dispatch into a host-visible ``host`` tensor, then a
  compute-write -> host-read barrier; after the fence wait its mapped memory is
  read on the host.
- **Barriers**: one global memory barrier only before a dispatch that depends
  on an earlier one of the sequence (RAW, WAW, WAR; :mod:`.graph`).
  ``make test-vulkan-validation`` (tests/vulkan_validation.py, run by .ci/run) runs
  every Vulkan test under VK_LAYER_KHRONOS_validation with synchronization
  validation and fails on any error message.
- **Pipelines** (``Manager.algorithm``) are created once per (shader variant,
  bound tensors, workgroup count) and cached for the device's lifetime; so
  are the tensors they bind (buffers are freed by :meth:`close`). Workgroup
  counts are rounded up to a power of two of the rows so that prompt chunks
  of different lengths share pipelines; shaders bounds-check with the exact
  sizes from the push constants.
- **Push constants**: one uint32 array per dispatch (floats bit-cast), its
  size asserted <= 128 bytes (the Vulkan minimum of ``maxPushConstantsSize``).
  kp 0.9.0's ``Manager.algorithm`` picks the push-constant element type from
  the *spec constants'* dtype (a binding bug), so an empty uint32 spec-constant
  array is passed.

Performance notes (lavapipe, measured with scripts/bench_vulkan.py and A/B runs of
the shaders): lavapipe runs a workgroup's invocations in SIMD lanes of 8 and
loads divergent addresses lane by lane, so the cost is the number of load
instructions (16-byte loads cost the same as 4-byte ones: weights are read as
uvec4 where the layout allows) and the number of barriers (mul_mat_vec reduces
with subgroupAdd in one-subgroup workgroups, no barrier). A replayed sequence
runs ~1.5x slower when the driver's threads were idle before it.

Counters for tests: ``n_barriers`` (barriers recorded, all sequences).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ... import settings
from ...errors import DeviceError, DeviceOutOfMemoryError, UnsupportedOpError
from ..base import Backend, Device, DeviceInfo, DeviceTensor, ProbeResult, rope_yarn_params, row_bytes, type_name
from . import INSTALL_HINT
from .attention import attention_kq, attention_split, attention_tiled, lavapipe_max_keys, scores_flash
from .graph import (  # noqa: F401  (ACCESS_* / STAGE_* / MAX_* are part of this module's interface)
    ACCESS_HOST_READ,
    ACCESS_SHADER_READ,
    ACCESS_SHADER_WRITE,
    ACCESS_TRANSFER_READ,
    ACCESS_TRANSFER_WRITE,
    MAX_GRAPHS,
    MAX_SEQUENCES,
    STAGE_COMPUTE_SHADER,
    STAGE_HOST,
    STAGE_TRANSFER,
    SequenceRecorder,
)
from .info import (
    KP_FEATURES,
    VkDeviceFacts,
    VulkanInfoError,
    VulkanNoDriverError,
    facts_to_info,
    kp_props_to_info,
    query_devices,
)
from .q8 import Q8Inputs, input_format
from .shaders import (  # noqa: F401
    MAX_PUSH_BYTES,
    SHADER_DIR,
    VARIANTS,
    VULKAN_TYPES,
    binding_access,
    bucket,
    f32_bits,
    load_spirv,
    pack_push,
    pick_variant,
    variants,
    workgroups,
)
from .tuning import MMV_NROWS, vulkan_mat_vec
from .vision import VulkanVisionOps

#: Token count from which matmul uses the tiled mul_mm shader instead of mul_mat_vec.
MM_MIN_TOKENS = 8


#: Max workgroups of a grid-stride shader (copy, fill, add, silu_mul).
MAX_STRIDE_GROUPS = 512


#: The kp patch level this backend needs (``kp.cooktop_patch``; scripts/kompute/kp-0.9.0-cooktop.patch).
KP_PATCH_LEVEL = 2

#: No driver creates a Vulkan instance.
DRIVER_HINT = ("install a Vulkan driver (apt-get install mesa-vulkan-drivers for lavapipe on the CPU, or your GPU "
               "vendor's driver); if VK_ICD_FILENAMES / VK_DRIVER_FILES is set, check the files it names")

#: The loader itself is missing.
LOADER_HINT = "apt-get install libvulkan1 mesa-vulkan-drivers (the Vulkan loader and a driver)"

_facts_cache: list[VkDeviceFacts] | None = None


class _VkExtra:
    """What a Vulkan activation tensor carries (``DeviceTensor.extra`` of its root): host
    staging tensors, one per write occurrence in the pending list (``(kp tensor, its
    numpy view)``), the readback tensor, and its writes since the last flush."""

    __slots__ = ("staging", "readback", "writes")

    def __init__(self) -> None:
        self.staging: list[tuple[Any, np.ndarray]] = []
        self.readback: Any = None
        self.writes = 0


def _import_kp():
    """Import kp (raises ImportError with the original message when it is absent or broken)."""
    import kp  # noqa: PLC0415 - optional dependency
    return kp


def kp_problem(kp) -> str | None:
    """Why this ``kp`` module cannot run the backend (no cooktop patch), or None."""
    level = getattr(kp, "cooktop_patch", 0)
    if level < KP_PATCH_LEVEL:
        return (f"kp 0.9.0 is installed without cooktop's patch (level {level}, need {KP_PATCH_LEVEL}: memory "
                f"barriers, buffer usage, device features); rebuild it: cooktop setup-vulkan")
    return None


def numpy_problem(kp=None) -> str | None:
    """Why the installed numpy cannot drive ``kp``, or None.

    kp built with pybind11 < 2.12 (Debian's 2.10, or unpatched kp, whose version is unknown)
    reads numpy 2 arrays as zeros; the patched build reports ``kp.pybind11_version``.
    """
    major = int(np.__version__.split(".")[0])
    if major < 2:
        return None
    pyb = getattr(kp, "pybind11_version", "0.0") if kp is not None else "0.0"
    try:
        ok = tuple(int(x) for x in pyb.split(".")[:2]) >= (2, 12)
    except ValueError:
        ok = False
    if not ok:
        return (f"numpy {np.__version__} is installed, but this kp was built with pybind11 {pyb}, which "
                f"silently corrupts tensors under numpy 2 (rebuild: cooktop setup-vulkan, or pip "
                f"install 'numpy<2')")
    return None


def device_facts(refresh: bool = False) -> list[VkDeviceFacts]:
    """Vulkan physical devices (cached per process; see :mod:`.info`).

    Raises:
        VulkanInfoError: no libvulkan or no driver.
    """
    global _facts_cache
    if _facts_cache is None or refresh:
        _facts_cache = query_devices()
    return _facts_cache


class VulkanBackend(Backend):
    """The Vulkan family: every physical device libvulkan lists, run through kp 0.9.0."""

    name = "vulkan"

    def __init__(self) -> None:
        self._infos: list[DeviceInfo] = []

    def probe(self) -> ProbeResult:
        """Import kp, check numpy, list devices through libvulkan (kp as fallback). Never raises."""
        try:
            kp = _import_kp()
        except Exception as e:  # noqa: BLE001 - a probe never raises
            if "libvulkan" in str(e):  # kp links the loader: a missing/broken libvulkan.so.1 fails the import
                return ProbeResult("vulkan", False, reason=f"the Vulkan loader cannot be loaded, so kp (Kompute) "
                                   f"cannot be imported: {type(e).__name__}: {e}", hint=LOADER_HINT)
            return ProbeResult("vulkan", False, reason=f"kp (Kompute) is not importable: {type(e).__name__}: {e}",
                               hint=INSTALL_HINT)
        bad = kp_problem(kp)
        if bad:
            return ProbeResult("vulkan", False, reason=bad, hint=INSTALL_HINT)
        bad = numpy_problem(kp)
        if bad:
            return ProbeResult("vulkan", False, reason=bad, hint="pip install 'numpy<2'")
        try:
            self._infos = [facts_to_info(f) for f in device_facts()]
        except VulkanNoDriverError as e:  # never try kp.Manager() now: it aborts the process
            return ProbeResult("vulkan", False, reason=str(e), hint=DRIVER_HINT)
        except VulkanInfoError as e:  # ctypes cannot load libvulkan: ask kp (a child process checked it is safe)
            try:
                kp = _import_kp()
                mgr = kp.Manager()
                props = mgr.list_devices() if hasattr(mgr, "list_devices") else [mgr.get_device_properties()]
                mgr.destroy()
                self._infos = [kp_props_to_info(i, p) for i, p in enumerate(props)]
            except Exception as e2:  # noqa: BLE001
                return ProbeResult("vulkan", False, reason=f"no Vulkan device: {e}; kp: {type(e2).__name__}: {e2}",
                                   hint=INSTALL_HINT)
        except Exception as e:  # noqa: BLE001
            return ProbeResult("vulkan", False, reason=f"Vulkan probe failed: {type(e).__name__}: {e}",
                               hint=INSTALL_HINT)
        if not self._infos:
            return ProbeResult("vulkan", False, reason="the Vulkan loader lists no device", hint=INSTALL_HINT)
        return ProbeResult("vulkan", True, list(self._infos))

    def open(self, index: int = 0) -> VulkanDevice:
        """Open device ``index`` (a kp.Manager on that physical device).

        Raises:
            DeviceError: no such device or kp cannot open it.
        """
        if not self._infos:
            res = self.probe()
            if not res.available:
                raise DeviceError(f"vulkan is unavailable: {res.reason}")
        info = next((i for i in self._infos if i.index == index), None)
        if info is None:
            raise DeviceError(f"no device vulkan:{index} (found {len(self._infos)})")
        try:
            return VulkanDevice(info)
        except DeviceError:
            raise
        except Exception as e:  # noqa: BLE001
            raise DeviceError(f"cannot open vulkan:{index} ({info.name}): {type(e).__name__}: {e}") from e


class VulkanDevice(VulkanVisionOps, SequenceRecorder, Device):
    """One Vulkan device driven by a ``kp.Manager`` (module docstring: design; the
    recording of sequences and graphs is :class:`~.graph.SequenceRecorder`'s).

    Counters for tests and benchmarks: ``n_recordings`` (sequences recorded),
    ``n_replays`` (cached sequences replayed), ``n_graphs`` / ``n_graph_replays``
    (graphs recorded / replayed), ``n_pipelines`` (algorithms created),
    ``n_barriers`` (memory barriers recorded). ``features``: the optional device
    features kp enabled (shader variants are picked by them). ``record_graphs``:
    :meth:`graph` scopes are recorded and replayed (default; ``COOKTOP_GRAPH=0``
    turns it off: every op runs its Python path, as outside a scope).
    """

    def __init__(self, info: DeviceInfo):
        super().__init__(info)
        self._kp = _import_kp()
        self.mgr = self._kp.Manager(info.index)
        # COOKTOP_VULKAN_DISABLE_FEATURES=a,b: run as if kp had not enabled them (A/B of shader variants)
        off = {f.strip() for f in os.environ.get("COOKTOP_VULKAN_DISABLE_FEATURES", "").split(",")}
        self.features: frozenset[str] = frozenset(self.mgr.enabled_features()) - off
        info.extra["features_enabled"] = [f for f in KP_FEATURES if f in self.features]
        self._no_spec = np.zeros(0, dtype=np.uint32)
        # mul_mat_vec's workgroup size (spec constant 0): one subgroup, at least NROWS invocations
        self._mmv_spec = np.array([max(info.subgroup_size or 32, MMV_NROWS)], dtype=np.uint32)
        # (variant, handles, grid) -> (algorithm, handles, handles read, handles written, variant)
        self._algos: dict[tuple, tuple[Any, tuple, frozenset, frozenset, str]] = {}
        # the pending list: ("algo", algos entry, push), ("host_read", tensor, ()), ("graph", Graph, ())
        self._init_recorder(os.environ.get("COOKTOP_GRAPH", "1") != "0")
        self._written: list[_VkExtra] = []       # tensors written since the last flush
        self._tensors: list[Any] = []            # every kp tensor made here (destroyed by release/close)
        self.n_pipelines = 0
        ex = info.extra
        self.max_buffer_bytes: int | None = ex.get("max_storage_buffer_range") or None
        self._dummy_t = None
        # workgroups per token of a mat-vec: on CPU drivers a few per core (each costs ~20 us on
        # lavapipe), on GPUs one per 8 rows (no cap)
        self._mmv_target_wgs = 4 * (os.cpu_count() or 2) if info.device_type == "cpu" else 1 << 30
        self._q8 = Q8Inputs(self)  # 8-bit copies of activations for the integer-dot mat-vec
        #: weight type -> (mat-vec spec constants, workgroups per token): a tuned choice's, else the above
        self._mmv_tuned: dict[T, tuple[np.ndarray, int]] = {}
        #: the tuned choice in use (cooktop.backends.tune: the cache's for this device, {} for the defaults)
        self.tuning: dict[str, dict[str, int]] = {}
        from ..tune import cache as tune_cache  # the device opens with its cached tuned choice, if any

        cached = tune_cache.load_choice(info)
        if cached:
            self.apply_tuning(cached)

    def apply_tuning(self, choice: dict[str, dict[str, int]]) -> None:
        """Run with the launch parameters of ``choice`` (:mod:`cooktop.backends.tune`; ``{}``: the
        defaults): ``mat_vec:<TYPE>``'s ``wg`` (mul_mat_vec's workgroup size, specialization constant
        0) and ``wgs_per_core`` (CPU drivers: workgroups per token and core). Pipelines, graphs and
        sequences built so far are dropped (they hold the old constants).

        Raises:
            DeviceError: a parameter is not one of the search space (``tune.space``).
        """
        tuned = vulkan_mat_vec(self.info, choice)
        self.flush()
        self._drop_recordings()
        self._algos.clear()
        cores = os.cpu_count() or 2
        self._mmv_tuned = {t: (np.array([wg], dtype=np.uint32),
                               per_core * cores if self.info.device_type == "cpu" else self._mmv_target_wgs)
                           for t, (wg, per_core) in tuned.items()}
        self.tuning = {k: dict(v) for k, v in choice.items()}

    # -- memory -----------------------------------------------------------
    def _alloc_check(self, nbytes: int, what: str) -> None:
        if self.buffer_limit and nbytes > self.buffer_limit:
            raise DeviceOutOfMemoryError(
                f"{what} needs one buffer of {nbytes} bytes, more than {self.info.selector}'s largest buffer of "
                f"{self.buffer_limit} bytes (maxStorageBufferRange {self.max_buffer_bytes}, or COOKTOP_DEVICE_MEMORY)")
        mem = self.info.global_mem_bytes
        if mem and self.allocated_bytes + nbytes > mem:
            raise DeviceOutOfMemoryError(
                f"{what} needs {nbytes} bytes but {self.info.selector} has {mem - self.allocated_bytes} of "
                f"{mem} bytes left")

    def _tensor(self, arr: np.ndarray, kind: str) -> Any:
        try:
            t = self.mgr.tensor_t(arr, getattr(self._kp.TensorTypes, kind))
        except Exception as e:  # noqa: BLE001 - vk::OutOfDeviceMemory and friends
            raise DeviceOutOfMemoryError(f"{self.info.selector} cannot allocate {arr.nbytes} bytes: {e}") from e
        self._tensors.append(t)
        return t

    def _upload(self, arr, ggml_type, shape, nbytes):
        """Weights to a storage tensor as raw GGML blocks (uint32 view, zero-padded to 16 bytes + 16).

        Raises:
            DeviceOutOfMemoryError: over maxStorageBufferRange or device memory.
        """
        raw = arr.view(np.uint8).reshape(-1)
        # zero-padded to 16 bytes plus one spare uvec4: shaders read 16-byte words (common.glsl)
        n_words = (nbytes + 15) // 16 * 4 + 4
        self._alloc_check(n_words * 4, f"{type_name(ggml_type)} weight {list(shape)}")
        words = np.zeros(n_words, dtype=np.uint32)
        words.view(np.uint8)[:nbytes] = raw
        staging = self.mgr.tensor_t(words, self._kp.TensorTypes.host)
        t = self._tensor(np.zeros(n_words, dtype=np.uint32), "storage")
        self.mgr.sequence().eval(self._kp.OpTensorCopy([staging, t]))
        staging.destroy()
        self._count_alloc(n_words * 4)
        return DeviceTensor(self, t, shape, ggml_type)

    def _empty(self, shape, ggml_type):
        """A storage (device-only) F32 or I32 tensor, or a KV cache of GGML rows (kv.glsl) in 32-bit words
        (zeroed by :meth:`zeros`). Raises DeviceOutOfMemoryError."""
        n = max(4, (self._words(shape, ggml_type) + 3) // 4 * 4)  # padded to 4 values: shaders may read vec4s
        self._alloc_check(4 * n, f"{type_name(ggml_type)} tensor {list(shape)}")
        dtype = np.int32 if ggml_type == T.I32 else np.float32
        t = self._tensor(np.zeros(n, dtype=dtype), "storage")
        self._count_alloc(4 * n)
        dt = DeviceTensor(self, t, shape, ggml_type)
        dt.extra = _VkExtra()
        return dt

    @staticmethod
    def _words(shape, ggml_type) -> int:
        """32-bit words of a tensor: its values, or a KV cache's bytes / 4 (rounded up)."""
        if ggml_type is T.F32 or ggml_type is T.I32:
            return math.prod(shape)
        return (shape[0] * row_bytes(ggml_type, shape[1]) + 3) // 4

    def zeros(self, shape, ggml_type=T.F32):
        """``empty`` then a fill dispatch (no host staging buffer for the whole tensor)."""
        t = self.empty(shape, ggml_type)
        n = self._words(t.shape, t.ggml_type)
        self._dispatch("fill", (t,), self._stride_groups(t), (n, 0))
        return t

    def _write(self, t, arr):
        """Enqueue a host-to-device copy of ``arr`` into ``t`` (see module doc: staging + copy dispatch)."""
        n = math.prod(t.shape)
        dtype = np.int32 if t.ggml_type == T.I32 else np.float32
        root = t.root.handle
        ex = t.root.extra
        k = ex.writes
        ex.writes += 1
        if k == 0:
            self._written.append(ex)
        if k == len(ex.staging):
            size = int(root.size())
            kt = self._tensor(np.zeros(size, dtype=dtype), "host")
            ex.staging.append((kt, kt.data()))
        st = ex.staging[k]
        st[1][:n] = arr.reshape(-1).astype(dtype, copy=False)
        self._dispatch_raw("copy", (st[0], root), self._stride_grid(n, int(root.size())), (n,))

    def _read(self, t):
        """Run everything pending (one sequence, replayed when seen before) and return ``t`` from the host."""
        n = math.prod(t.shape)
        root = t.root.handle
        rb = t.root.extra.readback
        if rb is None:
            dtype = np.int32 if t.ggml_type == T.I32 else np.float32
            rb = self._tensor(np.zeros(int(root.size()), dtype=dtype), "host")
            t.root.extra.readback = rb
        self._dispatch_raw("copy", (root, rb), self._stride_grid(n, int(root.size())), (n,))
        self._pending.append(("host_read", rb, ()))
        self.flush()
        return np.array(rb.data()[:n]).reshape(t.shape)

    def _graph_begin(self, key):
        self._q8.forget_fresh()  # a graph quantizes its own inputs (q8.py)
        return super()._graph_begin(key)

    def synchronize(self) -> None:
        """Run the pending op list and wait for it (:meth:`flush`: ``Sequence.eval`` waits)."""
        self.flush()

    def _flushed(self) -> None:
        for ex in self._written:
            ex.writes = 0
        self._written = []

    def _release(self, tensors):
        """Destroy the kp tensors of these allocations and every pipeline, sequence,
        staging and readback buffer that refers to them; ``allocated_bytes`` goes down
        by their size, so repeated load/close cycles do not exhaust the OOM check."""
        self.flush()
        doomed = {t.handle for t in tensors}  # kp tensors hash by identity
        doomed |= self._q8.drop(doomed)  # their 8-bit copies (q8.py)
        extra = []
        for t in tensors:
            if t.extra is not None:
                extra += [st[0] for st in t.extra.staging]
                extra += [t.extra.readback] if t.extra.readback is not None else []
                t.extra = None
        self._destroy(doomed, extra)

    def flush(self) -> None:
        """:meth:`GraphRunner.flush <cooktop.backends.vulkan.graph.GraphRunner.flush>`, then destroy
        the 8-bit copies replaced by larger ones meanwhile (q8.py ``retired``: nothing runs on them
        any more once the list has run)."""
        super().flush()
        if self._q8.retired:
            self._destroy(self._q8.take_retired())

    def _destroy(self, doomed: set, extra: list | tuple = ()) -> None:
        """Destroy kp tensors ``doomed`` (counted in ``allocated_bytes``) and ``extra`` (staging,
        readback: not counted), with every pipeline, graph and sequence that binds them."""
        for key in [k for k, entry in self._algos.items() if any(h in doomed for h in entry[1])]:
            del self._algos[key]
        self._drop_graphs_using(doomed)  # their keys must not replay freed buffers
        for seq in self._seqs.values():  # sequences record pipelines by identity: drop them all
            seq.destroy()
        self._seqs.clear()
        gone = doomed | set(extra)
        self._tensors = [t for t in self._tensors if t not in gone]
        for h in doomed:
            self.allocated_bytes -= 4 * int(h.size())
            h.destroy()
        for x in extra:
            x.destroy()

    def close(self) -> None:
        """Destroy sequences, pipelines, buffers and the kp.Manager."""
        self._drop_recordings()
        self._algos.clear()
        self._written = []
        self._tensors.clear()
        self._dummy_t = None
        if self.mgr is not None:
            self.mgr.destroy()
            self.mgr = None

    # -- dispatch ---------------------------------------------------------
    def _stride_grid(self, n: int, cap: int) -> list[int]:
        """Workgroups of 256 for a grid-stride loop over ``n`` elements of an allocation of ``cap``:
        sized for ``n`` rounded up to a power of two (so chunk lengths share pipelines), at most
        MAX_STRIDE_GROUPS (lavapipe pays per workgroup, so a 1-token op must not launch a batch-sized grid)."""
        return workgroups(min(MAX_STRIDE_GROUPS, (bucket(n, cap) + 255) // 256))

    def _stride_groups(self, t: DeviceTensor) -> list[int]:
        return self._stride_grid(math.prod(t.shape), int(t.root.handle.size()))

    def _dispatch(self, variant: str, tensors: tuple[DeviceTensor, ...], grid: list[int],
                  push: tuple[int, ...], spec: np.ndarray | None = None) -> None:
        for x in tensors:
            if x.device is not self:
                raise DeviceError(f"{variant}: tensor {x!r} lives on another device than {self.info.selector}")
        self._dispatch_raw(variant, tuple(x.handle for x in tensors), grid, push, spec)

    def _dispatch_raw(self, variant: str, handles: tuple, grid: list[int], push: tuple[int, ...],
                      spec: np.ndarray | None = None) -> None:
        """Enqueue ``variant`` (a logical name; :func:`pick_variant` chooses by device features)
        on ``handles`` (kp tensors, in binding order); ``spec``: the mat-vec's specialization
        constants (default: the device's).

        Raises:
            DeviceError: the variant binds a different number of buffers than given.
        """
        key = (variant, handles, tuple(grid), None if spec is None else tuple(spec))  # kp tensors hash by identity
        entry = self._algos.get(key)
        if entry is None:
            name = pick_variant(variant, self.features)
            access = binding_access(name)
            if len(access) != len(handles):
                raise DeviceError(f"{name}: {len(handles)} buffers bound, the shader has {len(access)} bindings")
            if spec is None:
                spec = self._mmv_spec if variant.startswith("mul_mat_vec_") else self._no_spec
            algo = self.mgr.algorithm(list(handles), load_spirv(name), grid, spec, pack_push(push))
            reads = frozenset(h for h, a in zip(handles, access) if "r" in a)
            writes = frozenset(h for h, a in zip(handles, access) if "w" in a)
            entry = (algo, handles, reads, writes, name)
            self._algos[key] = entry
            self.n_pipelines += 1
        self._sink.append(("algo", entry, push))

    def _mmv_variant(self, ggml_type: T) -> str | None:
        """The mat-vec variant this device runs for ``ggml_type`` weights (None: no mat-vec):
        :func:`pick_variant` by features, the K-quants' block_q8_1 one (``"input": "q8_1"``), or
        their block_q8_K one (``"q8_K"``) with ``COOKTOP_VULKAN_Q8K=1``."""
        name = VARIANTS["mul_mat_vec"].get(T(ggml_type))
        if name is None:
            return None
        return pick_variant(name, self.features, "q8_K" if settings.vulkan_q8k() else "q8_1")

    def max_attention_keys(self, head_dim: int) -> int | None:
        """On lavapipe (llvmpipe), :func:`.attention.lavapipe_max_keys`; None elsewhere."""
        return lavapipe_max_keys(head_dim) if "llvmpipe" in self.info.name.lower() else None

    def quantizes_activations(self, ggml_type: T, n_tokens: int, shape: tuple[int, ...] | None = None) -> bool:
        """True when ``matmul`` of ``n_tokens`` rows with ``ggml_type`` weights runs the integer-dot
        mat-vec on 8-bit activations (q8.py; exact on the quantization :meth:`activation_format`
        names), False when it computes in float32. Any ``n_tokens``: a type with that
        variant keeps it for prompts too. ``shape`` is unused (same as OpenCL's)."""
        return self.activation_format(ggml_type, n_tokens, shape) is not None

    def activation_format(self, ggml_type: T, n_tokens: int, shape: tuple[int, ...] | None = None) -> str | None:
        """The 8-bit activations ``matmul`` with ``ggml_type`` weights reads: ``"q8_1"``
        (``reference.quantize_q8_ref``: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K), ``"q8_K"``
        (``reference.quantize_q8_K_ref``: Q4_K, Q5_K, Q6_K with ``COOKTOP_VULKAN_Q8K=1``), or None
        (float32: the other types, or a device without shaderIntegerDotProduct / 16-bit storage)."""
        name = self._mmv_variant(ggml_type)
        return None if name is None else input_format(name)

    # -- ops --------------------------------------------------------------
    @staticmethod
    def _rows(t: DeviceTensor) -> int:
        return t.shape[0] if len(t.shape) > 1 else 1

    @staticmethod
    def _row_cap(t: DeviceTensor) -> int:
        return t.root.shape[0] if len(t.root.shape) > 1 else 1

    def _matmul(self, out, x, w):
        """``out f32 [n, n_out] = x f32 [n, n_in] @ w[n_out, n_in]^T``: mul_mat_vec for n < 8, else tiled
        mul_mm; a type whose mat-vec runs on 8-bit activations keeps it for every n, so that a prompt's
        rows get exactly the sums its tokens one at a time get (no float / 8-bit switch)."""
        n_out, n_in = w.shape[0], w.shape[-1]
        n = self._rows(x)
        rb = row_bytes(w.ggml_type, n_in)
        nb = bucket(n, self._row_cap(x))
        if n >= MM_MIN_TOKENS and not self.quantizes_activations(w.ggml_type, n):
            grid = workgroups(((nb + 31) // 32) * ((n_out + 31) // 32))
            self._dispatch(VARIANTS["mul_mm"][w.ggml_type], (w, x, out), grid, (n_in, n_out, n, rb))
        else:
            n_groups = (n_out + MMV_NROWS - 1) // MMV_NROWS
            spec, target = self._mmv_tuned.get(w.ggml_type, (self._mmv_spec, self._mmv_target_wgs))
            gpw = max(1, n_groups // target)
            grid = workgroups(nb * ((n_groups + gpw - 1) // gpw))
            name = self._mmv_variant(w.ggml_type)
            fmt = input_format(name)
            if fmt is not None:  # integer dots on the 8-bit copy of x (q8.py)
                for t in (w, x, out):
                    if t.device is not self:
                        raise DeviceError(f"{name}: tensor {t!r} lives on another device than {self.info.selector}")
                xq = self._q8.input(x, n, n_in, self._row_cap(x), fmt)
                self._dispatch_raw(name, (w.handle, xq, out.handle), grid, (n_in, n_out, n, rb, gpw), spec)
            else:
                self._dispatch(name, (w, x, out), grid, (n_in, n_out, n, rb, gpw), spec)

    def _rmsnorm(self, out, x, w, eps):
        """rmsnorm.comp: one workgroup of 64 per group of g values (a row when g = the row width);
        x, out f32 [n, width], w f32 [g] (see Device.rmsnorm): groups are contiguous rows of g."""
        g = w.shape[0]
        per_row = x.shape[-1] // g
        n = self._rows(x) * per_row
        self._dispatch("rmsnorm", (x, w, out), workgroups(bucket(n, self._row_cap(x) * per_row)),
                       (g, n, f32_bits(eps)))

    def _rope(self, out, x, pos, head_dim, n_rot, freq_base, freq_scale, mode, freq_factors,
              ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig):
        """rope.comp: one invocation per rotated pair or copied pair of dims (see Device.rope)."""
        n = self._rows(x)
        n_heads = x.shape[-1] // head_dim
        nb = bucket(n, self._row_cap(x))
        grid = workgroups((nb * n_heads * (head_dim // 2) + 63) // 64)
        corr0, corr1, mscale = rope_yarn_params(n_rot, freq_base, freq_scale, ext_factor, attn_factor,
                                                beta_fast, beta_slow, n_ctx_orig)
        ff = freq_factors.handle if freq_factors is not None else self._dummy_tensor()
        self._dispatch_raw("rope", (x.handle, pos.handle, out.handle, ff), grid,
                           (n, n_heads, head_dim, n_rot, f32_bits(freq_base), f32_bits(freq_scale), mode,
                            int(freq_factors is not None), f32_bits(ext_factor), f32_bits(mscale),
                            f32_bits(corr0), f32_bits(corr1)))

    def _dummy_tensor(self) -> Any:
        """A 4-value storage tensor bound where a shader's optional input is absent (never read)."""
        if self._dummy_t is None:
            self._dummy_t = self._tensor(np.zeros(4, dtype=np.float32), "storage")
        return self._dummy_t

    def _kv_store(self, cache, x, pos):
        """kv_store.comp: ``cache[pos[i], :] = x[i, :]`` as the cache's type stores it (kv.glsl: one
        invocation per value, pair of values (f16/bf16) or block (q8_0/q4_0)); cache [n_ctx, n_kv_dim],
        x f32 [n, n_kv_dim].

        Positions outside [0, n_ctx) are skipped on the device (the engine raises ContextOverflowError first).
        """
        n = self._rows(x)
        kv_dim = x.shape[-1]
        nb = bucket(n, self._row_cap(x))
        ty = cache.ggml_type
        per = kv_dim if ty is T.F32 else kv_dim // 2 if ty in (T.F16, T.BF16) else kv_dim // 32
        self._dispatch("kv_store", (cache, x, pos), workgroups((nb * per + 63) // 64),
                       (n, kv_dim, cache.shape[0], int(ty)))

    def _attention(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window=0, kv_start=None,
                   flash=True):
        """attention.comp: one workgroup per (row, head), online softmax over chunks of 256 cache rows;
        prompts (n > 1, head_dim <= 128): attention_tiled.comp, 16-query tiles sharing each key tile;
        decode with a cache over 512 rows: split-K, the keys of a (row, head) over several workgroups;
        ``flash`` False, and on a CPU driver (lavapipe) ``flash`` True too: scores, softmax and weighted V
        through a scratch (attention.py for all; ``scores_flash``: faster there, and one arithmetic for
        a row in a prompt and in decode).

        q, out f32 [n, n_head * head_dim]; caches [n_cells, n_head_kv * head_dim] of any type of
        ``VULKAN_KV_TYPES`` (read as stored, kv.glsl; the types are push constants); head_dim <= 256
        (``info.OP_LIMITS``: the public check refuses more); ``window`` > 0: sliding window (the loop
        over cache rows starts at pos - window + 1); ``kv_start`` I32 [n] or None (rows start at 0).
        """
        if not flash or scores_flash(self):  # a CPU driver: the score kernels for flash too (attention.py)
            attention_kq(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, None)
            return
        if attention_tiled(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, None):
            return  # a prompt: query tiles sharing each key tile (attention_tiled.comp)
        if attention_split(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, None):
            return  # decode at a large cache: split-K (attention.py)
        head_dim = q.shape[-1] // n_head
        n = self._rows(q)
        nb = bucket(n, self._row_cap(q))
        start = kv_start if kv_start is not None else pos
        self._dispatch("attention", (q, k_cache, v_cache, pos, start, out), workgroups(nb * n_head),
                       (n, n_head, n_head_kv, head_dim, k_cache.shape[0], f32_bits(scale), window,
                        int(kv_start is not None), int(k_cache.ggml_type), int(v_cache.ggml_type)))

    def _attention_sinks(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks,
                         flash=True):
        """attention.comp with SINKS: :meth:`_attention` plus one logit per head (sinks f32 [n_head]) in
        each softmax denominator (gpt-oss)."""
        if not flash or scores_flash(self):
            attention_kq(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks)
            return
        if attention_tiled(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks):
            return
        if attention_split(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks):
            return
        head_dim = q.shape[-1] // n_head
        n = self._rows(q)
        nb = bucket(n, self._row_cap(q))
        start = kv_start if kv_start is not None else pos
        self._dispatch("attention_sinks", (q, k_cache, v_cache, pos, start, out, sinks), workgroups(nb * n_head),
                       (n, n_head, n_head_kv, head_dim, k_cache.shape[0], f32_bits(scale), window,
                        int(kv_start is not None), int(k_cache.ggml_type), int(v_cache.ggml_type)))

    def _silu_mul(self, out, gate, up):
        """silu_mul.comp: ``out = gate * sigmoid(gate) * up``, f32 [n, n_ff] (``out`` may be ``gate``)."""
        n = math.prod(out.shape)
        self._dispatch("silu_mul", (gate, up, out), self._stride_groups(out), (n,))

    def _gelu_mul(self, out, gate, up):
        """gelu_mul.comp: ``out = gelu_tanh(gate) * up``, f32 [n, n_ff] (``out`` may be ``gate``)."""
        n = math.prod(out.shape)
        self._dispatch("gelu_mul", (gate, up, out), self._stride_groups(out), (n,))

    def _add(self, out, a, b):
        """add.comp: ``out = a + b``, f32 (``out`` may be ``a``)."""
        n = math.prod(out.shape)
        self._dispatch("add", (a, b, out), self._stride_groups(out), (n,))

    def _mul(self, out, a, b):
        """mul.comp: ``out = a * b``, f32 (``out`` may be ``a`` or ``b``)."""
        n = math.prod(out.shape)
        self._dispatch("mul", (a, b, out), self._stride_groups(out), (n,))

    def _ssm_conv(self, out, x, state, w, slots):
        """ssm_conv.comp: one invocation per channel walking the rows in order (``RecurrentOps.ssm_conv``)."""
        n, c = x.shape
        self._dispatch("ssm_conv", (x, state, w, slots, out), self._stride_grid(c, c), (n, c, w.shape[1]))

    def _silu(self, out, x):
        """silu.comp: ``out = x / (1 + exp(-x))``, f32 (``out`` may be ``x``)."""
        n = math.prod(out.shape)
        self._dispatch("silu", (x, out), self._stride_groups(out), (n,))

    def _sigmoid_mul(self, out, a, gate):
        """sigmoid_mul.comp: ``out = a * sigmoid(gate)``, f32 (``out`` may be ``a`` or ``gate``)."""
        n = math.prod(out.shape)
        self._dispatch("sigmoid_mul", (a, gate, out), self._stride_groups(out), (n,))

    def _l2_norm(self, out, x, group, eps):
        """l2_norm.comp: one workgroup of 64 per group of ``group`` values (rmsnorm.comp's shape)."""
        per_row = x.shape[-1] // group
        n = self._rows(x) * per_row
        self._dispatch("l2_norm", (x, out), workgroups(bucket(n, self._row_cap(x) * per_row)),
                       (group, n, f32_bits(eps / group), f32_bits(1.0 / math.sqrt(group))))

    def _gdn_gate(self, g, beta, alpha, b, dt_bias, a):
        """gdn_gate.comp: one invocation per (row, head) value (grid-stride; ``RecurrentOps.gdn_gate``)."""
        n = math.prod(g.shape)
        self._dispatch("gdn_gate", (alpha, b, dt_bias, a, g, beta), self._stride_groups(g), (n, g.shape[1]))

    def _gated_delta_net(self, out, q, k, v, g, beta, state, slots, interleaved):
        """gated_delta_net.comp: one invocation per (value head, column of the state) walking the rows in
        order (``kdiv``: the head mapping; ``RecurrentOps.gated_delta_net``)."""
        n, h_v = g.shape
        d = v.shape[1] // h_v
        h_k = q.shape[1] // d
        grid = workgroups(min(MAX_STRIDE_GROUPS, -(-h_v * d // 64)))
        self._dispatch("gated_delta_net", (q, k, v, g, beta, state, slots, out), grid,
                       (n, h_v, h_k, d, f32_bits(float(np.float32(1.0 / np.sqrt(np.float32(d))))),
                        h_v // h_k if interleaved else 1))

    def _ssm_scan(self, out, xbc, dt, a, d, dt_bias, state, slots):
        """ssm_scan.comp: one invocation per (head, head value) walking the rows in order
        (``RecurrentOps.ssm_scan``)."""
        n, h = dt.shape
        d_inner = out.shape[1]
        ns = state.shape[1] // d_inner
        g = (xbc.shape[1] - d_inner) // (2 * ns)
        grid = workgroups(min(MAX_STRIDE_GROUPS, -(-d_inner // 64)))
        self._dispatch("ssm_scan", (xbc, dt, a, d, dt_bias, state, slots, out), grid, (n, h, d_inner // h, ns, g))

    def _ssm_norm(self, out, y, z, w, eps):
        """ssm_norm.comp: one workgroup of 64 per group of a row (rmsnorm.comp's shape)."""
        n_groups, gw = w.shape
        n = self._rows(y) * n_groups
        self._dispatch("ssm_norm", (y, z, w, out), workgroups(bucket(n, self._row_cap(y) * n_groups)),
                       (gw, n_groups, n, f32_bits(eps)))

    def _scale(self, out, x, s):
        """scale.comp: ``out = x * s``, f32 (``out`` may be ``x``)."""
        n = math.prod(out.shape)
        self._dispatch("scale", (x, out), self._stride_groups(out), (n, f32_bits(float(np.float32(s)))))

    def _add_bias(self, out, x, b):
        """add_bias.comp: ``out[i, :] = x[i, :] + b``; x, out f32 [n, m], b f32 [m] (``out`` may be ``x``)."""
        n = math.prod(out.shape)
        self._dispatch("add_bias", (x, b, out), self._stride_groups(out), (n, b.shape[0]))

    def _copy(self, out, x):
        """copy.comp: ``out = x`` (f32 or i32; the copy kernel of ``bench --ops``)."""
        n = math.prod(out.shape)
        self._dispatch("copy", (x, out), self._stride_groups(out), (n,))

    def _copy_rect(self, dst, dst_row, dst_col, src, src_row, src_col, n_rows, n_cols):
        """copy_rect.comp: a rectangle of 32-bit words between two row-major tensors (:meth:`Device._copy_rect
        <cooktop.backends.base.Device._copy_rect>`)."""
        sw, dw = src.shape[-1], dst.shape[-1]
        self._dispatch("copy_rect", (src, dst), self._stride_grid(n_rows * n_cols, int(dst.root.handle.size())),
                       (n_rows, n_cols, src_row * sw + src_col, sw, dst_row * dw + dst_col, dw))

    # -- mixture of experts (glsl/mul_mat_id.comp, moe_route.comp, add_id.comp, ...) ---------
    def _copy_rows(self, t, src_row, dst_row, n_rows):
        """copy_rect.comp on the rows' 32-bit words, ``t`` bound as source and destination (the ranges are
        disjoint: :meth:`Device.copy_rows <cooktop.backends.base.Device.copy_rows>`); rows of any cache type
        whose bytes are whole words (``row_bytes % 4 == 0``: every head_dim cooktop's kernels take).

        Raises:
            UnsupportedOpError: a row of ``t`` is not a whole number of words.
        """
        rb = row_bytes(t.ggml_type, t.shape[1])
        if rb % 4:
            raise UnsupportedOpError(f"copy_rows: rows of {rb} bytes are not whole 32-bit words on Vulkan")
        w = rb // 4
        self._dispatch("copy_rect", (t, t), self._stride_grid(n_rows * w, int(t.handle.size())),
                       (n_rows, w, src_row * w, w, dst_row * w, w))

    def _moe_route(self, ids, weights, logits, gating, norm, scale, bias=None):
        """moe_route.comp: top-k experts and their weights per row (k <= 32), with the selection bias."""
        n, n_expert = logits.shape
        k = ids.shape[1]
        if k > 32:
            raise UnsupportedOpError(f"moe_route: {self.info.selector} selects at most 32 experts per row, not {k}")
        gate = {"softmax": 0, "softmax_weight": 1, "sigmoid": 2}[gating]
        b = bias.handle if bias is not None else self._dummy_tensor()
        self._dispatch_raw("moe_route", (logits.handle, ids.handle, weights.handle, b), workgroups((n + 31) // 32),
                           (n, n_expert, k, gate, int(norm), f32_bits(scale), int(bias is not None)))

    def _matmul_id(self, out, x, w, ids):
        """mul_mat_id.comp: one output value per invocation, the selected experts' rows only."""
        n, k = ids.shape
        n_exp, n_out, n_in = w.shape
        total = n * k * n_out
        self._dispatch(VARIANTS["mul_mat_id"][w.ggml_type], (w, x, ids, out), workgroups((total + 31) // 32),
                       (n_in, n_out, n * k, k, int(x.shape[1] != n_in), n_exp, row_bytes(w.ggml_type, n_in)))

    def _add_id(self, out, x, b, ids):
        """add_id.comp: per-expert bias (``out`` may be ``x``)."""
        n, k = ids.shape
        n_exp, m = b.shape
        self._dispatch("add_id", (x, b, ids, out), self._stride_groups(out), (n * k * m, k, m, n_exp))

    def _moe_combine(self, out, y, weights):
        """moe_combine.comp: the weighted sum over a row's k slots."""
        n, m = out.shape
        self._dispatch("moe_combine", (y, weights, out), self._stride_groups(out), (n * m, weights.shape[1], m))

    def _swiglu_oai(self, out, gate, up, alpha, limit):
        """swiglu_oai.comp: gpt-oss's clamped SwiGLU (``out`` may be ``gate``)."""
        n = math.prod(out.shape)
        self._dispatch("swiglu_oai", (gate, up, out), self._stride_groups(out), (n, f32_bits(alpha), f32_bits(limit)))

    def _get_rows(self, out, table, ids):
        """get_rows.comp: ``out[i] = dequantize(table[ids[i]])``; table [n_rows, n], ids I32 [k], out f32 [k, n].

        Ids outside [0, n_rows) are clamped on the device (they cannot be checked without a sync).
        """
        n = table.shape[-1]
        k = math.prod(ids.shape)
        n_items = n if table.ggml_type in (T.F32, T.F16) else n // 32  # values or 32-value units
        nb = bucket(k, math.prod(ids.root.shape))
        grid = workgroups(nb * ((n_items + 31) // 32))
        self._dispatch(VARIANTS["get_rows"][table.ggml_type], (table, ids, out), grid,
                       (n, k, row_bytes(table.ggml_type, n), table.shape[0]))
