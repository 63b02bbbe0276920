"""llama-cpp-python's ``Llama(...)`` constructor arguments: which cooktop honours, which it only accepts.

Code written for ``llama_cpp.Llama`` passes any of them. Those cooktop can
honour are honoured (see :class:`cooktop.api.Llama`). The others are accepted
and, when given a value other than llama-cpp-python's default, logged as one
warning line each ("accepted, has no effect in cooktop"), the way
llama-cpp-python's own ``**kwargs`` swallows unknown names. An argument whose
silent omission would change the answers (metadata overrides,
a tokenizer) is refused with :class:`UnsupportedArgumentError`. ``chat_handler`` is a named argument of
``Llama``: a multimodal projector (:mod:`cooktop.api.multimodal`); any other handler is refused there.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ..errors import CooktopError
from ..format.kvtypes import KVConfig

log = logging.getLogger("cooktop")

#: llama.cpp ``enum llama_split_mode``.
SPLIT_MODE_NONE, SPLIT_MODE_LAYER, SPLIT_MODE_ROW = 0, 1, 2
#: llama.cpp ``enum llama_pooling_type`` (``-1`` unspecified: the model's ``pooling_type``).
POOLING = {-1: "unspecified", 0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
#: GGML type id of an F32 KV cache (``type_k``/``type_v`` take any id of ``cooktop.format.kvtypes.KV_TYPES``).
KV_TYPE_F32 = 0

#: Accepted, no effect in cooktop: name -> (llama-cpp-python default, why nothing changes).
IGNORED: dict[str, tuple[Any, str]] = {
    "rpc_servers": (None, "cooktop has no RPC backend"),
    "use_mlock": (False, "cooktop does not lock pages"),
    "n_ubatch": (512, "cooktop evaluates n_batch tokens per forward pass"),
    "rope_scaling_type": (-1, "cooktop reads RoPE scaling from the model"),
    "rope_freq_base": (0.0, "cooktop reads rope_freq_base from the model"),
    "rope_freq_scale": (0.0, "cooktop reads rope_freq_scale from the model"),
    "yarn_ext_factor": (-1.0, "cooktop has no YaRN"),
    "yarn_attn_factor": (1.0, "cooktop has no YaRN"),
    "yarn_beta_fast": (32.0, "cooktop has no YaRN"),
    "yarn_beta_slow": (1.0, "cooktop has no YaRN"),
    "yarn_orig_ctx": (0, "cooktop has no YaRN"),
    "offload_kqv": (True, "the KV cache lives with its layers' device"),
    "op_offload": (None, "cooktop places whole layers"),
    "no_perf": (False, "timings are always kept"),
    "numa": (False, "cooktop does not pin memory to NUMA nodes"),
    "lora_base": (None, "the adapter applies to the loaded model (llama-cpp-python 0.3 does not read lora_base "
                        "either)"),
    "use_mmap": (True, "cooktop always maps the GGUF file"),
}

#: Refused: giving them would silently change the answers.
REFUSED: dict[str, str] = {
    "kv_overrides": "metadata overrides (kv_overrides) are not supported by cooktop",
    "tokenizer": "a tokenizer override is not supported; cooktop uses the GGUF's vocabulary",
}


class UnsupportedArgumentError(CooktopError, ValueError):
    """A llama-cpp-python argument cooktop cannot honour and must not ignore."""


def _differs(value: Any, default: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and isinstance(default, float):
        return not math.isclose(value, default)
    return value != default


def check_extra(args: dict[str, Any]) -> None:
    """Warn about accepted-but-ignored arguments; refuse those that would change answers.

    Args:
        args: the extra keyword arguments given to ``Llama(...)``.
    Raises:
        UnsupportedArgumentError: an argument of :data:`REFUSED` with a value.
    """
    for name, value in args.items():
        if name in REFUSED:
            if value:
                raise UnsupportedArgumentError(f"Llama({name}=...): {REFUSED[name]}")
            continue
        if name in IGNORED:
            default, why = IGNORED[name]
            if _differs(value, default):
                log.warning("Llama(%s=%r) accepted, has no effect in cooktop: %s", name, value, why)
            continue
        log.warning("Llama(%s=%r): unknown argument, ignored", name, value)


def kv_config(type_k: int | None, type_v: int | None, flash_attn: bool | str | None,
              swa_full: bool | None = None) -> KVConfig:
    """``type_k`` / ``type_v`` (GGML type ids, None: the default cache type), ``flash_attn``
    (llama-cpp-python's bool: False is llama.cpp's ``LLAMA_FLASH_ATTN_TYPE_DISABLED``, so a
    quantized ``type_v`` needs ``flash_attn=True``; cooktop also takes ``"auto"``) and ``swa_full``
    (llama-cpp-python's: None leaves llama.cpp's context default, ``llama_context_default_params``'s
    ``swa_full = true``, so sliding-window layers keep every position; False: only their window,
    as llama.cpp's command line does by default).

    Raises:
        KVTypeError: an id that is no KV cache type, or a bad flash_attn value.
    """
    return KVConfig.parse(type_k, type_v, flash_attn, True if swa_full is None else swa_full)


def pooling_name(pooling_type: int) -> str:
    """llama.cpp pooling id -> name.

    Raises:
        CooktopError: an unknown id.
    """
    try:
        return POOLING[int(pooling_type)]
    except (KeyError, TypeError, ValueError):
        raise CooktopError(f"pooling_type must be one of {sorted(POOLING)} "
                           f"({', '.join(f'{k}={v}' for k, v in POOLING.items())}), got {pooling_type!r}") from None


def set_threads(n_threads: int | None) -> None:
    """Limit the BLAS threads the numpy backend uses (process-wide; ``None``/``<= 0``: leave as is).

    Uses threadpoolctl (OpenBLAS/MKL bundled with numpy). llama.cpp's
    ``n_threads``; cooktop's OpenCL and Vulkan drivers keep their own threads.

    Raises:
        CooktopError: ``n_threads`` is not an integer.
    """
    if n_threads is None:
        return
    if isinstance(n_threads, bool) or not isinstance(n_threads, int):
        raise CooktopError(f"n_threads must be an integer, got {n_threads!r}")
    if n_threads <= 0:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a declared dependency
        log.warning("n_threads=%d has no effect: threadpoolctl is not installed", n_threads)
        return
    threadpool_limits(limits=n_threads, user_api="blas")
