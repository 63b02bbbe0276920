#!/usr/bin/env python3
"""Time to first token of a request whose long system prompt is cached in a free slot vs not.

Runs the server's Scheduler (``-np`` slots, no HTTP) on a model: request A (system prompt +
question 1) finds nothing cached; request B (same system prompt + question 2) reuses A's slot
(prompt-prefix reuse). Prints TTFT and cached_tokens of each.

    python scripts/ttft_prefix.py -m /tmp/models/tinyllama-1.1b-Q4_0.gguf --device cpu -np 2 --system-tokens 200
"""

from __future__ import annotations

import argparse
import asyncio
import time

from cooktop import Llama
from cooktop.server.slots import Scheduler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-np", "--parallel", type=int, default=2)
    ap.add_argument("--system-tokens", type=int, default=200)
    a = ap.parse_args()
    llm = Llama(a.model, n_ctx=512, device=a.device, n_gpu_layers=-1, verbose=False)
    words = "You are a helpful assistant who answers briefly and politely about cooking and kitchens. "
    system = words
    while len(llm.tokenize(system.encode())) < a.system_tokens:
        system += words
    ids = llm.tokenize(system.encode())[:a.system_tokens]
    sched = Scheduler(llm, a.parallel)

    async def ask(question: str) -> tuple[float, dict]:
        prompt = ids + llm.tokenize((" Question: " + question).encode(), add_bos=False)
        t0 = time.perf_counter()
        job = sched.submit(lambda lm: iter(lm.create_completion(prompt, max_tokens=4, temperature=0, stream=True)),
                           asyncio.get_running_loop())
        ttft, last = None, None
        async for chunk in job.events():
            if ttft is None:
                ttft = time.perf_counter() - t0
            last = chunk
        return ttft, last["usage"]

    async def run() -> None:
        for name, q in (("not cached", "How long do I boil an egg?"), ("cached", "How do I sharpen a knife?")):
            ttft, usage = await ask(q)
            print(f"{name:>10}: TTFT {ttft * 1000:8.1f} ms, prompt {usage['prompt_tokens']} tokens, "
                  f"cached {usage['prompt_tokens_details']['cached_tokens']}")

    asyncio.run(run())
    sched.close()


if __name__ == "__main__":
    main()
