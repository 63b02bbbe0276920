"""Generation as values: steps, a result on the generator, several sequences on one model."""

from __future__ import annotations

import pytest

import cooktop
from cooktop.engine.generate import GenerationResult, Step
from cooktop.engine.sampling import SamplingParams
from cooktop.errors import ContextOverflowError, CooktopError

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def eng(stories):
    e = cooktop.load(stories, n_ctx=96, n_batch=4, device="cpu")
    yield e
    e.close()


def _prompt(eng, text):
    return eng.tokenizer.tokenize(text, add_bos=True)


def test_steps_and_result_value(eng):
    """Each step is a value; the result is StopIteration.value and .result, not engine state."""
    gen = eng.generate(_prompt(eng, "Once upon a time"), 8, GREEDY)
    assert gen.result is None
    steps: list[Step] = []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as end:
            value = end.value
            break
    assert isinstance(value, GenerationResult) and value is gen.result
    assert value.finish_reason == "length" and len(value.tokens) == 8
    assert [s.token for s in steps[:-1]] == value.tokens
    assert steps[-1].token is None and steps[-1].finish_reason == "length"
    assert all(s.finish_reason is None for s in steps[:-1])
    assert "".join(s.text for s in steps) == value.text
    assert value.text.startswith(", there was")
    assert not hasattr(eng, "result")
    with pytest.raises(StopIteration):  # exhausted; the result stays
        next(gen)
    assert gen.result is value

    def outer():
        return (yield from eng.generate(_prompt(eng, "Once upon a time"), 8, GREEDY))

    it = outer()
    with pytest.raises(StopIteration) as end:
        while True:
            next(it)
    assert isinstance(end.value.value, GenerationResult)
    assert end.value.value.tokens == value.tokens
    assert gen.drain() is value
    again = eng.generate(_prompt(eng, "Once upon a time"), 8, GREEDY).drain()
    assert (again.tokens, again.text) == (value.tokens, value.text)


def test_generate_checks_before_running(eng):
    """Bad prompts raise when generate() is called, not at the first step."""
    with pytest.raises(CooktopError, match="prompt is empty"):
        eng.generate([], 4, GREEDY)
    with pytest.raises(ContextOverflowError, match="n_ctx = 96"):
        eng.generate([1] * 97, 4, GREEDY)
    with pytest.raises(CooktopError, match="top_p"):
        eng.generate([1], 4, SamplingParams(top_p=3.0))
    gen = eng.generate([1, 2, 3], 4, GREEDY)
    gen.close()
    with pytest.raises(CooktopError, match="closed before it finished"):
        gen.drain()


def _run_interleaved(gens):
    """Advance ``gens`` one step each in turn until all are exhausted; the steps of each."""
    steps = [[] for _ in gens]
    live = set(range(len(gens)))
    while live:
        for i in sorted(live):
            try:
                steps[i].append(next(gens[i]))
            except StopIteration:
                live.discard(i)
    return steps


def test_two_sequences_interleave(any_device, stories):
    """Two generations on two sequences of one model, advanced alternately, give the same
    tokens and text as each run alone (greedy), on every device family."""
    e = cooktop.load(stories, n_ctx=128, n_batch=4, device=any_device.info.selector, n_gpu_layers=-1)
    try:
        prompts = [_prompt(e, "Once upon a time"), _prompt(e, "The little dog ran to the park and")]
        alone = [e.generate(p, 20, GREEDY).drain() for p in prompts]
        assert alone[0].tokens != alone[1].tokens
        other = e.new_sequence()
        gens = [e.generate(prompts[0], 20, GREEDY), e.generate(prompts[1], 20, GREEDY, seq=other)]
        steps = _run_interleaved(gens)
        for g, st, want in zip(gens, steps, alone):
            assert g.result.tokens == want.tokens
            assert g.result.text == "".join(s.text for s in st) == want.text
        assert e.seq.tokens == prompts[0] + alone[0].tokens[:-1]
        assert other.tokens == prompts[1] + alone[1].tokens[:-1]
        other.close()
    finally:
        e.close()


def test_prefix_reuse_is_per_sequence(eng):
    """A sequence reuses its own cached prefix; a fresh one evaluates the whole prompt."""
    p = _prompt(eng, "One day, a girl")
    first = eng.generate(p, 4, GREEDY).drain()
    again = eng.generate(p, 4, GREEDY).drain()
    assert again.timings.prompt_n == 1  # only the last prompt token is re-evaluated
    fresh = eng.new_sequence()
    other = eng.generate(p, 4, GREEDY, seq=fresh).drain()
    assert other.timings.prompt_n == len(p)
    assert first.tokens == again.tokens == other.tokens
    fresh.close()


def test_same_sequence_interleaved_is_refused(eng):
    """Two suspended generations on one sequence: the older one refuses to continue."""
    a = eng.generate(_prompt(eng, "Once upon a time"), 8, GREEDY)
    next(a)
    b = eng.generate(_prompt(eng, "One day"), 4, GREEDY).drain()
    assert b.tokens
    with pytest.raises(CooktopError, match="interrupted: its sequence was changed"):
        list(a)


def test_closed_engine_and_sequence(stories):
    """After close, evaluation, new sequences and suspended generations raise a clear error."""
    e = cooktop.load(stories, n_ctx=64, device="cpu")
    seq = e.new_sequence()
    gen = e.generate([1, 2, 3], 8, GREEDY, seq=seq)
    next(gen)
    e.close()
    e.close()  # idempotent
    with pytest.raises(CooktopError, match="model is closed"):
        e.new_sequence()
    with pytest.raises(CooktopError, match="model is closed"):
        list(gen)
    with pytest.raises(CooktopError, match="model is closed"):
        seq.eval([1])
    with pytest.raises(CooktopError, match="model is closed"):
        e.eval([1])


def test_cache_of_another_model_is_refused(eng, stories):
    e2 = cooktop.load(stories, n_ctx=96, device="cpu")
    try:
        with pytest.raises(CooktopError, match="made by another model"):
            eng.model.forward([1], 0, e2.seq.cache)
    finally:
        e2.close()


def test_two_threads_two_sequences(eng):
    """Generations on two sequences in two threads take turns over the shared scratch
    buffers (one forward at a time) and give the same tokens as run alone."""
    import sys
    import threading

    prompts = [_prompt(eng, "Once upon a time"), _prompt(eng, "The little dog ran to the park and")]
    alone = [eng.generate(p, 16, GREEDY).drain().tokens for p in prompts]
    seqs = [eng.new_sequence(), eng.new_sequence()]
    got: list = [[], []]

    def work(i):
        for _ in range(3):
            got[i].append(eng.generate(prompts[i], 16, GREEDY, seq=seqs[i]).drain().tokens)
            seqs[i].reset()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside forward passes
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert got == [[alone[0]] * 3, [alone[1]] * 3]
    for s in seqs:
        s.close()
