"""The Vulkan (Kompute kp 0.9.0) backend: probe, install failures, shaders, replay, storage.

Per-op parity with numpy for every backend is in test_ops_parity.py; this file
tests what is Vulkan's own: the probe and its failure reasons, the shipped
SPIR-V being up to date, push-constant sizes, the record-once-replay cache of
sequences (with a decode-like layer checked against numpy each step), and the
device-only storage tensors.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from conftest import ROOT, skip_or_fail
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.backends.base import ROPE_NEOX, nmse
from cooktop.backends.vulkan.shaders import GLSL_DIR
from cooktop.errors import DeviceOutOfMemoryError
from cooktop.format.quants import random_weight

vulkan = pytest.importorskip("cooktop.backends.vulkan.device")


@pytest.fixture
def fresh_registry():
    """An empty registry for one test; the session's opened devices are put back afterwards
    (registry.reset() would close the device the session-scoped fixtures hold)."""
    saved = {name: dict(getattr(registry, name)) for name in ("_backends", "_probes", "_devices", "_smoke")}
    for name in saved:
        getattr(registry, name).clear()
    yield registry
    for key, dev in list(registry._devices.items()):
        if saved["_devices"].get(key) is not dev:
            dev.close()
    for name, d in saved.items():
        getattr(registry, name).clear()
        getattr(registry, name).update(d)


@pytest.fixture(scope="module")
def vk():
    """The first Vulkan device (skip, or fail under COOKTOP_REQUIRE=vulkan, when absent)."""
    res = registry.probe("vulkan")
    if not res.available:
        skip_or_fail("vulkan", f"{res.reason}; to enable: {res.hint}")
    return registry.open_device(res.devices[0].selector)


# -- probe ------------------------------------------------------------------

def test_probe_fields(vk):
    info = vk.info
    assert info.backend == "vulkan" and info.selector == f"vulkan:{info.index}"
    assert info.global_mem_bytes and info.global_mem_bytes > 0
    assert info.max_workgroup_size and info.max_workgroup_size >= 128
    assert info.extra["max_storage_buffer_range"] >= 1 << 27  # Vulkan's minimum is 2^27 bytes
    assert info.extra["max_push_constants_size"] >= vulkan.MAX_PUSH_BYTES
    assert set(info.types) == {t.name for t in vulkan.VULKAN_TYPES}
    assert info.max_alloc_bytes <= info.global_mem_bytes
    if "llvmpipe" in info.name:  # Mesa lavapipe: Vulkan on the CPU
        assert info.device_type == "cpu"
        assert info.vendor == "Mesa"
        assert info.subgroup_size in (4, 8, 16)
        assert info.extra["storage_buffer_16bit"] is True and info.extra["storage_buffer_8bit"] is True
        assert info.extra["subgroup_arithmetic"] is True and "matmul" in info.ops
    else:
        assert info.device_type in ("gpu", "igpu", "cpu", "accelerator")


def test_probe_is_cached(vk, monkeypatch):
    """A second probe reuses the per-process facts: it creates no kp.Manager."""
    import kp

    def no_manager(*a, **k):
        raise AssertionError("probe created a kp.Manager")

    monkeypatch.setattr(kp, "Manager", no_manager)
    res = vulkan.VulkanBackend().probe()
    assert res.available and res.devices[0].name == vk.info.name


def test_disabled_by_env(fresh_registry, monkeypatch, cpu_device):
    monkeypatch.setenv("COOKTOP_DISABLE", "vulkan")
    res = fresh_registry.probe("vulkan")
    assert not res.available
    assert "COOKTOP_DISABLE" in res.reason
    assert not any(s.startswith("vulkan") for s in fresh_registry.valid_selectors())
    cpu = fresh_registry.open_device("cpu")
    x = cpu.empty((1, 4))
    cpu.write(x, np.array([[1, 2, 3, 4]], dtype=np.float32))
    cpu.add(x, x, x)
    np.testing.assert_array_equal(cpu.read(x), [[2, 4, 6, 8]])


def test_kp_absent(fresh_registry, monkeypatch):
    monkeypatch.setitem(sys.modules, "kp", None)  # `import kp` raises ImportError
    res = fresh_registry.probe("vulkan")
    assert not res.available
    assert "kp" in res.reason and "not importable" in res.reason
    assert "cooktop setup-vulkan" in res.hint
    assert fresh_registry.probe("cpu").available


def test_numpy2_needs_pybind11_2_12(monkeypatch):
    """numpy 2 is refused only for a kp built with pybind11 < 2.12 (Debian's 2.10 reads numpy 2
    arrays as zeros); the patched build reports its pybind11 and runs under numpy 2."""
    import types
    monkeypatch.setattr(vulkan.np, "__version__", "2.0.1")
    old = types.SimpleNamespace(cooktop_patch=vulkan.KP_PATCH_LEVEL, pybind11_version="2.10.3")
    assert "numpy 2.0.1" in vulkan.numpy_problem(old) and "pybind11 2.10.3" in vulkan.numpy_problem(old)
    assert "numpy<2" in vulkan.numpy_problem(types.SimpleNamespace())
    assert vulkan.numpy_problem(types.SimpleNamespace(pybind11_version="2.13.6")) is None
    monkeypatch.setattr(vulkan, "_import_kp", lambda: old)
    res = vulkan.VulkanBackend().probe()
    assert not res.available and "numpy 2.0.1" in res.reason


def test_no_driver_is_a_reason_not_a_crash(tmp_path):
    """An ICD file naming a library that is no driver (as gpu-check.sh could write): the probe
    says why in one line, in a subprocess that must not crash (kp < patch level 2 aborted)."""
    import subprocess
    fake = tmp_path / "libfake_icd.so.0"
    fake.write_bytes(b"")
    icd = tmp_path / "fake_icd.json"
    icd.write_text(json.dumps({"file_format_version": "1.0.0",
                               "ICD": {"library_path": str(fake), "api_version": "1.3.0"}}))
    env = dict(__import__("os").environ, VK_DRIVER_FILES=str(icd), VK_ICD_FILENAMES=str(icd),
               COOKTOP_DISABLE="opencl")
    r = subprocess.run([sys.executable, "-m", "cooktop", "devices", "--json"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    fam = json.loads(r.stdout)["families"]["vulkan"]
    assert fam["available"] is False
    assert "vkCreateInstance failed" in fam["reason"], fam["reason"]


def test_unpatched_kp_refused(fresh_registry, monkeypatch):
    """kp 0.9.0 as published (no memory-barrier bindings) is refused with the rebuild hint."""
    import types
    monkeypatch.setattr(vulkan, "_import_kp", lambda: types.SimpleNamespace(Manager=None))
    res = vulkan.VulkanBackend().probe()
    assert not res.available
    assert "without cooktop's patch" in res.reason and "cooktop setup-vulkan" in res.reason
    assert "cooktop setup-vulkan" in res.hint


def test_kp_is_patched(vk):
    """The kp in use carries cooktop's patch: barrier ops, OpDispatch, enabled features."""
    kp = sys.modules["kp"]
    assert kp.cooktop_patch >= vulkan.KP_PATCH_LEVEL
    for op in ("OpMemoryBarrier", "OpGlobalMemoryBarrier", "OpDispatch"):
        assert hasattr(kp, op), op
    assert vk.features == set(vk.mgr.enabled_features())
    assert vk.features <= set(vulkan.KP_FEATURES)
    # what the device reports through libvulkan is exactly what kp enabled
    assert sorted(vk.features) == sorted(vk.info.extra["features"])
    if "llvmpipe" in vk.info.name:  # lavapipe (Mesa 22.3) offers all of them
        assert vk.features == set(vulkan.KP_FEATURES)


