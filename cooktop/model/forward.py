"""The transformer forward pass on this machine's devices, written once against the backend op
set; the architecture (``model/arch/<arch>.py``) supplies the tensors, the block and the head,
and ``model/placed.py`` (:class:`~cooktop.model.placed.PlacedModel`) what every placed model
shares (embedding, the rows of a pass, the cache checks), here and on a cluster.

The model is cut into *segments*: runs of consecutive repeating blocks (and
possibly the output head) that live on one device (``runtime/placement.py``
decides which). Each segment owns its weights (uploaded once, still in GGML
block layout) and preallocated scratch buffers of ``n_batch`` rows. The K/V
live in a :class:`KVCache` (made by :meth:`Model.new_cache`, owned by whoever
runs its sequences and passed to every :meth:`Model.forward`), so one loaded
model serves many sequences; a lock makes forward passes of different threads
take turns over the shared scratch buffers. The token embedding lookup runs on
the host; at a segment boundary the activations (float32 [n_tokens, n_embd])
are read back and written to the next device, nothing else. Logits come back
from the device holding the output head.

Several sequences in one pass (llama.cpp's unified KV cache, ``llama_batch``
with ``seq_id``): a :class:`KVCache` made for ``n_seq`` sequences holds one K
and one V tensor per block of f32 [n_seq * n_ctx, n_embd_kv]; sequence ``s``
owns the cells (rows) ``s * n_ctx .. (s + 1) * n_ctx - 1`` and its position
``p`` lives in cell ``s * n_ctx + p``. :meth:`Model.forward_batch` runs the
tokens of several sequences as one batch: every matmul reads each weight once
for all rows, rope rotates each row by its own position, ``kv_store`` writes
each row's cell and ``attention`` reads, for row ``i``, cells
``kv_start[i] .. cell[i]`` (its own sequence's first cell to its own). Chosen
over per-sequence caches with attention looped per sequence because it costs
one attention dispatch per block whatever the batch (Vulkan and OpenCL pay per
dispatch) and needs no sub-buffer views (Kompute has none). One sequence
(``n_seq = 1``) runs exactly as before: cells are the positions, no ``kv_start``.

Sliding-window blocks (``model/swa.py``, llama.cpp's iSWA cache) may keep only their window:
``B = min(n_ctx, GGML_PAD(n_swa + n_batch, 256))`` cells per sequence, sequence ``s``'s position
``p`` in cell ``s * B + p - offset_s`` (``Rows.swa_cells`` / ``swa_kv_start``, written into the
segment's ``swa_cells`` / ``swa_start`` buffers); the offset advances when the model compacts the
sequence (``PlacedModel._swa_room``: rows moved with ``Device.copy_rows``). Same kernels: the window
mask and ``kv_start`` work on cell distances, which the offset keeps.

Device buffers are given back by ``close()`` or, at the latest, when their
owner (a :class:`Segment` or :class:`KVCache`) is dropped: nothing here holds
a reference cycle, so ``del`` frees them at once (a ``weakref.finalize`` per
owner releases its :class:`DeviceBuffer`, which backends that keep their own
references, such as Vulkan, need).

Per batch of ``n`` rows (llama2.c's ``forward``)::

    x = token_embd[tokens]                              (host)
    for each block i:  arch.block(x, weights[i], KV(cache.k[i], cache.v[i], pos, cells, kv_start), i)
    arch.head(x):      xn = final_norm(x[out_rows])     (the last row, each sequence's last, or all)
                       logits = lm_head(xn)             (embeddings: xn)
"""

from __future__ import annotations

import itertools
import weakref
from types import SimpleNamespace

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends import chunked
from ..backends.base import Device, DeviceBuffer, DeviceTensor
from ..errors import CooktopError, DeviceOutOfMemoryError, UnsupportedOpError
from ..format.gguf import GGUFFile, TensorInfo
from ..format.kvtypes import KVConfig
from ..format.quants import dequantize, row_bytes
from . import swa
from .arch import Architecture, architecture
from .arch.base import HEAD, KV, MATRIX, Weights
from .config import ModelConfig
from .lora import LoraSet
from .placed import CacheTokens, HiddenRows, PlacedModel, Rows
from .recurrent import RecurrentState

#: Segment serials (graph keys name the segment by it: never reused, unlike id()).
_segment_serials = itertools.count(1)


def _releaser(owner: object, buffer: DeviceBuffer, scratch_of: Device | None = None) -> weakref.finalize:
    """A finalizer releasing ``buffer`` when ``owner`` is collected (or when called; it runs
    at most once), then the scratch of chunked ops of ``scratch_of`` (a segment's device:
    ``chunked.release_scratch``). Not run at interpreter exit, where devices may be gone."""
    fin = weakref.finalize(owner, _release, buffer, scratch_of)
    fin.atexit = False
    return fin


