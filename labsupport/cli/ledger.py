"""`python -m labsupport ledger`: the lecture's "Numbers worth memorizing" for any model and GPU.

Instructors regenerate the table for their own card (§10.2–§10.6 and the exercises); defaults
reproduce the lecture's configuration exactly, beside the lecture's printed figures.
"""
from __future__ import annotations

import argparse
import sys

from labsupport import ledger as L
from labsupport.checks import MAX_TOKENS
from labsupport.cli.parser import OneLineParser, UsageError, dumps_strict, int_flag, real_flag, run_command, strict_json
from labsupport.specs import GB, GPUS, MODELS, GPUSpec, ModelSpec, get_gpu, get_model
from labsupport.units import fmt_pct

PROG = "ledger"

# Each flag's range keeps every product the ledger forms finite (a 2**31-token S_max on a 4,096-layer
# model at 1 MB/s is still a number); values outside it are refused by the parser, naming the flag.
MODEL_FLAGS = {  # flag -> (ModelSpec field, type)
    "--layers": ("num_layers", int_flag(1, 4096)),
    "--heads": ("num_heads", int_flag(1, 65_536)),
    "--kv-heads": ("num_kv_heads", int_flag(1, 65_536)),
    "--head-dim": ("head_dim", int_flag(1, 65_536)),
    "--params": ("num_params", real_flag(1.0, 1e15)),
    "--dtype-bytes": ("dtype_bytes", int_flag(1, 8)),
}
TOKENS = int_flag(1, MAX_TOKENS)
TOKENS_OR_ZERO = int_flag(0, MAX_TOKENS)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m labsupport ledger", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one flat JSON object, base units (strict JSON)")
    p.add_argument("--markdown", action="store_true", help="the table as Markdown (LEDGER.md's generated section)")
    p.add_argument("--model", default="lecture-7b", help=f"preset: {', '.join(sorted(MODELS))}")
    p.add_argument("--gpu", default="h100-sxm-80gb", help=f"preset: {', '.join(sorted(GPUS))}")
    for flag, (_, kind) in MODEL_FLAGS.items():
        p.add_argument(flag, type=kind, help="override the model preset")
    p.add_argument("--hbm-gb", type=real_flag(1e-3, 1e9), help="HBM in GB (1e9 B)")
    p.add_argument("--bandwidth-gbs", type=real_flag(1e-3, 1e9), help="HBM bandwidth, GB/s")
    p.add_argument("--peak-tflops", type=real_flag(1e-6, 1e9), help="dense bf16 peak, TFLOP/s")
    p.add_argument("--mfu", type=real_flag(1e-3, 1.0), default=0.5, help="achieved fraction of peak for prefill (0.5)")
    p.add_argument("--kv-budget-gb", type=real_flag(1e-9, 1e9), help="KV budget in GB; default HBM - weights - 4 GB")
    p.add_argument("--prompt", type=TOKENS, default=512)
    p.add_argument("--output", type=TOKENS_OR_ZERO, default=128)
    p.add_argument("--s-max", type=TOKENS, default=4096, help="the naive slot; at least --prompt + --output")
    p.add_argument("--block-size", type=TOKENS, default=16)
    p.add_argument("--link-gbs", type=real_flag(1e-3, 1e9), default=64.0, help="host link for swap, GB/s")
    p.add_argument("--tpot-slo-ms", type=real_flag(1e-6, 1e9), default=20.0)
    p.add_argument("--fanout-n", type=int_flag(1, 1 << 20), default=8)
    p.add_argument("--fanout-prompt", type=TOKENS_OR_ZERO, default=4096)
    p.add_argument("--fanout-output", type=TOKENS_OR_ZERO, default=256)
    return p


def scenario_from_args(args) -> L.Scenario:
    """Turn parsed flags (each already in its range) into a Scenario, checking they agree; UsageError names the flags."""
    base = get_model(args.model)
    overrides = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _) in MODEL_FLAGS.items()}
    shape = {field: (base_value if value is None else value)
             for field, value, base_value in ((f, v, getattr(base, f)) for f, v in overrides.items())}
    if shape["num_heads"] % shape["num_kv_heads"]:
        raise UsageError(f"--heads {shape['num_heads']} must be a multiple of --kv-heads {shape['num_kv_heads']} "
                         f"(each KV head serves a whole group of query heads)")
    if args.s_max < args.prompt + args.output:
        raise UsageError(f"--s-max {args.s_max:,} is below --prompt + --output = {args.prompt + args.output:,}: "
                         f"a reserve-to-max slot must hold the whole sequence")
    if args.fanout_prompt + args.fanout_output == 0:
        raise UsageError("--fanout-prompt and --fanout-output are both 0: a fan-out needs at least one token")
    custom = any(v is not None for v in overrides.values())
    model = ModelSpec(name="custom" if custom else base.name, **shape)
    g = get_gpu(args.gpu)
    gpu_custom = not (args.hbm_gb is None and args.bandwidth_gbs is None and args.peak_tflops is None)
    gpu = GPUSpec(
        name="custom" if gpu_custom else g.name,
        hbm_bytes=g.hbm_bytes if args.hbm_gb is None else args.hbm_gb * GB,
        hbm_bandwidth=g.hbm_bandwidth if args.bandwidth_gbs is None else args.bandwidth_gbs * GB,
        peak_flops=g.peak_flops if args.peak_tflops is None else args.peak_tflops * 1e12,
        link_bandwidth=args.link_gbs * GB,
        bf16=g.bf16,
    )
    return L.Scenario(
        model=model, gpu=gpu, kv_budget=None if args.kv_budget_gb is None else args.kv_budget_gb * GB,
        prompt=args.prompt, output=args.output, s_max=args.s_max, block_size=args.block_size,
        link_bandwidth=args.link_gbs * GB, mfu=args.mfu, tpot_slo_s=args.tpot_slo_ms / 1e3,
        fanout_n=args.fanout_n, fanout_prompt=args.fanout_prompt, fanout_output=args.fanout_output,
    )


