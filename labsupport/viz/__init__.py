"""Figures and slider panels for every lab and the instructor's board (§10.1–§10.7).

One palette (each colour keeps one meaning in every lab), one set of projector-sized fonts, and one
way of writing bytes (labsupport.units: GB is 1e9 bytes, GiB is 2**30, and axis titles say which).

Figure functions are pure: parameters in, a ``plotly`` Figure out, testable without a browser.
`Panel` wires ipywidgets controls to a ``go.FigureWidget``: every change of a control re-runs the
figure function and redraws the widget to equal the fresh figure (`redraw`), and a readout line
states the exact numbers; beside the widget it leaves a static copy of that figure, kept current,
for a notebook reopened without a kernel (`reopen`).
Tests set ``panel.controls[name].value`` and read ``panel.figure``; ``python -m labsupport bench viz``
times an update (target: at most 50 ms of Python for a closed-form panel).

This module is the shared look; each lab concept has its own module beside it:

    roofline  §10.1   29 against 295: the ridge batch against the memory-limited batch (labs 00–01)
    memory    §10.2–3 reserve-to-max slots, per-request S_max holes, Fig. 2, block tables (labs 02–03)
    kernel    §10.3   the paged kernel's addressing, step bytes and bandwidth (lab 04)
    sharing   §10.4   fan-out, copy-on-write and the prefix index (lab 05)
    engine    §10.5   the engine loop streaming, the watermark, swap against recompute (lab 06)
    slo       §10.6   TTFT parts, TPOT as a property of the batch, goodput (lab 07)
    board     §10.7   the map of Part II and the instructor's board (lab 08, 99)
"""
from __future__ import annotations

import html
import re
import sys
from typing import Callable

import plotly.graph_objects as go

from labsupport import card, ledger
from labsupport.viz import a11y
from labsupport.specs import GB, GPUS, MODELS, GiB, KiB, MiB
from labsupport.viz import reopen
from labsupport.viz.redraw import patch_figure  # noqa: F401  (the one way a shown figure is redrawn)

# Okabe–Ito colours (colour-blind safe).  The meaning is fixed across labs.
PALETTE = {
    "compute": "#0072B2",   # arithmetic: FLOP/s, the ridge point
    "memory": "#D55E00",    # KV memory: budgets, the memory wall, reserved slots
    "used": "#009E73",      # bytes holding real tokens
    "waste": "#E69F00",     # reserved and never filled
    "shared": "#CC79A7",    # blocks shared by copy-on-write or a prefix
    "link": "#56B4E9",      # the host link: swap traffic
    "recompute": "#882255",  # prefill redone after preemption
    "limit": "#222222",     # SLOs, capacities, lines not to cross
    "neutral": "#999999",
}
FONT_FAMILY = "Inter, 'Helvetica Neue', Arial, sans-serif"
FONT_SIZE = 18  # readable from the back of a lecture hall
TITLE_SIZE = 24
HEIGHT = 460

TEMPLATE = go.layout.Template(
    layout=dict(
        font=dict(family=FONT_FAMILY, size=FONT_SIZE, color="#222222"),
        title=dict(font=dict(size=TITLE_SIZE), x=0.02, xanchor="left"),
        colorway=[PALETTE[k] for k in ("compute", "memory", "used", "waste", "shared", "link", "recompute")],
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=dict(showline=True, linecolor="#444444", gridcolor="#E6E6E6", zeroline=False, ticks="outside"),
        yaxis=dict(showline=True, linecolor="#444444", gridcolor="#E6E6E6", zeroline=False, ticks="outside"),
        legend=dict(font=dict(size=FONT_SIZE - 2)),
        hoverlabel=dict(font=dict(size=FONT_SIZE - 2)),
        margin=dict(l=90, r=40, t=90, b=80),
    )
)

BYTE_UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "MB": 10**6, "GB": GB, "GiB": GiB}
UNIT_NOTES = {"GB": "1 GB = 10⁹ B", "GiB": "1 GiB = 2³⁰ B", "MB": "1 MB = 10⁶ B", "MiB": "1 MiB = 2²⁰ B",
              "KiB": "1 KiB = 1,024 B", "B": "bytes"}