def _release(buffer: DeviceBuffer, scratch_of: Device | None) -> None:
    buffer.release()
    if scratch_of is not None:
        chunked.release_scratch(scratch_of)


def upload(d: Device | DeviceBuffer, t: TensorInfo, as_f32: bool, shape: tuple[int, ...] | None = None
           ) -> DeviceTensor:
    """Upload a weight to ``d``: matrices as raw GGML blocks; norm and bias weights
    (``as_f32``) as float32, dequantized on the host when stored otherwise, since the
    contract's rmsnorm and add take f32 operands. ``shape``: the architecture's shape when it
    views the file's differently (qwen2moe's ``[n_embd]`` shared-expert gate as ``[1, n_embd]``).
    A matrix over the device's largest buffer is stored in row chunks (``backends/chunked.py``).

    Raises:
        DeviceOutOfMemoryError: the device refused it (the message names ``t`` and the limit).
    """
    shape = tuple(shape) if shape is not None else tuple(t.shape)
    try:
        if as_f32 and t.ggml_type != T.F32:
            return d.upload(dequantize(t.data, t.ggml_type, t.shape), T.F32, shape)
        return d.upload(t.data, t.ggml_type, shape)
    except DeviceOutOfMemoryError as e:
        raise DeviceOutOfMemoryError(f"tensor {t.name}: {e}") from e


def upload_rows(d: Device | DeviceBuffer, t: TensorInfo, ranges: list[tuple[int, int]],
                as_f32: bool = False) -> DeviceTensor:
    """Upload the rows of ``ranges`` (``(first, end)`` each, in order) of matrix ``t`` (``[n_out, n_in]``,
    any GGML type) as one weight of shape ``[rows, n_in]``: slices of the file's bytes, since each
    GGML row is ``row_bytes(type, n_in)`` contiguous bytes (a fused weight's part, ``TensorSpec.parts``).
    An expert tensor ``[n_expert, n_out, n_in]`` is cut by its rows counted across experts (``ranges``:
    one of equal length per expert, gemma4's fused ``ffn_gate_up_exps``) into ``[n_expert, rows, n_in]``.
    ``as_f32``: a norm-kind tensor (a convolution kernel), dequantized to f32 if the file's is not."""
    rb = row_bytes(t.ggml_type, t.shape[-1])
    flat = np.asarray(t.data).reshape(-1).view(np.uint8)
    raw = np.concatenate([flat[a * rb:e * rb] for a, e in ranges]) if len(ranges) > 1 else \
        flat[ranges[0][0] * rb:ranges[0][1] * rb]
    if len(t.shape) == 3:
        shape: tuple[int, ...] = (len(ranges), ranges[0][1] - ranges[0][0], t.shape[-1])
    else:
        shape = (sum(e - a for a, e in ranges),) + tuple(t.shape[1:])
    try:
        if as_f32 and t.ggml_type != T.F32:
            return d.upload(dequantize(raw, t.ggml_type, shape), T.F32, shape)
        return d.upload(raw, t.ggml_type, shape)
    except DeviceOutOfMemoryError as e:
        raise DeviceOutOfMemoryError(f"tensor {t.name} rows {ranges[0][0]}-{ranges[-1][1] - 1}: {e}") from e


