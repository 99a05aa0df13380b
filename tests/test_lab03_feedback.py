"""Lab 03's rewritten exercises: two different correct derivations pass, the plausible wrong ones are named.

Hand numbers, on the course card's model in its MHA form and its GPU (the lab's givens), written out below:
KV = 2 x layers x KV heads x head_dim x bytes per token; budget = HBM - weights - 4e9; whole blocks of 16 tokens
in the budget; a 640-token sequence holds 40 of them.  On the lecture's card: 2 x 32 x 32 x 128 x 2 = 524,288 B;
80e9 - 2 x 6.74e9 - 4e9 = 62.52e9 B; 62.52e9 // (16 x 524,288) = 7,452 blocks of 8 MiB; 7,452 // 40 = 186.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from labsupport import card
from labsupport.block_allocator import BlockAllocator
from labsupport.course import checkoff as C
from labsupport.course.checkoff import check, results
from labsupport.course.checkoffs import get, load_lab
from labsupport.course.registry import GIVENS, case_rng, namespace

RESERVE = 4 * 10**9  # §10.2's reserve for activations and workspace


def _hand(model, gpu):
    """(KV bytes per token, KV budget, whole 16-token blocks, 640-token sequences) by hand from the specs' fields."""
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    budget = gpu.hbm_bytes - round(model.num_params) * model.dtype_bytes - RESERVE
    blocks = budget // (16 * kv)
    return kv, budget, blocks, blocks // math.ceil(640 / 16)


KV, BUDGET, BLOCKS, SEQS = _hand(card.card().mha, card.card().gpu)  # the lab's givens: the card's MHA form
LECTURE_KV, LECTURE_BUDGET = 524_288, 62_520_000_000  # the lecture's worked numbers (Exercise 3 below)


def test_the_hand_numbers_are_the_lectures_on_its_card():
    """The hand derivation above, on the lecture's specs passed explicitly, gives §10.3's worked numbers."""
    from labsupport.specs import LECTURE_7B, LECTURE_GPU

    assert _hand(LECTURE_7B, LECTURE_GPU) == (LECTURE_KV, LECTURE_BUDGET, 7_452, 186)


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


