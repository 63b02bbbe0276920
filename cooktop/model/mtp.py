"""The multi-token-prediction (MTP) block of a qwen35 / qwen35moe / glm4moe file, run as a one-block model:
the draft of ``--spec-type draft-mtp`` (:class:`~cooktop.engine.speculative.MTPDraft`).

Qwen3.5 / Qwen3.6 and GLM-4.5 files may carry ``<arch>.nextn_predict_layers`` = 1 block after the trunk
(block index ``n_layer``, the trunk's blocks being ``0 .. n_layer - 1``): the tensors of one trunk block
(qwen35: a gated full-attention block and its feed-forward, dense or experts; glm4moe: a MoE block with its
shared expert) under ``blk.<n_layer>.``, plus
``nextn.enorm``, ``nextn.hnorm``, ``nextn.eh_proj`` and optionally ``nextn.shared_head_norm``,
``nextn.shared_head_head`` and ``nextn.embed_tokens``. Given the trunk's output-normed hidden state
``h_p`` after position ``p`` (llama.cpp's ``h_nextn``) and the token ``x_{p+1}``, it predicts
``x_{p+2}`` (llama.cpp src/models/qwen35.cpp ``graph_mtp``, qwen35moe.cpp the same with experts,
glm4-moe.cpp the same with glm4moe's block)::

    e = rmsnorm(embed(x_{p+1})) * enorm        h' = rmsnorm(h_p) * hnorm        f32 [n, n_embd]
    x = [e, h'] @ eh_proj^T                     eh_proj f32 [n_embd, 2 n_embd]
    x = the trunk's block (its own K/V, at MTP position p + 1): qwen35's gated attention and FFN,
        glm4moe's attention and experts
    h_mtp = rmsnorm(x) * (shared_head_norm or output_norm)       (fed back when drafting further)
    logits = h_mtp @ (shared_head_head or output)^T

cooktop runs it with the trunk's own ops and builders (every backend): :class:`MTPModel` is a
:class:`~cooktop.model.forward.Model` of one :class:`~cooktop.model.forward.Segment` holding block
``n_layer`` and a head, on the device of the target's head, with an architecture (:func:`mtp_architecture`)
whose block first computes the input (the concatenation as two matmuls by the halves of ``eh_proj``'s
columns, split at load: ``[e, h'] @ W^T = e @ W_e^T + h' @ W_h^T``) and whose head norms with
``shared_head_norm`` and multiplies by ``shared_head_head`` (the target's ``output_norm`` / LM head,
shared on the device, when the file has none). Its KV caches are the model's ordinary ones
(:meth:`~cooktop.model.placed.PlacedModel.new_cache`, attention only); the ``h`` rows enter through a
scratch buffer written before each pass (:meth:`MTPModel.forward_h`), and its own ``h_mtp`` rows are
kept in the cache's ``hidden`` (:class:`~cooktop.model.placed.HiddenRows`).
"""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends.base import Device, DeviceTensor
from ..errors import CooktopError
from ..format.gguf import GGUFFile
from ..format.quants import dequantize, row_bytes
from .arch import architecture
from .arch.base import BLOCK, KV, NORM, TensorSpec, Weights
from .arch.builders import build_norm
from .arch.descriptor import Architecture
from .config import ModelConfig
from .forward import Model, Segment, upload
from .placed import PlacedModel, Rows

#: architectures whose MTP block cooktop runs (llama.cpp ``graph_mtp`` of qwen35.cpp / qwen35moe.cpp /
#: glm4-moe.cpp)
MTP_ARCHS = ("qwen35", "qwen35moe", "glm4moe")

#: the MTP block's own tensors (llama.cpp ``LLM_TENSOR_NEXTN_*``), beside its attention block's
NEXTN_NORMS = ("nextn.enorm", "nextn.hnorm")
EH_PROJ = "nextn.eh_proj"
SHARED_HEAD_NORM = "nextn.shared_head_norm"
SHARED_HEAD_HEAD = "nextn.shared_head_head"
EMBED_TOKENS = "nextn.embed_tokens"


class NoMTPError(CooktopError):
    """The model has no multi-token-prediction block cooktop can run (``--spec-type draft-mtp``)."""


