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
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go

from labsupport import card, ledger
from labsupport.part_two import LAB_NAMES, MapRow, attention_intensity, map_rows, trace_numbers
from labsupport.slo import TTFTSplit
from labsupport.specs import GB, LECTURE_7B, LECTURE_GPU, KiB
from labsupport.viz import DESIGN_PX, FONT_SIZE, PALETTE, TITLE_SIZE, styled

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
# the lines under it.  Everything addressed to the instructor (the board directions, the answer, the
# confusion to expect, the timing, the printed-versus-exact reconciliations) is never on the projected
# page: it travels in the deck's state to the presenter view (S opens it, as reveal.js's speaker view),
# a second window that follows the deck.  `Board` shows one segment at a time: ← and → (or Page Up /
# Page Down, a presenter's clicker) step through the reveals and the segments.

# Sizes for the back row.  HTML text follows the window's width: 24.2 px at 1024 wide, 32.3 px at 1920.
# Chart text is set in design pixels and scaled with its chart (fit_width): 22 px reads 18.6 px in the
# narrowest output area (592 px, a 0.85 scale) and about 40 px at 1920, at least 3/4 of the text beside it;
# the tables the board draws in HTML (the block sizes, the map) take the same 3/4.
BOARD_PX = 22
TEXT_CSS = "clamp(24px, calc(15px + 0.9vw), 48px)"
TABLE_CSS = "clamp(18px, calc(11.2px + 0.675vw), 36px)"
BUTTON_CSS = "clamp(15px, calc(8px + 0.6vw), 22px)"  # navigation: the instructor's, not the room's
PICTURE_HEIGHT = 420  # design pixels until the page has measured its screen; then the deck fits it (`fit`)
PICTURE_RANGE = (220, 1200)  # a fitted picture stays between these (design pixels)
FLAG = "≠ lecture"  # marks an exact figure that differs from the lecture's print

_BOARD_CSS = f"""<style>
.board-deck, .board-deck .widget-html-content {{ font-size: {TEXT_CSS}; line-height: 1.3; }}
.board-deck .board-ask {{ border-left: 8px solid {PALETTE["compute"]}; padding: 2px 12px; margin: 2px 0; }}
.board-deck .board-results ol {{ margin: 2px 0; padding-left: 1.5em; }}
.board-deck .board-results li {{ margin: 0; }}
.board-deck .board-flag {{ color: #B34700; font-weight: bold; }}
.board-deck .board-table, .board-deck .board-table td, .board-deck .board-table th {{ font-size: {TABLE_CSS};
    border-collapse: collapse; padding: 2px 10px; text-align: left; vertical-align: top; }}
.board-deck .board-table th {{ border-bottom: 2px solid #444; }}
.board-deck .board-caption {{ font-weight: bold; margin: 2px 0 6px 0; }}
.board-deck .board-whatif {{ display: flex; flex-wrap: wrap; align-items: center; gap: 4px 16px; }}
.board-deck .board-whatif .widget-label, .board-deck .board-whatif .widget-readout {{ font-size: {TEXT_CSS};
    line-height: 1.3; height: auto; overflow: visible; }}
.board-deck .board-whatif .widget-hslider {{ width: auto; height: auto; }}
.board-deck .board-whatif .slider-container {{ flex: 0 0 clamp(150px, 15vw, 400px); }}
.board-deck .board-whatif .widget-readout {{ min-width: 5em; }}
.board-deck .js-plotly-plot .modebar-container {{ display: none; }}
</style>"""


@dataclass(frozen=True)
class Segment:
    """One row of the timing plan: what the room sees, and the instructor's notes (the presenter view's)."""

    start: int
    end: int
    title: str
    board: str  # the instructor's board directions (notes)
    ask: str  # the question for the room ("" where the lecture asks none)
    answer: str  # notes
    confusion: str  # notes: the confusion the lecture's notes tell the instructor to expect ("" where none)
    reveals: tuple[str, ...] = ()  # the results, in the order the notes give them, one per press
    protected: bool = False
    lab: str = ""
    timing: str = ""  # notes: what to cut when running long, what is reading-only
    whatif: str = ""  # the live "what if" the room may ask once every result is shown ("" where none)

    @property
    def minutes(self) -> int:
        return self.end - self.start


