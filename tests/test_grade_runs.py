"""grade runs the whole notebook on the lecture's and on hidden givens, in a sandbox, and judges outside it.

On a made-up lab 97 (tests/grading.py): 97.1 = A x B, where the lecture's givens are A = 6, B = 7 and
two hidden sets differ in both.  An answer written any honest way passes, whatever Python it takes;
an answer that does not follow the givens fails, whatever route it takes to check(); a function is
tried on cases it never saw; and what the grader reports names the run and the cell.
"""
from __future__ import annotations

import pytest

import grading as T
from labsupport.course import grade as G

pytestmark = pytest.mark.slow  # 26 notebooks, each run three times in a sandbox

T.register()
CHECK_OTHERS = T.RIGHT["97.2"] + "\n" + T.RIGHT["97.3"]

# One answer to 97.1, written the ways students write code: each must pass on every run.  The whole notebook runs
# as written, so these vary what the runner meets (magics, the shell, files, the folder, a kernel's __name__, errors,
# scalars of numpy), not Python's syntax (the variants written for the static slicer that grading no longer has —
# while, with, try, if, match, a comprehension, a class, a global — are gone: Python runs them all alike).
HONEST = {
    "plain": ["prod = A * B\ncheck('97.1', prod)"],
    "cell magic %%time": ["%%time\nprod = A * B\ncheck('97.1', prod)"],
    "line magic %time": ["%time prod = A * B\ncheck('97.1', prod)"],
    "shell escape": ["!true\nprod = A * B\ncheck('97.1', prod)"],
    "helper module in the folder": ["from helper_mod import mul\ncheck('97.1', mul(A, B))"],
    "check in a loop over ids": ["for cid, v in (('97.1', A * B), ('97.3', 'yes')):\n    check(cid, v)"],
    "__main__ guard": ["if __name__ == '__main__':\n    check('97.1', A * B)"],
    "answer over two cells": ["half = A * B / 2", "check('97.1', int(2 * half))"],
    "numpy and torch scalars": ["import numpy as np\ncheck('97.1', np.int64(A) * B)"],
    "an error in an unrelated cell": ["1 / 0", "check('97.1', A * B)"],
    "a folder made in the answer's cell": ["import os\nos.mkdir('results')\ncheck('97.1', A * B)"],
    "a file written in one run, read in it": ["open('cache.json', 'x').write(str(A * B))",
                                              "check('97.1', int(open('cache.json').read()))"],
    "a line of its own in the givens cell": ["check('97.1', AB)"],
    "a cache in tmp, fresh in every run": ["import os\nif not os.path.exists('/tmp/kept'):\n"
                                            "    open('/tmp/kept', 'w').write(str(A * B))\n"
                                            "check('97.1', int(open('/tmp/kept').read()))"],
}
GIVENS_CELLS = {"a line of its own in the givens cell": "A = 6\nB = 7\nAB = A * B  # mine"}

# Answers that do not follow the givens, by whatever route: each must fail 97.1.
ATTACKS = {
    "typed": ("check('97.1', 42)", "it gave 42"),
    "typed through exec": ("exec(\"check('97.1', 42)\")", "it gave 42"),
    "read back from the notebook's own source": (
        "import json, glob\nsrc = ''.join(json.load(open(glob.glob('*.ipynb')[0]))['cells'][1]['source'])\n"
        "a = int(src.split('A = ')[1].split()[0])\ncheck('97.1', a * 7)", "hidden givens"),
    "handed to the collector directly": (
        "import labsupport.course.checkoff as c\nc.collect('97.1', 42)", "it gave 42"),
    "forged events on every pipe": (
        "import os, json\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    for run in range(3):\n"
        "        try:\n"
        "            os.write(fd, (json.dumps({'e': 'answer', 'run': run, 'id': '97.1', 'value': 42}) + '\\n').encode())\n"
        "        except OSError:\n"
        "            pass", "it gave 42"),
    "the runs killed after the lecture's": (
        "check('97.1', A * B)\nimport os, signal\nif A == 6:\n    os.kill(os.getppid(), signal.SIGKILL)",
        "did not reach|never ran|stopped"),
    "the givens cell rebound further down": ("A, B = 6, 7\ncheck('97.1', A * B)", "it gave 42"),
    "a number too large for the judge": ("check('97.1', 10**400)", "could not be checked|too|not a"),
}


