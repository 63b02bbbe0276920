"""cooktop perplexity and KL divergence (cooktop.quality) against llama.cpp's method computed here
from llama-cpp-python's logits: same tokens, same chunking (BOS at each chunk's start, the second
half scored), the formulas written out again in float64."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SHARED, require_modules, skip_or_fail
from gguf import GGMLQuantizationType as T

from cooktop.errors import CooktopError

TEXT = pathlib.Path("/usr/share/common-licenses/GPL-3")
N_CTX = 128
N_CHUNK = 3  # 3 x 63 = 189 scored tokens: enough for llama.cpp's statistics (>= 100)


@pytest.fixture(scope="module")
def text(shared) -> str:
    if not TEXT.exists():
        skip_or_fail("shared", f"no {TEXT} (Debian's base-files ships it)")
    return TEXT.read_text()


def model_path(name: str) -> pathlib.Path:
    p = SHARED / "models" / name
    if not p.exists():
        skip_or_fail("shared", f"no {p}")
    return p


def selector(family: str) -> str:
    from cooktop.backends import registry

    if family == "cpu":
        return "cpu"
    res = registry.probe(family)
    if not res.available:
        skip_or_fail(family, f"{res.reason}; to enable: {res.hint}")
    return res.devices[0].selector


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


_llama_cache: dict[str, tuple[list[int], list[np.ndarray]]] = {}


def llama_cpp_chunks(path: pathlib.Path, text: str) -> tuple[list[int], list[np.ndarray]]:
    """llama.cpp's tokens of ``text`` and, per chunk, its log-softmax rows at positions n_ctx/2 .. n_ctx-2."""
    key = str(path)
    if key not in _llama_cache:
        require_modules("llama_cpp", "llama_cpp")
        import llama_cpp

        # F32 caches on both sides (type_k/type_v 0): with llama.cpp's f16 default, a K value a few ulp
        # apart before rounding lands one f16 step apart, which moves the PPL by ~1e-4 (measured)
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True,
                              verbose=False, n_threads=2, type_k=0, type_v=0)
        tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
        first = N_CTX // 2
        rows = []
        for i in range(N_CHUNK):
            chunk = list(tokens[i * N_CTX:(i + 1) * N_CTX])
            chunk[0] = llm.token_bos()
            llm.reset()
            llm.eval(chunk)
            rows.append(log_softmax64(np.array(llm.scores[first:N_CTX - 1])))
        llm.close()
        _llama_cache[key] = (tokens, rows)
    return _llama_cache[key]


def reference_ppl(tokens: list[int], rows: list[np.ndarray]) -> tuple[float, float]:
    """llama.cpp's final estimate (PPL, uncertainty) from log-softmax rows."""
    first = N_CTX // 2
    nll = np.concatenate([-r[np.arange(len(r)), tokens[i * N_CTX + first + 1:(i + 1) * N_CTX]]
                          for i, r in enumerate(rows)])
    mean, mean2 = nll.mean(), (nll * nll).mean()
    ppl = float(np.exp(mean))
    return ppl, ppl * float(np.sqrt((mean2 - mean * mean) / (len(nll) - 1)))


@pytest.mark.parametrize("model", ["stories260K.gguf", "tiny/tiny-F32.gguf"])
@pytest.mark.parametrize("family", ["cpu", "opencl", "vulkan"])
def test_perplexity_equals_llama_cpp(family, model, text):
    check_perplexity(family, model, text, {"device": selector(family)})


def test_perplexity_of_a_split_model_equals_llama_cpp(text):
    """-ngl 2: the output head and the last block on OpenCL, the other blocks on the host (numpy)."""
    check_perplexity("opencl", "stories260K.gguf", text, {"device": selector("opencl"), "n_gpu_layers": 2})