def _flag(exact: str, printed: str) -> str:
    return f'{exact} <span class="board-flag">({FLAG}: {printed})</span>'


@functools.cache
def _numbers() -> dict:
    """The lecture's workload on the course card, from the ledger's closed forms (the board imports no staff command)."""
    c = card.card()
    m, g = c.model, c.gpu
    kv, budget = ledger.kv_bytes_per_token(m), ledger.kv_budget_bytes(m, g)
    prompt, output, s_max, block, tpot_slo_s = 512, 128, 4096, 16, 0.020  # §10.2's chat workload, §10.6's SLO
    seq = prompt + output
    naive_b, paged_b = ledger.naive_concurrency(budget, s_max, kv), ledger.paged_concurrency(budget, seq, block, kv)
    tpot = ledger.tpot_s(m, paged_b, seq, g.hbm_bandwidth)
    r = {"kv_bytes_per_token": kv, "kv_budget_bytes": budget, "seq_tokens": seq, "seq_bytes": seq * kv,
         "s_max": s_max, "tpot_slo_s": tpot_slo_s, "naive_concurrency": naive_b, "paged_concurrency": paged_b,
         "concurrency_gain": paged_b / naive_b if naive_b else math.inf,
         "naive_utilization": ledger.naive_utilization(budget, s_max, seq, kv),
         "naive_utilization_time_avg": ledger.naive_utilization_time_avg(budget, s_max, prompt, output, kv),
         "paged_utilization": ledger.paged_utilization(budget, seq, block, kv),
         "paged_utilization_time_avg": ledger.paged_utilization_time_avg(budget, prompt, output, block, kv),
         "swap_round_trip_s": ledger.swap_round_trip_s(s_max * kv, g.link_bandwidth),
         "recompute_flops": ledger.prefill_flops(m, s_max), "recompute_s": ledger.recompute_s(m, s_max, g.peak_flops),
         "tpot_s": tpot, "throughput_tok_s": ledger.throughput_tok_s(paged_b, tpot),
         "max_batch_for_slo": ledger.max_batch_for_tpot(m, seq, tpot_slo_s, g.hbm_bandwidth),
         "ridge_batch": ledger.ridge_batch(m, g)}
    r["util_32k"] = ledger.naive_utilization(budget, 32_768, r["seq_tokens"], kv)
    r["slot_32k"] = ledger.slot_occupancy(32_768, r["seq_tokens"])
    r["slots_32k"] = ledger.naive_concurrency(budget, 32_768, kv)
    r["fanout"] = ledger.fanout_tokens(8, 4096, 256)
    r["columns"] = operating_points(r["tpot_slo_s"], r)
    r["block_rows"] = ledger.block_size_table((1, 16, 64, 256), r["paged_concurrency"], budget, kv)
    return r


def operating_points(tpot_slo_s: float, r: dict | None = None) -> list[tuple[str, int, float]]:
    """§10.6's three columns: (name, B, TPOT in s) for the naive batch, the paged memory ceiling and the
    largest batch whose TPOT meets `tpot_slo_s`, all from the ledger on the course card's model and GPU."""
    r = r or _numbers()
    model, seq, bw = card.model(), r["seq_tokens"], card.gpu().hbm_bandwidth
    batches = (("naive", r["naive_concurrency"]), ("memory ceiling", r["paged_concurrency"]),
               ("SLO bound", ledger.max_batch_for_tpot(model, seq, tpot_slo_s, bw)))
    return [(name, b, ledger.tpot_s(model, b, seq, bw)) for name, b in batches]


