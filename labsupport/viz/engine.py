"""Figures and panels of lab 06: the engine loop, admission and preemption (§10.5, Exercise 4).

Every picture is read off the real `Engine` or the ledger's closed forms; the runs and measurements
live beside the engine (`labsupport.measure.engine_runs`, `labsupport.measure.replay`, `labsupport.measure.machine`):

* the loop streamed: each step's batch re-chosen, tokens appearing per step (`stream_engine`
  records it; `stream_figure`, `stream_panel`, `stream_text` draw);
* overload and the watermark: refusals at admission against preemptions, and blocks in use over
  time, from engine runs on a real trace with the cost-model clock (`labsupport.measure.replay.watermark_sweep`
  measures; `watermark_figure`, `watermark_panel` draw);
* swap against recompute: the two stalls against S, the break-even bandwidth, the crossover, for
  any model, GPU and link (`swap_recompute`, `swap_recompute_figure`, `swap_recompute_panel`,
  `breakeven_figure`);
* your own machine: host↔device copy bandwidth (a host memcpy, labelled as such, where there is no
  device) and the tiny model's prefill rate (`labsupport.measure.machine`), and your personal break-even
  (`personal_breakeven_figure`);
* memory pressure: the same requests under swap, recompute and auto, and the stall each costs
  (`run_requests`, `stall_figure`, `blocks_figure`).

Times are seconds in the data; axes say their unit.
"""
from __future__ import annotations

import html
import math
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labsupport import card, ledger
from labsupport.checks import positive_int as _positive_int
from labsupport.measure.engine_runs import StreamLog
from labsupport.measure.machine import Bandwidth, PrefillRate
from labsupport.measure.replay import OverloadRun
from labsupport.specs import GB, LECTURE_MFU, GPUSpec, ModelSpec
from labsupport.units import fmt_int, log_axis_ticks
from labsupport.viz import (FONT_SIZE, PALETTE, Panel, a11y, attention_options, dropdown, gpu_options, number_slider,
                            selection_slider, styled)

PHASES = ("not here", "waiting", "prefill", "decode", "preempted", "done")
PHASE_COLOURS = {"not here": "#FFFFFF", "waiting": "#F6D7A7", "prefill": PALETTE["compute"],
                 "decode": PALETTE["used"], "preempted": PALETTE["recompute"], "done": "#949494"}  # 3:1 on white
# What a cell shows besides its colour, so no state is told by colour alone: prefill and decode cells
# show the token (a prefill's in bold), waiting and preempted ones a mark, done ones are grey.
PHASE_MARKS = {"not here": "", "waiting": "·", "preempted": "×", "done": ""}
PHASE_NAMES = {"waiting": "waiting ·", "prefill": "prefill (token in bold)", "decode": "decode",
               "preempted": "preempted ×", "done": "done"}
# a horizontal legend under the x-axis title, with room for both (projector fonts are large)
_LEGEND_BELOW = dict(legend=dict(orientation="h", yanchor="top", y=-0.3, x=0.0), margin=dict(l=90, r=40, t=90, b=150),
                     height=520)
# beyond the card's model and its contrast (attention_options), two real GQA models for scale
SWAP_EXTRA_MODELS = ("llama-3-8b", "llama-3-70b")
S_STOPS = (256, 512, 1024, 2048, 4096, 8192, 16_384, 32_768, 65_536, 131_072)  # tokens
LINK_STOPS = (4, 8, 16, 25, 32, 50, 64, 128, 450)  # GB/s: PCIe generations, NVLink-C2C's 450


def s_options() -> list[tuple[str, int]]:
    """The S slider's stops: powers of two, and the card's own crossover on Exercise 4's slower link (the lecture's
    card: 5,195 tokens at 32 GB/s), so the slider can stand where swap and recompute tie."""
    c = card.card()
    cross = round(ledger.crossover_tokens(c.mha, c.slow_link_bandwidth, c.gpu.peak_flops))
    stops = set(S_STOPS) | ({cross} if S_STOPS[0] < cross < S_STOPS[-1] else set())
    return [(f"{s:,}", s) for s in sorted(stops)]


