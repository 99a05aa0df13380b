"""Isolation with no way around it (GRADING.md, "Isolation"): attacks from inside the sandbox, each able to fail.

 - staff code is not in the sandbox at all, as source or as bytecode (the sandbox sees a student-side copy of
   the package, made by the rule the release uses);
 - a handed-in function that walks the stack and the heap finds no expected output and no recipe one follows
   from: for made-up lab 97's 97.2 and for lab 07's 7.7 (its engine runs, whose seed gives the answer away);
 - where no cgroup can be made (LABSUPPORT_NO_CGROUP), processes and every tmpfs are still bounded per sandbox
   (a host uid of its own, RLIMIT_NPROC, sized tmpfs, a read-only root), and a classmate graded in the same
   `--jobs 2` batch gets what it gets alone.
"""
from __future__ import annotations

import csv
import json
import os
import py_compile
import time
from pathlib import Path

import pytest

import grading as T
from labsupport.course import data, grade as G, release
from labsupport.course import sandbox as S

T.register()
MiB = 2**20


def _answers(outcome, checkoff_id: str) -> list[dict]:
    return [e for e in outcome.events if isinstance(e, dict) and e.get("id") == checkoff_id and e.get("e") == "answer"]


def _probe(sandbox: S.Sandbox, tmp_path: Path, source: str, timeout: int = 60) -> dict:
    """Run `source` in a fresh sandbox; what it handed to check("probe", json.dumps(found))."""
    cells = [(1, "from labsupport.course.checkoff import check"), (2, source)]
    job = {"cells": cells, "givens_cell": None, "runs": [{}], "cases": {}, "timeout": timeout, "cwd": ""}
    folder = tmp_path / "probe"
    folder.mkdir(exist_ok=True)
    outcome = sandbox.run(job, folder, deadline=time.monotonic() + timeout + 60)
    answers = _answers(outcome, "probe")
    assert answers, outcome.events
    return json.loads(answers[-1]["value"])


@pytest.fixture
def no_cgroup(monkeypatch):
    monkeypatch.setenv("LABSUPPORT_NO_CGROUP", "1")
    assert S._cgroup_parents() == {} and S.Cgroup.available() == set()


# --- staff code and bytecode ------------------------------------------------------------------------------------

STAFF_PROBE = r'''
import importlib, json, os, labsupport
found, package = {}, os.path.dirname(labsupport.__file__)
for name in ("labsupport.cli.ledger", "labsupport.course.checkoffs", "labsupport.course.checkoffs.lab02",
             "labsupport.course.grade", "labsupport.course.registry"):
    try:
        importlib.import_module(name)
        found[name] = "imported"
    except Exception as exc:
        found[name] = type(exc).__name__
tree = []
for root, dirs, files in os.walk(package):
    tree += [os.path.relpath(os.path.join(root, f), package) for f in dirs + files]
found["tree"] = tree
pyc = os.path.join(package, "cli", "__pycache__", "ledger.cpython-311.pyc")
try:
    found["pyc"] = len(open(pyc, "rb").read())
except OSError as exc:
    found["pyc"] = type(exc).__name__
try:
    open(os.path.join(package, "planted.py"), "w").write("x")
    found["write"] = "written"
except OSError as exc:
    found["write"] = type(exc).__name__
check("probe", json.dumps(found))
'''


def test_no_staff_source_or_bytecode_is_in_the_sandbox(tmp_path):
    ledger = S.PACKAGE / "cli" / "ledger.py"
    py_compile.compile(str(ledger), cfile=str(S.PACKAGE / "cli" / "__pycache__" / "ledger.cpython-311.pyc"))
    found = _probe(T.sandbox(), tmp_path, STAFF_PROBE)
    for name in ("labsupport.cli.ledger", "labsupport.course.checkoffs", "labsupport.course.checkoffs.lab02",
                 "labsupport.course.grade", "labsupport.course.registry"):
        assert found[name] == "ModuleNotFoundError", (name, found[name])
    tree = found["tree"]
    assert "course/runner.py" in tree and "course/records" in tree  # the runner's own
    assert "course/harness/__init__.py" in tree and "course/harness/lab07.py" in tree  # public, unlike checkoffs/
    assert not [p for p in tree if "__pycache__" in p or p.endswith((".pyc", ".pyo"))], tree
    assert not [p for p in tree if any(p == s or p.startswith(s + "/") for s in S.STAFF_ONLY)], tree
    assert found["pyc"] == "FileNotFoundError" and found["write"] in ("OSError", "PermissionError")


