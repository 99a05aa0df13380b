"""Figures and slider panels for every lab and the instructor's board (§10.1–§10.7).

One palette (each colour keeps one meaning in every lab), one set of projector-sized fonts, and one
way of writing bytes (labsupport.units: GB is 1e9 bytes, GiB is 2**30, and axis titles say which).

Figure functions are pure: parameters in, a ``plotly`` Figure out, testable without a browser.
`Panel` wires ipywidgets controls to a ``go.FigureWidget``: every change of a control re-runs the
figure function and patches the widget in place, and a readout line states the exact numbers.
Tests set ``panel.controls[name].value`` and read ``panel.figure``; ``python -m labsupport bench viz``
times an update (target: at most 50 ms of Python for a closed-form panel).
"""
from __future__ import annotations

import html
import math
import statistics
import time
from typing import Callable

import plotly.graph_objects as go

from . import ledger
from .specs import GB, GPUS, MODELS, GiB, KiB, MiB, GPUSpec, ModelSpec, get_gpu, get_model
from .units import fmt_bytes, fmt_gb, fmt_int

# Okabe–Ito colours (colour-blind safe).  The meaning is fixed across labs.
PALETTE = {
    "compute": "#0072B2",   # arithmetic: FLOP/s, the ridge point
    "memory": "#D55E00",    # KV memory: budgets, the memory wall, reserved slots
    "used": "#009E73",      # bytes holding real tokens
    "waste": "#E69F00",     # reserved and never filled
    "shared": "#CC79A7",    # blocks shared by copy-on-write or a prefix
    "link": "#56B4E9",      # the host link: swap traffic
    "recompute": "#882255",  # prefill redone after preemption
    "limit": "#222222",     # SLOs, capacities, lines not to cross
    "neutral": "#999999",
}
FONT_FAMILY = "Inter, 'Helvetica Neue', Arial, sans-serif"
FONT_SIZE = 18  # readable from the back of a lecture hall
TITLE_SIZE = 24
HEIGHT = 460

TEMPLATE = go.layout.Template(
    layout=dict(
        font=dict(family=FONT_FAMILY, size=FONT_SIZE, color="#222222"),
        title=dict(font=dict(size=TITLE_SIZE), x=0.02, xanchor="left"),
        colorway=[PALETTE[k] for k in ("compute", "memory", "used", "waste", "shared", "link", "recompute")],
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=dict(showline=True, linecolor="#444444", gridcolor="#E6E6E6", zeroline=False, ticks="outside"),
        yaxis=dict(showline=True, linecolor="#444444", gridcolor="#E6E6E6", zeroline=False, ticks="outside"),
        legend=dict(font=dict(size=FONT_SIZE - 2)),
        hoverlabel=dict(font=dict(size=FONT_SIZE - 2)),
        margin=dict(l=90, r=40, t=90, b=80),
    )
)

BYTE_UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "MB": 10**6, "GB": GB, "GiB": GiB}
UNIT_NOTES = {"GB": "1 GB = 10⁹ B", "GiB": "1 GiB = 2³⁰ B", "MB": "1 MB = 10⁶ B", "MiB": "1 MiB = 2²⁰ B",
              "KiB": "1 KiB = 1,024 B", "B": "bytes"}


def in_unit(n_bytes: float, unit: str = "GB") -> float:
    if unit not in BYTE_UNITS:
        raise ValueError(f"unknown byte unit {unit!r}; choose one of {', '.join(BYTE_UNITS)}")
    return n_bytes / BYTE_UNITS[unit]


def bytes_axis_title(quantity: str, unit: str = "GB", note: bool = True) -> str:
    """Axis titles name the unit and what it means, so GB and GiB never mix silently.

    `note=False` drops the definition for short axes whose readout spells the bytes out.
    """
    in_unit(0, unit)
    return f"{quantity} ({unit}; {UNIT_NOTES[unit]})" if note else f"{quantity} ({unit})"


def styled(fig: go.Figure, title: str, height: int = HEIGHT, **layout) -> go.Figure:
    """Apply the course template, a title and a height: every figure function ends here."""
    fig.update_layout(template=TEMPLATE, title=dict(text=title), height=height, **layout)
    return fig


# --- figures: §10.1 -----------------------------------------------------------------------------

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
                  xaxis=dict(title="decode batch B (log scale)", type="log", range=[0, math.log10(max_batch)]),
                  yaxis=dict(title="attainable TFLOP/s (log scale)", type="log",
                             range=[math.log10(attainable[0]) - 0.1, math.log10(top)]),
                  showlegend=False)


# --- panels ---------------------------------------------------------------------------------------

_PANEL_CSS = (f"<style>.lab-panel .widget-label, .lab-panel .widget-readout, .lab-panel select, "
              f".lab-panel .widget-html-content {{ font-size: {FONT_SIZE}px; }}</style>")


