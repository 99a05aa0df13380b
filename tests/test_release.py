"""python -m labsupport release: what students get holds no answer, and its notebooks and check() work.

The release is written once per module.  "No answer" is checked four ways, each from material
outside the release: no solution marker or solution notebook; no line of any solution region of the
lab sources; no grader module; and none of the value checkoffs' expected numbers (as Python prints
them) in the package.  Then the release is used as a student would: its own labsupport first on the
path, its check() on a right and a wrong answer, its CLI, and its notebooks run top to bottom.
"""
from __future__ import annotations

import base64
import json
import os
import re
import zlib
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labsupport.course import build as B
from labsupport.course import formative
from labsupport.course.checkoff import case_rng, load_lab

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("handout") / "paged-kv-labs"
    proc = subprocess.run([sys.executable, "-m", "labsupport", "release", str(out), "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _texts(folder: Path):
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix not in (".pt", ".pyc"):
            yield path, path.read_text(encoding="utf-8", errors="replace")


def _student_copy_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "notebooks").glob("*.ipynb"))


def _solution_lines() -> set[str]:
    lines = set()
    for source in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        inside = False
        for line in source.read_text(encoding="utf-8").splitlines():
            if B.BEGIN_RE.match(line):
                inside = True
            elif B.END_RE.match(line):
                inside = False
            elif inside and len(line.strip()) >= 24:
                lines.add(line.strip())
    return lines


def test_the_release_holds_what_students_need(release):
    assert (release / "labsupport" / "__init__.py").is_file() and (release / "README.md").is_file()
    assert (release / "pyproject.toml").is_file() and (release / "data" / "tiny_lecture.pt").is_file()
    names = sorted(p.name for p in (release / "notebooks").glob("*.ipynb"))
    assert names == sorted(p.name for p in (ROOT / "notebooks").glob("0[0-9]_*.ipynb"))  # not the instructors' board
    for name in names:
        assert (release / "notebooks" / name).read_bytes() == (ROOT / "notebooks" / name).read_bytes()
    assert (release / "labsupport" / "workloads.py").is_file()  # the data loaders
    assert "Student release" in (release / "README.md").read_text()
    # the README's guides for students come with it; the instructors' guide stays behind, and so does its link
    assert (release / "LEDGER.md").read_bytes() == (ROOT / "LEDGER.md").read_bytes()
    assert (release / "GRADING.md").is_file() and not (release / "INSTRUCTORS.md").exists()
    readme = (release / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert "LEDGER.md" in targets and "notebooks/02_naive_allocator.ipynb" in targets
    missing = [t for t in targets if "://" not in t and not (release / t).exists()]
    assert not missing, missing


def test_the_student_readme_drops_only_what_links_nowhere(tmp_path):
    from labsupport.course.release import without_missing_links

    (tmp_path / "LEDGER.md").write_text("")
    text = ("# Labs\n\n| Lab | What |\n|---|---|\n| [00](LEDGER.md) | kept |\n| [99](board.ipynb) | dropped |\n\n"
            "- [LEDGER.md](LEDGER.md): kept,\n  over two lines.\n- [INSTRUCTORS.md](INSTRUCTORS.md): dropped,\n"
            "  with its second line.\n- [a site](https://example.org/x.md) stays\n\nProse naming [a file](gone.md) stays.\n")
    assert without_missing_links(text, tmp_path) == (
        "# Labs\n\n| Lab | What |\n|---|---|\n| [00](LEDGER.md) | kept |\n\n"
        "- [LEDGER.md](LEDGER.md): kept,\n  over two lines.\n- [a site](https://example.org/x.md) stays\n\n"
        "Prose naming [a file](gone.md) stays.\n")


def _mechanism_text() -> str:
    """labsupport's own mechanisms (everything outside the course tooling), as the repository has them."""
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "labsupport").rglob("*.py")
                     if "course" not in p.relative_to(ROOT / "labsupport").parts)


