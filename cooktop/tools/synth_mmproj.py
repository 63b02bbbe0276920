"""Synthetic mmproj GGUFs (vision encoder + projector) with random weights, and matching text models.

An mmproj file is what llama.cpp's ``convert_hf_to_gguf.py --mmproj`` writes (conversion/base.py
``MmprojModel``, conversion/gemma.py ``Gemma3VisionModel``): ``general.architecture = clip``,
``general.type = mmproj``, the ``clip.*`` / ``clip.vision.*`` keys of gguf-py's constants, and the
``v.*`` (SigLIP ViT) and ``mm.*`` (projector) tensors. llama.cpp's loader (tools/mtmd/clip.cpp
``clip_model_loader``) reads exactly these; :func:`write_gemma3` writes one for Gemma 3's projector:

- ``v.patch_embd.weight`` [n_embd, 3, patch, patch] (numpy order; ggml ne = patch, patch, 3, n_embd)
  and its bias, ``v.position_embd.weight`` [n_patches, n_embd];
- per block ``v.blk.N.ln1`` / ``ln2`` (layer norm weight and bias), ``attn_q`` / ``attn_k`` /
  ``attn_v`` / ``attn_out`` [n_embd, n_embd] with biases, ``ffn_up`` [n_ff, n_embd] and
  ``ffn_down`` [n_embd, n_ff] with biases (n_ff must differ from n_embd: clip.cpp swaps up and
  down when ``ffn_down``'s input width equals n_embd, a fix for old conversions);
- ``v.post_ln`` weight and bias; ``mm.soft_emb_norm.weight`` [n_embd] and
  ``mm.input_projection.weight`` [n_embd, n_embd_text] (ggml ne = n_embd_text, n_embd; the
  projector's output width is its ne[0], clip.cpp ``clip_n_mmproj_embd``).

Keys: ``clip.projector_type = gemma3``, ``clip.has_vision_encoder``, ``clip.vision.image_size`` /
``patch_size`` / ``embedding_length`` / ``feed_forward_length`` / ``block_count`` /
``attention.head_count`` / ``attention.layer_norm_epsilon`` / ``projection_dim`` / ``image_mean`` /
``image_std`` / ``use_gelu`` and, when the pooling kernel is not Gemma 3's 4,
``clip.vision.projector.scale_factor`` (as the converter writes for tinygemma3).

Weights: matrices N(0, 1/n_in) (activations keep their scale through the blocks), layer-norm
weights 1 + N(0, 0.1), biases N(0, 0.1), position embeddings N(0, 0.5), the soft-embedding norm
1 + N(0, 0.1). ``file_type`` F32 or F16 (the block matrices; patch and position embeddings stay
F32 and the input projection F16 under F16, as the converter forces), or Q8_0 (block matrices).

:func:`write_mlp` writes LLaVA 1.5's (``clip.projector_type = mlp``; conversion/llava.py): a CLIP ViT
with ``v.class_embd`` [n_embd], ``v.patch_embd.weight`` without a bias, ``v.position_embd.weight``
[n_patches + 1, n_embd], ``v.pre_ln`` weight and bias, the blocks as above, no ``v.post_ln`` (LLaVA
drops it with the last layer), ``mm.0`` [n_mid, n_embd * max(1, len(feature_layers))] and ``mm.2``
[n_embd_text, n_mid] with biases; ``clip.use_gelu`` false (quick GELU, CLIP's), image mean / std
CLIP's, and ``clip.vision.feature_layer`` when given.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf import quants as gguf_quants

from ..errors import CooktopError
from . import synth


@dataclasses.dataclass(frozen=True)
class VisionShape:
    """Hyperparameters of a synthetic SigLIP encoder with Gemma 3's projector (clip.vision.* names)."""

    image_size: int = 112
    patch_size: int = 14
    n_embd: int = 48
    n_ff: int = 80
    n_layer: int = 2
    n_head: int = 4
    #: the projector's average-pooling kernel per side (Gemma 3: 4; 64 patches per side -> 16)
    n_merge: int = 2
    #: the language model's embedding width (the projector's output)
    n_embd_text: int = 64
    eps: float = 1e-6
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def n_patches_side(self) -> int:
        """Patches per side (image_size / patch_size)."""
        return self.image_size // self.patch_size

    @property
    def n_image_tokens(self) -> int:
        """Embeddings per image after pooling: (patches per side / n_merge)^2."""
        return (self.n_patches_side // self.n_merge) ** 2


#: Gemma 3's control tokens around an image (tools/mtmd/mtmd.cpp: ``<start_of_image>`` ... ``<end_of_image>``).
GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>")

#: A text model to pair with :class:`VisionShape`'s default (gemma3, n_embd 64, the image tokens in the vocabulary).
GEMMA3_TEXT = synth.Shape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=512,
                          rope_freq_base=1e6, tied=True, head_dim=32, arch="gemma3", n_swa=16, swa_pattern=2,
                          rope_freq_base_swa=10000.0, control_tokens=GEMMA3_IMAGE_TOKENS)

