"""Lab 04 checkoffs: the attention kernel's new job — read through the block table (§10.3 step three).

4.1  the address line in torch: (sequence, token) -> element offset in the pool, through the table
4.2  the same line as a ``@triton.jit`` function, compiled into the real kernels and run against
     the torch reference on random block tables
4.3  bytes one decode step's attention moves (one layer)
4.4  bytes the naive gather-then-attend moves for the same step
4.5  FlashInfer's question: which of §10.3's block-size trade-offs a good kernel makes irrelevant (the
     reading costs: short runs and the kernel's table reads; not the allocator's or the engine's costs)

Expected values come from Python integers written out here (4.1, 4.2's addresses, 4.3, 4.4) or from
the kernels' plain-torch references (4.2's outputs), never from the student's code.
"""
from __future__ import annotations

import random

import torch

from labsupport.course.checkoff import (Mismatch, RemoteError, as_number, call, call_with, choice, expect_close,
                                        function, is_triton_function, raise_if_unfinished, value)
from labsupport.course.registry import givens
from labsupport.units import fmt_number

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


# One layer of the lecture's 7B with GQA-8 at the kernel benchmark's headline point:
# B = 64 sequences of S = 8,192 tokens, 32 query heads, 8 KV heads, head dim 128, bf16.
G = givens(lecture=dict(BATCH=64, SEQ_LEN=8192, Q_HEADS=32, KV_HEADS=8, HEAD_DIM=128, DTYPE_BYTES=2),
           hidden=_hidden)


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


def _address_cases(rng: random.Random | None = None):
    """(table, seq_lens, block_size, stride_block, stride_slot): small pools, block size 1..256, and
    a pool whose block ids sit just below 2**31, where an int32 product wraps; with `rng`, two more
    shapes the lab never shows."""
    gen = torch.Generator().manual_seed(4_1 if rng is None else rng.getrandbits(62))
    shapes = [(1, 16, 1, 8, 40), (3, 8, 2, 32, 70), (2, 1, 4, 16, 19), (4, 64, 8, 128, 300), (2, 256, 2, 64, 600),
              (3, 32, 5, 16, 97)]
    if rng is not None:
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

def _kernel_call(fn, fn_name: str, kernel, *args, **kwargs):
    """Run a labsupport kernel with the student's line compiled in; Triton's errors become a Mismatch."""
    try:
        return call_with(fn, kernel, *args, answer_kw="token_offset_fn", **kwargs)
    except (NotImplementedError, Mismatch):
        raise
    except Exception as exc:  # the interpreter or compiler reports an error inside the student's line
        kind, text = (exc.type_name, exc.message) if isinstance(exc, RemoteError) else (type(exc).__name__, str(exc))
        if "NotImplementedError" in text or kind == "NotImplementedError":
            raise NotImplementedError(f"{fn_name} still raises NotImplementedError") from None
        short = text.strip().splitlines()[-1][:300] if text.strip() else kind
        raise Mismatch(f"{kernel.__name__} with your {fn_name} raised {kind}: {short}") from None


# --- 4.1 ------------------------------------------------------------------------------------

def _offset_cases(rng):
    cases = []
    for table, lens, block_size, stride_block, stride_slot in _address_cases(rng):
        width = len(table[0]) + 2  # padding entries after each table, as a real batch has
        table_t = torch.zeros(len(table), width, dtype=torch.int32)
        for b, row in enumerate(table):
            table_t[b, :len(row)] = torch.tensor(row, dtype=torch.int32)
        table_t[:, len(table[0]):] = 7  # junk a correct line never reads for these positions
        gen = torch.Generator().manual_seed(sum(lens))
        count = min(lens)  # the same number of positions per sequence, each inside its sequence
        positions = [sorted(torch.randperm(n, generator=gen)[:count].tolist()) for n in lens]
        want = _expected_offsets(table, positions, block_size, stride_block, stride_slot)
        huge = max(max(row) for row in table) > 2**30
        cases.append((table_t, positions, block_size, stride_block, stride_slot, want, huge))
    return cases


