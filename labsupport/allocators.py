"""KV-cache allocators: reserve-to-max, per-request contiguous slots, and paged blocks (§10.2–§10.4).

Three ways to hand out KV memory, all measured in the same units so a lab can put them side by side:

* `ReserveToMaxAllocator` (§10.2): every sequence gets one contiguous slot of S_max tokens.
* `ContiguousAllocator` (§10.2, Exercise 2): every request declares its own S_max; slots of varying
  size are placed first-fit in one address space, so retiring sequences leaves holes and a request
  can be refused while more than enough memory is free in total (`Refusal` shows exactly that).
  `OrcaAllocator` sizes the slot with the vLLM paper's Orca(Max) / Orca(Pow2) / Orca(Oracle)
  reservation policies (Kwon et al., SOSP 2023, §6.1).
* `BlockAllocator` (§10.3–§10.4): fixed-size blocks, a free list, reference counts, fork,
  copy-on-write on the first divergent append, swap out/in, and an optional prefix index.

`MemoryStats` splits every byte of the pool the way the vLLM paper's Fig. 2 does: token states,
reservation (slots a live request will still fill), internal fragmentation (reserved slots it will
never fill) and external fragmentation (free space in holes too small for the next request).
`simulate_breakdown` / `fig2_breakdown` replay a real length distribution through each allocator to
reproduce the shape of that figure.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Mapping, NamedTuple, Sequence

from .args import as_count as _as_count

__all__ = [
    "OutOfBlocks", "ReservationExceeded", "UnknownSequence", "SwappedOut", "InvariantError",
    "MemoryStats", "Refusal", "Slot", "ContiguousAllocator", "ReserveToMaxAllocator", "OrcaAllocator",
    "orca_reservation", "next_pow2", "AppendResult", "BlockAllocator", "Breakdown",
    "simulate_breakdown", "fig2_breakdown", "ORCA_POLICIES",
]


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class OutOfBlocks(RuntimeError):
    """The pool cannot satisfy the request right now.  The allocator's state is unchanged."""

    def __init__(self, message: str, *, needed: int | None = None, free: int | None = None,
                 refusal: "Refusal | None" = None):
        super().__init__(message)
        self.needed = needed
        self.free = free
        self.refusal = refusal


class ReservationExceeded(OutOfBlocks):
    """A contiguous sequence tried to grow past its own slot (it cannot be moved, §10.2)."""


class UnknownSequence(KeyError):
    """No sequence by that id: never allocated, or already freed."""

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0])


class SwappedOut(ValueError):
    """The sequence's KV is in host memory; swap it in before using it."""


class InvariantError(AssertionError):
    """`check_invariants` found the allocator's bookkeeping inconsistent."""


# ---------------------------------------------------------------------------------------------
# Shared statistics
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryStats:
    """Where every token-slot of a KV pool is, in the vLLM paper's categories (§3, Fig. 2).

    reserved = occupied + reservation + internal;  capacity = reserved + free;
    external <= free is the part of free that sits in holes too small for the next request.
    `occupied_tokens` counts physical token states (a block shared by several sequences counts
    once); `logical_tokens` counts every sequence's tokens, so it exceeds occupied under sharing.
    """

    capacity_tokens: int
    reserved_tokens: int
    occupied_tokens: int
    reservation_tokens: int
    internal_tokens: int
    external_tokens: int
    logical_tokens: int
    kv_bytes_per_token: int | None = None

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.reserved_tokens

    def to_bytes(self, tokens: int) -> int:
        if self.kv_bytes_per_token is None:
            raise ValueError("kv_bytes_per_token is unknown: pass it to the allocator (or to stats()) "
                             "to get byte figures")
        return tokens * self.kv_bytes_per_token

    capacity_bytes = property(lambda self: self.to_bytes(self.capacity_tokens))
    reserved_bytes = property(lambda self: self.to_bytes(self.reserved_tokens))
    occupied_bytes = property(lambda self: self.to_bytes(self.occupied_tokens))
    free_bytes = property(lambda self: self.to_bytes(self.free_tokens))
    reservation_bytes = property(lambda self: self.to_bytes(self.reservation_tokens))
    internal_bytes = property(lambda self: self.to_bytes(self.internal_tokens))
    external_bytes = property(lambda self: self.to_bytes(self.external_tokens))

    def shares(self) -> dict[str, float]:
        """Fractions of capacity; they sum to 1.  'free' is free space a request could still use."""
        c = self.capacity_tokens or 1
        return {
            "token_states": self.occupied_tokens / c,
            "reservation": self.reservation_tokens / c,
            "internal_fragmentation": self.internal_tokens / c,
            "external_fragmentation": self.external_tokens / c,
            "free": (self.free_tokens - self.external_tokens) / c,
        }

    def as_dict(self) -> dict[str, float]:
        d = {
            "capacity_tokens": self.capacity_tokens, "reserved_tokens": self.reserved_tokens,
            "occupied_tokens": self.occupied_tokens, "free_tokens": self.free_tokens,
            "reservation_tokens": self.reservation_tokens, "internal_tokens": self.internal_tokens,
            "external_tokens": self.external_tokens, "logical_tokens": self.logical_tokens,
        }
        if self.kv_bytes_per_token is not None:
            d.update({k.replace("_tokens", "_bytes"): v * self.kv_bytes_per_token for k, v in list(d.items())})
        return d


