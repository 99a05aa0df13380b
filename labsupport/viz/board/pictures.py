"""The board's pictures: one figure per segment of Lecture 10's timing plan (lab 99, §10.1–§10.6).

`picture(index, step, data)` draws segment `index` with `step` of its results revealed: §10.1's five jobs,
§10.2's slots on two axes, §10.3's block tables from a real allocator (then the exact-beside-printed pairs
and the block-size table), §10.4's shared blocks and their refcounts, §10.5's engine loop and a preempted
sequence's stall, §10.6's TTFT terms and three operating points; §10.7's is the map's table
(`labsupport.viz.board.map`).  `swap_recompute_figure` is §10.5's derivation for the labs.  Every number is
the course card's (`labsupport.viz.board.segments`); every text is at least `BOARD_PX` design pixels, for the
back row.
"""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from labsupport import card, ledger
from labsupport.slo import TTFTSplit
from labsupport.specs import GB
from labsupport.viz import FONT_SIZE, PALETTE, TITLE_SIZE, styled
from labsupport.viz.board.map import map_html
from labsupport.viz.board.segments import FLAG, _numbers, _roofline_step, operating_points

# Sizes for the back row.  Chart text is set in design pixels and scaled with its chart (fit_width): 22 px reads
# 18.6 px in the narrowest output area (592 px, a 0.85 scale) and about 40 px at 1920, at least 3/4 of the HTML
# text beside it (`labsupport.viz.board.views`).
BOARD_PX = 22
PICTURE_HEIGHT = 420  # design pixels until the page has measured its screen; then the deck fits it (`fit`)
PICTURE_RANGE = (220, 1200)  # a fitted picture stays between these (design pixels)


# --- the pictures: one function per segment, `step` = how many results are revealed -----------------
#
# Every picture takes the height the deck measured for it (`height`, design pixels: the screen left under
# the question and the results, divided by the chart's scale), so a chart is as tall as the screen allows.
# Every label sits inside the plot area (axis ranges leave room for text drawn outside a bar) or in the
# results under the chart, and each element is drawn from its own reveal on.

def board_sized(fig: go.Figure, px: int = BOARD_PX) -> go.Figure:
    """Every text of `fig` at least `px` design pixels (the labs' figures draw some at 16-18)."""
    spec = fig.to_dict()

    def raise_fonts(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("font", "textfont", "tickfont") and isinstance(value, dict):
                    value["size"] = max(px, value.get("size") or px)
                raise_fonts(value)
        elif isinstance(node, list):
            for item in node:
                raise_fonts(item)

    raise_fonts(spec)
    spec["layout"].setdefault("font", {})["size"] = max(px, spec["layout"].get("font", {}).get("size") or px)
    return go.Figure(spec)


def _board(fig: go.Figure, title: str, height: int, **layout) -> go.Figure:
    fig = styled(fig, title, height=height, **layout)
    fig.update_layout(uniformtext=dict(minsize=BOARD_PX, mode="show"))  # plotly shrinks bar text that is tight
    return board_sized(fig)


def _note(fig: go.Figure, x: float, y: float, text: str, colour: str = "#222222", **kw) -> None:
    fig.add_annotation(x=x, y=y, xref="paper", yref="paper", text=text, showarrow=False,
                       font=dict(size=BOARD_PX, color=colour), **kw)


def _flagged(value: str, printed: str) -> str:
    """A chart label: the exact figure, the lecture's print under it."""
    return f'{value}<br><span style="color:#B34700">({FLAG}: {printed})</span>'


def five_jobs_figure(step: int = 0, height: int = PICTURE_HEIGHT) -> go.Figure:
    """§10.1's board: the five verbs in a column, the resource each contends for, memory circled twice;
    revealed: Admit, the one the engine cannot take back."""
    r = _numbers()
    jobs = [("Admit", "memory — a promise of KV space", True), ("Allocate", "memory — the KV space itself", True),
            ("Batch", "the next forward pass", False), ("Run", "arithmetic (and HBM bandwidth)", False),
            ("Stream", "user-visible per-step latency", False)]
    fig = go.Figure()
    for i, (verb, resource, memory) in enumerate(jobs):
        y = len(jobs) - i
        fig.add_annotation(x=0.03, y=y, text=f"<b>{verb}</b>", showarrow=False, xanchor="left",
                           font=dict(size=TITLE_SIZE + 2))
        fig.add_annotation(x=0.3, y=y, text=resource, showarrow=False, xanchor="left",
                           font=dict(size=BOARD_PX, color=PALETTE["memory"] if memory else "#222222"))
        if memory:
            fig.add_shape(type="circle", x0=0.27, x1=0.93, y0=y - 0.45, y1=y + 0.45,
                          line=dict(color=PALETTE["memory"], width=4))
    if step >= 1:  # the box and its words stay inside the plot: y runs to len(jobs) + 1
        fig.add_shape(type="rect", x0=0.0, x1=0.97, y0=len(jobs) - 0.48, y1=len(jobs) + 0.48,
                      line=dict(color=PALETTE["limit"], width=5))
        fig.add_annotation(x=0.97, y=len(jobs) + 0.5, text="<b>cannot be taken back</b>", showarrow=False,
                           xanchor="right", yanchor="bottom", font=dict(size=BOARD_PX, color=PALETTE["limit"]))
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0.45, len(jobs) + 1.1])
    return _board(fig, f"Memory permits {r['naive_concurrency']}, the machine wants {r['ridge_batch']:.0f}: "
                       "an engine's five jobs", height, showlegend=False, margin=dict(l=10, r=10, t=80, b=10))


