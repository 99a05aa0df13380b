"""`python -m labsupport release OUT`: what an instructor hands students (every lab).

The release holds the package, the student notebooks (notebooks/NN_topic.ipynb, solution regions
already cut), the README with the guides it links to that concern students (the ledger, grading),
pyproject/environment files and the data the loaders need (the tiny
model; traces are fetched or replaced by a labelled synthetic stand-in, as in the repository).
It leaves out everything that answers an exercise or grades one:

  * solutions/ (the lab sources and the executed instructor copies) and the instructors' board;
  * labsupport/course/checkoffs (the graders: expected values and hidden-input generators), and
    the staff tooling around them (build, grade, the worker, release, autograder);
  * the labs' tests.

check() keeps working in the release: for each lab the release writes a sealed record
(labsupport.course.formative) of what the lab's own checkoff cases expect, made by running the
graders against the reference solutions here, and checks that every reference still passes its
record.  Nothing of the hidden inputs goes into it.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course import answers as A
from labsupport.course import codec, formative
from labsupport.course.checkoff import Checkoff, RemoteAnswer, case_rng, load_lab

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "labsupport"
# staff-only parts of the package (paths relative to labsupport/)
STAFF_ONLY = ("course/checkoffs", "course/build.py", "course/grade.py", "course/answers.py", "course/worker.py",
              "course/worker_process.py", "course/strip.py",
              "course/sandbox.py", "course/release.py", "course/autograder.py", "bench/notebooks.py")
STAFF_COMMANDS = ("build", "grade", "release", "autograder")
TOP_FILES = ("pyproject.toml", "environment.yml", "Makefile", ".gitignore")
# the README's companions students read; INSTRUCTORS.md (the board, solutions/) stays with the staff
STUDENT_GUIDES = ("LEDGER.md", "GRADING.md")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
TRACE_SUFFIXES = (".csv", ".jsonl", ".json.gz", ".csv.gz", ".part")  # .part: a trace download not finished


class ReleaseError(Exception):
    """The release cannot be made as asked; the message is one line."""


# --- recording the lab's own cases against the reference solution -------------------------------------------

class _Recorder(RemoteAnswer):
    """The reference solution, called by a judge as a student's function would be; every call is recorded."""

    def __init__(self, fn, source: str):
        self.fn, self.source = fn, source
        target = getattr(fn, "fn", fn)
        self.name = getattr(target, "__name__", "function")
        self.info = {"callable": True, "triton_jit": callable(getattr(fn, "fn", None))}
        self.calls: list[dict] = []

    def _mark(self, values, fed: list):
        def wrap(v):
            if callable(v) and not isinstance(v, type) and not hasattr(v, "dtype"):
                def recorded(*a, _v=v, **k):
                    result = _v(*a, **k)
                    fed.append(codec.to_plain(result, objects=True))
                    return result
                return recorded, codec.Callback(len(fed))
            return v, v
        pairs = {k: wrap(v) for k, v in values.items()} if isinstance(values, dict) else [wrap(v) for v in values]
        if isinstance(values, dict):
            return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def remote_call(self, args, kwargs):
        fed: list = []
        live_args, shown_args = self._mark(args, fed)
        live_kwargs, shown_kwargs = self._mark(kwargs, fed)
        record = {"args": codec.to_plain(shown_args, objects=True), "kwargs": codec.to_plain(shown_kwargs, objects=True)}
        result = self.fn(*live_args, **live_kwargs)
        record["result"] = codec.to_plain(result)
        record["after"] = {str(i): codec.to_plain(a, objects=True) for i, a in enumerate(live_args)
                           if _mutable(a) and codec.to_plain(a, objects=True) != record["args"][i]}
        record["callbacks"] = fed
        self.calls.append(record)
        return result

    def remote_call_with(self, target, answer_kw, args, kwargs):
        record = {"target": f"{target.__module__}:{target.__qualname__}", "answer_kw": answer_kw,
                  "args": codec.to_plain(list(args), objects=True), "kwargs": codec.to_plain(dict(kwargs), objects=True)}
        result = target(*args, **{answer_kw: self.fn}, **kwargs)
        record["result"] = codec.to_plain(result)
        record["after"], record["callbacks"] = {}, []
        self.calls.append(record)
        return result


def _mutable(value) -> bool:
    return isinstance(value, (list, dict)) or hasattr(value, "dtype") and hasattr(value, "shape")


