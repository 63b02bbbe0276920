"""The models a router-mode server offers (llama-server's sources, common/preset.cpp
``load_from_models_dir`` and ``load_from_cache``, common/download.cpp ``common_list_cached_models``):

- ``--models-dir DIR``: each ``NAME.gguf`` in it is model ``NAME``; each subfolder ``NAME`` holding GGUFs
  is model ``NAME`` (its ``-00001-of-`` shard if split, else its one file; ``mmproj`` files and
  drafts' ``mtp-`` / ``dspark-`` / ``dflash-`` files are companions, not models);
- the Hugging Face cache: each GGUF whose name ends in a tag (``-Q4_K_M``, ``.F32``: llama.cpp's
  ``[-.]([A-Z0-9_]+)$``), the first shard of split ones, is model ``owner/name:TAG``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re

from ..errors import CooktopError
from ..tools import hub

DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-", "eagle3-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """One model the router can load. id: its name in requests; path: the GGUF to load;
    source: ``models-dir`` or ``cache`` (llama-server's ``source`` field)."""

    id: str
    path: str
    source: str


def _companion(name: str) -> bool:
    return "mmproj" in name or name.startswith(DRAFT_PREFIXES)


def models_dir(d: str | os.PathLike) -> list[ModelSource]:
    """The models of a ``--models-dir`` folder (module doc), sorted by name.

    Raises:
        CooktopError: ``d`` is not a folder.
    """
    root = pathlib.Path(d)
    if not root.is_dir():
        raise CooktopError(f"--models-dir {d}: does not exist or is not a directory")
    out = []
    for p in sorted(root.iterdir()):
        if p.is_dir():
            ggufs = sorted(f for f in p.iterdir() if f.name.endswith(".gguf") and not _companion(f.name))
            first = [f for f in ggufs if "-00001-of-" in f.name]
            pick = first[0] if first else (ggufs[-1] if ggufs else None)  # llama.cpp keeps the last it lists
            if pick is not None:
                out.append(ModelSource(p.name, str(pick), "models-dir"))
        elif p.name.endswith(".gguf") and not _companion(p.name):
            out.append(ModelSource(p.name[:-len(".gguf")], str(p), "models-dir"))
    return out


def gguf_tag(filename: str) -> tuple[str, int]:
    """(tag, shard index) of a cached GGUF's name, as llama.cpp's ``get_gguf_split_info``: the stem's
    trailing ``[-.]TAG`` upper-cased ("" if none) and the shard number (1 if not split)."""
    stem = pathlib.PurePosixPath(filename).name.removesuffix(".gguf")
    index = 1
    m = _SPLIT.match(stem)
    if m:
        stem, index = m.group(1), int(m.group(2))
    t = _TAG.search(stem)
    return (t.group(1).upper() if t else ""), index


def cached_models(cache_dir: str | os.PathLike | None = None) -> list[ModelSource]:
    """The tagged models of the Hugging Face cache (module doc), one per ``repo:TAG``."""
    out, seen = [], set()
    for repo, snaps in hub.cached_repos(cache_dir).items():
        for snap in sorted(snaps.iterdir()):
            for f in sorted(snap.rglob("*.gguf")):
                tag, index = gguf_tag(f.name)
                if index != 1 or not tag or _companion(f.name):
                    continue
                mid = f"{repo}:{tag}"
                if mid not in seen:
                    seen.add(mid)
                    out.append(ModelSource(mid, str(f), "cache"))
    return out


def discover(dir_: str | None, cache_dir: str | os.PathLike | None = None) -> dict[str, ModelSource]:
    """Every model of ``--models-dir`` (if given) and of the cache, by id (a folder's name wins over
    the cache's same id).

    Raises:
        CooktopError: ``dir_`` is not a folder.
    """
    found = {m.id: m for m in cached_models(cache_dir)}
    if dir_ is not None:
        found.update({m.id: m for m in models_dir(dir_)})
    return found