@functools.cache
def _segments() -> tuple[Segment, ...]:
    """The timing plan, with every number on the board computed by the ledger (printed figure beside).

    Made on first use, not on import: the ledger command's whole-scenario answers are staff-only (not in the
    student release, masked while grading), and lab 08 imports this module for its map of Part II."""
    r = _numbers()
    kv, budget, seq_bytes = r["kv_bytes_per_token"], r["kv_budget_bytes"], r["seq_bytes"]
    util_32k, slot_32k = r["util_32k"], r["slot_32k"]
    # §10.3's 1.3%: the lecture's b/2 tail in each of its 199 sequences, on the lecture's card (it explains its 98.7%)
    lecture_kv, lecture_budget = LECTURE_7B.kv_bytes_per_token, ledger.kv_budget_bytes(LECTURE_7B, LECTURE_GPU)
    tail_gb = 199 * (16 / 2) * lecture_kv / GB
    unshared, shared = r["fanout"]
    naive, paged, slo = r["naive_concurrency"], r["paged_concurrency"], r["max_batch_for_slo"]
    used_gb = naive * seq_bytes / GB
    return (
        Segment(0, 6, f"Part II opens: {naive} against {r['ridge_batch']:.0f} (§10.1)",
                f"Re-board Lecture 2's collision ({r['ridge_batch']:.0f} against {naive}), then the "
                "five jobs of an engine, each with the resource it contends for. Circle memory twice. Do not start the "
                "paper yet.",
                "Which of the five can the engine get wrong in a way it cannot recover from?",
                "Admit — the promise has already been made. (This lands §10.5 forty minutes early.)",
                "Students expect a serving system to be a scheduling problem. Say: \"It is a memory-management "
                "problem wearing a scheduler's clothes.\"",
                reveals=("<b>Admit:</b> a promise of KV space for a length nobody knows; it cannot be taken back.",),
                lab="01"),
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
                reveals=(f"{naive} × {r['seq_tokens']} tokens × {kv // KiB} KiB = "
                         + _flag(f"<b>{used_gb:.2f} of {budget / GB:.2f} GB</b>", "9.5 of 62.5"),
                         "Used at the end of each life: "
                         + _flag(f"<b>{100 * r['naive_utilization']:.2f}%</b>", "15.2%"),
                         f"S_max = 32K: a slot holds <b>{100 * slot_32k:.2f}%</b>; {r['slots_32k']} slots fit, "
                         f"{100 * util_32k:.2f}% of the budget"),
                whatif="S_max",
                protected=True, lab="02"),
        Segment(16, 36, "PagedAttention (§10.3, the paper)",
                "Two sequences, logical blocks left, one shared physical pool right, arrows crossing. Grow A by one "
                "token: a new block, one table entry. Then 15.2% → 98.7%: the lecture's 98.7% is 100% minus its "
                f"internal fragmentation, a mean 8-token tail × 199 sequences × {lecture_kv // KiB} KiB = "
                f"{tail_gb:.2f} GB, {100 * tail_gb * GB / lecture_budget:.1f}% of the budget (exact for 640-token sequences: "
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
                reveals=("A grows: <b>one new block, one table entry</b>; nothing moves.",
                         "Utilization: " + _flag(f"<b>{100 * r['naive_utilization']:.2f}% → "
                                                 f"{100 * r['paged_utilization']:.2f}%</b>", "15.2% → 98.7%"),
                         "Concurrency: " + _flag(f"<b>{naive} → {paged}</b>", "29 → 199"),
                         "The kernel must <b>gather</b> K and V: the cost moved into it.",
                         "Block size trades tail waste against the table and the kernel's run."),
                protected=True, lab="03"),
        Segment(36, 46, "Sharing (§10.4)",
                "One prompt's blocks, eight branch arrows, refcount 8. One branch writes a token: new block, refcount "
                f"7 + 1. Then 17.9 GB against 3.2 GB (exact {unshared * kv / GB:.2f} GB against {shared * kv / GB:.2f} GB): "
                f"{unshared / shared:.2f}×.",
                "Does anything in this mechanism know the branches came from the same request?",
                "No. Let the silence do the work, then name Nov 9: two users' identical system prompts share blocks "
                "just as soundly.",
                "Beam search gets treated as the motivating case. It is the historical one; the live one is agent "
                "fan-out and shared system prompts.",
                reveals=("Branch 1 writes a token into the shared block: <b>a copy, refcount 7 + 1</b>.",
                         _flag(f"<b>{unshared * kv / GB:.2f} GB against {shared * kv / GB:.2f} GB</b>",
                               "17.9 against 3.2") + f": <b>{unshared / shared:.2f}×</b> less KV",
                         "<b>No.</b> Identical tokens share blocks; nothing names the request (Nov 9)."),
                lab="05"),
        Segment(46, 58, "The engine loop (§10.5)",
                f"The loop as six verbs in a cycle; the watermark; then derive {1e3 * r['swap_round_trip_s']:.0f} ms "
                f"against {1e3 * r['recompute_s']:.0f} ms live — do not show the result first. The ask's full card "
                f"is the lecture's 199 sequences (exact {paged}).",
                "The engine admitted a full card and every sequence keeps generating. What breaks? — Which of your "
                "three moves is cheapest for the user?",
                "Blocks run out. Refusing new arrivals: nobody resident is hurt — that is why watermarks exist.",
                "Preemption is assumed to lose the sequence's progress. It loses its cache, never its tokens.",
                reveals=(f"Swap out and back: 2 × {4096 * kv / GB:.3f} GB ÷ {card.gpu().link_bandwidth / GB:.0f} "
                         f"GB/s = <b>{1e3 * r['swap_round_trip_s']:.1f} ms</b>",
                         f"Recompute: {r['recompute_flops'] / 1e12:.1f} TFLOP ÷ (50% × "
                         f"{card.gpu().peak_flops / 1e12:.0f} TFLOP/s) = <b>{1e3 * r['recompute_s']:.1f} ms</b>",
                         "A full card that keeps generating <b>runs out of blocks</b>.",
                         "Cheapest for the user: <b>refuse new arrivals</b> (the watermark)."),
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
                reveals=(f"B = {paged}: " + _flag(f"<b>{1e3 * r['tpot_s']:.2f} ms, "
                                                   f"{r['throughput_tok_s']:,.0f} tok/s</b>", "23.5, 8,470"),
                         f"At a {1e3 * r['tpot_slo_s']:g} ms SLO B = {paged} misses: "
                         f"<s>{r['throughput_tok_s']:,.0f} tok/s</s>, <b>goodput 0</b>",
                         f"Ask for the SLO first: at {1e3 * r['tpot_slo_s']:g} ms, deploy <b>B = {slo}</b>"),
                whatif="TPOT SLO",
                lab="07"),
        Segment(68, 75, "The map of Part II (§10.7)",
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
                "",
                reveals=("The allocator was the easy 7×: "
                         + _flag(f"<b>{naive} → {paged}, {r['concurrency_gain']:.2f}×</b>", "29 → 199, 6.9×"),),
                lab="08", timing="Reading-only, not scheduled: §10.7's table in full. If running long, compress "
                "§10.6 to the TTFT decomposition; never cut §10.2 or §10.3."),
    )


