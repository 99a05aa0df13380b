"""Lab 04 checkoffs: the attention kernel reads through the block table (§10.3 step three).

4.1 the address line in torch, 4.2 in Triton inside the real kernels, 4.3 and 4.4 the bytes a decode step moves
fused and gathered, 4.5 the block-size costs a good kernel hides.  Expected values are Python integers worked out
here, or the kernels' plain-torch references on the same tensors (4.2's outputs).
"""
from __future__ import annotations

import random

import torch

from labsupport.course.registry import case, choice, function, givens, value

# §10.3's costs of a block size.  "Table lookups" is two costs, kept apart: the kernel's extra table read per block
# (which a good kernel hides) and the engine building and shipping longer tables (CPU work no kernel touches).
TRADEOFFS = ("tail waste", "fork copies", "short contiguous runs", "table reads", "table building")


def _hidden(rng):
    kv_heads = rng.choice((2, 4, 16))
    return dict(BATCH=rng.choice((8, 16, 128, 256)), SEQ_LEN=rng.choice((1024, 2048, 4096, 16_384)),
                Q_HEADS=kv_heads * rng.choice((3, 5, 6)), KV_HEADS=kv_heads, HEAD_DIM=rng.choice((64, 80, 256)),
                DTYPE_BYTES=4)  # never 1 byte: a count that dropped the bytes per element would pass


# Two draws, frozen; each differs in every given from the givens of every catalogue card (specs.py: no model has 6 or 80
# query heads, 2 or 16 KV heads in its GQA form, or a head of 256), so that it serves whatever card course.toml names.
_FALLBACKS = (dict(BATCH=256, SEQ_LEN=4096, Q_HEADS=6, KV_HEADS=2, HEAD_DIM=256, DTYPE_BYTES=4),
              dict(BATCH=256, SEQ_LEN=16_384, Q_HEADS=80, KV_HEADS=16, HEAD_DIM=256, DTYPE_BYTES=4))
G = givens(hidden=_hidden, fallbacks=_FALLBACKS)  # one layer of the card's GQA model at the benchmark's headline point


def _parts(batch, seq_len, q_heads, kv_heads, head_dim, dtype_bytes) -> tuple[int, int]:
    """Bytes of every sequence's K and V, and of the query and output rows (one per sequence and query head)."""
    return 2 * batch * seq_len * kv_heads * head_dim * dtype_bytes, 2 * batch * q_heads * head_dim * dtype_bytes


