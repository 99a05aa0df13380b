"""The board on a projector (issues 28 and 36), in Debian's Chromium: ask, derive, reveal; one segment, one screen.

JupyterLab is started as `make board` starts it (the Makefile's flags and page config, the board copied
to the Makefile's BOARD_COPY), Run All is timed, then the board is walked at 1024 × 768 and at
1920 × 1080.  For every segment and every reveal, scrolled to the board's top:

* the whole segment is on one screen, its last result included, and no text of it is clipped or
  outside the window;
* the tallest plotting area (plotly's axes box, `.nsewdrag`) is at least 25% of the window's height and
  every one at least 10%;
* before the first reveal none of the segment's results is on screen; after the last, every one is;
* nothing of the instructor's side is on the page (no note, no direction, no set-up code);
* the question and the results are at least 24 px at 1024 × 768 and 32 px at 1920 × 1080, chart text
  at least 3/4 of that (the navigation buttons aside).

Present mode (`make present`, Voila) opens on 0–6 with only the lecture's heading above the board,
never shows a "run the cell" copy, passes the same checks at both sizes, and → / ← step through all
seven segments; its presenter view (S) follows a reveal and a next segment.  Screenshots of every
segment before and after its reveal, at each size, go to the test's tmp dir or to $LABSUPPORT_SCREENSHOTS.

The results are derived by hand (the lecture's scenario: 512 KiB a token, a 62.52 GB budget, 29 naive
slots of 4,096 tokens, blocks of 16 tokens, 7,452 blocks):
  29 × 640 × 524,288 B = 9.73 GB of 62.52 GB = 15.56%; at S_max = 32K one slot is 640 / 32,768 = 1.95%;
  paged 7,452 // 40 = 186 sequences, 186 / 29 = 6.41×, (7,452 × 16 − 186 × 640) / (7,452 × 16) left
  unused: 186 × 640 / (7,452 × 16) = 99.83% used;
  8 × (4,096 + 256) = 34,816 tokens = 18.25 GB against (4,096 + 8 × 256) = 6,144 tokens = 3.22 GB, 5.67×;
  swap 2 × 4,096 × 524,288 B / 64e9 B/s = 67.1 ms; recompute (2 × 6.74e9 × 4,096 + 4 × 32 × 32 × 128 ×
  4,096²) / (0.5 × 989e12) = 129.4 ms;
  TPOT at B = 186: (13.48e9 + 186 × 640 × 524,288) / 3.35e12 = 22.65 ms, 186 / 22.65 ms = 8,210 tok/s.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from browser_support import (  # noqa: F401  (browser is a fixture)
    FULL_HD,
    ROOT,
    XGA,
    browser,
    copy_notebooks,
    jupyter_lab,
    make_flags,
    page_errors,
    screenshot_folder,
    serve_present,
    skip_without_chromium,
)
from test_browser import _click_run_all

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

# what each segment derives, as it must read on screen (hand arithmetic in the module docstring)
RESULTS = {
    "0–6": ["cannot be taken back"],
    "6–16": ["9.73 of 62.52 GB", "15.56%", "1.95%"],
    "16–36": ["one new block", "15.56% → 99.83%", "29 → 186", "gather", "4,096"],
    "36–46": ["7 + 1", "18.25 GB against 3.22 GB", "5.67×", "nothing names the request"],
    "46–58": ["67.1 ms", "129.4 ms", "runs out of blocks", "refuse new arrivals"],
    "58–68": ["22.65 ms", "8,210 tok/s", "goodput 0", "Ask for the SLO first"],
    "68–75": ["6.41×"],
}
SEGMENTS = list(RESULTS)
# words only the instructor's notes use: directions to the instructor, timing, reconciliations
DIRECTIONS = ("Board:", "Only then", "Let them", "Say:", "Expect confusion", "(exact", "never cut", "protected",
              "Minutes", "do not show the result", "Force them", "Let the silence", "Reading-only", "Run the cell")
FLOORS = {1024: 24, 1920: 32}  # question and results; chart text: 3/4 of it
CHART_SHARE = 0.75
# plotly's widget logs this when a chart replaced by the next step's (the board draws each step as a new
# chart) receives its last state update after its view is gone; the new chart draws (checked below).
REPLACED_CHART = "Error setting state: Cannot read properties of undefined (reading '_guiEditing')"
# anywidget gives a model 2 s to load its JavaScript (plotly's widget: a 5 MB bundle) and logs this past them,
# which a loaded machine can pass while the chart still draws: what the audience sees is checked instead (every
# chart of every step drawn, `_DRAWN`), so a chart that really failed still fails the walk.
SLOW_MODEL = "[anywidget] Failed to initialize model"
SIZES = [("1024x768", XGA, False), ("1920x1080", FULL_HD, False)]


def _instructor_sentences() -> list[str]:
    """Every sentence of the notes (board directions, answers, confusions) long enough to be recognised."""
    from labsupport.viz import board as viz_board

    found = []
    for seg in viz_board.SEGMENTS:
        for text in (seg.board, seg.answer, seg.confusion):
            found += [s.strip() for s in re.split(r"(?<=[.:;?])\s+", text) if len(s.strip()) >= 30]
    return found


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab as `make board` starts it, on a copy of the repository's notebooks; and the screenshot folder."""
    skip_without_chromium()
    tmp = tmp_path_factory.mktemp("board")
    shots = screenshot_folder(tmp)
    served = tmp / "root"
    copy_notebooks(served)
    (copy,) = make_flags("BOARD_COPY")
    (served / copy).parent.mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / "99_board.ipynb", served / copy)  # as `make board` does
    (config,) = make_flags("BOARD_CONFIG")
    with jupyter_lab(tmp, served, make_flags("BOARD_FLAGS"), env={"JUPYTER_CONFIG_PATH": str(ROOT / config)}) as base:
        yield base, shots, copy


