"""Router mode (``cooktop serve`` without a model, llama-server's): several models in one server, each
request answered by the model it names, loaded on demand, the least recently used unloaded past
``--models-max``; model discovery as llama.cpp's (common/preset.cpp, common/download.cpp)."""

from __future__ import annotations

import concurrent.futures
import os
import time

import pytest
from serverutil import RunningServer

from cooktop.errors import CooktopError
from cooktop.server.router_models import cached_models, gguf_tag, models_dir

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def model_dir(shared, tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    os.symlink(shared / "models" / "stories260K.gguf", d / "stories.gguf")
    (d / "tiny").mkdir()
    os.symlink(shared / "models" / "tiny" / "tiny-F32.gguf", d / "tiny" / "tiny-F32.gguf")
    (d / "tiny" / "mmproj-tiny.gguf").write_bytes(b"a companion, not a model")
    (d / "mtp-stories.gguf").write_bytes(b"a draft's file, not a model")
    (d / "broken.gguf").write_bytes(b"this is not a GGUF file")
    (d / "empty").mkdir()
    (d / "notes.txt").write_text("not a model")
    return d


def router(model_dir, tmp_path, **kw):
    from cooktop.server.app import ServerConfig
    from cooktop.server.router import create_router_app
    template = ServerConfig("", llama_kwargs=dict(n_ctx=128, device="cpu"), api_key=kw.pop("api_key", None))
    (tmp_path / "hub").mkdir(exist_ok=True)
    return RunningServer(app=create_router_app(template, str(model_dir), tmp_path / "hub", **kw))


def complete(c, model, **kw):
    r = c.post("/completion", json={"model": model, "prompt": PROMPT, "n_predict": 6, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["content"]


def status(c, model):
    return next(m["status"] for m in c.get("/models").json()["data"] if m["id"] == model)


def test_discovery(model_dir, tmp_path):
    found = {m.id: m.path for m in models_dir(model_dir)}
    assert found == {"stories": str(model_dir / "stories.gguf"), "tiny": str(model_dir / "tiny" / "tiny-F32.gguf"),
                     "broken": str(model_dir / "broken.gguf")}
    with pytest.raises(CooktopError, match="does not exist or is not a directory"):
        models_dir(model_dir / "none")
    assert gguf_tag("Qwen3-8B-Q4_K_M.gguf") == ("Q4_K_M", 1)
    assert gguf_tag("stories260K.f32.gguf") == ("F32", 1)
    assert gguf_tag("Kimi-K2-UD-IQ1_S-00002-of-00006.gguf") == ("IQ1_S", 2)
    snap = tmp_path / "models--ggml-org--test-model" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    for name in ("model-Q8_0.gguf", "model-Q4_K_M-00001-of-00002.gguf", "model-Q4_K_M-00002-of-00002.gguf",
                 "mmproj-model-F16.gguf", "untagged.gguf"):
        (snap / name).write_bytes(b"")
    assert sorted(m.id for m in cached_models(tmp_path)) == ["ggml-org/test-model:Q4_K_M", "ggml-org/test-model:Q8_0"]


def test_two_models_concurrent_requests_each_answered_by_its_own(model_dir, tmp_path, server_deps):
    import httpx
    s = router(model_dir, tmp_path, api_key="k")
    try:
        with httpx.Client(base_url=s.base, timeout=120, headers={"Authorization": "Bearer k"}) as c:
            assert c.get("/props").json()["role"] == "router"
            assert {m["id"]: m["status"]["value"] for m in c.get("/v1/models").json()["data"]} == \
                {"stories": "unloaded", "tiny": "unloaded", "broken": "unloaded"}
            alone = {m: complete(c, m) for m in ("stories", "tiny")}  # each loads on its first request
            assert alone["stories"] != alone["tiny"]
            listed = {m["id"]: m for m in c.get("/models").json()["data"]}
            assert listed["stories"]["status"] == {"value": "loaded"} and listed["stories"]["meta"]["n_vocab"] == 512
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                names = ["stories", "tiny"] * 8
                got = list(pool.map(lambda m: complete(c, m), names))
            assert got == [alone[m] for m in names]  # 16 requests, none lost, each its model's answer
            # streams go through; GET requests name the model in the query
            with c.stream("POST", "/v1/chat/completions", json={
                    "model": "tiny", "stream": True, "max_tokens": 3,
                    "messages": [{"role": "user", "content": "hi"}]}) as r:
                assert r.status_code == 200 and "data: [DONE]" in r.read().decode()
            assert c.get("/props", params={"model": "stories"}).json()["model_alias"] == "stories"
            for body, why in (({"prompt": "x"}, "model name is missing from the request"),
                              ({"model": "nope", "prompt": "x"}, "model 'nope' not found")):
                r = c.post("/completion", json=body)
                assert r.status_code == 400 and r.json()["error"]["message"] == why
            # a file that is not a GGUF: its requests fail with the reason, the others go on
            r = c.post("/completion", json={"model": "broken", "prompt": "x"})
            assert r.status_code == 500 and "failed to load" in r.json()["error"]["message"]
            st = status(c, "broken")
            assert st["value"] == "unloaded" and st["failed"] is True and "GGUF" in st["error"]
            assert complete(c, "stories") == alone["stories"]
        assert httpx.post(s.base + "/completion", json={"model": "stories", "prompt": "x"}).status_code == 401
        assert httpx.get(s.base + "/health").json() == {"status": "ok"}
    finally:
        s.stop()


def test_models_max_unloads_the_least_recently_used_and_load_unload(model_dir, tmp_path, server_deps):
    import httpx
    s = router(model_dir, tmp_path, models_max=1, autoload=False)
    try:
        with httpx.Client(base_url=s.base, timeout=120) as c:
            assert c.get("/props").json()["max_instances"] == 1
            r = c.post("/completion", json={"model": "stories", "prompt": "x"})
            assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"
            assert c.post("/models/load", json={"model": "stories"}).json() == {"success": True}
            r = c.post("/models/load", json={"model": "stories"})
            assert r.status_code == 400 and r.json()["error"]["message"] == "model is already running"
            deadline = time.monotonic() + 60
            while status(c, "stories")["value"] != "loaded":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            first = complete(c, "stories")
            # one more than --models-max: the least recently used goes first
            r = c.post("/completion?autoload=true", json={"model": "tiny", "prompt": PROMPT, "n_predict": 2})
            assert r.status_code == 200, r.text
            assert status(c, "stories")["value"] == "unloaded" and status(c, "tiny")["value"] == "loaded"
            assert c.post("/models/unload", json={"model": "tiny"}).json() == {"success": True}
            assert status(c, "tiny")["value"] == "unloaded"
            r = c.post("/models/unload", json={"model": "tiny"})
            assert r.status_code == 400 and r.json()["error"]["message"] == "model is not running"
            r = c.post("/models/load", json={"model": "nope"})
            assert r.status_code == 400 and r.json()["error"]["message"] == "model is not found"
            r = c.post("/completion?autoload=1", json={"model": "stories", "prompt": PROMPT, "n_predict": 6,
                                                        "temperature": 0})
            assert r.json()["content"] == first  # loaded again: the same answer
    finally:
        s.stop()


def test_serve_without_a_model_is_the_router(model_dir, server_deps, monkeypatch):
    """``cooktop serve`` with no -m / -hf starts the router; --models-dir with -m, or a missing folder, is refused."""
    from click.testing import CliRunner

    import cooktop.cli.serve
    from cooktop.cli.group import cli
    seen = {}

    def fake(config, models_dir, models_max, autoload, split, host, port):
        seen.update(models_dir=models_dir, models_max=models_max, autoload=autoload, split=split,
                    n_ctx=config.llama_kwargs["n_ctx"])

    monkeypatch.setattr(cooktop.cli.serve, "_serve_router", fake)
    r = CliRunner().invoke(cli, ["serve", "--models-dir", str(model_dir), "--models-max", "2", "--no-models-autoload",
                                 "-c", "512", "-np", "2"])
    assert r.exit_code == 0, r.output
    assert seen == dict(models_dir=str(model_dir), models_max=2, autoload=False, split=True, n_ctx=512)
    r = CliRunner().invoke(cli, ["serve", "-m", str(model_dir / "stories.gguf"), "--models-dir", str(model_dir)])
    assert r.exit_code == 1 and "--models-dir is router mode's" in r.output
