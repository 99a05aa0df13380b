"""A prefix index over the block allocator: requests that start with the same tokens share blocks (§10.4).

The seed of the Nov 9 lecture, and what lab 05 replays a Mooncake trace through.  Each full block
whose token ids are known is entered in an index under a hash chained with the previous block's
hash; a later `allocate` with the same leading token ids reuses those blocks
(`num_cached_tokens[seq_id]` says how many tokens that covered).  A hit is verified, not trusted:
the stored token ids must match and the stored parent must be the very block (and generation)
matched one position earlier, so a hash collision can cost a hit but never share wrong content.
Freed indexed blocks stay cached (least recently freed are evicted first) until the pool needs them.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Sequence

from labsupport.block_allocator import AppendResult, BlockAllocator
from labsupport.checks import shown
from labsupport.memory_stats import InvariantError

__all__ = ["PrefixCachingAllocator"]


class PrefixCachingAllocator(BlockAllocator):
    """`BlockAllocator` with a prefix index: blocks are shared across requests by content."""

    def __init__(self, num_blocks: int, block_size: int, *, kv_bytes_per_token: int | None = None,
                 hash_fn: Callable[[object], int] = hash):
        if not callable(hash_fn):
            raise ValueError(f"hash_fn must be a function of a tuple, got {shown(hash_fn)}")
        super().__init__(num_blocks, block_size, kv_bytes_per_token=kv_bytes_per_token)
        self._hash_fn = hash_fn
        self.num_cached_tokens: dict[Hashable, int] = {}  # tokens served by the prefix index at allocate
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free blocks still holding indexed content
        self._index: dict[int, int] = {}  # chained hash -> block id
        self._block_hash: list[int | None] = [None] * self.num_blocks
        self._block_key: list[tuple | None] = [None] * self.num_blocks  # (parent block, parent gen, token ids)
        self._gen = [0] * self.num_blocks  # bumped whenever a block gets new content
        self._tokens: dict[Hashable, list[int] | None] = {}
        self._hashes: dict[Hashable, list[int]] = {}

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation may take, including cached ones it would evict."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._cached_free)

    def cached_tokens(self, seq_id: Hashable) -> int:
        return self.num_cached_tokens.get(seq_id, 0)

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order they will be handed out (clean ones first, then cached LRU)."""
        return list(self._free) + list(self._cached_free)

    def block_state(self, block_id: int) -> str:
        """'used', 'cached' (free but still indexed) or 'free' -- what a lab colours the pool by."""
        if self.ref_count(block_id):
            return "used"
        return "cached" if block_id in self._cached_free else "free"

    # -- blocks in and out -----------------------------------------------------------------------
    def _take_block(self) -> int:
        if self._free:
            b = self._free.popleft()
        else:  # evict the least recently freed cached block
            b, _ = self._cached_free.popitem(last=False)
            h = self._block_hash[b]
            if self._index.get(h) == b:
                del self._index[h]
            self._block_hash[b] = self._block_key[b] = None
        self._gen[b] += 1
        self._ref[b] = 1
        return b

    def _return_free(self, b: int) -> None:
        if self._block_hash[b] is None:
            self._free.append(b)
        else:  # keep its content findable until the pool needs the block
            self._cached_free[b] = None

    # -- sequence operations ---------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, num_tokens: int, token_ids: Sequence[int] | None = None) -> list[int]:
        """Blocks for a new sequence; with `token_ids`, its leading full blocks found in the index are
        shared and its new full blocks are entered in the index."""
        num_tokens, token_ids = self._check_allocate(seq_id, num_tokens, token_ids)
        bs = self.block_size
        n = -(-num_tokens // bs)
        hashes = self._chain_hashes(token_ids, 0, num_tokens // bs, -1) if token_ids is not None else []
        hits = self._match(token_ids, hashes)
        need = n - len(hits) + sum(1 for b in hits if self._ref[b] == 0)
        if need > self.num_free_blocks:
            raise self._out_of_blocks(need, f"allocate {seq_id!r} ({num_tokens} tokens, {len(hits)} cached blocks)")
        table = []
        for b in hits:  # revive cached blocks before taking new ones, so eviction cannot pick them
            if self._ref[b] == 0:
                del self._cached_free[b]
            self._ref[b] += 1
            table.append(b)
        for _ in range(n - len(hits)):
            table.append(self._take_block())
        self.block_tables[seq_id] = table
        self.seq_lens[seq_id] = num_tokens
        self.num_cached_tokens[seq_id] = len(hits) * bs
        self._tokens[seq_id] = token_ids
        self._hashes[seq_id] = hashes
        if token_ids is not None:
            for i in range(len(hits), len(hashes)):
                self._register(table, i, hashes[i], token_ids)
        return list(table)

    def append_slot(self, seq_id: Hashable, token_id: int | None = None) -> AppendResult:
        result = super().append_slot(seq_id, token_id)
        self._track_token(seq_id, self.block_tables[seq_id], self.seq_lens[seq_id], token_id)
        return result

    def fork(self, parent_id: Hashable, child_id: Hashable) -> list[int]:
        table = super().fork(parent_id, child_id)
        toks = self._tokens.get(parent_id)
        self._tokens[child_id] = None if toks is None else list(toks)
        self._hashes[child_id] = list(self._hashes.get(parent_id, ()))
        self.num_cached_tokens[child_id] = 0
        return table

    def free(self, seq_id: Hashable) -> None:
        super().free(seq_id)
        self.num_cached_tokens.pop(seq_id, None)
        self._tokens.pop(seq_id, None)
        self._hashes.pop(seq_id, None)

    def swap_in(self, seq_id: Hashable) -> list[int]:
        table = super().swap_in(seq_id)
        toks = self._tokens.get(seq_id)
        if toks is not None:
            hashes = self._hashes[seq_id]
            for i in range(len(hashes)):
                self._register(table, i, hashes[i], toks)
        return table

    # -- the index -------------------------------------------------------------------------------
    def _chain_hashes(self, token_ids, start_block, end_block, prev) -> list[int]:
        bs, h, out = self.block_size, prev, []
        for i in range(start_block, end_block):
            h = self._hash_fn((h, tuple(token_ids[i * bs:(i + 1) * bs])))
            out.append(h)
        return out

    def _match(self, token_ids, hashes) -> list[int]:
        """Leading blocks whose content is verified equal to token_ids' leading full blocks."""
        hits: list[int] = []
        bs, parent, parent_gen = self.block_size, -1, 0
        for i, h in enumerate(hashes):
            b = self._index.get(h)
            if b is None or self._block_key[b] != (parent, parent_gen, tuple(token_ids[i * bs:(i + 1) * bs])):
                break
            hits.append(b)
            parent, parent_gen = b, self._gen[b]
        return hits

    def _register(self, table, i, h, token_ids) -> None:
        """Enter full block i of a sequence in the index, unless the hash already names a block."""
        if h in self._index:
            return
        b = table[i]
        bs = self.block_size
        parent = table[i - 1] if i else -1
        self._index[h] = b
        self._block_hash[b] = h
        self._block_key[b] = (parent, self._gen[parent] if i else 0, tuple(token_ids[i * bs:(i + 1) * bs]))

    def _track_token(self, seq_id, table, n, token_id) -> None:
        toks = self._tokens.get(seq_id)
        if toks is None:
            return
        if token_id is None:  # content unknown from here on: stop indexing this sequence
            self._tokens[seq_id] = None
            return
        toks.append(token_id)
        bs = self.block_size
        if n % bs == 0:
            hashes = self._hashes[seq_id]
            i = n // bs - 1
            hashes.extend(self._chain_hashes(toks, i, i + 1, hashes[-1] if hashes else -1))
            self._register(table, i, hashes[i], toks)

    # -- accounting and checks -------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {**super().snapshot(), "cached_free": list(self._cached_free), "index": dict(self._index),
                "num_cached_tokens": dict(self.num_cached_tokens),
                "tokens": {s: (None if t is None else list(t)) for s, t in self._tokens.items()}}

    def check_invariants(self) -> None:
        super().check_invariants()
        bs, free, cached = self.block_size, list(self._free), list(self._cached_free)
        counts = self._ref
        for h, b in self._index.items():
            if self._block_hash[b] != h:
                raise InvariantError(f"index names block {b} under a hash it does not carry")
            if not (counts[b] or b in self._cached_free):
                raise InvariantError(f"index names block {b}, which is neither live nor cached")
        for b in cached:
            h = self._block_hash[b]
            if h is None or self._index.get(h) != b:
                raise InvariantError(f"cached-free block {b} is not in the index")
        for b in free:
            if self._block_hash[b] is not None:
                raise InvariantError(f"clean-free block {b} still carries an index entry")
        for s, table in self.block_tables.items():  # indexed content is what its holders hold
            toks = self._tokens.get(s)
            if toks is None:
                continue
            for i, b in enumerate(table[: len(toks) // bs]):
                key = self._block_key[b]
                if key is not None and key[2] != tuple(toks[i * bs:(i + 1) * bs]):
                    raise InvariantError(f"block {b} is indexed with content sequence {s!r} does not hold")
