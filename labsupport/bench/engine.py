"""`python -m labsupport bench engine`: the whole Azure conversation trace through the engine on one core.

The scheduler is the real one (§10.5's loop over a real BlockAllocator) on the cost-model clock, so
the figure is the scheduler's own bookkeeping: CPU seconds and steps per second for 19,366 requests
(target: at most 20 s on one core), then a cProfile split of where the time goes.
"""
from __future__ import annotations

import cProfile
import pstats

from labsupport import ledger
from labsupport.cli.parser import OneLineParser, int_flag
from labsupport.cli.simulate import TRACE_NAMES, load_trace_reporting, replay
from labsupport.costmodel import CostModel
from labsupport.specs import GB, LECTURE_7B, LECTURE_GPU
from labsupport.workloads import MAX_REQUESTS


def bench(argv: list[str] | None = None) -> int:
    """Replay the whole Azure conversation trace on the cost-model clock; report steps/s and a profile."""
    p = OneLineParser(prog="python -m labsupport bench engine", description=bench.__doc__)
    p.add_argument("--trace", choices=tuple(TRACE_NAMES), default="azure-conv")
    p.add_argument("--limit", type=int_flag(1, MAX_REQUESTS))
    p.add_argument("--profile-requests", type=int_flag(0, MAX_REQUESTS), default=3000,
                   help="profile a replay of this many requests (0 to skip)")
    a = p.parse_args(argv or [])
    w = load_trace_reporting(a.trace, limit=a.limit, prog="bench engine")
    budget = ledger.kv_budget_bytes(LECTURE_7B, LECTURE_GPU)
    nb = ledger.num_blocks(budget, 16, LECTURE_7B.kv_bytes_per_token)
    cm = CostModel(LECTURE_7B, LECTURE_GPU)
    rp = replay(w.requests, cm, nb, 16)
    r = rp.report
    print(f"bench engine: {w.describe()}")
    print(f"  lecture-7b on h100-sxm-80gb, {budget / GB:.2f} GB = {nb:,} blocks of 16, watermark 1%, preemption auto")
    print(f"  {r.finished:,} finished + {r.rejected:,} rejected of {r.requests:,}; {r.steps:,} steps; "
          f"{r.output_tokens:,} output tokens; {r.duration_s:,.0f} s simulated")
    cpu = max(rp.cpu_s, 1e-6)  # a tiny --limit can take less than the clock's resolution
    print(f"  replay: {rp.wall_s:.2f} s wall, {rp.cpu_s:.2f} s CPU (target <= 20 s on one core); "
          f"{r.steps / cpu:,.0f} steps/s, {r.output_tokens / cpu / 1e6:.2f} M tokens/s of CPU")
    if a.profile_requests:
        n = min(a.profile_requests, len(w.requests))
        prof = cProfile.Profile()
        prof.enable()
        replay(w.requests[:n], cm, nb, 16)
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
    return 0
