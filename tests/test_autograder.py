"""python -m labsupport autograder: the Gradescope bundle grades a submission end to end.

A temporary folder is laid out as Gradescope lays out /autograder (source/ holding the unzipped
bundle, submission/, results/), and the bundle's own run_autograder runs against it with the
paths pointed there (AUTOGRADER_ROOT, LABSUPPORT_PYTHON).  setup.sh needs the network, so only its
content is checked.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    proc = subprocess.run([sys.executable, "-m", "labsupport", "autograder", str(out), "--lab", "0", "--timeout", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def gradescope_root(tmp_path: Path, bundle: Path) -> Path:
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    (root / "submission").mkdir()
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():  # zipfile does not restore the executable bit
            if (info.external_attr >> 16) & stat.S_IXUSR:
                os.chmod(root / "source" / info.filename, 0o755)
    shutil.copyfile(root / "source" / "run_autograder", root / "run_autograder")
    os.chmod(root / "run_autograder", 0o755)
    return root


def run_autograder(root: Path) -> dict:
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), LABSUPPORT_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def student_notebook(path: Path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.cells.insert(1, nbformat.v4.new_code_cell("KV_KIB = 512", metadata={"tags": ["givens"]}))  # lab 00's givens
    nbformat.write(nb, path)


def test_the_bundle_has_what_gradescope_runs(bundle):
    with zipfile.ZipFile(bundle) as zf:
        names = set(zf.namelist())
        setup = zf.read("setup.sh").decode()
        run = zf.read("run_autograder").decode()
        modes = {i.filename: (i.external_attr >> 16) for i in zf.infolist()}
    assert {"setup.sh", "run_autograder", "pyproject.toml", "labsupport/course/grade.py",
            "labsupport/course/checkoffs/lab00.py", "data/tiny_lecture.pt"} <= names
    assert modes["setup.sh"] & stat.S_IXUSR and modes["run_autograder"] & stat.S_IXUSR
    assert "download.pytorch.org/whl/cpu" in setup and "torch==" in setup and "pip install -e /autograder/source" in setup
    assert setup.startswith("#!/usr/bin/env bash") and run.startswith("#!/usr/bin/env bash")
    assert "/autograder/results" not in run or "AUTOGRADER_ROOT" in run


def test_a_submission_is_graded_into_results_json(bundle, tmp_path):
    root = gradescope_root(tmp_path, bundle)
    student_notebook(root / "submission" / "00_setup.ipynb", "from labsupport.course.checkoff import check",
                     'kib = KV_KIB * 1024\ncheck("0.1", kib)',
                     'def per_token(l, h, d, b):\n    return l * h * d * b\ncheck("0.2", per_token)',
                     'print("✅ Checkoff 0.2 passed")')
    data = run_autograder(root)
    tests = {t["number"]: t for t in data["tests"]}
    assert set(tests) == {"0.1", "0.2"}
    assert (tests["0.1"]["score"], tests["0.2"]["score"]) == (1.0, 0.0)
    assert all(t["max_score"] == 1.0 for t in tests.values()) and data["score"] == 1.0
    assert "too low" in tests["0.2"]["output"] and "Hint:" in tests["0.2"]["output"]
    json.loads((root / "results" / "results.json").read_text(), parse_constant=lambda c: pytest.fail(c))


def test_an_empty_or_broken_submission_still_gets_results(bundle, tmp_path):
    root = gradescope_root(tmp_path, bundle)
    data = run_autograder(root)  # nothing handed in
    assert [t["score"] for t in data["tests"]] == [0.0, 0.0] and "no notebook of lab 00" in data["output"]
    (root / "submission" / "00_setup.ipynb").write_text("[]")
    data = run_autograder(root)
    assert [t["score"] for t in data["tests"]] == [0.0, 0.0] and "not a notebook" in data["output"]


@pytest.mark.parametrize("argv, words", [([], "give the .zip"), (["x.tar"], ".zip"), (["--lab", "abc", "a.zip"], "--lab"),
                                         (["--lab", "99", "a.zip"], "no checkoffs"), (["/no/where/a.zip"], "cannot write")])
def test_bad_arguments_are_one_line(argv, words, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "labsupport", "autograder", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
