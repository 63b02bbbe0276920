"""cooktop's ``COOKTOP_*`` environment settings: read and checked in one place.

A setting left unset (or empty) takes its default; a malformed one is refused with one
line naming the variable, its value and what it takes (:class:`SettingError`), never
silently replaced by the default. Booleans take ``1/0``, ``true/false``, ``yes/no``,
``on/off`` (any case).
"""

from __future__ import annotations

import math
import os

from .errors import CooktopError, DeviceError
from .units import parse_bytes

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")

#: Most numpy dequantization threads ``COOKTOP_DEQUANT_THREADS`` takes.
MAX_DEQUANT_THREADS = 256


class SettingError(CooktopError):
    """A ``COOKTOP_*`` environment variable holds a value it does not take."""


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return value.strip() if value is not None and value.strip() else None


def env_bool(name: str, default: bool) -> bool:
    """``name`` as a boolean (``default`` when unset).

    Raises:
        SettingError: not one of 1/0, true/false, yes/no, on/off.
    """
    raw = _raw(name)
    if raw is None:
        return default
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


def env_int(name: str, default: int, minimum: int, maximum: int | None = None) -> int:
    """``name`` as an integer in ``[minimum, maximum]`` (``default`` when unset).

    Raises:
        SettingError: not an integer, or out of range.
    """
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        span = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise SettingError(f"{name}={raw!r} must be an integer {span}")
    return value


def env_float(name: str, default: float, minimum: float) -> float:
    """``name`` as a finite number >= ``minimum`` (``default`` when unset).

    Raises:
        SettingError: not a number, not finite, or below ``minimum``.
    """
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        raise SettingError(f"{name}={raw!r} must be a number >= {minimum:g}")
    return value


def env_names(name: str, allowed: tuple[str, ...]) -> set[str]:
    """``name`` as a comma list of names out of ``allowed`` (lower-case; empty set when unset).

    Raises:
        SettingError: a name not in ``allowed``.
    """
    names = {s.strip().lower() for s in (_raw(name) or "").split(",") if s.strip()}
    unknown = sorted(names - set(allowed))
    if unknown:
        raise SettingError(f"{name}: unknown {', '.join(map(repr, unknown))}; expected a comma list of "
                           f"{', '.join(allowed)}")
    return names


# -- the documented settings (README's environment table) ---------------------------------------
def dequant_threads() -> int:
    """``COOKTOP_DEQUANT_THREADS``: numpy dequantization threads (default: the core count, at most 8)."""
    return env_int("COOKTOP_DEQUANT_THREADS", max(1, min(8, os.cpu_count() or 1)), 1, MAX_DEQUANT_THREADS)


def opencl_q8() -> bool:
    """``COOKTOP_OPENCL_Q8``: 8-bit activations for OpenCL integer-dot matmuls (default on)."""
    return env_bool("COOKTOP_OPENCL_Q8", True)


def opencl_replay() -> bool:
    """``COOKTOP_OPENCL_REPLAY``: record a decode step's OpenCL launches once as a
    ``cl_khr_command_buffer`` and replay it, where the driver has the extension (default on)."""
    return env_bool("COOKTOP_OPENCL_REPLAY", True)


def opencl_q8k() -> bool:
    """``COOKTOP_OPENCL_Q8K``: Q4_K, Q5_K and Q6_K integer-dot matmuls on llama.cpp's block_q8_K
    activations (one scale per 256 values) instead of block_q8_1 (default on)."""
    return env_bool("COOKTOP_OPENCL_Q8K", True)


def vulkan_q8k() -> bool:
    """``COOKTOP_VULKAN_Q8K``: Vulkan Q4_K, Q5_K and Q6_K integer-dot mat-vecs on llama.cpp's
    block_q8_K activations (one scale per 256 values, int16 sums per 16) instead of block_q8_1
    (default off: on lavapipe the two run within a few percent of each other, block_q8_1
    slightly ahead and closer to the float product)."""
    return env_bool("COOKTOP_VULKAN_Q8K", False)


def no_tune() -> bool:
    """``COOKTOP_NO_TUNE``: open devices with today's default launch parameters, ignoring a
    ``cooktop tune`` choice in the cache (default off; ``cooktop --no-tune`` sets it)."""
    return env_bool("COOKTOP_NO_TUNE", False)


def opencl_vnni() -> bool:
    """``COOKTOP_OPENCL_VNNI``: the AVX-512 VNNI prompt kernel where the CPU has it (default on)."""
    return env_bool("COOKTOP_OPENCL_VNNI", True)


def opencl_mmq_k() -> bool:
    """``COOKTOP_OPENCL_MMQ_K``: Q4_K, Q5_K and Q6_K prompt matrices on 8-bit activations with their
    prompt kernels: the AVX-512 VNNI ones where the CPU has them, elsewhere on the CPU launch shape
    (AVX2, portable C) the OpenCL K-quant unpack-once kernel on block_q8_K (default on)."""
    return env_bool("COOKTOP_OPENCL_MMQ_K", True)


