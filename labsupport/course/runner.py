"""The runner: a handed-in notebook run whole, once per set of givens, inside its sandbox (every lab).

    python -I -m labsupport.course.runner < job.json      (events: JSON lines on the job's events_fd)

It copies the notebook's folder into its scratch and executes the cells in an IPython shell as a
kernel's Run All does, errors and all (magics, helper modules: the same), drawing nothing (nobody reads
the outputs).  The cells before the givens cell run once; then one forked child per run restores the
folder and /tmp as those cells left them, binds that run's givens, runs the givens cell as written with
each given held to the run's value (`holding`), and the rest; a run past its time is killed.  check() is
a collector: it hands each answer over as plain data, a function's as what it did on the hidden cases
(lecture's run only).  Nothing is judged here and nothing here knows an expected value.  Events:

    {"e": "cell" | "error" | "answer" | "note" | "end" | "stop", "run": r or null (before the fork), ...}
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import sys
import time

EVENTS_FD = 3  # the job names the descriptor the grader's pipe arrived on
MAX_EVENT = 16 * 2**20  # characters of one event; a larger answer is sent as too large
COPY_BYTES = 256 * 2**20  # of the notebook's folder copied into the scratch
COPY_DEPTH = 8
STARTED = time.monotonic()
_run = None  # the run this process is, once forked
_cell = None
_muted = False  # the probe (`find_givens_by_running`) says nothing: its cells run again for real


def emit(**event) -> None:
    if _muted:
        return
    text = json.dumps(event, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    if len(text) > MAX_EVENT:
        text = json.dumps({k: v for k, v in event.items() if k in ("e", "run", "cell", "id")} | {"too_large": len(text)})
    data = (text + "\n").encode()
    while data:
        try:
            data = data[os.write(EVENTS_FD, data):]
        except OSError:
            return


def copy_folder(src: str, dest: str) -> int:
    """The notebook's folder, as much as fits (links copied as links: inside the sandbox they lead nowhere);
    returns how many files did not fit or lay too deep."""
    budget, left = COPY_BYTES, 0
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        dirs[:] = [d for d in dirs if d not in (".git", "__pycache__", ".ipynb_checkpoints")]
        if depth >= COPY_DEPTH:
            left += sum(len(f) for _, _, f in os.walk(root))
            dirs[:] = []
            continue
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
        for name in files:
            path = os.path.join(root, name)
            try:
                if os.path.islink(path):
                    os.symlink(os.readlink(path), os.path.join(dest, rel, name))
                    continue
                size = os.path.getsize(path)
                if size > budget:
                    left += 1
                    continue
                shutil.copyfile(path, os.path.join(dest, rel, name))
                budget -= size
            except OSError:
                left += 1
    return left


def not_copied(left: int) -> str:
    return (f"{left} file(s) of the notebook's folder were not copied into the sandbox: more than "
            f"{COPY_BYTES // 2**20} MiB, or deeper than {COPY_DEPTH} folders")


def restore(snapshot: str, work: str, tmp_before: set) -> None:
    """A run starts from the folder as the cells before the givens cell left it, and from their /tmp."""
    import tempfile

    for name in os.listdir(work):
        path = os.path.join(work, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    shutil.copytree(snapshot, work, symlinks=True, dirs_exist_ok=True)
    tmp = tempfile.gettempdir()
    for name in set(os.listdir(tmp)) - tmp_before:
        path = os.path.join(tmp, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)


def collector(job: dict):
    """check() while grading.  The function checkoffs' cases are their inputs alone, as data (`shared`: values
    several share, sent once): no expected value, and no recipe one would follow from, is ever sent, so nothing
    a handed-in function finds on the stack above it or anywhere in this process answers a case."""
    from labsupport.course import data, harness

    cases, shared = job.get("cases", {}), job.get("shared", [])
    functions = set(cases)  # their ids: a hidden run holds no case (`one_run`), and hands no function over
    seconds = job.get("case_seconds", harness.CASE_SECONDS)

    def collect(checkoff_id, answer) -> None:
        cid = checkoff_id if isinstance(checkoff_id, str) and len(checkoff_id) <= 12 else repr(checkoff_id)[:12]
        event = {"run": _run, "cell": _cell, "id": cid}
        if data.contains_unfinished(answer):
            emit(e="answer", unfinished=True, **event)
        elif cid in functions:
            if _run == 0:  # a function is tried on the lecture's givens, where its cases are posed
                observations = [_observe(answer, case, seconds, shared) for case in cases[cid]]
                emit(e="answer", observations=observations, **event)
        else:
            try:
                emit(e="answer", value=data.plain(answer), **event)
            except data.DataError as exc:
                emit(e="answer", unreadable=str(exc), **event)
    return collect


def _observe(answer, case: dict, seconds, shared: list) -> dict:
    from labsupport.course import data, harness

    return harness.observe(answer, case, seconds, shared) if callable(answer) else {"result": data.plain(answer)}


def shell():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "NoColor"
    sh = InteractiveShell.instance(config=config)
    sh.display_formatter.format = lambda *args, **kwargs: ({}, {})  # nobody reads the outputs: format none
    return sh


def run_cells(sh, cells: list, start: int) -> None:
    global _cell
    for number, source in cells[start:]:
        _cell = number
        emit(e="cell", run=_run, cell=number, t=round(time.monotonic() - STARTED, 3))
        result = sh.run_cell(source, store_history=True)
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            emit(e="error", run=_run, cell=number, ename=_text(type(error).__name__, 200), evalue=_text(error, 500))


def _text(x, limit: int) -> str:
    try:
        return str(x)[:limit]
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        return "?"


REBIND = "__labsupport_bind_givens__"  # what the givens cell calls after each statement, while it runs
BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match,
          *([ast.TryStar] if hasattr(ast, "TryStar") else []))


class Rebinding(ast.NodeTransformer):
    """An IPython AST transformer: after each statement of the code it is given, a call of REBIND.

    Statements inside if/for/while/with/try/match blocks get one too, so that a given bound in a loop or a
    branch holds the run's value for the block's next line; a def, a lambda or a class gets none: their
    bodies run later (or bind elsewhere), and the call after the statement that runs them does the work.
    IPython hands it every cell's code and the code %time, %timeit and a nested run_cell compile."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        node.body = self._after_each(node.body)
        return node

    def _after_each(self, body: list) -> list:
        out = []
        for st in body:
            if isinstance(st, BLOCKS):
                for name in ("body", "orelse", "finalbody"):
                    setattr(st, name, self._after_each(getattr(st, name, [])))
                for block in getattr(st, "handlers", []) + getattr(st, "cases", []):  # except and case blocks
                    block.body = self._after_each(block.body)
            out.append(st)
            if not (isinstance(st, ast.ImportFrom) and st.module == "__future__"):  # futures must stay first
                out.append(_call(REBIND, st))
        return out