def _fit_blocks(budget, kv, b, seq):
    return (budget // (b * kv)) // math.ceil(seq / b)  # whole blocks in the pool, whole blocks a sequence


def _fit_bytes(budget, kv, b, seq):
    return budget // (math.ceil(seq / b) * b * kv)  # the bytes of one sequence's whole blocks, whole sequences


def test_3_5_whole_blocks_then_whole_sequences():
    first = get("3.5").cases(case_rng("3.5"))[0]  # the card's pool: BUDGET // 8 MiB blocks; 640 tokens hold 40
    assert first.args == (BUDGET, KV, 16, 640) and first.want == SEQS  # the lecture's: 7,452 // 40 = 186
    pool = BlockAllocator(BLOCKS, 16)  # the real allocator agrees: admit 640-token sequences until one is refused
    while pool.can_allocate(pool.blocks_needed(640)):
        pool.allocate(len(pool.block_tables), 640)
    assert len(pool.block_tables) == SEQS
    _passes("3.5", _fit_blocks)
    _passes("3.5", _fit_bytes)
    # the tokens alone: BUDGET // (640 x KV) = SEQS too (640 fills 40 blocks exactly), so a later case names it
    _fails("3.5", lambda budget, kv, b, seq: budget // (seq * kv), "the sequence's tokens")
    _fails("3.5", lambda budget, kv, b, seq: budget / (b * kv) / math.ceil(seq / b), "whole things")
    _fails("3.5", lambda budget, kv, b, seq: budget // ((seq + b / 2) * kv), "b/2 tail")  # 184 on the lecture's card
    # S // b + 1 blocks a sequence: 7,452 // 41 = 181 on the lecture's card
    _fails("3.5", lambda budget, kv, b, seq: (budget // (b * kv)) // (seq // b + 1), "S // b + 1")
    _fails("3.5", lambda budget, kv, b, seq: 199, "printed figure")


def test_3_5_the_sloppy_count_passes_the_lecture_and_only_other_cases_catch_it():
    """640 tokens fill 40 blocks exactly, so BUDGET // (640 x KV) is right on the card's case; the cases with a
    sequence a token past whole blocks catch it, the public ones and every secret draw."""
    from labsupport.course.judge import Mismatch

    sloppy = lambda budget, kv, b, seq: budget // (seq * kv)  # noqa: E731
    checkoff = get("3.5")
    first = checkoff.cases(case_rng("3.5"))[0]
    assert sloppy(*first.args) == first.want
    for secret in (b"a", b"b", b"c"):
        with pytest.raises(Mismatch):
            checkoff.grade(sloppy, case_rng("3.5", secret))
        checkoff.grade(_fit_bytes, case_rng("3.5", secret))


# the busy pool by hand: 128 sequences of 512 ... 639 tokens hold 128 x 575.5 = 73,664 tokens; their blocks reserve
# 512 (n = 512: 32 blocks) + 16 x 16 x (33 + ... + 39) + 15 x 16 x 40 = 512 + 64,512 + 9,600 = 74,624 slots;
# the pool's whole blocks of 16 x KV cover BLOCKS x 16 x KV of the budget (the lecture's card: 7,452 blocks of 8 MiB,
# 62,511,644,672 / 62.52e9 = 99.987%)
BUSY = BLOCKS * 16 * KV / BUDGET * 73_664 / 74_624  # 0.987008 on the lecture's card
LECTURE_BUSY = 7_452 * 16 * LECTURE_KV / LECTURE_BUDGET * 73_664 / 74_624


def test_3_6_the_busy_pool_two_ways_and_the_other_readings_named():
    assert abs(get("3.6").expect() - BUSY) < 1e-12 and 0.9 < BUSY < 1
    lecture = dict(GIVENS[3].lecture, LAYERS=32, KV_HEADS=32, HEAD_DIM=128, DTYPE_BYTES=2, HBM_BYTES=80 * 10**9,
                   PARAMS=6_740_000_000, WEIGHT_BYTES=2)  # the lecture's card's givens, named explicitly
    assert abs(get("3.6").expect(namespace(lecture)) - LECTURE_BUSY) < 1e-12 and f"{LECTURE_BUSY:.4%}" == "98.7008%"
    # 1. one sequence at each step of the life, on a real allocator, read at once
    ages = BlockAllocator(128 * 40, 16)
    for k in range(128):
        ages.allocate(k, 512 + k)
    st = ages.stats()
    _passes("3.6", st.occupied_tokens / st.reserved_tokens * BLOCKS * 16 * KV / BUDGET)
    # 2. one sequence stepped through its life, its tokens and slots summed over the steps
    life, tokens, slots = BlockAllocator(40, 16), 0, 0
    life.allocate("s", 512)
    for _ in range(128):
        st = life.stats()
        tokens, slots = tokens + st.occupied_tokens, slots + st.reserved_tokens
        life.append_slot("s")
    _passes("3.6", tokens / slots * (BLOCKS * 16 * KV / BUDGET))
    fills = [n / (math.ceil(n / 16) * 16) for n in range(512, 640)]
    _fails("3.6", sum(fills) / 128 * BLOCKS * 16 * KV / BUDGET, "one step's", "every step at once")  # 0.986979
    _fails("3.6", 73_664 / 74_624, "pool's whole blocks")  # 0.987136: the blocks' own fill
    _fails("3.6", SEQS * 575.5 * KV / BUDGET, "lab 02's 2.4")  # 0.8977 (lecture): 3.5's count filled once, decoded
    _fails("3.6", SEQS * 640 * KV / BUDGET, "end of life")  # 0.9983 on the lecture's card
    _fails("3.6", BLOCKS * 16 * KV / BUDGET * (73_664 + 128) / (74_624 + 128), "after its token lands")  # 513 ... 640
    _fails("3.6", 640 / 648, "rule of thumb", "b/2 tail")  # 98.77%: the final length plus a b/2 tail
    _fails("3.6", 1 - 199 * 8 * KV / BUDGET, "1.3%")  # 98.67% (lecture): 100% less its internal fragmentation


def _table_closed(seq_lens, b, width):
    return len(seq_lens) * max(math.ceil(n / b) for n in seq_lens) * width  # rows x the widest table x bytes


def _table_measured(seq_lens, b, width):
    alloc = BlockAllocator(sum(math.ceil(n / b) for n in seq_lens), b)
    tables = [alloc.allocate(i, n) for i, n in enumerate(seq_lens)]  # the real allocator's tables, padded by hand
    return sum(max(map(len, tables)) * width for _ in tables)


def test_3_7_the_padded_tensor_two_ways_and_the_slips_named():
    cases = get("3.7").cases(case_rng("3.7"))
    assert cases[0].want == 256 * 4  # ceil(4,096 / 16) = 256 int32 entries, one row
    assert cases[1].want == 2 * 3 * 4  # the board: A's 9 tokens take 3 blocks of 4, B's 5 take 2, padded to 3
    _passes("3.7", _table_closed)
    _passes("3.7", _table_measured)
    _fails("3.7", lambda seq_lens, b, width: sum(math.ceil(n / b) for n in seq_lens) * width, "own length")  # 20 B
    _fails("3.7", lambda seq_lens, b, width: len(seq_lens) * max(math.ceil(n / b) for n in seq_lens), "entries")
    _fails("3.7", lambda seq_lens, b, width: len(seq_lens) * max(n // b for n in seq_lens) * width, "rounded up")
    _fails("3.7", lambda seq_lens, b, width: len(seq_lens) * max(seq_lens) * width, "not per token")


def test_3_8_the_lectures_entry_width():
    assert get("3.8").expect() == 8  # 2,048 B over ceil(4,096 / 16) = 256 entries
    _passes("3.8", 2048 // 256)
    _passes("3.8", int(2048 / math.ceil(4096 / 16)))
    _fails("3.8", 64, "bits")
    _fails("3.8", 2048 / 4096, "every token")


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
    """Exercise 3's batch, on the lecture's card: sigma = ln 25 / 1.6449 = 1.9569; mean = 800 e^(sigma^2 / 2) =
    800 x 6.786 = 5,428 tokens; 62.52e9 / (5,428 x 524,288) = 21.97, so 21 whole sequences fit, not 199."""
    sigma = math.log(25) / 1.6448536269514722
    mean = 800 * math.exp(sigma ** 2 / 2)
    assert 5_420 < mean < 5_435
    assert int(LECTURE_BUDGET // (mean * LECTURE_KV)) == 21


def test_every_givens_set_keeps_the_exercises_physical():
    for g in GIVENS[3].draw(__import__("random").Random(7), n=6):
        ns = namespace(g)
        budget = ns.HBM_BYTES - ns.WEIGHT_BYTES * ns.PARAMS - ns.RESERVE_BYTES
        kv = 2 * ns.LAYERS * ns.KV_HEADS * ns.HEAD_DIM * ns.DTYPE_BYTES
        assert (budget // (ns.BLOCK * kv)) // math.ceil((ns.PROMPT + ns.OUTPUT) / ns.BLOCK) >= 4
        assert ns.PRINTED_TABLE_BYTES % math.ceil(ns.TABLE_TOKENS / ns.BLOCK) == 0  # some whole entry width
        assert ns.TAIL_TOKENS > ns.MEDIAN_TOKENS and 0 < ns.TAIL_SHARE < 0.5


def test_3_11_the_columns_the_workload_moves():
    """Section 6's table: at b = 16 the mean tail is 7.51-7.60 tokens on all four workloads (a property of b),
    while the waste at each batch (0.06%-0.56%), the entries (47-2,362) and the mean run (28-144 tokens) move."""
    _passes("3.11", {"waste at the batch", "table entries", "contiguous run"})
    _passes("3.11", ["Table Entries ", "contiguous run", "waste at the batch"])
    _fails("3.11", {"mean tail", "waste at the batch", "table entries", "contiguous run"}, "does it move")
    _fails("3.11", {"waste at the batch", "table entries"}, "1 is missing")


# --- item 4: every step a prompt names changes the answer on every hidden set ---------------------------

def _g(g):
    from types import SimpleNamespace
    n = SimpleNamespace(**g)
    n.kv = 2 * n.LAYERS * n.KV_HEADS * n.HEAD_DIM * n.DTYPE_BYTES
    n.budget = n.HBM_BYTES - n.WEIGHT_BYTES * n.PARAMS - n.RESERVE_BYTES
    n.seq = n.PROMPT + n.OUTPUT
    n.blocks = n.budget // (n.BLOCK * n.kv)
    n.share = n.blocks * n.BLOCK * n.kv / n.budget
    n.paged = n.blocks // math.ceil(n.seq / n.BLOCK)
    return n


def _busy(g, first):
    """The busy pool's share of the budget holding tokens, its sequences holding first ... first + OUTPUT - 1 tokens."""
    lengths = range(first, first + g.OUTPUT)
    return g.share * sum(lengths) / sum(math.ceil(n / g.BLOCK) * g.BLOCK for n in lengths)


def _mean_fill(g):
    return sum(n / (math.ceil(n / g.BLOCK) * g.BLOCK) for n in range(g.PROMPT, g.PROMPT + g.OUTPUT)) / g.OUTPUT


# (checkoff, the step its prompt names, the answer without it), by hand from the prompt's words
DROPPED = [
    ("3.4", "lengths spread evenly modulo b (remainder 0 leaves no tail)", lambda g: g.BLOCK / 2),
    ("3.4", "the mean, not the worst case", lambda g: g.BLOCK - 1),
    ("3.6", "the pool's whole blocks' share of the budget", lambda g: _busy(g, g.PROMPT) / g.share),
    ("3.6", "read while a step runs, before its token lands", lambda g: _busy(g, g.PROMPT + 1)),
    ("3.6", "every step of the life at once (all tokens over all slots)", lambda g: _mean_fill(g) * g.share),
    ("3.6", "the busy pool, every block held (not lab 02's fill-once)",
     lambda g: g.paged * (g.PROMPT + (g.OUTPUT - 1) / 2) * g.kv / g.budget),
    ("3.6", "over the life, not at its end", lambda g: g.seq / (math.ceil(g.seq / g.BLOCK) * g.BLOCK) * g.share),
    ("3.8", "whole blocks (ceil)", lambda g: g.PRINTED_TABLE_BYTES / (g.TABLE_TOKENS // g.BLOCK)),
    ("3.8", "one entry per block", lambda g: g.PRINTED_TABLE_BYTES / g.TABLE_TOKENS),
    ("3.9", "one-sided: all of TAIL_SHARE above TAIL_TOKENS", lambda g: math.log(g.TAIL_TOKENS / g.MEDIAN_TOKENS)
     / NormalDist().inv_cdf(1 - g.TAIL_SHARE / 2)),
    ("3.9", "ln L is normal", lambda g: (g.TAIL_TOKENS / g.MEDIAN_TOKENS) / NormalDist().inv_cdf(1 - g.TAIL_SHARE)),
]


@pytest.mark.parametrize("cid, step, sloppy", DROPPED, ids=[f"{c}-{s}" for c, s, _ in DROPPED])
def test_dropping_a_named_step_fails_on_every_hidden_set(cid, step, sloppy):
    """Issue 27, item 4: without the step, the answer fails `verdict` on every hidden set drawn (grade draws two)."""
    from labsupport.course.checkoffs import get
    from labsupport.course.judge import Mismatch
    from labsupport.course.registry import case_rng

    checkoff = get(cid)
    for g in GIVENS[3].draw(case_rng("givens", b"item 4", "lab03"), 6):
        with pytest.raises(Mismatch):
            checkoff.verdict(sloppy(_g(g)), checkoff.expect(namespace(g)))


def test_the_hidden_sets_tell_the_3_6_readings_apart():
    """Every hidden set has a pool visibly short of the budget (the lecture's covers 99.987% of it)."""
    for g in GIVENS[3].draw(__import__("random").Random(3), 10):
        assert 1 - _g(g).share > 1e-3


def test_every_value_checkoff_has_a_dropped_step():
    values = {c.id for c in load_lab(3) if c.kind == "value"}
    assert values == {cid for cid, _, _ in DROPPED}, values ^ {cid for cid, _, _ in DROPPED}


def test_lab03_prices_one_copy_and_leaves_the_fan_out_count_to_5_3():
    """Lab 05's 5.3 asks how many copies a fan-out of 8 makes (7, the vLLM paper's way: the prompt's own sequence
    is the first branch; worked by hand in test_lab05_feedback).  Lab 03 comes first and must not count them: its
    section 7 prices one divergence on the real allocator (one whole block per copy) and names no fan-out count;
    a count of 7 is below the answer scan's small-integer floor, so it is checked here."""
    import re
    from pathlib import Path

    import nbformat

    nb = nbformat.read(Path(__file__).resolve().parents[1] / "solutions" / "03_block_tables.ipynb", as_version=4)
    text = "\n".join(c.source + "\n" + "".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells)
    assert not re.search(r"\b[78]\s+(?:block\s+)?copies\b|\b[78] of them\b", text), "lab 03 counts a fan-out's copies"
    assert text.count("copies one whole block") == 2  # b = 16 and b = 256: each partly filled last block is copied
