"""Importance-matrix files (``llama-imatrix`` output) read as llama-quantize reads them.

Sources: common/imatrix-loader.cpp (the GGUF format: tensors ``<weight>.in_sum2`` (sums of squared
activations, ``ne0 * n_matrices`` values) and ``<weight>.counts`` (one count per matrix), keys
``imatrix.datasets``, ``imatrix.chunk_count``, ``imatrix.chunk_size``; and the legacy ``.dat`` format: int32
entry count, then per entry an int32 name length, the name, int32 ncall, int32 nval, nval float32, then
optionally int32 chunk count and a dataset name) and tools/quantize/quantize.cpp ``load_imatrix`` (the
values handed to the quantizer: ``in_sum2 / count`` per matrix, 1 where a count is 0; legacy ``sums /
ncall``), ``prepare_imatrix`` (``--include-weights`` / ``--exclude-weights``: substring filters).
"""

from __future__ import annotations

import dataclasses
import os
import struct

import numpy as np

from ..errors import CooktopError, GGUFError
from ..format.gguf import open_gguf

F32 = np.float32


@dataclasses.dataclass
class Imatrix:
    """Importance vectors by weight name.

    Attributes:
        path: the file.
        entries: weight name -> float32 [ne0 * n_matrices] (an expert tensor has one vector per expert).
        datasets: the calibration datasets named in the file.
        chunk_count: chunks the statistics were collected on (0 if unknown).
    """

    path: str
    entries: dict[str, np.ndarray]
    datasets: list[str]
    chunk_count: int

    def filter(self, include=(), exclude=()) -> Imatrix:
        """``--exclude-weights`` then ``--include-weights`` (substrings of names), as prepare_imatrix."""
        entries = {k: v for k, v in self.entries.items() if not any(e in k for e in exclude)}
        if include:
            entries = {k: v for k, v in entries.items() if any(i in k for i in include)}
        return Imatrix(self.path, entries, self.datasets, self.chunk_count)


def _load_gguf(path: str) -> Imatrix:
    f = open_gguf(path)
    md = f.metadata
    if not all(k in md for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")):
        raise CooktopError(f"{path}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, "
                           "imatrix.chunk_size): not an importance matrix from llama-imatrix")
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    for name, t in f.tensors.items():
        for suffix, into in ((".in_sum2", sums), (".counts", counts)):
            if name.endswith(suffix):
                if t.ggml_type.name != "F32":
                    raise CooktopError(f"{path}: {name} must be F32")
                into[name[:-len(suffix)]] = np.asarray(t.data, dtype=F32).reshape(-1)
    entries = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            raise CooktopError(f"{path}: mismatched sums and counts for {name}")
        s, c = sums[name], np.round(counts[name]).astype(np.int64)  # std::lround
        ne0 = s.size // max(1, c.size)
        cf = c.astype(F32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(cf > 0, s.reshape(c.size, ne0) / np.where(cf > 0, cf, F32(1)), F32(1))
        entries[name] = v.astype(F32).reshape(-1)
    ds = md.get("imatrix.datasets")
    datasets = [str(d) for d in ds] if isinstance(ds, list) else []
    return Imatrix(path, entries, datasets, int(md.get("imatrix.chunk_count") or 0))


def _load_legacy(path: str, buf: bytes) -> Imatrix:
    def bad(what: str) -> CooktopError:
        return CooktopError(f"{path}: not an importance matrix ({what})")

    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(buf):
            raise bad("the file ends early")
        b = buf[pos:pos + n]
        pos += n
        return b

    (n_entries,) = struct.unpack("<i", take(4))
    if n_entries < 1:
        raise bad("no entries")
    entries = {}
    for _ in range(n_entries):
        (ln,) = struct.unpack("<i", take(4))
        if ln < 0:
            raise bad("a negative name length")
        name = take(ln).split(b"\0")[0].decode("utf-8", "replace")
        ncall, nval = struct.unpack("<ii", take(8))
        if nval < 1:
            raise bad(f"entry {name!r} has no values")
        sums = np.frombuffer(take(4 * nval), dtype="<f4").astype(F32)
        entries[name] = (sums / F32(ncall)).astype(F32) if ncall > 0 else sums
    chunk_count, datasets = 0, []
    if pos + 4 <= len(buf):
        (chunk_count,) = struct.unpack("<i", take(4))
        if pos + 4 <= len(buf):
            (ln,) = struct.unpack("<i", take(4))
            if 0 < ln <= len(buf) - pos:
                datasets = [take(ln).split(b"\0")[0].decode("utf-8", "replace")]
    return Imatrix(path, entries, datasets, chunk_count)


def load(path: str | os.PathLike) -> Imatrix:
    """Read an importance matrix: llama-imatrix's GGUF file or its legacy ``.dat``.

    Raises:
        CooktopError: no such file, or neither format (the message says what is wrong).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CooktopError(f"{path}: no such imatrix file")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == b"GGUF":
        try:
            return _load_gguf(path)
        except GGUFError as e:
            raise CooktopError(f"imatrix: {e}") from None
    with open(path, "rb") as fh:
        return _load_legacy(path, fh.read())
