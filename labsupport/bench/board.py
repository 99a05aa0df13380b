"""`python -m labsupport bench board`: the board's two start-up times, beside what INSTRUCTORS.md promises.

* Run All of notebooks/99_board.ipynb in a fresh kernel, as `make board` runs it (every cell, the first segment
  drawn by the last): promised about 6–11 s on an idle 2-core machine;
* present mode: `make present`'s Voilà, with the Makefile's own flags, from the request to the last byte of the
  page (Voilà runs every cell before it sends the board; the browser then draws it within about a second):
  promised about 8 s on an idle machine, 9–16 s on a 2-core machine shared with other work.

Run it on a quiet machine: both figures are wall-clock times.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat

from labsupport.checks import shown
from labsupport.cli.parser import UsageError
from labsupport.course.build import execute
from labsupport.workloads import REPO_ROOT

BOARD = REPO_ROOT / "notebooks" / "99_board.ipynb"
PROMISED = {"Run All": "about 6–11 s", "present mode": "about 8 s idle, 9–16 s on a loaded 2-core machine"}
PRESENT_FLAGS = ("--strip_sources=True", "--VoilaConfiguration.extension_denylist=jupyterlab-jupytext")  # Makefile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_all_seconds() -> float:
    nb = nbformat.read(BOARD, as_version=4)
    start = time.perf_counter()
    execute(nb, BOARD.parent, progress=False, allow_errors=False, label=BOARD.name)
    return time.perf_counter() - start


def present_seconds(timeout: float = 300.0) -> float:
    """From the request for the board's page to its last byte, on a Voilà started as `make present` starts it."""
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "notebooks"
        shutil.copytree(BOARD.parent, served, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "voila", *PRESENT_FLAGS, "99_board.ipynb", "--no-browser",
                                 f"--port={port}", "--Voila.ip=127.0.0.1"], cwd=served,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:  # the server is up (its own static file answers), so the page time is the board's alone
                try:
                    urllib.request.urlopen(f"{base}/voila/static/voila.js", timeout=5).read()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise UsageError("voila did not start: is voila installed (make install)?") from None
                    time.sleep(0.2)
            start = time.perf_counter()
            page = urllib.request.urlopen(f"{base}/", timeout=timeout).read().decode("utf-8", "replace")
            seconds = time.perf_counter() - start
            if "widget-view+json" not in page:
                raise UsageError("voila served a page without the board's widget in it")
            return seconds
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def bench(argv: list[str] | None = None) -> int:
    if argv:
        raise UsageError(f"unrecognized argument {shown(argv[0])}: bench board takes no arguments")
    print(f"board Run All (fresh kernel): {run_all_seconds():.1f} s  (INSTRUCTORS.md: {PROMISED['Run All']})",
          flush=True)
    print(f"present mode, request to the whole page: {present_seconds():.1f} s  "
          f"(INSTRUCTORS.md: {PROMISED['present mode']}; the browser then draws it)")
    return 0
