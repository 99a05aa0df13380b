"""Figures and panels of the memory labs: the naive allocator (§10.2, lab 02) and the block table (§10.3, lab 03).

Every picture is drawn from a real mechanism's state, never from re-typed numbers:

* §10.2's board: one S_max slot with the sequence's tokens shaded, then the stack of slots a real
  `ReserveToMaxAllocator` admits on the budget (`slot_figure`, `slot_stack_figure`, `naive_panel`);
* Exercise 2: a real first-fit `ContiguousAllocator` driven by arrivals and retirements until it
  refuses a request while more than enough memory is free (`labsupport.measure.fragmentation` measures,
  `address_space_figure` draws);
* the vLLM paper's Fig. 2 breakdown from `labsupport.measure.fig2.fig2_breakdown` replays (`fig2_figure`);
* §10.3's board: logical blocks on the left, one physical pool on the right, arrows crossing, read
  off a real `PagedKVCache` (`block_table_figure`, `BlockTableExplorer` with step buttons);
* the block-size trade-off, from the ledger and measured on the real allocator over real traces
  (`labsupport.measure.block_size` measures; `block_size_tradeoff_figure`, `block_size_panel` draw).

Colours keep `viz.PALETTE`'s meanings: green holds real tokens, orange is reserved and never filled,
vermilion is unusable free memory (external fragmentation), grey is free.
"""
from __future__ import annotations

import html
from typing import Hashable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labsupport import card, ledger
from labsupport.block_allocator import BlockAllocator
from labsupport.measure.block_size import BlockSizeMeasurement
from labsupport.checks import positive_int as _positive_int
from labsupport.contiguous import ContiguousAllocator, Refusal, ReserveToMaxAllocator
from labsupport.measure.fig2 import Breakdown
from labsupport.measure.fragmentation import fill_reserve_to_max, naive_measurement
from labsupport.memory_stats import OutOfBlocks
from labsupport.specs import MiB
from labsupport.units import fmt_gb, fmt_pct
from labsupport.viz import (
    FONT_SIZE,
    PALETTE,
    S_MAX_OPTIONS,
    LiveView,
    Panel,
    bytes_axis_title,
    dropdown,
    fit_width,
    gpu_options,
    in_unit,
    model_options,
    panel_box,
    selection_slider,
    styled,
)

FREE_COLOUR = "#E9E9E9"
RESERVATION_COLOUR = "#8FD3B6"  # pale green: slots a live request will still fill with tokens
SEQ_COLOURS = ("#0072B2", "#882255", "#56B4E9", "#CC79A7", "#009E73", "#D55E00")  # arrows, one per sequence

# Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention",
# SOSP 2023, Fig. 2: share of KV-cache memory holding token states, averaged over their experiment.
PAPER_FIG2_TOKEN_STATES = {"max": 0.204, "pow2": 0.268, "oracle": 0.382, "paged": 0.963}
POLICY_LABELS = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)", "paged": "paged (vLLM)"}


# =============================================================================================
# §10.2: the reserve-to-max allocator
# =============================================================================================

def slot_figure(s_max: int = 4096, prompt: int = 512, output: int = 128) -> go.Figure:
    """§10.2's first drawing: one S_max-token slot, the prompt and output shaded, the rest reserved and empty."""
    s_max, prompt, output = (_positive_int(n, v) for n, v in (("s_max", s_max), ("prompt", prompt),
                                                              ("output", output)))
    held_prompt = min(prompt, s_max)
    held_output = min(output, s_max - held_prompt)
    empty = s_max - held_prompt - held_output
    fig = go.Figure()
    parts = [("prompt", held_prompt, PALETTE["used"], ""), ("output", held_output, PALETTE["used"], "/"),
             ("reserved, never filled", empty, PALETTE["waste"], "")]
    base = 0
    for name, n, colour, pattern in parts:
        fig.add_trace(go.Bar(
            y=["slot"], x=[n], base=[base], orientation="h", name=f"{name}: {n:,} tokens", marker_color=colour,
            marker_pattern_shape=pattern, marker_line=dict(color="#444444", width=1),
            hovertemplate=f"{name}: {n:,} tokens<extra></extra>", width=0.5))
        base += n
    used = held_prompt + held_output
    fig.add_annotation(x=used / 2 if used > 0.1 * s_max else used, y=0.42, yref="y", showarrow=False,
                       xanchor="center" if used > 0.1 * s_max else "left",
                       text=f"<b>{used:,}</b> used", font=dict(size=FONT_SIZE + 2, color=PALETTE["used"]))
    fig.add_annotation(x=used + empty / 2, y=0.42, yref="y", showarrow=False,
                       text=f"<b>{empty:,}</b> reserved and empty ({fmt_pct(empty / s_max, 1)})",
                       font=dict(size=FONT_SIZE + 2, color=PALETTE["waste"]))
    return styled(fig, f"One reserve-to-max slot: {s_max:,} tokens reserved, {used:,} used", height=360,
                  barmode="overlay", xaxis=dict(title="token positions in the slot", range=[0, s_max]),
                  yaxis=dict(showticklabels=False, range=[-0.5, 0.8]),
                  legend=dict(orientation="h", y=-0.5, x=0))  # below: at 700 px a legend above wrapped onto the bar