def link_options() -> list[tuple[str, float]]:
    """The link slider's stops (GB/s): the common links, Exercise 4's slower link, and the break-even links of the
    card's two attention forms at S = 4,096 to one decimal (the lecture's card: 33.2 and 8.3 GB/s)."""
    c = card.card()
    edges = {round(ledger.breakeven_link_bandwidth(m, 4096, c.gpu.peak_flops) / GB, 1) for m in (c.mha, c.gqa)}
    stops = set(LINK_STOPS) | {c.slow_link_bandwidth / GB} | {e for e in edges if e > 0}
    return [(f"{g:g} GB/s", g) for g in sorted(stops)]


# =============================================================================================
# The loop, streamed
# =============================================================================================


def _char(tok, decode) -> str:
    if tok is None:
        return "•"
    s = decode([tok]) if decode else str(tok)
    return {"\n": "⏎", " ": "␣", "\t": "⇥"}.get(s, s)


def _seq_label(seq: tuple[int, int], log: StreamLog) -> str:
    return f"r{seq[0]}" if log.n[seq[0]] == 1 else f"r{seq[0]}.{seq[1]}"


DARK_PHASES = ("prefill", "preempted")  # cells white text reads on


def _cell_text(shown_text: str, phase: str, shown: bool) -> str:
    text = html.escape(shown_text) if shown else ""
    return f"<b>{text}</b>" if text and phase == "prefill" else text


def stream_figure(log: StreamLog, upto: int, decode: Callable | None = None, title: str | None = None) -> go.Figure:
    """The loop as a grid: one row per sequence, one column per step, the token it streamed in the cell.

    Blue cells ran a prefill (admitted this step), green ones decoded, pale orange ones waited for
    admission, purple ones were preempted.  Columns after `upto` are blank: drag the step slider.
    """
    if not log.steps:
        raise ValueError("the log has no steps")
    upto = max(1, min(int(upto), len(log.steps)))
    seqs = log.sequences()
    phases = log.phases()
    code = {p: i for i, p in enumerate(PHASES)}
    z, text = [], []
    for seq in seqs:
        row_z, row_t = [], []
        toks = iter(t for rec in log.steps for (r, b, t, _) in rec.emitted if (r, b) == seq)
        for k, ph in enumerate(phases[seq]):
            tok = next(toks) if ph in ("prefill", "decode") else None
            shown = k < upto
            row_z.append(code[ph] if shown else 0)
            row_t.append("" if not shown else _char(tok, decode) if ph in ("prefill", "decode") else PHASE_MARKS[ph])
        z.append(row_z)
        text.append(row_t)
    n = len(PHASES)
    colorscale = []
    for i, p in enumerate(PHASES):
        colorscale += [[i / n, PHASE_COLOURS[p]], [(i + 1) / n, PHASE_COLOURS[p]]]
    xs = [rec.step for rec in log.steps]
    labels = [_seq_label(s, log) for s in seqs]
    fig = go.Figure(go.Heatmap(
        z=z, x=xs, y=labels, text=text, colorscale=colorscale, zmin=0, zmax=n, showscale=False, xgap=2, ygap=2,
        hovertemplate="step %{x}, %{y}: %{text}<extra></extra>"))
    # The cells' text, drawn over them in two layers: white where the cell is dark, near-black elsewhere
    # (white on the decode green is 3.4:1, under WCAG's 4.5:1).
    for on_dark in (True, False):
        layer = [[_cell_text(text[i][k], phases[seq][k], k < upto) if (phases[seq][k] in DARK_PHASES) == on_dark
                  else "" for k in range(len(xs))] for i, seq in enumerate(seqs)]
        fig.add_trace(go.Heatmap(
            z=[[0] * len(xs) for _ in seqs], x=xs, y=labels, text=layer, texttemplate="%{text}",
            textfont=dict(size=FONT_SIZE - 2, color=a11y.WHITE if on_dark else a11y.DARK),
            colorscale=[[0, "rgba(0,0,0,0)"], [1, "rgba(0,0,0,0)"]], showscale=False, xgap=2, ygap=2,
            hoverinfo="skip"))
    for p in PHASES[1:]:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=PHASE_NAMES[p],
                                 marker=dict(symbol="square", size=16, color=PHASE_COLOURS[p],
                                             line=dict(color="#444444", width=1))))
    rec = log.steps[upto - 1]
    batch = len(rec.emitted)
    default = (f"step {rec.step}: batch of {batch}, {rec.blocks_in_use} of {log.num_blocks} blocks in use, "
               f"{rec.waiting} waiting")
    return styled(fig, title or default, height=max(360, 110 + 38 * len(seqs)),
                  xaxis=dict(title="engine step", range=[0.5, len(xs) + 0.5], dtick=1 if len(xs) <= 15 else 5,
                             showgrid=False),
                  # every row named: left to itself Plotly thins category labels to r0, r2, r4
                  yaxis=dict(autorange="reversed", showgrid=False, type="category", tickmode="array",
                             tickvals=labels, ticktext=labels),
                  legend=dict(orientation="h", yanchor="top", y=-0.18, x=0.0),
                  margin=dict(l=80, r=20, t=80, b=90))


