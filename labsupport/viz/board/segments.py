"""What each segment of Lecture 10's 75-minute timing plan says and reveals (lab 99, §10.1–§10.7).

`SEGMENTS` follows the lecture's timing plan (0–6, 6–16, 16–36, 36–46, 46–58, 58–68, 68–75): for each, the
question the room is asked, the results each "reveal" adds in the order the lecture's notes give them,
and the instructor's notes (board directions, answer, the confusion to expect, timing).  Every number is
the course card's, from the ledger's closed forms (`_numbers`; §10.6's three columns are
`operating_points`), the lecture's print beside it where they differ, flagged (`FLAG`).  The board
imports no staff command: the ledger command's whole-scenario answers are staff-only.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from labsupport import card, ledger
from labsupport.costmodel import CostModel, StepTime
from labsupport.measure.part_two import attention_intensity
from labsupport.slo import largest_batch_meeting
from labsupport.specs import GB, LECTURE_7B, LECTURE_GPU, KiB

FLAG = "≠ lecture"  # marks an exact figure that differs from the lecture's print


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
    # §10.6's TPOT is the ledger's: the step's bytes over the bandwidth.  The engine's clock (the roofline) takes the
    # larger of that and the step's FLOPs at 50% of peak; where the FLOPs are larger the notes say so
    r["ceiling_step"], r["slo_step"] = _roofline_step(paged_b, seq), _roofline_step(r["max_batch_for_slo"], seq)
    r["roofline_slo_batch"] = largest_batch_meeting(lambda _m, _g, b, s: _roofline_step(b, s).total_s, m, g, seq,
                                                    tpot_slo_s)  # the largest B whose roofline step meets the SLO
    return r


def _roofline_step(batch: int, seq_tokens: int) -> StepTime:
    """One decode step of `batch` sequences of `seq_tokens` tokens on the engine's clock (the course card's
    CostModel): its memory term (weights and KV over the bandwidth, the ledger's TPOT), its compute term (2 N +
    4 L H d S FLOPs a sequence at 50% of peak) and their roofline max, `total_s`."""
    return CostModel(card.model(), card.gpu()).step(decode_seqs=batch, decode_context_tokens=batch * seq_tokens)


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
    student release, masked while grading), and lab 08 imports the package for its map of Part II."""
    r = _numbers()
    kv, budget, seq_bytes = r["kv_bytes_per_token"], r["kv_budget_bytes"], r["seq_bytes"]
    util_32k, slot_32k = r["util_32k"], r["slot_32k"]
    # §10.3's 1.3%: the lecture's b/2 tail in each of its 199 sequences, on the lecture's card (it explains its 98.7%)
    lecture_kv, lecture_budget = LECTURE_7B.kv_bytes_per_token, ledger.kv_budget_bytes(LECTURE_7B, LECTURE_GPU)
    tail_gb = 199 * (16 / 2) * lecture_kv / GB
    unshared, shared = r["fanout"]
    naive, paged, slo = r["naive_concurrency"], r["paged_concurrency"], r["max_batch_for_slo"]
    used_gb = naive * seq_bytes / GB
    slot_gb = r["s_max"] * kv / GB  # one 4,096-token slot: what a realloc copies
    ceiling_step, slo_step = r["ceiling_step"], r["slo_step"]
    slo_ms, ridge = 1e3 * r["tpot_slo_s"], r["ridge_batch"]
    at_25 = operating_points(0.025, r)[2][1]  # the SLO-bound batch at the lecture's 25 ms
    if r["tpot_s"] <= 0.025:
        answer_25 = f"At 25 ms the memory-ceiling column (B = {paged}) wins."
    else:  # the ceiling's step is longer than 25 ms on this card
        answer_25 = (f"At 25 ms the SLO-limited column still wins (B = {at_25}): the memory ceiling (B = {paged}) "
                     f"needs {1e3 * r['tpot_s']:.2f} ms.")
    # §10.6's TPOT is the ledger's memory term; where a step's FLOPs take longer, the step is compute-bound and the
    # notes (and the room's lines) say the figures are the memory term, with the roofline's beside them
    roofline_note = "" if slo_step.compute_s <= slo_step.memory_s else (
        " Every TPOT here is the ledger's memory term (the step's bytes over the bandwidth). On this card the step "
        f"is compute-bound: at B = {slo} its FLOPs take {1e3 * slo_step.compute_s:.2f} ms at 50% of peak, so on "
        f"the roofline (the engine's CostModel) a {slo_ms:g} ms SLO holds B = {r['roofline_slo_batch']}.")
    ceiling_roofline = "" if ceiling_step.compute_s <= ceiling_step.memory_s else (
        f", the memory term; on the roofline <b>{1e3 * ceiling_step.total_s:.2f} ms</b> (compute-bound)")
    slo_roofline = "" if slo_step.compute_s <= slo_step.memory_s else (
        f" by the memory term; on the roofline <b>B = {r['roofline_slo_batch']}</b> (compute-bound)")
    if paged < ridge:
        gap = (f"{naive} → {paged} takes the batch to {paged / ridge:.0%} of the way to {ridge:.0f}, closing "
               f"{(paged - naive) / (ridge - naive):.0%} of the gap")
    elif naive < ridge:
        gap = f"{naive} → {paged} takes the batch past {ridge:.0f}, closing the whole gap"
    else:
        gap = f"{naive} → {paged}, and on this card even the naive {naive} is past {ridge:.0f}: there was no gap"
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
                f"the card's {used_gb:.2f} of {budget / GB:.2f} GB (the lecture's quote, for its own card: '9.5 of 62.5'). Only "
                f"then say 15% (exact {100 * r['naive_utilization']:.2f}%, every sequence at the end of its life). "
                "The timing plan's 14% and 86% empty are not that figure rounded: they are a second, consistent "
                "reading, the same cache averaged over each sequence's life "
                f"({100 * r['naive_utilization_time_avg']:.2f}% used, {100 - 100 * r['naive_utilization_time_avg']:.0f}% "
                "empty).",
                "What is the utilization if we raise S_max to 32K to advertise long context?",
                f"The lecture's 1.9% is per slot, as its reasoning says (the slot grew 8× and the occupancy did not): "
                f"one slot's occupancy, 640/32,768 = {100 * slot_32k:.2f}%, written 1.9%. As a share of the budget it "
                f"is lower still: {r['slots_32k']} whole slot{'' if r['slots_32k'] == 1 else 's'} × 640 tokens of {budget / GB:.2f} GB = {100 * util_32k:.2f}%.",
                "\"Just set S_max per request.\" Good instinct, wrong outcome: internal fragmentation traded for "
                "external (Exercise 2). \"Realloc when it grows\": copying "
                f"{slot_gb:.{0 if slot_gb >= 1 else 1}f} GB mid-decode while {naive - 1} others wait.",
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
                f"({attention_intensity():.0f} FLOP/byte for {card.model().attention}), an indirect access pattern that a naive gather "
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
                f"exact; printed 164). {answer_25} If nobody asks for the SLO, that is the lesson.{roofline_note}",
                "\"Paging made latency worse, so it is a wash.\" No — it moved the operating point along a frontier "
                f"you could not previously reach. At B = {slo} you get both.",
                reveals=(f"B = {paged}: " + _flag(f"<b>{1e3 * r['tpot_s']:.2f} ms, "
                                                   f"{r['throughput_tok_s']:,.0f} tok/s</b>", "23.5, 8,470")
                         + ceiling_roofline,
                         f"At a {1e3 * r['tpot_slo_s']:g} ms SLO B = {paged} misses: "
                         f"<s>{r['throughput_tok_s']:,.0f} tok/s</s>, <b>goodput 0</b>",
                         f"Ask for the SLO first: at {slo_ms:g} ms, deploy <b>B = {slo}</b>{slo_roofline}"),
                whatif="TPOT SLO",
                lab="07"),
        Segment(68, 75, "The map of Part II (§10.7)",
                "Point at the eight dates, each against the quantity in today's arithmetic it attacks. End on \"the "
                f"allocator was the easy 7×\" (exact: {naive} → {paged} is "
                f"{r['concurrency_gain']:.2f}×).",
                "",
                f"The allocator was: {gap} (the lecture's 199 closes 64%: its 'two thirds'). "
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
