"""Reading an mmproj GGUF: the vision encoder's hyperparameters, tensors and preprocessing settings.

An mmproj file (``general.architecture = clip``; llama.cpp's ``--mmproj``) holds a vision
encoder and its projector into a language model's embedding space. Keys and tensor names are
llama.cpp's (tools/mtmd/clip-impl.h ``KEY_*`` / ``TN_*``, read by clip.cpp
``clip_model_loader::load_hparams`` / ``load_tensors``); the projector type is
``clip.projector_type`` (or ``clip.vision.projector_type`` in files with audio too). cooktop
runs the projectors in :data:`SUPPORTED`; any other of llama.cpp's (:data:`LLAMA_CPP_PROJECTORS`)
is refused by name.

Per projector, as clip.cpp sets them: gemma3 (SigLIP, models/siglip.cpp) pools ``n_merge`` x ``n_merge`` patches
(``clip.vision.projector.scale_factor``, default 4) and resizes bilinearly
(``RESIZE_ALGO_BILINEAR``) to the fixed ``image_size``; the feed-forward activation is
``clip.use_gelu`` -> GELU (tanh), ``clip.use_silu`` -> SiLU, else quick GELU. mlp (LLaVA 1.5,
tools/mtmd/models/llava.cpp): a CLIP ViT with an optional class embedding (``v.class_embd``, one
more position), an optional patch bias, ``v.pre_ln``, optional ``v.post_ln``; it runs
``n_layer - 1`` blocks (the second-to-last layer's output) unless ``clip.vision.feature_layer``
lists layers (then up to the deepest, their inputs concatenated across the width); the projector
is ``mm.0`` -> GELU -> ``mm.2``; preprocessing resizes bicubically with PAD_CEIL onto a
(122, 116, 104) canvas (``image_pad_color``). LLaVA 1.6's ``clip.vision.image_grid_pinpoints``
(llava-uhd slicing) and Yi-type MLP_NORM files (``mm.3``) are refused by name.
"""

from __future__ import annotations

import dataclasses
import math
import os

from ..errors import UnsupportedModelError
from ..format.gguf import GGUFFile, TensorInfo, open_gguf
from ..model.hparams import Metadata

#: Projector types cooktop runs.
SUPPORTED = ("gemma3", "mlp")

#: llama.cpp's projector type names (tools/mtmd/clip-impl.h ``PROJECTOR_TYPE_NAMES``), for messages.
LLAMA_CPP_PROJECTORS = (
    "mlp", "ldp", "ldpv2", "resampler", "adapter", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger",
    "ling3vl", "step3vl", "gemma3", "gemma3nv", "gemma3na", "gemma4v", "gemma4a", "gemma4uv", "gemma4ua", "phi4",
    "idefics3", "pixtral", "ultravox", "internvl", "llama4", "qwen2a", "qwen3a", "glma", "qwen2.5o", "voxtral",
    "meralion", "musicflamingo", "lfm2", "kimivl", "paddleocr", "lightonocr", "cogvlm", "janus_pro", "dots_ocr",
    "dots3note_v", "dots3note_a", "deepseekocr", "deepseekocr2", "deepseek4v", "lfm2a", "glm4v", "glm5v",
    "youtuvl", "yasa2", "kimik25", "nemotron_v2_vl", "exaone4_5", "hunyuanvl", "minicpmv4_6", "granite_speech",
    "mimovl", "minimax_m3", "granite4_vision", "mimo_audio", "parakeet", "qwen3tts_spkenc", "qwen3tts_gen",
    "pockettts_spkenc", "pockettts_gen", "muse-glimmer")