def test_pipelines_are_shared_across_buffers(vk):
    """kp's patch shares one compute pipeline per (shader, specialization constants, push size, binding
    count): a second set of buffers on the same op adds no pipeline and computes its own values, also
    after the first set's buffers (and their kp algorithms) are released; another shape of the same op
    that needs no new specialization keeps using it."""
    kp = sys.modules["kp"]
    rng = np.random.default_rng(7)
    n = 389  # an odd width

    def add(a, b):
        ta, tb, out = vk.empty(a.shape), vk.empty(a.shape), vk.empty(a.shape)
        vk.write(ta, a)
        vk.write(tb, b)
        vk.add(out, ta, tb)
        return out, [ta, tb, out]

    a1, b1, a2, b2 = (rng.standard_normal((3, n)).astype(np.float32) for _ in range(4))
    out1, held1 = add(a1, b1)
    np.testing.assert_array_equal(vk.read(out1), a1 + b1)
    shared = kp.shared_pipelines()
    assert shared >= 1
    out2, held2 = add(a2, b2)
    assert kp.shared_pipelines() == shared  # new buffers, the same pipeline
    np.testing.assert_array_equal(vk.read(out2), a2 + b2)
    vk.release(held1)
    a3, b3 = a2[:, ::-1].copy(), b2[:, ::-1].copy()
    vk.write(held2[0], a3)
    vk.write(held2[1], b3)
    vk.add(out2, held2[0], held2[1])
    np.testing.assert_array_equal(vk.read(out2), a3 + b3)
    vk.release(held2)


def test_smoke_test_passes(vk):
    result = registry.smoke_test(vk.info.selector)
    assert result.ok, result.detail
    for name in vk.info.types:
        assert name in result.detail


# -- shaders ----------------------------------------------------------------

def _manifest() -> dict:
    return json.loads((vulkan.SHADER_DIR.parent / "variants.json").read_text())


def test_every_variant_ships_spirv():
    names = {v["name"] for v in _manifest()["variants"]}
    for t in vulkan.VULKAN_TYPES:
        for op in ("mul_mat_vec", "mul_mm", "get_rows"):
            assert f"{op}_{t.name.lower()}" in names
    for name in names:
        spv = vulkan.load_spirv(name)
        assert spv[:4] == b"\x03\x02\x23\x07", f"{name}.spv is not SPIR-V"  # magic 0x07230203, little-endian


