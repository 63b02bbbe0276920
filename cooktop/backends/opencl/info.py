"""What an OpenCL device is, from pyopencl's queries and the ICD files (no kernel is built):
its :class:`~..info.DeviceInfo` (memory, limits, sub-groups, extensions, the kernel variants it
gets), the driver files a probe verdict depends on, and how to say which drivers are installed.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from typing import Any

from ... import settings
from ..base import OPS, RECURRENT_OPS, VISION_OPS, DeviceInfo, type_name
from .programs import CPU_SHAPE, GPU_SHAPE, OPENCL_KV_TYPES, OPENCL_TYPES, host_has_vnni

#: The mixture-of-experts ops with kernels here (``backends.optable.MOE_OPS``: claimed by name).
OPENCL_MOE_OPS = ("moe_route", "matmul_id", "add_id", "moe_combine", "swiglu_oai", "attention_sinks")

#: OpenCL extension constants pyopencl may not name.
CL_DEVICE_SUB_GROUP_SIZES_INTEL = 0x4108

_INT8_EXTENSIONS = ("cl_khr_integer_dot_product", "cl_arm_integer_dot_product_int8",
                    "cl_intel_subgroup_matrix_multiply_accumulate")


def _safe(fn, default=None):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - drivers answer some queries with errors
        return default


def _device_type(cl: Any, dev: Any) -> str:
    t = int(dev.type)
    if t & cl.device_type.GPU:
        return "igpu" if _safe(lambda: bool(dev.host_unified_memory), False) else "gpu"
    if t & cl.device_type.CPU:
        return "cpu"
    if t & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "accelerator"


def _subgroup_size(cl: Any, dev: Any, extensions: str) -> tuple[int | None, str]:
    """Sub-group (warp/wavefront/SIMD) width and where it came from."""
    if "cl_intel_required_subgroup_size" in extensions:
        sizes = _safe(lambda: dev.get_info(CL_DEVICE_SUB_GROUP_SIZES_INTEL))
        if sizes:
            return int(max(sizes)), "CL_DEVICE_SUB_GROUP_SIZES_INTEL"
    if "cl_nv_device_attribute_query" in extensions:
        w = _safe(lambda: dev.get_info(cl.device_info.WARP_SIZE_NV))
        if w:
            return int(w), "CL_DEVICE_WARP_SIZE_NV"
    if "cl_amd_device_attribute_query" in extensions:
        w = _safe(lambda: dev.get_info(cl.device_info.WAVEFRONT_WIDTH_AMD))
        if w:
            return int(w), "CL_DEVICE_WAVEFRONT_WIDTH_AMD"
    w = _safe(lambda: dev.get_info(cl.device_info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE))
    if w:
        return int(w), "CL_DEVICE_PREFERRED_WORK_GROUP_SIZE_MULTIPLE (estimate)"
    return None, "unknown (replaced by the kernel's preferred work-group multiple when opened)"


def driver_label(platform_name: str, platform_version: str) -> str:
    """Which driver a platform is, for ``cooktop devices``: ``PoCL 3.0-rc2 (pip)`` for the PoCL that
    pyopencl's wheel loads with PyPI's ``pocl-binary-distribution`` (the ``opencl`` extra), ``PoCL
    3.1+debian (system)`` for a PoCL installed by the OS, else the platform name and version."""
    m = re.search(r"PoCL (\S+)", platform_version)
    if "Portable Computing Language" not in platform_name or m is None:
        return f"{platform_name} ({platform_version})".strip()
    try:
        from importlib.metadata import PackageNotFoundError, version
        pip_version = version("pocl-binary-distribution")
    except (ImportError, PackageNotFoundError):
        pip_version = None
    pip = pip_version is not None and m.group(1).split("+")[0].startswith(pip_version)
    return f"PoCL {m.group(1)} ({'pip' if pip else 'system'})"


def launch_shape(info: DeviceInfo) -> tuple[str, Any]:
    """``("cpu" | "gpu", LaunchShape)``: CPU devices run one output row per work-item
    (:data:`.programs.CPU_SHAPE`), GPUs work-groups sharing rows (``GPU_SHAPE``), unless the
    device allows fewer than 64 work-items per group."""
    if info.device_type == "cpu" or (info.max_workgroup_size is not None and info.max_workgroup_size < 64):
        return "cpu", CPU_SHAPE
    return "gpu", GPU_SHAPE


def kernel_variants(info: DeviceInfo) -> dict[str, str]:
    """Which of cooktop's OpenCL kernel variants ``info``'s device gets (``DeviceInfo.variants``):
    the launch shape, the matmul activations (8-bit blocks with integer dots, or float32:
    ``COOKTOP_OPENCL_Q8``) and the prompt matmul (AVX-512 VNNI on this machine's CPU, or mul_mm)."""
    shape, _ = launch_shape(info)
    q8 = _safe(settings.opencl_q8, True)
    vnni = (info.device_type == "cpu" and host_has_vnni() and _safe(settings.opencl_vnni, True)
            and "COOKTOP_PORTABLE" not in os.environ.get("COOKTOP_OPENCL_OPTIONS", ""))
    acts = "q8_1 (8-bit activations, integer block dots in OpenCL C)" if q8 else "f32"
    return {"launch_shape": shape, "matmul_activations": acts,
            "prompt_matmul": ("mul_mm_q8 (AVX-512 VNNI: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) + " if vnni and q8 else
                              "mul_mm_q8 (unpack-once K-quants on block_q8_K) + " if q8 and shape == "cpu" else "")
            + ("mul_mvt_q8 (the one-token sums)" if q8 and _safe(settings.opencl_exact_prompt, True) else "mul_mm")}


def _subgroup_sizes(cl: Any, dev: Any, extensions: str, default: int | None) -> tuple[int, ...]:
    if "cl_intel_required_subgroup_size" in extensions:
        sizes = _safe(lambda: dev.get_info(CL_DEVICE_SUB_GROUP_SIZES_INTEL))
        if sizes:
            return tuple(sorted(int(x) for x in sizes))
    return (default,) if default else ()


def _subgroup_ops(extensions: str) -> tuple[str, ...]:
    """Vulkan-style names of the sub-group operations the OpenCL extensions give."""
    if "cl_khr_subgroups" not in extensions and "cl_intel_subgroups" not in extensions:
        return ()
    ops = ["basic", "vote", "arithmetic", "ballot"] if "cl_khr_subgroups" in extensions else ["basic", "shuffle"]
    for name, ext in (("ballot", "cl_khr_subgroup_ballot"), ("shuffle", "cl_khr_subgroup_shuffle"),
                      ("shuffle_relative", "cl_khr_subgroup_shuffle_relative"),
                      ("clustered", "cl_khr_subgroup_clustered_reduce"), ("shuffle", "cl_intel_subgroups")):
        if ext in extensions and name not in ops:
            ops.append(name)
    return tuple(ops)


def device_info(cl: Any, platform: Any, dev: Any, index: int, p_index: int, d_index: int) -> DeviceInfo:
    """The :class:`DeviceInfo` of one pyopencl device (no kernel is built); ``extra["driver"]``:
    :func:`driver_label`."""
    ext = _safe(lambda: dev.extensions, "") or ""
    sg, sg_src = _subgroup_size(cl, dev, ext)
    dtype = _device_type(cl, dev)
    max_alloc = _safe(lambda: int(dev.max_mem_alloc_size))
    info = DeviceInfo(
        backend="opencl", index=index, name=_safe(lambda: dev.name.strip(), "?"),
        vendor=_safe(lambda: dev.vendor.strip(), ""), device_type=dtype,
        platform=f"{_safe(lambda: platform.name.strip(), '?')} ({_safe(lambda: platform.version.strip(), '')})",
        driver_version=_safe(lambda: dev.driver_version.strip(), ""),
        global_mem_bytes=_safe(lambda: int(dev.global_mem_size)),
        max_alloc_bytes=max_alloc, max_buffer_bytes=max_alloc,
        compute_units=_safe(lambda: int(dev.max_compute_units)),
        max_workgroup_size=_safe(lambda: int(dev.max_work_group_size)),
        subgroup_size=sg, fp16="cl_khr_fp16" in ext, int8=any(e in ext for e in _INT8_EXTENSIONS),
        types=tuple(type_name(t) for t in OPENCL_TYPES), ops=OPS + OPENCL_MOE_OPS + RECURRENT_OPS + VISION_OPS,
        kv_types=tuple(type_name(t) for t in OPENCL_KV_TYPES),
        integer_dot=any(e in ext for e in _INT8_EXTENSIONS[:2]),
        cooperative_matrix="cl_intel_subgroup_matrix_multiply_accumulate" in ext,
        subgroup_sizes=_subgroup_sizes(cl, dev, ext, sg), subgroup_ops=_subgroup_ops(ext),
        bf16="cl_intel_bfloat16_conversions" in ext or "cl_khr_bfloat16" in ext,
        unified_memory=dtype in ("cpu", "igpu"), usable_mem_bytes=_safe(lambda: int(dev.global_mem_size)),
        extra={"platform_index": p_index, "device_index": d_index, "subgroup_size_source": sg_src,
               "driver": driver_label(_safe(lambda: platform.name.strip(), "?"),
                                      _safe(lambda: platform.version.strip(), "")),
               "opencl_c_version": _safe(lambda: dev.opencl_c_version.strip(), ""),
               "local_mem_bytes": _safe(lambda: int(dev.local_mem_size))})
    info.variants = kernel_variants(info)
    return info


def describe_icds() -> str:
    """The OpenCL ICD files the loader (ocl-icd) reads and the libraries they name (files only, no
    OpenCL call). ``OCL_ICD_VENDORS`` (a folder or one file) replaces ``/etc/OpenCL/vendors``;
    pyopencl's wheels add the PoCL they ship (``$PYOPENCL_HOME/.libs``)."""
    spec = os.environ.get("OCL_ICD_VENDORS")
    where = f"OCL_ICD_VENDORS={spec}" if spec else "/etc/OpenCL/vendors"
    path = spec or "/etc/OpenCL/vendors"
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".icd"))
    else:
        files = [path] if os.path.exists(path) else []
    if not files:
        return f"no ICD file (driver) in {where}"
    parts = []
    for f in files:
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                lib = fh.read().strip()
        except OSError as e:
            parts.append(f"{f} is unreadable ({e.strerror})")
            continue
        missing = "/" in lib and not os.path.exists(lib)
        parts.append(f"{f} names {lib}" + (", which does not exist" if missing else ""))
    return f"{len(files)} ICD file(s) in {where}: " + "; ".join(parts)


