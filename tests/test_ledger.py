"""The ledger against hand derivations (the lecture's formulas done with a pencil, not the code).

Every expected value below is written as the arithmetic a student would do: bytes per token as
2 * L * n_kv * d * b, the budget as 80e9 - 13.48e9 - 4e9, and so on.
"""
import math

import pytest

from labsupport import ledger as L
from labsupport.cli import ledger as LC
from labsupport.specs import GPUS, LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, ModelSpec, get_gpu

H100 = GPUS["h100-sxm-80gb"]
H200 = GPUS["h200"]

KV_MHA = 2 * 32 * 32 * 128 * 2  # 524,288 = 512 KiB
KV_GQA8 = 2 * 32 * 8 * 128 * 2  # 131,072 = 128 KiB
BUDGET = 80e9 - 6.74e9 * 2 - 4e9  # 62.52 GB
SEQ = 512 + 128


def test_bytes_per_token_and_budget():
    assert KV_MHA == 512 * 1024
    assert L.kv_bytes_per_token(LECTURE_7B) == KV_MHA
    assert L.kv_bytes_per_token(LECTURE_7B_GQA8) == KV_GQA8
    assert L.kv_budget_bytes(LECTURE_7B, H100) == pytest.approx(62.52e9, rel=1e-12)
    assert LECTURE_7B.weight_bytes == pytest.approx(13.48e9)


def test_naive_allocator_lecture():
    assert L.naive_slot_bytes(4096, KV_MHA) == 2_147_483_648  # exactly 2 GiB
    # 62.52e9 / 2,147,483,648 = 29.11 -> 29 slots
    assert L.naive_concurrency(BUDGET, 4096, KV_MHA) == 29
    assert L.naive_utilization(BUDGET, 4096, SEQ, KV_MHA) == pytest.approx(29 * 640 * 524_288 / 62.52e9)
    assert L.naive_utilization(BUDGET, 4096, SEQ, KV_MHA) == pytest.approx(0.15564, abs=1e-5)
    # 32K: 62.52e9 / 17,179,869,184 = 3.64 -> 3 slots, 3 * 640 tokens held
    assert L.naive_concurrency(BUDGET, 32768, KV_MHA) == 3
    assert L.naive_utilization(BUDGET, 32768, SEQ, KV_MHA) == pytest.approx(3 * 640 * 524_288 / 62.52e9)
    assert L.slot_occupancy(4096, 640) == pytest.approx(0.15625)
    # a sequence longer than the slot is held only up to S_max
    assert L.naive_utilization(BUDGET, 512, 640, KV_MHA) == pytest.approx(232 * 512 * 524_288 / 62.52e9)


def test_paged_lecture():
    # blocks of 16 x 524,288 = 8,388,608 B; 62.52e9 / 8,388,608 = 7,452.96 -> 7,452 blocks
    assert L.num_blocks(BUDGET, 16, KV_MHA) == 7452
    assert L.blocks_for(640, 16) == 40
    assert L.blocks_for(641, 16) == 41
    assert L.blocks_for(0, 16) == 0
    assert L.paged_concurrency(BUDGET, 640, 16, KV_MHA) == 7452 // 40 == 186
    assert L.paged_utilization(BUDGET, 640, 16, KV_MHA) == pytest.approx(186 * 640 * 524_288 / 62.52e9)
    assert L.tail_waste_tokens(640, 16) == 0
    assert L.tail_waste_tokens(641, 16) == 15
    assert L.mean_tail_waste_tokens(16) == 7.5
    assert L.block_table_entries(4096, 16) == 256
    assert L.block_table_bytes(4096, 16) == 1024
    assert L.block_table_bytes(4096, 16, entry_bytes=8) == 2048  # the lecture's "2 KB"


def test_block_size_table():
    rows = L.block_size_table([1, 16, 64, 256], 199, BUDGET, KV_MHA)
    assert [r.table_entries for r in rows] == [4096, 256, 64, 16]
    assert [r.mean_tail_tokens for r in rows] == [0, 7.5, 31.5, 127.5]
    assert rows[1].waste_at_batch_bytes == pytest.approx(199 * 7.5 * 524_288)
    assert rows[2].waste_fraction_of_budget == pytest.approx(199 * 31.5 * 524_288 / 62.52e9)
    assert [r.contiguous_run_tokens for r in rows] == [1, 16, 64, 256]


