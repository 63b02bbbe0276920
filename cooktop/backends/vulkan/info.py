"""What the Vulkan driver says about each physical device, read through libvulkan with ctypes.

Kompute's ``kp`` 0.9.0 exposes only a device's name, workgroup limits and
timestamp support (``Manager.get_device_properties()``), and creating a
``kp.Manager`` per probe is slow (it opens a logical device). This module
creates a bare ``VkInstance`` (Vulkan 1.1, no layers, no extensions), lists
the physical devices in the order ``kp.Manager(index)`` uses
(``vkEnumeratePhysicalDevices``), and reads:

- ``VkPhysicalDeviceProperties``: name, vendorID, deviceID, deviceType,
  driverVersion, and from ``VkPhysicalDeviceLimits`` ``maxStorageBufferRange``,
  ``maxPushConstantsSize``, ``maxComputeSharedMemorySize``,
  ``maxComputeWorkGroupInvocations``;
- ``VkPhysicalDeviceMemoryProperties``: the memory heaps (size, device-local flag);
- ``VkPhysicalDeviceSubgroupProperties``: subgroupSize, and whether compute
  shaders have subgroup arithmetic (Vulkan 1.1 core);
- ``VkPhysicalDeviceFeatures.shaderInt16``, ``VkPhysicalDevice16BitStorageFeatures``,
  ``VkPhysicalDevice8BitStorageFeatures``, ``VkPhysicalDeviceShaderFloat16Int8Features``,
  ``VkPhysicalDeviceShaderIntegerDotProductFeatures`` (each extension struct
  read only when the device reports the matching extension; otherwise ``False``).
  cooktop's patched kp enables exactly these where supported
  (:data:`KP_FEATURES`, cooktop/tools/kompute/kp-0.9.0-cooktop.patch);
- ``VkPhysicalDeviceDriverProperties`` (driver name and info, when
  ``VK_KHR_driver_properties`` is present).

Struct layouts are the C structs of the Vulkan headers (vulkan_core.h), in
:mod:`.vkstructs`. When ctypes cannot load libvulkan, :func:`query_devices` raises
:class:`VulkanLoaderError` and the caller falls back to kp's properties: then
memory heaps, maxStorageBufferRange, subgroup size and 8/16-bit storage are
unknown (``None``). When the loader is there but no driver creates an
instance it raises :class:`VulkanNoDriverError`, whose message names the ICD
manifests found (:func:`describe_icds`); the caller must not try kp then.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses

from ... import settings
from ..base import OPS, RECURRENT_OPS, VISION_OPS, DeviceInfo, type_name
from .icd import describe_icds
from .shaders import VULKAN_KV_TYPES, VULKAN_TYPES, pick_variant
from .shaders import variants as shader_variants
from .vkstructs import (  # noqa: F401  (KP_FEATURES and the tables are part of this module's API)
    _FEATURE_SHADER_INT16,
    _MEMORY_DEVICE_LOCAL,
    _MEMORY_HOST_VISIBLE,
    _S_8BIT_STORAGE_FEATURES,
    _S_16BIT_STORAGE_FEATURES,
    _S_APPLICATION_INFO,
    _S_COOPERATIVE_MATRIX_FEATURES_KHR,
    _S_COOPERATIVE_MATRIX_FEATURES_NV,
    _S_DRIVER_PROPERTIES,
    _S_FEATURES_2,
    _S_FLOAT16_INT8_FEATURES,
    _S_INSTANCE_CREATE_INFO,
    _S_INTEGER_DOT_PRODUCT_FEATURES,
    _S_MAINTENANCE_3_PROPERTIES,
    _S_MAINTENANCE_4_PROPERTIES,
    _S_MEMORY_BUDGET_PROPERTIES,
    _S_MEMORY_PROPERTIES_2,
    _S_PROPERTIES_2,
    _S_SUBGROUP_PROPERTIES,
    _S_SUBGROUP_SIZE_CONTROL_PROPERTIES,
    DEVICE_TYPES,
    KP_FEATURES,
    SUBGROUP_OPS,
    VENDORS,
    VK_API_VERSION_1_1,
    VK_MEMORY_HEAP_DEVICE_LOCAL_BIT,
    VK_RESULTS,
    VK_SUCCESS,
    _AppInfo,
    _Chain,
    _DriverProperties,
    _ExtensionProperties,
    _Features2,
    _InstanceInfo,
    _MemoryBudget,
    _MemoryProperties,
    _MemoryProperties2,
    _Properties,
    _Properties2,
    c_i32,
    c_p,
    c_u32,
)


class VulkanInfoError(RuntimeError):
    """libvulkan is missing or refused to create an instance."""


class VulkanLoaderError(VulkanInfoError):
    """The Vulkan loader (libvulkan) cannot be loaded."""


class VulkanNoDriverError(VulkanInfoError):
    """The loader is there but ``vkCreateInstance`` fails: no usable driver (ICD).

    Nothing else may touch Vulkan in this process then: ``kp.Manager()`` aborts
    the whole process (SIGABRT inside C++) in exactly this situation.
    """


@dataclasses.dataclass
class VkDeviceFacts:
    """One physical device as libvulkan reports it (sizes in bytes)."""

    index: int
    name: str
    vendor_id: int
    device_id: int
    device_type: str
    api_version: str
    driver_version: int
    driver_name: str = ""
    driver_info: str = ""
    heaps: list[tuple[int, bool]] = dataclasses.field(default_factory=list)  # (size, device_local)
    max_storage_buffer_range: int = 0
    max_push_constants_size: int = 0
    max_shared_memory: int = 0
    max_workgroup_invocations: int = 0
    subgroup_size: int | None = None
    subgroup_arithmetic: bool = False  # subgroupAdd & co. in compute shaders (mul_mat_vec needs it)
    storage_buffer_8bit: bool = False
    storage_buffer_16bit: bool = False
    shader_float16: bool = False
    shader_int8: bool = False
    shader_int16: bool = False
    integer_dot_product: bool = False
    extensions: tuple[str, ...] = ()
    subgroup_ops: tuple[str, ...] = ()
    min_subgroup_size: int | None = None
    max_subgroup_size: int | None = None
    max_allocation: int = 0  # VkPhysicalDeviceMaintenance3Properties.maxMemoryAllocationSize (0: unknown)
    max_buffer_size: int = 0  # VkPhysicalDeviceMaintenance4Properties.maxBufferSize (0: unknown)
    cooperative_matrix: bool = False
    host_visible_local: bool = False  # a memory type both device-local and host-visible (UMA or ReBAR)
    heap_budgets: list[int] = dataclasses.field(default_factory=list)  # VK_EXT_memory_budget, per heap

    @property
    def unified_memory(self) -> bool:
        """The device shares the host's RAM: an integrated GPU or a CPU driver (Vulkan's
        deviceType; a discrete GPU with resizable BAR also has host-visible device memory)."""
        return self.device_type in ("igpu", "cpu")

    @property
    def usable_bytes(self) -> int:
        """What the device can really use: the driver's budget (VK_EXT_memory_budget) of the heaps
        it would allocate from, else those heaps' sizes; with unified memory every heap counts (an
        iGPU's "device-local" heap can be a small carve-out beside the shared system heap)."""
        sizes = self.heap_budgets or [h for h, _ in self.heaps]
        local = [b for b, (_, dl) in zip(sizes, self.heaps) if dl]
        return sum(sizes) if self.unified_memory or not local else sum(local)

    @property
    def subgroup_sizes(self) -> tuple[int, ...]:
        """Every subgroup size the device can run (powers of two from min to max), or the one it reports."""
        lo, hi = self.min_subgroup_size, self.max_subgroup_size
        if lo and hi and lo <= hi:
            return tuple(1 << k for k in range(lo.bit_length() - 1, hi.bit_length()))
        return (self.subgroup_size,) if self.subgroup_size else ()

    @property
    def vendor(self) -> str:
        """Vendor name from the PCI id (or ``0x....`` when unknown)."""
        return VENDORS.get(self.vendor_id, f"0x{self.vendor_id:04x}")

    @property
    def features(self) -> tuple[str, ...]:
        """The :data:`KP_FEATURES` this device supports (so the ones patched kp enables)."""
        have = {"shaderInt16": self.shader_int16, "storageBuffer16BitAccess": self.storage_buffer_16bit,
                "storageBuffer8BitAccess": self.storage_buffer_8bit, "shaderFloat16": self.shader_float16,
                "shaderInt8": self.shader_int8, "shaderIntegerDotProduct": self.integer_dot_product}
        return tuple(f for f in KP_FEATURES if have[f])

    @property
    def memory_bytes(self) -> int:
        """Device memory: the sum of device-local heaps (all heaps when none is device-local)."""
        local = [s for s, dl in self.heaps if dl]
        return sum(local) if local else sum(s for s, _ in self.heaps)


