"""Vision (mmproj) against llama.cpp's libmtmd (llama-cpp-python's ``llama_cpp.mtmd_cpp``, at test time).

One synthetic Gemma 3 pair (``tools/synth_mmproj.py``: a SigLIP encoder of 2 blocks, 48 wide, on
112 px images of 14 px patches, pooled 2 x 2 to 16 tokens, projected to a 64-wide gemma3 text
model) and one 150 x 90 image (resized with padding to 112 x 112, as mtmd does), llama.cpp loaded
once per mmproj (:mod:`mtmd_oracle`). Bounds: image embeddings nmse <= 1e-5 (F32 mmproj) and <= 3e-3
(F16, Q8_0) on every backend with the vision ops (one without them skips, naming the ops); the logits
after a prompt with the image (text, ``<start_of_image>``, 16 image positions evaluated non-causally,
``<end_of_image>``, text) nmse <= 1e-5 on every backend (the encoder on the CPU where the device lacks
the vision ops).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device, skip_or_fail

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.errors import ImageError, UnsupportedModelError
from cooktop.format.gguf import open_gguf
from cooktop.model.config import load_config
from cooktop.tools import synth_mmproj
from cooktop.vision import preprocess
from cooktop.vision import prompt as vprompt
from cooktop.vision.encoder import VISION_OPS, VisionEncoder
from cooktop.vision.mmproj import open_mmproj
from cooktop.vision.session import encoder_device

PROMPT = "a picture: <__media__> says what?"
N_CTX, N_BATCH = 128, 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision")
    model, mmproj = synth_mmproj.write_gemma3_pair(d)
    return model, mmproj


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(7).integers(0, 256, (90, 150, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def oracle(pair, image):
    try:
        import llama_cpp.mtmd_cpp  # noqa: F401
        from mtmd_oracle import reference
    except (ImportError, OSError, FileNotFoundError) as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python with libmtmd is not installed ({e}); make setup-compare")
    return reference(pair[0], pair[1], PROMPT, [image], n_ctx=N_CTX, n_batch=N_BATCH)


def _device(family):
    """The family's device; a skip naming it when it lacks the vision ops (their kernels land per backend)."""
    dev = registry.open_device("cpu") if family == "cpu" else open_family_device(family)
    missing = [op for op in VISION_OPS if not dev.supports(op)]
    if missing:
        pytest.skip(f"{dev.info.selector} has no {', '.join(missing)} yet")
    return dev


@pytest.mark.parametrize("family", registry.FAMILIES)
def test_image_embeddings_match_mtmd(family, pair, image, oracle):
    dev = _device(family)
    enc = VisionEncoder(open_mmproj(pair[1]), dev)
    try:
        got = enc.encode(image)
    finally:
        enc.close()
    want = next(v for kind, v in oracle.chunks if kind == "image")
    err = nmse(got, want)
    print(f"gemma3 image embeddings on {family}: nmse {err:.3g} vs mtmd")
    assert got.shape == want.shape == (16, 64)
    assert err <= 1e-5


#: Quantized mmproj files (the text model stays F32): 64 wide (Q8_0 rows are whole blocks of 32)
QSHAPE = synth_mmproj.VisionShape(n_embd=64, n_ff=96)


@pytest.fixture(scope="module")
def quantized(pair, image, tmp_path_factory):
    """mmproj file per type -> llama.cpp's embeddings of the image (one mtmd load each)."""
    try:
        import llama_cpp.mtmd_cpp  # noqa: F401
        from mtmd_oracle import reference
    except (ImportError, OSError, FileNotFoundError) as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python with libmtmd is not installed ({e}); make setup-compare")
    d = tmp_path_factory.mktemp("vision-q")
    out = {}
    for ft in ("F16", "Q8_0"):
        p = str(d / f"mmproj-{ft}.gguf")
        synth_mmproj.write_gemma3(p, QSHAPE, ft, seed=5)
        res = reference(pair[0], p, "<__media__>", [image], n_ctx=N_CTX, n_batch=N_BATCH)
        out[ft] = (p, next(v for kind, v in res.chunks if kind == "image"))
    return out


_LAVAPIPE = pytest.mark.slow(reason="lavapipe builds its Vulkan pipelines (the text model's, Q8_0's) in 20-70 s")


@pytest.mark.parametrize("family,ft", [pytest.param(fam, ft, marks=[_LAVAPIPE] if (fam, ft) == ("vulkan", "Q8_0")
                                                    else [], id=f"{fam}-{ft}")
                                       for fam in registry.FAMILIES for ft in ("F16", "Q8_0")])
def test_quantized_mmproj_embeddings_match_mtmd(family, ft, image, quantized):
    path, want = quantized[ft]
    enc = VisionEncoder(open_mmproj(path), _device(family))
    try:
        got = enc.encode(image)
    finally:
        enc.close()
    err = nmse(got, want)
    print(f"gemma3 {ft} mmproj embeddings on {family}: nmse {err:.3g} vs mtmd")
    assert err <= 3e-3


