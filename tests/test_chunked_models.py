"""Models whose embedding / output matrix and logits are past a device's largest buffer run with
``-ngl -1``, split into row chunks (backends/chunked.py), and give the logits they give unsplit.

Small synthetic models (``tools/synth.py``) with the structure of the real ones (Llama-3.2-1B:
tied embeddings, rope_freqs, Q4_K_M; Gemma 3: tied, head_dim != n_embd / n_head, sliding
window) under a simulated 64 KiB limit (``COOKTOP_DEVICE_MEMORY=<dev>=1GiB/64KiB`` for the
placement, the opened device's ``buffer_limit`` likewise): the tied ``token_embd`` (the output
matrix) and ``logits_all`` are cut in several parts, and in a qwen3moe shape the expert
tensors. The full-size runs (Llama-3.2-1B and a Gemma 3 shape with its 262k vocabulary on
lavapipe's 128 MiB and under a simulated 1 GiB on PoCL) are in the README, done by hand: they
take minutes.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.errors import DeviceOutOfMemoryError
from cooktop.tools import synth

LIMIT = 64 << 10
LLAMA = synth.Shape(256, 2, 4, 2, 256, 1500, 256, 500000.0, tied=True, rope_freqs=True)
GEMMA3 = synth.Shape(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=256, n_vocab=1400, n_ctx_train=256,
                     rope_freq_base=1e6, tied=True, head_dim=128, arch="gemma3", n_swa=8, swa_pattern=2,
                     rope_freq_base_swa=10000.0)
QWEN3MOE = synth.Shape(256, 2, 4, 2, 256, 600, 256, 1e6, tied=True, head_dim=64, arch="qwen3moe", n_expert=8,
                       n_expert_used=2, n_ff_exp=256)
CASES = {"llama-Q4_K_M": (LLAMA, "Q4_K_M"), "gemma3-Q4_K": (GEMMA3, "Q4_K"), "qwen3moe-Q4_K": (QWEN3MOE, "Q4_K")}
PROMPT = [int(t) for t in np.random.default_rng(2).integers(3, 600, 21)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("chunked")
    out = {}
    for name, (shape, ft) in CASES.items():
        out[name] = d / f"{name}.gguf"
        synth.write(out[name], shape, ft, seed=4)
    return out


def _logits(path, device: str, _check: bool = False) -> np.ndarray:
    """Logits of PROMPT at every position, everything on ``device``; ``_check``: the output matrix
    (tied: token_embd) and logits_all are stored in row chunks."""
    llm = Llama(model_path=str(path), n_ctx=64, n_batch=16, logits_all=True, verbose=False, device=device,
                n_gpu_layers=-1)
    try:
        if device != "cpu":
            pl = llm._engine.placement
            assert pl.n_offloaded() == llm._engine.cfg.n_layer + 1, pl.notes
        if _check:
            seg = llm._engine.model.segments[-1]
            assert seg.head_weights["output"].chunks is not None
            if "moe" in str(path):  # the expert tensors (their logits fit)
                assert all(w["ffn_gate_exps"].chunks is not None for w in seg.weights)
            else:
                assert seg.logits_all.chunks is not None
        llm.eval(PROMPT)
        return np.array(llm.scores[:len(PROMPT)], dtype=np.float64)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def reference(models):
    """numpy's logits of every case (no limit)."""
    return {name: _logits(p, "cpu") for name, p in models.items()}


@pytest.mark.slow(reason="lavapipe compiles each model's pipelines cold (16 s on 2 cores); one model per case")
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("family", registry.DEVICE_FAMILIES)
def test_split_model_matches_unsplit(family, models, reference, name, monkeypatch):
    dev = open_family_device(family)
    plain = _logits(models[name], dev.info.selector)
    monkeypatch.setenv("COOKTOP_DEVICE_MEMORY", f"{dev.info.selector}=1GiB/{LIMIT}")
    old, scratch = dev.buffer_limit, dev._chunk_scratch
    dev.buffer_limit, dev._chunk_scratch = LIMIT, {}
    try:
        split = _logits(models[name], dev.info.selector, _check=True)
    finally:
        dev.release(list(dev._chunk_scratch.values()))
        dev.buffer_limit, dev._chunk_scratch = old, scratch
    assert nmse(split, plain) < 1e-12, "the chunks change the sums"
    assert nmse(split, reference[name]) <= 3e-3
    assert (split.argmax(-1) == reference[name].argmax(-1)).mean() > 0.8


def test_refused_upload_names_the_tensor(models, monkeypatch):
    """A buffer that cannot be split (a norm vector) over the limit: a DeviceOutOfMemoryError naming the
    tensor and the limit while loading, nothing left allocated."""
    dev = open_family_device("opencl")
    old = dev.buffer_limit
    dev.buffer_limit = 1000
    try:
        with pytest.raises(DeviceOutOfMemoryError, match=r"tensor \S+norm\.weight: F32 weight \[256\] needs one "
                                                          r"buffer of 1024 bytes, more than opencl:\d+'s largest "
                                                          r"buffer of 1000 bytes"):
            Llama(model_path=str(models["llama-Q4_K_M"]), n_ctx=64, verbose=False, device=dev.info.selector,
                  n_gpu_layers=-1)
    finally:
        dev.buffer_limit = old


def test_plan_lists_chunked_matrices(models):
    """``plan --json`` under a simulated max allocation: the matrices past it are listed as chunked and the
    device still fits; the largest single buffer is named."""
    import json
    import os
    import subprocess
    import sys

    open_family_device("opencl")
    env = {**os.environ, "COOKTOP_DEVICE_MEMORY": f"opencl:0=1GiB/{LIMIT}"}
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "plan", "-m", str(models["llama-Q4_K_M"]), "--json",
                        "--device", "opencl:0", "-ngl", "auto", "-c", "64", "-b", "16"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    (d,) = [d for d in rep["devices"] if d["device"] == "opencl:0"]
    assert d["fits"] and d["chunked"] == ["token_embd.weight"] and rep["n_offloaded"] == 3
    assert d["largest_alloc_bytes"] <= LIMIT and d["largest_alloc"] == "blk.1.ffn_down.weight"
