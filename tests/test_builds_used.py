"""Each lab has a build its own later cells use (issue 35): a function checkoff, graded on hidden cases, whose
function a later cell of the student copy calls, so what the student writes is the lab's machinery from there on
(2.13's placement places every slot; 6.1's break-even decides the engine's preemptions; 7.1's TPOT prices the
table).  Read off the student notebooks as the build wrote them: the checkoff cell hands in a function by name, and
some code cell after it calls that name."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from labsupport.course import record

ROOT = Path(__file__).resolve().parents[1]
STUDENTS = sorted((ROOT / "notebooks").glob("0[0-9]_*.ipynb"))
HANDED_IN = re.compile(r"""check\(\s*["'](\d+\.\d+)["']\s*,\s*([A-Za-z_]\w*)\s*\)""")


def builds_used_later(nb: nbformat.NotebookNode, function_ids: set[str]) -> dict[str, str]:
    """{checkoff id: the function's name} for each function checkoff whose function a later code cell calls (a call,
    not its definition, nor the checkoff's own `check(...)`)."""
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    used = {}
    for i, source in enumerate(code):
        for cid, name in HANDED_IN.findall(source):
            if cid not in function_ids:
                continue
            call = re.compile(rf"(?<![\w.])(?<!def ){re.escape(name)}\s*\(")
            if any(call.search(later) for later in code[i + 1:]):
                used[cid] = name
    return used


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_each_lab_has_a_build_its_later_cells_use(path):
    lab = int(path.name[:2])
    functions = {c["id"] for c in record.read(lab)["checkoffs"] if c["kind"] == "function"}
    used = builds_used_later(nbformat.read(path, as_version=4), functions)
    assert used, f"{path.stem}: no function checkoff of {sorted(functions)} is called by a later cell"


def test_the_reading_tells_a_call_from_a_definition_and_a_check():
    cells = [nbformat.v4.new_code_cell("def place(h, s):\n    return None\n\ncheck('9.1', place)"),
             nbformat.v4.new_code_cell("def place(h, s):  # redefined, not called\n    return 0\ncheck('9.1', place)"),
             nbformat.v4.new_code_cell("def size(x):\n    return x\ncheck('9.2', size)"),
             nbformat.v4.new_code_cell("if unlocked('9.2'):\n    print(size(3))")]
    assert builds_used_later(nbformat.v4.new_notebook(cells=cells), {"9.1", "9.2"}) == {"9.2": "size"}
    assert builds_used_later(nbformat.v4.new_notebook(cells=cells[:3]), {"9.1", "9.2"}) == {}
