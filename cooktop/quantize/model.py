"""Quantize a GGUF model file as llama-quantize does: same tensor types, same bytes where llama.cpp is deterministic.

The output is laid out as ``llama_model_quantize`` (src/llama-quant.cpp) writes it: the input's metadata
in its order, minus the ``split.*`` keys, then ``general.quantization_version`` (u32 2) and
``general.file_type`` (u32, the ``llama_ftype``) appended (ggml's ``gguf_set_val_*`` removes a key and
appends it); tensors in llama.cpp's loader order (:func:`.mixture.llama_order`) with
``ggml_n_dims`` dimensions; data aligned to ``general.alignment`` (32 by default) and each tensor padded
with zeros to it. The gguf library (``GGUFWriter``) writes the file. Tensors whose type does not change
are copied byte for byte; float inputs (F32, F16, BF16) are widened to float32 and quantized with
:func:`.rows.quantize_rows`. An already-quantized tensor is not requantized (llama-quantize refuses it
without ``--allow-requantize``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

from ..errors import CooktopError, UnsupportedModelError
from ..format.gguf import GGUFFile, open_gguf
from ..format.quants import HOST_TYPES, dequantize
from .ftypes import FileType
from .imatrix import Imatrix
from .mixture import Mixture, ModelFacts, Options, llama_order, n_dims
from .rows import WRITABLE, quantize_rows

T = GGMLQuantizationType
#: GGML_QNT_VERSION (ggml.h), written as general.quantization_version.
QNT_VERSION = 2
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
_INPUT_TYPES = (T.F32, T.F16, T.BF16)


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """One output tensor.

    Attributes:
        name: GGUF name.
        ne: GGUF dimensions (``ne[0]`` = row length), ``ggml_n_dims`` of them.
        src_type, dst_type: input and output GGML types.
        n_bytes: output bytes (without padding).
    """

    name: str
    ne: tuple[int, ...]
    src_type: T
    dst_type: T
    n_bytes: int


@dataclasses.dataclass(frozen=True)
class Result:
    """What :func:`quantize_file` did.

    Attributes:
        tensors: the plan, in file order.
        size_in, size_out: tensor bytes of the input and of the output.
        n_elements: parameters.
        seconds: wall time.
        fallbacks: (tensor, wanted type, type written) for rows that were not whole blocks.
    """

    tensors: list[TensorPlan]
    size_in: int
    size_out: int
    n_elements: int
    seconds: float
    fallbacks: list[tuple[str, T, T]]


def model_facts(f: GGUFFile) -> ModelFacts:
    """The hyperparameters the mixtures read (block count, head counts, expert count) from ``f``'s metadata.

    Raises:
        UnsupportedModelError: no ``general.architecture`` or no ``{arch}.block_count``.
    """
    arch = f.architecture
    md = f.metadata

    def first(key: str, default: int) -> int:
        v = md.get(f"{arch}.{key}", default)
        if isinstance(v, list):
            v = v[0] if v else default
        return int(v)

    if f"{arch}.block_count" not in md:
        raise UnsupportedModelError(f"{f.path}: missing metadata key '{arch}.block_count'")
    n_head = first("attention.head_count", 1)
    return ModelFacts(arch, first("block_count", 0), n_head, first("attention.head_count_kv", n_head),
                      first("expert_count", 0))


def plan(f: GGUFFile, opts: Options, allow_requantize: bool = False) -> tuple[list[TensorPlan], Mixture]:
    """The output tensors of ``f`` under ``opts``: llama.cpp's order and per-tensor types.

    Raises:
        UnsupportedModelError: a tensor that would need requantizing (an already-quantized input) without
            ``allow_requantize``, one of a type cooktop cannot read, or a target type it cannot write.
    """
    names = llama_order(f.tensors)
    mix = Mixture(model_facts(f), opts, names)
    out = []
    for name in names:
        t = f.tensors[name]
        ne = tuple(reversed(t.shape))
        ne = ne[:n_dims(ne)]
        dst = mix.choose(name, ne, t.ggml_type)
        if dst != t.ggml_type:
            if t.ggml_type not in _INPUT_TYPES and not allow_requantize:
                raise UnsupportedModelError(
                    f"{f.path}: tensor {name} is already {t.ggml_type.name}; cooktop quantize reads F32, F16 "
                    "or BF16 models (requantizing loses quality: start from the unquantized file, or pass "
                    "--allow-requantize)")
            if t.ggml_type not in HOST_TYPES:
                raise UnsupportedModelError(f"{f.path}: cannot read tensor {name} of type {t.ggml_type.name}")
            if dst not in WRITABLE:
                raise UnsupportedModelError(f"cannot write {name} as {dst.name}")
        block, size = GGML_QUANT_SIZES[dst]
        n_bytes = t.n_bytes if dst == t.ggml_type else t.n_elements // block * size
        out.append(TensorPlan(name, ne, t.ggml_type, dst, n_bytes))
    return out, mix


def imatrix_kv(im: Imatrix) -> list[tuple[str, Any, GGUFValueType]]:
    """The ``quantize.imatrix.*`` keys llama-quantize writes (its kv overrides; strings cut at 127 bytes)."""
    kv: list[tuple[str, Any, GGUFValueType]] = [
        ("quantize.imatrix.file", im.path.encode()[:127], GGUFValueType.STRING)]
    if im.datasets:
        kv.append(("quantize.imatrix.dataset", im.datasets[0].encode()[:127], GGUFValueType.STRING))
    kv.append(("quantize.imatrix.entries_count", len(im.entries), GGUFValueType.UINT32))
    if im.chunk_count > 0:
        kv.append(("quantize.imatrix.chunks_count", im.chunk_count, GGUFValueType.UINT32))
    return kv


def _metadata(w: GGUFWriter, f: GGUFFile, ftype: int, extra_kv) -> None:
    """The input's key-value pairs in order, split keys dropped, quantization_version, file_type and
    ``extra_kv`` last (ggml's gguf_set_val_* removes a key and appends it)."""
    w.kv_data[0].clear()  # GGUFWriter adds general.architecture first; keep the input's order instead
    last = {"general.quantization_version", "general.file_type"} | {k for k, _, _ in extra_kv}
    for key, raw in f.raw.items():
        if key in _SPLIT_KEYS or key in last:
            continue
        if raw.type == GGUFValueType.ARRAY:
            if raw.value is None:
                raise UnsupportedModelError(f"{f.path}: metadata key {key!r} is an array of arrays, "
                                            "which cooktop quantize cannot copy")
            v = raw.value.tolist() if isinstance(raw.value, np.ndarray) else list(raw.value)
            if raw.sub_type == GGUFValueType.BOOL:
                v = [bool(b) for b in v]
            w.add_key_value(key, v, raw.type, sub_type=raw.sub_type)
        else:
            w.add_key_value(key, raw.value, raw.type)
    w.add_uint32("general.quantization_version", QNT_VERSION)
    w.add_uint32("general.file_type", ftype)
    for key, value, vtype in extra_kv:
        w.kv_data[0].pop(key, None)  # gguf_set_val_*: remove, then append
        w.add_key_value(key, value, vtype)


_INT = re.compile(r"\s*[+-]?\d+")
_FLOAT = re.compile(r"\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf(inity)?|nan)", re.I)


def parse_kv_override(arg: str) -> tuple[str, Any, GGUFValueType]:
    """``--override-kv KEY=TYPE:VALUE`` as common.cpp ``string_parse_kv_override`` reads it and llama-quant.cpp
    writes it: ``int:`` -> u32 of ``|VALUE|``, ``float:`` -> f32 of ``atof(VALUE)``, ``bool:true|false``,
    ``str:`` (at most 127 bytes).

    Raises:
        CooktopError: no ``=``, a key of 128 bytes or more, an unknown TYPE, a value that is not a
            number of its type (llama.cpp's atol/atof would write 0 for ``int:abc``) or an int past
            32 bits, a bad bool, a long string.
    """
    key, sep, rest = arg.partition("=")
    if not sep or len(key.encode()) >= 128:
        raise CooktopError(f"malformed KV override {arg!r}: use KEY=TYPE:VALUE, TYPE int, float, bool or str")
    typ, colon, value = rest.partition(":")
    if not colon or typ not in ("int", "float", "bool", "str"):
        raise CooktopError(f"invalid type for KV override {arg!r}: use int:, float:, bool: or str:")
    if typ == "int":
        m = _INT.fullmatch(value.strip())
        if m is None or abs(int(m.group(0))) > 0xFFFFFFFF:
            raise CooktopError(f"invalid integer value for KV override {arg!r}: a whole number of at most "
                               "32 bits, e.g. int:42")
        return key, abs(int(m.group(0))), GGUFValueType.UINT32
    if typ == "float":
        m = _FLOAT.fullmatch(value.strip())
        if m is None:
            raise CooktopError(f"invalid float value for KV override {arg!r}: a number, e.g. float:0.5")
        return key, float(np.float32(float(m.group(0)))), GGUFValueType.FLOAT32
    if typ == "bool":
        if value not in ("true", "false"):
            raise CooktopError(f"invalid boolean value for KV override {arg!r}: true or false")
        return key, value == "true", GGUFValueType.BOOL
    if len(value.encode()) > 127:
        raise CooktopError(f"malformed KV override {arg!r}: the value cannot exceed 127 bytes")
    return key, value.encode(), GGUFValueType.STRING


def _importance(im: Imatrix | None, p: TensorPlan, n_matrices: int) -> np.ndarray | None:
    """The tensor's importance vectors ``[n_matrices, ne0]``, or None (llama-quant.cpp's lookup: no entry,
    or a token embedding whose entry has the wrong size, quantizes without)."""
    if im is None or p.name not in im.entries:
        return None
    v = im.entries[p.name]
    if v.size != p.ne[0] * n_matrices:
        if p.name in ("token_embd.weight", "per_layer_token_embd.weight"):
            return None
        raise UnsupportedModelError(f"imatrix size {v.size} is different from tensor size "
                                    f"{p.ne[0] * n_matrices} for {p.name}")
    return v.reshape(n_matrices, p.ne[0])


def _as_float32(t, n_rows: int, n_per_row: int) -> np.ndarray:
    """A tensor's values as float32 [n_rows, n_per_row] (F16/BF16 widened exactly; quantized types through
    gguf's dequantizers, for ``--allow-requantize``)."""
    if t.ggml_type not in _INPUT_TYPES:
        return dequantize(t.data, t.ggml_type, (n_rows, n_per_row))
    if t.ggml_type == T.F32:
        return np.asarray(t.data, dtype=np.float32).reshape(n_rows, n_per_row)
    if t.ggml_type == T.F16:
        return np.asarray(t.data, dtype=np.float16).reshape(n_rows, n_per_row).astype(np.float32)
    raw = np.asarray(t.data).view(np.uint16).reshape(n_rows, n_per_row)
    return (raw.astype(np.uint32) << 16).view(np.float32)


def quantize_file(src: str | os.PathLike, dst: str | os.PathLike, file_type: FileType, *, pure: bool = False,
                  output_tensor_type: T | None = None, token_embedding_type: T | None = None,
                  leave_output_tensor: bool = False, n_threads: int = 0, imatrix: Imatrix | None = None,
                  extra_kv=(), tensor_types=(), allow_requantize: bool = False,
                  progress: Callable[[int, int], None] | None = None) -> Result:
    """Quantize GGUF ``src`` to ``dst`` as ``llama-quantize [flags] src dst TYPE`` would.

    Args:
        src: F32/F16/BF16 GGUF model.
        dst: output path (written whole, then renamed into place).
        file_type: the target (:func:`.ftypes.file_type`).
        pure, output_tensor_type, token_embedding_type, leave_output_tensor: llama-quantize's flags
            ``--pure``, ``--output-tensor-type``, ``--token-embedding-type``, ``--leave-output-tensor``.
        n_threads: threads quantizing slabs of rows in parallel (llama-quantize's ``nthreads``; 0: one
            per CPU core); the output does not depend on it.
        imatrix: importance vectors (:func:`.imatrix.load`; ``--imatrix``) for the quantizers and the mixture.
        extra_kv: (key, value, GGUFValueType) appended to the metadata (the CLI's ``quantize.imatrix.*``).
        tensor_types: ``--tensor-type`` (pattern, type) pairs (:attr:`.mixture.Options.tensor_types`).
        allow_requantize: ``--allow-requantize``: dequantize quantized input tensors and quantize them again.
        progress: called as ``progress(values_done_now, values_total)`` while tensors are converted.

    Returns:
        a :class:`Result`.

    Raises:
        GGUFError: ``src`` is not a readable GGUF (foreign, truncated, corrupt).
        UnsupportedModelError: an already-quantized input tensor, missing metadata.
        CooktopError: ``src`` and ``dst`` are the same file, or ``dst`` cannot be written.
    """
    t0 = time.perf_counter()
    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise CooktopError(f"{dst}: the output must not be the input file")
    f = open_gguf(src)
    opts = Options(file_type, pure, output_tensor_type, token_embedding_type, not leave_output_tensor,
                   imatrix is not None, tuple(tensor_types))
    tensors, mix = plan(f, opts, allow_requantize)
    total = sum(int(np.prod(p.ne)) for p in tensors if p.dst_type != p.src_type)
    tmp = dst + ".part"
    w = GGUFWriter(tmp, f.architecture)
    align = f.metadata.get("general.alignment")
    if isinstance(align, int):
        w.data_alignment = align
    n_threads = n_threads if n_threads > 0 else (os.cpu_count() or 1)
    pool = ThreadPoolExecutor(n_threads) if n_threads > 1 else None
    try:
        _metadata(w, f, file_type.ftype, list(extra_kv))
        for p in tensors:
            w.add_tensor_info(p.name, tuple(reversed(p.ne)), np.dtype(np.float32), p.n_bytes, raw_dtype=p.dst_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for p in tensors:
            t = f.tensors[p.name]
            if p.dst_type == p.src_type:
                data = np.asarray(t.data).reshape(-1).view(np.uint8)
            else:
                n_per_row = p.ne[0]
                x = _as_float32(t, t.n_elements // n_per_row, n_per_row)
                tick = None if progress is None else lambda n: progress(n, total)
                n_mat = int(np.prod(p.ne[2:])) if len(p.ne) > 2 else 1
                qw = _importance(imatrix, p, n_mat)
                if not np.isfinite(x).all():
                    raise UnsupportedModelError(f"{src}: tensor {p.name} holds NaN or infinite values")
                if qw is None:
                    data = quantize_rows(x, p.dst_type, tick, pool)
                else:  # one importance vector per expert matrix
                    rows = x.reshape(n_mat, -1, n_per_row)
                    data = np.concatenate([quantize_rows(rows[e], p.dst_type, tick, pool, qw[e])
                                           for e in range(n_mat)])
            w.write_tensor_data(data.reshape(-1))
        w.close()
        os.replace(tmp, dst)
    except OSError as e:
        raise CooktopError(f"{dst}: cannot write: {e.strerror or e}") from None
    finally:
        if pool is not None:
            pool.shutdown()
        w.close()
        if os.path.exists(tmp):
            os.remove(tmp)
    size_in = sum(t.n_bytes for t in f.tensors.values())
    size_out = sum(p.n_bytes for p in tensors)
    n_el = sum(t.n_elements for t in f.tensors.values())
    return Result(tensors, size_in, size_out, n_el, time.perf_counter() - t0, mix.fallbacks)