def test_spirv_built_from_the_current_sources():
    """Every variant's recorded source digest is that of today's GLSL (flags, defines, .comp and the
    .glsl includes) and its shipped .spv is the one the build wrote (sha256): a shader edited without
    ``make shaders``, or a .spv changed by hand, fails here. (``make shaders-check`` recompiles every
    variant with glslc and compares the bytes: 50 s.)"""
    from cooktop.backends.vulkan import build as build_shaders
    assert not build_shaders.unbuilt_variants(), "SPIR-V not built from the current sources; run `make shaders`"
    v = _manifest()["variants"][0]
    assert build_shaders.source_digest({**v, "defines": {**v["defines"], "X": "1"}}) != v["digest"]


def test_variant_table_regenerates_without_losing_variants():
    """``build.py --init`` writes :func:`default_variants`: it must be the shipped table (every
    integer-dot and 16-bit variant included), and every forward op has a shader."""
    from cooktop.backends.optable import OPS
    from cooktop.backends.vulkan import build as build_shaders

    def key(v):
        return {k: x for k, x in v.items() if k not in ("access", "features", "digest", "spv_sha256")}  # build()'s

    assert [key(v) for v in build_shaders.default_variants()] == [key(v) for v in _manifest()["variants"]]
    names = {v["name"] for v in _manifest()["variants"]}
    shader_of = {"matmul": "mul_mat_vec_f32", "get_rows": "get_rows_f32"}
    assert all(shader_of.get(op, op) in names for op in OPS), sorted(set(OPS) - names)


def test_shipped_spirv_access_matches_manifest():
    """The barrier code's per-binding access (variants.json) is what each shipped module declares
    (NonWritable / NonReadable decorations), including gelu_mul, add_bias and rope's freq factors."""
    from cooktop.backends.vulkan import build as build_shaders
    for v in _manifest()["variants"]:
        spv = (vulkan.SHADER_DIR / f"{v['name']}.spv").read_bytes()
        assert build_shaders.spirv_access(spv) == v["access"], v["name"]
    variants = {v["name"]: v for v in _manifest()["variants"]}
    assert variants["gelu_mul"]["access"] == ["r", "r", "rw"]
    assert variants["rope"]["access"] == ["r", "r", "rw", "r"]
    assert variants["attention"]["access"] == ["r", "r", "r", "r", "r", "w"]  # q k v pos kv_start out


def test_manifest_access_and_features():
    """Every variant records its binding access; a variant that needs an optional feature stands
    in for one that needs none (the fallback on devices without it), with the same bindings."""
    variants = {v["name"]: v for v in _manifest()["variants"]}
    for name, v in variants.items():
        assert v["access"] and set(v["access"]) <= {"r", "w", "rw"}, name
        assert "w" in "".join(v["access"]), f"{name} writes nothing"
        if v.get("features"):
            base = variants[v["variant_of"]]
            assert not base.get("features"), name
            assert base["access"] == v["access"], name
            assert set(v["features"]) <= set(vulkan.KP_FEATURES), name
    p16 = [n for n, v in variants.items() if v.get("variant_of")]
    assert {"mul_mat_vec_q4_0_p16", "mul_mat_vec_q8_0_p16"} <= set(p16)


def test_pick_variant_by_features():
    assert vulkan.pick_variant("mul_mat_vec_q4_0", frozenset()) == "mul_mat_vec_q4_0"
    assert vulkan.pick_variant("mul_mat_vec_q4_0", frozenset({"shaderInt8"})) == "mul_mat_vec_q4_0"
    assert vulkan.pick_variant("mul_mat_vec_q4_0", frozenset(vulkan.KP_FEATURES)) == "mul_mat_vec_q4_0_q8"
    no_dot = frozenset(vulkan.KP_FEATURES) - {"shaderIntegerDotProduct"}
    assert vulkan.pick_variant("mul_mat_vec_q4_0", no_dot) == "mul_mat_vec_q4_0_p16"
    assert vulkan.pick_variant("mul_mat_vec_q8_0", no_dot) == "mul_mat_vec_q8_0_p16"
    assert vulkan.pick_variant("mul_mat_vec_q4_k", frozenset(vulkan.KP_FEATURES)) == "mul_mat_vec_q4_k_q8"
    assert vulkan.pick_variant("mul_mat_vec_q4_k", no_dot) == "mul_mat_vec_q4_k"
    assert vulkan.pick_variant("mul_mat_vec_q6_k", frozenset(vulkan.KP_FEATURES)) == "mul_mat_vec_q6_k_q8"
    assert vulkan.pick_variant("mul_mat_vec_q6_k", frozenset(vulkan.KP_FEATURES), "q8_K") == "mul_mat_vec_q6_k_q8k"
    assert vulkan.pick_variant("mul_mat_vec_q6_k", no_dot, "q8_K") == "mul_mat_vec_q6_k"
    assert vulkan.pick_variant("mul_mat_vec_q4_1", frozenset(vulkan.KP_FEATURES)) == "mul_mat_vec_q4_1"
    assert vulkan.pick_variant("add", frozenset(vulkan.KP_FEATURES)) == "add"


