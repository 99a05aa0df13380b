"""Lab 02's rewritten exercises (issue "Teaching truth, third pass"): each accepts two different correct
derivations, on the lecture's givens and on hidden ones, and rejects the plausible wrong answers with a
remark that names the mistake.

The lecture's numbers are worked out here by hand from the prose of §10.2, on the lecture's givens passed
explicitly (LECTURE): 80e9 B of HBM less 2 x 6.74e9 B of weights less a 4e9 B reserve leave 62.52e9 B of KV; a
token costs 2 x 32 x 32 x 128 x 2 = 524,288 B (MHA) or 131,072 B (GQA-8); 62.52e9 // (4,096 x 524,288) = 29 slots.
What the lab's graders pose by default (their first cases, their remarks) is on the course card: its givens (CARD)
are written here by hand from the card's spec fields, and the same formulas (`_ns`) give the expected numbers.
"""
from __future__ import annotations

import math
import random
import types

import pytest

from labsupport import card
from labsupport.contiguous import ContiguousAllocator, ReserveToMaxAllocator
from labsupport.measure.fragmentation import run_until_fragmented
from labsupport.course.checkoffs import get
from labsupport.course.judge import Mismatch, close
from labsupport.course.registry import GIVENS, case_rng, namespace

LECTURE = dict(HBM_BYTES=80 * 10**9, PARAMS=6_740_000_000, DTYPE_BYTES=2, RESERVE_BYTES=4 * 10**9, LAYERS=32,
               KV_HEADS=32, GQA_KV_HEADS=8, HEAD_DIM=128, HBM_BW=3_350 * 10**9, PROMPT=512, OUTPUT=128,
               S_MAX=4096, S_MAX_LONG=32_768, S_MAX_BROCHURE=131_072, BLOCK=16, S_MAX_SHORT=512,
               SHARE_SHORT=0.70, SHARE_LONG=0.05)


def _card_givens(gpu, model):
    """Lab 02's givens on a card, from its spec fields (as the givens cell's card= lines bind them): the model in MHA
    form, its GQA form's KV heads, the GPU's memory and bandwidth; the workload stays the lecture's."""
    c = card.Card(gpu, model)
    return dict(LECTURE, HBM_BYTES=gpu.hbm_bytes, PARAMS=round(c.mha.num_params), DTYPE_BYTES=c.mha.dtype_bytes,
                LAYERS=c.mha.num_layers, KV_HEADS=c.mha.num_kv_heads, GQA_KV_HEADS=c.gqa.num_kv_heads,
                HEAD_DIM=c.mha.head_dim, HBM_BW=gpu.hbm_bandwidth)


_C = card.card()
CARD = _card_givens(_C.gpu, _C.model)  # the course card's


def _sets():
    get("2.1")  # loads lab 02's graders
    own = [] if CARD == LECTURE else [CARD]
    return [LECTURE, *own, *GIVENS[2].draw(case_rng("givens", b"feedback test", "lab02"), 3)]


def _ns(g):
    g = types.SimpleNamespace(**g)
    g.kv = 2 * g.LAYERS * g.KV_HEADS * g.HEAD_DIM * g.DTYPE_BYTES
    g.kv_gqa = g.kv // g.KV_HEADS * g.GQA_KV_HEADS
    g.budget = g.HBM_BYTES - g.PARAMS * g.DTYPE_BYTES - g.RESERVE_BYTES
    g.seq = g.PROMPT + g.OUTPUT
    g.slots = g.budget // (g.S_MAX * g.kv)
    return g


K = _ns(CARD)  # the card's numbers by hand (the lecture's card: 524,288 B, 131,072 B, 62.52e9 B, 640 tokens, 29 slots)
KV, KV_GQA, BUDGET, SEQ = K.kv, K.kv_gqa, K.budget, K.seq


def test_the_labs_givens_are_the_cards():
    """The givens the graders pose by default are the card's spec fields (the lecture's on the lecture's card)."""
    get("2.1")
    assert GIVENS[2].lecture == CARD


