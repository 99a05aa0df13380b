"""The lecture's arithmetic, exactly: one pure function per quantity in §10.1–§10.7.

Inputs and outputs are base units (bytes, bytes/s, FLOP, FLOP/s, seconds, tokens).  Nothing here
is tuned to a printed figure: where the lecture's rounded numbers differ from the exact ones,
``ERRATA`` records both and why.  The mechanisms (``labsupport.contiguous``, ``block_allocator``, ``kvcache``,
``engine``) are tested against these closed forms, and these against hand derivations.
"""
from __future__ import annotations

import math
from statistics import NormalDist
from dataclasses import dataclass, field

from labsupport.specs import GB, LECTURE_7B, LECTURE_GPU, LECTURE_MFU, LECTURE_RESERVED_BYTES, GPUSpec, ModelSpec


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def _nonnegative(name: str, value: float) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


# --- §10.2: bytes per token, the budget, and the reserve-to-max allocator -------------------

def kv_bytes_per_token(model: ModelSpec) -> int:
    """§10.2: K and V for every layer and KV head, 2 * L * n_kv * d_head * b bytes."""
    return model.kv_bytes_per_token


def kv_budget_bytes(model: ModelSpec, gpu: GPUSpec, reserved_bytes: float = LECTURE_RESERVED_BYTES) -> float:
    """§10.2: HBM left for KV after the weights and a fixed reserve (80 - 13.48 - 4 = 62.52 GB)."""
    _nonnegative("reserved_bytes", reserved_bytes)
    return gpu.hbm_bytes - model.weight_bytes - reserved_bytes


def naive_slot_bytes(s_max: int, kv_per_token: int) -> int:
    """§10.2: a reserve-to-max slot holds S_max tokens whatever the sequence uses."""
    _positive("s_max", s_max)
    _positive("kv_per_token", kv_per_token)
    return s_max * kv_per_token


