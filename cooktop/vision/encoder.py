"""The vision encoder: a SigLIP / CLIP ViT and its projector (gemma3, mlp), run through the device op table.

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

LLaVA's ``mlp`` (tools/mtmd/models/llava.cpp ``clip_graph_llava``) differs: llama.cpp appends the
class embedding as the last position (``ggml_concat(inp, class_embd, 1)``), adds ``position_embd``
rows 0..n (one more than the patches), runs ``v.pre_ln``, the first ``n_block_run`` blocks and the
optional ``v.post_ln``, then keeps rows 1..n (``ggml_get_rows`` by ``patches``: the patches but the
first, and the class row). Attention without a mask and the row-wise ops are equivariant under a
permutation of the rows, so the rows are laid out here as [patches 1.., class, patch 0] (positions
permuted with them, the class embedding and the patch bias folded into the position table at
upload): the rows llama.cpp keeps are then the first n, a :meth:`head` view. ``clip.vision.feature_layer``
concatenates block inputs across the width before ``mm.0``; ``mm.0`` is split into column blocks
at upload and the stacked matmul is their sum. The projector: ``mm.0`` + bias, ``gelu``, ``mm.2`` + bias.

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
        needed = VISION_OPS + (act,) + (("gelu",) if h.projector == "mlp" else ())
        missing = [op for op in needed if not device.supports(op)]
        if missing:
            raise UnsupportedOpError(f"{device.info.selector} lacks the vision op(s) {', '.join(missing)}: "
                                     "the vision encoder cannot run there")
        self._act = act
        self._buf = device.buffer("vision encoder")
        self._w: dict[str, DeviceTensor] = {}
        prep = _mlp_weights(mmproj) if self.hparams.projector == "mlp" else {}
        for name, t in mmproj.tensors.items():
            data, ty, shape = t.data, t.ggml_type, tuple(t.shape)
            if prep and (name in prep or name in _FOLDED or (name == "mm.0.weight" and h.feature_layers)):
                continue
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
        for name, arr in prep.items():
            self._w[name] = self._buf.upload(arr, T.F32, arr.shape)

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
        mlp = h.projector == "mlp"
        if mlp and h.class_embd:  # rows [patches 1.., class (zero input), patch 0] (module doc)
            x = np.concatenate([x[1:], np.zeros((1, x.shape[1]), np.float32), x[:1]])
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
            if not mlp:
                d.add_bias(cur, cur, w["v.patch_embd.bias"])
            d.add(cur, cur, w["v.position_embd.weight"])
            if "v.pre_ln.weight" in w:
                d.layer_norm(cur, cur, w["v.pre_ln.weight"], w["v.pre_ln.bias"], h.eps)
            n_keep = h.n_patches_side ** 2
            mid = buf.empty((n_keep, w["mm.0.bias"].shape[0]), f32) if mlp else None
            part = buf.empty(mid.shape, f32) if mid is not None and len(h.feature_layers) > 1 else None
            stacked = 0

            def stack(t: DeviceTensor) -> None:  # one feature layer's share of mm.0 (module doc)
                nonlocal stacked
                assert mid is not None
                wj = w[f"mm.0.weight.{stacked}"] if h.feature_layers else w["mm.0.weight"]
                if stacked == 0:
                    d.matmul(mid, t.head(n_keep), wj)
                else:
                    assert part is not None
                    d.matmul(part, t.head(n_keep), wj)
                    d.add(mid, mid, part)
                stacked += 1

            scale = 1.0 / math.sqrt(h.head_dim)
            for i in range(h.n_block_run):
                if mlp and i in h.feature_layers:
                    stack(cur)
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
            if "v.post_ln.weight" in w:
                d.layer_norm(cur, cur, w["v.post_ln.weight"], w["v.post_ln.bias"], h.eps)
            m = h.n_image_tokens
            out = buf.empty((m, h.n_embd_out), f32)
            if mlp:
                assert mid is not None
                stack(cur)
                d.add_bias(mid, mid, w["mm.0.bias"])
                d.gelu(mid, mid)
                d.matmul(out, mid, w["mm.2.weight"])
                d.add_bias(out, out, w["mm.2.bias"])
            else:
                side = h.n_patches_side
                pooled = buf.empty((m, e), f32)
                d.avg_pool2d(pooled, cur, side, side, h.n_merge)
                d.rmsnorm(pooled, pooled, w["mm.soft_emb_norm.weight"], h.eps)
                d.matmul(out, pooled, w["mm.input_projection.weight"])
            return np.asarray(d.read(out), dtype=np.float32).reshape(m, h.n_embd_out)
        finally:
            buf.release()

    def preprocess_image(self, img: np.ndarray) -> np.ndarray:
        """uint8 [h, w, 3] -> the normalised float32 [image_size, image_size, 3] the encoder takes
        (:mod:`.preprocess`: the fixed-size resize with padding in the projector's colour, then mean / std
        from the file)."""
        h = self.hparams
        fitted = preprocess.resize_pad(img, h.image_size, h.image_size, h.resize_algo, h.pad_color)
        return preprocess.normalize(fitted, h.image_mean, h.image_std)

    def encode(self, img: np.ndarray) -> np.ndarray:
        """Preprocess and encode one decoded image (uint8 [h, w, 3]): float32 [n_image_tokens, n_embd_out]."""
        return self.encode_pixels(self.preprocess_image(img))


#: The mlp tensors folded into others at upload (:func:`_mlp_weights`).
_FOLDED = ("v.class_embd", "v.patch_embd.bias")


def _f32(t) -> np.ndarray:
    """A tensor's values as float32 (dequantized)."""
    from ..format.quants import dequantize

    if t.ggml_type == T.F32:
        return np.asarray(t.data, np.float32).reshape(t.shape)
    if t.ggml_type == T.F16:
        return np.asarray(t.data).astype(np.float32).reshape(t.shape)
    return dequantize(np.asarray(t.data), t.ggml_type, tuple(t.shape)).astype(np.float32).reshape(t.shape)


def _mlp_weights(mp: Mmproj) -> dict[str, np.ndarray]:
    """The mlp encoder's host-prepared F32 weights (module doc): the position table in the encoder's
    row order with the patch bias and the class embedding folded in, float32 [n_patches (+ 1), n_embd];
    with feature layers, ``mm.0.weight`` split into ``mm.0.weight.J`` column blocks, float32
    [n_mid, n_embd] each."""
    h = mp.hparams
    pos = _f32(mp.tensor("v.position_embd.weight")).copy()
    n = h.n_patches_side ** 2
    if "v.patch_embd.bias" in mp.tensors:
        pos[:n] += _f32(mp.tensors["v.patch_embd.bias"])
    if h.class_embd:
        pos[n] += _f32(mp.tensors["v.class_embd"])
        pos = np.concatenate([pos[1:n], pos[n:n + 1], pos[:1]])
    out = {"v.position_embd.weight": np.ascontiguousarray(pos)}
    if h.feature_layers:
        w0 = _f32(mp.tensor("mm.0.weight"))
        k = len(set(h.feature_layers))
        for j, blk in enumerate(np.split(w0, k, axis=1)):
            out[f"mm.0.weight.{j}"] = np.ascontiguousarray(blk)
    return out
