"""Checkoffs: `check("2.1", answer)` grades a student's number or function (every lab, §10.1–§10.7).

A checkoff is registered once, in ``labsupport/course/checkoffs/labNN.py`` for lab NN, with one of

    value("2.1", "title", expected=lambda: ..., rel_tol=..., abs_tol=..., unit=" B", hint="...")
    choice("1.4", "title", answer="admit", options=JOBS, hint="...")
    @function("3.2", "title", hint="...")
    def _(student_fn): ...   # call it through `call(...)`, raise `Mismatch` on a wrong result

The expected value is computed there, from first principles (spec fields, hand formulas, or the
real mechanism the student's code must agree with), never by calling the student's code.  The
module is imported the first time one of its checkoffs is asked for, so a lab only has to exist.

`check` prints one line and never raises for the answer, so Run All reaches the end of a lab:

    ✅ Checkoff 2.1 passed
    ⬜ Checkoff 2.1 not attempted — <the exercise's prompt>
    ❌ Checkoff 2.1: <what was wrong> Hint: <how to think about it, never the answer>

The pass line is the checkoff cell's stored output in the student copy (`pytest --nbval-lax`
compares it).  "Not attempted" means the answer is still the student copy's placeholder, `...`
(alone or inside a list, tuple, set or dict), or the student's function raises NotImplementedError.
After a ❌ line come, only when the student's own code raised, the frames of that traceback that
are in the student's code (never labsupport's).  Every outcome is also recorded in `results()`,
which `python -m labsupport grade` reads back from the kernel.
"""
from __future__ import annotations

import importlib
import inspect
import linecache
import math
import numbers
import os
import re
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

PASS_LINE = "✅ Checkoff {id} passed"
NOT_ATTEMPTED_LINE = "⬜ Checkoff {id} not attempted — {prompt}"
FAIL_LINE = "❌ Checkoff {id}: {problem} Hint: {hint}"
# The student copy's stand-in for a top-level answer not yet written: `slot_bytes = ...`.
PLACEHOLDER = ...
PROMPT_WORD = "TO" + "DO"  # built from parts: the word itself never appears in labsupport's source
MAX_STUDENT_FRAMES = 4
ID_PATTERN = re.compile(r"^(\d+)\.(\d+)$")

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
SYMBOLS = {PASSED: "✅", FAILED: "❌", NOT_ATTEMPTED: "⬜"}


class Mismatch(Exception):
    """Raised by a checkoff's grader: the student's answer is wrong; the message says how."""


@dataclass(frozen=True)
class Checkoff:
    id: str
    title: str
    hint: str
    kind: str  # "value", "choice" or "function"
    grade: Callable[[Any], None]  # raises Mismatch when the answer is wrong
    module: str = ""

    @property
    def lab(self) -> int:
        return int(self.id.split(".")[0])

    @property
    def order(self) -> tuple[int, int]:
        lab, num = self.id.split(".")
        return int(lab), int(num)


REGISTRY: dict[str, Checkoff] = {}
_RESULTS: dict[str, dict] = {}


# --- registering ----------------------------------------------------------------------------

def _validate_id(checkoff_id: str) -> str:
    if not isinstance(checkoff_id, str) or not ID_PATTERN.match(checkoff_id):
        raise ValueError(f"checkoff id must look like '2.1' (lab.number), got {checkoff_id!r}")
    return checkoff_id


def register(checkoff: Checkoff) -> Checkoff:
    """Add a checkoff; a second module claiming the same id is a mistake worth stopping on."""
    _validate_id(checkoff.id)
    if not checkoff.hint.strip() or not checkoff.title.strip():
        raise ValueError(f"checkoff {checkoff.id}: a title and a hint are required")
    old = REGISTRY.get(checkoff.id)
    if old is not None and old.module != checkoff.module:
        raise ValueError(f"checkoff {checkoff.id} is registered twice: by {old.module} and {checkoff.module}")
    REGISTRY[checkoff.id] = checkoff
    return checkoff


