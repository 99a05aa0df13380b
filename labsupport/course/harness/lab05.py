"""Lab 05's harness: copy-on-write fan-out and prefix sharing (§10.4), beside checkoffs/lab05.py.

Checkoff 5.1: the student's copy-on-write append on a scripted fork/append/free world of plain structures
(`CowWorld`; harness and judge "cow_append"), against the real BlockAllocator's run of the same script.  Judges of
5.2 ("fanout"), 5.3 ("refcounts_in_use", "copies_after_all_write") and 5.4 ("prefix_hits"), and 5.4's input,
`chat_hash_ids`.
"""
from __future__ import annotations

import itertools
import random

from labsupport.course import data
from labsupport.course.harness.base import _raised, harness, judge
from labsupport.course.judge import Mismatch, echo


class CowWorld:
    """The plain structures 5.1's `cow_append` edits, and BlockAllocator's other operations on them."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size, self.tables, self.seq_lens = block_size, {}, {}
        self.ref_counts, self.free_blocks = [0] * num_blocks, list(range(num_blocks))

    def allocate(self, seq, tokens):
        table = [self.free_blocks.pop(0) for _ in range(-(-tokens // self.block_size))]
        for b in table:
            self.ref_counts[b] = 1
        self.tables[seq], self.seq_lens[seq] = table, tokens

    def fork(self, parent, child):
        self.tables[child], self.seq_lens[child] = list(self.tables[parent]), self.seq_lens[parent]
        for b in self.tables[child]:
            self.ref_counts[b] += 1

    def free(self, seq):
        for b in reversed(self.tables.pop(seq)):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)
        del self.seq_lens[seq]


@harness("cow_append")
def _cow_append(fn, case) -> dict:
    """5.1: the script on plain structures, the function doing every append; a step it raised on ends the run."""
    world, steps = CowWorld(case["num_blocks"], case["block_size"]), []
    for op in case["ops"]:
        step = {}
        try:
            if op[0] == "append":
                step["returned"] = data.plain(fn(op[1], world.tables, world.seq_lens, world.ref_counts,
                                                 world.free_blocks, world.block_size))
            else:
                getattr(world, "allocate" if op[0] == "alloc" else op[0])(*op[1:])
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the student's bug, or structures it left that the script cannot use
            steps.append(_raised(exc) if op[0] == "append" else {"broken": [type(exc).__name__, str(exc)[:200]]})
            break
        steps.append({**step, "tables": [[data.plain(s), data.plain(t)] for s, t in world.tables.items()],
                      "seq_lens": [[data.plain(s), data.plain(n)] for s, n in world.seq_lens.items()],
                      "ref_counts": data.plain(world.ref_counts), "free": len(world.free_blocks)})
    return {"result": steps}


def _pairs(items) -> dict:
    pairs = [item for item in items if isinstance(item, list) and len(item) == 2] if isinstance(items, list) else []
    return {tuple(k) if isinstance(k, list) else k: v for k, v in pairs if not isinstance(k, dict)}


@judge("cow_append")
def _cow_append_steps(got, spec) -> None:
    """5.1, step by step against the real BlockAllocator's run (`want`): each append's slot and copy, then the pool."""
    bs, got, before = spec["block_size"], got if isinstance(got, list) else [], {}
    for number, (op, real) in enumerate(zip(spec["ops"], spec["want"]), start=1):
        where = f"In '{spec['name']}', step {number} ({op[0]} {', '.join(map(repr, op[1:]))})"
        seen = got[number - 1] if number - 1 < len(got) and isinstance(got[number - 1], dict) else {}
        if "raised" in seen:
            kind, text = (list(seen["raised"]) + ["", ""])[:2]
            raise Mismatch(f"{where}: cow_append raised {str(kind)[:80]}: {str(text)[:300]}".rstrip(": ") + ".")
        if "broken" in seen:
            kind, text = (list(seen["broken"]) + ["", ""])[:2]
            raise Mismatch(f"{where}: your structures could not carry this operation ({str(kind)[:80]}: "
                           f"{str(text)[:200]}).")
        if "tables" not in seen:
            raise Mismatch(f"{where}: the run stopped before this step.")
        if op[0] == "append":
            returned, (real_slot, real_cow) = seen.get("returned"), real["returned"]
            if not isinstance(returned, list) or len(returned) != 2:
                raise Mismatch(f"{where}: cow_append returned {echo(returned)}; return a pair (slot, cow).")
            slot, cow = returned
            if not isinstance(slot, int):
                raise Mismatch(f"{where}: the slot is {echo(slot)}; it is one integer, block_id * block_size + offset.")
            table = _pairs(seen["tables"]).get(op[1])
            if slot % bs != real_slot % bs:
                raise Mismatch(f"{where}: your slot {slot} sits at offset {slot % bs} of its block; the token belongs "
                               f"at offset {real_slot % bs} (the sequence's length modulo the block size).")
            if not isinstance(table, list) or not table or slot // bs != table[-1]:
                raise Mismatch(f"{where}: your slot {slot} is in block {slot // bs}, but the token must go into the "
                               "sequence's last block as its table names it after the append.")
            if (cow is None) != (real_cow is None):
                raise Mismatch(f"{where}: you " + ("copied a block" if real_cow is None else "did not copy")
                               + "; this append " + ("must write without copying" if real_cow is None
                                                     else "lands in a block someone else still names") + ".")
            old = before.get(op[1])
            if cow is not None and (not isinstance(cow, list) or not isinstance(old, list) or not old
                                    or cow != [old[-1], table[-1]]):
                raise Mismatch(f"{where}: cow is {echo(cow)}; it should be (the block you copy from, the block you "
                               "copy into) — the old last block and the new one.")
        # then the pool, up to renaming of block ids
        tables, lens, counts = _pairs(seen.get("tables")), _pairs(seen.get("seq_lens")), seen.get("ref_counts")
        counts = counts if isinstance(counts, list) else []
        real_lens, rename = _pairs(real["seq_lens"]), {}
        for seq, table in _pairs(real["tables"]).items():
            mine = tables.get(seq)
            if not isinstance(mine, list) or len(mine) != len(table):
                raise Mismatch(f"{where}: sequence {seq!r} should hold {len(table)} block(s); your block table has "
                               f"{'none' if not isinstance(mine, list) else len(mine)}.")
            if lens.get(seq) != real_lens[seq]:
                raise Mismatch(f"{where}: seq_lens[{seq!r}] is {echo(lens.get(seq))}, it should be {real_lens[seq]}: "
                               "the append must count the token it placed.")
            for i, (m, r) in enumerate(zip(mine, table)):
                if isinstance(m, (list, dict)) or rename.setdefault(m, r) != r:
                    raise Mismatch(f"{where}: your block table makes {seq!r}'s block {i} the same physical block "
                                   "as another entry that should be a different block — a block is shared that "
                                   "should have been copied (or the other way round).")
        if len(set(rename.values())) != len(rename):
            raise Mismatch(f"{where}: two entries that should share one physical block name different blocks in your "
                           "tables — something was copied that is still shared.")
        for m, r in rename.items():
            count = counts[m] if isinstance(m, int) and 0 <= m < len(counts) else None
            if count != real["ref_counts"][r]:
                holders = sum(m in t for t in tables.values() if isinstance(t, list))
                raise Mismatch(f"{where}: a block held by {holders} table entr(ies) has ref_count {echo(count)} in "
                               f"your structures; it should be {real['ref_counts'][r]}.")
        used = sum(1 for c in counts if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0)
        real_used = sum(1 for c in real["ref_counts"] if c > 0)
        if used != real_used or seen.get("free") != real["free"]:
            raise Mismatch(f"{where}: {used} blocks are in use and {echo(seen.get('free'))} free in your structures; "
                           f"the pool should have {real_used} in use and {real['free']} free (a block taken from the "
                           "free list must get ref_count 1, and only one block per append).")
        before = tables


@judge("refcounts_in_use")
def _refcounts_in_use(got, spec) -> None:
    """5.3's 'refcounts': every in-use block's ref_count, in any order (want and mistakes sorted).  spec: writers."""
    want = spec["want"]
    got = list(got) if isinstance(got, (frozenset, tuple)) else got
    if not isinstance(got, list):
        raise Mismatch(f"list the ref_count of every block in use, e.g. [8, 8, 1]; you gave {echo(got)}.")
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in got):
        raise Mismatch(f"reference counts are whole numbers; you gave {echo(got)}.")
    if 0 in got:
        raise Mismatch("you list a block with ref_count 0; a block nobody names is free, not in use — leave it out.")
    got = sorted(got)
    if got == want:
        return
    problem = "you have the right number of blocks in use, but not their reference counts."
    if len(got) != len(want):
        problem = f"you list {len(got)} blocks in use; the pool holds {len(want)} after those {spec['writers']} writes."
    remark = next((r for w, r in spec.get("mistakes", ()) if w == got), "")
    raise Mismatch(problem + (f" {remark}" if remark else ""))


@judge("copies_after_all_write")
def _copies_after_all_write(got, spec) -> None:
    """5.3's 'copies': block copies once every branch has written a token.  spec: want, branches, mistakes."""
    if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
        raise Mismatch(f"give a whole number of block copies; you gave {echo(got)}.")
    if got == spec["want"]:
        return
    remark = next((r for w, r in spec.get("mistakes", ()) if w == got), "")
    raise Mismatch(f"{int(got)} block copies is too {'many' if got > spec['want'] else 'few'} for all "
                   f"{spec['branches']} branches to have written one token each." + (f" {remark}" if remark else ""))