class Panel:
    """Controls wired to a FigureWidget and a readout line; display it as the last line of a cell.

    `make_figure(**values)` and `readout(**values)` receive the controls' values by name.  An input
    the figure function rejects (ValueError) is shown in the readout; the figure keeps its last state.
    """

    def __init__(self, make_figure: Callable[..., go.Figure], controls: dict,
                 readout: Callable[..., str] | None = None, title: str = ""):
        import ipywidgets as widgets

        if not controls:
            raise ValueError("a panel needs at least one control")
        self.title = title
        self.controls = dict(controls)
        self._make_figure = make_figure
        self._readout = readout
        self.updates = 0
        self.error: str | None = None
        self.figure = go.FigureWidget(make_figure(**self.values))
        self.readout = widgets.HTML()
        self._text = self._readout(**self.values) if self._readout else ""
        self.readout.value = self._readout_html()
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        header = widgets.HTML(_PANEL_CSS + (f"<b>{html.escape(title)}</b>" if title else ""))
        self.widget = widgets.VBox([header, widgets.HBox(list(self.controls.values())), self.figure, self.readout])
        self.widget.add_class("lab-panel")

    @property
    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _readout_html(self) -> str:
        text = html.escape(self.error or self._text).replace("\n", "<br>")
        colour = PALETTE["memory"] if self.error else "#222222"
        return f'<div style="font-size:{FONT_SIZE}px;color:{colour};line-height:1.5">{text}</div>'

    def _on_change(self, change=None) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Recompute the figure and readout from the controls and patch the widget in place."""
        values = self.values
        try:
            new = self._make_figure(**values)
            text = self._readout(**values) if self._readout else ""
        except ValueError as exc:
            self.error = f"⚠ {exc}"
        else:
            self.error = None
            self._text = text
            patch_figure(self.figure, new)
            self.updates += 1
        self.readout.value = self._readout_html()

    def text(self) -> str:
        """Plain-text summary: the title, each control's value, and the readout (deterministic)."""
        settings = ", ".join(f"{name}={_label(control)}" for name, control in self.controls.items())
        lines = [f"{self.title or 'Panel'} [{settings}]"]
        lines += (self.error or self._text).splitlines()
        return "\n".join(lines)

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()  # the widget's own repr embeds random trace uids
        return bundle


def _label(control) -> str:
    label = getattr(control, "label", None)
    return str(label if label is not None else control.value)


def patch_figure(target: go.FigureWidget, new: go.Figure) -> None:
    """Make `target` show `new`, editing traces in place when their kinds match (cheap to send)."""
    with target.batch_update():
        same_shape = len(target.data) == len(new.data) and all(
            a.type == b.type for a, b in zip(target.data, new.data))
        if same_shape:
            for old, fresh in zip(target.data, new.data):
                spec = fresh.to_plotly_json()
                spec.pop("type", None)
                spec.pop("uid", None)
                old.update(spec, overwrite=True)
        else:
            target.data = ()
            target.add_traces(list(new.data))
        target.update_layout(new.layout.to_plotly_json(), overwrite=True)


def dropdown(options, value, description: str):
    """A dropdown; `options` is a list of values or a list of (label, value) pairs."""
    import ipywidgets as widgets

    return widgets.Dropdown(options=options, value=value, description=description,
                            style={"description_width": "initial"}, layout=widgets.Layout(width="auto"))


def selection_slider(options, value, description: str, continuous_update: bool = True):
    """A slider over discrete options (e.g. powers of two); `continuous_update=False` for slow panels."""
    import ipywidgets as widgets

    return widgets.SelectionSlider(options=options, value=value, description=description,
                                   continuous_update=continuous_update, style={"description_width": "initial"},
                                   layout=widgets.Layout(width="420px"))


def model_options() -> list[tuple[str, str]]:
    return [(m.name, m.name) for key, m in MODELS.items() if key == m.name]


def gpu_options() -> list[tuple[str, str]]:
    return [(g.name, g.name) for key, g in GPUS.items() if key == g.name]


S_MAX_OPTIONS = [(f"{2**k:,}", 2**k) for k in range(9, 18)]  # 512 … 131,072 tokens


def batch_gap_readout(model: str, gpu: str, s_max: int) -> str:
    m, g = get_model(model), get_gpu(gpu)
    gap = batch_gap(m, g, s_max)
    memory = (f"memory permits B = {gap['memory']:,}: KV budget {fmt_gb(gap['budget'])} "
              f"÷ {fmt_gb(gap['slot'])} per {s_max:,}-token slot")
    if gap["budget"] <= 0:
        memory = f"memory permits B = 0: the weights ({fmt_gb(m.weight_bytes)}) leave no KV budget"
    return (f"compute wants B = {gap['ridge']:,.1f}: {g.peak_flops / 1e12:,.0f} TFLOP/s ÷ "
            f"{g.hbm_bandwidth / GB:,.0f} GB/s × {m.dtype_bytes} B per weight ÷ 2 FLOP per weight\n"
            f"{memory}\n"
            f"one slot = {s_max:,} tokens × {fmt_int(gap['kv_per_token'])} B per token = {fmt_bytes(gap['slot'])}")


