"""`python -m labsupport bench viz|viz_memory|viz_engine|viz_sharing|viz_slo`: Python time per panel update.

A closed-form panel must update in at most 50 ms of Python (a slider feels live below that); the
TTFT panel re-runs the engine and updates only when its slider is released.  Each bench builds
the lab's own panel and cycles one control through its values.
"""
from __future__ import annotations

import statistics
import time

from labsupport.cli.parser import OneLineParser, int_flag
from labsupport.viz import S_MAX_OPTIONS
from labsupport.viz.engine import s_options, swap_recompute_panel
from labsupport.viz.memory import block_table_explorer, naive_panel
from labsupport.viz.roofline import batch_gap_panel, kv_heads_panel
from labsupport.viz.sharing import fanout_panel
from labsupport.measure.replay import ReplayConfig, replay
from labsupport.viz.slo import goodput_slo_panel, goodput_table_panel, tpot_panel, ttft_panel
from labsupport.workloads import chat_workload


def time_updates(update, repeats: int) -> list[float]:
    """Milliseconds of Python for each of `repeats` calls of `update(i)`, sorted (the 50 ms budget)."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        update(i)
        times.append(1e3 * (time.perf_counter() - start))
    return sorted(times)


def report_updates(name: str, times_ms: list[float], target_ms: float | None = 50.0) -> None:
    """One line of a panel benchmark: median, p95 and max of sorted update times."""
    p95 = times_ms[min(len(times_ms) - 1, int(0.95 * len(times_ms)))]
    target = f" (target ≤ {target_ms:g} ms)" if target_ms else ""
    print(f"{name}: {len(times_ms)} updates, median {statistics.median(times_ms):.1f} ms, "
          f"p95 {p95:.1f} ms, max {times_ms[-1]:.1f} ms{target}", flush=True)


def bench_panels(cases: dict, argv: list[str] | None, prog: str, repeats: int = 20) -> int:
    """Time panels: `cases` maps a name to (make_panel, control name, values to cycle through)."""
    p = OneLineParser(prog=prog)
    p.add_argument("--repeats", type=int_flag(1, 10_000), default=repeats)
    args = p.parse_args(argv or [])
    for name, (make, control, values) in cases.items():
        panel = make()

        def update(i, panel=panel, control=control, values=values):
            panel.controls[control].value = values[(i + 1) % len(values)]

        report_updates(name, time_updates(update, args.repeats))
    return 0


def bench_roofline(argv: list[str] | None = None) -> int:
    """`python -m labsupport bench viz [--repeats N]`: Python time per closed-form panel update."""
    panels = {"batch_gap_panel (lab 01)": (batch_gap_panel, "s_max", [v for _, v in S_MAX_OPTIONS]),
              "kv_heads_panel (lab 00)": (kv_heads_panel, "num_kv_heads", [1, 2, 4, 8, 16, 32])}
    return bench_panels(panels, argv, "python -m labsupport bench viz", repeats=40)


def bench_memory(argv: list[str] | None = None) -> int:
    """`python -m labsupport bench viz_memory`: Python time per update of the lab 02/03 panels (≤ 50 ms target)."""
    cases = {"naive_panel (lab 02), S_max slider": (naive_panel, "s_max", [v for _, v in S_MAX_OPTIONS])}
    bench_panels(cases, argv, "python -m labsupport bench viz_memory")
    explorer = block_table_explorer()
    report_updates("block_table_explorer (lab 03), grow button",
                   time_updates(lambda i: explorer.step("grow A" if i % 2 else "grow B"), 20))
    return 0


def bench_sharing(argv: list[str] | None = None) -> int:
    """`python -m labsupport bench viz_sharing`: Python time per fan-out panel update (target ≤ 50 ms)."""
    cases = {"fanout_panel": (fanout_panel, "n", [1 + (i * 7) % 64 for i in range(64)])}
    return bench_panels(cases, argv, "python -m labsupport bench viz_sharing", repeats=30)


def bench_slo(argv: list[str] | None = None) -> int:
    """`python -m labsupport bench viz_slo [--repeats N]`: Python time per panel update (closed-form panels:
    target ≤ 50 ms; the TTFT panel re-runs the engine and is marked continuous_update=False)."""
    chat = chat_workload(400, rate_per_s=40.0)
    replays = [replay(chat, ReplayConfig("paged, b = 16")), replay(chat, ReplayConfig("naive", 4096))]
    cases = {
        "tpot_panel (closed form)": (lambda: tpot_panel(), "batch", [29, 100, 159, 186, 250]),
        "goodput_table_panel (closed form)": (lambda: goodput_table_panel(), "tpot_slo_ms", [15.0, 20.0, 25.0, 40.0]),
        "goodput_slo_panel (re-counts 2 x 400 requests)": (lambda: goodput_slo_panel(replays), "tpot_slo_ms",
                                                           [10.0, 20.0, 30.0, 45.0]),
        "ttft_panel (engine run per update)": (lambda: ttft_panel(), "rate_per_s", [20.0, 40.0, 62.0, 80.0]),
    }
    return bench_panels(cases, argv, "python -m labsupport bench viz_slo")


def bench_engine(argv: list[str] | None = None) -> int:
    """`python -m labsupport bench viz_engine`: Python time per swap/recompute panel update."""
    cases = {"swap_recompute_panel": (swap_recompute_panel, "seq_tokens", [v for _, v in s_options()])}
    return bench_panels(cases, argv, "python -m labsupport bench viz_engine", repeats=30)
