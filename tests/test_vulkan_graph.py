"""Device.graph: the contract (every backend) and Vulkan's recording and replay of the forward pass's
fixed op list (one kp.Sequence per key), checked against runs with graphs off."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import skip_or_fail
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.errors import DeviceError
from cooktop.runtime.loader import load_model

PROMPT = [1, 403, 407, 262, 31, 90, 7]


@pytest.fixture(scope="module")
def vk():
    res = registry.probe("vulkan")
    if not res.available:
        skip_or_fail("vulkan", f"{res.reason}; to enable: {res.hint}")
    return registry.open_device(res.devices[0].selector)


@pytest.fixture
def stories_vk(stories, vk):
    """stories260K wholly on the Vulkan device (closed afterwards)."""
    lm = load_model(stories, n_ctx=64, n_batch=16, device=vk.info.selector)
    yield lm.model
    lm.model.close()


def greedy(model, cache, prompt=PROMPT, n_gen=8):
    """Prompt, then ``n_gen`` greedy decode steps: (tokens, every step's logits)."""
    logits = model.forward(np.array(prompt), 0, cache)
    out, toks = [logits], []
    for i in range(n_gen):
        toks.append(int(np.argmax(logits[-1])))
        logits = model.forward(np.array(toks[-1:]), len(prompt) + i, cache)
        out.append(logits)
    return toks, out


# -- the contract, every backend ---------------------------------------------------------

def test_graph_scope_contract(any_device):
    d = any_device
    a, b, c = (d.empty((2, 8)) for _ in range(3))
    d.write(a, np.ones((2, 8)))
    d.write(b, np.full((2, 8), 2.0))
    with d.graph(("contract", a.serial)) as issue:
        if issue:
            d.add(c, a, b)
        with pytest.raises(DeviceError, match="inside a graph scope"):
            d.write(a, np.ones((2, 8)))
        with pytest.raises(DeviceError, match="inside a graph scope"):
            d.read(c)
        with pytest.raises(DeviceError, match="do not nest"):
            with d.graph("inner"):
                pass
    np.testing.assert_array_equal(d.read(c), 3.0)
    d.write(a, np.full((2, 8), 5.0))  # only contents change between uses of a key
    with d.graph(("contract", a.serial)) as issue:
        if issue:
            d.add(c, a, b)
    np.testing.assert_array_equal(d.read(c), 7.0)


def test_serials_are_unique_and_shared_by_views(cpu_device):
    a, b = cpu_device.empty((4, 2)), cpu_device.empty((4, 2))
    assert a.serial != b.serial and a.head(2).serial == a.serial


# -- Vulkan: recording and replay ---------------------------------------------------------

def test_graph_replays_without_issuing(vk, monkeypatch):
    """Recorded once, then replayed with ``issue`` False (no check): the results follow the inputs."""
    monkeypatch.setattr(vk, "graph_check", False)
    a, b, c = (vk.empty((1, 64)) for _ in range(3))
    key = ("replay", a.serial, b.serial, c.serial)
    g0, r0 = vk.n_graphs, vk.n_graph_replays
    for step in range(4):
        vk.write(a, np.full((1, 64), float(step)))
        vk.write(b, np.ones((1, 64)))
        with vk.graph(key) as issue:
            assert issue == (step == 0)
            if issue:
                vk.add(c, a, b)
                vk.add(c, c, c)
        np.testing.assert_array_equal(vk.read(c), 2.0 * (step + 1))
    assert vk.n_graphs - g0 == 1 and vk.n_graph_replays - r0 == 3


def test_graph_check_raises_on_a_different_op_list(vk, monkeypatch):
    """graph_check: a replay issues its ops; one that differs from the recording raises, runs
    nothing, and the graph is recorded again on the next use."""
    monkeypatch.setattr(vk, "graph_check", True)
    a, b, c = (vk.empty((1, 64)) for _ in range(3))
    vk.write(a, np.ones((1, 64)))
    vk.write(c, np.zeros((1, 64)))
    with vk.graph("bad key") as issue:
        assert issue
        vk.add(c, a, a)
    vk.read(c)
    with vk.graph("bad key") as issue:
        assert issue  # checked replay
        vk.add(c, a, a)
    np.testing.assert_array_equal(vk.read(c), 2.0)
    vk.write(b, np.full((1, 64), 5.0))
    with pytest.raises(DeviceError, match=r"graph 'bad key'.*differ from its recording at op 0 of 1 \(recorded add "
                                          r"push \[64\], issued add push \[64\]\).*key misses something"):
        with vk.graph("bad key"):
            vk.add(c, a, b)  # another buffer under the same key
    np.testing.assert_array_equal(vk.read(c), 2.0)  # nothing of the bad scope ran
    g0 = vk.n_graphs
    with vk.graph("bad key") as issue:
        assert issue
        vk.add(c, a, b)
    np.testing.assert_array_equal(vk.read(c), 6.0)
    assert vk.n_graphs - g0 == 1
    with pytest.raises(DeviceError, match=r"at op 1 of 1 \(recorded nothing, issued add"):
        with vk.graph("bad key"):
            vk.add(c, a, b)
            vk.add(c, c, b)


def test_graph_cache_is_bounded(vk, monkeypatch):
    """Past MAX_GRAPHS the least recently used graph is forgotten with its sequences."""
    from cooktop.backends.vulkan import graph as vulkan_graph
    monkeypatch.setattr(vulkan_graph, "MAX_GRAPHS", 2)
    monkeypatch.setattr(vk, "graph_check", False)
    a, c = vk.empty((1, 64)), vk.empty((1, 64))
    vk.write(a, np.ones((1, 64)))
    for i in range(3):
        with vk.graph(("lru", i)):
            for _ in range(i + 1):
                vk.add(c, a, a)
        vk.read(c)
        if i == 0:
            first = vk._graphs[("lru", 0)]
            assert any(e[1] is first for sig in vk._seqs for e in sig if e[0] == "graph")
    assert ("lru", 0) not in vk._graphs and len(vk._graphs) <= 2
    assert not any(e[1] is first for sig in vk._seqs for e in sig if e[0] == "graph")
    with vk.graph(("lru", 0)) as issue:
        assert issue
        vk.add(c, a, a)
    np.testing.assert_array_equal(vk.read(c), 2.0)


def test_graph_dropped_with_its_buffers_and_on_errors(vk, monkeypatch):
    """A released tensor drops the graphs binding it (its key records again); an exception in a
    scope discards its ops; synchronize inside a scope raises."""
    monkeypatch.setattr(vk, "graph_check", False)
    buf = vk.buffer("graph test")
    a, c = buf.empty((1, 64)), vk.empty((1, 64))
    vk.write(a, np.ones((1, 64)))
    with vk.graph("stale"):
        vk.add(c, a, a)
    vk.read(c)
    assert "stale" in vk._graphs
    buf.release()
    assert "stale" not in vk._graphs
    with vk.graph("stale") as issue:
        assert issue  # recorded again, never replayed onto the freed buffer
    assert not vk._pending  # an empty graph enqueues nothing (no empty sequence is submitted)
    n = len(vk._pending)
    with pytest.raises(ZeroDivisionError):
        with vk.graph("raises"):
            vk.add(c, c, c)
            1 / 0  # noqa: B018
    assert len(vk._pending) == n and "raises" not in vk._graphs
    with pytest.raises(DeviceError, match="inside a graph scope"):
        with vk.graph("sync"):
            vk.synchronize()
    vk.synchronize()


def test_decode_records_once_per_bucket_and_matches_graphs_off(stories_vk, vk, monkeypatch):
    """A greedy generation: the prompt (n = 7) and the decode step (n = 1) are recorded once each,
    later steps replay; tokens and logits are identical to the same run with graphs off."""
    model = stories_vk
    monkeypatch.setattr(vk, "graph_check", False)
    g0, r0, rec0 = vk.n_graphs, vk.n_graph_replays, vk.n_recordings
    cache = model.new_cache()
    toks, logits = greedy(model, cache, n_gen=8)
    assert vk.n_graphs - g0 == 2            # the prompt and the decode step
    assert vk.n_graph_replays - r0 == 7     # decode steps 2..8
    # sequences: the prompt's (with the cache's zero-fills), the first decode step's, then replays
    assert vk.n_recordings - rec0 == 2
    cache.close()

    monkeypatch.setattr(vk, "record_graphs", False)
    g1 = vk.n_graphs
    cache = model.new_cache()
    toks_off, logits_off = greedy(model, cache, n_gen=8)
    assert vk.n_graphs == g1
    cache.close()
    assert toks == toks_off
    for a, b in zip(logits, logits_off):
        np.testing.assert_array_equal(a, b)

    monkeypatch.setattr(vk, "record_graphs", True)  # checked replays run the same ops
    monkeypatch.setattr(vk, "graph_check", True)
    cache = model.new_cache()
    toks_chk, logits_chk = greedy(model, cache, n_gen=8)
    cache.close()
    assert toks_chk == toks
    np.testing.assert_array_equal(logits_chk[-1], logits[-1])


def test_two_caches_interleaved_get_their_own_graphs(stories_vk, vk):
    """Two sequences (two KVCaches) of one model decoded in turns: one graph per cache, and each
    sequence's logits equal those of running it alone."""
    model = stories_vk
    prompts = [PROMPT, [1, 20, 30, 40]]
    alone = []
    for p in prompts:
        cache = model.new_cache()
        alone.append(greedy(model, cache, p, n_gen=6))
        cache.close()
    caches = [model.new_cache(), model.new_cache()]
    g0, r0 = vk.n_graphs, vk.n_graph_replays
    logits = [model.forward(np.array(p), 0, c) for p, c in zip(prompts, caches)]
    got: list[list[int]] = [[], []]
    for i in range(6):
        for s in (0, 1):
            got[s].append(int(np.argmax(logits[s][-1])))
            logits[s] = model.forward(np.array(got[s][-1:]), len(prompts[s]) + i, caches[s])
            np.testing.assert_array_equal(logits[s], alone[s][1][i + 1])
    assert got == [alone[0][0], alone[1][0]]
    assert vk.n_graphs - g0 == 4  # two prompts (n 7 and 4), one decode step per cache
    assert vk.n_graph_replays - r0 == 10
    for c in caches:
        c.close()


def test_outputs_growth_and_new_cache_record_again(stories_vk, vk):
    """forward_batch asking more output rows than allocated regrows ids/xl/logits: the graphs that
    used the old buffers are dropped and the new shape is recorded once; a closed cache's graphs go too."""
    model = stories_vk
    seg = model.segments[-1]
    cache = model.new_cache(n_seq=4)
    model.forward_batch(cache, [(0, 0, [1], True)])  # one output row: the buffers of 1 row
    old = {seg.ids.handle, seg.xl.handle, seg.logits.handle}
    serial = seg.ids.serial
    assert any(not g.handles.isdisjoint(old) for g in vk._graphs.values())
    items = [(s, 0, [1, 10 + s], True) for s in range(4)]
    g0 = vk.n_graphs
    out = model.forward_batch(cache, items)
    assert seg.ids.shape[0] == 4 and seg.ids.serial != serial and vk.n_graphs - g0 == 1
    assert all(g.handles.isdisjoint(old) for g in vk._graphs.values())
    more = [(s, 2, [20 + s], True) for s in range(4)]
    model.forward_batch(cache, more)
    r0 = vk.n_graph_replays
    model.forward_batch(cache, [(s, 3, [30 + s], True) for s in range(4)])
    assert vk.n_graphs - g0 == 2 and vk.n_graph_replays - r0 == 1  # the 4-row decode shape: recorded, replayed
    ref = model.new_cache(n_seq=4)
    for a, b in zip(model.forward_batch(ref, items), out):
        np.testing.assert_array_equal(a, b)
    handles = {t.handle for ts in cache.k + cache.v for t in ts}
    assert any(not g.handles.isdisjoint(handles) for g in vk._graphs.values())
    cache.close()
    assert all(g.handles.isdisjoint(handles) for g in vk._graphs.values())
    ref.close()


def test_grow_outputs_changes_the_key(stories_vk, vk, monkeypatch):
    """The first batch with 2 output rows regrows the head's output buffers (capacity 1 after
    loading): its key names the new buffers and is recorded, never replayed onto the old ones."""
    model = stories_vk
    seg = model.segments[-1]
    monkeypatch.setattr(vk, "graph_check", True)
    cache = model.new_cache(n_seq=2)
    serial = seg.ids.serial
    model.forward_batch(cache, [(0, 0, [1], True), (1, 0, [2], True)])
    assert seg.ids.serial != serial and seg.ids.ggml_type == T.I32
    cache.close()


def test_split_model_graphs_per_segment(stories, vk, monkeypatch):
    """Blocks on the host and the last block with the head on Vulkan (-ngl 2): each segment runs
    its own graph (the host's records nothing); the tokens match the model wholly on the host."""
    monkeypatch.setattr(vk, "graph_check", False)
    ref = load_model(stories, n_ctx=64, n_batch=16, device="cpu")
    split = load_model(stories, n_ctx=64, n_batch=16, device=vk.info.selector, n_gpu_layers=2)
    try:
        assert [(s.device.info.backend, s.head) for s in split.model.segments] == [("cpu", False), ("vulkan", True)]
        r0 = vk.n_graph_replays
        c_ref, c_split = ref.model.new_cache(), split.model.new_cache()
        toks, logits = greedy(split.model, c_split, n_gen=6)
        toks_ref, logits_ref = greedy(ref.model, c_ref, n_gen=6)
        assert vk.n_graph_replays - r0 == 5
        assert toks == toks_ref
        for a, b in zip(logits, logits_ref):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    finally:
        ref.model.close()
        split.model.close()
