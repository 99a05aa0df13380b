"""The suite's own machinery: `make test` spreads the tests over the cores with pytest-xdist's `--dist loadgroup`,
and a group must stay on one worker (the browser tests share one JupyterLab and must not race a second Chromium;
a module's expensive fixture is built once)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import lost_groups

ROOT = Path(__file__).resolve().parents[1]

GROUPED = '''
import pytest
pytestmark = pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(4))
def test_here(i):
    pass
'''


def test_a_group_runs_on_one_worker(tmp_path):
    """Two modules in one group, eight tests, two workers: every test reports the same worker."""
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text(GROUPED)
    (tmp_path / "test_alone.py").write_text("def test_alone():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
                          "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    passed = [line for line in run.stdout.splitlines() if line.startswith("[gw") and "PASSED" in line]
    grouped = [line for line in passed if "test_here" in line]
    assert len(passed) == 9 and len(grouped) == 8, run.stdout[-3000:]
    assert len({line.split("]")[0] for line in grouped}) == 1, "\n".join(grouped)
    assert all(line.rstrip().endswith("@together") for line in grouped), "\n".join(grouped)


def _config(dist: str, worker: bool = False):
    config = SimpleNamespace(getvalue=lambda name: dist if name == "dist" else None)
    if worker:
        config.workerinput = {}
    return config


@pytest.mark.parametrize("dist, worker, reads_nodeid, lost", [
    ("loadgroup", False, False, True),  # pytest 9.2: xdist's "@group" would be written where nothing reads it
    ("loadgroup", False, True, False),  # the id is read where xdist writes it: groups hold
    ("load", False, False, False),  # groups are not asked for
    ("no", False, False, False),
    ("loadgroup", True, False, False),  # a worker: the controller has already said it
])
def test_a_run_that_would_lose_its_groups_is_refused_in_one_line(dist, worker, reads_nodeid, lost):
    why = lost_groups(_config(dist, worker), reads_nodeid=reads_nodeid)
    assert bool(why) == lost, why
    if lost:
        assert "pytest-xdist#1386" in why and "pytest<9.2" in why and "\n" not in why


def test_this_pytest_keeps_the_groups():
    """The pytest `make test` installs is one whose ids pytest-xdist can suffix."""
    assert lost_groups(_config("loadgroup")) == ""


HANGS = '''
import time
def test_hangs():
    while True:
        time.sleep(0.1)
def test_after_it():
    pass
'''


def test_a_hung_test_fails_and_the_run_goes_on(tmp_path):
    """The suite's own settings (pyproject.toml) stop a test that never returns: with the bounds cut to seconds,
    the hung test's stack is written out as it runs on, then its worker is ended and reported, and the other test
    still passes."""
    (tmp_path / "test_hangs.py").write_text(HANGS)
    run = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                          "-o", "timeout=3", "-o", "faulthandler_timeout=1", "-n", "2", "-p", "no:cacheprovider", "-p", "no:randomly",
                          str(tmp_path / "test_hangs.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "crashed while running 'test_hangs.py::test_hangs'" in out, out[-3000:]
    assert "1 failed, 1 passed" in run.stdout, out[-3000:]
    assert "in test_hangs" in out, out[-3000:]  # the hung test's own frame, in the stack written out
