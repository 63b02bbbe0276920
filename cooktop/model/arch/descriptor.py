"""The architecture descriptor (:class:`Architecture`) and the ops it runs, derived from its code.

A descriptor is data (name, tensors, rope mode, hyper-parameter reader) and code (the block,
the output norm, the LM head, built of ``builders.py``'s pieces). The backend ops a unit runs
are not declared beside the code: :meth:`Architecture.ops` runs the unit's code once on an
:class:`OpRecorder`, a stand-in device that notes each op called, so placement
(``runtime/placement.py``) sees exactly what the segment will call, and a new architecture
cannot forget one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Iterator
from types import SimpleNamespace
from typing import Any

from ...backends.base import Device, DeviceTensor
from ..hparams import Metadata, ModelConfig
from . import builders
from .base import BLOCK, HEAD, KV, TensorSpec, Weights

#: ``block(d, cfg, w, s, kv, il)``: enqueue block ``il`` (its index in the model) on the ``n`` rows
#: of ``s`` (``kv``: :class:`~.base.KV`, positions and this block's cache; blocks rotate by
#: ``kv.pos`` and attend with ``kv.attend``).
BlockFn = Callable[[Device, ModelConfig, Weights, SimpleNamespace, KV, int], None]
#: ``block_ffn(d, cfg, w, s, il)``: the feed-forward half of block ``il`` (no cache: ``x += ffn(norm(x))``).
FfnFn = Callable[[Device, ModelConfig, Weights, SimpleNamespace, int], None]
#: Parts of a block placement runs (``Architecture.ops`` / ``unit_tensors``): the whole block, or
#: one of its halves (attention, feed-forward) when the architecture has them.
ALL, ATTN, FFN = "all", "attn", "ffn"
#: ``final_norm(d, cfg, w, xn, x)``: enqueue ``xn = norm(x)`` on the rows leaving the last block
#: (llama.cpp's ``result_norm``: what embeddings pool, and the input of :data:`HeadFn`).
NormFn = Callable[[Device, ModelConfig, Weights, DeviceTensor, DeviceTensor], None]
#: ``lm_head(d, cfg, w, logits, xn)``: enqueue ``logits = output(xn)`` (llama.cpp's ``result_output``).
HeadFn = Callable[[Device, ModelConfig, Weights, DeviceTensor, DeviceTensor], None]


#: Device methods made of ops of the table, noted as those ops (``Device.matmuls``: matmuls of one
#: input; ``Device.rope_store``: rope, then kv_store).
_COMPOSITE: dict[str, tuple[str, ...]] = {"matmuls": ("matmul",), "rope_store": ("rope", "kv_store")}


class OpRecorder:
    """A stand-in :class:`~cooktop.backends.base.Device` that runs nothing: every method called on
    it is noted by name, in first-call order (:attr:`ops`). Arguments are not looked at, so a
    block runs on it with placeholders for its tensors."""

    def __init__(self) -> None:
        self._seen: dict[str, None] = {}

    @property
    def ops(self) -> tuple[str, ...]:
        """The op names called so far, each once, in first-call order."""
        return tuple(self._seen)

    def __getattr__(self, op: str) -> Callable[..., None]:
        if op.startswith("_"):
            raise AttributeError(op)
        names = _COMPOSITE.get(op, (op,))

        def record(*args: Any, **kwargs: Any) -> None:
            for name in names:
                self._seen[name] = None

        return record


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One ``general.architecture``: hyper-parameters, tensors, rope mode, block and head.

    Attributes:
        name: ``general.architecture`` (llama.cpp ``LLM_ARCH_*`` name).
        tensors: every tensor it reads, global ones first, in file order (``skeleton.llama_tensors``).
        rope_mode: ggml rope mode (``backends.base.ROPE_NORMAL`` / ``ROPE_NEOX``).
        hparams: ``hparams(m: Metadata) -> {ModelConfig field: value}``: the keys llama.cpp
            reads in ``load_arch_hparams`` (the shared ones are read by ``load_config``).
        block: :data:`BlockFn`: one repeating block, ops enqueued on ``d``; ``s`` holds the
            scratch buffers cut to the chunk's rows (``s.x`` in and out); ``kv`` (:class:`~.base.KV`)
            the positions and the block's cache: rotate by ``kv.pos``, store and attend with
            ``kv.attend`` (the rows may be several sequences': never assume ``pos`` is a cache row);
            ``il`` the block's index (per-layer choices: gemma3's sliding-window layers).
        scratch: ``scratch(cfg) -> {name: row width}``: the float32 ``[n_batch, width]``
            buffers a segment allocates for :attr:`block` (``x``, the residual stream, and
            ``xn`` of width n_embd are required: the head uses them). Default: the builders'.
        final_norm: :data:`NormFn`: the output norm, rows f32 [r, n_embd] (``xn`` may be ``x``).
        lm_head: :data:`HeadFn`: normed rows ``xn`` f32 [r, n_embd] -> ``logits`` f32 [r, n_vocab].
        embd_scale: ``embd_scale(cfg) -> float``: factor of the token embeddings looked up on the
            host (gemma3: ``sqrt(n_embd)`` in float32, llama.cpp ``ggml_scale(inpL, sqrtf(n_embd))``);
            None: unscaled.
        scratch_i32: ``scratch_i32(cfg) -> {name: row width}``: I32 ``[n_batch, width]`` buffers
            (the selected experts of MoE blocks: ``builders.moe_scratch_i32``); None: none.
        block_attn, block_ffn: the block cut in two at the residual stream, for placements that run
            a block's feed-forward (its experts: ``--n-cpu-moe``, ``-ot``) on another device than its
            attention: ``block_attn`` (:data:`BlockFn`) adds the attention to ``s.x``, ``block_ffn``
            (:data:`FfnFn`) the feed-forward, whose tensors are those marked ``TensorSpec.ffn``;
            running both is :attr:`block`. None: the block is placed whole.
        check_tensors: ``check_tensors(present, cfg, path)``: checks of the file's tensor names beyond
            each spec's (``load_config``), raising ``UnsupportedModelError``: which combinations of
            alternative layouts (``TensorSpec.layout``) a block may hold. None: no more checks.
        state_widths: ``state_widths(cfg, il) -> (width, ...)``: block ``il``'s recurrent state tensors,
            the f32 values per sequence of each (``model/recurrent.py``; lfm2's convolution: one of
            ``(n_conv - 1) * n_embd``; qwen35's linear attention: three convolution states and the
            delta rule's), () for an attention block; None: the architecture has no recurrent layers.
        row_inputs: ``row_inputs(cfg, pos) -> {scratch name: f32 [n, width]}``: values computed on the host
            from the rows' positions (``pos``: int32 [n]) that the segment writes into those
            :attr:`scratch` buffers before each pass, as llama.cpp sets a graph input from the ubatch
            (mistral3's attention temperature, ``llm_graph_input_attn_temp``); None: none.
        layer_arrays: ``feed_forward_length`` and ``attention.head_count_kv`` may be per-layer arrays
            (gemma4): ``load_config`` then puts their largest value in ``n_ff`` / ``n_head_kv`` and
            :attr:`hparams` reads the arrays (``ModelConfig.n_ff_layers``, ``n_head_kv_layers``).
        tensor_hparams: ``tensor_hparams(f, cfg) -> {ModelConfig field: value}``: config values read
            from the file's tensors at load (gemma4's per-block output scalars); None: none.
        layer_inputs: ``layer_inputs(cfg, gf, tokens, x, cache) -> float32 [n, n_layer, width]``: the
            per-layer token inputs of a pass, computed on the host from the token ids (int [n]) and
            their embeddings ``x`` (float32 [n, n_embd]); ``cache`` is a dict kept by the model for
            what it dequantizes once. Block ``il`` reads its rows as ``s.layer_in`` (f32 [n, width];
            ``ModelConfig.n_embd_per_layer``). None: the blocks take no such input.
    """

    name: str
    tensors: tuple[TensorSpec, ...]
    rope_mode: int
    hparams: Callable[[Metadata], dict[str, Any]]
    block: BlockFn
    scratch: Callable[[ModelConfig], dict[str, int]] = builders.scratch
    final_norm: NormFn = builders.output_norm
    lm_head: HeadFn = builders.lm_head
    embd_scale: Callable[[ModelConfig], float] | None = None
    scratch_i32: Callable[[ModelConfig], dict[str, int]] | None = None
    block_attn: BlockFn | None = None
    block_ffn: FfnFn | None = None
    state_widths: Callable[[ModelConfig, int], tuple[int, ...]] | None = None
    check_tensors: Callable[[Container[str], ModelConfig, str], None] | None = None
    row_inputs: Callable[[ModelConfig, Any], dict[str, Any]] | None = None
    layer_arrays: bool = False
    tensor_hparams: Callable[[Any, ModelConfig], dict[str, Any]] | None = None
    layer_inputs: Callable[[ModelConfig, Any, Any, Any, dict], Any] | None = None

    @property
    def recurrent(self) -> bool:
        """True when some blocks are recurrent layers with a state (:attr:`state_widths`)."""
        return self.state_widths is not None

    @property
    def has_halves(self) -> bool:
        """True when a block may be placed in two halves (:attr:`block_attn`, :attr:`block_ffn`)."""
        return self.block_attn is not None and self.block_ffn is not None

    def run_block(self, d: Device, cfg: ModelConfig, w: Weights, s: SimpleNamespace, kv: KV, il: int,
                  part: str = ALL) -> None:
        """Enqueue ``part`` of block ``il``: :data:`ALL` (:attr:`block`), :data:`ATTN`
        (:attr:`block_attn`) or :data:`FFN` (:attr:`block_ffn`; ``kv`` is not read).

        Raises:
            ValueError: a half of a block without halves, or an unknown part.
        """
        if part == ALL:
            self.block(d, cfg, w, s, kv, il)
        elif part == ATTN and self.block_attn is not None:
            self.block_attn(d, cfg, w, s, kv, il)
        elif part == FFN and self.block_ffn is not None:
            self.block_ffn(d, cfg, w, s, il)
        else:
            raise ValueError(f"architecture {self.name}: no block part {part!r}")

    def __post_init__(self) -> None:
        keys = [(s.unit, k, s.layout) for s in self.tensors for k in {s.key, *s.keys}]
        plain = {(u, k) for u, k, lay in keys if not lay}
        if len(set(keys)) != len(keys) or any(lay and (u, k) in plain for u, k, lay in keys):
            raise ValueError(f"architecture {self.name}: two tensors share a key in one unit")

    def head(self, d: Device, cfg: ModelConfig, w: Weights, x: DeviceTensor, xn: DeviceTensor,
             logits: DeviceTensor | None = None, ids: DeviceTensor | None = None) -> None:
        """The output head on the rows ``x`` f32 [n, n_embd] leaving the last block.

        With ``ids`` (I32 [m]) those rows are picked first (``get_rows`` into ``xn`` f32 [m, n_embd])
        and normed in place; else ``xn`` f32 [n, n_embd] = :attr:`final_norm` of every row. Then
        ``logits`` (f32 [m or n, n_vocab]) = :attr:`lm_head` of ``xn``, unless None (embeddings:
        ``xn`` is the result).
        """
        if ids is not None:
            d.get_rows(xn, x, ids)
            x = xn
        self.final_norm(d, cfg, w, xn, x)
        if logits is not None:
            self.lm_head(d, cfg, w, logits, xn)

    def ops(self, cfg: ModelConfig, unit: int | str, present: Container[str] | None = None,
            part: str = ALL) -> tuple[str, ...]:
        """The backend ops (``backends.optable`` names) block ``unit`` (an int) or the ``HEAD`` calls,
        found by running its code once on an :class:`OpRecorder` (module doc).

        Args:
            cfg: the model's config (per-layer choices read it).
            present: the file's tensor names: the unit's optional tensors the file lacks are left out,
                as the segment leaves them out. None: every tensor the architecture declares.
            part: of a block, :data:`ALL` or one half (:data:`ATTN`, :data:`FFN`; :meth:`run_block`).
        Returns:
            op names in first-call order; the head's include ``get_rows`` (the segment picks its
            output rows with it).
        Raises:
            ValueError: ``unit`` is a string other than ``HEAD``; a half of a block without halves.
        """
        if not isinstance(unit, int) and unit != HEAD:
            raise ValueError(f"Architecture.ops: unit {unit!r} is neither a block index nor {HEAD!r}")
        keys = self._keys(unit, present, part)
        rec = OpRecorder()
        d: Any = rec
        w: Any = {k: _Placeholder(k) for k in keys}
        if isinstance(unit, int):
            names = [*self.scratch(cfg), *(self.scratch_i32(cfg) if self.scratch_i32 else ())]
            s = SimpleNamespace(**{name: _Placeholder(name) for name in names}, layer_in=_Placeholder("layer_in"))
            t: Any = _Placeholder("kv")
            st = (t,) * len(self.state_widths(cfg, unit)) if self.state_widths is not None else None
            self.run_block(d, cfg, w, s, KV(t, t, t, t, t, cfg.n_ctx_train, state=st, slots=t if st else None),
                           unit, part)
        else:
            x: Any = _Placeholder("x")
            self.head(d, cfg, w, x, x, x, x)
        return rec.ops

    def _keys(self, unit: int | str, present: Container[str] | None, part: str = ALL) -> list[str]:
        """The weight keys of ``unit`` (``part``) the segment would hold (every declared one when
        ``present`` is None)."""
        if present is not None:
            specs = [spec for _, spec in self.unit_tensors(present, unit, part).values()]
        else:
            kind = BLOCK if isinstance(unit, int) else unit
            specs = [s for s in self.tensors if s.unit == kind and _in_part(s, part)]
        return [k for s in specs for k in s.keys]

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

    def unit_tensors(self, present: Container[str], unit: int | str, part: str = ALL
                     ) -> dict[str, tuple[str, TensorSpec]]:
        """The tensors of block ``unit`` (an int) or of ``HEAD`` / ``INPUT`` that the file has.

        Args:
            present: the file's tensor names.
            part: of a block, :data:`ALL`, or one half: :data:`ATTN` (the tensors not marked
                ``TensorSpec.ffn``, the global ones every block reads included) or :data:`FFN`.
        Returns:
            key -> (GGUF name, spec); an absent optional tensor is left out, a tied one
            names the tensor it is tied to.
        """
        kind = BLOCK if isinstance(unit, int) else unit
        i = unit if isinstance(unit, int) else None
        out: dict[str, tuple[str, TensorSpec]] = {}
        for s in self.tensors:
            if s.unit != kind or (i is not None and not _in_part(s, part)):
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
                if s.per_block and s.in_block(cfg, i):
                    yield s.gguf_name(i), s

    @staticmethod
    def shape_of(spec: TensorSpec, cfg: ModelConfig, name: str) -> tuple[int, ...]:
        """The numpy-order shape of tensor ``name`` (``spec``'s): a per-block one's from the config
        as its block sees it (``ModelConfig.layer``: gemma4's per-layer widths), else ``spec.shape(cfg)``."""
        if spec.per_block and name.startswith("blk."):
            return spec.shape(cfg.layer(int(name.split(".")[1])))
        return spec.shape(cfg)


def _in_part(spec: TensorSpec, part: str) -> bool:
    """True when a block tensor belongs to ``part`` (:data:`ALL`, :data:`ATTN` or :data:`FFN`)."""
    return part == ALL or spec.ffn == (part == FFN)


@dataclasses.dataclass(frozen=True)
class _Placeholder:
    """What :meth:`Architecture.ops` passes for a tensor: a name, nothing to compute with."""

    name: str

