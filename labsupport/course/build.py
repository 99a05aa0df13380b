"""`python -m labsupport build`: one hand-edited source per lab becomes its two notebooks (every lab).

    solutions/NN_topic.py   the source: a jupytext "percent" file, edited by hand
      -> solutions/NN_topic.ipynb   executed, outputs kept: the instructor's copy, checked by nbval
      -> notebooks/NN_topic.ipynb   the student's copy: solutions cut out, outputs cleared

In the source:
  * ``### BEGIN SOLUTION N.M: prompt`` ... ``### END SOLUTION`` (nbgrader's markers, plus the checkoff
    the region serves and a one-line prompt) is cut from the student copy and replaced, at the same
    indentation, by a comment and ``raise NotImplementedError("<N.M prompt>")`` (the message starts
    with the to-do word and N.M).  Every checkoff of a lab needs at least one region of its own.
  * a cell tagged ``solution-only`` (``# %% tags=["solution-only"]``) is left out of the student copy.
  * a cell calling ``check("N.M", ...)`` is a checkoff cell.  The build tags it ``checkoff`` and
    ``nbval-check-output``; in the student copy it keeps one output, the line it prints when passed
    (with an execution count: nbval will not compare an "unrun" cell), so ``pytest --nbval-lax
    notebooks/NN_topic.ipynb`` compares it.  Checkoff cells must print nothing else.
  * code that depends on an exercise's result goes in the exercise's own cell (after the region) or
    recomputes it with labsupport: in the student copy, later cells must not fail for want of it.

Both notebooks run with their own folder as the working directory (as JupyterLab and nbval run
them); solutions/ and notebooks/ sit at the same depth, so a relative path works in both.  Cell ids
come from the lab's name and the cell's position in the source, and student and solution cells that
correspond share an id; with machine metadata and widget views dropped (see `finalize`), rebuilding
a lab whose outputs are deterministic changes no byte.

Labs numbered 90–99 are instructors' notebooks (the board): they may have no checkoffs.  They still
get a copy in notebooks/, where `make lab` opens JupyterLab.

``--check`` compares the committed notebooks with what the sources generate (cells, sources,
metadata; the student copy entirely) and lists the differences; nbval checks the solutions' outputs.
``--no-execute`` rebuilds without running anything, keeping a solution cell's outputs while its
source is unchanged.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labsupport.course.checkoff import PASS_LINE, load_lab

PROMPT_WORD = "TO" + "DO"  # built from parts: the word itself never appears in labsupport's source
BEGIN_MARK = "### BEGIN SOLUTION"
END_MARK = "### END SOLUTION"
TAG_SOLUTION_ONLY = "solution-only"
TAG_CHECKOFF = "checkoff"
TAG_NBVAL_CHECK = "nbval-check-output"
TAG_RAISES = "raises-exception"
SOURCE_PATTERN = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.py$")
BEGIN_RE = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION(?:[ \t]+(?P<id>\d+\.\d+))?[ \t]*:?[ \t]*(?P<prompt>.*?)[ \t]*$")
END_RE = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
CHECK_RE = re.compile(r"""^[ \t]*(?:[\w.]+\.)?check\(\s*["'](\d+\.\d+)["']""", re.M)

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
LANGUAGE_INFO = {"name": "python", "pygments_lexer": "ipython3", "file_extension": ".py",
                 "mimetype": "text/x-python", "codemirror_mode": {"name": "ipython", "version": 3},
                 "nbconvert_exporter": "python"}
CELL_TIMEOUT_S = 600
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class BuildError(ValueError):
    """A lab source breaks a rule of the pipeline; the message names the lab and the cell."""


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


@dataclass
class Parsed:
    lab: Lab
    solution: nbformat.NotebookNode
    student: nbformat.NotebookNode
    regions: list[Region] = field(default_factory=list)
    checkoffs: dict[str, int] = field(default_factory=dict)  # checkoff id -> solution cell index


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

def cell_id(lab_name: str, position: int) -> str:
    return hashlib.sha1(f"{lab_name}:{position}".encode()).hexdigest()[:16]


def todo_message(checkoff_id: str, prompt: str) -> str:
    return f"{PROMPT_WORD} {checkoff_id}: {prompt}"


def cut_solutions(source: str, where: str) -> tuple[str, list[tuple[str, str]]]:
    """Replace every solution region of a code cell by its prompt; return the new source and (id, prompt)s."""
    out, found, open_region = [], [], None
    for number, line in enumerate(source.split("\n"), start=1):
        begin, end = BEGIN_RE.match(line), END_RE.match(line)
        if begin:
            if open_region:
                raise BuildError(f"{where}, line {number}: a solution region opens inside another one")
            if not begin["id"] or not begin["prompt"]:
                raise BuildError(f"{where}, line {number}: write '{BEGIN_MARK} N.M: <prompt for the student>' "
                                 f"(the checkoff it serves and a one-line prompt); got {line.strip()!r}")
            open_region = (begin["indent"], begin["id"], begin["prompt"], number)
        elif end:
            if not open_region:
                raise BuildError(f"{where}, line {number}: '{END_MARK}' without a matching '{BEGIN_MARK}'")
            indent, checkoff_id, prompt, _ = open_region
            message = todo_message(checkoff_id, prompt)
            out.append(f"{indent}# {message}")
            out.append(f"{indent}raise NotImplementedError({json.dumps(message, ensure_ascii=False)})")
            found.append((checkoff_id, prompt))
            open_region = None
        elif not open_region:
            out.append(line)
    if open_region:
        raise BuildError(f"{where}, line {open_region[3]}: '{BEGIN_MARK}' is never closed by '{END_MARK}'")
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


def parse(lab: Lab) -> Parsed:
    """Read a lab source and generate both notebooks (the solution not yet executed)."""
    import jupytext

    source_nb = jupytext.reads(lab.source.read_text(encoding="utf-8"), fmt="py:percent")
    sol_cells, stu_cells, regions, checkoffs = [], [], [], {}
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
        if cell.cell_type == "markdown":
            if BEGIN_MARK in body:
                raise BuildError(f"{where}: solution regions belong in code cells; tag a markdown answer "
                                 f"cell '{TAG_SOLUTION_ONLY}' instead")
            sol = nbformat.v4.new_markdown_cell(body, metadata=meta, id=cid)
            stu = nbformat.v4.new_markdown_cell(body, metadata=copy.deepcopy(meta), id=cid)
        elif cell.cell_type == "code":
            student_body, found = cut_solutions(body, where)
            regions += [Region(i, p, len(sol_cells)) for i, p in found]
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
    parsed = Parsed(lab, _notebook(sol_cells), _notebook(stu_cells), regions, checkoffs)
    _validate(parsed)
    return parsed


def _validate(parsed: Parsed) -> None:
    lab = parsed.lab
    registered = {c.id for c in load_lab(lab.number)}
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
    """Run `nb` in a fresh kernel of this interpreter, in `cwd`; returns the executed copy."""
    from nbclient import NotebookClient

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
    if len(labs) == len(discover(root)):
        sources = {lab.name for lab in labs}
        for folder in ("notebooks", "solutions"):
            for path in sorted((root / folder).glob("*.ipynb")):
                if path.stem not in sources:
                    diffs.append(f"{folder}/{path.name}: no source solutions/{path.stem}.py generates it")
    return diffs


def build_lab(lab: Lab, run: bool = True, progress: bool = True) -> float:
    """Write both notebooks of one lab; returns the seconds spent executing the solution."""
    parsed = parse(lab)
    seconds = 0.0
    if run:
        start = time.perf_counter()
        executed = execute(parsed.solution, lab.solution_path.parent, progress=progress, label=lab.name)
        seconds = time.perf_counter() - start
        validate_outputs(parsed, executed)
        solution = finalize(executed)
    else:
        solution = carry_outputs(parsed.solution, lab.solution_path)
    write(solution, lab.solution_path)
    write(parsed.student, lab.student_path)
    return seconds


# --- command line ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labsupport build",
                                description="Generate solution and student notebooks from solutions/NN_topic.py.")
    p.add_argument("labs", nargs="*", help="lab names or numbers (default: every lab)")
    p.add_argument("--check", action="store_true", help="compare committed notebooks with the sources; change nothing")
    p.add_argument("--no-execute", action="store_true", help="do not run the solutions (keep unchanged cells' outputs)")
    p.add_argument("--root", default=".", help="repository root holding solutions/ and notebooks/ (default: .)")
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
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
            seconds = build_lab(lab, run=not args.no_execute)
            ran = f"executed in {seconds:.1f} s" if not args.no_execute else "not executed"
            print(f"{lab.name}: wrote {lab.solution_path.relative_to(root)} ({ran}) and "
                  f"{lab.student_path.relative_to(root)}")
    except BuildError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 1
    return 0
