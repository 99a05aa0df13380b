"""Lab 05 checkoffs: copy-on-write fan-out and prefix sharing (§10.4).

Every expected value comes from the real `BlockAllocator` run on the same inputs (the mechanism the
student's code must agree with), never from the student's code.
"""
from __future__ import annotations

import functools
import numbers
import random
import warnings

from labsupport.block_allocator import BlockAllocator
from labsupport.course.checkoff import Mismatch, call, function, value
from labsupport.course.registry import givens
from labsupport.viz.sharing import measure_fanout, replay_prefix_cache

# --- 5.1: the student's copy-on-write append ------------------------------------------------------

class _World:
    """The plain data structures the student's `cow_append` edits, plus the operations around it."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.tables: dict = {}
        self.seq_lens: dict = {}
        self.ref_counts = [0] * num_blocks
        self.free_blocks = list(range(num_blocks))

    def allocate(self, seq, tokens):
        n = -(-tokens // self.block_size)
        table = [self.free_blocks.pop(0) for _ in range(n)]
        for b in table:
            self.ref_counts[b] = 1
        self.tables[seq], self.seq_lens[seq] = table, tokens

    def fork(self, parent, child):
        self.tables[child] = list(self.tables[parent])
        self.seq_lens[child] = self.seq_lens[parent]
        for b in self.tables[child]:
            self.ref_counts[b] += 1

    def free(self, seq):
        for b in reversed(self.tables.pop(seq)):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)
        del self.seq_lens[seq]


def _random_script(rng: random.Random, block_size: int, num_blocks: int, steps: int = 60) -> list[tuple]:
    ops, live, nxt = [("alloc", 0, rng.randint(1, 3 * block_size))], [0], 1  # the first op is the prompt
    for _ in range(steps):
        r = rng.random()
        if r < 0.2 and len(live) < 6:
            ops.append(("fork", rng.choice(live), nxt))
            live.append(nxt)
            nxt += 1
        elif r < 0.27 and len(live) > 1:
            victim = rng.choice(live)
            live.remove(victim)
            ops.append(("free", victim))
        else:
            ops.append(("append", rng.choice(live)))
    return ops


def _scripts(rng: random.Random | None = None) -> list[tuple[str, int, int, list[tuple]]]:
    """(name, block_size, num_blocks, operations) — each a situation the append must get right."""
    scripts = [
        ("a shared, half-filled tail (block size 4)", 4, 16,
         [("alloc", "p", 6), ("fork", "p", "a"), ("fork", "p", "b"), ("append", "a"), ("append", "a"),
          ("append", "b"), ("append", "p"), ("append", "p"), ("append", "p"), ("append", "b")]),
        ("a shared tail that is already full (block size 4)", 4, 12,
         [("alloc", "q", 8), ("fork", "q", "r"), ("append", "r"), ("append", "q"), ("append", "r")]),
        ("block size 1: every token starts a block", 1, 20,
         [("alloc", "s", 3), ("fork", "s", "t"), ("append", "t"), ("append", "s"), ("append", "s")]),
        ("an empty sequence's first token (block size 16)", 16, 4, [("alloc", "e", 0), ("append", "e"), ("append", "e")]),
        ("the other holder left: the tail is private again (block size 4)", 4, 12,
         [("alloc", "x", 5), ("fork", "x", "y"), ("free", "x"), ("append", "y"), ("append", "y")]),
    ]
    fixed = random.Random(5)  # the lab's own random history, the same for everyone
    ops = [("alloc", 0, 13)] + _random_script(fixed, 8, 64)[1:]
    scripts.append(("a random fork/append/free history (block size 8)", 8, 64, ops))
    if rng is not None:
        for block_size in (rng.choice((2, 3, 4)), rng.choice((5, 16, 32))):
            scripts.append((f"another fork/append/free history (block size {block_size})", block_size, 96,
                            _random_script(rng, block_size, 96)))
    return scripts


def _compare(world: _World, alloc: BlockAllocator, where: str) -> None:
    """The student's structures must match the allocator's up to renaming of block ids."""
    rename: dict[int, int] = {}
    for seq, real in alloc.block_tables.items():
        mine = world.tables.get(seq)
        if mine is None or len(mine) != len(real):
            raise Mismatch(f"{where}: sequence {seq!r} should hold {len(real)} block(s); your block table has "
                           f"{'none' if mine is None else len(mine)}.")
        if world.seq_lens.get(seq) != alloc.seq_lens[seq]:
            raise Mismatch(f"{where}: seq_lens[{seq!r}] is {world.seq_lens.get(seq)}, it should be "
                           f"{alloc.seq_lens[seq]}: the append must count the token it placed.")
        for i, (m, r) in enumerate(zip(mine, real)):
            if rename.setdefault(m, r) != r:
                raise Mismatch(f"{where}: your block table makes {seq!r}'s block {i} the same physical block as "
                               "another entry that should be a different block — a block is shared that should "
                               "have been copied (or the other way round).")
    if len(set(rename.values())) != len(rename):
        raise Mismatch(f"{where}: two entries that should share one physical block name different blocks in your "
                       "tables — something was copied that is still shared.")
    for m, r in rename.items():
        if world.ref_counts[m] != alloc.ref_count(r):
            raise Mismatch(f"{where}: a block held by {sum(m in t for t in world.tables.values())} table entr(ies) has "
                           f"ref_count {world.ref_counts[m]} in your structures; it should be {alloc.ref_count(r)}.")
    used = sum(1 for c in world.ref_counts if c > 0)
    if used != alloc.num_used_blocks or len(world.free_blocks) != alloc.num_free_blocks:
        raise Mismatch(f"{where}: {used} blocks are in use and {len(world.free_blocks)} free in your structures; "
                       f"the pool should have {alloc.num_used_blocks} in use and {alloc.num_free_blocks} free "
                       "(a block taken from the free list must get ref_count 1, and only one block per append).")


_COW_SHORTCUTS = ("labsupport.block_allocator.BlockAllocator.append_slot",
                  "labsupport.block_allocator.BlockAllocator.append_slots",
                  "labsupport.kvcache.PagedKVCache.prepare_decode", "labsupport.kvcache.PagedKVCache.append")


@function(
    "5.1", "Copy-on-write append",
    hint="Look at where the new token lands: offset = seq_len % block_size. Offset 0 means the last block is full "
         "(or there is none), so the token needs a fresh block — nothing is copied, whoever else holds the full "
         "blocks. Otherwise the token goes into the last block, and the only question is whether anyone else "
         "still names that block (its ref_count). If they do, writing in place would change their tokens: take a "
         "fresh block, make it yours in the table, move one reference off the old block, and report (old, new) so "
         "the cache copies the old block's contents first. If nobody else names it — including when every other "
         "branch has already copied away — write in place.",
    cases=_scripts,
    forbid=_COW_SHORTCUTS,
    derive="decide from seq_len % block_size and the last block's ref_count, and edit the four structures yourself",
)
def _cow_append(fn, script):
    name, bs, nb, ops = script
    world, alloc = _World(nb, bs), BlockAllocator(nb, bs)
    for step, op in enumerate(ops, start=1):
        where = f"In '{name}', step {step} ({op[0]} {', '.join(map(repr, op[1:]))})"
        if op[0] == "alloc":
            world.allocate(op[1], op[2])
            alloc.allocate(op[1], op[2])
        elif op[0] == "fork":
            world.fork(op[1], op[2])
            alloc.fork(op[1], op[2])
        elif op[0] == "free":
            world.free(op[1])
            alloc.free(op[1])
        else:
            seq = op[1]
            before = list(world.tables[seq])
            want = alloc.append_slot(seq)
            got = call(fn, seq, world.tables, world.seq_lens, world.ref_counts, world.free_blocks, bs)
            if not isinstance(got, tuple) or len(got) != 2:
                raise Mismatch(f"{where}: cow_append returned {got!r}; return a pair (slot, cow).")
            slot, cow = got
            if not isinstance(slot, numbers.Integral):
                raise Mismatch(f"{where}: the slot is {slot!r}; it is one integer, block_id * block_size + offset.")
            table = world.tables.get(seq, [])
            if slot % bs != want.slot % bs:
                raise Mismatch(f"{where}: your slot {slot} sits at offset {slot % bs} of its block; the token "
                               f"belongs at offset {want.slot % bs} (the sequence's length modulo the block size).")
            if not table or slot // bs != table[-1]:
                raise Mismatch(f"{where}: your slot {slot} is in block {slot // bs}, but the token must go into "
                               "the sequence's last block as its table names it after the append.")
            if (cow is None) != (want.cow is None):
                raise Mismatch(f"{where}: you " + ("copied a block" if want.cow is None else "did not copy")
                               + "; this append " + ("must write without copying" if want.cow is None
                                                     else "lands in a block someone else still names") + ".")
            if cow is not None and (tuple(cow) != (before[-1], table[-1])):
                raise Mismatch(f"{where}: cow is {cow!r}; it should be (the block you copy from, the block "
                               "you copy into) — the old last block and the new one.")
            _compare(world, alloc, where)
            continue
        _compare(world, alloc, where)


# --- 5.2: the fan-out factor in blocks ------------------------------------------------------------

_FANOUT_CASES = [(8, 4096, 256, 16), (16, 8192, 512, 16), (8, 100, 1, 16), (8, 100, 40, 16), (3, 33, 40, 8),
                 (5, 7, 3, 4), (4, 64, 64, 16), (8, 4096, 256, 1), (8, 4000, 100, 256), (1, 50, 10, 16),
                 (12, 17, 300, 32), (2, 1, 1, 2)]


@function(
    "5.2", "Fan-out: blocks unshared and shared",
    hint="Unshared, every branch owns a full copy: count the blocks of one sequence of prompt + output tokens, "
         "n times. Shared, ask which blocks the forks can keep naming for ever: only the prompt's FULL blocks. "
         "A partly filled last prompt block is written into by every branch's first token, so each branch ends up "
         "with its own copy of it — count it per branch, together with the blocks its output needs beyond it.",
    cases=lambda rng: [(case, measure_fanout(*case)) for case in _FANOUT_CASES + [
        (rng.randint(1, 16), rng.randint(1, 5000), rng.randint(1, 600), rng.choice((1, 2, 8, 16, 32, 64)))
        for _ in range(5)]],
    forbid=("labsupport.ledger.fanout_blocks", "labsupport.viz.sharing.measure_fanout",
            "labsupport.viz.sharing.fanout_in_pool", "labsupport.block_allocator.BlockAllocator"),
    derive="count the blocks: whole prompt blocks shared once, each branch's own tail and output blocks",
)
def _fanout(fn, case):
    (n, p, o, b), want = case
    what = f"fanout_blocks(n={n}, prompt={p}, output={o}, block_size={b})"
    got = call(fn, n, p, o, b)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Mismatch(f"{what} returned {got!r}; return a pair (unshared_blocks, shared_blocks).")
    for label, g, w in (("unshared", got[0], want.unshared_blocks), ("shared", got[1], want.shared_blocks)):
        if isinstance(g, bool) or not isinstance(g, numbers.Real) or g != int(g):
            raise Mismatch(f"{what}: the {label} count is {g!r}; blocks are whole numbers.")
        if g != w:
            extra = ""
            if label == "shared" and g == -(-p // b) + n * -(-o // b):
                extra = " It looks as if the partly filled prompt block stayed shared after the branches wrote."
            elif g in (n * (p + o), p + n * o):
                extra = " That is a count of tokens; the allocator hands out blocks."
            raise Mismatch(f"{what}: your {label} count is {g:,}, the allocator holds a different number "
                           f"({'more' if w > g else 'fewer'}).{extra}")


# --- 5.3: reference counts after a divergence -----------------------------------------------------

# The quantities Exercise 5.3 is posed on: n branches forked off one prompt, the block size, and how
# many of the branches have written their first token when the reference counts are read.
G = givens(
    lecture=dict(N_BRANCHES=8, BLOCK=16, PROMPT_TOKENS=100, WRITERS=5),
    hidden=lambda rng: _hidden_divergence(rng),
)


def _hidden_divergence(rng: random.Random) -> dict:
    n = rng.choice((3, 4, 5, 6, 7, 9, 10, 12))
    bs = rng.choice((4, 8, 32))
    prompt = rng.choice([p for p in range(20, 300) if p % bs and p != 100])  # a partly filled tail
    writers = rng.choice([w for w in range(2, n) if w != 5])
    return dict(N_BRANCHES=n, BLOCK=bs, PROMPT_TOKENS=prompt, WRITERS=writers)


def _divergence(n: int, prompt: int, block_size: int, writers: int) -> tuple[list[int], int, tuple]:
    """(every in-use block's ref_count after `writers` branches wrote one token, the copies once all n
    wrote, the inputs): read off the real allocator."""
    alloc = BlockAllocator(-(-prompt // block_size) + 2 * n + 2, block_size)
    alloc.allocate(0, prompt)
    for b in range(1, n):
        alloc.fork(0, b)
    copies = sum(alloc.append_slot(b).cow is not None for b in range(writers))
    refs = sorted(alloc.ref_count(blk) for blk in range(alloc.num_blocks) if alloc.ref_count(blk))
    copies += sum(alloc.append_slot(b).cow is not None for b in range(writers, n))
    return refs, copies, (n, prompt, block_size, writers)


def _refcount_mistake(got: list[int], n: int, full: int, tail: bool, writers: int) -> str:
    """Name the plausible wrong pictures of the pool (sorted lists) after `writers` branches wrote."""
    if not tail:
        return ""
    if got == sorted([n] * (full + 1) + [1] * writers):
        return (" Your shared tail still has all its references: each copy moves one reference off the original "
                "tail block, so it is named by the branches that have not written yet.")
    if got == sorted([n] * full + [1] * writers):
        return (" The original tail block is missing: it is still in use, named by the branches that have not "
                "written yet.")
    if got == sorted([n - writers] * (full + 1) + [1] * (writers * (full + 1))):
        return (" You copied the full blocks too: a full block is never written again, so it stays shared by all "
                "the branches — only the partly filled tail is copied.")
    return ""


def _copies_mistake(got: int, n: int, full: int, tail: bool, writers: int) -> str:
    if not tail:
        return ""
    if got == n:
        return (" That counts a copy for every branch; the last branch to write finds the original tail with "
                "ref_count 1 (everyone else has copied away) and writes in place.")
    if got == writers:
        return " That is the copies after the first writers; the question asks once every branch has written."
    if got == n * (full + 1) or got == (n - 1) * (full + 1):
        return " Only the partly filled tail block is copied; the full blocks are never written again."
    if got == 0:
        return " A branch's first token lands in the shared, partly filled tail, so writing it needs a private copy."
    return ""


def _grade_divergence(answer, expected) -> None:
    refs, copies, (n, prompt, block_size, writers) = expected
    full, tail = divmod(prompt, block_size)
    if not isinstance(answer, dict) or set(answer) != {"refcounts", "copies"}:
        raise Mismatch(f"answer with a dict {{'refcounts': [...], 'copies': ...}}; you gave {answer!r}.")
    got = answer["refcounts"]
    if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
        raise Mismatch(f"'refcounts' is {got!r}; list the ref_count of every block in use, e.g. [8, 8, 1].")
    got = list(got)
    if any(isinstance(r, bool) or not isinstance(r, numbers.Integral) for r in got):
        raise Mismatch(f"'refcounts' holds {got!r}; reference counts are whole numbers.")
    if 0 in got:
        raise Mismatch("'refcounts' lists a block with ref_count 0; a block nobody names is free, not in use — leave it out.")
    if sorted(got) != refs:
        if len(got) != len(refs):
            problem = f"you list {len(got)} blocks in use; the pool holds {len(refs)} after those {writers} writes."
        else:
            problem = "you have the right number of blocks in use, but not their reference counts."
        raise Mismatch(f"'refcounts': {problem}" + _refcount_mistake(sorted(got), n, full, bool(tail), writers))
    c = answer["copies"]
    if isinstance(c, bool) or not isinstance(c, numbers.Integral):
        raise Mismatch(f"'copies' is {c!r}; give a whole number of block copies.")
    if c != copies:
        raise Mismatch(f"'copies': {c} block copies is too {'many' if c > copies else 'few'} for all {n} branches "
                       "to have written one token each." + _copies_mistake(c, n, full, bool(tail), writers))


value(
    "5.3", "Reference counts after a divergence",
    hint="Draw it. The prompt fills PROMPT_TOKENS // BLOCK full blocks and a last, partly filled one; after the "
         "forks every block has ref_count N_BRANCHES. A branch's first token lands in that last block: while "
         "someone else still names it, the branch takes a private copy (ref_count 1) and the original loses one "
         "reference. Full blocks are never written again, so nothing happens to them. For the copies: follow the "
         "original tail's count down as branches leave it — what does the last branch find when it writes?",
    expected=lambda g: _divergence(g.N_BRANCHES, g.PROMPT_TOKENS, g.BLOCK, g.WRITERS), judge=_grade_divergence,
    forbid=("labsupport.block_allocator.BlockAllocator", "labsupport.kvcache.PagedKVCache",
            "labsupport.viz.sharing.board_blocks", "labsupport.viz.sharing.measure_fork_cost",
            "labsupport.viz.sharing.refcount_board_figure", "labsupport.viz.sharing.measure_fanout",
            "labsupport.ledger.fanout_blocks"),
    derive="work the reference counts out from N_BRANCHES, BLOCK, PROMPT_TOKENS and WRITERS rather than running "
           "the allocator",
    formative={"unordered": ["refcounts"]},
)




# --- 5.4: cross-request prefix hits ---------------------------------------------------------------

_PREFIX_CASES = [
    [[1, 2, 3], [1, 2, 4], [5, 2, 3], [1, 2, 3, 9], [1], [2, 3]],
    [[7, 7, 7], [7, 7], [7, 8, 7]],
    [[10, 11], [12], [10, 11, 12], [10, 12], [10, 11, 12, 13], [12]],
]


@functools.lru_cache(maxsize=1)
def _mooncake_trace_head(n: int = 2000) -> tuple[str, tuple[tuple[int, ...], ...]]:
    """(what it is, the hash ids of the first n requests).  Without the real file this is the stand-in;
    the lab's own cell that loads the trace already said so, and a checkoff cell prints only its line."""
    from labsupport.workloads import TraceNotice, load_mooncake

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceNotice)
        trace = load_mooncake("conversation", limit=n)
    what = "the SYNTHETIC stand-in for the Mooncake conversation trace" if trace.synthetic else \
        "the Mooncake conversation trace"
    return what, tuple(tuple(r.hash_ids) for r in trace)