def mtp_config(cfg: ModelConfig) -> ModelConfig:
    """The config of the one-block MTP model: the trunk's, with block ``n_layer`` an attention block
    (``n_layer`` + 1 blocks, the last not recurrent)."""
    recr = tuple(cfg.recurrent_layers) + (False,) if cfg.recurrent_layers else ()
    return dataclasses.replace(cfg, n_layer=cfg.n_layer + 1, recurrent_layers=recr, n_layer_nextn=0)


def check_mtp(gf: GGUFFile, cfg: ModelConfig) -> int:
    """The MTP block's index (``cfg.n_layer``) after checking the file has one cooktop runs.

    Raises:
        NoMTPError: another architecture than :data:`MTP_ARCHS`, ``nextn_predict_layers`` = 0 or > 1
            (llama.cpp runs one MTP block too), or a missing or misshapen ``nextn`` tensor.
    """
    if cfg.arch not in MTP_ARCHS:
        raise NoMTPError(f"--spec-type draft-mtp: the {cfg.arch} architecture has no multi-token-prediction "
                         f"block cooktop runs (it has: {', '.join(MTP_ARCHS)})")
    if cfg.n_layer_nextn == 0:
        raise NoMTPError(f"--spec-type draft-mtp: {gf.path} has no multi-token-prediction block "
                         f"({cfg.arch}.nextn_predict_layers = 0); use another --spec-type or a file with one")
    if cfg.n_layer_nextn > 1:
        raise NoMTPError(f"--spec-type draft-mtp: {gf.path} has {cfg.n_layer_nextn} MTP blocks; cooktop (as "
                         "llama.cpp) runs a single one")
    il, E = cfg.n_layer, cfg.n_embd
    q_spec = architecture(cfg.arch).spec("blk.{i}.attn_q.weight")
    assert q_spec is not None  # every MTP architecture has separate Q/K/V
    want = {f"blk.{il}.{EH_PROJ}.weight": (E, 2 * E), **{f"blk.{il}.{k}.weight": (E,) for k in NEXTN_NORMS},
            f"blk.{il}.attn_norm.weight": (E,), f"blk.{il}.attn_q.weight": q_spec.shape(mtp_config(cfg))}
    for name, shape in want.items():
        t = gf.tensors.get(name)
        if t is None:
            raise NoMTPError(f"--spec-type draft-mtp: {gf.path} lacks tensor {name!r} of its MTP block")
        if tuple(t.shape) != shape:
            raise NoMTPError(f"--spec-type draft-mtp: {gf.path}: tensor {name!r} has shape {list(t.shape)}, "
                             f"the MTP block needs {list(shape)}")
    return il


def mtp_input(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace) -> None:
    """The MTP block's input on ``n`` rows: ``s.x`` the token embeddings and ``s.mtp_h`` the target's hidden
    states (f32 [n, n_embd] each; ``s.mtp_h`` is overwritten); leaves ``[e, h'] @ eh_proj^T`` in ``s.x``
    (module doc; llama.cpp ``graph_mtp``: enorm, hnorm, concat, eh_proj). The trunk's block follows."""
    build_norm(d, cfg, s.xn, s.x, w["nextn.enorm"])
    build_norm(d, cfg, s.mtp_h, s.mtp_h, w["nextn.hnorm"])
    d.matmul(s.x, s.xn, w["eh_proj_e"])
    d.matmul(s.o, s.mtp_h, w["eh_proj_h"])
    d.add(s.x, s.x, s.o)


def _mtp_norm(d: Device, cfg: ModelConfig, w: Weights, xn: DeviceTensor, x: DeviceTensor) -> None:
    """``xn = rmsnorm(x) * shared_head_norm`` (the target's ``output_norm`` when the file has none)."""
    build_norm(d, cfg, xn, x, w["mtp_norm"])


def _mtp_head(d: Device, cfg: ModelConfig, w: Weights, logits: DeviceTensor, xn: DeviceTensor) -> None:
    """``logits = xn @ shared_head_head^T`` (the target's LM head when the file has none)."""
    d.matmul(logits, xn, w["mtp_head"])


