"""``cooktop quantize`` against llama.cpp: byte-identical files, the same per-tensor mixtures, clear errors.

llama.cpp's files are made at test time with llama-cpp-python's ``llama_model_quantize`` (one thread,
no importance matrix: every quantizer cooktop offers is then deterministic), so a llama.cpp upgrade
that changed a quantizer or a mixture shows here.
"""

from __future__ import annotations

import ctypes
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import require_modules
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from cooktop.errors import CooktopError, GGUFError, UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.format.quants import dequantize
from cooktop.quantize import ftypes, kquants
from cooktop.quantize.mixture import Options
from cooktop.quantize.model import plan, quantize_file
from cooktop.quantize.rows import quantize_rows
from cooktop.tools import synth

T = GGMLQuantizationType
ALL = list(ftypes.FILE_TYPES)


@pytest.fixture(scope="module")
def llama_cpp():
    require_modules("llama_cpp", "llama_cpp")
    import llama_cpp

    return llama_cpp


def llama_quantize(llama_cpp, src, dst, ftype: int, *, pure=False, output_type=None, embd_type=None,
                   leave_output=False, tensor_types=()) -> pathlib.Path:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread, p.pure = ftype, 1, pure
    p.quantize_output_tensor = not leave_output
    if tensor_types:
        tt = (llama_cpp.llama_model_tensor_override * (len(tensor_types) + 1))()
        for i, (pattern, t) in enumerate(tensor_types):
            tt[i].pattern, tt[i].type = pattern.encode(), int(t)
        tt[len(tensor_types)].type = len(T)  # terminator: pattern NULL, GGML_TYPE_COUNT
        p.tt_overrides = ctypes.cast(tt, type(p.tt_overrides))
    if output_type is not None:
        p.output_tensor_type = int(output_type)
    if embd_type is not None:
        p.token_embedding_type = int(embd_type)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    assert rc == 0, f"llama_model_quantize failed on {src}"
    return pathlib.Path(dst)


def tensor_types(path) -> list[tuple[str, str]]:
    return [(n, t.ggml_type.name) for n, t in open_gguf(path).tensors.items()]


@pytest.fixture(scope="module")
def tiny_f32(shared):
    return shared / "models" / "tiny" / "tiny-F32.gguf"


@pytest.mark.parametrize("name", ALL)
def test_tiny_files_equal_llama_cpp_bytes(name, tiny_f32, stories, llama_cpp, tmp_path):
    """Whole files, metadata and padding included: tiny (n_embd 256, every K-quant fits) and
    stories260K (n_embd 64, n_ff 172: the block-size fallbacks to Q5_0/Q8_0/F16)."""
    ft = ftypes.file_type(name)
    for src in (tiny_f32, stories):
        ref = llama_quantize(llama_cpp, src, tmp_path / f"ref-{src.stem}.gguf", ft.ftype)
        ours = tmp_path / f"ours-{src.stem}.gguf"
        quantize_file(src, ours, ft)
        assert ours.read_bytes() == ref.read_bytes(), (name, src.name)


@pytest.mark.parametrize("name,kw,lkw", [
    ("Q4_K_M", dict(pure=True), dict(pure=True)),
    ("Q5_K_S", dict(pure=True), dict(pure=True)),
    ("Q3_K_L", dict(pure=True), dict(pure=True)),
    ("Q4_0", dict(output_tensor_type=T.Q8_0, token_embedding_type=T.F16),
     dict(output_type=T.Q8_0, embd_type=T.F16)),
    ("Q6_K", dict(leave_output_tensor=True), dict(leave_output=True)),
    ("Q4_K_M", dict(tensor_types=(("attn_v", T.Q8_0), ("blk\\.1\\.ffn_.*", T.Q5_0), ("output", T.Q4_K))),
     dict(tensor_types=(("attn_v", T.Q8_0), ("blk\\.1\\.ffn_.*", T.Q5_0), ("output", T.Q4_K)))),
])
def test_flags_equal_llama_cpp_bytes(name, kw, lkw, tiny_f32, llama_cpp, tmp_path):
    """--pure (every K-quant, pure, on tiny), --output-tensor-type, --token-embedding-type, --leave-output-tensor,
    --tensor-type (first matching pattern wins, the mixture's counters skip the manual tensors)."""
    ft = ftypes.file_type(name)
    ref = llama_quantize(llama_cpp, tiny_f32, tmp_path / "ref.gguf", ft.ftype, **lkw)
    quantize_file(tiny_f32, tmp_path / "ours.gguf", ft, n_threads=1, **kw)  # the others: one per core
    assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("src,name", [("Q8_0", "Q4_K_M"), ("Q4_K_M", "Q2_K"), ("Q5_1", "Q6_K")])
