"""`python -m labsupport ledger`: the lecture's "Numbers worth memorizing" for any model and GPU (staff side).

Instructors regenerate the table for their own card (§10.2–§10.6 and the exercises); defaults
reproduce the lecture's configuration exactly, beside the lecture's printed figures.  `compute`
(the whole table for one `Scenario`) and `exercise1`…`exercise5` (each exercise solved in one call)
live here, not in `labsupport.ledger`: they answer the labs' exercises whole, so the student release
leaves them out (with this command and LEDGER.md); the ledger keeps the closed form of each quantity.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, field

from labsupport import card, checks
from labsupport import ledger as L
from labsupport.checks import MAX_TOKENS
from labsupport.cli.parser import OneLineParser, UsageError, dumps_strict, int_flag, real_flag, run_command, strict_json
from labsupport.specs import GB, GPUS, LECTURE_MFU, MODELS, GPUSpec, ModelSpec
from labsupport.units import fmt_pct

PROG = "ledger"


# --- The whole ledger for one configuration ---------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    """Everything the lecture's "Numbers worth memorizing" depend on; defaults are the lecture's workload on the
    course card's model and GPU (course.toml)."""

    model: ModelSpec = field(default_factory=card.model)
    gpu: GPUSpec = field(default_factory=card.gpu)
    kv_budget: float | None = None  # bytes; None -> HBM - weights - 4 GB
    prompt: int = 512
    output: int = 128
    s_max: int = 4096
    block_size: int = 16
    link_bandwidth: float | None = None  # bytes/s; None -> the GPU's host link
    mfu: float = LECTURE_MFU
    tpot_slo_s: float = 0.020
    fanout_n: int = 8
    fanout_prompt: int = 4096
    fanout_output: int = 256

    def __post_init__(self):
        _check_scenario(self)

    @property
    def budget(self) -> float:
        return L.kv_budget_bytes(self.model, self.gpu) if self.kv_budget is None else self.kv_budget

    @property
    def link(self) -> float:
        return self.gpu.link_bandwidth if self.link_bandwidth is None else self.link_bandwidth

    @property
    def seq_tokens(self) -> int:
        return self.prompt + self.output


def _check_scenario(sc: Scenario) -> None:
    """Every field of a Scenario the right type, finite and consistent; ValueError names the field."""
    if not isinstance(sc.model, ModelSpec) or not isinstance(sc.gpu, GPUSpec):
        raise ValueError(f"Scenario needs a ModelSpec and a GPUSpec, got {type(sc.model).__name__} and "
                         f"{type(sc.gpu).__name__}")
    for name in ("prompt", "s_max", "block_size", "fanout_n"):
        checks.as_count(name, getattr(sc, name), 1)
    for name in ("output", "fanout_prompt", "fanout_output"):
        checks.as_count(name, getattr(sc, name), 0)
    for name in ("kv_budget", "link_bandwidth"):
        if getattr(sc, name) is not None:
            checks.as_real(name, getattr(sc, name), above=0)
    checks.as_real("tpot_slo_s", sc.tpot_slo_s, above=0)
    checks.as_fraction("mfu", sc.mfu, include_zero=False, include_one=True)
    if sc.s_max < sc.prompt + sc.output:
        raise ValueError(f"s_max={sc.s_max:,} is below prompt + output = {sc.prompt + sc.output:,}: a "
                         f"reserve-to-max slot must hold the whole sequence")
    if sc.fanout_prompt + sc.fanout_output == 0:
        raise ValueError("fanout_prompt and fanout_output are both 0: a fan-out needs at least one token")


