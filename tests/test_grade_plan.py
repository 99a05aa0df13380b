"""A total grading plan (issue 34 item 1): every plan builds, and a grader fault is the grader's.

`Grader.plan` draws, per (student, secret), the hidden givens and every function checkoff's hidden cases
and works out every expected value, before any student code runs.  It must build for every pair: a
generator that raises fails an honest notebook.  Where the grader's own code still fails, the checkoff is
marked REGRADE (never scored: neither a pass nor a 0), the other checkoffs are graded, and `grade` exits 3
naming the lab and the checkoff.  Lab 97 (tests/grading.py) is the made-up lab the grading tests run.
"""
from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

import grading as T
from labsupport.course import data
from labsupport.course import grade as G
from labsupport.course import report as R
from labsupport.course.checkoffs import _hidden, load_lab
from labsupport.course.registry import GIVENS, REGISTRY, lecture_givens

T.register()
LABS = range(9)


def _plans(lab: int, count: int, secrets: int = 4):
    """`count` plans of `lab`, over `secrets` secrets (students differ within one)."""
    graders = [G.Grader(None, secret=f"plan test {n}".encode()) for n in range(secrets)]
    for i in range(count):
        yield graders[i % secrets].plan(lab, f"student{i}")


def _assert_well_formed(lab: int, plan: G.Plan) -> None:
    assert plan.faults == {}, f"lab {lab:02d}: {plan.faults}"
    if lab in GIVENS:
        lecture, hidden = GIVENS[lab].lecture, plan.runs[1:]
        assert plan.runs[0] == lecture and len(hidden) == G.HIDDEN_RUNS
        for g in hidden:
            assert set(g) == set(lecture) and all(g[k] != lecture[k] for k in lecture), g
        assert hidden[0] != hidden[1]
    # plain JSON: no object of the grader's, no NaN; each engine run the cases share written once, as grade sends it
    # (dumped case by case, lab 07's shared runs took longer to write than the plans took to build)
    json.dumps(data.share({cid: [list(x) if type(x) is tuple else x for x in specs]
                           for cid, specs in plan.specs.items()}), allow_nan=False)
    for c in load_lab(lab):
        specs = plan.specs[c.id]
        if c.kind == "function":
            assert specs, f"{c.id} has no case"
            assert all(isinstance(i, dict) and isinstance(s, dict) and {"want", "what"} <= set(s) for i, s in specs)
        else:
            assert len(specs) == (len(plan.runs) if c.takes_givens else 1) and all("want" in s for s in specs)


@pytest.mark.parametrize("lab", LABS)
def test_twenty_plans_per_lab_all_build(lab, request):
    """The contributor's loop: 20 whole plans a lab, a secret each (lab 07's, with their engine runs, about 0.5 s
    each); the slow tier builds 200 a lab (lab 07: 60), these 20 first, and draws 5,000 sets of hidden givens."""
    if f"test_two_hundred_plans_per_lab_all_build[{lab}]" in {item.name for item in request.session.items}:
        pytest.skip("this run builds the slow tier's plans of this lab, which begin with these 20")
    for plan in _plans(lab, 20, secrets=20):
        _assert_well_formed(lab, plan)


@pytest.mark.parametrize("lab", LABS)
def test_every_judge_judges_its_own_expected_answer(lab):
    """grade tells a broken judge (REGRADE) from an answer no judge foresaw (it fails) by judging the expected
    answer itself: so every judge of the labs must reach a verdict on it, or a student's odd answer would be
    sent to regrade instead of failing."""
    plan = next(_plans(lab, 1))
    assert {c.id: G._judge_broken(c, plan.specs[c.id]) for c in load_lab(lab)} == dict.fromkeys(plan.specs)


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_two_hundred_plans_per_lab_all_build(lab):
    """Whole plans, expected values and all, 200 a lab over 20 secrets; lab 07's 60 (each plan runs the real engine
    three times, about 0.6 s).  The givens alone are drawn 5,000 times a lab below; the 100,000-plans-a-lab sweep is a
    one-off: `python -m labsupport bench plans --count 100000 --jobs J`."""
    for plan in _plans(lab, 60 if lab == 7 else 200, secrets=20):
        _assert_well_formed(lab, plan)


