"""Speculative decoding: the output is that of decoding without it, greedy on every backend and
sampled with a seed; the acceptance rule keeps the target's distribution (a model with known
probabilities, many seeded draws); the drafters propose what llama.cpp / llama-cpp-python do."""

from __future__ import annotations

import numpy as np
import pytest
from batchutil import run_in_driver
from conftest import SHARED, skip_or_fail

from cooktop.engine import generate as G
from cooktop.engine.sampling import SamplingParams
from cooktop.engine.sequence import Sequence
from cooktop.engine.speculative import (
    DraftModel,
    LlamaPromptLookupDecoding,
    NgramSimple,
    Speculation,
)
from cooktop.errors import CooktopError
from cooktop.model.placed import CacheTokens

#: a story that repeats itself, so that n-gram drafts get accepted
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play with her ball. One day, "
        "Lily saw a big dog. The dog was very friendly. Once upon a time, there was a little girl named Lily.")
GREEDY = SamplingParams(temperature=0)


def _engine(family: str, model: str = "stories260K.gguf"):
    from cooktop.backends import registry
    path = SHARED / "models" / model
    if not path.exists():
        skip_or_fail("shared", f"{path} missing")
    if family != "cpu":
        res = registry.probe(family)
        if not res.available or not res.devices:
            skip_or_fail(family, f"{res.reason}; to enable: {res.hint}")
    return G.load(str(path), n_ctx=256, n_batch=64, device=family, n_gpu_layers=-1)


@pytest.mark.parametrize("family", ["cpu", "opencl", "vulkan"])
def test_greedy_output_is_the_non_speculative_one(family):
    eng = _engine(family)
    try:
        prompt = eng.tokenizer.tokenize(TEXT, add_bos=True)
        plain = eng.generate(prompt, 32, GREEDY).drain()
        drafters = [LlamaPromptLookupDecoding(2, 10)] + ([NgramSimple(3, 8)] if family == "cpu" else [])
        for drafter in drafters:
            spec = eng.generate(prompt, 32, GREEDY, draft=Speculation(drafter, n_max=8)).drain()
            assert spec.tokens == plain.tokens, (family, drafter)
            assert spec.text == plain.text
            assert spec.timings.n_drafted and spec.timings.n_drafted > 0
            assert 0 < spec.timings.n_accepted <= spec.timings.n_drafted
            assert spec.timings.eval_n < plain.timings.eval_n  # fewer forwards
            # the cache holds the prompt and the generated tokens but the last (rejected drafts dropped)
            assert eng.seq.tokens == prompt + spec.tokens[:-1]
    finally:
        eng.close()


def test_seeded_sampling_and_draft_models_give_the_non_speculative_output():
    eng = _engine("cpu")
    rand = _engine("cpu", "tiny/tiny-Q8_0.gguf")  # same vocabulary, random weights: most drafts rejected
    try:
        prompt = eng.tokenizer.tokenize(TEXT, add_bos=True)
        sampled = SamplingParams(temperature=0.9, seed=7, top_k=0, top_p=1.0, min_p=0.0)
        plain = eng.generate(prompt, 48, sampled).drain()
        spec = eng.generate(prompt, 48, sampled, draft=Speculation(LlamaPromptLookupDecoding(), 10)).drain()
        assert spec.tokens == plain.tokens and spec.timings.n_drafted
        greedy = eng.generate(prompt, 24, GREEDY).drain()
        self_draft = DraftModel(eng, n_max=4, vocab_of=eng)  # the model as its own draft: all accepted
        got = eng.generate(prompt, 24, GREEDY, draft=Speculation(self_draft, 4)).drain()
        assert got.tokens == greedy.tokens
        assert got.timings.n_accepted == got.timings.n_drafted > 0
        bad = eng.generate(prompt, 24, GREEDY, draft=Speculation(DraftModel(rand, 4, vocab_of=eng), 4)).drain()
        assert bad.tokens == greedy.tokens and bad.timings.n_accepted < bad.timings.n_drafted
        confident = DraftModel(rand, 4, p_min=0.99)  # flat random logits: never that sure
        none = eng.generate(prompt, 8, GREEDY, draft=Speculation(confident, 4)).drain()
        assert none.tokens == greedy.tokens[:8] and none.timings.n_drafted == 0
        # closed early: the context is what was yielded but the last token, no unchecked draft left
        gen = eng.generate(prompt, 40, GREEDY, draft=Speculation(lambda ids: [5, 6, 7, 8], 4))
        first = [next(gen).token for _ in range(5)]
        gen.close()
        assert eng.seq.tokens == prompt + first[:4]
        # a full context: drafts never pass n_ctx, the generation ends at "length" or shifts as without them
        small = G.load(str(SHARED / "models" / "stories260K.gguf"), n_ctx=len(prompt) + 12, device="cpu")
        try:
            lookup = Speculation(LlamaPromptLookupDecoding(), 10)
            for n_keep in (None, 4):
                want = small.generate(prompt, 30, GREEDY, n_keep=n_keep).drain()
                got = small.generate(prompt, 30, GREEDY, n_keep=n_keep, draft=lookup).drain()
                assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
                assert small.seq.n_past <= small.n_ctx
        finally:
            small.close()
    finally:
        eng.close()
        rand.close()


