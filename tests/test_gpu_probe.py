"""What the probe tells GPU users, on fake device data of GPUs this machine does not have: an
AMD-like discrete GPU (64-wide subgroups, 32-64 selectable), an iGPU whose driver shows a small
device-local carve-out beside the shared system heap, and an Adreno-like OpenCL GPU with a 1 GiB
maximum allocation; and the same fields from the real drivers here in ``devices --json``."""

from __future__ import annotations

import json
import types

import pytest

from cooktop.backends import registry
from cooktop.backends.opencl import info as cl_info
from cooktop.backends.vulkan.info import VkDeviceFacts, facts_to_info

GIB = 1 << 30
KP_ALL = dict(storage_buffer_16bit=True, storage_buffer_8bit=True, shader_float16=True, shader_int8=True,
              shader_int16=True, integer_dot_product=True)


def amd_like() -> VkDeviceFacts:
    return VkDeviceFacts(
        index=0, name="AMD Radeon RX 7800 XT (RADV NAVI32)", vendor_id=0x1002, device_id=0x747E, device_type="gpu",
        api_version="1.3.275", driver_version=1, heaps=[(16 * GIB, True), (32 * GIB, False)],
        max_storage_buffer_range=4 * GIB - 1, max_allocation=4 * GIB, max_buffer_size=2 * GIB,
        max_workgroup_invocations=1024, subgroup_size=64, min_subgroup_size=32, max_subgroup_size=64,
        subgroup_arithmetic=True, subgroup_ops=("basic", "vote", "arithmetic", "ballot", "shuffle"),
        cooperative_matrix=True, extensions=("VK_KHR_cooperative_matrix",), **KP_ALL)


def igpu_like(budgets: list[int] | None = None) -> VkDeviceFacts:
    return VkDeviceFacts(
        index=0, name="AMD Radeon 890M (RADV GFX1150)", vendor_id=0x1002, device_id=0x150E, device_type="igpu",
        api_version="1.3.275", driver_version=1, heaps=[(512 << 20, True), (15 * GIB, False)],
        max_storage_buffer_range=4 * GIB - 1, max_allocation=4 * GIB, max_workgroup_invocations=1024,
        subgroup_size=64, subgroup_arithmetic=True, heap_budgets=budgets or [], host_visible_local=True)


def test_amd_like_gpu():
    info = facts_to_info(amd_like())
    d = info.to_dict()
    assert d["subgroup_size"] == 64 and d["subgroup_sizes"] == [32, 64]
    assert d["subgroup_ops"] == ["basic", "vote", "arithmetic", "ballot", "shuffle"]
    assert d["integer_dot"] and d["cooperative_matrix"] and d["fp16"] and not d["bf16"]
    # the largest usable buffer is the smallest cap: maxBufferSize 2 GiB < range 4 GiB - 1 < 16 GiB VRAM
    assert d["max_alloc_bytes"] == 2 * GIB and d["max_buffer_bytes"] == 2 * GIB
    assert d["unified_memory"] is False and d["usable_mem_bytes"] == 16 * GIB == d["global_mem_bytes"]
    # every device feature kp enables is there: the integer-dot Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K mat-vec variants
    assert d["variants"] == {"mul_mat_vec_q4_0": "mul_mat_vec_q4_0_q8", "mul_mat_vec_q8_0": "mul_mat_vec_q8_0_q8",
                             "mul_mat_vec_q4_k": "mul_mat_vec_q4_k_q8", "mul_mat_vec_q5_k": "mul_mat_vec_q5_k_q8",
                             "mul_mat_vec_q6_k": "mul_mat_vec_q6_k_q8"}
    json.dumps(d)


def test_igpu_counts_the_shared_heap_as_usable():
    """llama.cpp users see iGPUs reported with only their carve-out: the usable figure (which
    -ngl auto budgets with) counts the shared heap, or the driver's budget where it has one."""
    info = facts_to_info(igpu_like())
    assert info.device_type == "igpu" and info.unified_memory is True
    assert info.global_mem_bytes == 512 << 20
    assert info.usable_mem_bytes == 512 * (1 << 20) + 15 * GIB
    budgeted = facts_to_info(igpu_like(budgets=[400 << 20, 9 * GIB]))
    assert budgeted.usable_mem_bytes == (400 << 20) + 9 * GIB
    # without integer-dot or 16-bit storage the float mat-vec runs
    assert budgeted.variants == {"mul_mat_vec_q4_0": "mul_mat_vec_q4_0", "mul_mat_vec_q8_0": "mul_mat_vec_q8_0",
                                 "mul_mat_vec_q4_k": "mul_mat_vec_q4_k", "mul_mat_vec_q5_k": "mul_mat_vec_q5_k",
                                 "mul_mat_vec_q6_k": "mul_mat_vec_q6_k"}


