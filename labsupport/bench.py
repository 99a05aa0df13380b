"""`python -m labsupport bench NAME`: benchmarks that print figures (targets live here, not in tests)."""
from __future__ import annotations

import importlib
import sys

# name -> "module:function"; each function takes argv and prints its figures.
BENCHES = {
    "allocator": "labsupport.allocator_bench:bench",
    "kernel": "labsupport.kernel_bench:bench_kernel",
    "gpu": "labsupport.kernel_bench:gpu_check",
    "notebooks": "labsupport.build:bench_notebooks",
    "viz": "labsupport.viz:bench",
    "viz_memory": "labsupport.viz_memory:bench",
    "engine": "labsupport.simulate:bench",
    "viz_slo": "labsupport.viz_slo:bench",
    "viz_sharing": "labsupport.viz_sharing:bench",
    "viz_engine": "labsupport.viz_engine:bench",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m labsupport bench {{{','.join(BENCHES)}}} [options]", file=sys.stderr)
        return 2
    module_name, func_name = BENCHES[argv[0]].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(argv[1:]) or 0)