def stream_readout(log: StreamLog, upto: int, decode: Callable | None = None) -> str:
    upto = max(1, min(int(upto), len(log.steps)))
    rec = log.steps[upto - 1]
    lines = [f"step {rec.step}: ran {len(rec.emitted)} sequence(s); blocks in use {rec.blocks_in_use}/{log.num_blocks}; "
             f"waiting {rec.waiting}, swapped {rec.swapped}"]
    for seq, toks in log.tokens(upto).items():
        text = "".join(_char(t, decode) for t in toks)
        lines.append(f"{_seq_label(seq, log)}: {text}")
    return "\n".join(lines)


def stream_text(log: StreamLog, decode: Callable | None = None) -> str:
    """One line per step: who ran (the batch, re-chosen), what each streamed, who finished and left."""
    lines = []
    for rec in log.steps:
        got = "  ".join(f"{_seq_label((r, b), log)}:{_char(t, decode)}" for r, b, t, _ in rec.emitted)
        done = [_seq_label((r, b), log) for r, b, _, f in rec.emitted if f]
        extra = []
        if rec.arrived:
            extra.append("arrived " + ",".join(f"r{r}" for r in rec.arrived))
        if any(rec.preempted.values()):
            extra.append("preempted " + ", ".join(f"{v} by {k}" for k, v in rec.preempted.items() if v))
        if done:
            extra.append("retired " + ",".join(done))
        lines.append(f"step {rec.step:>3} | B={len(rec.emitted):>2} | {rec.blocks_in_use:>3} blocks | {got}"
                     + (f"   [{'; '.join(extra)}]" if extra else ""))
    return "\n".join(lines)


def stream_panel(log: StreamLog, decode: Callable | None = None, upto: int | None = None) -> Panel:
    """A step slider (and a play button) over a recorded run: watch the batch re-chosen every step."""
    import ipywidgets as widgets

    last = len(log.steps)
    slider = number_slider("engine step (of the run)", last if upto is None else upto, 1, last, 1, integer=True)
    panel = Panel(lambda upto: stream_figure(log, upto, decode), {"upto": slider},
                  lambda upto: stream_readout(log, upto, decode), title="The loop, one step at a time")
    play = widgets.Play(value=slider.value, min=1, max=last, step=1, interval=250, description="play")
    widgets.jslink((play, "value"), (slider, "value"))
    row = panel.widget.children[1]
    row.children = (play, *row.children)
    panel.play = play
    return panel


# =============================================================================================
# Overload: the watermark trades refusals for preemptions
# =============================================================================================

def _pick(runs: Sequence[OverloadRun], watermark: float) -> OverloadRun:
    for r in runs:
        if math.isclose(r.watermark, watermark, abs_tol=1e-12):
            return r
    raise ValueError(f"no run at watermark {watermark!r}; have {[r.watermark for r in runs]}")