def mtp_architecture(trunk: Architecture) -> Architecture:
    """The one-block architecture of the MTP model of ``trunk`` (qwen35 / qwen35moe / glm4moe): the trunk's
    block tensors and ``nextn.enorm`` / ``nextn.hnorm`` (``eh_proj`` and the head are uploaded by
    :class:`MTPModel`), a block of :func:`mtp_input` then the trunk's block, the trunk's scratch and an
    ``mtp_h`` [n_embd] buffer."""
    block_specs = tuple(s for s in trunk.tensors if s.unit == BLOCK)
    norms = tuple(TensorSpec(f"blk.{{i}}.{k}.weight", lambda c: (c.n_embd,), BLOCK, kind=NORM) for k in NEXTN_NORMS)
    base_scratch, trunk_block = trunk.scratch, trunk.block

    def scratch(cfg: ModelConfig) -> dict[str, int]:
        return {**base_scratch(cfg), "mtp_h": cfg.n_embd}

    def mtp_block(d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int) -> None:
        mtp_input(d, cfg, w, s)
        trunk_block(d, cfg, w, s, kv, il)

    return Architecture(name=f"{trunk.name}-mtp", tensors=block_specs + norms, rope_mode=trunk.rope_mode,
                        hparams=trunk.hparams, block=mtp_block, scratch=scratch, final_norm=_mtp_norm,
                        lm_head=_mtp_head, scratch_i32=trunk.scratch_i32)


def _split_columns(t: Any, device: Any) -> tuple[DeviceTensor, DeviceTensor]:
    """``eh_proj`` [n_embd, 2 n_embd] uploaded as its two column halves [n_embd, n_embd] (the
    embedding's, then the hidden state's): byte halves of each GGML row when ``n_embd`` is a whole
    number of the type's blocks, else dequantized to f32 on the host."""
    n_out, n_in = t.shape
    half = n_in // 2
    rb, hb = row_bytes(t.ggml_type, n_in), row_bytes(t.ggml_type, half)
    raw = np.asarray(t.data).reshape(-1).view(np.uint8).reshape(n_out, rb)
    if 2 * hb == rb:
        a, b = np.ascontiguousarray(raw[:, :hb]), np.ascontiguousarray(raw[:, hb:])
        return device.upload(a, t.ggml_type, (n_out, half)), device.upload(b, t.ggml_type, (n_out, half))
    full = np.asarray(dequantize(t.data, t.ggml_type, t.shape), dtype=np.float32).reshape(n_out, n_in)
    return (device.upload(np.ascontiguousarray(full[:, :half]), T.F32, (n_out, half)),
            device.upload(np.ascontiguousarray(full[:, half:]), T.F32, (n_out, half)))


def mtp_weight_bytes(gf: GGUFFile, cfg: ModelConfig) -> int:
    """Bytes the MTP block adds on its device: every ``blk.<n_layer>.*`` tensor of the file (the
    target's head is shared when the file has no ``shared_head_*``); 0 without an MTP block."""
    if cfg.n_layer_nextn == 0:
        return 0
    prefix = f"blk.{cfg.n_layer}."
    return sum(int(t.n_bytes) for name, t in gf.tensors.items() if name.startswith(prefix))


def mtp_kv_bytes(cfg: ModelConfig, n_ctx: int, bytes_per_value: float = 2.0) -> int:
    """Bytes of one sequence's MTP K/V: ``n_ctx`` cells of K and V rows of ``n_head_kv * head_dim``."""
    return int(2 * n_ctx * cfg.n_embd_kv * bytes_per_value) if cfg.n_layer_nextn else 0


