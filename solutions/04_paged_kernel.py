# %% [markdown]
# # Lab 04 — The kernel's new job: attention through a block table (§10.3, step three)
#
# Lab 03 cut the cache into blocks and gave every sequence a block table. The memory arithmetic
# came out beautifully. §10.3's third step is the bill: **"the cost did not vanish, it moved into the
# kernel."** A contiguous cache lets attention stream a sequence's keys as one strided load; a paged
# cache makes the kernel read the block table first and then gather. This lab opens that kernel,
# has you write the line that does the gather, and measures what it costs.
#
# **Learning objectives served** (the lecture's numbering)
#
# * **Objective 4** — *state what the attention kernel must now do that it did not have to do
#   before*: read through the block table, token by token, at close to contiguous speed.
# * **§10.7, first row** — "the gather kernel paging created": *achieved bandwidth on an indirect
#   access*, measured against block size (the last column of §10.3's table).
# * **The FlashInfer reading** — which of §10.3's trade-offs a good enough kernel makes irrelevant,
#   and which one survives any kernel.
#
# The plan follows Triton's own tutorials: say what the kernel must compute, write it, check it
# against plain torch, then benchmark it.
#
# 1. What the attention kernel must now do
# 2. The gather kernel first (bytes in = bytes out)
# 3. The attention kernel, line by line
# 4. You write the address line (checkoffs 4.1, 4.2)
# 5. Measure: the bytes (4.3, 4.4), then the bandwidth against block size
# 6. FlashInfer's question (4.5), and a self-check
#
# Timing in the lecture: the end of minutes 16–36. Here: about 45 minutes.

# %%
import labsupport  # first: without a GPU this routes Triton kernels through its interpreter
import inspect
import statistics
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from labsupport import card
from labsupport import kernels as K
from labsupport import viz
from labsupport.measure.addresses import HISTORIES, address_map
from labsupport.bench import kernel as kernel_bench
from IPython.display import Markdown, display

from labsupport.course.checkoff import check, revealed, unlocked
from labsupport.course.harness import raise_if_unfinished
from labsupport.kvcache import PagedKVCache
from labsupport.viz import kernel as viz_kernel

COURSE = card.card()  # the course card (course.toml): its GPU and model; COURSE.gqa is the model's GQA form
GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")
_ = torch.manual_seed(0)

# %% tags=["givens"]
# The givens: the decode step section 5's exercises are posed on (one layer of the course card's model
# in its GQA form, at the kernel benchmark's headline point). Compute your answers from these names; the
# grader re-runs your code on other values of them.
BATCH = 64          # sequences in the decode batch
SEQ_LEN = 8192      # tokens cached per sequence
Q_HEADS = 32        # card=gqa.num_heads: query heads
KV_HEADS = 8        # card=gqa.num_kv_heads: KV heads ({gqa}: several query heads share each)
HEAD_DIM = 128      # card=gqa.head_dim: elements per head
DTYPE_BYTES = 2     # card=gqa.dtype_bytes: bf16

# %% tags=["nbval-ignore-output"]
if GPU:
    print(f"GPU mode: {torch.cuda.get_device_name()} — the kernels are compiled and section 5 measures real sizes.")
else:
    print("CPU-only mode: the very same Triton kernels run in Triton's interpreter, at tiny sizes. Everything "
          "here is correct on CPU; only timings are meaningless, and section 5 says so where it shows any.")

# %% [markdown]
# ## 1. What the attention kernel must now do
#
# Decode attention for one sequence and one query head reads every cached key and value of the
# sequence once: $\text{out} = \operatorname{softmax}(q K^\top / \sqrt{d})\, V$. The only question
# this lab asks is **where in memory token $t$'s keys are**.
#
# In a reserve-to-max cache shaped $[B, S_{max}, H_{kv}, D]$ the answer is arithmetic on the
# sequence's index $b$ alone — one strided stream per sequence:
#
# $$\text{addr}_{\text{contig}}(b, t) \;=\; (b \cdot S_{max} + t)\cdot H_{kv} D .$$
#
# In a paged pool shaped $[N_{blocks}, b_{blk}, H_{kv}, D]$ a sequence's tokens sit, $b_{blk}$ at a
# time, in whichever physical blocks its block table $T$ names, in the order the table lists them.
# Same FLOPs, same bytes — §2.15's 1 FLOP/byte for MHA attention still holds — but where token $t$
# is now depends on a value the kernel must **load first**: an *indirect* access. Writing that
# address down is what the kernel must now do, and it is your job in section 4.
#
# Here is that formula on the real paged cache (`labsupport.kvcache.PagedKVCache`, the cache every
# later lab uses). Two sequences, A and B, prefill short prompts and then decode side by side, one
# token each per step — the way a decode batch grows — in blocks of 4 tokens:

# %%
BLOCK = 4
cache = PagedKVCache(num_blocks=16, block_size=BLOCK, num_layers=1, num_kv_heads=2, head_dim=32, device=DEVICE)
gen = torch.Generator().manual_seed(0)