def slot_stack_figure(alloc: ReserveToMaxAllocator, budget_bytes: float, max_rows: int = 32,
                      unit: str = "GB") -> go.Figure:
    """§10.2's second drawing: every slot of a filled allocator stacked, used part green, the rest orange."""
    m = naive_measurement(alloc, budget_bytes)
    kv, slot = alloc.kv_bytes_per_token, m["slot_bytes"]
    slots = sorted(alloc.slots.items(), key=lambda item: item[1].offset)
    fig = go.Figure()
    if not slots:
        fig.add_trace(go.Bar(y=["one slot", "KV budget"], x=[in_unit(slot, unit), in_unit(budget_bytes, unit)],
                             orientation="h", marker_color=[PALETTE["waste"], PALETTE["memory"]],
                             text=[fmt_gb(slot), fmt_gb(budget_bytes)], textposition="inside",
                             hovertemplate="%{y}: %{x:,.3f} " + unit + "<extra></extra>"))
        fig.add_annotation(x=0.5, y=1.12, xref="paper", yref="paper", showarrow=False,
                           text="<b>no slot fits: zero requests served</b>",
                           font=dict(size=FONT_SIZE + 4, color=PALETTE["memory"]))
        return styled(fig, f"S_max = {alloc.s_max:,}: one slot is larger than the whole KV budget", height=360,
                      xaxis=dict(title=bytes_axis_title("bytes", unit)), yaxis=dict(autorange="reversed"),
                      showlegend=False, margin=dict(l=140))
    shown = slots if len(slots) <= max_rows else slots[: max_rows - 1]
    labels = [f"slot {s.offset // alloc.s_max + 1}" for _, s in shown]
    used = [in_unit(s.length * kv, unit) for _, s in shown]
    empty = [in_unit((s.size - s.length) * kv, unit) for _, s in shown]
    if len(shown) < len(slots):
        rest = slots[len(shown):]
        labels.append(f"… {len(rest)} more")
        used.append(in_unit(sum(s.length for _, s in rest) * kv, unit) / len(rest))
        empty.append(in_unit(sum(s.size - s.length for _, s in rest) * kv, unit) / len(rest))
    fig.add_trace(go.Bar(y=labels, x=used, orientation="h", name="holds tokens", marker_color=PALETTE["used"],
                         hovertemplate="%{y}: %{x:,.3f} " + unit + " of tokens<extra></extra>"))
    fig.add_trace(go.Bar(y=labels, x=empty, orientation="h", name="reserved, never filled",
                         marker_color=PALETTE["waste"],
                         hovertemplate="%{y}: %{x:,.3f} " + unit + " reserved and empty<extra></extra>"))
    left = m["leftover_bytes"]
    # The leftover sits on the title's second line, the legend on the plot's top edge: at any width
    # the two never meet (a note beside the legend ran under it in a 700 px figure).
    title = (f"{m['concurrency']:,} slot{'' if m['concurrency'] == 1 else 's'} × {fmt_gb(slot)}: {fmt_gb(m['occupied_bytes'], 2)} of "
             f"{fmt_gb(budget_bytes, 2)} hold tokens ({fmt_pct(m['utilization'])})"
             f"<br><sup>+ {fmt_gb(left)} of the budget too small for another slot</sup>")
    height = max(340, min(920, 150 + 22 * len(labels)))
    return styled(fig, title, height=height, barmode="stack",
                  xaxis=dict(title=bytes_axis_title("KV memory per slot", unit), range=[0, in_unit(slot, unit)]),
                  yaxis=dict(autorange="reversed", tickfont=dict(size=max(14, FONT_SIZE - len(labels) // 4))),
                  legend=dict(orientation="h", y=1.0, x=1, xanchor="right", yanchor="bottom", traceorder="normal"),
                  bargap=0.15, margin=dict(t=130))


PROMPT_OPTIONS = [(f"{n:,}", n) for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16_384, 32_768)]
OUTPUT_OPTIONS = [(f"{n:,}", n) for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)]


def naive_readout(s_max: int, prompt: int, output: int, model: str, gpu: str, paged: bool = True,
                  utilization_fn=None) -> str:
    """The panel's numbers: measured on the real allocator, and the ledger's closed form beside them.

    `paged` adds what a paged pool would hold (the board's comparison; lab 02 leaves it to lab 03's 3.5);
    `utilization_fn(budget_bytes, s_max, seq_tokens, kv_bytes)` adds its reading (lab 02 passes the student's 2.6)."""
    m, g = card.model(model), card.gpu(gpu)
    kv = m.kv_bytes_per_token
    budget = ledger.kv_budget_bytes(m, g)
    alloc = fill_reserve_to_max(budget, s_max, prompt + output, kv)
    meas = naive_measurement(alloc, budget)
    seq = prompt + output
    closed = ledger.naive_utilization(budget, s_max, seq, kv)
    count = ledger.paged_concurrency(budget, seq, 16, kv) if ledger.blocks_for(seq, 16) <= ledger.num_blocks(
        budget, 16, kv) else 0
    trunc = f" (truncated to {s_max:,}: the slot cannot grow)" if seq > s_max else ""
    return (f"slot = {s_max:,} tokens × {kv:,} B = {fmt_gb(meas['slot_bytes'])}; KV budget {fmt_gb(budget, 2)}\n"
            f"real allocator: {meas['concurrency']:,} sequences of {seq:,} tokens{trunc}; "
            f"utilization {fmt_pct(meas['utilization'])} (ledger: {fmt_pct(closed)}, "
            f"{ledger.naive_concurrency(budget, s_max, kv):,} slots"
            + ("" if utilization_fn is None else
               f"; your reserve_to_max_utilization(): {fmt_pct(float(utilization_fn(budget, s_max, seq, kv)))}")
            + ")"
            + (f"\npaged at b = 16 would hold {count:,} of these sequences" if paged else ""))


def naive_panel(s_max: int = 4096, prompt: int = 512, output: int = 128, model: str | None = None,
                gpu: str | None = None, paged: bool = True, utilization_fn=None) -> Panel:
    """Lab 02: S_max, prompt, output, model and GPU -> the real allocator's slots and utilization
    (and, with `paged`, what a paged pool would hold: the board shows it, lab 02 leaves it to lab 03;
    with `utilization_fn`, lab 02's 2.6, that function's reading beside the allocator's)."""
    controls = {
        "s_max": selection_slider(S_MAX_OPTIONS, s_max, "S_max (tokens)"),
        "prompt": selection_slider(PROMPT_OPTIONS, prompt, "prompt (tokens)"),
        "output": selection_slider(OUTPUT_OPTIONS, output, "output (tokens)"),
        "model": dropdown(model_options(), model, "model"),
        "gpu": dropdown(gpu_options(), gpu, "GPU"),
    }

    def figure(s_max, prompt, output, model, gpu):
        m, g = card.model(model), card.gpu(gpu)
        budget = ledger.kv_budget_bytes(m, g)
        return slot_stack_figure(fill_reserve_to_max(budget, s_max, prompt + output, m.kv_bytes_per_token), budget)

    def readout(**values):
        return naive_readout(**values, paged=paged, utilization_fn=utilization_fn)

    return Panel(figure, controls, readout, title="Reserve-to-max: slots sized by the limit, filled by reality")


# =============================================================================================
# Exercise 2: per-request S_max and external fragmentation
# =============================================================================================


# Slot sizes, small to large: light to dark blue, far enough apart in lightness to tell apart in
# colour or in grey (three opacities of one blue were not).
SIZE_BLUES = ("#9ECAE1", "#4292C6", "#08306B")


def _size_colours(n: int) -> list[str]:
    if n <= len(SIZE_BLUES):
        return list(SIZE_BLUES[len(SIZE_BLUES) - n:])
    import plotly.colors

    return plotly.colors.sample_colorscale([[0, SIZE_BLUES[0]], [1, SIZE_BLUES[-1]]], [i / (n - 1) for i in range(n)])


def address_space_figure(alloc: ContiguousAllocator, refusal: Refusal | None = None, unit: str = "GB") -> go.Figure:
    """The variable-slot address space: slots by declared size, holes between them, and the refused request."""
    kv = alloc.kv_bytes_per_token or 1
    to_unit = (lambda t: in_unit(t * kv, unit)) if alloc.kv_bytes_per_token else float
    axis_unit = unit if alloc.kv_bytes_per_token else "tokens"
    layout = alloc.layout()
    fig = go.Figure()
    classes = sorted({s.size for s in alloc.slots.values()})
    for size, colour in zip(classes, _size_colours(len(classes))):
        parts = [(o, s) for o, s, sid in layout if sid is not None and s == size]
        fig.add_trace(go.Bar(
            y=["address space"] * len(parts), x=[to_unit(s) for _, s in parts], base=[to_unit(o) for o, _ in parts],
            orientation="h", name=f"slot, S_max = {size:,}", marker_color=colour,
            marker_line=dict(color="white", width=1),
            hovertemplate=f"slot of {size:,} tokens<extra></extra>"))
    holes = [(o, s) for o, s, sid in layout if sid is None]
    too_small = [h for h in holes if refusal is not None and h[1] < refusal.requested_tokens]
    usable = [h for h in holes if h not in too_small]
    for name, group, colour in (("hole too small for the request", too_small, PALETTE["memory"]),
                                ("free", usable, FREE_COLOUR)):
        if group:
            fig.add_trace(go.Bar(
                y=["address space"] * len(group), x=[to_unit(s) for _, s in group],
                base=[to_unit(o) for o, _ in group], orientation="h", name=name, marker_color=colour,
                marker_line=dict(color="#444444", width=1),
                hovertemplate="hole of %{x:,.3f} " + axis_unit + "<extra></extra>"))
    if refusal is not None:
        fig.add_trace(go.Bar(
            y=["refused request"], x=[to_unit(refusal.requested_tokens)], base=[0], orientation="h",
            name=f"refused: {refusal.requested_tokens:,} tokens", marker_color="white",
            marker_line=dict(color=PALETTE["limit"], width=3), marker_pattern_shape="x",
            hovertemplate="refused request: %{x:,.3f} " + axis_unit + "<extra></extra>"))
        fig.add_annotation(
            x=0.0, y=1.13, xref="paper", yref="paper", xanchor="left", showarrow=False,
            font=dict(size=FONT_SIZE, color=PALETTE["limit"]),
            text=(f"free in total <b>{to_unit(refusal.free_tokens):,.2f} {axis_unit}</b>, largest hole "
                  f"<b>{to_unit(refusal.largest_hole_tokens):,.2f} {axis_unit}</b>, request "
                  f"<b>{to_unit(refusal.requested_tokens):,.2f} {axis_unit}</b>: refused"))
    title = "Per-request S_max: first-fit slots and the holes between them"
    return styled(fig, title, height=470, barmode="overlay",
                  xaxis=dict(title=bytes_axis_title("address", unit) if alloc.kv_bytes_per_token else "token slot",
                             range=[0, to_unit(alloc.capacity_tokens)]),
                  yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.62, x=0),
                  margin=dict(t=120, l=190, b=170))


