"""The pages an instructor gets (issue 21): where `make lab` lands, and a lab in present mode, in Debian's
Chromium.  The board (`make board`, `make present`: issue 28) is tests/test_browser_board.py's.

* `make lab`: JupyterLab started with the Makefile's own flags (read with `make -s print-LAB_FLAGS`,
  so the test cannot drift from the Makefile) lands in notebooks/.
* Present mode (`make present NB=notebooks/06_engine_loop.ipynb`): the lab served without code, every
  chart drawn, no widget or JavaScript error, every panel's first slider moves its figure.

The servers and the Chromium come from tests/browser_support.py, the panel checks from
tests/test_browser.py.  Screenshots go to the test's tmp dir, or to $LABSUPPORT_SCREENSHOTS.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from browser_support import (  # noqa: F401  (browser is a fixture)
    WIDGET_ERRORS,
    WINDOW,
    browser,
    make_flags,
    page_errors,
    screenshot_folder,
    serve_lab,
    serve_present,
    skip_without_chromium,
)
from test_browser import _PANELS, _move_first_slider

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


def _default_url(flags: list[str]) -> str:
    (url,) = [f.split("=", 1)[1] for f in flags if f.startswith("--LabApp.default_url=")]
    return url


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """The screenshot folder; each test here starts its own server (`make board`'s is tests/test_browser_board.py's)."""
    skip_without_chromium()
    return screenshot_folder(tmp_path_factory.mktemp("present"))


# --- landing pages ---------------------------------------------------------------------------------

_CURRENT_FOLDER = "() => (document.querySelector('.jp-FileBrowser .jp-BreadCrumbs') || {}).innerText || ''"
_LISTED = "() => [...document.querySelectorAll('.jp-FileBrowser .jp-DirListing-itemText')].map(e => e.innerText)"


def test_make_lab_lands_in_notebooks(browser, tmp_path):
    flags = make_flags("LAB_FLAGS")
    assert _default_url(flags) == "/lab/tree/notebooks"
    with serve_lab(tmp_path, tuple(flags)) as base:
        page = browser.new_page(viewport=WINDOW)
        try:
            page.goto(f"{base}/", wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_function(f"() => ({_LISTED})().includes('01_five_jobs.ipynb')", timeout=90_000, polling=100)
            assert page.url == f"{base}/lab/tree/notebooks", page.url
            assert "notebooks" in page.evaluate(_CURRENT_FOLDER)
            assert "99_board.ipynb" in page.evaluate(_LISTED) and "solutions" not in page.evaluate(_LISTED)
        finally:
            page.close()


# --- present mode -------------------------------------------------------------------------------------

# the board's present mode (one segment at a time, by keyboard) is tests/test_browser_board.py's
PRESENTED = ["notebooks/06_engine_loop.ipynb"]
# Voila's page template asks a CDN for Font Awesome; this machine has no network (a room does).
OFFLINE_ONLY = ("https://cdn.jsdelivr.net/",)


def _known_voila_error(exc) -> bool:
    """plotly's JupyterLab renderer, having drawn a static figure (`fig.show()`), stores a PNG of it
    in the notebook through `model.setData`, which Voila's read-only output models lack: the figure
    is drawn (the test checks it), only its PNG copy for a saved notebook is not kept."""
    return "setData is not a function" in str(exc) and "/labextensions/jupyterlab-plotly/" in (exc.stack or "")


# Voila runs the cells one by one: under load a pause between two can outlast a poll, so "settled" also
# wants every panel already holding a chart (a panel that never gets one is reported after the wait).
_CHARTS_SETTLED = """() => {
    const plots = [...document.querySelectorAll('.js-plotly-plot')];
    const panels = [...document.querySelectorAll('.lab-panel')];
    const full = panels.length > 0 && panels.every(p => p.querySelector('.js-plotly-plot'));
    const now = plots.length + ':' + panels.length + ':'
        + (full && plots.every(p => !!(p._fullLayout && p.querySelector('.main-svg') && p.data)));
    const settled = now === window.__labCharts && plots.length > 0 && now.endsWith('true');
    window.__labCharts = now;
    return settled;
}"""
_CODE_SHOWN = "() => document.querySelectorAll('.jp-CodeCell .jp-InputArea, .cm-editor, .jp-InputArea-editor').length"


@pytest.mark.parametrize("notebook", PRESENTED, ids=lambda n: Path(n).stem)
def test_present_mode(shots, browser, tmp_path, notebook):
    started = time.perf_counter()
    with serve_present(tmp_path, notebook) as base:
        page = browser.new_page(viewport=WINDOW)
        errors = page_errors(page, known_exception=_known_voila_error,
                             known_message=lambda msg: (msg.location or {}).get("url", "").startswith(OFFLINE_ONLY))
        try:
            page.goto(f"{base}/", wait_until="domcontentloaded", timeout=300_000)
            # every chart drawn: their number stops growing (polled 3 s apart) and each has its SVG
            try:
                page.wait_for_function(_CHARTS_SETTLED, timeout=300_000, polling=3_000)
            except Exception:  # noqa: BLE001 - playwright's TimeoutError: what is missing is named below, panel by panel
                pass
            loaded = time.perf_counter() - started
            panels = page.evaluate(_PANELS.replace(".jp-Notebook ", ""))
            problems = [f"panel {p['title']!r} has {p['plots']} plotly charts" for p in panels if p["plots"] != 1]
            if not panels:
                problems.append("no panel on the page")
            if page.evaluate(_CODE_SHOWN):
                problems.append(f"{page.evaluate(_CODE_SHOWN)} code cells on screen")
            shown = page.inner_text("body")
            problems += [f"{needle!r} on the page" for needle in WIDGET_ERRORS if needle in shown]
            page.locator(".lab-panel").first.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)
            page.screenshot(path=str(shots / f"present_{Path(notebook).stem}.png"))  # its first panel
            for index, panel in enumerate(panels):
                if panel["sliders"]:
                    why = _move_first_slider(page, index, scope="body")
                    if why:
                        problems.append(f"panel {panel['title']!r}: moving its first slider: {why}")
            charts = page.locator(".js-plotly-plot").count()
            print(f"present {notebook}: drawn {loaded:.0f} s after start, {len(panels)} panels, {charts} charts, "
                  f"done {time.perf_counter() - started:.0f} s")
        finally:
            page.close()
    assert not problems, f"{notebook}:\n" + "\n".join(problems)
    assert not errors, f"{notebook}: JavaScript errors:\n" + "\n".join(errors[:20])
