"""Value answers graded by re-running their code on hidden givens (labsupport.course.grade, answers.program).

One notebook of a made-up lab 97 (its givens and checkoffs registered here) holds the same correct
answer written nine ways — plain, a loop, a `with`, a `try`, a helper, a comprehension, a `match`,
a helper filling a dict, an `if` — and five ways to hand in a number without computing it.  It is
graded once; each test reads one checkoff's row.  The expected value is this lab's own arithmetic:
whole slots of S_MAX tokens at KV_BYTES each in BUDGET bytes.
"""
from __future__ import annotations

import random

import nbformat
import pytest

from labsupport.course import grade as G
from labsupport.course.registry import GIVENS, REGISTRY, givens, value

pytestmark = pytest.mark.slow

LAB = 97
LECTURE = dict(KV_BYTES=524_288, S_MAX=4096, BUDGET=62_520_000_000)  # 62.52e9 // 2**31 = 29 slots


def _hidden(rng: random.Random) -> dict:
    return dict(KV_BYTES=131_072 * rng.randint(1, 3), S_MAX=rng.choice((1024, 2048, 8192)),
                BUDGET=rng.randint(20, 70) * 10**9)


GIVENS_CELL = "KV_BYTES = 524_288\nS_MAX = 4096\nBUDGET = 62_520_000_000"
HONEST = {
    "97.1": "slots = BUDGET // (S_MAX * KV_BYTES)\ncheck('97.1', slots)",
    "97.2": "for s_max in [S_MAX]:\n    n2 = BUDGET // (s_max * KV_BYTES)\n    check('97.2', n2)",
    "97.3": "import contextlib\nwith contextlib.nullcontext(S_MAX) as s:\n    check('97.3', BUDGET // (s * KV_BYTES))",
    "97.4": "try:\n    n4 = BUDGET // (S_MAX * KV_BYTES)\nexcept ZeroDivisionError:\n    n4 = 0\n"
            "try:\n    check('97.4', n4)\nfinally:\n    pass",
    "97.5": "def slots_of(budget, s, kv):\n    return budget // (s * kv)\n\ncheck('97.5', slots_of(BUDGET, S_MAX, KV_BYTES))",
    "97.6": "n6 = [BUDGET // (s * KV_BYTES) for s in (S_MAX,)][0]\ncheck('97.6', n6)",
    "97.7": "match S_MAX:\n    case int(s7):\n        n7 = BUDGET // (s7 * KV_BYTES)\ncheck('97.7', n7)",
    "97.8": "table = {}\ndef fill(t):\n    t['n'] = BUDGET // (S_MAX * KV_BYTES)\n\nfill(table)\ncheck('97.8', table['n'])",
    "97.9": "if S_MAX > 0:\n    check('97.9', BUDGET // (S_MAX * KV_BYTES))",
}
ATTACKS = {  # each hands in the right number on the lecture's givens
    "97.10": ("check('97.10', 29)", "typed"),  # typed in
    "97.11": ("get_ipython().user_ns['n11'] = 29\ncheck('97.11', n11)", "no cell before check() defines"),
    "97.12": ("exec('n12 = 29')\ncheck('97.12', n12)", "no cell before check() defines"),
    "97.13": ("def lookup():\n    return {4096: 29}[S_MAX]\n\ncheck('97.13', lookup())", "raised KeyError"),
    "97.14": ("S_MAX = 4096\nn14 = BUDGET // (S_MAX * KV_BYTES)\ncheck('97.14', n14)", "not what those givens make it"),  # a given retyped, last
}


def _lab_notebook(path, sources: list[str]):
    """A notebook of the made-up lab: check() imported, the givens cell, then one cell per source."""
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("from labsupport.course.checkoff import check"),
                nbformat.v4.new_code_cell(GIVENS_CELL, metadata={"tags": ["givens"]})]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in sources]
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    givens(lecture=LECTURE, hidden=_hidden, lab=LAB)
    for cid in [*HONEST, *ATTACKS]:
        value(cid, f"whole slots ({cid})", expected=lambda g: g.BUDGET // (g.S_MAX * g.KV_BYTES),
              hint="Count the whole slots of S_MAX tokens that fit in the budget.")
    path = _lab_notebook(tmp_path_factory.mktemp("lab97") / "97_slots.ipynb",
                         [*HONEST.values(), *(src for src, _ in ATTACKS.values())])
    grader = G.Grader(timeout=120, secret=bytes(32))
    try:
        result = grader.grade(path, "alice")
    finally:
        grader.close()
        for cid in [*HONEST, *ATTACKS]:
            REGISTRY.pop(cid, None)
        GIVENS.pop(LAB, None)
    return {c.id: c for c in result.checkoffs}


@pytest.mark.parametrize("cid", list(HONEST))
def test_a_computed_answer_passes_however_it_is_written(graded, cid):
    assert graded[cid].status == "passed", graded[cid].detail


@pytest.mark.parametrize("cid", list(ATTACKS))
def test_a_number_not_computed_from_the_givens_fails(graded, cid):
    assert graded[cid].status == "failed"
    assert ATTACKS[cid][1] in graded[cid].detail, graded[cid].detail


def test_hidden_givens_differ_in_every_given_and_per_student():
    from labsupport.course.registry import Givens, case_rng

    g = Givens(LAB, LECTURE, _hidden)
    alice, bob = (g.draw(case_rng("givens", bytes(32), who)) for who in ("alice/97_x.ipynb", "bob/97_x.ipynb"))
    assert alice != bob
    for sets in (alice, bob):
        assert len(sets) == 2 and all(s[k] != LECTURE[k] for s in sets for k in LECTURE)


HOG = ("import time\nn{i} = BUDGET // (S_MAX * KV_BYTES)\nwhile S_MAX != 4096:  # right on the lecture's givens, "
       "never ends on others\n    time.sleep(0.5)\n    n{i} += 0\ncheck('96.{i}', n{i})")


def test_a_notebooks_answers_share_one_time_budget_however_many_hang(tmp_path):
    """Each re-run that hangs used to get the whole --timeout again (12 checkoffs, 12 x 300 s); now all share one."""
    givens(lecture=LECTURE, hidden=_hidden, lab=96)
    ids = [f"96.{i}" for i in range(1, 4)]
    for cid in ids:
        value(cid, f"whole slots ({cid})", expected=lambda g: g.BUDGET // (g.S_MAX * g.KV_BYTES),
              hint="Count the whole slots of S_MAX tokens that fit in the budget.")
    path = _lab_notebook(tmp_path / "96_hog.ipynb", [HOG.format(i=i) for i in range(1, 4)])
    grader = G.Grader(timeout=15, secret=bytes(32))
    try:
        result = grader.grade(path, "alice")
    finally:
        grader.close()
        for cid in ids:
            REGISTRY.pop(cid, None)
        GIVENS.pop(96, None)
    by = {c.id: c for c in result.checkoffs}
    assert by["96.1"].status == "failed" and "did not finish within" in by["96.1"].detail, by["96.1"].detail
    for cid in ids[1:]:  # nothing left for them: they fail at once, saying why
        assert by[cid].status == "failed" and "ran out before this one" in by[cid].detail, by[cid].detail
