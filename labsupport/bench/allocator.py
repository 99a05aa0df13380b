"""`python -m labsupport bench allocator`: the speed of the block allocator and the paged cache (§10.3).

The allocator runs on the CPU once per sequence per step, so it must cost far less than a decode
step.  Figures printed:

* block allocate+free pairs/s -- one block out of the free list and back, the granularity of
  nano-vllm's `_allocate_block` / `_deallocate_block` (about 2.6 M pairs/s on the course's 2-core
  machines, without copy-on-write or swap);
* sequence allocate+free pairs/s -- the public `allocate(seq, block_size tokens)` + `free(seq)`;
* append_slot/s -- sequences growing token by token, a new block every block_size tokens;
* paged-cache appends/s -- `PagedKVCache.append` on CPU tensors, per token and per call;
* where the time goes: the block pair split into loop, call and deque costs, and a cProfile of
  the cache's decode step.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections import deque

from labsupport.block_allocator import BlockAllocator
from labsupport.cli.parser import OneLineParser, UsageError, int_flag, real_flag


def _rate(fn, n: int, seconds: float, repeats: int = 3) -> float:
    """Best-of-`repeats` rate of fn(n) (which performs n operations), each run at least `seconds`."""
    best = 0.0
    for _ in range(repeats):
        done, t0 = 0, time.perf_counter()
        while True:
            fn(n)
            done += n
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        best = max(best, done / dt)
    return best


def _block_pairs(alloc: BlockAllocator):
    take, release = alloc._take_block, alloc._release_block

    def run(n):
        for _ in range(n):
            release(take())
    return run


def _seq_pairs(alloc: BlockAllocator):
    allocate, free, bs = alloc.allocate, alloc.free, alloc.block_size

    def run(n):
        for i in range(n):
            allocate(i, bs)
            free(i)
    return run


def _appends(alloc: BlockAllocator, batch: int, steps: int):
    append, free, allocate = alloc.append_slot, alloc.free, alloc.allocate

    def run(n):
        for r in range(n // (batch * steps)):
            ids = [(r, j) for j in range(batch)]
            for s in ids:
                allocate(s, 1)
            for _ in range(steps):
                for s in ids:
                    append(s)
            for s in ids:
                free(s)
    return run


def _breakdown(n: int, seconds: float) -> list[tuple[str, float]]:
    """ns per iteration of the pieces a block pair is made of."""
    q = deque(range(1024))
    ref = [0] * 1024

    def empty(n):
        for _ in range(n):
            pass

    def bare_deque(n):
        pop, push = q.popleft, q.append
        for _ in range(n):
            push(pop())

    def bare_refs(n):
        pop, push = q.popleft, q.append
        for _ in range(n):
            b = pop()
            ref[b] = 1
            r = ref[b] - 1
            ref[b] = r
            if not r:
                push(b)

    def nop(_=None):
        return 0

    def two_calls(n):
        for _ in range(n):
            nop(nop())

    rows = [("empty loop", empty), ("deque popleft+append", bare_deque),
            ("  + ref_count write/read/branch", bare_refs), ("two Python function calls", two_calls)]
    return [(name, 1e9 / _rate(fn, n, seconds / 4, repeats=2)) for name, fn in rows]


def bench(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m labsupport bench allocator", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=real_flag(1e-4, 600.0), default=0.5,
                    help="minimum time per measurement run (default 0.5)")
    ap.add_argument("--block-size", type=int_flag(1, 1 << 16), default=16, help="a power of two (the paged cache's)")
    ap.add_argument("--num-blocks", type=int_flag(1, 2**31 - 1), default=8192)
    ap.add_argument("--batch", type=int_flag(1, 1 << 20), default=32, help="sequences per decode step (default 32)")
    ap.add_argument("--no-profile", action="store_true", help="skip the where-the-time-goes section")
    args = ap.parse_args(argv)
    if args.block_size & (args.block_size - 1):
        raise UsageError(f"--block-size must be a power of two (the paged cache's kernels tile a block), "
                         f"got {args.block_size}")
    # each sequence of a measured batch grows to 4 * block_size + 1 tokens: 5 blocks
    if 5 * args.batch > args.num_blocks:
        raise UsageError(f"--batch {args.batch} needs 5 x {args.batch} = {5 * args.batch:,} blocks, more than "
                         f"--num-blocks {args.num_blocks:,}")

    import torch  # after argument parsing, so --help stays fast

    from labsupport.kvcache import PagedKVCache

    print(f"block allocator: num_blocks={args.num_blocks}, block_size={args.block_size}; "
          f"best of 3 runs of >= {args.seconds} s; torch {torch.__version__}, {torch.get_num_threads()} threads")
    alloc = BlockAllocator(args.num_blocks, args.block_size)
    pairs = _rate(_block_pairs(alloc), 100_000, args.seconds)
    print(f"  block allocate+free pairs/s      {pairs / 1e6:8.2f} M   ({1e9 / pairs:6.0f} ns/pair; "
          f"nano-vllm's pure-Python manager: about 2.6 M on the course machines)")
    seq = _rate(_seq_pairs(alloc), 50_000, args.seconds)
    print(f"  sequence allocate+free pairs/s   {seq / 1e6:8.2f} M   ({1e9 / seq:6.0f} ns/pair, public API with checks)")
    steps = 4 * args.block_size
    app = _rate(_appends(alloc, args.batch, steps), args.batch * steps * 20, args.seconds)
    print(f"  append_slot/s                    {app / 1e6:8.2f} M   ({1e9 / app:6.0f} ns/append, "
          f"a new block every {args.block_size})")
    alloc.check_invariants()

    layers, heads, dim = 2, 2, 64
    cache = PagedKVCache(args.num_blocks, args.block_size, layers, heads, dim)
    b = args.batch
    k = torch.randn(layers, b, heads, dim)
    v = torch.randn(layers, b, heads, dim)
    ids = list(range(b))

    def cache_steps(n):
        for s in ids:
            cache.add_sequence(s, k[:, :1], v[:, :1])
        for _ in range(n // b):
            cache.append(ids, k, v)
        for s in ids:
            cache.free(s)

    tok = _rate(cache_steps, b * 2 * args.block_size, args.seconds)
    print(f"paged cache (CPU, L={layers}, Hkv={heads}, D={dim}, fp32, B={b}):")
    print(f"  appends/s (tokens)               {tok / 1e3:8.1f} k   ({tok / b:8.0f} decode calls/s, "
          f"{1e6 * b / tok:6.1f} us per call)")

    if not args.no_profile:
        print("where the time goes (ns per iteration):")
        for name, ns in _breakdown(200_000, args.seconds):
            print(f"  {name:<34} {ns:6.0f}")
        print(f"  {'our block pair (2 method calls)':<34} {1e9 / pairs:6.0f}")
        prof = cProfile.Profile()
        prof.enable()
        cache_steps(b * 4 * args.block_size)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(8)
        lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
        start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
        print("cProfile of PagedKVCache.append (top 8 by own time):")
        for ln in lines[start:start + 9]:
            print("  " + ln)
    return 0
