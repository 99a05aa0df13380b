"""A givens cell binds by behaviour, not by syntax; it is found by what it binds; numbers are numbers.

`grade` runs the student's givens cell as written and holds every given to the run's value from the
statement that binds it on, so any honest way of writing the cell (a tuple, annotations, a dict and
globals().update, a magic, a value derived from the givens in the same cell) follows the hidden givens.
A notebook whose ids and tags were lost on the way (nbformat 4.0, Colab, a Jupytext round trip) still has
its givens cell found, by what the cell binds.  On the made-up lab 97 of tests/grading.py (A = 6, B = 7;
97.1 = A x B), and once on lab 02's solution.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import jupytext
import nbformat
import pytest

import grading as T
from labsupport.course import grade as G

T.register()
ROOT = Path(__file__).resolve().parents[1]
OTHERS = T.RIGHT["97.2"] + "\n" + T.RIGHT["97.3"]
ANSWER = "check('97.1', A * B)"

# The givens cell written the ways students write it, and the cell that answers 97.1: each passes every run.
STYLES = {
    "tuple": ("A, B = 6, 7", ANSWER),
    "annotated": ("A: int = 6\nB: int = 7", ANSWER),
    "a dict and globals().update": ("givens = {'A': 6, 'B': 7}\nglobals().update(givens)", ANSWER),
    "a dict read after globals().update": ("G = {'A': 6, 'B': 7}\nglobals().update(G)",
                                           "check('97.1', G['A'] * G['B'])"),
    "a value derived in the cell": ("A = 6\nB = 7\nTOTAL = A * B", "check('97.1', TOTAL)"),
    "a line magic": ("%load_ext autoreload\n%time A = 6\nB = 7\nTOTAL = A * B", "check('97.1', TOTAL)"),
    "a %%time cell magic": ("%%time\nA, B = 6, 7\nTOTAL = A * B", "check('97.1', TOTAL)"),
    "comment lines": ("# the givens\nA = 6  # six\n# and\nB = 7", ANSWER),
    "exec and a loop": ("exec('A = 6')\nfor name, v in [('B', 7)]:\n    globals()[name] = v\n    TOTAL = A * B",
                        "check('97.1', TOTAL)"),
    # a cell that does not parse runs nothing (as under Run All); the givens bound before it stand
    "a syntax error in the givens cell": ("A, B = 6, 7\nthis line is not python", ANSWER),
}
# The answer to 97.1 as a number of another type: each passes every run.
NUMBERS = {
    "Fraction": ("from fractions import Fraction", "check('97.1', Fraction(A * B * 3, 3))"),
    "Decimal": ("from decimal import Decimal", "check('97.1', Decimal(A) * B)"),
    "numpy float32": ("import numpy as np", "check('97.1', np.float32(A) * B)"),
    "numpy 0-d array": ("import numpy as np", "check('97.1', np.array(A * B))"),
    "torch 0-d tensor": ("import torch", "check('97.1', torch.tensor(A) * B)"),
    "torch .item()": ("import torch", "check('97.1', (torch.tensor(float(A)) * B).item())"),
}
# Notebooks whose ids and tags a tool dropped or changed: found by what the givens cell binds.
SAVED_BY = ("nbformat 4.0", "Colab", "Jupytext")
# ... and, with no id or tag, givens cells whose binding no reading of the code sees: found by running the cells.
HELPER = ("givens_helper.py", "A = 6\nB = 7\n")
UNSEEN = {
    "from a helper module": "from givens_helper import *",
    "a function's global": "def setup():\n    global A, B\n    A, B = 6, 7\n\nsetup()",
    "globals() in a loop": "for name, v in zip('AB', (6, 7)):\n    globals()[name] = v",
}
# Answers that do not follow the givens: 97.1 fails on the hidden runs, with what the run gave.
FAILS = {
    "the lecture's answer typed in": (["A, B = 6, 7", "check('97.1', 42)"], "it gave 42"),
    "a later cell rebinding the givens": (["A = 6\nB = 7", "A, B = 6, 7\n" + ANSWER], "it gave 42"),
    "a later cell rebinding them, no tags": (["A = 6\nB = 7", "A = 6\nB = 7", ANSWER], "it gave 42"),
    "a later cell importing them again, no tags": (["from givens_helper import *",
                                                    "from givens_helper import *\n" + ANSWER], "it gave 42"),
}


def code_cell(source: str, **metadata) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": metadata, "outputs": [],
            "source": source.splitlines(keepends=True)}


def write_v40(path: Path, sources: list[str]) -> Path:
    """A notebook as nbformat 4.0 wrote it: no cell ids, no tags (the givens cell is known by nothing)."""
    nb = {"nbformat": 4, "nbformat_minor": 0, "metadata": {}, "cells": [code_cell(s) for s in sources]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return path


def write_colab(path: Path, sources: list[str]) -> Path:
    """As Colab saves one: its own cell ids, a colab dict in the metadata, the tags gone."""
    cells = [{**code_cell(s, colab={"base_uri": "https://localhost:8080/"}), "id": f"Xk{n}qZ"}
             for n, s in enumerate(sources)]
    nb = {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
          "metadata": {"colab": {"provenance": []}, "kernelspec": {"name": "python3", "display_name": "Python 3"}}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return path


def write_jupytext(path: Path, sources: list[str]) -> Path:
    """Through py:percent and back: the tags survive, the cell ids are new."""
    T.notebook(path, *sources[2:], givens_cell=sources[1])
    text = jupytext.writes(nbformat.read(path, as_version=4), fmt="py:percent")
    nbformat.write(jupytext.reads(text, fmt="py:percent"), str(path))
    return path


WRITERS = {"nbformat 4.0": write_v40, "Colab": write_colab, "Jupytext": write_jupytext}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every notebook of this file's lab 97, in one batch of two at a time (a grading batch of 23 notebooks,
    about a minute on 2 cores: the slow tier's)."""
    tmp, paths = tmp_path_factory.mktemp("styles"), {}
    for name, (givens_cell, answer) in STYLES.items():
        paths[name] = T.notebook(tmp / _slug(name) / "97_lab.ipynb", answer, OTHERS, givens_cell=givens_cell)
    for name, (imports, answer) in NUMBERS.items():
        paths[name] = T.notebook(tmp / _slug(name) / "97_lab.ipynb", imports, answer, OTHERS)
    for name in SAVED_BY:
        sources = [T.HEAD, "A, B = 6, 7", ANSWER, OTHERS]
        paths[name] = WRITERS[name](tmp / _slug(name) / "97_lab.ipynb", sources)
    for name, givens_cell in UNSEEN.items():
        paths[name] = write_v40(tmp / _slug(name) / "97_lab.ipynb", [T.HEAD, "print('lab 97')", givens_cell, ANSWER,
                                                                     OTHERS])
        (paths[name].parent / HELPER[0]).write_text(HELPER[1])
    for name, (cells, _) in FAILS.items():
        head, *rest = cells
        write = write_v40 if "no tags" in name else lambda p, s: T.notebook(p, *s[2:], givens_cell=s[1])
        paths[name] = write(tmp / _slug(name) / "97_lab.ipynb", [T.HEAD, head, *rest, OTHERS])
        (paths[name].parent / HELPER[0]).write_text(HELPER[1])
    grader = G.Grader(T.sandbox(), timeout=60, secret=b"givens styles")
    subs = [G.Submission(p, name) for name, p in paths.items()]
    return {g.student: g for g in G.grade_all(grader, subs, jobs=2, progress=False)}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name)


