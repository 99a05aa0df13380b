"""Figures of lab 05: copy-on-write fan-out and prefix sharing (§10.4).

Every picture is read off the real `BlockAllocator` (or the ledger's closed form, which tests prove
equal to it), never re-typed; the measurements live in `labsupport.measure.sharing`:

* §10.4's board: branches on the left, the physical blocks they name on the right, each block
  labelled with its reference count — one prompt's blocks with eight arrows and refcount 8, then
  one branch writes and its tail becomes a new block: refcount 7 + 1 (`refcount_board_figure`);
* the fan-out bars: n completions off one prompt, unshared against shared, in bytes against the
  KV budget, with the block counts measured on the allocator (`measure_fanout`, `fanout_figure`,
  `fanout_panel`), and the same fan-out pushed into a finite pool (`fanout_in_pool`);
* block size against fork cost: the copy on divergence is a whole block (`measure_fork_cost`,
  `fork_cost_figure`);
* cross-request sharing on the Mooncake conversation trace: its `hash_ids` replayed through the
  allocator's prefix index (`replay_prefix_cache`, `prefix_sharing_figure`, `prefix_capacity_figure`).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from labsupport import card, ledger
from labsupport.block_allocator import BlockAllocator
from labsupport.checks import as_count as _count
from labsupport.measure.sharing import ForkCost, PrefixReplay

from labsupport.units import fmt_int, log_axis_ticks
from labsupport.viz import (FONT_SIZE, PALETTE, Panel, attention_options, bytes_axis_title, dropdown, in_unit, number_slider,
                            selection_slider, styled)

SEQ_COLOURS = ("#0072B2", "#882255", "#56B4E9", "#CC79A7", "#009E73", "#D55E00", "#E69F00", "#444444")
PROMPT_OPTIONS = [(f"{v:,}", v) for v in (256, 512, 1000, 1024, 2048, 4096, 8192, 16_384, 32_768)]
OUTPUT_OPTIONS = [(f"{v:,}", v) for v in (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)]
BLOCK_OPTIONS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


# =============================================================================================
# The board: who points at which block, and how many do
# =============================================================================================

@dataclass(frozen=True)
class BoardBlock:
    """One physical block on the board: its id, reference count, tokens held, and who names it."""

    block_id: int
    ref_count: int
    filled: int  # tokens of the longest holder that live in this block
    holders: tuple  # sequence ids whose block table names this block
    position: int  # logical index at which a holder first names it

    @property
    def shared(self) -> bool:
        return self.ref_count > 1


def board_blocks(allocator: BlockAllocator, seq_ids: Sequence[Hashable]) -> list[BoardBlock]:
    """The physical blocks `seq_ids` hold, in logical order, with the allocator's reference counts."""
    bs = allocator.block_size
    found: dict[int, dict] = {}
    for s in seq_ids:
        table = allocator.block_tables.get(s)
        if table is None:
            raise ValueError(f"sequence {s!r} is not resident in the allocator")
        n = allocator.seq_lens[s]
        for i, b in enumerate(table):
            entry = found.setdefault(b, {"holders": [], "position": i, "filled": 0})
            entry["holders"].append(s)
            entry["filled"] = max(entry["filled"], min(bs, n - i * bs))
    blocks = [BoardBlock(b, allocator.ref_count(b), e["filled"], tuple(e["holders"]), e["position"])
              for b, e in found.items()]
    return sorted(blocks, key=lambda x: (x.position, -x.ref_count, x.block_id))


