"""The transformer forward pass, written once against the backend op set; the
architecture (``model/arch/<arch>.py``) supplies the tensors, the block and the head.

The model is cut into *segments*: runs of consecutive repeating blocks (and
possibly the output head) that live on one device (``runtime/placement.py``
decides which). Each segment owns its weights (uploaded once, still in GGML
block layout) and preallocated scratch buffers of ``n_batch`` rows. The K/V
of a sequence live in a :class:`KVCache` (one per sequence, made by
:meth:`Model.new_cache`, owned by whoever runs that sequence and passed
to every :meth:`Model.forward`), so one loaded model serves many
sequences; a lock makes forward passes of different threads take turns over
the shared scratch buffers. The token embedding lookup runs on the host; at a
segment boundary the activations (float32 [n_tokens, n_embd]) are read back
and written to the next device, nothing else. Logits come back from the
device holding the output head.

Device buffers are given back by ``close()`` or, at the latest, when their
owner (a :class:`Segment` or :class:`KVCache`) is dropped: nothing here holds
a reference cycle, so ``del`` frees them at once (a ``weakref.finalize`` per
owner releases its :class:`DeviceBuffer`, which backends that keep their own
references, such as Vulkan, need).

Per chunk of ``n`` tokens of one sequence (llama2.c's ``forward``)::

    x = token_embd[tokens]                              (host)
    for each block i:  arch.block(x, weights[i], cache.k[i], cache.v[i], pos)
    xn = arch.final_norm(x)                             (last row only unless logits_all)
    logits = arch.lm_head(xn)                           (embeddings: xn)
"""

from __future__ import annotations

import threading
import weakref
from types import SimpleNamespace

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends.base import Device, DeviceBuffer, DeviceTensor
from ..errors import CooktopError
from ..format.gguf import GGUFFile, TensorInfo
from ..format.quants import dequantize, row_bytes
from .arch import Architecture, architecture
from .arch.base import HEAD, MATRIX, Weights
from .config import ModelConfig


def _releaser(owner: object, buffer: DeviceBuffer) -> weakref.finalize:
    """A finalizer releasing ``buffer`` when ``owner`` is collected (or when called; it runs
    at most once). Not run at interpreter exit, where devices may be gone."""
    fin = weakref.finalize(owner, buffer.release)
    fin.atexit = False
    return fin


def upload(d: Device | DeviceBuffer, t: TensorInfo, as_f32: bool) -> DeviceTensor:
    """Upload a weight to ``d``: matrices as raw GGML blocks; norm and bias weights
    (``as_f32``) as float32, dequantized on the host when stored otherwise, since the
    contract's rmsnorm and add take f32 operands."""
    if as_f32 and t.ggml_type != T.F32:
        return d.upload(dequantize(t.data, t.ggml_type, t.shape), T.F32, t.shape)
    return d.upload(t.data, t.ggml_type, t.shape)


def upload_rows(d: Device | DeviceBuffer, t: TensorInfo, first: int, end: int) -> DeviceTensor:
    """Upload rows ``first .. end - 1`` of matrix ``t`` (``[n_out, n_in]``, any GGML type) as a
    weight of shape ``[end - first, n_in]``: a slice of the file's bytes, since each GGML row
    is ``row_bytes(type, n_in)`` contiguous bytes (a fused weight's part, ``TensorSpec.parts``)."""
    rb = row_bytes(t.ggml_type, t.shape[-1])
    raw = np.asarray(t.data).reshape(-1).view(np.uint8)[first * rb:end * rb]
    return d.upload(raw, t.ggml_type, (end - first,) + tuple(t.shape[1:]))


