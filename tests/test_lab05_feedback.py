"""Checkoff 5.3 (reference counts after a divergence), posed on lab 05's givens: two different correct
derivations pass on the lecture's givens and on hidden ones; each plausible wrong picture of the pool is
rejected with a remark that names it.  Expected numbers here are worked by hand from the mechanism."""
from __future__ import annotations

import random

import pytest

from labsupport.course import checkoff as C
from labsupport.course.checkoff import check
from labsupport.course.registry import GIVENS, Mismatch, case_rng, namespace

LECTURE = dict(N_BRANCHES=8, BLOCK=16, PROMPT_TOKENS=100, WRITERS=5)


@pytest.fixture(autouse=True)
def _fresh_results():
    C.reset_results()
    yield
    C.reset_results()


def closed_form(g):
    """Full blocks stay shared by all; each writer that finds the tail shared takes a private copy."""
    full, tail = divmod(g["PROMPT_TOKENS"], g["BLOCK"])
    n, w = g["N_BRANCHES"], g["WRITERS"]
    if not tail:
        return {"refcounts": [n] * full + [1] * w, "copies": 0}
    return {"refcounts": [n] * full + [n - w] * (n > w) + [1] * w, "copies": n - 1}


def by_hand_simulation(g):
    """A second derivation: walk the writes one by one on a dict of block -> holders."""
    n, b, p, w = g["N_BRANCHES"], g["BLOCK"], g["PROMPT_TOKENS"], g["WRITERS"]
    blocks = -(-p // b)
    holders = {i: set(range(n)) for i in range(blocks)}
    tables = {br: list(range(blocks)) for br in range(n)}
    nxt, copies, snapshot = blocks, 0, None
    for k, br in enumerate(range(n)):
        if k == w:
            snapshot = sorted(len(h) for h in holders.values() if h)
        last = tables[br][-1]
        if p % b == 0:  # the token starts a new block
            holders[nxt] = {br}
            tables[br].append(nxt)
            nxt += 1
        elif len(holders[last]) > 1:  # shared: copy it
            holders[last].discard(br)
            holders[nxt] = {br}
            tables[br][-1] = nxt
            nxt += 1
            copies += 1
    if snapshot is None:
        snapshot = sorted(len(h) for h in holders.values() if h)
    return {"refcounts": snapshot, "copies": copies}


def test_the_lecture_case_by_hand():
    # 100 tokens at b = 16: 6 full blocks (8 holders each) and a 4-token tail; 5 writers copy it away
    # (5 private blocks), 3 holders stay on the original; once all 8 write, 7 copies (the last writes in place).
    assert sorted(closed_form(LECTURE)["refcounts"]) == [1, 1, 1, 1, 1, 3, 8, 8, 8, 8, 8, 8]
    assert closed_form(LECTURE)["copies"] == 7


@pytest.mark.parametrize("derive", [closed_form, by_hand_simulation])
def test_two_correct_derivations_pass_on_the_lecture_and_hidden_givens(derive, capsys):
    check("5.3", derive(LECTURE))
    assert capsys.readouterr().out == "✅ Checkoff 5.3 passed\n"
    c = C.get("5.3")
    for g in GIVENS[5].draw(case_rng("givens", b"lab05 test", "x"), 4) + [
            dict(N_BRANCHES=4, BLOCK=8, PROMPT_TOKENS=32, WRITERS=2)]:  # a full last block: nothing copied
        c.verdict(derive(g), c.expect(namespace(g)))
        assert derive(g) == by_hand_simulation(g) or sorted(derive(g)["refcounts"]) == by_hand_simulation(g)["refcounts"]


def test_a_typed_lecture_answer_fails_on_hidden_givens():
    c = C.get("5.3")
    for g in GIVENS[5].draw(random.Random(7), 2):
        with pytest.raises(Mismatch):
            c.verdict(closed_form(LECTURE), c.expect(namespace(g)))


@pytest.mark.parametrize("answer, names", [
    ({"refcounts": [8] * 7 + [1] * 5, "copies": 7}, "each copy moves one reference off the original"),
    ({"refcounts": [8] * 6 + [1] * 5, "copies": 7}, "original tail block is missing"),
    ({"refcounts": [3] * 7 + [1] * 35, "copies": 7}, "copied the full blocks too"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 8}, "writes in place"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 5}, "once every branch has written"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 56}, "full blocks are never written again"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 0}, "needs a private copy"),
])
def test_each_plausible_wrong_picture_is_named(answer, names, fails):
    with fails(names):
        check("5.3", answer)
