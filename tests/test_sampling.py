"""The sampler (cooktop.engine.sampling) on hand-made distributions: greedy,
top-k, top-p, min-p, temperature, repeat penalty (llama.cpp semantics,
src/llama-sampling.cpp) and seeding."""

from __future__ import annotations

import numpy as np
import pytest

from cooktop.engine.sampling import Sampler, SamplingParams
from cooktop.errors import CooktopError

#: token id -> probability; ids deliberately not in probability order.
PROBS = {3: 0.40, 0: 0.25, 5: 0.15, 1: 0.10, 4: 0.06, 2: 0.04}
LOGITS = np.log(np.array([PROBS[i] for i in range(6)])).astype(np.float32) + np.float32(1.5)


def sampler(**kw) -> Sampler:
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=0)
    base.update(kw)
    return Sampler(SamplingParams(**base))


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def kept(**kw) -> list[int]:
    ids, probs = sampler(**kw).probabilities(LOGITS)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.diff(probs) <= 1e-15), "candidates must be best first"
    return [int(i) for i in ids]


def test_defaults_are_llama_cpp():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.repeat_last_n, p.seed) == \
        (0.8, 40, 0.95, 0.05, 1.0, 64, -1)


# -- greedy ------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_greedy_is_argmax(temperature):
    rng = np.random.default_rng(0)
    s = sampler(temperature=temperature)
    for _ in range(20):
        logits = rng.standard_normal(1000).astype(np.float32)
        assert s.sample(logits, []) == int(np.argmax(logits))


def test_top_k_1_is_greedy():
    rng = np.random.default_rng(1)
    s = sampler(temperature=1.5, top_k=1, seed=123)
    for _ in range(50):
        logits = rng.standard_normal(300).astype(np.float32)
        assert s.sample(logits, []) == int(np.argmax(logits))


# -- candidate sets ---------------------------------------------------------------
def test_no_filter_keeps_everything():
    assert kept() == [3, 0, 5, 1, 4, 2]


@pytest.mark.parametrize("k,expected", [(1, [3]), (2, [3, 0]), (4, [3, 0, 5, 1]), (6, [3, 0, 5, 1, 4, 2]),
                                        (100, [3, 0, 5, 1, 4, 2])])
def test_top_k(k, expected):
    assert kept(top_k=k) == expected


# cumulative: 0.40, 0.65, 0.80, 0.90, 0.96, 1.00 -> smallest prefix reaching p
@pytest.mark.parametrize("p,expected", [(0.3, [3]), (0.5, [3, 0]), (0.7, [3, 0, 5]), (0.85, [3, 0, 5, 1]),
                                        (0.95, [3, 0, 5, 1, 4]), (0.99, [3, 0, 5, 1, 4, 2])])
def test_top_p(p, expected):
    assert kept(top_p=p) == expected


# keep p_i >= min_p * p_max (p_max = 0.40)
@pytest.mark.parametrize("m,expected", [(0.9, [3]), (0.5, [3, 0]), (0.3, [3, 0, 5]), (0.2, [3, 0, 5, 1]),
                                        (0.12, [3, 0, 5, 1, 4]), (0.05, [3, 0, 5, 1, 4, 2])])
def test_min_p(m, expected):
    assert kept(min_p=m) == expected


@pytest.mark.parametrize("kw", [dict(min_p=1.0), dict(top_p=0.0), dict(top_k=1, min_p=1.0)])
def test_extreme_filters_keep_the_best_token(kw):
    """llama.cpp's min_keep = 1: an extreme filter still leaves the most likely token."""
    assert kept(**kw) == [3]
    assert sampler(seed=3, **kw).sample(LOGITS, []) == 3


@pytest.mark.parametrize("kw,word", [(dict(min_p=1.5), "min_p"), (dict(top_p=-1.0), "top_p"),
                                     (dict(top_p=2.0), "top_p"), (dict(repeat_penalty=0.0), "repeat_penalty"),
                                     (dict(repeat_penalty=-1.1), "repeat_penalty"),
                                     (dict(top_p=float("nan")), "top_p"), (dict(seed=2**40), "seed")])
def test_out_of_range_settings_are_refused(kw, word):
    from cooktop.errors import CooktopError
    with pytest.raises(CooktopError, match=word):
        SamplingParams(**kw)


def test_filters_chain_in_llama_cpp_order():
    # top-k 4 -> {3,0,5,1}; top-p 0.7 on the (renormalized) k set: 0.40/0.9=0.444, 0.722 -> {3,0};
    # min-p 0.7 -> 0.25 < 0.7*0.4 -> {3}
    assert kept(top_k=4, top_p=0.7) == [3, 0]
    assert kept(top_k=4, top_p=0.7, min_p=0.7) == [3]
    # min-p after top-p: top-p 0.85 -> {3,0,5,1}; min-p 0.3 -> {3,0,5}
    assert kept(top_p=0.85, min_p=0.3) == [3, 0, 5]


