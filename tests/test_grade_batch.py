"""grade's batch, without kernels: user ids lent machine-wide, answers read one by one, files put in place, one
notebook per student and lab.

Each test attacks one of these and derives what must come back by hand: which uid a second process gets,
which checkoff a garbled line belongs to, which of a student's notebooks is the newest.  The kernels'
side of the same guarantees is in test_grade.py; two grade processes at once are in test_grade_concurrent.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from labsupport.course import autograder as AG
from labsupport.course import grade as G
from labsupport.course import sandbox as S
from labsupport.course.checkoff import PASSED, load_lab

ROOT = Path(__file__).resolve().parents[1]
ROOT_HERE = sys.platform == "linux" and os.geteuid() == 0
TEST_UIDS = range(62000, 62003)  # not the pool grade lends, so a grade running elsewhere here is not touched


# --- user ids: one holder at a time, machine-wide ------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from labsupport.course.sandbox import Sandbox
slot = Sandbox(locks=Path(sys.argv[1]), uids=range(62000, 62003)).try_acquire()
print(slot.uid, flush=True)
time.sleep(600)
"""


def test_a_held_uid_is_never_handed_to_a_second_process_and_a_dead_holder_lets_go(tmp_path):
    locks = tmp_path / "locks"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(locks)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "62000"  # the first free one
        sandbox = S.Sandbox(locks=locks, uids=TEST_UIDS)
        mine = [sandbox.try_acquire(), sandbox.try_acquire()]
        assert [s.uid for s in mine] == [62001, 62002]  # 62000 is the other process's
        assert sandbox.try_acquire() is None  # all three are held now
        mine[0].release()
        assert sandbox.try_acquire().uid == 62001  # a released one is lent again...
        holder.kill()
        holder.wait(30)
        assert sandbox.try_acquire().uid == 62000  # ...and so is a crashed holder's
    finally:
        holder.kill()


def test_a_lock_folder_someone_else_could_enter_is_refused(tmp_path):
    open_to_all = tmp_path / "open"
    open_to_all.mkdir(mode=0o777)
    os.chmod(open_to_all, 0o777)
    with pytest.raises(S.SandboxError, match="no one"):
        S.Sandbox(locks=open_to_all, uids=TEST_UIDS).try_acquire()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "planted").symlink_to(elsewhere)
    with pytest.raises(S.SandboxError, match="cannot open"):  # never followed, even to a folder that would pass
        S.Sandbox(locks=tmp_path / "planted", uids=TEST_UIDS).try_acquire()
    assert not list(elsewhere.iterdir())