def test_fanout():
    assert L.fanout_tokens(8, 4096, 256) == (34_816, 6_144)
    assert L.sharing_factor(8, 4096, 256) == pytest.approx(34_816 / 6_144)
    # n = 16 off 8K with 512-token outputs: 139,264 vs 16,384 tokens; 73.0 GB vs 8.6 GB
    u, s = L.fanout_tokens(16, 8192, 512)
    assert (u, s) == (16 * 8704, 8192 + 16 * 512)
    assert u * KV_MHA / 1e9 == pytest.approx(73.01, abs=0.01)
    assert s * KV_MHA / 1e9 == pytest.approx(8.59, abs=0.01)
    # blocks: a 4K prompt fills 256 blocks, each branch owns 16 output blocks
    assert L.fanout_blocks(8, 4096, 256, 16) == (8 * 272, 256 + 8 * 16)
    # a prompt ending mid-block: 100 tokens = 6 full blocks + 4 tokens; each branch copies the partial one
    # branch total ceil(110/16) = 7 blocks, 6 shared -> 1 private each
    assert L.fanout_blocks(3, 100, 10, 16) == (3 * 7, 6 + 3 * 1)


def test_swap_and_recompute_lecture():
    kv4k = 4096 * KV_MHA
    assert L.swap_round_trip_s(kv4k, 64e9) == pytest.approx(2 * 2_147_483_648 / 64e9)  # 67.1 ms
    flops = 2 * 6.74e9 * 4096 + 4 * 32 * 32 * 128 * 4096**2  # 55.2 + 8.8 TFLOP
    assert L.prefill_flops(LECTURE_7B, 4096) == pytest.approx(flops)
    assert flops == pytest.approx(64.01e12, rel=1e-3)
    assert L.recompute_s(LECTURE_7B, 4096, 989e12) == pytest.approx(flops / 494.5e12)  # 129.4 ms
    assert L.breakeven_link_bandwidth(LECTURE_7B, 4096, 989e12) == pytest.approx(2 * kv4k / (flops / 494.5e12))
    assert L.breakeven_link_bandwidth(LECTURE_7B, 4096, 989e12) / 1e9 == pytest.approx(33.18, abs=0.01)
    gqa_be = L.breakeven_link_bandwidth(LECTURE_7B_GQA8, 4096, 989e12)
    assert gqa_be / 1e9 == pytest.approx(8.30, abs=0.01)  # the lecture's 8.3 GB/s
    assert L.preempt_choice(LECTURE_7B, 4096, 64e9, 989e12) == "swap"
    assert L.preempt_choice(LECTURE_7B, 4096, 16e9, 989e12) == "recompute"


def test_crossover_exercise4():
    # 2 S 524,288 / 32e9 = (13.48e9 S + 524,288 S^2) / 494.5e12, solved for S by hand
    s = (2 * 524_288 * 494.5e12 / 32e9 - 13.48e9) / 524_288
    assert L.crossover_tokens(LECTURE_7B, 32e9, 989e12) == pytest.approx(s)
    assert round(s) == 5195
    # at that length the two costs agree; either side they do not
    sw = L.swap_round_trip_s(s * KV_MHA, 32e9)
    assert sw == pytest.approx(L.recompute_s(LECTURE_7B, s, 989e12), rel=1e-9)
    assert L.preempt_choice(LECTURE_7B, 4000, 32e9, 989e12) == "recompute"
    assert L.preempt_choice(LECTURE_7B, 6000, 32e9, 989e12) == "swap"
    # on 64 GB/s swap is cheaper at every length for this model
    assert L.crossover_tokens(LECTURE_7B, 64e9, 989e12) == 0.0


