"""One log from every process of a test run, for the validation harnesses (vulkan_validation.py,
opencl_validation.py).

A checker (the Khronos layer, Oclgrind) opens its log file anew in each process and would
truncate a plain file; :func:`run_collecting` gives it a FIFO instead, read by a thread of the
parent, so the messages of every process arrive in order. The pytest child writes marker lines
into the same FIFO (:func:`mark`), so each message is attributed to the test that was running.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


def run_collecting(tmp: str, name: str, run: Callable[[str], int]) -> tuple[int, str]:
    """Make the FIFO ``tmp/name``, call ``run(fifo_path)`` (which starts the child that writes to
    it) while a thread reads it, and return ``(run's result, the text read)``."""
    fifo = os.path.join(tmp, name)
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep_open = os.open(fifo, os.O_WRONLY)  # no EOF while writers come and go
    os.set_blocking(rfd, True)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            b = os.read(rfd, 1 << 16)
            if not b:
                return
            chunks.append(b)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        rc = run(fifo)
    finally:
        os.close(keep_open)
        reader.join(timeout=30)
        os.close(rfd)
    return rc, b"".join(chunks).decode(errors="replace")


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