def compute(sc: Scenario) -> dict:
    """The lecture's headline numbers for one scenario, as a flat dict in base units."""
    kv = L.kv_bytes_per_token(sc.model)
    budget = sc.budget
    if budget <= 0:
        raise ValueError(f"KV budget is {budget:,.0f} bytes: the weights alone do not leave room for a KV cache")
    if budget < sc.block_size * kv:
        raise ValueError(f"KV budget {budget:,.0f} bytes is smaller than one block ({sc.block_size * kv:,} bytes)")
    seq = sc.seq_tokens
    if L.blocks_for(seq, sc.block_size) > L.num_blocks(budget, sc.block_size, kv):
        raise ValueError(f"a {seq}-token sequence does not fit in the {budget:,.0f}-byte KV budget")
    peak = sc.gpu.peak_flops
    paged_b = L.paged_concurrency(budget, seq, sc.block_size, kv)
    tpot = L.tpot_s(sc.model, paged_b, seq, sc.gpu.hbm_bandwidth)
    unshared, shared = L.fanout_tokens(sc.fanout_n, sc.fanout_prompt, sc.fanout_output)
    naive_b = L.naive_concurrency(budget, sc.s_max, kv)
    return {
        "model": sc.model.name,
        "gpu": sc.gpu.name,
        "kv_bytes_per_token": kv,
        "weight_bytes": sc.model.weight_bytes,
        "kv_budget_bytes": budget,
        "seq_tokens": seq,
        "naive_slot_bytes": L.naive_slot_bytes(sc.s_max, kv),
        "naive_concurrency": naive_b,
        "naive_utilization": L.naive_utilization(budget, sc.s_max, seq, kv),
        "naive_utilization_time_avg": L.naive_utilization_time_avg(budget, sc.s_max, sc.prompt, sc.output, kv),
        "num_blocks": L.num_blocks(budget, sc.block_size, kv),
        "paged_concurrency": paged_b,
        "paged_utilization": L.paged_utilization(budget, seq, sc.block_size, kv),
        "paged_utilization_time_avg": L.paged_utilization_time_avg(budget, sc.prompt, sc.output, sc.block_size, kv),
        "concurrency_gain": paged_b / naive_b if naive_b else math.inf,
        "mean_tail_waste_tokens": L.mean_tail_waste_tokens(sc.block_size),
        "block_table_entries": L.block_table_entries(sc.s_max, sc.block_size),
        "block_table_bytes": L.block_table_bytes(sc.s_max, sc.block_size),
        "fanout_tokens_unshared": unshared,
        "fanout_tokens_shared": shared,
        "fanout_factor": unshared / shared,
        "swap_round_trip_s": L.swap_round_trip_s(sc.s_max * kv, sc.link),
        "recompute_flops": L.prefill_flops(sc.model, sc.s_max),
        "recompute_s": L.recompute_s(sc.model, sc.s_max, peak, sc.mfu),
        "breakeven_link_gbs": L.breakeven_link_bandwidth(sc.model, sc.s_max, peak, sc.mfu) / GB,
        "crossover_tokens": L.crossover_tokens(sc.model, sc.link, peak, sc.mfu),
        "tpot_s": tpot,
        "throughput_tok_s": L.throughput_tok_s(paged_b, tpot),
        "max_batch_for_slo": L.max_batch_for_tpot(sc.model, seq, sc.tpot_slo_s, sc.gpu.hbm_bandwidth),
        "ridge_batch": L.ridge_batch(sc.model, sc.gpu),
    }


# --- The exercises ----------------------------------------------------------------------------

def exercise1(model: ModelSpec | None = None, gqa_model: ModelSpec | None = None, gpu: GPUSpec | None = None,
              s_max: int = 131_072, prompt: int = 512, output: int = 128, block_size: int = 16) -> dict:
    """Exercise 1, the long-context brochure: S_max = 128K under MHA, then GQA-8, naive vs paged (the card's
    model with more KV heads, then with fewer, unless told)."""
    c = card.card()
    model, gqa_model, gpu = model or c.mha, gqa_model or c.gqa, gpu or c.gpu
    budget = L.kv_budget_bytes(model, gpu)
    seq = prompt + output
    out = {"budget_bytes": budget}
    for tag, m in (("mha", model), ("gqa", gqa_model)):
        kv = m.kv_bytes_per_token
        out[f"{tag}_slot_bytes"] = L.naive_slot_bytes(s_max, kv)
        out[f"{tag}_naive_concurrency"] = L.naive_concurrency(budget, s_max, kv)
        out[f"{tag}_naive_utilization"] = L.naive_utilization(budget, s_max, seq, kv)
        out[f"{tag}_occupancy_bytes"] = seq * kv
        out[f"{tag}_paged_concurrency"] = L.paged_concurrency(budget, seq, block_size, kv)
    out["gqa_cost_factor"] = out["gqa_paged_concurrency"] / out["gqa_naive_concurrency"]
    return out


