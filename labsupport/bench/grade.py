"""`python -m labsupport bench grade [--students N] [--jobs J] [--lab NN] [--hidden-runs K]`: what grading costs here.

Targets: one lab-02 submission graded in at most 2× its own Run All (issue "A grade that never fails
honest work"; 4× before it), and a class of 30 lab-02 submissions in at most 6 minutes with `--jobs 2` on a 2-core
CPU.  Each student hands in the lab's solution notebook, so every run reaches every answer.  The
figures, side by side: the notebook's Run All in a fresh kernel (as JupyterLab runs it), one
submission's grade, their ratio, then the class.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from labsupport.cli.parser import OneLineParser
from labsupport.course.build import discover, execute
from labsupport.course.grade import HIDDEN_RUNS, Grader, Submission, grade_all, positive_int
from labsupport.course.sandbox import Sandbox
from labsupport.workloads import REPO_ROOT


def _copies(folder: Path, notebook: Path, n: int) -> list[Submission]:
    out = []
    for i in range(n):
        path = folder / f"student{i:03d}" / notebook.name
        path.parent.mkdir(parents=True)
        shutil.copyfile(notebook, path)
        out.append(Submission(path, path.parent.name))
    return out


def bench(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m labsupport bench grade")
    parser.add_argument("--students", type=positive_int, default=30)
    parser.add_argument("--jobs", type=positive_int, default=2)
    parser.add_argument("--lab", default="02")
    parser.add_argument("--hidden-runs", type=positive_int, default=HIDDEN_RUNS)
    args = parser.parse_args(argv or [])
    if args.students > 1000 or args.jobs > 64 or args.hidden_runs > 8:
        parser.error("at most 1000 students, 64 jobs and 8 hidden runs")
    (lab,) = discover(REPO_ROOT, [args.lab])
    sandbox = Sandbox.for_this_machine()
    if sandbox is None:
        parser.error("bubblewrap cannot run here: this bench measures grading as `grade` runs it")
    print(f"isolation: {sandbox.describe()}", file=sys.stderr)
    grader = Grader(sandbox, hidden_runs=args.hidden_runs)
    start = time.perf_counter()
    execute(nbformat.read(lab.solution_path, as_version=4), lab.solution_path.parent, progress=False)
    run_all = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        (one,) = _copies(Path(tmp) / "one", lab.solution_path, 1)
        alone = grader.grade(one.path, one.student).seconds
        print(f"{lab.name}: Run All in a fresh kernel {run_all:.1f} s; one submission graded (1 + {args.hidden_runs} "
              f"runs) {alone:.1f} s = {alone / run_all:.2f}× its Run All (target ≤ 2×)", flush=True)
        submissions = _copies(Path(tmp) / "class", lab.solution_path, args.students)
        start = time.perf_counter()
        grades = grade_all(grader, submissions, jobs=args.jobs, progress=True)
        wall = time.perf_counter() - start
    full = sum(g.passed == g.total and not g.error for g in grades)
    each = sorted(g.seconds for g in grades)
    print(f"{lab.name}: {args.students} notebooks, --jobs {args.jobs}: {int(wall // 60)} min {int(wall % 60):02d} s "
          f"(target for 30 with --jobs 2: ≤ 6 min); per notebook median {each[len(each) // 2]:.1f} s, "
          f"slowest {each[-1]:.1f} s; {full} of {args.students} earned every checkoff")
    return 0 if full == args.students else 1
