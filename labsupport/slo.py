"""The SLO ledger of §10.6: throughput, goodput, and where TTFT went, for one engine run.

Goodput counts only requests that met their SLO (TTFT and TPOT); throughput counts every token.
TTFT splits into scheduling delay, queueing and prefill (`labsupport.engine.RequestResult`).
A statistic with nothing to measure (a percentile of no requests, a TPOT when no request produced
a second token, a rate over no time) is None, and `SLOReport.notes` says why: never NaN.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Protocol

from labsupport import ledger
from labsupport.checks import as_real
from labsupport import card
from labsupport.specs import GB, LECTURE_7B, LECTURE_GPU, GPUSpec, ModelSpec


class EngineRun(Protocol):
    """What the ledger reads of a run: `labsupport.engine.EngineResult` is one.  The engine reports its
    runs through this module (`EngineResult.slo`), so the ledger names only the fields it reads."""

    requests: Mapping[int, Any]  # request id -> RequestResult (status, timeline, tokens)
    counters: Any  # preemptions, swapped bytes, recomputed tokens, peak and leaked blocks, steps
    num_blocks: int


def _pct(values: list[float], q: float) -> float | None:
    """Percentile by linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
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
    throughput_tok_s: float | None  # None when the run spans no time (nothing finished)
    throughput_req_s: float | None
    ttft_slo_s: float
    tpot_slo_s: float
    good_requests: int
    good_tokens: int
    goodput_req_frac: float | None
    goodput_tok_frac: float | None
    goodput_tok_s: float | None
    ttft: dict  # p50 / p99 / mean of ttft, queueing, prefill, scheduling_delay (seconds; None without data)
    tpot: dict  # p50 / p99 / mean (seconds; None when no request produced a second token)
    preemptions: dict
    swapped_out_bytes: int
    swapped_in_bytes: int
    recomputed_tokens: int
    peak_blocks: int
    num_blocks: int
    leaked_blocks: int
    steps: int
    rejections: list[str]
    notes: list[str]  # why each None above is undefined

    def as_dict(self) -> dict:
        return asdict(self)


def slo_report(result: EngineRun, ttft_slo_s: float, tpot_slo_s: float) -> SLOReport:
    """Goodput counts a request (and its tokens) only if TTFT <= ttft_slo_s and TPOT <= tpot_slo_s.

    Rejected requests count against goodput (their requested tokens are in the token denominator).
    Duration runs from the first arrival to the last finish.
    """
    ttft_slo_s = as_real("ttft_slo_s", ttft_slo_s, above=0)
    tpot_slo_s = as_real("tpot_slo_s", tpot_slo_s, above=0)
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
    rate = lambda x: x / dur if dur > 0 else None
    stats = lambda xs: {"p50": _pct(xs, 50), "p99": _pct(xs, 99), "mean": sum(xs) / len(xs) if xs else None}
    c = result.counters
    return SLOReport(
        requests=len(reqs), finished=len(fin), rejected=sum(1 for r in reqs if r.status == "rejected"),
        duration_s=dur, output_tokens=out_tok,
        throughput_tok_s=rate(out_tok), throughput_req_s=rate(len(fin)),
        ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, good_requests=good, good_tokens=good_tok,
        goodput_req_frac=good / len(reqs) if reqs else None,
        goodput_tok_frac=good_tok / want_tok if want_tok else None,
        goodput_tok_s=rate(good_tok),
        ttft={k: stats(v) for k, v in parts.items()}, tpot=stats(tpots),
        preemptions=dict(c.preemptions), swapped_out_bytes=c.swapped_out_bytes,
        swapped_in_bytes=c.swapped_in_bytes, recomputed_tokens=c.recomputed_tokens, peak_blocks=c.peak_blocks,
        num_blocks=result.num_blocks, leaked_blocks=c.leaked_blocks, steps=c.steps,
        rejections=[f"request {r.request_id}: {r.reason}" for r in reqs if r.status == "rejected"],
        notes=_undefined_notes(len(reqs), len(fin), dur, tpots))