# =============================================================================================
# The vLLM paper's Fig. 2
# =============================================================================================

FIG2_PARTS = (("token_states", "token states", PALETTE["used"]),
              ("reservation", "reservation", RESERVATION_COLOUR),
              ("internal_fragmentation", "internal fragmentation", PALETTE["waste"]),
              ("external_fragmentation", "external fragmentation", PALETTE["memory"]),
              ("free", "free (waiting, or watermark)", FREE_COLOUR))


def fig2_figure(breakdowns: Mapping[str, Breakdown], paper: Mapping[str, float] | None = PAPER_FIG2_TOKEN_STATES,
                title: str = "Where the KV cache goes (vLLM paper, Fig. 2 style)",
                labels: Mapping[str, str] | None = None) -> go.Figure:
    """Stacked shares of the pool per policy from real replays; the paper's token-state share as a marker.

    Keys of `breakdowns` name bars: the policies of `POLICY_LABELS` get their names, others (e.g. a
    second S_max for Max) take theirs from `labels`; the paper's marker appears on its four policies.
    """
    if not breakdowns:
        raise ValueError("fig2_figure needs at least one Breakdown")
    names = {**POLICY_LABELS, **(labels or {})}
    policies = list(breakdowns)
    bar_labels = [names.get(p, p) for p in policies]
    fig = go.Figure()
    for key, name, colour in FIG2_PARTS:
        vals = [100 * getattr(breakdowns[p], key) for p in policies]
        fig.add_trace(go.Bar(
            x=bar_labels, y=vals, name=name, marker_color=colour, marker_line=dict(color="#444444", width=0.5),
            text=[f"{v:.1f}%" if v >= 4 else "" for v in vals], textposition="inside",
            # token states read at the foot of their bar, clear of the paper's marker near the top
            insidetextanchor="start" if key == "token_states" else "end",
            hovertemplate="%{x}: " + name + " %{y:.1f}%<extra></extra>"))
    if paper:
        xs = [names.get(p, p) for p in policies if p in paper]
        ys = [100 * paper[p] for p in policies if p in paper]
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers+text", name="paper: token states", text=[f"{y:.1f}%" for y in ys],
            textposition="middle right", marker=dict(symbol="diamond", size=18, color=PALETTE["limit"],
                                                    line=dict(color="white", width=2)),
            textfont=dict(size=FONT_SIZE - 2, color=PALETTE["limit"]),
            hovertemplate="paper, %{x}: token states %{y:.1f}%<extra></extra>"))
    return styled(fig, title, height=520, barmode="stack",
                  yaxis=dict(title="share of the KV pool (%)", range=[0, 100]),
                  legend=dict(orientation="h", y=-0.18, x=0, traceorder="normal"))


