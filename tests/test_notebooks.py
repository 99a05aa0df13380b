"""Every lab's notebooks: strict nbval on the solutions, and the student copies' only errors are their exercises.

* ``pytest --nbval`` (strict: every stored output must reproduce) runs on each solution notebook in
  a subprocess, with the committed sanitize file for the few values that are random by construction
  (tests/nbval_sanitize.cfg: plotly trace uids, widget model ids, object addresses).
* Each student notebook runs top to bottom in a fresh kernel, continuing past errors: every error
  must be the ``NotImplementedError`` of one of its own exercises (or come from a cell tagged
  ``raises-exception``), and every checkoff of the lab must have at least one exercise and a
  checkoff cell whose stored output is its pass line (what ``pytest --nbval-lax`` compares).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labsupport.course import build as B
from labsupport.course.checkoff import PASS_LINE, load_lab

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
WORD = "TO" + "DO"
PROMPT_RE = re.compile(rf'raise NotImplementedError\("{WORD} (\d+\.\d+): ')
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
STUDENTS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

pytestmark = pytest.mark.slow


def test_there_are_notebooks():
    assert SOLUTIONS and STUDENTS
    assert [p.name for p in SOLUTIONS] == [p.name for p in STUDENTS]


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_passes_strict_nbval(path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-sanitize-with", str(SANITIZE), "-p", "no:cacheprovider",
         "-q", "--nbval-cell-timeout=600", str(path.relative_to(ROOT))],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert re.search(r"\d+ passed", proc.stdout), proc.stdout[-2000:]


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_student_notebook_fails_only_with_its_exercises(path):
    nb = nbformat.read(path, as_version=4)
    lab = int(path.name[:2])
    prompts = {m for cell in nb.cells if cell.cell_type == "code" for m in PROMPT_RE.findall(cell.source)}
    checkoffs = [c.id for c in load_lab(lab)]
    assert checkoffs or lab >= 90, f"lab {lab:02d} registers no checkoffs (only the instructors' 90-99 may not)"
    missing = [c for c in checkoffs if c not in prompts]
    assert not missing, f"checkoffs without an exercise in {path.name}: {missing}"

    for checkoff_id in checkoffs:
        cells = [c for c in nb.cells if c.cell_type == "code" and checkoff_id in B.CHECK_RE.findall(c.source)]
        assert len(cells) == 1, f"{path.name}: checkoff {checkoff_id} has {len(cells)} checkoff cells"
        assert "nbval-check-output" in cells[0].metadata.get("tags", [])
        assert PASS_LINE.format(id=checkoff_id) + "\n" in cells[0].outputs[0].text

    executed = B.execute(nb, path.parent, progress=False, allow_errors=True)
    errors = []
    for index, cell in enumerate(executed.cells, start=1):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.outputs:
            if out.output_type != "error":
                continue
            match = re.match(rf"{WORD} (\d+\.\d+): ", out.evalue)
            if out.ename != "NotImplementedError" or not match or match[1] not in prompts:
                errors.append(f"cell {index}: {out.ename}: {out.evalue[:300]}")
    assert not errors, f"{path.name} fails with errors other than its exercises:\n" + "\n".join(errors)


def test_nbval_lax_on_a_student_copy(tmp_path):
    """`pytest --nbval-lax notebooks/00_setup.ipynb` fails while exercises are open and passes once solved."""
    student = nbformat.read(ROOT / "notebooks" / "00_setup.ipynb", as_version=4)
    solution = {c.id: c for c in nbformat.read(ROOT / "solutions" / "00_setup.ipynb", as_version=4).cells}
    open_path = tmp_path / "open" / "00_setup.ipynb"
    solved_path = tmp_path / "solved" / "00_setup.ipynb"
    open_path.parent.mkdir()
    solved_path.parent.mkdir()
    nbformat.write(student, open_path)
    for cell in student.cells:  # the student's answers: the instructor's code, cell by cell
        cell.source = solution[cell.id].source
    nbformat.write(student, solved_path)

    def nbval_lax(path):
        return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-q", str(path)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=900)

    solved = nbval_lax(solved_path)
    assert solved.returncode == 0, solved.stdout[-4000:]
    opened = nbval_lax(open_path)
    assert opened.returncode == 1, opened.stdout[-4000:]
    assert "2 failed" in opened.stdout  # the two exercise cells of lab 00
    assert "NotImplementedError" in opened.stdout and f"{WORD} 0.1: set kv_512_kib" in opened.stdout
