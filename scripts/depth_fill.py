"""Time a KV-cache depth fill chunk by chunk, then decode at that depth, in cooktop or llama-cpp-python.

What ``cooktop bench -d D`` does untimed before its runs, measured: ``D`` random token ids
evaluated in ``-b`` chunks (each chunk's seconds printed, so the growth of attention's share with
depth shows), then one untimed token and ``-n`` timed single tokens at depth ``D``. One line per
``-fa`` value. ``--engine llama.cpp`` runs the same through llama-cpp-python on the CPU
(``Llama.eval``, ``n_threads`` = the logical cores, ``n_batch = n_ubatch = -b``, as ``--vs``).

Usage:
    python scripts/depth_fill.py -m MODEL.gguf [-d 2048] [-n 16] [-b 512] [-fa on,off] [--device opencl]
        [--engine cooktop|llama.cpp]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np


def _cooktop(model: str, n_ctx: int, n_batch: int, fa: str, device: str) -> tuple[Callable, Callable, Callable, int]:
    """(eval(tokens), reset(), close(), n_vocab) of cooktop's engine with every layer on ``device``."""
    from cooktop.engine import generate as engine
    from cooktop.format.kvtypes import KVConfig

    eng = engine.load(model, n_ctx=n_ctx, n_batch=n_batch, device=device, n_gpu_layers=-1,
                      kv=KVConfig.parse(None, None, fa))
    return eng.eval, eng.reset, eng.close, eng.cfg.n_vocab


def _llama_cpp(model: str, n_ctx: int, n_batch: int, fa: str, device: str) -> tuple[Callable, Callable, Callable, int]:
    """(eval(tokens), reset(), close(), n_vocab) of llama-cpp-python on the CPU (``device`` is not used)."""
    import llama_cpp

    n = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=n,
                          n_threads_batch=n, n_gpu_layers=0, logits_all=False, verbose=False,
                          flash_attn=fa != "off")
    return llm.eval, llm.reset, llm.close, llm.n_vocab()


def main() -> None:
    ap = argparse.ArgumentParser(description="Time a depth fill chunk by chunk, then decode at that depth.")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-d", type=int, default=2048, help="depth: tokens filled (default 2048)")
    ap.add_argument("-n", type=int, default=16, help="tokens decoded at depth (default 16)")
    ap.add_argument("-b", type=int, default=512, help="chunk size (default 512, bench's -b)")
    ap.add_argument("-fa", default="on,off", help="comma list of on, off, auto (default on,off)")
    ap.add_argument("--device", default="opencl", help="cooktop's device (default opencl)")
    ap.add_argument("--engine", default="cooktop", choices=["cooktop", "llama.cpp"])
    args = ap.parse_args()
    make = _cooktop if args.engine == "cooktop" else _llama_cpp
    for fa in [v.strip() for v in args.fa.split(",") if v.strip()]:
        ev, reset, close, n_vocab = make(args.model, args.d + args.n + 8, args.b, fa, args.device)
        toks = [int(t) for t in np.random.default_rng(1).integers(0, n_vocab, args.d + args.n + 1)]
        try:
            ev(toks[:1])  # kernel builds, not timed; the fill starts over at position 0
            reset()
            chunks = []
            t0 = time.perf_counter()
            for i in range(0, args.d, args.b):
                c0 = time.perf_counter()
                ev(toks[i:i + args.b])
                chunks.append(time.perf_counter() - c0)
            fill = time.perf_counter() - t0
            ev([toks[args.d]])  # the first step at this depth (a replay is recorded): not timed
            t1 = time.perf_counter()
            for t in toks[args.d + 1:args.d + args.n + 1]:
                ev([t])
            dec = time.perf_counter() - t1
        finally:
            close()
        print(f"{args.engine} -fa {fa} depth {args.d}: fill {fill:.1f} s ({args.d / fill:.0f} t/s), chunks "
              + " ".join(f"{c:.2f}" for c in chunks)
              + f"; tg{args.n} at depth {args.n / dec:.2f} t/s ({dec / max(args.n, 1) * 1e3:.0f} ms/token)",
              flush=True)


if __name__ == "__main__":
    main()
