"""What every browser test starts: a JupyterLab or a Voila on a loopback port, and one headless Chromium.

The servers run on copies of the repository's notebooks under a test's tmp dir (so autosave cannot
touch the repository), with no token, their config and runtime files in that tmp dir too; each is
stopped, killed if it must be, when its `with` block ends.  `make_flags` reads the Makefile's own
flags, so a test starts a server exactly as `make lab`, `make board` or `make present` does.

The test modules (tests/test_browser*.py) import `browser`, a module-scoped fixture, from here.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Debian's chromium by default; LABSUPPORT_CHROMIUM names another Chromium or Chrome binary.
CHROMIUM = os.environ.get("LABSUPPORT_CHROMIUM") or next(
    (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))),
    "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
WINDOW = {"width": 1280, "height": 800}  # a laptop, the labs' own size
XGA = {"width": 1024, "height": 768}  # the smallest projector the board is read on
FULL_HD = {"width": 1920, "height": 1080}
WIDGET_ERRORS = ("model not found", "Error displaying widget", "Error rendering")


def skip_without_chromium() -> None:
    """Skip the test (before any server starts) where no Chromium or no playwright can drive it."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium package (`apt-get install -y chromium`, "
                    "which `make test` does as root) or set LABSUPPORT_CHROMIUM to a Chromium or Chrome binary")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")


def screenshot_folder(tmp: Path) -> Path:
    """$LABSUPPORT_SCREENSHOTS when set (for a person to look at), else a folder in the test's tmp dir."""
    shots = Path(os.environ.get("LABSUPPORT_SCREENSHOTS") or tmp / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    return shots


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for a module's tests (each opens its own pages)."""
    skip_without_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _none_known(_event) -> bool:
    return False


def page_errors(page, known_exception=_none_known, known_message=_none_known) -> list[str]:
    """A list that collects, while the page is open, its uncaught JavaScript exceptions and its console's
    errors and widget errors, less those a test knows to be harmless (each predicate says why)."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: None if known_exception(exc) else errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
            if (msg.type == "error" or any(n in msg.text for n in WIDGET_ERRORS)) and not known_message(msg)
            else None)
    return errors


def make_flags(name: str) -> list[str]:
    """A Makefile variable's value, as `make` itself expands it."""
    out = subprocess.run(["make", "-s", "-C", str(ROOT), f"print-{name}"], capture_output=True, text=True,
                         check=True).stdout
    return shlex.split(out)


def copy_notebooks(served: Path, folders: tuple[str, ...] = ("notebooks",), ignore: tuple[str, ...] = ()) -> None:
    """The repository's `folders` copied under `served` (checkpoints and `ignore` patterns left out)."""
    for folder in folders:
        shutil.copytree(ROOT / folder, served / folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints", *ignore))


# --- the servers --------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the server did not answer {url} within {seconds} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def _serving(command, served: Path, env: dict, log: Path, ready_path: str):
    """`command(port)` run in `served` on a free port; yields its base URL once it answers `ready_path`."""
    port = _free_port()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(command(port), cwd=served, env={**os.environ, **env},
                                stdout=log_file, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(base + ready_path, proc, log)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def jupyter_lab(tmp: Path, served: Path, args=(), env: dict | None = None):
    """JupyterLab in `served`, its config, runtime, settings and workspaces under `tmp` (`env` may add to
    them), with `args` after the test's own flags; yields its base URL."""
    env = {"JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
           **(env or {})}

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--ServerApp.token=",
                "--ServerApp.password=", "--ServerApp.allow_root=True", "--ServerApp.disable_check_xsrf=True", *args]

    with _serving(command, served, env, tmp / "jupyterlab.log", "/api/status") as base:
        yield base


@contextlib.contextmanager
def serve_lab(tmp: Path, args: tuple[str, ...] = ()):
    """The labs' JupyterLab: copies of notebooks/ and solutions/ under `tmp`, every cell laid out, no
    announcements; `args` after the test's own flags.  Yields its base URL."""
    served = tmp / "root"
    copy_notebooks(served, ("notebooks", "solutions"), ignore=("*.py",))
    config, settings = tmp / "config", tmp / "settings"
    (config / "labconfig").mkdir(parents=True)
    # No news/update toasts over the notebook; the machine has no network to fetch them anyway.
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    # Attach every cell to the page, so that every output can be found and measured (JupyterLab's
    # default skips laying out cells off screen; widths are the same either way).
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))
    # the served folder, unless `args` name one (the Makefile's `--notebook-dir=.`, run from it)
    root = [] if any(a.startswith("--notebook-dir") for a in args) else [f"--ServerApp.root_dir={served}"]
    with jupyter_lab(tmp, served, (*root, *args)) as base:
        yield base


@contextlib.contextmanager
def serve_present(tmp: Path, notebook: str = "notebooks/99_board.ipynb"):
    """Voila as `make present NB=<notebook>` starts it (the Makefile's flags), on a copy of notebooks/."""
    served = tmp / "root"
    copy_notebooks(served)
    env = {"JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    flags = make_flags("PRESENT_FLAGS")

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "voila", *flags, notebook, "--no-browser", f"--port={port}",
                "--Voila.ip=127.0.0.1"]

    with _serving(command, served, env, tmp / "voila.log", "/voila/static/voila.js") as base:
        yield base