def exercise2(model: ModelSpec | None = None, gpu: GPUSpec | None = None,
              mix: tuple[tuple[int, float], ...] = ((512, 0.70), (4096, 0.25), (32_768, 0.05))) -> dict:
    """Exercise 2, per-request S_max: mean slot size and mean concurrency of a declared-length mix."""
    model, gpu = model or card.model(), gpu or card.gpu()
    total = sum(p for _, p in mix)
    if abs(total - 1) > 1e-9:
        raise ValueError(f"mix proportions must sum to 1, got {total}")
    kv = model.kv_bytes_per_token
    budget = L.kv_budget_bytes(model, gpu)
    mean_slot = sum(s * kv * p for s, p in mix)
    return {
        "slot_bytes": [s * kv for s, _ in mix],
        "mean_slot_bytes": mean_slot,
        "mean_concurrency": budget / mean_slot,
        "naive_concurrency_4k": L.naive_concurrency(budget, 4096, kv),
    }


def exercise3(block_sizes=(8, 16, 64, 256), batch: int = 199, model: ModelSpec | None = None,
              gpu: GPUSpec | None = None, median: float = 800, tail_fraction: float = 0.05,
              tail_length: float = 20_000) -> list[dict]:
    """Exercise 3: the block-size table for the lognormal workload (median and p95 lengths)."""
    model, gpu = model or card.model(), gpu or card.gpu()
    mu, sigma = L.lognormal_params(median, tail_length, tail_fraction)
    p95 = math.exp(mu + sigma * 1.6448536269514722)
    budget = L.kv_budget_bytes(model, gpu)
    kv = model.kv_bytes_per_token
    rows = []
    for r in L.block_size_table(block_sizes, batch, budget, kv):
        rows.append({**asdict(r),
                     "entries_at_median": L.block_table_entries(math.ceil(median), r.block_size),
                     "entries_at_p95": L.block_table_entries(math.ceil(p95 - 1e-6), r.block_size)})
    return rows


def exercise4(model_gqa: ModelSpec | None = None, model_mha: ModelSpec | None = None, gpu: GPUSpec | None = None,
              seq_tokens: int = 16_384, link: float = 32 * GB, mfu: float = LECTURE_MFU) -> dict:
    """Exercise 4: 16K GQA-8 swap vs recompute, and the MHA crossover length on a 32 GB/s link (the card's
    model with fewer and with more KV heads unless told)."""
    c = card.card()
    m, model_mha, gpu = model_gqa or c.gqa, model_mha or c.mha, gpu or c.gpu
    kv = seq_tokens * m.kv_bytes_per_token
    swap = L.swap_round_trip_s(kv, gpu.link_bandwidth)
    rec = L.recompute_s(m, seq_tokens, gpu.peak_flops, mfu)
    return {
        "kv_bytes": kv,
        "swap_s": swap,
        "recompute_flops": L.prefill_flops(m, seq_tokens),
        "recompute_s": rec,
        "swap_advantage": rec / swap,
        "breakeven_link_bandwidth": L.breakeven_link_bandwidth(m, seq_tokens, gpu.peak_flops, mfu),
        "mha_crossover_tokens": L.crossover_tokens(model_mha, link, gpu.peak_flops, mfu),
    }


def exercise5(model: ModelSpec | None = None, gpu: GPUSpec | None = None, context_tokens: int = 7_700,
              submitted_prompt_tokens: int = 97_000, reserve_s_max: int = 16_384, block_size: int = 16,
              mfu: float = LECTURE_MFU) -> dict:
    """Exercise 5: the 20-step agent session under GQA-8 — peak KV, sessions per card, prefill cost (the card's
    model with fewer KV heads unless told)."""
    m, gpu = model or card.card().gqa, gpu or card.gpu()
    kv = m.kv_bytes_per_token
    budget = L.kv_budget_bytes(m, gpu)
    weight_flops = submitted_prompt_tokens * 2 * m.num_params  # Lecture 2's flat weight term alone
    return {
        "peak_kv_bytes": context_tokens * kv,
        "sessions_paged": L.paged_concurrency(budget, context_tokens, block_size, kv),
        "sessions_naive": L.naive_concurrency(budget, reserve_s_max, kv),
        "prefill_flops": weight_flops,
        "prefill_s": weight_flops / (gpu.peak_flops * mfu),
    }


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
    p.add_argument("--list", action="store_true", help="print the catalogue of models and GPUs, then stop")
    p.add_argument("--model", help=f"preset: {', '.join(sorted(MODELS))} (default: the course card's)")
    p.add_argument("--gpu", help=f"preset: {', '.join(sorted(GPUS))} (default: the course card's)")
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


