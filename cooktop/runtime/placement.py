"""Which device runs each repeating block and the output head.

Offloadable units are the ``n_layer`` blocks plus the output head
(output_norm + output). ``n_gpu_layers = N`` follows current llama.cpp: the
head is offloaded first, then blocks from the last one backwards (N = 1:
head only; N = n_layer + 1: everything; N < 0 or N > n_layer + 1: all;
N = 0: nothing). The token embedding lookup always stays on the host.

The offloaded units are divided among the accelerator devices in proportion
to ``split`` (contiguous ranges in device order, llama.cpp's layer split), or
to each device's memory when no split is given. A unit holding a weight type
its device cannot run stays on the host (``cpu``) with a reason.

Experts (llama.cpp ``--n-cpu-moe N`` / ``--cpu-moe`` / ``-ot REGEX=DEVICE``, :class:`TensorPlacement`):
a block of an architecture with halves (``Architecture.block_attn`` / ``block_ffn``: the MoE
ones) may run its feed-forward half (router, experts, their norm) on another device than its
attention half; the residual rows cross between them. ``n_cpu_moe = N`` keeps the feed-forward
halves of blocks ``0 .. N-1`` on the host; ``-ot`` patterns (Python regexes searched in each
tensor's GGUF name, the first matching pattern wins, as llama.cpp) move the half of a block
holding a matched tensor (or, for the head and for blocks without halves, the whole unit) to
the named device. A block whose device cannot run its feed-forward half but can run its attention
(a device without MoE kernels) keeps the feed-forward half on the host by itself, and one whose
device runs the experts but not the attention (gpt-oss's sinks) keeps the attention there.

A block that reads an earlier block's KV cache (gemma4's shared-KV layers, ``ModelConfig.kv_source``)
runs on that block's device, with a note: the cache is read where it lives (llama.cpp may read it
across devices; cooktop's attention reads one device's buffers).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backends.optable import SPECS
from ..errors import DeviceError, UnsupportedModelError
from ..format.gguf import GGUFFile
from ..format.kvtypes import KVConfig
from ..model.arch import architecture
from ..model.arch.base import MATRIX
from ..model.config import ModelConfig

if TYPE_CHECKING:
    from .budget import DeviceBudget

#: ``supports(selector, op, ggml_type, **dims) -> reason``: why ``op`` cannot run on that device
#: (``""`` when it can), as ``DeviceInfo.supports_op`` answers.
Supports = Callable[..., str]

HOST = "cpu"


@dataclasses.dataclass(frozen=True)
class TensorPlacement:
    """Where expert (or any) tensors go beyond ``-ngl`` (module doc).

    Attributes:
        n_cpu_moe: feed-forward halves of blocks ``0 .. n_cpu_moe - 1`` stay on the host
            (``--n-cpu-moe``; ``--cpu-moe`` is every block: a number >= n_layer).
        override_tensor: ``(pattern, device selector)`` pairs (``-ot REGEX=DEVICE``), in order.
    """

    n_cpu_moe: int = 0
    override_tensor: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def parse(n_cpu_moe: int = 0, cpu_moe: bool = False,
              override_tensor: str | list[str] | tuple[str, ...] | None = None) -> TensorPlacement:
        """From the CLI / API spellings: ``override_tensor`` as ``"REGEX=DEVICE"`` strings (one, a list,
        or comma-separated as llama.cpp's ``-ot a=CPU,b=CPU``); ``CPU`` (any case) means the host.

        Raises:
            DeviceError: a negative count, an item without ``=``, or a pattern that is no regex.
        """
        if n_cpu_moe is None:
            n_cpu_moe = 0
        if int(n_cpu_moe) < 0:
            raise DeviceError(f"--n-cpu-moe must be >= 0, got {n_cpu_moe}")
        items: list[str] = []
        for raw in ([override_tensor] if isinstance(override_tensor, str) else list(override_tensor or ())):
            items += [s for s in str(raw).split(",") if s.strip()]
        pairs = []
        for item in items:
            pat, eq, dev = item.rpartition("=")
            if not eq or not pat or not dev.strip():
                raise DeviceError(f"bad --override-tensor {item!r}: expected REGEX=DEVICE, e.g. exps=CPU")
            try:
                re.compile(pat)
            except re.error as e:
                raise DeviceError(f"bad --override-tensor pattern {pat!r}: {e}") from None
            dev = dev.strip().lower()
            pairs.append((pat, HOST if dev in ("cpu", "host") else dev))
        return TensorPlacement(1 << 30 if cpu_moe else int(n_cpu_moe), tuple(pairs))

    def target(self, names: list[str]) -> str | None:
        """The device of the first pattern matching one of ``names``, or None."""
        for pat, dev in self.override_tensor:
            if any(re.search(pat, n) for n in names):
                return dev
        return None


@dataclasses.dataclass
class Placement:
    """Device selector of each block and of the head, plus why units stayed on the host.

    Attributes:
        blocks: selector per block index (len n_layer).
        head: selector of the output head.
        notes: human-readable reasons (e.g. "block 3 stays on cpu: opencl:0 cannot run matmul on IQ2_XS").
    """

    blocks: list[str]
    head: str
    notes: list[str] = dataclasses.field(default_factory=list)
    budgets: list = dataclasses.field(default_factory=list)  # list[budget.DeviceBudget], set by place()
    n_gpu_layers: int = 0  # the N this placement realises (resolved from "auto")
    #: per block, the device of its feed-forward half when it differs from ``blocks`` (module doc); None: none
    experts: list[str] | None = None

    def expert_device(self, i: int) -> str:
        """The device of block ``i``'s feed-forward half (its experts)."""
        return self.experts[i] if self.experts is not None else self.blocks[i]

    def units(self) -> list[tuple[str, list[int], bool, list[str]]]:
        """Consecutive runs ``(selector, block indices, has_head, parts)`` in execution order; a block
        whose halves are on two devices appears twice, part ``attn`` then ``ffn`` (else ``all``)."""
        seq: list[tuple[str, int, str]] = []
        for i, sel in enumerate(self.blocks):
            e = self.expert_device(i)
            seq += [(sel, i, "all")] if e == sel else [(sel, i, "attn"), (e, i, "ffn")]
        out: list[tuple[str, list[int], bool, list[str]]] = []
        for sel, i, part in seq:
            if out and out[-1][0] == sel:
                out[-1][1].append(i)
                out[-1][3].append(part)
            else:
                out.append((sel, [i], False, [part]))
        if out and out[-1][0] == self.head:
            out[-1] = (self.head, out[-1][1], True, out[-1][3])
        else:
            out.append((self.head, [], True, []))
        return out

    def segments(self) -> list[tuple[str, list[int], bool]]:
        """Consecutive runs ``(selector, block indices, has_head)`` in execution order (:meth:`units`
        without the parts: a block split in two is in two runs)."""
        return [(sel, blocks, head) for sel, blocks, head, _ in self.units()]

    def devices(self) -> list[str]:
        """Distinct selectors used, in execution order."""
        seen: list[str] = []
        for sel, _, _, _ in self.units():
            if sel not in seen:
                seen.append(sel)
        return seen

    def n_offloaded(self) -> int:
        """Units (blocks + head) not on the host."""
        return sum(s != HOST for s in self.blocks) + (self.head != HOST)

    def summary(self) -> str:
        """One line, e.g. ``offloaded 6/6 layers: opencl:0 blocks 0-4 + output``."""
        n_units = len(self.blocks) + 1
        parts = []
        for sel in self.devices():
            if sel == HOST:
                continue
            blocks = [i for i, s in enumerate(self.blocks) if s == sel]
            desc = f"blocks {_span(blocks)}" if len(blocks) > 1 else (f"block {blocks[0]}" if blocks else "")
            if self.head == sel:
                desc = f"{desc} + output" if desc else "output"
            if desc:
                parts.append(f"{sel} {desc}")
        where = ", ".join(parts) if parts else "all on cpu"
        moved = [i for i in range(len(self.blocks)) if self.expert_device(i) != self.blocks[i]]
        if moved:
            where += f"; experts of blocks {_span(moved)} on " + ",".join(
                dict.fromkeys(self.expert_device(i) for i in moved))
        return f"offloaded {self.n_offloaded()}/{n_units} layers: {where}"


def _span(blocks: list[int]) -> str:
    """``0-3,5`` for [0, 1, 2, 3, 5]."""
    out, start = [], blocks[0]
    for a, b in zip(blocks, [*blocks[1:], None]):
        if b != a + 1:
            out.append(f"{start}-{a}" if a != start else f"{a}")
            start = b if b is not None else a
    return ",".join(out)


def parse_ngl(value: int | str) -> int | str:
    """``-ngl`` / ``n_gpu_layers`` value: an int >= -1 (-1 = all), ``"all"`` (-1) or ``"auto"``.

    Raises:
        DeviceError: anything else, a negative other than -1 included (llama.cpp: -1 = all).
    """
    if isinstance(value, bool):
        raise DeviceError(f"bad -ngl / n_gpu_layers {value!r}: expected an integer, -1 (all) or auto")
    if isinstance(value, int):
        n = value
    elif str(value).strip().lower() == "auto":
        return "auto"
    elif str(value).strip().lower() == "all":
        return -1
    else:
        try:
            n = int(str(value).strip())
        except ValueError:
            raise DeviceError(f"bad -ngl / n_gpu_layers {value!r}: expected an integer, -1 (all) or auto") from None
    if n < -1:
        raise DeviceError(f"bad -ngl / n_gpu_layers {n}: layers cannot be negative (-1 = all, auto = as many as fit)")
    return n


def unit_types(gf: GGUFFile, cfg: ModelConfig, unit: int | str, part: str = "all") -> set:
    """GGML types of the matrix weights of block ``unit`` (int; ``part`` ``all``/``attn``/``ffn``) or
    of ``"head"``, from the architecture's tensors (``model/arch``; norms and biases are uploaded
    as float32)."""
    tensors = architecture(cfg.arch).unit_tensors(gf.tensors, unit, part)
    return {gf.tensor(name).ggml_type for name, spec in tensors.values() if spec.kind == MATRIX}


def offloaded_units(n_layer: int, n_gpu_layers: int) -> tuple[list[int], bool]:
    """Which blocks are offloaded for ``n_gpu_layers`` (llama.cpp order), and whether the head is.

    Returns:
        (sorted block indices, head offloaded)
    """
    if n_gpu_layers < 0 or n_gpu_layers > n_layer + 1:
        n_gpu_layers = n_layer + 1
    if n_gpu_layers == 0:
        return [], False
    n_blocks = n_gpu_layers - 1
    return list(range(n_layer - n_blocks, n_layer)), True


def split_contiguous(blocks: list[int], weights: list[float]) -> list[list[int]]:
    """Divide ``blocks`` into ``len(weights)`` contiguous ranges in proportion to ``weights``.

    As llama.cpp's layer split (llama-model.cpp): block j of n goes to the first
    device whose cumulative share exceeds j / n (``upper_bound`` on the shares).
    """
    import bisect

    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise DeviceError("--split proportions must be >= 0 and add up to more than 0")
    cum, acc = [], 0.0
    for w in weights:
        acc += w / total
        cum.append(acc)
    out: list[list[int]] = [[] for _ in weights]
    n = len(blocks)
    for j, b in enumerate(blocks):
        d = min(bisect.bisect_right(cum, j / n), len(weights) - 1)
        out[d].append(b)
    return out


def plan(gf: GGUFFile, cfg: ModelConfig, selectors: list[str], n_gpu_layers: int,
         split: list[float] | None, supports: Supports,
         memory: Callable[[str], int | None] | None = None, tensors: TensorPlacement | None = None) -> Placement:
    """Assign every block and the head to a device, then the feed-forward halves (module doc).

    Args:
        selectors: resolved device selectors in order (``cpu`` alone means no offload).
        n_gpu_layers: llama.cpp semantics (module doc).
        split: proportions per selector, or None (by device memory, equal if unknown).
        supports: ``supports(selector, op, ggml_type, **dims) -> reason`` of each device (``""``: it
            can; :meth:`~cooktop.backends.info.DeviceInfo.supports_op`).
        memory: device memory in bytes per selector (for the default split).
        tensors: ``--n-cpu-moe`` / ``-ot`` (:class:`TensorPlacement`), or None.
    Raises:
        DeviceError: ``split`` has the wrong length.
    """
    p, by_ngl = _plan_blocks(gf, cfg, selectors, n_gpu_layers, split, supports, memory, tensors)
    _place_halves(gf, cfg, p, by_ngl, supports, tensors or TensorPlacement())
    return p


def _plan_blocks(gf: GGUFFile, cfg: ModelConfig, selectors: list[str], n_gpu_layers: int,
                 split: list[float] | None, supports: Supports,
                 memory: Callable[[str], int | None] | None, tensors: TensorPlacement | None
                 ) -> tuple[Placement, list[str]]:
    """The block and head devices of :func:`plan` (``-ngl``, ``--split``, ``-ot`` of whole units or
    attention halves), and each block's device by ``-ngl`` alone (where its other half goes)."""
    arch = architecture(cfg.arch)
    blocks = [HOST] * cfg.n_layer
    head = HOST
    notes: list[str] = []
    targets = [s for s in selectors if s != HOST] if selectors != [HOST] else []
    if HOST in selectors and targets:
        targets = list(selectors)  # an explicit cpu in a list takes a share like any device
    if split is not None and targets and len(split) != len(targets):
        raise DeviceError(f"--split has {len(split)} values but --device names {len(targets)} devices "
                          f"({','.join(targets)})")
    off_blocks, off_head = offloaded_units(cfg.n_layer, n_gpu_layers) if targets else ([], False)
    if split is None:
        mems = [(memory(s) if memory else None) or 1 for s in targets]
        split = [float(m) for m in mems]
    if targets:
        ranges = split_contiguous(off_blocks, split)
        for sel, rng in zip(targets, ranges):
            for b in rng:
                blocks[b] = sel
    if off_head:  # the head goes where llama.cpp's rule puts layer n_layer: the last device with a share
        head = [sel for sel, w in zip(targets, split) if w > 0][-1]
    by_ngl = list(blocks)
    if tensors is not None and tensors.override_tensor:  # -ot: whole units (halves: _place_halves)
        t = tensors.target([n for n, _ in arch.unit_tensors(gf.tensors, "head").values()])
        head = t or head
        for i in range(cfg.n_layer):
            part = "attn" if arch.has_halves else "all"
            t = tensors.target([n for n, _ in arch.unit_tensors(gf.tensors, i, part).values()])
            blocks[i] = t or blocks[i]
    for i, sel in enumerate(blocks):
        if sel != HOST:
            why = why_not_on(gf, cfg, i, sel, supports)
            if why and arch.has_halves:
                why_attn = why_not_on(gf, cfg, i, sel, supports, "attn")
                if not why_attn:
                    continue  # the attention half runs there; _place_halves keeps the rest on the host
                if not why_not_on(gf, cfg, i, sel, supports, "ffn") and by_ngl[i] == sel:
                    notes.append(f"block {i}: attention stays on cpu: {why_attn}")  # the experts run there
                    blocks[i] = HOST
                    continue
            if why:
                notes.append(f"block {i} stays on cpu: {why}")
                blocks[i] = HOST
    if head != HOST:
        why = why_not_on(gf, cfg, "head", head, supports)
        if why:
            notes.append(f"output head stays on cpu: {why}")
            head = HOST
    for i in range(cfg.n_layer):  # a block reading another block's cache (gemma4) runs where that cache is
        src = cfg.kv_source(i)
        if src != i and blocks[i] != blocks[src]:
            notes.append(f"block {i} runs on {blocks[src]} with block {src}, whose KV cache it reads")
            blocks[i] = blocks[src]
    return Placement(blocks, head, notes), by_ngl


def _place_halves(gf: GGUFFile, cfg: ModelConfig, p: Placement, by_ngl: list[str],
                  supports: Supports, tensors: TensorPlacement) -> None:
    """Set ``p.experts`` (module doc): the block's ``-ngl`` device (``by_ngl``), unless ``n_cpu_moe`` or
    an ``-ot`` pattern on a feed-forward tensor says otherwise; a half that cannot run where it
    was sent stays on the host with a note."""
    arch = architecture(cfg.arch)
    if not arch.has_halves:
        return
    experts = list(by_ngl)
    for i in range(cfg.n_layer):
        sel = by_ngl[i]
        t = tensors.target([n for n, _ in arch.unit_tensors(gf.tensors, i, "ffn").values()])
        if t is not None:
            experts[i] = t
        elif i < tensors.n_cpu_moe:
            experts[i] = HOST
        why = why_not_on(gf, cfg, i, experts[i], supports, "ffn") if experts[i] != HOST else ""
        if why:
            if experts[i] == sel:
                p.notes.append(f"block {i}: experts stay on cpu: {why}")
            else:
                p.notes.append(f"block {i}: experts stay on cpu, not {experts[i]}: {why}")
            experts[i] = HOST
    p.experts = experts if experts != p.blocks else None


def unit_dims(cfg: ModelConfig, op: str) -> dict[str, int]:
    """The dimensions of ``op`` in this model's units that a device may cap (``OpSpec.limits``):
    ``head_dim`` for rope and attention, the row ``width`` of norms, the widest matmul input."""
    known = {"head_dim": cfg.head_dim, "width": cfg.n_embd,
             "n_in": max(cfg.n_embd, cfg.n_ff, cfg.n_embd_q, cfg.n_ff_exp, cfg.n_ff_shexp)}
    return {d: known[d] for d in SPECS[op].limits if d in known}


def why_not_on(gf: GGUFFile, cfg: ModelConfig, unit: int | str, sel: str, supports: Supports,
               part: str = "all") -> str:
    """Why block ``unit`` (int; ``part`` ``all``/``attn``/``ffn``) or the ``"head"`` cannot run on
    ``sel``, or "" when it can: an op of the architecture's block (half) or head the device lacks
    or caps below this model's dimensions (e.g. Vulkan's attention with head_dim > 256), or a
    matrix type its matmul cannot run. The ops are those the unit's (half's) code calls with the
    file's tensors (``Architecture.ops``)."""
    ops = architecture(cfg.arch).ops(cfg, unit, gf.tensors, part)
    why = [r for op in ops if (r := supports(sel, op, None, **unit_dims(cfg, op)))]
    if why:
        return "; ".join(why)
    bad = [t for t in unit_types(gf, cfg, unit, part) if supports(sel, "matmul", t)]
    if bad:
        return f"{sel} cannot run matmul on {', '.join(sorted(t.name for t in bad))}"
    return ""


def check_runnable(gf: GGUFFile, cfg: ModelConfig, p: Placement, selectors: list[str],
                   supports: Supports) -> None:
    """Refuse a placement where a matrix weight's type cannot run on the device it landed on:
    :func:`plan` only moves a unit back to the host, so no device in use can run that type.

    Raises:
        UnsupportedModelError: naming the file, the tensor, its type and the devices in use.
    """
    units: list[tuple[int | str, str, str]] = [("head", p.head, "all")]
    for sel, blocks, _, parts in p.units():
        units += [(i, sel, part) for i, part in zip(blocks, parts)]
    for unit, sel, part in units:
        for name, spec in architecture(cfg.arch).unit_tensors(gf.tensors, unit, part).values():
            ty = gf.tensor(name).ggml_type
            if spec.kind == MATRIX and supports(sel, "matmul", ty):
                raise UnsupportedModelError(
                    f"{gf.path}: tensor {name} is {ty.name}, a type no device in use "
                    f"({', '.join(dict.fromkeys([HOST, *selectors]))}) can run matmul on")


def place(gf: GGUFFile, cfg: ModelConfig, selectors: list[str], n_gpu_layers: int | str,
          split: list[float] | None, supports: Supports,
          limits: Callable[[str], tuple[int | None, int | None]],
          n_ctx: int, n_batch: int, logits_all: bool, tensors: TensorPlacement | None = None,
          kv: KVConfig | None = None, n_seq: int = 1) -> Placement:
    """:func:`plan` plus memory: resolve ``-ngl auto`` and refuse what cannot fit.

    ``n_gpu_layers == "auto"`` picks the largest N (n_layer + 1 down to 0) whose
    every device budget fits (``runtime/budget.py``). An explicit N that does not
    fit is refused before anything is allocated. The host counts the same way, but
    only its KV cache and scratch buffers (its weights stay memory-mapped), against
    ``limits(HOST)`` (the machine's memory, or ``COOKTOP_DEVICE_MEMORY=cpu=...``).

    Args:
        limits: ``limits(selector) -> (memory bytes, max allocation bytes)`` (None = unknown).
        kv: the KV cache types the budgets count (default :class:`KVConfig`).
        n_seq: sequences sharing the cache (their K/V and recurrent states are counted).
    Raises:
        DeviceOutOfMemoryError: an explicit N does not fit a device, or the host's part does not fit
            its memory (the message names it and the sizes).
        DeviceError: bad ``split``.
        UnsupportedModelError: a weight type no device in use can run (:func:`check_runnable`).
    """
    from ..errors import CooktopError, DeviceOutOfMemoryError
    from .budget import budgets, reserve_fraction

    def host_free(sel: str):
        return (None, None) if sel == HOST else limits(sel)

    try:
        host_mem = limits(HOST)[0]
    except CooktopError:  # no host entry (never for the local registry)
        host_mem = None

    def host_problem(p: Placement) -> str:
        b = next((b for b in p.budgets if b.selector == HOST), None)
        if b is None or host_mem is None:
            return ""
        need, usable = b.kv_bytes + b.state_bytes + b.scratch_bytes, int(host_mem * (1.0 - reserve_fraction()))
        if need <= usable:
            return ""
        what = "KV cache, recurrent states and buffers" if b.state_bytes else "KV cache and buffers"
        return (f"at -c {n_ctx} the host's {what} need {need / 2**20:.1f} MiB but "
                f"{usable / 2**20:.1f} MiB of memory is usable ({host_mem / 2**20:.1f} MiB minus reserve)")

    def memory(sel: str):
        return limits(sel)[0]

    candidates = range(cfg.n_layer + 1, -1, -1) if n_gpu_layers == "auto" else [int(n_gpu_layers)]
    last: DeviceBudget | None = None
    for n in candidates:
        p = plan(gf, cfg, selectors, n, split, supports, memory, tensors)
        check_runnable(gf, cfg, p, selectors, supports)
        p.n_gpu_layers = n if any(s != HOST for s in selectors) else 0
        p.budgets = budgets(gf, cfg, p, n_ctx, n_batch, logits_all, host_free, kv, n_seq)
        bad = [b for b in p.budgets if not b.fits]
        on_host = host_problem(p)
        if on_host and not bad:
            if n_gpu_layers != "auto" or n == 0:
                raise DeviceOutOfMemoryError(f"{on_host}; use a smaller -c (or offload more layers with -ngl)")
            continue
        if not bad:
            if n_gpu_layers == "auto" and p.n_gpu_layers:  # counted as summary() counts: units off the host
                shared = f" (-ngl {n}; cpu, named in --device, runs its share)" if p.n_offloaded() != n else ""
                p.notes.append(f"-ngl auto offloaded {p.n_offloaded()} of {cfg.n_layer + 1} layers{shared}")
            return p
        last = bad[0]
    if n_gpu_layers == "auto":  # N = 0 puts nothing on devices, so it always fits
        raise AssertionError("unreachable: -ngl 0 always fits")
    assert last is not None  # an explicit N runs the loop once, and it did not fit
    raise DeviceOutOfMemoryError(
        f"-ngl {n_gpu_layers} does not fit on {last.selector}: {last.why_not}; "
        f"use {last.remedy}")
