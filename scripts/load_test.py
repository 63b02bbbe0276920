"""Load test of ``cooktop serve`` on loopback: N concurrent streaming clients, greedy sampling.

Starts ``cooktop serve`` on 127.0.0.1 (an ephemeral port), asks each prompt once
without streaming (the expected text), then runs all clients at once with
``stream: true`` and checks: every request succeeds, every stream ends with
``data: [DONE]``, every event parses, and each streamed text equals the same
request's non-streamed text. Prints wall time and generated tokens per second.

    python scripts/load_test.py -m ../shared/models/stories260K.gguf --clients 32 -n 64 -np 4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "cooktop.cli", "serve", "-m", a.model, "--port", str(port),
                               "-np", str(a.parallel), "-c", str(a.ctx_size), "--device", a.device],
                              stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        words = ["there", "a", "the", "Tom", "Lily", "in", "on", "she", "he", "one", "big", "little", "sun", "dog",
                 "cat", "girl"]
        prompts = [f"Once upon a time {words[i % len(words)]}" for i in range(a.clients)]
        body = {"max_tokens": a.max_tokens, "temperature": 0}
        expected = {p: httpx.post(base + "/v1/completions", json={"prompt": p, **body}, timeout=300).json()
                    for p in set(prompts)}

        def one(p: str) -> tuple[bool, str, int, int]:
            text, events, done = [], 0, False
            with httpx.stream("POST", base + "/v1/completions", json={"prompt": p, "stream": True,
                                                                      "stream_options": {"include_usage": True},
                                                                      **body}, timeout=600) as r:
                if r.status_code != 200:
                    return False, "", 0, 0
                n_tok = 0
                for line in r.iter_lines():
                    if not line:
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    ev = json.loads(line.removeprefix("data: "))
                    if ev.get("usage"):
                        n_tok = ev["usage"]["completion_tokens"]
                    if ev.get("choices"):
                        text.append(ev["choices"][0]["text"])
                    events += 1
            return done, "".join(text), events, n_tok

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(a.clients) as pool:
            results = list(pool.map(one, prompts))
        wall = time.perf_counter() - t0
        failed = sum(not done for done, *_ in results)
        mismatched = sum(text != expected[p]["choices"][0]["text"] for p, (_, text, _, _) in zip(prompts, results))
        tokens = sum(n for *_, n in results)
        print(f"clients {a.clients}, -np {a.parallel}, max_tokens {a.max_tokens}, device {a.device}: "
              f"wall {wall:.2f} s, {tokens} tokens generated, {tokens / wall:.1f} tokens/s; "
              f"failed {failed}, streamed != non-streamed {mismatched}")
        return 0 if failed == 0 and mismatched == 0 else 1
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
