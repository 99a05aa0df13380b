"""The naive allocators of §10.2: one contiguous slot per sequence (and Exercise 2's per-request S_max).

* `ReserveToMaxAllocator`: every sequence gets one contiguous slot of S_max tokens — "the
  allocation is sized by the limit and the occupancy is set by reality".
* `ContiguousAllocator`: every request declares its own S_max; slots of varying size are placed
  first-fit in one address space, so retiring sequences leaves holes and a request can be refused
  while more than enough memory is free in total (`Refusal` shows exactly that: external
  fragmentation, Exercise 2).
* `OrcaAllocator` sizes the slot with the vLLM paper's Orca(Max) / Orca(Pow2) / Orca(Oracle)
  reservation policies (Kwon et al., SOSP 2023, §6.1).

A contiguous sequence cannot grow past its own slot (`ReservationExceeded`): moving a
multi-gigabyte tensor mid-flight is what §10.2 calls unthinkable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from labsupport.checks import as_count as _as_count
from labsupport.checks import as_id, shown
from labsupport.memory_stats import (InvariantError, MemoryStats, OutOfBlocks, Refusal, ReservationExceeded,
                                     UnknownSequence)

__all__ = ["Slot", "Refusal", "ContiguousAllocator", "ReserveToMaxAllocator", "OrcaAllocator",
           "orca_reservation", "next_pow2", "ORCA_POLICIES"]


@dataclass
class Slot:
    """One sequence's contiguous reservation: [offset, offset + size) in token slots."""

    offset: int
    size: int
    length: int  # tokens stored so far
    final: int | None = None  # the length it will reach, when the caller knows it (for stats)


class ContiguousAllocator:
    """Per-request S_max: variable-size contiguous slots placed first-fit in one address space.

    `allocate(seq, s_max)` reserves s_max token slots for that request; the sequence may grow
    into them and no further.  Freed slots become holes, merged with free neighbours.  Nothing
    is ever moved, which is what makes the slot kernel-friendly and what fragments the space.
    """

    def __init__(self, capacity_tokens: int, *, kv_bytes_per_token: int | None = None, place=None):
        self.capacity_tokens = _as_count("capacity_tokens", capacity_tokens, 1)
        self.kv_bytes_per_token = (None if kv_bytes_per_token is None
                                   else _as_count("kv_bytes_per_token", kv_bytes_per_token, 1))
        self.place = place  # placement policy: place(holes, size) -> offset or None; None means first fit (lab 02)
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
        return self._where(_as_count("reserve_tokens", reserve_tokens, 1)) is not None

    def refusal_for(self, seq_id: Hashable, reserve_tokens: int) -> Refusal:
        return Refusal(seq_id, reserve_tokens, self.free_tokens, self.largest_hole, self.kv_bytes_per_token)

    def _first_fit(self, size: int) -> int | None:
        for i, (_, hole) in enumerate(self._holes):
            if hole >= size:
                return i
        return None

    def _where(self, size: int) -> tuple[int, int] | None:
        """(hole index, offset) where a slot of `size` goes, by first fit or by `self.place`; None: refused."""
        if self.place is None:
            i = self._first_fit(size)
            return None if i is None else (i, self._holes[i][0])
        offset = self.place(self.holes(), size)
        if offset is None:
            return None
        for i, (start, hole) in enumerate(self._holes):
            if isinstance(offset, int) and start <= offset and offset + size <= start + hole:
                return i, offset
        raise ValueError(f"the placement put a slot of {size:,} tokens at offset {offset!r}, which is not inside "
                         f"one free hole; the holes are {self.holes()}")

    # -- operations ------------------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, s_max: int, num_tokens: int = 0, final_tokens: int | None = None) -> Slot:
        """Reserve `s_max` contiguous token slots for a new sequence already holding `num_tokens`.

        `final_tokens` (optional) is the length the sequence will actually reach; it only feeds
        the reservation/internal-fragmentation split in `stats()`.  Raises OutOfBlocks carrying a
        `Refusal` when no hole is large enough; nothing changes then.
        """
        return self._place(seq_id, s_max, num_tokens, final_tokens)

    def _place(self, seq_id, size, num_tokens, final_tokens) -> Slot:
        if as_id("sequence id", seq_id) in self.slots:
            raise ValueError(f"sequence {shown(seq_id)} already holds a slot")
        size = _as_count("s_max", size, 1)
        num_tokens = _as_count("num_tokens", num_tokens, 0)
        if num_tokens > size:
            raise ValueError(f"num_tokens={num_tokens} does not fit in its own slot of s_max={size}")
        if final_tokens is not None:
            final_tokens = _as_count("final_tokens", final_tokens, 0)
            if final_tokens < num_tokens:
                raise ValueError(f"final_tokens={final_tokens} is below num_tokens={num_tokens}")
        where = self._where(size)
        if where is None:
            refusal = self.refusal_for(seq_id, size)
            raise OutOfBlocks(str(refusal), needed=size, free=refusal.free_tokens, refusal=refusal)
        i, offset = where
        hole = self._holes[i]
        slot = Slot(offset, size, num_tokens, final_tokens)
        left, right = offset - hole[0], hole[0] + hole[1] - offset - size  # what the slot leaves either side
        self._holes[i:i + 1] = [h for h in ([hole[0], left], [offset + size, right]) if h[1]]
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
            raise UnknownSequence.unhashable(seq_id) from None

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

    def __init__(self, capacity_tokens: int, s_max: int, *, kv_bytes_per_token: int | None = None, place=None):
        super().__init__(capacity_tokens, kv_bytes_per_token=kv_bytes_per_token, place=place)
        self.s_max = _as_count("s_max", s_max, 1)

    @classmethod
    def from_budget(cls, budget_bytes: float, kv_bytes_per_token: int, s_max: int = 4096, place=None):
        return super().from_budget(budget_bytes, kv_bytes_per_token, s_max=s_max, place=place)

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
