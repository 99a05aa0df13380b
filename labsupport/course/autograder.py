"""`python -m labsupport autograder OUT.zip [--lab NN]`: the Gradescope autograder bundle (every lab).

Gradescope builds an image from the bundle (the two scripts, the package with its graders, the data) once
(``setup.sh``, as root) and runs ``run_autograder`` in one container per submission
(https://gradescope-autograders.readthedocs.io, "Autograder Specifications").  That grades
``/autograder/submission`` in `grade`'s container mode (GRADING.md) into ``/autograder/results/results.json``,
one test per checkoff, and always leaves that file behind (``AUTOGRADER_ROOT``, ``LABSUPPORT_PYTHON``: for tests).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import stat
import sys
import time
import zipfile
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.course import grade as G
from labsupport.course import report
from labsupport.course.checkoffs import load_lab
from labsupport.course.report import NOT_ATTEMPTED, CheckoffResult, NotebookGrade
from labsupport.course.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "labsupport"

SETUP = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder image.
set -euo pipefail
cd /autograder/source
if ! command -v python3 >/dev/null; then
  apt-get install -y python3 python3-pip python3-venv
fi
python3 -m pip install --upgrade pip
# the CPU build of torch: a plain `torch` requirement would pull several GB of CUDA wheels
python3 -m pip install --index-url https://download.pytorch.org/whl/cpu {torch_requirement}
python3 -m pip install -e /autograder/source
# util-linux's setpriv and prlimit run the notebook as an unprivileged user, bounded (container mode)
command -v setpriv >/dev/null && command -v prlimit >/dev/null \
  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq util-linux)
python3 -m labsupport doctor || true
"""

