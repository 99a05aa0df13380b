"""The block allocator behind PagedAttention (§10.3–§10.5): block tables, ref counts, fork, copy-on-write, swap.

Cut the pool into fixed-size blocks of `block_size` tokens and keep a free list; each sequence
gets a block table mapping its logical block i to whichever physical block holds it (§10.3).  A
sequence grows by one block when its last one fills, so it wastes at most `block_size - 1` tokens.
Blocks are reference-counted, so `fork` shares a prompt among n branches and the first divergent
append copies only the shared last block (copy-on-write, §10.4).  `swap_out` / `swap_in` move a
preempted sequence's blocks out and back into possibly different blocks (§10.5).  A prefix index
that lets requests starting with the same tokens share blocks across requests (the seed of the
Nov 9 lecture) is a subclass, `labsupport.prefix_cache.PrefixCachingAllocator`.

The paged KV cache (`labsupport.kvcache`) puts real tensors behind these block ids; the engine
(`labsupport.engine`) drives it every step.
"""
from __future__ import annotations

from collections import deque
from typing import Hashable, Mapping, NamedTuple, Sequence

from labsupport.checks import as_count as _as_count
from labsupport.checks import check_fits_in_memory, shown
from labsupport.memory_stats import InvariantError, MemoryStats, OutOfBlocks, SwappedOut, UnknownSequence

__all__ = ["AppendResult", "BlockAllocator"]

# Python bookkeeping per block: a free-list entry and its int object, a ref count, and the prefix
# index's hash, key and generation slots (measured with tracemalloc on CPython 3.11: 72 B).
BOOKKEEPING_BYTES_PER_BLOCK = 72
_CHECK_MEMORY_ABOVE = 1 << 20  # blocks; smaller pools (64 MB of bookkeeping) fit any machine


def bookkeeping_bytes(num_blocks: int) -> int:
    """Host memory a BlockAllocator of `num_blocks` blocks needs for its own lists."""
    return num_blocks * BOOKKEEPING_BYTES_PER_BLOCK


class AppendResult(NamedTuple):
    """Where one more token goes, and the block copy the cache must make first (if any)."""

    slot: int  # block_id * block_size + offset
    cow: tuple[int, int] | None  # (src_block, dst_block) to copy before writing slot


