# %% [markdown]
# # Lab 02 — The naive allocator, and where your cache goes (§10.2, Exercises 1 and 2)
#
# Every framework that shipped before 2023 stored a sequence's keys and values as one tensor, sized
# when the request arrived for the longest sequence it was allowed — $S_{max}$ — because moving a
# multi-gigabyte tensor mid-flight is unthinkable. The allocation is sized by the **limit**; the
# occupancy is set by **reality**. This lab builds that allocator for real, runs the lecture's chat
# workload through it, and measures how much of the card holds tokens. Then it breaks the allocator
# a second way — per-request $S_{max}$ — and reproduces the vLLM paper's measurement on a real trace.
#
# **Learning objectives served** (the lecture's numbering)
#
# * **Objective 2** — compute the memory a reserve-to-maximum allocator wastes for a given
#   distribution of prompt and output lengths, and convert that waste into lost concurrency and
#   lost throughput.
# * **Objective 3** — distinguish internal from external fragmentation in a KV cache, and say which
#   one paging eliminates and which one it merely bounds.
#
# What you build: the allocator's admission — where a new slot goes, or whether it is refused (2.13) —
# which then places every slot of this lab's allocators: the lecture's workload, whose utilization you
# measure with your own function (2.3, 2.4), and the per-request $S_{max}$ run, whose external
# fragmentation your placement produces (2.14).
#
# Timing in the lecture: minutes 6–16 (*protected*). Here: about 45 minutes; the scoreboard at the end lists its checkoffs.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
import random

import torch

from labsupport import ledger, workloads
from labsupport.block_allocator import BlockAllocator
from labsupport.contiguous import ContiguousAllocator, ReserveToMaxAllocator
from labsupport.course.checkoff import check, revealed, unlocked
from labsupport.fig2 import fig2_breakdown, simulate_breakdown
from labsupport.fragmentation import fill_reserve_to_max, naive_measurement, run_until_fragmented
from labsupport.kvcache import ContiguousKVCache
from labsupport.memory_stats import OutOfBlocks, ReservationExceeded
from labsupport.specs import LECTURE_7B, LECTURE_7B_GQA8, LECTURE_GPU
from labsupport.units import fmt_bytes, fmt_gb, fmt_pct
from IPython.display import Markdown, display
from labsupport.viz import memory as viz_memory

torch.manual_seed(0)
MODEL, H100 = LECTURE_7B, LECTURE_GPU  # the lecture's model and card, for the charts and panels

# %% tags=["givens"]
# The givens: the quantities this lab's exercises are posed on. Compute your answers from these names;
# the grader re-runs your code on other values of them.
HBM_BYTES = 80 * 10**9  # the card's memory, decimal GB (one H100)
PARAMS = 6_740_000_000  # the model's parameters
DTYPE_BYTES = 2  # bytes per weight and per cached element (bf16)
RESERVE_BYTES = 4 * 10**9  # activations and workspace, decimal GB
LAYERS = 32  # transformer layers
KV_HEADS = 32  # KV heads per layer (MHA: one per query head)
GQA_KV_HEADS = 8  # KV heads of the GQA variant (Exercise 1)
HEAD_DIM = 128  # elements per head
HBM_BW = 3_350 * 10**9  # HBM bandwidth, bytes/s
PROMPT = 512  # tokens per prompt (the chat workload)
OUTPUT = 128  # tokens generated per request
S_MAX = 4_096  # the allocator's maximum sequence length
S_MAX_LONG = 32_768  # the long-context advertisement (§10.2)
S_MAX_BROCHURE = 131_072  # Exercise 1's 128K brochure
BLOCK = 16  # tokens per block of a paged cache
S_MAX_SHORT = 512  # Exercise 2: the smallest declared S_max (the others are S_MAX and S_MAX_LONG)
SHARE_SHORT = 0.70  # Exercise 2: the share of requests declaring S_MAX_SHORT
SHARE_LONG = 0.05  # Exercise 2: the share declaring S_MAX_LONG (the rest declare S_MAX)

# %%
KV = 2 * LAYERS * KV_HEADS * HEAD_DIM * DTYPE_BYTES  # lab 00: K and V, every layer and KV head
BUDGET = HBM_BYTES - PARAMS * DTYPE_BYTES - RESERVE_BYTES  # lab 01: what the weights and the reserve leave
print(f"KV per token {KV:,} B; KV budget {fmt_bytes(BUDGET)}")
print(f"the chat workload: {PROMPT}-token prompts, {OUTPUT}-token outputs = {PROMPT + OUTPUT} tokens; S_max = {S_MAX:,}")