def driver_files() -> list[str]:
    """The ICD files the loader reads, the libraries they name, pyopencl's package with the
    libraries its wheel ships, and pocl-binary-distribution's data (PyPI PoCL's kernel library and
    headers): what a probe verdict depends on (:mod:`..safeprobe`)."""
    files: list[str] = []
    spec_dir = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    icds = sorted(glob.glob(os.path.join(spec_dir, "*.icd"))) if os.path.isdir(spec_dir) else [spec_dir]
    for icd in icds:
        files.append(icd)
        try:
            with open(icd, encoding="utf-8", errors="replace") as f:
                lib = f.read().strip()
            if lib.startswith("/"):
                files.append(lib)
        except OSError:
            pass
    spec = importlib.util.find_spec("pyopencl")
    if spec and spec.origin:
        pkg = os.path.dirname(spec.origin)
        files += [pkg] + sorted(glob.glob(os.path.join(pkg, ".libs", "*")))
    # PyPI's PoCL: its kernel library and headers decide whether its builds work (an upgrade re-probes)
    spec = importlib.util.find_spec("pocl_binary_distribution")
    if spec and spec.origin:
        data = os.path.join(os.path.dirname(spec.origin), ".libs", "share", "pocl")
        files += [os.path.dirname(spec.origin), data] + sorted(glob.glob(os.path.join(data, "*")))
    return files


def empty_platform_hint(platforms: list) -> str:
    """What to check when every platform lists zero devices (PoCL does when its kernel cache
    folder cannot be created: ``POCL_CACHE_DIR`` or ``$XDG_CACHE_HOME/pocl``)."""
    hint = ("the drivers load but report no device: check that they support this hardware and run "
            "with their debug output on (PoCL: POCL_DEBUG=all)")
    if any("Portable Computing Language" in str(_safe(lambda p=p: p.name, "")) for p in platforms):
        cache = os.environ.get("POCL_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pocl")
        hint = (f"PoCL lists no device when it cannot create its kernel cache folder {cache} "
                f"(POCL_CACHE_DIR / XDG_CACHE_HOME): make it writable or point POCL_CACHE_DIR at a writable "
                f"folder; POCL_DEBUG=all shows PoCL's own reason")
    return hint
