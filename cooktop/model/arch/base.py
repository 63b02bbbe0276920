"""The words architecture descriptors are written in: tensors (:class:`TensorSpec`), their kinds
and units, a unit's weights (:data:`Weights`) and what a block sees of the KV cache (:class:`KV`).

The descriptor itself (``descriptor.py``'s ``Architecture``) says, as data and code, what llama.cpp
spreads over ``src/llama-arch.cpp`` (tensor names), ``llama_model_<arch>::load_arch_hparams`` /
``load_arch_tensors`` (src/models/<arch>.cpp: hyper-parameters, tensor shapes, required or not) and
the graph builder of the same file (the block as a sequence of ops, from the shared builders of
``builders.py``; the tensors from the shared skeleton of ``skeleton.py``). Everything that depends
on the tensor set reads it from there: config validation (``model/config.py``), the forward pass
(``model/forward.py``), placement and the memory budget (``runtime/``) and synthetic models
(``tools/synth.py``).

Tensor names follow llama.cpp: ``blk.{i}.attn_q.weight`` for block ``i``. Block code
reads a unit's weights from a dict keyed by the name without ``blk.{i}.`` and
without ``.weight``: ``w["attn_q"]``, ``w["attn_q.bias"]``, ``w["output"]``. An
optional tensor that the file lacks is simply not in the dict, so its op is skipped
(``if "attn_q.bias" in w: ...``); a tied tensor (``output`` -> ``token_embd``) is
the tensor it is tied to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ...backends.base import Device, DeviceTensor
from ...errors import CooktopError
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
        groups: ``groups(cfg) -> int`` when the parts repeat per group (qwen35's ``attn_q``: per head,
            the head's query rows then its gate's): the rows are ``groups`` runs of the parts in order,
            each part's ``rows(cfg)`` counting one run's rows; a part is uploaded as its rows of every
            run, in run order (llama.cpp views the product with a stride instead: ``ggml_view_3d``).
            None: one run.
        ffn: part of the block's feed-forward half (set by ``skeleton.llama_tensors`` on the FFN
            norm, the FFN and what follows): placement may run that half on another device than
            the attention half (``Architecture.block_ffn``: a MoE block's experts).
        layers: ``layers(cfg, il) -> bool``: the blocks that hold this per-block tensor (a hybrid's
            attention tensors only in its attention blocks, its convolution tensors only in its
            recurrent ones); None: every block.
        layout: the name of one of several alternative layouts of the same weights (qwen3next's legacy
            ``ssm_in`` against ``attn_qkv`` + ``attn_gate``): specs of different layouts may give the
            same keys, a file holds one layout's tensors (``Architecture.check_tensors`` says which
            combinations it accepts), synthetic files are written in the first layout declared unless
            ``Shape.layout`` names another. "": not an alternative (every file may hold it).
    """

    name: str
    shape: Callable[[ModelConfig], tuple[int, ...]]
    unit: str = BLOCK
    kind: str = MATRIX
    required: bool = True
    tied_to: str | None = None
    parts: tuple[tuple[str, Callable[[ModelConfig], int]], ...] = ()
    groups: Callable[[ModelConfig], int] | None = None
    ffn: bool = False
    layers: Callable[[ModelConfig, int], bool] | None = None
    layout: str = ""

    def in_block(self, cfg: ModelConfig, il: int) -> bool:
        """True when block ``il`` of a model of ``cfg`` holds this per-block tensor (:attr:`layers`)."""
        return self.layers is None or self.layers(cfg, il)

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

    def part_rows(self, cfg: ModelConfig) -> list[tuple[str, list[tuple[int, int]]]]:
        """``(key, [(first row, end row), ...])`` of each of :attr:`parts` for a model of ``cfg``: one
        range per run of the parts (:attr:`groups`), in order."""
        sizes = [int(rows(cfg)) for _, rows in self.parts]
        per_run = sum(sizes)
        runs = int(self.groups(cfg)) if self.groups is not None else 1
        out = []
        a = 0
        for (key, _), n in zip(self.parts, sizes):
            out.append((key, [(r * per_run + a, r * per_run + a + n) for r in range(runs)]))
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
        n_ctx: positions per sequence (the context length; the LongRoPE choice, ``builders.rope_factors``, reads it).
        flash: the attention kernel (``Device.attention``'s ``flash``: the model's resolved ``-fa``).
        state: a recurrent block's state tensors, each f32 [n_seq, width] (``model/recurrent.py``: one
            row per sequence; ``Architecture.state_widths``), or None (an attention block).
        slots: I32 [n] the state row of each row's sequence (its seq id), or None (no state).
        attend_to: I32 [n] the last cache row each row attends to, or None: its own cell (causal). A
            non-causal pass (an image's embeddings, llama.cpp ``llama_set_causal_attn(false)``, which
            mtmd sets for Gemma 3's image batch) sets every row's to the batch's last cell.
        window_start: I32 [n] with ``attend_to``: the first row a sliding-window layer's row attends to,
            ``max(first cell, cell - window + 1)`` (llama.cpp ``is_masked_swa``: key ``j`` is masked when
            ``p_i - p_j >= n_swa``, measured from the row's own position, whatever the causality);
            those layers then attend ``window_start[i] .. attend_to[i]`` with no window.
        window: the window ``window_start`` was computed for (tokens).
    """

    k: DeviceTensor
    v: DeviceTensor
    pos: DeviceTensor
    cells: DeviceTensor
    kv_start: DeviceTensor | None = None
    n_ctx: int = 0
    flash: bool = True
    state: tuple[DeviceTensor, ...] | None = None
    slots: DeviceTensor | None = None
    attend_to: DeviceTensor | None = None
    window_start: DeviceTensor | None = None
    window: int = 0

    def attend(self, d: Device, out: DeviceTensor, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor,
               n_head: int, n_head_kv: int, scale: float, window: int = 0, sinks: DeviceTensor | None = None,
               k_rope: dict[str, Any] | None = None) -> None:
        """Store the rows' ``k``, ``v`` (f32 [n, n_embd_kv]) in their cells (``k_rope``: the
        ``Device.rope`` keyword arguments ``k`` is first rotated with, by ``pos``, in the same op:
        ``Device.rope_store``; ``k`` is left unspecified then), then
        ``out f32 [n, n_head * head_dim] = attention(q)`` over each row's own sequence
        (causal, GQA, ``window`` > 0: sliding window; ops ``kv_store`` and ``attention``, or
        ``attention_sinks`` with ``sinks`` f32 [n_head]: one extra logit per head in the softmax,
        gpt-oss, llama.cpp ``build_attn`` with ``sinks``)."""
        if k_rope is not None:
            d.rope_store(self.k, k, self.pos, self.cells, **k_rope)
        else:
            d.kv_store(self.k, k, self.cells)
        d.kv_store(self.v, v, self.cells)
        last, start = self.cells, self.kv_start
        if self.attend_to is not None:  # non-causal: up to the batch's last cell
            last = self.attend_to
            if window:
                if window != self.window or self.window_start is None:
                    raise CooktopError(f"a non-causal pass with a sliding window of {window} tokens "
                                       f"(its rows were prepared for {self.window})")
                start, window = self.window_start, 0
        if sinks is not None:
            d.attention_sinks(out, q, self.k, self.v, last, sinks, n_head, n_head_kv, scale, window,
                              kv_start=start, flash=self.flash)
        else:
            d.attention(out, q, self.k, self.v, last, n_head, n_head_kv, scale, window,
                        kv_start=start, flash=self.flash)


def rms_eps_hparams(m: Metadata) -> dict[str, Any]:
    """``{"rms_eps": attention.layer_norm_rms_epsilon}``, the one key most architectures add to the
    shared ones (llama.cpp ``ml.get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS, hparams.f_norm_rms_eps)``,
    required). Also the epsilon of per-head Q/K norms.

    Raises:
        UnsupportedModelError: the key is missing or not a number >= 0.
    """
    return {"rms_eps": float(m.num("attention.layer_norm_rms_epsilon", float, required=True, minimum=0.0))}