def test_the_board_copy_is_ignored_by_git():
    """`make board` runs a copy that git ignores: running and saving it leaves the tree clean."""
    (copy,) = make_flags("BOARD_COPY")
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", copy])
    assert ignored.returncode == 0, f"{copy} is not ignored by git"


# --- measuring the board on screen ---------------------------------------------------------------------

# The board's text on screen: HTML (the folded notes' body excluded: closed, it is not drawn) and chart
# text as drawn (plotly's SVG text, scaled with its chart).  Each: its text and its size in px.
_TEXTS = """deck => {
    const out = [];
    const walker = document.createTreeWalker(deck, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) {
        const el = node.parentElement, text = node.textContent.trim();
        if (!text || !el || el.closest('style, .hoverlayer')) continue;
        const range = document.createRange();
        range.selectNodeContents(node);
        const r = range.getBoundingClientRect();
        if (!r.width || !r.height || !el.checkVisibility()) continue;
        let px = parseFloat(getComputedStyle(el).fontSize);
        const plot = el.closest('.js-plotly-plot');
        if (plot) px *= plot.getBoundingClientRect().width / plot.offsetWidth;
        const kind = el.closest('.board-nav') ? 'nav' : el.closest('.board-ask') ? 'ask'
            : el.closest('.board-results, .board-whatif') ? 'results' : 'chart';
        // clipped: outside the window, or outside the chart that draws it, or cut by an element's own box
        const svg = plot && plot.querySelector('.main-svg'), box = svg && svg.getBoundingClientRect();
        const outside = r.left < -1 || r.right > innerWidth + 1 || r.top < -1 || r.bottom > innerHeight + 1
            || (box && (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1))
            || (!plot && el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflow !== 'visible');
        out.push({text, px, kind, outside, notes: !!el.closest('.board-notes')});
    }
    return out;
}"""

# The bottom of the screen the board is read on, and the bottoms of its picture and question.
_FIT = """deck => {
    const scroller = deck.closest('.jp-WindowedPanel-outer, .jp-Notebook');
    const screen = scroller ? Math.min(scroller.getBoundingClientRect().bottom, window.innerHeight) : window.innerHeight;
    const bottom = sel => Math.max(0, ...[...deck.querySelectorAll(sel)].filter(e => e.checkVisibility())
        .map(e => e.getBoundingClientRect().bottom));
    const areas = [...deck.querySelectorAll('.js-plotly-plot .nsewdrag')].map(r => r.getBoundingClientRect().height);
    return {screen, picture: bottom('.js-plotly-plot, table.board-table'), ask: bottom('.board-ask'),
            results: bottom('.board-results, .board-whatif'), deck: deck.getBoundingClientRect().bottom,
            top: deck.getBoundingClientRect().top, areas, height: window.innerHeight,
            notes: document.querySelectorAll('.board-notes, details').length,
            code: ['import labsupport', 'google.colab', 'viz_board'].filter(c => document.body.innerText.includes(c)).length};
}"""
_BOARD_RAN = ("() => document.body.innerText.includes('(ipykernel) | Idle') && !document.body.innerText.includes('[*]')"
              " && !!document.querySelector('.board-deck .js-plotly-plot .main-svg')")
