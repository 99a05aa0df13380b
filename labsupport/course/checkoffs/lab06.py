"""Lab 06 checkoffs: the engine loop, preemption, and swap versus recompute (§10.5, Exercise 4).

Expected values are written out here from the lecture's formulas and the presets' fields (not
read from `labsupport.ledger`, which the lab compares against separately), and the victim policy
is the engine's stated one: the sequence of the latest-arriving request goes first.
"""
from __future__ import annotations

import math
import types
from dataclasses import replace

from labsupport.course.checkoff import Mismatch, as_number, call, function, units_slip, value
from labsupport.course.checkoffs._hidden import random_pair
from labsupport.course.registry import givens
from labsupport.specs import GB, GPUS, LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, LLAMA3_70B, ModelSpec
from labsupport.units import fmt_number

MFU = 0.5
# The ledger's and the cost model's one-call answers to §10.5's questions.
_PREEMPT_SHORTCUTS = ("labsupport.ledger.breakeven_link_bandwidth", "labsupport.ledger.crossover_tokens",
                      "labsupport.ledger.preempt_choice", "labsupport.ledger.recompute_s",
                      "labsupport.ledger.swap_round_trip_s", "labsupport.ledger.prefill_flops",
                      "labsupport.costmodel.CostModel", "labsupport.viz.engine.swap_recompute",
                      "labsupport.viz.engine.breakeven_figure",
                      # a group of one is one sequence: the fan-out versions give the same swap bytes, FLOPs, W*
                      "labsupport.ledger.group_breakeven_link_bandwidth", "labsupport.ledger.group_recompute_flops",
                      "labsupport.ledger.group_swap_bytes")
_FP32_SMALL = ModelSpec("tiny-fp32", 4, 4, 2, 32, 0.8e6, dtype_bytes=4)


def _kv_bytes(model: ModelSpec, tokens: int) -> float:
    return tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes


def _prefill_flops(model: ModelSpec, tokens: int) -> float:
    # weights: 2 FLOP per parameter per token; attention: QK^T and PV over every earlier key, every query head
    return 2 * model.num_params * tokens + 4 * model.num_layers * model.num_heads * model.head_dim * tokens ** 2


def _breakeven(model: ModelSpec, tokens: int, peak: float, mfu: float) -> float:
    # 2 * KV / W = FLOPs / (mfu * peak)  =>  W* = 2 * KV * mfu * peak / FLOPs
    return 2 * _kv_bytes(model, tokens) * mfu * peak / _prefill_flops(model, tokens)


# --- 6.1: the break-even bandwidth --------------------------------------------------------------

_BREAKEVEN_CASES = [(m, s, g, mfu) for m, s, g, mfu in (
    (LECTURE_7B, 4096, "h100", MFU), (LECTURE_7B_GQA8, 4096, "h100", MFU), (LECTURE_7B_GQA8, 16_384, "h100", MFU),
    (LECTURE_7B, 1, "h100", MFU), (LECTURE_7B, 131_072, "h100", MFU), (LLAMA3_70B, 8192, "h200", 0.4),
    (LLAMA3_8B, 2048, "a100-80gb", 0.6), (LECTURE_7B, 640, "l4", 1.0), (_FP32_SMALL, 300, "t4", 0.25),
    (replace(LECTURE_7B, name="lecture-7b-fp8", dtype_bytes=1), 4096, "h100", MFU),
)]


def _breakeven_cases(rng):
    cases = [(model, tokens, GPUS[gpu], mfu) for model, tokens, gpu, mfu in _BREAKEVEN_CASES]
    for _ in range(6):
        model, gpu = random_pair(rng)
        cases.append((model, rng.choice((1, 100, 640, 4096, 20_000, 100_000)), gpu,
                      rng.choice((0.2, 0.35, 0.5, 0.8, 1.0))))
    return cases