def kv(tokens):
    """Random keys and values for `tokens` new tokens of one layer: [1, tokens, Hkv, D] each."""
    return [torch.randn(1, tokens, 2, 32, generator=gen).to(DEVICE) for _ in range(2)]


cache.add_sequence("A", *kv(6))
cache.add_sequence("B", *kv(3))
for step in range(8):  # eight decode steps: both sequences append one token each
    k_new, v_new = (torch.randn(1, 2, 2, 32, generator=gen).to(DEVICE) for _ in range(2))
    cache.append(["A", "B"], k_new, v_new)

for seq in ("A", "B"):
    print(f"sequence {seq}: {cache.allocator.seq_lens[seq]:>2} tokens, block table {cache.block_table(seq)}")

# %% [markdown]
# A's blocks are not neighbours: while A filled its second block, B was taking blocks too. The pool
# every token's keys live in, and its element strides:

# %%
pool = cache.k_cache[0]  # [num_blocks, block_size, Hkv, D]
stride_block, stride_slot = pool.stride(0), pool.stride(1)  # elements between neighbouring blocks, and slots
print(f"K pool of layer 0: shape {tuple(pool.shape)} = [num_blocks, block_size, Hkv, D]; element strides "
      f"{stride_block} per block, {stride_slot} per slot")

# %% [markdown]
# Where in that pool are token 9 of A's keys? Work it out on paper from A's table before section 4
# asks for it in code; the cell after Exercise 4.1 follows token 9 by hand once your function passes.

# %% [markdown]
# ### The kernel's contiguous run
#
# The panel below asks the kernels' own address helper (`kernels.kv_token_offsets`, which runs the
# very Triton function the kernels use) where it reads each token's keys, for three sequences of
# 300, 220 and 130 tokens in the {{ "lecture's GQA-8" if card.is_lecture else "course card's GQA (" + gqa.name + ")" }} shape ({{ gqa.num_kv_heads }} KV heads × {{ gqa.head_dim }} × {{ gqa.dtype_bytes }} bytes =
# {{ gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes:, }} B of K per token per layer). The block tables come from the real `BlockAllocator`, after one of three
# histories:
#
# * **prefill** — a fresh pool, each sequence allocated whole: its blocks happen to be neighbours;
# * **decode together** — short prompts, then all three grow one token per step, as a batch does;
# * **after churn** — a pool that has served many short requests and freed two thirds of them.
#
# Left: where a reserve-to-max cache keeps the same tokens (one straight line per sequence). Right:
# the paged pool. Each segment is a **contiguous run** — tokens the kernel can read as one stream;
# at each break it must fetch the next table entry before it knows where to read. Move the block
# size and watch the runs: that is §10.3's last column, *kernel's contiguous run*.

# %%
viz_kernel.address_panel()

# %% [markdown]
# Count the runs the panel draws, at 16-token blocks:

# %%
for history in HISTORIES:
    amap = address_map([300, 220, 130], 16, history)
    counts = [f"{-(-int(amap.seq_lens[i]) // 16)} blocks in {len(amap.runs(i))} runs" for i in range(3)]
    print(f"{history:>15}: " + "; ".join(counts))

# %% [markdown]
# Two things to notice. With *prefill* in a fresh pool each sequence's blocks are adjacent — one run
# per sequence — which is luck, not design. In the *decode together* history, which is what a serving
# engine actually does, the prompt's blocks stay adjacent and so does the stretch the longest sequence
# grows alone at the end, but while the three grow side by side their blocks alternate: the first
# sequence's 19 blocks come in 12 runs. *After churn* no two of a sequence's blocks are neighbours:
# every block boundary is a break. And no history changes the *bytes*: 300 tokens × {{ gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes:, }} B is read in
# every picture. Only the pattern changes.

# %% [markdown]
# ## 2. The gather kernel first: bytes in = bytes out
#
# The simplest kernel that reads through a block table copies each sequence's tokens out of the pool
# into a contiguous buffer. Every byte it reads it writes once, so its speed compared with a plain
# copy of the same bytes is the cleanest measurement of what the indirection costs.
#
# This is `labsupport.kernels`' gather kernel, printed from the module that runs (not a copy):

# %%
print(viz_kernel.kernel_excerpt(K._paged_gather_kernel, "def _paged_gather_kernel", "tl.store(out_ptr"))

# %% [markdown]
# Read it as a grid of programs, one per (tile of `TILE` tokens, sequence, KV head):
#
# * `token = tile * TILE + tl.arange(0, TILE)` — this program's token positions, a vector;
# * `valid = token < seq_len` — lanes past the end of the sequence do nothing;
# * `kv_token_offset(...)` — **the address line**: where token `token`'s row is (you write it in
#   section 4);
# * one masked `tl.load` of a `[TILE, D]` tile of rows — each row is one token's `D` contiguous
#   values — and one `tl.store` into the contiguous buffer.
#
# Check it against the cache's own `gather` (plain torch indexing) on the two sequences above:

# %%
table = cache.block_table_tensor(["A", "B"])
lens = cache.seq_lens_tensor(["A", "B"])
gathered = K.paged_gather(cache.k_cache[0], table, lens)  # [B, max_len, Hkv, D]
for i, seq in enumerate(("A", "B")):
    n = int(lens[i])
    print(f"sequence {seq}: gather kernel == cache.gather: {torch.equal(gathered[i, :n], cache.gather(seq)[0][0])}; "
          f"{n} tokens × {stride_slot * 4:,} B read and written")

# %% [markdown]
# ## 3. The attention kernel, line by line
#
# `paged_decode_attention` is one Triton kernel. Its grid has one program per **(sequence, KV head)**
# (and per split, for the flash-decoding variant at small batch). We read it top to bottom.
#
# **Who am I, and which tokens are mine?**

# %%
print(viz_kernel.kernel_excerpt(K._decode_attention_kernel, "seq = tl.program_id(0)", "end = seq_len"))

# %% [markdown]
# **The query heads this program serves, and the running softmax state.** Under GQA the
# $G = H_q / H_{kv}$ query heads that share a KV head are handled by one program, so each K/V tile
# is loaded once and used $G$ times. `m_i`, `l_i` and `acc` are the running maximum, the running
# sum of exponentials and the running weighted sum of values: an *online* softmax, so the kernel
# never holds all $S$ scores at once. `table_row` points at this sequence's row of the block table.

# %%
print(viz_kernel.kernel_excerpt(K._decode_attention_kernel, "rows = tl.arange(0, GROUP_PAD)",
                                "head_offset = kv_head"))

# %% [markdown]
# **The loop over tiles — and the one line paging changed.** `PAGED` is a compile-time constant: the
# same kernel body, compiled with `PAGED=False`, *is* the contiguous kernel the benchmark compares
# against. Everything else is identical; only the address of a token's row differs:

# %%
print(viz_kernel.kernel_excerpt(K._decode_attention_kernel, "for tile_start in range", "k = tl.load(k_ptr"))

# %% [markdown]
# **Scores, the online softmax update, and the values.** `tl.dot` when several query heads share the
# tile (tensor cores need ≥ 16 rows, so the group is padded), a broadcast multiply for MHA.
# `alpha` rescales what was accumulated under the old maximum. V is read at the *same* offsets as K:
# the pools share a layout, so one address computation serves both.

# %%
print(viz_kernel.kernel_excerpt(K._decode_attention_kernel, "if USE_DOT:", "m_i = m_new"))

# %% [markdown]
# **Normalise and store.** (The split-K variant stores its unnormalised partials instead, and a
# second kernel merges them.)

# %%
print(viz_kernel.kernel_excerpt(K._decode_attention_kernel, "out = acc / l_i", "tl.store(out_ptr"))

# %% [markdown]
# The address line itself, `kv_token_offset`, which both kernels call, is yours to write in section 4
# (its source prints here once Exercise 4.2 passes). One thing to keep in mind when you do: a block of
# 16 tokens × {{ gqa.num_kv_heads }} KV heads × {{ gqa.head_dim }} is
# $2^{{ '{%d}' % ((16 * gqa.num_kv_heads * gqa.head_dim).bit_length() - 1) }}$ elements, so a pool of
# {{ 2**31 // (16 * gqa.num_kv_heads * gqa.head_dim):, }} blocks
# ({{ 2**31 * gqa.dtype_bytes / GB:.1f }} GB of bf16 keys)
# fills a signed 32-bit offset exactly: its last element sits at $2^{31} - 1$.

# %%
if revealed("4.2"):
    print(inspect.getsource(K.kv_token_offset.fn))

# %% [markdown]
#
# Run the kernel on the cache of section 1 and compare with the plain-torch reference
# (`paged_decode_attention_reference`: gather with torch indexing, softmax in fp32):

# %%
q = torch.randn(2, 4, 32, generator=gen).to(DEVICE)  # B = 2 sequences, Hq = 4 query heads (GQA: 2 per KV head)
out = K.paged_decode_attention(q, cache.k_cache[0], cache.v_cache[0], table, lens)
ref = K.paged_decode_attention_reference(q, cache.k_cache[0], cache.v_cache[0], table, lens)
print("Triton kernel matches the torch reference (|Δ| ≤ 1e-5):", torch.allclose(out, ref, rtol=1e-5, atol=1e-5))

# %% [markdown]
# ## 4. You write the address line
#
# ### Exercise 4.1 — the address line in torch
#
# Write `kv_offsets`: for a batch of block tables and, per sequence, a set of token positions,
# return the element offset of each position's K row (head 0, dimension 0) in a pool shaped
# `[num_blocks, block_size, Hkv, D]`:
#
# * `block_tables`: int32 `[B, max_blocks]` (entries past a sequence's blocks are padding);
# * `positions`: int64 `[B, T]`, logical token positions, each inside its sequence;
# * `stride_block`, `stride_slot`: the pool's element strides, $b_{blk} H_{kv} D$ and $H_{kv} D$;
# * return int64 `[B, T]`.
#
# Derive the address from the pool's shape and the table: which entry of the table
# holds token $t$'s block, which slot of that block holds it, and how many elements precede it.
# `torch.gather(table, 1, index)` reads one table entry per position. The checkoff runs your function on random block tables, block sizes 1 to 256, and a
# pool whose block ids are close to $2^{31}$.

