"""``cooktop bench --ops``: the roofline view of each device, op by op.

Per device:

1. **copy** of a large float32 buffer (256 MiB, or 1/8 of the device memory or its
   largest allocation if smaller; 64 MiB with ``--quick``): the practical peak bandwidth,
   GB/s = 2 x bytes (read + write) / seconds (STREAM's "copy" convention).
   Devices without a copy kernel report that, and percentages are then taken
   relative to the best bandwidth measured among their 1-token matmuls.
2. **matmul** for each weight type the device runs, at the shapes of a real model
   (``cooktop.tools.synth.SHAPES``, default tinyllama-1.1b): ``n_embd x n_embd``,
   ``n_ff x n_embd`` and ``n_vocab x n_embd`` at 1 token (matrix-vector: generation,
   bandwidth-bound), and the first two at 512 tokens (prompt processing,
   compute-bound; the output head runs on one row in a prompt, so it is not
   measured at 512). bytes = weight bytes (GGML blocks) + x (n x n_in x 4) +
   out (n x n_out x 4); FLOP = 2 x n x n_in x n_out.
3. **rmsnorm** of ``[n, n_embd]`` at 1 and 512 tokens: bytes = 2 x n x n_embd x 4 + n_embd x 4.

Each row is the median over timed samples; a sample is ``k`` back-to-back calls
followed by ``Device.synchronize()``, divided by ``k`` (``k`` makes a sample last about
20 ms), after two warm-up calls (kernel compilation, the numpy backend's
dequantized-weight cache). Weights are :func:`cooktop.format.quants.random_weight`
blocks (up to 256 distinct rows, tiled to the full height: the bytes streamed
are the same).

The numpy backend keeps float32 copies of quantized weights (backends/cpu/), so
its matmul GB/s counts the quantized bytes while it actually reads 4-byte floats.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends import registry
from ..backends.base import DEVICE_WEIGHT_TYPES, Device, row_bytes, type_name
from ..errors import CooktopError, UnsupportedOpError
from ..format.quants import random_weight
from ..tools.synth import SHAPES, Shape


@dataclasses.dataclass
class OpRow:
    """One measured op: median seconds per call, bytes moved and FLOP per call."""

    op: str
    ggml_type: str
    shape: str
    n_tokens: int
    seconds: float | None
    nbytes: int
    flops: int
    samples: int = 0
    note: str = ""

    @property
    def gbps(self) -> float | None:
        """Bytes moved per second, in GB/s (1e9 bytes)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds else None

    @property
    def gflops(self) -> float | None:
        """GFLOP/s (1e9 floating-point operations per second); None for ops counted in bytes only."""
        return self.flops / self.seconds / 1e9 if self.seconds and self.flops else None


@dataclasses.dataclass
class DeviceOps:
    """Every op row of one device, its bandwidth peak and where the peak came from.

    ``peak_source`` is ``"copy"`` or ``"best matmul"`` (no copy kernel); ``error`` is set
    when the device could not be opened (then there are no rows).
    """

    device: str
    name: str = ""
    rows: list[OpRow] = dataclasses.field(default_factory=list)
    peak_gbps: float | None = None
    peak_source: str = "copy"
    copy_note: str = ""
    error: str | None = None

    def pct(self, row: OpRow) -> float | None:
        """Row bandwidth as a percentage of the device's peak."""
        if row.gbps is None or not self.peak_gbps:
            return None
        return 100.0 * row.gbps / self.peak_gbps


@dataclasses.dataclass(frozen=True)
class OpsPlan:
    """What ``--ops`` measures: shapes (label, n_out, n_in, token counts), types, timing budget."""

    matmuls: tuple[tuple[str, int, int, tuple[int, ...]], ...]
    norm_tokens: tuple[int, ...]
    n_embd: int
    copy_bytes: int
    min_time: float
    types: tuple[T, ...] | None = None