def refcount_board_figure(allocator: BlockAllocator, seq_ids: Sequence[Hashable],
                          names: Mapping[Hashable, str] | None = None, highlight: Iterable[int] = (),
                          title: str | None = None) -> go.Figure:
    """§10.4's board from a live allocator: one line per block-table entry, each block with its refcount.

    Shared blocks (ref_count > 1) are pink, private ones green; `highlight` outlines blocks (the
    copy a write just made, and the block it was copied from).
    """
    seq_ids = list(seq_ids)
    if not seq_ids:
        raise ValueError("the board needs at least one sequence")
    blocks = board_blocks(allocator, seq_ids)
    lit = set(highlight)
    bs = allocator.block_size
    height_units = max(len(seq_ids), len(blocks)) - 1 or 1
    seq_y = {s: k * height_units / max(1, len(seq_ids) - 1) for k, s in enumerate(seq_ids)}
    blk_y = {b.block_id: k * height_units / max(1, len(blocks) - 1) for k, b in enumerate(blocks)}
    shared_xy, private_xy = ([], []), ([], [])
    for s in seq_ids:
        for b in allocator.block_tables[s]:
            target = shared_xy if allocator.ref_count(b) > 1 else private_xy
            target[0].extend([0.0, 1.0, None])
            target[1].extend([seq_y[s], blk_y[b], None])
    fig = go.Figure()
    for (xs, ys), name, colour, width in ((shared_xy, "names a shared block", PALETTE["shared"], 3),
                                          (private_xy, "names a private block", PALETTE["used"], 3)):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, line=dict(color=colour, width=width),
                                 hoverinfo="skip"))
    def label(s) -> str:  # a named sequence keeps its name ("branch 3" is not "branch branch 3")
        if names:
            return str(names.get(s, s))
        return s if isinstance(s, str) else f"branch {s}"

    fig.add_trace(go.Scatter(
        x=[0.0] * len(seq_ids), y=[seq_y[s] for s in seq_ids], mode="markers+text", name="sequences",
        marker=dict(size=22, color=[SEQ_COLOURS[k % len(SEQ_COLOURS)] for k in range(len(seq_ids))]),
        text=[f"<b>{html.escape(label(s))}</b>  " for s in seq_ids], textposition="middle left",
        customdata=[[allocator.seq_lens[s]] for s in seq_ids],
        hovertemplate="%{text}: %{customdata[0]} tokens<extra></extra>", showlegend=False))
    fig.add_trace(go.Scatter(
        x=[1.0] * len(blocks), y=[blk_y[b.block_id] for b in blocks], mode="markers+text", name="blocks",
        marker=dict(symbol="square", size=34,
                    color=[PALETTE["shared"] if b.shared else PALETTE["used"] for b in blocks],
                    line=dict(color=[PALETTE["limit"] if b.block_id in lit else "white" for b in blocks],
                              width=[5 if b.block_id in lit else 1 for b in blocks])),
        text=[f"  <b>ref {b.ref_count}</b>  #{b.block_id} ({b.filled}/{bs} tokens)" for b in blocks],
        textposition="middle right", customdata=[[b.block_id, b.ref_count, b.filled] for b in blocks],
        hovertemplate="block #%{customdata[0]}: ref_count %{customdata[1]}, %{customdata[2]} tokens<extra></extra>",
        showlegend=False))
    shared = [b for b in blocks if b.shared]
    default = (f"{len(seq_ids)} sequences name {len(blocks)} physical blocks"
               + (f"; {len(shared)} shared (refcount {', '.join(str(r) for r in sorted({b.ref_count for b in shared}, reverse=True))})"
                  if shared else "; none shared"))
    # the column headers sit a full row above the first row (closer, they touched its labels)
    fig.add_annotation(x=0.0, y=-1.1, text="block tables", showarrow=False, font=dict(size=FONT_SIZE))
    fig.add_annotation(x=1.0, y=-1.1, text=f"physical blocks ({allocator.num_used_blocks} in use)",
                       showarrow=False, font=dict(size=FONT_SIZE))
    return styled(fig, title or default, height=max(420, 120 + 44 * (height_units + 1)),
                  xaxis=dict(visible=False, range=[-0.75, 2.0]),
                  yaxis=dict(visible=False, autorange="reversed"),
                  legend=dict(orientation="h", yanchor="top", y=-0.02, x=0.0),
                  margin=dict(l=20, r=20, t=90, b=60))


# =============================================================================================
# Fan-out: n completions off one prompt, counted on the allocator
# =============================================================================================

