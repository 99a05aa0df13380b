"""`python -m labsupport checkoff new N.M --kind value|function|choice --title TEXT`: scaffold a checkoff (staff):
the exercise in solutions/NN_topic.py and its registration in labsupport/course/checkoffs/labNN.py, with a ``...``
wherever the author's work goes; the build refuses the checkoff until none is left (COURSE_AUTHORING.md)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError

ROOT = Path(__file__).resolve().parents[2]
EXERCISE = '''# %% [markdown]
# ### Exercise {id} — {title}
#
# ...{options}

# %%
'''
SET = '''### BEGIN SOLUTION {id}: set {name} to {value}
{name} = ...
### END SOLUTION
check("{id}", {name})
'''
FUNCTION = '''def {name}(...):
    """..."""
    ### BEGIN SOLUTION {id}: return ...
    ...
    ### END SOLUTION


# %%
check("{id}", {name})
'''
GRADER = {
    "value": '''value(
    "{id}", "{title}",
    expected=...,  # lambda g: a formula of the givens (g.NAME), derived by hand, never the lab's own code
    hint="...",  # how to think about it, never the answer
    unit="",  # " B", " tok/s": shown after the student's number
    mistakes=[],  # (the answer a slip gives on the lecture's givens, "the remark that names the slip")
)
''',
    "function": '''@function("{id}", "{title}", hint="...", name="{name}")
def _{name}(rng):
    """The lab's own cases, then random ones from `rng` (public in check(), hidden in grade)."""
    for ... in ...:
        yield case(..., want=...)  # inputs as plain data (live(...) for labsupport's objects), and the answer
''',
    "choice": '''choice(
    "{id}", "{title}",
    answer=...,  # one option, or a set of options
    options=(...),
    hint="...",
    mistakes={{}},  # option -> why it is not the answer
)
''',
}


def scaffold(checkoff_id: str, kind: str, title: str, root: Path = ROOT) -> list[Path]:
    """Append checkoff `checkoff_id` to its lab source and its graders; returns the two files."""
    if not re.match(r"^\d+\.\d+$", checkoff_id):
        raise UsageError(f"the id is lab.number, e.g. 3.12; got {checkoff_id!r}")
    lab = int(checkoff_id.split(".")[0])
    sources = sorted((root / "solutions").glob(f"{lab:02d}_*.py"))
    grader = root / "labsupport" / "course" / "checkoffs" / f"lab{lab:02d}.py"
    if not sources or not grader.is_file():
        raise UsageError(f"lab {lab:02d} has no source solutions/{lab:02d}_*.py and grader module {grader.name}")
    paths = [sources[0], grader]
    texts = [path.read_text(encoding="utf-8") for path in paths]
    if f'"{checkoff_id}"' in texts[1] or f'check("{checkoff_id}"' in texts[0]:
        raise UsageError(f"checkoff {checkoff_id} already exists in lab {lab:02d}")
    if '"' in title or not title.strip():
        raise UsageError("--title is one line of text without double quotes")
    fill = {"id": checkoff_id, "title": title.strip(), "name": f"answer_{checkoff_id.replace('.', '_')}",
            "options": " (list the options the student chooses from)" if kind == "choice" else "",
            "value": "one of the options above" if kind == "choice" else "... (computed from the givens cell's names)"}
    for path, text, added in zip(paths, texts, (EXERCISE + (FUNCTION if kind == "function" else SET), GRADER[kind])):
        path.write_text(text.rstrip("\n") + "\n\n\n" + added.format(**fill), encoding="utf-8")
    return paths


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m labsupport checkoff", description="Scaffold a new checkoff in its two files.")
    p.add_argument("action", choices=("new",))
    p.add_argument("id", help="lab.number, e.g. 3.12")
    p.add_argument("--kind", choices=sorted(GRADER), default="value")
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
