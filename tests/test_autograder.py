"""python -m labsupport autograder: the Gradescope bundle grades a submission end to end, in container mode.

A temporary folder is laid out as Gradescope lays out /autograder (source/ holding the unzipped
bundle, submission/, results/), and the bundle's own run_autograder runs against it with the paths
pointed there (AUTOGRADER_ROOT, LABSUPPORT_PYTHON).  Gradescope runs one container per submission,
so each run gets a freshly unzipped source/: container mode deletes the graders from it before the
notebook runs, as the unprivileged user 65534 (setpriv).  setup.sh needs the network, so only its
content is checked; what it does — install this package editable from /autograder/source — a
``.pth`` file does here.

The interpreter: user 65534 must be able to run it and read its packages, which on this machine the
repository's virtual environment does not allow (its interpreter lives under /root, mode 700).  So
the test makes its own environment, in a temporary folder of its own (mode 755), from the system's
/usr/bin/python3.11, reading the repository environment's packages and the bundle's labsupport
through a .pth file; nothing outside that folder has its permissions changed.  Without such an
interpreter, or without setpriv, the end-to-end tests are skipped and say why.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import nbformat
import pytest

from labsupport.course import sandbox as S

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
NOBODY = 65534


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    # Gradescope's default bound per run: 60 s stopped lab 00's first import when two suites shared the 2 cores
    proc = subprocess.run([sys.executable, "-m", "labsupport", "autograder", str(out), "--lab", "0", "--timeout", "300"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def place():
    """A folder of the test's own that user 65534 can read: an interpreter (`python`) it can run, whose
    packages are the repository environment's and whose labsupport is the bundle's at `place/autograder/source`."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("prlimit"):
        pytest.skip("container mode runs the notebook as user 65534 through setpriv and prlimit: needs root and util-linux")
    if not SYSTEM_PYTHON.is_file():
        pytest.skip(f"no {SYSTEM_PYTHON} to build an interpreter user 65534 can run (the repository's lives under "
                    f"{Path(sys.base_prefix)}, which that user may not enter)")
    folder = Path(tempfile.mkdtemp(prefix="labsupport-autograder-test-"))
    try:
        folder.chmod(0o755)
        subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(folder / "venv")], check=True,
                       capture_output=True, timeout=120)
        site = Path(subprocess.run([str(folder / "venv" / "bin" / "python"), "-c",
                                    "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        # as `pip install -e /autograder/source` would: the bundle's labsupport, then this environment's packages
        (site / "labsupport-bundle.pth").write_text(f"{folder / 'autograder' / 'source'}\n"
                                                    f"{sysconfig.get_paths()['purelib']}\n")
        probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                                str(folder / "venv" / "bin" / "python"), "-I", "-c", "import torch, nbformat, IPython"],
                               capture_output=True, text=True, timeout=300)
        if probe.returncode != 0:
            pytest.skip(f"user {NOBODY} cannot run {SYSTEM_PYTHON} with the repository's packages: "
                        f"{probe.stderr.strip().splitlines()[-1:]}")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def gradescope(place, bundle):
    """/autograder as Gradescope lays it out, empty but for run_autograder (source/ is unzipped per run)."""
    root = place / "autograder"
    shutil.rmtree(root, ignore_errors=True)
    (root / "submission").mkdir(parents=True)
    with zipfile.ZipFile(bundle) as zf:
        (root / "run_autograder").write_bytes(zf.read("run_autograder"))
    os.chmod(root / "run_autograder", 0o755)
    return root


def unzip(bundle: Path, source: Path) -> None:
    shutil.rmtree(source, ignore_errors=True)
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(source)
        for info in zf.infolist():  # zipfile does not restore the executable bit
            if (info.external_attr >> 16) & stat.S_IXUSR:
                os.chmod(source / info.filename, 0o755)


def run_autograder(root: Path, bundle: Path) -> dict:
    """One submission's container: a fresh source/, then the bundle's run_autograder; results.json."""
    unzip(bundle, root / "source")
    python = root.parent / "venv" / "bin" / "python"
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), LABSUPPORT_PYTHON=str(python))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "grade: isolation: container" in proc.stderr, proc.stderr[-3000:]
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
    assert {"setup.sh", "run_autograder", "pyproject.toml", "labsupport/course/grade.py", "labsupport/course/runner.py",
            "labsupport/course/checkoffs/lab00.py", "labsupport/course/records/lab00.json", "data/tiny_lecture.pt"} <= names
    assert modes["setup.sh"] & stat.S_IXUSR and modes["run_autograder"] & stat.S_IXUSR
    assert "download.pytorch.org/whl/cpu" in setup and "torch==" in setup and "pip install -e /autograder/source" in setup
    assert "setpriv" in setup and "prlimit" in setup  # container mode's tools
    assert setup.startswith("#!/usr/bin/env bash") and run.startswith("#!/usr/bin/env bash")
    assert "AUTOGRADER_ROOT" in run and "--lab 00" in run


# The notebook reports, through 0.1's answer, where it runs: as user 65534, importing the bundle's labsupport,
# from which the graders are gone.  All true: the right answer; else minus one minus the failed facts' bits.
WHERE_IT_RUNS = """\
import os
import labsupport
package = os.path.dirname(labsupport.__file__)
facts = [os.getuid() == {nobody}, not os.access({package!r}, os.R_OK), package != {package!r},
         not any(os.path.exists(os.path.join(package, *p)) for p in [("course", "checkoffs"), ("cli", "ledger.py")])]
kib = KV_KIB * 1024 if all(facts) else -1 - sum(1 << i for i, fact in enumerate(facts) if not fact)
check("0.1", kib)"""


