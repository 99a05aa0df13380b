"""§10.3's block-size trade-off, measured on the real `BlockAllocator`: tail waste, the batch that fits, the
block-table entries per sequence, and how contiguous a sequence's blocks stay once the pool has churned.

`labsupport.viz.memory` draws it (`block_size_tradeoff_figure`, `block_size_panel`).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Mapping, Sequence

from labsupport import ledger
from labsupport.block_allocator import BlockAllocator
from labsupport.checks import positive_int as _positive_int
from labsupport.memory_stats import OutOfBlocks


@dataclass(frozen=True)
class BlockSizeMeasurement:
    """One workload at one block size, measured on the real allocator."""

    workload: str
    block_size: int
    num_seqs: int
    mean_tail_tokens: float
    max_tail_tokens: int
    mean_tail_bytes: float
    waste_at_batch_fraction: float  # batch x mean tail bytes / budget (the lecture's column)
    batch: int
    median_tokens: int
    p95_tokens: int
    entries_at_median: int
    entries_at_p95: int
    mean_run_tokens: float  # physically contiguous run in a replayed pool, tokens
    resident: float  # mean sequences resident in the replayed pool over the snapshots
    pool_tail_fraction: float  # mean share of that pool lost to tails over the snapshots


def _percentile_int(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile (an actual length from the data)."""
    k = max(0, math.ceil(q * len(sorted_values)) - 1)
    return int(sorted_values[k])


def contiguous_runs(block_tables: Mapping[Hashable, Sequence[int]], seq_lens: Mapping[Hashable, int],
                    block_size: int) -> list[int]:
    """Token lengths of physically contiguous runs in the tables (block b then b + 1 continue a run)."""
    runs = []
    for s, table in block_tables.items():
        n = seq_lens[s]
        run = 0
        for i, b in enumerate(table):
            tokens = min(block_size, n - i * block_size)
            if i and b == table[i - 1] + 1:
                run += tokens
            else:
                if run:
                    runs.append(run)
                run = tokens
        if run:
            runs.append(run)
    return runs


def replay_pool(pairs: Sequence[tuple[int, int]], num_blocks: int, block_size: int, steps: int = 400,
                observe: Callable[[BlockAllocator, int], None] | None = None,
                max_tokens: int | None = None) -> BlockAllocator:
    """A real `BlockAllocator` after `steps` iterations of serving `pairs` (prompt, output) in order.

    Each iteration admits waiting requests first-come-first-served while their prompt blocks fit,
    then appends one token to every running sequence (preempting the newest when a block is
    missing) and retires those that have produced their output: the churn that decides which
    physical blocks end up neighbours.  Requests longer than the whole pool, or than `max_tokens` (a
    context window: one giant request at the head of a FCFS queue would otherwise stall the replay
    into serving one sequence at a time), are skipped.  `observe(allocator, step)` is called after
    every iteration.
    """
    alloc = BlockAllocator(num_blocks, block_size)
    limit = num_blocks * block_size if max_tokens is None else min(max_tokens, num_blocks * block_size)
    fits = [(i, p, o) for i, (p, o) in enumerate(pairs) if p + o <= limit]
    waiting = list(reversed(fits))  # pop() from the end = first come
    running: list[tuple[int, int, int]] = []
    generated: dict[int, int] = {}
    for step in range(steps):
        while waiting:
            i, p, o = waiting[-1]
            if alloc.blocks_needed(p + generated.get(i, 0)) > alloc.num_free_blocks:
                break
            waiting.pop()
            alloc.allocate(i, p + generated.get(i, 0))  # a preempted request recomputes its output so far
            running.append((i, p, o))
        k = 0
        while k < len(running):
            i, p, o = running[k]
            try:
                alloc.append_slot(i)
            except OutOfBlocks:
                victim = running.pop()
                alloc.free(victim[0])
                waiting.append(victim)
                continue
            generated[i] = generated.get(i, 0) + 1
            if generated[i] >= o:
                alloc.free(i)
                running.pop(k)
            else:
                k += 1
        if observe is not None:
            observe(alloc, step)
        if not running and not waiting:
            break
    return alloc