@pytest.mark.parametrize("ty", [T.Q4_0, T.Q8_0], ids=lambda t: t.name)
def test_feature_variant_and_fallback_agree(vk, cpu_device, monkeypatch, ty):
    """The 16-bit-storage mat-vec (picked where kp enabled storageBuffer16BitAccess but not
    shaderIntegerDotProduct) and the feature-free one it stands in for both match numpy;
    which one runs follows the features (the integer-dot one: test_vulkan_q8.py)."""
    rng = np.random.default_rng(3)
    shape = (72, 256)
    raw = random_weight(ty, shape, rng)
    x = rng.standard_normal((3, shape[1])).astype(np.float32)
    wc = cpu_device.upload(raw, ty, shape)
    xc, yc = cpu_device.empty((3, shape[1])), cpu_device.empty((3, shape[0]))
    cpu_device.write(xc, x)
    cpu_device.matmul(yc, xc, wc)
    ref = cpu_device.read(yc)
    base = f"mul_mat_vec_{ty.name.lower()}"
    feats16 = vk.features - {"shaderIntegerDotProduct"}
    want_first = base + "_p16" if "storageBuffer16BitAccess" in feats16 else base
    picked = []
    orig = vulkan.pick_variant
    monkeypatch.setattr(vulkan, "pick_variant", lambda n, f, *a: picked.append(orig(n, f, *a)) or picked[-1])
    for feats in (feats16, frozenset()):
        monkeypatch.setattr(vk, "features", feats)
        w = vk.upload(raw, ty, shape)
        xt, y = vk.empty((3, shape[1])), vk.empty((3, shape[0]))
        vk.write(xt, x)
        vk.matmul(y, xt, w)
        assert nmse(vk.read(y), ref) <= 5e-4
    mmv = list(dict.fromkeys(p for p in picked if p.startswith("mul_mat_vec_")))
    assert mmv == [want_first, base], mmv


def _push_block_words(source: str, defines: dict) -> int:
    """Number of 32-bit members of the push-constant block of a .comp file under ``defines``
    (honours plain ``#ifdef NAME`` / ``#else`` / ``#endif`` around the block)."""
    active, stack = [], []
    for line in (GLSL_DIR / source).read_text().splitlines():
        m = re.match(r"\s*#(ifdef|ifndef|if|elif|else|endif)\b\s*(\w*)", line)
        if m and m.group(1) in ("ifdef", "ifndef"):
            stack.append((m.group(2) in defines) == (m.group(1) == "ifdef"))
        elif m and m.group(1) == "if":
            stack.append(None)  # an expression: keep both branches (no push block lives in one)
        elif m and m.group(1) in ("else", "elif"):
            stack[-1] = None if stack[-1] is None else not stack[-1]
        elif m:
            stack.pop()
        elif all(x is not False for x in stack):
            active.append(line)
    blocks = re.findall(r"layout\(push_constant\) uniform \w+ \{([^}]*)\}", "\n".join(active))
    assert len(blocks) == 1, f"{source}: {len(blocks)} push-constant blocks under {defines}"
    return len(re.findall(r"\b(?:uint|int|float)\s+\w+\s*;", blocks[0]))


def test_push_constants_fit_and_match(vk, monkeypatch):
    """Every dispatch pushes exactly the GLSL block's size, and it is <= 128 bytes."""
    variants = {v["name"]: v for v in _manifest()["variants"]}
    seen: dict[str, int] = {}
    orig = vk._dispatch_raw

    def spy(variant, handles, grid, push, spec=None):
        seen[variant] = len(push)
        return orig(variant, handles, grid, push, spec)

    monkeypatch.setattr(vk, "_dispatch_raw", spy)
    from cooktop.backends.vulkan import attention as vk_attention
    monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", False)  # decode on attention.comp, as on GPUs
    _decode_layer_run(vk, n_steps=1)
    monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", True)  # and on the score kernels (CPU drivers)
    _decode_layer_run(vk, n_steps=1)
    xb, yb = vk.zeros((16, 256)), vk.empty((16, 256))
    # 16 rows: the tiled mul_mm (Q4_1: no integer-dot mat-vec, which Q4_0 / the K-quants keep for every row count)
    vk.matmul(yb, xb, vk.upload(random_weight(T.Q4_1, (256, 256), np.random.default_rng(0)), T.Q4_1, (256, 256)))
    vk.read(yb)
    assert {"copy", "fill", "rmsnorm", "rope", "kv_store", "attention", "silu_mul", "add"} <= set(seen)
    assert any(v.startswith("attention_kq") for v in seen)
    assert any(v.startswith("mul_mm_") for v in seen) and any(v.startswith("mul_mat_vec_") for v in seen)
    for variant, n in seen.items():
        words = _push_block_words(variants[variant]["source"], variants[variant]["defines"])
        assert n == words, f"{variant}: host pushes {n} words, GLSL block has {words}"
        assert 4 * n <= vulkan.MAX_PUSH_BYTES
    assert vulkan.pack_push(tuple(range(32))).nbytes == 128
    with pytest.raises(AssertionError):
        vulkan.pack_push(tuple(range(33)))
    assert vulkan.f32_bits(1.0) == 0x3F800000


