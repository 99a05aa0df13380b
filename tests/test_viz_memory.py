"""The memory labs' figures and panels (labsupport.viz.memory, labs 02 and 03).

Expected values are the lecture's arithmetic done by hand here (62.52e9-byte budget, 524,288 B per
token, FIFO block order worked out on paper), not read back from the code under test.  Panels are
driven the way a browser drives them: by setting a control's `.value` or clicking a button.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest

from labsupport import card
from labsupport.measure import block_size, fragmentation
from labsupport.block_allocator import BlockAllocator
from labsupport.contiguous import ContiguousAllocator
from labsupport.measure.fig2 import Breakdown
from labsupport.specs import GPUS
from labsupport.viz import memory as vm

KV = 2 * 32 * 32 * 128 * 2  # 524,288 B per token, the lecture's 7B MHA in bf16
KV_GQA8 = KV // 4
BUDGET = 80e9 - 2 * 6.74e9 - 4e9  # 62.52e9 B


def _widths(trace) -> list[float]:
    return list(trace.x)


# --- §10.2: one slot, and the stack of slots -----------------------------------------------------

def test_slot_figure_shades_the_sequence_and_leaves_the_rest_empty():
    fig = vm.slot_figure(4096, 512, 128)
    assert [t.x[0] for t in fig.data] == [512, 128, 4096 - 640]
    assert [t.base[0] for t in fig.data] == [0, 512, 640]
    fig32 = vm.slot_figure(32_768, 512, 128)
    assert fig32.data[2].x[0] == 32_768 - 640


def test_slot_figure_truncates_a_sequence_longer_than_its_slot():
    fig = vm.slot_figure(512, 512, 128)
    assert [t.x[0] for t in fig.data] == [512, 0, 0]
    with pytest.raises(ValueError, match="s_max"):
        vm.slot_figure(0, 512, 128)


@pytest.mark.parametrize("s_max, kv, slots", [
    (4096, KV, 29),  # 62.52e9 / 2,147,483,648 = 29.11
    (32_768, KV, 3),  # / 17,179,869,184 = 3.64
    (131_072, KV, 0),  # one 68.7 GB slot is larger than the budget
    (131_072, KV_GQA8, 3),  # 17.18 GB slots under GQA-8
    (512, KV, 232),  # 62.52e9 / 268,435,456 = 232.9
])
def test_fill_reserve_to_max_admits_what_the_hand_arithmetic_says(s_max, kv, slots):
    alloc = fragmentation.fill_reserve_to_max(BUDGET, s_max, 640, kv)
    alloc.check_invariants()
    assert alloc.num_seqs == slots
    held = min(640, s_max)
    m = fragmentation.naive_measurement(alloc, BUDGET)
    assert m["concurrency"] == slots
    assert m["slot_bytes"] == s_max * kv
    assert m["occupied_bytes"] == slots * held * kv
    assert m["utilization"] == pytest.approx(slots * held * kv / BUDGET, rel=1e-12)


def test_the_lecture_point_15_56_percent_at_4k():
    m = fragmentation.naive_measurement(fragmentation.fill_reserve_to_max(BUDGET, 4096, 640, KV), BUDGET)
    # 29 x 640 x 524,288 = 9,730,785,280 B of tokens in 62.52e9 B
    assert m["occupied_bytes"] == 9_730_785_280
    assert m["utilization"] == pytest.approx(0.155643, abs=1e-6)
    assert m["leftover_bytes"] == 62_520_000_000 - 29 * 2_147_483_648  # 0.243 GB no slot can use


def test_fill_reserve_to_max_needs_a_budget():
    with pytest.raises(ValueError, match="no room"):
        fragmentation.fill_reserve_to_max(-1e9, 4096, 640, KV)


def test_slot_stack_figure_draws_one_row_per_slot():
    fig = vm.slot_stack_figure(fragmentation.fill_reserve_to_max(BUDGET, 4096, 640, KV), BUDGET)
    used, empty = fig.data
    assert len(used.y) == 29
    assert all(x == pytest.approx(640 * KV / 1e9) for x in used.x)
    assert all(x == pytest.approx(3456 * KV / 1e9) for x in empty.x)
    assert "29 slots" in fig.layout.title.text and "15.56%" in fig.layout.title.text


def test_slot_stack_figure_folds_many_slots_into_one_row():
    fig = vm.slot_stack_figure(fragmentation.fill_reserve_to_max(BUDGET, 512, 640, KV), BUDGET, max_rows=32)
    labels = list(fig.data[0].y)
    assert len(labels) == 32
    assert labels[-1] == f"… {232 - 31} more"


def test_slot_stack_figure_with_no_slot_says_so():
    fig = vm.slot_stack_figure(fragmentation.fill_reserve_to_max(BUDGET, 131_072, 640, KV), BUDGET)
    assert list(fig.data[0].x) == pytest.approx([131_072 * KV / 1e9, BUDGET / 1e9])
    assert any("zero requests" in a.text for a in fig.layout.annotations)


def _slots(m, gpu, s_max):
    """§10.2 by hand: reserve-to-max slots, (HBM - weights - 4 GB) // (S_max x 2 L n_kv d_head b), and the budget."""
    budget = gpu.hbm_bytes - m.num_params * m.dtype_bytes - 4e9
    return int(budget // (s_max * 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes)), budget


def test_naive_panel_follows_its_controls():
    C = card.card()  # the panel opens on the course card: 29 slots of 4K on the lecture's
    panel = vm.naive_panel()
    assert f"real allocator: {_slots(C.model, C.gpu, 4096)[0]:,} sequences" in panel.text()
    before = panel.figure.to_dict()
    panel.controls["s_max"].value = 32_768
    assert panel.figure.to_dict() != before
    n, budget = _slots(C.model, C.gpu, 32_768)  # the lecture's: 3 x 640 x 524,288 / 62.52e9 = 1.61%
    kv = 2 * C.model.num_layers * C.model.num_kv_heads * C.model.head_dim * C.model.dtype_bytes
    assert f"real allocator: {n:,} sequences" in panel.text()
    assert f"utilization {100 * n * 640 * kv / budget:.2f}%" in panel.text()
    panel.controls["model"].value = C.contrast.name  # lecture-7b-gqa8: 62.52e9 / (32,768 x 131,072) = 14.56
    assert f"real allocator: {_slots(C.contrast, C.gpu, 32_768)[0]:,} sequences" in panel.text()
    panel.controls["s_max"].value = 131_072
    panel.controls["model"].value = C.mha.name  # the lecture's card: a 68.7 GB slot in 62.52 GB, 0 sequences
    assert f"real allocator: {_slots(C.mha, C.gpu, 131_072)[0]:,} sequences" in panel.text()
    panel.controls["gpu"].value = "a100-40gb"  # a 68.7 GB MHA slot against a budget under 23 GB: none fits
    assert _slots(C.mha, GPUS["a100-40gb"], 131_072)[0] == 0
    assert "real allocator: 0 sequences" in panel.text()
    assert panel.error is None


def test_naive_panel_reports_a_card_the_weights_overflow():
    C = card.card()
    panel = vm.naive_panel()
    before = panel.figure.to_dict()
    panel.controls["model"].value = "llama-3-70b"
    panel.controls["gpu"].value = "l4"  # 141 GB of weights on a 24 GB card
    assert panel.error and "no room" in panel.error
    panel.controls["gpu"].value = "h100-sxm-80gb"  # 80 - 141.2 - 4 < 0 as well
    assert panel.error
    panel.controls["model"].value = C.model.name
    assert panel.error is None
    panel.controls["gpu"].value = C.gpu.name  # back on the card: the figure it opened with
    assert panel.error is None and panel.figure.to_dict() == before


# --- Exercise 2: per-request S_max ----------------------------------------------------------------

def test_run_until_fragmented_stops_at_a_refusal_with_enough_free_memory():
    run = fragmentation.run_until_fragmented(119_247, kv_bytes_per_token=KV, seed=0)
    run.allocator.check_invariants()
    ref = run.refusal
    assert run.found
    assert ref.free_tokens >= ref.requested_tokens > ref.largest_hole_tokens
    holes = run.allocator.holes()
    assert sum(size for _, size in holes) == ref.free_tokens
    assert max(size for _, size in holes) == ref.largest_hole_tokens


def test_run_until_fragmented_can_wait_for_a_medium_request():
    run = fragmentation.run_until_fragmented(119_247, seed=1, stop_sizes=[4096])
    assert run.found and run.refusal.requested_tokens == 4096
    assert run.refusal.largest_hole_tokens < 4096 <= run.refusal.free_tokens


def test_run_until_fragmented_rejects_bad_input():
    with pytest.raises(ValueError, match="summing to 1"):
        fragmentation.run_until_fragmented(100_000, mix=((512, 0.5), (4096, 0.4)))
    with pytest.raises(ValueError, match="exceeds the pool"):
        fragmentation.run_until_fragmented(1000)
    with pytest.raises(ValueError, match="stop_sizes"):
        fragmentation.run_until_fragmented(100_000, stop_sizes=[1000])


def test_address_space_figure_tiles_the_pool_and_shows_the_refused_request():
    alloc = ContiguousAllocator(10_000, kv_bytes_per_token=KV)
    alloc.allocate("a", 4096)
    alloc.allocate("b", 512)
    alloc.allocate("c", 4096)
    alloc.free("b")  # a 512-token hole between two slots, and 1,296 free at the end
    ref = alloc.refusal_for("d", 4096)
    fig = vm.address_space_figure(alloc, ref)
    space = [t for t in fig.data if t.y[0] == "address space"]
    total = sum(sum(t.x) for t in space)
    assert total == pytest.approx(10_000 * KV / 1e9)
    holes = {t.name: list(t.x) for t in space if "hole" in t.name}
    assert sorted(holes["hole too small for the request"]) == pytest.approx(sorted([512 * KV / 1e9, 1296 * KV / 1e9]))
    refused = [t for t in fig.data if t.y[0] == "refused request"]
    assert refused[0].x[0] == pytest.approx(4096 * KV / 1e9)


# --- Fig. 2 -------------------------------------------------------------------------------------

def _breakdown(policy, shares):
    return Breakdown(policy, *shares, samples=1, steps=1, finished=0, preemptions=0, mean_running=1.0,
                     capacity_tokens=100)


def test_fig2_figure_stacks_the_shares_and_marks_the_paper():
    bds = {"max": _breakdown("max", (0.1, 0.05, 0.8, 0.05, 0.0)),
           "paged": _breakdown("paged", (0.97, 0.01, 0.0, 0.0, 0.02)),
           "max 16K": _breakdown("max", (0.05, 0.02, 0.9, 0.03, 0.0))}
    fig = vm.fig2_figure(bds, labels={"max 16K": "Orca (Max), 16K"})
    bars = [t for t in fig.data if t.type == "bar"]
    assert list(bars[0].x) == ["Orca (Max)", "paged (vLLM)", "Orca (Max), 16K"]
    assert list(bars[0].y) == pytest.approx([10, 97, 5])
    for i in range(3):
        assert sum(t.y[i] for t in bars) == pytest.approx(100)
    paper = [t for t in fig.data if t.type == "scatter"][0]
    assert list(paper.x) == ["Orca (Max)", "paged (vLLM)"]
    assert list(paper.y) == pytest.approx([20.4, 96.3])  # Kwon et al., SOSP 2023, Fig. 2
    with pytest.raises(ValueError):
        vm.fig2_figure({})


# --- §10.3: the block table ----------------------------------------------------------------------

def _arrows(fig):
    return [a for a in fig.layout.annotations if a.showarrow]


def test_block_table_figure_draws_one_arrow_per_table_entry_to_its_block():
    alloc = BlockAllocator(8, 4)
    alloc.allocate("A", 5)  # blocks 0, 1 (a fresh free list hands out 0, 1, 2, ...)
    alloc.allocate("B", 3)  # block 2
    alloc.append_slot("B")  # B fills block 2 (4 tokens)
    alloc.append_slot("B")  # B's 5th token: block 3
    fig = vm.block_table_figure(alloc, ["A", "B"])
    arrows = _arrows(fig)
    assert len(arrows) == 4
    assert sorted(a.y for a in arrows) == [0, 1, 2, 3]  # arrow heads sit on physical blocks 0..3
    texts = [a.text for a in fig.layout.annotations]
    assert "A: 5 tokens → [0, 1]   B: 5 tokens → [2, 3]" in texts
    assert any("4 free" in t for t in texts)
    cells = {t.name: len(t.x) for t in fig.data if t.type == "bar"}
    # each of A's and B's 5 tokens appears twice (logical and physical); each has 3 empty tail slots;
    # the 4 free pool blocks are 16 free cells
    assert cells == {"used": 2 * 10, "tail": 2 * 6, "free": 16}


def test_block_table_figure_highlights_the_entry_and_its_block():
    alloc = BlockAllocator(4, 2)
    alloc.allocate("A", 3)  # blocks 0, 1
    fig = vm.block_table_figure(alloc, highlight=("A", 1))
    thick = [t for t in fig.data if t.type == "scatter" and t.mode == "lines" and t.line.width == 4][0]
    corners = [(x, y) for x, y in zip(thick.x, thick.y) if x is not None]
    assert len(corners) == 2 * 5  # two closed rectangles: the logical entry A1 and physical block 1
    pool = [(x, y) for x, y in corners if x > 1.5]
    assert min(y for _, y in pool) == pytest.approx(1 - 0.4) and max(y for _, y in pool) == pytest.approx(1 + 0.4)


def test_board_script_interleaves_a_and_b():
    ex = vm.block_table_explorer(num_blocks=12, block_size=4, a_tokens=8, b_tokens=5)
    tables = ex.cache.allocator.block_tables
    # prefill A (3 tokens: block 0), B (2 tokens: block 1); decode in turns: A's 5th token takes
    # block 2, B's 5th token takes block 3
    assert tables["A"] == [0, 2] and tables["B"] == [1, 3]
    ex.cache.check_invariants()
    k, _ = ex.cache.gather("A")
    assert [int(x) for x in k[0, :, 0, 0]] == list(range(8))  # each token's K holds its position


def test_explorer_buttons_drive_the_real_cache():
    ex = vm.block_table_explorer()
    before = ex.figure.to_dict()
    ex.buttons["grow A"].click()  # A's two blocks are full: the 9th token takes block 4
    assert ex.cache.allocator.block_tables["A"] == [0, 2, 4]
    assert "new table entry A2 → #4" in ex.message
    assert len(_arrows(ex.figure)) == 5
    assert ex.figure.to_dict() != before
    ex.buttons["grow B"].click()  # B has 5 of 8 slots: no new block
    assert ex.cache.allocator.block_tables["B"] == [1, 3] and "no new block" in ex.message
    ex.buttons["free A"].click()
    assert "A" not in ex.cache.allocator.block_tables
    assert len(_arrows(ex.figure)) == 2
    ex.buttons["grow A"].click()  # a new A: FIFO free list hands out block 5 (0, 2, 4 were freed last)
    assert ex.cache.allocator.block_tables["A"] == [5]
    ex.buttons["reset"].click()
    assert ex.cache.allocator.block_tables == {"A": [0, 2], "B": [1, 3]}


def test_explorer_reports_a_full_pool_and_a_block_size_change():
    ex = vm.BlockTableExplorer(("A",), num_blocks=2, block_size=2)
    for _ in range(4):
        ex.step("grow A")
    msg = ex.step("grow A")
    assert "pool is full" in msg and ex.cache.allocator.seq_lens["A"] == 4
    ex.controls["block_size"].value = 4
    assert ex.cache.block_size == 4 and ex.cache.allocator.block_tables == {}
    with pytest.raises(ValueError, match="unknown action"):
        ex.step("grow Z")


# --- block size: measured and from the ledger -----------------------------------------------------

def test_contiguous_runs_split_at_non_consecutive_blocks():
    # blocks 3, 4, 5 are one run of 12 tokens; 9, 10 a second run of 4 + 3 = 7 tokens
    assert block_size.contiguous_runs({"s": [3, 4, 5, 9, 10]}, {"s": 19}, 4) == [12, 7]
    assert block_size.contiguous_runs({"s": [7], "t": [2, 1]}, {"s": 1, "t": 8}, 4) == [1, 4, 4]


def test_fitting_batch_counts_whole_sequences_of_the_mean_length():
    # 640-token sequences: 62.52e9 / (640 * 524,288) = 186.3 -> 186 (before any block rounding)
    assert block_size.fitting_batch([640] * 10, KV, BUDGET) == 186
    # the mean, not the median: nine 100-token sequences and one 9,100-token one average 1,000 tokens,
    # 62.52e9 / (1,000 * 524,288) = 119.2 -> 119
    assert block_size.fitting_batch([100] * 9 + [9100], KV, BUDGET) == 119
    with pytest.raises(ValueError, match="positive"):
        block_size.fitting_batch([], KV, BUDGET)


def test_measure_workloads_takes_a_batch_per_workload():
    pairs = {"short": [(60, 4)] * 30, "long": [(600, 40)] * 30}
    out = block_size.measure_workloads(pairs, [16], KV, BUDGET, batch={"short": 1_000, "long": 186}, replay_steps=120,
                               progress=False)
    # mean tail: 64 tokens fill 4 blocks exactly, 640 fill 40: both 0; the batch rides along unchanged
    assert out["short"][16].batch == 1_000 and out["long"][16].batch == 186
    with pytest.raises(ValueError, match="no batch for long"):
        block_size.measure_workloads(pairs, [16], KV, BUDGET, batch={"short": 5}, progress=False)
    panel = vm.block_size_panel(out, BUDGET, KV)
    assert "at B = 1,000" in panel.text() or "at B = 1000" in panel.text()


def test_measure_block_size_on_lengths_uniform_modulo_b():
    lengths = list(range(1, 16 * 50 + 1))  # every remainder mod 16 equally often
    m = block_size.measure_block_size("uniform", lengths, 16, KV, BUDGET, batch=199,
                              pairs=[(n - 1, 1) if n > 1 else (1, 1) for n in lengths])
    assert m.mean_tail_tokens == pytest.approx(7.5)  # tails 0..15, averaged
    assert m.max_tail_tokens == 15
    assert m.waste_at_batch_fraction == pytest.approx(199 * 7.5 * KV / BUDGET)
    assert (m.median_tokens, m.p95_tokens) == (400, 760)  # nearest rank of 1..800
    assert (m.entries_at_median, m.entries_at_p95) == (25, 48)


def test_replay_pool_leaves_out_sequences_over_the_window_and_stays_consistent():
    pairs = [(100, 20), (40_000, 10), (300, 50), (17, 3)] * 5
    seen = []

    def observe(alloc, step):
        alloc.check_invariants()
        seen.extend(alloc.seq_lens.values())

    block_size.replay_pool(pairs, 500, 16, steps=80, observe=observe, max_tokens=32_768)
    assert seen and max(seen) <= 350  # the 40,010-token request never ran
    with pytest.raises(ValueError, match="replay_steps"):
        block_size.measure_block_size("x", [10], 4, KV, BUDGET, replay_steps=10, warmup_steps=10)


def test_block_size_tradeoff_figure_lines_are_the_hand_formulas():
    sizes = [1, 16, 64, 256]
    fig = vm.block_size_tradeoff_figure(sizes, BUDGET, KV, batch=199, seq_tokens=4096, highlight=16)
    waste, entries, runs = fig.data[:3]
    assert list(waste.y) == pytest.approx([100 * 199 * (b - 1) / 2 * KV / BUDGET for b in sizes])
    assert list(entries.y) == [4096, 256, 64, 16]
    assert list(runs.y) == sizes
    assert len([s for s in fig.layout.shapes if s.line.dash == "dot"]) == 2


def test_block_size_panel_moves_with_its_slider():
    lengths = list(range(1, 16 * 20 + 1))
    measured = {"uniform": {b: block_size.measure_block_size("uniform", lengths, b, KV, BUDGET, replay_steps=120,
                                                      warmup_steps=100) for b in (8, 16)}}
    panel = vm.block_size_panel(measured, BUDGET, KV, block_size=16)
    assert "mean tail 7.5 tokens" in panel.text() and "measured on uniform" in panel.text()
    before = panel.figure.to_dict()
    panel.controls["block_size"].value = 64
    assert panel.figure.to_dict() != before
    assert "mean tail 31.5 tokens" in panel.text() and "measured on" not in panel.text()
    with pytest.raises(ValueError):
        vm.block_size_panel({}, BUDGET, KV)


def test_figures_are_plotly_figures():
    for fig in (vm.slot_figure(), vm.block_table_figure(BlockAllocator(2, 2))):
        assert isinstance(fig, go.Figure)
        assert math.isfinite(fig.layout.height)