@function(
    "4.1", "The address line, in torch",
    hint="Follow one token: its position in the sequence tells you which entry of the sequence's block table "
         "to read (how many whole blocks come before it?), that entry is the physical block, and the position "
         "inside the block is what is left over. The offset is the physical block times the elements per block "
         "plus the position inside it times the elements per token. torch.gather reads one table entry per "
         "position. Then ask how large a block id times stride_block can get in a big pool, and which integer "
         "type holds it.",
    cases=_offset_cases,
    forbid=_OFFSET_SHORTCUTS,
    derive="compute the logical block, look it up in the table, and add the offset inside the block yourself",
)
def _kv_offsets(fn, case):
    table_t, positions, block_size, stride_block, stride_slot, want, huge = case
    lens_count = len(positions), len(positions[0])
    before = table_t.clone()
    what = (f"kv_offsets(block_tables int32 {list(table_t.shape)}, positions [{lens_count[0]}, {lens_count[1]}], "
            f"block_size={block_size}, stride_block={stride_block}, stride_slot={stride_slot})")
    got = call(fn, table_t, torch.tensor(positions, dtype=torch.int64), block_size, stride_block, stride_slot)
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what} returned a {type(got).__name__}; return a tensor of offsets, one per position.")
    if not torch.equal(table_t, before):
        raise Mismatch(f"{what} changed the block table it was given; an address computation only reads it.")
    if tuple(got.shape) != lens_count:
        raise Mismatch(f"{what} returned shape {tuple(got.shape)}, expected one offset per position: "
                       f"({lens_count[0]}, {lens_count[1]}).")
    if got.dtype != torch.int64:
        raise Mismatch(f"{what} returned {got.dtype} offsets. The kernel's offsets are int64: in a large pool "
                       "a block id times stride_block does not fit in 32 bits.")
    if got.tolist() != want:
        b, t = next((b, t) for b in range(len(want)) for t in range(lens_count[1]) if got[b, t].item() != want[b][t])
        p = positions[b][t]
        raise Mismatch(f"{what}: position {p} of sequence {b} gave offset {got[b, t].item():,}, which is not "
                       "where that token's keys are." + (
                           " This pool's block ids are close to 2**31: did the product overflow a 32-bit "
                           "integer before you widened it?" if huge else ""))


# --- 4.2 ------------------------------------------------------------------------------------

