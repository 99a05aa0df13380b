"""The board as a deck: Lecture 10's 75-minute timing plan, one segment at a time (lab 99, `make board`).

`Board` stages the segments of `labsupport.viz.board.segments` one at a time: → (Page Down, space, a
presenter's clicker) reveals the next result, then moves to the next segment; ← (Page Up) takes the last
result back, then moves to the previous segment; S opens the presenter view (the instructor's notes, the next
segment's question, a clock).  Each segment is the room's view of `labsupport.viz.board.views`;
notebooks/99_board.ipynb shows `Board()` in JupyterLab and, projected, in Voila (`make present`).
"""
from __future__ import annotations

import html

from labsupport.viz import DESIGN_PX, PALETTE
from labsupport.viz.board.map import load_board_data
from labsupport.viz.board.pictures import PICTURE_HEIGHT, picture
from labsupport.viz.board.segments import _segments
from labsupport.viz.board.views import (_BOARD_CSS, TEXT_CSS, SegmentView, ask_html, next_up_html,
                                        notes_html)

BUTTON_CSS = "clamp(15px, calc(8px + 0.6vw), 22px)"  # navigation: the instructor's, not the room's


# --- the deck: one segment at a time, by keyboard or by button; the presenter view ---------------------
#
# The deck's state lives in the kernel; the page holds one small widget (`BoardKeys`) that sends every
# press to it and draws the buttons.  Two more jobs sit in that widget because they need the page:
# * fitting the picture: like reveal.js's r-stretch, the chart takes the height the screen has left
#   under the deck's other parts (measured whenever they change size), sent to the kernel as design
#   pixels, which sets the chart's height;
# * the presenter view: S opens a second window (reveal.js's speaker view) that the same widget writes
#   into: the notes, the next segment's question and a clock.  It follows the deck because it is drawn
#   from the same model; its own keys drive the deck too.  The notes never enter the projected page.
_KEYS_ESM = """
const FORWARD = ["ArrowRight", "PageDown", " "], BACK = ["ArrowLeft", "PageUp"];
const SPARE = 12;  // px kept free under the last line
const [NARROWEST, WIDEST] = %s;  // fit_width's design widths
const PRESENTER = `<style>
 body { font: 20px/1.4 Inter, 'Helvetica Neue', Arial, sans-serif; margin: 16px 24px; color: #1a1a1a; }
 header { display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; border-bottom: 2px solid #888; }
 #clock { font-size: 32px; font-weight: bold; } #elapsed { font-size: 32px; color: #0072B2; font-weight: bold; }
 #where { font-size: 24px; font-weight: bold; } #step { color: #444; }
 h2 { font-size: 18px; text-transform: uppercase; color: #555; margin: 14px 0 4px 0; }
 #next { border-left: 6px solid #0072B2; padding-left: 10px; } .board-notes p { margin: 4px 0; }
</style>
<header><span id="clock"></span><span id="elapsed" title="since the presenter view opened"></span>
<span id="where"></span><span id="step"></span></header>
<h2>Notes</h2><div id="notes"></div><h2>Next</h2><div id="next"></div>`;
function render({ model, el }) {
  // the deck around this widget: looked up when needed, as `el` is put on the page after render returns
  const deckOf = () => {
    const deck = el.closest(".board-deck");
    if (deck) deck.setAttribute("data-lm-suppress-shortcuts", "true");  // JupyterLab: the board's keys are its own
    return deck || el;
  };
  el.setAttribute("data-lm-suppress-shortcuts", "true");
  el.classList.add("board-nav");
  const make = (text, title, act) => {
    const b = document.createElement("button");
    b.className = "board-button"; b.textContent = text; b.title = title;
    b.addEventListener("click", () => act());
    el.appendChild(b); return b;
  };
  // every press is one message to the kernel, which holds the board's state and answers in order
  const send = action => model.send({ action });
  const back = make("← back", "the previous segment", () => send("previous"));
  const reveal = make("reveal", "the next result (→, Page Down, space; ← takes it back)", () => send("forward"));
  const next = make("next segment →", "the next segment", () => send("next"));
  const where = document.createElement("span");
  where.className = "board-title"; el.appendChild(where);

  let presenter = null, opened = 0, ticking = 0;
  const pad = n => String(n).padStart(2, "0");
  // The window's document is (re)written whenever it lacks the view: Chromium may replace the first
  // about:blank document of a new window after window.open returns, taking what was written with it.
  const ensure = () => {
    const d = presenter.document;
    if (d.getElementById("clock")) return d;
    d.title = "Presenter view: " + document.title;
    d.body.innerHTML = PRESENTER;
    d.addEventListener("keydown", onKey, true);  // the presenter's clicker drives the deck
    return d;
  };
  const tick = () => {
    if (!presenter || presenter.closed) { clearInterval(ticking); presenter = null; return; }
    const fresh = !presenter.document.getElementById("clock"), d = ensure();
    if (fresh) fillPresenter();
    const s = Math.floor((Date.now() - opened) / 1000);
    d.getElementById("clock").textContent = new Date().toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    d.getElementById("elapsed").textContent = `${pad(Math.floor(s / 60))}:${pad(s %% 60)}`;
  };
  const fillPresenter = () => {
    if (!presenter || presenter.closed) return;
    const d = ensure(), [k, s] = [model.get("revealed"), model.get("steps")];
    d.getElementById("where").textContent = model.get("label");
    d.getElementById("step").textContent = s ? `${k} of ${s} revealed` : "nothing to reveal";
    d.getElementById("notes").innerHTML = model.get("notes");
    d.getElementById("next").innerHTML = model.get("next_up");
  };
  const onKey = e => {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    if (FORWARD.includes(e.key)) send("forward"); else if (BACK.includes(e.key)) send("back");
    else if (e.key === "s" || e.key === "S") openPresenter(); else return;
    e.preventDefault(); e.stopImmediatePropagation();
  };
  const openPresenter = () => {
    presenter = window.open("", "labsupport-board-presenter", "popup,width=1000,height=760");
    if (!presenter) return;
    opened = Date.now();
    clearInterval(ticking); ticking = setInterval(tick, 500);
    fillPresenter(); tick();
  };

  let sent = 0, frame = 0;
  const fit = () => {
    frame = 0;
    const deck = deckOf();
    const chart = deck.querySelector(".board-picture .js-plotly-plot");
    if (!chart || !chart.offsetHeight || !deck.offsetParent) { deck.dataset.fitted = "1"; return; }
    const scroller = deck.closest(".jp-WindowedPanel-outer");
    const box = scroller ? scroller.getBoundingClientRect() : { top: 0, bottom: window.innerHeight };
    const screen = Math.min(box.bottom, window.innerHeight) - Math.max(box.top, 0);
    // In a notebook the board is scrolled to the top of the window (INSTRUCTORS.md); on a page of its own
    // (Voila) what stands above it (the heading) stays on the first screen.
    const offset = scroller ? 0 : deck.getBoundingClientRect().top + window.scrollY;
    const above = offset < 0.25 * screen ? offset : 0;
    // the scale fit_width gives the chart, from the width of its box (not read off the chart: a chart
    // just drawn is not scaled yet, and a height measured then would be sent, drawn, and sent again)
    const width = chart.parentElement.getBoundingClientRect().width;
    const scale = width < NARROWEST ? width / NARROWEST : width > WIDEST ? width / WIDEST : 1;
    const rest = deck.getBoundingClientRect().height - chart.parentElement.getBoundingClientRect().height;
    const drawn = chart.offsetHeight * scale;  // the picture's height once fit_width has scaled it
    const design = Math.round((screen - above - rest - SPARE) / scale);
    const off = Math.abs(design - chart.offsetHeight) > 6 || Math.abs(chart.getBoundingClientRect().height - drawn) > 2;
    deck.dataset.fitted = off && design !== sent ? "0" : "1";
    if (off && design !== sent) { sent = design; model.send({ action: "fit", height: design }); }
  };
  const later = () => { if (!frame) frame = requestAnimationFrame(fit); };
  const observer = new ResizeObserver(later);
  let watched = null;  // the deck, once the widget is on the page
  const watch = () => { const d = deckOf(); if (d !== el && d !== watched) { watched = d; observer.observe(d); } };
  window.addEventListener("resize", later);
  document.addEventListener("plotlywidget-after-render", later);

  const draw = () => {
    const [i, n, k, s] = ["index", "count", "revealed", "steps"].map(x => model.get(x));
    where.textContent = model.get("label");
    back.disabled = i === 0; next.disabled = i === n - 1;
    reveal.disabled = k >= s;
    reveal.textContent = s === 0 ? "nothing to reveal" : k < s ? `reveal ${k + 1} of ${s}` : `all ${s} revealed`;
    fillPresenter(); watch(); later();
  };
  model.on("change", draw); draw();
  requestAnimationFrame(watch);
  const onPageKey = e => {
    const deck = deckOf();
    if (!deck.isConnected || !deck.offsetParent) return;
    const t = e.target;
    if (t.closest && t.closest("input, textarea, select, [contenteditable=true], .cm-editor")) return;
    if (!(t === document.body || deck.contains(t))) return;  // Voila's page, or focus in the board
    onKey(e);
  };
  document.addEventListener("keydown", onPageKey, true);
  return () => {
    document.removeEventListener("keydown", onPageKey, true); model.off("change", draw);
    observer.disconnect(); window.removeEventListener("resize", later);
    document.removeEventListener("plotlywidget-after-render", later); clearInterval(ticking);
  };
}
export default { render };
""" % list(DESIGN_PX)
_KEYS_CSS = f"""
.board-nav {{ display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; margin: 0 0 4px 0; }}
.board-nav .board-button {{ font-size: {BUTTON_CSS}; padding: 2px 10px; border: 2px solid {PALETTE["compute"]};
  border-radius: 6px; background: white; color: #1a1a1a; cursor: pointer; }}
.board-nav .board-button:disabled {{ border-color: #BBBBBB; color: #595959; cursor: default; }}
.board-nav .board-title {{ font-size: {TEXT_CSS}; font-weight: bold; }}
"""
_KEYS_CLASS = None