def _slot_bars(fig: go.Figure, col: int, name: str, used: float, slot: float, n: int, text: str = "",
               inside: bool = True) -> None:
    """`n` slots of `slot` side by side on one row of panel `col`, each with `used` of it filled; `text`
    on the empty part (inside it when it is long, else after its end), never shrunk."""
    xs = [k * slot for k in range(n)]
    for base, width, colour, label in ((xs, used, PALETTE["used"], ""),
                                       ([x + used for x in xs], slot - used, PALETTE["waste"], text)):
        fig.add_trace(go.Bar(y=[name] * n, x=[width] * n, base=base, orientation="h", showlegend=False,
                             marker=dict(color=colour, line=dict(color="white", width=1 if n > 1 else 0)),
                             text=[label] * n if label else None, textposition="inside" if inside else "outside",
                             insidetextanchor="middle", constraintext="none", textangle=0, cliponaxis=False,
                             hoverinfo="skip"), row=1, col=col)


def naive_figure(step: int = 0, height: int = PICTURE_HEIGHT, s_max: int | None = None) -> go.Figure:
    """§10.2's board on two axes, each drawn where it is shown: one slot in tokens (640 used), and the
    slots side by side in the GB of the budget; revealed at step 3 (or moved by the S_max slider), the
    long-context slot beside the 4,096-token one on both axes."""
    from plotly.subplots import make_subplots

    r = _numbers()
    kv, budget, seq = r["kv_bytes_per_token"], r["kv_budget_bytes"], r["seq_tokens"]
    base = r["s_max"]
    big = s_max or (32_768 if step >= 3 else None)
    sizes = [base] + ([big] if big else [])
    # side by side, so each panel has the picture's whole height (stacked, the slot's panel was 8% of a
    # 768 px screen in JupyterLab)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.38, 0.62], horizontal_spacing=0.17)
    for s in sizes:  # a slot much shorter than the axis is labelled after its end, where the axis is empty
        _slot_bars(fig, 1, f"a {s // 1024}K slot", seq, s, 1, f"{s - seq:,} empty",
                   inside=s >= 0.5 * max(sizes))
    for s in sizes:
        n = ledger.naive_concurrency(budget, s, kv)
        name = f"{n} × {s // 1024}K"
        _slot_bars(fig, 2, name, seq * kv / GB, s * kv / GB, n)
        if n == 0:  # the slot is larger than the whole budget: its row stays (an empty bar), and says so
            fig.add_trace(go.Bar(y=[name], x=[0], orientation="h", showlegend=False, hoverinfo="skip"), row=1, col=2)
            fig.add_annotation(x=0, y=name, xref="x2", yref="y2", xanchor="left", showarrow=False,
                               text=f"one slot is {s * kv / GB:.2f} GB: none fits", font=dict(color=PALETTE["memory"]))
    fig.add_vline(x=budget / GB, line=dict(color=PALETTE["limit"], width=3), row=1, col=2)
    fig.update_xaxes(range=[0, max(sizes) * 1.02], tickvals=sizes, ticktext=[f"{s // 1024}K" for s in sizes],
                     title_text="tokens", title_standoff=2, row=1, col=1)
    fig.update_xaxes(range=[0, budget / GB * 1.02], ticksuffix=" GB", nticks=4, row=1, col=2)
    for col in (1, 2):
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    # no title: the rows name themselves, and at 1024 × 768 its line is the panels' last 40 px
    return _board(fig, "", height, barmode="overlay", showlegend=False, bargap=0.2,
                  margin=dict(l=130, r=30, t=20, b=70))


