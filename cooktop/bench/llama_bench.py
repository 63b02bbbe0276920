"""``--vs llama.cpp --llama-bench PATH``: llama.cpp's own ``llama-bench`` binary as the reference.

llama-cpp-python (``--vs llama.cpp`` alone) runs llama.cpp's CPU backend in this
process; a llama-bench binary built with a GPU backend (scripts/build-llamacpp-vulkan.sh:
llama.cpp's Vulkan backend) compares cooktop with llama.cpp on the *same driver*.
The binary runs once per (model, n_batch), before cooktop's runs of that model (back to
back, not interleaved: llama-bench loads the model and compiles its pipelines once per
process), with the same tests (``-p``, ``-n``, ``-pg``), repetitions (``-r``) and chunk
size (``-b`` = ``-ub``), ``-o json``; its per-run ``samples_ts`` become the llama.cpp
records and the paired runs of cooktop's records on that model and test (so the table's
``vs llama.cpp`` column is cooktop's mean t/s over llama-bench's).

Device: for a ``vulkan:N`` device in ``--device``, llama-bench gets ``-ngl 99`` and
``GGML_VK_VISIBLE_DEVICES=N`` (llama.cpp 0.3.x uses only discrete GPUs by default, which
would leave out lavapipe and integrated GPUs; both programs enumerate devices through the
same loader, so index N is the same device; VK_ICD_FILENAMES set by the caller reaches
both); otherwise ``-ngl 0``. Source of the options and JSON fields: llama.cpp
examples/llama-bench/llama-bench.cpp.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from ..errors import CooktopError
from ..format.kvtypes import KVConfig, kv_type_name
from .runner import ModelFacts, Result, TestSpec

#: Environment variable naming the binary when ``--llama-bench`` is not given.
ENV = "COOKTOP_LLAMA_BENCH"

#: How to get a binary, shown when it is missing.
BUILD_HINT = "build one with scripts/build-llamacpp-vulkan.sh (llama.cpp's Vulkan backend; prints its path)"


def find_binary(path: str) -> str:
    """The executable ``path`` (a file, or a name on PATH).

    Raises:
        CooktopError: not found or not executable.
    """
    found = path if os.path.isfile(path) else shutil.which(path)
    if not found or not os.access(found, os.X_OK):
        raise CooktopError(f"--llama-bench {path}: no such executable; {BUILD_HINT}")
    return found


def command(binary: str, model: str, tests: Sequence[TestSpec], reps: int, n_batch: int,
            device: str, kv: KVConfig | None = None, warmup: bool = True) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of one llama-bench run over ``tests`` (see module doc): their depths
    as ``-d``, ``kv``'s cache types and flash attention as ``-ctk``/``-ctv``/``-fa``, and
    ``--no-warmup`` when ``warmup`` is False."""
    pp = list(dict.fromkeys(t.n_prompt for t in tests if t.n_prompt and not t.n_gen))
    tg = list(dict.fromkeys(t.n_gen for t in tests if t.n_gen and not t.n_prompt))
    pg = list(dict.fromkeys((t.n_prompt, t.n_gen) for t in tests if t.n_prompt and t.n_gen))
    argv = [binary, "-m", model, "-p", ",".join(map(str, pp)) or "0", "-n", ",".join(map(str, tg)) or "0",
            "-r", str(reps), "-b", str(n_batch), "-ub", str(n_batch), "-o", "json"]
    for p, g in pg:
        argv += ["-pg", f"{p},{g}"]
    depths = list(dict.fromkeys(t.n_depth for t in tests))
    if depths != [0]:
        argv += ["-d", ",".join(map(str, depths))]
    if not warmup:
        argv += ["--no-warmup"]
    if kv is not None:
        argv += ["-ctk", kv_type_name(kv.type_k), "-ctv", kv_type_name(kv.type_v), "-fa", kv.flash_attn]
    env: dict[str, str] = {}
    family, _, index = device.partition(":")
    if family.lower() == "vulkan":
        argv += ["-ngl", "99"]
        if "GGML_VK_VISIBLE_DEVICES" not in os.environ:
            env["GGML_VK_VISIBLE_DEVICES"] = index or "0"
    else:
        argv += ["-ngl", "0"]
    return argv, env


def parse(text: str) -> list[dict[str, Any]]:
    """llama-bench's ``-o json`` output: a list of test records.

    Raises:
        CooktopError: not the expected JSON.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CooktopError(f"llama-bench printed no JSON ({e}): {text[:200]!r}") from None
    if not isinstance(data, list) or not all(isinstance(d, dict) and "samples_ts" in d for d in data):
        raise CooktopError("llama-bench's JSON is not a list of test records with samples_ts")
    return data


def run(binary: str, mf: ModelFacts, tests: Sequence[TestSpec], reps: int, n_batch: int, device: str,
        timeout: float = 7200.0, kv: KVConfig | None = None, warmup: bool = True) -> list[Result]:
    """Run llama-bench on one model; one llama.cpp :class:`Result` per test (in ``tests`` order);
    ``warmup=False`` passes ``--no-warmup``.

    A failed run (exit status, no JSON, a test missing from its output) becomes records with
    ``error`` set (the last line of its stderr), not an exception.
    """
    argv, extra = command(binary, mf.path, tests, reps, n_batch, device, kv, warmup)
    ngl = int(argv[argv.index("-ngl") + 1])
    results = [Result(mf, "llama.cpp", device, "llama-bench", ngl, n_batch, None, t,
                      placement=f"llama-bench -ngl {ngl}", kv=kv or KVConfig()) for t in tests]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **extra})
    except (OSError, subprocess.TimeoutExpired) as e:
        return _fail(results, f"llama-bench did not run: {type(e).__name__}: {e}")
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        return _fail(results, f"llama-bench exited with status {r.returncode}: {last}")
    try:
        records = parse(r.stdout)
    except CooktopError as e:
        return _fail(results, str(e))
    by_test = {(int(d.get("n_prompt", 0)), int(d.get("n_gen", 0)), int(d.get("n_depth", 0))): d for d in records}
    for res in results:
        d = by_test.get((res.test.n_prompt, res.test.n_gen, res.test.n_depth))
        if d is None:
            res.error = f"llama-bench printed no record for {res.test.name}"
            continue
        res.samples_s = [res.test.n_tokens / float(ts) for ts in d["samples_ts"] if float(ts) > 0]
        backends = d.get("backends", "")
        res.device_name = f"{d.get('gpu_info') or d.get('cpu_info', '')} (llama-bench, {backends})".strip()
        if "Vulkan" not in backends and device.lower().startswith("vulkan"):
            res.error = f"this llama-bench has no Vulkan backend (backends: {backends or 'none'})"
    return results


def _fail(results: list[Result], why: str) -> list[Result]:
    for res in results:
        res.error = why
    return results


def pair(results: list[Result], refs: list[Result]) -> None:
    """Give each cooktop result the llama-bench runs of its model, n_batch, cache types and test as paired runs."""
    by_key = {(r.model.path, r.n_batch, r.kv, r.test): r for r in refs if r.avg_ts is not None}
    for res in results:
        ref = by_key.get((res.model.path, res.n_batch, res.kv, res.test))
        if ref is not None and res.backend != "llama.cpp":
            res.paired_ts = list(ref.samples_ts)