def watermark_figure(runs: Sequence[OverloadRun], watermark: float, title: str | None = None) -> go.Figure:
    """Left: requests refused at admission and preemptions against the watermark.  Right: blocks in
    use over time at the chosen watermark, with the pool and the watermark drawn in."""
    if not runs:
        raise ValueError("no runs to draw")
    runs = sorted(runs, key=lambda r: r.watermark)
    cur = _pick(runs, watermark)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.2,
                        specs=[[{"secondary_y": True}, {}]],
                        subplot_titles=("refusals vs preemptions", f"blocks in use, watermark {100 * cur.watermark:g}%"))
    xs = [100 * r.watermark for r in runs]
    fig.add_trace(go.Scatter(x=xs, y=[r.waited for r in runs], name="requests refused at admission",
                             mode="lines+markers", line=dict(color=PALETTE["memory"], width=4), marker=dict(size=10)),
                  row=1, col=1, secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[r.total_preemptions for r in runs], name="preemptions",
                             mode="lines+markers", line=dict(color=PALETTE["recompute"], width=4), marker=dict(size=10)),
                  row=1, col=1, secondary_y=True)
    fig.add_vline(x=100 * cur.watermark, line=dict(color=PALETTE["limit"], dash="dot", width=2), row=1, col=1)
    fig.add_trace(go.Scatter(x=list(cur.block_times), y=list(cur.blocks_in_use), name="blocks in use",
                             mode="lines", line=dict(color=PALETTE["used"], width=2), showlegend=False),
                  row=1, col=2)
    fig.add_hline(y=cur.num_blocks, line=dict(color=PALETTE["limit"], width=3), row=1, col=2)
    if cur.watermark_blocks:
        fig.add_hline(y=cur.num_blocks - cur.watermark_blocks, line=dict(color=PALETTE["memory"], dash="dash", width=2),
                      row=1, col=2)
    # Short axis titles: side by side at 700 px, longer ones ran into each other.
    fig.update_xaxes(title_text="watermark (% of pool)", row=1, col=1)
    # From zero, like the preemptions: an axis fitted to the data (425-455) made a change of a few
    # refusals in hundreds look steep, while the lab's point is that they barely move.
    refused = max([r.waited for r in runs] + [1])
    # automargin and a wider left margin: at 90 px the title's first letter fell off the figure ("equests")
    fig.update_yaxes(title_text="requests refused", color=PALETTE["memory"], row=1, col=1, secondary_y=False,
                     tickformat=",d", range=[0, refused * 1.08], rangemode="tozero", automargin=True,
                     title_standoff=6)
    top = max([r.total_preemptions for r in runs] + [1])
    step = next(k * 10 ** e for e in range(0, 9) for k in (1, 2, 5) if k * 10 ** e * 5 >= top)
    fig.update_yaxes(title_text="preemptions", color=PALETTE["recompute"], row=1, col=1, secondary_y=True,
                     range=[0, step * 5.4], dtick=step, showgrid=False, tickformat=",d", title_standoff=4)
    fig.update_xaxes(title_text="time (s, cost model)", row=1, col=2)
    # No y title on the right: the subplot's title names it, and one here sat on "preemptions".
    fig.update_yaxes(row=1, col=2, range=[0, cur.num_blocks * 1.08], tickformat=",d")
    return styled(fig, title or f"Overload: {cur.requests:,} requests into {cur.num_blocks:,} blocks", height=540,
                  legend=dict(orientation="h", yanchor="top", y=-0.28, x=0.0), margin=dict(l=120, r=40, t=110, b=150))


def watermark_readout(runs: Sequence[OverloadRun], watermark: float) -> str:
    r = _pick(runs, watermark)
    kinds = ", ".join(f"{v} by {k}" for k, v in r.preemptions.items() if v) or "none"
    return (f"watermark {100 * r.watermark:g}% = {r.watermark_blocks:,} of {r.num_blocks:,} blocks kept free for growth\n"
            f"refused at admission (queued before prefill): {r.waited:,} of {r.requests:,} requests; mean queueing "
            f"{r.mean_queueing_s:,.2f} s\n"
            f"preemptions: {r.total_preemptions} ({kinds}); p99 TPOT {1e3 * r.p99_tpot_s:,.1f} ms; "
            f"all done after {r.makespan_s:,.1f} s")