def _call(name: str, where: ast.stmt) -> ast.Expr:
    func = ast.copy_location(ast.Name(name, ast.Load()), where)
    return ast.copy_location(ast.Expr(ast.copy_location(ast.Call(func, [], []), where)), where)


@contextlib.contextmanager
def holding(sh, values: dict):
    """While the block runs, every given the code binds holds `values`' value from the statement that binds
    it on: the cell runs as written (magics, tuples, annotations, globals().update, exec, loops: any style),
    and a line after it that derives from a given (TOTAL = A * B) reads the run's value.  A dict the block
    makes with a given's name as a key (G = {'A': 6}; globals().update(G)) holds the run's value under it."""
    before = {id(v) for v in sh.user_ns.values() if isinstance(v, dict)}

    def rebind() -> None:
        for name, value in values.items():
            if name in sh.user_ns:  # a given the cell deleted stays deleted, as the cell wrote it
                sh.user_ns[name] = value
        for held in list(sh.user_ns.values()):  # a dict the cell made of the givens (G = {'A': 6}) holds them too
            if isinstance(held, dict) and held is not sh.user_ns and id(held) not in before:
                for name in values.keys() & held.keys():
                    held[name] = values[name]

    transformer = Rebinding()
    sh.user_ns[REBIND] = rebind
    sh.ast_transformers.append(transformer)
    try:
        yield
    finally:
        if transformer in sh.ast_transformers:  # IPython drops a transformer that raised
            sh.ast_transformers.remove(transformer)
        sh.user_ns.pop(REBIND, None)