def test_the_sandbox_copy_and_the_release_follow_one_rule():
    copy = S.student_package() / "labsupport"
    in_copy = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
    assert "course.toml" in in_copy  # the course card, which labs in the sandbox read (labsupport.card)
    in_copy.remove("course.toml")
    assert in_copy == [rel for _, rel in S.student_files()]
    released = {rel for _, rel in S.student_files(S.PACKAGE, release.STAFF_ONLY)}
    assert released == set(in_copy) - set(S.GRADING_ONLY)  # the release: the same, less the sandbox's own runner
    assert all(not os.stat(copy / rel).st_mode & 0o222 for rel in in_copy[:20])  # read-only for everyone
    assert S.student_package() == copy.parent  # made once


def test_container_mode_leaves_no_staff_bytecode_and_closes_the_package(tmp_path, monkeypatch):
    root = tmp_path / "source"
    for rel in ("course/checkoffs/lab00.py", "cli/ledger.py", "cli/__pycache__/ledger.cpython-311.pyc",
                "course/__pycache__/grade.cpython-311.pyc", "course/records/lab00.json"):
        (root / "labsupport" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "labsupport" / rel).write_text("x")
    (root / "run_autograder").write_text("#!/bin/sh\n")
    monkeypatch.setattr(S, "PACKAGE", root / "labsupport")
    monkeypatch.setattr(S, "GRADERS", root / "labsupport" / "course" / "checkoffs")
    S.forget_graders()
    assert not list((root / "labsupport").rglob("__pycache__"))
    assert not (root / "labsupport" / "course" / "checkoffs").exists()
    assert (root / "labsupport").stat().st_mode & 0o077 == 0  # the ledger's source stays, for the grader's eyes only


# --- a frame and heap walk from a handed-in function -------------------------------------------------------------

WALK = r'''
def _walk():
    import gc, inspect, sys
    suspicious = {"want", "spec", "seed", "mistakes", "expected", "make_cases"}
    found = []

    def look(x, where):
        try:
            see(x, where)
        except Exception:  # an odd mapping of some library (its get or items may not be dict's): not ours to read
            pass

    def see(x, where):
        if isinstance(x, dict):
            # data under a telling key (a namespace holding random.seed, a function, or a class's slot, is none)
            keys = {k for k in x if isinstance(k, str) and k in suspicious
                    and isinstance(x[k], (int, float, str, list, tuple, dict))}
            if keys:
                found.append(f"{where}: a dict with {sorted(keys)}: {repr(x)[:200]}")
            make = dict.get(x, "make")
            # a recipe that makes a run (a record of labsupport.engine, sent as its fields, is the input itself)
            if isinstance(make, str) and any(w in make for w in ("engine_run", "engine_requests", "harness",
                                                                  "checkoffs")):
                found.append(f"{where}: a recipe {make}")
        elif type(x).__name__ in ("Case", "Checkoff", "Plan", "Live"):
            found.append(f"{where}: a {type(x).__name__}")

    frame = sys._getframe(1)
    while frame is not None:
        for name, value in list(frame.f_locals.items()):
            look(value, f"frame {frame.f_code.co_name}.{name}")
            if isinstance(value, (list, tuple)):
                for item in value[:10000]:
                    look(item, f"frame {frame.f_code.co_name}.{name}[]")
            if isinstance(value, dict):
                for item in list(value.values())[:10000]:
                    look(item, f"frame {frame.f_code.co_name}.{name}{{}}")
        frame = frame.f_back
    for info in inspect.stack(0):
        for name, value in list(info.frame.f_locals.items()):
            if callable(value) and getattr(value, "__closure__", None):
                for cell in value.__closure__:
                    try:
                        look(cell.cell_contents, f"closure of {name}")
                    except ValueError:
                        pass
    for obj in gc.get_objects():
        look(obj, "heap")
    for name in list(sys.modules):
        if name.startswith(("labsupport.course.checkoffs", "labsupport.course.registry", "labsupport.course.grade")):
            found.append(f"module {name}")
    return sorted(set(found))[:50]
'''


class Recording(S.Sandbox):
    """The real sandbox, keeping each job it was sent and what came back."""

    def __init__(self, real: S.Sandbox):
        super().__init__(real.mode, real.bounds)
        self.jobs, self.outcomes = [], []

    def run(self, job, folder, deadline, command=None):
        self.jobs.append(json.loads(json.dumps(job)))
        self.outcomes.append(super().run(job, folder, deadline, command))
        return self.outcomes[-1]