def _caller_module() -> str:
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def value(checkoff_id: str, title: str, *, expected: Callable[[], float] | float, hint: str,
          rel_tol: float = 1e-9, abs_tol: float = 0.0, unit: str = "",
          mistakes: Iterable[tuple[float, str]] = ()) -> Checkoff:
    """A number checked against `expected` (a callable, evaluated when graded) within a tolerance.

    `mistakes` pairs a known wrong answer with a targeted remark (matched with the same tolerance).
    """
    mistakes = tuple(mistakes)

    def grade(answer):
        got = as_number(answer, "your answer")
        want = float(expected() if callable(expected) else expected)
        if math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol):
            return
        problem = f"you gave {got:,.6g}{unit}, {tolerance_text(rel_tol, abs_tol)}; it is too {'high' if got > want else 'low'}."
        for wrong, remark in mistakes:
            if math.isclose(got, wrong, rel_tol=max(rel_tol, 1e-9), abs_tol=abs_tol):
                problem += " " + remark
                break
        else:
            slip = units_slip(got, want)
            if slip:
                problem += " " + slip
        raise Mismatch(problem)

    return register(Checkoff(checkoff_id, title, hint, "value", grade, _caller_module()))


def choice(checkoff_id: str, title: str, *, answer: str | Iterable[str], options: Iterable[str], hint: str,
           mistakes: dict[str, str] | None = None) -> Checkoff:
    """One option (a string) or a set of options; case and surrounding spaces do not matter."""
    options = tuple(o.lower() for o in options)
    multi = not isinstance(answer, str)
    want = frozenset(a.lower() for a in answer) if multi else answer.lower()
    unknown = (set(want) if multi else {want}) - set(options)
    if unknown:
        raise ValueError(f"checkoff {checkoff_id}: answer {sorted(unknown)} is not among the options {options}")
    mistakes = {k.lower(): v for k, v in (mistakes or {}).items()}

    def normalize(item) -> str:
        if not isinstance(item, str):
            raise Mismatch(f"{item!r} is not text; answer with one of: {', '.join(options)}.")
        key = item.strip().lower()
        if key not in options:
            raise Mismatch(f"{item!r} is not one of: {', '.join(options)}.")
        return key

    def grade(ans):
        if multi:
            if isinstance(ans, str) or not isinstance(ans, Iterable):
                raise Mismatch(f"this checkoff wants a set of options, e.g. {{'{options[0]}', ...}}; you gave {ans!r}.")
            got = frozenset(normalize(a) for a in ans)
            if got == want:
                return
            extra, missing = sorted(got - want), sorted(want - got)
            parts = []
            if extra:
                parts.append(f"{len(extra)} of your choices {'does' if len(extra) == 1 else 'do'} not belong")
            if missing:
                parts.append(f"{len(missing)} {'is' if len(missing) == 1 else 'are'} missing")
            remark = " ".join(mistakes[e] for e in extra if e in mistakes)
            raise Mismatch(f"you chose {sorted(got)}: {' and '.join(parts)}." + (f" {remark}" if remark else ""))
        got = normalize(ans)
        if got != want:
            raise Mismatch(f"you chose {got!r}." + (f" {mistakes[got]}" if got in mistakes else ""))

    return register(Checkoff(checkoff_id, title, hint, "choice", grade, _caller_module()))


def function(checkoff_id: str, title: str, *, hint: str) -> Callable[[Callable], Checkoff]:
    """Decorator: the decorated grader receives the student's function and runs the tests."""

    def wrap(grader: Callable[[Callable], None]) -> Checkoff:
        def grade(fn):
            if not callable(fn):
                raise Mismatch(f"this checkoff wants your function itself (no parentheses); you gave {fn!r}.")
            grader(fn)

        return register(Checkoff(checkoff_id, title, hint, "function", grade, grader.__module__))

    return wrap


