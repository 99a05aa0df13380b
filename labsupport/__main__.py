"""`python -m labsupport <command>`: one entry point for students, instructors and graders."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "ledger": ("labsupport.cli.ledger", "the lecture's numbers recomputed for any model and GPU"),
    "doctor": ("labsupport.cli.doctor", "check this machine can run the labs"),
    "build": ("labsupport.course.build", "generate student and solution notebooks from the lab sources"),
    "grade": ("labsupport.course.grade", "grade notebooks: answers from a fresh kernel, verdicts decided outside it"),
    "simulate": ("labsupport.cli.simulate", "replay a serving trace through the engine's cost-model clock"),
    "bench": ("labsupport.bench", "benchmarks: allocator, kernel, gpu, engine, notebooks"),
    "release": ("labsupport.course.release", "write the student release: package, notebooks, no answers"),
    "autograder": ("labsupport.course.autograder", "build the Gradescope autograder bundle (a .zip)"),
}


def usage() -> str:
    lines = ["usage: python -m labsupport <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"labsupport: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