# %%
def kv_offsets(block_tables, positions, block_size, stride_block, stride_slot):
    """Element offsets [B, T] (int64) of each position's K/V row in a paged pool."""
    ### BEGIN SOLUTION 4.1: logical block, physical block through the table, slot, then the int64 offset
    logical_block = positions // block_size
    physical_block = torch.gather(block_tables.long(), 1, logical_block)  # widen before multiplying
    slot = positions % block_size
    return physical_block * stride_block + slot * stride_slot
    ### END SOLUTION


check("4.1", kv_offsets)

# %%
if revealed("4.1"):
    display(Markdown(r"""Through the block table $T$, in a pool shaped $[N_{blocks}, b_{blk}, H_{kv}, D]$:

$$\text{addr}_{\text{paged}}(b, t) \;=\; T\!\left[b,\ \left\lfloor t / b_{blk}\right\rfloor\right]\cdot b_{blk} H_{kv} D
\;+\; (t \bmod b_{blk})\cdot H_{kv} D ,$$

four steps: the logical block, the physical block read from the table (the load that must come first),
the slot, the offset — in 64-bit arithmetic, because a block id times the block stride outgrows int32
on a large pool. Token 9 of A, by hand:"""))
    t = 9
    logical_block = t // BLOCK
    physical_block = cache.block_table("A")[logical_block]
    slot = t % BLOCK
    offset = physical_block * stride_block + slot * stride_slot
    print(f"token {t} of A: logical block {t} // {BLOCK} = {logical_block} -> physical block {physical_block}, "
          f"slot {t} % {BLOCK} = {slot}")
    print(f"element offset = {physical_block} × {stride_block} + {slot} × {stride_slot} = {offset}")
    keys_by_hand = pool.reshape(-1)[offset: offset + stride_slot].view(2, 32)
    keys_gathered = cache.gather("A")[0][0, t]  # the cache's own gather: [Hkv, D] of token t, layer 0
    print("the keys at that address are token 9's keys:", torch.equal(keys_by_hand, keys_gathered))

# %% [markdown]
# Your function is now a gather. Read every token of A and B out of the flat pool at your offsets
# and compare with the cache's own `gather`:

# %%
if unlocked("4.1"):
    flat = pool.reshape(-1)
    positions = torch.stack([torch.arange(int(lens.min())) for _ in range(2)])  # the tokens both sequences have
    offsets = kv_offsets(table.cpu(), positions, BLOCK, stride_block, stride_slot).to(DEVICE)
    rows = flat[offsets[..., None] + torch.arange(stride_slot, device=DEVICE)]  # [B, T, Hkv*D]
    for i, seq in enumerate(("A", "B")):
        want = cache.gather(seq)[0][0, : positions.shape[1]].reshape(positions.shape[1], -1)
        print(f"sequence {seq}: your offsets read the right keys: {torch.equal(rows[i], want)}")

# %% [markdown]
# ### Exercise 4.2 — the same line, inside the Triton kernels
#
# Now write it as the kernels see it. `my_kv_token_offset` has `kv_token_offset`'s signature and is
# called with a whole tile of tokens at once:
#
# * `table_row` — a pointer to this sequence's row of the block table (int32 entries);
# * `token` — an int32 vector of logical token positions; `valid` — a mask, False past the sequence's end;
# * `BLOCK_SIZE` — a compile-time constant; `stride_block`, `stride_slot` — element strides.
#
# Return an int64 vector of offsets. Pointer arithmetic (`table_row + i`) and a masked
# `tl.load(ptr, mask=valid, other=0)` read the table; `.to(tl.int64)` widens. The kernels accept it
# through `token_offset_fn=`: `labsupport` recompiles them with your function in place of theirs.

