"""labsupport.course.answers: a notebook read as a file — its check() calls, each answer's code, and "derive, don't call".

Nothing here starts a kernel.  Each case is a small notebook written in the test; what counts as a
forbidden reference, or as the code an answer depends on, is stated by hand next to it.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labsupport.course import answers as A
from labsupport.course.checkoff import ALWAYS_FORBIDDEN, load_lab

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("0[0-9]_*.ipynb"))
RIDGE = ("labsupport.ledger.ridge_batch", *ALWAYS_FORBIDDEN)


def write(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a lab")] + [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def program(tmp_path, *sources, checkoff="1.1", name="01_x.ipynb"):
    nb = A.read(write(tmp_path / name, *sources))
    return A.program(nb, nb.calls[checkoff][-1])


def findings(tmp_path, *sources, forbid=RIDGE, function=True, checkoff="1.1"):
    prog = program(tmp_path, *sources, checkoff=checkoff)
    return [(f.what, f.forbidden) for f in A.inspect(prog, forbid, function_answer=function)]


# --- reading -------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, words", [
    (b"[]", "a list"), (b"{}", "no list of cells"), (b"42", "int"), (b"not json", "not JSON"),
    (b"\xff\xfe\x00", "UTF-8"), (b'{"cells": [{"cell_type": "code", "source": 5}]}', "source is a number"),
    (b'{"cells": [{"cell_type": "code", "source": ["a", 3]}]}', "source is list"), (b'{"cells": [7]}', "not a cell"),
    (b'{"cells": [{"source": "x"}]}', "no cell_type"), (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_files_that_are_not_notebooks_get_one_line(tmp_path, content, words):
    path = tmp_path / "02_bad.ipynb"
    path.write_bytes(content)
    with pytest.raises(A.NotebookError, match=words) as info:
        A.read(path)
    assert "\n" not in str(info.value)


def test_the_lab_comes_from_the_name_or_the_checkoff_ids(tmp_path):
    assert A.read(write(tmp_path / "03_mine.ipynb", "x = 1")).lab() == 3
    assert A.read(write(tmp_path / "homework.ipynb", 'check("5.2", f)')).lab() == 5
    with pytest.raises(A.NotebookError, match="which lab"):
        A.read(write(tmp_path / "mixed.ipynb", 'check("5.2", f)\ncheck("6.1", g)')).lab()


def test_every_spelling_of_a_check_call_is_found_even_in_dead_code(tmp_path):
    nb = A.read(write(tmp_path / "02_x.ipynb", 'check("2.1", a)', 'C.check("2.2", answer=b)',
                      'if False:\n    check("2.3", c)', '%matplotlib inline\ncheck("2.4", d)', 'check(2.5, e)', 'check("2.6")'))
    assert sorted(nb.calls) == ["2.1", "2.2", "2.3", "2.4"]  # a magic in the cell does not hide the call
    assert [c.cell.number for c in nb.calls["2.3"]] == [4]


def test_check_calls_become_collector_calls(tmp_path):
    nb = A.read(write(tmp_path / "02_x.ipynb", 'x = 1\ncheck("2.1", x)\nprint(check("2.1", x + 1))'))
    source = A.collecting_source(nb, nb.cells[0], "__collect__")
    assert "check(" not in source
    assert "__collect__('2.1', x, 0)" in source and "__collect__('2.1', x + 1, 1)" in source


# --- the code an answer depends on --------------------------------------------------------------------

def test_the_cut_follows_names_back_across_cells_and_stops_at_the_check(tmp_path):
    prog = program(tmp_path,
                   "import math\nfrom labsupport.specs import GB",
                   "UNUSED = 7\nSCALE = 2 * GB",
                   "def helper(x):\n    return math.floor(x / SCALE)",
                   "def ridge(m, g):\n    return helper(g.peak_flops) + LATER",
                   'check("1.1", ridge)',
                   "LATER = 1")
    text = prog.source()
    for needed in ("import math", "from labsupport.specs import GB", "SCALE = 2 * GB", "def helper", "def ridge"):
        assert needed in text
    assert "UNUSED" not in text and "LATER = 1" not in text  # after the check call: not part of the answer
    assert prog.unresolved == {"LATER"}
    assert text.rstrip().endswith("__answer__ = ridge")


def test_a_mutation_of_a_needed_name_is_part_of_the_cut(tmp_path):
    prog = program(tmp_path, "table = []", "table.append(3)\nother = []", "table[0] += 1", 'value = table[0]\ncheck("1.3", value)',
                   checkoff="1.3")
    text = prog.source()
    assert "table.append(3)" in text and "table[0] += 1" in text and "other" not in text


def test_the_last_definition_before_the_check_wins(tmp_path):
    prog = program(tmp_path, "def ridge(m, g):\n    return 1", "def ridge(m, g):\n    return 2", 'check("1.1", ridge)')
    assert prog.source().count("def ridge") == 1 and "return 2" in prog.source()
    assert "return 2" in prog.function_source()


# --- derive, don't call -------------------------------------------------------------------------------

@pytest.mark.parametrize("sources", [
    ["from labsupport import ledger", "def r(m, g):\n    return ledger.ridge_batch(m, g)", 'check("1.1", r)'],
    ["import labsupport.ledger", "def r(m, g):\n    return labsupport.ledger.ridge_batch(m, g)", 'check("1.1", r)'],
    ["from labsupport import ledger as L", "f = L.ridge_batch", "def r(m, g):\n    return f(m, g)", 'check("1.1", r)'],
    ["from labsupport.ledger import ridge_batch as rb", "def r(m, g):\n    return rb(m, g)", 'check("1.1", r)'],
    ["from labsupport.ledger import *", "def r(m, g):\n    return ridge_batch(m, g)", 'check("1.1", r)'],
    ["import labsupport", "def r(m, g):\n    return getattr(labsupport.ledger, 'ridge_batch')(m, g)", 'check("1.1", r)'],
    ["import labsupport as ls", "L = ls.ledger", "def r(m, g):\n    x = L\n    return x.ridge_batch(m, g)", 'check("1.1", r)'],
    ["import importlib", "def r(m, g):\n    return importlib.import_module('labsupport.ledger').ridge_batch(m, g)",
     'check("1.1", r)'],
    ["def r(m, g):\n    from labsupport.ledger import ridge_batch\n    return ridge_batch(m, g)", 'check("1.1", r)'],
    ["from labsupport.course.checkoffs import lab01", "def r(m, g):\n    return lab01.GB", 'check("1.1", r)'],
    ["from labsupport import ledger", "r = ledger.ridge_batch", 'check("1.1", r)'],
])
def test_a_forbidden_name_is_found_however_it_is_reached(tmp_path, sources):
    found = findings(tmp_path, *sources)
    assert found, "the forbidden reference went unseen"
    assert any(f[1] for f in found)


@pytest.mark.parametrize("body, construct", [
    ("return eval('1')", "eval"), ("exec('x = 1')\n    return 1", "exec"), ("return globals()['x']", "globals"),
    ("return open('/etc/hostname').read()", "open"), ("return vars()['m']", "vars"),
    ("import labsupport\n    return getattr(labsupport.ledger, 'ridge' + '_batch')(m, g)", "getattr"),
    ("return m.__class__.__mro__[1].__subclasses__()", "__subclasses__"),
    ("import sys\n    return sys.modules['labsupport.ledger'].ridge_batch(m, g)", "sys.modules"),
    ("import subprocess\n    return subprocess.check_output(['true'])", "subprocess"),
    ("return __import__('labsupport.ledger')", "__import__"),
    ("import operator\n    return operator.attrgetter('ridge_batch')", "operator.attrgetter"),
])
def test_constructs_that_hide_what_runs_are_not_accepted(tmp_path, body, construct):
    found = findings(tmp_path, f"def r(m, g):\n    {body}", 'check("1.1", r)')
    assert any(construct in what for what, _ in found), found


def test_code_from_beside_the_notebook_is_not_read_so_not_accepted(tmp_path):
    found = findings(tmp_path, "from my_helpers import ridge", 'check("1.1", ridge)')
    assert any("my_helpers" in what for what, _ in found)
    assert findings(tmp_path, "import numpy as np", "def r(m, g):\n    return float(np.floor(2.5))", 'check("1.1", r)') == []


def test_handing_in_a_library_function_is_not_handing_in_your_own(tmp_path):
    assert findings(tmp_path, "import math", "r = math.hypot", 'check("1.1", r)') == [("r", A.HANDED_IN)]
    assert findings(tmp_path, "def mine(m, g):\n    return 1", "r = mine", 'check("1.1", r)') == []
    assert findings(tmp_path, 'check("1.1", lambda m, g: 2)') == []
    assert findings(tmp_path, "import functools", "def make():\n    return lambda m, g: 3",
                    "r = functools.lru_cache(make())", 'check("1.1", r)') == []  # built, but in the notebook


def test_a_value_answer_is_judged_by_the_code_it_depends_on_only(tmp_path):
    sources = ["from labsupport import ledger", "closed = ledger.ridge_batch(1, 2)  # the lab's own demo",
               "mine = 295.2", 'check("1.3", mine)']
    assert findings(tmp_path, *sources, function=False, checkoff="1.3") == []
    sources[2] = "mine = closed"
    assert findings(tmp_path, *sources, function=False, checkoff="1.3")


def test_legitimate_derivations_are_clean(tmp_path):
    assert findings(tmp_path, "import math\nfrom labsupport.specs import GB",
                    "def r(m, g):\n    fields = [getattr(m, 'dtype_bytes'), g.peak_flops]\n"
                    "    return math.floor(fields[1] / g.hbm_bandwidth * fields[0] / 2)", 'check("1.1", r)') == []


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_solution_derives_its_answers(path):
    """The lab sources and the forbid lists agree: no reference solution reaches for a forbidden name."""
    nb = A.read(path)
    registered = {c.id: c for c in load_lab(nb.lab())}
    assert set(nb.calls) == set(registered)
    for checkoff_id, calls in nb.calls.items():
        checkoff = registered[checkoff_id]
        prog = A.program(nb, calls[-1])
        found = A.inspect(prog, checkoff.forbidden, function_answer=checkoff.kind == "function")
        assert not found, f"{checkoff_id}: {[A.describe(f) for f in found]}"
        if checkoff.kind == "value":
            assert not prog.unresolved, f"{checkoff_id} depends on {prog.unresolved}"


def test_json_nesting_in_a_cell_is_only_text(tmp_path):
    path = tmp_path / "02_x.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "x = " + "[" * 500 + "]" * 500}],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    nb = A.read(path)
    assert len(nb.cells) == 1 and nb.calls == {}
