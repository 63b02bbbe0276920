"""KL divergence of a run from a reference, as llama.cpp's ``llama-perplexity --kl-divergence`` computes it
(tools/perplexity/perplexity.cpp: ``kl_divergence()``, ``log_softmax(..., base_log_prob, tok, kld)``).

Per scored token, with ``log q`` this run's log-softmax and ``log p`` the base's stored
log-probabilities (``logits_file.py``):

- ``KLD = sum_i p_i (log p_i - log q_i)`` over the tokens with ``log p_i > -16``;
- ``nll = -log q(target)``, ``nll_base = -log p(target)``, ``Δp = q(target) - p(target)``;
- "same top": the most likely token of both is the same (the first one on ties).

Means come with llama.cpp's uncertainty ``sqrt((mean(x^2) - mean(x)^2) / (count - 1))`` (0 with 10
tokens or fewer), the ln PPL ratio's with the covariance of ``nll`` and ``nll_base``; RMS Δp's
uncertainty is ``0.5 / rms * unc(mean(Δp^2))``; "same top p"'s is the binomial
``sqrt(f (1 - f) / (count - 1))``; percentiles interpolate between sorted values
(``(1 - t) v[k] + t v[k + 1]`` at ``fraction * (n - 1)``), the median is the middle value (the mean of
the two middle ones).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ..errors import CooktopError
from ..model.placed import PlacedModel
from .logits_file import LogitsFile, dequantize_rows
from .perplexity import Chunking, chunk_logits

#: Percentiles llama.cpp prints, highest first (KLD; Δp adds 75 % and 25 %).
KLD_PERCENTILES = (0.999, 0.990, 0.950, 0.900)
KLD_LOW = (0.100, 0.050, 0.010, 0.001)
DP_PERCENTILES = (0.999, 0.990, 0.950, 0.900, 0.750)
DP_LOW = (0.250, 0.100, 0.050, 0.010, 0.001)


def token_kld(logits: np.ndarray, base_logp: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    """The per-token figures of rows (module doc).

    Args:
        logits: float32 [n, n_vocab] of this run; base_logp: float32 [n, n_vocab] log-probabilities of
        the base (``logits_file.dequantize_rows``, or an exact log-softmax); targets: int [n].
    Returns:
        ``{"kld", "nll", "nll_base", "p_diff"}`` float64 [n] and ``"same_top"`` bool [n].
    """
    lg = np.asarray(logits, dtype=np.float32)
    bp = np.asarray(base_logp, dtype=np.float32)
    n = len(lg)
    idx = np.arange(n)
    tg = np.asarray(targets, dtype=np.int64)
    imax = lg.argmax(axis=1)
    mx = lg[idx, imax]
    lse = np.log(np.exp(lg - mx[:, None]).astype(np.float64).sum(axis=1)).astype(np.float32)
    nll = (mx + lse - lg[idx, tg]).astype(np.float32)
    nll_base = (-bp[idx, tg]).astype(np.float32)
    norm = (mx + lse).astype(np.float32)
    keep = bp > np.float32(-16.0)
    logq = (lg - norm[:, None]).astype(np.float32)  # llama.cpp adds norm last; this order makes q == p give 0
    terms = np.where(keep, np.exp(bp).astype(np.float64) * (bp - logq).astype(np.float64), 0.0)
    p_diff = (np.exp(-nll) - np.exp(-nll_base)).astype(np.float32)
    return {"kld": terms.sum(axis=1), "nll": nll.astype(np.float64), "nll_base": nll_base.astype(np.float64),
            "p_diff": p_diff.astype(np.float64), "same_top": imax == bp.argmax(axis=1)}


def mean_unc(values: np.ndarray) -> tuple[float, float]:
    """(mean, uncertainty) as llama.cpp's ``mean_and_uncertainty`` (module doc); (0, 0) when empty."""
    n = len(values)
    if n < 1:
        return 0.0, 0.0
    f = float(values.sum()) / n
    df = float((values * values).sum()) / n - f * f
    return f, math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's percentile of sorted float32 values (module doc)."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = float(np.float32(fraction) * np.float32(len(sorted_values) - 1))
    ip = int(p)
    p -= ip
    return float((1 - p) * sorted_values[ip] + p * sorted_values[min(ip + 1, len(sorted_values) - 1)])


