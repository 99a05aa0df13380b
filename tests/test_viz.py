"""labsupport.viz: pure figures with the lecture's numbers, panels that react, one palette and unit style.

Bar heights are checked against hand arithmetic: 989 TFLOP/s / 3,350 GB/s = 295.2; 62.52 GB of KV
budget over 2,147,483,648 B slots = 29; over 17,179,869,184 B (32K) = 3.
"""
from __future__ import annotations

import plotly.graph_objects as go
import pytest

from labsupport import card, viz
from labsupport.specs import GPUS, LECTURE_7B, LECTURE_7B_GQA8, LECTURE_GPU, LLAMA3_70B
from labsupport.viz import roofline

RIDGE_H100 = 989e12 / 3350e9


def test_batch_gap_figure_has_the_lectures_bars():
    fig = roofline.batch_gap_figure(LECTURE_7B, LECTURE_GPU, 4096)
    assert isinstance(fig, go.Figure)
    (bar,) = fig.data
    assert list(bar.y) == [pytest.approx(RIDGE_H100), 29]
    assert list(bar.marker.color) == [viz.PALETTE["compute"], viz.PALETTE["memory"]]
    assert "gap ×10.2" in fig.layout.annotations[0].text  # 295.2 / 29
    assert list(roofline.batch_gap_figure(LECTURE_7B, LECTURE_GPU, 32_768).data[0].y)[1] == 3
    assert list(roofline.batch_gap_figure(LECTURE_7B_GQA8, LECTURE_GPU, 4096).data[0].y)[1] == 116  # 62.52e9 // 536,870,912


def test_batch_gap_figure_when_the_weights_do_not_fit():
    fig = roofline.batch_gap_figure(LLAMA3_70B, GPUS["h100"], 4096)  # 141.2 GB of weights on an 80 GB card
    assert list(fig.data[0].y)[1] == 0
    assert "overflow" in fig.layout.annotations[0].text


def test_roofline_figure_marks_ridge_and_memory_wall():
    fig = roofline.decode_roofline_figure(LECTURE_7B, LECTURE_GPU, 4096)
    (line,) = fig.data
    assert max(line.y) == pytest.approx(989)  # TFLOP/s, flat above the ridge
    assert line.y[0] == pytest.approx(2 * 3350e9 / 2 / 1e12)  # B = 1: 2 B / b FLOP per byte x 3.35 TB/s
    xs = sorted(shape.x0 for shape in fig.layout.shapes)
    assert xs == [pytest.approx(29), pytest.approx(29), pytest.approx(RIDGE_H100)]  # wall line, shaded region, ridge


def test_template_is_projector_sized_and_uses_the_palette():
    fig = roofline.batch_gap_figure(LECTURE_7B, LECTURE_GPU, 4096)
    template = fig.layout.template.layout
    assert template.font.size >= 16 and template.title.font.size >= 20
    assert list(template.colorway)[:2] == [viz.PALETTE["compute"], viz.PALETTE["memory"]]
    assert len(set(viz.PALETTE.values())) == len(viz.PALETTE)  # one colour, one meaning


def test_units_are_labelled():
    assert viz.in_unit(2**31, "GiB") == 2
    assert viz.in_unit(2_147_483_648, "GB") == pytest.approx(2.147483648)
    assert viz.bytes_axis_title("KV budget", "GB") == "KV budget (GB; 1 GB = 10⁹ B)"
    assert "2³⁰" in viz.bytes_axis_title("slot", "GiB")
    assert viz.bytes_axis_title("KV per token", "KiB", note=False) == "KV per token (KiB)"
    with pytest.raises(ValueError, match="unknown byte unit"):
        viz.in_unit(1, "gigs")


