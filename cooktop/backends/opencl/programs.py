"""OpenCL programs of the opencl backend: sources, build options, a build cache, launch sizes.

The OpenCL C sources live in ``kernels/*.cl`` beside this module, one file per op
family. A weight-type program is ``dequant.cl`` + ``dotq8.cl`` + ``matmul.cl`` + ``mmq8.cl`` built with
``-DW_<TYPE>`` (e.g. ``-DW_Q4_K``), the way ggml builds one shader per type
from ``-D`` defines; launch-shape constants (``MV_LS``...) are defines too, so
the compiler sees fixed loop bounds.

Programs are built once per (context, device, source, options) and kept in a
process-wide cache (pyopencl also caches binaries on disk). A build failure
raises :class:`~cooktop.errors.DeviceError` carrying the first lines of the
build log, so a broken driver (e.g. PoCL 3.0-rc2's ``unknown target CPU
'generic'``) is reported, not crashed on.

Quiet by default: compiler output (the build log, pyopencl's
``CompilerWarning``, and what clang inside PoCL writes straight to file
descriptor 2, "N warnings generated.") goes to the ``cooktop`` logger at INFO
(``--verbose``), in full at WARNING when a build fails. The first time a
program is built on a device (no marker under ``<cache_dir>/opencl-kernels``)
one line says so, ``compiling OpenCL kernels for <device> (first run only)``;
:meth:`KernelCache.prebuild` (the smoke test's batch) shows a progress bar
when it takes more than a second or two. ``set_verbose(False)`` silences both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import logging
import os
import re
import threading
import warnings
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ... import notices, settings
from ...errors import DeviceError

log = logging.getLogger(__name__)

#: Weight types with device kernels (matmul, get_rows), in base.DEVICE_WEIGHT_TYPES order.
OPENCL_TYPES: tuple[T, ...] = (T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K,
                                T.MXFP4, T.Q2_K, T.Q3_K)

#: Weight types with an integer-dot mat-vec kernel on 8-bit activations (dotq8.cl: mul_mv_q8).
Q8_TYPES: tuple[T, ...] = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K)

#: K-quant types whose integer-dot kernels read llama.cpp's block_q8_K activations (one scale per
#: 256 values and bsums: quant.cl store_q8k, dotq8k.cl) unless ``COOKTOP_OPENCL_Q8K=0`` (then Q4_K,
#: Q5_K, Q6_K read block_q8_1 and Q2_K, Q3_K float32); the other Q8_TYPES read block_q8_1.
Q8K_TYPES: tuple[T, ...] = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K)

#: Of Q8K_TYPES, those with no block_q8_1 kernels.
Q8K_ONLY_TYPES: tuple[T, ...] = (T.Q2_K, T.Q3_K)

#: Tokens per work-group of ``mul_mvt_q8`` (a prompt on the one-token integer sums).
MVT_TN = 16

#: Types whose rows may end in a partial 32-value unit (any n_in); others need n_in % block == 0.
FLOAT_TYPES = (T.F32, T.F16)


@dataclasses.dataclass(frozen=True)
class LaunchShape:
    """Work-group shape constants compiled into the kernels (all powers of two).

    mv_ls: work-items sharing one output row in ``mul_mv``; mv_r: rows per group.
    mm_tm: rows (= work-items) per group in ``mul_mm``; mm_tn: tokens per tile;
    mm_uc: 32-value units per staged x tile; mm_r: rows per work-item (CPU flavour);
    mmq_r, mmq_tn: rows and tokens per work-item of ``mul_mm_q8`` (8-bit activations, VNNI) in one pass
    (repacked Q4_0: 16 rows, its row group);
    mmq_tt: tiles of mmq_tn tokens per work-item of the K-quants' ``mul_mm_q8`` (its grid counts
    mmq_tn * mmq_tt tokens per work-item, which mmq8.cl runs in passes of ``MMQK_TN``, its rows reused
    from the cache; :meth:`KernelCache.mmq_tiles`). rn_ls: rmsnorm group size.
    at_ls: keys per attention chunk (= group size). ew_ls: elementwise group size.
    mm_local: 1 to stage x tiles in local memory in ``mul_mm`` (GPUs), 0 to read x
    through the cache without barriers (CPUs: PoCL spills registers across barriers).
    at_serial: 1 for one work-item per (head, token) in ``attention`` (CPUs), 0 for a
    work-group of at_ls work-items sharing the keys (GPUs).
    q8_pf: the software prefetch distance of the x86 integer-dot kernels in bytes (dotq8.cl
    ``Q8_PF``; 0: none). ``cooktop tune`` (:mod:`cooktop.backends.tune`) may choose other
    values per weight type; these are the defaults.
    """

    mv_ls: int = 1
    mv_r: int = 8
    mm_tm: int = 16
    mm_tn: int = 8
    mm_r: int = 1
    mmq_r: int = 4
    mmq_tn: int = 8
    mmq_tt: int = 8
    mm_uc: int = 4
    rn_ls: int = 16
    at_ls: int = 16
    ew_ls: int = 64
    mm_local: int = 0
    at_serial: int = 1
    q8_pf: int = 1536

    def defines(self) -> str:
        """``-D`` options for the launch constants."""
        return (f"-DMV_LS={self.mv_ls} -DMV_R={self.mv_r} -DMM_TM={self.mm_tm} -DMM_TN={self.mm_tn} -DMM_R={self.mm_r} "
                f"-DMMQ_R={self.mmq_r} -DMMQ_TN={self.mmq_tn} "
                f"-DMM_UC={self.mm_uc} -DMM_LOCAL={self.mm_local} -DRN_LS={self.rn_ls} -DAT_LS={self.at_ls} "
                f"-DAT_SERIAL={self.at_serial} -DMVT_TN={MVT_TN}"
                + ("" if self.q8_pf == 1536 else f" -DQ8_PF={self.q8_pf}"))


#: CPU devices (PoCL): a work-group runs on one core, and explicit float16 vectors are
#: its SIMD, so one output row per work-item (mv_ls=1, no local reduction) and no
#: barriers in mul_mm/attention. On PoCL 3.1 (2 cores) 1x8 rows beat 2x8 and 4x4 by
#: 5-10% in mul_mv, and mm_tn=8 beat 4 and 16 in mul_mm (scripts/bench_opencl.py); 2 rows
#: x 8 tokens per work-item (mm_r=2) did 10-25% more GFLOP per CPU-second than 1 x 8 and
#: 4 x 4 on Q4_0/Q4_K/Q6_K/Q8_0 at 64 tokens (the machine shared, so CPU time, not wall).
#: mul_mm_q8 (VNNI): 4 rows x 8 tokens did 128-141 GFLOP per CPU-second at 128 tokens against
#: 104-125 for 1x8, 2x4, 2x8, 4x4, 3x8, 6x4 (and 78 for the float mul_mm).
#: Q4_K (same shape): 109-112 at 4x8 against 85-103 for 3x8, 2x8, 4x4, 2x16, 1x16 (float mul_mm 83);
#: Q6_K 116 at 4x8 (float 68); 2048/5632-wide matrices at 128 tokens, the machine shared.
#: GPU devices: work-groups share rows and keys (ggml's layout); checked for correctness
#: on PoCL only (no GPU on the dev machine), launch sizes not tuned.
CPU_SHAPE = LaunchShape(mm_r=2, mm_tm=8)
GPU_SHAPE = LaunchShape(mv_ls=16, mv_r=4, mm_tm=64, mm_tn=8, mm_uc=2, rn_ls=64, at_ls=32, ew_ls=64, mm_local=1,
                        at_serial=0)


def host_has_vnni() -> bool:
    """True when this machine's CPU has AVX-512 VNNI and BW (Linux /proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return {"avx512_vnni", "avx512bw"} <= flags
    except OSError:
        pass
    return False


