"""`python -m labsupport bench NAME`: benchmarks that print figures (targets live here, not in tests)."""
from __future__ import annotations

import importlib
import sys

# name -> "module:function"; each function takes argv and prints its figures.
BENCHES = {
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m labsupport bench {{{','.join(BENCHES)}}} [options]", file=sys.stderr)
        return 2
    module_name, func_name = BENCHES[argv[0]].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(argv[1:]) or 0)
