"""Code written for llama-cpp-python, run against cooktop: its ``except ValueError`` catches cooktop's
errors, a huge ``n_ctx`` is one clean error, ``cooktop info`` of an unknown architecture, and an
offline ``from_pretrained`` / ``-hf`` that fails at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import rewrite_gguf, with_chat_template

from cooktop import Llama
from cooktop.errors import (
    ChatTemplateError,
    ContextOverflowError,
    CooktopError,
    DeviceOutOfMemoryError,
    GGUFError,
    UnsupportedModelError,
)


def cooktop(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_except_value_error_catches_what_llama_cpp_python_raises(stories, tmp_path):
    caught = []
    for make in (lambda: Llama(model_path=str(tmp_path / "missing.gguf"), verbose=False),
                 lambda: Llama(model_path=str(rewrite_gguf(stories, tmp_path / "m.gguf", arch="mamba9")),
                               verbose=False)):
        try:
            make()
        except ValueError as e:  # llama-cpp-python: "Failed to load model from file"
            caught.append(type(e))
    llm = Llama(model_path=str(stories), n_ctx=32, verbose=False, device="cpu")
    try:
        llm.create_completion("Once upon a time " * 20, max_tokens=4)
    except ValueError as e:  # llama-cpp-python: "Requested tokens (...) exceed context window of 32"
        caught.append(type(e))
    llm.close()
    refuses = with_chat_template(stories, tmp_path / "t.gguf", "{{ raise_exception('no system role') }}")
    llm = Llama(model_path=str(refuses), n_ctx=64, verbose=False, device="cpu")
    try:
        llm.create_chat_completion([{"role": "user", "content": "hi"}])
    except ValueError as e:
        caught.append(type(e))
    llm.close()
    assert caught == [GGUFError, UnsupportedModelError, ContextOverflowError, ChatTemplateError]
    assert all(issubclass(t, CooktopError) for t in caught)


def test_huge_context_on_the_host_is_one_clean_line(stories):
    with pytest.raises(DeviceOutOfMemoryError, match=r"at -c 100000000 the host's KV cache and buffers need "
                                                     r"61036\.6 MiB but .* MiB of memory is usable"):  # an f16 cache
        Llama(model_path=str(stories), n_ctx=10**8, device="cpu", verbose=False)
    r = cooktop("run", "-m", str(stories), "-p", "hi", "-c", "100000000", "--device", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: at -c 100000000 the host's KV cache")
    # the same count against a simulated small host; a context that fits still runs
    small = {"COOKTOP_DEVICE_MEMORY": "cpu=64MiB"}
    r = cooktop("run", "-m", str(stories), "-p", "hi", "-n", "1", "-c", "100000", "--device", "cpu", env=small)
    assert r.returncode == 1 and "need 62.5 MiB but 60.8 MiB of memory is usable (64.0 MiB minus reserve)" in r.stderr
    r = cooktop("run", "-m", str(stories), "-p", "hi", "-n", "1", "-c", "2048", "--device", "cpu", env=small)
    assert r.returncode == 0, r.stderr


def test_info_of_an_unknown_architecture(stories, tmp_path):
    path = rewrite_gguf(stories, tmp_path / "mamba9.gguf", arch="mamba9")
    r = cooktop("info", str(path))
    assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "unsupported architecture 'mamba9'" in r.stderr
    assert "architecture:   mamba9 (GGUF v3, tokenizer llama): not supported by cooktop" in r.stdout
    assert "  llama.context_length = 2048" in r.stdout and "  F32       48 tensors" in r.stdout
    j = json.loads(cooktop("info", str(path), "--json").stdout)
    assert j["supported"] is False and j["config"] is None and j["tensor_types"]["F32"]["tensors"] == 48
    assert j["metadata"]["general.architecture"] == "mamba9" and j["n_params"] == 292800
    assert json.loads(cooktop("info", str(stories), "--json").stdout)["supported"] is True


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9", "http://no-such-host.invalid"])
def test_offline_hub_fails_at_once(tmp_path, endpoint, monkeypatch):
    """No network (a refused port, a name that does not resolve): one line within seconds, nothing printed."""
    env = {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    code = ("from cooktop import Llama\n"
            "try:\n    Llama.from_pretrained('owner/repo', '*Q4_0.gguf', verbose=False)\n"
            "except Exception as e:\n    print('caught', e)\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})
    assert time.monotonic() - t0 < 15
    assert r.stdout.startswith("caught cannot list the files of owner/repo") and "no network" in r.stdout
    assert r.stderr == ""
    t0 = time.monotonic()
    r = cooktop("run", "-hf", "owner/repo:Q4_0", "-p", "hi", env=env)
    assert time.monotonic() - t0 < 15 and r.returncode == 1
    assert r.stderr.count("\n") == 1 and "no network" in r.stderr and "HF_HUB_OFFLINE=1" in r.stderr
