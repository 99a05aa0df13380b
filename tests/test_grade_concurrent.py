"""Two `grade` runs at once on one machine: neither takes the other's user id nor kills its processes.

Two classes of lab-00 notebooks are graded one after the other, then both at once (two processes,
one job each, the same seed): one class of quick notebooks, one of slow ones, so that the quick
grader finishes notebooks (and kills what their user id left running) while the slow one's kernels
run.  As root, a shared user id lets that kill take down the other grader's kernel mid-run (it did,
before ids were locked machine-wide).  The verdicts must be the same both ways.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_grade import GOOD_01, GOOD_02, IMPORTS, notebook

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
WRONG_02 = 'def per_token(l, h, d, b):\n    return l * h * d * b\n\ncheck("0.2", per_token)'


def grade(folder: Path) -> list[str]:
    return [sys.executable, "-m", "labsupport", "grade", str(folder), "--seed", "7", "--timeout", "120", "--json",
            "--no-progress"]


def verdicts(stdout: str) -> dict:
    return {(n["student"], c["id"]): (c["status"], c["detail"]) for n in json.loads(stdout)["notebooks"]
            for c in n["checkoffs"]} | {(n["student"], "error"): n["error"] for n in json.loads(stdout)["notebooks"]}


def test_two_grades_at_once_give_what_they_give_one_after_the_other(tmp_path):
    quick, slow = tmp_path / "quick", tmp_path / "slow"
    for i in range(3):  # short notebooks: this grader moves on (and cleans up its user id) while the other runs
        notebook(quick / f"q{i}" / "00_setup.ipynb", IMPORTS, "import time\ntime.sleep(1)", GOOD_01,
                 GOOD_02 if i % 2 else WRONG_02)
    for i in range(2):  # long ones: a kernel still running when the other grader kills "its" user's processes
        notebook(slow / f"s{i}" / "00_setup.ipynb", IMPORTS, GOOD_01, "import time\ntime.sleep(10)",
                 GOOD_02 if i % 2 else WRONG_02)
    classes = [quick, slow]
    alone = [subprocess.run(grade(f), cwd=ROOT, capture_output=True, text=True, timeout=900) for f in classes]
    procs = [subprocess.Popen(grade(f), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in classes]
    together = [p.communicate(timeout=900) for p in procs]
    for count, one, (out, _err) in zip((3, 2), alone, together):
        expected = verdicts(one.stdout)
        assert len(expected) == count * 3 and all(v == "" for k, v in expected.items() if k[1] == "error"), expected
        assert verdicts(out) == expected
