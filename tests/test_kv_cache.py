"""KV cache types (f32, f16, bf16, q8_0, q4_0, ...): kv_store and attention on every backend against a
float64 reference on the same rounded cache, the option rules (llama.cpp's), and the bytes the budgets
count. End-to-end comparisons with llama-cpp-python are in test_kv_llama_cpp.py."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from cooktop.backends.base import nmse
from cooktop.backends.cpu import quants as cpu_quants
from cooktop.backends.reference import quantize_kv
from cooktop.errors import DeviceError, UnsupportedOpError
from cooktop.format.kvtypes import KV_TYPES, KVConfig, KVTypeError, parse_flash_attn, parse_kv_type

#: (n_head, n_head_kv, head_dim, n_cells): odd head counts, a head_dim of whole q8_0/q4_0 blocks that is
#: no power of two, and one of 40 (float types only).
SHAPES = [(6, 2, 96, 41), (3, 3, 40, 19)]
#: The attention paths of :func:`_case` (all with flash attention on and off, but "first": one row).
PATHS = ["prompt", "decode", "first", "window", "batched", "long", "sinks"]


def _stored(x: np.ndarray, t: T) -> np.ndarray:
    """``x`` as the cache holds it (quantized then dequantized), float64."""
    raw = quantize_kv(x, t)
    out = np.empty(x.shape, dtype=np.float32)
    cpu_quants.dequantize_rows(raw, t, x.shape[1], out)
    return out.astype(np.float64)


def _reference(q, k, v, pos, starts, n_head, n_head_kv, scale, window, sinks=None):
    """float64 causal GQA attention over rows starts[i]..pos[i] (and the window); ``sinks``: one more
    logit per head in each denominator (ggml_soft_max_add_sinks)."""
    n, width = q.shape
    hd = width // n_head
    g = n_head // n_head_kv
    out = np.zeros((n, width))
    for i in range(n):
        lo = starts[i] if window == 0 else max(starts[i], pos[i] - window + 1)
        for h in range(n_head):
            hk = h // g
            kk = k[lo:pos[i] + 1, hk * hd:(hk + 1) * hd]
            vv = v[lo:pos[i] + 1, hk * hd:(hk + 1) * hd]
            s = kk @ q[i, h * hd:(h + 1) * hd].astype(np.float64) * scale
            m = s.max() if sinks is None else max(s.max(), sinks[h])
            p = np.exp(s - m)
            den = p.sum() + (0.0 if sinks is None else np.exp(sinks[h] - m))
            out[i, h * hd:(h + 1) * hd] = (p / den) @ vv
    return out


def _case(d, tk: T, tv: T, shape, path: str, seed: int = 0, flash: bool = True):
    """``attention`` (``path`` "sinks": ``attention_sinks``) on ``d`` with the given kernel choice, and the
    float64 reference over the cache as stored: ``(got, want)``."""
    n_head, n_head_kv, hd, n_cells = shape
    rng = np.random.default_rng(seed)
    kv_dim = n_head_kv * hd
    k = (rng.standard_normal((n_cells, kv_dim)) * 0.7).astype(np.float32)
    v = rng.standard_normal((n_cells, kv_dim)).astype(np.float32)
    kc, vc = d.zeros((n_cells, kv_dim), tk), d.zeros((n_cells, kv_dim), tv)
    cells = rng.permutation(n_cells).astype(np.int32)  # rows written out of order, in two calls
    for part in (cells[:7], cells[7:]):
        xk, xv, pt = d.empty((len(part), kv_dim)), d.empty((len(part), kv_dim)), d.empty((len(part),), T.I32)
        d.write(xk, k[part])
        d.write(xv, v[part])
        d.write(pt, part)
        d.kv_store(kc, xk, pt)
        d.kv_store(vc, xv, pt)
    if path == "decode":
        pos = np.array([n_cells - 1], np.int32)
    elif path == "first":  # one row attended: out is V's stored row itself
        pos = np.array([0], np.int32)
    elif path == "long":  # every row a query (query tiles, the last one partial), two sequences
        pos = np.arange(n_cells, dtype=np.int32)
    else:
        pos = np.array(sorted(rng.choice(np.arange(3, n_cells), 5, replace=False)), np.int32)
    window = 6 if path == "window" else 0
    starts = np.zeros(len(pos), np.int32)
    if path in ("batched", "long"):  # two sequences in one cache: the second owns the rows from 12 on
        starts = np.where(pos >= 12, 12, 0).astype(np.int32)
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    qt, out, pt = d.empty(q.shape), d.empty(q.shape), d.empty((len(pos),), T.I32)
    d.write(qt, q)
    d.write(pt, pos)
    st = None
    if path in ("batched", "long"):
        st = d.empty((len(pos),), T.I32)
        d.write(st, starts)
    scale = 1.0 / np.sqrt(hd)
    sinks = None
    if path == "sinks":  # gpt-oss: window and sinks together, one sink above every score
        window = 9
        sinks = (rng.standard_normal(n_head) * 2).astype(np.float32)
        sinks[0] = 30.0
        sk = d.empty((n_head,))
        d.write(sk, sinks)
        d.attention_sinks(out, qt, kc, vc, pt, sk, n_head, n_head_kv, scale, window, None, flash=flash)
    else:
        d.attention(out, qt, kc, vc, pt, n_head, n_head_kv, scale, window, st, flash=flash)
    got = d.read(out)
    want = _reference(q, _stored(k, tk), _stored(v, tv), pos, starts, n_head, n_head_kv, scale, window, sinks)
    return got, want


def _stores(d, t: T) -> bool:
    return t.name in d.info.kv_types


@pytest.mark.parametrize("t", KV_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path,flash", [(p, f) for f in (True, False) for p in PATHS if f or p != "first"],
                         ids=lambda v: v if isinstance(v, str) else "fa" if v else "nofa")
def test_kv_types_attention_parity(any_device, monkeypatch, t, path, flash):
    """Each cache type (K and V alike) on each path at odd shapes, with the flash kernel and without
    (scores materialised), against float64 attention over the cache as llama.cpp's quantize_row_*_ref /
    fp16 / bf16 rounding stores it: a device that rounds one value differently is caught (the "first"
    path returns V's stored row itself)."""
    d = any_device
    if path == "sinks" and "attention_sinks" not in d.info.ops:
        pytest.skip(f"{d.info.selector} has no attention_sinks")
    if not _stores(d, t):
        assert "KV cache" in d.supports_op("attention", t)
        with pytest.raises(UnsupportedOpError):
            d.empty((8, 64), t)
        return
    # a CPU Vulkan driver runs flash attention through the score kernels: there its flash kernels as well
    flash_kernels_too = False
    if flash and d.info.selector.startswith("vulkan"):
        from cooktop.backends.vulkan import attention as vk_attention
        flash_kernels_too = vk_attention.scores_flash(d)
    for default in (True, False) if flash_kernels_too else (True,):
        if not default:
            monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", False)
        for shape in SHAPES:
            if shape[2] % GGML_QUANT_SIZES[t][0]:
                continue
            got, want = _case(d, t, t, shape, path, flash=flash)
            assert nmse(got, want) < 1e-10, \
                f"{t.name} {shape} {path} on {d.info.selector} ({default}): nmse {nmse(got, want):.2e}"


@pytest.mark.parametrize("tk,tv", [(T.F16, T.Q8_0), (T.Q4_0, T.F32), (T.Q8_0, T.BF16)], ids=str)
def test_kv_types_k_and_v_independent(any_device, tk, tv):
    d = any_device
    if not (_stores(d, tk) and _stores(d, tv)):
        pytest.skip(f"{d.info.selector} stores {d.info.kv_types}")
    got, want = _case(d, tk, tv, SHAPES[0], "prompt", seed=3)
    assert nmse(got, want) < 1e-10


def test_kv_cache_is_not_written_or_read_directly(cpu_device):
    c = cpu_device.zeros((4, 32), T.Q8_0)
    assert c.nbytes == 4 * 34
    with pytest.raises(DeviceError, match="KV cache"):
        cpu_device.read(c)
    with pytest.raises(DeviceError, match="KV cache"):
        cpu_device.write(c, np.zeros((4, 32), np.float32))
    with pytest.raises(UnsupportedOpError, match="block size"):
        cpu_device.empty((4, 40), T.Q8_0)


def test_quantize_kv_is_the_reference_rounding():
    """q8_0 / q4_0 / f16 / bf16 rows equal ggml's quantize_row_*_ref on hand-checked values."""
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [1.0, -0.5, 0.25, 127.0 / 2]
    q8 = quantize_kv(x, T.Q8_0)[0]
    d = np.frombuffer(q8[:2].tobytes(), np.float16)[0]
    assert d == np.float16(63.5 / 127) and q8[2:6].view(np.int8).tolist() == [2, -1, 1, 127]
    q4 = quantize_kv(x, T.Q4_0)[0]
    # max by |x| keeps its sign: d = 63.5 / -8, q = min(15, trunc(x / d + 8.5))
    assert np.frombuffer(q4[:2].tobytes(), np.float16)[0] == np.float16(63.5 / -8)
    assert (q4[2] & 15, q4[5] & 15) == (8, 0)
    assert quantize_kv(np.array([[1 + 2 ** -11]], np.float32), T.F16).view(np.float16)[0, 0] == 1.0
    bf = quantize_kv(np.array([[1 + 2 ** -8 + 2 ** -20]], np.float32), T.BF16).view(np.uint16)[0, 0]
    assert bf == 0x3F81  # rounded up (above the halfway point)


def test_kv_type_names_and_ids():
    assert parse_kv_type("q8_0") is T.Q8_0 and parse_kv_type("Q4_0") is T.Q4_0 and parse_kv_type(1) is T.F16
    assert parse_kv_type("30") is T.BF16
    for bad in ("q9", 12, "iq4_nl", "q4_k"):
        with pytest.raises(KVTypeError, match="allowed values: f32, f16, bf16, q8_0"):
            parse_kv_type(bad)
    assert [parse_flash_attn(v) for v in ("on", "off", "auto", True, False, None, "1", "0")] == \
        ["on", "off", "auto", "on", "off", "auto", "on", "off"]
    with pytest.raises(KVTypeError, match="flash-attn"):
        parse_flash_attn("maybe")


def test_llama_cpp_rules():
    """src/llama-context.cpp: quantized V needs flash attention (auto turns it on); a block size must
    divide head_dim; a quantized K alone is fine without it."""
    assert KVConfig.parse("q8_0", "q8_0", "auto").resolve(64) is True
    assert KVConfig.parse("q8_0", "f16", "off").resolve(64) is False
    with pytest.raises(KVTypeError, match="requires flash attention"):
        KVConfig.parse("f16", "q4_0", "off").resolve(64)
    with pytest.raises(KVTypeError, match="does not divide head_dim 8"):
        KVConfig.parse("q8_0", "f16", "on").resolve(8)
    assert KVConfig(T.F16, T.Q8_0).row_bytes(256) == (512, 8 * 34)


def test_placement_refuses_a_type_the_device_lacks(cpu_device):
    from cooktop.backends.info import DeviceInfo
    info = DeviceInfo(backend="opencl", index=0, name="x", kv_types=("F32", "F16"))
    assert info.supports_op("kv_store", T.F16) == ""
    why = info.supports_op("attention", T.Q4_1)
    assert why == "opencl:0 cannot run attention on a Q4_1 KV cache (it stores F32, F16)"
    assert cpu_device.supports_op("attention", T.Q5_1) == ""


def test_budget_and_plan_count_the_cache_type(shared):
    """``plan`` (and -ngl auto, which reads the same budgets) counts n_ctx rows of each type's bytes."""
    from cooktop.cli.plan import plan_report
    path = str(shared / "models" / "tiny" / "tiny-F32.gguf")  # n_layer 2, n_embd_kv 64
    for tk, tv, row in (("f32", "f32", 2 * 256), ("f16", "f16", 2 * 128), ("q8_0", "q4_0", 68 + 36)):
        rep = plan_report(path, 1024, 64, "cpu", 0, None, kv=KVConfig.parse(tk, tv, "on"))
        assert rep["devices"][0]["kv_bytes"] == 2 * 1024 * row
        assert (rep["cache_type_k"], rep["cache_type_v"]) == (tk, tv)


def test_plan_counts_the_attention_scratch(shared):
    """``plan`` / -ngl auto count a device's attention scratch: the scores of -fa off (n_batch x n_head x
    n_ctx floats under chunked.SCORES_CAP_BYTES), with flash attention the split-K partials and on Vulkan
    those scores too (a CPU driver runs it through the score kernels); the host's numpy path has none."""
    from conftest import open_family_device

    from cooktop.backends import chunked
    from cooktop.cli.plan import plan_report

    open_family_device("vulkan")
    path = str(shared / "models" / "tiny" / "tiny-F32.gguf")  # n_head 8, head_dim 32

    def scratch(device, ngl, fa):
        rep = plan_report(path, 1024, 64, device, ngl, None, kv=KVConfig.parse("f16", "f16", fa))
        return rep["devices"][0]["scratch_bytes"]

    off = 64 * 8 * 1024 * 4
    on = off + 4 * chunked.SPLIT_ROWS_CAP * (32 + 2)
    assert chunked.attention_scratch_bytes(8, 32, 1024, 64, False) == off == 2 << 20
    assert chunked.attention_scratch_bytes(8, 32, 1024, 64, True, True) == on
    assert chunked.attention_scratch_bytes(8, 32, 1024, 64, True) == on - off  # OpenCL: the partials alone
    assert chunked.attention_scratch_bytes(32, 128, 131072, 512, False) == chunked.SCORES_CAP_BYTES
    host = scratch("cpu", 0, "off")
    assert scratch("cpu", 0, "on") == host
    assert scratch("vulkan", 99, "off") - host == off
    assert scratch("vulkan", 99, "on") - host == on


def test_opencl_gpu_launch_shape_reads_every_cache_type():
    """The GPU flavour of OpenCL's attention (work-groups sharing the keys, scalar cache loads; prompts: query
    tiles sharing each key tile) on PoCL, every cache type OpenCL stores, plain / window / batched / every
    row / sinks, at head_dim 96 and 40."""
    import dataclasses

    from conftest import open_family_device

    from cooktop.backends.opencl.programs import GPU_SHAPE, KernelCache

    base = open_family_device("opencl")
    gpu = type(base)(base.info, base.cl_device)
    gpu.shape = dataclasses.replace(GPU_SHAPE, at_ls=16)
    gpu.kernels = KernelCache(gpu.ctx, gpu.cl_device, gpu.shape)
    for t in (T.F16, T.BF16, T.Q8_0, T.Q4_0):
        assert _stores(gpu, t)
        for shape in SHAPES:
            if shape[2] % GGML_QUANT_SIZES[t][0]:
                continue
            for path in ("prompt", "window", "batched", "long", "sinks"):
                got, want = _case(gpu, t, T.F16 if t == T.Q4_0 else t, shape, path, seed=5)
                assert nmse(got, want) < 1e-10, (t.name, shape, path)
    assert gpu.kernels._attn_tiled  # the prompts ran the query-tiled kernel


@pytest.mark.parametrize("t", [T.F32, T.F16, T.Q8_0], ids=lambda t: t.name)
def test_opencl_gqa_grouped_attention_is_the_same_bits(monkeypatch, t):
    """OpenCL's serial attention running a GQA group per work-item (each K/V row read once for the group)
    gives exactly what one work-item per query head gives: decode, prompt, window, kv_start, the q8 output."""
    from conftest import open_family_device

    d = open_family_device("opencl")
    if not d.shape.at_serial:
        pytest.skip("the grouped kernel is the serial (CPU) flavour's")
    shape = (8, 2, 64, 37)  # groups of 4
    assert d._gqa_group(8, 2, 64) == 4 and d._gqa_group(8, 8, 64) == 0  # a group of 1 is the plain kernel
    for path in ("decode", "prompt", "window", "batched"):
        monkeypatch.setattr(type(d), "_gqa_group", lambda self, h, hk, n: h // hk)
        grouped, want = _case(d, t, t, shape, path, seed=11)
        monkeypatch.setattr(type(d), "_gqa_group", lambda self, h, hk, n: 0)
        single, _ = _case(d, t, t, shape, path, seed=11)
        assert np.array_equal(grouped, single), path
        assert nmse(grouped, want) < 1e-10


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=lambda t: t.name)
def test_opencl_serial_attention_vector_widths_and_key_blocks(monkeypatch, t):
    """OpenCL's serial (CPU) kernels with and without flash attention at every vector width (head_dim 64:
    16 lanes, 40: 8, 36: 4, 18: 1) over key ranges that end inside a 16-key block (flash) and span many
    blocks; the GQA-grouped flash kernel gives the same bits as the one-head one. On a GPU-type device
    (Oclgrind, which checks every access) a second device object runs the CPU launch shape."""
    from conftest import open_family_device

    from cooktop.backends.opencl import device as cl_device
    from cooktop.backends.opencl.programs import CPU_SHAPE

    d = open_family_device("opencl")
    if not d.shape.at_serial:
        monkeypatch.setattr(cl_device, "launch_shape", lambda info: ("cpu", CPU_SHAPE))
        d = cl_device.OpenCLDevice(d.info, d.cl_device)
    assert d.shape.at_serial
    paths = ["decode", "prompt", "first", "window", "long"] + (["sinks"] if "attention_sinks" in d.info.ops else [])
    for shape in [(6, 3, 64, 203), (4, 2, 40, 29), (3, 1, 36, 53), (4, 2, 18, 33)]:
        for path in paths:
            for flash in (True, False):
                if path == "first" and not flash:
                    continue
                got, want = _case(d, t, t, shape, path, seed=5, flash=flash)
                assert nmse(got, want) < 1e-10, (shape, path, flash, nmse(got, want))
                if flash and path != "sinks":
                    with pytest.MonkeyPatch.context() as mp:
                        mp.setattr(type(d), "_gqa_group", lambda self, h, hk, n: h // hk)
                        grouped, _ = _case(d, t, t, shape, path, seed=5)
                        mp.setattr(type(d), "_gqa_group", lambda self, h, hk, n: 0)
                        single, _ = _case(d, t, t, shape, path, seed=5)
                    assert np.array_equal(grouped, single), (shape, path)


@pytest.mark.parametrize("cap_heads", [2, 6 * 3], ids=["heads", "tokens"])
def test_attention_without_flash_in_chunks(any_device, monkeypatch, cap_heads):
    """The score scratch of ``-fa off`` under a small cap: chunks of 2 heads of one token, or of 3 tokens
    of every head; the same result as the float64 reference, and the scratch no larger than the cap."""
    from cooktop.backends import chunked

    d = any_device
    shape = (6, 2, 64, 37)
    monkeypatch.setattr(chunked, "SCORES_CAP_BYTES", cap_heads * 4 * shape[3])
    assert chunked.score_chunks(d, 5, 6, 37) == ((1, 2) if cap_heads == 2 else (3, 6))
    for path in ("prompt", "batched", "sinks"):
        if path == "sinks" and "attention_sinks" not in d.info.ops:
            continue
        got, want = _case(d, T.Q8_0 if _stores(d, T.Q8_0) else T.F32, T.F16, shape, path, seed=7, flash=False)
        assert nmse(got, want) < 1e-10, path
    if d.info.backend != "cpu":
        scratch = d._chunk_scratch[("attention scores", shape[3], T.F32)]
        assert scratch.shape[0] * scratch.shape[1] * 4 <= 2 * cap_heads * 4 * shape[3]


def test_vulkan_prompts_run_the_query_tiled_shader(monkeypatch):
    """Vulkan prompts with flash attention run attention_tiled.comp (16-query tiles) where the shared memory
    holds its tile, decode the per-row attention.comp; both against the float64 reference."""
    from conftest import open_family_device

    from cooktop.backends.vulkan import attention as vk_attention
    from cooktop.backends.vulkan.attention import TILE_SHARED_BYTES

    monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", False)
    d = open_family_device("vulkan")
    if (d.info.extra.get("max_compute_shared_memory") or 0) < TILE_SHARED_BYTES:
        pytest.skip(f"{d.info.selector} has less shared memory than the tile's {TILE_SHARED_BYTES} bytes")
    for path in ("long", "decode"):
        got, want = _case(d, T.Q8_0, T.F16, (8, 2, 64, 37), path, seed=13)
        assert nmse(got, want) < 1e-10, path
    ran = {e[4] for e in d._algos.values()}
    assert {"attention_tiled", "attention"} <= ran


@pytest.mark.parametrize("path", ["decode", "first", "window", "batched", "sinks"])
def test_vulkan_decode_split_k(monkeypatch, path):
    """Vulkan flash decode over a cache of several splits (split-K: partials per split, then the reduce):
    splits all full, a row with fewer keys than one split (the other splits empty), a window, two
    sequences (kv_start) and sinks, against the float64 reference, also at head_dims of 24 and 32 and
    unsplit; and at the default split size. On a CPU driver flash attention otherwise runs the score
    kernels (``SCORES_FLASH_ON_CPU``), checked last."""
    from conftest import open_family_device

    from cooktop.backends.vulkan import attention as vk_attention
    from cooktop.backends.vulkan import device as vk_device

    d = open_family_device("vulkan")
    monkeypatch.setattr(vk_attention, "SPLIT_KEYS", 64)
    # rows of several tokens (window, batched, sinks) would take the query-tiled shader: here they split
    monkeypatch.setattr(vk_device, "attention_tiled", lambda *args: False)
    split = []

    def counted(*args):
        split.append(vk_attention.attention_split(*args))
        return split[-1]

    monkeypatch.setattr(vk_device, "attention_split", counted)
    monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", False)  # lavapipe: the flash kernels all the same
    assert vk_attention.split_count(1, 6, 300) == 5
    # head_dims <= 32 (half a workgroup); SHAPES: attention.comp unsplit
    for shape in ((6, 2, 64, 300), (5, 1, 24, 300), (3, 3, 32, 19), *SHAPES):
        got, want = _case(d, T.Q8_0 if shape[2] % 32 == 0 else T.F32, T.F16, shape, path, seed=17)
        assert nmse(got, want) < 1e-10, (path, shape)
    assert split[:2] == [True, True] and split[2] is False  # 300 cells split, 19 do not
    if path == "decode":
        monkeypatch.setattr(vk_attention, "SPLIT_KEYS", 512)
        assert vk_attention.split_count(1, 4, 1100) == 3
        got, want = _case(d, T.F16, T.F16, (4, 2, 64, 1100), path, seed=19)
        assert nmse(got, want) < 1e-10
    monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", True)
    assert vk_attention.scores_flash(d) == (d.info.device_type == "cpu")


@pytest.mark.parametrize("kernels", ["default", "flash"])
def test_vulkan_decode_is_the_prompts_arithmetic(monkeypatch, kernels):
    """A row of Vulkan flash attention decoded alone gives the same bits as the same row of a prompt: a
    last-bit difference there turns into another 8-bit activation in the next mat-vec (q8_1) and moves a
    logprob by 0.05 (tests/test_prompt_paths.py). "default": the device's choice (a CPU driver: the score
    kernels for both, row-independent, so every row); "flash": attention_tiled.comp for the prompt and
    attention.comp for decode, which add each key in the same order, so every row whose running max is that
    of its first 8 keys (the tiled shader's key tile; every row of at most 8 keys). Odd shapes, head_dims of
    24 to 96, GQA, the f16 cache."""
    from conftest import open_family_device

    from cooktop.backends.vulkan import attention as vk_attention

    d = open_family_device("vulkan")
    if kernels == "flash":
        monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", False)
    if (d.info.extra.get("max_compute_shared_memory") or 0) < vk_attention.TILE_SHARED_BYTES:
        pytest.skip(f"{d.info.selector} has less shared memory than the tile's {vk_attention.TILE_SHARED_BYTES} bytes")
    exact_all = kernels == "default" and vk_attention.scores_flash(d)
    for n_head, n_head_kv, hd, n in ((6, 2, 96, 41), (3, 3, 40, 19), (5, 1, 24, 23), (4, 2, 32, 30)):
        rng = np.random.default_rng(hd)
        kv_dim = n_head_kv * hd
        kc, vc = d.zeros((n, kv_dim), T.F16), d.zeros((n, kv_dim), T.F16)
        x, pt = d.empty((n, kv_dim)), d.empty((n,), T.I32)
        d.write(pt, np.arange(n, dtype=np.int32))
        stored = []
        for c in (kc, vc):
            stored.append(rng.standard_normal((n, kv_dim)).astype(np.float32))
            d.write(x, stored[-1])
            d.kv_store(c, x, pt)
        q = rng.standard_normal((n, n_head * hd)).astype(np.float32)
        qt, out = d.empty(q.shape), d.empty(q.shape)
        d.write(qt, q)
        d.attention(out, qt, kc, vc, pt, n_head, n_head_kv, 1.0 / np.sqrt(hd))
        prompt = d.read(out)
        k = stored[0].astype(np.float16).astype(np.float64).reshape(n, n_head_kv, hd)  # as the f16 cache
        q1, o1, p1 = d.empty((1, n_head * hd)), d.empty((1, n_head * hd)), d.empty((1,), T.I32)
        for r in range(n):
            d.write(q1, q[r:r + 1])
            d.write(p1, np.array([r], np.int32))
            d.attention(o1, q1, kc, vc, p1, n_head, n_head_kv, 1.0 / np.sqrt(hd))
            one = d.read(o1)[0].reshape(n_head, hd)
            for h in range(n_head):
                s = k[:r + 1, h // (n_head // n_head_kv)] @ q[r].reshape(n_head, hd)[h].astype(np.float64)
                if exact_all or s[:8].max() >= s.max():
                    assert np.array_equal(one[h], prompt[r].reshape(n_head, hd)[h]), (kernels, hd, r, h)


def test_vulkan_split_k_decode_replays(shared, monkeypatch):
    """A model's decode on Vulkan through split-K (four splits of a 256-row cache, over 64 keys attended, so
    several splits hold keys) inside recorded graphs (COOKTOP_GRAPH_CHECK compares each replay with its
    recording): logits within float rounding of ``-fa off``, the greedy tokens equal."""
    from conftest import open_family_device

    from cooktop import Llama
    from cooktop.backends.vulkan import attention as vk_attention
    from cooktop.backends.vulkan import device as vk_device

    open_family_device("vulkan")
    split = []

    def counted(*args):
        split.append(vk_attention.attention_split(*args))
        return split[-1]

    monkeypatch.setattr(vk_device, "attention_split", counted)
    monkeypatch.setattr(vk_attention, "SCORES_FLASH_ON_CPU", False)
    monkeypatch.setattr(vk_attention, "SPLIT_KEYS", 64)
    assert vk_attention.split_count(1, 8, 256) == 4
    path = str(shared / "models" / "tiny" / "tiny-F32.gguf")
    runs = []
    for fa in (True, False):
        llm = Llama(model_path=path, n_ctx=256, n_batch=32, logits_all=True, verbose=False, device="vulkan",
                    n_gpu_layers=-1, flash_attn=fa)
        try:
            toks = llm.tokenize(b"Once upon a time there was a little girl who liked to play. " * 6, add_bos=True)
            assert len(toks) > 70
            out: list[int] = []
            llm.eval(toks)
            for _ in range(6):
                out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
                llm.eval([out[-1]])
            runs.append((np.array(llm.scores[len(toks) - 1:llm.n_tokens], dtype=np.float64), out))
        finally:
            llm.close()
    (on, tok_on), (off, tok_off) = runs
    assert nmse(off, on) < 1e-8, nmse(off, on)
    assert tok_on == tok_off
    assert split and all(split)  # every flash decode split (recorded once, then replayed)
