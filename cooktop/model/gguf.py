"""Open a GGUF file: validated metadata and memory-mapped tensor views.

Parsing is the ``gguf`` package's ``GGUFReader`` (memory-mapped: opening a
file copies no tensor data). Around it, this module checks what the reader
does not, so that a foreign, truncated or corrupt file becomes one clear
:class:`~cooktop.errors.GGUFError` instead of a traceback from deep inside:
magic and version, a header that ends early, unknown tensor types, tensors
with a zero-size dimension or extending past the end of the file, and an
alignment that is not a power of two. (GGUF format: ggml docs/gguf.md.)
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from ..errors import GGUFError, UnsupportedModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)


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


class GGUFFile:
    """A validated, memory-mapped GGUF file.

    Attributes:
        path: the file path.
        file_size: bytes.
        version: GGUF version (2 or 3).
        metadata: key -> Python value (strings, numbers, lists; token arrays included).
        tensors: name -> :class:`TensorInfo`, in file order.
        reader: the underlying ``gguf.GGUFReader``.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        _precheck(self.path)
        try:
            self.reader = GGUFReader(self.path, "r")
        except (ValueError, IndexError, KeyError, struct.error, TypeError, OverflowError, EOFError) as e:
            raise GGUFError(f"{self.path}: corrupt or truncated GGUF header ({_describe(e)}); "
                            "re-download or re-convert the model") from None
        self.file_size = os.path.getsize(self.path)
        self.version = int(self.reader.fields["GGUF.version"].parts[-1][0])
        self.metadata: dict[str, Any] = {}
        for key, field in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = field.contents()
            except Exception as e:  # noqa: BLE001 - any decoding failure is a corrupt file
                raise GGUFError(f"{self.path}: metadata key {key!r} is unreadable ({_describe(e)})") from None
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment = {align!r} is not a power of two; the file is corrupt")
        self.tensors: dict[str, TensorInfo] = {}
        for t in self.reader.tensors:
            self.tensors[t.name] = self._tensor(t)

    def _tensor(self, t) -> TensorInfo:
        try:
            ggml_type = GGMLQuantizationType(int(t.tensor_type))
        except ValueError:
            raise GGUFError(f"{self.path}: tensor {t.name!r} has unknown GGML type id {int(t.tensor_type)}; "
                            "the file is corrupt or needs a newer cooktop") from None
        shape = tuple(int(s) for s in reversed(list(t.shape)))
        if any(s <= 0 for s in shape):
            raise GGUFError(f"{self.path}: tensor {t.name!r} has a zero-size dimension {list(shape)}; "
                            "the file is corrupt")
        block, size = GGML_QUANT_SIZES[ggml_type]
        if shape[-1] % block:
            raise GGUFError(f"{self.path}: tensor {t.name!r} of type {ggml_type.name} has rows of {shape[-1]} "
                            f"values, not a multiple of its block size {block}")
        n_bytes = int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // block) * size
        end = int(t.data_offset) + n_bytes
        if end > self.file_size:
            raise GGUFError(f"{self.path}: tensor {t.name!r} extends past the end of the file "
                            f"(needs bytes up to {end}, file has {self.file_size}); the file is truncated")
        return TensorInfo(t.name, ggml_type, shape, t.data, n_bytes)

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


def _precheck(path: str) -> None:
    """Checks before the reader touches the file: exists, magic, version."""
    if not os.path.exists(path):
        raise GGUFError(f"{path}: no such file")
    if os.path.isdir(path):
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF'); "
                        "convert the model with llama.cpp's convert_hf_to_gguf.py")
    if len(head) < 8 or size < 24:
        raise GGUFError(f"{path}: truncated GGUF header ({size} bytes)")
    version = struct.unpack("<I", head[4:8])[0]
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version} is not supported (supported: 2, 3)")


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file (memory-mapped; no tensor data is copied).

    Raises:
        GGUFError: not a GGUF, truncated, or corrupt (the message says which and where).
    """
    return GGUFFile(path)


__all__ = ["GGUFFile", "TensorInfo", "open_gguf", "GGUFValueType"]