def _with_givens() -> list[int]:
    for lab in LABS:
        load_lab(lab)  # declares the lab's givens, if it has any
    return [lab for lab in LABS if lab in GIVENS]


@pytest.mark.slow
@pytest.mark.parametrize("lab", _with_givens())
def test_five_thousand_hidden_givens_per_lab_are_well_formed(lab):
    """The givens generator alone, drawn 5,000 times a lab (each a grade's two hidden sets): every set binds every
    given, differs from the card's in each, and the two of a grade differ from each other."""
    declared, lecture = GIVENS[lab], GIVENS[lab].lecture
    for i in range(2_500):
        sets = declared.draw(random.Random(f"givens draw {lab} {i}"), G.HIDDEN_RUNS)
        assert sets[0] != sets[1]
        for g in sets:
            assert set(g) == set(lecture) and all(g[k] != lecture[k] for k in lecture), g
            json.dumps(g, allow_nan=False)


@pytest.mark.parametrize("lab", LABS)
def test_a_draw_that_never_differs_falls_back_on_sets_every_checkoff_plans(lab, monkeypatch):
    load_lab(lab)
    if lab not in GIVENS:
        pytest.skip(f"lab {lab:02d} has no givens")
    monkeypatch.setitem(GIVENS, lab, replace(GIVENS[lab], hidden=lambda rng: None))
    plan = G.Grader(None, secret=b"fallback").plan(lab, "student")
    assert plan.runs[1:] == list(GIVENS[lab].fallbacks[:G.HIDDEN_RUNS])
    _assert_well_formed(lab, plan)


def _catalogue_cards() -> dict:
    """Every card a course.toml may name: each catalogue GPU with each catalogue model, less the pairs card.parse
    refuses (the weights and the reserve leave no KV budget)."""
    from labsupport import card as course_card
    from labsupport.specs import GPUS, MODELS

    cards = {}
    for gpu in dict.fromkeys(GPUS.values()):  # GPUS and MODELS name some specs twice ("h100", "mha")
        for model in dict.fromkeys(MODELS.values()):
            try:
                cards[gpu.name, model.name] = course_card.parse(f'[card]\ngpu = "{gpu.name}"\nmodel = "{model.name}"\n',
                                                                "a catalogue card")
            except course_card.CardError:
                continue
    return cards


@pytest.mark.parametrize("lab", [lab for lab in _with_givens() if GIVENS[lab].fallbacks])
def test_every_fallback_differs_in_every_given_from_every_catalogue_cards_givens(lab, monkeypatch):
    """A fallback set serves whatever card course.toml names: it must differ in every given from that card's givens
    (registry.Givens skips one that shares a given, and a grade then runs out of sets; GQA_KV_HEADS = 4 was Qwen2.5-7B's
    on lab 06).  Each card's givens are the build's: the lab source's givens cell with its `# card=` lines set from the
    card (registry.card_givens)."""
    from labsupport import card as course_card

    cards = _catalogue_cards()
    assert {("h100-sxm-80gb", "lecture-7b"), ("h200", "llama-3-8b"), ("a100-80gb", "qwen2.5-7b")} <= set(cards)
    assert ("t4", "lecture-7b") not in cards  # 16 GB: 13.48 GB of weights and the 4 GB reserve leave no budget
    seen = set()
    for (gpu, model), c in cards.items():
        monkeypatch.setattr(course_card, "card", lambda c=c: c)
        givens = lecture_givens(lab)
        seen.add(json.dumps(givens, sort_keys=True))
        for fallback in GIVENS[lab].fallbacks:
            shared = sorted(k for k in fallback if fallback[k] == givens[k])
            assert not shared, f"lab {lab:02d}'s fallback {fallback} shares {shared} with {gpu} + {model}'s givens"
    source = next((Path(__file__).resolve().parents[1] / "solutions").glob(f"{lab:02d}_*.py"))
    assert (len(seen) > 1) == ("# card=" in source.read_text(encoding="utf-8"))  # the cards' givens were really each card's


