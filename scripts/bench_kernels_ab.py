"""A/B timing of the OpenCL weight kernels: this tree's ``kernels/*.cl`` against another copy, in one process.

Two devices on the same OpenCL device: ``new`` builds the weight programs from this checkout's
kernels, ``ref`` from the ``.cl`` files of ``--ref`` (e.g. ``git archive main
cooktop/backends/opencl/kernels | tar -x -C /tmp/ref``; kernels from before ``LaunchShape.mmq_tt``
get one token tile per work-item). Their matmuls are timed alternately, several rounds,
together with a float32 copy of 64 MiB on the same device, so the load of a shared machine hits
both alike; each figure is the median of the rounds (wall ms per call; the 8-bit copy of x is made
once, as a decode step reuses it) and, for one token, GB/s of the weight bytes as a fraction of the
copy bandwidth of the same round (read + write, ``cooktop bench --ops``'s convention); also the
median process CPU ms per call (PoCL's worker threads count in it: less sensitive to other load).

Variants of one tree: ``--ref-tt`` / ``--new-tt`` set ``LaunchShape.mmq_tt``, ``--ref-options`` /
``--new-options`` add build options (e.g. ``--new-options=-DMMQK_RP=1``).

Usage:
    python scripts/bench_kernels_ab.py --ref DIR [--device opencl:0] [--types Q4_0,Q4_K,Q6_K]
        [--tokens 1,64] [--rounds 7] [--shapes 2048x2048,5632x2048]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import statistics
import time
from collections.abc import Iterator

import numpy as np
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.backends.base import row_bytes
from cooktop.backends.opencl import programs
from cooktop.format.quants import random_weight

#: [n_out, n_in]: TinyLlama's attn_q, ffn_gate, ffn_down, output
SHAPES = ((2048, 2048), (5632, 2048), (2048, 5632), (32000, 2048))


@contextlib.contextmanager
def _sources_from(folder: pathlib.Path | None) -> Iterator[None]:
    """Kernel sources read from ``folder`` (the ``.cl`` files) while inside, this tree's when None."""
    if folder is None:
        yield
        return
    orig = programs.read_source
    programs.read_source = lambda *names: "\n".join((folder / n).read_text() for n in names)
    try:
        yield
    finally:
        programs.read_source = orig


def _device(selector: str):
    dev = registry.open_device(selector)
    return type(dev)(dev.info, dev.cl_device)  # a fresh device object with its own kernel cache


def _per_call(dev, fn, n: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per call of ``n`` back-to-back calls (the driver's threads count in the CPU)."""
    dev.synchronize()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    dev.synchronize()
    return (time.perf_counter() - t) / n, (time.process_time() - c) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="folder of the reference kernels/*.cl")
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--types", default="Q4_0,Q4_K,Q6_K")
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ref-tt", type=int, default=0, help="LaunchShape.mmq_tt of ref (default: the device's)")
    ap.add_argument("--new-tt", type=int, default=0, help="LaunchShape.mmq_tt of new (default: the device's)")
    ap.add_argument("--ref-options", default="", help="more build options of ref (e.g. -DMMQK_RP=1)")
    ap.add_argument("--new-options", default="", help="more build options of new")
    ap.add_argument("--shapes", default="", help="n_outxn_in comma list (default: TinyLlama's four)")
    args = ap.parse_args()
    ref = pathlib.Path(args.ref)
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES)
    devs = {"ref": _device(args.device), "new": _device(args.device)}
    tts = {"ref": args.ref_tt, "new": args.new_tt}
    if "MMQ_TT" not in (ref / "mmq8.cl").read_text():  # before mul_mm_q8 ran several token tiles per work-item
        tts["ref"] = 1
    extra = {"ref": args.ref_options, "new": args.new_options}
    for k, d in devs.items():
        if tts[k] or extra[k]:
            d.shape = dataclasses.replace(d.shape, mmq_tt=tts[k] or d.shape.mmq_tt)
            d.kernels = programs.KernelCache(d.ctx, d.cl_device, d.shape,
                                             f"{os.environ.get('COOKTOP_OPENCL_OPTIONS', '')} {extra[k]}".strip(),
                                             d.info)
    rng = np.random.default_rng(0)
    cdev = devs["new"]
    n_copy = 16 * 1024 * 1024
    cx, cy = cdev.empty((n_copy // 1024, 1024)), cdev.empty((n_copy // 1024, 1024))
    cdev.write(cx, rng.standard_normal((n_copy // 1024, 1024)).astype(np.float32))
    print(f"{args.device}: {cdev.info.name}; median of {args.rounds} rounds; ms per call, "
          "tg: weight GB/s as % of the same round's copy GB/s")
    for name in args.types.split(","):
        ty = T[name]
        for n_out, n_in in shapes:
            raw = random_weight(ty, (min(n_out, 256), n_in), rng)
            raw = np.tile(raw, (-(-n_out // raw.shape[0]),) + (1,) * (raw.ndim - 1))[:n_out]
            for n_tok in (int(t) for t in args.tokens.split(",")):
                if n_tok > 1 and n_out > 8192:
                    continue
                x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
                calls = {}
                for k, dev in devs.items():
                    xt, y = dev.empty((n_tok, n_in)), dev.empty((n_tok, n_out))
                    with _sources_from(ref if k == "ref" else None):
                        w = dev.upload(raw, ty, (n_out, n_in))
                        dev.write(xt, x)
                        dev.matmul(y, xt, w)  # build, quantize x once
                    calls[k] = (lambda d=dev, y=y, xt=xt, w=w: d.matmul(y, xt, w))
                reps = 20 if n_tok == 1 else 2
                ms: dict[str, list[float]] = {k: [] for k in devs}
                cpu: dict[str, list[float]] = {k: [] for k in devs}
                pct: dict[str, list[float]] = {k: [] for k in devs}
                wbytes = n_out * row_bytes(ty, n_in)
                for _ in range(args.rounds):
                    copy_s = _per_call(cdev, lambda: cdev.copy(cy, cx), 5)[0]
                    copy_gbps = 2 * n_copy * 4 / copy_s / 1e9
                    for k, dev in devs.items():
                        s, c = _per_call(dev, calls[k], reps)
                        ms[k].append(s * 1e3)
                        cpu[k].append(c * 1e3)
                        pct[k].append(100 * wbytes / s / 1e9 / copy_gbps)
                a, b = statistics.median(ms["ref"]), statistics.median(ms["new"])
                ca, cb = statistics.median(cpu["ref"]), statistics.median(cpu["new"])
                line = (f"{name:5} {n_out:5}x{n_in:<5} n_tok={n_tok:3}: wall ref {a:8.3f} new {b:8.3f} x{a / b:5.2f}  "
                        f"CPU ref {ca:8.3f} new {cb:8.3f} x{ca / cb:5.2f}")
                if n_tok == 1:
                    pr, pn = statistics.median(pct["ref"]), statistics.median(pct["new"])
                    line += f"   % of copy: ref {pr:5.1f}  new {pn:5.1f}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