# ---------------------------------------------------------------------------------------------
# Contiguous allocators (§10.2)
# ---------------------------------------------------------------------------------------------


@dataclass
class Slot:
    """One sequence's contiguous reservation: [offset, offset + size) in token slots."""

    offset: int
    size: int
    length: int  # tokens stored so far
    final: int | None = None  # the length it will reach, when the caller knows it (for stats)


@dataclass(frozen=True)
class Refusal:
    """Why a contiguous request was refused: compare `free_tokens` with `largest_hole_tokens`."""

    seq_id: Hashable
    requested_tokens: int
    free_tokens: int
    largest_hole_tokens: int
    kv_bytes_per_token: int | None = None

    @property
    def fragmented(self) -> bool:
        """True when enough memory is free in total but no single hole is large enough."""
        return self.free_tokens >= self.requested_tokens > self.largest_hole_tokens

    def _fmt(self, tokens: int) -> str:
        if self.kv_bytes_per_token is None:
            return f"{tokens:,} tokens"
        return f"{tokens:,} tokens = {tokens * self.kv_bytes_per_token:,} B"

    def __str__(self) -> str:
        why = ("external fragmentation: enough is free in total, but not in one piece"
               if self.fragmented else "not enough free memory")
        return (f"refused sequence {self.seq_id!r}: needs {self._fmt(self.requested_tokens)} contiguous; "
                f"free {self._fmt(self.free_tokens)} in total, largest hole "
                f"{self._fmt(self.largest_hole_tokens)} ({why})")


