"""labsupport.course.grade: verdicts decided outside the student's kernel, for every notebook of a batch.

Kernel starts cost seconds, so one batch of small lab-00 notebooks is graded once (two at a time)
and the tests below read its report.  Each forged notebook forges one checkoff and answers the
other honestly, so every case shows both halves: the forgery earns no pass, and a correct answer in
the same notebook still passes.  What each forgery does is written beside it.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labsupport.course import grade as G
from labsupport.course.sandbox import Sandbox

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
WORD = "TO" + "DO"
IMPORTS = "from labsupport.course.checkoff import check"
GIVENS_00 = "KV_KIB = 512"  # lab 00's givens cell (tagged givens): 0.1 is re-run on other values of KV_KIB
GOOD_01 = 'kib = KV_KIB * 1024\ncheck("0.1", kib)'
GOOD_02 = 'def per_token(l, h, d, b):\n    return 2 * l * h * d * b\n\ncheck("0.2", per_token)'
UNDONE_01 = f'kib = ...  # {WORD} 0.1: set kib\ncheck("0.1", kib)'
UNDONE_02 = f'def per_token(l, h, d, b):\n    raise NotImplementedError("{WORD} 0.2: return it")\n\ncheck("0.2", per_token)'
PASS_LINES = 'print("✅ Checkoff 0.1 passed")\nprint("✅ Checkoff 0.2 passed")'
MARKER = "labsupport-test-daemon-5f3a"
# what grade will find here (the probe runs once): without a sandbox, a notebook can change your files
SANDBOXED = Sandbox.for_this_machine() is not None

# name -> (cells, {checkoff: expected status}); 0.1 or 0.2 is forged, the other answered honestly
FORGERIES = {
    "00_solved": ([IMPORTS, GOOD_01, GOOD_02], {"0.1": "passed", "0.2": "passed"}),
    "00_untouched": ([IMPORTS, UNDONE_01, UNDONE_02], {"0.1": "not attempted", "0.2": "not attempted"}),
    # defines its own check() that prints the pass line; 0.1 is left unfinished
    "00_own_check": ['def check(i, a):\n    print(f"✅ Checkoff {i} passed")', UNDONE_01, GOOD_02],
    # prints both pass lines and keeps a dead call; 0.1's answer is wrong
    "00_dead_call": [IMPORTS, 'kib = 5\nprint("✅ Checkoff 0.1 passed")\nif False:\n    check("0.1", kib)', GOOD_02],
    # overwrites the kernel's results, results(), the graders' verdicts and check itself; 0.1 is wrong
    "00_patched_registry": [IMPORTS, 'import labsupport.course.checkoff as C\n'
                            'C._RESULTS["0.1"] = {"status": "passed", "detail": ""}\n'
                            'C.results = lambda: {"0.1": {"status": "passed", "detail": ""}}\n'
                            'for c in C.load_lab(0):\n    object.__setattr__(c, "verdict", lambda *a: None)\n'
                            'C.check = lambda *a: print("✅ Checkoff 0.1 passed")\ncheck = C.check',
                            'kib = 5\ncheck("0.1", kib)', GOOD_02],
    # a float whose __eq__ says yes to everything, and a function returning such an object
    "00_lying_eq": [IMPORTS, 'class Liar(float):\n    def __eq__(self, o):\n        return True\n'
                    '    __hash__ = float.__hash__\nkib = Liar(5.0)\ncheck("0.1", kib)', GOOD_02],
    "00_lying_function": [IMPORTS, GOOD_01, 'class Any:\n    def __eq__(self, o):\n        return True\n'
                          '    def __float__(self):\n        return 524288.0\n'
                          'def per_token(*a):\n    return Any()\ncheck("0.2", per_token)'],
    # swaps the checkoff modules in sys.modules for fakes that print pass lines
    "00_sys_modules": [IMPORTS, 'import sys, types\nfake = types.ModuleType("labsupport.course.checkoff")\n'
                       'fake.check = lambda *a: print("✅ Checkoff 0.1 passed")\n'
                       'sys.modules["labsupport.course.checkoff"] = fake\nsys.modules["labsupport.checkoff"] = fake\n'
                       'from labsupport.course.checkoff import check', 'check("0.1", 1)', GOOD_02],
    # edits labsupport's files: its own copy, and the installed package's (harmless) units.py (in a sandbox only:
    # without one, nothing stops it)
    **({"00_edits_files": [IMPORTS, 'import labsupport, pathlib\nroot = pathlib.Path(labsupport.__file__).parent\n'
                       'for p in list(root.rglob("*.py")):\n    try:\n        p.write_text(p.read_text() + "\\nFORGED = 1\\n")\n'
                       '    except OSError:\n        pass\n'
                       f'try:\n    open({str(ROOT / "labsupport" / "units.py")!r}, "a").write("\\n# forged\\n")\n'
                       'except OSError:\n    pass', 'kib = 5\ncheck("0.1", kib)', GOOD_02]} if SANDBOXED else {}),
    # ends its own kernel after a correct 0.1
    "00_os_exit": [IMPORTS, GOOD_01, "import os\nos._exit(0)", GOOD_02],
    # patches json.dumps in the kernel (the protocol breaks) after a correct 0.1
    "00_patched_json": [IMPORTS, GOOD_01, 'import json\njson.dumps = lambda *a, **k: "{}"', GOOD_02],
    # calls the library's own answer for 0.2
    "00_forbidden": [IMPORTS, GOOD_01, 'from labsupport import ledger\nfrom labsupport.specs import ModelSpec\n'
                     'def per_token(l, h, d, b):\n    return ledger.kv_bytes_per_token(ModelSpec("x", l, h, h, d, 1.0, b))\n'
                     'check("0.2", per_token)'],
    # answers the lab's own cases from a table (all of them right): the hidden inputs find it out
    "00_lookup_table": [IMPORTS, GOOD_01, 'T = {s: 2 * s[0] * s[1] * s[2] * s[3] for s in [(32, 32, 128, 2), (32, 8, 128, 2), '
                        '(80, 8, 128, 2), (32, 32, 128, 4), (32, 32, 128, 1), (1, 1, 1, 1), (2, 3, 5, 4), (24, 16, 64, 2)]}\n'
                        'def per_token(l, h, d, b):\n    return T.get((l, h, d, b), 0)\ncheck("0.2", per_token)'],
    # a cell that outlives the timeout, then a correct 0.2 that never runs
    "00_runaway": [IMPORTS, GOOD_01, "import time\ntime.sleep(600)", GOOD_02],
    # leaves a process behind that would outlive the notebook
    "00_daemon": [IMPORTS, 'import subprocess, sys\nsubprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", '
                  f'"{MARKER}"], start_new_session=True)', GOOD_01, GOOD_02],
    # forks until it cannot (as root its user is held to a few hundred processes), then answers 0.2
    **({"00_fork_bomb": [IMPORTS, GOOD_01, "import os, time\nkids = 0\nwhile kids < 5000:\n    try:\n"
                          "        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n"
                          "        time.sleep(600)\n        os._exit(0)\n    kids += 1\nprint(kids)", GOOD_02]}
       if SANDBOXED else {}),
    # after a correct 0.1, writes its own lines into the answers file through the collector's descriptor: a
    # 0.1 record holding a 5,000-digit integer (Python will not parse it; the last record counts), then garbage;
    # the honest 0.2 after it must still count
    "00_hostile_record": [IMPORTS, GOOD_01, 'import builtins, os\n'
                          'collect = next(v for k, v in vars(builtins).items() if k.startswith("__labsupport_answer_"))\n'
                          'fd = next(c.cell_contents for c in collect.__closure__ if type(c.cell_contents) is int)\n'
                          'os.write(fd, b\'{"id":"0.1","index":0,"callable":false,"value":\' + b"9" * 5000 + b"}\\n")\n'
                          'os.write(fd, b"\\x00garbage\\n" * 1000)', GOOD_02],
    # answers 0.1 with a list nested 5,000 deep, then with text of ten million digits (the last counts)
    "00_huge_answer": [IMPORTS, 'x = []\nfor _ in range(5000):\n    x = [x]\ncheck("0.1", x)',
                       'check("0.1", "5" * 10_000_000)', GOOD_02],
    # a thousand cells that each sleep a little: together far past the timeout, each well within it
    "00_many_cells": [IMPORTS, GOOD_01, *["import time\ntime.sleep(0.05)"] * 1000, GOOD_02],
    # stored outputs claiming passes (never read) on an untouched notebook
    "00_stale_outputs": ([IMPORTS, UNDONE_01, UNDONE_02], {"0.1": "not attempted", "0.2": "not attempted"}),
    # the cell with 0.2's check is deleted
    "00_deleted_cell": ([IMPORTS, GOOD_01], {"0.1": "passed", "0.2": "not attempted"}),
}
EXPECTED_DEFAULT = {"0.1": "failed", "0.2": "passed"}
EXPECTED = {
    "00_own_check": {"0.1": "not attempted", "0.2": "passed"},
    "00_dead_call": {"0.1": "not attempted", "0.2": "passed"},
    "00_lying_function": {"0.1": "passed", "0.2": "failed"},
    "00_os_exit": {"0.1": "passed", "0.2": "not attempted"},
    "00_patched_json": {"0.1": "passed", "0.2": "not attempted"},
    "00_forbidden": {"0.1": "passed", "0.2": "failed"},
    "00_lookup_table": {"0.1": "passed", "0.2": "failed"},
    "00_runaway": {"0.1": "passed", "0.2": "not attempted"},
    "00_many_cells": {"0.1": "passed", "0.2": "not attempted"},
    "00_daemon": {"0.1": "passed", "0.2": "passed"},
    "00_fork_bomb": {"0.1": "passed", "0.2": "passed"},
}
INVALID = {"00_list.ipynb": b"[]", "00_dict.ipynb": b"{}", "00_text.ipynb": b"hello",
           "00_number_source.ipynb": json.dumps({"cells": [{"cell_type": "code", "source": 5}], "metadata": {},
                                                 "nbformat": 4, "nbformat_minor": 5}).encode()}


def notebook(path: Path, *sources: str, stale_pass: bool = False) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# a lab"), nbformat.v4.new_code_cell(GIVENS_00, metadata={"tags": ["givens"]})]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    if stale_pass:
        for cell in nb.cells[1:]:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ Checkoff 0.1 passed\n")]
            cell.execution_count = 1
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def expected(name: str) -> dict:
    entry = FORGERIES[name]
    return entry[1] if isinstance(entry, tuple) else EXPECTED.get(name, EXPECTED_DEFAULT)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The whole class: one folder per student, graded two at a time, every output file written."""
    root = tmp_path_factory.mktemp("class")
    for name, entry in FORGERIES.items():
        cells = entry[0] if isinstance(entry, tuple) else entry
        notebook(root / name / "00_setup.ipynb", *cells, stale_pass=name == "00_stale_outputs")
    for name, data in INVALID.items():
        folder = root / f"invalid_{name[3:-6]}"
        folder.mkdir()
        (folder / name).write_bytes(data)
    units = (ROOT / "labsupport" / "units.py").read_bytes()
    out = tmp_path_factory.mktemp("out")
    proc = subprocess.run([sys.executable, "-m", "labsupport", "grade", str(root), "--jobs", "2", "--seed", "12",
                           "--timeout", "15", "--json", "--csv", str(out / "gradebook.csv"),
                           "--gradescope", str(out / "results.json"), "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500)
    report = json.loads(proc.stdout)
    by_student = {n["student"]: n for n in report["notebooks"]}
    return {"proc": proc, "report": report, "by": by_student, "out": out, "root": root,
            "units_before": units, "units_after": (ROOT / "labsupport" / "units.py").read_bytes()}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forgeries_earn_nothing_and_honest_answers_still_pass(batch, name):
    row = batch["by"][name]
    got = {c["id"]: c["status"] for c in row["checkoffs"]}
    assert got == expected(name), (row["error"], row["checkoffs"])


def test_every_notebook_has_a_row_and_the_report_keeps_its_shape(batch):
    report = batch["report"]
    assert len(report["notebooks"]) == len(FORGERIES) + len(INVALID)
    for row in report["notebooks"]:
        assert {"path", "lab", "student", "error", "checkoffs", "passed", "failed", "total"} <= set(row)
        assert all({"id", "status"} <= set(c) for c in row["checkoffs"])
    totals = (report["passed"], report["failed"], report["not_attempted"])
    assert sum(totals) == report["total"] == sum(len(r["checkoffs"]) for r in report["notebooks"])


def test_files_that_are_not_notebooks_get_error_rows_and_one_line_each(batch):
    proc = batch["proc"]
    assert proc.returncode == 2  # some input was not a notebook; everything else was still graded
    for name in INVALID:
        row = batch["by"][f"invalid_{name[3:-6]}"]
        assert row["error"] and row["checkoffs"] == []
    lines = [line for line in proc.stderr.splitlines() if line.startswith("grade: ")]
    assert lines[0].startswith("grade: isolation: ")  # the mode, once, at start
    assert len(lines) == 1 + len(INVALID)
    assert "Traceback" not in proc.stderr


def test_failures_explain_themselves(batch):
    by = batch["by"]
    detail = {name: {c["id"]: c["detail"] for c in by[name]["checkoffs"]} for name in by}
    assert "too low" in detail["00_patched_registry"]["0.1"] and "Hint:" in detail["00_patched_registry"]["0.1"]
    assert "never ran" in detail["00_dead_call"]["0.1"]
    assert "derive, don't call" in detail["00_forbidden"]["0.2"]
    assert "kv_bytes_per_token" in detail["00_forbidden"]["0.2"]
    assert "too low" in detail["00_lying_eq"]["0.1"]  # compared as the 5.0 it is
    assert detail["00_untouched"]["0.2"] == f"{WORD} 0.2: return it"
    assert "placeholder" in detail["00_untouched"]["0.1"]
    assert "never ran" in detail["00_deleted_cell"]["0.2"] or "no cell" in detail["00_deleted_cell"]["0.2"]
    # cell 1 is the markdown title, cell 2 the givens: the os._exit cell is cell 5, the sleeping one cell 5 too
    assert "the kernel died at cell 5" in by["00_os_exit"]["error"]
    assert detail["00_os_exit"]["0.2"].startswith("the kernel died at cell 5") and "before this cell" in detail["00_os_exit"]["0.2"]
    assert "longer than 15 s at cell 5" in by["00_runaway"]["error"]
    assert "longer than 15 s at cell" in by["00_many_cells"]["error"] and "before this cell" in detail["00_many_cells"]["0.2"]
    assert "plain data" in detail["00_hostile_record"]["0.1"] and "digits" in detail["00_hostile_record"]["0.1"]
    assert len(detail["00_huge_answer"]["0.1"]) < G.MAX_TEXT_CHARS + 100
    assert by["00_patched_json"]["error"]


@pytest.mark.skipif(not SANDBOXED, reason="without a sandbox, a notebook's code runs as you and may write your files")
def test_nothing_the_notebook_writes_changes_labsupport(batch):
    # in a sandbox the notebook sees a read-only copy of labsupport, and the installed one not at all
    assert batch["units_after"] == batch["units_before"]


@pytest.mark.skipif(not SANDBOXED, reason="without a user of its own, a notebook's processes can escape its session")
def test_nothing_the_notebook_starts_outlives_it(batch):
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if MARKER.encode() in (entry / "cmdline").read_bytes():
                    alive.append(entry.name)
            except OSError:
                pass
    assert not alive


def test_the_gradebook_has_a_row_per_student_and_lab(batch):
    with open(batch["out"] / "gradebook.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(FORGERIES) + len(INVALID)
    solved = next(r for r in rows if r["student"] == "00_solved")
    assert (solved["lab"], solved["0.1"], solved["0.2"], solved["score"]) == ("00", "passed", "passed", "2/2")
    broken = next(r for r in rows if r["student"] == "invalid_list")
    assert broken["lab"] == "00" and "not a notebook" in broken["error"]


def test_the_gradescope_results_are_what_gradescope_reads(batch):
    data = json.loads((batch["out"] / "results.json").read_text())
    valid = [r for r in batch["report"]["notebooks"] if r["checkoffs"]]
    assert len(data["tests"]) == sum(len(r["checkoffs"]) for r in valid)
    assert data["score"] == sum(t["score"] for t in data["tests"]) == batch["report"]["passed"]
    for test in data["tests"]:
        assert set(test) >= {"name", "score", "max_score", "output", "visibility"}
        assert test["max_score"] == 1.0 and test["score"] in (0.0, 1.0) and test["visibility"] == "visible"


def test_two_jobs_give_the_same_results_as_one(batch, tmp_path):
    names = ["00_solved", "00_lookup_table", "00_forbidden"]
    folders = [str(batch["root"] / n) for n in names]
    proc = subprocess.run([sys.executable, "-m", "labsupport", "grade", *folders, "--jobs", "1", "--seed", "12",
                           "--json", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    one = {n["student"]: [(c["id"], c["status"], c["detail"]) for c in n["checkoffs"]]
           for n in json.loads(proc.stdout)["notebooks"]}
    two = {n: [(c["id"], c["status"], c["detail"]) for c in batch["by"][n]["checkoffs"]] for n in names}
    assert one == two


def test_the_text_scoreboard(batch, tmp_path, capsys):
    path = notebook(tmp_path / "00_setup.ipynb", IMPORTS, UNDONE_01, GOOD_02)
    assert G.main([str(path), "--no-progress"]) == 0  # nothing failed
    out = capsys.readouterr().out
    assert "⬜ 0.1   not attempted  KV per token in bytes" in out and "✅ 0.2   passed" in out
    assert out.rstrip().endswith("TOTAL 1/2 checkoffs passed, 0 failed, 1 not attempted")


@pytest.mark.parametrize("argv, words", [
    (["--jobs", "0", "x.ipynb"], "--jobs"), (["--jobs", "two", "x.ipynb"], "--jobs"),
    (["--timeout", "-5", "x.ipynb"], "--timeout"), (["--bogus", "x.ipynb"], "--bogus"), ([], "paths"),
    (["missing.ipynb"], "missing.ipynb"), (["--csv", "/no/such/folder/g.csv", "x.ipynb"], "/no/such/folder"),
    (["--gradescope", ".", "x.ipynb"], "folder"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, words, tmp_path):
    if argv[-1:] == ["x.ipynb"]:
        notebook(tmp_path / "x.ipynb", "x = 1")
    proc = subprocess.run([sys.executable, "-m", "labsupport", "grade", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_a_lab_without_checkoffs_is_not_graded_as_zero_of_zero(tmp_path):
    grader = G.Grader(timeout=30)
    try:
        result = grader.grade(notebook(tmp_path / "99_board.ipynb", "x = 1"))
    finally:
        grader.close()
    assert result.invalid and "no checkoffs" in result.error and result.checkoffs == []
