"""The harness: a handed-in function run on a checkoff's cases, in the process the function lives in (every lab).

`observe` calls the function on a case (plain data, never its expected result) and writes down, as plain data, what
it saw: {"result": ...} (and {"after": {i: argument i}}), {"raised": [type, message]}, {"unfinished": prompt} or
{"timeout": seconds}.  labsupport.course.judge judges that outside the function's reach; a function driven step by
step names a harness of `HARNESSES`, an answer no generic rule fits a judge of `judge.JUDGES`.

The layout: one module per lab, `harness/labNN.py`, beside `checkoffs/labNN.py`, that lab's grader.  The grader is
staff-only (its expected formulas and hidden cases: sandbox.STAFF_ONLY, left out of the student release); its
harness module is public, because it runs where the student's code runs (check() in the notebook, the runner in the
grading sandbox): the lab's harnesses, its judges, and the builders its cases' recipes name.

    __init__.py   this: the time limit, `observe`, and the "matching" judge (labs 01 and 08)
    base.py       the tables a lab module registers in (`harness`, `judge`) and `_raised`, whose LAST_ERROR
                  check() reads as `harness.base.LAST_ERROR` (one variable; no other module holds a copy)
    lab03.py      3.2's append, in lockstep with the real allocator
    lab04.py      4.2's address line compiled into the real kernels
    lab05.py      5.1's copy-on-write append, 5.2's fan-out, 5.3's reference counts, 5.4's prefix hits
    lab06.py      6.2's preemption plan
    lab07.py      the engine runs 7.3, 7.4 and 7.7 take as their input
    lab08.py      8.7's open question, run on the engine; 8.8's changed machine

A lab whose checkoffs need neither a harness nor a judge of their own has no module here.  Importing this package
imports every lab module (at the end of this file), so every harness and judge is registered.
"""
from __future__ import annotations

import contextlib
import signal
import threading

from labsupport.course import data
from labsupport.course.harness.base import HARNESSES, _raised, judge
from labsupport.course.judge import Mismatch, echo

CASE_SECONDS = 60  # one call of a student's function, at most (a hang fails its case, not the notebook)


class TimeLimit(BaseException):
    """The case ran past its time (a BaseException: `except Exception` in the student's code lets it through)."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeLimit

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def observe(fn, case: dict, seconds: float | None = CASE_SECONDS, shared: list = ()) -> dict:
    """What `fn` did on `case` (its input; `shared`: the values its {"$": "ref"} items name, `data.share`)."""
    try:
        with time_limit(seconds):
            if "harness" in case:
                return HARNESSES[case["harness"]](fn, data.resolve(case.get("data"), shared))
            args, kwargs = data.build(case.get("args", []), shared), data.build(case.get("kwargs", {}), shared)
            seen = {"result": data.plain(fn(*args, **kwargs))}
            if case.get("after"):
                seen["after"] = {str(i): data.plain(args[i]) for i in case["after"]}
            return seen
    except TimeLimit:
        return {"timeout": seconds}
    except NotImplementedError as exc:
        return {"unfinished": str(exc)[:500]}
    except data.DataError as exc:
        return {"raised": ["an answer too large", str(exc)]}
    except Exception as exc:  # noqa: BLE001 - the student's bug, reported as the call that met it
        return _raised(exc)


def _normal(text):
    return " ".join(text.split()).lower() if isinstance(text, str) else text


@judge("matching")
def _matching(got, spec) -> None:
    """Labs 01 and 08: items matched to options, a dict or a list.  spec: want, options, noun, remarks {"k=option"}."""
    want, options, noun = spec["want"], {_normal(o) for o in spec["options"]}, spec.get("noun", "item")
    if isinstance(want, dict):
        if not isinstance(got, dict):
            raise Mismatch(f"answer with a dict from each {noun} to its match; you gave {echo(got)}.")
        if stray := [k for k in got if _normal(k) not in want]:
            raise Mismatch(f"{echo(stray[0])} is not one of the {noun}s: {', '.join(want)}.")
        answer = {_normal(k): v for k, v in got.items()}
        if missing := [k for k in want if k not in answer]:
            raise Mismatch(f"{len(missing)} of the {len(want)} {noun}s {'is' if len(missing) == 1 else 'are'} "
                           f"missing: {', '.join(missing)}.")
        pairs = [(k, answer[k], want[k]) for k in want]
    else:
        if not isinstance(got, list) or len(got) != len(want):
            raise Mismatch(f"answer with a list of {len(want)}, one per {noun} in its order; you gave {echo(got)}.")
        pairs = [(str(i), g, w) for i, (g, w) in enumerate(zip(got, want), start=1)]
    listed = ": " + ", ".join(spec["options"]) if len(options) <= 5 else " the options listed above the exercise"
    for key, value, _ in pairs:
        if _normal(value) not in options:
            raise Mismatch(f"{noun} {key}: {echo(value)} is not one of{listed}.")
    if wrong := [(k, _normal(v)) for k, v, w in pairs if _normal(v) != _normal(w)]:
        remarks = " ".join(spec.get("remarks", {}).get(f"{k}={v}", "") for k, v in wrong).strip()
        raise Mismatch(f"{len(wrong)} of the {len(pairs)} {'is' if len(wrong) == 1 else 'are'} not right "
                       f"({', '.join(k for k, _ in wrong)})." + (f" {remarks}" if remarks else ""))


# --- the labs: importing each registers its harnesses and judges --------------------------------------------------
from labsupport.course.harness import lab03, lab04, lab05, lab06, lab07, lab08  # noqa: E402,F401
from labsupport.course.harness.lab04 import raise_if_unfinished  # noqa: E402,F401 - notebook 04 imports it from here
