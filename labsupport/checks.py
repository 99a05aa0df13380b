"""Argument checks shared by every mechanism and command: bad input gets one clear error naming the value.

Every check raises ValueError with a message that names the parameter and shows the value (cut to a
readable length: `shown`).  Bools are not numbers here (``True`` is not a block size), strings are
not numbers (``"5"`` is not an arrival time), and a real number must be finite.

`as_count` is on the allocator's hot path, so its common case is one type test and one compare.
The command-line twin, a parser whose bad flag is one line and exit code 2, is `labsupport.cli.parser`.
"""
from __future__ import annotations

import math
import numbers
import operator
import os

# The longest sequence anything here accepts: the kernels' seq_lens and block tables are int32.
MAX_TOKENS = 2**31 - 1


def shown(value, limit: int = 60) -> str:
    """repr(value), cut to about `limit` characters, for an error message.

    Safe for any value: an integer of more than 4,300 digits has no repr in CPython, and an
    object's own __repr__ may raise.
    """
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any failure of a repr still needs a message
        if isinstance(value, int):
            text = f"<an integer of {value.bit_length():,} bits>"
        else:
            text = f"<a {type(value).__name__}>"
    if len(text) > limit:
        text = f"{text[: limit - 20]}... ({len(text):,} characters)"
    return text


def as_count(name: str, value, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum] (numpy integers too), or ValueError naming the value; bools are rejected."""
    if type(value) is int and value >= minimum and maximum is None:
        return value
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {shown(value)}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum:,}, got {shown(v)}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum:,}, got {shown(v)}")
    return v


def positive_int(name: str, value) -> int:
    """A plain positive int for a figure's parameter, or ValueError saying so."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
    return value


def as_real(name: str, value, minimum: float | None = None, maximum: float | None = None, *,
            above: float | None = None) -> float:
    """A finite real number (int, float, numpy's; not a bool or a string) as a float, within the bounds.

    ``minimum``/``maximum`` are inclusive; ``above`` is an exclusive lower bound (``above=0`` for
    "positive").  An integer too large for a float is refused, not rounded to infinity.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {shown(value)}")
    try:
        v = float(value)
    except (OverflowError, ValueError):
        raise ValueError(f"{name} is too large to be a number of this machine, got {shown(value)}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {shown(value)}")
    if above is not None and not v > above:
        raise ValueError(f"{name} must be > {above:g}, got {shown(value)}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {shown(value)}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum:g}, got {shown(value)}")
    return v


def as_fraction(name: str, value, *, include_zero: bool = True, include_one: bool = False) -> float:
    """A finite fraction: [0, 1) by default; the flags say whether 0 and 1 belong."""
    v = as_real(name, value)
    if not ((v >= 0 if include_zero else v > 0) and (v <= 1 if include_one else v < 1)):
        interval = f"{'[' if include_zero else '('}0, 1{']' if include_one else ')'}"
        raise ValueError(f"{name} must be a fraction in {interval}, got {shown(value)}")
    return v


def as_id(name: str, value):
    """A value usable as a dictionary key (a sequence id), or ValueError saying it is not one."""
    try:
        hash(value)
    except TypeError:
        raise ValueError(f"{name} must be hashable (an int, str or tuple of them), got "
                         f"{type(value).__name__} {shown(value)}") from None
    return value


def as_flag(name: str, value) -> bool:
    """A real bool: 1, "yes" and None are not flags."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {shown(value)}")
    return value


def as_device(name: str, device):
    """A torch.device this machine has ('cpu', 'cuda', 'cuda:1', a torch.device), or ValueError saying why not."""
    import torch  # here, not at the top: the allocator's hot path imports this module without torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} must name a torch device such as 'cpu' or 'cuda:0', got {shown(device)}") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"{name} {dev} is not on this machine ({torch.cuda.device_count()} CUDA devices)")
    return dev


def memory_available_bytes() -> int | None:
    """Memory this process could still take (Linux's MemAvailable), or None when it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_in_memory(what: str, nbytes: int, available: int | None = None) -> None:
    """ValueError when `what` would need more memory than this machine has free (the message says how much)."""
    available = memory_available_bytes() if available is None else available
    if available is not None and nbytes > available:
        raise ValueError(f"{what} would need {_readable_bytes(nbytes)} of memory, and this machine has "
                         f"{_readable_bytes(available)} available: choose a smaller pool")


def _readable_bytes(n: float) -> str:
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"