def test_a_submission_is_graded_as_nobody_without_the_graders(bundle, gradescope):
    where = WHERE_IT_RUNS.format(nobody=NOBODY, package=str(gradescope / "source" / "labsupport"))
    student_notebook(gradescope / "submission" / "00_setup.ipynb", "from labsupport.course.checkoff import check", where,
                     'def per_token(l, h, d, b):\n    return l * h * d * b\ncheck("0.2", per_token)',
                     'print("✅ Checkoff 0.2 passed")')
    data = run_autograder(gradescope, bundle)
    tests = {t["number"]: t for t in data["tests"]}
    assert set(tests) == {"0.1", "0.2"}
    assert (tests["0.1"]["score"], tests["0.2"]["score"]) == (1.0, 0.0), tests["0.1"]["output"]
    assert all(t["max_score"] == 1.0 for t in tests.values()) and data["score"] == 1.0
    assert "too low" in tests["0.2"]["output"] and "Hint:" in tests["0.2"]["output"]  # a printed pass line counts for nothing
    json.loads((gradescope / "results" / "results.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    # the graders and all bytecode went from the bundle's copy only (the notebook imported a student-side copy of
    # the package): the repository keeps its own
    assert not (gradescope / "source" / "labsupport" / "course" / "checkoffs").exists()
    assert not list((gradescope / "source" / "labsupport").rglob("__pycache__"))
    assert (gradescope / "source" / "labsupport" / "course" / "records" / "lab00.json").is_file()
    assert (ROOT / "labsupport" / "course" / "checkoffs" / "lab00.py").is_file()


def test_an_empty_or_broken_submission_still_gets_results(bundle, gradescope):
    data = run_autograder(gradescope, bundle)  # nothing handed in
    assert [t["score"] for t in data["tests"]] == [0.0, 0.0] and "no notebook of lab 00" in data["output"]
    (gradescope / "submission" / "00_setup.ipynb").write_text("[]")
    data = run_autograder(gradescope, bundle)
    assert [t["score"] for t in data["tests"]] == [0.0, 0.0] and "not a notebook" in data["output"]


@pytest.mark.parametrize("argv, words", [([], "give the .zip"), (["x.tar"], ".zip"), (["--lab", "abc", "a.zip"], "--lab"),
                                         (["--lab", "99", "a.zip"], "no checkoffs"), (["/no/where/a.zip"], "cannot write")])
def test_bad_arguments_are_one_line(argv, words, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "labsupport", "autograder", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr


# --- forget_graders deletes only a bundle's copy ----------------------------------------------------------

def _tree(root: Path, *marks: str) -> Path:
    """A folder laid out as a checkout or a bundle: labsupport/course/checkoffs/lab00.py, solutions/, and `marks`."""
    (root / "labsupport" / "course" / "checkoffs").mkdir(parents=True)
    (root / "labsupport" / "course" / "checkoffs" / "lab00.py").write_text("# graders\n")
    (root / "solutions").mkdir()
    (root / "solutions" / "00_setup.py").write_text("# a lab source\n")
    for mark in marks:
        (root / mark).mkdir() if mark == ".git" else (root / mark).write_text("#!/usr/bin/env bash\n")
    return root


def _pointed_at(monkeypatch, root: Path) -> None:
    """sandbox as if its labsupport were `root`'s (never the repository's: nothing here may delete that)."""
    monkeypatch.setattr(S, "PACKAGE", root / "labsupport")
    monkeypatch.setattr(S, "GRADERS", root / "labsupport" / "course" / "checkoffs")


@pytest.mark.parametrize("marks", [(".git",), (), ("run_autograder", ".git")], ids=["checkout", "plain", "bundle-in-git"])
def test_forget_graders_refuses_anything_but_a_bundle(tmp_path, monkeypatch, marks):
    root = _tree(tmp_path / "copy", *marks)
    _pointed_at(monkeypatch, root)
    with pytest.raises(S.NotABundle, match="is not one, and its graders stay"):
        S.forget_graders()
    assert (root / "labsupport" / "course" / "checkoffs" / "lab00.py").is_file()
    assert (root / "solutions" / "00_setup.py").is_file()


def test_forget_graders_deletes_a_bundles_graders_and_lab_sources(tmp_path, monkeypatch):
    root = _tree(tmp_path / "source", "run_autograder")
    _pointed_at(monkeypatch, root)
    S.forget_graders()
    assert not (root / "labsupport" / "course" / "checkoffs").exists() and not (root / "solutions").exists()
    assert (root / "labsupport" / "course").is_dir()
    assert (root / "labsupport").stat().st_mode & 0o077 == 0  # the rest is the grader's alone


def test_the_repository_is_not_a_bundle():
    assert S.PACKAGE == ROOT / "labsupport" and not S.is_bundle(ROOT)


def test_an_autograder_crash_posts_no_score(tmp_path, monkeypatch):
    """A fault of the autograder itself is never the student's 0: results.json is written, says REGRADE, and
    carries no score at all (neither overall nor per test), so Gradescope posts nothing to regrade over."""
    from labsupport.course import autograder as A

    def broken(*args, **kwargs):
        raise RuntimeError("the grader's own bug")

    monkeypatch.setattr(A.G, "grade_all", broken)
    (tmp_path / "submission").mkdir()
    data = A.run(tmp_path, mode="trusted")
    written = json.loads((tmp_path / "results" / "results.json").read_text())
    assert written == data
    assert "score" not in data and data["tests"] == [], data
    assert data["output"].startswith("REGRADE") and "the grader's own bug" in data["output"]