def _keys_widget(**values):
    global _KEYS_CLASS
    if _KEYS_CLASS is None:
        import anywidget
        import traitlets

        _KEYS_CLASS = type("BoardKeys", (anywidget.AnyWidget,), {
            "__module__": __name__, "_esm": _KEYS_ESM, "_css": _KEYS_CSS,
            "index": traitlets.Int(0).tag(sync=True), "count": traitlets.Int(0).tag(sync=True),
            "revealed": traitlets.Int(0).tag(sync=True), "steps": traitlets.Int(0).tag(sync=True),
            "label": traitlets.Unicode("").tag(sync=True),
            # the presenter view's: never drawn on the projected page
            "notes": traitlets.Unicode("").tag(sync=True), "next_up": traitlets.Unicode("").tag(sync=True)})
    return _KEYS_CLASS(**values)


def in_voila() -> bool:
    """True in a kernel Voila started (`make present`): it names itself in the kernel's SERVER_SOFTWARE."""
    import os

    return os.environ.get("SERVER_SOFTWARE", "").startswith("voila/")


class Board:
    """The lecture, one segment at a time: → (Page Down, space) reveals the next result, then moves to the next
    segment; ← (Page Up) takes the last result back, then moves to the previous segment; S opens the
    presenter view."""

    def __init__(self, data: dict | None = None, start: int = 0):
        import ipywidgets as widgets

        from labsupport.viz import a11y

        self.data = data if data is not None else load_board_data()
        self.views: dict[int, SegmentView] = {}
        self.height = PICTURE_HEIGHT  # the last fitted height: a segment shown next starts from it
        self.keys = _keys_widget(count=len(_segments()), index=start)
        self.stage = widgets.VBox()
        self.widget = widgets.VBox([widgets.HTML(_BOARD_CSS), self.keys, self.stage, a11y.namer()])
        self.widget.add_class("board-deck")
        self.keys.on_msg(self._on_msg)
        self.show(start)

    @property
    def view(self) -> SegmentView:
        return self.views[self.keys.index]

    def show(self, index: int) -> SegmentView:
        if not 0 <= index < len(_segments()):
            raise IndexError(f"segment index must be 0..{len(_segments()) - 1}, got {index}")
        if index not in self.views:
            self.views[index] = SegmentView(index, self.data, self.height)
        view = self.views[index]
        seg = view.segment
        with self.keys.hold_sync():
            self.keys.index, self.keys.steps, self.keys.revealed = index, view.steps, view.step
            self.keys.label = f"{seg.start}–{seg.end} min · {seg.title}"
            self.keys.notes, self.keys.next_up = notes_html(seg), next_up_html(index)
        self.stage.children = [view.widget]
        return view

    def _on_msg(self, _widget, content, _buffers) -> None:
        action = {"forward": self.forward, "back": self.back, "next": self.next, "previous": self.previous}
        if not isinstance(content, dict):
            return
        if content.get("action") in action:
            action[content["action"]]()
        elif content.get("action") == "fit" and isinstance(content.get("height"), int | float):
            self.fit(content["height"])

    def fit(self, height: float) -> None:
        self.view.fit(height)
        self.height = self.view.height

    def reveal(self, step: int) -> None:
        self.keys.revealed = self.view.reveal(step)

    def next(self) -> None:
        if self.keys.index < self.keys.count - 1:
            self.show(self.keys.index + 1)

    def previous(self) -> None:
        if self.keys.index > 0:
            self.show(self.keys.index - 1)

    def forward(self) -> None:
        """What → does: the next result, or the next segment once all are shown."""
        if self.keys.revealed < self.keys.steps:
            self.reveal(self.keys.revealed + 1)
        else:
            self.next()

    def back(self) -> None:
        """What ← does: take the last result back, or go to the previous segment when none is shown."""
        if self.keys.revealed > 0:
            self.reveal(self.keys.revealed - 1)
        else:
            self.previous()

    def text(self) -> str:
        return "Lecture 10, the board: " + " | ".join(f"{s.start}–{s.end} {s.title}" for s in _segments())

    def copies(self) -> list:
        """What stands in for the board in a notebook reopened without a kernel: the first segment."""
        from labsupport.viz import reopen

        view, parts = self.views[0] if 0 in self.views else SegmentView(0, self.data), []
        shown = picture(0, 0, self.data)
        parts.append(reopen.Copy({"text/html": f"<b>{html.escape(view.text().splitlines()[0])}</b>",
                                  "text/plain": view.text().splitlines()[0]}))
        parts.append(reopen.FigureCopy(shown))
        parts.append(reopen.Copy({"text/html": ask_html(view.segment), "text/plain": view.segment.ask}))
        return parts

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle

    def _ipython_display_(self):
        """The live board; in JupyterLab also its static copies (hidden while it is live; shown after a
        reopen). Voila never saves a page, so there it shows the board alone, live from its first paint."""
        from IPython.display import display

        from labsupport.viz import reopen

        if in_voila():
            display(self._repr_mimebundle_(), raw=True)
            return
        parts = self.copies()
        note = reopen.NoteCopy("Below, the board's first segment as last drawn (0–6 min).", following=len(parts))
        reopen.show_live(self._repr_mimebundle_(), note, parts)
