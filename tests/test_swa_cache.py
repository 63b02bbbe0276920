"""The sliding-window layers' own cache (``model/swa.py``, llama.cpp's iSWA cache) on every backend.

A tiny gemma3 (window 8 on 2 of 3 layers) run with ``n_batch`` 5 and the cells' padding lowered
to 1, so those layers keep 13 cells per sequence and a 60-token prompt compacts them many times:
its logits equal llama-cpp-python's and the ``--swa-full`` path's, in chunks, token by token and
after a cached prefix; two sequences with different offsets share a batch; going back inside
the kept window works, further back is refused (``truncate``) or evaluated again (``rollback``,
``prefill``); the allocated and budgeted bytes are the window's.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import open_family_device, skip_or_fail

from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.engine import generate
from cooktop.errors import SlidingWindowError
from cooktop.format.kvtypes import KVConfig
from cooktop.model import swa
from cooktop.tools import synth

GEMMA3 = synth.Shape(n_embd=64, n_layer=3, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=256,
                     rope_freq_base=1e6, tied=True, head_dim=48, arch="gemma3", n_swa=8, swa_pattern=3,
                     rope_freq_base_swa=10000.0)
#: test_arch_gemma4's shape: window 8 on 2 of 3 blocks, the last 3 blocks reading earlier ones' K/V
GEMMA4 = synth.Shape(n_embd=64, n_layer=9, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=256,
                     rope_freq_base=1e6, tied=True, head_dim=64, arch="gemma4", n_swa=8, swa_pattern=3,
                     rope_freq_base_swa=10000.0, head_dim_swa=32, n_kv_shared=3, n_embd_per_layer=32,
                     double_wide=True, n_head_kv_full=1, k_eq_v=True, rope_partial_full=0.25, out_scales=True,
                     final_logit_softcap=0.5)
PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 300, 60)]
N_CTX, N_BATCH = 128, 5
#: window cells per sequence with PAD 1: n_swa + n_batch
CELLS = 8 + N_BATCH
F32 = 1e-5


@pytest.fixture(scope="module")
def small_pad():
    """``swa.PAD`` 1 for this module (llama.cpp's 256 would keep all of a tiny context)."""
    old, swa.PAD = swa.PAD, 1
    yield
    swa.PAD = old


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = tmp_path_factory.mktemp("swa") / "gemma3.gguf"
    synth.write(p, GEMMA3, "F32", seed=5)
    return p


@pytest.fixture(scope="module")
def reference(model):
    """llama.cpp's logits of every position of PROMPT (its own iSWA cache)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    llm = llama_cpp.Llama(model_path=str(model), logits_all=True, n_ctx=N_CTX, n_batch=16, n_ubatch=16,
                          verbose=False)
    llm.eval(PROMPT)
    out = np.array(llm.scores[:len(PROMPT)], dtype=np.float64)
    llm.close()
    return out


@pytest.fixture(scope="module", params=list(registry.FAMILIES))
def family(request):
    if request.param != "cpu":
        open_family_device(request.param)
    return request.param


@pytest.fixture(scope="module")
def engines(family, model, small_pad):
    """(split engine, --swa-full engine) on one backend."""
    pair = [generate.load(model, n_ctx=N_CTX, n_batch=N_BATCH, device=family, n_gpu_layers=-1,
                          kv=KVConfig(swa_full=full)) for full in (False, True)]
    yield pair
    for e in pair:
        e.close()


def _chunks(eng, seq, tokens, start=0, step=N_BATCH):
    """Every row's logits of ``tokens`` evaluated from position ``start`` in chunks of ``step``."""
    out = [eng.model.forward(np.array(tokens[i:i + step]), start + i, seq.cache, logits_all=True,
                             seq_id=seq.seq_id) for i in range(0, len(tokens), step)]
    return np.concatenate(out).astype(np.float64)


def test_logits_match_llama_cpp_and_swa_full(engines, reference):
    split, full = engines
    s, f = split.seq, full.seq
    assert s.cache.n_swa_cells == CELLS and f.cache.n_swa_cells == 0
    s.reset()
    f.reset()
    got = _chunks(split, s, PROMPT)
    assert s.cache.swa_offsets[s.seq_id] >= 40  # compacted many times
    assert nmse(got, reference) <= F32
    assert nmse(got, _chunks(full, f, PROMPT)) <= F32
    s.reset()
    one = _chunks(split, s, PROMPT, step=1)  # token by token
    assert nmse(one, reference) <= F32


def test_cached_prefix_and_going_back(engines, reference):
    split, _ = engines
    seq = split.seq
    seq.reset()
    seq.eval(PROMPT[:40])
    logits, n = seq.prefill(PROMPT)  # the 40 cached tokens are kept
    assert n == 20 and nmse(logits[None], reference[-1:]) <= F32
    o = seq.cache.swa_offsets[seq.seq_id]
    keep = o + 7  # the first position whose window (7 before it) is still held
    assert seq.cache.reusable_prefix(keep, seq.seq_id) == keep
    seq.truncate(keep)
    last = _chunks(split, seq, PROMPT[keep:], start=keep)
    assert nmse(last, reference[keep:]) <= F32
    back = seq.cache.swa_offsets[seq.seq_id] + 6  # its window is gone
    assert seq.cache.reusable_prefix(back, seq.seq_id) == 0
    with pytest.raises(SlidingWindowError, match="sliding-window layers keep positions from"):
        seq.truncate(back)
    assert seq.n_past == 60  # nothing changed
    seq.rollback(back)  # evaluated again from 0
    assert seq.n_past == back and seq.cache.swa_offsets[seq.seq_id] <= back
    logits, n = seq.prefill(PROMPT)
    assert nmse(logits[None], reference[-1:]) <= F32
    logits, n = seq.prefill(PROMPT[:10] + PROMPT[:30])  # a short shared prefix: evaluated in full
    assert n == 40


def test_two_sequences_with_different_offsets_in_one_batch(engines, reference):
    split, _ = engines
    m = split.model
    cache = m.new_cache(2)
    _chunks(split, type("S", (), {"cache": cache, "seq_id": 0})(), PROMPT[:40])
    _chunks(split, type("S", (), {"cache": cache, "seq_id": 1})(), PROMPT[:17])
    assert cache.swa_offsets[0] != cache.swa_offsets[1]
    a, b = m.forward_batch(cache, [(0, 40, PROMPT[40:43], 3), (1, 17, PROMPT[17:19], 2)])
    assert nmse(np.asarray(a, np.float64), reference[40:43]) <= F32
    assert nmse(np.asarray(b, np.float64), reference[17:19]) <= F32
    # a copied prefix carries the source's offset; one whose window is gone is not copied
    assert m.copy_prefix(cache, 0, 1, 43) and cache.swa_offsets[1] == cache.swa_offsets[0]
    got = m.forward(np.array(PROMPT[43:45]), 43, cache, logits_all=True, seq_id=1)
    assert nmse(np.asarray(got, np.float64), reference[43:45]) <= F32
    assert not m.copy_prefix(cache, 0, 1, cache.swa_offsets[0] + 3) and cache.seq_tokens[1] == []
    cache.close()


def test_allocated_and_budgeted_bytes(engines, model):
    split, full = engines
    row = 2 * 48 * 2  # n_head_kv * head_dim f16 values
    for eng, swa_cells in ((split, CELLS), (full, N_CTX)):
        for n_seq in (1, 2):
            cache = eng.seq.cache if n_seq == 1 else eng.model.new_cache(2)
            ks = [t for seg in cache.k for t in seg] + [t for seg in cache.v for t in seg]
            assert [t.shape[0] for t in cache.k[0]] == [n_seq * swa_cells, n_seq * swa_cells, n_seq * N_CTX]
            assert sum(t.nbytes for t in ks) == n_seq * 2 * (2 * swa_cells + N_CTX) * row
        assert sum(x.kv_bytes for x in eng.placement.budgets) == 2 * (2 * swa_cells + N_CTX) * row


def test_window_cells_as_llama_cpp(monkeypatch):
    """``size_swa = GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)`` of llama-kv-cache-iswa.cpp (one sequence),
    0 where the SWA layers keep the whole context."""
    monkeypatch.setattr(swa, "PAD", 256)  # llama.cpp's (the module's other tests lower it)
    g3 = dataclasses.replace(synth.config(GEMMA3), n_layer=6, n_swa=1024, swa_layers=(True,) * 5 + (False,))
    assert swa.swa_cells(g3, 32768, 512) == 1536 and swa.swa_cells(g3, 32768, 100) == 1280
    assert swa.swa_cells(g3, 1536, 512) == 0 and swa.swa_cells(g3, 32768, 512, swa_full=True) == 0
    assert [swa.kv_cells(g3, i, 32768, 1536) for i in range(6)] == [1536] * 5 + [32768]
    assert swa.swa_cells(synth.config(synth.SHAPES["llama-3.2-1b"]), 32768, 512) == 0


def test_compaction_moves_are_disjoint_chunks():
    # 13 cells from 0 hold positions 0..12; 5 more rows at 13: the 7 rows before 13 go to the front
    assert swa.compaction(8, 13, 0, 13, 5) == (6, [(6, 0, 6), (12, 6, 1)])
    assert swa.compaction(8, 13, 0, 8, 5) == (0, [])
    new, moves = swa.compaction(1024, 1536, 0, 1025, 512)
    assert new == 2 and all(abs(s - d) >= n for s, d, n in moves) and sum(n for _, _, n in moves) == 1023
    with pytest.raises(ValueError, match="do not fit"):
        swa.compaction(8, 10, 0, 9, 5)


def test_gemma4_shared_kv_layers(family, tmp_path, small_pad):
    """gemma4: the shared-KV blocks read their source's window cells (one copy of them is moved at a
    compaction); logits equal llama.cpp's and the --swa-full path's past several compactions."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    p = tmp_path / "gemma4.gguf"
    synth.write(p, GEMMA4, "F32", seed=5)
    prompt = PROMPT[:40]
    llm = llama_cpp.Llama(model_path=str(p), logits_all=True, n_ctx=N_CTX, n_batch=16, n_ubatch=16, verbose=False)
    llm.eval(prompt)
    want = np.array(llm.scores[:len(prompt)], dtype=np.float64)
    llm.close()
    got = {}
    for full in (False, True):
        eng = generate.load(p, n_ctx=N_CTX, n_batch=N_BATCH, device=family, n_gpu_layers=-1,
                            kv=KVConfig(swa_full=full))
        try:
            cache = eng.seq.cache
            assert cache.n_swa_cells == (0 if full else CELLS)
            got[full] = _chunks(eng, eng.seq, prompt)
            if not full:
                assert cache.swa_offsets[0] >= 20
                shared = [t for t in cache.k[0][GEMMA4.n_layer - GEMMA4.n_kv_shared:]]
                assert all(any(t is own for own in cache.k[0][:GEMMA4.n_layer - GEMMA4.n_kv_shared]) for t in shared)
                assert sum(x.kv_bytes for x in eng.placement.budgets) == sum(
                    t.nbytes for seg in cache.k + cache.v for t in {id(x): x for x in seg}.values())
        finally:
            eng.close()
    assert nmse(got[False], want) <= F32 and nmse(got[False], got[True]) <= F32


def test_swa_full_on_the_command_line_and_the_api(model, small_pad):
    """``--swa-full`` (info, plan, run, serve: ``kv_options``) and ``Llama(swa_full=...)``, whose default is
    llama-cpp-python's (None: llama.cpp's library default, the full cache)."""
    from click.testing import CliRunner

    from cooktop import Llama
    from cooktop.cli.group import cli
    from cooktop.cli.info import model_info

    row = 2 * 48 * 2
    # info counts -b's default 512: window cells 8 + 512 (PAD 1 here) on 2 of the 3 blocks at -c 1024
    for flags, want in (([], (2 * 520 + 1024) * 2 * row), (["--swa-full"], 3 * 1024 * 2 * row)):
        r = CliRunner().invoke(cli, ["info", str(model), "-c", "1024", "--json", *flags])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["kv_cache"]["bytes"] == want
    assert model_info(str(model), 256)["kv_cache"]["bytes"] == 3 * 256 * 2 * row  # 520 >= 256: no split
    for kw, split in (({}, 0), ({"swa_full": False}, CELLS), ({"swa_full": True}, 0)):
        llm = Llama(model_path=str(model), n_ctx=N_CTX, n_batch=N_BATCH, verbose=False, **kw)
        try:
            assert llm._engine.seq.cache.n_swa_cells == split
        finally:
            llm.close()