def test_213_cases_build_where_an_ask_outgrows_the_whole_address_space():
    """This pair raised 'Sample larger than population' before; each want is first fit, worked out here."""
    plan = G.Grader(None, secret=bytes(32)).plan(2, "student9")
    assert "2.13" not in plan.faults
    for given, spec in plan.specs["2.13"]:
        holes, ask = given["args"]
        assert spec["want"] == next((offset for offset, size in holes if size >= ask), None), spec["what"]


@pytest.mark.parametrize("fits", [True, False])
def test_random_pair_gives_what_is_asked_even_when_no_draw_does(fits, monkeypatch):
    memory = 10**9 if fits else 10**15  # every drawn card too small, or too large, for what is asked
    monkeypatch.setattr(_hidden, "random_gpu", lambda rng: _hidden.GPUSpec("c", memory, 1e12, 1e14, 1e10))
    model, gpu = _hidden.random_pair(random.Random(1), fits=fits, max_params=1e12)
    room = gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4e9
    assert (room > 0) == fits and math.isfinite(room)


# --- a grader fault is the grader's: REGRADE, never a 0 ------------------------------------------------------

def _boom(*args):
    raise RuntimeError("generator exploded")


@pytest.fixture
def broken_cases(monkeypatch):
    """97.2's case generator raises (the grader's code, not the student's)."""
    monkeypatch.setitem(REGISTRY, "97.2", replace(REGISTRY["97.2"], make_cases=_boom))


def _right_notebook(tmp_path):
    return T.notebook(tmp_path / "ann" / "97_lab.ipynb", *T.RIGHT.values())


def test_a_generator_that_raises_is_planned_as_that_checkoffs_fault_alone(broken_cases):
    plan = G.Grader(None, secret=b"s").plan(T.LAB, "ann")
    assert list(plan.faults) == ["97.2"] and "RuntimeError: generator exploded" in plan.faults["97.2"]
    assert set(plan.specs) == {"97.1", "97.3"}


def test_a_generator_with_no_case_is_a_fault_not_a_pass(monkeypatch):
    monkeypatch.setitem(REGISTRY, "97.2", replace(REGISTRY["97.2"], make_cases=lambda rng: iter(())))
    plan = G.Grader(None, secret=b"s").plan(T.LAB, "ann")
    assert plan.faults == {"97.2": "grader fault in lab 97 checkoff 97.2: ValueError: its generator yielded no case"}


def test_a_generator_that_raises_marks_its_checkoff_regrade_and_the_others_are_graded(tmp_path, broken_cases):
    grade = G.Grader(T.sandbox(), timeout=60).grade(_right_notebook(tmp_path), "ann")
    assert T.statuses(grade) == {"97.1": R.PASSED, "97.2": R.REGRADE, "97.3": R.PASSED}, grade
    assert grade.failed == 0 and not grade.error
    assert grade.regrade == ["REGRADE — grader fault in lab 97 checkoff 97.2: RuntimeError: generator exploded"]
    text = R.format_grade(grade)
    assert "REGRADE — grader fault in lab 97 checkoff 97.2" in text and "score REGRADE" in text
    row = next(csv.DictReader(io.StringIO(R.csv_text([grade]))))
    assert (row["97.2"], row["97.1"]) == ("regrade", "passed") and row["score"].startswith("REGRADE")
    assert "checkoff 97.2" in row["regrade"]
    totals = R.summary([grade])
    assert (totals["passed"], totals["failed"], totals["regrade"], totals["not_attempted"]) == (2, 0, 1, 0)
    assert totals["notebooks"][0]["checkoffs"][1]["status"] == "regrade"
    results = R.gradescope([grade])
    tests = {t["number"]: t for t in results["tests"]}
    assert "score" not in tests["97.2"] and "status" not in tests["97.2"]  # posted neither as a pass nor as a 0
    assert tests["97.2"]["output"].startswith("REGRADE — grader fault in lab 97 checkoff 97.2")
    assert results["score"] == 2.0 and results["output"].startswith("97_lab.ipynb: REGRADE")


