"""Bad requests and unloadable models as a fresh user hits them: each gets llama-server's answer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from conftest import rewrite_gguf
from test_server import PROMPT, http, srv  # noqa: F401 - the module's server, shared


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", "serve", "-m", str(model), "--port",
                           str(_free_port()), "--device", "cpu", *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def test_serve_exits_1_when_the_model_cannot_load(stories, tmp_path, server_deps):
    """llama-server: "failed to load model" and a non-zero exit, not a server answering 500 forever."""
    mamba = rewrite_gguf(stories, tmp_path / "mamba.gguf", arch="mamba")
    r = _serve(mamba)
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot load the model") and "unsupported architecture 'mamba'" in last
    assert "Traceback" not in r.stderr
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(stories.read_bytes()[: os.path.getsize(stories) // 2])
    r = _serve(trunc)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("error: cannot load the model")
    assert str(trunc) in r.stderr.strip().splitlines()[-1]
    assert "serving" not in r.stderr  # announced only once the model has loaded


def test_serve_checks_its_options_and_the_file_before_announcing(stories, tmp_path, server_deps):
    """A negative -c or a file that is not a GGUF is one error line and exit 1, with no "serving ...
    on http://..." line before it (cooktop announces the address once the model has loaded, as
    llama-server prints "listening on ..." after "model loaded", tools/server/server.cpp)."""
    r = _serve(stories, "-c", "-5")
    assert r.returncode == 1 and "serving" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: n_ctx (-c) must be >= 0 (0 = from the model), got -5"
    text = tmp_path / "notes.gguf"
    text.write_text("not a model at all")
    r = _serve(text)
    assert r.returncode == 1 and "serving" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {text}: not a GGUF file: magic b'not '"), last
    assert "Traceback" not in r.stderr


def test_deeply_nested_json_is_400(http):  # noqa: F811
    r = http.post("/v1/completions", content=b"[" * 100_000 + b"]" * 100_000,
                  headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "not valid JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["mirostat", "mirostat_mode"])
def test_mirostat_is_refused_like_the_python_api(http, name):  # noqa: F811
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, name: 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name and "mirostat" in r.json()["error"]["message"]
    ok = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, name: 0})
    assert ok.status_code == 200, ok.text


def test_logit_bias_outside_the_vocabulary(http, stories):  # noqa: F811
    """llama-server ignores such ids; the Python API refuses them (llama-cpp-python fails on them too)."""
    from cooktop import Llama
    from cooktop.text.base import InvalidTokenError
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                           "logit_bias": {"99999": 5.0, "-1": 3}})
    plain = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    llm = Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu")
    with pytest.raises(InvalidTokenError, match=r"logit_bias: token id 99999 is not in the vocabulary \(0\.\.511\)"):
        llm.create_completion(PROMPT, max_tokens=2, logit_bias={99999: 5.0})


@pytest.mark.parametrize("var,value,words", [
    ("LLAMA_ARG_ENDPOINT_SLOTS", "maybe", "not a valid boolean"),
    ("LLAMA_ARG_CTX_SIZE", "abc", "not a valid integer"),
])
def test_bad_llama_arg_variable_is_named(monkeypatch, capsys, var, value, words):
    """A bad value from a LLAMA_ARG_* variable names the variable (one line), not the flag."""
    from cooktop.cli.main import main
    monkeypatch.setenv(var, value)
    monkeypatch.setattr(sys, "argv", ["cooktop", "serve", "-m", "unused.gguf"])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {var}={value!r} is no valid value of --") and words in err


def test_serve_concurrency_names_a_missing_llama_server(tmp_path):
    """scripts/serve_concurrency.py with a --llama-server path that is not there: one error line
    naming it, before anything runs (it ended in a FileNotFoundError traceback)."""
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "serve_concurrency.py")
    missing = str(tmp_path / "nonexistent")
    r = subprocess.run([sys.executable, script, "-m", "unused.gguf", "--vs-llama-cpp", "--no-cooktop",
                        "--llama-server", missing], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip() == f"error: --llama-server {missing}: no executable file there"


def test_a_device_failure_is_a_server_error_not_the_requests():
    """A device's failure while serving (a DeviceError) answers 500 ``server_error``; a request the server
    cannot serve (a CooktopError) 400 ``invalid_request_error``, as llama-server tells them apart."""
    from cooktop.errors import CooktopError, DeviceError
    from cooktop.server.protocol import classify
    assert classify(DeviceError("opencl:0: out of resources")) == (500, "server_error")
    assert classify(CooktopError("bad request")) == (400, "invalid_request_error")
