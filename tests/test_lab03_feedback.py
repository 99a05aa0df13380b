"""Lab 03's rewritten exercises: two different correct derivations pass, the plausible wrong ones are named.

Hand numbers (the lecture's givens): KV = 2 x 32 x 32 x 128 x 2 = 524,288 B per token; budget =
80e9 - 2 x 6.74e9 - 4e9 = 62.52e9 B; 62.52e9 // (16 x 524,288) = 7,452 blocks of 8 MiB; a 640-token
sequence holds 40 of them, so 7,452 // 40 = 186 sequences.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from labsupport.block_allocator import BlockAllocator
from labsupport.course import checkoff as C
from labsupport.course.checkoff import check, results
from labsupport.course.checkoffs import load_lab
from labsupport.course.registry import GIVENS, namespace

KV, BUDGET, BLOCKS = 524_288, 62_520_000_000, 7_452


@pytest.fixture(autouse=True)
def _fresh(fresh_results):
    load_lab(3)  # the graders: GIVENS[3] and the hidden generator


def _passes(cid, answer):
    check(cid, answer)
    assert results()[cid]["status"] == "passed", results()[cid]


def _fails(cid, answer, *words):
    check(cid, answer)
    outcome = results()[cid]
    assert outcome["status"] == "failed"
    problem = outcome["detail"].split("\nHint: ")[0]
    for word in words:
        assert word in problem, problem


def test_3_5_whole_blocks_then_whole_sequences():
    _passes("3.5", BLOCKS // 40)
    pool = BlockAllocator(BLOCKS, 16)  # the other derivation: admit 640-token sequences until one is refused
    while pool.can_allocate(pool.blocks_needed(640)):
        pool.allocate(len(pool.block_tables), 640)
    _passes("3.5", len(pool.block_tables))
    _fails("3.5", 199, "printed figure")
    _fails("3.5", BUDGET / (640 * KV), "fraction of a sequence")
    _fails("3.5", 62_520_000_000 // ((640 + 8) * 524_288), "640 fills 40 blocks exactly")  # 184: a b/2 tail each


def test_3_6_over_the_life_two_ways_and_the_lecture_shortcuts_named():
    # 1. stepped on a real allocator: read each step's fill, then the pool's whole-block share
    life = BlockAllocator(40, 16)
    life.allocate("s", 512)
    fills = []
    for _ in range(128):
        st = life.stats()
        fills.append(st.occupied_tokens / st.reserved_tokens)
        life.append_slot("s")
    _passes("3.6", sum(fills) / 128 * BLOCKS * 16 * KV / BUDGET)
    # 2. closed form, the blocks' own fill only (the pool covers 99.99% of the budget: within tolerance)
    _passes("3.6", sum(n / (math.ceil(n / 16) * 16) for n in range(512, 640)) / 128)
    _fails("3.6", 640 / 648, "rule of thumb", "b/2 = 8-token")  # 98.77%: the final length plus a b/2 tail
    _fails("3.6", 1 - 199 * 8 * KV / BUDGET, "1.3%")  # 98.67%: 100% less the lecture's internal fragmentation
    _fails("3.6", 186 * 640 * KV / BUDGET, "end of life")  # 99.83%


def test_3_7_and_3_8_from_what_an_entry_names():
    _passes("3.7", 256 * 4)  # ceil(4,096 / 16) entries of int32
    _passes("3.7", len(BlockAllocator(256, 16).allocate("s", 4096)) * 4)  # the real allocator's table
    _fails("3.7", 256, "number of entries")
    _fails("3.7", 2048, "lecture's 2 KB")
    _passes("3.8", 2048 // 256)
    _passes("3.8", int(2048 / math.ceil(4096 / 16)))
    _fails("3.8", 64, "bits")


def test_3_9_sigma_two_ways_and_the_two_sided_z_named():
    _passes("3.9", math.log(20_000 / 800) / NormalDist().inv_cdf(0.95))
    lo, hi = 0.1, 5.0  # bisect P(L > 20,000) = 5% on the normal of ln L
    for _ in range(60):
        mid = (lo + hi) / 2
        tail = 1 - NormalDist(math.log(800), mid).cdf(math.log(20_000))
        lo, hi = (mid, hi) if tail < 0.05 else (lo, mid)
    _passes("3.9", lo)
    _fails("3.9", math.log(25) / 1.959963984540054, "two-sided")


def _row_closed(b, batch):
    tail = (b - 1) / 2 * KV
    return tail, batch * tail / BUDGET, math.ceil(800 / b), math.ceil(20_000 / b)


def _row_measured(b, batch):
    probe = BlockAllocator(20_800 // b + 4, b)
    tails = []
    for n in range(1, b + 1):  # one length per remainder modulo b
        tails.append(len(probe.allocate("s", n)) * b - n)
        probe.free("s")
    tail = sum(tails) / b * KV
    return tail, batch * tail / BUDGET, len(probe.allocate("m", 800)), len(probe.allocate("t", 20_000))


def test_3_10_two_derivations_pass_and_the_sketch_shortcuts_are_named():
    _passes("3.10", _row_closed)
    _passes("3.10", _row_measured)
    _fails("3.10", lambda b, batch: (b / 2 * KV, batch * b / 2 * KV / BUDGET, math.ceil(800 / b),
                                     math.ceil(20_000 / b)), "b/2")
    _fails("3.10", lambda b, batch: _row_closed(b, 199), "199 sequences")


def test_the_lognormal_batch_that_fits_by_hand():
    """Exercise 3's batch: sigma = ln 25 / 1.6449 = 1.9569; mean = 800 e^(sigma^2 / 2) = 800 x 6.786 = 5,428
    tokens; 62.52e9 / (5,428 x 524,288) = 21.97, so 21 whole sequences fit, not 199."""
    sigma = math.log(25) / 1.6448536269514722
    mean = 800 * math.exp(sigma ** 2 / 2)
    assert 5_420 < mean < 5_435
    assert int(BUDGET // (mean * KV)) == 21


def test_every_givens_set_keeps_the_exercises_physical():
    for g in GIVENS[3].draw(__import__("random").Random(7), n=6):
        ns = namespace(g)
        budget = ns.HBM_BYTES - ns.WEIGHT_BYTES * ns.PARAMS - ns.RESERVE_BYTES
        kv = 2 * ns.LAYERS * ns.KV_HEADS * ns.HEAD_DIM * ns.DTYPE_BYTES
        assert (budget // (ns.BLOCK * kv)) // math.ceil((ns.PROMPT + ns.OUTPUT) / ns.BLOCK) >= 4
        assert ns.PRINTED_TABLE_BYTES % math.ceil(ns.TABLE_TOKENS / ns.BLOCK) == 0  # some whole entry width
        assert ns.TAIL_TOKENS > ns.MEDIAN_TOKENS and 0 < ns.TAIL_SHARE < 0.5