def test_allow_requantize_equals_llama_cpp(src, name, shared, llama_cpp, tmp_path):
    """--allow-requantize: quantized inputs dequantized (gguf's dequantizers equal ggml's to_float) and quantized."""
    path = shared / "models" / "tiny" / f"tiny-{src}.gguf"
    ft = ftypes.file_type(name)
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread, p.allow_requantize = ft.ftype, 1, True
    ref = tmp_path / "ref.gguf"
    assert llama_cpp.llama_model_quantize(str(path).encode(), str(ref).encode(), ctypes.byref(p)) == 0
    quantize_file(path, tmp_path / "ours.gguf", ft, allow_requantize=True)
    assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes()


def test_f16_input_equals_llama_cpp(shared, llama_cpp, tmp_path):
    src = shared / "models" / "tiny" / "tiny-F16.gguf"
    ref = llama_quantize(llama_cpp, src, tmp_path / "ref.gguf", 18)
    quantize_file(src, tmp_path / "ours.gguf", ftypes.file_type("Q6_K"))
    assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes()


@pytest.fixture(scope="module")
def deep_models(tmp_path_factory):
    """Synthetic F32 models where the layer-dependent bumps show: 16 layers with n_gqa 4, 12 layers
    with n_gqa 1, 4 layers of 8 experts (the n_expert == 8 rules), and tied embeddings."""
    d = tmp_path_factory.mktemp("deep")
    shapes = {
        "gqa4-16": synth.Shape(256, 16, 8, 2, 256, 320),
        "mha-12": synth.Shape(256, 12, 4, 4, 256, 320, tied=True),
        "moe8-4": synth.Shape(256, 4, 4, 1, 256, 320, n_expert=8, n_expert_used=2, n_ff_exp=256),
    }
    out = {}
    for name, s in shapes.items():
        out[name] = d / f"{name}.gguf"
        synth.write(out[name], s, "F32", seed=1)
    return out


@pytest.mark.parametrize("model", ["gqa4-16", "mha-12", "moe8-4"])
def test_mixtures_pick_llama_cpp_types(model, deep_models, llama_cpp, tmp_path):
    """Every K-quant mixture picks llama.cpp's type for every tensor (and the order) on models with
    enough layers for use_more_bits and the Q3_K_M / Q4_K_S attn_v counters."""
    src = deep_models[model]
    f = open_gguf(src)
    for name in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_M", "IQ4_XS"):  # with bumps
        ft = ftypes.file_type(name)
        ref = llama_quantize(llama_cpp, src, tmp_path / f"{name}.gguf", ft.ftype)
        ours = [(p.name, p.dst_type.name) for p in plan(f, Options(ft))[0]]
        assert ours == tensor_types(ref), (model, name)
    if model == "moe8-4":  # 3-D expert tensors (ne[2] = 8): the bytes too
        quantize_file(src, tmp_path / "ours.gguf", ft)
        assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes()


