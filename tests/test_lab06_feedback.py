"""Checkoff 6.3 (Exercise 4), posed on lab 06's givens: two different correct derivations pass on the
lecture's givens and on hidden ones; the plausible wrong answers are rejected with a remark naming the
mistake.  The lecture's numbers are worked by hand: 16K GQA-8 KV = 16,384 × 131,072 B = 2.147 GB, swap
67.1 ms over 64 GB/s, recompute (2 × 6.74e9 × 16,384 + 4 × 32 × 32 × 128 × 16,384²) / 494.5e12 = 731.2 ms;
MHA crossover on 32 GB/s: (2 × 524,288 × 494.5e12 / 32e9 − 2 × 6.74e9) / (4 × 32 × 32 × 128) = 5,195.19.
check() grades on the givens lab 06's record publishes (the course card's), so the slips it must name are worked
out here on those: on A100-80GB + Qwen2.5-7B (a 32 GB/s link, 156 TFLOP/s at 50%) the MHA root is
(2 × 401,408 × 156e12 / 32e9 − 2 × 7.61e9) / (4 × 28 × 28 × 128) = −28,166.5: no length, swap wins at every one."""
from __future__ import annotations

import math
import random

import pytest

from labsupport.course import checkoff as C
from labsupport.course import record
from labsupport.course.checkoff import check
from labsupport.course.checkoffs import get
from labsupport.course.judge import Mismatch
from labsupport.course.registry import GIVENS, case_rng, namespace
from labsupport.specs import ModelSpec

pytestmark = pytest.mark.usefixtures("fresh_results")

LECTURE = dict(LAYERS=32, HEADS=32, GQA_KV_HEADS=8, HEAD_DIM=128, DTYPE_BYTES=2, PARAMS=6.74e9,
               PEAK_FLOPS=989e12, MFU=0.5, LINK_BW=64e9, SLOW_LINK_BW=32e9, LONG_SEQ=16_384)


def written_out(g, attention=4):
    """The times written out term by term, the crossover solved as a linear equation."""
    f = g["MFU"] * g["PEAK_FLOPS"]
    kv_gqa = 2 * g["LAYERS"] * g["GQA_KV_HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"]
    kv_mha = 2 * g["LAYERS"] * g["HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"]
    s = g["LONG_SEQ"]
    swap = 2 * s * kv_gqa / g["LINK_BW"]
    rec = (2 * g["PARAMS"] * s + 4 * g["LAYERS"] * g["HEADS"] * g["HEAD_DIM"] * s * s) / f
    a = attention * g["LAYERS"] * g["HEADS"] * g["HEAD_DIM"]
    return {"recompute_ms": 1e3 * rec, "swap_advantage": rec / swap, "breakeven_gbs": 2 * s * kv_gqa / rec / 1e9,
            "crossover_tokens": (2 * kv_mha * f / g["SLOW_LINK_BW"] - 2 * g["PARAMS"]) / a}


def through_a_breakeven_function(g):
    """A second derivation: a W*(model, S) function on ModelSpecs, and the crossover found by bisection
    on (swap(S) − recompute(S)) / S, which falls as S grows (a negative root where swap wins at every length)."""
    def wstar(m, s):
        kv = s * 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes
        flops = 2 * m.num_params * s + 4 * m.num_layers * m.num_heads * m.head_dim * s ** 2
        return 2 * kv * g["MFU"] * g["PEAK_FLOPS"] / flops

    mha = ModelSpec("m", g["LAYERS"], g["HEADS"], g["HEADS"], g["HEAD_DIM"], g["PARAMS"], dtype_bytes=g["DTYPE_BYTES"])
    gqa = ModelSpec("q", g["LAYERS"], g["HEADS"], g["GQA_KV_HEADS"], g["HEAD_DIM"], g["PARAMS"],
                    dtype_bytes=g["DTYPE_BYTES"])
    s = g["LONG_SEQ"]
    w = wstar(gqa, s)
    kv = s * 2 * gqa.num_layers * gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes
    rec = 2 * kv / w  # at the break-even the round trip is the recompute
    f = g["MFU"] * g["PEAK_FLOPS"]

    def gap(s):  # the MHA swap on the slow link minus its recompute, per token of the sequence
        kv_per_token = 2 * mha.num_layers * mha.num_kv_heads * mha.head_dim * mha.dtype_bytes
        return 2 * kv_per_token / g["SLOW_LINK_BW"] - (2 * mha.num_params + 4 * mha.num_layers * mha.num_heads
                                                       * mha.head_dim * s) / f

    lo, hi = -1e7, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    if lo > 0:  # a length: there the slow link is exactly the break-even bandwidth
        assert wstar(mha, lo) == pytest.approx(g["SLOW_LINK_BW"], rel=1e-6)
    return {"recompute_ms": 1e3 * rec, "swap_advantage": g["LINK_BW"] / w, "breakeven_gbs": w / 1e9,
            "crossover_tokens": lo}


