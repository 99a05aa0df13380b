"""Figures and panels for lab 04, the kernel's new job (§10.3 step three; §10.7's first row).

Three pictures:

* the **address map**: where in memory a decode kernel reads each token's keys, for a contiguous
  reserve-to-max cache and for a paged pool whose block tables come from the real
  ``BlockAllocator`` (after a prefill, after sequences decode side by side, or after churn); the
  addresses are computed by the kernels' own ``kv_token_offsets`` (measured in
  ``labsupport.measure.addresses``).  Its runs are the lecture's "kernel's contiguous run".
* the **bytes of one decode step**: the fused paged kernel against gather-then-attend, with the
  block table's share drawn to scale (§10.3: "the FLOPs and the bytes are identical").
* the **bandwidth against block size**: GB/s and % of the device's measured copy bandwidth for the
  gather kernel, the fused paged kernel, the contiguous kernel and gather-then-attend.
"""
from __future__ import annotations

import inspect
import math
import textwrap
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labsupport.measure.addresses import HISTORIES, AddressMap, address_map
from labsupport.checks import positive_int
from labsupport import card
from labsupport.specs import GB, GPUSpec, MiB, ModelSpec
from labsupport.units import fmt_bytes, fmt_int, fmt_seconds
from labsupport.viz import FONT_SIZE, PALETTE, Panel, dropdown, in_unit, model_options, selection_slider, styled

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


# --- the kernel's source, a few lines at a time ------------------------------------------------

def kernel_excerpt(fn, start: str, end: str | None = None) -> str:
    """The lines of ``fn``'s source from the first line containing ``start`` through the first later
    line containing ``end`` (or just that line), dedented.  ``fn`` may be a ``@triton.jit`` function.

    The lab prints the kernel it runs, not a copy of it, so the prose can never drift from the code.
    """
    target = getattr(fn, "fn", fn)
    lines = inspect.getsource(target).splitlines()
    name = getattr(target, "__name__", repr(fn))
    first = next((i for i, line in enumerate(lines) if start in line), None)
    if first is None:
        raise ValueError(f"no line of {name} contains {start!r}")
    last = first
    if end is not None:
        last = next((i for i in range(first, len(lines)) if end in lines[i]), None)
        if last is None:
            raise ValueError(f"no line of {name} after {start!r} contains {end!r}")
    return textwrap.dedent("\n".join(lines[first:last + 1]))


# --- the address map ----------------------------------------------------------------------------


_SEQ_COLOURS = (PALETTE["compute"], PALETTE["memory"], PALETTE["used"], PALETTE["shared"], PALETTE["link"])


def _with_breaks(xs: list[int], ys: list[float], runs: list[int]) -> tuple[list, list]:
    """Insert None between runs so plotly draws each run as its own segment."""
    out_x, out_y, i = [], [], 0
    for run in runs:
        out_x += xs[i:i + run] + [None]
        out_y += ys[i:i + run] + [None]
        i += run
    return out_x, out_y


def address_map_figure(amap: AddressMap, history: str = "") -> go.Figure:
    """Left: a reserve-to-max cache (each sequence one straight run). Right: the paged pool."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("reserve-to-max: [B, S_max, Hkv, D]",
                                        f"paged pool, block {amap.block_size}" + (f", {history}" if history else "")))
    s_max = max(amap.seq_lens)
    unit = MiB
    for seq, n in enumerate(amap.seq_lens):
        colour = _SEQ_COLOURS[seq % len(_SEQ_COLOURS)]
        tokens = list(range(n))
        contiguous = [(seq * s_max + t) * amap.row_bytes / unit for t in tokens]
        fig.add_trace(go.Scatter(x=tokens, y=contiguous, mode="lines", line=dict(color=colour, width=5),
                                 name=f"sequence {chr(65 + seq)}", legendgroup=str(seq),
                                 hovertemplate="token %{x}: %{y:,.3f} MiB<extra></extra>"), row=1, col=1)
        paged = [int(o) * amap.dtype_bytes / unit for o in amap.offsets[seq, :n].tolist()]
        xs, ys = _with_breaks(tokens, paged, amap.runs(seq))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=colour, width=5), showlegend=False,
                                 legendgroup=str(seq), connectgaps=False,
                                 hovertemplate="token %{x}: %{y:,.3f} MiB<extra></extra>"), row=1, col=2)
    # Short axis titles, and the legend a row below them: two long titles side by side touched.
    fig.update_xaxes(title_text="token position")
    fig.update_yaxes(title_text="byte address of its K row (MiB)", row=1, col=1)
    return styled(fig, "Where the kernel reads each token's keys", height=500,
                  legend=dict(orientation="h", y=-0.3, x=0), margin=dict(b=120))


def address_readout(amap: AddressMap) -> str:
    lines = []
    for seq, n in enumerate(amap.seq_lens):
        runs = amap.runs(seq)
        entries = -(-n // amap.block_size)
        lines.append(f"sequence {chr(65 + seq)}: {n:,} tokens in {entries:,} blocks (table entries read), "
                     f"{len(runs):,} contiguous runs, mean {n / len(runs):,.1f} tokens = "
                     f"{fmt_int(n / len(runs) * amap.row_bytes)} B per run (a token's K row for "
                     f"{amap.num_kv_heads} KV heads is {fmt_int(amap.row_bytes)} B)")
    return "\n".join(lines)


def address_panel(seq_lens: tuple[int, ...] = (300, 220, 130), block_size: int = 16,
                  history: str = "decode together") -> Panel:
    """Lab 04: block size and allocation history -> where the kernel's loads land."""
    controls = {
        "block_size": selection_slider(list(BLOCK_SIZES), block_size, "block size (tokens)", continuous_update=False),
        "history": dropdown(list(HISTORIES), history, "how the blocks were handed out"),
    }

    def figure(block_size, history):
        return address_map_figure(address_map(list(seq_lens), block_size, history), history)

    def readout(block_size, history):
        return address_readout(address_map(list(seq_lens), block_size, history))

    return Panel(figure, controls, readout, title="The kernel's contiguous run: addresses read through the block table")


