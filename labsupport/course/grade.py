"""`python -m labsupport grade PATH... [--jobs N] [--csv FILE] [--json] [--gradescope FILE]`: the grade (every lab).

check() in a notebook is feedback; this decides.  The verdict is reached in this process, which
never runs a line of student code:

 1. Before anything of the student's runs, labsupport's own files are read into memory and, per
    notebook, each checkoff is *prepared*: its expected value, or
    its cases (the lab's own inputs plus hidden ones drawn from a secret seed per run, notebook and
    checkoff) with their expected results.
 2. The notebook is read as a file (labsupport.course.answers): its code cells, and every
    ``check("N.M", answer)`` call, whatever ``check`` is bound to there.
 3. A copy of it runs top to bottom in a fresh kernel, in a temporary copy of its folder, on a fresh
    private copy of labsupport without the graders.  Its check() calls are rewritten to hand each
    answer to the grader as plain data (labsupport.course.codec); its stored outputs, its prints and
    its own check() are never read.
 4. A function answer is rebuilt from the notebook's *source* (the cut of the code it depends on)
    in a separate worker process (labsupport.course.worker), which the checkoff's judge calls on the
    prepared cases; results come back as plain data.  Names the checkoff forbids fail the answer
    ("derive, don't call"), whether they appear in the code or are called while it runs.
 5. The judge compares, here.  A checkoff is

      passed         the answer matched every case;
      failed         it did not (the detail says how, and gives the hint), it used a forbidden
                     shortcut, or its cell raised before handing the answer over;
      not attempted  no check() call for it, its cell never ran, or the exercise is still the
                     student copy's placeholder (NotImplementedError, ``...``).

Every notebook gets a row, whatever it does (a kernel that dies, ``os._exit``, a timeout, a patched
stdlib, a file that is not a notebook, a garbled or enormous answer: that fails its own checkoff);
the batch goes on, and the JSON/CSV/Gradescope files are always written, each through a fresh
private folder and renamed into place.  A notebook's cells get --timeout seconds all together,
however many there are; starting its kernel gets as much again, and so do all its answers' re-runs in
the worker together (a function's tests, a value's code on the hidden givens).
Notebooks or folders may be given: each is one student, except a lone folder with no notebook of its
own, which is a class of student folders; a notebook that is a link is listed, never graded.  One
notebook per student and lab is graded: the newest by modification time (ties: the last path in
name order), never the best one; the others are listed as not graded.  Exit code: 0 when
everything passed or was not attempted, 1 when a checkoff failed or a notebook could not be run to
the end, 2 for a bad argument, a file that is not a notebook, or an output file that could not be
written.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course import answers as A
from labsupport.course import codec
from labsupport.course.checkoff import (FAILED, NOT_ATTEMPTED, PASSED, Checkoff, Forbidden, Mismatch, case_rng,
                                        load_lab)
from labsupport.course.registry import GIVENS, namespace
from labsupport.course.sandbox import Sandbox, describe, link
from labsupport.units import fmt_number

SYMBOLS = {PASSED: "✅", FAILED: "❌", NOT_ATTEMPTED: "⬜"}
LABS = range(100)
GRADER_ONLY = ("course/checkoffs",)  # never copied where student code runs: the graders and their answers
ANSWERS_FILE = "answers.jsonl"
MAX_RECORD_BYTES = 16 * 2**20  # one answer; a longer one fails its own checkoff
MAX_ANSWER_BYTES = 2**30  # the whole answers file read
MAX_FOLDER_BYTES = 256 * 2**20
MAX_TEXT_CHARS = 4000  # of anything the student's code wrote that a report keeps (an error, a detail)
DEFAULT_TIMEOUT_S = 300
# how the collector starts each line (codec.collector): enough to say whose answer a garbled line was
RECORD_HEAD = re.compile(rb'\{"id":"([0-9.]{1,12})","index":(\d{1,9}),"callable":(?:true|false),"value":')


@dataclass
class CheckoffResult:
    id: str
    title: str
    status: str
    detail: str = ""

    def __post_init__(self):
        self.detail = cut(self.detail)


def cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text` up to `limit` characters, and a note of how much was cut."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… [cut: {len(text) - limit:,} more characters]"


@dataclass
class NotebookGrade:
    path: str
    lab: int | None
    student: str = ""
    seconds: float = 0.0
    error: str = ""
    invalid: bool = False  # the file is not a notebook that can be graded
    not_graded: str = ""  # why this notebook was not graded (another one of the student's counts for the lab)
    notes: list[str] = field(default_factory=list)
    checkoffs: list[CheckoffResult] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(c.status == PASSED for c in self.checkoffs)

    @property
    def failed(self) -> int:
        return sum(c.status == FAILED for c in self.checkoffs)

    @property
    def total(self) -> int:
        return len(self.checkoffs)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(passed=self.passed, failed=self.failed, total=self.total, seconds=round(self.seconds, 3))
        return out


# --- what the grader keeps for itself ----------------------------------------------------------------

class Snapshot:
    """labsupport's own files as they were when grading began (read before any notebook runs).

    Kernels and workers get a fresh copy of these, written per notebook, without the graders; in a
    sandbox (labsupport.course.sandbox) that copy is read-only and the installed package out of sight.
    """

    def __init__(self, package: Path):
        self.package = package
        self.files: dict[str, bytes] = {}
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                self.files[path.relative_to(package).as_posix()] = path.read_bytes()

    def write(self, site: Path) -> Path:
        """site/labsupport with every file but the graders; `site` is put first on the kernel's path."""
        target = site / "labsupport"
        for rel, data in self.files.items():
            if any(rel == g or rel.startswith(g + "/") for g in GRADER_ONLY):
                continue
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        return site