# -- record once, replay -----------------------------------------------------

def _decode_layer_run(dev, n_steps: int, seed: int = 7):
    """Run ``n_steps`` decode steps of a small llama layer (Q4_0 / Q6_K weights) on ``dev``.

    Per-token values (token id, position) go through ``write`` only, so the op
    list is identical every step. Returns the list of per-step outputs f32 [1, n_embd].
    """
    rng = np.random.default_rng(seed)
    n_embd, n_head, n_head_kv, n_ff, n_ctx, n_vocab = 256, 4, 2, 512, 16, 40
    hd = n_embd // n_head
    kv = n_head_kv * hd
    emb = random_weight(T.Q8_0, (n_vocab, n_embd), rng)
    ws = {name: (random_weight(ty, shape, rng, scale=0.3), ty, shape) for name, ty, shape in (
        ("wq", T.Q4_0, (n_embd, n_embd)), ("wk", T.Q4_K, (kv, n_embd)), ("wv", T.Q6_K, (kv, n_embd)),
        ("wo", T.Q5_0, (n_embd, n_embd)), ("gate", T.Q4_1, (n_ff, n_embd)), ("up", T.Q5_K, (n_ff, n_embd)),
        ("down", T.F16, (n_embd, n_ff)))}
    norm = (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32)
    w = {k: dev.upload(raw, ty, shape) for k, (raw, ty, shape) in ws.items()}
    tok_embd = dev.upload(emb, T.Q8_0, (n_vocab, n_embd))
    norm_t = dev.upload(norm, T.F32, (n_embd,))
    k_cache, v_cache = dev.zeros((n_ctx, kv)), dev.zeros((n_ctx, kv))
    ids, pos = dev.empty((8,), T.I32), dev.empty((8,), T.I32)
    x, h, q, k, v, a = (dev.empty((8, n)) for n in (n_embd, n_embd, n_embd, kv, kv, n_embd))
    g, u = dev.empty((8, n_ff)), dev.empty((8, n_ff))
    outs = []
    for step in range(n_steps):
        dev.write(ids.head(1), np.array([(3 * step + 1) % n_vocab], dtype=np.int32))
        dev.write(pos.head(1), np.array([step], dtype=np.int32))
        i1, p1, x1, h1, q1, k1, v1, a1, g1, u1 = (t.head(1) for t in (ids, pos, x, h, q, k, v, a, g, u))
        dev.get_rows(x1, tok_embd, i1)
        dev.rmsnorm(h1, x1, norm_t, 1e-5)
        dev.matmul(q1, h1, w["wq"])
        dev.matmul(k1, h1, w["wk"])
        dev.matmul(v1, h1, w["wv"])
        dev.rope(q1, q1, p1, hd, hd, 10000.0, 1.0, ROPE_NEOX)
        dev.rope(k1, k1, p1, hd, hd, 10000.0, 1.0, ROPE_NEOX)
        dev.kv_store(k_cache, k1, p1)
        dev.kv_store(v_cache, v1, p1)
        dev.attention(a1, q1, k_cache, v_cache, p1, n_head, n_head_kv, 1.0 / np.sqrt(hd))
        dev.matmul(h1, a1, w["wo"])
        dev.add(x1, x1, h1)
        dev.rmsnorm(h1, x1, norm_t, 1e-5)
        dev.matmul(g1, h1, w["gate"])
        dev.matmul(u1, h1, w["up"])
        dev.silu_mul(g1, g1, u1)
        dev.matmul(h1, g1, w["down"])
        dev.add(x1, x1, h1)
        outs.append(dev.read(x1))
    return outs


def test_replay_cache_replays_decode_steps(vk, cpu_device):
    """Six decode steps: the step's sequence is recorded once and replayed; every step matches numpy."""
    rec0, rep0 = vk.n_recordings, vk.n_replays
    got = _decode_layer_run(vk, n_steps=6)
    ref = _decode_layer_run(cpu_device, n_steps=6)
    # wq is Q4_0: where the integer-dot variant runs, q is computed from 8-bit activations
    # (test_vulkan_q8.py), and this layer's attention logits are large (~100), so the
    # softmax amplifies that error (nmse ~1e-3 by step 5; 1e-13 with float activations)
    bound = 5e-3 if {"shaderIntegerDotProduct", "storageBuffer16BitAccess"} <= vk.features else 5e-4
    for step, (a, b) in enumerate(zip(got, ref)):
        assert nmse(a, b) <= bound, f"step {step}: nmse {nmse(a, b):.2e}"
    assert not np.allclose(got[0], got[1])  # steps differ: per-token values really reached the device
    # step 0 also runs the zeros() fills with it (its own list); steps 1..5 are one identical list
    assert vk.n_recordings - rec0 == 2
    assert vk.n_replays - rep0 == 4


