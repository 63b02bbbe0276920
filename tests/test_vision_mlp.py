"""LLaVA 1.5's mlp projector (CLIP ViT with a class embedding, pre-LN, the second-to-last layer or
``clip.vision.feature_layer``, mm.0 -> GELU -> mm.2) against libmtmd at test time (:mod:`mtmd_oracle`).

One synthetic pair (``synth_mmproj.write_mlp_pair``: 70 px images of 14 px patches, 3 blocks of which 2
run, a 64-wide llama text model) and one with feature layers (0, 1, 3); a 150 x 90 image (bicubic resize
padded with (122, 116, 104)). Bound: image embeddings nmse <= 1e-5 on every backend with the vision ops.
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
