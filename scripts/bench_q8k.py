"""Time the OpenCL K-quant matmul kernels on block_q8_1 against block_q8_K activations, in one process.

Two devices on the same OpenCL device, one built with ``COOKTOP_OPENCL_Q8K=0`` (K-quants on
block_q8_1, a float scale per 32 activations) and one with it on (block_q8_K, one per 256);
their kernels are timed alternately, so a shared machine's load hits both alike. Reports the
best per-call wall and process CPU time (PoCL's threads count in the CPU time) of the matmul
alone (the 8-bit copy of x is made once, as a decode step reuses it).

Usage:
    python scripts/bench_q8k.py [--device opencl:0] [--types Q4_K,Q5_K,Q6_K] [--tokens 1,64] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.format.quants import random_weight

SHAPES = ((2048, 2048), (5632, 2048), (2048, 5632))  # [n_out, n_in]: TinyLlama attn_q, ffn_gate, ffn_down


def _device(selector: str):
    dev = registry.open_device(selector)
    return type(dev)(dev.info, dev.cl_device)  # a fresh device object with its own kernel cache


def _time(dev, y, x, w, n: int) -> tuple[float, float]:
    dev.synchronize()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        dev.matmul(y, x, w)
    dev.synchronize()
    return (time.perf_counter() - t) / n, (time.process_time() - c) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    devs = {"q8_1": _device(args.device), "q8_K": _device(args.device)}
    rng = np.random.default_rng(0)
    print(f"{args.device}: {devs['q8_1'].info.name}; best of {args.reps}, ms per call (wall / CPU)")
    for name in args.types.split(","):
        ty = T[name]
        for n_out, n_in in SHAPES:
            raw = random_weight(ty, (n_out, n_in), rng)
            for n_tok in (int(t) for t in args.tokens.split(",")):
                x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
                best: dict[str, list[float]] = {}
                bufs = {}
                for k, dev in devs.items():
                    xt, y, w = dev.empty((n_tok, n_in)), dev.empty((n_tok, n_out)), dev.upload(raw, ty, (n_out, n_in))
                    dev.write(xt, x)
                    os.environ["COOKTOP_OPENCL_Q8K"] = "1" if k == "q8_K" else "0"  # read when kernels build
                    dev.matmul(y, xt, w)  # build, quantize x once
                    bufs[k] = (y, xt, w)
                    best[k] = [float("inf"), float("inf")]
                n = 20 if n_tok == 1 else 2
                for _ in range(args.reps):
                    for k, dev in devs.items():
                        wall, cpu = _time(dev, *bufs[k], n)
                        best[k] = [min(best[k][0], wall), min(best[k][1], cpu)]
                a, b = best["q8_1"], best["q8_K"]
                print(f"{name} {n_out}x{n_in} n_tok={n_tok:3}: q8_1 {a[0] * 1e3:7.3f} / {a[1] * 1e3:7.3f}  "
                      f"q8_K {b[0] * 1e3:7.3f} / {b[1] * 1e3:7.3f}  speed-up {a[0] / b[0]:.2f} / {a[1] / b[1]:.2f}")


if __name__ == "__main__":
    main()