def _pair_figure(title: str, pairs, height: int, shown: int) -> go.Figure:
    """Before → after pairs as horizontal bars (one row each: labels never meet), the lecture's printed
    value under the exact one; the first `shown` panels hold their bars (a panel's bars are its reveal)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(pairs), subplot_titles=[p[0] for p in pairs], horizontal_spacing=0.2)
    for col, (_, unit, exact, printed) in enumerate(pairs, start=1):
        for values, colour, fmt in ((exact, PALETTE["compute"], "{:,.2f}"), (printed, PALETTE["neutral"], "{:,}")):
            visible = col <= shown
            fig.add_trace(go.Bar(y=["naive", "paged"], x=list(values) if visible else [0, 0], orientation="h",
                                 marker_color=colour, showlegend=False, hoverinfo="skip", textposition="outside",
                                 text=[(fmt.format(v) if unit else f"{v:,}") + unit for v in values] if visible else None,
                                 cliponaxis=False), row=1, col=col)
        # room right of the longest bar for its label: the plot area holds every label
        fig.update_xaxes(range=[0, 1.5 * max(*exact, *printed)], visible=False, row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    return _board(fig, title, height, barmode="group", bargap=0.3, margin=dict(l=90, r=20, t=100, b=20))


def block_table_figure(step: int = 0, height: int = PICTURE_HEIGHT):
    """§10.3's board from a real allocator: two sequences, one pool (step 1: A grows a block); then the
    utilization pair (step 2) and the concurrency pair (step 3), exact beside printed; then (step 5) the
    block-size table, in HTML."""
    from labsupport.block_allocator import BlockAllocator
    from labsupport.viz import memory as viz_memory

    r = _numbers()
    if step >= 5:
        return block_size_table_html()
    if step >= 2:
        return _pair_figure("Naive → paged: exact (blue), print (grey)", (
            ("utilization, end of life", "%", (100 * r["naive_utilization"], 100 * r["paged_utilization"]),
             (15.2, 98.7)),
            ("concurrent sequences", "", (r["naive_concurrency"], r["paged_concurrency"]), (29, 199))),
            height, shown=1 if step == 2 else 2)
    alloc = BlockAllocator(12, 4)
    alloc.allocate("A", 8)
    alloc.allocate("B", 5)
    highlight = None
    if step >= 1:
        alloc.append_slot("A")
        highlight = ("A", len(alloc.block_tables["A"]) - 1)
    fig = viz_memory.block_table_figure(alloc, ["A", "B"], highlight=highlight,
                                        title="Two block tables, one physical pool")
    return board_sized(fig.update_layout(height=height, margin=dict(t=110, b=10)))


def block_size_table_html() -> str:
    """§10.3's block-size table, its last two columns included (table entries at 4K, the kernel's run)."""
    r = _numbers()
    head = ("b_blk", "mean tail", f"waste at B = {r['paged_concurrency']}", "table entries at 4K", "contiguous run")
    rows = "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in (
            f"{row.block_size}", f"{row.mean_tail_tokens:g} tokens", f"{100 * row.waste_fraction_of_budget:.2f}%",
            f"{row.table_entries:,}", f"{row.contiguous_run_tokens} token{'s' if row.contiguous_run_tokens > 1 else ''}"))
        + "</tr>" for row in r["block_rows"])
    return ('<div class="board-caption">Block size: tail waste against the table and the kernel\'s run '
            '(mean tail (b−1)/2)</div><table class="board-table"><tr>'
            + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{rows}</table>")


def sharing_figure(step: int = 0, height: int = PICTURE_HEIGHT) -> go.Figure:
    """§10.4's board from a real allocator: eight branches name one prompt's blocks (refcount 8); step 1:
    branch 1 writes a token (a copy: 7 + 1); step 2: the fan-out's bytes, unshared against shared."""
    from labsupport.block_allocator import BlockAllocator
    from labsupport.viz import sharing as viz_sharing

    r = _numbers()
    if step >= 2:
        kv = r["kv_bytes_per_token"]
        unshared, shared = (t * kv / GB for t in r["fanout"])
        fig = go.Figure()
        for values, colour in (((unshared, shared), PALETTE["compute"]), ((17.9, 3.2), PALETTE["neutral"])):
            fig.add_trace(go.Bar(x=["8 branches, unshared", "shared prompt"], y=list(values), showlegend=False,
                                 marker_color=colour, text=[f"{v:.2f} GB" for v in values], textposition="outside",
                                 cliponaxis=False, hoverinfo="skip"))
        return _board(fig, "KV of 8 branches off a 4K prompt (grey: print)", height,
                      barmode="group", yaxis=dict(visible=False, range=[0, 1.35 * max(unshared, 17.9)]),
                      margin=dict(l=20, r=20, t=80, b=50))
    alloc = BlockAllocator(16, 4)
    alloc.allocate("prompt", 10)
    branches = [f"branch {i}" for i in range(1, 9)]
    for b in branches:
        alloc.fork("prompt", b)
    alloc.free("prompt")
    highlight = alloc.append_slot(branches[0]).cow or () if step >= 1 else ()
    fig = viz_sharing.refcount_board_figure(alloc, branches, highlight=highlight,
                                            title="One prompt's blocks, eight branches")
    fig.update_traces(selector=dict(name="blocks"), marker_size=24)
    fig.update_traces(selector=dict(name="sequences"), marker_size=16)
    return board_sized(fig.update_layout(height=height, showlegend=False, margin=dict(t=90, b=10)))