def test_chunks_match_mtmd_tokenize(pair, oracle):
    llm = Llama(model_path=pair[0], n_ctx=N_CTX, verbose=False)
    try:
        chunks = vprompt.tokenize(llm._engine.tokenizer, PROMPT, 1, "gemma3")
    finally:
        llm.close()
    got = [("image", None) if c.image is not None else ("text", c.ids) for c in chunks]
    want = [(k, None if k == "image" else v) for k, v in oracle.chunks]
    assert got == want
    assert oracle.non_causal


@pytest.mark.parametrize("family", [pytest.param(f, marks=[_LAVAPIPE] if f == "vulkan" else [])
                                    for f in registry.FAMILIES])
def test_logits_after_an_image_match_mtmd(family, pair, image, oracle):
    if family != "cpu":
        open_family_device(family)
    llm = Llama(model_path=pair[0], n_ctx=N_CTX, n_batch=N_BATCH, verbose=False, device=family, n_gpu_layers=-1)
    try:
        eng = llm._engine
        enc = VisionEncoder(open_mmproj(pair[1]), encoder_device(eng.model.segments[0].device))
        try:
            emb = enc.encode(image)
        finally:
            enc.close()
        chunks = vprompt.tokenize(eng.tokenizer, PROMPT, 1, "gemma3")
        logits = vprompt.eval_chunks(eng.seq, chunks, [emb], "gemma3")[-1]
        assert eng.seq.n_past == oracle.n_past
    finally:
        llm.close()
    err = nmse(logits, oracle.logits)
    print(f"gemma3 logits after an image on {family}: nmse {err:.3g} vs mtmd")
    assert err <= 1e-5
    assert int(np.argmax(logits)) == int(np.argmax(oracle.logits))


def test_image_in_a_window_cache_matches_mtmd(pair, image, oracle, monkeypatch):
    """The sliding-window layers keeping only their window (``swa_full=False``, cells padded to 1 so
    the tiny context splits: n_swa 16 + n_batch 16 cells, compacted while the prompt runs) give the
    image prompt's logits of the full cache: the image rows attend in the window cells."""
    from cooktop.model import swa
    monkeypatch.setattr(swa, "PAD", 1)
    llm = Llama(model_path=pair[0], n_ctx=N_CTX, n_batch=16, verbose=False, swa_full=False)
    try:
        eng = llm._engine
        cache = eng.seq.cache
        assert 0 < cache.n_swa_cells < N_CTX
        enc = VisionEncoder(open_mmproj(pair[1]), encoder_device(eng.model.segments[0].device))
        try:
            emb = enc.encode(image)
        finally:
            enc.close()
        chunks = vprompt.tokenize(eng.tokenizer, PROMPT, 1, "gemma3")
        logits = vprompt.eval_chunks(eng.seq, chunks, [emb], "gemma3")[-1]
        assert eng.seq.n_past == oracle.n_past > cache.n_swa_cells and cache.swa_offsets[0] > 0
    finally:
        llm.close()
    assert nmse(logits, oracle.logits) <= 1e-5


def test_image_attention_is_non_causal(pair, image):
    """The first image row sees the last: changing the last image row changes the first row's output."""
    llm = Llama(model_path=pair[0], n_ctx=N_CTX, n_batch=N_BATCH, verbose=False, logits_all=True)
    try:
        seq = llm._engine.seq
        emb = np.random.default_rng(1).normal(0, 1, (4, 64)).astype(np.float32)
        outs = []
        for last in (0.0, 5.0):
            e = emb.copy()
            e[-1] += last
            seq.truncate(0)
            seq.eval([2, 5])
            outs.append(llm._engine.model.forward(np.array([-1, -2, -3, -4]), 2, seq.cache, True,
                                                  embd=e, non_causal=True)[0])
        assert not np.allclose(outs[0], outs[1])
        causal = []
        for last in (0.0, 5.0):
            e = emb.copy()
            e[-1] += last
            causal.append(llm._engine.model.forward(np.array([-1, -2, -3, -4]), 2, seq.cache, True, embd=e)[0])
        np.testing.assert_array_equal(causal[0], causal[1])
    finally:
        llm.close()


def test_mmproj_hparams(pair):
    mp = open_mmproj(pair[1])
    h = mp.hparams
    assert (h.projector, h.image_size, h.patch_size, h.n_embd, h.n_head, h.n_merge, h.n_embd_out, h.ffn_op) == (
        "gemma3", 112, 14, 48, 4, 2, 64, "gelu")
    assert h.n_image_tokens == 16 and h.image_mean == (0.5, 0.5, 0.5)


def test_mmproj_as_the_model_is_refused(pair):
    with pytest.raises(UnsupportedModelError, match="is an mmproj .*--mmproj"):
        load_config(open_gguf(pair[1]))
    with pytest.raises(UnsupportedModelError, match="is a language model .*--mmproj"):
        open_mmproj(pair[0])


