"""`python -m labsupport bench plans [--labs 03,07] [--count N] [--start K] [--jobs J]`: grading plans at scale.

A grade's plan is a lab's hidden givens and every function checkoff's hidden cases, with their expected values
(real mechanisms: allocators, caches, seeded engine runs).  Issue "A grade that never fails honest work" asks
for a one-off of 100,000 (student, secret) plans a lab, every one of which builds (goal: no failure); the slow
tier of tests/test_grade_plan.py draws 300 whole plans and 5,000 hidden givens a lab.  Student i is
`student{i}` under one secret per 1,000 students (`plans secret {i // 1000}`), so runs split by --start and --count add up to one sweep.  Prints a
line a lab: plans built, failures (the first few, each with its student), the median and slowest plan.
"""
from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from labsupport.cli.parser import OneLineParser
from labsupport.course.build import BuildError, discover
from labsupport.course.grade import Grader, positive_int, whole_number
from labsupport.workloads import REPO_ROOT

CHUNK = 250  # plans a worker draws before it reports


def plan_range(lab: int, start: int, stop: int) -> tuple[list[float], list[tuple[int, str]]]:
    """Plans for students start..stop-1 of `lab`: each one's seconds, and (student, what failed) for each failure:
    an exception, or a checkoff the plan marked for a regrade (a fault the grader met drawing it)."""
    seconds, failures = [], []
    for i in range(start, stop):
        grader = Grader(None, secret=f"plans secret {i // 1000}".encode())
        began = time.perf_counter()
        try:
            plan = grader.plan(lab, f"student{i}")
            failures += [(i, text) for text in plan.faults.values()]
        except Exception as exc:  # noqa: BLE001 - every failure is counted and named, none stops the sweep
            failures.append((i, f"{type(exc).__name__}: {exc}"))
        seconds.append(time.perf_counter() - began)
    return seconds, failures


def bench(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m labsupport bench plans")
    parser.add_argument("--labs", default="", help="comma-separated labs (default: every lab with checkoffs)")
    parser.add_argument("--count", type=whole_number(1, 10_000_000, "wants a whole number from 1 to 10,000,000"),
                        default=2_000, help="plans a lab (default 2,000; the issue's one-off is 100,000)")
    parser.add_argument("--start", type=whole_number(0, 10**12, "wants a whole number of at least 0"), default=0,
                        help="the first student's index (to split one sweep into several runs)")
    parser.add_argument("--jobs", type=positive_int, default=1, help="worker processes (default 1)")
    args = parser.parse_args(argv or [])
    if args.jobs > 256:
        parser.error(f"--jobs wants at most 256 processes, got {args.jobs}")
    try:
        labs = discover(REPO_ROOT, [n for n in args.labs.split(",") if n.strip()] or None)
    except BuildError as exc:
        parser.error(str(exc))
    if all(lab.instructor for lab in labs):
        parser.error("the board has no checkoffs: name a lab (00 to 08)")
    failed = 0
    for lab in labs:
        if lab.instructor:
            continue
        seconds, failures, began = [], [], time.perf_counter()
        chunks = [(lab.number, i, min(i + CHUNK, args.start + args.count))
                  for i in range(args.start, args.start + args.count, CHUNK)]
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for done, (s, f) in enumerate(pool.map(plan_range, *zip(*chunks)), start=1):
                seconds += s
                failures += f
                print(f"\r{lab.name}: {len(seconds):,} of {args.count:,} plans, {len(failures)} failures",
                      end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        failed += len(failures)
        first = "; ".join(f"student{i}: {text[:200]}" for i, text in failures[:3])
        print(f"{lab.name}: {len(seconds):,} plans (students {args.start:,}..{args.start + args.count - 1:,}), "
              f"{len(failures)} failures{' (' + first + ')' if first else ''}; median "
              f"{statistics.median(seconds) * 1e3:.1f} ms, slowest {max(seconds) * 1e3:.1f} ms; "
              f"{time.perf_counter() - began:.0f} s with {args.jobs} worker(s)", flush=True)
    return 1 if failed else 0