ALL_PASS = {"97.1": "passed", "97.2": "passed", "97.3": "passed"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STYLES))
def test_a_givens_cell_written_any_honest_way_follows_the_hidden_givens(graded, name):
    g = graded[name]
    assert T.statuses(g) == ALL_PASS and not g.error, G.format_grade(g)
    assert not any("no givens cell" in n for n in g.notes), g.notes


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NUMBERS))
def test_a_number_of_any_numeric_type_is_a_number(graded, name):
    g = graded[name]
    assert T.statuses(g) == ALL_PASS, G.format_grade(g)


@pytest.mark.slow
@pytest.mark.parametrize("name", SAVED_BY)
def test_a_notebook_whose_ids_and_tags_were_lost_has_its_givens_cell_found(graded, name):
    g = graded[name]
    assert T.statuses(g) == ALL_PASS and not g.notes, G.format_grade(g)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(UNSEEN))
def test_an_unmarked_givens_cell_that_binds_unseen_is_found_by_running(graded, name):
    g = graded[name]
    assert T.statuses(g) == ALL_PASS and not g.notes and not g.error, G.format_grade(g)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAILS))
def test_an_answer_that_does_not_follow_the_givens_still_fails(graded, name):
    result = next(c for c in graded[name].checkoffs if c.id == "97.1")
    assert result.status == "failed" and "hidden givens set 1" in result.detail, result.detail
    assert FAILS[name][1] in result.detail, result.detail


def _nb(*sources: str, tags: dict | None = None, ids: dict | None = None) -> G.Notebook:
    tags, ids = tags or {}, ids or {}
    return G.Notebook(Path("97_lab.ipynb"), [G.Cell(n, s, ids.get(n, ""), tuple(tags.get(n, ())))
                                             for n, s in enumerate(sources, start=1)])


def test_binds_reads_every_way_a_cell_binds_a_global():
    assert G.binds("A, B = 6, 7") == {"A", "B"}
    assert G.binds("A: int = 6\n(B := 7)\nC += 1\n[D, *E] = F = [1, 2]") == {"A", "B", "C", "D", "E", "F"}
    assert G.binds("d = {'A': 6}\nglobals().update(d, B=7)\nglobals().update(dict(C=8))") == {"d", "A", "B", "C"}
    assert G.binds("globals()['A'] = 6\nvars().update({'B': 7})") == {"A", "B"}
    assert G.binds("%load_ext autoreload\n%time A = 6\n!ls\nB = 7") == {"A", "B"}
    assert G.binds("%%time\nA, B = 6, 7") == {"A", "B"}
    assert G.binds("%%bash\nA=6") == set()  # not Python
    assert G.binds("def f():\n    A = 1\nclass K:\n    B = 2\n[C for C in range(3)]") == set()
    assert G.binds("A = (") == set()


