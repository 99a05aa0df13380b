"""The grade's reports: the table, JSON, the gradebook CSV and Gradescope's results.json (every lab).

Everything a report holds that came from a notebook (values, type names, messages, file and folder names in
any encoding) goes through `safe` first: lone surrogates, every C0/C1 control character (newlines, carriage
returns and tabs included), Unicode format characters (bidirectional controls, zero-width marks) and the line
and paragraph separators become visible escapes.  So writing a report never fails on a row's content, a text
of a row is one line whatever a student put in it, and no row can disguise itself or make another.  The one
newline a report keeps inside a text is the grader's own, before a checkoff's "Hint: " (`safe_detail`).
Files are written in a fresh private folder beside the target and renamed into place.

A row the grader itself could not judge (its generator, expected value or judge failed: never the student's
doing) is marked REGRADE, with the lab and checkoff, in every report; it is never scored, neither as a pass nor
as a 0, until course staff grade it again.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labsupport.course.checkoff import FAILED, NOT_ATTEMPTED, PASSED, SYMBOLS

REGRADE = "regrade"  # a checkoff the grader failed to judge: grade's own fault, to be graded again
_SYMBOLS = {**SYMBOLS, REGRADE: "⚠️"}
MAX_TEXT_CHARS = 2000  # of one detail or error a report keeps
# Escaped wherever a report writes student text: C0 and C1 controls (\n, \r, \t among them: a report line is
# one line), Unicode's format characters (category Cf, as of Unicode 14: the bidirectional embeddings, overrides
# and isolates U+202A-E, U+2066-9, the marks U+200E/F and U+061C, zero-width and invisible characters, the soft
# hyphen, tags), the line and paragraph separators U+2028/9 (str.splitlines and some viewers break lines there)
# and lone surrogates (no UTF-8 file can hold one; os.fsdecode makes them of a file name's undecodable bytes).
# Listed rather than derived from unicodedata at import: deriving walks 1.1 million code points (a second).
_FORMAT = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
           "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
           "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f")
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff" + _FORMAT + "]")
HINT = "\nHint: "  # how grade ends a checkoff's detail (grade._hinted): the one newline a detail keeps


def safe(text, limit: int = MAX_TEXT_CHARS) -> str:
    """`text` as a report may hold it, on one line: escapes for what could break a file, a line or fool a
    reader, and cut.  Idempotent below `limit` (an escape is printable ASCII)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    text = _UNSAFE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), str(text))
    return text if len(text) <= limit else f"{text[:limit]}… [cut: {len(text) - limit:,} more characters]"


def safe_detail(text, limit: int = MAX_TEXT_CHARS) -> str:
    """A checkoff's detail as a report holds it: the grader's words and the student's (an echoed answer, an
    exception's message) on one line, then, where grade added one, its hint on a line of its own.  Only the
    last HINT is the grader's (a hint is staff text and never holds one), so a student's "\nHint: " is escaped."""
    head, sep, hint = str(text).rpartition(HINT) if isinstance(text, str) else ("", "", text)
    return f"{safe(head, limit)}{HINT}{safe(hint, limit)}" if sep else safe(text, limit)


def safe_path(path) -> str:
    return safe(os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else path, 500)


@dataclass
class CheckoffResult:
    id: str
    title: str
    status: str
    detail: str = ""

    def __post_init__(self):
        self.detail = safe_detail(self.detail)


@dataclass
class NotebookGrade:
    path: str
    lab: int | None
    student: str = ""
    seconds: float = 0.0
    error: str = ""
    invalid: bool = False  # the file is not a notebook that can be graded
    not_graded: str = ""  # why this notebook was not graded (another of the student's counts for the lab)
    fault: str = ""  # a grader fault no one checkoff owns (the whole notebook is to be graded again)
    notes: list[str] = field(default_factory=list)
    checkoffs: list[CheckoffResult] = field(default_factory=list)

    # counted, never stored: the checkoffs are appended as they are judged
    passed = property(lambda self: sum(c.status == PASSED for c in self.checkoffs))
    failed = property(lambda self: sum(c.status == FAILED for c in self.checkoffs))
    total = property(lambda self: len(self.checkoffs))

    @property
    def regrade(self) -> list[str]:
        """Why this row is to be graded again, one line per grader fault ("REGRADE — grader fault in lab ...")."""
        faults = ([self.fault] if self.fault else []) + [c.detail for c in self.checkoffs if c.status == REGRADE]
        return [f"REGRADE — {safe(f)}" for f in faults]

    def __post_init__(self):
        self.path, self.student = safe_path(self.path), safe(self.student, 200)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(error=safe(self.error), not_graded=safe(self.not_graded), notes=[safe(n) for n in self.notes],
                   passed=self.passed, failed=self.failed, total=self.total, seconds=round(self.seconds, 3),
                   fault=safe(self.fault), regrade=self.regrade)
        return out