def __getattr__(name: str):
    if name == "SEGMENTS":
        return _segments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    derivation: the swap round trip, then the recompute (4,096 MHA tokens)."""
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
        return _board(fig, "A preempted 4,096-token MHA sequence: its stall", height,
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
    fig = make_subplots(rows=1, cols=2, column_widths=[0.38, 0.62], horizontal_spacing=0.06, subplot_titles=(
        f"TTFT, a 4K prompt: {1e3 * total:,.0f} ms", "three batches: TPOT"))
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


def map_html(data: dict) -> str:
    """§10.7 for the room: the quantity today's arithmetic leaves, and the date that attacks it."""
    rows = map_rows(data["map"])
    body = "".join(f"<tr><td>{html.escape(r.quantity)}</td><td><b>{html.escape(r.where)}</b></td></tr>" for r in rows)
    return ('<div class="board-caption">What paging did not fix</div>'
            f'<table class="board-table"><tr><th>the quantity</th><th>where it goes</th></tr>{body}</table>')


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
    """§10.5's derivation for the labs: the swap round trip against the recompute, MHA and GQA-8."""
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
    """Everything for the instructor, for the presenter view: timing, board directions, the answer, the
    confusion the lecture says to expect (only where it names one), what to cut."""
    plan = f"Minutes {seg.start}–{seg.end} of 75 ({seg.minutes} min)" + (", protected — never cut" if seg.protected
                                                                        else "")
    parts = [plan, f"<b>Board:</b> {html.escape(seg.board)}", f"<b>Answer:</b> {html.escape(seg.answer)}",
             f"<b>Expect confusion:</b> {html.escape(seg.confusion)}" if seg.confusion else "",
             f"<b>Timing:</b> {html.escape(seg.timing)}" if seg.timing else "",
             f"Lab {seg.lab} ({LAB_NAMES[seg.lab]}) has its live panels." if seg.lab in LAB_NAMES else ""]
    return '<div class="board-notes">' + "".join(f"<p>{p}</p>" for p in parts if p) + "</div>"