def _load() -> ctypes.CDLL:
    names = ["libvulkan.so.1", ctypes.util.find_library("vulkan") or "libvulkan.so", "vulkan-1.dll",
             "libvulkan.dylib", "libMoltenVK.dylib"]
    errors = []
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            errors.append(str(e))
    raise VulkanLoaderError("cannot load the Vulkan loader libvulkan (" + "; ".join(errors[:2]) + ")")


class _LayerProperties(ctypes.Structure):
    _fields_ = [("layerName", ctypes.c_char * 256), ("specVersion", c_u32), ("implementationVersion", c_u32),
                ("description", ctypes.c_char * 256)]


def instance_layers() -> list[str]:
    """Names of the instance layers the Vulkan loader finds (vkEnumerateInstanceLayerProperties),
    e.g. ``VK_LAYER_KHRONOS_validation`` when Debian's vulkan-validationlayers is installed.

    Raises:
        VulkanInfoError: libvulkan missing or the enumeration failed.
    """
    vk = _load()
    vk.vkEnumerateInstanceLayerProperties.argtypes = [ctypes.POINTER(c_u32), c_p]
    vk.vkEnumerateInstanceLayerProperties.restype = c_i32
    n = c_u32(0)
    rc = vk.vkEnumerateInstanceLayerProperties(ctypes.byref(n), None)
    if rc != VK_SUCCESS:
        raise VulkanInfoError(f"vkEnumerateInstanceLayerProperties failed (VkResult {rc})")
    arr = (_LayerProperties * n.value)()
    if n.value:
        vk.vkEnumerateInstanceLayerProperties(ctypes.byref(n), arr)
    return [arr[i].layerName.decode(errors="replace") for i in range(n.value)]


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def query_devices() -> list[VkDeviceFacts]:
    """List every Vulkan physical device with the facts of the module docstring.

    Returns:
        devices in ``vkEnumeratePhysicalDevices`` order (the index kp.Manager takes).
    Raises:
        VulkanLoaderError: libvulkan missing. VulkanNoDriverError: no driver creates an
            instance. VulkanInfoError: enumeration failed.
    """
    vk = _load()
    vk.vkCreateInstance.argtypes = [ctypes.POINTER(_InstanceInfo), c_p, ctypes.POINTER(c_p)]
    vk.vkCreateInstance.restype = c_i32
    vk.vkDestroyInstance.argtypes = [c_p, c_p]
    vk.vkEnumeratePhysicalDevices.argtypes = [c_p, ctypes.POINTER(c_u32), ctypes.POINTER(c_p)]
    vk.vkEnumeratePhysicalDevices.restype = c_i32
    vk.vkGetPhysicalDeviceProperties.argtypes = [c_p, ctypes.POINTER(_Properties)]
    vk.vkGetPhysicalDeviceMemoryProperties.argtypes = [c_p, ctypes.POINTER(_MemoryProperties)]
    vk.vkGetPhysicalDeviceProperties2.argtypes = [c_p, ctypes.POINTER(_Properties2)]
    vk.vkGetPhysicalDeviceFeatures2.argtypes = [c_p, ctypes.POINTER(_Features2)]
    vk.vkGetPhysicalDeviceMemoryProperties2.argtypes = [c_p, ctypes.POINTER(_MemoryProperties2)]
    vk.vkEnumerateDeviceExtensionProperties.argtypes = [c_p, c_p, ctypes.POINTER(c_u32), c_p]
    vk.vkEnumerateDeviceExtensionProperties.restype = c_i32

    app = _AppInfo(_S_APPLICATION_INFO, None, b"cooktop", 1, b"cooktop", 1, VK_API_VERSION_1_1)
    ci = _InstanceInfo(_S_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    inst = c_p()
    rc = vk.vkCreateInstance(ctypes.byref(ci), None, ctypes.byref(inst))
    if rc != VK_SUCCESS:
        raise VulkanNoDriverError(f"vkCreateInstance failed ({VK_RESULTS.get(rc, f'VkResult {rc}')}): no usable "
                                  f"Vulkan driver; {describe_icds()}")
    try:
        n = c_u32(0)
        rc = vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), None)
        if rc != VK_SUCCESS:
            raise VulkanInfoError(f"vkEnumeratePhysicalDevices failed (VkResult {rc})")
        handles = (c_p * n.value)()
        if n.value:
            vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), handles)
        return [_facts(vk, i, handles[i]) for i in range(n.value)]
    finally:
        vk.vkDestroyInstance(inst, None)


