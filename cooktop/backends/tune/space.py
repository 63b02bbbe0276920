"""The declared search space of the autotuner: per backend flavour and hot kernel family, the
launch parameters that may change and the values each may take (the first value listed need
not be the default: :func:`defaults` gives today's, from the launch shapes).

A *choice* is ``{family key: {parameter: value}}``, a family key being ``"mat_vec:<TYPE>"`` /
``"prompt_matmul:<TYPE>"`` (GGML type name, one weight program per type) or a device-wide family
(``"rmsnorm"``, ``"attention"``). Only parameters that differ from the defaults need appear.

Where the values come from (the hand-tuned constants they replace) is each family's to say: its
``tuning`` hook (:class:`~cooktop.backends.family.Family`; ``opencl/tuning.py``, ``vulkan/tuning.py``)
gives the flavour of a device, today's defaults and the shapes a choice becomes; this module
names no family's modules (the family list reaches them).

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


def _hooks(backend: str) -> Any:
    """The ``tuning`` hooks of the family named ``backend`` (None: it has nothing to tune)."""
    from ..families import FAMILIES

    fam = FAMILIES.get(backend)
    return fam.tuning_hooks() if fam is not None else None


def flavour_of(info: Any) -> str:
    """The flavour of a DeviceInfo's device (``"opencl-cpu"``, ``"opencl-gpu"``, ``"vulkan"``: a key of
    :data:`SPACE`), from its family's hooks; ``""`` for families with nothing to tune (numpy)."""
    hooks = _hooks(info.backend)
    return hooks.flavour(info) if hooks is not None else ""


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
    fam = family(flavour_of(info), name)
    return _hooks(info.backend).defaults(info, tuple(fam.params))


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


def check(flavour: str, key: str, params: dict[str, int]) -> Family:
    """The family of choice entry ``key`` (``"mat_vec:Q4_K"``, ``"rmsnorm"``) of ``flavour``, its
    ``params`` checked: each in the declared values, or the flavour's default.

    Raises:
        DeviceError: a key or value outside the search space.
    """
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
    return bool(_hooks(flavour.split("-", 1)[0]).is_default(flavour, p, int(v)))


def type_of(key: str) -> T:
    """The GGML type of a per-type family key (``"mat_vec:Q4_K"`` -> Q4_K).

    Raises:
        DeviceError: not a known type name.
    """
    try:
        return T[key.split(":", 1)[1]]
    except (KeyError, IndexError):
        raise DeviceError(f"tuning: {key!r} does not name a GGML weight type") from None


def table() -> list[dict[str, Any]]:
    """The search space as rows ``{"flavour", "family", "params", "exact", "per_type", "note"}``
    (``cooktop tune --space``; README and docs/DESIGN.md print it)."""
    return [{"flavour": fl, "family": f.name, "params": {k: list(v) for k, v in f.params.items()},
             "exact": f.exact, "per_type": f.per_type, "note": f.note}
            for fl, fams in SPACE.items() for f in fams]


__all__ = ["SPACE", "SPACE_VERSION", "Family", "candidates", "check", "defaults", "flavour_of", "table",
           "type_of"]
