"""What every KV allocator reports and raises (§10.2–§10.3; the vLLM paper's §3, Fig. 2).

`MemoryStats` splits every token slot of a pool the way the paper's Fig. 2 does: token states,
reservation (slots a live request will still fill), internal fragmentation (reserved slots it will
never fill) and external fragmentation (free space in holes too small for the next request).  The
contiguous allocators of §10.2 (`labsupport.contiguous`) and the block allocator of §10.3
(`labsupport.block_allocator`) both report it, so a lab can put them side by side.

The errors are shared too: every allocator refuses with `OutOfBlocks` and leaves its state unchanged;
a contiguous allocator's refusal carries a `Refusal` saying why (free in total against the largest hole).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from labsupport.checks import shown

__all__ = ["Refusal", "OutOfBlocks", "ReservationExceeded", "UnknownSequence", "SwappedOut", "InvariantError",
           "MemoryStats"]


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


class OutOfBlocks(RuntimeError):
    """The pool cannot satisfy the request right now.  The allocator's state is unchanged."""

    def __init__(self, message: str, *, needed: int | None = None, free: int | None = None,
                 refusal: Refusal | None = None):
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

    @classmethod
    def unhashable(cls, seq_id) -> "UnknownSequence":
        """The error for an id no dictionary can hold (a list, a dict): no sequence can have it."""
        return cls(f"unknown sequence {shown(seq_id)}: a sequence id must be hashable, and a "
                   f"{type(seq_id).__name__} is not")


class SwappedOut(ValueError):
    """The sequence's KV is in host memory; swap it in before using it."""


class InvariantError(AssertionError):
    """`check_invariants` found the allocator's bookkeeping inconsistent."""


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
