"""The llama transformer forward pass, written once against the backend op set.

The model is cut into *segments*: runs of consecutive repeating blocks (and
possibly the output head) that live on one device (``runtime/placement.py``
decides which). Each segment owns its weights (uploaded once, still in GGML
block layout) and preallocated scratch buffers of ``n_batch`` rows. The K/V
of a sequence live in a :class:`KVCache` (one per sequence, made by
:meth:`LlamaModel.new_cache`, owned by whoever runs that sequence and passed
to every :meth:`LlamaModel.forward`), so one loaded model serves many
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

Block (llama.cpp ``llm_build_llama``)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T, xn @ Wk^T, xn @ Wv^T ; rope(q), rope(k)
    cache[pos] = k, v ; a = attention(q, cache) ; x += a @ Wo^T
    xn = rmsnorm(x) * ffn_norm ; x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T

Head: ``logits = (rmsnorm(x) * output_norm) @ Wout^T`` (Wout = token_embd when tied).
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends.base import Device, DeviceBuffer, DeviceTensor
from ..errors import CooktopError
from ..format.quants import dequantize
from .config import ModelConfig
from ..format.gguf import GGUFFile, TensorInfo

BLOCK_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def head_tensor_names(cfg: ModelConfig) -> tuple[str, str]:
    """GGUF names of the output norm and output matrix (``token_embd`` when tied)."""
    return "output_norm.weight", ("token_embd.weight" if cfg.tied_output else "output.weight")


def _releaser(owner: object, buffer: DeviceBuffer) -> weakref.finalize:
    """A finalizer releasing ``buffer`` when ``owner`` is collected (or when called; it runs
    at most once). Not run at interpreter exit, where devices may be gone."""
    fin = weakref.finalize(owner, buffer.release)
    fin.atexit = False
    return fin


def upload(d: Device | DeviceBuffer, t: TensorInfo) -> DeviceTensor:
    """Upload a weight to ``d``: matrices as raw GGML blocks; 1-D norm weights as
    float32 (dequantized on the host when stored as F16/BF16), since the
    contract's rmsnorm takes f32 weights."""
    if len(t.shape) == 1 and t.ggml_type != T.F32:
        return d.upload(dequantize(t.data, t.ggml_type, t.shape), T.F32, t.shape)
    return d.upload(t.data, t.ggml_type, t.shape)