@dataclasses.dataclass(frozen=True)
class VisionHParams:
    """The vision encoder's hyperparameters (clip.cpp ``clip_hparams``).

    Attributes:
        projector: ``clip.projector_type`` (e.g. ``gemma3``).
        image_size: the square input side (pixels) of a fixed-size preprocessor.
        patch_size: pixels per patch side.
        n_embd, n_ff, n_layer, n_head: the ViT's width, feed-forward width, blocks, heads.
        eps: layer-norm epsilon (``clip.vision.attention.layer_norm_epsilon``).
        n_embd_out: the projector's output width, which must be the language model's n_embd.
        n_merge: patches pooled per side (gemma3's average pooling kernel).
        ffn_op: ``gelu``, ``silu`` or ``gelu_quick``.
        image_mean, image_std: per-channel normalisation.
        resize_algo: ``bilinear`` or ``bicubic``.
        pad_color: the canvas colour of the resize with padding (RGB).
        n_block_run: blocks run (llava: the deepest feature layer; gemma3: all).
        feature_layers: llava's ``clip.vision.feature_layer`` (the block inputs stacked; index
            ``n_block_run`` is the last block's output after ``post_ln``), or ``()`` (the output only).
        class_embd: the ViT has ``v.class_embd`` (one more position, at the end, as llama.cpp concatenates).
    """

    projector: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    eps: float
    n_embd_out: int
    n_merge: int
    ffn_op: str
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    resize_algo: str
    pad_color: tuple[int, int, int] = (0, 0, 0)
    n_block_run: int = 0
    feature_layers: tuple[int, ...] = ()
    class_embd: bool = False

    @property
    def head_dim(self) -> int:
        """n_embd / n_head."""
        return self.n_embd // self.n_head

    @property
    def n_patches_side(self) -> int:
        """Patches per side of the fixed-size image."""
        return self.image_size // self.patch_size

    @property
    def n_image_tokens(self) -> int:
        """Embeddings one image becomes (gemma3: (patches per side / n_merge)^2; mlp: one per patch)."""
        return (self.n_patches_side // self.n_merge) ** 2


@dataclasses.dataclass
class Mmproj:
    """An opened mmproj file: its hyperparameters and tensors (memory-mapped views).

    Attributes:
        path: the file.
        hparams: :class:`VisionHParams`.
        tensors: name -> :class:`~cooktop.format.gguf.TensorInfo` (``v.*``, ``mm.*``).
    """

    path: str
    hparams: VisionHParams
    tensors: dict[str, TensorInfo]

    def tensor(self, name: str) -> TensorInfo:
        """The tensor ``name``.

        Raises:
            UnsupportedModelError: the file lacks it.
        """
        t = self.tensors.get(name)
        if t is None:
            raise UnsupportedModelError(f"{self.path}: missing tensor {name!r} (needed by the "
                                        f"{self.hparams.projector} projector)")
        return t

    def check_model(self, n_embd: int, model_path: str = "the model") -> None:
        """Refuse a language model whose embedding width is not the projector's output.

        Raises:
            UnsupportedModelError: ``n_embd`` differs from :attr:`VisionHParams.n_embd_out`.
        """
        if n_embd != self.hparams.n_embd_out:
            raise UnsupportedModelError(
                f"{self.path}: the projector's embeddings are {self.hparams.n_embd_out} wide but {model_path}'s "
                f"n_embd is {n_embd}: this mmproj belongs to another model")


def is_mmproj(f: GGUFFile) -> bool:
    """True for an mmproj file (``general.architecture = clip`` or ``general.type = mmproj``)."""
    return f.metadata.get("general.architecture") == "clip" or f.metadata.get("general.type") == "mmproj"


def open_mmproj(path: str | os.PathLike) -> Mmproj:
    """Open and check an mmproj GGUF.

    Raises:
        GGUFError: not a readable GGUF.
        UnsupportedModelError: not an mmproj (a language model passed as --mmproj), no vision
            encoder (an audio-only file), a projector type cooktop lacks (named, with the
            supported ones), a missing or bad key, a missing tensor, or shapes that contradict the keys.
    """
    f = open_gguf(path)
    p = f.path
    if not is_mmproj(f):
        raise UnsupportedModelError(f"{p} is a language model (general.architecture = "
                                    f"{f.metadata.get('general.architecture')}), not an mmproj (vision projector) "
                                    "file: pass it with -m, and its mmproj-*.gguf with --mmproj")
    md = f.metadata
    m = Metadata(md, "clip", p)
    if md.get("clip.has_vision_encoder") is False or ("clip.vision.image_size" not in md):
        raise UnsupportedModelError(f"{p}: this mmproj has no vision encoder (an audio projector?); cooktop "
                                    "takes images only")
    proj = md.get("clip.projector_type") or md.get("clip.vision.projector_type")
    if not isinstance(proj, str) or not proj:
        raise UnsupportedModelError(f"{p}: missing metadata key 'clip.projector_type'")
    if proj not in SUPPORTED:
        known = "a llama.cpp projector type" if proj in LLAMA_CPP_PROJECTORS else "not a projector type llama.cpp knows"
        raise UnsupportedModelError(f"{p}: projector type {proj!r} ({known}) is not supported by cooktop; "
                                    f"supported: {', '.join(SUPPORTED)}")
    mean, std = md.get("clip.vision.image_mean"), md.get("clip.vision.image_std")
    if not isinstance(mean, list) or not isinstance(std, list) or len(mean) < 3 or len(std) < 3:
        raise UnsupportedModelError(f"{p}: clip.vision.image_mean / image_std must be arrays of 3 values")
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in [*mean[:3], *std[:3]]) or not all(
            x > 0 for x in std[:3]):
        raise UnsupportedModelError(f"{p}: clip.vision.image_std must be 3 positive numbers and image_mean 3 finite "
                                    f"ones (got mean {mean[:3]}, std {std[:3]})")
    if md.get("clip.use_gelu") and md.get("clip.use_silu"):
        raise UnsupportedModelError(f"{p}: both clip.use_gelu and clip.use_silu are set")
    ffn_op = "gelu" if md.get("clip.use_gelu") else "silu" if md.get("clip.use_silu") else "gelu_quick"
    n_embd = m.num("vision.embedding_length", required=True, minimum=1)
    n_head = m.num("vision.attention.head_count", required=True, minimum=1)
    if n_embd % n_head:
        raise UnsupportedModelError(f"{p}: clip.vision.attention.head_count = {n_head} does not divide "
                                    f"clip.vision.embedding_length = {n_embd}")
    if "clip.vision.attention.head_dim" in md and m.num("vision.attention.head_dim") != n_embd // n_head:
        raise UnsupportedModelError(f"{p}: clip.vision.attention.head_dim other than n_embd / n_head is not supported")
    image_size = m.num("vision.image_size", required=True, minimum=1)
    patch_size = m.num("vision.patch_size", required=True, minimum=1)
    common = dict(projector=proj, image_size=image_size, patch_size=patch_size, n_embd=n_embd,
                  n_ff=m.num("vision.feed_forward_length", required=True, minimum=1),
                  n_layer=m.num("vision.block_count", required=True, minimum=1), n_head=n_head,
                  ffn_op=ffn_op, image_mean=tuple(float(x) for x in mean[:3]),
                  image_std=tuple(float(x) for x in std[:3]))
    if image_size % patch_size:
        raise UnsupportedModelError(f"{p}: image_size {image_size} is not a multiple of patch_size {patch_size}")
    if proj == "gemma3":
        hp = _gemma3_hparams(f, m, common)
    else:
        hp = _mlp_hparams(f, m, common)
    mp = Mmproj(p, hp, f.tensors)
    _check_shapes(mp)
    return mp