def whatif_readout(index: int, value) -> str:
    """The line under a what-if slider: what the ledger says at the slider's value."""
    r = _numbers()
    kv, budget, seq = r["kv_bytes_per_token"], r["kv_budget_bytes"], r["seq_tokens"]
    if index == 1:
        n = ledger.naive_concurrency(budget, value, kv)
        return (f"<b>{n}</b> fit, a slot <b>{100 * ledger.slot_occupancy(value, seq):.2f}%</b> used, "
                f"the budget <b>{100 * ledger.naive_utilization(budget, value, seq, kv):.2f}%</b>")
    _, b, tpot = operating_points(value, r)[2]
    ceiling = operating_points(value, r)[1]
    meets = "meets it" if ceiling[2] <= value else "goodput 0"
    return (f"deploy <b>B = {b}</b>, {ledger.throughput_tok_s(b, tpot):,.0f} tok/s; "
            f"B = {ceiling[1]}: {meets}")


# what each what-if slider offers: S_max from the lecture's 4K to Exercise 1's 128K, the SLO around its 20 ms
WHATIF = {1: ("S_max", [(f"{2**k:,}", 2**k) for k in range(12, 18)], 32_768),
          5: ("TPOT SLO", [(f"{ms} ms", ms / 1e3) for ms in range(10, 31)], None)}


class SegmentView:
    """One segment as one widget: its picture, its question, the results revealed so far, and once every
    result is shown, the segment's what-if slider (if it has one).  The notes are not in it (presenter view)."""

    def __init__(self, index: int, data: dict | None = None, height: int = PICTURE_HEIGHT):
        import ipywidgets as widgets

        if not 0 <= index < len(_segments()):
            raise IndexError(f"segment index must be 0..{len(_segments()) - 1}, got {index}")
        self.index, self.segment = index, _segments()[index]
        self.data = data if data is not None else load_board_data()
        self.step, self.height, self.whatif = 0, height, None
        self.picture_box = widgets.VBox()
        self.picture_box.add_class("board-picture")
        self.figure = None
        self.ask = widgets.HTML(ask_html(self.segment))
        self.results = widgets.HTML()
        self.results.add_class("board-results-box")
        self.whatif_box = widgets.HBox()
        self.whatif_box.add_class("board-whatif")
        self.slider = self.readout = None
        self._draw()
        self.widget = widgets.VBox([self.picture_box, self.ask, self.results, self.whatif_box])

    @property
    def steps(self) -> int:
        return len(self.segment.reveals)

    @property
    def pictures(self) -> list:
        return list(self.picture_box.children)

    def picture(self):
        return picture(self.index, self.step, self.data, self.height, self.whatif)

    def _draw(self) -> None:
        import ipywidgets as widgets

        from labsupport.viz import fit_width, live_figure

        shown = self.picture()
        old = self.picture_box.children
        if isinstance(shown, str):
            self.figure = None
            self.picture_box.children = [widgets.HTML(shown)]
        else:  # a new chart for each step: plotly.js cannot patch a chart into another kind (subplots, tables)
            self.figure = live_figure(shown)
            self.figure._config = {**self.figure._config, "displayModeBar": False}  # no toolbar over the room
            self.picture_box.children = [self.figure, fit_width()]
        for w in old:
            w.close()
        self.results.value = results_html(self.segment, self.step)
        self._show_whatif()

    def _show_whatif(self) -> None:
        """The slider, only once every result is shown: before, it would answer the question for the room."""
        import ipywidgets as widgets

        if self.index not in WHATIF or self.step < self.steps:
            self.whatif_box.children, self.whatif = [], None
            return
        if self.slider is None:
            name, options, value = WHATIF[self.index]
            value = value or _numbers()["tpot_slo_s"]
            self.slider = widgets.SelectionSlider(options=options, value=value, description=f"What if {name}:",
                                                  continuous_update=False, style={"description_width": "initial"},
                                                  layout=widgets.Layout(width="auto"))
            self.readout = widgets.HTML(whatif_readout(self.index, value))
            self.slider.observe(self._on_whatif, names="value")
        self.whatif_box.children = [self.slider, self.readout]

    def _on_whatif(self, change) -> None:
        self.whatif = change["new"]
        self.readout.value = whatif_readout(self.index, self.whatif)
        self._draw()

    def reveal(self, step: int | None = None) -> int:
        """Show the results up to `step` (the next one when None); returns the step now shown."""
        step = self.step + 1 if step is None else step
        step = max(0, min(step, self.steps))
        if step != self.step:
            self.step = step
            self._draw()
        return self.step

    def fit(self, height: float) -> None:
        """Take the height the page measured for the picture (design pixels), kept in PICTURE_RANGE."""
        height = int(max(PICTURE_RANGE[0], min(PICTURE_RANGE[1], height)))
        if abs(height - self.height) < 4:
            return
        self.height = height
        if self.figure is not None:  # a new chart: a height patched into a drawn one left plotly at 700 px wide
            self._draw()

    def room_text(self) -> str:
        """What the room sees now, as text."""
        import re

        shown = self.picture()
        pic = shown if isinstance(shown, str) else json.dumps(shown.to_plotly_json()["layout"], ensure_ascii=False)
        pic += " " + json.dumps([t.get("text") for t in shown.to_plotly_json()["data"]], ensure_ascii=False) \
            if not isinstance(shown, str) else ""
        whatif = whatif_readout(self.index, self.slider.value) if self.whatif_box.children else ""
        return re.sub(r"<[^>]+>", " ", " ".join((pic, ask_html(self.segment), results_html(self.segment, self.step),
                                                 whatif)))

    def text(self) -> str:
        s = self.segment
        return f"{s.start}–{s.end} min: {s.title}" + (f"\nAsk the room: {s.ask}" if s.ask else "")


