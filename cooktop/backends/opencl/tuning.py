"""The OpenCL family's side of the autotuner (:mod:`cooktop.backends.tune`): the flavour of a device,
today's launch parameters, and the launch shapes a tuned choice becomes.

Where the values come from (the hand-tuned constants they replace): ``programs.py`` ``LaunchShape``,
``CPU_SHAPE`` / ``GPU_SHAPE`` and ``kernels/dotq8.cl``'s ``Q8_PF``: rows per work-group of the mat-vecs
``mv_r`` (CPU 8, GPU 4), the x86 weight-prefetch distance ``q8_pf`` (1536 bytes), token tiles per
work-item of the prompt kernels ``mmq_tt`` (8), the prompt kernels' group width ``mm_tm`` (CPU 8,
GPU 64), the rmsnorm group ``rn_ls`` (16 / 64), attention's keys per chunk ``at_ls`` (GPU 32; the CPU
flavour runs one work-item per (head, token) and has nothing to tune). Kept fixed because they change
the layout or the flavour, not the speed alone: ``mv_ls`` (1 on CPUs selects repacked Q4_0 and the
x86 prompt kernels), ``mm_local``, ``at_serial``, ``mmq_r`` (Q8_0's kernel pairs rows), ``mmq_tn``,
``MVT_TN``. The ``COOKTOP_OPENCL_*`` switches (Q8, Q8K, VNNI, MMQ_K, EXACT_PROMPT) choose between
kernels of different rounding (float vs 8-bit activations, block_q8_1 vs block_q8_K), so they stay
the user's: a prompt's logits must not change with a timing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gguf import GGMLQuantizationType as T

from ..tune.space import check, type_of
from .info import launch_shape
from .programs import CPU_SHAPE, GPU_SHAPE


class OpenCLTuning:
    """The ``tuning`` hooks of the OpenCL family (:attr:`cooktop.backends.family.Family.tuning`)."""

    def flavour(self, info: Any) -> str:
        """``"opencl-cpu"`` or ``"opencl-gpu"``: the launch-shape flavour ``info``'s device runs."""
        return f"opencl-{launch_shape(info)[0]}"

    def defaults(self, info: Any, params: tuple[str, ...]) -> dict[str, int]:
        """Today's values of ``params`` on ``info``'s device (its flavour's :class:`LaunchShape`)."""
        shape = launch_shape(info)[1]
        return {p: getattr(shape, p) for p in params}

    def is_default(self, flavour: str, param: str, value: int) -> bool:
        """Whether ``value`` is ``flavour``'s default of ``param`` (always allowed in a choice)."""
        return int(value) == getattr(CPU_SHAPE if flavour == "opencl-cpu" else GPU_SHAPE, param)


TUNING = OpenCLTuning()


def opencl_shapes(default: Any, flavour: str, choice: dict[str, dict[str, int]]) -> tuple[Any, dict[T, Any]]:
    """``(device-wide LaunchShape, {weight type: LaunchShape})`` of ``choice`` on an OpenCL device whose
    default shape is ``default`` (``"opencl-cpu"`` / ``"opencl-gpu"`` flavour).

    Raises:
        DeviceError: a key or value outside the search space.
    """
    wide: dict[str, int] = {}
    typed: dict[T, dict[str, int]] = {}
    for key, params in choice.items():
        check(flavour, key, params)
        if ":" in key:
            typed.setdefault(type_of(key), {}).update({p: int(v) for p, v in params.items()})
        else:
            wide.update({p: int(v) for p, v in params.items()})
    base = dataclasses.replace(default, **wide)
    return base, {t: dataclasses.replace(base, **p) for t, p in typed.items()}