def _alive(uid: int) -> int:
    """Live (not zombie) processes of `uid`, read from /proc here, not by the code under test."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields and int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            count += 1
    return count


@pytest.mark.skipif(not ROOT_HERE, reason="lending user ids needs root on Linux")
def test_kill_all_reaches_its_own_uid_only_even_a_fork_bomb(tmp_path):
    sandbox = S.Sandbox("uid", locks=tmp_path / "locks", uids=TEST_UIDS)
    sandbox.prepare_machine()  # as grade does in this mode: the interpreter's folders passable by these users
    bomb, bystander = sandbox.acquire(), sandbox.acquire()
    forks = ("import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
             "        time.sleep(0.01)\n")
    procs = [subprocess.Popen(bomb.command([sys.executable, "-c", forks]), cwd="/"),
             subprocess.Popen(bystander.command([sys.executable, "-c", "import time; time.sleep(600)"]), cwd="/")]
    try:
        deadline = time.monotonic() + 60
        while (_alive(bomb.uid) < 50 or _alive(bystander.uid) < 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(bomb.uid) >= 50 and _alive(bystander.uid) == 1
        bomb.release()
        time.sleep(0.3)
        assert _alive(bomb.uid) == 0
        assert _alive(bystander.uid) == 1  # another slot's process is not touched
        with pytest.raises(RuntimeError, match="no longer held"):
            bomb.kill_all()
    finally:
        bystander.release()
        for p in procs:
            p.kill()
    assert _alive(bystander.uid) == 0


# --- answers: a hostile record fails its own checkoff only --------------------------------------------------

def _line(checkoff_id: str, value_json: str, callable_: bool = False) -> bytes:
    return (f'{{"id":"{checkoff_id}","index":0,"callable":{str(callable_).lower()},"value":{value_json}}}\n').encode()


def test_each_record_is_read_on_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "MAX_RECORD_BYTES", 8000)
    path = tmp_path / "answers.jsonl"
    path.write_bytes(b"".join([
        _line("2.1", "524288"),
        _line("2.2", "1" * 5000),  # more digits than Python turns into an int
        _line("2.3", "[" * 3000 + "]" * 3000),  # deeper than the parser goes
        _line("2.4", '"' + "x" * 10_000 + '"'),  # over the (patched) limit for one record
        _line("2.5", "[1, 2"),  # cut short
        b"not json at all\n",
        b'{"id": "2.6", "value": 3}\n',  # no index or callable: not the collector's shape, nobody's
        _line("2.7", '{"__tuple__": [1, 2]}'),
    ]))
    records = G._read_records(path)
    assert records["2.1"]["value"] == 524288 and records["2.7"]["value"] == {"__tuple__": [1, 2]}
    assert set(records) == {"2.1", "2.2", "2.3", "2.4", "2.5", "2.7"}
    for bad in ("2.2", "2.3", "2.4", "2.5"):
        assert records[bad]["unreadable"] and "value" not in records[bad], bad
    assert "digits" in records["2.2"]["unreadable"] and "deep" in records["2.3"]["unreadable"]
    assert "8,000-byte" in records["2.4"]["unreadable"]


def test_long_text_in_a_report_is_cut_and_says_so():
    result = G.CheckoffResult("2.1", "t", "failed", "y" * 1_000_000)
    assert len(result.detail) < G.MAX_TEXT_CHARS + 100
    assert result.detail.startswith("y" * G.MAX_TEXT_CHARS) and "[cut: 996,000 more characters]" in result.detail
    assert G.cut("short") == "short"


# --- output files: put in place through a private folder ---------------------------------------------------

def _notebook(path: Path, *sources: str, mtime: float | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


class FakeGrader:
    """Stands in for the kernel side: every checkoff of the notebook's lab, passed when the file says "good"."""

    graded: list[str] = []
    plant: Path | None = None

    def __init__(self, *args, **kwargs):
        FakeGrader.graded = []

    def grade(self, path: Path, student: str = "") -> G.NotebookGrade:
        from labsupport.course import answers as A

        FakeGrader.graded.append(Path(path).name)
        if FakeGrader.plant is not None and len(FakeGrader.graded) == 2:
            if FakeGrader.plant.is_file():  # written after the first notebook, as every batch does
                FakeGrader.plant.unlink()
            FakeGrader.plant.mkdir()  # the gradebook's own name becomes a folder mid-batch
        lab = A.read(path).lab()
        good = "good" in Path(path).read_text()
        grade = G.NotebookGrade(str(path), lab, student)
        grade.checkoffs = [G.CheckoffResult(c.id, c.title, PASSED if good else "failed") for c in load_lab(lab)]
        return grade

    def close(self):
        pass


@pytest.fixture
def fake_grader(monkeypatch):
    monkeypatch.setattr(G, "Grader", FakeGrader)
    monkeypatch.setattr(S.Sandbox, "for_this_machine", classmethod(lambda cls: None))
    FakeGrader.plant = None
    yield FakeGrader
    FakeGrader.plant = None