#: The programs built from ``kernels/*.cl``: name -> the files concatenated, in order.
PROGRAMS: dict[str, tuple[str, ...]] = {
    "ops": ("norm.cl", "rope.cl", "elementwise.cl", "quant.cl", "recurrent.cl"),
    "weights": ("dequant.cl", "dotq8.cl", "dotq8k.cl", "matmul.cl", "mmq8.cl"),
    "attention": ("kv.cl", "kv_rows.cl", "attention.cl"),
    "attention_q8": ("quant.cl", "kv.cl", "kv_rows.cl", "attention.cl"),
    "kv_store": ("kv.cl", "rope.cl", "kv_store.cl"),
    "attention_kq": ("kv.cl", "kv_rows.cl", "attention_kq.cl"),
    "vision": ("vision.cl",),
}

#: The KV cache types kv.cl reads and kv_store.cl writes (``DeviceInfo.kv_types``).
OPENCL_KV_TYPES: tuple[T, ...] = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0)


def read_source(*names: str) -> str:
    """Concatenated text of ``kernels/<name>`` files (beside this module)."""
    base = importlib.resources.files("cooktop.backends.opencl") / "kernels"
    return "\n".join((base / n).read_text() for n in names)


def source_location(kernel: str, line: int) -> str:
    """``file.cl:N`` for line ``line`` of the program that defines ``kernel`` (a driver or a
    checker such as Oclgrind reports lines of the concatenated source), or ``"?"``. When several
    programs hold the kernel's file, the first of :data:`PROGRAMS` is taken."""
    base = importlib.resources.files("cooktop.backends.opencl") / "kernels"
    texts = {n: (base / n).read_text() for files in PROGRAMS.values() for n in files}
    owner = next((n for n, t in texts.items() if re.search(rf"__kernel\s+void\s+{re.escape(kernel)}\s*\(", t)), None)
    for files in PROGRAMS.values():
        if owner not in files:
            continue
        left = line
        for n in files:
            count = texts[n].count("\n") + 1  # read_source joins with one newline
            if left <= count:
                return f"{n}:{left}"
            left -= count
    return "?"


_cache_lock = threading.Lock()
_program_cache: dict[tuple[Any, ...], Any] = {}


def _log_head(text: str, n_lines: int = 4) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip() and not set(ln.strip()) <= set("=-~^ ")]
    return " | ".join(lines[:n_lines])[:600]


