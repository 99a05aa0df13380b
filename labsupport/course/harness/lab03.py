"""Lab 03's harness: PagedAttention's block table (§10.3, Exercise 3), beside checkoffs/lab03.py.

Checkoff 3.2: the student's append runs in lockstep with the real BlockAllocator on random traffic (harness
"append"), and each step is judged against the allocator's (judge "append").  The grader builds its expected steps
with this same harness, run on its reference append.
"""
from __future__ import annotations

import itertools
import random

from labsupport.course import data
from labsupport.course.harness.base import harness, judge
from labsupport.course.judge import Mismatch, echo


@harness("append")
def _append(fn, case) -> dict:
    """Random traffic on the real BlockAllocator, which appends too (in take_free_block or after the call); per append,
    the table and length given, the blocks taken, the table left and the slot returned."""
    from labsupport.block_allocator import BlockAllocator

    bs, steps, names = case["block_size"], [], itertools.count()
    rng, alloc = random.Random(case["seed"]), BlockAllocator(80, bs)
    for _ in range(300):
        live = list(alloc.block_tables)
        if rng.random() < 0.15 or not live:
            n = rng.randint(0, 2 * bs + 3)
            if alloc.can_allocate(alloc.blocks_needed(n)):
                alloc.allocate(f"s{next(names)}", n)
            continue
        seq = rng.choice(live)
        if alloc.seq_lens[seq] % bs == 0 and not alloc.num_free_blocks:
            alloc.free(seq)
            continue
        before, n, given = list(alloc.block_tables[seq]), alloc.seq_lens[seq], []
        full = n == len(before) * bs

        def take_free_block():
            if full and not given:
                alloc.append_slot(seq)
                given.append(alloc.block_tables[seq][-1])
            else:
                given.append(alloc.num_blocks + 1000)  # a block no pool has: the call was not needed
            return given[-1]

        table = list(before)
        result = fn(table, n, bs, take_free_block)
        if not (full and given):
            alloc.append_slot(seq)
        steps.append({"table": before, "seq_len": n, "took": len(given), "after": data.plain(table),
                      "slot": data.plain(result)})
    return {"result": steps}


@judge("append")
def _append_steps(got, spec) -> None:
    """3.2: a block taken exactly when the last one was full, then the real allocator's table and slot."""
    want, bs = spec["want"], spec["block_size"]
    if not isinstance(got, list) or len(got) != len(want):
        raise Mismatch("append(...) did not answer every step of the run.")
    for seen, real in zip(got, want):
        what = f"append(table={real['table']}, seq_len={real['seq_len']}, block_size={bs}, take_free_block)"
        if seen["took"] > real["took"]:
            raise Mismatch(f"{what} asked for a new block "
                           f"{'a second time' if real['took'] else 'although its last block still had room'}.")
        if seen["took"] < real["took"]:
            raise Mismatch(f"{what} did not take a new block, but the last block was full ({len(real['table'])} "
                           f"blocks x {bs} slots hold {len(real['table']) * bs} tokens).")
        if seen["after"] != real["after"]:
            raise Mismatch(f"{what} left the table as {echo(seen['after'])}; the real allocator's table is now "
                           f"{real['after']}. Append the new block to the table you were given (modify it in place).")
        if seen["slot"] != real["slot"]:
            raise Mismatch(f"{what} returned {echo(seen['slot'])}, which is not the slot the real allocator writes "
                           "this token to.")
