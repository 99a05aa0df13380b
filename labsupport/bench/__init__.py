"""`python -m labsupport bench NAME`: benchmarks that print figures (targets live here, not in tests).

    allocator  block allocate/free, append_slot and paged-cache appends per second (§10.3)
    kernel     the Triton kernels' times here (the interpreter on CPU: meaningless for GPUs)
    gpu        on a CUDA machine: the kernels' correctness matrix and bandwidth sweep -> data/gpu_results.json
    engine     the Azure conversation trace through the engine's scheduler on one core (§10.5)
    smollm2    SmolLM2-135M on 32 scaled Azure requests: the paged engine beside transformers' generate
    notebooks  each solution notebook's run time
    board      the board's Run All and present mode's first page, beside INSTRUCTORS.md's promise
    grade      a class of 30 copies of lab 02's solution graded with --jobs 2 (target: 6 minutes)
    plans      grading plans (hidden givens and cases) drawn for many students a lab: every one must build
    viz*       Python time per slider update of each lab's panels

Each bench parses its flags with `labsupport.cli.parser.OneLineParser` and runs under `run_command`:
a bad flag is one line and exit code 2.
"""
from __future__ import annotations

import importlib
import sys

from labsupport.cli.parser import one_line, run_command

# name -> "module:function"; each function takes argv and prints its figures.
BENCHES = {
    "allocator": "labsupport.bench.allocator:bench",
    "kernel": "labsupport.bench.kernel:bench_kernel",
    "gpu": "labsupport.bench.kernel:gpu_check",
    "engine": "labsupport.bench.engine:bench",
    "smollm2": "labsupport.bench.smollm2:bench",
    "notebooks": "labsupport.bench.notebooks:bench",
    "board": "labsupport.bench.board:bench",
    "grade": "labsupport.bench.grade:bench",
    "plans": "labsupport.bench.plans:bench",
    "viz": "labsupport.bench.viz:bench_roofline",
    "viz_memory": "labsupport.bench.viz:bench_memory",
    "viz_sharing": "labsupport.bench.viz:bench_sharing",
    "viz_engine": "labsupport.bench.viz:bench_engine",
    "viz_slo": "labsupport.bench.viz:bench_slo",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        what = "which benchmark?" if not argv else f"unknown benchmark {one_line(repr(argv[0]))[:80]}"
        print(f"bench: error: {what} choose one of: {', '.join(BENCHES)} "
              f"(python -m labsupport bench NAME [options])", file=sys.stderr)
        return 2
    module_name, func_name = BENCHES[argv[0]].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return run_command(f"bench {argv[0]}", func, argv[1:])
