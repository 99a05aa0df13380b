"""Argument checks shared by every mechanism: bad input gets a clear error naming the value.

`as_count` is on the allocator's hot path, so its common case is one type test and one compare.
The command-line twin, a parser whose bad flag is one line and exit code 2, is `labsupport.cli.parser`.
"""
from __future__ import annotations

import operator


def as_count(name: str, value, minimum: int = 0) -> int:
    """An integer >= minimum (numpy integers too), or ValueError naming the value; bools are rejected."""
    if type(value) is int and value >= minimum:
        return value
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def positive_int(name: str, value) -> int:
    """A plain positive int for a figure's parameter, or ValueError saying so."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
