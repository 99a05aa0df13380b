"""Replaying requests through the engine on the cost-model clock (§10.5, §10.6).

One loop — build an Engine for a configuration, add each request at its arrival divided by a
speedup, run, keep what happened — serves every place that replays a workload: the `simulate`
command, `bench engine`, lab 07's goodput curves, lab 06's overload runs, lab 08's seeds and the
graders.  Measurements that watch a replay step by step (the utilization of seed 4, the TLB of
seed 3) load the same engine with `load` and loop over `Engine.step` themselves.

Requests are anything with ``prompt_tokens``, ``output_tokens`` and ``arrival_s`` (and optionally
``n``), as `labsupport.workloads.Request` is, or ``(arrival_s, prompt_tokens, output_tokens)`` tuples.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

from labsupport import ledger
from labsupport.costmodel import CostModel
from labsupport.engine import Engine, EngineResult
from labsupport.slo import SLOReport, TTFTSplit, slo_report
from labsupport import card
from labsupport.specs import GB, GPUSpec, ModelSpec


@dataclass(frozen=True)
class ReplayConfig:
    """An engine configuration to replay a trace with.

    `s_max` makes it a reserve-to-max engine with a context window of s_max tokens: every sequence
    gets one block of s_max tokens (so it never grows into a second one and is never preempted),
    generation stops at the window, and a prompt that fills the window is refused.  `overlap=False`
    prices each step with the additive cost model instead of the roofline's max (when the replay
    builds its own cost model).
    """

    label: str = "paged, b = 16"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    s_max: int | None = None
    overlap: bool = True  # False: the step's compute and memory times add up (Lecture 2 §2.16's model)
    watermark: float = 0.01
    preemption: str = "auto"

    @property
    def pool_block_size(self) -> int:
        return self.block_size if self.s_max is None else self.s_max


def lecture_pool(model: ModelSpec | None = None, gpu: GPUSpec | None = None, block_size: int = 16,
                 kv_budget: float | None = None) -> int:
    """Blocks in the paged pool for the KV budget (7,452 for the lecture at b = 16); the card's model and GPU
    unless told."""
    model, gpu = model or card.model(), gpu or card.gpu()
    budget = ledger.kv_budget_bytes(model, gpu) if kv_budget is None else kv_budget
    blocks = ledger.num_blocks(max(0.0, budget), block_size, model.kv_bytes_per_token)
    if blocks < 1:
        raise ValueError(f"the KV budget ({budget / GB:.2f} GB) holds no block of {block_size} tokens of {model.name}")
    return blocks


def engine_for(config: ReplayConfig = ReplayConfig(), cost_model: CostModel | None = None,
               num_blocks: int | None = None, record_token_times: bool = False) -> Engine:
    """A model-free engine for `config`: the card's model on its GPU (course.toml) and its whole KV pool unless
    told."""
    cost_model = cost_model or CostModel(overlap=config.overlap)
    if num_blocks is None:
        num_blocks = lecture_pool(cost_model.model, cost_model.gpu, config.pool_block_size)
    return Engine(cost_model=cost_model, num_blocks=num_blocks, block_size=config.pool_block_size,
                  watermark=config.watermark, preemption=config.preemption, max_num_seqs=config.max_num_seqs,
                  max_num_batched_tokens=config.max_num_batched_tokens, record_token_times=record_token_times)


def _fields(r) -> tuple[float, int, int, int]:
    """(arrival_s, prompt_tokens, output_tokens, n) of a Request-like object or an (arrival, prompt, output) tuple."""
    if isinstance(r, tuple):
        arrival, prompt, output = r
        return float(arrival), int(prompt), int(output), 1
    return r.arrival_s, r.prompt_tokens, r.output_tokens, getattr(r, "n", 1)


@dataclass
class Loaded:
    """What `load` did with a workload: how many requests it took, and what the window refused or cut."""

    requests: int
    refused_at: list[float] = field(default_factory=list)  # arrival times (÷ speedup) of prompts that fill S_max
    truncated: int = 0  # outputs cut at the S_max window


def load(engine: Engine, requests, config: ReplayConfig = ReplayConfig(), speedup: float = 1.0,
         window_s: float | None = None, rebase: bool = False) -> Loaded:
    """Add the requests arriving in the first `window_s` seconds to `engine`, time divided by `speedup`
    (from the first arrival when `rebase`), cut at the S_max window when `config` has one."""
    if not speedup > 0:
        raise ValueError(f"speedup must be positive, got {speedup!r}")
    rows = [_fields(r) for r in requests]
    chosen = [row for row in rows if window_s is None or row[0] < window_s]
    if not chosen and window_s is not None:
        raise ValueError(f"no request of {getattr(requests, 'name', 'the workload')} arrives in the first {window_s} s")
    t0 = min((row[0] for row in chosen), default=0.0) if rebase else 0.0
    loaded = Loaded(len(chosen))
    for arrival, prompt, output, n in chosen:
        at = (arrival - t0) / speedup
        if config.s_max is not None:  # a reserve-to-max engine: the window caps each sequence
            if prompt >= config.s_max:
                loaded.refused_at.append(at)
                continue
            if prompt + output > config.s_max:
                output, loaded.truncated = config.s_max - prompt, loaded.truncated + 1
        engine.add_request(prompt_len=prompt, max_new_tokens=output, n=n, arrival_time=at)
    return loaded


@dataclass
class Replay:
    """One replay: the engine's result, what the window refused, and what it cost to run (seconds)."""

    config: ReplayConfig
    result: EngineResult
    loaded: Loaded
    cost_model: CostModel
    wall_s: float
    cpu_s: float
    note: str = ""

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def num_blocks(self) -> int:
        return self.result.num_blocks

    def mean_split(self, label: str | None = None) -> TTFTSplit:
        """The mean TTFT of the finished requests, in its three parts."""
        c = self.counters
        return TTFTSplit(label or self.label, c["queueing_mean_s"], c["prefill_mean_s"], c["scheduling_mean_s"])

    def report(self, ttft_slo_s: float, tpot_slo_s: float) -> SLOReport:
        """§10.6's ledger of the engine's requests (a request the S_max window refused is not among them)."""
        return slo_report(self.result, ttft_slo_s, tpot_slo_s)

    # per request, the window's refusals last, as arrays so SLO sweeps are cheap
    @functools.cached_property
    def _arrays(self):
        import numpy as np

        reqs = list(self.result.requests.values())
        refused = len(self.loaded.refused_at)
        fin = np.array([r.finished for r in reqs] + [False] * refused, dtype=bool)
        ttft = np.array([r.ttft_s if r.finished else math.nan for r in reqs] + [math.nan] * refused, dtype=float)
        tpot = np.array([r.tpot_s if r.finished and r.tpot_s is not None else math.nan for r in reqs]
                        + [math.nan] * refused, dtype=float)  # nan: one token, no TPOT to miss
        tokens = np.array([r.total_output_tokens for r in reqs] + [0] * refused, dtype=np.int64)
        return fin, ttft, tpot, tokens

    @property
    def finished(self):
        return self._arrays[0]

    @property
    def ttft_s(self):
        return self._arrays[1]

    @property
    def tpot_s(self):
        return self._arrays[2]

    @property
    def tokens(self):
        return self._arrays[3]

    @functools.cached_property
    def duration_s(self) -> float:
        """From the first arrival (refused ones included) to the last finish."""
        reqs = self.result.requests.values()
        start = min([r.arrival_time for r in reqs] + self.loaded.refused_at)
        return max((r.finish_time for r in reqs if r.finished), default=start) - start

    @property
    def throughput_tok_s(self) -> float:
        return float(self.tokens[self.finished].sum()) / self.duration_s

    def good(self, ttft_slo_s: float, tpot_slo_s: float):
        import numpy as np

        tpot_ok = np.isnan(self.tpot_s) | (self.tpot_s <= tpot_slo_s)
        return self.finished & (self.ttft_s <= ttft_slo_s) & tpot_ok

    def goodput_tok_s(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        return float(self.tokens[self.good(ttft_slo_s, tpot_slo_s)].sum()) / self.duration_s

    def goodput_frac(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        return float(self.good(ttft_slo_s, tpot_slo_s).mean())

    @functools.cached_property
    def counters(self) -> dict:
        """The run's counts, and the mean TTFT parts of the finished requests (seconds)."""
        import numpy as np

        done = [r for r in self.result.requests.values() if r.finished]
        mean = lambda xs: float(np.mean(xs)) if xs else math.nan
        c = self.result.counters
        return {"requests": len(self.result.requests) + len(self.loaded.refused_at), "finished": len(done),
                "rejected": c.rejected + len(self.loaded.refused_at), "truncated": self.loaded.truncated,
                "steps": c.steps, "peak_running": c.peak_running, "peak_blocks": c.peak_blocks,
                "num_blocks": self.result.num_blocks, "preemptions": dict(c.preemptions),
                "leaked_blocks": c.leaked_blocks,
                "queueing_mean_s": mean([r.queueing_s for r in done]), "prefill_mean_s": mean([r.prefill_s for r in done]),
                "scheduling_mean_s": mean([r.scheduling_delay_s for r in done])}


def replay(requests, config: ReplayConfig = ReplayConfig(), *, cost_model: CostModel | None = None,
           num_blocks: int | None = None, speedup: float = 1.0, window_s: float | None = None,
           rebase: bool = False, record_token_times: bool = False, progress: bool = False) -> Replay:
    """Run every request of the window to completion (or rejection) on an engine built for `config`."""
    engine = engine_for(config, cost_model, num_blocks, record_token_times)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    loaded = load(engine, requests, config, speedup, window_s, rebase)
    result = engine.run(progress=progress)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    refused = len(loaded.refused_at)
    note = (f"{loaded.requests:,} requests" + (f" (the first {window_s:g} s of the trace)" if window_s else "")
            + (f", arrivals {speedup:g}x faster" if speedup != 1 else "")
            + (f"; S_max = {config.s_max:,}: {loaded.truncated:,} outputs cut at the window, {refused:,} prompts "
               "refused" if config.s_max is not None else ""))
    return Replay(config, result, loaded, engine.cost_model, wall, cpu, note)


# --- measurements that watch a replay step by step ------------------------------------------------------

@dataclass(frozen=True)
class UtilizationRun:
    """Discussion seed 4: one workload on one allocator, the share of reserved KV slots holding tokens, and
    throughput."""

    label: str
    block_size: int
    utilization: float  # time-averaged over the run's busy steps
    throughput_tok_s: float
    peak_running: int
    pool_blocks: int = 0  # the blocks the card's KV budget holds: at block_size = S_max, the naive slots

    @property
    def slots(self) -> int:
        """Sequences the pool could hold at once if each took one block (reserve-to-max's slots)."""
        return self.pool_blocks


def utilization_run(requests, block_size: int, label: str = "", model: ModelSpec | None = None,
                    gpu: GPUSpec | None = None) -> UtilizationRun:
    """Run the requests on the engine (cost-model clock) and measure, after every step, the tokens held
    against the slots the allocator has handed out.

    `block_size = 4096` is reserve-to-max at S_max = 4,096 (one block per sequence); 16 is paging."""
    engine = engine_for(ReplayConfig(block_size=block_size), CostModel(model, gpu))
    load(engine, requests)
    alloc = engine.allocator
    held = reserved = 0.0
    for out, _ in engine.iterations():
        dt = out.end - out.start
        if alloc.num_used_blocks:
            held += dt * sum(alloc.seq_lens[s] for s in alloc.block_tables)
            reserved += dt * alloc.num_used_blocks * block_size
    result = engine.result()
    rejected = [r for r in result.requests.values() if not r.finished]
    if rejected:
        raise ValueError(f"request {rejected[0].request_id} was rejected: {rejected[0].reason}")
    report = result.slo(1e9, 1e9)  # SLOs that everyone meets: this is throughput
    return UtilizationRun(label or f"b = {block_size}", block_size, held / reserved if reserved else math.nan,
                          report.throughput_tok_s, result.counters.peak_running, alloc.num_blocks)


@dataclass(frozen=True)
class TLBReplay:
    """Discussion seed 3: the block-table lookups a decode batch makes, and what a translation cache would catch."""

    steps: int
    layers: int
    lookups: int  # table entries read: every resident block, once per layer, every step
    new_translations: int  # (sequence, logical block) pairs seen for the first time (new blocks, admissions)
    peak_working_set: int  # the most translations one step needed
    hits: dict  # TLB entries -> lookups served, for an LRU cache shared by every layer and step

    def hit_rate(self, entries: int) -> float:
        return self.hits[entries] / self.lookups if self.lookups else 0.0


def tlb_replay(requests, entries, num_blocks: int = 7452, block_size: int = 16, max_steps: int = 3000,
               model: ModelSpec | None = None) -> TLBReplay:
    """Seed 3: a KV "TLB" — a cache of block-table entries, keyed by (sequence, logical block) — on a
    real engine run (cost-model clock, the card's pool).

    Every decode step reads each resident sequence's whole table once per layer, in the same order:
    L sweeps over the step's working set of W translations.  An LRU cache of E entries serves every
    sweep but the first of a translation it already holds when E >= W; when E < W a sweep evicts
    each entry just before it is needed again, so LRU serves none.  The only misses with E >= W are
    translations new in this step, read off the allocator's tables after each step.
    """
    model = model or card.model()
    engine = engine_for(ReplayConfig(block_size=block_size), CostModel(model), num_blocks)
    load(engine, requests)
    layers = model.num_layers
    hits = {e: 0 for e in entries}
    lookups = new = peak = steps = 0
    held: dict = {}
    for _ in engine.iterations():
        tables = engine.allocator.block_tables
        if not tables:
            continue
        now = {sid: len(t) for sid, t in tables.items()}
        fresh = sum(n - held.get(sid, 0) for sid, n in now.items() if n > held.get(sid, 0))
        held = now
        w = sum(now.values())
        steps += 1
        lookups += layers * w
        new += fresh
        peak = max(peak, w)
        for e in entries:
            if e >= w:
                hits[e] += layers * w - fresh
        if steps >= max_steps:
            break
    return TLBReplay(steps, layers, lookups, new, peak, hits)


# --- §10.5's watermark under overload (lab 06) ------------------------------------------------------------

@dataclass(frozen=True)
class OverloadRun:
    """One replay of a trace under overload at one watermark (cost-model clock: deterministic)."""

    watermark: float
    watermark_blocks: int
    num_blocks: int
    requests: int
    waited: int  # requests refused at least once at admission (queued before their prefill)
    mean_queueing_s: float
    p99_tpot_s: float
    makespan_s: float
    preemptions: dict
    swapped_out_bytes: int
    recomputed_tokens: int
    block_times: tuple[float, ...]
    blocks_in_use: tuple[int, ...]

    @property
    def total_preemptions(self) -> int:
        return sum(self.preemptions.values())


def overload_run(requests, watermark: float, num_blocks: int = 7452, block_size: int = 16,
                 cost_model: CostModel | None = None, preemption: str = "swap", speedup: float = 8.0) -> OverloadRun:
    """Replay `requests` `speedup`x faster than recorded (from the first arrival) through a model-free
    engine on the cost-model clock (the course card's model and GPU by default)."""
    import statistics

    from labsupport.slo import _pct

    requests = list(requests)
    if not requests:
        raise ValueError("no requests to replay")
    config = ReplayConfig(f"watermark {watermark:g}", block_size, watermark=watermark, preemption=preemption)
    rp = replay(requests, config, cost_model=cost_model or CostModel(), num_blocks=num_blocks, speedup=speedup,
                rebase=True)
    res = rp.result
    fin = [r for r in res.requests.values() if r.finished]
    tpots = [r.tpot_s for r in fin if r.tpot_s is not None]
    p99 = _pct(tpots, 99)
    c = res.counters
    return OverloadRun(watermark, int(watermark * num_blocks), num_blocks, rp.loaded.requests,
                       sum(1 for r in fin if r.queueing_s > 0), statistics.fmean(r.queueing_s for r in fin),
                       math.nan if p99 is None else p99, res.clock_s, dict(c.preemptions), c.swapped_out_bytes,
                       c.recomputed_tokens, tuple(c.block_times), tuple(c.blocks_in_use))


def watermark_sweep(requests, watermarks, progress: bool = False, **kwargs) -> list[OverloadRun]:
    """`overload_run` at each watermark (same requests, same pool)."""
    items = list(watermarks)
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="watermark sweep", leave=False)
    return [overload_run(requests, w, **kwargs) for w in items]


# --- engine runs behind lab 07's pictures (§10.6) and lab 08's seed 4 --------------------------------------

def _engine(model: ModelSpec, gpu: GPUSpec, config: ReplayConfig = ReplayConfig()) -> Engine:
    """`engine_for` on `model` and `gpu`, every token's time recorded (the TTFT and TPOT pictures read them)."""
    return engine_for(config, CostModel(model, gpu), record_token_times=True)


def steady_batch_tpot(batches: Sequence[int], seq_tokens: int = 640, model: ModelSpec | None = None,
                      gpu: GPUSpec | None = None, block_size: int = 16) -> dict[int, float]:
    """TPOT measured on the engine for a steady batch: B sequences that each hold `seq_tokens`
    tokens when they decode (prompt seq_tokens - 1, two output tokens: the second token's step is
    a pure decode step of B sequences).  Watermark 0 so that a full pool is admitted at once."""
    out = {}
    for b in batches:
        engine = _engine(model, gpu, ReplayConfig(block_size=block_size, max_num_seqs=max(b, 1), watermark=0.0))
        for _ in range(b):
            engine.add_request(prompt_len=seq_tokens - 1, max_new_tokens=2, arrival_time=0.0)
        result = engine.run()
        reqs = list(result.requests.values())
        rejected = [r for r in reqs if not r.finished]
        if rejected:
            raise ValueError(f"B = {b} sequences of {seq_tokens} tokens do not fit the pool: {rejected[0].reason}")
        if len({r.admitted_time for r in reqs}) > 1:  # some had to wait: the batch was never B
            raise ValueError(f"B = {b} sequences of {seq_tokens} tokens do not fit the pool at once "
                             f"({engine.num_blocks:,} blocks of {block_size})")
        out[b] = max(r.tpot_s for r in reqs)
    return out


@dataclass
class ProbeRun:
    """A chat workload (512-token prompts, 128-token outputs, Poisson arrivals) plus one probe request."""

    rate_per_s: float
    probe_prompt: int
    result: object  # EngineResult
    probe_id: int

    def splits(self) -> list[TTFTSplit]:
        """The probe's TTFT split, and those of the median- and p99-TTFT chat requests."""
        reqs = self.result.requests
        probe = reqs[self.probe_id]
        chat = sorted((r for rid, r in reqs.items() if rid != self.probe_id and r.finished),
                      key=lambda r: (r.ttft_s, r.request_id))
        rows = [(f"your {self.probe_prompt:,}-token prompt", probe)]
        if chat:
            rows += [("median chat request", chat[(len(chat) - 1) // 2]),
                     ("p99 chat request", chat[min(len(chat) - 1, math.ceil(0.99 * len(chat)) - 1)])]
        return [TTFTSplit(label, r.queueing_s, r.prefill_s, r.scheduling_delay_s) for label, r in rows]


def chat_with_probe(rate_per_s: float, probe_prompt: int = 4096, duration_s: float = 10.0, probe_at_s: float = 8.0,
                    model: ModelSpec | None = None, gpu: GPUSpec | None = None, seed: int = 0) -> ProbeRun:
    """§10.6's TTFT on a loaded card: the lecture's chat workload arrives at `rate_per_s` for
    `duration_s`; your request (a `probe_prompt`-token prompt, 128 output tokens) arrives at
    `probe_at_s`.  Engine with the cost-model clock, b = 16, the card's pool."""
    import numpy as np

    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be positive, got {rate_per_s!r}")
    if not 0 <= probe_at_s:
        raise ValueError(f"probe_at_s must be >= 0, got {probe_at_s!r}")
    engine = _engine(model, gpu)
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate_per_s, size=int(rate_per_s * duration_s * 2) + 10))
    for t in arrivals[arrivals <= duration_s]:
        engine.add_request(prompt_len=512, max_new_tokens=128, arrival_time=float(t))
    probe = engine.add_request(prompt_len=probe_prompt, max_new_tokens=128, arrival_time=probe_at_s)
    result = engine.run()
    if not result.requests[probe].finished:
        raise ValueError(f"your {probe_prompt:,}-token request can never fit: {result.requests[probe].reason}")
    return ProbeRun(rate_per_s, probe_prompt, result, probe)


def chat_requests(rate_per_s: float, num_requests: int = 300, prompt: int = 512, output: int = 128,
                  seed: int = 0) -> list[tuple[float, int, int]]:
    """The lecture's chat workload (`workloads.chat_workload`, Poisson arrivals) as (arrival_s, prompt, output)."""
    from labsupport.workloads import chat_workload

    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be positive, got {rate_per_s!r}")
    return [(r.arrival_s, r.prompt_tokens, r.output_tokens)
            for r in chat_workload(num_requests, prompt, output, rate_per_s=rate_per_s, seed=seed)]


def utilization_sweep(rates: Sequence[float], num_requests: int = 300) -> dict[str, list[UtilizationRun]]:
    """Seed 4's construction over a range of arrival rates: reserve-to-max (29 slots) against paging."""
    out: dict[str, list[UtilizationRun]] = {"reserve-to-max (S_max 4,096)": [], "paged (b = 16)": []}
    for rate in rates:
        reqs = chat_requests(rate, num_requests)
        out["reserve-to-max (S_max 4,096)"].append(utilization_run(reqs, 4096, f"{rate:g}/s"))
        out["paged (b = 16)"].append(utilization_run(reqs, 16, f"{rate:g}/s"))
    return out
