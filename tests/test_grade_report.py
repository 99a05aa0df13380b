"""grade's side of things, without a sandbox: reading a notebook and what came back, and writing reports.

The notebook and the events are hostile data: each test feeds one kind of garbage and derives by hand
what must come out (which checkoff a malformed answer belongs to, which notebook counts for a student,
what a report shows for text no file format can hold).
"""
from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

import grading as T
from labsupport.course import autograder as AG
from labsupport.course import grade as G
from labsupport.course import report as R
from labsupport.course import sandbox as S

T.register()


# --- a notebook read as data --------------------------------------------------------------------------------

def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe not utf-8", "not UTF-8"),
    ("[1, 2]", "no list of cells"),
    ("{\"cells\": 3}", "no list of cells"),
    ("{not json", "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),
    (json.dumps({"cells": [{"cell_type": "code", "source": ""}] * (G.MAX_CELLS + 1)}), "over the limit"),
])
def test_a_file_that_is_not_a_notebook_is_one_line_naming_why(tmp_path, content, words):
    with pytest.raises(G.NotebookError, match=words) as err:
        G.read_notebook(_write(tmp_path / "97_x.ipynb", content))
    assert "\n" not in str(err.value)


def test_a_notebooks_code_cells_are_read_with_their_numbers_ids_and_tags(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title"), nbformat.v4.new_code_cell("A = 6", metadata={"tags": ["givens"]}),
                nbformat.v4.new_code_cell("check('97.1', A * 7)")]
    path = tmp_path / "97_lab.ipynb"
    nbformat.write(nb, path)
    read = G.read_notebook(path)
    assert [(c.number, c.source, c.tags) for c in read.cells] == [(2, "A = 6", ("givens",)), (3, "check('97.1', A * 7)", ())]
    assert read.cells[0].id == nb.cells[1].id and read.lab() == 97 and read.calling("97.1") == [read.cells[1]]


# --- what a sandbox sent back -----------------------------------------------------------------------------------

def test_events_are_sorted_into_runs_and_garbage_touches_nothing():
    events = [
        {"e": "cell", "run": None, "cell": 1}, {"e": "error", "run": None, "cell": 1, "ename": "E", "evalue": "shared"},
        {"e": "answer", "run": 0, "cell": 3, "id": "97.1", "value": 42},
        {"e": "answer", "run": 0, "cell": 4, "id": "97.1", "value": 43},  # the last answer of a run counts
        {"e": "answer", "run": 1, "cell": 3, "id": "97.1", "value": 99}, {"e": "end", "run": 0},
        {"e": "stop", "run": 2, "why": "timeout\u202e"}, {"e": "answer", "run": 7, "id": "97.1", "value": 1},  # no run 7
        None, "ok", {"e": "answer", "run": "0", "id": "97.1"}, {"e": "answer", "run": True, "id": "97.1"}, [1, 2],
    ]
    runs = G.runs_of(events, 3)
    assert runs[0].answers["97.1"]["value"] == 43 and runs[1].answers["97.1"]["value"] == 99
    assert "97.1" not in runs[2].answers and runs[2].stop == "timeout\\u202e"
    assert runs[0].ended and not runs[1].ended
    assert all(run.errors == {1: ("E", "shared")} for run in runs)  # the cells before the fork are every run's


def test_why_an_answer_is_missing_names_the_cell_and_the_run():
    calls = [G.Cell(5, "check('97.1', x)")]
    raised = G.Run(errors={4: ("ValueError", "bad")}, reached=5, ended=True)
    assert G._without(raised, calls, None, 1) == (G.FAILED, "its check() call never ran (in a branch that was not taken?)")
    at_call = G.Run(errors={5: ("ZeroDivisionError", "division by zero")}, reached=5, ended=True)
    assert G._without(at_call, calls, None, 0) == (
        G.FAILED, "cell 5 raised ZeroDivisionError: division by zero, before handing the answer over")
    unfinished = G.Run(errors={5: ("NotImplementedError", "TO" "DO 97.2: add")}, reached=5, ended=True)
    assert G._without(unfinished, calls, None, 0) == (G.NOT_ATTEMPTED, "TO" "DO 97.2: add")
    stopped = G.Run(reached=3, stop="timeout")
    assert "did not reach its check() cell (timeout, at cell 3)" in G._without(stopped, calls, None, 2)[1]


