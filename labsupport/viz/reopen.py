"""Outputs that survive a reopen: beside each live panel, a static copy of the figure it shows now.

A widget lives in the kernel.  A notebook reopened without running it has none, and JupyterLab's
widget renderer (ipywidgets' python/jupyterlab_widgets/src/renderer.ts) then writes "Error displaying
widget: model not found" in place of the panel; it never falls back to another mimetype of the same
output, because its factory has rank -10, ahead of every other.  Saving the widget state instead is
no remedy: plotly's FigureWidget is an anywidget whose state carries its 5 MB JavaScript bundle.

So a panel is shown as three outputs:

1. the widget itself (live while the kernel runs);
2. a note (HTML): which settings the copy shows and "run the cell to make it live";
3. the copy: plotly's own JSON mimetype, which the jupyterlab-plotly extension draws without a
   kernel (nbviewer, which runs nbconvert, takes the HTML beside it: the same figure through
   plotly.js from its CDN).

The note carries a style rule: while the widget is drawn, the note and its copy are hidden (no
figure twice on screen); while it is not (a reopen), the dead widget is hidden and the copy stands
in.  Each redraw replaces the copy and the note through their display ids, so the notebook saved
after a slider move holds the figure then on screen.  Outputs hold no random values: display ids
are transient (never written to the .ipynb), and the copy's figure has no trace uids.
"""
from __future__ import annotations

import hashlib
import html
import json
import re
import uuid

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs_version

PLOTLY_MIME = "application/vnd.plotly.v1+json"
NOTE_CLASS = "lab-static-note"
RUN_LINE = "Run the cell to make it live."
PLOTLY_CDN = f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"  # the plotly.js that plotly bundles

# A JupyterLab output is a .jp-OutputArea-child; a drawn widget view holds .jupyter-widgets
# elements (a widget that failed to draw is one bare node carrying only the error text).
_CHILD = ".jp-OutputArea-child"
_LIVE = f"{_CHILD}:has(.jp-OutputArea-output .jupyter-widgets)"


def _style(following: int) -> str:
    live = [f"{_LIVE} + {_CHILD}:has(.{NOTE_CLASS}-{following})" + f" + {_CHILD}" * k for k in range(following + 1)]
    dead = f"{_CHILD}:not(:has(.jp-OutputArea-output .jupyter-widgets)):has(+ {_CHILD} .{NOTE_CLASS}-{following})"
    return f"<style>{', '.join(live)}, {dead} {{ display: none; }}</style>"


def note_bundle(text: str, following: int = 1) -> dict:
    """The note's output: `text`, then the run line; hides itself and the `following` outputs after it
    while the widget before it is drawn, and that widget while it is not."""
    plain = f"{text} {RUN_LINE}".strip()
    body = (f'<div class="{NOTE_CLASS} {NOTE_CLASS}-{following}" style="font-size:16px;color:#444;'
            f'border-left:4px solid #0072B2;padding:4px 10px;margin:4px 0">▶ {html.escape(text)} '
            f"<b>{RUN_LINE}</b></div>")
    return {"text/html": _style(following) + body, "text/plain": plain}


def plain_title(fig: go.Figure) -> str:
    text = fig.layout.title.text or ""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)).strip() or "figure"


def figure_bundle(fig: go.Figure) -> dict:
    """The copy's output: plotly's JSON (no uids), HTML for viewers without the plotly extension, text."""
    spec = json.loads(pio.to_json(fig, validate=False))
    for trace in spec.get("data", []):
        trace.pop("uid", None)
    spec["config"] = {"responsive": True}
    payload = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    div = "lab-static-" + hashlib.sha1(payload.encode()).hexdigest()[:12]  # the same figure, the same id
    script = payload.replace("</", "<\\/")
    page = (f'<div id="{div}" style="height:{spec["layout"].get("height", 460)}px;width:100%"></div>'
            f'<script src="{PLOTLY_CDN}"></script>'
            f'<script>(function(){{var f={script};Plotly.newPlot("{div}",f.data,f.layout,f.config);}})();</script>')
    return {PLOTLY_MIME: spec, "text/html": page, "text/plain": f"static copy: {plain_title(fig)}"}


def _publish(bundle: dict, display_id: str | None = None, update: bool = False) -> None:
    from IPython.display import display

    if display_id is None:
        display(bundle, raw=True)
    else:
        display(bundle, raw=True, display_id=display_id, update=update)


class Copy:
    """One output that can be shown once and then replaced in place (a note or a figure)."""

    def __init__(self, bundle: dict):
        self.bundle = bundle
        self.display_id = uuid.uuid4().hex  # transient: not written to the notebook
        self.shown = False

    def show(self) -> None:
        _publish(self.bundle, self.display_id, update=False)
        self.shown = True

    def replace(self, bundle: dict) -> None:
        """Keep `bundle` as the copy; where it was shown, the shown output changes too."""
        if bundle == self.bundle:
            return
        self.bundle = bundle
        if self.shown:
            _publish(bundle, self.display_id, update=True)


class FigureCopy(Copy):
    def __init__(self, fig: go.Figure):
        super().__init__(figure_bundle(fig))

    def update(self, fig: go.Figure) -> None:
        self.replace(figure_bundle(fig))


class NoteCopy(Copy):
    def __init__(self, text: str, following: int = 1):
        self.following = following
        super().__init__(note_bundle(text, following))

    def update(self, text: str) -> None:
        self.replace(note_bundle(text, self.following))


def show_live(widget_bundle: dict, note: NoteCopy, copies) -> None:
    """Display a widget, then its note and the static copies that stand in for it after a reopen."""
    _publish(widget_bundle)
    note.show()
    for copy in copies:
        copy.show()
