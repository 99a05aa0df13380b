"""Lab 05 checkoffs: copy-on-write fan-out and prefix sharing (§10.4).

5.1 the copy-on-write append, 5.2 the fan-out in blocks, 5.3 reference counts after a divergence, 5.4 prefix
hits.  Every expected value comes from the real BlockAllocator on the same inputs, never from the student's code.
"""
from __future__ import annotations

import functools
import random

from labsupport.block_allocator import BlockAllocator
from labsupport.course.data import live
from labsupport.course.harness.lab05 import chat_hash_ids
from labsupport.course.registry import case, function, givens, value
from labsupport.measure.sharing import measure_fanout, replay_prefix_cache


def _random_script(rng: random.Random, block_size: int, steps: int = 60) -> list[list]:
    ops, alive, nxt = [["alloc", 0, rng.randint(1, 3 * block_size)]], [0], 1  # the first op is the prompt
    for _ in range(steps):
        r = rng.random()
        if r < 0.2 and len(alive) < 6:
            ops.append(["fork", rng.choice(alive), nxt])
            alive.append(nxt)
            nxt += 1
        elif r < 0.27 and len(alive) > 1:
            victim = rng.choice(alive)
            alive.remove(victim)
            ops.append(["free", victim])
        else:
            ops.append(["append", rng.choice(alive)])
    return ops


def _scripts(rng: random.Random) -> list[tuple[str, int, int, list[list]]]:
    """(name, block_size, num_blocks, operations) — each a situation the append must get right."""
    scripts = [
        ("a shared, half-filled tail (block size 4)", 4, 16,
         [["alloc", "p", 6], ["fork", "p", "a"], ["fork", "p", "b"], ["append", "a"], ["append", "a"],
          ["append", "b"], ["append", "p"], ["append", "p"], ["append", "p"], ["append", "b"]]),
        ("a shared tail that is already full (block size 4)", 4, 12,
         [["alloc", "q", 8], ["fork", "q", "r"], ["append", "r"], ["append", "q"], ["append", "r"]]),
        ("block size 1: every token starts a block", 1, 20,
         [["alloc", "s", 3], ["fork", "s", "t"], ["append", "t"], ["append", "s"], ["append", "s"]]),
        ("an empty sequence's first token (block size 16)", 16, 4,
         [["alloc", "e", 0], ["append", "e"], ["append", "e"]]),
        ("the other holder left: the tail is private again (block size 4)", 4, 12,
         [["alloc", "x", 5], ["fork", "x", "y"], ["free", "x"], ["append", "y"], ["append", "y"]]),
        ("a random fork/append/free history (block size 8)", 8, 64,  # the lab's own, the same for everyone
         [["alloc", 0, 13]] + _random_script(random.Random(5), 8)[1:])]
    return scripts + [(f"another fork/append/free history (block size {bs})", bs, 96, _random_script(rng, bs))
                      for bs in (rng.choice((2, 3, 4)), rng.choice((5, 16, 32)))]


def _real_run(block_size: int, num_blocks: int, ops: list[list]) -> list[dict]:
    """The script on the real BlockAllocator, each step as the harness's "cow_append" writes the student's down."""
    alloc, steps = BlockAllocator(num_blocks, block_size), []
    for op in ops:
        step = {}
        if op[0] == "append":
            result = alloc.append_slot(op[1])
            step["returned"] = [result.slot, list(result.cow) if result.cow is not None else None]
        else:
            getattr(alloc, "allocate" if op[0] == "alloc" else op[0])(*op[1:])
        steps.append({**step, "tables": [[s, list(t)] for s, t in alloc.block_tables.items()],
                      "seq_lens": [[s, n] for s, n in alloc.seq_lens.items()], "ref_counts": alloc.ref_counts(),
                      "free": alloc.num_free_blocks})
    return steps