def _offsets(table, positions, block_size, stride_block, stride_slot, wrap=False, mod=True) -> list[list[int]]:
    """Exact in Python integers for any pool; `wrap` (an int32 product) and `mod=False` give two wrong lines'."""
    def block_part(row: list[int], p: int) -> int:
        x = row[p // block_size] * stride_block
        return (x + 2**31) % 2**32 - 2**31 if wrap else x
    return [[block_part(table[b], p) + (p % block_size if mod else p) * stride_slot for p in row]
            for b, row in enumerate(positions)]


def _random_tables(gen: torch.Generator, batch: int, blocks_per_seq: int, num_blocks: int, high: bool = False):
    """Distinct physical ids per batch, shuffled the way a pool looks after churn (or near 2**31)."""
    need = batch * blocks_per_seq
    ids = torch.randperm(need if high else num_blocks, generator=gen)[:need].tolist()
    ids = [2**31 - 1 - i for i in ids] if high else ids
    return [ids[b * blocks_per_seq:(b + 1) * blocks_per_seq] for b in range(batch)]


def _address_cases(rng: random.Random):
    """(table, seq_lens, block_size, stride_block, stride_slot): small pools, two drawn, one with ids near 2**31."""
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    shapes = [(1, 16, 1, 8, 40), (3, 8, 2, 32, 70), (2, 1, 4, 16, 19), (4, 64, 8, 128, 300), (2, 256, 2, 64, 600),
              (3, 32, 5, 16, 97)]
    shapes += [(rng.randint(1, 5), rng.choice((2, 4, 16, 32, 128)), rng.randint(1, 8), rng.choice((8, 16, 64)),
                rng.randint(5, 400)) for _ in range(2)]
    cases = []
    for batch, block_size, hkv, d, max_len in shapes:
        blocks_per_seq = -(-max_len // block_size)
        table = _random_tables(gen, batch, blocks_per_seq, 3 * batch * blocks_per_seq + 5)
        lens = [max_len] + torch.randint(1, max_len + 1, (batch - 1,), generator=gen).tolist()
        cases.append((table, lens, block_size, block_size * hkv * d, hkv * d))
    cases.append((_random_tables(gen, 2, 3, 0, high=True), [48, 33], 16, 16 * 8 * 128, 8 * 128))  # offsets ~3.5e13
    return cases


# The kernels' address line and its helper; the paged cache's slots times stride_slot are the offsets too.
_OFFSET_SHORTCUTS = ("labsupport.kernels.kv_token_offset", "labsupport.kernels.kv_token_offsets",
                     "labsupport.block_allocator.BlockAllocator.slot_mapping", "labsupport.kvcache.PagedKVCache._slots")


@function(
    "4.1", "The address line, in torch",
    hint="Follow one token: its position in the sequence tells you which entry of the sequence's block table "
         "to read (how many whole blocks come before it?), that entry is the physical block, and the position "
         "inside the block is what is left over. The offset is the physical block times the elements per block "
         "plus the position inside it times the elements per token. torch.gather reads one table entry per "
         "position. Then ask how large a block id times stride_block can get in a big pool, and which integer "
         "type holds it.",
    forbid=_OFFSET_SHORTCUTS,
    derive="compute the logical block, look it up in the table, and add the offset inside the block yourself",
    name="kv_offsets",
)
def _kv_offsets(rng):
    """Padded int32 tables, the same number of positions per sequence: int64 offsets back, the table unchanged."""
    for table, lens, block_size, stride_block, stride_slot in _address_cases(rng):
        table_t = torch.tensor([row + [7, 7] for row in table], dtype=torch.int32)  # junk a correct line never reads
        gen = torch.Generator().manual_seed(sum(lens))
        count = min(lens)  # the same number of positions per sequence, each inside its sequence
        positions = [sorted(torch.randperm(n, generator=gen)[:count].tolist()) for n in lens]
        given = (table, positions, block_size, stride_block, stride_slot)
        want = torch.tensor(_offsets(*given), dtype=torch.int64)
        huge = max(max(row) for row in table) > 2**30
        slips = [(want.tolist(), "It returned a list: return a tensor of offsets, one per position."),
                 (want.to(torch.int32), "The kernel's offsets are int64: in a large pool a block id times "
                                        "stride_block does not fit in 32 bits."),
                 (torch.tensor(_offsets(*given, mod=False)), "Inside its block a token sits at position % block_size; "
                                                             "that is not where that token's keys are.")]
        if huge:
            slips.append((torch.tensor(_offsets(*given, wrap=True)), "This pool's block ids are close to 2**31: did "
                          "the product overflow a 32-bit integer before you widened it?"))
        yield case(table_t, torch.tensor(positions, dtype=torch.int64), block_size, stride_block, stride_slot,
                   want=want, mistakes=slips, huge=huge, after={0: table_t.clone()},
                   after_remark="it changed the block table it was given; an address computation only reads it",
                   what=f"kv_offsets(block_tables int32 {list(table_t.shape)}, positions [{len(positions)}, "
                        f"{count}], block_size={block_size}, stride_block={stride_block}, stride_slot={stride_slot})")


@function(
    "4.2", "The address line inside the Triton kernels",
    hint="Write the same four steps as in torch, with Triton's operations on whole tiles of tokens: integer "
         "division and remainder by BLOCK_SIZE, one tl.load of the table entry per token (pointer arithmetic on "
         "table_row, masked with `valid` so lanes past the sequence read nothing), then the offset. Widen the "
         "loaded block id to 64 bits before multiplying, as in 4.1. Run the real kernels with your function as "
         "token_offset_fn and compare with the reference before you check.",
    forbid=_OFFSET_SHORTCUTS,
    derive="write the four steps with tl operations in your own @triton.jit function",
    name="my_kv_token_offset",
)
def _triton_offset(rng):
    """Every address for power-of-two blocks, then the gather and attention kernels on NaN-padded pools."""
    from labsupport import kernels as K
    from labsupport.course.harness.lab04 import kernel_case_tensors, tensor_values

    for table, lens, block_size, stride_block, stride_slot in _address_cases(rng):
        if block_size & (block_size - 1):
            continue  # the kernels take power-of-two blocks
        run = {"kind": "addresses", "table": table, "seq_lens": lens, "block_size": block_size,
               "stride_block": stride_block, "stride_slot": stride_slot}
        want = _offsets(table, [list(range(n)) for n in lens], block_size, stride_block, stride_slot)
        yield case(harness="triton_offset", data=run, want={"kv_token_offsets": want}, judge="triton_offset",
                   block_size=block_size, seq_lens=lens, huge=max(max(row) for row in table) > 2**30,
                   what=f"kv_token_offsets with your line (block_size={block_size}, seq_lens={lens})")
    bs = rng.choice((2, 4, 32))  # (block_size, Hq, Hkv, D, seq_lens): lengths k*b - 1, k*b, k*b + 1, GQA and MHA
    shapes = [(16, 4, 2, 32, [33, 16, 15]), (8, 2, 2, 16, [25, 7]), (64, 4, 1, 32, [64, 63]), (1, 3, 1, 16, [9, 4]),
              (bs, 4, rng.choice((1, 2, 4)), 16, [rng.randint(1, 3 * bs + 1) for _ in range(rng.randint(1, 3))])]
    for block_size, hq, hkv, d, lens in shapes:
        run = {"kind": "kernels", "seed": rng.getrandbits(32), "block_size": block_size, "q_heads": hq,
               "kv_heads": hkv, "head_dim": d, "seq_lens": lens}
        q, k, v, table, seq_lens = kernel_case_tensors(run)
        # the attention reference in float64, then rounded to float32: float32's own last bits differ between CPUs
        attention = K.contiguous_decode_attention_reference(q.double(), K.paged_gather_reference(k.double(), table, seq_lens),
                                                            K.paged_gather_reference(v.double(), table, seq_lens), seq_lens)
        want = {"paged_gather": tensor_values(K.paged_gather_reference(k, table, seq_lens)),
                "paged_decode_attention": tensor_values(attention.float())}
        yield case(harness="triton_offset", data=run, want=want, judge="triton_offset", block_size=block_size,
                   seq_lens=lens, q_heads=hq, kv_heads=hkv,
                   what=f"paged_gather and paged_decode_attention with your line (block_size={block_size}, "
                        f"Hq={hq}, Hkv={hkv}, seq_lens={lens})")


# One layer of the lecture's MHA 7B and of its GQA-8 variant, fp32, five query heads on one KV head, a big batch, fp8
_BYTES_CASES = [(64, 8192, 32, 32, 128, 2), (64, 8192, 32, 8, 128, 2), (1, 512, 8, 8, 64, 4), (3, 1, 5, 1, 16, 2),
                (256, 32768, 32, 8, 128, 2), (7, 1000, 12, 4, 64, 1)]


@function(
    "4.3", "Bytes one decode step's attention moves",
    hint="Count what has to cross HBM once for one layer's decode attention: every cached key and value of "
         "every sequence (how many KV heads hold them?), plus the new token's query and the output written "
         "back (how many query heads?). Multiply elements by bytes per element. The block table is a few bytes "
         "per block; leave it out here.",
    forbid=("labsupport.viz.kernel.step_bytes",),
    derive="count the K/V elements of every sequence plus the query and output rows, times bytes per element",
    name="attention_step_bytes",
)
def _step_bytes(rng):
    shapes = list(_BYTES_CASES)
    for _ in range(4):
        hkv = rng.choice((1, 2, 4, 8, 16))
        shapes.append((rng.randint(1, 512), rng.randint(1, 200_000), hkv * rng.choice((1, 2, 3, 4, 8)), hkv,
                       rng.choice((16, 64, 80, 128, 256)), rng.choice((1, 2, 4))))
    for b, s, hq, hkv, d, e in shapes:
        kv, q_out = _parts(b, s, hq, hkv, d, e)
        slips = [(sum(_parts(b, s, hq, hq, d, e)), "That reads K and V once per *query* head. Under GQA several "
                  "query heads share one KV head, and the cache holds only the KV heads."),
                 (kv, "Close, but the query and the output cross HBM too."),
                 (kv + q_out // 2, "That counts the query read but not the output written back (or the other way "
                  "round); both cross HBM, one row per sequence and query head."),
                 (kv // 2 + q_out, "That reads the keys but not the values (or the other way round); the new token "
                  "scores against every key and then mixes every value.")]
        yield case(b, s, hq, hkv, d, e, want=kv + q_out, mistakes=[(w, r) for w, r in slips if w != kv + q_out],
                   what=f"attention_step_bytes(batch={b}, seq_len={s}, num_q_heads={hq}, num_kv_heads={hkv}, "
                        f"head_dim={d}, dtype_bytes={e})")


def _gta(g) -> tuple[int, int]:
    return _parts(g.BATCH, g.SEQ_LEN, g.Q_HEADS, g.KV_HEADS, g.HEAD_DIM, g.DTYPE_BYTES)


def _gta_mistakes(g) -> list[tuple[int, str]]:
    kv, q_out = _gta(g)
    slips = [(kv + q_out, "That is what the fused paged kernel moves; the naive path moves the K/V bytes more "
              "than once."),
             (2 * kv + q_out, "You counted the gather's read and write; what does the attention kernel read "
              "afterwards?"),
             (3 * kv, "The K/V part is right; the query and the output cross HBM too."),
             (3 * (kv + q_out), "The gather copies only K and V; the query is read and the output written once."),
             (3 * _parts(g.BATCH, g.SEQ_LEN, g.Q_HEADS, g.Q_HEADS, g.HEAD_DIM, g.DTYPE_BYTES)[0] + q_out,
              f"The cache holds KV heads, not query heads (GQA-{g.KV_HEADS}: {g.KV_HEADS} of them).")]
    return [(w, r) for w, r in slips if w != 3 * kv + q_out]


value(
    "4.4", "Bytes gather-then-attend moves",
    expected=lambda g: 3 * _gta(g)[0] + _gta(g)[1],
    unit=" B",
    hint="Follow the K/V bytes on the naive path: the gather reads them from the pool and writes them to a "
         "contiguous buffer, and then the attention kernel reads that buffer. Count each crossing of HBM, then "
         "add the query read and the output write once, as in 4.3.",
    mistakes=_gta_mistakes,
    forbid=("labsupport.viz.kernel.step_bytes",),
    derive="count how often the K/V bytes cross HBM on the naive path, then add the query and output once",
)


choice(
    "4.5", "What a good kernel makes irrelevant (FlashInfer's question)",
    answer={"short contiguous runs", "table reads"}, options=TRADEOFFS,
    hint="Sort §10.3's costs of a block size into piles: costs of *reading* the cache during attention "
         "(what the kernel does every step), costs of *holding* or *copying* it (what the allocator does), and "
         "work the engine does on the CPU before the kernel is launched. A better kernel can only change the "
         "first pile. For each item ask: if the kernel read a scattered token as fast as a neighbouring one, "
         "would this cost still be there?",
    mistakes={
        "tail waste": "Tail waste is memory reserved in a sequence's last block; no kernel reads it, so no kernel "
                      "can give it back.",
        "fork copies": "Copy-on-write copies a whole block when one token diverges: that copy is the "
                       "allocator's, and it grows with the block size whatever the attention kernel does.",
        "table building": "Building the longer tables and shipping them to the GPU every step is the engine's CPU "
                          "work, done before any kernel runs; a faster kernel does not shorten it (it is small, "
                          "and it grows as the block shrinks).",
    },
)