def _ggml_quantize(llama_cpp, t: T, x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """ggml's own ggml_quantize_chunk (libggml-base next to llama-cpp-python's libllama) on rows x."""
    lib_dir = pathlib.Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(lib_dir.glob("libggml-base.*"))
    if not libs:
        pytest.fail(f"no libggml-base in {lib_dir}")
    lib = ctypes.CDLL(str(libs[0]))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    block, size = GGML_QUANT_SIZES[t]
    out = np.zeros((x.shape[0], x.shape[1] // block * size), np.uint8)
    qw = None if imatrix is None else np.ascontiguousarray(imatrix, np.float32)
    fn(int(t), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None if qw is None else qw.ctypes.data)
    return out


def _edge_rows(rng) -> np.ndarray:
    """Rows of 256 that stress the searches: zeros, constants, one spike, negatives only, tiny and
    huge magnitudes, repeated values (rounding ties), heavy tails."""
    rows = [np.zeros(256), np.full(256, 0.5), np.full(256, -3.0), np.eye(1, 256, 7)[0] * 5,
            -np.abs(rng.standard_normal(256)), rng.standard_normal(256) * 1e-6, rng.standard_normal(256) * 1e4,
            np.round(rng.standard_normal(256) * 4) / 4, rng.standard_cauchy(256),
            np.where(rng.random(256) < 0.9, 0.0, rng.standard_normal(256))]
    rows += list(rng.standard_normal((6, 256)) * rng.uniform(0.01, 3, (6, 1)))
    return np.array(rows, np.float32)


ROW_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.IQ4_XS]


@pytest.mark.parametrize("t", ROW_TYPES)
def test_rows_equal_ggml_on_edge_cases(t, llama_cpp):
    x = _edge_rows(np.random.default_rng(3))
    assert np.array_equal(quantize_rows(x, t), _ggml_quantize(llama_cpp, t, x)), t.name


@pytest.mark.parametrize("t", ROW_TYPES)
def test_rows_with_imatrix_equal_ggml(t, llama_cpp):
    """The importance-matrix quantizers (quantize_row_*_impl) on edge rows and heavy-tailed ones,
    with importances spanning zeros to large values; the imatrix must change the K-quant output."""
    rng = np.random.default_rng(5)
    x = np.concatenate([np.tile(_edge_rows(rng), (1, 2)), rng.standard_cauchy((8, 512)).astype(np.float32)])
    qw = (rng.random(512) ** 3 * 50).astype(np.float32)
    qw[:7] = 0
    ours = quantize_rows(x, t, imatrix=qw)
    assert np.array_equal(ours, _ggml_quantize(llama_cpp, t, x, qw)), t.name
    if t != T.Q8_0:
        assert not np.array_equal(ours, quantize_rows(x, t))


@pytest.mark.parametrize("t,tol", [(T.Q2_K, 0.45), (T.Q3_K, 0.22), (T.Q4_K, 0.1), (T.Q5_K, 0.05), (T.Q6_K, 0.025)])
def test_kquants_round_trip(t, tol):
    """The K-quant blocks decode (cooktop's dequantizer) to the input within the type's error."""
    x = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    y = dequantize(quantize_rows(x, t), t, x.shape)
    rel = float(np.sqrt(np.mean((y - x) ** 2)))
    assert rel < tol, (t.name, rel)
    assert kquants.QK_K == 256


def test_errors(tiny_f32, shared, tmp_path):
    with pytest.raises(CooktopError, match="unknown quantization type 'Q9_X'"):
        ftypes.file_type("Q9_X")
    with pytest.raises(CooktopError, match="unknown tensor type"):
        ftypes.tensor_type("q7_0")
    assert ftypes.file_type("q4_k").name == "Q4_K_M" and ftypes.file_type("15").name == "Q4_K_M"
    assert ftypes.tensor_type_option("ATTN_V=q8_0") == ("attn_v", T.Q8_0)
    for arg, words in (("attn_v", "malformed"), ("=q8_0", "missing tensor name"), ("attn_v=", "missing quantization"),
                       ("attn_v=q9", "unknown tensor type"), ("(=q8_0", "bad pattern")):
        with pytest.raises(CooktopError, match=words):
            ftypes.tensor_type_option(arg)
    ft = ftypes.file_type("Q4_0")
    with pytest.raises(UnsupportedModelError, match="already Q4_0"):
        quantize_file(shared / "models" / "tiny" / "tiny-Q4_0.gguf", tmp_path / "o.gguf", ftypes.file_type("Q8_0"))
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFError, match="not a GGUF"):
        quantize_file(foreign, tmp_path / "o.gguf", ft)
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(tiny_f32.read_bytes()[:5000])
    with pytest.raises(GGUFError, match="truncated|ends"):
        quantize_file(trunc, tmp_path / "o.gguf", ft)
    with pytest.raises(CooktopError, match="must not be the input"):
        quantize_file(foreign, foreign, ft)
    with pytest.raises(UnsupportedModelError, match="NaN or infinite"):
        quantize_rows(np.array([[0.0] * 31 + [np.nan]], np.float32), T.Q8_0)
    assert not (tmp_path / "o.gguf").exists() and not (tmp_path / "o.gguf.part").exists()


def test_cli(tiny_f32, shared, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "cooktop.cli", "quantize", *args], capture_output=True,
                              text=True, timeout=120)

    out = tmp_path / "q.gguf"
    r = run("--no-progress", str(tiny_f32), str(out), "Q4_K_M", "1")
    assert r.returncode == 0, r.stderr
    assert "Q4_K_M (file_type 15), 21 tensors (F32 5, Q4_K 13, Q6_K 3)" in r.stdout
    assert open_gguf(out).metadata["general.file_type"] == 15
    r = run("--dry-run", str(shared / "models" / "stories260K.gguf"), "Q4_K_M")
    assert r.returncode == 0 and "blk.0.ffn_down.weight" in r.stdout and "F32 -> F16" in r.stdout
    for args, words in (((str(tiny_f32), str(out), "Q9"), "unknown quantization type"),
                        ((str(tiny_f32), str(out), "Q8_0", "many"), "invalid nthreads"),
                        ((str(tmp_path), str(out), "Q8_0"), f"{tmp_path}: is a directory, not a GGUF file"),
                        (("--override-kv", "foo=int:abc", str(tiny_f32), str(out), "Q8_0"),
                         "invalid integer value for KV override 'foo=int:abc'")):
        r = run(*args)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and words in errors[0], r.stderr


