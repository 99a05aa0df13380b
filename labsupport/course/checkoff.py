"""Checkoffs: `check("2.1", answer)` gives instant feedback on a student's number or function (every lab).

A checkoff is registered once, in ``labsupport/course/checkoffs/labNN.py`` for lab NN, with one of

    value("2.1", "title", expected=lambda: ..., rel_tol=..., abs_tol=..., unit=" B", hint="...")
    choice("1.4", "title", answer="admit", options=JOBS, hint="...")
    @function("3.2", "title", hint="...", cases=lambda rng: [...])
    def _(student_fn, case): ...   # call it through `call(...)`, raise `Mismatch` on a wrong result

The expected value, or a function checkoff's cases with their expected results, is computed there,
from first principles (spec fields, hand formulas, or the real mechanism the student's code must
agree with), never by calling the student's code.  A checkoff is two steps, kept apart so that
`python -m labsupport grade` can do the first before any student code runs:

    prepare(rng)               the expected value, or the cases (the lab's own inputs plus random
                               ones drawn from `rng`: a fixed seed here, a secret one when grading)
    verdict(answer, prepared)  compare; raise `Mismatch` saying what is wrong

A checkoff may also name library functions its answer must not call (``forbid=``, with ``derive=``
saying what to work out instead): `grade` reads the student's code and fails an answer that reaches
for them.  The module is imported the first time one of its checkoffs is asked for, so a lab only has
to exist.

`check` is formative.  It prints one line and never raises for the answer, so Run All reaches the
end of a lab:

    ✅ Checkoff 2.1 passed
    ⬜ Checkoff 2.1 not attempted — <the exercise's prompt>
    ❌ Checkoff 2.1: <what was wrong> Hint: <how to think about it, never the answer>

The pass line is the checkoff cell's stored output in the student copy (`pytest --nbval-lax`
compares it).  "Not attempted" means the answer is still the student copy's placeholder, `...`
(alone or inside a list, tuple, set or dict), or the student's function raises NotImplementedError.
After a ❌ line come, only when the student's own code raised, the frames of that traceback that
are in the student's code (never labsupport's).  Outcomes are kept in `results()` for this kernel
only (the scoreboard reads them); the grade is decided by `labsupport.course.grade`, in a process
of its own, from the answers alone.
"""
from __future__ import annotations

import importlib
import inspect
import linecache
import os
import re
import sysconfig
import traceback
from pathlib import Path

from labsupport.course import formative
from labsupport.course.codec import contains_unfinished
# the kinds of checkoff and the registry, re-exported: the graders and the labs import them from here
from labsupport.course.registry import (ALWAYS_FORBIDDEN, Checkoff, Forbidden, ID_PATTERN, Mismatch,
                                       PUBLIC_SEED, REGISTRY, RemoteAnswer, RemoteError, answer_source,
                                       as_number, call, call_with, case_rng, choice, describe_call,
                                       expect_close, function, givens, is_triton_function, raise_if_unfinished,
                                       register, tolerance_text, units_slip, validate_id, value)  # noqa: F401

PASS_LINE = "✅ Checkoff {id} passed"
NOT_ATTEMPTED_LINE = "⬜ Checkoff {id} not attempted — {prompt}"
FAIL_LINE = "❌ Checkoff {id}: {problem} Hint: {hint}"
PROMPT_WORD = "TO" + "DO"  # built from parts: the word itself never appears in labsupport's source
MAX_STUDENT_FRAMES = 4
PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
SYMBOLS = {PASSED: "✅", FAILED: "❌", NOT_ATTEMPTED: "⬜"}

_RESULTS: dict[str, dict] = {}  # this kernel's outcomes, for the scoreboard


# --- looking up and checking ----------------------------------------------------------------

def lab_module_name(lab: int) -> str:
    return f"labsupport.course.checkoffs.lab{lab:02d}"


def load_lab(lab: int) -> list[Checkoff]:
    """Import lab `lab`'s checkoff module (if it has one) and return its checkoffs in order.

    Where the graders are not installed (the student release), the lab's sealed formative record
    stands in for them (labsupport.course.formative).
    """
    try:
        importlib.import_module(lab_module_name(lab))
    except ModuleNotFoundError as exc:
        if exc.name not in (lab_module_name(lab), "labsupport.course.checkoffs"):
            raise
        if exc.name == "labsupport.course.checkoffs":
            formative.register_lab(lab)
    return sorted((c for c in REGISTRY.values() if c.lab == lab), key=lambda c: c.order)


def get(checkoff_id: str) -> Checkoff:
    validate_id(checkoff_id)
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
    if contains_unfinished(answer):  # `slot_bytes = ...`, as the student copy left it
        prompt = prompt_of(checkoff, caller=inspect.currentframe().f_back)
        _RESULTS[checkoff_id] = {"status": NOT_ATTEMPTED, "detail": prompt}
        print(plain(NOT_ATTEMPTED_LINE.format(id=checkoff_id, prompt=prompt)))
        return
    raised = None
    try:
        checkoff.grade(answer)
    except NotImplementedError as exc:
        _RESULTS[checkoff_id] = {"status": NOT_ATTEMPTED, "detail": str(exc)}
        print(plain(NOT_ATTEMPTED_LINE.format(id=checkoff_id, prompt=prompt_of(checkoff, exc,
                                                                              inspect.currentframe().f_back))))
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
    print(plain(FAIL_LINE.format(id=checkoff_id, problem=sentence, hint=checkoff.hint)))
    for line in student_traceback(raised):
        print(line)


# --- cells that use a student's answer ----------------------------------------------------------

def passed(*checkoff_ids: str) -> bool:
    """True when every named checkoff passed in this kernel (feedback only: it decides no grade)."""
    return all(_RESULTS.get(i, {}).get("status") == PASSED for i in checkoff_ids)


def unlocked(*checkoff_ids: str) -> bool:
    """`passed`, for a cell that runs the student's own code: until then it prints one ⬜ line saying
    what it waits for, and Run All goes on."""
    return _waits_for(checkoff_ids, "runs your answer")


def revealed(*checkoff_ids: str) -> bool:
    """`passed`, for a cell that confirms an exercise's value with labsupport: the formula and the
    number stay hidden (one ⬜ line instead) until the student has derived them."""
    return _waits_for(checkoff_ids, "shows the answer")


def _waits_for(checkoff_ids: tuple[str, ...], what: str) -> bool:
    if passed(*checkoff_ids):
        return True
    waiting = [i for i in checkoff_ids if not passed(i)]
    names, many = ", ".join(waiting), len(waiting) > 1
    print(f"⬜ This cell {what}{'s' if many else ''} to {names}: run it again once "
          f"checkoff{'s' if many else ''} {names} pass{'' if many else 'es'}.")
    return False


# --- what check() prints when an answer is missing or wrong ------------------------------------

_CODE = re.compile(r"`+([^`]+?)`+")
_EMPHASIS = re.compile(r"(?<![\w*])\*{1,2}([^\s*](?:[^*]*[^\s*])?)\*{1,2}(?![\w*])")


def plain(text: str) -> str:
    """A feedback line as plain text: a print shows Markdown's `code` and *emphasis* marks literally,
    so they are dropped (2**31 and a*b, which are not emphasis, stay)."""
    return _EMPHASIS.sub(r"\1", _CODE.sub(r"\1", text))


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