# %% [markdown]
# ## 1. One slot, sized by the limit
#
# A reserve-to-max allocator gives every sequence, when it arrives, one contiguous slot of $S_{max}$
# token positions at the model's KV bytes per token, however short the sequence turns out to be. The
# sequence then fills it from the front: its prompt at prefill, one more token per decode step. The
# budget holds as many whole slots as fit; a fraction of a slot holds no sequence.
#
# The board picture is one slot — a long rectangle of token positions — with the positions the
# chat workload's sequence fills shaded. Draw it for yourself first; the lab draws it once 2.1 passes.
#
# ### Exercise 2.1 — what one slot never holds
#
# A request of the chat workload arrives with `PROMPT` tokens and will generate `OUTPUT` more, in a
# slot sized for `S_MAX`. Set `unfilled_bytes` to the bytes of its slot that no token of it ever
# occupies, computed from the givens (and `KV`).

# %%
### BEGIN SOLUTION 2.1: set unfilled_bytes to the bytes of one S_MAX slot its sequence never fills
unfilled_bytes = (S_MAX - (PROMPT + OUTPUT)) * KV
### END SOLUTION
check("2.1", unfilled_bytes)

# %%
if revealed("2.1"):
    viz_memory.slot_figure(S_MAX, PROMPT, OUTPUT).show()

# %% [markdown]
# ### Exercise 2.2 — internal fragmentation, over the card
#
# Fill the budget with as many reserve-to-max slots as it holds, and let every sequence reach its
# `PROMPT + OUTPUT` tokens. Set `internal_share` to the fraction of the whole KV budget (`BUDGET`,
# in bytes) that the slots hold reserved and never filled.

# %%
### BEGIN SOLUTION 2.2: set internal_share to the share of BUDGET the slots reserve and never fill
naive_seqs = BUDGET // (S_MAX * KV)  # whole slots only
internal_share = naive_seqs * unfilled_bytes / BUDGET
### END SOLUTION
check("2.2", internal_share)

# %% [markdown]
# Once 2.2 passes, the arithmetic of this section in one place:

# %%
if revealed("2.1", "2.2"):
    display(Markdown(r"""$$\text{slot} = S_{max} \times \text{KV per token}, \qquad
  B_{naive} = \left\lfloor \frac{\text{KV budget}}{\text{slot}} \right\rfloor, \qquad
  \text{internal} = \frac{B_{naive} \times (S_{max} - S_{actual}) \times \text{KV per token}}{\text{KV budget}}$$"""))
    print(f"{naive_seqs} slots of {fmt_bytes(S_MAX * KV)}; each leaves {fmt_bytes(unfilled_bytes)} unfilled; "
          f"internal fragmentation {fmt_pct(internal_share)} of the budget")

# %% [markdown]
# ## 2. Build it, and measure
#
# Formulas are claims; the allocator is the thing. A contiguous allocator keeps one address space
# of `BUDGET // KV` token positions. Every live sequence owns one run of positions, its slot; the
# rest is free, in **holes** between slots. Admitting a request is one decision: *where* its slot
# goes — or that it cannot go anywhere now, and the request is refused. Nothing is ever moved.
#
# ### Exercise 2.13 — admission: where a new slot goes
#
# Write `place_slot(holes, size)`. `holes` is the free space as a list of `(offset, length)` runs in
# address order; `size` is the number of positions the request reserves. Return the offset at which
# its slot starts, placed as the real `ContiguousAllocator` places it (the first hole, in address
# order, that can take the whole slot; the slot at that hole's start), or `None` to refuse it. The
# checkoff compares your offsets with the real allocator's on address spaces taken mid-serve, some
# of them badly fragmented.

# %%
def place_slot(holes, size):
    """The offset of a new slot of `size` positions among the free `holes`, or None to refuse the request."""
    ### BEGIN SOLUTION 2.13: return the offset where the new slot starts, or None when no hole can take it
    for offset, length in holes:
        if length >= size:
            return offset
    return None
    ### END SOLUTION


check("2.13", place_slot)

# %% [markdown]
# From here on, your `place_slot` is the allocator's admission: every allocator below places its
# slots with it (the allocator's own first fit stands in until 2.13 passes). `ReserveToMaxAllocator`
# is the naive allocator of §10.2: every request reserves one slot of $S_{max}$ positions. We serve
# the chat workload through it the way an engine would — admit and prefill each request's prompt
# tokens, then decode, one token per sequence per step — until it refuses a request.

# %%
placement = place_slot if unlocked("2.13") else None  # None: the allocator's own first fit
alloc = ReserveToMaxAllocator.from_budget(BUDGET, KV, s_max=S_MAX, place=placement)
admitted = 0
while True:
    try:
        alloc.allocate(admitted, num_tokens=PROMPT)  # prefill: the prompt's KV goes into the new slot
    except OutOfBlocks as refusal:
        print(f"request {admitted} refused: {refusal}")
        break
    admitted += 1
for step in range(OUTPUT):  # decode: every resident sequence appends one token per step
    for seq in range(admitted):
        alloc.append(seq)
alloc.check_invariants()
st = alloc.stats()
print(f"admitted {admitted} sequences; address space {alloc.capacity_tokens:,} token positions "
      f"= {fmt_gb(alloc.capacity_tokens * KV)}")
