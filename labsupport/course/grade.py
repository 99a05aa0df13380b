"""`python -m labsupport grade notebooks/NN_topic.ipynb [...] [--json]`: the checkoff scoreboard (every lab).

Each notebook runs top to bottom in a fresh kernel, in its own folder, with its stored outputs
thrown away first (a pasted "passed" line counts for nothing).  Execution continues past errors,
so one unfinished exercise does not hide the checkoffs after it.  A checkoff is

  passed         check() printed its line in this run,
  failed         check() raised CheckoffError (the scoreboard shows the hint), or the checkoff
                 cell raised some other error (shown),
  not attempted  its exercise still raises NotImplementedError, or its cell never ran.

The lab's checkoffs come from the registry (labsupport/course/checkoffs/labNN.py), so deleting a checkoff
cell makes it "not attempted", not absent.  Exit code: 0 when nothing failed, 1 when a checkoff
failed or a notebook could not be run to the end, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from labsupport.course.build import CHECK_RE, kernel_manager
from labsupport.course.checkoff import FAILED, NOT_ATTEMPTED, PASS_LINE, PASSED, load_lab

RESULTS_MARK = "labsupport-grade-results:"
_COLLECT = ("import json as _grade_json, labsupport.course.checkoff as _grade_checkoff\n"
            f"print({RESULTS_MARK!r} + _grade_json.dumps(_grade_checkoff.results()))")
SYMBOLS = {PASSED: "✅", FAILED: "❌", NOT_ATTEMPTED: "⬜"}


@dataclass
class CheckoffResult:
    id: str
    title: str
    status: str
    detail: str = ""


@dataclass
class NotebookGrade:
    path: str
    lab: int
    seconds: float = 0.0
    error: str = ""
    checkoffs: list[CheckoffResult] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(c.status == PASSED for c in self.checkoffs)

    @property
    def failed(self) -> int:
        return sum(c.status == FAILED for c in self.checkoffs)

    @property
    def total(self) -> int:
        return len(self.checkoffs)

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "failed": self.failed, "total": self.total}


def lab_number(path: Path, nb) -> int:
    match = re.match(r"^(\d\d)_", path.name)
    if match:
        return int(match[1])
    labs = {int(i.split(".")[0]) for cell in nb.cells if cell.cell_type == "code" for i in CHECK_RE.findall(cell.source)}
    if len(labs) == 1:
        return labs.pop()
    raise ValueError(f"{path}: cannot tell which lab this is (name it NN_topic.ipynb)")


def _run(nb, cwd: Path, timeout: int) -> str:
    """Execute in place, continuing past cell errors; returns why execution stopped early, if it did."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client = NotebookClient(nb, km=kernel_manager(), timeout=timeout, allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}}, record_timing=False,
                            store_widget_state=False)
    try:
        client.execute()
    except CellTimeoutError:
        return f"a cell ran longer than {timeout} s; the cells after it never ran"
    except DeadKernelError:
        return "the kernel died (out of memory?); the cells after it never ran"
    return ""


def _cell_outcome(cell, checkoff_id: str) -> tuple[str, str] | None:
    """What a checkoff cell's fresh outputs say about `checkoff_id` (None when the cell says nothing)."""
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return NOT_ATTEMPTED, "its cell never ran"
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and PASS_LINE.format(id=checkoff_id) in out.text.splitlines():
            return PASSED, ""
        if out.output_type == "error":
            if out.ename == "NotImplementedError":
                return NOT_ATTEMPTED, out.evalue
            return FAILED, f"{out.ename}: {out.evalue}"
    return None


def grade_notebook(path: str | Path, timeout: int = 600) -> NotebookGrade:
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    lab = lab_number(path, nb)
    registered = load_lab(lab)
    grade = NotebookGrade(str(path), lab)
    nb = copy.deepcopy(nb)
    for cell in nb.cells:  # never trust stored outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(_COLLECT))
    start = time.perf_counter()
    grade.error = _run(nb, path.parent.resolve(), timeout)
    grade.seconds = time.perf_counter() - start

    session: dict = {}
    for out in nb.cells[-1].get("outputs", []):
        if out.output_type == "stream" and RESULTS_MARK in out.text:
            session = json.loads(out.text.split(RESULTS_MARK, 1)[1])
    if not session and not grade.error and not nb.cells[-1].get("outputs"):
        grade.error = "the grader could not read the kernel's checkoff results"
    cells_by_id: dict[str, list] = {}
    for cell in nb.cells[:-1]:
        if cell.cell_type == "code":
            for checkoff_id in CHECK_RE.findall(cell.source):
                cells_by_id.setdefault(checkoff_id, []).append(cell)

    for checkoff in registered:
        status, detail = NOT_ATTEMPTED, "no cell of this notebook calls check() for it"
        if checkoff.id in session:
            status, detail = session[checkoff.id]["status"], session[checkoff.id]["detail"]
        elif checkoff.id in cells_by_id:
            status, detail = NOT_ATTEMPTED, "check() never ran"
            for cell in cells_by_id[checkoff.id]:
                outcome = _cell_outcome(cell, checkoff.id)
                if outcome:
                    status, detail = outcome
                    break
        grade.checkoffs.append(CheckoffResult(checkoff.id, checkoff.title, status, detail))
    return grade


def format_grade(grade: NotebookGrade) -> str:
    lines = [f"{grade.path}  (lab {grade.lab:02d}, ran in {grade.seconds:.1f} s)"]
    for c in grade.checkoffs:
        lines.append(f"  {SYMBOLS[c.status]} {c.id:<5} {c.status:<14} {c.title}")
        if c.status != PASSED and c.detail:
            lines += [f"        {line}" for line in c.detail.splitlines()]
    if grade.error:
        lines.append(f"  ! {grade.error}")
    lines.append(f"  score {grade.passed}/{grade.total}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labsupport grade",
                                description="Run student notebooks in a fresh kernel and score their checkoffs.")
    p.add_argument("notebooks", nargs="+", help="notebooks/NN_topic.ipynb files")
    p.add_argument("--json", action="store_true", help="print one JSON object (for a gradebook) instead of the table")
    p.add_argument("--timeout", type=int, default=600, help="seconds one cell may run (default 600)")
    args = p.parse_args(argv)
    paths = [Path(n) for n in args.notebooks]
    missing = [str(n) for n in paths if not n.is_file()]
    if missing:
        print(f"grade: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    grades = []
    for path in paths:
        try:
            grades.append(grade_notebook(path, timeout=args.timeout))
        except (ValueError, nbformat.reader.NotJSONError) as exc:
            print(f"grade: {path}: {exc}", file=sys.stderr)
            return 2
        if not args.json:
            print(format_grade(grades[-1]), flush=True)
    passed = sum(g.passed for g in grades)
    failed = sum(g.failed for g in grades)
    total = sum(g.total for g in grades)
    if args.json:
        print(json.dumps({"notebooks": [g.as_dict() for g in grades], "passed": passed, "failed": failed,
                          "not_attempted": total - passed - failed, "total": total}, indent=2, ensure_ascii=False))
    else:
        print(f"TOTAL {passed}/{total} checkoffs passed, {failed} failed, {total - passed - failed} not attempted")
    return 1 if failed or any(g.error for g in grades) else 0
