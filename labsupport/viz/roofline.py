"""§10.1's collision, drawn: what the arithmetic wants (the ridge batch) against what memory permits (labs 00–01).

Lecture 2 left "29 against 295" on the board: an H100's decode arithmetic wants a batch of 295 and
a reserve-to-max KV cache permits 29.  `batch_gap` reads both from the ledger; the panels let a
student pick the GPU, the model and S_max, and (lab 00) see what fewer KV heads do to the cache.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from labsupport import card, ledger
from labsupport.specs import GB, GPUSpec, KiB, ModelSpec
from labsupport.units import fmt_bytes, fmt_gb, fmt_int, log_axis_ticks
from labsupport.viz import (
    FONT_SIZE,
    HEIGHT,
    PALETTE,
    S_MAX_OPTIONS,
    Panel,
    bytes_axis_title,
    dropdown,
    gpu_options,
    in_unit,
    model_options,
    selection_slider,
    styled,
)


def batch_gap(model: ModelSpec, gpu: GPUSpec, s_max: int, reserved_bytes: float = 4 * GB) -> dict:
    """The two batches of §10.1 from the ledger: what the arithmetic wants, what reserve-to-max permits."""
    kv = ledger.kv_bytes_per_token(model)
    budget = ledger.kv_budget_bytes(model, gpu, reserved_bytes)
    memory = ledger.naive_concurrency(max(0.0, budget), s_max, kv)
    ridge = ledger.ridge_batch(model, gpu)
    return {"ridge": ridge, "memory": memory, "budget": budget, "slot": ledger.naive_slot_bytes(s_max, kv),
            "kv_per_token": kv, "gap": ridge / memory if memory else math.inf}


def batch_gap_figure(model: ModelSpec, gpu: GPUSpec, s_max: int) -> go.Figure:
    """§10.1's collision as two bars: the ridge-point batch against the memory-limited batch."""
    g = batch_gap(model, gpu, s_max)
    names = ["compute wants<br>(ridge point)", "memory permits<br>(reserve-to-max)"]
    values = [g["ridge"], g["memory"]]
    fig = go.Figure(go.Bar(
        x=names, y=values, marker_color=[PALETTE["compute"], PALETTE["memory"]],
        text=[f"{g['ridge']:,.1f}", fmt_int(g["memory"])], textposition="outside", cliponaxis=False,
        hovertemplate="%{x}: B = %{y:,.1f}<extra></extra>", width=0.55,
    ))
    gap = "the weights alone overflow the card" if g["budget"] <= 0 else (
        "no S_max slot fits the KV budget" if g["memory"] == 0 else f"gap ×{g['gap']:,.1f}")
    fig.add_annotation(x=1, y=max(values) * 1.18, text=f"<b>{gap}</b>", showarrow=False,
                       font=dict(size=FONT_SIZE + 2, color=PALETTE["limit"]))
    return styled(fig, f"{model.name} on {gpu.name}, S_max = {s_max:,} tokens",
                  yaxis=dict(title="decode batch B (sequences)", range=[0, max(values) * 1.32]),
                  showlegend=False, bargap=0.4)