def _recorded(vk, monkeypatch):
    """Spy on the ops recorded into sequences: a list of ("barrier", masks) / ("dispatch", variant)."""
    kp = sys.modules["kp"]
    log = []
    orig_barrier, orig_dispatch = kp.OpGlobalMemoryBarrier, kp.OpDispatch

    def barrier(*masks):
        log.append(("barrier", masks))
        return orig_barrier(*masks)

    def dispatch(algo, push):
        log.append(("dispatch", next(k[0] for k, e in vk._algos.items() if e[0] is algo)))
        return orig_dispatch(algo, push)

    monkeypatch.setattr(kp, "OpGlobalMemoryBarrier", barrier)
    monkeypatch.setattr(kp, "OpDispatch", dispatch)
    return log


def test_barriers_only_where_data_depends(vk, monkeypatch):
    """Barriers per dependent pair of dispatches: none between independent ones (two adds into
    different outputs), one before a read of a written buffer (RAW), before a write of a buffer
    read (WAR) and of one written (WAW); one at the start (earlier submissions) and one before the
    host reads the result."""
    a, b, c, d = (vk.empty((1, 64)) for _ in range(4))
    for t in (a, b, c, d):
        vk.write(t, np.ones((1, 64), dtype=np.float32))
    vk.read(a)
    monkeypatch.setattr(vk, "_seqs", type(vk._seqs)())
    log = _recorded(vk, monkeypatch)
    vk.add(c, a, b)      # c = a + b                       (after the start barrier)
    vk.add(d, a, b)      # independent of the first: no barrier
    vk.add(a, c, d)      # reads c, d (RAW) and writes a, which both read (WAR): one barrier
    vk.add(b, b, b)      # b was read before the last barrier only: none
    vk.copy(b, c)        # writes b, written since the last barrier (WAW): one barrier
    out = vk.read(a)     # copy a -> host tensor: a was written before the last barrier: none;
    np.testing.assert_array_equal(out, 4)  # then compute -> host before the host reads
    kinds = ["B" if k == "barrier" else "D" for k, _ in log]
    assert "".join(kinds) == "BDDBDDBDDB", "".join(kinds)
    assert [v for k, v in log if k == "dispatch"] == ["add", "add", "add", "add", "copy", "copy"]
    cs, ta, hr = vulkan.STAGE_COMPUTE_SHADER, vulkan.STAGE_TRANSFER, vulkan.STAGE_HOST
    assert log[0][1][2] == cs | ta and log[0][1][3] == cs        # start: compute + transfer -> compute
    assert log[3][1][2:] == (cs, cs)                              # compute -> compute
    assert log[-1][1] == (vulkan.ACCESS_SHADER_WRITE, vulkan.ACCESS_HOST_READ, cs, hr)
    np.testing.assert_array_equal(vk.read(b), 2)


def test_replay_records_barriers_once(vk, cpu_device, monkeypatch):
    """A replayed decode step records nothing: its barriers were recorded with it, once."""
    monkeypatch.setattr(vk, "_seqs", type(vk._seqs)())
    b0, r0 = vk.n_barriers, vk.n_recordings
    got = _decode_layer_run(vk, n_steps=3, seed=9)
    ref = _decode_layer_run(cpu_device, n_steps=3, seed=9)
    for x, y in zip(got, ref):  # Q4_0, Q4_K, Q5_K and Q8_0 run on 8-bit activations on Vulkan, numpy in float
        assert nmse(x, y) <= 2e-3
    per_record = (vk.n_barriers - b0) / (vk.n_recordings - r0)
    assert vk.n_recordings - r0 == 2 and per_record >= 2


# -- storage tensors ---------------------------------------------------------

def test_tensors_are_device_only_storage(vk):
    kp = sys.modules["kp"]
    t = vk.empty((4, 8))
    w = vk.upload(np.arange(64, dtype=np.float32), T.F32, (8, 8))
    assert t.handle.tensor_type() == kp.TensorTypes.storage
    assert w.handle.tensor_type() == kp.TensorTypes.storage
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    vk.write(t, data)
    np.testing.assert_array_equal(vk.read(t), data)
    # a write through a head view leaves the other rows alone
    vk.write(t.head(1), -np.ones((1, 8), dtype=np.float32))
    back = vk.read(t)
    np.testing.assert_array_equal(back[0], -1)
    np.testing.assert_array_equal(back[1:], data[1:])
    # two writes to one tensor in a single pending list each reach their op
    s = vk.empty((1, 8))
    vk.write(s, np.ones((1, 8), dtype=np.float32))
    vk.add(t.head(1), s, s)
    vk.write(s, np.full((1, 8), 5, dtype=np.float32))
    vk.add(s, s, s)
    np.testing.assert_array_equal(vk.read(t.head(1)), 2)
    np.testing.assert_array_equal(vk.read(s), 10)
    z = vk.zeros((3, 5), T.I32)
    np.testing.assert_array_equal(vk.read(z), np.zeros((3, 5), dtype=np.int32))