def opencl_exact_prompt() -> bool:
    """``COOKTOP_OPENCL_EXACT_PROMPT``: prompt matrices of the weight types without a VNNI prompt
    kernel run the one-token integer sums token by token (``mul_mvt_q8``), so a prompt's logits
    are those of its tokens one at a time (default on; 0: the faster float32 ``mul_mm``)."""
    return env_bool("COOKTOP_OPENCL_EXACT_PROMPT", True)


def cpu_cache(default: int) -> int:
    """``COOKTOP_CPU_CACHE``: bytes of dequantized float32 weights the numpy backend keeps
    (``default`` when unset; ``0`` turns the cache off; sizes like ``512MiB``, ``8GiB``).

    Raises:
        SettingError: not a size.
    """
    from .units import parse_bytes

    raw = _raw("COOKTOP_CPU_CACHE")
    if raw is None:
        return default
    try:
        n = parse_bytes(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise SettingError(f"COOKTOP_CPU_CACHE={raw!r} is not a size: use bytes or e.g. 512MiB, 8GiB (0 = off)")
    return n


def probe_timeout(default: float) -> float:
    """``COOKTOP_PROBE_TIMEOUT``: seconds a probe child may take (at least 1)."""
    return env_float("COOKTOP_PROBE_TIMEOUT", default, 1.0)


def probe_isolation() -> bool:
    """``COOKTOP_PROBE_ISOLATION``: probe drivers in a child process (default on)."""
    return env_bool("COOKTOP_PROBE_ISOLATION", True)


#: Smallest max allocation ``COOKTOP_DEVICE_MEMORY`` takes (bytes): below it no row of a tensor
#: fits (one page; real devices give at least 128 MiB, OpenCL's CL_DEVICE_MAX_MEM_ALLOC_SIZE minimum).
MIN_MAX_ALLOC = 4 << 10
#: Largest size ``COOKTOP_DEVICE_MEMORY`` takes (bytes): 2^60, an exbibyte.
MAX_DEVICE_BYTES = 1 << 60


def device_memory() -> dict[str, tuple[int, int | None]]:
    """``COOKTOP_DEVICE_MEMORY``: simulated device sizes, selector -> (memory bytes, max allocation
    bytes or None), e.g. ``opencl:0=4GiB/1GiB,vulkan:0=2GiB/256MiB`` (selectors lower-cased).
    Placement reasons with them (``runtime/budget.py``) and an opened device splits and refuses
    buffers by the max allocation (``Device.buffer_limit``).

    Raises:
        DeviceError: a malformed entry, an empty or repeated selector, a size that is not
            positive or past :data:`MAX_DEVICE_BYTES` (2^60 bytes), a max allocation under
            :data:`MIN_MAX_ALLOC` (4 KiB).
    """
    out: dict[str, tuple[int, int | None]] = {}
    raw = os.environ.get("COOKTOP_DEVICE_MEMORY", "")
    for item in filter(None, (s.strip() for s in raw.split(","))):
        sel, eq, val = item.partition("=")
        sel = sel.strip().lower()
        bad = f"bad COOKTOP_DEVICE_MEMORY entry {item!r}"
        if not eq:
            raise DeviceError(f"{bad}: expected SELECTOR=SIZE")
        if not sel:
            raise DeviceError(f"{bad}: no device selector before '=' (e.g. opencl:0=512MiB)")
        if sel in out:
            raise DeviceError(f"{bad}: {sel} is given twice")
        try:
            mem_s, _, mx_s = val.partition("/")
            mem, mx = parse_bytes(mem_s), (parse_bytes(mx_s) if mx_s else None)
        except (ValueError, OverflowError):  # OverflowError: inf
            raise DeviceError(f"{bad}: expected e.g. opencl:0=512MiB or vulkan:0=2GiB/256MiB") from None
        if mem <= 0 or (mx is not None and mx <= 0):
            raise DeviceError(f"{bad}: sizes must be positive")
        if max(mem, mx or 0) > MAX_DEVICE_BYTES:
            raise DeviceError(f"{bad}: sizes must be at most 2^60 bytes (1048576 TiB)")
        if mx is not None and mx < MIN_MAX_ALLOC:
            raise DeviceError(f"{bad}: the max allocation must be at least 4 KiB, got {mx} bytes")
        out[sel] = (mem, mx)
    return out


def check_environment() -> None:
    """Read every setting this module knows, so a malformed one is refused before any work.

    Raises:
        SettingError: the first malformed setting.
    """
    dequant_threads()
    cpu_cache(0)
    opencl_q8()
    opencl_q8k()
    opencl_replay()
    opencl_vnni()
    opencl_mmq_k()
    vulkan_q8k()
    opencl_exact_prompt()
    no_tune()
    probe_timeout(1.0)
    probe_isolation()
