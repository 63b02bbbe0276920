"""``cooktop bench --batched``: llama.cpp's ``llama-batched-bench`` measurement.

For every prompt length ``PP`` (``-npp``), generation length ``TG`` (``-ntg``) and
number of parallel sequences ``B`` (``-npl``): the cache is cleared, ``B``
sequences each read a prompt of ``PP`` random tokens (in forward passes of at
most ``n_batch`` tokens, several sequences per pass), then ``TG`` steps each
decode one token of every sequence in one forward pass
(:meth:`Model.forward_batch <cooktop.model.forward.Model.forward_batch>`,
logits of each sequence's last token read back). Reported as
llama-batched-bench does (tools/batched-bench/batched-bench.cpp)::

    N_KV = B * (PP + TG)          T_PP, T_TG, T = T_PP + T_TG   (seconds)
    S_PP = B * PP / T_PP          S_TG = B * TG / T_TG          S = N_KV / T   (tokens/s)

plus ``S_TG/seq = S_TG / B`` (what each sequence sees). One run per
configuration after a warm-up pass (llama-batched-bench's protocol); ``--vs
llama.cpp`` runs the same through llama-cpp-python's low-level batch API
(``llama_batch_init`` / ``llama_decode`` with one ``seq_id`` per sequence) on the CPU.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import time
from typing import Any

import numpy as np

from ..errors import CooktopError
from ..model.forward import Model


@dataclasses.dataclass
class BatchedResult:
    """One configuration: PP, TG, B and its times (None when ``error``)."""

    backend: str
    device: str
    model: str
    pp: int
    tg: int
    pl: int
    t_pp: float | None = None
    t_tg: float | None = None
    error: str | None = None

    @property
    def n_kv(self) -> int:
        """Cache cells used: ``B * (PP + TG)``."""
        return self.pl * (self.pp + self.tg)

    def rates(self) -> dict[str, float | None]:
        """S_PP, S_TG, S, S_TG/seq in tokens/s (None when not measured)."""
        if self.t_pp is None or self.t_tg is None:
            return {"s_pp": None, "s_tg": None, "s": None, "s_tg_seq": None}
        s_tg = self.pl * self.tg / self.t_tg if self.t_tg > 0 else 0.0
        return {"s_pp": self.pl * self.pp / self.t_pp if self.t_pp > 0 else 0.0, "s_tg": s_tg,
                "s": self.n_kv / (self.t_pp + self.t_tg), "s_tg_seq": s_tg / self.pl}

    def record(self, machine: dict[str, Any] | None = None) -> dict[str, Any]:
        """A flat JSON record (``machine`` added when given)."""
        rec = {"backend": self.backend, "device": self.device, "model": self.model, "pp": self.pp, "tg": self.tg,
               "pl": self.pl, "n_kv": self.n_kv, "t_pp": self.t_pp, "t_tg": self.t_tg,
               "t": None if self.t_pp is None or self.t_tg is None else self.t_pp + self.t_tg}
        rec.update(self.rates())
        rec["error"] = self.error
        if machine is not None:
            rec["machine"] = machine
        return rec


def _tokens(rng: np.random.Generator, n_vocab: int, n: int) -> list[int]:
    return [int(t) for t in rng.integers(1, n_vocab, size=n)]


def run_cooktop(path: str, device: str, ngl: Any, n_batch: int, npp: list[int], ntg: list[int], npl: list[int],
                seed: int = 1234) -> list[BatchedResult]:
    """Measure every (PP, TG, B) on ``device`` (a selector) with cooktop; a failure becomes error records."""
    from ..engine.generate import load

    name = os.path.basename(path)
    configs = [(pp, tg, pl) for pp in npp for tg in ntg for pl in npl]
    try:
        eng = load(path, n_ctx=max(pp + tg for pp, tg, _ in configs) + 1, n_batch=n_batch, device=device,
                   n_gpu_layers=ngl)
    except CooktopError as e:
        return [BatchedResult("cooktop", device, name, pp, tg, pl, error=str(e)) for pp, tg, pl in configs]
    from ..backends.registry import FAMILIES
    assert isinstance(eng.model, Model)  # engine.load places it on this machine's devices
    fam = eng.model.segments[-1].device.info.backend
    backend = FAMILIES[fam].label if fam in FAMILIES else fam
    rng = np.random.default_rng(seed)
    m = eng.model
    out = []
    try:
        cache = m.new_cache(max(npl))
        # warm-up: kernels built and weights cached for a prompt chunk and a decode step
        m.forward_batch(cache, [(0, 0, [1] * min(m.n_batch, max(npp), 32), True)])
        m.forward_batch(cache, [(s, 0, [1], True) for s in range(max(npl))])
        for pp, tg, pl in configs:
            r = BatchedResult(backend, device, name, pp, tg, pl)
            try:
                prompts = [_tokens(rng, eng.cfg.n_vocab, pp) for _ in range(pl)]
                t0 = time.perf_counter()
                _prompts(m, cache, prompts)
                t1 = time.perf_counter()
                for j in range(tg):
                    m.forward_batch(cache, [(s, pp + j, _tokens(rng, eng.cfg.n_vocab, 1), True) for s in range(pl)])
                r.t_pp, r.t_tg = t1 - t0, time.perf_counter() - t1
            except CooktopError as e:
                r.error = str(e)
            out.append(r)
    finally:
        eng.close()
    return out


def _prompts(m: Any, cache: Any, prompts: list[list[int]]) -> None:
    """Every sequence's prompt from position 0, packed into passes of at most n_batch tokens."""
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        budget, items = m.n_batch, []
        for s, p in enumerate(prompts):
            k = min(len(p) - done[s], budget)
            if k > 0:
                items.append((s, done[s], p[done[s]:done[s] + k], done[s] + k == len(p)))
                budget -= k
        m.forward_batch(cache, items)
        for s, _, toks, _ in items:
            done[s] += len(toks)