def watermark_panel(runs: Sequence[OverloadRun], watermark: float | None = None) -> Panel:
    """A slider over the watermarks the sweep ran (precomputed, so moving it is instant)."""
    options = [(f"{100 * r.watermark:g}%", r.watermark) for r in sorted(runs, key=lambda r: r.watermark)]
    value = options[0][1] if watermark is None else _pick(runs, watermark).watermark
    controls = {"watermark": selection_slider(options, value, "watermark (free blocks)")}
    return Panel(lambda watermark: watermark_figure(runs, watermark), controls,
                 lambda watermark: watermark_readout(runs, watermark),
                 title="Refuse new arrivals, or preempt the resident?")


# =============================================================================================
# Swap against recompute (§10.5, Exercise 4)
# =============================================================================================

def swap_recompute(model: ModelSpec, gpu: GPUSpec, seq_tokens: int, link_bandwidth: float,
                   mfu: float = LECTURE_MFU) -> dict:
    """Every term of §10.5's derivation for one sequence length, from the ledger (base units)."""
    s = _positive_int("seq_tokens", seq_tokens)
    kv = s * model.kv_bytes_per_token
    weights = 2 * model.num_params * s
    attn = 4 * model.num_layers * model.num_heads * model.head_dim * s * s
    swap = ledger.swap_round_trip_s(kv, link_bandwidth)
    rec = ledger.recompute_s(model, s, gpu.peak_flops, mfu)
    return {"kv_bytes": kv, "swap_s": swap, "weight_flops": weights, "attention_flops": attn,
            "prefill_flops": ledger.prefill_flops(model, s), "recompute_s": rec,
            "breakeven_bandwidth": ledger.breakeven_link_bandwidth(model, s, gpu.peak_flops, mfu),
            "crossover_tokens": ledger.crossover_tokens(model, link_bandwidth, gpu.peak_flops, mfu),
            "choice": ledger.preempt_choice(model, s, link_bandwidth, gpu.peak_flops, mfu)}


TIE_REL = 1e-3  # stalls within 0.1% of each other: the crossover itself, where neither way wins


def verdict_text(d: dict) -> str:
    """What §10.5's comparison says at one S: who wins, or that the two stalls tie (at the crossover)."""
    if math.isclose(d["swap_s"], d["recompute_s"], rel_tol=TIE_REL):
        return "a tie: swap and recompute cost the same"
    return f"{'swap' if d['swap_s'] < d['recompute_s'] else 'recompute'} wins"


def _s_grid(lo: int = 64, hi: int = 262_144, per_octave: int = 8) -> list[int]:
    k0, k1 = math.log2(lo), math.log2(hi)
    return sorted({int(round(2 ** (k0 + i / per_octave))) for i in range(int((k1 - k0) * per_octave) + 1)})


def _log_axis(title: str, values: Sequence[float]) -> dict:
    """A log axis over `values` whose every tick is a readable number (1, 2, 5, 10, ... or 1, 10, 100)."""
    shown = [v for v in values if v is not None and v > 0]
    return dict(title=title, type="log", **log_axis_ticks(min(shown), max(shown)))