def in_unit(n_bytes: float, unit: str = "GB") -> float:
    if unit not in BYTE_UNITS:
        raise ValueError(f"unknown byte unit {unit!r}; choose one of {', '.join(BYTE_UNITS)}")
    return n_bytes / BYTE_UNITS[unit]


def bytes_axis_title(quantity: str, unit: str = "GB", note: bool = True) -> str:
    """Axis titles name the unit and what it means, so GB and GiB never mix silently.

    `note=False` drops the definition for short axes whose readout spells the bytes out.
    """
    in_unit(0, unit)
    return f"{quantity} ({unit}; {UNIT_NOTES[unit]})" if note else f"{quantity} ({unit})"


TITLE_LINE_CHARS = 48  # a 24 px title line that fits a 700 px figure (plotly's width when a cell renders off screen)


def wrap_title(title: str, width: int = TITLE_LINE_CHARS) -> str:
    """Break a one-line title at spaces into lines of at most `width` characters (plotly clips, never wraps).

    A title that already has line breaks (``<br>``) is the author's layout and is kept as it is.
    """
    if "<br>" in title or len(title) <= width:
        return title
    lines, line = [], ""
    for word in re.split(r"(?<![=≤≥→×÷+−]) (?![=≤≥→×÷+−])", title):  # "b = 16" stays on one line
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join(lines + [line])


AXIS_BAND_PX = 90  # below the plot: tick labels and the x-axis title
LEGEND_ROW_PX = 28
NARROW_FIGURE_PX = 700  # plotly's width for a figure drawn while its cell is off screen


def legend_rows(names, width_px: float = NARROW_FIGURE_PX - 100) -> int:
    """Rows a horizontal legend of these entries needs in `width_px` (about 9 px a character at 16 px)."""
    rows, used = 1, 0.0
    for name in names:
        item = 50 + 9 * len(str(name))
        if used and used + item > width_px:
            rows, used = rows + 1, 0.0
        used += item
    return rows


def _margin(fig: go.Figure, side: str) -> float:
    value = getattr(fig.layout.margin, side)
    return value if value is not None else getattr(TEMPLATE.layout.margin, side)


def styled(fig: go.Figure, title: str, height: int = HEIGHT, **layout) -> go.Figure:
    """Apply the course template, a title and a height: every figure function ends here.

    Two rules keep text from colliding at any width from 700 px up: a long title is wrapped
    (`wrap_title`) and the top margin grows with its lines; a horizontal legend below the plot is
    pinned to the figure's foot, under the x-axis title, with the bottom margin grown to hold it.
    """
    text = wrap_title(title)
    fig.update_layout(template=TEMPLATE, title=dict(text=text), height=height, **layout)
    legend = fig.layout.legend
    names = [t.name for t in fig.data if t.name and t.showlegend is not False]
    lines = text.count("<br>") + 1
    above = LEGEND_ROW_PX * legend_rows(names) if legend.y is not None and legend.y >= 1 else 0
    if lines > 1 or above:  # plotly centres the title in the top margin: add room for its lines and the legend
        fig.update_layout(margin_t=_margin(fig, "t") + 30 * (lines - 1) + above)
    if legend.orientation == "h" and legend.y is not None and legend.y < 0 and legend.yref != "container":
        fig.update_layout(legend=dict(yref="container", y=0.0, yanchor="bottom"),
                          margin_b=max(_margin(fig, "b"), AXIS_BAND_PX + LEGEND_ROW_PX * legend_rows(names) + 10))
    return a11y.alternative(a11y.legible(fig))  # WCAG text contrast; a one-sentence text alternative


# --- panels ---------------------------------------------------------------------------------------

