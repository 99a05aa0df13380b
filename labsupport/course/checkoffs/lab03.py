"""Lab 03 checkoffs: PagedAttention's block table (§10.3, Exercise 3).

3.1  slot_mapping: token position -> physical slot through the block table (checked against the real
     allocator's own mapping, and by writing K/V through it into a real PagedKVCache and gathering back)
3.2  append: one more token, a new block exactly when the last one is full (in lockstep with the real
     BlockAllocator on random workloads)
3.3  tail waste of one sequence (against the blocks the real allocator hands out)
3.4  mean tail waste at b = 16 for lengths uniform modulo b
3.5  paged concurrency of the 640-token workload at b = 16
3.6  paged utilization averaged over a sequence's life (the lecture's 98.7%)
3.7  block-table bytes of a 4,096-token sequence at b = 16 with int32 entries
3.8  the entry width that gives the lecture's 2 KB
3.9  Exercise 3: the lognormal's sigma
3.10 Exercise 3: one row of the block-size table
3.11 Exercise 3: the two measurements that decide

Expected numbers are written out here from the lecture's inputs with Python integers; the function
checkoffs compare with `labsupport`'s real allocator and cache, never with the student's code.
"""
from __future__ import annotations

import math
import random
from statistics import NormalDist

import torch

from labsupport.block_allocator import BlockAllocator
from labsupport.course.checkoff import Mismatch, as_number, call, choice, expect_close, function, value
from labsupport.kvcache import PagedKVCache
from labsupport.units import fmt_number

KV_MHA = 2 * 32 * 32 * 128 * 2  # 524,288 B per token
BUDGET = 80 * 10**9 - 2 * 6_740_000_000 - 4 * 10**9  # 62,520,000,000 B
SEQ = 512 + 128


# The real allocator's and kernels' own answers to "which slot holds this token".
_TABLE_SHORTCUTS = ("labsupport.block_allocator.BlockAllocator.slot_mapping",
                    "labsupport.block_allocator.BlockAllocator.append_slot",
                    "labsupport.block_allocator.BlockAllocator.append_slots",
                    "labsupport.kvcache.PagedKVCache.prepare_decode",
                    "labsupport.kernels.kv_token_offsets", "labsupport.kernels.kv_token_offset")


def _churn(alloc: BlockAllocator, rng: random.Random, ops: int, max_prompt: int) -> None:
    """Random allocate / decode / free traffic, so tables name scattered, out-of-order blocks."""
    next_id = 0
    for _ in range(ops):
        live = list(alloc.block_tables)
        r = rng.random()
        if r < 0.25 or not live:
            n = rng.randint(0, max_prompt)
            if alloc.can_allocate(alloc.blocks_needed(n)):
                alloc.allocate(next_id, n)
                next_id += 1
        elif r < 0.85:
            s = rng.choice(live)
            if alloc.seq_lens[s] % alloc.block_size or alloc.num_free_blocks:
                alloc.append_slot(s)
        else:
            alloc.free(rng.choice(live))


def _check_mapping(fn, table, block_size, start, end, want) -> None:
    what = f"slot_mapping({table}, block_size={block_size}, start={start}, end={end})"
    got = call(fn, list(table), block_size, start, end)
    try:
        got = [int(x) for x in got]
    except (TypeError, ValueError, OverflowError):
        raise Mismatch(f"{what} returned {got!r}; return a list of integer slots, one per position.") from None
    if len(got) != len(want):
        raise Mismatch(f"{what} returned {len(got)} slots for {end - start} positions [{start}, {end}).")
    for pos, (g, w) in enumerate(zip(got, want), start=start):
        if g != w:
            raise Mismatch(f"{what}: position {pos} (logical block {pos // block_size}, offset {pos % block_size}) "
                           f"got slot {g}, which the real cache does not use for it.")


