"""Vulkan's C API as ctypes sees it, for :mod:`.info`: the structure-type ids, enums and
struct layouts of vulkan_core.h that the device query reads (``VkPhysicalDeviceLimits`` up to
``maxComputeWorkGroupInvocations`` spelled out field by field so that the offsets follow from C
layout rules; each extension struct with its ``sType``/``pNext`` chain header).
"""

from __future__ import annotations

import ctypes

c_u32 = ctypes.c_uint32
c_i32 = ctypes.c_int32
c_u64 = ctypes.c_uint64
c_f32 = ctypes.c_float
c_size = ctypes.c_size_t
c_p = ctypes.c_void_p

VK_SUCCESS = 0
VK_API_VERSION_1_1 = (1 << 22) | (1 << 12)
VK_MEMORY_HEAP_DEVICE_LOCAL_BIT = 1
_S_APPLICATION_INFO = 0
_S_INSTANCE_CREATE_INFO = 1
_S_FEATURES_2 = 1000059000
_S_PROPERTIES_2 = 1000059001
_S_SUBGROUP_PROPERTIES = 1000094000
_S_16BIT_STORAGE_FEATURES = 1000083000
_S_8BIT_STORAGE_FEATURES = 1000177000
_S_FLOAT16_INT8_FEATURES = 1000082000
_S_INTEGER_DOT_PRODUCT_FEATURES = 1000280000
#: Index of shaderInt16 among the VkBool32 members of VkPhysicalDeviceFeatures.
_FEATURE_SHADER_INT16 = 41

#: Optional device features cooktop's patched kp enables when the device supports them
#: (Vulkan feature member names; kp.Manager.enabled_features() reports the ones it did).
KP_FEATURES = ("shaderInt16", "storageBuffer16BitAccess", "storageBuffer8BitAccess", "shaderFloat16",
               "shaderInt8", "shaderIntegerDotProduct")
_S_DRIVER_PROPERTIES = 1000196000
_S_MAINTENANCE_3_PROPERTIES = 1000168000
_S_MAINTENANCE_4_PROPERTIES = 1000413001
_S_SUBGROUP_SIZE_CONTROL_PROPERTIES = 1000225000
_S_COOPERATIVE_MATRIX_FEATURES_KHR = 1000506000
_S_COOPERATIVE_MATRIX_FEATURES_NV = 1000249000
_S_MEMORY_PROPERTIES_2 = 1000059006
_S_MEMORY_BUDGET_PROPERTIES = 1000237000
#: VkSubgroupFeatureFlagBits, bit order (vulkan_core.h).
SUBGROUP_OPS = ("basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad")
#: VkMemoryPropertyFlagBits.
_MEMORY_DEVICE_LOCAL, _MEMORY_HOST_VISIBLE = 0x1, 0x2

#: VkPhysicalDeviceType -> cooktop DeviceInfo.device_type
DEVICE_TYPES = {0: "accelerator", 1: "igpu", 2: "gpu", 3: "accelerator", 4: "cpu"}

#: PCI vendor ids (and Khronos ids for software drivers: 0x10005 is Mesa).
VENDORS = {0x1002: "AMD", 0x1010: "ImgTec", 0x10DE: "NVIDIA", 0x13B5: "ARM", 0x5143: "Qualcomm",
           0x8086: "Intel", 0x106B: "Apple", 0x10005: "Mesa"}


#: VkResult codes vkCreateInstance can return (vulkan_core.h).
VK_RESULTS = {-1: "VK_ERROR_OUT_OF_HOST_MEMORY", -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
              -3: "VK_ERROR_INITIALIZATION_FAILED", -6: "VK_ERROR_LAYER_NOT_PRESENT",
              -7: "VK_ERROR_EXTENSION_NOT_PRESENT", -9: "VK_ERROR_INCOMPATIBLE_DRIVER"}

