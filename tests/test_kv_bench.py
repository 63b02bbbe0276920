"""``cooktop bench -d/--n-depth`` and ``-ctk/-ctv/-fa`` sweeps (llama-bench's semantics), also passed to
llama-cpp-python and to a llama-bench binary."""

from __future__ import annotations

import json
import subprocess
import sys

from gguf import GGMLQuantizationType as T

from cooktop.bench import llama_bench, runner
from cooktop.bench.report import from_records, record, to_markdown
from cooktop.format.kvtypes import KVConfig


def test_depth_tests_are_named_and_ordered_as_llama_bench():
    tests = runner.make_tests([16], [4], [], [0, 64])
    assert [t.name for t in tests] == ["pp16", "pp16 @ d64", "tg4", "tg4 @ d64"]
    assert tests[1].n_tokens == 16 and tests[1].n_depth == 64


class _Counting:
    """A Runner that records what it is asked to evaluate."""

    backend = device = device_name = placement = "fake"
    load_ms = 0.0

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def reset(self):
        self.calls.append(("reset", 0))

    def prompt(self, tokens):
        self.calls.append(("prompt", len(tokens)))

    def decode(self, token):
        self.calls.append(("decode", 1))

    def close(self):
        pass


def test_run_once_fills_the_depth_first_untimed():
    t = runner.TestSpec(0, 3, 50)
    toks = runner.tokens_for(t, 512, 1)
    assert len(toks) == 53 and toks == runner.tokens_for(t, 512, 1)
    r = _Counting()
    runner.run_once(r, t, toks)
    assert r.calls == [("reset", 0), ("prompt", 50), ("decode", 1), ("decode", 1), ("decode", 1)]


def test_llama_bench_gets_depths_and_cache_types():
    tests = runner.make_tests([16], [4], [(8, 2)], [0, 2048])
    argv, _ = llama_bench.command("lb", "/m.gguf", tests, 2, 64, "cpu", KVConfig(T.Q8_0, T.Q8_0, "on"))
    s = " ".join(argv)
    assert "-p 16 -n 4" in s and s.count("-pg 8,2") == 1 and "-d 0,2048" in s
    assert "-ctk q8_0 -ctv q8_0 -fa on" in s


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
