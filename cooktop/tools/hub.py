"""Resolve models from the Hugging Face Hub cache (``-hf REPO[:FILE]``, the default model).

Downloads go through ``huggingface_hub.hf_hub_download`` (honours
``HF_ENDPOINT``, ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE``); a file already in the
cache is used without the network; offline (``HF_HUB_OFFLINE=1``, or llama.cpp's ``--offline``:
:func:`set_offline`) nothing else is tried. ``python -m cooktop.tools.hub --seed FILE``
puts a local copy of the default model into the cache (after checking its
sha256), so the default model works on machines without internet.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import pathlib
import re
import shutil
import socket
import sys
import urllib.parse

from ..errors import CooktopError

DEFAULT_REPO = "ggml-org/tiny-llamas"
DEFAULT_FILE = "stories260K.gguf"
#: sha256 of ggml-org/tiny-llamas stories260K.gguf (shared/models/README.md).
DEFAULT_SHA256 = "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d"
#: Revision name used for seeded snapshots (a commit-hash-shaped placeholder).
SEED_REVISION = "0" * 40


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_hf(spec: str, hf_file: str | None = None) -> tuple[str, str]:
    """``"owner/repo:file.gguf"`` (or ``spec`` + ``--hf-file``) -> ``(repo, file)``.

    Raises:
        CooktopError: no file name given or the repo id is malformed.
    """
    repo, file, tag = parse_hf_spec(spec, hf_file)
    if not file:
        raise CooktopError(f"-hf {spec!r} names no file: use -hf {repo}:FILE.gguf or --hf-file FILE.gguf")
    return repo, file


def parse_hf_spec(spec: str, hf_file: str | None = None) -> tuple[str, str | None, str | None]:
    """``-hf`` as llama.cpp reads it: ``owner/repo[:QUANT]`` or ``owner/repo:FILE.gguf``.

    Returns:
        ``(repo, file or None, quant tag or None)``: a part after ``:`` ending in
        ``.gguf`` is a file name (cooktop's older form), anything else a quant tag
        (``Q4_K_M``, ``q8_0``); ``--hf-file`` wins over both.
    Raises:
        CooktopError: a malformed repo id or an empty tag.
    """
    repo, colon, rest = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise CooktopError(f"bad -hf repo {spec!r}: expected OWNER/REPO[:QUANT] or OWNER/REPO:FILE.gguf")
    if colon and not rest:
        raise CooktopError(f"-hf {spec!r} has an empty quant tag after ':'; use -hf {repo}:Q4_K_M, "
                           f"-hf {repo} (the default quant) or --hf-file FILE.gguf")
    if hf_file:
        return repo, hf_file, None
    if rest.lower().endswith(".gguf"):
        return repo, rest, None
    return repo, None, rest or None


#: Quant tags tried, in order, when ``-hf`` names none (Hugging Face's default for llama.cpp is Q4_K_M).
DEFAULT_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def _later_shard(f: str) -> bool:
    """True for shard 2, 3... of a split GGUF (``-00002-of-00003.gguf``); llama.cpp opens the first."""
    m = _SHARD.search(f)
    return m is not None and int(m.group(1)) != 1


def pick_gguf(files: list[str], tag: str | None, repo: str = "the repo") -> str:
    """The GGUF of a repo for a quant tag, as ``-hf owner/repo[:QUANT]`` picks it in llama.cpp.

    Projector files (``mmproj``) and all but the first shard of a split model are
    skipped. A tag matches a file name containing it between separators, case
    insensitive (``Q4_K`` does not match ``Q4_K_M``). Without a tag: the first of
    :data:`DEFAULT_QUANTS` present, else the only (or first, sorted) GGUF.

    Raises:
        CooktopError: no GGUF, or none with the tag (the message lists the tags there are).
    """
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in os.path.basename(f).lower())
    ggufs = [f for f in ggufs if not _later_shard(f)]
    if not ggufs:
        raise CooktopError(f"{repo} has no GGUF file")

    def with_tag(t: str) -> list[str]:
        rx = re.compile(rf"(^|[-._/]){re.escape(t)}([-.]|$)", re.IGNORECASE)
        return [f for f in ggufs if rx.search(os.path.basename(f))]

    if tag:
        hits = with_tag(tag)
        if not hits:
            names = ", ".join(os.path.basename(f) for f in ggufs[:12])
            raise CooktopError(f"{repo} has no GGUF for quant {tag!r}; it has: {names}")
        return min(hits, key=lambda f: (len(f), f))
    for t in DEFAULT_QUANTS:
        hits = with_tag(t)
        if hits:
            return min(hits, key=lambda f: (len(f), f))
    return ggufs[0]


#: Projector types preferred, in order, when no projector carries the model's quant tag.
MMPROJ_PREFERENCE = ("F16", "BF16", "F32", "Q8_0")


def pick_mmproj(files: list[str], model_file: str | None = None) -> str | None:
    """The vision projector (``mmproj*.gguf``) of a repo's files, for ``-hf`` with an image, as
    llama.cpp's ``-hf`` fetches a repo's mmproj beside its model; None when there is none.

    One projector: that one. Several: the one in the folder of ``model_file`` (a repo with a
    folder per model), then the one whose name carries the model's quant tag, then the first of
    :data:`MMPROJ_PREFERENCE` in its name, then the first sorted.
    """
    found = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" in os.path.basename(f).lower())
    if len(found) <= 1:
        return found[0] if found else None
    if model_file is not None:
        here = [f for f in found if os.path.dirname(f) == os.path.dirname(model_file)]
        found = here or found
        base = os.path.basename(model_file)
        for t in (*DEFAULT_QUANTS, *MMPROJ_PREFERENCE, "Q4_0", "Q5_K_M", "Q6_K", "Q8_0"):
            rx = re.compile(rf"(^|[-._]){re.escape(t)}([-.]|$)", re.IGNORECASE)
            if rx.search(base):
                hits = [f for f in found if rx.search(os.path.basename(f))]
                if hits:
                    return hits[0]
                break
    for t in MMPROJ_PREFERENCE:
        rx = re.compile(rf"(^|[-._]){re.escape(t)}([-.]|$)", re.IGNORECASE)
        hits = [f for f in found if rx.search(os.path.basename(f))]
        if hits:
            return hits[0]
    return found[0]


def download_mmproj(repo: str, model_file: str | None = None, *,
                    cache_dir: str | os.PathLike | None = None) -> str | None:
    """Local path of ``repo``'s vision projector (:func:`pick_mmproj`), downloaded into the cache;
    None when the repo has none.

    Raises:
        CooktopError: the repo cannot be listed, or the download fails (see :func:`resolve`).
    """
    name = pick_mmproj(repo_files(repo, cache_dir), model_file)
    return None if name is None else resolve(repo, name, cache_dir=cache_dir)


def cached_files(repo: str, cache_dir: str | os.PathLike | None = None) -> list[str]:
    """File names of ``repo`` in the local Hugging Face cache (every snapshot), sorted."""
    root = pathlib.Path(cache_dir) if cache_dir else _cache_dir()
    snaps = root / ("models--" + repo.replace("/", "--")) / "snapshots"
    out: set[str] = set()
    if snaps.is_dir():
        for snap in snaps.iterdir():
            for p in snap.rglob("*"):
                if p.is_file() or p.is_symlink():
                    out.add(p.relative_to(snap).as_posix())
    return sorted(out)


def cached_repos(cache_dir: str | os.PathLike | None = None) -> dict[str, pathlib.Path]:
    """The model repositories in the local Hugging Face cache: ``owner/name`` -> its snapshots folder."""
    root = pathlib.Path(cache_dir) if cache_dir else _cache_dir()
    out = {}
    if root.is_dir():
        for d in sorted(root.glob("models--*")):
            if (d / "snapshots").is_dir():
                out[d.name[len("models--"):].replace("--", "/")] = d / "snapshots"
    return out


_offline_flag = False


def set_offline(on: bool = True) -> None:
    """Use only the cache from now on in this process (llama.cpp's ``--offline``), whatever
    ``HF_HUB_OFFLINE`` says."""
    global _offline_flag
    _offline_flag = bool(on)


def offline() -> bool:
    """True when nothing may be downloaded: :func:`set_offline`, or ``HF_HUB_OFFLINE``."""
    from huggingface_hub import constants
    return _offline_flag or constants.is_offline_mode()


def repo_files(repo: str, cache_dir: str | os.PathLike | None = None) -> list[str]:
    """File names of ``repo``: the Hub's listing when reachable, else what the cache holds.

    Raises:
        CooktopError: neither the Hub nor the cache knows the repo.
    """
    from huggingface_hub import constants
    cached = cached_files(repo, cache_dir)
    if offline():
        if cached:
            return cached
        raise CooktopError(f"{repo} is not in the Hugging Face cache and downloads are off (--offline or "
                           "HF_HUB_OFFLINE); allow them to download, or pass a local file with -m")
    try:
        from huggingface_hub import list_repo_files
        check_reachable(constants.ENDPOINT)
        return sorted(set(list_repo_files(repo)) | set(cached))
    except _request_errors() as e:
        if cached:
            return cached
        raise CooktopError(f"cannot list the files of {repo} ({constants.ENDPOINT}): {_first_line(e)}; "
                           "pass a local file with -m") from None


def download(repo: str, filename: str | None = None, *, tag: str | None = None,
             cache_dir: str | os.PathLike | None = None, local_dir: str | os.PathLike | None = None) -> str:
    """Local path of one GGUF of ``repo``: ``filename`` (a name or a glob), else the file for ``tag``.

    Args:
        filename: exact name, or a glob such as ``"*q8_0.gguf"`` (llama-cpp-python's
            ``from_pretrained``) that must match one file (the first shard of a split model counts once).
        tag: quant tag when ``filename`` is None (see :func:`pick_gguf`).
        cache_dir, local_dir: as ``huggingface_hub.hf_hub_download``.
    Raises:
        CooktopError: no or several matches; download failures (see :func:`resolve`).
    """
    if filename is not None and not any(c in filename for c in "*?["):
        return resolve(repo, filename, cache_dir=cache_dir, local_dir=local_dir)
    files = repo_files(repo, cache_dir)
    if filename is None:
        return resolve(repo, pick_gguf(files, tag, repo), cache_dir=cache_dir, local_dir=local_dir)
    hits = [f for f in files if fnmatch.fnmatch(f, filename) or fnmatch.fnmatch(os.path.basename(f), filename)]
    firsts = [f for f in hits if not _later_shard(f)]
    if len(firsts) != 1:
        what = "no file" if not firsts else f"{len(firsts)} files ({', '.join(firsts[:6])})"
        raise CooktopError(f"{filename!r} matches {what} in {repo}; give a pattern that matches exactly one")
    return resolve(repo, firsts[0], cache_dir=cache_dir, local_dir=local_dir)


class UnreachableError(OSError):
    """The Hub endpoint does not answer at all (no network, a name that does not resolve)."""


def check_reachable(endpoint: str, timeout: float = 5.0) -> None:
    """One TCP connection to ``endpoint``'s host, so that a machine without network fails at
    once instead of after huggingface_hub's retries (five, 8 s apart, each printing a line).

    Raises:
        UnreachableError: the name does not resolve, or the connection is refused or times out.
    """
    u = urllib.parse.urlsplit(endpoint)
    host = u.hostname or ""
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except socket.gaierror as e:
        raise UnreachableError(f"no network: {host} does not resolve ({e.strerror or e})") from None
    except OSError as e:
        raise UnreachableError(f"no network: {host}:{port} does not answer "
                               f"({e.strerror or type(e).__name__})") from None


def _cache_dir() -> pathlib.Path:
    from huggingface_hub import constants
    return pathlib.Path(constants.HF_HUB_CACHE)


def _request_errors() -> tuple[type[BaseException], ...]:
    """Exception types of a failed hub request: huggingface_hub's own (OSError
    subclasses), its HTTP client's (``httpx2`` in huggingface_hub 2.x, ``httpx``
    in 1.x; ``requests`` errors are OSErrors), and ValueError for bad arguments."""
    import importlib

    errs: list[type[BaseException]] = [OSError, ValueError]
    for mod in ("httpx2", "httpx"):
        try:
            errs.append(importlib.import_module(mod).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


def _first_line(e: BaseException) -> str:
    """A one-line reason for a failed request (HTTP status made explicit)."""
    if isinstance(e, UnreachableError):
        return f"{e}; set HF_HUB_OFFLINE=1 to use only the cache"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status == 404:
        return "not found (HTTP 404): check the repo and file names"
    if status in (401, 403):
        return f"access denied (HTTP {status}): the repo may be gated or private; set HF_TOKEN"
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def resolve(repo: str = DEFAULT_REPO, filename: str = DEFAULT_FILE, sha256: str | None = None, *,
            cache_dir: str | os.PathLike | None = None, local_dir: str | os.PathLike | None = None) -> str:
    """Local path of ``repo/filename``: from the cache, else downloaded.

    The cache is tried first without any network access. Before downloading,
    one HEAD request (no retries) checks that the endpoint answers, so an
    unreachable endpoint fails at once rather than after huggingface_hub's
    retry back-off (about 25 s of "Retrying in 8s" warnings).

    Args:
        sha256: when given, the file must have this hash (checked after download
            and for the default model).
        cache_dir, local_dir: passed to ``hf_hub_download`` (another cache; a plain folder).
    Raises:
        CooktopError: not cached and the download failed (offline, unreachable,
            not found), or a hash mismatch. One line, saying what to do.
    """
    try:
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise CooktopError(f"huggingface_hub is needed for -hf and the default model: {e}") from None
    if sha256 is None and (repo, filename) == (DEFAULT_REPO, DEFAULT_FILE):
        sha256 = DEFAULT_SHA256
    cache_dir = None if cache_dir is None else os.fspath(cache_dir)  # hf_hub_download takes str | Path
    local_dir = None if local_dir is None else os.fspath(local_dir)
    errors = _request_errors()
    hint = "pass a local file with -m, or seed the cache: python -m cooktop.tools.hub --seed FILE"
    try:
        path = hf_hub_download(repo, filename, local_files_only=True, cache_dir=cache_dir, local_dir=local_dir)
    except errors:
        if offline():
            raise CooktopError(f"{filename} from {repo} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                               f"and downloads are off (--offline or HF_HUB_OFFLINE); allow them to download, "
                               f"or {hint}") from None
        endpoint = constants.ENDPOINT
        try:
            check_reachable(endpoint)
            get_hf_file_metadata(hf_hub_url(repo, filename))  # fail fast: no retries
            path = hf_hub_download(repo, filename, cache_dir=cache_dir, local_dir=local_dir)
        except errors as e:
            raise CooktopError(f"cannot get {filename} from {repo} ({endpoint}): {_first_line(e)}; {hint}") from None
    if sha256 and sha256_file(path) != sha256:
        raise CooktopError(f"{path}: sha256 does not match the expected {sha256}; delete it and download again")
    return path


def seed(src: str | os.PathLike, repo: str = DEFAULT_REPO, filename: str = DEFAULT_FILE,
         sha256: str | None = DEFAULT_SHA256) -> str:
    """Copy a local file into the HF cache as ``repo/filename`` (idempotent).

    Layout (huggingface_hub's cache): ``models--OWNER--REPO/blobs/<sha256>``,
    ``snapshots/<rev>/<filename>`` linking to the blob, ``refs/main`` = rev.
    Returns the snapshot path. Raises CooktopError on a hash mismatch.
    """
    digest = sha256_file(src)
    if sha256 and digest != sha256:
        raise CooktopError(f"{src}: sha256 {digest} is not the expected {sha256}")
    root = _cache_dir() / ("models--" + repo.replace("/", "--"))
    blob = root / "blobs" / digest
    snap = root / "snapshots" / SEED_REVISION / filename
    refs = root / "refs" / "main"
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        tmp = blob.with_suffix(".incomplete")
        shutil.copyfile(src, tmp)
        os.replace(tmp, blob)
    snap.parent.mkdir(parents=True, exist_ok=True)
    if not snap.exists():
        try:
            snap.symlink_to(os.path.relpath(blob, snap.parent))
        except OSError:
            shutil.copyfile(blob, snap)
    refs.parent.mkdir(parents=True, exist_ok=True)
    if not refs.exists():
        refs.write_text(SEED_REVISION)
    return str(snap)


def main(argv: list[str] | None = None) -> int:
    """``python -m cooktop.tools.hub --seed FILE [--repo R --file F]``."""
    ap = argparse.ArgumentParser(prog="python -m cooktop.tools.hub", description=__doc__.splitlines()[0])
    ap.add_argument("--seed", required=True, help="local GGUF to put into the HF cache")
    ap.add_argument("--repo", default=DEFAULT_REPO)
    ap.add_argument("--file", default=DEFAULT_FILE)
    a = ap.parse_args(argv)
    try:
        sha = DEFAULT_SHA256 if (a.repo, a.file) == (DEFAULT_REPO, DEFAULT_FILE) else None
        print(seed(a.seed, a.repo, a.file, sha))
    except CooktopError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