_LABEL = "() => (document.querySelector('.board-nav .board-title') || {}).textContent || ''"
_RESULTS = "() => (document.querySelector('.board-results') || {}).innerText || ''"
_DRAWN = """() => { const d = document.querySelector('.board-deck');
    return !!d && [...d.querySelectorAll('.js-plotly-plot, table.board-table')].length > 0
        && [...d.querySelectorAll('.js-plotly-plot')].every(p => !!(p._fullLayout && p.querySelector('.main-svg'))); }"""


def _wait_label(page, segment: str) -> None:
    page.wait_for_function(f"() => ({_LABEL})().startsWith({json.dumps(segment)})", timeout=60_000, polling=100)
    page.wait_for_function(_DRAWN, timeout=60_000, polling=100)


def _settle(page) -> None:
    """The board drawn and its charts fitted to the width (fit_width scales them a frame later)."""
    page.wait_for_function(_DRAWN, timeout=60_000, polling=100)
    page.wait_for_function("""() => [...document.querySelectorAll('.board-deck .js-plotly-plot')].every(p => {
        const box = p.parentElement.getBoundingClientRect().width;
        return Math.abs(p.getBoundingClientRect().width - box) <= 2; })""", timeout=30_000, polling=100)
    # the deck has fitted its picture to the screen (it redraws the chart at the height it measured)
    page.wait_for_function("() => document.querySelector('.board-nav') && document.querySelector('.board-deck')"
                           " .dataset.fitted === '1'", timeout=60_000, polling=100)
    page.wait_for_timeout(600)
    page.wait_for_function(_DRAWN, timeout=60_000, polling=100)


def _room_text(page, deck) -> str:
    return " ".join(t["text"] for t in deck.evaluate(_TEXTS) if not t["notes"])


def _check_segment(page, deck, size_name: str, width: int, segment: str, reveal, shots: Path) -> list[str]:
    """One segment: fit, nothing derived before the reveal, everything after, no directions, text sizes."""
    problems = []
    where = f"{size_name} {segment}"
    for phase in ("before", "after"):
        if phase == "after":
            reveal()
        _settle(page)
        deck.evaluate("d => d.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(200)
        fit = deck.evaluate(_FIT)
        if not fit["picture"] or not fit["ask"] and segment != "68–75":
            problems.append(f"{where} {phase}: no picture or no question on the board ({fit})")
        for part in ("picture", "ask", "results", "deck"):
            if fit[part] > fit["screen"] + 1:
                problems.append(f"{where} {phase}: its {part} ends at {fit[part]:.0f} px, below the screen's "
                                f"{fit['screen']:.0f} px")
        if fit["areas"] and (max(fit["areas"]) < 0.25 * fit["height"] or min(fit["areas"]) < 0.10 * fit["height"]):
            problems.append(f"{where} {phase}: plotting areas {[round(a) for a in fit['areas']]} px of a "
                            f"{fit['height']} px window (tallest ≥ 25%, each ≥ 10%)")
        if fit["notes"] or fit["code"]:
            problems.append(f"{where} {phase}: the instructor's side on the page ({fit['notes']} notes, "
                            f"{fit['code']} code inputs)")
        room = _room_text(page, deck)
        shown = [r for r in RESULTS[segment] if r in room]
        if phase == "before" and shown:
            problems.append(f"{where}: before the reveal the room already sees {shown}")
        missing = [r for r in RESULTS[segment] if r not in room]
        if phase == "after" and missing:
            problems.append(f"{where}: after the reveal the room does not see {missing}")
        problems += [f"{where} {phase}: a direction on the room's screen: {d!r}" for d in DIRECTIONS if d in room]
        problems += [f"{where} {phase}: a note's sentence on the room's screen: {s[:60]!r}"
                     for s in _instructor_sentences() if s in room]
        texts = deck.evaluate(_TEXTS)
        floor = {"ask": FLOORS[width], "results": FLOORS[width], "chart": CHART_SHARE * FLOORS[width]}
        small = sorted({(round(t["px"], 1), t["kind"], t["text"][:30]) for t in texts
                        if t["kind"] in floor and t["px"] < floor[t["kind"]] - 0.05})
        problems += [f"{where} {phase}: {kind} {text!r} is {px} px (floor {floor[kind]})" for px, kind, text in small[:5]]
        problems += [f"{where} {phase}: {t['text'][:30]!r} is clipped or off the screen" for t in texts if t["outside"]][:5]
        page.screenshot(path=str(shots / f"board_{size_name}_{segment.replace('–', '-')}_{phase}.png"))
    return problems


def _toggle_file_browser(page, want_open: bool) -> None:
    browser_panel = page.locator(".jp-FileBrowser").first
    if browser_panel.is_visible() != want_open:
        page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id='filebrowser']").click()
        page.wait_for_function(f"() => !!(document.querySelector('.jp-FileBrowser') || {{}}).checkVisibility"
                               f" && document.querySelector('.jp-FileBrowser').checkVisibility() === {str(want_open).lower()}",
                               timeout=10_000, polling=100)


