"""The scoreboard that closes every lab: this kernel's checkoffs, passed / failed / not attempted (every lab).

The build appends one cell to each lab, ``scoreboard("02_naive_allocator")``.  It reads
`checkoff.results()`, the outcomes `check()` printed in this kernel session, so it is feedback for
the student and decides nothing: the grade comes from ``python -m labsupport grade``, which runs
the saved notebook in a fresh kernel.  A checkoff whose cell has not run in this session counts as
not attempted.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

from labsupport.course.checkoff import FAILED, NOT_ATTEMPTED, PASSED, SYMBOLS, load_lab, results


@dataclass(frozen=True)
class Row:
    id: str
    title: str
    status: str


@dataclass(frozen=True)
class Scoreboard:
    notebook: str  # the lab's name, e.g. "02_naive_allocator"
    rows: tuple[Row, ...]

    def count(self, status: str) -> int:
        return sum(row.status == status for row in self.rows)

    @property
    def summary(self) -> str:
        return (f"{self.count(PASSED)} of {len(self.rows)} passed, {self.count(FAILED)} failed, "
                f"{self.count(NOT_ATTEMPTED)} not attempted in this kernel")

    @property
    def grade_command(self) -> str:
        return f"python -m labsupport grade notebooks/{self.notebook}.ipynb"

    def text(self) -> str:
        lines = [f"Checkoffs of {self.notebook}: {self.summary}"]
        lines += [f"  {SYMBOLS[r.status]} {r.id:<5} {r.status:<14} {r.title}" for r in self.rows]
        lines.append(f"This is feedback; the grade: save, then `{self.grade_command}` from the repository root.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        cell = "padding:2px 10px;text-align:left"
        body = "".join(
            f'<tr><td style="{cell}">{html.escape(r.id)}</td><td style="{cell}">{SYMBOLS[r.status]} {html.escape(r.status)}</td>'
            f'<td style="{cell}">{html.escape(r.title)}</td></tr>'
            for r in self.rows)
        return (f'<div class="lab-scoreboard" style="font-size:16px;line-height:1.5">'
                f"<b>Checkoffs of {html.escape(self.notebook)}</b>: {html.escape(self.summary)}"
                f'<table style="border-collapse:collapse;margin:6px 0">'
                f'<thead><tr><th scope="col" style="{cell}">checkoff</th><th scope="col" style="{cell}">status</th>'
                f'<th scope="col" style="{cell}">exercise</th></tr></thead><tbody>{body}</tbody></table>'
                f"This table is feedback from this kernel (run this cell again to refresh it). The grade: save "
                f"the notebook, then run <code>{html.escape(self.grade_command)}</code> from the repository root."
                f"</div>")


def scoreboard(notebook: str) -> Scoreboard:
    """The lab's registered checkoffs with what `check()` recorded for each in this kernel."""
    match = re.match(r"^(\d\d)_", notebook)
    if not match:
        raise ValueError(f"scoreboard wants a lab's name like '02_naive_allocator', got {notebook!r}")
    session = results()
    rows = tuple(Row(c["id"], c["title"], session.get(c["id"], {}).get("status", NOT_ATTEMPTED))
                 for c in load_lab(int(match[1])))
    return Scoreboard(notebook, rows)