# --- running the notebook: only to collect the answers --------------------------------------------------

SETUP = """\
import labsupport.course.codec as _labsupport_codec, builtins as _labsupport_builtins
_labsupport_builtins.__dict__[{name!r}] = _labsupport_codec.collector({path!r})
del _labsupport_codec, _labsupport_builtins
"""


def _collecting_client():
    from nbclient import NotebookClient

    import nbformat

    class Collecting(NotebookClient):
        """Keeps each cell's error name and message and drops every other output the kernel sends.

        All cells together get `budget` seconds (each cell is given what is left of it), and the
        client remembers which cell it is running, so that a stop can say where it happened.
        """

        budget: float = DEFAULT_TIMEOUT_S
        deadline: float | None = None
        running: int | None = None  # index of the cell being run

        def _time_left(self, cell) -> int:
            return max(1, int(self.deadline - time.monotonic()) + 1)

        async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
            from nbclient.exceptions import CellTimeoutError

            if self.deadline is None:
                self.deadline = time.monotonic() + self.budget
                self.timeout_func = self._time_left
            self.running = cell_index
            if time.monotonic() >= self.deadline:
                raise CellTimeoutError("the notebook's time is up")
            return await super().async_execute_cell(cell, cell_index, *args, **kwargs)

        def process_message(self, msg, cell, cell_index):
            msg_type = msg.get("msg_type")
            content = msg.get("content") or {}
            if msg_type in ("stream", "display_data", "execute_result", "update_display_data", "clear_output") \
                    or str(msg_type).startswith("comm"):
                if isinstance(content, dict) and "execution_count" in content:
                    cell["execution_count"] = content["execution_count"]
                return None
            if msg_type == "error":
                out = nbformat.v4.new_output("error", ename=cut(content.get("ename"), 200),
                                             evalue=cut(content.get("evalue"), 500), traceback=[])
                cell.outputs.append(out)
                return out
            return super().process_message(msg, cell, cell_index)

    return Collecting


@dataclass
class Run:
    error: str = ""
    stop: str = ""  # why the cells stopped before the end ("the kernel died at cell 7"), if they did
    stopped_at: int | None = None  # the notebook cell number running when they stopped
    ran: set[int] = field(default_factory=set)  # notebook cell numbers that executed
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)  # cell number -> (ename, evalue)
    records: dict[str, dict] = field(default_factory=dict)  # checkoff id -> its last answer record


def _copy_folder(src: Path, dest: Path, notebook: Path) -> None:
    """A copy of the notebook's folder (files under the size cap, no links followed) to run it in."""
    dest.mkdir(parents=True, exist_ok=True)
    budget = MAX_FOLDER_BYTES
    for root, dirs, files in os.walk(src, followlinks=False):
        dirs[:] = [d for d in dirs if d not in (".ipynb_checkpoints", "__pycache__", ".git")]
        rel = Path(root).relative_to(src)
        if len(rel.parts) > 4:
            continue
        for name in files:
            path = Path(root) / name
            if path.is_symlink() or path == notebook:
                continue
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size > budget:
                continue
            budget -= size
            target = dest / rel / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(path, target)