def check_perplexity(family, model, text, placement):
    from cooktop.format.kvtypes import KVConfig
    from cooktop.quality import perplexity as ppl
    from cooktop.runtime.loader import load_model

    path = model_path(model)
    tokens, rows = llama_cpp_chunks(path, text)
    m = load_model(path, n_ctx=N_CTX, n_batch=48, logits_all=True, kv=KVConfig(T.F32, T.F32), **placement)
    try:
        ours = ppl.tokenize_text(m.tokenizer, text)
        assert ours == tokens  # the same tokens
        ch = ppl.chunking(m.tokenizer, len(ours), N_CTX, 48, N_CHUNK)  # 48: three passes per chunk
        assert (ch.n_chunk, ch.first, ch.n_scored, ch.bos) == (N_CHUNK, 64, 63, 1)
        res = ppl.perplexity(m.model, ours, ch)
        on = {sel for sel in m.placement.blocks} | {m.placement.head}
    finally:
        m.model.close()
    want, want_unc = reference_ppl(tokens, rows)
    assert res.ppl == pytest.approx(want, rel=1e-4)
    assert res.ppl_unc == pytest.approx(want_unc, rel=1e-3)
    assert len(res.running) == N_CHUNK and res.running[-1] == pytest.approx(res.ppl, rel=1e-12)
    assert len(on) == (2 if "n_gpu_layers" in placement else 1)


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "COOKTOP_DEVICE": "cpu"})


def test_cli_perplexity_then_kl_divergence_of_itself(tmp_path, text, stories):
    """The command prints llama.cpp's lines; the base it saves compares with the same run as zero
    KLD (to the file's 16/65535-nat resolution) and 100 % same top token."""
    base = tmp_path / "base.kld"
    r = run_cli("perplexity", "-m", str(stories), "-f", str(TEXT), "-c", str(N_CTX), "--chunks", str(N_CHUNK),
                "-ctk", "f32", "-ctv", "f32",
                "--kl-divergence-base", str(base))
    assert r.returncode == 0, r.stderr
    running = re.findall(r"\[(\d+)\](\d+\.\d{4}),", r.stdout)
    assert [int(i) for i, _ in running] == [1, 2, 3]
    final = re.search(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})", r.stdout)
    tokens, rows = llama_cpp_chunks(stories, text)
    want, want_unc = reference_ppl(tokens, rows)
    assert final and float(final[1]) == pytest.approx(want, rel=1e-4, abs=1e-4)
    assert float(final[2]) == pytest.approx(want_unc, rel=1e-3, abs=1e-5)
    assert float(running[-1][1]) == float(final[1])
    assert "perplexity: calculating perplexity over 3 chunks, n_ctx=128" in r.stderr
    n_vocab = 512
    assert base.stat().st_size == 20 + 4 * N_CHUNK * N_CTX + 2 * N_CHUNK * 63 * (n_vocab + 4)

    r = run_cli("perplexity", "-m", str(stories), "--kl-divergence-base", str(base), "--kl-divergence",
                "-ctk", "f32", "-ctv", "f32")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "chunk             PPL               ln(PPL(Q)/PPL(base))" in out
    assert float(re.search(r"Mean PPL\(Q\)\s+:\s+(\d+\.\d+)", out)[1]) == pytest.approx(want, rel=1e-4)
    kld = re.search(r"Mean    KLD:\s+(-?\d+\.\d+) ±\s+(\d+\.\d+)", out)
    assert kld and abs(float(kld[1])) <= 1e-6
    assert float(re.search(r"Maximum KLD:\s+(-?\d+\.\d+)", out)[1]) < 16 / 65535
    assert "Same top p: 100.000 ± 0.000 %" in out
    assert float(re.search(r"RMS Δp    :\s+(\d+\.\d+) ±", out)[1]) <= 0.01  # percent
    for label in ("99.9%   KLD", "Median  KLD", " 0.1%   KLD", "75.0%   Δp", "Mean PPL(Q)/PPL(base)"):
        assert label in out


def test_kld_of_exact_base_is_zero():
    """With an exact base (no file quantization) a run compared with itself is 0 to the last bit."""
    from cooktop.quality.kld import KldStats, token_kld

    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((150, 512)) * 3).astype(np.float32)
    mx = logits.max(axis=1)
    lse = np.log(np.exp(logits - mx[:, None]).astype(np.float64).sum(axis=1)).astype(np.float32)
    exact = (logits - (mx + lse)[:, None]).astype(np.float32)
    stats = KldStats()
    stats.add(token_kld(logits, exact, rng.integers(0, 512, 150)))
    s = stats.summary()
    assert np.all(stats.values("kld") == 0.0) and s["kld"] == 0.0 and s["same_top"] == 1.0
    assert s["rms_dp"] == 0.0 and s["ln_ratio"] == 0.0


