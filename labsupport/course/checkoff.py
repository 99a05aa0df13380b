"""Checkoffs: `check("2.1", answer)` gives instant feedback on a student's number or function (every lab).

check() reads the lab's public record (labsupport.course.record), scans the exercise's cells for a
direct call of the library function that would answer it (scan), runs a function on the lab's own
cases (harness) and judges (judge); no grader is ever imported here.  It is formative: it prints one
line (the *_LINE formats below) and never raises for the answer, so Run All reaches the end of a lab.
An answer that is still the student copy's `...`, or a function that still raises NotImplementedError,
is "not attempted".  While `grade` runs a notebook, check() only hands the answer over (`collect`).
"""
from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import re
import sysconfig
import traceback
from pathlib import Path

from labsupport.course import data, harness, judge, record, scan
from labsupport.course.judge import Mismatch

PASS_LINE = "✅ Checkoff {id} passed"
NOT_ATTEMPTED_LINE = "⬜ Checkoff {id} not attempted — {prompt}"
FAIL_LINE = "❌ Checkoff {id}: {problem} Hint: {hint}"  # the hint: how to think about it, never the answer
PROMPT_WORD = "TO" + "DO"  # built from parts: the word itself never appears in labsupport's source
MAX_STUDENT_FRAMES = 4
PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
SYMBOLS = {PASSED: "✅", FAILED: "❌", NOT_ATTEMPTED: "⬜"}

_RESULTS: dict[str, dict] = {}  # this kernel's outcomes, for the scoreboard
collect = None  # while grading: the runner's collector, handed every check() call instead


def load_lab(lab: int) -> list[dict]:
    """Lab `lab`'s checkoffs, in order, as its record describes them."""
    rec = record.read(lab)
    return sorted(rec["checkoffs"], key=lambda e: tuple(map(int, e["id"].split(".")))) if rec else []


def get(checkoff_id: str) -> dict:
    if not isinstance(checkoff_id, str) or not re.match(r"^\d+\.\d+$", checkoff_id):
        raise ValueError(f"checkoff id must look like '2.1' (lab.number), got {checkoff_id!r}")
    found = record.entry(checkoff_id)
    if found is None:
        known = ", ".join(e["id"] for e in load_lab(int(checkoff_id.split(".")[0]))) or "none"
        raise KeyError(f"unknown checkoff {checkoff_id!r}; lab {checkoff_id.split('.')[0]} has: {known}")
    return found


def verdict(entry: dict, answer, exercise: list[str] = (), everything: list[str] = ()) -> None:
    """Raise Mismatch (or judge.Unfinished) unless `answer` passes `entry`'s scan and its record's spec."""
    found = scan.hits(list(exercise), list(exercise) + list(everything), entry.get("forbid", ()))
    if found:
        raise Mismatch(forbidden_text(found, entry))
    if entry["kind"] != "function":
        try:
            got = data.parse(data.dumps(answer))
        except data.DataError as exc:  # as grade says of it: the answer fails, and check() never raises
            raise Mismatch(f"the answer handed to check() could not be read as plain data ({exc})") from None
        return judge.verdict(got, judge.readable(entry["spec"]))
    if not callable(answer):
        raise Mismatch(f"this checkoff wants your function itself (no parentheses); you gave {judge.echo(answer)}.")
    for case in entry["cases"]:
        judge.observed(data.reread(harness.observe(answer, case["input"])), judge.readable(case["spec"]))


def forbidden_text(names: list[str], entry: dict) -> str:
    """The scan's finding, the same words in check() and in grade."""
    derive = entry.get("derive") or "work it out from the quantities you have"
    return (f"your code for {entry['id']} calls {', '.join(names)}, which answers this exercise in one call. "
            f"Derive it instead: {derive}.")


def check(checkoff_id: str, answer) -> None:
    """Judge `answer` (a value, or your function) for checkoff `checkoff_id` and print one line; never raises."""
    __tracebackhide__ = True
    if collect is not None:
        return collect(checkoff_id, answer)
    entry = get(checkoff_id)
    caller = inspect.currentframe().f_back
    harness.base.LAST_ERROR = None  # one variable, in harness/base.py, that _raised sets
    try:
        if data.contains_unfinished(answer):  # `slot_bytes = ...`, as the student copy left it
            raise judge.Unfinished()
        verdict(entry, answer, _exercise_sources(caller, answer), _history())
    except judge.Unfinished as exc:  # the placeholder, or a function that still raises NotImplementedError
        prompt = prompt_of(entry, str(exc), caller)
        _RESULTS[checkoff_id] = {"status": NOT_ATTEMPTED, "detail": prompt}
        print(plain(NOT_ATTEMPTED_LINE.format(id=checkoff_id, prompt=prompt)))
        return
    except Mismatch as exc:
        problem = str(exc)
    except Exception as exc:  # noqa: BLE001 - an answer no judge foresaw: a failed line, never a raise
        problem = f"your answer could not be checked ({type(exc).__name__}: {str(exc)[:200]})"
    else:
        _RESULTS[checkoff_id] = {"status": PASSED, "detail": ""}
        print(PASS_LINE.format(id=checkoff_id))
        return
    _RESULTS[checkoff_id] = {"status": FAILED, "detail": f"{problem}\nHint: {entry['hint']}"}
    print(plain(FAIL_LINE.format(id=checkoff_id, problem=judge.sentence(problem), hint=entry["hint"])))
    for line in student_traceback(harness.base.LAST_ERROR):
        print(line)