def test_drafters_propose_what_llama_cpp_and_llama_cpp_python_do():
    ids = np.array([5, 6, 7, 8, 9, 5, 6], dtype=np.intc)
    # llama-cpp-python: the longest suffix n-gram's first earlier occurrence, then what followed it
    assert LlamaPromptLookupDecoding(2, 3)(ids).tolist() == [7, 8, 9]
    assert LlamaPromptLookupDecoding(2, 10)(ids).tolist() == [7, 8, 9, 5, 6]
    assert LlamaPromptLookupDecoding(2, 3)(np.array([1, 2, 3], dtype=np.intc)).tolist() == []
    # llama.cpp ngram-simple: the last size_n tokens searched backwards, the size_m after the match
    hist = np.array([0, 1, 2, 3, 4, 1, 2, 3, 4, 9, 9, 1, 2], dtype=np.intc)
    assert NgramSimple(2, 3)(hist).tolist() == [3, 4, 9]
    assert NgramSimple(2, 3)(hist[:5]).tolist() == []  # too short: needs more than n + m + 1 tokens
    with pytest.raises(CooktopError, match="max_ngram_size"):
        LlamaPromptLookupDecoding(0, 3)
    with pytest.raises(CooktopError, match="draft-max"):
        Speculation(NgramSimple(), n_max=0)
    spec = Speculation(lambda ids: [1, 2, 3], n_max=8, n_min=4)
    assert spec.propose([1], 8, 512) == []  # shorter than --draft-min: not verified
    with pytest.raises(CooktopError, match="outside the vocabulary"):
        Speculation(lambda ids: [600], 4).propose([1], 8, 512)


# -- the acceptance rule on a model with known probabilities ------------------------------

#: p(next | last token) over a vocabulary of 4 (rows: the last token)
P = np.array([[0.1, 0.2, 0.3, 0.4],
              [0.5, 0.1, 0.2, 0.2],
              [0.25, 0.25, 0.25, 0.25],
              [0.7, 0.1, 0.1, 0.1]])


class _Cache(CacheTokens):
    """A stand-in cache (the engine's contract: ``CacheTokens``) of token ids only."""

    closed = False
    n_seq = 1

    def __init__(self):
        self.seq_tokens: list[list[int]] = [[]]

    def truncate(self, n, seq_id=0):
        del self.seq_tokens[seq_id][max(n, 0):]

    def close(self):
        self.closed = True


class _KnownModel:
    """A "model" whose logits after token t are log P[t] (a Markov chain): every row of a
    batch gets exactly what one-at-a-time decoding gets."""

    n_ctx, n_batch, logits_all = 64, 16, False

    class cfg:  # noqa: N801 - the attribute the engine reads
        n_vocab = 4

    def new_cache(self, n_seq=1):
        return _Cache()

    def lora_scales(self):  # no LoRA adapters (PlacedModel.lora_scales / use_lora)
        return []

    def use_lora(self, scales):
        pass

    def forward(self, tokens, n_past, cache, logits_all=None, embeddings=False, seq_id=0):
        cache.truncate(n_past, seq_id)
        cache.seq_tokens[seq_id].extend(int(t) for t in tokens)
        rows = np.log(P[np.asarray(tokens)]).astype(np.float32)
        return rows if logits_all else rows[-1:]


class _Tok:
    def is_eog(self, t):
        return False

    def token_to_piece(self, t, special=False):
        return b"abcd"[t:t + 1]


def _fake_engine() -> G.Engine:
    eng = G.Engine.__new__(G.Engine)
    eng.model, eng.tokenizer, eng.load_ms = _KnownModel(), _Tok(), 0.0
    eng.cfg = eng.model.cfg
    eng.n_ctx, eng.n_batch = 64, 16
    eng.seq = Sequence(eng.model)  # type: ignore[arg-type]
    return eng


#: chi-square critical value for 15 degrees of freedom at p = 1e-9 (scipy.stats.chi2.isf(1e-9, 15) = 73.63)
CHI2_15 = 73.6