def run_notebook(nb: A.Notebook, job: Path, snapshot: Snapshot, timeout: int, slot=None) -> Run:
    """Execute a collecting copy of `nb` in a fresh kernel; return what it handed over."""
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    from labsupport.course.build import kernel_manager

    run = Run()
    if slot is not None:
        slot.enter(job)
    site = snapshot.write(job / "kernel_site")
    home = job / "home"
    work = job / "work" / (nb.path.parent.name or "notebook")
    for folder in (home, work):
        folder.mkdir(parents=True, exist_ok=True)
    _copy_folder(nb.path.parent, work, nb.path)
    records = job / ANSWERS_FILE
    records.touch()
    collector = "__labsupport_answer_" + secrets.token_hex(8) + "__"
    cells = [nbformat.v4.new_code_cell(SETUP.format(name=collector, path=str(records)))]
    numbers = [0]
    for cell in nb.cells:
        cells.append(nbformat.v4.new_code_cell(A.collecting_source(nb, cell, collector)))
        numbers.append(cell.number)
    runnable = nbformat.v4.new_notebook()
    runnable.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    runnable.cells = cells
    (work / nb.path.name).write_text(nbformat.writes(runnable), encoding="utf-8")
    env = _student_env(site, home)
    km = kernel_manager()
    km.transport, km.ip = "ipc", str(job / "ipc" / "kernel")  # sockets in its own folder: no port to share
    km.connection_file = str(job / "kernel.json")
    (job / "ipc").mkdir(mode=0o700)
    km.write_connection_file()  # now, to hand it to the kernel's user (jupyter_client keeps one written)
    _show_data(snapshot, site, slot)
    if slot is not None:  # the kernel starts in the slot's sandbox, as the slot's user
        slot.own(home, job / "work", job / "ipc", records, Path(km.connection_file))
        km.kernel_spec.argv = slot.command(list(km.kernel_spec.argv))
    client = _collecting_client()(runnable, km=km, timeout=timeout, allow_errors=True,
                                  resources={"metadata": {"path": str(work)}}, record_timing=False,
                                  store_widget_state=False, startup_timeout=max(60, timeout))
    client.budget = timeout  # all the cells together, however many there are
    watchdog = _Watchdog(km, limit=max(60, timeout) + timeout + 10)  # starting, then every cell
    try:
        with watchdog:  # the kernel's own stdout/stderr go nowhere: the grader never reads them
            client.execute(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as exc:  # noqa: BLE001 - any stop: a timeout, a dead kernel, garbage messages (a patched json)
        too_long = (f"the notebook ran longer than {timeout} s", "--timeout, all its cells together")
        what, why = (too_long if isinstance(exc, CellTimeoutError) or watchdog.fired else
                     ("the kernel died", "os._exit, a crash, or out of memory") if isinstance(exc, DeadKernelError) else
                     ("the kernel stopped answering the grader properly", f"{type(exc).__name__}: {cut(exc, 200)}"))
        index = client.running
        where = ("before its first cell" if index is None else "in the grader's setup cell" if index == 0
                 else f"at cell {numbers[index]}")
        run.stopped_at = None if index is None else numbers[index]
        run.stop = f"{what} {where} ({why})"
        run.error = f"{run.stop}; the cells after it never ran"
    finally:
        _kill_kernel(km)
    setup = runnable.cells[0]
    if setup.get("outputs") and not run.error:
        e = setup.outputs[0]
        run.error = f"the grader could not start collecting answers ({e.get('ename')}: {e.get('evalue')})"
    for index, cell in enumerate(runnable.cells[1:], start=1):
        if cell.get("execution_count") is not None or cell.get("outputs"):
            run.ran.add(numbers[index])
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                run.errors.setdefault(numbers[index], (str(out.get("ename")), str(out.get("evalue"))))
    run.records = _read_records(records)
    return run


class _Watchdog:
    """Kills the kernel if it outlives starting plus the cells' budget (a net: the client's own timeouts come first)."""

    def __init__(self, km, limit: float):
        self.km, self.limit, self.fired = km, limit, False
        self._stop = threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def _watch(self):
        if not self._stop.wait(self.limit):
            self.fired = True
            _kill_kernel(self.km)


def _kill_kernel(km) -> None:
    proc = getattr(getattr(km, "provisioner", None), "process", None)
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.kill()
        proc.wait(10)  # reaped here: a zombie would still count as a process of the slot's user


def _show_data(snapshot: Snapshot, site: Path, slot) -> None:
    """What the data loaders look for beside the package (data/, ../shared/traces, $LABSUPPORT_DATA), read-only."""
    repo, env = snapshot.package.parent, os.environ.get("LABSUPPORT_DATA")
    for real, seen in ((repo / "data", site / "data"), (repo.parent / "shared/traces", site.parent / "shared/traces"),
                       *([(Path(env).expanduser().resolve(),) * 2] if env else [])):
        if real.is_dir():
            (slot.show if slot is not None else link)(real, seen)


def _student_env(site: Path, home: Path) -> dict[str, str]:
    """The environment student code gets: a few of the grader's variables (never all), and its own folders."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
           "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LABSUPPORT_DATA", "LABSUPPORT_HIDE_TRACES", "TRITON_INTERPRET")}
    env.update(PYTHONPATH=str(site), HOME=str(home), IPYTHONDIR=str(home / ".ipython"), MPLBACKEND="Agg",
               TRITON_CACHE_DIR=str(home / ".triton"), PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               USER="student", LOGNAME="student", XDG_CACHE_HOME=str(home / ".cache"))
    return env


def _read_records(path: Path) -> dict[str, dict]:
    """The last answer record per checkoff id, one line each.

    A line that is not plain data in the collector's shape (garbled, over MAX_RECORD_BYTES, an
    integer of thousands of digits, nested past the limit) counts, when its start still says
    whose answer it was, as that checkoff's unreadable answer; it touches no other checkoff.
    """
    records: dict[str, dict] = {}
    try:
        fh = open(path, "rb")
    except OSError:
        return records
    with fh:
        while fh.tell() < MAX_ANSWER_BYTES:
            line = fh.readline(MAX_RECORD_BYTES + 1)
            if not line:
                break
            whole = line.endswith(b"\n") or len(line) <= MAX_RECORD_BYTES
            if not whole:  # skip the rest of a line too long to be one answer
                while (more := fh.readline(1 << 20)) and not more.endswith(b"\n"):
                    pass
            record = _record(line, whole)
            if record is not None:
                records[record["id"]] = record
    return records


def _record(line: bytes, whole: bool) -> dict | None:
    reason = f"it is over the {MAX_RECORD_BYTES:,}-byte limit for one answer"
    if whole:
        try:
            record = codec.parse(line)
            if (isinstance(record, dict) and isinstance(record.get("id"), str) and type(record.get("index")) is int
                    and type(record.get("callable")) is bool and "value" in record):
                return record
            reason = "it is not an answer record"
        except codec.DecodeError as exc:
            reason = str(exc)
    head = RECORD_HEAD.match(line)
    if head is None:
        return None
    return {"id": head[1].decode(), "index": int(head[2]), "callable": False, "unreadable": cut(reason, 300)}


# --- deciding --------------------------------------------------------------------------------------------

class Grader:
    """Grades notebooks one by one (thread-safe: `grade` may run in several threads at once)."""

    def __init__(self, timeout: int = DEFAULT_TIMEOUT_S, secret: bytes | None = None, sandbox=None):
        import labsupport

        self.timeout = timeout
        self.secret = secret if secret is not None else secrets.token_bytes(32)
        self.snapshot = Snapshot(Path(labsupport.__file__).resolve().parent)
        self.sandbox = sandbox
        self.scratch = Path(tempfile.mkdtemp(prefix="labsupport-grade-"))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def prepare(self, checkoffs: list[Checkoff], key: str) -> dict[str, object]:
        return {c.id: c.prepare(case_rng(c.id, self.secret, key)) for c in checkoffs}

    def hidden(self, lab: int, checkoffs: list[Checkoff], key: str) -> list[tuple[dict, dict[str, object]]]:
        """The lab's hidden givens for this notebook, each with every value checkoff's expected value on them."""
        if lab not in GIVENS:
            return []
        sets = GIVENS[lab].draw(case_rng("givens", self.secret, key))
        return [(g, {c.id: c.expect(namespace(g)) for c in checkoffs if c.expect is not None}) for g in sets]

    def grade(self, path: Path, student: str = "") -> NotebookGrade:
        start = time.perf_counter()
        grade = NotebookGrade(str(path), _lab_from_name(path), student)
        try:
            self._grade(path, grade)
        except A.NotebookError as exc:
            grade.error, grade.invalid = str(exc), True
        except Exception as exc:  # noqa: BLE001 - a grader fault must not lose the batch
            grade.error = f"the grader failed on this notebook ({type(exc).__name__}: {exc})"
        grade.seconds = time.perf_counter() - start
        return grade

    def _grade(self, path: Path, grade: NotebookGrade) -> None:
        nb = A.read(path)
        grade.lab = lab = nb.lab()
        checkoffs = load_lab(lab)
        if not checkoffs:
            grade.invalid = True
            grade.error = f"lab {lab:02d} has no checkoffs to grade"
            return
        key = f"{grade.student}/{path.name}"
        prepared = self.prepare(checkoffs, key)
        hidden = self.hidden(lab, checkoffs, key)
        job = Path(tempfile.mkdtemp(prefix="nb-", dir=self.scratch))
        slot = self.sandbox.acquire() if self.sandbox is not None else None
        try:
            run = run_notebook(nb, job, self.snapshot, self.timeout, slot)
            if slot is not None:
                slot.kill_all()  # nothing the notebook started outlives its run
            for left in ("work", "home"):  # nor anything it wrote: a worker must not find the kernel's files
                shutil.rmtree(job / left, ignore_errors=True)
            grade.error = run.error
            worker = None
            deadline = time.monotonic() + self.timeout  # every answer's re-runs, together (each one alone could hang)
            try:
                for checkoff in checkoffs:
                    if (checkoff.kind == "function" or checkoff.expect is not None) and checkoff.id in run.records \
                            and worker is None:
                        worker = self._worker(job, slot)
                    status, detail = self._decide(nb, checkoff, prepared[checkoff.id], run, worker, hidden, deadline)
                    grade.checkoffs.append(CheckoffResult(checkoff.id, checkoff.title, status, detail))
            finally:
                if worker is not None:
                    worker.close()
        finally:
            if slot is not None:
                slot.release()
            shutil.rmtree(job, ignore_errors=True)

    def _worker(self, job: Path, slot):
        from labsupport.course.worker import WorkerClient

        site = self.snapshot.write(job / "worker_site")
        rooms = [job / "worker", job / "worker_home"]  # fresh: nothing the kernel wrote is in the worker's view
        for room in rooms:
            room.mkdir(exist_ok=True)
        env = _student_env(site, rooms[1])
        _show_data(self.snapshot, site, slot)
        if slot is not None:
            slot.own(rooms[1])
        return WorkerClient(rooms[0], site, env, wrap=(lambda argv: slot.command(argv, rooms)) if slot else None,
                            owner=slot.own if slot is not None else None)

    def _decide(self, nb: A.Notebook, checkoff: Checkoff, prepared, run: Run, worker,
                hidden: list[tuple[dict, dict]], deadline: float) -> tuple[str, str]:
        calls = nb.calls.get(checkoff.id, [])
        if not calls:
            return NOT_ATTEMPTED, "no cell of this notebook calls check() for it"
        record = run.records.get(checkoff.id)
        if record is None:
            return _without_answer(calls, run)
        index = record["index"]
        call = calls[index] if 0 <= index < len(calls) else calls[-1]
        if "unreadable" in record:
            return FAILED, f"the answer handed to check() could not be read as plain data ({record['unreadable']})"
        try:
            answer = codec.from_plain(record["value"])
        except codec.DecodeError as exc:
            return FAILED, f"the answer handed to check() could not be read as plain data ({exc})"
        if codec.contains_unfinished(answer):
            return NOT_ATTEMPTED, "the exercise still holds the student copy's placeholder"
        givens = GIVENS[checkoff.lab] if checkoff.lab in GIVENS else None
        program = A.program(nb, call, givens.names if givens is not None else frozenset())
        function_answer = checkoff.kind == "function" and record["callable"]
        if checkoff.kind != "choice":
            findings = A.inspect(program, checkoff.forbidden, function_answer=function_answer)
            if findings:
                return FAILED, _derive_text(checkoff, [A.describe(f) for f in findings])
            if checkoff.kind == "value" and program.unresolved:
                names = ", ".join(sorted(program.unresolved)[:5])
                return FAILED, (f"your answer depends on {names}, which no cell before check() defines in code the "
                                "grader can read; compute it in the notebook's own cells.\nHint: " + checkoff.hint)
        needs_worker = function_answer or checkoff.expect is not None
        if needs_worker and deadline <= time.monotonic():
            return FAILED, (f"the grader's time for re-running this notebook's answers (--timeout {self.timeout} s, all "
                            "of them together) ran out before this one: an earlier answer's code ran that long")
        try:
            if function_answer:  # its cases are its own; the givens it reads as globals are the lecture's
                bound = _given_lines(givens.lecture) if givens is not None else ""
                answer = worker.load(checkoff.id, bound + program.source(), checkoff.forbidden,
                                     program.function_source(), _seconds_to(deadline))
            checkoff.verdict(answer, prepared)
            if checkoff.expect is not None and not function_answer:
                self._rederive(checkoff, program, answer, prepared, givens, hidden, worker, deadline)
        except Forbidden as exc:
            return FAILED, _derive_text(checkoff, [str(exc)])
        except NotImplementedError as exc:
            return NOT_ATTEMPTED, str(exc)
        except Mismatch as exc:
            return FAILED, f"{exc}\nHint: {checkoff.hint}"
        except Exception as exc:  # noqa: BLE001 - an answer of a shape the judge did not expect
            return FAILED, f"your answer could not be checked ({type(exc).__name__}: {exc})\nHint: {checkoff.hint}"
        return PASSED, ""


    def _rederive(self, checkoff: Checkoff, program: A.Program, answer, prepared, givens, hidden, worker,
                  deadline: float) -> None:
        """Re-run the answer's code on the lecture's givens and on the hidden ones, before the notebook's answers'
        `deadline`; raise Mismatch where it is off."""
        source = program.source()
        lecture = worker.value(checkoff.id, _given_lines(givens.lecture) + source, checkoff.forbidden,
                               _seconds_to(deadline))
        try:
            checkoff.verdict(lecture, prepared)
        except Mismatch:
            raise Mismatch(f"re-running the code that produced your answer gave {_shown(lecture)}, not the "
                           f"{_shown(answer)} your notebook handed to check(): the answer must come from the code "
                           "above the check() call, run top to bottom") from None
        for values, expected in hidden:
            got = worker.value(checkoff.id, _given_lines(values) + source, checkoff.forbidden, _seconds_to(deadline))
            try:
                checkoff.verdict(got, expected[checkoff.id])
            except Mismatch:
                same = codec.to_plain(got) == codec.to_plain(answer)
                names = ", ".join(sorted(givens.names))
                raise Mismatch(
                    "your answer is right on the lab's givens, but re-run on other values of them it "
                    + (f"gave the same {_shown(got)} again: a number typed or copied in, not computed. "
                       if same else f"gave {_shown(got)}, which is not what those givens make it. ")
                    + f"Compute it from the givens cell's names ({names}), not from numbers written out") from None


def _seconds_to(deadline: float) -> float:
    """A worker call's budget: what is left before `deadline`, at least a second (the call itself says it ran out)."""
    return max(1.0, deadline - time.monotonic())


