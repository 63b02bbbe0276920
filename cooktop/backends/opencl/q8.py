"""8-bit copies of activations for the OpenCL integer-dot matmuls (a backend-internal cache).

A matmul whose weight type has an integer-dot kernel (``dotq8.cl``) reads its input
``x`` as llama.cpp's ``block_q8_1`` split in two planes: ``xq`` int8 [n, n_in] and
``xd`` float2 [n, n_in / 32] (scale, scale * sum of quants). The quantized copy of an
activation is made once and reused by every matmul that reads it (q, k and v read
the same normed row; gate and up too), and the ops that produce matmul inputs
(``rmsnorm``, ``silu_mul``) write it in the same kernel (``quant.cl``), so
quantization costs no extra launch there. The K-quants read llama.cpp's ``block_q8_K``
instead (one scale per 256 values, sums per 16; :func:`..reference.quantize_q8_K_ref`), in the
same two buffers; the producers write the format the last integer-dot matmul read.

A :class:`Q8Shadows` holds a few slots; slot ``i`` belongs to one activation buffer
(identified by the buffer itself) and is valid for its first ``rows`` rows of
``n_in`` values. Every op or write that changes a buffer calls :meth:`dirty` on it,
so a stale copy is never read; a new allocation at a reused address is dirtied
too (:meth:`dirty` from ``empty``/``upload``).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Q8Slot:
    """One quantized copy: ``xq`` (int8 [cap_values]) and ``xd`` (float2 [cap_values / 32]) buffers,
    the owner buffer's address, the rows x n_in it holds (0 rows = free) and its format: ``"q8_1"``
    (``xd`` = (d, d * sum) per 32 values) or ``"q8_K"`` (``xd`` = a 16-float record per 256
    values: short bsums[16], float d; quant.cl ``store_q8k``), in the same buffers."""

    xq: Any
    xd: Any
    cap_values: int
    owner: int = 0
    rows: int = 0
    n_in: int = 0
    tick: int = 0
    fmt: str = "q8_1"


class Q8Shadows:
    """The slots of one device (module doc).

    Args:
        alloc: ``alloc(nbytes) -> buffer`` of the device (raises DeviceOutOfMemoryError).
        n_slots: copies kept at once (LRU).
    """

    def __init__(self, alloc: Any, n_slots: int = 4):
        self._alloc = alloc
        self._slots: list[Q8Slot] = []
        self._n_slots = n_slots
        self._tick = 0

    def lookup(self, handle: Any, rows: int, n_in: int, fmt: str = "q8_1") -> Q8Slot | None:
        """The valid copy in format ``fmt`` of rows ``0..rows-1`` (``n_in`` values each) of ``handle``, or None."""
        key = handle.int_ptr
        for s in self._slots:
            if s.owner == key and s.n_in == n_in and s.rows >= rows and s.fmt == fmt:
                self._tick += 1
                s.tick = self._tick
                return s
        return None

    def claim(self, handle: Any, rows: int, n_in: int, fmt: str = "q8_1", keep_others: bool = False) -> Q8Slot:
        """A slot that will hold rows ``0..rows-1`` of ``handle`` in format ``fmt`` once the caller's
        kernel has run. Every other copy of ``handle`` is forgotten (a producer is about to write
        it), or with ``keep_others`` only those of ``fmt`` (a second format of unchanged values).

        Raises:
            DeviceOutOfMemoryError: growing a slot failed.
        """
        key = handle.int_ptr
        if keep_others:
            for s in self._slots:
                if s.owner == key and s.fmt == fmt:
                    s.owner, s.rows = 0, 0
        else:
            self.dirty(handle)
        need = rows * n_in
        free = [s for s in self._slots if s.rows == 0]
        if free:
            slot = max(free, key=lambda s: s.cap_values)
        elif len(self._slots) < self._n_slots:
            slot = Q8Slot(None, None, 0)
            self._slots.append(slot)
        else:
            slot = min(self._slots, key=lambda s: s.tick)
        if slot.cap_values < need:
            cap = max(need, 2 * slot.cap_values)
            slot.xq, slot.xd, slot.cap_values = self._alloc(cap), self._alloc(cap // 32 * 8), cap
        self._tick += 1
        slot.owner, slot.rows, slot.n_in, slot.tick, slot.fmt = key, rows, n_in, self._tick, fmt
        return slot

    def dirty(self, handle: Any) -> None:
        """Forget every copy of ``handle`` (it is about to be written)."""
        key = handle.int_ptr
        for s in self._slots:
            if s.owner == key:
                s.owner, s.rows = 0, 0

    def clear(self) -> None:
        """Drop every slot and its buffers."""
        self._slots = []

    def forget_all(self) -> None:
        """Forget every copy (every buffer may have been written), keeping the slots' buffers."""
        for s in self._slots:
            s.owner, s.rows = 0, 0
