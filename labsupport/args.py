"""Argument checks shared by every public entry point: bad input gets a clear error naming the value.

`as_count` is on the allocator's hot path, so its common case is one type test and one compare.
`OneLineParser` is the command-line twin: a bad flag is one line on stderr and exit code 2, never
argparse's whole usage block or a traceback.
"""
from __future__ import annotations

import argparse
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


class UsageError(Exception):
    """A command-line flag was wrong; the message is the one line to print."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)
