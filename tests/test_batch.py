"""Parallel sequences in one forward pass: parity with each sequence run alone, on every
backend; the batch driver, ``Llama.create_completions``; the errors."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from batchutil import run_in_driver

import cooktop
from cooktop import Llama
from cooktop.engine.batch import BatchDriver
from cooktop.engine.sampling import SamplingParams
from cooktop.errors import CooktopError

ATOL = 2e-3  # logits of stories260K are O(10); batch vs alone differ only by summation order

PROMPTS = [[1, 5, 9, 33, 70], [1, 200, 3], [1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]


def _alone(e, prompt: list[int], decode: list[int]) -> list[np.ndarray]:
    """Logits after the prompt, then after each decoded token, on a sequence of its own."""
    s = e.new_sequence()
    out = [s.eval(prompt)[-1]]
    out += [s.eval([t])[-1] for t in decode]
    s.close()
    return out


def test_forward_batch_matches_each_sequence_alone(any_device, stories):
    """Three sequences of different prompt lengths share batches: prompts in one pass (the longest
    in two chunks beside the others' decoding), then decoding; sequence 1 finishes after one
    token and leaves. Every logits row equals that of the sequence run alone."""
    e = cooktop.load(stories, n_ctx=64, n_batch=12, device=any_device.info.selector, n_gpu_layers=-1)
    m = e.model
    decode = [[42, 17, 99, 3], [42], [61, 62, 63]]
    ref = [_alone(e, p, d) for p, d in zip(PROMPTS, decode)]
    seqs = e.new_sequences(3)
    cache = seqs[0].cache
    got: list[list[np.ndarray]] = [[], [], []]
    # step 1: prompts 0 and 1 whole, prompt 2's first 4 tokens (12 tokens in all)
    outs = m.forward_batch(cache, [(0, 0, PROMPTS[0], True), (1, 0, PROMPTS[1], True), (2, 0, PROMPTS[2][:4], False)])
    assert outs[2] is None
    got[0].append(outs[0][0])
    got[1].append(outs[1][0])
    # step 2: seq 0 and 1 decode one token each, seq 2 reads the rest of its prompt
    outs = m.forward_batch(cache, [(0, 5, [42], True), (1, 3, [42], True), (2, 4, PROMPTS[2][4:], True)])
    got[0].append(outs[0][0])
    got[1].append(outs[1][0])
    got[2].append(outs[2][0])
    # steps 3..: seq 1 has finished; 0 and 2 decode
    for j in range(3):
        items = [(0, 6 + j, [decode[0][1 + j]], True), (2, len(PROMPTS[2]) + j, [decode[2][j]], True)]
        outs = m.forward_batch(cache, items)
        got[0].append(outs[0][0])
        got[2].append(outs[1][0])
    assert [len(g) for g in got] == [5, 2, 4]
    for s in range(3):
        for a, b in zip(got[s], ref[s]):
            np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
    assert seqs[1].tokens == PROMPTS[1] + [42]
    assert seqs[2].tokens == PROMPTS[2] + decode[2]
    e.close()


def test_driver_generations_equal_alone(any_device, stories):
    """Greedy generations on three threads through one driver (prompts of different lengths,
    different n_predict: one leaves the batch early) equal each generation run alone."""
    e = cooktop.load(stories, n_ctx=96, n_batch=8, device=any_device.info.selector, n_gpu_layers=-1)
    greedy = SamplingParams(temperature=0.0)
    n_pred = [12, 3, 9]
    alone = [e.generate(p, n, greedy, seq=e.new_sequence()).drain().tokens for p, n in zip(PROMPTS, n_pred)]
    got, drv = run_in_driver(e, [lambda seq, i=i: e.generate(PROMPTS[i], n_pred[i], greedy, seq=seq).drain().tokens
                                 for i in range(3)])
    assert got == alone
    assert drv.stats.max_seqs == 3 and drv.stats.steps < sum(len(p) for p in PROMPTS) + sum(n_pred)
    e.close()


def test_create_completions_equal_create_completion(stories):
    llm = Llama(str(stories), n_ctx=128, n_batch=16, verbose=False)
    prompts = ["Once upon a time", "The cat", "A little girl named Lily went to the park and", "Tom"]
    alone = [llm.create_completion(p, max_tokens=16, temperature=0)["choices"][0]["text"] for p in prompts]
    outs = llm.create_completions(prompts, max_tokens=16, temperature=0)
    assert [o["choices"][0]["text"] for o in outs] == alone
    assert llm._batch[1].stats.max_seqs == 4
    two = llm.create_completions(prompts, n_parallel=2, max_tokens=16, temperature=0)
    assert [o["choices"][0]["text"] for o in two] == alone
    # the second call reused the kept sequences: the prompts' prefixes were cached
    assert sum(o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in two) > 0
    with pytest.raises(CooktopError, match="stream=False"):
        llm.create_completions(prompts, stream=True)
    with pytest.raises(CooktopError, match="n_parallel must be >= 1"):
        llm.create_completions(prompts, n_parallel=0)
    assert llm.create_completions([]) == []
    llm.close()


def test_batch_errors(stories):
    e = cooktop.load(stories, n_ctx=32, n_batch=8, device="cpu")
    m = e.model
    seqs = e.new_sequences(2)
    c = seqs[0].cache
    with pytest.raises(ValueError, match="a sequence appears twice"):
        m.forward_batch(c, [(0, 0, [1], True), (0, 0, [2], True)])
    with pytest.raises(ValueError, match="takes 1..8 tokens"):
        m.forward_batch(c, [(0, 0, [1] * 5, True), (1, 0, [1] * 4, True)])
    with pytest.raises(ValueError, match="seq_id 2 is outside the cache's 0..1 sequences"):
        m.forward_batch(c, [(2, 0, [1], True)])
    for p in range(0, 32, 8):
        m.forward_batch(c, [(1, p, [1] * 8, False)])
    with pytest.raises(ValueError, match="positions 32..32 exceed n_ctx 32"):
        m.forward_batch(c, [(1, 32, [1], True)])
    with pytest.raises(CooktopError, match="at least one sequence"):
        m.new_cache(0)
    with pytest.raises(CooktopError, match="one shared KV cache"):
        BatchDriver(m, [seqs[0], e.new_sequence()])
    drv = BatchDriver(m, seqs)
    drv.close()
    assert seqs[0].driver is None
    with pytest.raises(CooktopError, match="the batch driver is closed"):
        drv.eval(seqs[0], [1])
    e.close()


@pytest.mark.parametrize("model", ["tiny/tiny-Q4_0.gguf", "tiny/tiny-Q8_0.gguf"])
def test_batched_rows_are_bit_identical_to_alone_on_the_exact_paths(model):
    """On OpenCL's 8-bit paths a sequence's logits in a batch of 8 (prompts read together, then
    decode steps of 8 rows) are bit for bit those of it alone: the served-alone text of a request
    is its text in any batch, even with a random model's flat logits (where any rounding
    difference changes greedy tokens). (Vulkan's are too, by the same integer-dot mat-vec for
    every row count: tests/test_prompt_paths.py; its graphs for these shapes take minutes on
    lavapipe, so it is left out here.)"""
    family = "opencl"
    from conftest import SHARED, skip_or_fail

    from cooktop.backends import registry
    path = SHARED / "models" / model
    if not path.exists():
        skip_or_fail("shared", f"{path} missing")
    res = registry.probe(family)
    if not res.available or not res.devices:
        skip_or_fail(family, f"{res.reason}; to enable: {res.hint}")
    e = cooktop.load(str(path), n_ctx=64, n_batch=64, device=family, n_gpu_layers=-1)
    try:
        m = e.model
        prompts = [[1] + [3 + (17 * i + 5 * j) % 500 for j in range(3)] for i in range(8)]  # one shape: fast graphs
        alone = []
        for p in prompts:
            s = e.new_sequence()
            rows = [s.eval(p)[-1]]
            for _ in range(2):
                rows.append(s.eval([int(np.argmax(rows[-1]))])[-1])
            alone.append(rows)
            s.close()
        cache = e.new_sequences(8)[0].cache
        outs = m.forward_batch(cache, [(i, 0, p, True) for i, p in enumerate(prompts)])
        for k in range(3):
            for i in range(8):
                assert np.array_equal(outs[i][0], alone[i][k]), (family, model, i, k)
            if k < 2:
                outs = m.forward_batch(cache, [(i, len(p) + k, [int(np.argmax(alone[i][k]))], True)
                                               for i, p in enumerate(prompts)])
    finally:
        e.close()


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_copied_prefix_gives_the_source_prefix_logits(any_device, stories, kv_type):
    """``Sequence.copy_prefix``: a sequence given a copy of another's first ``k`` cells (llama.cpp's
    ``llama_memory_seq_cp``) then reading the rest of the prompt and decoding gets bit for bit the
    logits the source gets after its own prefix; the source keeps its context. Where the device cannot
    copy the rows (Vulkan: rows that are not whole 32-bit words) it says so and the sequence is left
    empty. A q8_0 cache (34-byte blocks)
    on the tiny Q4_0 model (head_dim 32; stories260K's 8 holds no block)."""
    from conftest import SHARED, skip_or_fail
    from gguf import GGMLQuantizationType as T

    from cooktop.format.kvtypes import KVConfig
    kt = T.F16 if kv_type == "f16" else T.Q8_0
    path = str(stories)
    if kt == T.Q8_0:
        path = str(SHARED / "models" / "tiny" / "tiny-Q4_0.gguf")
        if not pathlib.Path(path).exists():
            skip_or_fail("shared", f"{path} missing")
    e = cooktop.load(path, n_ctx=64, n_batch=12, device=any_device.info.selector, n_gpu_layers=-1,
                     kv=KVConfig(kt, kt, "on"))
    a, b, c = e.new_sequences(3)
    prompt, k = PROMPTS[2], 7
    a.eval(prompt[:k])
    ref = [a.eval(prompt[k:])[-1], a.eval([42])[-1]]
    c.eval([1, 99, 98])  # another sequence's cells next to b's
    v = b.version
    ok = b.copy_prefix(a, k)
    assert b.version != v and a.tokens == prompt + [42]
    from cooktop.format.quants import row_bytes
    words = all(row_bytes(t.ggml_type, t.shape[1]) % 4 == 0 for seg in b.cache.k for t in seg)
    if any_device.info.selector.startswith("vulkan") and not words:  # Vulkan copies rows of whole words
        assert not ok and b.tokens == []
        e.close()
        return
    assert ok and b.tokens == prompt[:k]
    got = [b.eval(prompt[k:])[-1], b.eval([42])[-1]]
    for x, y in zip(got, ref):
        np.testing.assert_array_equal(x, y)
    assert b.tokens == a.tokens
    assert b.copy_prefix(a, 0) and b.tokens == []
    e.close()


def test_copy_prefix_errors(stories):
    """Another cache, the sequence itself, more tokens than the source holds: refused, nothing copied."""
    e = cooktop.load(stories, n_ctx=32, device="cpu")
    a, b = e.new_sequences(2)
    a.eval([1, 5, 9])
    with pytest.raises(CooktopError, match="share one KV cache"):
        e.new_sequence().copy_prefix(a, 2)
    with pytest.raises(ValueError, match="one sequence"):
        a.copy_prefix(a, 1)
    with pytest.raises(ValueError, match="4 tokens asked of a sequence holding 3"):
        b.copy_prefix(a, 4)
    assert a.tokens == [1, 5, 9]
    e.close()