# --- bytes of one decode step ---------------------------------------------------------------------

def step_bytes(batch: int, seq_len: int, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype_bytes: int,
               block_size: int, table_entry_bytes: int = 4) -> dict[str, int]:
    """HBM bytes of one layer's decode attention, by kind, for the fused kernel and for
    gather-then-attend (which writes K/V to a buffer and reads it back)."""
    for name, v in (("batch", batch), ("seq_len", seq_len), ("num_q_heads", num_q_heads),
                    ("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("dtype_bytes", dtype_bytes),
                    ("block_size", block_size)):
        positive_int(name, v)
    kv = 2 * batch * seq_len * num_kv_heads * head_dim * dtype_bytes
    q_out = 2 * batch * num_q_heads * head_dim * dtype_bytes
    table = batch * (-(-seq_len // block_size)) * table_entry_bytes
    return {"kv": kv, "q_out": q_out, "table": table,
            "fused": kv + q_out + table, "gather_then_attend": 3 * kv + q_out + table}


def step_bytes_figure(batch: int, seq_len: int, model: ModelSpec, gpu: GPUSpec, block_size: int) -> go.Figure:
    """Stacked bars: what one decode step's attention (all layers) moves, fused against gather-then-attend."""
    b = step_bytes(batch, seq_len, model.num_heads, model.num_kv_heads, model.head_dim, model.dtype_bytes, block_size)
    layers = model.num_layers
    names = ["fused paged kernel", "gather, then attend"]
    parts = [("K/V read from the pool", [b["kv"], b["kv"]], PALETTE["used"]),
             ("K/V written to a buffer", [0, b["kv"]], PALETTE["waste"]),
             ("buffer read back", [0, b["kv"]], PALETTE["memory"]),
             ("q read + out written", [b["q_out"], b["q_out"]], PALETTE["compute"]),
             ("block table", [b["table"], b["table"]], PALETTE["limit"])]
    fig = go.Figure()
    for label, values, colour in parts:
        fig.add_trace(go.Bar(x=names, y=[in_unit(v * layers, "GB") for v in values], name=label,
                             marker_color=colour, hovertemplate=f"{label}: %{{y:,.3f}} GB<extra></extra>"))
    totals = [b["fused"] * layers, b["gather_then_attend"] * layers]
    for name, total in zip(names, totals):
        fig.add_annotation(x=name, y=in_unit(total, "GB"), yanchor="bottom", showarrow=False,
                           text=f"<b>{in_unit(total, 'GB'):,.2f} GB ≥ {fmt_seconds(total / gpu.hbm_bandwidth)}</b>",
                           font=dict(size=FONT_SIZE))
    return styled(fig, f"One decode step's attention, {layers} layers: B = {batch:,}, S = {seq_len:,}",
                  barmode="stack", yaxis=dict(title="HBM GB per step (10⁹ B)",
                                              range=[0, in_unit(max(totals), "GB") * 1.2]),
                  legend=dict(traceorder="normal"), bargap=0.45)


def step_bytes_readout(batch: int, seq_len: int, model: ModelSpec, gpu: GPUSpec, block_size: int) -> str:
    b = step_bytes(batch, seq_len, model.num_heads, model.num_kv_heads, model.head_dim, model.dtype_bytes, block_size)
    layers = model.num_layers
    flops = 4 * batch * model.num_heads * seq_len * model.head_dim  # q·K and p·V, 2 FLOP per multiply-add
    return (f"per layer: K/V {fmt_bytes(b['kv'])}, q + out {fmt_bytes(b['q_out'])}, block table "
            f"{fmt_bytes(b['table'])} = {b['table'] / b['fused']:.3%} of the fused kernel's bytes\n"
            f"gather-then-attend moves {b['gather_then_attend'] / b['fused']:.2f}× the fused kernel's bytes; "
            f"at {gpu.name}'s {gpu.hbm_bandwidth / GB:,.0f} GB/s the {layers} layers take at least "
            f"{fmt_seconds(b['fused'] * layers / gpu.hbm_bandwidth)} fused, "
            f"{fmt_seconds(b['gather_then_attend'] * layers / gpu.hbm_bandwidth)} gathered\n"
            f"attention intensity: {flops / (b['kv'] + b['q_out']):.2f} FLOP per byte "
            f"({model.num_heads} query heads over {model.num_kv_heads} KV heads), unchanged by paging")


def step_bytes_panel(batch: int = 64, seq_len: int = 4096, model: str | None = None,
                     gpu: str | None = None, block_size: int = 16) -> Panel:
    """Lab 04: B, S, block size and model -> the bytes a decode step's attention moves (time floor on `gpu`); the
    card's GQA form unless told (the kernel lab's model)."""
    model = model or card.card().gqa.name
    controls = {
        "batch": selection_slider([1, 8, 16, 32, 64, 128, 256], batch, "B (sequences)"),
        "seq_len": selection_slider([2**k for k in range(9, 16)], seq_len, "S (tokens)"),
        "block_size": selection_slider(list(BLOCK_SIZES), block_size, "block size (tokens)"),
        "model": dropdown(model_options(), model, "model"),
    }
    gpu_spec = card.gpu(gpu)

    def args(batch, seq_len, block_size, model):
        return batch, seq_len, card.model(model), gpu_spec, block_size

    return Panel(lambda **v: step_bytes_figure(*args(**v)), controls, lambda **v: step_bytes_readout(*args(**v)),
                 title=f"Same bytes, new access pattern: one decode step's attention (time floor on {gpu_spec.name})")


# --- bandwidth against block size ----------------------------------------------------------------

GPU_RESULTS = "data/gpu_results.json"  # written by `python -m labsupport bench gpu`, relative to the repo root
METRICS = ("% of copy bandwidth", "GB/s")
COPY_SHARE_TITLE = METRICS[0]  # the y title: short, a long one ran up into the two-line title


@dataclass(frozen=True)
class BenchResults:
    """Rows of ``labsupport.bench.kernel`` (its ``gather_rows`` and ``decode_rows``) for one machine."""

    label: str
    copy_bandwidth: float  # bytes/s, read + write, measured in the same run
    gather: list[dict]
    decode: list[dict]
    meta: dict

    @property
    def interpreter(self) -> bool:
        return bool(self.meta.get("interpreter"))

    def decode_case(self) -> tuple[int, int, int] | None:
        """(B, S, Hkv) of the decode case measured at the most block sizes (the headline sweep)."""
        counts: dict[tuple[int, int, int], int] = {}
        for r in self.decode:
            if "skipped" not in r:
                key = (r["batch"], r["seq_len"], r["num_kv_heads"])
                counts[key] = counts.get(key, 0) + 1
        return max(counts, key=lambda k: (counts[k], k)) if counts else None


def load_gpu_results(path) -> BenchResults | None:
    """The shipped GPU results, or None when the file does not exist (no GPU run has been committed)."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in ("meta", "copy", "gather", "decode") if key not in data]
    if missing:
        raise ValueError(f"{path} is not a `python -m labsupport bench gpu` results file: no {', '.join(missing)}")
    meta = data["meta"]
    label = f"{meta.get('gpu', 'GPU')}, {str(meta.get('date', ''))[:10]}".rstrip(", ")
    return BenchResults(label, float(data["copy"]["copy_bandwidth"]), list(data["gather"]), list(data["decode"]), meta)


# What the chart can and cannot show, said on the chart itself (issue "Teaching truth, third pass").
GTA_BYTE_COUNT = ("gather-then-attend's “3×” is a byte count (4.4: the K/V bytes cross HBM three times), "
                  "not a measurement")
INTERPRETER_NOTE = ("CPU interpreter: Python runs each kernel program in turn, so paged ≈ contiguous "
                    "cannot be checked on these timings")
NO_DATA_NOTE = "no GPU results shipped: paged ≈ contiguous is unmeasured here"


def chart_notes(results: "BenchResults | None") -> list[str]:
    """The caveats a bandwidth chart of these results prints under its title."""
    if results is None:
        return [NO_DATA_NOTE, GTA_BYTE_COUNT]
    return ([INTERPRETER_NOTE] if results.interpreter else []) + [GTA_BYTE_COUNT]


def _metric_value(metric: str, bytes_moved: float, ms: float | None, copy_bandwidth: float) -> float | None:
    if ms is None or ms <= 0:
        return None
    rate = bytes_moved / (ms * 1e-3)
    return 100 * rate / copy_bandwidth if metric == METRICS[0] else rate / GB


def _log2_axis(block_sizes) -> dict:
    ticks = sorted(set(block_sizes))
    return dict(type="log", tickvals=ticks, ticktext=[str(b) for b in ticks], title="block size (tokens, log)")


def bandwidth_figure(results: BenchResults, metric: str = METRICS[0]) -> go.Figure:
    """Left: the gather kernel (bytes in = bytes out) by block size. Right: decode attention by block
    size — fused paged, contiguous, gather-then-attend and torch SDPA — as effective bandwidth, the
    bytes attention must move (K/V once, q, out) over the time it took."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    case = results.decode_case()
    decode = sorted((r for r in results.decode if "skipped" not in r
                     and (r["batch"], r["seq_len"], r["num_kv_heads"]) == case), key=lambda r: r["block_size"])
    gather = sorted(results.gather, key=lambda r: r["block_size"])
    right = "decode attention" + (f": B = {case[0]:,}, S = {case[1]:,}, Hkv = {case[2]}" if case else "")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("gather kernel (bytes in = bytes out)", right))
    cb = results.copy_bandwidth

    def line(rows, key_ms, bytes_key, name, colour, col, dash=None, width=4):
        xs = [r["block_size"] for r in rows]
        ys = [_metric_value(metric, r[bytes_key], r.get(key_ms), cb) for r in rows]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, line=dict(color=colour, width=width,
                                 dash=dash), marker=dict(size=10),
                                 hovertemplate=f"{name}, block %{{x}}: %{{y:,.1f}}<extra></extra>"), row=1, col=col)

    line(gather, "gather_ms", "bytes_moved", "gather kernel", PALETTE["waste"], 1)
    line(gather, "plain_copy_ms", "bytes_moved", "plain copy, same bytes", PALETTE["neutral"], 1, dash="dot")
    line(decode, "paged_ms", "bytes_moved", "paged attention (fused)", PALETTE["used"], 2)
    line(decode, "contiguous_ms", "bytes_moved", "contiguous attention", PALETTE["compute"], 2, dash="dash")
    line(decode, "gather_then_attend_ms", "bytes_moved", "gather, then attend", PALETTE["memory"], 2)
    if any(r.get("sdpa_ms") for r in decode):
        line(decode, "sdpa_ms", "bytes_moved", "torch SDPA (contiguous)", PALETTE["shared"], 2, dash="dot", width=3)
    ceiling = 100.0 if metric == METRICS[0] else cb / GB
    for col in (1, 2):
        fig.add_hline(y=ceiling, line=dict(color=PALETTE["limit"], dash="dash", width=2), row=1, col=col)
    fig.add_annotation(xref="x2 domain", yref="y2", x=0.0, y=ceiling, yanchor="bottom", xanchor="left",
                       showarrow=False, text=f"measured copy: {cb / GB:,.1f} GB/s", font=dict(size=FONT_SIZE - 2))
    sizes = [r["block_size"] for r in gather + decode] or list(BLOCK_SIZES)
    fig.update_xaxes(**_log2_axis(sizes))
    ytitle = COPY_SHARE_TITLE if metric == METRICS[0] else "effective GB/s (10⁹ B/s)"
    values = [y for trace in fig.data for y in trace.y if y is not None]
    top = max(values + [ceiling]) * 1.15
    fig.update_yaxes(title_text=ytitle, row=1, col=1, range=[0, top])
    fig.update_yaxes(range=[0, top], row=1, col=2)
    notes = "<br>".join(f"<sup>{n}</sup>" for n in chart_notes(results))
    return styled(fig, f"{results.label}<br>{notes}", height=600, legend=dict(orientation="h", y=-0.25, x=0),
                  margin=dict(t=130))