def median(sorted_values: np.ndarray) -> float:
    """The middle value of sorted values (the mean of the two middle ones for an even count)."""
    n = len(sorted_values)
    return float(sorted_values[n // 2] if n % 2 else 0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))


class KldStats:
    """Accumulates :func:`token_kld` figures chunk by chunk and reports them as llama.cpp prints them."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {k: [] for k in ("kld", "nll", "nll_base", "p_diff", "same_top")}

    def add(self, figures: dict[str, np.ndarray]) -> None:
        """Add one chunk's figures (the dict :func:`token_kld` returns)."""
        for k, v in figures.items():
            self._parts[k].append(v)

    def values(self, key: str) -> np.ndarray:
        """All tokens' values of ``key`` so far (float64 [count], ``same_top`` bool)."""
        parts = self._parts[key]
        return np.concatenate(parts) if parts else np.zeros(0)

    @property
    def count(self) -> int:
        """Tokens so far."""
        return sum(len(v) for v in self._parts["kld"])

    def summary(self, percentiles: bool = False) -> dict[str, float]:
        """The figures so far (module doc): ``ppl, ppl_unc, ppl_base, ppl_base_unc, cor, ln_ratio,
        ln_ratio_unc, ratio, ratio_unc, diff, diff_unc, kld, kld_unc, rms_dp, rms_dp_unc, same_top,
        same_top_unc, mean_dp, mean_dp_unc`` (probabilities as fractions, not percent), and ``count``;
        with ``percentiles`` (a sort of every token's values) also ``kld_max, kld_p99, kld_median``."""
        n = self.count
        nll, nllb = self.values("nll"), self.values("nll_base")
        lp, lpu = mean_unc(nll)
        lb, lbu = mean_unc(nllb)
        cov = 0.0
        if n >= 10:
            cov = (float((nll * nllb).sum()) / n - (float(nll.sum()) / n) * (float(nllb.sum()) / n)) / (n - 1)
        ln_ratio, ln_unc = lp - lb, math.sqrt(max(lpu * lpu + lbu * lbu - 2.0 * cov, 0.0))
        ppl, pplb = math.exp(lp), math.exp(lb)
        kld, kldu = mean_unc(self.values("kld"))
        dp = self.values("p_diff")
        mse, mseu = mean_unc(dp * dp)
        rms = math.sqrt(mse)
        top = float(self.values("same_top").sum()) / n if n else 0.0
        mdp, mdpu = mean_unc(dp)
        extra: dict[str, float] = {}
        if percentiles and n:
            k = np.sort(self.values("kld").astype(np.float32))
            extra = {"kld_max": float(k[-1]), "kld_p99": percentile(k, 0.99), "kld_median": median(k)}
        return extra | {"count": n, "ppl": ppl, "ppl_unc": ppl * lpu, "ppl_base": pplb, "ppl_base_unc": pplb * lbu,
                "cor": cov / (lpu * lbu) if lpu * lbu > 0 else float("nan"),
                "ln_ratio": ln_ratio, "ln_ratio_unc": ln_unc, "ratio": math.exp(ln_ratio),
                "ratio_unc": math.exp(ln_ratio) * ln_unc, "diff": ppl - pplb,
                "diff_unc": math.sqrt(max((ppl * lpu) ** 2 + (pplb * lbu) ** 2 - 2.0 * ppl * pplb * cov, 0.0)),
                "kld": kld, "kld_unc": kldu, "rms_dp": rms, "rms_dp_unc": 0.5 / rms * mseu if rms > 0 else 0.0,
                "same_top": top, "same_top_unc": math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0,
                "mean_dp": mdp, "mean_dp_unc": mdpu}

    def chunk_line(self, chunk: int) -> str:
        """The running line llama.cpp prints after each chunk (:data:`CHUNK_HEADER`'s columns)."""
        s = self.summary()
        return (f"{chunk:4d}    {s['ppl']:9.4f} ± {s['ppl_unc']:9.4f}"
                f"    {s['ln_ratio']:10.5f} ± {s['ln_ratio_unc']:10.5f}"
                f"    {s['kld']:10.5f} ± {s['kld_unc']:10.5f}"
                f"    {100 * s['rms_dp']:6.3f} ± {100 * s['rms_dp_unc']:6.3f} %"
                f"    {100 * s['same_top']:6.3f} ± {100 * s['same_top_unc']:6.3f} %")

    def report(self) -> list[str]:
        """llama.cpp's three closing sections (perplexity, KL divergence, token probability statistics);
        none with fewer than 100 tokens ("we do not wish to do statistics on so few values")."""
        if self.count < 100:
            return []
        s = self.summary()
        k = np.sort(self.values("kld").astype(np.float32))
        d = np.sort(self.values("p_diff").astype(np.float32))
        out = ["====== Perplexity statistics ======",
               f"Mean PPL(Q)                   : {s['ppl']:10.6f} ± {s['ppl_unc']:10.6f}",
               f"Mean PPL(base)                : {s['ppl_base']:10.6f} ± {s['ppl_base_unc']:10.6f}",
               f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * s['cor']:6.2f}%",
               f"Mean ln(PPL(Q)/PPL(base))     : {s['ln_ratio']:10.6f} ± {s['ln_ratio_unc']:10.6f}",
               f"Mean PPL(Q)/PPL(base)         : {s['ratio']:10.6f} ± {s['ratio_unc']:10.6f}",
               f"Mean PPL(Q)-PPL(base)         : {s['diff']:10.6f} ± {s['diff_unc']:10.6f}",
               "",
               "====== KL divergence statistics ======",
               f"Mean    KLD: {s['kld']:10.6f} ± {s['kld_unc']:10.6f}",
               f"Maximum KLD: {float(k[-1]):10.6f}"]
        out += [f"{_pct(f)}   KLD: {percentile(k, f):10.6f}" for f in KLD_PERCENTILES]
        out.append(f"Median  KLD: {median(k):10.6f}")
        out += [f"{_pct(f)}   KLD: {percentile(k, f):10.6f}" for f in KLD_LOW]
        out += [f"Minimum KLD: {float(k[0]):10.6f}", "", "====== Token probability statistics ======",
                f"Mean    Δp: {100 * s['mean_dp']:6.3f} ± {100 * s['mean_dp_unc']:5.3f} %",
                f"Maximum Δp: {100 * float(d[-1]):6.3f}%"]
        out += [f"{_pct(f)}   Δp: {100 * percentile(d, f):6.3f}%" for f in DP_PERCENTILES]
        out.append(f"Median  Δp: {100 * median(d):6.3f}%")
        out += [f"{_pct(f)}   Δp: {100 * percentile(d, f):6.3f}%" for f in DP_LOW]
        out += [f"Minimum Δp: {100 * float(d[0]):6.3f}%",
                f"RMS Δp    : {100 * s['rms_dp']:6.3f} ± {100 * s['rms_dp_unc']:5.3f} %",
                f"Same top p: {100 * s['same_top']:6.3f} ± {100 * s['same_top_unc']:5.3f} %"]
        return out


#: Vocabulary entries per block of rows :func:`compare` works on (its float64 temporaries: 8 bytes each).
ROW_BLOCK_VALUES = 8 << 20

#: The header llama.cpp prints above the running lines.
CHUNK_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
                "Δp RMS            Same top p")