def test_decode_cadence_and_slo():
    step = 13.48e9 + 186 * 640 * 524_288
    assert L.decode_step_bytes(LECTURE_7B, 186, 640) == pytest.approx(step)
    assert L.tpot_s(LECTURE_7B, 186, 640, 3350e9) == pytest.approx(step / 3350e9)  # 22.65 ms
    assert L.throughput_tok_s(186, step / 3350e9) == pytest.approx(186 * 3350e9 / step)
    # (0.020 * 3350e9 - 13.48e9) / 335,544,320 = 159.5 -> 159
    assert L.max_batch_for_tpot(LECTURE_7B, 640, 0.020, 3350e9) == 159
    assert L.tpot_s(LECTURE_7B, 159, 640, 3350e9) <= 0.020 < L.tpot_s(LECTURE_7B, 160, 640, 3350e9)
    assert L.goodput_tok_s(199, L.tpot_s(LECTURE_7B, 199, 640, 3350e9), 0.020) == 0.0
    t29 = L.tpot_s(LECTURE_7B, 29, 640, 3350e9)
    assert L.goodput_tok_s(29, t29, 0.020) == pytest.approx(29 / t29)
    assert L.ttft_s(0.5, 0.129, 0.0226) == pytest.approx(0.6516)
    with pytest.raises(ValueError, match="queueing_s"):
        L.ttft_s(-1, 0.1, 0.0)
    # Lecture 2: 989 TFLOP/s over 3,350 GB/s, bf16 -> B = 295.2
    assert L.ridge_batch(LECTURE_7B, H100) == pytest.approx(989e12 / 3350e9)
    assert int(L.ridge_batch(LECTURE_7B, H100)) == 295


def test_compute_lecture_scenario():
    r = LC.compute(LC.Scenario(model=LECTURE_7B, gpu=H100))  # the lecture's card, whatever course.toml names
    assert r["naive_concurrency"] == 29 and r["paged_concurrency"] == 186
    assert r["kv_budget_bytes"] == pytest.approx(62.52e9)
    assert r["swap_round_trip_s"] == pytest.approx(0.067108864)
    assert r["fanout_factor"] == pytest.approx(17 / 3)
    assert r["max_batch_for_slo"] == 159


def test_other_configuration_llama3_8b_on_h200():
    kv = 2 * 32 * 8 * 128 * 2
    budget = 141e9 - 8.03e9 * 2 - 4e9  # 120.94 GB
    r = LC.compute(LC.Scenario(model=LLAMA3_8B, gpu=H200))
    assert r["kv_bytes_per_token"] == kv == 131_072
    assert r["kv_budget_bytes"] == pytest.approx(budget)
    assert r["naive_slot_bytes"] == 4096 * kv
    assert r["naive_concurrency"] == math.floor(budget / (4096 * kv)) == 225
    assert r["num_blocks"] == math.floor(budget / (16 * kv)) == 57_668
    assert r["paged_concurrency"] == 57_668 // 40 == 1441
    assert r["ridge_batch"] == pytest.approx(989e12 / 4800e9)
    assert r["max_batch_for_slo"] == math.floor((0.020 * 4800e9 - 16.06e9) / (640 * kv)) == 952
    assert r["tpot_s"] == pytest.approx((16.06e9 + 1441 * 640 * kv) / 4800e9)
    rec = 2 * 8.03e9 * 4096 + 4 * 32 * 32 * 128 * 4096**2
    assert r["recompute_s"] == pytest.approx(rec / (0.5 * 989e12))
    assert r["swap_round_trip_s"] == pytest.approx(2 * 4096 * kv / 64e9)


