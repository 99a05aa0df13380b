"""`python -m labsupport bench engine`: the whole Azure conversation trace through the engine on one core.

The scheduler is the real one (§10.5's loop over a real BlockAllocator) on the cost-model clock, so
the figure is the scheduler's own bookkeeping: CPU seconds and steps per second for 19,366 requests
(target: at most 20 s on one core), then a cProfile split of where the time goes.

``--nano-vllm PATH`` (a checkout of github.com/GeeeekExplorer/nano-vllm, and ``pip install xxhash``)
puts nano-vllm's own Scheduler beside ours on the same requests, all queued at once (nano-vllm
schedules an offline batch: it has no arrival times), the same pool of 16-token blocks, 256
sequences and 16,384 tokens a step: output tokens per CPU second, side by side.  Its code is
imported from the checkout, not copied; its package ``__init__`` (the model runner, CUDA) is not run.
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time
import types
from pathlib import Path

from labsupport import ledger
from labsupport.cli.parser import OneLineParser, int_flag
from labsupport.cli.traces import TRACE_NAMES, load_trace_reporting
from labsupport.costmodel import CostModel
from labsupport.measure.replay import ReplayConfig, replay
from labsupport import card
from labsupport.specs import GB
from labsupport.workloads import MAX_REQUESTS


def bench(argv: list[str] | None = None) -> int:
    """Replay the whole Azure conversation trace on the cost-model clock; report steps/s and a profile."""
    p = OneLineParser(prog="python -m labsupport bench engine", description=bench.__doc__)
    p.add_argument("--trace", choices=tuple(TRACE_NAMES), default="azure-conv")
    p.add_argument("--limit", type=int_flag(1, MAX_REQUESTS))
    p.add_argument("--profile-requests", type=int_flag(0, MAX_REQUESTS), default=3000,
                   help="profile a replay of this many requests (0 to skip)")
    p.add_argument("--nano-vllm", metavar="PATH", help="a nano-vllm checkout: its Scheduler side by side with ours")
    a = p.parse_args(argv or [])
    if a.nano_vllm and not (Path(a.nano_vllm) / "nanovllm" / "engine" / "scheduler.py").is_file():
        p.error(f"--nano-vllm {a.nano_vllm}: not a nano-vllm checkout (no nanovllm/engine/scheduler.py)")
    w = load_trace_reporting(a.trace, limit=a.limit, prog="bench engine")
    model, gpu = card.model(), card.gpu()  # the course card (course.toml)
    budget = ledger.kv_budget_bytes(model, gpu)
    nb = ledger.num_blocks(budget, 16, model.kv_bytes_per_token)
    cm = CostModel(model, gpu)
    rp = replay(w.requests, cost_model=cm, num_blocks=nb)
    r = rp.report(1.0, 0.020)
    print(f"bench engine: {w.describe()}")
    print(f"  {model.name} on {gpu.name}, {budget / GB:.2f} GB = {nb:,} blocks of 16, watermark 1%, preemption auto")
    print(f"  {r.finished:,} finished + {r.rejected:,} rejected of {r.requests:,}; {r.steps:,} steps; "
          f"{r.output_tokens:,} output tokens; {r.duration_s:,.0f} s simulated")
    cpu = max(rp.cpu_s, 1e-6)  # a tiny --limit can take less than the clock's resolution
    print(f"  replay: {rp.wall_s:.2f} s wall, {rp.cpu_s:.2f} s CPU (target <= 20 s on one core); "
          f"{r.steps / cpu:,.0f} steps/s, {r.output_tokens / cpu / 1e6:.2f} M tokens/s of CPU")
    if a.profile_requests:
        n = min(a.profile_requests, len(w.requests))
        prof = cProfile.Profile()
        prof.enable()
        replay(w.requests[:n], cost_model=cm, num_blocks=nb)
        prof.disable()
        st = pstats.Stats(prof)
        total = max(sum(v[2] for v in st.stats.values()), 1e-12)  # self time over all functions
        groups: dict[str, float] = {}
        rows = []
        for (file, _, func), (_, _, tt, _, _) in st.stats.items():
            where = ("engine" if file.endswith("engine.py") else "allocator" if file.endswith("block_allocator.py")
                     else "cost model" if file.endswith(("costmodel.py", "ledger.py")) else "python/other")
            groups[where] = groups.get(where, 0.0) + tt
            rows.append((tt, func if file == "~" else f"{file.rsplit('/', 1)[-1]}:{func}"))
        print(f"  where the time goes (cProfile self time, first {n:,} requests; profiling inflates it):")
        for where, tt in sorted(groups.items(), key=lambda kv: -kv[1]):
            print(f"    {where:<13} {100 * tt / total:5.1f}%")
        for tt, name in sorted(rows, reverse=True)[:8]:
            print(f"      {100 * tt / total:5.1f}%  {name}")
    if a.nano_vllm:
        side_by_side(Path(a.nano_vllm), [(r.prompt_tokens, r.output_tokens) for r in w.requests], cm, nb)
    return 0


STEP_TOKENS = 16_384  # nano-vllm's default max_num_batched_tokens


def _nano_scheduler(checkout: Path):
    """nano-vllm's Scheduler, Sequence and SamplingParams from a checkout, without its package __init__."""
    package = types.ModuleType("nanovllm")
    package.__path__ = [str(checkout / "nanovllm")]
    sys.modules.setdefault("nanovllm", package)
    if "transformers" not in sys.modules:  # config.py imports AutoConfig; the Scheduler reads plain attributes
        try:
            import transformers  # noqa: F401
        except ImportError:
            sys.modules["transformers"] = types.SimpleNamespace(AutoConfig=type("AutoConfig", (), {}))
    from nanovllm.engine.scheduler import Scheduler
    from nanovllm.engine.sequence import Sequence
    from nanovllm.sampling_params import SamplingParams

    return Scheduler, Sequence, SamplingParams


