"""`python -m labsupport traces`: fetch the real public traces the labs use (§10.2–§10.5).

    python -m labsupport traces                    # every trace not already present
    python -m labsupport traces azure-conv         # only the ones named
    python -m labsupport traces --list             # which are present where, which are missing

Each file comes from its published address (`labsupport.workloads.TRACES`: the Azure and Mooncake
repositories on GitHub) into $LABSUPPORT_DATA, or the repository's data/ when that is unset.  The
transfer is resumable and verified (`labsupport.fetch`): it shows a progress bar on a terminal, a
stopped download is continued by running the command again, and a file appears under its final
name only once its sha256 matches.  A trace already present in any searched folder with the right
sha256 is not fetched again.  Any failure is one line on stderr and exit code 2; $LABSUPPORT_OFFLINE
refuses every download.  Without the traces the labs run on labelled synthetic stand-ins.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError, one_line, run_command

PROG = "traces"
TRACE_NAMES = {  # command-line name (simulate, bench) -> labsupport.workloads trace name
    "azure-conv": "azure-conv",
    "azure-code": "azure-code",
    "mooncake-conv": "mooncake-conversation",
    "mooncake-synthetic": "mooncake-synthetic",
}



def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m labsupport traces",
                      description="Fetch the public traces the labs use into $LABSUPPORT_DATA or data/ "
                                  "(sha256-verified, resumable).")
    p.add_argument("names", nargs="*", metavar="NAME", help="traces to fetch or list (default: all of them)")
    p.add_argument("--list", action="store_true", help="say which traces are present where; fetch nothing")
    return p


def locate(info) -> tuple[str, Path] | None:
    """(label, file) of the first searched folder holding the trace, whether or not the labs are
    told to hide it ($LABSUPPORT_HIDE_TRACES hides what is there; it does not remove it)."""
    from labsupport.workloads import trace_search_dirs

    for label, folder in trace_search_dirs():
        for name in (info.filename, info.upstream_name):
            if (folder / name).is_file():
                return label, folder / name
    return None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _selected(names: list[str]):
    from labsupport import workloads

    unknown = [n for n in names if n not in workloads.TRACES]
    if unknown:
        raise UsageError(f"unknown trace {unknown[0]!r}; choose from: {', '.join(workloads.TRACES)}")
    return [workloads.TRACES[n] for n in dict.fromkeys(names or workloads.TRACES)]


def list_traces(infos) -> int:
    from labsupport import fetch, workloads

    missing = []
    width = max(len(i.name) for i in infos)
    for info in infos:
        found = locate(info)
        if found is None:
            missing.append(info.name)
            part = fetch.partial_path(workloads.data_dir() / info.filename)
            kept = f"; {_size(part.stat().st_size)} of it already fetched" if part.is_file() else ""
            print(f"{info.name:<{width}}  missing  ({_size(info.size_bytes)} from {info.url}{kept})")
            continue
        label, path = found
        ok = fetch.sha256_of(path) == info.sha256
        print(f"{info.name:<{width}}  present  {path} (in {label}; "
              f"{'sha256 ok' if ok else 'sha256 DIFFERS from the published file'})")
    if workloads.traces_hidden():
        print(f"${workloads.HIDE_TRACES_ENV} is set: the labs use none of these and run on synthetic stand-ins")
    if missing:
        names = "" if len(missing) == len(infos) == len(workloads.TRACES) else " " + " ".join(missing)
        print(f"{len(infos) - len(missing)} of {len(infos)} present; without the others the labs use labelled "
              f"synthetic stand-ins; fetch them with: {workloads.FETCH_COMMAND}{names}")
    else:
        print(f"all {len(infos)} present")
    return 0


def fetch_traces(infos) -> int:
    from labsupport import fetch, workloads

    dest_dir = workloads.data_dir()
    for info in infos:
        found = locate(info)
        if found is not None:
            _, path = found
            if fetch.sha256_of(path) == info.sha256:
                print(f"{info.name}: already present at {path} (sha256 ok)")
                continue
            if path.parent.resolve() == dest_dir.resolve():
                raise ValueError(f"{path} is not the published {info.name} file (its sha256 differs); move it "
                                 f"away and run the command again")
        if os.environ.get("LABSUPPORT_OFFLINE"):
            raise ValueError(f"LABSUPPORT_OFFLINE is set, so {info.name} is not downloaded (unset it to fetch "
                             f"{info.url})")
        path = fetch.fetch(info.url, dest_dir / info.filename, info.sha256, info.size_bytes, label=info.name)
        print(f"{info.name}: fetched {_size(info.size_bytes)} from {info.url} to {path} (sha256 verified)",
              flush=True)
    if workloads.traces_hidden():
        print(f"note: ${workloads.HIDE_TRACES_ENV} is set, so the labs still use synthetic stand-ins")
    return 0


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    infos = _selected(args.names)
    return list_traces(infos) if args.list else fetch_traces(infos)


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, _main, sys.argv[1:] if argv is None else argv)


def load_trace_reporting(trace: str, path=None, limit: int | None = None, skip_malformed: bool = False,
                         prog: str = "simulate"):
    """`workloads.load_trace` by command-line name, each of its notices (a stand-in, skipped rows) one line on stderr."""
    from labsupport import workloads

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = workloads.load_trace(TRACE_NAMES[trace], path, limit=limit, skip_malformed=skip_malformed)
    for wmsg in caught:
        print(f"{prog}: {one_line(wmsg.message, limit=4000)}", file=sys.stderr)  # up to five rows, each named
    return w
