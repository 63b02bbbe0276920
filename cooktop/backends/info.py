"""What a device is (DeviceInfo, as probed) and what a family's probe found (ProbeResult)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gguf import GGMLQuantizationType as T

from ..format.quants import type_name
from .optable import KV_OPS, OPS, SPECS, TYPED_OPS


@dataclasses.dataclass
class DeviceInfo:
    """What a device is and can do, as probed.

    Memory fields are bytes; ``None`` means the driver did not tell.
    ``device_type`` is one of ``gpu``, ``igpu``, ``cpu``, ``accelerator``.

    What GPU users ask of a device (``cooktop devices --json``): ``integer_dot`` (packed 8-bit
    dot products: Vulkan ``shaderIntegerDotProduct``, OpenCL ``cl_khr_integer_dot_product``),
    ``cooperative_matrix`` (``VK_KHR_cooperative_matrix`` / ``VK_NV_cooperative_matrix``, Intel's
    subgroup matrix extension on OpenCL), ``subgroup_sizes`` (every size the device can run,
    smallest first; ``subgroup_size`` is the default one) and ``subgroup_ops`` (Vulkan
    ``VkSubgroupFeatureFlagBits`` names: basic, vote, arithmetic, ballot, shuffle, ...),
    ``fp16`` / ``bf16`` arithmetic, ``max_buffer_bytes`` (the largest buffer one kernel can bind:
    ``maxStorageBufferRange``, capped by ``maxBufferSize``; OpenCL's max allocation) beside
    ``max_alloc_bytes`` (``maxMemoryAllocationSize`` / ``CL_DEVICE_MAX_MEM_ALLOC_SIZE``),
    ``unified_memory`` (the device shares the host's RAM: iGPUs, CPU drivers) and
    ``usable_mem_bytes`` (what it can really use: the driver's memory budget where it reports
    one, for unified memory every heap it can reach, which on iGPUs is more than the small
    "device-local" carve-out some drivers report), and ``variants``: which of cooktop's kernel
    variants the device gets (op family -> variant or launch shape).
    ``types`` lists GGML type names the backend runs there, ``ops`` the op names
    (:data:`~.optable.OPS` unless the device lacks one), ``op_limits`` the dimensions a device
    caps per op (``{"attention": {"head_dim": 256}}``; names from ``OpSpec.limits``), ``kv_types``
    the KV cache types (GGML type names) its ``kv_store`` and ``attention`` take
    (``cooktop.format.kvtypes.KV_TYPES``; F32 always).
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
    integer_dot: bool = False
    cooperative_matrix: bool = False
    subgroup_sizes: tuple[int, ...] = ()
    subgroup_ops: tuple[str, ...] = ()
    bf16: bool = False
    max_buffer_bytes: int | None = None
    unified_memory: bool | None = None
    usable_mem_bytes: int | None = None
    variants: dict[str, str] = dataclasses.field(default_factory=dict)
    op_limits: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    kv_types: tuple[str, ...] = ("F32",)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def supports(self, op: str, ggml_type: T | None = None) -> bool:
        """True when ``op`` runs on this device with weights (or table) of ``ggml_type``.

        ``ggml_type`` matters for :data:`TYPED_OPS` (the weight's type) and :data:`KV_OPS` (the
        KV cache's type, :attr:`kv_types`); other ops take float32.
        """
        if op not in self.ops:
            return False
        if ggml_type is None:
            return True
        if op in KV_OPS:
            return type_name(ggml_type) in self.kv_types
        return op not in TYPED_OPS or type_name(ggml_type) in self.types

    def supports_op(self, op: str, ggml_type: T | None = None, **dims: int) -> str:
        """Why ``op`` cannot run here (with weights of ``ggml_type`` and the given dimensions,
        e.g. ``head_dim=512``), or ``""`` when it can. Placement asks this before allocating,
        so a unit a device cannot run stays on the host with the reason.

        Raises:
            KeyError: a dimension ``op`` has no limit for (see ``OpSpec.limits``).
        """
        if op not in self.ops:
            return f"{self.selector} cannot run {op}"
        if ggml_type is not None and not self.supports(op, ggml_type):
            if op in KV_OPS:
                return (f"{self.selector} cannot run {op} on a {type_name(ggml_type)} KV cache (it stores "
                        f"{', '.join(self.kv_types)})")
            return f"{self.selector} cannot run {op} on {type_name(ggml_type)}"
        limits = self.op_limits.get(op, {})
        for name, value in dims.items():
            if name not in SPECS[op].limits:
                raise KeyError(f"{op} has no dimension {name!r} (limits: {SPECS[op].limits})")
            if name in limits and value > limits[name]:
                return f"{self.selector} runs {op} with {name} <= {limits[name]}, not {value}"
        return ""

    @property
    def selector(self) -> str:
        """The ``--device`` name of this device, e.g. ``opencl:0``."""
        return self.backend if self.backend == "cpu" else f"{self.backend}:{self.index}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field plus ``selector``."""
        d = dataclasses.asdict(self)
        d["types"] = list(self.types)
        d["ops"] = list(self.ops)
        d["subgroup_sizes"] = list(self.subgroup_sizes)
        d["subgroup_ops"] = list(self.subgroup_ops)
        d["op_limits"] = {k: dict(v) for k, v in self.op_limits.items()}
        d["kv_types"] = list(self.kv_types)
        d["selector"] = self.selector
        return d


@dataclasses.dataclass
class ProbeResult:
    """A backend family's probe: its devices, or why there are none usable.

    ``available`` is H_k AND F_k: the package and runtime load (F_k) and at least
    one device was found (H_k). ``reason`` says why not; ``hint`` how to fix it.
    ``errors`` maps the index of a device that is listed but unusable to why: it failed to open,
    or failed its family's check in the probe child (``Family.check_device``: e.g. no kernel
    builds), or crashed that child. Such a device is never opened in the user's process.
    """

    backend: str
    available: bool
    devices: list[DeviceInfo] = dataclasses.field(default_factory=list)
    reason: str = ""
    hint: str = ""
    errors: dict[int, str] = dataclasses.field(default_factory=dict)
