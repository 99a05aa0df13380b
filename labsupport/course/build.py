"""`python -m labsupport build`: one hand-edited source per lab becomes its two notebooks (every lab).

    solutions/NN_topic.py   the source: a jupytext "percent" file, edited by hand
      -> solutions/NN_topic.ipynb   executed, outputs kept: the instructor's copy, checked by nbval
      -> notebooks/NN_topic.ipynb   the student's copy: solutions cut out, outputs cleared

A checkoff has one ``check("N.M", ...)`` cell, printing only its pass line (the student copy stores no output, so
nothing looks passed before it runs; ``python -m labsupport expect`` writes the lines back for ``pytest --nbval-lax``),
and at least one region ``### BEGIN SOLUTION N.M: prompt`` ... ``### END SOLUTION`` (cut_solutions).  Code after
an exercise never needs the student's answer: it recomputes it, or waits behind ``if unlocked("N.M"):``.  A cell
tagged ``solution-only`` stays out of the student copy; ``needs-traces`` ones built without the real traces run on
stand-ins (the build says so: do not commit their outputs).  A Colab set-up cell is added and, but to the board
(labs 90–99), a scoreboard; a cell's id comes from its own text (not its place), so a deterministic lab rebuilds byte for byte and
a one-line change diffs in a few lines (INSTRUCTORS.md).
Exit codes: 0 done; 1 a notebook does not run as it must, or --check found a difference; 2 bad input, in one line.
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
from labsupport.course import data, judge, prose, record
from labsupport.course.checkoff import NOT_ATTEMPTED_LINE, PASS_LINE, PROMPT_WORD, plain
from labsupport.course.checkoffs import load_lab
from labsupport.course.registry import GIVENS, card_givens, case_rng, givens_cell, namespace

BEGIN_MARK = "### BEGIN SOLUTION"
END_MARK = "### END SOLUTION"
TAG_SOLUTION_ONLY = "solution-only"
TAG_CHECKOFF = "checkoff"
TAG_NEEDS_TRACES = "needs-traces"
TAG_GIVENS = "givens"
SOURCE_PATTERN = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.py$")
BEGIN_RE = re.compile(
    r"^(?P<indent>[ \t]*)### BEGIN SOLUTION(?:[ \t]+(?P<id>\d+\.\d+))?[ \t]*:?[ \t]*(?P<prompt>.*?)[ \t]*$")
END_RE = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
CHECK_RE = re.compile(r"""^[ \t]*(?:[\w.]+\.)?check\(\s*["'](\d+\.\d+)["']""", re.M)
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


class BuildError(ValueError):
    """A lab source breaks a rule of the pipeline; the message names the lab and the cell."""


class ExecutionFailure(BuildError):
    """A generated notebook does not run as it must (a solution raised, a student copy stops)."""


@dataclass(frozen=True)
class Lab:
    """A lab source (solutions/NN_topic.py under the repository `root`) and the files the build makes of it."""
    source: Path
    root: Path
    name = property(lambda self: self.source.stem)
    number = property(lambda self: int(self.name[:2]))
    instructor = property(lambda self: self.number >= 90)  # the board: no checkoffs required
    graders = property(lambda self: f"labsupport/course/checkoffs/lab{self.number:02d}.py")
    record_path = property(lambda self: self.root / "labsupport" / "course" / "records" / f"lab{self.number:02d}.json")
    solution_path = property(lambda self: self.root / "solutions" / f"{self.name}.ipynb")
    student_path = property(lambda self: self.root / "notebooks" / f"{self.name}.ipynb")


@dataclass
class Region:
    """One solution region: the checkoff it serves, its prompt, where it sits and the lines between its markers."""
    checkoff_id: str
    prompt: str
    indent: str = ""
    begin: int = 0  # 1-based line of the BEGIN marker in its cell
    lines: list[str] = field(default_factory=list)
    cell_id: str = ""


@dataclass
class Parsed:
    lab: Lab
    solution: nbformat.NotebookNode
    student: nbformat.NotebookNode
    regions: list[Region] = field(default_factory=list)
    checkoffs: dict[str, int] = field(default_factory=dict)  # checkoff id -> its check() cell's position
    check_cells: dict[str, str] = field(default_factory=dict)  # checkoff id -> its check() cell's id


def discover(root: Path, names: list[str] | None = None) -> list[Lab]:
    """Lab sources under root/solutions, optionally only those named ('01', '01_five_jobs', a path)."""
    folder = Path(root) / "solutions"
    labs = [Lab(p, Path(root)) for p in sorted(folder.glob("*.py")) if SOURCE_PATTERN.match(p.name)]
    chosen = []
    for name in names or ():
        key = Path(name).stem
        hits = [lab for lab in labs if lab.name == key or lab.name.startswith(key + "_") or lab.name[:2] == key]
        if not hits:
            have = ", ".join(lab.name for lab in labs) or "none"
            raise BuildError(f"no lab source matches {name!r} in {folder}; have: {have}")
        chosen += [h for h in hits if h not in chosen]
    return chosen or labs  # none named: every lab


def cell_id(lab_name: str, key: int | str) -> str:
    """A cell's id: the lab's name and the cell's key, hashed (16 hex digits)."""
    return hashlib.sha1(f"{lab_name}:{key}".encode()).hexdigest()[:16]


def content_key(cell_type: str, source: str, seen: dict[str, int]) -> str:
    """A cell's key from what it says, not where it sits: inserting or moving a cell leaves every other cell's id
    as it was, so a one-line change to a lab diffs in a few lines.  `seen` counts repeats (the second of two equal
    cells is told apart by its number)."""
    key = f"{cell_type}:{hashlib.sha1(source.strip().encode()).hexdigest()}"
    seen[key] = seen.get(key, 0) + 1
    return key if seen[key] == 1 else f"{key}#{seen[key]}"


def find_regions(source: str, where: str) -> list[Region]:
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
            current = Region(begin["id"], begin["prompt"], begin["indent"], number)
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


def _bindings(statements) -> list[tuple[str, tuple[int, int]]]:
    """(name, where it takes effect) for each name the statements bind at their own level (into if/for/with/try
    bodies, never a def's or a class's), in order: an assignment at its end, a for or with target at once."""
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
        if isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in st.targets if isinstance(st, ast.Assign) else [st.target]:
                target(t, end)
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((st.name, end))
            continue
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            target(st.target, None)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                target(item.optional_vars, None)  # None, binding nothing, without `as`
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            found += [((a.asname or a.name).split(".")[0], end) for a in st.names]
        found += [(n.target.id, (n.end_lineno, n.end_col_offset)) for n in ast.walk(st) if isinstance(n, ast.NamedExpr)]
        for block in (st, *getattr(st, "handlers", []), *getattr(st, "cases", [])):
            for body in ("body", "orelse", "finalbody"):
                found += _bindings(getattr(block, body, []))
    return found


def first_uses(source: str, after_line: int = 0) -> dict[str, str] | None:
    """For each name a cell's code outside its regions uses after `after_line`: "read" or "bound", what it does first.
    None when that code is not plain Python (assume it reads everything) or its regions do not pair up."""
    lines = source.split("\n")
    try:
        for r in find_regions(source, ""):  # each region becomes one `pass` and blank lines: same line numbers
            lines[r.begin - 1:r.begin + len(r.lines) + 1] = [f"{r.indent}pass"] + [""] * (len(r.lines) + 1)
        tree = ast.parse("\n".join(lines))
    except (BuildError, SyntaxError):
        return None
    events = [((n.lineno, n.col_offset), n.id, "read") for n in ast.walk(tree)
              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.lineno > after_line]
    events += [(at, name, "bound") for name, at in _bindings(tree.body) if at[0] > after_line]
    return {name: kind for _, name, kind in sorted(events, reverse=True)}  # latest first: the first use wins


def still_needed(name: str, uses: list[dict[str, str] | None]) -> bool:
    """Does code run after a region read `name` before setting it again?  `uses`: first_uses, in order."""
    return next(filter(None, ("read" if cell is None else cell.get(name) for cell in uses)), None) == "read"


def cut_solutions(source: str, where: str, later: list[dict[str, str] | None] = ()) -> tuple[str, list[Region]]:
    """A code cell as the student sees it, and its regions.  Each becomes its to-do comment over a placeholder that
    Run All gets past and check() calls "not attempted": ``raise NotImplementedError(...)`` in a function, else
    ``name = ...`` for what later code reads (`later`: the later cells' first_uses), or ``pass`` for a block."""
    regions = find_regions(source, where)
    if not regions:
        return source, []
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise BuildError(f"{where}, line {exc.lineno}: a cell with a solution region must be plain Python "
                         f"({exc.msg})") from None
    in_function = {line for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for line in range(node.lineno + 1, node.end_lineno + 1)}  # a region there raises when called
    lines = source.split("\n")
    out, done = [], 0  # done: the lines consumed so far
    for region in regions:
        end = region.begin + len(region.lines) + 1  # the END marker's line
        message = f"{PROMPT_WORD} {region.checkoff_id}: {region.prompt}"
        if region.begin in in_function:
            todo = [f"raise NotImplementedError({json.dumps(message, ensure_ascii=False)})"]
        else:
            try:
                code = ast.parse(textwrap.dedent("\n".join(region.lines)))
            except SyntaxError as exc:
                raise BuildError(f"{where}, line {region.begin}: a solution region outside a function must be whole "
                                 f"statements ({exc.msg}, line {exc.lineno} of the region)") from None
            uses = [first_uses(source, after_line=end), *later]
            bound = dict.fromkeys(name for name, _ in _bindings(code.body))  # at the region's own level, in order
            todo = [f"{name} = ..." for name in bound if still_needed(name, uses)]  # data.contains_unfinished flags it
        if not todo and region.indent:
            todo = ["pass"]
        out += lines[done:region.begin - 1] + [f"{region.indent}{line}" for line in [f"# {message}", *todo]]
        done = end
    return "\n".join(out + lines[done:]), regions


def _notebook() -> nbformat.NotebookNode:
    """An empty notebook whose metadata names this kernel and language, nothing that depends on the machine."""
    return nbformat.v4.new_notebook(nbformat_minor=5, metadata=nbformat.from_dict({
        "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
        "language_info": {"name": "python", "pygments_lexer": "ipython3", "file_extension": ".py",
                          "mimetype": "text/x-python", "codemirror_mode": {"name": "ipython", "version": 3},
                          "nbconvert_exporter": "python"}}))


def _pass_lines(ids: list[str]) -> str:
    return "".join(PASS_LINE.format(id=i) + "\n" for i in ids)


def parse(lab: Lab) -> Parsed:
    """Read a lab source and generate both notebooks (the solution not yet executed)."""
    import jupytext
    try:
        text = lab.source.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BuildError(f"{lab.source}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); "
                         f"save the lab source as UTF-8") from None
    except OSError as exc:
        raise BuildError(f"{lab.source}: cannot read it ({exc.strerror})") from None
    source_nb = jupytext.reads(text, fmt="py:percent")
    uses_of = {position: first_uses(cell.source) for position, cell in enumerate(source_nb.cells)
               if cell.cell_type == "code" and TAG_SOLUTION_ONLY not in cell.metadata.get("tags", [])}
    parsed = Parsed(lab, _notebook(), _notebook())
    sol_cells, stu_cells = parsed.solution.cells, parsed.student.cells
    seen: dict[str, int] = {}
    prose_names = _prose_names(lab, source_nb)
    for position, cell in enumerate(source_nb.cells):
        where, body = f"{lab.source.name}, cell {position + 1}", cell.source
        tags = cell.metadata.get("tags", [])
        ids = CHECK_RE.findall(body) if cell.cell_type == "code" else []
        if TAG_SOLUTION_ONLY in tags and (ids or BEGIN_MARK in body):
            raise BuildError(f"{where}: a solution-only cell cannot hold a checkoff or a solution region")
        if cell.cell_type == "markdown" and BEGIN_MARK in body:
            raise BuildError(f"{where}: solution regions belong in code cells; tag a markdown answer "
                             f"cell '{TAG_SOLUTION_ONLY}' instead")
        for i in ids:
            if int(i.split(".")[0]) != lab.number:
                raise BuildError(f"{where}: checkoff {i} belongs to lab {i.split('.')[0]}, not to lab {lab.number:02d}")
            if i in parsed.checkoffs:
                raise BuildError(f"{where}: checkoff {i} is checked twice (first in cell {parsed.checkoffs[i] + 1})")
            parsed.checkoffs[i] = position
        if cell.cell_type == "markdown" and prose.FIELD.search(body):  # numbers that follow the course card
            try:
                body = prose.render(body, where, prose_names)
            except ValueError as exc:
                raise BuildError(str(exc)) from None
        if cell.cell_type == "code" and TAG_GIVENS in tags:  # the course card's values (course.toml)
            try:
                body = card_givens(body, f"{where}, the givens cell")
            except ValueError as exc:
                raise BuildError(str(exc)) from None
        cid = cell_id(lab.name, content_key(cell.cell_type, body, seen))
        parsed.check_cells.update(dict.fromkeys(ids, cid))
        later = [uses for other, uses in uses_of.items() if other > position]
        student_body, found = cut_solutions(body, where, later) if cell.cell_type == "code" else (body, [])
        for r in found:
            if int(r.checkoff_id.split(".")[0]) != lab.number:
                raise BuildError(f"{where}: solution region {r.checkoff_id} is not a checkoff of lab {lab.number:02d}")
            r.cell_id = cid
        parsed.regions += found
        new_cell = getattr(nbformat.v4, f"new_{cell.cell_type}_cell")  # markdown, code or raw
        tags = list(dict.fromkeys([*tags, *([TAG_CHECKOFF, "nbval-check-output"] if ids else [])]))
        meta = {"tags": tags} if tags else {}
        if "jupyter" in cell.metadata:  # a source's folding (jupyter.source_hidden) is the author's: kept
            meta["jupyter"] = copy.deepcopy(dict(cell.metadata["jupyter"]))
        sol_cells.append(new_cell(body, metadata=meta, id=cid))
        stu = new_cell(student_body, metadata=copy.deepcopy(meta), id=cid)
        if TAG_SOLUTION_ONLY not in tags:
            stu_cells.append(stu)
    for cells in (sol_cells, stu_cells):
        cells.extend([] if lab.instructor else scoreboard_cells(lab, len(source_nb.cells)))
        first_code = next((i for i, c in enumerate(cells) if c.cell_type == "code"), len(cells))
        cells.insert(first_code, colab_cell(lab))
    _validate(parsed)
    return parsed


def _prose_names(lab: Lab, source_nb) -> dict:
    """What the lab's ``{{ }}`` prose fields may name: the card's and, where the lab has them, its givens."""
    for position, cell in enumerate(source_nb.cells):
        if cell.cell_type == "code" and TAG_GIVENS in cell.metadata.get("tags", []):
            where = f"{lab.source.name}, cell {position + 1}, the givens cell"
            try:
                return prose.names(givens_cell(card_givens(cell.source, where), where))
            except ValueError as exc:
                raise BuildError(str(exc)) from None
    return prose.names()


def colab_cell(lab: Lab) -> nbformat.NotebookNode:
    """The Colab set-up cell: it clones pyproject.toml's ``Repository`` URL, or explains its placeholder."""
    try:
        text = (lab.root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        text = ""
    found = re.search(r'^\[project\.urls\][^\[]*?^Repository\s*=\s*"([^"]+)"', text, re.M | re.S)
    meta = {"tags": ["front-end"]}
    if lab.instructor:  # the board is projected: its set-up code stays folded (JupyterLab's source_hidden)
        meta["jupyter"] = {"source_hidden": True, "outputs_hidden": True}
    return nbformat.v4.new_code_cell(COLAB_CELL.format(repo=found[1] if found else REPO_PLACEHOLDER),
                                     metadata=meta, id=cell_id(lab.name, "colab"))


def scoreboard_cells(lab: Lab, position: int) -> list:
    """The lab's closing cells: a heading and the scoreboard of this kernel's checkoffs."""
    heading = nbformat.v4.new_markdown_cell(
        "## Your checkoffs\n\nWhat `check()` said in this kernel, checkoff by checkoff. It is feedback: the grade "
        "comes from `python -m labsupport grade`, which runs your saved notebook in a fresh kernel.",
        id=cell_id(lab.name, "scoreboard heading"))
    board = nbformat.v4.new_code_cell(
        f"from labsupport.course.scoreboard import scoreboard\n\nscoreboard({lab.name!r})",
        metadata={"tags": ["scoreboard"]}, id=cell_id(lab.name, "scoreboard"))
    return [heading, board]


def _validate(parsed: Parsed) -> None:
    """check() cells, solution regions and registered checkoffs match one to one; the givens are sound."""
    lab = parsed.lab
    try:
        checkoffs = load_lab(lab.number)
    except (ValueError, TypeError, AttributeError, NameError, SyntaxError) as exc:
        raise BuildError(f"{lab.name}: {lab.graders}: {exc}") from None
    registered, used = {c.id for c in checkoffs}, set(parsed.checkoffs)
    with_regions = {r.checkoff_id for r in parsed.regions}
    if not used and not registered and not lab.instructor:
        raise BuildError(f"{lab.name} has no checkoffs: register them in {lab.graders} and call check() "
                         "(only the instructors' labs 90-99 may have none)")
    for ids, problem in ((used - registered, f"checkoffs {{}} are not registered in {lab.graders}"),
                         (registered - used, "registered checkoffs {} have no check() cell in the source"),
                         (used - with_regions, f"checkoffs {{}} have no '{BEGIN_MARK} N.M: ...' region "
                                               "for the student to fill"),
                         (with_regions - used, "solution regions {} serve no check() cell")):
        if ids:
            raise BuildError(f"{lab.name}: " + problem.format(sorted(ids)))
    # a lab with givens has exactly one cell tagged ``givens``, binding constants its hidden generator varies
    declared = GIVENS.get(lab.number)
    cells = [c for c in parsed.solution.cells if TAG_GIVENS in c.metadata.get("tags", [])]
    if declared is None and cells:
        raise BuildError(f"{lab.name}: a cell is tagged '{TAG_GIVENS}' but {lab.graders} declares no givens()")
    if declared is not None and len(cells) != 1:
        raise BuildError(f"{lab.name}: lab {lab.number:02d} declares givens, so exactly one code cell must be tagged "
                         f"'{TAG_GIVENS}' (found {len(cells)})")
    try:
        if declared is not None:
            givens_cell(cells[0].source, f"{lab.source.name}, the givens cell")
            declared.draw(case_rng("givens", b"build"), 2)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    check_hidden_givens(lab, checkoffs)


def check_hidden_givens(lab: Lab, checkoffs: list, draws: int = 8) -> None:
    """Every value checkoff with givens has another answer on each hidden set, where a typed-in number fails."""
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


def record_of(parsed: Parsed) -> dict:
    """The public record (labsupport.course.record): the graders parse loaded, on the lecture's givens and own cases."""
    lab, entries = parsed.lab, []
    for c in load_lab(lab.number):
        regions = [r for r in parsed.regions if r.checkoff_id == c.id]
        cells = [r.cell_id for r in regions] + [parsed.check_cells[c.id]]  # the exercise's cells
        payload = ({"cases": [{"input": k.input(), "spec": k.public_spec(c.name)} for k in c.cases(case_rng(c.id))]}
                   if c.kind == "function" else {"spec": c.value_spec()})
        entries.append({"id": c.id, "title": c.title, "hint": c.hint, "kind": c.kind,
                        "prompts": list(dict.fromkeys(r.prompt for r in regions)), "cells": list(dict.fromkeys(cells)),
                        "forbid": list(c.forbid), "derive": c.derive, "sealed": record.seal(payload, lab.number)})
    rec = {"lab": lab.number, "checkoffs": entries}
    if lab.number in GIVENS:
        rec["givens"] = GIVENS[lab.number].lecture
        rec["givens_cell"] = next(c.id for c in parsed.solution.cells if TAG_GIVENS in c.metadata.get("tags", []))
    return rec


def kernel_manager():
    """A python3 kernel on this very interpreter, whatever a user-level kernelspec named python3 says."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


KERNEL_DIED_AT_START = "Kernel died before replying to kernel_info"  # jupyter_client's words, before any cell ran


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 600, progress: bool = True,
            allow_errors: bool = False, label: str = "", env: dict | None = None) -> nbformat.NotebookNode:
    """Run a copy of `nb` in a fresh kernel in `cwd`, stopping at the first error unless `allow_errors`; the
    kernel starts with `env` (default: this process's environment) and ends with the run."""
    from nbclient import NotebookClient
    source = nb
    for attempt in (1, 2):
        nb = copy.deepcopy(source)
        client = NotebookClient(nb, km=kernel_manager(), timeout=timeout, allow_errors=allow_errors,
                                record_timing=False, resources={"metadata": {"path": str(cwd)}},
                                store_widget_state=False, shutdown_kernel="immediate")
        try:
            _run(client, nb, label, progress, env)
            return nb
        except RuntimeError as exc:
            # the kernel process died before it ran any cell (seen once in about a thousand starts on a loaded
            # machine): nothing of the notebook ran, so a second kernel is tried once
            if attempt == 2 or KERNEL_DIED_AT_START not in str(exc):
                raise
            print(f"{label or 'notebook'}: the kernel died as it started ({exc}); starting another",
                  file=sys.stderr, flush=True)


def _run(client, nb: nbformat.NotebookNode, label: str, progress: bool, env: dict | None = None) -> None:
    """`client` runs `nb` top to bottom; a cell that fails or times out raises ExecutionFailure, naming it."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    from tqdm.auto import tqdm
    with tqdm(total=len(nb.cells), desc=label or "cells", unit="cell", file=sys.stderr, leave=False,
              disable=not progress) as bar:
        client.on_cell_executed = lambda **_: bar.update(1)
        try:
            # the kernel goes when the notebook has run, or fails: nbclient keeps alive a kernel whose manager it
            # was given (ours, kernel_manager()), and a build's twenty kernels then lived, idle, holding their
            # memory, until the build ended
            client.execute(cleanup_kc=True, **({} if env is None else {"env": env}))
        except CellTimeoutError:
            raise ExecutionFailure(f"{label or 'notebook'}: a cell ran longer than {client.timeout} s") from None
        except CellExecutionError as exc:
            where = next((f"cell {i}" for i, c in enumerate(nb.cells, start=1) if c.cell_type == "code"
                          and any(o.output_type == "error" for o in c.get("outputs", []))), "a cell")
            raise ExecutionFailure(f"{label or 'notebook'}, {where}: execution stops here with "
                                   f"{exc.ename}: {str(exc.evalue)[:300]}") from None


def finalize(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what depends on the machine or the session: kernel versions, and widget views, which without the
    (unstored) widget state say "model not found"; their plain text, a `viz.Panel`'s readout, stays."""
    nb.metadata = _notebook().metadata
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
        for output in cell.get("outputs", []):  # code cells only
            output.get("metadata", {}).pop("execution", None)
            output.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
    return nb


def coalesce_streams(outputs: list) -> list:
    """Consecutive stream outputs of one name as one output: how a kernel chunked its prints depends on timing, and
    a rebuild must not re-chunk the stored text (nbval compares the streams coalesced too)."""
    merged = []
    for output in outputs:
        if (output.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == output.get("name")):
            merged[-1]["text"] = merged[-1]["text"] + output["text"]
        else:
            merged.append(output)
    return merged


def _checkoff_output(cell) -> tuple[list[str], str, list[str]]:
    """A checkoff cell's check() ids, its stdout text and a description of any other output."""
    text, other = "", []
    for output in cell.get("outputs", []):
        if output.output_type == "stream" and output.name == "stdout":
            text += output.text
        else:
            error = f" {output.ename}: {output.evalue}" if output.output_type == "error" else ""
            other.append(output.output_type + error)
    return CHECK_RE.findall(cell.source), text, other


def validate_outputs(parsed: Parsed, executed: nbformat.NotebookNode) -> None:
    """An executed solution has no errors, and each checkoff cell prints exactly its pass lines."""
    for index, cell in enumerate(executed.cells, start=1):
        tags = cell.metadata.get("tags", [])
        e = next((o for o in cell.get("outputs", []) if o.output_type == "error"), None)  # code cells only
        if e is not None and "raises-exception" not in tags:
            raise BuildError(f"{parsed.lab.name}, cell {index}: the solution raised {e.ename}: {e.evalue}")
        ids, text, other = _checkoff_output(cell)
        if cell.cell_type == "code" and TAG_CHECKOFF in tags and (text != _pass_lines(ids) or other):
            raise BuildError(f"{parsed.lab.name}, cell {index}: a checkoff cell must print only "
                             f"{_pass_lines(ids)!r}; it printed {text!r} and {other or 'nothing else'}")


def validate_student_run(parsed: Parsed, executed: nbformat.NotebookNode) -> None:
    """Each checkoff cell of a student copy's run prints one ⬜ line per checkoff, with one of its prompts."""
    allowed = {(r.checkoff_id, plain(NOT_ATTEMPTED_LINE.format(id=r.checkoff_id, prompt=r.prompt)))
               for r in parsed.regions}
    for index, cell in enumerate(executed.cells, start=1):
        if cell.cell_type != "code" or TAG_CHECKOFF not in cell.metadata.get("tags", []):
            continue
        ids, text, other = _checkoff_output(cell)
        lines = text.splitlines()
        if other or len(lines) != len(ids) or any(pair not in allowed for pair in zip(ids, lines)):
            want = " and ".join(NOT_ATTEMPTED_LINE.format(id=i, prompt="<its prompt>") for i in ids)
            raise ExecutionFailure(f"{parsed.lab.student_path.name}, cell {index}: with the exercise unfinished "
                                   f"the checkoff cell must print only {want!r}; it printed {text!r} and "
                                   f"{other or 'nothing else'}")


def dumps(nb: nbformat.NotebookNode) -> str:
    nbformat.validate(nb)
    return nbformat.writes(nb, version=4) + "\n"


def _update(path: Path, text: str) -> None:
    """Write `text` to `path` unless it already holds exactly that."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def write(nb: nbformat.NotebookNode, path: Path) -> None:
    _update(path, dumps(nb))


def carry_outputs(new: nbformat.NotebookNode, old_path: Path) -> nbformat.NotebookNode:
    """Keep the outputs of solution cells whose source did not change (for --no-execute): the committed cell of the
    same id, else the first unclaimed committed code cell with the same source (an id made another way)."""
    old = [c for c in (nbformat.read(old_path, as_version=4).cells if old_path.exists() else []) if c.cell_type == "code"]
    by_id, claimed = {c.get("id"): c for c in old}, set()
    for cell in (c for c in new.cells if c.cell_type == "code"):
        prev = by_id.get(cell.get("id"))
        if prev is None or prev.source != cell.source or id(prev) in claimed:
            prev = next((c for c in old if c.source == cell.source and id(c) not in claimed), None)
        if prev is not None:
            claimed.add(id(prev))
            cell.outputs = coalesce_streams(prev.outputs)
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
        diffs += [f"{where}: {key} differs from the generated cell (committed: {repr(got.get(key))[:120]})"
                  for key in ("cell_type", "id", "source", "metadata") if got.get(key) != want.get(key)]
        code = want.cell_type == "code"
        if code and outputs and any(got.get(key) != want.get(key) for key in ("outputs", "execution_count")):
            diffs.append(f"{where}: outputs differ from the generated student copy")
        if code and not outputs and got.get("execution_count") is None:
            diffs.append(f"{where}: not executed (rebuild without --no-execute)")
    return diffs


def check_labs(labs: list[Lab], root: Path) -> list[str]:
    """What --check finds: each lab's notebooks and record against its source, then stray notebooks."""
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
            diffs += (compare(expected, nbformat.read(path, as_version=4), str(rel), outputs) if path.exists()
                      else [f"{rel}: missing (run `python -m labsupport build {lab.name}`)"])
        path = lab.record_path
        if not lab.instructor and (not path.is_file()
                                   or path.read_text(encoding="utf-8") != record.dumps(record_of(parsed))):
            diffs.append(f"{path.relative_to(root)}: the lab's public record is missing or stale "
                         f"(run `python -m labsupport build {lab.name}`)")
    if len(labs) == len(discover(root)):  # every lab: a notebook no source generates is a stray
        diffs += [f"{folder}/{path.name}: no source solutions/{path.stem}.py generates it"
                  for folder in ("notebooks", "solutions") for path in sorted((root / folder).glob("*.ipynb"))
                  if path.stem not in {lab.name for lab in labs}]
    return diffs


def refresh_board_data(root: Path) -> None:
    """The board's engine runs and trace figures (labsupport/viz/board/board_data.json) computed again before the
    board is built, on the card course.toml names: a retargeted course's board shows its own card's runs.  Kept as
    it is without the real traces (its trace figures would be the stand-ins')."""
    import subprocess

    from labsupport.course.runner import python
    from labsupport.workloads import FETCH_COMMAND, TRACES, find_trace

    path = root / "labsupport" / "viz" / "board" / "board_data.json"
    if any(find_trace(name) is None for name in TRACES):
        print(f"build: the board's data ({path.relative_to(root)}) is kept as it is: its figures need the real "
              f"traces (`{FETCH_COMMAND}` fetches them)", file=sys.stderr, flush=True)
        return
    # the board's own command, as the course's tooling runs any lab code: in a process of the root's package
    run = subprocess.run(python("labsupport.viz.board", "--write", root=str(root)), cwd=root, capture_output=True,
                         text=True)
    if run.returncode:
        raise BuildError(f"the board's data: `python -m labsupport.viz.board --write` failed: "
                         f"{(run.stderr.strip().splitlines() or ['no message'])[-1]}")


def _say_if_on_stand_ins(lab: Lab, solution: nbformat.NotebookNode) -> None:
    from labsupport.workloads import FETCH_COMMAND, TRACES, find_trace
    tagged = sum(TAG_NEEDS_TRACES in c.metadata.get("tags", []) for c in solution.cells)
    missing = [name for name in TRACES if find_trace(name) is None]
    if tagged and missing:
        print(f"build: {lab.name}: {len(missing)} of {len(TRACES)} real traces are missing, so the outputs of its "
              f"{tagged} cell(s) tagged {TAG_NEEDS_TRACES} come from synthetic stand-ins: do not commit them "
              f"(`{FETCH_COMMAND}` fetches the traces)", file=sys.stderr, flush=True)


def build_lab(lab: Lab, run: bool = True) -> tuple[float, float]:
    """Write the lab's record and notebooks (run and checked unless not `run`); returns the seconds each ran."""
    parsed = parse(lab)
    if not lab.instructor:  # written first: the notebooks' check() reads it
        _update(lab.record_path, record.dumps(record_of(parsed)))
    record.read.cache_clear()
    if run:
        _say_if_on_stand_ins(lab, parsed.solution)
        start = time.perf_counter()
        executed = execute(parsed.solution, lab.solution_path.parent, label=lab.name)
        middle = time.perf_counter()
        validate_outputs(parsed, executed)
        lab.student_path.parent.mkdir(parents=True, exist_ok=True)  # it runs where it will live
        student_run = execute(parsed.student, lab.student_path.parent, label=f"notebooks/{lab.student_path.name}")
        seconds = (middle - start, time.perf_counter() - middle)
        validate_student_run(parsed, student_run)
        solution = finalize(executed)
    else:
        solution, seconds = carry_outputs(parsed.solution, lab.solution_path), (0.0, 0.0)
    write(solution, lab.solution_path)
    write(parsed.student, lab.student_path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    """The build command; exit codes as the module says."""
    p = OneLineParser(prog="python -m labsupport build",
                      description="Generate solution and student notebooks from solutions/NN_topic.py.")
    p.add_argument("labs", nargs="*", help="lab names or numbers (default: every lab)")
    p.add_argument("--check", action="store_true", help="compare committed notebooks with the sources; change nothing")
    p.add_argument("--no-execute", action="store_true",
                   help="run nothing (keep unchanged solution cells' outputs); skips the Run All check")
    p.add_argument("--root", default=".", help="repository root holding solutions/ and notebooks/ (default: .)")
    try:
        args = p.parse_args(argv)
        root = Path(args.root).resolve()
        if not (root / "solutions").is_dir():
            raise BuildError(f"--root {args.root}: no solutions/ folder there")
        labs = discover(root, args.labs)
        if not labs:
            raise BuildError(f"no lab sources (NN_topic.py) in {root / 'solutions'}")
        if args.check:
            diffs = check_labs(labs, root)
            print("\n".join([*diffs, f"build --check: {len(labs)} lab(s), {len(diffs)} difference(s)"]))
            return 1 if diffs else 0
        for lab in labs:
            if lab.instructor and not args.no_execute:
                refresh_board_data(root)
            solution_s, student_s = build_lab(lab, run=not args.no_execute)
            ran = (f"ran in {solution_s:.1f} s; the student copy's Run All reached its end in {student_s:.1f} s"
                   if not args.no_execute else "not executed")
            print(f"{lab.name}: wrote {lab.solution_path.relative_to(root)} and "
                  f"{lab.student_path.relative_to(root)} ({ran})", flush=True)
    except (UsageError, BuildError) as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, ExecutionFailure) else 2  # a notebook that does not run, or bad input
    return 0