# --- helpers for graders --------------------------------------------------------------------

def as_number(x, what: str) -> float:
    """A real number out of an int, float, numpy scalar or one-element tensor; anything else is a Mismatch."""
    if callable(x):
        raise Mismatch(f"{what} is a function; call it and pass the number it returns.")
    if isinstance(x, bool) or x is None:
        raise Mismatch(f"{what} is {x!r}, not a number. Did your code forget to return or assign it?")
    if not isinstance(x, numbers.Real):
        item = getattr(x, "item", None)
        try:
            x = item() if item is not None else x
        except (ValueError, RuntimeError):
            raise Mismatch(f"{what} holds several numbers ({type(x).__name__}); one number is expected.") from None
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise Mismatch(f"{what} is a {type(x).__name__}, not a number.")
    x = float(x)
    if not math.isfinite(x):
        raise Mismatch(f"{what} is {x}, not a finite number.")
    return x


def tolerance_text(rel_tol: float, abs_tol: float) -> str:
    if rel_tol <= 1e-9 and abs_tol == 0:
        return "which is not exactly right"
    if abs_tol and rel_tol <= 1e-9:
        return f"which is not within ±{abs_tol:g} of the right value"
    if not abs_tol:
        return f"which is not within {rel_tol:.2%} of the right value"
    return f"which is not within ±{abs_tol:g} or {rel_tol:.2%} of the right value"


_SLIPS = (
    (1e9 / 2**30, "GB read as GiB (or the reverse): 1 GB = 1e9 bytes, 1 GiB = 2**30 bytes"),
    (1.024, "a decimal kB where the lecture means KiB (or the reverse)"),
    (1024 / 1e6, "a KiB/MB mix-up"),
    (2**20, "a factor of 2**20: MiB versus bytes?"),
    (2**30, "a factor of 2**30: GiB versus bytes?"),
    (1e3, "a factor of 1,000: a unit prefix (k, M, G, ms) slipped?"),
    (1e6, "a factor of a million: a unit prefix slipped?"),
    (1e9, "a factor of 1e9: GB versus bytes?"),
    (1e12, "a factor of 1e12: TFLOP/s versus FLOP/s?"),
    (1024, "a factor of 1,024: a binary prefix slipped?"),
    (2, "a factor of 2: keys and values, bytes per element, or 2 FLOP per multiply-add?"),
    (8, "a factor of 8: bits versus bytes?"),
)


def units_slip(got: float, want: float) -> str:
    """Name the units slip that would explain `got` (a remark, never the right value)."""
    if got == 0 or want == 0 or (got < 0) != (want < 0):
        return ""
    ratio = got / want
    for factor, name in _SLIPS:
        for f in (factor, 1 / factor):
            if math.isclose(ratio, f, rel_tol=2e-3):
                return f"Your answer is off by what looks like {name}" + ("" if name.endswith("?") else ".")
    return ""


def call(fn: Callable, *args, **kwargs):
    """Call the student's function; its errors become a Mismatch naming the call (NotImplementedError passes)."""
    __tracebackhide__ = True
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:  # the student's bug, reported with the call that triggered it
        raise Mismatch(f"{describe_call(fn, args, kwargs)} raised {type(exc).__name__}: {exc}") from None


def describe_call(fn: Callable, args: tuple, kwargs: dict) -> str:
    def show(a):
        name = getattr(a, "name", None)
        return name if isinstance(name, str) and not isinstance(a, str) else repr(a)

    parts = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()]
    return f"{getattr(fn, '__name__', 'your function')}({', '.join(parts)})"


def expect_close(got, want: float, what: str, rel_tol: float = 1e-9, abs_tol: float = 0.0) -> None:
    """Raise a Mismatch describing `what` returned `got` (not what it should have) when off."""
    x = as_number(got, f"{what} returned {got!r}, which")
    if math.isclose(x, want, rel_tol=rel_tol, abs_tol=abs_tol):
        return
    slip = units_slip(x, want)
    raise Mismatch(f"{what} returned {x:,.6g}, which is too {'high' if x > want else 'low'}." + (f" {slip}" if slip else ""))