RUN = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission; it must always leave results/results.json behind.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{LABSUPPORT_PYTHON:-python3}}"
export PYTHONPATH="$ROOT/source${{PYTHONPATH:+:$PYTHONPATH}}"
mkdir -p "$ROOT/results"
cd "$ROOT/source"
"$PYTHON" -m labsupport.course.autograder --run "$ROOT" {lab_flag}--timeout {timeout}
"""


def _files(traces: bool) -> list[tuple[Path, str]]:
    """(file, its name in the bundle): the package, pyproject and README, the data (with the traces found here)."""
    def tree(folder: Path, prefix: str) -> list[tuple[Path, str]]:
        return [(p, prefix + p.relative_to(folder).as_posix()) for p in sorted(folder.rglob("*")) if p.is_file()
                and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo", ".part")
                and p.stat().st_size < 64 * 2**20]

    files = tree(PACKAGE, "labsupport/")
    files += [(ROOT / n, n) for n in ("pyproject.toml", "README.md", "course.toml") if (ROOT / n).is_file()]
    files += tree(ROOT / "data", "data/") if (ROOT / "data").is_dir() else []
    if traces:
        from labsupport.workloads import TRACES, find_trace

        have = {arc for _, arc in files}
        files += [(find_trace(name), f"data/{info.filename}") for name, info in TRACES.items()
                  if find_trace(name) is not None and f"data/{info.filename}" not in have]
    return files


def torch_requirement() -> str:
    try:
        return f"torch=={importlib.metadata.version('torch').split('+')[0]}"
    except importlib.metadata.PackageNotFoundError:
        return "torch"


def build_bundle(out: Path, lab: int | None = None, timeout: int = 300, traces: bool = True,
                 torch_req: str | None = None) -> list[str]:
    """Write the bundle; returns the names inside it."""
    lab_flag = f"--lab {lab:02d} " if lab is not None else ""
    scripts = {"setup.sh": SETUP.format(torch_requirement=torch_req or torch_requirement()),
               "run_autograder": RUN.format(lab_flag=lab_flag, timeout=timeout)}
    files = _files(traces)
    with report.into_place(out) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, text in scripts.items():  # executable: Gradescope runs them
            info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
            info.external_attr = (0o755 | stat.S_IFREG) << 16
            zf.writestr(info, text, zipfile.ZIP_DEFLATED)
        for path, arc in files:
            zf.write(path, arc)
    return [*scripts, *(arc for _, arc in files)]


def run(root: Path, lab: int | None = None, timeout: int = 300, mode: str = "container") -> dict:
    """Grade ``root/submission`` into ``root/results/results.json``; whatever happens, a results.json is written."""
    start = time.time()
    try:
        submission = root / "submission"
        notebooks = G.notebooks_in(submission) if submission.is_dir() else []
        sandbox = Sandbox.for_this_machine(container=mode == "container", trusted=mode == "trusted")
        print(f"grade: isolation: {sandbox.describe()}", file=sys.stderr)
        grader = G.Grader(sandbox, timeout=timeout)
        submissions = [G.Submission(p, "submission", G.refusal(p, submission)) for p in notebooks]
        if mode == "container":
            G.prepare_then_forget(grader, submissions)
        grades = G.grade_all(grader, submissions, jobs=1, progress=False, lab=lab)
        if lab is not None:
            grades = _for_lab(grades, lab)
        data = report.gradescope(grades)
    except BaseException as exc:  # noqa: BLE001 - Gradescope needs a results.json whatever went wrong
        # a grader fault is never a student's 0: no score is posted (Gradescope shows the failure, staff regrade)
        data = {"output": f"REGRADE — the autograder failed: {type(exc).__name__}: {report.safe(exc)}. Nothing was "
                          "scored; please tell the course staff.", "tests": []}  # safe: a file name's bytes
        if isinstance(exc, KeyboardInterrupt):
            raise
    data["execution_time"] = round(time.time() - start, 1)
    report.write_into_place(root / "results" / "results.json", report.dump(data))  # its folder made if need be
    for test in data.get("tests", []):
        score = f"{test['score']:.0f}/{test['max_score']:.0f}" if "score" in test else "REGRADE"  # a grader fault
        print(f"{score}  {test['name']}")
    return data


def _for_lab(grades, lab: int):
    """The assignment's lab only.  When no gradable notebook of it was handed in, every checkoff is
    there, not attempted, with the reason (Gradescope shows the same tests to everyone)."""
    ours = [g for g in grades if g.lab == lab and not g.not_graded]
    if ours and ours[0].checkoffs:
        return grades  # the one that counts, and the others named as not graded
    if ours:
        why = f"{Path(ours[0].path).name}: {ours[0].error}"
    else:
        why = f"no notebook of lab {lab:02d} (NN_topic.ipynb) was found in the submission" + (
            f"; found: {', '.join(Path(g.path).name + (f' ({g.not_graded})' if g.not_graded else '') for g in grades)}"
            if grades else "")
    empty = NotebookGrade(f"lab {lab:02d}", lab, "submission", error=why)
    empty.checkoffs = [CheckoffResult(c.id, c.title, NOT_ATTEMPTED, why) for c in load_lab(lab)]
    return [empty]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m labsupport autograder",
                      description="Build the Gradescope autograder bundle (setup.sh, run_autograder, the package).")
    p.add_argument("out", nargs="?", help="the .zip to write")
    p.add_argument("--lab", type=G.whole_number(0, 99, "wants a lab number 0-99"),
                   help="grade only this lab's notebook (an assignment per lab)")
    p.add_argument("--timeout", type=G.positive_int, default=300, help="seconds one run of a notebook may take")
    p.add_argument("--no-traces", action="store_true",
                   help="leave the real traces out (the labs fall back to synthetic)")
    p.add_argument("--torch", metavar="REQUIREMENT",
                   help="the torch requirement setup.sh installs (default: this torch)")
    p.add_argument("--run", metavar="ROOT", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("container", "bubblewrap", "trusted"), default="container",
                   help=argparse.SUPPRESS)
    try:
        args = p.parse_args(argv)
    except UsageError as exc:
        return G.usage_error("autograder", str(exc))
    if args.run:
        if args.out:
            return G.usage_error("autograder", "--run takes no output file")
        run(Path(args.run), args.lab, args.timeout, args.mode)
        return 0
    if not args.out:
        return G.usage_error("autograder",
                             "give the .zip to write, e.g. python -m labsupport autograder autograder.zip")
    out = Path(args.out)
    if out.suffix != ".zip":
        return G.usage_error("autograder", f"{args.out}: the bundle is a .zip file")
    if G.unwritable(out):
        return G.usage_error("autograder", f"{args.out}: cannot write a file there")
    if args.lab is not None and not load_lab(args.lab):
        return G.usage_error("autograder", f"--lab {args.lab:02d}: that lab has no checkoffs")
    names = build_bundle(out, args.lab, args.timeout, traces=not args.no_traces, torch_req=args.torch)
    print(f"autograder: wrote {out} ({len(names)} files; upload it as the assignment's autograder)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