def _marker(device: Any, source: str, options: str) -> str:
    """Path of the file that says this program was built on this device (driver) before."""
    ident = "\0".join(str(_safe_info(device, a)) for a in ("name", "vendor", "driver_version", "version"))
    h = hashlib.sha1(f"{ident}\0{options}\0{source}".encode()).hexdigest()
    return os.path.join(notices.cache_dir("opencl-kernels"), h)


def _safe_info(device: Any, attr: str) -> Any:
    try:
        return getattr(device, attr)
    except Exception:  # noqa: BLE001 - a marker key only
        return ""


def built_before(device: Any, source: str, options: str) -> bool:
    """Whether this program was built on this device by an earlier run (its marker exists)."""
    return os.path.exists(_marker(device, source, options))


def _mark_built(device: Any, source: str, options: str) -> None:
    path = _marker(device, source, options)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w"):
            pass
    except OSError as e:  # read-only cache: the notice shows again next run, nothing else
        log.debug("cannot write %s: %s", path, e)


def first_compile_notice(device: Any, label: str | None = None) -> None:
    """``cooktop: compiling OpenCL kernels for <device> (first run only)``, once per device and process."""
    name = str(_safe_info(device, "name")).strip() or "?"
    who = f"{label}, {name}" if label else name
    notices.notice(f"compiling OpenCL kernels for {who} (first run only)", once_key=f"opencl-compile:{who}")


def _compiler_text(prg: Any, device: Any, captured: str, caught: list) -> tuple[str, str]:
    """``(build log, everything the compiler said)``: the log, fd-2 output, pyopencl's warnings."""
    import pyopencl as cl

    try:
        blog = str(prg.get_build_info(device, cl.program_build_info.LOG) or "") if prg is not None else ""
    except Exception:  # noqa: BLE001
        blog = ""
    parts = [t.strip() for t in (blog, captured, *(str(w.message) for w in caught)) if t and t.strip()]
    return blog, "\n".join(parts)


def build_program(ctx: Any, device: Any, source: str, options: str, what: str, label: str | None = None) -> Any:
    """Build (once, cached) ``source`` with ``options`` for ``device`` in ``ctx``.

    Compiler output goes to the log (module docstring); the first build of a program on a
    device prints the one-line notice.

    Args:
        ctx, device: ``pyopencl.Context`` and ``pyopencl.Device``.
        what: a name for error messages, e.g. ``"matmul Q4_K"``.
        label: the device's selector for the notice, e.g. ``"opencl:0"``.
    Returns:
        the built ``pyopencl.Program``.
    Raises:
        DeviceError: the build failed; the message holds the first lines of the build log
            (the whole compiler output is logged at WARNING).
    """
    import pyopencl as cl

    key = (ctx.int_ptr, device.int_ptr, hashlib.sha1(source.encode()).hexdigest(), options)
    first = not built_before(device, source, options)
    with _cache_lock:
        prg = _program_cache.get(key)
    if prg is not None:
        if first:  # built in this process before the markers moved (tests): the device has it now
            _mark_built(device, source, options)
        return prg
    if first:
        first_compile_notice(device, label)
    prg = None
    with notices.capture_stderr() as cap, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", cl.CompilerWarning)
        try:
            prg = cl.Program(ctx, source)
            prg.build(options=options, devices=[device])
            error = None
        except Exception as e:  # noqa: BLE001 - pyopencl raises RuntimeError/LogicError/...
            error = e
    others = [w for w in caught if not issubclass(w.category, cl.CompilerWarning)]
    for w in others:  # not the compiler's: give them back to the warnings machinery
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    blog, text = _compiler_text(prg, device, cap.text, [w for w in caught if w not in others])
    if error is not None:
        if text:
            log.log(logging.WARNING if notices.enabled() else logging.INFO,
                    "OpenCL build of the %s kernels failed on %s; compiler output:\n%s", what,
                    str(device.name).strip(), text)
        detail = _log_head(blog or str(error))
        raise DeviceError(f"OpenCL build of the {what} kernels failed on {device.name.strip()}: "
                          f"{type(error).__name__}: {detail}") from error
    if text:
        log.info("OpenCL compiler output for the %s kernels on %s:\n%s", what, str(device.name).strip(), text)
    if first:
        _mark_built(device, source, options)
    with _cache_lock:
        _program_cache[key] = prg
    return prg


def clear_cache(ctx: Any | None = None) -> None:
    """Drop cached programs (of one context, or all)."""
    with _cache_lock:
        for k in [k for k in _program_cache if ctx is None or k[0] == ctx.int_ptr]:
            del _program_cache[k]