LOOP_VERBS = ("pick the batch", "allocate blocks", "run one pass", "append tokens", "retire the finished",
              "admit arrivals")


def engine_loop_figure(step: int = 0, height: int = PICTURE_HEIGHT) -> go.Figure:
    """§10.5's board: the loop's six verbs in a cycle and the watermark of free blocks; revealed, the
    derivation: the swap round trip, then the recompute (a 4,096-token sequence of the card's model, named by
    its attention: MHA on the lecture's card, GQA-8 on a Llama 3 8B card)."""
    import math

    r = _numbers()
    if step >= 1:
        fig = go.Figure()
        bars = [("swap out + in", 1e3 * r["swap_round_trip_s"], PALETTE["link"])]
        if step >= 2:
            bars.append(("recompute", 1e3 * r["recompute_s"], PALETTE["recompute"]))
        for name, ms, colour in bars:
            fig.add_trace(go.Bar(y=[name], x=[ms], orientation="h", marker_color=colour, text=[f"{ms:.1f} ms"],
                                 textposition="outside", cliponaxis=False, showlegend=False, hoverinfo="skip"))
        # the x range leaves room for the longest bar's label inside the plot
        title = f"A preempted {r['s_max']:,}-token {card.model().attention} sequence: its stall"
        return _board(fig, title, height,
                      xaxis=dict(ticksuffix=" ms", range=[0, 1.4e3 * max(r["swap_round_trip_s"], r["recompute_s"])]),
                      yaxis=dict(categoryorder="array", categoryarray=[b[0] for b in bars][::-1]),
                      margin=dict(l=190, r=30, t=70, b=50))
    fig = go.Figure()
    n = len(LOOP_VERBS)
    pts = [(0.33 + 0.25 * math.sin(2 * math.pi * k / n), 0.5 + 0.38 * math.cos(2 * math.pi * k / n)) for k in range(n)]
    for k, ((x, y), verb) in enumerate(zip(pts, LOOP_VERBS)):
        nx, ny = pts[(k + 1) % n]
        fig.add_annotation(x=nx, y=ny, ax=x, ay=y, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=3, arrowwidth=2, arrowcolor="#BBBBBB", standoff=26,
                           startstandoff=26, text="")
        _note(fig, x, y, f"<b>{verb}</b>", bgcolor="white")
    # the watermark: a column of the card's blocks, the free ones kept above a line admission respects
    fig.add_shape(type="rect", xref="paper", yref="paper", x0=0.68, x1=0.76, y0=0.05, y1=0.88,
                  line=dict(color="#444444"), fillcolor=PALETTE["used"])
    fig.add_shape(type="rect", xref="paper", yref="paper", x0=0.68, x1=0.76, y0=0.72, y1=0.88,
                  line=dict(color="#444444"), fillcolor="white")
    fig.add_shape(type="line", xref="paper", yref="paper", x0=0.65, x1=0.79, y0=0.72, y1=0.72,
                  line=dict(color=PALETTE["memory"], width=4, dash="dash"))
    _note(fig, 0.72, 0.9, "blocks", yanchor="bottom")
    _note(fig, 0.8, 0.72, "watermark", xanchor="left", colour=PALETTE["memory"])
    _note(fig, 0.8, 0.4, _flagged(f"{r['paged_concurrency']} sequences", "199"), xanchor="left")
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0, 1])
    return _board(fig, "The engine loop, every iteration; a watermark of free blocks", height,
                  margin=dict(l=10, r=10, t=70, b=10))


