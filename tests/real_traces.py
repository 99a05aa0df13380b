"""The real traces as the labs find them, for the tests that need one."""
from __future__ import annotations

from pathlib import Path

from labsupport import workloads


def real_trace(name: str) -> Path | None:
    """Where the real trace `name` is, looked up as the labs look ($LABSUPPORT_DATA, data/, ../shared/traces/),
    or None when it is not there or $LABSUPPORT_HIDE_TRACES hides it: the trace tests skip on None."""
    return None if workloads.traces_hidden() else workloads.find_trace(name)
