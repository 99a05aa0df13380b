"""`python -m labsupport bench grade [--students N] [--jobs J] [--lab NN]`: how long a class takes to grade here.

Target: a class of 30 lab-02 submissions in at most 6 minutes with `--jobs 2` on a 2-core CPU.
Each student hands in the lab's solution notebook (so every checkoff is re-derived, on hidden
givens too); the figure is wall time for the whole batch, as `python -m labsupport grade` runs it.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from labsupport.cli.parser import OneLineParser
from labsupport.course.build import discover
from labsupport.course.grade import Grader, Submission, grade_all, positive_int
from labsupport.course.sandbox import Sandbox, describe
from labsupport.workloads import REPO_ROOT


def bench(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m labsupport bench grade")
    parser.add_argument("--students", type=positive_int, default=30)
    parser.add_argument("--jobs", type=positive_int, default=2)
    parser.add_argument("--lab", default="02")
    args = parser.parse_args(argv or [])
    if args.students > 1000 or args.jobs > 64:
        parser.error(f"at most 1000 students and 64 jobs, got --students {args.students} --jobs {args.jobs}")
    (lab,) = discover(REPO_ROOT, [args.lab])
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        submissions = []
        for i in range(args.students):
            path = Path(tmp) / f"student{i:03d}" / lab.solution_path.name
            path.parent.mkdir()
            shutil.copyfile(lab.solution_path, path)
            submissions.append(Submission(path, path.parent.name))
        sandbox = Sandbox.for_this_machine()  # isolated as `grade` isolates
        print(f"isolation: {describe(sandbox)}", file=sys.stderr)
        grader = Grader(sandbox=sandbox)
        print(f"grading {args.students} copies of {lab.name}'s solution, {args.jobs} at a time ...", file=sys.stderr)
        start = time.perf_counter()
        try:
            grades = grade_all(grader, submissions, jobs=args.jobs, progress=True)
        finally:
            grader.close()
        wall = time.perf_counter() - start
    full = sum(g.passed == g.total and not g.error for g in grades)
    each = sorted(g.seconds for g in grades)
    print(f"{lab.name}: {args.students} notebooks, --jobs {args.jobs}: {int(wall // 60)} min {int(wall % 60):02d} s "
          f"(target for 30 with --jobs 2: ≤ 6 min); per notebook median {each[len(each) // 2]:.1f} s, "
          f"slowest {each[-1]:.1f} s; {full} of {args.students} earned every checkoff")
    return 0 if full == args.students else 1
