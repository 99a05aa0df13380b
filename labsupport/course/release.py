"""`python -m labsupport release OUT`: what an instructor hands students (every lab; GRADING.md).

The release holds the package, the student notebooks, the README and the guides it links to that concern
students, pyproject and environment files, the data the loaders need and each lab's public record (which
check() reads, as in the repository).  It leaves out everything that answers or grades an exercise:
solutions/, the board, LEDGER.md, the graders, the staff commands and the labs' tests.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course import sandbox

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "labsupport"
# left out of the package (relative to labsupport/): the staff-only parts, which a grading sandbox's copy leaves out
# by the same rule (sandbox.student_files), and the sandbox and its runner
STAFF_ONLY = (*sandbox.STAFF_ONLY, *sandbox.GRADING_ONLY)
STAFF_COMMANDS = ("build", "grade", "release", "autograder", "checkoff", "ledger")
STAFF_LINES = {  # the lines of the package's command tables that name a staff command
    "__main__.py": rf'^\s*"(?:{"|".join(STAFF_COMMANDS)})"\s*:.*\n',
    "bench/__init__.py": r'^\s*"(?:notebooks|grade|plans)"\s*:\s*"labsupport\.bench\.\w+:.*\n|^\s*(?:notebooks|grade|plans)\s+.*\n',
}
TOP_FILES = ("pyproject.toml", "environment.yml", "Makefile", ".gitignore", "course.toml")
# the README's companions students read; INSTRUCTORS.md (the board, solutions/) and LEDGER.md stay with the staff
STUDENT_GUIDES = ("GRADING.md",)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # the ](target#anchor) that ends a markdown link
_LABELLED_LINK = re.compile(r"\[([^\]]+)" + _LINK.pattern)  # [text](target#anchor)
# a file a notebook names in its words (LEDGER.md, ../INSTRUCTORS.md, solutions/02_x.ipynb): it must ship too
_NAMED_FILE = re.compile(r"(?<![\w/.-])((?:\.\./|[\w-]+/)*[\w-]+\.(?:md|ipynb))\b")
TRACE_SUFFIXES = (".csv", ".jsonl", ".json.gz", ".csv.gz", ".part")  # .part: a trace download not finished


class ReleaseError(Exception):
    """The release cannot be made as asked; the message is one line."""


def _copy_package(dest: Path) -> None:
    for path, rel in sandbox.student_files(PACKAGE, STAFF_ONLY):
        text = path.read_bytes()
        if rel in STAFF_LINES:
            text = re.sub(STAFF_LINES[rel], "", text.decode("utf-8"), flags=re.M).encode("utf-8")
        _write(dest / "labsupport" / rel, text)


def _write(target: Path, data: bytes | str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


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


def write_release(out: Path) -> dict:
    """Write the release into `out` (which must not exist, or be empty); returns a summary."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} exists and is not an empty folder")
    notebooks = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) if int(p.name[:2]) < 90]
    if not notebooks:
        raise ReleaseError(f"no student notebooks in {ROOT / 'notebooks'}; run `python -m labsupport build` first")
    labs = [int(p.name[:2]) for p in notebooks]
    missing = [n for n in labs if not (PACKAGE / "course" / "records" / f"lab{n:02d}.json").is_file()]
    if missing:
        raise ReleaseError(f"labs {', '.join(f'{n:02d}' for n in missing)} have no public record in "
                           "labsupport/course/records; run `python -m labsupport build` first")
    # written beside `out` and renamed at the end, so a failed release leaves nothing half-written
    staging = Path(tempfile.mkdtemp(prefix=".release-", dir=out.parent if out.parent.exists() else None))
    try:
        _copy_package(staging)
        for path in [*notebooks, *_data_files(), *(ROOT / name for name in TOP_FILES if (ROOT / name).is_file())]:
            (staging / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, staging / path.relative_to(ROOT))
        readme = (ROOT / "README.md").read_text(encoding="utf-8") if (ROOT / "README.md").is_file() else ""
        _write(staging / "README.md", RELEASE_NOTE + without_missing_links(readme, staging))
        for name in STUDENT_GUIDES:
            if (ROOT / name).is_file():
                _write(staging / name, unlinked((ROOT / name).read_text(encoding="utf-8"), staging))
        _write(staging / "tests" / "test_release.py", RELEASE_TEST)
        dangling = unshipped_references(staging)
        if dangling:
            raise ReleaseError(f"{dangling[0]} (and {len(dangling) - 1} more)" if len(dangling) > 1 else dangling[0])
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"notebooks": [p.name for p in notebooks], "labs": labs}


def _missing(target: str, folder: Path) -> bool:
    """A link to a file the release leaves out (the README and the guides count as in: each is written once)."""
    return "://" not in target and target not in ("README.md", *STUDENT_GUIDES) and not (folder / target).exists()


def unshipped_references(release: Path) -> list[str]:
    """Every link or file name in the released notebooks (markdown, and the strings code cells print) that leads to
    a file the release does not ship, as 'notebooks/N.ipynb cell K: names T, which the release does not ship'.

    A student reads the lab's errata where it stands (issue 35: the lecture's number, the lab's, and why); a pointer
    to LEDGER.md or a solution is a dead end in the copy they have.  A name is looked for beside the notebook (a
    link's target) and at the release's root (a file named in the prose); the README and guides are written by then."""
    found = []
    for nb_path in sorted((release / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb_path.read_text(encoding="utf-8")).get("cells", [])
        for k, cell in enumerate(cells):
            text = "".join(cell.get("source", []))
            names = {*(t for t in _LINK.findall(text)), *_NAMED_FILE.findall(text)}
            for target in sorted(names):
                if "://" in target or target.startswith("mailto:"):  # neither pattern takes an #anchor
                    continue
                here, root = (nb_path.parent / target), release / target.lstrip("./")
                if here.exists() or root.exists():
                    continue
                found.append(f"{nb_path.relative_to(release)} cell {k}: names {target}, which the release does "
                             "not ship")
    return found


def unlinked(markdown: str, folder: Path) -> str:
    """A guide as the release can show it: a link to a file the release leaves out becomes its plain text."""
    return _LABELLED_LINK.sub(lambda m: m[1] if _missing(m[2], folder) else m[0], markdown)


def without_missing_links(markdown: str, folder: Path) -> str:
    """The README as the release can show it: a list item or table row that links to a file the release
    leaves out (the board, INSTRUCTORS.md) is dropped, so no link in the student's copy leads nowhere."""
    blocks: list[list[str]] = []
    for line in markdown.splitlines(keepends=True):
        if blocks and blocks[-1][0].startswith("- ") and line.startswith("  ") and line.strip():
            blocks[-1].append(line)  # a list item's continuation line
        else:
            blocks.append([line])

    def dangling(block: list[str]) -> bool:
        return block[0].startswith(("- ", "|")) and any(_missing(t, folder) for t in _LINK.findall("".join(block)))

    return "".join("".join(block) for block in blocks if not dangling(block))


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m labsupport release",
                      description="Write the student release: package, student notebooks, README, data; no answers.")
    p.add_argument("out", help="folder to create (must not exist, or be empty)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    try:
        args = p.parse_args(argv)
        out = Path(args.out)
        if not out.parent.exists():
            raise ReleaseError(f"{args.out}: no such folder {out.parent}")
        summary = write_release(out)
    except (UsageError, ReleaseError) as exc:
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
