"""Figures that are true after every move (issue 21, item 6), and the static copy a reopen shows (item 7).

A panel's FigureWidget after a run of slider moves must equal, in layout and data, a go.Figure built
fresh from the same values (its `to_plotly_json`, trace uids aside; plotly draws an empty list or
object as it draws none).  Two views are compared: the widget's Python state, and the state the
browser is sent (the widget's first state with every message it sent applied as plotly.js applies
a top-level property: set it, or delete it when the value is null).  Lab 02's S_max panel crosses
its edge (131,072 tokens: no slot fits, a red banner; 512: 232 slots and no banner) and comes back.
"""
from __future__ import annotations

import copy
import inspect
import json

import pytest
from plotly.basedatatypes import Undefined  # plotly's mark for "this trace: no change"
from plotly.utils import PlotlyJSONEncoder

from labsupport import ledger
from labsupport.measure import fragmentation
from labsupport.specs import LECTURE_7B, LECTURE_GPU
from labsupport.viz import engine, kernel, memory, reopen, roofline, sharing, slo
from labsupport.viz.board import Board, segment_view


def _plain(value):
    """JSON as plotly draws it: no uids, and no empty lists or objects (an empty one draws nothing)."""
    value = json.loads(json.dumps(value, cls=PlotlyJSONEncoder))

    def strip(v):
        if isinstance(v, dict):
            out = {k: strip(x) for k, x in v.items() if k != "uid"}
            return {k: x for k, x in out.items() if x not in ({}, [], None)}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(value)


class SentState:
    """What the browser holds: the widget's first state, then each message it sent, applied."""

    def __init__(self, widget):
        self.layout = copy.deepcopy(widget._widget_layout)
        self.data = copy.deepcopy(widget._widget_data)
        widget.observe(self._apply, names=["_py2js_update", "_py2js_relayout", "_py2js_restyle",
                                           "_py2js_addTraces", "_py2js_deleteTraces"])

    @staticmethod
    def _set(target: dict, key: str, value) -> None:
        assert "." not in key, f"a redraw should set whole top-level properties, not {key!r}"
        if value is None:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)

    def _apply(self, change) -> None:
        msg = change["new"]
        if not msg:
            return
        name = change["name"]
        if name == "_py2js_deleteTraces":
            for i in sorted(msg["delete_inds"], reverse=True):
                del self.data[i]
        elif name == "_py2js_addTraces":
            self.data.extend(copy.deepcopy(msg["trace_data"]))
        else:
            layout = msg.get("layout_data") if name == "_py2js_update" else msg.get("relayout_data")
            style = msg.get("style_data") if name == "_py2js_update" else msg.get("restyle_data")
            traces = msg.get("style_traces") if name == "_py2js_update" else msg.get("restyle_traces")
            for key, value in (layout or {}).items():
                self._set(self.layout, key, value)
            for key, values in (style or {}).items():
                for index, value in zip(traces, values):
                    if value is not Undefined:
                        self._set(self.data[index], key, value)


def assert_shows(panel, fresh, sent: SentState | None = None) -> None:
    want = _plain(fresh.to_plotly_json())
    got = _plain(panel.figure.to_plotly_json())
    assert got["layout"] == want["layout"], panel.text()
    assert got["data"] == want["data"], panel.text()
    if sent is not None:
        assert _plain(sent.layout) == want["layout"], f"sent layout differs: {panel.text()}"
        assert _plain(sent.data) == want["data"], f"sent data differs: {panel.text()}"


def _lab02_figure(s_max: int, prompt: int = 512, output: int = 128):
    budget = ledger.kv_budget_bytes(LECTURE_7B, LECTURE_GPU)
    alloc = fragmentation.fill_reserve_to_max(budget, s_max, prompt + output, LECTURE_7B.kv_bytes_per_token)
    return memory.slot_stack_figure(alloc, budget)


def _banner(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations if "no slot fits" in (a.text or "")]


def test_s_max_panel_across_its_edge_and_back_equals_a_fresh_figure():
    # the lecture's card, named: its edge is the lecture's (the board had this panel too; it now stages fixed
    # pictures, issue 28)
    panel = memory.naive_panel(model=LECTURE_7B.name, gpu=LECTURE_GPU.name)
    assert isinstance(panel, memory.Panel)
    sent = SentState(panel.figure)
    # 131,072 x 524,288 B = 68.7 GB per slot > the 62.52 GB budget: no slot, the banner
    for s_max, slots, banner in ((131_072, 0, True), (512, 232, False), (131_072, 0, True), (4096, 29, False)):
        panel.controls["s_max"].value = s_max
        assert ledger.naive_concurrency(ledger.kv_budget_bytes(LECTURE_7B, LECTURE_GPU), s_max,
                                        LECTURE_7B.kv_bytes_per_token) == slots  # 62.52e9 // (512 x 524,288) = 232
        assert bool(_banner(panel.figure)) == banner, (s_max, _banner(panel.figure))
        assert_shows(panel, _lab02_figure(s_max), sent)
    assert f"{232:,} slots" not in panel.figure.layout.title.text


def _default_panels():
    """Every `*_panel` of the viz modules that builds with its defaults."""
    out = []
    for module in (roofline, memory, kernel, sharing, engine, slo):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.endswith("_panel") and fn.__module__ == module.__name__ and all(
                    p.default is not p.empty for p in inspect.signature(fn).parameters.values()):
                out.append(pytest.param(fn, id=f"{module.__name__.rsplit('.', 1)[1]}.{name}"))
    return out