def naive_concurrency(budget: float, s_max: int, kv_per_token: int) -> int:
    """§10.2: how many S_max slots fit in the budget (29 for the lecture's H100)."""
    _nonnegative("budget", budget)
    return int(budget // naive_slot_bytes(s_max, kv_per_token))


def naive_utilization(budget: float, s_max: int, seq_tokens: int, kv_per_token: int) -> float:
    """§10.2: bytes holding real tokens over the KV budget, with every slot filled.

    A sequence longer than its slot is truncated to the slot: the allocator cannot grow it.
    """
    _positive("budget", budget)
    _nonnegative("seq_tokens", seq_tokens)
    held = min(seq_tokens, s_max)
    return naive_concurrency(budget, s_max, kv_per_token) * held * kv_per_token / budget


def slot_occupancy(s_max: int, seq_tokens: int) -> float:
    """§10.2: the fraction of one slot that holds tokens (640 / 4,096 = 15.6%)."""
    _positive("s_max", s_max)
    return min(seq_tokens, s_max) / s_max


# --- §10.2–§10.3 over a sequence's life: a second, consistent reading ----------------------------
#
# A utilization can be read at the end of a sequence's life (640 tokens held: 15.56% naive, 99.83%
# paged) or averaged over it.  The engine holds `prompt` tokens after the prefill step and one more
# after each decode step, so over its `output` steps a sequence holds n = prompt … prompt+output-1
# tokens, one step each (the last token it emits is never cached).  That average is our measurement:
# it reproduces the lecture's unexplained 14% (timing plan) and 86% empty (§10.2's title), and gives
# 98.70% paged, where the lecture derives its 98.7% as 100% minus its 1.3% internal fragmentation
# (see `CONVENTIONS`).  Its 15.2% and 84% are end of life.

def life_lengths(prompt: int, output: int) -> range:
    """The KV lengths a sequence holds over its life, one per engine step (§10.5's loop)."""
    _positive("prompt", prompt)
    _nonnegative("output", output)
    return range(int(prompt), int(prompt) + max(1, int(output)))


def _sum_min(lengths: range, cap: int) -> int:
    """sum(min(n, cap) for n in lengths), in closed form."""
    a, b = lengths.start, lengths.stop - 1
    if b <= cap:
        return (a + b) * (b - a + 1) // 2
    if a >= cap:
        return cap * (b - a + 1)
    return (a + cap) * (cap - a + 1) // 2 + cap * (b - cap)


def _sum_ceil_div(n: int, b: int) -> int:
    """sum(ceil(k / b) for k in 1..n), in closed form (q full runs of b, then a partial one)."""
    q, r = divmod(n, b)
    return b * q * (q + 1) // 2 + r * (q + 1)


def naive_utilization_time_avg(budget: float, s_max: int, prompt: int, output: int, kv_per_token: int) -> float:
    """§10.2 averaged over each sequence's life: every slot full, each at a uniformly random step.

    Numerator: the bytes holding tokens, slots x mean(min(n, S_max)) x KV per token, n over
    `life_lengths`; denominator: the KV budget.  14.00% for the lecture's workload (86% empty).
    """
    _positive("budget", budget)
    life = life_lengths(prompt, output)
    held = _sum_min(life, s_max) / len(life)
    return naive_concurrency(budget, s_max, kv_per_token) * held * kv_per_token / budget


def paged_utilization_time_avg(budget: float, prompt: int, output: int, block_size: int, kv_per_token: int) -> float:
    """§10.3 averaged over each sequence's life, with the pool kept full of blocks.

    Numerator: the bytes holding tokens; denominator: the KV budget.  The pool's whole blocks cover
    num_blocks x b x KV of the budget, and over a life a sequence fills sum(n) of the
    sum(ceil(n / b) x b) slots its blocks hold (n over `life_lengths`): 98.70% for the lecture's
    workload at b = 16.  That reproduces the lecture's 98.7%, which the lecture itself derives as
    100% minus its 1.3% internal fragmentation (`CONVENTIONS`); the time average is our reading.
    """
    _positive("budget", budget)
    _positive("block_size", block_size)
    life = life_lengths(prompt, output)
    b = int(block_size)
    tokens = (life.start + life.stop - 1) * len(life) // 2
    slots = b * (_sum_ceil_div(life.stop - 1, b) - _sum_ceil_div(life.start - 1, b))
    pool = num_blocks(budget, b, kv_per_token) * b * kv_per_token / budget
    return pool * tokens / slots


# --- §10.3: paging ---------------------------------------------------------------------------

def blocks_for(tokens: int, block_size: int) -> int:
    """§10.3: blocks a sequence of `tokens` holds: ceil(tokens / b)."""
    _nonnegative("tokens", tokens)
    _positive("block_size", block_size)
    return -(-int(tokens) // int(block_size))


def num_blocks(budget: float, block_size: int, kv_per_token: int) -> int:
    """§10.3: physical blocks in the pool: floor(budget / (b * bytes per token))."""
    _nonnegative("budget", budget)
    _positive("block_size", block_size)
    return int(budget // (block_size * kv_per_token))


def paged_concurrency(budget: float, seq_tokens: int, block_size: int, kv_per_token: int) -> int:
    """§10.3: sequences of `seq_tokens` that fit when each holds ceil(S / b) blocks."""
    _positive("seq_tokens", seq_tokens)
    return num_blocks(budget, block_size, kv_per_token) // blocks_for(seq_tokens, block_size)


def paged_utilization(budget: float, seq_tokens: int, block_size: int, kv_per_token: int) -> float:
    """§10.3: bytes holding real tokens over the budget under paging."""
    _positive("budget", budget)
    conc = paged_concurrency(budget, seq_tokens, block_size, kv_per_token)
    return conc * seq_tokens * kv_per_token / budget


def tail_waste_tokens(seq_tokens: int, block_size: int) -> int:
    """§10.3: unfilled slots of the last block, at most b - 1."""
    return blocks_for(seq_tokens, block_size) * block_size - seq_tokens


def mean_tail_waste_tokens(block_size: int) -> float:
    """§10.3: mean tail when lengths are uniform modulo b: (b - 1) / 2 (the lecture rounds to b/2)."""
    _positive("block_size", block_size)
    return (block_size - 1) / 2


def block_table_entries(seq_tokens: int, block_size: int) -> int:
    """§10.3: one table entry per logical block (256 for 4,096 tokens at b = 16)."""
    return blocks_for(seq_tokens, block_size)


def block_table_bytes(seq_tokens: int, block_size: int, entry_bytes: int = 4) -> int:
    """§10.3: table size; int32 entries (vLLM's) give 1 KiB at 4K/b16, 8-byte entries the lecture's 2 KB."""
    _positive("entry_bytes", entry_bytes)
    return block_table_entries(seq_tokens, block_size) * entry_bytes


@dataclass(frozen=True)
class BlockSizeRow:
    """One row of §10.3's block-size table."""

    block_size: int
    mean_tail_tokens: float
    mean_tail_bytes: float
    waste_at_batch_bytes: float
    waste_fraction_of_budget: float
    table_entries: int
    contiguous_run_tokens: int


def block_size_table(
    block_sizes, batch: int, budget: float, kv_per_token: int, seq_tokens: int = 4096
) -> list[BlockSizeRow]:
    """§10.3's table: mean tail waste, waste at a batch, table entries at `seq_tokens`, run length."""
    _positive("batch", batch)
    rows = []
    for b in block_sizes:
        tail = mean_tail_waste_tokens(b)
        tail_bytes = tail * kv_per_token
        rows.append(
            BlockSizeRow(
                block_size=b,
                mean_tail_tokens=tail,
                mean_tail_bytes=tail_bytes,
                waste_at_batch_bytes=batch * tail_bytes,
                waste_fraction_of_budget=batch * tail_bytes / budget,
                table_entries=block_table_entries(seq_tokens, b),
                contiguous_run_tokens=b,
            )
        )
    return rows


# --- §10.4: copy-on-write fan-out ------------------------------------------------------------

def fanout_tokens(n: int, prompt: int, output: int) -> tuple[int, int]:
    """§10.4: KV tokens for n completions of `output` tokens off one `prompt`, unshared and shared."""
    _positive("n", n)
    _nonnegative("prompt", prompt)
    _nonnegative("output", output)
    return n * (prompt + output), prompt + n * output


def fanout_blocks(n: int, prompt: int, output: int, block_size: int) -> tuple[int, int]:
    """§10.4 at block granularity: a partial last prompt block is copied once per branch on divergence.

    Shared: the full prompt blocks once, and each branch owns its tail block copy (if the prompt
    ends mid-block) plus the blocks its output needs.
    """
    unshared = n * blocks_for(prompt + output, block_size)
    full_prompt_blocks = prompt // block_size
    per_branch = blocks_for(prompt + output, block_size) - full_prompt_blocks
    return unshared, full_prompt_blocks + n * per_branch


def sharing_factor(n: int, prompt: int, output: int) -> float:
    """§10.4: unshared over shared tokens (5.7x for n = 8 off 4K with 256-token outputs)."""
    if prompt + output == 0:
        raise ValueError("a fan-out of 0 prompt and 0 output tokens holds nothing to share")
    unshared, shared = fanout_tokens(n, prompt, output)
    return unshared / shared


# --- §10.5: preemption by swap or recompute ---------------------------------------------------

def swap_round_trip_s(kv_bytes: float, link_bandwidth: float, transfers: int = 0,
                      transfer_overhead_s: float = 0.0) -> float:
    """§10.5: out to host and back in, 2 * (KV / W + transfers * overhead) (67 ms for 2.147 GB at 64 GB/s).

    `transfers` is the number of separate copies one way takes and `transfer_overhead_s` the fixed
    cost of each (0 by default, as in the lecture).  An engine that copies each block of each layer's
    K and V on its own makes 2 * L * blocks of them: the vLLM paper's §7.3 finds swapping slow at
    small block sizes for exactly this reason.
    """
    _nonnegative("kv_bytes", kv_bytes)
    _positive("link_bandwidth", link_bandwidth)
    _nonnegative("transfers", transfers)
    _nonnegative("transfer_overhead_s", transfer_overhead_s)
    return 2 * (kv_bytes / link_bandwidth + transfers * transfer_overhead_s)


def swap_transfers(model: ModelSpec, seq_tokens: int, block_size: int) -> int:
    """Separate copies one way of a paged sequence when every block of every layer's K and V moves alone."""
    return 2 * model.num_layers * blocks_for(seq_tokens, block_size)


def prefill_flops(model: ModelSpec, seq_tokens: int) -> float:
    """§10.5 / Lecture 2: 2 * N * S for the weights plus 4 * L * n_heads * d_head * S^2 for attention."""
    _nonnegative("seq_tokens", seq_tokens)
    s = seq_tokens
    return 2 * model.num_params * s + 4 * model.num_layers * model.num_heads * model.head_dim * s * s


def recompute_s(model: ModelSpec, seq_tokens: int, peak_flops: float, mfu: float = LECTURE_MFU) -> float:
    """§10.5: the prefill redone at `mfu` of peak (129 ms for 4K on an H100 at 50%)."""
    _positive("peak_flops", peak_flops)
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    return prefill_flops(model, seq_tokens) / (peak_flops * mfu)


def breakeven_link_bandwidth(
    model: ModelSpec, seq_tokens: int, peak_flops: float, mfu: float = LECTURE_MFU
) -> float:
    """§10.5, Exercise 4: W* = 2 * KV * F / prefill FLOPs; swap wins on any faster link."""
    _positive("seq_tokens", seq_tokens)
    kv = seq_tokens * model.kv_bytes_per_token
    return 2 * kv * peak_flops * mfu / prefill_flops(model, seq_tokens)


def crossover_tokens(model: ModelSpec, link_bandwidth: float, peak_flops: float, mfu: float = LECTURE_MFU,
                     block_size: int | None = None, transfer_overhead_s: float = 0.0) -> float:
    """Exercise 4: the length S where swap and recompute cost the same on a given link.

    2 * S * kv / W = (2 N S + 4 L H d S^2) / F  =>  S = (2 kv F / W - 2 N) / (4 L H d).
    Below S recompute is cheaper, above it swap.  Returns 0.0 when swap wins at every length.
    With a per-transfer overhead t0 and 2 L transfers per block of b tokens, the swap costs another
    4 L t0 / b per token both ways (whole blocks rounded away), which moves S up.
    """
    _positive("link_bandwidth", link_bandwidth)
    _nonnegative("transfer_overhead_s", transfer_overhead_s)
    rate = peak_flops * mfu
    attn = 4 * model.num_layers * model.num_heads * model.head_dim
    swap_per_token = 2 * model.kv_bytes_per_token / link_bandwidth
    if transfer_overhead_s:
        if block_size is None:
            raise ValueError("a per-transfer overhead needs the block size: transfers are counted per block")
        _positive("block_size", block_size)
        swap_per_token += 4 * model.num_layers * transfer_overhead_s / block_size
    s = (swap_per_token * rate - 2 * model.num_params) / attn
    return max(0.0, s)


def preempt_choice(model: ModelSpec, seq_tokens: int, link_bandwidth: float, peak_flops: float,
                   mfu: float = LECTURE_MFU, block_size: int | None = None, transfer_overhead_s: float = 0.0) -> str:
    """§10.5: 'swap' when the round trip is cheaper than the recompute, else 'recompute'."""
    transfers = swap_transfers(model, seq_tokens, block_size) if transfer_overhead_s else 0
    swap = swap_round_trip_s(seq_tokens * model.kv_bytes_per_token, link_bandwidth, transfers, transfer_overhead_s)
    return "swap" if swap < recompute_s(model, seq_tokens, peak_flops, mfu) else "recompute"


def group_swap_bytes(n: int, prompt: int, generated: int, block_size: int, kv_per_token: int,
                     together: bool = True) -> int:
    """The vLLM paper's §4.5: bytes one way to swap a group of n branches off a shared prompt.

    Together (the paper's all-or-nothing eviction of a sequence group) the shared prompt blocks move
    once and stay shared when they come back; one branch at a time, each branch's table names the
    prompt again, so the prompt moves n times and comes back as n private copies.
    """
    unshared, shared = fanout_blocks(n, prompt, generated, block_size)
    return (shared if together else unshared) * block_size * kv_per_token


def group_recompute_flops(model: ModelSpec, n: int, prompt: int, generated: int, together: bool = True) -> float:
    """§4.5's other way back for a group: redo the prefill.  Together the prompt is prefilled once and
    each branch redoes only its own `generated` tokens on top of it (what a prompt of prompt + generated
    costs beyond the prompt's own prefill); one at a time, every branch redoes the whole prefill."""
    _positive("n", n)
    whole = prefill_flops(model, prompt + generated)
    if not together:
        return n * whole
    return prefill_flops(model, prompt) + n * (whole - prefill_flops(model, prompt))


def group_breakeven_link_bandwidth(model: ModelSpec, n: int, prompt: int, generated: int, block_size: int,
                                   peak_flops: float, mfu: float = LECTURE_MFU, together: bool = True) -> float:
    """The link at which swapping a fan-out group and recomputing it cost the same (§10.5 for a group)."""
    swap = group_swap_bytes(n, prompt, generated, block_size, model.kv_bytes_per_token, together)
    return 2 * swap * peak_flops * mfu / group_recompute_flops(model, n, prompt, generated, together)


# --- §10.6: decode cadence, throughput, SLOs --------------------------------------------------

def decode_step_bytes(model: ModelSpec, batch: int, seq_tokens: int) -> float:
    """§10.6 / Lecture 2 §2.15: one step reads every weight once plus each sequence's KV."""
    _nonnegative("batch", batch)
    _nonnegative("seq_tokens", seq_tokens)
    return model.weight_bytes + batch * seq_tokens * model.kv_bytes_per_token


def tpot_s(model: ModelSpec, batch: int, seq_tokens: int, hbm_bandwidth: float) -> float:
    """§10.6: time per output token of a memory-bound decode step."""
    _positive("hbm_bandwidth", hbm_bandwidth)
    return decode_step_bytes(model, batch, seq_tokens) / hbm_bandwidth


def throughput_tok_s(batch: int, tpot: float) -> float:
    """§10.6: tokens per second of a steady batch, one token per sequence per step."""
    _positive("tpot", tpot)
    return batch / tpot


def max_batch_for_tpot(model: ModelSpec, seq_tokens: int, tpot_slo_s: float, hbm_bandwidth: float) -> int:
    """§10.6: the largest B whose TPOT clears the SLO: floor((SLO * BW - weights) / KV per sequence)."""
    _positive("tpot_slo_s", tpot_slo_s)
    _positive("seq_tokens", seq_tokens)
    spare = tpot_slo_s * hbm_bandwidth - model.weight_bytes
    return max(0, int(spare // (seq_tokens * model.kv_bytes_per_token)))


def goodput_tok_s(batch: int, tpot: float, tpot_slo_s: float) -> float:
    """§10.6: throughput counted only when the SLO is met (a steady batch meets it or not as one)."""
    return throughput_tok_s(batch, tpot) if tpot <= tpot_slo_s else 0.0


def ttft_s(queueing_s: float, prefill_s: float, scheduling_delay_s: float) -> float:
    """§10.6: TTFT = queueing + prefill + scheduling delay (waiting for the next iteration boundary)."""
    for name, v in (("queueing_s", queueing_s), ("prefill_s", prefill_s), ("scheduling_delay_s", scheduling_delay_s)):
        _nonnegative(name, v)
    return queueing_s + prefill_s + scheduling_delay_s


def ridge_batch(model: ModelSpec, gpu: GPUSpec) -> float:
    """Lecture 2 / §10.1: the decode batch at which weight-streaming arithmetic meets the roofline.

    A decode step does 2 N FLOP per sequence and reads N * b weight bytes, so its intensity is
    2 B / b FLOP/byte; it reaches peak / bandwidth at B = (peak / bandwidth) * b / 2 (295 on an H100).
    """
    return gpu.peak_flops / gpu.hbm_bandwidth * model.dtype_bytes / 2


def decode_intensity(model: ModelSpec, batch: float, seq_tokens: int) -> float:
    """FLOP per HBM byte of a decode step that also reads the KV: B sequences of S tokens.

    FLOPs: 2 N per sequence for the weights plus 4 L H d S for attention (QK^T and PV against the S
    cached keys, every query head).  Bytes: the weights once plus every sequence's KV.  Lecture 2's
    weights-only intensity 2B / b is the S = 0 case.
    """
    _positive("batch", batch)
    _nonnegative("seq_tokens", seq_tokens)
    attn = 4 * model.num_layers * model.num_heads * model.head_dim
    flops = batch * (2 * model.num_params + attn * seq_tokens)
    return flops / (model.weight_bytes + batch * seq_tokens * model.kv_bytes_per_token)


def decode_intensity_limit(model: ModelSpec, seq_tokens: int) -> float:
    """What `decode_intensity` tends to as B grows: (2N + 4 L H d S) / (S x KV per token).

    Past this no batch helps: each extra sequence brings as many bytes as FLOPs.  41.2 FLOP/byte for
    640-token MHA sequences of the lecture's 7B, 164.7 under GQA-8 — both under the H100's 295.
    """
    _positive("seq_tokens", seq_tokens)
    attn = 4 * model.num_layers * model.num_heads * model.head_dim
    return (2 * model.num_params + attn * seq_tokens) / (seq_tokens * model.kv_bytes_per_token)


def ridge_batch_with_kv(model: ModelSpec, gpu: GPUSpec, seq_tokens: int) -> float:
    """The batch at which a decode step with KV reads reaches the ridge; math.inf when none does.

    B (2N + 4 L H d S) / (W + B S kv) = P / bw  =>  B = (P / bw) W / (2N + 4 L H d S - (P / bw) S kv).
    """
    _nonnegative("seq_tokens", seq_tokens)
    ridge = gpu.peak_flops / gpu.hbm_bandwidth
    attn = 4 * model.num_layers * model.num_heads * model.head_dim
    denominator = 2 * model.num_params + attn * seq_tokens - ridge * seq_tokens * model.kv_bytes_per_token
    return ridge * model.weight_bytes / denominator if denominator > 0 else math.inf


def ridge_reachable_tokens(model: ModelSpec, gpu: GPUSpec) -> float:
    """The longest sequence for which some decode batch still reaches the ridge (87 tokens for the
    lecture's MHA 7B on an H100, 353 under GQA-8); math.inf if attention alone is above the ridge."""
    ridge = gpu.peak_flops / gpu.hbm_bandwidth
    attn = 4 * model.num_layers * model.num_heads * model.head_dim
    denominator = ridge * model.kv_bytes_per_token - attn
    return 2 * model.num_params / denominator if denominator > 0 else math.inf


def lognormal_params(median: float = 800, tail_length: float = 20_000, tail_fraction: float = 0.05) -> tuple[float, float]:
    """Exercise 3: (mu, sigma) of a lognormal with the given median and P(X > tail_length) = tail_fraction."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - tail_fraction)
    return math.log(median), math.log(tail_length / median) / z


def lognormal_mean_tokens(mu: float, sigma: float, cap: float | None = None) -> float:
    """Exercise 3: the mean length of a lognormal, exp(mu + sigma^2 / 2) (median x exp(sigma^2 / 2)).

    With `cap`, the mean of the lengths at or under it, E[L | L <= cap]: a workload that drops every
    sequence longer than the cap.  exp(mu + sigma^2 / 2) Phi((ln cap - mu - sigma^2) / sigma) over
    Phi((ln cap - mu) / sigma).
    """
    _positive("sigma", sigma)
    mean = math.exp(mu + sigma * sigma / 2)
    if cap is None:
        return mean
    _positive("cap", cap)
    phi = NormalDist().cdf
    return mean * phi((math.log(cap) - mu - sigma * sigma) / sigma) / phi((math.log(cap) - mu) / sigma)


def batch_that_fits(budget: float, mean_tokens: float, kv_per_token: int) -> float:
    """How many sequences of a workload the KV budget holds on average: budget over the mean sequence's bytes.

    For a workload with spread-out lengths this, not another workload's count, is the batch at which
    its tail waste is a share of the budget (Exercise 3's lognormal: 21.97, not 199).
    """
    _positive("budget", budget)
    _positive("mean_tokens", mean_tokens)
    _positive("kv_per_token", kv_per_token)
    return budget / (mean_tokens * kv_per_token)


# --- Printed figures: the conventions that reproduce them, and the errata no convention does -------
#
# Before a printed figure is called wrong, it is recomputed under every reading a careful author
# might have used: end of life or averaged over a sequence's life, share of the budget or of what
# is reserved, whether a forked parent writes in place, the printed (rounded) intermediates.  A
# figure one of them reproduces is a `Convention`: both readings are shown, neither is wrong.  A
# figure none of them reproduces is an `Erratum`, and the row lists every reading tried.  Misreading
# a unit the lecture states (512 KiB taken as 512,000 B) is tried too, but marked `slip=True`: it
# explains a figure, it does not make it right.

@dataclass(frozen=True)
class Reading:
    """One way of computing a printed figure, and what it gives (in the printed figure's unit)."""

    how: str
    value: float
    slip: bool = False  # misreads a unit or formula the lecture itself states


def rounds_to(value: float, printed: float, decimals: int) -> bool:
    """True when `value` shown with `decimals` decimals (negative: tens, hundreds) is `printed`."""
    return math.isfinite(value) and abs(value - printed) <= 0.5 * 10.0 ** -decimals + 1e-12 * abs(printed)


def cuts_to(value: float, printed: float, decimals: int) -> bool:
    """True when `value` cut (not rounded) to `decimals` decimals is `printed`: 1.953 is written 1.9."""
    if not math.isfinite(value):
        return False
    scale = 10.0 ** decimals
    return math.floor(value * scale + 1e-9) == round(printed * scale)


@dataclass(frozen=True)
class Convention:
    """A printed figure our default reading does not give, reproduced by a stated convention.

    `convention` and `value` are the reading that reproduces it, the lecture's own derivation first
    where it states one; `also` lists further readings that reproduce it (ours among them).
    """

    quantity: str
    section: str
    printed: str
    convention: str  # the reading that reproduces it
    default: str  # what the ledger's default reading (end of life, exact bytes) gives instead
    why: str
    value: float  # the convention's value, in the printed unit
    printed_value: float
    decimals: int
    cut: bool = False  # the printed figure is the value cut, not rounded, to `decimals` (1.953% written 1.9%)
    also: tuple[Reading, ...] = ()

    def shows(self, value: float) -> bool:
        """Whether `value`, written as the lecture writes this figure, is the printed figure."""
        if self.cut:
            return cuts_to(value, self.printed_value, self.decimals)
        return rounds_to(value, self.printed_value, self.decimals)

    @property
    def also_text(self) -> str:
        return "; ".join(f"{r.how}: {r.value:,.{max(0, self.decimals) + 1}f}" for r in self.also)


@dataclass(frozen=True)
class Erratum:
    """A printed figure that no convention we tried reproduces; `tried` lists them all."""

    quantity: str
    section: str
    printed: str
    exact: str
    why: str
    exact_value: float = field(default=math.nan, compare=False)
    printed_value: float = field(default=math.nan, compare=False)
    decimals: int | None = None  # the printed figure's precision; None for a statement, not a number
    tried: tuple[Reading, ...] = ()

    def reproduced_by(self) -> list[Reading]:
        """The readings that give the printed figure (only unit slips, for a real erratum)."""
        if self.decimals is None:
            return []
        return [r for r in self.tried if rounds_to(r.value, self.printed_value, self.decimals)]

    @property
    def tried_text(self) -> str:
        def show(r: Reading) -> str:
            return f"{r.how}: {r.value:,.{max(0, self.decimals or 0)}f}" + (" (a slip)" if r.slip else "")
        return "; ".join(show(r) for r in self.tried)


def _lecture_numbers() -> dict:
    """The quantities the errata and conventions compare, in exact and in the lecture's readings."""
    from labsupport.specs import LECTURE_7B_GQA8

    m, g = LECTURE_7B, LECTURE_GPU
    kv, kb = m.kv_bytes_per_token, 512_000  # 512 KiB as stated, and as the 0.328 GB figure reads it
    budget = kv_budget_bytes(m, g)
    flops = g.peak_flops * LECTURE_MFU
    return {"m": m, "g": g, "kv": kv, "kb": kb, "budget": budget, "flops": flops, "gqa": LECTURE_7B_GQA8,
            "rec4k": recompute_s(m, 4096, g.peak_flops), "seq": 640}


def _conventions() -> list[Convention]:
    n = _lecture_numbers()
    kv, budget = n["kv"], n["budget"]
    life = naive_utilization_time_avg(budget, 4096, 512, 128, kv)
    paged_life = paged_utilization_time_avg(budget, 512, 128, 16, kv)
    lengths = life_lengths(512, 128)
    fill = sum(lengths) / sum(blocks_for(x, 16) * 16 for x in lengths)
    tail_share = 100 * 199 * (16 / 2) * kv / budget  # the lecture's 1.3%: b/2 tokens per sequence, B = 199
    gqa = n["gqa"]
    gqa_blocks = num_blocks(kv_budget_bytes(gqa, n["g"]), 16, gqa.kv_bytes_per_token)
    gqa_naive = naive_concurrency(kv_budget_bytes(gqa, n["g"]), 131_072, gqa.kv_bytes_per_token)
    half_mb = 0.5e6  # Exercise 3's per-token figure: 512 KiB written as 0.5 MB, then used as 0.5e6 B
    return [
        Convention("Naive utilization over a sequence's life", "timing plan, §10.2 title", "14% (86% empty)",
                   "a second, consistent reading, which the lecture does not state: utilization averaged over each "
                   "sequence's life, as it holds 512 … 639 tokens, one step each; 29 slots, share of the 62.52 GB "
                   "budget", f"end of life (640 tokens held): {100 * naive_utilization(budget, 4096, 640, kv):.2f}%",
                   f"29 x 575.5 x 524,288 B / 62.52 GB = {100 * life:.2f}%, so {100 - 100 * life:.0f}% is empty. The "
                   "lecture prints 14% and 86% without a derivation; this reading reproduces both, and is listed as a "
                   "consistent reading, not as what the lecture meant. The lecture's stated derivations are at the end "
                   "of life: 15.2% used (9.5 of 62.5 GB) and 84% internal fragmentation (§10.2). The same reading gives "
                   f"the paged pool {100 * paged_life:.2f}% over the life ({100 * life:.2f}% -> {100 * paged_life:.2f}%).",
                   100 * life, 14, 0),
        Convention("Naive utilization, S_max = 32K", "§10.2", "1.9%",
                   "per slot, the lecture's own reasoning ('the slot grew 8x and the occupancy did not'): one slot's "
                   f"occupancy 640 / 32,768 = {100 * slot_occupancy(32_768, 640):.3f}%, written 1.9% (cut, not "
                   "rounded, to one decimal; the printed end-of-life 4K figure over 8, 15.2% / 8 = 1.90%, gives the same digit)",
                   f"{100 * naive_utilization(budget, 32_768, 640, kv):.2f}% of the budget, which holds 3 whole slots "
                   "of 17.18 GB: 3 x 640 x 524,288 B / 62.52 GB",
                   "Growing the slot 8x divides one slot's occupancy by 8 (15.63% / 8 = 1.95%). The share of the "
                   "budget falls further, to 1.61%: 62.52 GB holds 3 whole 32K slots, not 29 / 8 = 3.6, and the "
                   "remainder holds no slot.", 100 * slot_occupancy(32_768, 640), 1.9, 1, cut=True,
                   also=(Reading("the printed end-of-life 15.2% over 8", 15.2 / 8),)),
        Convention("Paged utilization, b = 16", "§10.3 board, takeaways", "98.7% (15.2% -> 98.7%)",
                   "the lecture's own derivation: 100% minus its stated internal fragmentation, a mean 8-token tail "
                   f"(b/2) in each of 199 sequences: 199 x 8 x 512 KiB = {199 * 8 * kv / GB:.3f} GB = "
                   f"{tail_share:.2f}% of 62.52 GB (§10.3's table: 1.3%), and 100 - 1.3 = 98.7%",
                   f"end of life: {100 * paged_utilization(budget, 640, 16, kv):.2f}% (640 tokens fill 40 blocks "
                   "exactly, so no 640-token sequence has a tail)",
                   "The lecture derives 98.7% from its 1.3% (§10.3's table, the takeaways: 'mean 8 -> 1.3% of budget'). "
                   "Our measurement gives the same figure by another reading: the pool averaged over each sequence's "
                   f"life, whose whole blocks cover 99.99% of the budget and are {100 * fill:.2f}% filled, "
                   f"{100 * paged_life:.2f}%. That time average is ours, not the lecture's stated method. Either way "
                   "the board's 15.2% -> 98.7% pairs two of the lecture's own derivations: the end-of-life share, then "
                   "100% minus the paged tail.", 100 - tail_share, 98.7, 1,
                   also=(Reading("the lecture's, with 4.0 MB = 4e6 B over 62.5 GB", 100 - 100 * 199 * 4e6 / 62.5e9),
                         Reading("ours: averaged over each sequence's life, pool kept full", 100 * paged_life))),
        Convention("Swap/recompute break-even, 4K MHA", "§10.5", "33.3 GB/s",
                   "2 x 2.147 GB over the printed, rounded 129 ms",
                   f"{breakeven_link_bandwidth(n['m'], 4096, n['g'].peak_flops) / GB:.2f} GB/s over the exact "
                   f"{1e3 * n['rec4k']:.1f} ms", "The exact recompute is 64.0 TFLOP / 494.5 TFLOP/s = 129.4 ms; dividing "
                   "by the rounded 129 ms gives 33.3.", 2 * 4096 * kv / 0.129 / GB, 33.3, 1),
        Convention("Tail waste at B = 199, b = 64 (Exercise 3)", "Exercise 3", "5.1%",
                   "the b/2 tail at 0.5 MB per token, over the 62.5 GB budget: 199 x 16.0 MB / 62.5 GB",
                   f"{100 * 199 * mean_tail_waste_tokens(64) * kv / budget:.2f}% with the (b-1)/2 mean tail and exact bytes",
                   "Exercise 3 divides the waste by the budget alone; §10.3's table divides by the budget plus the "
                   "waste (see the errata).", 100 * 199 * 32 * half_mb / 62.5e9, 5.1, 1),
        Convention("Tail waste at B = 199, b = 256 (Exercise 3)", "Exercise 3", "20.4%",
                   "the b/2 tail at 0.5 MB per token, over the 62.5 GB budget: 199 x 64.0 MB / 62.5 GB",
                   f"{100 * 199 * mean_tail_waste_tokens(256) * kv / budget:.2f}% with the (b-1)/2 mean tail and exact bytes",
                   "The same reading as the b = 64 row. The batch is the erratum: 199 is the chat workload's, and "
                   "this lognormal fits 21 (see the errata), where b = 256 wastes 2.3%.",
                   100 * 199 * 128 * half_mb / 62.5e9, 20.4, 1),
        Convention("Mean tail waste, b = 16", "§10.3, takeaways", "mean 8 tokens",
                   "b/2 (the lecture: 'on average about b_blk/2')",
                   f"{mean_tail_waste_tokens(16):g} tokens = (b-1)/2, the mean when lengths are uniform modulo b",
                   "Both are stated; the ledger's block-size table uses (b-1)/2.", 16 / 2, 8, 0),
        Convention("Block-table overhead, 4K at b = 16", "§10.3", "256 entries ≈ 2 KB",
                   "8-byte entries (a 64-bit pointer per block, like an OS page-table entry; torch's default int64)",
                   f"{block_table_bytes(4096, 16, 4):,} B with the int32 block ids vLLM and our cache store",
                   "The lecture does not state the entry width; both are real designs.",
                   block_table_bytes(4096, 16, 8) / 1024, 2, 0),
        Convention("Fork cost at b = 256, fan-out of 8", "Exercise 3", "8 x 64 MB = 512 MB",
                   "bytes copied: 8 branches forked off a prompt that stays alive each copy the filled part of "
                   "the shared block, on average 128 tokens x 512 KiB = 64 MiB (written MB)",
                   f"blocks allocated: 8 x {256 * kv / 1e6:.1f} MB = {8 * 256 * kv / GB:.2f} GB (a copy takes a "
                   f"whole block); 7 x = {7 * 256 * kv / GB:.2f} GB when the parent writes in place",
                   "How many branches copy is a convention too: with the prompt's sequence kept alive, all 8 copy "
                   "(9 holders); when the parent is branch 1 and writes in place (the vLLM paper's §4.4), 7 copy "
                   "and the refcount goes 8 -> 7 + 1, as §10.4's board shows.", 8 * 128 * kv / 2**20, 512, 0),
        Convention("Exercise 1 paged GQA-8 concurrency", "Exercise 1", "≈ 744 (248x)",
                   f"the cost factor is the exact {gqa_blocks // 40} / {gqa_naive} = {gqa_blocks // 40 / gqa_naive:.2f}, "
                   "written 248x; '≈ 744' is the sketch's 62.5 GB / (0.082 + 0.002) GB = 744.0, within its '≈' of "
                   f"the exact {gqa_blocks // 40}",
                   f"{gqa_blocks // 40} sequences: {gqa_blocks:,} blocks of 2 MiB // 40 blocks per 640-token sequence",
                   f"Not an erratum: {gqa_blocks // 40} is inside '≈ 744' (0.13% apart) and the 248x it supports is "
                   "reproduced. The sketch's 744 reads 128 KiB as 128,000 B (0.082 GB) and adds a block of tail to a "
                   "length that fills its 40 blocks exactly; the two slips nearly cancel.",
                   gqa_blocks // 40 / gqa_naive, 248, 0,
                   also=(Reading("62.5 GB / (0.082 + 0.002) GB, over 3 slots", 62.5 / 0.084 / 3),)),
    ]


def _errata() -> list[Erratum]:
    n = _lecture_numbers()
    m, g, kv, kb, budget = n["m"], n["g"], n["kv"], n["kb"], n["budget"]
    gqa = n["gqa"]
    bw, slo = g.hbm_bandwidth, 0.020
    b62 = 62.5e9  # the printed budget
    naive = naive_concurrency(budget, 4096, kv)
    paged = paged_concurrency(budget, 640, 16, kv)
    tpot = lambda batch, per_token, weights=m.weight_bytes: 1e3 * (weights + batch * 640 * per_token) / bw
    slo_b = lambda per_token, weights=m.weight_bytes: (slo * bw - weights) // (640 * per_token)
    attn = 4 * m.num_layers * m.num_heads * m.head_dim

    def crossover(swap_bytes_per_token: float, attn_flops: float, round_trip: bool = True) -> float:
        per_token_swap = (2 if round_trip else 1) * swap_bytes_per_token / (32 * GB)
        return max(0.0, (per_token_swap - 2 * m.num_params / n["flops"]) / (attn_flops / n["flops"]))

    gqa_kv = gqa.kv_bytes_per_token
    gqa_blocks = num_blocks(kv_budget_bytes(gqa, g), 16, gqa_kv)
    mix = ((512, 0.70), (4096, 0.25), (32_768, 0.05))
    mean_slot = lambda per_token: sum(s * per_token * p for s, p in mix) / GB
    naive_tput = throughput_tok_s(naive, tpot(naive, kv) / 1e3)
    mu3, sigma = lognormal_params()
    mean3, mean3_32k = lognormal_mean_tokens(mu3, sigma), lognormal_mean_tokens(mu3, sigma, cap=32_768)
    under_32k = NormalDist(mu3, sigma).cdf(math.log(32_768))
    fits, fits_32k = batch_that_fits(budget, mean3, kv), batch_that_fits(budget, mean3_32k, kv)
    batch, batch_32k = math.floor(fits), math.floor(fits_32k)  # whole sequences of the mean length
    tail_256 = 100 * batch * 128 * kv / budget  # the exercise's b/2 tail, exact bytes
    tail_256_32k = 100 * batch_32k * 128 * kv / budget
    tail_16 = 100 * batch * 8 * kv / budget
    fan = fanout_tokens(8, 4096, 256)[0]
    return [
        Erratum("KV per 640-token sequence", "§10.6", "0.328 GB", f"{640 * kv / GB:.4f} GB",
                "640 x 512 KiB = 335,544,320 B. 0.328 GB is 640 x 512,000 B: 512 KiB read as 512 kB, a 2.4% "
                "understatement. It explains 9.5 GB and 15.2% (§10.2), 78.8 GB, 23.5 ms and 8,470 tok/s at B = 199 "
                "(§10.6), Exercise 1's 0.082 GB and Exercise 5's 0.985 GB. It does not explain 199 (62.5 GB / "
                "0.328 GB is 190) or 164 (it gives 163).", 640 * kv / GB, 0.328, 3,
                (Reading("512 KiB = 524,288 B, as the lecture states (GB)", 640 * kv / GB),
                 Reading("the same in GiB", 640 * kv / 2**30),
                 Reading("512 KiB read as 512,000 B", 640 * kb / GB, slip=True))),
        Erratum("Naive utilization, S_max = 4K", "§10.2", "15.2% (9.5 of 62.5 GB)",
                f"{100 * naive_utilization(budget, 4096, 640, kv):.2f}% ({naive * 640 * kv / GB:.2f} of "
                f"{budget / GB:.2f} GB) at the end of life",
                "29 x 640 x 524,288 B = 9.73 GB of 62.52 GB. 15.2% follows from the 0.328 GB slip (29 x 0.328 = "
                "9.5 GB). The timing plan's 14% is not this figure rounded: a second, consistent reading gives it, the "
                "same utilization averaged over each sequence's life (14.00%; see the conventions).",
                100 * naive_utilization(budget, 4096, 640, kv), 15.2, 1,
                (Reading("end of life, share of the budget", 100 * naive_utilization(budget, 4096, 640, kv)),
                 Reading("end of life, share of the reserved slots", 100 * 640 / 4096),
                 Reading("over the life, share of the budget", 100 * naive_utilization_time_avg(budget, 4096, 512, 128, kv)),
                 Reading("end of life, 512 KiB read as 512,000 B, 62.5 GB", 100 * naive * 640 * kb / b62, slip=True))),
        Erratum("Paged concurrency, b = 16", "§10.3", "199 (6.9x over 29)", f"{paged} ({paged / naive:.2f}x)",
                f"{num_blocks(budget, 16, kv):,} blocks of 8 MiB; a 640-token sequence holds 40 of them: "
                f"{num_blocks(budget, 16, kv):,} // 40 = {paged}. §10.2's '200' is 62.5 GiB / (640 x 512 KiB) = 200 "
                "exactly, the budget read in GiB (which would give 31 naive slots, not 29), and its '68% of the way to the "
                "ridge point' is 200 / 295. 199 is reached by no reading we tried; the closing's 'two thirds of the "
                "gap' is (199 - 29) / (295 - 29) = 64% with it, 59% with 186. We use 199 only where the lecture "
                "does, labelled.", paged, 199, 0,
                (Reading("exact bytes, whole blocks", paged),
                 Reading("exact bytes, plus the mean 8-token tail", budget // (648 * kv)),
                 Reading("98.7% (100% - 1.3%) of the budget in 640-token sequences", 0.987 * budget // (640 * kv)),
                 Reading("512 KiB read as 512,000 B", num_blocks(budget, 16, kb) // 40, slip=True),
                 Reading("the 62.5 GB budget read as 62.5 GiB", 62.5 * 2**30 // (640 * kv), slip=True))),
        Erratum("TPOT at B = 199", "§10.6", "23.5 ms (78.8 GB/step)",
                f"{tpot(199, kv):.2f} ms ({decode_step_bytes(m, 199, 640) / GB:.2f} GB/step)",
                f"At the printed B = 199 with exact bytes a step moves 13.48 + 199 x 0.3355 = "
                f"{decode_step_bytes(m, 199, 640) / GB:.2f} GB. 23.5 ms follows from the 0.328 GB slip. At the exact "
                f"paged B = {paged} the step is {tpot(paged, kv):.2f} ms (the lecture's 'ambient' 22.6 ms is the slip's "
                f"B = 190: {tpot(190, kb):.2f} ms).", tpot(199, kv), 23.5, 1,
                (Reading("exact bytes at the printed B = 199", tpot(199, kv)),
                 Reading(f"exact bytes at the exact B = {paged}", tpot(paged, kv)),
                 Reading("0.328 GB per sequence, 13.5 GB of weights, B = 199", tpot(199, kb, 13.5e9), slip=True))),
        Erratum("Largest B meeting a 20 ms TPOT SLO", "§10.6", "164", f"{max_batch_for_tpot(m, 640, slo, bw)}",
                "(0.020 x 3,350 - 13.48) / 0.3355 = 159.5 -> 159. With the lecture's own 13.5 GB and 0.328 GB it is "
                "(67 - 13.5) / 0.328 = 163.1 -> 163: 164 rounds up, and a batch of 164 misses the 20 ms SLO.",
                max_batch_for_tpot(m, 640, slo, bw), 164, 0,
                (Reading("exact bytes", slo_b(kv)),
                 Reading("0.328 GB per sequence", slo_b(kb), slip=True),
                 Reading("0.328 GB per sequence and 13.5 GB of weights", slo_b(kb, 13.5e9), slip=True))),
        Erratum("Crossover length, MHA on 32 GB/s", "Exercise 4", "about 2,600 tokens",
                f"{crossover(kv, attn):,.0f} tokens",
                "Solving 2 S x 524,288 / 32e9 = (13.48e9 S + 524,288 S^2) / 494.5e12 gives S = 5,195, with the "
                "exercise's own formula (its attention term 0.524 S^2 GFLOP is 4 L H d S^2). 2,600 is the root with "
                "the attention term doubled; no unit reading reaches it.", crossover(kv, attn), 2600, -2,
                (Reading("the exercise's formula, exact bytes, a round trip", crossover(kv, attn)),
                 Reading("512 KiB read as 512,000 B", crossover(kb, attn), slip=True),
                 Reading("causal attention, 2 L H d S^2", crossover(kv, attn / 2)),
                 Reading("a one-way swap (swap then wins at every length)", crossover(kv, attn, round_trip=False)),
                 Reading("the attention term doubled, 8 L H d S^2", crossover(kv, 2 * attn), slip=True))),
        Erratum("Tail waste at B = 199, b = 256", "§10.3 table", "17.0%", f"{100 * 199 * 64e6 / (b62 + 199 * 64e6):.2f}% "
                "by the table's own reading",
                "The table's MB column is exact MiB labelled MB (8 x 512 KiB = 4 MiB; 32 tokens 16 MiB; 128 tokens "
                "64 MiB). Its waste column takes them as decimal MB and divides by the budget plus the waste: 199 x "
                "4, 16 and 64 MB over (62.5 GB + waste) is 1.26%, 4.85% and 16.93%, so the printed 1.3% and 4.8% "
                "follow and the last should read 16.9%. (Exercise 3 divides by the budget alone: 1.3%, 5.1%, 20.4%, "
                "reproduced.)", 100 * 199 * 64e6 / (b62 + 199 * 64e6), 17.0, 1,
                (Reading("waste / (budget + waste), 64 MB = 64e6 B", 100 * 199 * 64e6 / (b62 + 199 * 64e6)),
                 Reading("waste / (budget + waste), 64 MiB", 100 * 199 * 64 * 2**20 / (b62 + 199 * 64 * 2**20)),
                 Reading("waste / (budget + waste), (b-1)/2 tail, exact bytes",
                         100 * 199 * 127.5 * kv / (budget + 199 * 127.5 * kv)),
                 Reading("waste / budget, 64e6 B (Exercise 3's reading)", 100 * 199 * 64e6 / b62),
                 Reading("waste / budget, (b-1)/2 tail, exact bytes", 100 * 199 * 127.5 * kv / budget))),
        Erratum("Exercise 3 at b = 8", "Exercise 3", "2 tokens -> 1.0 MB -> 0.20 GB -> 0.3%",
                f"4 tokens -> 2.0 MB -> {199 * 4 * 0.5e6 / 1e9:.2f} GB -> {100 * 199 * 4 * 0.5e6 / b62:.2f}%",
                "The exercise's own rule, a mean tail of b/2, gives 4 tokens at b = 8, not 2: 4 x 0.5 MB = 2.0 MB "
                "per sequence, 0.40 GB at B = 199, 0.64% of 62.5 GB (0.67% with exact bytes; 0.58% with the "
                "uniform-length mean (b-1)/2 = 3.5 tokens).", 100 * 199 * 4 * 0.5e6 / b62, 0.3, 1,
                (Reading("b/2 = 4 tokens at 0.5 MB, over 62.5 GB", 100 * 199 * 4 * 0.5e6 / b62),
                 Reading("b/2 = 4 tokens, exact bytes, over 62.52 GB", 100 * 199 * 4 * kv / budget),
                 Reading("(b-1)/2 = 3.5 tokens, exact bytes", 100 * 199 * 3.5 * kv / budget),
                 Reading("b/4 = 2 tokens (half the exercise's own b/2)", 100 * 199 * 2 * 0.5e6 / b62, slip=True))),
        Erratum("Unshared fan-out, n = 8 off 4K", "§10.4 board", "17.9 GB against 3.2 GB",
                f"{fan * kv / GB:.2f} GB against {fanout_tokens(8, 4096, 256)[1] * kv / GB:.2f} GB",
                "34,816 tokens x 524,288 B = 18.25 GB (17.0 GiB); 17.9 matches no reading we tried.", fan * kv / GB, 17.9, 1,
                (Reading("exact bytes, GB", fan * kv / GB), Reading("exact bytes, GiB", fan * kv / 2**30),
                 Reading("512 KiB read as 512,000 B", fan * kb / GB, slip=True),
                 Reading("0.5 MB per token", fan * 0.5e6 / GB))),
        Erratum("Exercise 3's batch for the lognormal", "Exercise 3", "B = 199 (b = 256: 20.4% of the budget)",
                f"B = {batch} fits ({fits:.2f} mean-length sequences; {batch_32k} with lengths over 32K dropped): "
                f"b = 256 wastes {tail_256:.1f}% of the budget",
                f"199 is the chat workload's paged batch (640-token sequences). Exercise 3's lognormal (median 800, "
                f"sigma = ln(20,000 / 800) / z_0.95 = {sigma:.4f}) has mean 800 x exp(sigma^2 / 2) = {mean3:,.0f} "
                f"tokens = {mean3 * kv / GB:.3f} GB of KV, so the 62.52 GB budget holds {fits:.2f} such sequences "
                f"on average, {batch} whole; dropping the {100 * (1 - under_32k):.1f}% over 32,768 tokens leaves a "
                f"mean of {mean3_32k:,.0f} tokens and {fits_32k:.2f} sequences ({batch_32k}). At B = {batch} the b = 256 tail (b/2 = 128 "
                f"tokens x 512 KiB = 64 MiB each) is {tail_256:.2f}% of the budget, not 20.4% ({tail_256_32k:.1f}% "
                f"at B = {batch_32k}); b = 16 wastes {tail_16:.2f}%. The memory column then hardly separates the "
                "block sizes, so 'on memory alone, 8 or 16' is weaker than printed and the exercise's two "
                "measurements (kernel bandwidth, fork rate) decide even more.", batch, 199, 0,
                (Reading("whole mean-length sequences, every length", batch),
                 Reading("whole mean-length sequences, lengths over 32K dropped", batch_32k),
                 Reading("whole median-length (800-token) sequences", budget // (800 * kv)),
                 Reading("paged whole blocks at the median length", num_blocks(budget, 16, kv) // blocks_for(800, 16)),
                 Reading("the chat workload's 640-token batch (§10.3)", paged))),
        Erratum("Exercise 5 session KV and sessions per card", "Exercise 5", "0.985 GB, 63 sessions (2.2x)",
                f"{7700 * gqa_kv / GB:.3f} GB, {paged_concurrency(kv_budget_bytes(gqa, g), 7700, 16, gqa_kv)} sessions "
                f"({paged_concurrency(kv_budget_bytes(gqa, g), 7700, 16, gqa_kv) / 29:.2f}x)",
                f"7,700 x 131,072 B = 1.009 GB; {gqa_blocks:,} blocks // 482 = 61 sessions, 61 / 29 = 2.10x. 0.985 GB "
                "is 7,700 x 128,000 B = 0.9856 GB cut short (128 KiB read as 128,000 B); 62.5 / 0.985 = 63 and "
                "63 / 29 = 2.2x follow from it.", 7700 * gqa_kv / GB, 0.985, 3,
                (Reading("exact bytes, GB", 7700 * gqa_kv / GB), Reading("exact bytes, GiB", 7700 * gqa_kv / 2**30),
                 Reading("128 KiB read as 128,000 B", 7700 * 128_000 / GB, slip=True))),
        Erratum("Exercise 2 mean slot", "Exercise 2", "1.586 GB", f"{mean_slot(kv):.4f} GB",
                "0.7 x 0.268 + 0.25 x 2.147 + 0.05 x 17.2 = 1.584 GB (1.5838 GB exact). The mean concurrency is "
                "unaffected: 62.52 / 1.5838 = 39.5 -> 39.", mean_slot(kv), 1.586, 3,
                (Reading("exact bytes", mean_slot(kv)),
                 Reading("the printed slots 0.268, 2.147, 17.2 GB", 0.7 * 0.268 + 0.25 * 2.147 + 0.05 * 17.2),
                 Reading("512 KiB read as 512,000 B", mean_slot(kb), slip=True))),
        Erratum("Naive column's throughput", "§10.6", "'a third of the throughput'",
                f"{naive_tput:,.0f} vs 8,470 tok/s = {naive_tput / 8470:.2f}",
                f"B = 29 at (13.48 + 29 x 0.3355) GB / 3,350 GB/s = {tpot(naive, kv):.2f} ms per step gives "
                f"{naive_tput:,.0f} tok/s: about half of the middle column, not a third, under every reading.",
                naive_tput / 8470, 0.33, 2,
                (Reading("exact B = 29 against the printed 8,470 tok/s", naive_tput / 8470),
                 Reading(f"exact B = 29 against the exact B = {paged}",
                         naive_tput / throughput_tok_s(paged, tpot(paged, kv) / 1e3)),
                 Reading("0.328 GB per sequence, 13.5 GB of weights, against 199",
                         throughput_tok_s(29, tpot(29, kb, 13.5e9)) / throughput_tok_s(199, tpot(199, kb, 13.5e9)),
                         slip=True))),
        Erratum("The paper's section on sharing", "reading guide", "'§4.3 on sharing'",
                "§4.4, 'Application to Other Decoding Scenarios'",
                "In the vLLM paper (Kwon et al., SOSP 2023) §4.3 is 'Decoding with PagedAttention and vLLM'; parallel "
                "sampling, beam search and shared prefixes are §4.4."),
        Erratum("The paper's section on preemption", "reading guide", "'§4.4 on preemption'",
                "§4.5, 'Scheduling and Preemption'",
                "The all-or-nothing eviction (a sequence's blocks, and a sequence group's sequences, are evicted or "
                "rescheduled together), swapping and recomputation are the paper's §4.5."),
        Erratum("Cross-request sharing in the paper", "§10.4", "'vLLM's own §4.3 stops at intra-request sharing'",
                "§4.4's 'Shared prefix' already shares blocks across requests",
                "The paper's §4.4 lets the provider reserve physical blocks for predefined shared prefixes (a system "
                "prompt) that every user request maps to. What it stops short of is automatic sharing: a content "
                "index over every block, and an eviction policy, which is Nov 9's subject."),
    ]


CONVENTIONS: list[Convention] = _conventions()
ERRATA: list[Erratum] = _errata()