def test_the_lecture_case_by_hand():
    got = written_out(LECTURE)
    assert got["recompute_ms"] == pytest.approx(731.23, abs=0.01)
    assert got["swap_advantage"] == pytest.approx(731.23 / 67.109, rel=1e-4)
    assert got["crossover_tokens"] == pytest.approx(5195.19, abs=0.01)


def card_givens() -> dict:
    """Lab 06's givens on the course card, from its spec fields (the givens cell's `# card=` lines): its MHA form's
    shape and parameters, its GQA form's KV heads, the GPU's peak and host link; MFU, the slow link and the long
    sequence stay the lecture's; the slow link is the fastest PCIe rate (32, 16, 8 ... GB/s) below the card's own
    link and below 90% of kv·F/N of its MHA form (F = 0.5 x peak), so the MHA crossover is a length (32 GB/s on the
    lecture's card, whose edge is 524,288 x 494.5e12 / 6.74e9 = 38.5 GB/s)."""
    from labsupport import card

    c = card.card()
    edge = c.mha.kv_bytes_per_token * 0.5 * c.gpu.peak_flops / c.mha.num_params
    slow = next((gb * 1e9 for gb in (32, 16, 8, 4, 2, 1) if gb * 1e9 < min(c.gpu.link_bandwidth, 0.9 * edge)), 0.5e9)
    return dict(LAYERS=c.mha.num_layers, HEADS=c.mha.num_heads, GQA_KV_HEADS=c.gqa.num_kv_heads,
                HEAD_DIM=c.mha.head_dim, DTYPE_BYTES=c.mha.dtype_bytes, PARAMS=c.mha.num_params,
                PEAK_FLOPS=c.gpu.peak_flops, MFU=0.5, LINK_BW=c.gpu.link_bandwidth, SLOW_LINK_BW=slow, LONG_SEQ=16_384)


# What check() grades against: the givens lab 06's record publishes (built for the course card; the lecture's on its)
BUILT = record.read(6)["givens"]
RIGHT = written_out(BUILT)


def test_the_build_sets_the_givens_from_the_card():
    c = get("6.3")  # loads lab 06's graders, which declare its givens
    assert GIVENS[6].lecture == card_givens()
    assert c.expect() == pytest.approx(written_out(card_givens()), rel=1e-12)


@pytest.mark.parametrize("derive", [written_out, through_a_breakeven_function])
def test_two_correct_derivations_pass_on_the_lecture_and_hidden_givens(derive, capsys):
    check("6.3", derive(BUILT))
    assert capsys.readouterr().out == "✅ Checkoff 6.3 passed\n"
    c = get("6.3")
    for g in [LECTURE, card_givens(), *GIVENS[6].draw(case_rng("givens", b"lab06 test", "x"), 4)]:
        c.verdict(derive(g), c.expect(namespace(g)))


def test_a_typed_lecture_answer_fails_on_hidden_givens():
    c = get("6.3")
    for g in GIVENS[6].draw(random.Random(7), 2):
        with pytest.raises(Mismatch):
            c.verdict(written_out(LECTURE), c.expect(namespace(g)))


