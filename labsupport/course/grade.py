"""`python -m labsupport grade PATH... [--jobs N] [--csv FILE] [--json] [--gradescope FILE]`: the grade (every lab).

check() is feedback; this decides, the way PrairieLearn's Python grader does (GRADING.md):
 1. Before any student code runs: per student and lab, HIDDEN_RUNS sets of hidden givens and the function
    checkoffs' hidden cases (from a secret; ``--seed`` repeats a run), and every expected value on them.
 2. The notebook runs whole in a sandbox (.sandbox, .runner): on the lecture's givens, then on each hidden
    set, its givens cell run as written with every given held to the set's value (however the cell binds it).
    Answers come back as plain data (a function's: what it did on the hidden inputs); no expected value goes in.
 3. Here each answer is judged (.judge) against its run's expected value, after check()'s scan of the
    exercise's cells (.scan): passed (right on every run and case), failed (where, with the hint) or not attempted.

Every notebook gets a row whatever it does (naming any bound it met); one per student and lab counts, the
newest.  Where the grader's own code fails (a hidden generator, an expected value, a judge on its own answer),
the checkoff, or the notebook, is marked REGRADE, never scored.  Exit code: 0 nothing failed, 1 a checkoff
failed or a notebook did not run, 2 a bad argument or a file that is not a notebook, 3 a grader fault (rows to
regrade, each named on stderr with its lab and checkoff; 3 wins over 2 and 1).
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import hashlib
import itertools
import json
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course import data, judge, record, scan
from labsupport.course.checkoff import forbidden_text
from labsupport.course.checkoffs import load_lab
from labsupport.course.registry import GIVENS, case_rng, namespace
from labsupport.course.report import (FAILED, NOT_ATTEMPTED, PASSED, REGRADE, CheckoffResult, NotebookGrade, csv_text,
                                      dump, format_grade, gradescope, safe, safe_path, summary, write_into_place)
from labsupport.course.sandbox import Bounds, NotABundle, Sandbox, forget_graders

HIDDEN_RUNS = 2  # re-runs on hidden givens: lab 02 grades in 1.76x its Run All, 30 in 4:23 (GRADING.md)
DEFAULT_TIMEOUT_S = 300  # per run, all its cells together
MAX_NOTEBOOK_BYTES = 64 * 2**20
MAX_CELLS = 5000
EXIT_REGRADE = 3  # a grader fault: some rows are to be graded again (GRADING.md)
LAB_NAME = re.compile(r"^(\d\d)_")
CHECK_ID = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")


def _lab_from_name(path: Path) -> int | None:
    match = LAB_NAME.match(Path(path).name)
    return int(match[1]) if match else None


class NotebookError(ValueError):
    """The file cannot be graded as a notebook; the message is one line saying why."""


@dataclass
class Cell:
    number: int  # 1-based, among all the notebook's cells, as JupyterLab counts them
    source: str
    id: str = ""
    tags: tuple = ()


@dataclass
class Notebook:
    path: Path
    cells: list[Cell]  # the code cells

    def lab(self) -> int:
        if (lab := _lab_from_name(self.path)) is not None:
            return lab
        labs = {int(i.split(".")[0]) for c in self.cells for i in CHECK_ID.findall(c.source)}
        if len(labs) == 1:
            return labs.pop()
        raise NotebookError("cannot tell which lab this is (name it NN_topic.ipynb)")

    def calling(self, checkoff_id: str) -> list[Cell]:
        return [c for c in self.cells if checkoff_id in CHECK_ID.findall(c.source)]


def read_notebook(path: Path) -> Notebook:
    """A notebook's code cells, read as data (bounded, linear in the file); NotebookError in one line."""
    try:
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            raise NotebookError(f"it is over the {MAX_NOTEBOOK_BYTES:,}-byte limit for a notebook")
        raw = json.loads(path.read_bytes().decode("utf-8"), parse_constant=lambda c: None)
    except OSError as exc:
        raise NotebookError(f"cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise NotebookError(f"not UTF-8 text (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise NotebookError(f"not a notebook: not JSON ({str(exc).splitlines()[0][:100]})") from None
    cells = raw.get("cells") if isinstance(raw, dict) else None
    if not isinstance(cells, list):
        raise NotebookError("not a notebook: it has no list of cells")
    if len(cells) > MAX_CELLS:
        raise NotebookError(f"{len(cells):,} cells is over the limit of {MAX_CELLS:,}")
    code = []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        tags = meta.get("tags") if isinstance(meta.get("tags"), list) else ()
        code.append(Cell(number, source if isinstance(source, str) else "", str(cell.get("id", ""))[:64],
                         tuple(t for t in tags if isinstance(t, str))))
    return Notebook(path, code)


@dataclass
class Run:
    """One run's answers (the last one per checkoff id), its errors per cell, and where it got to."""

    answers: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # cell number -> (ename, evalue)
    reached: int = 0  # the last cell it started
    ended: bool = False
    stop: str = ""


def runs_of(events: list, count: int) -> list[Run]:
    runs, shared = [Run() for _ in range(count)], Run()
    for e in events:
        number = e.get("run") if isinstance(e, dict) else -1  # None: before the fork
        if number is not None and not (type(number) is int and 0 <= number < count):
            continue
        run, kind, cell = shared if number is None else runs[number], e.get("e"), e.get("cell")
        if type(cell) is int:
            run.reached = max(run.reached, cell)
        if kind == "error" and type(cell) is int:
            run.errors.setdefault(cell, (safe(e.get("ename"), 200), safe(e.get("evalue"), 500)))
        elif kind == "answer" and isinstance(e.get("id"), str):
            run.answers[e["id"]] = e
        elif kind == "end":
            run.ended = True
        elif kind == "stop":
            run.stop = safe(e.get("why"), 200)
    for run in runs:  # the cells before the fork are every run's
        run.errors = {**shared.errors, **run.errors}
        run.answers = {**shared.answers, **run.answers}
    return runs


def _found_by_running(events: list) -> bool:
    """Whether the runner found the givens cell by running the cells (a notebook with no marked cell whose
    givens no reading of its code sees bound)."""
    return any(isinstance(e, dict) and e.get("e") == "givens" and type(e.get("cell")) is int for e in events)


class GraderFault(Exception):
    """The grader's own code failed (a hidden generator, an expected value, a judge): never the student's doing,
    so the checkoff (or the notebook) is marked REGRADE instead of scored.  Its text is `fault_text`'s."""


def fault_text(lab: int, checkoff_id: str | None, exc: BaseException) -> str:
    where = f"lab {lab:02d} checkoff {checkoff_id}" if checkoff_id else f"lab {lab:02d} (its hidden givens)"
    return f"grader fault in {where}: {type(exc).__name__}: {safe(exc, 300)}"


@dataclass
class Plan:
    """What the grader expects of one notebook, worked out before it runs."""

    runs: list[dict]  # the givens of each run: the lecture's, then the hidden sets
    specs: dict  # checkoff id -> [spec per run] (values), [spec] (choices), [(input, spec) per case] (functions)
    faults: dict = field(default_factory=dict)  # checkoff id -> its GraderFault's text, for one that failed to plan


class Grader:
    """Grades notebooks one at a time (thread-safe: `grade` may run in several threads at once)."""

    def __init__(self, sandbox: Sandbox, timeout: int = DEFAULT_TIMEOUT_S, secret: bytes | None = None,
                 hidden_runs: int = HIDDEN_RUNS):
        self.sandbox, self.timeout, self.hidden_runs = sandbox, timeout, hidden_runs
        self.secret = secret if secret is not None else secrets.token_bytes(32)

    def plan(self, lab: int, student: str) -> Plan:
        """The runs' givens and every checkoff's specs, per checkoff: one whose planning fails is in `faults`
        (and is regraded) while the others are graded; GraderFault only when the givens cannot be drawn."""
        key, checkoffs = f"{student}|{lab:02d}", load_lab(lab)  # the lab's module declares its givens
        runs = [dict(GIVENS[lab].lecture)] if lab in GIVENS else [{}]
        if lab in GIVENS:
            try:
                runs += GIVENS[lab].draw(case_rng("givens", self.secret, key), self.hidden_runs)
            except Exception as exc:  # noqa: BLE001 - any failure of the graders' code is the grader's fault
                raise GraderFault(fault_text(lab, None, exc)) from exc
        specs, faults = {}, {}
        for c in checkoffs:
            try:
                specs[c.id] = self.specs_of(c, runs, key)
            except Exception as exc:  # noqa: BLE001 - as above, for this checkoff alone
                faults[c.id] = fault_text(lab, c.id, exc)
        return Plan(runs, specs, faults)

    def specs_of(self, c, runs: list[dict], key: str) -> list:
        """Checkoff `c`'s specs on `runs` (its cases', for a function), as the plain data the judge reads."""
        if c.kind == "function":
            cases = [(k.input(sent=True), k.public_spec(c.name)) for k in c.cases(case_rng(c.id, self.secret, key))]
            if not cases:  # a function on no case would pass whatever it does
                raise ValueError("its generator yielded no case")
            return cases
        if c.takes_givens:
            return [c.value_spec(namespace(g)) for g in runs]
        return [c.value_spec()]

    def grade(self, path: Path, student: str = "") -> NotebookGrade:
        start = time.monotonic()
        grade = NotebookGrade(path, _lab_from_name(path), student)
        try:
            self._grade(Path(path), grade)
        except NotebookError as exc:
            grade.error, grade.invalid = str(exc), True
        except Exception as exc:  # noqa: BLE001 - a grader fault must never lose the batch, nor count against a row
            grade.fault = f"grader fault in {_lab_text(grade.lab)}: {type(exc).__name__}: {safe(exc, 300)}"
        grade.seconds = time.monotonic() - start
        return grade

    def _grade(self, path: Path, grade: NotebookGrade) -> None:
        nb = read_notebook(path)
        grade.lab = lab = nb.lab()
        checkoffs = load_lab(lab)
        if not checkoffs:
            raise NotebookError(f"lab {lab:02d} has no checkoffs to grade")
        try:
            plan = self.plan(lab, grade.student)
        except GraderFault as fault:  # no hidden givens: nothing can be judged, and nothing is run
            grade.checkoffs = [CheckoffResult(c.id, c.title, REGRADE, str(fault)) for c in checkoffs]
            return
        rec = record.read(lab) or {"checkoffs": []}
        cell = find_givens_cell(nb, rec.get("givens_cell"), set(plan.runs[0]))  # else the runner finds it by running
        job = {"cells": [(c.number, c.source) for c in nb.cells], "givens_cell": cell and cell.number,
               "runs": plan.runs,
               "timeout": self.timeout, "cwd": ""}
        job["cases"], job["shared"] = data.share({cid: [i for i, _ in s] for cid, s in plan.specs.items()
                                                  if s and isinstance(s[0], tuple)})
        deadline = time.monotonic() + self.timeout * (len(plan.runs) + 1) + 60
        outcome = self.sandbox.run(job, Path(os.path.abspath(path)).parent, deadline)
        runs = runs_of(outcome.events, len(plan.runs))
        if outcome.stopped:
            grade.error = f"the notebook was stopped: {outcome.stopped}" + _where(runs)
        grade.notes += [f"{_run_name(n)} stopped at cell {r.reached}: {r.stop}" for n, r in enumerate(runs) if r.stop]
        if outcome.dropped:
            grade.notes.append(f"{outcome.dropped} of its answer records were too large to read and were dropped")
        if cell is None and plan.runs[0] and not _found_by_running(outcome.events):
            grade.notes.append("no givens cell was found (no cell binds the lab's givens): they were bound before the "
                               "first cell, so an answer computed from numbers written elsewhere cannot follow them")
        grade.notes += outcome.notes  # the sandbox's own words
        notes = dict.fromkeys(safe(e.get("text"), 300) for e in outcome.events
                              if isinstance(e, dict) and e.get("e") == "note")
        grade.notes += [f"from inside the sandbox: {text}" for text in list(notes)[:5]]  # what its code says, once each
        entries = {e["id"]: e for e in rec["checkoffs"]}
        for c in checkoffs:  # every checkoff of the lab gets its line, whatever an answer does to the judge
            status, detail = self.judged(c, entries.get(c.id, {}), nb, plan, runs)
            grade.checkoffs.append(CheckoffResult(c.id, c.title, status, detail))

    def judged(self, c, entry: dict, nb: Notebook, plan: Plan, runs: list[Run]) -> tuple[str, str]:
        """`decide`, with what its exceptions mean: the grader's fault (REGRADE) or an answer no judge foresaw,
        which fails alone."""
        try:
            return self.decide(c, entry, nb, plan, runs)
        except GraderFault as fault:
            return REGRADE, str(fault)
        except Exception as exc:  # noqa: BLE001 - the judge met something: the answer, unless the judge is broken
            broken = _judge_broken(c, plan.specs.get(c.id, []))
            if broken is not None:
                return REGRADE, fault_text(c.lab, c.id, broken)
            return FAILED, _hinted(f"your answer could not be checked ({type(exc).__name__}: {safe(exc, 200)})",
                                   c.hint)

    def decide(self, c, entry: dict, nb: Notebook, plan: Plan, runs: list[Run]) -> tuple[str, str]:
        calls = nb.calling(c.id)  # its check() calls as written (a call in a loop over ids names none)
        if not calls and c.id not in runs[0].answers:
            return NOT_ATTEMPTED, "no cell of this notebook calls check() for it"
        exercise = [cell.source for cell in nb.cells if cell in calls or cell.id in entry.get("cells", ())]
        found = scan.hits(exercise, [cell.source for cell in nb.cells], c.forbid)
        if found:
            return FAILED, _hinted(forbidden_text(found, {"id": c.id, "derive": c.derive}), c.hint)
        if c.id in plan.faults:  # attempted, and the grader could not work out what to expect
            raise GraderFault(plan.faults[c.id])
        specs = _readable(c, plan.specs[c.id])
        answer = runs[0].answers.get(c.id)
        if answer is None or "unfinished" in answer:
            return _without(runs[0], calls, answer, 0)
        try:
            if c.kind == "function":
                if "observations" not in answer:
                    raise judge.Mismatch("this checkoff wants your function itself (no parentheses); "
                                         f"you gave {judge.echo(_value(answer))}.")
                observations = answer["observations"] if isinstance(answer["observations"], list) else []
                for spec, seen in zip(specs, observations + [None] * (len(specs) - len(observations))):
                    judge.observed(data.unplain(seen) if seen is not None else None, spec)
                return PASSED, ""
            judge.verdict(_value(answer), specs[0])
            for number in range(1, len(specs)):
                self._rerun(c, runs[number], calls, specs[number], number)
        except judge.Unfinished as exc:
            return NOT_ATTEMPTED, str(exc)
        except judge.Mismatch as exc:
            return FAILED, _hinted(str(exc), c.hint)
        except data.DataError as exc:
            return FAILED, f"the answer handed to check() could not be read as plain data ({exc})"
        return PASSED, ""

    def _rerun(self, c, run: Run, calls: list[Cell], spec: dict, number: int) -> None:
        answer = run.answers.get(c.id)
        if answer is None or "unfinished" in answer:
            why = _without(run, calls, answer, number)[1]
            raise judge.Mismatch(f"right on the lab's givens, but on {_run_name(number)} {why}")
        try:
            judge.verdict(_value(answer), spec)
        except judge.Mismatch:
            raise judge.Mismatch(
                f"right on the lab's givens, but on {_run_name(number)} (the notebook re-run with other values of "
                f"its givens) it gave {judge.echo(_value(answer))}, which is not what those givens make it: a number "
                "typed or copied in, or a step that does not follow the givens cell's names") from None


def _readable(c, specs: list) -> list[dict]:
    """The plan's specs (a function's: its cases' specs) as the judge compares with them: the grader's own
    data, so a failure here is a GraderFault, never the answer's."""
    try:
        return [judge.readable(s[1] if c.kind == "function" else s) for s in specs]
    except Exception as exc:  # noqa: BLE001 - any failure of the grader's own data
        raise GraderFault(fault_text(c.lab, c.id, exc)) from exc


def _judge_broken(c, specs: list) -> BaseException | None:
    """What a judge raises, other than a verdict, on the expected answer itself (None if it judges it): a judge
    that cannot judge its own answer is broken, and an answer that made it raise is not the student's fault.
    A judge that can is sound, so whatever the answer made it raise stays the answer's (it fails alone)."""
    try:
        for spec in _readable(c, specs):
            own = {"result": spec.get("want")}
            try:
                judge.observed(own, spec) if c.kind == "function" else judge.verdict(spec.get("want"), spec)
            except (judge.Mismatch, judge.Unfinished, data.DataError):
                pass  # a verdict: the judge ran to the end
    except GraderFault as fault:
        return fault.__cause__ or fault
    except Exception as exc:  # noqa: BLE001 - the judge itself failed
        return exc
    return None


def find_givens_cell(nb: Notebook, cell_id: str | None, names: set) -> Cell | None:
    """The notebook's givens cell: the one with the lab's cell id, else the one tagged 'givens', else the one
    binding the most of the givens `names` (ties: the first).  A tool that drops or changes ids and tags
    (Colab, nbformat 4.0, VS Code, Jupytext) loses nothing, and an id or tag on a cell that binds no given
    gives way to a cell that does (a notebook that was edited so)."""
    marked = [c for c in nb.cells if cell_id and c.id == cell_id] + [c for c in nb.cells if "givens" in c.tags]
    found = next((c for c in marked if binds(c.source) & names), None)
    if found is None and names:  # the whole notebook is read only when no marked cell binds a given
        counts = {c.number: len(binds(c.source) & names) for c in nb.cells}
        best = max(nb.cells, key=lambda c: counts[c.number], default=None)  # max keeps the first of equals
        found = best if best is not None and counts[best.number] else None
    return found or next(iter(marked), None)


MAX_SCANNED = 65_536  # characters of a cell read for what it binds: a givens cell is a few lines


def binds(source: str, _depth: int = 0) -> set[str]:
    """The global names a cell's code binds, read statically after IPython's transformation of its magics:
    assignments of every kind and unpacking, and the string keys given to globals().update(...) or
    globals()[...] =; the code of a %time line or a %%time cell too.  Nothing inside a def, lambda or class."""
    if len(source) > MAX_SCANNED or _depth > 2:
        return set()
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        tree = ast.parse(TransformerManager().transform_cell(source))
    except Exception:  # noqa: BLE001 - not Python, even after IPython's transformation: it binds nothing seen
        return set()
    dicts = {t.id: _keys(st.value) for st in ast.walk(tree) if isinstance(st, ast.Assign)
             for t in st.targets if isinstance(t, ast.Name) and isinstance(st.value, ast.Dict)}
    found, stack = set(), [tree]
    while stack:  # a walk of our own: ast.walk would enter the scopes whose names are not the cell's
        node = stack.pop()
        found |= _bound_by(node, dicts, _depth)
        if not isinstance(node, SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return found


def _bound_by(node: ast.AST, dicts: dict, depth: int) -> set[str]:
    """The names one node binds in the notebook's namespace; `dicts`: the cell's names bound to dict displays."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return {node.id}
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and _namespace(node.value):
        key = node.slice
        return {key.value} if isinstance(key, ast.Constant) and isinstance(key.value, str) else set()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
            and _namespace(node.func.value):
        found = {k.arg for k in node.keywords if k.arg}
        for arg in node.args:  # a dict display, dict(...), or a name the cell bound to a dict display
            found |= dicts.get(arg.id, set()) if isinstance(arg, ast.Name) else _keys(arg)
        return found
    code = _magic_code(node)
    return binds(code, depth + 1) if code is not None else set()


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
          ast.GeneratorExp)  # what they bind is not the cell's global (a comprehension's loop name is its own)


def _namespace(node: ast.AST) -> bool:
    """`globals()`, `locals()` or `vars()`: at a cell's top level, each is the notebook's namespace."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args \
        and node.func.id in ("globals", "locals", "vars")


def _keys(node: ast.AST) -> set[str]:
    """The string keys of a dict display, or the keywords of a dict(...) call."""
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {k.arg for k in node.keywords if k.arg}
    return set()


def _magic_code(node: ast.AST) -> str | None:
    """The code a magic that runs Python in the notebook's namespace is handed (``%time A = 6``, a ``%%time``
    cell's body), as IPython's transformation writes the call: ``get_ipython().run_line_magic('time', 'A = 6')``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("run_line_magic", "run_cell_magic") and node.args \
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args) \
            and node.args[0].value in PYTHON_MAGICS:
        return node.args[-1].value
    return None


PYTHON_MAGICS = ("time", "capture")  # %timeit binds in a function of its own; %%bash and the like are not Python


def _value(answer: dict):
    if "unreadable" in answer or "too_large" in answer:
        raise data.DataError(str(answer.get("unreadable") or f"{answer['too_large']:,} characters"))
    return data.unplain(answer.get("value"))


def _run_name(number: int) -> str:
    return "the lecture's givens" if number == 0 else f"hidden givens set {number}"


def _where(runs: list[Run]) -> str:
    last = next((n for n in range(len(runs) - 1, -1, -1) if runs[n].reached), None)
    return "" if last is None else f" (on {_run_name(last)}, at cell {runs[last].reached})"


def _without(run: Run, calls: list[Cell], answer, number: int) -> tuple[str, str]:
    """Why a run has no answer for a checkoff whose check() call is in the notebook."""
    if answer is not None:
        return NOT_ATTEMPTED, "the exercise still holds the student copy's placeholder"
    if not calls:
        return FAILED, f"no answer was handed to check() (the run reached cell {run.reached})"
    numbers = {c.number for c in calls}
    for cell in sorted(run.errors):
        if cell in numbers or cell < min(numbers):  # a placeholder raising before the call is not attempted
            ename, evalue = run.errors[cell]
            if ename == "NotImplementedError" and number == 0:
                return NOT_ATTEMPTED, evalue
            if cell in numbers:
                return FAILED, f"cell {cell} raised {ename}: {evalue}, before handing the answer over"
    if not run.ended and run.reached <= max(numbers):
        why = run.stop or "the notebook was stopped"
        return FAILED, f"the run did not reach its check() cell ({why}, at cell {run.reached})"
    return NOT_ATTEMPTED if number == 0 else FAILED, "its check() call never ran (in a branch that was not taken?)"


def _hinted(text: str, hint: str) -> str:
    return f"{text}\nHint: {hint}"


@dataclass
class Submission:
    path: Path
    student: str
    refused: str = ""  # why it is listed and never graded
    error: str = ""  # why the student's folder could not be collected: a row saying so, nothing of it graded


# What one student's folder may hold, for it to be collected (a folder argument, or a class folder's student
# folder).  A hand-in is a few notebooks, maybe with data and a helper module; these are orders of magnitude
# above that and keep the walk of one folder to milliseconds.  Past either, the student gets one row saying
# so, nothing of theirs is graded (the newest notebook cannot be told from a partial walk) and the batch goes on.
MAX_DEPTH = 32  # levels of folders below the student's folder
MAX_ENTRIES = 10_000  # files, folders and links in it, every level counted


class CollectError(ValueError):
    """A student's folder is beyond what a hand-in may be; the message is one line saying which limit."""


def notebooks_in(folder: Path, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> list[Path]:
    """Every .ipynb under `folder` (checkpoints aside), in name order, links included: `refusal` names them.

    An explicit stack, never recursion (a folder nested 1,100 deep made Path.rglob raise RecursionError and
    lose the batch); a folder that is a link is listed if named .ipynb, never entered (as rglob did not), and
    a folder that cannot be read is passed over.  CollectError past `max_depth` or `max_entries`."""
    found, seen, stack = [], 0, [(Path(folder), 0)]
    while stack:
        here, depth = stack.pop()
        try:
            with os.scandir(here) as entries:
                listed = list(itertools.islice(entries, max_entries - seen + 1))
        except OSError:
            continue
        seen += len(listed)
        if seen > max_entries:
            raise CollectError(f"{safe_path(folder)} holds more than {max_entries:,} files and folders (the limit "
                               "for one hand-in): hand in the notebooks, not a whole tree")
        for entry in listed:
            path = here / entry.name
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
                is_notebook = entry.is_file() or entry.is_symlink()
            except OSError:
                continue
            if is_folder and entry.name != ".ipynb_checkpoints":
                if depth + 1 > max_depth:
                    raise CollectError(f"{safe_path(folder)} has folders nested more than {max_depth} deep (the "
                                       f"limit for one hand-in), such as {safe_path(path.relative_to(folder).parts[0])}"
                                       "/…: hand in the notebooks, not a whole tree")
                stack.append((path, depth + 1))
            elif not is_folder and is_notebook and entry.name.endswith(".ipynb"):
                found.append(path)
    return sorted(found)


def refusal(path: Path, top: Path) -> str:
    """Why a notebook under `top` is never graded ("" if it is): it, or a folder between, is a link."""
    for q in itertools.takewhile(lambda q: q != top, [path, *path.parents]):
        if q.is_symlink():
            return f"{safe(q.name, 200)} is a symbolic link, not a notebook handed in: hand in the file itself"
    return ""


def choose(submissions: list[Submission], lab: int | None = None) -> list[tuple[str, int | None]]:
    """Per submission, "" if it is graded, else why not (with its lab): one notebook per student and lab,
    the newest by modification time (ties: the path last in name order), never the best one."""
    def lab_of(path: Path) -> int | None:
        try:
            return read_notebook(path).lab()
        except NotebookError:
            return _lab_from_name(path)

    def age(path: Path) -> tuple[int, str]:
        try:
            return path.stat().st_mtime_ns, os.fsdecode(path)
        except OSError:
            return -1, os.fsdecode(path)

    labs = [None if s.error else _lab_from_name(s.path) if s.refused else lab_of(s.path) for s in submissions]
    groups: dict[tuple, list[int]] = {}
    for i, (s, n) in enumerate(zip(submissions, labs)):
        if not s.refused and not s.error:  # a folder that could not be collected competes with no notebook
            groups.setdefault((s.student, n if n is not None else str(s.path)), []).append(i)
    why = [s.refused for s in submissions]
    for (student, n), members in groups.items():
        newest = max(members, key=lambda i: age(submissions[i].path))
        for i in members:
            if lab is not None and n != lab:
                why[i] = f"a notebook of {_lab_text(n)}; this assignment is lab {lab:02d}"
            elif i != newest:
                why[i] = (f"{safe(os.fsdecode(submissions[newest].path), 300)} is {safe(student, 100)}'s newer "
                          f"notebook of {_lab_text(n)} and is the one graded (one notebook per lab counts: the newest)")
    return list(zip(why, labs))


def _lab_text(lab) -> str:
    return f"lab {lab:02d}" if isinstance(lab, int) else "no lab"


def collect(paths: list[str]) -> tuple[list[Submission], list[str]]:
    """Notebooks to grade, each with its student; and, in words, each argument that cannot be used.

    Each argument is one student's work: a notebook (the student is its folder's name) or a folder
    (its name); a lone folder argument with no notebook directly in it is a class, one folder per student.
    A student's folder past notebooks_in's limits is one Submission with its `error`, the others go on."""
    found, problems = [], []
    folder_of: dict[str, Path] = {}
    for arg in paths:
        p = Path(arg)
        if p.is_file() or p.is_symlink():
            folder = Path(os.path.abspath(p)).parent  # as given: a link is never followed to name its student
            found.append(Submission(p, folder.name, refusal(Path(os.path.abspath(p)), folder)))
            owned = [(folder.name, folder)]
        elif p.is_dir():
            a_class = len(paths) == 1 and not _notebooks_directly_in(p)
            students = [(q.name, q) for q in _student_folders(p)] if a_class else [(p.resolve().name, p)]
            owned = []
            for student, folder in students:
                try:
                    notebooks = notebooks_in(folder)
                except CollectError as exc:
                    found.append(Submission(folder, student, error=str(exc)))
                    owned.append((student, folder.resolve()))
                    continue
                found += [Submission(q, student, refusal(q, p)) for q in notebooks]
                owned += [(student, folder.resolve())] if notebooks else []
            if not owned:
                problems.append(f"{safe(arg, 300)} is a folder with no .ipynb in it")
                continue
        else:
            problems.append(f"no such notebook or folder: {safe(arg, 300)}")
            continue
        for student, folder in owned:
            if folder_of.setdefault(student, folder) != folder:
                problems.append(f"{safe_path(folder)} and {safe_path(folder_of[student])} would both be student "
                                f"{safe(student, 100)!r}: grade them apart, or rename one folder")
    return found, list(dict.fromkeys(problems))


def _notebooks_directly_in(folder: Path) -> bool:
    """Whether `folder` itself holds a notebook (then it is one student's, never a class)."""
    try:
        with os.scandir(folder) as entries:
            return any(e.name.endswith(".ipynb") and not e.is_dir(follow_symlinks=False) for e in entries)
    except OSError:
        return False


def _student_folders(folder: Path) -> list[Path]:
    """A class folder's student folders, in name order: its folders (a link to one is not entered, as rglob did not)."""
    try:
        with os.scandir(folder) as entries:
            return sorted(folder / e.name for e in entries
                          if e.is_dir(follow_symlinks=False) and e.name != ".ipynb_checkpoints")
    except OSError:
        return []


def grade_all(grader: Grader, submissions: list[Submission], jobs: int = 1, progress: bool = True,
              on_done=None, lab: int | None = None) -> list[NotebookGrade]:
    """Grade the submissions `choose` picks, `jobs` at a time; a row for every one, in the order given."""
    from tqdm.auto import tqdm

    results = [NotebookGrade(s.path, None, s.student, error=s.error) if s.error else
               NotebookGrade(s.path, its_lab, s.student, not_graded=why) if why else None
               for s, (why, its_lab) in zip(submissions, choose(submissions, lab))]
    todo = [i for i, r in enumerate(results) if r is None]
    with tqdm(total=len(todo), desc="grading", unit="notebook", file=sys.stderr, disable=not progress) as bar, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(grader.grade, submissions[i].path, submissions[i].student): i for i in todo}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as exc:  # noqa: BLE001 - grade() catches; this is the last net
                results[i] = NotebookGrade(submissions[i].path, None, submissions[i].student,
                                           fault=f"grader fault: {type(exc).__name__}: {safe(exc, 300)}")
            bar.update(1)
            if on_done is not None:
                on_done([r for r in results if r is not None])
    return [r for r in results if r is not None]


def whole_number(low: int, high: float, wants: str):
    """An argparse type: a whole number in [low, high]; else the error "<wants>, got '<text>'"."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{wants}, got {text!r}")
        return value
    return parse


positive_int = whole_number(1, float("inf"), "wants a whole number of at least 1")


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m labsupport grade",
                      description="Grade notebooks: each runs whole in a sandbox, on the lecture's and hidden givens; "
                                  "the answers are judged outside it.")
    p.add_argument("paths", nargs="+", help="notebooks, or folders of them (one folder per student)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--csv", metavar="FILE", help="also write the gradebook: one row per student × lab")
    p.add_argument("--gradescope", metavar="FILE", help="also write Gradescope's results.json format")
    p.add_argument("--jobs", type=positive_int, default=1, help="notebooks graded at once (default 1)")
    p.add_argument("--timeout", type=positive_int, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds one run of a notebook may take, all its cells together (default {DEFAULT_TIMEOUT_S})")
    p.add_argument("--memory", type=positive_int, default=Bounds.memory // 2**20, metavar="MIB",
                   help="memory a notebook's sandbox may use, its /tmp and scratch included (default %(default)s MiB)")
    p.add_argument("--seed", type=int, default=None, help="seed the hidden givens and cases (default: a fresh secret)")
    p.add_argument("--trusted", action="store_true",
                   help="where bubblewrap cannot run: grade without isolation, as you (only notebooks you trust)")
    p.add_argument("--container", action="store_true",
                   help="one container per submission, as root (Gradescope): delete the graders, run as nobody")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def usage_error(prog: str, message: str) -> int:
    """A refused command line: one line on stderr, and the exit code 2."""
    print(f"{prog}: {message}", file=sys.stderr)
    return 2


def unwritable(path: Path) -> str:
    """Why no file can be written at `path`, or "" (a bare file name's folder is ".")."""
    if path.is_dir():
        return "is a folder, not a file"
    if not path.parent.is_dir():
        return f"no such folder {path.parent}"
    return "" if os.access(path.parent, os.W_OK) else f"folder {path.parent} is not writable"


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a report is written whatever the terminal can show
        getattr(stream, "reconfigure", lambda **kw: None)(errors="backslashreplace")
    try:
        args = _parser().parse_args(argv)
    except UsageError as exc:
        return usage_error("grade", str(exc))
    for flag, value in (("--csv", args.csv), ("--gradescope", args.gradescope)):
        if value is not None and (why := unwritable(Path(value))):
            return usage_error("grade", f"{flag} {value}: {why}")
    submissions, missing = collect(args.paths)
    if missing:
        return usage_error("grade", missing[0] + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    bounds = Bounds(memory=args.memory * 2**20)
    sandbox = Sandbox.for_this_machine(trusted=args.trusted, container=args.container, bounds=bounds)
    if sandbox is None:
        return usage_error("grade", f"cannot isolate notebooks here: {Sandbox('bubblewrap', bounds).missing()}; "
                           "student code would run as you, unbounded; use --container inside a per-submission "
                           "container, or --trusted for notebooks you trust")
    print(f"grade: isolation: {sandbox.describe()}", file=sys.stderr)
    secret = hashlib.sha256(f"seed {args.seed}".encode()).digest() if args.seed is not None else None
    grader = Grader(sandbox, timeout=args.timeout, secret=secret)
    if args.container:
        try:
            prepare_then_forget(grader, submissions)
        except NotABundle as exc:
            return usage_error("grade", f"--container: {exc}")
    return _report(args, grader, submissions)


def prepare_then_forget(grader: Grader, submissions: list[Submission]) -> None:
    """Container mode: load every graded lab's graders while they are on disk, then delete them."""
    for lab in ({_lab_from_name(s.path) for s in submissions} | set(range(9))) - {None}:
        load_lab(lab)
    forget_graders()


def _report(args, grader: Grader, submissions: list[Submission]) -> int:
    unwritten: dict[str, str] = {}

    def write_files(done: list[NotebookGrade]) -> None:  # a file that cannot be written never stops the batch
        for flag, value, text in (("--csv", args.csv, lambda: csv_text(done)),
                                  ("--gradescope", args.gradescope, lambda: dump(gradescope(done)))):
            if value:
                try:
                    write_into_place(Path(value), text())
                    unwritten.pop(flag, None)
                except OSError as exc:
                    unwritten[flag] = f"grade: {flag} {value}: could not write it ({exc.strerror or exc})"

    grades: list[NotebookGrade] = []
    try:
        grades = grade_all(grader, submissions, jobs=args.jobs, progress=not args.no_progress,
                           on_done=lambda done: (grades.__setitem__(slice(None), done), write_files(done)))
    finally:
        write_files(grades)
    for problem in [f"grade: {g.path}: {safe(g.error)}" for g in grades if g.invalid] + list(unwritten.values()):
        print(problem, file=sys.stderr)
    for g in grades:  # each grader fault, with its lab and checkoff: these rows are to be graded again
        for line in g.regrade:
            print(f"grade: {g.path}: {line}", file=sys.stderr)
    if args.json:
        sys.stdout.write(dump(summary(grades)))
    else:
        for g in grades:
            print(format_grade(g))
        totals = summary(grades)
        print(f"TOTAL {totals['passed']}/{totals['total']} checkoffs passed, {totals['failed']} failed, "
              f"{totals['not_attempted']} not attempted" + (f", {totals['regrade']} to REGRADE (grader faults)"
                                                             if totals["regrade"] else ""))
    if any(g.regrade for g in grades):  # first: a grader fault is what a batch script must not miss
        return EXIT_REGRADE
    if any(g.invalid for g in grades) or unwritten:
        return 2
    return 1 if any(g.failed or g.error for g in grades) else 0
