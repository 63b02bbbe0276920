"""LLaVA 1.5's mlp projector (CLIP ViT with a class embedding, pre-LN, the second-to-last layer or
``clip.vision.feature_layer``, mm.0 -> GELU -> mm.2) against libmtmd at test time (:mod:`mtmd_oracle`).

One synthetic pair (``synth_mmproj.write_mlp_pair``: 70 px images of 14 px patches, 3 blocks of which 2
run, a 64-wide llama text model) and one with feature layers (0, 1, 3); a 150 x 90 image (bicubic resize
padded with (122, 116, 104)). Bounds: image embeddings nmse <= 1e-5 on every backend with the vision ops;
the logits after text, the image's 25 causal rows and text nmse <= 1e-5 on numpy and OpenCL. The variants
cooktop refuses (LLaVA 1.6's pinpoints, mm.3, no mm.2, a feature layer too deep) are refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device, skip_or_fail

from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.tools import synth_mmproj
from cooktop.vision.encoder import VisionEncoder
from cooktop.vision.mmproj import open_mmproj

PROMPT = "a picture: <__media__> says what?"


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(7).integers(0, 256, (90, 150, 3), dtype=np.uint8)


@pytest.fixture(scope="module", params=[(), (0, 1, 3)], ids=["last-but-one", "feature-layers"])
def case(request, tmp_path_factory, image):
    try:
        import llama_cpp.mtmd_cpp  # noqa: F401
        from mtmd_oracle import reference
    except (ImportError, OSError, FileNotFoundError) as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python with libmtmd is not installed ({e}); make setup-compare")
    model, mmproj = synth_mmproj.write_mlp_pair(tmp_path_factory.mktemp("llava"), feature_layers=request.param)
    return model, mmproj, reference(model, mmproj, PROMPT, [image], n_ctx=128, n_batch=32)


@pytest.mark.parametrize("family", registry.FAMILIES)
def test_mlp_image_embeddings_match_mtmd(family, case, image):
    dev = registry.open_device("cpu") if family == "cpu" else open_family_device(family)
    enc = VisionEncoder(open_mmproj(case[1]), dev)
    try:
        got = enc.encode(image)
    finally:
        enc.close()
    want = next(v for kind, v in case[2].chunks if kind == "image")
    err = nmse(got, want)
    print(f"mlp image embeddings on {family}: nmse {err:.3g} vs mtmd")
    assert got.shape == want.shape == (25, 64)
    assert err <= 1e-5
    assert not case[2].non_causal


@pytest.mark.parametrize("family", ["cpu", "opencl"])
def test_mlp_logits_after_an_image_match_mtmd(family, case, image):
    """Text, the 25 image rows (causal: mtmd's rule for mlp), text: the last logits as libmtmd's, on
    numpy and on OpenCL (the encoder on the model's device)."""
    from cooktop import Llama
    from cooktop.vision import prompt as vprompt
    from cooktop.vision.session import encoder_device

    if family != "cpu":
        open_family_device(family)
    model, mmproj, oracle = case
    llm = Llama(model_path=model, n_ctx=128, n_batch=32, verbose=False, device=family, n_gpu_layers=-1)
    try:
        eng = llm._engine
        enc = VisionEncoder(open_mmproj(mmproj), encoder_device(eng.model.segments[0].device))
        try:
            emb = enc.encode(image)
        finally:
            enc.close()
        chunks = vprompt.tokenize(eng.tokenizer, PROMPT, 1, "mlp")
        assert [("image", None) if c.image is not None else ("text", c.ids) for c in chunks] == [
            (k, None if k == "image" else v) for k, v in oracle.chunks]
        logits = vprompt.eval_chunks(eng.seq, chunks, [emb], "mlp")[-1]
        assert eng.seq.n_past == oracle.n_past
    finally:
        llm.close()
    err = nmse(logits, oracle.logits)
    print(f"mlp logits after an image on {family}: nmse {err:.3g} vs mtmd")
    assert err <= 1e-5
    assert int(np.argmax(logits)) == int(np.argmax(oracle.logits))


@pytest.fixture(scope="module")
def plain_mlp(tmp_path_factory):
    """A LLaVA 1.5 mmproj of its own (no libmtmd needed), for the refusals."""
    path = tmp_path_factory.mktemp("llava-refusals") / "mmproj.gguf"
    synth_mmproj.write_mlp(path)
    return str(path)


def test_mlp_hparams(plain_mlp):
    h = open_mmproj(plain_mlp).hparams
    assert (h.projector, h.image_size, h.patch_size, h.ffn_op) == ("mlp", 70, 14, "gelu_quick")  # CLIP's quick GELU
    assert h.n_image_tokens == 25  # one per patch: (70 / 14)^2, the class row dropped


def test_mlp_variants_cooktop_cannot_run_are_refused_by_name(plain_mlp, tmp_path):
    """LLaVA 1.6's image_grid_pinpoints (slicing), a Yi-type mm.3 (MLP_NORM), a file without mm.2 and
    a feature layer past the encoder's depth: each an UnsupportedModelError naming it."""
    from conftest import rewrite_gguf
    from gguf import GGUFValueType

    from cooktop.errors import UnsupportedModelError

    pin = rewrite_gguf(plain_mlp, tmp_path / "pinpoints.gguf", extra_kv=[
        ("clip.vision.image_grid_pinpoints", [336, 672, 672, 336], GGUFValueType.ARRAY)])
    with pytest.raises(UnsupportedModelError, match=r"image_grid_pinpoints \(LLaVA 1\.6's llava-uhd image slicing\) "
                                                    r"is not supported by cooktop"):
        open_mmproj(pin)
    mm3 = rewrite_gguf(plain_mlp, tmp_path / "mm3.gguf", add={"mm.3.weight": (np.ones(64, np.float32), None)})
    with pytest.raises(UnsupportedModelError, match=r"mm\.3 \(llama\.cpp's MLP_NORM, Yi-type LLaVA\)"):
        open_mmproj(mm3)
    no2 = rewrite_gguf(plain_mlp, tmp_path / "no-mm2.gguf", drop_tensors=("mm.2.weight", "mm.2.bias"))
    with pytest.raises(UnsupportedModelError, match=r"missing tensor 'mm\.2\.weight'"):
        open_mmproj(no2)
    deep = rewrite_gguf(plain_mlp, tmp_path / "deep.gguf", drop=("clip.vision.feature_layer",),
                        extra_kv=[("clip.vision.feature_layer", [1, 9], GGUFValueType.ARRAY)])
    with pytest.raises(UnsupportedModelError, match=r"feature_layer \[1, 9\] is out of range"):
        open_mmproj(deep)


def test_prompt_ending_with_an_image_generates_from_the_image_logits(image, tmp_path):
    """No text after the image (mlp puts none around it): ``vision.session.prefill`` evaluates it all and
    generation starts from the logits after the image's last row, none evaluated again. (libmtmd's helper
    asks no logits of an image batch, so llama.cpp has none to compare: these are the rows' own.)"""
    from cooktop import Llama
    from cooktop.vision import prompt as vprompt
    from cooktop.vision.session import prefill

    model, mmproj = synth_mmproj.write_mlp_pair(tmp_path)
    llm = Llama(model_path=model, n_ctx=128, n_batch=32, verbose=False, device="cpu")
    try:
        eng = llm._engine
        pre = prefill(eng, open_mmproj(mmproj), [image], "a picture: <__media__>")
        assert pre.tokens == list(eng.seq.tokens) and pre.tokens[-1] < 0
        logits, n_eval = eng.seq.prefill(pre.tokens)
        assert n_eval == 0
        enc = VisionEncoder(open_mmproj(mmproj), registry.open_device("cpu"))
        try:
            emb = enc.encode(image)
        finally:
            enc.close()
        eng.seq.truncate(0)
        chunks = vprompt.tokenize(eng.tokenizer, "a picture: <__media__>", 1, "mlp")
        again = vprompt.eval_chunks(eng.seq, chunks, [emb], "mlp")[-1]
        assert np.array_equal(logits, again)
        eng.seq.truncate(len(pre.tokens) - 1)
        with pytest.raises(Exception, match="ends with an image needs that image evaluated just before"):
            eng.seq.prefill(pre.tokens)
    finally:
        llm.close()
