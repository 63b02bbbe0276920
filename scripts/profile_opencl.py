"""Per-op profile of cooktop's forward pass on an OpenCL device: kernel time, launch gaps, host time.

Loads a model with every layer on the device, evaluates a prompt of ``-p`` tokens
and then ``-n`` single tokens, with an OpenCL profiling queue. For each op of the
contract (matmul split by weight type and n_tokens == 1 or not) it reports:

- calls, host ms: Python time spent in the op call (argument checks, enqueue),
- kernel ms: sum of the kernels' device execution time (CL_PROFILING_COMMAND_START..END),
  and, for the matmul ops, a second table by kernel name (the 8-bit prompt kernel ``mul_mm_q8``
  or the float ``mul_mm``, the ``quantize_q8k`` a matmul launched first),

and per phase the wall time, the summed kernel time and the difference (launch
overhead + host work not hidden behind the device + idle queue).

Before the profiled runs it decodes ``-n`` tokens on the plain queue, op by op and with the
decode step replayed from a ``cl_khr_command_buffer`` recording (``opencl/replay.py``; where
the driver has the extension and ``COOKTOP_OPENCL_REPLAY`` is not 0), two rounds of each
alternating, each after ``gc.collect()``, and prints the host cost per decoded token: wall
ms, the CPU time of the Python thread that drives the device (``time.thread_time``:
building the step, argument checks, enqueueing, reading the logits; not the driver's worker
threads that run the kernels on a CPU device) in microseconds, the kernel launches enqueued
one by one and the command-buffer enqueues. That is the figure a GPU that decodes a step in
a few ms would wait on. Recording a step (the second use of its key, untimed here) costs
tens of ms once (a ``clCloneKernel`` per launch).
The profiled runs below go op by op (a replay has no per-kernel events).

``-fa on|off`` picks the attention kernels (default auto: on) and ``-b`` the prompt chunk
(default: the whole prompt in one chunk); ``-p 2048 -b 512 -fa off`` profiles a depth fill as
``cooktop bench -d 2048`` runs it, then decode at depth 2048.

Usage:
    python scripts/profile_opencl.py -m MODEL.gguf [-p 128] [-n 16] [-b N] [-fa on|off] [--device opencl:0]
"""

from __future__ import annotations

import argparse
import collections
import gc
import time

import numpy as np

#: Decode steps before the timed ones in the host-cost table (a replayed key is seen, then recorded).
WARM = 2