def _gemma3_hparams(f: GGUFFile, m: Metadata, common: dict) -> VisionHParams:
    """gemma3's hyperparameters (clip.cpp ``load_hparams``: scale_factor 4 by default, bilinear).

    Raises:
        UnsupportedModelError: no ``mm.input_projection.weight``, or a grid that does not pool.
    """
    p = f.path
    n_merge = m.num("vision.projector.scale_factor", default=4, minimum=1)
    t_proj = f.tensors.get("mm.input_projection.weight")
    if t_proj is None or len(t_proj.shape) != 2:
        raise UnsupportedModelError(f"{p}: missing tensor 'mm.input_projection.weight' (the gemma3 projector)")
    hp = VisionHParams(**common, eps=m.num("vision.attention.layer_norm_epsilon", kind=float, default=1e-6),
                       n_embd_out=t_proj.shape[1], n_merge=n_merge, resize_algo="bilinear",
                       n_block_run=common["n_layer"])
    if hp.n_patches_side % n_merge:
        raise UnsupportedModelError(f"{p}: {hp.n_patches_side} patches per side do not pool by {n_merge}")
    return hp


def _mlp_hparams(f: GGUFFile, m: Metadata, common: dict) -> VisionHParams:
    """LLaVA's (``mlp``) hyperparameters (clip.cpp ``load_hparams`` / ``clip_graph_llava``).

    Raises:
        UnsupportedModelError: image_grid_pinpoints (LLaVA 1.6's slicing), a Yi-type ``mm.3``
            projector (MLP_NORM), no ``mm.2`` (a one-layer projector), or a feature layer out of range.
    """
    p, md = f.path, f.metadata
    if md.get("clip.vision.image_grid_pinpoints"):
        raise UnsupportedModelError(f"{p}: clip.vision.image_grid_pinpoints (LLaVA 1.6's llava-uhd image slicing) "
                                    "is not supported by cooktop; the fixed-size mlp projector (LLaVA 1.5) is")
    if "mm.3.weight" in f.tensors:
        raise UnsupportedModelError(f"{p}: an mlp projector with mm.3 (llama.cpp's MLP_NORM, Yi-type LLaVA) "
                                    "is not supported by cooktop")
    t2 = f.tensors.get("mm.2.weight")
    if t2 is None or len(t2.shape) != 2:
        raise UnsupportedModelError(f"{p}: missing tensor 'mm.2.weight' (the mlp projector's second layer)")
    n_layer = common["n_layer"]
    raw = md.get("clip.vision.feature_layer") or []
    if not isinstance(raw, list) or not all(isinstance(v, int) for v in raw):
        raise UnsupportedModelError(f"{p}: clip.vision.feature_layer must be an array of integers")
    layers = tuple(sorted({int(v) for v in raw if int(v) >= 0}))  # clip.cpp: -1 marks unset values
    if any(v > n_layer for v in layers):
        raise UnsupportedModelError(f"{p}: clip.vision.feature_layer {list(layers)} is out of range "
                                    f"(n_layer: {n_layer})")
    n_run = max(layers) if layers else n_layer - 1
    return VisionHParams(**common, eps=m.num("vision.attention.layer_norm_epsilon", kind=float, default=1e-6),
                         n_embd_out=t2.shape[0], n_merge=1, resize_algo="bicubic", pad_color=(122, 116, 104),
                         n_block_run=n_run, feature_layers=layers, class_embd="v.class_embd" in f.tensors)