def fanout_figure(n: int, prompt: int, output: int, block_size: int, kv_bytes_per_token: int,
                  budget_bytes: float | None = None, unit: str = "GB", title: str | None = None) -> go.Figure:
    """The fan-out bars: what n branches hold unshared and shared, split into prompt and own blocks.

    Block counts are the ledger's `fanout_blocks` (tests prove them equal to `measure_fanout`).
    """
    n, prompt, output = _count("n", n, 1), _count("prompt", prompt, 1), _count("output", output, 1)
    block_size = _count("block_size", block_size, 1)
    unshared, shared = ledger.fanout_blocks(n, prompt, output, block_size)
    prompt_blocks = prompt // block_size  # full prompt blocks: the part forks share for ever
    own = shared - prompt_blocks  # each branch's copied tail and output blocks, all branches
    per_block = block_size * kv_bytes_per_token
    cols = ["unshared: n copies", "shared: copy-on-write"]
    parts = [  # (name, x, block counts, colour)
        ("full prompt blocks, one copy per branch", [cols[0]], [n * prompt_blocks], PALETTE["waste"]),
        ("full prompt blocks, shared by every branch", [cols[1]], [prompt_blocks], PALETTE["shared"]),
        ("each branch's own blocks (tail copy + output)", cols, [unshared - n * prompt_blocks, own], PALETTE["used"]),
    ]
    traces = [go.Bar(x=xs, y=[in_unit(c * per_block, unit) for c in counts], name=name, marker_color=colour,
                     customdata=[[c] for c in counts], width=0.55,
                     hovertemplate=f"{name}: %{{customdata[0]:,}} blocks = %{{y:,.3f}} {unit}<extra></extra>")
              for name, xs, counts, colour in parts]
    totals = [unshared * per_block, shared * per_block]
    top = in_unit(max(totals + ([budget_bytes] if budget_bytes else [])), unit)
    notes = [dict(x=x, y=in_unit(t, unit), text=f"<b>{in_unit(t, unit):,.2f} {unit}</b><br>{blocks:,} blocks",
                  showarrow=False, yanchor="bottom", font=dict(size=FONT_SIZE))
             for x, t, blocks in zip(cols, totals, (unshared, shared))]
    notes.append(dict(x=0.5, xref="paper", y=top * 1.28, text=f"<b>×{unshared / shared:,.2f} from sharing</b>",
                      showarrow=False, font=dict(size=FONT_SIZE + 4, color=PALETTE["shared"])))
    shapes = []
    if budget_bytes:
        b = in_unit(budget_bytes, unit)
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=b, y1=b,
                           line=dict(color=PALETTE["limit"], dash="dash", width=3)))
        notes.append(dict(x=1, xref="paper", y=b, text=f"KV budget {b:,.2f} {unit}", showarrow=False, yanchor="bottom",
                          xanchor="right", font=dict(color=PALETTE["limit"])))
    fig = go.Figure(data=traces, layout=dict(annotations=notes, shapes=shapes))
    return styled(fig, title or f"n = {n} off a {prompt:,}-token prompt, {output:,} tokens each, b = {block_size}",
                  barmode="stack", yaxis=dict(title=bytes_axis_title("KV held", unit, note=False), range=[0, top * 1.4]),
                  legend=dict(orientation="h", yanchor="top", y=-0.12, x=0.0), bargap=0.35, height=520,
                  margin=dict(l=90, r=40, t=90, b=130))


def fanout_readout(n: int, prompt: int, output: int, block_size: int, model: str) -> str:
    m = card.model(model)
    kv = m.kv_bytes_per_token
    budget = ledger.kv_budget_bytes(m, card.gpu())
    tok_u, tok_s = ledger.fanout_tokens(n, prompt, output)
    blk_u, blk_s = ledger.fanout_blocks(n, prompt, output, block_size)
    per_block = block_size * kv
    fits = lambda blocks: "fits" if blocks * per_block <= budget else "does NOT fit"
    return (f"tokens: unshared n × (P + O) = {n} × {prompt + output:,} = {tok_u:,}; shared P + n × O = "
            f"{tok_s:,}; factor {tok_u / tok_s:.4g}×\n"
            f"blocks (b = {block_size}): unshared {blk_u:,} = {blk_u * per_block / 1e9:,.3f} GB ({fits(blk_u)}); "
            f"shared {blk_s:,} = {blk_s * per_block / 1e9:,.3f} GB ({fits(blk_s)}); factor {blk_u / blk_s:.4g}×\n"
            f"{m.name}: {fmt_int(kv)} B per token, one block = {fmt_int(per_block)} B; KV budget on "
            f"{card.gpu().name} = {budget / 1e9:,.2f} GB")


def fanout_panel(n: int = 8, prompt: int = 4096, output: int = 256, block_size: int = 16,
                 model: str | None = None) -> Panel:
    """§10.4 / lab 05: sliders over n, prompt, output, block size and model; bars against the card's KV budget."""
    controls = {
        "n": number_slider("n (branches)", n, 1, 64, 1, integer=True),
        "prompt": selection_slider(PROMPT_OPTIONS, prompt, "prompt (tokens)"),
        "output": selection_slider(OUTPUT_OPTIONS, output, "output (tokens)"),
        "block_size": selection_slider(BLOCK_OPTIONS, block_size, "block size (tokens)"),
        "model": dropdown(attention_options(with_kv=True), model, "model"),
    }

    def figure(n, prompt, output, block_size, model):
        m = card.model(model)
        return fanout_figure(n, prompt, output, block_size, m.kv_bytes_per_token,
                             ledger.kv_budget_bytes(m, card.gpu()))

    return Panel(figure, controls, fanout_readout, title="Fan-out: n completions off one prompt")


# =============================================================================================
# Block size against fork cost
# =============================================================================================

