"""pp / tg / pg throughput with llama-bench's semantics, over a sweep of parameters.

Tests (llama-bench, examples/llama-bench/llama-bench.cpp):

- ``ppP``: evaluate ``P`` random valid token ids from an empty context in
  ``n_batch`` chunks; t/s = P / seconds.
- ``tgN``: from an empty context, evaluate ``N`` tokens one after another
  (one forward pass each, no sampling); t/s = N / seconds.
- ``ppP+tgN``: ``ppP`` then ``tgN`` in the same context; t/s = (P + N) / seconds.
- ``-d D`` (``--n-depth``, llama-bench's ``n_depth``): before each run the context is filled
  with ``D`` tokens (in ``n_batch`` chunks, not timed), so the test measures attention over a
  cache that already holds D tokens; its name gets `` @ dD`` (``tg128 @ d2048``).
- ``-ctk`` / ``-ctv`` / ``-fa``: the KV cache types and flash attention of each configuration
  (``cooktop.format.kvtypes.KVConfig``; swept like the other lists).

Each (test, configuration) gets a warm-up as llama-bench's (not counted: it compiles
kernels, records sequences, fills the numpy backend's dequantized-weight
cache): from an empty context, the test's ``P`` prompt tokens when ``P > 0``, then
generated tokens when ``N > 0``: two (one when ``N == 1``) where llama-bench's has one, since
cooktop records a decode step for replay (OpenCL command buffers, Vulkan graphs) the second time
it sees it, and one token would leave that recording to the first timed run; the depth is not
filled (``--no-warmup``: none at all). Then ``reps`` timed runs (with ``--vs``, the reference engine's runs
alternate with these, each after a :data:`SETTLE_S` pause so that the other
engine's spinning worker threads have gone to sleep); the result is the mean and sample standard
deviation of the per-run tokens/s. Token ids come from a generator seeded
per test, so every engine evaluates the same ids.

The depth is filled once per (test, configuration, engine): the first timed run clears the
cache and evaluates the ``D`` depth tokens; each later run keeps those ``D`` cached positions
and drops the rest (:meth:`Runner.truncate`), which leaves the cache as a fresh fill would, as
llama-bench restores the state it saved after its first depth fill
(``llama_state_seq_set_data``, llama.cpp PR 16944). A runner without ``truncate`` refills every run.

The sweep is the product of models x devices x ``-ngl`` x ``-b`` x ``-ts``.
A device element may join several devices with ``+`` (``opencl:0+vulkan:0``),
which splits the offloaded layers among them in proportion to ``-ts``
(``3/1``; default: by device memory). Each (model, device, ngl, n_batch, ts)
is loaded once and reused for all its tests. A configuration that cannot
load (unavailable device, out of memory) or fails while running becomes a
record with ``error`` set, not an exception.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..backends.registry import FAMILIES
from ..errors import CooktopError
from ..format.kvtypes import KVConfig, kv_type_name
from ..model.forward import Model

log = logging.getLogger("cooktop")

#: Backend column of cooktop's device families (llama.cpp rows say "llama.cpp"): registry.FAMILIES' labels.
BACKEND_NAMES = {name: f.label for name, f in FAMILIES.items()}


@dataclasses.dataclass(frozen=True)
class TestSpec:
    """One llama-bench test: ``n_prompt`` prompt tokens then ``n_gen`` generated tokens, after
    ``n_depth`` untimed tokens already in the context."""

    __test__ = False  # not a pytest class

    n_prompt: int
    n_gen: int
    n_depth: int = 0

    @property
    def name(self) -> str:
        """``pp512``, ``tg128``, ``pp512+tg128``, ``tg128 @ d2048`` (llama-bench's test names)."""
        parts = ([f"pp{self.n_prompt}"] if self.n_prompt else []) + ([f"tg{self.n_gen}"] if self.n_gen else [])
        return "+".join(parts) + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def n_tokens(self) -> int:
        """Tokens evaluated per run (the numerator of t/s)."""
        return self.n_prompt + self.n_gen


def make_tests(n_prompt: list[int], n_gen: list[int], pg: list[tuple[int, int]],
               n_depth: list[int] | None = None) -> list[TestSpec]:
    """llama-bench's test list: a pp test per ``-p`` > 0, a tg test per ``-n`` > 0, a pg test per ``-pg``,
    each at every depth of ``-d`` (default 0; llama-bench's order: depths innermost).

    Raises:
        CooktopError: a negative count, or no test at all.
    """
    depths = n_depth or [0]
    if any(v < 0 for v in n_prompt + n_gen + depths + [x for p in pg for x in p]):
        raise CooktopError("-p, -n, -pg and -d take token counts >= 0")
    base = [(p, 0) for p in n_prompt if p > 0] + [(0, n) for n in n_gen if n > 0]
    base += [(p, n) for p, n in pg if p > 0 or n > 0]
    tests = [TestSpec(p, n, d) for p, n in base for d in depths]
    if not tests:
        raise CooktopError("nothing to measure: every -p, -n and -pg is 0")
    return list(dict.fromkeys(tests))


@dataclasses.dataclass
class ModelFacts:
    """llama-bench's model columns: description, size (bytes of tensor data), parameter count."""

    path: str
    desc: str
    size_bytes: int
    n_params: int
    n_vocab: int
    file_type: str


#: llama_ftype -> name (llama.h), for the model description.
_FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
           11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small",
           15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 32: "BF16"}


