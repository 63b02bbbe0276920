"""The OpenCL backend's replay of graph scopes as cl_khr_command_buffer recordings (opencl/replay.py):
a decode step recorded once and replayed, bit for bit the op-by-op logits; the checked replay, the
fallbacks (no extension, COOKTOP_OPENCL_REPLAY=0, a scope that copies buffers) and the drops."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import skip_or_fail

from cooktop.backends import registry
from cooktop.backends.opencl import cmdbuf
from cooktop.errors import DeviceError
from cooktop.runtime.loader import load_model

PROMPT = [1, 403, 407, 262, 31, 90, 7]


def _open(monkeypatch=None, probe=None):
    """A freshly opened OpenCL device (the registry reset), optionally with ``cmdbuf.probe`` replaced."""
    if probe is not None:
        monkeypatch.setattr(cmdbuf, "probe", probe)
    registry.reset()
    res = registry.probe("opencl")
    if not res.available:
        skip_or_fail("opencl", f"{res.reason}; to enable: {res.hint}")
    return registry.open_device(res.devices[0].selector)


@pytest.fixture
def cl_dev():
    d = _open()
    if d.replay is None:
        skip_or_fail("opencl", f"the OpenCL device does not replay: {d.replay_reason}")
    yield d
    registry.reset()


def greedy(model, n_gen=8):
    """Prompt, then ``n_gen`` greedy decode steps: (tokens, every step's logits)."""
    cache = model.new_cache()
    logits = model.forward(np.array(PROMPT), 0, cache)
    out, toks = [logits], []
    for i in range(n_gen):
        toks.append(int(np.argmax(logits[-1])))
        logits = model.forward(np.array(toks[-1:]), len(PROMPT) + i, cache)
        out.append(logits)
    cache.close()
    return toks, out


def _same_bits(a, b):
    return all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b, strict=True))


def test_decode_replays_bit_for_bit(stories, cl_dev, monkeypatch):
    """The decode step is recorded the second time its key comes and replayed from the third on
    (issue False: none of the ops' Python runs); logits equal in every bit to op by op, and to a
    checked replay (the ops issued, compared with the recording, then the buffer enqueued)."""
    d = cl_dev
    model = load_model(stories, n_ctx=64, n_batch=16, device=d.info.selector).model
    try:
        monkeypatch.setattr(d, "graph_check", False)
        n0, r0, l0 = d.n_recordings, d.n_replays, d.n_launches
        toks, logits = greedy(model)
        assert d.n_recordings - n0 == 1 and d.n_replays - r0 == 6  # steps 3..8 (the prompt: seen once)
        assert not d._recordings  # the closed cache's buffers took its recording with them
        per_step = (d.n_launches - l0) / 3  # launches: the prompt, steps 1 and 2; nothing per replay
        monkeypatch.setattr(d, "graph_check", True)
        toks_checked, checked = greedy(model)
        assert d.n_recordings - n0 == 2 and d.n_replays - r0 == 12  # a new cache: new keys
        api, d.replay = d.replay, None
        l1 = d.n_launches
        toks_off, off = greedy(model)
        d.replay = api
        assert d.n_launches - l1 > 3 * per_step  # op by op: every step launches
        assert toks == toks_checked == toks_off
        assert _same_bits(logits, off) and _same_bits(checked, off)
    finally:
        model.close()


def test_fallback_without_the_extension(stories, monkeypatch):
    """A driver without cl_khr_command_buffer (the probe says so), or COOKTOP_OPENCL_REPLAY=0: every
    scope runs op by op and nothing is recorded."""
    d = _open(monkeypatch, lambda platform, device: (None, "the driver has no cl_khr_command_buffer"))
    try:
        assert d.replay is None and "cl_khr_command_buffer" in d.replay_reason
        model = load_model(stories, n_ctx=64, n_batch=16, device=d.info.selector).model
        l0 = d.n_launches
        toks, _ = greedy(model, n_gen=3)
        assert d.n_recordings == 0 and d.n_replays == 0 and d.n_launches - l0 > 4 * 20
        model.close()
        monkeypatch.undo()
        monkeypatch.setenv("COOKTOP_OPENCL_REPLAY", "0")
        d = _open()
        assert d.replay is None and d.replay_reason == "COOKTOP_OPENCL_REPLAY=0"
    finally:
        registry.reset()


