"""`python -m labsupport build`: one hand-edited source per lab becomes its two notebooks (every lab).

    solutions/NN_topic.py   the source: a jupytext "percent" file, edited by hand
      -> solutions/NN_topic.ipynb   executed, outputs kept: the instructor's copy, checked by nbval
      -> notebooks/NN_topic.ipynb   the student's copy: solutions cut out, outputs cleared

In the source:
  * ``### BEGIN SOLUTION N.M: prompt`` ... ``### END SOLUTION`` (nbgrader's markers, plus the checkoff
    the region serves and a one-line prompt) is cut from the student copy and replaced, at the same
    indentation, by the comment ``# <to-do word> N.M: prompt`` and a placeholder that never stops
    Run All (the placeholder contract, which `check()` and `grade` rely on):
      - in a function's body: ``raise NotImplementedError("<to-do word> N.M: prompt")``, raised only
        when the function is called; check() reports it "not attempted";
      - anywhere else: ``name = ...`` (Python's Ellipsis) for each name the region binds that code
        after it reads before setting it again (``pass`` when none and the block needs a
        statement); check() reports ``...`` — alone or in a list, tuple, set or dict — "not attempted".
    Every checkoff of a lab needs at least one region of its own.
  * a cell tagged ``solution-only`` (``# %% tags=["solution-only"]``) is left out of the student copy.
  * a cell calling ``check("N.M", ...)`` is a checkoff cell.  The build tags it ``checkoff`` and
    ``nbval-check-output``; in the student copy it keeps one output, the line it prints when passed
    (with an execution count: nbval will not compare an "unrun" cell), so ``pytest --nbval-lax
    notebooks/NN_topic.ipynb`` compares it.  Checkoff cells must print nothing else.
  * a cell tagged ``needs-traces`` prints or draws numbers that come from a real trace: without the
    traces (a fresh clone) strict nbval runs it but does not compare its outputs.  Building a lab
    with such cells while a trace is missing says so in one line: its outputs come from the
    synthetic stand-ins and are not the ones to commit (``python -m labsupport traces``).
  * code after an exercise must not need the student's answer: it recomputes what it needs with
    labsupport, or, when it runs the student's own function, waits behind ``if unlocked("N.M"):``.

The build adds three cells to both copies: before the first code cell, the Colab set-up cell (a
no-op anywhere else; it clones pyproject.toml's ``Repository`` URL), and, for a lab, a closing
heading and ``scoreboard(...)``: this kernel's checkoffs and the command that grades.

Building runs both copies in a fresh kernel: the solution must run without an error with every
checkoff passed; the student copy runs top to bottom, stopping at its first error as Run All does,
and must reach its last cell with every checkoff cell printing its "not attempted" line.

Both notebooks run with their own folder as the working directory (as JupyterLab and nbval run
them); solutions/ and notebooks/ sit at the same depth, so a relative path works in both.  Cell ids
come from the lab's name and the cell's position in the source, and student and solution cells that
correspond share an id; with machine metadata and widget views dropped (see `finalize`), rebuilding
a lab whose outputs are deterministic changes no byte.

Labs numbered 90–99 are instructors' notebooks (the board): they may have no checkoffs, and get no
scoreboard.  They still get a copy in notebooks/.

``--check`` compares the committed notebooks with what the sources generate (cells, sources,
metadata; the student copy entirely) and lists the differences; nbval checks the solutions' outputs.
``--no-execute`` rebuilds without running anything, keeping a solution cell's outputs while its
source is unchanged.  Exit codes: 0 done; 1 a notebook does not run as it must, or --check found a
difference; 2 bad input (a flag, a lab name, a lab source unreadable, not UTF-8, or breaking a rule
above), reported in one line.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course import record
from labsupport.course.checkoff import NOT_ATTEMPTED_LINE, PASS_LINE, PROMPT_WORD, plain
from labsupport.course.checkoffs import load_lab

BEGIN_MARK = "### BEGIN SOLUTION"
END_MARK = "### END SOLUTION"
TAG_SOLUTION_ONLY = "solution-only"
TAG_CHECKOFF = "checkoff"
TAG_NBVAL_CHECK = "nbval-check-output"
TAG_RAISES = "raises-exception"
TAG_SCOREBOARD = "scoreboard"
TAG_FRONT_END = "front-end"
TAG_NEEDS_TRACES = "needs-traces"
SOURCE_PATTERN = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.py$")
BEGIN_RE = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION(?:[ \t]+(?P<id>\d+\.\d+))?[ \t]*:?[ \t]*(?P<prompt>.*?)[ \t]*$")
END_RE = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
CHECK_RE = re.compile(r"""^[ \t]*(?:[\w.]+\.)?check\(\s*["'](\d+\.\d+)["']""", re.M)

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
LANGUAGE_INFO = {"name": "python", "pygments_lexer": "ipython3", "file_extension": ".py",
                 "mimetype": "text/x-python", "codemirror_mode": {"name": "ipython", "version": 3},
                 "nbconvert_exporter": "python"}
PLACEHOLDER_TEXT = "..."  # what data.contains_unfinished recognises, as Python source
CELL_TIMEOUT_S = 600
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class BuildError(ValueError):
    """A lab source breaks a rule of the pipeline; the message names the lab and the cell."""


class ExecutionFailure(BuildError):
    """A generated notebook does not run as it must (a solution raised, a student copy stops)."""


@dataclass(frozen=True)
class Lab:
    source: Path  # solutions/NN_topic.py
    root: Path

    @property
    def name(self) -> str:
        return self.source.stem

    @property
    def number(self) -> int:
        return int(self.name[:2])

    @property
    def instructor(self) -> bool:
        """Labs 90–99 are for instructors (the board): no checkoffs required."""
        return self.number >= 90

    @property
    def solution_path(self) -> Path:
        return self.root / "solutions" / f"{self.name}.ipynb"

    @property
    def student_path(self) -> Path:
        return self.root / "notebooks" / f"{self.name}.ipynb"


@dataclass
class Region:
    checkoff_id: str
    prompt: str
    cell: int
    cell_id: str = ""


@dataclass
class Parsed:
    lab: Lab
    solution: nbformat.NotebookNode
    student: nbformat.NotebookNode
    regions: list[Region] = field(default_factory=list)
    checkoffs: dict[str, int] = field(default_factory=dict)  # checkoff id -> solution cell index
    check_cells: dict[str, str] = field(default_factory=dict)  # checkoff id -> its check() cell's id


# --- discovering labs ---------------------------------------------------------------------------

def discover(root: Path, names: list[str] | None = None) -> list[Lab]:
    """Lab sources under root/solutions, optionally only those named ('01', '01_five_jobs', a path)."""
    folder = Path(root) / "solutions"
    labs = [Lab(p, Path(root)) for p in sorted(folder.glob("*.py")) if SOURCE_PATTERN.match(p.name)]
    if not names:
        return labs
    chosen = []
    for name in names:
        key = Path(name).stem
        hits = [lab for lab in labs if lab.name == key or lab.name.startswith(key + "_") or lab.name[:2] == key]
        if not hits:
            raise BuildError(f"no lab source matches {name!r} in {folder}; have: {', '.join(l.name for l in labs) or 'none'}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


# --- turning a source into the two notebooks -------------------------------------------------

def cell_id(lab_name: str, position: int | str) -> str:
    return hashlib.sha1(f"{lab_name}:{position}".encode()).hexdigest()[:16]


def todo_message(checkoff_id: str, prompt: str) -> str:
    return f"{PROMPT_WORD} {checkoff_id}: {prompt}"


@dataclass
class RegionText:
    """One solution region of a cell as written: where it starts and the lines between its markers."""

    indent: str
    checkoff_id: str
    prompt: str
    begin: int  # 1-based line of the BEGIN marker
    lines: list[str] = field(default_factory=list)


def find_regions(source: str, where: str) -> list[RegionText]:
    """Every solution region of a code cell, with its lines (markers excluded), checked for balance."""
    regions, current = [], None
    for number, line in enumerate(source.split("\n"), start=1):
        begin, end = BEGIN_RE.match(line), END_RE.match(line)
        if begin:
            if current:
                raise BuildError(f"{where}, line {number}: a solution region opens inside another one")
            if not begin["id"] or not begin["prompt"]:
                raise BuildError(f"{where}, line {number}: write '{BEGIN_MARK} N.M: <prompt for the student>' "
                                 f"(the checkoff it serves and a one-line prompt); got {line.strip()!r}")
            current = RegionText(begin["indent"], begin["id"], begin["prompt"], number)
        elif end:
            if not current:
                raise BuildError(f"{where}, line {number}: '{END_MARK}' without a matching '{BEGIN_MARK}'")
            regions.append(current)
            current = None
        elif current:
            current.lines.append(line)
    if current:
        raise BuildError(f"{where}, line {current.begin}: '{BEGIN_MARK}' is never closed by '{END_MARK}'")
    return regions


def strip_regions(source: str) -> str:
    """The cell with each region's lines blanked and one `pass` in its place (same line numbers)."""
    out, indent = [], None
    for line in source.split("\n"):
        begin, end = BEGIN_RE.match(line), END_RE.match(line)
        if begin:
            indent = begin["indent"]
            out.append(f"{indent}pass")
        elif end:
            indent = None
            out.append("")
        else:
            out.append("" if indent is not None else line)
    return "\n".join(out)


def _bindings(statements) -> list[tuple[str, tuple[int, int]]]:
    """(name, where it takes effect) for each name the statements bind at their own level, in order.

    Into if/for/with/try bodies, never into a def's or a class's.  An assignment binds once its
    right-hand side has run (the statement's end); a for or with target before the body runs.
    """
    found: list[tuple[str, tuple[int, int]]] = []

    def target(node, at) -> None:
        if isinstance(node, ast.Name):
            found.append((node.id, at or (node.lineno, node.col_offset)))
        elif isinstance(node, (ast.Tuple, ast.List)):
            for item in node.elts:
                target(item, at)
        elif isinstance(node, ast.Starred):
            target(node.value, at)

    for st in statements:
        end = (st.end_lineno, 10**9)
        if isinstance(st, ast.Assign):
            for t in st.targets:
                target(t, end)
        elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
            target(st.target, end)
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((st.name, end))
            continue
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            target(st.target, None)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                if item.optional_vars is not None:
                    target(item.optional_vars, None)
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            found += [((a.asname or a.name).split(".")[0], end) for a in st.names]
        found += [(n.target.id, (n.end_lineno, n.end_col_offset)) for n in ast.walk(st) if isinstance(n, ast.NamedExpr)]
        for body in ("body", "orelse", "finalbody"):
            found += _bindings(getattr(st, body, []))
        for handler in getattr(st, "handlers", []):
            found += _bindings(handler.body)
        for case in getattr(st, "cases", []):
            found += _bindings(case.body)
    return found


def names_bound(code: str, where: str) -> list[str]:
    """Names a solution region's code binds at its own level, in order."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError as exc:
        raise BuildError(f"{where}: a solution region outside a function must be whole statements "
                         f"({exc.msg}, line {exc.lineno} of the region)") from None
    return list(dict.fromkeys(name for name, _ in _bindings(tree.body)))


def first_uses(source: str, after_line: int = 0) -> dict[str, str] | None:
    """For each name a cell uses after `after_line`: "read" if its first use reads it, "bound" if the cell
    sets it before reading it.  None when the cell is not plain Python (then assume it reads everything)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    events = [((n.lineno, n.col_offset), n.id, "read") for n in ast.walk(tree)
              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.lineno > after_line]
    events += [(at, name, "bound") for name, at in _bindings(tree.body) if at[0] > after_line]
    uses: dict[str, str] = {}
    for _, name, kind in sorted(events):
        uses.setdefault(name, kind)
    return uses


def still_needed(name: str, uses: list[dict[str, str] | None]) -> bool:
    """Does code run after a region read `name` before setting it again?  `uses`: first_uses, in order."""
    for cell in uses:
        kind = "read" if cell is None else cell.get(name)
        if kind:
            return kind == "read"
    return False


def function_lines(source: str, where: str) -> set[int]:
    """Lines inside the body of some function of the cell: a region there raises when called."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise BuildError(f"{where}, line {exc.lineno}: a cell with a solution region must be plain Python "
                         f"({exc.msg})") from None
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(range(node.lineno + 1, node.end_lineno + 1))
    return inside


def cut_solutions(source: str, where: str, later: list[dict[str, str] | None] = ()) -> tuple[str, list[tuple[str, str]]]:
    """Replace every solution region of a code cell by its prompt; return the new source and (id, prompt)s.

    In a function body the region becomes ``raise NotImplementedError("<N.M prompt>")``: the
    function raises when called, and check() reports it as not attempted.  Anywhere else it becomes
    one ``name = ...`` per name it binds that code after it reads before setting it again (`later`:
    `first_uses` of the later cells of the student copy): nothing raises at the top level, so Run All
    reaches the end, and the placeholder names only what the rest of the notebook needs.
    """
    regions = find_regions(source, where)
    if not regions:
        return source, []
    in_function = function_lines(source, where)
    stripped = strip_regions(source)
    lines = source.split("\n")
    out, found, skip_until = [], [], 0
    by_begin = {r.begin: r for r in regions}
    for number, line in enumerate(lines, start=1):
        if number <= skip_until:
            continue
        region = by_begin.get(number)
        if region is None:
            out.append(line)
            continue
        end = region.begin + len(region.lines) + 1
        skip_until = end
        message = todo_message(region.checkoff_id, region.prompt)
        out.append(f"{region.indent}# {message}")
        if region.begin in in_function:
            out.append(f"{region.indent}raise NotImplementedError({json.dumps(message, ensure_ascii=False)})")
        else:
            uses = [first_uses(stripped, after_line=end), *later]
            names = [n for n in names_bound("\n".join(region.lines), f"{where}, line {region.begin}")
                     if still_needed(n, uses)]
            out += [f"{region.indent}{name} = {PLACEHOLDER_TEXT}" for name in names]
            if not names and region.indent:
                out.append(f"{region.indent}pass")
        found.append((region.checkoff_id, region.prompt))
    return "\n".join(out), found


def _clean_metadata(metadata: dict, extra_tags: list[str] = ()) -> dict:
    tags = list(dict.fromkeys([*metadata.get("tags", []), *extra_tags]))
    return {"tags": tags} if tags else {}


def _notebook(cells: list) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = nbformat.from_dict({"kernelspec": dict(KERNELSPEC), "language_info": copy.deepcopy(LANGUAGE_INFO)})
    nb.cells = cells
    return nb


def read_source(lab: Lab) -> str:
    try:
        return lab.source.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BuildError(f"{lab.source}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); "
                         f"save the lab source as UTF-8") from None
    except OSError as exc:
        raise BuildError(f"{lab.source}: cannot read it ({exc.strerror})") from None


def parse(lab: Lab) -> Parsed:
    """Read a lab source and generate both notebooks (the solution not yet executed)."""
    import jupytext

    source_nb = jupytext.reads(read_source(lab), fmt="py:percent")
    student_code = {position: strip_regions(cell.source) for position, cell in enumerate(source_nb.cells)
                    if cell.cell_type == "code" and TAG_SOLUTION_ONLY not in cell.metadata.get("tags", [])}
    uses_of = {position: first_uses(code) for position, code in student_code.items()}
    sol_cells, stu_cells, regions, checkoffs, check_cells = [], [], [], {}, {}
    for position, cell in enumerate(source_nb.cells):
        where = f"{lab.source.name}, cell {position + 1}"
        body = cell.source
        tags = list(cell.metadata.get("tags", []))
        ids = CHECK_RE.findall(body) if cell.cell_type == "code" else []
        solution_only = TAG_SOLUTION_ONLY in tags
        if solution_only and (ids or BEGIN_MARK in body):
            raise BuildError(f"{where}: a solution-only cell cannot hold a checkoff or a solution region")
        for checkoff_id in ids:
            if int(checkoff_id.split(".")[0]) != lab.number:
                raise BuildError(f"{where}: checkoff {checkoff_id} belongs to lab {checkoff_id.split('.')[0]}, "
                                 f"not to lab {lab.number:02d}")
            if checkoff_id in checkoffs:
                raise BuildError(f"{where}: checkoff {checkoff_id} is checked twice (first in cell "
                                 f"{checkoffs[checkoff_id] + 1})")
            checkoffs[checkoff_id] = len(sol_cells)
        extra = [TAG_CHECKOFF, TAG_NBVAL_CHECK] if ids else []
        meta = _clean_metadata(cell.metadata, extra)
        cid = cell_id(lab.name, position)
        check_cells.update({i: cid for i in ids})
        if cell.cell_type == "markdown":
            if BEGIN_MARK in body:
                raise BuildError(f"{where}: solution regions belong in code cells; tag a markdown answer "
                                 f"cell '{TAG_SOLUTION_ONLY}' instead")
            sol = nbformat.v4.new_markdown_cell(body, metadata=meta, id=cid)
            stu = nbformat.v4.new_markdown_cell(body, metadata=copy.deepcopy(meta), id=cid)
        elif cell.cell_type == "code":
            later = [uses for other, uses in uses_of.items() if other > position]
            student_body, found = cut_solutions(body, where, later)
            regions += [Region(i, p, len(sol_cells), cid) for i, p in found]
            for checkoff_id, _ in found:
                if int(checkoff_id.split(".")[0]) != lab.number:
                    raise BuildError(f"{where}: solution region {checkoff_id} is not a checkoff of lab {lab.number:02d}")
            sol = nbformat.v4.new_code_cell(body, metadata=meta, id=cid)
            stu = nbformat.v4.new_code_cell(student_body, metadata=copy.deepcopy(meta), id=cid)
            if ids:
                stu.outputs = [nbformat.v4.new_output(
                    "stream", name="stdout", text="".join(PASS_LINE.format(id=i) + "\n" for i in ids))]
                # nbval refuses a cell with outputs and no execution count ("unrun reference cell").
                stu.execution_count = 1 + sum(c.cell_type == "code" for c in stu_cells)
        else:
            sol = nbformat.v4.new_raw_cell(body, metadata=meta, id=cid)
            stu = nbformat.v4.new_raw_cell(body, metadata=copy.deepcopy(meta), id=cid)
        sol_cells.append(sol)
        if not solution_only:
            stu_cells.append(stu)
    if not lab.instructor:
        for made in scoreboard_cells(lab, len(source_nb.cells)):
            sol_cells.append(made)
            stu_cells.append(copy.deepcopy(made))
    first_code = next((i for i, c in enumerate(sol_cells) if c.cell_type == "code"), len(sol_cells))
    sol_cells.insert(first_code, colab_cell(lab))
    first_code = next((i for i, c in enumerate(stu_cells) if c.cell_type == "code"), len(stu_cells))
    stu_cells.insert(first_code, colab_cell(lab))
    parsed = Parsed(lab, _notebook(sol_cells), _notebook(stu_cells), regions, checkoffs, check_cells)
    _validate(parsed)
    return parsed


REPO_PLACEHOLDER = "https://github.com/<your-org>/<these-labs>.git"
COLAB_CELL = '''# Google Colab only (anywhere else this cell does nothing): fetch and install the labs, then let Colab
# draw their widgets (the sliders and plotly's FigureWidget are third-party widgets there).
import sys

if "google.colab" in sys.modules:
    import os
    import subprocess

    from google.colab import output

    LABS_REPO = "{repo}"  # where your course publishes these labs
    output.enable_custom_widget_manager()
    if "<" in LABS_REPO:
        print("Colab: set LABS_REPO in this cell to your course's clone URL of these labs, then run it again.")
    elif not os.path.isdir("/content/labs"):
        subprocess.run(["git", "clone", "-q", LABS_REPO, "/content/labs"], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/labs"], check=True)
    if os.path.isdir("/content/labs/notebooks"):
        sys.path.insert(0, "/content/labs")  # this kernel started before the install
        os.chdir("/content/labs/notebooks")  # the labs read their files relative to notebooks/'''


def repository_url(root: Path) -> str:
    """pyproject.toml's ``Repository`` URL (under [project.urls]), which the Colab cell clones; a
    placeholder the cell explains when there is none."""
    try:
        text = (Path(root) / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return REPO_PLACEHOLDER
    found = re.search(r'^\[project\.urls\][^\[]*?^Repository\s*=\s*"([^"]+)"', text, re.M | re.S)
    return found[1] if found else REPO_PLACEHOLDER


def colab_cell(lab: Lab) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(COLAB_CELL.format(repo=repository_url(lab.root)),
                                     metadata={"tags": [TAG_FRONT_END]}, id=cell_id(lab.name, "colab"))


def scoreboard_cells(lab: Lab, position: int) -> list:
    """The lab's closing cells: a heading and the scoreboard of this kernel's checkoffs."""
    heading = nbformat.v4.new_markdown_cell(
        "## Your checkoffs\n\nWhat `check()` said in this kernel, checkoff by checkoff. It is feedback: the grade "
        "comes from `python -m labsupport grade`, which runs your saved notebook in a fresh kernel.",
        id=cell_id(lab.name, position))
    board = nbformat.v4.new_code_cell(
        f"from labsupport.course.scoreboard import scoreboard\n\nscoreboard({lab.name!r})",
        metadata={"tags": [TAG_SCOREBOARD]}, id=cell_id(lab.name, position + 1))
    return [heading, board]


def _graders(lab: Lab) -> list:
    """The lab's checkoffs, or a BuildError naming what is wrong in its grader module."""
    try:
        return load_lab(lab.number)
    except (ValueError, TypeError, AttributeError, NameError, SyntaxError) as exc:
        raise BuildError(f"{lab.name}: labsupport/course/checkoffs/lab{lab.number:02d}.py: {exc}") from None


def check_hidden_givens(lab: Lab, checkoffs: list, draws: int = 8) -> None:
    """Every value checkoff with givens has another answer on each hidden set: a number typed in from the
    lecture's givens must fail there.  The error names the checkoff and the set."""
    from labsupport.course import data, judge
    from labsupport.course.registry import GIVENS, case_rng, namespace

    if lab.number not in GIVENS:
        return
    sets = GIVENS[lab.number].draw(case_rng("givens", b"build check"), draws)
    for c in (c for c in checkoffs if c.takes_givens):
        lecture = data.parse(data.dumps(c.expect()))
        for g in sets:
            try:
                judge.verdict(lecture, judge.readable(c.value_spec(namespace(g))))
            except judge.Mismatch:
                continue
            raise BuildError(f"{lab.name}: checkoff {c.id} has the same answer on the lecture's givens and on hidden "
                             f"givens {g}: its hidden generator must change every answer (see COURSE_AUTHORING.md)")


def _validate(parsed: Parsed) -> None:
    lab = parsed.lab
    checkoffs = _graders(lab)
    registered = {c.id for c in checkoffs}
    used = set(parsed.checkoffs)
    if not used and not registered and not lab.instructor:
        raise BuildError(f"{lab.name} has no checkoffs: register them in labsupport/course/checkoffs/"
                         f"lab{lab.number:02d}.py and call check() (only the instructors' labs 90-99 may have none)")
    unknown = sorted(used - registered)
    if unknown:
        raise BuildError(f"{lab.name}: checkoffs {unknown} are not registered in labsupport/course/checkoffs/lab{lab.number:02d}.py")
    unused = sorted(registered - used)
    if unused:
        raise BuildError(f"{lab.name}: registered checkoffs {unused} have no check() cell in the source")
    with_regions = {r.checkoff_id for r in parsed.regions}
    bare = sorted(used - with_regions)
    if bare:
        raise BuildError(f"{lab.name}: checkoffs {bare} have no '{BEGIN_MARK} N.M: ...' region for the student to fill")
    orphan = sorted(with_regions - used)
    if orphan:
        raise BuildError(f"{lab.name}: solution regions {orphan} serve no check() cell")
    check_givens(parsed)
    check_hidden_givens(lab, checkoffs)


TAG_GIVENS = "givens"


def check_givens(parsed: Parsed) -> None:
    """A lab with givens has exactly one cell tagged ``givens``, binding constants only, each of which its
    graders' hidden generator varies (labsupport.course.registry reads the lecture's values from that cell)."""
    from labsupport.course.registry import GIVENS, case_rng, givens_cell

    lab = parsed.lab
    cells = [c for c in parsed.solution.cells if TAG_GIVENS in c.metadata.get("tags", [])]
    declared = GIVENS.get(lab.number)
    if declared is None:
        if cells:
            raise BuildError(f"{lab.name}: a cell is tagged '{TAG_GIVENS}' but labsupport/course/checkoffs/"
                             f"lab{lab.number:02d}.py declares no givens()")
        return
    if len(cells) != 1:
        raise BuildError(f"{lab.name}: lab {lab.number:02d} declares givens, so exactly one code cell must be tagged "
                         f"'{TAG_GIVENS}' (found {len(cells)})")
    try:
        givens_cell(cells[0].source, f"{lab.source.name}, the givens cell")
        declared.draw(case_rng("givens", b"build"), 2)
    except ValueError as exc:
        raise BuildError(str(exc)) from None


def record_of(parsed: Parsed) -> dict:
    """The lab's public record (labsupport.course.record), worked out from its graders on the lecture's
    givens and the lab's own cases."""
    from labsupport.course.registry import GIVENS, case_rng

    lab = parsed.lab
    entries = []
    for c in _graders(lab):
        regions = [r for r in parsed.regions if r.checkoff_id == c.id]
        payload = ({"cases": [{"input": k.input(), "spec": k.public_spec(c.name)} for k in c.cases(case_rng(c.id))]}
                   if c.kind == "function" else {"spec": c.value_spec()})
        entries.append({"id": c.id, "title": c.title, "hint": c.hint, "kind": c.kind,
                        "prompts": list(dict.fromkeys(r.prompt for r in regions)),
                        "cells": list(dict.fromkeys([r.cell_id for r in regions] + [parsed.check_cells[c.id]])),
                        "forbid": list(c.forbid), "derive": c.derive, "sealed": record.seal(payload, lab.number)})
    rec = {"lab": lab.number, "checkoffs": entries}
    if lab.number in GIVENS:
        rec["givens"] = GIVENS[lab.number].lecture
        rec["givens_cell"] = next(c.id for c in parsed.solution.cells if TAG_GIVENS in c.metadata.get("tags", []))
    return rec


# --- executing ---------------------------------------------------------------------------------

def kernel_manager():
    """A python3 kernel on this very interpreter, the one labsupport is installed in.

    A user-level kernelspec also named python3 (pointing at another Python) would otherwise win.
    """
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())

    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = CELL_TIMEOUT_S, progress: bool = True,
            allow_errors: bool = False, label: str = "") -> nbformat.NotebookNode:
    """Run `nb` in a fresh kernel of this interpreter, in `cwd`; returns the executed copy.

    Without `allow_errors` execution stops at the first error, as Run All does, and the BuildError
    names that cell (1-based, as JupyterLab counts) and the error.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = copy.deepcopy(nb)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(nb.cells), desc=label or "cells", unit="cell", file=sys.stderr, leave=False)
    client = NotebookClient(nb, km=kernel_manager(), timeout=timeout, allow_errors=allow_errors,
                            resources={"metadata": {"path": str(cwd)}}, record_timing=False,
                            store_widget_state=False)
    if bar is not None:
        client.on_cell_executed = lambda **_: bar.update(1)
    try:
        client.execute()
    except CellTimeoutError:
        raise ExecutionFailure(f"{label or 'notebook'}: a cell ran longer than {timeout} s") from None
    except CellExecutionError as exc:
        index = next((i for i, c in enumerate(nb.cells, start=1) if c.cell_type == "code"
                      and any(o.output_type == "error" for o in c.get("outputs", []))), None)
        where = f"cell {index}" if index else "a cell"
        raise ExecutionFailure(f"{label or 'notebook'}, {where}: execution stops here with "
                               f"{exc.ename}: {str(exc.evalue)[:300]}") from None
    finally:
        if bar is not None:
            bar.close()
    return nb


def finalize(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what execution adds that depends on the machine or the session.

    Kernel versions go, and so do widget views: without the widget state (not stored: it is large
    and random) a stored view only says "model not found".  Their plain-text part stays — for a
    `viz.Panel` that is its readout — so the notebook reads well unexecuted and rebuilds identically;
    nbval ignores widget views when comparing anyway.
    """
    nb.metadata = nbformat.from_dict({"kernelspec": dict(KERNELSPEC), "language_info": copy.deepcopy(LANGUAGE_INFO)})
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            for output in cell.outputs:
                output.get("metadata", {}).pop("execution", None)
                output.get("data", {}).pop(WIDGET_VIEW, None)
    return nb


def _output_text(cell) -> tuple[str, list[str]]:
    """Stdout text of a cell and a description of any other output it produced."""
    text, other = "", []
    for output in cell.get("outputs", []):
        if output.output_type == "stream" and output.name == "stdout":
            text += output.text
        else:
            other.append(output.output_type + (f" {output.ename}: {output.evalue}" if output.output_type == "error" else ""))
    return text, other


def validate_outputs(parsed: Parsed, executed: nbformat.NotebookNode) -> None:
    """An executed solution has no errors, and each checkoff cell prints exactly its pass lines."""
    for index, cell in enumerate(executed.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if errors and TAG_RAISES not in tags:
            e = errors[0]
            raise BuildError(f"{parsed.lab.name}, cell {index + 1}: the solution raised {e.ename}: {e.evalue}")
        if TAG_CHECKOFF in tags:
            ids = CHECK_RE.findall(cell.source)
            text, other = _output_text(cell)
            want = "".join(PASS_LINE.format(id=i) + "\n" for i in ids)
            if text != want or other:
                raise BuildError(f"{parsed.lab.name}, cell {index + 1}: a checkoff cell must print only "
                                 f"{want!r}; it printed {text!r} and {other or 'nothing else'}")


def validate_student_run(parsed: Parsed, executed: nbformat.NotebookNode) -> None:
    """A student copy run top to bottom: each checkoff cell prints one ⬜ line per checkoff, nothing else.

    The line names one of the checkoff's prompts (check() shows the one it met last).
    """
    prompts: dict[str, set[str]] = {}
    for region in parsed.regions:
        prompts.setdefault(region.checkoff_id, set()).add(region.prompt)
    for index, cell in enumerate(executed.cells, start=1):
        if cell.cell_type != "code" or TAG_CHECKOFF not in cell.metadata.get("tags", []):
            continue
        ids = CHECK_RE.findall(cell.source)
        text, other = _output_text(cell)
        lines = text.splitlines()
        ok = not other and len(lines) == len(ids) and all(
            line in {plain(NOT_ATTEMPTED_LINE.format(id=i, prompt=p)) for p in prompts[i]} for i, line in zip(ids, lines))
        if not ok:
            want = " and ".join(NOT_ATTEMPTED_LINE.format(id=i, prompt="<its prompt>") for i in ids)
            raise ExecutionFailure(f"{parsed.lab.student_path.name}, cell {index}: with the exercise unfinished "
                                   f"the checkoff cell must print only {want!r}; it printed {text!r} and "
                                   f"{other or 'nothing else'}")


# --- writing and comparing -----------------------------------------------------------------------

def dumps(nb: nbformat.NotebookNode) -> str:
    nbformat.validate(nb)
    return nbformat.writes(nb, version=4) + "\n"


def write(nb: nbformat.NotebookNode, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(nb)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def carry_outputs(new: nbformat.NotebookNode, old_path: Path) -> nbformat.NotebookNode:
    """Keep the outputs of solution cells whose id and source did not change (for --no-execute)."""
    if not old_path.exists():
        return new
    old = nbformat.read(old_path, as_version=4)
    by_id = {c.get("id"): c for c in old.cells}
    for cell in new.cells:
        prev = by_id.get(cell.get("id"))
        if cell.cell_type == "code" and prev is not None and prev.cell_type == "code" and prev.source == cell.source:
            cell.outputs = prev.outputs
            cell.execution_count = prev.execution_count
    return new


def compare(expected: nbformat.NotebookNode, actual: nbformat.NotebookNode, name: str, outputs: bool) -> list[str]:
    """Differences between a generated notebook and a committed one, one line each."""
    diffs = []
    if (actual.nbformat, actual.nbformat_minor) != (expected.nbformat, expected.nbformat_minor):
        diffs.append(f"{name}: nbformat {actual.nbformat}.{actual.nbformat_minor}, expected "
                     f"{expected.nbformat}.{expected.nbformat_minor}")
    if dict(actual.metadata) != dict(expected.metadata):
        diffs.append(f"{name}: notebook metadata differs: {json.dumps(actual.metadata, sort_keys=True)[:200]}")
    if len(actual.cells) != len(expected.cells):
        diffs.append(f"{name}: {len(actual.cells)} cells, the source generates {len(expected.cells)}")
    for index, (want, got) in enumerate(zip(expected.cells, actual.cells), start=1):
        where = f"{name}, cell {index}"
        for key in ("cell_type", "id", "source", "metadata"):
            if got.get(key) != want.get(key):
                shown = repr(got.get(key))[:120]
                diffs.append(f"{where}: {key} differs from the generated cell (committed: {shown})")
        if want.cell_type == "code":
            if outputs and (got.get("outputs") != want.get("outputs") or got.get("execution_count") != want.get("execution_count")):
                diffs.append(f"{where}: outputs differ from the generated student copy")
            if not outputs and got.get("execution_count") is None:
                diffs.append(f"{where}: not executed (rebuild without --no-execute)")
    return diffs


def check_labs(labs: list[Lab], root: Path) -> list[str]:
    diffs = []
    for lab in labs:
        try:
            parsed = parse(lab)
        except BuildError as exc:
            diffs.append(str(exc))
            continue
        for expected, path, outputs in ((parsed.solution, lab.solution_path, False),
                                        (parsed.student, lab.student_path, True)):
            rel = path.relative_to(root)
            if not path.exists():
                diffs.append(f"{rel}: missing (run `python -m labsupport build {lab.name}`)")
                continue
            diffs += compare(expected, nbformat.read(path, as_version=4), str(rel), outputs)
        if not lab.instructor:
            path = record_path(root, lab.number)
            if not path.is_file() or path.read_text(encoding="utf-8") != record.dumps(record_of(parsed)):
                diffs.append(f"{path.relative_to(root)}: the lab's public record is missing or stale "
                             f"(run `python -m labsupport build {lab.name}`)")
    if len(labs) == len(discover(root)):
        sources = {lab.name for lab in labs}
        for folder in ("notebooks", "solutions"):
            for path in sorted((root / folder).glob("*.ipynb")):
                if path.stem not in sources:
                    diffs.append(f"{folder}/{path.name}: no source solutions/{path.stem}.py generates it")
    return diffs


def _say_if_on_stand_ins(lab: Lab, solution: nbformat.NotebookNode) -> None:
    from labsupport.workloads import FETCH_COMMAND, TRACES, find_trace

    tagged = sum(TAG_NEEDS_TRACES in c.metadata.get("tags", []) for c in solution.cells)
    missing = [name for name in TRACES if find_trace(name) is None]
    if tagged and missing:
        print(f"build: {lab.name}: {len(missing)} of {len(TRACES)} real traces are missing, so the outputs of its "
              f"{tagged} cell(s) tagged {TAG_NEEDS_TRACES} come from synthetic stand-ins: do not commit them "
              f"(`{FETCH_COMMAND}` fetches the traces)", file=sys.stderr, flush=True)


def record_path(root: Path, lab: int) -> Path:
    return Path(root) / "labsupport" / "course" / "records" / f"lab{lab:02d}.json"


def write_record(parsed: Parsed) -> None:
    """The lab's public record, written before anything runs: the notebooks' check() reads it."""
    if parsed.lab.instructor:
        return
    path = record_path(parsed.lab.root, parsed.lab.number)
    text = record.dumps(record_of(parsed))
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    record.read.cache_clear()


def build_lab(lab: Lab, run: bool = True, progress: bool = True) -> tuple[float, float]:
    """Write both notebooks of one lab; returns the seconds spent running the solution and the student copy.

    Running means: the solution top to bottom with no error and every checkoff passed, then the
    student copy top to bottom, stopping at its first error as Run All does, which must reach the
    last cell with every checkoff "not attempted".
    """
    parsed = parse(lab)
    write_record(parsed)
    seconds = (0.0, 0.0)
    if run:
        _say_if_on_stand_ins(lab, parsed.solution)
        start = time.perf_counter()
        executed = execute(parsed.solution, lab.solution_path.parent, progress=progress, label=lab.name)
        middle = time.perf_counter()
        validate_outputs(parsed, executed)
        lab.student_path.parent.mkdir(parents=True, exist_ok=True)  # it runs where it will live
        student_run = execute(parsed.student, lab.student_path.parent, progress=progress,
                              label=f"notebooks/{lab.student_path.name}")
        seconds = (middle - start, time.perf_counter() - middle)
        validate_student_run(parsed, student_run)
        solution = finalize(executed)
    else:
        solution = carry_outputs(parsed.solution, lab.solution_path)
    write(solution, lab.solution_path)
    write(parsed.student, lab.student_path)
    return seconds


# --- command line ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Exit 0 when done, 1 when a notebook does not run as it must or --check finds a difference,
    2 for bad input: a flag, a lab name, or a lab source that is unreadable or breaks a rule."""
    p = OneLineParser(prog="python -m labsupport build",
                      description="Generate solution and student notebooks from solutions/NN_topic.py.")
    p.add_argument("labs", nargs="*", help="lab names or numbers (default: every lab)")
    p.add_argument("--check", action="store_true", help="compare committed notebooks with the sources; change nothing")
    p.add_argument("--no-execute", action="store_true",
                   help="run nothing (keep unchanged solution cells' outputs); skips the Run All check")
    p.add_argument("--root", default=".", help="repository root holding solutions/ and notebooks/ (default: .)")
    try:
        args = p.parse_args(argv)
    except UsageError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 2
    root = Path(args.root).resolve()
    if not (root / "solutions").is_dir():
        print(f"build: --root {args.root}: no solutions/ folder there", file=sys.stderr)
        return 2
    try:
        labs = discover(root, args.labs)
        if not labs:
            print(f"build: no lab sources (NN_topic.py) in {root / 'solutions'}", file=sys.stderr)
            return 2
        if args.check:
            diffs = check_labs(labs, root)
            for line in diffs:
                print(line)
            print(f"build --check: {len(labs)} lab(s), {len(diffs)} difference(s)")
            return 1 if diffs else 0
        for lab in labs:
            solution_s, student_s = build_lab(lab, run=not args.no_execute)
            ran = (f"ran in {solution_s:.1f} s; the student copy's Run All reached its end in {student_s:.1f} s"
                   if not args.no_execute else "not executed")
            print(f"{lab.name}: wrote {lab.solution_path.relative_to(root)} and "
                  f"{lab.student_path.relative_to(root)} ({ran})", flush=True)
    except ExecutionFailure as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 1
    except BuildError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 2
    return 0
