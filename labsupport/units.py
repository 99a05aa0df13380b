"""Units and their formatting, shared by the ledger, the CLI and every lab's charts (§10.2 onward).

The lecture mixes GB (1e9 bytes) and GiB (2**30 bytes); every figure we print names its unit.
"""
from __future__ import annotations

import math

from labsupport.specs import GB, GiB, KiB, MiB

__all__ = ["GB", "GiB", "KiB", "MiB", "fmt_bytes", "fmt_gb", "fmt_gib", "fmt_pct", "fmt_seconds", "fmt_int", "log_ticks",
           "fmt_tick", "fmt_number",
           "log_axis_ticks"]


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


def log_ticks(lo: float, hi: float, max_ticks: int = 8) -> list[float]:
    """Tick values for a log axis over [lo, hi] that read as numbers: 1, 2, 5, 10, 20, 50, ... when
    they fit in `max_ticks`, else 1, 10, 100, ... (Plotly's own log ticks label 2 and 5 of every decade
    alone, so an axis read "5, 2, 10, 5, 2").  At least the two powers of ten around [lo, hi]."""
    if not 0 < lo <= hi:
        raise ValueError(f"a log axis needs 0 < lo <= hi; got lo={lo!r}, hi={hi!r}")
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mantissas in ((1, 2, 5), (1,)):
        ticks = [m * 10.0 ** e for e in range(first, last + 1) for m in mantissas]
        inside = [v for v in ticks if lo <= v * (1 + 1e-12) and v <= hi * (1 + 1e-12)]
        if len(inside) <= max_ticks:
            break
    if len(inside) < 2:
        inside = [10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    return [int(v) if v >= 1 and float(v).is_integer() else float(f"{v:.12g}") for v in inside]


def log_axis_ticks(lo: float, hi: float) -> dict:
    """`tickvals` and `ticktext` for a chart's log axis over [lo, hi]: each label reads as its value."""
    ticks = log_ticks(lo, hi)
    return {"tickvals": ticks, "ticktext": [fmt_tick(v) for v in ticks]}


def fmt_tick(v: float) -> str:
    """A tick label: whole numbers with thousands separators (20,000), fractions as written (0.5)."""
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:g}"


def fmt_number(x: float) -> str:
    """A number for a sentence, never in e-notation: whole ones exact with thousands separators
    (335,544,320), others to six significant digits (0.155634, 1,234.57), tiny ones in plain
    decimals (0.0000123457)."""
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x.is_integer():
        return f"{int(x):,}"
    if abs(x) >= 1e5:
        return f"{x:,.1f}"
    if abs(x) >= 1e-4:
        return f"{x:,.6g}"
    return f"{x:.{5 - math.floor(math.log10(abs(x)))}f}"
