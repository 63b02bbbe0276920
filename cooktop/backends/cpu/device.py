"""The numpy backend: the reference every device backend is tested against, and the fallback.

Dequantization is :mod:`.quants` (whole tensors in cache-sized row chunks on a
few threads, equal to ``gguf.quants.dequantize``, the gguf package's reference of the
GGML block layouts); products are float32 ``np.matmul`` (BLAS): a weight's in fixed blocks of rows,
one-thread products spread over the dequantization threads, attention's on one thread, so that the
same tokens give the same bits whatever the thread counts and whether a weight is cached yet.

Memory policy for weights: an F32 weight is used in place (a view of the
memory-mapped file, never copied). Any other type is dequantized to float32
on first use and kept, up to a budget of ``COOKTOP_CPU_CACHE`` bytes (default:
a quarter of physical memory, at most 8 GiB; ``0`` disables the cache).

So that the first answer does not wait for the whole model's conversion, it runs
on one background thread (in upload order, with a progress bar on a terminal
once it runs a second or two) that starts once the first forward pass has used
every weight (or after :data:`CONVERT_AFTER_S`), and every weight not converted
yet is used *streamed*: each matmul dequantizes it in
blocks of rows that stay in cache and multiplies block by block on the
dequantization threads. That is also how a weight past the budget always runs
(a model larger than the budget), and it never holds a whole float32 copy.
Peak RSS is about file size + min(budget, float32 size of the weights) +
activations + KV cache.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from ... import notices, settings
from ...format.kvtypes import KV_TYPES
from ...format.quants import HOST_TYPES, row_bytes
from ..base import (
    MOE_OPS,
    OPS,
    RECURRENT_OPS,
    ROPE_NEOX,
    VISION_OPS,
    Backend,
    Device,
    DeviceInfo,
    DeviceTensor,
    ProbeResult,
    rope_yarn_params,
    type_name,
)
from ..reference import quantize_kv
from . import quants as cpu_quants
from .moe import CpuMoeOps
from .recurrent import CpuRecurrentOps
from .vision import CpuVisionOps


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_cache_budget() -> int:
    """Bytes of float32 dequantized weights the numpy backend may keep (see module doc):
    ``COOKTOP_CPU_CACHE``, else a quarter of the physical memory, at most 8 GiB.

    Raises:
        SettingError: a malformed ``COOKTOP_CPU_CACHE``.
    """
    return settings.cpu_cache(min(8 << 30, _physical_memory() // 4))


#: Every GGML type the numpy backend runs: all the host can dequantize.
CPU_TYPES = HOST_TYPES


#: ``extra`` of a weight while a thread dequantizes it.
_CONVERTING = "converting"

#: Seconds the background conversion waits at most for the first forward pass to use every
#: weight (streamed) before it starts.
CONVERT_AFTER_S = 10.0


#: Query positions per tile of :func:`_attend_tiles` are ``max(1, ATTN_TILE_ROWS // g)`` (``g``
#: query heads per KV head): a tile's products have about this many rows.
ATTN_TILE_ROWS = 16
#: Score values per step of :func:`_attend_tiles` (2 MiB of float32: its temporaries stay in cache).
ATTN_CHUNK = 1 << 19
#: Cache positions per key block of :func:`_attend_tiles` (aligned at the first position read).
ATTN_KV_BLOCK = 64


def _attend_tiles(qa, kc, vc, p, lo, n_head, n_head_kv, scale, window, sinks):
    """float32 [n, n_head * hd]: query rows ``qa`` (float32 [n, n_head * hd], at the distinct
    positions ``p``, int [n]) attend to cache rows ``lo .. p[i]`` (and the window) of ``kc`` / ``vc``
    (float32 [>= p.max() + 1 - lo, n_head_kv * hd], row 0 at position ``lo``); ``sinks`` (float32
    [n_head] or None): one more logit per head in each softmax denominator.

    Every product is one BLAS call of a fixed shape and every sum runs in a fixed order, so a
    value's bits depend only on its own query row and cache rows, never on the other rows or on
    how many cache rows are read. Query tiles of ``T = max(1, ATTN_TILE_ROWS // g)`` positions x
    ``g`` heads (``R = T * g`` rows; a query at position ``p`` sits in rows ``(p % T) * g ..`` of tile
    ``p // T``, zero rows where a position is absent) times key blocks of ``B =``
    :data:`ATTN_KV_BLOCK` positions (from ``lo``, zero-padded at the end) give the scores, each an
    ``[R, hd] @ [hd, B]`` product; the softmax sums each block's ``B`` values (one numpy reduction of a
    fixed length) then the block sums in block order (``cumsum``); ``p . v`` is one ``[R, B] @ [B,
    hd]`` product per block, the partials added in block order. Masked positions give exact zeros
    (weights) and a zero added changes no sum, so a longer cache or skipped all-masked blocks (before
    every row's window) leave a row as it is. ``np.matmul`` calls one cblas ``sgemm`` per stacked item
    (core strides fixed per model)."""
    n = qa.shape[0]
    hkv = n_head_kv
    hd = qa.shape[1] // n_head
    g = n_head // hkv
    tq, bk = max(1, ATTN_TILE_ROWS // g), ATTN_KV_BLOCK
    r = tq * g
    n_kv = int(p.max()) + 1 - lo
    b0 = max(0, (int(p.min()) - window + 1 - lo) // bk) if window > 0 else 0
    nb = -(-n_kv // bk) - b0
    j0 = b0 * bk  # first cache row read
    nfull = (n_kv - j0) // bk  # whole blocks: views of the cache rows; the last one zero-padded

    def blocks(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = c[j0:n_kv]
        if c.strides != (hkv * hd * 4, 4):
            c = np.ascontiguousarray(c)
        tail = np.zeros((bk, hkv * hd), np.float32)
        tail[:len(c) - nfull * bk] = c[nfull * bk:]
        return c[:nfull * bk].reshape(nfull, bk, hkv, hd), tail.reshape(1, bk, hkv, hd)

    (kf, kt), (vf, vt) = blocks(kc), blocks(vc)
    # [hkv, 1, nb', hd, B] / [hkv, 1, nb', B, hd] views with the same core strides
    kb = [x.transpose(2, 0, 3, 1)[:, None] for x in (kf, kt)]
    vb = [x.transpose(2, 0, 1, 3)[:, None] for x in (vf, vt)]
    t_ids, t_of = np.unique(p // tq, return_inverse=True)
    nt = len(t_ids)
    qt = np.zeros((nt, tq, hkv, g, hd), np.float32)
    qt[t_of, p % tq] = qa.reshape(n, hkv, g, hd)
    qt = np.ascontiguousarray(qt.transpose(2, 0, 1, 3, 4)).reshape(hkv, nt, 1, r, hd)
    # tiles from ts[b] on reach block b (t_ids ascend): the blocks past a tile's last position
    # (all masked) are skipped, their scores -inf and partials zero
    ts = np.searchsorted(t_ids * tq + tq - 1, lo + j0 + np.arange(nb) * bk)
    pos = np.repeat(t_ids[:, None] * tq + np.arange(tq)[None, :], g, axis=1)[:, None, :, None]  # [nt, 1, R, 1]
    jj = (lo + j0 + np.arange(nb * bk)).reshape(1, nb, 1, bk)  # [1, nb, 1, B]
    sk = None
    if sinks is not None:
        sk = np.tile(sinks.astype(np.float32).reshape(hkv, g), (1, tq)).reshape(hkv, 1, 1, r, 1)
    o = np.zeros((hkv, nt, r, hd), np.float32)
    step = max(1, ATTN_CHUNK // (hkv * r * nb * bk))  # tiles per step: the temporaries stay in cache
    with cpu_quants.blas_single_thread():  # one thread: the same bits under any BLAS thread count
        for c0 in range(0, nt, step):
            c1 = min(nt, c0 + step)
            _attend_step(qt[:, c0:c1, 0], kb, vb, np.maximum(ts[ts < c1] - c0, 0), pos[c0:c1], jj, scale,
                         window, sk, o[:, c0:c1])
    o = o.reshape(hkv, nt, tq, g, hd)[:, t_of, p % tq]  # [hkv, n, g, hd]
    return o.transpose(1, 0, 2, 3).reshape(n, n_head * hd)


def _attend_step(qt, kb, vb, ts, pos, jj, scale, window, sk, o):
    """One step of :func:`_attend_tiles` over ``nt`` query tiles and the first ``nb = len(ts)`` key
    blocks: ``qt`` float32 [hkv, nt, R, hd]; ``kb`` / ``vb`` the whole blocks float32 [hkv, 1,
    nfull, hd, B] / [.., B, hd] and the zero-padded last one [hkv, 1, 1, ..] (a pair, one core stride),
    block ``b`` reaching tiles ``ts[b]..`` (ascending), ``pos`` int [nt, 1, R, 1] and ``jj`` int [1,
    >= nb, 1, B] the rows' and columns' positions, ``sk`` float32 [hkv, 1, 1, R, 1] or None; writes
    ``o`` float32 [hkv, nt, R, hd] (zeros on entry)."""
    hkv, nt, r, _ = qt.shape
    nb, bk = len(ts), kb[0].shape[-1]
    nfull = kb[0].shape[2]
    nf = min(int(np.searchsorted(ts, 0, side="right")), nfull)  # whole blocks every tile reaches

    def block(x: list[np.ndarray], b: int) -> np.ndarray:
        return x[0][:, :, b] if b < nfull else x[1][:, :, 0]

    s = np.full((hkv, nt, nb, r, bk), -np.inf, np.float32)
    if nf:  # one call for them (one sgemm per stacked item)
        np.matmul(qt[:, :, None], kb[0][:, :, :nf], out=s[:, :, :nf])
    for b in range(nf, nb):
        np.matmul(qt[:, ts[b]:], block(kb, b), out=s[:, ts[b]:, b])  # [hkv, nt', R, B]
    s *= np.float32(scale)
    jj = jj[:, :nb]
    mask = jj > pos  # [nt, nb, R, B]
    if window > 0:  # llama.cpp's standard SWA: masked when p - j >= window
        mask |= jj <= pos - window
    s[:, mask] = np.float32(-np.inf)
    m = s.max(axis=(2, 4), keepdims=True)  # [hkv, nt, 1, R, 1]: exact in any order
    if sk is not None:  # ggml_soft_max_add_sinks: the sink joins the max and the denominator
        m = np.maximum(m, sk)
    m[~np.isfinite(m)] = 0  # tile rows of absent positions before lo: all masked
    s -= m
    np.exp(s, out=s)
    bsum = np.ascontiguousarray(s.sum(axis=4).transpose(0, 1, 3, 2))  # [hkv, nt, R, nb]: B values each
    den = np.cumsum(bsum, axis=-1)[..., -1].reshape(hkv, nt, 1, r, 1)  # the blocks in order
    if sk is not None:
        den += np.exp(sk - m)
    den[den == 0] = 1  # those all-masked rows
    s /= den
    # the partials added in block order (0 + x is x)
    if nf:
        part = np.matmul(s[:, :, :nf], vb[0][:, :, :nf])  # [hkv, nt, nf, R, hd]
        for b in range(nf):
            o += part[:, :, b]
    for b in range(nf, nb):
        o[:, ts[b]:] += np.matmul(s[:, ts[b]:, b], block(vb, b))  # [hkv, nt', R, hd]


class CpuDevice(CpuMoeOps, CpuRecurrentOps, CpuVisionOps, Device):
    """The numpy device. Tensors are numpy arrays; ops run synchronously (the mixture-of-experts
    ops are :class:`~.moe.CpuMoeOps`, the recurrent ones :class:`~.recurrent.CpuRecurrentOps`, the vision
    ones :class:`~.vision.CpuVisionOps`)."""

    def __init__(self, info: DeviceInfo, cache_budget: int | None = None):
        super().__init__(info)
        self.cache_budget = default_cache_budget() if cache_budget is None else cache_budget
        self.cache_bytes = 0
        self._pending: list[weakref.ref[DeviceTensor]] = []  # quantized weights not converted yet
        self._lock = threading.RLock()  # cache_bytes and the claims of weights being converted (RLock: finalizers)
        self._converter: threading.Thread | None = None
        self._stop = threading.Event()
        self._first_pass = threading.Event()  # every pending weight streamed once: convert now
        self._stream_goal = 0

    # -- memory -----------------------------------------------------------
    def _upload(self, arr, ggml_type, shape, nbytes):
        if ggml_type == T.F32:
            handle = arr.view(np.float32).reshape(shape)
        else:  # raw blocks, one row of bytes per weight row
            handle = arr.view(np.uint8).reshape(int(np.prod(shape[:-1])), -1)
        self._count_alloc(0)  # weights are views of the mapped file: no copy
        t = DeviceTensor(self, handle, shape, ggml_type)
        if ggml_type != T.F32 and len(shape) == 2:
            self._pending.append(weakref.ref(t))
        return t

    def _empty(self, shape, ggml_type):
        if ggml_type is not T.F32 and ggml_type is not T.I32:  # a KV cache: rows of GGML bytes, zeroed
            arr = np.zeros((shape[0], row_bytes(ggml_type, shape[1])), dtype=np.uint8)
            self._count_alloc(arr.nbytes)
            return DeviceTensor(self, arr, shape, ggml_type)
        dtype = np.int32 if ggml_type == T.I32 else np.float32
        arr = np.empty(shape, dtype=dtype)
        self._count_alloc(arr.nbytes)
        return DeviceTensor(self, arr, shape, ggml_type)

    def _write(self, t, data):
        self._a(t)[...] = data.reshape(t.shape)

    def _read(self, t):
        return np.array(self._a(t), copy=True)

    def synchronize(self) -> None:
        """Ops run when called; this converts the uploaded weights to the float32 cache now (the
        background job the first matmul would start, module doc) and waits for it, so that what
        follows runs at the cached speed (benchmarks)."""
        if self._pending:
            self._start_conversion()
        self.wait_converted()

    @staticmethod
    def _a(t: DeviceTensor) -> np.ndarray:
        """The numpy view of an activation tensor (honouring ``head`` views)."""
        return t.handle[: t.shape[0]] if t.handle.shape[0] != t.shape[0] else t.handle

    def weight_f32(self, w: DeviceTensor) -> np.ndarray:
        """float32 [n_out, n_in] of a weight, cached within the budget (module doc); a weight past
        the budget is dequantized whole for this call (``matmul`` streams it instead).

        The cached copy lives on the weight (``extra``: the array and the finalizer that
        takes its bytes off ``cache_bytes``), so it goes when the weight is released or
        garbage collected, whichever comes first.
        """
        if w.ggml_type == T.F32:
            return w.handle
        f = self._convert(w)
        return f if f is not None else cpu_quants.dequantize(w.handle, w.ggml_type, w.shape)

    def _cached_f32(self, w: DeviceTensor) -> np.ndarray | None:
        """The cached float32 copy of ``w``, or None (then the caller streams it): while the
        background conversion runs, or when ``w`` does not fit the budget."""
        if w.ggml_type == T.F32:
            return w.handle
        extra = w.extra
        if isinstance(extra, tuple):
            return extra[0]
        if self._pending:
            self._start_conversion()
        if self._converter is not None and self._converter.is_alive():
            return None
        return self._convert(w)

    def _convert(self, w: DeviceTensor, progress=None, threads: bool = True) -> np.ndarray | None:
        """Dequantize ``w`` into the cache if it fits the budget and no other thread is at it;
        None otherwise."""
        nbytes = 4 * int(np.prod(w.shape))
        with self._lock:
            if isinstance(w.extra, tuple):
                return w.extra[0]
            if w.extra is not None or self.cache_bytes + nbytes > self.cache_budget:
                return None  # being converted by the other thread, or past the budget
            w.extra = _CONVERTING
            self.cache_bytes += nbytes
        try:
            f = cpu_quants.dequantize(w.handle, w.ggml_type, w.shape, progress=progress, threads=threads)
        except BaseException:
            with self._lock:
                self.cache_bytes -= nbytes
                w.extra = None
            raise
        with self._lock:
            if w.device is not self:  # released meanwhile
                self.cache_bytes -= nbytes
                return f
            w.extra = (f, weakref.finalize(w, self._uncache, nbytes))
        return f

    def _start_conversion(self) -> None:
        """Start converting every uploaded weight that fits the budget on a background thread
        (module doc); the weights uploaded since the last start."""
        refs, self._pending = self._pending, []
        if self.cache_budget <= self.cache_bytes:
            return
        prev = self._converter
        self._stop.clear()
        self._first_pass.clear()
        self._stream_goal = len(refs)
        self._converter = threading.Thread(target=self._convert_all, args=(refs, prev), daemon=True,
                                           name="cooktop-numpy-convert")
        self._converter.start()

    def _convert_all(self, refs: list[weakref.ref[DeviceTensor]], prev: threading.Thread | None) -> None:
        """The background conversion: one weight after the other on this one thread (the
        dequantization pool stays with the forward pass, which streams what is not converted)."""
        if prev is not None:
            prev.join()
        self._first_pass.wait(CONVERT_AFTER_S)  # the first answer first (module doc)
        todo, room = [], self.cache_budget - self.cache_bytes
        for ref in refs:
            t = ref()
            if t is not None and t.device is self and t.extra is None and 4 * int(np.prod(t.shape)) <= room:
                todo.append(ref)
                room -= 4 * int(np.prod(t.shape))
        total = sum(int(np.prod(t.shape)) for t in (r() for r in todo) if t is not None)
        if not total:
            return
        with notices.progress(total, "dequantizing weights to float32 (numpy)", unit="value") as bar:
            for ref in todo:
                t = ref()
                if self._stop.is_set():
                    return
                if t is not None and t.device is self:
                    self._convert(t, progress=bar.update, threads=False)
                del t

    def wait_converted(self) -> None:
        """Wait for the background conversion (tests, benchmarks that want the cached speed)."""
        self._first_pass.set()
        c = self._converter
        if c is not None:
            c.join()

    def close(self) -> None:
        """Stop the background conversion (the weights already converted stay until released)."""
        self._stop.set()
        self._first_pass.set()
        self.wait_converted()

    @staticmethod
    def _blocked_matmul(out: np.ndarray, x: np.ndarray, n_out: int, n_in: int,
                        block: Callable[[int, int], np.ndarray]) -> None:
        """``out = x @ w^T`` (``x: float32 [n_tokens, n_in]``, ``w: [n_out, n_in]``) in the fixed
        row blocks of :func:`~.cpu_quants.blocked_matmuls` (the same bits streamed or cached, under
        any thread count)."""
        cpu_quants.blocked_matmuls([(out, x, n_out, n_in, block)])

    def _streamed_matmul(self, out: np.ndarray, x: np.ndarray, w: DeviceTensor) -> None:
        """``out = x @ w^T`` for a weight not in the cache: blocks of rows dequantized into a
        per-thread scratch that stays in cache (:meth:`_blocked_matmul`)."""
        n_out, n_in = w.shape
        raw = w.handle.reshape(n_out, -1)

        def block(r0: int, r1: int) -> np.ndarray:
            blk = cpu_quants.scratch_f32((r1 - r0) * n_in).reshape(r1 - r0, n_in)
            cpu_quants.dequantize_rows(raw[r0:r1], w.ggml_type, n_in, blk)
            return blk

        self._blocked_matmul(out, x, n_out, n_in, block)

    def _uncache(self, nbytes: int) -> None:
        with self._lock:
            self.cache_bytes -= nbytes

    def _release(self, tensors):
        """Drop the cached float32 copies of these weights (the arrays go with their last reference)."""
        for t in tensors:
            if isinstance(t.extra, tuple):
                t.extra[1]()
                t.extra = None

    # -- ops --------------------------------------------------------------
    def _matmul(self, out, x, w):
        f = self._cached_f32(w)
        if f is None:
            self._streamed_matmul(self._a(out), self._a(x), w)
            self._stream_goal -= 1
            if self._stream_goal <= 0:
                self._first_pass.set()
        else:
            self._blocked_matmul(self._a(out), self._a(x), f.shape[0], f.shape[1], lambda r0, r1: f[r0:r1])

    def _rmsnorm(self, out, x, w, eps):
        wa = self._a(w)
        xa = self._a(x).reshape(-1, wa.shape[0])  # groups of g values (g = the row width: one per row)
        ms = np.mean(xa * xa, axis=-1, keepdims=True, dtype=np.float32)
        o = self._a(out)
        np.multiply(xa * (1.0 / np.sqrt(ms + np.float32(eps))), wa, out=o.reshape(xa.shape))

    def _rope(self, out, x, pos, head_dim, n_rot, freq_base, freq_scale, mode, freq_factors,
              ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig):
        xa = self._a(x)
        n = xa.shape[0]
        v = xa.reshape(n, -1, head_dim)
        p = self._a(pos).astype(np.float64)
        half = n_rot // 2
        inv = float(freq_base) ** (-2.0 * np.arange(half) / n_rot)
        if freq_factors is not None:
            inv = inv / self._a(freq_factors)[:half].astype(np.float64)
        t_extrap = p[:, None] * inv[None, :]  # [n, half]
        theta = float(freq_scale) * t_extrap
        lo, hi, mscale = rope_yarn_params(n_rot, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
                                          beta_slow, n_ctx_orig)
        if ext_factor != 0.0:  # YaRN (ggml rope_yarn): mix in the extrapolated angle along the ramp
            y = (np.arange(half) - lo) / max(0.001, hi - lo)
            ramp = (1.0 - np.clip(y, 0.0, 1.0)) * float(ext_factor)
            theta = theta * (1.0 - ramp) + t_extrap * ramp
        cos = (np.cos(theta) * mscale)[:, None, :].astype(np.float32)
        sin = (np.sin(theta) * mscale)[:, None, :].astype(np.float32)
        if mode == ROPE_NEOX:
            a, b = v[..., :half], v[..., half:n_rot]
        else:
            a, b = v[..., 0:n_rot:2], v[..., 1:n_rot:2]
        ra = a * cos - b * sin
        rb = a * sin + b * cos
        o = self._a(out).reshape(n, -1, head_dim)
        if n_rot < head_dim:  # dimensions past n_rot pass through
            o[..., n_rot:] = v[..., n_rot:]
        if mode == ROPE_NEOX:
            o[..., :half], o[..., half:n_rot] = ra, rb
        else:
            o[..., 0:n_rot:2], o[..., 1:n_rot:2] = ra, rb

    def _kv_store(self, cache, x, pos):
        cache.handle[self._a(pos)] = quantize_kv(self._a(x), cache.ggml_type)

    @staticmethod
    def _kv_rows(cache: DeviceTensor, lo: int, n: int) -> np.ndarray:
        """Cache rows ``lo .. lo + n - 1`` as float32 [n, n_kv_dim] (a view for F32; else the rows
        dequantized, as ggml's CPU attention converts the rows it reads)."""
        if cache.ggml_type is T.F32:
            return cache.handle[lo:lo + n]
        out = np.empty((n, cache.shape[1]), dtype=np.float32)
        cpu_quants.dequantize_rows(cache.handle[lo:lo + n], cache.ggml_type, cache.shape[1], out)
        return out

    def _attention_sinks(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, sinks,
                         flash=True):
        self._attention(out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window, kv_start, flash, sinks)

    def _attention(self, out, q, k_cache, v_cache, pos, n_head, n_head_kv, scale, window=0, kv_start=None,
                   flash=True, sinks=None):
        # one path for flash on and off: the scores materialised (the plain reference)
        p = self._a(pos)
        kc, vc = k_cache, v_cache
        sk = None if sinks is None else self._a(sinks)
        if kv_start is None:
            self._attend(self._a(out), self._a(q), kc, vc, p, 0, n_head, n_head_kv, scale, window, sk)
            return
        # rows of one sequence share a kv_start: one dense product per sequence's rows
        st = self._a(kv_start)
        qa, oa = self._a(q), self._a(out)
        for s0 in np.unique(st):
            rows = np.flatnonzero(st == s0)
            if len(rows) == len(st):
                self._attend(oa, qa, kc, vc, p, int(s0), n_head, n_head_kv, scale, window, sk)
            else:
                o = np.empty((len(rows), oa.shape[1]), dtype=np.float32)
                self._attend(o, qa[rows], kc, vc, p[rows], int(s0), n_head, n_head_kv, scale, window, sk)
                oa[rows] = o

    @staticmethod
    def _attend(oa, qa, kc, vc, p, lo, n_head, n_head_kv, scale, window, sinks=None):
        """Rows ``qa`` attend to cache rows ``lo..p[i]`` (and the window); writes ``oa``. ``sinks``
        (float32 [n_head] or None): one more logit per head in each softmax denominator.

        A token's output is the same bits in a prompt, alone, or after a cached prefix
        (:func:`_attend_tiles`: fixed-shape BLAS products at positions fixed by the token's own
        position). Plain BLAS products do not promise that: OpenBLAS rounds a row of q k^T otherwise
        as the cache grows by a column. Rows at the same position (several sequences from one
        ``lo``) go to separate calls."""
        n_kv = max(int(p.max()) + 1 - lo, 1)
        kc, vc = CpuDevice._kv_rows(kc, lo, n_kv), CpuDevice._kv_rows(vc, lo, n_kv)
        order = np.argsort(p, kind="stable")
        ps = p[order]
        rank = np.zeros(len(p), np.int64)  # how many earlier rows share a row's position
        same = np.flatnonzero(ps[1:] == ps[:-1]) + 1
        for i in same:
            rank[i] = rank[i - 1] + 1
        for k in range(int(rank.max()) + 1 if len(rank) else 0):
            rows = order[rank == k]
            oa[rows] = _attend_tiles(qa[rows], kc, vc, p[rows], lo, n_head, n_head_kv, scale, window, sinks)

    def _silu_mul(self, out, gate, up):
        ga = self._a(gate)
        np.multiply(ga / (1.0 + np.exp(-ga)), self._a(up), out=self._a(out))

    def _gelu_mul(self, out, gate, up):
        g = self._a(gate)
        c = np.float32(0.7978845608028654)  # sqrt(2 / pi), ggml's SQRT_2_OVER_PI
        t = np.tanh(c * g * (np.float32(1.0) + np.float32(0.044715) * g * g))
        np.multiply(np.float32(0.5) * g * (np.float32(1.0) + t), self._a(up), out=self._a(out))

    def _add(self, out, a, b):
        np.add(self._a(a), self._a(b), out=self._a(out))

    def _add_bias(self, out, x, b):
        np.add(self._a(x), self._a(b), out=self._a(out))

    def _get_rows(self, out, table, ids):
        rows = table.handle[self._a(ids)]
        cpu_quants.dequantize(rows, table.ggml_type, (len(rows), table.shape[-1]), out=self._a(out))

    def _copy(self, out, x):
        np.copyto(self._a(out), self._a(x))

    def _copy_rows(self, t, src_row, dst_row, n_rows):
        """numpy slicing of the rows (:meth:`Device.copy_rows <cooktop.backends.base.Device.copy_rows>`;
        a KV cache of GGML rows is a uint8 [rows, row bytes] array)."""
        t.handle[dst_row:dst_row + n_rows] = t.handle[src_row:src_row + n_rows]

    def _copy_rect(self, dst, dst_row, dst_col, src, src_row, src_col, n_rows, n_cols):
        """numpy slicing (:meth:`Device._copy_rect <cooktop.backends.base.Device._copy_rect>`)."""
        self._a(dst)[dst_row:dst_row + n_rows, dst_col:dst_col + n_cols] = \
            self._a(src)[src_row:src_row + n_rows, src_col:src_col + n_cols]


def cpu_info() -> DeviceInfo:
    """DeviceInfo of the numpy device (host memory, core count)."""
    import platform
    cpu_name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = _physical_memory()
    return DeviceInfo(
        backend="cpu", index=0, name=cpu_name, vendor="numpy " + np.__version__, device_type="cpu",
        platform="numpy", driver_version=np.__version__, global_mem_bytes=mem, max_alloc_bytes=mem,
        compute_units=os.cpu_count(), fp16=True, int8=False,
        types=tuple(type_name(t) for t in CPU_TYPES), ops=OPS + MOE_OPS + RECURRENT_OPS + VISION_OPS,
        kv_types=tuple(type_name(t) for t in KV_TYPES))


class CpuBackend(Backend):
    """The numpy backend family: always available, one device."""

    name = "cpu"

    def probe(self) -> ProbeResult:
        return ProbeResult("cpu", True, [cpu_info()])

    def open(self, index: int = 0) -> CpuDevice:
        return CpuDevice(cpu_info())
