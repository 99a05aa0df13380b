"""python -m labsupport release: what students get holds no answer, and its notebooks and check() work.

The release is written once per module.  "No answer" is checked from material outside the release:
no solution marker or solution notebook; no line of any solution region of the lab sources; no
grader module, staff command or ledger command; and the labs' public records, the one place that
holds expected values (on the lecture's givens and the lab's own cases), copied as the build wrote
them, with those values sealed.  Then the release is used as a student would: its own labsupport
first on the path, no grader importable, its check() printing, line for line, what the repository's
prints for the same cell, its CLI, and its notebooks run top to bottom.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import nbformat
import pytest

from labsupport.course import build as B
from labsupport.course import record
from labsupport.course import release as REL
from labsupport.course.checkoffs import load_lab

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# what the release leaves out of the package, by hand: the graders, the staff commands and the ledger command
# (viz/board/ stays: lab 08 draws its map of Part II with it)
STAFF = ("course/checkoffs", "course/build.py", "course/grade.py", "course/sandbox.py", "course/runner.py",
         "course/report.py", "course/registry.py", "course/release.py", "course/autograder.py", "course/scaffold.py",
         "bench/notebooks.py", "bench/grade.py", "cli/ledger.py")


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


def _links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", markdown)


def test_the_release_holds_what_students_need(release):
    assert (release / "labsupport" / "__init__.py").is_file() and (release / "README.md").is_file()
    assert (release / "pyproject.toml").is_file() and (release / "data" / "tiny_lecture.pt").is_file()
    names = sorted(p.name for p in (release / "notebooks").glob("*.ipynb"))
    assert names == sorted(p.name for p in (ROOT / "notebooks").glob("0[0-9]_*.ipynb"))  # not the instructors' board
    for name in names:
        assert (release / "notebooks" / name).read_bytes() == (ROOT / "notebooks" / name).read_bytes()
    assert (release / "labsupport" / "workloads.py").is_file()  # the data loaders
    assert "Student release" in (release / "README.md").read_text()
    # the grading guide comes with it; the instructors' guide, the authoring guide and the ledger stay behind
    # word for word, but for the link to the authoring guide the release leaves out, which becomes its name
    repo_guide = (ROOT / "GRADING.md").read_text(encoding="utf-8")
    assert (release / "GRADING.md").read_text(encoding="utf-8") == re.sub(
        r"\[([^\]]*)\]\(COURSE_AUTHORING\.md\)", r"\1", repo_guide)
    for staff in ("INSTRUCTORS.md", "COURSE_AUTHORING.md", "LEDGER.md"):
        assert not (release / staff).exists(), staff
    targets = _links((release / "README.md").read_text())
    assert "GRADING.md" in targets and "notebooks/02_naive_allocator.ipynb" in targets
    assert "LEDGER.md" not in targets and "INSTRUCTORS.md" not in targets  # their list items are dropped
    missing = [t for t in targets if "://" not in t and not (release / t).exists()]
    assert not missing, missing


def test_no_guide_in_the_release_links_to_a_file_it_left_out(release):
    text = (release / "GRADING.md").read_text()
    missing = [t for t in _links(text) if "://" not in t and not (release / t).exists()]
    assert not missing, missing
    assert "COURSE_AUTHORING.md" in (ROOT / "GRADING.md").read_text()  # the repository's guide does link it
    assert "[COURSE_AUTHORING.md]" not in text and "COURSE_AUTHORING.md" in text  # the release keeps its words


def test_the_release_refuses_a_notebook_that_names_a_file_it_does_not_ship(tmp_path):
    """Issue 35: errata stand where the student reads them; a notebook that sends them to LEDGER.md (a markdown link,
    or the name in a printed line) or to a solution is caught, one line naming the notebook, the cell and the file;
    a shipped guide, a sibling notebook, a URL and an anchor pass."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    (tmp_path / "GRADING.md").write_text("")
    cells = [nbformat.v4.new_markdown_cell("See [the errata](../LEDGER.md#slips) and [grading](../GRADING.md)."),
             nbformat.v4.new_code_cell('print("the lecture rounds it (LEDGER.md, §10.6)")'),
             nbformat.v4.new_markdown_cell("Next: [lab 01](01_b.ipynb), [a site](https://example.org/a.md), [up](#top)."),
             nbformat.v4.new_markdown_cell("The answer is in solutions/00_a.ipynb.")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), nbs / "00_a.ipynb")
    nbformat.write(nbformat.v4.new_notebook(), nbs / "01_b.ipynb")
    found = REL.unshipped_references(tmp_path)
    assert found == ["notebooks/00_a.ipynb cell 0: names ../LEDGER.md, which the release does not ship",
                     "notebooks/00_a.ipynb cell 1: names LEDGER.md, which the release does not ship",
                     "notebooks/00_a.ipynb cell 3: names solutions/00_a.ipynb, which the release does not ship"], found
    (tmp_path / "LEDGER.md").write_text("")
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "00_a.ipynb").write_text("{}")
    assert REL.unshipped_references(tmp_path) == []