# --- reports: student text is data --------------------------------------------------------------------------

def test_text_no_file_can_hold_is_shown_safely_and_cut():
    assert R.safe("a\ud800b\u202ec\x1b[2Jd\x00") == "a\\ud800b\\u202ec\\x1b[2Jd\\x00"
    assert R.safe("line one\nline\ttwo é ✅") == "line one\\nline\\ttwo é ✅"  # one line; printable text stays
    assert R.safe_path(os.fsdecode(b"/class/Jos\xe9.ipynb")) == "/class/Jos\\udce9.ipynb"
    cut = R.safe("y" * 10_000)
    assert cut.startswith("y" * R.MAX_TEXT_CHARS) and cut.endswith("[cut: 8,000 more characters]")


def test_every_report_writes_whatever_a_row_holds(tmp_path):
    nasty = "\ud800\u202e=cmd|' /C calc'!A0\x1b"
    grade = R.NotebookGrade(os.fsdecode(b"/c/\xe9\xff/97_x.ipynb"), 97, nasty, error=nasty, notes=[nasty])
    grade.checkoffs = [R.CheckoffResult("97.1", "A times B", R.FAILED, nasty * 3)]
    text = R.format_grade(grade) + R.dump(R.summary([grade])) + R.csv_text([grade]) + R.dump(R.gradescope([grade]))
    text.encode("utf-8")  # nothing left that UTF-8 cannot write
    assert not any(0xD800 <= ord(ch) <= 0xDFFF or ch in "\u202e\x1b" for ch in text)
    row = next(csv.DictReader(io.StringIO(R.csv_text([grade]))))
    assert row["student"].startswith("\\ud800") and row["error"].startswith("\\ud800")
    formula = R.NotebookGrade("p", 97, "=HYPERLINK(\"x\")")
    assert next(csv.DictReader(io.StringIO(R.csv_text([formula]))))["student"].startswith("'=")  # never a formula


def test_a_planted_destination_or_temporary_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / ".results.json.tmp").symlink_to(victim)
    R.write_into_place(tmp_path / "results.json", "{}\n")
    assert victim.read_text() == "keep me" and (tmp_path / "results.json").read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.json.tmp", "results.json", "victim.txt"]


# --- a class at a time: one notebook per student and lab, whose notebook, links ------------------------------

class FakeGrader:
    """Stands in for the sandbox: every checkoff of lab 97 passed when the file says "good"."""

    graded: list[str] = []

    def __init__(self, *args, **kwargs):
        FakeGrader.graded = []

    def grade(self, path, student: str = "") -> R.NotebookGrade:
        FakeGrader.graded.append(Path(path).name)
        grade = R.NotebookGrade(path, G.read_notebook(Path(path)).lab(), student)
        good = "good" in Path(path).read_text()
        grade.checkoffs = [R.CheckoffResult(i, i, R.PASSED if good else R.FAILED) for i in ("97.1", "97.2", "97.3")]
        return grade


class FakeSandbox:
    mode = "container"

    def describe(self) -> str:
        return "fake"


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(G, "Grader", FakeGrader)
    monkeypatch.setattr(S.Sandbox, "for_this_machine", classmethod(lambda cls, **kw: FakeSandbox()))
    monkeypatch.setattr(G, "prepare_then_forget", lambda grader, subs: None)
    FakeGrader.graded = []
    return FakeGrader


