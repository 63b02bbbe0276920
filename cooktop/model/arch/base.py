"""What an architecture descriptor is: its tensors (:class:`TensorSpec`) and :class:`Architecture`.

A descriptor says, as data and code, what llama.cpp spreads over ``src/llama-arch.cpp`` (tensor
names), ``llama_model_<arch>::load_arch_hparams`` / ``load_arch_tensors``
(src/models/<arch>.cpp: hyper-parameters, tensor shapes, required or not) and the
graph builder of the same file (the block as a sequence of ops). Everything that
depends on the tensor set reads it from here: config validation
(``model/config.py``), the forward pass (``model/forward.py``), placement and the
memory budget (``runtime/``) and synthetic models (``tools/synth.py``).

Tensor names follow llama.cpp: ``blk.{i}.attn_q.weight`` for block ``i``. Block code
reads a unit's weights from a dict keyed by the name without ``blk.{i}.`` and
without ``.weight``: ``w["attn_q"]``, ``w["attn_q.bias"]``, ``w["output"]``. An
optional tensor that the file lacks is simply not in the dict, so its op is skipped
(``if "attn_q.bias" in w: ...``); a tied tensor (``output`` -> ``token_embd``) is
the tensor it is tied to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Iterator
from types import SimpleNamespace
from typing import Any

from ...backends.base import Device, DeviceTensor
from ..hparams import Metadata, ModelConfig

#: Tensor kinds: a matrix is uploaded in its GGML type and used by matmul (or get_rows);
#: a norm or bias weight (1-D) is uploaded as float32 (dequantized on the host if need be).
MATRIX, NORM, BIAS = "matrix", "norm", "bias"

#: Units a tensor belongs to: the token embedding (looked up on the host), a repeating
#: block (placed block by block) or the output head (placed as one unit).
INPUT, BLOCK, HEAD = "input", "block", "head"

#: A unit's weights on its device: key (name without ``blk.{i}.`` and ``.weight``) -> tensor.
Weights = dict[str, DeviceTensor]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor an architecture reads (llama.cpp ``create_tensor`` in ``load_arch_tensors``).

    Attributes:
        name: GGUF name; ``{i}`` stands for the block index (``blk.{i}.attn_q.weight``).
            A name with ``{i}`` is per block; one without it is global.
        shape: numpy-order shape ``[n_out, n_in]`` (GGUF ``ne`` reversed) from the config.
        unit: :data:`INPUT`, :data:`BLOCK` or :data:`HEAD` (a global tensor with unit
            BLOCK, such as ``rope_freqs``, is shared by every block).
        kind: :data:`MATRIX`, :data:`NORM` or :data:`BIAS`.
        required: False for llama.cpp's ``TENSOR_NOT_REQUIRED``: the file may lack it.
        tied_to: name used in its place when the file lacks it (``output`` -> ``token_embd``,
            llama.cpp's ``TENSOR_DUPLICATED``).
        parts: a fused matrix (phi3's ``attn_qkv``, ``ffn_up``): ``(key, rows(cfg))`` of each
            consecutive row range, in order. The segment uploads each range as its own weight
            under its key (``w["attn_q"]``...), not the fused tensor: a GGML row is contiguous
            (``row_bytes`` each, quantized or not), so a row range is a plain slice of the file
            and every op, kernel and device works on it unchanged. llama.cpp instead multiplies
            by the whole fused weight and views column ranges of the product
            (``build_qkv``, ``ggml_swiglu``); each output value is the same dot product.
    """

    name: str
    shape: Callable[[ModelConfig], tuple[int, ...]]
    unit: str = BLOCK
    kind: str = MATRIX
    required: bool = True
    tied_to: str | None = None
    parts: tuple[tuple[str, Callable[[ModelConfig], int]], ...] = ()

    @property
    def per_block(self) -> bool:
        """True when the name carries the block index (``blk.{i}.``)."""
        return "{i}" in self.name

    @property
    def key(self) -> str:
        """The block code's name for it: ``blk.{i}.attn_q.weight`` -> ``attn_q``, ``blk.{i}.attn_q.bias`` ->
        ``attn_q.bias``, ``output.weight`` -> ``output``."""
        key = self.name.removeprefix("blk.{i}.")
        return key.removesuffix(".weight")

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys the block code reads this tensor under: its :attr:`parts`' keys, else :attr:`key`."""
        return tuple(k for k, _ in self.parts) or (self.key,)

    def part_rows(self, cfg: ModelConfig) -> list[tuple[str, int, int]]:
        """``(key, first row, end row)`` of each of :attr:`parts` for a model of ``cfg``."""
        out, a = [], 0
        for key, rows in self.parts:
            n = int(rows(cfg))
            out.append((key, a, a + n))
            a += n
        return out

    def gguf_name(self, i: int | None = None) -> str:
        """The tensor's name in the file (for block ``i`` when per block)."""
        return self.name.format(i=i) if self.per_block else self.name


def matrix(name: str, shape: Callable[[ModelConfig], tuple[int, ...]], **kw: Any) -> TensorSpec:
    """A :data:`MATRIX` tensor (see :class:`TensorSpec` for ``kw``)."""
    return TensorSpec(name, shape, kind=MATRIX, **kw)


