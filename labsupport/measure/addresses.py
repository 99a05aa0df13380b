"""Where a decode kernel reads a batch's keys (§10.3 step three): a real `BlockAllocator`'s tables, reached by one
of three histories, passed through the kernels' own address line (`labsupport.kernels.kv_token_offsets`).

Its runs of adjacent tokens are the lecture's "kernel's contiguous run"; `labsupport.viz.kernel` draws the map.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from labsupport.block_allocator import BlockAllocator
from labsupport.memory_stats import OutOfBlocks

HISTORIES = ("prefill", "decode together", "after churn")


@dataclass(frozen=True)
class AddressMap:
    """Where each token's K row (one layer, head 0) lives, for a batch of sequences."""

    block_size: int
    seq_lens: list[int]
    block_tables: torch.Tensor  # int32 [B, max_blocks], from the allocator
    offsets: torch.Tensor       # int64 [B, max_len] element offsets in the K pool, -1 past a sequence's end
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's K for all KV heads (one layer): what sits between neighbouring tokens."""
        return self.num_kv_heads * self.head_dim * self.dtype_bytes

    def runs(self, seq: int) -> list[int]:
        """Lengths (tokens) of the maximal runs of sequence ``seq`` that are adjacent in memory."""
        stride = self.num_kv_heads * self.head_dim
        return contiguous_runs(self.offsets[seq, : self.seq_lens[seq]].tolist(), stride)


def contiguous_runs(offsets: list[int], stride: int) -> list[int]:
    """Split a sequence's token offsets into runs where each token sits ``stride`` after the last."""
    if stride <= 0:
        raise ValueError(f"stride must be positive, got {stride}")
    runs: list[int] = []
    for i, off in enumerate(offsets):
        if i and off == offsets[i - 1] + stride:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def allocate_batch(seq_lens: list[int], block_size: int, history: str = "after churn", pool_tokens: int = 2048,
                   seed: int = 0) -> BlockAllocator:
    """A real ``BlockAllocator`` holding sequences ``0..B-1`` of ``seq_lens`` tokens, reached by one of
    three histories: ``prefill`` (each sequence allocated whole, in order, in a fresh pool),
    ``decode together`` (short prompts, then every sequence grows one token per step, as in a
    decode batch) or ``after churn`` (a pool filled with short requests, two thirds of them freed
    in random order, then the batch prefilled)."""
    if history not in HISTORIES:
        raise ValueError(f"history must be one of {HISTORIES}, got {history!r}")
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError(f"seq_lens must be positive token counts, got {seq_lens}")
    num_blocks = max(1, pool_tokens // block_size)
    need = sum(-(-n // block_size) for n in seq_lens)
    if need > num_blocks:
        raise ValueError(f"{need} blocks of {block_size} tokens are needed but a {pool_tokens}-token pool has "
                         f"{num_blocks}")
    alloc = BlockAllocator(num_blocks, block_size)
    rng = random.Random(seed)
    if history == "prefill":
        for i, n in enumerate(seq_lens):
            alloc.allocate(i, n)
    elif history == "decode together":
        prompts = [min(n, max(1, n // 4)) for n in seq_lens]
        for i, n in enumerate(prompts):
            alloc.allocate(i, n)
        for step in range(max(seq_lens) - min(prompts)):
            for i, n in enumerate(seq_lens):
                if prompts[i] + step < n:
                    alloc.append_slot(i)
    else:
        old = []
        while True:
            try:
                alloc.allocate(("old", len(old)), rng.randint(1, 3 * block_size))
            except OutOfBlocks:
                break
            old.append(("old", len(old)))
        rng.shuffle(old)
        freed = 0
        for seq in old:
            if alloc.num_free_blocks >= need and freed >= 2 * len(old) // 3:
                break
            alloc.free(seq)
            freed += 1
        for i, n in enumerate(seq_lens):
            alloc.allocate(i, n)
    return alloc


@functools.lru_cache(maxsize=64)
def _address_map_cached(seq_lens: tuple[int, ...], block_size: int, history: str, num_kv_heads: int, head_dim: int,
                        dtype_bytes: int, pool_tokens: int, seed: int) -> AddressMap:
    return _address_map(list(seq_lens), block_size, history, num_kv_heads, head_dim, dtype_bytes, pool_tokens, seed)


def address_map(seq_lens: list[int], block_size: int, history: str = "after churn", *, num_kv_heads: int | None = None,
                head_dim: int | None = None, dtype_bytes: int | None = None, pool_tokens: int = 2048,
                seed: int = 0) -> AddressMap:
    """Allocate a batch (``allocate_batch``) and ask the kernels' own address helper where it reads.  The rows are
    the course card's GQA model's (the lecture's: 8 KV heads x 128 x 2 B) unless given.
    Results are cached (a panel asks twice per change: figure and readout); treat them as read-only."""
    from labsupport import card

    gqa = card.card().gqa
    num_kv_heads = gqa.num_kv_heads if num_kv_heads is None else num_kv_heads
    head_dim = gqa.head_dim if head_dim is None else head_dim
    dtype_bytes = gqa.dtype_bytes if dtype_bytes is None else dtype_bytes
    return _address_map_cached(tuple(seq_lens), block_size, history, num_kv_heads, head_dim, dtype_bytes,
                               pool_tokens, seed)


def _address_map(seq_lens, block_size, history, num_kv_heads, head_dim, dtype_bytes, pool_tokens, seed) -> AddressMap:
    from labsupport import kernels

    alloc = allocate_batch(seq_lens, block_size, history, pool_tokens, seed)
    width = max(len(alloc.table(i)) for i in range(len(seq_lens)))
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for i in range(len(seq_lens)):
        tables[i, : len(alloc.table(i))] = torch.tensor(alloc.table(i), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stride_slot = num_kv_heads * head_dim
    offsets = kernels.kv_token_offsets(tables.to(device), lens.to(device), block_size,
                                       block_size * stride_slot, stride_slot).cpu()
    return AddressMap(block_size, list(seq_lens), tables, offsets, num_kv_heads, head_dim, dtype_bytes)
