"""Lab 01's build exercise: the five jobs charged from a run of the real engine (1.5), and what GQA-8 moves (1.4).

The expected numbers are worked by hand from the lecture's 7B on the lecture's H100 (6.74e9 parameters of 2 B,
512 KiB of KV per token, 3.35 TB/s), passed explicitly so that they hold on any course card, on a two-request run
small enough to follow step by step.  What GQA moves (1.4) is the lab's answer on the course card: derived from
it.  Two different correct derivations pass every case (on other models, block sizes and arrivals); each slip the
prompt warns about is rejected with its remark.
"""
from __future__ import annotations

import pytest

from labsupport import card
from labsupport.costmodel import CostModel
from labsupport.course.checkoff import check
from labsupport.course.checkoffs import get
from labsupport.course.checkoffs.lab01 import GQA_MOVES, LAB_POOL, LAB_REQUESTS
from labsupport.course.judge import Mismatch
from labsupport.course.registry import case_rng
from labsupport.measure.engine_runs import job_run
from labsupport.specs import LECTURE_7B, LECTURE_GPU, LECTURE_MFU

pytestmark = pytest.mark.usefixtures("fresh_results")

KV = 524_288  # 2 x 32 layers x 32 KV heads x 128 x 2 B


def walk(trace):
    """One derivation: walk the steps once, keeping who is live and when each request last got a token."""
    kv, lengths = trace["kv_bytes_per_token"], trace["requests"]
    live, promised, last, longest, pushed = set(), 0, {}, 0.0, 0
    for step in trace["steps"]:
        live = (live | set(step["admitted"])) - set(step["finished"])
        promised = max(promised, sum((lengths[r]["prompt_tokens"] + lengths[r]["max_new_tokens"]) * kv for r in live))
        for r, i in step["tokens"]:
            pushed += lengths[r]["prompt_tokens"] if i == 0 else 1
            if i:
                longest = max(longest, step["end_s"] - last[r])
            last[r] = step["end_s"]
    return {"admit": promised, "allocate": max(s["blocks_in_use"] for s in trace["steps"]) * trace["block_size"] * kv,
            "batch": sum(len(s["tokens"]) for s in trace["steps"]) / len(trace["steps"]),
            "run": 2 * trace["num_params"] * pushed, "stream": longest}


def per_request(trace):
    """Another: first each request's life (admitted at, finished at, token times), then the five numbers."""
    steps, lengths, kv = trace["steps"], trace["requests"], trace["kv_bytes_per_token"]
    born = {r: k for k, s in enumerate(steps) for r in s["admitted"]}
    died = {r: k for k, s in enumerate(steps) for r in s["finished"]}
    times = {r: [s["end_s"] for s in steps for q, _ in s["tokens"] if q == r] for r in born}
    whole = {r: (lengths[r]["prompt_tokens"] + lengths[r]["max_new_tokens"]) * kv for r in born}
    promised = max(sum(whole[r] for r in born if born[r] <= k < died[r]) for k in range(len(steps)))
    tokens = sum(len(t) for t in times.values())
    prefilled = sum(lengths[r]["prompt_tokens"] for r in born)
    gaps = [b - a for t in times.values() for a, b in zip(t, t[1:])]
    return {"admit": promised, "allocate": kv * trace["block_size"] * max(s["blocks_in_use"] for s in steps),
            "batch": tokens / len(steps), "run": 2.0 * trace["num_params"] * (prefilled + tokens - len(born)),
            "stream": max(gaps)}


def test_a_two_request_run_by_hand():
    """r0: 20-token prompt, 3 new tokens, from step 1; r1: 5 and 2, from step 2.  Step 1 prefills r0 (2 blocks);
    step 2 decodes r0 and prefills r1 (3 blocks); step 3 decodes both, and both finish (0 blocks)."""
    trace, _ = job_run(CostModel(LECTURE_7B, LECTURE_GPU), [(0, 20, 3), (1, 5, 2)], num_blocks=10)
    assert [s["blocks_in_use"] for s in trace["steps"]] == [2, 3, 0]
    got = walk(trace)
    assert got["admit"] == (23 + 7) * KV                    # both live after step 2: (20 + 3) + (5 + 2) tokens
    assert got["allocate"] == 3 * 16 * KV                   # 3 blocks of 16 tokens after step 2
    assert got["batch"] == pytest.approx(5 / 3)             # 1, 2, 2 tokens out of 3 steps
    assert got["run"] == 2 * 6.74e9 * (20 + 1 + 5 + 1 + 1)  # two prefills, then one token per decode
    # the longest wait is step 3, memory-bound: the weights (13.48 GB) and the KV both sequences attend to,
    # 22 + 6 tokens (r0: its 20-token prompt and the 2 tokens it has emitted, the last of which it appends now;
    # r1: 5 + 1), at 3.35 TB/s
    assert got["stream"] == pytest.approx((13.48e9 + 28 * KV) / 3.35e12, rel=1e-9)
    grader = get("1.5")
    grader.verdict(walk, [c for c in grader.cases(case_rng("1.5"))])


