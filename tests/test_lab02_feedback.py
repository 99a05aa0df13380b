"""Lab 02's rewritten exercises (issue "Teaching truth, third pass"): each accepts two different correct
derivations, on the lecture's givens and on hidden ones, and rejects the plausible wrong answers with a
remark that names the mistake.

The lecture's numbers are worked out here by hand from the prose of §10.2: 80e9 B of HBM less
2 x 6.74e9 B of weights less a 4e9 B reserve leave 62.52e9 B of KV; a token costs 2 x 32 x 32 x 128
x 2 = 524,288 B (MHA) or 131,072 B (GQA-8); 62.52e9 // (4,096 x 524,288) = 29 slots.
"""
from __future__ import annotations

import math
import random
import types

import pytest

from labsupport.contiguous import ContiguousAllocator, ReserveToMaxAllocator
from labsupport.course.checkoffs import get
from labsupport.course.judge import Mismatch, close
from labsupport.course.registry import GIVENS, case_rng, namespace

KV, KV_GQA, BUDGET, SEQ = 524_288, 131_072, 62_520_000_000, 640
LECTURE = dict(HBM_BYTES=80 * 10**9, PARAMS=6_740_000_000, DTYPE_BYTES=2, RESERVE_BYTES=4 * 10**9, LAYERS=32,
               KV_HEADS=32, GQA_KV_HEADS=8, HEAD_DIM=128, HBM_BW=3_350 * 10**9, PROMPT=512, OUTPUT=128,
               S_MAX=4096, S_MAX_LONG=32_768, S_MAX_BROCHURE=131_072, BLOCK=16, S_MAX_SHORT=512,
               SHARE_SHORT=0.70, SHARE_LONG=0.05)


def _sets():
    get("2.1")  # loads lab 02's graders
    return [LECTURE, *GIVENS[2].draw(case_rng("givens", b"feedback test", "lab02"), 3)]