def _exercise_sources(caller, answer) -> list[str]:
    """The cells that are the exercise: the one calling check() and, for a function, the one defining it
    (outside a notebook: the calling function's and the handed-in function's own source)."""
    codes = [caller.f_code if caller is not None else None, getattr(getattr(answer, "fn", answer), "__code__", None)]
    return [_cell_or_source(code) for code in codes if code is not None]


def _cell_or_source(code) -> str:
    if _where(code.co_filename).startswith("Cell In["):
        return "".join(linecache.getlines(code.co_filename))
    try:
        return inspect.getsource(code)
    except (OSError, TypeError):
        return ""


def _history() -> list[str]:
    try:
        from IPython import get_ipython
        history = get_ipython().user_ns.get("In", [])
    except (ImportError, AttributeError):  # no IPython, or no shell running
        history = []
    return [h for h in history if isinstance(h, str)]


def passed(*checkoff_ids: str) -> bool:
    """True when every named checkoff passed in this kernel (feedback only: it decides no grade)."""
    return all(_RESULTS.get(i, {}).get("status") == PASSED for i in checkoff_ids)


def unlocked(*checkoff_ids: str) -> bool:
    """`passed`, for a cell that runs the student's own code: until then one ⬜ line says what it waits for."""
    return _waits_for(checkoff_ids, "runs your answer")


def revealed(*checkoff_ids: str) -> bool:
    """`passed`, for a cell that confirms an exercise's value: the number stays hidden until it is derived."""
    return _waits_for(checkoff_ids, "shows the answer")


def _waits_for(checkoff_ids: tuple[str, ...], what: str) -> bool:
    waiting = [i for i in checkoff_ids if not passed(i)]
    if waiting:
        names, many = ", ".join(waiting), len(waiting) > 1
        print(f"⬜ This cell {what}{'s' if many else ''} to {names}: run it again once "
              f"checkoff{'s' if many else ''} {names} pass{'' if many else 'es'}.")
    return not waiting


_CODE = re.compile(r"`+([^`]+?)`+")
_EMPHASIS = re.compile(r"(?<![\w*])\*{1,2}([^\s*](?:[^*]*[^\s*])?)\*{1,2}(?![\w*])")


def plain(text: str) -> str:
    """A feedback line as plain text: Markdown's `code` and *emphasis* marks dropped (2**31 and a*b stay)."""
    return _EMPHASIS.sub(r"\1", _CODE.sub(r"\1", text))


def prompt_of(entry: dict, raised: str | None = None, caller=None) -> str:
    """The exercise's one-line prompt: from the NotImplementedError's message, else the calling cell's
    ``# <to-do word> N.M:`` comment, else the latest cell of the input history with one, else the title."""
    pattern = re.compile(rf"{PROMPT_WORD} {re.escape(entry['id'])}: *(.+)")
    found = pattern.match(raised) if raised else None
    if found:
        return found[1].strip()
    comment = re.compile(rf"^[ \t]*# {pattern.pattern}$", re.M)
    sources = ["".join(linecache.getlines(caller.f_code.co_filename))] if caller is not None else []
    for source in sources + list(reversed(_history())):
        found = comment.search(source)
        if found:
            return found[1].strip()
    return (entry.get("prompts") or [entry["title"]])[-1]


def student_traceback(exc: BaseException | None) -> list[str]:
    """The frames of `exc`'s traceback that are the student's code (never labsupport, Python or a library)."""
    frames = [f for f in traceback.extract_tb(getattr(exc, "__traceback__", None)) if not _library_file(f.filename)]
    if not frames:
        return []
    lines = []
    for frame in frames[-MAX_STUDENT_FRAMES:]:
        lines.append(f"   {_where(frame.filename)}, line {frame.lineno}, in {frame.name}")
        if frame.line:
            lines.append(f"       {frame.line.strip()}")
    return lines + [f"   {type(exc).__name__}: {exc}"]


def _library_file(filename: str) -> bool:
    """A file of labsupport's, Python's or an installed library's: no frame the student wrote."""
    if filename.startswith("<frozen "):
        return True
    dirs = {str(Path(__file__).resolve().parents[1])}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError, TypeError, OSError):
            dirs.add(str(Path(sysconfig.get_path(key)).resolve()))
    try:
        return str(Path(filename).resolve()).startswith(tuple(d + os.sep for d in dirs))
    except (OSError, ValueError):
        return False


def _where(filename: str) -> str:
    """A notebook cell's file as IPython names it ("Cell In[7]"); any other file by its path."""
    try:
        from IPython import get_ipython
        count = get_ipython().compile._filename_map.get(filename)
    except (ImportError, AttributeError):  # no IPython, or no shell running
        count = None
    return f"Cell In[{count}]" if isinstance(count, int) else f'File "{filename}"'


def results() -> dict[str, dict]:
    """Every checkoff attempted in this Python session: id -> {"status", "detail"}."""
    return {k: dict(v) for k, v in _RESULTS.items()}


def reset_results() -> None:
    _RESULTS.clear()