print(f"reserved {st.reserved_tokens:,} positions, holding tokens {st.occupied_tokens:,}, free {st.free_tokens:,}")

# %% [markdown]
# The same workload on **real tensors**: `ContiguousKVCache` keeps K and V as
# `[max_seqs, S_max, kv_heads, head_dim]` per layer, exactly the shape the naive design needs. The
# lecture's cache (62.5 GB) does not fit in a laptop, so this one keeps the token geometry — 29
# slots of 4,096 positions, 512 + 128 tokens each — and shrinks each token to one layer, one head of
# 8 floats. Bytes per token change; which positions hold tokens does not, and that is what
# utilization counts.

# %%
cache = ContiguousKVCache(max_seqs=admitted, s_max=S_MAX, num_layers=1, num_kv_heads=1, head_dim=8)
seqs = list(range(admitted))
for s in seqs:
    k = torch.randn(1, PROMPT, 1, 8)
    cache.add_sequence(s, k, -k)
for step in range(OUTPUT):
    k = torch.randn(1, len(seqs), 1, 8)
    cache.append(seqs, k, -k)
k0, v0 = cache.gather(0)
print(f"real cache: {cache.pool_bytes:,} B of tensors for {admitted} slots; sequence 0 gathers back "
      f"{k0.shape[1]} tokens; slot occupancy {cache.stats().occupied_tokens / cache.stats().reserved_tokens:.4f}")
print(f"allocator at lecture scale:                         slot occupancy "
      f"{st.occupied_tokens / st.reserved_tokens:.4f}")

# %% [markdown]
# ### Exercise 2.3 — measure utilization over a live allocator
#
# Write `utilization(alloc, budget_bytes)`: the fraction of the KV budget holding real tokens, read
# off a live allocator. Every live sequence's slot is in `alloc.slots` (a dict of `Slot` objects with
# `.size`, the positions reserved, and `.length`, the tokens stored so far); the allocator's
# `kv_bytes_per_token` converts tokens to bytes. The checkoff runs your function on allocators in the
# middle of serving — sequences of many lengths, some finished, several models and budgets.

# %%
def utilization(alloc, budget_bytes):
    """Bytes holding real tokens in a live allocator, as a fraction of the KV budget."""
    ### BEGIN SOLUTION 2.3: return the bytes the live sequences' tokens occupy, over budget_bytes
    held_tokens = sum(slot.length for slot in alloc.slots.values())
    return held_tokens * alloc.kv_bytes_per_token / budget_bytes
    ### END SOLUTION


check("2.3", utilization)

# %% [markdown]
# Your function on the allocator your admission filled, against the allocator's own statistics:

# %%
if unlocked("2.3"):
    measured = utilization(alloc, BUDGET)
    print(f"your utilization(): {fmt_pct(measured, 4)}; the allocator's stats(): "
          f"{fmt_pct(alloc.stats().occupied_bytes / BUDGET, 4)} ({fmt_gb(alloc.stats().occupied_bytes, 2)} of "
          f"{fmt_gb(BUDGET, 2)})")

# %% [markdown]
# And the second board drawing: the 29 slots stacked, each with its 640 tokens shaded. Everything
# orange is memory the card has, the allocator has promised away, and no token will ever occupy.

# %%
viz_memory.slot_stack_figure(alloc, BUDGET).show()

# %% [markdown]
# ### The same cache, over a sequence's life
#
# That utilization is read at the **end** of every sequence's life, when each holds all 640 tokens. A
# busy card never sees that moment for every slot at once: a sequence is prefilled with its prompt
# and holds one more token after each of its decode steps, and when it finishes the next request
# takes its slot with a fresh prompt. What does the card hold on average, over a sequence's life?
#
# ### Exercise 2.4 — utilization over the life
#
# Measure it on a real allocator: fill a fresh `ReserveToMaxAllocator` like the one above (your
# admission places its slots) with `PROMPT`-token prompts, then run the `OUTPUT` decode steps, reading
# the utilization (tokens held, over `BUDGET`) while each step runs, before its token is appended.
# Set `util_over_life` to the mean of those readings, a fraction. (Your `utilization` from 2.3 reads
# one allocator at one moment.)

# %%
### BEGIN SOLUTION 2.4: set util_over_life to the mean utilization over the 128 decode steps, measured on a real allocator
def mean_utilization_over(alloc, steps):
    """Run `steps` decode steps on a full allocator; the mean of what each step reads."""
    readings = []
    for _ in range(steps):
        readings.append(utilization(alloc, BUDGET))  # what this step reads, before its token lands
        for seq in list(alloc.slots):
            alloc.append(seq)
    return sum(readings) / len(readings)


life = ReserveToMaxAllocator.from_budget(BUDGET, KV, s_max=S_MAX, place=placement)
while life.fits(S_MAX):
    life.allocate(life.num_seqs, num_tokens=PROMPT)
util_over_life = mean_utilization_over(life, OUTPUT)
### END SOLUTION
check("2.4", util_over_life)