def _nb(path: Path, marker: str, mtime: float | None = None) -> Path:
    T.notebook(path, f"# {marker}\ncheck('97.1', A * B)")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_the_newest_notebook_counts_never_the_best(tmp_path, fake):
    now = time.time()
    ann = tmp_path / "ann"
    _nb(ann / "97_lab.ipynb", "good", now - 300)  # the best, but older
    _nb(ann / "97_lab-Copy1.ipynb", "wrong", now - 100)  # the newest
    bob = tmp_path / "bob"
    _nb(bob / "97_a.ipynb", "good", now)  # equally new: the last in name order counts
    _nb(bob / "97_b.ipynb", "wrong", now)
    subs, _ = G.collect([str(ann), str(bob)])
    grades = G.grade_all(G.Grader(), subs, progress=False)
    assert sorted(fake.graded) == ["97_b.ipynb", "97_lab-Copy1.ipynb"]
    by = {Path(g.path).name: g for g in grades}
    assert "97_lab-Copy1.ipynb is ann's newer notebook of lab 97" in by["97_lab.ipynb"].not_graded
    header, table = R.rows(grades)
    assert [(r["student"], Path(r["notebook"]).name, r["passed"]) for r in table] == [
        ("ann", "97_lab-Copy1.ipynb", 0), ("bob", "97_b.ipynb", 0)]
    assert "97_lab.ipynb (not graded)" in table[0]["error"]


def test_a_folder_inside_a_students_folder_is_still_that_student(tmp_path, fake):
    now = time.time()
    bob = _nb(tmp_path / "bob" / "97_lab.ipynb", "good", now - 100)
    planted = _nb(tmp_path / "alice" / "bob" / "97_lab.ipynb", "wrong", now)  # newer, named bob
    subs, problems = G.collect([str(tmp_path / "alice"), str(tmp_path / "bob")])
    assert problems == []
    assert {(s.path, s.student) for s in subs} == {(bob, "bob"), (planted, "alice")}
    grades = {Path(g.path): g for g in G.grade_all(G.Grader(), subs, progress=False)}
    assert grades[bob].passed == 3 and grades[planted].student == "alice"