class Segment:
    """Blocks ``blocks`` (and the head when ``head``) on one device: weights and scratch buffers.

    Buffers (``B`` = n_batch rows): the architecture's scratch (``arch.scratch(cfg)``:
    name -> f32 [B, width]; the builders': x, xn, o [B, n_embd], q, att [B, n_embd_q], k, v
    [B, n_embd_kv], gate, up [B, n_ff]); pos, cells, kv_start: i32 [B]; head only: the
    output rows (ids i32 [m], xl f32 [m, n_embd], logits f32 [m, n_vocab], m grown by
    powers of two as batches ask; logits f32 [B, n_vocab] when logits_all).
    The KV cache is not here: :meth:`run` takes the cache of these blocks.
    ``parts`` (per block, default ``all``): ``attn`` or ``ffn`` runs one half of a block
    (``Architecture.run_block``: a block whose experts live on another device); an ``ffn`` half
    has no cache (its entry in the cache lists is a 1-row placeholder). I32 scratch buffers
    (``arch.scratch_i32``: the selected experts) are allocated beside the f32 ones.
    """

    def __init__(self, device: Device, blocks: list[int], head: bool, gf: GGUFFile, cfg: ModelConfig,
                 n_batch: int, logits_all: bool, arch: Architecture | None = None, parts: list[str] | None = None):
        self.device, self.blocks, self.head, self.cfg = device, blocks, head, cfg
        self.parts = list(parts) if parts is not None else ["all"] * len(blocks)
        self.arch = arch or architecture(cfg.arch)
        self._serial = next(_segment_serials)
        #: the model's LoRA adapters (``model/lora.py``; their scales are part of the graph key), or None
        self.lora: LoraSet | None = None
        #: the attention kernel its blocks ask for (``Device.attention``'s ``flash``; the model's ``-fa``)
        self.flash_attn = True
        #: the arena owning every weight and scratch buffer of this segment
        self.buffer = device.buffer(f"blocks {blocks[0]}-{blocks[-1]}" if blocks else "head")
        self._release = _releaser(self, self.buffer, device)
        try:
            self._allocate(gf, n_batch, logits_all)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give every buffer of this segment back to its device (once; also on collection), and
        the device's scratch of chunked ops (``chunked.release_scratch``: allocated again on use)."""
        self._release()

    def _allocate(self, gf: GGUFFile, n_batch: int, logits_all: bool) -> None:
        cfg, arch = self.cfg, self.arch
        d = self.buffer
        uploaded: dict = {}  # a tensor several units use is uploaded once (fused parts: (name, key))
        #: GGUF name -> (uploaded tensor, its row ranges of the file's or None) of each matrix here
        #: (a fused matrix: one per part): where a LoRA adapter's A and B go (``model/lora.py``)
        self.matrices: dict[str, list[tuple[DeviceTensor, list[tuple[int, int]] | None]]] = {}

        def weights(unit: int | str, part: str = "all") -> Weights:
            w = {}
            for key, (name, spec) in arch.unit_tensors(gf.tensors, unit, part).items():
                if spec.parts:  # a fused matrix: each row range is a weight of its own
                    for pkey, ranges in spec.part_rows(cfg):
                        if (name, pkey) not in uploaded:
                            uploaded[(name, pkey)] = upload_rows(d, gf.tensor(name), ranges,
                                                                 as_f32=spec.kind != MATRIX)
                            if spec.kind == MATRIX:
                                self.matrices.setdefault(name, []).append((uploaded[(name, pkey)], ranges))
                        w[pkey] = uploaded[(name, pkey)]
                    continue
                if name not in uploaded:
                    lc = cfg.layer(unit) if isinstance(unit, int) and spec.per_block else cfg  # gemma4: per block
                    uploaded[name] = upload(d, gf.tensor(name), as_f32=spec.kind != MATRIX, shape=spec.shape(lc))
                    if spec.kind == MATRIX:
                        self.matrices.setdefault(name, []).append((uploaded[name], None))
                w[key] = uploaded[name]
            return w

        self.weights: list[Weights] = [weights(i, part) for i, part in zip(self.blocks, self.parts)]
        B = n_batch
        self.scratch = {name: d.empty((B, width)) for name, width in arch.scratch(cfg).items()}
        if arch.scratch_i32 is not None:
            self.scratch.update({name: d.empty((B, width), T.I32) for name, width in arch.scratch_i32(cfg).items()})
        # per-layer token inputs (gemma4): one f32 [B, n_embd_per_layer] buffer per block, written per pass
        P = cfg.n_embd_per_layer
        self.layer_in = [d.empty((B, P)) for _ in self.blocks] if P else []
        self.pos = d.empty((B,), T.I32)
        self.slots = d.empty((B,), T.I32)
        self.cells = d.empty((B,), T.I32)
        self.kv_start = d.empty((B,), T.I32)
        #: the rows' cells and first cells in the sliding-window blocks' caches (a split cache: model/swa.py)
        self.swa = {i for i in self.blocks if swa.is_swa_block(cfg, i)}
        if self.swa:
            self.swa_cells, self.swa_start = d.empty((B,), T.I32), d.empty((B,), T.I32)
            self.swa_attend_to, self.swa_window_start = d.empty((B,), T.I32), d.empty((B,), T.I32)
        self.attend_to = d.empty((B,), T.I32)  # a non-causal pass's rows (an image): Rows.attend_to
        self.window_start = d.empty((B,), T.I32)
        if self.head:
            self.head_weights = weights(HEAD)
            # the logits may be past the device's largest buffer: row chunks (backends/chunked.py)
            self.logits_all = d.empty((B, cfg.n_vocab), split=True) if logits_all else None
            self._grow_outputs(1)

    def _grow_outputs(self, m: int) -> None:
        """(Re)allocate the output rows' buffers for at least ``m`` rows (powers of two)."""
        cap = 1
        while cap < m:
            cap *= 2
        old = [t for t in (getattr(self, "ids", None), getattr(self, "xl", None), getattr(self, "logits", None))
               if t is not None]
        d = self.buffer
        self.ids = d.empty((cap,), T.I32)
        self.xl = d.empty((cap, self.cfg.n_embd))
        self.logits = d.empty((cap, self.cfg.n_vocab), split=True)
        if old:
            self.device.release(old)
            d.tensors = [t for t in d.tensors if t.device is not None]

    def run(self, x_host: np.ndarray, rows: Rows, k_cache: list[DeviceTensor], v_cache: list[DeviceTensor],
            embeddings: bool = False, states: list[tuple[DeviceTensor, ...] | None] | None = None,
            hidden: bool = False) -> np.ndarray:
        """Run this segment on ``n`` rows (tokens of one or several sequences).

        Args:
            x_host: float32 [n, n_embd] activations entering the first block.
            rows: positions, cells and output rows (:class:`Rows`).
            k_cache, v_cache: the cache of each block of this segment,
                f32 [n_cells, n_head_kv * head_dim] on this segment's device.
            embeddings: head only: return the output-normed hidden states of every
                row instead of logits (llama.cpp's ``result_norm``, what its embeddings pool).
            states: the recurrent state tensors of each block of this segment (``model/recurrent.py``:
                each f32 [n_seq, width]; None for an attention block); None: no recurrent block.
            hidden: head only: also keep the output-normed hidden states of every row in
                :attr:`hidden_out` (float32 [n, n_embd]; llama.cpp's ``h_nextn``, what a
                multi-token-prediction draft reads); one more norm of the rows when only some rows' logits
                are asked for.
        Returns:
            float32 [n, n_embd] activations after the last block, or, with the
            head, logits float32 [m, n_vocab] of the output rows (``embeddings``: float32 [n, n_embd]).
        Raises:
            CooktopError: logits of every row asked of a segment loaded without logits_all.

        The inputs (x, positions, cells, kv_start, output rows) are written first; the blocks
        and the head are then one fixed op list handed to the device as a graph
        (:meth:`Device.graph <cooktop.backends.base.Device.graph>`) whose key covers what the
        list depends on: this segment, ``n``, the output mode and rows ``m``, ``rows.n_ctx``,
        which of cells / kv_start are bound, and the buffers by serial (the cache's, and the
        output rows' that :meth:`_grow_outputs` reallocates). A recording device replays it
        without running the ops' Python path; the result is read back after the scope.
        """
        with self.device.lock:  # another model on this device (a draft) runs its passes in between
            return self._run(x_host, rows, k_cache, v_cache, embeddings, states, hidden and self.head)

    def _run(self, x_host: np.ndarray, rows: Rows, k_cache: list[DeviceTensor], v_cache: list[DeviceTensor],
             embeddings: bool, states: list[tuple[DeviceTensor, ...] | None] | None,
             hidden: bool = False) -> np.ndarray:
        """Body of :meth:`run` (the device's lock held)."""
        n = x_host.shape[0]
        head = self.head
        outputs = rows.outputs if head and not embeddings else None
        if head and not embeddings and outputs is None and self.logits_all is None:
            raise CooktopError("logits for every row need the model loaded with logits_all=True")
        m = len(outputs) if outputs is not None else 0
        if m and m > self.ids.shape[0]:
            self._grow_outputs(m)  # new buffers: their serials are in the key below
        d = self.device
        s = SimpleNamespace(**{name: buf.head(n) for name, buf in self.scratch.items()})
        pos = self.pos.head(n)
        d.write(s.x, x_host)
        d.write(pos, rows.pos)
        if self.arch.row_inputs is not None:  # host-computed per-row inputs (Architecture.row_inputs)
            for name, values in self.arch.row_inputs(self.cfg, rows.pos).items():
                d.write(getattr(s, name), values)
        cells, start = pos, None
        if rows.cells is not None:
            cells = self.cells.head(n)
            d.write(cells, rows.cells)
        if rows.kv_start is not None:
            start = self.kv_start.head(n)
            d.write(start, rows.kv_start)
        swa_cells = swa_start = swa_attend = swa_wstart = None  # the sliding-window blocks' own (model/swa.py)
        if self.swa and rows.swa_cells is not None:
            swa_cells = self.swa_cells.head(n)
            d.write(swa_cells, rows.swa_cells)
            if rows.swa_kv_start is not None:
                swa_start = self.swa_start.head(n)
                d.write(swa_start, rows.swa_kv_start)
            if rows.swa_attend_to is not None and rows.swa_window_start is not None:
                swa_attend = self.swa_attend_to.head(n)
                d.write(swa_attend, rows.swa_attend_to)
                swa_wstart = self.swa_window_start.head(n)
                d.write(swa_wstart, rows.swa_window_start)
        attend = wstart = None
        if rows.attend_to is not None:
            attend = self.attend_to.head(n)
            d.write(attend, rows.attend_to)
            if rows.window_start is not None:
                wstart = self.window_start.head(n)
                d.write(wstart, rows.window_start)
        if outputs is not None:
            d.write(self.ids.head(m), outputs)
        if self.layer_in:
            if rows.layer_inputs is None:
                raise CooktopError(f"{self.cfg.arch}: a pass without the per-layer token inputs")
            for buf, i in zip(self.layer_in, self.blocks):
                d.write(buf.head(n), np.ascontiguousarray(rows.layer_inputs[:, i, :]))
        slots = None
        if states is not None and any(t is not None for t in states):
            slots = self.slots.head(n)
            d.write(slots, rows.seqs if rows.seqs is not None else np.zeros(n, dtype=np.int32))
        # everything the op list depends on (Device.graph's contract): the rows, the output mode,
        # n_ctx (LongRoPE's choice), which optional inputs are bound, and the buffers by serial
        # (the cache's; ids/xl/logits change when _grow_outputs reallocates them)
        mode = "x" if not head else "embd" if embeddings else "rows" if m else "all"
        key = (self._serial, n, mode, m, rows.n_ctx, rows.cells is not None, start is not None,
               swa_cells is not None, swa_start is not None, swa_attend is not None,
               self.ids.serial if m else 0, tuple(t.serial for t in k_cache), tuple(t.serial for t in v_cache),
               tuple(() if b is None else tuple(t.serial for t in b) for b in states or ()), hidden,
               self.lora.key() if self.lora is not None else None,  # the LoRA scales: constants of the ops
               attend is not None, wstart is not None)
        with d.graph(key) as issue:
            if issue:
                out = self._ops(s, n, m, pos, cells, start, rows.n_ctx, k_cache, v_cache, embeddings, states, slots,
                                hidden, attend, wstart,
                                (swa_cells, swa_start, swa_attend, swa_wstart) if swa_cells is not None else None)
            else:
                out = self._result(s, n, m, embeddings)
        #: the output-normed rows of the last run with ``hidden`` (float32 [n, n_embd]), else None
        self.hidden_out = d.read(s.xn) if hidden else None
        res = d.read(out)
        c = self.cfg.final_logit_softcap
        if head and not embeddings and c:
            # llama.cpp's final soft-cap (ggml_scale, ggml_tanh, ggml_scale), on the host: c tanh(logits / c)
            res = np.tanh(np.asarray(res, dtype=np.float32) * np.float32(1.0 / c)) * np.float32(c)
        return res

    def _result(self, s: SimpleNamespace, n: int, m: int, embeddings: bool) -> DeviceTensor:
        """The tensor :meth:`run` reads back: x (no head), xn (embeddings), logits (all rows or ``m``)."""
        if not self.head:
            return s.x
        if embeddings:
            return s.xn
        return self.logits.head(m) if m else self.logits_all.head(n)  # type: ignore[union-attr]

    def _ops(self, s: SimpleNamespace, n: int, m: int, pos: DeviceTensor, cells: DeviceTensor,
             start: DeviceTensor | None, n_ctx: int, k_cache: list[DeviceTensor], v_cache: list[DeviceTensor],
             embeddings: bool, states: list[tuple[DeviceTensor, ...] | None] | None = None,
             slots: DeviceTensor | None = None, hidden: bool = False, attend: DeviceTensor | None = None,
             wstart: DeviceTensor | None = None,
             swa_rows: tuple[DeviceTensor, DeviceTensor | None, DeviceTensor | None, DeviceTensor | None] | None = None,
             ) -> DeviceTensor:
        """Issue the fixed op list of :meth:`run` (the blocks, then the head); returns :meth:`_result`.
        ``attend`` / ``wstart``: a non-causal pass's last and first rows (``Rows.attend_to``,
        ``window_start``); ``swa_rows``: the cells, first cells and those two of the sliding-window blocks
        (a split cache), else None."""
        d, cfg, arch = self.device, self.cfg, self.arch
        for j, w in enumerate(self.weights):
            if self.layer_in:
                s.layer_in = self.layer_in[j].head(n)  # this block's per-layer token input (gemma4)
            state = states[j] if states is not None else None
            c, st, at, ws = (swa_rows if swa_rows is not None and self.blocks[j] in self.swa
                             else (cells, start, attend, wstart))
            kv = KV(k_cache[j], v_cache[j], pos, c, st, n_ctx or k_cache[j].shape[0], self.flash_attn,
                    state, slots if state is not None else None, at, ws, cfg.n_swa)
            arch.run_block(d, cfg, w, s, kv, self.blocks[j], self.parts[j])
        out = self._result(s, n, m, embeddings)
        if not self.head:
            return out
        if embeddings:
            arch.head(d, cfg, self.head_weights, s.x, s.xn)
        elif m:  # the output rows only
            if hidden:  # every row normed too (Segment.run's hidden)
                arch.final_norm(d, cfg, self.head_weights, s.xn, s.x)
            arch.head(d, cfg, self.head_weights, s.x, self.xl.head(m), out, self.ids.head(m))
        else:
            arch.head(d, cfg, self.head_weights, s.x, s.xn, out)
        return out


