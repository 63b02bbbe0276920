"""Logits of a model run whole on one device (``-ngl -1``, ``logits_all``) against numpy's: the
by-hand check of tensors past a device's largest buffer (README, "Splitting layers").

Usage::

    python scripts/split_check.py MODEL.gguf DEVICE [N_CTX]
    COOKTOP_DEVICE_MEMORY=opencl:0=4GiB/128MiB TAG=small VS=big python scripts/split_check.py ...

Prints the placement, the output matrix and ``logits_all`` (with their chunk counts), the device's
largest buffer, load and eval seconds, the nmse against numpy (computed once and kept beside the
model as ``MODEL.gguf.ref<N_CTX>.npy``) and how many positions' argmax agree. ``TAG`` keeps this
run's logits as ``MODEL.gguf.<TAG>.npy``; ``VS`` compares them with an earlier tag's.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import numpy as np

from cooktop import Llama
from cooktop.backends.base import nmse

PROMPT = [int(t) for t in np.random.default_rng(0).integers(300, 20000, 8)]


def run(path: str, device: str, n_ctx: int) -> tuple[np.ndarray, float, float, str]:
    """(logits float64 [len(PROMPT), n_vocab], load s, eval s, what was split)."""
    t0 = time.time()
    llm = Llama(model_path=path, n_ctx=n_ctx, logits_all=True, verbose=False, device=device, n_gpu_layers=-1)
    t1 = time.time()
    llm.eval(PROMPT)
    out = np.array(llm.scores[:len(PROMPT)], dtype=np.float64)
    info = ""
    if device != "cpu":
        seg = llm._engine.model.segments[-1]
        info = (f"placement: {llm._engine.placement.summary()}; output {seg.head_weights['output']!r}; "
                f"logits_all {seg.logits_all!r}; largest buffer {seg.device.buffer_limit}")
    llm.close()
    return out, t1 - t0, time.time() - t1, info


def main() -> None:
    path, device = sys.argv[1], sys.argv[2]
    n_ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    ref_file = pathlib.Path(f"{path}.ref{n_ctx}.npy")
    if ref_file.exists():
        ref = np.load(ref_file)
    else:
        ref, t_load, t_eval, _ = run(path, "cpu", n_ctx)
        np.save(ref_file, ref)
        print(f"numpy: load {t_load:.1f}s eval {t_eval:.1f}s")
    got, t_load, t_eval, info = run(path, device, n_ctx)
    print(info)
    print(f"{device}: load {t_load:.1f}s eval {t_eval:.1f}s; nmse vs numpy {nmse(got, ref):.3g}; argmax equal "
          f"{int((got.argmax(-1) == ref.argmax(-1)).sum())}/{len(PROMPT)}")
    tag, other = os.environ.get("TAG"), os.environ.get("VS")
    if tag:
        np.save(f"{path}.{tag}.npy", got)
    if other:
        o = np.load(f"{path}.{other}.npy")
        print(f"nmse vs {other}: {nmse(got, o):.3g}; max abs diff {np.abs(got - o).max():.3g}")


if __name__ == "__main__":
    main()