def test_exercises():
    # the lecture's exercises on the lecture's card (the defaults follow course.toml's): MHA 7B, its GQA-8, H100
    e1 = LC.exercise1(LECTURE_7B, LECTURE_7B_GQA8, H100)
    assert e1["mha_slot_bytes"] == 131_072 * 524_288 and e1["mha_naive_concurrency"] == 0
    assert e1["gqa_slot_bytes"] == 131_072 * 131_072 and e1["gqa_naive_concurrency"] == 3
    assert e1["gqa_naive_utilization"] == pytest.approx(3 * 640 * 131_072 / 62.52e9)
    # 62.52e9 / (16 * 131,072) = 29,811.9 -> 29,811 blocks // 40 = 745
    assert e1["gqa_paged_concurrency"] == 745
    e2 = LC.exercise2(LECTURE_7B, H100)
    mean = 0.7 * 512 * KV_MHA + 0.25 * 4096 * KV_MHA + 0.05 * 32768 * KV_MHA
    assert e2["mean_slot_bytes"] == pytest.approx(mean)
    assert int(e2["mean_concurrency"]) == 39
    mu, sigma = L.lognormal_params()
    assert math.exp(mu) == pytest.approx(800)
    assert sigma == pytest.approx(math.log(25) / 1.6448536, rel=1e-6)
    e3 = {r["block_size"]: r for r in LC.exercise3(model=LECTURE_7B, gpu=H100)}
    assert [e3[b]["entries_at_median"] for b in (8, 16, 64, 256)] == [100, 50, 13, 4]
    assert [e3[b]["entries_at_p95"] for b in (8, 16, 64, 256)] == [2500, 1250, 313, 79]
    # mean tail (b - 1) / 2 tokens of 524,288 B, at B = 199 sequences, over the 62.52 GB budget
    for b in (8, 16, 64, 256):
        assert e3[b]["mean_tail_tokens"] == (b - 1) / 2
        assert e3[b]["waste_at_batch_bytes"] == 199 * (b - 1) / 2 * 524_288
        assert e3[b]["waste_fraction_of_budget"] == pytest.approx(199 * (b - 1) / 2 * 524_288 / 62.52e9)
    assert e3[16]["waste_at_batch_bytes"] == 782_499_840  # 0.78 GB = 1.25% (the lecture's 0.80 GB, 1.3%)
    e4 = LC.exercise4(LECTURE_7B_GQA8, LECTURE_7B, H100)
    assert e4["kv_bytes"] == 16384 * 131_072 == 2_147_483_648
    rec = 2 * 6.74e9 * 16384 + 4 * 32 * 32 * 128 * 16384**2
    assert e4["recompute_flops"] == pytest.approx(rec) and rec == pytest.approx(361.6e12, rel=1e-3)
    assert e4["recompute_s"] == pytest.approx(rec / 494.5e12)  # 731 ms
    assert e4["swap_advantage"] == pytest.approx((rec / 494.5e12) / (2 * 2_147_483_648 / 64e9))
    assert e4["breakeven_link_bandwidth"] / 1e9 == pytest.approx(5.87, abs=0.01)
    assert e4["swap_s"] == pytest.approx(2 * 2_147_483_648 / 64e9)  # the same 67 ms as a 4K MHA sequence
    assert e4["mha_crossover_tokens"] == pytest.approx((2 * 524_288 * 494.5e12 / 32e9 - 13.48e9) / 524_288)
    assert e2["slot_bytes"] == [512 * KV_MHA, 4096 * KV_MHA, 32768 * KV_MHA]
    e5 = LC.exercise5(LECTURE_7B_GQA8, H100)
    assert e5["peak_kv_bytes"] == 7700 * 131_072
    assert e5["sessions_paged"] == 29_811 // math.ceil(7700 / 16) == 61
    assert e5["sessions_naive"] == 29
    assert e5["prefill_s"] == pytest.approx(97_000 * 2 * 6.74e9 / 494.5e12)


def test_the_defaults_are_the_course_cards():
    """With no model or GPU the scenario and the exercises take course.toml's card: checked by hand on its fields
    (the lecture's card gives 29 -> 186, 0 and 3 slots at 128K; H200 + Llama-3-8B gives 225 -> 1,441, 1 and 7)."""
    from labsupport import card

    c = card.card()
    kv = lambda m: 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes  # noqa: E731
    budget = lambda m: c.gpu.hbm_bytes - m.num_params * m.dtype_bytes - 4e9  # noqa: E731
    m = c.model
    r = LC.compute(LC.Scenario())
    assert r["kv_bytes_per_token"] == kv(m) and r["kv_budget_bytes"] == pytest.approx(budget(m))
    assert r["naive_concurrency"] == math.floor(budget(m) / (4096 * kv(m)))
    assert r["paged_concurrency"] == math.floor(budget(m) / (16 * kv(m))) // 40
    assert r["max_batch_for_slo"] == max(0, math.floor(  # the SLO's batch alone (§10.6's table caps it at the pool)
        (0.020 * c.gpu.hbm_bandwidth - m.num_params * m.dtype_bytes) / (640 * kv(m))))
    # Exercise 1: the card's model with more KV heads, then with fewer; one budget (their weights are the same)
    mha, gqa = (c.model, c.contrast) if c.model.num_kv_heads > c.contrast.num_kv_heads else (c.contrast, c.model)
    assert mha.num_params == gqa.num_params and mha.num_kv_heads > gqa.num_kv_heads
    e1 = LC.exercise1()
    for tag, mm in (("mha", mha), ("gqa", gqa)):
        assert e1[f"{tag}_slot_bytes"] == 131_072 * kv(mm)
        assert e1[f"{tag}_naive_concurrency"] == math.floor(budget(mha) / (131_072 * kv(mm)))
    assert e1["gqa_paged_concurrency"] == math.floor(budget(mha) / (16 * kv(gqa))) // 40
    e5 = LC.exercise5()
    assert e5["peak_kv_bytes"] == 7700 * kv(gqa)
    assert e5["sessions_paged"] == math.floor(budget(gqa) / (16 * kv(gqa))) // math.ceil(7700 / 16)


