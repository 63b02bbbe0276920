"""``cooktop bench -d/--n-depth`` and ``-ctk/-ctv/-fa`` sweeps (llama-bench's semantics), also passed to
llama-cpp-python and to a llama-bench binary."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as T

from cooktop.bench import llama_bench, runner
from cooktop.bench.report import from_records, record, to_markdown
from cooktop.format.kvtypes import KVConfig


def test_depth_tests_are_named_and_ordered_as_llama_bench():
    tests = runner.make_tests([16], [4], [], [0, 64])
    assert [t.name for t in tests] == ["pp16", "pp16 @ d64", "tg4", "tg4 @ d64"]
    assert tests[1].n_tokens == 16 and tests[1].n_depth == 64


class _Counting:
    """A Runner that records what it is asked to evaluate, and keeps the context it would hold."""

    backend = device = device_name = placement = "fake"
    load_ms = 0.0

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.context: list[int] = []
        self.timed_contexts: list[list[int]] = []  # the context when each decode began

    def reset(self):
        self.calls.append(("reset", 0))
        self.context = []

    def truncate(self, n):
        self.calls.append(("truncate", n))
        self.context = self.context[:n]

    def prompt(self, tokens):
        self.calls.append(("prompt", len(tokens)))
        self.context += list(tokens)

    def decode(self, token):
        self.calls.append(("decode", 1))
        self.timed_contexts.append(list(self.context))
        self.context.append(token)

    def close(self):
        pass


class _NoTruncate(_Counting):
    """A Runner without ``truncate`` (it must refill the depth every run)."""

    truncate = None  # type: ignore[assignment]


def test_run_once_fills_the_depth_first_untimed():
    t = runner.TestSpec(0, 3, 50)
    toks = runner.tokens_for(t, 512, 1)
    assert len(toks) == 53 and toks == runner.tokens_for(t, 512, 1)
    r = _Counting()
    runner.run_once(r, t, toks)
    assert r.calls == [("reset", 0), ("prompt", 50), ("decode", 1), ("decode", 1), ("decode", 1)]


def _bench_with(monkeypatch, fake, tests, reps, warmup=True, ref=None):
    """run_bench over ``tests`` with ``fake`` as cooktop's runner (and ``ref`` as the reference)."""
    monkeypatch.setattr(runner, "CooktopRunner", lambda *a, **k: fake)
    monkeypatch.setattr(runner, "SETTLE_S", 0.0)
    mf = runner.ModelFacts("/m.gguf", "llama 2M F32", 1, 1, 512, "F32")
    params = runner.BenchParams(models=["/m.gguf"], tests=tests, devices=["cpu"], ngl=[-1], n_batch=[64],
                                reps=reps, warmup=warmup)
    vs = (lambda path, n_ctx, n_batch, kv=None: ref) if ref is not None else None
    return runner.run_bench(params, vs=vs, facts={"/m.gguf": mf})


def test_warm_up_is_llama_benchs_prompt_and_two_tokens_without_the_depth(monkeypatch):
    """llama-bench.cpp: warm-up = test_prompt(n_prompt) if n_prompt, test_gen(1) if n_gen; no depth fill
    (cooktop decodes 2 tokens: a decode step is recorded for replay the second time it is seen).
    Then the first timed run fills the depth, and the later ones keep it (llama-bench's saved state)."""
    fake, ref = _Counting(), _Counting()
    res = _bench_with(monkeypatch, fake, [runner.TestSpec(0, 3, 50)], reps=3, ref=ref)
    timed = [("decode", 1)] * 3
    for r in (fake, ref):
        assert r.calls == ([("reset", 0), ("decode", 1), ("decode", 1)]  # warm-up: two tokens, empty context
                           + [("reset", 0), ("prompt", 50)] + timed  # run 1 fills the depth
                           + [("truncate", 50)] + timed + [("truncate", 50)] + timed)  # runs 2, 3 keep it
    toks = runner.tokens_for(runner.TestSpec(0, 3, 50), 512, 1234)
    assert fake.timed_contexts[:2] == [[], [toks[50]]]  # the warm-up tokens see no depth
    for i in range(3):  # each timed run decodes the same 3 tokens after the same 50-token depth
        assert fake.timed_contexts[2 + 3 * i: 5 + 3 * i] == [toks[:50 + j] for j in range(3)]
    assert all(len(x.samples_s) == 3 and x.error is None for x in res)

    fake = _Counting()
    _bench_with(monkeypatch, fake, [runner.TestSpec(16, 0, 8), runner.TestSpec(16, 2, 0)], reps=1)
    assert fake.calls == [("reset", 0), ("prompt", 16), ("reset", 0), ("prompt", 8), ("prompt", 16),  # pp16 @ d8
                          ("reset", 0), ("prompt", 16), ("decode", 1), ("decode", 1),  # pp16+tg2: warm-up
                          ("reset", 0), ("prompt", 16), ("decode", 1), ("decode", 1)]