def swap_recompute_figure(model: ModelSpec, gpu: GPUSpec, seq_tokens: int, link_bandwidth: float,
                          mfu: float = LECTURE_MFU, title: str | None = None) -> go.Figure:
    """The two stalls against S (log-log): the swap round trip is linear in S, the recompute has an
    S² term; the crossover (if any) and the chosen S are marked."""
    d = swap_recompute(model, gpu, seq_tokens, link_bandwidth, mfu)
    grid = _s_grid()
    swap_ms = [1e3 * ledger.swap_round_trip_s(s * model.kv_bytes_per_token, link_bandwidth) for s in grid]
    rec_ms = [1e3 * ledger.recompute_s(model, s, gpu.peak_flops, mfu) for s in grid]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=grid, y=swap_ms, name=f"swap: 2 × KV ÷ {link_bandwidth / GB:g} GB/s",
                             line=dict(color=PALETTE["link"], width=4),
                             hovertemplate="S = %{x:,}: swap %{y:,.3g} ms<extra></extra>"))
    fig.add_trace(go.Scatter(x=grid, y=rec_ms, name=f"recompute: prefill at {100 * mfu:g}% of peak",
                             line=dict(color=PALETTE["recompute"], width=4),
                             hovertemplate="S = %{x:,}: recompute %{y:,.3g} ms<extra></extra>"))
    fig.add_trace(go.Scatter(x=[seq_tokens, seq_tokens], y=[1e3 * d["swap_s"], 1e3 * d["recompute_s"]],
                             mode="markers+text", name=f"S = {seq_tokens:,}", marker=dict(size=16, color=PALETTE["limit"]),
                             text=[f"{1e3 * d['swap_s']:,.3g} ms", f"{1e3 * d['recompute_s']:,.3g} ms"],
                             textposition=["bottom right", "top left"], textfont=dict(size=FONT_SIZE)))
    cross = d["crossover_tokens"]
    if grid[0] < cross < grid[-1]:
        fig.add_vline(x=cross, line=dict(color=PALETTE["limit"], dash="dash", width=2))
        fig.add_annotation(x=math.log10(cross), y=1, yref="paper", yanchor="bottom", showarrow=False,
                           text=f"crossover {cross:,.0f} tokens", font=dict(size=FONT_SIZE - 2))
    return styled(fig, title or f"At S = {seq_tokens:,}, {verdict_text(d)}<br><sup>{model.name} on {gpu.name}, link "
                                f"{link_bandwidth / GB:g} GB/s</sup>",
                  xaxis=_log_axis("tokens of the preempted sequence, S (log)", grid),
                  yaxis=_log_axis("stall (ms, log)", swap_ms + rec_ms),
                  **_LEGEND_BELOW)


def swap_recompute_readout(seq_tokens: int, link_gbs: float, model: str, gpu: str) -> str:
    m, g = card.model(model), card.gpu(gpu)
    link = link_gbs * GB
    d = swap_recompute(m, g, seq_tokens, link)
    cross = d["crossover_tokens"]
    ratio = max(d['swap_s'], d['recompute_s']) / min(d['swap_s'], d['recompute_s'])
    choice = (f"a tie ({ratio:,.4f}×): at the crossover neither way wins" if verdict_text(d).startswith("a tie")
              else f"{d['choice']} ({ratio:,.2f}× cheaper)")
    cross_text = ("swap wins at every length on this link" if cross == 0 else
                  f"crossover at {cross:,.0f} tokens: recompute below, swap above")
    return (f"KV = {seq_tokens:,} × {fmt_int(m.kv_bytes_per_token)} B = {d['kv_bytes'] / GB:,.3f} GB; swap = 2 × KV ÷ "
            f"{link_gbs:g} GB/s = {1e3 * d['swap_s']:,.1f} ms\n"
            f"recompute = ({d['weight_flops'] / 1e12:,.1f} + {d['attention_flops'] / 1e12:,.1f}) TFLOP ÷ "
            f"{g.peak_flops * LECTURE_MFU / 1e12:,.1f} TFLOP/s = {1e3 * d['recompute_s']:,.1f} ms  →  {choice}\n"
            f"break-even link at this S: W* = 2 × KV × F ÷ FLOPs = {d['breakeven_bandwidth'] / GB:,.2f} GB/s; {cross_text}")


def swap_models() -> list[tuple[str, str]]:
    """The swap panel's menu: the card's model and its contrast, then real GQA models for scale."""
    first = attention_options()
    return first + [(f"{m.name} ({m.attention})", m.name) for m in map(card.model, SWAP_EXTRA_MODELS)
                    if m.name not in {name for _, name in first}]


