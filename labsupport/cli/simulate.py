"""`python -m labsupport simulate`: replay a serving trace through the engine on the cost-model clock (§10.5, §10.6).

    python -m labsupport simulate --trace azure-conv --model lecture-7b --gpu h100-sxm-80gb \\
        --block-size 16 --kv-budget-gb 62.52 --preemption auto --ttft-slo-ms 1000 --tpot-slo-ms 20

The scheduler is the real one (labsupport.engine) over a real BlockAllocator; only time is
modelled, step by step from the roofline (labsupport.costmodel), so a whole hour of production
traffic replays at H100 scale in seconds on a laptop.  It prints §10.6's SLO ledger: completed
requests, throughput, goodput, TTFT (p50/p99 and its three parts), TPOT, preemptions by kind, peak
blocks, and a check that no block leaked.  ``bench`` (``python -m labsupport bench engine``) times
the replay itself.
"""
from __future__ import annotations

import argparse
import sys

from labsupport import card, ledger
from labsupport.block_allocator import bookkeeping_bytes
from labsupport.checks import MAX_TOKENS, check_fits_in_memory
from labsupport.cli.parser import (OneLineParser, UsageError, dumps_strict, int_flag, real_flag, run_command,
                                   strict_json)
from labsupport.costmodel import CostModel
from labsupport.cli.traces import TRACE_NAMES, load_trace_reporting
from labsupport.engine import PREEMPTION_MODES
from labsupport.measure.replay import Replay, ReplayConfig, replay
from labsupport.slo import SLOReport
from labsupport.specs import GB, GPUS, MODELS, MiB
from labsupport.workloads import MAX_REQUESTS

PROG = "simulate"
TRACE_CHOICES = (*TRACE_NAMES, "synthetic")
TOKENS = int_flag(1, MAX_TOKENS)
RATE = real_flag(1e-6, 1e9)  # requests/s, GB/s: from one a day-ish to far past any machine
SLO_MS = real_flag(1e-6, 1e12)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m labsupport simulate",
                description="Replay a serving trace through the engine on the cost-model clock and print "
                            "the SLO ledger (§10.6).")
    p.add_argument("--trace", choices=TRACE_CHOICES, default="azure-conv",
                   help="a real trace from $LABSUPPORT_DATA, data/ or ../shared/traces (`python -m labsupport "
                        "traces` fetches them), or 'synthetic' (§10.2's chat workload)")
    p.add_argument("--trace-file", help="read the trace from this file instead of looking it up")
    p.add_argument("--limit", type=int_flag(1, MAX_REQUESTS), help="replay only the first N requests")
    p.add_argument("--bad-rows", choices=("reject", "skip"), default="reject",
                   help="a malformed trace row stops the run (reject) or is reported and skipped (skip)")
    p.add_argument("--rate-scale", type=real_flag(1e-6, 1e6), default=1.0,
                   help="compress arrival times by this factor (2 = twice the request rate)")
    p.add_argument("--model", help=f"model preset: {', '.join(sorted(MODELS))} (default: the course card's)")
    p.add_argument("--gpu", help=f"GPU preset: {', '.join(sorted(GPUS))} (default: the course card's)")
    p.add_argument("--block-size", type=TOKENS, default=16)
    p.add_argument("--kv-budget-gb", type=real_flag(1e-9, 1e9),
                   help="KV pool in GB (1e9 B); default HBM - weights - 4 GB (62.52 for the lecture's H100)")
    p.add_argument("--watermark", type=real_flag(0.0, below=1.0), default=0.01,
                   help="fraction of blocks admission keeps free, in [0, 1)")
    p.add_argument("--preemption", choices=PREEMPTION_MODES, default="auto")
    p.add_argument("--max-num-seqs", type=int_flag(1, 1 << 20), default=256)
    p.add_argument("--max-num-batched-tokens", type=TOKENS, default=None,
                   help="token budget per step (a longer prompt runs alone); default unlimited")
    p.add_argument("--mfu", type=real_flag(1e-3, 1.0), default=0.5, help="fraction of peak FLOP/s a prefill achieves")
    p.add_argument("--link-gbs", type=real_flag(1e-3, 1e9), help="host link for swaps, GB/s (default: the GPU's)")
    p.add_argument("--ttft-slo-ms", type=SLO_MS, default=1000.0)
    p.add_argument("--tpot-slo-ms", type=SLO_MS, default=20.0, help="§10.6's example SLO is 20 ms")
    p.add_argument("--synthetic-requests", type=int_flag(1, MAX_REQUESTS), default=2000)
    p.add_argument("--synthetic-rate", type=RATE, default=20.0, help="requests/s (Poisson)")
    p.add_argument("--synthetic-prompt", type=TOKENS, default=512)
    p.add_argument("--synthetic-output", type=TOKENS, default=128)
    p.add_argument("--seed", type=int_flag(0, 2**63 - 1), default=0)
    p.add_argument("--json", action="store_true", help="print one strict JSON object instead of the table")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    return p