# -- temperature ----------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 2.5])
def test_temperature_is_softmax_of_scaled_logits(temperature):
    ids, probs = sampler(temperature=temperature).probabilities(LOGITS)
    np.testing.assert_allclose(probs, softmax(LOGITS[ids] / temperature), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(np.sort(probs)[::-1], np.sort(softmax(LOGITS / temperature))[::-1], rtol=1e-6)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_applies_after_filters(temperature):
    """The kept set is chosen at temperature 1; T then reshapes the probabilities of that set only."""
    ids, probs = sampler(temperature=temperature, top_p=0.7).probabilities(LOGITS)
    assert list(ids) == [3, 0, 5]
    np.testing.assert_allclose(probs, softmax(LOGITS[[3, 0, 5]] / temperature), rtol=1e-6)


def test_draws_follow_the_distribution():
    s = sampler(temperature=1.0, seed=7)
    n = 5000
    counts = np.bincount([s.sample(LOGITS, []) for _ in range(n)], minlength=6) / n
    expected = np.array([PROBS[i] for i in range(6)])
    assert np.max(np.abs(counts - expected)) < 0.03, counts


def test_draws_only_from_kept_set():
    s = sampler(temperature=3.0, top_p=0.7, seed=11)
    drawn = {s.sample(LOGITS, []) for _ in range(2000)}
    assert drawn == {3, 0, 5}


# -- repeat penalty ----------------------------------------------------------------
def test_repeat_penalty_formula():
    logits = np.array([2.0, -1.0, 0.5, -0.5, 3.0, 0.0], dtype=np.float32)
    # last 4 of the history: [1, 1, 3, 0] -> distinct {0, 1, 3}; token 2 only appears earlier
    history = [2, 2, 1, 1, 3, 0]
    s = sampler(repeat_penalty=2.0, repeat_last_n=4)
    out = s.apply_penalty(logits, history)
    np.testing.assert_array_equal(out, np.array([1.0, -2.0, 0.5, -1.0, 3.0, 0.0], dtype=np.float32))
    np.testing.assert_array_equal(logits, [2.0, -1.0, 0.5, -0.5, 3.0, 0.0])  # input untouched


def test_repeat_penalty_once_per_distinct_token():
    logits = np.array([4.0, -4.0], dtype=np.float32)
    out = sampler(repeat_penalty=2.0, repeat_last_n=64).apply_penalty(logits, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(out, [2.0, -8.0])


def test_repeat_penalty_window_options():
    logits = np.array([2.0, -1.0, 0.5], dtype=np.float32)
    history = [0, 1, 2]
    np.testing.assert_array_equal(sampler(repeat_penalty=2.0, repeat_last_n=-1).apply_penalty(logits, history),
                                  [1.0, -2.0, 0.25])  # -1: the whole history
    np.testing.assert_array_equal(sampler(repeat_penalty=2.0, repeat_last_n=0).apply_penalty(logits, history),
                                  logits)  # 0: disabled
    np.testing.assert_array_equal(sampler(repeat_penalty=1.0, repeat_last_n=64).apply_penalty(logits, history),
                                  logits)  # penalty 1: disabled
    np.testing.assert_array_equal(sampler(repeat_penalty=2.0, repeat_last_n=1).apply_penalty(logits, history),
                                  [2.0, -1.0, 0.25])
    np.testing.assert_array_equal(sampler(repeat_penalty=2.0).apply_penalty(logits, []), logits)


def test_repeat_penalty_changes_greedy_choice():
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    assert sampler(temperature=0).sample(logits, [0]) == 0
    assert sampler(temperature=0, repeat_penalty=2.0).sample(logits, [0]) == 1


# -- seeds -------------------------------------------------------------------------
def _draws(seed: int | None, n: int = 64) -> list[int]:
    s = sampler(temperature=1.0, seed=seed)
    logits = np.zeros(1000, dtype=np.float32)  # flat: every draw is informative
    return [s.sample(logits, []) for _ in range(n)]


def test_same_seed_same_draws():
    assert _draws(42) == _draws(42)
    assert _draws(42) != _draws(43)
    assert sampler(seed=42).seed == 42


@pytest.mark.parametrize("seed", [-1, None])
def test_random_seed_differs(seed):
    seeds = {sampler(seed=seed).seed for _ in range(5)}
    assert len(seeds) >= 2
    assert all(0 <= s < 2**32 for s in seeds)
    assert len({tuple(_draws(seed, 16)) for _ in range(5)}) >= 2


@pytest.mark.parametrize("n", [-5, -2, 1.5, True])
def test_repeat_last_n_below_minus_one_is_refused(n):
    """llama.cpp: -1 is the context size, 0 off; other negatives are an error, not "all"."""
    with pytest.raises(CooktopError, match=r"repeat_last_n \(--repeat-last-n\) must be -1"):
        SamplingParams(repeat_last_n=n)
    assert SamplingParams(repeat_last_n=-1).repeat_last_n == -1 and SamplingParams(repeat_last_n=0).repeat_last_n == 0


@pytest.mark.parametrize("chain", [dict(top_k=40, top_p=0.95, min_p=0.05, temperature=0.8),  # sorted candidates
                                   dict(top_k=0, top_p=1.0, min_p=0.05, temperature=1.2)])  # in vocabulary order
def test_a_seed_gives_llama_cpps_tokens(stories, chain):
    """llama.cpp's dist sampler (std::mt19937, libstdc++'s uniform double, the running sum): the same seed
    gives the same sampled text as llama-cpp-python for the default chain and an unsorted one."""
    from conftest import skip_or_fail

    from cooktop import Llama
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e})")
    kw = dict(repeat_penalty=1.0, max_tokens=32, **chain)
    ref = llama_cpp.Llama(str(stories), n_ctx=128, verbose=False)
    ours = Llama(model_path=str(stories), n_ctx=128, verbose=False, device="cpu")
    for seed in (42, 7, 123456):
        want = ref.create_completion("Once upon a time", seed=seed, **kw)["choices"][0]["text"]
        got = ours.create_completion("Once upon a time", seed=seed, **kw)["choices"][0]["text"]
        assert got == want, (seed, got, want)