def _ns(g):
    g = types.SimpleNamespace(**g)
    g.kv = 2 * g.LAYERS * g.KV_HEADS * g.HEAD_DIM * g.DTYPE_BYTES
    g.kv_gqa = g.kv // g.KV_HEADS * g.GQA_KV_HEADS
    g.budget = g.HBM_BYTES - g.PARAMS * g.DTYPE_BYTES - g.RESERVE_BYTES
    g.seq = g.PROMPT + g.OUTPUT
    g.slots = g.budget // (g.S_MAX * g.kv)
    return g


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
    "2.2": (lambda g: g.slots * (g.S_MAX - g.seq) * g.kv / g.budget,
            lambda g: (g.slots * g.S_MAX * g.kv - g.slots * g.seq * g.kv) / g.budget),
    "2.4": (lambda g: g.slots * sum(range(g.PROMPT, g.seq)) / g.OUTPUT * g.kv / g.budget,
            lambda g: g.slots * (g.PROMPT + (g.OUTPUT - 1) / 2) * g.kv / g.budget),
    "2.5": (lambda g: g.slots / ((g.PARAMS * g.DTYPE_BYTES + g.slots * g.seq * g.kv) / g.HBM_BW),
            lambda g: g.HBM_BW / (g.PARAMS * g.DTYPE_BYTES / g.slots + g.seq * g.kv)),
    "2.6": (lambda g: (g.budget // (g.S_MAX_LONG * g.kv)) * g.seq * g.kv / g.budget,
            lambda g: math.floor(g.budget / (g.S_MAX_LONG * g.kv)) * (g.seq / g.S_MAX_LONG) * g.S_MAX_LONG * g.kv / g.budget),
    "2.7": (lambda g: (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa)) * g.seq * g.kv_gqa / g.budget,
            lambda g: sum(g.seq * g.kv_gqa for _ in range(g.budget // (g.S_MAX_BROCHURE * g.kv_gqa))) / g.budget),
    "2.8": (lambda g: _paged_by_blocks(g) / (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa)),
            lambda g: _paged_by_loop(g) / (g.budget // (g.S_MAX_BROCHURE * g.kv_gqa))),
    "2.9": (lambda g: (g.SHARE_SHORT * g.S_MAX_SHORT + (1 - g.SHARE_SHORT - g.SHARE_LONG) * g.S_MAX
                       + g.SHARE_LONG * g.S_MAX_LONG) * g.kv,
            lambda g: sum(p * s * g.kv for s, p in ((g.S_MAX_SHORT, g.SHARE_SHORT), (g.S_MAX_LONG, g.SHARE_LONG),
                                                    (g.S_MAX, 1 - g.SHARE_SHORT - g.SHARE_LONG)))),
    "2.10": (lambda g: g.budget / DERIVATIONS["2.9"][0](g), lambda g: g.budget / g.kv / (
        g.SHARE_SHORT * g.S_MAX_SHORT + (1 - g.SHARE_SHORT - g.SHARE_LONG) * g.S_MAX + g.SHARE_LONG * g.S_MAX_LONG)),
    "2.12": (lambda g: (g.BLOCK - 1) * g.kv, lambda g: g.BLOCK * g.kv - g.kv),
}


@pytest.mark.parametrize("cid", list(DERIVATIONS))
def test_two_derivations_pass_on_the_lecture_and_on_hidden_givens(cid):
    checkoff = get(cid)
    for g in _sets():
        want = checkoff.expect(namespace(g))
        for derive in DERIVATIONS[cid]:
            checkoff.verdict(derive(_ns(g)), want)  # raises Mismatch if off


def test_the_lecture_values_by_hand():
    lecture = {cid: get(cid).prepare(case_rng(cid)) for cid in DERIVATIONS}
    assert lecture["2.1"] == 3_456 * 524_288 == 1_811_939_328
    assert lecture["2.2"] == pytest.approx(29 * 1_811_939_328 / 62.52e9, rel=1e-12)  # 84.05%
    assert lecture["2.4"] == pytest.approx(29 * 575.5 * 524_288 / 62.52e9, rel=1e-12)  # 14.00%
    assert lecture["2.5"] == pytest.approx(29 / ((13.48e9 + 29 * 640 * 524_288) / 3.35e12), rel=1e-12)  # 4,186
    assert lecture["2.6"] == pytest.approx(3 * 640 * 524_288 / 62.52e9, rel=1e-12)  # 1.61%
    assert lecture["2.7"] == pytest.approx(3 * 640 * 131_072 / 62.52e9, rel=1e-12)  # 0.403%
    assert lecture["2.8"] == pytest.approx(745 / 3)  # 29,811 blocks // 40 = 745 over 3 slots of 17.18 GB
    assert lecture["2.12"] == 15 * 524_288


def _problem(cid: str, answer) -> str:
    checkoff = get(cid)
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(answer, checkoff.prepare(case_rng(cid)))
    return str(err.value)


GIB_BUDGET = 80 * 10**9 - 13_480_000_000 - 4 * 2**30  # a 4 GiB reserve: 62,225,032,704 B, 28 slots
WRONG = [  # (checkoff, a plausible wrong answer on the lecture's givens, words the remark must contain)
    ("2.1", 4096 * KV, "whole slot"),
    ("2.1", (4096 - 512) * KV, "output tokens"),
    ("2.1", 3456 * 512_000, "524,288 B"),
    ("2.2", 28 * 3456 * KV / GIB_BUDGET, "4 GiB"),
    ("2.2", 28 * 3456 * KV / BUDGET, "4 GiB"),
    ("2.2", 29 * 3456 * KV / 62.5e9, "printed 62.5 GB"),
    ("2.2", 3456 / 4096, "one slot's empty share"),
    ("2.2", 1 - 29 * 640 * KV / BUDGET, "remainder"),
    ("2.2", BUDGET / (4096 * KV) * 3456 * KV / BUDGET, "round the count down"),  # = 3456 / 4096
    ("2.4", 28 * 575.5 * KV / GIB_BUDGET, "4 GiB"),
    ("2.5", 29 / (13.48e9 / 3.35e12), "not only the weights"),
    ("2.5", 28 / ((13.48e9 + 28 * 640 * KV) / 3.35e12), "4 GiB"),
    ("2.6", 3 * 640 * KV / GIB_BUDGET, "4 GiB"),
    ("2.7", 3 * 640 * KV_GQA / GIB_BUDGET, "4 GiB"),
    ("2.8", (GIB_BUDGET // (16 * KV_GQA) // 40) / 3, "4 GiB"),  # 29,671 blocks // 40 = 741 over 3 slots
    ("2.5", 29 / ((13.48e9 + 29 * 4096 * KV) / 3.35e12), "whole reserved slot"),
    ("2.6", 3 * 640 * KV / 62.5e9, "printed 62.5 GB"),
    ("2.6", 640 / 32_768, "one slot's occupancy"),
    ("2.6", 0.019, "1.95%"),
    ("2.6", BUDGET / (32_768 * KV) * 640 * KV / BUDGET, "round down"),  # = 640 / 32,768
    ("2.7", 3 * 640 * KV_GQA / 62.5e9, "printed 62.5 GB"),
    ("2.7", 3 * 640 * 128_000 / BUDGET, "128,000 B"),
    ("2.8", BUDGET / (640 * KV_GQA) / 3, "without flooring"),  # 248.43
    ("2.8", 744 / 3, "approximate count"),
    ("2.9", (512 + 4096 + 32_768) / 3 * KV, "equally"),
    ("2.10", 29, "everyone reserving S_MAX"),
    ("2.12", 16 * KV, "at least one position is filled"),
    ("2.12", 15, "give their bytes"),
]


@pytest.mark.parametrize("cid, answer, words", WRONG, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(WRONG)])
def test_a_plausible_wrong_answer_is_told_what_it_is(cid, answer, words):
    assert words in _problem(cid, answer)


def test_mean_concurrency_accepts_the_ratio_and_whole_requests_on_every_givens():
    """2.10 asks for the ratio or a whole count: floor and round both pass, also where the fraction is >= .5."""
    checkoff, fractions = get("2.10"), []
    for g in _sets() + GIVENS[2].draw(random.Random(11), 12):
        want = checkoff.expect(namespace(g))
        fractions.append(want % 1)
        for answer in (want, math.floor(want), round(want)):
            checkoff.verdict(answer, want)
    assert any(f >= 0.5 for f in fractions)  # the case a floor used to fail on


def test_the_wastes_are_one_question_with_a_set_answer():
    get("2.11").verdict({"external fragmentation"}, get("2.11").prepare(None))
    get("2.11").verdict([" External Fragmentation"], get("2.11").prepare(None))
    assert "bounds that waste" in _problem("2.11", {"external fragmentation", "internal fragmentation"})
    assert "No allocator removes that" in _problem("2.11", {"external fragmentation", "reserved for tokens not yet emitted"})
    assert "1 is missing" in _problem("2.11", set())
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


def test_2_3_the_lecture_allocator_by_hand():
    """The first case is the lecture's pool: 62.52e9 // (4,096 x 524,288) = 29 reserve-to-max slots; its want is
    the tokens the live slots hold x 524,288 B over 62.52e9 B (never what the slots reserve)."""
    first = get("2.3").prepare(case_rng("2.3"))[0]
    alloc, budget = first.args[0].real, first.args[1]
    assert alloc.max_seqs == 29 and budget == 62_520_000_000 and alloc.kv_bytes_per_token == 524_288
    tokens = sum(slot.length for slot in alloc.slots.values())
    assert 0 < len(alloc.slots) < 29 and first.want == pytest.approx(tokens * 524_288 / 62.52e9, rel=1e-12)
    assert first.what == f"utilization(<allocator with {len(alloc.slots)} live sequences>, budget_bytes=62,520,000,000)"


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