# --- looking up and checking ----------------------------------------------------------------

def lab_module_name(lab: int) -> str:
    return f"labsupport.course.checkoffs.lab{lab:02d}"


def load_lab(lab: int) -> list[Checkoff]:
    """Import lab `lab`'s checkoff module (if it has one) and return its checkoffs in order."""
    try:
        importlib.import_module(lab_module_name(lab))
    except ModuleNotFoundError as exc:
        if exc.name != lab_module_name(lab):
            raise
    return sorted((c for c in REGISTRY.values() if c.lab == lab), key=lambda c: c.order)


def get(checkoff_id: str) -> Checkoff:
    _validate_id(checkoff_id)
    lab = int(checkoff_id.split(".")[0])
    if checkoff_id not in REGISTRY:
        load_lab(lab)
    if checkoff_id not in REGISTRY:
        known = ", ".join(c.id for c in load_lab(lab)) or "none"
        raise KeyError(f"unknown checkoff {checkoff_id!r}; lab {lab} registers: {known}")
    return REGISTRY[checkoff_id]


def check(checkoff_id: str, answer) -> None:
    """Grade `answer` (a value, or your function) for checkoff `checkoff_id` and print one line.

    Never raises for a wrong or missing answer, so Run All always reaches the end of a lab:

        ✅ Checkoff 2.1 passed
        ⬜ Checkoff 2.1 not attempted — <the exercise's prompt>
        ❌ Checkoff 2.1: <what was wrong> Hint: <how to think about it>
           (then, only when your own code raised, its frames: never labsupport's)
    """
    __tracebackhide__ = True
    checkoff = get(checkoff_id)
    if is_placeholder(answer):
        prompt = prompt_of(checkoff, caller=inspect.currentframe().f_back)
        _RESULTS[checkoff_id] = {"status": NOT_ATTEMPTED, "detail": prompt}
        print(NOT_ATTEMPTED_LINE.format(id=checkoff_id, prompt=prompt))
        return
    raised = None
    try:
        checkoff.grade(answer)
    except NotImplementedError as exc:
        _RESULTS[checkoff_id] = {"status": NOT_ATTEMPTED, "detail": str(exc)}
        print(NOT_ATTEMPTED_LINE.format(id=checkoff_id, prompt=prompt_of(checkoff, exc,
                                                                        inspect.currentframe().f_back)))
        return
    except Mismatch as exc:
        problem, raised = str(exc), exc.__context__  # `call` keeps the student's exception as the context
    except Exception as exc:  # a student function called without `call`: still the student's error
        problem, raised = f"your answer raised {type(exc).__name__}: {exc}", exc
    else:
        _RESULTS[checkoff_id] = {"status": PASSED, "detail": ""}
        print(PASS_LINE.format(id=checkoff_id))
        return
    _RESULTS[checkoff_id] = {"status": FAILED, "detail": f"{problem}\nHint: {checkoff.hint}"}
    sentence = problem.rstrip() if problem.rstrip().endswith((".", "!", "?")) else problem.rstrip() + "."
    print(FAIL_LINE.format(id=checkoff_id, problem=sentence, hint=checkoff.hint))
    for line in student_traceback(raised):
        print(line)


# --- cells that use a student's answer ----------------------------------------------------------

def passed(*checkoff_ids: str) -> bool:
    """True when every named checkoff passed in this kernel (feedback only: it decides no grade)."""
    return all(_RESULTS.get(i, {}).get("status") == PASSED for i in checkoff_ids)


