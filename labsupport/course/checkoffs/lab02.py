"""Lab 02 checkoffs: the naive allocator and where 86% of the cache goes (§10.2, Exercises 1 and 2).

2.1  slot bytes at S_max = 4,096                 2.7  Exercise 1: GQA-8 utilization at 128K
2.2  reserve-to-max concurrency                   2.8  Exercise 1: what the brochure cost (paged / naive)
2.3  utilization measured over a live allocator   2.9  Exercise 2: mean declared slot, bytes
2.4  utilization averaged over a sequence's life  2.10 Exercise 2: mean concurrency
2.5  decode throughput of the naive batch         2.11 the fragmentation paging eliminates
2.6  utilization at S_max = 32,768                2.12 the fragmentation paging only bounds

Expected values are the lecture's inputs multiplied out here with Python integers (80 GB card,
6.74e9 bf16 parameters, 4 GB reserve, 2 x L x n_kv x d_head x 2 B per token), never read from
labsupport.ledger or from the student's code.  2.3 drives real allocators and keeps its own
record of every token it stored.
"""
from __future__ import annotations

import math
import random

from labsupport.contiguous import ContiguousAllocator, ReserveToMaxAllocator
from labsupport.course.checkoff import Mismatch, as_number, call, choice, function, value
from labsupport.units import fmt_number

KV_MHA = 2 * 32 * 32 * 128 * 2  # 524,288 B: the lecture's 7B, every layer and head, K and V, bf16
KV_GQA8 = 2 * 32 * 8 * 128 * 2  # 131,072 B: the same model with 8 KV heads
BUDGET = 80 * 10**9 - 2 * 6_740_000_000 - 4 * 10**9  # 62,520,000,000 B of KV on an 80 GB H100
WEIGHTS = 2 * 6_740_000_000  # bytes streamed per decode step
HBM_BW = 3_350 * 10**9  # bytes/s
SEQ = 512 + 128


# One-call answers to this lab's questions; the exercises ask for the arithmetic behind them.
_NAIVE_SHORTCUTS = ("labsupport.ledger.naive_concurrency", "labsupport.ledger.naive_utilization",
                    "labsupport.ledger.slot_occupancy", "labsupport.viz.memory.fill_reserve_to_max",
                    "labsupport.viz.memory.naive_measurement")
_STEP_SHORTCUTS = ("labsupport.ledger.tpot_s", "labsupport.ledger.throughput_tok_s",
                   "labsupport.ledger.decode_step_bytes", "labsupport.ledger.goodput_tok_s")


def _slots(s_max: int, kv: int) -> int:
    return BUDGET // (s_max * kv)


def _util(s_max: int, kv: int) -> float:
    return _slots(s_max, kv) * min(SEQ, s_max) * kv / BUDGET


