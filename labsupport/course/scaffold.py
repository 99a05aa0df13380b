"""`python -m labsupport checkoff new N.M --kind value|function|choice --title TEXT`: scaffold a checkoff (staff).

Writes the two places a checkoff lives, each with a ``...`` where the author's work goes, and
prints the steps left (COURSE_AUTHORING.md walks through them):

    solutions/NN_topic.py                 an exercise cell: the prompt, a solution region, check("N.M", ...)
    labsupport/course/checkoffs/labNN.py  the registration: title, the expected formula, hint

The build refuses the checkoff until every ``...`` is filled in, so nothing half-written ships.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError

ROOT = Path(__file__).resolve().parents[2]

SOURCE = {
    "value": '''

# %% [markdown]
# ### Exercise {id} — {title}
#
# ...

# %%
### BEGIN SOLUTION {id}: set {name} to ... (computed from the givens cell's names)
{name} = ...
### END SOLUTION
check("{id}", {name})
''',
    "function": '''

# %% [markdown]
# ### Exercise {id} — {title}
#
# ...

# %%
def {name}(...):
    """..."""
    ### BEGIN SOLUTION {id}: return ...
    ...
    ### END SOLUTION


# %%
check("{id}", {name})
''',
    "choice": '''

# %% [markdown]
# ### Exercise {id} — {title}
#
# ... (list the options the student chooses from)

# %%
### BEGIN SOLUTION {id}: set {name} to one of the options above
{name} = ...
### END SOLUTION
check("{id}", {name})
''',
}

GRADER = {
    "value": '''

value(
    "{id}", "{title}",
    expected=...,  # lambda g: a formula of the givens (g.NAME), derived by hand, never the lab's own code
    hint="...",  # how to think about it, never the answer
    unit="",  # " B", " tok/s": shown after the student's number
    mistakes=[],  # (the answer a slip gives on the lecture's givens, "the remark that names the slip")
)
''',
    "function": '''

@function("{id}", "{title}", hint="...", name="{name}")
def _{name}(rng):
    """The lab's own cases, then random ones from `rng` (public in check(), hidden in grade)."""
    for ... in ...:
        yield case(..., want=...)  # inputs as plain data (live(...) for labsupport's objects), and the answer
''',
    "choice": '''

choice(
    "{id}", "{title}",
    answer=...,  # one option, or a set of options
    options=(...),
    hint="...",
    mistakes={{}},  # option -> why it is not the answer
)
''',
}


def scaffold(checkoff_id: str, kind: str, title: str, root: Path = ROOT) -> list[Path]:
    if not re.match(r"^\d+\.\d+$", checkoff_id):
        raise UsageError(f"the id is lab.number, e.g. 3.12; got {checkoff_id!r}")
    lab = int(checkoff_id.split(".")[0])
    sources = sorted((root / "solutions").glob(f"{lab:02d}_*.py"))
    grader = root / "labsupport" / "course" / "checkoffs" / f"lab{lab:02d}.py"
    if not sources or not grader.is_file():
        raise UsageError(f"lab {lab:02d} has no source solutions/{lab:02d}_*.py and grader module {grader.name}")
    texts = [sources[0].read_text(encoding="utf-8"), grader.read_text(encoding="utf-8")]
    if f'"{checkoff_id}"' in texts[1] or f'check("{checkoff_id}"' in texts[0]:
        raise UsageError(f"checkoff {checkoff_id} already exists in lab {lab:02d}")
    if '"' in title or not title.strip():
        raise UsageError("--title is one line of text without double quotes")
    fill = {"id": checkoff_id, "title": title.strip(), "name": f"answer_{checkoff_id.replace('.', '_')}"}
    sources[0].write_text(texts[0].rstrip("\n") + "\n" + SOURCE[kind].format(**fill), encoding="utf-8")
    grader.write_text(texts[1].rstrip("\n") + "\n" + GRADER[kind].format(**fill), encoding="utf-8")
    return [sources[0], grader]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m labsupport checkoff", description="Scaffold a new checkoff in its two files.")
    p.add_argument("action", choices=("new",))
    p.add_argument("id", help="lab.number, e.g. 3.12")
    p.add_argument("--kind", choices=sorted(SOURCE), default="value")
    p.add_argument("--title", required=True)
    try:
        args = p.parse_args(argv)
        written = scaffold(args.id, args.kind, args.title)
    except UsageError as exc:
        print(f"checkoff: {exc}", file=sys.stderr)
        return 2
    print(f"checkoff: added {args.id} to {written[0].relative_to(ROOT)} and {written[1].relative_to(ROOT)}.\n"
          "Next (COURSE_AUTHORING.md): move the exercise's cells to where the lab poses it; fill in every `...` "
          "in both files (a new given goes into the givens cell and the graders' hidden generator); `python -m "
          f"labsupport build {args.id.split('.')[0].zfill(2)}`; a feedback test in tests/; grade the solution.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
