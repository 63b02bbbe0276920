"""The recurrent state beside the KV cache: what a recurrent layer keeps of each sequence.

An attention layer keeps every position's K/V (``model/forward.py``'s ``KVCache``), so a sequence
can be cut back to any position. A recurrent layer keeps one fixed-size state per sequence (lfm2's
short convolution: its last ``n_conv - 1`` inputs, float32 ``[n_conv - 1, n_embd]``), updated in
place by every token, so its past positions are gone: a state can be cleared (back to position 0),
copied to another sequence (llama.cpp ``llama_memory_seq_cp``), or put back to a position where a
*checkpoint* was taken (llama-server's context checkpoints), and nothing else. llama.cpp's
reference is ``llama_memory_recurrent`` (src/llama-memory-recurrent.cpp, one cell per sequence)
inside ``llama_memory_hybrid`` (the attention layers' KV cache beside it).

:class:`RecurrentState` holds, per segment and per block of that segment, a tuple of tensors
``f32 [n_seq, width]`` on the segment's device (row ``s`` is sequence ``s``'s state; the widths from
``Architecture.state_widths``: lfm2 one, qwen35's linear attention four: its three convolutions'
and the delta rule's; None for an attention block). The forward pass reaches it as it reaches the
K/V: the cache hands each segment its list, each block its tuple and the rows' sequence ids
(``KV.state``, ``KV.slots``), and the block's ``ssm_conv`` / ``gated_delta_net`` read and update the rows.

Checkpoints are host copies (numpy) of one sequence's rows of every block, keyed by the position
they were taken at (the sequence's token count then); at most :data:`MAX_CHECKPOINTS` per sequence,
the oldest dropped first. Edits of a state (clear, copy, restore) read and write the device
tensors whole under the model's forward lock, so they never interleave with a pass over the same
tensors; they are small (lfm2-1.2B: 10 recurrent blocks x 2 x 2048 floats = 160 KiB per sequence).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..backends.base import DeviceBuffer, DeviceTensor
from ..errors import RecurrentStateError

#: Checkpoints kept per sequence (llama-server keeps 8 context checkpoints per slot by default).
MAX_CHECKPOINTS = 8


class RecurrentState:
    """The recurrent states of ``n_seq`` sequences for every recurrent block of a placed model.

    Args:
        buffers: per segment, (the device buffer the states are made in, the state tensors' widths
            of each block of that segment: () for an attention block).
        n_seq: sequences (state rows per block).
        lock: the model's forward lock (state edits take it, module doc).
    Attributes:
        tensors: per segment, per block: a tuple of f32 [n_seq, width] on the segment's device, or None.
        checkpoints: per sequence, position -> host copies of that sequence's rows (one per state tensor).
    Raises:
        DeviceOutOfMemoryError: a state tensor does not fit.
    """

    def __init__(self, buffers: list[tuple[DeviceBuffer, list[tuple[int, ...]]]], n_seq: int, lock: threading.Lock):
        self.n_seq = n_seq
        self._lock = lock
        self.tensors: list[list[tuple[DeviceTensor, ...] | None]] = [
            [tuple(d.zeros((n_seq, w)) for w in ws) if ws else None for ws in widths] for d, widths in buffers]
        self.checkpoints: list[dict[int, list[np.ndarray]]] = [{} for _ in range(n_seq)]

    @property
    def nbytes(self) -> int:
        """Bytes of the states on the devices (every sequence; checkpoints on the host not counted)."""
        return sum(t.shape[0] * t.shape[1] * 4 for t in self._all())

    def _all(self) -> list[DeviceTensor]:
        return [t for ts in self.tensors for block in ts if block is not None for t in block]

    def _rows(self, seq: int) -> list[np.ndarray]:
        """Host copies of row ``seq`` of every state tensor (the caller holds the lock; each device's
        lock is taken for its reads: another model may be running a pass there)."""
        out = []
        for t in self._all():
            dev = _device(t)
            with dev.lock:
                out.append(np.array(dev.read(t)[seq]))
        return out

    def _put(self, seq: int, rows: list[np.ndarray] | None) -> None:
        """Write ``rows`` (None: zeros) into row ``seq`` of every state tensor (the caller holds the lock)."""
        for i, t in enumerate(self._all()):
            dev = _device(t)
            with dev.lock:
                full = np.array(dev.read(t))
                full[seq] = 0.0 if rows is None else rows[i]
                dev.write(t, full)

    def _check_seq(self, *seqs: int) -> None:
        for s in seqs:
            if not 0 <= s < self.n_seq:
                raise ValueError(f"seq_id {s} is outside the state's 0..{self.n_seq - 1} sequences")

    def clear(self, seq: int) -> None:
        """Sequence ``seq`` back to position 0: zero states (llama.cpp ``seq_rm`` of a whole
        sequence), its checkpoints forgotten."""
        self._check_seq(seq)
        with self._lock:
            self._put(seq, None)
        self.checkpoints[seq].clear()

    def copy(self, src: int, dst: int, n: int, n_src: int) -> bool:
        """Make ``dst``'s states those of ``src`` after its first ``n`` tokens (llama.cpp ``seq_cp``):
        its current states when ``n == n_src`` (its token count), else its checkpoint at ``n``;
        ``dst``'s checkpoints become ``src``'s up to ``n``.

        Returns:
            False (nothing changed) when ``src`` has no state at ``n``: neither its current one nor a checkpoint.
        Raises:
            ValueError: a sequence outside the state.
        """
        self._check_seq(src, dst)
        if n != n_src and n not in self.checkpoints[src]:
            return False
        with self._lock:
            rows = self._rows(src) if n == n_src else self.checkpoints[src][n]
            self._put(dst, rows)
        self.checkpoints[dst] = {p: c for p, c in self.checkpoints[src].items() if p <= n}
        return True

    def checkpoint(self, seq: int, pos: int) -> None:
        """Keep a host copy of ``seq``'s states as its state at position ``pos`` (its token count now),
        for :meth:`restore` (at most :data:`MAX_CHECKPOINTS`, the oldest dropped)."""
        self._check_seq(seq)
        with self._lock:
            rows = self._rows(seq)
        cps = self.checkpoints[seq]
        cps[pos] = rows
        while len(cps) > MAX_CHECKPOINTS:
            del cps[min(cps)]

    def restore(self, seq: int, pos: int) -> bool:
        """Put ``seq``'s states back to its checkpoint at ``pos``; checkpoints past ``pos`` are dropped
        (the tokens after it are about to change). False (nothing changed) when there is none."""
        self._check_seq(seq)
        cps = self.checkpoints[seq]
        if pos not in cps:
            return False
        with self._lock:
            self._put(seq, cps[pos])
        for p in [p for p in cps if p > pos]:
            del cps[p]
        return True

    def reusable(self, seq: int, n: int, n_have: int) -> int:
        """The longest prefix ``p <= n`` of ``seq`` (holding ``n_have`` tokens) the states can go back to:
        ``n`` itself when ``n == n_have``, else the latest checkpoint at or before ``n``, else 0."""
        if n >= n_have:
            return n_have
        return max((p for p in self.checkpoints[seq] if p <= n), default=0)

    def truncate(self, seq: int, n: int, n_have: int) -> None:
        """Keep the states of ``seq``'s first ``n`` of ``n_have`` tokens: cleared at ``n <= 0`` (whatever
        ``n_have``); nothing to do when ``n >= n_have``; else restored from the checkpoint at ``n``.

        Raises:
            RecurrentStateError: no checkpoint at ``n`` (a recurrent state cannot be cut back to
                an arbitrary position; the message lists the positions it can go back to).
        """
        if n <= 0:
            self.clear(seq)
            return
        if n >= n_have:
            return
        if not self.restore(seq, n):
            have = sorted(p for p in self.checkpoints[seq] if p < n_have)
            raise RecurrentStateError(
                f"sequence {seq}: a recurrent model's state cannot be cut back from {n_have} to {n} tokens "
                f"without a checkpoint there (checkpoints at: {', '.join(map(str, have)) or 'none'}; "
                "0 clears it)")


def _device(t: DeviceTensor) -> Any:
    """The Device holding ``t`` (state tensors are always allocated on one)."""
    if t.device is None:  # pragma: no cover - every state tensor comes from Device.zeros
        raise RuntimeError("a recurrent state tensor without a device")
    return t.device
