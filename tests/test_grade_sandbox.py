"""What a notebook can reach while it is graded under bubblewrap: its own folder and scratch, and nothing else.

A probe notebook hands what it finds to check(), and the test reads the raw answers the sandbox sends
back (the probe's checkoff id is not a real one: the events carry it all the same).
"""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

import grading as T
from labsupport.course import runner
from labsupport.course.sandbox import GRADERS, PACKAGE

PROBE = r'''
import json, os, socket, subprocess, pathlib
found = {}
def attempt(name, fn):
    try:
        found[name] = fn()
    except Exception as exc:
        found[name] = "refused: " + type(exc).__name__
graders = pathlib.Path(__import__("labsupport.course", fromlist=["x"]).__file__).parent / "checkoffs"
attempt("graders", lambda: sorted(os.listdir(graders)))
attempt("repo", lambda: sorted(os.listdir(graders.parents[2])))
attempt("solutions", lambda: sorted(os.listdir(graders.parents[2] / "solutions")))
attempt("write package", lambda: open(graders.parent / "planted.py", "w").write("x"))
attempt("write usr", lambda: open("/usr/planted", "w").write("x"))
attempt("write scratch", lambda: open("mine.txt", "w").write("x"))
attempt("write tmp", lambda: open("/tmp/mine.txt", "w").write("x"))
attempt("folder copied", lambda: sorted(os.listdir(".")))
attempt("grader alive", lambda: os.kill(GRADER_PID, 0))
attempt("processes", lambda: len([p for p in os.listdir("/proc") if p.isdigit()]))
attempt("uid", lambda: os.getuid())
attempt("caps", lambda: [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0])
attempt("userns", lambda: subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode)
attempt("loopback", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=3).close())
attempt("internet", lambda: socket.create_connection(("1.1.1.1", 53), timeout=3).close())
attempt("secret", lambda: os.environ.get("LABSUPPORT_TEST_SECRET"))
attempt("dev writable", lambda: open("/dev/planted", "w").write("x"))
attempt("shadow", lambda: open("/etc/shadow").readline())
attempt("etc", lambda: sorted(os.listdir("/etc")))
import importlib
attempt("ledger command", lambda: hasattr(importlib.import_module("labsupport.cli.ledger"), "exercise5"))
attempt("grade tooling", lambda: hasattr(importlib.import_module("labsupport.course.grade"), "Grader"))
check("probe", json.dumps(found))
'''


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    import json

    T.register()
    sandbox = T.sandbox()
    folder = tmp_path_factory.mktemp("probe")
    (folder / "notes.txt").write_text("mine")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    os.environ["LABSUPPORT_TEST_SECRET"] = "do not leak"
    try:
        cells = [(1, "from labsupport.course.checkoff import check"),
                 (2, f"GRADER_PID = {os.getpid()}\nPORT = {listener.getsockname()[1]}"), (3, PROBE)]
        job = {"cells": cells, "givens_cell": None, "runs": [{}], "cases": {}, "timeout": 120, "cwd": ""}
        outcome = sandbox.run(job, folder, deadline=time.monotonic() + 300)
    finally:
        del os.environ["LABSUPPORT_TEST_SECRET"]
        listener.close()
    answers = [e for e in outcome.events if isinstance(e, dict) and e.get("id") == "probe"]
    assert answers, outcome.events
    return json.loads(answers[-1]["value"])


def test_the_graders_and_solutions_are_out_of_sight(found):
    assert GRADERS.is_dir() and any(GRADERS.iterdir())  # they are there, outside
    assert found["graders"] == "refused: FileNotFoundError"  # the sandbox's copy of the package has none
    assert found["solutions"].startswith("refused") and "solutions" not in found["repo"]
    venv = {Path(sys.prefix).name} if Path(sys.prefix).parent == PACKAGE.parent else set()
    assert set(found["repo"]) <= {"labsupport", "data"} | venv  # the interpreter's packages, read-only, and no more


def test_staff_code_and_the_hosts_secrets_are_out_of_sight(found):
    for what in ("ledger command", "grade tooling"):  # left out, as the release leaves them out: nothing to import
        assert found[what] is False or found[what] == "refused: ModuleNotFoundError", (what, found[what])
    assert found["shadow"].startswith("refused") and "shadow" not in found["etc"] and "ssh" not in found["etc"]
    assert "passwd" in found["etc"] and "ld.so.cache" in found["etc"]  # what an interpreter needs stays


def test_nothing_outside_its_scratch_and_tmp_can_be_written(found):
    for place in ("write package", "write usr", "dev writable"):
        assert str(found[place]).startswith("refused"), place
    assert found["write scratch"] == 1 and found["write tmp"] == 1
    assert not (PACKAGE / "course" / "planted.py").exists()
    assert "notes.txt" in found["folder copied"]  # its own folder, copied into its scratch


def test_no_process_network_capability_or_namespace_of_the_grader_is_reachable(found):
    assert found["grader alive"].startswith("refused")  # another pid namespace
    assert found["processes"] <= 5
    assert found["uid"] == 1000 and int(found["caps"], 16) == 0  # (on the host: a uid of its own, when grade is root)
    assert found["userns"] != 0  # no user namespaces of its own
    assert found["loopback"].startswith("refused") and found["internet"].startswith("refused")
    assert found["secret"] is None  # the grader's environment stays outside


def test_the_runner_is_the_only_code_the_sandbox_starts():
    assert Path(runner.__file__).parent == PACKAGE / "course"