def test_a_function_walking_the_stack_finds_no_expected_value_lab_97(tmp_path):
    attack = WALK + "\ndef add(x, y):\n    import json\n    return json.dumps(_walk())\n\ncheck('97.2', add)"
    path = T.notebook(tmp_path / "eve" / "97_lab.ipynb", attack)
    sandbox = Recording(T.sandbox())
    grade = G.Grader(sandbox, timeout=60, secret=b"walk").grade(path, "eve")
    (job,), (outcome,) = sandbox.jobs, sandbox.outcomes
    assert '"want"' not in json.dumps(job) and '"spec"' not in json.dumps(job)  # nothing expected goes in
    (answer,) = _answers(outcome, "97.2")
    assert len(answer["observations"]) == 7
    for seen in answer["observations"]:
        assert json.loads(seen["result"]) == [], seen["result"]  # the walk found nothing
    assert T.statuses(grade)["97.2"] == "failed"  # and a string is not a sum


TTFT_CHEAT = WALK + r'''
def ttft_split(steps, request_id, arrival_time):
    """Hand back what the walk found; where a recipe of the engine run is found, rerun it and answer from it."""
    found = _walk()
    for line in found:
        if "recipe" in line:
            return {"found": found}
    return {"found": found, "steps": len(steps), "step_type": type(steps[0]).__name__}

check("7.7", ttft_split)
'''


@pytest.mark.slow
def test_a_function_walking_the_stack_finds_no_recipe_or_expected_value_lab_07(tmp_path):
    path = T.notebook(tmp_path / "eve" / "07_ledger.ipynb", TTFT_CHEAT, givens_cell=None)
    sandbox = Recording(T.sandbox())
    grade = G.Grader(sandbox, timeout=120, secret=b"walk").grade(path, "eve")
    (job,), (outcome,) = sandbox.jobs, sandbox.outcomes
    sent = json.dumps({k: v for k, v in job.items() if k != "cells"})  # (the attack's own cells name them)
    assert "engine_run" not in sent and "engine_requests" not in sent and '"want"' not in sent
    assert "course.harness" not in sent  # no recipe names a function of the harness: only records go in
    (answer,) = _answers(outcome, "7.7")
    observations = answer["observations"]
    assert len(observations) == len(job["cases"]["7.7"]) >= 20
    for seen in observations:
        result = data.unplain(seen["result"])
        assert result["found"] == [] and result["step_type"] == "StepOutput" and result["steps"] > 10, result
    assert T.statuses(grade)["7.7"] == "failed"


# --- bounds without a cgroup ---------------------------------------------------------------------------------------

BOUNDS_PROBE = r'''
import errno, json, os, signal, time
found = {"uid_seen": os.getuid()}
children = []
try:
    for _ in range(10_000):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    found["forks"] = "unbounded"
except OSError as exc:
    found["forks"] = [len(children), errno.errorcode.get(exc.errno, str(exc.errno))]
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
for place in ("/tmp/fill", "/dev/shm/fill", "/scratch/fill", "/fill", "/usr/fill", "/submission/fill"):
    written = 0
    try:
        with open(place, "wb") as f:
            while written < 2**31:
                f.write(b"x" * 2**20)
                f.flush()
                written += 2**20
        found[place] = [written, "unbounded"]
    except OSError as exc:
        found[place] = [written, errno.errorcode.get(exc.errno, str(exc.errno))]
    try:
        os.unlink(place)
    except OSError:
        pass
check("probe", json.dumps(found))
'''


def test_without_a_cgroup_processes_and_every_tmpfs_are_bounded(tmp_path, no_cgroup):
    bounds = dict(processes=48, tmp=24 * MiB, shm=8 * MiB, scratch=40 * MiB, memory=1024 * MiB)
    sandbox = T.sandbox(**bounds)
    if not sandbox.own_uids:
        pytest.skip("a host uid per sandbox needs root and setpriv (without them and a cgroup, grade refuses)")
    assert "a host uid of its own" in sandbox.describe() and "no cgroup" in sandbox.describe()
    found = _probe(sandbox, tmp_path, BOUNDS_PROBE)
    forks, reason = found["forks"]
    assert forks < bounds["processes"] and reason == "EAGAIN", found["forks"]  # RLIMIT_NPROC on its own uid
    for place, size in (("/tmp/fill", bounds["tmp"]), ("/dev/shm/fill", bounds["shm"]),
                        ("/scratch/fill", bounds["scratch"])):
        written, why = found[place]
        assert why == "ENOSPC" and written <= size, (place, found[place])
    for place in ("/fill", "/usr/fill", "/submission/fill"):  # the root, the system and its folder: read-only
        assert found[place] == [0, "EROFS"], (place, found[place])