def _undefined_notes(requests: int, finished: int, duration_s: float, tpots: list[float]) -> list[str]:
    """Why the report's undefined statistics are None."""
    if requests == 0:
        return ["the run had no requests: throughput, goodput and every TTFT and TPOT statistic are undefined"]
    notes = []
    if finished == 0:
        notes.append(f"no request finished (all {requests:,} were rejected): throughput, goodput per second "
                     f"and every TTFT and TPOT statistic are undefined")
    elif duration_s <= 0:
        notes.append("the run spans no time, so throughput and goodput per second are undefined")
    if finished and not tpots:
        notes.append("no finished request produced a second token, so TPOT (the time between tokens) is undefined")
    return notes


# --- the lecture's §10.6 arithmetic: TTFT's three parts, TPOT's three terms, the three-column table ------

TTFT_PARTS = ("queueing", "prefill", "scheduling delay")


@dataclass(frozen=True)
class TTFTSplit:
    """One bar: a label and the three terms of a TTFT, in seconds."""

    label: str
    queueing_s: float
    prefill_s: float
    scheduling_s: float

    def __post_init__(self):
        for name in ("queueing_s", "prefill_s", "scheduling_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"TTFTSplit {self.label!r}: {name} must be a finite number >= 0, got {v!r}")

    @property
    def total_s(self) -> float:
        return ledger.ttft_s(self.queueing_s, self.prefill_s, self.scheduling_s)

    @property
    def parts(self) -> dict[str, float]:
        return dict(zip(TTFT_PARTS, (self.queueing_s, self.prefill_s, self.scheduling_s)))


def tpot_terms(model: ModelSpec, gpu: GPUSpec, batch: int, seq_tokens: int) -> dict[str, float]:
    """One memory-bound decode step split into who moves the bytes: weights, you, your neighbours (s)."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a whole number >= 1, got {batch!r}")
    per_seq = seq_tokens * model.kv_bytes_per_token / gpu.hbm_bandwidth
    terms = {"weights": model.weight_bytes / gpu.hbm_bandwidth, "your KV": per_seq,
             "neighbours' KV": (batch - 1) * per_seq}
    return terms


def memory_ceiling(model: ModelSpec, gpu: GPUSpec, seq_tokens: int, block_size: int = 16,
                   kv_budget: float | None = None) -> int:
    """§10.3: sequences of `seq_tokens` the paged pool holds at once (186 for the lecture)."""
    budget = ledger.kv_budget_bytes(model, gpu) if kv_budget is None else kv_budget
    if budget <= 0:
        return 0
    return ledger.paged_concurrency(budget, seq_tokens, block_size, model.kv_bytes_per_token)


@dataclass(frozen=True)
class Column:
    """One configuration of §10.6's table; times in seconds, rates in tokens/s."""

    name: str
    batch: int
    tpot_s: float
    tpot_slo_s: float
    printed_batch: str = ""
    printed_throughput: str = ""

    @property
    def throughput_tok_s(self) -> float:
        return ledger.throughput_tok_s(self.batch, self.tpot_s) if self.batch else 0.0

    @property
    def meets_slo(self) -> bool:
        return self.tpot_s <= self.tpot_slo_s

    @property
    def goodput_tok_s(self) -> float:
        return ledger.goodput_tok_s(self.batch, self.tpot_s, self.tpot_slo_s) if self.batch else 0.0


SEARCH_LIMIT = 1 << 24  # the largest batch a TPOT search tries: far past any card's memory ceiling


def largest_batch_meeting(tpot_fn, model: ModelSpec, gpu: GPUSpec, seq_tokens: int, tpot_slo_s: float,
                          limit: int = SEARCH_LIMIT) -> int:
    """The largest B <= `limit` whose `tpot_fn(model, gpu, B, seq_tokens)` clears the SLO (0 when B = 1 does
    not), by doubling then bisection: a step's TPOT grows with B.  Lab 07 runs it on the student's own TPOT
    (Exercise 7.1), so the SLO-limited batch of its chart and table is what their function says."""
    def ok(b: int) -> bool:
        return tpot_fn(model, gpu, b, seq_tokens) <= tpot_slo_s

    if limit < 1 or not ok(1):
        return 0
    lo, hi = 1, 2  # lo meets the SLO; hi is the next batch to try
    while hi <= limit and ok(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi, limit + 1)  # the first batch that misses (or is past the limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def step_tpot_s(model: ModelSpec, gpu: GPUSpec, batch: int, seq_tokens: int, tpot_fn=None) -> float:
    """One decode step's seconds at `batch`: the ledger's memory-bound TPOT, or `tpot_fn(model, gpu, batch,
    seq_tokens)`'s when given (lab 07 prices its chart and table with the student's Exercise 7.1)."""
    if tpot_fn is None:
        return ledger.tpot_s(model, batch, seq_tokens, gpu.hbm_bandwidth)
    return float(tpot_fn(model, gpu, batch, seq_tokens))


def slo_batch(model: ModelSpec, gpu: GPUSpec, seq_tokens: int, tpot_slo_s: float, tpot_fn=None,
              limit: int | None = None) -> int:
    """The largest B (at most `limit`) whose step clears the TPOT SLO: the ledger's closed form, or a search over
    `tpot_fn` when given (`largest_batch_meeting`)."""
    if tpot_fn is None:
        b = ledger.max_batch_for_tpot(model, seq_tokens, tpot_slo_s, gpu.hbm_bandwidth)
        return b if limit is None else min(limit, b)
    return largest_batch_meeting(tpot_fn, model, gpu, seq_tokens, tpot_slo_s, SEARCH_LIMIT if limit is None else limit)


def three_columns(model: ModelSpec | None = None, gpu: GPUSpec | None = None, seq_tokens: int = 640,
                  s_max: int = 4096, block_size: int = 16, tpot_slo_s: float = 0.020,
                  kv_budget: float | None = None, tpot_fn=None) -> list[Column]:
    """§10.6's table from the ledger: naive (reserve-to-max), paged at the memory ceiling, paged at
    the largest B whose TPOT clears the SLO (never above the ceiling).  Every sequence is
    `seq_tokens` long; the step is memory-bound (the ledger's TPOT, or `tpot_fn(model, gpu, B, seq_tokens)`
    when given: lab 07 prices every column, and finds the SLO-limited B, with the student's own TPOT).
    The course card's model and GPU unless told; the lecture's printed figures stand beside its own card only."""
    model, gpu = model or card.model(), gpu or card.gpu()
    budget = ledger.kv_budget_bytes(model, gpu) if kv_budget is None else kv_budget
    if budget <= 0:
        raise ValueError(f"the weights ({model.weight_bytes / GB:.2f} GB) leave no KV budget on {gpu.name}")
    kv = model.kv_bytes_per_token
    naive = ledger.naive_concurrency(budget, s_max, kv) if seq_tokens <= s_max else 0
    ceiling = ledger.paged_concurrency(budget, seq_tokens, block_size, kv)
    slo_b = slo_batch(model, gpu, seq_tokens, tpot_slo_s, tpot_fn, limit=ceiling)
    lecture = (model, gpu, seq_tokens, s_max, block_size, tpot_slo_s) == (LECTURE_7B, LECTURE_GPU, 640, 4096, 16, 0.020)
    printed = [("29", "'a third of the throughput'"), ("199", "8,470 tok/s"), ("164", "—")] if lecture else [("", "")] * 3
    cols = []
    for name, b, (pb, pt) in zip(("naive (reserve-to-max)", "paged, memory ceiling", "paged, SLO-limited B"),
                                 (naive, ceiling, slo_b), printed):
        tpot = step_tpot_s(model, gpu, b, seq_tokens, tpot_fn) if b else math.inf
        cols.append(Column(name, b, tpot, tpot_slo_s, pb, pt))
    return cols