# =============================================================================================
# §10.3: the block table
# =============================================================================================

def _seq_label(seq_id, names: Mapping | None) -> str:
    return str(names.get(seq_id, seq_id)) if names else str(seq_id)


def block_table_figure(allocator: BlockAllocator, seq_ids: Sequence[Hashable] | None = None,
                       names: Mapping[Hashable, str] | None = None,
                       highlight: tuple[Hashable, int] | None = None, title: str | None = None) -> go.Figure:
    """§10.3's board from a real allocator: logical blocks left, the physical pool right, one arrow per entry.

    Each block is drawn as `block_size` cells: green cells hold a token, orange ones are the tail a
    sequence has reserved but not filled, grey blocks are free.  `highlight=(seq_id, logical_index)`
    outlines one table entry and the physical block it names (the one a step just added).  Cells,
    outlines and labels are a fixed set of traces (cheap to patch in a FigureWidget); only the arrows
    are annotations.
    """
    bs, nb = allocator.block_size, allocator.num_blocks
    seqs = list(allocator.block_tables) if seq_ids is None else [s for s in seq_ids if s in allocator.block_tables]
    cell = 1.0 / bs  # a block is one unit wide whatever its size
    pool_x = 2.8
    cells = {"used": ([], []), "tail": ([], []), "free": ([], [])}  # (x0s, ys) per kind
    outlines = {False: ([], []), True: ([], [])}  # thin / highlighted: x and y polylines
    fill: dict[int, int] = {}
    for s in seqs:
        n = allocator.seq_lens[s]
        for i, b in enumerate(allocator.block_tables[s]):
            fill[b] = max(fill.get(b, 0), min(bs, n - i * bs))
    lit_block = None
    if highlight is not None and highlight[0] in allocator.block_tables:
        table = allocator.block_tables[highlight[0]]
        if 0 <= highlight[1] < len(table):
            lit_block = table[highlight[1]]

    def block(x0: float, y: float, filled: int, live: bool, lit: bool) -> None:
        for c in range(bs):
            kind = ("used" if c < filled else "tail") if live else "free"
            cells[kind][0].append(x0 + c * cell)
            cells[kind][1].append(y)
        xs, ys = outlines[lit]
        xs += [x0, x0 + 1, x0 + 1, x0, x0, None]
        ys += [y - 0.4, y - 0.4, y + 0.4, y + 0.4, y - 0.4, None]

    for b in range(nb):
        block(pool_x, b, fill.get(b, 0), b in fill, b == lit_block)
    rows = sum(len(allocator.block_tables[s]) for s in seqs) + max(0, len(seqs) - 1)
    step = min(1.6, max(1.0, (nb - 1) / (rows - 1))) if rows > 1 else 1.0
    label_x, label_y, label_text, label_colour, arrows = [], [], [], [], []
    y = 0.0
    for k, s in enumerate(seqs):
        colour = SEQ_COLOURS[k % len(SEQ_COLOURS)]
        name = _seq_label(s, names)
        n = allocator.seq_lens[s]
        for i, b in enumerate(allocator.block_tables[s]):
            lit = highlight == (s, i)
            block(0.0, y, min(bs, n - i * bs), True, lit)
            label_x.append(-0.1)
            label_y.append(y)
            label_text.append(f"<b>{html.escape(name)}{i}</b>")
            label_colour.append(colour)
            arrows.append(dict(x=pool_x - 0.03, y=b, ax=1.05, ay=y, xref="x", yref="y", axref="x", ayref="y",
                               showarrow=True, arrowhead=3, arrowsize=1.2, arrowwidth=4 if lit else 2.5,
                               arrowcolor=colour, text=""))
            y += step
        y += step
    fig = go.Figure()
    for kind, colour in (("used", PALETTE["used"]), ("tail", PALETTE["waste"]), ("free", FREE_COLOUR)):
        x0s, ys = cells[kind]
        fig.add_trace(go.Bar(x=[cell] * len(x0s), base=x0s, y=ys, orientation="h", width=0.8, marker_color=colour,
                             marker_line=dict(color="white", width=1), hoverinfo="skip", name=kind))
    for lit in (False, True):
        xs, ys = outlines[lit]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip",
                                 line=dict(color=PALETTE["limit"] if lit else "#666666", width=4 if lit else 1)))
    fig.add_trace(go.Scatter(x=label_x, y=label_y, text=label_text, mode="text", textposition="middle left",
                             textfont=dict(size=FONT_SIZE, color=label_colour), hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[pool_x + 1.05] * nb, y=list(range(nb)), text=[f"#{b}" for b in range(nb)],
                             mode="text", textposition="middle right", hoverinfo="skip",
                             textfont=dict(size=FONT_SIZE - 2, color="#444444")))
    tables = "   ".join(f"{_seq_label(s, names)}: {allocator.seq_lens[s]} tokens → "
                        f"[{', '.join(map(str, allocator.block_tables[s]))}]" for s in seqs)
    notes = [dict(x=0, y=1.0, xref="paper", yref="paper", yanchor="bottom", xanchor="left", showarrow=False,
                  yshift=12, text=html.escape(tables) or "no sequences", font=dict(size=FONT_SIZE - 1)),
             dict(x=0.5, y=-0.95, text="logical blocks", showarrow=False, font=dict(size=FONT_SIZE)),
             dict(x=pool_x + 0.5, y=-0.95, text=f"physical pool ({allocator.num_free_blocks} free)",
                  showarrow=False, font=dict(size=FONT_SIZE))]
    top = max(nb, y)
    return styled(fig, title or f"Block tables: block size {bs}, {nb} physical blocks",
                  height=max(380, 60 + 34 * top), annotations=notes + arrows, showlegend=False, barmode="overlay",
                  xaxis=dict(visible=False, range=[-0.8, pool_x + 1.6]),
                  yaxis=dict(visible=False, range=[top - 0.3, -1.3]),
                  margin=dict(l=30, r=30, t=120, b=20))