def _given_lines(values: dict) -> str:
    """The givens as the assignments a givens cell holds (numbers and strings only: repr is their literal)."""
    return "".join(f"{name} = {value!r}\n" for name, value in values.items()) + "\n"


def _shown(x) -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return fmt_number(x)
    return cut(repr(x), 120)


def _without_answer(calls: list[A.CheckCall], run: Run) -> tuple[str, str]:
    """Why a checkoff whose check() call is in the file handed nothing over."""
    for call in calls:
        if call.cell.number in run.errors:
            ename, evalue = run.errors[call.cell.number]
            if ename == "NotImplementedError":
                return NOT_ATTEMPTED, evalue
            return FAILED, f"its cell raised {ename}: {evalue}"
    numbers = {call.cell.number for call in calls}
    if run.stop and (run.stopped_at is None or max(numbers) >= run.stopped_at):
        return NOT_ATTEMPTED, f"{run.stop}, {'while' if run.stopped_at in numbers else 'before'} this cell ran"
    if not numbers & run.ran:
        return NOT_ATTEMPTED, "its cell never ran"
    return NOT_ATTEMPTED, "check() never ran (is it in a branch that was not taken?)"


def _derive_text(checkoff: Checkoff, reasons: list[str]) -> str:
    what = checkoff.derive or "work it out from the lab's quantities rather than asking labsupport for it"
    return (f"derive, don't call: {'; '.join(reasons)}. This exercise asks you to {what}.\nHint: {checkoff.hint}")


