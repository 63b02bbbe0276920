"""Images in chat messages: llama-cpp-python's multimodal chat handlers over cooktop's vision code.

llama-cpp-python code writes::

    from llama_cpp.llama_chat_format import Llava15ChatHandler
    llm = Llama(model_path="model.gguf", chat_handler=Llava15ChatHandler(clip_model_path="mmproj.gguf"))
    llm.create_chat_completion(messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}]}])

cooktop's handlers (:class:`MTMDChatHandler`, and :class:`Llava15ChatHandler` /
:class:`Gemma3ChatHandler` with the same constructor) open the mmproj when built; ``Llama``
checks it against the model's embedding width. A message's image parts become the media marker
``<__media__>`` in order (llama-server's ``oaicompat_chat_params_parse`` does the same), the
conversation renders with the model's chat template (or ``chat_format`` / ``chat_template``, as
for text), and :func:`cooktop.vision.session.prefill` encodes the images and evaluates the prompt
before the ordinary generation. Unlike llama-cpp-python's handlers, which bring their own jinja
template (LLaVA's ``USER: ... ASSISTANT:``), the model's own template is used, as llama-server does.

Image sources (:func:`load_image`): a ``data:image/...;base64,...`` URI, a local path, or a
``file://`` URL. ``http(s)://`` URLs are refused (cooktop fetches nothing from the network).
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import CooktopError, ImageError
from ..vision import preprocess
from ..vision.mmproj import Mmproj, open_mmproj

#: content part types that carry an image (OpenAI's ``image_url``; llama-cpp-python also reads ``image_url`` only).
IMAGE_TYPES = ("image_url",)


class MTMDChatHandler:
    """A multimodal projector (mmproj GGUF) for ``Llama(chat_handler=...)``, llama-cpp-python's signature.

    Args:
        clip_model_path: the mmproj file (``--mmproj``).
        verbose: accepted (cooktop's notices follow ``Llama(verbose=...)``).
        use_gpu: True: the vision encoder runs on the model's first device when it has the vision
            ops (else the CPU, with a notice); False: always on the CPU (numpy).
    Attributes:
        clip_model_path, verbose, use_gpu: as given; mmproj: the opened :class:`~cooktop.vision.mmproj.Mmproj`.
    Raises:
        GGUFError: a missing or unreadable file, not a GGUF.
        UnsupportedModelError: not an mmproj (a language model), no vision encoder, a projector cooktop
            lacks, missing keys or tensors (:func:`cooktop.vision.mmproj.open_mmproj`).
    """

    def __init__(self, clip_model_path: str, verbose: bool = True, use_gpu: bool = True):
        if not isinstance(clip_model_path, (str, os.PathLike)):
            raise CooktopError(f"clip_model_path must be the path of an mmproj GGUF, not {clip_model_path!r}")
        self.clip_model_path = os.fspath(clip_model_path)
        self.verbose = bool(verbose)
        self.use_gpu = bool(use_gpu)
        self.mmproj: Mmproj = open_mmproj(self.clip_model_path)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(clip_model_path={self.clip_model_path!r}, "
                f"projector={self.mmproj.hparams.projector!r})")


class Llava15ChatHandler(MTMDChatHandler):
    """llama-cpp-python's name for LLaVA 1.5 (the ``mlp`` projector); the same as :class:`MTMDChatHandler`
    (the model's chat template renders the conversation, not LLaVA's own)."""


class Gemma3ChatHandler(MTMDChatHandler):
    """llama-cpp-python's name for Gemma 3 (the ``gemma3`` projector); the same as :class:`MTMDChatHandler`."""


def image_url_of(part: Mapping[str, Any], index: int) -> str:
    """The URL of an ``image_url`` part: ``{"image_url": {"url": URL}}`` or ``{"image_url": URL}``.

    Raises:
        ImageError: no URL string in the part (``messages[index]`` named).
    """
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, Mapping) else ref
    if not isinstance(url, str) or not url:
        raise ImageError(f"messages[{index}]: an image_url part needs a URL string "
                         "({'type': 'image_url', 'image_url': {'url': ...}})")
    return url


def _short(url: str) -> str:
    return url if len(url) <= 60 else url[:57] + "..."


def load_image(url: str) -> np.ndarray:
    """Decode the image an ``image_url`` names.

    Args:
        url: ``data:image/...;base64,DATA`` (or a percent-encoded ``data:`` URI), ``file:///path``
            (``file://localhost/path``), or a local path.
    Returns:
        uint8 [height, width, 3] (:func:`cooktop.vision.preprocess.decode`).
    Raises:
        ImageError: an ``http(s)://`` URL (not fetched) or another scheme, a malformed data URI or
            base64, a file that cannot be read, bytes that are no PNG / JPEG / WebP, an image too large.
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        head, sep, data = url[5:].partition(",")
        if not sep:
            raise ImageError(f"malformed data URI {_short(url)!r}: no ',' before the data")
        if head.split(";")[-1].strip().lower() == "base64":
            try:
                raw = base64.b64decode("".join(data.split()), validate=True)
            except (binascii.Error, ValueError) as e:
                raise ImageError(f"malformed data URI {_short(url)!r}: the base64 data does not decode ({e})") from None
        else:
            raw = urllib.parse.unquote_to_bytes(data)
        if not raw:
            raise ImageError(f"data URI {_short(url)!r} holds no image data")
        return preprocess.decode(raw)
    if scheme in ("http", "https"):
        raise ImageError(f"image URL {_short(url)!r}: cooktop does not fetch {scheme}:// images (no network "
                         "access); download it and give a data: URI, a local path or a file:// URL")
    if scheme == "file":
        u = urllib.parse.urlparse(url)
        if u.netloc not in ("", "localhost"):
            raise ImageError(f"image URL {_short(url)!r}: a file:// URL on another host ({u.netloc}) is not read")
        return preprocess.decode(urllib.request.url2pathname(u.path))
    if len(scheme) > 1 and scheme.isalnum() and not os.path.exists(url):
        raise ImageError(f"image URL {_short(url)!r}: the scheme {scheme!r} is not supported (give a data: URI, "
                         "a local path or a file:// URL)")
    return preprocess.decode(url)