def fork_cost_figure(costs: Sequence[ForkCost], kv_bytes_per_token: int, unit: str = "MB",
                     title: str | None = None) -> go.Figure:
    """Bytes one divergence copies against block size: whole blocks moved, and the prompt tokens in them."""
    if not costs:
        raise ValueError("no fork costs to draw")
    xs = [str(c.block_size) for c in costs]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=[in_unit(c.copied_bytes(kv_bytes_per_token), unit) for c in costs],
                         name="copied (whole blocks)", marker_color=PALETTE["memory"],
                         customdata=[[c.copies, c.copied_tokens] for c in costs],
                         hovertemplate="b = %{x}: %{customdata[0]:.3g} copies, %{customdata[1]:,.1f} token slots, "
                                       f"%{{y:,.1f}} {unit}<extra></extra>"))
    fig.add_trace(go.Bar(x=xs, y=[in_unit(c.filled_bytes(kv_bytes_per_token), unit) for c in costs],
                         name="of which prompt tokens", marker_color=PALETTE["used"],
                         hovertemplate=f"b = %{{x}}: %{{y:,.1f}} {unit} of real tokens<extra></extra>"))
    c0 = costs[0]
    return styled(fig, title or f"One divergence of n = {c0.n} branches (mean over prompt lengths)",
                  barmode="overlay", xaxis=dict(title="block size b (tokens)", type="category"),
                  yaxis=dict(title=bytes_axis_title("copied", unit)),
                  legend=dict(yanchor="top", y=0.98, x=0.02, bgcolor="rgba(255,255,255,0.8)"),
                  margin=dict(l=110, r=40, t=90, b=80))


# =============================================================================================
# Cross-request prefix sharing: Mooncake hash_ids through the allocator's prefix index
# =============================================================================================

def prefix_sharing_figure(replay: PrefixReplay, title: str | None = None, points: int = 400) -> go.Figure:
    """Cumulative prompt blocks requested against blocks the prefix index had to allocate."""
    idx = np.unique(np.linspace(0, replay.requests - 1, min(points, replay.requests)).astype(int))
    x = (idx + 1).tolist()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=replay.cum_requested[idx].tolist(), name="prompt blocks requested",
                             line=dict(color=PALETTE["neutral"], width=4)))
    fig.add_trace(go.Scatter(x=x, y=(replay.cum_requested[idx] - replay.cum_hits[idx]).tolist(),
                             name="blocks allocated (misses)", line=dict(color=PALETTE["used"], width=4),
                             fill="tonexty", fillcolor="rgba(204,121,167,0.35)"))
    fig.add_annotation(x=x[-1], y=replay.cum_requested[-1], xanchor="right", yanchor="bottom", showarrow=False,
                       text=f"<b>{100 * replay.hit_rate:.1f}% of {replay.requested_blocks:,} blocks shared</b>",
                       font=dict(size=FONT_SIZE + 2, color=PALETTE["shared"]))
    return styled(fig, title or f"Prefix index on {replay.name}",
                  xaxis=dict(title="requests replayed, in arrival order"),
                  yaxis=dict(title=f"prompt blocks ({replay.block_tokens} tokens)"),
                  legend=dict(orientation="h", yanchor="top", y=-0.3, x=0.0), height=520,
                  margin=dict(l=100, r=40, t=90, b=150))


def prefix_capacity_figure(replays: Sequence[PrefixReplay], unbounded: PrefixReplay | None = None,
                           title: str | None = None) -> go.Figure:
    """Hit rate against the index's capacity (bounded pools evict the least recently freed block)."""
    if not replays:
        raise ValueError("no replays to draw")
    rs = sorted(replays, key=lambda r: r.num_blocks)
    fig = go.Figure(go.Scatter(
        x=[r.num_blocks for r in rs], y=[100 * r.hit_rate for r in rs], mode="lines+markers+text",
        # labels below their points: clear of the axis at the left end and of the ceiling line at the right
        text=[f"{100 * r.hit_rate:.1f}%" for r in rs], textposition="bottom center", name="bounded index",
        line=dict(color=PALETTE["shared"], width=4), marker=dict(size=12),
        hovertemplate="%{x:,} blocks: %{y:.2f}% hit<extra></extra>"))
    if unbounded is not None:
        fig.add_hline(y=100 * unbounded.hit_rate, line=dict(color=PALETTE["limit"], dash="dash", width=3))
        fig.add_annotation(x=0.0, xref="paper", y=100 * unbounded.hit_rate, yanchor="bottom", xanchor="left",
                           showarrow=False, text=f"unbounded: {100 * unbounded.hit_rate:.1f}%",
                           font=dict(color=PALETTE["limit"]))
    top = max([100 * r.hit_rate for r in rs] + ([100 * unbounded.hit_rate] if unbounded else []))
    low, high = math.log10(rs[0].num_blocks), math.log10(rs[-1].num_blocks)
    pad = max(0.15, 0.08 * (high - low))  # room for the end points' labels inside the axes
    return styled(fig, title or f"Hit rate against index capacity ({rs[0].name})", showlegend=False,
                  xaxis=dict(title=f"index capacity ({rs[0].block_tokens}-token blocks, log scale)", type="log",
                             range=[low - pad, high + pad], **log_axis_ticks(rs[0].num_blocks, rs[-1].num_blocks)),
                  yaxis=dict(title="served by the index (%)", range=[0, top * 1.25]))