def _lab_from_name(path: Path) -> int | None:
    match = A.LAB_NAME_RE.match(path.name)
    return int(match[1]) if match else None


# --- a class at a time -----------------------------------------------------------------------------------

@dataclass
class Submission:
    path: Path
    student: str
    refused: str = ""  # why it is listed and never graded


def notebooks_in(folder: Path) -> list[Path]:
    """Every .ipynb under `folder` (checkpoints aside), in name order, links included: `refusal` names them."""
    return sorted(q for q in folder.rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in q.relative_to(folder).parts and (q.is_symlink() or q.is_file()))


def refusal(path: Path, top: Path) -> str:
    """Why a notebook found under `top` is never graded ("" if it is): it, or a folder between, is a link,
    which may point at anyone's work (a classmate's notebook, a solution on the grading machine)."""
    for q in [path, *path.parents]:
        if q == top:
            break
        if q.is_symlink():
            return f"{q.name} is a symbolic link (to {os.readlink(q)}), not a notebook handed in: hand in the file itself"
    return ""


def choose(submissions: list[Submission], lab: int | None = None) -> list[tuple[str, int | None]]:
    """Per submission, its lab and "" if it is to be graded, else why not: one notebook per student and lab counts.

    The one that counts is the newest by modification time (ties: the path last in name order),
    never the best: the others are listed, not graded.  The lab is read from the notebook (its name,
    else its check() ids).  With `lab`, a notebook of another lab is not graded either.
    """
    def lab_of(path: Path) -> int | None:
        try:
            return A.read(path).lab()
        except A.NotebookError:
            return _lab_from_name(path)

    def age(path: Path) -> tuple[int, str]:
        try:
            return path.stat().st_mtime_ns, str(path)
        except OSError:
            return -1, str(path)

    labs = [_lab_from_name(s.path) if s.refused else lab_of(s.path) for s in submissions]
    groups: dict[tuple, list[int]] = {}
    for i, (s, n) in enumerate(zip(submissions, labs)):
        if not s.refused:
            groups.setdefault((s.student, n if n is not None else str(s.path)), []).append(i)
    why = [s.refused for s in submissions]
    for (student, n), members in groups.items():
        if lab is not None and n != lab:
            for i in members:
                why[i] = f"a notebook of {_lab_text(n)}; this assignment is lab {lab:02d}"
            continue
        newest = max(members, key=lambda i: age(submissions[i].path))
        for i in members:
            if i != newest:
                why[i] = (f"{submissions[newest].path} is {student}'s newer notebook of {_lab_text(n)} and is the one "
                          "graded (one notebook per lab counts: the newest)")
    return list(zip(why, labs))


