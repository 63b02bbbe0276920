"""Cluster cases: devices per node, layers split across nodes, plan, and nodes dying mid-generation.

Run by tests/test_cluster.py inside a network namespace (see conftest.py here).
"""

from __future__ import annotations

import json
import os
import re
import signal

import numpy as np
import pytest
from conftest import SHARED

from cooktop import Llama
from cooktop.backends.base import nmse
from cooktop.errors import ClusterError, DeviceError

from .conftest import agent_ports, cli

STORIES = SHARED / "models" / "stories260K.gguf"
TINY_Q4_0 = SHARED / "models" / "tiny" / "tiny-Q4_0.gguf"
SPLIT = "alpha/opencl:0,beta/cpu"  # OpenCL (PoCL) on one node, numpy on the other


def reference(name: str):
    with open(SHARED / "reference" / f"{name}.json") as f:
        ref = json.load(f)
    return ref["cases"][0], np.load(SHARED / "reference" / f"{name}.npz")


def all_logits(llm: Llama, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


def test_devices_lists_every_node(address):
    """`cooktop devices --ray` probes and smoke-tests on each node; beta has only numpy."""
    r = cli("devices", "--ray", address, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    nodes = {n["node"]: n["report"] for n in rep["nodes"]}
    assert set(nodes) == {"alpha", "beta"}
    alpha_cl = nodes["alpha"]["families"]["opencl"]
    assert alpha_cl["available"] and alpha_cl["devices"][0]["smoke_test"] == "PASS"
    beta = nodes["beta"]["families"]
    assert not beta["opencl"]["available"] and "COOKTOP_DISABLE" in beta["opencl"]["reason"]
    assert beta["cpu"]["devices"][0]["usable"]
    table = cli("devices", "--ray", address, "--no-smoke")
    assert table.returncode == 0, table.stderr
    for sel in ("alpha/opencl:0", "alpha/cpu", "beta/cpu"):
        assert sel in table.stdout
    assert "node beta" in table.stdout and "auto selects ['beta/cpu']" in table.stdout


def test_split_float_model_matches_llama_cpp_and_one_machine(address):
    """stories260K with blocks on alpha's OpenCL and on beta's numpy: llama.cpp's logits within
    1e-6, its greedy tokens, and the logits of the whole model on this machine."""
    case, npz = reference("stories260K")
    tokens = case["prompt_tokens"] + case["greedy_tokens"]
    llm = Llama(model_path=str(STORIES), device=SPLIT, ray_address=address, n_ctx=512, logits_all=True,
                n_gpu_layers=-1, verbose=False)
    try:
        segs = llm._engine.model.segments
        assert [s.node.name for s in segs] == ["alpha", "beta"]
        assert llm._engine.placement.n_offloaded() == 6
        got = all_logits(llm, tokens)
    finally:
        llm.close()
    want = npz[case["logits_key"]]
    assert nmse(got, want) <= 1e-6
    n_p = len(case["prompt_tokens"])
    assert got[n_p - 1:-1].argmax(1).tolist() == case["greedy_tokens"]
    local = Llama(model_path=str(STORIES), device="cpu", n_ctx=512, logits_all=True, verbose=False)
    try:
        assert nmse(got, all_logits(local, tokens)) <= 1e-6
    finally:
        local.close()


def test_split_quantized_model_shipped_through_the_object_store(address):
    """tiny-Q4_0 split across the nodes, its tensors shipped (not read from the nodes' disk):
    llama.cpp's logits within 3e-3, the same as the same split on this machine."""
    from cooktop.cluster.load import load

    case, npz = reference("tiny-Q4_0")
    tokens = case["prompt_tokens"] + case["greedy_tokens"]
    eng = load(TINY_Q4_0, device=SPLIT, n_ctx=128, logits_all=True, keep_scores=True, weights="ship")
    try:
        assert [(s.node.name, s.how) for s in eng.model.segments] == [("alpha", "shipped"), ("beta", "shipped")]
        got = eng.eval(tokens, logits_all=True)
    finally:
        eng.close()
    assert nmse(got, npz[case["logits_key"]]) <= 3e-3
    # the cluster's segments run flash attention (their KV config is the default: f16, -fa auto);
    # llama-cpp-python's default flash_attn=False would take the -fa off kernels here
    local = Llama(model_path=str(TINY_Q4_0), device="opencl:0,cpu", n_ctx=128, logits_all=True, n_gpu_layers=-1,
                  verbose=False, flash_attn=True)
    try:
        assert local._engine.placement.segments() == [("opencl:0", [0], False), ("cpu", [1], True)]
        np.testing.assert_allclose(got, all_logits(local, tokens), rtol=0, atol=1e-5)
    finally:
        local.close()


def test_batched_sequences_across_nodes_match_one_machine(address):
    """Two sequences of one cache in shared forward passes (forward_batch, what the server's batch
    driver runs) on the split model give this machine's logits."""
    from cooktop.cluster.load import load
    from cooktop.engine.generate import load as local_load

    got, want = [], []
    for outs, eng in ((got, load(STORIES, device=SPLIT, n_ctx=128, n_gpu_layers=-1)),
                      (want, local_load(STORIES, device="cpu", n_ctx=128))):
        try:
            a = eng.tokenizer.tokenize("Once upon a time", add_bos=True)
            b = eng.tokenizer.tokenize("The cat sat", add_bos=True)
            seqs = eng.new_sequences(2)
            first = eng.model.forward_batch(seqs[0].cache, [(0, 0, a, True), (1, 0, b, True)])
            nxt = [int(np.argmax(x)) for x in first]
            second = eng.model.forward_batch(seqs[0].cache, [(0, len(a), [nxt[0]], True), (1, len(b), [nxt[1]], True)])
            outs += [*first, *second]
            assert seqs[1].tokens == [*b, nxt[1]]
        finally:
            eng.close()
    for g, w in zip(got, want):
        assert nmse(g, w) <= 1e-6


def test_plan_places_layers_by_node_memory_and_reports_hops(address):
    """`cooktop plan --ray`: blocks in proportion to each node's (here overridden) memory; each hop's
    bytes per token (4 x n_embd activations, 4 x n_vocab logits back) and a measured latency."""
    env = {"COOKTOP_DEVICE_MEMORY": "alpha/cpu=3GiB,beta/cpu=1GiB"}
    r = cli("plan", "--ray", address, "-m", str(STORIES), "--device", "alpha/cpu,beta/cpu", "--json", env=env)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["devices_requested"] == ["alpha/cpu", "beta/cpu"]
    assert rep["blocks"] == ["alpha/cpu"] * 4 + ["beta/cpu"]  # 5 blocks split 3:1 (llama.cpp's rule)
    assert rep["head"] == "beta/cpu"
    hops = rep["ray"]["hops"]
    assert [(h["from"], h["to"]) for h in hops] == [("driver", "alpha/cpu"), ("alpha/cpu", "beta/cpu"),
                                                    ("beta/cpu", "driver")]
    assert [h["bytes_per_token"] for h in hops] == [4 * 64, 4 * 64, 4 * 512]
    assert all(isinstance(h["latency_ms"], float) and h["latency_ms"] > 0 for h in hops)
    assert rep["ray"]["bytes_per_token"] == 4 * (64 + 64 + 512)
    text = cli("plan", "--ray", address, "-m", str(STORIES), "-ngl", "auto", env=env)
    assert text.returncode == 0, text.stderr
    assert "alpha/opencl:0" in text.stdout and "beta/cpu" in text.stdout  # auto: each node's auto device
    assert "per decoded token: " in text.stdout


def test_unknown_node_and_device_are_clear(address):
    with pytest.raises(ClusterError, match=r"no live node 'zeta'.*alpha, beta"):
        Llama(model_path=str(STORIES), device="zeta/cpu", ray_address=address, verbose=False)
    with pytest.raises(DeviceError, match=r"node beta has no usable device 'opencl:0'.*cpu"):
        Llama(model_path=str(STORIES), device="alpha/cpu,beta/opencl:0", ray_address=address, n_gpu_layers=-1,
              verbose=False)
    with pytest.raises(DeviceError, match=r"has no node: with --ray, name devices as NODE/DEVICE"):
        Llama(model_path=str(STORIES), device="cpu", ray_address=address, verbose=False)


def test_killing_a_segment_mid_generation_is_a_clear_error(address):
    """SIGKILL to beta's segment process while generating: the next step raises ClusterError
    naming the node; the model then refuses work with the same cause (no hang)."""
    llm = Llama(model_path=str(STORIES), device=SPLIT, ray_address=address, n_ctx=512, n_gpu_layers=-1,
                verbose=False)
    try:
        beta = llm._engine.model.segments[1]
        assert re.fullmatch(r"node beta \(beta/cpu, blocks \d-4 \+ output\)", beta.label)
        steps = llm.create_completion("Once upon a time", max_tokens=200, temperature=0, stream=True)
        with pytest.raises(ClusterError, match=re.escape(beta.label) + " died") as err:
            for i, _chunk in enumerate(steps):
                if i == 3:
                    os.kill(beta.pid, signal.SIGKILL)
        assert "load the model again" in str(err.value)
        with pytest.raises(ClusterError, match="lost a segment earlier"):
            llm("Once", max_tokens=2)
    finally:
        llm.close()


def test_a_hung_segment_fails_after_the_timeout(address, monkeypatch):
    """A segment that stops answering (SIGSTOP) fails the call after COOKTOP_RAY_TIMEOUT seconds."""
    llm = Llama(model_path=str(STORIES), device=SPLIT, ray_address=address, n_ctx=512, n_gpu_layers=-1,
                verbose=False)
    beta = llm._engine.model.segments[1]
    try:
        assert llm("Once", max_tokens=2, temperature=0)["choices"][0]["finish_reason"] == "length"
        monkeypatch.setenv("COOKTOP_RAY_TIMEOUT", "3")
        os.kill(beta.pid, signal.SIGSTOP)
        with pytest.raises(ClusterError, match=re.escape(beta.label) + r" did not answer within 3 s"):
            llm("Once upon", max_tokens=2, temperature=0)
    finally:
        os.kill(beta.pid, signal.SIGCONT)
        llm.close()


def test_a_node_dying_mid_generation_is_a_clear_error(ray_cluster, address):
    """A whole node (gamma, added for this case) leaves the cluster while it holds a segment."""
    from cooktop.cluster.load import load
    from cooktop.engine.sampling import SamplingParams

    gamma = ray_cluster.add_node(num_cpus=1, node_name="gamma", node_ip_address="127.0.0.3",
                                 env_vars={"COOKTOP_DISABLE": "opencl,vulkan"}, **agent_ports())
    removed = False
    try:
        eng = load(STORIES, device="alpha/cpu,gamma/cpu", n_ctx=512)
        try:
            gen = eng.generate(eng.tokenizer.tokenize("Once upon a time", add_bos=True), 400,
                               SamplingParams(temperature=0))
            with pytest.raises(ClusterError, match=r"node gamma \(gamma/cpu, .*\) died"):
                for i, _step in enumerate(gen):
                    if i == 3:
                        ray_cluster.remove_node(gamma, allow_graceful=False)
                        removed = True
        finally:
            eng.close()
    finally:
        if not removed:
            ray_cluster.remove_node(gamma)