def _kernel_cases(device: torch.device, rng: random.Random | None = None):
    """Pools with NaN in every slot no sequence owns, permuted tables, lengths k*b - 1, k*b, k*b + 1."""
    gen = torch.Generator().manual_seed(4_2 if rng is None else rng.getrandbits(62))
    shapes = [(16, 4, 2, 32, [33, 16, 15]), (8, 2, 2, 16, [25, 7]), (64, 4, 1, 32, [64, 63]), (1, 3, 1, 16, [9, 4])]
    if rng is not None:
        bs = rng.choice((2, 4, 32))
        shapes.append((bs, 4, rng.choice((1, 2, 4)), 16, [rng.randint(1, 3 * bs + 1) for _ in range(rng.randint(1, 3))]))
    cases = []
    for block_size, hq, hkv, d, lens in shapes:
        need = [-(-n // block_size) for n in lens]
        num_blocks = sum(need) + 3
        ids = torch.randperm(num_blocks, generator=gen).tolist()
        # wide enough that even lanes past a sequence's end stay inside the table
        width = max(max(need), -(-256 // block_size)) + 1
        table = torch.zeros(len(lens), width, dtype=torch.int32)
        k = torch.full((num_blocks, block_size, hkv, d), float("nan"))
        v = torch.full((num_blocks, block_size, hkv, d), float("nan"))
        cursor = 0
        for b, n in enumerate(lens):
            blocks = ids[cursor:cursor + need[b]]
            cursor += need[b]
            table[b, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            for j, block in enumerate(blocks):
                filled = min(block_size, n - j * block_size)
                k[block, :filled] = torch.randn(filled, hkv, d, generator=gen)
                v[block, :filled] = torch.randn(filled, hkv, d, generator=gen)
        q = torch.randn(len(lens), hq, d, generator=gen)
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        cases.append(tuple(t.to(device) for t in (q, k, v, table, seq_lens)))
    return cases


def _triton_cases(rng):
    """Addresses (with their expected offsets) and whole kernel runs (with their torch references)."""
    from labsupport import kernels as K

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = []
    for table, lens, block_size, stride_block, stride_slot in _address_cases(rng):
        if block_size & (block_size - 1):
            continue  # the kernels take power-of-two blocks
        # padded like a real batch's table, wide enough that no lane of a tile reads past the tensor
        width = max(len(table[0]), -(-256 // block_size)) + 1
        table_t = torch.zeros(len(table), width, dtype=torch.int32)
        table_t[:, :len(table[0])] = torch.tensor(table, dtype=torch.int32)
        positions = [list(range(n)) for n in lens]
        want = _expected_offsets(table, positions, block_size, stride_block, stride_slot)
        huge = max(max(row) for row in table) > 2**30
        cases.append(("addresses", table_t.to(device), torch.tensor(lens, dtype=torch.int32, device=device),
                      block_size, stride_block, stride_slot, want, huge))
    for q, k, v, table, seq_lens in _kernel_cases(device, rng):
        cases.append(("kernels", q, k, v, table, seq_lens, K.paged_gather_reference(k, table, seq_lens),
                      K.paged_decode_attention_reference(q, k, v, table, seq_lens)))
    return cases


@function(
    "4.2", "The address line inside the Triton kernels",
    hint="Write the same four steps as in torch, with Triton's operations on whole tiles of tokens: integer "
         "division and remainder by BLOCK_SIZE, one tl.load of the table entry per token (pointer arithmetic on "
         "table_row, masked with `valid` so lanes past the sequence read nothing), then the offset. Widen the "
         "loaded block id to 64 bits before multiplying, as in 4.1. Run the real kernels with your function as "
         "token_offset_fn and compare with the reference before you check.",
    cases=_triton_cases,
    forbid=_OFFSET_SHORTCUTS,
    derive="write the four steps with tl operations in your own @triton.jit function",
)
def _triton_offset(fn, case):
    raise_if_unfinished(fn)
    from labsupport import kernels as K

    if not is_triton_function(fn):
        raise Mismatch("this checkoff wants a @triton.jit function with kv_token_offset's signature "
                       "(table_row, token, valid, BLOCK_SIZE, stride_block, stride_slot); decorate yours with "
                       "@triton.jit.")
    name = getattr(getattr(fn, "fn", fn), "__name__", "function")
    if case[0] == "addresses":  # 1. the addresses themselves, including a pool whose ids sit just below 2**31
        _, table_t, lens_t, block_size, stride_block, stride_slot, want, huge = case
        got = _kernel_call(fn, name, K.kv_token_offsets, table_t, lens_t, block_size, stride_block,
                           stride_slot)
        got = _tensor_result(got, f"kv_token_offsets with your {name}").cpu()
        for b, n in enumerate(lens_t.tolist()):
            if got[b, :n].tolist() != want[b]:
                t = next(t for t in range(n) if got[b, t].item() != want[b][t])
                raise Mismatch(
                    f"with block_size={block_size}, token {t} of sequence {b} got offset {got[b, t].item():,}, "
                    "not the address of its keys." + (
                        " The block ids here are near 2**31: widen before you multiply." if huge else ""))
        return
    # 2. the real kernels, with your line compiled in, against the plain-torch references
    _, q, k, v, table, seq_lens, gathered_ref, attention_ref = case
    block_size = k.shape[1]
    gathered = _tensor_result(_kernel_call(fn, name, K.paged_gather, k, table, seq_lens), "paged_gather")
    if gathered.shape != gathered_ref.shape or not torch.equal(gathered.to(gathered_ref.device), gathered_ref):
        raise Mismatch(f"paged_gather with your {name} (block_size={block_size}, seq_lens={seq_lens.tolist()}) "
                       "copied the wrong values: some token was read from the wrong slot of the pool.")
    out = _tensor_result(_kernel_call(fn, name, K.paged_decode_attention, q, k, v, table, seq_lens),
                         "paged_decode_attention").to(attention_ref.device)
    if out.shape != attention_ref.shape or not torch.allclose(out, attention_ref, rtol=1e-5, atol=1e-5):
        nan = bool(torch.isnan(out).any())
        worst = float((out - attention_ref).abs().nan_to_num(float("inf")).max()) if out.shape == attention_ref.shape \
            else float("inf")
        raise Mismatch(f"paged_decode_attention with your {name} (block_size={block_size}, "
                       f"Hq={q.shape[1]}, Hkv={k.shape[2]}, seq_lens={seq_lens.tolist()}) differs from the reference "
                       f"by up to {fmt_number(float(format(worst, '.3g')))}." + (
                           " It produced NaN: it read pool slots no sequence owns (they hold NaN)." if nan else ""))


def _tensor_result(x, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise Mismatch(f"{what} returned {type(x).__name__}, not a tensor.")
    return x


# --- 4.3 and 4.4 ----------------------------------------------------------------------------

_BYTES_CASES = [
    (64, 8192, 32, 32, 128, 2),   # the lecture's MHA 7B, one layer
    (64, 8192, 32, 8, 128, 2),    # its GQA-8 variant
    (1, 512, 8, 8, 64, 4),        # fp32
    (3, 1, 5, 1, 16, 2),          # five query heads share one KV head
    (256, 32768, 32, 8, 128, 2),
    (7, 1000, 12, 4, 64, 1),      # an fp8 cache
]


def _bytes_cases(rng):
    shapes = list(_BYTES_CASES)
    for _ in range(4):
        hkv = rng.choice((1, 2, 4, 8, 16))
        shapes.append((rng.randint(1, 512), rng.randint(1, 200_000), hkv * rng.choice((1, 2, 3, 4, 8)), hkv,
                       rng.choice((16, 64, 80, 128, 256)), rng.choice((1, 2, 4))))
    cases = []
    for b, s, hq, hkv, d, e in shapes:
        want = _kv_bytes(b, s, hkv, d, e) + _q_out_bytes(b, hq, d, e)
        per_query_head = _kv_bytes(b, s, hq, d, e) + _q_out_bytes(b, hq, d, e)  # K/V read per query head
        cases.append(((b, s, hq, hkv, d, e), want, per_query_head, _kv_bytes(b, s, hkv, d, e)))
    return cases


@function(
    "4.3", "Bytes one decode step's attention moves",
    hint="Count what has to cross HBM once for one layer's decode attention: every cached key and value of "
         "every sequence (how many KV heads hold them?), plus the new token's query and the output written "
         "back (how many query heads?). Multiply elements by bytes per element. The block table is a few bytes "
         "per block; leave it out here.",
    cases=_bytes_cases,
    forbid=("labsupport.viz.kernel.step_bytes",),
    derive="count the K/V elements of every sequence plus the query and output rows, times bytes per element",
)
def _step_bytes(fn, case):
    (batch, seq_len, hq, hkv, d, b), want, per_query_head, kv_only = case
    what = (f"attention_step_bytes(batch={batch}, seq_len={seq_len}, num_q_heads={hq}, num_kv_heads={hkv}, "
            f"head_dim={d}, dtype_bytes={b})")
    got = as_number(call(fn, batch, seq_len, hq, hkv, d, b), f"{what} returned a value that")
    if got == per_query_head and hq != hkv:
        raise Mismatch(f"{what} returned {got:,.0f}: that reads K and V once per *query* head. Under GQA "
                       "several query heads share one KV head, and the cache holds only the KV heads.")
    if got == kv_only:
        raise Mismatch(f"{what} returned {got:,.0f}: close, but the query and the output cross HBM too.")
    one_row = _q_out_bytes(batch, hq, d, b) // 2
    if got == want - one_row:
        raise Mismatch(f"{what} returned {got:,.0f}: that counts the query read but not the output written "
                       "back (or the other way round); both cross HBM, one row per sequence and query head.")
    if got == want - _kv_bytes(batch, seq_len, hkv, d, b) // 2:
        raise Mismatch(f"{what} returned {got:,.0f}: that reads the keys but not the values (or the other way "
                       "round); the new token scores against every key and then mixes every value.")
    expect_close(got, want, what)


value(
    "4.4", "Bytes gather-then-attend moves",
    expected=lambda g: 3 * _kv_bytes(g.BATCH, g.SEQ_LEN, g.KV_HEADS, g.HEAD_DIM, g.DTYPE_BYTES)
    + _q_out_bytes(g.BATCH, g.Q_HEADS, g.HEAD_DIM, g.DTYPE_BYTES),
    unit=" B",
    hint="Follow the K/V bytes on the naive path: the gather reads them from the pool and writes them to a "
         "contiguous buffer, and then the attention kernel reads that buffer. Count each crossing of HBM, then "
         "add the query read and the output write once, as in 4.3.",
    mistakes=[
        (_kv_bytes(64, 8192, 8, 128, 2) + _q_out_bytes(64, 32, 128, 2),
         "That is what the fused paged kernel moves; the naive path moves the K/V bytes more than once."),
        (2 * _kv_bytes(64, 8192, 8, 128, 2) + _q_out_bytes(64, 32, 128, 2),
         "You counted the gather's read and write; what does the attention kernel read afterwards?"),
        (3 * _kv_bytes(64, 8192, 8, 128, 2),
         "The K/V part is right; the query and the output cross HBM too."),
        (3 * (_kv_bytes(64, 8192, 8, 128, 2) + _q_out_bytes(64, 32, 128, 2)),
         "The gather copies only K and V; the query is read and the output written once."),
        (3 * _kv_bytes(64, 8192, 32, 128, 2) + _q_out_bytes(64, 32, 128, 2),
         "The cache holds KV heads, not query heads (GQA-8: 8 of them)."),
    ],
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