# %% [markdown]
# The two readings side by side, and what the lecture prints for them, once 2.4 passes:

# %%
if revealed("2.4"):
    print(f"end of life:   {fmt_pct(ledger.naive_utilization(BUDGET, S_MAX, PROMPT + OUTPUT, KV))} of the budget")
    print(f"over the life: {fmt_pct(ledger.naive_utilization_time_avg(BUDGET, S_MAX, PROMPT, OUTPUT, KV))} of the "
          f"budget (ledger), {fmt_pct(util_over_life)} (yours)")
    display(Markdown("The lecture prints the first with 512 KiB taken as 512,000 B (§10.2's slip); its timing plan's "
                     "and title's figures are the second ([LEDGER.md](../LEDGER.md), the conventions)."))

# %% [markdown]
# ## 3. What the waste costs: concurrency and throughput
#
# Had each sequence held only what it uses — 640 tokens, in 16-token blocks — the same budget would
# hold several times more sequences (lab 03 builds that cache and counts them). Concurrency is not the
# end of it: during decode a step is memory-bound (Lecture 2 §2.15). Work out from that what one
# step must read from HBM, how long that takes on this card, and how many tokens it yields.
#
# ### Exercise 2.5 — the naive batch's throughput
#
# Set `naive_tok_s` to the decode throughput (tokens/s) of the naive batch — as many sequences as the
# budget holds whole slots — every sequence at its full `PROMPT + OUTPUT` tokens, on a card that
# moves `HBM_BW` bytes/s (the weights: `PARAMS` of `DTYPE_BYTES` bytes each).

# %%
### BEGIN SOLUTION 2.5: set naive_tok_s to the decode throughput (tokens/s) of the naive batch of full sequences
b_naive = BUDGET // (S_MAX * KV)
t_step = (PARAMS * DTYPE_BYTES + b_naive * (PROMPT + OUTPUT) * KV) / HBM_BW
naive_tok_s = b_naive / t_step
### END SOLUTION
check("2.5", naive_tok_s)

# %% [markdown]
# Once 2.5 passes, the ledger's step for the naive batch (the next cell waits for it):

# %%
if revealed("2.5"):
    b_naive = ledger.naive_concurrency(BUDGET, S_MAX, KV)
    t = ledger.tpot_s(MODEL, b_naive, PROMPT + OUTPUT, H100.hbm_bandwidth)
    print(f"reserve-to-max: B = {b_naive}, step {1e3 * t:5.2f} ms "
          f"({fmt_gb(MODEL.weight_bytes)} of weights + {b_naive} x {fmt_gb((PROMPT + OUTPUT) * KV)} of KV at "
          f"{H100.hbm_bandwidth / 1e9:,.0f} GB/s), {ledger.throughput_tok_s(b_naive, t):,.0f} tok/s")

# %% [markdown]
# A paged cache's larger batch (lab 03 counts it) gains less in throughput than in concurrency,
# because the weights are read once per step whoever is in the batch, and each extra sequence adds
# its own KV to the step (§10.6 returns to this: your neighbours set your cadence; lab 07 sets the
# lecture's "a third of the throughput" beside the exact ratio).

# %% [markdown]
# ## 4. Advertising long context
#
# The service raises its limit to `S_MAX_LONG` tokens. The workload does not change: every request is
# still `PROMPT + OUTPUT` tokens.
#
# ### Exercise 2.6 — the long-context advertisement
#
# Set `util_32k` to the utilization (a fraction: bytes holding tokens over the whole `BUDGET`) of the
# chat workload under $S_{max}$ = `S_MAX_LONG`, MHA, from your own arithmetic (the grade does not
# accept `ledger.naive_utilization` here). The checkoff wants the exact value.

