"""labsupport.viz.board (lab 08's map of Part II, lab 99's board) against hand arithmetic and small cases.

Hand numbers: decode attention does 4 x L x H x d FLOP per cached token and reads 2 x L x H_kv x d x 2
bytes of it: 4 x 32 x 32 x 128 / 524,288 = 1 for MHA, 4 for GQA-8.  A swap round trip of 4,096 MHA
tokens is 2 x 4,096 x 524,288 / 64e9 = 67.11 ms; their recompute (2 x 6.74e9 x 4,096 + 4 x 32 x 32 x
128 x 4,096^2) / (0.5 x 989e12) = 129.44 ms.
"""
from __future__ import annotations

import json
from html import escape as html_escape
from pathlib import Path

import math

import pytest

from labsupport import card
from labsupport.measure import part_two
from labsupport.measure import replay as R
from labsupport.slo import TTFTSplit
from labsupport.specs import LECTURE_7B, LECTURE_7B_GQA8, LECTURE_GPU
from labsupport.viz import board as viz_board
from labsupport.workloads import Request, Workload
from labsupport import workloads
from real_traces import real_trace

ROOT = Path(__file__).resolve().parents[1]
REAL_TRACES = all(real_trace(name) for name in workloads.TRACES)  # as the labs find them
GB = 1e9