class MTPModel(Model):
    """The MTP block of ``target``'s file as a one-block model on the device of ``target``'s head.

    Args:
        target: the loaded trunk (a :class:`~cooktop.model.forward.Model` of a qwen35 / qwen35moe / glm4moe file
            with one MTP block); its ``n_ctx``, ``n_batch`` and KV types are taken. The target must
            stay open while this model is used (the LM head may be its).
    Raises:
        NoMTPError: see :func:`check_mtp`; a cluster model.
        DeviceOutOfMemoryError: the block's weights do not fit.
    """

    def __init__(self, target: PlacedModel):
        if not isinstance(target, Model):
            raise NoMTPError("--spec-type draft-mtp runs on a model placed on this machine's devices, not on "
                             "a cluster")
        gf, tcfg = target.gf, target.cfg
        il = check_mtp(gf, tcfg)
        cfg = mtp_config(tcfg)
        arch = mtp_architecture(architecture(tcfg.arch))
        head_seg = next(s for s in target.segments if s.head)
        PlacedModel.__init__(self, gf, cfg, target.n_ctx, target.n_batch, logits_all=False)
        self.arch = arch
        self.kv = target.kv
        self.flash_attn = target.flash_attn
        self.record_hidden = True
        self.block_index = il
        self._h_lock = threading.Lock()
        self._h_in: np.ndarray | None = None
        self.segments = []
        if f"blk.{il}.{EMBED_TOKENS}.weight" in gf.tensors:
            self._embd = gf.tensor(f"blk.{il}.{EMBED_TOKENS}.weight")
        try:
            seg = Segment(head_seg.device, [il], True, gf, cfg, target.n_batch, False, arch)
            seg.flash_attn = self.flash_attn
            self.segments.append(seg)
            e, h = _split_columns(gf.tensor(f"blk.{il}.{EH_PROJ}.weight"), seg.buffer)
            seg.weights[0]["eh_proj_e"], seg.weights[0]["eh_proj_h"] = e, h
            tw = head_seg.head_weights
            norm_name, head_name = f"blk.{il}.{SHARED_HEAD_NORM}.weight", f"blk.{il}.{SHARED_HEAD_HEAD}.weight"
            seg.head_weights["mtp_norm"] = (upload(seg.buffer, gf.tensor(norm_name), as_f32=True)
                                            if norm_name in gf.tensors else tw["output_norm"])
            seg.head_weights["mtp_head"] = (upload(seg.buffer, gf.tensor(head_name), as_f32=False)
                                            if head_name in gf.tensors else tw["output"])
        except BaseException:
            self.close()
            raise

    @property
    def device(self) -> Device:
        """The device the block runs on (the target's head's)."""
        return self.segments[0].device

    def forward_h(self, tokens: list[int] | np.ndarray, h: np.ndarray, n_past: int, cache: Any,
                  logits_all: bool = False) -> np.ndarray:
        """Evaluate the pairs ``(h[i], tokens[i])`` at MTP positions ``n_past ..`` (``forward``'s rules).

        Args:
            tokens: int [n] the tokens x_{p+1}; h: float32 [n, n_embd] the hidden states h_p paired
                with them (the target's, or this model's own when drafting further).
            logits_all: return every pair's logits.
        Returns:
            float32 [1, n_vocab], the logits of the last pair (``logits_all``: [n, n_vocab]); the
            pairs' ``h_mtp`` rows are in ``cache.hidden`` at positions ``n_past .. n_past + n - 1``.
        Raises:
            ValueError: ``h`` not [n, n_embd]; what :meth:`forward` raises.
        """
        h = np.ascontiguousarray(h, dtype=np.float32)
        if h.shape != (len(tokens), self.cfg.n_embd):
            raise ValueError(f"forward_h: h is {list(h.shape)}, expected [{len(tokens)}, {self.cfg.n_embd}]")
        with self._h_lock:
            self._h_in = h
            try:
                return self.forward(np.asarray(tokens), n_past, cache, logits_all)
            finally:
                self._h_in = None

    def _run(self, x: np.ndarray, rows: Rows, cache: Any, embeddings: bool) -> np.ndarray:
        """The one segment, its ``mtp_h`` rows written first (:meth:`forward_h`), its own normed rows kept."""
        h = self._h_in
        if h is None:
            raise CooktopError("the MTP block needs the target's hidden states: call forward_h")
        with self._lock:
            self._check_open()
            seg = self.segments[0]
            with seg.device.lock:
                seg.device.write(seg.scratch["mtp_h"].head(len(x)), h)
                out = seg.run(x, rows, cache.k[0], cache.v[0], embeddings, None, True)
            self._record_hidden(cache, rows, seg.hidden_out)
        return out
