"""The SLO ledger of §10.6: throughput, goodput, and where TTFT went, for one engine run.

Goodput counts only requests that met their SLO (TTFT and TPOT); throughput counts every token.
TTFT splits into scheduling delay, queueing and prefill (`labsupport.engine.RequestResult`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labsupport.engine import EngineResult


def _pct(values: list[float], q: float) -> float:
    """Percentile by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class SLOReport:
    """§10.6's ledger for one run: throughput, goodput and where TTFT went."""

    requests: int
    finished: int
    rejected: int
    duration_s: float
    output_tokens: int
    throughput_tok_s: float
    throughput_req_s: float
    ttft_slo_s: float
    tpot_slo_s: float
    good_requests: int
    good_tokens: int
    goodput_req_frac: float
    goodput_tok_frac: float
    goodput_tok_s: float
    ttft: dict  # p50 / p99 / mean of ttft, queueing, prefill, scheduling_delay (seconds)
    tpot: dict  # p50 / p99 / mean (seconds)
    preemptions: dict
    swapped_out_bytes: int
    swapped_in_bytes: int
    recomputed_tokens: int
    peak_blocks: int
    num_blocks: int
    leaked_blocks: int
    steps: int
    rejections: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def slo_report(result: EngineResult, ttft_slo_s: float, tpot_slo_s: float) -> SLOReport:
    """Goodput counts a request (and its tokens) only if TTFT <= ttft_slo_s and TPOT <= tpot_slo_s.

    Rejected requests count against goodput (their requested tokens are in the token denominator).
    Duration runs from the first arrival to the last finish.
    """
    for name, v in (("ttft_slo_s", ttft_slo_s), ("tpot_slo_s", tpot_slo_s)):
        if not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
    reqs = list(result.requests.values())
    fin = [r for r in reqs if r.finished]
    parts = {"ttft": [], "queueing": [], "prefill": [], "scheduling_delay": []}
    tpots = []
    good = good_tok = out_tok = want_tok = 0
    for r in reqs:
        if not r.finished:
            want_tok += r.n * r.max_new_tokens
            continue
        tok = r.total_output_tokens
        out_tok += tok
        want_tok += tok
        parts["ttft"].append(r.ttft_s)
        parts["queueing"].append(r.queueing_s)
        parts["prefill"].append(r.prefill_s)
        parts["scheduling_delay"].append(r.scheduling_delay_s)
        if r.tpot_s is not None:
            tpots.append(r.tpot_s)
        if r.ttft_s <= ttft_slo_s and (r.tpot_s is None or r.tpot_s <= tpot_slo_s):
            good += 1
            good_tok += tok
    start = min((r.arrival_time for r in reqs), default=0.0)
    end = max((r.finish_time for r in fin), default=start)
    dur = end - start
    stats = lambda xs: {"p50": _pct(xs, 50), "p99": _pct(xs, 99), "mean": sum(xs) / len(xs) if xs else math.nan}
    c = result.counters
    return SLOReport(
        requests=len(reqs), finished=len(fin), rejected=sum(1 for r in reqs if r.status == "rejected"),
        duration_s=dur, output_tokens=out_tok,
        throughput_tok_s=out_tok / dur if dur > 0 else math.nan,
        throughput_req_s=len(fin) / dur if dur > 0 else math.nan,
        ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, good_requests=good, good_tokens=good_tok,
        goodput_req_frac=good / len(reqs) if reqs else math.nan,
        goodput_tok_frac=good_tok / want_tok if want_tok else math.nan,
        goodput_tok_s=good_tok / dur if dur > 0 else math.nan,
        ttft={k: stats(v) for k, v in parts.items()}, tpot=stats(tpots),
        preemptions=dict(c.preemptions), swapped_out_bytes=c.swapped_out_bytes,
        swapped_in_bytes=c.swapped_in_bytes, recomputed_tokens=c.recomputed_tokens, peak_blocks=c.peak_blocks,
        num_blocks=result.num_blocks, leaked_blocks=c.leaked_blocks, steps=c.steps,
        rejections=[f"request {r.request_id}: {r.reason}" for r in reqs if r.status == "rejected"])
