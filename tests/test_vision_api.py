"""Images in the Python API: ``Llama(chat_handler=MTMDChatHandler(...))`` and ``image_url`` parts.

One synthetic Gemma 3 pair (``tools/synth_mmproj.py``: 16 image positions into a 64-wide gemma3
text model without a chat template, so ``chat_format="gemma"``) on the CPU, one 150 x 90 PNG; one
LLaVA 1.5 (mlp) pair through ``Llava15ChatHandler`` (``chat_format="chatml"``). The
chat answer (greedy) must be the hand-run pipeline's on the same rendered prompt: the conversation
rendered with the image part as ``<__media__>``, :func:`cooktop.vision.session.prefill` on a
separately loaded engine, then ``Engine.generate``; the image as a data URI, a path and a
``file://`` URL gives the same answer, and so does the stream. Bad sources and handlers are
``CooktopError`` subclasses with messages that name the cause.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

import cooktop
from cooktop import Llama
from cooktop.api.multimodal import Gemma3ChatHandler, Llava15ChatHandler, MTMDChatHandler, load_image
from cooktop.api.options import UnsupportedArgumentError
from cooktop.engine.sampling import SamplingParams
from cooktop.errors import ChatTemplateError, CooktopError, GGUFError, ImageError, UnsupportedModelError
from cooktop.text.chat_messages import images_to_markers
from cooktop.tools import synth_mmproj
from cooktop.vision.session import prefill

N_CTX, N_BATCH = 128, 32
OPTS = dict(n_ctx=N_CTX, n_batch=N_BATCH, device="cpu", chat_format="gemma", verbose=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth_mmproj.write_gemma3_pair(tmp_path_factory.mktemp("vision_api"))


@pytest.fixture(scope="module")
def png(tmp_path_factory):
    from PIL import Image

    img = np.random.default_rng(7).integers(0, 256, (90, 150, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    path = tmp_path_factory.mktemp("vision_api_img") / "img.png"
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture(scope="module")
def uri(png):
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()


@pytest.fixture(scope="module")
def llm(pair):
    model, mmproj = pair
    m = Llama(model, chat_handler=MTMDChatHandler(clip_model_path=mmproj), **OPTS)
    yield m
    m.close()


def _messages(url, string_form=False):
    part = {"type": "image_url", "image_url": url if string_form else {"url": url}}
    return [{"role": "system", "content": "You look at pictures."},
            {"role": "user", "content": [{"type": "text", "text": "a picture:"}, part,
                                         {"type": "text", "text": "says what?"}]}]


def _ask(llm, url, **kw):
    return llm.create_chat_completion(messages=_messages(url), temperature=0, max_tokens=4, **kw)


@pytest.fixture(scope="module")
def answer(llm, uri):
    return _ask(llm, uri)


def test_chat_with_image_matches_the_pipeline_by_hand(pair, llm, png, uri, answer):
    model, mmproj = pair
    marked, parts = images_to_markers(_messages(uri))
    assert len(parts) == 1
    text, _, stops = llm._chat_render(marked)
    assert text.count("<__media__>") == 1 and "a picture:\n<__media__>\nsays what?" in text
    eng = cooktop.load(model, n_ctx=N_CTX, n_batch=N_BATCH, device="cpu")
    try:
        pre = prefill(eng, mmproj, [str(png)], text)
        assert pre.n_images == 1 and pre.n_image_tokens == 16
        gen = eng.generate(pre.tokens, 4, SamplingParams(temperature=0.0), stops)
        steps = list(gen)
    finally:
        eng.close()
    want = "".join(s.text for s in steps)
    n_gen = sum(s.token is not None for s in steps)
    assert answer["object"] == "chat.completion"
    ch = answer["choices"][0]
    assert ch["message"] == {"role": "assistant", "content": want}
    assert ch["finish_reason"] == ("length" if n_gen == 4 else "stop")
    u = answer["usage"]
    assert (u["prompt_tokens"], u["completion_tokens"]) == (len(pre.tokens), n_gen)
    assert u["total_tokens"] == len(pre.tokens) + n_gen
    assert sum(t < 0 for t in pre.tokens) == 16  # the image's positions count as prompt tokens
    assert want and n_gen > 0


def test_path_file_url_and_string_form_answer_as_the_data_uri(llm, png, uri, answer):
    want = answer["choices"][0]["message"]["content"]
    for url in (str(png), png.as_uri(), "file://localhost" + png.as_uri()[len("file://"):]):
        got = _ask(llm, url)
        assert got["choices"][0]["message"]["content"] == want, url
        assert got["usage"]["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    got = llm.create_chat_completion(messages=_messages(uri, string_form=True), temperature=0, max_tokens=4)
    assert got["choices"][0]["message"]["content"] == want


def test_stream_concatenates_to_the_answer(llm, uri, answer):
    chunks = list(_ask(llm, uri, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == answer["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"]["prompt_tokens"] == answer["usage"]["prompt_tokens"]


def test_text_after_an_image_answers_as_a_text_only_llama(pair, llm, uri):
    _ask(llm, uri)  # the cache now holds an image's placeholder positions
    msgs = [{"role": "user", "content": "hi"}]
    r = llm.create_chat_completion(messages=msgs, temperature=0, max_tokens=4)
    with Llama(pair[0], **OPTS) as plain:
        want = plain.create_chat_completion(messages=msgs, temperature=0, max_tokens=4)
    assert r["choices"][0]["message"] == want["choices"][0]["message"]
    assert r["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    _ask(llm, uri)
    state = llm.save_state()
    with pytest.raises(CooktopError, match="this state holds image positions"):
        llm.load_state(state)


def test_apply_chat_template_shows_the_marker(llm, uri):
    text = llm.apply_chat_template(_messages(uri))
    assert "a picture:\n<__media__>\nsays what?" in text and "base64" not in text


def test_a_repeated_image_call_answers_the_same(llm, uri, answer):
    # each image call encodes and evaluates its whole prompt again (prefill): nothing counts as cached
    again = _ask(llm, uri)
    assert again["choices"][0]["message"] == answer["choices"][0]["message"]
    assert again["usage"] == answer["usage"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 < again["usage"]["prompt_tokens"]


def test_handler_names_and_exports(pair):
    assert issubclass(Llava15ChatHandler, MTMDChatHandler) and issubclass(Gemma3ChatHandler, MTMDChatHandler)
    assert cooktop.Llava15ChatHandler is Llava15ChatHandler and cooktop.MTMDChatHandler is MTMDChatHandler
    h = Llava15ChatHandler(clip_model_path=pair[1], verbose=False, use_gpu=False)
    assert h.mmproj.hparams.projector == "gemma3" and "mmproj.gguf" in repr(h)


@pytest.mark.parametrize("url, match", [
    ("https://example.com/cat.png", r"does not fetch https:// images"),
    ("http://example.com/cat.png", r"does not fetch http:// images"),
    ("data:image/png;base64,@@not base64@@", r"base64 data does not decode"),
    ("data:image/png;base64", r"no ','"),
    ("data:image/png;base64,", r"holds no image data"),
    ("data:image/png;base64," + base64.b64encode(b"plain text, no picture").decode(),
     r"image data is not an image cooktop reads \(PNG, JPEG or WebP\)"),
    ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA", r"truncated or corrupt"),
    ("ftp://example.com/cat.png", r"scheme 'ftp' is not supported"),
    ("file://otherhost/cat.png", r"another host"),
    ("/no/such/image.png", r"cannot read image /no/such/image.png"),
])
def test_bad_image_sources_are_image_errors(llm, url, match):
    with pytest.raises(ImageError, match=match):
        _ask(llm, url)


def test_image_part_without_url_and_marker_mismatch(llm, uri):
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
    with pytest.raises(ImageError, match=r"messages\[0\]: an image_url part needs a URL"):
        llm.create_chat_completion(messages=msgs, max_tokens=1)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "<__media__> and"},
                                         {"type": "image_url", "image_url": {"url": uri}}]}]
    with pytest.raises(ImageError, match=r"2 <__media__> marker\(s\) but 1 image"):
        llm.create_chat_completion(messages=msgs, max_tokens=1)


def test_load_image_decodes_a_data_uri(png, uri):
    a = load_image(uri)
    assert a.shape == (90, 150, 3) and a.dtype == np.uint8
    assert np.array_equal(a, load_image(str(png)))


def test_image_parts_without_a_handler_keep_the_refusal(pair, uri):
    with Llama(pair[0], **OPTS) as plain:
        with pytest.raises(ChatTemplateError, match=r"has a 'image_url' part: this model reads text only"):
            _ask(plain, uri)


def test_llava_pair_through_llava15_handler(tmp_path, png, uri):
    model, mmproj = synth_mmproj.write_mlp_pair(tmp_path)
    opts = {**OPTS, "chat_format": "chatml", "n_ctx": 256}  # its byte-level vocabulary: ~150 prompt tokens
    with Llama(model, chat_handler=Llava15ChatHandler(clip_model_path=mmproj), **opts) as llava:
        got = _ask(llava, uri)
        text, _, stops = llava._chat_render(images_to_markers(_messages(uri))[0])
    eng = cooktop.load(model, n_ctx=256, n_batch=N_BATCH, device="cpu")
    try:
        pre = prefill(eng, mmproj, [str(png)], text)
        steps = list(eng.generate(pre.tokens, 4, SamplingParams(temperature=0.0), stops))
    finally:
        eng.close()
    assert got["choices"][0]["message"]["content"] == "".join(s.text for s in steps)
    assert got["usage"]["prompt_tokens"] == len(pre.tokens) and pre.n_image_tokens == 25


def test_bad_handlers_are_clear_errors(pair, tmp_path):
    model, _ = pair
    with pytest.raises(GGUFError):
        MTMDChatHandler(clip_model_path=str(tmp_path / "missing.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(GGUFError):
        MTMDChatHandler(clip_model_path=str(junk))
    with pytest.raises(UnsupportedModelError, match="is a language model"):
        MTMDChatHandler(clip_model_path=model)
    with pytest.raises(UnsupportedArgumentError, match="only multimodal projectors"):
        Llama(model, chat_handler=lambda **kw: None, **OPTS)
    wide = tmp_path / "wide-mmproj.gguf"
    synth_mmproj.write_gemma3(wide, synth_mmproj.VisionShape(n_embd_text=96))
    with pytest.raises(UnsupportedModelError, match=r"96 wide but .*n_embd is 64: this mmproj belongs to another"):
        Llama(model, chat_handler=Gemma3ChatHandler(clip_model_path=str(wide)), **OPTS)
    for err in (GGUFError, UnsupportedModelError, UnsupportedArgumentError, ImageError, ChatTemplateError):
        assert issubclass(err, CooktopError)



def test_handler_path_and_normalisation_are_checked(pair, tmp_path):
    """``clip_model_path=None`` and an mmproj whose image_std holds a 0 (every pixel would divide by
    it, NaN logits later) are refused when the handler is built, naming the fault."""
    from conftest import rewrite_gguf
    from gguf import GGUFValueType

    from cooktop.errors import CooktopError, UnsupportedModelError

    with pytest.raises(CooktopError, match="clip_model_path must be the path of an mmproj GGUF, not None"):
        MTMDChatHandler(clip_model_path=None)
    bad = rewrite_gguf(pair[1], tmp_path / "std0.gguf", drop=("clip.vision.image_std",),
                       extra_kv=[("clip.vision.image_std", [0.5, 0.0, 0.5], GGUFValueType.ARRAY)])
    with pytest.raises(UnsupportedModelError, match=r"image_std must be 3 positive numbers"):
        MTMDChatHandler(clip_model_path=str(bad))


def test_image_split_over_batches_is_said(pair, uri, caplog):
    """A non-causal (gemma3) image longer than n_batch: evaluated in batches as mtmd's helper does, with
    a warning naming the n_batch that would keep it whole."""
    import logging

    m = Llama(pair[0], chat_handler=MTMDChatHandler(clip_model_path=pair[1]), **{**OPTS, "n_batch": 8})
    try:
        with caplog.at_level(logging.WARNING, logger="cooktop"):
            _ask(m, uri)
    finally:
        m.close()
    assert any("an image of 16 positions in batches of n_batch = 8" in r.getMessage() and "-b) to 16" in
               r.getMessage() for r in caplog.records if r.levelname == "WARNING")