def test_sampling_with_drafts_keeps_the_target_distribution():
    """Pairs (t1, t2) after the prompt [0], 6000 seeded generations with a draft that always
    proposes [0, 0, 0] (p(t1 = 0) = 0.1): the frequencies match P[0, t1] * P[t1, t2] (chi-square,
    15 dof, below the 1e-9 critical value: no chance failure), while taking the draft's tokens
    unchecked would put every count on (0, 0), more than 100 times that critical value."""
    eng = _fake_engine()
    spec = Speculation(lambda ids: [0, 0, 0], n_max=3)
    counts = np.zeros((4, 4))
    n, drafted, accepted = 6000, 0, 0
    for seed in range(n):
        params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        r = eng.generate([0], 3, params, draft=spec).drain()
        counts[r.tokens[0], r.tokens[1]] += 1
        drafted += r.timings.n_drafted or 0
        accepted += r.timings.n_accepted
    expected = n * P[0][:, None] * P
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_15, (chi2, counts)
    unchecked = np.zeros((4, 4))
    unchecked[0, 0] = n
    assert float(((unchecked - expected) ** 2 / expected).sum()) > 100 * CHI2_15
    assert drafted > 0 and 0 < accepted < drafted  # the rule both accepted and rejected drafts


# -- the front ends: Llama(draft_model=...), cooktop run, cooktop serve ----------------------

def test_llama_draft_model_gives_the_same_completion(stories):
    from cooktop import Llama
    from cooktop.api.llama_speculative import LlamaPromptLookupDecoding
    plain = Llama(str(stories), n_ctx=256, verbose=False)
    spec = Llama(str(stories), n_ctx=256, verbose=False, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
    try:
        a = plain.create_completion(TEXT, max_tokens=32, temperature=0)["choices"][0]["text"]
        b = spec.create_completion(TEXT, max_tokens=32, temperature=0)["choices"][0]["text"]
        assert a == b and a
        assert spec._engine.seq.tokens == plain._engine.seq.tokens
        with pytest.raises(CooktopError, match="draft_model must be"):
            Llama(str(stories), n_ctx=64, verbose=False, draft_model=3)
    finally:
        plain.close()
        spec.close()


def test_run_prints_the_drafted_and_accepted_counts(stories):
    import subprocess
    import sys

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cooktop.cli", "run", "-m", str(stories), "-p", TEXT, "-n", "24",
                               "--temp", "0", "--device", "cpu", "-c", "256", *extra],
                              capture_output=True, text=True, timeout=120)
    plain = run()
    spec = run("-md", str(stories), "--draft-max", "4", "--spec-type", "draft-simple,ngram-simple",
               "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    lines = dict(line.split(" = ", 1) for line in spec.stderr.splitlines() if line.startswith("cooktop: n_"))
    n_drafted, n_accept = int(lines["cooktop: n_drafted"]), int(lines["cooktop: n_accept "])
    assert 0 < n_accept <= n_drafted  # stories260K as its own draft: its greedy drafts are accepted
    assert "cooktop: accept    = " in spec.stderr and "n_drafted" not in plain.stderr
    assert (f"cooktop: speculative decoding tries ngram-simple, then draft-simple (-md {stories}): the first "
            "non-empty draft is verified") in spec.stderr
    bad = run("--spec-type", "eagle3")
    assert bad.returncode != 0 and "--spec-type eagle3 is not supported" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_draft_sizes_are_checked_before_any_model_loads():
    from cooktop.engine.spec_config import SpecOptions

    with pytest.raises(CooktopError, match="--draft-min 5 is past --draft-max 2: the draft model would never draft"):
        SpecOptions(model_draft="/nonexistent.gguf", draft_min=5, draft_max=2).check()
    with pytest.raises(CooktopError, match="--draft-max must be >= 1"):
        SpecOptions(model_draft="/nonexistent.gguf", draft_max=0).check()
    assert SpecOptions(model_draft="d.gguf", draft_min=2, draft_max=2).check() == ["draft-simple"]
    assert SpecOptions(draft_min=5, draft_max=2, spec_type=("ngram-simple",)).check() == ["ngram-simple"]
    assert SpecOptions(model_draft="d.gguf").notice() == ""
    assert SpecOptions(spec_type=("ngram-simple",)).notice() == ""
    both = SpecOptions(model_draft="d.gguf", spec_type=("draft-simple,ngram-simple",))
    assert both.types() == ["ngram-simple", "draft-simple"]  # llama.cpp's priority, whatever the order given
    assert both.notice() == ("speculative decoding tries ngram-simple, then draft-simple (-md d.gguf): the first "
                             "non-empty draft is verified")
    with pytest.raises(CooktopError, match="unknown speculative type ''"):
        SpecOptions(spec_type=("",)).types()
    with pytest.raises(CooktopError, match="unknown speculative type ''"):
        SpecOptions(spec_type=("ngram-simple,",)).types()
    # llama.cpp: a list naming none is none, a draft model given or not
    assert SpecOptions(spec_type=("ngram-simple,none",)).types() == []
    assert SpecOptions(model_draft="d.gguf", spec_type=("none",)).types() == []
    alone = SpecOptions(model_draft="d.gguf", spec_type=("ngram-simple",))
    assert alone.types() == ["ngram-simple"]  # an explicit list is taken as given, as llama.cpp
    assert alone.notice() == ("the draft model -md d.gguf is not used: --spec-type ngram-simple does not include "
                              "draft-simple (as llama.cpp)")


def test_serve_names_the_draft_model_and_checks_its_options_first(stories, tmp_path, server_deps):
    import subprocess
    import sys

    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(stories.read_bytes()[:1000])

    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])

    def serve(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cooktop.cli", "serve", "--host", "127.0.0.1", "--port", port,
                               "--device", "cpu", *extra], capture_output=True, text=True, timeout=120)
    r = serve("-m", str(stories), "-md", str(trunc))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: cannot load the draft model (-md) {trunc}: "), r.stderr
    assert str(stories) not in r.stderr.strip().splitlines()[-1]
    r = serve("-m", str(trunc), "-md", str(stories), "--draft-max", "0")  # refused before the (bad) target loads
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("error: --draft-max must be >= 1")
    r = serve("-m", str(trunc), "-md", str(stories), "--draft-min", "5", "--draft-max", "2")
    assert r.returncode == 1 and "the draft model would never draft" in r.stderr


