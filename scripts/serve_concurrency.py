"""Serving throughput: N greedy requests to ``cooktop serve -np N`` one after another, then all at once.

Starts ``cooktop serve`` on 127.0.0.1 (an ephemeral port), warms it up with one request, sends
the N prompts one after another (each one's *alone* text, and the sequential wall time), then
all N at once from N threads (the concurrent wall time), and checks that every concurrent
answer equals its alone text. Every request goes through one ``httpx.Client`` (a connection per
concurrent request; a client made per request would spend this process's CPU on SSL contexts
inside the timed phases). With ``--vs-llama-cpp`` the same N prompts run through
llama.cpp in the same run: ``llama-server`` when ``--llama-server PATH`` is given, else
llama-cpp-python's low-level batch API driven as llama-server's ``update_slots`` drives it
(one ``llama_decode`` holding every sequence's prompt, then one per step holding one token of
every sequence; ``--parallel`` sequences of one unified cache; ``-t`` threads), greedy,
sequential (one sequence at a time) and concurrent. Each server's figures come with the load
averages before and after its run (the machine may be shared); a last table sums them up.
``--no-cache-prompt`` sends ``cache_prompt: false`` so the concurrent requests read their
prompts again instead of finding them in the slots the sequential run left.

    python scripts/serve_concurrency.py -m /tmp/tinyllama-1.1b-Q4_0.gguf --device opencl -np 8 -n 16 \
        --vs-llama-cpp --llama-server /tmp/llama-build/bin/llama-server -t 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import httpx

WORDS = ["there", "a dragon", "the king", "Tom", "Lily", "in the woods", "on a hill", "she", "he", "one day",
         "a big ship", "a little cat", "the sun", "a dog", "the sea", "a girl"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(base: str, proc: subprocess.Popen, log: Any, timeout: float = 600) -> None:
    """Wait for ``/health`` to answer 200; exit with the server's last log lines if it died or timed out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace").splitlines()[-8:]
            raise SystemExit(f"the server did not start ({' '.join(proc.args[:1])}, exit {proc.poll()}):\n"
                             + "\n".join(tail))
        time.sleep(0.2)


def load() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def serve(cmd: list[str], port: int, measure: Callable[[str], dict], env: dict | None = None) -> dict:
    """Start ``cmd`` (a server on 127.0.0.1:``port``), run ``measure(base_url)`` on it, stop it;
    the result gets the load averages before and after."""
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stderr=log, stdout=log, env=env)
        try:
            wait_up(base, proc, log)
            before = load()
            out = measure(base)
            return {**out, "load_before": before, "load_after": load()}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure_server(base: str, prompts: list[str], n: int, stagger: float = 0.0, cache_prompt: bool = True) -> dict:
    """Sequential and concurrent wall times against an OpenAI-style server, and how many concurrent
    answers equal their alone text; request ``i`` of the concurrent run starts ``i * stagger`` s in
    (so later prompts are read while earlier requests decode: mixed batches). ``cache_prompt``
    False (llama-server's request field) makes every request read its whole prompt again."""
    read: list[int] = []  # prompt tokens each concurrent request evaluated (llama-server's timings.prompt_n)
    # one client for every request (a connection each, kept open): httpx.post would make a client
    # (an SSL context: 40-180 ms of this process's CPU on 2 busy cores) per request, inside the
    # timed phases and competing with the server for the cores
    client = httpx.Client(timeout=900, limits=httpx.Limits(max_connections=len(prompts),
                                                           max_keepalive_connections=len(prompts)))

    def ask(p: str) -> str:
        r = client.post(base + "/v1/completions",
                        json={"prompt": p, "max_tokens": n, "temperature": 0, "cache_prompt": cache_prompt})
        r.raise_for_status()
        body = r.json()
        read.append(int((body.get("timings") or {}).get("prompt_n", -1)))
        return body["choices"][0]["text"]

    ask(prompts[0])  # warm-up (kernels built, caches touched)
    t0 = time.perf_counter()
    alone = [ask(p) for p in prompts]
    t_seq = time.perf_counter() - t0
    def later(i: int) -> str:
        time.sleep(i * stagger)
        return ask(prompts[i])

    read.clear()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
        t0 = time.perf_counter()
        together = list(ex.map(later, range(len(prompts))))
        t_conc = time.perf_counter() - t0
    client.close()
    return {"sequential_s": round(t_seq, 3), "concurrent_s": round(t_conc, 3),
            "equal": sum(a == b for a, b in zip(alone, together)), "n": len(prompts),
            "prompt_tokens_read_concurrent": sum(read),
            "differing": [i for i, (a, b) in enumerate(zip(alone, together)) if a != b]}


def run_cooktop(a: argparse.Namespace, prompts: list[str]) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "cooktop.cli", "serve", "-m", a.model, "--port", str(port), "-np", str(a.parallel),
           "-c", str(a.ctx_size), "--device", a.device, *a.extra]
    return serve(cmd, port, lambda base: measure_server(base, prompts, a.n_predict, a.stagger, a.cache_prompt),
                 env=dict(os.environ))


