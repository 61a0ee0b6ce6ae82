"""Units the chapters print and plot in: bytes in binary multiples."""

from __future__ import annotations

MiB = 1 << 20


def format_bytes(n: int) -> str:
    """``n`` bytes as a short human string: 512 B, 4 KiB, 1.5 MiB, 2 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"
