"""The autotuner: time each point of the search space (:mod:`.space`) on an open device at a model's
real shapes, keep only candidates that give the default's result (bit for bit for ``exact``
families, within the parity bound otherwise), pick the fastest, within a time budget.

For each kernel family key (``mat_vec:Q4_K``, ``prompt_matmul:Q4_K``, ``rmsnorm``, ``attention``):

1. the default (today's launch parameters) runs once: its output is the reference; it is timed
   (warm-up, then the median of ``runs`` timings, each of enough repeats to last ~2 ms);
2. each candidate is applied (``device.apply_tuning``: kernels rebuilt with its parameters), run
   once and compared with the reference (a mismatch rejects it, recorded as ``rejected``), then
   timed the same way;
3. the fastest is confirmed: it and the default are timed in :data:`CONFIRM_PAIRS` alternating
   pairs (each the fastest of ``runs`` timings), and it is kept only if it is at least ``min_gain``
   (3%) faster in :data:`CONFIRM_WINS` of them and in their medians (the times reported);
   otherwise the default stays (tuned must never be slower than untuned by more than noise).

Families are tuned one after another with the choices so far applied (coordinate descent); the
budget (seconds, compile time included) is checked before every candidate and confirmation pair:
when it runs out the remaining candidates are skipped (an unconfirmed winner is not chosen), the
record says ``complete: False``, and what was chosen so far (each choice fully checked) is kept.
The weights are the model's own tensors (per type, the shape holding most of its weights: see
:func:`model_shapes`), or random ones quantized with :func:`cooktop.quantize.rows.quantize_rows` without a model.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ...errors import CooktopError
from . import space

#: Shapes tuned without a model: (type, n_out, n_in) of a 1.1B llama layer (TinyLlama's 2048 / 5632).
DEFAULT_SHAPES: tuple[tuple[T, int, int], ...] = ((T.Q4_0, 2048, 2048), (T.Q4_K, 2048, 2048), (T.Q6_K, 2048, 2048),
                                                  (T.Q8_0, 2048, 2048))


#: A winner is confirmed in this many alternating (candidate, default) timing pairs and kept only when
#: it is ``min_gain`` faster in at least CONFIRM_WINS of them and in their medians (on a loaded
#: machine a first timing's 3x was the default's bad luck: 12 interleaved pairs gave 0.85x).
CONFIRM_PAIRS, CONFIRM_WINS = 5, 4


@dataclasses.dataclass
class KernelResult:
    """The outcome of one family key: ``default`` / ``chosen`` parameters, their times (ms, medians),
    ``speedup`` (default_ms / chosen_ms), candidates ``tried``, ``rejected`` (parameters and why),
    ``skipped`` (budget), ``shape`` (what was timed, in words)."""

    kernel: str
    shape: str
    default: dict[str, int]
    chosen: dict[str, int]
    default_ms: float
    chosen_ms: float
    tried: int = 0
    skipped: int = 0
    rejected: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def speedup(self) -> float:
        """default_ms / chosen_ms (1.0 when the default stays)."""
        return self.default_ms / self.chosen_ms if self.chosen_ms > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, ``speedup`` included."""
        return dict(dataclasses.asdict(self), speedup=round(self.speedup, 4))


