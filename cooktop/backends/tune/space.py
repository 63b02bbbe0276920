"""The declared search space of the autotuner: per backend flavour and hot kernel family, the
launch parameters that may change and the values each may take (the first value listed need
not be the default: :func:`defaults` gives today's, from the launch shapes).

A *choice* is ``{family key: {parameter: value}}``, a family key being ``"mat_vec:<TYPE>"`` /
``"prompt_matmul:<TYPE>"`` (GGML type name, one weight program per type) or a device-wide family
(``"rmsnorm"``, ``"attention"``). Only parameters that differ from the defaults need appear.

Where the values come from (the hand-tuned constants they replace):

- OpenCL (``opencl/programs.py`` ``LaunchShape``, ``CPU_SHAPE`` / ``GPU_SHAPE``; ``dotq8.cl``
  ``Q8_PF``): rows per work-group of the mat-vecs ``mv_r`` (CPU 8, GPU 4), the x86 weight-prefetch
  distance ``q8_pf`` (1536 bytes), token tiles per work-item of the prompt kernels ``mmq_tt`` (8),
  the prompt kernels' group width ``mm_tm`` (CPU 8, GPU 64), the rmsnorm group ``rn_ls`` (16 / 64),
  attention's keys per chunk ``at_ls`` (GPU 32; the CPU flavour runs one work-item per (head, token)
  and has nothing to tune). Kept fixed because they change the layout or the flavour, not the
  speed alone: ``mv_ls`` (1 on CPUs selects repacked Q4_0 and the x86 prompt kernels), ``mm_local``,
  ``at_serial``, ``mmq_r`` (Q8_0's kernel pairs rows), ``mmq_tn``, ``MVT_TN``. The ``COOKTOP_OPENCL_*``
  switches (Q8, Q8K, VNNI, MMQ_K, EXACT_PROMPT) choose between kernels of different rounding
  (float vs 8-bit activations, block_q8_1 vs block_q8_K), so they stay the user's: a prompt's logits
  must not change with a timing.
- Vulkan (``vulkan/device.py``; ``glsl/mul_mat_vec*.comp``): the mat-vec workgroup size ``wg``
  (specialization constant 0; default the subgroup size, at least ``MMV_NROWS`` = 8) and, on CPU
  drivers, the workgroups per token and core ``wgs_per_core`` (4). rmsnorm, rope and attention
  have their workgroup sizes compiled in (``#define WG``, ``local_size_x`` in the shipped SPIR-V):
  nothing to tune without a rebuild.

Exactness: ``"exact"`` families must give the default's result bit for bit (the parameter only
moves work between work-items or prefetches memory); ``"bound"`` ones change a reduction's order
and must stay within the op's parity bound (:data:`PARITY_RTOL`, ``PARITY_ATOL``).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from gguf import GGMLQuantizationType as T

from ...errors import DeviceError

#: Bumped when the space or the kernels it indexes change: cached choices of another version are ignored.
SPACE_VERSION = 1

#: Relative / absolute tolerance of the "bound" families (tests/test_ops_parity.py's float bound).
PARITY_RTOL, PARITY_ATOL = 1e-4, 1e-5


@dataclasses.dataclass(frozen=True)
class Family:
    """One tunable kernel family: ``params`` name -> the values tried; ``exact``: candidates must
    match the default bit for bit (else within the parity bound); ``per_type``: one choice per
    weight type (key ``"<name>:<TYPE>"``); ``note``: what is fixed and why, where nothing is tuned."""

    name: str
    params: dict[str, tuple[int, ...]]
    exact: bool
    per_type: bool = False
    note: str = ""


#: backend flavour -> the families (the table README and docs/DESIGN.md show).
SPACE: dict[str, tuple[Family, ...]] = {
    "opencl-cpu": (
        Family("mat_vec", {"mv_r": (4, 8, 16), "q8_pf": (0, 768, 1536, 3072)}, exact=True, per_type=True),
        Family("prompt_matmul", {"mmq_tt": (4, 8, 16), "mm_tm": (4, 8, 16)}, exact=True, per_type=True),
        Family("rmsnorm", {"rn_ls": (8, 16, 32)}, exact=False),
        Family("attention", {}, exact=True, note="serial flavour: one work-item per (head, token)"),
        Family("rope", {}, exact=True, note="one work-item per pair (elementwise launch)"),
    ),
    "opencl-gpu": (
        Family("mat_vec", {"mv_r": (2, 4, 8)}, exact=False, per_type=True),
        Family("prompt_matmul", {"mm_tm": (32, 64)}, exact=True, per_type=True),
        Family("rmsnorm", {"rn_ls": (32, 64, 128)}, exact=False),
        Family("attention", {"at_ls": (16, 32, 64)}, exact=False),
        Family("rope", {}, exact=True, note="one work-item per pair (elementwise launch)"),
    ),
    "vulkan": (
        Family("mat_vec", {"wg": (8, 16, 32, 64), "wgs_per_core": (2, 4, 8)}, exact=False, per_type=True),
        Family("prompt_matmul", {}, exact=True, note="mul_mm: 64 invocations, 32x32 tiles compiled in"),
        Family("rmsnorm", {}, exact=True, note="WG compiled into the shipped SPIR-V"),
        Family("attention", {}, exact=True, note="WG compiled into the shipped SPIR-V"),
        Family("rope", {}, exact=True, note="local_size_x = 64 compiled in"),
    ),
}


def flavour_of(info: Any) -> str:
    """``"opencl-cpu"``, ``"opencl-gpu"`` or ``"vulkan"`` for a DeviceInfo (None for backends with
    nothing to tune: numpy)."""
    if info.backend == "opencl":
        from ..opencl.info import launch_shape

        return f"opencl-{launch_shape(info)[0]}"
    if info.backend == "vulkan":
        return "vulkan"
    return ""


def family(flavour: str, name: str) -> Family:
    """The family ``name`` (``"mat_vec"``...) of ``flavour``.

    Raises:
        DeviceError: no such family.
    """
    for f in SPACE.get(flavour, ()):
        if f.name == name:
            return f
    raise DeviceError(f"tuning: no kernel family {name!r} for {flavour or 'this backend'}")


def defaults(info: Any, name: str) -> dict[str, int]:
    """Today's values of family ``name``'s parameters on ``info``'s device (the untuned choice)."""
    fl = flavour_of(info)
    fam = family(fl, name)
    if fl.startswith("opencl"):
        from ..opencl.info import launch_shape

        shape = launch_shape(info)[1]
        return {p: getattr(shape, p) for p in fam.params}
    from ..vulkan.device import MMV_NROWS

    out = {"wg": max(info.subgroup_size or 32, MMV_NROWS), "wgs_per_core": 4}
    return {p: out[p] for p in fam.params}


