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

import numpy as np

from ..errors import ImageError
from ..notices import notice
from . import preprocess
from . import prompt as vprompt
from .encoder import VisionEncoder
from .mmproj import Mmproj, open_mmproj


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


def load_inputs(mmproj_path: str | os.PathLike, image_paths: list[str]) -> tuple[Mmproj, list[np.ndarray]]:
    """Open the mmproj and decode the images (before a model loads, so a bad file fails at once).

    Returns:
        (the :class:`~.mmproj.Mmproj`, uint8 [h, w, 3] per image).
    Raises:
        GGUFError / UnsupportedModelError: a bad mmproj or a projector cooktop lacks.
        ImageError: no image, or one that cannot be read (not an image, truncated, too large).
    """
    mp = open_mmproj(mmproj_path)
    if not image_paths:
        raise ImageError("--mmproj without --image: give at least one image (--image FILE)")
    return mp, [preprocess.decode(p) for p in image_paths]


def prefill(eng, mmproj: str | os.PathLike | Mmproj, images: list, text: str, add_bos: bool = True,
            use_gpu: bool = True) -> Prefilled:
    """Encode ``images`` (paths, or decoded uint8 [h, w, 3] arrays with an opened mmproj) with the
    mmproj's encoder (on the device of the model's first segment, or the CPU when that device lacks
    the vision ops or ``use_gpu`` is False) and evaluate ``text``
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
    decoded: list[np.ndarray]
    if isinstance(mmproj, Mmproj) and all(isinstance(im, np.ndarray) for im in images):
        mp, decoded = mmproj, list(images)
    else:
        mp, decoded = load_inputs(mmproj.path if isinstance(mmproj, Mmproj) else mmproj,
                                  [im for im in images if not isinstance(im, np.ndarray)])
        if len(decoded) != len(images):
            raise ImageError("prefill takes image paths or decoded images, not both")
    if not decoded:
        raise ImageError("--mmproj without --image: give at least one image (--image FILE)")
    mp.check_model(eng.cfg.n_embd, str(getattr(eng.gf, "path", "the model")))
    chunks = vprompt.tokenize(eng.tokenizer, text, len(decoded), mp.hparams.projector)
    if not add_bos and chunks and chunks[0].image is None and chunks[0].ids[:1] == [eng.tokenizer.vocab.bos_id]:
        chunks[0].ids.pop(0)
    t0 = time.perf_counter()
    if use_gpu:
        enc_dev = encoder_device(eng.model.segments[0].device)
    else:
        from ..backends import registry

        enc_dev = registry.open_device("cpu")
    enc = VisionEncoder(mp, enc_dev)
    try:
        embs = [enc.encode(im) for im in decoded]
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
    return Prefilled(list(eng.seq.tokens) + (last.ids if last is not None else []), len(decoded),
                     sum(len(e) for e in embs), (t1 - t0) * 1e3, (t2 - t1) * 1e3, eng.seq.n_past, dev)
