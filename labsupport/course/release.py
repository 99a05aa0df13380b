"""`python -m labsupport release OUT`: what an instructor hands students (every lab).

The release holds the package, the student notebooks (notebooks/NN_topic.ipynb, solution regions
already cut), the README with the guides it links to that concern students (grading), pyproject and
environment files and the data the loaders need (the tiny model; traces are fetched, or replaced by a
labelled synthetic stand-in, as in the repository).  It leaves out everything that answers an
exercise or grades one:

  * solutions/ (the lab sources and the executed instructor copies), the instructors' board and LEDGER.md;
  * labsupport/course/checkoffs (the graders: expected formulas, hidden givens and hidden cases) and the
    staff commands (build, grade, release, autograder, the scaffold, the sandbox and its runner);
  * the labs' tests.

check() works in the release exactly as in the repository: it reads each lab's public record
(labsupport/course/records, written by the build), which the release copies as it is.
"""
from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course import sandbox

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "labsupport"
# staff-only parts of the package (paths relative to labsupport/): what a grading sandbox masks, and the
# sandbox and its runner, which students have no use for
STAFF_ONLY = (*sandbox.STAFF_ONLY, "course/sandbox.py", "course/runner.py")
STAFF_COMMANDS = ("build", "grade", "release", "autograder", "checkoff", "ledger")
TOP_FILES = ("pyproject.toml", "environment.yml", "Makefile", ".gitignore")
# the README's companions students read; INSTRUCTORS.md (the board, solutions/) and LEDGER.md stay with the staff
STUDENT_GUIDES = ("GRADING.md",)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
TRACE_SUFFIXES = (".csv", ".jsonl", ".json.gz", ".csv.gz", ".part")  # .part: a trace download not finished


class ReleaseError(Exception):
    """The release cannot be made as asked; the message is one line."""


# --- writing the release --------------------------------------------------------------------------------------

def _staff(rel: str) -> bool:
    return any(rel == s or rel.startswith(s + "/") for s in STAFF_ONLY)


def _copy_package(dest: Path) -> None:
    for path in sorted(PACKAGE.rglob("*")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo") or _staff(rel):
            continue
        target = dest / "labsupport" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_bytes()
        if rel == "__main__.py":
            text = _drop_lines(text, rf'^\s*"(?:{"|".join(STAFF_COMMANDS)})"\s*:.*\n')
        elif rel == "bench/__init__.py":
            text = _drop_lines(text, r'^\s*"(?:notebooks|grade)"\s*:\s*"labsupport\.bench\.\w+:.*\n|^\s*(?:notebooks|grade)\s+.*\n')
        target.write_bytes(text)


def _drop_lines(data: bytes, pattern: str) -> bytes:
    return re.sub(pattern, "", data.decode("utf-8"), flags=re.M).encode("utf-8")


def _student_notebooks() -> list[Path]:
    return [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) if int(p.name[:2]) < 90]


def _data_files() -> list[Path]:
    folder = ROOT / "data"
    if not folder.is_dir():
        return []
    return [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith(TRACE_SUFFIXES)
            and "traces" not in p.relative_to(folder).parts]


RELEASE_NOTE = """\
> **Student release.** This copy holds the labs (`notebooks/`), the `labsupport` package and its data. The
> instructors' solutions and the graders are not part of it: `check("N.M", answer)` in a notebook gives you
> feedback on the lab's own cases; your grade comes from the course staff's run of
> `python -m labsupport grade` on the notebook you hand in, on inputs you have not seen.

"""

RELEASE_TEST = '''"""The student release installs and its in-notebook feedback works (run with `make test`)."""
from labsupport.course.checkoff import check, load_lab


def test_every_lab_has_its_checkoffs():
    for lab in range(9):
        assert load_lab(lab), f"lab {lab:02d} has no checkoffs"


def test_a_right_answer_passes_and_a_wrong_one_teaches(capsys):
    check("0.1", 512 * 2**10)
    assert capsys.readouterr().out.strip().endswith("passed")
    check("0.1", 512_000)
    line = capsys.readouterr().out
    assert line.startswith("❌ Checkoff 0.1:") and "Hint" in line, line
'''