def batch_gap_panel(model: str = "lecture-7b", gpu: str = "h100-sxm-80gb", s_max: int = 4096) -> Panel:
    """§10.1 / lab 01: pick a GPU, a model and S_max; see the ridge batch against the memory batch."""
    controls = {
        "gpu": dropdown(gpu_options(), gpu, "GPU"),
        "model": dropdown(model_options(), model, "model"),
        "s_max": selection_slider(S_MAX_OPTIONS, s_max, "S_max (tokens)"),
    }

    def figure(gpu, model, s_max):
        return batch_gap_figure(get_model(model), get_gpu(gpu), s_max)

    return Panel(figure, controls, batch_gap_readout, title="29 against 295: what the arithmetic wants, "
                                                           "what the allocator permits")


def kv_heads_figure(num_kv_heads: int, model: ModelSpec | None = None) -> go.Figure:
    """Lab 00: KV bytes per token of the lecture's 7B shape with `num_kv_heads` KV heads, against MHA."""
    base = model or get_model("lecture-7b")
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
    base = get_model("lecture-7b")
    per_token = base.with_kv_heads(num_kv_heads).kv_bytes_per_token
    return (f"2 × {base.num_layers} layers × {num_kv_heads} KV heads × {base.head_dim} × {base.dtype_bytes} B "
            f"= {fmt_int(per_token)} B = {per_token / KiB:,.0f} KiB per token; "
            f"a 4,096-token sequence holds {fmt_bytes(4096 * per_token)}")


def kv_heads_panel(num_kv_heads: int = 32) -> Panel:
    """Lab 00: a first slider (and a check that widgets render): KV heads against KV bytes per token."""
    controls = {"num_kv_heads": selection_slider([1, 2, 4, 8, 16, 32], num_kv_heads, "KV heads")}
    return Panel(lambda num_kv_heads: kv_heads_figure(num_kv_heads), controls, kv_heads_readout,
                 title="Fewer KV heads, smaller cache (GQA)")


# --- errata -------------------------------------------------------------------------------------

def errata_note(*quantities: str):
    """A Markdown callout for the ledger's errata whose quantity contains any of `quantities`."""
    from IPython.display import Markdown

    chosen = [e for e in ledger.ERRATA if any(q.lower() in e.quantity.lower() for q in quantities)]
    if not chosen:
        raise ValueError(f"no erratum matches {quantities}; have: {'; '.join(e.quantity for e in ledger.ERRATA)}")
    blocks = [f"> **Printed vs exact — {e.quantity}** ({e.section}). The lecture prints *{e.printed}*; "
              f"exact arithmetic gives **{e.exact}**.  \n> {e.why}" for e in chosen]
    return Markdown("\n\n".join(blocks))


# --- benchmark ------------------------------------------------------------------------------------

def time_updates(update, repeats: int) -> list[float]:
    """Milliseconds of Python for each of `repeats` calls of `update(i)`, sorted (the 50 ms budget)."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        update(i)
        times.append(1e3 * (time.perf_counter() - start))
    return sorted(times)


def report_updates(name: str, times_ms: list[float], target_ms: float | None = 50.0) -> None:
    """One line of a panel benchmark: median, p95 and max of sorted update times."""
    p95 = times_ms[min(len(times_ms) - 1, int(0.95 * len(times_ms)))]
    target = f" (target ≤ {target_ms:g} ms)" if target_ms else ""
    print(f"{name}: {len(times_ms)} updates, median {statistics.median(times_ms):.1f} ms, "
          f"p95 {p95:.1f} ms, max {times_ms[-1]:.1f} ms{target}", flush=True)


def bench_panels(cases: dict, argv: list[str] | None, prog: str, repeats: int = 20) -> int:
    """Time panels: `cases` maps a name to (make_panel, control name, values to cycle through)."""
    import argparse

    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--repeats", type=int, default=repeats)
    args = p.parse_args(argv or [])
    for name, (make, control, values) in cases.items():
        panel = make()

        def update(i, panel=panel, control=control, values=values):
            panel.controls[control].value = values[(i + 1) % len(values)]

        report_updates(name, time_updates(update, args.repeats))
    return 0


def bench(argv: list[str] | None = None) -> int:
    """`python -m labsupport bench viz [--repeats N]`: Python time per closed-form panel update."""
    panels = {"batch_gap_panel (lab 01)": (batch_gap_panel, "s_max", [v for _, v in S_MAX_OPTIONS]),
              "kv_heads_panel (lab 00)": (kv_heads_panel, "num_kv_heads", [1, 2, 4, 8, 16, 32])}
    return bench_panels(panels, argv, "python -m labsupport bench viz", repeats=40)