class BlockTableExplorer(LiveView):
    """A real `PagedKVCache` behind step buttons: grow a sequence by one token, free one, reset.

    Every action goes through the cache's own operations (`add_sequence`, `append`, `free`, writing
    real K/V tensors), and the figure is redrawn from its block tables.  `step(action)` is what a
    button does, so tests and the notebook can drive it without a front end.
    """

    def __init__(self, names: Sequence[str] = ("A", "B"), num_blocks: int = 12, block_size: int = 4,
                 script: Sequence[str] = ()):
        import ipywidgets as widgets

        self.names = tuple(names)
        self.num_blocks = _positive_int("num_blocks", num_blocks)
        self.script = tuple(script)
        self.message = ""
        self.history: list[str] = []
        self.highlight: tuple[str, int] | None = None
        self.controls = {"block_size": dropdown([1, 2, 4, 8], block_size, "block size")}
        self.buttons = {}
        for name in self.names:
            self.buttons[f"grow {name}"] = widgets.Button(description=f"{name} + 1 token")
            self.buttons[f"free {name}"] = widgets.Button(description=f"free {name}")
        self.buttons["reset"] = widgets.Button(description="reset")
        for action, button in self.buttons.items():
            button.on_click(lambda _b, action=action: self.step(action))
        self.controls["block_size"].observe(lambda _c: self.reset(), names="value")
        self._build_cache()
        self._start_figure(self._figure())
        self.readout = widgets.HTML()
        self.readout.value = self._readout_html()
        self.widget = panel_box("Two sequences, one pool: the block table",
                                [self.controls["block_size"], *self.buttons.values()],
                                self.figure, self.readout, fit_width())

    @property
    def block_size(self) -> int:
        return self.controls["block_size"].value

    def _build_cache(self) -> None:
        from labsupport.kvcache import PagedKVCache

        self.cache = PagedKVCache(self.num_blocks, self.block_size, num_layers=1, num_kv_heads=1, head_dim=2)
        self._tokens = {name: 0 for name in self.names}
        self.highlight = None
        for action in self.script:
            self._apply(action)
        self.message = "start: " + self.summary()

    def _kv(self, name: str, position: int):
        import torch

        # K/V values encode (sequence, position), so gather() shows each token landed where it belongs
        val = float(self.names.index(name) * 1000 + position)
        return torch.full((1, 1, 1, 2), val), torch.full((1, 1, 1, 2), -val)

    def _apply(self, action: str) -> str:
        verb, _, name = action.partition(" ")
        if name not in self.names and verb != "reset":
            raise ValueError(f"unknown action {action!r}; choose one of {', '.join(self.buttons)}")
        alloc = self.cache.allocator
        if verb == "grow":
            pos = alloc.seq_lens.get(name, 0)
            k, v = self._kv(name, pos)
            before = len(alloc.block_tables.get(name, []))
            try:
                if name in alloc.block_tables:
                    self.cache.append([name], k, v)
                else:
                    self.cache.add_sequence(name, k, v)
            except OutOfBlocks:
                return f"{name} needs a new block and none is free: the pool is full (free a sequence)"
            table = alloc.block_tables[name]
            slot = alloc.slot_mapping(name, pos, pos + 1)[0]
            self.highlight = (name, len(table) - 1)
            if len(table) > before:
                return (f"{name} grew to {pos + 1} tokens: its last block was full, so it took block #{table[-1]} "
                        f"and one new table entry {name}{len(table) - 1} → #{table[-1]} (slot {slot})")
            return (f"{name} grew to {pos + 1} tokens: its last block #{table[-1]} had room, no new block "
                    f"(slot {slot} = {table[-1]} × {self.block_size} + {pos % self.block_size})")
        if verb == "free":
            if name not in alloc.block_tables:
                return f"{name} holds no blocks"
            table = alloc.block_tables[name]
            self.cache.free(name)
            self.highlight = None
            return f"freed {name}: blocks {table} went back to the free list (reused last)"
        raise ValueError(f"unknown action {action!r}; choose one of {', '.join(self.buttons)}")

    def step(self, action: str) -> str:
        """Do one button's action on the real cache and redraw; returns the line describing it."""
        if action == "reset":
            return self.reset()
        self.message = self._apply(action)
        self.cache.check_invariants()
        self.history.append(self.message)
        self._redraw()
        return self.message

    def reset(self) -> str:
        self._build_cache()
        self.history.append(self.message)
        self._redraw()
        return self.message

    def _figure(self) -> go.Figure:
        return block_table_figure(self.cache.allocator, [n for n in self.names], highlight=self.highlight)

    def _redraw(self) -> None:
        self._redraw_figure(self._figure())
        self.readout.value = self._readout_html()

    def summary(self) -> str:
        alloc = self.cache.allocator
        parts = [f"{n}: {alloc.seq_lens[n]} tokens in {alloc.block_tables[n]}" for n in self.names
                 if n in alloc.block_tables]
        return "; ".join(parts) or "no sequences"

    def _readout_html(self) -> str:
        return (f'<div style="font-size:{FONT_SIZE}px;line-height:1.5">{html.escape(self.message)}<br>'
                f'{html.escape(self.summary())}</div>')

    def text(self) -> str:
        return f"Block-table explorer [block size {self.block_size}, {self.num_blocks} blocks]\n{self.message}"

    def _note_text(self) -> str:
        return f"Below, the block table as last drawn: {self.text().splitlines()[0]}, {self.summary()}."