def _lab_text(lab) -> str:
    return f"lab {lab:02d}" if isinstance(lab, int) else "no lab"


def collect(paths: list[str]) -> tuple[list[Submission], list[str]]:
    """Notebooks to grade, each with its student; and, in words, each argument that cannot be used.

    Each argument is one student's work: a notebook (the student is its folder's name) or a folder
    (its name), whatever lies below it.  The one exception is a lone folder argument with no notebook
    directly in it: a class, one folder per student.  So a folder inside a student's folder never
    passes for another student, and two arguments that would be two students of one name are refused.
    """
    found, problems = [], []
    folder_of: dict[str, Path] = {}  # student -> the folder that is theirs
    for arg in paths:
        p = Path(arg)
        if p.is_file():
            found.append(Submission(p, p.resolve().parent.name))
            owned = [(p.resolve().parent.name, p.resolve().parent)]
        elif p.is_dir():
            notebooks = notebooks_in(p)
            if not notebooks:
                problems.append(f"{arg} is a folder with no .ipynb in it")
                continue
            a_class = len(paths) == 1 and all(len(q.relative_to(p).parts) > 1 for q in notebooks)
            for q in notebooks:
                student = q.relative_to(p).parts[0] if a_class else p.resolve().name
                found.append(Submission(q, student, refusal(q, p)))
            owned = [(q.relative_to(p).parts[0], (p / q.relative_to(p).parts[0]).resolve()) for q in notebooks] \
                if a_class else [(p.resolve().name, p.resolve())]
        else:
            problems.append(f"no such notebook or folder: {arg}")
            continue
        for student, folder in owned:
            if folder_of.setdefault(student, folder) != folder:
                problems.append(f"{folder} and {folder_of[student]} would both be student {student!r}: "
                                "grade them apart, or rename one folder")
    return found, list(dict.fromkeys(problems))


