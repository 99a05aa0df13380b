"""Measurements of §10.4's sharing on the real `BlockAllocator` (lab 05, lab 08's seed).

* fan-out: n completions off one prompt, unshared against shared, counted on two allocators
  (`measure_fanout`), and the same fan-out pushed into a finite pool (`fanout_in_pool`);
* block size against fork cost: the copy on divergence is a whole block (`measure_fork_cost`);
* cross-request sharing: a Mooncake trace's `hash_ids` replayed through the allocator's prefix
  index (`replay_prefix_cache`).

`labsupport.viz.sharing` draws them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from labsupport.block_allocator import BlockAllocator
from labsupport.checks import as_count as _count
from labsupport.memory_stats import OutOfBlocks
from labsupport.prefix_cache import PrefixCachingAllocator


@dataclass(frozen=True)
class FanoutCount:
    """Blocks n branches hold after each wrote `output` tokens past a shared `prompt`, both ways."""

    n: int
    prompt: int
    output: int
    block_size: int
    unshared_blocks: int  # n independent copies of prompt + output
    shared_blocks: int  # one prompt, forked n ways, copy-on-write on divergence
    cow_copies: int  # block copies the shared run made

    @property
    def factor(self) -> float:
        return self.unshared_blocks / self.shared_blocks

    def bytes(self, kv_bytes_per_token: int) -> tuple[int, int]:
        per_block = self.block_size * kv_bytes_per_token
        return self.unshared_blocks * per_block, self.shared_blocks * per_block


def measure_fanout(n: int, prompt: int, output: int, block_size: int) -> FanoutCount:
    """Run the fan-out on two real allocators and count the blocks in use at the end.

    Shared: allocate the prompt once, fork it n - 1 times, then every branch appends `output`
    tokens one decode step at a time (the first append copies a shared, partly filled tail).
    Unshared: n sequences, each with its own prompt, append the same tokens.
    """
    n, prompt, output = _count("n", n, 1), _count("prompt", prompt, 1), _count("output", output, 0)
    block_size = _count("block_size", block_size, 1)
    per_branch = -(-(prompt + output) // block_size)
    branches = list(range(n))
    shared = BlockAllocator(n * per_branch, block_size)
    shared.allocate(0, prompt)
    for b in branches[1:]:
        shared.fork(0, b)
    copies = 0
    for _ in range(output):
        copies += sum(r.cow is not None for r in shared.append_slots(branches))
    unshared = BlockAllocator(n * per_branch, block_size)
    for b in branches:
        unshared.allocate(b, prompt)
    for _ in range(output):
        unshared.append_slots(branches)
    shared.check_invariants()
    unshared.check_invariants()
    return FanoutCount(n, prompt, output, block_size, unshared.num_used_blocks, shared.num_used_blocks, copies)


@dataclass(frozen=True)
class PoolRun:
    """A fan-out pushed into a pool of `num_blocks`: how far it got before the pool said no."""

    share: bool
    num_blocks: int
    used_blocks: int
    branches_admitted: int
    tokens_written: int  # output tokens appended per branch before the end or the refusal
    refusal: str | None

    @property
    def fits(self) -> bool:
        return self.refusal is None


def fanout_in_pool(n: int, prompt: int, output: int, block_size: int, num_blocks: int, share: bool) -> PoolRun:
    """Prefill the n branches (once and forked, or n times) into a finite pool, then decode `output` steps.

    Stops at the first `OutOfBlocks` and reports it: the allocator's state is unchanged by the
    refused call, so `used_blocks` is what the pool held at that moment.
    """
    n, prompt, output = _count("n", n, 1), _count("prompt", prompt, 1), _count("output", output, 0)
    alloc = BlockAllocator(_count("num_blocks", num_blocks, 1), _count("block_size", block_size, 1))
    admitted, written = 0, 0
    try:
        if share:
            alloc.allocate(0, prompt)
            admitted = 1
            for b in range(1, n):
                alloc.fork(0, b)
                admitted += 1
        else:
            for b in range(n):
                alloc.allocate(b, prompt)
                admitted += 1
        for _ in range(output):
            alloc.append_slots(range(n))
            written += 1
    except OutOfBlocks as exc:
        return PoolRun(share, num_blocks, alloc.num_used_blocks, admitted, written, str(exc))
    return PoolRun(share, num_blocks, alloc.num_used_blocks, admitted, written, None)


@dataclass(frozen=True)
class ForkCost:
    """What one divergence of n branches copies at one block size, averaged over prompt lengths."""

    block_size: int
    n: int
    prompts: tuple[int, ...]  # the prompt lengths measured (one run each)
    copies: float  # blocks copied by copy-on-write, mean per divergence
    new_blocks: float  # blocks taken in that step (copies, or fresh blocks when the tail was full)
    copied_tokens: float  # token slots moved: a copy moves the whole block
    filled_tokens: float  # of those, slots holding prompt tokens (the rest is the block's empty tail)

    def copied_bytes(self, kv_bytes_per_token: int) -> float:
        return self.copied_tokens * kv_bytes_per_token

    def filled_bytes(self, kv_bytes_per_token: int) -> float:
        return self.filled_tokens * kv_bytes_per_token


def measure_fork_cost(block_size: int, n: int = 8, prompts: int | Iterable[int] | None = None) -> ForkCost:
    """Allocate a prompt, fork it n - 1 times, let every branch write one token; count the copies.

    The allocator reports each copy-on-write as (src, dst); a copy moves a whole block, of which
    `prompt % block_size` slots hold prompt tokens (a prompt ending on a block boundary copies
    nothing: every branch starts a fresh block).  `prompts` defaults to 4,096 ... 4,096 + b - 1,
    every tail fill once, so the means are over prompt lengths uniform modulo b.
    """
    n = _count("n", n, 1)
    block_size = _count("block_size", block_size, 1)
    if prompts is None:
        prompts = range(4096, 4096 + block_size)
    prompts = (prompts,) if isinstance(prompts, (int, np.integer)) else tuple(prompts)
    if not prompts:
        raise ValueError("measure_fork_cost needs at least one prompt length")
    copies = new = moved = filled = 0
    for prompt in prompts:
        prompt = _count("prompt", prompt, 1)
        alloc = BlockAllocator(-(-prompt // block_size) + n, block_size)
        alloc.allocate(0, prompt)
        for b in range(1, n):
            alloc.fork(0, b)
        before = alloc.num_used_blocks
        c = sum(r.cow is not None for r in alloc.append_slots(range(n)))
        alloc.check_invariants()
        copies += c
        new += alloc.num_used_blocks - before
        moved += c * block_size
        filled += c * (prompt % block_size)
    k = len(prompts)
    return ForkCost(block_size, n, prompts, copies / k, new / k, moved / k, filled / k)


@dataclass
class PrefixReplay:
    """A trace's prompt blocks replayed through a prefix-caching `BlockAllocator`.

    One allocator block stands for one trace block (Mooncake: 512 tokens), and its content is
    the trace's hash id: equal chained content is exactly an equal prefix.
    """

    name: str
    num_blocks: int  # the pool; None-bounded runs use one block per requested block
    requests: int
    skipped: int  # requests longer than the whole pool
    requested_blocks: int
    hit_blocks: int
    cum_requested: np.ndarray  # after each replayed request
    cum_hits: np.ndarray
    block_tokens: int = 512

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.requested_blocks if self.requested_blocks else 0.0

    @property
    def allocated_blocks(self) -> int:
        return self.requested_blocks - self.hit_blocks


def _hash_lists(workload) -> tuple[str, list[tuple[int, ...]]]:
    name = getattr(workload, "name", "requests")
    lists = []
    for r in workload:
        ids = tuple(r.hash_ids) if hasattr(r, "hash_ids") else tuple(r)
        if not ids:
            raise ValueError(f"request {len(lists)} of {name} has no hash ids (only Mooncake traces carry them)")
        lists.append(ids)
    return name, lists


def replay_prefix_cache(workload, num_blocks: int | None = None, block_tokens: int = 512,
                        progress: bool = False) -> PrefixReplay:
    """Replay requests' `hash_ids` (or plain id lists) in order through a prefix-caching allocator.

    Each request allocates its prompt blocks with `token_ids=hash_ids` (block size 1: one id per
    block), and frees them when done; freed blocks stay in the index until the pool needs them
    (least recently freed first).  `num_blocks=None` sizes the pool to hold every requested block:
    nothing is ever evicted, the unbounded cache.  Requests are replayed one at a time, so no
    two hold blocks at once: only the index and its capacity matter here.
    """
    name, lists = _hash_lists(workload)
    total = sum(len(h) for h in lists)
    pool = total if num_blocks is None else _count("num_blocks", num_blocks, 1)
    alloc = PrefixCachingAllocator(max(1, pool), 1)
    cum_req = np.zeros(len(lists), dtype=np.int64)
    cum_hit = np.zeros(len(lists), dtype=np.int64)
    requested = hits = skipped = 0
    items = enumerate(lists)
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, total=len(lists), desc=f"prefix replay ({name})", leave=False)
    for i, ids in items:
        if len(ids) > pool:
            skipped += 1
        else:
            alloc.allocate(i, len(ids), token_ids=ids)
            requested += len(ids)
            hits += alloc.num_cached_tokens[i]
            alloc.free(i)
        cum_req[i], cum_hit[i] = requested, hits
    alloc.check_invariants()
    return PrefixReplay(name, pool, len(lists), skipped, requested, hits, cum_req, cum_hit, block_tokens)
