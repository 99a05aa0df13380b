"""Lab 04 checkoffs: the attention kernel's new job — read through the block table (§10.3 step three).

4.1  the address line in torch: (sequence, token) -> element offset in the pool, through the table
4.2  the same line as a ``@triton.jit`` function, compiled into the real kernels and run against
     the torch reference on random block tables (labsupport.course.harness's "triton_offset")
4.3  bytes one decode step's attention moves (one layer)
4.4  bytes the naive gather-then-attend moves for the same step
4.5  FlashInfer's question: which of §10.3's block-size trade-offs a good kernel makes irrelevant (the
     reading costs: short runs and the kernel's table reads; not the allocator's or the engine's costs)

Expected values come from Python integers written out here (4.1, 4.2's addresses, 4.3, 4.4) or from
the kernels' plain-torch references on the same tensors (4.2's outputs), never from the student's code.
"""
from __future__ import annotations

import random

import torch

from labsupport.course.registry import case, choice, function, givens, value

# §10.3's costs of a block size. "Table lookups" is two costs, and lab 04's self-check keeps them apart: the
# kernel reading one more entry per block every step (a read, which a good kernel hides), and the engine
# building and shipping the longer tables every step (CPU work no kernel touches).
TRADEOFFS = ("tail waste", "fork copies", "short contiguous runs", "table reads", "table building")


def _hidden(rng):
    """Another decode step: a batch, a length and a GQA shape other than the headline point's."""
    kv_heads = rng.choice((2, 4, 16))
    return dict(BATCH=rng.choice((8, 16, 128, 256)), SEQ_LEN=rng.choice((1024, 2048, 4096, 16_384)),
                Q_HEADS=kv_heads * rng.choice((3, 5, 6)), KV_HEADS=kv_heads, HEAD_DIM=rng.choice((64, 80, 256)),
                DTYPE_BYTES=rng.choice((1, 4)))


# One layer of the lecture's 7B with GQA-8 at the kernel benchmark's headline point (the lab's givens cell):
# B = 64 sequences of S = 8,192 tokens, 32 query heads, 8 KV heads, head dim 128, bf16.
G = givens(hidden=_hidden)


def _kv_bytes(batch, seq_len, num_kv_heads, head_dim, dtype_bytes) -> int:
    """K and V of every sequence, read once: 2 tensors x B x S x Hkv x D elements."""
    return 2 * batch * seq_len * num_kv_heads * head_dim * dtype_bytes


def _q_out_bytes(batch, num_q_heads, head_dim, dtype_bytes) -> int:
    """One query row per sequence and head is read, one output row is written."""
    return 2 * batch * num_q_heads * head_dim * dtype_bytes