def _hand() -> dict:
    """The board's numbers on the course card, by hand from the lecture's formulas (the lecture's card in brackets):
    KV per token 2 L n_kv d_head b (524,288 B); budget HBM - weights - 4 GB (62.52e9); 4,096-token slots (29);
    16-token blocks (7,452), 40 of them per 640-token sequence (186); TPOT (W + B x 640 x KV) / bandwidth, the memory
    term, and the roofline's step, the larger of it and B (2 N + 4 L H d 640) FLOPs at 50% of peak; the SLO's
    batch floor((SLO x bandwidth - W) / (640 x KV)) (159 at 20 ms); swap 2 x 4,096 x KV / link (67.11 ms);
    recompute (2 N 4,096 + 4 L H d 4,096^2) / (50% of peak) (129.44 ms)."""
    m, g = card.model(), card.gpu()
    kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes
    weights = m.num_params * m.dtype_bytes
    budget = g.hbm_bytes - weights - 4e9
    naive, blocks = int(budget // (4096 * kv)), int(budget // (16 * kv))
    paged = blocks // 40
    rate = 0.5 * g.peak_flops
    flops_640 = 2 * m.num_params + 4 * m.num_layers * m.num_heads * m.head_dim * 640  # one 640-token sequence's decode
    tpot = lambda b: (weights + b * 640 * kv) / g.hbm_bandwidth  # the memory term
    return dict(m=m, g=g, kv=kv, weights=weights, budget=budget, naive=naive, blocks=blocks, paged=paged,
                tpot=tpot, rate=rate, flops_640=flops_640,
                step=lambda b: max(tpot(b), b * flops_640 / rate),  # the roofline: the larger of bytes and FLOPs
                slo_b=lambda slo: math.floor((slo * g.hbm_bandwidth - weights) / (640 * kv)),
                naive_util=naive * 640 * kv / budget, paged_util=paged * 640 * kv / budget,
                util_32k=int(budget // (32_768 * kv)) * 640 * kv / budget,
                fanout=(8 * (4096 + 256) * kv / GB, (4096 + 8 * 256) * kv / GB),  # 34,816 and 6,144 tokens
                swap_ms=1e3 * 2 * 4096 * kv / g.link_bandwidth,
                recompute_ms=1e3 * (2 * m.num_params * 4096 + 4 * m.num_layers * m.num_heads * m.head_dim * 4096**2) / rate,
                gain=paged / naive)


def test_attention_intensity():
    assert part_two.attention_intensity(LECTURE_7B) == pytest.approx(4 * 32 * 32 * 128 / 524_288)
    assert part_two.attention_intensity(LECTURE_7B) == 1
    assert part_two.attention_intensity(LECTURE_7B_GQA8) == 4


def test_request_level_batching_by_hand():
    # batches [1, 2] and [3, 4]: 3 tokens over 2 steps, 7 tokens over 4 steps
    out = part_two.request_level_batching([1, 2, 3, 4, 99], batch=2)
    assert out["batches"] == 2
    assert out["mean_effective_b"] == pytest.approx((3 / 2 + 7 / 4) / 2)
    with pytest.raises(ValueError, match="full batch"):
        part_two.request_level_batching([1, 2], batch=3)


def _hashed(*lists) -> Workload:
    return Workload("toy", [Request(i, float(i), 512 * len(h), 1, tuple(h)) for i, h in enumerate(lists)], "test", True)


def test_routing_and_dependence_on_a_toy_trace():
    toy = _hashed((1, 2), (1, 2), (1, 3), (1, 2))
    # one card: B hits 2, C hits 1, D hits 2 of 8 blocks; two cards round-robin: {A, C} -> 1, {B, D} -> 2
    assert part_two.routing_hit_rates(toy, (1, 2)) == {1: pytest.approx(5 / 8), 2: pytest.approx(3 / 8)}
    # B, C and D each re-send at least half of their two blocks
    assert part_two.dependent_requests(toy) == pytest.approx(3 / 4)


def test_tlb_bytes_by_hand():
    h = _hand()  # the card's memory batch (186 on the lecture's), 40 entries of 4 B per table, one per layer
    t = part_two.tlb_bytes()
    assert t["table_bytes"] == h["paged"] * 40 * 4 * h["m"].num_layers  # 186 x 40 x 4 x 32
    assert t["kv_bytes"] == h["paged"] * 640 * h["kv"]  # 186 x 640 x 524,288
    assert t["swap_in_one_way_s"] == pytest.approx(640 * h["kv"] / h["g"].link_bandwidth)  # 640 x 524,288 / 64e9


def test_interference_spike_is_bounded_by_the_ledger():
    sp = part_two.interference_spike()  # the card's memory batch of chat neighbours on the card
    h = _hand()
    m = h["m"]
    prefill = h["recompute_ms"] / 1e3  # a 4,096-token prefill at 50% of peak: 129.44 ms on the lecture's card
    # a decode step of the memory batch at its longest (640 tokens), on the roofline: the larger of its bytes over the
    # bandwidth and its FLOPs (2 N + 4 L H d S per sequence) at 50% of peak; 22.65 ms, memory-bound, on the lecture's
    step = max(h["tpot"](h["paged"]),
               h["paged"] * (2 * m.num_params + 4 * m.num_layers * m.num_heads * m.head_dim * 640) / (0.5 * h["g"].peak_flops))
    assert sp["prefill_s"] == pytest.approx(prefill)
    # §2.16's 6.7x is the lecture's own figure, on the lecture's card whatever the course's
    lecture_prefill = (2 * 6.74e9 * 4096 + 4 * 32 * 32 * 128 * 4096**2) / (0.5 * 989e12)
    step_186 = (13.48e9 + 186 * 640 * 524_288) / 3.35e12
    assert sp["lecture_additive_ratio"] == pytest.approx((lecture_prefill + step_186) / step_186)
    # the step holding the prefill is at least the prefill and at most prefill plus a full decode step
    assert prefill <= sp["spike_gap_s"] <= prefill + step
    assert sp["usual_gap_s"] < step < sp["spike_gap_s"]


FAKE = {"request_batching": {"batch": 186, "batches": 1, "mean_effective_b": 55.0, "median_effective_b": 54.0,
                             "mean_output": 211.0},
        "spike": {"prefill_s": 0.1294, "engine_ratio": 6.5, "lecture_additive_ratio": 6.71,
                  "usual_gap_s": 0.02, "spike_gap_s": 0.13, "decode_step_s": 0.02},
        "routing": {"1": 0.366, "2": 0.27, "4": 0.19, "8": 0.136}, "dependent": 0.425, "agent_resend": 0.9206,
        "sources": {"azure": "a", "mooncake": "m"}}


def test_map_rows_follow_the_lectures_table():
    rows = part_two.map_rows(FAKE)
    assert [r.where for r in rows] == [
        "GPU programming Sep 30, kernels Oct 5", "Batching and scheduling I, Oct 7", "Disaggregation, Oct 14",
        "Routing and load balancing, Oct 19", "KV-cache optimization, Oct 28", "Prefix cache, Nov 9",
        "Pruning and quantization, Nov 11", "Speculative decoding, Nov 18", "Agent serving, Nov 18 and Nov 23"]
    for r in rows:
        assert r.lab in part_two.LAB_NAMES and f'{part_two.LAB_NAMES[r.lab]}.ipynb' in r.lab_link
    h = _hand()  # the values are the card's (the lecture's in the comments)
    assert f"{h['kv']:,} B = {h['kv'] // 1024} KiB" in rows[4].value  # 524,288 B = 512 KiB
    assert f"{1e3 * h['weights'] / h['g'].hbm_bandwidth:.2f} ms" in rows[6].value  # 13.48e9 / 3.35e12 = 4.02 ms
    slo = h["slo_b"](0.020)  # 13.48 / (13.48 + 159 x 0.3355) = 20.2%
    assert f"{100 * h['weights'] / (h['weights'] + slo * 640 * h['kv']):.0f}% of the bytes at B = {slo}" in rows[6].value
    assert f"{1 / h['tpot'](1):,.0f} tok/s" in rows[7].value  # 1 / ((13.48e9 + 640 x 524,288) / 3.35e12) = 242
    assert "92.06%" in rows[5].value
    html = viz_board.map_table_html(rows)
    assert html.count("<tr>") == 10 and 'href="04_paged_kernel.ipynb"' in html
    board = viz_board.map_board_html(rows)  # HTML, not a plotly Table: a Table widget drew blank cells
    assert board.count("<tr>") == 10 and board.count("<td") == 27 and "href" not in board
    assert all(html_escape(r.value) in board and html_escape(r.where) in board for r in rows)
    with pytest.raises(ValueError, match="unknown map columns"):
        viz_board.map_table_html(rows, columns=["the date"])


def test_segments_follow_the_timing_plan():
    segs = viz_board.SEGMENTS
    assert [(s.start, s.end) for s in segs] == [(0, 6), (6, 16), (16, 36), (36, 46), (46, 58), (58, 68), (68, 75)]
    assert [s.protected for s in segs] == [False, True, True, False, False, False, False]
    assert all(s.answer and s.board and s.reveals for s in segs)
    assert all(s.ask for s in segs[:-1]) and not segs[-1].ask  # the lecture asks nothing in 68–75
    # numbers in the notes are the exact ones, on the card: 29 x 640 x 524,288 / 62.52e9 = 15.56%, 3 x 640 x ... = 1.61%
    h = _hand()
    assert f"(exact {100 * h['naive_util']:.2f}%" in segs[1].board and f"= {100 * h['util_32k']:.2f}%" in segs[1].answer
    assert "exact {:.2f} GB against {:.2f} GB".format(*h["fanout"]) in segs[3].board  # 18.25 against 3.22 GB
    assert f"(B = {h['slo_b'](0.020)} exact" in segs[5].answer  # 159
    assert f"is {h['gain']:.2f}×" in segs[6].board  # 186 / 29 = 6.41


def _revealed() -> dict:
    """What each reveal derives, in the notes' order, on the card by hand (`_hand`); on the lecture's card:
    {1: ["9.73 of 62.52 GB", "15.56%", "1.95%"], 2: ["one new block", "15.56% → 99.83%", "29 → 186", "gather"],
     3: ["7 + 1", "18.25 GB against 3.22 GB", "5.67×"], 4: ["67.1 ms", "129.4 ms", "runs out of blocks"], 6: ["6.41×"]}
    (tests/test_browser_board.py's docstring)."""
    h = _hand()
    naive, paged, nu, pu = h["naive"], h["paged"], 100 * h["naive_util"], 100 * h["paged_util"]
    unshared, shared = h["fanout"]
    return {1: [f"{naive * 640 * h['kv'] / GB:.2f} of {h['budget'] / GB:.2f} GB", f"{nu:.2f}%", f"{100 * 640 / 32_768:.2f}%"],
            2: ["one new block", f"{nu:.2f}% → {pu:.2f}%", f"{naive} → {paged}", "gather"],
            3: ["7 + 1", f"{unshared:.2f} GB against {shared:.2f} GB", f"{34_816 / 6_144:.2f}×"],
            4: [f"{h['swap_ms']:.1f} ms", f"{h['recompute_ms']:.1f} ms", "runs out of blocks"],
            6: [f"{h['gain']:.2f}×"]}


DIRECTIONS = ("Board:", "Only then", "Let them", "Say:", "Expect confusion", "(exact", "never cut", "Minutes",
              "do not show the result", "Force them", "Let the silence", "Reading-only")


def test_results_wait_for_their_reveal_in_the_notes_order():
    data = viz_board.load_board_data()
    for i, results in _revealed().items():
        view = viz_board.segment_view(i, data)
        assert not [r for r in results if r in view.room_text()], f"segment {i} shows a result before its reveal"
        first_seen = []
        for step in range(1, view.steps + 1):
            view.reveal(step)
            first_seen += [r for r in results if r in view.room_text() and r not in first_seen]
        assert first_seen == results, (i, first_seen)  # each appears, in the order the notes give them


def test_no_instructor_direction_reaches_the_room():
    """At every step of every segment, what the room sees holds no direction and no sentence of the notes;
    the notes themselves hold them all (folded)."""
    data = viz_board.load_board_data()
    for i, seg in enumerate(viz_board.SEGMENTS):
        view = viz_board.segment_view(i, data)
        sentences = [s for t in (seg.board, seg.answer, seg.confusion) for s in t.split(". ") if len(s) >= 30]
        for step in range(view.steps + 1):
            view.reveal(step)
            room = view.room_text()
            assert not [d for d in DIRECTIONS if d in room], (i, step)
            assert not [s for s in sentences if s in room], (i, step)
        notes = viz_board.notes_html(seg)  # the presenter view's, never in the room's widgets
        assert "Board:" in notes and "Minutes" in notes
        assert notes not in str(view.widget.children) and "board-notes" not in view.room_text()
        # "Expect confusion" only where the lecture names one: §10.7's notes have none (issue 36)
        assert ("Expect confusion" in notes) == bool(seg.confusion)


def test_board_pictures_are_the_lectures():
    fig = viz_board.five_jobs_figure()
    assert sum(1 for s in fig.layout.shapes if s.type == "circle") == 2  # memory, circled twice
    assert len(viz_board.engine_loop_figure(0).layout.annotations) >= 6  # the six verbs in a cycle
    h = _hand()  # the card's: 67.11 ms and 129.44 ms on the lecture's
    bars = viz_board.engine_loop_figure(2)
    assert bars.data[0].x[0] == pytest.approx(h["swap_ms"])
    assert bars.data[1].x[0] == pytest.approx(h["recompute_ms"])
    table = viz_board.block_table_figure(5)  # HTML: a table reads at any width
    assert "<td>4,096</td>" in table and "<td>256</td>" in table and "1 token<" in table  # 4,096 / 1; 4,096 / 16
    pairs = viz_board.block_table_figure(2)
    # exact on the card beside the lecture's print: 186 x 640 / (7,452 x 16) = 99.83% paged on the lecture's card
    assert [list(t.x) for t in pairs.data][:2] == [[pytest.approx(100 * h["naive_util"], abs=1e-3),
                                                  pytest.approx(100 * h["paged_util"], abs=1e-3)], [15.2, 98.7]]
    bars = viz_board.swap_recompute_figure()  # the card's MHA form first: 2 x 4,096 x 524,288 B / 64 GB/s
    mha = card.card().mha
    assert bars.data[0].y[0] == pytest.approx(
        1e3 * 2 * 4096 * (2 * mha.num_layers * mha.num_kv_heads * mha.head_dim * mha.dtype_bytes) / h["g"].link_bandwidth)


def _attention(m) -> str:
    """By hand from the spec's heads: 'MHA' when every query head has its own KV head, else 'GQA-n' for n KV heads
    (the lecture's 7B: 32 of 32, MHA; Llama 3 8B: 8 of 32, GQA-8)."""
    return "MHA" if m.num_kv_heads == m.num_heads else f"GQA-{m.num_kv_heads}"


def test_the_stall_names_the_attention_of_the_model_it_prices():
    """46–58 and the labs' swap-or-recompute bars on any card (a reviewer, on H200 + Llama 3 8B: the titles said MHA
    and GQA-8 whatever the model, and the bars were cut at 160 ms)."""
    c = card.card()
    title = viz_board.engine_loop_figure(2).layout.title.text.replace("<br>", " ")
    assert f"A preempted 4,096-token {_attention(c.model)} sequence" in title
    fig = viz_board.swap_recompute_figure()
    title = fig.layout.title.text.replace("<br>", " ")
    assert f"({_attention(c.mha)})" in title and f"({_attention(c.gqa)})" in title
    g = c.gpu
    stalls = []  # ms: 67.11 and 129.44 (MHA), 16.78 and 129.44 - the GQA form's attention FLOPs are the same (GQA-8)
    for m in (c.mha, c.gqa):
        kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes
        stalls += [1e3 * 2 * 4096 * kv / g.link_bandwidth,
                   1e3 * (2 * m.num_params * 4096 + 4 * m.num_layers * m.num_heads * m.head_dim * 4096**2)
                   / (0.5 * g.peak_flops)]
    assert sorted(y for t in fig.data for y in t.y) == pytest.approx(sorted(stalls))
    assert fig.layout.yaxis.range[0] == 0 and fig.layout.yaxis.range[1] >= 1.15 * max(stalls)  # every label inside


def test_the_naive_segment_quotes_the_lecture_as_the_lectures():
    """6–16's notes: the card's used-of-budget figure, the lecture's '9.5 of 62.5' named as its quote; the 32K slots
    and the realloc's copy are the card's (3 slots of 2.147 GB, 28 others waiting, on the lecture's card)."""
    h = _hand()
    seg = viz_board.SEGMENTS[1]
    used, budget = h["naive"] * 640 * h["kv"] / GB, h["budget"] / GB  # 9.73 of 62.52 GB on the lecture's card
    assert f"the card's {used:.2f} of {budget:.2f} GB (the lecture's quote, for its own card: '9.5 of 62.5')" in seg.board
    slots = int(h["budget"] // (32_768 * h["kv"]))
    assert f": {slots} whole slot{'' if slots == 1 else 's'} × 640 tokens" in seg.answer
    assert f"while {h['naive'] - 1} others wait" in seg.confusion


def test_the_slo_segment_says_when_its_tpot_is_the_memory_term():
    """58–68: §10.6's TPOT is the ledger's memory term.  Where the step's FLOPs take longer (H200 + Llama 3 8B: at
    B = 952, 952 x (2 x 8.03e9 + 4 x 32 x 32 x 128 x 640) / 494.5e12 = 31.56 ms against 19.98 ms of bytes) the notes
    and the room's lines say so, with the roofline's batch: floor(0.020 x 494.5e12 / 16.40e9) = 603.  On the
    lecture's card the FLOPs take 4.44 ms at B = 159: nothing is added."""
    h = _hand()
    seg = viz_board.SEGMENTS[5]
    slo_b, paged = h["slo_b"](0.020), h["paged"]
    bound = slo_b * h["flops_640"] / h["rate"] > h["tpot"](slo_b)
    roofline_b = min(slo_b, math.floor(0.020 * h["rate"] / h["flops_640"]))
    if bound:
        assert f"a 20 ms SLO holds B = {roofline_b}." in seg.answer and "memory term" in seg.answer
        assert f"on the roofline <b>B = {roofline_b}</b>" in seg.reveals[2]
    else:
        assert "memory term" not in seg.answer + " ".join(seg.reveals)
    ceiling_bound = paged * h["flops_640"] / h["rate"] > h["tpot"](paged)  # 47.78 ms against 28.53 ms on the H200
    assert (f"on the roofline <b>{1e3 * h['step'](paged):.2f} ms</b>" in seg.reveals[0]) == ceiling_bound
    if h["tpot"](paged) <= 0.025:  # 22.65 ms on the lecture's card
        assert f"At 25 ms the memory-ceiling column (B = {paged}) wins." in seg.answer
    else:  # 28.53 ms on H200 + Llama 3 8B: the SLO-limited column still
        assert f"At 25 ms the SLO-limited column still wins (B = {h['slo_b'](0.025)})" in seg.answer
        assert f"needs {1e3 * h['tpot'](paged):.2f} ms" in seg.answer


def test_the_map_prices_the_cadence_on_the_roofline():
    """§10.7's spike row and the one-stream row: the memory batch's step is the larger of its bytes and its FLOPs
    (22.65 ms, memory-bound, on the lecture's card; 47.78 ms, compute-bound, at B = 1441 on H200 + Llama 3 8B, where
    the bytes alone say 28.53 ms), and the prefill is the card's (129.4 ms on the lecture's)."""
    h = _hand()
    rows = part_two.map_rows(FAKE)
    step, prefill = h["step"](h["paged"]), h["recompute_ms"] / 1e3
    assert (f"{1e3 * prefill:.1f} ms prefill in a {1e3 * step:.2f} ms cadence: {(prefill + step) / step:.2f}× added"
            in rows[2].value)
    assert f"one stream tops out at {1 / h['step'](1):,.0f} tok/s" in rows[7].value
    assert part_two.tlb_bytes()["step_s"] == pytest.approx(step)


@pytest.mark.parametrize("model", [LECTURE_7B, LECTURE_7B_GQA8], ids=lambda m: m.name)
def test_the_interference_spike_takes_its_neighbours_from_the_model_it_prices(model):
    """Its neighbours default to the memory batch of the model and GPU passed in, not the card's: on the lecture's
    H100, 7,452 blocks // 40 = 186 for the 7B and floor(62.52e9 / (16 x 131,072)) // 40 = 745 for its GQA-8; the
    reference step is theirs at 576 tokens, (13.48e9 + 186 x 576 x 524,288) / 3.35e12 = 20.79 ms for the 7B."""
    g = LECTURE_GPU
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    weights = model.num_params * model.dtype_bytes
    neighbours = int((g.hbm_bytes - weights - 4e9) // (16 * kv)) // 40
    sp = part_two.interference_spike(model=model, gpu=g)
    assert sp["decode_step_s"] == pytest.approx((weights + neighbours * 576 * kv) / g.hbm_bandwidth)


def test_every_segment_builds_from_the_shipped_data():
    data = viz_board.load_board_data()
    for i, seg in enumerate(viz_board.SEGMENTS):
        view = viz_board.segment_view(i, data)
        assert view.text().startswith(f"{seg.start}–{seg.end} min")
    with pytest.raises(IndexError):
        viz_board.segment_view(7, data)


def test_the_board_steps_forward_and_back():
    board = viz_board.Board(viz_board.load_board_data())
    steps = [len(s.reveals) for s in viz_board.SEGMENTS]
    for _ in range(sum(steps) + len(steps) - 1):  # every reveal, then every next segment
        board.forward()
    assert (board.keys.index, board.keys.revealed) == (6, steps[6])
    board.forward()  # past the end: nothing
    assert (board.keys.index, board.keys.revealed) == (6, steps[6])
    board.back()
    assert (board.keys.index, board.keys.revealed) == (6, 0)
    board.back()  # to 58–68 as it was left: everything revealed
    assert (board.keys.index, board.keys.revealed) == (5, steps[5])
    board._on_msg(None, {"action": "previous"}, [])
    assert board.keys.index == 4 and board.keys.label.startswith("46–58 min")


@pytest.mark.slow
@pytest.mark.skipif(not REAL_TRACES, reason="the real traces are not present, or hidden")
def test_shipped_board_data_is_current():
    """board_data.json must be what the engine and the traces give today (regenerate with --write)."""
    shipped = json.loads(viz_board.BOARD_DATA.read_text())
    fresh = json.loads(json.dumps(viz_board.compute_board_data()))
    assert fresh == shipped, "labsupport/viz/board/board_data.json is stale: run `python -m labsupport.viz.board --write`"


def test_length_prediction_cost_by_hand():
    """Seed 2 on three requests: a perfect predictor idles the not-yet-generated tokens; a wrong one
    either preempts (under) or idles more (over)."""
    reqs = [Request(0, 0.0, 10, 4), Request(1, 0.0, 20, 2), Request(2, 0.0, 5, 1)]
    w = Workload("three", reqs, "test", True)
    # held token slots over each request's steps: sum_{k<o} (p + k)
    held = (10 * 4 + 6) + (20 * 2 + 1) + 5 * 1
    exact = part_two.length_prediction_cost(w, 0.0)
    reserved = 14 * 4 + 22 * 2 + 6 * 1  # (p + o) for o steps each
    assert exact["preempted_share"] == 0 and exact["recompute_share"] == 0
    assert exact["idle_share"] == pytest.approx(1 - held / reserved)
    half = part_two.length_prediction_cost(w, 0.0, margin=0.5)  # predicts 2, 1, 1 (never below 1)
    assert half["preempted_share"] == pytest.approx(2 / 3)  # the first two outgrow their reservation
    assert half["recompute_share"] == pytest.approx(((10 + 2) + (20 + 1)) / (10 + 20 + 5))
    reserved_half = (10 * 4 + 2 * 2 + 4 * 2) + (20 * 2 + 1 * 1 + 2 * 1) + 6 * 1
    assert half["idle_share"] == pytest.approx(1 - held / reserved_half)
    double = part_two.length_prediction_cost(w, 0.0, margin=2.0)  # reserves 8, 4, 2 output tokens
    assert double["idle_share"] == pytest.approx(1 - held / ((10 + 8) * 4 + (20 + 4) * 2 + (5 + 2) * 1))
    with pytest.raises(ValueError, match="sigma"):
        part_two.length_prediction_cost(w, -1.0)


def test_tlb_replay_counts_lookups_and_new_translations():
    """Seed 3: two sequences of 40 and 20 tokens in blocks of 16 decode; every step reads every
    resident block once per layer (the course card's model's layers: 32 on the lecture's, 28 on Qwen2.5-7B);
    an LRU TLB below the working set serves nothing."""
    reqs = [Request(0, 0.0, 40, 30), Request(1, 0.0, 20, 30)]
    rp = R.tlb_replay(reqs, entries=[1, 4, 8, 1000], num_blocks=64, block_size=16)
    layers = card.card().model.num_layers
    # hand: after the prefill step the tables hold 3 + 2 = 5 blocks; both grow one token per step
    lens = [(40 + k, 20 + k) for k in range(30)]  # the KV each holds after step k + 1
    blocks = [-(-a // 16) + -(-b // 16) for a, b in lens[:29]]  # both finish at step 30 and are freed
    assert rp.steps == 29 and rp.layers == layers
    assert rp.lookups == layers * sum(blocks)
    assert rp.new_translations == blocks[-1]  # tables only grow here: everything ever held is new once
    assert rp.peak_working_set == max(blocks) == 5 + 3  # 68 and 48 tokens at the last counted step
    assert rp.hit_rate(1000) == pytest.approx(1 - rp.new_translations / rp.lookups)
    assert rp.hit_rate(4) == 0.0  # 4 entries < the 5 to 8 translations: LRU thrashes on the layer sweeps


# The placeholder scan of every board panel (and of every lab's printed output) is in
# tests/test_teaching_consistency.py.


def test_bench_board_starts_voila_as_make_present_does():
    """`bench board` times present mode on the Makefile's own Voila flags, and refuses an argument in one line."""
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    from labsupport.bench import board as bench_board

    root = Path(__file__).resolve().parents[1]
    flags = subprocess.run(["make", "-s", "-C", str(root), "print-PRESENT_FLAGS"], capture_output=True, text=True,
                           check=True).stdout
    assert list(bench_board.PRESENT_FLAGS) == shlex.split(flags)
    proc = subprocess.run([sys.executable, "-m", "labsupport", "bench", "board", "--fast"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "'--fast'" in proc.stderr, proc.stderr


def test_the_three_operating_points_come_from_the_ledger():
    """§10.6's columns, by hand (640-token sequences: 640 x 524,288 = 335,544,320 B each; 13.48e9 B of weights;
    3.35e12 B/s): naive floor(62.52e9 / (4,096 x 524,288)) = 29; paged 7,452 blocks // 40 = 186; at a 20 ms SLO
    floor((0.020 x 3.35e12 - 13.48e9) / 335,544,320) = floor(159.5) = 159; at 25 ms floor(209.4) = 209.
    TPOT at B = 29: (13.48e9 + 29 x 335,544,320) / 3.35e12 = 6.93 ms."""
    h = _hand()  # on the course card; the docstring's numbers are the lecture's card
    points = viz_board.operating_points(0.020)
    want = [("naive", h["naive"]), ("memory ceiling", h["paged"]), ("SLO bound", h["slo_b"](0.020))]
    assert [(name, b) for name, b, _ in points] == want  # 29, 186, 159
    assert points[0][2] == pytest.approx(h["tpot"](h["naive"]))  # 6.93 ms
    assert viz_board.operating_points(0.025)[2][1] == h["slo_b"](0.025)  # 209
    fig = viz_board.slo_figure(3, _splits(), 500)
    ticks = list(fig.data[1].x)
    assert [t.split("B = ")[1] for t in ticks] == [str(b) for _, b in want]  # each column named with its batch
    assert h["tpot"](h["paged"]) > 0.020  # the ceiling's step misses 20 ms (22.65 ms), so it is struck
    throughput = f"{h['paged'] / h['tpot'](h['paged']):,.0f} tok/s"  # 8,210 tok/s
    assert "goodput 0" in fig.data[1].text[1] and throughput not in fig.data[1].text[1]  # struck at 20 ms
    before = viz_board.slo_figure(0, _splits(), 500)
    assert not any(before.data[1].y) and not any(before.data[1].text)  # the TPOTs wait for their reveal


def _splits():
    data = viz_board.load_board_data()
    rate = max(data["ttft_splits"], key=float)
    return [TTFTSplit(**s) for s in data["ttft_splits"][rate]]


def test_each_shape_is_drawn_on_the_axis_it_shows():
    """6–16 (issue 36): the slots in tokens on the first panel's axis, the budget's slots in GB on the second's;
    no hidden axis.  4,096 x 524,288 B = 2.147 GB a slot; the 32K row appears at step 3 only."""
    for step in range(4):
        fig = viz_board.naive_figure(step, 500)
        axes = {t.xaxis or "x" for t in fig.data}
        assert axes == {"x", "x2"}, axes
        assert all(fig.layout[name].visible is not False for name in ("xaxis", "xaxis2"))
        rows = {y for t in fig.data for y in t.y}
        assert any("32K" in y for y in rows) == (step >= 3), (step, rows)
    h = _hand()  # the card's slots: 29 of 2.147 GB on the lecture's
    gb = [t for t in viz_board.naive_figure(0, 500).data if t.xaxis == "x2"]
    assert sum(len(t.x) for t in gb) == 2 * h["naive"] and gb[0].x[0] + gb[1].x[0] == pytest.approx(4096 * h["kv"] / GB)
    # S_max = 131,072: on the lecture's card a slot is 131,072 x 524,288 = 68.72 GB > 62.52 GB, none fits (the row
    # stays and says so); 65,536: 34.36 GB, one
    n128, n64 = int(h["budget"] // (131_072 * h["kv"])), int(h["budget"] // (65_536 * h["kv"]))
    big = viz_board.naive_figure(3, 500, s_max=131_072)
    assert f"{n128} × 128K" in {y for t in big.data for y in t.y}
    assert any("none fits" in (a.text or "") for a in big.layout.annotations) == (n128 == 0)
    assert f"<b>{n64}</b> fit" in viz_board.whatif_readout(1, 65_536)


def test_the_concurrency_pair_waits_for_its_own_reveal():
    """16–36: at step 2 only the utilization panel holds bars; 29 → 186 arrives at step 3."""
    two, three = viz_board.block_table_figure(2), viz_board.block_table_figure(3)
    assert [list(t.x) for t in two.data if t.xaxis == "x2"] == [[0, 0], [0, 0]]
    h = _hand()  # exact on the card (29 → 186 on the lecture's), then the lecture's print
    assert [list(t.x) for t in three.data if t.xaxis == "x2"] == [[h["naive"], h["paged"]], [29, 199]]


def test_the_what_if_slider_appears_only_after_the_reveal():
    """6–16 and 58–68 get their slider once every result is shown; moving it moves the picture."""
    data = viz_board.load_board_data()
    for index in (1, 5):
        view = viz_board.segment_view(index, data)
        for step in range(view.steps):
            view.reveal(step)
            assert not view.whatif_box.children, (index, step)
        view.reveal(view.steps)
        assert view.whatif_box.children
        before = view.figure.to_dict()
        view.slider.index = len(view.slider.options) - 1
        assert view.figure.to_dict() != before
        view.reveal(view.steps - 1)
        assert not view.whatif_box.children
    h = _hand()  # at 25 ms on the lecture's card: deploy B = 209; the ceiling's 186 (22.65 ms) meets it
    meets = "meets it" if h["tpot"](h["paged"]) <= 0.025 else "goodput 0"
    assert f"B = {h['slo_b'](0.025)}</b>" in viz_board.whatif_readout(5, 0.025)
    assert f"B = {h['paged']}: {meets}" in viz_board.whatif_readout(5, 0.025)


def test_the_presenter_view_follows_the_deck():
    """The keys widget carries the notes and the next segment's question (never the room's widgets)."""
    board = viz_board.Board(viz_board.load_board_data())
    segs = viz_board.SEGMENTS
    assert "Board:" in board.keys.notes and segs[1].ask in board.keys.next_up
    board.forward()
    board.forward()
    assert board.keys.index == 1 and segs[2].ask in board.keys.next_up and "6–16" not in board.keys.next_up
    board._on_msg(None, {"action": "fit", "height": 333}, [])
    assert board.view.height == 333 and board.view.figure.layout.height == 333
    assert board.view.figure._config.get("displayModeBar") is False


def test_the_board_notebook_puts_the_heading_first_and_folds_its_code():
    """Issue 36: the lecture's heading above the board; the Colab set-up cell, the board's own code and the live
    demo's below it folded in JupyterLab (the build keeps a source's jupyter.source_hidden), so no code is projected."""
    nb = json.loads((ROOT / "notebooks" / "99_board.ipynb").read_text(encoding="utf-8"))
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown" and "Lecture 10" in "".join(cells[0]["source"])
    code = [c for c in cells if c["cell_type"] == "code"]
    assert len(code) == 3 and "google.colab" in "".join(code[0]["source"]) and "Board()" in "".join(code[1]["source"])
    assert "LiveDemo()" in "".join(code[2]["source"])  # issue 38: the live demo, folded below the board
    assert all(c["metadata"].get("jupyter", {}).get("source_hidden") for c in code)
