#!/usr/bin/env python3
"""Benchmark the Vulkan backend through the device contract (enqueue ops, read once).

Three measurements, each the best of ``--reps`` runs after two warm-ups:

1. decode mat-vec: ``--repeat`` distinct ``n x n`` weights (so they do not fit
   in cache together) multiplied by one token, one ``read`` per pass:
   GB/s = weight bytes read / time.
2. prompt mat-mat (tiled mul_mm): 64 tokens against 4 of those weights: GFLOP/s.
3. Python overhead per decode step of a replayed sequence: a llama-like op list
   (``--layers`` layers of 17 ops on tiny tensors, so device time is small),
   total time per step minus the time of ``Sequence.eval()`` of the cached
   sequence alone.

With ``--formats SHAPES`` (e.g. ``2048x2048,5632x2048``) it measures instead the integer-dot
mat-vec's activation formats against each other for ``--types``: the float variant (as without
shaderIntegerDotProduct), block_q8_1 and, for the K-quants, block_q8_K (``COOKTOP_VULKAN_Q8K``),
alternated in one process for ``--reps`` rounds; each matmul of a pass reads its own activation
and weight (4 of each), so every pass quantizes again. Times are CPU time of the process
(``time.process_time``: lavapipe's worker threads included), per matmul, medians, which a shared
machine distorts far less than wall time; the ratios are the figures to compare.

Usage: ``python scripts/bench_vulkan.py [--n 2048] [--types Q4_0,Q4_K] [--layers 22]``,
``python scripts/bench_vulkan.py --types Q4_K,Q5_K,Q6_K --formats 2048x2048,5632x2048 --reps 7``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.backends.base import ROPE_NEOX, row_bytes
from cooktop.format.quants import random_weight


def best_of(fn, reps: int) -> float:
    """Minimum wall time of ``fn()`` over ``reps`` runs, after two warm-up runs (seconds)."""
    fn()
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_matmul(dev, ty: T, n: int, repeat: int, reps: int) -> None:
    rng = np.random.default_rng(0)
    raw = random_weight(ty, (n, n), rng)
    ws = [dev.upload(raw, ty, (n, n)) for _ in range(repeat)]
    x, y = dev.empty((64, n)), dev.empty((64, n))
    dev.write(x, rng.standard_normal((64, n)).astype(np.float32))
    x1, y1 = x.head(1), y.head(1)

    def decode():
        for w in ws:
            dev.matmul(y1, x1, w)
        dev.read(y1)

    dt = best_of(decode, reps) / repeat
    nbytes = n * row_bytes(ty, n)
    # baseline in the same session: numpy float32 mat-vec over `repeat` distinct matrices (BLAS)
    wf = [rng.standard_normal((n, n)).astype(np.float32) for _ in range(min(repeat, 4))]
    xf = rng.standard_normal(n).astype(np.float32)
    dt_np = best_of(lambda: [m @ xf for m in wf], reps) / len(wf)
    print(f"{ty.name:5s} mul_mat_vec {n}x{n}: {dt * 1e3:8.3f} ms  {nbytes / dt / 1e9:6.2f} GB/s   "
          f"(baseline numpy f32 mat-vec: {dt_np * 1e3:.3f} ms, {4 * n * n / dt_np / 1e9:.2f} GB/s)")

    def prompt():
        for w in ws[:4]:
            dev.matmul(y, x, w)
        dev.read(y)

    dt = best_of(prompt, max(1, reps // 3)) / 4
    print(f"{ty.name:5s} mul_mm 64 tokens {n}x{n}: {dt * 1e3:8.2f} ms  {2 * 64 * n * n / dt / 1e9:6.2f} GFLOP/s")


def bench_activation_formats(dev, ty: T, shapes: list[tuple[int, int]], rounds: int, per_pass: int = 4) -> None:
    """float / q8_1 / q8_K mat-vec of ``ty`` at each [n_out, n_in] of ``shapes`` (module docstring)."""
    from cooktop.backends.vulkan.shaders import variant_info

    feats = dev.features
    modes = ["float", "q8_1"] + (["q8_K"] if variant_info(f"mul_mat_vec_{ty.name.lower()}_q8k") else [])
    saved = os.environ.get("COOKTOP_VULKAN_Q8K")

    def set_mode(m: str) -> None:
        dev.features = feats - {"shaderIntegerDotProduct"} if m == "float" else feats
        os.environ["COOKTOP_VULKAN_Q8K"] = "1" if m == "q8_K" else "0"

    rng = np.random.default_rng(0)
    try:
        for n_out, n_in in shapes:
            ws = [dev.upload(random_weight(ty, (n_out, n_in), rng), ty, (n_out, n_in)) for _ in range(per_pass)]
            xs = [dev.empty((1, n_in)) for _ in range(per_pass)]
            for x in xs:
                dev.write(x, rng.standard_normal((1, n_in)).astype(np.float32))
            y = dev.empty((1, n_out))

            def run(ws=ws, xs=xs, y=y):
                for w, x in zip(ws, xs):
                    dev.matmul(y, x, w)
                dev.read(y)

            times: dict[str, list[float]] = {m: [] for m in modes}
            for m in modes:  # warm-up: pipelines, 8-bit copies
                set_mode(m)
                run()
            for r in range(rounds):
                for m in modes if r % 2 == 0 else modes[::-1]:
                    set_mode(m)
                    t0 = time.process_time()
                    run()
                    run()
                    times[m].append((time.process_time() - t0) / (2 * per_pass))
            med = {m: statistics.median(v) * 1e3 for m, v in times.items()}
            ratios = f"q8_1/float {med['q8_1'] / med['float']:.3f}"
            if "q8_K" in med:
                ratios += f"  q8_K/q8_1 {med['q8_K'] / med['q8_1']:.3f}"
            print(f"{ty.name:5s} mul_mat_vec {n_out}x{n_in}, CPU ms per matmul: "
                  + "  ".join(f"{m} {med[m]:.3f}" for m in modes) + f"   {ratios}", flush=True)
            dev.release(ws + xs + [y])
    finally:
        dev.features = feats
        if saved is None:
            os.environ.pop("COOKTOP_VULKAN_Q8K", None)
        else:
            os.environ["COOKTOP_VULKAN_Q8K"] = saved


def bench_dispatch(dev, n: int, reps: int) -> None:
    """Cost of one tiny dispatch inside a replayed sequence (the driver's fixed cost per op)."""
    a = dev.zeros((1, 64))

    def run():
        for _ in range(n):
            dev.add(a, a, a)
        dev.read(a)

    dt = best_of(run, reps)
    print(f"{n} tiny add dispatches in one replayed sequence: {dt * 1e3:.2f} ms ({dt / n * 1e6:.1f} us/dispatch)")


def bench_overhead(dev, n_layers: int, steps: int) -> None:
    rng = np.random.default_rng(1)
    n_embd, n_head, n_head_kv, n_ff, n_ctx = 64, 4, 2, 256, 64
    hd = n_embd // n_head
    kv = n_head_kv * hd

    def w(shape):
        return dev.upload(random_weight(T.Q8_0, shape, rng), T.Q8_0, shape)

    layers = [dict(wq=w((n_embd, n_embd)), wk=w((kv, n_embd)), wv=w((kv, n_embd)), wo=w((n_embd, n_embd)),
                   gate=w((n_ff, n_embd)), up=w((n_ff, n_embd)), down=w((n_embd, n_ff)),
                   k=dev.zeros((n_ctx, kv)), v=dev.zeros((n_ctx, kv))) for _ in range(n_layers)]
    norm = dev.upload(np.ones(n_embd, dtype=np.float32), T.F32, (n_embd,))
    emb = w((100, n_embd))
    ids, pos = dev.empty((1,), T.I32), dev.empty((1,), T.I32)
    x, h, q, k, v, a = (dev.empty((1, m)) for m in (n_embd, n_embd, n_embd, kv, kv, n_embd))
    g, u = dev.empty((1, n_ff)), dev.empty((1, n_ff))
    logits = dev.empty((1, 100))
    state = {"p": 0}

    def step():
        p = state["p"] % n_ctx
        state["p"] += 1
        dev.write(ids, np.array([p % 100], dtype=np.int32))
        dev.write(pos, np.array([p], dtype=np.int32))
        dev.get_rows(x, emb, ids)
        for L in layers:
            dev.rmsnorm(h, x, norm, 1e-5)
            dev.matmul(q, h, L["wq"])
            dev.matmul(k, h, L["wk"])
            dev.matmul(v, h, L["wv"])
            dev.rope(q, q, pos, hd, hd, 10000.0, 1.0, ROPE_NEOX)
            dev.rope(k, k, pos, hd, hd, 10000.0, 1.0, ROPE_NEOX)
            dev.kv_store(L["k"], k, pos)
            dev.kv_store(L["v"], v, pos)
            dev.attention(a, q, L["k"], L["v"], pos, n_head, n_head_kv, 1.0 / hd ** 0.5)
            dev.matmul(h, a, L["wo"])
            dev.add(x, x, h)
            dev.rmsnorm(h, x, norm, 1e-5)
            dev.matmul(g, h, L["gate"])
            dev.matmul(u, h, L["up"])
            dev.silu_mul(g, g, u)
            dev.matmul(h, g, L["down"])
            dev.add(x, x, h)
        dev.matmul(logits, x, emb)
        dev.read(logits)

    step()  # records the first list (with the cache zero-fills)
    step()  # records the steady decode list
    rec0 = dev.n_recordings
    t_total = best_of(step, steps)
    c0 = time.thread_time()
    for _ in range(steps):
        step()
    t_cpu = (time.thread_time() - c0) / steps  # CPU time of this thread: Python + kp submit; lavapipe works elsewhere
    seq = next(reversed(dev._seqs.values()))  # the decode step's cached sequence
    t_eval = best_of(seq.eval, steps)
    c0 = time.thread_time()
    for _ in range(steps):
        seq.eval()
    t_eval_cpu = (time.thread_time() - c0) / steps
    n_ops = n_layers * 17 + 5
    py = t_cpu - t_eval_cpu
    print(f"decode step, {n_layers} layers ({n_ops} ops): {t_total * 1e3:.2f} ms per token wall "
          f"(Sequence.eval alone {t_eval * 1e3:.2f} ms); calling-thread CPU {t_cpu * 1e3:.2f} ms per token, "
          f"of which eval {t_eval_cpu * 1e3:.2f} ms: Python overhead {py * 1e3:.2f} ms ({py / n_ops * 1e6:.1f} us/op); "
          f"sequences recorded during timing: {dev.n_recordings - rec0}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="vulkan:0")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--types", default="Q4_0,Q4_K")
    ap.add_argument("--repeat", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--formats", metavar="SHAPES", help="A/B of the activation formats at these N_OUTxN_IN shapes")
    args = ap.parse_args()
    dev = registry.open_device(args.device)
    print(f"{dev.info.selector}: {dev.info.name} ({dev.info.driver_version})")
    if args.formats:
        shapes = [(int(a), int(b)) for a, b in (s.lower().split("x") for s in args.formats.split(","))]
        for name in args.types.split(","):
            bench_activation_formats(dev, T[name.strip()], shapes, args.reps)
        return
    for name in args.types.split(","):
        bench_matmul(dev, T[name.strip()], args.n, args.repeat, args.reps)
    bench_dispatch(dev, 379, args.reps)
    bench_overhead(dev, args.layers, max(args.reps, 10))


if __name__ == "__main__":
    main()
