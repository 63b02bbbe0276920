"""Human-readable sizes: ``"512MiB"`` -> bytes."""

from __future__ import annotations


def parse_bytes(text: str) -> int:
    """Parse ``"512MiB"``, ``"8GiB"``, ``"1000000"`` into bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    s = text.strip().lower().replace("ib", "").replace("b", "")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(float(s))


def format_params(n: int) -> str:
    """A parameter count as llama.cpp's model loader prints it (src/llama-model.cpp ``model params``):
    two decimals of T (>= 1e12), B (>= 1e9), M (>= 1e6) or K: ``"1.10 B"``, ``"210.24 K"``."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 1e3:.2f} K"