def test_the_release_holds_every_labs_record_as_the_build_wrote_it(release):
    labs = sorted(int(p.name[:2]) for p in (release / "notebooks").glob("*.ipynb"))
    copied = sorted((release / "labsupport" / "course" / "records").glob("*.json"))
    assert [p.name for p in copied] == [f"lab{n:02d}.json" for n in labs]
    for path in copied:
        assert path.read_bytes() == record.path(int(path.stem[3:])).read_bytes()


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


def test_no_solution_region_solution_notebook_grader_or_staff_command_is_in_it(release):
    assert not (release / "solutions").exists()
    for staff in STAFF:
        assert not (release / "labsupport" / staff).exists(), staff
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


def test_the_release_writes_nothing_of_its_own_into_the_package(release):
    """Every file of the package is the repository's own, but for the two that list commands: their staff lines
    are dropped, nothing is added."""
    changed = [path for path in (release / "labsupport").rglob("*") if path.is_file()
               and (ROOT / path.relative_to(release)).read_bytes() != path.read_bytes()]
    assert sorted(p.relative_to(release).as_posix() for p in changed) == ["labsupport/__main__.py",
                                                                        "labsupport/bench/__init__.py"]
    for path in changed:
        original = (ROOT / path.relative_to(release)).read_text().splitlines()
        assert set(path.read_text().splitlines()) <= set(original) and len(path.read_text()) < len("\n".join(original))


@pytest.mark.parametrize("lab", range(9))
def test_a_record_keeps_its_expected_values_sealed(lab):
    """What the release copies: per checkoff its public text and a sealed payload, masked (not merely compressed);
    the lecture's expected numbers of the value checkoffs are in it, and nowhere in the file's text."""
    text = record.path(lab).read_text(encoding="utf-8")
    graders = {c.id: c for c in load_lab(lab)}
    stored = json.loads(text)["checkoffs"]
    assert [e["id"] for e in stored] == list(graders)
    for entry in stored:
        c = graders[entry["id"]]
        assert set(entry) == {"id", "title", "hint", "kind", "prompts", "cells", "forbid", "derive", "sealed"}
        assert (entry["title"], entry["hint"], entry["kind"]) == (c.title, c.hint, c.kind)  # check() prints them
        with pytest.raises(zlib.error):
            zlib.decompress(base64.b64decode(entry["sealed"]))  # masked, not merely compressed
        if c.kind != "value":
            continue
        want = record.unseal(entry["sealed"], lab)["spec"]["want"]
        assert want == json.loads(json.dumps(c.value_spec()["want"]))
        numbers = [want] if isinstance(want, (int, float)) else list(want.values()) if isinstance(want, dict) else []
        for x in numbers:
            if isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) > 16:
                shown = {repr(x), f"{x:,}"} | ({f"{x:.2%}"} if abs(x) < 1 else set())
                assert not [s for s in shown if s in text], (c.id, x)


def _env(package_root: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(package_root))


def _run(release: Path, code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=release, env=_env(release), capture_output=True, text=True,
                          timeout=timeout)


# One notebook's worth of check() calls, as a student's cells make them: right and wrong values and functions, the
# placeholder, a function that raises, and (defined in another file) a function 1.2 forbids.
STUDENT_CELLS = '''
import math
import labsupport
from labsupport.course.checkoff import check
from shortcut import ridge

print(labsupport.__file__)
check("0.1", 512 * 1024)
check("0.1", 512_000)
check("0.1", ...)
check("1.2", lambda m, g: math.floor(g.peak_flops / g.hbm_bandwidth * m.dtype_bytes / 2))
check("1.2", ridge)
check("1.1", {"admit": "memory", "allocate": "memory", "batch": "places", "run": "arithmetic", "stream": "latency"})
check("1.4", {"batch"})
check("2.11", {"a partly empty last block", "no room for the next token"})
for answer in (lambda l, h, d, b: l * h * d * b, lambda l, h, d, b: 524288, lambda l, h, d, b: 1 / 0):
    check("0.2", answer)
'''
SHORTCUT_CELL = "def ridge(model, gpu):\n    from labsupport import ledger as L\n\n    return L.ridge_batch(model, gpu)\n"