def test_the_required_keys_are_in_the_prompt():
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "solutions" / "06_engine_loop.py").read_text()
    prompt = source[source.index("### Exercise 6.3"):source.index("### BEGIN SOLUTION 6.3")]
    for key in ("recompute_ms", "swap_advantage", "breakeven_gbs", "crossover_tokens"):
        assert f'`"{key}"`' in prompt


def _recompute_ms(g, attention=4, heads=None, rate=None):
    """The long GQA sequence's prefill in ms, written out; `attention`, `heads` and `rate` write the slips' counts."""
    s = g["LONG_SEQ"]
    flops = 2 * g["PARAMS"] * s + attention * g["LAYERS"] * (heads or g["HEADS"]) * g["HEAD_DIM"] * s * s
    return 1e3 * flops / (rate or g["MFU"] * g["PEAK_FLOPS"])


def _mha_breakeven_gbs(g):
    """The break-even with the long sequence's cache counted on HEADS KV heads (the MHA form's, not GQA_KV_HEADS):
    both trips of that cache over the recompute time, in GB/s."""
    kv_mha = 2 * g["LAYERS"] * g["HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"] * g["LONG_SEQ"]
    return 2 * kv_mha / (_recompute_ms(g) / 1e3) / 1e9


SLIPS_6_3 = [  # (key, the slip's answer on givens g by hand, the remark's words); the lecture's values noted
    ("crossover_tokens", lambda g: written_out(g, attention=2)["crossover_tokens"], "counted causally"),  # 10,390
    ("crossover_tokens", lambda g: written_out(g, attention=8)["crossover_tokens"], "half the root"),  # 2,598
    ("recompute_ms", lambda g: _recompute_ms(g, heads=g["GQA_KV_HEADS"]), "every query head attends"),
    ("recompute_ms", lambda g: _recompute_ms(g, attention=2), "causally"),
    ("recompute_ms", lambda g: _recompute_ms(g, rate=g["PEAK_FLOPS"]), "MFU × peak"),
    ("recompute_ms", lambda g: _recompute_ms(g, attention=0), "weights' FLOPs alone"),
    ("swap_advantage", lambda g: 2 * written_out(g)["swap_advantage"], "one-way trip"),
    ("breakeven_gbs", lambda g: written_out(g)["breakeven_gbs"] / 2, "one-way bandwidth"),
    ("breakeven_gbs", _mha_breakeven_gbs, "MHA cache"),  # 4 times the right one on the lecture's GQA-8
]


@pytest.mark.parametrize("key, wrong, names", SLIPS_6_3, ids=[names for _, _, names in SLIPS_6_3])
def test_each_plausible_wrong_answer_is_named(key, wrong, names, fails):
    with fails(names):
        check("6.3", dict(RIGHT, **{key: wrong(BUILT)}))


def test_the_slips_are_apart_on_the_card_the_lecture_and_hidden_givens():
    """Each slip's remark can fire on the card's givens (and the lecture's and hidden ones): no slip lands on the right
    answer or on another slip of the same key within that key's tolerance."""
    c = get("6.3")
    for g in [card_givens(), LECTURE, *GIVENS[6].draw(case_rng("givens", b"lab06 test", "apart"), 4)]:
        tolerances = c.value_spec(namespace(g))["keys"]
        right = written_out(g)
        for key in right:
            rel, abs_ = tolerances[key]["rel_tol"], tolerances[key]["abs_tol"]
            values = [right[key]] + [wrong(g) for k, wrong, _ in SLIPS_6_3 if k == key]
            for i, a in enumerate(values):
                assert all(not math.isclose(a, b, rel_tol=rel, abs_tol=abs_) for b in values[:i]), (key, g)


# --- 6.1: the break-even bandwidth, posed as what each way spends (its terms are below the checkoff) --

def _kv61(m, s):
    return s * 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes


def _flops61(m, s, attention=4, heads=None):
    return 2 * m.num_params * s + attention * m.num_layers * (heads or m.num_heads) * m.head_dim * s ** 2