def test_without_a_cgroup_or_a_uid_of_its_own_grade_refuses_in_one_line(tmp_path, no_cgroup, monkeypatch, capsys):
    monkeypatch.setattr(S.os, "geteuid", lambda: 1000)  # not root: no uid of its own to give a sandbox
    path = T.notebook(tmp_path / "ann" / "97_lab.ipynb", *T.RIGHT.values())
    assert G.main([str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no cgroup" in err[0] and "--trusted" in err[0], err


HOSTILE = {
    "fork bomb": ("import subprocess\nsubprocess.Popen(['bash', '-c', 'f() { f | f & }; f'])\nimport time\n"
                  "time.sleep(3)"),
    "tmpfs fill": ("import os\nfor place in ('/tmp', '/dev/shm', '/scratch', '/'):\n    try:\n"
                   "        with open(os.path.join(place, 'fill'), 'wb') as f:\n            while True:\n"
                   "                f.write(b'x' * 2**24)\n    except OSError:\n        pass"),
}


@pytest.fixture(scope="module")
def honest_alone(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("alone")
    path = T.notebook(tmp / "honest" / "97_lab.ipynb", *T.RIGHT.values())
    out = tmp / "alone.csv"
    os.environ["LABSUPPORT_NO_CGROUP"] = "1"
    try:
        assert G.main([str(path.parent), "--seed", "5", "--no-progress", "--timeout", "30", "--csv", str(out)]) == 0
    finally:
        del os.environ["LABSUPPORT_NO_CGROUP"]
    return list(csv.DictReader(open(out, encoding="utf-8")))[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HOSTILE))
def test_without_a_cgroup_a_hostile_neighbour_spoils_nothing(tmp_path, honest_alone, no_cgroup, capsys, name):
    classroom = tmp_path / "class"
    T.notebook(classroom / "honest" / "97_lab.ipynb", *T.RIGHT.values())
    T.notebook(classroom / "hostile" / "97_lab.ipynb", HOSTILE[name], *T.RIGHT.values())
    files = {k: tmp_path / f"out.{k}" for k in ("csv", "json")}
    code = G.main([str(classroom), "--jobs", "2", "--seed", "5", "--json", "--no-progress", "--timeout", "30",
                   "--csv", str(files["csv"]), "--gradescope", str(files["json"])])
    report = json.loads(capsys.readouterr().out)  # whole, strict JSON
    rows = list(csv.DictReader(open(files["csv"], encoding="utf-8")))
    assert code in (0, 1) and {r["student"] for r in rows} == {"honest", "hostile"}
    honest = next(r for r in rows if r["student"] == "honest")
    assert {k: v for k, v in honest.items() if k != "notebook"} == \
        {k: v for k, v in honest_alone.items() if k != "notebook"}  # exactly what it gets alone
    assert len(json.loads(files["json"].read_text(encoding="utf-8"))["tests"]) == 6
    hostile = next(g for g in report["notebooks"] if g["student"] == "hostile")
    assert hostile["passed"] == 3, (hostile["checkoffs"], hostile.get("notes"), hostile.get("error"))  # bounded: its own later cells still ran, and the grader lived


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the heap walk here touches torch's deprecated names
def test_the_walk_finds_what_is_there():
    """The attack is able to fail: a case's expected value or a recipe left on the stack or the heap is found."""
    namespace: dict = {}
    exec(WALK, namespace)

    def harness_frame():
        case = {"want": 3, "args": [1, 2]}  # noqa: F841 - what an old job held
        recipe = {"$": "new", "make": "labsupport.course.harness:engine_run_steps", "args": [7]}  # noqa: F841
        return namespace["_walk"]()
    found = harness_frame()
    assert any("['want']" in f for f in found) and any("recipe" in f for f in found), found


# --- what one run holds of the others, and what the sandbox's code can say ---------------------------------------

HEAP_GIVENS = r'''
import gc, glob, json, os
pairs = set()
for held in gc.get_objects():
    for x in [held, *gc.get_referents(held)]:
        if isinstance(x, dict) and x is not globals() and isinstance(x.get("A"), int) and isinstance(x.get("B"), int):
            pairs.add((x["A"], x["B"]))
jobs = glob.glob(os.path.join(os.path.dirname(os.getcwd()), "*.json"))  # a job file the runner left in reach
check("probe", json.dumps({"pairs": sorted(pairs), "jobs": jobs}))
'''
# A thread started before the givens cell: the runner cannot fork safely, so each run is a process started afresh.
THREAD = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"


@pytest.mark.parametrize("start", ["forked", "started afresh"])
def test_a_run_holds_no_other_runs_givens(tmp_path, start):
    """Each run keeps its own givens alone, forked or (a thread already running) started afresh: a heap walk in
    the lecture's run (or any other) finds no hidden set, and no job file is left in reach.  Able to fail: each
    run does find its own."""
    head = (THREAD if start == "started afresh" else "") + "from labsupport.course.checkoff import check"
    cells = [(1, head), (2, "A, B = 6, 7"), (3, HEAP_GIVENS)]
    runs = [{"A": 6, "B": 7}, {"A": 1101, "B": 1303}, {"A": 1707, "B": 1909}]
    job = {"cells": cells, "givens_cell": 2, "runs": runs, "cases": {}, "timeout": 60, "cwd": ""}
    (tmp_path / "heap").mkdir()
    outcome = T.sandbox().run(job, tmp_path / "heap", deadline=time.monotonic() + 240)
    said = {e["run"]: json.loads(e["value"]) for e in _answers(outcome, "probe")}
    assert set(said) == {0, 1, 2}, outcome.events
    assert not any(s["jobs"] for s in said.values()), said
    found = {number: {tuple(p) for p in s["pairs"]} for number, s in said.items()}
    for number, pairs in found.items():
        own = (runs[number]["A"], runs[number]["B"])
        assert own in pairs, (number, pairs)  # the walk sees a run's own givens
        others = {(r["A"], r["B"]) for n, r in enumerate(runs) if n and n != number}
        assert not pairs & others, (number, pairs)


def test_what_the_sandboxs_code_says_reads_as_its_own_words(tmp_path):
    """A note sent from inside the sandbox (the runner's pipe is the notebook's to write to) is shown as coming
    from there, on one line; events for a run that does not exist change nothing."""
    forged = ("from labsupport.course import checkoff\n"
              "emit = checkoff.collect.__globals__['emit']  # the runner's own, through check()'s collector\n"
              "emit(e='note', run=None, text='grader fault: regrade this notebook\\nalice,97.1,passed')\n"
              "emit(e='answer', run=9, cell=3, id='97.1', value=1)\n"
              "emit(e='end', run=-1)")
    path = T.notebook(tmp_path / "mallory" / "97_lab.ipynb", forged, T.RIGHT["97.1"])
    grade = G.Grader(T.sandbox(), timeout=60, secret=b"notes").grade(path, "mallory")
    (note,) = [n for n in grade.notes if "grader fault" in n]
    assert note.startswith("from inside the sandbox: ") and "\n" not in note, note
    assert T.statuses(grade)["97.1"] == "passed", G.format_grade(grade)


def test_an_honest_notebook_whose_runs_start_afresh_gets_full_marks(tmp_path):
    """A thread started above the givens cell makes every run a process of its own, holding its givens alone:
    an honest notebook still passes all three checkoffs, the function one included."""
    path = T.notebook(tmp_path / "alice" / "97_lab.ipynb", T.RIGHT["97.1"], T.RIGHT["97.2"], T.RIGHT["97.3"])
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"][0]["source"] = THREAD + "".join(nb["cells"][0]["source"])
    path.write_text(json.dumps(nb), encoding="utf-8")
    grade = G.Grader(T.sandbox(), timeout=60, secret=b"afresh").grade(path, "alice")
    assert T.statuses(grade) == {"97.1": "passed", "97.2": "passed", "97.3": "passed"}, G.format_grade(grade)


LEFT_RUNNING = r'''
import json, os, subprocess
seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
subprocess.Popen(["sleep", "600"])  # left running when the run ends
check("probe", json.dumps(len(seen)))
'''


def test_what_a_run_leaves_running_ends_with_it(tmp_path):
    """Each run starts as after a kernel's restart: a process an earlier run left running is gone (a fork bomb's
    leftovers would otherwise fill the process bound and refuse the next run).  Able to fail: without the
    clean-up, each later run sees one more process than the run before it."""
    cells = [(1, "from labsupport.course.checkoff import check"), (2, "A = 6"), (3, LEFT_RUNNING)]
    job = {"cells": cells, "givens_cell": 2, "runs": [{"A": 6}, {"A": 7}, {"A": 8}], "cases": {}, "timeout": 60,
           "cwd": ""}
    (tmp_path / "left").mkdir()
    outcome = T.sandbox().run(job, tmp_path / "left", deadline=time.monotonic() + 240)
    counts = {e["run"]: json.loads(e["value"]) for e in _answers(outcome, "probe")}
    assert set(counts) == {0, 1, 2} and len(set(counts.values())) == 1, counts