def scenario_from_args(args) -> Scenario:
    """Turn parsed flags (each already in its range) into a Scenario, checking they agree; UsageError names the flags."""
    base = card.model(args.model)
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
    g = card.gpu(args.gpu)
    gpu_custom = not (args.hbm_gb is None and args.bandwidth_gbs is None and args.peak_tflops is None)
    gpu = GPUSpec(
        name="custom" if gpu_custom else g.name,
        hbm_bytes=g.hbm_bytes if args.hbm_gb is None else args.hbm_gb * GB,
        hbm_bandwidth=g.hbm_bandwidth if args.bandwidth_gbs is None else args.bandwidth_gbs * GB,
        peak_flops=g.peak_flops if args.peak_tflops is None else args.peak_tflops * 1e12,
        link_bandwidth=args.link_gbs * GB,
        bf16=g.bf16,
    )
    return Scenario(
        model=model, gpu=gpu, kv_budget=None if args.kv_budget_gb is None else args.kv_budget_gb * GB,
        prompt=args.prompt, output=args.output, s_max=args.s_max, block_size=args.block_size,
        link_bandwidth=args.link_gbs * GB, mfu=args.mfu, tpot_slo_s=args.tpot_slo_ms / 1e3,
        fanout_n=args.fanout_n, fanout_prompt=args.fanout_prompt, fanout_output=args.fanout_output,
    )


def notes_for(sc: Scenario, r: dict) -> list[str]:
    """Why a figure of this scenario is undefined (null in JSON, n/a in the table)."""
    notes = []
    if r["naive_concurrency"] == 0:
        notes.append(f"concurrency_gain is undefined: one reserve-to-max slot of S_max = {sc.s_max:,} tokens "
                     f"({r['naive_slot_bytes']:,} B) is larger than the KV budget ({r['kv_budget_bytes']:,.0f} B), "
                     f"so naive_concurrency is 0")
    return notes


def _gain(r: dict) -> str:
    return f"{r['concurrency_gain']:.2f}x" if r["naive_concurrency"] else "n/a: no naive slot fits"


def rows(sc: Scenario, r: dict) -> list[tuple[str, str, str, str]]:
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


def render_text(sc: Scenario, r: dict) -> str:
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


def render_markdown(sc: Scenario, r: dict) -> str:
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


def catalogue_text() -> str:
    """The catalogue course.toml names from (its figures; each preset's source is cited in specs.py)."""
    c = card.card()
    mark = lambda on: "*" if on else " "
    lines = [f"models (* the course card's, {c.source}):"]
    lines += [f" {mark(m == c.model)} {key:<16} {m.num_layers:>3} layers, {m.num_heads:>3} heads, {m.num_kv_heads:>3} KV "
              f"heads x {m.head_dim}, {m.num_params / 1e9:.2f}e9 params, {m.kv_bytes_per_token:,} B KV/token"
              for key, m in sorted(MODELS.items()) if key == m.name]
    lines += ["GPUs:"]
    lines += [f" {mark(g == c.gpu)} {key:<16} {g.hbm_bytes / GB:g} GB, {g.hbm_bandwidth / GB:,.0f} GB/s, "
              f"{g.peak_flops / 1e12:,.2f} TFLOP/s dense, link {g.link_bandwidth / GB:g} GB/s"
              for key, g in sorted(GPUS.items()) if key == g.name]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        print(catalogue_text())
        return 0
    sc = scenario_from_args(args)
    r = compute(sc)
    if args.json:
        notes = notes_for(sc, r)
        out = strict_json(r, notes)
        print(dumps_strict({**out, "notes": notes}, indent=1, sort_keys=True))
    elif args.markdown:
        print(render_markdown(sc, r))
    else:
        print(render_text(sc, r))
    return 0