class WeightKernels:
    """The kernels of one weight type on one device: ``mul_mv``, ``mul_mm``, ``get_rows``, and
    ``mul_mv_q8`` / ``mul_mvt_q8`` (8-bit activations, integer dot products, one token / a prompt
    with the one-token sums; None for types without them), ``mul_mv_q8_3`` (``mul_mv_q8`` of up to
    three matrices of one input in one launch), ``mul_mm_q8`` (VNNI prompt kernel)."""

    __slots__ = ("mul_mv", "mul_mm", "get_rows", "mul_mv_q8", "repack", "mul_mm_q8", "mul_mvt_q8", "mul_mv_id",
                 "mul_mm_id", "mul_mv_q8_3", "act", "mmq_tt", "mvt_tokens")

    def __init__(self, prg: Any, act: str = "q8_1", mmq_tt: int = 1, mvt_tokens: int = 1):
        import pyopencl as cl

        #: the activation format the *_q8 kernels read: "q8_1" (xd float2 per 32) or "q8_K" (quant.cl)
        self.act = act
        #: token tiles per ``mul_mm_q8`` work-item (``-DMMQ_TT``, :meth:`KernelCache.mmq_tiles`)
        self.mmq_tt = mmq_tt
        #: prompts of up to this many tokens run ``mul_mvt_q8`` rather than ``mul_mm_q8`` (the same
        #: sums bit for bit; :meth:`KernelCache.mvt_tokens`)
        self.mvt_tokens = mvt_tokens

        names = set(prg.get_info(cl.program_info.KERNEL_NAMES).split(";"))
        self.mul_mv = prg.mul_mv
        self.mul_mm = prg.mul_mm
        self.get_rows = prg.get_rows
        i32 = np.int32
        self.mul_mv.set_scalar_arg_dtypes([None, None, None, i32, i32])
        self.mul_mm.set_scalar_arg_dtypes([None, None, None, i32, i32, i32])
        self.get_rows.set_scalar_arg_dtypes([None, None, None, i32, i32, i32])
        self.mul_mv_id = prg.mul_mv_id
        self.mul_mv_id.set_scalar_arg_dtypes([None, None, None, None, i32, i32, i32, i32, i32])
        self.mul_mm_id = prg.mul_mm_id
        self.mul_mm_id.set_scalar_arg_dtypes([None, None, None, None, None, i32, i32, i32, i32])
        self.mul_mv_q8 = prg.mul_mv_q8 if "mul_mv_q8" in names else None
        self.repack = prg.repack if "repack" in names else None
        self.mul_mm_q8 = prg.mul_mm_q8 if "mul_mm_q8" in names else None
        if self.mul_mm_q8 is not None:
            self.mul_mm_q8.set_scalar_arg_dtypes([None, None, None, None, i32, i32, i32])
        if self.repack is not None:
            self.repack.set_scalar_arg_dtypes([None, None, i32])
        if self.mul_mv_q8 is not None:
            self.mul_mv_q8.set_scalar_arg_dtypes([None, None, None, None, i32, i32])
        self.mul_mv_q8_3 = prg.mul_mv_q8_3 if "mul_mv_q8_3" in names else None
        if self.mul_mv_q8_3 is not None:
            self.mul_mv_q8_3.set_scalar_arg_dtypes([None] * 8 + [i32, i32, i32, i32])
        self.mul_mvt_q8 = prg.mul_mvt_q8 if "mul_mvt_q8" in names else None
        if self.mul_mvt_q8 is not None:
            self.mul_mvt_q8.set_scalar_arg_dtypes([None, None, None, None, i32, i32, i32])


