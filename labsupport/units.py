"""Units and their formatting, shared by the ledger, the CLI and every lab's charts (§10.2 onward).

The lecture mixes GB (1e9 bytes) and GiB (2**30 bytes); every figure we print names its unit.
"""
from __future__ import annotations

from labsupport.specs import GB, GiB, KiB, MiB

__all__ = ["GB", "GiB", "KiB", "MiB", "fmt_bytes", "fmt_gb", "fmt_gib", "fmt_pct", "fmt_seconds", "fmt_int"]


def fmt_gb(n_bytes: float, digits: int = 3) -> str:
    """Decimal gigabytes, the unit of the lecture's HBM budget: 2,147,483,648 B -> '2.147 GB'."""
    return f"{n_bytes / GB:,.{digits}f} GB"


def fmt_gib(n_bytes: float, digits: int = 3) -> str:
    return f"{n_bytes / GiB:,.{digits}f} GiB"


def fmt_bytes(n_bytes: float, digits: int = 3) -> str:
    """Exact bytes with both readings, e.g. '2,147,483,648 B (2.147 GB = 2.000 GiB)'."""
    if abs(n_bytes) < MiB:
        return f"{n_bytes:,.0f} B ({n_bytes / KiB:,.{digits}f} KiB)"
    return f"{n_bytes:,.0f} B ({n_bytes / GB:,.{digits}f} GB = {n_bytes / GiB:,.{digits}f} GiB)"


def fmt_pct(fraction: float, digits: int = 2) -> str:
    return f"{100 * fraction:.{digits}f}%"


def fmt_seconds(seconds: float, digits: int = 1) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:,.{digits}f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:,.{digits}f} ms"
    return f"{seconds:,.{digits + 1}f} s"


def fmt_int(n: float) -> str:
    return f"{n:,.0f}"
