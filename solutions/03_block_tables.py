# %% [markdown]
# # Lab 03 — PagedAttention: the KV cache as virtual memory (§10.3, Exercise 3)
#
# The fix is the oldest idea in operating systems. Stop requiring a sequence's KV to be contiguous:
# cut the cache into fixed-size blocks of $b$ tokens, keep a pool of free blocks, and give each
# sequence a **block table** mapping its logical block $i$ to whichever physical block holds it. A
# sequence grows by taking one more block when its last one fills. This lab builds the board picture
# from a real paged cache, has you write the two functions the mechanism is made of, and then
# measures the one knob worth tuning — the block size — on real traces.
#
# **Learning objectives served** (the lecture's numbering)
#
# * **Objective 3** — distinguish internal from external fragmentation, and say which one paging
#   eliminates and which one it merely bounds (here: *bounds*, to less than one block).
# * **Objective 4** — draw the block table for a batch of sequences, compute its memory overhead, and
#   state what the attention kernel must now do that it did not have to do before.
#
# What you build: the two functions the mechanism is made of — the slot mapping every read and write
# goes through (3.1) and the append that grows a table (3.2), run in lockstep with the real
# allocator — then the count of sequences a paged pool holds (3.5) and the bytes of the block tables
# a kernel is handed (3.7), which later cells run on the chat workload's pool and on Exercise 3's
# workload. You measure the busy pool on the real allocator (3.6), work back from the lecture's table
# size (3.8), and read the block-size measurements of section 6 (3.11).
#
# Timing in the lecture: minutes 16–36 (*never cut*). Here: about 50 minutes; the scoreboard at the end lists its checkoffs.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
import math
import random
from statistics import NormalDist

import torch

from labsupport import card, ledger, workloads
from labsupport.block_allocator import BlockAllocator
from labsupport.measure.block_size import fitting_batch, measure_workloads
from IPython.display import Markdown, display

from labsupport.course.checkoff import check, revealed, unlocked
from labsupport.kvcache import ContiguousKVCache, PagedKVCache
from labsupport.memory_stats import OutOfBlocks
from labsupport.specs import LECTURE_7B, LECTURE_GPU  # the lecture's own card: only to recompute what it printed
from labsupport.units import KiB, fmt_bytes, fmt_gb, fmt_pct
from labsupport.viz import a11y
from labsupport.viz import memory as viz_memory

torch.manual_seed(0)
COURSE = card.card()  # the course card (course.toml): the GPU and the model this lab is posed on
MODEL, GPU = COURSE.mha, COURSE.gpu  # the card's model in its MHA form (the givens' KV per token), and its GPU
# The lecture's card, kept only where a cell states what the lecture printed (its errata, inline below):
LECTURE_BUDGET = ledger.kv_budget_bytes(LECTURE_7B, LECTURE_GPU)  # the lecture's 62.52 GB of KV budget
LECTURE_KV = LECTURE_7B.kv_bytes_per_token  # the lecture's 512 KiB a token
THERE = "" if COURSE.is_lecture else f" on the lecture's card ({LECTURE_GPU.name}, {LECTURE_7B.name})"

# %% tags=["givens"]
# The givens: the quantities every exercise in this lab is posed on. Compute your answers from these
# names; the grader re-runs your code on other values of them.
LAYERS = 32                   # card=mha.num_layers: the course's model in its MHA form, {mha} (as many KV heads as query heads)
KV_HEADS = 32                 # card=mha.num_kv_heads: KV heads per layer
HEAD_DIM = 128                # card=mha.head_dim: elements per head
DTYPE_BYTES = 2               # card=mha.dtype_bytes: bf16 K and V
HBM_BYTES = 80 * 10**9        # card=gpu.hbm_bytes: one {gpu}, decimal GB
PARAMS = 6_740_000_000        # card=mha.num_params: weights, held in bf16
WEIGHT_BYTES = 2              # card=mha.dtype_bytes: bytes per parameter
RESERVE_BYTES = 4 * 10**9     # activations and the runtime's workspace
PROMPT = 512                  # the chat workload: tokens prefilled
OUTPUT = 128                  # tokens decoded, one per step
BLOCK = 16                    # tokens per block
TABLE_TOKENS = 4096           # the sequence whose block table section 4 prices
ENTRY_BYTES = 4               # one block id in the real cache's table (int32)
PRINTED_TABLE_BYTES = 2048    # the lecture's "2 KB" for that table
MEDIAN_TOKENS = 800           # Exercise 3's lognormal: its median ...
TAIL_TOKENS = 20_000          # ... and the length that ...
TAIL_SHARE = 0.05             # ... this share of sequences exceed

# %%
KV = 2 * LAYERS * KV_HEADS * HEAD_DIM * DTYPE_BYTES  # K and V of one token, every layer (lab 02)
BUDGET = HBM_BYTES - WEIGHT_BYTES * PARAMS - RESERVE_BYTES  # what is left for KV (lab 02)
print(f"KV per token {KV:,} B; KV budget {fmt_bytes(BUDGET)}")

# %% [markdown]
# ## 1. The board: two sequences, one pool
#
# Below is a real `PagedKVCache` — 12 physical blocks of 4 token slots, K and V tensors per layer
# shaped `[num_blocks, block_size, kv_heads, head_dim]` — after two sequences were prefilled and then
# decoded in turns, as an engine's batch does. **A** holds 8 tokens, **B** 5. Logical blocks on the
# left, the shared physical pool on the right; each arrow is one block-table entry. Green cells hold
# a token, orange ones are reserved in a sequence's last block but not yet filled.