def test_the_fallback_sets_differ_from_every_catalogue_cards_givens():
    """A grade whose draws never differ takes the fixed fallback sets, which must differ from the card's givens in
    every given whatever card course.toml names (the H200's 4.8 TB/s, an L40S's 48 GB, Qwen2.5's 4 KV heads)."""
    from labsupport.specs import GPUS, LECTURE_RESERVED_BYTES, MODELS

    get("2.1")
    fallbacks = GIVENS[2].fallbacks
    assert len(fallbacks) >= 2 and fallbacks[0] != fallbacks[1]
    cards = [(gpu, model) for gpu in set(GPUS.values()) for model in set(MODELS.values())
             if gpu.hbm_bytes - model.num_params * model.dtype_bytes - LECTURE_RESERVED_BYTES > 0]
    assert len(cards) > 10
    for gpu, model in cards:
        theirs = _card_givens(gpu, model)
        for f in fallbacks:
            assert set(f) == set(theirs)
            assert not [k for k in f if f[k] == theirs[k]], (gpu.name, model.name, f)


def _rtm_util(budget, s_max, seq, kv):
    """Reserve-to-max utilization by walking the budget: take a slot while one fits, then the tokens they hold."""
    slots, rest = 0, budget
    while rest >= s_max * kv:
        rest -= s_max * kv
        slots += 1
    return slots * min(seq, s_max) * kv / budget


def _estimate_by_bytes(budget, mix, kv):
    return budget / sum(p * s * kv for s, p in mix)


