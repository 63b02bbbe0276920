"""Quantize float32 rows to a GGML type, as llama.cpp's ``ggml_quantize_chunk`` does without an importance matrix.

Which implementation serves which type:

- F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: ``gguf.quants.quantize`` (the gguf package's numpy ports of
  ``quantize_row_*_ref`` and of the float conversions; they are bit-exact with llama.cpp, which the tests
  check on every type against files llama.cpp writes).
- Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: :mod:`.kquants` (gguf has no K-quant quantizers).
- IQ4_NL, IQ4_XS: :mod:`.iq4` (with or without an importance matrix).
- With an importance matrix (``imatrix``): :mod:`.iquants` for Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants;
  Q8_0 and the float types ignore it, as ggml does.

Rows are processed in slabs: about :data:`SLAB_VALUES` values for the K-quants, whose searches make a
dozen temporaries per step that then stay in the CPU's L2 cache (64K values: 2.6x faster than 1M on
this machine), and :data:`SLAB_VALUES_GGUF` for the others.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from ..errors import UnsupportedModelError
from . import iq4, iquants, kquants

T = GGMLQuantizationType

_KQUANTS: dict[T, Callable[[np.ndarray], np.ndarray]] = {
    T.Q2_K: kquants.quantize_q2_k, T.Q3_K: kquants.quantize_q3_k, T.Q4_K: kquants.quantize_q4_k,
    T.Q5_K: kquants.quantize_q5_k, T.Q6_K: kquants.quantize_q6_k,
}
_WEIGHTED: dict[T, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    T.Q4_0: iquants.quantize_q4_0_w, T.Q4_1: iquants.quantize_q4_1_w, T.Q5_0: iquants.quantize_q5_0_w,
    T.Q5_1: iquants.quantize_q5_1_w, T.Q2_K: iquants.quantize_q2_k_w, T.Q3_K: iquants.quantize_q3_k_w,
    T.Q4_K: iquants.quantize_q4_k_w, T.Q5_K: iquants.quantize_q5_k_w, T.Q6_K: iquants.quantize_q6_k_w,
}
_IQ4: dict[T, Callable[[np.ndarray, np.ndarray | None], np.ndarray]] = {
    T.IQ4_NL: iq4.quantize_iq4_nl, T.IQ4_XS: iq4.quantize_iq4_xs,
}
_GGUF = (T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)
#: Every type :func:`quantize_rows` writes.
WRITABLE: tuple[T, ...] = (T.F32, *_GGUF, *_KQUANTS, *_IQ4)
#: Values per slab for the K-quants (64K float32: 256 KB per temporary).
SLAB_VALUES = 1 << 16
#: Values per slab for the gguf.quants types.
SLAB_VALUES_GGUF = 1 << 20


def quantize_rows(x: np.ndarray, ggml_type: T, progress: Callable[[int], None] | None = None,
                  pool: ThreadPoolExecutor | None = None, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize rows of float32 values.

    Args:
        x: float32 [n_rows, n_per_row]; ``n_per_row`` a multiple of the type's block size.
        ggml_type: one of :data:`WRITABLE`.
        progress: called (on this thread) with the number of values done after each slab.
        pool: threads to quantize slabs in parallel (numpy releases the GIL inside its loops); the
            slabs are independent, so the bytes do not depend on it.
        imatrix: float32 [n_per_row], the importance of each column (llama.cpp's ``quant_weights``), or None.

    Returns:
        uint8 [n_rows, row_bytes], the rows in GGML's block layout (ggml-common.h).

    Raises:
        UnsupportedModelError: a type not in :data:`WRITABLE`, a row that is not whole blocks, or a NaN or
            infinite value (llama.cpp fails such a tensor too: "quantized data validation failed").
    """
    ggml_type = T(ggml_type)
    if ggml_type not in WRITABLE:
        raise UnsupportedModelError(f"cannot quantize to {ggml_type.name}: cooktop writes "
                                    f"{', '.join(t.name for t in WRITABLE)}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_rows, n = x.shape
    block, size = GGML_QUANT_SIZES[ggml_type]
    if n % block:
        raise UnsupportedModelError(f"rows of {n} values cannot be {ggml_type.name} (blocks of {block})")
    if not np.isfinite(x).all():
        r = int(np.argwhere(~np.isfinite(x))[0, 0])
        raise UnsupportedModelError(f"row {r} holds a NaN or infinite value: it cannot be quantized")
    out = np.empty((n_rows, n // block * size), np.uint8)
    qw = None
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.size != n:
            raise UnsupportedModelError(f"an importance vector of {qw.size} values for rows of {n}")
    slab_values = SLAB_VALUES if ggml_type in _KQUANTS or ggml_type in _IQ4 or qw is not None else SLAB_VALUES_GGUF
    step = max(1, slab_values // n)

    def slab(r: int) -> int:
        xs = x[r:r + step]
        if ggml_type == T.F32:
            q = xs.view(np.uint8)
        elif ggml_type in _IQ4:
            q = _IQ4[ggml_type](xs, qw)
        elif qw is not None and ggml_type in _WEIGHTED:
            q = _WEIGHTED[ggml_type](xs, qw)
        elif ggml_type in _KQUANTS:
            q = _KQUANTS[ggml_type](xs.reshape(-1, kquants.QK_K))
        else:
            q = quants.quantize(xs, ggml_type)
        out[r:r + step] = q.reshape(xs.shape[0], -1).view(np.uint8)
        return xs.size

    starts = range(0, n_rows, step)
    done = pool.map(slab, starts) if pool is not None and len(starts) > 1 else map(slab, starts)
    for n_done in done:
        if progress is not None:
            progress(n_done)
    return out