def main() -> None:
    ap = argparse.ArgumentParser(description="Per-op profile of the forward pass on an OpenCL device "
                                 "and the host cost per decoded token, op by op and replayed.")
    ap.add_argument("-m", "--model", required=True, help="GGUF model, every layer placed on --device")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("-n", type=int, default=16, help="decoded tokens (default 16)")
    ap.add_argument("--device", default="opencl", help="an OpenCL selector (default opencl)")
    ap.add_argument("-b", type=int, default=None, help="prompt chunk size (default: the whole prompt)")
    ap.add_argument("-fa", default="auto", choices=["on", "off", "auto"], help="flash attention (default auto)")
    args = ap.parse_args()

    import pyopencl as cl

    from cooktop.backends.base import OPS, type_name
    from cooktop.engine import generate as engine
    from cooktop.errors import CooktopError
    from cooktop.format.kvtypes import KVConfig

    try:
        eng = engine.load(args.model, n_ctx=args.p + args.n + WARM + 8, n_batch=args.b or max(args.p, 1),
                          device=args.device, n_gpu_layers=-1, kv=KVConfig.parse(None, None, args.fa))
    except CooktopError as e:
        raise SystemExit(f"error: {e}") from None
    devs = {id(s.device): s.device for s in eng.model.segments}
    not_cl = [d.info.selector for d in devs.values() if not hasattr(d, "replay")]
    if not_cl:
        raise SystemExit(f"error: profile_opencl.py profiles OpenCL devices; {', '.join(not_cl)} is not one "
                         "(give --device opencl or opencl:N)")
    rng = np.random.default_rng(0)
    toks = [int(t) for t in rng.integers(0, eng.cfg.n_vocab, args.p + args.n + WARM)]
    eng.reset()
    eng.eval(toks[:2])  # warm-up: kernel builds
    eng.reset()
    eng.eval(toks[:args.p])
    apis = {k: d.replay for k, d in devs.items()}
    print(f"## replay: {', '.join(f'{d.info.selector}: ' + ('cl_khr_command_buffer' if d.replay else d.replay_reason) for d in devs.values())}")  # noqa: E501
    print(f"## host per decoded token ({args.n} tokens after {args.p} + {WARM} untimed; plain queue)")
    print("| decode step | wall ms | host thread CPU us | launches | command-buffer enqueues |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for replay in (False, True, False, True):  # twice each, alternating
        for k, d in devs.items():
            d.replay = apis[k] if replay else None
        eng.reset()
        eng.eval(toks[:args.p])
        for t in toks[args.p + args.n:]:  # the step's key seen, then recorded: not timed
            eng.eval([t])
        for dev in devs.values():
            dev.queue.finish()
        gc.collect()  # a collection due now would land in the timed steps (a 1-2 ms per token swing)
        n0 = sum(d.n_launches for d in devs.values())
        r0 = sum(d.n_replays for d in devs.values())
        t0, c0 = time.perf_counter(), time.thread_time()
        for t in toks[args.p:args.p + args.n]:
            eng.eval([t])
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        n = max(args.n, 1)
        launches = (sum(d.n_launches for d in devs.values()) - n0) / n
        replays = (sum(d.n_replays for d in devs.values()) - r0) / n
        print(f"| {'replayed' if replay else 'op by op'} | {wall * 1e3 / n:.1f} | {cpu * 1e6 / n:.0f} | "
              f"{launches:.1f} | {replays:.2f} |")
    for d in devs.values():
        d.replay = None  # the profiled runs: op by op
    label = ["?"]
    events: list[tuple[str, str, object]] = []
    host = collections.defaultdict(float)
    calls = collections.Counter()

    for dev in devs.values():
        dev.queue.finish()
        dev.queue = cl.CommandQueue(dev.ctx, dev.cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)

        def wrap(name, fn):
            def op(*a, **k):
                lab = name
                if name == "matmul":
                    lab = f"matmul {type_name(a[2].ggml_type)} {'mv' if a[1].shape[0] == 1 else 'mm'}"
                elif name == "matmuls":  # several matmuls of one input (x, (out, w), ...)
                    types = "/".join(sorted({type_name(p[1].ggml_type) for p in a[1:]}))
                    lab = f"matmuls x{len(a) - 1} {types} {'mv' if a[0].shape[0] == 1 else 'mm'}"
                label[0] = lab
                t0 = time.perf_counter()
                fn(*a, **k)
                host[lab] += time.perf_counter() - t0
                calls[lab] += 1
                label[0] = "(other)"
            return op

        for name in list(OPS) + [n for n in ("matmuls", "rope_store", "rmsnorm_q8", "silu_mul_q8") if hasattr(dev, n)]:
            setattr(dev, name, wrap(name, getattr(dev, name)))

    orig_call = cl.Kernel.__call__

    def kcall(self, *a, **k):
        ev = orig_call(self, *a, **k)
        events.append((label[0], self.function_name, ev))
        return ev

    cl.Kernel.__call__ = kcall
    for phase, run in (("prompt", lambda: eng.eval(toks[:args.p])),
                       ("decode", lambda: [eng.eval([t]) for t in toks[args.p:args.p + args.n]])):
        eng.reset()
        if phase == "decode":
            eng.eval(toks[:args.p])
        for dev in devs.values():
            dev.queue.finish()
        events.clear()
        host.clear()
        calls.clear()
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
        kern = collections.defaultdict(float)
        kcount = collections.Counter()
        by_name = collections.defaultdict(float)  # (op, kernel function) -> s
        for lab, fname, ev in events:
            dt = (ev.profile.end - ev.profile.start) * 1e-9
            kern[lab] += dt
            kcount[lab] += 1
            by_name[(lab, fname)] += dt
        n_tok = args.p if phase == "prompt" else args.n
        tot_k = sum(kern.values())
        print(f"\n## {phase}: {n_tok} tokens, wall {wall * 1e3:.1f} ms ({n_tok / wall:.2f} t/s), kernels "
              f"{tot_k * 1e3:.1f} ms ({100 * tot_k / wall:.0f} %), launches {len(events)} "
              f"({len(events) / max(n_tok, 1):.0f} per token), "
              f"host in ops {sum(host.values()) * 1e3:.1f} ms")
        print("| op | calls | kernels | host ms | kernel ms | kernel % of wall | us/kernel |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for lab in sorted(set(kern) | set(host), key=lambda k: -kern.get(k, 0)):
            km = kern.get(lab, 0.0)
            kc = kcount.get(lab, 0)
            print(f"| {lab} | {calls.get(lab, 0)} | {kc} | {host.get(lab, 0) * 1e3:.1f} | {km * 1e3:.1f} | "
                  f"{100 * km / wall:.1f} | {1e6 * km / max(kc, 1):.0f} |")
        print(f"\n{phase}: the matmul kernels by name (which kernel each matmul op ran)")
        print("| op | kernel | kernel ms |")
        print("| --- | --- | ---: |")
        for (lab, fname), dt in sorted(by_name.items(), key=lambda kv: -kv[1]):
            if lab.startswith("matmul"):
                print(f"| {lab} | {fname} | {dt * 1e3:.1f} |")
    cl.Kernel.__call__ = orig_call
    for k, d in devs.items():
        d.replay = apis[k]
    eng.close()


if __name__ == "__main__":
    main()
