"""Lab 02 checkoffs: the naive allocator and where 86% of the cache goes (§10.2, Exercises 1 and 2).

Values are multiplied out from the givens here, never read from labsupport.ledger; mistakes are the lecture's.
"""
from __future__ import annotations

import math
import random

from labsupport.contiguous import ContiguousAllocator, ReserveToMaxAllocator
from labsupport.course.checkoffs._hidden import givens_kv as _kv
from labsupport.course.data import live
from labsupport.fragmentation import run_until_fragmented
from labsupport.memory_stats import OutOfBlocks
from labsupport.course.registry import DRAW_TRIES, case, choice, function, givens, namespace, value


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
                and _every_step_counts(n) and _fragmented_run(n) is not None):
            return g
    return None


def _every_step_counts(n) -> bool:
    """Each step a prompt names moves the answer on these givens by more than its checkoff's tolerance (item 4):
    slots that do not fill the budget exactly, sequences that are not whole blocks, a mean concurrency that the
    average of three pools misses by more than one request."""
    kv, budget = _kv(n), _budget(n)
    frac = lambda x: abs(x - round(x)) > 1e-3 * x  # noqa: E731
    mix = ((n.S_MAX_SHORT, n.SHARE_SHORT), (n.S_MAX, 1 - n.SHARE_SHORT - n.SHARE_LONG), (n.S_MAX_LONG, n.SHARE_LONG))
    mean_slot = sum(p * s * kv for s, p in mix)
    pools = sum(p * (budget // (s * kv)) for s, p in mix)
    return (frac(budget / (n.S_MAX * kv)) and frac(budget / (n.S_MAX_LONG * kv))
            and frac(budget / (n.S_MAX_BROCHURE * _kv(n, n.GQA_KV_HEADS))) and (n.PROMPT + n.OUTPUT) % n.BLOCK
            and abs(budget / mean_slot - pools) > 2)


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


_FALLBACKS = (dict(HBM_BYTES=48 * 10**9, PARAMS=2_927_000_000, DTYPE_BYTES=1, RESERVE_BYTES=5 * 10**9, LAYERS=16,
                   KV_HEADS=48, GQA_KV_HEADS=4, HEAD_DIM=256, HBM_BW=1_555 * 10**9, PROMPT=1805, OUTPUT=225,
                   S_MAX=2_048, S_MAX_LONG=65_536, S_MAX_BROCHURE=1_048_576, BLOCK=32, S_MAX_SHORT=256,
                   SHARE_SHORT=0.5, SHARE_LONG=0.1),
              dict(HBM_BYTES=48 * 10**9, PARAMS=9_954_000_000, DTYPE_BYTES=1, RESERVE_BYTES=8 * 10**9, LAYERS=16,
                   KV_HEADS=48, GQA_KV_HEADS=4, HEAD_DIM=256, HBM_BW=4_800 * 10**9, PROMPT=1388, OUTPUT=361,
                   S_MAX=8_192, S_MAX_LONG=16_384, S_MAX_BROCHURE=262_144, BLOCK=32, S_MAX_SHORT=256,
                   SHARE_SHORT=0.5, SHARE_LONG=0.02))
G = givens(hidden=_hidden, fallbacks=_FALLBACKS)  # the lecture's: solutions/02_naive_allocator.py's givens cell

KV_MHA = _kv(G)  # 524,288 B: the lecture's 7B, every layer and head, K and V, bf16
KV_GQA8 = _kv(G, G.GQA_KV_HEADS)  # 131,072 B: the same model with 8 KV heads
BUDGET = _budget(G)  # 62,520,000,000 B of KV on an 80 GB H100
SEQ = G.PROMPT + G.OUTPUT
PRINTED_BUDGET = 62_500_000_000  # the lecture's board writes the budget as 62.5 GB
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


_G_GIB = namespace(dict(vars(G), RESERVE_BYTES=4 * 2**30))  # the lecture's givens with the reserve read as 4 GiB
_GIB_RESERVE = _budget(_G_GIB)  # its budget: 28 slots
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
              ((G.S_MAX - SEQ) * KV_MHA // 1024 * 1000, "512 KiB per token is 524,288 B, not 512,000 B: a KiB is "
               "1,024 bytes."),
              ((G.S_MAX - SEQ) * KV_MHA // 2, "Count both tensors: every layer keeps a key and a value per KV head.")],
    unit=" B",
    forbid=(_SLOT_BYTES,),
    derive="multiply the slot's unfilled positions by the KV bytes per token",
)

value(
    "2.2", "Internal fragmentation, as a share of the KV budget",
    expected=lambda g: _internal(g), rel_tol=1e-4,
    hint="What is on the card besides KV, and what can a fraction of a slot hold? Picture the budget filled with "
         "slots, every sequence at its last token: which bytes are promised and empty? Give a fraction of the budget.",
    mistakes=[(_internal(G, _GIB_RESERVE), "That reads the 4 GB reserve as 4 GiB (4,294,967,296 B): 28 slots instead "
               "of 29. The reserve, like the card, is decimal GB."),
              (_slots(G, G.S_MAX, KV_MHA, _GIB_RESERVE) * (G.S_MAX - SEQ) * KV_MHA / BUDGET,
               "That counts 28 slots, a 4 GiB reserve, over the 4 GB budget: the reserve is decimal GB."),
              ((G.S_MAX - SEQ) / G.S_MAX, "That is one slot's empty share (or a fraction of a slot counted: only "
               "whole slots fit, so round the count down); the budget also has a remainder no slot can use, so "
               "over the budget it is a little less."),
              (1 - _util(G, G.S_MAX, KV_MHA), "That is everything not holding tokens, the remainder no whole slot can "
               "use included; internal fragmentation is the empty space inside the slots."),
              (_internal(G, PRINTED_BUDGET), "That is on the lecture's printed 62.5 GB; the exact budget is "
               "80e9 - 13.48e9 - 4e9 = 62.52e9 B."),
              (((80 * 10**9 - 4 * 10**9) // (G.S_MAX * KV_MHA)) * (G.S_MAX - SEQ) * KV_MHA / BUDGET,
               "The weights live in HBM too: subtract them before counting slots.")],
    forbid=_UTIL,
    derive="count the whole slots in the budget and add up the positions they reserve and never fill",
)


@function(
    "2.3", "Utilization, measured over a live allocator",
    hint="Utilization counts bytes that hold real tokens — what each live sequence has stored so far, not the slot it "
         "reserved — over the whole KV budget. The allocator knows its live slots (`alloc.slots`, a dict of `Slot`s "
         "with `.length` and `.size`) and its bytes per token (`alloc.kv_bytes_per_token`).",
    forbid=("labsupport.contiguous.ContiguousAllocator.stats", "labsupport.fragmentation.naive_measurement",
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


# the tokens held while the OUTPUT steps run: PROMPT ... PROMPT + OUTPUT - 1 (575.5 on average for the lecture)
def _life_mean(g) -> float:
    return sum(range(g.PROMPT, g.PROMPT + g.OUTPUT)) / g.OUTPUT


value(
    "2.4", "Utilization averaged over a sequence's life",
    expected=lambda g: _slots(g, g.S_MAX, _kv(g)) * _life_mean(g) * _kv(g) / _budget(g),
    rel_tol=1e-5,  # the reading the prompt names: before each step's token lands (PROMPT ... PROMPT + OUTPUT - 1)
    hint="A busy card's slot holds a sequence at some random moment of its life: what does the budget hold on "
         "average over those moments? Step a full allocator through its decode steps and read it while each runs.",
    mistakes=[(_util(G, G.S_MAX, KV_MHA), "That is the end of life, every sequence at PROMPT + OUTPUT tokens: 2.3's "
               "reading. Average over the steps instead."),
              (_life_mean(G) / G.S_MAX, "That is one slot's mean occupancy; utilization is over the whole budget, "
               "which the whole slots do not quite fill."),
              (_slots(G, G.S_MAX, KV_MHA) * G.PROMPT * KV_MHA / BUDGET, "That is the start of life, the prompt alone."),
              (_slots(_G_GIB, G.S_MAX, KV_MHA) * _life_mean(G) * KV_MHA / _GIB_RESERVE, _GIB_REMARK),
              (_slots(G, G.S_MAX, KV_MHA) * (_life_mean(G) + 1) * KV_MHA / BUDGET, "That reads each step after its "
               "token lands; read it while the step runs, before the new token is appended."),
              (_slots(G, G.S_MAX, KV_MHA) * _life_mean(G) * KV_MHA / PRINTED_BUDGET, "That is over the lecture's "
               "printed 62.5 GB; the exact budget is 62.52e9 B.")],
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
    hint="A memory-bound decode step reads every weight once plus every resident sequence's KV; its time is those "
         "bytes over the HBM bandwidth, and it yields one token per sequence. Use the batch the naive allocator "
         "permits and the full PROMPT + OUTPUT-token sequences.",
    mistakes=[(_slots(G, G.S_MAX, KV_MHA) / (G.PARAMS * G.DTYPE_BYTES / G.HBM_BW), "The step also reads each "
               "sequence's KV, not only the weights."),
              (_naive_tok_s(G, G.S_MAX), "The kernel reads the tokens a sequence holds, not its whole reserved slot."),
              (_naive_tok_s(G, bw=G.HBM_BW * 2**30 / 10**9), "That reads 3,350 GB/s as GiB/s; a card's bandwidth is "
               "decimal, 10**9 bytes per GB."),
              (_naive_tok_s(_G_GIB), _GIB_REMARK + " It leaves 28 slots, not 29.")],
    unit=" tok/s",
    # slo.three_columns (viz.slo imports it too): §10.6's table, whose naive column is this batch's throughput on
    # the givens' model and card (found by tests/test_one_call_answers.py)
    forbid=("labsupport.ledger.tpot_s", "labsupport.ledger.throughput_tok_s", _SLOTS, "labsupport.slo.three_columns",
            "labsupport.viz.slo.three_columns"),
    derive="write the step's bytes (weights plus every sequence's KV) over the bandwidth, then B over that time",
)

value(
    "2.6", "Utilization at the long-context S_max",
    expected=lambda g: _util(g, g.S_MAX_LONG, _kv(g)), rel_tol=1e-4,
    hint="The allocator is the same, the slot bigger, the sequences unchanged. How many of them can the budget hold "
         "now, and what do they hold? Give a fraction of the budget.",
    mistakes=[(SEQ / G.S_MAX_LONG, "That is one slot's occupancy (the lecture's reasoning, 1.95%), which is also what "
               "a fraction of a slot counted gives. Utilization is over the whole budget, and the budget holds a "
               "whole number of slots (round down), with a remainder no slot can use."),
              (0.019, "The lecture prints 1.9%: one slot's occupancy, 640 / 32,768 = 1.95%, cut short. Compute "
               "utilization over the budget."),
              (_util(G, G.S_MAX, KV_MHA), "That is the S_MAX figure, not S_MAX_LONG's."),
              (_util(G, G.S_MAX_LONG, KV_MHA, PRINTED_BUDGET), "That is on the lecture's printed 62.5 GB budget; the "
               "exact one is 80e9 - 13.48e9 - 4e9 = 62.52e9 B, and the slots' bytes are divided by it."),
              (_util(_G_GIB, G.S_MAX_LONG, KV_MHA), _GIB_REMARK)],
    forbid=_UTIL,
    derive="count the whole long slots in the budget and divide the bytes their tokens hold by the budget",
)

value(
    "2.7", "Exercise 1: GQA-8 utilization at the brochure's S_max",
    expected=lambda g: _util(g, g.S_MAX_BROCHURE, _kv(g, g.GQA_KV_HEADS)), rel_tol=1e-4,
    hint="Under MHA a brochure slot can be larger than the whole budget, so zero requests fit. With GQA_KV_HEADS KV "
         "heads each token costs less: size the slot, count the whole slots that fit, and divide the bytes their "
         "PROMPT + OUTPUT-token sequences hold by the budget. Give a fraction.",
    mistakes=[(0.0039, "The lecture's 0.39% takes 128 KiB as 128,000 B (0.082 GB per sequence); 640 x 131,072 B "
               "is 0.0839 GB."),
              (_slots(G, G.S_MAX_BROCHURE, KV_GQA8) * SEQ * 128_000 / BUDGET, "That takes 128 KiB per token as "
               "128,000 B; a KiB is 1,024 bytes."),
              (_util(G, G.S_MAX_BROCHURE, KV_GQA8, PRINTED_BUDGET), "That is on the lecture's printed 62.5 GB budget; "
               "the exact one is 62.52e9 B."),
              (_util(_G_GIB, G.S_MAX_BROCHURE, KV_GQA8), _GIB_REMARK),
              (0.0, "Zero is the MHA answer; this part is about the GQA-8 model.")],
    forbid=_UTIL,
    derive="size the GQA slot, count the whole slots in the budget and divide the bytes their tokens hold by it",
)

value(
    "2.8", "Exercise 1: what the brochure cost",
    expected=lambda g: _paged(g, _kv(g, g.GQA_KV_HEADS)) / _slots(g, g.S_MAX_BROCHURE, _kv(g, g.GQA_KV_HEADS)),
    rel_tol=5e-5,  # 745 / 3 = 248.33 exactly; 248.0 is the sketch's approximate 744 / 3, not this answer
    hint="Compare two concurrencies of the same GQA model and the same PROMPT + OUTPUT-token sequences: paged (whole "
         "BLOCK-token blocks per sequence, whole blocks in the budget) against reserve-to-max at S_MAX_BROCHURE. The "
         "cost is their ratio.",
    mistakes=[(744 / 3, "744 is the sketch's approximate count (≈ 744); count the whole 2 MiB blocks exactly."),
              ((BUDGET / (SEQ * KV_GQA8)) / _slots(G, G.S_MAX_BROCHURE, KV_GQA8),
               "That divides the budget by the sequence's bytes without flooring: paged concurrency counts whole "
               "sequences, each holding whole blocks, in whole blocks of the pool."),
              (_paged(G, KV_MHA) / _slots(G, G.S_MAX, KV_MHA), "That is the MHA model at S_MAX; this part is "
               "GQA against the brochure's reservation."),
              (_paged(_G_GIB, KV_GQA8) / _slots(_G_GIB, G.S_MAX_BROCHURE, KV_GQA8), _GIB_REMARK)],
    forbid=("labsupport.ledger.paged_concurrency", _SLOTS),
    derive="count the GQA paged sequences and the brochure slots in the budget yourself, then take the ratio",
)


def _mix(g):  # Exercise 2's declared S_max values and their shares of requests
    return ((g.S_MAX_SHORT, g.SHARE_SHORT), (g.S_MAX, 1 - g.SHARE_SHORT - g.SHARE_LONG), (g.S_MAX_LONG, g.SHARE_LONG))


def _mean_slot(g) -> float:
    return sum(share * s_max * _kv(g) for s_max, share in _mix(g))


value(
    "2.9", "Exercise 2: mean declared slot",
    expected=lambda g: _mean_slot(g), rel_tol=5e-4,
    hint="Each request reserves its own declared S_max at the model's KV bytes per token; requests of each size come "
         "in their shares. What does a request reserve on average, in bytes?",
    mistakes=[(1.586e9, "1.586 GB comes from the lecture's rounded slot sizes (0.268, 2.147, 17.2 GB); multiply "
               "the exact ones."),
              (sum(s for s, _ in _mix(G)) / 3 * KV_MHA, "That weights the three sizes equally; weight each by its "
               "share of requests."),
              (sum(share * min(SEQ, s) for s, share in _mix(G)) * KV_MHA, "That is what the requests fill; each "
               "reserves its declared S_max, not its tokens.")],
    unit=" B",
    forbid=(_SLOT_BYTES,),
    derive="weight each declared slot (S_max x KV bytes per token) by its share",
)

value(
    "2.10", "Exercise 2: mean concurrency",
    expected=lambda g: _budget(g) / _mean_slot(g),
    abs_tol=1.0,  # the ratio, or it floored or rounded to whole requests: all within 1 of the ratio
    hint="On average each resident request holds one mean declared slot: how many such requests does the budget hold? "
         "Compare it with everyone reserving S_MAX, and with paging.",
    mistakes=[(_slots(G, G.S_MAX, KV_MHA), "That is everyone reserving S_MAX; here each request declares its own."),
              (sum(share * (BUDGET // (s * KV_MHA)) for s, share in _mix(G)), "That averages three pools, each full "
               "of one size; the requests share one pool, so divide the budget by the mean slot.")],
    forbid=("labsupport.ledger.batch_that_fits", _SLOTS),
    derive="divide the budget by the mean declared slot (2.9's bytes) yourself",
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
              ((G.BLOCK - 1) * KV_MHA // 1024 * 1000, "512 KiB per token is 524,288 B, not 512,000 B."),
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