class OpKernels:
    """Kernels of the float ops (rmsnorm, rope, add, add_bias, silu_mul, gelu_mul, kv_store, the MoE and the
    recurrent ops) on one device."""

    __slots__ = ("rmsnorm", "rope", "add", "add_bias", "silu_mul", "kv_store", "gelu_mul", "quantize_q8",
                 "rmsnorm_q8", "silu_mul_q8", "copy_f32", "moe_route", "add_id", "moe_combine", "swiglu_oai",
                 "moe_group", "quantize_q8k", "rmsnorm_q8k", "silu_mul_q8k", "ssm_conv", "mul", "silu",
                 "sigmoid_mul", "l2_norm", "gdn_gate", "gated_delta_net", "ssm_scan", "ssm_norm", "scale")

    def __init__(self, prg: Any):
        i32, f32 = np.int32, np.float32
        self.rmsnorm = prg.rmsnorm
        self.rmsnorm.set_scalar_arg_dtypes([None, None, None, i32, f32])
        self.rope = prg.rope
        self.rope.set_scalar_arg_dtypes([None, None, None, i32, i32, f32, f32, i32, i32,
                                         None, i32, f32, f32, f32, f32])
        self.add = prg.add
        self.add.set_scalar_arg_dtypes([None, None, None, i32])
        self.add_bias = prg.add_bias
        self.add_bias.set_scalar_arg_dtypes([None, None, None, i32, i32])
        self.silu_mul = prg.silu_mul
        self.silu_mul.set_scalar_arg_dtypes([None, None, None, i32])
        self.gelu_mul = prg.gelu_mul
        self.gelu_mul.set_scalar_arg_dtypes([None, None, None, i32])
        self.kv_store = prg.kv_store
        self.kv_store.set_scalar_arg_dtypes([None, None, None, i32, i32])
        self.quantize_q8 = prg.quantize_q8
        self.quantize_q8.set_scalar_arg_dtypes([None, None, None, i32])
        self.rmsnorm_q8 = prg.rmsnorm_q8
        self.rmsnorm_q8.set_scalar_arg_dtypes([None, None, None, i32, f32, None, None])
        self.silu_mul_q8 = prg.silu_mul_q8
        self.silu_mul_q8.set_scalar_arg_dtypes([None, None, None, i32, None, None])
        self.quantize_q8k = prg.quantize_q8k
        self.quantize_q8k.set_scalar_arg_dtypes([None, None, None, i32])
        self.rmsnorm_q8k = prg.rmsnorm_q8k
        self.rmsnorm_q8k.set_scalar_arg_dtypes([None, None, None, i32, f32, None, None])
        self.silu_mul_q8k = prg.silu_mul_q8k
        self.silu_mul_q8k.set_scalar_arg_dtypes([None, None, None, i32, None, None])
        self.copy_f32 = prg.copy_f32
        self.copy_f32.set_scalar_arg_dtypes([None, None, i32])
        self.moe_route = prg.moe_route
        self.moe_route.set_scalar_arg_dtypes([None, None, None, None, i32, i32, i32, i32, i32, f32, i32])
        self.add_id = prg.add_id
        self.add_id.set_scalar_arg_dtypes([None, None, None, None, i32, i32, i32])
        self.moe_combine = prg.moe_combine
        self.moe_combine.set_scalar_arg_dtypes([None, None, None, i32, i32])
        self.swiglu_oai = prg.swiglu_oai
        self.swiglu_oai.set_scalar_arg_dtypes([None, None, None, i32, f32, f32])
        self.moe_group = prg.moe_group
        self.moe_group.set_scalar_arg_dtypes([None, None, None, i32, i32])
        self.ssm_conv = prg.ssm_conv
        self.ssm_conv.set_scalar_arg_dtypes([None, None, None, None, None, i32, i32, i32])
        self.mul = prg.mul
        self.mul.set_scalar_arg_dtypes([None, None, None, i32])
        self.silu = prg.silu
        self.silu.set_scalar_arg_dtypes([None, None, i32])
        self.sigmoid_mul = prg.sigmoid_mul
        self.sigmoid_mul.set_scalar_arg_dtypes([None, None, None, i32])
        self.l2_norm = prg.l2_norm
        self.l2_norm.set_scalar_arg_dtypes([None, None, i32, f32, f32])
        self.gdn_gate = prg.gdn_gate
        self.gdn_gate.set_scalar_arg_dtypes([None] * 6 + [i32, i32])
        self.gated_delta_net = prg.gated_delta_net
        self.gated_delta_net.set_scalar_arg_dtypes([None] * 8 + [i32, i32, i32, i32, f32, i32])
        self.ssm_scan = prg.ssm_scan
        self.ssm_scan.set_scalar_arg_dtypes([None] * 8 + [i32, i32, i32, i32, i32])
        self.ssm_norm = prg.ssm_norm
        self.ssm_norm.set_scalar_arg_dtypes([None] * 4 + [i32, i32, f32])
        self.scale = prg.scale
        self.scale.set_scalar_arg_dtypes([None, None, i32, f32])


def check_build_options(ctx: Any, device: Any, options: str, extra: str) -> None:
    """Build a one-line kernel with ``options`` so ``COOKTOP_OPENCL_OPTIONS`` (``extra``) the
    compiler refuses fails when the device opens, in one line, not at the first real kernel.

    Raises:
        DeviceError: the build failed; names the variable and the compiler's first words.
    """
    import pyopencl as cl

    with notices.capture_stderr() as cap, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cl.Program(ctx, "__kernel void cooktop_options(__global float *x) { x[0] = 0.0f; }").build(
                options=options, devices=[device])
            return
        except Exception as e:  # noqa: BLE001 - pyopencl raises RuntimeError/LogicError/...
            error = e
    # pyopencl: "clBuildProgram failed: ...\n\nBuild on <device>:\n\n<build log>\n\n(options: ...)"
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    log_lines = [ln for ln in lines[1:] if not ln.startswith(("Build on ", "(options:"))]
    detail = _log_head("\n".join(log_lines) or cap.text or (lines[0] if lines else type(error).__name__), 2)
    raise DeviceError(f"COOKTOP_OPENCL_OPTIONS={extra!r}: the OpenCL compiler of {str(device.name).strip()} "
                      f"refuses these build options ({detail})") from error