def run_llama_server(a: argparse.Namespace, prompts: list[str]) -> dict:
    port = free_port()
    cmd = [a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "-np", str(a.parallel),
           "-c", str(a.ctx_size * a.parallel), "-t", str(a.threads)]
    res = serve(cmd, port, lambda base: measure_server(base, prompts, a.n_predict, a.stagger, a.cache_prompt))
    return {**res, "how": f"llama-server -np {a.parallel} -t {a.threads} ({a.llama_server})"}


def run_llama_cpp_batched(a: argparse.Namespace, prompts: list[str]) -> dict:
    """llama-server's decode loop over llama-cpp-python's low-level API (module doc)."""
    import ctypes

    import numpy as np

    from cooktop.bench.vs_llamacpp import import_llama_cpp

    lc = import_llama_cpp()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    os.dup2(devnull, 2)  # llama.cpp's load log

    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = lc.llama_model_load_from_file(a.model.encode(), mp)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    cp = lc.llama_context_default_params()
    n_seq = len(prompts)
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = a.ctx_size * n_seq, 512, 512, n_seq
    cp.n_threads = cp.n_threads_batch = a.threads
    cp.kv_unified = True
    ctx = lc.llama_init_from_model(model, cp)
    mem = lc.llama_get_memory(ctx)
    batch = lc.llama_batch_init(512, 0, n_seq)
    toks = []
    for p in prompts:
        buf = (lc.llama_token * 512)()
        k = lc.llama_tokenize(vocab, p.encode(), len(p.encode()), buf, 512, True, True)
        toks.append(list(buf[:k]))

    def decode(items: list[tuple[int, int, int, bool]]) -> list[int]:
        batch.n_tokens = len(items)
        for i, (tok, pos, s, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = s, want
        if lc.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        out = []
        for i, (*_, want) in enumerate(items):
            if want:
                row = np.ctypeslib.as_array(ctypes.cast(lc.llama_get_logits_ith(ctx, i),
                                                        ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
                out.append(int(np.argmax(row)))
        return out

    def generate(seqs: list[int]) -> list[list[int]]:
        for s in seqs:
            lc.llama_memory_seq_rm(mem, s, -1, -1)
        cur = decode([(t, p, s, p == len(toks[s]) - 1) for s in seqs for p, t in enumerate(toks[s])])
        outs = [[c] for c in cur]
        for j in range(a.n_predict - 1):
            cur = decode([(cur[i], len(toks[s]) + j, s, True) for i, s in enumerate(seqs)])
            for o, c in zip(outs, cur):
                o.append(c)
        return outs

    try:
        generate([0])  # warm-up
        t0 = time.perf_counter()
        alone = [generate([s])[0] for s in range(n_seq)]
        t_seq = time.perf_counter() - t0
        t0 = time.perf_counter()
        together = generate(list(range(n_seq)))
        t_conc = time.perf_counter() - t0
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)
        os.dup2(saved, 2)
    return {"sequential_s": round(t_seq, 3), "concurrent_s": round(t_conc, 3),
            "equal": sum(x == y for x, y in zip(alone, together)), "n": n_seq,
            "how": f"llama-cpp-python {lc.__version__} low-level batch API, CPU, -t {a.threads}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-np", "--parallel", type=int, default=8, help="slots, and the number of requests")
    ap.add_argument("-n", "--n-predict", type=int, default=16)
    ap.add_argument("-c", "--ctx-size", type=int, default=256, help="context of each slot")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's threads")
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--vs-llama-cpp", action="store_true")
    ap.add_argument("--llama-server", default=os.environ.get("COOKTOP_LLAMA_SERVER"),
                    help="a llama-server binary (default $COOKTOP_LLAMA_SERVER; else llama-cpp-python's batch API)")
    ap.add_argument("--no-cache-prompt", dest="cache_prompt", action="store_false",
                    help="send cache_prompt: false (each request reads its whole prompt, none reuses a slot's)")
    ap.add_argument("--no-cooktop", action="store_true")
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between the concurrent requests' starts")
    ap.add_argument("extra", nargs="*", help="more `cooktop serve` options (after --)")
    a = ap.parse_args()
    if a.vs_llama_cpp and a.llama_server and not (os.path.isfile(a.llama_server)
                                                  and os.access(a.llama_server, os.X_OK)):
        raise SystemExit(f"error: --llama-server {a.llama_server}: no executable file there")
    prompts = [f"Once upon a time {WORDS[i % len(WORDS)]}" for i in range(a.parallel)]
    report: dict = {"model": os.path.basename(a.model), "requests": a.parallel, "max_tokens": a.n_predict}
    if not a.no_cooktop:
        report["cooktop"] = {**run_cooktop(a, prompts), "device": a.device}
    if a.vs_llama_cpp:
        report["llama.cpp"] = run_llama_server(a, prompts) if a.llama_server else run_llama_cpp_batched(a, prompts)
    print(json.dumps(report, indent=1))
    print("| server | sequential | concurrent | speed-up | equal to alone | prompt tokens read (concurrent) "
          "| load before / after |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, r in report.items():
        if isinstance(r, dict):
            print(f"| {name} | {r['sequential_s']:.2f} s | {r['concurrent_s']:.2f} s | "
                  f"{r['sequential_s'] / r['concurrent_s']:.2f}x | {r['equal']} / {r['n']} | "
                  f"{r.get('prompt_tokens_read_concurrent', '')} | "
                  f"{r.get('load_before', '')} / {r.get('load_after', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
