"""Lab 02 checkoffs: the naive allocator and where 86% of the cache goes (§10.2, Exercises 1 and 2).

Values are multiplied out from the givens here, and the builds' wants from each case's own record, never read
from labsupport.ledger or the lab's code; mistakes are the lecture's and the plausible slips.
"""
from __future__ import annotations

import math
import random

from labsupport import card
from labsupport.contiguous import ContiguousAllocator, ReserveToMaxAllocator
from labsupport.course.checkoffs._hidden import distinct_mistakes, givens_kv as _kv
from labsupport.course.data import live
from labsupport.measure.fragmentation import run_until_fragmented
from labsupport.memory_stats import OutOfBlocks
from labsupport.course.registry import DRAW_TRIES, case, choice, function, givens, namespace, value
from labsupport.specs import KiB, MiB


def _budget(g) -> int:
    return g.HBM_BYTES - g.PARAMS * g.DTYPE_BYTES - g.RESERVE_BYTES


def _hidden(rng: random.Random) -> dict:
    """Another card, model and workload on which every exercise still makes sense (and runs in seconds); None when a
    bounded search finds none (registry.Givens then takes a fallback set)."""
    for _ in range(DRAW_TRIES):
        g = dict(HBM_BYTES=rng.choice((40, 48, 94, 141, 192)) * 10**9, PARAMS=rng.randint(1_000, 12_000) * 10**6,
                 DTYPE_BYTES=rng.choice((1, 4)), RESERVE_BYTES=rng.choice((2, 3, 5, 6, 8)) * 10**9,
                 LAYERS=rng.choice((16, 24, 28, 40, 48)), KV_HEADS=rng.choice((16, 24, 40, 48)),
                 GQA_KV_HEADS=rng.choice((1, 2, 4)), HEAD_DIM=rng.choice((64, 80, 96, 256)),
                 HBM_BW=rng.choice((1_555, 2_039, 4_800, 8_000)) * 10**9, PROMPT=rng.randint(100, 2_000),
                 OUTPUT=rng.randint(16, 400), S_MAX=rng.choice((2_048, 8_192)), S_MAX_LONG=rng.choice((16_384, 65_536)),
                 S_MAX_BROCHURE=rng.choice((262_144, 524_288, 1_048_576)), BLOCK=rng.choice((8, 32)),
                 S_MAX_SHORT=rng.choice((256, 1_024)), SHARE_SHORT=rng.choice((0.5, 0.6, 0.8)),
                 SHARE_LONG=rng.choice((0.02, 0.1, 0.15)))
        n = namespace(g)
        budget, kv, kv_gqa = _budget(n), _kv(n), _kv(n, n.GQA_KV_HEADS)
        if (n.PROMPT + n.OUTPUT < n.S_MAX and budget > 0
                and 2 <= budget // (n.S_MAX * kv) <= 300  # a naive batch, and a life the lab steps through quickly
                and budget // (n.S_MAX_LONG * kv) >= 1 and budget // (n.S_MAX_BROCHURE * kv_gqa) >= 1
                and budget // (n.BLOCK * kv_gqa) <= 400_000  # a block pool the lab's allocator fills in a second
                and _every_step_counts(n) and _differs_from_card(n) and _fragmented_run(n) is not None):
            return g
    return None


def _every_step_counts(n) -> bool:
    """Each step a prompt names moves the answer on these givens by more than its checkoff's tolerance (item 4):
    slots that do not fill the budget exactly, sequences that are not whole blocks, and a long-context cost (2.7)
    that whole slots move away from the plain ratio of the two limits."""
    kv, budget = _kv(n), _budget(n)
    frac = lambda x: abs(x - round(x)) > 1e-3 * x  # noqa: E731
    short, long_ = budget // (n.S_MAX * kv), budget // (n.S_MAX_LONG * kv)
    # 2.5's throughput saturates in B (B over a step that grows with B): fractional slots must still move it past
    # its tolerance, or a batch of budget / slot (not whole slots) would pass there
    b_frac, seq_bytes = budget / (n.S_MAX * kv), (n.PROMPT + n.OUTPUT) * kv
    tok_s_frac = b_frac * n.HBM_BW / (n.PARAMS * n.DTYPE_BYTES + b_frac * seq_bytes)
    return (frac(budget / (n.S_MAX * kv)) and frac(budget / (n.S_MAX_LONG * kv))
            and abs(tok_s_frac - _naive_tok_s(n)) > 2e-3 * _naive_tok_s(n)
            and frac(budget / (n.S_MAX_BROCHURE * _kv(n, n.GQA_KV_HEADS))) and (n.PROMPT + n.OUTPUT) % n.BLOCK
            and long_ >= 1 and abs(short / long_ - n.S_MAX_LONG / n.S_MAX) > 1e-3 * short / long_)


def _brochure_cost(g) -> float:
    return _paged(g, _kv(g, g.GQA_KV_HEADS)) / _slots(g, g.S_MAX_BROCHURE, _kv(g, g.GQA_KV_HEADS))


def _differs_from_card(n) -> bool:
    """2.7's and 2.8's answers, ratios of whole counts, differ from the card's by more than their tolerances (the
    build's rule 1): a draw's ratio may land on the card's (29 / 3 on the lecture's; 36 / 4 = 18 / 2 on an A100 with
    Qwen2.5-7B), and a typed-in number would pass there."""
    far = lambda a, b, rel: abs(a - b) > rel * max(abs(a), abs(b))  # noqa: E731
    return far(_long_context_cost(n), _long_context_cost(G), 1e-4) and far(_brochure_cost(n), _brochure_cost(G), 5e-5)