def decode_roofline_figure(model: ModelSpec, gpu: GPUSpec, s_max: int, max_batch: int = 2048) -> go.Figure:
    """Lecture 2's decode roofline: attainable FLOP/s against B, the ridge and the memory wall on it.

    Weights-only intensity (2 B / b FLOP per byte): the KV reads that lower it further are §10.6's.
    """
    g = batch_gap(model, gpu, s_max)
    batches = [2 ** (i / 8) for i in range(int(8 * math.log2(max_batch)) + 1)]
    attainable = [min(gpu.peak_flops, b * 2 / model.dtype_bytes * gpu.hbm_bandwidth) / 1e12 for b in batches]
    fig = go.Figure(go.Scatter(x=batches, y=attainable, mode="lines", line=dict(color=PALETTE["compute"], width=4),
                               name="attainable", hovertemplate="B = %{x:,.0f}: %{y:,.0f} TFLOP/s<extra></extra>"))
    top = gpu.peak_flops / 1e12 * 1.6
    fig.add_vline(x=g["ridge"], line=dict(color=PALETTE["compute"], dash="dash", width=3))
    fig.add_annotation(x=math.log10(g["ridge"]), y=math.log10(top), yanchor="top", xanchor="left", showarrow=False,
                       text=f" ridge B = {g['ridge']:,.0f}", font=dict(color=PALETTE["compute"]))
    if g["memory"] >= 1:
        fig.add_vrect(x0=g["memory"], x1=max_batch, fillcolor=PALETTE["memory"], opacity=0.12, line_width=0)
        fig.add_vline(x=g["memory"], line=dict(color=PALETTE["memory"], width=3))
        fig.add_annotation(x=math.log10(g["memory"]), y=math.log10(top), yanchor="top", xanchor="right",
                           showarrow=False, text=f"memory wall B = {g['memory']:,} ", font=dict(color=PALETTE["memory"]))
    return styled(fig, f"Decode roofline: {model.name} on {gpu.name}, S_max = {s_max:,}",
                  xaxis=dict(title="decode batch B (log scale)", type="log", range=[0, math.log10(max_batch)],
                             **log_axis_ticks(1, max_batch)),
                  yaxis=dict(title="attainable TFLOP/s (log scale)", type="log",
                             range=[math.log10(attainable[0]) - 0.1, math.log10(top)],
                             **log_axis_ticks(attainable[0] / 10 ** 0.1, top)),
                  showlegend=False)


def intensity_figure(model: ModelSpec, gpu: GPUSpec, seq_lengths=(0, 87, 640, 4096), max_batch: int = 4096) -> go.Figure:
    """FLOP per byte of a decode step against B, with each sequence's KV reads counted (§10.1, lab 01).

    S = 0 is Lecture 2's weights-only line, 2B / b, which crosses the ridge at B = 295.  With S cached
    tokens per sequence the intensity flattens at (2N + 4 L H d S) / (S x KV per token): for the
    lecture's MHA 7B that is below the H100's ridge for every S over about 87 tokens.
    """
    ridge = gpu.peak_flops / gpu.hbm_bandwidth
    batches = [2 ** (i / 8) for i in range(int(8 * math.log2(max_batch)) + 1)]
    colours = [PALETTE["compute"], PALETTE["used"], PALETTE["memory"], PALETTE["limit"], PALETTE["neutral"]]
    fig = go.Figure()
    for colour, s in zip(colours, seq_lengths):
        label = "weights only (Lecture 2)" if s == 0 else f"S = {s:,} tokens"
        fig.add_trace(go.Scatter(x=batches, y=[ledger.decode_intensity(model, b, s) for b in batches], mode="lines",
                                 name=label, line=dict(color=colour, width=4 if s == 0 else 3),
                                 hovertemplate=f"{label}, B = %{{x:,.0f}}: %{{y:,.1f}} FLOP/B<extra></extra>"))
    fig.add_hline(y=ridge, line=dict(color=PALETTE["compute"], dash="dash", width=2))
    fig.add_annotation(x=0, y=math.log10(ridge), xanchor="left", yanchor="bottom", showarrow=False,
                       text=f" ridge: {ridge:,.0f} FLOP/byte", font=dict(color=PALETTE["compute"]))
    top = max(ridge, ledger.decode_intensity(model, max_batch, 0)) * 2
    # A legend of five below the plot takes height from it: give it back, so the y-axis title fits beside
    # the plot instead of running up into the title.
    return styled(fig, f"Decode intensity with KV reads<br><sup>{model.name} on {gpu.name}</sup>", height=HEIGHT + 120,
                  xaxis=dict(title="decode batch B (log scale)", type="log", range=[0, math.log10(max_batch)],
                             **log_axis_ticks(1, max_batch)),
                  yaxis=dict(title="FLOP per HBM byte (log)", type="log", range=[0, math.log10(top)],
                             **log_axis_ticks(1, top)),
                  legend=dict(orientation="h", y=-0.25, x=0))


