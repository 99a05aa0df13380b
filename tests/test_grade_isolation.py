"""Isolation: what a notebook being graded can reach (labsupport.course.sandbox).

A probe looks around and lists anything it should not reach: the grader's processes in /proc, the
grader's command line and environment, the repository's solutions/ and graders, a TCP listener this
test opens on 127.0.0.1, another notebook's job folder.  It runs in the kernel of a small lab-00
notebook that `grade` grades (two students at once), where a finding makes 0.2's cell raise (the
detail quotes it) while honest answers pass, so a pass also shows a sandboxed kernel still works;
and in a worker started the way `grade` starts it, where the function returns its findings (a
function answer that opens files or sockets is refused by the static check before it runs there).
Run outside any sandbox first, the probe finds them all, so it can fail.  The uid fallback (forced)
is checked for what it promises: a user id of its own, no capabilities, no write to labsupport, no
read of the graders.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from labsupport.course.sandbox import MODE_ENV, UIDS, Sandbox
from labsupport.course import grade as G
from test_grade import GOOD_01, GOOD_02, IMPORTS, notebook

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SECRET = "labsupport-isolation-secret-7f1c"  # in the grader's environment and on its command line
BWRAP = sys.platform == "linux" and os.geteuid() == 0 and Sandbox("bubblewrap").works()

PROBES = '''
import os, socket, pathlib
def leaks(grader_pid, port, sibling_check=True):
    found = []
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    if len(pids) > 12:
        found.append(f"sees {{len(pids)}} processes")
    for p in pids:
        try:
            if b"pytest" in pathlib.Path(f"/proc/{{p}}/cmdline").read_bytes() or \\
                    b"-m\\x00labsupport\\x00grade" in pathlib.Path(f"/proc/{{p}}/cmdline").read_bytes():
                found.append(f"sees the grader as /proc/{{p}}")
        except OSError:
            pass
    for path in {paths!r} + [f"/proc/{{grader_pid}}/cmdline", f"/proc/{{grader_pid}}/environ",
                             f"/proc/{{os.getppid()}}/environ"]:
        try:
            data = open(path, "rb").read() if not os.path.isdir(path) else ",".join(os.listdir(path)).encode()
            if path.startswith("/proc/") and {secret!r}.encode() not in data:
                continue  # a process of the sandbox's own (the pid number is not the grader's there)
            found.append(f"reads {{path}}")
        except OSError:
            pass
    if {secret!r} in str(os.environ):
        found.append("has the grader's environment")
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        found.append(f"reached 127.0.0.1:{{port}}")
    except OSError:
        pass
    job = pathlib.Path(os.environ["HOME"]).parent
    try:
        others = [n for n in os.listdir(job.parent) if n != job.name]
        if others:
            found.append(f"sees other job folders {{others}}")
    except OSError:
        pass
    return found
'''

KERNEL_PROBE = 'found = leaks({pid}, {port})\nif found:\n    raise RuntimeError("kernel " + "; ".join(found))'

UID_PROBES = '''
import os, pathlib
def leaks():
    found = []
    if os.getuid() == 0 or os.getuid() not in range({lo}, {hi}):
        found.append(f"runs as uid {{os.getuid()}}")
    caps = [l for l in pathlib.Path("/proc/self/status").read_text().splitlines() if l.startswith("CapEff")]
    if caps != ["CapEff:\\t0000000000000000"]:
        found.append(f"holds {{caps}}")
    for path in {writable!r}:
        try:
            open(path, "ab").close()  # opened, never written
            found.append(f"may write {{path}}")
        except OSError:
            pass
    for path in {readable!r}:
        try:
            open(path, "rb").read(1) if not os.path.isdir(path) else os.listdir(path)
            found.append(f"reads {{path}}")
        except OSError:
            pass
    return found
'''


def _run(folder: Path, env: dict) -> tuple[str, dict]:
    argv = [sys.executable, "-m", "labsupport", "grade", str(folder), "--jobs", "2", "--timeout", "120", "--json",
            "--no-progress", "--seed", "3", "--gradescope", str(folder.parent / f"results-{SECRET}.json")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.stdout, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return proc.stderr, {(n["student"], c["id"]): (c["status"], c["detail"]) for n in report["notebooks"]
                         for c in n["checkoffs"]} | {(n["student"], "error"): n["error"] for n in report["notebooks"]}


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def _outside(source: str, *args) -> list[str]:
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - the probe as written into the notebook, run here as root
    return namespace["leaks"](*args)


PATHS = [str(ROOT / "solutions"), str(ROOT / "labsupport" / "course" / "checkoffs" / "lab02.py")]
SOURCE = PROBES.format(paths=PATHS, secret=SECRET)


@pytest.mark.skipif(not BWRAP, reason="bubblewrap cannot run as root here")
def test_under_bubblewrap_a_graded_notebook_reaches_nothing_outside_its_view(tmp_path, listener, monkeypatch):
    monkeypatch.setenv("LABSUPPORT_TEST_SECRET", SECRET)
    outside = _outside(SOURCE, os.getpid(), listener)
    for words in ("processes", "reads " + PATHS[0], "reads " + PATHS[1], "environment", "reached 127.0.0.1"):
        assert any(words in f for f in outside), (words, outside)

    for student in ("ann", "bob"):  # graded at once (--jobs 2): each one's job folder is beside the other's
        notebook(tmp_path / "class" / student / "00_x.ipynb", IMPORTS, SOURCE, GOOD_01,
                 KERNEL_PROBE.format(pid=os.getpid(), port=listener) + "\n" + GOOD_02)
    env = dict(os.environ)
    env.pop(MODE_ENV, None)
    stderr, got = _run(tmp_path / "class", env)
    assert "grade: isolation: bubblewrap (" in stderr
    for student in ("ann", "bob"):
        assert got[(student, "error")] == ""
        assert got[(student, "0.1")] == ("passed", "")
        assert got[(student, "0.2")] == ("passed", ""), got[(student, "0.2")][1]


@pytest.mark.skipif(not BWRAP, reason="bubblewrap cannot run as root here")
def test_under_bubblewrap_the_worker_reaches_nothing_outside_its_view(tmp_path, listener, monkeypatch):
    monkeypatch.setenv("LABSUPPORT_TEST_SECRET", SECRET)
    sandbox = Sandbox.for_this_machine()
    assert sandbox is not None and sandbox.mode == "bubblewrap"
    grader = G.Grader(timeout=60, sandbox=sandbox)
    slot = sandbox.acquire()
    try:
        other = grader.scratch / "nb-another-student"
        (other / "home").mkdir(parents=True)
        job = grader.scratch / "nb-this-one"
        (job / "home").mkdir(parents=True)
        slot.enter(job)
        worker = grader._worker(job, slot)
        try:
            fn = worker.load("0.2", SOURCE + "\n__answer__ = leaks\n", (), "def leaks(): ...", 60)
            assert fn(os.getpid(), listener) == []
        finally:
            worker.close()
    finally:
        slot.release()
        grader.close()


@pytest.mark.skipif(not (sys.platform == "linux" and os.geteuid() == 0), reason="lending user ids needs root")
def test_the_uid_fallback_runs_as_a_user_of_its_own_that_cannot_write_labsupport_or_read_the_graders(tmp_path):
    writable = [str(ROOT / "labsupport" / "units.py"), str(ROOT / "labsupport" / "course" / "grade.py")]
    readable = [str(ROOT / "labsupport" / "course" / "checkoffs" / "lab02.py"), str(ROOT / "solutions")]
    source = UID_PROBES.format(lo=UIDS.start, hi=UIDS.stop, writable=writable, readable=readable)
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - outside, as root, it finds every one of them
    outside = namespace["leaks"]()
    assert len(outside) == 1 + 1 + len(writable) + len(readable), outside
    before = [Path(p).read_bytes() for p in writable]
    probe = 'found = leaks()\nif found:\n    raise RuntimeError("; ".join(found))'
    notebook(tmp_path / "class" / "cy" / "00_x.ipynb", IMPORTS, source, GOOD_01, probe + "\n" + GOOD_02)
    stderr, got = _run(tmp_path / "class", dict(os.environ, **{MODE_ENV: "uid"}))
    assert "grade: isolation: uid (" in stderr
    assert got[("cy", "error")] == ""
    assert got[("cy", "0.1")] == ("passed", "")
    assert got[("cy", "0.2")] == ("passed", ""), got[("cy", "0.2")][1]
    assert [Path(p).read_bytes() for p in writable] == before

    sandbox = Sandbox("uid")  # the worker, started as grade starts it in this mode
    sandbox.prepare_machine()
    grader = G.Grader(timeout=60, sandbox=sandbox)
    slot = sandbox.acquire()
    try:
        job = grader.scratch / "nb-this-one"
        (job / "home").mkdir(parents=True)
        slot.enter(job)
        slot.own(job / "home")
        worker = grader._worker(job, slot)
        try:
            assert worker.load("0.2", source + "\n__answer__ = leaks\n", (), "def leaks(): ...", 60)() == []
        finally:
            worker.close()
    finally:
        slot.release()
        grader.close()
    assert [Path(p).read_bytes() for p in writable] == before


def test_forced_none_says_so_in_one_line(tmp_path):
    notebook(tmp_path / "class" / "dee" / "00_x.ipynb", IMPORTS, GOOD_01)
    stderr, got = _run(tmp_path / "class", dict(os.environ, **{MODE_ENV: "none"}))
    lines = [line for line in stderr.splitlines() if line.startswith("grade: isolation:")]
    assert len(lines) == 1 and lines[0].startswith("grade: isolation: none (forced by $" + MODE_ENV)
    assert got[("dee", "0.1")] == ("passed", "")
