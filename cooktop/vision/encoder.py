"""The vision encoder: SigLIP ViT + Gemma 3's projector, run through the device op table.

One image (preprocessed on the host: ``preprocess.py``) becomes ``n_image_tokens`` embeddings of
the language model's width. The graph is llama.cpp's (tools/mtmd/models/siglip.cpp with
clip.cpp ``build_inp`` / ``build_vit`` / ``build_attn`` / ``build_ffn``), op for op:

1. patch embedding: ``ggml_conv_2d`` with a ``patch x patch`` kernel and stride is a matmul of
   the image's patches (cut on the host, :func:`~.preprocess.patches`: f32 [n_patches, 3 p^2])
   by the kernel as a [n_embd, 3 p^2] matrix, plus ``v.patch_embd.bias``; then
   ``+ v.position_embd.weight`` (learned, one row per patch);
2. per block (pre-LN): ``h += attn_out(attention_full(q, k, v))`` with ``q/k/v = ln1(h) W + b``
   (``layer_norm`` with weight and bias, eps ``clip.vision.attention.layer_norm_epsilon``;
   scale 1 / sqrt(head_dim), no mask), then ``h += ffn_down(act(ffn_up(ln2(h))))`` with act the
   file's (``gelu`` for Gemma 3);
3. ``v.post_ln`` (layer norm);
4. Gemma 3's projector: ``avg_pool2d`` of the patch grid by ``n_merge`` (``ggml_pool_2d`` AVG on
   the [px, py, n_embd] view), ``rmsnorm`` with ``mm.soft_emb_norm.weight`` (the same eps), then
   ``matmul`` by ``mm.input_projection.weight`` transposed (llama.cpp ``ggml_mul_mat(
   ggml_cont(ggml_transpose(mm_input_proj_w)), cur)``; transposed once here, at upload).

Every op is a device op (``matmul``, ``add_bias``, ``add``, ``layer_norm``, ``attention_full``,
``gelu`` / ``gelu_quick``, ``silu``-free, ``avg_pool2d``, ``rmsnorm``), so the encoder runs on any
backend that implements the vision ops (numpy, OpenCL, Vulkan).
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends.tensor import DeviceTensor
from ..errors import UnsupportedOpError
from . import preprocess
from .mmproj import Mmproj

#: The device ops the encoder calls besides matmul / add / add_bias / rmsnorm.
VISION_OPS = ("layer_norm", "attention_full", "avg_pool2d")


class VisionEncoder:
    """An mmproj's encoder with its weights uploaded to ``device``.

    Args:
        mmproj: an opened mmproj (:func:`~.mmproj.open_mmproj`).
        device: a :class:`~cooktop.backends.base.Device` implementing the vision ops.
    Raises:
        UnsupportedOpError: the device lacks a vision op or a weight's type.
        DeviceOutOfMemoryError: the weights do not fit.
    """

    def __init__(self, mmproj: Mmproj, device):
        self.mmproj, self.device, self.hparams = mmproj, device, mmproj.hparams
        h = self.hparams
        act = {"gelu": "gelu", "gelu_quick": "gelu_quick", "silu": "silu"}[h.ffn_op]
        missing = [op for op in VISION_OPS + (act,) if not device.supports(op)]
        if missing:
            raise UnsupportedOpError(f"{device.info.selector} lacks the vision op(s) {', '.join(missing)}: "
                                     "the vision encoder cannot run there")
        self._act = act
        self._buf = device.buffer("vision encoder")
        self._w: dict[str, DeviceTensor] = {}
        for name, t in mmproj.tensors.items():
            data, ty, shape = t.data, t.ggml_type, tuple(t.shape)
            if name == "v.patch_embd.weight":  # [e, 3, p, p] -> the [e, 3 p^2] matrix of the im2col matmul
                data, shape = np.ascontiguousarray(data).reshape(shape[0], -1), (shape[0], math.prod(shape[1:]))
            elif name == "mm.input_projection.weight":  # [e, n_embd_out] -> matmul's [n_out, n_in]
                if ty not in (T.F32, T.F16):
                    raise UnsupportedOpError(f"{mmproj.path}: mm.input_projection.weight of type {ty.name} "
                                             "(cooktop transposes it: F32 or F16 only)")
                data, shape = np.ascontiguousarray(np.asarray(data).T), (shape[1], shape[0])
            elif len(shape) == 1 or name == "v.position_embd.weight":
                if ty != T.F32:  # vectors and the position table are added as f32 activations
                    from ..format.quants import dequantize
                    data, ty = dequantize(np.asarray(data), ty, shape).astype(np.float32), T.F32
            self._w[name] = self._buf.upload(np.ascontiguousarray(data), ty, shape)

    def close(self) -> None:
        """Free the device weights."""
        self._buf.release()

    def encode_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Encode one preprocessed image.

        pixels: float32 [image_size, image_size, 3] (normalised, :func:`preprocess_image`).
        Returns float32 [n_image_tokens, n_embd_out].
        """
        h, d, w = self.hparams, self.device, self._w
        x = preprocess.patches(pixels, h.patch_size)
        n, e = x.shape[0], h.n_embd
        buf = d.buffer("vision activations")
        try:
            f32 = T.F32
            xin = buf.empty(x.shape, f32)
            d.write(xin, x)
            cur = buf.empty((n, e), f32)
            tmp = buf.empty((n, e), f32)
            q, k, v, att = (buf.empty((n, e), f32) for _ in range(4))
            ff = buf.empty((n, h.n_ff), f32)
            d.matmul(cur, xin, w["v.patch_embd.weight"])
            d.add_bias(cur, cur, w["v.patch_embd.bias"])
            d.add(cur, cur, w["v.position_embd.weight"])
            scale = 1.0 / math.sqrt(h.head_dim)
            for i in range(h.n_layer):
                b = f"v.blk.{i}."
                d.layer_norm(tmp, cur, w[b + "ln1.weight"], w[b + "ln1.bias"], h.eps)
                for out, t in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")):
                    d.matmul(out, tmp, w[b + t + ".weight"])
                    d.add_bias(out, out, w[b + t + ".bias"])
                d.attention_full(att, q, k, v, h.n_head, scale)
                d.matmul(tmp, att, w[b + "attn_out.weight"])
                d.add_bias(tmp, tmp, w[b + "attn_out.bias"])
                d.add(cur, cur, tmp)
                d.layer_norm(tmp, cur, w[b + "ln2.weight"], w[b + "ln2.bias"], h.eps)
                d.matmul(ff, tmp, w[b + "ffn_up.weight"])
                d.add_bias(ff, ff, w[b + "ffn_up.bias"])
                getattr(d, self._act)(ff, ff)
                d.matmul(tmp, ff, w[b + "ffn_down.weight"])
                d.add_bias(tmp, tmp, w[b + "ffn_down.bias"])
                d.add(cur, cur, tmp)
            d.layer_norm(cur, cur, w["v.post_ln.weight"], w["v.post_ln.bias"], h.eps)
            side = h.n_patches_side
            m = h.n_image_tokens
            pooled = buf.empty((m, e), f32)
            d.avg_pool2d(pooled, cur, side, side, h.n_merge)
            d.rmsnorm(pooled, pooled, w["mm.soft_emb_norm.weight"], h.eps)
            out = buf.empty((m, h.n_embd_out), f32)
            d.matmul(out, pooled, w["mm.input_projection.weight"])
            return np.asarray(d.read(out), dtype=np.float32).reshape(m, h.n_embd_out)
        finally:
            buf.release()

    def preprocess_image(self, img: np.ndarray) -> np.ndarray:
        """uint8 [h, w, 3] -> the normalised float32 [image_size, image_size, 3] the encoder takes
        (:mod:`.preprocess`: the fixed-size resize with padding, then mean / std from the file)."""
        h = self.hparams
        fitted = preprocess.resize_pad(img, h.image_size, h.image_size, h.resize_algo)
        return preprocess.normalize(fitted, h.image_mean, h.image_std)

    def encode(self, img: np.ndarray) -> np.ndarray:
        """Preprocess and encode one decoded image (uint8 [h, w, 3]): float32 [n_image_tokens, n_embd_out]."""
        return self.encode_pixels(self.preprocess_image(img))