@judge("fanout")
def _fanout(got, spec) -> None:
    """5.2: (unshared_blocks, shared_blocks).  spec: want, what, slips {"unshared"/"shared": [[count, remark]]}."""
    want, what = spec["want"], spec["what"]
    if not isinstance(got, list) or len(got) != 2:
        raise Mismatch(f"{what} returned {echo(got)}; return a pair (unshared_blocks, shared_blocks).")
    for label, g, w in (("unshared", got[0], want[0]), ("shared", got[1], want[1])):
        if isinstance(g, bool) or not isinstance(g, (int, float)) or g != int(g):
            raise Mismatch(f"{what}: the {label} count is {echo(g)}; blocks are whole numbers.")
        if g != w:
            remark = next((r for wrong, r in spec.get("slips", {}).get(label, ()) if wrong == g), "")
            raise Mismatch(f"{what}: your {label} count is {int(g):,}, the allocator holds a different number "
                           f"({'more' if w > g else 'fewer'})." + (f" {remark}" if remark else ""))


@judge("prefix_hits")
def _prefix_hits(got, spec) -> None:
    """5.4: the blocks an unbounded prefix index serves.  spec: want, label (the input, in words)."""
    if isinstance(got, bool) or not isinstance(got, int):
        raise Mismatch(f"prefix_hit_blocks(...) returned {echo(got)}; return the number of blocks served by the "
                       "index.")
    if got != spec["want"]:
        raise Mismatch(f"on {spec['label']} you count {got:,} hits; the allocator's prefix index serves "
                       f"{'fewer' if spec['want'] < got else 'more'}.")


def chat_hash_ids(seed: int, requests: int) -> list[list[int]]:
    """5.4's long input: made-up prompts as block ids, shaped like the Mooncake conversation trace's hash ids."""
    rng, ids_made, out, sessions = random.Random(seed), itertools.count(), [], []

    def fresh(k: int) -> list[int]:
        return [next(ids_made) for _ in range(k)]

    systems = [fresh(rng.randint(1, 6)) for _ in range(8)]
    for _ in range(requests):
        r = rng.random()
        if sessions and r < 0.6:  # the next turn of a conversation: everything before, then the new blocks
            i = rng.randrange(len(sessions))
            ids = sessions[i] = sessions[i] + fresh(rng.randint(1, 4))
        elif sessions and r < 0.75:  # a regenerated or edited turn: part of an earlier prompt, then new blocks
            base = rng.choice(sessions)
            ids = base[:rng.randint(1, len(base))] + fresh(rng.randint(0, 3))
        else:  # a new conversation on one of the system prompts
            ids = rng.choice(systems) + fresh(rng.randint(1, 8))
            sessions.append(ids)
            if len(sessions) > 40:
                sessions.pop(rng.randrange(len(sessions)))
        out.append(list(ids))
    return out