def test_an_unattempted_checkoff_whose_generator_raises_is_simply_not_attempted(tmp_path, broken_cases):
    path = T.notebook(tmp_path / "ann" / "97_lab.ipynb", T.RIGHT["97.1"], T.RIGHT["97.3"])
    grade = G.Grader(T.sandbox(), timeout=60).grade(path, "ann")
    assert T.statuses(grade) == {"97.1": R.PASSED, "97.2": R.NOT_ATTEMPTED, "97.3": R.PASSED} and not grade.regrade


def test_grade_exits_3_naming_the_lab_and_checkoff_on_stderr(tmp_path, broken_cases, capsys):
    T.sandbox()  # skips where bubblewrap cannot run
    out = tmp_path / "out"
    out.mkdir()
    code = G.main([str(_right_notebook(tmp_path)), "--no-progress", "--gradescope", str(out / "results.json")])
    err = capsys.readouterr().err
    assert code == G.EXIT_REGRADE == 3
    assert "REGRADE — grader fault in lab 97 checkoff 97.2: RuntimeError: generator exploded" in err
    results = json.loads((out / "results.json").read_text())
    assert [("score" in t) for t in results["tests"]] == [True, False, True]


def test_an_expected_value_that_raises_on_hidden_givens_is_a_regrade(tmp_path, monkeypatch):
    one = REGISTRY["97.1"]
    monkeypatch.setitem(REGISTRY, "97.1", replace(one, expected=lambda g: g.A * g.B if g.A == 6 else 1 / 0))
    grade = G.Grader(T.sandbox(), timeout=60).grade(_right_notebook(tmp_path), "ann")
    assert T.statuses(grade) == {"97.1": R.REGRADE, "97.2": R.PASSED, "97.3": R.PASSED}
    assert "lab 97 checkoff 97.1: ZeroDivisionError" in grade.regrade[0]


class _NoSandbox:
    """A sandbox that must not be reached: with no hidden givens nothing runs."""

    def run(self, *args):
        raise AssertionError("the notebook ran without a plan")


def test_hidden_givens_that_cannot_be_drawn_mark_every_checkoff_and_run_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(GIVENS, T.LAB, replace(GIVENS[T.LAB], hidden=lambda rng: dict(GIVENS[T.LAB].lecture)))
    grade = G.Grader(_NoSandbox()).grade(_right_notebook(tmp_path), "ann")
    assert T.statuses(grade) == dict.fromkeys(("97.1", "97.2", "97.3"), R.REGRADE)
    assert all("grader fault in lab 97 (its hidden givens)" in line for line in grade.regrade)
    assert "score" not in R.gradescope([grade])  # nothing judged: no score at all, never a 0


def test_a_judge_that_fails_on_its_own_answer_is_a_regrade_and_an_unforeseen_answer_still_fails(tmp_path, monkeypatch):
    one = REGISTRY["97.1"]
    monkeypatch.setitem(REGISTRY, "97.1", replace(one, spec={**one.spec, "judge": "no such judge"}))
    box = T.sandbox()
    grade = G.Grader(box, timeout=60).grade(_right_notebook(tmp_path), "ann")
    assert T.statuses(grade)["97.1"] == R.REGRADE and "KeyError" in grade.regrade[0]
    monkeypatch.setitem(REGISTRY, "97.1", one)  # a sound judge: an answer it cannot read is the answer's
    path = T.notebook(tmp_path / "bob" / "97_lab.ipynb", "check('97.1', 10**400)", T.RIGHT["97.2"], T.RIGHT["97.3"])
    grade = G.Grader(box, timeout=60).grade(path, "bob")
    assert T.statuses(grade)["97.1"] == R.FAILED and not grade.regrade
