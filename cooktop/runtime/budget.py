"""Memory a placement needs on each device, and whether it fits.

Per device (bytes), for the blocks and head placed on it (the same buffers
``model/forward.py`` ``Segment`` and ``KVCache`` allocate):

- weights: the tensors the architecture declares for those units (``model/arch``):
  the GGUF byte size of each matrix (raw GGML blocks, uploaded as is), 4 bytes per
  value for norm and bias weights (uploaded as float32);
- KV cache: ``cells x (row bytes of K + row bytes of V)`` per block that keeps K/V, ``cells`` being
  ``n_ctx``, or for a sliding-window block its window cache's ``min(n_ctx, GGML_PAD(n_swa + n_batch, 256))``
  (``model/swa.py``: llama.cpp's iSWA cache; all ``n_ctx`` with ``--swa-full``) (a recurrent block
  and a block reading an earlier block's cache, gemma4's shared-KV layers, keep none), a row being
  that block's ``n_head_kv x head_dim`` values in the cache's type (``-ctk``/``-ctv``: 4 bytes a value for f32,
  2 for f16, 34/32 for q8_0, 18/32 for q4_0; ``format/kvtypes.py``), for one sequence (the
  engine's default one); each further sequence (``Engine.new_sequence``) needs as much again;
- scratch: ``4 x n_batch x (sum of the architecture's scratch widths + 1)`` per segment
  (llama: ``5 n_embd + 2 n_embd_kv + 2 n_ff``; the 1 is the positions), plus for the
  head ``4 x (1 + n_embd + R x n_vocab)`` with R = n_batch when logits_all else 1; and once per
  device holding a KV cache (not the host's numpy), attention's scratch
  (``chunked.attention_scratch_bytes``: the scores of ``-fa off``, at most 64 MiB; with flash
  attention the split-K partials of decode, plus those scores on Vulkan, whose CPU drivers run flash
  attention through the score kernels: a GPU's figure is an upper bound).

A device fits when the total is within its usable memory (probed global memory
minus a reserve of ``COOKTOP_MEMORY_RESERVE`` percent, default 5) and no buffer
that cannot be cut exceeds its maximum allocation size (``DeviceInfo.max_buffer_bytes``
and ``max_alloc_bytes``: Vulkan's ``maxStorageBufferRange`` / ``maxBufferSize`` /
``maxMemoryAllocationSize``, OpenCL's ``CL_DEVICE_MAX_MEM_ALLOC_SIZE``). Weight matrices
(2-D and 3-D) and the logits are stored in row chunks past that size (``backends/chunked.py``),
so they do not count as one buffer; a chunked matrix adds the scratch of one chunk's output
(``4 x n_batch x rows``, times ``n_expert_used`` for an expert tensor, at most the max
allocation). Expert tensors ``[n_expert, n_out, n_in]`` are cut the same way (the same output
rows of every expert). What must be one buffer: the KV cache of a block (one of K or V), the
other scratch buffers.
``COOKTOP_DEVICE_MEMORY`` overrides probed sizes to simulate small devices:
``opencl:0=512MiB,vulkan:0=2GiB/256MiB`` (memory, optionally ``/`` max allocation; an
opened device cuts its buffers by that max allocation too).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from .. import settings
from ..backends.chunked import attention_scratch_bytes
from ..errors import DeviceError
from ..format.gguf import GGUFFile
from ..format.kvtypes import KVConfig
from ..model import swa
from ..model.arch import architecture
from ..model.arch.base import MATRIX
from ..model.config import ModelConfig


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
    #: what the largest buffer that must be one allocation is (``KV cache``, a tensor name, ``scratch``)
    largest_what: str = ""
    #: weight matrices stored in row chunks here (past ``max_alloc_bytes``)
    chunked: list[str] = dataclasses.field(default_factory=list)
    #: the recurrent states of this device's recurrent blocks (f32, every sequence; 0 without)
    state_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.state_bytes + self.scratch_bytes

    @property
    def why_not(self) -> str:
        """Empty when it fits, else the reason (figures that differ, :func:`size_texts`)."""
        if self.usable_bytes is not None and self.total_bytes > self.usable_bytes:
            need, usable, *mem = size_texts(self.total_bytes, self.usable_bytes,
                                            *([self.memory_bytes] if self.memory_bytes is not None else []))
            return f"needs {need} but {usable} is usable ({mem[0] if mem else '?'} minus reserve)"
        if self.max_alloc_bytes is not None and self.largest_alloc_bytes > self.max_alloc_bytes:
            what = f" ({self.largest_what})" if self.largest_what else ""
            big, mx = size_texts(self.largest_alloc_bytes, self.max_alloc_bytes)
            return f"largest buffer that cannot be split{what} {big} exceeds the maximum allocation {mx}"
        return ""

    @property
    def remedy(self) -> str:
        """The options that make what :attr:`why_not` names smaller (empty when it fits): the
        scratch scales with ``-b`` (module doc), the KV cache with ``-c`` and its types."""
        if self.fits:
            return ""
        if self.usable_bytes is not None and self.total_bytes > self.usable_bytes:
            return "-ngl auto, a smaller -ngl, a smaller -c, or another device"
        if self.largest_what == "scratch":
            return "a smaller -b (the scratch scales with the batch size), -ngl auto, a smaller -ngl, or another device"
        if self.largest_what == "KV cache":
            return "a smaller -c or a smaller -ctk/-ctv type, -ngl auto, a smaller -ngl, or another device"
        return "-ngl auto, a smaller -ngl, or another device"

    @property
    def fits(self) -> bool:
        return not self.why_not

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(total_bytes=self.total_bytes, fits=self.fits, why_not=self.why_not)
        return d


def size_texts(*sizes: int) -> list[str]:
    """``sizes`` (bytes) as text that tells them apart: ``"1536.0 MiB"``; KiB when all are under
    1 MiB (``"64.0 KiB"``); bytes (``"65536 bytes"``) when two different sizes would read the same."""
    unit, div = ("KiB", 2**10) if max(sizes) < 2**20 else ("MiB", 2**20)
    out = [f"{n / div:.1f} {unit}" for n in sizes]
    if len(set(out)) < len(set(sizes)):
        return [f"{n} bytes" for n in sizes]
    return out


def memory_overrides() -> dict[str, tuple[int, int | None]]:
    """Parse ``COOKTOP_DEVICE_MEMORY`` into selector -> (memory, max alloc or None)
    (:func:`cooktop.settings.device_memory`).

    Raises:
        DeviceError: malformed value.
    """
    return settings.device_memory()


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
    """(total scratch bytes, largest scratch buffer that must be one allocation) of one segment
    (module doc formula; the logits can be split into row chunks, so they are not in the second)."""
    B = n_batch
    arch = architecture(cfg.arch)
    i32 = arch.scratch_i32(cfg) if arch.scratch_i32 is not None else {}
    widths = list(arch.scratch(cfg).values()) + list(i32.values())
    sizes = [4 * B * width for width in widths] + [4 * B]
    largest = max(sizes)
    if head:
        sizes += [4, 4 * cfg.n_embd, 4 * (B if logits_all else 1) * cfg.n_vocab]
    return sum(sizes), largest


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


def recurrent_state_bytes(cfg: ModelConfig, blocks: list[int] | None = None, n_seq: int = 1) -> int:
    """Bytes of the recurrent states of ``blocks`` (default: every block) for ``n_seq`` sequences:
    f32 ``Architecture.state_widths`` values per sequence and block (``model/recurrent.py``); 0 without
    recurrent layers."""
    widths = architecture(cfg.arch).state_widths
    if widths is None:
        return 0
    return 4 * n_seq * sum(sum(widths(cfg, i)) for i in (range(cfg.n_layer) if blocks is None else blocks))


def budgets(gf: GGUFFile, cfg: ModelConfig, placement, n_ctx: int, n_batch: int, logits_all: bool,
            limits, kv: KVConfig | None = None, n_seq: int = 1) -> list[DeviceBudget]:
    """One :class:`DeviceBudget` per device of ``placement`` (cpu included).

    Args:
        limits: ``limits(selector) -> (memory bytes | None, max alloc bytes | None)``.
        kv: the cache types of K and V (default :class:`KVConfig`): their bytes per row.
        n_seq: sequences sharing the cache: each has ``n_ctx`` K/V rows per attention block and a
            recurrent state per recurrent block (``model/forward.py``'s ``KVCache``).
    """
    out = []
    kvc = kv if kv is not None else KVConfig()

    def kv_rows(i: int) -> tuple[int, int]:  # bytes of one K and one V row of block i (0: it keeps none)
        return kvc.row_bytes(cfg.kv_width(i)) if cfg.has_kv(i) else (0, 0)
    # cells per sequence of each block: a sliding-window block keeps its window only (model/swa.py)
    n_swa_cells = swa.swa_cells(cfg, n_ctx, n_batch, kvc.swa_full, (kvc.type_k, kvc.type_v))
    cells = [swa.kv_cells(cfg, i, n_ctx, n_swa_cells) for i in range(cfg.n_layer)]
    units = placement.units()
    for sel in placement.devices():
        mine = [(i, part) for s, blocks, _, parts in units if s == sel for i, part in zip(blocks, parts)]
        blocks = sorted({i for i, _ in mine})
        # a feed-forward half and a recurrent block have no K/V; a recurrent block has its state (per sequence)
        # a block reading an earlier block's cache (gemma4's shared-KV layers) has none of its own either
        kv_mine = [(kv_rows(i), cells[i]) for i, part in mine if part != "ffn" and cfg.has_kv(i)]
        n_kv = sum(1 for i, part in mine if part != "ffn" and not cfg.is_recurrent(i))
        kv_bytes = sum((rk + rv) * c for (rk, rv), c in kv_mine) * n_seq  # every sequence, in the cache types
        state = sum(recurrent_state_bytes(cfg, [i], n_seq) for i, part in mine if part != "ffn")
        head = placement.head == sel
        sizes = weight_bytes(gf, cfg, [*mine, *(["head"] if head else [])])
        n_segments = sum(1 for s, _, _, _ in units if s == sel)
        scratch, largest_scratch = segment_scratch_bytes(cfg, n_batch, head, logits_all)
        scratch *= n_segments
        if n_kv and sel != "cpu":  # attention's scratch, one per device (chunked.scratch)
            flash = (kv if kv is not None else KVConfig()).flash_attn != "off"
            # a Vulkan device's flash attention may be the score kernels' (a CPU driver: vulkan/attention.py)
            scratch += attention_scratch_bytes(cfg.n_head, cfg.head_dim, n_ctx, n_batch, flash,
                                               sel.startswith("vulkan"))
        mem, mx = limits(sel)
        # matrices past the max allocation go in row chunks (module doc); anything else must fit whole
        chunked = [n for n, b in sizes.items() if mx is not None and b > mx and len(gf.tensor(n).shape) in (2, 3)]
        whole = {n: b for n, b in sizes.items() if n not in chunked}
        whole.update({"KV cache": max((max(r) * c for r, c in kv_mine), default=0) * n_seq,
                      "scratch": largest_scratch})
        what = max(whole, key=lambda n: whole[n])
        if chunked:  # the scratch of one chunk's output (chunked.matmul / matmul_id: k slots)
            scratch += min(mx or 0, 4 * n_batch * max(gf.tensor(n).shape[-2] * (cfg.n_expert_used or 1)
                                                      if len(gf.tensor(n).shape) == 3 else gf.tensor(n).shape[0]
                                                      for n in chunked))
        usable = None if mem is None else int(mem * (1.0 - reserve_fraction()))
        out.append(DeviceBudget(sel, blocks, head, sum(sizes.values()), kv_bytes, scratch, whole[what],
                                mem, usable, mx, what, chunked, state))
    return out
