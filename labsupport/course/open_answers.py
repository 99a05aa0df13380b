"""Judges of open questions: checkoffs that any answer with the asked-for property passes (§10.7).

An open question has no expected value to hide, so its judge ships with the student release as it
is and gives the same feedback there as in the repository.  Today that is discussion seed 4
(checkoff 8.7): a decode-heavy workload whose utilization goes from about 15% to 99% under paging while
its throughput barely moves on a busy card, measured on the real engine.
"""
from __future__ import annotations

import math

from labsupport.course.checkoff import Mismatch, call


def _measure(requests, block_size: int) -> tuple[float, float, int]:
    """(time-averaged share of reserved KV slots holding tokens, output tokens/s, the most sequences
    running at once), read off the real engine on the lecture's H100 pool (cost-model clock)."""
    from labsupport.viz.slo import utilization_run

    try:
        run = utilization_run(requests, block_size)
    except ValueError as exc:
        raise Mismatch(f"your workload does not run: {exc}") from None
    return run.utilization, run.throughput_tok_s, run.peak_running


BUSY_SLOTS = 20  # of reserve-to-max's 29 slots: a load at which slots could bind, so "unmoved" is a finding


def utilization_workload_verdict(fn) -> None:
    """Checkoff 8.7: run the student's workload naive (one S_max block per sequence) and paged (b = 16)."""
    workload = call(fn)
    try:
        requests = [(float(a), int(p), int(o)) for a, p, o in workload]
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
    prefill_heavy = sum(o < p for _, p, o in requests)
    if prefill_heavy:
        raise Mismatch(f"{prefill_heavy} of your {len(requests)} requests have a prompt longer than their output; "
                       "this construction asks for a decode-heavy workload, every output at least as long as its "
                       "prompt (the sweep's chat requests are 512 in, 128 out, the other way round). Its rates do "
                       "not carry over as they are: a request's life on the card is set by how many steps it "
                       "decodes.")
    naive_util, naive_tput, naive_peak = _measure(requests, 4096)  # one S_max block per sequence: reserve-to-max
    paged_util, paged_tput, _ = _measure(requests, 16)
    if naive_util > 0.20:
        raise Mismatch(f"under reserve-to-max your workload already uses {naive_util:.1%} of what it reserves; the "
                       "claim starts near 15%.")
    if naive_util < 0.10:
        raise Mismatch(f"under reserve-to-max your workload uses only {naive_util:.1%} of what it reserves; the claim "
                       "starts near 15% — sequences so short are not the workload the lecture means (its chat "
                       "sequences hold 640 of 4,096 tokens).")
    if naive_peak < BUSY_SLOTS:
        raise Mismatch(f"at its busiest the reserve-to-max engine runs only {naive_peak} sequences of its 29 slots: "
                       "on a card that idle nothing could move throughput, and the claim says nothing. Raise the "
                       f"arrival rate until the naive engine runs at least {BUSY_SLOTS} at once, and see whether "
                       "throughput still holds.")
    if paged_util < 0.95:
        raise Mismatch(f"paged utilization is only {paged_util:.1%}; the claim ends near 99%.")
    if not naive_tput > 0:
        raise Mismatch("no request of your workload finished under reserve-to-max; the engine produced no tokens.")
    if abs(paged_tput / naive_tput - 1) > 0.05:
        raise Mismatch(f"throughput moved from {naive_tput:,.0f} to {paged_tput:,.0f} tok/s "
                       f"({paged_tput / naive_tput - 1:+.1%}); it should barely move (within 5%).")
