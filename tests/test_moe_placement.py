"""Placing a mixture of experts in halves: ``--n-cpu-moe`` / ``--cpu-moe`` / ``-ot`` and the
automatic split on devices without MoE ops (runtime/placement.py); the logits of every placement
equal those of the model on one device; the plan and the memory budget count the experts
where they go."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device
from test_arch_moe import PROMPT, SHAPES

from cooktop import Llama
from cooktop.backends.base import nmse
from cooktop.errors import DeviceError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config
from cooktop.runtime.budget import weight_bytes
from cooktop.runtime.placement import TensorPlacement, plan
from cooktop.tools import synth


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("moeplace") / "q3moe.gguf"
    synth.write(p, SHAPES["qwen3moe"], "F32", seed=5)
    return p


def _all(sel, op, ty, **dims):
    return ""


def _no_moe(sel, op, ty, **dims):
    """A device without the MoE ops (supports_op's answer: the reason, "" when it can)."""
    if sel != "cpu" and op in ("moe_route", "matmul_id", "moe_combine", "add_id", "swiglu_oai"):
        return f"{sel} cannot run {op}"
    return ""


def _plan(path, tp, supports=_all, ngl=-1):
    gf = open_gguf(path)
    cfg = load_config(gf)
    return plan(gf, cfg, ["fake:0"], ngl, None, supports, tensors=tp)


def test_n_cpu_moe_and_cpu_moe(moe_file):
    p = _plan(moe_file, TensorPlacement.parse(n_cpu_moe=1))
    assert p.blocks == ["fake:0", "fake:0"] and p.experts == ["cpu", "fake:0"] and p.head == "fake:0"
    assert [(s, b, parts) for s, b, _, parts in p.units()] == [
        ("fake:0", [0], ["attn"]), ("cpu", [0], ["ffn"]), ("fake:0", [1], ["all"])]
    p = _plan(moe_file, TensorPlacement.parse(cpu_moe=True))
    assert p.experts == ["cpu", "cpu"]
    assert p.summary() == "offloaded 3/3 layers: fake:0 blocks 0-1 + output; experts of blocks 0-1 on cpu"
    assert _plan(moe_file, TensorPlacement()).experts is None


def test_override_tensor(moe_file):
    # llama.cpp's spelling: experts of block 1 to the host; the first matching pattern wins
    p = _plan(moe_file, TensorPlacement.parse(override_tensor=[r"blk\.1\.ffn_.*_exps=CPU", "exps=fake:0"]))
    assert p.experts == ["fake:0", "cpu"]
    # an attention tensor moves the attention half; the head by its tensors
    p = _plan(moe_file, TensorPlacement.parse(override_tensor=r"blk\.0\.attn_q=cpu,^output=cpu"), ngl=-1)
    assert p.blocks == ["cpu", "fake:0"] and p.experts == ["fake:0", "fake:0"] and p.head == "cpu"
    # with nothing offloaded by -ngl, -ot still sends the experts to the device
    p = _plan(moe_file, TensorPlacement.parse(override_tensor="ffn=fake:0"), ngl=0)
    assert p.blocks == ["cpu", "cpu"] and p.experts == ["fake:0", "fake:0"]


@pytest.mark.parametrize("bad,message", [
    ("exps", "bad --override-tensor 'exps': expected REGEX=DEVICE"),
    ("ex(ps=CPU", "bad --override-tensor pattern 'ex(ps'"),
])
def test_override_tensor_errors(bad, message):
    with pytest.raises(DeviceError, match=message.replace("(", r"\(")):
        TensorPlacement.parse(override_tensor=bad)
    with pytest.raises(DeviceError, match="--n-cpu-moe must be >= 0"):
        TensorPlacement.parse(n_cpu_moe=-1)


def test_device_without_moe_ops_takes_the_attention(moe_file):
    p = _plan(moe_file, None, _no_moe)
    assert p.blocks == ["fake:0", "fake:0"] and p.experts == ["cpu", "cpu"]
    assert p.notes == [f"block {i}: experts stay on cpu: fake:0 cannot run moe_route; fake:0 cannot run "
                       f"matmul_id; fake:0 cannot run moe_combine" for i in range(2)]
    p = _plan(moe_file, TensorPlacement.parse(override_tensor="exps=fake:0"), _no_moe, ngl=0)
    assert p.experts is None and "experts stay on cpu, not fake:0" in p.notes[0]


def test_budget_counts_the_experts_where_they_go(moe_file):
    gf = open_gguf(moe_file)
    cfg = load_config(gf)
    whole = sum(weight_bytes(gf, cfg, [0, 1, "head"]).values())
    halves = sum(weight_bytes(gf, cfg, [(0, "attn"), (1, "attn"), "head"]).values())
    experts = sum(weight_bytes(gf, cfg, [(0, "ffn"), (1, "ffn")]).values())
    assert halves + experts == whole and experts > halves
    assert sum(weight_bytes(gf, cfg, [(0, "ffn")]).values()) == 4 * (8 * 64 * 64 * 3 + 8 * 64 + 64)


def _logits(path, **kw):
    llm = Llama(model_path=str(path), n_ctx=64, n_batch=7, logits_all=True, verbose=False, **kw)
    try:
        llm.eval(PROMPT)
        return np.array(llm.scores[:len(PROMPT)]), llm._engine.placement
    finally:
        llm.close()


@pytest.mark.parametrize("family", ["opencl", "vulkan"])
def test_halves_on_two_devices_give_the_same_logits(moe_file, family):
    info = open_family_device(family).info
    sel, moe = info.selector, "matmul_id" in info.ops  # OpenCL runs the MoE ops, Vulkan not yet
    ref, _ = _logits(moe_file, device="cpu")
    got, p = _logits(moe_file, device=sel, n_gpu_layers=-1)
    assert p.blocks == [sel, sel] and p.experts == (None if moe else ["cpu", "cpu"])
    assert nmse(got, ref) < 1e-6
    got, p = _logits(moe_file, device=sel, n_gpu_layers=-1, cpu_moe=True)  # attention there, experts here
    assert p.blocks == [sel, sel] and p.experts == ["cpu", "cpu"]
    assert nmse(got, ref) < 1e-6
    got, p = _logits(moe_file, device=sel, n_gpu_layers=-1, n_cpu_moe=1,
                     override_tensor=[r"blk\.1\.attn_.*=CPU"])
    assert p.blocks == [sel, "cpu"] and p.experts == ["cpu", sel if moe else "cpu"]
    assert nmse(got, ref) < 1e-6


def test_cpu_placements_through_the_api(moe_file):
    ref, _ = _logits(moe_file, device="cpu")
    got, p = _logits(moe_file, device="cpu", cpu_moe=True)
    assert p.experts is None  # all on the host already
    np.testing.assert_array_equal(got, ref)


def _cli(*args):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_plan_and_bench_take_the_flags(moe_file):
    """``cooktop plan`` lists the experts' devices; ``bench`` takes -cmoe / -ncmoe / -ot like run, chat, serve."""
    import json
    rep = json.loads(_cli("plan", "-m", str(moe_file), "--device", "cpu", "-ot", "blk\\.1\\.ffn_up_exps=CPU",
                          "--json"))
    assert rep["experts"] == ["cpu", "cpu"] and rep["blocks"] == ["cpu", "cpu"]
    text = _cli("plan", "-m", str(moe_file), "--device", "cpu", "-ncmoe", "1")
    assert "offloaded 0/3 layers: all on cpu" in text
    recs = json.loads(_cli("bench", "-m", str(moe_file), "--device", "cpu", "-p", "4", "-n", "2", "-r", "1",
                           "-cmoe", "-o", "json"))
    recs = recs if isinstance(recs, list) else recs["results"]
    assert {r["test"] for r in recs} == {"pp4", "tg2"} and all(r["avg_ts"] > 0 for r in recs)


def test_device_without_sinks_takes_the_experts(tmp_path):
    """gpt-oss on a device that runs the MoE ops but not attention with sinks: the attention halves
    stay on the host, the experts and the head go to the device."""
    p = tmp_path / "oss.gguf"
    synth.write(p, SHAPES["gpt-oss"], "F32", seed=5)

    def no_sinks(sel, op, ty, **dims):
        return f"{sel} cannot run {op}" if sel != "cpu" and op == "attention_sinks" else ""

    pl = _plan(p, None, no_sinks)
    assert pl.blocks == ["cpu"] * 3 and pl.experts == ["fake:0"] * 3 and pl.head == "fake:0"
    assert pl.notes[0] == "block 0: attention stays on cpu: fake:0 cannot run attention_sinks"