def test_kld_of_quantized_model_matches_llama_cpp(tmp_path, text, monkeypatch):
    """Q4_0 against its F32 source: cooktop's mean KLD (from its saved base) is llama.cpp's (exact
    float64 KL of llama-cpp-python's two runs) within the uncertainty cooktop prints; same for the
    same-top fraction and the PPL ratio."""
    from cooktop.quality import kld as K
    from cooktop.quality import perplexity as ppl
    from cooktop.quality.logits_file import LogitsWriter, quantize_rows, read_logits_file
    from cooktop.runtime.loader import load_model

    f32, q4 = model_path("tiny/tiny-F32.gguf"), model_path("tiny/tiny-Q4_0.gguf")
    tokens, base_rows = llama_cpp_chunks(f32, text)
    _, q_rows = llama_cpp_chunks(q4, text)
    p = np.concatenate(base_rows)
    q = np.concatenate(q_rows)
    want_kld = float((np.exp(p) * (p - q)).sum(axis=1).mean())
    want_top = float((p.argmax(axis=1) == q.argmax(axis=1)).mean())

    path = tmp_path / "base.kld"
    m = load_model(f32, n_ctx=N_CTX, n_batch=N_CTX, device="cpu", logits_all=True)
    try:
        ch = ppl.chunking(m.tokenizer, len(tokens), N_CTX, N_CTX, N_CHUNK)
        w = LogitsWriter(path, N_CTX, m.cfg.n_vocab, N_CHUNK, tokens)

        def save(logits, targets):
            rows, nll = quantize_rows(logits, targets)
            w.write(rows)
            return nll
        ppl.perplexity(m.model, tokens, ch, on_logits=save)
        w.close()
    finally:
        m.model.close()
    base = read_logits_file(path)
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (N_CTX, 512, N_CHUNK)
    assert list(base.tokens) == list(tokens[:N_CHUNK * N_CTX])
    m = load_model(q4, n_ctx=N_CTX, n_batch=N_CTX, device="cpu", logits_all=True)
    try:
        res = K.compare(m.model, base, N_CTX, 1)
        monkeypatch.setattr(K, "ROW_BLOCK_VALUES", 10 * 512)  # rows in blocks of 10: the same figures
        assert K.compare(m.model, base, N_CTX, 1).summary == res.summary
    finally:
        m.model.close()
    s = res.summary
    assert s["count"] == N_CHUNK * 63
    assert s["kld"] > 10 * s["kld_unc"] > 0  # a real difference, measured
    assert abs(s["kld"] - want_kld) <= s["kld_unc"]
    assert abs(s["same_top"] - want_top) <= s["same_top_unc"]
    lines = res.stats.report()
    assert lines[0] == "====== Perplexity statistics ======"
    assert any(line.startswith("Mean    KLD:") for line in lines)


def test_logits_file_round_trip_and_errors(tmp_path):
    from cooktop.quality.logits_file import dequantize_rows, quantize_rows, read_logits_file, row_width

    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((5, 7)) * 4).astype(np.float32)
    rows, nll = quantize_rows(logits, np.array([0, 1, 2, 3, 4]))
    assert rows.shape == (5, row_width(7)) == (5, 12) and np.all(rows[:, 11] == 0)  # odd n_vocab: one pad
    exact = log_softmax64(logits)
    got = dequantize_rows(rows, 7)
    inside = exact > exact.max(axis=1, keepdims=True) - 16
    assert np.abs(got - exact)[inside].max() <= 16 / 65535
    np.testing.assert_allclose(nll, -exact[np.arange(5), [0, 1, 2, 3, 4]], rtol=1e-5)

    bad = tmp_path / "bad.kld"
    bad.write_bytes(b"not a logits file at all")
    with pytest.raises(CooktopError, match="does not look like a file containing log-probabilities"):
        read_logits_file(bad)
    short = tmp_path / "short.kld"
    short.write_bytes(b"_logits_" + np.array([128, 512, 3], dtype="<i4").tobytes() + b"\0" * 100)
    with pytest.raises(CooktopError, match="is truncated"):
        read_logits_file(short)
    with pytest.raises(CooktopError, match="cannot read"):
        read_logits_file(tmp_path / "missing.kld")