# %%
@triton.jit
def my_kv_token_offset(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    ### BEGIN SOLUTION 4.2: the same four steps in Triton; mask the table load with `valid`, widen to int64
    logical_block = token // BLOCK_SIZE
    physical_block = tl.load(table_row + logical_block, mask=valid, other=0)
    slot = token % BLOCK_SIZE
    return physical_block.to(tl.int64) * stride_block + slot.to(tl.int64) * stride_slot
    ### END SOLUTION


# %% [markdown]
# Before the checkoff, run the real kernels with your line compiled in, on fresh random block tables
# for several block sizes (the pools come from `kernel_bench.build_pool`, which scatters contiguous
# K/V into a random permutation of physical blocks — what a pool looks like after hours of churn),
# against the torch reference. (Triton does not let an exception raised inside a kernel through as
# itself, so `raise_if_unfinished` raises exercise 4.2's `NotImplementedError` before the launch
# while the exercise is still open; this cell then says so and runs nothing.)

# %%
def with_your_line(kernel, *args, **kwargs):
    """Call a labsupport kernel with my_kv_token_offset compiled in as its address line."""
    raise_if_unfinished(my_kv_token_offset)
    return kernel(*args, token_offset_fn=my_kv_token_offset, **kwargs)


def random_pool(batch, seq_len, num_q_heads, num_kv_heads, head_dim, block_size, seed):
    """q, a scattered K/V pool and its block tables, plus the contiguous K it was built from."""
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(batch, seq_len, num_kv_heads, head_dim, generator=g).to(DEVICE) for _ in range(2))
    q = torch.randn(batch, num_q_heads, head_dim, generator=g).to(DEVICE)
    k_cache, v_cache, tables = kernel_bench.build_pool(k, v, block_size, g)
    return q, k, k_cache, v_cache, tables


try:
    for block_size in (1, 8, 16, 64):
        q_r, k_r, k_pool, v_pool, tables = random_pool(2, 64, 4, 2, 32, block_size, seed=block_size)
        lens_r = torch.tensor([64, 45], dtype=torch.int32, device=DEVICE)
        gathered = with_your_line(K.paged_gather, k_pool, tables, lens_r)
        attended = with_your_line(K.paged_decode_attention, q_r, k_pool, v_pool, tables, lens_r)
        expected = K.paged_decode_attention_reference(q_r, k_pool, v_pool, tables, lens_r)
        print(f"block {block_size:>3}: gather exact {torch.equal(gathered[0], k_r[0]) and torch.equal(gathered[1, :45], k_r[1, :45])}, "
              f"attention matches the reference {torch.allclose(attended, expected, rtol=1e-5, atol=1e-5)}")
except NotImplementedError:
    print("⬜ Exercise 4.2 is still open: write my_kv_token_offset above, then run this cell again.")

# %% [markdown]
# The checkoff repeats this on its own cases: every address for block sizes 1–256 (including block
# ids just below $2^{31}$), then the gather and attention kernels with your line against the
# references, on pools whose unused slots hold NaN — a kernel that reads one wrong slot returns NaN.

# %%
check("4.2", my_kv_token_offset)

# %% [markdown]
# ## 5. Measure: what the indirection costs
#
# ### The bytes first
#
# Decode attention is memory-bound (in bf16, 1 FLOP per byte for MHA and $G$ for GQA with $G$ query
# heads per KV head), so its time is its bytes over the bandwidth it achieves. Count the bytes.
#
# ### Exercise 4.3 — bytes one decode step's attention moves
#
# For one layer and one decode step of the batch: each sequence's new token attends over everything
# its sequence has cached, and the layer's attention output for that token goes back to HBM for the
# next operation. Count every byte that must cross HBM for that, reading each byte once (a kernel that
# fits in on-chip memory needs nothing twice). Mind which head count describes what the cache holds and
# which describes the new token. Leave the block table out (the panel after 4.4 prices it).
# `dtype_bytes` is 2 for bf16.

# %%
def attention_step_bytes(batch, seq_len, num_q_heads, num_kv_heads, head_dim, dtype_bytes):
    """HBM bytes of one layer's decode attention over the batch, each byte moved once."""
    ### BEGIN SOLUTION 4.3: return the bytes one layer's decode attention moves for the batch
    kv_bytes = 2 * batch * seq_len * num_kv_heads * head_dim * dtype_bytes
    q_out_bytes = 2 * batch * num_q_heads * head_dim * dtype_bytes
    return kv_bytes + q_out_bytes
    ### END SOLUTION


check("4.3", attention_step_bytes)

# %%
if revealed("4.3"):
    display(Markdown(r"""Every cached key and value of every sequence is read once ($2\,B\,S\,H_{kv}\,D$
elements — the cache holds the KV heads, not the query heads), the new token's query is read and its
output written ($2\,B\,H_q\,D$), each element `dtype_bytes` bytes."""))

# %% [markdown]
# The benchmark (`labsupport.bench.kernel`) divides exactly this count by the measured time to get
# *achieved* bandwidth. At its headline point —
# {{ "the lecture's 7B with GQA-8" if gqa.name == "lecture-7b-gqa8" else f"the card's {gqa.name} ({gqa.attention})" }},
# one layer, B = 64 sequences of 8,192 tokens — one step's attention moves:

# %%
if unlocked("4.3"):
    headline = attention_step_bytes(BATCH, SEQ_LEN, Q_HEADS, KV_HEADS, HEAD_DIM, DTYPE_BYTES)
    layers = COURSE.gqa.num_layers  # the card's model
    print(f"{headline:,} B per layer = {headline / 1e9:.3f} GB; × {layers} layers = {layers * headline / 1e9:.1f} GB "
          "of attention traffic per decode step (the weights come on top)")

