"""`python -m labsupport ledger`: the lecture's "Numbers worth memorizing" for any model and GPU.

Instructors regenerate the table for their own card (§10.2–§10.6 and the exercises); defaults
reproduce the lecture's configuration exactly, beside the lecture's printed figures.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from labsupport import ledger as L
from labsupport.cli.parser import OneLineParser, UsageError
from labsupport.specs import GB, GPUS, MODELS, GPUSpec, ModelSpec, get_gpu, get_model
from labsupport.units import fmt_pct


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m labsupport ledger", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one flat JSON object, base units")
    p.add_argument("--markdown", action="store_true", help="the table as Markdown (the README's section)")
    p.add_argument("--model", default="lecture-7b", help=f"preset: {', '.join(sorted(MODELS))}")
    p.add_argument("--gpu", default="h100-sxm-80gb", help=f"preset: {', '.join(sorted(GPUS))}")
    for flag, kind in (("--layers", int), ("--heads", int), ("--kv-heads", int), ("--head-dim", int),
                       ("--params", float), ("--dtype-bytes", int)):
        p.add_argument(flag, type=kind, help="override the model preset")
    for flag, help_ in (("--hbm-gb", "HBM in GB (1e9 B)"), ("--bandwidth-gbs", "HBM bandwidth, GB/s"),
                        ("--peak-tflops", "dense bf16 peak, TFLOP/s")):
        p.add_argument(flag, type=float, help=help_)
    p.add_argument("--mfu", type=float, default=0.5, help="achieved fraction of peak for prefill (0.5)")
    p.add_argument("--kv-budget-gb", type=float, help="KV budget in GB; default HBM - weights - 4 GB")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--s-max", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--link-gbs", type=float, default=64.0, help="host link for swap, GB/s")
    p.add_argument("--tpot-slo-ms", type=float, default=20.0)
    p.add_argument("--fanout-n", type=int, default=8)
    p.add_argument("--fanout-prompt", type=int, default=4096)
    p.add_argument("--fanout-output", type=int, default=256)
    return p


def scenario_from_args(args) -> L.Scenario:
    """Validate every flag and turn them into a Scenario; ValueError names the bad value."""
    for name in ("hbm_gb", "bandwidth_gbs", "peak_tflops", "kv_budget_gb", "params", "layers", "heads",
                 "kv_heads", "head_dim", "dtype_bytes"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    for name in ("s_max", "block_size", "link_gbs", "tpot_slo_ms", "fanout_n", "prompt"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    for name in ("output", "fanout_prompt", "fanout_output"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be non-negative, got {getattr(args, name)}")
    if not 0 < args.mfu <= 1:
        raise ValueError(f"--mfu must be in (0, 1], got {args.mfu}")
    base = get_model(args.model)
    model = ModelSpec(
        name=base.name if all(getattr(args, n) is None for n in ("layers", "heads", "kv_heads", "head_dim",
                                                                "params", "dtype_bytes")) else "custom",
        num_layers=args.layers or base.num_layers,
        num_heads=args.heads or base.num_heads,
        num_kv_heads=args.kv_heads or base.num_kv_heads,
        head_dim=args.head_dim or base.head_dim,
        num_params=args.params or base.num_params,
        dtype_bytes=args.dtype_bytes or base.dtype_bytes,
    )
    g = get_gpu(args.gpu)
    gpu = GPUSpec(
        name=g.name if args.hbm_gb is None and args.bandwidth_gbs is None and args.peak_tflops is None else "custom",
        hbm_bytes=args.hbm_gb * GB if args.hbm_gb else g.hbm_bytes,
        hbm_bandwidth=args.bandwidth_gbs * GB if args.bandwidth_gbs else g.hbm_bandwidth,
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else g.peak_flops,
        link_bandwidth=args.link_gbs * GB,
        bf16=g.bf16,
    )
    return L.Scenario(
        model=model, gpu=gpu, kv_budget=args.kv_budget_gb * GB if args.kv_budget_gb else None,
        prompt=args.prompt, output=args.output, s_max=args.s_max, block_size=args.block_size,
        link_bandwidth=args.link_gbs * GB, mfu=args.mfu, tpot_slo_s=args.tpot_slo_ms / 1e3,
        fanout_n=args.fanout_n, fanout_prompt=args.fanout_prompt, fanout_output=args.fanout_output,
    )


def rows(sc: L.Scenario, r: dict) -> list[tuple[str, str, str, str]]:
    """(quantity, exact value, lecture's printed value, section): the "Numbers worth memorizing"."""
    u32k = L.naive_utilization(r["kv_budget_bytes"], 8 * sc.s_max, sc.seq_tokens, r["kv_bytes_per_token"])
    kv = r["kv_bytes_per_token"]
    xo = r["crossover_tokens"]
    return [
        ("KV bytes per token", f"{kv:,} B ({kv / 1024:,.0f} KiB)", "512 KiB", "§10.2"),
        ("KV budget", f"{r['kv_budget_bytes'] / GB:.2f} GB", "62.5 GB", "§10.2"),
        (f"Naive slot, S_max = {sc.s_max:,}", f"{r['naive_slot_bytes']:,} B = {r['naive_slot_bytes'] / GB:.3f} GB",
         "2.147 GB", "§10.2"),
        (f"Naive utilization, {sc.seq_tokens}-token workload at S_max = {sc.s_max:,}",
         f"{fmt_pct(r['naive_utilization'])} ({r['naive_concurrency'] * sc.seq_tokens * kv / GB:.2f} of "
         f"{r['kv_budget_bytes'] / GB:.2f} GB)", "15.2% (9.5 of 62.5 GB)", "§10.2"),
        (f"Same, averaged over each sequence's life ({sc.prompt:,} … {sc.seq_tokens - 1:,} tokens held)",
         fmt_pct(r["naive_utilization_time_avg"]), "14% (86% empty)", "timing plan, §10.2"),
        (f"Same, at S_max = {8 * sc.s_max:,}", fmt_pct(u32k), "1.9%", "§10.2"),
        ("Concurrency: naive -> paged", f"{r['naive_concurrency']} -> {r['paged_concurrency']} "
         f"({r['concurrency_gain']:.2f}x)", "29 -> 199 (6.9x)", "§10.2, §10.3"),
        (f"Paged utilization, b_blk = {sc.block_size}: end of life / over the life",
         f"{fmt_pct(r['paged_utilization'])} / {fmt_pct(r['paged_utilization_time_avg'])}", "98.7%", "§10.3"),
        (f"Internal fragmentation, b_blk = {sc.block_size}",
         f"<= {sc.block_size - 1} tokens, mean {r['mean_tail_waste_tokens']:g}", "<=15 tokens, mean 8 -> 1.3%",
         "§10.3"),
        (f"Block-table overhead, {sc.s_max:,}-token sequence",
         f"{r['block_table_entries']} entries = {r['block_table_bytes']:,} B (int32)", "256 entries ≈ 2 KB", "§10.3"),
        (f"Fan-out sharing, n = {sc.fanout_n} off {sc.fanout_prompt:,}",
         f"{r['fanout_factor']:.2f}x ({r['fanout_tokens_unshared']:,} -> {r['fanout_tokens_shared']:,} tokens)",
         "5.7x (34,816 -> 6,144 tokens)", "§10.4"),
        (f"Swap round trip, {sc.s_max:,} tokens at {sc.link / GB:g} GB/s",
         f"{1e3 * r['swap_round_trip_s']:.1f} ms", "67 ms", "§10.5"),
        (f"Recompute, {sc.s_max:,}-token prefill at {100 * sc.mfu:g}% peak",
         f"{1e3 * r['recompute_s']:.1f} ms ({r['recompute_flops'] / 1e12:.1f} TFLOP)", "129 ms", "§10.5"),
        ("Swap/recompute break-even bandwidth", f"{r['breakeven_link_gbs']:.2f} GB/s", "33.3 GB/s", "§10.5"),
        (f"Swap/recompute crossover on {sc.link / GB:g} GB/s",
         f"{xo:,.0f} tokens" if xo > 0 else "swap wins at every length", "(Ex. 4: ~2,600 at 32 GB/s)", "§10.5"),
        (f"TPOT at B = {r['paged_concurrency']}, {sc.seq_tokens}-token sequences",
         f"{1e3 * r['tpot_s']:.2f} ms ({L.decode_step_bytes(sc.model, r['paged_concurrency'], sc.seq_tokens) / GB:.2f}"
         f" GB/step)", "23.5 ms at B = 199 (78.8 GB/step)", "§10.6"),
        ("Throughput at that B", f"{r['throughput_tok_s']:,.0f} tok/s", "8,470 tok/s", "§10.6"),
        (f"Largest B meeting a {1e3 * sc.tpot_slo_s:g} ms TPOT SLO", f"{r['max_batch_for_slo']}", "164", "§10.6"),
        ("Ridge-point batch (Lecture 2)", f"{r['ridge_batch']:.1f}", "295", "§10.1"),
    ]


def render_text(sc: L.Scenario, r: dict) -> str:
    head = (f"Numbers worth memorizing — {sc.model.name} on {sc.gpu.name} "
            f"(GB = 1e9 B, GiB = 2^30 B; 'lecture' is the printed figure for the lecture's configuration)")
    table = rows(sc, r)
    w0 = max(len(q) for q, *_ in table)
    w1 = max(len(e) for _, e, *_ in table)
    lines = [head, ""] + [f"{q:<{w0}}  {e:<{w1}}  lecture: {p}  [{s}]" for q, e, p, s in table]
    return "\n".join(lines)


def render_markdown(sc: L.Scenario, r: dict) -> str:
    out = ["| Quantity | Exact | Lecture printed | Section |", "|---|---|---|---|"]
    out += [f"| {q} | {e} | {p} | {s} |" for q, e, p, s in rows(sc, r)]
    out += ["", "Printed figures that another stated convention reproduces (neither reading is wrong):", "",
            "| Quantity | Printed | The convention that gives it | The ledger's default reading |", "|---|---|---|---|"]
    out += [f"| {c.quantity} ({c.section}) | {c.printed} | {c.convention} | {c.default} |" for c in L.CONVENTIONS]
    out += ["", "Errata: printed figures no convention we tried reproduces (a reading marked 'a slip' misreads a "
            "unit or formula the lecture states):", "",
            "| Quantity | Printed | Exact | Why | Readings tried |", "|---|---|---|---|---|"]
    out += [f"| {e.quantity} ({e.section}) | {e.printed} | {e.exact} | {e.why} | {e.tried_text or '—'} |"
            for e in L.ERRATA]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        sc = scenario_from_args(args)
        r = L.compute(sc)
    except (UsageError, ValueError) as exc:
        print(f"labsupport ledger: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: v for k, v in r.items()}, indent=1, sort_keys=True))
    elif args.markdown:
        print(render_markdown(sc, r))
    else:
        print(render_text(sc, r))
    return 0