def _paged(kv: int, block: int = 16) -> int:
    return (BUDGET // (block * kv)) // math.ceil(SEQ / block)


value(
    "2.1", "Reserve-to-max slot bytes",
    expected=lambda: 4096 * KV_MHA,
    hint="A reserve-to-max slot is sized by the limit, not by the sequence: it holds S_max tokens, each costing the "
         "model's KV bytes per token (lab 00). Multiply the two exactly, in bytes.",
    mistakes=[(640 * KV_MHA, "That is the 640 tokens the sequence uses; the allocator reserves S_max of them."),
              (4096 * 512_000, "512 KiB is 524,288 B, not 512,000 B.")],
    unit=" B",
    forbid=("labsupport.ledger.naive_slot_bytes",),
    derive="multiply S_max by the KV bytes per token",
)

value(
    "2.2", "Reserve-to-max concurrency",
    expected=lambda: _slots(4096, KV_MHA),
    hint="Start from the KV budget (the card's memory minus the weights minus the 4 GB reserve, all in decimal GB) and "
         "ask how many whole slots fit in it. A fraction of a slot holds no sequence.",
    mistakes=[(BUDGET / (4096 * KV_MHA), "A fraction of a slot holds no sequence: round down."),
              ((80 * 10**9 - 4 * 10**9) // (4096 * KV_MHA), "The weights live in HBM too: subtract them first."),
              (62_520_000_000 * 2**30 // 10**9 // (4096 * KV_MHA), "The budget is 62.52 decimal GB, not GiB.")],
    forbid=_NAIVE_SHORTCUTS,
    derive="divide the budget by one slot's bytes and keep the whole slots",
)


def _live_allocators(rng: random.Random):
    """Allocators in the middle of serving, with our own record of the tokens each sequence holds."""
    configs = [(KV_MHA, 4096, BUDGET), (KV_GQA8, 4096, BUDGET), (KV_MHA, 32_768, BUDGET), (KV_MHA, 512, BUDGET),
               (KV_GQA8, 16_384, 40 * 10**9), (KV_MHA, 2048, 10**10)]
    for _ in range(4):  # shapes and budgets the lab never shows
        kv = 2 * rng.randint(1, 80) * rng.choice((1, 2, 4, 8, 16)) * rng.choice((32, 64, 128)) * rng.choice((1, 2, 4))
        s_max = rng.choice((128, 300, 1024, 4096, 10_000))
        configs.append((kv, s_max, kv * s_max * rng.randint(1, 24) + rng.randrange(kv * s_max)))
    cases = []
    for kv, s_max, budget in configs:
        alloc = ReserveToMaxAllocator.from_budget(budget, kv, s_max=s_max)
        held: dict[int, int] = {}
        for sid in range(alloc.max_seqs):
            n = rng.randint(0, s_max // 2)
            alloc.allocate(sid, num_tokens=n)
            held[sid] = n
        for sid in rng.sample(sorted(held), len(held) // 3):  # some finish, leaving free slots
            alloc.free(sid)
            del held[sid]
        for sid in list(held):  # the rest decode a few tokens
            grow = rng.randint(0, 40)
            alloc.append(sid, grow)
            held[sid] += grow
        cases.append((alloc, budget, held, kv))
    # per-request S_max (Exercise 2's allocator) and an empty pool
    alloc = ContiguousAllocator(200_000, kv_bytes_per_token=KV_MHA)
    held = {}
    for sid, size in enumerate((512, 4096, 32_768, 512, 4096, 512)):
        n = rng.randint(1, size)
        alloc.allocate(sid, size, num_tokens=n)
        held[sid] = n
    cases.append((alloc, 200_000 * KV_MHA + 123_456, held, KV_MHA))
    cases.append((ReserveToMaxAllocator.from_budget(BUDGET, KV_MHA, s_max=4096), BUDGET, {}, KV_MHA))
    # what each case must give, and what the usual wrong readings give, worked out now
    return [(alloc, budget, len(held), sum(held.values()) * kv / budget,
             sum(s.size for s in alloc.slots.values()) * kv / budget if held else None,
             sum(held.values()) / sum(s.size for s in alloc.slots.values()) if held else None)
            for alloc, budget, held, kv in cases]


@function(
    "2.3", "Utilization, measured over a live allocator",
    hint="Utilization counts bytes that hold real tokens — what each live sequence has stored so far, not the slot it "
         "reserved — over the whole KV budget. The allocator knows its live slots (`alloc.slots`, a dict of `Slot`s "
         "with `.length` and `.size`) and its bytes per token (`alloc.kv_bytes_per_token`).",
    cases=_live_allocators,
    forbid=("labsupport.contiguous.ContiguousAllocator.stats", *_NAIVE_SHORTCUTS),
    derive="add up the tokens the live slots hold (`slot.length`) and convert them to bytes yourself",
)
def _utilization(fn, case):
    alloc, budget, live, want, reserved_share, slot_share = case
    what = f"utilization(<allocator with {live} live sequences>, budget_bytes={budget:,})"
    got = as_number(call(fn, alloc, budget), f"{what} returned a value that")
    if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15):
        return
    if reserved_share is not None and math.isclose(got, reserved_share, rel_tol=1e-9):
        raise Mismatch(f"{what} returned {got:.6f}: that is the share of the budget *reserved* by slots; "
                       "utilization counts only the tokens stored in them.")
    if slot_share is not None and math.isclose(got, slot_share, rel_tol=1e-9):
        raise Mismatch(f"{what} returned {got:.6f}: that is the share of the reserved slots that holds tokens, "
                       "a fair reading (lab 08's seed 4 uses it) but not this one: here, as in §10.2's 15.2%, "
                       "utilization is over the whole KV budget.")
    if math.isclose(got, 100 * want, rel_tol=1e-9):
        raise Mismatch(f"{what} returned {got:.6f}: return a fraction (0.1556), not a percentage.")
    raise Mismatch(f"{what} returned {fmt_number(got)}, which is too {'high' if got > want else 'low'}.")


# Over a life the sequence holds 512, 513, ... 639 tokens while its 128 decode steps run (the KV the
# step reads); the 640th arrives with the last step.  Mean 575.5 tokens, in every one of the slots.
_LIFE_MEAN = sum(range(512, 640)) / 128


value(
    "2.4", "Utilization averaged over a sequence's life",
    expected=lambda: _slots(4096, KV_MHA) * _LIFE_MEAN * KV_MHA / BUDGET,
    rel_tol=2e-3,  # counting the tokens after each step (513 ... 640) instead is the same reading, 0.17% apart
    hint="Step the allocator through the 128 decode steps and read the utilization (tokens held over the whole "
         "budget) at every step, then average the 128 readings. Every slot stays busy: when a sequence "
         "finishes, the next one takes its slot with a fresh 512-token prompt, so at a random moment a slot's "
         "sequence is anywhere in its life. Give a fraction.",
    mistakes=[(_util(4096, KV_MHA), "That is the end of life, every sequence at 640 tokens: 2.3's reading. Average "
               "over the steps instead."),
              (_LIFE_MEAN / 4096, "That is one slot's mean occupancy; utilization is over the whole budget, which "
               "29 slots do not quite fill."),
              (_slots(4096, KV_MHA) * 512 * KV_MHA / BUDGET, "That is the start of life, the prompt alone.")],
    forbid=(*_NAIVE_SHORTCUTS, "labsupport.ledger.naive_utilization_time_avg", "labsupport.ledger.life_lengths"),
    derive="step the allocator's sequences through their decode steps and average the utilization you read",
)


value(
    "2.5", "Decode throughput of the naive batch",
    expected=lambda: _slots(4096, KV_MHA) / ((WEIGHTS + _slots(4096, KV_MHA) * SEQ * KV_MHA) / HBM_BW),
    rel_tol=1e-3,
    hint="A memory-bound decode step reads every weight once plus every resident sequence's KV; its time is those "
         "bytes over the HBM bandwidth, and it yields one token per sequence. Use the batch the naive allocator "
         "permits and the full 640-token sequences.",
    mistakes=[(_slots(4096, KV_MHA) / (WEIGHTS / HBM_BW), "The step also reads each sequence's KV, not only the "
               "weights."),
              (_slots(4096, KV_MHA) / ((WEIGHTS + _slots(4096, KV_MHA) * 4096 * KV_MHA) / HBM_BW),
               "The kernel reads the tokens a sequence holds, not its whole reserved slot.")],
    unit=" tok/s",
    forbid=_STEP_SHORTCUTS,
    derive="write the step's bytes (weights plus every sequence's KV) over the bandwidth, then B over that time",
)

value(
    "2.6", "Utilization at S_max = 32,768",
    expected=lambda: _util(32_768, KV_MHA),
    rel_tol=1e-4,
    hint="Redo 2.2 and 2.3's arithmetic with the bigger slot: first how many 32,768-token slots fit in the budget, then "
         "the bytes their 640-token sequences hold, over the whole budget. Give a fraction.",
    mistakes=[(640 / 32_768, "640/32,768 is one slot's occupancy. Utilization is over the whole budget, and the "
               "budget holds a whole number of slots, with a remainder no slot can use."),
              (0.019, "The lecture prints 1.9%; that is the truncated slot occupancy, a different quantity. "
               "Compute utilization over the budget."),
              (_util(4096, KV_MHA), "That is the S_max = 4,096 figure.")],
    forbid=_NAIVE_SHORTCUTS,
    derive="count the whole 32,768-token slots in the budget and divide the bytes their 640 tokens hold by the budget",
)

value(
    "2.7", "Exercise 1: GQA-8 utilization at S_max = 131,072",
    expected=lambda: _util(131_072, KV_GQA8),
    rel_tol=1e-4,
    hint="Under MHA a 128K slot is larger than the budget, so zero requests fit. With 8 KV heads each token costs a "
         "quarter as much: size the slot, count the whole slots that fit, and divide the bytes their 640-token "
         "sequences hold by the budget. Give a fraction.",
    mistakes=[(0.0039, "The lecture's 0.39% takes 128 KiB as 128,000 B (0.082 GB per sequence); 640 x 131,072 B "
               "is 0.0839 GB."),
              (0.0, "Zero is the MHA answer; this part is about the GQA-8 model.")],
    forbid=_NAIVE_SHORTCUTS,
    derive="size the GQA-8 slot, count the whole slots in the budget and divide the bytes their tokens hold by it",
)

value(
    "2.8", "Exercise 1: what the brochure cost",
    expected=lambda: _paged(KV_GQA8) / _slots(131_072, KV_GQA8),
    rel_tol=5e-5,  # 745 / 3 = 248.33 exactly; 248.0 is the lecture's rounded 744 / 3, not this answer
    hint="Compare two concurrencies of the same GQA-8 model and the same 640-token sequences: paged at b = 16 (whole "
         "blocks per sequence, whole blocks in the budget) against reserve-to-max at S_max = 131,072. The cost is "
         "their ratio.",
    mistakes=[(744 / 3, "744 is the lecture's rounded paged count; recount the blocks exactly (2 MiB each)."),
              (_paged(KV_MHA) / _slots(4096, KV_MHA), "That is the MHA model at S_max = 4,096; this part is "
               "GQA-8 against a 128K reservation.")],
    forbid=(*_NAIVE_SHORTCUTS, "labsupport.ledger.paged_concurrency"),
    derive="count the GQA-8 paged sequences and the 128K slots in the budget yourself, then take the ratio",
)

value(
    "2.9", "Exercise 2: mean declared slot",
    expected=lambda: 0.70 * 512 * KV_MHA + 0.25 * 4096 * KV_MHA + 0.05 * 32_768 * KV_MHA,
    rel_tol=5e-4,
    hint="Each request reserves S_max x KV bytes per token for its own declared S_max. Weight each of the three slot "
         "sizes by its share of requests and add them up, in bytes.",
    mistakes=[(1.586e9, "1.586 GB comes from the lecture's rounded slot sizes (0.268, 2.147, 17.2 GB); multiply "
               "the exact ones.")],
    unit=" B",
    forbid=("labsupport.ledger.naive_slot_bytes",),
    derive="weight each declared slot (S_max x KV bytes per token) by its share",
)

value(
    "2.10", "Exercise 2: mean concurrency",
    expected=lambda: BUDGET / (0.70 * 512 * KV_MHA + 0.25 * 4096 * KV_MHA + 0.05 * 32_768 * KV_MHA),
    abs_tol=0.5,
    hint="On average each resident request holds one mean slot, so the budget holds about budget / mean slot of them. "
         "Compare it with 29 (everyone reserving 4K) and with paging's 186.",
    mistakes=[(29, "29 is the uniform 4K reservation; here each request declares its own S_max.")],
)

FRAGMENTATION = ("internal", "external")

choice(
    "2.11", "What paging eliminates",
    answer="external", options=FRAGMENTATION,
    hint="External fragmentation is free space between allocations, too small for the next request; internal is "
         "reserved space inside an allocation that its owner never fills. With fixed-size blocks, can a free block "
         "ever be the wrong size for a request? Can the last block of a sequence be partly empty?",
    mistakes={"internal": "A sequence's last block can still be partly empty: up to b - 1 tokens."},
)

choice(
    "2.12", "What paging only bounds",
    answer="internal", options=FRAGMENTATION,
    hint="Which waste survives in a paged cache, and what is its worst case per sequence? Think about the unfilled "
         "tail of a sequence's final block.",
    mistakes={"external": "Any free block serves any request, so no free block is ever unusable: that waste is "
                          "gone, not bounded."},
)
