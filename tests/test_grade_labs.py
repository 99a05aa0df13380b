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
from labsupport.course.grade import Snapshot
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


def test_a_solution_notebook_earns_every_checkoff_through_its_kernel(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "labsupport", "grade", str(ROOT / "solutions" / "02_naive_allocator.ipynb"),
                           "--json", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    report = json.loads(proc.stdout)
    (row,) = report["notebooks"]
    assert proc.returncode == 0, row
    assert row["error"] == "" and row["passed"] == row["total"] == len(load_lab(2))


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