# %%
board = viz_memory.block_table_explorer(num_blocks=12, block_size=4, a_tokens=8, b_tokens=5)
alloc = board.cache.allocator
for name in ("A", "B"):
    print(f"{name}: {alloc.seq_lens[name]} tokens, block table {alloc.block_tables[name]}")
viz_memory.block_table_figure(alloc, ["A", "B"], title="Before: A holds 8 tokens, B holds 5").show()
display(a11y.namer())  # hidden: gives every chart on the page its text alternative (this lab's panels come after checkoffs)

# %% [markdown]
# The arrows cross: A's second block is physical block 2, B's first is block 1. Nothing requires a
# sequence's blocks to be neighbours, so decoding two sequences in turns interleaves them in the pool.
#
# **Ask the room:** grow sequence A by one token. What happens?

# %%
print(board.step("grow A"))
viz_memory.block_table_figure(alloc, ["A", "B"], highlight=board.highlight,
                              title="After A + 1 token: one new block, one new table entry").show()

# %% [markdown]
# A's last block was full, so the allocator took the next free block from the pool and the table
# gained one entry. That is the whole mechanism. Drive it yourself — grow either sequence, free one and
# watch its blocks return to the free list (they are reused *last*: the free list is first-in,
# first-out), change the block size. Every button calls the real cache.

# %%
viz_memory.block_table_explorer(num_blocks=12, block_size=4)

# %% [markdown]
# ## 2. From a position to a slot: what every read and write now goes through
#
# The pool's slots are numbered block after block, $b$ to a block: physical block 0 holds slots
# 0 … $b - 1$, block 1 the next $b$, and so on. A sequence's tokens fill its *logical* blocks in order,
# $b$ to a block, and its table names the physical block behind each logical one (A's table above).
# Which slot holds token $p$ of a sequence?
#
# That *slot mapping* is what the cache uses to scatter each new token's K and V into the pool, and
# what the attention kernel uses to gather a sequence's keys back. A contiguous cache read $S$ keys
# as one strided load; a paged cache must look up the table for every block — **that is the kernel's
# new job** (lab 04 writes it).
#
# ### Exercise 3.1 — slot_mapping
#
# Write `slot_mapping(block_table, block_size, start, end)`: the list of physical slots of token
# positions `start, …, end − 1`. The checkoff compares it with the real allocator's mapping after
# random allocate / decode / free traffic (tables full of scattered, out-of-order blocks, block sizes
# 1 to 128, not only powers of two), then writes K/V through your slots into a real `PagedKVCache`
# and checks that gathering each sequence through its table returns exactly what was written.

# %%
def slot_mapping(block_table, block_size, start, end):
    """Physical slots of token positions [start, end) of a sequence with this block table."""
    ### BEGIN SOLUTION 3.1: return [slot of position p for p in range(start, end)] through block_table
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]
    ### END SOLUTION


check("3.1", slot_mapping)

# %%
if revealed("3.1"):
    display(Markdown(r"Token $p$ lives in logical block $\lfloor p / b \rfloor$ at offset $p \bmod b$, so "
                     r"$\text{slot}(p) = \text{table}\!\left[\lfloor p / b \rfloor\right] \times b + (p \bmod b)$."))

# %% [markdown]
# The cache does exactly this when it writes: the slot mapping of A's 9 tokens, and the K values
# stored there (the explorer writes each token's position into its K vector, so you can see every
# token landed where the table says):

# %%
slots_a = alloc.slot_mapping("A", 0, alloc.seq_lens["A"])
k_pool = board.cache.k_cache[0].reshape(-1, 2)[:, 0]  # [num_blocks * block_size] first K element per slot
print(f"A's slots: {slots_a}")
print(f"K stored at those slots: {[int(k_pool[s]) for s in slots_a]}")
k_a, _ = board.cache.gather("A")
print(f"gather('A') through the table: {[int(x) for x in k_a[0, :, 0, 0]]}")
if unlocked("3.1"):  # your slot_mapping reading the same pool
    yours = slot_mapping(list(alloc.block_tables["A"]), alloc.block_size, 0, alloc.seq_lens["A"])
    print(f"your slot_mapping: {yours}; the K it reads: {[int(k_pool[s]) for s in yours]}")

# %% [markdown]
# ### Exercise 3.2 — append one token
#
# Write `append(block_table, seq_len, block_size, take_free_block)`: reserve the slot of token number
# `seq_len` (the sequence's next token). If the blocks in `block_table` are all full, call
# `take_free_block()` — it returns a physical block id from the pool — and append that id to
# `block_table` (modify the list in place). Return the new token's slot.
#
# The checkoff runs your function in lockstep with the real `BlockAllocator` on random workloads:
# whenever the allocator grows a table, your `take_free_block()` hands you the block it took, and
# your table and slot must match the allocator's. Asking for a block when the last one still has room
# fails the checkoff.

