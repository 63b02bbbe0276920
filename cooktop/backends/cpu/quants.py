"""Fast whole-tensor dequantization for the numpy backend, in row chunks that stay in cache.

Same values as :func:`cooktop.format.quants.dequantize` (``gguf.quants``, the
reference; tests/test_cpu_quants.py checks equality bit for bit) for the common
types, written as a few in-place numpy passes over chunks of about
:data:`CHUNK_VALUES` values (temporaries stay in L2), split over a small thread
pool (numpy releases the GIL inside its loops). On a 2-core Xeon (PoCL dev box)
this is 2.5x ``gguf.quants`` per core for Q4_0. Other types fall back to the
reference.

Block layouts and formulas: ggml-common.h and ggml-quants.c ``dequantize_row_*``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import mmap
import threading
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from ... import settings
from ...format.quants import dequantize as reference_dequantize
from ...format.quants import row_bytes

#: Values per chunk handed to one thread (about 1 MiB of float32 output).
CHUNK_VALUES = 1 << 18

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> int:
    return settings.dequant_threads()


def _get_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    global _pool
    n = _threads()
    if n == 1:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="cooktop-dequant")
    return _pool


#: Linux's MADV_POPULATE_WRITE (5.14+; Python's mmap module does not name it before 3.13?).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def empty_f32(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialized float32 array of ``shape``; large ones in their own anonymous mapping
    advised MADV_HUGEPAGE and populated in one call (MADV_POPULATE_WRITE), so the memory comes
    in 2 MiB pages without a fault per page (dev VM, 1 GiB: 0.16 s of system time against 0.62 s
    touched page by page and 1.85 s through numpy's allocator). The mapping is freed with the array."""
    n = int(np.prod(shape, dtype=np.int64))
    if n * 4 < (8 << 20) or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, np.float32)
    m = mmap.mmap(-1, n * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for advice in (mmap.MADV_HUGEPAGE, MADV_POPULATE_WRITE):
        try:
            m.madvise(advice)
        except OSError:  # kernels without THP, or older than 5.14 (no MADV_POPULATE_WRITE)
            pass
    return np.frombuffer(m, np.float32, n).reshape(shape)


_tls = threading.local()


def scratch_f32(n: int) -> np.ndarray:
    """A float32 scratch array of ``n`` values reused by this thread."""
    buf = getattr(_tls, "f32", None)
    if buf is None or buf.size < n:
        buf = _tls.f32 = np.empty(n, np.float32)
    return buf[:n]


def parallel(fn: Callable[[int], None], items: range) -> None:
    """``fn(i)`` for every ``i`` of ``items`` on the thread pool (in this thread when one is enough)."""
    pool = _get_pool() if len(items) > 1 else None
    if pool is None:
        for i in items:
            fn(i)
    else:
        list(pool.map(fn, items))


_blas_ctl = None

#: Fewest token rows a weight product runs with (fewer are padded with zero rows): OpenBLAS
#: (0.3.23, SkylakeX) rounds one token (gemv), two or three, and products of m * n * k <= 100^3
#: (:data:`SMALL_MNK`, its small-matrix kernels) otherwise than its gemm, whose rows past that
#: do not depend on how many there are (measured on an AVX-512 Xeon: 4..511 rows, k 2048 / 5632).
MIN_ROWS = 4
#: OpenBLAS's small-matrix bound on m * n * k (interface/gemm.c, ``*_small_kernel_permit``).
SMALL_MNK = 100 ** 3
#: Token-row layouts :func:`row_layout` tries, cheapest first: ``(0, 0)`` is one product of all the
#: token rows (at least :func:`_padded_rows`); ``(group, rows)`` splits the tokens into groups of
#: ``group``, each the first rows of a product of ``rows`` rows (zeros past them), one sgemm each.
LAYOUTS = ((0, 0), (16, 16), (8, 16))

log = logging.getLogger("cooktop")

_layout: tuple[int, int] | None = None


def row_layout() -> tuple[int, int]:
    """How this machine's BLAS gives a token's row of ``w_block @ x^T`` the same bits whatever the
    other rows are (alone, in a prompt, after a cached prefix): the cheapest of :data:`LAYOUTS` that
    does, measured once per process (one BLAS thread, 40 tokens against their prefixes and each
    token alone, a 1024 x 1024 and a 64 x 64 weight; about 0.1 s).

    OpenBLAS's SkylakeX sgemm gives every row the same bits from 4 rows on: ``(0, 0)``. Its Haswell
    kernels, which it takes on AMD Zen CPUs without AVX-512, round a row by where it falls in the
    tiles the product is cut into, which depends on how many rows there are; products of exactly 16
    rows do not: ``(16, 16)`` (measured on a 2-core EPYC VM, OpenBLAS 0.3.23 "Zen": a 5632 x 2048
    weight 1.3x the time of ``(0, 0)`` for one token, 1.6-2.1x for 64 and 512). When none does
    (logged), ``(0, 0)``."""
    global _layout
    if _layout is None:
        rng = np.random.default_rng(0)
        _layout = LAYOUTS[0]
        with blas_single_thread():
            for lay in LAYOUTS:
                if all(_layout_holds(lay, rng.standard_normal((n, n)).astype(np.float32),
                                     rng.standard_normal((40, n)).astype(np.float32)) for n in (1024, 64)):
                    _layout = lay
                    break
            else:
                log.warning("no token-row layout gives numpy's matmuls the same bits for a token alone and in "
                            "a batch with this BLAS (%s); numpy's logits may differ in the last bits between "
                            "a prompt and its tokens one at a time", LAYOUTS)
    return _layout


def _layout_holds(lay: tuple[int, int], w: np.ndarray, x: np.ndarray) -> bool:
    ref = _product(w, x, lay)
    return (all(np.array_equal(_product(w, x[:m], lay), ref[:, :m]) for m in range(1, len(x)))
            and all(np.array_equal(_product(w, x[j:j + 1], lay)[:, 0], ref[:, j]) for j in range(len(x))))


def _product(w: np.ndarray, x: np.ndarray, lay: tuple[int, int]) -> np.ndarray:
    """``w @ x^T`` (``w: float32 [rows, n_in]``, ``x: float32 [n, n_in]``) -> float32 [rows, n] in
    the token-row layout ``lay`` (:data:`LAYOUTS`)."""
    n, n_in = x.shape
    group, rows = lay
    if group == 0:
        m = _padded_rows(n, w.shape[0], n_in)
        if m == n:
            return np.matmul(w, x.T)
        xp = np.zeros((m, n_in), np.float32)
        xp[:n] = x
        return np.matmul(w, xp.T)[:, :n]
    y = np.empty((w.shape[0], n), np.float32)
    xp = np.zeros((rows, n_in), np.float32)
    for t0 in range(0, n, group):  # one 2-D sgemm per group (a stacked matmul of one group differs)
        t1 = min(n, t0 + group)
        xp[:t1 - t0] = x[t0:t1]
        xp[t1 - t0:group] = 0
        y[:, t0:t1] = np.matmul(w, xp.T)[:, :t1 - t0]
    return y


def blocked_matmuls(products: list[tuple[np.ndarray, np.ndarray, int, int, Callable[[int, int], np.ndarray]]]) -> None:
    """``out = x @ w^T`` for each ``(out, x, n_out, n_in, block)`` of ``products`` (``x: float32
    [n_tokens, n_in]``, ``w: [n_out, n_in]``, ``out: float32 [n_tokens, n_out]``, may be a column
    view), in blocks of ``CHUNK_VALUES // n_in`` rows: ``block(r0, r1)`` gives rows r0..r1 of w as
    float32 (called on a pool thread: it may dequantize into :func:`scratch_f32`), each block
    multiplied by a one-thread BLAS product, every block of every product spread over the pool.

    Every weight takes these blocks, streamed, cached or an expert of a ``matmul_id``, so a weight
    gives the same bits before and after its conversion to the cache and under any thread count: a
    BLAS product's rounding depends on its shape and, multi-threaded, on its thread count
    (OpenBLAS's Haswell kernels on an AVX-512 EPYC), so one whole-matrix product would give other
    logits than its blocks. Each block's product runs as ``w_block @ x^T`` in this machine's token-row
    layout (:func:`row_layout`: at least :func:`_padded_rows` token rows, zero rows added and their
    results dropped; in groups of 8 where the BLAS needs it), so that a token's row of
    ``out`` is the same bits whether it came alone, in a prompt, or after a cached prefix: OpenBLAS's
    gemv and small-matrix kernels round otherwise than its gemm (a 1.1B model's last logits 2e-4 apart
    between a prompt and its prefix then tail before; one token costs ~1.6x a gemv, 4 rows at
    5632 x 2048, and a prompt's product is ~1.5x faster in this orientation)."""
    jobs = []
    for i, (_out, _x, n_out, n_in, _) in enumerate(products):
        step = max(1, CHUNK_VALUES // n_in)
        jobs += [(i, r0) for r0 in range(0, n_out, step)]
    lay = row_layout()

    def run(q: int) -> None:
        i, r0 = jobs[q]
        out, x, n_out, n_in, block = products[i]
        r1 = min(n_out, r0 + max(1, CHUNK_VALUES // n_in))
        w = block(r0, r1)
        if lay == (0, 0) and _padded_rows(x.shape[0], r1 - r0, n_in) == x.shape[0]:
            np.matmul(w, x.T, out=out[:, r0:r1].T)
        else:
            out[:, r0:r1] = _product(w, x, lay).T

    with blas_single_thread():
        parallel(run, range(len(jobs)))


def _padded_rows(n_tokens: int, n_rows: int, n_in: int) -> int:
    """Token rows a product of ``n_tokens`` rows with a weight block of ``n_rows`` x ``n_in`` runs
    with in layout ``(0, 0)`` (the rows past ``n_tokens`` are zero): at least :data:`MIN_ROWS`, and
    more where the product would be within OpenBLAS's small-matrix size (m * n * k <= :data:`SMALL_MNK`)."""
    return max(n_tokens, MIN_ROWS, SMALL_MNK // max(1, n_rows * n_in) + 1)


def blas_single_thread():
    """Context manager limiting BLAS (OpenBLAS/MKL under numpy) to one thread, for BLAS calls made
    from the pool's threads (threadpoolctl; a no-op context when it is missing)."""
    global _blas_ctl
    import contextlib

    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a core dependency
        return contextlib.nullcontext()
    if _blas_ctl is None:
        _blas_ctl = ThreadpoolController()
    return _blas_ctl.limit(limits=1, user_api="blas")


def _u8(shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 scratch array of ``shape`` reused by this thread (chunk temporaries: a fresh
    allocation per chunk costs page faults, which dominate in VMs)."""
    n = int(np.prod(shape))
    buf = getattr(_tls, "u8", None)
    if buf is None or buf.size < n:
        buf = _tls.u8 = np.empty(max(n, 1 << 16), np.uint8)
    return buf[:n].reshape(shape)


def _f16(b: np.ndarray, off: int) -> np.ndarray:
    """float32 [n, 1] of the fp16 field at byte ``off`` of each block row of ``b`` (uint8 [n, size])."""
    return np.ascontiguousarray(b[:, off:off + 2]).view(np.float16).astype(np.float32)


def _q8_0(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(b[:, 2:].view(np.int8), _f16(b, 0), out=out)


def _nibbles(qs: np.ndarray, q: np.ndarray) -> None:
    """Low nibbles of ``qs`` [n, 16] into q[:, :16], high nibbles into q[:, 16:]."""
    np.bitwise_and(qs, 15, out=q[:, :16])
    np.right_shift(qs, 4, out=q[:, 16:])


def _q4_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _u8((b.shape[0], 32))
    _nibbles(b[:, 2:], q)
    qi = q.view(np.int8)
    qi -= 8
    np.multiply(qi, _f16(b, 0), out=out)


def _q4_1(b: np.ndarray, out: np.ndarray) -> None:
    q = _u8((b.shape[0], 32))
    _nibbles(b[:, 4:], q)
    np.multiply(q, _f16(b, 0), out=out)
    out += _f16(b, 2)


def _q5(b: np.ndarray, out: np.ndarray, qh_off: int) -> np.ndarray:
    """5-bit quants of block_q5_0/q5_1 (qh at ``qh_off``, qs after it) as uint8 [n, 32]."""
    q = _u8((b.shape[0], 32))
    _nibbles(b[:, qh_off + 4:], q)
    bits = np.unpackbits(np.ascontiguousarray(b[:, qh_off:qh_off + 4]), axis=1, bitorder="little")
    bits <<= 4
    q |= bits
    return q


def _q5_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _q5(b, out, 2).view(np.int8)
    q -= 16
    np.multiply(q, _f16(b, 0), out=out)


def _q5_1(b: np.ndarray, out: np.ndarray) -> None:
    q = _q5(b, out, 4)
    np.multiply(q, _f16(b, 0), out=out)
    out += _f16(b, 2)


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for the 8 sub-blocks of Q4_K/Q5_K blocks: (d * sc, dmin * m), float32 [n, 8]."""
    s = b[:, 4:16]
    sc = np.empty((b.shape[0], 8), np.uint8)
    mn = np.empty((b.shape[0], 8), np.uint8)
    np.bitwise_and(s[:, 0:4], 63, out=sc[:, :4])
    np.bitwise_and(s[:, 4:8], 63, out=mn[:, :4])
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc * _f16(b, 0), mn * _f16(b, 2)


def _qk_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [n, 8, 32]: sub-block 2k = low nibbles of qs[32k:32k+32], 2k+1 = high nibbles."""
    n = qs.shape[0]
    q = _u8((n, 4, 2, 32))
    qs = qs.reshape(n, 4, 32)
    np.bitwise_and(qs, 15, out=q[:, :, 0])
    np.right_shift(qs, 4, out=q[:, :, 1])
    return q.reshape(n, 8, 32)


def _q4_k(b: np.ndarray, out: np.ndarray) -> None:
    dl, ml = _k_scales(b)
    o = out.reshape(-1, 8, 32)
    np.multiply(_qk_nibbles(b[:, 16:]), dl[:, :, None], out=o)
    o -= ml[:, :, None]


def _q5_k(b: np.ndarray, out: np.ndarray) -> None:
    dl, ml = _k_scales(b)
    q = _qk_nibbles(b[:, 48:])
    bits = np.unpackbits(b[:, 16:48, None], axis=2, bitorder="little")  # [n, 32, 8]: bit j of qh[l]
    q |= np.ascontiguousarray(bits.transpose(0, 2, 1)) << 4
    o = out.reshape(-1, 8, 32)
    np.multiply(q, dl[:, :, None], out=o)
    o -= ml[:, :, None]


def _q6_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    ql = b[:, :128].reshape(n, 2, 2, 32)      # [half, ql[0:32] / ql[32:64], l]
    qh = b[:, 128:192].reshape(n, 2, 1, 32)   # [half, -, l]
    q = _u8((n, 2, 4, 32))  # [half, group r, l]: value 128 h + 32 r + l
    np.bitwise_and(ql, 15, out=q[:, :, 0:2])
    np.right_shift(ql, 4, out=q[:, :, 2:4])
    sh = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q |= ((qh >> sh) & 3) << 4
    qi = q.view(np.int8)
    qi -= 32
    sc = b[:, 192:208].view(np.int8).astype(np.float32) * _f16(b, 208)  # [n, 16]: 16 values each
    np.multiply(qi.reshape(n, 16, 16), sc[:, :, None], out=out.reshape(n, 16, 16))


def _e8m0_half_table() -> np.ndarray:
    """float32 [256]: ``GGML_E8M0_TO_FP32_HALF(e)`` = 2^(e - 128) for every exponent byte (ggml-impl.h:
    the bits ``0x00200000 << e`` for e < 2, else ``(e - 1) << 23``)."""
    e = np.arange(256, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


_E8M0_HALF = _e8m0_half_table()
#: kvalues_mxfp4 (ggml-common.h): the E2M1 values, doubled, as float32.
_KV_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _mxfp4(b: np.ndarray, out: np.ndarray) -> None:
    q = _u8((b.shape[0], 32))
    _nibbles(b[:, 1:17], q)
    np.take(_KV_MXFP4, q, out=out)
    out *= _E8M0_HALF[b[:, 0]][:, None]


#: type -> (block values, block bytes, chunk kernel writing float32 [n_blocks, block values])
_KERNELS: dict[T, tuple[int, Callable[[np.ndarray, np.ndarray], None]]] = {
    T.Q8_0: (32, _q8_0), T.Q4_0: (32, _q4_0), T.Q4_1: (32, _q4_1), T.Q5_0: (32, _q5_0), T.Q5_1: (32, _q5_1),
    T.Q4_K: (256, _q4_k), T.Q5_K: (256, _q5_k), T.Q6_K: (256, _q6_k), T.MXFP4: (32, _mxfp4),
}

#: Types :func:`dequantize_rows` converts itself (others go to the gguf reference).
FAST_TYPES: tuple[T, ...] = tuple(_KERNELS) + (T.F16, T.BF16, T.F32)


def dequantize_rows(raw: np.ndarray, ggml_type: T, n_in: int, out: np.ndarray) -> None:
    """Dequantize whole rows into ``out`` (one thread; see :func:`dequantize`).

    Args:
        raw: uint8 [n_rows, row_bytes(n_in)] GGML blocks (any row-major view).
        out: float32 [n_rows, n_in], written.
    """
    ggml_type = T(ggml_type)
    rows = raw.shape[0]
    if ggml_type == T.F32:
        out[...] = raw.view(np.float32).reshape(rows, n_in)
    elif ggml_type == T.F16:
        out[...] = raw.view(np.float16).reshape(rows, n_in)
    elif ggml_type == T.BF16:
        out.view(np.uint32)[...] = raw.view(np.uint16).reshape(rows, n_in).astype(np.uint32) << 16
    elif ggml_type in _KERNELS:
        bv, fn = _KERNELS[ggml_type]
        blocks = np.ascontiguousarray(raw).reshape(rows * (n_in // bv), -1)
        fn(blocks, out.reshape(-1, bv))
    else:
        out[...] = reference_dequantize(np.ascontiguousarray(raw), ggml_type, (rows, n_in))


def dequantize(raw: np.ndarray, ggml_type: T, shape: tuple[int, ...], out: np.ndarray | None = None,
               progress: Callable[[int], None] | None = None, threads: bool = True) -> np.ndarray:
    """float32 of numpy-order ``shape`` from raw GGML data, in row chunks over the thread pool.

    Args:
        raw: GGML blocks of ``shape`` (uint8, any shape whose bytes are the tensor).
        out: optional float32 array of ``shape`` to write into.
        progress: called with the number of values done after each chunk.
        threads: False to stay on the calling thread (a background job leaving the pool alone).
    Returns:
        ``out`` (or a new array): float32 ``shape``, equal to ``gguf.quants.dequantize``.
    Raises:
        ValueError: the byte count does not match ``shape``.
    """
    ggml_type = T(ggml_type)
    shape = tuple(int(s) for s in shape)
    n_in = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    rb = row_bytes(ggml_type, n_in)
    data = np.asarray(raw).reshape(-1).view(np.uint8)
    if data.nbytes != rows * rb:
        raise ValueError(f"{ggml_type.name} {list(shape)} needs {rows * rb} bytes, got {data.nbytes}")
    data = data.reshape(rows, rb)
    res = empty_f32((rows, n_in)) if out is None else out.reshape(rows, n_in)
    step = max(1, CHUNK_VALUES // max(n_in, 1))
    starts = range(0, rows, step)

    def run(r0: int) -> None:
        r1 = min(rows, r0 + step)
        dequantize_rows(data[r0:r1], ggml_type, n_in, res[r0:r1])
        if progress is not None:
            progress((r1 - r0) * n_in)

    if threads:
        parallel(run, starts)
    else:
        for r0 in starts:
            run(r0)
    return res.reshape(shape)