def _paged_by_blocks(g):
    """Paged concurrency by walking the pool: blocks per sequence, then whole sequences in the whole blocks."""
    per_seq = -(-g.seq // g.BLOCK)
    blocks = g.budget // (g.BLOCK * g.kv_gqa)
    return blocks // per_seq


def _paged_by_loop(g):
    from labsupport.block_allocator import BlockAllocator
    pool, n = BlockAllocator(g.budget // (g.BLOCK * g.kv_gqa), g.BLOCK), 0
    while pool.can_allocate(pool.blocks_needed(g.seq)):
        pool.allocate(n, g.seq)
        n += 1
    return n


# two derivations each: different arithmetic, the same quantity
DERIVATIONS = {
    "2.1": (lambda g: (g.S_MAX - g.seq) * g.kv, lambda g: g.S_MAX * g.kv - g.PROMPT * g.kv - g.OUTPUT * g.kv),
    "2.4": (lambda g: g.slots * sum(range(g.PROMPT, g.seq)) / g.OUTPUT * g.kv / g.budget,
            lambda g: g.slots * (g.PROMPT + (g.OUTPUT - 1) / 2) * g.kv / g.budget),
    "2.5": (lambda g: g.slots / ((g.PARAMS * g.DTYPE_BYTES + g.slots * g.seq * g.kv) / g.HBM_BW),
            lambda g: g.HBM_BW / (g.PARAMS * g.DTYPE_BYTES / g.slots + g.seq * g.kv)),
    # 2.7: the concurrency ratio of the two limits, or the ratio of two utilizations (each slot holds the same tokens)
    "2.7": (lambda g: (g.budget // (g.S_MAX * g.kv)) / (g.budget // (g.S_MAX_LONG * g.kv)),
            lambda g: _rtm_util(g.budget, g.S_MAX, g.seq, g.kv) / _rtm_util(g.budget, g.S_MAX_LONG, g.seq, g.kv)),
    "2.8": (lambda g: _paged_by_blocks(g) / (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa)),
            lambda g: _paged_by_loop(g) / (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa))),
    # 2.10: the long requests' reservations over everyone's, in tokens; or in bytes, with 2.9's mean slot
    "2.10": (lambda g: g.SHARE_LONG * g.S_MAX_LONG / sum(p * s for s, p in _mix(g)),
             lambda g: g.SHARE_LONG * g.S_MAX_LONG * g.kv / (g.budget / _estimate_by_bytes(g.budget, _mix(g), g.kv))),
    "2.12": (lambda g: (g.BLOCK - 1) * g.kv, lambda g: g.BLOCK * g.kv - g.kv),
    "2.14": (lambda g: _refusal(g).free_tokens * g.kv,
             lambda g: (g.budget // g.kv - sum(s.size for s in _refused_run(g).allocator.slots.values())) * g.kv),
}


@pytest.mark.parametrize("cid", list(DERIVATIONS))
def test_two_derivations_pass_on_the_lecture_and_on_hidden_givens(cid):
    checkoff = get(cid)
    for g in _sets():
        want = checkoff.expect(namespace(g))
        for derive in DERIVATIONS[cid]:
            checkoff.verdict(derive(_ns(g)), want)  # raises Mismatch if off


def test_the_lecture_values_by_hand():
    get("2.1")
    lecture = {cid: get(cid).expect(namespace(LECTURE)) for cid in DERIVATIONS}  # the lecture's givens, named
    assert lecture["2.1"] == 3_456 * 524_288 == 1_811_939_328
    assert lecture["2.4"] == pytest.approx(29 * 575.5 * 524_288 / 62.52e9, rel=1e-12)  # 14.00%
    assert lecture["2.5"] == pytest.approx(29 / ((13.48e9 + 29 * 640 * 524_288) / 3.35e12), rel=1e-12)  # 4,186
    assert lecture["2.7"] == pytest.approx(29 / 3)  # 29 slots of 4,096 against 62.52e9 // 17,179,869,184 = 3 of 32,768
    assert lecture["2.8"] == pytest.approx(745 / 3)  # 29,811 blocks // 40 = 745 over 3 slots of 17.18 GB
    # 2.10: 0.05 x 32,768 = 1,638.4 of 0.7 x 512 + 0.25 x 4,096 + 0.05 x 32,768 = 358.4 + 1,024 + 1,638.4 = 3,020.8
    assert lecture["2.10"] == pytest.approx(1_638.4 / 3_020.8, rel=1e-12)  # 54.24%
    assert lecture["2.12"] == 15 * 524_288
    assert lecture["2.14"] == 12_751 * 524_288  # the run of seed 0 at its refusal (test_2_14_the_lecture_run_by_hand)


def _problem(cid: str, answer) -> str:
    checkoff = get(cid)
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(answer, checkoff.prepare(case_rng(cid)))
    return str(err.value)


def _gib(g):
    """The budget with the 4 GB reserve read as 4 GiB (the lecture's card: 62,225,032,704 B, 28 slots)."""
    return g.HBM_BYTES - g.PARAMS * g.DTYPE_BYTES - 4 * 2**30


LECTURE_ONLY = "the lecture's own printed slip"
WRONG = [  # (checkoff, a plausible wrong answer worked by hand on the card's givens, words the remark must contain);
    # the comments give the lecture's card's numbers
    ("2.1", lambda g: g.S_MAX * g.kv, "whole slot"),  # 4,096 x 524,288
    ("2.1", lambda g: (g.S_MAX - g.PROMPT) * g.kv, "output tokens"),  # (4,096 - 512) x 524,288
    ("2.1", lambda g: (g.S_MAX - g.seq) * (g.kv // 1024 * 1000), f"{KV:,} B"),  # 3,456 x 512,000: "524,288 B"
    ("2.4", lambda g: (_gib(g) // (g.S_MAX * g.kv)) * _life(g, g.PROMPT) * g.kv / _gib(g), "4 GiB"),  # 28 x 575.5
    # 29 / (13.48e9 / 3.35e12)
    ("2.5", lambda g: g.slots / (g.PARAMS * g.DTYPE_BYTES / g.HBM_BW), "not only the weights"),
    ("2.5", lambda g: (b := _gib(g) // (g.S_MAX * g.kv)) / ((g.PARAMS * g.DTYPE_BYTES + b * g.seq * g.kv) / g.HBM_BW),
     "4 GiB"),  # 28 / ((13.48e9 + 28 x 640 x 524,288) / 3.35e12)
    ("2.5", lambda g: g.slots / ((g.PARAMS * g.DTYPE_BYTES + g.slots * g.S_MAX * g.kv) / g.HBM_BW),
     "whole reserved slot"),  # 29 / ((13.48e9 + 29 x 4,096 x 524,288) / 3.35e12)
    ("2.7", lambda g: g.S_MAX_LONG / g.S_MAX, "the slot grew 8x"),  # the lecture's per-slot reasoning
    # 62,225,032,704 // 2,147,483,648 = 28; // 17,179,869,184 = 3
    ("2.7", lambda g: (_gib(g) // (g.S_MAX * g.kv)) / (_gib(g) // (g.S_MAX_LONG * g.kv)), "4 GiB"),
    ("2.7", lambda g: (g.budget // (g.S_MAX_LONG * g.kv)) / g.slots, "upside down"),  # 3 / 29
    ("2.7", lambda g: g.slots / (g.budget / (g.S_MAX_LONG * g.kv)), "fraction of a long slot"),  # 29 / 3.639
    # 29,671 blocks // 40 = 741 over 3 slots
    ("2.8", lambda g: (_gib(g) // (g.BLOCK * g.kv_gqa) // -(-g.seq // g.BLOCK))
     / (_gib(g) // (g.S_MAX_BROCHURE * g.kv_gqa)), "4 GiB"),
    ("2.8", lambda g: g.budget / (g.seq * g.kv_gqa) / (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa)),
     "without flooring"),  # 248.43
    ("2.8", lambda g: 744 / 3, "approximate count", LECTURE_ONLY),  # the sketch's "≈ 744" sequences on its H100
    ("2.10", lambda g: g.SHARE_LONG, "share of the requests"),  # 0.05
    ("2.10", lambda g: g.S_MAX_LONG / sum(s for s, _ in _mix(g)), "equally"),  # 32,768 / (512 + 4,096 + 32,768)
    ("2.10", lambda g: 1 - g.SHARE_LONG * g.S_MAX_LONG / sum(p * s for s, p in _mix(g)), "everyone else"),
    ("2.12", lambda g: g.BLOCK * g.kv, "at least one position is filled"),  # 16 x 524,288
    ("2.12", lambda g: g.BLOCK - 1, "give their bytes"),  # 15
]


@pytest.mark.parametrize("cid, wrong, words, only", [(*row, None)[:4] for row in WRONG],
                         ids=[f"{c}-{i}" for i, (c, *_) in enumerate(WRONG)])
def test_a_plausible_wrong_answer_is_told_what_it_is(cid, wrong, words, only):
    answer = wrong(K)
    if only and not _C.is_lecture:
        _problem(cid, answer)  # still rejected here, without the lecture's remark
        pytest.skip(f"{words!r} names {only}, a number of the lecture's card only")
    spec, right = get(cid).value_spec(), DERIVATIONS[cid][0](K)
    if close(answer, right, spec.get("rel_tol", 1e-9), spec.get("abs_tol", 0.0)):
        get(cid).verdict(answer, get(cid).prepare(case_rng(cid)))  # on this card the reading is right: it passes
        pytest.skip(f"on this card ({_C.gpu.name}, {_C.model.name}) the reading {words!r} gives the right answer")
    assert words in _problem(cid, answer)


def test_the_events_under_paging_are_one_question_with_a_set_answer():
    """2.11 asks which of four events still happen under paging (the lecture lists wastes, not these events): a
    partly empty last block and a running sequence short of a block do; a refusal with enough free in total and a
    sequence stopped at its own reservation do not."""
    right = {"a partly empty last block", "no room for the next token"}
    get("2.11").verdict(right, get("2.11").prepare(None))
    get("2.11").verdict([" A Partly Empty Last Block", "no room for the next token "], get("2.11").prepare(None))
    assert "wrong size" in _problem("2.11", right | {"refused with enough free in total"})
    assert "reservation to outgrow" in _problem("2.11", right | {"stopped at its own reservation"})
    assert "1 is missing" in _problem("2.11", {"a partly empty last block"})
    assert get("2.12").kind == "value"  # the other half is a derivation, not the complementary coin flip


def test_hidden_givens_are_plausible_and_quick():
    for g in GIVENS[2].draw(random.Random(7), 20):
        g = _ns(g)
        assert g.seq < g.S_MAX < g.S_MAX_LONG < g.S_MAX_BROCHURE and 2 <= g.slots <= 300
        assert g.budget // (g.S_MAX_BROCHURE * g.kv_gqa) >= 1 and g.budget // (g.BLOCK * g.kv_gqa) <= 400_000


@pytest.mark.parametrize("lab", [0, 2])
def test_no_listed_mistake_is_a_right_answer(lab):
    from labsupport.course.checkoffs import load_lab
    for c in load_lab(lab):
        if c.kind == "value":
            spec = c.value_spec()
            specs = [(spec, spec["want"])]
        elif c.kind == "function":
            specs = [(k.spec, k.want) for k in c.cases(case_rng(c.id))]
        else:
            continue
        for spec, want in specs:
            for wrong, remark in spec.get("mistakes", ()):
                assert not close(wrong, want, spec.get("rel_tol", 1e-9), spec.get("abs_tol", 0.0)), (c.id, remark)


# --- 2.3: utilization over live allocators mid-serve ----------------------------------------------------

def _held_over_budget(alloc, budget_bytes):
    return sum(slot.length for slot in alloc.slots.values()) * alloc.kv_bytes_per_token / budget_bytes


def _held_by_layout(alloc, budget_bytes):
    """The other derivation: walk the address space and count each live slot's tokens, byte by byte."""
    held = 0
    for _offset, _size, sid in alloc.layout():
        if sid is not None:
            held += alloc.slots[sid].length * alloc.kv_bytes_per_token
    return held / budget_bytes


def _reserved_over_budget(alloc, budget_bytes):
    return sum(slot.size for slot in alloc.slots.values()) * alloc.kv_bytes_per_token / budget_bytes


def _problem_fn(fn) -> str:
    checkoff = get("2.3")
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(fn, checkoff.prepare(case_rng("2.3")))
    return str(err.value)


def test_2_3_two_derivations_pass_on_the_labs_and_on_hidden_cases():
    checkoff = get("2.3")
    for rng in (case_rng("2.3"), case_rng("2.3", b"a grading secret", "nb")):
        cases = checkoff.prepare(rng)
        for fn in (_held_over_budget, _held_by_layout):
            checkoff.verdict(fn, cases)


def test_2_3_cases_are_live_allocators_and_data_only():
    """Each case's allocator travels as its recipe (made, then changed through its methods), never with a want."""
    import json

    from labsupport.course import data

    cases = get("2.3").prepare(case_rng("2.3"))
    kinds = {type(c.args[0].real) for c in cases}
    assert kinds == {ReserveToMaxAllocator, ContiguousAllocator}
    assert any(not c.args[0].real.slots for c in cases)  # an empty pool: utilization 0
    for c in cases:
        text = json.dumps(c.input())
        assert '"want"' not in text and "mistakes" not in text
        rebuilt = data.build(c.input()["args"])[0]
        assert {s: (v.size, v.length) for s, v in rebuilt.slots.items()} == \
            {s: (v.size, v.length) for s, v in c.args[0].real.slots.items()}


def test_2_3_the_card_allocator_by_hand():
    """The first case is the card's pool: BUDGET // (4,096 x KV) reserve-to-max slots (the lecture's card:
    62.52e9 // (4,096 x 524,288) = 29); its want is the tokens the live slots hold x KV over BUDGET (never what the
    slots reserve)."""
    first = get("2.3").prepare(case_rng("2.3"))[0]
    alloc, budget = first.args[0].real, first.args[1]
    assert alloc.max_seqs == K.slots and budget == BUDGET and alloc.kv_bytes_per_token == KV
    tokens = sum(slot.length for slot in alloc.slots.values())
    assert 0 < len(alloc.slots) < K.slots and first.want == pytest.approx(tokens * KV / BUDGET, rel=1e-12)
    assert first.what == f"utilization(<allocator with {len(alloc.slots)} live sequences>, budget_bytes={BUDGET:,})"


@pytest.mark.parametrize("fn, words", [
    (_reserved_over_budget, "share of the budget *reserved* by slots"),
    (lambda a, b: sum(s.length for s in a.slots.values()) / max(1, sum(s.size for s in a.slots.values())),
     "share of the reserved slots that holds tokens"),
    (lambda a, b: 100 * _held_over_budget(a, b), "not a percentage"),
    (lambda a, b: _held_over_budget(a, b) / 2, "too low"),
], ids=["reserved", "slot-share", "percentage", "half"])
def test_2_3_a_plausible_wrong_function_is_told_what_it_is(fn, words):
    problem = _problem_fn(fn)
    assert words in problem and problem.startswith("utilization(<allocator with "), problem


# --- item 4: every step a prompt names changes the answer on every hidden set ---------------------------

def _life(g, first):
    """Mean tokens a slot holds over the OUTPUT readings starting at `first`."""
    return sum(range(first, first + g.OUTPUT)) / g.OUTPUT


def _mix(g):
    return ((g.S_MAX_SHORT, g.SHARE_SHORT), (g.S_MAX, 1 - g.SHARE_SHORT - g.SHARE_LONG), (g.S_MAX_LONG, g.SHARE_LONG))


def _refused_run(g):
    return run_until_fragmented(g.budget // g.kv, _mix(g), kv_bytes_per_token=g.kv, seed=0, stop_sizes=[g.S_MAX])


def _refusal(g):
    return _refused_run(g).refusal


# (checkoff, the step the prompt names, the answer without it), each worked out here from the prompt's words
DROPPED = [
    ("2.1", "the output tokens land in the slot", lambda g: (g.S_MAX - g.PROMPT) * g.kv),
    ("2.1", "bytes per token", lambda g: g.S_MAX - g.seq),
    ("2.4", "read before the step's token lands", lambda g: g.slots * _life(g, g.PROMPT + 1) * g.kv / g.budget),
    ("2.4", "the mean over the steps", lambda g: g.slots * g.seq * g.kv / g.budget),
    ("2.4", "over the budget", lambda g: _life(g, g.PROMPT) / g.S_MAX),
    ("2.5", "the weights are read", lambda g: g.HBM_BW / (g.seq * g.kv)),
    ("2.5", "every sequence's KV is read", lambda g: g.slots * g.HBM_BW / (g.PARAMS * g.DTYPE_BYTES)),
    ("2.5", "whole slots", lambda g: (b := g.budget / (g.S_MAX * g.kv)) / ((g.PARAMS * g.DTYPE_BYTES + b * g.seq * g.kv)
                                                                           / g.HBM_BW)),
    ("2.5", "the full PROMPT + OUTPUT tokens", lambda g: g.slots / ((g.PARAMS * g.DTYPE_BYTES
                                                                     + g.slots * g.PROMPT * g.kv) / g.HBM_BW)),
    ("2.7", "the sequences served at once, whole slots at each limit", lambda g: g.S_MAX_LONG / g.S_MAX),
    ("2.7", "whole long slots", lambda g: g.slots / (g.budget / (g.S_MAX_LONG * g.kv))),
    ("2.7", "the weights leave the budget", lambda g: ((g.HBM_BYTES - g.RESERVE_BYTES) // (g.S_MAX * g.kv))
     / ((g.HBM_BYTES - g.RESERVE_BYTES) // (g.S_MAX_LONG * g.kv))),
    ("2.8", "whole blocks per sequence", lambda g: (g.budget // (g.BLOCK * g.kv_gqa) // (g.seq / g.BLOCK))
     / (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa))),
    ("2.8", "blocks at all", lambda g: (g.budget // (g.seq * g.kv_gqa)) / (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa))),
    ("2.8", "whole brochure slots", lambda g: _paged_by_blocks(g) / (g.budget / (g.S_MAX_BROCHURE * g.kv_gqa))),
    ("2.10", "a share of the memory, not of the requests", lambda g: g.SHARE_LONG),
    ("2.10", "each size as often as requests declare it", lambda g: g.S_MAX_LONG / sum(s for s, _ in _mix(g))),
    ("2.12", "at least one position of the last block is filled", lambda g: g.BLOCK * g.kv),
    ("2.12", "bytes per token", lambda g: g.BLOCK - 1),
    ("2.14", "everything free, not only the largest hole", lambda g: _refusal(g).largest_hole_tokens * g.kv),
    ("2.14", "in bytes", lambda g: _refusal(g).free_tokens),
]


@pytest.fixture(scope="module")
def hidden_sets():
    get("2.1")
    return GIVENS[2].draw(case_rng("givens", b"item 4", "lab02"), 6)


@pytest.mark.parametrize("cid, step, sloppy", DROPPED, ids=[f"{c}-{s}" for c, s, _ in DROPPED])
def test_dropping_a_named_step_fails_on_every_hidden_set(cid, step, sloppy, hidden_sets):
    """Each step a prompt names changes the answer on hidden givens (issue 27, item 4): the derivation without it
    fails `verdict` on every hidden set (so it fails `grade`, which draws two), by hand from the prompt's words."""
    checkoff = get(cid)
    for g in hidden_sets:
        with pytest.raises(Mismatch):
            checkoff.verdict(sloppy(_ns(g)), checkoff.expect(namespace(g)))


def test_every_value_checkoff_has_a_dropped_step():
    from labsupport.course.checkoffs import load_lab
    values = {c.id for c in load_lab(2) if c.kind == "value"}
    assert values == {cid for cid, _, _ in DROPPED}, values ^ {cid for cid, _, _ in DROPPED}


# --- 2.13 and 2.14: the admission the student builds, and the fragmentation it produces -----------------

def _first_fit(holes, size):
    for offset, length in holes:
        if length >= size:
            return offset
    return None


def _first_fit_by_end(holes, size):
    """The other derivation: the first hole whose end lies at least `size` past its start."""
    return next((o for o, n in holes if o + n - o >= size), None)


def test_2_13_two_placements_pass_on_the_labs_and_on_hidden_cases():
    checkoff = get("2.13")
    for rng in (case_rng("2.13"), case_rng("2.13", b"a grading secret", "nb")):
        cases = checkoff.prepare(rng)
        assert sum(c.want is None for c in cases) >= 3  # refusals, fragmented ones among them
        for fn in (_first_fit, _first_fit_by_end):
            checkoff.verdict(fn, cases)


@pytest.mark.parametrize("fn, words", [
    (lambda holes, size: min(((o, n) for o, n in holes if n >= size), key=lambda h: h[1], default=(None,))[0],
     "best fit"),
    (lambda holes, size: next((o + n - size for o, n in holes if n >= size), None), "the hole's start"),
    (lambda holes, size: _first_fit(holes, size) if _first_fit(holes, size) is not None
     else holes[0][0] if holes and sum(n for _, n in holes) >= size else None, "refuse (None)"),
], ids=["best-fit", "end-of-hole", "ignores-fragmentation"])
def test_2_13_a_plausible_wrong_placement_is_told_what_it_is(fn, words):
    checkoff = get("2.13")
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(fn, checkoff.prepare(case_rng("2.13")))
    assert words in str(err.value), str(err.value)


def test_2_13_placement_drives_the_real_allocator():
    """The allocators of the lab place with the student's function: a best-fit placement changes the layout, and
    an offset outside every hole is refused by the allocator, not silently used."""
    first = ContiguousAllocator(10_000, place=_first_fit)
    best = ContiguousAllocator(10_000, place=lambda h, s: min(((o, n) for o, n in h if n >= s),
                                                               key=lambda x: x[1], default=(None,))[0])
    for a in (first, best):
        for sid, size in enumerate((3_000, 1_000, 3_000, 1_000)):
            a.allocate(sid, size)
        a.free(0)
        a.free(2)
        a.allocate("new", 2_000)
        a.check_invariants()
    # holes (0, 3,000), (4,000, 3,000), (8,000, 2,000): first fit takes the first, best fit the exact one at the end
    assert first.slots["new"].offset == 0 and best.slots["new"].offset == 8_000
    bad = ContiguousAllocator(100, place=lambda h, s: 95)
    with pytest.raises(ValueError, match="not inside"):
        bad.allocate("x", 10)
    mid = ContiguousAllocator(100, place=lambda h, s: 40)  # a slot in the middle of a hole splits it in two
    mid.allocate("x", 10)
    assert mid.holes() == [(0, 40), (50, 50)]
    mid.check_invariants()


def test_2_14_the_lecture_run_by_hand():
    """The lecture's run (seed 0) on 62.52e9 // 524,288 = 119,247 positions: refused at a 4,096-token request with
    12,751 positions free (6,685,196,288 B), none of its holes 4,096 wide. A placement read off the real allocator
    and one counted from its layout both pass; on the card's and on hidden givens too."""
    checkoff = get("2.14")
    assert checkoff.expect(namespace(LECTURE)) == 12_751 * 524_288 == 6_685_196_288
    for g in _sets():
        n = _ns(g)
        run = run_until_fragmented(n.budget // n.kv, _mix(n), kv_bytes_per_token=n.kv, seed=0, stop_sizes=[n.S_MAX],
                                   place=_first_fit)
        assert run.found
        want = checkoff.expect(namespace(g))
        checkoff.verdict(sum(size for _, size in run.allocator.holes()) * n.kv, want)
        checkoff.verdict(sum(size for _, size, sid in run.allocator.layout() if sid is None) * n.kv, want)


# --- 2.2, 2.6 and 2.9: the builds the lab's later cells run ---------------------------------------------------

def _never_by_slot(alloc, budget_bytes):
    """2.2 slot by slot: what each sequence reaches (its final length, where known), the rest of its slot unfilled."""
    never = 0
    for slot in alloc.slots.values():
        reach = slot.length if slot.final is None else max(slot.final, slot.length)
        never += slot.size - min(slot.size, reach)
    return never * alloc.kv_bytes_per_token / budget_bytes


def _never_by_layout(alloc, budget_bytes):
    """2.2 the other way: everything the slots reserve, less what their sequences hold or will still fill."""
    reserved = sum(size for _offset, size, sid in alloc.layout() if sid is not None)
    filled = sum(min(s.size, s.length if s.final is None else max(s.length, s.final)) for s in alloc.slots.values())
    return (reserved - filled) * alloc.kv_bytes_per_token / budget_bytes


def _problem_of(cid, fn) -> str:
    checkoff = get(cid)
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(fn, checkoff.prepare(case_rng(cid)))
    return str(err.value)


@pytest.mark.parametrize("cid, derivations", [
    ("2.2", (_never_by_slot, _never_by_layout)),
    ("2.6", (lambda b, s, n, kv: (b // (s * kv)) * min(n, s) * kv / b, _rtm_util)),
    ("2.9", (lambda b, mix, kv: b / sum(p * s * kv for s, p in mix),
             lambda b, mix, kv: math.floor(b / kv / sum(p * s for s, p in mix)),
             lambda b, mix, kv: round(b / (kv * sum(p * s for s, p in mix))))),
], ids=["2.2", "2.6", "2.9"])
def test_each_build_passes_two_derivations_on_the_labs_and_on_hidden_cases(cid, derivations):
    checkoff = get(cid)
    assert checkoff.kind == "function"
    for rng in (case_rng(cid), case_rng(cid, b"a grading secret", "nb")):
        cases = checkoff.prepare(rng)
        for fn in derivations:
            checkoff.verdict(fn, cases)


def test_the_builds_card_cases_by_hand():
    """The first case of each build is the card's (test_answer_scan's LECTURE_RESULT reads it there); the lecture's
    card's numbers in brackets.  2.2: the card's slots of 4,096 at the end of life, 640 tokens each, leave
    slots x 3,456 x KV / BUDGET never filled [29 x 3,456 x 524,288 / 62.52e9 = 84.05%]; the same pool just after
    prefill (512 held, headed for 640) is the same. 2.6: BUDGET // (32,768 x KV) slots holding 640 tokens
    [3 x 640 x 524,288 / 62.52e9 = 1.61%, the lecture's "1.9%"]. 2.9: a request reserves 0.7 x 512 + 0.25 x 4,096
    + 0.05 x 32,768 = 3,020.8 positions x KV on average [62.52e9 / (3,020.8 x 524,288) = 39.48]."""
    first, second = get("2.2").prepare(case_rng("2.2"))[:2]
    assert first.args[0].real.num_seqs == K.slots and first.args[1] == BUDGET
    assert first.want == pytest.approx(K.slots * (4_096 - 640) * KV / BUDGET, rel=1e-12) == second.want
    assert {s.length for s in second.args[0].real.slots.values()} == {512}
    rtm = get("2.6").prepare(case_rng("2.6"))[0]
    long_slots = BUDGET // (32_768 * KV)
    assert rtm.args == (BUDGET, 32_768, 640, KV) and rtm.want == pytest.approx(long_slots * 640 * KV / BUDGET,
                                                                                rel=1e-12)
    est = get("2.9").prepare(case_rng("2.9"))[0]
    assert est.args[0] == BUDGET and est.args[2] == KV
    assert est.want == pytest.approx(BUDGET / (3_020.8 * KV), rel=1e-12)


@pytest.mark.parametrize("cid, fn, words", [
    ("2.2", lambda a, b: sum(s.size - s.length for s in a.slots.values()) * a.kv_bytes_per_token / b, "third waste"),
    ("2.2", lambda a, b: sum(s.size - (s.length if s.final is None else max(s.final, s.length))
                             for s in a.slots.values()) * a.kv_bytes_per_token / b, "not a negative amount"),
    ("2.2", lambda a, b: _never_by_slot(a, b) * b / a.kv_bytes_per_token * KV / b, "kv_bytes_per_token"),
    ("2.2", lambda a, b: sum(s.size for s in a.slots.values()) * a.kv_bytes_per_token / b, "everything the slots"),
    ("2.6", lambda b, s, n, kv: min(n, s) / s, "one slot's occupancy"),
    ("2.6", lambda b, s, n, kv: (b // (s * kv)) * n * kv / b, "cannot grow"),
    ("2.6", lambda b, s, n, kv: max(1, b // (s * kv)) * min(n, s) * kv / b, "admits nobody"),
    ("2.6", lambda b, s, n, kv: 100 * (b // (s * kv)) * min(n, s) * kv / b, "not a percentage"),
    ("2.9", lambda b, mix, kv: b / (sum(s for s, _ in mix) / len(mix) * kv), "equally"),
    ("2.9", lambda b, mix, kv: sum(p * (b // (s * kv)) for s, p in mix), "separate pools"),
    ("2.9", lambda b, mix, kv: b / sum(p * s for s, p in mix), "token positions"),
], ids=["2.2-to-come", "2.2-negative", "2.2-lecture-kv", "2.2-reserved", "2.6-occupancy", "2.6-truncation",
        "2.6-no-slot", "2.6-percent", "2.9-equal", "2.9-pools", "2.9-no-kv"])
def test_a_plausible_wrong_build_is_told_what_it_is(cid, fn, words):
    problem = _problem_of(cid, fn)
    assert words in problem, problem


def test_2_6_the_lectures_own_readings_get_their_remarks():
    """Typed into a function on the lecture's case, the lecture's printed 1.9% names its per-slot reading."""
    assert "one slot's occupancy" in _problem_of("2.6", lambda b, s, n, kv: 0.019)
