"""The room's view of one segment and the instructor's notes, as HTML (lab 99, Lecture 10's timing plan).

Each segment is staged the way the lecture's notes stage it: the room sees the picture and the question;
each press of "reveal" adds the next result, in the notes' order, to the picture and to the lines under it
(`SegmentView`; §10.2's and §10.6's "what if" slider once every result is shown).  Everything addressed to
the instructor (the board directions, the answer, the confusion to expect, the timing, the
printed-versus-exact reconciliations) is never on the projected page: `notes_html` and `next_up_html` are the
presenter view's, a second window that follows the deck (`labsupport.viz.board.deck`).
"""
from __future__ import annotations

import html
import json

from labsupport import ledger
from labsupport.measure.part_two import LAB_NAMES
from labsupport.viz import PALETTE
from labsupport.viz.board.map import load_board_data
from labsupport.viz.board.pictures import PICTURE_HEIGHT, PICTURE_RANGE, picture
from labsupport.viz.board.segments import Segment, _numbers, _segments, operating_points

# Sizes for the back row.  HTML text follows the window's width: 24.2 px at 1024 wide, 32.3 px at 1920; the
# charts' text (`BOARD_PX`) is at least 3/4 of it, and the tables the board draws in HTML (the block sizes,
# the map) take the same 3/4.
TEXT_CSS = "clamp(24px, calc(15px + 0.9vw), 48px)"
TABLE_CSS = "clamp(18px, calc(11.2px + 0.675vw), 36px)"

_BOARD_CSS = f"""<style>
.board-deck, .board-deck .widget-html-content {{ font-size: {TEXT_CSS}; line-height: 1.3; }}
.board-deck .board-ask {{ border-left: 8px solid {PALETTE["compute"]}; padding: 2px 12px; margin: 2px 0; }}
.board-deck .board-results ol {{ margin: 2px 0; padding-left: 1.5em; }}
.board-deck .board-results li {{ margin: 0; }}
.board-deck .board-flag {{ color: #B34700; font-weight: bold; }}
.board-deck .board-table, .board-deck .board-table td, .board-deck .board-table th {{ font-size: {TABLE_CSS};
    border-collapse: collapse; padding: 2px 10px; text-align: left; vertical-align: top; }}
.board-deck .board-table th {{ border-bottom: 2px solid #444; }}
.board-deck .board-caption {{ font-weight: bold; margin: 2px 0 6px 0; }}
.board-deck .board-whatif {{ display: flex; flex-wrap: wrap; align-items: center; gap: 4px 16px; }}
.board-deck .board-whatif .widget-label, .board-deck .board-whatif .widget-readout {{ font-size: {TEXT_CSS};
    line-height: 1.3; height: auto; overflow: visible; }}
.board-deck .board-whatif .widget-hslider {{ width: auto; height: auto; }}
.board-deck .board-whatif .slider-container {{ flex: 0 0 clamp(150px, 15vw, 400px); }}
.board-deck .board-whatif .widget-readout {{ min-width: 5em; }}
.board-deck .js-plotly-plot .modebar-container {{ display: none; }}
</style>"""


# --- the room's view and the instructor's notes -----------------------------------------------------

def ask_html(seg: Segment) -> str:
    return f'<div class="board-ask"><b>Ask the room:</b> {html.escape(seg.ask)}</div>' if seg.ask else ""


def results_html(seg: Segment, step: int) -> str:
    items = "".join(f"<li>{line}</li>" for line in seg.reveals[:step])
    return f'<div class="board-results"><ol>{items}</ol></div>' if items else ""


def notes_html(seg: Segment) -> str:
    """Everything for the instructor, for the presenter view: timing, board directions, the answer, the
    confusion the lecture says to expect (only where it names one), what to cut."""
    plan = f"Minutes {seg.start}–{seg.end} of 75 ({seg.minutes} min)" + (", protected — never cut" if seg.protected
                                                                        else "")
    parts = [plan, f"<b>Board:</b> {html.escape(seg.board)}", f"<b>Answer:</b> {html.escape(seg.answer)}",
             f"<b>Expect confusion:</b> {html.escape(seg.confusion)}" if seg.confusion else "",
             f"<b>Timing:</b> {html.escape(seg.timing)}" if seg.timing else "",
             f"Lab {seg.lab} ({LAB_NAMES[seg.lab]}) has its live panels." if seg.lab in LAB_NAMES else ""]
    return '<div class="board-notes">' + "".join(f"<p>{p}</p>" for p in parts if p) + "</div>"


def next_up_html(index: int) -> str:
    """The presenter view's "next": the following segment's title and question."""
    segs = _segments()
    if index + 1 >= len(segs):
        return "The end of the lecture."
    s = segs[index + 1]
    return (f"<b>{s.start}–{s.end} min · {html.escape(s.title)}</b>"
            + (f"<br>Ask the room: {html.escape(s.ask)}" if s.ask else ""))


def whatif_readout(index: int, value) -> str:
    """The line under a what-if slider: what the ledger says at the slider's value."""
    r = _numbers()
    kv, budget, seq = r["kv_bytes_per_token"], r["kv_budget_bytes"], r["seq_tokens"]
    if index == 1:
        n = ledger.naive_concurrency(budget, value, kv)
        return (f"<b>{n}</b> fit, a slot <b>{100 * ledger.slot_occupancy(value, seq):.2f}%</b> used, "
                f"the budget <b>{100 * ledger.naive_utilization(budget, value, seq, kv):.2f}%</b>")
    _, b, tpot = operating_points(value, r)[2]
    ceiling = operating_points(value, r)[1]
    meets = "meets it" if ceiling[2] <= value else "goodput 0"
    return (f"deploy <b>B = {b}</b>, {ledger.throughput_tok_s(b, tpot):,.0f} tok/s; "
            f"B = {ceiling[1]}: {meets}")


