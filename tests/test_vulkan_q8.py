"""The Vulkan integer-dot mat-vec on 8-bit activations (quantize_q8_1.comp, quantize_q8_K.comp,
mul_mat_vec_q8.comp, backends/vulkan/q8.py).

The variant runs where kp enabled shaderIntegerDotProduct and 16-bit storage (lavapipe has
both); it is exact against numpy on the same 8-bit activations (``dequantize_q8_1_ref``, or
``dequantize_q8_K_ref`` for the K-quants' block_q8_K variants of ``COOKTOP_VULKAN_Q8K=1``) and
within the quantized bound of the float product at odd shapes; without the feature the
float variants run; an activation is quantized once per pending op list while unchanged,
and again after anything writes it.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import skip_or_fail
from gguf import GGMLQuantizationType as T

from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.backends.reference import dequantize_activations_ref, quantize_q8_K_ref
from cooktop.backends.tensor import DeviceBuffer
from cooktop.format.quants import dequantize, random_weight

vulkan = pytest.importorskip("cooktop.backends.vulkan.device")
from cooktop.backends.vulkan.q8 import (  # noqa: E402
    Q8_K_BLOCK_WORDS,
    dequantize_q8_1_ref,
    input_format,
    quantize_q8_1_ref,
    takes_q8_1,
)
from cooktop.backends.vulkan.shaders import variant_info  # noqa: E402

#: nmse of the integer-dot result against the float product (x not quantized): 8-bit
#: activations cost ~1e-5 on Gaussian data; same bound as the OpenCL 8-bit kernels.
QUANT_BOUND = 5e-4
#: nmse against the float64 product of the same 8-bit activations (float32 block sums).
EXACT_BOUND = 1e-10
IDOT = {"shaderIntegerDotProduct", "storageBuffer16BitAccess"}
K_QUANTS = ("q4_k", "q5_k", "q6_k")


@pytest.fixture(scope="module")
def vk():
    res = registry.probe("vulkan")
    if not res.available:
        skip_or_fail("vulkan", f"{res.reason}; to enable: {res.hint}")
    return registry.open_device(res.devices[0].selector)


@pytest.fixture
def idot(vk):
    if not IDOT <= vk.features:
        pytest.skip(f"{vk.info.name} lacks {sorted(IDOT - vk.features)}: the integer-dot variant cannot run")
    return vk


def _matvec(dev, w, x, n_out, cap=None):
    """y = x @ w^T on ``dev`` with x a head() view of a root of ``cap`` rows."""
    n, n_in = x.shape
    xt, y = dev.empty((cap or n, n_in)).head(n), dev.empty((n, n_out))
    dev.write(xt, x)
    dev.matmul(y, xt, w)
    return dev.read(y)


def test_reference_quantizer():
    """quantize_q8_1_ref: |q| <= 127, d = max|x| / 127, s = d * sum(q), zero blocks stay zero."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[1, 32:64] = 0
    q, d, s = quantize_q8_1_ref(x)
    assert q.dtype == np.int8 and np.abs(q.astype(int)).max() == 127
    np.testing.assert_allclose(d[0], np.abs(x[0].reshape(3, 32)).max(axis=1) / 127, rtol=1e-6)
    assert d[1, 1] == 0 and not q[1, 32:64].any() and s[1, 1] == 0
    np.testing.assert_allclose(s, d * q.reshape(3, 3, 32).sum(-1), rtol=1e-6)
    assert np.abs(dequantize_q8_1_ref(x) - x).max() <= d.max() / 2 + 1e-6
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_1_ref(np.zeros((1, 40), np.float32))


def test_variant_manifest():
    """The integer-dot variants stand in for the float ones, need the dot-product and 16-bit
    storage features (read from their SPIR-V), and take the 8-bit copy of x: block_q8_1 for
    every integer-dot type, block_q8_K for the K-quants' ``_q8k`` ones."""
    for ty in ("q4_0", "q8_0", *K_QUANTS):
        name = f"mul_mat_vec_{ty}_q8"
        info = variant_info(name)
        assert info["variant_of"] == f"mul_mat_vec_{ty}" and takes_q8_1(name) and input_format(name) == "q8_1"
        assert set(info["features"]) == IDOT
        assert not takes_q8_1(f"mul_mat_vec_{ty}") and not takes_q8_1(f"mul_mat_vec_{ty}_p16")
        assert input_format(f"mul_mat_vec_{ty}") is None
    for ty in K_QUANTS:
        info = variant_info(f"mul_mat_vec_{ty}_q8k")
        assert info["variant_of"] == f"mul_mat_vec_{ty}" and info["defines"]["Q8K"] == "1"
        assert input_format(f"mul_mat_vec_{ty}_q8k") == "q8_K" and set(info["features"]) == IDOT
    assert not variant_info("mul_mat_vec_q4_0_q8k") and not variant_info("mul_mat_vec_q8_0_q8k")
    assert vulkan.binding_access("quantize_q8_1") == ("r", "w")
    assert vulkan.binding_access("quantize_q8_K") == ("r", "w")