def test_no_solution_region_solution_notebook_or_grader_is_in_it(release):
    assert not (release / "solutions").exists()
    assert not (release / "labsupport" / "course" / "checkoffs").exists()
    for staff in ("grade.py", "build.py", "worker.py", "worker_process.py", "strip.py", "answers.py", "release.py",
                  "autograder.py", "sandbox.py"):
        assert not (release / "labsupport" / "course" / staff).exists(), staff
    # Exercise 4.2 asks for the kernels' own address line, which labsupport.kernels carries as the
    # mechanism students read; grade forbids calling or handing in that function.  Those lines are
    # the library's, not the release's, so they are the only region lines the release may contain.
    # Lines a lab also shows outside its regions (its given code) are in its student copy already.
    given = _mechanism_text() + _student_copy_text()
    region_lines = {line for line in _solution_lines() if line not in given}
    assert len(region_lines) > 50
    for path, text in _texts(release):
        assert B.BEGIN_MARK not in text and B.END_MARK not in text, path
        leaked = [line for line in region_lines if line in text]
        assert not leaked, (path, leaked[:3])
    for nb_path in (release / "notebooks").glob("*.ipynb"):
        nb = nbformat.read(nb_path, as_version=4)
        stored = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
        assert all(o.get("output_type") == "stream" and "passed" in o.get("text", "") for o in stored), nb_path


def test_the_release_adds_no_expected_value(release):
    """Copied files are the repository's own; the records it writes keep their answers sealed."""
    written = []
    for path in (release / "labsupport").rglob("*"):
        original = ROOT / path.relative_to(release)
        if path.is_file() and (not original.is_file() or original.read_bytes() != path.read_bytes()):
            written.append(path)
    records = sorted(p for p in written if p.suffix == ".json")
    assert [p.name for p in records] == [f"lab{n:02d}.json" for n in range(9)]
    for path in set(written) - set(records):  # __main__ and bench without the staff commands: lines dropped only
        original = (ROOT / path.relative_to(release)).read_text().splitlines()
        assert set(path.read_text().splitlines()) <= set(original) and len(path.read_text()) < len("\n".join(original))
    for path in records:
        lab = int(path.stem[3:])
        registered = {c.id: c for c in load_lab(lab)}
        for entry in json.loads(path.read_text())["checkoffs"]:
            checkoff = registered[entry["id"]]
            assert set(entry) == {"id", "title", "hint", "kind", "sealed"}
            assert (entry["title"], entry["hint"]) == (checkoff.title, checkoff.hint)  # public: check() prints them
            raw = base64.b64decode(entry["sealed"])
            with pytest.raises(zlib.error):
                zlib.decompress(raw)  # masked, not merely compressed
            payload = formative.unseal(entry["sealed"], lab)
            if checkoff.kind == "value" and "expected" in payload:
                assert payload["expected"] == checkoff.prepare(case_rng(checkoff.id))
                shown = {repr(payload["expected"]), f"{payload['expected']:,}"}
                assert not any(s.encode() in raw for s in shown)


def _run(release: Path, code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(release))
    return subprocess.run([sys.executable, "-c", code], cwd=release, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_check_gives_feedback_from_the_sealed_records(release):
    proc = _run(release, """
import labsupport, math
from labsupport.course.checkoff import check
assert labsupport.__file__.startswith(%r), labsupport.__file__
check("0.1", 512 * 1024)
check("1.2", lambda m, g: math.floor(g.peak_flops / g.hbm_bandwidth * m.dtype_bytes / 2))
check("1.1", {"admit": "memory", "allocate": "memory", "batch": "places", "run": "arithmetic",
              "stream": "latency"})
for answer in (lambda l, h, d, b: l * h * d * b, lambda l, h, d, b: 524288):
    check("0.2", answer)
""" % str(release))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[:3] == ["✅ Checkoff 0.1 passed", "✅ Checkoff 1.2 passed", "✅ Checkoff 1.1 passed"]
    assert len([line for line in lines if line.startswith("❌ Checkoff 0.2:")]) == 2
    assert "too low" in lines[3]


def test_the_release_cli_lists_only_what_it_has(release):
    proc = _run(release, "import sys; from labsupport.__main__ import main; sys.exit(main(['--help']))")
    assert proc.returncode == 0
    assert "grade" not in proc.stdout and "release" not in proc.stdout and "ledger" in proc.stdout


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "notebooks").glob("0[05]_*.ipynb")))
def test_the_released_notebooks_run(release, name):
    """Run All on a fresh kernel that imports the release's labsupport reaches the last cell, unstopped."""
    from nbclient import NotebookClient

    path = release / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, PYTHONPATH=str(release))
    client = NotebookClient(nb, km=B.kernel_manager(), timeout=600, allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=env)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, [(e.ename, e.evalue) for e in errors]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") is not None for c in code)
    lines = [line for c in code for o in c.outputs if o.output_type == "stream" for line in o.text.splitlines()]
    assert any(line.startswith("⬜ Checkoff ") for line in lines)