class _Limits(ctypes.Structure):
    """VkPhysicalDeviceLimits up to maxComputeWorkGroupInvocations (vulkan_core.h order)."""

    _fields_ = [
        ("maxImageDimension1D", c_u32), ("maxImageDimension2D", c_u32), ("maxImageDimension3D", c_u32),
        ("maxImageDimensionCube", c_u32), ("maxImageArrayLayers", c_u32), ("maxTexelBufferElements", c_u32),
        ("maxUniformBufferRange", c_u32), ("maxStorageBufferRange", c_u32), ("maxPushConstantsSize", c_u32),
        ("maxMemoryAllocationCount", c_u32), ("maxSamplerAllocationCount", c_u32),
        ("bufferImageGranularity", c_u64), ("sparseAddressSpaceSize", c_u64),
        ("maxBoundDescriptorSets", c_u32), ("maxPerStageDescriptorSamplers", c_u32),
        ("maxPerStageDescriptorUniformBuffers", c_u32), ("maxPerStageDescriptorStorageBuffers", c_u32),
        ("maxPerStageDescriptorSampledImages", c_u32), ("maxPerStageDescriptorStorageImages", c_u32),
        ("maxPerStageDescriptorInputAttachments", c_u32), ("maxPerStageResources", c_u32),
        ("maxDescriptorSetSamplers", c_u32), ("maxDescriptorSetUniformBuffers", c_u32),
        ("maxDescriptorSetUniformBuffersDynamic", c_u32), ("maxDescriptorSetStorageBuffers", c_u32),
        ("maxDescriptorSetStorageBuffersDynamic", c_u32), ("maxDescriptorSetSampledImages", c_u32),
        ("maxDescriptorSetStorageImages", c_u32), ("maxDescriptorSetInputAttachments", c_u32),
        ("maxVertexInputAttributes", c_u32), ("maxVertexInputBindings", c_u32),
        ("maxVertexInputAttributeOffset", c_u32), ("maxVertexInputBindingStride", c_u32),
        ("maxVertexOutputComponents", c_u32), ("maxTessellationGenerationLevel", c_u32),
        ("maxTessellationPatchSize", c_u32), ("maxTessellationControlPerVertexInputComponents", c_u32),
        ("maxTessellationControlPerVertexOutputComponents", c_u32),
        ("maxTessellationControlPerPatchOutputComponents", c_u32),
        ("maxTessellationControlTotalOutputComponents", c_u32),
        ("maxTessellationEvaluationInputComponents", c_u32), ("maxTessellationEvaluationOutputComponents", c_u32),
        ("maxGeometryShaderInvocations", c_u32), ("maxGeometryInputComponents", c_u32),
        ("maxGeometryOutputComponents", c_u32), ("maxGeometryOutputVertices", c_u32),
        ("maxGeometryTotalOutputComponents", c_u32), ("maxFragmentInputComponents", c_u32),
        ("maxFragmentOutputAttachments", c_u32), ("maxFragmentDualSrcAttachments", c_u32),
        ("maxFragmentCombinedOutputResources", c_u32), ("maxComputeSharedMemorySize", c_u32),
        ("maxComputeWorkGroupCount", c_u32 * 3), ("maxComputeWorkGroupInvocations", c_u32),
    ]


class _Properties(ctypes.Structure):
    """VkPhysicalDeviceProperties with the limits struct cut after the fields we read,
    followed by enough padding for the rest (the whole C struct is 824 bytes)."""

    _fields_ = [("apiVersion", c_u32), ("driverVersion", c_u32), ("vendorID", c_u32), ("deviceID", c_u32),
                ("deviceType", c_i32), ("deviceName", ctypes.c_char * 256), ("pipelineCacheUUID", ctypes.c_ubyte * 16),
                ("limits", _Limits), ("_rest", ctypes.c_ubyte * 1024)]


class _MemoryType(ctypes.Structure):
    _fields_ = [("propertyFlags", c_u32), ("heapIndex", c_u32)]


class _MemoryHeap(ctypes.Structure):
    _fields_ = [("size", c_u64), ("flags", c_u32)]


class _MemoryProperties(ctypes.Structure):
    """VkPhysicalDeviceMemoryProperties."""

    _fields_ = [("memoryTypeCount", c_u32), ("memoryTypes", _MemoryType * 32),
                ("memoryHeapCount", c_u32), ("memoryHeaps", _MemoryHeap * 16)]


class _Chain(ctypes.Structure):
    """Header of every extensible struct (sType, pNext) followed by up to 8 uint32 members."""

    _fields_ = [("sType", c_i32), ("pNext", c_p), ("v", c_u32 * 8)]


class _DriverProperties(ctypes.Structure):
    _fields_ = [("sType", c_i32), ("pNext", c_p), ("driverID", c_u32), ("driverName", ctypes.c_char * 256),
                ("driverInfo", ctypes.c_char * 256), ("conformanceVersion", ctypes.c_ubyte * 4)]


class _MemoryBudget(ctypes.Structure):
    """VkPhysicalDeviceMemoryBudgetPropertiesEXT (VK_EXT_memory_budget)."""

    _fields_ = [("sType", c_i32), ("pNext", c_p), ("heapBudget", c_u64 * 16), ("heapUsage", c_u64 * 16)]


class _MemoryProperties2(ctypes.Structure):
    _fields_ = [("sType", c_i32), ("pNext", c_p), ("memoryProperties", _MemoryProperties)]


class _Properties2(ctypes.Structure):
    _fields_ = [("sType", c_i32), ("pNext", c_p), ("properties", _Properties)]


class _Features2(ctypes.Structure):
    """VkPhysicalDeviceFeatures2: the 55 VkBool32 of VkPhysicalDeviceFeatures follow pNext."""

    _fields_ = [("sType", c_i32), ("pNext", c_p), ("features", c_u32 * 55)]


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", c_i32), ("pNext", c_p), ("pApplicationName", ctypes.c_char_p), ("applicationVersion", c_u32),
                ("pEngineName", ctypes.c_char_p), ("engineVersion", c_u32), ("apiVersion", c_u32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", c_i32), ("pNext", c_p), ("flags", c_u32), ("pApplicationInfo", ctypes.POINTER(_AppInfo)),
                ("enabledLayerCount", c_u32), ("ppEnabledLayerNames", c_p),
                ("enabledExtensionCount", c_u32), ("ppEnabledExtensionNames", c_p)]


class _ExtensionProperties(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", c_u32)]
