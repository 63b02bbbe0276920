"""Benchmark the OpenCL matmul kernels beside a numpy baseline, in one run.

Decode (n_tok = 1, mul_mv) is reported in GB/s of quantized weights read,
prompt (n_tok = 64, mul_mm) in GFLOP/s; the baseline is numpy's float32
matrix-vector product of the same shape (what the numpy backend runs once
weights are dequantized), timed in the same process. Also prints the Python
time to enqueue one op (no waiting).

Usage:
    python scripts/bench_opencl.py [--device opencl:0] [--types Q4_0,Q4_K] [--mm]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.format.quants import random_weight

SHAPES = ((2048, 2048), (5632, 2048), (2048, 5632))  # [n_out, n_in]: TinyLlama attn_q, ffn_gate, ffn_down


def best_of(fn, n: int, reps: int = 5, sync=None) -> float:
    """Best mean seconds per call of ``fn`` over ``reps`` runs of ``n`` calls."""
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if sync:
            sync()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--types", default="Q4_0,Q4_K")
    ap.add_argument("--mm", action="store_true", help="also time n_tok=64 (mul_mm)")
    args = ap.parse_args()
    dev = registry.open_device(args.device)
    print(f"{dev.info.selector}: {dev.info.name} ({dev.info.platform})")
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        ty = T[name]
        for n_out, n_in in SHAPES:
            raw = random_weight(ty, (n_out, n_in), rng)
            w = dev.upload(raw, ty, (n_out, n_in))
            for n_tok in (1, 64) if args.mm else (1,):
                x = dev.empty((n_tok, n_in))
                dev.write(x, rng.standard_normal((n_tok, n_in)).astype(np.float32))
                y = dev.empty((n_tok, n_out))
                dev.matmul(y, x, w)
                dev.read(y)
                dt = best_of(lambda y=y, x=x, w=w: dev.matmul(y, x, w), 20 if n_tok == 1 else 2,
                             sync=lambda y=y: dev.read(y))
                if n_tok == 1:
                    print(f"{name:5} {n_out}x{n_in} decode: {dt * 1e3:7.3f} ms {raw.nbytes / dt / 1e9:6.2f} GB/s")
                else:
                    print(f"{name:5} {n_out}x{n_in} n_tok={n_tok}: {dt * 1e3:7.2f} ms "
                          f"{2 * n_tok * n_out * n_in / dt / 1e9:6.2f} GFLOP/s")
    for n_out, n_in in SHAPES:
        wf = rng.standard_normal((n_out, n_in)).astype(np.float32)
        xv = rng.standard_normal(n_in).astype(np.float32)
        dt = best_of(lambda wf=wf, xv=xv: wf @ xv, 20)
        print(f"numpy F32 {n_out}x{n_in} decode baseline: {dt * 1e3:7.3f} ms {wf.nbytes / dt / 1e9:6.2f} GB/s")
    a = dev.empty((1, 64))
    dev.write(a, np.ones((1, 64), np.float32))
    dev.add(a, a, a)
    dev.read(a)
    t = time.perf_counter()
    for _ in range(2000):
        dev.add(a, a, a)
    enq = (time.perf_counter() - t) / 2000
    dev.read(a)
    print(f"Python time to enqueue one op (add, no wait): {enq * 1e6:.1f} us")


if __name__ == "__main__":
    main()