# The allocator's and the cache's own append (not PagedKVCache.append: the scan would flag every list.append).
_COW_SHORTCUTS = ("labsupport.block_allocator.BlockAllocator.append_slot",
                  "labsupport.block_allocator.BlockAllocator.append_slots",
                  "labsupport.kvcache.PagedKVCache.prepare_decode")


@function(
    "5.1", "Copy-on-write append",
    hint="Look at where the new token lands: offset = seq_len % block_size. Offset 0 means the last block is full "
         "(or there is none), so the token needs a fresh block — nothing is copied, whoever else holds the full "
         "blocks. Otherwise the token goes into the last block, and the only question is whether anyone else "
         "still names that block (its ref_count). If they do, writing in place would change their tokens: take a "
         "fresh block, make it yours in the table, move one reference off the old block, and report (old, new) so "
         "the cache copies the old block's contents first. If nobody else names it — including when every other "
         "branch has already copied away — write in place.",
    forbid=_COW_SHORTCUTS,
    derive="decide from seq_len % block_size and the last block's ref_count, and edit the four structures yourself",
    name="cow_append",
)
def _cow_append(rng):
    """Each script through the student's function (harness "cow_append") and through the real BlockAllocator."""
    for name, block_size, num_blocks, ops in _scripts(rng):
        run = {"block_size": block_size, "num_blocks": num_blocks, "ops": ops}
        yield case(harness="cow_append", data=run, want=_real_run(block_size, num_blocks, ops), judge="cow_append",
                   name=name, ops=ops, block_size=block_size, what=f"cow_append on '{name}'")


_FANOUT_CASES = [(8, 4096, 256, 16), (16, 8192, 512, 16), (8, 100, 1, 16), (8, 100, 40, 16), (3, 33, 40, 8),
                 (5, 7, 3, 4), (4, 64, 64, 16), (8, 4096, 256, 1), (8, 4000, 100, 256), (1, 50, 10, 16),
                 (12, 17, 300, 32), (2, 1, 1, 2)]


@functools.lru_cache(maxsize=64)
def _measured_fanout(n: int, prompt: int, output: int, block_size: int):
    """measure_fanout, once per process for the fixed cases every plan repeats (the run is deterministic)."""
    return measure_fanout(n, prompt, output, block_size)


