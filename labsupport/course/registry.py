"""What a checkoff is, and how one is registered (every lab): the kinds `value`, `choice`, `function`.

A lab's graders (``labsupport/course/checkoffs/labNN.py``) and the student release's sealed records
(`labsupport.course.formative`) both register their checkoffs here, into `REGISTRY`, with

    value("2.1", "title", expected=lambda: ..., rel_tol=..., abs_tol=..., unit=" B", hint="...")
    givens(lecture=dict(S_MAX=4096, ...), hidden=lambda rng: dict(S_MAX=rng.choice(...), ...))
    value("2.1", "title", expected=lambda g: g.S_MAX * ..., ...)   # a function of the lab's givens
    choice("1.4", "title", answer="admit", options=JOBS, hint="...")
    @function("3.2", "title", hint="...", cases=lambda rng: [...])
    def _(student_fn, case): ...   # call it through `call(...)`, raise `Mismatch` on a wrong result

A checkoff is two steps, `prepare(rng)` (the expected value, or the cases) and `verdict(answer,
prepared)` (compare; raise `Mismatch`), kept apart so that `grade` can prepare before any student
code runs.  `labsupport.course.checkoff` looks checkoffs up and gives the feedback.

**Givens.** A lab declares the quantities its exercises are posed on (`givens`): the lecture's
values, which the lab's givens cell binds, and a generator of other values.  A value checkoff whose
`expected` takes the givens (``lambda g: ...``) is graded by re-running the student's code on the
lecture's givens and on hidden ones, each compared with `expected` for those givens; one with
nothing to vary says why in `fixed=`.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import numbers
import os
import random
import re
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from labsupport.course.codec import Opaque, is_unfinished
from labsupport.units import fmt_number

ID_PATTERN = re.compile(r"^(\d+)\.(\d+)$")


# Whatever the checkoff, an answer may not reach into the course tooling (the graders and their
# expected values) or the ledger's one-call answers to the lecture's exercises.
ALWAYS_FORBIDDEN = ("labsupport.course", "labsupport.ledger.compute", "labsupport.ledger.Scenario",
                    *(f"labsupport.ledger.exercise{i}" for i in range(1, 6)))
PUBLIC_SEED = "labsupport formative cases"


class Mismatch(Exception):
    """Raised by a checkoff's grader: the student's answer is wrong; the message says how."""


@dataclass(frozen=True)
class Checkoff:
    id: str
    title: str
    hint: str
    kind: str  # "value", "choice" or "function"
    prepare: Callable[[random.Random], Any]  # expected value / cases, before any answer is seen
    verdict: Callable[[Any, Any], None]  # (answer, prepared): raises Mismatch when the answer is wrong
    module: str = ""
    forbid: tuple[str, ...] = ()  # dotted names the answer's code must not use
    derive: str = ""  # what to derive instead (the hint for a forbidden call)
    formative: dict = field(default_factory=dict, compare=False)  # how the student release compares
    expect: Callable[[types.SimpleNamespace], Any] | None = None  # the expected value for a set of givens
    fixed: str = ""  # why a value checkoff has no givens to vary

    @property
    def lab(self) -> int:
        return int(self.id.split(".")[0])

    @property
    def order(self) -> tuple[int, int]:
        lab, num = self.id.split(".")
        return int(lab), int(num)

    @property
    def forbidden(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.forbid, *ALWAYS_FORBIDDEN)))

    def grade(self, answer, rng: random.Random | None = None) -> None:
        """Prepare (with the public seed unless `rng` is given) and judge `answer` in this process."""
        __tracebackhide__ = True
        if is_unfinished(answer):
            raise NotImplementedError(f"{self.id} is still the student copy's placeholder: {self.title}")
        self.verdict(answer, self.prepare(rng if rng is not None else case_rng(self.id)))


REGISTRY: dict[str, Checkoff] = {}
GIVENS: dict[int, "Givens"] = {}
GIVEN_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Givens:
    """A lab's givens: the lecture's values (what its givens cell binds) and a source of other ones."""

    lab: int
    lecture: dict
    hidden: Callable[[random.Random], dict]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.lecture)

    def draw(self, rng: random.Random, n: int = 2) -> list[dict]:
        """`n` hidden sets, each differing from the lecture's in every given."""
        sets = []
        for _ in range(n):
            for _attempt in range(100):
                g = self.hidden(rng)
                if set(g) != set(self.lecture):
                    raise ValueError(f"lab {self.lab:02d}'s hidden givens have the keys {sorted(g)}, "
                                     f"not the givens {sorted(self.lecture)}")
                if all(g[k] != self.lecture[k] for k in g) and g not in sets:
                    break
            else:
                raise ValueError(f"lab {self.lab:02d}'s hidden givens never differ from the lecture's in every given")
            sets.append(g)
        return sets