def board_script(a_tokens: int = 8, b_tokens: int = 5, a_prompt: int = 3, b_prompt: int = 2) -> list[str]:
    """Actions that build §10.3's board: A and B prefilled, then decoding in turns, so their blocks interleave."""
    script = ["grow A"] * a_prompt + ["grow B"] * b_prompt
    a, b = a_prompt, b_prompt
    while a < a_tokens or b < b_tokens:
        if a < a_tokens:
            script.append("grow A")
            a += 1
        if b < b_tokens:
            script.append("grow B")
            b += 1
    return script


def block_table_explorer(num_blocks: int = 12, block_size: int = 4, a_tokens: int = 8, b_tokens: int = 5) -> BlockTableExplorer:
    """Lab 03: the lecture's board, A holding `a_tokens` (its last block full) and B `b_tokens`."""
    return BlockTableExplorer(("A", "B"), num_blocks, block_size, board_script(a_tokens, b_tokens))


# =============================================================================================
# §10.3 step two: the block size, from the ledger and measured
# =============================================================================================


WORKLOAD_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")


def block_size_tradeoff_figure(block_sizes: Sequence[int], budget_bytes: float, kv_per_token: int, batch: int = 199,
                               seq_tokens: int = 4096,
                               measured: Mapping[str, Mapping[int, BlockSizeMeasurement]] | None = None,
                               highlight: int | None = None) -> go.Figure:
    """§10.3's trade-off: the memory side (tail waste at B) rises with b, the table and kernel side falls.

    Lines are the ledger's closed forms; markers are measurements on the real allocator.
    """
    rows = ledger.block_size_table(block_sizes, batch, budget_bytes, kv_per_token, seq_tokens)
    xs = [r.block_size for r in rows]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=(f"memory: waste at the batch, B = {batch}",
                                        f"table entries at {seq_tokens:,} tokens, contiguous run"))
    fig.add_trace(go.Scatter(x=xs, y=[100 * r.waste_fraction_of_budget for r in rows], mode="lines+markers",
                             name="ledger: (b − 1)/2 tail", line=dict(color=PALETTE["waste"], width=4),
                             hovertemplate="b = %{x}: %{y:.2f}% of the budget<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=xs, y=[r.table_entries for r in rows], mode="lines+markers",
                             name=f"table entries at {seq_tokens:,}", line=dict(color=PALETTE["memory"], width=4),
                             hovertemplate="b = %{x}: %{y:,} entries<extra></extra>"), 1, 2)
    fig.add_trace(go.Scatter(x=xs, y=[r.contiguous_run_tokens for r in rows], mode="lines+markers",
                             name="guaranteed run = b tokens", line=dict(color=PALETTE["compute"], width=4),
                             hovertemplate="b = %{x}: run ≥ %{y:,} tokens<extra></extra>"), 1, 2)
    for k, (name, per_b) in enumerate((measured or {}).items()):
        bs = sorted(per_b)
        sym = WORKLOAD_SYMBOLS[k % len(WORKLOAD_SYMBOLS)]
        own = {per_b[b].batch for b in bs}
        at = f" at B = {own.pop()}" if len(own) == 1 and batch not in {per_b[b].batch for b in bs} else ""
        fig.add_trace(go.Scatter(x=bs, y=[100 * per_b[b].waste_at_batch_fraction for b in bs], mode="markers",
                                 name=f"measured: {name}{at}", marker=dict(symbol=sym, size=13, color=PALETTE["waste"],
                                                                      line=dict(color="#222222", width=1.5)),
                                 hovertemplate=name + ", b = %{x}: %{y:.2f}%<extra></extra>"), 1, 1)
        fig.add_trace(go.Scatter(x=bs, y=[per_b[b].mean_run_tokens for b in bs], mode="markers",
                                 name=f"measured run: {name}", showlegend=False,
                                 marker=dict(symbol=sym, size=13, color=PALETTE["compute"],
                                             line=dict(color="#222222", width=1.5)),
                                 hovertemplate=name + ", b = %{x}: mean run %{y:,.0f} tokens<extra></extra>"), 1, 2)
    if highlight is not None:
        for col in (1, 2):
            fig.add_vline(x=highlight, line=dict(color=PALETTE["limit"], dash="dot", width=2), row=1, col=col)
    ticks = dict(type="log", tickvals=xs, ticktext=[str(x) for x in xs], title="block size b (tokens)")
    fig.update_xaxes(**ticks)
    fig.update_yaxes(title_text="% of the KV budget", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="entries / tokens (log)", type="log", dtick=1, row=1, col=2)
    return styled(fig, "Block size trades memory against table length and kernel runs", height=520,
                  legend=dict(orientation="h", y=-0.3, x=0))


