"""The family list: every backend family, in priority order for ``auto`` (the numpy reference last).

Each entry is the ``FAMILY`` a ``backends/<family>/`` package gives of itself
(:class:`~.family.Family`); the registry, the probe child, the bench and the tests read this
list and nothing else about families. A new backend is its folder plus one line here.
"""

from __future__ import annotations

from . import cpu, opencl, vulkan
from .family import Family

#: Every family by name, in priority order.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    opencl.FAMILY,
    vulkan.FAMILY,
    cpu.FAMILY,
)}

#: The families tested against the numpy reference (every one but the reference), in order.
DEVICE_FAMILIES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if not f.reference)