def test_6_1_two_derivations_pass(capsys):
    check("6.1", lambda m, s, peak, mfu=0.5: 2 * _kv61(m, s) * mfu * peak / _flops61(m, s))

    def by_times(m, s, peak, mfu=0.5):  # t_swap(W) = 2 KV / W equals t_recompute: solve at W = 1 and scale
        t_swap_at_1 = 2 * _kv61(m, s) / 1.0
        t_recompute = _flops61(m, s) / (mfu * peak)
        return t_swap_at_1 / t_recompute

    check("6.1", by_times)
    assert capsys.readouterr().out.count("passed") == 2


@pytest.mark.parametrize("fn, words", [
    (lambda m, s, peak, mfu=0.5: _kv61(m, s) * mfu * peak / _flops61(m, s), "two trips"),
    (lambda m, s, peak, mfu=0.5: 2 * _kv61(m, s) * mfu * peak / _flops61(m, s, attention=2), "causally"),
    (lambda m, s, peak, mfu=0.5: 2 * _kv61(m, s) * peak / _flops61(m, s), "mfu × peak"),
    (lambda m, s, peak, mfu=0.5: 2 * _kv61(m, s) * mfu * peak / _flops61(m, s, heads=m.num_kv_heads),
     "count query heads"),
])
def test_6_1_names_the_slip(fn, words, fails):
    with fails(words):
        check("6.1", fn)


@pytest.mark.parametrize("crossover, named", [(2600, True), (2550, True), (2655, True), (2700, False)])
def test_6_3_the_lecture_printed_crossover_is_named(crossover, named, fails):
    """Within 60 tokens of the lecture's printed ≈ 2,600 the remark says so, on any card; 2,700 is past it and gets
    no remark, only its side of the card's root (too low against the lecture's 5,195.19)."""
    roots = [RIGHT["crossover_tokens"]] + [wrong(BUILT) for key, wrong, _ in SLIPS_6_3 if key == "crossover_tokens"]
    assert all(abs(crossover - root) > 2 for root in roots)  # neither right nor another slip on these givens
    side = "too low" if crossover < RIGHT["crossover_tokens"] else "too high"
    with fails("printed figure" if named else rf"{side}\.[^A-Z]*Hint"):
        check("6.3", dict(RIGHT, crossover_tokens=crossover))


def test_6_3_zero_is_told_the_question_is_about_mha_only_where_mha_has_a_crossover():
    """0 tokens ("swap wins at every length") is the GQA model's answer on the lecture's slow link, where the MHA
    root is 5,195.19 tokens: the remark says the question is about MHA.  Where the MHA root is no length either (the
    lecture's model on a 64 GB/s slow link: (2 × 524,288 × 494.5e12 / 64e9 − 2 × 6.74e9) / 524,288 < 0), that remark
    would be false: 0 is then only too high."""
    from labsupport.course import data, judge

    c = get("6.3")
    for g, has_root in ((LECTURE, True), (dict(LECTURE, SLOW_LINK_BW=64e9), False)):
        assert (written_out(g)["crossover_tokens"] > 0) == has_root
        spec = judge.readable(c.value_spec(namespace(g)))
        with pytest.raises(Mismatch) as err:
            judge.verdict(data.parse(data.dumps(dict(written_out(g), crossover_tokens=0))), spec)
        assert ("the question is about MHA" in str(err.value)) == has_root, str(err.value)
        assert has_root or "too high" in str(err.value)


def test_6_3_names_the_slips_on_hidden_givens_too():
    """The slips are worked out on each run's givens: a causal count is named on a hidden set as well."""
    from labsupport.course import data, judge

    c = get("6.3")
    for g in GIVENS[6].draw(case_rng("givens", b"lab06 test", "slips"), 3):
        spec = judge.readable(c.value_spec(namespace(g)))
        judge.verdict(data.parse(data.dumps(written_out(g))), spec)
        for key, wrong, words in (("crossover_tokens", written_out(g, attention=2)["crossover_tokens"], "causally"),
                                  ("swap_advantage", 2 * written_out(g)["swap_advantage"], "one-way trip")):
            with pytest.raises(Mismatch, match=words):
                judge.verdict(data.parse(data.dumps(dict(written_out(g), **{key: wrong}))), spec)


# --- 6.2: the preemption plan, written out by hand (latest arrival first, W* per victim) ---------------------