def test_a_lone_class_folder_is_one_student_per_folder_and_two_of_one_name_are_refused(tmp_path, fake, capsys):
    for who in ("ann", "bob"):
        _nb(tmp_path / "class" / who / "work" / "97_lab.ipynb", "good")
    assert sorted(s.student for s in G.collect([str(tmp_path / "class")])[0]) == ["ann", "bob"]
    for term in ("2025", "2026"):
        _nb(tmp_path / term / "alice" / "97_lab.ipynb", "good")
    paths = [str(tmp_path / "2025" / "alice"), str(tmp_path / "2026" / "alice")]
    assert G.main([*paths, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would both be student 'alice'" in err[0] and fake.graded == []


def test_a_linked_notebook_is_listed_and_never_graded_here_and_on_gradescope(tmp_path, fake):
    bob = _nb(tmp_path / "bob" / "97_lab.ipynb", "good")
    alice = tmp_path / "alice"
    alice.mkdir()
    (alice / "97_lab.ipynb").symlink_to(bob)
    grades = G.grade_all(G.Grader(), G.collect([str(alice), str(tmp_path / "bob")])[0], progress=False)
    theirs = [g for g in grades if g.student == "alice"]
    assert len(theirs) == 1 and "symbolic link" in theirs[0].not_graded and fake.graded == ["97_lab.ipynb"]
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "submission" / "97_lab.ipynb").symlink_to(bob)
    data = AG.run(root)
    assert data["score"] == 0.0 and "symbolic link" in data["output"]


def test_a_destination_that_turns_into_a_folder_mid_batch_loses_no_row(tmp_path, fake, monkeypatch, capsys):
    for student in ("ann", "bob", "cy"):
        _nb(tmp_path / "class" / student / "97_lab.ipynb", "good")
    out = tmp_path / "out"
    out.mkdir()
    grade = FakeGrader.grade

    def planting(self, path, student=""):
        if len(FakeGrader.graded) == 1:  # after the first notebook's files were written
            if (out / "gradebook.csv").is_file():
                (out / "gradebook.csv").unlink()
            (out / "gradebook.csv").mkdir(exist_ok=True)
        return grade(self, path, student)

    monkeypatch.setattr(FakeGrader, "grade", planting)
    code = G.main([str(tmp_path / "class"), "--json", "--no-progress", "--csv", str(out / "gradebook.csv"),
                   "--gradescope", str(out / "results.json")])
    captured = capsys.readouterr()
    assert code == 2
    assert [line for line in captured.err.strip().splitlines() if not line.startswith("grade: isolation")] == [
        f"grade: --csv {out / 'gradebook.csv'}: could not write it (Is a directory)"]
    assert [n["student"] for n in json.loads(captured.out)["notebooks"]] == ["ann", "bob", "cy"]
    results = json.loads((out / "results.json").read_text())
    assert len(results["tests"]) == 9 and results["score"] == 9


@pytest.mark.parametrize("argv, words", [
    (["--jobs", "0", "x"], "--jobs"), (["--timeout", "-3", "x"], "--timeout"), (["nowhere.ipynb"], "no such"),
    (["--memory", "a", "x"], "--memory")])
def test_bad_arguments_are_one_line_and_exit_2(argv, words, capsys):
    assert G.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_without_bubblewrap_grade_refuses_unless_trusted(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(S.Sandbox, "works", lambda self: False)
    path = _nb(tmp_path / "ann" / "97_lab.ipynb", "good")
    assert G.main([str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trusted" in err[0] and "bubblewrap" in err[0]
    assert S.Sandbox.for_this_machine(trusted=True).mode == "trusted"


def test_a_notebook_given_as_a_link_is_listed_and_named_after_its_own_folder(tmp_path, fake):
    alice = _nb(tmp_path / "alice" / "97_lab.ipynb", "good")
    (tmp_path / "mallory").mkdir()
    (tmp_path / "mallory" / "97_lab.ipynb").symlink_to(alice)  # alice's work, given to grade as mallory's file
    subs, problems = G.collect([str(tmp_path / "alice" / "97_lab.ipynb"), str(tmp_path / "mallory" / "97_lab.ipynb")])
    assert problems == [] and [s.student for s in subs] == ["alice", "mallory"]
    grades = {g.student: g for g in G.grade_all(G.Grader(), subs, progress=False)}
    assert "symbolic link" in grades["mallory"].not_graded and not grades["alice"].not_graded
    assert fake.graded == ["97_lab.ipynb"]  # alice's own, once


# --- reading what a sandbox sends: linear, and bounded whatever is sent ------------------------------------------

def _read_events(payload: bytes):
    import threading

    read_end, write_end = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write_end, payload) if len(payload) < 2**16 else
                                              [os.write(write_end, payload[i:i + 2**16]) for i in
                                               range(0, len(payload), 2**16)], os.close(write_end)))
    writer.start()
    outcome = S.Outcome()
    try:
        S.Sandbox("trusted")._collect(None, read_end, time.monotonic() + 120, outcome)
    finally:
        writer.join()
        os.close(read_end)
    return outcome


def test_many_short_lines_are_read_in_linear_time():
    start = time.monotonic()
    outcome = _read_events(b'{"e":"cell","run":0,"cell":1}\n' * 200_000)  # 6 MB of tiny events
    assert len(outcome.events) == 200_000 and time.monotonic() - start < 30  # quadratic reading takes minutes


def test_a_line_that_would_parse_into_millions_of_objects_is_dropped_unparsed():
    bomb = b'{"e":"answer","run":0,"id":"97.1","value":[' + b"{}," * 2_000_000 + b"{}]}\n"
    outcome = _read_events(bomb + b'{"e":"end","run":0}\n' + b"not an event\n")
    assert outcome.dropped == 2 and outcome.events == [{"e": "end", "run": 0}]


def test_every_sandbox_gets_its_own_cpu_share_where_cgroups_can_be_made():
    group = S.Cgroup.make(S.Bounds())
    if group is None:
        pytest.skip("no cgroup can be made here: the sandbox falls back to per-process limits (GRADING.md)")
    try:
        assert {"memory", "pids", "cpu"} <= group.covers()
    finally:
        group.remove()