def bandwidth_placeholder_figure(block_sizes=BLOCK_SIZES, metric: str = METRICS[0]) -> go.Figure:
    """The axes, lines and ceiling the shipped GPU results will fill, with no numbers in them."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("gather kernel (bytes in = bytes out)", "decode attention"))
    series = [("gather kernel", PALETTE["waste"], 1, None), ("plain copy, same bytes", PALETTE["neutral"], 1, "dot"),
              ("paged attention (fused)", PALETTE["used"], 2, None),
              ("contiguous attention", PALETTE["compute"], 2, "dash"),
              ("gather, then attend", PALETTE["memory"], 2, None),
              ("torch SDPA (contiguous)", PALETTE["shared"], 2, "dot")]
    for name, colour, col, dash in series:
        # no points: the legend says which lines a GPU run draws, the axes say where
        fig.add_trace(go.Scatter(x=[], y=[], mode="lines+markers", name=name,
                                 line=dict(color=colour, width=4, dash=dash)), row=1, col=col)
    fig.update_xaxes(**_log2_axis(block_sizes), range=[math.log10(min(block_sizes)) - 0.1,
                                                       math.log10(max(block_sizes)) + 0.1])
    if metric == METRICS[0]:
        for col in (1, 2):
            fig.add_hline(y=100, line=dict(color=PALETTE["limit"], dash="dash", width=2), row=1, col=col)
        fig.update_yaxes(range=[0, 115])
    fig.update_yaxes(title_text=COPY_SHARE_TITLE if metric == METRICS[0] else "effective GB/s (10⁹ B/s)",
                     row=1, col=1)
    # The message sits on the title's second line, not over the axes (an overlay hid the right
    # subplot's axis).
    notes = "<br>".join(f"<sup>{n}</sup>" for n in chart_notes(None))
    return styled(fig, "Bandwidth against block size: waiting for a GPU run<br><sup>no GPU results shipped yet: "
                       f"run <b>python -m labsupport bench gpu</b> on a CUDA GPU</sup><br>{notes}",
                  height=600, legend=dict(orientation="h", y=-0.25, x=0), margin=dict(t=160))


def bandwidth_readout(results: BenchResults | None) -> str:
    if results is None:
        return ("No data/gpu_results.json in this repository: no GPU run has been committed. "
                "The chart above shows what a run will fill in; nothing in it is a measurement, so the claim "
                f"paged ≈ contiguous is not checked here. Also: {GTA_BYTE_COUNT}.")
    case = results.decode_case()
    lines = [f"{results.label}: measured copy bandwidth {results.copy_bandwidth / GB:,.1f} GB/s (read + write)"]
    for r in sorted((r for r in results.decode if "skipped" not in r
                     and (r["batch"], r["seq_len"], r["num_kv_heads"]) == case), key=lambda r: r["block_size"]):
        lines.append(f"block {r['block_size']:>3}: paged {r['paged_ms'] * 1e3:,.1f} µs = "
                     f"{100 * r['pct_of_copy']:.3g}% of copy; paged/contiguous "
                     f"{r['paged_ms'] / r['contiguous_ms']:.2f}×; gather-then-attend/paged "
                     f"{r['gather_then_attend_ms'] / r['paged_ms']:.2f}×")
    if results.interpreter:
        lines.append("CPU interpreter: Python runs each kernel program in turn; these timings measure that, not a GPU, "
                     "so they cannot check paged ≈ contiguous.")
    lines.append(f"Note: {GTA_BYTE_COUNT}; the measured ratio is the gather-then-attend/paged column.")
    return "\n".join(lines)


def bandwidth_panel(sources: dict[str, BenchResults | None], metric: str = METRICS[0]) -> Panel:
    """Lab 04: pick a set of results (shipped GPU run, this machine) and a metric; None draws the placeholder."""
    if not sources:
        raise ValueError("bandwidth_panel needs at least one source (use None for 'no GPU results yet')")
    names = list(sources)
    controls = {"source": dropdown(names, names[0], "results"), "metric": dropdown(list(METRICS), metric, "show")}

    def figure(source, metric):
        results = sources[source]
        return bandwidth_placeholder_figure(metric=metric) if results is None else bandwidth_figure(results, metric)

    return Panel(figure, controls, lambda source, metric: bandwidth_readout(sources[source]),
                 title="§10.7's first row, measured: achieved bandwidth on an indirect access")
