"""Shared by the grading tests: a made-up lab 97 and notebooks for it.

Lab 97 has two givens, A and B (the lecture's 6 and 7), and three checkoffs whose answers are worked
out by hand here: 97.1 = A x B (a value), 97.2 = add(x, y) = x + y on cases (a function), 97.3 = "yes"
(a choice).  A notebook of it imports nothing but check(), so a run takes a second or two.
"""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from labsupport.course import sandbox as S
from labsupport.course.registry import GIVENS, REGISTRY, case, choice, function, givens, value

LAB = 97
HEAD = "from labsupport.course.checkoff import check"
GIVENS_CELL = "A = 6\nB = 7"
RIGHT = {"97.1": "check('97.1', A * B)",
         "97.2": "def add(x, y):\n    return x + y\n\ncheck('97.2', add)",
         "97.3": "check('97.3', 'yes')"}


def register() -> None:
    """Lab 97's givens and checkoffs, once per process."""
    if "97.1" in REGISTRY:
        return
    givens(lab=LAB, lecture=dict(A=6, B=7),
           hidden=lambda rng: dict(A=rng.choice([a for a in range(2, 60) if a != 6]),
                                   B=rng.choice([b for b in range(2, 60) if b != 7])))
    value("97.1", "A times B", expected=lambda g: g.A * g.B, hint="multiply them",
          mistakes=[(6 + 7, "That is the sum.")])

    @function("97.2", "Add", hint="x plus y", name="add")
    def _add(rng):
        for x, y in [(1, 2), (0, 0), (-5, 5)] + [(rng.randint(-99, 99), rng.randint(-99, 99)) for _ in range(4)]:
            yield case(x, y, want=x + y, mistakes=[(x * y, "That is the product.")] if x + y != x * y else [])

    choice("97.3", "Yes or no", answer="yes", options=("yes", "no"), hint="say yes")


def notebook(path: Path, *cells: str, givens_cell: str | None = GIVENS_CELL) -> Path:
    """A lab-97 notebook: check() imported, the givens cell (tagged), then `cells`."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(HEAD)]
    if givens_cell is not None:
        nb.cells.append(nbformat.v4.new_code_cell(givens_cell, metadata={"tags": ["givens"]}))
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    path = Path(path)
    os.makedirs(os.fsencode(path.parent), exist_ok=True)
    with open(os.fsencode(path), "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    return path


def sandbox(**bounds) -> S.Sandbox:
    """bubblewrap with `bounds`, or the test is skipped (and says why)."""
    found = S.Sandbox.for_this_machine(bounds=S.Bounds(**bounds))
    if found is None:
        pytest.skip("bubblewrap cannot run here (apt-get install bubblewrap; user namespaces allowed)")
    return found


def statuses(grade) -> dict[str, str]:
    return {c.id: c.status for c in grade.checkoffs}


__all__ = ["GIVENS", "LAB", "RIGHT", "notebook", "register", "sandbox", "statuses"]
