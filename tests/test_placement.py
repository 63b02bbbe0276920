"""Layers split across devices; -ngl, --split, -ngl auto, cooktop plan.

Logits must not depend on placement (llama.cpp #5137 is the bug this guards against).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED, open_family_device
from gguf import GGMLQuantizationType as T

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.runtime.placement import offloaded_units, split_contiguous
from cooktop.tools import synth


def ref_case(name):
    ref = json.loads((SHARED / "reference" / f"{name}.json").read_text())["cases"][0]
    return ref, np.load(SHARED / "reference" / f"{name}.npz")[ref["logits_key"]]


def logits(path, device, ngl, split=None, n_ctx=256):
    ref, _ = ref_case("stories260K" if "stories" in str(path) else "tiny-Q4_K_M")
    llm = Llama(model_path=str(path), n_ctx=n_ctx, logits_all=True, verbose=False, device=device,
                n_gpu_layers=ngl, split=split)
    llm.eval(ref["prompt_tokens"] + ref["greedy_tokens"])
    out = llm.scores.copy()
    summary = llm._engine.placement.summary()
    llm.close()
    return out, summary


def test_ngl_units_follow_llama_cpp():
    assert offloaded_units(5, 0) == ([], False)
    assert offloaded_units(5, 1) == ([], True)  # output head first
    assert offloaded_units(5, 2) == ([4], True)  # then blocks from the last one backwards
    assert offloaded_units(5, 5) == ([1, 2, 3, 4], True)
    assert offloaded_units(5, 6) == ([0, 1, 2, 3, 4], True)
    assert offloaded_units(5, -1) == ([0, 1, 2, 3, 4], True)
    assert offloaded_units(5, 999) == ([0, 1, 2, 3, 4], True)
    assert split_contiguous(list(range(10)), [3, 1]) == [list(range(8)), [8, 9]]
    assert split_contiguous(list(range(5)), [1, 1, 1]) == [[0, 1], [2, 3], [4]]


@pytest.fixture(scope="module")
def stories_numpy(stories):
    return logits(stories, "cpu", 0)[0]


@pytest.mark.parametrize("family", registry.DEVICE_FAMILIES)
@pytest.mark.parametrize("ngl", [0, 1, 2, 5, 6, 999])
def test_logits_do_not_depend_on_ngl(stories, stories_numpy, family, ngl):
    open_family_device(family)
    got, summary = logits(stories, family, ngl)
    n_off = min(ngl, 6)
    assert summary.startswith(f"offloaded {n_off}/6 layers")
    assert nmse(got, stories_numpy) <= 1e-6
    assert np.array_equal(got.argmax(1), stories_numpy.argmax(1))


@pytest.mark.vulkan
def test_three_way_split(stories, stories_numpy):
    open_family_device("opencl")
    open_family_device("vulkan")
    got, summary = logits(stories, "opencl:0,vulkan:0,cpu", -1, split=[2, 2, 1])
    assert "opencl:0 blocks 0-1" in summary and "vulkan:0 blocks 2-3" in summary, summary
    assert nmse(got, stories_numpy) <= 1e-6
    assert np.array_equal(got.argmax(1), stories_numpy.argmax(1))


@pytest.mark.parametrize("device,ngl", [("cpu", 0), ("opencl", 1), ("opencl", 2), ("opencl", 3),
                                        ("vulkan", 2), ("vulkan", 3), ("opencl:0,vulkan:0", -1)])
def test_q4_k_m_within_reference_at_every_placement(shared, device, ngl):
    for fam in device.split(","):
        if fam != "cpu":
            open_family_device(fam.split(":")[0])
    _, want = ref_case("tiny-Q4_K_M")
    got, _ = logits(shared / "models" / "tiny" / "tiny-Q4_K_M.gguf", device, ngl)
    assert nmse(got, want) <= 3e-3


@pytest.mark.parametrize("family", registry.DEVICE_FAMILIES)
def test_ngl_0_allocates_nothing_on_devices(stories, family):
    dev = open_family_device(family)
    before = (dev.n_allocs, dev.allocated_bytes)
    llm = Llama(model_path=str(stories), n_ctx=64, verbose=False, device=family, n_gpu_layers=0)
    llm.create_completion("Once", max_tokens=2, temperature=0)
    assert (dev.n_allocs, dev.allocated_bytes) == before
    assert llm._engine.placement.devices() == ["cpu"]
    llm.close()
    llm = Llama(model_path=str(stories), n_ctx=64, verbose=False, device=family, n_gpu_layers=1)
    assert dev.n_allocs > before[0]  # the counter does count
    llm.close()


def plan_json(path, *args, env=None):
    e = {**os.environ, **(env or {})}
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "plan", "-m", str(path), "--json", *args],
                       capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def expected_auto_n(path, n_ctx, n_batch, mem, max_alloc):
    """Largest N fitting, from the README formula, computed here independently of cooktop.runtime.budget:
    matrices past ``max_alloc`` are split into row chunks (plus one chunk's output scratch), so only
    the KV cache of a block and the scratch buffers other than the logits must fit the max allocation."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    md = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    E, L = md["llama.embedding_length"], md["llama.block_count"]
    F, H, HKV = md["llama.feed_forward_length"], md["llama.attention.head_count"], md["llama.attention.head_count_kv"]
    K = HKV * (E // H)
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    V = [t for t in r.tensors if t.name == "token_embd.weight"][0].shape[1]
    kv = 2 * n_ctx * K * 4
    block_w = [sum(v for k, v in sizes.items() if k.startswith(f"blk.{i}.") and len(k.split(".")) == 4
                   and not k.endswith("norm.weight")) + sum(v for k, v in sizes.items()
                   if k.startswith(f"blk.{i}.") and k.endswith("norm.weight")) for i in range(L)]
    rows = {t.name: int(t.shape[-1]) for t in r.tensors if len(t.shape) == 2}  # GGUF ne: n_out last
    scratch_list = [4 * n_batch * E] * 5 + [4 * n_batch * K] * 2 + [4 * n_batch * F] * 2 + [4 * n_batch]
    head_list = [4, 4 * E, 4 * V]
    head_w = sizes["output_norm.weight"] + sizes.get("output.weight", sizes["token_embd.weight"])
    usable = int(mem * 0.95)
    for n in range(L + 1, -1, -1):
        if n == 0:
            return 0
        blocks = list(range(L - (n - 1), L))
        total = head_w + sum(block_w[i] + kv for i in blocks) + sum(scratch_list) + sum(head_list)
        placed = [k for k in rows if any(k.startswith(f"blk.{i}.") for i in blocks)
                  or k in ("output.weight", "output_norm.weight")]
        chunked = [k for k in placed if sizes[k] > max_alloc]
        if chunked:
            total += min(max_alloc, 4 * n_batch * max(rows[k] for k in chunked))
        largest = max(scratch_list + head_list[:2] + ([kv // 2] if blocks else []))
        if total <= usable and largest <= max_alloc:
            return n


@pytest.mark.parametrize("case", ["everything", "nothing", "between", "max_alloc"])
def test_ngl_auto_with_simulated_memory(shared, case):
    open_family_device("opencl")
    path = shared / "models" / "tiny" / "tiny-Q4_K_M.gguf"
    n_ctx, n_batch = 512, 32
    mem, mx = {"everything": (1 << 30, 1 << 30), "nothing": (64 << 10, 64 << 10),
               "between": (1_500_000, 1 << 30), "max_alloc": (1 << 30, 120_000)}[case]
    env = {"COOKTOP_DEVICE_MEMORY": f"opencl:0={mem}/{mx}"}
    # F32 K/V caches (-ctk/-ctv f32): expected_auto_n counts 4 bytes a value
    rep = plan_json(path, "--device", "opencl", "-ngl", "auto", "-c", str(n_ctx), "-b", str(n_batch),
                    "-ctk", "f32", "-ctv", "f32", env=env)
    want = expected_auto_n(path, n_ctx, n_batch, mem, mx)
    assert rep["n_gpu_layers"] == want
    assert {"everything": want == 3, "nothing": want == 0, "between": 0 < want < 3,
            "max_alloc": want == 1}[case], want
    dev = [d for d in rep["devices"] if d["device"] == "opencl:0"]
    assert all(d["fits"] for d in rep["devices"])
    assert bool(dev) == (want > 0)


def test_forced_ngl_that_does_not_fit_is_refused(shared):
    dev = open_family_device("opencl")
    path = shared / "models" / "tiny" / "tiny-Q4_K_M.gguf"
    before = dev.n_allocs
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "run", "-m", str(path), "-p", "hi", "-n", "1",
                        "--device", "opencl", "-ngl", "99"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COOKTOP_DEVICE_MEMORY": "opencl:0=1MiB"})
    assert r.returncode == 1
    assert r.stderr.startswith("error: -ngl 99 does not fit on opencl:0") and "-ngl auto" in r.stderr
    assert dev.n_allocs == before


def test_budget_figures_differ_and_the_hint_names_what_shrinks_the_buffer():
    from cooktop.runtime.budget import DeviceBudget, size_texts

    assert size_texts(88064, 65536) == ["86.0 KiB", "64.0 KiB"]
    assert size_texts(65540, 65536) == ["65540 bytes", "65536 bytes"]
    assert size_texts(3 << 29, 1 << 30) == ["1536.0 MiB", "1024.0 MiB"]

    def budget(what, largest=88064, total=1 << 20, usable=1 << 30):
        return DeviceBudget("opencl:0", [0], True, total, 0, 0, largest, usable, usable, 65536, what)

    assert budget("scratch").why_not == ("largest buffer that cannot be split (scratch) 86.0 KiB exceeds the "
                                         "maximum allocation 64.0 KiB")
    assert budget("scratch").remedy.startswith("a smaller -b ") and "-c" not in budget("scratch").remedy
    assert budget("KV cache").remedy.startswith("a smaller -c or a smaller -ctk/-ctv type")
    assert "-b" not in budget("blk.0.attn_norm.weight").remedy
    assert budget("scratch", largest=100, total=2 << 20, usable=1 << 20).why_not == (
        "needs 2.0 MiB but 1.0 MiB is usable (1.0 MiB minus reserve)")
    assert budget("scratch", largest=100).remedy == ""


@pytest.mark.parametrize("args,words", [
    (["-c", "128"], "(scratch) 86.0 KiB exceeds the maximum allocation 64.0 KiB; use a smaller -b "),
    (["-b", "32"], "(KV cache) 128.0 KiB exceeds the maximum allocation 64.0 KiB; use a smaller -c or a "
                   "smaller -ctk/-ctv type"),
])
def test_forced_ngl_past_the_max_allocation_names_the_option_to_shrink(shared, args, words):
    open_family_device("opencl")
    path = shared / "models" / "stories260K.gguf"
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "plan", "-m", str(path), "--device", "opencl:0",
                        "-ngl", "-1", *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COOKTOP_DEVICE_MEMORY": "opencl:0=1GiB/64KiB"})
    assert r.returncode == 1
    assert r.stderr.startswith("error: -ngl -1 does not fit on opencl:0") and words in r.stderr, r.stderr

    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "plan", "-m", str(path), "--device", "opencl:0",
                        "-ngl", "-1", "-c", "128", "-b", "8"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COOKTOP_DEVICE_MEMORY": "opencl:0=1GiB/64KiB"})
    assert "note: opencl:0: output.weight past the maximum allocation 64.0 KiB: stored in row chunks" in r.stdout


def test_block_with_unsupported_type_stays_on_numpy(tmp_path, cpu_device):
    dev = open_family_device("opencl")
    assert not dev.supports("matmul", T.BF16)
    path = tmp_path / "mixed.gguf"
    shape = synth.Shape(256, 3, 4, 2, 512, 512, 256)
    synth.write(path, shape, "Q4_0", seed=3, overrides={"blk.1.ffn_up.weight": T.BF16})
    rep = plan_json(path, "--device", "opencl", "-ngl", "-1")
    assert rep["blocks"] == ["opencl:0", "cpu", "opencl:0"]
    assert any("block 1 stays on cpu" in r and "BF16" in r for r in rep["host_reasons"])
    toks = list(range(3, 40))
    outs = []
    for device, ngl in (("cpu", 0), ("opencl", -1)):
        llm = Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, device=device, n_gpu_layers=ngl)
        llm.eval(toks)
        outs.append(llm.scores.copy())
        llm.close()
    assert nmse(outs[1], outs[0]) <= 5e-4


def test_plan_json_is_stable(stories):
    a = plan_json(stories, "--device", "cpu")
    b = plan_json(stories, "--device", "cpu")
    assert a == b
    assert set(a) == {"schema", "model", "n_layer", "n_ctx", "n_batch", "n_parallel", "cache_type_k", "cache_type_v",
                      "flash_attn", "devices_requested", "n_gpu_layers",
                      "n_offloaded", "summary", "blocks", "experts", "head", "devices", "host_reasons", "mtp"}
    assert set(a["devices"][0]) == {"device", "blocks", "head", "weight_bytes", "kv_bytes", "state_bytes",
                                    "scratch_bytes",
                                    "total_bytes", "memory_bytes", "usable_bytes", "max_alloc_bytes",
                                    "largest_alloc_bytes", "largest_alloc", "chunked", "fits"}
    assert a["schema"] == 1 and a["blocks"] == ["cpu"] * 5 and a["head"] == "cpu"
