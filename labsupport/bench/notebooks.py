"""`python -m labsupport bench notebooks [labs...]`: how long each solution notebook takes to run here.

Targets: at most 60 s per lab on a 2-core CPU and 8 minutes for the series (the instructor's board
in seconds).  The notebooks run exactly as `python -m labsupport build` runs them.
"""
from __future__ import annotations

import time

import nbformat

from labsupport.checks import shown
from labsupport.cli.parser import UsageError
from labsupport.course.build import discover, execute
from labsupport.workloads import REPO_ROOT


def bench(argv: list[str] | None = None) -> int:
    """`python -m labsupport bench notebooks [labs...]`: each solution notebook's execution time here."""
    args = [a for a in (argv or [])]
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise UsageError(f"unrecognized argument {shown(flags[0])}: bench notebooks takes lab names only "
                         f"(e.g. 02 or 02_naive_allocator)")
    labs = discover(REPO_ROOT, args or None)
    total = 0.0
    for lab in labs:
        nb = nbformat.read(lab.solution_path, as_version=4)
        start = time.perf_counter()
        execute(nb, lab.solution_path.parent, progress=False)
        seconds = time.perf_counter() - start
        total += seconds
        print(f"{lab.name}: {seconds:.1f} s (target ≤ 60 s on a 2-core CPU)", flush=True)
    print(f"all {len(labs)} solution notebooks: {total:.1f} s (target ≤ 480 s)")
    return 0
