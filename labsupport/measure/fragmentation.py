"""The naive allocators measured (§10.2, Exercise 2): reserve-to-max filled to its refusal, and per-request
S_max first-fit driven until external fragmentation refuses a request that the free memory could hold.

Each number is read off a real allocator (`labsupport.contiguous`) at the moment it said no; `labsupport.viz.memory`
draws them.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Iterable, Sequence

from labsupport.checks import positive_int as _positive_int
from labsupport.contiguous import ContiguousAllocator, Refusal, ReserveToMaxAllocator
from labsupport.memory_stats import OutOfBlocks

EXERCISE2_MIX = ((512, 0.70), (4096, 0.25), (32_768, 0.05))  # declared S_max and its share of requests


def fill_reserve_to_max(budget_bytes: float, s_max: int, seq_tokens: int, kv_per_token: int) -> ReserveToMaxAllocator:
    """A real `ReserveToMaxAllocator` on the budget with every slot it admits holding one sequence.

    Each sequence holds min(seq_tokens, s_max) tokens (a slot cannot grow past itself); admission
    stops at the allocator's own refusal, so the count of slots is the mechanism's, not a formula's.
    """
    if not budget_bytes > 0:
        raise ValueError(f"the KV budget is {budget_bytes:,.0f} B: the weights leave no room for a KV cache")
    _positive_int("seq_tokens", seq_tokens)
    alloc = ReserveToMaxAllocator.from_budget(budget_bytes, kv_per_token, s_max=s_max)
    held = min(seq_tokens, s_max)
    i = 0
    while True:
        try:
            alloc.allocate(i, num_tokens=held)
        except OutOfBlocks:
            return alloc
        i += 1


def naive_measurement(alloc: ReserveToMaxAllocator, budget_bytes: float) -> dict:
    """Slot size, concurrency and utilization read off a filled allocator's own stats."""
    st = alloc.stats()
    kv = alloc.kv_bytes_per_token
    return {"slot_bytes": alloc.s_max * kv, "concurrency": alloc.num_seqs,
            "occupied_bytes": st.occupied_bytes, "reserved_bytes": st.reserved_bytes,
            "utilization": st.occupied_bytes / budget_bytes, "leftover_bytes": budget_bytes - st.reserved_bytes}


@dataclass
class FragmentationRun:
    """The outcome of `run_until_fragmented`: the allocator at the moment of the refusal."""

    allocator: ContiguousAllocator
    refusal: Refusal | None
    arrivals: int
    retirements: int
    earlier_refusals: int  # refusals before the reported one (pool full, or a size we were not waiting for)
    earlier_fragmented: int  # of those, how many were already external fragmentation

    @property
    def found(self) -> bool:
        return self.refusal is not None and self.refusal.fragmented


def run_until_fragmented(capacity_tokens: int, mix: Sequence[tuple[int, float]] = EXERCISE2_MIX, *,
                         kv_bytes_per_token: int | None = None, seed: int = 0, retire_fraction: float = 0.3,
                         stop_sizes: Iterable[int] | None = None, max_arrivals: int = 10_000,
                         place=None) -> FragmentationRun:
    """Drive a real first-fit `ContiguousAllocator` with arrivals drawn from `mix` until it refuses one.

    Requests arrive one at a time and each declares its own S_max.  When one is refused, a random
    `retire_fraction` of the residents finish and the arrival is tried again.  The run stops at the
    first refusal whose request is smaller than the free memory in total (external fragmentation,
    the failure Exercise 2 asks for) — only for requests of `stop_sizes`, when given.  `place` is the
    allocator's placement policy (lab 02's 2.13; None: its own first fit).
    """
    if not 0 < retire_fraction < 1:
        raise ValueError(f"retire_fraction must be in (0, 1), got {retire_fraction!r}")
    sizes = [s for s, _ in mix]
    weights = [p for _, p in mix]
    if any(s < 1 for s in sizes) or any(p < 0 for p in weights) or not math.isclose(sum(weights), 1.0):
        raise ValueError(f"mix must pair positive sizes with shares summing to 1, got {list(mix)}")
    stop = set(sizes if stop_sizes is None else stop_sizes)
    if not stop <= set(sizes):
        raise ValueError(f"stop_sizes {sorted(stop)} must be among the mix's sizes {sizes}")
    alloc = ContiguousAllocator(capacity_tokens, kv_bytes_per_token=kv_bytes_per_token, place=place)
    if max(sizes) > capacity_tokens:
        raise ValueError(f"the largest declared S_max ({max(sizes):,}) exceeds the pool ({capacity_tokens:,} tokens)")
    rng = random.Random(seed)
    retired = refused = fragmented = 0
    for arrival in range(max_arrivals):
        size = rng.choices(sizes, weights)[0]
        while True:
            try:
                alloc.allocate(arrival, size)
            except OutOfBlocks as exc:
                if exc.refusal is not None and exc.refusal.fragmented and size in stop:
                    return FragmentationRun(alloc, exc.refusal, arrival + 1, retired, refused, fragmented)
                refused += 1
                fragmented += bool(exc.refusal is not None and exc.refusal.fragmented)
                residents = list(alloc.slots)
                for sid in rng.sample(residents, max(1, int(retire_fraction * len(residents)))):
                    alloc.free(sid)
                    retired += 1
                continue
            break
    return FragmentationRun(alloc, None, max_arrivals, retired, refused, fragmented)
