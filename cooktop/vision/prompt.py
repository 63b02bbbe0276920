"""A prompt with images: its chunks (text ids, images) and their evaluation, as llama.cpp's mtmd.

Tokenization (tools/mtmd/mtmd.cpp ``mtmd_tokenizer``): the prompt is split at each
:data:`MEDIA_MARKER` (``<__media__>``, ``mtmd_default_marker``), one marker per image in order;
each text part is tokenized on its own (``llama_tokenize`` with add_special false, parse_special
true) and appended to the current text chunk; an image adds the projector's begin text
(Gemma 3: ``<start_of_image>``, tokenized with special tokens parsed; LLaVA's mlp: none) to the text before it, then
its own chunk of ``n_image_tokens`` positions, then the end text (``<end_of_image>``) to the next
text chunk; BOS goes first when the vocabulary adds it (``add_bos``). A prompt without markers
gets one per image in front (tools/mtmd/mtmd-cli.cpp).

Evaluation (tools/mtmd/mtmd-helper.cpp ``mtmd_helper_eval_chunks``): text chunks as ordinary
tokens; an image chunk's embeddings go into the forward pass in place of token embeddings
(unscaled), in batches of ``n_batch`` rows, non-causal for the projectors where
``mtmd_decode_use_non_causal`` says so (gemma3): every row of the batch attends to every other.
The positions an image holds are recorded as negative placeholder ids derived from its pixels'
hash, so a cached prefix matches only the same image.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from ..errors import ImageError

#: llama.cpp's media marker (``mtmd_default_marker``).
MEDIA_MARKER = "<__media__>"

#: Per projector: the text before and after an image's embeddings (mtmd.cpp ``img_beg`` / ``img_end``),
#: and whether its image batches are non-causal (``mtmd_decode_use_non_causal``).
PROJECTOR_TEXT = {"gemma3": ("<start_of_image>", "<end_of_image>", True), "mlp": ("", "", False)}


@dataclasses.dataclass
class Chunk:
    """One chunk of a prompt: ``ids`` (a text chunk) or ``image`` (the index of an image)."""

    ids: list[int] = dataclasses.field(default_factory=list)
    image: int | None = None


def with_markers(prompt: str, n_images: int) -> str:
    """``prompt`` with one marker per image in front when it has none (mtmd-cli's rule).

    Raises:
        ImageError: the prompt's marker count differs from the number of images.
    """
    n = prompt.count(MEDIA_MARKER)
    if n == 0 and n_images:
        return MEDIA_MARKER * n_images + prompt
    if n != n_images:
        raise ImageError(f"the prompt has {n} {MEDIA_MARKER} marker(s) but {n_images} image(s) were given")
    return prompt


def tokenize(tokenizer, prompt: str, n_images: int, projector: str) -> list[Chunk]:
    """The chunks of ``prompt`` (with its markers, :func:`with_markers`) for ``n_images`` images.

    ``tokenizer``: cooktop's (``tokenize(text, add_bos, special)``; ``vocab.add_bos`` / ``add_eos``).

    Raises:
        ImageError: marker count and image count differ.
        KeyError: a projector without an entry in :data:`PROJECTOR_TEXT`.
    """
    prompt = with_markers(prompt, n_images)
    beg, end, _ = PROJECTOR_TEXT[projector]
    chunks: list[Chunk] = []

    def add_text(ids: list[int]) -> None:
        if not ids:
            return
        if chunks and chunks[-1].image is None:
            chunks[-1].ids.extend(ids)
        else:
            chunks.append(Chunk(ids=list(ids)))

    parts = prompt.split(MEDIA_MARKER)
    for i, part in enumerate(parts):
        if i:
            if beg:
                add_text(tokenizer.tokenize(beg, add_bos=False, special=True))
            chunks.append(Chunk(image=i - 1))
            if end:
                add_text(tokenizer.tokenize(end, add_bos=False, special=True))
        if part:
            add_text(tokenizer.tokenize(part, add_bos=False, special=True))
    v = tokenizer.vocab
    if v.add_bos and v.bos_id >= 0:
        if chunks and chunks[0].image is None:
            chunks[0].ids.insert(0, v.bos_id)
        else:
            chunks.insert(0, Chunk(ids=[v.bos_id]))
    if v.add_eos and v.eos_id >= 0:
        add_text([v.eos_id])
    return chunks


def placeholder_ids(embd: np.ndarray) -> list[int]:
    """Negative ids for an image's positions (float32 [n, n_embd] embeddings): from the hash of
    the embeddings, so two different images never share a cached prefix."""
    h = int.from_bytes(hashlib.sha256(np.ascontiguousarray(embd).tobytes()).digest()[:4], "little") & 0x3FFFFFFF
    return [-(1 + ((h + j) % 0x3FFFFFFF)) for j in range(len(embd))]


def eval_chunks(seq, chunks: list[Chunk], images: list[np.ndarray], projector: str) -> np.ndarray:
    """Evaluate ``chunks`` on the :class:`~cooktop.engine.sequence.Sequence` ``seq`` after its context;
    ``images``: the embeddings of each image (float32 [n_image_tokens, n_embd]).

    Returns float32 [1, n_vocab]: the logits after the last chunk.
    Raises:
        ContextOverflowError: the prompt does not fit in n_ctx.
    """
    non_causal = PROJECTOR_TEXT[projector][2]
    out = None
    for c in chunks:
        if c.image is None:
            out = seq.eval(c.ids)
        else:
            e = images[c.image]
            out = seq.eval_embd(e, placeholder_ids(e), non_causal=non_causal)
    assert out is not None
    return out
