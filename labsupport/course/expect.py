"""`python -m labsupport expect NOTEBOOK OUT`: a copy of a finished notebook for `pytest --nbval-lax` (GRADING.md).

A student copy stores no outputs, so nothing in it looks like a pass before it has run.  nbval compares the
outputs a notebook stores, so this writes a copy in which each checkoff cell (tagged ``checkoff``) stores its
pass line, one per ``check("N.M", ...)`` it calls, and nothing else changes; ``pytest --nbval-lax OUT`` then fails
every checkoff cell that does not print exactly those lines.  Like every static check, it trusts the notebook's
own cells: a grade rests on `grade`, which re-runs the notebook on hidden givens.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course.build import CHECK_RE, TAG_CHECKOFF
from labsupport.course.checkoff import PASS_LINE


def expect_passes(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` with each checkoff cell's pass lines as its stored output (and an execution count, which nbval needs)."""
    nb = nbformat.from_dict(nb)
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        count += 1
        ids = CHECK_RE.findall(cell.source)
        if TAG_CHECKOFF in cell.metadata.get("tags", []) and ids:
            text = "".join(PASS_LINE.format(id=i) + "\n" for i in ids)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
            cell.execution_count = count
    return nb


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m labsupport expect",
                      description="Write a copy of a notebook whose checkoff cells expect their pass lines, "
                                  "for pytest --nbval-lax.")
    p.add_argument("notebook", help="a lab notebook (a student's finished copy)")
    p.add_argument("out", help="where to write the copy (not the notebook itself)")
    try:
        args = p.parse_args(argv)
        src, out = Path(args.notebook), Path(args.out)
        if src.resolve() == out.resolve():
            raise UsageError(f"out {args.out}: is the notebook itself; write the copy elsewhere")
        try:
            nb = nbformat.read(src, as_version=4)
        except OSError as exc:
            raise UsageError(f"notebook {args.notebook}: cannot read it ({exc.strerror})") from None
        except Exception as exc:  # noqa: BLE001 - not JSON, or not a notebook: one line
            raise UsageError(f"notebook {args.notebook}: not a Jupyter notebook ({type(exc).__name__})") from None
        copy = expect_passes(nb)
        if not any(TAG_CHECKOFF in c.metadata.get("tags", []) for c in copy.cells):
            raise UsageError(f"notebook {args.notebook}: has no checkoff cells (tagged '{TAG_CHECKOFF}')")
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(copy, out)
    except UsageError as exc:
        print(f"expect: {exc}", file=sys.stderr)
        return 2
    print(f"expect: wrote {out}; run: pytest --nbval-lax {out}")
    return 0
