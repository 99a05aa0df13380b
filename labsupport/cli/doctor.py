"""`python -m labsupport doctor`: can this machine run the labs, and how (lab 00; §10.3 step three).

It reports versions, whether CUDA is there, whether Triton will compile kernels or run them
through its interpreter, and how `grade` would isolate student code here, and says what to do about
each problem.  Exit code 0 when the labs can run,
1 when a problem stops them (the report says which), 2 for a bad flag.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys

from labsupport.cli.parser import OneLineParser, dumps_strict, run_command, strict_json


def _version(module: str) -> str | None:
    """The installed version, read without importing the package (jupyterlab alone takes seconds to import)."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
        return importlib.metadata.version(module)
    except Exception:  # a broken install counts as missing; the report says so
        return None


def report() -> dict:
    """Facts about this machine, plus `problems` (blocking) and `notes` (advice), as plain data."""
    import labsupport  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)

    info: dict = {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {name: _version(name) for name in
                     ("torch", "triton", "numpy", "plotly", "ipywidgets", "jupyterlab", "nbval", "jupytext")},
        "cuda": False,
        "gpu": None,
        "problems": [],
        "notes": [],
    }
    problems, notes = info["problems"], info["notes"]
    if sys.version_info < (3, 10):
        problems.append(f"Python {info['python']} is too old: install Python 3.10 or newer.")
    for name in ("torch", "numpy", "plotly", "ipywidgets", "nbval", "jupytext"):
        if info["packages"][name] is None:
            problems.append(f"{name} is not importable: run `make lab` (or `pip install -e .`) in the repo.")
    if info["packages"]["jupyterlab"] is None:
        notes.append("jupyterlab is not installed: fine for grading, but `make lab` needs it.")

    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken install: reported as missing above
        torch = None
    if torch is not None:
        info["cuda"] = bool(torch.cuda.is_available())
        if info["cuda"]:
            props = torch.cuda.get_device_properties(0)
            major, minor = props.major, props.minor
            info["gpu"] = {
                "name": props.name,
                "compute_capability": f"{major}.{minor}",
                "memory_bytes": int(props.total_memory),
                "bf16": bool(torch.cuda.is_bf16_supported()),
            }
            if major < 7 or (major == 7 and minor < 5):
                problems.append(f"GPU {props.name} (sm_{major}{minor}) is older than Triton supports (sm_75+).")
            elif major < 8:
                notes.append(f"{props.name} (sm_{major}{minor}) has no bf16: the labs use fp16 on it.")
        else:
            notes.append("No CUDA GPU: labs run on the CPU at small sizes; engine runs use the torch "
                         "reference attention; kernel cells run through Triton's interpreter.")
    info["bf16"] = bool(info["gpu"]["bf16"]) if info["gpu"] else True  # CPU tensors support bf16

    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if info["packages"]["triton"] is None:
        info["triton_mode"] = "absent"
        notes.append("Triton is not installed (it ships for Linux only): kernel calls fall back to the torch "
                     "reference with a warning. Use Linux or Colab to run the kernels themselves.")
    elif interpret:
        info["triton_mode"] = "interpreter"
        if info["cuda"]:
            notes.append("TRITON_INTERPRET is set although a GPU is present: kernels will run slowly on the "
                         "interpreter. Unset it before starting Jupyter to compile them.")
    elif info["cuda"]:
        info["triton_mode"] = "compiled"
    else:
        info["triton_mode"] = "unavailable"
        problems.append("Triton was imported before labsupport with no GPU and no TRITON_INTERPRET: restart the "
                        "kernel and `import labsupport` first (it sets TRITON_INTERPRET=1 on CPU machines).")
    # A machine fact, read here without the course's grader (the student release leaves it out, and a command
    # imports no course tooling): whether Debian's bubblewrap is installed.  `grade` itself names the isolation
    # it gets when it starts, after trying it.
    bwrap = shutil.which("bwrap")
    info["grading_isolation"] = (f"bubblewrap at {bwrap}: `python -m labsupport grade` runs each notebook in its "
                                 "sandbox (grade names the isolation it gets when it starts)" if bwrap else
                                 "no bubblewrap (apt-get install bubblewrap): `grade` would refuse untrusted notebooks")
    info["ok"] = not problems
    return info


def format_report(info: dict) -> str:
    lines = [f"Python      {info['python']} on {info['platform']}"]
    for name, ver in info["packages"].items():
        lines.append(f"{name:<11} {ver or 'MISSING'}")
    if info["gpu"]:
        g = info["gpu"]
        lines.append(f"CUDA        yes: {g['name']}, sm {g['compute_capability']}, "
                     f"{g['memory_bytes'] / 2**30:.1f} GiB, bf16 {'yes' if g['bf16'] else 'no'}")
    else:
        lines.append("CUDA        no (CPU-only mode)")
    lines.append(f"Triton      {info['triton_mode']}")
    lines.append(f"Grading     isolation: {info['grading_isolation']}")
    for p in info["problems"]:
        lines.append(f"PROBLEM     {p}")
    for n in info["notes"]:
        lines.append(f"note        {n}")
    lines.append("OK: the labs can run here." if info["ok"] else "NOT OK: fix the problems above.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_command("doctor", _main, sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    parser = OneLineParser(prog="python -m labsupport doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the facts as one strict JSON object")
    args = parser.parse_args(argv)
    info = report()
    if args.json:
        notes = info["notes"]
        print(dumps_strict(strict_json(info, notes), indent=1))
    else:
        print(format_report(info))
    return 0 if info["ok"] else 1