def measure_block_size(name: str, lengths: Sequence[int], block_size: int, kv_per_token: int, budget_bytes: float,
                       batch: int = 199, pairs: Sequence[tuple[int, int]] | None = None,
                       replay_steps: int = 400, warmup_steps: int = 100, snapshot_every: int = 20,
                       replay_max_tokens: int | None = 32_768) -> BlockSizeMeasurement:
    """§10.3's table columns for one workload and block size, read off real allocators.

    Tail waste and table entries: each sequence's final length is allocated in a `BlockAllocator`
    and its table read back.  Contiguous run and pool tail share: `replay_pool` on the KV budget's
    worth of blocks, with the resident sequences' tables inspected every `snapshot_every` steps
    after `warmup_steps` (the pool's steady state, not its fresh start); the replay leaves out
    sequences longer than `replay_max_tokens` (a 32K context window by default).
    """
    _positive_int("block_size", block_size)
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"{name}: lengths must be a non-empty list of positive token counts")
    if replay_steps <= warmup_steps:
        raise ValueError(f"replay_steps ({replay_steps}) must exceed warmup_steps ({warmup_steps})")
    longest = max(lengths)
    probe = BlockAllocator(-(-longest // block_size), block_size)
    tails = []
    for n in lengths:
        table = probe.allocate(0, n)
        tails.append(len(table) * block_size - n)
        probe.free(0)
    ordered = sorted(lengths)
    med, p95 = _percentile_int(ordered, 0.5), _percentile_int(ordered, 0.95)
    entries = {}
    for key, n in (("median", med), ("p95", p95)):
        entries[key] = len(probe.allocate(key, n))
        probe.free(key)
    mean_tail = statistics.fmean(tails)
    runs: list[int] = []
    residents: list[int] = []
    tail_shares: list[float] = []

    def observe(alloc: BlockAllocator, step: int) -> None:
        if step >= warmup_steps and (step - warmup_steps) % snapshot_every == 0:
            runs.extend(contiguous_runs(alloc.block_tables, alloc.seq_lens, block_size))
            residents.append(len(alloc.block_tables))
            st = alloc.stats()
            tail_shares.append(st.internal_tokens / st.capacity_tokens)

    pool_blocks = ledger.num_blocks(budget_bytes, block_size, kv_per_token)
    replay_pool(pairs if pairs is not None else [(max(1, n - 1), 1) for n in lengths], pool_blocks, block_size,
                replay_steps, observe, replay_max_tokens)
    return BlockSizeMeasurement(
        workload=name, block_size=block_size, num_seqs=len(lengths), mean_tail_tokens=mean_tail,
        max_tail_tokens=max(tails), mean_tail_bytes=mean_tail * kv_per_token,
        waste_at_batch_fraction=batch * mean_tail * kv_per_token / budget_bytes, batch=batch,
        median_tokens=med, p95_tokens=p95, entries_at_median=entries["median"], entries_at_p95=entries["p95"],
        mean_run_tokens=statistics.fmean(runs) if runs else float("nan"),
        resident=statistics.fmean(residents) if residents else 0.0,
        pool_tail_fraction=statistics.fmean(tail_shares) if tail_shares else 0.0)


def fitting_batch(lengths: Sequence[int], kv_per_token: int, budget_bytes: float) -> int:
    """Sequences of this workload the KV budget holds: the budget over the bytes of a sequence of its
    mean final length, whole sequences (§10.3's 199 is this count for 640-token sequences, before
    blocks are rounded; a workload with longer sequences holds fewer)."""
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError("fitting_batch: lengths must be a non-empty list of positive token counts")
    return int(budget_bytes * len(lengths) // (sum(lengths) * kv_per_token))


def measure_workloads(workloads: Mapping[str, Sequence[tuple[int, int]]], block_sizes: Iterable[int],
                      kv_per_token: int, budget_bytes: float, batch: int | Mapping[str, int] = 199,
                      replay_steps: int = 400, progress: bool = True) -> dict[str, dict[int, BlockSizeMeasurement]]:
    """`measure_block_size` for every (workload, block size); workloads map a name to (prompt, output) pairs.

    `batch` is the B of the waste column: one number for every workload, or one per workload (e.g.
    `fitting_batch` of each)."""
    block_sizes = list(block_sizes)
    batches = dict(batch) if isinstance(batch, Mapping) else {name: batch for name in workloads}
    missing = [name for name in workloads if name not in batches]
    if missing:
        raise ValueError(f"measure_workloads: no batch for {', '.join(missing)}")
    jobs = [(name, b) for name in workloads for b in block_sizes]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="measuring block sizes", leave=False)
    out: dict[str, dict[int, BlockSizeMeasurement]] = {name: {} for name in workloads}
    for name, b in jobs:
        pairs = list(workloads[name])
        out[name][b] = measure_block_size(name, [p + o for p, o in pairs], b, kv_per_token, budget_bytes,
                                          batches[name], pairs, replay_steps)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out