def _plan(running, need, bs, m, gpu, link, mfu=0.5, latest_first=True, flip=False, one_more=False, stable_ties=False,
          floor_blocks=False):
    plan, freed = [], 0
    if stable_ties:  # the slip: sorted(..., reverse=True) keeps equal arrivals in their listed order
        ranked = sorted(running, key=lambda r: r[1], reverse=latest_first)
    else:  # the engine's rank: (arrival, order received); of equal arrivals the later listed goes first
        ranked = [r for _, r in sorted(enumerate(running), key=lambda ir: (ir[1][1], ir[0]), reverse=latest_first)]
    for name, _, tokens in ranked:
        if freed >= need:
            if not one_more:
                break
            one_more = False
        recompute = _flops61(m, tokens) / (mfu * gpu.peak_flops) < 2 * _kv61(m, tokens) / link
        plan.append((name, "recompute" if recompute != flip else "swap"))
        freed += tokens // bs if floor_blocks else -(-tokens // bs)
    return plan


def test_6_2_the_plan_passes_and_each_wrong_part_is_named(capsys, fails):
    check("6.2", _plan)
    check("6.2", lambda *a: [[n, f"  {d.upper()} "] for n, d in _plan(*a)])  # pairs as lists, case and spaces aside
    assert capsys.readouterr().out.count("passed") == 2
    with fails("wrong order"):
        check("6.2", lambda *a: list(reversed(_plan(*a))))
    with fails("not the right set .* first-come-first-served"):
        check("6.2", lambda *a: _plan(*a, latest_first=False))
    with fails("that is too many"):
        check("6.2", lambda *a: _plan(*a, one_more=True))
    # the first case frees 1 block on 32 GB/s: 'f' (2,048 tokens, the latest) swaps in 2 x 1.07 GB / 32 GB/s = 67 ms
    # and recomputes in (27.6 + 2.2) TFLOP / 494.5 TFLOP/s = 60 ms, so it is recomputed
    with fails(r"'f' \(2,048 tokens\) should not be preempted by 'swap'"):
        check("6.2", lambda *a: _plan(*a, flip=True))
    with fails("answer 'swap' or 'recompute'"):
        check("6.2", lambda *a: [(n, "evict") for n, _ in _plan(*a)])
    with fails("list of \\(name, 'swap' or 'recompute'\\) pairs"):
        check("6.2", lambda *a: "recompute")


@pytest.mark.parametrize("slip, words", [(dict(stable_ties=True), "order|set"), (dict(floor_blocks=True), "too many|set")])
def test_6_2_each_named_step_matters_on_the_lab_and_hidden_cases(slip, words, fails):
    """Item 4: the prompt names the tie rule and whole blocks; dropping either fails the lab's own cases and
    the hidden ones (equal arrivals are drawn on purpose)."""
    with fails(words):
        check("6.2", lambda *a: _plan(*a, **slip))
    c = get("6.2")
    for seed in (b"hidden 1", b"hidden 2"):
        hidden = c.prepare(case_rng("6.2", seed))
        c.verdict(_plan, hidden)
        with pytest.raises(Mismatch):
            c.verdict(lambda *a: _plan(*a, **slip), hidden)


_DROPS_6_3 = {  # each step the prompt of 6.3 names, dropped: the answer it gives instead on givens g
    "KV with GQA_KV_HEADS": lambda g: dict(written_out(g), swap_advantage=written_out(dict(g, GQA_KV_HEADS=g["HEADS"]))[
        "swap_advantage"]),
    "FLOPs over all HEADS": lambda g: dict(written_out(g), recompute_ms=written_out(dict(g, HEADS=g["GQA_KV_HEADS"]))[
        "recompute_ms"]),
    "both ways over the link": lambda g: dict(written_out(g), breakeven_gbs=written_out(g)["breakeven_gbs"] / 2),
    "MFU × PEAK_FLOPS": lambda g: dict(written_out(g), recompute_ms=written_out(g)["recompute_ms"] * g["MFU"]),
    "GB/s as 1e9 B/s": lambda g: dict(written_out(g), breakeven_gbs=written_out(g)["breakeven_gbs"] * 1e9 / 2**30),
    "the MHA model for the crossover": lambda g: dict(written_out(g), crossover_tokens=written_out(
        dict(g, HEADS=g["GQA_KV_HEADS"]))["crossover_tokens"]),
    "SLOW_LINK_BW for the crossover": lambda g: dict(written_out(g), crossover_tokens=written_out(
        dict(g, SLOW_LINK_BW=g["LINK_BW"]))["crossover_tokens"]),
    "exact, not rounded": lambda g: dict(written_out(g), crossover_tokens=round(written_out(g)["crossover_tokens"], -2)),
    "the lecture's attention count": lambda g: written_out(g, attention=2),
}