def notes_for(sc: L.Scenario, r: dict) -> list[str]:
    """Why a figure of this scenario is undefined (null in JSON, n/a in the table)."""
    notes = []
    if r["naive_concurrency"] == 0:
        notes.append(f"concurrency_gain is undefined: one reserve-to-max slot of S_max = {sc.s_max:,} tokens "
                     f"({r['naive_slot_bytes']:,} B) is larger than the KV budget ({r['kv_budget_bytes']:,.0f} B), "
                     f"so naive_concurrency is 0")
    return notes


def _gain(r: dict) -> str:
    return f"{r['concurrency_gain']:.2f}x" if r["naive_concurrency"] else "n/a: no naive slot fits"


def rows(sc: L.Scenario, r: dict) -> list[tuple[str, str, str, str]]:
    """(quantity, exact value, lecture's printed value, section): the "Numbers worth memorizing"."""
    u32k = L.naive_utilization(r["kv_budget_bytes"], 8 * sc.s_max, sc.seq_tokens, r["kv_bytes_per_token"])
    kv = r["kv_bytes_per_token"]
    xo = r["crossover_tokens"]
    # §10.3's internal fragmentation: every resident sequence's mean tail, as a share of the budget
    tail = r["paged_concurrency"] * r["mean_tail_waste_tokens"] * kv / r["kv_budget_bytes"]
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
        (f"Same, at S_max = {8 * sc.s_max:,}: share of the budget; one slot's occupancy",
         f"{fmt_pct(u32k)}; {fmt_pct(L.slot_occupancy(8 * sc.s_max, sc.seq_tokens))}", "1.9% (per slot)", "§10.2"),
        ("Concurrency: naive -> paged", f"{r['naive_concurrency']} -> {r['paged_concurrency']} "
         f"({_gain(r)})", "29 -> 199 (6.9x)", "§10.2, §10.3"),
        (f"Paged utilization, b_blk = {sc.block_size}: 100% - the mean tail; end of life / over the life",
         f"{fmt_pct(1 - tail)}; {fmt_pct(r['paged_utilization'])} / {fmt_pct(r['paged_utilization_time_avg'])}",
         "98.7% (100% - 1.3%)", "§10.3"),
        (f"Internal fragmentation, b_blk = {sc.block_size}",
         f"<= {sc.block_size - 1} tokens, mean {r['mean_tail_waste_tokens']:g} -> {fmt_pct(tail)} at "
         f"B = {r['paged_concurrency']}", "<=15 tokens, mean 8 -> 1.3%", "§10.3"),
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


def labelled(quantity: str, section: str) -> str:
    """'quantity (section)', unless the quantity already names its section that way."""
    return quantity if quantity.endswith(f"({section})") else f"{quantity} ({section})"


def render_markdown(sc: L.Scenario, r: dict) -> str:
    out = ["| Quantity | Exact | Lecture printed | Section |", "|---|---|---|---|"]
    out += [f"| {q} | {e} | {p} | {s} |" for q, e, p, s in rows(sc, r)]
    out += ["", "Printed figures that another stated convention reproduces (neither reading is wrong):", "",
            "| Quantity | Printed | The convention that gives it | The ledger's default reading |", "|---|---|---|---|"]
    out += [f"| {labelled(c.quantity, c.section)} | {c.printed} | {c.convention}"
            + (f". Also reproduced by {c.also_text}" if c.also else "") + f" | {c.default} |" for c in L.CONVENTIONS]
    out += ["", "Errata: printed figures no convention we tried reproduces (a reading marked 'a slip' misreads a "
            "unit or formula the lecture states):", "",
            "| Quantity | Printed | Exact | Why | Readings tried |", "|---|---|---|---|---|"]
    out += [f"| {labelled(e.quantity, e.section)} | {e.printed} | {e.exact} | {e.why} | {e.tried_text or '—'} |"
            for e in L.ERRATA]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, _main, sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    sc = scenario_from_args(args)
    r = L.compute(sc)
    if args.json:
        notes = notes_for(sc, r)
        out = strict_json(r, notes)
        print(dumps_strict({**out, "notes": notes}, indent=1, sort_keys=True))
    elif args.markdown:
        print(render_markdown(sc, r))
    else:
        print(render_text(sc, r))
    return 0
