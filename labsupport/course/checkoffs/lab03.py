"""Lab 03 checkoffs: PagedAttention's block table (§10.3, Exercise 3); the function checkoffs compare with the
real BlockAllocator (3.2 in lockstep with it: labsupport.course.harness.lab03's "append")."""
from __future__ import annotations

import math
import random
from statistics import NormalDist

from labsupport.block_allocator import BlockAllocator
from labsupport.course.checkoffs._hidden import distinct_mistakes, givens_kv as _kv
from labsupport.course.harness import HARNESSES
from labsupport.course.registry import DRAW_TRIES, case, choice, function, givens, namespace, shown, value
from labsupport.kvcache import PagedKVCache


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
                 OUTPUT=rng.randint(20, 1000), BLOCK=rng.choice((8, 32, 128)),
                 TABLE_TOKENS=rng.choice((2048, 8192, 32_768)) + rng.randint(1, 7), ENTRY_BYTES=rng.choice((2, 8)),
                 MEDIAN_TOKENS=rng.randint(300, 3000), TAIL_SHARE=rng.choice((0.01, 0.02, 0.1)))
        entries = -(-g["TABLE_TOKENS"] // g["BLOCK"])
        g["PRINTED_TABLE_BYTES"] = entries * rng.choice((2, 4, 16))  # a printed table size some entry width gives
        g["TAIL_TOKENS"] = g["MEDIAN_TOKENS"] * rng.choice((10, 40, 60))
        ns = namespace(g)
        if (_budget(ns) > 0 and _paged_seqs(ns) >= 4 and g["TABLE_TOKENS"] % g["BLOCK"]
                and _every_step_counts(ns)):
            return g
    return None


def _pool_share(g) -> float:
    """The share of the budget the pool's whole blocks cover."""
    block_bytes = g.BLOCK * _kv(g)
    return (_budget(g) // block_bytes) * block_bytes / _budget(g)


def _life(g, first=None) -> tuple[int, int]:
    """(tokens, slots) of the busy pool's sequences, one at each step of the life: PROMPT ... PROMPT + OUTPUT - 1 tokens
    held while the steps run (`first` = PROMPT + 1 reads each step after its token lands instead); whole blocks."""
    first = g.PROMPT if first is None else first
    lengths = range(first, first + g.OUTPUT)
    return sum(lengths), sum(-(-n // g.BLOCK) * g.BLOCK for n in lengths)


def _mean_of_fills(g) -> float:
    """Each step's fill averaged, every step once: the reading of one step's sequences at a time, not the pool's."""
    return sum(n / (-(-n // g.BLOCK) * g.BLOCK) for n in range(g.PROMPT, g.PROMPT + g.OUTPUT)) / g.OUTPUT


def _busy_pool(g, first=None) -> float:
    tokens, slots = _life(g, first)
    return _pool_share(g) * tokens / slots  # every whole block held, filled as the sequences of every age fill theirs


def _filled_once(g, first=None) -> float:
    """Lab 02's 2.4 on a paged pool: 3.5's count of sequences prefilled once, then decoded, their tokens over BUDGET."""
    first = g.PROMPT if first is None else first
    return _paged_seqs(g) * sum(range(first, first + g.OUTPUT)) / g.OUTPUT * _kv(g) / _budget(g)


def _every_step_counts(g) -> bool:
    """Item 4: on these givens each step 3.6 names moves its answer: a pool whose whole blocks cover visibly less than
    the budget (0.99987 on the lecture's), a reading before a step's token lands that differs from one after it,
    and a pool of every age at once that differs from one step's sequences averaged."""
    if 1 - _pool_share(g) <= 1e-3:  # the cheap test first: a draw fails it far more often than the others
        return False
    want = _busy_pool(g)
    return (abs(_busy_pool(g, g.PROMPT + 1) / want - 1) > 1e-5
            and abs(_mean_of_fills(g) * _pool_share(g) / want - 1) > 1e-5)


# Two sets _hidden accepts (every step of 3.6 counts on them), frozen; each differs in every given from the givens of
# every catalogue card (specs.py: no GPU has 94 GB, no model 16 or 40 layers, 40 KV heads or a head of 256), so that
# it serves whatever card course.toml names.
_FALLBACKS = (dict(LAYERS=40, KV_HEADS=40, HEAD_DIM=256, DTYPE_BYTES=4, HBM_BYTES=94 * 10**9, PARAMS=2_700_000_000,
                   WEIGHT_BYTES=1, RESERVE_BYTES=6 * 10**9, PROMPT=2177, OUTPUT=282, BLOCK=128, TABLE_TOKENS=2054,
                   ENTRY_BYTES=8, MEDIAN_TOKENS=889, TAIL_SHARE=0.1, PRINTED_TABLE_BYTES=272, TAIL_TOKENS=53_340),
              dict(LAYERS=16, KV_HEADS=40, HEAD_DIM=256, DTYPE_BYTES=4, HBM_BYTES=94 * 10**9, PARAMS=1_300_000_000,
                   WEIGHT_BYTES=1, RESERVE_BYTES=2 * 10**9, PROMPT=2553, OUTPUT=564, BLOCK=128, TABLE_TOKENS=32_770,
                   ENTRY_BYTES=2, MEDIAN_TOKENS=780, TAIL_SHARE=0.02, PRINTED_TABLE_BYTES=4112, TAIL_TOKENS=7_800))
G = givens(hidden=_hidden, fallbacks=_FALLBACKS)
KV_MHA = _kv(G)  # the card's MHA form: 524,288 B per token on the lecture's card
BUDGET = _budget(G)  # 62,520,000,000 B on the lecture's card
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

def _fit_by_hand(budget: int, kv: int, block_size: int, seq_tokens: int) -> int:
    """§10.3 by hand: the pool is whole blocks of the budget, and a sequence holds ceil(S / b) of them."""
    return (budget // (block_size * kv)) // -(-seq_tokens // block_size)


def _fit_mistakes(budget: int, kv: int, block_size: int, seq_tokens: int, want: int) -> list:
    per_seq = -(-seq_tokens // block_size)
    found = [(budget // (seq_tokens * kv), "You divided the budget by the sequence's tokens: a paged pool hands out "
              "whole blocks, and a sequence takes its last block whole however little of it is filled."),
             ((budget // (block_size * kv)) // (seq_tokens / block_size), "A sequence holds whole blocks: one that "
              "is not a whole number of blocks still takes its last block."),
             (budget // ((seq_tokens + block_size / 2) * kv), "That gives every sequence the lecture's mean b/2 tail; "
              "a sequence of known length has a known tail: count its whole blocks."),
             ((budget // (block_size * kv)) // (seq_tokens // block_size + 1), "A sequence that fills its last block "
              "exactly needs no extra one: count ceil(S / b) blocks, not S // b + 1.")]
    if (budget, kv, block_size, seq_tokens) == (BUDGET, KV_MHA, G.BLOCK, SEQ):
        found.append((199, "199 is the lecture's printed figure: no reading of its own inputs gives it (512 KiB read "
                      "as 512,000 B gives 190). Count whole blocks."))
    # a fraction is caught as one (whole=True): only whole slips get a remark, equal ones once
    return distinct_mistakes(want, [(int(wrong), remark) for wrong, remark in found if wrong == wrong // 1])


@function(
    "3.5", "How many sequences a paged pool holds",
    hint="What does the pool hand out, and what does one sequence hold of it? Try your function on a sequence one "
         "token longer than a whole number of blocks, on one that fills its blocks exactly, and on a budget that is "
         "not a whole number of blocks.",
    forbid=("labsupport.ledger.paged_concurrency", "labsupport.ledger.num_blocks", "labsupport.ledger.blocks_for",
            "labsupport.block_allocator.BlockAllocator.blocks_needed", "labsupport.slo.memory_ceiling",
            "labsupport.viz.slo.memory_ceiling"),
    derive="count the whole blocks in the budget and the whole blocks one sequence holds",
    name="sequences_that_fit",
)
def _sequences_that_fit(rng):
    """The card's pool first (the chat workload's 640-token sequences at b = 16), then other models, cards and
    lengths: a sequence a token past whole blocks, one exactly whole, one shorter than a block, a pool that holds
    none."""
    models = [(G.LAYERS, G.KV_HEADS, G.HEAD_DIM, G.DTYPE_BYTES), (32, 8, 128, 2), (16, 16, 64, 1), (40, 40, 96, 4),
              (rng.choice((12, 24, 48)), rng.choice((4, 8, 32)), rng.choice((64, 128)), rng.choice((1, 2)))]
    want = _fit_by_hand(BUDGET, KV_MHA, G.BLOCK, SEQ)  # the lecture's card: 7,452 blocks of 8 MiB // 40 = 186
    yield case(BUDGET, KV_MHA, G.BLOCK, SEQ, want=want, whole=True,
               mistakes=_fit_mistakes(BUDGET, KV_MHA, G.BLOCK, SEQ, want),
               what=f"sequences_that_fit({BUDGET:_}, {KV_MHA:_}, {G.BLOCK}, {SEQ})")
    for block_size in (1, 8, 16, 32, 128, 256, rng.randint(2, 300)):
        layers, heads, dim, width = rng.choice(models)
        kv = 2 * layers * heads * dim * width
        budget = rng.choice((20, 40, 62, 94, 141)) * 10**9 + rng.randint(1, block_size * kv - 1)  # not whole blocks
        k = rng.randint(2, 60_000 // block_size + 2)
        for seq in sorted({k * block_size + 1, k * block_size, max(1, block_size - 1), rng.randint(1, 40_000)}):
            want = _fit_by_hand(budget, kv, block_size, seq)
            yield case(budget, kv, block_size, seq, want=want, whole=True,
                       mistakes=_fit_mistakes(budget, kv, block_size, seq, want),
                       what=f"sequences_that_fit({budget:_}, {kv:_}, {block_size}, {seq})")
    kv = 2 * 32 * 32 * 128 * 2
    small = rng.randint(16 * kv, 50 * 16 * kv)  # a pool of a few dozen blocks at most
    for seq in (51 * 16, 51 * 16 - 1):  # longer than the pool: nothing fits
        yield case(small, kv, 16, seq, want=0, whole=True, what=f"sequences_that_fit({small:_}, {kv:_}, 16, {seq})")


value(
    "3.6", "The busy paged pool: the share of the budget holding tokens",
    expected=lambda g: _busy_pool(g),
    rel_tol=1e-6,
    hint="The busy pool holds sequences of every age at once, in equal numbers, and none of its blocks is free. What "
         "do all of them hold together, and what do all their blocks reserve? Then ask how much of the budget the "
         "pool's blocks are.",
    mistakes=lambda g: [
        (_busy_pool(g) / _pool_share(g), "That is how full the held blocks are; as a share of the budget, count only "
         "what the pool's whole blocks cover."),
        (_mean_of_fills(g) * _pool_share(g), "That averages each step's fill, as if the pool held one step's "
         "sequences at a time. The busy pool holds every step at once: its fill is all their tokens over all the "
         "slots of their blocks."),
        (_mean_of_fills(g), "That averages each step's fill, as if the pool held one step's sequences at a time (the "
         "busy pool's fill is all their tokens over all their slots), and leaves out what the pool's whole blocks "
         "cover of the budget."),
        (_busy_pool(g, g.PROMPT + 1), "That reads each step after its token lands; the question reads while the "
         "step runs, the new token not yet written (PROMPT ... PROMPT + OUTPUT - 1 tokens)."),
        (_filled_once(g), "That is 3.5's count of sequences filled once and decoded, as lab 02's 2.4 filled its "
         "slots: the blocks for tokens not yet written sit free. The busy pool hands them out, so every block is "
         "held."),
        (_filled_once(g, g.PROMPT + 1), "That is 3.5's count of sequences filled once and decoded, as lab 02's 2.4 "
         "did (read after each token lands): the blocks for tokens not yet written sit free. The busy pool hands "
         "them out, so every block is held."),
        (_paged_seqs(g) * (g.PROMPT + g.OUTPUT) * _kv(g) / _budget(g),
         "That is the end of life, every sequence at its final length: 3.5's reading. The busy pool holds every "
         "step of the life at once."),
        ((g.PROMPT + g.OUTPUT) / (-(-(g.PROMPT + g.OUTPUT) // g.BLOCK) * g.BLOCK), "That is one sequence's blocks at "
         "the end of its life; the busy pool holds sequences at every step."),
        ((g.PROMPT + g.OUTPUT) / (g.PROMPT + g.OUTPUT + g.BLOCK / 2), "That is the final length over the final "
         "length plus a b/2 tail: the lecture's rule of thumb for lengths spread evenly modulo b. This workload's "
         "lengths are not spread: every sequence runs through the same PROMPT ... PROMPT + OUTPUT - 1 tokens."),
        (1 - 199 * g.BLOCK / 2 * _kv(g) / _budget(g), "That is 100% less the tails of 199 sequences, each a b/2 "
         "tail (the lecture's 1.3%): the lecture's rule of thumb, not this pool. Count what the sequences of every "
         "step hold and reserve.")],
    forbid=("labsupport.ledger.paged_utilization_time_avg",),
    derive="put a sequence of every step on a BlockAllocator and read what they hold against what they reserve",
)


def _padded_entries(seq_lens, block_size: int) -> int:
    """Measured: the entries of the block-table tensor the real cache hands the kernel for these sequences."""
    cache = PagedKVCache(num_blocks=sum(-(-n // block_size) for n in seq_lens), block_size=block_size, num_layers=1,
                         num_kv_heads=1, head_dim=1)
    for i, n in enumerate(seq_lens):
        cache.allocator.allocate(i, n)
    return cache.block_table_tensor(list(range(len(seq_lens)))).numel()


def _table_mistakes(seq_lens, block_size: int, entry_bytes: int, want: int) -> list:
    rows = len(seq_lens)
    found = [(sum(-(-n // block_size) for n in seq_lens) * entry_bytes, "That prices each table at its own length. "
              "The kernel is handed one tensor, and its rows are all as wide (look at block_table_tensor's shape)."),
             (want // entry_bytes, "That counts the entries; each takes entry_bytes bytes."),
             (rows * max(n // block_size for n in seq_lens) * entry_bytes, "A partly filled last block is still a "
              "block the table must name: whole blocks, rounded up."),
             (rows * max(seq_lens) * entry_bytes, "One entry per block, not per token.")]
    return distinct_mistakes(want, found)


@function(
    "3.7", "The block-table tensor of a batch",
    hint="Make a small cache, put two sequences of different lengths in it and print block_table_tensor for them: "
         "how many rows, how many columns, and which sequence sets the width? Then what one entry costs.",
    forbid=("labsupport.ledger.block_table_bytes", "labsupport.ledger.block_table_entries",
            "labsupport.ledger.blocks_for", "labsupport.block_allocator.BlockAllocator.blocks_needed",
            "labsupport.kvcache.PagedKVCache.block_table_tensor"),
    derive="count the rows and the widest table's whole blocks, and price each entry",
    name="batch_table_bytes",
)
def _batch_table_bytes(rng):
    """The lecture's TABLE_TOKENS-token sequence first, the board's two sequences, then random batches at the real
    cache's block sizes (powers of two), each against the tensor the real PagedKVCache builds."""
    for lens, b, width in (([G.TABLE_TOKENS], G.BLOCK, G.ENTRY_BYTES), ([9, 5], 4, 4)):
        want = _padded_entries(lens, b) * width
        yield case(lens, b, width, want=want, whole=True, mistakes=_table_mistakes(lens, b, width, want),
                   what=f"batch_table_bytes({lens}, {b}, {width})")
    for b in (1, 2, 16, 64, 256, 2 ** rng.randint(3, 9)):
        width = rng.choice((2, 4, 8))
        k = rng.randint(2, 3000 // b + 2)
        batches = [[k * b], [k * b + 1], [rng.randint(1, b)],  # a table exactly full, one past, one short block
                   [rng.randint(1, 4000) for _ in range(rng.randint(2, 8))],
                   [k * b] + [rng.randint(1, k * b) for _ in range(rng.randint(1, 6))]]  # the longest exactly full
        for lens in batches:
            rng.shuffle(lens)
            want = _padded_entries(lens, b) * width
            yield case(lens, b, width, want=want, whole=True, mistakes=_table_mistakes(lens, b, width, want),
                       what=f"batch_table_bytes({shown((lens,))}, {b}, {width})")


def _table_entries(g) -> int:
    return -(-g.TABLE_TOKENS // g.BLOCK)


value(
    "3.8", "The entry width behind the lecture's 2 KB",
    expected=lambda g: g.PRINTED_TABLE_BYTES // _table_entries(g),
    hint="Work backwards from what the printed bytes hold: what does one entry of the table name, and how many of "
         "them does a TABLE_TOKENS-token sequence need at b = BLOCK?",
    mistakes=[(G.PRINTED_TABLE_BYTES // _table_entries(G) * 8, "That is the width in bits; the question asks for "
               "bytes."),
              (G.PRINTED_TABLE_BYTES / G.TABLE_TOKENS, "That gives every token an entry; the table has one per "
               "block.")],
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
