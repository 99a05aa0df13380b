"""Chart text contrast and text alternatives (labsupport.viz.a11y; WCAG 2.1 AA, issue 21 item 8).

Expected ratios are WCAG's formula worked by hand or published values, not the module's output:
black on white is 21:1, #767676 on white is the well-known 4.54:1 grey, and the issue's measurements
of the Okabe–Ito colours on white (2.25, 2.31, 3.42, 3.87).
"""
from __future__ import annotations

import plotly.graph_objects as go
import pytest

from labsupport import viz
from labsupport.viz import PALETTE, a11y


@pytest.mark.parametrize("fg, bg, ratio", [("#000000", "#FFFFFF", 21.0), ("white", "white", 1.0),
                                           ("#767676", "#FFFFFF", 4.54), ("#E69F00", "white", 2.25),
                                           ("#56B4E9", "white", 2.31), ("#009E73", "white", 3.42),
                                           ("#D55E00", "white", 3.87), ("rgb(0, 0, 0)", "#FFF", 21.0)])
def test_contrast_is_wcags(fg, bg, ratio):
    assert a11y.contrast(fg, bg) == pytest.approx(ratio, abs=0.01)


@pytest.mark.parametrize("key", sorted(PALETTE))
def test_ink_keeps_the_hue_and_reaches_4_5(key):
    colour = PALETTE[key]
    text = a11y.ink(colour)
    assert a11y.contrast(text, "white") >= 4.5
    if a11y.contrast(colour, "white") >= 4.5:
        assert text == colour  # a colour that reads is left alone
    else:  # darker, same hue: every channel scaled toward black by one factor
        (r, g, b), (r2, g2, b2) = a11y.rgb(colour), a11y.rgb(text)
        assert r2 <= r and g2 <= g and b2 <= b and max(r2, g2, b2) < max(r, g, b)
        factors = [c2 / c for c, c2 in ((r, r2), (g, g2), (b, b2)) if c > 40]
        assert max(factors) - min(factors) < 0.03


def test_large_text_needs_three():
    assert a11y.needed(24) == 3 and a11y.needed(18, bold=False) == 4.5 and a11y.needed(19, bold=True) == 3
    assert a11y.contrast(a11y.ink(PALETTE["waste"], ratio=3), "white") >= 3


def _figure():
    fig = go.Figure([go.Bar(x=["a", "b"], y=[3, 4], text=["3", "4"], textposition="inside", name="held",
                            marker_color=[PALETTE["used"], PALETTE["compute"]], textfont=dict(color="white")),
                     go.Bar(x=["a", "b"], y=[1, 2], text=["1", "2"], textposition="outside", name="reserved",
                            marker_color=PALETTE["waste"], textfont=dict(color=PALETTE["waste"])),
                     go.Scatter(x=[0], y=[1], mode="markers+text", text=["x"], textfont=dict(color=PALETTE["link"]))])
    fig.add_annotation(x=0, y=0, text="a note", font=dict(color=PALETTE["waste"], size=18))
    fig.add_annotation(x=0, y=1, text="<b>big</b>", font=dict(color=PALETTE["memory"], size=28))
    fig.update_layout(yaxis=dict(color=PALETTE["memory"], title="refused"))
    return viz.styled(fig, "Reserved memory is never filled")


def test_styled_figures_have_legible_text():
    fig = _figure()
    inside = fig.data[0].insidetextfont.color
    # white on the green bar is 3.42:1; near-black reads there, white still reads on the blue one
    assert a11y.contrast(inside[0], PALETTE["used"]) >= 4.5 and inside[1] == "white"
    assert a11y.contrast(fig.data[1].outsidetextfont.color, "white") >= 4.5
    assert a11y.contrast(fig.data[2].textfont.color, "white") >= 4.5
    small, big = fig.layout.annotations
    assert a11y.contrast(small.font.color, "white") >= 4.5
    assert big.font.color == PALETTE["memory"]  # 28 px is large text: 3.87:1 passes as it is
    assert a11y.contrast(fig.layout.yaxis.color, "white") >= 4.5
    assert fig.data[1].marker.color == PALETTE["waste"]  # marks keep the palette


def test_every_styled_figure_has_a_one_sentence_alternative():
    alt = _figure().layout.meta["alt"]
    assert alt.startswith("Reserved memory is never filled.") and "bar chart" in alt
    assert "refused" in alt and "held, reserved" in alt and "<" not in alt


def test_a_panel_carries_the_namer_and_its_alternative_follows_a_redraw():
    def make(n):
        return viz.styled(go.Figure(go.Bar(x=[1], y=[n])), f"{n} blocks in use")

    panel = viz.Panel(make, {"n": viz.number_slider("blocks (count)", 3, 1, 9, 1, integer=True)})
    assert any(type(w).__name__ == "Namer" for w in panel.widget.children)
    assert panel.figure.layout.meta["alt"].startswith("3 blocks in use.")
    panel.controls["n"].value = 7
    assert panel.figure.layout.meta["alt"].startswith("7 blocks in use.")


def test_the_timeline_states_read_without_colour():
    from labsupport.viz import engine

    done, absent = engine.PHASE_COLOURS["done"], engine.PHASE_COLOURS["not here"]
    assert a11y.contrast(done, absent) >= 3  # WCAG 1.4.11: graphics that carry meaning
    assert all(engine.PHASE_MARKS[p] for p in ("waiting", "preempted"))  # a glyph, not only a colour


def test_text_on_a_shaded_band_reads_on_the_band():
    fig = go.Figure(go.Scatter(x=[0, 10], y=[0, 1]))
    fig.add_vrect(x0=5, x1=10, fillcolor=PALETTE["memory"], opacity=0.12, line_width=0)
    fig.add_annotation(x=7, y=0.5, text="ridge B = 295", font=dict(color=PALETTE["compute"], size=18))
    fig = viz.styled(fig, "A band")
    band = a11y.over(PALETTE["memory"], 0.12, "#FFFFFF")  # 12% of #D55E00 over white: #FAECE0, by hand
    assert band == "#FAECE0"
    assert a11y.contrast(PALETTE["compute"], band) < 4.5  # 4.47:1, as Chromium measured it
    assert a11y.contrast(fig.layout.annotations[0].font.color, band) >= 4.5


def test_a_static_figure_view_carries_the_namer_too():
    from labsupport.viz import slo

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    view = slo.FigureView(viz.styled(go.Figure(go.Bar(x=[1], y=[2])), "One bar"), "one bar")
    InteractiveShell.instance()
    with capture_output() as shown:
        view._ipython_display_()
    namer, figure = (o.data for o in shown.outputs)
    assert namer["application/vnd.jupyter.widget-view+json"]["model_id"] == a11y.namer().model_id
    assert figure["application/vnd.plotly.v1+json"]["layout"]["meta"]["alt"].startswith("One bar.")
    assert figure["text/plain"] == "one bar"


def test_text_on_a_stacked_area_reads_on_its_default_half_opacity_fill():
    fig = go.Figure(go.Scatter(x=[0, 10], y=[5, 5], stackgroup="t", line=dict(color=PALETTE["compute"], width=0)))
    fig.add_annotation(x=5, y=0.02, yref="paper", text="memory ceiling 186", font=dict(color=PALETTE["memory"]))
    fig = viz.styled(fig, "An area")
    area = a11y.over(PALETTE["compute"], 0.5, "white")  # #80B9D9: half of #0072B2 over white, by hand
    assert area == "#80B9D9"
    assert a11y.contrast(fig.layout.annotations[0].font.color, area) >= 4.5