def _load_program(prog: A.Program, folder: Path, stem: str):
    """Run a reference answer's program (our own solution code) in a module of its own; return __answer__."""
    path = folder / f"{stem}.py"
    path.write_text(prog.source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"labsupport_reference_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.__answer__


def formative_record(lab: int, solution: Path, scratch: Path) -> dict:
    """The sealed record of one lab (see labsupport.course.formative)."""
    nb = A.read(solution)
    entries = []
    for checkoff in load_lab(lab):
        prepared = checkoff.prepare(case_rng(checkoff.id))
        payload = _payload(checkoff, prepared, nb, scratch)
        entries.append({"id": checkoff.id, "title": checkoff.title, "hint": checkoff.hint, "kind": checkoff.kind,
                        "sealed": formative.seal(payload, lab)})
    return {"lab": lab, "checkoffs": entries}


def _payload(checkoff: Checkoff, prepared, nb: A.Notebook, scratch: Path) -> dict:
    spec = checkoff.formative
    stem = checkoff.id.replace(".", "_")
    if checkoff.kind == "choice":
        answer = prepared if isinstance(prepared, str) else sorted(prepared)
        return {"answer": answer, "options": spec["options"], "mistakes": spec["mistakes"]}
    calls = nb.calls.get(checkoff.id)
    if checkoff.kind == "value" and "rel_tol" in spec and "per_key" not in spec and "unordered" not in spec:
        return {"expected": prepared, **{k: spec[k] for k in ("rel_tol", "abs_tol", "unit", "mistakes")}}
    if not calls:
        raise ReleaseError(f"checkoff {checkoff.id}: the solution notebook has no check() call for it")
    prog = A.program(nb, calls[-1])
    if checkoff.kind == "value":
        answer = _load_program(prog, scratch, stem)
        checkoff.verdict(answer, prepared)  # the reference answer passes its own grader
        payload = {"answer": codec.to_plain(answer), "spec": spec}
        formative.compare_answer(codec.from_plain(payload["answer"]), codec.from_plain(payload["answer"]), spec)
        return payload
    if "open" in spec:
        return {"open": spec["open"]}
    recorder = _Recorder(_load_program(prog, scratch, stem), prog.function_source())
    checkoff.verdict(recorder, prepared)
    payload = {"calls": recorder.calls, "rel_tol": spec.get("rel_tol", 1e-6), "abs_tol": spec.get("abs_tol", 1e-9)}
    sealed = formative.unseal(formative.seal(payload, checkoff.lab), checkoff.lab)
    for record in sealed["calls"]:  # the reference passes its own record, read back as check() will read it
        formative.replay(recorder.fn, record, sealed["rel_tol"], sealed["abs_tol"])
    return payload


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
            text = _drop_lines(text, r'^\s*"notebooks"\s*:\s*"labsupport\.bench\.notebooks:.*\n|^\s*notebooks\s+each solution.*\n')
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


def write_release(out: Path, progress: bool = True) -> dict:
    """Write the release into `out` (which must not exist, or be empty); returns a summary."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} exists and is not an empty folder")
    solutions = {int(p.name[:2]): p for p in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))}
    notebooks = _student_notebooks()
    if not notebooks:
        raise ReleaseError(f"no student notebooks in {ROOT / 'notebooks'}; run `python -m labsupport build` first")
    staging = Path(tempfile.mkdtemp(prefix=".release-", dir=out.parent if out.parent.exists() else None))
    try:
        _copy_package(staging)
        records = staging / "labsupport" / "course" / "formative"
        records.mkdir(parents=True, exist_ok=True)
        scratch = staging / ".scratch"
        scratch.mkdir()
        sys.path.insert(0, str(scratch))
        labs = [int(p.name[:2]) for p in notebooks]
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(labs), desc="release", unit="lab", file=sys.stderr)
        try:
            for lab in labs:
                if not load_lab(lab):
                    continue
                if lab not in solutions:
                    raise ReleaseError(f"lab {lab:02d} has no executed solution notebook in solutions/")
                record = formative_record(lab, solutions[lab], scratch)
                (records / f"lab{lab:02d}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
                if bar is not None:
                    bar.update(1)
        finally:
            sys.path.remove(str(scratch))
            if bar is not None:
                bar.close()
        shutil.rmtree(scratch)
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
                shutil.copyfile(ROOT / name, staging / name)
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
    except (ReleaseError, A.NotebookError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"release: {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"release: wrote {out} ({len(summary['notebooks'])} notebooks, sealed checkoff records for labs "
          f"{', '.join(f'{n:02d}' for n in summary['labs'])})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