def norm(name: str, shape: Callable[[ModelConfig], tuple[int, ...]], **kw: Any) -> TensorSpec:
    """A :data:`NORM` weight, uploaded as float32."""
    return TensorSpec(name, shape, kind=NORM, **kw)


def bias(name: str, shape: Callable[[ModelConfig], tuple[int, ...]], **kw: Any) -> TensorSpec:
    """A :data:`BIAS`, uploaded as float32; usually optional (``required=False``)."""
    return TensorSpec(name, shape, kind=BIAS, **kw)


@dataclasses.dataclass(frozen=True)
class KV:
    """What a block reads and writes of the KV cache for the ``n`` rows it runs.

    The rows may belong to several sequences sharing one cache (llama.cpp's unified KV
    cache: sequence ``s`` owns cache rows ``s * n_ctx .. (s + 1) * n_ctx - 1``, see
    ``model/forward.py``), so a row's rope position and its cache row (cell) differ.

    Attributes:
        k, v: this block's cache, f32 [n_cells, n_embd_kv].
        pos: I32 [n] positions (what rope rotates by).
        cells: I32 [n] cache rows the rows' K/V go to (``pos`` itself for one sequence).
        kv_start: I32 [n] first cache row each row attends to (its sequence's first cell),
            or None when every row starts at row 0 (one sequence).
        n_ctx: positions per sequence (the context length; phi3's LongRoPE choice reads it).
    """

    k: DeviceTensor
    v: DeviceTensor
    pos: DeviceTensor
    cells: DeviceTensor
    kv_start: DeviceTensor | None = None
    n_ctx: int = 0

    def attend(self, d: Device, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor,
               n_head: int, n_head_kv: int, scale: float, window: int = 0) -> None:
        """Store the rows' ``k``, ``v`` (f32 [n, n_embd_kv]) in their cells, then
        ``out f32 [n, n_head * head_dim] = attention(q)`` over each row's own sequence
        (causal, GQA, ``window`` > 0: sliding window; ops ``kv_store`` and ``attention``)."""
        d.kv_store(self.k, k, self.cells)
        d.kv_store(self.v, v, self.cells)
        d.attention(out, q, self.k, self.v, self.cells, n_head, n_head_kv, scale, window, kv_start=self.kv_start)