def grade_all(grader: Grader, submissions: list[Submission], jobs: int = 1, progress: bool = True,
              on_done=None, lab: int | None = None) -> list[NotebookGrade]:
    """Grade the submissions `choose` picks, `jobs` at a time; a row for every one, in the order given."""
    results: list[NotebookGrade | None] = [None] * len(submissions)
    for i, (why, its_lab) in enumerate(choose(submissions, lab)):
        if why:
            s = submissions[i]
            results[i] = NotebookGrade(str(s.path), its_lab, s.student, not_graded=why)
    todo = [i for i, r in enumerate(results) if r is None]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="grading", unit="notebook", file=sys.stderr)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(grader.grade, submissions[i].path, submissions[i].student): i for i in todo}
            for future in concurrent.futures.as_completed(futures):
                i = futures[future]
                try:
                    results[i] = future.result()
                except Exception as exc:  # noqa: BLE001 - grade() catches; this is the last net
                    results[i] = NotebookGrade(str(submissions[i].path), None, submissions[i].student,
                                               error=f"the grader failed ({type(exc).__name__}: {exc})")
                if bar is not None:
                    bar.update(1)
                if on_done is not None:
                    on_done([r for r in results if r is not None])
    finally:
        if bar is not None:
            bar.close()
    return [r for r in results if r is not None]


# --- reports -----------------------------------------------------------------------------------------------

def format_grade(grade: NotebookGrade) -> str:
    lab = f"lab {grade.lab:02d}" if grade.lab is not None else "lab ?"
    who = f"{grade.student}: " if grade.student else ""
    if grade.not_graded:
        return f"{who}{grade.path}  ({lab}) not graded: {grade.not_graded}"
    lines = [f"{who}{grade.path}  ({lab}, graded in {grade.seconds:.1f} s)"]
    for c in grade.checkoffs:
        lines.append(f"  {SYMBOLS[c.status]} {c.id:<5} {c.status:<14} {c.title}")
        if c.status != PASSED and c.detail:
            lines += [f"        {line}" for line in c.detail.splitlines()]
    if grade.error:
        lines.append(f"  ! {grade.error}")
    for note in grade.notes:
        lines.append(f"  ! {note}")
    lines.append(f"  score {grade.passed}/{grade.total}")
    return "\n".join(lines)


def report(grades: list[NotebookGrade]) -> dict:
    passed = sum(g.passed for g in grades)
    failed = sum(g.failed for g in grades)
    total = sum(g.total for g in grades)
    return {"notebooks": [g.as_dict() for g in grades], "passed": passed, "failed": failed,
            "not_attempted": total - passed - failed, "total": total}


def rows(grades: list[NotebookGrade]) -> tuple[list[str], list[dict]]:
    """One row per graded notebook (one per student × lab, see `choose`); the others are named in it."""
    skipped: dict[tuple, list[NotebookGrade]] = {}
    for g in grades:
        if g.not_graded:
            skipped.setdefault((g.student, g.lab), []).append(g)
    ids = sorted({c.id for g in grades for c in g.checkoffs}, key=lambda i: tuple(int(x) for x in i.split(".")))
    header = ["student", "lab", "notebook", "passed", "total", "score", "error", *ids]
    out = []
    for g in grades:
        if g.not_graded:
            continue
        notes = list(g.notes) + [f"also handed in {o.path} (not graded)" for o in skipped.get((g.student, g.lab), [])]
        row = {"student": g.student, "lab": "" if g.lab is None else f"{g.lab:02d}", "notebook": g.path,
               "passed": g.passed, "total": g.total, "score": f"{g.passed}/{g.total}",
               "error": "; ".join([g.error, *notes] if g.error else notes)}
        row.update({c.id: c.status for c in g.checkoffs})
        out.append(row)
    return header, out


def write_csv(path: Path, grades: list[NotebookGrade]) -> None:
    header, table = rows(grades)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(table)
    write_into_place(path, buf.getvalue())