def test_planted_temporary_names_and_a_planted_destination_lose_no_row(tmp_path, fake_grader, capsys):
    for student in ("ann", "bob", "cy"):
        _notebook(tmp_path / "class" / student / "00_setup.ipynb", "# good")
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in ("gradebook.csv", "results.json"):  # yesterday's temporary names: a folder and a symlink
        (out / f".{name}.{os.getpid()}.tmp").mkdir()
        (out / f".{name}.tmp").symlink_to(victim)
    fake_grader.plant = out / "gradebook.csv"
    code = G.main([str(tmp_path / "class"), "--json", "--no-progress", "--csv", str(out / "gradebook.csv"),
                   "--gradescope", str(out / "results.json")])
    captured = capsys.readouterr()
    assert code == 2
    assert [line for line in captured.err.strip().splitlines() if not line.startswith("grade: isolation: ")] == [
        f"grade: --csv {out / 'gradebook.csv'}: could not write it (Is a directory)"]
    assert [n["student"] for n in json.loads(captured.out)["notebooks"]] == ["ann", "bob", "cy"]
    results = json.loads((out / "results.json").read_text())
    assert len(results["tests"]) == 3 * len(load_lab(0)) and results["score"] == 3 * len(load_lab(0))
    assert victim.read_text() == "keep me"
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(["gradebook.csv", "results.json", f".gradebook.csv.{os.getpid()}.tmp", ".gradebook.csv.tmp",
                           f".results.json.{os.getpid()}.tmp", ".results.json.tmp"])  # no private folder left behind


# --- one student, one answer --------------------------------------------------------------------------------

def test_the_newest_notebook_counts_never_the_best(tmp_path, fake_grader):
    now = time.time()
    ann = tmp_path / "ann"
    _notebook(ann / "00_setup.ipynb", "# good", mtime=now - 300)  # the best, but older
    _notebook(ann / "00_setup-Copy1.ipynb", "# wrong", mtime=now - 100)  # the newest
    _notebook(ann / "00_setup_draft.ipynb", "# good", mtime=now - 200)
    bob = tmp_path / "bob"
    _notebook(bob / "00_a.ipynb", "# good", mtime=now)  # equally new: the last in name order counts
    _notebook(bob / "00_b.ipynb", "# wrong", mtime=now)
    _notebook(bob / "mine.ipynb", 'check("1.1", 3)\n# good', mtime=now)  # lab 01, from its check() ids
    subs, _ = G.collect([str(ann), str(bob)])
    grades = G.grade_all(G.Grader(), subs, progress=False)
    assert sorted(fake_grader.graded) == ["00_b.ipynb", "00_setup-Copy1.ipynb", "mine.ipynb"]
    by = {Path(g.path).name: g for g in grades}
    assert not by["00_setup-Copy1.ipynb"].not_graded and by["00_setup-Copy1.ipynb"].passed == 0
    assert "00_setup-Copy1.ipynb is ann's newer notebook of lab 00" in by["00_setup.ipynb"].not_graded
    assert by["mine.ipynb"].lab == 1
    header, table = G.rows(grades)
    assert [(r["student"], r["lab"], Path(r["notebook"]).name, r["passed"]) for r in table] == [
        ("ann", "00", "00_setup-Copy1.ipynb", 0), ("bob", "00", "00_b.ipynb", 0), ("bob", "01", "mine.ipynb", len(load_lab(1)))]
    assert "00_setup.ipynb (not graded)" in table[0]["error"] and "00_setup_draft.ipynb (not graded)" in table[0]["error"]
    text = G.format_grade(by["00_a.ipynb"])
    assert "not graded" in text and "00_b.ipynb" in text


def test_gradescope_without_a_lab_counts_each_checkoff_once(tmp_path, fake_grader):
    root = tmp_path / "autograder"
    now = time.time()
    _notebook(root / "submission" / "00_setup.ipynb", "# good", mtime=now - 60)
    _notebook(root / "submission" / "00_setup (1).ipynb", "# good", mtime=now - 30)
    _notebook(root / "submission" / "answers.ipynb", 'check("0.1", 1)\n# wrong', mtime=now)  # lab 00, newest
    ids = [c.id for c in load_lab(0)]
    for lab in (None, 0):
        data = AG.run(root, lab=lab)
        assert sorted(t["number"] for t in data["tests"]) == sorted(ids), lab  # once each: not 3 x 2
        assert data["score"] == 0.0  # the newest, answers.ipynb, is graded, not the best
        assert data["output"].count("not graded") == 2
        assert json.loads((root / "results" / "results.json").read_text())["tests"] == data["tests"]


