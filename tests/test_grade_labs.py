"""grade on the real labs: every reference solution earns every checkoff, every student copy none, none failed.

The reference answers come from the solution notebooks (the lab sources), the student copies from
notebooks/; expected values come from the graders.  Function answers are rebuilt from the
notebooks' source and tried in the worker on hidden inputs (a fixed secret here), which is what
catches a checkoff whose cases cannot cross a process, or whose forbidden names trip the lab's
own solution.  Two runs use kernels (lab 02's solution, and all student copies two at a time);
the rest goes straight to the worker, which is what a function verdict needs.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import labsupport
from labsupport.course import answers as A
from labsupport.course.checkoff import case_rng, load_lab
from labsupport.course.grade import Snapshot, _given_lines
from labsupport.course.registry import GIVENS, Mismatch, namespace
from labsupport.course.worker import WorkerClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("0[0-9]_*.ipynb"))
STUDENTS = sorted((ROOT / "notebooks").glob("0[0-9]_*.ipynb"))
PACKAGE = Path(labsupport.__file__).resolve().parent


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_reference_function_passes_on_hidden_inputs_in_the_worker(path, tmp_path):
    nb = A.read(path)
    checkoffs = [c for c in load_lab(nb.lab()) if c.kind == "function"]
    worker = WorkerClient(tmp_path / "worker", Snapshot(PACKAGE).write(tmp_path / "site"))
    try:
        for checkoff in checkoffs:
            prog = A.program(nb, nb.calls[checkoff.id][-1])
            prepared = checkoff.prepare(case_rng(checkoff.id, b"test secret", path.name))
            fn = worker.load(checkoff.id, prog.source(), checkoff.forbidden, prog.function_source(), 600)
            checkoff.verdict(fn, prepared)  # raises Mismatch, with the reason, if anything is off
    finally:
        worker.close()


def _value_checkoffs(lab: int):
    return [c for c in load_lab(lab) if c.kind == "value"]


@pytest.mark.parametrize("lab", range(9))
def test_every_value_checkoff_varies_with_the_givens_or_says_why_not(lab):
    for c in _value_checkoffs(lab):
        assert c.expect is not None or c.fixed, f"{c.id}: neither a function of the givens nor fixed= with a reason"
        if c.expect is not None:  # each hidden set changes the answer, so a typed number cannot pass on it
            lecture = c.prepare(case_rng(c.id))
            for g in GIVENS[lab].draw(case_rng("givens", b"test secret", f"lab{lab}")):
                with pytest.raises(Mismatch):
                    c.verdict(lecture, c.expect(namespace(g)))


def reference_values(path: Path, tmp_path: Path) -> dict[str, object]:
    """Each value answer of a solution, re-derived in the worker on the lecture's and two hidden sets of givens;
    every one checked against the grader's expected value for those givens.  Returns the lecture's values."""
    nb = A.read(path)
    lab = nb.lab()
    checkoffs = [c for c in _value_checkoffs(lab) if c.expect is not None]
    sets = [GIVENS[lab].lecture, *GIVENS[lab].draw(case_rng("givens", b"test secret", path.name))] if checkoffs else []
    worker = WorkerClient(tmp_path / "worker", Snapshot(PACKAGE).write(tmp_path / "site"))
    found = {}
    try:
        for checkoff in checkoffs:
            prog = A.program(nb, nb.calls[checkoff.id][-1], GIVENS[lab].names)
            for g in sets:
                got = worker.value(checkoff.id, _given_lines(g) + prog.source(), checkoff.forbidden, 600)
                checkoff.verdict(got, checkoff.expect(namespace(g)))  # raises Mismatch, with the reason
                found.setdefault(checkoff.id, got)
    finally:
        worker.close()
    return found


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_reference_value_rederives_on_hidden_givens_in_the_worker(path, tmp_path):
    reference_values(path, tmp_path)


def test_a_lab_solved_with_typed_constants_earns_no_value_checkoff_that_has_givens(tmp_path):
    """Each lab's value answers typed in as the solution's own numbers, under its givens cell: grade fails them all."""
    import nbformat

    folder = tmp_path / "typist"
    folder.mkdir()
    typed = {}
    for path in SOLUTIONS:
        values = reference_values(path, tmp_path / path.stem)
        if not values:
            continue
        source = nbformat.read(path, as_version=4)
        givens_cell = next(c for c in source.cells if "givens" in c.metadata.get("tags", []))
        nb = nbformat.v4.new_notebook()
        nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell("from labsupport.course.checkoff import check"),
                    nbformat.v4.new_code_cell(givens_cell.source, metadata={"tags": ["givens"]})]
        nb.cells += [nbformat.v4.new_code_cell(f"check({cid!r}, {v!r})") for cid, v in values.items()]
        nbformat.write(nb, folder / path.name)
        typed[path.name] = set(values)
    assert typed, "no lab has value checkoffs with givens"
    proc = subprocess.run([sys.executable, "-m", "labsupport", "grade", str(folder), "--jobs", "2", "--json",
                           "--no-progress", "--seed", "5"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    report = json.loads(proc.stdout)
    for row in report["notebooks"]:
        ids = typed[Path(row["path"]).name]
        results = {c["id"]: c for c in row["checkoffs"] if c["id"] in ids}
        assert set(results) == ids
        for cid, c in results.items():
            assert c["status"] == "failed", (cid, c)
            assert "re-run on other values" in c["detail"], (cid, c["detail"])


def test_every_solution_notebook_earns_every_checkoff_through_its_kernel(tmp_path):
    """grade, end to end: each lab's solution run in its kernel, every answer re-run in the worker (a function's
    globals from the givens cell included), on the lecture's and on hidden givens."""
    proc = subprocess.run([sys.executable, "-m", "labsupport", "grade", *map(str, SOLUTIONS), "--jobs", "2",
                           "--json", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    report = json.loads(proc.stdout)
    assert len(report["notebooks"]) == len(SOLUTIONS)
    for row in report["notebooks"]:
        bad = [(c["id"], c["status"], c.get("detail", "")) for c in row["checkoffs"] if c["status"] != "passed"]
        assert row["error"] == "" and not bad, (row["path"], row["error"], bad)
        assert row["passed"] == row["total"] == len(load_lab(row["lab"])) > 0, row["path"]
    assert proc.returncode == 0


def test_the_student_copies_are_all_not_attempted(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "labsupport", "grade", *map(str, STUDENTS), "--jobs", "2", "--json",
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    report = json.loads(proc.stdout)
    assert len(report["notebooks"]) == len(STUDENTS)
    for row in report["notebooks"]:
        assert row["error"] == "", (row["path"], row["error"])
        assert row["total"] == len(load_lab(row["lab"])) > 0
        bad = [(c["id"], c["status"], c["detail"]) for c in row["checkoffs"] if c["status"] != "not attempted"]
        assert not bad, (row["path"], bad)
    assert proc.returncode == 0


def test_the_readme_lists_exactly_the_checkoffs_with_nothing_to_vary():
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("Only these")
    sentence = text[start:text.index("function checkoffs are tried", start)]
    listed = set(re.findall(r"\b\d\.\d{1,2}\b", sentence))
    fixed = {c.id for lab in range(9) for c in load_lab(lab)
             if c.kind == "choice" or (c.kind == "value" and c.expect is None)}
    assert listed == fixed, f"README lists {sorted(listed)}; the registry's are {sorted(fixed)}"