FILE_TYPES = ("F32", "F16", "Q8_0")


def validate(v: VisionShape, file_type: str) -> None:
    """Check a shape llama.cpp's clip loader and Gemma 3 graph accept.

    Raises:
        CooktopError: an unknown file type, a size that is not a whole number of patches or pools,
            n_embd not divisible by n_head, or n_ff equal to n_embd (clip.cpp would swap up/down).
    """
    if file_type not in FILE_TYPES:
        raise CooktopError(f"mmproj file type {file_type!r}: one of {', '.join(FILE_TYPES)}")
    if v.patch_size <= 0 or v.image_size % v.patch_size:
        raise CooktopError(f"image_size {v.image_size} is not a multiple of patch_size {v.patch_size}")
    if v.n_merge <= 0 or v.n_patches_side % v.n_merge:
        raise CooktopError(f"{v.n_patches_side} patches per side is not a multiple of the pooling kernel {v.n_merge}")
    if v.n_head <= 0 or v.n_embd % v.n_head:
        raise CooktopError(f"n_embd {v.n_embd} is not a multiple of n_head {v.n_head}")
    if v.n_ff == v.n_embd:
        raise CooktopError(f"n_ff must differ from n_embd ({v.n_embd}): llama.cpp's clip loader would swap "
                           "ffn_up and ffn_down")
    if file_type == "Q8_0" and (v.n_embd % 32 or v.n_ff % 32):
        raise CooktopError("Q8_0 needs n_embd and n_ff multiples of 32")


def _matrix(rng: np.random.Generator, n_out: int, n_in: int, ty: T) -> tuple[np.ndarray, T | None]:
    """A [n_out, n_in] matrix N(0, 1/n_in) in type ``ty`` (data, raw dtype for GGUFWriter)."""
    m = rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32)
    if ty == T.F32:
        return m, None
    if ty == T.F16:
        return m.astype(np.float16), None
    return gguf_quants.quantize(m, ty), ty


