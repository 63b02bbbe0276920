"""Time ``Llama(model_path=<vocab gguf>, vocab_only=True)`` (read the vocabulary, build the tokenizer)
in fresh processes, wall-clock and CPU time; and, for comparison, gguf's GGUFReader on the same file.

Usage: python scripts/vocab_load_time.py [--reader] VOCAB.gguf...   (prints the best of 5 runs)
"""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
from cooktop import Llama
t1, c1 = time.perf_counter(), time.process_time()
if sys.argv[2] == "reader":
    import gguf
    r = gguf.GGUFReader(sys.argv[1]); n = len(r.fields["tokenizer.ggml.tokens"].data)
else:
    n = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False).n_vocab()
print(n, time.perf_counter() - t1, time.process_time() - c1)
"""


def main(argv: list[str]) -> None:
    mode = "reader" if "--reader" in argv else "llama"
    for path in [a for a in argv if not a.startswith("--")]:
        runs = []
        for _ in range(5 if mode == "llama" else 1):
            out = subprocess.run([sys.executable, "-c", _CHILD, path, mode], capture_output=True, text=True, check=True)
            n, wall, cpu = out.stdout.split()
            runs.append((float(wall), float(cpu)))
        wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
        what = "gguf.GGUFReader" if mode == "reader" else "Llama(vocab_only=True)"
        print(f"{path}: {n} tokens, {what}: {wall:.3f} s wall, {cpu:.3f} s CPU (best of {len(runs)})")


if __name__ == "__main__":
    main(sys.argv[1:])
