"""Object lifetime: no reference cycles, ``del llm`` frees at once, closed means closed."""

from __future__ import annotations

import gc
import os
import weakref

import pytest

from cooktop import Llama
from cooktop.errors import CooktopError


@pytest.fixture()
def no_gc():
    """The cyclic garbage collector off: only reference counting frees objects."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _device_tensors(llm):
    """Every allocation (weights, scratch, KV cache) of ``llm``'s model and default sequence."""
    eng = llm._engine
    out = [t for seg in eng.model.segments for t in seg.buffer.tensors]
    out += [t for per_seg in eng.seq.cache.k + eng.seq.cache.v for t in per_seg]
    return out


def test_del_frees_device_buffers_at_once(any_device, stories, no_gc):
    """With the garbage collector off, ``del llm`` frees the engine, the model and every
    device tensor (so their storage) at once, after a completion and a stream."""
    llm = Llama(model_path=str(stories), n_ctx=64, verbose=False, device=any_device.info.selector,
                n_gpu_layers=-1)
    llm.create_completion("Once upon a time", max_tokens=4, temperature=0)
    for _ in llm.create_completion("Once upon a time", max_tokens=4, temperature=0, stream=True):
        pass
    eng = llm._engine
    objs = [eng, eng.model, eng.seq, eng.seq.cache] + _device_tensors(llm)
    assert len(objs) > 4 + 9 * 5  # weights of the 5 blocks are among them
    refs = [weakref.ref(o) for o in objs]
    del eng, objs
    del llm
    alive = [r() for r in refs if r() is not None]
    assert alive == []


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_load_del_cycles_do_not_grow_rss(shared, no_gc):
    """8 load/complete/del cycles of a 7 MiB model (F32, weights mapped from the file) grow
    RSS by well under one model (cycles held ~8 x 7 MiB before, with the collector off)."""
    path = str(shared / "models" / "tiny" / "tiny-F32.gguf")
    assert os.path.getsize(path) > 6 * 2**20

    def cycle():
        llm = Llama(model_path=path, n_ctx=256, verbose=False, device="cpu")
        llm.create_completion("Once", max_tokens=4, temperature=0)
        del llm

    cycle()  # warm: imports, caches, allocator arenas
    before = _rss_mib()
    for _ in range(8):
        cycle()
    assert _rss_mib() - before < 4.0


def test_closed_llama_raises_clear_error(stories):
    """Every method of a closed Llama raises CooktopError naming it closed (no numpy error)."""
    llm = Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu")
    llm.create_completion("Once", max_tokens=2, temperature=0)
    stream = llm.create_completion("Once", max_tokens=8, temperature=0, stream=True)
    next(stream)
    llm.close()
    llm.close()  # idempotent
    calls = {
        "create_completion": lambda: llm.create_completion("Once", max_tokens=2),
        "__call__": lambda: llm("Once", max_tokens=2),
        "eval": lambda: llm.eval([1, 2]),
        "reset": llm.reset,
        "tokenize": lambda: llm.tokenize(b"Once"),
        "detokenize": lambda: llm.detokenize([1]),
        "scores": lambda: llm.scores,
        "n_tokens": lambda: llm.n_tokens,
        "input_ids": lambda: llm.input_ids,
        "n_vocab": llm.n_vocab,
        "n_ctx": llm.n_ctx,
        "token_bos": llm.token_bos,
        "token_eos": llm.token_eos,
        "last_timings": lambda: llm.last_timings,
    }
    for name, call in calls.items():
        with pytest.raises(CooktopError, match=r"this Llama \(.*stories260K.gguf\) is closed") as err:
            call()
        assert "create a new Llama" in str(err.value), name
    with pytest.raises(CooktopError, match="model is closed"):  # a stream suspended across close()
        list(stream)


def test_with_block_closes(stories):
    with Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu") as llm:
        assert llm.n_vocab() == 512
    with pytest.raises(CooktopError, match="is closed"):
        llm.tokenize(b"x")