def _facts(vk: ctypes.CDLL, index: int, pd: int | None) -> VkDeviceFacts:  # pd: VkPhysicalDevice (c_void_p value)
    props = _Properties()
    vk.vkGetPhysicalDeviceProperties(pd, ctypes.byref(props))
    mem = _MemoryProperties()
    vk.vkGetPhysicalDeviceMemoryProperties(pd, ctypes.byref(mem))
    lim = props.limits

    n_ext = c_u32(0)
    vk.vkEnumerateDeviceExtensionProperties(pd, None, ctypes.byref(n_ext), None)
    exts_arr = (_ExtensionProperties * n_ext.value)()
    vk.vkEnumerateDeviceExtensionProperties(pd, None, ctypes.byref(n_ext), exts_arr)
    exts = tuple(e.extensionName.decode(errors="replace") for e in exts_arr)

    facts = VkDeviceFacts(
        index=index, name=props.deviceName.decode(errors="replace"), vendor_id=props.vendorID,
        device_id=props.deviceID, device_type=DEVICE_TYPES.get(props.deviceType, "accelerator"),
        api_version=_version(props.apiVersion), driver_version=props.driverVersion,
        heaps=[(mem.memoryHeaps[i].size, bool(mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT))
               for i in range(mem.memoryHeapCount)],
        max_storage_buffer_range=lim.maxStorageBufferRange, max_push_constants_size=lim.maxPushConstantsSize,
        max_shared_memory=lim.maxComputeSharedMemorySize,
        max_workgroup_invocations=lim.maxComputeWorkGroupInvocations, extensions=exts)

    if props.apiVersion < VK_API_VERSION_1_1:
        return facts  # Properties2/Features2 are core only from 1.1
    # properties2: subgroup size (+ driver name)
    sub = _Chain(_S_SUBGROUP_PROPERTIES, None)
    drv = _DriverProperties(_S_DRIVER_PROPERTIES, None)
    m3 = _Chain(_S_MAINTENANCE_3_PROPERTIES, None)  # core in 1.1
    m4 = _Chain(_S_MAINTENANCE_4_PROPERTIES, None)
    ssc = _Chain(_S_SUBGROUP_SIZE_CONTROL_PROPERTIES, None)
    props_chain = [sub, m3]
    # (promoted to 1.3, but the instance is 1.1: read only where the device lists the extension)
    if "VK_KHR_maintenance4" in exts:
        props_chain.append(m4)
    if "VK_EXT_subgroup_size_control" in exts:
        props_chain.append(ssc)
    if "VK_KHR_driver_properties" in exts:
        props_chain.append(drv)  # type: ignore[arg-type]
    for a, b in zip(props_chain, props_chain[1:]):
        a.pNext = ctypes.cast(ctypes.pointer(b), c_p)
    p2 = _Properties2(_S_PROPERTIES_2, ctypes.cast(ctypes.pointer(sub), c_p))
    vk.vkGetPhysicalDeviceProperties2(pd, ctypes.byref(p2))
    facts.subgroup_size = int(sub.v[0]) or None
    facts.subgroup_ops = tuple(n for i, n in enumerate(SUBGROUP_OPS) if sub.v[2] & (1 << i))
    facts.max_allocation = int(m3.v[2]) | (int(m3.v[3]) << 32)  # after maxPerSetDescriptors + padding
    facts.max_buffer_size = int(m4.v[0]) | (int(m4.v[1]) << 32)
    facts.min_subgroup_size, facts.max_subgroup_size = (int(ssc.v[0]) or None), (int(ssc.v[1]) or None)
    facts.host_visible_local = any(
        (mem.memoryTypes[i].propertyFlags & (_MEMORY_DEVICE_LOCAL | _MEMORY_HOST_VISIBLE))
        == (_MEMORY_DEVICE_LOCAL | _MEMORY_HOST_VISIBLE) for i in range(mem.memoryTypeCount))
    if "VK_EXT_memory_budget" in exts:
        budget = _MemoryBudget(_S_MEMORY_BUDGET_PROPERTIES, None)
        mp2 = _MemoryProperties2(_S_MEMORY_PROPERTIES_2, ctypes.cast(ctypes.pointer(budget), c_p))
        vk.vkGetPhysicalDeviceMemoryProperties2(pd, ctypes.byref(mp2))
        facts.heap_budgets = [int(budget.heapBudget[i]) for i in range(mem.memoryHeapCount)]
        if not any(facts.heap_budgets):
            facts.heap_budgets = []
    # supportedStages has VK_SHADER_STAGE_COMPUTE_BIT (0x20), supportedOperations ARITHMETIC (0x4)
    facts.subgroup_arithmetic = bool(sub.v[1] & 0x20) and bool(sub.v[2] & 0x4)
    if "VK_KHR_driver_properties" in exts:
        facts.driver_name = drv.driverName.decode(errors="replace")
        facts.driver_info = drv.driverInfo.decode(errors="replace")

    # features2: 16-bit storage (core 1.1), 8-bit storage and float16/int8 (extensions)
    s16 = _Chain(_S_16BIT_STORAGE_FEATURES, None)
    s8 = _Chain(_S_8BIT_STORAGE_FEATURES, None)
    f16i8 = _Chain(_S_FLOAT16_INT8_FEATURES, None)
    idot = _Chain(_S_INTEGER_DOT_PRODUCT_FEATURES, None)
    coop = _Chain(_S_COOPERATIVE_MATRIX_FEATURES_KHR if "VK_KHR_cooperative_matrix" in exts
                  else _S_COOPERATIVE_MATRIX_FEATURES_NV, None)
    chain = [s16]
    if "VK_KHR_8bit_storage" in exts:
        chain.append(s8)
    if "VK_KHR_shader_float16_int8" in exts:
        chain.append(f16i8)
    if "VK_KHR_shader_integer_dot_product" in exts:
        chain.append(idot)
    if "VK_KHR_cooperative_matrix" in exts or "VK_NV_cooperative_matrix" in exts:
        chain.append(coop)
    for a, b in zip(chain, chain[1:]):
        a.pNext = ctypes.cast(ctypes.pointer(b), c_p)
    f2 = _Features2(_S_FEATURES_2, ctypes.cast(ctypes.pointer(chain[0]), c_p))
    vk.vkGetPhysicalDeviceFeatures2(pd, ctypes.byref(f2))
    facts.storage_buffer_16bit = bool(s16.v[0])
    facts.storage_buffer_8bit = bool(s8.v[0])
    facts.shader_float16 = bool(f16i8.v[0])
    facts.shader_int8 = bool(f16i8.v[1])
    facts.shader_int16 = bool(f2.features[_FEATURE_SHADER_INT16])
    facts.integer_dot_product = bool(idot.v[0])
    facts.cooperative_matrix = bool(coop.v[0])
    return facts