#: ``block(d, cfg, w, s, kv)``: enqueue one block on the ``n`` rows of ``s`` (``kv``: :class:`KV`,
#: positions and this block's cache; blocks rotate by ``kv.pos`` and attend with ``kv.attend``);
#: ``s.il`` is the block's index in the model (per-layer choices: gemma3's sliding-window layers).
BlockFn = Callable[[Device, ModelConfig, Weights, SimpleNamespace, KV], None]
#: ``final_norm(d, cfg, w, xn, x)``: enqueue ``xn = norm(x)`` on the rows leaving the last block
#: (llama.cpp's ``result_norm``: what embeddings pool, and the input of :data:`HeadFn`).
NormFn = Callable[[Device, ModelConfig, Weights, DeviceTensor, DeviceTensor], None]
#: ``lm_head(d, cfg, w, logits, xn)``: enqueue ``logits = output(xn)`` (llama.cpp's ``result_output``).
HeadFn = Callable[[Device, ModelConfig, Weights, DeviceTensor, DeviceTensor], None]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One ``general.architecture``: hyper-parameters, tensors, rope mode, block and head.

    Attributes:
        name: ``general.architecture`` (llama.cpp ``LLM_ARCH_*`` name).
        tensors: every tensor it reads, global ones first, in file order.
        rope_mode: ggml rope mode (``backends.base.ROPE_NORMAL`` / ``ROPE_NEOX``).
        hparams: ``hparams(m: Metadata) -> {ModelConfig field: value}``: the keys llama.cpp
            reads in ``load_arch_hparams`` (the shared ones are read by ``load_config``).
        scratch: ``scratch(cfg) -> {name: row width}``: the float32 ``[n_batch, width]``
            buffers a segment allocates for :attr:`block` (``x``, the residual stream, and
            ``xn`` of width n_embd are required: the head uses them).
        block: :data:`BlockFn`: one repeating block, ops enqueued on ``d``; ``s`` holds
            the scratch buffers cut to the chunk's rows (``s.x`` in and out); ``kv`` (:class:`KV`)
            the positions and the block's cache: rotate by ``kv.pos``, store and attend with
            ``kv.attend`` (the rows may be several sequences': never assume ``pos`` is a cache row).
        final_norm: :data:`NormFn`: the output norm, rows f32 [r, n_embd] (``xn`` may be ``x``).
        lm_head: :data:`HeadFn`: normed rows ``xn`` f32 [r, n_embd] -> ``logits`` f32 [r, n_vocab].
        block_ops, head_ops: the backend ops (``backends.base.OPS`` names) :attr:`block` /
            the head (:attr:`final_norm`, :attr:`lm_head`) may call, optional tensors included
            (the head's include ``get_rows``, with which the segment picks the last row):
            placement keeps a unit on the host when its device lacks one (``runtime/placement.py``).
        embd_scale: ``embd_scale(cfg) -> float``: factor of the token embeddings looked up on the
            host (gemma3: ``sqrt(n_embd)`` in float32, llama.cpp ``ggml_scale(inpL, sqrtf(n_embd))``);
            None: unscaled.
        scratch_i32: ``scratch_i32(cfg) -> {name: row width}``: I32 ``[n_batch, width]`` buffers
            (the selected experts of MoE blocks); None: none.
        block_attn, block_ffn: the block cut in two at the residual stream, for placements that
            run a block's feed-forward (its experts) on another device than its attention
            (``--n-cpu-moe``, ``-ot``): ``block_attn(d, cfg, w, s, kv)`` adds attention to ``s.x``,
            ``block_ffn(d, cfg, w, s)`` adds the feed-forward; running both is :attr:`block`.
            None: the block is placed whole.
        attn_ops, ffn_ops: the ops of each half (placement checks each half's device).
        ffn_keys: keys of the feed-forward half's tensors beyond those starting with ``ffn_``
            (gpt-oss's ``post_attention_norm``, its pre-FFN norm).
    """

    name: str
    tensors: tuple[TensorSpec, ...]
    rope_mode: int
    hparams: Callable[[Metadata], dict[str, Any]]
    scratch: Callable[[ModelConfig], dict[str, int]]
    block: BlockFn
    final_norm: NormFn
    lm_head: HeadFn
    block_ops: tuple[str, ...]
    head_ops: tuple[str, ...]
    embd_scale: Callable[[ModelConfig], float] | None = None
    scratch_i32: Callable[[ModelConfig], dict[str, int]] | None = None
    block_attn: BlockFn | None = None
    block_ffn: Callable[[Device, ModelConfig, Weights, SimpleNamespace], None] | None = None
    attn_ops: tuple[str, ...] = ()
    ffn_ops: tuple[str, ...] = ()
    ffn_keys: tuple[str, ...] = ()

    def is_ffn(self, key: str) -> bool:
        """True when the tensor of block key ``key`` belongs to the feed-forward half."""
        return key.startswith("ffn_") or key in self.ffn_keys

    def ops_of(self, unit: int | str, part: str = "all") -> tuple[str, ...]:
        """The ops of block ``unit``'s ``part`` (``all``, ``attn``, ``ffn``) or of the head."""
        if isinstance(unit, int) and part != "all":
            return self.attn_ops if part == "attn" else self.ffn_ops
        return self.ops(unit)

    def __post_init__(self) -> None:
        keys = [(s.unit, k) for s in self.tensors for k in {s.key, *s.keys}]
        if len(set(keys)) != len(keys):
            raise ValueError(f"architecture {self.name}: two tensors share a key in one unit")

    def ops(self, unit: int | str) -> tuple[str, ...]:
        """The backend ops block ``unit`` (an int) or the ``HEAD`` runs."""
        return self.block_ops if isinstance(unit, int) else self.head_ops

    def spec(self, name: str) -> TensorSpec | None:
        """The spec of GGUF tensor ``name`` (``blk.3.attn_q.weight`` matches ``blk.{i}.attn_q.weight``),
        or None when the architecture does not read it. Block index range is not checked here."""
        if name.startswith("blk."):
            idx, _, rest = name[4:].partition(".")
            if idx.isdigit():
                name = "blk.{i}." + rest
        for s in self.tensors:
            if s.name == name:
                return s
        return None

    def unit_tensors(self, present: Container[str], unit: int | str, part: str = "all"
                     ) -> dict[str, tuple[str, TensorSpec]]:
        """The tensors of block ``unit`` (an int) or of ``HEAD`` / ``INPUT`` that the file has.

        Args:
            present: the file's tensor names.
            part: ``all``, or one half of a block: ``attn`` / ``ffn`` (:meth:`is_ffn`).
        Returns:
            key -> (GGUF name, spec); an absent optional tensor is left out, a tied one
            names the tensor it is tied to.
        """
        kind = BLOCK if isinstance(unit, int) else unit
        i = unit if isinstance(unit, int) else None
        out: dict[str, tuple[str, TensorSpec]] = {}
        for s in self.tensors:
            if s.unit != kind:
                continue
            if part != "all" and s.per_block and self.is_ffn(s.key) != (part == "ffn"):
                continue
            name = s.gguf_name(i)
            if name not in present:
                if s.tied_to is None or s.tied_to not in present:
                    continue  # optional and absent (a missing required one is load_config's error)
                name = s.tied_to
            out[s.key] = (name, s)
        return out

    def expected(self, cfg: ModelConfig) -> Iterator[tuple[str, TensorSpec]]:
        """(GGUF name, spec) of every tensor of a model of ``cfg``, lazily (a corrupt
        block_count must not build a huge list): global tensors, then block by block."""
        for s in self.tensors:
            if not s.per_block:
                yield s.name, s
        for i in range(cfg.n_layer):
            for s in self.tensors:
                if s.per_block:
                    yield s.gguf_name(i), s