def model_shapes(path: str, types: Any = None) -> list[tuple[T, int, int, np.ndarray]]:
    """``(type, n_out, n_in, raw rows uint8 [n_out, row_bytes])`` per quantized or float weight type of
    the GGUF at ``path``: the shape of that type holding the most weight values in the model (e.g. a
    layer's FFN matrices rather than a lone output matrix), with one such tensor's own bytes, for the
    ``types`` given (default: all). ``token_embd`` (rows looked up, not multiplied) is left out.

    Raises:
        CooktopError: the file cannot be read as GGUF.
    """
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - any parse error of the file
        raise CooktopError(f"cannot read {path} as a GGUF model: {type(e).__name__}: {e}") from e
    weight: dict[tuple[T, int, int], int] = {}
    first: dict[tuple[T, int, int], Any] = {}
    for t in reader.tensors:
        if len(t.shape) != 2 or t.name.startswith("token_embd"):
            continue
        gt = T(int(t.tensor_type))
        if types is not None and gt not in types:
            continue
        key = (gt, int(t.shape[1]), int(t.shape[0]))  # gguf lists ne (innermost first): (n_in, n_out)
        weight[key] = weight.get(key, 0) + int(t.n_elements)
        first.setdefault(key, t)
    best: dict[T, tuple[T, int, int]] = {}
    for key, n in weight.items():
        if key[0] not in best or n > weight[best[key[0]]]:
            best[key[0]] = key
    return [(gt, n_out, n_in, np.asarray(first[(gt, n_out, n_in)].data)) for gt, n_out, n_in in best.values()]


def synthetic_shapes(quantize_rows: Callable[[np.ndarray, T], np.ndarray], shapes: Any = DEFAULT_SHAPES,
                     seed: int = 0) -> list[tuple[T, int, int, np.ndarray]]:
    """Random weights of ``shapes`` ((type, n_out, n_in)), quantized by ``quantize_rows(x, type)`` (the
    caller's: :func:`cooktop.quantize.rows.quantize_rows`, llama.cpp's rounding; the quantizer sits above
    the backends)."""
    rng = np.random.default_rng(seed)
    return [(t, n_out, n_in, quantize_rows(rng.standard_normal((n_out, n_in), dtype=np.float32) * 0.05, t))
            for t, n_out, n_in in shapes]


def _time(dev: Any, op: Callable[[], None], runs: int, repeats: int, best: bool = False) -> float:
    """Median wall time of one ``op`` in ms over ``runs`` timings of ``repeats`` calls each (``best``:
    the fastest timing instead; other processes only ever add time, so on a shared machine the
    minimum is the steadier estimate of the kernel's own time)."""
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(repeats):
            op()
        dev.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3 / repeats)
    return min(samples) if best else statistics.median(samples)