@function(
    "6.1", "The swap/recompute break-even bandwidth",
    hint="Write both stalls as functions of the link bandwidth W. Swapping moves the sequence's KV bytes out and "
         "later back in over the link. Recomputing redoes the prefill: 2 FLOP per parameter per token, plus "
         "attention's QK^T and PV, which every query head does against the keys, counted as the lecture does: "
         "each of the S tokens against all S keys (grouped-query attention shrinks the cache, not that arithmetic). Divide the FLOPs by the rate you actually achieve (mfu × peak). "
         "Set the two times equal and solve for W.",
    cases=_breakeven_cases,
    forbid=_PREEMPT_SHORTCUTS,
    derive="write the swap round trip and the recompute time from the model's fields, set them equal, solve for W",
)
def _breakeven_check(fn, case):
    model, tokens, gpu, mfu = case
    want = _breakeven(model, tokens, gpu.peak_flops, mfu)
    what = f"breakeven_bandwidth({model.name}, seq_tokens={tokens:,}, peak_flops={gpu.peak_flops:.4g}, mfu={mfu})"
    got = as_number(call(fn, model, tokens, gpu.peak_flops, mfu), f"{what} returned a value that")
    if math.isclose(got, want, rel_tol=1e-6):
        return
    remark = ""
    causal = 2 * _kv_bytes(model, tokens) * mfu * gpu.peak_flops / (
        2 * model.num_params * tokens + 2 * model.num_layers * model.num_heads * model.head_dim * tokens ** 2)
    if tokens > 1 and math.isclose(got, causal, rel_tol=1e-6):
        # checked first: at 4K tokens the causal ratio (1.07) happens to look like a GB/GiB slip
        remark = (" You counted attention causally, each query against only the keys before it (2·L·H·d·S² in "
                  "all). That is what a causal kernel does, but this exercise uses the lecture's count, every "
                  "query against all S keys (4·L·H·d·S²), which gives §10.5's 55.2 + 8.8 TFLOP and 129 ms.")
    elif math.isclose(got, want / 2, rel_tol=1e-6):
        remark = " A swap costs two trips over the link: out now, back in when the sequence resumes."
    elif math.isclose(got, want / mfu, rel_tol=1e-6) and mfu != 1:
        remark = " The prefill runs at mfu × peak, not at peak."
    elif model.num_kv_heads != model.num_heads:
        kv_attn = 2 * _kv_bytes(model, tokens) * mfu * gpu.peak_flops / (
            2 * model.num_params * tokens + 4 * model.num_layers * model.num_kv_heads * model.head_dim * tokens ** 2)
        if math.isclose(got, kv_attn, rel_tol=1e-6):
            remark = " Attention FLOPs count query heads: GQA shares K and V, every query head still attends."
    if not remark:
        remark = " " + (units_slip(got, want) or "")
    raise Mismatch(f"{what} returned {fmt_number(got)} B/s, which is too {'high' if got > want else 'low'}.{remark}".rstrip())


# --- 6.2: the preemption decision ----------------------------------------------------------------