def _pct(fraction: float) -> str:
    return f"{100 * fraction:4.1f}%"


@dataclasses.dataclass
class KldResult:
    """A finished comparison: ``summary`` (:meth:`KldStats.summary`) and the ``stats`` behind it."""

    summary: dict[str, float]
    stats: KldStats


def compare(model: PlacedModel, base: LogitsFile, n_batch: int, bos: int | None, n_chunks: int = -1,
            on_chunk: Callable[[int, KldStats], None] | None = None) -> KldResult:
    """Evaluate the base file's tokens with ``model`` (its chunking: ``base.n_ctx``, ``base.n_chunk``) and
    compare each scored token's distribution with the stored one (module doc).

    Args:
        model: a placed model whose vocabulary has ``base.n_vocab`` tokens and ``n_ctx >= base.n_ctx``;
        n_batch: tokens per pass; bos: the id each chunk starts with (None: none);
        n_chunks: at most this many of the file's chunks (< 0: all);
        on_chunk: called with (chunk index from 1, the stats so far) after each chunk.
    Raises:
        CooktopError: the vocabularies differ. Whatever the model's forward raises.
    """
    if model.cfg.n_vocab != base.n_vocab:
        raise CooktopError(f"{base.path} was made with a vocabulary of {base.n_vocab} tokens, this model has "
                           f"{model.cfg.n_vocab}: compare models of the same vocabulary")
    n_chunk = base.n_chunk if n_chunks < 0 else min(n_chunks, base.n_chunk)
    ch = Chunking(base.n_ctx, n_chunk, min(n_batch, base.n_ctx), bos)
    stats = KldStats()
    step = max(1, ROW_BLOCK_VALUES // base.n_vocab)  # float64 temporaries of ~64 MiB at most
    for i, (logits, targets) in enumerate(chunk_logits(model, base.tokens, ch)):
        figures = [token_kld(logits[r:r + step], dequantize_rows(base.rows[i][r:r + step], base.n_vocab),
                             targets[r:r + step]) for r in range(0, len(logits), step)]
        stats.add({k: np.concatenate([f[k] for f in figures]) for k in figures[0]})
        if on_chunk is not None:
            on_chunk(i + 1, stats)
    return KldResult(stats.summary(percentiles=True), stats)