def _fails(c, answer, g) -> bool:
    try:
        c.verdict(answer, c.expect(namespace(g)))
    except Mismatch:
        return True
    return False


@pytest.mark.parametrize("step", sorted(_DROPS_6_3))
def test_6_3_each_named_step_changes_the_answer_on_hidden_givens(step):
    """Item 4: every step 6.3's prompt names, dropped, fails `grade`, which wants the answer right on the lecture's
    givens and on two hidden sets: over many draws of two sets, each drop fails on one of the three.  (Every drop
    but the rounding fails on every hidden set; a crossover rounded to hundreds can land within the 2-token
    tolerance on a hidden set, never on the lecture's 5,195.19.)"""
    c = get("6.3")
    drawn = GIVENS[6].draw(case_rng("givens", b"lab06 drops", step), 24)
    for g1, g2 in zip(drawn[::2], drawn[1::2]):
        assert any(_fails(c, _DROPS_6_3[step](g), g) for g in (LECTURE, g1, g2)), step
    if step != "exact, not rounded":
        assert all(_fails(c, _DROPS_6_3[step](g), g) for g in drawn), step


# --- issue 35: 6.1 is a build the engine then uses, posed without its recipe -------------------------------

def test_6_1_lecture_case_by_hand_is_what_the_answer_scan_looks_for():
    """The record's first 6.1 case is the lecture's 4K MHA sequence on the H100, and the answer scan reads its
    result (LECTURE_RESULT): 2 x (4,096 x 524,288 B) x 0.5 x 989e12 / (2 x 6.74e9 x 4,096 + 4 x 32 x 32 x 128 x
    4,096^2) = 4.295e9 x 494.5e12 / 64.010e12 = 33.18 GB/s (the lecture prints 33.3)."""
    from labsupport.course import record

    (c,) = [c for c in record.read(6)["checkoffs"] if c["id"] == "6.1"]
    want = c["cases"][0]["spec"]["want"]
    assert want == pytest.approx(2 * 4096 * 524_288 * 0.5 * 989e12 / (2 * 6.74e9 * 4096 + 4 * 32 * 32 * 128 * 4096**2))
    assert round(want / 1e9, 2) == 33.18


def test_6_1_is_posed_without_its_recipe_or_its_numbers():
    """Before 6.1's solution region: no "set them equal and solve", no formula for the stalls, none of the
    lecture's 67 ms / 129 ms / 33.3 GB/s; the hint after a wrong check asks, it does not write the equation."""
    import re
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "solutions" / "06_engine_loop.py").read_text()
    before = source[:source.index("### BEGIN SOLUTION 6.1")]
    for giveaway in (r"set them equal", r"\bsolve\b", r"67(\.1)? ms", r"129(\.4)? ms", r"33\.\d", r"\\text\{KV\}/W",
                     r"LEDGER"):
        assert not re.search(giveaway, before), giveaway
    after = source[source.index("### END SOLUTION", source.index("### BEGIN SOLUTION 6.1")):]
    assert "breakeven_bandwidth(COURSE.mha, max(1, num_tokens)" in after  # the engine's policy calls it
    assert "equal and solve" not in get("6.1").hint


def test_no_lab_06_text_sends_the_student_to_the_ledger():
    from pathlib import Path

    assert "LEDGER" not in (Path(__file__).resolve().parents[1] / "solutions" / "06_engine_loop.py").read_text()
