"""What every placed model shares, wherever its segments run: :class:`PlacedModel`.

A placed model is a loaded model cut into segments (``runtime/placement.py``), each on one
device: :class:`~cooktop.model.forward.Model` runs them here (``model/forward.py``'s
``Segment``), the cluster's ``ClusterModel`` in Ray actors on other nodes
(``cluster/pipeline.py``). Both are what ``engine`` runs, through this one surface:
``new_cache``, ``forward``, ``forward_batch``, ``close``, ``cfg``, ``n_ctx``, ``n_batch``,
``logits_all``. This module holds all of it but how the segments run (:meth:`PlacedModel._run`)
and where a cache lives (:meth:`PlacedModel._new_cache`):

- the token embedding lookup (on the host, scaled as the architecture says),
- the rows of a pass (:class:`Rows`: positions, cache cells, the first cell each row attends
  to, output rows) for one sequence (:meth:`PlacedModel.forward`) or several sequences of one
  cache (:meth:`PlacedModel.forward_batch`; llama.cpp's unified KV cache: sequence ``s`` owns
  cells ``s * n_ctx .. (s + 1) * n_ctx - 1``, see ``model/forward.py``; the sliding-window layers'
  own cells and their compaction, ``model/swa.py``),
- the checks of a cache, its sequences and positions, and the token bookkeeping
  (:class:`CacheTokens`).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Generic, TypeVar

import numpy as np

from ..errors import CooktopError, SlidingWindowError
from ..format.gguf import GGUFFile
from ..format.quants import dequantize
from . import swa
from .arch import architecture
from .hparams import ModelConfig


@dataclasses.dataclass
class Rows:
    """Where the ``n`` rows of one forward pass go.

    Attributes:
        pos: int32 [n] positions (rope).
        cells: int32 [n] cache rows (None: the positions, one sequence).
        kv_start: int32 [n] first cache row each row attends to (None: 0).
        outputs: int32 [m] rows whose logits are returned (None: every row).
        n_ctx: positions per sequence (0: the cache's rows; one sequence).
        seqs: int32 [n] the sequence of each row (the recurrent state row it reads and updates;
            ``model/recurrent.py``); None: sequence 0.
        layer_inputs: float32 [n, n_layer, n_embd_per_layer] the per-layer token inputs of the rows
            (gemma4: ``Architecture.layer_inputs``, computed on the host beside the embedding); None: none.
        swa_cells: int32 [n] the rows' cells in the sliding-window layers' caches when those keep only
            their window (``model/swa.py``: ``s * B + pos - offset``); None: those layers use ``cells``.
        swa_kv_start: int32 [n] first sliding-window cell of each row (``s * B``); None: 0 (one sequence).
    """

    pos: np.ndarray
    cells: np.ndarray | None = None
    kv_start: np.ndarray | None = None
    outputs: np.ndarray | None = None
    n_ctx: int = 0
    seqs: np.ndarray | None = None
    layer_inputs: np.ndarray | None = None
    swa_cells: np.ndarray | None = None
    swa_kv_start: np.ndarray | None = None
    #: int32 [n] the last cache row each row attends to (a non-causal pass: the batch's last cell);
    #: None: causal, each row its own cell (``model/arch/base.py`` ``KV.attend_to``)
    attend_to: np.ndarray | None = None
    #: int32 [n] with ``attend_to``: the first row a sliding-window layer's row attends to (``KV.window_start``)
    window_start: np.ndarray | None = None
    #: int32 [n] ``attend_to`` and ``window_start`` in the sliding-window layers' cells (a split cache, a
    #: non-causal pass); None otherwise
    swa_attend_to: np.ndarray | None = None
    swa_window_start: np.ndarray | None = None


class HiddenRows:
    """The output-normed final hidden states of the rows a model evaluated into a cache, per sequence:
    what a multi-token-prediction draft reads (llama.cpp's ``h_nextn``, ``llama_get_embeddings_nextn``;
    src/models/qwen35.cpp). Kept only when the model records them (``Model.record_hidden``).

    Row ``p`` of sequence ``s`` is float32 [n_embd], the state after position ``p``; :attr:`valid`
    [s] counts the leading positions whose rows belong to the tokens the sequence holds now (a
    truncation lowers it, an evaluation from there raises it again).
    """

    def __init__(self, n_seq: int, n_embd: int):
        self.n_embd = n_embd
        self.rows = [np.zeros((0, n_embd), dtype=np.float32) for _ in range(n_seq)]
        self.valid = [0] * n_seq

    def record(self, seq_id: int, pos: int, rows: np.ndarray) -> None:
        """Keep ``rows`` float32 [k, n_embd] as positions ``pos .. pos + k - 1`` of ``seq_id``."""
        end = pos + len(rows)
        have = self.rows[seq_id]
        if have.shape[0] < end:
            grown = np.zeros((max(end, 2 * have.shape[0], 64), self.n_embd), dtype=np.float32)
            grown[:have.shape[0]] = have
            self.rows[seq_id] = have = grown
        have[pos:end] = rows
        if pos <= self.valid[seq_id]:
            self.valid[seq_id] = max(self.valid[seq_id], end)

    def truncate(self, seq_id: int, n: int) -> None:
        """Positions from ``n`` on no longer hold ``seq_id``'s rows."""
        self.valid[seq_id] = min(self.valid[seq_id], max(n, 0))

    def copy(self, src_seq: int, dst_seq: int, n: int) -> None:
        """The first ``n`` rows of ``src_seq`` (as far as valid) become ``dst_seq``'s."""
        k = min(n, self.valid[src_seq])
        self.valid[dst_seq] = 0
        if k:
            self.record(dst_seq, 0, self.rows[src_seq][:k])

    def get(self, seq_id: int, start: int, end: int) -> np.ndarray | None:
        """float32 [end - start, n_embd], the rows of positions ``start .. end - 1``; None when some
        of them are not :attr:`valid`."""
        if end > self.valid[seq_id] or start < 0:
            return None
        return self.rows[seq_id][start:end]


def lora_key(scales: list[float] | tuple[float, ...]) -> tuple[tuple[int, float], ...]:
    """The LoRA configuration of adapter ``scales`` (``model/lora.py``) as a comparable key: the
    ``(id, scale)`` of the adapters that apply (scale 0 adds nothing: no adapter and all at 0 are one key)."""
    return tuple((i, float(s)) for i, s in enumerate(scales) if s)


class CacheTokens:
    """What every KV cache of ``n_seq`` sequences keeps beside its K/V: the token ids each
    sequence holds, truncation and closing (``model.forward.KVCache``, the cluster's ``RemoteCache``).

    Subclasses set ``seq_tokens`` (per sequence, the ids at positions ``0 .. n_past - 1``),
    ``n_seq``, ``n_ctx``, ``_model_key`` (the making model's ``_key``) and ``_closed``, and
    free their K/V in :meth:`_free`.
    """

    seq_tokens: list[list[int]]
    n_seq: int
    n_ctx: int
    _model_key: object
    _closed: bool
    #: the final hidden states of the evaluated rows (:class:`HiddenRows`), when the model records them
    hidden: HiddenRows | None = None
    #: per sequence, the :func:`lora_key` its cached tokens were evaluated with (None: several);
    #: made on the first note (:meth:`note_lora`)
    _seq_lora: dict[int, tuple | None] | None = None
    #: cells per sequence of the sliding-window layers' K/V when they keep only their window
    #: (``model/swa.py``: ``swa_cells``); 0: every layer keeps ``n_ctx`` cells
    n_swa_cells: int = 0
    #: the sliding window (tokens) of those layers (0 when :attr:`n_swa_cells` is 0)
    n_swa: int = 0
    #: per sequence, the position its first sliding-window cell holds (``model/swa.py``; [] unsplit)
    swa_offsets: list[int] = []

    def swa_resumable(self, n: int, seq_id: int = 0) -> bool:
        """True when sequence ``seq_id`` can go back to ``n`` tokens as far as its sliding-window cells
        go (``model/swa.py``'s ``resumable``; always without a split cache)."""
        if not self.n_swa_cells or n >= len(self.seq_tokens[seq_id]):
            return True
        return swa.resumable(self.n_swa, self.swa_offsets[seq_id], n)

    def lora_of(self, seq_id: int = 0) -> tuple | None:
        """The :func:`lora_key` the cached tokens of ``seq_id`` were evaluated with (``()``: no adapter;
        None: evaluated under several, so reusable under none)."""
        return (self._seq_lora or {}).get(seq_id, ())

    def note_lora(self, seq_id: int, n_past: int, key: tuple) -> None:
        """Record that tokens from ``n_past`` on of ``seq_id`` were evaluated under LoRA ``key``."""
        if self._seq_lora is None:
            self._seq_lora = {}
        if n_past == 0:
            self._seq_lora[seq_id] = key
        elif self._seq_lora.get(seq_id, ()) != key:
            self._seq_lora[seq_id] = None

    @property
    def tokens(self) -> list[int]:
        """Sequence 0's ids (the one sequence of a cache made for one)."""
        return self.seq_tokens[0]

    @property
    def n_past(self) -> int:
        """Positions (tokens) of sequence 0 whose K/V the cache holds."""
        return len(self.seq_tokens[0])

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def truncate(self, n: int, seq_id: int = 0) -> None:
        """Keep positions ``0 .. n - 1`` of sequence ``seq_id`` (later cells are overwritten by the next forward).

        Raises:
            SlidingWindowError: the sliding-window layers no longer hold the window of position ``n``
                (:meth:`swa_resumable`; nothing is changed then: evaluate again from 0).
        """
        if not self.swa_resumable(n, seq_id):
            raise SlidingWindowError(
                f"sequence {seq_id}: cannot go back from {len(self.seq_tokens[seq_id])} to {n} tokens: the "
                f"sliding-window layers keep positions from {self.swa_offsets[seq_id]} on, and position {n} "
                f"needs the {self.n_swa - 1} before it (0 clears it; --swa-full keeps them all)")
        if self.n_swa_cells and n <= 0:
            self.swa_offsets[seq_id] = 0
        del self.seq_tokens[seq_id][max(n, 0):]
        if self.hidden is not None:
            self.hidden.truncate(seq_id, n)

    def reusable_prefix(self, n: int, seq_id: int = 0) -> int:
        """The longest prefix ``p <= n`` of sequence ``seq_id`` that :meth:`truncate` can keep: ``n``
        (at most its token count) for a cache of K/V that keeps every position, or 0 when its
        sliding-window layers no longer hold the window of ``n`` (:meth:`swa_resumable`); a cache with
        recurrent states (``model.forward.KVCache``) can go back only to a checkpoint, or to 0."""
        p = min(n, len(self.seq_tokens[seq_id]))
        return p if self.swa_resumable(p, seq_id) else 0

    #: True when :meth:`truncate` can go back only to checkpoints (a cache with recurrent states):
    #: ``Sequence.prefill`` then takes one before a prompt's last token, for the next prompt to reuse.
    keeps_checkpoints: bool = False

    def checkpoint(self, seq_id: int = 0) -> int:
        """Mark the current position of ``seq_id`` as one :meth:`truncate` can go back to; returns it.
        A cache of K/V can go back anywhere: nothing to keep (``model.forward.KVCache`` keeps its
        recurrent states)."""
        return len(self.seq_tokens[seq_id])

    def drop_checkpoint(self, pos: int, seq_id: int = 0) -> None:
        """Forget the checkpoint of ``seq_id`` at ``pos`` (a speculative step's, once its draft is
        settled), if there is one; a cache of K/V keeps none."""

    def copy_state(self, src_seq: int, dst_seq: int, n: int) -> bool:
        """Copy the state ``src_seq`` has after its first ``n`` tokens, beyond its K/V cells, to ``dst_seq``
        (:meth:`PlacedModel.copy_prefix`): True when there is none to copy (a cache of K/V only) or it
        was copied; False when it cannot be (a recurrent state with no checkpoint at ``n``)."""
        return True

    def close(self) -> None:
        """Free the K/V (:meth:`_free`) and forget the tokens. Idempotent; also runs when the cache is collected."""
        self._closed = True
        self._free()
        self.seq_tokens = [[] for _ in range(self.n_seq)]

    def _free(self) -> None:
        """Give the K/V back (once; later calls do nothing)."""


#: The cache type of a placed model.
C = TypeVar("C", bound=CacheTokens)


class PlacedModel(Generic[C]):
    """A model placed on segments (module doc): everything but how its segments run.

    Args:
        gf: the opened GGUF (the token embeddings are looked up in it, on the host);
            cfg: its config (``cfg.arch`` names the architecture).
        n_ctx: positions per sequence of :meth:`new_cache`; n_batch: max tokens per pass.
        n_decode, n_seq_decode: passes run (:meth:`forward` and :meth:`forward_batch` calls, llama.cpp's
            ``llama_decode`` count of the server's ``/metrics``) and the sequences they held in all.
        logits_all: keep logits of every position (else only the last).

    Subclasses implement :meth:`_new_cache`, :meth:`_run` and :meth:`close`.
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, n_ctx: int, n_batch: int, logits_all: bool = False):
        self.gf, self.cfg, self.arch = gf, cfg, architecture(cfg.arch)
        self.n_ctx, self.n_batch, self.logits_all = n_ctx, n_batch, logits_all
        self._key = object()  # identifies the caches made by this model
        self._lock = threading.Lock()
        self._closed = False
        self._embd = gf.tensor("token_embd.weight")
        self._host_cache: dict = {}  # what Architecture.layer_inputs keeps between passes (dequantized weights)
        self.n_decode = self.n_seq_decode = 0

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def new_cache(self, n_seq: int = 1) -> C:
        """A fresh (empty) KV cache for ``n_seq`` sequences, allocated where each segment runs:
        ``2 x n_layer`` buffers of [n_seq * n_ctx, n_head_kv * head_dim] (f32, or the cache types of
        the model's ``kv``: ``cooktop.format.kvtypes.KVConfig``); a sliding-window block's may hold
        ``n_seq`` windows instead (``model/swa.py``).

        Raises:
            CooktopError: the model is closed, or ``n_seq`` < 1.
            DeviceOutOfMemoryError: a cache buffer does not fit.
        """
        self._check_open()
        if n_seq < 1:
            raise CooktopError(f"a KV cache holds at least one sequence, not {n_seq}")
        return self._new_cache(n_seq)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Token embedding lookup on the host: float32 [n, n_embd] for int [n] ids, plus the LoRA
        adapters of the token embedding (``LoraSet.embed_delta``), times the architecture's
        ``embd_scale`` when it has one (gemma3)."""
        te = self._embd
        rows = np.asarray(te.data).reshape(te.shape[0], -1)[tokens]
        x = dequantize(rows, te.ggml_type, (len(tokens), te.shape[-1]))
        lora = getattr(self, "lora", None)
        if lora is not None and lora.embd:
            x = lora.embed_delta(np.asarray(tokens), x)
        if self.arch.embd_scale is not None:
            x = np.asarray(x, dtype=np.float32) * np.float32(self.arch.embd_scale(self.cfg))
        return x

    def layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        """The per-layer token inputs of ``tokens`` (int [n]) whose embeddings are ``x`` (float32
        [n, n_embd], :meth:`embed`): float32 [n, n_layer, n_embd_per_layer] by the architecture's
        ``layer_inputs`` (gemma4), or None when it has none."""
        if self.arch.layer_inputs is None or not self.cfg.n_embd_per_layer:
            return None
        return self.arch.layer_inputs(self.cfg, self.gf, tokens, x, self._host_cache)

    def forward(self, tokens: np.ndarray, n_past: int, cache: C, logits_all: bool | None = None,
                embeddings: bool = False, seq_id: int = 0, embd: np.ndarray | None = None,
                non_causal: bool = False) -> np.ndarray:
        """Evaluate ``n <= n_batch`` tokens of one sequence at positions ``n_past .. n_past + n - 1``.

        Writes their K/V into ``cache`` and sets the sequence's ids to its first ``n_past``
        followed by ``tokens`` (positions >= n_past are overwritten). Calls from
        several threads take turns.

        Args:
            tokens: int [n] token ids, each < n_vocab.
            n_past: positions of the sequence to keep, <= its n_past.
            cache: a cache made by this model's :meth:`new_cache`.
            logits_all: override of the model's setting for this call; True on a model loaded
                without it returns every row's logits through the output rows (as batches do).
            embeddings: return the output-normed hidden states instead of logits.
            seq_id: the sequence of ``cache`` (0 .. n_seq - 1).
            embd: float32 [n, n_embd] input embeddings in place of the tokens' (an image's, from
                ``cooktop.vision``; not scaled by the architecture's ``embd_scale``, as llama.cpp's gemma3
                graph scales token inputs only); ``tokens`` are then what the cache records for these
                positions (placeholder ids that match no text token).
            non_causal: every row attends to every row of this pass (and the cache before it):
                llama.cpp ``llama_set_causal_attn(false)``, mtmd's image batch (``Rows.attend_to``).
        Returns:
            float32 [n, n_vocab] when logits_all, else float32 [1, n_vocab] (last token);
            with ``embeddings``, float32 [n, n_embd].
        Raises:
            CooktopError: the model or the cache is closed, or the cache is another model's.
            ValueError: ``n``, ``n_past`` or ``seq_id`` out of range.
            ClusterError: (a cluster model) a segment died or did not answer; the model is then broken.
        """
        self._check_cache(cache)
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"forward takes 1..{self.n_batch} tokens, got {n}")
        self._check_item(cache, seq_id, n_past, n)
        la = self.logits_all if logits_all is None else (logits_all and self.logits_all)
        self.n_decode += 1
        self.n_seq_decode += 1
        ids = np.asarray(tokens, dtype=np.int64)
        if embd is not None:
            h = np.ascontiguousarray(embd, dtype=np.float32)
            if h.shape != (n, self.cfg.n_embd):
                raise ValueError(f"embd must be float32 [{n}, {self.cfg.n_embd}], not {list(h.shape)}")
            if self.arch.layer_inputs is not None and self.cfg.n_embd_per_layer:
                raise CooktopError(f"{self.cfg.arch}: input embeddings with per-layer token inputs are not supported")
            layer_in = None
        else:
            h = self.embed(ids)
            layer_in = self.layer_inputs(ids, h)
        pos = np.arange(n_past, n_past + n, dtype=np.int32)
        out_rows = np.arange(n, dtype=np.int32) if logits_all else np.array([n - 1], dtype=np.int32)
        rows = Rows(pos, outputs=None if la else out_rows, n_ctx=self.n_ctx,
                    seqs=np.full(n, seq_id, dtype=np.int32), layer_inputs=layer_in)
        if seq_id:
            rows.cells = pos + np.int32(seq_id * self.n_ctx)
            rows.kv_start = np.full(n, seq_id * self.n_ctx, dtype=np.int32)
        if non_causal:
            cells = pos + np.int32(seq_id * self.n_ctx)
            rows.attend_to = np.full(n, cells[-1], dtype=np.int32)
            if self.cfg.n_swa:
                rows.window_start = np.maximum(cells - np.int32(self.cfg.n_swa - 1),
                                               np.int32(seq_id * self.n_ctx)).astype(np.int32)
        cache.truncate(n_past, seq_id)  # rows from n_past on are about to be overwritten
        if cache.n_swa_cells:  # the sliding-window layers' cells (model/swa.py)
            self._swa_room(cache, seq_id, n_past, n)
            rows.swa_cells = self._swa_cells(cache, seq_id, pos)
            if seq_id:
                rows.swa_kv_start = np.full(n, seq_id * cache.n_swa_cells, dtype=np.int32)
            if non_causal:  # the same rows in the window cells (offsets keep the distances)
                rows.swa_attend_to = np.full(n, rows.swa_cells[-1], dtype=np.int32)
                rows.swa_window_start = np.maximum(rows.swa_cells - np.int32(self.cfg.n_swa - 1),
                                                   np.int32(seq_id * cache.n_swa_cells)).astype(np.int32)
        key = self.lora_key()
        h = self._run(h, rows, cache, embeddings)
        cache.seq_tokens[seq_id].extend(int(t) for t in ids)
        cache.note_lora(seq_id, n_past, key)
        return h

    def lora_scales(self) -> list[float]:
        """The scales of the model's LoRA adapters now (``model/lora.py``; ``[]``: none, or a cluster)."""
        lora = getattr(self, "lora", None)
        return list(lora.scales) if lora is not None else []

    def lora_key(self) -> tuple:
        """:func:`lora_key` of :meth:`lora_scales`."""
        return lora_key(self.lora_scales())

    def use_lora(self, scales: list[float] | None) -> None:
        """Set the adapters' scales to ``scales`` (one per adapter) before a pass; None: leave them.

        Raises:
            CooktopError: ``scales`` do not fit the adapters (``LoraSet.set_scales``).
        """
        lora = getattr(self, "lora", None)
        if scales is None or (lora is None and not scales):
            return
        if lora is None:
            raise CooktopError("LoRA scales given for a model without LoRA adapters")
        if list(lora.scales) != list(scales):
            lora.set_scales(list(scales))

    def forward_batch(self, cache: C, items: list[tuple[int, int, list[int], bool | int]]) -> list[np.ndarray | None]:
        """Evaluate tokens of several sequences of ``cache`` in one pass (at most ``n_batch`` in all).

        Each item ``(seq_id, n_past, tokens, want_logits)`` appends ``tokens`` to sequence
        ``seq_id`` at positions ``n_past ..`` (as :meth:`forward` does; its ids are updated).
        A sequence appears at most once.

        Returns:
            per item: float32 [1, n_vocab] logits of its last token when ``want_logits`` is True,
            float32 [k, n_vocab] of its last ``k`` tokens when it is an int ``k`` >= 1 (a
            speculative draft's rows), else None.
        Raises:
            as :meth:`forward`; ValueError: no tokens, more than ``n_batch``, a sequence twice,
            or an item out of range.
        """
        self._check_cache(cache)
        n = sum(len(t) for _, _, t, _ in items)
        if not 0 < n <= self.n_batch or any(not t for _, _, t, _ in items):
            raise ValueError(f"forward_batch takes 1..{self.n_batch} tokens, at least one per item, got {n}")
        if len({s for s, _, _, _ in items}) != len(items):
            raise ValueError("forward_batch: a sequence appears twice in one batch")
        for seq_id, n_past, toks, _ in items:
            self._check_item(cache, seq_id, n_past, len(toks))
        self.n_decode += 1
        self.n_seq_decode += len(items)
        ids = np.concatenate([np.asarray(t, dtype=np.int64) for _, _, t, _ in items])
        pos = np.concatenate([np.arange(p, p + len(t), dtype=np.int32) for _, p, t, _ in items])
        base = np.concatenate([np.full(len(t), s * self.n_ctx, dtype=np.int32) for s, _, t, _ in items])
        ends = np.cumsum([len(t) for _, _, t, _ in items]) - 1
        n_out = [0 if not w else 1 if w is True else min(int(w), len(t)) for _, _, t, w in items]
        want = [i for i, k in enumerate(n_out) if k]
        outputs = (np.concatenate([np.arange(ends[i] - n_out[i] + 1, ends[i] + 1) for i in want]).astype(np.int32)
                   if want else np.array([n - 1], dtype=np.int32))
        seqs = np.concatenate([np.full(len(t), s, dtype=np.int32) for s, _, t, _ in items])
        rows = Rows(pos, pos + base, base, outputs, self.n_ctx, seqs)
        for seq_id, n_past, _, _ in items:
            cache.truncate(n_past, seq_id)
        if cache.n_swa_cells:  # the sliding-window layers' cells (model/swa.py)
            for seq_id, n_past, toks, _ in items:
                self._swa_room(cache, seq_id, n_past, len(toks))
            rows.swa_cells = np.concatenate([self._swa_cells(cache, s, np.arange(p, p + len(t), dtype=np.int32))
                                             for s, p, t, _ in items])
            rows.swa_kv_start = np.concatenate([np.full(len(t), s * cache.n_swa_cells, dtype=np.int32)
                                                for s, _, t, _ in items])
        h = self.embed(ids)
        rows.layer_inputs = self.layer_inputs(ids, h)
        key = self.lora_key()
        logits = self._run(h, rows, cache, False)
        for seq_id, n_past, toks, _ in items:
            cache.seq_tokens[seq_id].extend(int(t) for t in toks)
            cache.note_lora(seq_id, n_past, key)
        out: list[np.ndarray | None] = [None] * len(items)
        j = 0
        for i in want:
            out[i] = logits[j:j + n_out[i]]
            j += n_out[i]
        return out

    def copy_prefix(self, cache: C, src_seq: int, dst_seq: int, n: int) -> bool:
        """Make sequence ``dst_seq`` of ``cache`` hold the first ``n`` tokens of ``src_seq`` by copying
        their K/V cells on the devices (llama.cpp's ``llama_memory_seq_cp``): a shared prefix (a
        system prompt) is not evaluated again. The cells are copied bytes, so what is evaluated after
        them gives the logits it gives after ``src_seq``'s own prefix. Ordered with the forward passes
        (the model's lock); ``src_seq`` is unchanged.

        Returns:
            True when copied; False when a device of the model cannot copy rows (a cluster; Vulkan rows of
            other than whole 32-bit words),
            or ``src_seq`` has no recurrent state at ``n`` (``CacheTokens.copy_state``): ``dst_seq`` is
            then empty and the caller evaluates the prefix itself.
        Raises:
            CooktopError: the model or the cache is closed, or the cache is another model's.
            ValueError: a sequence outside the cache, ``src_seq == dst_seq``, or ``n`` outside
            ``0 .. len(src_seq's tokens)``.
        """
        self._check_cache(cache)
        for s in (src_seq, dst_seq):
            if not 0 <= s < cache.n_seq:
                raise ValueError(f"seq_id {s} is outside the cache's 0..{cache.n_seq - 1} sequences")
        if src_seq == dst_seq:
            raise ValueError("copy_prefix: the source and the destination are one sequence")
        have = len(cache.seq_tokens[src_seq])
        if not 0 <= n <= have:
            raise ValueError(f"copy_prefix: {n} tokens asked of a sequence holding {have}")
        cache.truncate(0, dst_seq)
        if n == 0:
            return True
        if not cache.swa_resumable(n, src_seq) or not cache.copy_state(src_seq, dst_seq, n):
            return False
        B = cache.n_swa_cells
        if B:  # the other layers' n cells, and the sliding-window cells of positions offset .. n - 1
            o = cache.swa_offsets[src_seq]
            ok = self._copy_cells(cache, [(src_seq * self.n_ctx, dst_seq * self.n_ctx, n)], swa=False) and \
                self._copy_cells(cache, [(src_seq * B, dst_seq * B, n - o)], swa=True)
            cache.swa_offsets[dst_seq] = o
        else:
            ok = self._copy_cells(cache, [(src_seq * self.n_ctx, dst_seq * self.n_ctx, n)])
        if not ok:
            cache.truncate(0, dst_seq)
            return False
        cache.seq_tokens[dst_seq].extend(cache.seq_tokens[src_seq][:n])
        cache.note_lora(dst_seq, 0, cache.lora_of(src_seq))  # type: ignore[arg-type]
        if cache.hidden is not None:
            cache.hidden.copy(src_seq, dst_seq, n)
        return True

    def _swa_room(self, cache: C, seq_id: int, n_past: int, n: int) -> None:
        """Make room for ``n`` rows at ``n_past`` in the sliding-window cells of ``seq_id`` (a split
        cache: ``model/swa.py``'s ``compaction``): the rows its window still needs move to the front of
        its cells (:meth:`_copy_cells` of the sliding-window blocks) and its offset advances.

        Raises:
            CooktopError: a device cannot copy rows (a cache splits only where every device can).
        """
        B = cache.n_swa_cells
        new, moves = swa.compaction(cache.n_swa, B, cache.swa_offsets[seq_id], n_past, n)
        if not moves:
            return
        base = seq_id * B
        if not self._copy_cells(cache, [(base + a, base + b, k) for a, b, k in moves], swa=True):
            raise CooktopError("the sliding-window cache could not move its rows on this device; load the model "
                               "with swa_full (--swa-full)")
        cache.swa_offsets[seq_id] = new

    @staticmethod
    def _swa_cells(cache: C, seq_id: int, pos: np.ndarray) -> np.ndarray:
        """int32 [n]: the sliding-window cells of positions ``pos`` of ``seq_id`` (``s * B + pos - offset``)."""
        return (pos + np.int32(seq_id * cache.n_swa_cells - cache.swa_offsets[seq_id])).astype(np.int32)

    def _copy_cells(self, cache: C, moves: list[tuple[int, int, int]], swa: bool | None = None) -> bool:
        """Copy, for each ``(src, dst, n)`` of ``moves`` in order, cells ``src .. src + n - 1`` of the K and
        V of the blocks that keep their own cache to ``dst ..`` (each pair of ranges disjoint): every
        such block (``swa`` None), the sliding-window ones (True) or the others (False; a split cache,
        ``model/swa.py``). False (maybe partly copied) where a device cannot. Default: False."""
        return False

    @property
    def graph_uses_before_replay(self) -> int:
        """The most times a pass of one shape runs its ops on a device of this model before that
        device replays it (``Device.graph_uses_before_replay``; 0: none replays). Default 0."""
        return 0

    def _new_cache(self, n_seq: int) -> C:
        """An empty cache of ``n_seq`` (>= 1) sequences where the segments run."""
        raise NotImplementedError

    def _run(self, x: np.ndarray, rows: Rows, cache: C, embeddings: bool) -> np.ndarray:
        """Run every segment in order on the embedded rows ``x`` float32 [n, n_embd]: what the
        last one returns (logits float32 [m, n_vocab], or float32 [n, n_embd] with ``embeddings``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Give back what the segments hold (each cache is given back by its owner). Idempotent."""
        raise NotImplementedError

    def _check_cache(self, cache: C) -> None:
        self._check_open()
        if getattr(cache, "_model_key", None) is not self._key:
            raise CooktopError("this KV cache was made by another model; use model.new_cache()")
        if cache.closed:
            raise CooktopError("this KV cache is closed")

    def _check_item(self, cache: C, seq_id: int, n_past: int, n: int) -> None:
        if not 0 <= seq_id < cache.n_seq:
            raise ValueError(f"seq_id {seq_id} is outside the cache's 0..{cache.n_seq - 1} sequences")
        have = len(cache.seq_tokens[seq_id])
        if not 0 <= n_past <= have:
            raise ValueError(f"n_past {n_past} is outside the cache's 0..{have} positions")
        if n_past + n > self.n_ctx:
            raise ValueError(f"positions {n_past}..{n_past + n - 1} exceed n_ctx {self.n_ctx}")

    def _check_open(self) -> None:
        if self._closed:
            raise CooktopError("the model is closed (close() was called); load it again")