def segment_view(index: int, data: dict | None = None) -> SegmentView:
    return SegmentView(index, data)


# --- the deck: one segment at a time, by keyboard or by button; the presenter view ---------------------
#
# The deck's state lives in the kernel; the page holds one small widget (`BoardKeys`) that sends every
# press to it and draws the buttons.  Two more jobs sit in that widget because they need the page:
# * fitting the picture: like reveal.js's r-stretch, the chart takes the height the screen has left
#   under the deck's other parts (measured whenever they change size), sent to the kernel as design
#   pixels, which sets the chart's height;
# * the presenter view: S opens a second window (reveal.js's speaker view) that the same widget writes
#   into: the notes, the next segment's question and a clock.  It follows the deck because it is drawn
#   from the same model; its own keys drive the deck too.  The notes never enter the projected page.
_KEYS_ESM = """
const FORWARD = ["ArrowRight", "PageDown", " "], BACK = ["ArrowLeft", "PageUp"];
const SPARE = 12;  // px kept free under the last line
const [NARROWEST, WIDEST] = %s;  // fit_width's design widths
const PRESENTER = `<style>
 body { font: 20px/1.4 Inter, 'Helvetica Neue', Arial, sans-serif; margin: 16px 24px; color: #1a1a1a; }
 header { display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; border-bottom: 2px solid #888; }
 #clock { font-size: 32px; font-weight: bold; } #elapsed { font-size: 32px; color: #0072B2; font-weight: bold; }
 #where { font-size: 24px; font-weight: bold; } #step { color: #444; }
 h2 { font-size: 18px; text-transform: uppercase; color: #555; margin: 14px 0 4px 0; }
 #next { border-left: 6px solid #0072B2; padding-left: 10px; } .board-notes p { margin: 4px 0; }
</style>
<header><span id="clock"></span><span id="elapsed" title="since the presenter view opened"></span>
<span id="where"></span><span id="step"></span></header>
<h2>Notes</h2><div id="notes"></div><h2>Next</h2><div id="next"></div>`;
function render({ model, el }) {
  // the deck around this widget: looked up when needed, as `el` is put on the page after render returns
  const deckOf = () => {
    const deck = el.closest(".board-deck");
    if (deck) deck.setAttribute("data-lm-suppress-shortcuts", "true");  // JupyterLab: the board's keys are its own
    return deck || el;
  };
  el.setAttribute("data-lm-suppress-shortcuts", "true");
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

  let presenter = null, opened = 0, ticking = 0;
  const pad = n => String(n).padStart(2, "0");
  // The window's document is (re)written whenever it lacks the view: Chromium may replace the first
  // about:blank document of a new window after window.open returns, taking what was written with it.
  const ensure = () => {
    const d = presenter.document;
    if (d.getElementById("clock")) return d;
    d.title = "Presenter view: " + document.title;
    d.body.innerHTML = PRESENTER;
    d.addEventListener("keydown", onKey, true);  // the presenter's clicker drives the deck
    return d;
  };
  const tick = () => {
    if (!presenter || presenter.closed) { clearInterval(ticking); presenter = null; return; }
    const fresh = !presenter.document.getElementById("clock"), d = ensure();
    if (fresh) fillPresenter();
    const s = Math.floor((Date.now() - opened) / 1000);
    d.getElementById("clock").textContent = new Date().toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    d.getElementById("elapsed").textContent = `${pad(Math.floor(s / 60))}:${pad(s %% 60)}`;
  };
  const fillPresenter = () => {
    if (!presenter || presenter.closed) return;
    const d = ensure(), [k, s] = [model.get("revealed"), model.get("steps")];
    d.getElementById("where").textContent = model.get("label");
    d.getElementById("step").textContent = s ? `${k} of ${s} revealed` : "nothing to reveal";
    d.getElementById("notes").innerHTML = model.get("notes");
    d.getElementById("next").innerHTML = model.get("next_up");
  };
  const onKey = e => {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    if (FORWARD.includes(e.key)) send("forward"); else if (BACK.includes(e.key)) send("back");
    else if (e.key === "s" || e.key === "S") openPresenter(); else return;
    e.preventDefault(); e.stopImmediatePropagation();
  };
  const openPresenter = () => {
    presenter = window.open("", "labsupport-board-presenter", "popup,width=1000,height=760");
    if (!presenter) return;
    opened = Date.now();
    clearInterval(ticking); ticking = setInterval(tick, 500);
    fillPresenter(); tick();
  };

  let sent = 0, frame = 0;
  const fit = () => {
    frame = 0;
    const deck = deckOf();
    const chart = deck.querySelector(".board-picture .js-plotly-plot");
    if (!chart || !chart.offsetHeight || !deck.offsetParent) { deck.dataset.fitted = "1"; return; }
    const scroller = deck.closest(".jp-WindowedPanel-outer");
    const box = scroller ? scroller.getBoundingClientRect() : { top: 0, bottom: window.innerHeight };
    const screen = Math.min(box.bottom, window.innerHeight) - Math.max(box.top, 0);
    // In a notebook the board is scrolled to the top of the window (INSTRUCTORS.md); on a page of its own
    // (Voila) what stands above it (the heading) stays on the first screen.
    const offset = scroller ? 0 : deck.getBoundingClientRect().top + window.scrollY;
    const above = offset < 0.25 * screen ? offset : 0;
    // the scale fit_width gives the chart, from the width of its box (not read off the chart: a chart
    // just drawn is not scaled yet, and a height measured then would be sent, drawn, and sent again)
    const width = chart.parentElement.getBoundingClientRect().width;
    const scale = width < NARROWEST ? width / NARROWEST : width > WIDEST ? width / WIDEST : 1;
    const rest = deck.getBoundingClientRect().height - chart.parentElement.getBoundingClientRect().height;
    const drawn = chart.offsetHeight * scale;  // the picture's height once fit_width has scaled it
    const design = Math.round((screen - above - rest - SPARE) / scale);
    const off = Math.abs(design - chart.offsetHeight) > 6 || Math.abs(chart.getBoundingClientRect().height - drawn) > 2;
    deck.dataset.fitted = off && design !== sent ? "0" : "1";
    if (off && design !== sent) { sent = design; model.send({ action: "fit", height: design }); }
  };
  const later = () => { if (!frame) frame = requestAnimationFrame(fit); };
  const observer = new ResizeObserver(later);
  let watched = null;  // the deck, once the widget is on the page
  const watch = () => { const d = deckOf(); if (d !== el && d !== watched) { watched = d; observer.observe(d); } };
  window.addEventListener("resize", later);
  document.addEventListener("plotlywidget-after-render", later);

  const draw = () => {
    const [i, n, k, s] = ["index", "count", "revealed", "steps"].map(x => model.get(x));
    where.textContent = model.get("label");
    back.disabled = i === 0; next.disabled = i === n - 1;
    reveal.disabled = k >= s;
    reveal.textContent = s === 0 ? "nothing to reveal" : k < s ? `reveal ${k + 1} of ${s}` : `all ${s} revealed`;
    fillPresenter(); watch(); later();
  };
  model.on("change", draw); draw();
  requestAnimationFrame(watch);
  const onPageKey = e => {
    const deck = deckOf();
    if (!deck.isConnected || !deck.offsetParent) return;
    const t = e.target;
    if (t.closest && t.closest("input, textarea, select, [contenteditable=true], .cm-editor")) return;
    if (!(t === document.body || deck.contains(t))) return;  // Voila's page, or focus in the board
    onKey(e);
  };
  document.addEventListener("keydown", onPageKey, true);
  return () => {
    document.removeEventListener("keydown", onPageKey, true); model.off("change", draw);
    observer.disconnect(); window.removeEventListener("resize", later);
    document.removeEventListener("plotlywidget-after-render", later); clearInterval(ticking);
  };
}
export default { render };
""" % list(DESIGN_PX)
_KEYS_CSS = f"""
.board-nav {{ display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; margin: 0 0 4px 0; }}
.board-nav .board-button {{ font-size: {BUTTON_CSS}; padding: 2px 10px; border: 2px solid {PALETTE["compute"]};
  border-radius: 6px; background: white; color: #1a1a1a; cursor: pointer; }}
.board-nav .board-button:disabled {{ border-color: #BBBBBB; color: #595959; cursor: default; }}
.board-nav .board-title {{ font-size: {TEXT_CSS}; font-weight: bold; }}
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
            "label": traitlets.Unicode("").tag(sync=True),
            # the presenter view's: never drawn on the projected page
            "notes": traitlets.Unicode("").tag(sync=True), "next_up": traitlets.Unicode("").tag(sync=True)})
    return _KEYS_CLASS(**values)


def next_up_html(index: int) -> str:
    """The presenter view's "next": the following segment's title and question."""
    segs = _segments()
    if index + 1 >= len(segs):
        return "The end of the lecture."
    s = segs[index + 1]
    return (f"<b>{s.start}–{s.end} min · {html.escape(s.title)}</b>"
            + (f"<br>Ask the room: {html.escape(s.ask)}" if s.ask else ""))


def in_voila() -> bool:
    """True in a kernel Voila started (`make present`): it names itself in the kernel's SERVER_SOFTWARE."""
    import os

    return os.environ.get("SERVER_SOFTWARE", "").startswith("voila/")


