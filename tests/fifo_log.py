"""One log from every process of a test run, for the validation harnesses (vulkan_validation.py,
opencl_validation.py).

A checker (the Khronos layer, Oclgrind) opens its log file anew in each process and would
truncate a plain file; :func:`run_collecting` gives it a FIFO instead, read by a thread of the
parent, so the messages of every process arrive in order. The pytest child writes marker lines
into the same FIFO (:func:`mark`), so each message is attributed to the test that was running.

Under pytest-xdist (``-n N``) several workers run tests at once, and one FIFO would interleave their
messages and markers. :func:`run_collecting` then also makes one FIFO per worker (``NAME.gw0`` ...),
and each worker's plugin calls :func:`use_worker_files` at import, before any checker starts in
it, so that worker and the processes it starts write to their own FIFO (and read their own
settings file); the text returned has one section per FIFO, each opened by a ``worker`` marker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


def xdist_workers(pytest_args: list[str]) -> int:
    """How many pytest-xdist workers ``pytest_args`` ask for (``-n N``, ``-nN``, ``--numprocesses N``;
    ``auto`` / ``logical``: this machine's CPU count); 0 without ``-n``."""
    value = None
    for i, a in enumerate(pytest_args):
        if a in ("-n", "--numprocesses") and i + 1 < len(pytest_args):
            value = pytest_args[i + 1]
        elif a.startswith("--numprocesses="):
            value = a.split("=", 1)[1]
        elif a.startswith("-n") and len(a) > 2 and not a.startswith("--"):
            value = a[2:]
    if value is None:
        return 0
    if value in ("auto", "logical"):
        return os.cpu_count() or 1
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def worker_ids(workers: int) -> list[str]:
    """pytest-xdist's worker ids: ``gw0`` ... ``gw{workers-1}``."""
    return [f"gw{i}" for i in range(workers)]


def run_collecting(tmp: str, name: str, run: Callable[[str], int], *, workers: int = 0,
                   marker: str = "") -> tuple[int, str]:
    """Make the FIFO ``tmp/name`` (and ``tmp/name.gwK`` for each of ``workers`` xdist workers), call
    ``run(fifo_path)`` (which starts the child that writes to them) while a thread per FIFO reads
    it, and return ``(run's result, the text read)``: the main FIFO's text, then each worker's,
    each after a line ``{marker} worker gwK``."""
    base = os.path.join(tmp, name)
    paths = [base] + [f"{base}.{w}" for w in worker_ids(workers)]
    chunks: dict[str, list[bytes]] = {p: [] for p in paths}
    fds: list[tuple[int, int]] = []
    readers = []
    for path in paths:
        os.mkfifo(path)
        rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        keep_open = os.open(path, os.O_WRONLY)  # no EOF while writers come and go
        os.set_blocking(rfd, True)
        fds.append((rfd, keep_open))

        def drain(rfd: int = rfd, out: list[bytes] = chunks[path]) -> None:
            while True:
                b = os.read(rfd, 1 << 16)
                if not b:
                    return
                out.append(b)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        readers.append(reader)
    try:
        rc = run(base)
    finally:
        for _rfd, keep_open in fds:
            os.close(keep_open)
        for reader in readers:
            reader.join(timeout=30)
        for rfd, _keep in fds:
            os.close(rfd)
    parts = [b"".join(chunks[base]).decode(errors="replace")]
    for w in worker_ids(workers):
        text = b"".join(chunks[f"{base}.{w}"]).decode(errors="replace")
        if text:
            parts.append(f"{marker} worker {w}\n{text}")
    return rc, "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts)


def use_worker_files(*env_vars: str) -> None:
    """In a pytest-xdist worker (``PYTEST_XDIST_WORKER`` set): point each of ``env_vars`` that names
    a file with a per-worker copy (``PATH.gwK``, made by :func:`run_collecting` or the harness) at
    that copy, in this process's environment, which the processes it starts inherit. Call it
    before any checker reads them (at the plugin's import). Outside xdist, or for a worker id no
    copy was made for (a restarted worker), nothing changes: that worker writes to the main FIFO."""
    wid = os.environ.get("PYTEST_XDIST_WORKER")
    if not wid:
        return
    for var in env_vars:
        path = os.environ.get(var)
        if path and os.path.exists(f"{path}.{wid}"):
            os.environ[var] = f"{path}.{wid}"


def mark(env_var: str, marker: str, line: str) -> None:
    """Write ``marker line`` into the FIFO named by ``env_var`` (nothing when unset), in one
    atomic write (at most PIPE_BUF bytes)."""
    path = os.environ.get(env_var)
    if not path:
        return
    data = (f"{marker} {line}\n").encode()[:4000]
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