class KVCache(CacheTokens):
    """The K and V of ``n_seq`` sequences on a loaded model, and the token ids they belong to.

    Made by :meth:`Model.new_cache`; owned by whoever runs its sequences and passed
    to :meth:`Model.forward` / :meth:`Model.forward_batch`, which write it. Sequence
    ``s`` owns cells ``s * n_ctx .. (s + 1) * n_ctx - 1`` (see the module doc); several
    caches of one model are independent, but only sequences of one cache share a batch.

    Attributes:
        k, v: per segment, per block of that segment: [n_seq * n_ctx, n_head_kv * head_dim] of the
            model's ``kv.type_k`` / ``kv.type_v`` (``cooktop.format.kvtypes``) on the segment's device
            (cell ``s * n_ctx + p`` holds position ``p`` of sequence ``s``; a feed-forward half's entry
            is a 1-row f32 placeholder); a sliding-window block's is [n_seq * n_swa_cells, ...] when
            ``n_swa_cells`` (cell ``s * n_swa_cells + p - swa_offsets[s]``; ``model/swa.py``).
        n_swa_cells, n_swa, swa_offsets: the sliding-window split (``CacheTokens``), decided here:
            ``swa.swa_cells`` of the model's ``n_ctx``, ``n_batch`` and ``kv.swa_full``, where every
            segment's device can copy rows (the compaction's moves); 0 / [] otherwise.
        seq_tokens: per sequence, the ids at positions ``0 .. n_past - 1`` (their K/V are valid).
        n_ctx: positions per sequence; n_seq: sequences.
        recurrent: the recurrent layers' states (:class:`~cooktop.model.recurrent.RecurrentState`, one
            row per sequence on each recurrent block's device; those blocks' K/V entries are 1-row f32
            placeholders), or None for a model without recurrent layers. Such a cache cannot be cut
            back to any position: :meth:`truncate` goes back to a checkpoint (:meth:`checkpoint`) or to 0,
            and raises ``RecurrentStateError`` otherwise.
    """

    def __init__(self, model: Model, n_seq: int = 1):
        if n_seq < 1:
            raise CooktopError(f"a KV cache holds at least one sequence, not {n_seq}")
        self._model_key = model._key
        self.n_ctx, self.n_seq = model.n_ctx, n_seq
        self.seq_tokens: list[list[int]] = [[] for _ in range(n_seq)]
        self.k: list[list[DeviceTensor]] = []
        self.v: list[list[DeviceTensor]] = []
        self._releases: list[weakref.finalize] = []
        self._closed = False
        self.recurrent: RecurrentState | None = None
        cfg, arch = model.cfg, model.arch
        kv = model.kv
        B = swa.swa_cells(cfg, self.n_ctx, model.n_batch, kv.swa_full, (kv.type_k, kv.type_v))
        if B and all(seg.device.has_copy_rows for seg in model.segments):  # compaction moves rows (model/swa.py)
            self.n_swa_cells, self.n_swa, self.swa_offsets = B, cfg.n_swa, [0] * n_seq
        try:
            states = []
            own: dict[int, tuple[DeviceTensor, DeviceTensor, Device]] = {}  # block -> its K, V and device
            for seg in model.segments:
                d = seg.device.buffer("KV cache")
                self._releases.append(_releaser(self, d))
                ks, vs = [], []
                for i, part in zip(seg.blocks, seg.parts):
                    K = cfg.layer(i).n_embd_kv
                    if part == "ffn" or cfg.is_recurrent(i):  # feed-forward halves and recurrent blocks: no K/V
                        ks.append(d.zeros((1, K)))
                        vs.append(d.zeros((1, K)))
                    elif not cfg.has_kv(i):  # reads an earlier block's cache (gemma4's shared-KV layers)
                        src = cfg.kv_source(i)
                        if src not in own or own[src][2] is not seg.device:
                            raise CooktopError(f"block {i} reads the KV cache of block {src}, which is not "
                                               f"on its device ({seg.device.info.selector}); place them "
                                               "together")
                        ks.append(own[src][0])
                        vs.append(own[src][1])
                    else:
                        cells = n_seq * swa.kv_cells(cfg, i, self.n_ctx, self.n_swa_cells)
                        ks.append(d.zeros((cells, K), kv.type_k))
                        vs.append(d.zeros((cells, K), kv.type_v))
                        own[i] = (ks[-1], vs[-1], seg.device)
                self.k.append(ks)
                self.v.append(vs)
                if arch.state_widths is not None:
                    # a block's feed-forward half keeps no state (its attention half's segment does)
                    states.append((d, [() if part == "ffn" else arch.state_widths(cfg, i)
                                       for i, part in zip(seg.blocks, seg.parts)]))
            if arch.state_widths is not None:
                self.recurrent = RecurrentState(states, n_seq, model._lock)
        except BaseException:
            self.close()
            raise

    def states(self) -> list[list[tuple[DeviceTensor, ...] | None] | None]:
        """Per segment, the recurrent state of each of its blocks (None per segment without recurrent layers)."""
        if self.recurrent is None:
            return [None] * len(self.k)
        return list(self.recurrent.tensors)

    @property
    def state_bytes(self) -> int:
        """Bytes of the recurrent states on the devices (0 without recurrent layers)."""
        return self.recurrent.nbytes if self.recurrent is not None else 0

    def truncate(self, n: int, seq_id: int = 0) -> None:
        """Keep positions ``0 .. n - 1`` of sequence ``seq_id``. With recurrent layers the states go
        back too: cleared at 0, else restored from the checkpoint at ``n`` (:meth:`checkpoint`).

        Raises:
            RecurrentStateError: recurrent layers and no checkpoint at ``n`` (nothing is changed then).
        """
        if self.recurrent is not None and not self._closed:
            self.recurrent.truncate(seq_id, n, len(self.seq_tokens[seq_id]))
        super().truncate(n, seq_id)

    def reusable_prefix(self, n: int, seq_id: int = 0) -> int:
        """The longest prefix ``p <= n`` of ``seq_id`` that :meth:`truncate` can keep: ``n`` without
        recurrent layers, else the sequence's whole context, a checkpoint's position, or 0."""
        if self.recurrent is None:
            return super().reusable_prefix(n, seq_id)  # the sliding-window cells' limit (CacheTokens)
        return self.recurrent.reusable(seq_id, n, len(self.seq_tokens[seq_id]))

    def copy_state(self, src_seq: int, dst_seq: int, n: int) -> bool:
        """The recurrent states of ``src_seq`` after ``n`` tokens copied to ``dst_seq`` (its current
        ones, or its checkpoint at ``n``); False when it has neither. True without recurrent layers."""
        if self.recurrent is None:
            return True
        return self.recurrent.copy(src_seq, dst_seq, n, len(self.seq_tokens[src_seq]))

    @property
    def keeps_checkpoints(self) -> bool:  # type: ignore[override]
        """True with recurrent layers (``CacheTokens.keeps_checkpoints``)."""
        return self.recurrent is not None

    def checkpoint(self, seq_id: int = 0) -> int:
        """Keep the recurrent states of ``seq_id`` at its current position so that a later
        :meth:`truncate` (prefix reuse, a speculative rollback) can go back to it; returns that
        position. Without recurrent layers nothing is kept (every position can be gone back to)."""
        n = len(self.seq_tokens[seq_id])
        if self.recurrent is not None:
            self.recurrent.checkpoint(seq_id, n)
        return n

    def drop_checkpoint(self, pos: int, seq_id: int = 0) -> None:
        """Forget the checkpoint of ``seq_id`` at ``pos``, if any (``CacheTokens.drop_checkpoint``)."""
        if self.recurrent is not None:
            self.recurrent.checkpoints[seq_id].pop(pos, None)

    def _free(self) -> None:
        """Give the cache's device buffers back (each release runs once)."""
        for release in self._releases:
            release()


