"""KV cache bytes at one context of a model file: cooktop's (``info``'s count and a real allocation)
against llama.cpp's (llama-cpp-python's log lines ``llama_kv_cache: size = ... MiB``), for the
README's sliding-window cache table.

Usage: python scripts/swa_kv_bytes.py MODEL.gguf [N_CTX] [--no-alloc]
Prints one JSON line: cooktop's info bytes, allocated bytes (numpy, f16 cache), llama.cpp's bytes
(the sum of its cache lines; flash attention on, so V is not stored transposed at the widest layer's
width; ``swa_full`` off as llama.cpp's command line, and on as llama-cpp-python's default) and its lines.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

_LLAMA = r"""
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_batch=512, n_ubatch=512, verbose=True,
                      swa_full=sys.argv[3] == "1", flash_attn=True)
llm.close()
"""


def llama_cpp_kv(path: str, n_ctx: int, swa_full: bool) -> tuple[int, list[str]]:
    """llama.cpp's KV bytes with flash attention on and ``swa_full`` (the sum of its
    ``llama_kv_cache: size = X MiB`` lines) and its cache lines."""
    p = subprocess.run([sys.executable, "-c", _LLAMA, path, str(n_ctx), "1" if swa_full else "0"],
                       capture_output=True, text=True, check=True)
    lines = [ln.strip() for ln in p.stderr.splitlines()
             if ln.startswith("llama_kv_cache: size =") or "KV cache, size =" in ln]
    mib = [float(m.group(1)) for ln in lines for m in [re.search(r"^llama_kv_cache: size = +([0-9.]+) MiB", ln)] if m]
    return int(round(sum(mib) * 2 ** 20)), lines


def main() -> None:
    from cooktop.cli.info import model_info
    path, n_ctx = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 32768
    info = model_info(path, n_ctx)["kv_cache"]["bytes"]
    alloc = None
    if "--no-alloc" not in sys.argv:
        from cooktop.engine import generate
        eng = generate.load(path, n_ctx=n_ctx, n_batch=512, device="cpu")
        c = eng.seq.cache
        alloc = sum(t.nbytes for seg in c.k + c.v for t in {id(x): x for x in seg}.values())
        eng.close()
    ll, lines = llama_cpp_kv(path, n_ctx, False)
    full, _ = llama_cpp_kv(path, n_ctx, True)
    print(json.dumps({"model": os.path.basename(path), "n_ctx": n_ctx, "cooktop_info_bytes": info,
                      "cooktop_allocated_bytes": alloc, "llama_cpp_bytes": ll, "llama_cpp_swa_full_bytes": full,
                      "llama_cpp_lines": lines}))


if __name__ == "__main__":
    main()