def namespace(values: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(**values)


def givens(*, lecture: dict, hidden: Callable[[random.Random], dict], lab: int | None = None) -> types.SimpleNamespace:
    """Declare the calling lab's givens; returns the lecture's as a namespace (``G.S_MAX``)."""
    if lab is None:
        found = re.search(r"lab(\d+)$", _caller_module())
        if not found:
            raise ValueError("givens() is called from a lab's grader module (labNN.py), or with lab=")
        lab = int(found[1])
    for name, v in lecture.items():
        if not GIVEN_NAME.match(name):
            raise ValueError(f"lab {lab:02d}: a given is named in capitals (S_MAX), not {name!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError(f"lab {lab:02d}: given {name} is {v!r}; a given is a number or a string")
    GIVENS[lab] = Givens(lab, dict(lecture), hidden)
    return namespace(lecture)


def case_rng(checkoff_id: str, secret: bytes | None = None, key: str = "") -> random.Random:
    """The random source of a checkoff's cases: a fixed public seed, or one derived from a secret.

    `grade` draws a secret per run and derives one stream per (notebook, checkoff) from it, so no
    notebook can know, or share with another, the inputs its functions will be tried on.
    """
    material = (secret.hex() if secret else PUBLIC_SEED) + f"|{key}|{checkoff_id}"
    return random.Random(hashlib.sha256(material.encode()).digest())


# --- registering ----------------------------------------------------------------------------

def validate_id(checkoff_id: str) -> str:
    if not isinstance(checkoff_id, str) or not ID_PATTERN.match(checkoff_id):
        raise ValueError(f"checkoff id must look like '2.1' (lab.number), got {checkoff_id!r}")
    return checkoff_id


def register(checkoff: Checkoff) -> Checkoff:
    """Add a checkoff; a second module claiming the same id is a mistake worth stopping on."""
    validate_id(checkoff.id)
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


def _names(forbid: Iterable[str]) -> tuple[str, ...]:
    forbid = (forbid,) if isinstance(forbid, str) else tuple(forbid)
    for name in forbid:
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$", name):
            raise ValueError(f"forbid= wants dotted names such as 'labsupport.ledger.ridge_batch', got {name!r}")
    return forbid


def value(checkoff_id: str, title: str, *, expected: Callable[[], Any] | float, hint: str,
          rel_tol: float = 1e-9, abs_tol: float = 0.0, unit: str = "",
          mistakes: Iterable[tuple[float, str]] = (), judge: Callable[[Any, Any], None] | None = None,
          forbid: Iterable[str] = (), derive: str = "", formative: dict | None = None, fixed: str = "") -> Checkoff:
    """A number checked against `expected` (a callable, evaluated when prepared) within a tolerance.

    `expected` taking one argument is a function of the lab's givens (``lambda g: g.S_MAX * ...``):
    the grader re-runs the answer's code on hidden givens and compares with it there too.  A lab
    with givens states, in `fixed`, why a value checkoff that does not take them has nothing to vary.

    `mistakes` pairs a known wrong answer with a targeted remark (matched with the same tolerance).
    A structured answer (a dict of numbers, say) brings its own `judge(answer, expected)`, and
    `formative` tells the student release how to compare it without the judge (see formative.py).
    """
    mistakes = tuple(mistakes)
    lab = int(validate_id(checkoff_id).split(".")[0])
    takes_givens = callable(expected) and len(inspect.signature(expected).parameters) == 1
    if takes_givens and lab not in GIVENS:
        raise ValueError(f"checkoff {checkoff_id}: expected takes the givens, but lab {lab:02d} declares none")
    if lab in GIVENS and not takes_givens and not fixed.strip():
        raise ValueError(f"checkoff {checkoff_id}: lab {lab:02d} has givens; make expected a function of them "
                         "(lambda g: ...) or say in fixed= why this answer has nothing to vary")

    def expect(g):
        want = expected(g)
        return want if judge is not None else float(want)

    def prepare(rng):
        if takes_givens:
            return expect(namespace(GIVENS[lab].lecture))
        want = expected() if callable(expected) else expected
        return want if judge is not None else float(want)

    def verdict(answer, want):
        if judge is not None:
            judge(answer, want)
            return
        got = as_number(answer, "your answer")
        if math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol):
            return
        problem = f"you gave {fmt_number(got)}{unit}, {tolerance_text(rel_tol, abs_tol)}; it is too {'high' if got > want else 'low'}."
        for wrong, remark in mistakes:
            if math.isclose(got, wrong, rel_tol=max(rel_tol, 1e-9), abs_tol=abs_tol):
                problem += " " + remark
                break
        else:
            slip = units_slip(got, want, unit)
            if slip:
                problem += " " + slip
        raise Mismatch(problem)

    spec = dict(formative or {})
    if judge is None:
        spec.update(rel_tol=rel_tol, abs_tol=abs_tol, unit=unit, mistakes=[list(m) for m in mistakes])
    return register(Checkoff(checkoff_id, title, hint, "value", prepare, verdict, _caller_module(),
                             _names(forbid), derive, spec, expect if takes_givens else None, fixed.strip()))


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
            raise Mismatch(f"{_echo(item)} is not text; answer with one of: {', '.join(options)}.")
        key = item.strip().lower()
        if key not in options:
            raise Mismatch(f"{_echo(item)} is not one of: {', '.join(options)}.")
        return key

    def verdict(ans, want):
        if multi:
            if isinstance(ans, str) or not isinstance(ans, Iterable):
                raise Mismatch(f"this checkoff wants a set of options, e.g. {{'{options[0]}', ...}}; you gave {_echo(ans)}.")
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

    spec = {"options": list(options), "multi": multi, "mistakes": mistakes}
    return register(Checkoff(checkoff_id, title, hint, "choice", lambda rng: want, verdict, _caller_module(),
                             formative=spec))


def function(checkoff_id: str, title: str, *, hint: str, cases: Callable[[random.Random], Iterable] | None = None,
             forbid: Iterable[str] = (), derive: str = "", formative: dict | None = None
             ) -> Callable[[Callable], Checkoff]:
    """Decorator: the decorated judge receives the student's function and one of `cases(rng)`.

    The cases (inputs and expected results) are prepared before the student's function is seen;
    without `cases` the judge is called once, as ``judge(fn)``.  `formative` tunes how the student
    release replays the recorded calls (e.g. ``{"abs_tol": 1.0}``; see formative.py).
    """
    forbid = _names(forbid)

    def wrap(judge: Callable) -> Checkoff:
        def prepare(rng):
            return list(cases(rng)) if cases is not None else [None]

        def verdict(fn, prepared):
            if not callable(fn):
                raise Mismatch(f"this checkoff wants your function itself (no parentheses); you gave {_echo(fn)}.")
            for case in prepared:
                if cases is None:
                    judge(fn)
                else:
                    judge(fn, case)

        return register(Checkoff(checkoff_id, title, hint, "function", prepare, verdict, judge.__module__,
                                 forbid, derive, dict(formative or {})))

    return wrap


# --- helpers for graders --------------------------------------------------------------------
def _echo(x, limit: int = 80) -> str:
    """What the student handed in, as a report repeats it: short (a report is no channel for what a notebook read)."""
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def as_number(x, what: str) -> float:
    """A real number out of an int, float, numpy scalar or one-element tensor; anything else is a Mismatch."""
    if callable(x):
        raise Mismatch(f"{what} is a function; call it and pass the number it returns.")
    if isinstance(x, bool) or x is None:
        raise Mismatch(f"{what} is {_echo(x)}, not a number. Did your code forget to return or assign it?")
    if not isinstance(x, numbers.Real):
        item = getattr(x, "item", None)
        try:
            x = item() if item is not None else x
        except (ValueError, RuntimeError):
            raise Mismatch(f"{what} holds several numbers ({type(x).__name__}); one number is expected.") from None
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        kind = x.type_name if isinstance(x, Opaque) else type(x).__name__
        raise Mismatch(f"{what} is a {kind}, not a number.")
    x = float(x)
    if not math.isfinite(x):
        raise Mismatch(f"{what} is {x}, not a finite number.")
    return x


def tolerance_text(rel_tol: float, abs_tol: float) -> str:
    if rel_tol <= 1e-9 and abs_tol == 0:
        return "which is not exactly right"
    if abs_tol and rel_tol <= 1e-9:
        return f"which is not within ±{fmt_number(abs_tol)} of the right value"
    if not abs_tol:
        return f"which is not within {rel_tol:.2%} of the right value"
    return f"which is not within ±{fmt_number(abs_tol)} or {rel_tol:.2%} of the right value"


# (factor, what it is, whether only a quantity in bytes can suffer it)
_SLIPS = (
    (1e9 / 2**30, "GB read as GiB (or the reverse): 1 GB = 1e9 bytes, 1 GiB = 2**30 bytes", True),
    (1.024, "a decimal kB where the lecture means KiB (or the reverse)", True),
    (1024 / 1e6, "a KiB/MB mix-up", True),
    (2**20, "a factor of 2**20: MiB versus bytes?", True),
    (2**30, "a factor of 2**30: GiB versus bytes?", True),
    (1e3, "a factor of 1,000: a unit prefix (k, M, G, ms) slipped?", False),
    (1e6, "a factor of a million: a unit prefix slipped?", False),
    (1e9, "a factor of 1e9: GB versus bytes?", False),
    (1e12, "a factor of 1e12: TFLOP/s versus FLOP/s?", False),
    (1024, "a factor of 1,024: a binary prefix slipped?", True),
    (2, "a factor of 2: keys and values, bytes per element, or 2 FLOP per multiply-add?", False),
    (8, "a factor of 8: bits versus bytes?", True),
)
_BYTE_UNITS = ("B", "bytes", "KiB", "MiB", "GiB", "GB", "MB", "kB", "B/s", "GB/s")


def units_slip(got: float, want: float, unit: str | None = None) -> str:
    """Name the units slip that explains `got` (a remark, never the right value), or "".

    A slip multiplies the whole answer by its factor, so the ratio must be that factor to within
    rounding (a count a whole block or a floor off, 2.4% away, is not a kB/KiB slip); and a byte
    prefix slip is named only for a quantity in bytes (`unit` None: not known, any may apply).
    """
    if got == 0 or want == 0 or (got < 0) != (want < 0):
        return ""
    in_bytes = unit is None or unit.strip() in _BYTE_UNITS
    ratio = got / want
    for factor, name, bytes_only in _SLIPS:
        if bytes_only and not in_bytes:
            continue
        for f in (factor, 1 / factor):
            if math.isclose(ratio, f, rel_tol=1e-6):
                return f"Your answer is off by what looks like {name}" + ("" if name.endswith("?") else ".")
    return ""


class RemoteAnswer:
    """An answer that lives in another process (labsupport.course.worker): calls travel as plain data.

    `call` and `call_with` hand it their arguments; it returns the result decoded on this side, or
    raises NotImplementedError (the exercise is unfinished) or `Mismatch` (it raised, took too long,
    or ended its process).
    """

    name = "your function"
    source = ""
    info: dict = {}

    @property
    def __name__(self) -> str:  # noqa: PLW3201 - messages name the call the way a function reads
        return self.name

    def __call__(self, *args, **kwargs):
        return self.remote_call(args, kwargs)

    def remote_call(self, args: tuple, kwargs: dict):  # pragma: no cover - implemented by the worker client
        raise NotImplementedError

    def remote_call_with(self, target: Callable, answer_kw: str, args: tuple, kwargs: dict):  # pragma: no cover
        raise NotImplementedError


class Forbidden(Mismatch):
    """The student's function called a name its checkoff forbids (caught as it ran, in the worker)."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        super().__init__(f"your function called {', '.join(self.names)}, which this exercise asks you to derive")


class RemoteError(Exception):
    """The student's code (or a library function running it) raised in the worker: type name and message."""

    def __init__(self, type_name: str, message: str):
        self.type_name, self.message = type_name, message
        super().__init__(f"{type_name}: {message}" if message else type_name)


def call(fn: Callable, *args, **kwargs):
    """Call the student's function; its errors become a Mismatch naming the call (NotImplementedError passes)."""
    __tracebackhide__ = True
    if isinstance(fn, RemoteAnswer):
        return fn.remote_call(args, kwargs)
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:  # the student's bug, reported with the call that triggered it
        raise Mismatch(f"{describe_call(fn, args, kwargs)} raised {type(exc).__name__}: {exc}") from None


def call_with(fn: Callable, target: Callable, *args, answer_kw: str, **kwargs):
    """Run labsupport's `target` with the student's function as its `answer_kw` argument.

    For a Triton exercise the kernel itself must run where the student's function lives; errors
    are left to the caller (RemoteError when remote), which knows how to word them.
    """
    __tracebackhide__ = True
    if isinstance(fn, RemoteAnswer):
        return fn.remote_call_with(target, answer_kw, args, kwargs)
    return target(*args, **{answer_kw: fn}, **kwargs)


def answer_source(fn) -> str:
    """The source text of the student's function ("" when it cannot be found)."""
    if isinstance(fn, RemoteAnswer):
        return fn.source
    try:
        return inspect.getsource(getattr(fn, "fn", fn))
    except (OSError, TypeError):
        return ""


def is_triton_function(fn) -> bool:
    """True for a ``@triton.jit`` function (it carries the Python function as `.fn`)."""
    if isinstance(fn, RemoteAnswer):
        return bool(fn.info.get("triton_jit"))
    return callable(getattr(fn, "fn", None))


_EXERCISE_RAISE = re.compile(r'raise\s+NotImplementedError\(\s*(?P<message>"(?:[^"\\\n]|\\.)*")')


def raise_if_unfinished(fn) -> None:
    """Raise the exercise's own NotImplementedError while ``fn``'s body still holds it.

    Triton does not let an exception raised inside a kernel through as itself (the interpreter wraps
    it in an InterpreterError; the GPU compiler rejects the raise), so an unfinished ``@triton.jit``
    exercise is recognised from its source before anything runs: 'not attempted', not 'failed'."""
    source = answer_source(fn)
    if not source:
        return
    found = _EXERCISE_RAISE.search(source)
    if found:
        try:
            message = json.loads(found["message"])
        except ValueError:
            message = found["message"]
        raise NotImplementedError(message)
    if "raise NotImplementedError" in source:
        name = getattr(getattr(fn, "fn", fn), "__name__", "this function")
        raise NotImplementedError(f"{name} still raises NotImplementedError")


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
    raise Mismatch(f"{what} returned {fmt_number(x)}, which is too {'high' if x > want else 'low'}." + (f" {slip}" if slip else ""))
