"""cooktop against llama.cpp with ONE thread each: a per-core ratio that survives a shared machine.

``cooktop bench --vs llama.cpp`` runs every engine on all cores. On a machine shared
with other work (this project's 2-core VM runs other developers' test suites), llama.cpp's
threads spin at their barriers and collapse when one of them is descheduled (tg32 went
from 35 t/s to 0.2-0.3 t/s at load average 10), so its ratios measure the load, not the
engines. With one thread per engine nothing spins on a missing partner: each engine gets
the same share of a core, and the runs alternate, so the ratio of medians compares the
code per core.

Engines: llama.cpp (llama-cpp-python, n_threads = n_threads_batch = 1), cooktop OpenCL on
PoCL with one worker thread (POCL_MAX_PTHREAD_COUNT=1), cooktop numpy with one BLAS and
one dequantization thread (its float32 conversion finished before timing).

Usage:
    python scripts/bench_1thread.py -m MODEL.gguf [-p 128] [-n 32] [-r 3] [--engines opencl,numpy]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", "1")
os.environ.setdefault("COOKTOP_DEQUANT_THREADS", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--engines", default="opencl,numpy")
    args = ap.parse_args()

    from cooktop.api.options import set_threads
    from cooktop.bench.runner import CooktopRunner, TestSpec, run_once, tokens_for
    from cooktop.bench.vs_llamacpp import LlamaCppRunner

    set_threads(1)
    n_ctx = args.p + args.n + 16
    runners = {"llama.cpp": LlamaCppRunner(args.model, n_ctx, 512, n_threads=1)}
    for e in args.engines.split(","):
        runners[e] = CooktopRunner(args.model, "cpu" if e == "numpy" else e, -1, 512, None, n_ctx)
        if e == "numpy":  # time the cached speed: let the background conversion finish
            runners[e].prompt([1, 2])
            for seg in runners[e].eng.model.segments:
                wait = getattr(seg.device, "wait_converted", None)
                if wait:
                    wait()
    print(f"model {args.model}, load average {os.getloadavg()[0]:.1f}")
    for test in (TestSpec(args.p, 0), TestSpec(0, args.n)):
        toks = tokens_for(test, 32000, 1234)
        samples: dict[str, list[float]] = {k: [] for k in runners}
        for rep in range(args.r + 1):
            for name, r in runners.items():
                time.sleep(0.3)
                s = run_once(r, test, toks)
                if rep:
                    samples[name].append(test.n_tokens / s)
        ref = statistics.median(samples["llama.cpp"])
        for name, v in samples.items():
            med = statistics.median(v)
            print(f"{test.name:6s} {name:10s} {med:8.2f} t/s (median of {len(v)})  ratio {med / ref:5.2f}")
    print(f"load average after {os.getloadavg()[0]:.1f}")
    for r in runners.values():
        r.close()


if __name__ == "__main__":
    main()