class KernelCache:
    """Per-device lazy builder: weight-type kernels, op kernels, attention per head_dim.

    Kernel objects are created once and kept (never looked up per call).
    """

    def __init__(self, ctx: Any, device: Any, shape: LaunchShape, extra_options: str = "",
                 info: Any = None, per_type: dict[T, LaunchShape] | None = None):
        #: weight type -> the launch shape of its weight program (a tuned choice, cooktop.backends.tune);
        #: other types, the float ops and attention use ``shape``
        self.per_type = dict(per_type or {})
        self.info = info  # DeviceInfo to complete (subgroup_size) once a kernel exists
        self.ctx = ctx
        self.device = device
        self.shape = shape
        # -cl-denorms-are-zero: PoCL on x86 keeps denormals, and one denormal activation
        # row made a Q4_0 matmul 80x slower (2.5 ms -> 208 ms at 2048x5632)
        self.options = (shape.defines() + " -cl-mad-enable -cl-denorms-are-zero " + extra_options).strip()
        # the CPU device is this machine's CPU: its VNNI (which PoCL's target may not declare) is usable
        self.vnni = (info is not None and getattr(info, "device_type", "") == "cpu" and host_has_vnni()
                     and settings.opencl_vnni() and "COOKTOP_PORTABLE" not in self.options)
        if self.vnni:
            self.options += " -DCOOKTOP_VNNI=1"
        # COOKTOP_OPENCL_MMQ_K=0: no K-quant prompt kernel on block_q8_K (VNNI or unpack-once) for Q4_K..Q6_K
        self.mmq_k = settings.opencl_mmq_k()
        if not self.mmq_k:
            self.options += " -DCOOKTOP_NO_MMQ_K=1"
        if extra_options.strip():
            check_build_options(ctx, device, self.options, extra_options)
        self._tail = self.options[len(shape.defines()):]  # the options after the launch defines
        self._weights: dict[tuple[T, bool], WeightKernels] = {}
        self._isa: dict[str, bool] | None = None
        self._ops: OpKernels | None = None
        self._attn: dict[tuple[int, bool, bool, int, int, int], Any] = {}
        self._kv_store: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def _estimate_subgroup(self, knl: Any) -> None:
        """Fill ``info.subgroup_size`` from a kernel's preferred work-group multiple (a warp estimate)."""
        import pyopencl as cl

        try:
            m = knl.get_work_group_info(cl.kernel_work_group_info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, self.device)
        except Exception:  # noqa: BLE001 - an estimate only
            return
        self.info.subgroup_size = int(m)
        self.info.extra["subgroup_size_source"] = "CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE of rmsnorm (estimate)"

    def shape_for(self, ggml_type: T) -> LaunchShape:
        """The launch shape of ``ggml_type``'s weight kernels (its tuned one, else ``shape``)."""
        return self.per_type.get(ggml_type, self.shape)

    @property
    def _label(self) -> str | None:
        return getattr(self.info, "selector", None)

    def mmq_tiles(self, ggml_type: T) -> int:
        """Tiles of ``mmq_tn`` tokens one ``mul_mm_q8`` work-item runs (its grid's second dimension
        counts ``mmq_tn`` times this many tokens): ``LaunchShape.mmq_tt`` for the K-quants on
        block_q8_K, whose rows then come from the cache after the first pass (mmq8.cl's passes of
        ``MMQK_TN`` tokens; 8 tiles of 8 made Q6_K prompt matrices 2x faster at 64 tokens than one
        tile, Q4_K 1.1-1.3x), and for Q8_0 (8 tiles: 1.2-2.3x less CPU time than 1 at 128 tokens,
        2048 and 5632 rows, the machine loaded) and repacked Q4_0 (16 rows a work-item, dequant.cl),
        1 for the others. Q6_K gets twice ``mmq_tt``: 16 tiles (128 tokens a
        work-item) made its prompt matrices 1.04-1.17x faster than 8 at 100 and 128 tokens, while
        Q4_K (0.91-1.2x) and Q5_K (0.98-1.02x) gained nothing."""
        tt = self.shape_for(ggml_type).mmq_tt
        if ggml_type in (T.Q8_0, T.Q4_0):
            return tt
        if not self.q8k(ggml_type):
            return 1
        return 2 * tt if ggml_type == T.Q6_K else tt

    def _weight_program(self, ggml_type: T, repacked: bool = False) -> tuple[str, str]:
        opts = (f"{self.shape_for(ggml_type).defines()}{self._tail} -DW_{ggml_type.name} "
                f"-DMMQ_TT={self.mmq_tiles(ggml_type)}"
                + (f" -DREPACK_{ggml_type.name}" if repacked else ""))
        if self.q8k(ggml_type):
            opts += " -DQ8K=1"
        return read_source(*PROGRAMS["weights"]), opts

    def _ops_program(self) -> tuple[str, str]:
        return read_source(*PROGRAMS["ops"]), self.options

    def prebuild(self, types: Any = ()) -> None:
        """Build the float-op kernels and those of the weight ``types`` now, as one batch.

        When any of them was never built on this device before, the first-compile notice
        is printed and a progress bar counts the programs (shown after a second or two).

        Raises:
            DeviceError: a build failed (see :func:`build_program`).
        """
        todo: list[Any] = ([] if self._ops is not None else [None])
        # the layout real models get (n_out % 16 == 0): repacked Q4_0 where the SIMD path builds
        todo += [(t, self.repacks(t, (16, 128))) for t in types if t in OPENCL_TYPES]
        todo = [t for t in todo if t is None or t not in self._weights]
        fresh = [t for t in todo if not built_before(self.device, *(self._ops_program() if t is None
                                                                    else self._weight_program(*t)))]
        if not fresh:
            for t in todo:
                self._build_one(t)
            return
        first_compile_notice(self.device, self._label)
        with notices.progress(len(todo), f"compiling kernels for {self._label or 'the device'}",
                              unit="program") as bar:
            for t in todo:
                self._build_one(t)
                bar.update(1)

    def _build_one(self, item: tuple[T, bool] | None) -> None:
        if item is None:
            self.ops()
        else:
            self.weights(*item)

    def weights(self, ggml_type: T, repacked: bool = False) -> WeightKernels:
        """Kernels for weights of ``ggml_type`` (built on first use); ``repacked``: for the
        upload layout of :meth:`repacks` (``-DREPACK_<TYPE>``)."""
        k = self._weights.get((ggml_type, repacked))
        if k is None:
            with self._lock:
                src, options = self._weight_program(ggml_type, repacked)
                prg = build_program(self.ctx, self.device, src, options, f"matmul {ggml_type.name}", self._label)
                k = WeightKernels(prg, "q8_K" if self.q8k(ggml_type) else "q8_1", self.mmq_tiles(ggml_type),
                                  self.mvt_tokens(ggml_type, repacked))
                self._weights[(ggml_type, repacked)] = k
        return k

    @staticmethod
    def mvt_tokens(ggml_type: T, repacked: bool) -> int:
        """Prompt sizes (tokens) up to which ``mul_mvt_q8`` (the one-token kernel token by token)
        runs instead of ``mul_mm_q8``; both give the one-token sums bit for bit. Repacked Q4_0's
        ``mul_mm_q8`` costs a whole tile of 8 tokens whatever the count: at 2, 3 and 4 tokens
        ``mul_mvt_q8`` took 0.49-0.53x, 0.65-0.82x and 0.82-0.92x its CPU time (16-row layout;
        2048x2048, 5632x2048, 2048x5632, one PoCL thread; the server's short prompt tails and
        2-4-row steps).
        The K-quants' and Q8_0's ``mul_mm_q8`` cost about the same as ``mul_mvt_q8`` at 2 tokens
        and less from 3 on: 1 for them."""
        return 4 if ggml_type == T.Q4_0 and repacked else 1

    def q8k(self, ggml_type: T) -> bool:
        """True when the integer-dot kernels of ``ggml_type`` read block_q8_K activations
        (:data:`Q8K_TYPES`, ``COOKTOP_OPENCL_Q8K``, default on)."""
        return ggml_type in Q8K_TYPES and settings.opencl_q8k()

    def isa(self) -> dict[str, bool]:
        """What the device compiler targets, from its predefined macros (a one-line probe kernel,
        built once): ``avx2``, ``avx512bw``, ``f16c`` (x86 CPUs under PoCL) and ``portable``
        (``-DCOOKTOP_PORTABLE=1`` in the options: the SIMD paths are off)."""
        if self._isa is None:
            import pyopencl as cl

            flags = ("__AVX2__", "__AVX512BW__", "__F16C__", "COOKTOP_PORTABLE")
            src = "__kernel void isa(global int *o) { int v = 0;\n" + "".join(
                f"#ifdef {m}\nv |= {1 << i};\n#endif\n" for i, m in enumerate(flags)) + "o[0] = v; }\n"
            prg = build_program(self.ctx, self.device, src, self.options, "ISA probe", self._label)
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, 4)
            out = np.zeros(1, np.int32)
            q = cl.CommandQueue(self.ctx, self.device)
            prg.isa(q, (1,), None, buf)
            cl.enqueue_copy(q, out, buf)
            q.finish()
            v = int(out[0])
            self._isa = {"avx2": bool(v & 1), "avx512bw": bool(v & 2), "f16c": bool(v & 4), "portable": bool(v & 8)}
        return self._isa

    def mm_q8(self, ggml_type: T, shape: tuple[int, ...]) -> bool:
        """True when prompt matrices (n_tokens > 1) with weights of this type and shape run on
        8-bit activations (``mul_mm_q8`` on a CPU with AVX-512 VNNI: Q8_0, repacked Q4_0, and Q4_K,
        Q5_K and Q6_K unless ``COOKTOP_OPENCL_MMQ_K=0``; each gives a token the mat-vec's sums
        bit for bit; Q2_K and Q3_K on the CPU launch shape, and Q4_K, Q5_K, Q6_K there where the
        64-byte x86 code does not build (AVX2 only, or ``COOKTOP_PORTABLE``) unless
        ``COOKTOP_OPENCL_MMQ_K=0``: dotq8k.cl's unpack-once prompt kernel on block_q8_K, likewise)."""
        if ggml_type in Q8K_ONLY_TYPES:
            return self.q8k(ggml_type) and self.shape.mv_ls == 1
        if ggml_type in (T.Q4_K, T.Q5_K, T.Q6_K) and self.q8k(ggml_type) and self.mmq_k and self.shape.mv_ls == 1 \
                and not self._x86_512():
            return True
        if not self.vnni:
            return False
        if (ggml_type == T.Q8_0 or ggml_type in (T.Q4_K, T.Q5_K, T.Q6_K) and self.mmq_k) and not self.shape.mm_local:
            isa = self.isa()
            return isa["avx512bw"] and isa["f16c"] and not isa["portable"]
        return self.repacks(ggml_type, shape)

    def _x86_512(self) -> bool:
        """True when the weight programs build dotq8.cl's 64-byte x86 code (``X86_512``: AVX-512BW and
        F16C, neither ``COOKTOP_PORTABLE`` nor ``COOKTOP_NO_AVX512``)."""
        isa = self.isa()
        return (isa["avx2"] and isa["avx512bw"] and isa["f16c"] and not isa["portable"]
                and "COOKTOP_NO_AVX512" not in self.options)

    def repacks(self, ggml_type: T, shape: tuple[int, ...]) -> bool:
        """True when weights of this type and shape are stored repacked on this device: Q4_0
        matrices of n_out % 16 == 0 rows (16 rows in the SIMD lanes, a work-item per group of 16:
        dequant.cl documents the layout) on the CPU launch shape (one work-item per row group,
        ``mv_ls`` 1) where the 64-byte SIMD kernels build (AVX-512BW). Other Q4_0 matrices keep
        the block_q4_0 layout. Every op derives it from the weight's shape, so tensors carry no flag."""
        if ggml_type != T.Q4_0 or len(shape) != 2 or shape[0] % 16 or shape[-1] % 32 or self.shape.mm_local \
                or self.shape.mv_ls != 1:
            return False
        isa = self.isa()
        return isa["avx512bw"] and isa["f16c"] and not isa["portable"]

    def ops(self) -> OpKernels:
        """Kernels of the float ops (built on first use)."""
        if self._ops is None:
            with self._lock:
                src, options = self._ops_program()
                ops = OpKernels(build_program(self.ctx, self.device, src, options, "float op", self._label))
                if self.info is not None and self.info.subgroup_size is None:
                    self._estimate_subgroup(ops.rmsnorm)
                self._ops = ops
        return self._ops

    def attention(self, head_dim: int, q8: bool = False, sinks: bool = False, kt: T = T.F32,
                  vt: T = T.F32, group: int = 0) -> Any:
        """The attention kernel compiled for ``head_dim`` (built on first use); ``q8``: the variant
        that also writes its output as 8-bit blocks (two more arguments: xq, xd; serial flavour,
        head_dim % 32 == 0); ``sinks``: attention_sinks (one more argument after ``window``: sinks);
        ``kt``/``vt``: the K and V cache types (:data:`OPENCL_KV_TYPES`, read as stored by kv.cl);
        ``group`` > 0 (serial flavour): one work-item per (kv head, token) running that many query
        heads (the GQA group; global size (n_head_kv, n_tok))."""
        k = self._attn.get((head_dim, q8, sinks, int(kt), int(vt), group))
        if k is None:
            with self._lock:
                src = read_source(*PROGRAMS["attention_q8" if q8 else "attention"])
                opts = (f"{self.options} -DHEAD_DIM={head_dim}" + (" -DATT_Q8=1" if q8 else "")
                        + (" -DSINKS=1" if sinks else "") + f" -DKTYPE={int(kt)} -DVTYPE={int(vt)}"
                        + (f" -DGQA_G={group}" if group else ""))
                prg = build_program(self.ctx, self.device, src, opts, f"attention (head_dim {head_dim})",
                                    self._label)
                k = prg.attention
                k.set_scalar_arg_dtypes([None, None, None, None, None, None, np.int32, np.int32, np.int32, np.float32,
                                         np.int32] + ([None] if sinks else []) + ([None, None] if q8 else []))
                self._attn[(head_dim, q8, sinks, int(kt), int(vt), group)] = k
        return k

    def kv_store(self, kt: T) -> Any:
        """kv_store.cl's ``kv_store_t`` writing a cache of type ``kt`` (built on first use, without
        -cl-mad-enable: ggml's reference rounding, see the kernel)."""
        return self._kv_store_program(kt)[0]

    def rope_store(self, kt: T) -> Any:
        """kv_store.cl's ``rope_store`` (rope, then the store of ``kv_store_t``, in one launch) for a
        cache of type ``kt`` (any of :data:`OPENCL_KV_TYPES`; the program of :meth:`kv_store`)."""
        return self._kv_store_program(kt)[1]

    def _kv_store_program(self, kt: T) -> tuple[Any, Any]:
        k = self._kv_store.get(int(kt))
        if k is None:
            with self._lock:
                opts = self.options.replace("-cl-mad-enable", "").strip() + f" -DKTYPE={int(kt)}"
                prg = build_program(self.ctx, self.device, read_source(*PROGRAMS["kv_store"]), opts,
                                    f"kv_store ({kt.name})", self._label)
                i32, f32 = np.int32, np.float32
                store = prg.kv_store_t
                store.set_scalar_arg_dtypes([None, None, None, i32, i32])
                rope = prg.rope_store
                rope.set_scalar_arg_dtypes([None, None, None, None, i32, i32, i32, i32, f32, f32, i32, None, i32,
                                            f32, f32, f32, f32])
                k = self._kv_store[int(kt)] = (store, rope)
        return k
