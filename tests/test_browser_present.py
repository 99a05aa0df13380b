"""The pages an instructor gets (issue 21): where `make lab` and `make board` land, the board on a
projector, and present mode, in Debian's Chromium.

* `make lab` / `make board`: JupyterLab started with the Makefile's own flags (read with
  `make -s print-LAB_FLAGS`, so the test cannot drift from the Makefile) lands in notebooks/, or on
  the board with the file browser open.
* The board, Run All once, at 1024 × 768 (a projector's XGA, file browser open: what `make board`
  gives), then the same page resized to 1920 × 1080: every chart fills its output area (no fixed
  700 px), nothing is clipped or needs a horizontal scrollbar, no chart text collides; at 1920 × 1080
  every piece of chart text is at least 20 px.
* Present mode (`make present`): the board served without code, every chart drawn, no widget or
  JavaScript error, every panel's first slider moves its figure.

Helpers and fixtures come from tests/test_browser.py (one Chromium; one JupyterLab for the board).
Screenshots go to the test's tmp dir, or to $LABSUPPORT_SCREENSHOTS.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_browser import (  # noqa: F401  (browser is a fixture)
    _ALL_CELLS_RAN,
    _ALL_RENDERED,
    _PANELS,
    _TEXT_COLLISIONS,
    CHROMIUM,
    ROOT,
    WIDGET_ERRORS,
    _click_run_all,
    _free_port,
    _move_first_slider,
    browser,
    serve_lab,
    serving,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]

BOARD = "notebooks/99_board.ipynb"
XGA = {"width": 1024, "height": 768}
FULL_HD = {"width": 1920, "height": 1080}
MIN_PROJECTOR_TEXT_PX = 20


def make_flags(name: str) -> list[str]:
    """A Makefile variable's value, as `make` itself expands it."""
    out = subprocess.run(["make", "-s", "-C", str(ROOT), f"print-{name}"], capture_output=True, text=True,
                         check=True).stdout
    return shlex.split(out)


def _default_url(flags: list[str]) -> str:
    (url,) = [f.split("=", 1)[1] for f in flags if f.startswith("--LabApp.default_url=")]
    return url


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab as `make board` starts it (its flags from the Makefile), and the screenshot folder."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium package or set LABSUPPORT_CHROMIUM")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    tmp = tmp_path_factory.mktemp("present")
    shots = Path(os.environ.get("LABSUPPORT_SCREENSHOTS") or tmp / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with serve_lab(tmp, tuple(make_flags("BOARD_FLAGS"))) as base:
        yield base, shots
    print(f"\npresent/projector pass: {time.perf_counter() - started:.0f} s (screenshots in {shots})")


def _errors_of(page) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
            if msg.type == "error" or any(n in msg.text for n in WIDGET_ERRORS) else None)
    return errors


# --- landing pages ---------------------------------------------------------------------------------

_CURRENT_FOLDER = "() => (document.querySelector('.jp-FileBrowser .jp-BreadCrumbs') || {}).innerText || ''"
_LISTED = "() => [...document.querySelectorAll('.jp-FileBrowser .jp-DirListing-itemText')].map(e => e.innerText)"
_CURRENT_TAB = "() => (document.querySelector('.lm-DockPanel .lm-TabBar-tab.lm-mod-current') || {}).innerText || ''"