def test_no_warmup_and_runners_without_truncate(monkeypatch):
    fake = _Counting()
    res = _bench_with(monkeypatch, fake, [runner.TestSpec(0, 2, 30)], reps=2, warmup=False)
    assert fake.calls == [("reset", 0), ("prompt", 30), ("decode", 1), ("decode", 1),
                          ("truncate", 30), ("decode", 1), ("decode", 1)]
    assert len(res[0].samples_s) == 2
    plain = _NoTruncate()
    _bench_with(monkeypatch, plain, [runner.TestSpec(0, 1, 30)], reps=2, warmup=False)
    assert plain.calls == [("reset", 0), ("prompt", 30), ("decode", 1)] * 2  # refilled every run


def test_cooktop_runner_truncate_keeps_the_depth(stories):
    """CooktopRunner.truncate(d) then the same decode gives the logits of a fresh fill of d tokens."""
    r = runner.CooktopRunner(str(stories), "cpu", -1, 64, None, 128)
    try:
        toks = runner.tokens_for(runner.TestSpec(0, 2, 40), 512, 7)
        r.prompt(toks[:40])
        first = r.eng.eval([toks[40]]).copy()
        r.decode(toks[41])
        r.truncate(40)
        assert r.eng.tokens == toks[:40]
        again = r.eng.eval([toks[40]])
        np.testing.assert_allclose(again, first, rtol=1e-5, atol=1e-5)
    finally:
        r.close()


def test_llama_cpp_runner_truncate_keeps_the_depth(stories):
    """LlamaCppRunner.truncate(d) (Llama.n_tokens = d) then the same token: the logits of the first pass."""
    from conftest import skip_or_fail

    from cooktop.bench import vs_llamacpp

    try:
        vs_llamacpp.import_llama_cpp()
    except vs_llamacpp.LlamaCppUnavailable as e:
        skip_or_fail("llama_cpp", str(e))
    r = vs_llamacpp.LlamaCppRunner(str(stories), 128, 64, n_threads=1)
    try:
        toks = runner.tokens_for(runner.TestSpec(0, 2, 40), 512, 7)
        r.prompt(toks[:40])
        r.decode(toks[40])
        first = np.array(r.llm.scores[40]).copy()
        r.decode(toks[41])
        r.truncate(40)
        assert r.llm.n_tokens == 40
        r.decode(toks[40])
        np.testing.assert_allclose(np.array(r.llm.scores[40]), first, rtol=1e-5, atol=1e-5)
        assert r.llm.n_tokens == 41
    finally:
        r.close()


def test_llama_bench_gets_depths_and_cache_types():
    tests = runner.make_tests([16], [4], [(8, 2)], [0, 2048])
    argv, _ = llama_bench.command("lb", "/m.gguf", tests, 2, 64, "cpu", KVConfig(T.Q8_0, T.Q8_0, "on"))
    s = " ".join(argv)
    assert "-p 16 -n 4" in s and s.count("-pg 8,2") == 1 and "-d 0,2048" in s
    assert "-ctk q8_0 -ctv q8_0 -fa on" in s and "--no-warmup" not in s
    argv, _ = llama_bench.command("lb", "/m.gguf", tests, 2, 64, "cpu", warmup=False)
    assert "--no-warmup" in argv


def test_records_keep_depth_and_cache_types():
    mf = runner.ModelFacts("/m.gguf", "llama 2M F32", 1, 1, 512, "F32")
    res = runner.Result(mf, "numpy", "cpu", "cpu", -1, 64, None, runner.TestSpec(0, 4, 128), samples_s=[0.1],
                        kv=KVConfig(T.Q8_0, T.F16, "on"))
    rec = record(res, None)
    assert (rec["n_depth"], rec["type_k"], rec["type_v"], rec["flash_attn"], rec["test"]) == \
        (128, "q8_0", "f16", "on", "tg4 @ d128")
    back = from_records([rec])[0]
    assert back.test == res.test and back.kv == res.kv
    md = to_markdown([res])
    assert "| type_k | type_v | fa | test" in md and "| q8_0   | f16    | on | tg4 @ d128 |" in md


def test_bench_cli_sweeps_depth_and_flash_attention(stories):
    """One run: two depths x -fa on/off on numpy, JSON records of each (tg at depth d reads a cache of d)."""
    r = subprocess.run([sys.executable, "-m", "cooktop", "bench", "-m", str(stories), "--device", "cpu", "-p", "0",
                        "-n", "3", "-d", "0,40", "-fa", "on,off", "-ctv", "f32", "-r", "1", "-o", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    got = sorted((x["test"], x["flash_attn"], x["type_k"], x["type_v"]) for x in recs)
    assert got == sorted((t, fa, "f16", "f32") for t in ("tg3", "tg3 @ d40") for fa in ("on", "off"))
    assert all(x["avg_ts"] and not x["error"] for x in recs)
    bad = subprocess.run([sys.executable, "-m", "cooktop", "bench", "-m", str(stories), "--device", "cpu",
                          "-ctk", "q9"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "unsupported K cache type 'q9'" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_empty_fa_list_is_a_clear_error():
    """``-fa ""`` (or ``-ctk ""``) names no configuration: one clear error, not an empty table."""
    import pytest

    from cooktop.cli.bench import _kv_configs
    from cooktop.format.kvtypes import KVTypeError

    with pytest.raises(KVTypeError, match=r"-fa needs at least one value, got ''"):
        _kv_configs("f16", "f16", "")
    with pytest.raises(KVTypeError, match=r"-ctk needs at least one value"):
        _kv_configs(" , ", "f16", "on")
