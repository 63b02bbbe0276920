"""The Vulkan family's side of the autotuner (:mod:`cooktop.backends.tune`).

Where the values come from: ``device.py`` and ``glsl/mul_mat_vec*.comp``: the mat-vec workgroup size
``wg`` (specialization constant 0; default the subgroup size, at least :data:`MMV_NROWS` = 8) and, on
CPU drivers, the workgroups per token and core ``wgs_per_core`` (4). rmsnorm, rope and attention
have their workgroup sizes compiled in (``#define WG``, ``local_size_x`` in the shipped SPIR-V):
nothing to tune without a rebuild.
"""

from __future__ import annotations

from typing import Any

from gguf import GGMLQuantizationType as T

from ..tune.space import check, type_of

#: Rows per workgroup of mul_mat_vec (its NROWS define).
MMV_NROWS = 8

#: Workgroups per token and CPU core of the mat-vec on CPU drivers (the untuned value).
WGS_PER_CORE = 4


class VulkanTuning:
    """The ``tuning`` hooks of the Vulkan family (:attr:`cooktop.backends.family.Family.tuning`)."""

    def flavour(self, info: Any) -> str:
        """``"vulkan"`` (one flavour: the driver's subgroup size sets the defaults)."""
        return "vulkan"

    def defaults(self, info: Any, params: tuple[str, ...]) -> dict[str, int]:
        """Today's values of ``params`` on ``info``'s device."""
        out = {"wg": max(info.subgroup_size or 32, MMV_NROWS), "wgs_per_core": WGS_PER_CORE}
        return {p: out[p] for p in params}

    def is_default(self, flavour: str, param: str, value: int) -> bool:
        """Whether ``value`` may stand for ``param``'s default (any ``wg`` of at least 8 rows)."""
        return param == "wg" and int(value) >= MMV_NROWS


TUNING = VulkanTuning()


def vulkan_mat_vec(info: Any, choice: dict[str, dict[str, int]]) -> dict[T, tuple[int, int]]:
    """``{weight type: (workgroup size, workgroups per token and core)}`` of ``choice``'s
    ``mat_vec:<TYPE>`` entries on a Vulkan device (the defaults fill what an entry leaves out).

    Raises:
        DeviceError: a key or value outside the search space.
    """
    base = TUNING.defaults(info, ("wg", "wgs_per_core")) if info is not None else {"wg": 32, "wgs_per_core": 4}
    out: dict[T, tuple[int, int]] = {}
    for key, params in choice.items():
        check("vulkan", key, params)
        p = dict(base, **{k: int(v) for k, v in params.items()})
        out[type_of(key)] = (p["wg"], p.get("wgs_per_core", WGS_PER_CORE))
    return out