def candidates(info: Any, name: str) -> list[dict[str, int]]:
    """Every point of family ``name``'s space on ``info``'s device, the default first (work-group
    sizes past the device's maximum, and ``wgs_per_core`` off CPU drivers, left out)."""
    fl = flavour_of(info)
    fam = family(fl, name)
    base = defaults(info, name)
    limit = info.max_workgroup_size or 1 << 30
    params = dict(fam.params)
    if fl == "vulkan" and info.device_type != "cpu":
        params.pop("wgs_per_core", None)
    out = [base]
    keys = list(params)
    for values in itertools.product(*(params[k] for k in keys)):
        c = dict(base, **dict(zip(keys, values)))
        size = c.get("wg") or c.get("mm_tm") or 1
        if fl == "opencl-gpu" and "mv_r" in c:
            size = max(size, 16 * c["mv_r"])
        if size > limit or c in out:
            continue
        out.append(c)
    return out


def _check(flavour: str, key: str, params: dict[str, int]) -> Family:
    name = key.split(":", 1)[0]
    fam = family(flavour, name)
    for p, v in params.items():
        if p not in fam.params or int(v) not in fam.params[p] and not _is_default(flavour, name, p, v):
            raise DeviceError(f"tuning: {key}.{p}={v!r} is not in the search space of {flavour} "
                              f"({fam.params.get(p, 'no such parameter')})")
    if fam.per_type != (":" in key):
        what = "one choice per weight type" if fam.per_type else "device-wide"
        raise DeviceError(f"tuning: {key!r}: {name} is {what}")
    return fam


def _is_default(flavour: str, name: str, p: str, v: int) -> bool:
    if flavour.startswith("opencl"):
        from ..opencl.programs import CPU_SHAPE, GPU_SHAPE

        return int(v) == getattr(CPU_SHAPE if flavour == "opencl-cpu" else GPU_SHAPE, p)
    return p == "wg" and int(v) >= 8


def type_of(key: str) -> T:
    """The GGML type of a per-type family key (``"mat_vec:Q4_K"`` -> Q4_K).

    Raises:
        DeviceError: not a known type name.
    """
    try:
        return T[key.split(":", 1)[1]]
    except (KeyError, IndexError):
        raise DeviceError(f"tuning: {key!r} does not name a GGML weight type") from None


def opencl_shapes(default: Any, flavour: str, choice: dict[str, dict[str, int]]) -> tuple[Any, dict[T, Any]]:
    """``(device-wide LaunchShape, {weight type: LaunchShape})`` of ``choice`` on an OpenCL device whose
    default shape is ``default`` (``"opencl-cpu"`` / ``"opencl-gpu"`` flavour).

    Raises:
        DeviceError: a key or value outside the search space.
    """
    wide: dict[str, int] = {}
    typed: dict[T, dict[str, int]] = {}
    for key, params in choice.items():
        _check(flavour, key, params)
        if ":" in key:
            typed.setdefault(type_of(key), {}).update({p: int(v) for p, v in params.items()})
        else:
            wide.update({p: int(v) for p, v in params.items()})
    base = dataclasses.replace(default, **wide)
    return base, {t: dataclasses.replace(base, **p) for t, p in typed.items()}


def vulkan_mat_vec(info: Any, choice: dict[str, dict[str, int]]) -> dict[T, tuple[int, int]]:
    """``{weight type: (workgroup size, workgroups per token and core)}`` of ``choice``'s
    ``mat_vec:<TYPE>`` entries on a Vulkan device (the defaults fill what an entry leaves out).

    Raises:
        DeviceError: a key or value outside the search space.
    """
    base = defaults(info, "mat_vec") if info is not None else {"wg": 32, "wgs_per_core": 4}
    out: dict[T, tuple[int, int]] = {}
    for key, params in choice.items():
        _check("vulkan", key, params)
        p = dict(base, **{k: int(v) for k, v in params.items()})
        out[type_of(key)] = (p["wg"], p.get("wgs_per_core", 4))
    return out


def table() -> list[dict[str, Any]]:
    """The search space as rows ``{"flavour", "family", "params", "exact", "per_type", "note"}``
    (``cooktop tune --space``; README and docs/DESIGN.md print it)."""
    return [{"flavour": fl, "family": f.name, "params": {k: list(v) for k, v in f.params.items()},
             "exact": f.exact, "per_type": f.per_type, "note": f.note}
            for fl, fams in SPACE.items() for f in fams]


__all__ = ["SPACE", "SPACE_VERSION", "Family", "candidates", "defaults", "flavour_of", "opencl_shapes",
           "table", "type_of", "vulkan_mat_vec"]