def _memory_batch(model, gpu, s_max):
    """§10.2 by hand: (HBM - weights - 4 GB reserve) // (S_max x 2 L n_kv d_head b)."""
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    budget = gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4e9
    return int(budget // (s_max * kv_per_token))


def test_panel_reacts_to_its_controls():
    C = card.card()  # the panel opens on the course card (29 on the lecture's: 62.52e9 // 2,147,483,648)
    panel = roofline.batch_gap_panel()
    assert set(panel.controls) == {"gpu", "model", "s_max"}
    assert isinstance(panel.figure, go.FigureWidget)
    assert list(panel.figure.data[0].y)[1] == _memory_batch(C.model, C.gpu, 4096)
    before = panel.text()
    panel.controls["s_max"].value = 32_768  # the lecture's card: 3
    assert list(panel.figure.data[0].y)[1] == _memory_batch(C.model, C.gpu, 32_768)
    assert f"memory permits B = {_memory_batch(C.model, C.gpu, 32_768):,}:" in panel.text() and panel.text() != before
    panel.controls["model"].value = C.contrast.name  # lecture-7b-gqa8: 62.52e9 // (32,768 x 131,072 B) = 14
    assert C.contrast.num_kv_heads != C.model.num_kv_heads
    assert list(panel.figure.data[0].y)[1] == _memory_batch(C.contrast, C.gpu, 32_768)
    other = "h200" if C.gpu.name != "h200" else "h100-sxm-80gb"
    panel.controls["gpu"].value = other  # the ridge: 989 / 4,800 x 2 / 2 = 206.0 on an H200
    assert list(panel.figure.data[0].y)[0] == pytest.approx(GPUS[other].peak_flops / GPUS[other].hbm_bandwidth
                                                           * C.contrast.dtype_bytes / 2)
    assert list(panel.figure.data[0].y)[1] == _memory_batch(C.contrast, GPUS[other], 32_768)
    assert other in panel.figure.layout.title.text
    assert panel.updates == 3


def test_panel_reacts_to_its_controls_on_the_lectures_card():
    panel = roofline.batch_gap_panel(model="lecture-7b", gpu="h100-sxm-80gb")
    assert list(panel.figure.data[0].y) == [pytest.approx(RIDGE_H100), 29]
    panel.controls["s_max"].value = 32_768
    assert list(panel.figure.data[0].y)[1] == 3 and "memory permits B = 3:" in panel.text()
    panel.controls["model"].value = "lecture-7b-gqa8"  # 62.52e9 // (32,768 x 131,072 B) = 14
    assert list(panel.figure.data[0].y)[1] == 14


def test_panel_text_is_deterministic_and_is_its_plain_repr():
    C = card.card()
    a, b = roofline.batch_gap_panel(), roofline.batch_gap_panel()
    assert a.text() == b.text()
    assert a.text().splitlines()[0].endswith(f"[gpu={C.gpu.name}, model={C.model.name}, s_max=4,096]")
    bundle = a._repr_mimebundle_()
    assert bundle["text/plain"] == a.text()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == a.widget.model_id
    assert "uid" not in bundle["text/plain"]


def test_panel_shows_rejected_input_in_its_readout_and_keeps_the_figure():
    # the panel's default is the course card's model as MHA; KiB per token by hand, 2 x L x n_kv x d x b / 1,024:
    # 512 KiB with all 32 heads and 128 KiB with the GQA form's 8 on the lecture's card (392 and 56 on Qwen2.5-7B's
    # 28 heads and 4 KV heads)
    m, gqa = card.card().mha, card.card().gqa.num_kv_heads
    heads = m.num_heads

    def kib(num_kv_heads):
        return 2 * m.num_layers * num_kv_heads * m.head_dim * m.dtype_bytes / 1024

    panel = roofline.kv_heads_panel()
    assert list(panel.figure.data[0].y) == [kib(heads), kib(heads)]  # KiB per token, MHA
    panel.controls["num_kv_heads"].value = gqa
    assert list(panel.figure.data[0].y) == [kib(heads), kib(gqa)]
    assert f"{round(kib(gqa) * 1024):,} B = {kib(gqa):,.0f} KiB" in panel.text()  # "131,072 B = 128 KiB"

    def figure(num_kv_heads):
        return roofline.kv_heads_figure(num_kv_heads)

    import ipywidgets as widgets

    picky = viz.Panel(figure, {"num_kv_heads": widgets.IntSlider(value=gqa, min=1, max=heads)}, title="t")
    picky.controls["num_kv_heads"].value = next(k for k in range(2, heads) if heads % k)  # 3 divides no 32 or 28 heads
    assert picky.error is not None and "must divide" in picky.text()
    assert "must divide" in picky.readout.value
    assert list(picky.figure.data[0].y) == [kib(heads), kib(gqa)]  # the figure of the last good value stays
    picky.controls["num_kv_heads"].value = heads // 2
    assert picky.error is None and list(picky.figure.data[0].y) == [kib(heads), kib(heads // 2)]


def test_patch_figure_replaces_traces_of_another_kind():
    target = go.FigureWidget(go.Bar(x=[1, 2], y=[3, 4]))
    viz.patch_figure(target, go.Figure([go.Scatter(x=[1], y=[9]), go.Scatter(x=[2], y=[8])]))
    assert [t.type for t in target.data] == ["scatter", "scatter"]
    assert list(target.data[1].y) == [8]


def test_panel_needs_a_control():
    with pytest.raises(ValueError, match="at least one control"):
        viz.Panel(lambda: go.Figure(), {})


def test_errata_note_quotes_printed_and_exact():
    text = viz.errata_markdown("Paged concurrency").data
    assert "*199 (6.9x over 29)*" in text and "**186" in text
    with pytest.raises(ValueError, match="no erratum or convention matches"):
        viz.errata_markdown("no such quantity")


def test_intensity_figure_flattens_below_the_ridge():
    fig = roofline.intensity_figure(LECTURE_7B, LECTURE_GPU, seq_lengths=(0, 640))
    weights_only, with_kv = fig.data
    b = weights_only.x[-1]
    assert weights_only.y[-1] == pytest.approx(2 * b / 2)  # Lecture 2: 2B / b FLOP per byte, bf16
    # 640-token MHA sequences: (2N + 4LHdS) / (W/B + S kv) tends to 41.2, far below the 295 ridge
    assert with_kv.y[-1] < (2 * 6.74e9 + 524_288 * 640) / (640 * 524_288) < 989e12 / 3350e9
    assert max(with_kv.y) == with_kv.y[-1]


# --- layout rules: nothing clipped, nothing colliding, nothing squeezed ----------------------------

def test_long_titles_wrap_at_spaces_and_keep_expressions_whole():
    title = "lecture-7b on h100-sxm-80gb, link 32 GB/s: recompute wins at 4,096 tokens (b = 16)"
    wrapped = viz.wrap_title(title)
    lines = wrapped.split("<br>")
    assert len(lines) == 2 and all(len(line) <= viz.TITLE_LINE_CHARS for line in lines)
    assert " ".join(lines) == title and "b = 16" in lines[-1]
    assert viz.wrap_title("short") == "short"
    assert viz.wrap_title("kept<br><sup>as the author wrote it, however long this line happens to be</sup>") \
        .count("<br>") == 1


def test_styled_makes_room_for_wrapped_titles_and_legends_below():
    fig = go.Figure([go.Scatter(x=[1], y=[1], name=f"series number {i}") for i in range(6)])
    viz.styled(fig, "x" * 30 + " " + "y" * 30, legend=dict(orientation="h", y=-0.3, x=0))
    assert fig.layout.margin.t == viz.TEMPLATE.layout.margin.t + 30  # one extra title line
    assert (fig.layout.legend.yref, fig.layout.legend.y, fig.layout.legend.yanchor) == ("container", 0, "bottom")
    rows = viz.legend_rows([f"series number {i}" for i in range(6)])  # 6 x (50 + 9 x 15) = 1,110 px in 600
    assert rows == 2
    assert fig.layout.margin.b >= viz.AXIS_BAND_PX + viz.LEGEND_ROW_PX * rows
    plain = viz.styled(go.Figure(go.Bar(x=[1], y=[1])), "short")
    assert plain.layout.margin.t is None and plain.layout.legend.yref is None  # the template's, untouched


def test_panel_controls_wrap_rather_than_shrink():
    panel = roofline.batch_gap_panel()
    row = panel.widget.children[1]
    assert row.layout.flex_flow == "row wrap" and "lab-controls" in row._dom_classes
    for control in panel.controls.values():
        assert control.layout.width == "auto"  # natural size: the CSS gives every track its width
    assert f"min-width: {viz.SLIDER_TRACK_PX}px" in panel.widget.children[0].value
    assert viz.SLIDER_TRACK_PX >= 200
    assert viz.number_slider("rate (req/s)", 5, 1, 10, 1, integer=True).layout.width == "auto"