class ContiguousAllocator:
    """Per-request S_max: variable-size contiguous slots placed first-fit in one address space.

    `allocate(seq, s_max)` reserves s_max token slots for that request; the sequence may grow
    into them and no further.  Freed slots become holes, merged with free neighbours.  Nothing
    is ever moved, which is what makes the slot kernel-friendly and what fragments the space.
    """

    def __init__(self, capacity_tokens: int, *, kv_bytes_per_token: int | None = None):
        self.capacity_tokens = _as_count("capacity_tokens", capacity_tokens, 1)
        self.kv_bytes_per_token = (None if kv_bytes_per_token is None
                                   else _as_count("kv_bytes_per_token", kv_bytes_per_token, 1))
        self.slots: dict[Hashable, Slot] = {}
        self._holes: list[list[int]] = [[0, self.capacity_tokens]]  # [offset, size], sorted by offset

    @classmethod
    def from_budget(cls, budget_bytes: float, kv_bytes_per_token: int, **kwargs):
        """A pool of floor(budget / kv_bytes_per_token) token slots."""
        if not budget_bytes > 0:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes!r}")
        kv = _as_count("kv_bytes_per_token", kv_bytes_per_token, 1)
        return cls(int(budget_bytes // kv), kv_bytes_per_token=kv, **kwargs)

    # -- queries ---------------------------------------------------------------------------------
    @property
    def free_tokens(self) -> int:
        return sum(size for _, size in self._holes)

    @property
    def reserved_tokens(self) -> int:
        return self.capacity_tokens - self.free_tokens

    @property
    def largest_hole(self) -> int:
        return max((size for _, size in self._holes), default=0)

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    def holes(self) -> list[tuple[int, int]]:
        """Free (offset, size) runs in address order."""
        return [(o, s) for o, s in self._holes]

    def layout(self) -> list[tuple[int, int, Hashable | None]]:
        """(offset, size, seq_id or None for a hole) covering the whole address space, in order."""
        parts = [(s.offset, s.size, sid) for sid, s in self.slots.items()] + [(o, s, None) for o, s in self._holes]
        return sorted(parts, key=lambda p: p[0])

    def fits(self, reserve_tokens: int) -> bool:
        return self._first_fit(_as_count("reserve_tokens", reserve_tokens, 1)) is not None

    def refusal_for(self, seq_id: Hashable, reserve_tokens: int) -> Refusal:
        return Refusal(seq_id, reserve_tokens, self.free_tokens, self.largest_hole, self.kv_bytes_per_token)

    def _first_fit(self, size: int) -> int | None:
        for i, (_, hole) in enumerate(self._holes):
            if hole >= size:
                return i
        return None

    # -- operations ------------------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, s_max: int, num_tokens: int = 0, final_tokens: int | None = None) -> Slot:
        """Reserve `s_max` contiguous token slots for a new sequence already holding `num_tokens`.

        `final_tokens` (optional) is the length the sequence will actually reach; it only feeds
        the reservation/internal-fragmentation split in `stats()`.  Raises OutOfBlocks carrying a
        `Refusal` when no hole is large enough; nothing changes then.
        """
        return self._place(seq_id, s_max, num_tokens, final_tokens)

    def _place(self, seq_id, size, num_tokens, final_tokens) -> Slot:
        if seq_id in self.slots:
            raise ValueError(f"sequence {seq_id!r} already holds a slot")
        size = _as_count("s_max", size, 1)
        num_tokens = _as_count("num_tokens", num_tokens, 0)
        if num_tokens > size:
            raise ValueError(f"num_tokens={num_tokens} does not fit in its own slot of s_max={size}")
        if final_tokens is not None:
            final_tokens = _as_count("final_tokens", final_tokens, 0)
            if final_tokens < num_tokens:
                raise ValueError(f"final_tokens={final_tokens} is below num_tokens={num_tokens}")
        i = self._first_fit(size)
        if i is None:
            refusal = self.refusal_for(seq_id, size)
            raise OutOfBlocks(str(refusal), needed=size, free=refusal.free_tokens, refusal=refusal)
        hole = self._holes[i]
        slot = Slot(hole[0], size, num_tokens, final_tokens)
        if hole[1] == size:
            del self._holes[i]
        else:
            hole[0] += size
            hole[1] -= size
        self.slots[seq_id] = slot
        return slot

    def append(self, seq_id: Hashable, num_tokens: int = 1) -> int:
        """Grow a sequence inside its slot; returns the new length."""
        slot = self._slot(seq_id)
        num_tokens = _as_count("num_tokens", num_tokens, 0)
        if slot.length + num_tokens > slot.size:
            raise ReservationExceeded(
                f"sequence {seq_id!r} cannot grow to {slot.length + num_tokens} tokens: its slot holds "
                f"{slot.size} (a contiguous slot cannot grow past its own reservation)",
                needed=slot.length + num_tokens - slot.size, free=slot.size - slot.length)
        slot.length += num_tokens
        return slot.length

    def free(self, seq_id: Hashable) -> None:
        slot = self._slot(seq_id)
        del self.slots[seq_id]
        start, end = slot.offset, slot.offset + slot.size
        holes = self._holes
        i = 0
        while i < len(holes) and holes[i][0] < start:
            i += 1
        holes.insert(i, [start, slot.size])
        # merge with the right neighbour, then the left one
        if i + 1 < len(holes) and holes[i + 1][0] == end:
            holes[i][1] += holes[i + 1][1]
            del holes[i + 1]
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == start:
            holes[i - 1][1] += holes[i][1]
            del holes[i]

    def _slot(self, seq_id) -> Slot:
        try:
            return self.slots[seq_id]
        except KeyError:
            raise UnknownSequence(f"unknown sequence {seq_id!r}: never allocated or already freed") from None
        except TypeError:
            raise UnknownSequence(f"unknown sequence {seq_id!r}: not a hashable id") from None

    # -- accounting ------------------------------------------------------------------------------
    def stats(self, next_request_tokens: int | None = None) -> MemoryStats:
        """Token-slot accounting.  External fragmentation is the free space in holes smaller than
        `next_request_tokens` (the lecture's "too small for the next request"); without a next
        request it is the free space outside the largest hole."""
        occupied = reservation = internal = 0
        for s in self.slots.values():
            final = s.length if s.final is None else max(s.final, s.length)
            usable = min(final, s.size)
            occupied += s.length
            reservation += usable - s.length
            internal += s.size - usable
        sizes = [size for _, size in self._holes]
        if next_request_tokens is None:
            external = sum(sizes) - max(sizes, default=0)
        else:
            r = _as_count("next_request_tokens", next_request_tokens, 0)
            external = sum(size for size in sizes if size < r)
        return MemoryStats(self.capacity_tokens, self.capacity_tokens - sum(sizes), occupied, reservation,
                           internal, external, occupied, self.kv_bytes_per_token)

    def check_invariants(self) -> None:
        """Slots and holes tile [0, capacity) exactly; holes are coalesced; lengths fit."""
        parts = self.layout()
        pos = 0
        prev_hole = False
        for offset, size, sid in parts:
            if offset != pos or size <= 0:
                raise InvariantError(f"address space not tiled at {pos}: next piece {(offset, size, sid)}")
            if sid is None and prev_hole:
                raise InvariantError(f"adjacent holes not merged at offset {offset}")
            prev_hole = sid is None
            pos += size
        if pos != self.capacity_tokens:
            raise InvariantError(f"pieces cover {pos} of {self.capacity_tokens} token slots")
        for sid, s in self.slots.items():
            if not 0 <= s.length <= s.size:
                raise InvariantError(f"sequence {sid!r} holds {s.length} tokens in a slot of {s.size}")


class ReserveToMaxAllocator(ContiguousAllocator):
    """The naive allocator of §10.2: every sequence reserves one slot of `s_max` tokens.

    All slots are the same size, so a freed slot always fits the next request: no external
    fragmentation, concurrency = floor(capacity / s_max), and everything past a sequence's final
    length is internal fragmentation.
    """

    def __init__(self, capacity_tokens: int, s_max: int, *, kv_bytes_per_token: int | None = None):
        super().__init__(capacity_tokens, kv_bytes_per_token=kv_bytes_per_token)
        self.s_max = _as_count("s_max", s_max, 1)

    @classmethod
    def from_budget(cls, budget_bytes: float, kv_bytes_per_token: int, s_max: int = 4096):
        return super().from_budget(budget_bytes, kv_bytes_per_token, s_max=s_max)

    @property
    def max_seqs(self) -> int:
        return self.capacity_tokens // self.s_max

    def slot_index(self, seq_id: Hashable) -> int:
        return self._slot(seq_id).offset // self.s_max

    def allocate(self, seq_id: Hashable, num_tokens: int = 0, final_tokens: int | None = None) -> Slot:
        return self._place(seq_id, self.s_max, num_tokens, final_tokens)


ORCA_POLICIES = ("max", "pow2", "oracle")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    n = _as_count("n", n, 0)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def orca_reservation(policy: str, prompt_tokens: int, output_tokens: int, s_max: int) -> int:
    """Slot size under the vLLM paper's Orca baselines (Kwon et al., SOSP 2023, §6.1).

    max:    always S_max;  pow2: the prompt plus the true output length rounded up to a power of
    two (over-reserves the output by less than 2x, e.g. 25 -> 32);  oracle: exactly prompt + output.
    """
    p = _as_count("prompt_tokens", prompt_tokens, 0)
    o = _as_count("output_tokens", output_tokens, 0)
    s_max = _as_count("s_max", s_max, 1)
    if p + o > s_max:
        raise ValueError(f"request of {p} + {o} = {p + o} tokens exceeds s_max={s_max}")
    if policy == "max":
        return s_max
    if policy == "pow2":
        return min(s_max, p + (next_pow2(o) if o else 0))
    if policy == "oracle":
        return max(1, p + o)
    raise ValueError(f"unknown reservation policy {policy!r}; choose one of {ORCA_POLICIES}")


class OrcaAllocator(ContiguousAllocator):
    """Contiguous slots sized by one of the Orca reservation policies (`orca_reservation`)."""

    def __init__(self, capacity_tokens: int, policy: str, s_max: int, *, kv_bytes_per_token: int | None = None):
        if policy not in ORCA_POLICIES:
            raise ValueError(f"unknown reservation policy {policy!r}; choose one of {ORCA_POLICIES}")
        super().__init__(capacity_tokens, kv_bytes_per_token=kv_bytes_per_token)
        self.policy = policy
        self.s_max = _as_count("s_max", s_max, 1)

    def reservation(self, prompt_tokens: int, output_tokens: int) -> int:
        return orca_reservation(self.policy, prompt_tokens, output_tokens, self.s_max)

    def allocate(self, seq_id: Hashable, prompt_tokens: int, output_tokens: int) -> Slot:
        """Admit a request whose prompt is already computed; it will grow to prompt + output."""
        size = self.reservation(prompt_tokens, output_tokens)
        return self._place(seq_id, size, prompt_tokens, prompt_tokens + output_tokens)


# ---------------------------------------------------------------------------------------------
# The block allocator (§10.3–§10.4)
# ---------------------------------------------------------------------------------------------


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

    With `enable_prefix_caching`, each full block whose token ids are known is entered in an index
    under a hash chained with the previous block's hash.  A later `allocate` with the same leading
    token ids reuses those blocks.  A hit is verified, not trusted: the stored token ids must match
    and the stored parent must be the very block (and generation) matched one position earlier,
    so a hash collision can cost a hit but never share wrong content.  Freed indexed blocks stay
    cached (least recently freed are evicted first) until the pool needs them.

    `block_tables` holds the resident sequences; `seq_lens` holds resident and swapped-out ones.
    Every public operation either completes or raises before changing anything.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False, *,
                 kv_bytes_per_token: int | None = None, hash_fn: Callable[[object], int] = hash):
        self.num_blocks = _as_count("num_blocks", num_blocks, 1)
        self.block_size = _as_count("block_size", block_size, 1)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.kv_bytes_per_token = (None if kv_bytes_per_token is None
                                   else _as_count("kv_bytes_per_token", kv_bytes_per_token, 1))
        self.block_tables: dict[Hashable, list[int]] = {}  # resident sequences only
        self.seq_lens: dict[Hashable, int] = {}  # resident and swapped-out sequences
        self.num_cached_tokens: dict[Hashable, int] = {}  # tokens served by the prefix index at allocate
        self._ref = [0] * self.num_blocks
        self._free: deque[int] = deque(range(self.num_blocks))  # FIFO: a freed block is reused last
        self._swapped: set = set()
        # prefix caching state
        self._hash_fn = hash_fn
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free blocks still holding indexed content
        self._index: dict[int, int] = {}  # chained hash -> block id
        self._block_hash: list[int | None] = [None] * self.num_blocks
        self._block_key: list[tuple | None] = [None] * self.num_blocks  # (parent block, parent gen, token ids)
        self._gen = [0] * self.num_blocks  # bumped whenever a block gets new content
        self._tokens: dict[Hashable, list[int] | None] = {}
        self._hashes: dict[Hashable, list[int]] = {}
        self._take_block = self._take_block_cached if self.enable_prefix_caching else self._take_block_plain

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation may take, including cached ones it would evict."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free) - len(self._cached_free)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._cached_free)

    def ref_count(self, block_id: int) -> int:
        b = _as_count("block_id", block_id, 0)
        if b >= self.num_blocks:
            raise ValueError(f"block_id must be < num_blocks={self.num_blocks}, got {b}")
        return self._ref[b]

    def ref_counts(self) -> list[int]:
        return list(self._ref)

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order they will be handed out (clean ones first, then cached LRU)."""
        return list(self._free) + list(self._cached_free)

    def block_state(self, block_id: int) -> str:
        """'used', 'cached' (free but still indexed) or 'free' -- what a lab colours the pool by."""
        if self.ref_count(block_id):
            return "used"
        return "cached" if block_id in self._cached_free else "free"

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-_as_count("num_tokens", num_tokens, 0) // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return _as_count("num_blocks", num_blocks, 0) <= len(self._free) + len(self._cached_free)

    def is_swapped(self, seq_id: Hashable) -> bool:
        return seq_id in self._swapped

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
        table = self.block_tables.get(seq_id)
        if table is None:
            self._raise_missing(seq_id)
        return table

    def _raise_missing(self, seq_id):
        if seq_id in self._swapped:
            raise SwappedOut(f"sequence {seq_id!r} is swapped out; swap_in({seq_id!r}) first")
        raise UnknownSequence(f"unknown sequence {seq_id!r}: never allocated or already freed")

    def _check_new(self, seq_id) -> None:
        try:
            if seq_id not in self.seq_lens:
                return
        except TypeError:
            raise ValueError(f"sequence id must be hashable, got {seq_id!r}") from None
        state = "swapped out" if seq_id in self._swapped else "resident"
        raise ValueError(f"sequence {seq_id!r} already exists ({state}); free it first or pick a new id")

    def _out_of_blocks(self, need: int, what: str) -> OutOfBlocks:
        free = len(self._free) + len(self._cached_free)
        return OutOfBlocks(f"{what}: needs {need} free block(s), {free} of {self.num_blocks} free "
                           f"(block_size={self.block_size})", needed=need, free=free)

    # -- the hot path ----------------------------------------------------------------------------
    def _take_block_plain(self) -> int:
        b = self._free.popleft()
        self._ref[b] = 1
        return b

    def _take_block_cached(self) -> int:
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

    def _release_block(self, b: int) -> None:
        r = self._ref[b] - 1
        self._ref[b] = r
        if not r:
            if self._block_hash[b] is None:
                self._free.append(b)
            else:  # keep its content findable until the pool needs the block
                self._cached_free[b] = None

    # -- sequence operations ---------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, num_tokens: int, token_ids: Sequence[int] | None = None) -> list[int]:
        """Give a new sequence blocks for `num_tokens` tokens; returns its block table.

        With prefix caching and `token_ids`, leading full blocks found in the index are shared
        (`num_cached_tokens[seq_id]` says how many tokens that covered) and the new full blocks
        are entered in the index.
        """
        self._check_new(seq_id)
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = _as_count("num_tokens", num_tokens, 0)
        bs = self.block_size
        n = -(-num_tokens // bs)
        if token_ids is not None:
            token_ids = [_as_count("token id", t, 0) for t in token_ids]
            if len(token_ids) != num_tokens:
                raise ValueError(f"token_ids has {len(token_ids)} ids but num_tokens={num_tokens}")
        if not self.enable_prefix_caching:
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
        """Reserve the slot of one more token of a resident sequence.

        A full (or missing) last block means a fresh block; a shared, partly filled last block is
        copied first (copy-on-write): `cow=(src, dst)` tells the cache which block to copy.
        `token_id` keeps the prefix index able to register the block this token completes.
        """
        table = self.block_tables.get(seq_id)
        if table is None:
            self._raise_missing(seq_id)
        if token_id is not None:
            token_id = _as_count("token_id", token_id, 0)
        n = self.seq_lens[seq_id]
        bs = self.block_size
        off = n % bs
        cow = None
        if off == 0:
            if not self._free and not self._cached_free:
                raise self._out_of_blocks(1, f"append to {seq_id!r}")
            b = self._take_block()
            table.append(b)
        else:
            b = table[-1]
            if self._ref[b] > 1:
                if not self._free and not self._cached_free:
                    raise self._out_of_blocks(1, f"copy-on-write for {seq_id!r}")
                src = b
                b = self._take_block()
                self._ref[src] -= 1
                table[-1] = b
                cow = (src, b)
        self.seq_lens[seq_id] = n + 1
        if self.enable_prefix_caching:
            self._track_token(seq_id, table, n + 1, token_id)
        return AppendResult(b * bs + off, cow)

    def append_slots(self, seq_ids: Sequence[Hashable], token_ids: Sequence[int] | None = None) -> list[AppendResult]:
        """`append_slot` for a whole decode batch, all or nothing.

        The blocks the batch needs are counted first (a fresh block per full sequence; one copy per
        shared last block while it is still shared), so a batch that does not fit changes nothing.
        """
        seq_ids = list(seq_ids)
        if len(set(seq_ids)) != len(seq_ids):
            dup = next(s for s in seq_ids if seq_ids.count(s) > 1)
            raise ValueError(f"sequence {dup!r} appears twice in one decode batch")
        if token_ids is not None:
            token_ids = [_as_count("token_id", t, 0) for t in token_ids]
            if len(token_ids) != len(seq_ids):
                raise ValueError(f"token_ids has {len(token_ids)} entries for {len(seq_ids)} sequences")
        bs = self.block_size
        need = 0
        refs_left: dict[int, int] = {}
        for s in seq_ids:
            table = self.block_tables.get(s)
            if table is None:
                self._raise_missing(s)
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
        if self.enable_prefix_caching:
            toks = self._tokens.get(parent_id)
            self._tokens[child_id] = None if toks is None else list(toks)
            self._hashes[child_id] = list(self._hashes.get(parent_id, ()))
            self.num_cached_tokens[child_id] = 0
        return list(table)

    def free(self, seq_id: Hashable) -> None:
        """Forget a sequence (resident or swapped out); its blocks return to the pool when unshared."""
        table = self.block_tables.get(seq_id)
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
        if self.enable_prefix_caching:
            self.num_cached_tokens.pop(seq_id, None)
            self._tokens.pop(seq_id, None)
            self._hashes.pop(seq_id, None)

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
        if seq_id not in self._swapped:
            if seq_id in self.block_tables:
                raise ValueError(f"sequence {seq_id!r} is not swapped out (it is resident)")
            self._raise_missing(seq_id)
        n = self.blocks_needed(self.seq_lens[seq_id])
        if n > self.num_free_blocks:
            raise self._out_of_blocks(n, f"swap_in {seq_id!r} ({self.seq_lens[seq_id]} tokens)")
        table = [self._take_block() for _ in range(n)]
        self._swapped.discard(seq_id)
        self.block_tables[seq_id] = table
        toks = self._tokens.get(seq_id)
        if self.enable_prefix_caching and toks is not None:
            hashes = self._hashes[seq_id]
            for i in range(len(hashes)):
                self._register(table, i, hashes[i], toks)
        return list(table)

    # -- prefix index ----------------------------------------------------------------------------
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
            "cached_free": list(self._cached_free),
            "swapped": set(self._swapped),
            "index": dict(self._index),
            "num_cached_tokens": dict(self.num_cached_tokens),
            "tokens": {s: (None if t is None else list(t)) for s, t in self._tokens.items()},
        }

    def check_invariants(self) -> None:
        """Raise InvariantError unless the bookkeeping is consistent (see the class docstring)."""
        nb, bs = self.num_blocks, self.block_size
        free, cached = list(self._free), list(self._cached_free)
        if len(set(free)) != len(free):
            raise InvariantError("a block appears twice in the free list")
        if set(free) & set(cached):
            raise InvariantError(f"blocks both clean-free and cached-free: {sorted(set(free) & set(cached))}")
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
        free_set = set(free) | set(cached)
        used = {b for b in range(nb) if counts[b]}
        if used & free_set:
            raise InvariantError(f"blocks both free and used: {sorted(used & free_set)[:10]}")
        if len(used) + len(free_set) != nb:
            raise InvariantError(f"free ({len(free_set)}) + used ({len(used)}) != total ({nb})")
        if set(self.seq_lens) != set(self.block_tables) | self._swapped:
            raise InvariantError("seq_lens does not cover exactly the resident and swapped-out sequences")
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


# ---------------------------------------------------------------------------------------------
# Fig. 2: how much of the pool holds real token states, per policy
# ---------------------------------------------------------------------------------------------


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


def simulate_breakdown(requests: Iterable, capacity_tokens: int, policy: str, *, s_max: int | None = None,
                       block_size: int = 16, watermark: float = 0.01, sample_every: int = 1,
                       progress: bool = False) -> Breakdown:
    """Replay requests through one allocator under memory pressure and average its `stats()`.

    Method (the paper measures its Fig. 2 on a loaded server; this is a memory-only replay):
    every request is waiting at time 0, in trace order.  Each iteration (Orca and vLLM both
    schedule per iteration) first admits waiting requests first-come-first-served until the head
    does not fit, then samples the pool, then lets every running sequence append one token;
    a sequence that has produced its `output_tokens` leaves and frees its memory.
    A request's KV length starts at its prompt and ends at prompt + output.

    * Orca policies: the head is admitted when its whole reservation fits in one hole (first-fit);
      reservations guarantee growth, so nothing is ever preempted.
    * paged: the head is admitted when its prompt's blocks fit while leaving `watermark` of the
      pool free (vLLM's default 1%); when a running sequence needs a block and none is free, the
      most recently admitted sequence is preempted and recomputed later (vLLM's default).

    Samples are taken only while someone is waiting, i.e. while memory is the bottleneck; free
    space then is space the waiting request could not use.  Shares are of the whole pool.
    """
    reqs = _pairs(requests)
    if not reqs:
        raise ValueError("no requests to simulate")
    capacity_tokens = _as_count("capacity_tokens", capacity_tokens, 1)
    sample_every = _as_count("sample_every", sample_every, 1)
    longest = max(p + o for p, o in reqs)
    paged = policy == "paged"
    if paged:
        alloc = BlockAllocator(capacity_tokens // _as_count("block_size", block_size, 1), block_size)
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark!r}")
        watermark_blocks = int(watermark * alloc.num_blocks)
        final = {i: p + o for i, (p, o) in enumerate(reqs)}
        if alloc.blocks_needed(longest) + watermark_blocks > alloc.num_blocks:
            raise ValueError(f"a request of {longest} tokens does not fit in {alloc.num_blocks} blocks")
    else:
        s_max = next_pow2(longest) if s_max is None else _as_count("s_max", s_max, 1)
        alloc = OrcaAllocator(capacity_tokens, policy, s_max)
        if s_max > capacity_tokens:
            raise ValueError(f"s_max={s_max} exceeds the pool of {capacity_tokens} tokens")
    generated = [0] * len(reqs)
    waiting = deque(range(len(reqs)))
    running: list[int] = []
    sums = [0.0] * 5
    samples = steps = finished = preemptions = running_sum = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(reqs), desc=f"simulate {policy}", leave=False)
    while waiting or running:
        head_size = None
        while waiting:
            i = waiting[0]
            p, o = reqs[i]
            if paged:
                need = alloc.blocks_needed(p + generated[i])  # a preempted request recomputes its output so far
                if alloc.num_free_blocks - need < watermark_blocks:
                    head_size = need * block_size
                    break
                alloc.allocate(i, p + generated[i])
            else:
                try:
                    alloc.allocate(i, p, o)
                except OutOfBlocks as e:
                    head_size = e.needed
                    break
            waiting.popleft()
            running.append(i)
        if not running:
            raise ValueError(f"request {waiting[0]} {reqs[waiting[0]]} can never be admitted")
        if waiting and steps % sample_every == 0:
            st = alloc.stats(final) if paged else alloc.stats(next_request_tokens=head_size)
            sh = st.shares()
            for k, key in enumerate(("token_states", "reservation", "internal_fragmentation",
                                     "external_fragmentation", "free")):
                sums[k] += sh[key]
            samples += 1
            running_sum += len(running)
        k = 0
        while k < len(running):
            i = running[k]
            if paged:
                try:
                    alloc.append_slot(i)
                except OutOfBlocks:
                    victim = running.pop()
                    alloc.free(victim)
                    waiting.appendleft(victim)
                    preemptions += 1
                    continue
            else:
                alloc.append(i)
            generated[i] += 1
            if generated[i] == reqs[i][1]:
                alloc.free(i)
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
    avg = [s / samples for s in sums]
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