def _mapping_cases(rng):
    """Tables left scattered by random traffic, block sizes 1..128 and some the lab never shows; then
    sequences of a real cache, whose K/V the judge writes through the student's slots."""
    cases = []
    for block_size in (1, 3, 4, 16, 128, rng.randint(2, 40), rng.randint(41, 300)):  # 3: not a power of two
        alloc = BlockAllocator(96, block_size)
        _churn(alloc, rng, 300, 3 * block_size + 5)
        for s, table in alloc.block_tables.items():
            n = alloc.seq_lens[s]
            for start, end in ((0, n), (n // 2, n), (n, n)):
                cases.append(("map", list(table), block_size, start, end, alloc.slot_mapping(s, start, end)))
    cache = PagedKVCache(48, 4, num_layers=2, num_kv_heads=2, head_dim=4)
    _churn(cache.allocator, rng, 200, 14)
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    for s, table in cache.allocator.block_tables.items():
        n = cache.allocator.seq_lens[s]
        k, v = torch.randn(2, n, 2, 4, generator=gen), torch.randn(2, n, 2, 4, generator=gen)
        cases.append(("cache", cache, s, list(table), n, k, v))
    return cases


@function(
    "3.1", "slot_mapping through the block table",
    hint="A position lives in logical block position // b, at offset position % b inside it. The table turns the "
         "logical block into a physical one; the pool numbers slots block after block, b to a block. Nothing "
         "about the physical blocks is contiguous, so look each one up.",
    cases=_mapping_cases,
    forbid=_TABLE_SHORTCUTS,
    derive="look each position's logical block up in the table and add its offset inside the block",
)
def _slot_mapping(fn, case):
    if case[0] == "map":
        _, table, block_size, start, end, want = case
        _check_mapping(fn, table, block_size, start, end, want)
        return
    # through a real cache: write K/V at the student's slots, read the sequence back through its table
    _, cache, s, table, n, k, v = case
    slots = call(fn, list(table), 4, 0, n)
    try:
        slots_t = torch.tensor([int(x) for x in slots], dtype=torch.long)
    except (TypeError, ValueError, OverflowError):
        raise Mismatch(f"slot_mapping returned {slots!r}; return a list of integer slots.") from None
    if slots_t.numel() != n:
        raise Mismatch(f"slot_mapping({table}, 4, 0, {n}) returned {slots_t.numel()} slots for {n} tokens.")
    if n and (int(slots_t.min()) < 0 or int(slots_t.max()) >= cache.num_blocks * 4):
        raise Mismatch(f"slot_mapping({table}, 4, 0, {n}) returned a slot outside the pool of "
                       f"{cache.num_blocks * 4} slots.")
    for layer in range(2):
        cache.write(layer, slots_t, k[layer], v[layer])
    gk, gv = cache.gather(s)
    if not (torch.equal(gk, k) and torch.equal(gv, v)):
        raise Mismatch(f"K/V written at your slots for a sequence with block table {table} did not come back "
                       "when the real cache gathered it through the table: some token went to a slot of "
                       "another block.")


def _append_cases(rng):
    # each case: a block size and the random stream of its lockstep run
    sizes = (1, 2, 4, 5, 16, rng.randint(3, 64))
    return [(block_size, random.Random(rng.getrandbits(64))) for block_size in sizes]


@function(
    "3.2", "append: one more token, and a new block when the last is full",
    hint="Before writing token number seq_len, ask whether the sequence's last block still has a free slot. The "
         "sequence's blocks hold len(block_table) * b slots; if seq_len has reached that, take one block from the "
         "free pool, append it to the table, and only then compute the slot (block id * b + offset).",
    cases=_append_cases,
    forbid=_TABLE_SHORTCUTS,
    derive="compare seq_len with the slots the table's blocks hold, and compute the slot from the table",
)
def _append(fn, case):
    block_size, rng = case
    alloc = BlockAllocator(80, block_size)
    _churn(alloc, rng, 120, 2 * block_size + 3)
    for step in range(400):
        live = list(alloc.block_tables)
        if rng.random() < 0.1 or not live:
            if alloc.num_free_blocks:
                alloc.allocate(f"new{step}", 0)  # a sequence with no tokens yet: its first append takes a block
            continue
        s = rng.choice(live)
        n = alloc.seq_lens[s]
        if n % block_size == 0 and not alloc.num_free_blocks:
            alloc.free(s)
            continue
        before = list(alloc.block_tables[s])
        real = alloc.append_slot(s)
        after = alloc.block_tables[s]
        grew = len(after) > len(before)
        taken: list[int] = []
        spurious: list[int] = []

        def take_free_block():
            if grew and not taken:
                taken.append(after[-1])
                return after[-1]
            spurious.append(1)
            return alloc.num_blocks + 1000  # a block id no pool has: the call was not needed

        table = list(before)
        what = f"append(table={before}, seq_len={n}, block_size={block_size}, take_free_block)"
        got = call(fn, table, n, block_size, take_free_block)
        if spurious:
            raise Mismatch(f"{what} asked for a new block "
                           f"{'a second time' if grew else 'although its last block still had room'}.")
        if grew and not taken:
            raise Mismatch(f"{what} did not take a new block, but the last block was full "
                           f"({len(before)} blocks x {block_size} slots hold {len(before) * block_size} tokens).")
        if table != after:
            raise Mismatch(f"{what} left the table as {table}; the real allocator's table is now {after}. "
                           "Append the new block to the table you were given (modify it in place).")
        expect_close(got, real.slot, what)


def _tail_cases(rng):
    cases = []
    for block_size in (1, 2, 7, 16, 64, 256, rng.randint(3, 500)):
        probe = BlockAllocator(64, block_size)
        lengths = {0, 1, block_size - 1, block_size, block_size + 1, 3 * block_size} | {
            rng.randint(1, 40 * block_size) for _ in range(20)}
        for n in sorted(x for x in lengths if x >= 0):
            if probe.blocks_needed(n) > probe.num_blocks:
                continue
            table = probe.allocate("probe", n)
            cases.append((n, block_size, len(table) * block_size - n))  # what the real allocator leaves empty
            probe.free("probe")
    return cases


@function(
    "3.3", "Tail waste of one sequence",
    hint="A sequence of n tokens holds ceil(n / b) blocks; the slots it does not fill are all in its last block. "
         "Check your formula on a length that is an exact multiple of b, and on n = 0.",
    cases=_tail_cases,
    forbid=("labsupport.ledger.tail_waste_tokens", *_TABLE_SHORTCUTS),
    derive="count the slots of ceil(n / b) blocks and take away the n tokens",
)
def _tail_waste(fn, case):
    n, block_size, want = case
    got = as_number(call(fn, n, block_size), f"tail_waste({n}, {block_size}) returned a value that")
    if got != want:
        extra = " (a full last block wastes nothing)" if n % block_size == 0 else ""
        raise Mismatch(f"tail_waste({n}, {block_size}) returned {fmt_number(got)}, which is not what the real "
                       f"allocator leaves empty{extra}.")
    if not 0 <= got <= block_size - 1:
        raise Mismatch(f"tail_waste({n}, {block_size}) returned {fmt_number(got)}, outside 0..b-1.")


value(
    "3.4", "Mean tail waste at b = 16",
    expected=lambda: sum(range(16)) / 16,
    rel_tol=1e-9,
    hint="If lengths are spread evenly modulo b, each remainder 0, 1, ..., b - 1 is equally likely. Write down the tail "
         "each remainder leaves (use 3.3) and average them.",
    mistakes=[(8, "b/2 = 8 is the lecture's rounding. A length that is a multiple of b wastes nothing, so the "
               "tails run 0 .. b - 1, not 1 .. b."),
              (15, "15 is the worst case, b - 1; the question asks for the mean.")],
    unit=" tokens",
    forbid=("labsupport.ledger.mean_tail_waste_tokens", "labsupport.ledger.block_size_table"),
    derive="average the tails the remainders 0 .. b - 1 leave",
)

value(
    "3.5", "Paged concurrency at b = 16",
    expected=lambda: (BUDGET // (16 * KV_MHA)) // math.ceil(SEQ / 16),
    hint="Count whole blocks twice: the budget holds floor(budget / (b x bytes per token)) physical blocks, and each "
         "640-token sequence needs ceil(640 / b) of them.",
    mistakes=[(199, "199 is the lecture's printed figure, which its own inputs cannot reproduce (see the errata "
               "note); count the blocks exactly."),
              (190, "62.5 GB / 0.328 GB takes 512 KiB as 512,000 B and ignores whole blocks."),
              (BUDGET / (SEQ * KV_MHA), "A fraction of a sequence does not run: whole blocks, whole sequences.")],
    forbid=("labsupport.ledger.paged_concurrency", "labsupport.ledger.paged_utilization"),
    derive="count the whole blocks in the budget and divide by the blocks one 640-token sequence holds",
)

def _paged_over_life() -> float:
    # While its 128 steps run a sequence holds n = 512 ... 639 tokens in ceil(n / 16) blocks; the pool is
    # floor(budget / block bytes) whole blocks, so its blocks cover a little less than the budget.
    tokens = sum(range(512, 640))
    slots = sum(-(-n // 16) * 16 for n in range(512, 640))
    pool_share = (BUDGET // (16 * KV_MHA)) * 16 * KV_MHA / BUDGET
    return tokens / slots * pool_share


value(
    "3.6", "Paged utilization averaged over a sequence's life",
    expected=_paged_over_life,
    rel_tol=3e-4,  # the pool's whole-block share (99.99%) may be left out: 98.71% is as fair a reading
    hint="Step one sequence from its 512-token prompt through its 128 decode steps on a BlockAllocator and read, "
         "while each step runs, the tokens its blocks hold over the slots they reserve; average the 128 "
         "readings. That is how full a sequence's blocks are over its life; the pool (whole blocks) covers "
         "very nearly the whole budget. Give a fraction.",
    mistakes=[((BUDGET // (16 * KV_MHA)) // math.ceil(SEQ / 16) * SEQ * KV_MHA / BUDGET,
               "That is the end of life, every sequence at 640 tokens in 40 full blocks: 3.5's reading. "
               "Average over the steps instead."),
              (SEQ / (math.ceil(SEQ / 16) * 16), "That is one 640-token sequence's blocks, full at the end of its "
               "life; average over the steps instead.")],
    forbid=("labsupport.ledger.paged_utilization_time_avg", "labsupport.ledger.paged_utilization",
            "labsupport.ledger.life_lengths"),
    derive="step one sequence through its life on a BlockAllocator and average how full its blocks are",
)

value(
    "3.7", "Block-table bytes of a 4,096-token sequence",
    expected=lambda: math.ceil(4096 / 16) * 4,
    hint="One table entry per logical block; each entry is one physical block id. The real cache stores ids as int32 "
         "(look at `block_table_tensor`'s dtype). Entries times bytes per entry.",
    mistakes=[(256, "256 is the number of entries; each entry takes several bytes."),
              (2048, "2,048 B is the lecture's 2 KB; it assumes a different entry width than int32.")],
    unit=" B",
    forbid=("labsupport.ledger.block_table_bytes",),
    derive="multiply the table's entries by the bytes of one int32 entry",
)

value(
    "3.8", "The entry width behind the lecture's 2 KB",
    expected=lambda: 2048 // math.ceil(4096 / 16),
    hint="2 KB = 2,048 B spread over the 256 entries of a 4,096-token table at b = 16. How many bytes per entry is "
         "that, and which integer type has that width?",
    mistakes=[(64, "64 is the width in bits; the question asks for bytes.")],
    unit=" B",
)

_Z95 = NormalDist().inv_cdf(0.95)  # one-sided: 5% of lengths lie above the 95th percentile
_SIGMA = math.log(20_000 / 800) / _Z95

value(
    "3.9", "Exercise 3: the lognormal's sigma",
    expected=lambda: _SIGMA,
    rel_tol=1e-3,
    hint="For a lognormal, ln(length) is normal with mean mu = ln(median). '5% of sequences over 20,000' puts 20,000 at "
         "the 95th percentile, so ln(20,000) = mu + z * sigma with z the standard normal's one-sided 95% quantile "
         "(statistics.NormalDist().inv_cdf).",
    mistakes=[(math.log(25) / 1.959963984540054, "1.96 is the two-sided 95% z; here all 5% lie on one side."),
              (math.log(25), "That is z * sigma; divide by z.")],
    forbid=("labsupport.ledger.lognormal_params", "labsupport.workloads.lognormal_params"),
    derive="put 20,000 at the 95th percentile: ln(20,000) = ln(800) + z * sigma, and solve for sigma",
)


def _row(block_size: int) -> tuple[float, float, int, int]:
    tail = (block_size - 1) / 2  # lengths uniform modulo b (3.4)
    return (tail * KV_MHA, 199 * tail * KV_MHA / BUDGET, math.ceil(800 / block_size), math.ceil(20_000 / block_size))


def _row_cases(rng):
    sizes = [8, 16, 64, 256, 1, 32, rng.randint(2, 7), rng.randint(9, 200), rng.choice((512, 1024))]
    return [(block_size, _row(block_size)) for block_size in sizes]


@function(
    "3.10", "Exercise 3: one row of the block-size table",
    hint="Return four numbers for a block size b: the mean tail waste per sequence in bytes (MHA; use 3.4's mean, "
         "not b/2), that waste for 199 sequences as a fraction of the 62.52 GB budget, and the table entries for the "
         "median (800) and p95 (20,000) sequences — whole blocks.",
    cases=_row_cases,
    forbid=("labsupport.ledger.block_size_table", "labsupport.ledger.mean_tail_waste_tokens",
            "labsupport.ledger.lognormal_params", "labsupport.ledger.block_table_entries"),
    derive="compute the row's four numbers from b, 3.4's mean tail and the two lengths",
)
def _exercise3_row(fn, case):
    block_size, want = case
    names = ("mean tail bytes", "waste at B = 199 (fraction of budget)", "entries at the median",
             "entries at the p95")
    got = call(fn, block_size)
    try:
        got = tuple(got)
    except TypeError:
        raise Mismatch(f"exercise3_row({block_size}) returned {got!r}; return a tuple of four numbers.") from None
    if len(got) != 4:
        raise Mismatch(f"exercise3_row({block_size}) returned {len(got)} values; four are expected.")
    for name, g, w in zip(names, got, want):
        g = as_number(g, f"exercise3_row({block_size})'s {name}")
        half = block_size / 2 * KV_MHA
        if name == "mean tail bytes" and math.isclose(g, half, rel_tol=1e-9) and block_size > 1:
            raise Mismatch(f"exercise3_row({block_size}): the mean tail uses b/2; use the exact mean from 3.4.")
        expect_close(g, w, f"exercise3_row({block_size})'s {name}", rel_tol=1e-9 if isinstance(w, int) else 1e-6)


MEASUREMENTS = ("kernel_bandwidth", "fork_rate", "tail_waste", "table_size", "hbm_size")

choice(
    "3.11", "Exercise 3: the two measurements that decide",
    answer={"kernel_bandwidth", "fork_rate"}, options=MEASUREMENTS,
    hint="You have already computed the memory column, and it points at small blocks. Which costs of a small or a "
         "large block does the memory column not see? One lives in the attention kernel; one appears only when "
         "sequences share blocks (§10.4).",
    mistakes={"tail_waste": "The tail waste is the column you just computed; alone, it picks the wrong answer.",
              "table_size": "Even at the p95 length the int32 table is a few KB, next to GBs of KV.",
              "hbm_size": "The card's memory scales every block size's waste alike; it does not separate them."},
)