def slo_figure(step: int = 0, splits: Sequence[TTFTSplit] = (), height: int = PICTURE_HEIGHT,
               tpot_slo_s: float | None = None, rate: str = "") -> go.Figure:
    """§10.6's board on two panels: a 4K prompt's TTFT as its three terms (queueing biggest), and the three
    operating points (naive, the memory ceiling, the SLO-bound batch), each named with its batch.  Revealed:
    their TPOT and throughput; the SLO line, the middle column's goodput 0; the batch to deploy.  The TPOT
    SLO slider moves the line and the SLO-bound batch (`tpot_slo_s`)."""
    from plotly.subplots import make_subplots

    r = _numbers()
    slo = tpot_slo_s or r["tpot_slo_s"]
    prompt = next(s for s in splits if "4,096" in s.label)
    terms = [("queueing", prompt.queueing_s, PALETTE["memory"]), ("prefill", prompt.prefill_s, PALETTE["compute"]),
             ("scheduling", prompt.scheduling_s, PALETTE["neutral"])]
    total = sum(t[1] for t in terms)
    points = operating_points(slo, r)
    # the ledger's TPOT is the step's memory term; where a batch's FLOPs take longer (compute-bound), say so
    memory_term = any(_roofline_step(b, r["seq_tokens"]).compute_s > tpot for _, b, tpot in points)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.38, 0.62], horizontal_spacing=0.06, subplot_titles=(
        f"TTFT, a 4K prompt: {1e3 * total:,.0f} ms", "three batches: TPOT" + (", memory term" if memory_term else "")))
    fig.add_trace(go.Bar(y=[t[0] for t in terms], x=[1e3 * t[1] for t in terms], orientation="h",
                         marker_color=[t[2] for t in terms], text=[f"{1e3 * t[1]:,.0f} ms" for t in terms],
                         textposition="outside", cliponaxis=False, showlegend=False, hoverinfo="skip"), row=1, col=1)
    fig.update_xaxes(range=[0, 1.8e3 * max(t[1] for t in terms)], visible=False, row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    top = 1e3 * max(max(p[2] for p in points), slo) * 1.5
    colours, texts, places = [], [], []
    for k, (_, b, tpot) in enumerate(points):
        missed = step >= 2 and tpot > slo
        colours.append(PALETTE["limit"] if missed else PALETTE["used"] if step >= 3 and k == 2 else PALETTE["compute"])
        rate_text = "goodput 0" if missed else f"{ledger.throughput_tok_s(b, tpot):,.0f} tok/s"
        texts.append(f"{1e3 * tpot:.2f} ms<br>{rate_text}" if step >= 1 else "")
        # a tall bar holds its label at its foot, clear of the SLO line near its top
        places.append("inside" if 1e3 * tpot > 0.4 * top else "outside")
    short = {"memory ceiling": "memory cap"}  # one line per name: two-line names pushed the plot up 30 px
    fig.add_trace(go.Bar(x=[f"{short.get(name, name)}<br>B = {b}" for name, b, _ in points],
                         y=[1e3 * tpot if step >= 1 else 0 for _, _, tpot in points], marker_color=colours,
                         text=texts, textposition=places, insidetextanchor="start", cliponaxis=False, textangle=0,
                         constraintext="none",
                         showlegend=False, hoverinfo="skip"), row=1, col=2)
    fig.update_xaxes(tickangle=0, row=1, col=2)
    fig.update_layout(bargap=0.12)
    fig.update_yaxes(range=[0, top], visible=False, row=1, col=2)
    if step >= 2:  # the SLO, named at the left end over the naive column's low bar
        fig.add_hline(y=1e3 * slo, line=dict(color=PALETTE["memory"], width=3, dash="dash"), row=1, col=2)
        fig.add_annotation(x=0.0, y=1e3 * slo, xref="x2 domain", yref="y2", xanchor="left", yanchor="bottom",
                           showarrow=False, text=f"SLO {1e3 * slo:g} ms", font=dict(color=PALETTE["memory"]))
    # no figure title: the two panels' titles say it, and the plot keeps those 40 px
    return _board(fig, "", height, margin=dict(l=120, r=10, t=50, b=70))


PICTURES = (five_jobs_figure, naive_figure, block_table_figure, sharing_figure, engine_loop_figure, slo_figure, None)


def picture(index: int, step: int, data: dict, height: int = PICTURE_HEIGHT, whatif=None):
    """Segment `index`'s picture with `step` results revealed, `height` design pixels tall: a plotly Figure,
    or HTML (a table).  `whatif` is the live slider's value (S_max in 6–16, the TPOT SLO in 58–68)."""
    if not 0 <= index < len(PICTURES):
        raise IndexError(f"segment index must be 0..{len(PICTURES) - 1}, got {index}")
    if index == 1:
        return naive_figure(step, height, s_max=whatif)
    if index == 5:
        rate = max(data["ttft_splits"], key=float)  # the loaded card: the highest arrival rate shipped
        return slo_figure(step, [TTFTSplit(**s) for s in data["ttft_splits"][rate]], height, tpot_slo_s=whatif,
                          rate=rate)
    if index == 6:
        return map_html(data)
    return PICTURES[index](step, height)


def swap_recompute_figure(seq_tokens: int = 4096) -> go.Figure:
    """§10.5's derivation for the labs: the swap round trip against the recompute, for the card's model and its
    contrast (MHA first, then the GQA form: the lecture's 7B and its GQA-8), each named by its attention."""
    from labsupport.viz import engine as viz_engine

    c = card.card()
    terms = [viz_engine.swap_recompute(m, c.gpu, seq_tokens, c.gpu.link_bandwidth) for m in (c.mha, c.gqa)]
    bars = [(m.name, t["swap_s"], t["recompute_s"]) for m, t in zip((c.mha, c.gqa), terms)]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[b[0] for b in bars], y=[1e3 * b[1] for b in bars], name=f"swap out + in ({c.gpu.link_bandwidth / GB:g} GB/s)",
                         marker_color=PALETTE["link"], text=[f"{1e3 * b[1]:.1f} ms" for b in bars],
                         textposition="outside", textfont=dict(size=FONT_SIZE + 2)))
    fig.add_trace(go.Bar(x=[b[0] for b in bars], y=[1e3 * b[2] for b in bars], name="recompute (50% of peak)",
                         marker_color=PALETTE["recompute"], text=[f"{1e3 * b[2]:.1f} ms" for b in bars],
                         textposition="outside", textfont=dict(size=FONT_SIZE + 2)))
    w, wg = (t["breakeven_bandwidth"] / GB for t in terms)
    top = 1e3 * max(max(b[1], b[2]) for b in bars)  # the y range leaves room for the tallest bar's label
    return styled(fig, f"A preempted {seq_tokens:,}-token sequence: break-even link {w:.2f} GB/s ({c.mha.attention}), "
                       f"{wg:.2f} GB/s ({c.gqa.attention})",
                  height=480, barmode="group", yaxis=dict(title="stall (ms)", range=[0, 1.25 * top]),
                  legend=dict(orientation="h", y=-0.2, x=0))