# %% [markdown]
# ### Exercise 4.4 — what gather-then-attend moves
#
# The naive way to reuse a contiguous attention kernel on a paged cache: gather K and V into
# contiguous buffers (section 2's kernel), then attend. At the headline point — the givens `BATCH`,
# `SEQ_LEN`, `Q_HEADS`, `KV_HEADS`, `HEAD_DIM`, `DTYPE_BYTES`, one layer — how many bytes cross HBM?
# Set `gta_bytes`; you may use `attention_step_bytes` and plain arithmetic.

# %%
### BEGIN SOLUTION 4.4: set gta_bytes to the HBM bytes of gather-then-attend at the headline point, one layer
q_out = 2 * BATCH * Q_HEADS * HEAD_DIM * DTYPE_BYTES  # the query read, the output written
kv_once = attention_step_bytes(BATCH, SEQ_LEN, Q_HEADS, KV_HEADS, HEAD_DIM, DTYPE_BYTES) - q_out
gta_bytes = 3 * kv_once + q_out  # pool read, buffer write, buffer read; q and out once
### END SOLUTION
check("4.4", gta_bytes)

# %% [markdown]
# The panel counts the same bytes for the whole model, stacks the naive path's extra traffic on top,
# and draws the **block table** to scale (int32 entries, one per block per sequence): it is the black
# slice on top of each bar. Slide the block size down to 1 and look for it; the readout gives its
# share of the step.

# %%
viz_kernel.step_bytes_panel()

# %% [markdown]
# (The table is int32 here, as in vLLM and `labsupport`'s cache. The lecture's "≈ 2 KB" for a 4K
# sequence assumes 8-byte entries:)

# %%
viz.errata_note("Block-table overhead")

# %%
if revealed("4.4"):
    display(Markdown("""So even at *identical* bandwidth, gather-then-attend takes about three times as long as a
fused kernel that reads through the table itself: **a naive gather can lose enough bandwidth to eat the
win**. The fused kernel's whole job is to make the indirect read cost (almost) nothing extra. That
"three times" is a byte count (your 4.4), not a measurement: the benchmark below times it, and only a
GPU run's timings can confirm or refute it."""))

# %% [markdown]
# ### The benchmark: bandwidth against block size
#
# The cell below runs `kernel_bench`'s own measurement functions — the ones behind
# `python -m labsupport bench kernel` and `bench gpu` — across block sizes:
#
# * the device's **copy bandwidth** (`dst.copy_(src)`, bytes read + written per second): the ceiling;
# * the **gather kernel**, beside a plain copy of the same bytes;
# * decode attention: the **fused paged** kernel, the **contiguous** kernel (the same code with
#   `PAGED=False`), **gather-then-attend**, and torch's `scaled_dot_product_attention` on contiguous
#   tensors. Every attention variant is scored by the bytes attention must move (the count of 4.3)
#   over its time: *effective* bandwidth.
#
# On a GPU it measures {{ "the lecture's" if gqa.name == "lecture-7b-gqa8" else "the card's" }} shape at real size
# (B = 64, S = 8,192, {{ gqa.attention }}, bf16) with `triton.testing.do_bench`. **On a CPU it runs the
# same functions at a toy size in Triton's interpreter, where Python executes each kernel program in turn:
# those timings measure the interpreter, and say nothing about any GPU.** (A 64-token sequence also caps
# the block size at 64.)