def test_make_lab_lands_in_notebooks(browser, tmp_path):
    flags = make_flags("LAB_FLAGS")
    assert _default_url(flags) == "/lab/tree/notebooks"
    with serve_lab(tmp_path, tuple(flags)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            page.goto(f"{base}/", wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_function(f"() => ({_LISTED})().includes('01_five_jobs.ipynb')", timeout=90_000)
            assert page.url == f"{base}/lab/tree/notebooks", page.url
            assert "notebooks" in page.evaluate(_CURRENT_FOLDER)
            assert "99_board.ipynb" in page.evaluate(_LISTED) and "solutions" not in page.evaluate(_LISTED)
        finally:
            page.close()


@pytest.fixture(scope="module")
def board(jupyterlab, browser):
    """The board as `make board` opens it (its landing URL, file browser open) at 1024 × 768, Run All done."""
    base, shots = jupyterlab
    page = browser.new_page(viewport=XGA)
    errors = _errors_of(page)
    page.goto(f"{base}/", wait_until="domcontentloaded", timeout=90_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_function("() => document.body.innerText.includes('(ipykernel) | Idle')", timeout=120_000)
    landed = page.url
    clicked = _click_run_all(page)
    page.wait_for_function(_ALL_CELLS_RAN, timeout=300_000, polling=500)
    page.wait_for_function(_ALL_RENDERED, timeout=180_000)
    print(f"board: Run All {time.perf_counter() - clicked:.0f} s")
    yield page, errors, landed, shots
    page.close()


def test_make_board_lands_on_the_board(jupyterlab, board):
    base, _ = jupyterlab
    page, _, landed, _ = board
    assert landed == f"{base}{_default_url(make_flags('BOARD_FLAGS'))}" == f"{base}/lab/tree/{BOARD}", landed
    assert page.evaluate(_CURRENT_TAB).startswith("99_board.ipynb"), page.evaluate(_CURRENT_TAB)
    assert page.locator(".jp-FileBrowser").first.is_visible(), "make board leaves the file browser open"


# --- the board on a projector -----------------------------------------------------------------------

# Each output area that shows a chart, a panel or a table: its width against its content's, and each
# chart's width against the area's (a chart that fills it is within a few pixels of it).
_FIT = """() => [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
    .filter(a => a.querySelector('.js-plotly-plot, table, .lab-panel'))
    .map(a => {
        const area = a.getBoundingClientRect();
        const name = ((a.querySelector('.js-plotly-plot') || {}).layout || {}).title;
        return {name: ((name || {}).text || a.innerText || '').slice(0, 50).replace(/\\n/g, ' '),
                area: area.width, scroll: a.scrollWidth, client: a.clientWidth,
                charts: [...a.querySelectorAll('.js-plotly-plot .main-svg:first-of-type')]
                    .map(s => s.getBoundingClientRect()).map(r => ({left: r.left - area.left, right: area.right - r.right,
                                                                   width: r.width})),
                tables: [...a.querySelectorAll('table')].map(t => area.right - t.getBoundingClientRect().right)};
    })"""

# The size on screen of every piece of text a chart draws: its font size times the scale the chart is
# drawn at (hover labels are not drawn until hovered).
_CHART_TEXT = """() => [...document.querySelectorAll('.jp-Notebook .js-plotly-plot')].flatMap(p => {
    const scale = p.getBoundingClientRect().width / p.offsetWidth;
    return [...p.querySelectorAll('.main-svg text')].filter(t => (t.textContent || '').trim()
                                                             && t.getBoundingClientRect().width > 0
                                                             && !t.closest('.hoverlayer'))
        .map(t => ({chart: (((p.layout || {}).title || {}).text || '').slice(0, 40),
                    text: t.textContent.slice(0, 30), px: scale * parseFloat(getComputedStyle(t).fontSize)}));
})"""


def _fit_problems(page, size: dict) -> list[str]:
    problems = []
    for a in page.evaluate(_FIT):
        where = f"{size['width']}×{size['height']}: {a['name']!r}"
        if a["scroll"] > a["client"] + 1:
            problems.append(f"{where}: needs a scrollbar ({a['scroll']} px of content in {a['client']} px)")
        for c in a["charts"]:
            if c["right"] < -1 or c["left"] < -1:
                problems.append(f"{where}: a {c['width']:.0f} px chart runs out of its {a['area']:.0f} px area")
            elif a["area"] - c["width"] > 40:
                problems.append(f"{where}: a {c['width']:.0f} px chart leaves {a['area'] - c['width']:.0f} px "
                                f"of its {a['area']:.0f} px area empty")
        problems += [f"{where}: a table runs {-t:.0f} px past its area" for t in a["tables"] if t < -1]
    problems += [f"{size['width']}×{size['height']}: {p}" for p in page.evaluate(_TEXT_COLLISIONS)]
    return problems


def _resize(page, size: dict) -> None:
    page.set_viewport_size(size)
    # JupyterLab lays its panels out for the new window first (a frame or more later): until then every area
    # and chart still has the old width, and the wait below would hold at once, before a single chart had
    # followed (seen on CI, under load).  The main dock panel ends a tab bar's width short of the window.
    page.wait_for_function("""() => { const dock = document.getElementById('jp-main-dock-panel');
        return !dock || Math.abs(window.innerWidth - dock.getBoundingClientRect().right) < 80; }""", timeout=30_000)
    # every chart re-lays itself out: each main SVG as wide as its panel (within the fit tolerance)
    page.wait_for_function("""() => [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
        .filter(a => a.querySelector('.js-plotly-plot')).every(a => [...a.querySelectorAll('.js-plotly-plot .main-svg:first-of-type')]
            .every(s => Math.abs(a.getBoundingClientRect().width - s.getBoundingClientRect().width) <= 40))""",
                           timeout=30_000)
    page.wait_for_timeout(500)


def _screenshots(page, path) -> None:
    """The window scrolled to the board's first panels (0–6 min) and to the naive allocator's (6–16)."""
    for k, segment in enumerate(("0–6 min", "6–16 min")):
        page.locator(".jp-Notebook .jp-OutputArea-output", has_text=segment).first.evaluate(
            "e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)
        page.screenshot(path=str(path).replace(".png", f"_{k}.png"))


def test_the_board_fits_xga_and_reads_from_the_back_at_full_hd(board):
    page, errors, _, shots = board
    _resize(page, XGA)  # the charts of the last segments fit themselves after Run All ends: wait for that
    problems = _fit_problems(page, XGA)
    _screenshots(page, shots / "board_1024x768.png")
    _resize(page, FULL_HD)
    problems += _fit_problems(page, FULL_HD)
    small = [t for t in page.evaluate(_CHART_TEXT) if t["px"] < MIN_PROJECTOR_TEXT_PX]
    problems += [f"1920×1080: {t['chart']!r}: {t['text']!r} is {t['px']:.0f} px" for t in small]
    _screenshots(page, shots / "board_1920x1080.png")
    _resize(page, XGA)  # and back: the charts follow the window down as well as up
    problems += _fit_problems(page, XGA)
    print("\n".join(problems))
    assert not problems, "\n".join(problems[:40])
    assert not errors, "\n".join(errors[:20])


# --- present mode -------------------------------------------------------------------------------------

PRESENTED = ["notebooks/99_board.ipynb", "notebooks/06_engine_loop.ipynb"]
# Voila's page template asks a CDN for Font Awesome; this machine has no network (a room does).
OFFLINE_ONLY = ("https://cdn.jsdelivr.net/",)


def _known_voila_error(exc) -> bool:
    """plotly's JupyterLab renderer, having drawn a static figure (`fig.show()`), stores a PNG of it
    in the notebook through `model.setData`, which Voila's read-only output models lack: the figure
    is drawn (the test checks it), only its PNG copy for a saved notebook is not kept."""
    return "setData is not a function" in str(exc) and "/labextensions/jupyterlab-plotly/" in (exc.stack or "")


@contextlib.contextmanager
def serve_present(tmp: Path, notebook: str):
    """Voila as `make present NB=<notebook>` starts it (the Makefile's flags), on a loopback port."""
    served = tmp / "root"
    shutil.copytree(ROOT / "notebooks", served / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    port = _free_port()
    log = tmp / "voila.log"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    with open(log, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "voila", *make_flags("PRESENT_FLAGS"), notebook, "--no-browser",
                                 f"--port={port}", "--Voila.ip=127.0.0.1"],
                                cwd=served, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    with serving(proc, f"http://127.0.0.1:{port}", "/voila/static/voila.js", log) as base:
        yield base


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
def test_present_mode(jupyterlab, browser, tmp_path, notebook):
    _, shots = jupyterlab
    started = time.perf_counter()
    with serve_present(tmp_path, notebook) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: None if _known_voila_error(exc) else errors.append(f"page error: {exc}"))
        page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
                if (msg.type == "error" or any(n in msg.text for n in WIDGET_ERRORS))
                and not (msg.location or {}).get("url", "").startswith(OFFLINE_ONLY) else None)
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
