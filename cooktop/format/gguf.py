"""Open a GGUF file: validated metadata and memory-mapped tensor views.

Parsing is this module's own bounds-checked walk of the header (GGUF format: ggml
docs/gguf.md): :func:`_validate_header` reads the tensor records, and
:func:`read_raw_metadata` the metadata in one pass with strings kept as bytes
(gguf's ``GGUFReader`` makes numpy objects per string and field: ~9 s for a
150k-token vocabulary, against ~0.2 s here). Tensor data are views of one
read-only ``numpy.memmap`` of the file (opening a file copies no tensor data),
laid out as ``GGUFReader`` lays them out. A foreign, truncated or corrupt file
becomes one clear :class:`~cooktop.errors.GGUFError` naming the defect: magic and
version, a header that ends early, unknown tensor types, tensors with a zero-size
dimension, rows that are not whole blocks, misaligned data or data extending past
the end of the file, and an alignment that is not a power of two.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import struct
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import GGUFError, UnsupportedModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
#: GGML_MAX_DIMS (ggml.h).
MAX_DIMS = 4
#: Byte sizes of the scalar GGUF value types (ggml docs/gguf.md).
_SCALAR_SIZES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file.

    Attributes:
        name: GGUF name, e.g. ``blk.0.attn_q.weight``.
        ggml_type: GGML type.
        shape: numpy order, e.g. ``(n_out, n_in)`` (GGUF ``ne`` reversed).
        data: the raw bytes, a read-only view into the memory map (no copy).
        n_bytes: size of ``data`` in bytes.
    """

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray
    n_bytes: int

    @property
    def n_elements(self) -> int:
        """Number of values (parameters) in the tensor."""
        return int(np.prod(self.shape, dtype=np.int64))