def test_bad_input_is_one_line(tmp_path, stories):
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time there was a cat.")
    r = run_cli("perplexity", "-m", str(stories), "-f", str(short))
    assert r.returncode == 1 and "error: you need at least 1024 tokens to evaluate perplexity" in r.stderr
    r = run_cli("perplexity", "-m", str(stories), "--kl-divergence")
    assert r.returncode == 1 and "--kl-divergence needs --kl-divergence-base FILE" in r.stderr
    r = run_cli("perplexity", "-m", str(stories))
    assert r.returncode == 1 and "give the text to evaluate with -f FILE" in r.stderr
    assert "Traceback" not in r.stderr


def test_kld_table_makes_the_base_and_reports_each_type(tmp_path):
    """kld-table: the base made from F32, then F16 / Q8_0 / Q4_0 on numpy: one row each, KLD rising with
    the quantization, the JSON and the plot written."""
    import json

    tiny = SHARED / "models" / "tiny"
    models = [model_path(f"tiny/tiny-{t}.gguf") for t in ("F16", "Q8_0", "Q4_0")]
    base, png = tmp_path / "base.kld", tmp_path / "kld.png"
    args = ["kld-table", "--base-model", str(tiny / "tiny-F32.gguf"), "-f", str(TEXT), "-c", str(N_CTX),
            "--chunks", str(N_CHUNK), "--kl-divergence-base", str(base), "--device", "cpu", "--plot", str(png)]
    for m in models:
        args += ["-m", str(m)]
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    cells = json.loads(r.stdout)
    assert [(c["device"], c["wtype"]) for c in cells] == [("cpu", "F16"), ("cpu", "Q8_0"), ("cpu", "Q4_0")]
    kld = [c["summary"]["kld"] for c in cells]
    assert 0 < kld[0] < 1e-4 < kld[1] < 1e-2 < kld[2]
    assert all(c["summary"]["count"] == N_CHUNK * 63 and not c["error"] for c in cells)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PPL = " in r.stderr and "3 model(s) x 1 device(s) (cpu)" in r.stderr
    r = run_cli("kld-table", "--kl-divergence-base", str(base), "--device", "cpu", "-m", str(models[1]))
    assert r.returncode == 0, r.stderr
    head, rule, row = r.stdout.splitlines()[:3]
    assert head.split("|")[1:4] == [" device   ", " weights   ", " mean KLD            "]
    assert row.startswith("| cpu      | Q8_0      |") and f"{kld[1]:.6f} ±" in row