def test_allocations_counted_and_bounded(vk):
    n0, b0 = vk.n_allocs, vk.allocated_bytes
    vk.empty((16, 16))
    vk.upload(np.zeros((4, 34), dtype=np.uint8), T.Q8_0, (4, 32))
    assert vk.n_allocs == n0 + 2
    assert vk.allocated_bytes - b0 == 16 * 16 * 4 + (144 + 16)  # 136 bytes of blocks, padded to 16, + 16
    limit = vk.info.extra["max_storage_buffer_range"]
    with pytest.raises(DeviceOutOfMemoryError, match=str(limit)):
        vk.empty((limit // 4 + 1024,))
    assert vk.n_allocs == n0 + 2  # the refused allocation is not counted


def test_weights_are_not_read_or_written(vk):
    from cooktop.errors import DeviceError
    w = vk.upload(np.ones(32, dtype=np.float32), T.F32, (1, 32))
    with pytest.raises(DeviceError, match="is a weight"):
        vk.read(w)
    with pytest.raises(DeviceError, match="is a weight"):
        vk.write(w, np.zeros(32, dtype=np.float32))
    t = vk.empty((2, 3))
    with pytest.raises(DeviceError, match="write of 5 values"):
        vk.write(t, np.zeros(5, dtype=np.float32))


@pytest.mark.parametrize("file_type", ["Q2_K", "Q3_K"])
def test_low_bit_k_quant_model_runs_on_vulkan(vk, tmp_path, file_type):
    """A synthetic model whose every matrix is Q2_K or Q3_K (tied embeddings: the output matrix is
    the token table) runs entirely on Vulkan, none of it kept on numpy, and its logits match numpy's
    within the quantized bound of the op parity tests (5e-4): a 19-token prompt (the tiled mul_mm)
    then 3 tokens one at a time (mul_mat_vec); the same greedy token at every position."""
    from cooktop import Llama
    from cooktop.tools import synth

    path = tmp_path / f"m-{file_type}.gguf"
    synth.write(path, synth.Shape(256, 2, 4, 2, 512, 600, 256, tied=True), file_type, seed=5)
    toks = [int(t) for t in np.random.default_rng(7).integers(3, 600, 22)]
    out = []
    for device in ("cpu", vk.info.selector):
        llm = Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, device=device, n_gpu_layers=-1)
        try:
            if device != "cpu":
                pl = llm._engine.placement
                assert pl.blocks == [device] * 2 and pl.head == device, pl.notes
                assert not any("stays on" in n for n in pl.notes), pl.notes
            llm.eval(toks[:19])
            for t in toks[19:]:
                llm.eval([t])
            out.append(np.array(llm.scores[:len(toks)], dtype=np.float64))
        finally:
            llm.close()
    ref, got = out
    assert nmse(got, ref) <= 5e-4, f"{file_type}: nmse {nmse(got, ref):.2e}"
    np.testing.assert_array_equal(got.argmax(1), ref.argmax(1))


@pytest.mark.parametrize("ty", [T.F32, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 40])
def test_float_matmul_rows_of_any_length(vk, cpu_device, ty, n_tok):
    """stories260K has n_ff = 172: F32/F16 rows that are not whole 32-value units (mul_mat_vec and mul_mm)."""
    rng = np.random.default_rng(n_tok)
    n_out, n_in = 37, 172
    raw = random_weight(ty, (n_out, n_in), rng)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    outs = []
    for dev in (vk, cpu_device):
        w = dev.upload(raw, ty, (n_out, n_in))
        xt, y = dev.empty((64, n_in)).head(n_tok), dev.empty((64, n_out)).head(n_tok)
        dev.write(xt, x)
        dev.matmul(y, xt, w)
        outs.append(dev.read(y))
    assert nmse(outs[0], outs[1]) <= 1e-7


def test_release_gives_memory_back(vk, stories):
    """Load/close cycles return device memory (no false out-of-memory in bench sweeps)."""
    from cooktop import Llama
    from cooktop.backends import chunked

    registry.smoke_test(vk.info.selector)  # once per process; its small buffers stay
    chunked.release_scratch(vk)  # what earlier tests' ops left (a closing model gives it back)
    before = vk.allocated_bytes
    for _ in range(3):
        llm = Llama(model_path=str(stories), n_ctx=64, verbose=False, device=vk.info.selector, n_gpu_layers=-1)
        assert vk.allocated_bytes > before
        out = llm.create_completion("Once upon a time", max_tokens=4, temperature=0)["choices"][0]["text"]
        llm.close()
        assert vk.allocated_bytes == before
    assert out.startswith(", there was")


def test_release_on_del_without_gc(vk, stories):
    """``del llm`` (no close(), cyclic collector off) gives the weights, scratch and KV cache
    memory back at once; so does dropping an extra sequence."""
    import gc

    from cooktop import Llama
    from cooktop.backends import chunked

    registry.smoke_test(vk.info.selector)
    chunked.release_scratch(vk)  # what earlier tests' ops left (a closing model gives it back)
    before = vk.allocated_bytes
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            llm = Llama(model_path=str(stories), n_ctx=64, verbose=False, device=vk.info.selector,
                        n_gpu_layers=-1)
            out = llm.create_completion("Once upon a time", max_tokens=4, temperature=0)["choices"][0]["text"]
            loaded = vk.allocated_bytes
            seq = llm._engine.new_sequence()
            # K and V of 5 blocks x n_ctx 64 x n_head_kv 4 x head_dim 8, f16 (the default cache type)
            assert vk.allocated_bytes - loaded == llm._engine.cfg.kv_cache_bytes(64, 2) == 2 * 5 * 64 * 32 * 2
            del seq
            assert vk.allocated_bytes == loaded
            del llm
            assert vk.allocated_bytes == before
    finally:
        gc.enable()
    assert out.startswith(", there was")


#: The quantized type each subgroup size is tested with beside F32 (every path once: the
#: integer-dot variants on 8-bit activations, Q4_0 and Q8_0, and the 256-value super-blocks,
#: Q4_K and Q6_K): each new size compiles its pipelines cold on lavapipe (4-14 s a type).
SUBGROUP_TYPES = {16: T.Q4_0, 32: T.Q8_0, 64: T.Q4_K, 128: T.Q6_K}


@pytest.mark.slow(reason="a new specialization constant: lavapipe compiles the mat-vec pipelines cold (up to 18 s)")
@pytest.mark.parametrize("subgroup", list(SUBGROUP_TYPES))
def test_mat_vec_at_the_subgroup_sizes_of_real_gpus(vk, subgroup):
    """mul_mat_vec's workgroup is the device's subgroup size (specialization constant 0): the
    sizes of Intel (16), NVIDIA (32), AMD GCN (64) and Adreno (128) here, where lavapipe's
    subgroups have 8 lanes, so each workgroup is several subgroups and the reduction takes its
    shared-memory step. Against numpy, float rows with a tail (F32) at every size and one
    quantized path per size (:data:`SUBGROUP_TYPES`); the reduction and the unit loop are shared
    by every type."""
    import dataclasses

    from cooktop.backends.reference import dequantize_activations_ref
    from cooktop.backends.vulkan.device import VULKAN_TYPES, VulkanDevice
    from cooktop.format.quants import dequantize

    dev = VulkanDevice(dataclasses.replace(vk.info, subgroup_size=subgroup))
    try:
        assert int(dev._mmv_spec[0]) == subgroup
        rng = np.random.default_rng(subgroup)
        for ty in (T.F32, SUBGROUP_TYPES[subgroup]):
            assert ty in VULKAN_TYPES
            n_in = 512 if ty.name.endswith("_K") else 170 if ty == T.F32 else 160
            raw = random_weight(ty, (45, n_in), rng)
            x = rng.standard_normal((2, n_in)).astype(np.float32)
            xt, y = dev.empty((2, n_in)), dev.empty((2, 45))
            dev.write(xt, x)
            dev.matmul(y, xt, dev.upload(raw, ty, (45, n_in)))
            xr = dequantize_activations_ref(x, dev.activation_format(ty, 2, (45, n_in)))
            ref = xr @ dequantize(raw, ty, (45, n_in)).astype(np.float64).T
            assert nmse(dev.read(y), ref) < 1e-10, ty.name
    finally:
        dev.close()


def test_lavapipe_caps_n_ctx_at_its_attention_limit(vk, caplog):
    """lavapipe stops a shader invocation's loops after 65535 iterations, so the score kernels are right
    up to ``lavapipe_max_keys(head_dim)`` keys only: the device says so and the loader caps n_ctx there,
    with a warning naming both figures, instead of computing a longer context's attention wrong."""
    import logging

    from conftest import SHARED

    from cooktop.runtime.loader import load_model

    if "llvmpipe" not in vk.info.name.lower():
        pytest.skip(f"{vk.info.name} is not lavapipe: no such limit")
    assert vk.max_attention_keys(128) == 65535 // 129 * 64 == 32512
    assert vk.max_attention_keys(64) == 64512 and vk.max_attention_keys(16) == 65472
    assert registry.open_device("cpu").max_attention_keys(128) is None
    with caplog.at_level(logging.WARNING, logger="cooktop"):
        m = load_model(SHARED / "models" / "tiny" / "tiny-F32.gguf", n_ctx=70000, n_batch=64, device=vk.info.selector)
    try:
        cap = vk.max_attention_keys(m.cfg.head_dim)
        assert m.n_ctx == m.model.n_ctx == cap < 70000
    finally:
        m.model.close()
    assert any(f"at most {cap} keys at head_dim {m.cfg.head_dim}" in r.getMessage() and f"n_ctx 70000 -> {cap}"
               in r.getMessage() for r in caplog.records)
