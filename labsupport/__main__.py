"""`python -m labsupport <command>`: one entry point for students, instructors and graders.

Every command follows one rule (`labsupport.cli.parser`): bad input is one line on stderr and exit
code 2, a valid run exits 0, and no input gives a traceback.
"""
from __future__ import annotations

import importlib
import os
import sys

from labsupport.cli.parser import one_line

COMMANDS = {
    "ledger": ("labsupport.cli.ledger", "the lecture's numbers recomputed for any model and GPU"),
    "doctor": ("labsupport.cli.doctor", "check this machine can run the labs"),
    "build": ("labsupport.course.build", "generate student and solution notebooks from the lab sources"),
    "grade": ("labsupport.course.grade", "grade notebooks: each run whole in a sandbox on hidden givens, judged outside"),
    "checkoff": ("labsupport.course.scaffold", "scaffold a new checkoff in its two files (checkoff new N.M)"),
    "simulate": ("labsupport.cli.simulate", "replay a serving trace through the engine's cost-model clock"),
    "generate": ("labsupport.cli.generate", "stream a real model's reply (SmolLM2-135M) through the engine's paged cache"),
    "traces": ("labsupport.cli.traces", "fetch the real traces the labs use into data/ (--list: which are here)"),
    "bench": ("labsupport.bench", "benchmarks: allocator, kernel, gpu, engine, smollm2, notebooks"),
    "release": ("labsupport.course.release", "write the student release: package, notebooks, no answers"),
    "autograder": ("labsupport.course.autograder", "build the Gradescope autograder bundle (a .zip)"),
    "expect": ("labsupport.course.expect", "copy a finished notebook with its pass lines stored, for pytest --nbval-lax"),
}


def usage() -> str:
    lines = ["usage: python -m labsupport <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        what = "no command given" if not argv else f"unknown command {one_line(repr(argv[0]))[:80]}"
        print(f"labsupport: error: {what}; choose one of: {', '.join(COMMANDS)} (python -m labsupport --help)",
              file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    try:  # each command keeps the rule itself; this is the last line of defence for all of them
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except SystemExit as exc:  # sys.exit(n), or sys.exit("message") from a command refusing its input
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(f"labsupport {name}: error: {one_line(exc.code)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"labsupport {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - never a traceback, whatever the input
        print(f"labsupport {name}: internal error (a labsupport bug; please report it): {type(exc).__name__}: "
              f"{one_line(exc)}", file=sys.stderr)
        return 1


def _tolerant_streams() -> None:
    """A name or value that the terminal's encoding cannot show is escaped, not a crash."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass


def _exit(code: int) -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # `| head` closed the pipe: do not let the interpreter complain on exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(code)


if __name__ == "__main__":
    _tolerant_streams()
    _exit(main())
