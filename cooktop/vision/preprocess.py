"""Image decoding and preprocessing as llama.cpp's mtmd does it.

Decoding is Pillow's (PNG, JPEG, WebP), converted to 8-bit RGB as mtmd's stb_image loader
does (alpha dropped, grey replicated, no EXIF rotation: ``mtmd_helper_bitmap_init_from_file``
asks stb_image for 3 channels). JPEG decoders differ in their last bit (stb_image against
libjpeg), so a JPEG's pixels can differ from mtmd's by one or two levels; PNG and WebP
(lossless) decode identically.

A file that is not an image, a truncated or corrupt one, and an image over :data:`MAX_PIXELS`
(checked from the header before any pixel is decoded: a decompression bomb such as a 20000 x
20000 PNG of a few KB never allocates its pixels) raise :class:`~cooktop.errors.ImageError`.

Preprocessing (tools/mtmd/mtmd-image.cpp): the fixed-size preprocessor
(``mtmd_image_preprocessor_fixed_size``, Gemma 3's) resizes to ``image_size`` x ``image_size``
with ``img_tool::resize``'s PAD_CEIL rule: the image is scaled by
``min(size / w, size / h)`` (float32) to ``min(ceil(w * scale), size)`` x
``min(ceil(h * scale), size)`` with a Pillow-compatible resampler (Pillow's own ``resize``:
llama.cpp's ``resize_pillow`` is a port of Pillow's Resample.c, same fixed-point weights), then
centred on a black canvas at ``((size - new_w) // 2, (size - new_h) // 2)``; an image already of
that size is copied. Normalisation (clip-impl.h ``clip_image_f32::from_u8`` / ``normalize``):
``(u8 / 255 - mean[c]) / std[c]`` in float32, with mean and std from the mmproj file.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from typing import Any

import numpy as np

from ..errors import ImageError

#: The largest image decoded (pixels): 64 MP is 192 MB of RGB; a larger one is refused
#: (Pillow's own decompression-bomb check stops at 2 x 89 MP, and would warn below that).
MAX_PIXELS = 64 * 1024 * 1024

#: Formats decoded (Pillow format names).
FORMATS = ("PNG", "JPEG", "WEBP")

#: Resampling filters by llama.cpp's ``resize_algo`` name.
RESIZE_ALGOS = ("bilinear", "bicubic")


def decode(source: str | os.PathLike | bytes, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Decode an image file (path) or its bytes to RGB.

    Returns:
        uint8 [height, width, 3].
    Raises:
        ImageError: the file cannot be read, is not a PNG / JPEG / WebP, is truncated or
            corrupt, or has more than ``max_pixels`` pixels (checked before decoding).
    """
    from PIL import Image, UnidentifiedImageError

    name = "image data" if isinstance(source, (bytes, bytearray)) else os.fspath(source)
    try:
        fp: Any = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else open(name, "rb")
    except OSError as e:
        raise ImageError(f"cannot read image {name}: {e.strerror or e}") from None
    with fp, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(fp, formats=list(FORMATS)) as im:
                w, h = im.size
                if w * h > max_pixels:
                    raise ImageError(f"{name}: the image is {w} x {h} ({w * h / 1e6:.1f} megapixels), over the "
                                     f"limit of {max_pixels / 1e6:.1f} megapixels (preprocess.MAX_PIXELS)")
                if w <= 0 or h <= 0:
                    raise ImageError(f"{name}: the image is empty ({w} x {h})")
                im.load()
                rgb = im.convert("RGB") if im.mode != "RGB" else im
                arr = np.asarray(rgb, dtype=np.uint8)
        except ImageError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ImageError(f"{name}: the image is too large to decode ({e})") from None
        except UnidentifiedImageError:
            raise ImageError(f"{name} is not an image cooktop reads (PNG, JPEG or WebP)") from None
        except (OSError, SyntaxError, ValueError, EOFError) as e:  # truncated / corrupt data
            raise ImageError(f"{name}: the image is truncated or corrupt ({e})") from None
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ImageError(f"{name}: decoded to an unexpected shape {arr.shape}")
    return np.ascontiguousarray(arr)


def resize_pad(img: np.ndarray, width: int, height: int, algo: str = "bilinear",
               pad_color: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """Fit ``img`` (uint8 [h, w, 3]) into ``width`` x ``height`` keeping its aspect ratio, padded
    with ``pad_color`` (llama.cpp tools/mtmd/mtmd-image.cpp ``img_tool::resize``, PAD_CEIL).

    Returns:
        uint8 [height, width, 3].
    Raises:
        ValueError: an unknown ``algo`` (``bilinear`` or ``bicubic``).
    """
    from PIL import Image

    if algo not in RESIZE_ALGOS:
        raise ValueError(f"resize algorithm {algo!r}: one of {', '.join(RESIZE_ALGOS)}")
    h, w = img.shape[:2]
    if (w, h) == (width, height):
        return img.copy()
    f32 = np.float32
    scale = min(f32(width) / f32(w), f32(height) / f32(h))
    new_w = min(int(math.ceil(f32(w) * scale)), width)
    new_h = min(int(math.ceil(f32(h) * scale)), height)
    resample = Image.Resampling.BILINEAR if algo == "bilinear" else Image.Resampling.BICUBIC
    resized = np.asarray(Image.fromarray(img, "RGB").resize((new_w, new_h), resample), dtype=np.uint8)
    out = np.empty((height, width, 3), np.uint8)
    out[:] = np.asarray(pad_color, np.uint8)
    ox, oy = (width - new_w) // 2, (height - new_h) // 2
    out[oy:oy + new_h, ox:ox + new_w] = resized
    return out


def normalize(img: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """``(img / 255 - mean[c]) / std[c]`` in float32 (clip-impl.h ``from_u8`` then ``normalize``).

    img: uint8 [h, w, 3]. Returns float32 [h, w, 3].
    """
    x = img.astype(np.float32) / np.float32(255.0)
    return (x - np.asarray(mean[:3], np.float32)) / np.asarray(std[:3], np.float32)


def patches(img: np.ndarray, patch_size: int) -> np.ndarray:
    """Cut a preprocessed image into patches, the rows of the patch embedding's matmul.

    img: float32 [h, w, 3] with h and w multiples of ``patch_size``. Returns float32
    [n_patches, 3 * patch_size^2]: patch ``py * (w / p) + px`` (row-major), values in
    (channel, ky, kx) order, which is ``ggml_conv_2d``'s im2col order for a kernel of ggml shape
    [p, p, 3, n_embd] (tools/mtmd/clip.cpp ``build_inp``: the input ``[w, h, 3]`` planar).
    """
    h, w, c = img.shape
    p = patch_size
    ny, nx = h // p, w // p
    x = img.reshape(ny, p, nx, p, c).transpose(0, 2, 4, 1, 3)
    return np.ascontiguousarray(x.reshape(ny * nx, c * p * p), dtype=np.float32)