#: numpy dtype of the tensor data of these types (others: raw bytes, one row of bytes per row), as GGUFReader.
_TENSOR_DTYPES = {
    GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


def display_value(v: Any) -> Any:
    """A :class:`RawValue` value as a Python value: strings decoded from UTF-8 (invalid bytes
    replaced: exact bytes stay in :attr:`GGUFFile.raw`), numeric arrays as lists."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        if v and all(isinstance(x, bytes) for x in v[:1]):
            joined = b"\x00".join(v)  # one decode for the whole array (a 150k vocabulary: ~20 ms)
            if joined.count(b"\x00") == len(v) - 1:  # no NUL inside a string: the split is exact
                return joined.decode("utf-8", "replace").split("\x00")
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
    return v.tolist() if isinstance(v, np.ndarray) else v


class GGUFFile:
    """A validated, memory-mapped GGUF file.

    Attributes:
        path: the file path.
        file_size: bytes.
        version: GGUF version (2 or 3).
        raw: key -> :class:`RawValue` (:func:`read_raw_metadata`: strings as bytes; the
            tokenizer reads its vocabulary from it).
        metadata: key -> Python value (strings, numbers, lists; token arrays included;
            :func:`display_value`). An array of arrays is None.
        tensors: name -> :class:`TensorInfo`, in file order.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        _precheck(self.path)
        self.file_size = os.path.getsize(self.path)
        try:
            infos, data_start = _validate_header(self.path, self.file_size)
        except RecursionError:
            raise GGUFError(f"{self.path}: corrupt GGUF metadata (arrays nested too deep)") from None
        with open(self.path, "rb") as f:
            self.version = struct.unpack("<I", f.read(8)[4:8])[0]
        self.raw = read_raw_metadata(self.path)
        self.metadata: dict[str, Any] = {key: display_value(v.value) for key, v in self.raw.items()}
        self.tensors: dict[str, TensorInfo] = {}
        if infos:  # no map for a file without tensors
            mm = np.memmap(self.path, mode="r")
            for name, ggml_type, shape, n_bytes, offset in infos:
                at = data_start + offset
                dtype = _TENSOR_DTYPES.get(ggml_type)
                if dtype is not None:
                    data = mm[at:at + n_bytes].view(dtype).reshape(shape)
                else:  # raw blocks: [..., row bytes]
                    data = mm[at:at + n_bytes].reshape(shape[:-1] + (n_bytes // max(1, math.prod(shape[:-1])),))
                self.tensors[name] = TensorInfo(name, ggml_type, shape, data, n_bytes)

    @property
    def architecture(self) -> str:
        """``general.architecture`` (raises UnsupportedModelError when absent)."""
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise UnsupportedModelError(f"{self.path}: missing metadata key 'general.architecture'")
        return arch

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called ``name``.

        Raises:
            UnsupportedModelError: the file has no such tensor.
        """
        try:
            return self.tensors[name]
        except KeyError:
            raise UnsupportedModelError(f"{self.path}: missing tensor {name!r}") from None


def _describe(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _check_alignment(path: str, align: Any) -> None:
    """``general.alignment`` must be a positive power of two (GGUF spec)."""
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GGUFError(f"{path}: general.alignment = {align!r} is not a power of two; the file is corrupt")


def _check_tensor(path: str, name: str, type_id: int, ne: list[int], data_at: int, data_start: int,
                  align: int, file_size: int) -> tuple[GGMLQuantizationType, tuple[int, ...], int]:
    """Validate one tensor-info record.

    Args:
        ne: GGUF dimensions (``ne[0]`` = row length, GGML order).
        data_at: absolute file offset of the tensor's data; data_start: of the data section.
    Returns:
        (GGML type, numpy-order shape, size in bytes).
    Raises:
        GGUFError: unknown type, bad dimension count, zero-size dimension, rows not a
            multiple of the block size, misaligned or extending past the end of the file.
    """
    try:
        ggml_type = GGMLQuantizationType(type_id)
        block, size = GGML_QUANT_SIZES[ggml_type]
    except (ValueError, KeyError):
        raise GGUFError(f"{path}: tensor {name!r} has unknown GGML type id {type_id}; "
                        "the file is corrupt or needs a newer cooktop") from None
    shape = tuple(reversed(ne))
    if not 1 <= len(shape) <= MAX_DIMS:
        raise GGUFError(f"{path}: tensor {name!r} has {len(shape)} dimensions (GGML allows 1 to {MAX_DIMS}); "
                        "the file is corrupt")
    if any(s <= 0 for s in shape):
        raise GGUFError(f"{path}: tensor {name!r} has a zero-size dimension {list(shape)}; the file is corrupt")
    if shape[-1] % block:
        raise GGUFError(f"{path}: tensor {name!r} of type {ggml_type.name} has rows of {shape[-1]} "
                        f"values, not a multiple of its block size {block}")
    if (data_at - data_start) % align:
        raise GGUFError(f"{path}: tensor {name!r} data offset {data_at - data_start} is not a multiple of "
                        f"the alignment {align}; the file is corrupt")
    n_bytes = math.prod(shape[:-1]) * (shape[-1] // block) * size  # exact: no int64 overflow
    end = data_at + n_bytes
    if end > file_size:
        raise GGUFError(f"{path}: tensor {name!r} extends past the end of the file "
                        f"(needs bytes up to {end}, file has {file_size}); the file is truncated or corrupt")
    return ggml_type, shape, n_bytes


class _Cursor:
    """Bounds-checked little-endian reads over a memory-mapped file (for :func:`_validate_header`)."""

    def __init__(self, buf, path: str):
        self.buf, self.path, self.pos = buf, path, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF header: the file ends inside {what} "
                            f"(offset {self.pos}, file has {len(self.buf)} bytes); re-download the model")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.u64(what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what} is not valid UTF-8; the file is corrupt") from None

    def skip_value(self, vtype: int, what: str) -> Any:
        """Skip (and return scalars and strings of) a metadata value of type ``vtype``."""
        try:
            vt = GGUFValueType(vtype)
        except ValueError:
            raise GGUFError(f"{self.path}: {what} has unknown value type {vtype}; the file is corrupt") from None
        if vt in _SCALAR_SIZES:
            raw = self.take(_SCALAR_SIZES[vt], what)
            return struct.unpack("<I", raw)[0] if vt == GGUFValueType.UINT32 else raw
        if vt == GGUFValueType.STRING:  # any bytes (llama.cpp: std::string); only keys must be UTF-8
            return self.take(self.u64(what), what)
        etype, count = self.u32(what), self.u64(what)
        if etype == GGUFValueType.STRING:  # hot loop (vocabularies): lengths only, no copies
            buf, pos, end = self.buf, self.pos, len(self.buf)
            if count * 8 <= end - pos:  # else it cannot fit: each string has at least its u64 length
                unpack = struct.Struct("<Q").unpack_from
                for _ in range(count):
                    if pos + 8 > end:
                        break
                    pos += 8 + unpack(buf, pos)[0]
                else:
                    if pos <= end:
                        self.pos = pos
                        return None
            self.take(end - self.pos + 1, what)  # raises: the file ends inside this array
        elif etype in _SCALAR_SIZES:
            self.take(count * _SCALAR_SIZES[GGUFValueType(etype)], what)
        else:
            for _ in range(count):
                self.skip_value(etype, what)
        return None


def _validate_header(path: str, file_size: int
                     ) -> tuple[list[tuple[str, GGMLQuantizationType, tuple[int, ...], int, int]], int]:
    """Walk the header (GGUF spec: ggml docs/gguf.md) with bounds checks and raise
    :class:`GGUFError` naming the first defect found.

    Cost: one pass over the metadata reading string lengths only (23 ms for a
    128k-token vocabulary, where gguf's GGUFReader takes seconds).

    Returns:
        (tensor records, absolute offset of the data section); a record is
        (name, GGML type, numpy-order shape, byte size, offset in the data section).
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        cur.take(8, "the magic and version")
        n_tensors = cur.u64("the tensor count")
        n_kv = cur.u64("the metadata count")
        align: Any = 32
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = cur.u32(f"the type of metadata key {key!r}")
            value = cur.skip_value(vtype, f"metadata key {key!r}")
            if key == "general.alignment":
                if vtype != GGUFValueType.UINT32:
                    raise GGUFError(f"{path}: general.alignment has value type {vtype}, not UINT32; "
                                    "the file is corrupt")
                align = value
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"the name of tensor #{i}")
            what = f"the info of tensor {name!r}"
            n_dims = cur.u32(what)
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions (GGML allows 1 to {MAX_DIMS}); "
                                "the file is corrupt")
            ne = [cur.u64(what) for _ in range(n_dims)]
            infos.append((name, cur.u32(what), ne, cur.u64(what)))
        _check_alignment(path, align)
        data_start = -(-cur.pos // align) * align
        seen: set[str] = set()
        out = []
        for name, type_id, ne, offset in infos:
            if name in seen:
                raise GGUFError(f"{path}: tensor name {name!r} appears twice; the file is corrupt")
            seen.add(name)
            ggml_type, shape, n_bytes = _check_tensor(path, name, type_id, ne, data_start + offset, data_start,
                                                      align, file_size)
            out.append((name, ggml_type, shape, n_bytes, offset))
        return out, data_start


def _precheck(path: str) -> None:
    """Checks before the reader touches the file: exists, magic, version."""
    if not os.path.exists(path):
        raise GGUFError(f"{path}: no such file")
    if os.path.isdir(path):
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    size = os.path.getsize(path)
    if size == 0:
        raise GGUFError(f"{path}: the file is empty (0 bytes), not a GGUF model; re-download it")
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        kind = ""
        if len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < size:
            kind = " (it looks like a safetensors file)"
        raise GGUFError(f"{path}: not a GGUF file{kind}: magic {head[:4]!r}, expected b'GGUF'; "
                        "convert the model with llama.cpp's convert_hf_to_gguf.py")
    if len(head) < 8 or size < 24:
        raise GGUFError(f"{path}: truncated GGUF header: the file has only {size} bytes; re-download the model")
    version = struct.unpack("<I", head[4:8])[0]
    swapped = struct.unpack(">I", head[4:8])[0]
    if version not in SUPPORTED_VERSIONS and swapped in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: a big-endian GGUF (version {swapped}); cooktop reads little-endian files: "
                        f"convert it with gguf-py's `gguf-convert-endian {path} little`")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version} is not supported (supported: 2, 3)")


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file (memory-mapped; no tensor data is copied).

    Raises:
        GGUFError: not a GGUF, truncated, or corrupt (the message says which and where).
    """
    return GGUFFile(path)


__all__ = ["GGUFFile", "TensorInfo", "open_gguf", "GGUFValueType", "display_value"]


# -- fast raw metadata (vocabularies) ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RawValue:
    """One metadata value as stored, read by :func:`read_raw_metadata`.

    Attributes:
        type: the GGUF value type (``ARRAY`` for arrays).
        sub_type: the element type of an array, else None.
        value: ``bytes`` for a STRING (no decoding), ``list[bytes]`` for an array of
            strings, a numpy array (little-endian, copied) for an array of numbers or
            bools, a Python int/float/bool for a scalar; arrays of arrays are skipped
            (value None).
    """

    type: GGUFValueType
    sub_type: GGUFValueType | None
    value: Any


_NUMPY_TYPES = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4", GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}


def _read_string_array(buf, pos: int, count: int, path: str, key: str) -> tuple[list[bytes], int]:
    """``count`` GGUF strings (u64 length + bytes) from ``buf[pos:]`` as ``list[bytes]``.

    One slice per string and no numpy object per string (gguf's ``GGUFReader`` makes
    two per string, ~8 s for a 128k vocabulary); this takes ~0.1 s for 150k strings.

    Raises:
        GGUFError: the file ends inside the array.
    """
    end = len(buf)
    if count * 8 > end - pos:  # each string has at least its u64 length
        raise GGUFError(f"{path}: truncated or corrupt GGUF header: metadata key {key!r} has {count} strings, "
                        f"more than the file can hold; re-download the model")
    unpack = struct.Struct("<Q").unpack_from
    out: list[bytes] = []
    append = out.append
    start = pos
    try:
        for _ in range(count):  # no bounds checks in the loop: a length past the end shows below
            n = unpack(buf, pos)[0]
            pos += 8
            append(buf[pos:pos + n])
            pos += n
    except (struct.error, OverflowError):  # OverflowError: a huge length sent pos past ssize_t (fuzzing)
        pos = end + 1
    if pos > end:
        raise GGUFError(f"{path}: truncated or corrupt GGUF header: the file ends inside metadata key {key!r} "
                        f"(an array of {count} strings from offset {start}); re-download the model")
    return out, pos


def read_raw_metadata(path: str | os.PathLike, keys: Any = None) -> dict[str, RawValue]:
    """Metadata of a GGUF file in one bounds-checked pass, strings kept as bytes.

    For vocabularies: token texts and merges may be any bytes (llama.cpp keeps GGUF
    strings as ``std::string``), so nothing here is decoded except the key names, and a
    150k-token array costs one ``bytes`` slice per string.

    Args:
        path: the GGUF file.
        keys: the keys wanted (any container supporting ``in``), or None for all; the
            walk stops once every wanted key has been read.
    Returns:
        key -> :class:`RawValue`, for the keys present.
    Raises:
        GGUFError: not a GGUF, an unknown value type, or a header that ends early.
    """
    path = os.fspath(path)
    _precheck(path)
    want = None if keys is None else set(keys)
    out: dict[str, RawValue] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        cur.take(8, "the magic and version")
        cur.u64("the tensor count")
        n_kv = cur.u64("the metadata count")
        for i in range(n_kv):
            if want is not None and len(out) == len(want):
                break
            key = cur.string(f"metadata key #{i}")
            what = f"metadata key {key!r}"
            raw_vt = cur.u32(what)
            try:
                vt = GGUFValueType(raw_vt)
            except ValueError:
                raise GGUFError(f"{path}: {what} has an unknown value type; the file is corrupt") from None
            keep = want is None or key in want
            value: Any
            if vt == GGUFValueType.ARRAY:
                raw_et, count = cur.u32(what), cur.u64(what)
                try:
                    et = GGUFValueType(raw_et)
                except ValueError:
                    raise GGUFError(f"{path}: {what} has an unknown element type {raw_et}; "
                                    "the file is corrupt") from None
                if et == GGUFValueType.STRING and keep:
                    value, cur.pos = _read_string_array(buf, cur.pos, count, path, key)
                elif et in _NUMPY_TYPES:
                    raw = cur.take(count * _SCALAR_SIZES[et], what)
                    value = np.frombuffer(raw, dtype=_NUMPY_TYPES[et]).copy() if keep else None
                    if keep and et == GGUFValueType.BOOL:
                        value = value.astype(bool)
                else:  # strings not wanted, arrays of arrays: the validating skipper re-reads the array header
                    cur.pos -= 12
                    cur.skip_value(GGUFValueType.ARRAY, what)
                    value = None
                if keep:
                    out[key] = RawValue(vt, et, value)
            elif vt == GGUFValueType.STRING:
                value = cur.take(cur.u64(what), what)
                if keep:
                    out[key] = RawValue(vt, None, value)
            else:
                raw = cur.take(_SCALAR_SIZES[vt], what)
                if keep:
                    v = np.frombuffer(raw, dtype=_NUMPY_TYPES[vt])[0].item()
                    out[key] = RawValue(vt, None, bool(v) if vt == GGUFValueType.BOOL else v)
    return out
