"""A prompt with images on a loaded engine: open the mmproj, encode the images, evaluate the prompt.

What ``cooktop run --mmproj FILE --image FILE`` does before generating (llama.cpp
tools/mtmd/mtmd-cli.cpp: load the media, ``mtmd_tokenize``, ``mtmd_helper_eval_chunks``, then
sample): every chunk but the last text chunk is evaluated into the engine's default sequence
(:func:`~.prompt.eval_chunks`); the returned ids are the whole prompt as the sequence records it
(image positions as placeholder ids), so ``Engine.generate`` reuses everything cached and
evaluates the last text chunk itself.
"""

from __future__ import annotations

import dataclasses
import os
import time

from ..errors import ImageError
from ..notices import notice
from . import preprocess
from . import prompt as vprompt
from .encoder import VisionEncoder
from .mmproj import open_mmproj


@dataclasses.dataclass
class Prefilled:
    """What :func:`prefill` did.

    Attributes:
        tokens: the prompt's ids for ``Engine.generate`` (negative placeholder ids at the image positions).
        n_images: images encoded; n_image_tokens: positions they took in all.
        encode_ms: time in the vision encoder (preprocessing included).
        eval_ms, n_eval: time and positions of the chunks evaluated before the last text chunk.
        device: the encoder's device selector.
    """

    tokens: list[int]
    n_images: int
    n_image_tokens: int
    encode_ms: float
    eval_ms: float
    n_eval: int
    device: str

    def lines(self) -> list[str]:
        """llama.cpp-style timing lines (mtmd-cli prints "image slice encoded in N ms")."""
        return [f"cooktop: image encode time = {self.encode_ms:10.2f} ms / {self.n_images:5d} images "
                f"({self.n_image_tokens} positions) on {self.device}",
                f"cooktop: image prompt eval time = {self.eval_ms:10.2f} ms / {self.n_eval:5d} positions "
                "(text and images before the last text chunk)"]


def encoder_device(device):
    """The device the encoder runs on: ``device`` (the model's first segment's) when it has the vision
    ops (:data:`~.encoder.VISION_OPS`), else the numpy CPU device, with a notice."""
    from ..backends import registry
    from .encoder import VISION_OPS

    if all(device.supports(op) for op in VISION_OPS + ("gelu",)):
        return device
    notice(f"{device.info.selector} has no vision ops yet: the vision encoder runs on the CPU (numpy)",
           once_key=f"vision-cpu-{device.info.selector}")
    return registry.open_device("cpu")


def prefill(eng, mmproj_path: str | os.PathLike, image_paths: list[str], text: str,
            add_bos: bool = True) -> Prefilled:
    """Encode ``image_paths`` with ``mmproj_path``'s encoder (on the device of the model's first
    segment, or the CPU when that device lacks the vision ops) and evaluate ``text``
    (``<__media__>`` markers, one per image; none: all in front) up to its last text chunk on ``eng.seq``.

    Returns:
        :class:`Prefilled` (its ``tokens``: the prompt's ids for ``eng.generate``).
    Raises:
        GGUFError / UnsupportedModelError: a bad mmproj, one for another model (embedding width),
            a projector cooktop lacks.
        ImageError: an image that cannot be read (not an image, truncated, too large), no image,
            marker count differing from the images.
        ContextOverflowError: the prompt with its images does not fit in n_ctx.
    """
    mp = open_mmproj(mmproj_path)
    mp.check_model(eng.cfg.n_embd, str(getattr(eng.gf, "path", "the model")))
    if not image_paths:
        raise ImageError("--mmproj without --image: give at least one image (--image FILE)")
    images = [preprocess.decode(p) for p in image_paths]
    chunks = vprompt.tokenize(eng.tokenizer, text, len(images), mp.hparams.projector)
    if not add_bos and chunks and chunks[0].image is None and chunks[0].ids[:1] == [eng.tokenizer.vocab.bos_id]:
        chunks[0].ids.pop(0)
    t0 = time.perf_counter()
    enc = VisionEncoder(mp, encoder_device(eng.model.segments[0].device))
    try:
        embs = [enc.encode(im) for im in images]
        dev = enc.device.info.selector
    finally:
        enc.close()
    t1 = time.perf_counter()
    eng.seq.truncate(0)
    last = chunks[-1] if chunks[-1].image is None else None
    body = chunks[:-1] if last is not None else chunks
    if body:
        vprompt.eval_chunks(eng.seq, body, embs, mp.hparams.projector)
    t2 = time.perf_counter()
    return Prefilled(list(eng.seq.tokens) + (last.ids if last is not None else []), len(images),
                     sum(len(e) for e in embs), (t1 - t0) * 1e3, (t2 - t1) * 1e3, eng.seq.n_past, dev)