# %%
### BEGIN SOLUTION 2.6: set util_32k to the utilization at S_max = S_MAX_LONG (a fraction)
util_32k = (BUDGET // (S_MAX_LONG * KV)) * (PROMPT + OUTPUT) * KV / BUDGET
### END SOLUTION
check("2.6", util_32k)

# %% [markdown]
# *"…the same chat workload's utilization falls to 1.9%, because the slot grew 8× and the occupancy
# did not."* That reasoning is per slot: one slot's occupancy, 640 of its 32,768 positions, is 1.95%,
# which the lecture writes 1.9%. Utilization over the whole budget, 2.6's quantity, is another reading,
# and the budget holds only whole slots. Both, from the real allocator and the ledger, once 2.6 passes:

# %%
if revealed("2.6"):
    for s_max in (S_MAX, S_MAX_LONG):
        a = fill_reserve_to_max(BUDGET, s_max, PROMPT + OUTPUT, KV)
        m = naive_measurement(a, BUDGET)
        print(f"S_max = {s_max:>6,}: {m['concurrency']:>2} slots of {fmt_gb(m['slot_bytes'])}, utilization "
              f"{fmt_pct(m['utilization'])} (one slot's occupancy {fmt_pct((PROMPT + OUTPUT) / s_max)})")
    display(Markdown("The lecture's 1.9% is one slot's occupancy, its own per-slot reasoning, cut to one decimal; "
                     "over the budget, which holds whole slots only, it is the utilization above "
                     "([LEDGER.md](../LEDGER.md), the conventions)."))

# %% [markdown]
# ## 5. Exercise 1 — the long-context brochure
#
# Your service advertises a 128K context window: $S_{max}$ = `S_MAX_BROCHURE` = 131,072. The workload
# is unchanged.
#
# $$\text{slot}_{MHA} = 131{,}072 \times 524{,}288\ \text{B} = 68.72\ \text{GB} > 62.52\ \text{GB}$$
#
# One slot is larger than the whole budget. The real allocator agrees — it cannot admit anyone:

# %%
mha_128k = fill_reserve_to_max(BUDGET, S_MAX_BROCHURE, PROMPT + OUTPUT, KV)
print(f"MHA at S_max = 131,072: {mha_128k.num_seqs} requests admitted")
viz_memory.slot_stack_figure(mha_128k, BUDGET).show()

# %% [markdown]
# Relax to GQA-8 (8 KV heads: 131,072 B = 128 KiB per token). The KV budget is the same 62.52 GB —
# the lecture keeps the parameter count fixed so that only the cache changes.
#
# ### Exercise 2.7 — the brochure under GQA-8
#
# Set `util_128k_gqa` to the reserve-to-max utilization (a fraction) of the chat workload at
# $S_{max}$ = `S_MAX_BROCHURE` under GQA (`GQA_KV_HEADS` KV heads; `KV_GQA` bytes per token).

# %%
KV_GQA = 2 * LAYERS * GQA_KV_HEADS * HEAD_DIM * DTYPE_BYTES  # the GQA model's KV bytes per token
### BEGIN SOLUTION 2.7: set util_128k_gqa to the GQA utilization at S_max = S_MAX_BROCHURE (a fraction)
util_128k_gqa = (BUDGET // (S_MAX_BROCHURE * KV_GQA)) * (PROMPT + OUTPUT) * KV_GQA / BUDGET
### END SOLUTION
check("2.7", util_128k_gqa)

# %% [markdown]
# The lecture's sketch prints 0.39%: it takes a 640-token GQA-8 sequence as 0.082 GB, i.e. 128 KiB as
# 128,000 B. Exactly, $640 \times 131{,}072 = 83{,}886{,}080$ B $= 0.0839$ GB, and:

# %%
if revealed("2.7"):
    gqa_naive = fill_reserve_to_max(BUDGET, S_MAX_BROCHURE, PROMPT + OUTPUT, KV_GQA)
    m = naive_measurement(gqa_naive, BUDGET)
    print(f"GQA-8, S_max = 131,072: slot {fmt_gb(m['slot_bytes'])}, {m['concurrency']} slots, "
          f"utilization {fmt_pct(m['utilization'], 3)} (lecture: 0.39%)")

# %% [markdown]
# Now paging, with the real block allocator (lab 03 builds it): the same budget cut into whole blocks
# of `BLOCK` tokens (`BLOCK * KV_GQA` bytes each), a sequence holding whole blocks.
# `BlockAllocator(num_blocks, BLOCK)` is such a pool; `pool.blocks_needed(n)` is the blocks n tokens
# take, `pool.can_allocate(k)` says whether k more are free, `pool.allocate(seq_id, n)` takes them.
#
# ### Exercise 2.8 — what the marketing claim cost
#
# Set `brochure_cost` to the factor by which the brochure's reservation divides GQA concurrency:
# how many `PROMPT + OUTPUT`-token sequences the paged pool holds, over how many the reserve-to-max
# allocator holds at $S_{max}$ = `S_MAX_BROCHURE`.

# %%
### BEGIN SOLUTION 2.8: set brochure_cost to the factor the brochure's reservation divides GQA concurrency by
pool = BlockAllocator(BUDGET // (BLOCK * KV_GQA), BLOCK)  # whole blocks in the budget
paged_gqa = 0
while pool.can_allocate(pool.blocks_needed(PROMPT + OUTPUT)):  # fill it until it refuses a sequence
    pool.allocate(paged_gqa, PROMPT + OUTPUT)
    paged_gqa += 1
brochure_cost = paged_gqa / (BUDGET // (S_MAX_BROCHURE * KV_GQA))  # the pool's count over the brochure's slots
### END SOLUTION
check("2.8", brochure_cost)

# %%
if revealed("2.8"):
    print(f"paged, GQA, b = {BLOCK}: {pool.num_blocks:,} blocks of {BLOCK * KV_GQA:,} B; {paged_gqa} sequences "
          f"of {PROMPT + OUTPUT} tokens; {pool.num_free_blocks} blocks left")
    display(Markdown("The sketch's ≈ 744 divides the printed 62.5 GB by a rounded 0.084 GB; whole blocks give the "
                     "count above, inside its ≈, and the cost factor it supports holds ([LEDGER.md](../LEDGER.md), "
                     "the conventions)."))

# %% [markdown]
# ### The knobs: S_max, the workload, the model, the card
#
# Every number below is measured on a real `ReserveToMaxAllocator` filled by the panel (the readout
# puts the ledger's closed form beside it). It confirms your answers to 2.6–2.8; predict before you
# move anything:
#
# * **Advertise long context.** Slide $S_{max}$ to 32,768. The workload did not change. What happens to
#   the number of slots and to utilization?
# * **The brochure.** Slide $S_{max}$ to 131,072 (Exercise 1).
# * **GQA-8.** Switch the model to `lecture-7b-gqa8`: which numbers move, and by what factor?
# * **Short limits.** $S_{max}$ = 512 with 640-token sequences: utilization looks great. Why is that
#   configuration still wrong? (Read the readout's note.)

# %%
viz_memory.naive_panel(paged=False)  # what a paged pool holds is lab 03's question

# %% [markdown]
# The claim cost that factor in concurrency, and it cost it **for every request**: here every request
# is 640 tokens, under 0.5% of the 131,072 positions its slot reserves. (The lecture adds "including the
# 99% that never exceeded 1,000 tokens", a picture of real traffic; this workload has no long request at
# all.) Under paging the claim is nearly free: $S_{max}$ stops being a
# memory parameter and becomes a policy limit — which is why long-context serving and paged
# allocation arrived together.
#
# ## 6. Internal and external fragmentation
#
# **Internal fragmentation** is space reserved inside a sequence's own allocation that the sequence
# never fills: the empty positions of each slot above (2.2 added them up), proportional to
# $S_{max} - S_{actual}$.
#
# **External fragmentation** is free space *between* allocations, too small for the next request.
# With uniform slots there is none — the one virtue of reserving to the maximum. The real allocator
# shows it: retire a random third of the 29 sequences and every freed slot fits the next arrival.

# %%
rng = random.Random(0)
for seq in rng.sample(range(admitted), admitted // 3):
    alloc.free(seq)
print(f"free positions {alloc.free_tokens:,} in holes of {sorted({s for _, s in alloc.holes()})} tokens")
refilled = 0
while alloc.fits(S_MAX):
    alloc.allocate(f"new {refilled}", num_tokens=PROMPT)
    refilled += 1
print(f"admitted {refilled} new requests into the freed slots; free now {alloc.free_tokens:,} positions "
      f"(less than one slot)")

# %% [markdown]
# *"Just set S_max per request."* Good instinct, wrong outcome — that is Exercise 2.
#
# ### Exercise 2 — per-request S_max
#
# Requests arrive declaring their own $S_{max}$: `S_MAX_SHORT` (a share `SHARE_SHORT` of them),
# `S_MAX_LONG` (a share `SHARE_LONG`) or `S_MAX` (the rest) — 512, 32,768 and 4,096 in proportions
# 70/5/25 for the lecture. Each reserves a slot of its own declared size, and the residents share one
# budget.
#
# Set `mean_slot_bytes` (Exercise 2.9) to what a request reserves on average, in bytes, and
# `mean_seqs` (Exercise 2.10) to about how many requests the budget then holds at once, on average
# (a whole number of requests, or the unrounded estimate: the checkoff accepts either).

# %%
MIX = ((S_MAX_SHORT, SHARE_SHORT), (S_MAX, 1 - SHARE_SHORT - SHARE_LONG), (S_MAX_LONG, SHARE_LONG))  # (S_max, share)
### BEGIN SOLUTION 2.9: set mean_slot_bytes to what a request reserves on average, in bytes
mean_slot_bytes = sum(share * s_max * KV for s_max, share in MIX)
### END SOLUTION
check("2.9", mean_slot_bytes)

# %%
### BEGIN SOLUTION 2.10: set mean_seqs to about how many requests the budget holds at once
mean_seqs = BUDGET / sum(share * s_max * KV for s_max, share in MIX)
### END SOLUTION
check("2.10", mean_seqs)

# %%
if revealed("2.9", "2.10"):
    display(Markdown(r"""$$\overline{\text{slot}} = \sum_i p_i \, S_{max,i} \times \text{KV per token}, \qquad
  \bar B \approx \frac{\text{KV budget}}{\overline{\text{slot}}}$$"""))

# %% [markdown]
# Compare it with everyone reserving `S_MAX`. Now the failure mode paging does not have. A
# `ContiguousAllocator` — variable-size slots in one address space, freed slots merged with free
# neighbours, nothing ever moved, every slot placed by **your** `place_slot` — receives requests
# drawn from the mix (seed 0). Whenever it refuses one, a random 30% of residents finish and the
# request tries again. The run stops at the first **medium (`S_MAX`-token) request refused while more
# than enough memory is free in total**: external fragmentation, produced by your placement.

# %%
run = run_until_fragmented(int(BUDGET // KV), MIX, kv_bytes_per_token=KV, seed=0, stop_sizes=[S_MAX],
                           place=placement)
run.allocator.check_invariants()
print(f"after {run.arrivals} arrivals, {run.retirements} retirements and {run.earlier_refusals} earlier refusals "
      f"({run.earlier_fragmented} of them already fragmentation), {run.allocator.num_seqs} residents: a "
      f"{S_MAX:,}-token request refused")

# %% [markdown]
# ### Exercise 2.14 — what was free when it said no
#
# The run's allocator is `run.allocator`, as it stood at the refusal (`holes()`, `layout()`,
# `slots`). Set `free_at_refusal` to the memory free at that moment, in bytes.

# %%
### BEGIN SOLUTION 2.14: set free_at_refusal to the bytes free when the medium request was refused
free_at_refusal = sum(length for _, length in run.allocator.holes()) * KV
### END SOLUTION
check("2.14", free_at_refusal)

# %%
if revealed("2.14"):
    ref = run.refusal
    print(f"{ref}\nfree {fmt_gb(ref.free_tokens * KV)} in {len(run.allocator.holes())} holes; largest "
          f"{fmt_gb(ref.largest_hole_tokens * KV)}; the request needs {fmt_gb(ref.requested_tokens * KV)} in one piece")
    viz_memory.address_space_figure(run.allocator, ref).show()

# %% [markdown]
# Worse, a sequence still cannot grow past its own guess: the allocator has no way to extend a slot
# that has neighbours.

# %%
small = ContiguousAllocator(4 * 4096, kv_bytes_per_token=KV)
small.allocate("guessed 512", 512, num_tokens=PROMPT)
small.allocate("neighbour", 4096)
try:
    small.append("guessed 512", OUTPUT)
except ReservationExceeded as exc:
    print(f"ReservationExceeded: {exc}")

# %% [markdown]
# Variable-size allocation turns a *quantity* problem into a *placement* problem; fixed-size blocks
# are how every allocator since 1962 refused that trade.
#
# ### Exercises 2.11 and 2.12 — the same events, in a paged cache
#
# Paging cuts the cache into fixed-size blocks of `BLOCK` tokens, keeps the free ones in a pool any
# sequence may take from, gives each sequence a table of its blocks (lab 03), and hands a sequence one
# more block only when its last one is full. Four events, each a way a KV cache can fail a sequence or
# waste memory:
#
# * `"refused with enough free in total"` — a request turned away while the free memory adds up to
#   more than it needs (your run above);
# * `"stopped at its own reservation"` — a sequence that cannot grow although memory is free
#   elsewhere (the `ReservationExceeded` above);
# * `"a partly empty last block"` — positions a sequence holds but has not filled;
# * `"no room for the next token"` — a running sequence that finds no memory for its next token.
#
# **2.11.** Set `still_happens` to the set of those events (zero or more of the four strings) that can
# still happen in the paged cache. Replay each one in your head with blocks.

# %%
### BEGIN SOLUTION 2.11: set still_happens to the set of the events that can still happen under paging, e.g. {"..."}
still_happens = {"a partly empty last block", "no room for the next token"}
### END SOLUTION
check("2.11", still_happens)

# %% [markdown]
# **2.12.** What paging does not remove it bounds. Set `tail_bytes` to the most KV memory, in bytes,
# that one sequence's blocks can hold unfilled at any moment of its life (the model's `KV` bytes per
# token, blocks of `BLOCK` tokens).

# %%
### BEGIN SOLUTION 2.12: set tail_bytes to the most bytes a sequence's blocks can leave unfilled
tail_bytes = (BLOCK - 1) * KV  # the last block holds at least one token
### END SOLUTION
check("2.12", tail_bytes)

# %% [markdown]
# ## 7. The measurement that started it: the vLLM paper's Fig. 2, on a real trace
#
# The paper's contribution was *a measurement first and a mechanism second*: it averaged, over a
# loaded run, how much of the KV cache held token states under its Orca baselines and under paging —
# **20.4% (Orca Max), 26.8% (Pow2), 38.2% (Oracle), 96.3% (vLLM)**. The Orca baselines reserve:
#
# * **Max** — $S_{max}$ for every request (this lab's allocator);
# * **Pow2** — the prompt plus the true output length rounded up to a power of two;
# * **Oracle** — exactly prompt + output (a perfect length predictor).
#
# We replay the first 1,000 requests of the **Azure LLM Inference 2023 conversation trace**
# (Patel et al., ISCA 2024) through each real allocator on the lecture's 62.52 GB pool
# (`labsupport.fig2.fig2_breakdown`: every request waiting from the start, iteration-level admission,
# samples taken while memory is the bottleneck). Max is run at two context windows: 8,192 (the
# smallest power of two holding these 1,000 requests) and 16,384 (what the whole trace needs).

# %% tags=["needs-traces"]
trace = workloads.load_azure("conv")
stats = trace.summary()
print(f"{trace.name} ({'SYNTHETIC stand-in' if trace.synthetic else 'real trace'}): {stats['count']:,} requests; "
      f"prompt median {stats['prompt_median']:,.0f}, output median {stats['output_median']:,.0f} tokens")
head = trace.head(1000)
pairs = head.as_pairs()
capacity = int(BUDGET // KV)
breakdowns = fig2_breakdown(pairs, capacity, s_max=8192)
max16k = simulate_breakdown(pairs, capacity, "max", s_max=16_384)
for b in breakdowns.values():
    print(b.row())
print(max16k.row().replace("max    ", "max 16K"))

# %% tags=["needs-traces"]
shown = {"max": breakdowns["max"], "max 16K": max16k, **{k: breakdowns[k] for k in ("pow2", "oracle", "paged")}}
fig = viz_memory.fig2_figure(shown, labels={"max 16K": "Orca (Max), 16K"},
                             title="Azure conversation trace, lecture's H100 pool")
fig.show()

# %% tags=["needs-traces"]
prompt_total = sum(p for p, _ in pairs)
output_total = sum(o for _, o in pairs)
print(f"first 1,000 requests: mean prompt {prompt_total / len(pairs):,.0f}, mean output {output_total / len(pairs):,.0f} "
      f"tokens; outputs are {fmt_pct(output_total / (prompt_total + output_total), 1)} of all tokens")
for key in ("max", "pow2", "oracle", "paged"):
    print(f"{viz_memory.POLICY_LABELS[key]:>14}: token states {fmt_pct(breakdowns[key].token_states, 1)} here, "
          f"{fmt_pct(viz_memory.PAPER_FIG2_TOKEN_STATES[key], 1)} in the paper")

# %% [markdown]
# Read it as a measurement, not a benchmark to match:
#
# * **Max** wastes most of the pool, and how much depends on the limit you picked, not on the
#   requests: doubling the context window roughly halves its token-state share.
# * **Pow2 and Oracle** come out much better on this trace than in the paper. Reservation can only
#   waste the not-yet-generated part of a request, and on Azure conversations outputs are a small
#   share of all tokens (printed above); a workload with longer outputs relative to prompts leaves
#   more reserved-but-unfilled memory. Both still lose a large slice to **external fragmentation** —
#   holes between variable-size slots, Exercise 2's failure, measured.
# * **Paged** holds tokens in nearly all of the pool. The rest is the 1% of blocks vLLM keeps free as
#   a watermark (§10.5) and the last-block slots sequences are about to fill; tails are bounded, as
#   2.12 found, and no free block is ever the wrong size.
#
# The rows use the paper's categories: the empty slots of a last block that its sequence will fill count
# as **reservation**, so paged reads "internal 0.0%"; 2.11 and 2.12 call those same slots internal
# fragmentation, the waste paging bounds to under one block per sequence.

# %% [markdown]
# ## Self-check
#
# 1. Raise $S_{max}$ from 4,096 to 32,768 with the same workload. Which fragmentation grows, and why
#    does the number of sequences fall by more than 8×?
# 2. *"Allocate lazily and realloc when it grows."* Price one realloc of a 4K MHA slot: a copy reads and
#    writes the whole slot at `HBM_BW`. How many decode steps of the naive batch is that?
# 3. Per-request $S_{max}$ raises mean concurrency above the reserve-to-max batch. Name two ways it
#    still fails.
# 4. Which waste does paging eliminate, which does it bound, and which — the space for tokens not yet
#    emitted — can no allocator remove?
#
# The answers, once the exercises they lean on have passed:

# %%
if revealed("2.6", "2.10", "2.11", "2.14"):
    display(Markdown(f"""1. Internal fragmentation: it is proportional to $S_{{max}} - S_{{actual}}$. The slot grows 8×, and the
   whole slots that fit fall from {BUDGET // (S_MAX * KV)} to {BUDGET // (S_MAX_LONG * KV)} (the floor loses the remainder).
2. $2 \\times$ {fmt_gb(S_MAX * KV)} / {HBM_BW / 1e9:,.0f} GB/s = {2e3 * S_MAX * KV / HBM_BW:.2f} ms, a fraction of a step,
   *per sequence that grows*, while the others wait; and it needs a free slot twice the size to copy
   into, which is exactly what a full card does not have.
3. External fragmentation (a request refused with gigabytes free, as your run showed), and sequences
   still cannot grow past their declared guess (truncate the under-guessers, waste memory on the
   over-guessers).
4. Paging eliminates external fragmentation, bounds internal fragmentation to less than one block per
   sequence, and does not touch the third waste: a sequence that will emit {OUTPUT} tokens needs space
   for {OUTPUT - 1} it has not emitted yet. Paging makes that space available to whoever needs it *now* —
   and can promise it twice, which is §10.5's problem."""))

# %% [markdown]
# Next: **Lab 03 — PagedAttention's block table.**