def run_llamacpp(path: str, n_batch: int, npp: list[int], ntg: list[int], npl: list[int],
                 seed: int = 1234) -> list[BatchedResult]:
    """The same measurement through llama-cpp-python's low-level batch API (CPU, all cores)."""
    from .vs_llamacpp import import_llama_cpp

    lc = import_llama_cpp()
    name = os.path.basename(path)
    configs = [(pp, tg, pl) for pp in npp for tg in ntg for pl in npl]
    n_seq = max(npl)
    n_ctx = max(npl) * (max(npp) + max(ntg) + 1)
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = lc.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise CooktopError(f"llama.cpp could not load {path}")
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, n_seq
    cp.n_threads = cp.n_threads_batch = os.cpu_count() or 1
    cp.kv_unified = True  # llama-batched-bench's -kvu: one cache, as cooktop's
    ctx = lc.llama_init_from_model(model, cp)
    if not ctx:
        lc.llama_model_free(model)
        raise CooktopError("llama.cpp could not create the context")
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    mem = lc.llama_get_memory(ctx)
    batch = lc.llama_batch_init(max(n_batch, n_seq), 0, n_seq)
    rng = np.random.default_rng(seed)

    def decode(items: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(items)
        for i, (tok, pos, s, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = s, want
        if lc.llama_decode(ctx, batch) != 0:
            raise CooktopError("llama_decode failed (the KV cache is full?)")
        if any(w for *_, w in items):
            lc.llama_synchronize(ctx)

    out = []
    try:
        decode([(1, 0, 0, True)])
        lc.llama_memory_clear(mem, True)
        for pp, tg, pl in configs:
            r = BatchedResult("llama.cpp", "cpu", name, pp, tg, pl)
            lc.llama_memory_clear(mem, True)
            rows = [(t, p, s, p == pp - 1) for s in range(pl) for p, t in enumerate(_tokens(rng, n_vocab, pp))]
            t0 = time.perf_counter()
            for i in range(0, len(rows), n_batch):
                decode(rows[i:i + n_batch])
            t1 = time.perf_counter()
            for j in range(tg):
                decode([(t, pp + j, s, True) for s, t in enumerate(_tokens(rng, n_vocab, pl))])
            r.t_pp, r.t_tg = t1 - t0, time.perf_counter() - t1
            out.append(r)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)
    return out


def to_markdown(results: list[BatchedResult]) -> str:
    """llama-batched-bench's table (plus backend, device and S_TG per sequence)."""
    head = ("|    backend |   device |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s "
            "| S_TG/seq t/s |      T s |    S t/s |")
    sep = ("|------------|----------|-------|--------|------|--------|----------|----------|----------|----------"
           "|--------------|----------|----------|")
    lines = [head, sep]
    for r in results:
        if r.error:
            lines.append(f"| {r.backend:>10} | {r.device:>8} | {r.pp:5d} | {r.tg:6d} | {r.pl:4d} | error: {r.error} |")
            continue
        assert r.t_pp is not None and r.t_tg is not None  # measured (no error)
        x = r.rates()
        lines.append(f"| {r.backend:>10} | {r.device:>8} | {r.pp:5d} | {r.tg:6d} | {r.pl:4d} | {r.n_kv:6d} "
                     f"| {r.t_pp:8.3f} | {x['s_pp']:8.2f} | {r.t_tg:8.3f} | {x['s_tg']:8.2f} | {x['s_tg_seq']:12.2f} "
                     f"| {r.t_pp + r.t_tg:8.3f} | {x['s']:8.2f} |")
    return "\n".join(lines)


def to_csv(results: list[BatchedResult]) -> str:
    """One CSV row per record."""
    recs = [r.record() for r in results]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(recs[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(recs)
    return buf.getvalue()


def to_json(results: list[BatchedResult], machine: dict[str, Any], lines: bool = False) -> str:
    """A JSON array (or JSON lines) of records, each with the machine."""
    recs = [r.record(machine) for r in results]
    return "\n".join(json.dumps(r) for r in recs) if lines else json.dumps(recs, indent=2)


def plot(results: list[BatchedResult], path: str, machine_label: str, width_px: int = 1200,
         height_px: int = 675, dpi: int = 100) -> None:
    """Grouped bars of aggregate generation t/s (S_TG) per B, one bar per backend/device and PP/TG.

    Raises:
        CooktopError: matplotlib is not installed, or nothing was measured.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CooktopError("--plot needs matplotlib: pip install 'cooktop[bench]'") from None
    ok = [r for r in results if r.error is None]
    if not ok:
        raise CooktopError("--plot: no successful measurement to plot")
    pls = sorted({r.pl for r in ok})
    series = list(dict.fromkeys((r.backend, r.device, r.pp, r.tg) for r in ok))
    fig, ax = plt.subplots(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    width = 0.8 / len(series)
    for j, key in enumerate(series):
        xs: list[float] = []
        ys: list[float] = []
        for i, pl in enumerate(pls):
            hit = [r for r in ok if (r.backend, r.device, r.pp, r.tg) == key and r.pl == pl]
            if hit:
                s_tg = hit[0].rates()["s_tg"]
                assert s_tg is not None  # ok holds measured results only
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(s_tg)
        label = f"{key[0]} ({key[1]}) PP {key[2]} TG {key[3]}"
        bars = ax.bar(xs, ys, width * 0.92, label=label)
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=8, padding=2)
    ax.set_xticks(range(len(pls)), [f"B={p}" for p in pls])
    ax.set_xlabel("parallel sequences")
    ax.set_ylabel("aggregate generation tokens / s (S_TG)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    models = ", ".join(dict.fromkeys(r.model for r in ok))
    fig.suptitle(f"cooktop bench --batched: {models}\n{machine_label}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