def test_checked_replay_raises_on_a_different_launch(cl_dev, monkeypatch):
    """graph_check: a replay whose launches differ from the recording raises, runs nothing, drops the
    recording; the key records again afterwards."""
    d = cl_dev
    monkeypatch.setattr(d, "graph_check", True)
    a, b, c = (d.empty((1, 64)) for _ in range(3))
    d.write(a, np.ones((1, 64)))
    d.write(b, np.full((1, 64), 5.0))
    for _ in range(3):  # seen, recorded, replayed (checked)
        with d.graph("bad key") as issue:
            assert issue
            d.add(c, a, a)
    assert "bad key" in d._recordings and d.n_replays == 1
    np.testing.assert_array_equal(d.read(c), 2.0)
    with pytest.raises(DeviceError, match=r"graph 'bad key'.*differ from its recording at launch 0 of 1 "
                                          r"\(recorded add over \(64,\), issued add over \(64,\)\).*key misses"):
        with d.graph("bad key"):
            d.add(c, a, b)  # another buffer under the same key
    np.testing.assert_array_equal(d.read(c), 2.0)  # nothing of it ran
    assert "bad key" not in d._recordings
    with pytest.raises(DeviceError, match=r"at launch 1 of 1 \(recorded nothing, issued add"):
        with d.graph("bad key"):  # recorded again: the first use after a drop records
            d.add(c, a, b)
        with d.graph("bad key"):
            d.add(c, a, b)
            d.add(c, c, b)
    np.testing.assert_array_equal(d.read(c), 6.0)


def test_plain_keys_drops_and_aborts(cl_dev, monkeypatch):
    """A scope that enqueues a buffer copy is never recorded (its key runs plain); a released tensor
    drops the recordings binding it; an exception while recording keeps nothing."""
    d = cl_dev
    monkeypatch.setattr(d, "graph_check", False)
    buf = d.buffer("replay test")
    a, c = buf.empty((1, 64)), d.empty((1, 64))
    d.write(a, np.ones((1, 64)))
    for _ in range(3):
        with d.graph("copies") as issue:
            assert issue
            d.add(c, a, a)
            d._not_recordable("buffer copy")  # what _copy / _copy_rect say before enqueue_copy
    assert "copies" in d._plain and "copies" not in d._recordings
    for step in range(3):
        with d.graph("stale") as issue:
            assert issue == (step < 2)
            if issue:
                d.add(c, a, a)
    np.testing.assert_array_equal(d.read(c), 2.0)
    assert "stale" in d._recordings
    buf.release()
    assert "stale" not in d._recordings
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            with d.graph("raises"):
                d.add(c, c, c)
                1 / 0  # noqa: B018
    assert "raises" not in d._recordings and d._launch == d._launch_plain


def test_split_model_replays_its_device_part(stories, cl_dev, monkeypatch):
    """A model split between the OpenCL device and numpy (-ngl 2): the OpenCL segment's step is
    recorded and replayed (numpy's runs op by op), logits bit for bit those of replay off."""
    d = cl_dev
    monkeypatch.setattr(d, "graph_check", False)
    model = load_model(stories, n_ctx=64, n_batch=16, device=d.info.selector, n_gpu_layers=2).model
    try:
        assert len(model.segments) == 2 and model.segments[0].device is not d
        r0 = d.n_replays
        toks, logits = greedy(model, n_gen=5)
        assert d.n_replays - r0 == 3
        api, d.replay = d.replay, None
        toks_off, off = greedy(model, n_gen=5)
        d.replay = api
        assert toks == toks_off and _same_bits(logits, off)
    finally:
        model.close()


def _replays_as_op_by_op(d, model, monkeypatch) -> None:
    """8 greedy steps of ``model`` replayed (steps 3..8) give op by op's tokens and logit bits; closes it."""
    try:
        monkeypatch.setattr(d, "graph_check", False)
        r0 = d.n_replays
        toks, logits = greedy(model)
        assert d.n_replays - r0 == 6
        api, d.replay = d.replay, None
        toks_off, off = greedy(model)
        d.replay = api
        assert toks == toks_off and _same_bits(logits, off)
    finally:
        model.close()