def _fragmented_run(g):
    """Exercise 2's run on the real first-fit allocator (2.14): the refusal of a medium request with enough free in
    total, or None when these givens never produce one."""
    kv = _kv(g)
    mix = ((g.S_MAX_SHORT, g.SHARE_SHORT), (g.S_MAX, 1 - g.SHARE_SHORT - g.SHARE_LONG), (g.S_MAX_LONG, g.SHARE_LONG))
    if _budget(g) // kv > 3_000_000:  # a pool the lab's run crosses in a second
        return None
    run = run_until_fragmented(int(_budget(g) // kv), mix, kv_bytes_per_token=kv, seed=0, stop_sizes=[g.S_MAX],
                               max_arrivals=3_000)
    return run.refusal if run.found else None


# Each fallback differs in every given from the givens of every catalogue card (specs.py: no GPU has 94 or 192 GB or
# 9 TB/s, no model 1 or 2 KV heads), so that it serves whatever card course.toml names.
_FALLBACKS = (dict(HBM_BYTES=192 * 10**9, PARAMS=8_468_000_000, DTYPE_BYTES=4, RESERVE_BYTES=5 * 10**9, LAYERS=40,
                   KV_HEADS=24, GQA_KV_HEADS=2, HEAD_DIM=256, HBM_BW=9_000 * 10**9, PROMPT=1928, OUTPUT=121,
                   S_MAX=8_192, S_MAX_LONG=16_384, S_MAX_BROCHURE=262_144, BLOCK=8, S_MAX_SHORT=1_024,
                   SHARE_SHORT=0.5, SHARE_LONG=0.15),
              dict(HBM_BYTES=94 * 10**9, PARAMS=9_954_000_000, DTYPE_BYTES=1, RESERVE_BYTES=8 * 10**9, LAYERS=16,
                   KV_HEADS=48, GQA_KV_HEADS=2, HEAD_DIM=256, HBM_BW=9_000 * 10**9, PROMPT=1388, OUTPUT=361,
                   S_MAX=8_192, S_MAX_LONG=16_384, S_MAX_BROCHURE=262_144, BLOCK=32, S_MAX_SHORT=256,
                   SHARE_SHORT=0.5, SHARE_LONG=0.02))
G = givens(hidden=_hidden, fallbacks=_FALLBACKS)  # the card's: solutions/02_naive_allocator.py's givens cell, built

# G is the course card's (course.toml); the lecture's card gives the numbers in these comments
KV_MHA = _kv(G)  # the card's model in MHA form: 524,288 B for the lecture's 7B, every layer and head, K and V, bf16
KV_GQA8 = _kv(G, G.GQA_KV_HEADS)  # the same model with the card's GQA KV heads: 131,072 B with the lecture's 8
BUDGET = _budget(G)  # 62,520,000,000 B of KV on the lecture's 80 GB H100
SEQ = G.PROMPT + G.OUTPUT
LECTURE_CARD = card.card().is_lecture  # the lecture's own slips (its printed numbers) are traps on its card only
PRINTED_BUDGET = round(BUDGET, -8)  # the budget as a board writes it, to 0.1 GB: the lecture's 62.5 GB
_SLOTS = "labsupport.ledger.naive_concurrency"
_UTIL = (_SLOTS, "labsupport.ledger.naive_utilization")
_SLOT_BYTES = "labsupport.ledger.naive_slot_bytes"


def _slots(g, s_max: int, kv: int, budget=None) -> int:
    return (_budget(g) if budget is None else budget) // (s_max * kv)


def _util(g, s_max: int, kv: int, budget=None) -> float:
    budget = _budget(g) if budget is None else budget
    return _slots(g, s_max, kv, budget) * min(g.PROMPT + g.OUTPUT, s_max) * kv / budget


def _paged(g, kv: int) -> int:
    return (_budget(g) // (g.BLOCK * kv)) // math.ceil((g.PROMPT + g.OUTPUT) / g.BLOCK)


def _internal(g, budget=None) -> float:
    budget = _budget(g) if budget is None else budget
    return _slots(g, g.S_MAX, _kv(g), budget) * (g.S_MAX - g.PROMPT - g.OUTPUT) * _kv(g) / budget


_WHOSE = "the lecture's" if LECTURE_CARD else "the lab's model's"  # whose KV bytes per token KV_MHA are


_G_GIB = namespace(dict(vars(G), RESERVE_BYTES=4 * 2**30))  # the card's givens with the reserve read as 4 GiB
_GIB_RESERVE = _budget(_G_GIB)  # its budget: 28 slots on the lecture's card
_GIB_REMARK = "That reads the 4 GB reserve as 4 GiB (4,294,967,296 B); the reserve, like the card, is decimal GB."

value(
    "2.1", "The bytes one slot reserves and never fills",
    expected=lambda g: (g.S_MAX - g.PROMPT - g.OUTPUT) * _kv(g),
    hint="A reserve-to-max slot is sized by the limit, S_MAX tokens, each at the model's KV bytes per token (lab 00); "
         "the sequence in it only ever stores its prompt and its output. The difference, in bytes, is reserved "
         "and never filled.",
    mistakes=[(G.S_MAX * KV_MHA, "That is the whole slot; its sequence fills PROMPT + OUTPUT of those positions."),
              ((G.S_MAX - G.PROMPT) * KV_MHA, "The output tokens land in the slot too: the sequence ends up holding "
               "PROMPT + OUTPUT tokens."),
              (SEQ * KV_MHA, "That is what the sequence fills; the question is what it leaves empty."),
              ((G.S_MAX - SEQ) * KV_MHA // 1024 * 1000, f"{KV_MHA / KiB:g} KiB per token is {KV_MHA:,} B, not "
               f"{KV_MHA // 1024 * 1000:,} B: a KiB is 1,024 bytes."),
              ((G.S_MAX - SEQ) * KV_MHA // 2, "Count both tensors: every layer keeps a key and a value per KV head.")],
    unit=" B",
    forbid=(_SLOT_BYTES,),
    derive="multiply the slot's unfilled positions by the KV bytes per token",
)

@function(
    "2.3", "Utilization, measured over a live allocator",
    hint="Utilization counts bytes that hold real tokens — what each live sequence has stored so far, not the slot it "
         "reserved — over the whole KV budget. The allocator knows its live slots (`alloc.slots`, a dict of `Slot`s "
         "with `.length` and `.size`) and its bytes per token (`alloc.kv_bytes_per_token`).",
    forbid=("labsupport.contiguous.ContiguousAllocator.stats", "labsupport.measure.fragmentation.naive_measurement",
            "labsupport.viz.memory.naive_measurement"),
    derive="add up the tokens the live slots hold (`slot.length`) and convert them to bytes yourself",
    name="utilization",
)
def _utilization(rng: random.Random):
    """Allocators mid-serve, changed only through their methods; the wants come from our own record."""
    configs = [(KV_MHA, 4096, BUDGET), (KV_GQA8, 4096, BUDGET), (KV_MHA, 32_768, BUDGET), (KV_MHA, 512, BUDGET),
               (KV_GQA8, 16_384, 40 * 10**9), (KV_MHA, 2048, 10**10)]
    for _ in range(4):  # shapes and budgets the lab never shows
        kv = 2 * rng.randint(1, 80) * rng.choice((1, 2, 4, 8, 16)) * rng.choice((32, 64, 128)) * rng.choice((1, 2, 4))
        s_max = rng.choice((128, 300, 1024, 4096, 10_000))
        configs.append((kv, s_max, kv * s_max * rng.randint(1, 24) + rng.randrange(kv * s_max)))
    cases = []
    for kv, s_max, budget in configs:
        alloc = live(ReserveToMaxAllocator, int(budget // kv), s_max, kv_bytes_per_token=kv)
        held = {sid: rng.randint(0, s_max // 2) for sid in range(alloc.real.max_seqs)}
        for sid, tokens in held.items():
            alloc.allocate(sid, num_tokens=tokens)
        for sid in rng.sample(sorted(held), len(held) // 3):  # some finish, leaving free slots
            alloc.free(sid)
            del held[sid]
        for sid in list(held):  # the rest decode a few tokens
            held[sid] += (grow := rng.randint(0, 40))
            alloc.append(sid, grow)
        cases.append((alloc, budget, held, kv))
    # per-request S_max (Exercise 2's allocator) and an empty pool
    alloc = live(ContiguousAllocator, 200_000, kv_bytes_per_token=KV_MHA)
    held = {}
    for sid, size in enumerate((512, 4096, 32_768, 512, 4096, 512)):
        held[sid] = rng.randint(1, size)
        alloc.allocate(sid, size, num_tokens=held[sid])
    cases.append((alloc, 200_000 * KV_MHA + 123_456, held, KV_MHA))
    empty = live(ReserveToMaxAllocator, int(BUDGET // KV_MHA), 4096, kv_bytes_per_token=KV_MHA)
    cases.append((empty, BUDGET, {}, KV_MHA))
    for alloc, budget, held, kv in cases:
        want = sum(held.values()) * kv / budget
        mistakes = []
        if held:  # the usual wrong readings, worked out from our record and the slots the allocator reserved
            reserved = sum(s.size for s in alloc.real.slots.values())
            mistakes = [(reserved * kv / budget, "That is the share of the budget *reserved* by slots; utilization "
                         "counts only the tokens stored in them."),
                        (sum(held.values()) / reserved, "That is the share of the reserved slots that holds tokens, a "
                         "fair reading (lab 08's seed 4 uses it) but not this one: here, as in §10.2's 15.2%, "
                         "utilization is over the whole KV budget."),
                        (100 * want, "Return a fraction (0.1556 for 15.56%), not a percentage.")]
        yield case(alloc, budget, want=want, rel_tol=1e-9, abs_tol=1e-15, mistakes=mistakes,
                   what=f"utilization(<allocator with {len(held)} live sequences>, budget_bytes={budget:,})")


def _never_filled(slots) -> int:
    """Positions of these (size, length, final) slots that their sequences never fill, from our own record: a slot
    holds its tokens, then the ones still to come (up to `final`, or none when final is None), and the rest is
    never filled; a sequence headed past its slot fills all of it."""
    return sum(size - min(size, max(length, length if final is None else final)) for size, length, final in slots)


@function(
    "2.2", "Internal fragmentation, measured over a live allocator",
    hint="Sort a slot's positions into what its sequence holds now, what it will still fill (up to `.final`, where "
         "that is known) and what it never reaches. Only the last is the allocator's waste: the tokens still to come "
         "are space any allocator must find for them (§10.2's third waste). A sequence headed past its slot fills "
         "all of it. Convert with the allocator's own bytes per token, over the whole budget.",
    forbid=("labsupport.contiguous.ContiguousAllocator.stats", "labsupport.measure.fragmentation.naive_measurement",
            "labsupport.viz.memory.naive_measurement"),
    derive="sort each live slot's positions yourself (`slot.size`, `slot.length`, `slot.final`) and add up the "
           "ones never filled",
    name="internal_share",
)
def _internal_share(rng: random.Random):
    """Allocators at admission, mid-decode and at the end of life, reserve-to-max and per-request S_max, changed only
    through their methods; the wants come from our own record of each slot (size, length, final)."""
    cases = []
    # the lecture's pool at the end of life: 29 slots of 4,096 holding 640 tokens each (its 84%), then the same pool
    # right after its prefills, each sequence 512 tokens in and headed for 640
    for tokens in (SEQ, G.PROMPT):
        alloc = live(ReserveToMaxAllocator, int(BUDGET // KV_MHA), G.S_MAX, kv_bytes_per_token=KV_MHA)
        record = {}
        for sid in range(alloc.real.max_seqs):
            alloc.allocate(sid, num_tokens=tokens, final_tokens=SEQ)
            record[sid] = [G.S_MAX, tokens, SEQ]
        cases.append((alloc, BUDGET, record, KV_MHA))
    configs = [(KV_GQA8, 32_768, BUDGET), (KV_MHA, 512, 40 * 10**9)]
    for _ in range(3):  # shapes and budgets the lab never shows
        kv = 2 * rng.randint(1, 80) * rng.choice((1, 2, 4, 8, 16)) * rng.choice((32, 64, 128)) * rng.choice((1, 2, 4))
        s_max = rng.choice((128, 300, 1024, 4096, 10_000))
        configs.append((kv, s_max, kv * s_max * rng.randint(1, 24) + rng.randrange(kv * s_max)))
    for kv, s_max, budget in configs:  # mid-serve: some finished, some still decoding, some headed past their slot
        alloc = live(ReserveToMaxAllocator, int(budget // kv), s_max, kv_bytes_per_token=kv)
        record = {}
        for sid in range(alloc.real.max_seqs):
            held = rng.randint(0, s_max // 2)
            final = rng.choice((None, held + rng.randint(0, s_max // 2), s_max + rng.randint(1, 50)))
            alloc.allocate(sid, num_tokens=held, final_tokens=final)
            record[sid] = [s_max, held, final]
        for sid in rng.sample(sorted(record), len(record) // 3):
            alloc.free(sid)
            del record[sid]
        for sid, slot in record.items():  # the rest decode a few tokens, never past what they hold room for
            grow = rng.randint(0, min(40, slot[0] - slot[1]))
            alloc.append(sid, grow)
            slot[1] += grow
        cases.append((alloc, budget, record, kv))
    # per-request S_max (Exercise 2's allocator): slots of every declared size, and an empty pool
    alloc, record = live(ContiguousAllocator, 200_000, kv_bytes_per_token=KV_MHA), {}
    for sid, size in enumerate((512, 4096, 32_768, 512, 4096, 512)):
        held = rng.randint(1, size)
        final = rng.choice((None, rng.randint(held, size)))
        alloc.allocate(sid, size, num_tokens=held, final_tokens=final)
        record[sid] = [size, held, final]
    cases.append((alloc, 200_000 * KV_MHA + 123_456, record, KV_MHA))
    cases.append((live(ReserveToMaxAllocator, int(BUDGET // KV_MHA), 4096, kv_bytes_per_token=KV_MHA), BUDGET, {},
                   KV_MHA))
    for alloc, budget, record, kv in cases:
        slots = list(record.values())
        never = _never_filled(slots)
        want = never * kv / budget
        unfilled = sum(size - length for size, length, _ in slots)  # the tokens still to come counted as waste
        reserved = sum(size for size, _, _ in slots)
        unclamped = sum(size - max(length, length if final is None else final) for size, length, final in slots)
        wrong = [(unfilled * kv / budget, "That counts the positions the sequences will still fill (their tokens not "
                  "yet generated, up to `.final`): §10.2's third waste, which any allocator must find room for. "
                  "Internal fragmentation is what they never fill."),
                 (unclamped * kv / budget, "A sequence headed past its slot (`.final` > `.size`) fills all of it and "
                  "is stopped there: its slot leaves nothing unfilled, not a negative amount."),
                 (reserved * kv / budget, "That is everything the slots reserve, the tokens they hold included."),
                 (1 - sum(length for _, length, _ in slots) * kv / budget, "That is everything not holding tokens, the "
                  "free space outside the slots included; internal fragmentation is inside a sequence's own slot."),
                 (never / reserved if reserved else None, "That is a share of the slots' reservation; the question is "
                  "a share of the whole KV budget."),
                 (never * KV_MHA / budget, f"That converts with {_WHOSE} {KV_MHA:,} B per token; this allocator's "
                  "bytes per token are `alloc.kv_bytes_per_token`."),
                 (100 * want, "Return a fraction (0.8405 for 84.05%), not a percentage.")]
        mistakes = distinct_mistakes(want, wrong, rel=1e-9, floor=1.0)  # the slips that differ on this allocator
        yield case(alloc, budget, want=want, rel_tol=1e-9, abs_tol=1e-15, mistakes=mistakes,
                   what=f"internal_share(<allocator with {len(record)} live sequences>, budget_bytes={budget:,})")


# the tokens held while the OUTPUT steps run: PROMPT ... PROMPT + OUTPUT - 1 (575.5 on average for the lecture)
def _life_mean(g) -> float:
    return sum(range(g.PROMPT, g.PROMPT + g.OUTPUT)) / g.OUTPUT


value(
    "2.4", "Utilization averaged over a sequence's life",
    expected=lambda g: _slots(g, g.S_MAX, _kv(g)) * _life_mean(g) * _kv(g) / _budget(g),
    rel_tol=1e-5,  # the reading the prompt names: before each step's token lands (PROMPT ... PROMPT + OUTPUT - 1)
    hint="A busy card's slot holds a sequence at some random moment of its life: what does the budget hold on "
         "average over those moments? Step a full allocator through its decode steps and read it while each runs.",
    mistakes=distinct_mistakes(_slots(G, G.S_MAX, KV_MHA) * _life_mean(G) * KV_MHA / BUDGET, rel=1e-5, found=[
              (_util(G, G.S_MAX, KV_MHA), "That is the end of life, every sequence at PROMPT + OUTPUT tokens: 2.3's "
               "reading. Average over the steps instead."),
              (_life_mean(G) / G.S_MAX, "That is one slot's mean occupancy; utilization is over the whole budget, "
               "which the whole slots do not quite fill."),
              (_slots(G, G.S_MAX, KV_MHA) * G.PROMPT * KV_MHA / BUDGET, "That is the start of life, the prompt alone."),
              (_slots(_G_GIB, G.S_MAX, KV_MHA) * _life_mean(G) * KV_MHA / _GIB_RESERVE, _GIB_REMARK),
              (_slots(G, G.S_MAX, KV_MHA) * (_life_mean(G) + 1) * KV_MHA / BUDGET, "That reads each step after its "
               "token lands; read it while the step runs, before the new token is appended."),
              (_slots(G, G.S_MAX, KV_MHA) * _life_mean(G) * KV_MHA / PRINTED_BUDGET, "That is over "
               + ("the lecture's printed" if LECTURE_CARD else "the budget rounded to") + f" {PRINTED_BUDGET / 1e9:g} "
               f"GB; the exact budget is {BUDGET / 1e9:g}e9 B.")]),
    forbid=("labsupport.ledger.naive_utilization_time_avg",),
    derive="step the allocator's sequences through their decode steps and average the utilization you read",
)


def _naive_tok_s(g, seq_tokens=None, bw=None) -> float:
    kv, b = _kv(g), _slots(g, g.S_MAX, _kv(g))
    seq_tokens = g.PROMPT + g.OUTPUT if seq_tokens is None else seq_tokens
    return b / ((g.PARAMS * g.DTYPE_BYTES + b * seq_tokens * kv) / (g.HBM_BW if bw is None else bw))


value(
    "2.5", "Decode throughput of the naive batch",
    expected=lambda g: _naive_tok_s(g), rel_tol=1e-3,
    hint="Follow one decode step. To produce the next token of every sequence in the batch, what must it bring in "
         "from HBM, and which of those bytes does the whole batch share? A memory-bound step lasts as long as "
         "those reads take. How many tokens does one step give, and how many sequences does the naive allocator "
         "let into the batch?",
    mistakes=distinct_mistakes(_naive_tok_s(G), rel=1e-3, found=[
              (_slots(G, G.S_MAX, KV_MHA) / (G.PARAMS * G.DTYPE_BYTES / G.HBM_BW), "The step also reads each "
               "sequence's KV, not only the weights."),
              (_naive_tok_s(G, G.S_MAX), "The kernel reads the tokens a sequence holds, not its whole reserved slot."),
              (_naive_tok_s(G, bw=G.HBM_BW * 2**30 / 10**9), f"That reads {G.HBM_BW / 1e9:,.0f} GB/s as GiB/s; a "
               "card's bandwidth is decimal, 10**9 bytes per GB."),
              (_naive_tok_s(_G_GIB), _GIB_REMARK + f" It leaves {_slots(_G_GIB, G.S_MAX, KV_MHA, _GIB_RESERVE)} slots, "
               f"not {_slots(G, G.S_MAX, KV_MHA)}.")]),
    unit=" tok/s",
    # slo.three_columns (viz.slo imports it too): §10.6's table, whose naive column is this batch's throughput on
    # the givens' model and card (found by tests/test_one_call_answers.py)
    forbid=("labsupport.ledger.tpot_s", "labsupport.ledger.throughput_tok_s", _SLOTS, "labsupport.slo.three_columns",
            "labsupport.viz.slo.three_columns"),
    derive="write the step's bytes (weights plus every sequence's KV) over the bandwidth, then B over that time",
)

def _rtm_util(budget, s_max: int, seq: int, kv: int) -> float:
    """Reserve-to-max utilization, by hand: whole slots in the budget, each holding min(seq, s_max) tokens."""
    return (budget // (s_max * kv)) * min(seq, s_max) * kv / budget


@function(
    "2.6", "Reserve-to-max utilization, for any limit, model and budget",
    hint="Fill the budget the way the allocator does: how many slots of s_max positions does it admit (can a "
         "fraction of a slot hold a sequence?), and how many tokens does each hold, when a slot cannot grow? "
         "Utilization is the bytes of those tokens over the whole budget. Try a limit whose slot is larger than the "
         "budget, and a sequence longer than its slot.",
    forbid=_UTIL + ("labsupport.ledger.slot_occupancy", "labsupport.measure.fragmentation.fill_reserve_to_max",
                    "labsupport.measure.fragmentation.naive_measurement"),
    derive="count the slots the budget holds and the tokens each holds yourself",
    name="reserve_to_max_utilization",
)
def _reserve_to_max_utilization(rng: random.Random):
    """The lecture's long-context advertisement first (its 1.9%), then its other readings (§10.2's 15.2%, Exercise
    1's MHA brochure that admits nobody on the lecture's card and its GQA-8 0.39%, a limit shorter than the
    sequence), on the course card's givens; then budgets, limits and models the lab never shows; the wants by hand
    (`_rtm_util`)."""
    lecture = [(BUDGET, G.S_MAX_LONG, SEQ, KV_MHA), (BUDGET, G.S_MAX, SEQ, KV_MHA),
               (BUDGET, G.S_MAX_BROCHURE, SEQ, KV_MHA), (BUDGET, G.S_MAX_BROCHURE, SEQ, KV_GQA8),
               (BUDGET, 512, SEQ, KV_MHA)]
    drawn = []
    for _ in range(8):
        kv = 2 * rng.randint(1, 96) * rng.choice((1, 2, 4, 8, 32)) * rng.choice((64, 80, 128, 256)) * rng.choice((1, 2))
        s_max = rng.choice((256, 1000, 2048, 4096, 8192, 32_768, 131_072))
        slots = rng.choice((0, 1, 2, 3, 7, 29, rng.randint(1, 500)))
        budget = slots * s_max * kv + rng.choice((0, rng.randrange(1, s_max * kv)))  # an exact fit, or a remainder
        if budget:
            drawn.append((budget, s_max, rng.choice((1, rng.randint(2, s_max), s_max, s_max + rng.randint(1, 9_000))),
                          kv))
    lecture_slips = {  # the lecture's own readings of its two examples, each given its remark
        (G.S_MAX_LONG, KV_MHA): [(0.019, "The lecture prints 1.9%: one slot's occupancy, 640 of 32,768 positions "
                                  "(1.95%), cut short. Utilization is over the whole budget, which holds whole slots "
                                  "only.")],
    }
    if LECTURE_CARD:  # these two are readings of the lecture's H100 and 7B: another card's answers are elsewhere
        lecture_slips[G.S_MAX, KV_MHA] = [(0.152, "The lecture prints 15.2%: 9.5 of 62.5 GB, with 512 KiB read as "
                                           "512,000 B. At 524,288 B a token, over 62.52 GB, it is a little more.")]
        lecture_slips[G.S_MAX_BROCHURE, KV_GQA8] = [(0.0039, "The lecture's 0.39% takes 128 KiB as 128,000 B (0.082 "
                                                     "GB a sequence); 640 x 131,072 B is 0.0839 GB.")]
    for budget, s_max, seq, kv in lecture + drawn:
        want = _rtm_util(budget, s_max, seq, kv)
        slots = budget // (s_max * kv)
        wrong = [(min(seq, s_max) / s_max, "That is one slot's occupancy (the lecture's per-slot reasoning), which is "
                  "also what a fraction of a slot counted gives. The budget holds whole slots only, and what no whole "
                  "slot can use holds no token."),
                 (slots * seq * kv / budget, "A slot cannot grow: a sequence longer than s_max holds s_max tokens and "
                  "stops there."),
                 (max(1, slots) * min(seq, s_max) * kv / budget, "No slot fits in this budget: the allocator admits "
                  "nobody, and utilization is 0."),
                 (slots * min(seq, s_max) * (kv // 1024 * 1000) / budget, "That takes a KiB as 1,000 B; the bytes per "
                  "token are kv_bytes, as given."),
                 (100 * want, "Return a fraction (0.0161 for 1.61%), not a percentage.")]
        wrong += lecture_slips.get((s_max, kv), []) if budget == BUDGET and seq == SEQ else []
        mistakes = distinct_mistakes(want, wrong, rel=1e-9, floor=1e-6)
        yield case(budget, s_max, seq, kv, want=want, rel_tol=1e-9, abs_tol=1e-15, mistakes=mistakes)


def _long_context_cost(g, budget=None) -> float:
    return _slots(g, g.S_MAX, _kv(g), budget) / _slots(g, g.S_MAX_LONG, _kv(g), budget)


value(
    "2.7", "What advertising long context costs in concurrency",
    expected=lambda g: _long_context_cost(g), rel_tol=1e-4,
    hint="The service sells sequences served at once. How many chat sequences does the card hold at each limit, "
         "when only a whole slot holds one? The slot grows by the ratio of the limits; does the count fall by the "
         "same ratio?",
    mistakes=distinct_mistakes(_long_context_cost(G), rel=1e-4, found=[
              (G.S_MAX_LONG / G.S_MAX, "That is the lecture's reasoning, 'the slot grew 8x': true of one slot, not of "
               "the card. The budget holds whole slots, and the remainder no whole slot can use grows with the slot."),
              (_long_context_cost(_G_GIB, _GIB_RESERVE), _GIB_REMARK),
              (1 / _long_context_cost(G), "That is the factor upside down: give how many times fewer sequences "
               "the card serves at S_MAX_LONG, a number above 1."),
              (_slots(G, G.S_MAX, KV_MHA) / (BUDGET / (G.S_MAX_LONG * KV_MHA)), "That counts a fraction of a long "
               "slot; only whole slots hold a sequence."),
              ((BUDGET / (G.S_MAX * KV_MHA)) / _slots(G, G.S_MAX_LONG, KV_MHA), "That counts a fraction of a slot at "
               "S_MAX; only whole slots hold a sequence.")]),
    forbid=_UTIL,
    derive="count the whole slots the budget holds at each limit yourself (or read two utilizations of your own 2.6)",
)

value(
    "2.8", "Exercise 1: what the brochure cost",
    expected=lambda g: _brochure_cost(g),
    rel_tol=5e-5,  # 745 / 3 = 248.33 exactly; 248.0 is the sketch's approximate 744 / 3, not this answer
    hint="Compare two concurrencies of the same GQA model and the same PROMPT + OUTPUT-token sequences: paged (whole "
         "BLOCK-token blocks per sequence, whole blocks in the budget) against reserve-to-max at S_MAX_BROCHURE. The "
         "cost is their ratio.",
    mistakes=distinct_mistakes(_brochure_cost(G), rel=5e-5, found=[
              *([(744 / 3, "744 is the sketch's approximate count (≈ 744); count the whole "
                 f"{G.BLOCK * KV_GQA8 / MiB:g} MiB blocks exactly.")] if LECTURE_CARD else []),  # the lecture's H100
              ((BUDGET / (SEQ * KV_GQA8)) / _slots(G, G.S_MAX_BROCHURE, KV_GQA8),
               "That divides the budget by the sequence's bytes without flooring: paged concurrency counts whole "
               "sequences, each holding whole blocks, in whole blocks of the pool."),
              (_paged(G, KV_MHA) / _slots(G, G.S_MAX, KV_MHA), "That is the MHA model at S_MAX; this part is "
               "GQA against the brochure's reservation."),
              (_paged(_G_GIB, KV_GQA8) / _slots(_G_GIB, G.S_MAX_BROCHURE, KV_GQA8), _GIB_REMARK)]),
    forbid=("labsupport.ledger.paged_concurrency", _SLOTS),
    derive="count the GQA paged sequences and the brochure slots in the budget yourself, then take the ratio",
)


def _mix(g):  # Exercise 2's declared S_max values and their shares of requests
    return ((g.S_MAX_SHORT, g.SHARE_SHORT), (g.S_MAX, 1 - g.SHARE_SHORT - g.SHARE_LONG), (g.S_MAX_LONG, g.SHARE_LONG))


def _estimate(budget, mix, kv) -> float:
    """Exercise 2's mean concurrency, by hand: the budget over what a request reserves on average."""
    return budget / sum(share * s_max * kv for s_max, share in mix)


@function(
    "2.9", "Exercise 2: how many requests a budget holds, on average",
    hint="Picture the card full of residents that arrived in the mix's proportions. What does one of them reserve, "
         "on average, in bytes? Then how many of those does the budget take? Each declared size counts as often as "
         "requests declare it, and the requests share one budget.",
    forbid=("labsupport.ledger.batch_that_fits", _SLOTS, _SLOT_BYTES),
    derive="work out what a request reserves on average and divide the budget by it yourself",
    name="concurrency_estimate",
)
def _concurrency_estimate(rng: random.Random):
    """The lecture's mix first (its ≈ 39), then one size alone, then mixes, models and budgets the lab never shows;
    a whole number within one request of the estimate passes (its floor or its round)."""
    cases = [(BUDGET, [list(pair) for pair in _mix(G)], KV_MHA), (BUDGET, [[G.S_MAX, 1.0]], KV_MHA),
             (BUDGET, [[G.S_MAX_LONG, 0.05], [G.S_MAX_SHORT, 0.7], [G.S_MAX, 0.25]], KV_GQA8)]
    for _ in range(6):
        sizes = rng.sample((128, 256, 512, 1000, 2048, 4096, 8192, 16_384, 32_768, 65_536), rng.randint(2, 4))
        weights = [rng.randint(1, 19) for _ in sizes]
        mix = [[s, w / sum(weights)] for s, w in zip(sizes, weights)]
        kv = 2 * rng.randint(1, 80) * rng.choice((1, 2, 4, 8, 32)) * rng.choice((64, 128, 256)) * rng.choice((1, 2))
        mean = sum(p * s * kv for s, p in mix)
        cases.append((int(mean * rng.uniform(5, 400)) + max(s for s in sizes) * kv, mix, kv))  # the largest fits
    for budget, mix, kv in cases:
        want = _estimate(budget, mix, kv)
        wrong = [(budget / (sum(s for s, _ in mix) / len(mix) * kv), "That weights every declared size equally; "
                  "weight each by its share of requests."),
                 (sum(p * (budget // (s * kv)) for s, p in mix), "That averages separate pools, each full of one size; "
                  "the requests share one budget, so divide it by what a request reserves on average."),
                 (budget / (max(s for s, _ in mix) * kv), "That is everyone reserving the largest declared S_max."),
                 (budget / sum(p * s for s, p in mix), "That counts token positions, not bytes: each position costs "
                  "kv_bytes."),
                 (sum(p * s * kv for s, p in mix), "That is what a request reserves on average, in bytes: how many "
                  "of those does the budget hold?")]
        mistakes = [(w, r) for w, r in wrong if abs(w - want) > 1.5]  # outside the one request a whole count may miss
        yield case(budget, mix, kv, want=want, rel_tol=0.0, abs_tol=1.0, mistakes=mistakes,
                   what=f"concurrency_estimate({budget:,}, {mix!r}, {kv:,})" if len(repr(mix)) < 80 else "")


def _long_share(g) -> float:
    return g.SHARE_LONG * g.S_MAX_LONG / sum(share * s_max for s_max, share in _mix(g))


value(
    "2.10", "Exercise 2: who holds the memory",
    expected=lambda g: _long_share(g), rel_tol=1e-4,
    hint="Residents finish at random, whatever they declared, so at any moment they come in the arrivals' proportions. "
         "Of what they reserve together, how much do the long ones reserve? A share of requests is not a share of "
         "memory.",
    mistakes=[(G.SHARE_LONG, "That is the long requests' share of the requests; the question is their share of the "
               "memory, and each reserves a far larger slot."),
              (G.S_MAX_LONG / sum(s for s, _ in _mix(G)), "That weights every declared size equally; requests declare "
               "them in the mix's proportions."),
              (1 - _long_share(G), "That is what everyone else holds.")],
    derive="weigh the long requests' reservations against what all the residents reserve",
)

EVENTS = ("refused with enough free in total", "stopped at its own reservation", "a partly empty last block",
          "no room for the next token")

choice(
    "2.11", "Four failures, in a paged cache",
    answer={"a partly empty last block", "no room for the next token"},
    options=EVENTS,
    hint="Replay each event with a pool of fixed-size blocks, any free block serving any sequence, a sequence taking "
         "one more only when its last is full. Which events need a free run of a certain shape or a per-sequence "
         "limit, and which only need the pool to be short of blocks, or a sequence's length not a whole block?",
    mistakes={"refused with enough free in total": "Is any free block ever the wrong size or in the wrong place "
                                                   "for a request?",
              "stopped at its own reservation": "Does a paged sequence have a reservation to outgrow?"},
)

value(
    "2.12", "The most a sequence's last block leaves unfilled",
    expected=lambda g: (g.BLOCK - 1) * _kv(g),
    hint="A paged cache gives a sequence whole blocks of BLOCK tokens, one more each time the last fills. At worst, "
         "how many positions of the last block are empty while the sequence lives, and how many bytes are they?",
    mistakes=[(G.BLOCK * KV_MHA, "A whole block is never empty: a sequence takes its last block only for a token it "
               "stores there, so at least one position is filled."),
              (G.BLOCK * KV_MHA / 2, "That is the average tail over many lengths; the question is the worst case."),
              ((G.BLOCK - 1) * KV_MHA // 1024 * 1000, f"{KV_MHA / KiB:g} KiB per token is {KV_MHA:,} B, not "
               f"{KV_MHA // 1024 * 1000:,} B."),
              (G.BLOCK - 1, "That is the count of positions; give their bytes.")],
    unit=" B",
    forbid=(_SLOT_BYTES, "labsupport.ledger.tail_waste_tokens"),
    derive="multiply the worst-case empty positions of the last block by the KV bytes per token",
)


@function(
    "2.13", "Admission: where a new slot goes",
    hint="Walk the free holes in address order. A slot is one contiguous run, so only a hole at least as large as "
         "the request can take it, whatever the free memory adds up to; the real allocator takes the first such "
         "hole and puts the slot at its start.",
    forbid=("labsupport.contiguous.ContiguousAllocator.fits", "labsupport.contiguous.ContiguousAllocator.allocate",
            "labsupport.contiguous.ContiguousAllocator._first_fit"),
    derive="walk the holes yourself and return the offset the slot starts at, or None",
    name="place_slot",
)
def _place_slot(rng: random.Random):
    """Holes of real allocators mid-serve (reserve-to-max, then per-request S_max); the offset the real allocator's
    first fit picks, or None where no hole holds the request (enough free in total or not)."""
    configs = [(int(BUDGET // KV_MHA), (G.S_MAX,)), (200_000, (512, 4096, 32_768)),
               (rng.randint(5_000, 60_000), (rng.randint(10, 300), rng.randint(300, 3_000), rng.randint(3_000, 9_000)))]
    for capacity, sizes in configs:
        real = ContiguousAllocator(capacity)
        for step in range(120):
            if rng.random() < 0.7 or not real.slots:
                try:
                    real.allocate(step, rng.choice(sizes))
                except OutOfBlocks:  # a third of the live slots finish (none live: the ask outgrows the space)
                    live = sorted(real.slots)
                    for sid in rng.sample(live, min(len(live), max(1, len(live) // 3))):
                        real.free(sid)
            else:
                real.free(rng.choice(sorted(real.slots)))
            if step % 8:
                continue
            holes, ask = real.holes(), rng.choice(sizes) if step % 16 else max(sizes)  # the largest: often refused
            i = real._first_fit(ask)  # the real allocator's own choice
            want = None if i is None else holes[i][0]
            fitting = [(o, h) for o, h in holes if h >= ask]
            mistakes = []
            if fitting and min(fitting, key=lambda x: x[1])[0] != want:
                mistakes.append((min(fitting, key=lambda x: x[1])[0], "That is the smallest hole that holds it (best "
                                 "fit); the allocator takes the first one, in address order."))
            if fitting and fitting[0][1] > ask:
                mistakes.append((fitting[0][0] + fitting[0][1] - ask, "That is the end of the hole; the slot starts "
                                 "at the hole's start."))
            if want is None and holes:
                mistakes.append((holes[0][0], "No hole holds it in one piece: refuse (None), however much is free in "
                                 "total."))
            yield case([list(h) for h in holes], ask, want=want, mistakes=mistakes,
                       what=f"place_slot(<{len(holes)} holes, {sum(h for _, h in holes):,} free>, {ask:,})")
    yield case([], G.S_MAX, want=None, what=f"place_slot([], {G.S_MAX:,})")  # a full address space
    yield case([[0, G.S_MAX]], G.S_MAX, want=0, what=f"place_slot([[0, {G.S_MAX:,}]], {G.S_MAX:,})")  # an exact fit


value(
    "2.14", "Exercise 2: the memory free at the refusal",
    expected=lambda g: _fragmented_run(g).free_tokens * _kv(g),
    hint="The run stops at the first medium request refused while the free memory would hold it. Read the address "
         "space at that moment: what is free, in bytes, wherever it lies?",
    mistakes=[(_fragmented_run(G).largest_hole_tokens * KV_MHA, "That is the largest hole alone; the question is "
               "everything free, all of it in holes too small for the request."),
              (_fragmented_run(G).free_tokens, "That counts token positions; give their bytes."),
              (G.S_MAX * KV_MHA, "That is what the request needs, not what is free.")],
    unit=" B",
    forbid=("labsupport.viz.memory.address_space_figure",),
    derive="read what is free at the refusal off the run's allocator, in bytes",
)