def _expected_offsets(table: list[list[int]], positions: list[list[int]], block_size: int,
                      stride_block: int, stride_slot: int) -> list[list[int]]:
    # Python integers never overflow: the ground truth for pools of any size.
    return [[table[b][p // block_size] * stride_block + (p % block_size) * stride_slot for p in row]
            for b, row in enumerate(positions)]


def _random_tables(gen: torch.Generator, batch: int, blocks_per_seq: int, num_blocks: int, high: bool = False):
    """Distinct physical ids per batch, shuffled the way a pool looks after churn (or near 2**31)."""
    need = batch * blocks_per_seq
    if high:
        ids = [2**31 - 1 - i for i in torch.randperm(need, generator=gen).tolist()]
    else:
        ids = torch.randperm(num_blocks, generator=gen)[:need].tolist()
    return [ids[b * blocks_per_seq:(b + 1) * blocks_per_seq] for b in range(batch)]


def _address_cases(rng: random.Random):
    """(table, seq_lens, block_size, stride_block, stride_slot): small pools, block size 1..256, two shapes
    drawn from `rng`, and a pool whose block ids sit just below 2**31, where an int32 product wraps."""
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
    table = _random_tables(gen, 2, 3, 0, high=True)
    cases.append((table, [48, 33], 16, 16 * 8 * 128, 8 * 128))  # offsets around 3.5e13 elements
    return cases


# The kernels' own address line and the helper that runs it: the exercises ask for that line.
# The paged cache's private slot arithmetic too: stride_block is block_size * stride_slot in every pool, so its
# slots (block * b + offset, int64) times stride_slot are the offsets.
_OFFSET_SHORTCUTS = ("labsupport.kernels.kv_token_offset", "labsupport.kernels.kv_token_offsets",
                     "labsupport.block_allocator.BlockAllocator.slot_mapping", "labsupport.kvcache.PagedKVCache._slots")


# --- 4.1 ------------------------------------------------------------------------------------

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
    """Padded int32 tables (junk after each sequence's blocks), the same number of positions per sequence;
    the table must come back unchanged (labsupport.course.harness's judge "kv_offsets")."""
    for table, lens, block_size, stride_block, stride_slot in _address_cases(rng):
        width = len(table[0]) + 2  # padding entries after each table, as a real batch has
        table_t = torch.zeros(len(table), width, dtype=torch.int32)
        for b, row in enumerate(table):
            table_t[b, :len(row)] = torch.tensor(row, dtype=torch.int32)
        table_t[:, len(table[0]):] = 7  # junk a correct line never reads for these positions
        gen = torch.Generator().manual_seed(sum(lens))
        count = min(lens)  # the same number of positions per sequence, each inside its sequence
        positions = [sorted(torch.randperm(n, generator=gen)[:count].tolist()) for n in lens]
        want = torch.tensor(_expected_offsets(table, positions, block_size, stride_block, stride_slot),
                            dtype=torch.int64)
        huge = max(max(row) for row in table) > 2**30
        yield case(table_t, torch.tensor(positions, dtype=torch.int64), block_size, stride_block, stride_slot,
                   want=want, judge="kv_offsets", positions=positions, huge=huge, after={0: table_t.clone()},
                   after_remark="it changed the block table it was given; an address computation only reads it",
                   what=f"kv_offsets(block_tables int32 {list(table_t.shape)}, positions [{len(positions)}, "
                        f"{count}], block_size={block_size}, stride_block={stride_block}, stride_slot={stride_slot})")


# --- 4.2 ------------------------------------------------------------------------------------

def _kernel_shapes(rng: random.Random) -> list[tuple]:
    """(block_size, Hq, Hkv, D, seq_lens): lengths k*b - 1, k*b, k*b + 1, GQA and MHA, and one drawn shape."""
    shapes = [(16, 4, 2, 32, [33, 16, 15]), (8, 2, 2, 16, [25, 7]), (64, 4, 1, 32, [64, 63]), (1, 3, 1, 16, [9, 4])]
    bs = rng.choice((2, 4, 32))
    shapes.append((bs, 4, rng.choice((1, 2, 4)), 16, [rng.randint(1, 3 * bs + 1) for _ in range(rng.randint(1, 3))]))
    return shapes


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
    """Every address for power-of-two blocks (ids near 2**31 too), then the gather and attention kernels on
    NaN-padded pools; the expected outputs are the kernels' plain-torch references on the same tensors
    (labsupport.course.harness's "triton_offset" builds them, here and where the student's line runs)."""
    from labsupport import kernels as K
    from labsupport.course.harness import kernel_case_tensors, tensor_values

    for table, lens, block_size, stride_block, stride_slot in _address_cases(rng):
        if block_size & (block_size - 1):
            continue  # the kernels take power-of-two blocks
        run = {"kind": "addresses", "table": table, "seq_lens": lens, "block_size": block_size,
               "stride_block": stride_block, "stride_slot": stride_slot}
        want = _expected_offsets(table, [list(range(n)) for n in lens], block_size, stride_block, stride_slot)
        yield case(harness="triton_offset", data=run, want={"kv_token_offsets": want}, judge="triton_offset",
                   block_size=block_size, seq_lens=lens, huge=max(max(row) for row in table) > 2**30,
                   what=f"kv_token_offsets with your line (block_size={block_size}, seq_lens={lens})")
    for block_size, hq, hkv, d, lens in _kernel_shapes(rng):
        run = {"kind": "kernels", "seed": rng.getrandbits(32), "block_size": block_size, "q_heads": hq,
               "kv_heads": hkv, "head_dim": d, "seq_lens": lens}
        q, k, v, table, seq_lens = kernel_case_tensors(run)
        want = {"paged_gather": tensor_values(K.paged_gather_reference(k, table, seq_lens)),
                "paged_decode_attention": tensor_values(K.paged_decode_attention_reference(q, k, v, table, seq_lens))}
        yield case(harness="triton_offset", data=run, want=want, judge="triton_offset", block_size=block_size,
                   seq_lens=lens, q_heads=hq, kv_heads=hkv,
                   what=f"paged_gather and paged_decode_attention with your line (block_size={block_size}, "
                        f"Hq={hq}, Hkv={hkv}, seq_lens={lens})")


# --- 4.3 and 4.4 ----------------------------------------------------------------------------

_BYTES_CASES = [
    (64, 8192, 32, 32, 128, 2),   # the lecture's MHA 7B, one layer
    (64, 8192, 32, 8, 128, 2),    # its GQA-8 variant
    (1, 512, 8, 8, 64, 4),        # fp32
    (3, 1, 5, 1, 16, 2),          # five query heads share one KV head
    (256, 32768, 32, 8, 128, 2),
    (7, 1000, 12, 4, 64, 1),      # an fp8 cache
]


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
        want = _kv_bytes(b, s, hkv, d, e) + _q_out_bytes(b, hq, d, e)
        slips = [
            (_kv_bytes(b, s, hq, d, e) + _q_out_bytes(b, hq, d, e),  # K/V read per query head
             "That reads K and V once per *query* head. Under GQA several query heads share one KV head, and the "
             "cache holds only the KV heads."),
            (_kv_bytes(b, s, hkv, d, e), "Close, but the query and the output cross HBM too."),
            (want - _q_out_bytes(b, hq, d, e) // 2, "That counts the query read but not the output written back (or "
             "the other way round); both cross HBM, one row per sequence and query head."),
            (want - _kv_bytes(b, s, hkv, d, e) // 2, "That reads the keys but not the values (or the other way "
             "round); the new token scores against every key and then mixes every value."),
        ]
        yield case(b, s, hq, hkv, d, e, want=want, mistakes=[(w, r) for w, r in slips if w != want],
                   what=f"attention_step_bytes(batch={b}, seq_len={s}, num_q_heads={hq}, num_kv_heads={hkv}, "
                        f"head_dim={d}, dtype_bytes={e})")


def _gta_bytes(g) -> int:
    return 3 * _kv_bytes(g.BATCH, g.SEQ_LEN, g.KV_HEADS, g.HEAD_DIM, g.DTYPE_BYTES) \
        + _q_out_bytes(g.BATCH, g.Q_HEADS, g.HEAD_DIM, g.DTYPE_BYTES)


def _gta_mistakes(g) -> list[tuple[int, str]]:
    kv = _kv_bytes(g.BATCH, g.SEQ_LEN, g.KV_HEADS, g.HEAD_DIM, g.DTYPE_BYTES)
    q_out = _q_out_bytes(g.BATCH, g.Q_HEADS, g.HEAD_DIM, g.DTYPE_BYTES)
    slips = [
        (kv + q_out, "That is what the fused paged kernel moves; the naive path moves the K/V bytes more than once."),
        (2 * kv + q_out, "You counted the gather's read and write; what does the attention kernel read afterwards?"),
        (3 * kv, "The K/V part is right; the query and the output cross HBM too."),
        (3 * (kv + q_out), "The gather copies only K and V; the query is read and the output written once."),
        (3 * _kv_bytes(g.BATCH, g.SEQ_LEN, g.Q_HEADS, g.HEAD_DIM, g.DTYPE_BYTES) + q_out,
         f"The cache holds KV heads, not query heads (GQA-{g.KV_HEADS}: {g.KV_HEADS} of them)."),
    ]
    return [(w, r) for w, r in slips if w != _gta_bytes(g)]


value(
    "4.4", "Bytes gather-then-attend moves",
    expected=_gta_bytes,
    unit=" B",
    hint="Follow the K/V bytes on the naive path: the gather reads them from the pool and writes them to a "
         "contiguous buffer, and then the attention kernel reads that buffer. Count each crossing of HBM, then "
         "add the query read and the output write once, as in 4.3.",
    mistakes=_gta_mistakes,
    forbid=("labsupport.viz.kernel.step_bytes",),
    derive="count how often the K/V bytes cross HBM on the naive path, then add the query and output once",
)


# --- 4.5 ------------------------------------------------------------------------------------

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