def write_imatrix(model, path, seed=1) -> pathlib.Path:
    """A llama-imatrix GGUF for ``model``: random sums of squares, 50 tokens per matrix (the second
    expert of a MoE tensor saw none: its importances become 1)."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "imatrix")
    w.kv_data[0].clear()
    w.add_array("imatrix.datasets", ["calibration.txt"])
    w.add_uint32("imatrix.chunk_count", 7)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, t in open_gguf(model).tensors.items():
        if len(t.shape) < 2 or "norm" in name:
            continue
        ne0, n_mat = t.shape[-1], (t.shape[0] if len(t.shape) > 2 else 1)
        counts = np.full(n_mat, 50.0, np.float32)
        counts[1:2] = 0
        w.add_tensor(f"{name}.in_sum2", (rng.random((n_mat, ne0)) ** 2 * 100).astype(np.float32))
        w.add_tensor(f"{name}.counts", counts)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)


def llama_quantize_imatrix(llama_cpp, src, dst, ftype: int, im) -> pathlib.Path:
    arr = (llama_cpp.llama_model_imatrix_data * (len(im.entries) + 1))()
    keep = []
    for i, (k, v) in enumerate(im.entries.items()):
        v = np.ascontiguousarray(v, np.float32)
        keep.append(v)
        arr[i].name, arr[i].size = k.encode(), v.size
        arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = ftype, 1
    p.imatrix = ctypes.cast(arr, type(p.imatrix))
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) == 0
    return pathlib.Path(dst)


@pytest.mark.parametrize("model,names", [("tiny", ("Q4_K_M", "Q5_1")), ("gqa4-16", ("Q4_0",)),
                                         ("moe8-4", ("Q4_K_M",))])
def test_imatrix_files_equal_llama_cpp_bytes(model, names, tiny_f32, deep_models, llama_cpp, tmp_path):
    """--imatrix: the weighted quantizers, per-expert vectors (a zero count gives 1s) and the mixture's
    imatrix rule (Q4_0's first ffn_down layers of 16 become Q4_1) give llama.cpp's file."""
    from cooktop.quantize import imatrix

    src = tiny_f32 if model == "tiny" else deep_models[model]
    im = imatrix.load(write_imatrix(src, tmp_path / "im.gguf"))
    assert im.datasets == ["calibration.txt"] and im.chunk_count == 7
    for name in names:
        ft = ftypes.file_type(name)
        ref = llama_quantize_imatrix(llama_cpp, src, tmp_path / "ref.gguf", ft.ftype, im)
        quantize_file(src, tmp_path / "ours.gguf", ft, imatrix=im)
        assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes(), (model, name)
        if model == "gqa4-16":
            types = dict(tensor_types(ref))
            assert types["blk.1.ffn_down.weight"] == "Q4_1" and types["blk.2.ffn_down.weight"] == "Q4_0"


def test_imatrix_legacy_file_and_cli_keys(tiny_f32, tmp_path):
    """The legacy .dat format (sums / ncall), and the quantize.imatrix.* keys the CLI appends."""
    import struct

    from cooktop.quantize import imatrix

    name = b"blk.0.attn_q.weight"
    sums = np.arange(1, 257, dtype=np.float32)
    dat = tmp_path / "im.dat"
    dat.write_bytes(struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii", 4, 256) + sums.tobytes()
                    + struct.pack("<ii", 3, 5) + b"wiki\0")
    im = imatrix.load(dat)
    assert list(im.entries) == ["blk.0.attn_q.weight"] and im.chunk_count == 3 and im.datasets == ["wiki"]
    assert np.array_equal(im.entries["blk.0.attn_q.weight"], sums / np.float32(4))
    out = tmp_path / "q.gguf"
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "quantize", "--no-progress", "--imatrix", str(dat),
                        str(tiny_f32), str(out), "Q4_K_M"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    md = open_gguf(out).metadata
    assert list(md)[-6:] == ["general.quantization_version", "general.file_type", "quantize.imatrix.file",
                             "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                             "quantize.imatrix.chunks_count"]
    assert md["quantize.imatrix.file"] == str(dat) and md["quantize.imatrix.entries_count"] == 1
    bad = tmp_path / "bad.dat"
    bad.write_bytes(b"\x01\x00\x00\x00\xff")
    with pytest.raises(CooktopError, match="not an importance matrix"):
        imatrix.load(bad)


def test_70b_rule():
    """LLM_TYPE_70B (80-layer llama with GQA, 80-layer qwen2, 68-layer jais2): attn_v's Q3_K / Q4_K become Q5_K."""
    from cooktop.quantize.mixture import Mixture, ModelFacts

    names = [f"blk.{i}.attn_v.weight" for i in range(80)] + ["output.weight"]
    for facts, bumped in ((ModelFacts("llama", 80, 64, 8), True), (ModelFacts("llama", 80, 64, 64), False),
                          (ModelFacts("qwen2", 80, 64, 8), True), (ModelFacts("jais2", 68, 64, 8), True),
                          (ModelFacts("llama", 79, 64, 8), False)):
        mix = Mixture(facts, Options(ftypes.file_type("Q3_K_S")), names)
        assert mix.choose("blk.0.attn_v.weight", (8192, 1024), T.F16) == (T.Q5_K if bumped else T.Q3_K), facts


def test_override_kv_equals_llama_cpp(tiny_f32, llama_cpp, tmp_path):
    """--override-kv: int (u32 of |atol|), float (f32), bool and str keys, one replacing an input key
    (general.name moves to the end, as gguf_set_val_* does)."""
    from cooktop.quantize.model import parse_kv_override

    args = ["test.count=int:-42", "test.ratio=float:0.1", "test.flag=bool:true", "general.name=str:renamed"]
    kvs = (llama_cpp.llama_model_kv_override * (len(args) + 1))()
    values = [(0, "val_i64", -42), (1, "val_f64", 0.1), (2, "val_bool", True), (3, "val_str", b"renamed")]
    for i, (tag, field, value) in enumerate(values):  # llama_model_kv_override: tag INT, FLOAT, BOOL, STR
        kvs[i].tag, kvs[i].key = tag, args[i].split("=")[0].encode()
        setattr(kvs[i].value, field, value)
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = 7, 1
    p.kv_overrides = ctypes.cast(kvs, type(p.kv_overrides))
    ref = tmp_path / "ref.gguf"
    assert llama_cpp.llama_model_quantize(str(tiny_f32).encode(), str(ref).encode(), ctypes.byref(p)) == 0
    quantize_file(tiny_f32, tmp_path / "ours.gguf", ftypes.file_type("Q8_0"),
                  extra_kv=[parse_kv_override(a) for a in args])
    assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes()
    for bad, words in (("nokey", "malformed"), ("k=long:1", "invalid type"), ("k=bool:yes", "boolean"),
                       ("foo=int:abc", "invalid integer value"), ("foo=int:", "invalid integer"),
                       ("foo=int:12abc", "invalid integer"), ("foo=int:4294967296", "at most 32 bits"),
                       ("a=float:x", "invalid float value"), ("a=float:1.5.2", "invalid float")):
        with pytest.raises(CooktopError, match=words):
            parse_kv_override(bad)


def test_iq4_best_index_matches_the_binary_search():
    """iq4.best_index (a floor(x) table) equals best_index_int8's binary search with its float tie rule,
    on a fine grid, the levels, their midpoints and the infinities."""
    from cooktop.quantize import iq4

    v = iq4.VALUES.astype(np.float32)

    def reference(x):
        if x <= v[0]:
            return 0
        if x >= v[15]:
            return 15
        lo, hi = 0, 15
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if x < v[mid] else (mid, hi)
        return hi - 1 if (x - v[hi - 1]) < (v[hi] - x) else hi

    xs = np.concatenate([np.linspace(-140, 130, 20011, dtype=np.float32), v, (v[1:] + v[:-1]) / 2,
                         np.array([np.inf, -np.inf, 1e-8, -1e-8], np.float32)]).astype(np.float32)
    assert np.array_equal(iq4.best_index(xs), [reference(x) for x in xs])
