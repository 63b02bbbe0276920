"""Human-readable sizes: ``"512MiB"`` -> bytes."""

from __future__ import annotations


def parse_bytes(text: str) -> int:
    """Parse ``"512MiB"``, ``"8GiB"``, ``"1000000"`` into bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    s = text.strip().lower().replace("ib", "").replace("b", "")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(float(s))