def test_progress_bar_counts_the_chunks(monkeypatch, stories):
    """The bar (notices.progress: tqdm on a terminal) gets one update per chunk, and closes."""
    from click.testing import CliRunner

    from cooktop.cli import perplexity as cmd
    from cooktop.cli.group import cli

    seen = []

    class Bar:
        def __init__(self, total, desc, unit):
            seen.append([total, desc, unit, 0, False])

        def update(self, n=1):
            seen[-1][3] += n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            seen[-1][4] = True

    monkeypatch.setattr(cmd.notices, "progress", Bar)
    r = CliRunner().invoke(cli, ["perplexity", "-m", str(stories), "-f", str(TEXT), "-c", "128", "--chunks", "3",
                                 "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert seen == [[3, "perplexity", "chunk", 3, True]]


def test_base_path_never_overwrites_an_input(tmp_path, stories):
    """--kl-divergence-base naming the model, the text or a kld-table model (itself, a symlink, a hard
    link) is refused before anything is written; the inputs keep their bytes."""
    sc, txt = tmp_path / "sc.gguf", tmp_path / "t.txt"
    sc.write_bytes(stories.read_bytes())
    txt.write_text(TEXT.read_text()[:3000])
    (tmp_path / "link.gguf").symlink_to(sc)
    os.link(txt, tmp_path / "hard.txt")
    model_bytes, text_bytes = sc.read_bytes(), txt.read_bytes()
    for base, what in ((sc, "-m"), (tmp_path / "link.gguf", "-m"), (txt, "-f"), (tmp_path / "hard.txt", "-f")):
        r = run_cli("perplexity", "-m", str(sc), "-f", str(txt), "-c", "128", "--chunks", "2",
                    "--kl-divergence-base", str(base))
        assert r.returncode == 1 and f"is the same file as {what}" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    tiny = model_path("tiny/tiny-F32.gguf")
    tc = tmp_path / "tc.gguf"
    tc.write_bytes(tiny.read_bytes())
    tc_bytes = tc.read_bytes()
    for extra, what in ((["--base-model", str(tc), "-m", str(tiny)], "--base-model"),
                        (["--base-model", str(tiny), "-m", str(tc)], "-m")):
        r = run_cli("kld-table", *extra, "-f", str(txt), "-c", "128", "--kl-divergence-base", str(tc),
                    "--device", "cpu")
        assert r.returncode == 1 and f"is the same file as {what}" in r.stderr, r.stderr
    assert sc.read_bytes() == model_bytes and txt.read_bytes() == text_bytes and tc.read_bytes() == tc_bytes
    assert not list(tmp_path.glob("*.part"))


def test_interrupted_base_leaves_no_file(tmp_path, stories):
    """The base is written to a .part file renamed at the end: a run that fails midway leaves neither."""
    from cooktop.quality import perplexity as ppl
    from cooktop.runtime.loader import load_model

    path = tmp_path / "base.kld"
    path.write_bytes(b"old")
    m = load_model(stories, n_ctx=N_CTX, n_batch=N_CTX, device="cpu", logits_all=True)
    try:
        tokens = ppl.tokenize_text(m.tokenizer, TEXT.read_text()[:3000])
        ch = ppl.chunking(m.tokenizer, len(tokens), N_CTX, N_CTX, 2)

        def boom(i, p):
            assert (tmp_path / "base.kld.part").exists()
            raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            ppl.perplexity_saving(m.model, tokens, ch, str(path), on_chunk=boom)
        assert path.read_bytes() == b"old" and not (tmp_path / "base.kld.part").exists()
        ppl.perplexity_saving(m.model, tokens, ch, str(path))
    finally:
        m.model.close()
    assert path.stat().st_size == 20 + 4 * 2 * N_CTX + 2 * 2 * 63 * 516 and not (tmp_path / "base.kld.part").exists()


def test_corrupt_base_is_refused_in_one_line(tmp_path):
    """A base with a token id outside the vocabulary (too large, negative), a NaN / inf scale or bytes
    after its last chunk: one CooktopError naming the file and the place, at open."""
    from cooktop.quality.logits_file import LogitsWriter, quantize_rows, read_logits_file

    rng = np.random.default_rng(2)
    n_ctx, n_vocab, n_chunk = 8, 512, 2
    tokens = rng.integers(0, n_vocab, n_chunk * n_ctx)
    good = tmp_path / "good.kld"
    w = LogitsWriter(good, n_ctx, n_vocab, n_chunk, tokens)
    for _ in range(n_chunk):
        w.write(quantize_rows(rng.standard_normal((3, n_vocab)).astype(np.float32), np.zeros(3, dtype=int))[0])
    w.close()
    assert read_logits_file(good).n_chunk == n_chunk
    data = good.read_bytes()
    tok0, rows0 = 20, 20 + 4 * n_chunk * n_ctx
    row_bytes = 2 * (n_vocab + 4)

    def patched(at: int, raw: bytes) -> pathlib.Path:
        p = tmp_path / f"bad{at}.kld"
        p.write_bytes(data[:at] + raw + data[at + len(raw):])
        return p

    cases = [(patched(tok0 + 4 * 11, np.int32(99999).tobytes()), r"chunk 2, token 3: id 99999 is outside"),
             (patched(tok0 + 4 * 2, np.int32(-7).tobytes()), r"chunk 1, token 2: id -7 is outside"),
             (patched(rows0 + row_bytes * 4, np.float32("nan").tobytes()), r"chunk 2, row 1: scale is nan"),
             (patched(rows0 + row_bytes * 2 + 4, np.float32("-inf").tobytes()),
              r"chunk 1, row 2: min_log_prob is -inf")]
    for p, msg in cases:
        with pytest.raises(CooktopError, match=msg) as e:
            read_logits_file(p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    long = tmp_path / "long.kld"
    long.write_bytes(data + b"\0" * 6)
    with pytest.raises(CooktopError, match="has 6 bytes after its last chunk"):
        read_logits_file(long)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A 2-chunk base of tiny-F32 over GPL-3 (-c 128), made in-process."""
    from cooktop.quality import perplexity as ppl
    from cooktop.quality.logits_file import read_logits_file
    from cooktop.runtime.loader import load_model

    if not TEXT.exists():
        skip_or_fail("shared", f"no {TEXT} (Debian's base-files ships it)")
    path = tmp_path_factory.mktemp("base") / "tiny-F32.kld"
    m = load_model(model_path("tiny/tiny-F32.gguf"), n_ctx=N_CTX, n_batch=N_CTX, device="cpu", logits_all=True)
    try:
        tokens = ppl.tokenize_text(m.tokenizer, TEXT.read_text()[:6000])
        ppl.perplexity_saving(m.model, tokens, ppl.chunking(m.tokenizer, len(tokens), N_CTX, N_CTX, 2), str(path))
    finally:
        m.model.close()
    return read_logits_file(path)


def test_kld_table_keeps_going_past_a_bad_file_and_labels_rows(tmp_path, tiny_base, monkeypatch):
    """A truncated -m file is an error cell with its reason, the others are measured; two files of one
    weight type get their file names; a cell part of whose model ran on the host gets a footnote."""
    from cooktop.quality import table
    from cooktop.runtime import loader
    from cooktop.runtime.placement import Placement

    q8 = model_path("tiny/tiny-Q8_0.gguf")
    trunc, copy = tmp_path / "trunc.gguf", tmp_path / "copy-Q8_0.gguf"
    trunc.write_bytes(q8.read_bytes()[:100000])
    copy.write_bytes(q8.read_bytes())
    real = loader.load_model

    def kept_on_host(path, **kw):  # as vulkan:0 with a type it cannot multiply: block 0 on the host
        m = real(path, **kw)
        if pathlib.Path(path) == copy:
            n = len(m.placement.blocks)
            m.placement = Placement(["cpu"] + ["cpu"] * (n - 1), "cpu",
                                    ["block 0 stays on cpu: vulkan:0 cannot run matmul on BF16"])
        return m
    monkeypatch.setattr(loader, "load_model", kept_on_host)
    cells = table.measure([str(trunc), str(q8), str(copy)], ["cpu"], tiny_base, N_CTX)
    assert [c.wtype for c in cells] == ["? (trunc.gguf)", "Q8_0 (tiny-Q8_0.gguf)", "Q8_0 (copy-Q8_0.gguf)"]
    assert "truncated" in cells[0].error and cells[0].summary is None
    assert cells[1].summary is not None and cells[2].summary == cells[1].summary
    assert cells[1].note == "" and cells[2].note.endswith("block 0 stays on cpu: vulkan:0 cannot run matmul on BF16")
    lines = table.format_table(cells).splitlines()
    assert lines[2].startswith("| cpu      | ? (trunc.gguf)") and "error: " in lines[2] and "truncated" in lines[2]
    assert lines[3].startswith("| cpu      | Q8_0 (tiny-Q8_0.gguf)")
    assert lines[4].startswith("| cpu [1]  | Q8_0 (copy-Q8_0.gguf)")
    assert lines[5:] == ["", "[1] cpu copy-Q8_0.gguf: " + cells[2].note]


def test_kld_table_refuses_a_missing_model_up_front(tmp_path):
    r = run_cli("kld-table", "--base-model", str(model_path("tiny/tiny-F32.gguf")), "-f", str(TEXT), "-c", "128",
                "--kl-divergence-base", str(tmp_path / "b.kld"), "--device", "cpu", "-m", str(tmp_path / "no.gguf"))
    assert r.returncode == 1 and f"error: -m {tmp_path / 'no.gguf'}: no such file" in r.stderr, r.stderr
    assert not (tmp_path / "b.kld").exists() and "Traceback" not in r.stderr


def test_kl_divergence_says_when_c_and_f_are_not_used(tmp_path, tiny_base):
    """--kl-divergence takes n_ctx and the tokens from the base: a different -c or -f gets one line each."""
    tiny = str(model_path("tiny/tiny-F32.gguf"))
    other = tmp_path / "other.txt"
    other.write_text(TEXT.read_text()[3000:9000])
    same = tmp_path / "same.txt"
    same.write_text(TEXT.read_text()[:6000])
    args = ["perplexity", "-m", tiny, "--kl-divergence-base", tiny_base.path, "--kl-divergence"]
    r = run_cli(*args, "-c", "256", "-f", str(other))
    assert r.returncode == 0, r.stderr
    assert "kl_divergence: -c 256 is not used: the chunks are the base's, n_ctx=128" in r.stderr
    assert f"kl_divergence: -f {other} is not used: its tokens differ from the base's" in r.stderr
    r = run_cli(*args, "-c", "128", "-f", str(same))
    assert r.returncode == 0 and "is not used" not in r.stderr, r.stderr