@pytest.mark.parametrize("feats, want", [
    (frozenset(vulkan.KP_FEATURES), "_q8"),
    (frozenset(IDOT), "_q8"),
    (frozenset(vulkan.KP_FEATURES) - {"shaderIntegerDotProduct"}, "_p16"),
    (frozenset({"shaderIntegerDotProduct"}), ""),
    (frozenset(), ""),
])
def test_pick_integer_dot_by_features(feats, want):
    for ty in ("q4_0", "q8_0"):
        assert vulkan.pick_variant(f"mul_mat_vec_{ty}", feats) == f"mul_mat_vec_{ty}{want}"
        assert vulkan.pick_variant(f"mul_mat_vec_{ty}", feats, "q8_K") == f"mul_mat_vec_{ty}{want}"  # no q8_K one
    for ty in K_QUANTS:
        k_want = want if want == "_q8" else ""
        assert vulkan.pick_variant(f"mul_mat_vec_{ty}", feats) == f"mul_mat_vec_{ty}" + k_want
        assert vulkan.pick_variant(f"mul_mat_vec_{ty}", feats, "q8_1") == f"mul_mat_vec_{ty}" + k_want
        assert vulkan.pick_variant(f"mul_mat_vec_{ty}", feats, "q8_K") == f"mul_mat_vec_{ty}" + (k_want and "_q8k")


def test_q8k_setting_picks_the_format(vk, monkeypatch):
    """COOKTOP_VULKAN_Q8K (default off) moves the K-quants, and only them, to block_q8_K; the
    format the device reports is the one its variant reads."""
    has = IDOT <= vk.features
    for setting, k_fmt in ((None, "q8_1"), ("0", "q8_1"), ("1", "q8_K")):
        if setting is None:
            monkeypatch.delenv("COOKTOP_VULKAN_Q8K", raising=False)
        else:
            monkeypatch.setenv("COOKTOP_VULKAN_Q8K", setting)
        for ty in (T.Q4_K, T.Q5_K, T.Q6_K):
            assert vk.activation_format(ty, 1) == vk.activation_format(ty, 64) == (k_fmt if has else None)
            assert vk.quantizes_activations(ty, 3) == has
        for ty in (T.Q4_0, T.Q8_0):
            assert vk.activation_format(ty, 1) == ("q8_1" if has else None)
        for ty in (T.F32, T.F16, T.Q4_1, T.Q5_0, T.Q5_1, T.MXFP4):
            assert vk.activation_format(ty, 1) is None and not vk.quantizes_activations(ty, 1)


def _raw_words(dev, buf, n_words):
    """The first ``n_words`` uint32 words of kp tensor ``buf`` (after everything pending ran)."""
    rb = dev._tensor(np.zeros(int(buf.size()), dtype=np.uint32), "host")
    dev._dispatch_raw("copy", (buf, rb), dev._stride_grid(n_words, int(buf.size())), (n_words,))
    dev._pending.append(("host_read", rb, ()))
    dev.flush()
    return np.array(rb.data()[:n_words]).view(np.uint32)