class BlockAllocator:
    """Fixed-size blocks, a free list and reference counts: the allocator behind PagedAttention.

    Each sequence owns a block table (logical block i -> physical block id).  A sequence grows by
    one block when its last block is full; `fork` shares every block (ref_count + 1); the first
    append to a shared, partly filled last block copies it (copy-on-write).  `swap_out` releases a
    sequence's blocks and remembers its length; `swap_in` gives it fresh, possibly different blocks.

    `block_tables` holds the resident sequences; `seq_lens` holds resident and swapped-out ones.
    Every public operation either completes or raises before changing anything.
    """

    def __init__(self, num_blocks: int, block_size: int, *, kv_bytes_per_token: int | None = None):
        self.num_blocks = _as_count("num_blocks", num_blocks, 1)
        self.block_size = _as_count("block_size", block_size, 1)
        if self.num_blocks > _CHECK_MEMORY_ABOVE:
            check_fits_in_memory(f"a pool of {self.num_blocks:,} blocks", bookkeeping_bytes(self.num_blocks))
        self.kv_bytes_per_token = (None if kv_bytes_per_token is None
                                   else _as_count("kv_bytes_per_token", kv_bytes_per_token, 1))
        self.block_tables: dict[Hashable, list[int]] = {}  # resident sequences only
        self.seq_lens: dict[Hashable, int] = {}  # resident and swapped-out sequences
        self._ref = [0] * self.num_blocks
        self._free: deque[int] = deque(range(self.num_blocks))  # FIFO: a freed block is reused last
        self._swapped: set = set()

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation may take."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def cached_tokens(self, seq_id: Hashable) -> int:
        """Leading tokens of a sequence whose KV another request already wrote (0 without a prefix index)."""
        return 0

    def ref_count(self, block_id: int) -> int:
        b = _as_count("block_id", block_id, 0)
        if b >= self.num_blocks:
            raise ValueError(f"block_id must be < num_blocks={self.num_blocks}, got {b}")
        return self._ref[b]

    def ref_counts(self) -> list[int]:
        return list(self._ref)

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order they will be handed out."""
        return list(self._free)

    def block_state(self, block_id: int) -> str:
        """'used' or 'free' -- what a lab colours the pool by."""
        return "used" if self.ref_count(block_id) else "free"

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-_as_count("num_tokens", num_tokens, 0) // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return _as_count("num_blocks", num_blocks, 0) <= self.num_free_blocks

    def is_swapped(self, seq_id: Hashable) -> bool:
        try:
            return seq_id in self._swapped
        except TypeError:
            raise UnknownSequence.unhashable(seq_id) from None

    def table(self, seq_id: Hashable) -> list[int]:
        return list(self._resident(seq_id))

    def slot_mapping(self, seq_id: Hashable, start: int, end: int) -> list[int]:
        """Physical slots of token positions [start, end) of a resident sequence."""
        table = self._resident(seq_id)
        n = self.seq_lens[seq_id]
        start = _as_count("start", start, 0)
        end = _as_count("end", end, 0)
        if not start <= end <= n:
            raise ValueError(f"need 0 <= start <= end <= {n} (length of {seq_id!r}), got start={start}, end={end}")
        bs = self.block_size
        return [table[i // bs] * bs + i % bs for i in range(start, end)]

    def _resident(self, seq_id) -> list[int]:
        """The live block table of a resident sequence; an unknown, unhashable or swapped-out (§10.5) id is
        refused by name.  Every operation on a resident sequence looks it up here."""
        try:
            table = self.block_tables.get(seq_id)
        except TypeError:
            raise UnknownSequence.unhashable(seq_id) from None
        if table is None:
            self._raise_missing(seq_id)
        return table

    def _raise_missing(self, seq_id):
        if self.is_swapped(seq_id):
            raise SwappedOut(f"sequence {shown(seq_id)} is swapped out; swap_in({shown(seq_id)}) first")
        raise UnknownSequence(f"unknown sequence {shown(seq_id)}: never allocated or already freed")

    def _check_new(self, seq_id) -> None:
        try:
            if seq_id not in self.seq_lens:
                return
        except TypeError:
            raise ValueError(f"sequence id must be hashable, got {type(seq_id).__name__} {shown(seq_id)}") from None
        state = "swapped out" if seq_id in self._swapped else "resident"
        raise ValueError(f"sequence {shown(seq_id)} already exists ({state}); free it first or pick a new id")

    def _out_of_blocks(self, need: int, what: str) -> OutOfBlocks:
        free = self.num_free_blocks
        return OutOfBlocks(f"{what}: needs {need} free block(s), {free} of {self.num_blocks} free "
                           f"(block_size={self.block_size})", needed=need, free=free)

    # -- the hot path ----------------------------------------------------------------------------
    def _take_block(self) -> int:
        b = self._free.popleft()
        self._ref[b] = 1
        return b

    def _release_block(self, b: int) -> None:
        r = self._ref[b] - 1
        self._ref[b] = r
        if not r:
            self._return_free(b)

    def _return_free(self, b: int) -> None:
        """Where a block nobody holds goes: to the back of the free list (a subclass may keep it findable)."""
        self._free.append(b)

    # -- sequence operations ---------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, num_tokens: int, token_ids: Sequence[int] | None = None) -> list[int]:
        """Give a new sequence blocks for `num_tokens` tokens; returns its block table.

        `token_ids`, when given, must be the prompt's ids; a prefix index reads them (this allocator
        only checks them).
        """
        num_tokens, token_ids = self._check_allocate(seq_id, num_tokens, token_ids)
        n = -(-num_tokens // self.block_size)
        free = self._free
        if n > len(free):
            raise self._out_of_blocks(n, f"allocate {seq_id!r} ({num_tokens} tokens)")
        ref = self._ref
        table = []
        for _ in range(n):
            b = free.popleft()
            ref[b] = 1
            table.append(b)
        self.block_tables[seq_id] = table
        self.seq_lens[seq_id] = num_tokens
        return table[:]

    def _check_allocate(self, seq_id, num_tokens, token_ids) -> tuple[int, list[int] | None]:
        self._check_new(seq_id)
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = _as_count("num_tokens", num_tokens, 0)
        if token_ids is not None:
            if isinstance(token_ids, (str, bytes)) or not hasattr(token_ids, "__iter__"):
                raise ValueError(f"token_ids must be a sequence of integer token ids, got {shown(token_ids)}")
            token_ids = [_as_count("token id", t, 0) for t in token_ids]
            if len(token_ids) != num_tokens:
                raise ValueError(f"token_ids has {len(token_ids)} ids but num_tokens={num_tokens}")
        return num_tokens, token_ids

    def append_slot(self, seq_id: Hashable, token_id: int | None = None) -> AppendResult:
        """Reserve the slot of one more token of a resident sequence.

        A full (or missing) last block means a fresh block; a shared, partly filled last block is
        copied first (copy-on-write): `cow=(src, dst)` tells the cache which block to copy.
        `token_id` is the token's id, which a prefix index needs to register the block it completes.
        """
        table = self._resident(seq_id)
        if token_id is not None:
            token_id = _as_count("token_id", token_id, 0)
        n = self.seq_lens[seq_id]
        bs = self.block_size
        off = n % bs
        cow = None
        if off == 0:
            if not self._free and not self.num_free_blocks:  # (a subclass may keep other free blocks)
                raise self._out_of_blocks(1, f"append to {seq_id!r}")
            b = self._take_block()
            table.append(b)
        else:
            b = table[-1]
            if self._ref[b] > 1:
                if not self._free and not self.num_free_blocks:
                    raise self._out_of_blocks(1, f"copy-on-write for {seq_id!r}")
                src = b
                b = self._take_block()
                self._ref[src] -= 1
                table[-1] = b
                cow = (src, b)
        self.seq_lens[seq_id] = n + 1
        return AppendResult(b * bs + off, cow)

    def append_slots(self, seq_ids: Sequence[Hashable], token_ids: Sequence[int] | None = None) -> list[AppendResult]:
        """`append_slot` for a whole decode batch, all or nothing.

        The blocks the batch needs are counted first (a fresh block per full sequence; one copy per
        shared last block while it is still shared), so a batch that does not fit changes nothing.
        """
        seq_ids = list(seq_ids)
        tables = [self._resident(s) for s in seq_ids]  # unknown, swapped-out or unhashable ids: refused here
        if len(set(seq_ids)) != len(seq_ids):
            dup = next(s for s in seq_ids if seq_ids.count(s) > 1)
            raise ValueError(f"sequence {shown(dup)} appears twice in one decode batch")
        if token_ids is not None:
            token_ids = [_as_count("token_id", t, 0) for t in token_ids]
            if len(token_ids) != len(seq_ids):
                raise ValueError(f"token_ids has {len(token_ids)} entries for {len(seq_ids)} sequences")
        bs = self.block_size
        need = 0
        refs_left: dict[int, int] = {}
        for s, table in zip(seq_ids, tables):
            if self.seq_lens[s] % bs == 0:
                need += 1
            else:
                last = table[-1]
                r = refs_left.get(last, self._ref[last])
                if r > 1:
                    need += 1
                    refs_left[last] = r - 1
        if need > self.num_free_blocks:
            raise self._out_of_blocks(need, f"decode step for {len(seq_ids)} sequences")
        if token_ids is None:
            return [self.append_slot(s) for s in seq_ids]
        return [self.append_slot(s, t) for s, t in zip(seq_ids, token_ids)]

    def fork(self, parent_id: Hashable, child_id: Hashable) -> list[int]:
        """The child shares every block of the parent (ref_count + 1 each); returns its table."""
        table = self._resident(parent_id)
        self._check_new(child_id)
        ref = self._ref
        for b in table:
            ref[b] += 1
        self.block_tables[child_id] = list(table)
        self.seq_lens[child_id] = self.seq_lens[parent_id]
        return list(table)

    def free(self, seq_id: Hashable) -> None:
        """Forget a sequence (resident or swapped out); its blocks return to the pool when unshared."""
        try:
            table = self.block_tables.get(seq_id)
        except TypeError:
            raise UnknownSequence.unhashable(seq_id) from None
        if table is None:
            if seq_id not in self._swapped:
                self._raise_missing(seq_id)
            self._swapped.discard(seq_id)
        else:
            del self.block_tables[seq_id]
            # tail first: a cached prefix's leading blocks are freed last, hence evicted last
            for b in reversed(table):
                self._release_block(b)
        del self.seq_lens[seq_id]

    def swap_out(self, seq_id: Hashable) -> list[int]:
        """Release a resident sequence's blocks (shared ones stay with their other holders) and mark
        it swapped; returns the block table it had, so the cache knows what to copy out first."""
        table = self._resident(seq_id)
        del self.block_tables[seq_id]
        for b in reversed(table):
            self._release_block(b)
        self._swapped.add(seq_id)
        return table

    def swap_in(self, seq_id: Hashable) -> list[int]:
        """Fresh blocks for a swapped-out sequence (sharing is not restored); returns the new table."""
        if not self.is_swapped(seq_id):
            if seq_id in self.block_tables:
                raise ValueError(f"sequence {seq_id!r} is not swapped out (it is resident)")
            self._raise_missing(seq_id)
        n = self.blocks_needed(self.seq_lens[seq_id])
        if n > self.num_free_blocks:
            raise self._out_of_blocks(n, f"swap_in {seq_id!r} ({self.seq_lens[seq_id]} tokens)")
        table = [self._take_block() for _ in range(n)]
        self._swapped.discard(seq_id)
        self.block_tables[seq_id] = table
        return list(table)

    # -- accounting and checks -------------------------------------------------------------------
    def stats(self, final_lens: Mapping[Hashable, int] | None = None, kv_bytes_per_token: int | None = None) -> MemoryStats:
        """Token-slot accounting of the pool.

        Without `final_lens`, each sequence's unfilled tail is internal fragmentation (the lecture's
        "at most b - 1 tokens").  With the final lengths, the part of that tail the sequence will
        still fill is reservation instead.  Paged memory has no external fragmentation: any free
        block serves any request.
        """
        bs = self.block_size
        reserved = self.num_used_blocks * bs
        logical = sum(self.seq_lens[s] for s in self.block_tables)
        if max(self._ref, default=0) <= 1:
            occupied = logical
        else:  # a shared block holds the longest of its holders' fills, once
            fill: dict[int, int] = {}
            for s, table in self.block_tables.items():
                n = self.seq_lens[s]
                for i, b in enumerate(table):
                    f = min(bs, n - i * bs)
                    if fill.get(b, 0) < f:
                        fill[b] = f
            occupied = sum(fill.values())
        reservation = 0
        if final_lens is not None:
            for s, table in self.block_tables.items():
                if table and self._ref[table[-1]] == 1:  # a shared tail is copied before it grows
                    n = self.seq_lens[s]
                    final = max(n, final_lens.get(s, n))
                    reservation += min(final, len(table) * bs) - n
        kv = self.kv_bytes_per_token if kv_bytes_per_token is None else kv_bytes_per_token
        return MemoryStats(self.num_blocks * bs, reserved, occupied, reservation,
                           reserved - occupied - reservation, 0, logical, kv)

    def snapshot(self) -> dict:
        """A deep copy of all bookkeeping (for labs to draw and tests to compare)."""
        return {
            "block_tables": {s: list(t) for s, t in self.block_tables.items()},
            "seq_lens": dict(self.seq_lens),
            "ref_counts": list(self._ref),
            "free": list(self._free),
            "swapped": set(self._swapped),
        }

    def check_invariants(self) -> None:
        """Raise InvariantError unless the bookkeeping is consistent (see the class docstring)."""
        nb, bs = self.num_blocks, self.block_size
        free = self.free_block_ids()
        if len(set(free)) != len(free):
            raise InvariantError("a block appears twice in the free lists")
        counts = [0] * nb
        for s, table in self.block_tables.items():
            if s in self._swapped:
                raise InvariantError(f"sequence {s!r} is both resident and swapped out")
            if len(set(table)) != len(table):
                raise InvariantError(f"sequence {s!r} names a block twice: {table}")
            if s not in self.seq_lens or len(table) != -(-self.seq_lens[s] // bs):
                raise InvariantError(f"sequence {s!r}: {len(table)} blocks for {self.seq_lens.get(s)} tokens")
            for b in table:
                if not 0 <= b < nb:
                    raise InvariantError(f"sequence {s!r} names block {b} outside the pool")
                counts[b] += 1
        if counts != self._ref:
            bad = [b for b in range(nb) if counts[b] != self._ref[b]]
            raise InvariantError(f"ref_count disagrees with the block tables for blocks {bad[:10]}")
        free_set = set(free)
        used = {b for b in range(nb) if counts[b]}
        if used & free_set:
            raise InvariantError(f"blocks both free and used: {sorted(used & free_set)[:10]}")
        if len(used) + len(free_set) != nb:
            raise InvariantError(f"free ({len(free_set)}) + used ({len(used)}) != total ({nb})")
        if set(self.seq_lens) != set(self.block_tables) | self._swapped:
            raise InvariantError("seq_lens does not cover exactly the resident and swapped-out sequences")
