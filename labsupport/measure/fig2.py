"""The vLLM paper's Fig. 2, measured: how much of a loaded KV pool holds real token states, per policy.

§10.3's reading guide: "read §3 first and read it as a measurement paper".  `simulate_breakdown`
replays a real length distribution through one allocator (Orca Max / Pow2 / Oracle from
`labsupport.contiguous`, or paged blocks from `labsupport.block_allocator`) under memory pressure
and averages its `MemoryStats` shares; `fig2_breakdown` does it for every policy on the same pool.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from labsupport.block_allocator import BlockAllocator
from labsupport.checks import as_count as _as_count
from labsupport.contiguous import OrcaAllocator, next_pow2
from labsupport.memory_stats import OutOfBlocks

__all__ = ["Breakdown", "simulate_breakdown", "fig2_breakdown"]


@dataclass(frozen=True)
class Breakdown:
    """Time-averaged shares of the KV pool (they sum to 1) while requests were waiting."""

    policy: str
    token_states: float
    reservation: float
    internal_fragmentation: float
    external_fragmentation: float
    free: float  # free space not in a too-small hole (paged: blocks held back or too few)
    samples: int
    steps: int
    finished: int
    preemptions: int
    mean_running: float
    capacity_tokens: int

    def row(self) -> str:
        return (f"{self.policy:<7} token states {100 * self.token_states:5.1f}%  reservation "
                f"{100 * self.reservation:5.1f}%  internal {100 * self.internal_fragmentation:5.1f}%  "
                f"external {100 * self.external_fragmentation:5.1f}%  free {100 * self.free:4.1f}%  "
                f"running {self.mean_running:6.1f}  preempted {self.preemptions}")


def _pairs(requests) -> list[tuple[int, int]]:
    out = []
    for i, r in enumerate(requests):
        p, o = (r.prompt_tokens, r.output_tokens) if hasattr(r, "prompt_tokens") else r
        out.append((_as_count(f"request {i} prompt_tokens", p, 1), _as_count(f"request {i} output_tokens", o, 1)))
    return out


class _Paged:
    """vLLM's policy on a `BlockAllocator`: a prompt's blocks are admitted while the pool stays above the
    watermark; a sequence that needs a block and finds none makes room by preempting (recompute)."""

    def __init__(self, reqs, capacity_tokens: int, block_size: int, watermark: float):
        self.alloc = BlockAllocator(capacity_tokens // _as_count("block_size", block_size, 1), block_size)
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark!r}")
        self.reqs, self.block_size = reqs, block_size
        self.watermark_blocks = int(watermark * self.alloc.num_blocks)
        self.final = {i: p + o for i, (p, o) in enumerate(reqs)}
        longest = max(self.final.values())
        if self.alloc.blocks_needed(longest) + self.watermark_blocks > self.alloc.num_blocks:
            raise ValueError(f"a request of {longest} tokens does not fit in {self.alloc.num_blocks} blocks")

    def admit(self, i: int, generated: int) -> int | None:
        """None when request i is admitted, else the size (tokens) it waits for."""
        tokens = self.reqs[i][0] + generated  # a preempted request recomputes its output so far
        need = self.alloc.blocks_needed(tokens)
        if self.alloc.num_free_blocks - need < self.watermark_blocks:
            return need * self.block_size
        self.alloc.allocate(i, tokens)
        return None

    def grow(self, i: int) -> bool:
        """One more token for request i; False when the pool has no block for it."""
        try:
            self.alloc.append_slot(i)
        except OutOfBlocks:
            return False
        return True

    def stats(self, head_size: int | None):
        return self.alloc.stats(self.final)


class _Orca:
    """Orca's policies on an `OrcaAllocator`: a request is admitted when its whole reservation fits one hole
    (first-fit); reservations guarantee growth, so nothing is ever preempted."""

    def __init__(self, reqs, capacity_tokens: int, policy: str, s_max: int | None):
        longest = max(p + o for p, o in reqs)
        s_max = next_pow2(longest) if s_max is None else _as_count("s_max", s_max, 1)
        self.alloc = OrcaAllocator(capacity_tokens, policy, s_max)
        if s_max > capacity_tokens:
            raise ValueError(f"s_max={s_max} exceeds the pool of {capacity_tokens} tokens")
        self.reqs = reqs

    def admit(self, i: int, generated: int) -> int | None:
        try:
            self.alloc.allocate(i, *self.reqs[i])
        except OutOfBlocks as e:
            return e.needed
        return None

    def grow(self, i: int) -> bool:
        self.alloc.append(i)
        return True

    def stats(self, head_size: int | None):
        return self.alloc.stats(next_request_tokens=head_size)


_SHARES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")


def simulate_breakdown(requests: Iterable, capacity_tokens: int, policy: str, *, s_max: int | None = None,
                       block_size: int = 16, watermark: float = 0.01, sample_every: int = 1,
                       progress: bool = False) -> Breakdown:
    """Replay requests through one allocator under memory pressure and average its `stats()`.

    Method (the paper measures its Fig. 2 on a loaded server; this is a memory-only replay):
    every request is waiting at time 0, in trace order.  Each iteration (Orca and vLLM both
    schedule per iteration) first admits waiting requests first-come-first-served until the head
    does not fit, then samples the pool, then lets every running sequence append one token;
    a sequence that has produced its `output_tokens` leaves and frees its memory.  What "fits"
    means is the policy's (`_Orca`, `_Paged`); when a paged sequence finds no block, the most
    recently admitted sequence is preempted and recomputed later (vLLM's default).

    Samples are taken only while someone is waiting, i.e. while memory is the bottleneck; free
    space then is space the waiting request could not use.  Shares are of the whole pool.
    """
    reqs = _pairs(requests)
    if not reqs:
        raise ValueError("no requests to simulate")
    capacity_tokens = _as_count("capacity_tokens", capacity_tokens, 1)
    sample_every = _as_count("sample_every", sample_every, 1)
    pol = (_Paged(reqs, capacity_tokens, block_size, watermark) if policy == "paged"
           else _Orca(reqs, capacity_tokens, policy, s_max))
    generated = [0] * len(reqs)
    waiting = deque(range(len(reqs)))
    running: list[int] = []
    sums = [0.0] * len(_SHARES)
    samples = steps = finished = preemptions = running_sum = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(reqs), desc=f"simulate {policy}", leave=False)
    while waiting or running:
        head_size = None
        while waiting and (head_size := pol.admit(waiting[0], generated[waiting[0]])) is None:
            running.append(waiting.popleft())
        if not running:
            raise ValueError(f"request {waiting[0]} {reqs[waiting[0]]} can never be admitted")
        if waiting and steps % sample_every == 0:
            shares = pol.stats(head_size).shares()
            sums = [total + shares[key] for total, key in zip(sums, _SHARES)]
            samples += 1
            running_sum += len(running)
        k = 0
        while k < len(running):
            i = running[k]
            if not pol.grow(i):  # no block: the latest admitted gives its memory back
                victim = running.pop()
                pol.alloc.free(victim)
                waiting.appendleft(victim)
                preemptions += 1
                continue
            generated[i] += 1
            if generated[i] == reqs[i][1]:
                pol.alloc.free(i)
                running.pop(k)
                finished += 1
                if bar is not None:
                    bar.update(1)
            else:
                k += 1
        steps += 1
    if bar is not None:
        bar.close()
    if samples == 0:
        raise ValueError("memory never became the bottleneck: use more requests or a smaller capacity")
    avg = [total / samples for total in sums]
    return Breakdown(policy, *avg, samples=samples, steps=steps, finished=finished, preemptions=preemptions,
                     mean_running=running_sum / samples, capacity_tokens=capacity_tokens)


def fig2_breakdown(requests: Iterable, capacity_tokens: int, *, s_max: int | None = None, block_size: int = 16,
                   policies: Sequence[str] = ("max", "pow2", "oracle", "paged"), **kwargs) -> dict[str, Breakdown]:
    """`simulate_breakdown` for each policy on the same requests and pool (vLLM paper, Fig. 2).

    S_max defaults to the smallest power of two holding the longest request, i.e. the context
    window a model would need to serve the whole trace without truncation.
    """
    reqs = _pairs(requests)
    if s_max is None:
        s_max = next_pow2(max(p + o for p, o in reqs)) if reqs else 1
    return {pol: simulate_breakdown(reqs, capacity_tokens, pol, s_max=s_max, block_size=block_size, **kwargs)
            for pol in policies}