class Segment:
    """Blocks ``blocks`` (and the head when ``head``) on one device: weights and scratch buffers.

    Buffers (``B`` = n_batch rows): the architecture's scratch (``arch.scratch(cfg)``:
    name -> f32 [B, width]; llama: x, xn, o [B, n_embd], q, att [B, n_embd_q], k, v
    [B, n_embd_kv], gate, up [B, n_ff]); pos: i32 [B]; head only: last (i32 [1]),
    xl (f32 [1, n_embd]), logits f32 [B or 1, n_vocab].
    The KV cache is not here: :meth:`run` takes the sequence's cache of these blocks.
    """

    def __init__(self, device: Device, blocks: list[int], head: bool, gf: GGUFFile, cfg: ModelConfig,
                 n_batch: int, logits_all: bool, arch: Architecture | None = None):
        self.device, self.blocks, self.head, self.cfg = device, blocks, head, cfg
        self.arch = arch or architecture(cfg.arch)
        #: the arena owning every weight and scratch buffer of this segment
        self.buffer = device.buffer(f"blocks {blocks[0]}-{blocks[-1]}" if blocks else "head")
        self._release = _releaser(self, self.buffer)
        try:
            self._allocate(gf, n_batch, logits_all)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give every buffer of this segment back to its device (once; also on collection)."""
        self._release()

    def _allocate(self, gf: GGUFFile, n_batch: int, logits_all: bool) -> None:
        cfg, arch = self.cfg, self.arch
        d = self.buffer
        uploaded: dict = {}  # a tensor several units use is uploaded once (fused parts: (name, key))

        def weights(unit: int | str) -> Weights:
            w = {}
            for key, (name, spec) in arch.unit_tensors(gf.tensors, unit).items():
                if spec.parts:  # a fused matrix: each row range is a weight of its own
                    for part, first, end in spec.part_rows(cfg):
                        if (name, part) not in uploaded:
                            uploaded[(name, part)] = upload_rows(d, gf.tensor(name), first, end)
                        w[part] = uploaded[(name, part)]
                    continue
                if name not in uploaded:
                    uploaded[name] = upload(d, gf.tensor(name), as_f32=spec.kind != MATRIX)
                w[key] = uploaded[name]
            return w

        self.weights: list[Weights] = [weights(i) for i in self.blocks]
        B = n_batch
        self.scratch = {name: d.empty((B, width)) for name, width in arch.scratch(cfg).items()}
        self.pos = d.empty((B,), T.I32)
        if self.head:
            self.head_weights = weights(HEAD)
            self.last = d.empty((1,), T.I32)
            self.xl = d.empty((1, cfg.n_embd))
            self.logits = d.empty((B if logits_all else 1, cfg.n_vocab))

    def run(self, x_host: np.ndarray, pos_host: np.ndarray, logits_all: bool,
            k_cache: list[DeviceTensor], v_cache: list[DeviceTensor], embeddings: bool = False) -> np.ndarray:
        """Run this segment on ``n`` tokens of one sequence.

        Args:
            x_host: float32 [n, n_embd] activations entering the first block.
            pos_host: int32 [n] positions.
            logits_all: head only: logits for every row, else for the last row.
            k_cache, v_cache: the sequence's cache of each block of this segment,
                f32 [n_ctx, n_head_kv * head_dim] on this segment's device.
            embeddings: head only: return the output-normed hidden states of every
                row instead of logits (llama.cpp's ``result_norm``, what its embeddings pool).
        Returns:
            float32 [n, n_embd] activations after the last block, or, with the
            head, logits float32 [n or 1, n_vocab] (``embeddings``: float32 [n, n_embd]).
        """
        d, cfg, arch = self.device, self.cfg, self.arch
        n = x_host.shape[0]
        s = SimpleNamespace(**{name: buf.head(n) for name, buf in self.scratch.items()})
        pos = self.pos.head(n)
        d.write(s.x, x_host)
        d.write(pos, pos_host)
        for j, w in enumerate(self.weights):
            s.il = self.blocks[j]
            arch.block(d, cfg, w, s, k_cache[j], v_cache[j], pos)
        if not self.head:
            return d.read(s.x)
        hw = self.head_weights
        if embeddings:
            arch.final_norm(d, cfg, hw, s.xn, s.x)
            return d.read(s.xn)
        if logits_all:
            xn, logits = s.xn, self.logits.head(n)
            arch.final_norm(d, cfg, hw, xn, s.x)
        else:  # the last row only
            xn, logits = self.xl, self.logits.head(1)
            d.write(self.last, np.array([n - 1], dtype=np.int32))
            d.get_rows(xn, s.x, self.last)
            arch.final_norm(d, cfg, hw, xn, xn)
        arch.lm_head(d, cfg, hw, logits, xn)
        return d.read(logits)


class KVCache:
    """The K and V of one sequence on a loaded model, and the token ids they belong to.

    Made by :meth:`Model.new_cache`; owned by whoever runs the sequence and
    passed to :meth:`Model.forward`, which writes it. Several caches of one
    model are independent sequences.

    Attributes:
        k, v: per segment, per block of that segment: f32 [n_ctx, n_head_kv * head_dim]
            on the segment's device (row ``p`` holds position ``p``).
        tokens: ids at positions ``0 .. n_past - 1`` (their K/V are valid rows).
        n_ctx: rows of each cache tensor (tokens).
    """

    def __init__(self, model: Model):
        self._model_key = model._key
        self.n_ctx = model.n_ctx
        self.tokens: list[int] = []
        self.k: list[list[DeviceTensor]] = []
        self.v: list[list[DeviceTensor]] = []
        self._releases: list[weakref.finalize] = []
        self._closed = False
        K = model.cfg.n_embd_kv
        try:
            for seg in model.segments:
                d = seg.device.buffer("KV cache")
                self._releases.append(_releaser(self, d))
                self.k.append([d.zeros((self.n_ctx, K)) for _ in seg.blocks])
                self.v.append([d.zeros((self.n_ctx, K)) for _ in seg.blocks])
        except BaseException:
            self.close()
            raise

    @property
    def n_past(self) -> int:
        """Positions (tokens) whose K/V the cache holds."""
        return len(self.tokens)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def truncate(self, n: int) -> None:
        """Keep positions ``0 .. n - 1`` (later rows are overwritten by the next forward)."""
        del self.tokens[max(n, 0):]

    def close(self) -> None:
        """Give the cache's device buffers back. Idempotent; also runs when the cache is collected."""
        self._closed = True
        for release in self._releases:
            release()
        self.tokens = []


class Model:
    """A loaded model placed on devices (weights and scratch buffers; KV caches apart).

    Args:
        gf: the opened GGUF; cfg: its config (``cfg.arch`` names the architecture).
        segments: ``(device, block indices, holds the head)`` per segment, in order
            (``Placement.segments()`` with each selector opened).
        n_ctx: KV cache length of :meth:`new_cache` (tokens); n_batch: max tokens per :meth:`forward`.
        logits_all: keep logits of every position (else only the last).
    Raises:
        UnsupportedOpError / DeviceOutOfMemoryError from the devices while uploading.
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, segments: list[tuple[Device, list[int], bool]],
                 n_ctx: int, n_batch: int, logits_all: bool = False):
        self.gf, self.cfg, self.arch = gf, cfg, architecture(cfg.arch)
        self.n_ctx, self.n_batch, self.logits_all = n_ctx, n_batch, logits_all
        self._key = object()  # identifies the caches made by this model
        self._lock = threading.Lock()  # one forward at a time: the scratch buffers are shared
        self._closed = False
        te = gf.tensor("token_embd.weight")
        self._embd = te
        self.segments: list[Segment] = []
        try:
            for device, blocks, head in segments:
                self.segments.append(Segment(device, blocks, head, gf, cfg, n_batch, logits_all, self.arch))
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def new_cache(self) -> KVCache:
        """A fresh (empty) KV cache for one sequence, allocated on each segment's device:
        ``2 x n_layer`` buffers of f32 [n_ctx, n_head_kv * head_dim].

        Raises:
            CooktopError: the model is closed.
            DeviceOutOfMemoryError: a cache buffer does not fit.
        """
        self._check_open()
        return KVCache(self)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Token embedding lookup on the host: float32 [n, n_embd] for int [n] ids, times the
        architecture's ``embd_scale`` when it has one (gemma3)."""
        te = self._embd
        rows = np.asarray(te.data).reshape(te.shape[0], -1)[tokens]
        x = dequantize(rows, te.ggml_type, (len(tokens), te.shape[-1]))
        if self.arch.embd_scale is not None:
            x = np.asarray(x, dtype=np.float32) * np.float32(self.arch.embd_scale(self.cfg))
        return x

    def forward(self, tokens: np.ndarray, n_past: int, cache: KVCache, logits_all: bool | None = None,
                embeddings: bool = False) -> np.ndarray:
        """Evaluate ``n <= n_batch`` tokens of one sequence at positions ``n_past .. n_past + n - 1``.

        Writes their K/V into ``cache`` and sets ``cache.tokens`` to its first ``n_past``
        ids followed by ``tokens`` (positions >= n_past are overwritten). Calls from
        several threads take turns.

        Args:
            tokens: int [n] token ids, each < n_vocab.
            n_past: positions of ``cache`` to keep, <= ``cache.n_past``.
            cache: a cache made by this model's :meth:`new_cache`.
            logits_all: override of the model's setting for this call.
            embeddings: return the output-normed hidden states instead of logits.
        Returns:
            float32 [n, n_vocab] when logits_all, else float32 [1, n_vocab] (last token);
            with ``embeddings``, float32 [n, n_embd].
        Raises:
            CooktopError: the model or the cache is closed, or the cache is another model's.
            ValueError: ``n`` or ``n_past`` out of range.
        """
        self._check_open()
        if cache._model_key is not self._key:
            raise CooktopError("this KV cache was made by another model; use model.new_cache()")
        if cache.closed:
            raise CooktopError("this KV cache is closed")
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"forward takes 1..{self.n_batch} tokens, got {n}")
        if not 0 <= n_past <= cache.n_past:
            raise ValueError(f"n_past {n_past} is outside the cache's 0..{cache.n_past} positions")
        if n_past + n > self.n_ctx:
            raise ValueError(f"positions {n_past}..{n_past + n - 1} exceed n_ctx {self.n_ctx}")
        la = self.logits_all if logits_all is None else (logits_all and self.logits_all)
        ids = np.asarray(tokens, dtype=np.int64)
        h = self.embed(ids)
        pos = np.arange(n_past, n_past + n, dtype=np.int32)
        cache.truncate(n_past)  # rows from n_past on are about to be overwritten
        with self._lock:
            self._check_open()
            for seg, k, v in zip(self.segments, cache.k, cache.v):
                h = seg.run(h, pos, la, k, v, embeddings)
        cache.tokens.extend(int(t) for t in ids)
        return h

    def _check_open(self) -> None:
        if self._closed:
            raise CooktopError("the model is closed (close() was called); load it again")

    def close(self) -> None:
        """Give the weights and scratch buffers back (devices stay open in the registry;
        each KV cache is given back by its owner). Idempotent."""
        with self._lock:
            self._closed = True
            for seg in self.segments:
                seg.release()
            self.segments.clear()
