"""The llama transformer forward pass, written once against the backend op set.

The model is cut into *segments*: runs of consecutive repeating blocks (and
possibly the output head) that live on one device (``runtime/placement.py``
decides which). Each segment owns its weights (uploaded once, still in GGML
block layout), the KV cache of its blocks and preallocated scratch buffers
of ``n_batch`` rows. The token embedding lookup runs on the host; at a
segment boundary the activations (float32 [n_tokens, n_embd]) are read back
and written to the next device, nothing else. Logits come back from the
device holding the output head.

Block (llama.cpp ``llm_build_llama``)::

    xn = rmsnorm(x) * attn_norm
    q, k, v = xn @ Wq^T, xn @ Wk^T, xn @ Wv^T ; rope(q), rope(k)
    cache[pos] = k, v ; a = attention(q, cache) ; x += a @ Wo^T
    xn = rmsnorm(x) * ffn_norm ; x += (silu(xn @ Wg^T) * (xn @ Wu^T)) @ Wd^T

Head: ``logits = (rmsnorm(x) * output_norm) @ Wout^T`` (Wout = token_embd when tied).
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends.base import Device, DeviceTensor
from ..format.quants import dequantize
from .config import ModelConfig
from ..format.gguf import GGUFFile, TensorInfo

BLOCK_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def head_tensor_names(cfg: ModelConfig) -> tuple[str, str]:
    """GGUF names of the output norm and output matrix (``token_embd`` when tied)."""
    return "output_norm.weight", ("token_embd.weight" if cfg.tied_output else "output.weight")


class _Tracking:
    """A device wrapper that records every allocation (``upload``/``empty``/``zeros``) in ``allocs``."""

    def __init__(self, device: Device, allocs: list[DeviceTensor]):
        self._d, self._allocs = device, allocs

    def _keep(self, t: DeviceTensor) -> DeviceTensor:
        self._allocs.append(t)
        return t

    def upload(self, *a) -> DeviceTensor:
        return self._keep(self._d.upload(*a))

    def empty(self, *a) -> DeviceTensor:
        return self._keep(self._d.empty(*a))

    def zeros(self, *a) -> DeviceTensor:
        return self._keep(self._d.zeros(*a))


def upload(d: Device, t: TensorInfo) -> DeviceTensor:
    """Upload a weight to ``d``: matrices as raw GGML blocks; 1-D norm weights as
    float32 (dequantized on the host when stored as F16/BF16), since the
    contract's rmsnorm takes f32 weights."""
    if len(t.shape) == 1 and t.ggml_type != T.F32:
        return d.upload(dequantize(t.data, t.ggml_type, t.shape), T.F32, t.shape)
    return d.upload(t.data, t.ggml_type, t.shape)