def _count_label(n: int) -> str:
    """``1.1B``, ``135M``, ``292K`` (the size part of llama.cpp's model description)."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def model_facts(path: str) -> ModelFacts:
    """Open a GGUF's metadata (nothing is loaded onto a device).

    Raises:
        GGUFError, UnsupportedModelError: the file cannot be run.
    """
    from ..format.gguf import open_gguf
    from ..model.config import load_config

    gf = open_gguf(path)
    cfg = load_config(gf)
    ft = gf.metadata.get("general.file_type")
    if ft is not None:
        ftype = _FTYPES.get(int(ft), f"ftype {int(ft)}")
    else:  # the most common weight type
        counts: dict[str, int] = {}
        for t in gf.tensors.values():
            counts[t.ggml_type.name] = counts.get(t.ggml_type.name, 0) + t.n_bytes
        ftype = max(counts, key=lambda name: counts[name])
    n_params = sum(t.n_elements for t in gf.tensors.values())
    size = sum(t.n_bytes for t in gf.tensors.values())
    return ModelFacts(os.path.abspath(path), f"{cfg.arch} {_count_label(n_params)} {ftype}", size, n_params,
                      cfg.n_vocab, ftype)


@dataclasses.dataclass
class Result:
    """One (model, configuration, test) measurement: the per-run samples, or the error.

    ``samples_s`` are seconds per timed run; ``paired_ts`` the llama.cpp tokens/s measured
    interleaved with these runs (``--vs llama.cpp``), from which :attr:`ratio` comes.
    """

    model: ModelFacts
    backend: str
    device: str
    device_name: str
    ngl: Any
    n_batch: int
    split: str | None
    test: TestSpec
    samples_s: list[float] = dataclasses.field(default_factory=list)
    error: str | None = None
    placement: str = ""
    load_ms: float = 0.0
    paired_ts: list[float] = dataclasses.field(default_factory=list)
    kv: KVConfig = dataclasses.field(default_factory=KVConfig)

    @property
    def kv_text(self) -> tuple[str, str, str]:
        """(type_k, type_v, fa) as llama-bench's columns name them."""
        return kv_type_name(self.kv.type_k), kv_type_name(self.kv.type_v), self.kv.flash_attn

    @property
    def samples_ts(self) -> list[float]:
        """Tokens per second of each timed run."""
        return [self.test.n_tokens / s for s in self.samples_s if s > 0]

    @property
    def avg_ts(self) -> float | None:
        """Mean tokens/s (None without samples)."""
        ts = self.samples_ts
        return statistics.fmean(ts) if ts else None

    @property
    def stddev_ts(self) -> float | None:
        """Sample standard deviation of tokens/s (0 for a single run; None without samples)."""
        ts = self.samples_ts
        return statistics.stdev(ts) if len(ts) > 1 else (0.0 if ts else None)

    @property
    def ratio(self) -> float | None:
        """This engine's mean t/s over the paired llama.cpp runs' mean t/s (``--vs``), else None."""
        if not self.paired_ts or self.avg_ts is None:
            return None
        return self.avg_ts / statistics.fmean(self.paired_ts)


