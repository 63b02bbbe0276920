"""Sleeping on idle (``cooktop serve --sleep-idle-seconds``, llama-server's): the model is freed after
the idle time, the read-only endpoints answer without waking it, the next request loads it again and
answers as before; a failed reload is a 500 naming why, retried on the next request."""

from __future__ import annotations

import shutil
import time

import pytest
from click.testing import CliRunner
from serverutil import RunningServer

PROMPT = "Once upon a time, there was a little"


def wait_asleep(c, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not c.get("/props").json()["is_sleeping"]:
        assert time.monotonic() < deadline, "the server did not go to sleep"
        time.sleep(0.05)


def complete(c) -> dict:
    r = c.post("/completion", json={"prompt": PROMPT, "n_predict": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def predicted_total(c) -> float:
    text = c.get("/metrics").text
    return float(next(ln.split()[1] for ln in text.splitlines()
                      if ln.startswith("llamacpp:tokens_predicted_total ")))


def test_sleep_frees_the_model_and_the_next_request_wakes_it(stories, tmp_path, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    model = tmp_path / "m.gguf"
    shutil.copyfile(stories, model)
    s = RunningServer(ServerConfig(str(model), llama_kwargs=dict(n_ctx=128, device="cpu"), api_key="k",
                                   sleep_idle_seconds=1, endpoint_metrics=True))
    try:
        with httpx.Client(base_url=s.base, timeout=120, headers={"Authorization": "Bearer k"}) as c:
            first = complete(c)
            assert not c.get("/props").json()["is_sleeping"]
            props_awake = c.get("/props").json()
            n_before = predicted_total(c)
            assert n_before == 6
            wait_asleep(c)
            assert s.state.llm is None and s.state.scheduler is None  # model, caches and slots freed
            # the read-only endpoints answer from what was kept, and do not wake it
            assert c.get("/health").json() == {"status": "ok"}
            assert c.get("/v1/models").json()["data"][0]["id"] == "m.gguf"
            assert predicted_total(c) == n_before
            asleep = c.get("/props").json()
            assert {k: v for k, v in asleep.items() if k != "is_sleeping"} == \
                {k: v for k, v in props_awake.items() if k != "is_sleeping"}
            # a request without the API key is refused and wakes nothing
            assert httpx.post(s.base + "/tokenize", json={"content": "x"}).status_code == 401
            assert c.get("/props").json()["is_sleeping"] and s.state.llm is None
            # any other request wakes it: the same greedy text, the counters carried over
            assert complete(c)["content"] == first["content"]
            assert not c.get("/props").json()["is_sleeping"]
            assert predicted_total(c) == n_before + 6
            # a model that cannot be loaded again: a 500 naming why, and tried again on the next request
            wait_asleep(c)
            model.rename(tmp_path / "gone.gguf")
            r = c.post("/tokenize", json={"content": "Hello"})
            assert r.status_code == 500 and "loaded again after sleeping" in r.json()["error"]["message"]
            assert "m.gguf" in r.json()["error"]["message"]
            assert c.get("/props").json()["is_sleeping"]
            (tmp_path / "gone.gguf").rename(model)
            r = c.post("/tokenize", json={"content": "Hello"})
            assert r.status_code == 200 and r.json()["tokens"]
            assert not c.get("/props").json()["is_sleeping"]
    finally:
        s.stop()


def test_without_the_flag_it_never_sleeps(stories, server_deps):
    from cooktop.server.app import ServerConfig, create_app
    app = create_app(ServerConfig(str(stories)))
    assert app.state.cooktop.sleeping is False
    assert ServerConfig(str(stories)).sleep_idle_seconds == -1


@pytest.mark.parametrize("value", ["0", "-2"])
def test_bad_sleep_idle_seconds_is_refused(stories, value, server_deps):
    import cooktop.cli.serve  # noqa: F401  (registers the command)
    from cooktop.cli.group import cli
    r = CliRunner().invoke(cli, ["serve", "-m", str(stories), "--sleep-idle-seconds", value])
    assert r.exit_code == 2 and "--sleep-idle-seconds" in r.output and "cannot be 0 or less than -1" in r.output