def _check_args(a) -> None:
    """What the flags' own ranges cannot say: how they combine."""
    if a.trace == "synthetic" and a.trace_file:
        raise UsageError("--trace-file needs a real trace name (azure-conv, azure-code, mooncake-...)")


def pool_blocks(a, model, gpu) -> tuple[float, int]:
    """(KV budget in bytes, blocks) for the flags, refused with the flag's name when the pool cannot exist here."""
    budget = a.kv_budget_gb * GB if a.kv_budget_gb is not None else ledger.kv_budget_bytes(model, gpu)
    if budget <= 0:
        raise UsageError(f"{model.name}'s weights leave no KV budget on {gpu.name}; pass --kv-budget-gb")
    num_blocks = ledger.num_blocks(budget, a.block_size, model.kv_bytes_per_token)
    if num_blocks < 1:
        raise UsageError(f"a KV budget of {budget / GB:g} GB holds no block of {a.block_size} tokens "
                         f"({a.block_size * model.kv_bytes_per_token:,} B): raise --kv-budget-gb or lower --block-size")
    check_fits_in_memory(f"--kv-budget-gb {budget / GB:g} ({num_blocks:,} blocks of {a.block_size} tokens; the "
                         f"scheduler keeps {bookkeeping_bytes(1)} B of bookkeeping per block)", bookkeeping_bytes(num_blocks))
    return budget, num_blocks


def load_workload(a):
    """The requests to replay, as a labsupport.workloads.Workload."""
    from labsupport import workloads

    if a.trace == "synthetic":
        return workloads.chat_workload(a.synthetic_requests, a.synthetic_prompt, a.synthetic_output,
                                       rate_per_s=a.synthetic_rate, seed=a.seed)
    return load_trace_reporting(a.trace, a.trace_file, a.limit, a.bad_rows == "skip", prog=PROG)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1e3 * x:,.1f} ms"


def _num(x: float | None, spec: str, scale: float = 1.0) -> str:
    """x formatted with `spec`, or n/a where the statistic is undefined (see the report's notes)."""
    return "n/a" if x is None else format(scale * x, spec)


