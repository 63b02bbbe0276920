"""Read-bandwidth ceiling of an OpenCL device for the mat-vecs' launch shape: kernels that only sum weight bytes.

What a one-token mat-vec could reach if it were bound by memory alone: a buffer of ``--mib`` MiB
(default 1024, larger than this VM's caches) is read by
  sum_rows    a work-item per row of ``--row`` bytes (default 2176: a Q8_0 row of 2048 values), local
              size (1, 8) as ``mul_mv_q8`` on CPUs (``LaunchShape.mv_r``), 64-byte loads
  sum_rows34  the same rows read as Q8_0 blocks are (32 bytes at 34-byte steps, from byte 2)
  sum_chunk   N work-items each reading one contiguous 1/N of the buffer (the plain streaming bound)
Each prints GB/s of the buffer's bytes (best and median of ``--reps`` calls, wall time after
``finish``). Compare with a mat-vec's GB/s (``scripts/bench_kernels_ab.py``, ``% of copy``) and with
llama.cpp's (model bytes x tg t/s). ``POCL_MAX_PTHREAD_COUNT=1`` gives one PoCL thread's figure.

Usage:
    python scripts/bench_read_cl.py [--mib 1024] [--row 2176] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyopencl as cl

SOURCE = r"""
typedef char v64 __attribute__((vector_size(64), aligned(1)));
typedef char v32 __attribute__((vector_size(32), aligned(1)));
kernel void sum_rows(const global uchar *w, global int *out, int rb) {
    const int row = get_global_id(1);
    const global uchar *p = w + (size_t)row * rb;
    int16 acc = 0;
    for (int i = 0; i + 64 <= rb; i += 64) acc += __builtin_astype(*(const global v64 *)(p + i), int16);
    out[row] = acc.s0 + acc.s5 + acc.sa + acc.sf;
}
kernel void sum_rows34(const global uchar *w, global int *out, int rb) {
    const int row = get_global_id(1);
    const global uchar *p = w + (size_t)row * rb;
    int8 acc = 0;
    for (int i = 0; i + 34 <= rb; i += 34) acc += __builtin_astype(*(const global v32 *)(p + i + 2), int8);
    out[row] = acc.s0 + acc.s5;
}
kernel void sum_chunk(const global uchar *w, global int *out, long nbytes) {
    const int t = get_global_id(0), n = get_global_size(0);
    const long per = nbytes / n / 64 * 64;
    const global uchar *p = w + per * t;
    int16 acc = 0;
    for (long i = 0; i < per; i += 64) acc += __builtin_astype(*(const global v64 *)(p + i), int16);
    out[t] = acc.s0 + acc.s5;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="buffer size in MiB")
    ap.add_argument("--row", type=int, default=2176, help="row bytes of sum_rows / sum_rows34")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dev = cl.get_platforms()[0].get_devices()[0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    n_rows = (args.mib << 20) // args.row // 64 * 64
    nbytes = n_rows * args.row
    prg = cl.Program(ctx, SOURCE).build()
    kernels = {name: cl.Kernel(prg, name) for name in ("sum_rows", "sum_rows34", "sum_chunk")}
    w = cl.Buffer(ctx, cl.mem_flags.READ_ONLY, nbytes)
    cl.enqueue_fill_buffer(q, w, np.uint8(1), 0, nbytes).wait()  # pages touched before timing
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n_rows * 4)
    print(f"{dev.name.strip()}: {nbytes / 1e6:.0f} MB, rows of {args.row} bytes; GB/s best / median of {args.reps}")

    def run(label: str, launch) -> None:
        launch()
        q.finish()
        ts = []
        for _ in range(args.reps):
            t = time.perf_counter()
            launch()
            q.finish()
            ts.append(time.perf_counter() - t)
        print(f"{label:30s} {nbytes / min(ts) / 1e9:6.2f} / {nbytes / statistics.median(ts) / 1e9:6.2f}", flush=True)

    rb = np.int32(args.row)
    for lr in (8, 64):
        run(f"sum_rows local (1, {lr})", lambda lr=lr: kernels["sum_rows"](q, (1, n_rows), (1, lr), w, out, rb))
    run("sum_rows34 local (1, 8)", lambda: kernels["sum_rows34"](q, (1, n_rows), (1, 8), w, out, rb))
    for nt in (2, 16, 256):
        run(f"sum_chunk {nt} work-items", lambda nt=nt: kernels["sum_chunk"](q, (nt,), (1,), w, out, np.int64(nbytes)))


if __name__ == "__main__":
    main()
