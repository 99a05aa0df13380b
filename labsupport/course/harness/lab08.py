"""Lab 08's harness: §10.7, the map of Part II, and the vLLM knobs, beside checkoffs/lab08.py.

Checkoff 8.7 is an open question (any decode-heavy workload with the property passes, so there is no answer here):
its judge "utilization_workload" runs the engine on the student's workload, naive and paged.  Checkoff 8.8: the
harness "spec_fields" hands the student's changed machine back as the specs' fields.  8.1's and 8.2's judge,
"matching", is shared with lab 01 and lives in the package's __init__.
"""
from __future__ import annotations

import math

from labsupport.course import data
from labsupport.course.harness.base import harness, judge
from labsupport.course.judge import Mismatch


def load_bar(slots: int) -> tuple[int, int]:
    """8.7's bar on a workload's load: (the sequences the engine may run at once, the fewest it must run at its
    busiest).  The engine runs at most max_num_seqs (vLLM's 256) whatever the slots (H200 or B200 with Qwen2.5-7B
    have more), and more than two thirds of those is a load at which slots could bind, so "unmoved" is a finding."""
    from labsupport.measure.replay import ReplayConfig

    runnable = min(slots, ReplayConfig().max_num_seqs)
    return runnable, runnable * 2 // 3 + 1


@judge("utilization_workload")
def _utilization_workload(got, spec) -> None:
    """8.7: the returned (arrival_s, prompt_tokens, output_tokens) workload, run naive and paged."""
    from labsupport.measure.replay import utilization_run

    try:
        requests = [(float(a), int(p), int(o)) for a, p, o in got]
    except (TypeError, ValueError, OverflowError):
        raise Mismatch("utilization_workload() must return a list of (arrival_s, prompt_tokens, output_tokens) "
                       "tuples.") from None
    if not 100 <= len(requests) <= 1500:
        raise Mismatch(f"your workload has {len(requests)} requests; use between 100 and 1,500 so the "
                       "comparison means something and the grader stays quick.")
    for a, p, o in requests:
        if not math.isfinite(a) or a < 0 or p < 1 or o < 1 or p + o > 4096:
            raise Mismatch(f"request (arrival {a}, prompt {p}, output {o}) is not allowed: arrivals >= 0, at "
                           "least one prompt and one output token, and prompt + output within S_max = 4,096.")
    if sum(p + o for _, p, o in requests) > 3_000_000:
        raise Mismatch("your workload holds more than 3 million tokens in all; a smaller one makes the point.")
    if prefill_heavy := sum(o < p for _, p, o in requests):
        raise Mismatch(f"{prefill_heavy} of your {len(requests)} requests have a prompt longer than their output; "
                       "this construction asks for a decode-heavy workload, every output at least as long as its "
                       "prompt (the sweep's chat requests are 512 in, 128 out, the other way round). Its rates do not "
                       "carry over as they are: a request's life on the card is set by how many steps it decodes.")
    try:  # one S_max block per sequence (reserve-to-max), then paging
        naive, paged = utilization_run(requests, 4096), utilization_run(requests, 16)
    except ValueError as exc:
        raise Mismatch(f"your workload does not run: {exc}") from None
    naive_util, naive_tput, naive_peak = naive.utilization, naive.throughput_tok_s, naive.peak_running
    paged_util, paged_tput = paged.utilization, paged.throughput_tok_s
    if naive_util > 0.20:
        raise Mismatch(f"under reserve-to-max your workload already uses {naive_util:.1%} of what it reserves; the "
                       "claim starts near 15%.")
    if naive_util < 0.10:
        raise Mismatch(f"under reserve-to-max your workload uses only {naive_util:.1%} of what it reserves; the claim "
                       "starts near 15% — sequences so short are not the workload the lecture means (its chat "
                       "sequences hold 640 of 4,096 tokens).")
    slots = naive.slots  # reserve-to-max's slots on the course card (the lecture's 29)
    runnable, busy = load_bar(slots)
    if naive_peak < busy:
        of = f"its {slots} slots" if runnable == slots else f"the {runnable} it may run at once ({slots} slots)"
        raise Mismatch(f"at its busiest the reserve-to-max engine runs only {naive_peak} sequences of {of}: "
                       "on a card that idle nothing could move throughput, and the claim says nothing. Raise the arrival "
                       f"rate until the naive engine runs at least {busy} at once, and see whether throughput still holds.")
    if paged_util < 0.95:
        raise Mismatch(f"paged utilization is only {paged_util:.1%}; the claim ends near 99%.")
    if not naive_tput > 0:
        raise Mismatch("no request of your workload finished under reserve-to-max; the engine produced no tokens.")
    if abs(paged_tput / naive_tput - 1) > 0.05:
        raise Mismatch(f"throughput moved from {naive_tput:,.0f} to {paged_tput:,.0f} tok/s "
                       f"({paged_tput / naive_tput - 1:+.1%}); it should barely move (within 5%).")


# --- 8.8's changed machine, handed back as the specs' fields ------------------------------------------------------
@harness("spec_fields")
def _spec_fields(fn, case) -> dict:
    """Call fn(*args) on labsupport specs; what comes back is a pair of specs, read as their fields (plain data)."""
    from dataclasses import asdict, is_dataclass

    result = fn(*data.build(case["args"]))
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and all(is_dataclass(r) for r in result)):
        return {"result": data.plain(result) if isinstance(result, (int, float, str, list, tuple)) else
                f"a {type(result).__name__}"}
    return {"result": [{type(r).__name__: asdict(r)} for r in result]}