def test_unknown_projector_and_width_mismatch_are_refused(pair, tmp_path):
    from conftest import rewrite_gguf
    from gguf import GGUFValueType

    bad = rewrite_gguf(pair[1], tmp_path / "qwen.gguf", drop=("clip.projector_type",),
                       extra_kv=[("clip.projector_type", "qwen2vl_merger", GGUFValueType.STRING)])
    with pytest.raises(UnsupportedModelError, match="'qwen2vl_merger' .*not supported by cooktop; supported: gemma3"):
        open_mmproj(bad)
    with pytest.raises(UnsupportedModelError, match="64 wide but .* n_embd is 96"):
        open_mmproj(pair[1]).check_model(96, "other.gguf")


def test_bad_images_are_clear_errors(tmp_path):
    from PIL import Image

    txt = tmp_path / "notes.txt"
    txt.write_text("not an image")
    with pytest.raises(ImageError, match="is not an image"):
        preprocess.decode(txt)
    png = tmp_path / "ok.png"
    Image.fromarray(np.zeros((40, 40, 3), np.uint8) + 100).save(png)
    data = png.read_bytes()
    with pytest.raises(ImageError, match="truncated or corrupt"):
        preprocess.decode(data[: len(data) // 2])
    # a 20000 x 20000 PNG header (a decompression bomb): refused from the header, nothing decoded
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))  # noqa: E731
    bomb = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 60001))
            + chunk(b"IEND", b""))
    with pytest.raises(ImageError, match="too large to decode .*400000000 pixels"):
        preprocess.decode(bomb)
    with pytest.raises(ImageError, match="40 x 40 .*over the limit of 0.0 megapixels"):
        preprocess.decode(data, max_pixels=1000)
    with pytest.raises(ImageError, match="cannot read image"):
        preprocess.decode(tmp_path / "missing.png")
    assert preprocess.decode(data).shape == (40, 40, 3)


def test_resize_pads_like_mtmd():
    img = np.full((90, 150, 3), 200, np.uint8)
    out = preprocess.resize_pad(img, 112, 112)
    # scale 112/150: 112 x ceil(90 * 0.7467) = 68 rows, centred: rows 22..89
    assert out.shape == (112, 112, 3)
    assert (out[:22] == 0).all() and (out[90:] == 0).all() and (out[22:90] == 200).all()


def test_marker_count_must_match_images():
    with pytest.raises(ImageError, match="2 <__media__> marker"):
        vprompt.with_markers("<__media__> and <__media__>", 1)
    assert vprompt.with_markers("hi", 2) == "<__media__><__media__>hi"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_decodes_png_jpeg_webp_to_rgb(fmt, tmp_path):
    from PIL import Image

    img = np.zeros((12, 20, 3), np.uint8)
    img[:, 10:] = (200, 40, 90)
    p = tmp_path / f"x.{fmt.lower()}"
    opts = {"WEBP": {"lossless": True}, "JPEG": {"quality": 95, "subsampling": 0}}.get(fmt, {})
    Image.fromarray(img).convert("RGBA" if fmt != "JPEG" else "RGB").save(p, fmt, **opts)
    got = preprocess.decode(p)
    assert got.shape == (12, 20, 3) and got.dtype == np.uint8
    tol = 8 if fmt == "JPEG" else 0  # lossy
    assert np.abs(got.astype(int) - img).max() <= tol


def test_cli_run_with_an_image_is_the_python_pipeline(pair, image, tmp_path):
    """``cooktop run --mmproj --image`` prints what session.prefill + Engine.generate give (greedy)."""
    import os
    import subprocess
    import sys

    from PIL import Image

    from cooktop.engine.sampling import SamplingParams
    from cooktop.vision.session import prefill

    png = tmp_path / "img.png"
    Image.fromarray(image).save(png)
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "run", "-m", pair[0], "--mmproj", pair[1], "--image",
                        str(png), "-p", PROMPT, "-n", "6", "--temp", "0", "--device", "cpu", "-c", str(N_CTX)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "image encode time" in r.stderr and "(16 positions) on cpu" in r.stderr
    llm = Llama(model_path=pair[0], n_ctx=N_CTX, verbose=False, device="cpu")
    try:
        eng = llm._engine
        pre = prefill(eng, pair[1], [str(png)], PROMPT)
        gen = eng.generate(pre.tokens, 6, SamplingParams(temperature=0.0))
        text = "".join(step.text for step in gen)
    finally:
        llm.close()
    assert r.stdout == PROMPT + text + "\n"
    bad = subprocess.run([sys.executable, "-m", "cooktop.cli", "run", "-m", pair[0], "--image", str(png), "-p", "x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "--image needs --mmproj FILE" in bad.stderr and "Traceback" not in bad.stderr
