"""The map of Part II (§10.7, lab 08) and the instructor's board (lab 99: the 75-minute timing plan).

Lab 08: every row of §10.7's "what paging did not fix" table, computed from the real mechanisms and
traces in `labsupport.part_two` (`map_rows`, and the discussion seeds' data), is drawn here next to
the lab that computed it first (`map_table_html`).

Lab 99: `SEGMENTS` follows the lecture's timing plan (0–6, 6–16, 16–36, 36–46, 46–58, 58–68,
68–75) and `Board` stages it one segment at a time: the room sees the segment's picture and its
question; each "reveal" (→, Page Down) adds the next result in the order the lecture's notes give
(exact figures, the lecture's print beside them where they differ, flagged); the instructor's notes
(board directions, answer, confusion, timing) are folded away.  Every picture is drawn from
labsupport (the ledger's arithmetic, real allocator states); the TTFT bars and the map read
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
from labsupport.part_two import LAB_NAMES, MapRow, attention_intensity, map_rows, trace_numbers
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


# --- the board: one segment of the timing plan at a time -------------------------------------------
#
# Each segment is staged the way the lecture's notes stage it: the room sees the picture and the
# question; each press of "reveal" adds the next result, in the notes' order, to the picture and to
# the lines under it; everything addressed to the instructor (the board directions, the answer,
# the confusion to expect, the timing, the printed-versus-exact reconciliations) is folded away
# under "Instructor notes".  `Board` shows one segment at a time: ← and → (or Page Up / Page Down,
# a presenter's clicker) step through the reveals and the segments.

BOARD_PX = 20  # chart text in design pixels: 16.9 px on screen at 1024 × 768 with the file browser open
# HTML text follows the window: 16.2 px at 1024 wide, 23.4 px at 1920 (floors: 16 and 20 px)
TEXT_CSS = "clamp(16px, calc(8px + 0.8vw), 30px)"
TITLE_CSS = "clamp(20px, calc(10px + 1vw), 36px)"
PICTURE_HEIGHT = 300  # design pixels: 254 on screen at 1024 × 768 (file browser open), 442 at 1920 × 1080
FLAG = "≠ lecture"  # marks an exact figure that differs from the lecture's print

_BOARD_CSS = f"""<style>
.board-deck, .board-deck .widget-html-content {{ font-size: {TEXT_CSS}; line-height: 1.35; }}
.board-deck .board-title {{ font-size: {TITLE_CSS}; font-weight: bold; }}
.board-deck .board-ask {{ border-left: 8px solid {PALETTE["compute"]}; padding: 4px 12px; margin: 4px 0; }}
.board-deck .board-results li {{ margin: 2px 0; }}
.board-deck .board-results ol {{ margin: 2px 0; padding-left: 1.6em; }}
.board-deck .board-flag {{ color: #B34700; font-weight: bold; }}
.board-deck details.board-notes {{ margin-top: 4px; color: #333; }}
.board-deck details.board-notes summary {{ cursor: pointer; color: #444; }}
.board-deck table.board-map td, .board-deck table.board-map th {{ padding: 2px 10px; text-align: left;
    vertical-align: top; font-size: {TEXT_CSS}; }}
</style>"""


@dataclass(frozen=True)
class Segment:
    """One row of the timing plan: what the room sees, and the instructor's notes (folded)."""

    start: int
    end: int
    title: str
    board: str  # the instructor's board directions (notes)
    ask: str  # the question for the room ("" where the lecture asks none)
    answer: str  # notes
    confusion: str  # notes
    reveals: tuple[str, ...] = ()  # the results, in the order the notes give them, one per press
    protected: bool = False
    lab: str = ""

    @property
    def minutes(self) -> int:
        return self.end - self.start


def _flag(exact: str, printed: str) -> str:
    return f'{exact} <span class="board-flag">({FLAG}: {printed})</span>'


@functools.cache
def _numbers() -> dict:
    """The lecture's scenario through the staff ledger (made on first use: its answers are staff-only)."""
    from labsupport.cli import ledger as staff_ledger

    r = dict(staff_ledger.compute(staff_ledger.Scenario()))
    kv, budget = r["kv_bytes_per_token"], r["kv_budget_bytes"]
    r["seq_bytes"] = r["seq_tokens"] * kv
    r["util_32k"] = ledger.naive_utilization(budget, 32_768, r["seq_tokens"], kv)
    r["slot_32k"] = ledger.slot_occupancy(32_768, r["seq_tokens"])
    r["slots_32k"] = ledger.naive_concurrency(budget, 32_768, kv)
    r["fanout"] = ledger.fanout_tokens(8, 4096, 256)
    r["columns"] = [(b, ledger.tpot_s(LECTURE_7B, b, r["seq_tokens"], LECTURE_GPU.hbm_bandwidth))
                    for b in (r["naive_concurrency"], r["paged_concurrency"], r["max_batch_for_slo"])]
    r["block_rows"] = ledger.block_size_table((1, 16, 64, 256), r["paged_concurrency"], budget, kv)
    return r


@functools.cache
def _segments() -> tuple[Segment, ...]:
    """The timing plan, with every number on the board computed by the ledger (printed figure beside).

    Made on first use, not on import: the ledger command's whole-scenario answers are staff-only (not in the
    student release, masked while grading), and lab 08 imports this module for its map of Part II."""
    r = _numbers()
    kv, budget, seq_bytes = r["kv_bytes_per_token"], r["kv_budget_bytes"], r["seq_bytes"]
    util_32k, slot_32k = r["util_32k"], r["slot_32k"]
    tail_gb = 199 * (16 / 2) * kv / GB  # §10.3's 1.3%: the lecture's b/2 tail in each of its 199 sequences
    unshared, shared = r["fanout"]
    naive, paged, slo = r["naive_concurrency"], r["paged_concurrency"], r["max_batch_for_slo"]
    used_gb = naive * seq_bytes / GB
    return (
        Segment(0, 6, "Part II opens: 29 against 295 (§10.1)",
                f"Re-board Lecture 2's collision ({r['ridge_batch']:.0f} against {naive}), then the "
                "five jobs of an engine, each with the resource it contends for. Circle memory twice. Do not start the "
                "paper yet.",
                "Which of the five can the engine get wrong in a way it cannot recover from?",
                "Admit — the promise has already been made. (This lands §10.5 forty minutes early.)",
                "Students expect a serving system to be a scheduling problem. Say: \"It is a memory-management "
                "problem wearing a scheduler's clothes.\"",
                reveals=("<b>Admit.</b> Admitting is a promise of KV space for a length nobody knows yet; once "
                         "made, it cannot be taken back.",), lab="01"),
        Segment(6, 16, "The naive allocator (§10.2)",
                f"One 4,096-token slot, the first 640 shaded; then the {naive} of them stacked; then "
                f"'9.5 of 62.5' (exact: {used_gb:.2f} of {budget / GB:.2f} GB). Only "
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
                reveals=(f"{naive} slots × 640 tokens × 512 KiB = "
                         + _flag(f"<b>{used_gb:.2f} of {budget / GB:.2f} GB</b> hold tokens", "9.5 of 62.5")
                         + " — the rest is reserved and empty.",
                         "Used at the end of each sequence's life: "
                         + _flag(f"<b>{100 * r['naive_utilization']:.2f}%</b>", "15.2%, from 9.5 of 62.5 GB"),
                         f"At S_max = 32K one slot holds 640 of 32,768 tokens: <b>{100 * slot_32k:.2f}%</b> "
                         f"(the lecture's 1.9% per slot); the card fits {r['slots_32k']} slots, "
                         f"{100 * util_32k:.2f}% of the budget."),
                protected=True, lab="02"),
        Segment(16, 36, "PagedAttention: the block table (§10.3, the paper)",
                "Two sequences, logical blocks left, one shared physical pool right, arrows crossing. Grow A by one "
                "token: a new block, one table entry. Then 15.2% → 98.7%: the lecture's 98.7% is 100% minus its "
                f"internal fragmentation, a mean 8-token tail × 199 sequences × {kv // KiB} KiB = "
                f"{tail_gb:.2f} GB, {100 * tail_gb * GB / budget:.1f}% of the budget (exact for 640-token sequences: "
                f"{100 * r['naive_utilization']:.2f}% → {100 * r['paged_utilization']:.2f}% at the end of life; our "
                f"average over each life gives {100 * r['naive_utilization_time_avg']:.2f}% → "
                f"{100 * r['paged_utilization_time_avg']:.2f}%), then 29 → 199 (exact "
                f"{naive} → {paged}).",
                "What does the attention kernel now have to do? — and then: so where did the cost go?",
                f"Gather: read K and V through the block table. The cost moved into the kernel: same FLOPs and bytes "
                f"({attention_intensity():.0f} FLOP/byte for MHA), an indirect access pattern that a naive gather "
                "pays for in bandwidth.",
                f"Paging does not reduce KV bytes — {kv // KiB} KiB per token is unchanged; it removes "
                "reserved-and-unused bytes. \"Block size 1 is optimal\": look at the 4,096-entry table and the "
                "1-token contiguous run.",
                reveals=("A grows by one token past its last block: <b>one new block, one new table entry</b>; "
                         "nothing moves.",
                         "Utilization, naive → paged (b = 16, end of life): "
                         + _flag(f"<b>{100 * r['naive_utilization']:.2f}% → {100 * r['paged_utilization']:.2f}%</b>",
                                 "15.2% → 98.7%, i.e. 100% minus a 1.3% tail"),
                         "Concurrency, naive → paged: " + _flag(f"<b>{naive} → {paged}</b>", "29 → 199"),
                         "The kernel must <b>gather</b> K and V through the block table: the same FLOPs and bytes, "
                         "read indirectly — the cost moved into the kernel.",
                         "Block size trades tail waste against the table and the kernel's contiguous run "
                         "(table on the chart)."),
                protected=True, lab="03"),
        Segment(36, 46, "What paging buys next: sharing (§10.4)",
                "One prompt's blocks, eight branch arrows, refcount 8. One branch writes a token: new block, refcount "
                f"7 + 1. Then 17.9 GB against 3.2 GB (exact {unshared * kv / GB:.2f} GB against {shared * kv / GB:.2f} GB): "
                f"{unshared / shared:.2f}×.",
                "Does anything in this mechanism know the branches came from the same request?",
                "No. Let the silence do the work, then name Nov 9: two users' identical system prompts share blocks "
                "just as soundly.",
                "Beam search gets treated as the motivating case. It is the historical one; the live one is agent "
                "fan-out and shared system prompts.",
                reveals=("Branch 1 writes a token into the shared last block: <b>a copy, refcount 7 + 1</b>.",
                         "8 completions of 256 tokens off a 4,096-token prompt: "
                         + _flag(f"<b>{unshared * kv / GB:.2f} GB against {shared * kv / GB:.2f} GB</b>",
                                 "17.9 GB against 3.2 GB")
                         + f", {unshared:,} → {shared:,} tokens, <b>{unshared / shared:.2f}×</b>",
                         "<b>No.</b> Blocks are shared because their tokens are identical; nothing names the "
                         "request — two users' identical system prompts could share them too (Nov 9)."),
                lab="05"),
        Segment(46, 58, "The engine loop, admission, preemption (§10.5)",
                f"The loop as six verbs in a cycle; the watermark; then derive {1e3 * r['swap_round_trip_s']:.0f} ms "
                f"against {1e3 * r['recompute_s']:.0f} ms live — do not show the result first. The ask's full card "
                f"is the lecture's 199 sequences (exact {paged}).",
                "The engine admitted a full card and every sequence keeps generating. What breaks? — Which of your "
                "three moves is cheapest for the user?",
                "Blocks run out. Refusing new arrivals: nobody resident is hurt — that is why watermarks exist.",
                "Preemption is assumed to lose the sequence's progress. It loses its cache, never its tokens.",
                reveals=(f"Swap a preempted 4,096-token sequence out and back: 2 × {4096 * kv / GB:.3f} GB ÷ 64 GB/s "
                         f"= <b>{1e3 * r['swap_round_trip_s']:.1f} ms</b>",
                         f"Recompute its prefill: {r['recompute_flops'] / 1e12:.1f} TFLOP ÷ (50% × 989 TFLOP/s) = "
                         f"<b>{1e3 * r['recompute_s']:.1f} ms</b>",
                         "A full card that keeps generating <b>runs out of blocks</b>.",
                         "Cheapest for the user: <b>refuse new arrivals</b> — nobody resident is hurt. That is "
                         "why the watermark exists."),
                lab="06"),
        Segment(58, 68, "Sizing and the SLO ledger (§10.6)",
                "TTFT as three stacked bars with queueing biggest. Then the three-column table, then strike out the "
                "middle column's throughput and write 'goodput 0'.",
                "Which column would you deploy?",
                f"Force them to ask for the SLO first. At 20 ms: the SLO-limited column (B = {slo} "
                f"exact; printed 164). At 25 ms the memory-ceiling column (B = {paged}) wins. If "
                "nobody asks for the SLO, that is the lesson.",
                "\"Paging made latency worse, so it is a wash.\" No — it moved the operating point along a frontier "
                f"you could not previously reach. At B = {slo} you get both.",
                reveals=("TPOT and throughput of each column (on the chart).",
                         "At a 20 ms TPOT SLO the middle column's every request misses: <b>goodput 0</b>.",
                         f"Ask for the SLO first: at 20 ms deploy <b>B = {slo}</b> — after paging the SLO binds "
                         "before memory does."),
                lab="07"),
        Segment(68, 75, "The map of Part II, and close (§10.7)",
                "Point at the eight dates, each against the quantity in today's arithmetic it attacks. End on \"the "
                f"allocator was the easy 7×\" (exact: {naive} → {paged} is "
                f"{r['concurrency_gain']:.2f}×).",
                "",
                f"The allocator was: {naive} → {paged} takes the batch to "
                f"{paged / r['ridge_batch']:.0%} of the way to {r['ridge_batch']:.0f}, closing "
                f"{(paged - naive) / (r['ridge_batch'] - naive):.0%} "
                "of the gap (the lecture's 199 closes 64%: its 'two thirds'). "
                f"After paging the SLO binds first ({slo} < "
                f"{paged}): the next eight weeks are scheduling, kernels and bytes.",
                "Reading-only, not scheduled: §10.7's table in full. If running long, compress §10.6 to the TTFT "
                "decomposition; never cut §10.2 or §10.3.",
                reveals=("The allocator was the easy 7×: "
                         + _flag(f"<b>{naive} → {paged}, {r['concurrency_gain']:.2f}×</b>", "29 → 199, 6.9×"),),
                lab="08"),
    )


def __getattr__(name: str):
    if name == "SEGMENTS":
        return _segments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- the pictures: one function per segment, `step` = how many results are revealed -----------------

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


def _board(fig: go.Figure, title: str, height: int = PICTURE_HEIGHT, **layout) -> go.Figure:
    fig = styled(fig, title, height=height, **layout)
    fig.update_layout(uniformtext=dict(minsize=BOARD_PX, mode="show"))  # plotly shrinks bar text that is tight
    return board_sized(fig)


def _note(fig: go.Figure, x: float, y: float, text: str, colour: str = "#222222", **kw) -> None:
    fig.add_annotation(x=x, y=y, xref="paper", yref="paper", text=text, showarrow=False,
                       font=dict(size=BOARD_PX, color=colour), **kw)


def five_jobs_figure(step: int = 0) -> go.Figure:
    """§10.1's board: the five verbs in a column, the resource each contends for, memory circled twice;
    revealed: Admit, the one the engine cannot take back."""
    jobs = [("Admit", "memory — a promise of KV space", True), ("Allocate", "memory — the KV space itself", True),
            ("Batch", "the next forward pass", False), ("Run", "arithmetic (and HBM bandwidth)", False),
            ("Stream", "user-visible per-step latency", False)]
    fig = go.Figure()
    for i, (verb, resource, memory) in enumerate(jobs):
        y = len(jobs) - i
        fig.add_annotation(x=0.03, y=y, text=f"<b>{verb}</b>", showarrow=False, xanchor="left",
                           font=dict(size=TITLE_SIZE))
        fig.add_annotation(x=0.3, y=y, text=resource, showarrow=False, xanchor="left",
                           font=dict(size=BOARD_PX, color=PALETTE["memory"] if memory else "#222222"))
        if memory:
            fig.add_shape(type="circle", x0=0.27, x1=0.92, y0=y - 0.42, y1=y + 0.42,
                          line=dict(color=PALETTE["memory"], width=4))
    if step >= 1:
        fig.add_shape(type="rect", x0=0.0, x1=0.97, y0=len(jobs) - 0.48, y1=len(jobs) + 0.48,
                      line=dict(color=PALETTE["limit"], width=5))
        fig.add_annotation(x=0.97, y=len(jobs) + 0.5, text="<b>cannot be taken back</b>", showarrow=False,
                           xanchor="right", yanchor="bottom", font=dict(size=BOARD_PX, color=PALETTE["limit"]))
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0.45, len(jobs) + 1.0])
    return _board(fig, "Lecture 2: the machine wants 295, memory permits 29<br>"
                       "An engine's five jobs, and what each contends for", height=PICTURE_HEIGHT + 40,
                  showlegend=False, margin=dict(l=10, r=10, t=80, b=10))


def naive_figure(step: int = 0) -> go.Figure:
    """§10.2's board: one 4,096-token slot with 640 shaded, then the 29 slots stacked in the budget;
    revealed: the GB that hold tokens, the share used, and a 32K slot."""
    r = _numbers()
    naive, budget, slot = r["naive_concurrency"], r["kv_budget_bytes"] / GB, r["naive_slot_bytes"] / GB
    used = r["seq_bytes"] / GB
    rows = ["one slot", f"{naive} slots"] + (["a 32K slot"] if step >= 3 else [])
    fig = go.Figure()
    fig.add_trace(go.Bar(y=["one slot"], x=[640], orientation="h", marker_color=PALETTE["used"],
                         name="holds tokens", hoverinfo="skip", xaxis="x2"))
    fig.add_trace(go.Bar(y=["one slot"], x=[4096 - 640], base=[640], orientation="h", marker_color=PALETTE["waste"],
                         name="reserved, empty", hoverinfo="skip", xaxis="x2"))
    xs = [k * slot for k in range(naive)]
    fig.add_trace(go.Bar(y=[rows[1]] * naive, x=[used] * naive, base=xs, orientation="h", showlegend=False,
                         marker=dict(color=PALETTE["used"], line=dict(width=0)), hoverinfo="skip"))
    fig.add_trace(go.Bar(y=[rows[1]] * naive, x=[slot - used] * naive, base=[x + used for x in xs], orientation="h",
                         showlegend=False, marker=dict(color=PALETTE["waste"], line=dict(color="white", width=1)),
                         hoverinfo="skip"))
    if step >= 3:
        fig.add_trace(go.Bar(y=["a 32K slot"], x=[640], orientation="h", marker_color=PALETTE["used"],
                             showlegend=False, hoverinfo="skip", xaxis="x3"))
        fig.add_trace(go.Bar(y=["a 32K slot"], x=[32_768 - 640], base=[640], orientation="h", showlegend=False,
                             marker_color=PALETTE["waste"], hoverinfo="skip", xaxis="x3"))
    fig.add_shape(type="line", x0=budget, x1=budget, y0=0.5, y1=1.5, line=dict(color=PALETTE["limit"], width=3))
    notes = []
    if step >= 1:
        notes.append(f"{naive * used:.2f} of {budget:.2f} GB hold tokens ({FLAG}: 9.5 of 62.5)")
    if step >= 2:
        notes.append(f"{100 * r['naive_utilization']:.2f}% used ({FLAG}: 15.2%)")
    if step >= 3:
        notes.append(f"32K: {100 * r['slot_32k']:.2f}% of a slot (lecture: 1.9%)")
    if notes:
        _note(fig, 0.0, 1.02, notes[-1], yanchor="bottom", xanchor="left")  # the latest: one line fits 700 px
    title = f"A 4,096-token slot, 640 tokens in it; {naive} slots in the {budget:.2f} GB budget"
    return _board(fig, title, height=PICTURE_HEIGHT + 40 + (40 if step >= 3 else 0), barmode="overlay",
                  xaxis=dict(title="GB (10⁹ B) of the KV budget", range=[0, budget * 1.02]),
                  xaxis2=dict(overlaying="x", side="top", range=[0, 4096 * 1.02], visible=False),
                  xaxis3=dict(overlaying="x", range=[0, 32_768 * 1.02], visible=False),
                  yaxis=dict(autorange="reversed", categoryorder="array", categoryarray=rows),
                  legend=dict(orientation="h", y=-0.3, x=0), margin=dict(l=140, r=20, t=110, b=100))


def _pair_figure(title: str, pairs) -> go.Figure:
    """Before → after pairs drawn as bars, the lecture's printed pair beside the exact one."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(pairs), subplot_titles=[p[0] for p in pairs], horizontal_spacing=0.18)
    for col, (_, unit, exact, printed) in enumerate(pairs, start=1):
        for name, values, colour in (("exact", exact, PALETTE["compute"]), ("lecture", printed, PALETTE["neutral"])):
            fig.add_trace(go.Bar(x=["naive", "paged"], y=list(values), name=name, marker_color=colour,
                                 text=[f"{v:,.2f}{unit}" if unit else f"{v:,}" for v in values],
                                 textposition="outside", showlegend=col == 1, hoverinfo="skip"), row=1, col=col)
        fig.update_yaxes(range=[0, 1.3 * max(*exact, *printed)], visible=False, row=1, col=col)
    return _board(fig, title, barmode="group", legend=dict(orientation="h", y=-0.25, x=0),
                  margin=dict(l=20, r=20, t=110, b=90))


def block_table_figure(step: int = 0) -> go.Figure:
    """§10.3's board from a real allocator: two sequences, one pool (step 1: A grows a block); then the
    two pairs (15.2% → 98.7%, 29 → 199, exact beside printed); then the block-size table."""
    from labsupport.block_allocator import BlockAllocator
    from labsupport.viz import memory as viz_memory

    r = _numbers()
    if step >= 5:
        return block_size_table_figure()
    if step >= 2:
        return _pair_figure("Naive → paged: exact (blue) and the lecture's print (grey)", (
            ("utilization, end of life", "%", (100 * r["naive_utilization"], 100 * r["paged_utilization"]),
             (15.2, 98.7)),
            ("concurrent sequences", "", (r["naive_concurrency"], r["paged_concurrency"]), (29, 199))))
    alloc = BlockAllocator(12, 4)
    alloc.allocate("A", 8)
    alloc.allocate("B", 5)
    highlight = None
    if step >= 1:
        alloc.append_slot("A")
        highlight = ("A", len(alloc.block_tables["A"]) - 1)
    fig = viz_memory.block_table_figure(alloc, ["A", "B"], highlight=highlight,
                                        title="Two sequences' block tables, one physical pool")
    return board_sized(fig.update_layout(height=PICTURE_HEIGHT + 60))


def block_size_table_figure() -> go.Figure:
    """§10.3's block-size table, its last two columns included (table entries at 4K, the kernel's run)."""
    r = _numbers()
    # two-line headings: at 1024 px with the file browser open, one-line ones ran into each other
    head = ("b_blk", "mean<br>tail", f"waste at<br>B = {r['paged_concurrency']}", "table entries<br>at 4K",
            "contiguous<br>run")
    rows = [(f"{row.block_size}", f"{row.mean_tail_tokens:g} tokens", f"{100 * row.waste_fraction_of_budget:.2f}%",
             f"{row.table_entries:,}", f"{row.contiguous_run_tokens} token{'s' if row.contiguous_run_tokens > 1 else ''}")
            for row in r["block_rows"]]
    fig = go.Figure()
    xs = (0.0, 0.12, 0.33, 0.56, 0.8)
    for k, (x, h) in enumerate(zip(xs, head)):
        _note(fig, x, 1.0, f"<b>{h}</b>", xanchor="left", yanchor="top")
        for i, row in enumerate(rows):
            _note(fig, x, 0.7 - 0.19 * i, row[k], xanchor="left", yanchor="top",
                  colour=PALETTE["memory"] if k >= 3 and row[0] == "1" else "#222222")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _board(fig, "Block size: tail waste against the table and the kernel's run (mean tail (b−1)/2)",
                  margin=dict(l=10, r=10, t=90, b=10))


def sharing_figure(step: int = 0) -> go.Figure:
    """§10.4's board from a real allocator: eight branches name one prompt's blocks (refcount 8); step 1:
    branch 1 writes a token (a copy: 7 + 1); step 2: the fan-out's bytes, unshared against shared."""
    from labsupport.block_allocator import BlockAllocator
    from labsupport.viz import sharing as viz_sharing

    r = _numbers()
    if step >= 2:
        kv = r["kv_bytes_per_token"]
        unshared, shared = (t * kv / GB for t in r["fanout"])
        fig = go.Figure()
        for name, values, colour in (("exact", (unshared, shared), PALETTE["compute"]),
                                     ("lecture", (17.9, 3.2), PALETTE["neutral"])):
            fig.add_trace(go.Bar(x=["8 branches, unshared", "shared prompt"], y=list(values), name=name,
                                 marker_color=colour, text=[f"{v:.2f} GB" for v in values], textposition="outside",
                                 hoverinfo="skip"))
        return _board(fig, "KV of 8 completions off a 4,096-token prompt (GB = 10⁹ B)", barmode="group",
                      yaxis=dict(visible=False, range=[0, 27]), legend=dict(orientation="h", y=-0.25, x=0),
                      margin=dict(l=20, r=20, t=70, b=90))
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
    return board_sized(fig.update_layout(height=PICTURE_HEIGHT + 80, margin=dict(t=60, b=50)))


LOOP_VERBS = ("pick the batch", "allocate blocks", "run one pass", "append tokens", "retire the finished",
              "admit arrivals")


def engine_loop_figure(step: int = 0) -> go.Figure:
    """§10.5's board: the loop's six verbs in a cycle and the watermark of free blocks; revealed, the
    derivation: the swap round trip, then the recompute (4,096 MHA tokens)."""
    import math

    r = _numbers()
    if step >= 1:
        fig = go.Figure()
        bars = [("swap out + in, 64 GB/s", 1e3 * r["swap_round_trip_s"], PALETTE["link"])]
        if step >= 2:
            bars.append(("recompute the prefill", 1e3 * r["recompute_s"], PALETTE["recompute"]))
        for name, ms, colour in bars:
            fig.add_trace(go.Bar(y=[name], x=[ms], orientation="h", marker_color=colour, text=[f"{ms:.1f} ms"],
                                 textposition="outside", showlegend=False, hoverinfo="skip"))
        return _board(fig, "A preempted 4,096-token MHA sequence: its stall", xaxis=dict(title="ms", range=[0, 175]),
                      yaxis=dict(categoryorder="array", categoryarray=[b[0] for b in bars][::-1]),
                      margin=dict(l=260, r=30, t=70, b=70))
    fig = go.Figure()
    n = len(LOOP_VERBS)
    pts = [(0.36 + 0.27 * math.sin(2 * math.pi * k / n), 0.5 + 0.36 * math.cos(2 * math.pi * k / n)) for k in range(n)]
    for k, ((x, y), verb) in enumerate(zip(pts, LOOP_VERBS)):
        nx, ny = pts[(k + 1) % n]
        fig.add_annotation(x=nx, y=ny, ax=x, ay=y, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=3, arrowwidth=2, arrowcolor="#BBBBBB", standoff=26, startstandoff=26,
                           text="")
        _note(fig, x, y, f"<b>{verb}</b>", bgcolor="white")
    # the watermark: a column of the card's blocks, the free ones kept above a line admission respects
    fig.add_shape(type="rect", xref="paper", yref="paper", x0=0.68, x1=0.76, y0=0.05, y1=0.95,
                  line=dict(color="#444444"), fillcolor=PALETTE["used"])
    fig.add_shape(type="rect", xref="paper", yref="paper", x0=0.68, x1=0.76, y0=0.8, y1=0.95,
                  line=dict(color="#444444"), fillcolor="white")
    fig.add_shape(type="line", xref="paper", yref="paper", x0=0.65, x1=0.79, y0=0.8, y1=0.8,
                  line=dict(color=PALETTE["memory"], width=4, dash="dash"))
    _note(fig, 0.72, 0.99, "blocks", yanchor="bottom")
    _note(fig, 0.8, 0.8, "watermark", xanchor="left", colour=PALETTE["memory"])
    _note(fig, 0.8, 0.4, f"{r['paged_concurrency']} sequences<br>({FLAG}: 199)", xanchor="left")
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0, 1])
    return _board(fig, "The engine loop, every iteration; a watermark of free blocks", height=PICTURE_HEIGHT + 40,
                  margin=dict(l=10, r=10, t=60, b=10))


def slo_figure(step: int = 0, splits: Sequence[TTFTSplit] = ()) -> go.Figure:
    """§10.6's board: TTFT as three stacked terms (queueing biggest), the three columns; revealed: their
    TPOT and throughput (exact, printed beside), the middle throughput struck, 'goodput 0'."""
    r = _numbers()
    fig = go.Figure()
    terms = (("queueing", "queueing_s", PALETTE["memory"]), ("prefill", "prefill_s", PALETTE["compute"]),
             ("scheduling", "scheduling_s", PALETTE["neutral"]))
    labels = [s.label.replace("your 4,096-token prompt", "a 4K prompt").replace(" chat request", "") for s in splits]
    for name, attr, colour in terms:
        fig.add_trace(go.Bar(y=labels, x=[1e3 * getattr(s, attr) for s in splits], orientation="h", name=name,
                             marker_color=colour, hoverinfo="skip"))
    printed = {r["paged_concurrency"]: ("199", "23.5 ms", "8,470"), r["max_batch_for_slo"]: ("164", "", "")}
    xs = (0.0, 0.34, 0.67)
    for k, (batch, tpot) in enumerate(r["columns"]):
        was = printed.get(batch, ("", "", ""))
        head = f"<b>B = {batch}</b>" + (f'<br><span style="color:#B34700">({FLAG}: {was[0]})</span>' if was[0] else "")
        _note(fig, xs[k], 0.48, head, xanchor="left", yanchor="top")
        if step >= 1:
            _note(fig, xs[k], 0.22, f"TPOT {1e3 * tpot:.2f} ms", xanchor="left", yanchor="top")
            thr = f"{batch / tpot:,.0f} tok/s"
            _note(fig, xs[k], 0.11, thr, xanchor="left", yanchor="top")
            if was[2]:
                _note(fig, xs[k], 0.0, f"({FLAG}: {was[2]})", xanchor="left", yanchor="top", colour="#B34700")
    if step >= 2:
        fig.add_shape(type="line", xref="paper", yref="paper", x0=0.33, x1=0.6, y0=0.062, y1=0.062,
                      line=dict(color=PALETTE["limit"], width=4))
        _note(fig, 0.5, -0.11, "<b>goodput 0</b> at a 20 ms TPOT SLO", colour=PALETTE["limit"], yanchor="top")
    return _board(fig, "TTFT (ms) on a loaded card, 62 chat requests/s; three operating points", barmode="stack",
                  height=PICTURE_HEIGHT + 140,
                  # every bar named: plotly's automatic ticks dropped "median" when the rows were close
                  yaxis=dict(domain=[0.7, 1.0], tickmode="array", tickvals=labels, ticktext=labels),
                  legend=dict(orientation="h", y=1.0, x=0.0, yanchor="bottom"),
                  margin=dict(l=130, r=20, t=110, b=60 + (40 if step >= 2 else 0)))


def map_html(data: dict) -> str:
    """§10.7 for the room: the quantity today's arithmetic leaves, and the date that attacks it."""
    rows = map_rows(data["map"])
    body = "".join(f"<tr><td>{html.escape(r.quantity)}</td><td><b>{html.escape(r.where)}</b></td></tr>" for r in rows)
    return (f'<div class="board-title" style="margin:4px 0">What paging did not fix</div>'
            f'<table class="board-map"><tr><th>the quantity</th><th>where it goes</th></tr>{body}</table>')


PICTURES = (five_jobs_figure, naive_figure, block_table_figure, sharing_figure, engine_loop_figure, slo_figure, None)


def picture(index: int, step: int, data: dict):
    """Segment `index`'s picture with `step` results revealed: a plotly Figure, or HTML (the map)."""
    if not 0 <= index < len(PICTURES):
        raise IndexError(f"segment index must be 0..{len(PICTURES) - 1}, got {index}")
    if index == 5:
        return slo_figure(step, [TTFTSplit(**s) for s in data["ttft_splits"]["62"]])
    if index == 6:
        return map_html(data)
    return PICTURES[index](step)


def swap_recompute_figure(seq_tokens: int = 4096) -> go.Figure:
    """§10.5's derivation for the labs: the swap round trip against the recompute, MHA and GQA-8."""
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


# --- the room's view and the instructor's notes -----------------------------------------------------

def ask_html(seg: Segment) -> str:
    return f'<div class="board-ask"><b>Ask the room:</b> {html.escape(seg.ask)}</div>' if seg.ask else ""


def results_html(seg: Segment, step: int) -> str:
    items = "".join(f"<li>{line}</li>" for line in seg.reveals[:step])
    return f'<div class="board-results"><ol>{items}</ol></div>' if items else ""


def notes_html(seg: Segment) -> str:
    """Everything for the instructor, folded: timing, board directions, the answer, the confusion."""
    plan = f"Minutes {seg.start}–{seg.end} of 75 ({seg.minutes} min)" + (", protected — never cut" if seg.protected
                                                                        else "")
    parts = [plan, f"<b>Board:</b> {html.escape(seg.board)}", f"<b>Answer:</b> {html.escape(seg.answer)}",
             f"<b>Expect confusion:</b> {html.escape(seg.confusion)}",
             f'Lab <a href="{LAB_NAMES[seg.lab]}.ipynb">{seg.lab}</a> has its live panels.' if seg.lab in LAB_NAMES
             else ""]
    return ('<details class="board-notes"><summary>Instructor notes</summary>'
            + "".join(f"<div>{p}</div>" for p in parts if p) + "</details>")


class SegmentView:
    """One segment as one widget: its picture, its question, the results revealed so far, the notes."""

    def __init__(self, index: int, data: dict | None = None):
        import ipywidgets as widgets

        if not 0 <= index < len(_segments()):
            raise IndexError(f"segment index must be 0..{len(_segments()) - 1}, got {index}")
        self.index, self.segment = index, _segments()[index]
        self.data = data if data is not None else load_board_data()
        self.step = 0
        self.picture_box = widgets.VBox()
        self.figure = None
        self.ask = widgets.HTML(ask_html(self.segment))
        self.results = widgets.HTML()
        self.notes = widgets.HTML(notes_html(self.segment))
        self._draw()
        self.widget = widgets.VBox([self.picture_box, self.ask, self.results, self.notes])

    @property
    def steps(self) -> int:
        return len(self.segment.reveals)

    @property
    def pictures(self) -> list:
        return list(self.picture_box.children)

    def picture(self):
        return picture(self.index, self.step, self.data)

    def _draw(self) -> None:
        import ipywidgets as widgets

        from labsupport.viz import fit_width, live_figure

        shown = self.picture()
        if isinstance(shown, str):
            self.picture_box.children = [widgets.HTML(shown)]
        else:  # a new chart for each step: plotly.js cannot patch a chart into another kind (subplots, tables)
            old, self.figure = self.picture_box.children, live_figure(shown)
            self.picture_box.children = [self.figure, fit_width()]
            for w in old:
                w.close()
        self.results.value = results_html(self.segment, self.step)

    def reveal(self, step: int | None = None) -> int:
        """Show the results up to `step` (the next one when None); returns the step now shown."""
        step = self.step + 1 if step is None else step
        step = max(0, min(step, self.steps))
        if step != self.step:
            self.step = step
            self._draw()
        return self.step

    def room_text(self) -> str:
        """What the room sees now, as text (the folded notes excluded)."""
        import re

        shown = self.picture()
        pic = shown if isinstance(shown, str) else json.dumps(shown.to_plotly_json()["layout"], ensure_ascii=False)
        return re.sub(r"<[^>]+>", " ", " ".join((pic, ask_html(self.segment), results_html(self.segment, self.step))))

    def text(self) -> str:
        s = self.segment
        return f"{s.start}–{s.end} min: {s.title}" + (f"\nAsk the room: {s.ask}" if s.ask else "")


def segment_view(index: int, data: dict | None = None) -> SegmentView:
    return SegmentView(index, data)


# --- the deck: one segment at a time, by keyboard or by button --------------------------------------

_KEYS_ESM = """
const FORWARD = ["ArrowRight", "PageDown", " "], BACK = ["ArrowLeft", "PageUp"];
function render({ model, el }) {
  const deck = el.closest(".board-deck") || el;
  deck.setAttribute("data-lm-suppress-shortcuts", "true");  // JupyterLab: keys inside the board are the board's
  el.classList.add("board-nav");
  const make = (text, title, act) => {
    const b = document.createElement("button");
    b.className = "board-button"; b.textContent = text; b.title = title;
    b.addEventListener("click", () => act());
    el.appendChild(b); return b;
  };
  // every press is one message to the kernel, which holds the board's state and answers in order
  const send = action => model.send({ action });
  const back = make("← back", "the previous segment", () => send("previous"));
  const reveal = make("reveal", "the next result (→, Page Down, space; ← takes it back)", () => send("forward"));
  const next = make("next segment →", "the next segment", () => send("next"));
  const where = document.createElement("span");
  where.className = "board-title"; el.appendChild(where);
  const draw = () => {
    const [i, n, k, s] = ["index", "count", "revealed", "steps"].map(x => model.get(x));
    where.textContent = model.get("label");
    back.disabled = i === 0; next.disabled = i === n - 1;
    reveal.disabled = k >= s;
    reveal.textContent = s === 0 ? "nothing to reveal" : k < s ? `reveal ${k + 1} of ${s}` : `all ${s} revealed`;
  };
  model.on("change", draw); draw();
  const onKey = e => {
    if (e.altKey || e.ctrlKey || e.metaKey || !deck.isConnected || !deck.offsetParent) return;
    const t = e.target;
    if (t.closest && t.closest("input, textarea, select, [contenteditable=true], .cm-editor")) return;
    if (!(t === document.body || deck.contains(t))) return;  // Voila's page, or focus in the board
    if (FORWARD.includes(e.key)) send("forward"); else if (BACK.includes(e.key)) send("back"); else return;
    e.preventDefault(); e.stopImmediatePropagation();
  };
  document.addEventListener("keydown", onKey, true);
  return () => { document.removeEventListener("keydown", onKey, true); model.off("change", draw); };
}
export default { render };
"""
_KEYS_CSS = f"""
.board-nav {{ display: flex; flex-wrap: wrap; align-items: center; gap: 10px; margin: 2px 0 6px 0; }}
.board-nav .board-button {{ font-size: {TEXT_CSS}; padding: 4px 14px; border: 2px solid {PALETTE["compute"]};
  border-radius: 6px; background: white; color: #1a1a1a; cursor: pointer; }}
.board-nav .board-button:disabled {{ border-color: #BBBBBB; color: #595959; cursor: default; }}
.board-nav .board-title {{ font-size: {TITLE_CSS}; font-weight: bold; }}
"""
_KEYS_CLASS = None


def _keys_widget(**values):
    global _KEYS_CLASS
    if _KEYS_CLASS is None:
        import anywidget
        import traitlets

        _KEYS_CLASS = type("BoardKeys", (anywidget.AnyWidget,), {
            "__module__": __name__, "_esm": _KEYS_ESM, "_css": _KEYS_CSS,
            "index": traitlets.Int(0).tag(sync=True), "count": traitlets.Int(0).tag(sync=True),
            "revealed": traitlets.Int(0).tag(sync=True), "steps": traitlets.Int(0).tag(sync=True),
            "label": traitlets.Unicode("").tag(sync=True)})
    return _KEYS_CLASS(**values)


def in_voila() -> bool:
    """True in a kernel Voila started (`make present`): it names itself in the kernel's SERVER_SOFTWARE."""
    import os

    return os.environ.get("SERVER_SOFTWARE", "").startswith("voila/")


class Board:
    """The lecture, one segment at a time: → (Page Down, space) reveals the next result, then moves to the next
    segment; ← (Page Up) takes the last result back, then moves to the previous segment."""

    def __init__(self, data: dict | None = None, start: int = 0):
        import ipywidgets as widgets

        from labsupport.viz import a11y

        self.data = data if data is not None else load_board_data()
        self.views: dict[int, SegmentView] = {}
        self.keys = _keys_widget(count=len(_segments()), index=start)
        self.stage = widgets.VBox()
        self.widget = widgets.VBox([widgets.HTML(_BOARD_CSS), self.keys, self.stage, a11y.namer()])
        self.widget.add_class("board-deck")
        self.keys.on_msg(self._on_msg)
        self.show(start)

    @property
    def view(self) -> SegmentView:
        return self.views[self.keys.index]

    def show(self, index: int) -> SegmentView:
        if not 0 <= index < len(_segments()):
            raise IndexError(f"segment index must be 0..{len(_segments()) - 1}, got {index}")
        if index not in self.views:
            self.views[index] = SegmentView(index, self.data)
        view = self.views[index]
        seg = view.segment
        with self.keys.hold_sync():
            self.keys.index, self.keys.steps, self.keys.revealed = index, view.steps, view.step
            self.keys.label = f"{seg.start}–{seg.end} min · {seg.title}"
        self.stage.children = [view.widget]
        return view

    def _on_msg(self, _widget, content, _buffers) -> None:
        action = {"forward": self.forward, "back": self.back, "next": self.next, "previous": self.previous}
        if isinstance(content, dict) and content.get("action") in action:
            action[content["action"]]()

    def reveal(self, step: int) -> None:
        self.keys.revealed = self.view.reveal(step)

    def next(self) -> None:
        if self.keys.index < self.keys.count - 1:
            self.show(self.keys.index + 1)

    def previous(self) -> None:
        if self.keys.index > 0:
            self.show(self.keys.index - 1)

    def forward(self) -> None:
        """What → does: the next result, or the next segment once all are shown."""
        if self.keys.revealed < self.keys.steps:
            self.reveal(self.keys.revealed + 1)
        else:
            self.next()

    def back(self) -> None:
        """What ← does: take the last result back, or go to the previous segment when none is shown."""
        if self.keys.revealed > 0:
            self.reveal(self.keys.revealed - 1)
        else:
            self.previous()

    def text(self) -> str:
        return "Lecture 10, the board: " + " | ".join(f"{s.start}–{s.end} {s.title}" for s in _segments())

    def copies(self) -> list:
        """What stands in for the board in a notebook reopened without a kernel: the first segment."""
        from labsupport.viz import reopen

        view, parts = self.views[0] if 0 in self.views else SegmentView(0, self.data), []
        shown = picture(0, 0, self.data)
        parts.append(reopen.Copy({"text/html": f"<b>{html.escape(view.text().splitlines()[0])}</b>",
                                  "text/plain": view.text().splitlines()[0]}))
        parts.append(reopen.FigureCopy(shown))
        parts.append(reopen.Copy({"text/html": ask_html(view.segment), "text/plain": view.segment.ask}))
        return parts

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle

    def _ipython_display_(self):
        """The live board; in JupyterLab also its static copies (hidden while it is live; shown after a
        reopen). Voila never saves a page, so there it shows the board alone, live from its first paint."""
        from IPython.display import display

        from labsupport.viz import reopen

        if in_voila():
            display(self._repr_mimebundle_(), raw=True)
            return
        parts = self.copies()
        note = reopen.NoteCopy("Below, the board's first segment as last drawn (0–6 min).", following=len(parts))
        reopen.show_live(self._repr_mimebundle_(), note, parts)


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