def format_grade(grade: NotebookGrade) -> str:
    lab = f"lab {grade.lab:02d}" if grade.lab is not None else "lab ?"
    who = f"{grade.student}: " if grade.student else ""
    if grade.not_graded:
        return f"{who}{grade.path}  ({lab}) not graded: {safe(grade.not_graded)}"
    lines = [f"{who}{grade.path}  ({lab}, graded in {grade.seconds:.1f} s)"]
    for c in grade.checkoffs:
        lines.append(f"  {_SYMBOLS[c.status]} {c.id:<5} {c.status:<14} {c.title}")
        detail = f"REGRADE — {c.detail}" if c.status == REGRADE else c.detail
        if c.status != PASSED and detail:  # one line per line of the detail: its text, then its hint
            lines += [f"        {line}" for line in safe_detail(detail, len(detail)).split("\n")]
    lines += [f"  ! {safe(line)}" for line in [grade.error, *grade.notes] if line]
    if grade.fault:
        lines.append(f"  ! REGRADE — {safe(grade.fault)}")
    lines.append(f"  score {_score(grade)}")
    return "\n".join(lines)


def _score(grade: NotebookGrade) -> str:
    """passed/total; a row with a grader fault has no score yet (its checkoffs to regrade are not zeros)."""
    if not grade.regrade:
        return f"{grade.passed}/{grade.total}"
    return f"REGRADE ({grade.passed}/{grade.total} passed so far; {len(grade.regrade)} grader fault(s) to regrade)"


def summary(grades: list[NotebookGrade]) -> dict:
    passed, failed = sum(g.passed for g in grades), sum(g.failed for g in grades)
    total = sum(g.total for g in grades)
    regrade = sum(c.status == REGRADE for g in grades for c in g.checkoffs)
    return {"notebooks": [g.as_dict() for g in grades], "passed": passed, "failed": failed,
            "not_attempted": total - passed - failed - regrade, "regrade": regrade,
            "regrade_notebooks": sum(bool(g.regrade) for g in grades), "total": total}


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet shows as text (never a formula)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def rows(grades: list[NotebookGrade]) -> tuple[list[str], list[dict]]:
    """One row per graded notebook (one per student × lab); the notebooks not graded are named in it."""
    skipped: dict[tuple, list[NotebookGrade]] = {}
    for g in grades:
        if g.not_graded:
            skipped.setdefault((g.student, g.lab), []).append(g)
    ids = sorted({c.id for g in grades for c in g.checkoffs}, key=lambda i: tuple(int(x) for x in i.split(".")))
    header = ["student", "lab", "notebook", "passed", "total", "score", "error", "regrade", *ids]
    out = []
    for g in grades:
        if g.not_graded:
            continue
        notes = [safe(n) for n in ([g.error] if g.error else []) + g.notes]
        notes += [f"also handed in {o.path} (not graded)" for o in skipped.get((g.student, g.lab), [])]
        row = {"student": _cell(g.student), "lab": "" if g.lab is None else f"{g.lab:02d}", "notebook": _cell(g.path),
               "passed": g.passed, "total": g.total, "score": _cell(_score(g)),
               "error": _cell("; ".join(notes)), "regrade": _cell("; ".join(g.regrade))}
        row.update({c.id: c.status for c in g.checkoffs})
        out.append(row)
    return header, out


def csv_text(grades: list[NotebookGrade]) -> str:
    header, table = rows(grades)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(table)
    return buf.getvalue()


def _test(c: CheckoffResult, visibility: str) -> dict:
    """One checkoff as a Gradescope test.  A checkoff to regrade has no "score" and no "status" (Gradescope's
    spec makes both optional on a test when the submission has a score), so it is posted neither as a pass
    nor as a 0; its output says why."""
    test = {"name": f"Checkoff {c.id}: {c.title}", "number": c.id, "max_score": 1.0, "visibility": visibility}
    if c.status == REGRADE:
        return {**test, "output": f"REGRADE — {c.detail} (not scored: course staff will grade it again)"}
    output = {PASSED: "passed", NOT_ATTEMPTED: f"not attempted: {c.detail}" if c.detail else "not attempted",
              FAILED: c.detail}[c.status]
    return {**test, "score": float(c.status == PASSED), "status": "passed" if c.status == PASSED else "failed",
            "output": output}


def gradescope(grades: list[NotebookGrade], visibility: str = "visible") -> dict:
    """Gradescope's results.json: one test per checkoff, one point each, the detail and hint as its output.

    With a grader fault the submission's output opens with the REGRADE lines; its score counts the checkoffs
    judged, and where none was judged there is no score at all (Gradescope then shows the run as the
    autograder's failure, which it is, instead of posting a 0)."""
    tests, notes, regrade = [], [], []
    for g in grades:
        where = Path(g.path).name
        if g.not_graded:
            notes.append(f"{where}: not graded: {safe(g.not_graded)}")
            continue
        notes += [f"{where}: {safe(n)}" for n in [g.error, *g.notes] if n]
        regrade += [f"{where}: {line}" for line in g.regrade]
        tests += [_test(c, visibility) for c in g.checkoffs]
    if not grades:
        notes.append("no notebook (.ipynb) was found in the submission")
    judged = [t["score"] for t in tests if "score" in t]
    score = sum(judged)
    out = {"output": "\n".join(regrade + notes) or f"{int(score)} of {len(tests)} checkoffs passed",
           "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}
    if regrade:
        out["extra_data"] = {"regrade": regrade}
    return out if regrade and not judged else {"score": score, **out}


def dump(data) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


@contextlib.contextmanager
def into_place(path: Path):
    """A path to write `path`'s new content at, renamed over `path` once written (through a fresh
    private folder beside it, so nothing planted at a guessable name is written through)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp = folder / "new"
        yield tmp
        os.replace(tmp, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_into_place(path: Path, text: str) -> None:
    with into_place(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