def test_check_in_the_release_prints_what_it_prints_in_the_repository(release, tmp_path):
    (tmp_path / "cells.py").write_text(STUDENT_CELLS, encoding="utf-8")
    (tmp_path / "shortcut.py").write_text(SHORTCUT_CELL, encoding="utf-8")
    outputs = {}
    for where, package_root in (("release", release), ("repository", ROOT)):
        proc = subprocess.run([sys.executable, "cells.py"], cwd=tmp_path, env=_env(package_root),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        first, *lines = proc.stdout.splitlines()
        assert first.startswith(str(package_root / "labsupport")), first  # its own labsupport, first on the path
        outputs[where] = lines
    assert outputs["release"] == outputs["repository"]
    lines = outputs["release"]
    assert lines[0] == "✅ Checkoff 0.1 passed" and lines[1].startswith("❌ Checkoff 0.1: you gave 512,000 B")
    assert lines[2].startswith("⬜ Checkoff 0.1 not attempted — ")
    assert lines[3] == "✅ Checkoff 1.2 passed"
    assert lines[4].startswith("❌ Checkoff 1.2: your code for 1.2 calls labsupport.ledger.ridge_batch")
    assert lines[5] == "✅ Checkoff 1.1 passed" and lines[6].startswith("❌ Checkoff 1.4: you chose ['batch']")
    assert lines[7] == "✅ Checkoff 2.11 passed"
    fails = [line for line in lines[8:] if line.startswith("❌ Checkoff 0.2:")]
    assert len(fails) == 3 and "too low" in fails[0] and "raised ZeroDivisionError" in fails[2]
    assert 'cells.py", line' in "\n".join(lines[8:])  # the student's own frame of the function that raised
    assert "labsupport" not in "\n".join(line for line in lines[8:] if not line.startswith("❌"))


def test_no_grader_can_be_imported_from_the_release(release):
    proc = _run(release, "import labsupport.course.checkoffs")
    assert proc.returncode == 1 and "ModuleNotFoundError: No module named 'labsupport.course.checkoffs'" in proc.stderr
    proc = _run(release, "from labsupport.course import checkoff, record, judge, harness, scan, data, scoreboard")
    assert proc.returncode == 0, proc.stderr[-2000:]  # everything check() and the scoreboard need is there


def test_the_release_cli_lists_only_what_it_has(release):
    proc = _run(release, "import sys; from labsupport.__main__ import main; sys.exit(main(['--help']))")
    assert proc.returncode == 0
    listed = re.findall(r"^  (\w+)", proc.stdout, re.M)
    assert "doctor" in listed and "simulate" in listed and "traces" in listed and "bench" in listed
    assert not {"build", "grade", "checkoff", "release", "autograder", "ledger"} & set(listed), listed


def test_a_release_needs_every_labs_record_and_an_empty_folder(tmp_path, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("")
    with pytest.raises(REL.ReleaseError, match="exists and is not an empty folder"):
        REL.write_release(full)
    monkeypatch.setattr(REL, "PACKAGE", tmp_path / "no-records" / "labsupport")
    with pytest.raises(REL.ReleaseError, match="have no public record"):
        REL.write_release(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_every_import_of_every_student_notebook_works_in_the_release(release, tmp_path):
    """What the labs import from labsupport is all in the release (only two labs run whole below): a module it
    leaves out, or one that imports a staff-only module at its top, stops a lab at its first cell."""
    import ast

    imports = set()
    for path in sorted((release / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:  # a magic line: the cell's imports are on lines of their own
                tree = ast.parse("\n".join(line for line in cell.source.splitlines() if "import" in line
                                           and not line.lstrip().startswith(("%", "!"))))
            imports |= {ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                        and "labsupport" in ast.unparse(node)}
    assert any("viz import board" in line for line in imports)  # lab 08's map of Part II
    (tmp_path / "imports.py").write_text("\n".join(sorted(imports)) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "imports.py"], cwd=tmp_path, env=_env(release), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "notebooks").glob("0[05]_*.ipynb")))
def test_the_released_notebooks_run(release, name):
    """Run All on a fresh kernel that imports the release's labsupport reaches the last cell, unstopped."""
    path = release / "notebooks" / name
    nb = B.execute(nbformat.read(path, as_version=4), path.parent, progress=False, allow_errors=True,
                   label=name, env=_env(release))
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, [(e.ename, e.evalue) for e in errors]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") is not None for c in code)
    lines = [line for c in code for o in c.outputs if o.output_type == "stream" for line in o.text.splitlines()]
    assert any(line.startswith("⬜ Checkoff ") for line in lines)
