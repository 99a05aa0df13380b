"""§10.7's map of Part II, computed: each row's quantity, read off the mechanisms, the traces and engine runs
(lab 08; the board reads the trace-bound ones from `labsupport/viz/board/board_data.json`).

The discussion seeds get their data here too (`request_level_batching`, `interference_spike`, `routing_hit_rates`,
`dependent_requests`, `tlb_bytes`, `length_prediction_cost`); `labsupport.viz.board.map` draws the table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from labsupport import card, ledger
from labsupport.specs import GB, LECTURE_7B, LECTURE_GPU, LLAMA3_70B, KiB

LAB_NAMES = {
    "00": "00_setup", "01": "01_five_jobs", "02": "02_naive_allocator", "03": "03_block_tables",
    "04": "04_paged_kernel", "05": "05_copy_on_write", "06": "06_engine_loop", "07": "07_slo_ledger",
    "08": "08_map_of_part_two",
}


def attention_intensity(model=None) -> float:
    """FLOP per KV byte of decode attention: QK^T and PV are 4 L H d FLOP per cached token, which
    reads 2 L H_kv d b bytes — 1 FLOP/byte for MHA, the group size for GQA (§2.15, §10.3 step three)."""
    from labsupport.costmodel import CostModel

    model = model or card.model()
    return CostModel(model).attn_flops_per_key / model.kv_bytes_per_token


def memory_batch(model=None, gpu=None, seq_tokens: int = 640, block_size: int = 16) -> int:
    """The paged memory ceiling: `seq_tokens`-token sequences the card's KV budget holds in whole blocks (186 for the
    lecture's 7B on its H100, §10.3); the course card's model and GPU unless told."""
    model, gpu = model or card.model(), gpu or card.gpu()
    budget = ledger.kv_budget_bytes(model, gpu)
    return ledger.paged_concurrency(budget, seq_tokens, block_size, model.kv_bytes_per_token)


def slo_batch(model=None, gpu=None, seq_tokens: int = 640, tpot_slo_s: float = 0.020) -> int:
    """The largest B whose TPOT meets the SLO (159 for the lecture's 7B on its H100 at 20 ms, §10.6)."""
    model, gpu = model or card.model(), gpu or card.gpu()
    return ledger.max_batch_for_tpot(model, seq_tokens, tpot_slo_s, gpu.hbm_bandwidth)


def _decode_step_s(model, gpu, batch: int, seq_tokens: int = 640) -> float:
    """One decode step of `batch` sequences of `seq_tokens` tokens on the roofline (the engine's CostModel): the
    larger of its bytes over the bandwidth (the ledger's TPOT, the memory term) and its FLOPs at 50% of peak.
    Memory-bound for the lecture's 7B on its H100 (22.65 ms at B = 186); a GQA model's small KV lets the batch
    grow until the FLOPs dominate."""
    from labsupport.costmodel import CostModel

    return CostModel(model, gpu).step(decode_seqs=batch, decode_context_tokens=batch * seq_tokens).total_s


def request_level_batching(output_lengths: Sequence[int], batch: int | None = None) -> dict:
    """§10.5 / Oct 7: consecutive requests batched `batch` at a time (the card's memory batch unless told), each
    batch running until its longest member finishes.  Effective B = tokens produced ÷ steps run, averaged."""
    import numpy as np

    batch = memory_batch() if batch is None else batch

    out = np.asarray(output_lengths, dtype=np.int64)
    if batch < 1 or len(out) < batch:
        raise ValueError(f"need at least one full batch of {batch} requests, got {len(out)}")
    groups = out[: len(out) // batch * batch].reshape(-1, batch)
    effective = groups.sum(axis=1) / groups.max(axis=1)
    return {"batch": batch, "batches": len(groups), "mean_effective_b": float(effective.mean()),
            "median_effective_b": float(np.median(effective)), "mean_output": float(out.mean())}


def interference_spike(neighbours: int | None = None, prompt: int = 4096, overlap: bool = True, model=None,
                       gpu=None) -> dict:
    """§2.16 on the engine: `neighbours` chat sequences decode (512-token prompts), one `prompt`-token
    request arrives mid-run; a neighbour's longest gap between tokens against its usual gap.  Unless told,
    `neighbours` is the memory batch of `model` on `gpu` (each the course card's unless told).

    overlap=True prices each step by the roofline's max(compute, memory); False adds them, as
    Lecture 2's 6.7x does (the decode steps themselves then get their arithmetic added too)."""
    import numpy as np

    from labsupport.costmodel import CostModel
    from labsupport.engine import Engine

    model, gpu = model or card.model(), gpu or card.gpu()
    neighbours = memory_batch(model, gpu) if neighbours is None else neighbours  # this model's memory batch here
    pool = ledger.num_blocks(ledger.kv_budget_bytes(model, gpu), 16, model.kv_bytes_per_token)
    clock = CostModel(model, gpu, overlap=overlap)
    engine = Engine(cost_model=clock, num_blocks=pool, block_size=16, watermark=0.0, max_num_seqs=neighbours + 1)
    ids = [engine.add_request(prompt_len=512, max_new_tokens=128, arrival_time=0.0) for _ in range(neighbours)]
    # arrive after the neighbours' own prefill step, in the middle of their decoding
    first_step = clock.step(prefill_lens=[512] * neighbours).total_s
    engine.add_request(prompt_len=prompt, max_new_tokens=8, arrival_time=first_step + 0.05)
    result = engine.run()
    gaps = np.diff(result.requests[ids[0]].token_times[0])
    decode = ledger.tpot_s(model, neighbours, 512 + 64, gpu.hbm_bandwidth)
    prefill = ledger.recompute_s(model, prompt, gpu.peak_flops)
    return {"usual_gap_s": float(np.median(gaps)), "spike_gap_s": float(gaps.max()),
            "engine_ratio": float(gaps.max() / np.median(gaps)),
            # §2.16's own figure, on the lecture's card whatever the course's: prefill added to a decode step
            "lecture_additive_ratio": (ledger.recompute_s(LECTURE_7B, 4096, LECTURE_GPU.peak_flops)
                                       + ledger.tpot_s(LECTURE_7B, 186, 640, LECTURE_GPU.hbm_bandwidth))
                                      / ledger.tpot_s(LECTURE_7B, 186, 640, LECTURE_GPU.hbm_bandwidth),
            "prefill_s": prefill, "decode_step_s": decode}


# What §10.7's rows change, measured (lab 08, Exercise 8.2): the lecture's operating point, read off the mechanisms.
OUTPUTS = ("memory batch", "TPOT", "longest gap", "prefill")


def outputs(model=None, gpu=None, seq_tokens: int = 640, batch: int | None = None, prompt: int = 4096) -> dict:
    """Four outputs of today's arithmetic on `model` and `gpu`, each read off a mechanism.

    `batch` (the course card's memory batch unless told) stays put when `model` or `gpu` changes, so an output
    moves only by what the change does at one operating point.
    "memory batch": `seq_tokens`-token sequences a BlockAllocator over the card's KV budget (16-token blocks)
    holds; "TPOT": the engine's cost-model step for `batch` such sequences decoding; "longest gap": the worst
    wait between two tokens of one of `batch` decoding neighbours when a `prompt`-token prefill joins them (an
    engine run); "prefill": the engine's step for that prompt alone.  Seconds for the three times.
    """
    from labsupport.block_allocator import BlockAllocator
    from labsupport.costmodel import CostModel

    model, gpu = model or card.model(), gpu or card.gpu()
    batch = memory_batch(seq_tokens=seq_tokens) if batch is None else batch  # the card's operating point, held
    pool = BlockAllocator(ledger.num_blocks(max(0.0, ledger.kv_budget_bytes(model, gpu)), 16,
                                            model.kv_bytes_per_token), 16)
    held = 0
    while pool.can_allocate(pool.blocks_needed(seq_tokens)):
        pool.allocate(held, seq_tokens)
        held += 1
    clock = CostModel(model, gpu)
    return {"memory batch": held,
            "TPOT": clock.step(decode_seqs=batch, decode_context_tokens=batch * seq_tokens).total_s,
            "longest gap": interference_spike(batch, prompt, model=model, gpu=gpu)["spike_gap_s"],
            "prefill": clock.step(prefill_lens=[prompt]).total_s}


def routing_hit_rates(workload, replicas: Sequence[int] = (1, 2, 4, 8)) -> dict[int, float]:
    """Oct 19: prefix-cache hit rate (unbounded caches) when requests are spread round-robin over
    `replicas` cards, each with its own cache — a hit on the wrong replica is a miss."""
    from labsupport.workloads import prefix_hit_rate

    reqs = list(workload)
    total = sum(len(r.hash_ids) for r in reqs)
    out = {}
    for k in replicas:
        hits = 0.0
        for j in range(k):
            sub = reqs[j::k]
            hits += prefix_hit_rate(sub) * sum(len(r.hash_ids) for r in sub)
        out[k] = hits / total
    return out


def dependent_requests(workload, share: float = 0.5) -> float:
    """Nov 18/23: the share of requests that re-send at least `share` of their prompt blocks as a
    prefix some earlier request already sent — requests the engine treats as strangers."""
    seen: set = set()
    dependent = 0
    for r in workload:
        h = tuple(r.hash_ids)
        k = 0
        while k < len(h) and h[: k + 1] in seen:
            k += 1
        dependent += k >= share * len(h)
        seen.update(h[:j] for j in range(1, len(h) + 1))
    return dependent / len(workload)


def tlb_bytes(batch: int | None = None, seq_tokens: int = 640, block_size: int = 16, entry_bytes: int = 4) -> dict:
    """Seed 3: block-table bytes a decode step reads (one table per sequence, re-read per layer)
    against the KV bytes it reads — what a KV 'TLB' could save (the course card's model and GPU).  "step_s" is
    that step on the roofline: the larger of its bytes over the bandwidth and its FLOPs at 50% of peak."""
    m, gpu = card.model(), card.gpu()
    batch = memory_batch(m, gpu, seq_tokens, block_size) if batch is None else batch
    table = batch * ledger.block_table_bytes(seq_tokens, block_size, entry_bytes) * m.num_layers
    kv = batch * seq_tokens * m.kv_bytes_per_token
    swap_in = seq_tokens * m.kv_bytes_per_token / gpu.link_bandwidth
    return {"table_bytes": table, "kv_bytes": kv, "ratio": table / kv, "swap_in_one_way_s": swap_in,
            "step_s": _decode_step_s(m, gpu, batch, seq_tokens)}


def length_prediction_cost(workload, sigma: float, margin: float = 1.0, seed: int = 0) -> dict:
    """Seed 2: admission with a length predictor, priced on a trace's real lengths.

    Each request reserves its prompt plus a predicted output, margin x o x exp(sigma z) with z
    standard normal (sigma = 0 and margin = 1 is a perfect predictor).  Over-predicted, it holds the reservation all its life and the
    unfilled part sits idle; under-predicted, it outgrows the reservation at its predicted length and
    must be preempted — its prompt and the tokens so far recomputed — before it can reserve the rest.
    Returns the share of requests preempted, the recomputed tokens as a share of all prompt tokens,
    and the idle share of the KV slots reserved, averaged over every request's decode steps.
    """
    import numpy as np

    if not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"margin must be a finite number > 0, got {margin!r}")
    p = np.asarray(workload.prompt_lengths(), dtype=float)
    o = np.asarray(workload.output_lengths(), dtype=float)
    z = np.random.default_rng(seed).standard_normal(len(o))
    pred = np.maximum(1.0, np.round(margin * o * np.exp(sigma * z)))
    under = pred < o
    steps = o  # one step per output token; at step k the sequence holds p + k tokens
    held = (p * steps + steps * (steps - 1) / 2).sum()  # token slots filled, summed over steps
    # over: the reservation p + pred for all o steps; under: p + pred until pred, then p + o
    reserved = np.where(under, p * o + pred * pred + o * (o - pred), (p + pred) * o).sum()
    return {"sigma": sigma, "margin": margin, "preempted_share": float(under.mean()),
            "recompute_share": float((p + pred)[under].sum() / p.sum()),
            "idle_share": float(1 - held / reserved)}


@dataclass(frozen=True)
class MapRow:
    """One row of §10.7: what is still broken, the quantity, its value here, where Part II fixes it."""

    broken: str
    quantity: str
    value: str
    where: str
    lab: str  # the lab (two digits) that computed the quantity first

    @property
    def lab_link(self) -> str:
        name = LAB_NAMES[self.lab]
        return f'<a href="{name}.ipynb">lab {self.lab}</a>'


def trace_numbers(azure=None, mooncake=None) -> dict:
    """The §10.7 values that need a trace or an engine run (lab 08 computes them live; the board
    reads them from board_data.json)."""
    from labsupport.workloads import agent_session, load_azure, load_mooncake

    azure = azure if azure is not None else load_azure("conv")
    mooncake = mooncake if mooncake is not None else load_mooncake("conversation")
    session = agent_session()
    submitted = sum(r.prompt_tokens for r in session)
    return {
        "request_batching": request_level_batching(azure.output_lengths()),
        "spike": interference_spike(),
        "routing": {str(k): v for k, v in routing_hit_rates(mooncake).items()},
        "dependent": dependent_requests(mooncake),
        "agent_resend": 1 - session.requests[-1].prompt_tokens / submitted,
        "sources": {"azure": ("SYNTHETIC " if azure.synthetic else "") + azure.name,
                    "mooncake": ("SYNTHETIC " if mooncake.synthetic else "") + mooncake.name},
    }


def map_rows(numbers: dict) -> list[MapRow]:
    """§10.7's table with each quantity's value: closed forms here, traces and engine runs from
    `numbers` (see `trace_numbers`).  The titles quote the lecture; the values are the course card's."""
    c = card.card()
    m, gpu = c.model, c.gpu
    rb, sp, rt = numbers["request_batching"], numbers["spike"], numbers["routing"]
    b_mem, b_slo = memory_batch(m, gpu), slo_batch(m, gpu)
    w_frac_slo = m.weight_bytes / ledger.decode_step_bytes(m, b_slo, 640)
    floor = m.weight_bytes / gpu.hbm_bandwidth
    # the memory batch's decode step on the roofline (§2.16 adds the prefill to it): its memory term, the ledger's
    # TPOT, on the lecture's card; its FLOPs where they take longer (a GQA model's large batch)
    cadence = _decode_step_s(m, gpu, b_mem)
    prefill = ledger.recompute_s(m, 4096, gpu.peak_flops)  # the card's 4,096-token prefill at 50% of peak
    return [
        MapRow("The gather kernel paging created, and attention's 1 FLOP/byte",
               "achieved bandwidth on an indirect access",
               f"{attention_intensity(c.mha):.0f} FLOP per KV byte ({c.mha.attention}), {attention_intensity(c.gqa):.0f} "
               f"({c.gqa.attention}): decode attention runs at the gather's bandwidth", "GPU programming Sep 30, kernels Oct 5", "04"),
        MapRow("The batch is re-chosen per request, wasting every batch's tail", "effective B over time",
               f"request-level batches of {rb['batch']} Azure requests average B = {rb['mean_effective_b']:.0f}",
               "Batching and scheduling I, Oct 7", "06"),
        MapRow("One 129 ms prefill wrecks 199 decodes' cadence", "§2.16's 6.7× TPOT spike",
               f"{1e3 * prefill:.1f} ms prefill in a {1e3 * cadence:.2f} ms "
               f"cadence: {(prefill + cadence) / cadence:.2f}× added, {sp['engine_ratio']:.2f}× on the engine's clock",
               "Disaggregation, Oct 14", "07"),
        MapRow("A cache hit on the wrong replica is a cache miss", "which card a request lands on",
               f"Mooncake prefix hits {100 * rt['1']:.1f}% on 1 card, {100 * rt['8']:.1f}% round-robin over 8",
               "Routing and load balancing, Oct 19", "05"),
        MapRow("512 KiB per token, paid in full for every position", "KV bytes per token",
               f"{m.kv_bytes_per_token:,} B = {m.kv_bytes_per_token // KiB} KiB ({c.contrast.attention}: "
               f"{c.contrast.kv_bytes_per_token // KiB} KiB; Llama 3 70B: {LLAMA3_70B.kv_bytes_per_token // KiB} KiB)",
               "KV-cache optimization, Oct 28", "00"),
        MapRow("Identical prefixes across requests are prefilled twice", "the 92% re-send of Lecture 5",
               f"agent session: {100 * numbers['agent_resend']:.2f}% re-sent; Mooncake: {100 * rt['1']:.1f}% of "
               "prompt blocks already seen", "Prefix cache, Nov 9", "05"),
        MapRow("13.5 GB of weights re-read every step, b = 2", "bytes per weight and per cached value",
               f"{m.weight_bytes / GB:.2f} GB = {1e3 * floor:.2f} ms of every step; {100 * w_frac_slo:.0f}% of "
               f"the bytes at B = {b_slo}", "Pruning and quantization, Nov 11", "01"),
        MapRow("One forward pass yields one token", "tokens per pass over the weights",
               f"1 per sequence: one stream tops out at {1 / _decode_step_s(m, gpu, 1):,.0f} tok/s",
               "Speculative decoding, Nov 18", "07"),
        MapRow("The engine sees finished strings, not the agent's structure", "the dependence between requests",
               f"{100 * numbers['dependent']:.1f}% of Mooncake requests re-send ≥ half their prompt from an earlier one",
               "Agent serving, Nov 18 and Nov 23", "05"),
    ]
