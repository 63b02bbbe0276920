"""Decode speed of a model split across Ray nodes vs on one node vs without Ray, and the per-hop overhead.

    # a cluster of your own (any machines):
    python scripts/ray_bench.py --ray HEAD:6379 -m MODEL.gguf \\
        --config split=alpha/opencl:0,beta/opencl:0 --config one=alpha/opencl:0 --config local=opencl:0
    # or two local nodes started here; run it in a loopback-only network namespace (as root),
    # else Ray binds the host's external address:
    unshare -n sh -c 'ip link set lo up && python scripts/ray_bench.py --local-nodes 2 -m MODEL.gguf \\
        --config split=node0/opencl:0,node1/opencl:0 --config one=node0/opencl:0 --config local=opencl:0'

Each ``--config NAME=DEVICES`` is loaded in turn (NODE/DEVICE selectors go through Ray,
plain ones load in this process), warmed up, then timed ``-r`` times: a ``-p``-token
prompt, then ``-n`` greedy tokens. Printed per config: prompt and decode tokens/s (best and
median of the repeats) and, through Ray, the decode time per token split into each
segment's compute and the rest (serialization, Ray calls, activation/logit moves) per hop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def start_local_nodes(n: int):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    for i in range(n):
        cluster.add_node(num_cpus=1, node_name=f"node{i}", node_ip_address=f"127.0.0.{i + 1}",
                         **({"include_dashboard": False} if i == 0 else {}))
    ray.init(address=cluster.address, log_to_driver=False)
    addrs = {x["NodeManagerAddress"] for x in ray.nodes()}
    if not all(a.startswith("127.") for a in addrs):
        print(f"warning: the nodes bind {addrs}, not only loopback (run this inside `unshare -n`)", file=sys.stderr)
    return cluster


def bench(name: str, devices: str, args) -> dict:
    from cooktop.engine.generate import load as local_load
    from cooktop.engine.sampling import SamplingParams

    if "/" in devices:
        from cooktop.cluster.load import load

        eng = load(args.model, ray_address=args.ray, device=devices, n_ctx=args.ctx, n_gpu_layers=-1)
    else:
        eng = local_load(args.model, device=devices, n_ctx=args.ctx, n_gpu_layers=-1)
    try:
        text = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told "
                "stories to every child that passed his door, and one of them")
        prompt = eng.tokenizer.tokenize(text, add_bos=True)[: args.prompt]
        greedy = SamplingParams(temperature=0)
        eng.generate(prompt, 4, greedy).drain()  # warm-up: kernels compiled, caches touched
        pp, tg, hops = [], [], []
        for _ in range(args.repeats):
            eng.reset()
            if hasattr(eng.model, "reset_stats"):
                eng.model.reset_stats()
            res = eng.generate(prompt, args.n_predict, greedy, stop=[]).drain()
            t = res.timings
            pp.append(1e3 * t.prompt_n / t.prompt_ms)
            tg.append(1e3 * t.eval_n / t.eval_ms)
            if hasattr(eng.model, "stats"):
                hops.append(eng.model.stats.summary())
        out = {"config": name, "devices": devices, "placement": eng.placement.summary(),
               "pp_tps_best": max(pp), "pp_tps_median": statistics.median(pp),
               "tg_tps_best": max(tg), "tg_tps_median": statistics.median(tg)}
        if hops:
            best = min(hops, key=lambda h: h["ms_per_token"])
            out["ray"] = {"ms_per_token": best["ms_per_token"], "compute_ms": best["compute_ms"],
                          "overhead_ms": best["overhead_ms"], "n_hops": best["n_hops"],
                          "overhead_ms_per_hop": best["overhead_ms_per_hop"],
                          "overhead_ms_per_hop_median": statistics.median(h["overhead_ms_per_hop"] for h in hops)}
        return out
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--ray", default=None, help="cluster address (else --local-nodes)")
    ap.add_argument("--local-nodes", type=int, default=0, help="start this many local nodes (in a netns!)")
    ap.add_argument("--config", action="append", required=True, help="NAME=DEVICES")
    ap.add_argument("-p", "--prompt", type=int, default=16, help="prompt tokens (at most 30)")
    ap.add_argument("-n", "--n-predict", type=int, default=32, help="generated tokens")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("-c", "--ctx", type=int, default=256)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    cluster = start_local_nodes(args.local_nodes) if args.local_nodes else None
    try:
        results = []
        for item in args.config:
            name, _, devices = item.partition("=")
            t0 = time.perf_counter()
            r = bench(name, devices, args)
            r["wall_s"] = time.perf_counter() - t0
            results.append(r)
            line = (f"{name:8s} {devices:34s} pp {r['pp_tps_best']:7.2f} t/s   tg {r['tg_tps_best']:6.2f} t/s best, "
                    f"{r['tg_tps_median']:6.2f} median")
            if "ray" in r:
                x = r["ray"]
                line += (f" | {x['ms_per_token']:.1f} ms/token = compute "
                         f"{' + '.join(f'{c:.1f}' for c in x['compute_ms'])} + overhead {x['overhead_ms']:.2f} "
                         f"({x['overhead_ms_per_hop']:.2f} ms/hop best, {x['overhead_ms_per_hop_median']:.2f} "
                         f"median, {x['n_hops']} hops)")
            print(line, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()


if __name__ == "__main__":
    main()