def _plan(running, blocks_needed, block_size, model, gpu, link, mfu):
    order = sorted(running, key=lambda r: r[1], reverse=True)  # latest arrival first
    plan, freed = [], 0
    for name, _, tokens in order:
        if freed >= blocks_needed:
            break
        swap_s = 2 * _kv_bytes(model, tokens) / link
        recompute_s = _prefill_flops(model, tokens) / (mfu * gpu.peak_flops)
        plan.append((name, "swap" if swap_s < recompute_s else "recompute"))
        freed += -(-tokens // block_size)
    return plan


_RUNNING = [("a", 0.0, 9000), ("b", 0.5, 700), ("c", 1.25, 5400), ("d", 2.0, 300), ("e", 3.0, 12_000),
            ("f", 3.5, 2048)]
_PLAN_CASES = [  # (running, blocks needed, block size, model, gpu, link bytes/s)
    (_RUNNING, 1, 16, LECTURE_7B, "h100", 32 * GB),
    (_RUNNING, 200, 16, LECTURE_7B, "h100", 32 * GB),
    (_RUNNING, 900, 16, LECTURE_7B, "h100", 32 * GB),
    (_RUNNING, 800, 16, LECTURE_7B, "h100", 64 * GB),
    (_RUNNING, 800, 16, LECTURE_7B_GQA8, "h100", 8 * GB),
    (_RUNNING, 3000, 16, LECTURE_7B, "a100-80gb", 10 * GB),
    (list(reversed(_RUNNING)), 129, 64, LECTURE_7B, "h100", 32 * GB),
    (_RUNNING, 2, 256, LLAMA3_70B, "h100", 12 * GB),
]


def _plan_cases(rng):
    cases = [(running, need, bs, model, GPUS[gpu_name], link) for running, need, bs, model, gpu_name, link in _PLAN_CASES]
    for _ in range(4):
        model, gpu = random_pair(rng, fits=True)
        arrivals = rng.sample(range(60_000), rng.randint(2, 9))  # distinct: the order is never a tie
        running = [(f"r{i}", t / 1000, rng.randint(1, 40_000)) for i, t in enumerate(arrivals)]
        bs = rng.choice((1, 8, 16, 32, 128))
        total = sum(-(-t // bs) for _, _, t in running)
        cases.append((running, rng.randint(1, total), bs, model, gpu, rng.choice((4, 16, 32, 64, 200)) * GB))
    return [(*case, _plan(*case, MFU)) for case in cases]


@function(
    "6.2", "Which sequences the engine preempts, and how",
    hint="Two decisions. Who: the engine keeps first-come-first-served order, so it gives up on the request that "
         "arrived last, then the one before it, until the victims' blocks cover what is needed (a sequence holds "
         "ceil(tokens / block_size) blocks). How: for each victim separately, compare the round trip of its KV over "
         "the link with redoing its prefill at mfu × peak — the answer depends on its length, which is why one "
         "global policy is wrong for a mixed-length batch.",
    cases=_plan_cases,
    forbid=_PREEMPT_SHORTCUTS,
    derive="sort by arrival, latest first, and compare each victim's swap round trip with its recompute yourself",
)
def _plan_check(fn, case):
    running, need, bs, model, gpu, link, want = case
    what = (f"preemption_plan(<{len(running)} sequences>, blocks_needed={need}, block_size={bs}, {model.name}, "
            f"{gpu.name}, link={link / GB:g} GB/s)")
    got = call(fn, [tuple(r) for r in running], need, bs, model, gpu, link, MFU)
    if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
        raise Mismatch(f"{what} returned {got!r}; return a list of (name, 'swap' or 'recompute') pairs.")
    got = [tuple(x) if isinstance(x, (list, tuple)) else x for x in got]
    if any(not isinstance(x, tuple) or len(x) != 2 for x in got):
        raise Mismatch(f"{what} returned {got!r}; each entry is a pair (name, 'swap' or 'recompute').")
    names_got, names_want = [x[0] for x in got], [x[0] for x in want]
    if names_got != names_want:
        if set(names_got) == set(names_want):
            raise Mismatch(f"{what}: you preempt the right sequences in the wrong order.")
        raise Mismatch(f"{what}: you preempt {names_got}; that is {'too many' if len(names_got) > len(names_want) else 'not the right set'}"
                       f" for {need} block(s) under the engine's first-come-first-served policy.")
    for (name, kind), (_, want_kind) in zip(got, want):
        if not isinstance(kind, str) or kind.strip().lower() not in ("swap", "recompute"):
            raise Mismatch(f"{what}: the decision for {name!r} is {kind!r}; answer 'swap' or 'recompute'.")
        if kind.strip().lower() != want_kind:
            tokens = next(r[2] for r in running if r[0] == name)
            raise Mismatch(f"{what}: {name!r} ({tokens:,} tokens) should not be preempted by {kind!r} on this link.")


# --- 6.3: Exercise 4's numbers -------------------------------------------------------------------

# The quantities Exercise 4 is posed on: the lecture's 7B (its MHA form and its GQA form share every
# field but the KV heads), the card's peak and achieved share, its host link, the slower link of the
# crossover question, and the long sequence's length.
G = givens(
    lecture=dict(LAYERS=32, HEADS=32, GQA_KV_HEADS=8, HEAD_DIM=128, DTYPE_BYTES=2, PARAMS=6.74e9,
                 PEAK_FLOPS=989e12, MFU=0.5, LINK_BW=64e9, SLOW_LINK_BW=32e9, LONG_SEQ=16_384),
    hidden=lambda rng: _hidden_exercise4(rng),
)


def _models(g) -> tuple[ModelSpec, ModelSpec]:
    """(the MHA model, its GQA form) from the givens."""
    mha = ModelSpec("givens-mha", g.LAYERS, g.HEADS, g.HEADS, g.HEAD_DIM, g.PARAMS, dtype_bytes=g.DTYPE_BYTES)
    return mha, replace(mha, name="givens-gqa", num_kv_heads=g.GQA_KV_HEADS)


def _crossover(model: ModelSpec, link: float, rate: float, attention_coef: int = 4) -> float:
    # 2 S kv / W = (2 N S + c L H d S^2) / F  =>  S = (2 kv F / W - 2 N) / (c L H d)
    return (2 * _kv_bytes(model, 1) * rate / link - 2 * model.num_params) / (
        attention_coef * model.num_layers * model.num_heads * model.head_dim)


def _hidden_exercise4(rng) -> dict:
    """Another plausible model, card and link, for which the MHA crossover on the slow link is a length."""
    while True:
        layers, heads = rng.choice((24, 28, 40, 48)), rng.choice((16, 24, 40, 64))
        g = dict(LAYERS=layers, HEADS=heads, GQA_KV_HEADS=rng.choice((1, 2, 4)),
                 HEAD_DIM=rng.choice((64, 80, 96, 256)), DTYPE_BYTES=rng.choice((1, 4)),
                 PARAMS=rng.choice((1.3e9, 3.0e9, 8.0e9, 13.0e9)), PEAK_FLOPS=rng.choice((312e12, 756e12, 1979e12)),
                 MFU=rng.choice((0.3, 0.4, 0.6)), LINK_BW=rng.choice((16e9, 25e9, 50e9, 128e9)),
                 SLOW_LINK_BW=rng.choice((8e9, 12e9, 16e9, 24e9)), LONG_SEQ=rng.choice((8192, 12_000, 24_576, 32_768)))
        mha, _ = _models(types.SimpleNamespace(**g))
        if 100 < _crossover(mha, g["SLOW_LINK_BW"], g["MFU"] * g["PEAK_FLOPS"]) < 10**6:
            return g


class _Exercise4(dict):
    """The four numbers, with the plausible wrong ones for these givens and what each is."""
    mistakes: dict


def _exercise4(g) -> dict[str, float]:
    mha, gqa = _models(g)
    rate = g.MFU * g.PEAK_FLOPS
    s = g.LONG_SEQ
    swap = 2 * _kv_bytes(gqa, s) / g.LINK_BW
    rec = _prefill_flops(gqa, s) / rate
    want = _Exercise4(recompute_ms=1e3 * rec, swap_advantage=rec / swap, breakeven_gbs=2 * _kv_bytes(gqa, s) / rec / GB,
                      crossover_tokens=_crossover(mha, g.SLOW_LINK_BW, rate))
    kv_attn = (2 * gqa.num_params * s + 4 * gqa.num_layers * gqa.num_kv_heads * gqa.head_dim * s ** 2) / rate
    causal = (2 * gqa.num_params * s + 2 * gqa.num_layers * gqa.num_heads * gqa.head_dim * s ** 2) / rate
    want.mistakes = {
        "recompute_ms": [
            (1e3 * kv_attn, "That counts attention over the KV heads; every query head attends (GQA shares K and V, "
                            "not the arithmetic)."),
            (1e3 * causal, "That counts attention causally (each query against the keys before it, 2·L·H·d·S²); "
                           "this exercise uses the lecture's count, every query against all S keys (4·L·H·d·S²)."),
            (1e3 * rec * g.MFU, "That is the prefill at the card's peak; it runs at MFU × peak."),
            (1e3 * 2 * gqa.num_params * s / rate, "That is the weights' FLOPs alone; attention's QK^T and PV are "
                                                   "part of the prefill too.")],
        "swap_advantage": [
            (rec / (swap / 2), "That prices a one-way trip; a swap goes out over the link now and back in later."),
            (rec / (2 * _kv_bytes(mha, s) / g.LINK_BW), "That swaps the MHA cache; the 16K sequence is the GQA "
                                                         "model's, whose KV has GQA_KV_HEADS heads.")],
        "breakeven_gbs": [
            (_kv_bytes(gqa, s) / rec / GB, "That is the one-way bandwidth; the swap moves the KV twice."),
            (2 * _kv_bytes(mha, s) / rec / GB, "That uses the MHA cache; the sequence is the GQA model's.")],
        "crossover_tokens": [
            (_crossover(mha, g.SLOW_LINK_BW, rate, 2), "That is the root with attention counted causally "
                                                        "(2·L·H·d·S²); the lecture's count is every query against "
                                                        "all S keys, 4·L·H·d·S²."),
            (_crossover(mha, g.SLOW_LINK_BW, rate, 8), "That is half the root, which twice the lecture's attention "
                                                        "term (8·L·H·d·S²) gives — the slip behind the lecture's "
                                                        "printed ≈ 2,600: count QK^T and PV once each, 2 FLOP a pair."),
            (_crossover(mha, g.SLOW_LINK_BW, g.PEAK_FLOPS), "That prices the recompute at the card's peak; it runs "
                                                             "at MFU × peak.")],
    }
    return want


_EX4_TOL = {"recompute_ms": (2e-3, 0.0), "swap_advantage": (1e-2, 0.0), "breakeven_gbs": (1e-2, 0.0),
            "crossover_tokens": (0.0, 2.0)}
_EX4_HINTS = {
    "recompute_ms": "the LONG_SEQ-token GQA prefill: weights' FLOPs plus attention's (query heads!), at MFU × peak",
    "swap_advantage": "recompute time over the swap round trip (both ways over LINK_BW)",
    "breakeven_gbs": "the link bandwidth at which the long GQA sequence's swap round trip equals its recompute, in "
                     "GB/s (1e9 B/s)",
    "crossover_tokens": "the MHA sequence length at which swap and recompute cost the same on SLOW_LINK_BW",
}


def _grade_exercise4(answer, want) -> None:
    if not isinstance(answer, dict) or set(answer) != set(_EX4_TOL):
        raise Mismatch(f"answer with a dict with exactly the keys {sorted(_EX4_TOL)}; you gave {answer!r}.")
    for key, (rel, abs_) in _EX4_TOL.items():
        got = as_number(answer[key], f"'{key}'")
        if math.isclose(got, want[key], rel_tol=rel, abs_tol=abs_):
            continue
        remark = next((f" {why}" for wrong, why in getattr(want, "mistakes", {}).get(key, ())
                       if math.isclose(got, wrong, rel_tol=max(rel, 1e-6), abs_tol=abs_)), "")
        if remark:
            pass
        elif key == "crossover_tokens" and math.isclose(got, 2600, abs_tol=60):
            remark = (" About 2,600 is the lecture's printed figure, which is not the root of the lecture's own "
                      "equation; solve it exactly.")
        elif key == "crossover_tokens" and got == 0:
            remark = " With the GQA cache swap may win at every length on the slow link; the question is about MHA."
        else:
            slip = units_slip(got, want[key])
            remark = f" {slip}" if slip else ""
        raise Mismatch(f"'{key}' ({_EX4_HINTS[key]}) is {fmt_number(got)}, which is too {'high' if got > want[key] else 'low'}."
                       + remark)


value(
    "6.3", "Exercise 4: the long GQA sequence, and the MHA crossover on the slow link",
    hint="Use the physics of 6.1 on the givens. For the long GQA sequence the KV bytes use GQA_KV_HEADS, the "
         "prefill FLOPs all HEADS query heads; the swap goes over LINK_BW both ways, the prefill runs at MFU × "
         "PEAK_FLOPS. For the crossover write swap(S) = recompute(S) for the MHA model (KV heads = HEADS) on "
         "SLOW_LINK_BW: the swap side is linear in S, the recompute side has an S and an S² term, so after dividing "
         "by S the equation is linear — solve it exactly rather than trusting a printed figure.",
    expected=_exercise4, judge=_grade_exercise4,
    forbid=_PREEMPT_SHORTCUTS,
    derive="write the swap and recompute times out from the givens (your own break-even function may help)",
    formative={"per_key": {key: list(tol) for key, tol in _EX4_TOL.items()}},
)
