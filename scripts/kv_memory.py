"""KV cache bytes and peak memory of one model at one context, cooktop against llama.cpp, per cache type.

Each (engine, cache type) runs in a child process (so ``ru_maxrss`` is that run's peak): load the
model with ``n_ctx`` and the cache types (K = V), evaluate ``--tokens`` tokens, report the KV bytes
(cooktop: the cache tensors' bytes; llama.cpp: its ``llama_kv_cache: size = ... MiB`` log line), the
device bytes cooktop allocated (0 on numpy) and the child's peak resident memory. Prints a markdown
table. Usage::

    python scripts/kv_memory.py MODEL.gguf [-c 8192] [--types f32,f16,q8_0] [--device cpu] [--tokens 8]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

_COOKTOP = r"""
import json, resource, sys
from cooktop import Llama
path, n_ctx, t, device, n_tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
llm = Llama(model_path=path, n_ctx=n_ctx, type_k=t, type_v=t, flash_attn=True, device=device, n_gpu_layers=-1,
            verbose=False)
llm.eval(list(range(1, n_tok + 1)))
m = llm._engine.model
kv = sum(x.nbytes for ks in llm._engine.seq.cache.k for x in ks) + sum(x.nbytes for vs in llm._engine.seq.cache.v
                                                                         for x in vs)
dev = sum(s.device.allocated_bytes for s in m.segments if s.device.info.backend != "cpu")
print(json.dumps({"kv": kv, "device": dev, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

_LLAMA = r"""
import json, os, resource, sys
import llama_cpp
path, n_ctx, t, n_tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, type_k=t, type_v=t, flash_attn=True, n_gpu_layers=0,
                      n_threads=os.cpu_count(), verbose=True)
llm.eval(list(range(1, n_tok + 1)))
print(json.dumps({"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

IDS = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2}


def _run(code: str, args: list[str], env: dict[str, str]) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode:
        raise SystemExit(f"child failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-c", "--ctx-size", type=int, default=8192)
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    env = {**os.environ, "COOKTOP_CPU_CACHE": os.environ.get("COOKTOP_CPU_CACHE", "0")}
    rows = ["| engine | device | cache K = V | KV MiB | device MiB | peak RSS MiB |", "|---|---|---|---:|---:|---:|"]
    for name in a.types.split(","):
        t = str(IDS[name])
        ours, _ = _run(_COOKTOP, [a.model, str(a.ctx_size), t, a.device, str(a.tokens)], env)
        rows.append(f"| cooktop | {a.device} | {name} | {ours['kv'] / 2**20:.1f} | {ours['device'] / 2**20:.1f} | "
                    f"{ours['rss'] / 2**20:.0f} |")
        ref, log = _run(_LLAMA, [a.model, str(a.ctx_size), t, str(a.tokens)], env)
        m = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB", log)
        kv = float(m.group(1)) if m else float("nan")
        rows.append(f"| llama.cpp (llama-cpp-python) | cpu | {name} | {kv:.1f} | 0.0 | {ref['rss'] / 2**20:.0f} |")
        print(rows[-2], rows[-1], sep="\n", file=sys.stderr)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