def write_gemma3(path: str | os.PathLike, v: VisionShape = VisionShape(), file_type: str = "F32", seed: int = 0,
                 name: str = "synthetic-mmproj") -> int:
    """Write a Gemma 3 mmproj GGUF (SigLIP ViT + gemma3 projector); returns the parameter count.

    Written to a temporary name beside ``path`` and renamed on success.

    Raises:
        CooktopError: a bad shape or file type (:func:`validate`), or the file cannot be written.
    """
    validate(v, file_type)
    path = os.fspath(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                   dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
    except OSError as e:
        raise CooktopError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        n = _write_gemma3(tmp, v, file_type, seed, name)
        os.replace(tmp, path)
    except OSError as e:
        raise CooktopError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return n


def _write_gemma3(path: str, v: VisionShape, file_type: str, seed: int, name: str,
                  mlp: tuple[int, tuple[int, ...]] | None = None) -> int:
    """Body of :func:`write_gemma3` and (``mlp = (n_mid, feature_layers)``) :func:`write_mlp`."""
    rng = np.random.default_rng(seed)
    mat_ty = {"F32": T.F32, "F16": T.F16, "Q8_0": T.Q8_0}[file_type]
    w = GGUFWriter(path, "clip")
    w.add_type("mmproj")
    w.add_name(name)
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[file_type])
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("gemma3" if mlp is None else "mlp")
    w.add_vision_projection_dim(v.n_embd_text)
    w.add_vision_image_size(v.image_size)
    w.add_vision_patch_size(v.patch_size)
    w.add_vision_embedding_length(v.n_embd)
    w.add_vision_feed_forward_length(v.n_ff)
    w.add_vision_block_count(v.n_layer)
    w.add_vision_head_count(v.n_head)
    w.add_vision_image_mean(list(v.image_mean))
    w.add_vision_image_std(list(v.image_std))
    w.add_vision_attention_layernorm_eps(v.eps)
    w.add_vision_use_gelu(mlp is None)
    if mlp is not None and mlp[1]:
        w.add_array("clip.vision.feature_layer", list(mlp[1]))
    if mlp is None and v.n_merge != 4:
        w.add_vision_projector_scale_factor(v.n_merge)

    n_params = 0

    def add(tname: str, data: np.ndarray, raw: T | None = None, n: int | None = None) -> None:
        nonlocal n_params
        n_params += int(n if n is not None else data.size)
        w.add_tensor(tname, data, raw_dtype=raw)

    def vec(n: int, kind: str) -> np.ndarray:
        if kind == "norm":
            return (1.0 + rng.normal(0.0, 0.1, n)).astype(np.float32)
        return rng.normal(0.0, 0.1, n).astype(np.float32)

    e, p = v.n_embd, v.patch_size
    patch = rng.normal(0.0, 1.0 / np.sqrt(3 * p * p), (e, 3, p, p)).astype(np.float32)
    add("v.patch_embd.weight", patch)
    n_pos = v.n_patches_side ** 2 + (1 if mlp is not None else 0)
    if mlp is None:
        add("v.patch_embd.bias", vec(e, "bias"))
    else:
        add("v.class_embd", rng.normal(0.0, 0.5, e).astype(np.float32))
        add("v.pre_ln.weight", vec(e, "norm"))
        add("v.pre_ln.bias", vec(e, "bias"))
    add("v.position_embd.weight", rng.normal(0.0, 0.5, (n_pos, e)).astype(np.float32))
    for i in range(v.n_layer):
        b = f"v.blk.{i}"
        add(f"{b}.ln1.weight", vec(e, "norm"))
        add(f"{b}.ln1.bias", vec(e, "bias"))
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            data, raw = _matrix(rng, e, e, mat_ty)
            add(f"{b}.{t}.weight", data, raw, e * e)
            add(f"{b}.{t}.bias", vec(e, "bias"))
        add(f"{b}.ln2.weight", vec(e, "norm"))
        add(f"{b}.ln2.bias", vec(e, "bias"))
        data, raw = _matrix(rng, v.n_ff, e, mat_ty)
        add(f"{b}.ffn_up.weight", data, raw, v.n_ff * e)
        add(f"{b}.ffn_up.bias", vec(v.n_ff, "bias"))
        data, raw = _matrix(rng, e, v.n_ff, mat_ty)
        add(f"{b}.ffn_down.weight", data, raw, v.n_ff * e)
        add(f"{b}.ffn_down.bias", vec(e, "bias"))
    if mlp is None:
        add("v.post_ln.weight", vec(e, "norm"))
        add("v.post_ln.bias", vec(e, "bias"))
        add("mm.soft_emb_norm.weight", vec(e, "norm"))
        proj = rng.normal(0.0, 1.0 / np.sqrt(e), (e, v.n_embd_text)).astype(np.float32)
        add("mm.input_projection.weight", proj.astype(np.float16) if file_type != "F32" else proj)
    else:
        n_mid, layers = mlp
        n_in = e * max(1, len(set(layers)))
        for j, (n_out, n_i) in enumerate(((n_mid, n_in), (v.n_embd_text, n_mid))):
            data, raw = _matrix(rng, n_out, n_i, mat_ty)
            add(f"mm.{2 * j}.weight", data, raw, n_out * n_i)
            add(f"mm.{2 * j}.bias", vec(n_out, "bias"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_params


#: LLaVA 1.5's shapes in small: 70 px images of 14 px patches (25 patches + the class position), 3 blocks
#: (2 run: the second-to-last layer's output), CLIP's mean / std, a 64-wide text model.
LLAVA_SHAPE = VisionShape(image_size=70, patch_size=14, n_embd=48, n_ff=80, n_layer=3, n_head=4, n_merge=1,
                          eps=1e-5, image_mean=(0.48145466, 0.4578275, 0.40821073),
                          image_std=(0.26862954, 0.26130258, 0.27577711))

#: A llama text model to pair with :data:`LLAVA_SHAPE`.
LLAVA_TEXT = synth.Shape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, n_ctx_train=512)


def write_mlp(path: str | os.PathLike, v: VisionShape = LLAVA_SHAPE, file_type: str = "F32", seed: int = 0,
              name: str = "synthetic-llava-mmproj", n_mid: int = 56, feature_layers: tuple[int, ...] = ()) -> int:
    """Write a LLaVA 1.5 mmproj GGUF (CLIP ViT + ``mlp`` projector, module doc); returns the parameter count.

    ``n_mid``: mm.0's output width; ``feature_layers``: ``clip.vision.feature_layer`` (``()``: not written).

    Raises:
        CooktopError: a bad shape or file type (:func:`validate`), a feature layer past n_layer, or
            the file cannot be written.
    """
    validate(v, file_type)
    if any(not 0 <= x <= v.n_layer for x in feature_layers):
        raise CooktopError(f"feature layers {list(feature_layers)}: each in 0..n_layer ({v.n_layer})")
    if file_type == "Q8_0" and n_mid % 32:
        raise CooktopError("Q8_0 needs n_mid a multiple of 32")
    path = os.fspath(path)
    tmp = path + ".tmp"
    try:
        n = _write_gemma3(tmp, v, file_type, seed, name, mlp=(n_mid, tuple(feature_layers)))
        os.replace(tmp, path)
    except OSError as e:
        raise CooktopError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return n


def write_mlp_pair(folder: str | os.PathLike, v: VisionShape = LLAVA_SHAPE, text: synth.Shape = LLAVA_TEXT,
                   seed: int = 0, feature_layers: tuple[int, ...] = ()) -> tuple[str, str]:
    """Write ``model.gguf`` (a llama text model, n_embd = ``v.n_embd_text``) and ``mmproj.gguf`` (LLaVA's
    mlp projector, :func:`write_mlp`) into ``folder``; returns their paths (model, mmproj).

    Raises:
        CooktopError: as :func:`write_mlp` and :func:`cooktop.tools.synth.write`.
    """
    folder = os.fspath(folder)
    model = os.path.join(folder, "model.gguf")
    mmproj = os.path.join(folder, "mmproj.gguf")
    synth.write(model, dataclasses.replace(text, n_embd=v.n_embd_text), "F32", seed=seed)
    write_mlp(mmproj, v, "F32", seed=seed + 1, feature_layers=feature_layers)
    return model, mmproj


def write_gemma3_pair(folder: str | os.PathLike, v: VisionShape = VisionShape(), file_type: str = "F32",
                      text: synth.Shape = GEMMA3_TEXT, seed: int = 0) -> tuple[str, str]:
    """Write ``model.gguf`` (gemma3 text model, n_embd = ``v.n_embd_text``, Gemma 3's image tokens in
    its vocabulary) and ``mmproj.gguf`` into ``folder``; returns their paths (model, mmproj).

    Raises:
        CooktopError: as :func:`write_gemma3` and :func:`cooktop.tools.synth.write`.
    """
    folder = os.fspath(folder)
    text = dataclasses.replace(text, n_embd=v.n_embd_text,
                               control_tokens=tuple(dict.fromkeys(text.control_tokens + GEMMA3_IMAGE_TOKENS)))
    model = os.path.join(folder, "model.gguf")
    mmproj = os.path.join(folder, "mmproj.gguf")
    synth.write(model, text, file_type if file_type in synth.FILE_TYPES else "F32", seed=seed)
    write_gemma3(mmproj, v, file_type, seed=seed + 1)
    return model, mmproj