# printed value, its precision (decimals; -2 = hundreds) and the exact value, each derived by hand
ERRATA_BY_HAND = {
    "KV per 640-token sequence": (0.328, 3, 640 * 524_288 / 1e9),
    "Naive utilization, S_max = 4K": (15.2, 1, 100 * 29 * 640 * 524_288 / 62.52e9),
    "Paged concurrency, b = 16": (199, 0, 7452 // 40),
    "TPOT at B = 199": (23.5, 1, 1e3 * (13.48e9 + 199 * 640 * 524_288) / 3350e9),
    "Largest B meeting a 20 ms TPOT SLO": (164, 0, (0.020 * 3350e9 - 13.48e9) // (640 * 524_288)),
    "Crossover length, MHA on 32 GB/s": (2600, -2, (2 * 524_288 * 494.5e12 / 32e9 - 13.48e9) / 524_288),
    # the table's own reading: 199 x 64 MB over (62.5 GB + the waste)
    "Tail waste at B = 199, b = 256": (17.0, 1, 100 * 199 * 64e6 / (62.5e9 + 199 * 64e6)),
    # the exercise's own b/2 rule: 4 tokens at 0.5 MB each, 199 sequences, over 62.5 GB
    "Exercise 3 at b = 8": (0.3, 1, 100 * 199 * 4 * 0.5e6 / 62.5e9),
    "Unshared fan-out, n = 8 off 4K": (17.9, 1, 34_816 * 524_288 / 1e9),
    # the lognormal's mean, median x exp(sigma^2 / 2) with sigma = ln(25) / 1.6449, in 524,288-B tokens
    "Exercise 3's batch for the lognormal": (199, 0, 62.52e9 // (800 * math.exp((math.log(25) / 1.6448536269514722) ** 2 / 2)
                                                                * 524_288)),
    "Exercise 5 session KV and sessions per card": (0.985, 3, 7700 * 131_072 / 1e9),
    "Exercise 2 mean slot": (1.586, 3, (0.7 * 512 + 0.25 * 4096 + 0.05 * 32_768) * 524_288 / 1e9),
    "Naive column's throughput": (0.33, 2, (29 / ((13.48e9 + 29 * 640 * 524_288) / 3350e9)) / 8470),
}
STATEMENTS = {"The paper's section on sharing": "§4.4", "The paper's section on preemption": "§4.5",
              "Cross-request sharing in the paper": "Shared prefix"}

# printed value, precision, and the convention's value derived by hand
CONVENTIONS_BY_HAND = {
    # 29 slots, each at a uniformly random point of its life: it holds 512 ... 639 tokens (mean 575.5)
    "Naive utilization over a sequence's life": (14, 0, 100 * 29 * 575.5 * 524_288 / 62.52e9),
    # 7,452 whole blocks of the budget, each sequence filling sum(n) of its sum(ceil(n/16) x 16) slots
    # the lecture's own derivation: 100% minus 199 sequences' mean 8-token tail of 512 KiB tokens
    "Paged utilization, b = 16": (98.7, 1, 100 - 100 * 199 * 8 * 524_288 / 62.52e9),
    # one slot's occupancy, written 1.9% (cut to one decimal; rounded it would be 2.0%)
    "Naive utilization, S_max = 32K": (1.9, 1, 100 * 640 / 32_768),
    # 745 sequences (29,811 blocks of 2 MiB // 40) over 3 naive 128K slots: 248.33, the printed 248x
    "Exercise 1 paged GQA-8 concurrency": (248, 0, (62.52e9 // (16 * 131_072)) // 40 / 3),
    "Swap/recompute break-even, 4K MHA": (33.3, 1, 2 * 4096 * 524_288 / 0.129 / 1e9),
    "Tail waste at B = 199, b = 64 (Exercise 3)": (5.1, 1, 100 * 199 * 32 * 0.5e6 / 62.5e9),
    "Tail waste at B = 199, b = 256 (Exercise 3)": (20.4, 1, 100 * 199 * 128 * 0.5e6 / 62.5e9),
    "Mean tail waste, b = 16": (8, 0, 16 / 2),
    "Block-table overhead, 4K at b = 16": (2, 0, 256 * 8 / 1024),
    "Fork cost at b = 256, fan-out of 8": (512, 0, 8 * 128 * 524_288 / 2**20),
}


def _shows_as(value: float, printed: float, decimals: int) -> bool:
    return round(value, decimals) == round(printed, decimals)


def test_errata_rows_are_real():
    by_name = {e.quantity: e for e in L.ERRATA}
    assert set(by_name) == set(ERRATA_BY_HAND) | set(STATEMENTS)
    for name, (printed, decimals, exact) in ERRATA_BY_HAND.items():
        e = by_name[name]
        assert e.printed_value == pytest.approx(printed) and e.decimals == decimals, name
        assert e.exact_value == pytest.approx(exact, rel=1e-9), name
        assert not _shows_as(exact, printed, decimals), name  # a real erratum: exact does not print as printed
        assert len(e.tried) >= 2 and e.why and e.section, name
        # no convention tried reproduces the printed figure; only a misread unit or formula may
        for reading in e.tried:
            assert reading.slip or not _shows_as(reading.value, printed, decimals), (name, reading)
        assert all(r.slip for r in e.reproduced_by()), name
    for name, needle in STATEMENTS.items():
        assert needle in by_name[name].exact + by_name[name].why, name


def test_errata_readings_by_hand():
    """A few readings the errata list, recomputed here: each must be what the row says was tried."""
    by_name = {e.quantity: {r.how: r.value for r in e.tried} for e in L.ERRATA}
    assert by_name["KV per 640-token sequence"]["512 KiB read as 512,000 B"] == pytest.approx(0.32768)
    assert by_name["Naive utilization, S_max = 4K"]["over the life, share of the budget"] == pytest.approx(
        100 * 29 * 575.5 * 524_288 / 62.52e9)
    assert by_name["Paged concurrency, b = 16"]["the 62.5 GB budget read as 62.5 GiB"] == 200  # §10.2's "200"
    assert by_name["Paged concurrency, b = 16"]["512 KiB read as 512,000 B"] == (62.52e9 // (16 * 512_000)) // 40 == 190
    assert by_name["Largest B meeting a 20 ms TPOT SLO"]["0.328 GB per sequence and 13.5 GB of weights"] == 163
    # 2 S kv / W = (2 N S + 8 L H d S^2) / F: the doubled attention term gives the printed 2,600
    doubled = (2 * 524_288 * 494.5e12 / 32e9 - 13.48e9) / (2 * 524_288)
    assert by_name["Crossover length, MHA on 32 GB/s"]["the attention term doubled, 8 L H d S^2"] == pytest.approx(doubled)
    assert round(doubled, -2) == 2600


CUT = {"Naive utilization, S_max = 32K"}  # printed cut to one decimal, not rounded


def test_conventions_reproduce_their_printed_figures():
    by_name = {c.quantity: c for c in L.CONVENTIONS}
    assert set(by_name) == set(CONVENTIONS_BY_HAND)
    for name, (printed, decimals, value) in CONVENTIONS_BY_HAND.items():
        c = by_name[name]
        assert c.value == pytest.approx(value, rel=1e-9), name
        if name in CUT:
            assert math.floor(value * 10**decimals) == round(printed * 10**decimals) and c.cut, name
            assert not _shows_as(value, printed, decimals), name  # rounded, it would not be the printed digit
        else:
            assert _shows_as(value, printed, decimals) and not c.cut, name
        assert c.shows(value) and all(c.shows(r.value) for r in c.also), name
        assert c.printed_value == printed and c.convention and c.default and c.why, name
    # a convention is never also called an erratum
    assert not set(by_name) & {e.quantity for e in L.ERRATA}


def test_utilization_over_the_life_by_brute_force():
    life = range(512, 640)  # after the prefill the KV holds 512 tokens, then one more each decode step
    kv, budget = 524_288, 62.52e9
    naive = 29 * sum(life) / len(life) * kv / budget
    paged = (7452 * 16 * kv / budget) * sum(life) / sum(-(-n // 16) * 16 for n in life)
    assert L.naive_utilization_time_avg(budget, 4096, 512, 128, kv) == pytest.approx(naive, rel=1e-12)
    assert L.paged_utilization_time_avg(budget, 512, 128, 16, kv) == pytest.approx(paged, rel=1e-12)
    assert round(100 * naive) == 14 and round(100 * paged, 1) == 98.7  # the lecture's 14% and 98.7%
    # a sequence longer than its slot is truncated to the slot; odd lengths and block sizes agree too
    for prompt, output, s_max, b in ((100, 50, 128, 7), (3000, 2000, 4096, 64), (1, 1, 1, 1), (17, 300, 64, 16)):
        life = range(prompt, prompt + output)
        slots = int(budget // (s_max * kv))
        assert L.naive_utilization_time_avg(budget, s_max, prompt, output, kv) == pytest.approx(
            slots * sum(min(n, s_max) for n in life) / len(life) * kv / budget, rel=1e-12)
        blocks = int(budget // (b * kv))
        assert L.paged_utilization_time_avg(budget, prompt, output, b, kv) == pytest.approx(
            (blocks * b * kv / budget) * sum(life) / sum(-(-n // b) * b for n in life), rel=1e-12)


def test_ledger_json_reports_both_conventions():
    r = LC.compute(LC.Scenario(model=LECTURE_7B, gpu=H100))  # the lecture's 29, 186 and 98.7%
    assert r["naive_utilization"] == pytest.approx(29 * 640 * 524_288 / 62.52e9)
    assert r["naive_utilization_time_avg"] == pytest.approx(29 * 575.5 * 524_288 / 62.52e9)
    assert r["paged_utilization"] == pytest.approx(186 * 640 * 524_288 / 62.52e9)
    assert round(100 * r["paged_utilization_time_avg"], 1) == 98.7


@pytest.mark.parametrize("call", [
    lambda: L.naive_slot_bytes(0, KV_MHA),
    lambda: L.naive_slot_bytes(4096, -1),
    lambda: L.blocks_for(-1, 16),
    lambda: L.blocks_for(10, 0),
    lambda: L.recompute_s(LECTURE_7B, 4096, 989e12, mfu=0),
    lambda: L.recompute_s(LECTURE_7B, 4096, 989e12, mfu=1.5),
    lambda: L.swap_round_trip_s(1e9, 0),
    lambda: L.fanout_tokens(0, 4096, 256),
    lambda: L.max_batch_for_tpot(LECTURE_7B, 640, -0.02, 3350e9),
    lambda: LC.exercise2(mix=((512, 0.5), (4096, 0.4))),
    lambda: L.naive_utilization(float("nan"), 4096, 640, KV_MHA),
])
def test_bad_input_is_a_clear_value_error(call):
    with pytest.raises(ValueError, match="must|sum"):
        call()


def test_specs_validate_and_lookup():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelSpec("bad", 32, 32, 5, 128, 1e9)
    with pytest.raises(ValueError, match="num_layers"):
        ModelSpec("bad", 0, 32, 32, 128, 1e9)
    with pytest.raises(ValueError, match="unknown GPU 'nope'"):
        get_gpu("nope")
    assert get_gpu("H100") is H100


def test_decode_intensity_with_kv_reads_by_hand():
    """Lab 01: counting each sequence's KV, decode intensity saturates below the H100's ridge."""
    n, attn = 6.74e9, 4 * 32 * 32 * 128  # 4 L H d = 524,288 FLOP per cached key per query token
    for b, s in ((1, 0), (186, 640), (1000, 87), (29, 4096)):
        want = b * (2 * n + attn * s) / (2 * n + b * s * 524_288)
        assert L.decode_intensity(LECTURE_7B, b, s) == pytest.approx(want)
    assert L.decode_intensity(LECTURE_7B, 295.22, 0) == pytest.approx(989e12 / 3350e9, rel=1e-3)  # Lecture 2's ridge
    assert L.decode_intensity_limit(LECTURE_7B, 640) == pytest.approx((2 * n + attn * 640) / (640 * 524_288))
    assert round(L.decode_intensity_limit(LECTURE_7B, 640), 1) == 41.2
    assert round(L.decode_intensity_limit(LECTURE_7B_GQA8, 640), 1) == 164.7
    # the longest MHA sequence whose intensity can still reach 989e12 / 3350e9 FLOP/byte
    s_star = 2 * n / (524_288 * 989e12 / 3350e9 - attn)
    assert L.ridge_reachable_tokens(LECTURE_7B, H100) == pytest.approx(s_star) and round(s_star) == 87
    assert L.ridge_batch_with_kv(LECTURE_7B, H100, 640) == math.inf  # no batch reaches the ridge
    b64 = (989e12 / 3350e9) * 2 * n / (2 * n + attn * 64 - (989e12 / 3350e9) * 64 * 524_288)
    assert L.ridge_batch_with_kv(LECTURE_7B, H100, 64) == pytest.approx(b64)
    assert L.decode_intensity(LECTURE_7B, b64, 64) == pytest.approx(989e12 / 3350e9)


def test_swap_with_a_per_transfer_overhead_by_hand():
    """The vLLM paper's §7.3: every block of every layer's K and V is its own copy."""
    kv = 4096 * 524_288
    assert L.swap_round_trip_s(kv, 64e9) == pytest.approx(2 * kv / 64e9)
    assert L.swap_transfers(LECTURE_7B, 4096, 16) == 2 * 32 * 256
    assert L.swap_round_trip_s(kv, 64e9, 16_384, 10e-6) == pytest.approx(2 * (kv / 64e9 + 16_384 * 10e-6))
    # per token both ways: 2 kv / W + 4 L t0 / b; the crossover solves it against the prefill
    t0, b, rate = 5e-6, 16, 494.5e12
    per_token = 2 * 524_288 / 64e9 + 4 * 32 * t0 / b
    want = (per_token * rate - 2 * 6.74e9) / (4 * 32 * 32 * 128)
    assert L.crossover_tokens(LECTURE_7B, 64e9, 989e12, block_size=b, transfer_overhead_s=t0) == pytest.approx(want)
    assert L.crossover_tokens(LECTURE_7B, 64e9, 989e12) == 0.0  # without it, swap wins at every length
    assert L.preempt_choice(LECTURE_7B, 4096, 64e9, 989e12) == "swap"
    assert L.preempt_choice(LECTURE_7B, 4096, 64e9, 989e12, block_size=16, transfer_overhead_s=t0) == "recompute"
    assert L.preempt_choice(LECTURE_7B, 4096, 64e9, 989e12, block_size=256, transfer_overhead_s=t0) == "swap"
    with pytest.raises(ValueError, match="block size"):
        L.crossover_tokens(LECTURE_7B, 64e9, 989e12, transfer_overhead_s=t0)


def test_group_eviction_by_hand():
    """§4.5: a fan-out group evicted together moves and recomputes its shared prompt once."""
    kv = 524_288
    # 8 branches off 4,096 tokens, 256 generated each, 16-token blocks: 256 shared + 8 x 16 private blocks
    assert L.group_swap_bytes(8, 4096, 256, 16, kv) == (256 + 8 * 16) * 16 * kv
    assert L.group_swap_bytes(8, 4096, 256, 16, kv, together=False) == 8 * 272 * 16 * kv
    flops = lambda s: 2 * 6.74e9 * s + 4 * 32 * 32 * 128 * s * s
    assert L.group_recompute_flops(LECTURE_7B, 8, 4096, 256) == pytest.approx(flops(4096) + 8 * (flops(4352) - flops(4096)))
    assert L.group_recompute_flops(LECTURE_7B, 8, 4096, 256, together=False) == pytest.approx(8 * flops(4352))
    assert L.group_recompute_flops(LECTURE_7B, 1, 4096, 256) == pytest.approx(flops(4352))  # a group of one
    w = 2 * (256 + 128) * 16 * kv * 494.5e12 / (flops(4096) + 8 * (flops(4352) - flops(4096)))
    assert L.group_breakeven_link_bandwidth(LECTURE_7B, 8, 4096, 256, 16, 989e12) == pytest.approx(w)