def swap_recompute_panel(seq_tokens: int = 4096, link_gbs: float = 64, model: str | None = None,
                         gpu: str | None = None) -> Panel:
    """§10.5 / Exercise 4: sliders over S, the link, the model (MHA/GQA) and the GPU."""
    controls = {
        "seq_tokens": selection_slider(s_options(), seq_tokens, "S (tokens)"),
        "link_gbs": selection_slider(link_options(), link_gbs, "host link (GB/s)"),
        "model": dropdown(swap_models(), model, "model"),
        "gpu": dropdown(gpu_options(), gpu, "GPU"),
    }

    def figure(seq_tokens, link_gbs, model, gpu):
        return swap_recompute_figure(card.model(model), card.gpu(gpu), seq_tokens, link_gbs * GB)

    return Panel(figure, controls, swap_recompute_readout, title="Swap or recompute a preempted sequence?")


def breakeven_figure(models: Sequence[ModelSpec], gpu: GPUSpec, link_bandwidth: float | None = None,
                     mfu: float = LECTURE_MFU, marks: Sequence[int] = (4096,), title: str | None = None) -> go.Figure:
    """W*(S) = 2 KV(S) F / FLOPs(S) for each model: it falls with S (the cache is linear, attention quadratic)."""
    grid = _s_grid(128, 131_072)
    colours = (PALETTE["memory"], PALETTE["compute"], PALETTE["recompute"], PALETTE["neutral"])
    fig = go.Figure()
    drawn = []
    for m, colour in zip(models, colours):
        w = [ledger.breakeven_link_bandwidth(m, s, gpu.peak_flops, mfu) / GB for s in grid]
        drawn += w
        fig.add_trace(go.Scatter(x=grid, y=w, name=m.name, line=dict(color=colour, width=4),
                                 hovertemplate=f"{m.name}, S = %{{x:,}}: W* = %{{y:,.2f}} GB/s<extra></extra>"))
        for s in marks:
            v = ledger.breakeven_link_bandwidth(m, s, gpu.peak_flops, mfu) / GB
            fig.add_trace(go.Scatter(x=[s], y=[v], mode="markers+text", marker=dict(size=14, color=colour),
                                     text=[f"{v:,.2f} GB/s"], textposition="middle right", showlegend=False,
                                     textfont=dict(size=FONT_SIZE, color=colour)))
    link = gpu.link_bandwidth if link_bandwidth is None else link_bandwidth
    fig.add_hline(y=link / GB, line=dict(color=PALETTE["link"], dash="dash", width=3))
    fig.add_annotation(x=1, xref="paper", y=math.log10(link / GB), yanchor="bottom", xanchor="right", showarrow=False,
                       text=f"link {link / GB:g} GB/s: swap wins above the curve", font=dict(color=PALETTE["link"]))
    return styled(fig, title or f"Break-even link bandwidth on {gpu.name} at {100 * mfu:g}% of peak",
                  xaxis=_log_axis("tokens of the preempted sequence, S (log)", grid),
                  yaxis=_log_axis("break-even W* (GB/s, log)", drawn + [link / GB]),
                  **_LEGEND_BELOW)


# =============================================================================================
# Your machine
# =============================================================================================


def personal_breakeven_figure(rate: PrefillRate, bandwidth: Bandwidth, title: str | None = None) -> go.Figure:
    """Measured recompute time against the KV round trip at your measured copy rate, per length."""
    xs = list(rate.lengths)
    swap_ms = [1e3 * 2 * n * rate.kv_bytes_per_token / bandwidth.bytes_per_s for n in xs]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=[1e3 * s for s in rate.seconds], name="recompute (measured prefill)",
                             mode="lines+markers", line=dict(color=PALETTE["recompute"], width=4), marker=dict(size=10)))
    fig.add_trace(go.Scatter(x=xs, y=swap_ms, name=f"swap round trip at {bandwidth.bytes_per_s / GB:,.1f} GB/s "
                                                 f"({'measured link' if bandwidth.is_link else 'memcpy stand-in'})",
                             mode="lines+markers", line=dict(color=PALETTE["link"], width=4), marker=dict(size=10)))
    return styled(fig, title or "Your machine: swap or recompute the tiny model's cache?",
                  xaxis=_log_axis("tokens of the preempted sequence, S (log)", xs),
                  yaxis=_log_axis("stall (ms, log)", [1e3 * s for s in rate.seconds] + swap_ms),
                  **_LEGEND_BELOW)


