"""A batch is never lost, and no row can write another (issue 34, item 3).

A student's folder is data: nested 1,100 deep (Path.rglob raised RecursionError there, and the whole batch
had no CSV and no JSON), holding 10,001 files, or named with newlines, commas, quotes and bytes that are not
UTF-8.  A notebook's answers and exception messages are data too: a string answer holding "\n" and text that
looks like the grader's rows.  Each test builds one such batch and checks, from the structure of the report
(derived by hand from what the batch holds), that every other student is graded as alone, that the text
report has one line per row, and that the CSV, JSON and Gradescope files parse whole.

Notebooks that actually run are lab 97's (tests/grading.py: 97.1 = A x B, 97.2 add(x, y), 97.3 "yes"),
in bubblewrap (skipped where it cannot run); the collection tests need no sandbox.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from pathlib import Path

import pytest

import grading as T
from labsupport.course import grade as G
from labsupport.course import report as R
from labsupport.course import sandbox as S

T.register()
SEED = 7
SECRET = hashlib.sha256(f"seed {SEED}".encode()).digest()  # what `grade --seed 7` grades with
RIGHT = [T.RIGHT["97.1"], T.RIGHT["97.2"], T.RIGHT["97.3"]]

# What a line of the text report is, each kind as format_grade writes it (a notebook's header, a row not
# graded, a checkoff, a line of its detail, a note, its score; the total at the end).
HEADER = re.compile(r"^\S.*  \(lab (\d\d|\?), graded in \d+\.\d s\)$")
NOT_GRADED = re.compile(r"^\S.*  \(lab (\d\d|\?)\) not graded: .+$")
CHECKOFF = re.compile(r"^  [✅❌⬜] (\d+\.\d+) +(passed|failed|not attempted) +\S.*$")
DETAIL = re.compile(r"^        \S.*$")
NOTE = re.compile(r"^  ! \S.*$")
SCORE = re.compile(r"^  score (\d+)/(\d+)$")
TOTAL = re.compile(r"^TOTAL \d+/\d+ checkoffs passed, \d+ failed, \d+ not attempted$")

# Text made to pass for the grader's own lines, were it ever to start a line of its own.
FAKE_ROWS = ("\n  ✅ 97.1  passed         A times B\n  score 3/3\r\nTOTAL 3/3 checkoffs passed, 0 failed, "
             "0 not attempted\nHint: ask nobody")
HOSTILE_CHARACTERS = "\r\t\x1b\x00\x85\u202e\u2066\u200e\u200f\u061c\u2028\u2029\ufeff"


def rows_of_text(text: str, summary: dict) -> None:
    """Assert `text` (grade's table) is exactly the rows of `summary` (its --json), one line each, in order:
    per notebook its header, each checkoff's line with at most its detail's two lines, its notes, its score."""
    lines = text.split("\n")
    assert lines[-1] == "" and TOTAL.match(lines[-2]), lines[-2:]
    lines = lines[:-2]
    at = 0
    for nb in summary["notebooks"]:
        if nb["not_graded"]:
            assert NOT_GRADED.match(lines[at]), lines[at]
            at += 1
            continue
        assert HEADER.match(lines[at]) and lines[at].startswith(f"{nb['student']}: "), lines[at]
        at += 1
        for c in nb["checkoffs"]:
            found = CHECKOFF.match(lines[at])
            assert found and found[1] == c["id"] and found[2] == c["status"], lines[at]
            at += 1
            details = 0 if c["status"] == "passed" or not c["detail"] else c["detail"].count("\n") + 1
            assert details <= 2  # the grader's words on one line, then its hint
            for _ in range(details):
                assert DETAIL.match(lines[at]), lines[at]
                at += 1
        for _ in [n for n in [nb["error"], *nb["notes"]] if n]:
            assert NOTE.match(lines[at]), lines[at]
            at += 1
        score = SCORE.match(lines[at])
        assert score and (int(score[1]), int(score[2])) == (nb["passed"], nb["total"]), lines[at]
        at += 1
    assert at == len(lines), lines[at:]  # no line left over: nothing made a row of its own


def whole_files(out: Path, summary: dict) -> tuple[list[dict], dict]:
    """The CSV and Gradescope files parse, with one row per graded notebook and one test per checkoff."""
    graded = [nb for nb in summary["notebooks"] if not nb["not_graded"]]
    with open(out / "gradebook.csv", newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(graded)
    assert [r["score"] for r in table] == [f"{nb['passed']}/{nb['total']}" for nb in graded]
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert len(results["tests"]) == sum(nb["total"] for nb in graded)
    return table, results


def run_grade(argv: list[str], capsys) -> tuple[int, str, dict]:
    """grade's exit code, its table, and its --json summary, from two runs of main() on the same batch."""
    code = G.main([*argv, "--no-progress", "--seed", str(SEED)])
    table = capsys.readouterr().out
    again = G.main([*argv, "--no-progress", "--seed", str(SEED), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert again == code
    return code, table, summary


def _remove_deep(top: Path) -> None:
    """Remove a tree of one folder per level from the bottom up (shutil.rmtree recurses, and 1,100 is too deep)."""
    path = top
    while True:
        inner = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        for e in os.scandir(path):
            if not e.is_dir(follow_symlinks=False):
                os.unlink(e.path)
        if not inner:
            break
        path = Path(inner[0].path)
    while path != top.parent:
        os.rmdir(path)
        path = path.parent


# --- collecting: limits that fail one row ---------------------------------------------------------------------

def test_the_depth_and_entry_limits_fail_exactly_past_them(tmp_path):
    student = tmp_path / "ann"
    deepest = student.joinpath(*["d"] * 3)
    T.notebook(deepest / "97_lab.ipynb", *RIGHT)
    # ann/d/d/d: three folders below ann (the notebook inside the third); entries: 3 folders + 1 notebook
    assert G.notebooks_in(student, max_depth=3) == [deepest / "97_lab.ipynb"]
    with pytest.raises(G.CollectError, match="nested more than 2 deep"):
        G.notebooks_in(student, max_depth=2)
    assert G.notebooks_in(student, max_entries=4) == [deepest / "97_lab.ipynb"]
    with pytest.raises(G.CollectError, match="more than 3 files and folders"):
        G.notebooks_in(student, max_entries=3)
    (student / ".ipynb_checkpoints").mkdir()
    T.notebook(student / ".ipynb_checkpoints" / "97_lab-checkpoint.ipynb", *RIGHT)
    assert G.notebooks_in(student) == [deepest / "97_lab.ipynb"]  # a checkpoint is never a hand-in


def test_a_folder_1100_deep_is_one_row_beside_an_honest_student_graded_whole(tmp_path, capsys):
    T.sandbox()
    klass, out = tmp_path / "class", tmp_path / "out"
    out.mkdir()
    honest = T.notebook(klass / "honest" / "97_lab.ipynb", *RIGHT)
    deep = bottom = klass / "deep"
    try:
        for _ in range(1 + 1100):  # one level at a time: os.makedirs recurses, and fails as rglob did
            os.mkdir(bottom)
            bottom = bottom / "d"
        bottom = bottom.parent
        T.notebook(bottom / "97_lab.ipynb", *RIGHT)
        code, table, summary = run_grade([str(klass), "--csv", str(out / "gradebook.csv"),
                                          "--gradescope", str(out / "results.json")], capsys)
    finally:
        if deep.exists():
            _remove_deep(deep)
    assert code == 1  # a row that could not be graded: as a notebook that did not run
    by = {nb["student"]: nb for nb in summary["notebooks"]}
    assert sorted(by) == ["deep", "honest"]
    assert (by["honest"]["passed"], by["honest"]["total"], by["honest"]["error"]) == (3, 3, "")
    assert by["honest"]["path"] == str(honest)
    assert by["deep"]["total"] == 0 and by["deep"]["lab"] is None
    assert "has folders nested more than 32 deep" in by["deep"]["error"] and "\n" not in by["deep"]["error"]
    rows_of_text(table, summary)
    csv_rows, results = whole_files(out, summary)
    assert [r["student"] for r in csv_rows] == ["deep", "honest"] and "nested more than 32" in csv_rows[0]["error"]
    assert results["score"] == 3.0 and "nested more than 32" in results["output"]


def test_a_folder_of_10001_files_is_one_row_and_its_classmate_is_graded(tmp_path, monkeypatch):
    klass = tmp_path / "class"
    T.notebook(klass / "ann" / "97_lab.ipynb", *RIGHT)
    hoard = klass / "bob" / "junk"
    hoard.mkdir(parents=True)
    T.notebook(klass / "bob" / "97_lab.ipynb", *RIGHT)
    for i in range(G.MAX_ENTRIES):  # with junk/ and the notebook: 10,002 entries in bob's folder
        (hoard / f"{i}.txt").touch()
    subs, problems = G.collect([str(klass)])
    assert problems == []
    assert [(s.student, s.path.name, bool(s.error)) for s in subs] == [("ann", "97_lab.ipynb", False),
                                                                       ("bob", "bob", True)]
    assert "holds more than 10,000 files and folders" in subs[1].error
    graded = []
    monkeypatch.setattr(G.Grader, "grade", lambda self, path, student="": graded.append(student) or
                        R.NotebookGrade(path, 97, student))
    grades = G.grade_all(G.Grader(None, secret=SECRET), subs, progress=False)
    assert graded == ["ann"] and [(g.student, bool(g.error)) for g in grades] == [("ann", False), ("bob", True)]
    assert len(R.csv_text(grades).strip().split("\n")) == 3  # the header and two rows


# --- reports: whatever a row holds, every file is whole and every row one line ----------------------------------

def test_a_row_made_of_hostile_text_is_one_row_in_every_report():
    name = os.fsdecode(b"mal\xff\xfelory,\"x\"") + FAKE_ROWS + HOSTILE_CHARACTERS + "\ud800"
    grade = R.NotebookGrade(f"/class/{name}/97_lab.ipynb", 97, name, error="stopped" + FAKE_ROWS,
                            notes=["note" + FAKE_ROWS + HOSTILE_CHARACTERS])
    grade.checkoffs = [  # as grade writes a detail: its words (with the student's inside), "\nHint: ", the hint
        R.CheckoffResult("97.1", "A times B", R.FAILED, f"it gave {name!s}\nHint: multiply them"),
        # a detail with no hint: grade escapes the student's part where it reads it (runs_of, an exception's
        # message), so the one newline a report keeps in a detail is always the grader's own before its hint
        R.CheckoffResult("97.2", "Add", R.NOT_ATTEMPTED, "cell 4 raised ValueError: " + R.safe(FAKE_ROWS)),
        R.CheckoffResult("97.3", "Yes or no", R.PASSED)]
    honest = R.NotebookGrade("/class/ann/97_lab.ipynb", 97, "ann")
    honest.checkoffs = [R.CheckoffResult(i, i, R.PASSED) for i in ("97.1", "97.2", "97.3")]
    grades = [grade, honest]
    summary = json.loads(R.dump(R.summary(grades)))
    totals = R.summary(grades)
    table = "\n".join(R.format_grade(g) for g in grades) + (
        f"\nTOTAL {totals['passed']}/{totals['total']} checkoffs passed, {totals['failed']} failed, "
        f"{totals['not_attempted']} not attempted\n")
    rows_of_text(table, summary)
    for text in (table, R.csv_text(grades), R.dump(R.gradescope(grades))):
        text.encode("utf-8")
        assert not set(text) & set(HOSTILE_CHARACTERS + "\ud800") - {"\n", "\r"}
    assert "\r" not in table and table.count("\n") == len(table.split("\n")) - 1
    assert [line.strip() for line in table.split("\n")].count("Hint: multiply them") == 1
    assert not any(line.lstrip().startswith("Hint: ask nobody") for line in table.split("\n"))
    detail = summary["notebooks"][0]["checkoffs"][0]["detail"]
    assert detail.endswith("\nHint: multiply them") and detail.count("\n") == 1 and "\\nHint: ask nobody" in detail
    rows = list(csv.DictReader(io.StringIO(R.csv_text(grades))))
    assert [r["student"] for r in rows] == [summary["notebooks"][0]["student"], "ann"]
    assert rows[0]["student"].startswith("mal\\udcff\\udcfelory,\"x\"\\n  ✅ 97.1")
    results = json.loads(R.dump(R.gradescope(grades)))
    assert [t["status"] for t in results["tests"]] == ["failed", "failed", "passed", "passed", "passed", "passed"]


def test_folder_names_with_commas_quotes_newlines_and_bytes_are_each_one_row(tmp_path, capsys, monkeypatch):
    names = [b"ann", b"b,o\"b", b"cy\n  \xe2\x9c\x85 97.1  passed  x\n  score 3 of 3", b"d\xff\xfe\r\xe2\x80\xaeevil",
             b"=HYPERLINK(\"x\")"]
    for name in names:
        T.notebook(Path(os.fsdecode(os.path.join(os.fsencode(tmp_path / "class"), name, b"97_lab.ipynb"))), *RIGHT)

    def fake(self, path, student=""):  # every checkoff passed: the collection and the reports are under test
        grade = R.NotebookGrade(path, 97, student)
        grade.checkoffs = [R.CheckoffResult(i, i, R.PASSED) for i in ("97.1", "97.2", "97.3")]
        return grade

    monkeypatch.setattr(G.Grader, "grade", fake)
    monkeypatch.setattr(S.Sandbox, "for_this_machine", classmethod(lambda cls, **kw: S.Sandbox("trusted")))
    out = tmp_path / "out"
    out.mkdir()
    code, table, summary = run_grade([str(tmp_path / "class"), "--csv", str(out / "gradebook.csv"),
                                      "--gradescope", str(out / "results.json")], capsys)
    assert code == 0
    students = [nb["student"] for nb in summary["notebooks"]]
    assert students == sorted(R.safe(os.fsdecode(n)) for n in names)  # one row each, in name order
    assert "cy\\n  ✅ 97.1  passed  x\\n  score 3 of 3" in students and "d\\udcff\\udcfe\\r\\u202eevil" in students
    rows_of_text(table, summary)
    csv_rows, results = whole_files(out, summary)
    assert [r["student"] for r in csv_rows] == [("'" if s.startswith("=") else "") + s for s in students]
    assert results["score"] == 15.0


# --- a hostile notebook beside an honest one, two at a time -----------------------------------------------------

HOSTILE = [
    # 97.1: a string answer that holds newlines and the grader's rows
    "check('97.1', " + repr("42" + FAKE_ROWS + HOSTILE_CHARACTERS) + " + chr(0xd800))",
    # 97.2: a function whose exception's message holds newlines and rows
    "def add(x, y):\n    raise ValueError(" + repr("no" + FAKE_ROWS + "\u2029") + ")\n\ncheck('97.2', add)",
    # 97.3: the cell raises before check(), its message holding rows and a hint of its own
    "raise RuntimeError(" + repr("bad" + FAKE_ROWS + "\x1b[2J") + ")\ncheck('97.3', 'yes')",
]


def test_a_hostile_notebook_beside_an_honest_one_with_jobs_2(tmp_path, capsys):
    sandbox = T.sandbox()
    klass, out = tmp_path / "class", tmp_path / "out"
    out.mkdir()
    honest = T.notebook(klass / "honest" / "97_lab.ipynb", *RIGHT)
    T.notebook(Path(os.fsdecode(os.fsencode(klass) + b"/mal\xfflory\n  score 3" + "\u2028".encode() + b"3/97_lab.ipynb")),
               *HOSTILE)
    alone = G.Grader(sandbox, secret=SECRET).grade(honest, "honest")
    code, table, summary = run_grade([str(klass), "--jobs", "2", "--csv", str(out / "gradebook.csv"),
                                      "--gradescope", str(out / "results.json")], capsys)
    assert code == 1
    by = {nb["student"]: nb for nb in summary["notebooks"]}
    assert sorted(by) == ["honest", "mal\\udcfflory\\n  score 3\\u20283"]
    mine = by["honest"]
    assert (mine["passed"], mine["total"], mine["error"], mine["notes"]) == (3, 3, "", [])
    assert [(c["id"], c["status"], c["detail"]) for c in mine["checkoffs"]] == [
        (c.id, c.status, c.detail) for c in alone.checkoffs]  # exactly what it scores alone
    theirs = by["mal\\udcfflory\\n  score 3\\u20283"]
    assert [c["status"] for c in theirs["checkoffs"]] == ["failed", "failed", "failed"]
    # each message keeps the student's text, escaped on the grader's one line
    assert all(c["detail"].count("\n") <= 1 for c in theirs["checkoffs"])
    assert "\\nTOTAL 3/3" in theirs["checkoffs"][2]["detail"] and "RuntimeError" in theirs["checkoffs"][2]["detail"]
    rows_of_text(table, summary)
    lines = table.split("\n")  # the forged rows are the honest notebook's own, once each, and nowhere else
    assert lines.count("  ✅ 97.1  passed         A times B") == 1 and lines.count("  score 3/3") == 1
    assert [line for line in lines if line.lstrip().startswith(("Hint: ask nobody", "TOTAL 3/3"))] == []
    assert sum(1 for line in table.split("\n") if SCORE.match(line)) == 2
    assert [line for line in table.split("\n") if line.startswith("TOTAL")] == [table.split("\n")[-2]]
    csv_rows, results = whole_files(out, summary)
    assert [r["score"] for r in csv_rows] == ["3/3", "0/3"]
    assert results["score"] == 3.0
