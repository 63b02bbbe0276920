"""What a device is (DeviceInfo, as probed) and what a family's probe found (ProbeResult)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gguf import GGMLQuantizationType as T

from ..format.quants import type_name

#: Op names of the device contract (:mod:`.base`), in the order of its table.
OPS: tuple[str, ...] = ("matmul", "rmsnorm", "rope", "kv_store", "attention", "silu_mul", "add", "get_rows",
                        "add_bias", "gelu_mul")

#: The mixture-of-experts ops (:mod:`.moe_ops`); a backend lists those it runs after :data:`OPS`.
MOE_OPS: tuple[str, ...] = ("moe_route", "matmul_id", "add_id", "moe_combine", "swiglu_oai", "attention_sinks")

#: Ops whose weight (or table) type matters to :meth:`DeviceInfo.supports`.
TYPED_OPS = ("matmul", "get_rows", "matmul_id")


@dataclasses.dataclass
class DeviceInfo:
    """What a device is and can do, as probed.

    Memory fields are bytes; ``None`` means the driver did not tell.
    ``device_type`` is one of ``gpu``, ``igpu``, ``cpu``, ``accelerator``.
    ``types`` lists GGML type names the backend runs there, ``ops`` the op names.
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
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def supports(self, op: str, ggml_type: T | None = None) -> bool:
        """True when ``op`` runs on this device with weights (or table) of ``ggml_type``.

        ``ggml_type`` matters for :data:`TYPED_OPS`; other ops take float32.
        """
        if op not in self.ops:
            return False
        if ggml_type is None or op not in TYPED_OPS:
            return True
        return type_name(ggml_type) in self.types

    @property
    def selector(self) -> str:
        """The ``--device`` name of this device, e.g. ``opencl:0``."""
        return self.backend if self.backend == "cpu" else f"{self.backend}:{self.index}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field plus ``selector``."""
        d = dataclasses.asdict(self)
        d["types"] = list(self.types)
        d["ops"] = list(self.ops)
        d["selector"] = self.selector
        return d


@dataclasses.dataclass
class ProbeResult:
    """A backend family's probe: its devices, or why there are none usable.

    ``available`` is H_k AND F_k: the package and runtime load (F_k) and at least
    one device was found (H_k). ``reason`` says why not; ``hint`` how to fix it.
    ``errors`` maps a device index that failed to open to its error.
    """

    backend: str
    available: bool
    devices: list[DeviceInfo] = dataclasses.field(default_factory=list)
    reason: str = ""
    hint: str = ""
    errors: dict[int, str] = dataclasses.field(default_factory=dict)