class Runner(Protocol):
    """An engine under test: evaluates prompt chunks and single tokens from an empty context.

    ``reset()`` empties the context; ``prompt(tokens)`` / ``decode(token)`` append to it. A runner
    may also have ``truncate(n)``: keep the first ``n`` positions of the context, forget the rest
    (then a depth fill is reused by the next run, see the module doc).
    """

    backend: str
    device: str
    device_name: str
    placement: str
    load_ms: float

    def reset(self) -> None: ...
    def prompt(self, tokens: list[int]) -> None: ...
    def decode(self, token: int) -> None: ...
    def close(self) -> None: ...


class CooktopRunner:
    """cooktop's engine on one configuration (``engine.load`` once).

    Raises (from the constructor):
        CooktopError: the device is unavailable, the model does not fit, ...
    """

    def __init__(self, path: str, device: str, ngl: Any, n_batch: int, split: str | None, n_ctx: int,
                 tensors: Any = None, kv: KVConfig | None = None):
        from ..engine import generate as engine

        sels = device.replace("+", ",")
        self.device = device
        self.backend = "+".join(BACKEND_NAMES.get(s.split(":")[0], s) for s in device.split("+"))
        self.device_name = device_names(device)
        extra = {"tensors": tensors} if tensors is not None else {}  # --n-cpu-moe / -ot
        self.eng = engine.load(path, n_ctx=n_ctx, n_batch=n_batch, device=sels, n_gpu_layers=ngl,
                               split=split.replace("/", ",") if split else None, kv=kv, **extra)
        self.placement = self.eng.placement.summary()
        self.load_ms = self.eng.load_ms
        assert isinstance(self.eng.model, Model)  # engine.load places it on this machine's devices
        for seg in self.eng.model.segments:  # uploads, repacks, numpy's float32 conversion: done before timing
            seg.device.synchronize()

    def reset(self) -> None:
        self.eng.reset()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached positions (``Sequence.rollback``: evaluated again, untimed, where
        the sliding-window layers no longer hold the window of position ``n``)."""
        self.eng.seq.rollback(n)

    def prompt(self, tokens: list[int]) -> None:
        self.eng.eval(tokens)

    def decode(self, token: int) -> None:
        self.eng.eval([token])

    def close(self) -> None:
        self.eng.close()


def device_names(device: str) -> str:
    """Probed names of the devices in a sweep element (``+``-joined); never raises."""
    from ..backends import registry

    names = []
    for sel in device.split("+"):
        fam, _, idx = sel.strip().lower().partition(":")
        try:
            res = registry.probe(fam)
            i = int(idx) if idx else 0
            names.append(next((d.name for d in res.devices if d.index == i), "?"))
        except Exception:  # noqa: BLE001 - a label, not a check
            names.append("?")
    return " + ".join(names)


def run_once(runner: Runner, test: TestSpec, tokens: list[int], depth_cached: bool = False) -> float:
    """One run of ``test`` from an empty context (after its ``n_depth`` untimed tokens, the first of
    ``tokens``); returns the seconds of the test itself (wall clock, perf_counter).

    ``depth_cached``: the runner's context already starts with those ``n_depth`` tokens (an earlier
    run of this test filled them): they are kept (``runner.truncate``) instead of evaluated again.
    """
    d = test.n_depth
    if d and depth_cached:
        runner.truncate(d)  # type: ignore[attr-defined]  # only passed for runners that have it
    else:
        runner.reset()
        if d:
            runner.prompt(tokens[:d])  # llama-bench's n_depth: the cache holds d tokens, not timed
    t0 = time.perf_counter()
    if test.n_prompt:
        runner.prompt(tokens[d:d + test.n_prompt])
    for tok in tokens[d + test.n_prompt:]:
        runner.decode(tok)
    return time.perf_counter() - t0


#: Tokens a test's warm-up decodes (at most ``n_gen``): llama-bench decodes 1; a decode step is
#: recorded for replay the second time it is seen (OpenCL ``replay.py``, Vulkan graphs), so 2.
WARMUP_GEN = 2


def warm_up(runner: Runner, test: TestSpec, tokens: list[int]) -> None:
    """llama-bench's warm-up of a test: from an empty context, its prompt (``n_prompt`` > 0) then
    ``min(n_gen, WARMUP_GEN)`` generated tokens, without the depth (llama-bench.cpp:
    ``test_prompt(n_prompt)``, ``test_gen(1)``; module doc: why two). The ids are the test's own,
    past its depth tokens."""
    runner.reset()
    d = test.n_depth
    if test.n_prompt:
        runner.prompt(tokens[d:d + test.n_prompt])
    for tok in tokens[d + test.n_prompt:d + test.n_prompt + min(test.n_gen, WARMUP_GEN)]:
        runner.decode(tok)


def tokens_for(test: TestSpec, n_vocab: int, seed: int) -> list[int]:
    """The ``n_depth + n_tokens`` ids a test evaluates: uniform in ``[0, n_vocab)``, seeded (numpy PCG64)."""
    rng = np.random.default_rng([seed, test.n_prompt, test.n_gen] + ([test.n_depth] if test.n_depth else []))
    return [int(t) for t in rng.integers(0, n_vocab, test.n_depth + test.n_tokens)]


@dataclasses.dataclass
class BenchParams:
    """A sweep: every combination of the list-valued fields (``-m``, ``--device``, ``-ngl``, ``-b``, ``-ts``)."""

    models: list[str]
    tests: list[TestSpec]
    devices: list[str]
    ngl: list[Any]
    n_batch: list[int]
    split: list[str | None] = dataclasses.field(default_factory=lambda: [None])
    reps: int = 5
    seed: int = 1234
    #: ``--n-cpu-moe`` / ``--cpu-moe`` / ``-ot`` (``runtime.placement.TensorPlacement``), or None
    tensors: Any = None
    #: KV cache types and flash attention (``-ctk`` x ``-ctv`` x ``-fa``), swept
    kv: list[KVConfig] = dataclasses.field(default_factory=lambda: [KVConfig()])
    #: a warm-up before each test's timed runs (``--no-warmup``: False)
    warmup: bool = True

    def configs(self) -> list[tuple[str, Any, int, str | None, KVConfig]]:
        """(device, ngl, n_batch, split, kv) of every sweep point, device outermost.

        ``split`` applies to ``+``-joined devices only (None for a single device)."""
        points = ((d, g, b, s if "+" in d else None, kv)
                  for d, g, b, s, kv in itertools.product(self.devices, self.ngl, self.n_batch, self.split, self.kv))
        return list(dict.fromkeys(points))


def _error_text(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return msg if isinstance(e, CooktopError) else f"{type(e).__name__}: {msg}"


def run_bench(params: BenchParams, vs: Callable[[str, int, int, KVConfig], Runner] | None = None,
              progress: bool = False, facts: dict[str, ModelFacts] | None = None) -> list[Result]:
    """Measure every test on every sweep point; with ``vs``, interleave a reference engine.

    Args:
        params: the sweep.
        vs: ``vs(model_path, n_ctx, n_batch, kv) -> Runner`` of the reference (llama.cpp, with the same
            cache types and flash attention), or None.
            Its runs alternate with each configuration's (warm-up of both unless
            ``params.warmup`` is False, then one run of each per repetition); its records pool all its runs for a
            (model, n_batch, test), and each cooktop record keeps the paired runs
            for its ratio.
        progress: a tqdm bar on stderr.
        facts: model facts already read (path -> facts); read here otherwise.
    Returns:
        Results in sweep order (reference records after each model's configurations).
    Raises:
        CooktopError: a model file cannot be read (before anything is measured).
    """
    facts = facts or {p: model_facts(p) for p in params.models}
    configs = params.configs()
    n_ctx = max(t.n_depth + t.n_tokens for t in params.tests)
    per_run = 2 if vs else 1
    n_runs = params.reps + (1 if params.warmup else 0)  # per test and engine, warm-up included
    total = len(params.models) * len(configs) * len(params.tests) * n_runs * per_run
    bar = _progress_bar(total, progress)
    results: list[Result] = []
    try:
        for path in params.models:
            mf = facts[path]
            refs: dict[tuple[int, KVConfig], Runner | str] = {}
            ref_results: dict[tuple[int, KVConfig, TestSpec], Result] = {}
            for device, ngl, n_batch, split, kv in configs:
                bar.set_description(f"{os.path.basename(path)} {device} ngl={ngl} b={n_batch}")
                ref: Runner | None = None
                if vs is not None:
                    got = refs.get((n_batch, kv))  # the reference runner, or why it could not start
                    if got is None:
                        try:
                            got = vs(path, n_ctx, n_batch, kv)
                        except Exception as e:  # noqa: BLE001 - becomes error records
                            got = f"{_error_text(e)}"
                        refs[(n_batch, kv)] = got
                    for t in params.tests:
                        if (n_batch, kv, t) not in ref_results:
                            r = Result(mf, "llama.cpp", "cpu", getattr(got, "device_name", "cpu"), 0, n_batch,
                                       None, t, error=got if isinstance(got, str) else None,
                                       placement=getattr(got, "placement", ""), load_ms=getattr(got, "load_ms", 0),
                                       kv=kv)
                            ref_results[(n_batch, kv, t)] = r
                    ref = None if isinstance(got, str) else got
                try:
                    runner: Runner | None = CooktopRunner(path, device, ngl, n_batch, split, n_ctx, params.tensors,
                                                          kv)
                    err = None
                except Exception as e:  # noqa: BLE001 - an unavailable device is a record, not a crash
                    runner, err = None, _error_text(e)
                    log.warning("%s on %s: %s", os.path.basename(path), device, err)
                backend = runner.backend if runner else "+".join(
                    BACKEND_NAMES.get(s.split(":")[0].lower(), s) for s in device.split("+"))
                for t in params.tests:
                    res = Result(mf, backend, device, runner.device_name if runner else device_names(device),
                                 ngl, n_batch, split, t, error=err,
                                 placement=runner.placement if runner else "", load_ms=runner.load_ms if runner else 0,
                                 kv=kv)
                    results.append(res)
                    ref_res = ref_results.get((n_batch, kv, t))
                    if runner is None:
                        bar.update(n_runs * per_run)
                        continue
                    _measure(runner, ref, res, ref_res, t, params, mf.n_vocab, bar)
                if runner is not None:
                    runner.close()
            results.extend(ref_results.values())
            for got in refs.values():
                if not isinstance(got, str):
                    got.close()
    finally:
        bar.close()
    return results


#: Pause before each run when two engines alternate (seconds): thread pools that spin-wait after
#: their work (OpenBLAS, OpenMP, PoCL) go to sleep first instead of competing with the next engine.
SETTLE_S = 0.3


def _measure(runner: Runner, ref: Runner | None, res: Result, ref_res: Result | None, t: TestSpec,
             params: BenchParams, n_vocab: int, bar: Any) -> None:
    """Warm-up (unless ``params.warmup`` is False) then ``reps`` runs of ``t``, alternating with ``ref``
    when given; fills the results. Each engine fills the depth in its first timed run and keeps it
    for the next ones when it can truncate (module doc)."""
    tokens = tokens_for(t, n_vocab, params.seed)
    engines = [(runner, res)] + ([(ref, ref_res)] if ref is not None and ref_res is not None else [])
    alive = {id(r): True for r, _ in engines}
    filled = {id(r): False for r, _ in engines}  # the context starts with this test's depth tokens
    for rep in range(0 if params.warmup else 1, params.reps + 1):  # rep 0 is the warm-up
        paired = None
        for r, out in engines:
            if not alive[id(r)]:
                bar.update(1)
                continue
            if len(engines) > 1:
                time.sleep(SETTLE_S)
            try:
                if rep == 0:
                    warm_up(r, t, tokens)
                    s = 0.0
                else:
                    s = run_once(r, t, tokens, depth_cached=filled[id(r)])
                    filled[id(r)] = bool(t.n_depth) and callable(getattr(r, "truncate", None))
            except Exception as e:  # noqa: BLE001 - a failing backend is a record
                out.error = _error_text(e)
                alive[id(r)] = False
                log.warning("%s %s: %s", out.device, t.name, out.error)
            else:
                if rep:
                    out.samples_s.append(s)
                    if r is ref:
                        paired = t.n_tokens / s
            bar.update(1)
        if paired is not None and alive[id(runner)]:
            res.paired_ts.append(paired)


class _NoBar:
    """Stand-in for a tqdm bar when ``--progress`` is off."""

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr counting runs (warm-ups included), or a no-op."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        raise CooktopError("--progress needs tqdm: pip install 'cooktop[bench]'") from None
    return tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)