# =============================================================================================
# Memory pressure: the same requests under swap, recompute and auto
# =============================================================================================


def stall_rows(results: Mapping[str, object], reference) -> list[dict]:
    """Per run: preemptions by kind, bytes over the link, recomputed tokens, and the extra clock time
    over the reference run (the stall the preemptions cost, on that run's clock).  `same_tokens` says
    whether every request produced the reference's token ids (None when the engine ran without a model)."""
    has_tokens = any(out for r in reference.requests.values() for out in r.outputs)
    rows = []
    for label, res in results.items():
        c = res.counters
        rows.append({"label": label, "swap": c.preemptions["swap"], "recompute": c.preemptions["recompute"],
                     "swapped_bytes": c.swapped_out_bytes + c.swapped_in_bytes,
                     "recomputed_tokens": c.recomputed_tokens, "clock_s": res.clock_s,
                     "stall_s": res.clock_s - reference.clock_s,
                     "same_tokens": (res.outputs() == reference.outputs()) if has_tokens else None})
    return rows


def _fmt_time(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if abs(value) >= 100 else f"{value:,.3g} {unit}"


def stall_figure(rows: Sequence[dict], unit: str = "ms", title: str | None = None) -> go.Figure:
    """Extra time each preemption mode cost over the run that never preempted."""
    scale = {"s": 1.0, "ms": 1e3, "µs": 1e6}[unit]
    # three short lines per bar, so the labels stay horizontal and inside the figure at 700 px
    labels = [f"{r['label'].replace(', ', '<br>')}<br>{r['swap']} swap, {r['recompute']} rec." for r in rows]
    values = [scale * r["stall_s"] for r in rows]
    fig = go.Figure(go.Bar(
        x=labels, y=values,
        marker_color=[PALETTE["link"] if r["swap"] and not r["recompute"] else
                      PALETTE["recompute"] if r["recompute"] and not r["swap"] else PALETTE["shared"] for r in rows],
        text=[_fmt_time(v, unit) + (" ✓ same tokens" if r.get("same_tokens") else "") for v, r in zip(values, rows)],
        textposition="outside", cliponaxis=False, textfont=dict(size=FONT_SIZE), width=0.6))
    top = max(values + [0])
    return styled(fig, title or "The stall each preemption mode cost", showlegend=False, margin=dict(b=120),
                  xaxis=dict(tickfont=dict(size=FONT_SIZE - 4), tickangle=0),
                  yaxis=dict(title=f"extra time ({unit})", range=[0, top * 1.25 if top > 0 else 1]))


def blocks_figure(results: Mapping[str, object], num_blocks: int, watermark_blocks: int = 0,
                  time_unit: str = "s", title: str | None = None) -> go.Figure:
    """Blocks in use after every step, one line per run, against the pool (and the watermark)."""
    scale = {"s": 1.0, "ms": 1e3, "µs": 1e6}[time_unit]
    colours = (PALETTE["used"], PALETTE["link"], PALETTE["recompute"], PALETTE["shared"], PALETTE["neutral"])
    fig = go.Figure()
    top = num_blocks
    for (label, res), colour in zip(results.items(), colours):
        c = res.counters
        top = max(top, max(c.blocks_in_use, default=0))
        # each point is the pool after a step; the run starts empty at time 0
        fig.add_trace(go.Scatter(x=[0.0] + [scale * t for t in c.block_times], y=[0] + list(c.blocks_in_use),
                                 name=label, mode="lines", line=dict(color=colour, width=3, shape="vh")))
    fig.add_hline(y=num_blocks, line=dict(color=PALETTE["limit"], width=3))
    if watermark_blocks:
        fig.add_hline(y=num_blocks - watermark_blocks, line=dict(color=PALETTE["memory"], dash="dash", width=2))
    return styled(fig, title or f"Blocks in use (pool of {num_blocks:,})",
                  xaxis=dict(title=f"time ({time_unit}, engine clock)"),
                  yaxis=dict(title="blocks in use", range=[0, top * 1.1]),
                  **_LEGEND_BELOW)
