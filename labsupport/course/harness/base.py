"""What every lab's harness module builds on: the tables it registers in, and the student's last exception.

`harness("name")` registers a harness in HARNESSES (`observe` runs the one a case names) and `judge("name")` a judge
in labsupport.course.judge.JUDGES.  `_raised` writes a student's exception down as an observation and keeps it in
LAST_ERROR: one variable for the whole process, which check() resets and reads here, as `harness.base.LAST_ERROR`
(a copy of the name in another module would not follow it).  These live apart from the package's __init__ so that
the lab modules, which the package imports, never import the package back (tests/test_import_cycles.py).
"""
from __future__ import annotations

import functools

from labsupport.course.judge import JUDGES

HARNESSES: dict = {}
LAST_ERROR: BaseException | None = None  # the last exception a student's function raised (check() shows its frames)


def _raised(exc: Exception, blank: str = "") -> dict:
    """A student's exception as an observation, its type and last line (`blank` if none); LAST_ERROR keeps it."""
    global LAST_ERROR
    LAST_ERROR = exc
    try:
        text = str(exc).strip()
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        text = ""
    return {"raised": [type(exc).__name__, (text.splitlines() or [blank])[-1][:300]]}


def _register(table: dict, name: str):
    def register(fn):
        table[name] = fn
        return fn
    return register


harness, judge = functools.partial(_register, HARNESSES), functools.partial(_register, JUDGES)
