"""Memory a placement needs on each device, and whether it fits.

Per device (bytes), for the blocks and head placed on it (the same buffers
``model/forward.py`` ``Segment`` and ``KVCache`` allocate):

- weights: the tensors the architecture declares for those units (``model/arch``):
  the GGUF byte size of each matrix (raw GGML blocks, uploaded as is), 4 bytes per
  value for norm and bias weights (uploaded as float32);
- KV cache: ``n_ctx x (row bytes of K + row bytes of V)`` per block, a row being
  ``n_head_kv x head_dim`` values in the cache's type (``-ctk``/``-ctv``: 4 bytes a value for f32,
  2 for f16, 34/32 for q8_0, 18/32 for q4_0; ``format/kvtypes.py``), for one sequence (the
  engine's default one); each further sequence (``Engine.new_sequence``) needs as much again;
- scratch: ``4 x n_batch x (sum of the architecture's scratch widths + 1)`` per segment
  (llama: ``5 n_embd + 2 n_embd_kv + 2 n_ff``; the 1 is the positions), plus for the
  head ``4 x (1 + n_embd + R x n_vocab)`` with R = n_batch when logits_all else 1.

A device fits when the total is within its usable memory (probed global memory
minus a reserve of ``COOKTOP_MEMORY_RESERVE`` percent, default 5) and no single
buffer exceeds its maximum allocation size. ``COOKTOP_DEVICE_MEMORY``
overrides probed sizes to simulate small devices:
``opencl:0=512MiB,vulkan:0=2GiB/256MiB`` (memory, optionally ``/`` max allocation).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ..errors import DeviceError
from ..format.gguf import GGUFFile
from ..format.kvtypes import KVConfig
from ..model.arch import architecture
from ..model.arch.base import MATRIX
from ..model.config import ModelConfig
from ..units import parse_bytes


@dataclasses.dataclass
class DeviceBudget:
    """What one device holds under a placement (bytes) and whether it fits."""

    selector: str
    blocks: list[int]
    head: bool
    weight_bytes: int
    kv_bytes: int
    scratch_bytes: int
    largest_alloc_bytes: int
    memory_bytes: int | None
    usable_bytes: int | None
    max_alloc_bytes: int | None

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.scratch_bytes

    @property
    def why_not(self) -> str:
        """Empty when it fits, else the reason."""
        if self.usable_bytes is not None and self.total_bytes > self.usable_bytes:
            mem = "?" if self.memory_bytes is None else f"{self.memory_bytes / 2**20:.1f}"
            return (f"needs {self.total_bytes / 2**20:.1f} MiB but {self.usable_bytes / 2**20:.1f} MiB is usable "
                    f"({mem} MiB minus reserve)")
        if self.max_alloc_bytes is not None and self.largest_alloc_bytes > self.max_alloc_bytes:
            return (f"largest buffer {self.largest_alloc_bytes / 2**20:.1f} MiB exceeds the maximum allocation "
                    f"{self.max_alloc_bytes / 2**20:.1f} MiB")
        return ""

    @property
    def fits(self) -> bool:
        return not self.why_not

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(total_bytes=self.total_bytes, fits=self.fits, why_not=self.why_not)
        return d


def memory_overrides() -> dict[str, tuple[int, int | None]]:
    """Parse ``COOKTOP_DEVICE_MEMORY`` into selector -> (memory, max alloc or None).

    Raises:
        DeviceError: malformed value.
    """
    out: dict[str, tuple[int, int | None]] = {}
    raw = os.environ.get("COOKTOP_DEVICE_MEMORY", "")
    for item in filter(None, (s.strip() for s in raw.split(","))):
        sel, eq, val = item.partition("=")
        try:
            mem, _, mx = val.partition("/")
            out[sel.strip().lower()] = (parse_bytes(mem), parse_bytes(mx) if mx else None)
        except ValueError:
            raise DeviceError(f"bad COOKTOP_DEVICE_MEMORY entry {item!r}: expected e.g. opencl:0=512MiB "
                              "or vulkan:0=2GiB/256MiB") from None
        if not eq:
            raise DeviceError(f"bad COOKTOP_DEVICE_MEMORY entry {item!r}: expected SELECTOR=SIZE")
        if out[sel.strip().lower()][0] <= 0 or (out[sel.strip().lower()][1] or 1) <= 0:
            raise DeviceError(f"bad COOKTOP_DEVICE_MEMORY entry {item!r}: sizes must be positive")
    return out


def reserve_fraction() -> float:
    """Fraction of device memory kept free (``COOKTOP_MEMORY_RESERVE`` percent, default 5)."""
    try:
        pct = float(os.environ.get("COOKTOP_MEMORY_RESERVE", "5"))
    except ValueError:
        pct = -1.0
    if not 0.0 <= pct < 100.0:
        raise DeviceError("COOKTOP_MEMORY_RESERVE must be a percentage in [0, 100), e.g. 5")
    return pct / 100.0


def device_limits(sel: str, probed_mem: int | None, probed_max_alloc: int | None) -> tuple[int | None, int | None]:
    """(memory, max allocation) of a device after ``COOKTOP_DEVICE_MEMORY`` overrides."""
    ov = memory_overrides().get(sel)
    if ov is None:
        return probed_mem, probed_max_alloc
    mem, mx = ov
    return mem, (mx if mx is not None else (min(mem, probed_max_alloc) if probed_max_alloc else mem))


def segment_scratch_bytes(cfg: ModelConfig, n_batch: int, head: bool, logits_all: bool) -> tuple[int, int]:
    """(total scratch bytes, largest scratch buffer) of one segment (module doc formula)."""
    B = n_batch
    arch = architecture(cfg.arch)
    i32 = arch.scratch_i32(cfg) if arch.scratch_i32 is not None else {}
    widths = list(arch.scratch(cfg).values()) + list(i32.values())
    sizes = [4 * B * width for width in widths] + [4 * B]
    if head:
        sizes += [4, 4 * cfg.n_embd, 4 * (B if logits_all else 1) * cfg.n_vocab]
    return sum(sizes), max(sizes)


def weight_bytes(gf: GGUFFile, cfg: ModelConfig, units: list) -> dict[str, int]:
    """GGUF name -> bytes on the device of every tensor of ``units`` (block indices, ``(block, part)``
    pairs for one half of a block, and/or ``"head"``), each tensor once (module doc)."""
    arch = architecture(cfg.arch)
    out: dict[str, int] = {}
    for unit in units:
        unit, part = unit if isinstance(unit, tuple) else (unit, "all")
        for name, spec in arch.unit_tensors(gf.tensors, unit, part).values():
            t = gf.tensor(name)
            out[name] = t.n_bytes if spec.kind == MATRIX else 4 * int(np.prod(t.shape))
    return out


def budgets(gf: GGUFFile, cfg: ModelConfig, placement, n_ctx: int, n_batch: int, logits_all: bool,
            limits, kv: KVConfig | None = None) -> list[DeviceBudget]:
    """One :class:`DeviceBudget` per device of ``placement`` (cpu included).

    Args:
        limits: ``limits(selector) -> (memory bytes | None, max alloc bytes | None)``.
        kv: the cache types of K and V (default :class:`KVConfig`): their bytes per row.
    """
    out = []
    rk, rv = (kv if kv is not None else KVConfig()).row_bytes(cfg.n_embd_kv)
    kv_block = (rk + rv) * n_ctx  # K and V of one block, in the cache types
    units = placement.units()
    for sel in placement.devices():
        mine = [(i, part) for s, blocks, _, parts in units if s == sel for i, part in zip(blocks, parts)]
        blocks = sorted({i for i, _ in mine})
        n_kv = sum(1 for _, part in mine if part != "ffn")  # a feed-forward half has no cache
        head = placement.head == sel
        sizes = list(weight_bytes(gf, cfg, [*mine, *(["head"] if head else [])]).values())
        n_segments = sum(1 for s, _, _, _ in units if s == sel)
        scratch, largest_scratch = segment_scratch_bytes(cfg, n_batch, head, logits_all)
        scratch *= n_segments
        largest = max(sizes + [max(rk, rv) * n_ctx if n_kv else 0, largest_scratch])
        mem, mx = limits(sel)
        usable = None if mem is None else int(mem * (1.0 - reserve_fraction()))
        out.append(DeviceBudget(sel, blocks, head, sum(sizes), kv_block * n_kv, scratch, largest,
                                mem, usable, mx))
    return out