def test_k_quant_decode_on_block_q8_K_replays_bit_for_bit(cl_dev, monkeypatch):
    """A K-quant model (its matmuls on block_q8_K activations, the producers switching format
    with the matmul they feed) replays its decode step bit for bit the op-by-op logits."""
    from conftest import SHARED
    from gguf import GGMLQuantizationType as T

    d = cl_dev
    path = SHARED / "models" / "tiny" / "tiny-Q4_K_M.gguf"
    if not path.exists():
        skip_or_fail("shared", f"{path} is missing")
    assert d.activation_format(T.Q4_K, 1) == "q8_K"
    model = load_model(str(path), n_ctx=64, n_batch=16, device=d.info.selector).model
    _replays_as_op_by_op(d, model, monkeypatch)


def test_decode_without_flash_attention_replays_bit_for_bit(stories, cl_dev, monkeypatch):
    """``-fa off`` (scores through the scratch: attention.py's three launches per chunk) records and
    replays like the flash path: its launches go through the device, the scratch is one buffer."""
    from cooktop.format.kvtypes import KVConfig

    d = cl_dev
    model = load_model(stories, n_ctx=64, n_batch=16, device=d.info.selector,
                       kv=KVConfig.parse(None, None, "off")).model
    assert model.flash_attn is False
    _replays_as_op_by_op(d, model, monkeypatch)


def test_batch_driver_prepares_its_decode_steps(stories, cl_dev, monkeypatch):
    """``BatchDriver.prepare_steps`` runs the steps of 3, 2 and 1 sequences twice each (the device
    records a shape the second time): the first real steps of 1..3 sequences are replayed, nothing
    more is recorded, the sequences come back empty and the logits are those of the steps run op by
    op; on the numpy device (nothing replays) it runs nothing."""
    import cooktop
    from cooktop.engine.batch import BatchDriver
    d = cl_dev
    monkeypatch.setattr(d, "graph_check", False)
    e = cooktop.load(stories, n_ctx=64, n_batch=32, device=d.info.selector, n_gpu_layers=-1)
    try:
        assert d.graph_uses_before_replay == 2 and e.model.graph_uses_before_replay == 2
        seqs = e.new_sequences(3)
        drv = BatchDriver(e.model, seqs)
        try:
            n0, r0 = d.n_recordings, d.n_replays
            assert drv.prepare_steps() == 6
            assert d.n_recordings - n0 == 3 and d.n_replays == r0 and all(s.tokens == [] for s in seqs)
            m = e.model
            m.forward_batch(seqs[0].cache, [(s.seq_id, 0, PROMPT, True) for s in seqs])  # a prompt shape
            n1, r1 = d.n_recordings, d.n_replays
            got = [m.forward_batch(seqs[0].cache, [(s.seq_id, len(PROMPT), [42], True) for s in seqs[:k]])
                   for k in (3, 2, 1)]
            assert d.n_recordings == n1 and d.n_replays - r1 == 3
        finally:
            drv.close()
        ref = []
        api, d.replay = d.replay, None  # op by op
        try:
            for k in (3, 2, 1):
                for s in seqs[:k]:
                    s.truncate(0)
                m.forward_batch(seqs[0].cache, [(s.seq_id, 0, PROMPT, True) for s in seqs[:k]])
                ref.append(m.forward_batch(seqs[0].cache, [(s.seq_id, len(PROMPT), [42], True) for s in seqs[:k]]))
        finally:
            d.replay = api
        for a, b in zip(got, ref, strict=True):
            assert _same_bits(a, b)
    finally:
        e.close()
    cpu = cooktop.load(stories, n_ctx=32, device="cpu")
    drv = BatchDriver(cpu.model, cpu.new_sequences(2))
    assert cpu.model.graph_uses_before_replay == 0 and drv.prepare_steps() == 0
    drv.close()
    cpu.close()