def test_the_board_stages_each_segment(jupyterlab, browser):
    base, shots, copy = jupyterlab
    page = browser.new_page(viewport=XGA)
    errors = page_errors(page, known_exception=lambda exc: SLOW_MODEL in str(exc),
                         known_message=lambda msg: any(known in msg.text for known in (REPLACED_CHART, SLOW_MODEL)))
    problems: list[str] = []
    try:
        page.goto(f"{base}/", wait_until="domcontentloaded", timeout=90_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        page.wait_for_function("() => document.body.innerText.includes('(ipykernel) | Idle')",
                               timeout=120_000, polling=100)
        assert page.url.endswith(f"/doc/tree/{copy}"), page.url
        assert not page.locator(".jp-FileBrowser").first.is_visible(), "make board opens with the file browser"
        assert not page.locator(".jp-Notification-Toast").count(), "a notification covers the board"
        clicked = _click_run_all(page)
        # the code cells are folded (source_hidden), so their prompts are not drawn: wait for the kernel to be
        # idle again with the board on the page instead of for every prompt's count
        page.wait_for_function(_BOARD_RAN, timeout=300_000, polling=500)
        page.wait_for_function(_DRAWN, timeout=120_000, polling=100)
        print(f"\nboard: Run All until the first segment is drawn: {time.perf_counter() - clicked:.1f} s")
        deck = page.locator(".board-deck").first
        assert "Run the cell" not in page.inner_text(".jp-Notebook"), "a static copy shows beside the live board"
        assert "google.colab" not in page.inner_text(".jp-Notebook"), "the Colab set-up code shows on the board's page"
        heading = page.locator(".jp-MarkdownCell", has_text="Lecture 10").first.bounding_box()
        assert heading and heading["y"] < deck.bounding_box()["y"], "the lecture's heading is not above the board"
        for size_name, size, files in SIZES:
            page.set_viewport_size(size)
            _toggle_file_browser(page, files)
            page.locator(".board-nav button").first.focus()  # the keys act in the board that has the focus
            _rewind(page)
            for k, segment in enumerate(SEGMENTS):
                _wait_label(page, segment)

                def reveal_all():
                    while page.locator(".board-nav button", has_text=re.compile(r"^reveal")).count():
                        before = _state(page)
                        page.locator(".board-nav button", has_text=re.compile(r"^reveal")).click()
                        _wait_both_changed(page, before)

                problems += _check_segment(page, deck, size_name, size["width"], segment, reveal_all, shots)
                if k < len(SEGMENTS) - 1:
                    page.locator(".board-nav button", has_text="next segment").click()
    finally:
        page.close()
        print("\n".join(errors[:10]))
    print("\n".join(problems))
    assert not problems, "\n".join(problems[:40])
    assert not errors, "\n".join(errors[:20])


def _label(page) -> str:
    return page.evaluate(_LABEL)


_REVEAL_TEXT = "() => [...document.querySelectorAll('.board-nav button')].map(b => b.textContent).join('|')"


def _state(page) -> list[str]:
    return [page.evaluate(_RESULTS), page.evaluate(_REVEAL_TEXT)]


def _wait_both_changed(page, before: list[str]) -> None:
    """A reveal is done when its result line and the reveal button both changed (two messages from the kernel)."""
    page.wait_for_function(f"() => ({_RESULTS})() !== {json.dumps(before[0])} "
                           f"&& ({_REVEAL_TEXT})() !== {json.dumps(before[1])}", timeout=60_000, polling=100)


def _rewind(page) -> list[str]:
    """← until the first segment shows nothing revealed; the segments passed on the way."""
    seen = [_label(page).split(" ")[0]]
    for _ in range(60):
        if _label(page).startswith("0–6") and "reveal 1 of" in page.evaluate(_REVEAL_TEXT):
            return seen
        state = _label(page) + page.evaluate(_REVEAL_TEXT)
        page.keyboard.press("ArrowLeft")
        page.wait_for_function(f"() => ({_LABEL})() + ({_REVEAL_TEXT})() !== {json.dumps(state)}",
                               timeout=60_000, polling=100)
        if _label(page).split(" ")[0] != seen[-1]:
            seen.append(_label(page).split(" ")[0])
    raise AssertionError(f"← did not return to 0–6 with nothing revealed: at {_label(page)!r}")


# --- present mode ---------------------------------------------------------------------------------------

def test_present_mode_steps_through_the_lecture_by_keyboard(jupyterlab, browser, tmp_path):
    _, shots, _ = jupyterlab
    problems: list[str] = []
    with serve_present(tmp_path) as base:
        page = browser.new_page(viewport=XGA)
        try:
            seen_copies = []
            page.on("console", lambda msg: None)
            started = time.perf_counter()
            page.goto(f"{base}/", wait_until="domcontentloaded", timeout=300_000)
            while not page.evaluate(_DRAWN):  # poll the page as it fills: a "run the cell" copy must never show
                if "Run the cell" in page.inner_text("body"):
                    seen_copies.append(time.perf_counter() - started)
                page.wait_for_timeout(100)
                assert time.perf_counter() - started < 300, "present mode drew no board within 300 s"
            first = time.perf_counter() - started
            print(f"\npresent mode: first screen (0–6 drawn) {first:.1f} s after the request")
            assert not seen_copies, f"a static 'run the cell' copy showed at {seen_copies[:3]} s"
            assert _label(page).startswith("0–6"), _label(page)
            deck = page.locator(".board-deck").first
            shown = page.inner_text("body").strip()
            before = shown[:shown.index("← back")] if "← back" in shown else shown
            assert before.strip() == "Lecture 10: the KV cache as virtual memory", \
                f"present mode shows {before[:80]!r} before the board"
            for size_name, size in (("present-1024x768", XGA), ("present-1920x1080", FULL_HD)):
                page.set_viewport_size(size)
                rewound = _rewind(page)  # ← takes every result back, segment by segment
                if size_name.endswith("1920x1080"):
                    assert rewound == list(reversed(SEGMENTS)), rewound
                for k, segment in enumerate(SEGMENTS):
                    _wait_label(page, segment)

                    def reveal_all():
                        while page.locator(".board-nav button", has_text=re.compile(r"^reveal")).count():
                            before = _state(page)
                            page.keyboard.press("ArrowRight")
                            _wait_both_changed(page, before)

                    problems += _check_segment(page, deck, size_name, size["width"], segment, reveal_all, shots)
                    if k < len(SEGMENTS) - 1:
                        page.keyboard.press("PageDown")  # everything revealed: the next segment
        finally:
            page.close()
    print("\n".join(problems))
    assert not problems, "\n".join(problems[:40])


def test_the_presenter_view_follows_the_deck(jupyterlab, browser, tmp_path):
    """S on the projected page opens the presenter view (reveal.js's speaker view): the segment's notes, the
    next segment's question and a clock, in a second window that follows a reveal and a next segment."""
    from labsupport.viz import board as viz_board

    segs = viz_board.SEGMENTS
    with serve_present(tmp_path) as base:
        page = browser.new_page(viewport=XGA)
        try:
            page.goto(f"{base}/", wait_until="domcontentloaded", timeout=300_000)
            page.wait_for_function(_DRAWN, timeout=300_000, polling=100)
            with page.expect_popup(timeout=30_000) as popup_info:
                page.keyboard.press("s")
            presenter = popup_info.value
            text = lambda: presenter.evaluate("() => document.body.innerText")  # noqa: E731
            presenter.wait_for_function("() => (document.getElementById('notes') || {}).innerText",
                                        timeout=30_000, polling=100)
            assert "Board:" in text() and segs[1].ask in text() and "0 of 1 revealed" in text(), text()[:300]
            presenter.wait_for_function("() => /\\d\\d:\\d\\d/.test(document.getElementById('elapsed').textContent)",
                                        polling=100)
            assert "Board:" not in page.inner_text("body"), "a note on the projected page"
            page.keyboard.press("ArrowRight")  # the reveal
            presenter.wait_for_function("() => document.body.innerText.includes('1 of 1 revealed')",
                                        timeout=60_000, polling=100)
            page.keyboard.press("PageDown")  # the next segment
            presenter.wait_for_function("() => document.getElementById('where').textContent.startsWith('6–16')",
                                        timeout=60_000, polling=100)
            assert segs[2].ask in text() and "The naive allocator" in text(), text()[:300]
            presenter.keyboard.press("ArrowRight")  # the presenter's own keys drive the deck
            page.wait_for_function("() => document.querySelector('.board-results') !== null",
                                   timeout=60_000, polling=100)
        finally:
            page.close()