SLIDER_TRACK_PX = 240  # every slider's track: above the 200 px a hand needs, on a laptop or a projector
# Controls keep their size and wrap onto another row when the notebook is narrow (a laptop with
# JupyterLab's file browser open leaves about 850 px): a squeezed slider is one nobody can drag.
_PANEL_CSS = (f"<style>.lab-panel .widget-label, .lab-panel .widget-readout, .lab-panel select, "
              f".lab-panel .widget-html-content {{ font-size: {FONT_SIZE}px; }}"
              f".lab-controls > * {{ flex: 0 0 auto; margin: 4px 28px 4px 0; }}"
              f".lab-controls .widget-hslider {{ width: auto; }}"
              f".lab-controls .widget-hslider .slider-container {{ flex: 0 0 {SLIDER_TRACK_PX}px; "
              f"min-width: {SLIDER_TRACK_PX}px; }}"
              f".lab-controls .widget-readout {{ min-width: 4em; text-align: left; }}</style>")


def panel_header(title: str = ""):
    """The panel's title line (bold), carrying the shared style of every lab panel."""
    import ipywidgets as widgets

    return widgets.HTML(_PANEL_CSS + (f"<b>{html.escape(title)}</b>" if title else ""))


def controls_row(controls) -> "widgets.HBox":
    """Controls side by side at their natural size, wrapping onto a second row rather than shrinking."""
    import ipywidgets as widgets

    row = widgets.HBox(list(controls), layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
    row.add_class("lab-controls")
    return row


# --- sizing: every live chart fills its output area and follows it ---------------------------------

# plotly's FigureWidget (an anywidget) draws once, before its element is on the page, so it gets
# plotly's default 700 px whatever the room, and it never hears of a resize.  The zero-height widget
# `fit_width()` sits beside the charts of a panel and watches the width of the box they share (when
# the chart appears, when the file browser opens or closes, when a projector changes the window):
# each chart is laid out at that width, kept between DESIGN_PX's bounds, where wrap_title and
# legend_rows hold, and scaled to fill the box exactly.  So a 592 px output area (1024 x 768 with the
# file browser open) shows a 700 px layout at 0.85, and a 1,473 px one (1920 x 1080) a 1,000 px
# layout at 1.47: chart text grows with the room (18 px ticks read 26 px), no chart is clipped.
# Charts are `responsive` (plotly re-lays them out on the window's resize event, which the helper
# raises once per change).
DESIGN_PX = (NARROW_FIGURE_PX, 1000)
_FIT_WIDTH_ESM = """
const [NARROWEST, WIDEST] = %s;
let pending = 0;
function relayoutCharts() {  // one resize event for every chart that moved in this frame
  if (!pending) pending = requestAnimationFrame(() => { pending = 0; window.dispatchEvent(new Event("resize")); });
}
function render({ el }) {
  el.classList.add("lab-fit-width");
  el.style.cssText = "display:block;width:100%%;height:0;margin:0;padding:0;border:0";
  let width = 0, frame = 0;
  const charts = () => [...(el.parentElement ? el.parentElement.children : [])]
    .filter(c => c.classList.contains("js-plotly-plot"));
  const fit = () => {
    frame = 0;
    const box = el.offsetWidth;
    if (!box) return;
    const scale = box < NARROWEST ? box / NARROWEST : box > WIDEST ? box / WIDEST : 1;
    for (const chart of charts()) {
      chart.style.width = `${box / scale}px`;
      chart.style.transformOrigin = "0 0";
      chart.style.transform = scale === 1 ? "" : `scale(${scale})`;
      chart.style.marginBottom = `${chart.offsetHeight * (scale - 1)}px`;  // the scaled height, in the flow
      observer.observe(chart);  // a redraw that changes its height moves what follows
    }
    if (box !== width) { width = box; relayoutCharts(); }
  };
  const later = () => { if (!frame) frame = requestAnimationFrame(fit); };
  const observer = new ResizeObserver(later);
  const drawn = () => { width = 0; later(); };  // a chart finished its first drawing
  observer.observe(el);
  document.addEventListener("plotlywidget-after-render", drawn);
  return () => { observer.disconnect(); document.removeEventListener("plotlywidget-after-render", drawn);
                 cancelAnimationFrame(frame); };
}
export default { render };
""" % list(DESIGN_PX)
_FIT_WIDTH_CLASS = None


def fit_width():
    """The zero-height widget that fits the charts beside it to the width of their box (see above)."""
    global _FIT_WIDTH_CLASS
    if _FIT_WIDTH_CLASS is None:
        import anywidget

        _FIT_WIDTH_CLASS = type("FitWidth", (anywidget.AnyWidget,), {"_esm": _FIT_WIDTH_ESM, "__module__": __name__})
    return _FIT_WIDTH_CLASS()


# plotly's FigureWidget ships its 5 MB bundle as each widget's own module; anywidget evaluates every
# copy separately and gives each widget 2 s to be ready, after which it ignores every message the
# kernel sends that widget.  A page that creates a dozen charts at once (Voila; the board) misses
# that deadline for most of them, and those charts never redraw when a slider moves (their readouts,
# plain ipywidgets, still do).  So a LiveFigure carries only a small module and a reference to one
# widget per kernel holding plotly's bundle: the page evaluates the bundle once, and every chart
# is ready as soon as that one evaluation is done.
_SHARED_PLOTLY_ESM = """
const CACHE = Symbol.for("labsupport.plotly-widget-bundle");
async function plotlyModule(model) {  // one evaluation of plotly's widget bundle per page and version
  const id = model.get("_plotly_code").replace(/^IPY_MODEL_/, "");
  let carrier;
  for (let tries = 0; !carrier; tries++) {  // the carrier's model may be registered just after ours
    try { carrier = await model.widget_manager.get_model(id); }
    catch (error) { if (tries > 100) throw error; await new Promise(r => setTimeout(r, 100)); }
  }
  const cache = (globalThis[CACHE] ??= new Map());
  const version = carrier.get("version");
  if (!cache.has(version)) {
    const url = URL.createObjectURL(new Blob([carrier.get("code")], { type: "text/javascript" }));
    cache.set(version, import(url).finally(() => URL.revokeObjectURL(url)));
  }
  return cache.get(version);
}
export default () => {
  let widget, loaded;  // plotly's own widget for this model
  return {
    initialize(context) {
      loaded = plotlyModule(context.model).then(mod => { widget = mod.default(); return widget.initialize(context); });
      return loaded;
    },
    async render(context) {
      await loaded;
      return widget.render(context);
    },
  };
};
"""
_LIVE_FIGURE_CLASS = None
_PLOTLY_CODE = None


def _plotly_code():
    """The kernel's one widget holding plotly's widget bundle (see above), made when first needed."""
    global _PLOTLY_CODE
    if _PLOTLY_CODE is None or _PLOTLY_CODE.comm is None:  # none yet, or closed
        from pathlib import Path

        import ipywidgets as widgets
        import plotly
        import traitlets

        carrier = type("PlotlyCode", (widgets.Widget,), {
            "__module__": __name__, "code": traitlets.Unicode().tag(sync=True),
            "version": traitlets.Unicode().tag(sync=True),
            "__repr__": lambda self: f"PlotlyCode(plotly {self.version}, {len(self.code):,} characters)"})
        bundle = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
        _PLOTLY_CODE = carrier(code=bundle.read_text(encoding="utf-8"), version=plotly.__version__)
    return _PLOTLY_CODE


def live_figure(figure: go.Figure) -> go.FigureWidget:
    """`figure` as a FigureWidget with no fixed width that re-lays itself out on resize (see
    `fit_width`), sharing one copy of plotly's widget code with every other chart on the page."""
    global _LIVE_FIGURE_CLASS
    if _LIVE_FIGURE_CLASS is None:
        import ipywidgets as widgets
        import traitlets

        _LIVE_FIGURE_CLASS = type("LiveFigure", (go.FigureWidget,), {
            "__module__": __name__, "_esm": _SHARED_PLOTLY_ESM,
            "_plotly_code": traitlets.Instance(widgets.Widget).tag(sync=True, **widgets.widget_serialization),
            "_default_plotly_code": traitlets.default("_plotly_code")(lambda self: _plotly_code())})
    widget = _LIVE_FIGURE_CLASS(figure)
    widget._config = {**widget._config, "responsive": True}
    return widget


def panel_box(title: str, controls, *below) -> "widgets.VBox":
    """A lab panel's box: its title line, its controls in a row, then `below` (its chart, readout, ...)."""
    import ipywidgets as widgets

    box = widgets.VBox([panel_header(title), controls_row(controls), *below])
    box.add_class("lab-panel")  # the class the panel's CSS and the Namer (a11y) look for
    return box


class LiveView:
    """What every live panel of §10.1–§10.7 shows: its widget, then a note and a static copy of its figure
    that stand in for it once the kernel is gone (`reopen`), both kept current on every redraw.

    A subclass sets `widget`, calls `_start_figure` with its first figure, calls `_redraw_figure` with
    each fresh one, and says what it shows in `text()` and `_note_text()`.
    """

    def _start_figure(self, first: go.Figure) -> None:
        self.figure = live_figure(first)
        self.copy = reopen.FigureCopy(first)  # what a reopened notebook shows in its place
        self.note = reopen.NoteCopy(self._note_text())

    def _redraw_figure(self, fresh: go.Figure) -> None:
        patch_figure(self.figure, fresh)
        self.copy.update(fresh)
        self.note.update(self._note_text())

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()  # the widget's own repr embeds random trace uids
        return bundle

    def _ipython_display_(self):
        """The widget, then the note and the static copy that stand in for it once the kernel is gone."""
        reopen.show_live(self._repr_mimebundle_(), self.note, [self.copy])


class Panel(LiveView):
    """Controls wired to a FigureWidget and a readout line; display it as the last line of a cell.

    `make_figure(**values)` and `readout(**values)` receive the controls' values by name.  An input
    the figure function rejects (ValueError) is shown in the readout; the figure keeps its last state.
    """

    def __init__(self, make_figure: Callable[..., go.Figure], controls: dict,
                 readout: Callable[..., str] | None = None, title: str = ""):
        import ipywidgets as widgets

        if not controls:
            raise ValueError("a panel needs at least one control")
        self.title = title
        self.controls = dict(controls)
        self._make_figure = make_figure
        self._readout = readout
        self.updates = 0
        self.error: str | None = None
        first = make_figure(**self.values)
        self._text = self._readout(**self.values) if self._readout else ""
        self._start_figure(first)  # after _text: the note is written from text()
        self.readout = widgets.HTML()
        self.readout.value = self._readout_html()
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.widget = panel_box(title, self.controls.values(), self.figure, self.readout, fit_width(),
                                a11y.namer())  # the namer names its slider handles and chart

    @property
    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _readout_html(self) -> str:
        text = html.escape(self.error or self._text).replace("\n", "<br>")
        colour = a11y.ink(PALETTE["memory"]) if self.error else "#222222"
        return f'<div style="font-size:{FONT_SIZE}px;color:{colour};line-height:1.5">{text}</div>'

    def _on_change(self, change=None) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Recompute the figure and readout from the controls and patch the widget in place."""
        values = self.values
        try:
            new = self._make_figure(**values)
            text = self._readout(**values) if self._readout else ""
        except ValueError as exc:
            self.error = f"Not drawn: {exc}"  # words, not ⚠: a projector without an emoji font draws a box
        else:
            self.error = None
            self._text = text
            self._redraw_figure(new)
            self.updates += 1
        self.readout.value = self._readout_html()

    def text(self) -> str:
        """Plain-text summary: the title, each control's value, and the readout (deterministic)."""
        settings = ", ".join(f"{name}={_label(control)}" for name, control in self.controls.items())
        lines = [f"{self.title or 'Panel'} [{settings}]"]
        lines += (self.error or self._text).splitlines()
        return "\n".join(lines)

    def _note_text(self) -> str:
        return f"Below, this panel's figure as last drawn: {self.text().splitlines()[0]}."


def _label(control) -> str:
    label = getattr(control, "label", None)
    return str(label if label is not None else control.value)


def dropdown(options, value, description: str):
    """A dropdown; `options` is a list of values or a list of (label, value) pairs; value None: the first option
    (the course card's model or GPU, which model_options and gpu_options list first)."""
    import ipywidgets as widgets

    if value is None and options:
        value = options[0][1] if isinstance(options[0], tuple) else options[0]

    return widgets.Dropdown(options=options, value=value, description=description,
                            style={"description_width": "initial"}, layout=widgets.Layout(width="auto"))


def selection_slider(options, value, description: str, continuous_update: bool = True):
    """A slider over discrete options (e.g. powers of two); `continuous_update=False` for slow panels.

    `description` names the quantity and its unit, e.g. "S_max (tokens)".
    """
    import ipywidgets as widgets

    return widgets.SelectionSlider(options=options, value=value, description=description,
                                   continuous_update=continuous_update, style={"description_width": "initial"},
                                   layout=widgets.Layout(width="auto"))


def number_slider(description: str, value: float, lo: float, hi: float, step: float, continuous: bool = True,
                  integer: bool = False, readout_format: str | None = None):
    """An int or float slider laid out like every other lab slider; `description` carries the unit."""
    import ipywidgets as widgets

    cls = widgets.IntSlider if integer else widgets.FloatSlider
    kw = {} if integer or readout_format is None else {"readout_format": readout_format}
    return cls(value=value, min=lo, max=hi, step=step, description=description, continuous_update=continuous,
               style={"description_width": "initial"}, layout=widgets.Layout(width="auto"), **kw)


def model_options() -> list[tuple[str, str]]:
    """The course card's model and its contrast first (course.toml), then the rest of the catalogue."""
    first = list(card.card().models())
    return [(name, name) for name in first + [k for k, m in MODELS.items() if k == m.name and k not in first]]


def gpu_options() -> list[tuple[str, str]]:
    """The course card's GPU first, then the rest of the catalogue."""
    first = card.gpu().name
    return [(first, first)] + [(g.name, g.name) for key, g in GPUS.items() if key == g.name and key != first]


def attention_options(with_kv: bool = False) -> list[tuple[str, str]]:
    """The card's model and its contrast, MHA first, labelled by their attention (and KV bytes per token)."""
    c = card.card()
    label = lambda m: f"{m.name} ({m.attention}" + (f", {m.kv_bytes_per_token // KiB:,} KiB/token)" if with_kv else ")")
    return [(label(m), m.name) for m in (c.mha, c.gqa)]


S_MAX_OPTIONS = [(f"{2**k:,}", 2**k) for k in range(9, 18)]  # 512 … 131,072 tokens


# --- front ends ------------------------------------------------------------------------------

def enable_colab_widgets() -> bool:
    """On Google Colab, turn on its custom widget manager: the sliders and plotly's FigureWidget (an
    anywidget) are third-party widgets there.  Elsewhere nothing happens.  True when it was turned on."""
    if "google.colab" not in sys.modules:
        return False
    try:
        from google.colab import output
    except ImportError:
        return False
    output.enable_custom_widget_manager()
    return True


enable_colab_widgets()
a11y.start_early()


# --- errata -------------------------------------------------------------------------------------

def errata_note(*quantities: str) -> None:
    """Show the callout of `errata_markdown` (shown, not returned: a note inside ``if revealed(...):`` appears too)."""
    from IPython.display import display

    display(errata_markdown(*quantities))


def errata_markdown(*quantities: str):
    """A Markdown callout for the ledger's printed-figure rows whose quantity contains any of `quantities`.

    An erratum (no convention reproduces the printed figure) says what was tried; a convention (one
    does) shows both readings and calls neither wrong.
    """
    from IPython.display import Markdown

    def matches(row) -> bool:
        return any(q.lower() in row.quantity.lower() for q in quantities)

    blocks = [f"> **Printed vs exact — {e.quantity}** ({e.section}). The lecture prints *{e.printed}*; "
              f"exact arithmetic gives **{e.exact}**.  \n> {e.why}"
              + (f"  \n> *Readings tried:* {e.tried_text}." if e.tried else "")
              for e in ledger.ERRATA if matches(e)]
    blocks += [f"> **Printed figure, another convention — {c.quantity}**"
               + ("" if c.quantity.endswith(f"({c.section})") else f" ({c.section})") + ". The lecture prints "
               f"*{c.printed}*: {c.convention}. The ledger's default reading gives {c.default}.  \n> {c.why}"
               for c in ledger.CONVENTIONS if matches(c)]
    if not blocks:
        have = "; ".join(r.quantity for r in (*ledger.ERRATA, *ledger.CONVENTIONS))
        raise ValueError(f"no erratum or convention matches {quantities}; have: {have}")
    return Markdown("\n\n".join(blocks))