def make_plan(shape: str = "tinyllama-1.1b", quick: bool = False, types: list[str] | None = None) -> OpsPlan:
    """The measurements for a named shape (``--shape``); ``quick`` keeps to ``n_embd x n_embd`` and
    ``n_ff x n_embd`` at 1 token and ``n_embd x n_embd`` at 32, a 64 MiB copy and shorter timing.

    Raises:
        CooktopError: unknown shape or type name.
    """
    if shape not in SHAPES:
        raise CooktopError(f"unknown --shape {shape!r}; choose one of {', '.join(SHAPES)}")
    s: Shape = SHAPES[shape]
    tys = None
    if types:
        try:
            tys = tuple(T[t.strip().upper()] for t in types)
        except KeyError as e:
            raise CooktopError(f"unknown GGML type {e.args[0]!r} in --types") from None
    mm: tuple[tuple[str, int, int, tuple[int, ...]], ...]
    if quick:
        mm = (("n_embd x n_embd", s.n_embd, s.n_embd, (1, 32)), ("n_ff x n_embd", s.n_ff, s.n_embd, (1,)))
        return OpsPlan(mm, (1, 32), s.n_embd, 64 << 20, 0.05, tys)
    mm = (("n_embd x n_embd", s.n_embd, s.n_embd, (1, 512)), ("n_ff x n_embd", s.n_ff, s.n_embd, (1, 512)),
          ("n_vocab x n_embd", s.n_vocab, s.n_embd, (1,)))
    return OpsPlan(mm, (1, 512), s.n_embd, 256 << 20, 0.25, tys)


def time_call(dev: Device, fn: Callable[[], None], min_time: float, max_samples: int = 15) -> tuple[float, int]:
    """Median seconds per call of ``fn`` on ``dev`` and the number of samples (module doc)."""
    for _ in range(2):  # warm-up: compile, cache
        t0 = time.perf_counter()
        fn()
        dev.synchronize()
        one = time.perf_counter() - t0
    k = max(1, min(100, int(0.02 / max(one, 1e-6))))
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_samples:
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        dev.synchronize()
        samples.append((time.perf_counter() - t0) / k)
        elapsed = time.perf_counter() - start
        if (elapsed >= min_time and len(samples) >= 3) or (elapsed >= 4 * min_time + 1.0 and len(samples) >= 1):
            break
    return statistics.median(samples), len(samples)


