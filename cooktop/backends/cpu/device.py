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
    ROPE_NEOX,
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


#: Values of the temporaries of :func:`_scores` / :func:`_weighted_sum` per step (1 MiB of float32).
ATTN_CHUNK = 1 << 18
#: Cache positions per partial sum of :func:`_weighted_sum` (aligned at the first position read).
ATTN_KV_BLOCK = 64


def _scores(qt: np.ndarray, kt: np.ndarray) -> np.ndarray:
    """float32 [h, r, j] = sum over d of qt[h, d, r] * kt[h, d, j], summed in d order (one multiply,
    one add per d, vectorized over r and j), in blocks of rows that keep the temporaries in cache:
    each value depends on its own q row and k column only."""
    h, hd, r = qt.shape
    nj = kt.shape[2]
    s = np.empty((h, r, nj), np.float32)
    step = max(1, ATTN_CHUNK // max(1, h * nj))
    tmp = np.empty((h, min(step, r), nj), np.float32)
    for r0 in range(0, r, step):
        r1 = min(r, r0 + step)
        sv, t = s[:, r0:r1], tmp[:, :r1 - r0]
        np.multiply(qt[:, 0, r0:r1, None], kt[:, None, 0, :], out=sv)
        for d in range(1, hd):
            np.multiply(qt[:, d, r0:r1, None], kt[:, None, d, :], out=t)
            sv += t
    return s


def _row_sums(s: np.ndarray) -> np.ndarray:
    """Sums over the last axis in index order (keepdims): trailing zeros (masked positions) leave a
    row's sum as it is, which numpy's pairwise ``sum`` does not promise."""
    return np.cumsum(s, axis=-1)[..., -1:]


def _weighted_sum(pr: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float32 [h, r, hd] = sum over j of pr[h, r, j] * v[h, j, :]: partial sums over blocks of
    :data:`ATTN_KV_BLOCK` positions (in j order within a block), added block after block, so
    positions past a row's own (zero weights) change none of its bits however many are read."""
    h, r, nj = pr.shape
    hd = v.shape[2]
    o = np.zeros((h, r, hd), np.float32)
    step = max(1, ATTN_CHUNK // max(1, h * ATTN_KV_BLOCK * hd))
    for j0 in range(0, nj, ATTN_KV_BLOCK):
        j1 = min(nj, j0 + ATTN_KV_BLOCK)
        for r0 in range(0, r, step):
            r1 = min(r, r0 + step)
            # a reduction over a middle axis adds its slices in order (numpy is pairwise only
            # along the innermost axis)
            o[:, r0:r1] += (pr[:, r0:r1, j0:j1, None] * v[:, None, j0:j1, :]).sum(axis=2)
    return o


class CpuDevice(CpuMoeOps, Device):
    """The numpy device. Tensors are numpy arrays; ops run synchronously (the mixture-of-experts
    ops are :class:`~.moe.CpuMoeOps`)."""

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

        Every sum runs in a fixed order that depends on neither the number of query rows nor the
        number of cache rows read (:func:`_scores`, :func:`_weighted_sum`, a sequential softmax
        denominator; the masked positions past a row's own are exact zeros), so a token's output is
        the same bits in a prompt, alone, or after a cached prefix. BLAS products do not promise
        that: OpenBLAS rounds a row of q k^T otherwise as the cache grows by a column."""
        n = qa.shape[0]
        hd = qa.shape[1] // n_head
        g = n_head // n_head_kv
        n_kv = max(int(p.max()) + 1 - lo, 1)
        kc, vc = CpuDevice._kv_rows(kc, lo, n_kv), CpuDevice._kv_rows(vc, lo, n_kv)
        kt = np.ascontiguousarray(kc.reshape(n_kv, n_head_kv, hd).transpose(1, 2, 0))  # [hkv, hd, n_kv]
        v = np.ascontiguousarray(vc.reshape(n_kv, n_head_kv, hd).transpose(1, 0, 2))  # [hkv, n_kv, hd]
        qt = np.ascontiguousarray(qa.reshape(n, n_head_kv, g, hd).transpose(1, 3, 0, 2)).reshape(n_head_kv, hd, n * g)
        s = _scores(qt, kt)  # [hkv, n*g, n_kv]
        s *= np.float32(scale)
        s = s.reshape(n_head_kv, n, g, n_kv)
        j = lo + np.arange(n_kv)[None, :]
        mask = j > p[:, None]  # [n, n_kv]
        if window > 0:  # llama.cpp's standard SWA: masked when p - j >= window
            mask |= j <= p[:, None] - window
        s += np.where(mask, np.float32(-np.inf), np.float32(0))[None, :, None, :]
        if sinks is None:
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= _row_sums(s)
        else:  # ggml_soft_max_add_sinks: the sink joins the max and the denominator
            sk = sinks.astype(np.float32).reshape(n_head_kv, 1, g, 1)
            m = np.maximum(s.max(axis=-1, keepdims=True), sk)
            s -= m
            np.exp(s, out=s)
            s /= _row_sums(s) + np.exp(sk - m)
        o = _weighted_sum(s.reshape(n_head_kv, n * g, n_kv), v)  # [hkv, n*g, hd]
        oa[...] = o.reshape(n_head_kv, n, g, hd).transpose(1, 0, 2, 3).reshape(n, n_head * hd)

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
        types=tuple(type_name(t) for t in CPU_TYPES), ops=OPS + MOE_OPS,
        kv_types=tuple(type_name(t) for t in KV_TYPES))


class CpuBackend(Backend):
    """The numpy backend family: always available, one device."""

    name = "cpu"

    def probe(self) -> ProbeResult:
        return ProbeResult("cpu", True, [cpu_info()])

    def open(self, index: int = 0) -> CpuDevice:
        return CpuDevice(cpu_info())
