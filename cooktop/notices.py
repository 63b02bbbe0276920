"""What cooktop says on stderr besides errors, and where it keeps files between runs.

- **Verbosity** is process-wide, as in llama-cpp-python (whose ``verbose`` sets
  llama.cpp's global log callback): :func:`set_verbose` ``(False)`` (what
  ``Llama(verbose=False)`` calls) silences every notice and progress bar;
  ``(True)`` (``Llama(verbose=True)``, ``cooktop --verbose``) also shows the
  ``cooktop`` logger's INFO records (compiler output among them) when the
  application configured no logging; ``None`` is the default: notices on,
  logging as the application set it up.
- **Notices** (:func:`notice`) are single lines on stderr that say why the user
  waits, e.g. ``cooktop: compiling OpenCL kernels for opencl:0, <name> (first
  run only)``; :func:`progress` is a tqdm bar that appears only when the work
  takes longer than :data:`BAR_DELAY_S` and stderr is a terminal.
- **Driver output**: compilers inside drivers (clang in PoCL) write
  "N warnings generated." straight to file descriptor 2, where no Python
  logging can catch it; :func:`capture_stderr` points fd 2 at a temporary file
  for the duration of a driver call and hands back what was written, so the
  caller can log it instead.
- :func:`cache_dir`: ``$COOKTOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/cooktop``, else
  ``~/.cache/cooktop`` (probe verdicts, first-compile markers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("cooktop")

#: Seconds of work before a progress bar appears.
BAR_DELAY_S = 1.5

_verbose: bool | None = None
_handler: logging.Handler | None = None
_fd_lock = threading.RLock()
_fd_depth = 0
_noticed: set[str] = set()


_NULL = logging.NullHandler()


def set_verbose(verbose: bool | None) -> None:
    """Set the process-wide verbosity (see the module docstring).

    Args:
        verbose: False: nothing on stderr; True: notices, bars and INFO logging; None: default.
    """
    global _verbose, _handler
    _verbose = verbose
    logger = logging.getLogger("cooktop")
    # False: a NullHandler keeps logging's last-resort handler from printing cooktop's warnings
    # (an application's own logging configuration still gets them through propagation)
    if verbose is False and _NULL not in logger.handlers:
        logger.addHandler(_NULL)
    elif verbose is not False and _NULL in logger.handlers:
        logger.removeHandler(_NULL)
    if verbose and _handler is None and not logger.handlers and not logging.getLogger().handlers:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("cooktop: %(message)s"))
        logger.addHandler(_handler)
        logger.setLevel(logging.INFO)
    elif not verbose and _handler is not None:
        logger.removeHandler(_handler)
        logger.setLevel(logging.NOTSET)
        _handler = None


def enabled() -> bool:
    """Whether notices and progress bars may be printed (False after ``set_verbose(False)``)."""
    return _verbose is not False


def notice(message: str, once_key: str | None = None) -> None:
    """Print ``cooktop: <message>`` on stderr (one line) unless silenced; always logged at DEBUG.

    Args:
        once_key: print at most once per process for this key.
    """
    if once_key is not None:
        if once_key in _noticed:
            return
        _noticed.add(once_key)
    log.debug("%s", message)
    if enabled():
        try:
            print(f"cooktop: {message}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed stderr never fails the caller
            pass


class _NoBar:
    """Stand-in for a tqdm bar when bars are off."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def progress(total: int, desc: str, unit: str = "it") -> Any:
    """A tqdm progress bar on stderr shown after :data:`BAR_DELAY_S` seconds (cleared when closed),
    or a no-op bar when notices are off, stderr is not a terminal, or tqdm is missing."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not enabled() or not tty:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, delay=BAR_DELAY_S, leave=False)


class Captured:
    """What a driver wrote to file descriptor 2 inside :func:`capture_stderr` (``text``)."""

    text: str = ""


@contextlib.contextmanager
def capture_stderr(keep_python: bool = False, path: str | None = None) -> Iterator[Captured]:
    """Redirect file descriptor 2 to a temporary file while the block runs; ``.text`` holds it after.

    Captures are serialized (one at a time in the process; nested ones in the same thread
    yield an empty capture and leave the outer one in place). Output other threads write to
    stderr meanwhile is captured too. If the descriptor cannot be redirected the block
    runs without capture. ``keep_python``: ``sys.stderr`` keeps writing to the real stderr
    meanwhile (a notice such as the first-compile one still shows; only C-level writes are taken).
    ``path``: capture into this file instead (truncated first, left in place): what a process
    killed inside the block had written stays readable there (the probe child's driver output).
    """
    global _fd_depth
    cap = Captured()
    with _fd_lock:
        if _fd_depth:
            yield cap
            return
        try:
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        try:
            saved = os.dup(2)
            tmp = open(path, "w+b") if path else tempfile.TemporaryFile()  # noqa: SIM115 - closed below
        except OSError:
            yield cap
            return
        _fd_depth += 1
        py_err, kept = sys.stderr, None
        try:
            os.dup2(tmp.fileno(), 2)
            if keep_python:
                try:
                    kept = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")
                    sys.stderr = kept
                except OSError:
                    kept = None
            try:
                yield cap
            finally:
                if kept is not None:
                    sys.stderr = py_err
                    kept.close()
                os.dup2(saved, 2)
                tmp.seek(0)
                cap.text = tmp.read().decode("utf-8", errors="replace")
        finally:
            _fd_depth -= 1
            os.close(saved)
            tmp.close()


def cache_dir(*parts: str) -> str:
    """The folder ``<cooktop cache>/<parts...>`` (see the module docstring); not created here."""
    base = os.environ.get("COOKTOP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "cooktop")
    return os.path.join(base, *parts)
