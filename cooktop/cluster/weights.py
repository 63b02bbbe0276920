"""Getting a segment's weights onto its node: the node's own copy of the GGUF, or shipped once.

A node that holds the driver's GGUF at the same path (same size and
:func:`~cooktop.cluster.nodes.file_fingerprint`) opens it there. Otherwise the
driver puts the tensors that segment reads (``blk.N.*`` of its blocks, the
global tensors, and for the head segment ``output*`` — plus ``token_embd`` when
the output is tied to it) into Ray's object store, one object per tensor (so
the driver holds one tensor at a time beyond its memory map), together with the
file's metadata; the node writes them as a partial GGUF (gguf's ``GGUFWriter``)
into its cache folder (``COOKTOP_RAY_CACHE``, default ``<tmp>/cooktop-ray``) and
opens that. The partial file is named by the model's fingerprint and the
tensor set, so a restarted segment on that node finds it and nothing is shipped again.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from ..errors import ClusterError
from ..format.gguf import GGUFFile
from ..model.config import ModelConfig
from .connect import import_ray
from .nodes import file_fingerprint

ENV_CACHE = "COOKTOP_RAY_CACHE"


def cache_dir() -> str:
    """Folder of the partial GGUFs shipped to this node (``COOKTOP_RAY_CACHE``)."""
    return os.environ.get(ENV_CACHE) or os.path.join(tempfile.gettempdir(), "cooktop-ray")


def tensor_names(gf: GGUFFile, cfg: ModelConfig, blocks: list[int], head: bool) -> list[str]:
    """Names of the tensors a segment of ``blocks`` (plus the head when ``head``) reads, in file
    order: what the architecture (``model/arch``) lists for each of those units."""
    from ..model.arch import architecture
    from ..model.arch.base import HEAD

    arch = architecture(cfg.arch)
    want: set[str] = set()
    units: list[int | str] = [*blocks, *([HEAD] if head else [])]
    for unit in units:
        want.update(name for name, _spec in arch.unit_tensors(gf.tensors, unit).values())
    return [n for n in gf.tensors if n in want]


def partial_name(fingerprint: str, names: list[str]) -> str:
    """File name of the partial GGUF holding ``names`` of the model with ``fingerprint``."""
    h = hashlib.sha256(fingerprint.encode())
    for n in names:
        h.update(b"\0" + n.encode())
    return f"{h.hexdigest()[:32]}.gguf"


def metadata_fields(gf: GGUFFile) -> list[tuple[str, Any, Any, Any]]:
    """``(key, value, GGUFValueType, array item type or None)`` of every metadata key but
    ``general.architecture`` and ``general.alignment`` (GGUFWriter writes those), as stored
    (strings as bytes; :attr:`GGUFFile.raw`). Arrays of arrays, which the reader skips, are left out."""
    out = []
    for key, v in gf.raw.items():
        if key in ("general.architecture", "general.alignment") or v.value is None:
            continue
        value = v.value.tolist() if hasattr(v.value, "tolist") else v.value
        out.append((key, value, v.type, v.sub_type))
    return out


def where_here(path: str, fingerprint: str, partial: str) -> dict[str, Any]:
    """On a node: where the model's weights are there.

    Returns:
        ``{"how": "local" | "cached" | None, "path": file to open or None, "cache": where a
        shipment goes}``: the same file at ``path``, a partial GGUF shipped before, or nothing.
    """
    cached = os.path.join(cache_dir(), partial)
    if os.path.exists(path) and file_fingerprint(path) == fingerprint:
        return {"how": "local", "path": path, "cache": cached}
    if os.path.exists(cached):
        return {"how": "cached", "path": cached, "cache": cached}
    return {"how": None, "path": None, "cache": cached}


class Shipment:
    """The tensors of one segment in the object store, ready for its node (module doc).

    Attributes:
        arch: ``general.architecture``; fields: ObjectRef of :func:`metadata_fields`;
        tensors: ``(name, ObjectRef of the raw data, GGML type)`` each; n_bytes: their size.
    """

    def __init__(self, gf: GGUFFile, names: list[str], fields_ref: Any, refs: dict[str, Any]):
        ray = import_ray()
        self.arch = gf.architecture
        self.fields = fields_ref
        self.tensors = []
        self.n_bytes = 0
        for name in names:
            t = gf.tensor(name)
            if name not in refs:
                refs[name] = ray.put(t.data)
            self.tensors.append((name, refs[name], t.ggml_type))
            self.n_bytes += t.n_bytes


def write_partial(path: str, arch: str, fields: list[tuple[str, Any, Any, Any]],
                  tensors: list[tuple[str, Any, Any]]) -> str:
    """Write a GGUF of ``tensors`` (``(name, raw data, GGML type)``) and metadata ``fields``
    (:func:`metadata_fields`) at ``path``, atomically; returns ``path``.

    Raises:
        ClusterError: the file cannot be written (disk full, no permission).
    """
    from gguf import GGUFWriter

    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        w = GGUFWriter(tmp, arch=arch)
        for key, value, vtype, sub in fields:
            w.add_key_value(key, value, vtype, sub_type=sub)
        for name, data, ggml_type in tensors:
            w.add_tensor(name, data, raw_dtype=ggml_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except OSError as e:
        raise ClusterError(f"cannot write the shipped weights to {path}: {e}; free space there or set "
                           f"{ENV_CACHE} to another folder") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def materialize(shipment: Shipment, path: str) -> str:
    """On the node: fetch ``shipment`` from the object store and write it at ``path`` (:func:`write_partial`),
    a file directly in :func:`cache_dir`.

    Raises:
        ClusterError: the file cannot be written, or ``path`` is not in the cache folder.
    """
    folder = os.path.realpath(cache_dir())
    if os.path.dirname(os.path.realpath(path)) != folder:  # never over a model file
        raise ClusterError(f"refusing to write shipped weights outside {folder} ({ENV_CACHE}): {path}")
    ray = import_ray()
    tensors = [(name, ray.get(ref), ggml_type) for name, ref, ggml_type in shipment.tensors]
    return write_partial(path, shipment.arch, ray.get(shipment.fields), tensors)
