"""A real browser: JupyterLab + Debian's Chromium driven by Playwright run lab 01's panel (issue 6).

The solution notebook is copied into a temporary root (so JupyterLab's autosave cannot touch the
repository), JupyterLab serves it on a loopback port with no token, Chromium runs every cell, and
the test moves the S_max slider with the keyboard.  It asserts that the plotly graph changed, that
the readout changed to the ledger's numbers for the new S_max, and that no widget error ("model not
found", "Error displaying widget") appeared.  A screenshot is saved under the test's tmp dir.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labsupport import ledger
from labsupport.specs import LECTURE_7B, LECTURE_GPU

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-quic"]
NOTEBOOK = "01_five_jobs.ipynb"
WIDGET_ERRORS = ("model not found", "Error displaying widget", "Error rendering")

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer {url} within {seconds} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def jupyterlab(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package (`apt-get install -y chromium`); "
                    "Playwright's own browser download does not work here")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    served = tmp_path / "root"
    (served / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / NOTEBOOK, served / "solutions" / NOTEBOOK)
    config = tmp_path / "config"
    (config / "labconfig").mkdir(parents=True)
    # No news/update toasts over the notebook; the machine has no network to fetch them anyway.
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    port = _free_port()
    log = tmp_path / "jupyterlab.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--ServerApp.token=",
             "--ServerApp.password=", "--ServerApp.allow_root=True", f"--ServerApp.root_dir={served}",
             "--ServerApp.disable_check_xsrf=True"],
            cwd=served, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status", proc, log)
        yield f"http://127.0.0.1:{port}", tmp_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _figure_state(page) -> str:
    return page.evaluate("""() => {
        const plot = document.querySelector('.lab-panel .js-plotly-plot');
        return plot && plot.data ? JSON.stringify(plot.data.map(t => [t.x, t.y])) : null;
    }""")


def _readout(page) -> str:
    return page.evaluate("""() => {
        const parts = document.querySelectorAll('.lab-panel .widget-html-content');
        return parts.length ? parts[parts.length - 1].innerText : null;
    }""")


def test_lab01_panel_in_real_chromium(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, tmp_path = jupyterlab
    console: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda msg: console.append(msg.text))
            page.goto(f"{base}/lab/tree/solutions/{NOTEBOOK}", wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            # The notebook's cells are loaded and its kernel is up (the status bar says so).
            page.wait_for_function("() => document.querySelectorAll('.jp-Notebook .jp-Cell').length > 10"
                                   " && document.body.innerText.includes('(ipykernel) | Idle')", timeout=120_000)

            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

            slider = page.locator(".lab-panel .widget-slider .noUi-handle").first
            slider.wait_for(state="visible", timeout=180_000)
            page.wait_for_function("() => { const p = document.querySelector('.lab-panel .js-plotly-plot');"
                                   " return p && p.data && p.data.length > 0; }", timeout=120_000)
            page.locator(".lab-panel").first.scroll_into_view_if_needed()
            before_figure, before_text = _figure_state(page), _readout(page)
            assert "memory permits B = 29" in before_text, before_text

            slider.focus()
            page.keyboard.press("ArrowRight")  # S_max 4,096 -> 8,192
            page.wait_for_function(
                "(old) => { const p = document.querySelectorAll('.lab-panel .widget-html-content');"
                " return p.length && p[p.length - 1].innerText !== old; }", arg=before_text, timeout=60_000)
            page.wait_for_function(
                "(old) => { const p = document.querySelector('.lab-panel .js-plotly-plot');"
                " return p && JSON.stringify(p.data.map(t => [t.x, t.y])) !== old; }",
                arg=before_figure, timeout=60_000)
            after_figure, after_text = _figure_state(page), _readout(page)
            page.locator(".lab-panel .js-plotly-plot").first.scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / "lab01_panel.png"), full_page=False)
            body = page.inner_text("body")
        finally:
            browser.close()

    assert after_figure != before_figure
    budget = ledger.kv_budget_bytes(LECTURE_7B, LECTURE_GPU)
    expected = ledger.naive_concurrency(budget, 8192, LECTURE_7B.kv_bytes_per_token)
    assert expected == 14  # 62.52e9 // (8,192 x 524,288 B = 4.295e9 B), by hand
    assert f"memory permits B = {expected}:" in after_text, after_text
    (names, heights), = json.loads(after_figure)  # one bar trace: [x, y]
    assert heights == [pytest.approx(989e12 / 3350e9), expected], after_figure
    assert json.loads(before_figure)[0][1] == [pytest.approx(989e12 / 3350e9), 29], before_figure
    for needle in WIDGET_ERRORS:
        assert needle not in body, f"widget error on the page: {needle!r}"
        assert not [m for m in console if needle in m], f"widget error in the console: {needle!r}"
    assert (tmp_path / "lab01_panel.png").stat().st_size > 10_000