def write_release(out: Path, progress: bool = False) -> dict:
    """Write the release into `out` (which must not exist, or be empty); returns a summary."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} exists and is not an empty folder")
    notebooks = _student_notebooks()
    if not notebooks:
        raise ReleaseError(f"no student notebooks in {ROOT / 'notebooks'}; run `python -m labsupport build` first")
    labs = [int(p.name[:2]) for p in notebooks]
    missing = [n for n in labs if not (PACKAGE / "course" / "records" / f"lab{n:02d}.json").is_file()]
    if missing:
        raise ReleaseError(f"labs {', '.join(f'{n:02d}' for n in missing)} have no public record in "
                           "labsupport/course/records; run `python -m labsupport build` first")
    staging = Path(tempfile.mkdtemp(prefix=".release-", dir=out.parent if out.parent.exists() else None))
    try:
        _copy_package(staging)
        (staging / "notebooks").mkdir()
        for nb in notebooks:
            shutil.copyfile(nb, staging / "notebooks" / nb.name)
        for path in _data_files():
            target = staging / "data" / path.relative_to(ROOT / "data")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        for name in TOP_FILES:
            if (ROOT / name).is_file():
                shutil.copyfile(ROOT / name, staging / name)
        for name in STUDENT_GUIDES:
            if (ROOT / name).is_file():
                (staging / name).write_text(unlinked((ROOT / name).read_text(encoding="utf-8"), staging), encoding="utf-8")
        readme = (ROOT / "README.md").read_text(encoding="utf-8") if (ROOT / "README.md").is_file() else ""
        (staging / "README.md").write_text(RELEASE_NOTE + without_missing_links(readme, staging), encoding="utf-8")
        (staging / "tests").mkdir()
        (staging / "tests" / "test_release.py").write_text(RELEASE_TEST, encoding="utf-8")
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"notebooks": [p.name for p in notebooks], "labs": labs}


def unlinked(markdown: str, folder: Path) -> str:
    """A guide as the release can show it: a link to a file the release leaves out becomes its plain text."""
    return re.sub(r"\[([^\]]+)\]\(([^)#\s]+)(?:#[^)]*)?\)",
                  lambda m: m[0] if "://" in m[2] or (folder / m[2]).exists() else m[1], markdown)


def without_missing_links(markdown: str, folder: Path) -> str:
    """The README as the release can show it: a list item or table row that links to a file the release
    leaves out (the board, INSTRUCTORS.md) is dropped, so no link in the student's copy leads nowhere."""
    blocks: list[list[str]] = []
    for line in markdown.splitlines(keepends=True):
        continues = blocks and blocks[-1][0].startswith("- ") and line.startswith("  ") and line.strip()
        if continues:
            blocks[-1].append(line)
        else:
            blocks.append([line])

    def dangling(block: list[str]) -> bool:
        first = block[0]
        if not (first.startswith("- ") or first.startswith("|")):
            return False
        targets = _LINK.findall("".join(block))
        return any("://" not in t and not (folder / t).exists() for t in targets)

    return "".join("".join(block) for block in blocks if not dangling(block))


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m labsupport release",
                      description="Write the student release: package, student notebooks, README, data; no answers.")
    p.add_argument("out", help="folder to create (must not exist, or be empty)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    try:
        args = p.parse_args(argv)
    except UsageError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if not out.parent.exists():
        print(f"release: {args.out}: no such folder {out.parent}", file=sys.stderr)
        return 2
    try:
        summary = write_release(out, progress=not args.no_progress)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"release: {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"release: wrote {out} ({len(summary['notebooks'])} notebooks; check() reads the public records of labs "
          f"{', '.join(f'{n:02d}' for n in summary['labs'])})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