class Board:
    """The lecture, one segment at a time: → (Page Down, space) reveals the next result, then moves to the next
    segment; ← (Page Up) takes the last result back, then moves to the previous segment; S opens the
    presenter view."""

    def __init__(self, data: dict | None = None, start: int = 0):
        import ipywidgets as widgets

        from labsupport.viz import a11y

        self.data = data if data is not None else load_board_data()
        self.views: dict[int, SegmentView] = {}
        self.height = PICTURE_HEIGHT  # the last fitted height: a segment shown next starts from it
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
            self.views[index] = SegmentView(index, self.data, self.height)
        view = self.views[index]
        seg = view.segment
        with self.keys.hold_sync():
            self.keys.index, self.keys.steps, self.keys.revealed = index, view.steps, view.step
            self.keys.label = f"{seg.start}–{seg.end} min · {seg.title}"
            self.keys.notes, self.keys.next_up = notes_html(seg), next_up_html(index)
        self.stage.children = [view.widget]
        return view

    def _on_msg(self, _widget, content, _buffers) -> None:
        action = {"forward": self.forward, "back": self.back, "next": self.next, "previous": self.previous}
        if not isinstance(content, dict):
            return
        if content.get("action") in action:
            action[content["action"]]()
        elif content.get("action") == "fit" and isinstance(content.get("height"), int | float):
            self.fit(content["height"])

    def fit(self, height: float) -> None:
        self.view.fit(height)
        self.height = self.view.height

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