class Segment:
    """Blocks ``blocks`` (and the head when ``head``) on one device: weights and scratch buffers.

    Buffers (``B`` = n_batch rows, ``E`` = n_embd, ``K`` = n_head_kv * head_dim,
    ``F`` = n_ff, ``V`` = n_vocab):
    x, xn, q, att, o: f32 [B, E]; k, v: f32 [B, K]; gate, up: f32 [B, F];
    pos: i32 [B]; head only: last (i32 [1]), logits f32 [B or 1, V].
    The KV cache is not here: :meth:`run` takes the sequence's cache of these blocks.
    """

    def __init__(self, device: Device, blocks: list[int], head: bool, gf: GGUFFile, cfg: ModelConfig,
                 n_batch: int, logits_all: bool):
        self.device, self.blocks, self.head, self.cfg = device, blocks, head, cfg
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
        cfg = self.cfg
        d = self.buffer
        self.weights: list[dict[str, DeviceTensor]] = []
        for i in self.blocks:
            w = {}
            for name in BLOCK_TENSORS:
                w[name] = upload(d, gf.tensor(f"blk.{i}.{name}.weight"))
            self.weights.append(w)
        E, K, F, B = cfg.n_embd, cfg.n_embd_kv, cfg.n_ff, n_batch
        self.x, self.xn, self.q, self.att, self.o = (d.empty((B, E)) for _ in range(5))
        self.k, self.v = d.empty((B, K)), d.empty((B, K))
        self.gate, self.up = d.empty((B, F)), d.empty((B, F))
        self.pos = d.empty((B,), T.I32)
        if self.head:
            norm_name, out_name = head_tensor_names(cfg)
            self.out_norm = upload(d, gf.tensor(norm_name))
            self.output = upload(d, gf.tensor(out_name))
            self.last = d.empty((1,), T.I32)
            self.xl = d.empty((1, E))
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
        d, cfg = self.device, self.cfg
        n = x_host.shape[0]
        x, pos = self.x.head(n), self.pos.head(n)
        d.write(x, x_host)
        d.write(pos, pos_host)
        xn, q, att, o = self.xn.head(n), self.q.head(n), self.att.head(n), self.o.head(n)
        k, v, gate, up = self.k.head(n), self.v.head(n), self.gate.head(n), self.up.head(n)
        scale = 1.0 / math.sqrt(cfg.head_dim)
        rope_args = (cfg.head_dim, cfg.n_rot, cfg.rope_freq_base, cfg.rope_freq_scale, cfg.rope_mode)
        for j, w in enumerate(self.weights):
            d.rmsnorm(xn, x, w["attn_norm"], cfg.rms_eps)
            d.matmul(q, xn, w["attn_q"])
            d.matmul(k, xn, w["attn_k"])
            d.matmul(v, xn, w["attn_v"])
            d.rope(q, q, pos, *rope_args)
            d.rope(k, k, pos, *rope_args)
            d.kv_store(k_cache[j], k, pos)
            d.kv_store(v_cache[j], v, pos)
            d.attention(att, q, k_cache[j], v_cache[j], pos, cfg.n_head, cfg.n_head_kv, scale)
            d.matmul(o, att, w["attn_output"])
            d.add(x, x, o)
            d.rmsnorm(xn, x, w["ffn_norm"], cfg.rms_eps)
            d.matmul(gate, xn, w["ffn_gate"])
            d.matmul(up, xn, w["ffn_up"])
            d.silu_mul(gate, gate, up)
            d.matmul(o, gate, w["ffn_down"])
            d.add(x, x, o)
        if not self.head:
            return d.read(x)
        if embeddings:
            d.rmsnorm(xn, x, self.out_norm, cfg.rms_eps)
            return d.read(xn)
        if logits_all:
            xl, logits = xn, self.logits.head(n)
            d.rmsnorm(xl, x, self.out_norm, cfg.rms_eps)
        else:
            xl, logits = self.xl, self.logits.head(1)
            d.write(self.last, np.array([n - 1], dtype=np.int32))
            d.get_rows(xl, x, self.last)
            d.rmsnorm(xl, xl, self.out_norm, cfg.rms_eps)
        d.matmul(logits, xl, self.output)
        return d.read(logits)


class KVCache:
    """The K and V of one sequence on a loaded model, and the token ids they belong to.

    Made by :meth:`LlamaModel.new_cache`; owned by whoever runs the sequence and
    passed to :meth:`LlamaModel.forward`, which writes it. Several caches of one
    model are independent sequences.

    Attributes:
        k, v: per segment, per block of that segment: f32 [n_ctx, n_head_kv * head_dim]
            on the segment's device (row ``p`` holds position ``p``).
        tokens: ids at positions ``0 .. n_past - 1`` (their K/V are valid rows).
        n_ctx: rows of each cache tensor (tokens).
    """

    def __init__(self, model: LlamaModel):
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


class LlamaModel:
    """A loaded llama model placed on devices (weights and scratch buffers; KV caches apart).

    Args:
        gf: the opened GGUF; cfg: its config.
        segments: ``(device, block indices, holds the head)`` per segment, in order
            (``Placement.segments()`` with each selector opened).
        n_ctx: KV cache length of :meth:`new_cache` (tokens); n_batch: max tokens per :meth:`forward`.
        logits_all: keep logits of every position (else only the last).
    Raises:
        UnsupportedOpError / DeviceOutOfMemoryError from the devices while uploading.
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, segments: list[tuple[Device, list[int], bool]],
                 n_ctx: int, n_batch: int, logits_all: bool = False):
        self.gf, self.cfg = gf, cfg
        self.n_ctx, self.n_batch, self.logits_all = n_ctx, n_batch, logits_all
        self._key = object()  # identifies the caches made by this model
        self._lock = threading.Lock()  # one forward at a time: the scratch buffers are shared
        self._closed = False
        te = gf.tensor("token_embd.weight")
        self._embd = te
        self.segments: list[Segment] = []
        try:
            for device, blocks, head in segments:
                self.segments.append(Segment(device, blocks, head, gf, cfg, n_batch, logits_all))
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
        """Token embedding lookup on the host: float32 [n, n_embd] for int [n] ids."""
        te = self._embd
        rows = np.asarray(te.data).reshape(te.shape[0], -1)[tokens]
        return dequantize(rows, te.ggml_type, (len(tokens), te.shape[-1]))

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