def test_quantize_q8_K_bytes(idot):
    """quantize_q8_K.comp writes exactly reference.quantize_q8_K_ref's block_q8_K (qs, int16 bsums,
    d) in its 19-uvec4 records: rows of 256 .. 2560 values, an all-zero super-block, ties of
    |x| with both signs (the first one sets the sign of d), values that round to +-127."""
    dev = idot
    rng = np.random.default_rng(11)
    for n, n_in in ((1, 256), (3, 768), (2, 2560)):
        x = (rng.standard_normal((n, n_in)) * rng.uniform(0.1, 30)).astype(np.float32)
        if n_in >= 768:
            x[1, 256:512] = 0
            x[0, 256:512] = np.clip(x[0, 256:512], -7, 7)
            x[0, 300], x[0, 310] = -7.5, 7.5  # tie: the first (negative) wins
        xt = dev.empty((4, n_in)).head(n)
        dev.write(xt, x)
        buf = dev._q8.input(xt, n, n_in, 4, "q8_K")
        nb = n * n_in // 256
        rec = _raw_words(dev, buf, nb * Q8_K_BLOCK_WORDS).reshape(nb, Q8_K_BLOCK_WORDS)
        q, d, bs = quantize_q8_K_ref(x)
        np.testing.assert_array_equal(rec[:, :64].copy().view(np.int8).reshape(n, n_in), q)
        np.testing.assert_array_equal(rec[:, 64:72].copy().view(np.int16).reshape(n, n_in // 16), bs)
        np.testing.assert_array_equal(rec[:, 72].view(np.float32).reshape(n, n_in // 256), d)
        assert not rec[:, 73:].any()
        if n_in >= 768:
            assert d[1, 1] == 0 and not q[1, 256:512].any()
            assert d[0, 1] > 0  # -max / 127 of the first largest |x| (-7.5)
    with pytest.raises(ValueError, match="multiple of 256"):
        dev._q8.input(dev.empty((1, 96)), 1, 96, 1, "q8_K")


@pytest.mark.parametrize("q8k", ["0", "1"], ids=["q8_1", "q8_K"])
@pytest.mark.parametrize("ty", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_matvec_exact_on_8bit_activations(idot, monkeypatch, ty, q8k):
    """Odd shapes, 1-7 tokens, head() views: exact on the 8-bit activations (block_q8_1, or
    block_q8_K for the K-quants with COOKTOP_VULKAN_Q8K=1), and within the quantized bound of the
    float product. Rows of n_in % 256 != 0 go block by block, the others in aligned groups of 8
    blocks, with x loaded once per workgroup (512) or per group (2560: more groups than
    invocations where the workgroup is 8 or 16 wide). Q6_K super-blocks (210 bytes) start at
    every even offset mod 16 (rows of 3 and 5 super-blocks: 630 and 1050 bytes)."""
    dev = idot
    monkeypatch.setenv("COOKTOP_VULKAN_Q8K", q8k)
    fmt = "q8_K" if q8k == "1" and ty in (T.Q4_K, T.Q5_K, T.Q6_K) else "q8_1"
    assert dev.activation_format(ty, 1) == fmt
    rng = np.random.default_rng(int(ty))
    q0 = dev._q8.n_quantized
    shapes = ((1, 32, 1), (3, 96, 2), (67, 224, 7), (129, 32 * 13, 1), (1000, 512, 3), (37, 2560, 2), (9, 8192, 1))
    if ty in (T.Q4_K, T.Q5_K, T.Q6_K):  # whole super-blocks: one group of 8 units each
        shapes = ((1, 256, 1), (67, 768, 7), (1000, 512, 3), (37, 2560, 2), (9, 8192, 1), (131, 1280, 3))
    for n_out, n_in, n in shapes:
        raw = random_weight(ty, (n_out, n_in), rng)
        wf = dequantize(raw, ty, (n_out, n_in)).astype(np.float64)
        x = (rng.standard_normal((n, n_in)) * 2).astype(np.float32)
        got = _matvec(dev, dev.upload(raw, ty, (n_out, n_in)), x, n_out, cap=7)
        assert got.shape == (n, n_out)
        assert nmse(got, dequantize_activations_ref(x, fmt) @ wf.T) <= EXACT_BOUND, (n_out, n_in, n)
        if n_out * n >= 129:
            assert nmse(got, x.astype(np.float64) @ wf.T) <= QUANT_BOUND, (n_out, n_in, n)
    assert dev._q8.n_quantized - q0 == len(shapes)  # the variant really ran: one quantization per matmul


def test_one_activation_in_both_formats(idot, monkeypatch):
    """With COOKTOP_VULKAN_Q8K=1 an activation read by a Q4_0 and a Q6_K matmul has one copy of
    each format (each quantized once, reused by the next matmul of its format), both exact."""
    dev = idot
    monkeypatch.setenv("COOKTOP_VULKAN_Q8K", "1")
    rng = np.random.default_rng(8)
    n = 512
    raws = {ty: random_weight(ty, (33, n), rng) for ty in (T.Q4_0, T.Q6_K)}
    ws = {ty: dev.upload(r, ty, (33, n)) for ty, r in raws.items()}
    x = rng.standard_normal((2, n)).astype(np.float32)
    xt = dev.empty((2, n))
    dev.write(xt, x)
    ys = [dev.empty((2, 33)) for _ in range(4)]
    q0 = dev._q8.n_quantized
    for y, ty in zip(ys, (T.Q4_0, T.Q6_K, T.Q4_0, T.Q6_K)):
        dev.matmul(y, xt, ws[ty])
    assert dev._q8.n_quantized == q0 + 2
    for y, ty, fmt in zip(ys, (T.Q4_0, T.Q6_K) * 2, ("q8_1", "q8_K") * 2):
        wf = dequantize(raws[ty], ty, (33, n)).astype(np.float64)
        assert nmse(dev.read(y), dequantize_activations_ref(x, fmt) @ wf.T) <= EXACT_BOUND
    assert {(xt.handle, "q8_1"), (xt.handle, "q8_K")} <= set(dev._q8._bufs)
    before = dev.allocated_bytes
    dev.release([xt])
    assert not any(k[0] is xt.handle for k in dev._q8._bufs)
    assert before - dev.allocated_bytes >= 4 * 2 * n // 256 * Q8_K_BLOCK_WORDS  # both copies freed


@pytest.mark.parametrize("ty", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_fallback_without_the_feature(vk, monkeypatch, ty):
    """Without shaderIntegerDotProduct the float variant runs (no quantization) and gives the
    float product; with it (where the device has it) the 8-bit one, on the same data."""
    rng = np.random.default_rng(5)
    raw = random_weight(ty, (131, 256), rng)
    wf = dequantize(raw, ty, (131, 256)).astype(np.float64)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    w = vk.upload(raw, ty, (131, 256))
    has = IDOT <= vk.features
    # every row count (a prompt gets its tokens' one-at-a-time sums); Q4_1 has no integer-dot variant
    assert vk.quantizes_activations(ty, 1) == vk.quantizes_activations(ty, 7) == vk.quantizes_activations(ty, 64) \
        == has
    assert not vk.quantizes_activations(T.Q4_1, 1)
    monkeypatch.setattr(vk, "features", vk.features - {"shaderIntegerDotProduct"})
    assert not vk.quantizes_activations(ty, 1)
    q0 = vk._q8.n_quantized
    got = _matvec(vk, w, x, 131)
    assert vk._q8.n_quantized == q0
    assert nmse(got, x.astype(np.float64) @ wf.T) <= 1e-10
    monkeypatch.undo()
    if IDOT <= vk.features:
        got8 = _matvec(vk, w, x, 131)
        assert vk._q8.n_quantized == q0 + 1
        assert nmse(got8, dequantize_activations_ref(x, vk.activation_format(ty, 2)) @ wf.T) <= EXACT_BOUND


def test_disable_features_env(vk, monkeypatch):
    """COOKTOP_VULKAN_DISABLE_FEATURES removes features from a newly opened device's set."""
    monkeypatch.setenv("COOKTOP_VULKAN_DISABLE_FEATURES", "shaderIntegerDotProduct, storageBuffer16BitAccess")
    dev = vulkan.VulkanDevice(vk.info)
    try:
        assert not dev.features & {"shaderIntegerDotProduct", "storageBuffer16BitAccess"}
        assert dev.features == vk.features - {"shaderIntegerDotProduct", "storageBuffer16BitAccess"}
    finally:
        dev.close()


def test_one_quantization_per_input(idot):
    """q, k, v-like matmuls on one activation quantize it once; any change to it (host write,
    an op writing it, a longer view, a new pending list) quantizes again, never a stale copy."""
    dev = idot
    n = 256
    rng = np.random.default_rng(3)
    raws = [random_weight(T.Q4_0, (40 + i, n), rng) for i in range(3)]
    ws = [dev.upload(r, T.Q4_0, (40 + i, n)) for i, r in enumerate(raws)]
    wfs = [dequantize(r, T.Q4_0, (40 + i, n)).astype(np.float64) for i, r in enumerate(raws)]
    x = dev.empty((4, n))
    ys = [dev.empty((4, 40 + i)) for i in range(3)]
    other = dev.empty((4, n))
    normw = dev.upload(np.ones(n, np.float32), T.F32, (n,))

    def run_all(rows, expect_x):
        for w, y in zip(ws, ys):
            dev.matmul(y.head(rows), x.head(rows), w)
        for wf, y in zip(wfs, ys):
            assert nmse(dev.read(y.head(rows)), dequantize_q8_1_ref(expect_x) @ wf.T) <= EXACT_BOUND

    a = rng.standard_normal((1, n)).astype(np.float32)
    dev.write(x.head(1), a)
    q0 = dev._q8.n_quantized
    run_all(1, a)
    assert dev._q8.n_quantized == q0 + 1  # three matmuls, one quantization
    b = rng.standard_normal((2, n)).astype(np.float32)
    dev.write(x.head(2), b)
    dev.matmul(ys[0].head(1), x.head(1), ws[0])
    dev.matmul(ys[1].head(2), x.head(2), ws[1])  # longer view than the copy holds
    assert dev._q8.n_quantized == q0 + 3
    assert nmse(dev.read(ys[1].head(2)), dequantize_q8_1_ref(b) @ wfs[1].T) <= EXACT_BOUND
    dev.write(other, np.tile(a, (4, 1)))
    dev.matmul(ys[0].head(1), x.head(1), ws[0])
    dev.rmsnorm(x.head(1), x.head(1), normw, 1e-5)  # an op writing x in place
    dev.matmul(ys[1].head(1), x.head(1), ws[1])
    dev.add(x.head(1), x.head(1), other.head(1))
    dev.matmul(ys[2].head(1), x.head(1), ws[2])
    after_norm = dev.read(x.head(1))
    assert nmse(dev.read(ys[2].head(1)), dequantize_q8_1_ref(after_norm) @ wfs[2].T) <= EXACT_BOUND
    xb = b[:1].astype(np.float64)
    normed = (xb / np.sqrt((xb * xb).mean() + 1e-5)).astype(np.float32)
    assert nmse(dev.read(ys[1].head(1)), dequantize_q8_1_ref(normed) @ wfs[1].T) <= 1e-6
    assert dev._q8.n_quantized == q0 + 6


def test_release_frees_the_copy(idot):
    """Releasing an activation destroys its 8-bit copy: allocated_bytes returns to before."""
    dev = idot
    before = dev.allocated_bytes
    rng = np.random.default_rng(1)
    with DeviceBuffer(dev, "q8") as buf:
        w = buf.upload(random_weight(T.Q8_0, (33, 64), rng), T.Q8_0, (33, 64))
        x, y = buf.empty((3, 64)), buf.empty((3, 33))
        dev.write(x, rng.standard_normal((3, 64)).astype(np.float32))
        dev.matmul(y, x, w)
        dev.read(y)
        assert (x.handle, "q8_1") in dev._q8._bufs
    assert dev.allocated_bytes == before
    assert (x.handle, "q8_1") not in dev._q8._bufs


@pytest.mark.parametrize("check", [True, False])
def test_graph_quantizes_its_own_inputs(idot, monkeypatch, check):
    """A graph records the quantization of its inputs even when a copy made before the scope
    (same pending list) was still current, so a replay issues exactly the recorded ops (the
    replay check passes) and a copy made before a replayed graph is not reused after it."""
    dev = idot
    monkeypatch.setattr(dev, "graph_check", check)
    n = 256
    rng = np.random.default_rng(5)
    raw = random_weight(T.Q4_0, (24, n), rng)
    w = dev.upload(raw, T.Q4_0, (24, n))
    wf = dequantize(raw, T.Q4_0, (24, n)).astype(np.float64)
    x, y, y2 = dev.empty((1, n)), dev.empty((1, 24)), dev.empty((1, 24))
    normw = dev.upload(np.ones(n, np.float32), T.F32, (n,))
    key = ("q8-graph", x.serial, y.serial)
    for step in range(3):
        a = rng.standard_normal((1, n)).astype(np.float32)
        dev.write(x, a)
        dev.matmul(y2, x, w)  # quantizes x before the scope, in the same pending list
        with dev.graph(key) as issue:
            if issue:
                dev.matmul(y, x, w)
                dev.rmsnorm(x, x, normw, 1e-5)  # the graph writes x
        dev.matmul(y2, x, w)  # after the graph: x changed, its copy must be made again
        got_y, got_y2 = dev.read(y), dev.read(y2)
        assert nmse(got_y, dequantize_q8_1_ref(a) @ wf.T) <= EXACT_BOUND, step
        xn = a.astype(np.float64)
        xn = (xn / np.sqrt((xn * xn).mean() + 1e-5)).astype(np.float32)
        assert nmse(got_y2, dequantize_q8_1_ref(xn) @ wf.T) <= 1e-6, step
    assert dev.n_graph_replays >= 2


def test_grown_copy_replaces_the_old_one(idot):
    """An activation root quantized at a larger width gets a larger 8-bit copy; the smaller one is
    destroyed after the next flush (it may be bound by what is pending until then), so
    allocated_bytes counts only the new one."""
    dev = idot
    root = dev.empty((4, 256))
    before = dev.allocated_bytes
    small = dev._q8.input(root.head(1), 1, 64, 2)  # rows of 64 values, 2 rows of capacity
    dev.flush()
    assert dev.allocated_bytes - before == 4 * int(small.size())
    big = dev._q8.input(root.head(2), 2, 256, 4)
    assert big is not small and int(big.size()) > int(small.size())
    dev.flush()
    assert dev.allocated_bytes - before == 4 * int(big.size())
    assert small not in dev._tensors and big in dev._tensors
    assert dev._q8.retired == []
