"""labsupport.course.grade: fresh-kernel execution, the per-checkoff scoreboard, --json, and exit codes.

Small lab-00 notebooks are written here (a kernel start costs seconds, so the cells are few): one
solved, one with a wrong answer dressed up with a stale "passed" output, one untouched, and one
whose cell outlives the timeout.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labsupport.course import grade as G

pytestmark = pytest.mark.slow

WORD = "TO" + "DO"
IMPORTS = "from labsupport.course.checkoff import check"
UNDONE_01 = f'raise NotImplementedError("{WORD} 0.1: set kib")\ncheck("0.1", kib)'
UNDONE_02 = f'def per_token(l, h, d, b):\n    raise NotImplementedError("{WORD} 0.2: return it")\n\ncheck("0.2", per_token)'
SOLVED_01 = 'kib = 512 * 1024\ncheck("0.1", kib)'
SOLVED_02 = 'def per_token(l, h, d, b):\n    return 2 * l * h * d * b\n\ncheck("0.2", per_token)'


def notebook(path: Path, *sources: str, stale_pass: bool = False) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# a lab")] + [nbformat.v4.new_code_cell(s) for s in sources]
    if stale_pass:  # what a student might paste: it must count for nothing
        for cell in nb.cells[1:]:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ Checkoff 0.1 passed\n")]
            cell.execution_count = 1
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def by_id(grade):
    return {c.id: c for c in grade.checkoffs}


def test_scoreboard_and_json_for_two_notebooks(tmp_path, capsys):
    solved = notebook(tmp_path / "notebooks" / "00_solved.ipynb", IMPORTS, SOLVED_01, SOLVED_02)
    wrong = notebook(tmp_path / "notebooks" / "00_wrong.ipynb", IMPORTS, 'kib = 512_000\ncheck("0.1", kib)',
                     UNDONE_02, stale_pass=True)
    assert G.main([str(solved), str(wrong), "--json"]) == 1  # a checkoff failed
    report = json.loads(capsys.readouterr().out)
    assert (report["passed"], report["failed"], report["not_attempted"], report["total"]) == (2, 1, 1, 4)
    first, second = report["notebooks"]
    assert first["path"] == str(solved) and first["lab"] == 0 and first["error"] == ""
    assert [(c["id"], c["status"]) for c in first["checkoffs"]] == [("0.1", "passed"), ("0.2", "passed")]
    assert [(c["id"], c["status"]) for c in second["checkoffs"]] == [("0.1", "failed"), ("0.2", "not attempted")]
    assert "512,000" in second["checkoffs"][0]["detail"] and "Hint: KiB" in second["checkoffs"][0]["detail"]
    assert second["checkoffs"][1]["detail"] == f"{WORD} 0.2: return it"
    assert (second["passed"], second["failed"], second["total"]) == (0, 1, 2)


def test_text_scoreboard_for_an_untouched_notebook(tmp_path, capsys):
    path = notebook(tmp_path / "00_setup.ipynb", IMPORTS, UNDONE_01, UNDONE_02)
    assert G.main([str(path)]) == 0  # nothing failed: nothing attempted
    out = capsys.readouterr().out
    assert "⬜ 0.1   not attempted  512 KiB in bytes" in out
    assert f"{WORD} 0.1: set kib" in out
    assert "score 0/2" in out and out.rstrip().endswith("TOTAL 0/2 checkoffs passed, 0 failed, 2 not attempted")


def test_deleted_checkoff_cell_and_runaway_cell(tmp_path):
    # 0.2's cell is gone; 0.1's cell comes after a cell that outlives the timeout (placed first, so
    # that no slow import can be what times out).
    path = notebook(tmp_path / "00_slow.ipynb", "import time\ntime.sleep(60)", IMPORTS, SOLVED_01)
    result = G.grade_notebook(path, timeout=4)
    got = by_id(result)
    assert got["0.1"].status == "not attempted" and got["0.1"].detail == "its cell never ran"
    assert got["0.2"].status == "not attempted" and "no cell" in got["0.2"].detail
    assert "longer than 4 s" in result.error


def test_other_errors_in_a_checkoff_cell_are_failures(tmp_path):
    path = notebook(tmp_path / "00_typo.ipynb", IMPORTS, 'check("0.1", kbi)', SOLVED_02)
    got = by_id(G.grade_notebook(path))
    assert got["0.1"].status == "failed" and got["0.1"].detail.startswith("NameError")
    assert got["0.2"].status == "passed"


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert G.main([str(tmp_path / "missing.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err
    odd = notebook(tmp_path / "homework.ipynb", "print(1)")
    assert G.main([str(odd)]) == 2
    assert "cannot tell which lab" in capsys.readouterr().err