def _weight(ggml_type: T, n_out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """A ``[n_out, n_in]`` weight in GGML layout: up to 256 random rows tiled to ``n_out``."""
    rows = min(n_out, 256)
    w = random_weight(ggml_type, (rows, n_in), rng)
    reps = -(-n_out // rows)
    return np.ascontiguousarray(np.tile(w, (reps, 1))[:n_out])


def _copy_row(dev: Device, nbytes: int, min_time: float) -> OpRow:
    n_cols = 4096
    n_rows = max(1, nbytes // (4 * n_cols))
    shape = f"{n_rows} x {n_cols} f32 ({n_rows * n_cols * 4 >> 20} MiB)"
    with dev.buffer("bench --ops copy") as buf:
        x = buf.empty((n_rows, n_cols))
        out = buf.empty((n_rows, n_cols))
        dev.write(x, np.ones((n_rows, n_cols), dtype=np.float32))
        try:
            dev.copy(out, x)
        except UnsupportedOpError:
            return OpRow("copy", "F32", shape, 0, None, 0, 0, note="not supported on this backend")
        sec, k = time_call(dev, lambda: dev.copy(out, x), min_time)
    return OpRow("copy", "F32", shape, 0, sec, 2 * n_rows * n_cols * 4, 0, k)


def bench_ops(selectors: list[str], plan: OpsPlan, tick: Callable[[str], None] | None = None,
              seed: int = 0) -> list[DeviceOps]:
    """Run the ``--ops`` measurements on every device of ``selectors`` (see module doc).

    A device that cannot be opened gets a :class:`DeviceOps` with ``error`` set;
    an op that fails on a device gets a row with ``note`` set. Never raises for a device.
    """
    tick = tick or (lambda msg: None)
    out: list[DeviceOps] = []
    devs: dict[str, Device] = {}
    for sel in selectors:
        d = DeviceOps(sel)
        try:
            dev = registry.open_device(sel)
            d.name = dev.info.name
            devs[sel] = dev
        except CooktopError as e:
            d.error = str(e)
        out.append(d)
    ops = {d.device: d for d in out}
    for sel, dev in devs.items():  # copy first: the peak
        tick(f"{sel} copy")
        caps = [c for c in (dev.info.global_mem_bytes and dev.info.global_mem_bytes // 8,
                            dev.info.max_alloc_bytes) if c]
        nbytes = min([plan.copy_bytes] + caps)
        try:
            row = _copy_row(dev, nbytes, plan.min_time)
        except Exception as e:  # noqa: BLE001 - a broken op is a row, not a crash
            row = OpRow("copy", "F32", "", 0, None, 0, 0, note=_err(e))
        ops[sel].rows.append(row)
        ops[sel].copy_note = row.note
        ops[sel].peak_gbps = row.gbps
    rng = np.random.default_rng(seed)
    types = plan.types or DEVICE_WEIGHT_TYPES
    for ty in types:
        users = {s: d for s, d in devs.items() if d.supports("matmul", ty)}
        for sel in set(devs) - set(users):
            ops[sel].rows.append(OpRow("matmul", type_name(ty), "", 0, None, 0, 0, note="type not supported"))
        if not users:
            continue
        for label, n_out, n_in, token_counts in plan.matmuls:
            try:
                host_w = _weight(ty, n_out, n_in, rng)
            except (UnsupportedOpError, NotImplementedError) as e:
                for sel in users:
                    ops[sel].rows.append(OpRow("matmul", type_name(ty), label, 0, None, 0, 0, note=_err(e)))
                continue
            wbytes = n_out * row_bytes(ty, n_in)
            for sel, dev in users.items():
                for n in token_counts:
                    tick(f"{sel} matmul {type_name(ty)} {label} n={n}")
                    ops[sel].rows.append(_matmul_row(dev, ty, host_w, label, n_out, n_in, n, wbytes, plan, rng))
            del host_w
    for sel, dev in devs.items():
        for n in plan.norm_tokens:
            tick(f"{sel} rmsnorm n={n}")
            ops[sel].rows.append(_rmsnorm_row(dev, plan.n_embd, n, plan.min_time, rng))
        d = ops[sel]
        if not d.peak_gbps:
            best = [r.gbps for r in d.rows if r.op == "matmul" and r.n_tokens == 1 and r.gbps]
            if best:
                d.peak_gbps, d.peak_source = max(best), "best matmul"
    return out


def _err(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return msg if isinstance(e, CooktopError) else f"{type(e).__name__}: {msg}"


def _matmul_row(dev: Device, ty: T, host_w: np.ndarray, label: str, n_out: int, n_in: int, n: int, wbytes: int,
                plan: OpsPlan, rng: np.random.Generator) -> OpRow:
    name = type_name(ty)
    shape = f"{n_out} x {n_in} ({label})"
    nbytes = wbytes + 4 * n * (n_in + n_out)
    try:
        with dev.buffer("bench --ops matmul") as buf:
            w = buf.upload(host_w, ty, (n_out, n_in))
            x = buf.empty((n, n_in))
            dev.write(x, rng.standard_normal((n, n_in)).astype(np.float32))
            o = buf.empty((n, n_out))
            sec, k = time_call(dev, lambda: dev.matmul(o, x, w), plan.min_time)
        return OpRow("matmul", name, shape, n, sec, nbytes, 2 * n * n_in * n_out, k)
    except Exception as e:  # noqa: BLE001 - a failing kernel is a row with a note
        return OpRow("matmul", name, shape, n, None, nbytes, 0, note=_err(e))


def _rmsnorm_row(dev: Device, n_embd: int, n: int, min_time: float, rng: np.random.Generator) -> OpRow:
    shape = f"{n} x {n_embd}"
    try:
        with dev.buffer("bench --ops rmsnorm") as buf:
            x = buf.empty((n, n_embd))
            dev.write(x, rng.standard_normal((n, n_embd)).astype(np.float32))
            w = buf.upload(np.ones(n_embd, dtype=np.float32), T.F32, (n_embd,))
            o = buf.empty((n, n_embd))
            sec, k = time_call(dev, lambda: dev.rmsnorm(o, x, w, 1e-5), min_time)
        return OpRow("rmsnorm", "F32", shape, n, sec, 4 * (2 * n * n_embd + n_embd), 0, k)
    except Exception as e:  # noqa: BLE001
        return OpRow("rmsnorm", "F32", shape, n, None, 0, 0, note=_err(e))


def ops_markdown(results: list[DeviceOps]) -> str:
    """Per device: the peak line, then a table op | type | shape | tokens | ms | GB/s | GFLOP/s | % of peak."""
    parts = []
    for d in results:
        if d.error:
            parts.append(f"## {d.device}\n\nerror: {d.error}")
            continue
        copy = next((r for r in d.rows if r.op == "copy"), None)
        if copy is not None and copy.gbps:
            head = f"copy: {copy.gbps:.2f} GB/s ({copy.shape}, read + write; the practical peak)"
            pct_label = "% of copy peak"
        else:
            why = copy.note if copy is not None else "not measured"
            head = f"copy: {why}"
            if d.peak_gbps:
                head += f"; percentages are of the best measured matmul bandwidth, {d.peak_gbps:.2f} GB/s"
            pct_label = "% of best matmul BW"
        lines = [f"## {d.device} ({d.name})", "", head, "",
                 f"| op | type | shape (n_out x n_in) | tokens | ms | GB/s | GFLOP/s | {pct_label} |",
                 "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in d.rows:
            if r.op == "copy":
                continue
            if r.seconds is None:
                lines.append(f"| {r.op} | {r.ggml_type} | {r.shape or '-'} | {r.n_tokens or '-'} | - | - | - | "
                             f"{r.note} |")
                continue
            pct = d.pct(r)
            lines.append(f"| {r.op} | {r.ggml_type} | {r.shape} | {r.n_tokens} | {r.seconds * 1e3:.3f} | "
                         f"{r.gbps:.2f} | {r.gflops:.2f} | {pct:.1f} |" if r.gflops is not None else
                         f"| {r.op} | {r.ggml_type} | {r.shape} | {r.n_tokens} | {r.seconds * 1e3:.3f} | "
                         f"{r.gbps:.2f} | - | {pct:.1f} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def ops_records(results: list[DeviceOps], machine: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One JSON-ready record per row (device, peak, op, type, shape, tokens, seconds, GB/s, GFLOP/s, % of peak)."""
    recs: list[dict[str, Any]] = []
    for d in results:
        if d.error:
            recs.append({"device": d.device, "error": d.error, **({"machine": machine} if machine else {})})
            continue
        for r in d.rows:
            rec: dict[str, Any] = {
                "device": d.device, "device_name": d.name, "peak_gbps": d.peak_gbps, "peak_source": d.peak_source,
                "op": r.op, "type": r.ggml_type, "shape": r.shape, "n_tokens": r.n_tokens, "seconds": r.seconds,
                "samples": r.samples, "bytes": r.nbytes, "flops": r.flops, "gbps": r.gbps, "gflops": r.gflops,
                "pct_of_peak": d.pct(r), "note": r.note or None}
            if machine is not None:
                rec["machine"] = machine
            recs.append(rec)
    return recs