def test_serve_slots_decode_speculatively_with_the_same_answers(stories, server_deps):
    import concurrent.futures

    import httpx
    from serverutil import RunningServer

    from cooktop.engine.spec_config import SpecOptions
    from cooktop.server.app import ServerConfig

    def ask(base: str, p: str) -> dict:
        r = httpx.post(base + "/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    answers, timings = [], []
    prompts = [TEXT, TEXT[40:], "Once upon a time, Tom"]
    for spec in (None, SpecOptions(model_draft=str(stories), draft_max=4, spec_type=("ngram-simple", "draft-simple"),
                                   ngram_size_n=3, ngram_size_m=8)):
        s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), n_parallel=3,
                                       speculative=spec))
        try:
            with concurrent.futures.ThreadPoolExecutor(3) as ex:
                got = list(ex.map(lambda p, base=s.base: ask(base, p), prompts))
            answers.append([g["choices"][0]["text"] for g in got])
            timings.append([g["timings"] for g in got])
            assert all(t["predicted_n"] == g["usage"]["completion_tokens"] for t, g in zip(timings[-1], got))
            assert all(x["speculative"] is (spec is not None) for x in httpx.get(s.base + "/slots").json())
            if spec is not None:
                assert s.state.draft_engine is not None
        finally:
            s.stop()
    assert answers[0] == answers[1]
    # llama-server's per-request draft counts: only with drafting (ngram-simple's drafts are tried
    # first and may be cut short; the self-draft's are accepted whole)
    assert not any("draft_n" in t for t in timings[0])
    assert all(0 <= t["draft_n_accepted"] <= t["draft_n"] for t in timings[1])
    assert sum(t["draft_n"] for t in timings[1]) > 0 and sum(t["draft_n_accepted"] for t in timings[1]) > 0


def test_drafts_checked_in_the_batch_drivers_steps_give_the_alone_text():
    """Three threads decode speculatively through one BatchDriver (a draft's rows are one request
    of a shared step, ``forward_batch``'s ``want_logits = k``): each text is its plain one alone."""
    eng = _engine("cpu")
    try:
        prompts = [eng.tokenizer.tokenize(t, add_bos=True) for t in (TEXT, TEXT[50:], "Once upon a time, Tom")]
        alone = [eng.generate(p, 24, GREEDY, seq=eng.new_sequence()).drain().tokens for p in prompts]
        def job(i: int):
            def run(seq):
                r = eng.generate(prompts[i], 24, GREEDY, seq=seq,
                                 draft=Speculation(LlamaPromptLookupDecoding(2, 6), 6)).drain()
                return r.tokens, r.timings.n_drafted
            return run

        got, drv = run_in_driver(eng, [job(i) for i in range(3)])
        assert [g[0] for g in got] == alone
        assert sum(g[1] for g in got) > 0 and drv.stats.max_seqs >= 2
    finally:
        eng.close()
