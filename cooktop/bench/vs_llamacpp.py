"""``--vs llama.cpp``: the same tests through llama-cpp-python, in this process, on the CPU.

llama.cpp runs with ``n_gpu_layers=0``, ``n_threads = n_threads_batch = `` the
logical core count, ``n_batch = n_ubatch = -b`` (so prompt chunks match
cooktop's) and ``logits_all=False``; tokens go through ``Llama.eval``, which
removes cached positions past the context (``kv_cache_seq_rm``) and decodes
in ``n_batch`` chunks, computing logits for the last token only. ``truncate(n)``
sets ``Llama.n_tokens = n`` (what ``Llama.generate`` does to reuse a cached prefix), so the
next ``eval`` drops the cached positions from ``n`` on and a depth fill serves every timed run
(as llama-bench restores its saved depth state); the warm-up is llama-bench's (the test's
prompt, then one token, no depth: :func:`cooktop.bench.runner.warm_up`).

Each model is first run once in a child process (:func:`preflight`): a
llama.cpp build that dies of an illegal instruction becomes an error record
naming the signal and the rebuild command, not a dead benchmark.
"""

from __future__ import annotations

import os
import time

from ..errors import CooktopError

#: How to get llama-cpp-python, shown when it does not import.
INSTALL_HINT = ("install llama-cpp-python (builds llama.cpp from source, 3 to 45 minutes): "
                "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install 'cooktop[compare]' (a CPU build for this machine; "
                "where that build dies of SIGILL, e.g. AMX in a VM, list the ISA instead: "
                "CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
                "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF\")")

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
        n_threads: CPU threads (default: logical cores); kv: the ``KVConfig`` (``type_k``, ``type_v``,
        ``flash_attn``) or None (llama-cpp-python's defaults).
    Raises:
        LlamaCppUnavailable: not installed.
        CooktopError: llama.cpp cannot load the model.
    """

    backend = "llama.cpp"
    device = "cpu"

    def __init__(self, path: str, n_ctx: int, n_batch: int, n_threads: int | None = None, kv=None):
        llama_cpp = import_llama_cpp()
        kv_args = {}
        if kv is not None:  # the same cache types; -fa auto is on here too (llama.cpp's CPU backend has it)
            kv_args = {"type_k": int(kv.type_k), "type_v": int(kv.type_v), "flash_attn": kv.flash_attn != "off"}
        n_threads = n_threads or os.cpu_count() or 1
        t0 = time.perf_counter()
        try:
            self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(n_ctx, 8), n_batch=n_batch, n_ubatch=n_batch,
                                       n_threads=n_threads, n_threads_batch=n_threads, n_gpu_layers=0,
                                       logits_all=False, verbose=False, seed=1234, **kv_args)
        except Exception as e:  # noqa: BLE001 - llama_cpp raises ValueError on load failures
            raise CooktopError(f"llama.cpp cannot load {path}: {type(e).__name__}: {e}") from None
        self.load_ms = (time.perf_counter() - t0) * 1e3
        self.device_name = f"CPU, {n_threads} threads (llama-cpp-python {llama_cpp.__version__})"
        self.placement = "n_gpu_layers=0"

    def reset(self) -> None:
        self.llm.reset()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached positions: the next ``eval`` removes those past them
        (llama-cpp-python's ``Llama.eval``: ``kv_cache_seq_rm(-1, n_tokens, -1)``)."""
        self.llm.n_tokens = min(n, self.llm.n_tokens)

    def prompt(self, tokens: list[int]) -> None:
        self.llm.eval(tokens)

    def decode(self, token: int) -> None:
        self.llm.eval([token])

    def close(self) -> None:
        self.llm.close()


_PREFLIGHT = """
import sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_batch=64, n_ubatch=64, n_gpu_layers=0,
                      n_threads=int(sys.argv[2]), logits_all=False, verbose=False)
n_vocab = llm.n_vocab()
llm.eval([(i * 7919) % n_vocab for i in range(64)])
llm.eval([1])
"""


def preflight(path: str, n_threads: int | None = None, timeout: float = 300.0) -> None:
    """Load ``path`` in llama.cpp and evaluate a 64-token chunk and one token in a *child* process.

    A llama.cpp build whose CPU code uses instructions this machine cannot run
    (e.g. AMX from ``-DGGML_NATIVE=ON`` on a VM that hides the AMX state) dies
    of SIGILL; in-process that would kill the whole benchmark without a word.

    Raises:
        CooktopError: the child crashed (signal named, with the rebuild command) or failed.
    """
    import signal
    import subprocess
    import sys

    n_threads = n_threads or os.cpu_count() or 1
    try:
        r = subprocess.run([sys.executable, "-c", _PREFLIGHT, str(path), str(n_threads)], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CooktopError(f"llama.cpp did not evaluate 65 tokens of {path} within {timeout:.0f} s") from None
    if r.returncode < 0:
        sig = signal.Signals(-r.returncode).name
        hint = (" (an instruction this CPU or VM does not allow: rebuild llama-cpp-python without "
                "-DGGML_NATIVE=ON, e.g. " + REBUILD_HINT + ")") if sig == "SIGILL" else ""
        raise CooktopError(f"llama.cpp crashed with {sig} running {path}{hint}")
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise CooktopError(f"llama.cpp failed on {path}: {last}")


#: A CPU build without AMX (whose tile state some VMs do not enable).
REBUILD_HINT = ("CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
                "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF\" pip install --force-reinstall --no-cache-dir "
                "llama-cpp-python")


def factory(engine: str):
    """``vs(path, n_ctx, n_batch, kv) -> runner`` for ``--vs ENGINE``, checking the import first.

    Raises:
        CooktopError: unknown engine name.
        LlamaCppUnavailable: llama-cpp-python missing.
    """
    if engine.strip().lower() not in ENGINES:
        raise CooktopError(f"--vs {engine!r}: only {', '.join(ENGINES)} is supported")
    import_llama_cpp()
    checked: dict[str, CooktopError | None] = {}

    def make(path: str, n_ctx: int, n_batch: int, kv=None) -> LlamaCppRunner:
        if path not in checked:
            try:
                preflight(path)
                checked[path] = None
            except CooktopError as e:
                checked[path] = e
        err = checked[path]
        if err is not None:
            raise err
        return LlamaCppRunner(path, n_ctx, n_batch, kv=kv)

    return make
