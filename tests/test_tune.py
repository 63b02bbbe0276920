"""The autotuner (cooktop.backends.tune): every value of the search space keeps the default's results
(bit for bit where the family is exact, within the parity bound otherwise) on OpenCL and Vulkan at
cheap shapes; the cache is per device and honoured when a device opens (COOKTOP_NO_TUNE: not); the
budget is respected; a tuned model gives the same logits for a prompt and its tokens one at a time.

Under tests/opencl_validation.py (Oclgrind, a GPU-type device) the OpenCL cases run the GPU
flavour's space; under tests/vulkan_validation.py the Vulkan ones run with the validation layers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED, open_family_device, skip_or_fail
from gguf import GGMLQuantizationType as T

from cooktop.backends.tune import cache, space, tuner
from cooktop.errors import CooktopError, DeviceError
from cooktop.quantize.rows import quantize_rows

#: Cheap shapes: (type, n_out, n_in); n_out a multiple of 16 so Q4_0 takes the repacked layout on x86 PoCL.
SHAPES = ((T.Q4_0, 48, 256), (T.Q4_K, 40, 512))
N_PROMPT = 9


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test its own cache folder and tuning on (conftest turns it off for the other tests)."""
    monkeypatch.setenv("COOKTOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("COOKTOP_NO_TUNE", raising=False)


#: pyopencl warns when a candidate seen before wraps its cached program's kernels again (harmless)
pytestmark = pytest.mark.filterwarnings("ignore:Kernel .* has been retrieved more than once")


def _fresh(selector: str):
    """A device of its own (not the registry's process-wide one), opened as a run opens it."""
    from cooktop.backends import registry

    fam, index = registry.parse_selector(selector)
    return registry._load_backend(fam).open(index)


@pytest.fixture(scope="module", params=["opencl", "vulkan"])
def tdev(request):
    sel = open_family_device(request.param).info.selector  # skips (fails under COOKTOP_REQUIRE) without one
    dev = _fresh(sel)
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def weights():
    return tuner.synthetic_shapes(quantize_rows, SHAPES, seed=3)


def _one_value_variants(dev) -> list[tuple[str, dict[str, int]]]:
    """(family key, params) for each value of each parameter of the device's space, one parameter
    moved from the default at a time (every value of the space, not every combination). On Vulkan
    Q4_0 only: lavapipe compiles each variant's pipeline cold (~7 s)."""
    out = []
    types = [t for t, *_ in SHAPES][:1 if dev.info.backend == "vulkan" else None]
    for key, fam in tuner.plan(dev, types):
        base = space.defaults(dev.info, fam.name)
        cands = space.candidates(dev.info, fam.name)
        for p in fam.params:
            for v in fam.params[p]:
                c = dict(base, **{p: v})
                if c != base and c in cands:
                    out.append((key, c))
    return out


def test_space_table_and_defaults(tdev):
    fl = space.flavour_of(tdev.info)
    assert fl in space.SPACE
    for fam in space.SPACE[fl]:
        cands = space.candidates(tdev.info, fam.name)
        assert cands[0] == space.defaults(tdev.info, fam.name)
        assert len(cands) == len({json.dumps(c, sort_keys=True) for c in cands})
    rows = space.table()
    assert {r["flavour"] for r in rows} == {"opencl-cpu", "opencl-gpu", "vulkan"}
    with pytest.raises(DeviceError, match="not in the search space"):
        tdev.apply_tuning({"mat_vec:Q4_0": {"mv_r" if fl.startswith("opencl") else "wg": 3}})
    with pytest.raises(DeviceError, match="no kernel family"):
        tdev.apply_tuning({"warp:Q4_0": {"x": 1}})


@pytest.mark.slow(reason="on Vulkan, lavapipe compiles each variant's mat-vec pipeline cold (~7 s each)")
def test_every_variant_keeps_the_default_result(tdev, weights):
    """The parity guarantee over the space: each variant's output equals the default's (exact
    families bit for bit), and the default equals numpy's reference within the float bound."""
    from cooktop.backends.cpu.quants import dequantize

    up = {t: tdev.upload(raw, t, (n_out, n_in)) for t, n_out, n_in, raw in weights}
    variants = _one_value_variants(tdev)
    assert variants, "the device's space has no variant"
    checked = 0
    for key in dict.fromkeys(k for k, _ in variants):
        fam = space.family(space.flavour_of(tdev.info), key.split(":", 1)[0])
        tdev.apply_tuning({})
        case = tuner._Case(tdev, key, up, 256, N_PROMPT, head_dim=32, n_ctx=24)
        ref = case.result()
        if ":" in key:  # the default against numpy (dequantized weights, float64 sums)
            t = space.type_of(key)
            _, n_out, n_in, raw = next(w for w in weights if w[0] == t)
            x = tdev.read(case.x)
            want = x.astype(np.float64) @ dequantize(raw.reshape(-1), t, (n_out, n_in)).astype(np.float64).T
            assert np.abs(ref - want).max() < 0.02 * np.abs(want).max(), key
        for k, params in variants:
            if k != key:
                continue
            tdev.apply_tuning({key: params})
            got = case.result()
            why = tuner._same(ref, got, fam.exact)
            assert why is None, f"{tdev.info.selector} {key} {params}: {why}"
            checked += 1
    tdev.apply_tuning({})
    assert checked == len(variants)


def test_tune_respects_budget_and_caches(tdev, weights):
    rec = tuner.tune(tdev, weights[:1], budget_s=0.0, runs=1, n_prompt=N_PROMPT)
    assert rec["complete"] is False and rec["choice"] == {}
    assert all(r["tried"] == 1 and r["skipped"] > 0 for r in rec["report"])
    key = f"mat_vec:{weights[0][0].name}"
    # a budget the whole family fits in even under the validation layer (the 0 s one above ran out)
    rec = tuner.tune(tdev, weights[:1], budget_s=300.0, runs=2, n_prompt=N_PROMPT, only=[key])
    assert [r["kernel"] for r in rec["report"]] == [key]
    r = rec["report"][0]
    assert r["tried"] + r["skipped"] == len(space.candidates(tdev.info, "mat_vec")) and not r["rejected"]
    assert rec["complete"] == (r["skipped"] == 0)
    # the budget stops new candidates and confirmation pairs: at most one (a cold pipeline, ~7 s on
    # lavapipe, on a loaded machine more) runs past it
    assert r["speedup"] >= 1.0 and rec["tuning_s"] < 6.0 + 12.0
    path = cache.store(tdev.info, rec)
    assert cache.load(tdev.info)["choice"] == rec["choice"]
    assert path.startswith(str(cache.cache_dir("tune")))
    summary = cache.summary(tdev.info)
    assert summary["active"] and summary["speedups"] == {key: r["speedup"]}


def test_device_opens_with_the_cached_choice(tdev, monkeypatch):
    fl = space.flavour_of(tdev.info)
    choice = ({"mat_vec:Q4_0": {"mv_r": 16}} if fl == "opencl-cpu" else {"mat_vec:Q4_0": {"mv_r": 8}}
              if fl == "opencl-gpu" else {"mat_vec:Q4_0": {"wg": 16}})
    cache.store(tdev.info, {"choice": choice, "report": []})
    dev = _fresh(tdev.info.selector)
    try:
        assert dev.tuning == choice
    finally:
        dev.close()
    monkeypatch.setenv("COOKTOP_NO_TUNE", "1")
    dev = _fresh(tdev.info.selector)
    try:
        assert dev.tuning == {}
        assert cache.summary(tdev.info)["active"] is False
    finally:
        dev.close()
    monkeypatch.delenv("COOKTOP_NO_TUNE")
    rec_path = cache.path_for(tdev.info)
    with open(rec_path, "w") as f:
        f.write("{not json")
    assert cache.load_choice(tdev.info) == {}  # unreadable: the defaults, no crash


def test_tuning_numpy_is_refused():
    from cooktop.backends import registry

    dev = registry.open_device("cpu")
    with pytest.raises(CooktopError, match="no tunable kernels"):
        tuner.tune(dev, tuner.synthetic_shapes(quantize_rows, ((T.Q4_0, 16, 32),)))


def test_tuned_model_prompt_equals_tokens_one_at_a_time():
    """A non-default variant forced through the cache: a prompt's logits equal its tokens' one at a
    time, and (exact families) the untuned logits bit for bit."""
    from pathsutil import eval_three_ways

    from cooktop.backends import registry
    from cooktop.engine import generate as G
    from cooktop.format.kvtypes import KVConfig

    path = SHARED / "models" / "tiny" / "tiny-Q4_0.gguf"
    if not path.exists():
        skip_or_fail("shared", f"{path} missing")
    res = registry.probe("opencl")
    if not res.available:
        skip_or_fail("opencl", f"{res.reason}; to enable: {res.hint}")
    info = res.devices[0]
    fl = space.flavour_of(info)
    tokens = [1, 403, 407, 261, 378, 261, 410, 432, 298, 315, 421, 300]

    def run():
        eng = G.load(str(path), n_ctx=64, n_batch=32, device=info.selector, n_gpu_layers=-1,
                     kv=KVConfig(T.F32, T.F32))
        try:
            batch, one, _ = eval_three_ways(eng, tokens, 5)
        finally:
            eng.close()
        return batch, one

    registry.reset()  # the engine opens the registry's device: open it afresh, untuned
    base_batch, _ = run()
    choice = ({"mat_vec:Q4_0": {"mv_r": 16, "q8_pf": 0}, "prompt_matmul:Q4_0": {"mmq_tt": 4, "mm_tm": 16}}
              if fl == "opencl-cpu" else {"prompt_matmul:Q4_0": {"mm_tm": 32}})
    cache.store(info, {"choice": choice, "report": []})
    registry.reset()  # ... and again, now with the cached choice
    try:
        batch, one = run()
        assert registry.open_device(info.selector).tuning == choice
    finally:
        registry.reset()
    assert np.isfinite(batch).all()
    assert np.abs(batch - one).max() <= 1e-4 * max(1.0, float(np.abs(one).max()))
    assert np.array_equal(batch, base_batch)


def test_cli_space_and_merge(tmp_path):
    from click.testing import CliRunner

    from cooktop.cli.group import cli
    from cooktop.cli.main import _register
    from cooktop.cli.tune import merge

    _register()
    out = CliRunner().invoke(cli, ["tune", "--space"])
    assert out.exit_code == 0 and "mv_r=4/8/16" in out.output and "q8_pf=0/768/1536/3072" in out.output
    out = CliRunner().invoke(cli, ["tune", "--device", "cpu"])
    assert out.exit_code != 0 and "numpy backend has no launch parameters" in out.output
    old = {"choice": {"mat_vec:Q4_0": {"mv_r": 16}, "mat_vec:Q8_0": {"mv_r": 4}},
           "report": [{"kernel": "mat_vec:Q4_0"}, {"kernel": "mat_vec:Q8_0"}]}
    new = {"choice": {}, "report": [{"kernel": "mat_vec:Q4_0"}], "tuning_s": 1.0}
    m = merge(old, new)
    assert m["choice"] == {"mat_vec:Q8_0": {"mv_r": 4}} and len(m["report"]) == 2 and m["tuning_s"] == 1.0


def test_devices_json_shows_the_choice(tdev):
    from cooktop.cli.devices import devices_report

    choice = {"mat_vec:Q4_0": {"mv_r": 16} if space.flavour_of(tdev.info) == "opencl-cpu" else
              {"mv_r": 8} if tdev.info.backend == "opencl" else {"wg": 16}}
    cache.store(tdev.info, {"choice": choice, "report": [{"kernel": "mat_vec:Q4_0", "speedup": 1.25}],
                            "tuning_s": 3.0, "complete": True})
    rep = devices_report(smoke=False)
    entry = next(d for d in rep["families"][tdev.info.backend]["devices"] if d["selector"] == tdev.info.selector)
    assert entry["tuned"]["choice"] == choice and entry["tuned"]["speedups"] == {"mat_vec:Q4_0": 1.25}
    assert entry["tuned"]["active"] is True and entry["tuned"]["tuning_s"] == 3.0
