"""The numpy backend (``cpu``): the reference every device backend is tested against, always usable.

- ``device.py``: :class:`~.device.CpuBackend` / :class:`~.device.CpuDevice` (ops in numpy,
  float32 weight cache within ``COOKTOP_CPU_CACHE``, streaming past it).
- ``quants.py``: whole-tensor threaded dequantization, bit-equal to ``format.quants``.
"""

from ..family import Family

FAMILY = Family("cpu", "cooktop.backends.cpu.device:CpuBackend", "numpy", reference=True)
