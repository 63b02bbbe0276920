"""``cooktop run`` / ``cooktop info`` as a user runs them (subprocess), plus engine edge cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import SHARED

from cooktop import Llama
from cooktop.errors import ContextOverflowError

PROMPT = "Once upon a time"


def cooktop(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def test_run_greedy_matches_reference(stories):
    ref = json.loads((SHARED / "reference" / "stories260K.json").read_text())["cases"][0]
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "-n", "64", "--temp", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + ref["greedy_text"] + "\n"
    for key in ("load time", "prompt eval time", "eval time", "tokens per second", "time to first token"):
        assert key in r.stderr
    assert "finish reason: length" in r.stderr


def test_seed_reproducible_and_random(stories):
    args = ["run", "-m", str(stories), "-p", PROMPT, "-n", "24", "--temp", "1", "--device", "cpu"]
    a = cooktop(*args, "--seed", "42")
    b = cooktop(*args, "--seed", "42")
    assert a.returncode == 0 and b.returncode == 0
    assert a.stdout == b.stdout
    llm = Llama(model_path=str(stories), n_ctx=128, verbose=False, seed=-1)
    texts = {llm.create_completion(PROMPT, max_tokens=24, temperature=1.0)["choices"][0]["text"] for _ in range(5)}
    assert len(texts) >= 2


def test_context_end_is_length_not_exception(stories):
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "-n", "100", "-c", "32", "--temp", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "finish reason: length" in r.stderr
    assert "Traceback" not in r.stderr
    llm = Llama(model_path=str(stories), n_ctx=32, verbose=False)
    out = llm.create_completion(PROMPT, max_tokens=100, temperature=0)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["total_tokens"] == 32


def test_prompt_longer_than_context(stories):
    llm = Llama(model_path=str(stories), n_ctx=16, verbose=False)
    with pytest.raises(ContextOverflowError, match="n_ctx"):
        llm.create_completion("once upon a time " * 20, max_tokens=4)
    r = cooktop("run", "-m", str(stories), "-p", "once upon a time " * 20, "-c", "16", "--device", "cpu")
    assert r.returncode == 1
    assert r.stderr.strip().startswith("error: ") and "n_ctx" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_prefix_reuse_gives_same_logits(stories):
    """A second completion that extends the first reuses the cache and agrees with a fresh run."""
    a = Llama(model_path=str(stories), n_ctx=128, verbose=False)
    first = a.create_completion(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
    again = a.create_completion(PROMPT + first, max_tokens=8, temperature=0)["choices"][0]["text"]
    b = Llama(model_path=str(stories), n_ctx=128, verbose=False)
    fresh = b.create_completion(PROMPT + first, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert again == fresh


def test_stop_strings_and_stream(stories):
    llm = Llama(model_path=str(stories), n_ctx=128, verbose=False)
    full = llm.create_completion(PROMPT, max_tokens=40, temperature=0)["choices"][0]["text"]
    out = llm.create_completion(PROMPT, max_tokens=40, temperature=0, stop=["Lily"])
    assert out["choices"][0]["text"] == full[:full.index("Lily")]
    assert out["choices"][0]["finish_reason"] == "stop"
    chunks = list(llm.create_completion(PROMPT, max_tokens=40, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == full
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_info_json(stories):
    r = cooktop("info", str(stories), "--json", "-c", "512")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["architecture"] == "llama"
    assert info["n_params"] == 292800
    assert info["file_size_bytes"] == 1185376
    assert info["tensor_types"]["F32"]["tensors"] == 48
    assert info["largest_tensor"] == {"name": "token_embd.weight", "bytes": 512 * 64 * 4}
    c = info["config"]
    assert (c["n_embd"], c["n_layer"], c["n_head"], c["n_head_kv"], c["n_ff"], c["n_vocab"]) == (64, 5, 8, 4, 172, 512)
    # KV = 2 x n_layer x n_head_kv x head_dim x n_ctx x bytes per element
    assert info["kv_cache_bytes"]["f32"] == 2 * 5 * 4 * 8 * 512 * 4


def test_parameter_counts_print_in_llama_cpp_units():
    """src/llama-model.cpp ``model params``: two decimals of T, B, M or K."""
    from cooktop.units import format_params
    assert [format_params(n) for n in (210_240, 999_999, 1_000_000, 292_800, 1_100_048_384, 2 * 10**12, 0)] == [
        "210.24 K", "1000.00 K", "1.00 M", "292.80 K", "1.10 B", "2.00 T", "0.00 K"]


def test_info_says_row_chunks_only_past_a_devices_largest_buffer(stories):
    """No device limit known: no claim about row chunks; one a simulated device is past: named."""
    r = cooktop("info", str(stories), env={"COOKTOP_DEVICE_MEMORY": ""})
    assert r.returncode == 0, r.stderr
    assert "largest tensor: token_embd.weight, 128.00 KiB\n" in r.stdout
    r = cooktop("info", str(stories), env={"COOKTOP_DEVICE_MEMORY": "opencl:0=1GiB/64KiB,vulkan:0=1GiB/128KiB"})
    assert ("largest tensor: token_embd.weight, 128.00 KiB (past the largest buffer of opencl:0, 64.00 KiB "
            "by COOKTOP_DEVICE_MEMORY: stored in row chunks there)\n") in r.stdout, r.stdout
    r = cooktop("info", str(stories), "--json", env={"COOKTOP_DEVICE_MEMORY": "opencl:0=1GiB/64KiB,cpu=100KiB"})
    assert json.loads(r.stdout)["largest_tensor_chunked_on"] == ["opencl:0", "cpu"]


def test_default_model_from_hf_cache(stories, tmp_path):
    """No -m: the default model comes from the (seeded) HF cache, offline."""
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    seed = subprocess.run([sys.executable, "-m", "cooktop.tools.hub", "--seed", str(stories)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert seed.returncode == 0, seed.stderr
    r = cooktop("run", "-p", PROMPT, "-n", "8", "--temp", "0", "--device", "cpu", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(PROMPT + ", there was a little girl")