def block_size_readout(block_size: int, workload: str, budget_bytes: float, kv_per_token: int, batch: int,
                       measured: Mapping[str, Mapping[int, BlockSizeMeasurement]]) -> str:
    row = ledger.block_size_table([block_size], batch, budget_bytes, kv_per_token)[0]
    lines = [f"ledger, b = {block_size}: mean tail {row.mean_tail_tokens:g} tokens = "
             f"{row.mean_tail_bytes / MiB:,.2f} MiB per sequence; waste at the batch, at B = {batch}: "
             f"{fmt_pct(row.waste_fraction_of_budget)} of the budget; {row.table_entries:,} table entries at 4,096 "
             "tokens"]
    m = measured.get(workload, {}).get(block_size)
    if m is not None:
        lines.append(f"measured on {workload} ({m.num_seqs:,} sequences): mean tail {m.mean_tail_tokens:.2f} tokens "
                     f"(max {m.max_tail_tokens}); waste at the batch, at B = {m.batch}: "
                     f"{fmt_pct(m.waste_at_batch_fraction)}; table entries at the median {m.median_tokens:,} → "
                     f"{m.entries_at_median:,}, at p95 {m.p95_tokens:,} → {m.entries_at_p95:,}; contiguous run "
                     f"{m.mean_run_tokens:,.0f} tokens on average "
                     f"({m.resident:.0f} resident, tails {fmt_pct(m.pool_tail_fraction)} of the pool)")
    return "\n".join(lines)


def block_size_panel(measured: Mapping[str, Mapping[int, BlockSizeMeasurement]], budget_bytes: float,
                     kv_per_token: int, batch: int | None = None, block_size: int = 16,
                     ledger_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> Panel:
    """Lab 03: pick a block size and a measured workload; the chart marks it and the readout states the row.

    The ledger line is drawn at `batch`, or (None) at the batch the chosen workload was measured at."""
    if not measured:
        raise ValueError("block_size_panel needs at least one measured workload")
    names = list(measured)
    sizes = sorted(set(ledger_sizes) | {b for per in measured.values() for b in per})
    controls = {"block_size": selection_slider(sizes, block_size, "block size b (tokens)"),
                "workload": dropdown(names, names[0], "workload")}

    def batch_of(workload):
        return batch if batch is not None else next(iter(measured[workload].values())).batch

    def figure(block_size, workload):
        return block_size_tradeoff_figure(list(ledger_sizes), budget_bytes, kv_per_token, batch_of(workload),
                                          measured={workload: measured[workload]}, highlight=block_size)

    def readout(block_size, workload):
        return block_size_readout(block_size, workload, budget_bytes, kv_per_token, batch_of(workload), measured)

    return Panel(figure, controls, readout, title="Pick a block size")