# what each what-if slider offers: S_max from the lecture's 4K to Exercise 1's 128K, the SLO around its 20 ms
WHATIF = {1: ("S_max", [(f"{2**k:,}", 2**k) for k in range(12, 18)], 32_768),
          5: ("TPOT SLO", [(f"{ms} ms", ms / 1e3) for ms in range(10, 31)], None)}


class SegmentView:
    """One segment as one widget: its picture, its question, the results revealed so far, and once every
    result is shown, the segment's what-if slider (if it has one).  The notes are not in it (presenter view)."""

    def __init__(self, index: int, data: dict | None = None, height: int = PICTURE_HEIGHT):
        import ipywidgets as widgets

        if not 0 <= index < len(_segments()):
            raise IndexError(f"segment index must be 0..{len(_segments()) - 1}, got {index}")
        self.index, self.segment = index, _segments()[index]
        self.data = data if data is not None else load_board_data()
        self.step, self.height, self.whatif = 0, height, None
        self.picture_box = widgets.VBox()
        self.picture_box.add_class("board-picture")
        self.figure = None
        self.ask = widgets.HTML(ask_html(self.segment))
        self.results = widgets.HTML()
        self.results.add_class("board-results-box")
        self.whatif_box = widgets.HBox()
        self.whatif_box.add_class("board-whatif")
        self.slider = self.readout = None
        self._draw()
        self.widget = widgets.VBox([self.picture_box, self.ask, self.results, self.whatif_box])

    @property
    def steps(self) -> int:
        return len(self.segment.reveals)

    @property
    def pictures(self) -> list:
        return list(self.picture_box.children)

    def picture(self):
        return picture(self.index, self.step, self.data, self.height, self.whatif)

    def _draw(self) -> None:
        import ipywidgets as widgets

        from labsupport.viz import fit_width, live_figure

        shown = self.picture()
        old = self.picture_box.children
        if isinstance(shown, str):
            self.figure = None
            self.picture_box.children = [widgets.HTML(shown)]
        else:  # a new chart for each step: plotly.js cannot patch a chart into another kind (subplots, tables)
            self.figure = live_figure(shown)
            self.figure._config = {**self.figure._config, "displayModeBar": False}  # no toolbar over the room
            self.picture_box.children = [self.figure, fit_width()]
        for w in old:
            w.close()
        self.results.value = results_html(self.segment, self.step)
        self._show_whatif()

    def _show_whatif(self) -> None:
        """The slider, only once every result is shown: before, it would answer the question for the room."""
        import ipywidgets as widgets

        if self.index not in WHATIF or self.step < self.steps:
            self.whatif_box.children, self.whatif = [], None
            return
        if self.slider is None:
            name, options, value = WHATIF[self.index]
            value = value or _numbers()["tpot_slo_s"]
            self.slider = widgets.SelectionSlider(options=options, value=value, description=f"What if {name}:",
                                                  continuous_update=False, style={"description_width": "initial"},
                                                  layout=widgets.Layout(width="auto"))
            self.readout = widgets.HTML(whatif_readout(self.index, value))
            self.slider.observe(self._on_whatif, names="value")
        self.whatif_box.children = [self.slider, self.readout]

    def _on_whatif(self, change) -> None:
        self.whatif = change["new"]
        self.readout.value = whatif_readout(self.index, self.whatif)
        self._draw()

    def reveal(self, step: int | None = None) -> int:
        """Show the results up to `step` (the next one when None); returns the step now shown."""
        step = self.step + 1 if step is None else step
        step = max(0, min(step, self.steps))
        if step != self.step:
            self.step = step
            self._draw()
        return self.step

    def fit(self, height: float) -> None:
        """Take the height the page measured for the picture (design pixels), kept in PICTURE_RANGE."""
        height = int(max(PICTURE_RANGE[0], min(PICTURE_RANGE[1], height)))
        if abs(height - self.height) < 4:
            return
        self.height = height
        if self.figure is not None:  # a new chart: a height patched into a drawn one left plotly at 700 px wide
            self._draw()

    def room_text(self) -> str:
        """What the room sees now, as text."""
        import re

        shown = self.picture()
        pic = shown if isinstance(shown, str) else json.dumps(shown.to_plotly_json()["layout"], ensure_ascii=False)
        pic += " " + json.dumps([t.get("text") for t in shown.to_plotly_json()["data"]], ensure_ascii=False) \
            if not isinstance(shown, str) else ""
        whatif = whatif_readout(self.index, self.slider.value) if self.whatif_box.children else ""
        return re.sub(r"<[^>]+>", " ", " ".join((pic, ask_html(self.segment), results_html(self.segment, self.step),
                                                 whatif)))

    def text(self) -> str:
        s = self.segment
        return f"{s.start}–{s.end} min: {s.title}" + (f"\nAsk the room: {s.ask}" if s.ask else "")


def segment_view(index: int, data: dict | None = None) -> SegmentView:
    return SegmentView(index, data)
