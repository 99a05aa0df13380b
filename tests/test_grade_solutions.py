"""Every lab, graded as students hand it in: the solution, the untouched student copy, the numbers typed in.

One batch (two notebooks at a time, a fixed seed) grades every lab's executed solution, which must pass every
checkoff on the card's and on hidden givens.  Lab 02 stands for the rest three more times: its student copy as
the build writes it must score 0 and fail nothing; its solution with each value checkoff's number typed into
check() must fail every value checkoff that has givens; and one exercise answered by a direct call of the library
function it forbids fails that checkoff in grade, as check() fails it.  The other labs' student copies and typed
numbers are not graded here (issue 37: 13 of 25 notebooks were redundant): every student copy's Run All shows
each checkoff "not attempted" (tests/test_notebooks.py, the same check() the grade reads), and the build proves
that each value checkoff's answer changes on hidden givens (`build.check_hidden_givens`), which is what makes a
typed number fail.
"""
from __future__ import annotations

import re
import shutil

import nbformat
import pytest

import grading as T
from labsupport.course import grade as G
from labsupport.course.checkoffs import load_lab
from labsupport.course.registry import GIVENS
from labsupport.course.report import FAILED, NOT_ATTEMPTED, PASSED

pytestmark = pytest.mark.slow
ROOT = G.Path(__file__).resolve().parents[1]
LABS = sorted(p.stem for p in (ROOT / "solutions").glob("0[0-9]_*.py"))
STANDS_FOR_THE_REST = ["02_naive_allocator"]
for _name in LABS:
    load_lab(int(_name[:2]))  # the graders, so that GIVENS knows which labs have givens


def _typed(src, dest):
    """The solution with every value checkoff that has givens answered by its lecture number, typed in."""
    nb = nbformat.read(src, as_version=4)
    lab = int(src.name[:2])
    numbers = {c.id: c.expect() for c in load_lab(lab) if c.takes_givens}
    for cell in nb.cells:
        if cell.cell_type == "code":
            for cid, want in numbers.items():
                cell.source = re.sub(rf"check\(\s*[\"']{re.escape(cid)}[\"'],\s*[^\n]+\)",
                                     f"check({cid!r}, {want!r})", cell.source)
    dest.parent.mkdir(parents=True)
    nbformat.write(nb, dest)
    return set(numbers)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labs")
    subs, typed = [], {}
    for name in LABS:
        for kind, folder in (("solution", "solutions"), ("student", "notebooks"))[:2 if name in STANDS_FOR_THE_REST else 1]:
            dest = tmp / f"{kind}-{name}" / f"{name}.ipynb"
            dest.parent.mkdir()
            shutil.copyfile(ROOT / folder / f"{name}.ipynb", dest)
            for data in (ROOT / folder).glob("*.py"):  # what a notebook of the folder may import beside it
                shutil.copyfile(data, dest.parent / data.name)
            subs.append(G.Submission(dest, f"{kind}-{name}"))
        if int(name[:2]) in GIVENS and name in STANDS_FOR_THE_REST:
            dest = tmp / f"typed-{name}" / f"{name}.ipynb"
            typed[name] = _typed(ROOT / "solutions" / f"{name}.ipynb", dest)
            subs.append(G.Submission(dest, f"typed-{name}"))
    called = tmp / "called-02" / "02_naive_allocator.ipynb"
    nb = nbformat.read(ROOT / "solutions" / "02_naive_allocator.ipynb", as_version=4)
    for cell in nb.cells:
        cell.source = cell.source.replace("return slots * min(seq_tokens, s_max) * kv_bytes / budget_bytes",
                                          "return ledger.naive_utilization(budget_bytes, s_max, seq_tokens, kv_bytes)")
    called.parent.mkdir()
    nbformat.write(nb, called)
    subs.append(G.Submission(called, "called-02"))
    grader = G.Grader(T.sandbox(), secret=b"every lab")
    grades = {g.student: g for g in G.grade_all(grader, subs, jobs=2, progress=False)}
    return grades, typed


@pytest.mark.parametrize("name", LABS)
def test_each_solution_passes_on_the_lectures_and_hidden_givens(graded, name):
    g = graded[0][f"solution-{name}"]
    assert g.total and g.passed == g.total and not g.error, G.format_grade(g)


@pytest.mark.parametrize("name", STANDS_FOR_THE_REST)
def test_each_untouched_student_copy_scores_zero_and_fails_nothing(graded, name):
    g = graded[0][f"student-{name}"]
    assert g.total and {c.status for c in g.checkoffs} == {NOT_ATTEMPTED}, G.format_grade(g)


@pytest.mark.parametrize("name", STANDS_FOR_THE_REST)
def test_the_solutions_numbers_typed_in_pass_no_value_checkoff_with_givens(graded, name):
    grades, typed = graded
    g = grades[f"typed-{name}"]
    by = {c.id: c for c in g.checkoffs}
    for cid in typed[name]:
        assert by[cid].status == FAILED and "hidden givens set" in by[cid].detail, (cid, by[cid].detail)
    assert all(c.status == PASSED for c in g.checkoffs if c.id not in typed[name]), G.format_grade(g)


def test_a_direct_call_of_a_forbidden_function_fails_in_grade(graded):
    g = graded[0]["called-02"]
    detail = next(c for c in g.checkoffs if c.id == "2.6").detail
    assert "calls labsupport.ledger.naive_utilization" in detail and "Derive it instead" in detail
