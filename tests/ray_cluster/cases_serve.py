"""Cluster cases: `cooktop serve --ray ADDRESS --replicas 2` (Ray Serve), balance and faults.

Each replica splits stories260K across both nodes (its own two segment actors).
Run by tests/test_cluster.py inside a network namespace (see conftest.py here).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import SHARED

STORIES = SHARED / "models" / "stories260K.gguf"
PROMPT = "Once upon a time"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(address, tmp_path_factory):
    """`cooktop serve --ray` with two split replicas; yields its base URL once both replicas run."""
    import httpx

    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "cooktop.cli", "serve", "--ray", address, "--replicas", "2",
                             "-m", str(STORIES), "--port", str(port), "--device", "alpha/cpu,beta/cpu", "-c", "512"],
                            stdout=out, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"cooktop serve --ray exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200 and running_replicas() == 2:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("cooktop serve --ray did not become healthy in 300 s")
            time.sleep(1)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
        print(log.read_text()[-3000:])  # shown with a failure


def complete(base: str, max_tokens: int = 24):
    import httpx

    r = httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0},
                   timeout=120)
    return r.status_code, r.headers.get("x-cooktop-replica"), r.json()


def expected_text(max_tokens: int = 24) -> str:
    from cooktop import Llama

    llm = Llama(model_path=str(STORIES), device="cpu", n_ctx=512, verbose=False)
    try:
        return llm(PROMPT, max_tokens=max_tokens, temperature=0)["choices"][0]["text"]
    finally:
        llm.close()


def serve_status() -> str:
    from ray import serve

    return str(serve.status())


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get("cooktop")
    if app is None:
        return 0
    return app.deployments["cooktop"].replica_states.get("RUNNING", 0)


def replica_states() -> dict:
    """Serve's count of the deployment's replicas per state (e.g. {"RUNNING": 1, "STARTING": 1})."""
    from ray import serve

    app = serve.status().applications.get("cooktop")
    if app is None:
        return {}
    return {str(k): v for k, v in app.deployments["cooktop"].replica_states.items() if v}


def test_two_replicas_answer_16_concurrent_requests(server):
    """16 requests at once: every one answered with the one-machine text, both replicas used."""
    want = expected_text()
    with cf.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(lambda _: complete(server), range(16)))
    assert [s for s, _r, _b in results] == [200] * 16, results
    assert {b["choices"][0]["text"] for _s, _r, b in results} == {want}
    per_replica = collections.Counter(r for _s, r, _b in results)
    assert len(per_replica) == 2, (per_replica, serve_status())
    info = json.loads(json_get(server, "/cluster"))
    assert [s["node"] for s in info["segments"]] == ["alpha", "beta"]


def json_get(base: str, path: str) -> str:
    import httpx

    return httpx.get(f"{base}{path}", timeout=30).text


def test_a_segment_killed_mid_stream_fails_that_request_clearly_and_the_replica_comes_back(server):
    """SIGKILL to the beta segment of the replica streaming an answer: that stream ends with a 503
    error event naming the node; Ray Serve replaces the replica; requests keep being answered."""
    import httpx

    body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=120) as r:
        replica = r.headers["x-cooktop-replica"]
        pids = dict(item.split("=") for item in r.headers["x-cooktop-segments"].split(","))
        assert set(pids) == {"alpha/cpu", "beta/cpu"}
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:
                    os.kill(int(pids["beta/cpu"]), signal.SIGKILL)
    errors = [json.loads(e)["error"] for e in events if e.startswith("{\"error\"")]
    assert len(errors) == 1 and errors[0]["code"] == 503, events[-3:]
    assert re.search(r"node beta \(beta/cpu, blocks \d-4 \+ output\) died", errors[0]["message"]), errors
    assert events[-1] != "[DONE]"
    # the other replica serves meanwhile; the broken one answers 503 until Serve replaces it.
    # Replaced = Serve was seen with fewer than two RUNNING replicas (the broken one stopped,
    # its successor starting) and is back to two, and a round of 4 concurrent requests (Serve's
    # proxy prefers a replica on its own node, so one at a time they may all reach one replica)
    # is answered by replicas other than the broken one.
    statuses: list = []
    transition = False
    deadline = time.monotonic() + 150
    with cf.ThreadPoolExecutor(4) as ex:
        while time.monotonic() < deadline:
            states = replica_states()
            transition = transition or states != {"RUNNING": 2}
            round_ = [(st, rep) for st, rep, _b in ex.map(lambda _: complete(server, 4), range(4))]
            statuses += round_
            if (transition and states == {"RUNNING": 2} == replica_states()
                    and all(st == 200 and rep != replica for st, rep in round_)):
                break
            time.sleep(0.25)
        else:
            pytest.fail(f"the replica was not replaced in 150 s: {statuses[-8:]}, {replica_states()}")
    assert all(s in (200, 503) for s, _r in statuses), statuses
    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda _: complete(server), range(8)))
    assert [s for s, _r, _b in results] == [200] * 8, results
    assert replica not in {r for _s, r, _b in results}