# --- whose notebook: a path given is one student; links are never graded ---------------------------------

def test_a_folder_inside_a_students_folder_is_still_that_student(tmp_path, fake_grader):
    now = time.time()
    bob = _notebook(tmp_path / "bob" / "00_setup.ipynb", "# good", mtime=now - 100)
    planted = _notebook(tmp_path / "alice" / "bob" / "00_setup.ipynb", "# wrong", mtime=now)  # newer, named bob
    _notebook(tmp_path / "alice" / "drafts" / "00_setup.ipynb", "# wrong", mtime=now - 50)
    subs, problems = G.collect([str(tmp_path / "alice"), str(tmp_path / "bob")])
    assert problems == []
    assert {(s.path, s.student) for s in subs if s.path in (bob, planted)} == {(bob, "bob"), (planted, "alice")}
    grades = {Path(g.path): g for g in G.grade_all(G.Grader(), subs, progress=False)}
    assert not grades[bob].not_graded and grades[bob].passed == len(load_lab(0))  # bob's own row, untouched
    assert "alice's newer notebook" in grades[tmp_path / "alice" / "drafts" / "00_setup.ipynb"].not_graded
    assert sum(1 for g in grades.values() if g.student == "alice" and not g.not_graded) == 1  # alice: one answer


def test_a_lone_class_folder_is_one_student_per_folder(tmp_path, fake_grader):
    for who in ("ann", "bob"):
        _notebook(tmp_path / "class" / who / "work" / "00_setup.ipynb", "# good")
    subs, problems = G.collect([str(tmp_path / "class")])
    assert problems == [] and sorted(s.student for s in subs) == ["ann", "bob"]
    _notebook(tmp_path / "class" / "00_setup.ipynb", "# good")  # a notebook of its own: one student's folder
    subs, _ = G.collect([str(tmp_path / "class")])
    assert {s.student for s in subs} == {"class"}


def test_two_paths_that_would_be_two_students_of_one_name_are_refused(tmp_path, fake_grader, capsys):
    for term in ("2025", "2026"):
        _notebook(tmp_path / term / "alice" / "00_setup.ipynb", "# good")
    paths = [str(tmp_path / "2025" / "alice"), str(tmp_path / "2026" / "alice")]
    _, problems = G.collect(paths)
    assert len(problems) == 1 and "would both be student 'alice'" in problems[0]
    fake_grader.graded = []
    assert G.main([*paths, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would both be student 'alice'" in err[0]
    assert fake_grader.graded == []  # refused before anything ran
    # the same student named twice (a notebook and its folder) is one student, not a clash
    assert G.collect([paths[0], paths[0] + "/00_setup.ipynb"])[1] == []


def test_a_linked_notebook_or_folder_is_listed_and_never_graded(tmp_path, fake_grader):
    bob = _notebook(tmp_path / "bob" / "00_setup.ipynb", "# good")
    alice = tmp_path / "alice"
    alice.mkdir()
    (alice / "00_setup.ipynb").symlink_to(bob)  # bob's work, handed in as alice's
    (alice / "more").symlink_to(tmp_path / "bob", target_is_directory=True)
    subs, problems = G.collect([str(alice), str(tmp_path / "bob")])
    assert problems == []
    grades = G.grade_all(G.Grader(), subs, progress=False)
    theirs = [g for g in grades if g.student == "alice"]
    assert len(theirs) == 1 and "symbolic link" in theirs[0].not_graded and theirs[0].lab == 0
    assert fake_grader.graded == ["00_setup.ipynb"] and all(g.student == "bob" for g in grades if not g.not_graded)
    # Gradescope: a link in the submission points at a file of the grading machine
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "submission" / "00_setup.ipynb").symlink_to(bob)
    fake_grader.graded = []
    data = AG.run(root, lab=0)
    assert data["score"] == 0.0 and "symbolic link" in data["output"] and fake_grader.graded == []