class _Case:
    """One family key's benchmark on a device: ``op()`` enqueues it, ``result()`` reads its output."""

    def __init__(self, dev: Any, key: str, weights: dict[T, Any], n_embd: int, n_prompt: int,
                 head_dim: int = 64, n_ctx: int = 512):
        rng = np.random.default_rng(1)
        name = key.split(":", 1)[0]
        self.dev = dev
        if name in ("mat_vec", "prompt_matmul"):
            t = space.type_of(key)
            w = weights[t]
            n = 1 if name == "mat_vec" else n_prompt
            self.x = dev.empty((n, w.shape[1]))
            dev.write(self.x, rng.standard_normal((n, w.shape[1]), dtype=np.float32))
            self.out = dev.empty((n, w.shape[0]))
            self.op = lambda: dev.matmul(self.out, self.x, w)
            self.shape = f"{t.name} {w.shape[0]}x{w.shape[1]}, {n} token{'s' if n > 1 else ''}"
        elif name == "rmsnorm":
            self.x = dev.empty((n_prompt, n_embd))
            dev.write(self.x, rng.standard_normal((n_prompt, n_embd), dtype=np.float32))
            g = dev.upload(rng.standard_normal(n_embd, dtype=np.float32), T.F32, (n_embd,))
            self.out = dev.empty((n_prompt, n_embd))
            self.op = lambda: dev.rmsnorm(self.out, self.x, g, 1e-5)
            self.shape = f"{n_prompt}x{n_embd}"
        elif name == "attention":
            n_head = max(1, n_embd // head_dim)
            n_kv = max(1, n_head // 4)
            q = dev.empty((1, n_head * head_dim))
            dev.write(q, rng.standard_normal((1, n_head * head_dim), dtype=np.float32))
            kc, vc = dev.empty((n_ctx, n_kv * head_dim)), dev.empty((n_ctx, n_kv * head_dim))
            for c in (kc, vc):
                dev.write(c, rng.standard_normal((n_ctx, n_kv * head_dim), dtype=np.float32))
            pos = dev.empty((1,), T.I32)
            dev.write(pos, np.array([n_ctx - 1], np.int32))
            self.out = dev.empty((1, n_head * head_dim))
            self.op = lambda: dev.attention(self.out, q, kc, vc, pos, n_head, n_kv, head_dim ** -0.5)
            self.shape = f"decode, {n_head}/{n_kv} heads x {head_dim}, {n_ctx} keys"
        else:
            raise CooktopError(f"tuning: no benchmark for kernel family {name!r}")

    def result(self) -> np.ndarray:
        self.op()
        return self.dev.read(self.out)


def _same(ref: np.ndarray, got: np.ndarray, exact: bool) -> str | None:
    """None when ``got`` may stand for ``ref``, else why not."""
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    if exact:
        if np.array_equal(ref, got, equal_nan=True):
            return None
        return f"not bit for bit: max |diff| {float(np.nanmax(np.abs(ref - got))):.3g}"
    if np.allclose(got, ref, rtol=space.PARITY_RTOL, atol=space.PARITY_ATOL * max(1.0, float(np.abs(ref).max()))):
        return None
    return f"outside the parity bound: max |diff| {float(np.nanmax(np.abs(ref - got))):.3g}"


def plan(dev: Any, types: Any) -> list[tuple[str, space.Family]]:
    """The family keys tuned on ``dev`` for weight ``types``: each family with a non-empty space
    (per weight type where it is per type; types the device has no kernels for are left out)."""
    fl = space.flavour_of(dev.info)
    keys = []
    for fam in space.SPACE.get(fl, ()):
        if not fam.params:
            continue
        if fam.per_type:
            keys += [(f"{fam.name}:{t.name}", fam) for t in types if dev.info.supports("matmul", t)]
        else:
            keys.append((fam.name, fam))
    return keys


def tune(dev: Any, weights: list[tuple[T, int, int, np.ndarray]], budget_s: float = 120.0, runs: int = 5,
         n_prompt: int = 64, n_embd: int | None = None, min_gain: float = 0.03,
         progress: Callable[[str, int, int], None] | None = None,
         only: Any = None) -> dict[str, Any]:
    """Tune ``dev`` (an open OpenCL or Vulkan device) at ``weights``' shapes; leaves ``dev`` running
    the chosen parameters and returns the record the cache stores: ``{"choice", "report",
    "tuning_s", "budget_s", "complete"}``.

    Args:
        weights: ``(type, n_out, n_in, raw rows)`` (:func:`model_shapes`, :func:`synthetic_shapes`).
        budget_s: seconds at most (compile time included; checked before each candidate).
        runs: timings per candidate (the median is kept), after one warm-up.
        n_prompt: tokens of the prompt-matmul and rmsnorm cases; n_embd: rmsnorm / attention width
            (default: the widest n_in of ``weights``).
        min_gain: a candidate must be this much faster than the default (fraction) to be chosen.
        progress: called with (family key, candidates done, candidates of the key) after each.
        only: family keys to tune (default: all of :func:`plan`).
    Raises:
        CooktopError: the device's backend has nothing to tune (numpy), or ``weights`` is empty.
    """
    if not space.flavour_of(dev.info):
        raise CooktopError(f"{dev.info.selector}: the {dev.info.backend} backend has no tunable kernels "
                           "(only OpenCL and Vulkan devices are tuned)")
    if not weights:
        raise CooktopError("tuning: no weight matrix to time (the model has none of the device's types)")
    with warnings.catch_warnings():  # pyopencl: a candidate seen before wraps its cached program's kernels again
        warnings.filterwarnings("ignore", message=r"Kernel '.*' has been retrieved more than once")
        return _tune(dev, weights, budget_s, runs, n_prompt, n_embd, min_gain, progress, only)


def _tune(dev: Any, weights: list[tuple[T, int, int, np.ndarray]], budget_s: float, runs: int, n_prompt: int,
          n_embd: int | None, min_gain: float, progress: Callable[[str, int, int], None] | None,
          only: Any) -> dict[str, Any]:
    start = time.perf_counter()
    deadline = start + float(budget_s)
    uploaded = {t: dev.upload(raw, t, (n_out, n_in)) for t, n_out, n_in, raw in weights}
    width = n_embd or max(n_in for _, _, n_in, _ in weights)
    choice: dict[str, dict[str, int]] = {}
    dev.apply_tuning({})
    report: list[KernelResult] = []
    complete = True
    for key, fam in plan(dev, list(uploaded)) if only is None else [k for k in plan(dev, list(uploaded))
                                                                    if k[0] in only]:
        name = key.split(":", 1)[0]
        cands = space.candidates(dev.info, name)
        case = _Case(dev, key, uploaded, width, n_prompt)
        dev.apply_tuning(choice)
        ref = case.result()
        repeats = max(1, min(200, int(2.0 / max(_time(dev, case.op, 1, 1), 1e-3))))
        default_ms = _time(dev, case.op, runs, repeats)
        res = KernelResult(key, case.shape, cands[0], cands[0], default_ms, default_ms, tried=1)
        timed: list[tuple[float, dict[str, int]]] = []
        for i, cand in enumerate(cands[1:], 1):
            if time.perf_counter() > deadline:
                res.skipped = len(cands) - i
                complete = False
                break
            dev.apply_tuning(dict(choice, **{key: cand}))
            res.tried += 1
            try:
                why = _same(ref, case.result(), fam.exact)
            except CooktopError as e:  # a candidate that does not build or launch on this device
                why = f"{type(e).__name__}: {e}"
            if why is not None:
                res.rejected.append({"params": cand, "why": why})
            else:
                _time(dev, case.op, 1, repeats)  # warm-up
                timed.append((_time(dev, case.op, runs, repeats), cand))
            if progress:
                progress(key, i, len(cands) - 1)
        if timed:
            best_ms, best = min(timed, key=lambda tc: tc[0])
            if best_ms < default_ms * (1 - min_gain):
                pairs = []
                for _ in range(CONFIRM_PAIRS):  # confirm, alternating: (best, default) per pair
                    if time.perf_counter() > deadline:  # unconfirmed: the default stays
                        complete = False
                        break
                    pair = []
                    for params in (best, cands[0]):
                        dev.apply_tuning(dict(choice, **{key: params}))
                        pair.append(_time(dev, case.op, runs, repeats, best=True))
                    pairs.append(pair)
                wins = sum(b < d * (1 - min_gain) for b, d in pairs)
                b_ms = statistics.median([b for b, _ in pairs]) if pairs else best_ms
                d_ms = statistics.median([d for _, d in pairs]) if pairs else default_ms
                if len(pairs) == CONFIRM_PAIRS and wins >= CONFIRM_WINS and b_ms < d_ms * (1 - min_gain):
                    res.chosen, res.default_ms, res.chosen_ms = best, d_ms, b_ms
        if res.chosen != res.default:
            choice[key] = {p: v for p, v in res.chosen.items() if res.default.get(p) != v}
        dev.apply_tuning(choice)
        report.append(res)
    return {"choice": choice, "report": [r.to_dict() for r in report],
            "tuning_s": round(time.perf_counter() - start, 2), "budget_s": float(budget_s), "complete": complete,
            "runs": runs, "n_prompt": n_prompt}


def total_candidates(dev: Any, types: Any) -> int:
    """How many candidates :func:`tune` would try on ``dev`` for weight ``types`` (progress bars)."""
    return sum(len(space.candidates(dev.info, key.split(":", 1)[0])) - 1 for key, _ in plan(dev, types))