# %%
def append(block_table, seq_len, block_size, take_free_block):
    """Reserve the slot of token `seq_len`, taking a new block when the table's blocks are full."""
    ### BEGIN SOLUTION 3.2: grab a block with take_free_block() when the last is full; return the new token's slot
    if seq_len == len(block_table) * block_size:
        block_table.append(take_free_block())
    return block_table[seq_len // block_size] * block_size + seq_len % block_size
    ### END SOLUTION


check("3.2", append)

# %% [markdown]
# A sequence never reserves for a length it has not reached, and it can grow for as long as the
# *pool* has a free block — there is no per-sequence limit left. The real cache, grown until the pool
# runs out, and (once 3.2 passes) your `append` grown the same way, handed the pool's free blocks in
# the order the real pool hands them out:

# %%
grower = PagedKVCache(num_blocks=6, block_size=4, num_layers=1, num_kv_heads=1, head_dim=2)
grower.add_sequence("A", torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
try:
    while True:
        grower.append(["A"], torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
except OutOfBlocks as exc:
    print(f"A reached {grower.allocator.seq_lens['A']} tokens in blocks {grower.block_table('A')}; then: {exc}")
if unlocked("3.2"):
    free_ids = BlockAllocator(6, 4).free_block_ids()  # a fresh pool's free list, in the order it hands blocks out
    grown, grown_slots = [], []
    try:
        while True:
            grown_slots.append(append(grown, len(grown_slots), 4, lambda: free_ids.pop(0)))
    except IndexError:  # the pool had no block left to take
        print(f"your append: {len(grown_slots)} tokens in blocks {grown}, slots {grown_slots}")

# %% [markdown]
# ## 3. Step one: internal fragmentation collapses to less than one block
#
# A sequence of $n$ tokens holds $\lceil n / b \rceil$ blocks. The only slots it reserves and does not
# fill are the tail of its last block: at most $b - 1$ tokens, *whatever* $S_{max}$ is.
#
# ### Exercise 3.3 — tail waste
#
# Write `tail_waste(seq_len, block_size)`: the slots of its blocks a sequence of `seq_len` tokens does
# not fill. The checkoff compares with the blocks the real allocator hands out.

# %%
def tail_waste(seq_len, block_size):
    """Reserved-but-empty token slots in the last block of a sequence of seq_len tokens."""
    ### BEGIN SOLUTION 3.3: return the unfilled slots of the sequence's blocks
    return -seq_len % block_size
    ### END SOLUTION


check("3.3", tail_waste)

# %% [markdown]
# ### Exercise 3.4 — the mean tail
#
# A sequence's final length is whatever the workload makes it. If final lengths are spread evenly
# modulo $b$, how many positions does a sequence's last block leave unfilled on average at
# $b$ = `BLOCK`, in tokens? Set `mean_tail_16`. (Your `tail_waste` from 3.3 may help; so may a
# small $b$ worked by hand.)

# %%
### BEGIN SOLUTION 3.4: set mean_tail_16 to the mean tail waste at b = BLOCK for lengths uniform modulo b
mean_tail_16 = sum(tail_waste(n, BLOCK) for n in range(BLOCK)) / BLOCK  # each remainder once
### END SOLUTION
check("3.4", mean_tail_16)

# %% [markdown]
# Once 3.4 passes, the same mean measured on the real allocator: every length from 1 to 1,600 tokens
# (exactly uniform modulo 16), each allocated and its table read back.

# %%
if revealed("3.4"):
    probe = BlockAllocator(200, 16)
    tails = []
    for n in range(1, 1601):
        tails.append(len(probe.allocate("s", n)) * 16 - n)
        probe.free("s")
    mean_tail = sum(tails) / len(tails)
    print(f"b = 16: max tail {max(tails)} tokens, mean tail {mean_tail} tokens "
          f"= {mean_tail * KV:,.0f} B = {mean_tail * KV / 2**20:.2f} MiB per sequence")
    display(Markdown("The tails of the remainders $0, 1, \\dots, b-1$ are $0, b-1, \\dots, 1$: their mean is "
                     "$(b-1)/2$. The lecture rounds it to $b/2$."))

# %% [markdown]
# ### Exercise 3.5 — how many sequences fit now
#
# Write `sequences_that_fit(budget_bytes, kv_bytes, block_size, seq_tokens)`: how many sequences of
# `seq_tokens` tokens, each at that length, a paged pool holds at once when it is cut into blocks of
# `block_size` tokens from `budget_bytes` of memory, at `kv_bytes` a token. The checkoff tries it on
# other models, cards, block sizes and lengths than this lab's; the cells below run it on the
# chat workload's pool and, in section 5, on Exercise 3's workload.

# %%
def sequences_that_fit(budget_bytes, kv_bytes, block_size, seq_tokens):
    """Sequences of seq_tokens tokens a paged pool of block_size-token blocks holds in budget_bytes."""
    ### BEGIN SOLUTION 3.5: return how many seq_tokens-token sequences the paged pool holds at once
    return (budget_bytes // (block_size * kv_bytes)) // -(-seq_tokens // block_size)
    ### END SOLUTION


check("3.5", sequences_that_fit)

# %% [markdown]
# The real allocator, on a pool of 16-token blocks filling `BUDGET`, admits 640-token sequences until
# it refuses one; once 3.5 passes, your count beside it:

# %%
pool = BlockAllocator(ledger.num_blocks(BUDGET, 16, KV), 16, kv_bytes_per_token=KV)
while pool.can_allocate(pool.blocks_needed(640)):
    pool.allocate(len(pool.block_tables), 640)
st = pool.stats()
if unlocked("3.5"):
    paged_seqs = sequences_that_fit(BUDGET, KV, 16, 640)
    print(f"your sequences_that_fit(BUDGET, KV, 16, 640): {paged_seqs}; the allocator admitted "
          f"{len(pool.block_tables)} ({pool.num_blocks:,} blocks of {16 * KV:,} B, {pool.num_free_blocks} left)")
    print(f"utilization {fmt_pct(st.occupied_bytes / BUDGET)} of the budget (naive: "
          f"{fmt_pct(ledger.naive_utilization(BUDGET, 4096, 640, KV))}); concurrency "
          f"{ledger.naive_concurrency(BUDGET, 4096, KV)} -> {paged_seqs}")
    lecture_fit = ledger.paged_concurrency(LECTURE_BUDGET, 640, 16, LECTURE_KV)  # whole blocks, the lecture's card
    display(Markdown(f"The lecture prints 29 → 199 (6.9×); whole blocks give {lecture_fit}{THERE}: no reading "
                     f"of its inputs gives 199 (its 0.328 GB a sequence, 512 KiB read as 512,000 B, gives "
                     f"{int(LECTURE_BUDGET // (640 * 512_000))})."
                     + ("" if COURSE.is_lecture else f" This card's pool holds {len(pool.block_tables)}.")))

# %% [markdown]
# That count's utilization is read at the **end** of every sequence's life, when each holds its
# final length. Lab 02's second reading was over the life: it filled its slots once, then decoded.
# A paged pool filled that way, with the count above, would keep free the blocks its sequences will
# need for their last tokens until they need them. A paged engine does not hold them back: a free
# block goes to whichever sequence needs one now, and requests arrive and finish all the time. A
# busy pool is therefore *full* — every block held — by sequences at every point of their lives, as
# many just prefilled as one step from the end.
#
# ### Exercise 3.6 — the busy pool
#
# Every sequence runs the chat workload's life: `PROMPT` tokens prefilled, then `OUTPUT` decode
# steps; during its $k$-th step, before that step's token is written, it holds `PROMPT` + $k - 1$
# tokens. Take the busy pool, every block held by such sequences, as many at each step of the life
# as at any other, read while a step runs. Set `paged_over_life` to the share of `BUDGET` that holds
# tokens, a fraction. Measure the sequences on a real `BlockAllocator` (`stats()` counts the tokens
# held and the slots reserved).

# %%
### BEGIN SOLUTION 3.6: set paged_over_life to the share of BUDGET holding tokens in the busy pool, read while a step runs
ages = BlockAllocator(OUTPUT * -(-(PROMPT + OUTPUT) // BLOCK), BLOCK)
for k in range(OUTPUT):  # one sequence at each step of the life, the step's token not yet written
    ages.allocate(k, PROMPT + k)
held = ages.stats()
whole_blocks = BUDGET // (BLOCK * KV)  # the pool: every whole block of the budget, each held
paged_over_life = whole_blocks * BLOCK * KV / BUDGET * held.occupied_tokens / held.reserved_tokens
### END SOLUTION
check("3.6", paged_over_life)

# %%
if revealed("3.6"):
    busy = ledger.paged_utilization_time_avg(BUDGET, PROMPT, OUTPUT, BLOCK, KV)
    pool_cover = ledger.num_blocks(BUDGET, BLOCK, KV) * BLOCK * KV / BUDGET
    once = ledger.paged_concurrency(BUDGET, PROMPT + OUTPUT, BLOCK, KV) * (PROMPT + (OUTPUT - 1) / 2) * KV / BUDGET
    print(f"the busy pool: its blocks are {fmt_pct(busy / pool_cover, 3)} filled and cover "
          f"{fmt_pct(pool_cover, 3)} of the budget: {fmt_pct(busy, 3)} of the budget holds tokens")
    print(f"filled once with the end-of-life count and decoded (lab 02's way): {fmt_pct(once)} on average, the "
          f"blocks of tokens not yet written sitting free")
    same = "the same to the lecture's digit" if f"{100 * busy:.1f}" == "98.7" else "not the lecture's digit"
    display(Markdown(f"The lecture prints 98.7% as 100% less its 1.3% internal fragmentation (a $b/2$ tail in each "
                     f"of 199 sequences); the busy pool gives {fmt_pct(busy)}: the real lengths' tails in whole "
                     f"blocks, {same}."))


# %% [markdown]
# **Say it twice: paging does not reduce KV bytes.** A token costs the same
# {{ N.kv_bytes_per_token / KiB:,g }} KiB in a paged cache as in a contiguous one; paging reduces
# *reserved-and-unused* bytes.

# %%
shape = dict(num_layers=MODEL.num_layers, num_kv_heads=MODEL.num_kv_heads, head_dim=MODEL.head_dim,
             dtype=torch.bfloat16)
paged_cache = PagedKVCache(num_blocks=1, block_size=1, **shape)
contiguous_cache = ContiguousKVCache(max_seqs=1, s_max=1, **shape)
print(f"KV bytes per token: paged {paged_cache.kv_bytes_per_token:,} B, "
      f"contiguous {contiguous_cache.kv_bytes_per_token:,} B")
del paged_cache, contiguous_cache

# %% [markdown]
# ## 4. What the block table itself costs
#
# To find a token, the kernel has nothing but the sequence's block table: the real cache hands it
# the tables of a batch as one integer tensor, `block_table_tensor`. Nothing else about the sequence
# is stored twice. Here is that tensor for the board's two sequences (A holds 9 tokens now, B 5, in
# blocks of 4):

# %%
print(board.cache.block_table_tensor(["A", "B"]))

# %% [markdown]
# ### Exercise 3.7 — what the kernel is handed
#
# Write `batch_table_bytes(seq_lens, block_size, entry_bytes)`: the bytes of the block-table tensor the
# real cache hands the kernel for a batch of sequences of these lengths, in blocks of `block_size`
# tokens, with entries `entry_bytes` bytes wide. (Put sequences of other lengths in a small
# `PagedKVCache` and look at the tensor's shape.) The checkoff compares with the tensor the real cache
# builds, on random batches.

# %%
def batch_table_bytes(seq_lens, block_size, entry_bytes):
    """Bytes of the block-table tensor of a batch of sequences with these lengths."""
    ### BEGIN SOLUTION 3.7: return the bytes of the batch's block-table tensor
    return len(seq_lens) * max(-(-n // block_size) for n in seq_lens) * entry_bytes
    ### END SOLUTION


check("3.7", batch_table_bytes)

# %% [markdown]
# ### Exercise 3.8 — the lecture's 2 KB
#
# The lecture prices the block table of one `TABLE_TOKENS`-token sequence at $b$ = `BLOCK` at
# `PRINTED_TABLE_BYTES` bytes (its "2 KB"). How wide, in bytes, is one entry of the table it priced?
# Set `lecture_entry_bytes`.

# %%
### BEGIN SOLUTION 3.8: set lecture_entry_bytes to the entry width, in bytes, behind the lecture's PRINTED_TABLE_BYTES
lecture_entry_bytes = PRINTED_TABLE_BYTES // batch_table_bytes([TABLE_TOKENS], BLOCK, 1)
### END SOLUTION
check("3.8", lecture_entry_bytes)

# %% [markdown]
# Once 3.7 and 3.8 pass: the real cache's table for that sequence, and for a batch of 32 sequences
# drawn from Exercise 3's lognormal (median 800 tokens, 5% over 20,000), each beside your
# `batch_table_bytes`:

# %%
if unlocked("3.7", "3.8"):
    def real_table(lengths, block_size):
        """The block-table tensor the real cache hands the kernel for sequences of these lengths."""
        cache = PagedKVCache(num_blocks=sum(ledger.blocks_for(n, block_size) for n in lengths),
                             block_size=block_size, num_layers=1, num_kv_heads=1, head_dim=1)
        for i, n in enumerate(lengths):
            cache.allocator.allocate(i, n)
        return cache.block_table_tensor(list(range(len(lengths))))

    t = real_table([TABLE_TOKENS], BLOCK)
    print(f"one {TABLE_TOKENS:,}-token sequence: block_table_tensor shape {tuple(t.shape)}, dtype {t.dtype}, "
          f"{t.numel() * t.element_size():,} B; your batch_table_bytes: "
          f"{batch_table_bytes([TABLE_TOKENS], BLOCK, t.element_size()):,} B; for {fmt_gb(TABLE_TOKENS * KV)} of "
          f"KV (ratio {t.numel() * t.element_size() / (TABLE_TOKENS * KV):.1e})")
    lengths = [p + o for p, o in workloads.lognormal_workload(32, seed=0).as_pairs()]
    t = real_table(lengths, BLOCK)
    own = sum(ledger.block_table_bytes(n, BLOCK, t.element_size()) for n in lengths)
    print(f"32 lognormal sequences ({min(lengths):,} to {max(lengths):,} tokens): tensor {tuple(t.shape)}, "
          f"{t.numel() * t.element_size():,} B; your batch_table_bytes: "
          f"{batch_table_bytes(lengths, BLOCK, t.element_size()):,} B; each table at its own length would take "
          f"{own:,} B, so padding to the longest costs {t.numel() * t.element_size() / own:.1f}×, for "
          f"{fmt_gb(sum(lengths) * KV)} of KV")
    display(Markdown(f"The lecture prints 2 KB for the {TABLE_TOKENS:,}-token table; the real cache's is "
                     f"{batch_table_bytes([TABLE_TOKENS], BLOCK, ENTRY_BYTES):,} B: the lecture's figure takes "
                     f"{8 * lecture_entry_bytes}-bit entries (an OS page-table entry's width, torch's default int64), "
                     f"the real cache stores {8 * ENTRY_BYTES}-bit ones (int32, as vLLM does)."))

# %% [markdown]
# Either way one table is about a millionth of the KV it describes — small enough to send over a
# network with the request, which is what disaggregation (Oct 14) needs.
#
# ## 5. Step two: the block size is a real trade-off — Exercise 3
#
# Small blocks waste less tail but lengthen the block table, cost more per-step bookkeeping, and
# give the attention kernel shorter contiguous runs. The lecture's Exercise 3 asks you to put
# numbers on that for one workload:
#
# *Your measured sequence-length distribution is lognormal with median 800 tokens and 5% of
# sequences over 20,000* (`MEDIAN_TOKENS`, `TAIL_SHARE`, `TAIL_TOKENS`). For each block size, compute
# the mean tail waste per sequence, the total waste at the batch, and the block-table entries of a
# median and of a tail sequence; then say what you would measure before choosing.
#
# ### Exercise 3.9 — sigma
#
# $\ln L$ is normal. The median and the tail share pin two points of that normal; set `sigma`, its
# standard deviation, from them (`NormalDist().inv_cdf` turns a probability into standard deviations
# of the standard normal).

# %%
### BEGIN SOLUTION 3.9: set sigma of the lognormal with median MEDIAN_TOKENS and P(L > TAIL_TOKENS) = TAIL_SHARE
sigma = math.log(TAIL_TOKENS / MEDIAN_TOKENS) / NormalDist().inv_cdf(1 - TAIL_SHARE)
### END SOLUTION
check("3.9", sigma)

# %% [markdown]
# ### The batch: how many such sequences fit?
#
# The lecture's sketch prices the waste "at $B = 199$". A lognormal's mean is not its median:
# $E[L] = e^{\mu + \sigma^2/2}$, the median times $e^{\sigma^2/2}$. The budget holds, on average,
# about as many of *these* sequences as it holds sequences of their mean length: your
# `sequences_that_fit` (3.5) counts them, at the mean length in whole tokens and $b$ = `BLOCK`:

# %%
if unlocked("3.5", "3.9"):
    mean_len = MEDIAN_TOKENS * math.exp(sigma**2 / 2)
    FIT = sequences_that_fit(BUDGET, KV, BLOCK, math.ceil(mean_len))
    print(f"median {MEDIAN_TOKENS:,} tokens, mean {mean_len:,.0f} tokens ({mean_len / MEDIAN_TOKENS:.1f}× the median): "
          f"sequences_that_fit(BUDGET, KV, {BLOCK}, {math.ceil(mean_len):,}) = {FIT}")
    chat_fit = sequences_that_fit(BUDGET, KV, 16, 640)
    whole = (f"{chat_fit}" if COURSE.is_lecture else  # this card's count beside the lecture's
             f"{chat_fit} on this card, {ledger.paged_concurrency(LECTURE_BUDGET, 640, 16, LECTURE_KV)}{THERE}")
    display(Markdown(f"The lecture's sketch prices the waste at B = 199, the chat workload's count (640-token "
                     f"sequences; whole blocks give {whole}); this workload's mean length fits B = {FIT}."))
else:
    FIT = None

# %% [markdown]
# ### Exercise 3.10 — the table for this workload
#
# Write `exercise3_row(block_size, batch)` returning four numbers for the lab's model: the bytes a
# sequence's last block reserves and does not fill, on average over lengths spread evenly modulo
# $b$ (3.4's question, at any $b$); what `batch` such sequences waste together, as a fraction of
# `BUDGET`; and how many entries the block tables of the median sequence and of the
# `TAIL_TOKENS`-token sequence hold.

# %%
def exercise3_row(block_size, batch):
    """(mean tail bytes, waste of `batch` sequences as a fraction of BUDGET, entries at the median and the tail)."""
    ### BEGIN SOLUTION 3.10: return the four numbers of Exercise 3's row for this block size and batch
    tail_bytes = sum(tail_waste(n, block_size) for n in range(block_size)) / block_size * KV
    return (tail_bytes, batch * tail_bytes / BUDGET, -(-MEDIAN_TOKENS // block_size), -(-TAIL_TOKENS // block_size))
    ### END SOLUTION


check("3.10", exercise3_row)

# %% [markdown]
# Your rows at the batch that fits, beside the same rows at the sketch's $B = 199$ and the lecture's
# sketch itself (shown once 3.10 passes):

# %%
sketch = {8: ("1.0 MB", "0.3%", 100, 2500), 16: ("4.0 MB", "1.3%", 50, 1250), 64: ("16.0 MB", "5.1%", 13, 313),
          256: ("64.0 MB", "20.4%", 4, 79)}
if revealed("3.10") and FIT is not None:
    print(f"{'b':>4} | {'mean tail':>10} | {f'B = {FIT}':>7} | {'B = 199':>7} | {'@median':>7} | {'@tail':>6} "
          f"|| lecture sketch (B = 199)")
    for b, s in sketch.items():
        tail_bytes, waste_fit, at_median, at_tail = exercise3_row(b, FIT)
        print(f"{b:>4} | {tail_bytes / 1e6:>7.2f} MB | {fmt_pct(waste_fit, 2):>7} | "
              f"{fmt_pct(exercise3_row(b, 199)[1], 1):>7} | {at_median:>7} | {at_tail:>6,} "
              f"|| {s[0]:>7}, {s[1]:>5}, {s[2]:>3}, {s[3]:>5,}")
    display(Markdown("Mean tail $(b-1)/2$ tokens (lengths spread evenly modulo $b$; the lecture rounds to $b/2$), "
                     "times the bytes per token; the waste is the batch times that over the budget; the entries "
                     "are $\\lceil L / b \\rceil$."))

# %% [markdown]
# The sketch's $b = 8$ row does not follow its own rule: the mean tail is "about $b/2$", 4 tokens at
# $b = 8$, not 2. And at the batch this workload can hold, the memory column barely separates the
# block sizes at all: even the largest block wastes a couple of percent of the budget. The memory
# column alone picks the wrong answer — that is the point of the exercise.
#
# **Common wrong answer: "Block size 1 is optimal, waste is zero."** Its table has one entry per
# token, and zero tail waste says nothing about what else a block size costs.
#
# The lecture names the two measurements that decide: the memory column does not see two costs. One
# lives in the attention kernel: a small block gives it short contiguous runs, and if 16-token runs
# cost 20% of its bandwidth against 64-token runs, the extra memory of $b = 64$ buys that back and
# then some. The other appears only when sequences share blocks: copy-on-write copies a whole block on
# the first divergent token, so large blocks make every fork copy a large block. Lab 04 takes the
# first measurement (the kernel that reads through the block table, its bandwidth against the block
# size); section 7 counts the copies of a fork. First, the memory column itself, measured.

# %% [markdown]
# ## 6. Measured, on real traces
#
# The lecture's §10.3 table, regenerated by the ledger for the chat workload (3.4's mean tail at
# each $b$; waste of the lecture's 199 sequences as a share of the budget; table entries of a
# 4,096-token sequence), beside what the lecture prints, once 3.4 and 3.10 pass:

# %%
printed = {1: ("0", "0%", "4,096"), 16: ("8 tokens = 4.0 MB", "1.3%", "256"),
           64: ("32 tokens = 16.0 MB", "4.8%", "64"), 256: ("128 tokens = 64.0 MB", "17.0%", "16")}
if revealed("3.4", "3.10"):
    print(f"{'b':>4} | {'mean tail (exact)':>26} | {'waste at B=199':>14} | {'entries at 4K':>13} | "
          f"{'run':>5} | lecture prints")
    for r in ledger.block_size_table([1, 8, 16, 64, 256], 199, BUDGET, KV):
        lecture = " / ".join(printed.get(r.block_size, ("—",)))
        print(f"{r.block_size:>4} | {r.mean_tail_tokens:>5.1f} tokens = {r.mean_tail_bytes / 1e6:>7.2f} MB | "
              f"{fmt_pct(r.waste_fraction_of_budget):>14} | {r.table_entries:>13,} | {r.contiguous_run_tokens:>5} | "
              f"{lecture}")
    lecture_waste = 199 * (256 // 2 * LECTURE_KV / 2**20) * 1e6  # b = 256: 199 tails of 128 tokens, its MiB as MB
    display(Markdown(f"The lecture prints 17.0% at $b = 256$; its own reading gives "
                     f"{fmt_pct(lecture_waste / (62.5e9 + lecture_waste), 1)}: 199 × 64 MB (exact MiB written MB, a "
                     "$b/2$ tail) over 62.5 GB plus the waste."))

# %% [markdown]
# Read the last two columns of the
# $b = 1$ row: a 4,096-entry table for every 4K sequence, and a kernel whose contiguous run is one
# token — every key a separate indirect load. Zero tail waste is bought with the worst possible access
# pattern.
#
# The ledger assumes lengths uniform modulo $b$ and one batch for every workload. Measure instead, on
# the real allocator, over real workloads: 2,000 requests drawn at random (seed 0) from each of the
# **Azure LLM Inference 2023** conversation and code traces (Patel et al., ISCA 2024) and the
# **Mooncake FAST'25** conversation trace (Qin et al., FAST 2025), and 4,000 lengths from Exercise 3's
# lognormal. For each workload and block size (`measure_block_size`):
#
# * **tail waste** — each sequence's final length allocated in a `BlockAllocator`, its table read
#   back; its share of the budget at **the batch that fits that workload**: the budget over the KV of
#   a sequence of the workload's mean final length (`fitting_batch`), not the lecture's chat
#   batch of 199;
# * **table entries** at the median and the 95th-percentile length;
# * **contiguous run** — the pool replayed as an engine serves the workload (admit, decode one token
#   per sequence per step, retire; sequences over 32K left out), and the resident sequences' tables
#   split into runs of physically consecutive blocks, sampled every 20 steps after a warm-up.

# %% tags=["needs-traces"]
def sample(workload, n, seed=0):
    pairs = workload.as_pairs()
    return random.Random(seed).sample(pairs, min(n, len(pairs)))


traces = {"Azure conv": workloads.load_azure("conv"), "Azure code": workloads.load_azure("code"),
          "Mooncake conv": workloads.load_mooncake("conversation")}
measured_workloads = {name: sample(w, 2000) for name, w in traces.items()}
measured_workloads["lognormal (Ex. 3)"] = workloads.lognormal_workload(4000, seed=0).as_pairs()
for name, w in traces.items():
    print(f"{name}: {'SYNTHETIC stand-in' if w.synthetic else 'real trace'}, {len(w):,} requests")
fits = {name: fitting_batch([p + o for p, o in pairs], KV, BUDGET)
        for name, pairs in measured_workloads.items()}
for name, pairs in measured_workloads.items():
    mean = sum(p + o for p, o in pairs) / len(pairs)
    print(f"{name:>18}: mean final length {mean:>8,.0f} tokens -> the budget holds B = {fits[name]}")
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)

# %% tags=["nbval-ignore-output"]
measured = measure_workloads(measured_workloads, BLOCK_SIZES, KV, BUDGET, batch=fits)

# %% tags=["needs-traces"]
if revealed("3.4", "3.10"):
    print("table entries: the median length → its entries, the p95 length → its entries; contiguous run: the mean, "
          "in tokens; B: the batch that fits the workload")
    print(f"{'workload':>18} {'b':>4} | {'mean tail':>9} | {'B':>4} | {'waste at the batch':>18} | "
          f"{'table entries':>29} | {'contiguous run':>14} | resident")
    for name, per_b in measured.items():
        for b, m in per_b.items():
            entries = f"{m.median_tokens:,} → {m.entries_at_median:,}, {m.p95_tokens:,} → {m.entries_at_p95:,}"
            print(f"{name:>18} {b:>4} | {m.mean_tail_tokens:>9.2f} | {m.batch:>4} | "
                  f"{fmt_pct(m.waste_at_batch_fraction):>18} | {entries:>29} | {m.mean_run_tokens:>14,.0f} | "
                  f"{m.resident:>8.1f}")

# %% [markdown]
# ### Exercise 3.11 — what the workload sets, and what the block size sets
#
# The table (shown once 3.4 and 3.10 pass) has four measured columns: `"mean tail"`,
# `"waste at the batch"`, `"table entries"` (at the median and the p95 length) and
# `"contiguous run"`. Set `set_by_workload` to the set of those that, at one fixed $b$, move from
# one workload to another by much more than sampling noise. The lecture's table has one workload;
# this one has four.

# %%
### BEGIN SOLUTION 3.11: set set_by_workload to the set of the measured columns the workload moves at a fixed b
set_by_workload = {"waste at the batch", "table entries", "contiguous run"}
### END SOLUTION
check("3.11", set_by_workload)

# %%
if revealed("3.11"):
    display(Markdown("""* **The tail is a property of $b$, not of the workload.** Every trace lands near 3.4's uniform
  mean: real lengths are spread evenly enough modulo $b$ once they are much longer than a block.
* **What the tail costs is a property of the batch.** Each workload's waste is read at the batch its own
  lengths fill the budget with: long-sequence workloads (Mooncake, the lognormal) hold a few dozen
  sequences or fewer, so even $b = 256$ wastes a few percent; the lecture's 199 belongs to 640-token
  chat. (The lognormal's B here is not section 5's: that one divides by the analytic mean, this one by
  the mean of the 4,000 lengths drawn, lower because a lognormal this wide rests its mean on rare, very
  long lengths a finite sample mostly misses.)
* **Table length is a property of the workload.** Mooncake's conversations need five to ten times the
  entries of Azure's at any $b$.
* **The contiguous run is a block or two** on the busy Azure pools, however large $b$ is: decoding
  many sequences in turns interleaves their blocks. Long prefills (Mooncake, the lognormal's tail)
  take many blocks at once and get longer runs, until churn shuffles the free list."""))

# %% [markdown]
# The trade-off, both sides, ledger lines (at the lecture's chat batch, $B = 199$) and measured markers
# (each at its workload's batch):

# %% tags=["needs-traces"]
if revealed("3.4", "3.10"):
    viz_memory.block_size_tradeoff_figure([1, 2, 4, 8, 16, 32, 64, 128, 256], BUDGET, KV, 199,
                                          measured=measured, highlight=16).show()

# %% [markdown]
# Pick a block size and a workload; the readout states the ledger row and the measured one, both at
# the batch that fits the workload you picked.

# %% tags=["needs-traces"]
if revealed("3.4", "3.10"):
    display(viz_memory.block_size_panel(measured, BUDGET, KV, block_size=16))

# %% [markdown]
# ## 7. Forks: what a large block costs when sequences share
#
# Block size also interacts with sharing (§10.4, lab 05): copy-on-write duplicates a *whole block*
# on the first divergent token. On the real allocator, a 4,010-token prompt (its last block partly
# filled) and one branch forked off it; the branch writes its first token:

# %%
PROMPT_FORK = 4010
for b in (16, 256):
    fan = BlockAllocator(ledger.blocks_for(PROMPT_FORK, b) + 4, b)
    fan.allocate("prompt", PROMPT_FORK)
    fan.fork("prompt", "branch")
    cow = fan.append_slot("branch").cow  # the shared, partly filled last block: the branch cannot write into it
    copied = b * KV if cow is not None else 0
    print(f"b = {b:>3}: the last block holds {PROMPT_FORK % b:>3} of {b} tokens; the branch's first token copies "
          f"{'one whole block' if cow is not None else 'nothing'}, {fmt_gb(copied)} allocated, "
          f"{fmt_gb(PROMPT_FORK % b * KV)} of it filled")

# %% [markdown]
# One divergence, one whole block: at $b = 256$ each copy costs 16× what it costs at $b = 16$. How
# many copies a fan-out of sampled completions makes depends on who holds the prompt and who writes
# first; that count is lab 05's Exercise 5.3, where the lecture's "8 × 64 MB = 512 MB" is priced.

# %% [markdown]
# ## Self-check
#
# 1. Does paging reduce the KV bytes a token costs? What *does* it reduce?
# 2. A sequence of 4,097 tokens at $b = 16$: how many blocks, how many table entries, how much tail?
# 3. Why is $b = 1$ not optimal, although its tail waste is zero?
# 4. What does the attention kernel have to do now that it did not before, and where did the cost of
#    paging go?
# 5. Which fragmentation does paging eliminate, and which does it bound — to what?
#
# The answers show once 3.1, 3.3, 3.4 and 3.7 pass:

# %%
if revealed("3.1", "3.3", "3.4", "3.7"):
    blocks_4097 = ledger.blocks_for(4097, 16)
    display(Markdown(f"""1. No: {KV // KiB:,} KiB per token, paged or not (the two caches above report the same bytes
   per token). It reduces reserved-and-unused bytes:
   {fmt_pct(1 - ledger.naive_utilization(BUDGET, 4096, 640, KV), 0)} of the budget under reserve-to-max, less
   than one block per sequence under paging.
2. $\\lceil 4{{,}}097 / 16 \\rceil = {blocks_4097}$ blocks and as many table entries; tail
   ${blocks_4097} \\times 16 - 4{{,}}097 = {blocks_4097 * 16 - 4097}$ tokens, the worst case.
3. Its table has one entry per token ({ledger.block_table_entries(4096, 1):,} for a 4K sequence), and the
   kernel's contiguous run is a single token: every key is a separate indirect load. Memory is not the only
   column.
4. Gather: read each sequence's keys and values through its block table instead of one strided load. The FLOPs
   and bytes are unchanged; the cost moved into the kernel's access pattern, and a naive gather can lose enough
   bandwidth to eat the win (lab 04).
5. External fragmentation is eliminated — any free block serves any request. Internal fragmentation is bounded
   to at most $b - 1$ tokens per sequence, $(b - 1)/2$ on average: {ledger.mean_tail_waste_tokens(16):g} tokens
   at $b = 16$ (3.4)."""))

# %% [markdown]
# Next: **Lab 04 — the paged attention kernel.**