def gradescope(grades: list[NotebookGrade], visibility: str = "visible") -> dict:
    """Gradescope's results.json: one test per checkoff, one point each, the hint as its output."""
    tests, notes = [], []
    number = 0
    for g in grades:
        where = Path(g.path).name
        if g.not_graded:
            notes.append(f"{where}: not graded: {g.not_graded}")
            continue
        if g.error:
            notes.append(f"{where}: {g.error}")
        notes += [f"{where}: {n}" for n in g.notes]
        for c in g.checkoffs:
            number += 1
            output = {PASSED: "passed", NOT_ATTEMPTED: f"not attempted: {c.detail}" if c.detail else "not attempted",
                      FAILED: c.detail}[c.status]
            tests.append({"name": f"Checkoff {c.id}: {c.title}", "number": c.id, "score": 1.0 if c.status == PASSED else 0.0,
                          "max_score": 1.0, "status": "passed" if c.status == PASSED else "failed",
                          "output": output, "visibility": visibility})
    if not grades:
        notes.append("no notebook (.ipynb) was found in the submission")
    score = sum(t["score"] for t in tests)
    return {"score": score, "output": "\n".join(notes) or f"{int(score)} of {len(tests)} checkoffs passed",
            "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}


@contextlib.contextmanager
def into_place(path: Path):
    """A path to write `path`'s new content at, renamed over `path` once written.

    It lies in a folder of its own beside `path`, made by mkdtemp (a fresh name, mode 0700), so
    nothing planted at a name someone could guess (a folder, a symlink) is ever written through.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp = folder / "new"
        yield tmp
        os.replace(tmp, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_into_place(path: Path, text: str) -> None:
    with into_place(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _dump(data) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


# --- command line ------------------------------------------------------------------------------------------

def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m labsupport grade",
                      description="Grade student notebooks: answers collected from a fresh kernel, decided outside it.")
    p.add_argument("paths", nargs="+", help="notebooks, or folders of them (one folder per student)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--csv", metavar="FILE", help="also write the gradebook: one row per student × lab")
    p.add_argument("--gradescope", metavar="FILE", help="also write Gradescope's results.json format")
    p.add_argument("--jobs", type=positive_int, default=1, help="notebooks graded at once (default 1)")
    p.add_argument("--timeout", type=positive_int, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds a notebook's cells may run, all together; also the limit for starting its kernel "
                        f"and for one checkoff's function tests (default {DEFAULT_TIMEOUT_S})")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the hidden inputs (default: a fresh secret per run); for regrading identically")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _keep_the_current_folder_off_the_path() -> None:
    """A grader started inside a student's folder must not import that folder's json.py (or labsupport/)."""
    import labsupport

    here = Path.cwd().resolve()
    if Path(labsupport.__file__).resolve().parent.parent != here:
        sys.path[:] = [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != here]


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of jobs, of seconds)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number of at least 1, got {text!r}")
    return value


def _writable(flag: str, value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        return f"grade: {flag} {value}: is a folder, not a file"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"grade: {flag} {value}: no such folder {parent}"
    if not os.access(parent, os.W_OK):
        return f"grade: {flag} {value}: folder {parent} is not writable"
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except UsageError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    for flag, value in (("--csv", args.csv), ("--gradescope", args.gradescope)):
        problem = _writable(flag, value)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    submissions, missing = collect(args.paths)
    if missing:
        print(f"grade: {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
              file=sys.stderr)
        return 2
    _keep_the_current_folder_off_the_path()
    secret = hashlib.sha256(f"seed {args.seed}".encode()).digest() if args.seed is not None else None
    sandbox = Sandbox.for_this_machine()
    print(f"grade: isolation: {describe(sandbox)}", file=sys.stderr)
    grader = Grader(timeout=args.timeout, secret=secret, sandbox=sandbox)

    unwritten: dict[str, str] = {}

    def write_files(done: list[NotebookGrade]) -> None:  # a file that cannot be written never stops the batch
        for flag, value, write in (("--csv", args.csv, lambda p: write_csv(p, done)),
                                   ("--gradescope", args.gradescope,
                                    lambda p: write_into_place(p, _dump(gradescope(done))))):
            if value:
                try:
                    write(Path(value))
                    unwritten.pop(flag, None)
                except OSError as exc:
                    unwritten[flag] = f"grade: {flag} {value}: could not write it ({exc.strerror or exc})"

    grades: list[NotebookGrade] = []
    try:
        grades = grade_all(grader, submissions, jobs=args.jobs, progress=not args.no_progress,
                           on_done=lambda done: (grades.__setitem__(slice(None), done), write_files(done)))
    finally:
        write_files(grades)
        grader.close()
    for g in grades:
        if g.invalid:
            print(f"grade: {g.path}: {g.error}", file=sys.stderr)
    for problem in unwritten.values():
        print(problem, file=sys.stderr)
    if args.json:
        sys.stdout.write(_dump(report(grades)))
    else:
        for g in grades:
            print(format_grade(g))
        totals = report(grades)
        print(f"TOTAL {totals['passed']}/{totals['total']} checkoffs passed, {totals['failed']} failed, "
              f"{totals['not_attempted']} not attempted")
    if any(g.invalid for g in grades) or unwritten:
        return 2
    return 1 if any(g.failed or g.error for g in grades) else 0
