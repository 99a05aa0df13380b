"""Figures and panels of the SLO ledger (§10.6, lab 07) and the board's 58–68 minute segment.

Four pictures, each from the real engine or the ledger, never from re-typed numbers (the runs live in
`labsupport.measure.replay`, the arithmetic of TTFT's parts and the three-column table in `labsupport.slo`):

* TTFT as three stacked bars — queueing, prefill, scheduling delay — read off engine runs;
* TPOT against the batch: the weights, your own KV and your neighbours' KV, stacked ("your
  neighbours set your cadence"), with the SLO line and the memory ceiling;
* the three-column table (naive, paged at the memory ceiling, paged at the SLO-limited B), the
  middle column's throughput struck to goodput 0 when its TPOT misses the SLO;
* goodput against the SLO for trace replays through the engine's cost-model clock.

Times are seconds in the data and milliseconds on the axes (the axis titles say so).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import plotly.graph_objects as go

from labsupport import card, ledger
from labsupport.measure.replay import ProbeRun, Replay, UtilizationRun, chat_with_probe
from labsupport.slo import (TTFT_PARTS, Column, TTFTSplit, memory_ceiling, slo_batch, step_tpot_s, three_columns,
                           tpot_terms)
from labsupport.specs import GB, GPUSpec, ModelSpec
from labsupport.viz import reopen
from labsupport.viz import (FONT_SIZE, PALETTE, Panel, a11y, dropdown, fit_width, gpu_options, live_figure,
                            model_options, number_slider, styled)

TTFT_COLOURS = {"queueing": PALETTE["memory"], "prefill": PALETTE["compute"], "scheduling delay": PALETTE["neutral"]}


# --- TTFT: three stacked bars (§10.6) -------------------------------------------------------------


def _fmt_ms(seconds: float) -> str:
    return f"{seconds:,.1f} s" if seconds >= 10 else f"{1e3 * seconds:,.0f} ms"


def ttft_bars_figure(splits: Sequence[TTFTSplit], title: str = "TTFT = queueing + prefill + scheduling delay",
                     normalize: bool = False, height: int = 460) -> go.Figure:
    """§10.6's board: one horizontal stacked bar per request (or run), queueing first, totals at the ends.

    `normalize` draws each bar as shares of its own total (for runs whose totals differ by orders of
    magnitude); the labels still give each term in time units.
    """
    if not splits:
        raise ValueError("ttft_bars_figure needs at least one TTFTSplit")
    labels = [s.label for s in splits]
    scale = [100 / s.total_s if normalize and s.total_s > 0 else 1e3 for s in splits]
    widths = [[s.parts[part] * k for s, k in zip(splits, scale)] for part in TTFT_PARTS]
    top = max(sum(col[i] for col in widths) for i in range(len(splits)))
    fig = go.Figure()
    for part, xs in zip(TTFT_PARTS, widths):
        secs = [s.parts[part] for s in splits]
        fig.add_trace(go.Bar(
            y=labels, x=xs, orientation="h", name=part, marker_color=TTFT_COLOURS[part],
            text=[_fmt_ms(t) if x >= 0.08 * top else "" for x, t in zip(xs, secs)],
            textposition="inside", insidetextanchor="middle", textfont=dict(size=FONT_SIZE, color="white"),
            customdata=[_fmt_ms(t) for t in secs],
            hovertemplate=f"%{{y}}<br>{part}: %{{customdata}}<extra></extra>"))
    for s, k in zip(splits, scale):
        fig.add_annotation(x=s.total_s * k, y=s.label, text=f" {_fmt_ms(s.total_s)}", showarrow=False,
                           xanchor="left", font=dict(size=FONT_SIZE))
    axis = "share of TTFT (%)" if normalize else "time to first token (ms)"
    return styled(fig, title, height=height, barmode="stack",
                  xaxis=dict(title=axis, range=[0, top * 1.25 if top > 0 else 1]),
                  yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.3, x=0, traceorder="normal"),
                  margin=dict(l=280, r=40, t=90, b=130))


# --- TPOT: a property of the batch (§10.6) ----------------------------------------------------------


def tpot_vs_batch_figure(model: ModelSpec, gpu: GPUSpec, seq_tokens: int, batch: int, tpot_slo_s: float = 0.020,
                         block_size: int = 16, measured: Mapping[int, float] | None = None,
                         height: int = 480, tpot_fn=None) -> go.Figure:
    """"Your neighbours set your cadence": TPOT against B, stacked by whose bytes the step moves.

    `measured` maps B to a TPOT (s) read off the engine's cost-model clock; drawn as markers over
    the closed form so a lab can show the two agree.  `tpot_fn(model, gpu, B, seq_tokens)` (lab 07: the
    student's Exercise 7.1) draws its own line over the stack and sets the marker and the SLO's batch.
    """
    ceiling = memory_ceiling(model, gpu, seq_tokens, block_size)
    slo_b = slo_batch(model, gpu, seq_tokens, tpot_slo_s, tpot_fn)
    b_max = max(batch, ceiling, slo_b, 8) * 6 // 5
    bs = list(range(1, b_max + 1, max(1, b_max // 200))) + [b_max]
    per_seq_ms = 1e3 * seq_tokens * model.kv_bytes_per_token / gpu.hbm_bandwidth
    weights_ms = 1e3 * model.weight_bytes / gpu.hbm_bandwidth
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=bs, y=[weights_ms] * len(bs), name="weights (every step)", mode="lines",
                             stackgroup="t", line=dict(color=PALETTE["compute"], width=0),
                             hovertemplate="B = %{x}: weights %{y:.2f} ms<extra></extra>"))
    fig.add_trace(go.Scatter(x=bs, y=[per_seq_ms] * len(bs), name="your KV", mode="lines", stackgroup="t",
                             line=dict(color=PALETTE["used"], width=0),
                             hovertemplate="B = %{x}: your KV %{y:.2f} ms<extra></extra>"))
    fig.add_trace(go.Scatter(x=bs, y=[(b - 1) * per_seq_ms for b in bs], name="neighbours' KV", mode="lines",
                             stackgroup="t", line=dict(color=PALETTE["memory"], width=0),
                             hovertemplate="B = %{x}: neighbours %{y:.2f} ms<extra></extra>"))
    def step_ms(b: int) -> float:
        return 1e3 * step_tpot_s(model, gpu, b, seq_tokens, tpot_fn)

    if tpot_fn is not None:
        fig.add_trace(go.Scatter(x=bs, y=[step_ms(b) for b in bs], name="your tpot()", mode="lines",
                                 line=dict(color=PALETTE["limit"], width=3, dash="dot"),
                                 hovertemplate="B = %{x}: your tpot() %{y:.2f} ms<extra></extra>"))
    tpot_ms = step_ms(batch)
    fig.add_trace(go.Scatter(x=[batch], y=[tpot_ms], mode="markers+text", name=f"you, B = {batch}",
                             marker=dict(size=16, color=PALETTE["limit"], symbol="diamond"),
                             text=[f"  B = {batch}: {tpot_ms:.2f} ms  "],
                             textposition="middle left" if batch > 0.6 * b_max else "middle right",
                             textfont=dict(size=FONT_SIZE + 2), showlegend=False,
                             hovertemplate="B = %{x}: TPOT %{y:.2f} ms<extra></extra>"))
    if measured:
        xs = sorted(measured)
        fig.add_trace(go.Scatter(x=xs, y=[1e3 * measured[b] for b in xs], mode="markers", name="engine (cost-model clock)",
                                 marker=dict(size=11, color="white", line=dict(color=PALETTE["limit"], width=2)),
                                 hovertemplate="engine, B = %{x}: %{y:.2f} ms<extra></extra>"))
    slo_ms = 1e3 * tpot_slo_s
    fig.add_hline(y=slo_ms, line=dict(color=PALETTE["limit"], dash="dash", width=3))
    fig.add_annotation(x=0.01, y=slo_ms, xref="paper", xanchor="left", yanchor="bottom", showarrow=False,
                       text=f"SLO {slo_ms:g} ms → B ≤ {slo_b}", font=dict(size=FONT_SIZE))
    if ceiling:
        fig.add_vline(x=ceiling, line=dict(color=PALETTE["memory"], width=3))
        fig.add_annotation(x=ceiling, y=0.02, yref="paper", xanchor="right", showarrow=False,
                           text=f"memory ceiling {ceiling} ", font=dict(size=FONT_SIZE, color=PALETTE["memory"]))
    y_top = max(slo_ms, 1e3 * ledger.tpot_s(model, b_max, seq_tokens, gpu.hbm_bandwidth), step_ms(b_max)) * 1.08
    return styled(fig, f"Your neighbours set your cadence<br><sup>{seq_tokens:,}-token sequences, {model.name} on {gpu.name}</sup>",
                  height=height, xaxis=dict(title="decode batch B (sequences in the step)", range=[0, b_max]),
                  yaxis=dict(title="TPOT (ms per token)", range=[0, y_top]),
                  legend=dict(orientation="h", y=-0.3, x=0), margin=dict(b=130))


def tpot_readout(model: ModelSpec, gpu: GPUSpec, seq_tokens: int, batch: int, tpot_slo_s: float,
                 block_size: int = 16, tpot_fn=None) -> str:
    t = tpot_terms(model, gpu, batch, seq_tokens)
    total, others = sum(t.values()), t["neighbours' KV"]
    slo_b = slo_batch(model, gpu, seq_tokens, tpot_slo_s, tpot_fn)
    ceiling = memory_ceiling(model, gpu, seq_tokens, block_size)
    if ledger.kv_budget_bytes(model, gpu) <= 0:
        binds = f"the weights ({model.weight_bytes / GB:.1f} GB) leave no room for a KV cache on this card"
    else:
        binds = "the SLO binds before memory" if slo_b < ceiling else "memory binds before the SLO"
    yours = "" if tpot_fn is None else f"; your tpot(): {1e3 * float(tpot_fn(model, gpu, batch, seq_tokens)):.2f} ms"
    return (f"TPOT at B = {batch}: {1e3 * t['weights']:.2f} ms weights + {1e3 * t['your KV']:.3f} ms yours + "
            f"{1e3 * others:.2f} ms your {batch - 1} neighbours' = {1e3 * total:.2f} ms{yours} "
            f"({'meets' if total <= tpot_slo_s else 'misses'} the {1e3 * tpot_slo_s:g} ms SLO)\n"
            f"largest B under the SLO: {slo_b}; memory ceiling (b = {block_size}): {ceiling} — {binds}")


def tpot_panel(batch: int = 186, seq_tokens: int = 640, tpot_slo_ms: float = 20.0, model: str | None = None,
               gpu: str | None = None, measured: Mapping[int, float] | None = None, tpot_fn=None) -> Panel:
    """§10.6: slide B (and the sequence length, the SLO, the card) and watch your own TPOT move; `tpot_fn`
    (lab 07's Exercise 7.1) draws the student's own TPOT and finds the SLO's batch with it."""
    controls = {
        "batch": number_slider("B (sequences)", batch, 1, 400, 1, integer=True),
        "seq_tokens": number_slider("sequence length (tokens)", seq_tokens, 128, 8192, 64, integer=True),
        "tpot_slo_ms": number_slider("TPOT SLO (ms)", tpot_slo_ms, 5, 60, 0.5, readout_format=".1f"),
        "model": dropdown(model_options(), model, "model"),
        "gpu": dropdown(gpu_options(), gpu, "GPU"),
    }
    # the configuration the markers were measured in, as the controls name it (None: the card's, listed first)
    lecture = dict(model=controls["model"].value, gpu=controls["gpu"].value, seq_tokens=seq_tokens)

    def figure(batch, seq_tokens, tpot_slo_ms, model, gpu):
        # engine markers belong to the configuration they were measured in
        same = measured if dict(model=model, gpu=gpu, seq_tokens=seq_tokens) == lecture else None
        return tpot_vs_batch_figure(card.model(model), card.gpu(gpu), seq_tokens, batch, tpot_slo_ms / 1e3, measured=same,
                                    tpot_fn=tpot_fn)

    def readout(batch, seq_tokens, tpot_slo_ms, model, gpu):
        return tpot_readout(card.model(model), card.gpu(gpu), seq_tokens, batch, tpot_slo_ms / 1e3, tpot_fn=tpot_fn)

    return Panel(figure, controls, readout, title="TPOT is a property of the batch")


# --- goodput vs throughput: the three-column table (§10.6) -----------------------------------------


def _ticks_from_zero(top: float, count: int = 5) -> list[float]:
    """Round tick values 0, step, 2 step, ... up to `top` (step 1, 2 or 5 times a power of ten)."""
    if top <= 0:
        return [0.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = min((k * power for k in (1, 2, 5, 10)), key=lambda c: abs(c - raw))
    return [round(i * step, 12) for i in range(int(top // step) + 1)]


def goodput_table_figure(columns: Sequence[Column], height: int = 500) -> go.Figure:
    """The board: throughput and goodput per column; a column that misses the SLO has its throughput
    struck through and 'goodput 0' written beside it."""
    names = [c.name.replace(", ", ",<br>") for c in columns]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=[c.throughput_tok_s for c in columns], name="throughput",
                         marker=dict(color="white", line=dict(color=PALETTE["compute"], width=3)),
                         text=[(f"<s>{c.throughput_tok_s:,.0f}</s>" if not c.meets_slo else f"{c.throughput_tok_s:,.0f}")
                               for c in columns],
                         textposition="outside", textfont=dict(size=FONT_SIZE + 2), cliponaxis=False,
                         hovertemplate="%{x}: throughput %{y:,.0f} tok/s<extra></extra>"))
    fig.add_trace(go.Bar(x=names, y=[c.goodput_tok_s for c in columns], name="goodput (TPOT ≤ SLO)",
                         marker_color=PALETTE["used"],
                         text=[f"{c.goodput_tok_s:,.0f}" if c.meets_slo else "<b>goodput 0</b>" for c in columns],
                         textposition="outside", cliponaxis=False,
                         textfont=dict(size=FONT_SIZE + 4,
                                       color=[PALETTE["limit"] if c.meets_slo else PALETTE["memory"] for c in columns]),
                         hovertemplate="%{x}: goodput %{y:,.0f} tok/s<extra></extra>"))
    top = max([c.throughput_tok_s for c in columns] + [1.0])
    for i, c in enumerate(columns):
        fig.add_annotation(x=names[i], y=-0.15 * top, yref="y", showarrow=False,
                           # two short lines: three one-line labels ran into each other at 700 px
                           text=f"B = {c.batch}<br>TPOT {1e3 * c.tpot_s:.2f} ms" if c.batch else "B = 0:<br>nothing fits",
                           font=dict(size=FONT_SIZE, color=PALETTE["limit"] if c.meets_slo else PALETTE["memory"]))
        if c.batch and not c.meets_slo:  # the strike across the bar itself, as on the board
            fig.add_shape(type="line", xref="x", yref="y", x0=i - 0.36, x1=i - 0.02, y0=0.05 * top,
                          y1=0.95 * c.throughput_tok_s, line=dict(color=PALETTE["memory"], width=6))
    slo = columns[0].tpot_slo_s if columns else 0
    return styled(fig, f"Throughput is not goodput: TPOT SLO {1e3 * slo:g} ms", height=height, barmode="group",
                  yaxis=dict(title="tokens/s (whole card)", range=[-0.26 * top, 1.22 * top],
                             tickvals=_ticks_from_zero(1.22 * top)),  # no negative ticks beside the labels
                  legend=dict(orientation="h", y=1.08, x=0.4), bargap=0.25)


def goodput_table_rows(columns: Sequence[Column]) -> list[dict[str, str]]:
    """The table as text rows (exact and, for the lecture's configuration, printed figures)."""
    rows = []
    for c in columns:
        tput = f"{c.throughput_tok_s:,.0f} tok/s"
        rows.append({"configuration": c.name, "B": f"{c.batch}", "B printed": c.printed_batch,
                     "TPOT": f"{1e3 * c.tpot_s:.2f} ms" if c.batch else "—",
                     "throughput": tput if c.meets_slo else f"~~{tput}~~",
                     "throughput printed": c.printed_throughput,
                     "goodput": f"{c.goodput_tok_s:,.0f} tok/s"})
    return rows


def goodput_table_html(columns: Sequence[Column]) -> str:
    """HTML for the notebook: struck throughput where the SLO is missed, printed figures beside."""
    head = ["configuration", "B (exact)", "B (printed)", "TPOT", "throughput", "throughput (printed)", "goodput"]
    style = f"font-size:{FONT_SIZE}px;padding:4px 14px;text-align:right"
    # Wider than a laptop's output area: it scrolls inside a region a keyboard can reach (WCAG 2.1.1)
    out = ['<div role="region" aria-label="naive against paged: throughput and goodput" tabindex="0" '
           'style="overflow-x:auto"><table style="border-collapse:collapse">',
           "<tr>" + "".join(f'<th scope="col" style="{style}">{h}</th>' for h in head) + "</tr>"]
    for c in columns:
        tput = f"{c.throughput_tok_s:,.0f} tok/s"
        cells = [c.name, f"{c.batch}", c.printed_batch or "", f"{1e3 * c.tpot_s:.2f} ms" if c.batch else "—",
                 tput if c.meets_slo else f"<s>{tput}</s>", c.printed_throughput or "",
                 f"<b>{c.goodput_tok_s:,.0f} tok/s</b>"]
        out.append("<tr>" + "".join(f'<td style="{style}">{v}</td>' for v in cells) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def goodput_table_readout(columns: Sequence[Column]) -> str:
    lines = []
    for c in columns:
        verdict = "meets" if c.meets_slo else "misses"
        lines.append(f"{c.name}: B = {c.batch}, TPOT {1e3 * c.tpot_s:.2f} ms ({verdict} the SLO), "
                     f"throughput {c.throughput_tok_s:,.0f} tok/s, goodput {c.goodput_tok_s:,.0f} tok/s")
    return "\n".join(lines)


def goodput_table_panel(tpot_slo_ms: float = 20.0, seq_tokens: int = 640, model: str | None = None,
                        gpu: str | None = None, tpot_fn=None) -> Panel:
    """§10.6: move the SLO and watch which column's throughput survives as goodput (each column priced by
    `tpot_fn` when given: lab 07 passes the student's Exercise 7.1)."""
    controls = {
        "tpot_slo_ms": number_slider("TPOT SLO (ms)", tpot_slo_ms, 5, 60, 0.5, readout_format=".1f"),
        "seq_tokens": number_slider("sequence length (tokens)", seq_tokens, 128, 4096, 64, integer=True),
        "model": dropdown(model_options(), model, "model"),
        "gpu": dropdown(gpu_options(), gpu, "GPU"),
    }

    def columns(tpot_slo_ms, seq_tokens, model, gpu):
        return three_columns(card.model(model), card.gpu(gpu), seq_tokens, tpot_slo_s=tpot_slo_ms / 1e3, tpot_fn=tpot_fn)

    return Panel(lambda **v: goodput_table_figure(columns(**v)), controls,
                 lambda **v: goodput_table_readout(columns(**v)), title="Which column would you deploy?")


# --- engine runs behind the pictures (cost-model clock: deterministic, H100 scale on a laptop) -------


def ttft_readout(run: ProbeRun) -> str:
    lines = []
    for s in run.splits():
        lines.append(f"{s.label}: queueing {1e3 * s.queueing_s:,.1f} + prefill {1e3 * s.prefill_s:,.1f} + "
                     f"scheduling delay {1e3 * s.scheduling_s:,.1f} = {1e3 * s.total_s:,.1f} ms")
    c = run.result.counters
    lines.append(f"peak batch {c.peak_running} sequences, peak {c.peak_blocks:,} of {run.result.num_blocks:,} blocks")
    return "\n".join(lines)


def _card_words() -> str:
    """The card as a title names it: the lecture's words on its own card, the catalogue's names elsewhere."""
    c = card.card()
    return "H100, lecture 7B" if c.is_lecture else f"{c.gpu.name}, {c.model.name}"


def ttft_panel(rate_per_s: float = 62.0, probe_prompt: int = 4096) -> Panel:
    """§10.6: raise the offered load and watch queueing take over the TTFT (engine runs, cost-model clock)."""
    controls = {
        "rate_per_s": number_slider("offered load (chat requests/s)", rate_per_s, 2, 90, 2, continuous=False),
        "probe_prompt": number_slider("your prompt (tokens)", probe_prompt, 256, 8192, 256, continuous=False, integer=True),
    }
    cache: dict = {}

    def run(rate_per_s, probe_prompt):
        key = (rate_per_s, probe_prompt)
        if key not in cache:
            cache.clear()
            cache[key] = chat_with_probe(rate_per_s, probe_prompt)
        return cache[key]

    def figure(rate_per_s, probe_prompt):
        return ttft_bars_figure(run(rate_per_s, probe_prompt).splits(),
                                title=f"TTFT at {rate_per_s:g} chat requests/s ({_card_words()}, b = 16)")

    return Panel(figure, controls, lambda **v: ttft_readout(run(**v)), title="Where did your TTFT go?")


# --- trace replays and goodput against the SLO ---------------------------------------------------------

def goodput_curve(replay: Replay, ttft_slo_s: float, tpot_slos_s: Sequence[float]) -> list[float]:
    return [replay.goodput_tok_s(ttft_slo_s, p) for p in tpot_slos_s]


_RUN_COLOURS = [PALETTE["memory"], PALETTE["compute"], PALETTE["used"], PALETTE["recompute"], PALETTE["link"]]


def goodput_vs_slo_figure(replays: Sequence[Replay], tpot_slo_ms: float, ttft_slo_s: float,
                          tpot_range_ms: tuple[float, float] = (5.0, 60.0), height: int = 500) -> go.Figure:
    """Goodput (tokens/s of requests meeting both SLOs) against the TPOT SLO, one line per replay;
    each replay's throughput dotted in the same colour: the gap is throughput that bought nothing."""
    if not replays:
        raise ValueError("goodput_vs_slo_figure needs at least one replay")
    lo, hi = tpot_range_ms
    grid = [lo + (hi - lo) * i / 110 for i in range(111)]
    fig = go.Figure()
    top = 0.0
    for i, rp in enumerate(replays):
        colour = _RUN_COLOURS[i % len(_RUN_COLOURS)]
        ys = goodput_curve(rp, ttft_slo_s, [g / 1e3 for g in grid])
        top = max(top, rp.throughput_tok_s, *ys)
        fig.add_trace(go.Scatter(x=grid, y=ys, mode="lines", name=rp.label, line=dict(color=colour, width=4),
                                 hovertemplate=f"{rp.label}<br>SLO %{{x:.1f}} ms: goodput %{{y:,.0f}} tok/s<extra></extra>"))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[rp.throughput_tok_s] * 2, mode="lines", showlegend=False,
                                 line=dict(color=colour, width=2, dash="dot"),
                                 hovertemplate=f"{rp.label}: throughput %{{y:,.0f}} tok/s<extra></extra>"))
        now = rp.goodput_tok_s(ttft_slo_s, tpot_slo_ms / 1e3)
        fig.add_trace(go.Scatter(x=[tpot_slo_ms], y=[now], mode="markers", showlegend=False,
                                 marker=dict(size=14, color=colour, line=dict(color="white", width=2)),
                                 hovertemplate=f"{rp.label}: %{{y:,.0f}} tok/s at %{{x:.1f}} ms<extra></extra>"))
    fig.add_vline(x=tpot_slo_ms, line=dict(color=PALETTE["limit"], dash="dash", width=3))
    fig.add_annotation(x=tpot_slo_ms, y=1.0, yref="paper", yanchor="bottom", showarrow=False,
                       text=f"TPOT SLO {tpot_slo_ms:g} ms, TTFT SLO {ttft_slo_s:g} s", font=dict(size=FONT_SIZE))
    return styled(fig, "Goodput against the SLO (dotted: throughput)", height=height,
                  xaxis=dict(title="TPOT SLO (ms per output token)", range=[lo, hi]),
                  yaxis=dict(title="goodput (tokens/s)", range=[0, top * 1.12 or 1]),
                  legend=dict(orientation="h", y=-0.3, x=0), margin=dict(b=130))


def goodput_slo_readout(replays: Sequence[Replay], tpot_slo_ms: float, ttft_slo_s: float) -> str:
    lines = []
    for rp in replays:
        lines.append(f"{rp.label}: throughput {rp.throughput_tok_s:,.0f} tok/s, goodput "
                     f"{rp.goodput_tok_s(ttft_slo_s, tpot_slo_ms / 1e3):,.0f} tok/s "
                     f"({100 * rp.goodput_frac(ttft_slo_s, tpot_slo_ms / 1e3):.1f}% of requests meet both SLOs)")
    return "\n".join(lines)


def goodput_slo_panel(replays: Sequence[Replay], tpot_slo_ms: float = 20.0, ttft_slo_s: float = 1.0) -> Panel:
    """Slide the SLOs over finished replays: goodput is re-counted, nothing is re-run."""
    replays = list(replays)
    controls = {
        "tpot_slo_ms": number_slider("TPOT SLO (ms)", tpot_slo_ms, 5, 60, 0.5, readout_format=".1f"),
        "ttft_slo_s": number_slider("TTFT SLO (s)", ttft_slo_s, 0.1, 10, 0.1, readout_format=".1f"),
    }
    return Panel(lambda **v: goodput_vs_slo_figure(replays, **v), controls,
                 lambda **v: goodput_slo_readout(replays, **v), title="Goodput is throughput that met its SLO")


class FigureView:
    """A static figure for a notebook, with a deterministic plain-text summary.

    On its own it is shown as plotly's JSON output (no widget: it draws in a notebook reopened
    without a kernel); inside a widget layout (the board) it is `figure`, a FigureWidget, and
    `copy` is the static output that stands in for it after a reopen.
    """

    def __init__(self, figure: go.Figure, text: str = ""):
        import ipywidgets as widgets

        self.figure = live_figure(figure)
        self.widget = widgets.VBox([self.figure, fit_width()])  # inside a layout (the board)
        self.copy = reopen.FigureCopy(figure)
        self.text = text or (figure.layout.title.text or "figure")

    def _repr_mimebundle_(self, **kwargs):
        bundle = dict(self.copy.bundle)
        bundle["text/plain"] = self.text
        return bundle

    def _ipython_display_(self):
        """Shown on its own: the page's hidden Namer first (plotly's static output has no role or name
        in the page; the Namer gives it both, as it does for every panel), then the figure."""
        from IPython.display import display

        namer = a11y.namer()._repr_mimebundle_()
        namer = dict(namer[0] if isinstance(namer, tuple) else namer)  # anywidget's is (data, metadata)
        namer["text/plain"] = ""  # nothing to read where the widget is not drawn
        display(namer, raw=True)
        display(self._repr_mimebundle_(), raw=True)


# --- discussion seed 4 (lab 08): utilization is not throughput -------------------------------------------


def utilization_figure(rates: Sequence[float], sweep: Mapping[str, Sequence[UtilizationRun]],
                       height: int = 480) -> go.Figure:
    """Throughput against offered load for both allocators, each point labelled with its utilization."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput (output tok/s)", "utilization (tokens held ÷ reserved)"),
                        horizontal_spacing=0.12)
    for (label, runs), colour in zip(sweep.items(), (PALETTE["waste"], PALETTE["used"])):
        fig.add_trace(go.Scatter(x=list(rates), y=[r.throughput_tok_s for r in runs], mode="lines+markers", name=label,
                                 line=dict(color=colour, width=4), marker=dict(size=10),
                                 hovertemplate=f"{label}<br>%{{x}} req/s: %{{y:,.0f}} tok/s<extra></extra>"), 1, 1)
        fig.add_trace(go.Scatter(x=list(rates), y=[100 * r.utilization for r in runs], mode="lines+markers",
                                 showlegend=False, line=dict(color=colour, width=4), marker=dict(size=10),
                                 hovertemplate=f"{label}<br>%{{x}} req/s: %{{y:.1f}}%<extra></extra>"), 1, 2)
    fig.update_xaxes(title_text="load (requests/s)")  # two long titles side by side touched
    fig.update_yaxes(range=[0, 105], row=1, col=2, title_text="%")
    return styled(fig, "Utilization 14% → 99%, and throughput does not move — until the naive slots run out",
                  height=height, legend=dict(orientation="h", y=-0.25, x=0))