def side_by_side(checkout: Path, requests: list[tuple[int, int]], cm: CostModel, num_blocks: int) -> None:
    """The same (prompt, output) requests through nano-vllm's Scheduler and through ours, queued at once."""
    Scheduler, Sequence, SamplingParams = _nano_scheduler(checkout)
    Sequence.block_size = 16
    config = types.SimpleNamespace(max_num_seqs=256, max_num_batched_tokens=STEP_TOKENS, eos=-1,
                                   kvcache_block_size=16, num_kvcache_blocks=num_blocks)
    nano = Scheduler(config)
    for i, (prompt, output) in enumerate(requests):  # one token id per request: no two share a prefix
        nano.add(Sequence([i] * prompt, SamplingParams(max_tokens=output, ignore_eos=True)))
    cpu0, steps, tokens = time.process_time(), 0, 0
    while not nano.is_finished():
        seqs, is_prefill = nano.schedule()
        nano.postprocess(seqs, [0] * len(seqs), is_prefill)
        steps += 1
    nano_cpu = time.process_time() - cpu0
    tokens = sum(o for _, o in requests)
    ours = replay([(0.0, p, o) for p, o in requests], ReplayConfig(max_num_batched_tokens=STEP_TOKENS),
                  cost_model=cm, num_blocks=num_blocks)
    done = sum(r.total_output_tokens for r in ours.result.requests.values())
    print(f"  side by side, {len(requests):,} requests queued at once, {num_blocks:,} blocks of 16, 256 sequences, "
          f"{STEP_TOKENS:,} tokens a step:")
    print(f"    nano-vllm Scheduler  {nano_cpu:7.2f} s CPU  {steps:9,} steps  {tokens / nano_cpu / 1e6:5.2f} M tokens/s")
    print(f"    labsupport Engine    {ours.cpu_s:7.2f} s CPU  {ours.result.counters.steps:9,} steps  "
          f"{done / ours.cpu_s / 1e6:5.2f} M tokens/s  ({nano_cpu / ours.cpu_s:.2f}x nano-vllm's speed; ours also "
          "prices every step on the cost model)")
