"""The KV cache on real tensors: a paged pool and the reserve-to-max baseline (§10.2–§10.5).

`PagedKVCache` keeps, per layer, a K pool and a V pool shaped [num_blocks, block_size, num_kv_heads,
head_dim] (the "NHD" layout vLLM and FlashInfer use, which the Triton kernel reads) and a
`BlockAllocator` that decides which block holds which token.  A token's place is its slot,
block_id * block_size + offset, and every write goes through a slot mapping.  Copy-on-write
copies a whole block on the first divergent append after a fork; swap moves a sequence's K/V to
host memory (pinned on CUDA, so the copy can overlap compute) and back into whatever blocks are
free then.  `gather(seq)` returns a sequence's K/V contiguous: the reference every kernel test
compares against.

`ContiguousKVCache` is the §10.2 baseline on the same footing: one [S_max, Hkv, D] slot per
sequence per layer, so a lab can run one workload through both and compare occupancy.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch

from labsupport.block_allocator import BlockAllocator
from labsupport.checks import as_count as _as_count
from labsupport.checks import as_device, check_fits_in_memory, shown
from labsupport.contiguous import ReserveToMaxAllocator
from labsupport.memory_stats import OutOfBlocks, ReservationExceeded, UnknownSequence
from labsupport.prefix_cache import PrefixCachingAllocator

__all__ = ["PagedKVCache", "ContiguousKVCache"]


_CHECK_MEMORY_ABOVE = 64 << 20  # bytes; smaller pools fit anywhere


def _check_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


class _KVShape:
    """What both caches hold per token -- L layers of Hkv heads of D values in one dtype on one device
    (§10.2) -- and their checks of the K/V they are given (errors name the offending value)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    def _set_shape(self, num_layers, num_kv_heads, head_dim, dtype, device) -> None:
        self.num_layers = _as_count("num_layers", num_layers, 1)
        self.num_kv_heads = _as_count("num_kv_heads", num_kv_heads, 1)
        self.head_dim = _as_count("head_dim", head_dim, 1)
        self.dtype = _check_dtype(dtype)
        self.device = as_device("device", device)

    def _zero_pools(self, rows: int, row_tokens: int) -> None:
        """K and V of every layer, each [rows, row_tokens, Hkv, D]: a row is a block (paged) or one
        sequence's reserved slot (reserve-to-max)."""
        shape = (rows, row_tokens, self.num_kv_heads, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]

    def _check_prompt(self, k, v) -> int:
        """A prefill's k, v [L, T, Hkv, D]; returns its T tokens."""
        if not isinstance(k, torch.Tensor) or k.dim() != 4:
            raise ValueError(f"add_sequence: k must be a 4-D tensor [L, T, Hkv, D], got {getattr(k, 'shape', type(k))}")
        self._check_kv(k, v, (self.num_layers, k.shape[1]), "add_sequence")
        return k.shape[1]

    def _check_kv(self, k, v, lead: tuple[int, ...], what: str) -> None:
        want = (*lead, self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{what}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != want:
                raise ValueError(f"{what}: {name} has shape {tuple(t.shape)}, expected {want}")
            if t.dtype != self.dtype:
                raise ValueError(f"{what}: {name} has dtype {t.dtype}, the cache holds {self.dtype}")
            if t.device != self.device:
                raise ValueError(f"{what}: {name} is on {t.device}, the cache is on {self.device}")

    def _check_layer(self, layer) -> int:
        layer = _as_count("layer", layer, 0)
        if layer >= self.num_layers:
            raise ValueError(f"layer must be < num_layers={self.num_layers}, got {layer}")
        return layer

    def _check_pool_fits(self, what: str, nbytes: int) -> None:
        """Refuse, with the memory it would need, a pool the device cannot hold (before torch tries)."""
        if nbytes < _CHECK_MEMORY_ABOVE:
            return
        if self.device.type == "cuda" and torch.cuda.is_available():
            check_fits_in_memory(what, nbytes, available=torch.cuda.mem_get_info(self.device)[0])
        elif self.device.type == "cpu":
            check_fits_in_memory(what, nbytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer and KV head: 2 * L * Hkv * D * element size (§10.2)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()


def _unique(seq_ids: Sequence[Hashable]) -> list:
    seq_ids = list(seq_ids)
    for s in seq_ids:
        try:
            hash(s)
        except TypeError:
            raise UnknownSequence.unhashable(s) from None
    if len(set(seq_ids)) != len(seq_ids):
        dup = next(s for s in seq_ids if seq_ids.count(s) > 1)
        raise ValueError(f"sequence {shown(dup)} appears twice in one batch")
    return seq_ids


class PagedKVCache(_KVShape):
    """Paged K/V pools plus their block allocator.  See the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device="cpu", enable_prefix_caching: bool = False):
        block_size = _as_count("block_size", block_size, 1)
        if block_size & (block_size - 1):
            # the Triton kernel tiles a block with tl.arange, which needs a power of two
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        self._set_shape(num_layers, num_kv_heads, head_dim, dtype, device)
        allocator = PrefixCachingAllocator if enable_prefix_caching else BlockAllocator
        self.allocator = allocator(num_blocks, block_size, kv_bytes_per_token=self.kv_bytes_per_token)
        self.block_size = block_size
        self.num_blocks = self.allocator.num_blocks
        self._check_pool_fits(f"a KV pool of {self.num_blocks:,} blocks of {block_size} tokens on {self.device}",
                              self.pool_bytes)
        self._zero_pools(self.num_blocks, block_size)
        # flat [num_blocks * block_size, Hkv, D] views: a slot indexes them directly
        self._k_flat = [k.view(-1, self.num_kv_heads, self.head_dim) for k in self.k_cache]
        self._v_flat = [v.view(-1, self.num_kv_heads, self.head_dim) for v in self.v_cache]
        self._host: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}  # swapped-out K/V [L, T, Hkv, D]
        self._pin = self.device.type == "cuda"

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.kv_bytes_per_token

    # -- slot mappings -----------------------------------------------------------------------------
    def _slots(self, table: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end, dtype=torch.long)
        blocks = torch.tensor(table, dtype=torch.long) if table else torch.zeros(0, dtype=torch.long)
        return (blocks[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.device)

    def prepare_prefill(self, seq_id: Hashable, num_tokens: int, token_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Allocate a new sequence of `num_tokens` and return its slot mapping [num_tokens] (int64).

        With prefix caching, the first `allocator.cached_tokens(seq_id)` slots lie in shared
        blocks that already hold those tokens' K/V; a model that recomputes them may skip writing
        them (`slot_mapping[num_cached:]`).  Writing identical values there is harmless.
        """
        table = self.allocator.allocate(seq_id, num_tokens, token_ids)
        return self._slots(table, 0, self.allocator.seq_lens[seq_id])

    def prepare_decode(self, seq_ids: Sequence[Hashable], token_ids: Sequence[int] | None = None) -> torch.Tensor:
        """One new slot per sequence [B] (int64); performs any copy-on-write block copies first."""
        results = self.allocator.append_slots(seq_ids, token_ids)
        cows = [r.cow for r in results if r.cow is not None]
        if cows:
            src = torch.tensor([c[0] for c in cows], dtype=torch.long, device=self.device)
            dst = torch.tensor([c[1] for c in cows], dtype=torch.long, device=self.device)
            for pool in (*self.k_cache, *self.v_cache):
                pool.index_copy_(0, dst, pool.index_select(0, src))
        return torch.tensor([r.slot for r in results], dtype=torch.long, device=self.device)

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scatter k, v [T, Hkv, D] into layer `layer`'s pools at slot_mapping [T]."""
        layer = self._check_layer(layer)
        if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dim() != 1 or slot_mapping.dtype != torch.long:
            raise ValueError(f"slot_mapping must be a 1-D int64 tensor, got {getattr(slot_mapping, 'dtype', type(slot_mapping))} "
                             f"of shape {tuple(getattr(slot_mapping, 'shape', ()))}")
        self._check_kv(k, v, (slot_mapping.shape[0],), "write")
        if slot_mapping.device != self.device:
            raise ValueError(f"write: slot_mapping is on {slot_mapping.device}, the cache is on {self.device}")
        if self.device.type == "cpu" and slot_mapping.numel():  # on CUDA this check would cost a sync
            lo, hi = int(slot_mapping.min()), int(slot_mapping.max())
            if lo < 0 or hi >= self.num_blocks * self.block_size:
                raise ValueError(f"write: slot {lo if lo < 0 else hi} outside the pool of "
                                 f"{self.num_blocks * self.block_size} slots")
        self._scatter(layer, slot_mapping, k, v)

    def _scatter(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self._k_flat[layer].index_copy_(0, slots, k)
        self._v_flat[layer].index_copy_(0, slots, v)

    # -- convenience: whole-model prefill and decode ---------------------------------------------
    def add_sequence(self, seq_id: Hashable, k: torch.Tensor, v: torch.Tensor,
                     token_ids: Sequence[int] | None = None) -> list[int]:
        """Prefill: store k, v [L, T, Hkv, D] for a new sequence; returns its block table.
        Tokens found in the prefix index are not rewritten (their blocks are shared)."""
        t = self._check_prompt(k, v)
        slots = self.prepare_prefill(seq_id, t, token_ids)
        start = self.allocator.cached_tokens(seq_id)
        for layer in range(self.num_layers):  # shapes were checked above; slots come from the allocator
            self._scatter(layer, slots[start:], k[layer, start:], v[layer, start:])
        return self.allocator.table(seq_id)

    def append(self, seq_ids: Sequence[Hashable], k: torch.Tensor, v: torch.Tensor,
               token_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Decode: store one token's k, v [L, B, Hkv, D] per sequence; returns the slot mapping."""
        seq_ids = list(seq_ids)
        self._check_kv(k, v, (self.num_layers, len(seq_ids)), "append")
        slots = self.prepare_decode(seq_ids, token_ids)
        for layer in range(self.num_layers):
            self._scatter(layer, slots, k[layer], v[layer])
        return slots

    # -- sequence lifecycle ----------------------------------------------------------------------
    def fork(self, parent: Hashable, child: Hashable) -> list[int]:
        """The child shares all the parent's blocks; the copy happens on the first divergent append."""
        return self.allocator.fork(parent, child)

    def free(self, seq_id: Hashable) -> None:
        self.allocator.free(seq_id)
        self._host.pop(seq_id, None)

    def drop(self, seq_id: Hashable) -> int:
        """Discard a sequence's K/V so it can be recomputed later; returns the tokens to recompute."""
        self.allocator.is_swapped(seq_id)  # an unhashable id is refused here, before anything changes
        n = self.allocator.seq_lens.get(seq_id, 0)
        self.free(seq_id)
        return n

    def swap_out(self, seq_id: Hashable) -> list[int]:
        """Copy the sequence's K/V to host memory and release its blocks; returns the old table."""
        table = self.allocator.table(seq_id)  # raises for unknown or swapped-out sequences
        k, v = self.gather(seq_id)
        host = []
        for t in (k, v):
            h = torch.empty(t.shape, dtype=self.dtype, pin_memory=self._pin)
            h.copy_(t, non_blocking=self._pin)
            host.append(h)
        self.allocator.swap_out(seq_id)
        self._host[seq_id] = (host[0], host[1])
        return table

    def swap_in(self, seq_id: Hashable) -> list[int]:
        """Bring a swapped-out sequence back into fresh (possibly different) blocks; returns the new
        table.  Raises OutOfBlocks, keeping the host copy, when the pool is too full."""
        table = self.allocator.swap_in(seq_id)
        k_host, v_host = self._host.pop(seq_id)
        slots = self._slots(table, 0, self.allocator.seq_lens[seq_id])
        for layer in range(self.num_layers):
            self._scatter(layer, slots, k_host[layer].to(self.device, non_blocking=self._pin),
                          v_host[layer].to(self.device, non_blocking=self._pin))
        return table

    def is_swapped(self, seq_id: Hashable) -> bool:
        return self.allocator.is_swapped(seq_id)

    def host_copy(self, seq_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """The host-memory K/V [L, T, Hkv, D] of a swapped-out sequence (read it, do not modify it)."""
        if not self.allocator.is_swapped(seq_id) or seq_id not in self._host:
            raise ValueError(f"sequence {shown(seq_id)} is not swapped out")
        return self._host[seq_id]

    # -- reading ---------------------------------------------------------------------------------
    def gather(self, seq_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V, each [L, T, Hkv, D] contiguous, read through its block table."""
        table = self.allocator.table(seq_id)
        slots = self._slots(table, 0, self.allocator.seq_lens[seq_id])
        k = torch.stack([f.index_select(0, slots) for f in self._k_flat])
        v = torch.stack([f.index_select(0, slots) for f in self._v_flat])
        return k, v

    def block_table_tensor(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        """int32 [B, max_blocks] of physical block ids, padded with 0."""
        tables = [self.allocator.table(s) for s in seq_ids]
        width = max((len(t) for t in tables), default=0)
        out = torch.zeros((len(tables), width), dtype=torch.int32)
        for i, t in enumerate(tables):
            if t:
                out[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        return out.to(self.device)

    def seq_lens_tensor(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        """int32 [B] of sequence lengths."""
        for s in seq_ids:
            self.allocator.table(s)  # resident only: a kernel cannot read a swapped-out sequence
        return torch.tensor([self.allocator.seq_lens[s] for s in seq_ids], dtype=torch.int32, device=self.device)

    # -- what the labs draw ----------------------------------------------------------------------
    def block_table(self, seq_id: Hashable) -> list[int]:
        return self.allocator.table(seq_id)

    def ref_counts(self) -> list[int]:
        return self.allocator.ref_counts()

    def occupancy(self) -> float:
        """Fraction of physical blocks in use."""
        return self.allocator.num_used_blocks / self.num_blocks

    def stats(self, final_lens=None):
        return self.allocator.stats(final_lens)

    def check_invariants(self) -> None:
        self.allocator.check_invariants()
        if set(self._host) != self.allocator._swapped:
            raise AssertionError("host copies do not match the swapped-out sequences")


class ContiguousKVCache(_KVShape):
    """Reserve-to-max baseline: K/V tensors [max_seqs, S_max, Hkv, D] per layer, one slot per sequence.

    Slot bookkeeping is a `ReserveToMaxAllocator`, so this cache reports the same `stats()` as
    the paged one.  A sequence cannot grow past S_max (`ReservationExceeded`).
    """

    def __init__(self, max_seqs: int, s_max: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        self.max_seqs = _as_count("max_seqs", max_seqs, 1)
        self.s_max = _as_count("s_max", s_max, 1)
        self._set_shape(num_layers, num_kv_heads, head_dim, dtype, device)
        self._check_pool_fits(f"{self.max_seqs:,} reserve-to-max slots of S_max = {self.s_max:,} tokens on "
                              f"{self.device}", self.max_seqs * self.s_max * self.kv_bytes_per_token)
        self.allocator = ReserveToMaxAllocator(self.max_seqs * self.s_max, self.s_max,
                                               kv_bytes_per_token=self.kv_bytes_per_token)
        self._zero_pools(self.max_seqs, self.s_max)

    @property
    def pool_bytes(self) -> int:
        return self.max_seqs * self.s_max * self.kv_bytes_per_token

    def add_sequence(self, seq_id: Hashable, k: torch.Tensor, v: torch.Tensor) -> int:
        """Prefill k, v [L, T, Hkv, D] into a free slot; returns the slot index."""
        t = self._check_prompt(k, v)
        if t > self.s_max:
            raise ValueError(f"add_sequence: a prompt of {t} tokens exceeds S_max={self.s_max}")
        try:
            self.allocator.allocate(seq_id, t)
        except OutOfBlocks as e:
            raise OutOfBlocks(f"no free slot for {seq_id!r}: all {self.max_seqs} slots of S_max={self.s_max} "
                              f"tokens are reserved", needed=1, free=0) from e
        i = self.allocator.slot_index(seq_id)
        for layer in range(self.num_layers):
            self.k_cache[layer][i, :t] = k[layer]
            self.v_cache[layer][i, :t] = v[layer]
        return i

    def append(self, seq_ids: Sequence[Hashable], k: torch.Tensor, v: torch.Tensor) -> None:
        """Decode: one token's k, v [L, B, Hkv, D] per sequence, all or nothing."""
        seq_ids = _unique(seq_ids)
        self._check_kv(k, v, (self.num_layers, len(seq_ids)), "append")
        slots = [self.allocator._slot(s) for s in seq_ids]
        for s, slot in zip(seq_ids, slots):
            if slot.length >= slot.size:
                raise ReservationExceeded(f"sequence {s!r} is at S_max={self.s_max} and cannot grow", needed=1, free=0)
        for j, (s, slot) in enumerate(zip(seq_ids, slots)):
            i, pos = slot.offset // self.s_max, slot.length
            for layer in range(self.num_layers):
                self.k_cache[layer][i, pos] = k[layer, j]
                self.v_cache[layer][i, pos] = v[layer, j]
            self.allocator.append(s)

    def free(self, seq_id: Hashable) -> None:
        self.allocator.free(seq_id)

    def gather(self, seq_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.allocator._slot(seq_id)
        i, n = slot.offset // self.s_max, slot.length
        k = torch.stack([kc[i, :n] for kc in self.k_cache])
        v = torch.stack([vc[i, :n] for vc in self.v_cache])
        return k, v

    def slot_indices_tensor(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        """int64 [B]: which row of k_cache[layer] each sequence occupies."""
        return torch.tensor([self.allocator.slot_index(s) for s in seq_ids], dtype=torch.long, device=self.device)

    def seq_lens_tensor(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        return torch.tensor([self.allocator._slot(s).length for s in seq_ids], dtype=torch.int32, device=self.device)

    def stats(self):
        return self.allocator.stats()

    def check_invariants(self) -> None:
        self.allocator.check_invariants()
