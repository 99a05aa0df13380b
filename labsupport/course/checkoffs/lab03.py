"""Lab 03 checkoffs: PagedAttention's block table (§10.3, Exercise 3); the function checkoffs compare with the
real BlockAllocator (3.2 in lockstep with it: labsupport.course.harness's "append")."""
from __future__ import annotations

import math
import random
from statistics import NormalDist

from labsupport.block_allocator import BlockAllocator
from labsupport.course.checkoffs._hidden import givens_kv as _kv
from labsupport.course.harness import HARNESSES
from labsupport.course.registry import DRAW_TRIES, case, choice, function, givens, namespace, value


def _budget(g) -> int:
    return g.HBM_BYTES - g.WEIGHT_BYTES * g.PARAMS - g.RESERVE_BYTES


def _paged_seqs(g) -> int:
    return (_budget(g) // (g.BLOCK * _kv(g))) // -(-(g.PROMPT + g.OUTPUT) // g.BLOCK)


def _hidden(rng):
    """A model, a card and a workload other than the lecture's, every answer different from its own (None when a
    bounded search finds none: registry.Givens then takes a fallback set)."""
    for _ in range(DRAW_TRIES):
        g = dict(LAYERS=rng.choice((16, 24, 40)), KV_HEADS=rng.choice((8, 16, 40)), HEAD_DIM=rng.choice((64, 96, 256)),
                 DTYPE_BYTES=rng.choice((1, 4)), HBM_BYTES=rng.choice((40, 94, 141)) * 10**9,
                 PARAMS=rng.choice((1_300_000_000, 2_700_000_000, 3_800_000_000)), WEIGHT_BYTES=rng.choice((1, 4)),
                 RESERVE_BYTES=rng.choice((2, 3, 6)) * 10**9, PROMPT=rng.randint(100, 3000),
                 OUTPUT=rng.randint(20, 1000), BLOCK=rng.choice((8, 32, 128)),  # 128, not 64: see below
                 TABLE_TOKENS=rng.choice((2048, 8192, 32_768)) + rng.randint(1, 7), ENTRY_BYTES=rng.choice((2, 8)),
                 MEDIAN_TOKENS=rng.randint(300, 3000), TAIL_SHARE=rng.choice((0.01, 0.02, 0.1)))
        entries = -(-g["TABLE_TOKENS"] // g["BLOCK"])
        g["PRINTED_TABLE_BYTES"] = entries * rng.choice((2, 4, 16))  # a printed table size some entry width gives
        g["TAIL_TOKENS"] = g["MEDIAN_TOKENS"] * rng.choice((10, 40, 60))
        # (b = 64 with 8-byte entries gives COURSE_AUTHORING.md's 3.12 the lecture's 8,192 B at 65,536 tokens)
        ns = namespace(g)
        if (_budget(ns) > 0 and _paged_seqs(ns) >= 4 and entries * g["ENTRY_BYTES"] != 1024
                and g["TABLE_TOKENS"] % g["BLOCK"] and _every_step_counts(ns)):
            return g
    return None


def _pool_share(g) -> float:
    """The share of the budget the pool's whole blocks cover."""
    block_bytes = g.BLOCK * _kv(g)
    return (_budget(g) // block_bytes) * block_bytes / _budget(g)


def _every_step_counts(g) -> bool:
    """Item 4: on these givens the steps 3.5 and 3.6 name each move the answer. A sequence that is not a whole
    number of blocks (so counting its tokens alone, without blocks, gives another count), and a pool whose whole
    blocks cover visibly less than the budget (3.6's share, 0.99986 on the lecture's)."""
    seq, kv = g.PROMPT + g.OUTPUT, _kv(g)
    blocks, per_seq = _budget(g) // (g.BLOCK * kv), -(-seq // g.BLOCK)
    return (seq % g.BLOCK != 0 and _budget(g) // (seq * kv) != _paged_seqs(g) and blocks % per_seq
            and blocks // (seq / g.BLOCK) != _paged_seqs(g) and 1 - _pool_share(g) > 1e-3)


_FALLBACKS = (dict(LAYERS=40, KV_HEADS=40, HEAD_DIM=256, DTYPE_BYTES=4, HBM_BYTES=94 * 10**9, PARAMS=3_800_000_000,
                   WEIGHT_BYTES=4, RESERVE_BYTES=6 * 10**9, PROMPT=2203, OUTPUT=489, BLOCK=128, TABLE_TOKENS=8198,
                   ENTRY_BYTES=2, MEDIAN_TOKENS=2830, TAIL_SHARE=0.02, PRINTED_TABLE_BYTES=260, TAIL_TOKENS=28_300),
              dict(LAYERS=40, KV_HEADS=40, HEAD_DIM=96, DTYPE_BYTES=4, HBM_BYTES=40 * 10**9, PARAMS=2_700_000_000,
                   WEIGHT_BYTES=4, RESERVE_BYTES=2 * 10**9, PROMPT=2856, OUTPUT=292, BLOCK=32, TABLE_TOKENS=8194,
                   ENTRY_BYTES=8, MEDIAN_TOKENS=1385, TAIL_SHARE=0.01, PRINTED_TABLE_BYTES=514, TAIL_TOKENS=83_100))
G = givens(hidden=_hidden, fallbacks=_FALLBACKS)
KV_MHA = _kv(G)  # 524,288 B per token
BUDGET = _budget(G)  # 62,520,000,000 B
SEQ = G.PROMPT + G.OUTPUT

# "Which slot holds this token", answered by the allocator, the kernels' helper or the cache's own arithmetic.
_TABLE = ("labsupport.block_allocator.BlockAllocator.slot_mapping",
          "labsupport.block_allocator.BlockAllocator.append_slot", "labsupport.kernels.kv_token_offsets",
          "labsupport.kvcache.PagedKVCache._slots")
_ENTRIES = ("labsupport.ledger.block_table_bytes", "labsupport.ledger.block_table_entries",
            "labsupport.ledger.blocks_for")


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


@function(
    "3.1", "slot_mapping through the block table",
    hint="A position lives in logical block position // b, at offset position % b inside it. The table turns the "
         "logical block into a physical one; the pool numbers slots block after block, b to a block. Nothing "
         "about the physical blocks is contiguous, so look each one up.",
    forbid=_TABLE,
    derive="look each position's logical block up in the table and add its offset inside the block",
    name="slot_mapping",
)
def _slot_mapping(rng):
    """Tables scattered by random traffic, block sizes 1..300, against the slots the real allocator uses."""
    for block_size in (1, 3, 4, 16, 128, rng.randint(2, 40), rng.randint(41, 300)):
        alloc = BlockAllocator(96, block_size)
        _churn(alloc, rng, 300, 3 * block_size + 5)
        for s, table in alloc.block_tables.items():
            n = alloc.seq_lens[s]
            for start, end in ((0, n), (n // 2, n), (n, n)):
                yield case(list(table), block_size, start, end, want=alloc.slot_mapping(s, start, end),
                           what=f"slot_mapping({list(table)}, block_size={block_size}, start={start}, end={end})")


def _reference_append(table, seq_len, block_size, take_free_block):
    """What the real allocator does, written as 3.2's function."""
    if seq_len == len(table) * block_size:
        table.append(take_free_block())
    return table[seq_len // block_size] * block_size + seq_len % block_size


@function(
    "3.2", "append: one more token, and a new block when the last is full",
    hint="Before writing token number seq_len, ask whether the sequence's last block still has a free slot. The "
         "sequence's blocks hold len(block_table) * b slots; if seq_len has reached that, take one block from the "
         "free pool, append it to the table, and only then compute the slot (block id * b + offset).",
    forbid=_TABLE,
    derive="compare seq_len with the slots the table's blocks hold, and compute the slot from the table",
    name="append",
)
def _append(rng):
    for block_size in (1, 2, 4, 5, 16, rng.randint(3, 64)):
        run = {"block_size": block_size, "seed": rng.getrandbits(32)}
        want = HARNESSES["append"](_reference_append, run)["result"]
        yield case(harness="append", data=run, want=want, judge="append", block_size=block_size)


@function(
    "3.3", "Tail waste of one sequence",
    hint="A sequence of n tokens holds ceil(n / b) blocks; the slots it does not fill are all in its last block. "
         "Check your formula on a length that is an exact multiple of b, and on n = 0.",
    forbid=("labsupport.ledger.tail_waste_tokens", "labsupport.ledger.blocks_for",
            "labsupport.block_allocator.BlockAllocator.blocks_needed"),
    derive="count the slots of ceil(n / b) blocks and take away the n tokens",
    name="tail_waste",
)
def _tail_waste(rng):
    for block_size in (1, 2, 7, 16, 64, 256, rng.randint(3, 500)):
        probe = BlockAllocator(64, block_size)
        lengths = {0, 1, block_size - 1, block_size, block_size + 1, 3 * block_size} | {
            rng.randint(1, 40 * block_size) for _ in range(20)}
        for n in sorted(x for x in lengths if x >= 0 and probe.blocks_needed(x) <= probe.num_blocks):
            table = probe.allocate("probe", n)
            want = len(table) * block_size - n  # what the real allocator leaves empty
            probe.free("probe")
            mistakes = [(block_size, "A full (or empty) last block wastes nothing.")] if n % block_size == 0 else []
            yield case(n, block_size, want=want, whole=True, mistakes=mistakes)


value(
    "3.4", "Mean tail waste at b = 16",
    expected=lambda g: sum(range(g.BLOCK)) / g.BLOCK,
    hint="If lengths are spread evenly modulo b, each remainder 0, 1, ..., b - 1 is equally likely. Write down the "
         "tail each remainder leaves (use 3.3) and average them.",
    mistakes=[(G.BLOCK / 2, "b/2 is the lecture's rounding. A length that is a multiple of b wastes nothing, so the "
               "tails run 0 .. b - 1, not 1 .. b."),
              (G.BLOCK - 1, "That is the worst case, b - 1; the question asks for the mean.")],
    unit=" tokens",
    forbid=("labsupport.ledger.mean_tail_waste_tokens", "labsupport.ledger.block_size_table"),
    derive="average the tails the remainders 0 .. b - 1 leave",
)

value(
    "3.5", "Paged concurrency at b = 16",
    expected=_paged_seqs,
    hint="What does a sequence actually hold in a paged pool, and what does the pool hand out? A sequence whose "
         "length is not a whole number of blocks still takes its last block whole.",
    mistakes=[(199, "199 is the lecture's printed figure, which its own inputs cannot reproduce (see the errata "
               "note); count the blocks exactly."),
              (190, "62.5 GB / 0.328 GB takes 512 KiB as 512,000 B and ignores whole blocks."),
              (BUDGET / (SEQ * KV_MHA), "A fraction of a sequence does not run: whole blocks, whole sequences."),
              (BUDGET // ((SEQ + G.BLOCK // 2) * KV_MHA), "That gives every sequence the lecture's mean b/2 = 8-token "
               "tail. 640 fills 40 blocks exactly: no tail at end of life, so count whole blocks.")],
    forbid=("labsupport.ledger.paged_concurrency", "labsupport.ledger.num_blocks",
            "labsupport.slo.memory_ceiling", "labsupport.viz.slo.memory_ceiling"),
    derive="count the whole blocks in the budget and divide by the blocks one sequence holds",
)


def _fill_over_life(g, first=None) -> float:
    """How full one sequence's blocks are, averaged over its decode steps, read while each runs (PROMPT ... PROMPT +
    OUTPUT - 1 tokens held; `first` = PROMPT + 1 reads each step after its token lands instead)."""
    first = g.PROMPT if first is None else first
    return sum(n / (-(-n // g.BLOCK) * g.BLOCK) for n in range(first, first + g.OUTPUT)) / g.OUTPUT


def _paged_over_life(g) -> float:
    return _fill_over_life(g) * _pool_share(g)  # the pool's whole blocks cover a little less than the budget


value(
    "3.6", "Paged utilization averaged over a sequence's life",
    expected=_paged_over_life,
    rel_tol=1e-6,
    hint="Two things stand between the budget and the tokens: what the pool is made of, and how full a sequence's "
         "blocks are at a random moment of its life. Measure the second on a real allocator; work out the first.",
    mistakes=[(_fill_over_life(G), "That is how full the blocks are; as a share of the budget, count only what the "
               "pool's whole blocks cover."),
              (_paged_seqs(G) * SEQ * KV_MHA / BUDGET,
               "That is the end of life, every sequence at its final length in full blocks: 3.5's reading. "
               "Average over the steps instead."),
              (SEQ / (math.ceil(SEQ / G.BLOCK) * G.BLOCK), "That is one sequence's blocks at the end of its life; "
               "average over the steps instead."),
              (SEQ / (SEQ + G.BLOCK / 2), "That is the final length over the final length plus a b/2 = 8-token "
               "tail: the lecture's rule of thumb for lengths spread evenly modulo b. This workload's lengths are "
               "not spread: every sequence runs through the same 512 ... 639, so step one through its life and "
               "average what its blocks hold."),
              (1 - 199 * G.BLOCK / 2 * KV_MHA / BUDGET, "That is 100% less the lecture's 1.3% (199 sequences, each "
               "with an 8-token tail): the lecture's rule of thumb, not this pool. Step one sequence through its "
               "life and average what its blocks hold.")],
    forbid=("labsupport.ledger.paged_utilization_time_avg",),
    derive="step one sequence through its life on a BlockAllocator and average how full its blocks are",
)


def _table_entries(g) -> int:
    return -(-g.TABLE_TOKENS // g.BLOCK)


value(
    "3.7", "Block-table bytes of a 4,096-token sequence",
    expected=lambda g: _table_entries(g) * g.ENTRY_BYTES,
    hint="What does one entry of the table name, and how many of them does a sequence of TABLE_TOKENS tokens need? "
         "The real cache stores each as an int32 (look at `block_table_tensor`'s dtype).",
    mistakes=[(_table_entries(G), "That is the number of entries; each entry takes several bytes."),
              (G.PRINTED_TABLE_BYTES, "That is the lecture's 2 KB; it assumes a different entry width than int32.")],
    unit=" B",
    forbid=_ENTRIES,
    derive="multiply the table's entries by the bytes of one int32 entry",
)

value(
    "3.8", "The entry width behind the lecture's 2 KB",
    expected=lambda g: g.PRINTED_TABLE_BYTES // _table_entries(g),
    hint="The lecture's figure is the bytes of the whole table of a TABLE_TOKENS-token sequence at b = BLOCK. How "
         "many entries share those bytes, and which integer type has the width that leaves each?",
    mistakes=[(G.PRINTED_TABLE_BYTES // _table_entries(G) * 8, "That is the width in bits; the question asks for "
               "bytes.")],
    unit=" B",
    forbid=_ENTRIES,
    derive="count the table's entries (whole blocks of TABLE_TOKENS) and divide the printed bytes by them",
)


value(
    "3.9", "Exercise 3: the lognormal's sigma",
    # one-sided: TAIL_SHARE of lengths lie above TAIL_TOKENS
    expected=lambda g: math.log(g.TAIL_TOKENS / g.MEDIAN_TOKENS) / NormalDist().inv_cdf(1 - g.TAIL_SHARE),
    rel_tol=1e-3,
    hint="For a lognormal, ln(length) is normal. Where on that normal does the median sit, and at which quantile "
         "does 'a share TAIL_SHARE of sequences over TAIL_TOKENS' put TAIL_TOKENS? statistics.NormalDist().inv_cdf "
         "turns a quantile into standard deviations.",
    mistakes=[(math.log(25) / 1.959963984540054, "1.96 is the two-sided 95% z; here all 5% lie on one side."),
              (math.log(25), "That is z * sigma; divide by z.")],
    forbid=("labsupport.ledger.lognormal_params", "labsupport.workloads.lognormal_params"),
    derive="put TAIL_TOKENS at its quantile of the normal ln(length) and solve for sigma",
)


def _row(block_size: int, batch: int, tail=None) -> tuple[float, float, int, int]:
    tail = (block_size - 1) / 2 if tail is None else tail  # lengths uniform modulo b (3.4)
    return (tail * KV_MHA, batch * tail * KV_MHA / BUDGET, math.ceil(G.MEDIAN_TOKENS / block_size),
            math.ceil(G.TAIL_TOKENS / block_size))


@function(
    "3.10", "Exercise 3: one row of the block-size table",
    hint="Return four numbers for a block size b and a batch: the bytes one sequence's last block reserves and does "
         "not fill, on average over lengths spread evenly modulo b (3.4's question at any b); what `batch` such "
         "sequences waste, as a fraction of BUDGET; and the block-table entries of the median and of the "
         "TAIL_TOKENS-token sequence (whole blocks).",
    forbid=("labsupport.ledger.block_size_table", "labsupport.ledger.mean_tail_waste_tokens", *_ENTRIES),
    derive="compute the row's four numbers from b, the batch, 3.4's mean tail and the two lengths",
    name="exercise3_row",
)
def _exercise3_row(rng):
    sizes = [8, 16, 64, 256, 1, 32, rng.randint(2, 7), rng.randint(9, 200), rng.choice((512, 1024))]
    for block_size, batch in [(b, n) for b in sizes for n in (21, 199)] + [(rng.choice(sizes), 1),
                                                                           (rng.choice(sizes), rng.randint(2, 500))]:
        mistakes = [(_row(block_size, batch, block_size / 2), "You used b/2 (the lecture's rounding); a length that is "
                     "a multiple of b leaves no tail, so the mean tail is (b − 1)/2 tokens (3.4's mean).")] \
            if block_size > 1 else []
        if batch != 199 and block_size > 1:
            mistakes.append((_row(block_size, 199), "That is the waste of 199 sequences, the lecture's chat batch; "
                             "use the batch you are given."))
        yield case(block_size, batch, want=_row(block_size, batch), rel_tol=1e-6, mistakes=mistakes,
                   what=f"exercise3_row({block_size}, batch={batch})")


choice(
    "3.11", "Exercise 3, measured: what the workload sets",
    answer={"waste at the batch", "table entries", "contiguous run"},
    options=("mean tail", "waste at the batch", "table entries", "contiguous run"),
    hint="Hold b fixed and run your eye down one column across the four workloads. Which columns depend only on how "
         "lengths fall modulo b, and which on how long the sequences are, how many fit, or how the pool was churned?",
    mistakes={"mean tail": "Compare the mean tail of the four workloads at one b: does it move by more than noise?"},
)