# %% tags=["nbval-ignore-output"]
def cpu_timer(fn, repeats=2):
    """Median milliseconds of fn on the CPU (a stand-in for do_bench; meaningless for GPUs)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


if GPU:
    dtype, timer, num_sms = kernel_bench.sweep_dtype(), None, torch.cuda.get_device_properties(0).multi_processor_count
    # the benchmark's headline point (B = 64, S = 8,192) on the card's model in its GQA form
    gather_shape = dict(kernel_bench.GATHER_SHAPE, num_kv_heads=COURSE.gqa.num_kv_heads)
    head_dim, num_q_heads = COURSE.gqa.head_dim, COURSE.gqa.num_heads
    decode_case = (64, 8192, COURSE.gqa.num_kv_heads, (1, 8, 16, 32, 64, 128, 256))
    copy_bandwidth = kernel_bench.measure_copy_bandwidth(2**30)["copy_bandwidth"]
else:
    dtype, timer, num_sms = torch.float32, cpu_timer, 1
    gather_shape, head_dim, num_q_heads = dict(batch=2, seq_len=64, num_kv_heads=2), 32, 4
    decode_case = (2, 64, 2, (1, 8, 16, 32, 64))
    src = torch.randn(2, 64, 2, 32)
    dst = torch.empty_like(src)
    copy_bandwidth = 2 * src.numel() * src.element_size() / (cpu_timer(lambda: dst.copy_(src)) * 1e-3)

gather_rows = kernel_bench.gather_rows(copy_bandwidth, dtype, decode_case[3], shape=gather_shape, head_dim=head_dim,
                                       device=DEVICE, timer=timer)
decode_rows = kernel_bench.decode_rows([decode_case], copy_bandwidth, dtype, num_sms, num_q_heads=num_q_heads,
                                       head_dim=head_dim, device=DEVICE, timer=timer)
here = viz_kernel.BenchResults(
    f"this machine ({torch.cuda.get_device_name() if GPU else 'CPU, Triton interpreter'})",
    copy_bandwidth, gather_rows, decode_rows, kernel_bench.environment())
print(viz_kernel.bandwidth_readout(here))

# %% [markdown]
# Whatever the timings, the benchmark also checked correctness at every block size: the gathered
# buffer is bit-identical to the contiguous K it was scattered from, and the paged kernel's output
# matches the contiguous kernel's.

# %%
print("gather bit-exact at every block size:", all(r["bit_exact"] for r in gather_rows))
print("paged attention == contiguous attention (|Δ| ≤ 1e-2) at every block size:",
      all(r["max_abs_diff_vs_contiguous"] <= 1e-2 for r in decode_rows))

# %% [markdown]
# ### The plot: the kernel's contiguous run, measured
#
# The chart puts §10.3's last column on a GPU: bandwidth (as % of the measured copy bandwidth, or in
# GB/s) against block size, for the gather kernel (left) and for decode attention (right). It opens
# on the **GPU results shipped with this repository** — `data/gpu_results.json`, written by
# `python -m labsupport bench gpu` on a CUDA GPU — when that file exists. When it does not, the chart
# says so and shows the empty axes and the lines a GPU run will fill in; it invents nothing. The
# *results* dropdown also offers this machine's run from the cell above (on a CPU: interpreter
# timings, for the shape of the code path only).
#
# What to look for on a GPU: does the fused paged kernel's line stay near the contiguous kernel's as
# the block size shrinks, and where (if anywhere) does it fall away? How far below both does
# gather-then-attend sit?

# %%
shipped = viz_kernel.load_gpu_results(Path("..") / viz_kernel.GPU_RESULTS)
sources = {}
if shipped is not None:
    sources[f"shipped GPU results: {shipped.label}"] = shipped
else:
    sources["shipped GPU results: none yet"] = None
print("data/gpu_results.json:", "found, " + shipped.label if shipped is not None else
      "not found — no GPU run has been committed to this repository, so there are no GPU numbers to show yet")

# %%
sources[here.label] = here
viz_kernel.bandwidth_panel(sources)

# %% [markdown]
# ### What the paper measured on its own kernel
#
# The vLLM paper asked this lab's question of its first PagedAttention kernel (Kwon et al., SOSP 2023,
# §7.1, Fig. 18a): at the same batch and length, its attention kernel took **20–26% longer** than
# FasterTransformer's highly optimized contiguous kernel — the price of loading the block table and
# of handling variable lengths in one launch. The paper's answer is the one §10.3 gives: that overhead
# touches only the attention operator (the linear layers, most of a step's time, are unchanged), and
# it buys a batch several times larger, so end-to-end throughput rises by far more than 26% is lost.
# Put in this lab's units, a kernel 1.20–1.26× slower than contiguous at equal bytes runs at 79–83% of
# the contiguous kernel's effective bandwidth. That is the line to compare with the GPU chart above
# when it has data (`bench gpu` sets its own target at ≤ 1.15×), and FlashInfer (next) is the claim
# that a good enough kernel closes most of that gap.

# %%
for slower in (1.20, 1.26):
    print(f"{slower:.2f}× the contiguous kernel's time at equal bytes = {1 / slower:.1%} of its effective bandwidth")

# %% [markdown]
# ## 6. FlashInfer's question
#
# The optional reading asks: *which of §10.3's trade-offs does a sufficiently good kernel make
# irrelevant, and which one survives any kernel?* §10.3 lists what a small block costs and what a
# large one costs:
#
# * **tail waste**: up to $b_{blk}-1$ reserved, unfilled slots per sequence;
# * **table reads**: one table entry per block per sequence, loaded by the attention kernel every step
#   before it can load that block's keys;
# * **table building**: the engine (on the CPU) builds every sequence's longer table and copies the
#   batch's tables to the GPU every step, before the kernel is launched;
# * **short contiguous runs**: the kernel's reads break at every block boundary;
# * **fork copies**: copy-on-write copies a *whole block* when one token diverges (§10.4).
#
# For each, ask who pays it: the allocator, the engine, or the kernel while it reads.
#
# Evidence from this lab. The bytes panel showed the table's share of a step's bytes: 4 bytes per
# block per sequence against {{ 2 * gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes // KiB }} KiB of K and V
# per token per layer ({{ gqa.attention }}, bf16) — about
# {{ 4 / (2 * gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes):.1% }} at block size 1 and
# {{ 4 / (16 * 2 * gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes):.3% }} at 16. The kernel walk-through showed
# what a "run" is to the kernel: each program reads *one KV head*, so even the contiguous kernel reads one
# $D \times 2 = {{ gqa.head_dim * gqa.dtype_bytes }}$-byte row per token (two full 128-byte cache lines at
# $D = 128$ in bf16) with the other heads' rows in between.
# Paging does not make those pieces smaller; it only makes the *next* row's address depend on a table
# entry that must be loaded first. FlashInfer treats the
# paged cache as a block-sparse matrix with any block size, down to one token ("vector-sparse"), and
# its README reports that its vector-sparse attention reaches about 90% of the bandwidth of its dense
# kernels at the same problem size (FlashInfer, github.com/flashinfer-ai/flashinfer; Ye et al.,
# 2025). The GPU chart above is the measurement that checks this claim for *this* kernel.
#
# ### Exercise 4.5
#
# Set `kernel_fixes` to the set of trade-offs (named as in the list, lower case) that a
# sufficiently good kernel makes irrelevant.

# %%
### BEGIN SOLUTION 4.5: set kernel_fixes to a set of the trade-offs above, e.g. {"tail waste"}
kernel_fixes = {"short contiguous runs", "table reads"}
### END SOLUTION
check("4.5", kernel_fixes)

# %%
if revealed("4.5"):
    display(Markdown("""What paging left the kernel is latency: the table load must complete before the K load can
