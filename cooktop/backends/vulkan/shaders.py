"""Shader variants, SPIR-V loading, push constants and grid sizes of the Vulkan backend.

The GLSL sources and compiled ``.spv`` live in ``glsl/`` and ``spv/`` beside this module;
``variants.json`` lists each variant (name, source, ``-D`` defines, the
access of each binding, and optionally the device features it needs and the
variant it stands in for) and ``build.py`` (``make shaders``) compiles them. Push constants are one uint32
array per dispatch (floats bit-cast with :func:`f32_bits`), at most
:data:`MAX_PUSH_BYTES`; large grids are split over y (``flat_group()`` in
common.glsl).
"""

from __future__ import annotations

import functools
import json
import pathlib
import struct
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ...errors import DeviceError
from ..base import DEVICE_WEIGHT_TYPES

HERE = pathlib.Path(__file__).resolve().parent
#: Compiled SPIR-V of every variant (``make shaders`` rebuilds it from ``glsl/``).
SHADER_DIR = HERE / "spv"
#: GLSL sources of the variants (``.comp``) and what they include (``.glsl``).
GLSL_DIR = HERE / "glsl"

#: GGML weight types with shader variants (mul_mat_vec, mul_mm, get_rows, mul_mat_id: build.py
#: TYPED x TYPES), in OpenCL's order (opencl/programs.py OPENCL_TYPES).
VULKAN_TYPES: tuple[T, ...] = DEVICE_WEIGHT_TYPES + (T.MXFP4, T.Q2_K, T.Q3_K)

#: KV cache types kv_store.comp writes and attention.comp reads (glsl/kv.glsl; ``DeviceInfo.kv_types``).
VULKAN_KV_TYPES: tuple[T, ...] = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0)

#: Shader variant names per weight type, e.g. VARIANTS["mul_mat_vec"][T.Q4_0] == "mul_mat_vec_q4_0".
VARIANTS: dict[str, dict[T, str]] = {op: {t: f"{op}_{t.name.lower()}" for t in VULKAN_TYPES}
                                     for op in ("mul_mat_vec", "mul_mm", "get_rows", "mul_mat_id")}

#: Push-constant limit in bytes: the minimum maxPushConstantsSize every Vulkan device has.
MAX_PUSH_BYTES = 128

@functools.cache
def load_spirv(name: str) -> bytes:
    """The shipped SPIR-V of shader variant ``name`` (e.g. ``"mul_mat_vec_q4_0"``).

    Raises:
        DeviceError: the ``.spv`` file is missing (broken install: run ``make shaders``).
    """
    path = SHADER_DIR / f"{name}.spv"
    try:
        return path.read_bytes()
    except OSError as e:
        raise DeviceError(f"missing Vulkan shader {path} ({e}); reinstall cooktop or run `make shaders`") from e


def variants() -> list[dict[str, Any]]:
    """The shader variants of ``variants.json``: ``{"name", "source", "defines", "access"}`` each,
    plus ``"features"`` and ``"variant_of"`` for a variant that needs optional device features."""
    return json.loads((HERE / "variants.json").read_text())["variants"]


@functools.cache
def _manifest() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in variants()}


def variant_info(name: str) -> dict[str, Any]:
    """The manifest entry of variant ``name`` (``{}`` when there is none)."""
    return _manifest().get(name, {})


@functools.cache
def binding_access(name: str) -> tuple[str, ...]:
    """Access of each binding of variant ``name``: ``"r"``, ``"w"`` or ``"rw"`` (binding order;
    from the GLSL ``readonly`` / ``writeonly`` qualifiers, recorded by ``build.py``).

    Raises:
        DeviceError: no such variant, or it has no recorded access (run ``make shaders``).
    """
    v = _manifest().get(name)
    if v is None or "access" not in v:
        raise DeviceError(f"Vulkan shader variant {name!r} is not in variants.json (with its access); "
                          f"reinstall cooktop or run `make shaders`")
    return tuple(v["access"])


def pick_variant(name: str, features: frozenset[str] | set[str], prefer_input: str | None = None) -> str:
    """The variant to run for the logical variant ``name`` on a device with ``features`` enabled.

    A variant with ``"variant_of": name`` and ``"features": [...]`` all in ``features``
    is preferred (the first listed, or the first of those whose ``"input"`` is ``prefer_input``,
    e.g. ``"q8_K"`` over ``"q8_1"``, where there is one); otherwise ``name`` itself, which needs no
    optional feature.
    """
    ok = [v for v in variants_of(name) if set(_manifest()[v].get("features", ())) <= set(features)]
    preferred = [v for v in ok if prefer_input is not None and _manifest()[v].get("input") == prefer_input]
    return (preferred or ok or [name])[0]


@functools.cache
def variants_of(name: str) -> tuple[str, ...]:
    """Names of the feature-dependent variants that stand in for ``name`` (manifest order)."""
    return tuple(v["name"] for v in variants() if v.get("variant_of") == name)


@functools.lru_cache(maxsize=4096)
def f32_bits(x: float) -> int:
    """The IEEE-754 float32 bits of ``x`` as an unsigned int (push constants are uint32)."""
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def pack_push(values: tuple[int, ...]) -> np.ndarray:
    """uint32 push-constant array of ``values`` (already bit-cast ints).

    Raises:
        AssertionError: more than :data:`MAX_PUSH_BYTES` bytes (the GLSL block would not fit).
    """
    arr = np.array(values, dtype=np.uint32)
    assert arr.nbytes <= MAX_PUSH_BYTES, f"push constants of {arr.nbytes} bytes > {MAX_PUSH_BYTES}"
    return arr


def bucket(n: int, cap: int) -> int:
    """``n`` rounded up to a power of two, at most ``cap`` (and at least ``n``)."""
    return max(n, min(1 << max(0, (n - 1).bit_length()), cap))


def workgroups(n_groups: int) -> list[int]:
    """A workgroup count for ``n_groups`` linear groups (split over y past 65535; see common.glsl)."""
    n_groups = max(1, int(n_groups))
    if n_groups <= 65535:
        return [n_groups, 1, 1]
    gx = 65535
    return [gx, (n_groups + gx - 1) // gx, 1]
