"""The map of Part II (§10.7, lab 08) and the instructor's board (lab 99: the 75-minute timing plan).

Lab 08: every row of §10.7's "what paging did not fix" table, computed from the real mechanisms and
traces in `labsupport.part_two` (`map_rows`, and the discussion seeds' data), is drawn here next to
the lab that computed it first (`map_table_html`).

Lab 99: `SEGMENTS` follows the lecture's timing plan (0–6, 6–16, 16–36, 36–46, 46–58, 58–68,
68–75).  `segment_view(i)` is one projector-sized panel: the segment's board picture (the same
panels the labs use), its "ask the room" question with the answer folded away, and the confusion to
expect.  Nothing on the board runs anything slow: figures are closed-form or read off small, fast
allocator states, and the two pictures that need engine runs or traces read
``board_data.json`` (written by ``python -m labsupport.viz.board --write``, checked by a test
against a fresh computation).
"""
from __future__ import annotations

import functools
import html
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go

from labsupport import ledger
from labsupport.part_two import MapRow, attention_intensity, map_rows, trace_numbers
from labsupport.slo import TTFTSplit
from labsupport.specs import GB, LECTURE_7B, LECTURE_7B_GQA8, LECTURE_GPU, KiB
from labsupport.viz import FONT_SIZE, PALETTE, TITLE_SIZE, styled

BOARD_DATA = Path(__file__).with_name("board_data.json")


# --- the quantities of §10.7's rows -------------------------------------------------------------------


MAP_COLUMNS = ("still broken after today", "the quantity", "its value here", "where it goes", "computed in")
BOARD_COLUMNS = ("the quantity", "its value here", "where it goes")  # the projector's three