start, and a kernel hides it by keeping many tiles in flight — which is why a vector-sparse kernel can
read one-token pages near its dense bandwidth.

| trade-off of the block size | whose cost is it? | a good kernel? |
|---|---|---|
| tail waste | memory the allocator holds | survives |
| table reads | work the kernel does while reading | hidden |
| table building | the engine's CPU work before each launch | survives (small) |
| short contiguous runs | how fast the kernel reads | hidden |
| fork copies | memory traffic the allocator causes | survives |

The survivors are worth saying out loud. **Tail waste** is a property of the allocator — memory
reserved in a sequence's last block that no kernel ever reads, so no kernel can give it back; it
is why the lecture's table still prefers 16 to 256. **Fork copies** grow with the block too: a
divergent token after a fork of a 256-token block copies 256 tokens' K and V. **Table building**
is the engine's: a 4,096-entry table per 4K sequence at one-token blocks is built and shipped every
step whatever the kernel does — small next to the KV, but not zero. Once the kernel is good enough,
the block size is chosen for memory, sharing and that bookkeeping — which is why engines built on
FlashInfer can afford tiny pages (SGLang's radix cache, for one, has defaulted to one token per
page), and why the lecture says FlashInfer "exists"."""))

# %% [markdown]
# Exercise 3 of the lecture asked for the two measurements you would need before choosing a block
# size. This lab built the first: *achieved attention bandwidth as a function of contiguous run
# length on your kernel*. The second — your fork rate — belongs to §10.4's copy-on-write.

# %% [markdown]
# ## Self-check
#
# 1. Paging changed the attention kernel. Did it change the number of bytes decode attention moves?
# 2. A colleague's paged kernel computes `physical_block * stride_block` in int32. On which pools
#    does it break, and how?
# 3. Why is gather-then-attend slower than a fused kernel even if both run at the same bandwidth, and
#    by about how much?
# 4. Block size 1 makes tail waste zero. What did the lecture say about it, and what would a
#    FlashInfer-class kernel change about that verdict?
#
# The answers show once 4.4 and 4.5 pass (answers 3 and 4 are theirs):

# %%
if revealed("4.4", "4.5"):
    gqa = COURSE.gqa  # the card's model in its GQA form
    share = 4 / (2 * gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes)  # 4 B of table per token's K and V, block 1
    wraps = 2**31 // (16 * gqa.num_kv_heads * gqa.head_dim)  # 16-token blocks that fill a signed 32-bit offset
    display(Markdown(rf"""1. No. The same K and V bytes are read once either way (plus q and out); the block table adds
   4 bytes per block per sequence, at most about {share:.1%} of the step (block size 1, {gqa.attention}). What changed is the *pattern*:
   each run of tokens is found through a table entry the kernel must load first.
2. On large pools: once a block id times `stride_block` exceeds $2^{{31}} - 1$ elements (e.g. beyond
   {wraps:,} blocks of 16 tokens × {gqa.num_kv_heads} KV heads × {gqa.head_dim}), the product wraps negative and the kernel
   reads the wrong memory — a wrong answer or an illegal-address fault, never a clean error.
3. It moves the K/V bytes three times: read from the pool, write to the buffer, read the buffer
   (checkoff 4.4), against once for the fused kernel.
4. The lecture's table calls a 1-token run "pathological" and notes the 4,096-entry table. With a
   kernel that reads scattered rows at near-contiguous bandwidth (FlashInfer reports ~90% for its
   vector-sparse kernels), the run length stops mattering and the table's bytes were never large;
   the choice of block size then rests on tail waste (smaller is better) and fork copies (smaller
   is better) — and on the CPU-side cost of building and shipping longer tables every step
   ("table building" in 4.5: the one table cost no kernel removes)."""))

# %% [markdown]
# Next: §10.4 — blocks can be shared: copy-on-write and the 5.7× fan-out.