def test_the_givens_cell_is_the_marked_one_unless_another_binds_the_givens():
    names = {"A", "B"}
    head, givens, later = T.HEAD, "A, B = 6, 7", "A = 1\nB = 2\nC = 3"
    assert G.find_givens_cell(_nb(head, givens, later), None, names).number == 2  # the most: ties go first
    assert G.find_givens_cell(_nb(head, "B = 7", "A, B = 6, 7"), None, names).number == 3  # the most
    assert G.find_givens_cell(_nb(head, givens, later, tags={3: ["givens"]}), None, names).number == 3  # the tag
    assert G.find_givens_cell(_nb(head, givens, later, ids={3: "x"}, tags={2: ["givens"]}), "x", names).number == 3
    assert G.find_givens_cell(_nb(head, givens, tags={1: ["givens"]}), None, names).number == 2  # binds none
    assert G.find_givens_cell(_nb(head, "print(1)", tags={2: ["givens"]}), None, names).number == 2  # none binds
    assert G.find_givens_cell(_nb(head, "print(1)"), None, names) is None
    assert G.find_givens_cell(_nb(head, givens, tags={1: ["givens"]}), None, set()).number == 1  # no givens


def _lab02(folder: Path, tuple_style: bool, colab: bool) -> Path:
    """Lab 02's solution with no tags, its cell ids dropped (nbformat 4.0) or changed (Colab); with
    `tuple_style`, its givens cell one tuple assignment of the lab's own values."""
    nb = json.loads((ROOT / "solutions" / "02_naive_allocator.ipynb").read_text(encoding="utf-8"))
    for n, cell in enumerate(nb["cells"]):
        tags = cell.get("metadata", {}).pop("tags", [])
        cell.pop("id", None)
        if colab:
            cell.update(id=f"colab{n:04d}", metadata={**cell.get("metadata", {}), "colab": {"height": 40}})
        if "givens" in tags and tuple_style:
            lecture = {}
            exec("".join(cell["source"]), {}, lecture)  # noqa: S102 - the lab's own givens cell
            cell["source"] = f"{', '.join(lecture)} = {', '.join(map(repr, lecture.values()))}\n"
    nb["nbformat_minor"] = 5 if colab else 0
    if colab:
        nb["metadata"]["colab"] = {"provenance": []}
    folder.mkdir()
    path = folder / "02_naive_allocator.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


@pytest.mark.slow
def test_lab_02s_solution_without_its_givens_cells_id_or_tag_gets_full_marks(tmp_path):
    """Two at once: in tuple style saved as nbformat 4.0 (no ids, no tags), and as Colab saves it."""
    subs = [G.Submission(_lab02(tmp_path / "v40", tuple_style=True, colab=False), "nbformat 4.0, tuple"),
            G.Submission(_lab02(tmp_path / "colab", tuple_style=False, colab=True), "Colab")]
    for g in G.grade_all(G.Grader(T.sandbox(), secret=b"lab 02 styles"), subs, jobs=2, progress=False):
        assert [c.status for c in g.checkoffs] == ["passed"] * 14, G.format_grade(g)
        assert not g.notes and not g.error, (g.student, g.notes, g.error)


def _slot_waste() -> int:
    """Lab 02's 2.1 on the givens its record publishes (what check() grades against: the course card's), by hand:
    KV bytes per token 2 x LAYERS x KV_HEADS x HEAD_DIM x DTYPE_BYTES, times the S_MAX - PROMPT - OUTPUT tokens a
    reserve-to-max slot never fills.  On the lecture's card 2 x 32 x 32 x 128 x 2 = 524,288 B times 4,096 - 640 =
    3,456 tokens: 1,811,939,328 B; on A100-80GB + Qwen2.5-7B (its MHA form, 28 layers x 28 heads) 1,387,266,048 B."""
    from labsupport.course import record

    g = record.read(2)["givens"]
    return (g["S_MAX"] - g["PROMPT"] - g["OUTPUT"]) * 2 * g["LAYERS"] * g["KV_HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"]


def test_check_takes_a_number_of_any_numeric_type_and_still_not_a_bool(fresh_results, capsys, fails):
    from decimal import Decimal
    from fractions import Fraction

    import numpy as np
    import torch

    from labsupport.course.checkoff import check

    waste = _slot_waste()
    answers = [waste, float(waste), Fraction(waste * 3, 3), Decimal(waste), np.int64(waste),
               np.float64(waste), np.array(waste), torch.tensor(waste), torch.tensor(waste).item()]
    for answer in answers:
        check("2.1", answer)
        assert capsys.readouterr().out == "✅ Checkoff 2.1 passed\n", type(answer)
    for answer in (True, np.bool_(True), torch.tensor(True)):
        with fails("not a number"):
            check("2.1", answer)
    with fails("too low"):
        check("2.1", Fraction(waste, 3))