class Segment:
    """Blocks ``blocks`` (and the head when ``head``) on one device, with their buffers.

    Buffers (``B`` = n_batch rows, ``E`` = n_embd, ``K`` = n_head_kv * head_dim,
    ``F`` = n_ff, ``V`` = n_vocab):
    x, xn, q, att, o: f32 [B, E]; k, v: f32 [B, K]; gate, up: f32 [B, F];
    pos: i32 [B]; kv caches per block: f32 [n_ctx, K] each;
    head only: last (i32 [1]), logits f32 [B or 1, V].
    """

    def __init__(self, device: Device, blocks: list[int], head: bool, gf: GGUFFile, cfg: ModelConfig,
                 n_ctx: int, n_batch: int, logits_all: bool):
        self.device, self.blocks, self.head, self.cfg = device, blocks, head, cfg
        self.allocations: list[DeviceTensor] = []
        try:
            self._allocate(gf, n_ctx, n_batch, logits_all)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give every buffer of this segment back to its device."""
        allocs, self.allocations = self.allocations, []
        self.device.release(allocs)

    def _allocate(self, gf: GGUFFile, n_ctx: int, n_batch: int, logits_all: bool) -> None:
        cfg = self.cfg
        d = _Tracking(self.device, self.allocations)
        self.weights: list[dict[str, DeviceTensor]] = []
        for i in self.blocks:
            w = {}
            for name in BLOCK_TENSORS:
                w[name] = upload(d, gf.tensor(f"blk.{i}.{name}.weight"))
            self.weights.append(w)
        E, K, F, B = cfg.n_embd, cfg.n_embd_kv, cfg.n_ff, n_batch
        self.k_cache = [d.zeros((n_ctx, K)) for _ in self.blocks]
        self.v_cache = [d.zeros((n_ctx, K)) for _ in self.blocks]
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

    def run(self, x_host: np.ndarray, pos_host: np.ndarray, logits_all: bool) -> np.ndarray:
        """Run this segment on ``n`` tokens.

        Args:
            x_host: float32 [n, n_embd] activations entering the first block.
            pos_host: int32 [n] positions.
            logits_all: head only: logits for every row, else for the last row.
        Returns:
            float32 [n, n_embd] activations after the last block, or, with the
            head, logits float32 [n or 1, n_vocab].
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
            d.kv_store(self.k_cache[j], k, pos)
            d.kv_store(self.v_cache[j], v, pos)
            d.attention(att, q, self.k_cache[j], self.v_cache[j], pos, cfg.n_head, cfg.n_head_kv, scale)
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


class LlamaModel:
    """A loaded llama model placed on devices, with its KV cache.

    Args:
        gf: the opened GGUF; cfg: its config.
        segments: ``(device, block indices, holds the head)`` per segment, in order
            (``Placement.segments()`` with each selector opened).
        n_ctx: KV cache length (tokens); n_batch: max tokens per :meth:`forward`.
        logits_all: keep logits of every position (else only the last).
    Raises:
        UnsupportedOpError / DeviceOutOfMemoryError from the devices while uploading.
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, segments: list[tuple[Device, list[int], bool]],
                 n_ctx: int, n_batch: int, logits_all: bool = False):
        self.gf, self.cfg = gf, cfg
        self.n_ctx, self.n_batch, self.logits_all = n_ctx, n_batch, logits_all
        te = gf.tensor("token_embd.weight")
        self._embd = te
        self.segments: list[Segment] = []
        try:
            for device, blocks, head in segments:
                self.segments.append(Segment(device, blocks, head, gf, cfg, n_ctx, n_batch, logits_all))
        except BaseException:
            self.close()
            raise

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Token embedding lookup on the host: float32 [n, n_embd] for int [n] ids."""
        te = self._embd
        rows = np.asarray(te.data).reshape(te.shape[0], -1)[tokens]
        return dequantize(rows, te.ggml_type, (len(tokens), te.shape[-1]))

    def forward(self, tokens: np.ndarray, n_past: int, logits_all: bool | None = None) -> np.ndarray:
        """Evaluate ``n <= n_batch`` tokens at positions ``n_past .. n_past + n - 1``.

        Writes their K/V into the cache (positions >= n_past are overwritten).

        Args:
            tokens: int [n] token ids, each < n_vocab.
            n_past: tokens already in the cache.
            logits_all: override of the model's setting for this call.
        Returns:
            float32 [n, n_vocab] when logits_all, else float32 [1, n_vocab] (last token).
        """
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"forward takes 1..{self.n_batch} tokens, got {n}")
        if n_past + n > self.n_ctx:
            raise ValueError(f"positions {n_past}..{n_past + n - 1} exceed n_ctx {self.n_ctx}")
        la = self.logits_all if logits_all is None else (logits_all and self.logits_all)
        h = self.embed(np.asarray(tokens, dtype=np.int64))
        pos = np.arange(n_past, n_past + n, dtype=np.int32)
        for seg in self.segments:
            h = seg.run(h, pos, la)
        return h

    def close(self) -> None:
        """Give the device buffers back (devices stay open in the registry). Idempotent."""
        for seg in self.segments:
            seg.release()
        self.segments.clear()
