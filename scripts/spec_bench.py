"""Decoding speed with and without speculative decoding on one task, runs alternated.

Generates ``-n`` greedy tokens after the prompt ``-r`` times without drafts and ``-r`` times with
each drafter given, alternating (plain, drafter 1, ..., plain, ...) so that a loaded machine
slows all of them alike, and prints per configuration the median decode speed (generated
tokens / (wall time - prompt time)), the best one, the forward passes, drafted / accepted
tokens and the acceptance rate; it checks that every run's text is the plain one.

    python scripts/spec_bench.py -m ../shared/models/stories260K.gguf --device opencl -n 128 -r 5 \\
        --lookup 3,8 --ngram 4,16 [-md DRAFT.gguf --draft-max 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from cooktop.engine import generate as G
from cooktop.engine.sampling import SamplingParams
from cooktop.engine.speculative import DraftModel, LlamaPromptLookupDecoding, NgramSimple, Speculation

#: the default task: rewrite a short story (the prompt gives it, then starts it again)
TASK = ("Rewrite the story.\nStory: Tom had a little dog named Max. Max liked to run in the park. One day Max ran "
        "into the woods and Tom was sad. Then Max came back with a big stick and Tom was happy.\nRewritten: Tom had "
        "a little dog named Max.")


def pair(text: str) -> tuple[int, int]:
    a, b = text.split(",")
    return int(a), int(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-p", "--prompt", default=TASK)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--lookup", type=pair, action="append", default=[], metavar="MAX_NGRAM,NUM_PRED",
                    help="LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens)")
    ap.add_argument("--ngram", type=pair, action="append", default=[], metavar="N,M",
                    help="llama.cpp ngram-simple (--spec-ngram-simple-size-n N --spec-ngram-simple-size-m M)")
    ap.add_argument("-md", "--model-draft", default=None)
    ap.add_argument("--draft-max", type=int, default=3)
    a = ap.parse_args()
    eng = G.load(a.model, n_ctx=1024, device=a.device, n_gpu_layers=-1)
    configs: list[tuple[str, Speculation | None]] = [("none", None)]
    configs += [(f"lookup {n},{m}", Speculation(LlamaPromptLookupDecoding(n, m), m)) for n, m in a.lookup]
    configs += [(f"ngram-simple {n},{m}", Speculation(NgramSimple(n, m), m)) for n, m in a.ngram]
    if a.model_draft:
        dft = G.load(a.model_draft, n_ctx=1024, device=a.device, n_gpu_layers=-1)
        configs.append((f"draft {a.model_draft.rsplit('/', 1)[-1]} x{a.draft_max}",
                        Speculation(DraftModel(dft, a.draft_max, vocab_of=eng), a.draft_max)))
    prompt = eng.tokenizer.tokenize(a.prompt, add_bos=True)
    speeds: dict[str, list[float]] = {name: [] for name, _ in configs}
    last: dict[str, G.GenerationResult] = {}
    params = SamplingParams(temperature=0)
    for _ in range(a.repetitions + 1):  # the first round warms up (kernels, caches) and is dropped
        for name, spec in configs:
            eng.seq.reset()
            t0 = time.perf_counter()
            r = eng.generate(prompt, a.n_predict, params, draft=spec).drain()
            wall = time.perf_counter() - t0 - r.timings.prompt_ms / 1e3
            speeds[name].append(len(r.tokens) / wall)
            last[name] = r
    plain = last["none"]
    print(f"{a.model} on {a.device}: {len(prompt)} prompt tokens, {len(plain.tokens)} generated, "
          f"{a.repetitions} alternated runs each")
    print("| drafting | t/s (median) | t/s (best) | forwards | drafted | accepted | acceptance | same text |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, _ in configs:
        s, r = speeds[name][1:], last[name]
        t = r.timings
        acc = f"{100 * t.n_accepted / t.n_drafted:.1f} %" if t.n_drafted else "-"
        print(f"| {name} | {statistics.median(s):.1f} | {max(s):.1f} | {t.eval_n} | {t.n_drafted or 0} | "
              f"{t.n_accepted} | {acc} | {'yes' if r.tokens == plain.tokens else 'NO'} |")
    return 0 if all(last[n].tokens == plain.tokens for n, _ in configs) else 1


if __name__ == "__main__":
    sys.exit(main())