def map_table_html(rows: Sequence[MapRow], links: bool = True, columns: Sequence[str] = MAP_COLUMNS,
                   font_px: int = FONT_SIZE - 2) -> str:
    """§10.7's table as HTML (it renders in every front end; a plotly Table in a widget drew blank cells)."""
    unknown = [c for c in columns if c not in MAP_COLUMNS]
    if unknown:
        raise ValueError(f"unknown map columns {unknown}; choose from {MAP_COLUMNS}")
    style = f"font-size:{font_px}px;padding:6px 12px;text-align:left;vertical-align:top"
    out = ['<table style="border-collapse:collapse">',
           "<tr>" + "".join(f'<th style="{style}">{h}</th>' for h in columns) + "</tr>"]
    for r in rows:
        cells = dict(zip(MAP_COLUMNS, (html.escape(r.broken), f"<b>{html.escape(r.quantity)}</b>",
                                       html.escape(r.value), html.escape(r.where),
                                       r.lab_link if links else f"lab {r.lab}")))
        out.append("<tr>" + "".join(f'<td style="{style}">{cells[c]}</td>' for c in columns) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def map_board_html(rows: Sequence[MapRow]) -> str:
    """§10.7 for the projector: the quantity, its value and the date that attacks it, in large type."""
    title = f'<div style="font-size:{TITLE_SIZE}px;margin:8px 0">What paging did not fix: the map of Part II</div>'
    return title + map_table_html(rows, links=False, columns=BOARD_COLUMNS, font_px=FONT_SIZE + 2)


# --- board data: computed once, shipped, checked by a test ------------------------------------------

def compute_board_data() -> dict:
    """Everything on the board that needs an engine run or a trace (seconds to compute)."""
    from labsupport.viz.slo import chat_with_probe

    ttft = {}
    for rate in (10, 62):
        run = chat_with_probe(rate)
        ttft[str(rate)] = [asdict(s) for s in run.splits()]
    return {"ttft_splits": ttft, "map": trace_numbers()}


def load_board_data(path: Path = BOARD_DATA) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m labsupport.viz.board --write`")
    return json.loads(path.read_text(encoding="utf-8"))


def write_board_data(path: Path = BOARD_DATA) -> dict:
    data = compute_board_data()
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data


# --- the board: one panel per segment of the timing plan ---------------------------------------------

def five_jobs_figure() -> go.Figure:
    """§10.1's board: the five verbs in a column, the resource each contends for, memory circled twice."""
    jobs = [("Admit", "memory — a promise of KV space", True), ("Allocate", "memory — the KV space itself", True),
            ("Batch", "the next forward pass", False), ("Run", "arithmetic (and HBM bandwidth)", False),
            ("Stream", "user-visible per-step latency", False)]
    fig = go.Figure()
    for i, (verb, resource, memory) in enumerate(jobs):
        y = len(jobs) - i
        fig.add_annotation(x=0.05, y=y, text=f"<b>{verb}</b>", showarrow=False, xanchor="left",
                           font=dict(size=TITLE_SIZE + 4))
        fig.add_annotation(x=0.42, y=y, text=resource, showarrow=False, xanchor="left",
                           font=dict(size=TITLE_SIZE, color=PALETTE["memory"] if memory else "#222222"))
        if memory:
            fig.add_shape(type="circle", x0=0.35, x1=0.98, y0=y - 0.38, y1=y + 0.38,
                          line=dict(color=PALETTE["memory"], width=4))
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0.3, len(jobs) + 0.7])
    return styled(fig, "Five jobs, four resources — memory twice", height=520, showlegend=False)


@dataclass(frozen=True)
class Segment:
    """One row of the timing plan."""

    start: int
    end: int
    title: str
    board: str  # what goes on the board, from the instructor notes
    ask: str  # the "ask the room" question
    answer: str
    confusion: str
    protected: bool = False
    lab: str = ""


@functools.cache
def _segments() -> tuple[Segment, ...]:
    """The timing plan, with every number on the board computed by the ledger (printed figure beside).

    Made on first use, not on import: the ledger command's whole-scenario answers are staff-only (not in the
    student release, masked while grading), and lab 08 imports this module for its map of Part II."""
    from labsupport.cli import ledger as staff_ledger

    r = staff_ledger.compute(staff_ledger.Scenario())
    kv, budget = r["kv_bytes_per_token"], r["kv_budget_bytes"]
    seq_bytes = r["seq_tokens"] * kv
    util_32k = ledger.naive_utilization(budget, 32_768, r["seq_tokens"], kv)
    slot_32k = ledger.slot_occupancy(32_768, r["seq_tokens"])
    tail_gb = 199 * (16 / 2) * kv / GB  # §10.3's 1.3%: the lecture's b/2 tail in each of its 199 sequences
    unshared, shared = ledger.fanout_tokens(8, 4096, 256)
    return (
        Segment(0, 6, "Part II opens: 29 against 295 (§10.1)",
                f"Re-board Lecture 2's collision ({r['ridge_batch']:.0f} against {r['naive_concurrency']}), then the "
                "five jobs of an engine, each with the resource it contends for. Circle memory twice. Do not start the "
                "paper yet.",
                "Which of the five can the engine get wrong in a way it cannot recover from?",
                "Admit — the promise has already been made. (This lands §10.5 forty minutes early.)",
                "Students expect a serving system to be a scheduling problem. Say: \"It is a memory-management "
                "problem wearing a scheduler's clothes.\"", lab="01"),
        Segment(6, 16, "The naive allocator (§10.2)",
                f"One 4,096-token slot, the first 640 shaded; then the {r['naive_concurrency']} of them stacked; then "
                f"'9.5 of 62.5' (exact: {r['naive_concurrency'] * seq_bytes / GB:.2f} of {budget / GB:.2f} GB). Only "
                f"then say 15% (exact {100 * r['naive_utilization']:.2f}%, every sequence at the end of its life). "
                "The timing plan's 14% and 86% empty are not that figure rounded: they are a second, consistent "
                "reading, the same cache averaged over each sequence's life "
                f"({100 * r['naive_utilization_time_avg']:.2f}% used, {100 - 100 * r['naive_utilization_time_avg']:.0f}% "
                "empty).",
                "What is the utilization if we raise S_max to 32K to advertise long context?",
                f"The lecture's 1.9% is per slot, as its reasoning says (the slot grew 8× and the occupancy did not): "
                f"one slot's occupancy, 640/32,768 = {100 * slot_32k:.2f}%, written 1.9%. As a share of the budget it "
                f"is lower still: 3 whole slots × 640 tokens of {budget / GB:.2f} GB = {100 * util_32k:.2f}%.",
                "\"Just set S_max per request.\" Good instinct, wrong outcome: internal fragmentation traded for "
                "external (Exercise 2). \"Realloc when it grows\": copying 2 GB mid-decode while 28 others wait.",
                protected=True, lab="02"),
        Segment(16, 36, "PagedAttention: the block table (§10.3, the paper)",
                "Two sequences, logical blocks left, one shared physical pool right, arrows crossing. Grow A by one "
                "token: a new block, one table entry. Then 15.2% → 98.7%: the lecture's 98.7% is 100% minus its "
                f"internal fragmentation, a mean 8-token tail × 199 sequences × {kv // KiB} KiB = "
                f"{tail_gb:.2f} GB, {100 * tail_gb * GB / budget:.1f}% of the budget (exact for 640-token sequences: "
                f"{100 * r['naive_utilization']:.2f}% → {100 * r['paged_utilization']:.2f}% at the end of life; our "
                f"average over each life gives {100 * r['naive_utilization_time_avg']:.2f}% → "
                f"{100 * r['paged_utilization_time_avg']:.2f}%), then 29 → 199 (exact "
                f"{r['naive_concurrency']} → {r['paged_concurrency']}).",
                "What does the attention kernel now have to do? — and then: so where did the cost go?",
                f"Gather: read K and V through the block table. The cost moved into the kernel: same FLOPs and bytes "
                f"({attention_intensity():.0f} FLOP/byte for MHA), an indirect access pattern that a naive gather "
                "pays for in bandwidth.",
                f"Paging does not reduce KV bytes — {kv // KiB} KiB per token is unchanged; it removes "
                "reserved-and-unused bytes. \"Block size 1 is optimal\": look at the 4,096-entry table and the "
                "1-token contiguous run.", protected=True, lab="03"),
        Segment(36, 46, "What paging buys next: sharing (§10.4)",
                "One prompt's blocks, eight branch arrows, refcount 8. One branch writes a token: new block, refcount "
                f"7 + 1. Then 17.9 GB against 3.2 GB (exact {unshared * kv / GB:.2f} GB against {shared * kv / GB:.2f} GB): "
                f"{unshared / shared:.2f}×.",
                "Does anything in this mechanism know the branches came from the same request?",
                "No. Let the silence do the work, then name Nov 9: two users' identical system prompts share blocks "
                "just as soundly.",
                "Beam search gets treated as the motivating case. It is the historical one; the live one is agent "
                "fan-out and shared system prompts.", lab="05"),
        Segment(46, 58, "The engine loop, admission, preemption (§10.5)",
                f"The loop as six verbs in a cycle; the watermark; then derive {1e3 * r['swap_round_trip_s']:.0f} ms "
                f"against {1e3 * r['recompute_s']:.0f} ms live — do not show the result first.",
                f"The engine admitted 199 sequences (the lecture's printed figure; exact {r['paged_concurrency']}) "
                "and they all keep generating. What breaks? — Which of your three "
                "moves is cheapest for the user?",
                "Blocks run out. Refusing new arrivals: nobody resident is hurt — that is why watermarks exist.",
                "Preemption is assumed to lose the sequence's progress. It loses its cache, never its tokens.",
                lab="06"),
        Segment(58, 68, "Sizing and the SLO ledger (§10.6)",
                "TTFT as three stacked bars with queueing biggest. Then the three-column table, then strike out the "
                "middle column's throughput and write 'goodput 0'.",
                "Which column would you deploy?",
                f"Force them to ask for the SLO first. At 20 ms: the SLO-limited column (B = {r['max_batch_for_slo']} "
                f"exact; printed 164). At 25 ms the memory-ceiling column (B = {r['paged_concurrency']}) wins. If "
                "nobody asks for the SLO, that is the lesson.",
                "\"Paging made latency worse, so it is a wash.\" No — it moved the operating point along a frontier "
                f"you could not previously reach. At B = {r['max_batch_for_slo']} you get both.", lab="07"),
        Segment(68, 75, "The map of Part II, and close (§10.7)",
                "Point at the eight dates, each against the quantity in today's arithmetic it attacks. End on \"the "
                f"allocator was the easy 7×\" (exact: {r['naive_concurrency']} → {r['paged_concurrency']} is "
                f"{r['concurrency_gain']:.2f}×).",
                f"Lecture 2 said the machine wants {r['ridge_batch']:.0f} and the memory permits "
                f"{r['naive_concurrency']}. Which of those ceilings was a data structure — and what binds now?",
                f"The allocator was: {r['naive_concurrency']} → {r['paged_concurrency']} takes the batch to "
                f"{r['paged_concurrency'] / r['ridge_batch']:.0%} of the way to {r['ridge_batch']:.0f}, closing "
                f"{(r['paged_concurrency'] - r['naive_concurrency']) / (r['ridge_batch'] - r['naive_concurrency']):.0%} "
                "of the gap (the lecture's 199 closes 64%: its 'two thirds'). "
                f"After paging the SLO binds first ({r['max_batch_for_slo']} < "
                f"{r['paged_concurrency']}): the next eight weeks are scheduling, kernels and bytes. Ask that question "
                "of every ceiling you are shown.",
                "Reading-only, not scheduled: §10.7's table in full. If running long, compress §10.6 to the TTFT "
                "decomposition; never cut §10.2 or §10.3.", lab="08"),
    )


def __getattr__(name: str):
    if name == "SEGMENTS":
        return _segments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _board_picture(index: int, data: dict):
    """The board picture(s) of one segment: figures and panels from the labs' own modules."""
    from labsupport.block_allocator import BlockAllocator
    from labsupport.viz import engine as viz_engine
    from labsupport.viz import memory as viz_memory
    from labsupport.viz import roofline
    from labsupport.viz import sharing as viz_sharing
    from labsupport.viz import slo as viz_slo

    if index == 0:
        return [viz_slo.FigureView(five_jobs_figure(), "the five jobs and their resources"), roofline.batch_gap_panel()]
    if index == 1:
        return [viz_slo.FigureView(viz_memory.slot_figure(4096, 512, 128), "one 4,096-token slot, 640 tokens shaded"),
                viz_memory.naive_panel()]
    if index == 2:
        return [viz_memory.block_table_explorer()]
    if index == 3:
        alloc = BlockAllocator(64, 16)
        alloc.allocate("prompt", 100)
        branches = [f"branch {i}" for i in range(1, 9)]
        for b in branches:
            alloc.fork("prompt", b)
        alloc.free("prompt")
        before = viz_sharing.refcount_board_figure(alloc, branches, title="8 branches, one prompt: refcount 8")
        res = alloc.append_slot(branches[0])
        after = viz_sharing.refcount_board_figure(alloc, branches, highlight=res.cow or (),
                                                  title="branch 1 writes a token: a copy, refcount 7 + 1")
        return [viz_slo.FigureView(before, "refcount 8"), viz_slo.FigureView(after, "refcount 7 + 1"),
                viz_sharing.fanout_panel()]
    if index == 4:
        return [viz_slo.FigureView(swap_recompute_figure(), "swap 67 ms against recompute 129 ms"),
                viz_engine.swap_recompute_panel()]
    if index == 5:
        splits = [TTFTSplit(**s) for s in data["ttft_splits"]["62"]]
        return [viz_slo.FigureView(viz_slo.ttft_bars_figure(splits, title="TTFT on a loaded card (62 chat requests/s)"),
                                   "TTFT split: queueing biggest"), viz_slo.goodput_table_panel()]
    if index == 6:
        import ipywidgets as widgets

        return [widgets.HTML(map_board_html(map_rows(data["map"])))]
    raise IndexError(f"segment index must be 0..{len(_segments()) - 1}, got {index}")


def swap_recompute_figure(seq_tokens: int = 4096) -> go.Figure:
    """§10.5's derivation on the board: the swap round trip against the recompute, MHA and GQA-8."""
    from labsupport.viz import engine as viz_engine

    terms = [viz_engine.swap_recompute(m, LECTURE_GPU, seq_tokens, LECTURE_GPU.link_bandwidth)
             for m in (LECTURE_7B, LECTURE_7B_GQA8)]
    bars = [(m.name, t["swap_s"], t["recompute_s"]) for m, t in zip((LECTURE_7B, LECTURE_7B_GQA8), terms)]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[b[0] for b in bars], y=[1e3 * b[1] for b in bars], name="swap out + in (64 GB/s)",
                         marker_color=PALETTE["link"], text=[f"{1e3 * b[1]:.1f} ms" for b in bars],
                         textposition="outside", textfont=dict(size=FONT_SIZE + 2)))
    fig.add_trace(go.Bar(x=[b[0] for b in bars], y=[1e3 * b[2] for b in bars], name="recompute (50% of peak)",
                         marker_color=PALETTE["recompute"], text=[f"{1e3 * b[2]:.1f} ms" for b in bars],
                         textposition="outside", textfont=dict(size=FONT_SIZE + 2)))
    w, wg = (t["breakeven_bandwidth"] / GB for t in terms)
    return styled(fig, f"A preempted {seq_tokens:,}-token sequence: break-even link {w:.2f} GB/s (MHA), {wg:.2f} GB/s (GQA-8)",
                  height=480, barmode="group", yaxis=dict(title="stall (ms)", range=[0, 160]),
                  legend=dict(orientation="h", y=-0.2, x=0))


def segment_header_html(seg: Segment) -> str:
    flag = ' <span style="color:#D55E00">· protected — never cut</span>' if seg.protected else ""
    return (f'<div style="font-size:{TITLE_SIZE + 8}px;font-weight:bold;margin:8px 0">{seg.start}–{seg.end} min · '
            f'{html.escape(seg.title)}{flag}</div>'
            f'<div style="font-size:{FONT_SIZE + 2}px;margin-bottom:8px"><b>Board:</b> {html.escape(seg.board)}</div>')


def segment_ask_html(seg: Segment) -> str:
    return (f'<div style="font-size:{TITLE_SIZE + 4}px;margin-top:12px;padding:10px;border-left:8px solid '
            f'{PALETTE["compute"]}"><b>Ask the room:</b> {html.escape(seg.ask)}</div>'
            f'<details style="font-size:{FONT_SIZE + 2}px;margin:8px 0"><summary>answer (instructor)</summary>'
            f'{html.escape(seg.answer)}</details>'
            f'<details style="font-size:{FONT_SIZE}px;margin:4px 0"><summary>expect confusion</summary>'
            f'{html.escape(seg.confusion)}</details>')


class SegmentView:
    """One segment of the board as one widget: header, board picture(s), the question."""

    def __init__(self, index: int, data: dict | None = None):
        import ipywidgets as widgets

        if not 0 <= index < len(_segments()):
            raise IndexError(f"segment index must be 0..{len(_segments()) - 1}, got {index}")
        self.segment = _segments()[index]
        self.pictures = _board_picture(index, data if data is not None else load_board_data())
        parts = [widgets.HTML(segment_header_html(self.segment))]
        for p in self.pictures:
            parts.append(p if isinstance(p, widgets.Widget) else p.widget if hasattr(p, "widget") else p.figure)
        parts.append(widgets.HTML(segment_ask_html(self.segment)))
        self.widget = widgets.VBox(parts)

    def text(self) -> str:
        s = self.segment
        return f"{s.start}–{s.end} min: {s.title}\nAsk the room: {s.ask}"

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle

    def copies(self) -> list:
        """What stands in for the segment after a reopen: its header, each picture as last drawn, the ask."""
        from labsupport.viz import reopen

        s = self.segment
        parts = [reopen.Copy({"text/html": segment_header_html(s), "text/plain": f"{s.start}–{s.end} min: {s.title}"})]
        for p in self.pictures:
            parts.append(p.copy if hasattr(p, "copy") else reopen.Copy({"text/html": p.value, "text/plain": s.title}))
        parts.append(reopen.Copy({"text/html": segment_ask_html(s), "text/plain": f"Ask the room: {s.ask}"}))
        return parts

    def _ipython_display_(self):
        from labsupport.viz import reopen

        parts = self.copies()
        note = reopen.NoteCopy(f"Below, this segment of the board as last drawn ({self.segment.start}–"
                               f"{self.segment.end} min).", following=len(parts))
        reopen.show_live(self._repr_mimebundle_(), note, parts)


def segment_view(index: int, data: dict | None = None) -> SegmentView:
    return SegmentView(index, data)


def main(argv: list[str] | None = None) -> int:
    """`python -m labsupport.viz.board --write`: recompute board_data.json (engine runs, traces)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m labsupport.viz.board")
    p.add_argument("--write", action="store_true", help=f"recompute and write {BOARD_DATA.name}")
    args = p.parse_args(argv)
    if args.write:
        write_board_data()
        print(f"wrote {BOARD_DATA}")
    else:
        print(json.dumps(load_board_data(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