def one_run(sh, job: dict, run: int, cells: list, fork_at: int) -> None:
    """This process is run `run` from the givens cell on: the run's givens bound (a given the cell does not
    bind is bound all the same), the givens cell run as written while `holding` them, then the rest."""
    global _run
    _run = run
    values = job["runs"][run]
    job["runs"][:] = [values if n == run else None for n in range(len(job["runs"]))]  # no other run's givens
    if run != 0:  # the function checkoffs' cases are posed on the lecture's run alone
        job.get("cases", {}).clear()
        job.get("shared", []).clear()
    sh.user_ns.update(values)
    start = fork_at
    if job.get("givens_cell") is not None:
        with holding(sh, values):
            run_cells(sh, cells[:fork_at + 1], fork_at)  # the givens cell alone
        start += 1
    run_cells(sh, cells, start)
    emit(e="end", run=run)


def find_givens_by_running(sh, cells: list, names: set, seconds: float, work: str) -> int | None:
    """The index of the first cell after which a given is bound or rebound, found by running the cells in a
    forked probe that says nothing: the givens cell of a notebook whose cells have no id or tag and bind the
    givens in a way no reading of the code sees (from helper import *, a function's `global`).  The folder
    and /tmp are put back as they were.  None when no cell binds one, the probe fails or runs past `seconds`,
    or this process cannot fork safely."""
    global _muted
    if not names or not single_threaded():
        return None
    import tempfile

    snapshot, tmp_before = work.rstrip("/") + ".before-probe", set(os.listdir(tempfile.gettempdir()))
    shutil.copytree(work, snapshot, symlinks=True)
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # no process to be had: no probe, and the cells run as they would without one
        os.close(read_end)
        os.close(write_end)
        shutil.rmtree(snapshot, ignore_errors=True)
        return None
    if pid == 0:
        _muted, found = True, -1
        os.close(read_end)
        os.setpgid(0, 0)
        try:
            missing = object()
            for index, (_, source) in enumerate(cells):
                before = {name: sh.user_ns.get(name, missing) for name in names}
                sh.run_cell(source, store_history=True)
                if any(sh.user_ns.get(name, missing) is not held for name, held in before.items()):
                    found = index
                    break
        finally:
            os.write(write_end, str(found).encode())
            os._exit(0)
    os.close(write_end)
    why = wait(pid, time.monotonic() + seconds)
    os.set_blocking(read_end, False)  # a process the probe left behind may hold the pipe open
    try:
        text = os.read(read_end, 32).decode(errors="replace")
    except OSError:
        text = ""
    os.close(read_end)
    restore(snapshot, work, tmp_before)
    shutil.rmtree(snapshot, ignore_errors=True)
    found = int(text) if not why and text.lstrip("-").isdigit() else -1
    return found if 0 <= found < len(cells) else None


WARM = ("plotly.graph_objects", "plotly.io._renderers", "ipywidgets", "anywidget")  # what the labs import first


def warm() -> None:
    """Import, once before the runs fork, the libraries the labs import first (jsonschema alone, through
    plotly's renderers, takes seconds): each run then finds them loaded, as a kernel's second cell does."""
    import importlib

    for name in WARM:
        with contextlib.suppress(Exception):  # a library that is not there is the notebook's business
            importlib.import_module(name)


def single_threaded() -> bool:
    """No Python thread but this one (torch's own native helper thread is fork-safe, as its DataLoader relies on)."""
    import threading

    return threading.active_count() == 1