def format_report(w, rp: Replay, r: SLOReport, budget: float, block_size: int, preemption: str,
                  watermark: float) -> str:
    cm, c = rp.cost_model, rp.result.counters
    kv = cm.model.kv_bytes_per_token
    block_bytes = block_size * kv
    cross = cm.crossover_tokens()
    lines = [
        f"trace      {w.describe()}",
        f"engine     {cm.model.name} on {cm.gpu.name}: KV budget {budget / GB:.2f} GB = {rp.num_blocks:,} blocks of "
        f"{block_size} tokens ({block_bytes:,} B = {block_bytes / MiB:g} MiB each); watermark {100 * watermark:g}% "
        f"({int(watermark * rp.num_blocks):,} blocks); preemption {preemption} "
        f"(break-even {'swap always' if cross == 0 else f'swap above {cross:,.0f} tokens'} on a "
        f"{cm.link / GB:g} GB/s link)",
        f"clock      cost model: max(weights + KV bytes / {cm.gpu.hbm_bandwidth / GB:,.0f} GB/s, FLOPs / "
        f"({cm.mfu:g} x {cm.gpu.peak_flops / 1e12:,.0f} TFLOP/s)) + swap bytes / link, per step",
        f"completed  {r.finished:,} of {r.requests:,} requests ({r.rejected:,} rejected), {r.output_tokens:,} output "
        f"tokens in {r.duration_s:,.1f} s simulated, {r.steps:,} steps",
        f"throughput {_num(r.throughput_tok_s, ',.0f')} output tok/s, {_num(r.throughput_req_s, ',.2f')} req/s",
        f"goodput    TTFT <= {_ms(r.ttft_slo_s)} and TPOT <= {_ms(r.tpot_slo_s)}: "
        f"{_num(r.goodput_req_frac, '.1f', 100)}% of requests, {_num(r.goodput_tok_frac, '.1f', 100)}% of tokens "
        f"({_num(r.goodput_tok_s, ',.0f')} tok/s)",
        f"TTFT       p50 {_ms(r.ttft['ttft']['p50'])}, p99 {_ms(r.ttft['ttft']['p99'])}",
    ]
    for part, label in (("queueing", "queueing"), ("prefill", "prefill"), ("scheduling_delay", "sched delay")):
        lines.append(f"  {label:<12} p50 {_ms(r.ttft[part]['p50'])}, p99 {_ms(r.ttft[part]['p99'])}, "
                     f"mean {_ms(r.ttft[part]['mean'])}")
    lines += [
        f"TPOT       p50 {_ms(r.tpot['p50'])}, p99 {_ms(r.tpot['p99'])}",
        f"preemption swap {r.preemptions['swap']:,} ({r.swapped_out_bytes / GB:,.2f} GB out, "
        f"{r.swapped_in_bytes / GB:,.2f} GB in), recompute {r.preemptions['recompute']:,} "
        f"({r.recomputed_tokens:,} tokens recomputed)",
        f"blocks     peak {r.peak_blocks:,} of {r.num_blocks:,} ({100 * r.peak_blocks / r.num_blocks:.1f}%), "
        f"peak batch {c.peak_running:,} sequences",
        f"leak check {'OK: 0 blocks in use at the end' if r.leaked_blocks == 0 else f'LEAK: {r.leaked_blocks} blocks still in use'}",
        f"replay     {rp.wall_s:.1f} s wall, {rp.cpu_s:.1f} s CPU, {r.steps / max(rp.cpu_s, 1e-9):,.0f} steps/s",
    ]
    for why in r.rejections[:5]:
        lines.append(f"rejected   {why}")
    if len(r.rejections) > 5:
        lines.append(f"rejected   ... and {len(r.rejections) - 5:,} more")
    lines += [f"n/a        {note}" for note in r.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, _main, sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    _check_args(a)
    model, gpu = card.model(a.model), card.gpu(a.gpu)
    budget, num_blocks = pool_blocks(a, model, gpu)
    cm = CostModel(model, gpu, mfu=a.mfu, link_bandwidth=None if a.link_gbs is None else a.link_gbs * GB)
    w = load_workload(a)
    config = ReplayConfig(w.name, a.block_size, a.max_num_seqs, a.max_num_batched_tokens, watermark=a.watermark,
                          preemption=a.preemption)
    rp = replay(w.requests if a.limit is None else w.requests[: a.limit], config, cost_model=cm, num_blocks=num_blocks,
                speedup=a.rate_scale, progress=a.progress)
    report = rp.report(a.ttft_slo_ms / 1e3, a.tpot_slo_ms / 1e3)
    if a.json:
        out = report.as_dict()
        notes = report.notes + w.notes
        out.update(trace=w.name, synthetic=w.synthetic, source=w.source, model=model.name,
                   gpu=gpu.name, kv_budget_bytes=budget, block_size=a.block_size, watermark=a.watermark,
                   preemption_mode=a.preemption, peak_running=rp.result.counters.peak_running,
                   replay_wall_s=rp.wall_s, replay_cpu_s=rp.cpu_s)
        out = strict_json(out, notes)
        print(dumps_strict({**out, "notes": notes}))
    else:
        print(format_report(w, rp, report, budget, a.block_size, a.preemption, a.watermark))
    return 0 if report.leaked_blocks == 0 else 1