def test_placement_budgets_an_igpu_with_its_usable_memory(monkeypatch):
    """-ngl auto / plan take the usable figure, not the 512 MiB carve-out."""
    from cooktop.runtime import loader

    fake = facts_to_info(igpu_like())
    monkeypatch.setattr(registry, "device_info", lambda sel: fake)
    seen = {}
    monkeypatch.setattr(loader, "place", lambda *a, **k: seen.setdefault("limits", a[6]))
    loader.plan_for(None, None, ["vulkan:0"], "auto", None, 512, 512, False)
    assert seen["limits"]("vulkan:0") == (512 * (1 << 20) + 15 * GIB, 4 * GIB - 1)


class _FakeCl:
    """The parts of pyopencl's module that device_info reads."""

    device_type = types.SimpleNamespace(GPU=4, CPU=2, ACCELERATOR=8)
    device_info = types.SimpleNamespace(PREFERRED_WORK_GROUP_SIZE_MULTIPLE=0x1067)


def adreno_like():
    ext = "cl_khr_fp16 cl_khr_subgroups cl_qcom_ext_host_ptr cl_khr_integer_dot_product cl_khr_subgroup_shuffle"
    dev = types.SimpleNamespace(
        type=4, host_unified_memory=True, extensions=ext, name="QUALCOMM Adreno(TM) 750", vendor="QUALCOMM",
        driver_version="OpenCL 3.0 QUALCOMM build", global_mem_size=12 * GIB, max_mem_alloc_size=GIB,
        max_compute_units=6, max_work_group_size=1024, opencl_c_version="OpenCL C 3.0 Adreno(TM) 750",
        local_mem_size=32 << 10, get_info=lambda what: 128 if what == 0x1067 else None)
    platform = types.SimpleNamespace(name="QUALCOMM Snapdragon(TM)", version="OpenCL 3.0")
    return cl_info.device_info(_FakeCl(), platform, dev, 0, 0, 0)


def test_adreno_like_opencl_gpu():
    info = adreno_like()
    d = info.to_dict()
    assert d["device_type"] == "igpu" and d["unified_memory"] is True
    assert d["max_alloc_bytes"] == GIB == d["max_buffer_bytes"] and d["usable_mem_bytes"] == 12 * GIB
    assert d["subgroup_size"] == 128 and d["subgroup_sizes"] == [128]
    assert d["subgroup_ops"] == ["basic", "vote", "arithmetic", "ballot", "shuffle"]
    assert d["integer_dot"] and d["fp16"] and not d["cooperative_matrix"]
    assert d["variants"]["launch_shape"] == "gpu"
    assert d["variants"]["prompt_matmul"] == "mul_mvt_q8 (the one-token sums)"  # no VNNI off the host CPU


def test_a_tensor_past_a_1_gib_allocation_limit_is_refused_by_name():
    """The budget reasons with the real limit: a 1.5 GiB buffer that cannot be split (a block's K cache)
    on a 1 GiB-per-allocation device."""
    from cooktop.runtime.budget import DeviceBudget

    info = adreno_like()
    b = DeviceBudget("opencl:0", [0], True, 3 * GIB, 0, 0, 3 * GIB // 2, info.usable_mem_bytes,
                     info.usable_mem_bytes, info.max_alloc_bytes, "KV cache")
    assert not b.fits and b.why_not == ("largest buffer that cannot be split (KV cache) 1536.0 MiB exceeds the "
                                        "maximum allocation 1024.0 MiB")


@pytest.mark.parametrize("family", registry.DEVICE_FAMILIES)
def test_devices_json_has_the_gpu_fields(family):
    """The real drivers here (PoCL, lavapipe) fill the same fields in ``cooktop devices --json``."""
    from cooktop.cli.devices import devices_report

    res = registry.probe(family)
    if not res.available:
        from conftest import skip_or_fail
        skip_or_fail(family, res.reason)
    rows = json.loads(json.dumps(devices_report(smoke=False), default=str))["families"][family]["devices"]
    assert rows
    for d in rows:
        for key in ("integer_dot", "cooperative_matrix", "subgroup_sizes", "subgroup_ops", "fp16", "bf16",
                    "max_buffer_bytes", "max_alloc_bytes", "unified_memory", "usable_mem_bytes", "variants"):
            assert key in d, key
        assert d["usable_mem_bytes"] > 0 and d["variants"]
        assert d["unified_memory"] is True  # PoCL and lavapipe run on this machine's CPU and RAM