def unlocked(*checkoff_ids: str) -> bool:
    """`passed`, for a cell that runs the student's own code: until then it prints one ⬜ line saying
    what it waits for, and Run All goes on."""
    if passed(*checkoff_ids):
        return True
    waiting = [i for i in checkoff_ids if not passed(i)]
    names = ", ".join(waiting)
    print(f"⬜ This cell runs your answer{'s' if len(waiting) > 1 else ''} to {names}: run it again once "
          f"checkoff{'s' if len(waiting) > 1 else ''} {names} pass{'' if len(waiting) > 1 else 'es'}.")
    return False


# --- what check() prints when an answer is missing or wrong ------------------------------------

def is_placeholder(answer, depth: int = 3) -> bool:
    """True for the build's stand-in for an answer not yet written (`...`), alone or inside a container.

    Only identity and built-in container types are looked at: a student's object is never asked
    anything (no `__eq__`, no `__iter__` of theirs runs).
    """
    if answer is PLACEHOLDER:
        return True
    if depth and type(answer) in (list, tuple, set, frozenset):
        return any(is_placeholder(a, depth - 1) for a in answer)
    if depth and type(answer) is dict:
        return any(is_placeholder(v, depth - 1) for v in answer.values())
    return False


def prompt_of(checkoff: Checkoff, raised: BaseException | None = None, caller=None) -> str:
    """The exercise's one-line prompt, as the student copy shows it, else the checkoff's title.

    The build writes ``# <to-do word> N.M: <prompt>`` above each placeholder and into each
    NotImplementedError.  The prompt comes from the error's message; else from the source of the
    cell that called check() (`caller`, a frame: its cell usually holds the placeholder); else from
    the latest cell in IPython's input history that carries the comment.
    """
    pattern = re.compile(rf"{PROMPT_WORD} {re.escape(checkoff.id)}: *(.+)")
    found = pattern.match(str(raised)) if raised is not None else None
    if found:
        return found[1].strip()
    comment = re.compile(rf"^[ \t]*# {pattern.pattern}$", re.M)
    sources = ["".join(linecache.getlines(caller.f_code.co_filename))] if caller is not None else []
    try:
        from IPython import get_ipython

        shell = get_ipython()
        history = shell.user_ns.get("In", []) if shell is not None else []
    except (ImportError, AttributeError):
        history = []
    sources += reversed(history) if isinstance(history, list) else []
    for source in sources:
        found = comment.search(source) if isinstance(source, str) else None
        if found:
            return found[1].strip()
    return checkoff.title


def student_traceback(exc: BaseException | None) -> list[str]:
    """The frames of `exc`'s traceback that are the student's code (never labsupport, Python or a library).

    Empty when no frame of the student's is in it: then the one-line problem already says it all.
    """
    if exc is None:
        return []
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _library_file(f.filename)]
    if not frames:
        return []
    lines = []
    for frame in frames[-MAX_STUDENT_FRAMES:]:
        lines.append(f"   {_where(frame.filename)}, line {frame.lineno}, in {frame.name}")
        if frame.line:
            lines.append(f"       {frame.line.strip()}")
    lines.append(f"   {type(exc).__name__}: {exc}")
    return lines


def _library_dirs() -> tuple[str, ...]:
    paths = {str(Path(__file__).resolve().parents[1])}  # labsupport itself
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            paths.add(str(Path(sysconfig.get_path(key)).resolve()))
        except (KeyError, TypeError, OSError):
            pass
    return tuple(p + os.sep for p in paths)


def _library_file(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return True
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return resolved.startswith(_library_dirs())


def _where(filename: str) -> str:
    """A notebook cell's file as IPython names it ("Cell In[7]"); any other file by its path."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        count = shell.compile._filename_map.get(filename) if shell is not None else None
    except (ImportError, AttributeError):
        count = None
    return f"Cell In[{count}]" if isinstance(count, int) else f'File "{filename}"'


def results() -> dict[str, dict]:
    """Every checkoff attempted in this Python session: id -> {"status", "detail"}."""
    return {k: dict(v) for k, v in _RESULTS.items()}


def reset_results() -> None:
    _RESULTS.clear()
