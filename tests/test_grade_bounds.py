"""Every resource a notebook can spend is bounded, and its classmates in the same batch get what they get alone.

Each hostile notebook of lab 97 (tests/grading.py) is graded with `grade --jobs 2` beside an honest
one.  The honest row must equal the honest notebook graded alone (same --seed), the hostile row must
name the bound it met where it met one, and the CSV, JSON and Gradescope files must be whole.
"""
from __future__ import annotations

import csv
import json
import os

import pytest

import grading as T
from labsupport.course import grade as G

T.register()
pytestmark = pytest.mark.slow
MEMORY_MIB = 400  # below the 512 MiB of /tmp: filling /tmp meets the memory bound first

HOSTILE = {
    "memory through /tmp": ("with open('/tmp/fill', 'wb') as f:\n    while True:\n        f.write(b'x' * 2**24)",
                            "memory bound"),
    "memory in the process": ("hoard = []\nwhile True:\n    hoard.append(bytearray(2**26))", "memory bound"),
    "disk": ("import os\nfd = os.open('big', os.O_CREAT | os.O_WRONLY)\nos.posix_fallocate(fd, 0, 2**40)", ""),
    "fork bomb": ("import subprocess\nsubprocess.Popen(['bash', '-c', 'f() { f | f & }; f'])\nimport time\n"
                  "time.sleep(3)", ""),
    "hang": ("while True:\n    pass", "time"),
    "one megabyte cell": ("\n".join(f"x{i} = {i}" for i in range(60_000)) + "\ncheck('97.1', A * B)", ""),
    "surrogate text": ("class E(Exception):\n    pass\nE.__name__ = '\\ud800'\ncheck('97.3', '\\udcff\\u202e')\n"
                       "raise E('\\ud800 \\x1b[2J')", ""),
    "garbage on the pipe": ("import os\nfor fd in map(int, os.listdir('/proc/self/fd')):\n    try:\n"
                            "        os.write(fd, b'\\xff\\xfe{not json\\n' + b'x' * 2**25)\n    except OSError:\n"
                            "        pass", ""),
}
LATIN1 = "latin-1 file name"


def _row(rows: list[dict], student: str) -> dict:
    return next(r for r in rows if r["student"] == student)


@pytest.fixture(scope="module")
def honest_alone(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("alone")
    path = T.notebook(tmp / "honest" / "97_lab.ipynb", *T.RIGHT.values())
    out = tmp / "alone.json"
    assert G.main([str(path.parent), "--seed", "5", "--json", "--no-progress", "--timeout", "20",
                   "--memory", str(MEMORY_MIB), "--csv", str(out.with_suffix(".csv"))]) == 0
    return list(csv.DictReader(open(out.with_suffix(".csv"), encoding="utf-8")))[0]


@pytest.mark.parametrize("name", [*HOSTILE, LATIN1])
def test_a_hostile_notebook_spoils_nothing_for_its_classmate(tmp_path, honest_alone, capsys, name):
    classroom = tmp_path / "class"
    T.notebook(classroom / "honest" / "97_lab.ipynb", *T.RIGHT.values())
    if name == LATIN1:  # a Windows zip's file name: not UTF-8
        hostile = T.notebook(os.fsdecode(bytes(classroom / "hostile") + b"/97_Jos\xe9.ipynb"), *T.RIGHT.values())
    else:
        hostile = T.notebook(classroom / "hostile" / "97_lab.ipynb", HOSTILE[name][0], *T.RIGHT.values())
    files = {k: tmp_path / f"out.{k}" for k in ("csv", "json")}
    code = G.main([str(classroom), "--jobs", "2", "--seed", "5", "--json", "--no-progress", "--timeout", "20",
                   "--memory", str(MEMORY_MIB), "--csv", str(files["csv"]), "--gradescope", str(files["json"])])
    out = capsys.readouterr().out
    report = json.loads(out)  # the --json report is whole, strict JSON
    rows = list(csv.DictReader(open(files["csv"], encoding="utf-8")))
    results = json.loads(files["json"].read_text(encoding="utf-8"))
    assert code in (0, 1)
    assert {r["student"] for r in rows} == {"honest", "hostile"}
    honest = _row(rows, "honest")
    assert {k: v for k, v in honest.items() if k != "notebook"} == \
        {k: v for k, v in honest_alone.items() if k != "notebook"}  # exactly what it gets alone
    assert len(results["tests"]) == 6 and results["score"] >= 3
    grade = next(g for g in report["notebooks"] if g["student"] == "hostile")
    words = HOSTILE.get(name, ("", ""))[1]
    assert words in grade["error"] + " ".join(grade["notes"]) + " ".join(c["detail"] for c in grade["checkoffs"]), grade
    if name == LATIN1:
        assert grade["passed"] == 3 and "Jos\\udce9" in grade["path"]  # graded, and its name shown safely
    text = out + files["csv"].read_text(encoding="utf-8") + files["json"].read_text(encoding="utf-8")
    assert not any(0xD800 <= ord(ch) <= 0xDFFF or ch in "\u202e\x1b" for ch in text)  # student text made safe


def test_a_bound_is_named_in_one_line_of_the_row(tmp_path, capsys):
    path = T.notebook(tmp_path / "hog" / "97_lab.ipynb", HOSTILE["memory in the process"][0], *T.RIGHT.values())
    grade = G.Grader(T.sandbox(memory=MEMORY_MIB * 2**20), timeout=20, secret=b"b").grade(path, "hog")
    assert f"memory bound ({MEMORY_MIB:,} MiB)" in grade.error and "\n" not in grade.error