def batch_gap_readout(model: str, gpu: str, s_max: int) -> str:
    m, g = card.model(model), card.gpu(gpu)
    gap = batch_gap(m, g, s_max)
    memory = (f"memory permits B = {gap['memory']:,}: KV budget {fmt_gb(gap['budget'])} "
              f"÷ {fmt_gb(gap['slot'])} per {s_max:,}-token slot")
    if gap["budget"] <= 0:
        memory = f"memory permits B = 0: the weights ({fmt_gb(m.weight_bytes)}) leave no KV budget"
    return (f"compute wants B = {gap['ridge']:,.1f}: {g.peak_flops / 1e12:,.0f} TFLOP/s ÷ "
            f"{g.hbm_bandwidth / GB:,.0f} GB/s × {m.dtype_bytes} B per weight ÷ 2 FLOP per weight\n"
            f"{memory}\n"
            f"one slot = {s_max:,} tokens × {fmt_int(gap['kv_per_token'])} B per token = {fmt_bytes(gap['slot'])}")


def batch_gap_panel(model: str | None = None, gpu: str | None = None, s_max: int = 4096) -> Panel:
    """§10.1 / lab 01: pick a GPU, a model and S_max; see the ridge batch against the memory batch."""
    controls = {
        "gpu": dropdown(gpu_options(), gpu, "GPU"),
        "model": dropdown(model_options(), model, "model"),
        "s_max": selection_slider(S_MAX_OPTIONS, s_max, "S_max (tokens)"),
    }

    def figure(gpu, model, s_max):
        return batch_gap_figure(card.model(model), card.gpu(gpu), s_max)

    return Panel(figure, controls, batch_gap_readout, title="Lecture 2's 29 against 295, on your card: what the arithmetic wants, "
                                                           "what the allocator permits")


def kv_heads_figure(num_kv_heads: int, model: ModelSpec | None = None) -> go.Figure:
    """Lab 00: KV bytes per token of the card's model's shape with `num_kv_heads` KV heads, against MHA."""
    base = model or card.card().mha
    if num_kv_heads < 1 or base.num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads must divide the {base.num_heads} query heads, got {num_kv_heads}")
    variant = base.with_kv_heads(num_kv_heads)
    values = [base.kv_bytes_per_token, variant.kv_bytes_per_token]
    fig = go.Figure(go.Bar(
        x=[f"MHA ({base.num_heads} KV heads)", f"{num_kv_heads} KV heads"], y=[in_unit(v, "KiB") for v in values],
        marker_color=[PALETTE["neutral"], PALETTE["memory"]], width=0.5, cliponaxis=False,
        text=[f"{v / KiB:,.0f} KiB" for v in values], textposition="outside",
        hovertemplate="%{x}: %{y:,.0f} KiB per token<extra></extra>",
    ))
    return styled(fig, f"KV cache per token, {base.name} shape", height=420, showlegend=False,
                  yaxis=dict(title=bytes_axis_title("KV per token", "KiB", note=False),
                             range=[0, values[0] / KiB * 1.25]))


def kv_heads_readout(num_kv_heads: int) -> str:
    base = card.card().mha
    per_token = base.with_kv_heads(num_kv_heads).kv_bytes_per_token
    return (f"2 × {base.num_layers} layers × {num_kv_heads} KV heads × {base.head_dim} × {base.dtype_bytes} B "
            f"= {fmt_int(per_token)} B = {per_token / KiB:,.0f} KiB per token; "
            f"a 4,096-token sequence holds {fmt_bytes(4096 * per_token)}")


def kv_heads_panel(num_kv_heads: int | None = None) -> Panel:
    """Lab 00: a first slider (and a check that widgets render): KV heads against KV bytes per token, over the
    KV head counts that divide the card's model's query heads (MHA, all of them, unless told)."""
    heads = card.card().mha.num_heads
    options = [k for k in range(1, heads + 1) if heads % k == 0]
    controls = {"num_kv_heads": selection_slider(options, num_kv_heads or heads, f"n_kv (KV heads of {heads})")}
    return Panel(lambda num_kv_heads: kv_heads_figure(num_kv_heads), controls, kv_heads_readout,
                 title="Fewer KV heads, smaller cache (GQA)")
