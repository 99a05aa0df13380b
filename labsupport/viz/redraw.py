"""A panel's redraw: make the figure on screen the figure a fresh call would draw (every lab's panels).

A ``go.FigureWidget`` on screen is changed by messages, each naming the properties it sets; a
property the new figure does not have is not reset by omitting it.  Lab 02's panel after S_max
131,072 -> 512 kept the first figure's "no slot fits" banner above the new figure's bars because the
new figure had no annotation and nothing said to remove the old one.  So a redraw sends, for the
layout and for each trace, every top-level property that changed and ``None`` for every one the new
figure lacks (plotly.js deletes a property set to null); what is unchanged (the template, most axes)
is not sent again, which keeps a slider move cheap.  Traces are edited in place while their kinds
match, one for one; otherwise they are replaced.
"""
from __future__ import annotations

import json

import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder


def _same(a, b) -> bool:
    """Equal as JSON (arrays, numpy values and tuples compare by value)."""
    try:
        return bool(a == b)
    except ValueError:  # a numpy array inside: compare what would be sent
        return json.dumps(a, cls=PlotlyJSONEncoder, sort_keys=True) == json.dumps(b, cls=PlotlyJSONEncoder,
                                                                                sort_keys=True)


def property_delta(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> dict:
    """The top-level properties that turn `old` into `new`: each changed one with its new value,
    each one `new` lacks as None.  Keys in `ignore` (a trace's type and uid) are left alone."""
    delta = {key: value for key, value in new.items() if key not in ignore and not _same(old.get(key), value)}
    delta.update({key: None for key in old if key not in new and key not in ignore})
    return delta


def _trace_json(trace) -> dict:
    return trace.to_plotly_json()


def patch_figure(target: go.FigureWidget, new: go.Figure) -> None:
    """Make `target` show exactly `new`: traces, annotations, shapes, images, titles and axes."""
    with target.batch_update():
        same_kinds = len(target.data) == len(new.data) and all(
            a.type == b.type for a, b in zip(target.data, new.data))
        if same_kinds:
            for old, fresh in zip(target.data, new.data):
                delta = property_delta(_trace_json(old), _trace_json(fresh), ignore=("type", "uid"))
                if delta:
                    old.update(delta, overwrite=True)
        else:
            target.data = ()
            target.add_traces(list(new.data))
        delta = property_delta(target.layout.to_plotly_json(), new.layout.to_plotly_json())
        if delta:
            target.update_layout(delta, overwrite=True)