def _folder(tmp_path, name: str):
    return tmp_path / name.replace(" ", "_").replace("%", "pc").replace("'", "")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every honest variant and every attack, in one batch of two at a time."""
    tmp = tmp_path_factory.mktemp("runs")
    paths = {}
    for name, cells in HONEST.items():
        folder = _folder(tmp, name)
        folder.mkdir()
        (folder / "helper_mod.py").write_text("def mul(a, b):\n    return a * b\n")
        paths[name] = T.notebook(folder / "97_lab.ipynb", *cells, CHECK_OTHERS,
                                 givens_cell=GIVENS_CELLS.get(name, T.GIVENS_CELL))
    for name, (cell, _) in ATTACKS.items():
        paths[name] = T.notebook(_folder(tmp, name) / "97_lab.ipynb", cell, CHECK_OTHERS)
    grader = G.Grader(T.sandbox(), timeout=60, secret=b"runs test")
    subs = [G.Submission(p, name) for name, p in paths.items()]
    return {g.student: g for g in G.grade_all(grader, subs, jobs=2, progress=False)}


@pytest.mark.parametrize("name", list(HONEST))
def test_an_honest_answer_passes_however_it_is_written(graded, name):
    g = graded[name]
    assert T.statuses(g) == {"97.1": "passed", "97.2": "passed", "97.3": "passed"}, G.format_grade(g)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_answer_that_does_not_follow_the_givens_fails(graded, name):
    g = graded[name]
    result = next(c for c in g.checkoffs if c.id == "97.1")
    assert result.status == "failed", G.format_grade(g)
    assert __import__("re").search(ATTACKS[name][1], result.detail), result.detail


def test_the_runs_are_on_hidden_givens_drawn_per_student():
    grader = G.Grader(T.sandbox(), secret=b"fixed")
    alice, bob = grader.plan(97, "alice"), grader.plan(97, "bob")
    assert alice.runs[0] == bob.runs[0] == {"A": 6, "B": 7}
    for plan in (alice, bob):
        assert len(plan.runs) == 1 + G.HIDDEN_RUNS
        assert all(run["A"] != 6 and run["B"] != 7 for run in plan.runs[1:])
        assert [s["want"] for s in plan.specs["97.1"]] == [r["A"] * r["B"] for r in plan.runs]
    assert alice.runs[1:] != bob.runs[1:]  # each student's own hidden sets
    assert G.Grader(T.sandbox(), secret=b"fixed").plan(97, "alice").runs == alice.runs  # --seed: repeatable


def test_a_function_is_tried_on_hidden_cases_and_the_message_names_the_call(tmp_path):
    folder = tmp_path / "fn"
    wrong_far = "def add(x, y):\n    return x + y if abs(x) < 10 else x - y\n\ncheck('97.2', add)"
    path = T.notebook(folder / "97_lab.ipynb", wrong_far)
    grader = G.Grader(T.sandbox(), timeout=60, secret=b"fn test")
    plan = grader.plan(97, "fn")
    hidden = [i for i, _ in plan.specs["97.2"]][3:]  # the random cases: not the lab's own
    assert any(abs(i["args"][0]) >= 10 for i in hidden)
    g = grader.grade(path, "fn")
    detail = next(c for c in g.checkoffs if c.id == "97.2").detail
    assert detail.startswith("add(") and "returned" in detail and "Hint: x plus y" in detail
    assert all("want" not in str(i) for i, _ in plan.specs["97.2"])  # only inputs go into the sandbox


def test_a_cell_that_raises_only_on_hidden_givens_is_named_and_fails_only_what_it_holds(tmp_path):
    cells = ["prod = A * B\nif A != 6:\n    raise ValueError('only on hidden givens')\ncheck('97.1', prod)",
             CHECK_OTHERS]
    g = G.Grader(T.sandbox(), timeout=60, secret=b"cell").grade(T.notebook(tmp_path / "97_lab.ipynb", *cells), "x")
    result = next(c for c in g.checkoffs if c.id == "97.1")
    assert result.status == "failed" and "hidden givens set 1" in result.detail
    assert "cell 3 raised ValueError: only on hidden givens" in result.detail
    assert T.statuses(g)["97.2"] == T.statuses(g)["97.3"] == "passed"


def test_derive_dont_call_is_the_same_scan_in_check_and_in_grade(tmp_path, capsys):
    from labsupport.course import checkoff, record, scan

    cells = ["from labsupport import ledger as L\nimport operator", "check('97.1', operator.mul(A, B))"]
    entry = {"id": "97.1", "kind": "value", "forbid": ["operator.mul"], "derive": "multiply A and B yourself",
             "hint": "h", "spec": {"want": 42}}
    assert scan.hits([cells[1]], cells, entry["forbid"]) == ["operator.mul"]
    with pytest.raises(checkoff.Mismatch, match="calls operator.mul.*multiply A and B yourself"):
        checkoff.verdict(entry, 42, [cells[1]], cells)
    saved = T.REGISTRY["97.1"]
    import dataclasses
    T.REGISTRY["97.1"] = dataclasses.replace(saved, forbid=("operator.mul",), derive="multiply A and B yourself")
    try:
        g = G.Grader(T.sandbox(), timeout=60, secret=b"s").grade(T.notebook(tmp_path / "97_lab.ipynb", *cells), "x")
    finally:
        T.REGISTRY["97.1"] = saved
    detail = next(c for c in g.checkoffs if c.id == "97.1").detail
    assert "calls operator.mul" in detail and "multiply A and B yourself" in detail
    assert record  # the same entry shape check() reads from a lab's record