def _check_shapes(mp: Mmproj) -> None:
    """Check the ViT + projector tensors against the hyperparameters (numpy order).

    Raises:
        UnsupportedModelError: a missing tensor or a shape that contradicts the keys.
    """
    h = mp.hparams
    e, p = h.n_embd, h.patch_size
    n_pos = h.n_patches_side ** 2 + (1 if h.class_embd else 0)
    want: dict[str, tuple[int, ...]] = {
        "v.patch_embd.weight": (e, 3, p, p), "v.position_embd.weight": (n_pos, e)}
    optional = {"v.patch_embd.bias": (e,), "v.post_ln.weight": (e,), "v.post_ln.bias": (e,)}
    if h.projector == "gemma3":
        want.update(optional)
        want.update({"mm.soft_emb_norm.weight": (e,), "mm.input_projection.weight": (e, h.n_embd_out)})
    else:
        want.update({n: s for n, s in optional.items() if n in mp.tensors})
        if h.class_embd:
            want["v.class_embd"] = (e,)
        if "v.pre_ln.weight" in mp.tensors:
            want["v.pre_ln.weight"] = want["v.pre_ln.bias"] = (e,)
        n_in = e * max(1, len(h.feature_layers))
        n_mid = mp.tensor("mm.0.weight").shape[0]
        want.update({"mm.0.weight": (n_mid, n_in), "mm.0.bias": (n_mid,),
                     "mm.2.weight": (h.n_embd_out, n_mid), "mm.2.bias": (h.n_embd_out,)})
    for i in range(h.n_layer):
        b = f"v.blk.{i}"
        for t in ("ln1", "ln2"):
            want[f"{b}.{t}.weight"] = want[f"{b}.{t}.bias"] = (e,)
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            want[f"{b}.{t}.weight"], want[f"{b}.{t}.bias"] = (e, e), (e,)
        want[f"{b}.ffn_up.weight"], want[f"{b}.ffn_up.bias"] = (h.n_ff, e), (h.n_ff,)
        want[f"{b}.ffn_down.weight"], want[f"{b}.ffn_down.bias"] = (e, h.n_ff), (e,)
    for name, shape in want.items():
        info = mp.tensor(name)
        if tuple(info.shape) != shape:
            raise UnsupportedModelError(f"{mp.path}: tensor {name!r} has shape {list(info.shape)}, expected "
                                        f"{list(shape)} (numpy order) from the clip.vision.* keys")
    extra = sorted(set(mp.tensors) - set(want))
    if extra:
        raise UnsupportedModelError(f"{mp.path}: tensor {extra[0]!r} is not used by cooktop's {h.projector} "
                                    "encoder (a different ViT variant?)")