def _mooncake_head(n: int = 2000) -> list[list[int]]:
    return [list(ids) for ids in _mooncake_trace_head(n)[1]]


def _prefix_cases(rng):
    cases = [(case, f"the {len(case):,}-request list {case!r}") for case in _PREFIX_CASES]
    head = _mooncake_head()
    cases.append((head, f"the first {len(head):,} requests of {_mooncake_trace_head()[0]}"))
    for _ in range(3):  # short, repetitive histories: most prefixes recur, some only after a detour
        alphabet = rng.randint(2, 6)
        case = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(5, 60))]
        cases.append((case, f"a {len(case)}-request history of block ids drawn from {alphabet} values"))
    return [(case, label, replay_prefix_cache([tuple(ids) for ids in case]).hit_blocks) for case, label in cases]


@function(
    "5.4", "Prefix hits on a trace's hash ids",
    hint="A block can be served from the index only if the request's whole prefix up to and including that block "
         "was seen before — the same id after a different prefix is different content (its keys and values depend "
         "on everything before it). So walk each request's blocks from the start, key each block by the prefix "
         "that ends there, count a hit while the key is known, stop counting at the first miss, and remember "
         "every prefix of every request you have processed.",
    cases=_prefix_cases,
    forbid=("labsupport.viz.sharing.replay_prefix_cache", "labsupport.workloads.prefix_hit_rate",
            "labsupport.block_allocator.BlockAllocator"),
    derive="walk each request's block ids from the start, keyed by the whole prefix, and count the hits",
)
def _prefix_hits(fn, prepared):
    case, label, want = prepared
    got = call(fn, [list(ids) for ids in case])
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        raise Mismatch(f"prefix_hit_blocks(...) returned {got!r}; return the number of blocks served by the index.")
    if got != want:
        raise Mismatch(f"on {label} you count {got:,} hits; the allocator's prefix index serves "
                       f"{'fewer' if want < got else 'more'}.")