def main(argv: list[str]) -> int:
    global EVENTS_FD
    job = json.loads(sys.stdin.read())
    EVENTS_FD = job.get("events_fd", EVENTS_FD)
    os.makedirs(job["work"], exist_ok=True)
    left = copy_folder(job["folder"], job["work"]) if job["folder"] != job["work"] else 0
    if left:
        emit(e="note", run=None, text=not_copied(left))
    home = os.path.join(job["work"], job.get("cwd", ""))
    os.chdir(home)
    sys.path.insert(0, home)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.environ["LABSUPPORT_GRADING"] = "1"  # labsupport.pretrained.GRADING_ENV: the labs' real model stays unloaded
    from labsupport.course import checkoff

    checkoff.collect = collector(job)
    sh = shell()
    cells = [(n, s) for n, s in job["cells"]]
    alone = next((int(a.split("=")[1]) for a in argv if a.startswith("--run=")), None)
    if job.get("givens_cell") is None and job.get("runs") and alone is None:
        found = find_givens_by_running(sh, cells, set(job["runs"][0]), job["timeout"], job["work"])
        job["givens_cell"] = None if found is None else cells[found][0]
        emit(e="givens", run=None, cell=job["givens_cell"])
    fork_at = next((i for i, (n, _) in enumerate(cells) if n == job.get("givens_cell")), None)
    if fork_at is None:  # no givens cell: the givens are bound before the first cell
        job["givens_cell"], fork_at = None, 0
    run_cells(sh, cells[:fork_at], 0)
    if alone is not None:  # the slow path: this whole process is one run
        one_run(sh, job, alone, cells, fork_at)
        return 0
    import tempfile

    snapshot, tmp_before = job["work"].rstrip("/") + ".before-givens", set(os.listdir(tempfile.gettempdir()))
    shutil.copytree(job["work"], snapshot, symlinks=True)
    warm()
    for run in range(len(job["runs"])):
        deadline = time.monotonic() + job["timeout"]
        restore(snapshot, job["work"], tmp_before)
        try:
            pid = start_run(sh, job, run, cells, fork_at, snapshot)
        except OSError as exc:  # no process to be had: the notebook's own processes fill its bound
            emit(e="stop", run=run, why=_text(f"it could not be started: {exc.strerror or exc}", 200))
            continue
        why = wait(pid, deadline)
        if why:
            emit(e="stop", run=run, why=why)
    return 0


def start_run(sh, job: dict, run: int, cells: list, fork_at: int, snapshot: str, tries: int = 5) -> int:
    """Run `run`'s process, forked (or, a thread already running, started afresh); a fork refused for want of
    processes is tried again a few times, while what an earlier run left behind winds down."""
    attempt = 0
    while True:
        try:
            return _start_run(sh, job, run, cells, fork_at, snapshot)
        except BlockingIOError:  # EAGAIN: the process bound is full for now
            attempt += 1
            if attempt >= tries:
                raise
            time.sleep(0.2 * attempt)


def _start_run(sh, job: dict, run: int, cells: list, fork_at: int, snapshot: str) -> int:
    if single_threaded():
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            try:
                one_run(sh, job, run, cells, fork_at)
            finally:
                os._exit(0)
        return pid
    import subprocess  # a thread started before the givens cell: forking could deadlock, so start afresh

    own = dict(job, runs=[v if n == run else None for n, v in enumerate(job["runs"])])  # its givens alone
    if run != 0:
        own.update(cases={cid: [] for cid in job.get("cases", {})}, shared=[])  # the ids alone
    with open(snapshot + ".job.json", "w") as f:
        json.dump(own, f)
    with open(snapshot + ".job.json") as f:
        os.unlink(snapshot + ".job.json")  # read by the run alone, through the descriptor
        return subprocess.Popen(python("labsupport.course.runner", f"--run={run}"), stdin=f,
                                pass_fds=(EVENTS_FD,), start_new_session=True).pid


def python(*args: str, root: str | None = None) -> list[str]:
    """This interpreter, isolated (-I), importing the very labsupport this module belongs to (a clone's, a bundle's,
    a sandbox's student-side copy), whatever an editable install points at; or the one in `root`.  The grader starts
    a sandbox's runner this way, and the runner its own re-spawned run."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    start = f"import sys; sys.path.insert(0, {str(root or here)!r}); sys.argv[1:] = {list(args[1:])!r}; "
    if args[0] == "-c":
        return [sys.executable, "-I", "-c", start + args[1]]
    return [sys.executable, "-I", "-c", start + f"import runpy; runpy.run_module({args[0]!r}, run_name='__main__')"]


def wait(pid: int, deadline: float) -> str:
    """'' when run `pid` (a process group's leader) ended by itself in time, else why it did not.  Either way,
    what it left running in its group ends with it, as at a kernel's restart (a fork bomb's leftovers would
    otherwise fill the process bound and refuse the next run)."""
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else ""
            if time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "timeout"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
