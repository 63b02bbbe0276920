"""``--vs llama.cpp``: the same tests through llama-cpp-python, in this process, on the CPU.

llama.cpp runs with ``n_gpu_layers=0``, ``n_threads = n_threads_batch = `` the
logical core count, ``n_batch = n_ubatch = -b`` (so prompt chunks match
cooktop's) and ``logits_all=False``; tokens go through ``Llama.eval``, which
removes cached positions past the context (``kv_cache_seq_rm``) and decodes
in ``n_batch`` chunks, computing logits for the last token only.
"""

from __future__ import annotations

import os
import time

from ..errors import CooktopError

#: How to get llama-cpp-python, shown when it does not import.
INSTALL_HINT = ("install llama-cpp-python (builds llama.cpp from source, about 3 minutes): "
                "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install 'cooktop[compare]' "
                "(CMAKE_ARGS=\"-DGGML_NATIVE=ON\" gives a CPU build tuned for this machine)")

#: ``--vs`` values understood.
ENGINES = ("llama.cpp",)


class LlamaCppUnavailable(CooktopError):
    """``--vs llama.cpp`` without an importable ``llama_cpp`` module."""


def import_llama_cpp():
    """The ``llama_cpp`` module.

    Raises:
        LlamaCppUnavailable: not installed (or its native library fails to load); the
            message says how to install it.
    """
    try:
        import llama_cpp
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError from the shared library
        raise LlamaCppUnavailable(f"--vs llama.cpp needs llama-cpp-python ({type(e).__name__}: {e}); "
                                  f"{INSTALL_HINT}") from None
    return llama_cpp


def version() -> str | None:
    """llama-cpp-python's version, or None when not importable."""
    try:
        return import_llama_cpp().__version__
    except CooktopError:
        return None


class LlamaCppRunner:
    """llama-cpp-python's ``Llama`` on one model, the :class:`~cooktop.bench.runner.Runner` protocol.

    Args:
        path: GGUF path; n_ctx: context (tokens); n_batch: chunk size (tokens);
        n_threads: CPU threads (default: logical cores).
    Raises:
        LlamaCppUnavailable: not installed.
        CooktopError: llama.cpp cannot load the model.
    """

    backend = "llama.cpp"
    device = "cpu"

    def __init__(self, path: str, n_ctx: int, n_batch: int, n_threads: int | None = None):
        llama_cpp = import_llama_cpp()
        n_threads = n_threads or os.cpu_count() or 1
        t0 = time.perf_counter()
        try:
            self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(n_ctx, 8), n_batch=n_batch, n_ubatch=n_batch,
                                       n_threads=n_threads, n_threads_batch=n_threads, n_gpu_layers=0,
                                       logits_all=False, verbose=False, seed=1234)
        except Exception as e:  # noqa: BLE001 - llama_cpp raises ValueError on load failures
            raise CooktopError(f"llama.cpp cannot load {path}: {type(e).__name__}: {e}") from None
        self.load_ms = (time.perf_counter() - t0) * 1e3
        self.device_name = f"CPU, {n_threads} threads (llama-cpp-python {llama_cpp.__version__})"
        self.placement = "n_gpu_layers=0"

    def reset(self) -> None:
        self.llm.reset()

    def prompt(self, tokens: list[int]) -> None:
        self.llm.eval(tokens)

    def decode(self, token: int) -> None:
        self.llm.eval([token])

    def close(self) -> None:
        self.llm.close()


def factory(engine: str):
    """``vs(path, n_ctx, n_batch) -> runner`` for ``--vs ENGINE``, checking the import first.

    Raises:
        CooktopError: unknown engine name.
        LlamaCppUnavailable: llama-cpp-python missing.
    """
    if engine.strip().lower() not in ENGINES:
        raise CooktopError(f"--vs {engine!r}: only {', '.join(ENGINES)} is supported")
    import_llama_cpp()
    return lambda path, n_ctx, n_batch: LlamaCppRunner(path, n_ctx, n_batch)