@pytest.mark.parametrize("derivation", [walk, per_request])
def test_two_derivations_pass_every_case(derivation):
    grader = get("1.5")
    for rng in (case_rng("1.5"), case_rng("1.5", b"hidden-1"), case_rng("1.5", b"hidden-2")):
        grader.verdict(derivation, grader.cases(rng))


SLIPS = {
    "admit": (lambda t, got: dict(got, admit=_prompts_only(t)), "outputs included"),
    "allocate": (lambda t, got: dict(got, allocate=got["allocate"] / t["kv_bytes_per_token"]), "in bytes"),
    "batch": (lambda t, got: dict(got, batch=sum(sum(1 for _, i in s["tokens"] if i) for s in t["steps"])
                                  / len(t["steps"])), "prefill runs in the step"),
    "run once": (lambda t, got: dict(got, run=got["run"] / 2), "two FLOP"),
    "run without prefills": (lambda t, got: dict(got, run=2 * t["num_params"] * sum(
        sum(1 for _, i in s["tokens"] if i) for s in t["steps"])), "prefills are arithmetic"),
    "stream mean": (lambda t, got: dict(got, stream=_mean_gap(t)), "mean gap"),
}


def _prompts_only(trace):
    kv, lengths, live, best = trace["kv_bytes_per_token"], trace["requests"], set(), 0
    for s in trace["steps"]:
        live = (live | set(s["admitted"])) - set(s["finished"])
        best = max(best, sum(lengths[r]["prompt_tokens"] * kv for r in live))
    return best


def _mean_gap(trace):
    times = {}
    for s in trace["steps"]:
        for r, _ in s["tokens"]:
            times.setdefault(r, []).append(s["end_s"])
    gaps = [b - a for t in times.values() for a, b in zip(t, t[1:])]
    return sum(gaps) / len(gaps)


@pytest.mark.parametrize("slip", SLIPS)
def test_each_step_the_prompt_names_matters(slip, capsys):
    """Dropping each step the prompt names fails on the lab's own cases and on hidden ones, with its remark."""
    wrong, remark = SLIPS[slip]
    answer = lambda trace: wrong(trace, walk(trace))  # noqa: E731
    for rng in (case_rng("1.5"), case_rng("1.5", b"hidden-1")):
        with pytest.raises(Mismatch):
            get("1.5").verdict(answer, get("1.5").cases(rng))
    check("1.5", answer)
    assert remark in capsys.readouterr().out


def test_gqa_moves_only_the_memory_jobs():
    """By hand, on the course card's model (MHA form against its GQA form) and GPU, as the lab runs it: GQA keeps the
    weights (same FLOP per token) and the pool of 600 blocks with arrivals by step (same places); KV per token falls
    by the ratio of KV heads (admit and allocate, in bytes; 32 / 8 = 4x on the lecture's 7B).  The longest wait is
    the step that prefills the 2,048-token prompt, compute-bound: 2 x params x 2,048 FLOP at half of the card's
    peak (the lecture's card: 2 x 6.74e9 x 2,048 at half of 989 TFLOP/s is 55.8 ms against about 4 ms of reads) —
    and attention's FLOPs do not depend on the KV heads — so it does not move."""
    assert GQA_MOVES == frozenset({"admit", "allocate"})
    course = card.card()
    ratio = course.mha.num_kv_heads // course.gqa.num_kv_heads
    assert ratio * course.gqa.num_kv_heads == course.mha.num_kv_heads and ratio > 1
    mha = walk(job_run(CostModel(course.mha, course.gpu), LAB_REQUESTS, num_blocks=LAB_POOL)[0])
    gqa = walk(job_run(CostModel(course.gqa, course.gpu), LAB_REQUESTS, num_blocks=LAB_POOL)[0])
    assert gqa["admit"] * ratio == mha["admit"] and gqa["allocate"] * ratio == mha["allocate"]
    assert gqa["batch"] == mha["batch"] and gqa["run"] == mha["run"]
    assert gqa["stream"] == pytest.approx(mha["stream"], rel=1e-9)
    assert mha["stream"] > 2 * course.mha.num_params * 2_048 / (LECTURE_MFU * course.gpu.peak_flops)