@function(
    "5.2", "Fan-out: blocks unshared and shared",
    hint="Unshared, every branch owns a full copy: count the blocks of one sequence of prompt + output tokens, "
         "n times. Shared, ask which blocks the forks can keep naming for ever: only the prompt's FULL blocks. "
         "A partly filled last prompt block is written into by every branch's first token, so each branch ends up "
         "with its own copy of it — count it per branch, together with the blocks its output needs beyond it.",
    forbid=("labsupport.ledger.fanout_blocks", "labsupport.measure.sharing.measure_fanout", "labsupport.measure.sharing.fanout_in_pool",
            "labsupport.viz.sharing.measure_fanout", "labsupport.viz.sharing.fanout_in_pool",
            "labsupport.block_allocator.BlockAllocator"),
    derive="count the blocks: whole prompt blocks shared once, each branch's own tail and output blocks",
    name="fanout_blocks",
)
def _fanout(rng):
    cases = _FANOUT_CASES + [(rng.randint(1, 16), rng.randint(1, 5000), rng.randint(1, 600),
                              rng.choice((1, 2, 8, 16, 32, 64))) for _ in range(5)]
    for n, p, o, b in cases:
        real = _measured_fanout(n, p, o, b)  # two real allocators, unshared and shared, at the end of the run
        want = [real.unshared_blocks, real.shared_blocks]
        tokens = "That is a count of tokens; the allocator hands out blocks."
        slips = {"unshared": [(n * (p + o), tokens), (p + n * o, tokens)],
                 "shared": [(-(-p // b) + n * -(-o // b), "It looks as if the partly filled prompt block stayed shared "
                             "after the branches wrote."), (n * (p + o), tokens), (p + n * o, tokens)]}
        yield case(n, p, o, b, want=want, judge="fanout",
                   slips={k: [[w, r] for w, r in v if w != want[i]] for i, (k, v) in enumerate(slips.items())},
                   what=f"fanout_blocks(n={n}, prompt={p}, output={o}, block_size={b})")


def _hidden_divergence(rng: random.Random) -> dict:
    n, bs = rng.choice((3, 4, 5, 6, 7, 9, 10, 12)), rng.choice((4, 8, 32))
    # half the sets end the prompt mid-block (a shared tail to copy), half on a block boundary (nothing to
    # copy: each first token starts a fresh block), so that each step the prompt names changes some answer
    whole = rng.random() < 0.5
    prompt = rng.choice([p for p in range(2 * bs, 300) if (p % bs == 0) == whole and p != 100])
    writers = rng.choice([w for w in range(2, n) if w != 5])
    return dict(N_BRANCHES=n, BLOCK=bs, PROMPT_TOKENS=prompt, WRITERS=writers)


_FALLBACKS = (dict(N_BRANCHES=10, BLOCK=8, PROMPT_TOKENS=199, WRITERS=7),  # registry.Givens: two draws, frozen
              dict(N_BRANCHES=10, BLOCK=8, PROMPT_TOKENS=180, WRITERS=8))
G = givens(hidden=_hidden_divergence, fallbacks=_FALLBACKS)  # 5.3's: N_BRANCHES forked off one prompt, WRITERS of them wrote a token


def _divergence(g) -> dict:
    """Every in-use block's ref_count (sorted) once WRITERS branches wrote a token, and the copies once all did."""
    n, prompt, block_size, writers = g.N_BRANCHES, g.PROMPT_TOKENS, g.BLOCK, g.WRITERS
    alloc = BlockAllocator(-(-prompt // block_size) + 2 * n + 2, block_size)
    alloc.allocate(0, prompt)
    for b in range(1, n):
        alloc.fork(0, b)
    copies = sum(alloc.append_slot(b).cow is not None for b in range(writers))
    refs = sorted(alloc.ref_count(blk) for blk in range(alloc.num_blocks) if alloc.ref_count(blk))
    copies += sum(alloc.append_slot(b).cow is not None for b in range(writers, n))
    return {"refcounts": refs, "copies": copies}


def _divergence_keys(g) -> dict:
    """Each key's judge, and the plausible wrong pictures of the pool (sorted) with the remark naming each."""
    n, writers, want = g.N_BRANCHES, g.WRITERS, _divergence(g)
    full, tail = divmod(g.PROMPT_TOKENS, g.BLOCK)
    refs, copies = [], []
    if tail:
        refs = [(sorted([n] * (full + 1) + [1] * writers),
                 "Your shared tail still has all its references: each copy moves one reference off the original "
                 "tail block, so it is named by the branches that have not written yet."),
                (sorted([n] * full + [1] * writers), "The original tail block is missing: it is still in use, named "
                 "by the branches that have not written yet."),
                (sorted([n - writers] * (full + 1) + [1] * (writers * (full + 1))),
                 "You copied the full blocks too: a full block is never written again, so it stays shared by all "
                 "the branches — only the partly filled tail is copied.")]
        only_tail = "Only the partly filled tail block is copied; the full blocks are never written again."
        copies = [(n, "That counts a copy for every branch, as if one more sequence still held the prompt (the "
                      "lecture's Exercise 3 counts 8 copies so); in the vLLM paper's convention the prompt's own "
                      "sequence is the first branch, so the last branch to write finds the original tail with "
                      "ref_count 1 (everyone else has copied away) and writes in place."),
                  (writers, "That is the copies after the first writers; the question asks once every branch has "
                            "written."),
                  (n * (full + 1), only_tail), ((n - 1) * (full + 1), only_tail),
                  (0, "A branch's first token lands in the shared, partly filled tail, so writing it needs a private "
                      "copy.")]
    else:  # the prompt fills its last block: every first token starts a fresh block of its own
        refs = [(sorted([n] * (full - 1) + [n - writers] + [1] * writers),
                 "The prompt's last block is full: a branch's next token goes into a fresh block, and the full "
                 "block stays shared by everyone.")]
        copies = [(n - 1, "The prompt's last block is full, so nobody writes into a shared block: each first token "
                          "starts a fresh block and nothing is copied.")]
    return {"refcounts": {"judge": "refcounts_in_use", "writers": writers,
                          "mistakes": [(w, r) for w, r in refs if w != want["refcounts"]]},
            "copies": {"judge": "copies_after_all_write", "branches": n,
                       "mistakes": [(w, r) for w, r in copies if w != want["copies"]]}}


value(
    "5.3", "Reference counts after a divergence",
    hint="Draw it. The prompt fills PROMPT_TOKENS // BLOCK full blocks and a last, partly filled one; after the "
         "forks every block has ref_count N_BRANCHES. A branch's first token lands in that last block: while "
         "someone else still names it, the branch takes a private copy (ref_count 1) and the original loses one "
         "reference. Full blocks are never written again, so nothing happens to them. For the copies: follow the "
         "original tail's count down as branches leave it — what does the last branch find when it writes?",
    expected=_divergence, keys=_divergence_keys,
    forbid=("labsupport.block_allocator.BlockAllocator", "labsupport.kvcache.PagedKVCache",
            "labsupport.viz.sharing.board_blocks", "labsupport.measure.sharing.measure_fork_cost",
            "labsupport.viz.sharing.refcount_board_figure", "labsupport.measure.sharing.measure_fanout",
            "labsupport.viz.sharing.measure_fanout", "labsupport.ledger.fanout_blocks"),
    derive="work the reference counts out from N_BRANCHES, BLOCK, PROMPT_TOKENS and WRITERS rather than running "
           "the allocator",
)


_PREFIX_CASES = [[[1, 2, 3], [1, 2, 4], [5, 2, 3], [1, 2, 3, 9], [1], [2, 3]], [[7, 7, 7], [7, 7], [7, 8, 7]],
                 [[10, 11], [12], [10, 11, 12], [10, 12], [10, 11, 12, 13], [12]]]
CHAT_REQUESTS = 2000  # the long history's requests, as many as the lab's prompt says


@function(
    "5.4", "Prefix hits on a trace's hash ids",
    hint="A block can be served from the index only if the request's whole prefix up to and including that block "
         "was seen before — the same id after a different prefix is different content (its keys and values depend "
         "on everything before it). So walk each request's blocks from the start, key each block by the prefix "
         "that ends there, count a hit while the key is known, stop counting at the first miss, and remember "
         "every prefix of every request you have processed.",
    forbid=("labsupport.measure.sharing.replay_prefix_cache", "labsupport.workloads.prefix_hit_rate",
            "labsupport.block_allocator.BlockAllocator"),
    derive="walk each request's block ids from the start, keyed by the whole prefix, and count the hits",
    name="prefix_hit_blocks",
)
def _prefix_hits(rng):
    """Small tricky lists, a long conversation-like history (the same on every machine, trace or not) and short
    repetitive ones, each against the real allocator's prefix index."""
    cases = [(ids, f"the {len(ids):,}-request list {ids!r}") for ids in _PREFIX_CASES]
    cases.append((live(chat_hash_ids, rng.getrandbits(32), CHAT_REQUESTS), f"a {CHAT_REQUESTS:,}-request "
                  "conversation-like history (shared system prompts, multi-turn sessions)"))
    for _ in range(3):  # short, repetitive histories: most prefixes recur, some only after a detour
        alphabet = rng.randint(2, 6)
        ids = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(5, 60))]
        cases.append((ids, f"a {len(ids)}-request history of block ids drawn from {alphabet} values"))
    for ids, label in cases:
        want = replay_prefix_cache([tuple(r) for r in getattr(ids, "real", ids)]).hit_blocks
        yield case(ids, want=want, judge="prefix_hits", label=label, what=f"prefix_hit_blocks(...) on {label}")