def _extremes(control) -> list:
    """Each end of a control's range, then its first value again."""
    start = control.value
    if hasattr(control, "options"):
        values = [v[1] if isinstance(v, tuple) else v for v in control.options]
        return [values[0], values[-1], start]
    return [control.min, control.max, start]


@pytest.mark.parametrize("make", _default_panels())
def test_every_panel_after_each_move_equals_a_fresh_figure(make):
    panel = make()
    sent = SentState(panel.figure)
    slow = getattr(next(iter(panel.controls.values())), "continuous_update", True) is False
    for name, control in panel.controls.items():
        for value in _extremes(control)[1:] if slow else _extremes(control):
            control.value = value
            if panel.error:  # a rejected setting keeps the last figure: compare with the last good values
                continue
            assert_shows(panel, panel._make_figure(**panel.values), sent)


def test_block_table_explorer_redraws_like_a_fresh_figure():
    board = memory.block_table_explorer()
    sent = SentState(board.figure)
    for action in ("grow A", "grow B", "free A", "grow B", "reset"):
        board.step(action)
        assert_shows(board, board._figure(), sent)


# --- the static copy beside each panel (item 7) ------------------------------------------------------

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def published(monkeypatch):
    """Every output a panel publishes, as (bundle, display id, is an update), in order."""
    out = []
    monkeypatch.setattr(reopen, "_publish", lambda bundle, display_id=None, update=False:
                        out.append((copy.deepcopy(bundle), display_id, update)))
    return out


def test_a_panel_leaves_a_static_copy_that_follows_its_slider(published):
    panel = memory.naive_panel(model=LECTURE_7B.name, gpu=LECTURE_GPU.name)  # the lecture's 29 and 232 slots
    panel._ipython_display_()
    (widget, _, _), (note, note_id, _), (fig, fig_id, _) = published
    assert WIDGET_VIEW in widget and "s_max=4,096" in widget["text/plain"]
    assert reopen.RUN_LINE in note["text/html"] and "s_max=4,096" in note["text/plain"]
    assert WIDGET_VIEW not in note and WIDGET_VIEW not in fig
    assert note_id and fig_id and note_id != fig_id
    assert _plain(fig[reopen.PLOTLY_MIME]["data"]) == _plain(_lab02_figure(4096).to_plotly_json())["data"]
    assert "uid" not in json.dumps(fig[reopen.PLOTLY_MIME])  # random per run: strict nbval would differ
    del published[:]
    panel.controls["s_max"].value = 512
    updates = {display_id: bundle for bundle, display_id, update in published if update}
    assert set(updates) == {note_id, fig_id}
    want = _plain(_lab02_figure(512).to_plotly_json())
    got = updates[fig_id][reopen.PLOTLY_MIME]
    assert _plain(got["layout"]) == want["layout"] and _plain(got["data"]) == want["data"]
    assert "s_max=512," in updates[note_id]["text/plain"]
    assert f"{232:,} slots" in got["layout"]["title"]["text"]  # 62.52e9 // (512 x 524,288 B) = 232
    assert not any("no slot fits" in a.get("text", "") for a in got["layout"].get("annotations", []))


def test_a_copy_is_the_same_on_every_run():
    a, b = reopen.figure_bundle(_lab02_figure(512)), reopen.figure_bundle(_lab02_figure(512))
    assert a == b  # strict nbval of the executed solutions compares these outputs
    assert a != reopen.figure_bundle(_lab02_figure(4096))
    assert reopen.PLOTLY_CDN in a["text/html"] and len(a["text/html"]) < 20_000  # plotly.js itself is not embedded


def test_a_rejected_setting_leaves_the_copy_as_it_was(published):
    panel = sharing.fanout_panel()
    panel._ipython_display_()
    before = published[-1][0]
    del published[:]
    control = next(c for c in panel.controls.values() if hasattr(c, "max"))
    panel._make_figure = lambda **_: (_ for _ in ()).throw(ValueError("no"))
    control.value = control.max
    assert panel.error and not published
    assert panel.copy.bundle == before


def test_a_figure_view_is_plain_plotly_output():
    view = slo.FigureView(_lab02_figure(512), "232 slots")
    bundle = view._repr_mimebundle_()
    assert WIDGET_VIEW not in bundle and bundle["text/plain"] == "232 slots"
    assert _plain(bundle[reopen.PLOTLY_MIME]["layout"]) == _plain(_lab02_figure(512).to_plotly_json())["layout"]


def test_the_board_leaves_its_first_segment_header_picture_and_question(published):
    """A board reopened without a kernel shows 0–6 as the room first sees it: header, picture, question."""
    Board()._ipython_display_()
    kinds = [(WIDGET_VIEW in b, reopen.PLOTLY_MIME in b) for b, _, _ in published]
    # the live board, the note, then its three copies: the header, the five-jobs picture, the question
    assert kinds == [(True, False), (False, False), (False, False), (False, True), (False, False)]
    assert f"{reopen.NOTE_CLASS}-3" in published[1][0]["text/html"]  # it hides the three copies after it when live
    assert published[2][0]["text/plain"].startswith("0–6 min")
    assert published[4][0]["text/plain"] == segment_view(0).segment.ask and published[4][0]["text/plain"]