class Model(PlacedModel[KVCache]):
    """A loaded model placed on this machine's devices (weights and scratch buffers; KV caches
    apart): a :class:`~cooktop.model.placed.PlacedModel` whose segments are :class:`Segment` s.

    Args:
        gf: the opened GGUF; cfg: its config (``cfg.arch`` names the architecture).
        segments: ``(device, block indices, holds the head)`` per segment, in order
            (``Placement.segments()`` with each selector opened), or
            ``(device, block indices, holds the head, parts)`` (``Placement.units()``: halves of blocks).
        n_ctx: KV cache length of :meth:`new_cache` (tokens); n_batch: max tokens per :meth:`forward`.
        logits_all: keep logits of every position (else only the last).
        kv: the KV cache types and flash-attention choice (default :class:`~cooktop.format.kvtypes.KVConfig`);
            ``flash_attn`` is the resolved choice (``KVConfig.resolve``).
    Raises:
        KVTypeError: a cache type llama.cpp refuses with this model (see ``KVConfig.resolve``).
        UnsupportedOpError / DeviceOutOfMemoryError from the devices while uploading.
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, segments: list[tuple],
                 n_ctx: int, n_batch: int, logits_all: bool = False, kv: KVConfig | None = None):
        super().__init__(gf, cfg, n_ctx, n_batch, logits_all)
        self.kv = kv if kv is not None else KVConfig()
        self.flash_attn = self.kv.resolve(cfg.head_dim)
        self.segments: list[Segment] = []
        #: keep the output-normed hidden states of every evaluated row in each cache's ``hidden``
        #: (:class:`~cooktop.model.placed.HiddenRows`): set by a multi-token-prediction drafter
        self.record_hidden = False
        #: the LoRA adapters attached to the weights and their scales (``model/lora.py``; ``load_lora``)
        self.lora = LoraSet(self._lock)
        try:
            for device, blocks, head, *parts in segments:
                self.segments.append(Segment(device, blocks, head, gf, cfg, n_batch, logits_all, self.arch,
                                             parts[0] if parts else None))
                self.segments[-1].flash_attn = self.flash_attn
                self.segments[-1].lora = self.lora
        except BaseException:
            self.close()
            raise

    def _new_cache(self, n_seq: int) -> KVCache:
        return KVCache(self, n_seq)

    def load_lora(self, path: str, scale: float = 1.0) -> int:
        """Load the LoRA adapter ``path`` at ``scale`` (:meth:`LoraSet.load <cooktop.model.lora.LoraSet.load>`,
        which lists what it raises); returns its id."""
        self._check_open()
        return self.lora.load(self, path, scale)

    def _run(self, x: np.ndarray, rows: Rows, cache: KVCache, embeddings: bool) -> np.ndarray:
        """Each segment in turn, activations read back and written to the next device; one pass at a
        time (the lock: the segments' scratch buffers are shared by every caller)."""
        with self._lock:
            self._check_open()
            hidden = self.record_hidden
            for seg, k, v, st in zip(self.segments, cache.k, cache.v, cache.states()):
                x = seg.run(x, rows, k, v, embeddings, st, hidden)
            if hidden:
                self._record_hidden(cache, rows, self.segments[-1].hidden_out)
        return x

    def _record_hidden(self, cache: KVCache, rows: Rows, h: np.ndarray | None) -> None:
        """Keep the pass's normed rows ``h`` float32 [n, n_embd] in ``cache.hidden`` by sequence and position
        (each sequence's rows of a pass are consecutive positions)."""
        if h is None:
            return
        if cache.hidden is None:
            cache.hidden = HiddenRows(cache.n_seq, self.cfg.n_embd)
        seqs = rows.seqs if rows.seqs is not None else np.zeros(len(rows.pos), dtype=np.int32)
        for sid in np.unique(seqs):
            idx = np.flatnonzero(seqs == sid)
            cache.hidden.record(int(sid), int(rows.pos[idx[0]]), h[idx])

    @property
    def graph_uses_before_replay(self) -> int:
        """The largest ``Device.graph_uses_before_replay`` of the segments' devices."""
        return max((seg.device.graph_uses_before_replay for seg in self.segments), default=0)

    def _copy_cells(self, cache: KVCache, moves: list[tuple[int, int, int]], swa: bool | None = None) -> bool:
        """Each segment's device copies the cells of ``moves`` of every block keeping its own cache
        (``Device.copy_rows``; a feed-forward half, a recurrent block and a block reading another's
        cache have none), of the sliding-window ones only (``swa`` True) or of the others (False);
        under the lock, so in order with the forward passes (:meth:`PlacedModel._copy_cells`)."""
        with self._lock:
            self._check_open()
            for seg, ks, vs in zip(self.segments, cache.k, cache.v):
                for i, part, k, v in zip(seg.blocks, seg.parts, ks, vs):
                    if part == "ffn" or not self.cfg.has_kv(i) or (swa is not None and (i in seg.swa) != swa):
                        continue
                    try:
                        with seg.device.lock:  # in order with another model's passes on the device
                            for src, dst, n in moves:
                                seg.device.copy_rows(k, src, dst, n)
                                seg.device.copy_rows(v, src, dst, n)
                    except UnsupportedOpError:
                        return False
        return True

    def close(self) -> None:
        """Give the weights and scratch buffers back (devices stay open in the registry;
        each KV cache is given back by its owner). Idempotent."""
        with self._lock:
            self._closed = True
            for seg in self.segments:
                seg.release()
            self.segments.clear()