#: What the shaders cap per op (``DeviceInfo.op_limits``): attention.comp keeps one query head
#: (<= 256 values) in shared memory per workgroup (attention_full runs it too: vision.py).
OP_LIMITS: dict[str, dict[str, int]] = {"attention": {"head_dim": 256}, "attention_sinks": {"head_dim": 256},
                                        "attention_full": {"head_dim": 256}}


#: The mixture-of-experts ops with shaders here.
VULKAN_MOE_OPS = ("moe_route", "matmul_id", "add_id", "moe_combine", "swiglu_oai", "attention_sinks")

def facts_to_info(f: VkDeviceFacts) -> DeviceInfo:
    """DeviceInfo of one Vulkan device. ``compute_units`` is unknown (Vulkan does not report it).

    Without subgroup arithmetic in compute shaders, ``matmul`` is left out of ``ops``
    (mul_mat_vec reduces with subgroupAdd), so placement keeps layers off the device.
    ``max_alloc_bytes`` is the largest buffer the shaders can use: the smallest of
    maxStorageBufferRange (one binding), maxMemoryAllocationSize, maxBufferSize and the usable memory.
    ``variants``: for each shader with feature-dependent stand-ins, the one this device runs
    (:func:`.shaders.pick_variant` over the features kp enables here; the K-quants' block_q8_K
    variants with ``COOKTOP_VULKAN_Q8K=1``).
    """
    mem = f.memory_bytes or None
    ops = ((OPS if f.subgroup_arithmetic else tuple(o for o in OPS if o != "matmul")) + VULKAN_MOE_OPS + RECURRENT_OPS
           + VISION_OPS)
    caps = [x for x in (f.max_storage_buffer_range, f.max_allocation, f.max_buffer_size, f.usable_bytes) if x]
    binding = min(x for x in (f.max_storage_buffer_range, f.max_buffer_size) if x) if (
        f.max_storage_buffer_range or f.max_buffer_size) else None
    feats = frozenset(f.features)
    prefer = "q8_K" if settings.vulkan_q8k() else "q8_1"  # the device's choice (VulkanDevice._mmv_variant)
    variants = {name: pick_variant(name, feats, prefer) for name in sorted({v["variant_of"] for v in shader_variants()
                                                                    if v.get("variant_of")})}
    return DeviceInfo(
        backend="vulkan", index=f.index, name=f.name, vendor=f.vendor, device_type=f.device_type,
        platform=f"Vulkan {f.api_version}",
        driver_version=(f"{f.driver_name} {f.driver_info}".strip() or str(f.driver_version)),
        global_mem_bytes=mem, max_alloc_bytes=min(caps) if caps else None,
        compute_units=None, max_workgroup_size=f.max_workgroup_invocations or None, subgroup_size=f.subgroup_size,
        fp16=f.shader_float16, int8=f.shader_int8,
        types=tuple(type_name(t) for t in VULKAN_TYPES), ops=ops, op_limits=OP_LIMITS,
        kv_types=tuple(type_name(t) for t in VULKAN_KV_TYPES),
        integer_dot=f.integer_dot_product, cooperative_matrix=f.cooperative_matrix,
        subgroup_sizes=f.subgroup_sizes, subgroup_ops=f.subgroup_ops,
        bf16="VK_KHR_shader_bfloat16" in f.extensions, max_buffer_bytes=binding,
        unified_memory=f.unified_memory, usable_mem_bytes=f.usable_bytes or None, variants=variants,
        extra={"subgroup_arithmetic": f.subgroup_arithmetic, "vendor_id": f.vendor_id, "device_id": f.device_id,
               "memory_heaps": [list(h) for h in f.heaps], "heap_budgets": list(f.heap_budgets),
               "max_storage_buffer_range": f.max_storage_buffer_range,
               "max_memory_allocation_size": f.max_allocation or None, "max_buffer_size": f.max_buffer_size or None,
               "max_push_constants_size": f.max_push_constants_size,
               "max_compute_shared_memory": f.max_shared_memory,
               "storage_buffer_8bit": f.storage_buffer_8bit, "storage_buffer_16bit": f.storage_buffer_16bit,
               "integer_dot_product": f.integer_dot_product, "features": list(f.features),
               "host_visible_device_memory": f.host_visible_local, "info_source": "libvulkan"})


def kp_props_to_info(index: int, props: dict) -> DeviceInfo:
    """DeviceInfo from kp's ``get_device_properties()`` alone (libvulkan unreadable through ctypes):
    device type, memory, maxStorageBufferRange, subgroup size and 8/16-bit storage are unknown."""
    return DeviceInfo(
        backend="vulkan", index=index, name=str(props.get("device_name", f"vulkan device {index}")),
        device_type="gpu", max_workgroup_size=props.get("max_work_group_invocations"),
        types=tuple(type_name(t) for t in VULKAN_TYPES), ops=OPS + VULKAN_MOE_OPS + RECURRENT_OPS + VISION_OPS,
        op_limits=OP_LIMITS,
        kv_types=tuple(type_name(t) for t in VULKAN_KV_TYPES), extra={"info_source": "kp"})
