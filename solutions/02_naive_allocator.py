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
# which then places every slot of this lab's allocators; the two readings of a live allocator, what
# its slots hold and what they never fill (2.3, 2.2), which split the lecture's workload's budget
# (2.4 measures it over a sequence's life); utilization at any limit and model (2.6), which reads the
# long-context and brochure settings and drives the $S_{max}$ panel; and the concurrency estimate of
# per-request $S_{max}$ (2.9), set beside a real allocator serving that mix, whose external
# fragmentation your placement produces (2.14).
#
# Timing in the lecture: minutes 6–16 (*protected*). Here: about 45 minutes; the scoreboard at the end lists its checkoffs.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
import random

import torch

from labsupport import card, ledger, workloads
from labsupport.block_allocator import BlockAllocator
from labsupport.contiguous import ContiguousAllocator, ReserveToMaxAllocator
from labsupport.course.checkoff import check, revealed, unlocked
from labsupport.measure.fig2 import fig2_breakdown, simulate_breakdown
from labsupport.measure.fragmentation import fill_reserve_to_max, naive_measurement, run_until_fragmented
from labsupport.kvcache import ContiguousKVCache
from labsupport.memory_stats import OutOfBlocks, ReservationExceeded
from labsupport.units import fmt_bytes, fmt_gb, fmt_pct
from IPython.display import Markdown, display
from labsupport.viz import memory as viz_memory

torch.manual_seed(0)
COURSE = card.card()  # the course card (course.toml): the GPU and the model this lab is posed on
MODEL, GPU = COURSE.mha, COURSE.gpu  # its model in MHA form (the givens' KV_HEADS) and its GPU, for charts and panels

# %% tags=["givens"]
# The givens: the quantities this lab's exercises are posed on. Compute your answers from these names;
# the grader re-runs your code on other values of them.
HBM_BYTES = 80 * 10**9  # card=gpu.hbm_bytes: the card's memory, decimal GB (one {gpu})
PARAMS = 6_740_000_000  # card=mha.num_params: the model's parameters
DTYPE_BYTES = 2  # card=mha.dtype_bytes: bytes per weight and per cached element (bf16)
RESERVE_BYTES = 4 * 10**9  # activations and workspace, decimal GB
LAYERS = 32  # card=mha.num_layers: transformer layers
KV_HEADS = 32  # card=mha.num_kv_heads: KV heads per layer (MHA: one per query head)
GQA_KV_HEADS = 8  # card=gqa.num_kv_heads: KV heads of the GQA variant (Exercise 1)
HEAD_DIM = 128  # card=mha.head_dim: elements per head
HBM_BW = 3_350 * 10**9  # card=gpu.hbm_bandwidth: HBM bandwidth, bytes/s
PROMPT = 512  # tokens per prompt (the chat workload)
OUTPUT = 128  # tokens generated per request
S_MAX = 4_096  # the allocator's maximum sequence length
S_MAX_LONG = 32_768  # card=card.long_context: the long-context advertisement (§10.2)
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
        # prefill: the prompt's KV goes into the new slot, which also records the length it will reach
        alloc.allocate(admitted, num_tokens=PROMPT, final_tokens=PROMPT + OUTPUT)
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
# card's cache ({{ N.kv_budget_bytes / GB:.1f }} GB) does not fit in a laptop, so this one keeps the
# token geometry — {{ N.naive_concurrency }} slots of 4,096 positions, 512 + 128 tokens each — and
# shrinks each token to one layer, one head of 8 floats. Bytes per token change; which positions
# hold tokens does not, and that is what utilization counts.

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
print(f"allocator at {'lecture' if COURSE.is_lecture else 'card'} scale:                         slot occupancy "
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
# And the second board drawing: the {{ N.naive_concurrency }} slots stacked, each with its 640 tokens
# shaded. Everything orange is memory the card has, the allocator has promised away, and no token
# will ever occupy.

# %%
viz_memory.slot_stack_figure(alloc, BUDGET).show()

# %% [markdown]
# ### Exercise 2.2 — internal fragmentation, measured over a live allocator
#
# §10.2 names the orange: **internal fragmentation**, space reserved inside a sequence's own
# allocation that the sequence never fills. A slot holds more than tokens and waste, though: in the
# middle of a sequence's life part of it is waiting for tokens the sequence has not generated yet,
# and it will fill those.
#
# Write `internal_share(alloc, budget_bytes)`: the internal fragmentation of a live allocator, as a
# fraction of the KV budget. Read it off the allocator as 2.3 does; a `Slot` also has `.final`, the
# length its sequence will reach when the caller said so (`None` where it did not: then what the
# sequence holds is all it will hold). A sequence may be headed past its slot (`.final` > `.size`):
# it will be stopped there. The checkoff runs your function on allocators at admission, mid-decode
# and at the end of life, reserve-to-max and per-request $S_{max}$, several models and budgets.

# %%
def internal_share(alloc, budget_bytes):
    """Memory the live slots reserve and their sequences never fill, as a fraction of the KV budget."""
    ### BEGIN SOLUTION 2.2: return the bytes the live slots reserve and their sequences never fill, over budget_bytes
    never = 0
    for slot in alloc.slots.values():
        reach = slot.length if slot.final is None else max(slot.final, slot.length)
        never += slot.size - min(reach, slot.size)
    return never * alloc.kv_bytes_per_token / budget_bytes
    ### END SOLUTION


check("2.2", internal_share)

# %% [markdown]
# Your two functions split the budget of the allocator you served, at the end of its sequences' life
# and, on a fresh one, just after admission: what the slots hold, what they wait for, what they never
# fill, and what no whole slot can use.

# %%
if unlocked("2.2", "2.3"):
    at_admission = ReserveToMaxAllocator.from_budget(BUDGET, KV, s_max=S_MAX, place=placement)
    while at_admission.fits(S_MAX):
        at_admission.allocate(at_admission.num_seqs, num_tokens=PROMPT, final_tokens=PROMPT + OUTPUT)
    for when, a in (("just after admission", at_admission), ("at the end of life", alloc)):
        tokens, never = utilization(a, BUDGET), internal_share(a, BUDGET)
        to_come = sum(s.final - s.length for s in a.slots.values()) * KV / BUDGET
        print(f"{when:>20}: tokens {fmt_pct(tokens)} + still to come {fmt_pct(to_come)} + internal fragmentation "
              f"{fmt_pct(never)} + too small for a slot {fmt_pct(1 - tokens - to_come - never)}")

# %% [markdown]
# Internal fragmentation is fixed the moment a slot is reserved: it is sized by the limit, and the
# tokens only move the line between what a sequence holds and what it still waits for. The lecture's
# closed form for the end of life, once 2.1 and 2.2 pass:

# %%
if revealed("2.1", "2.2"):
    display(Markdown(r"""$$\text{slot} = S_{max} \times \text{KV per token}, \qquad
  B_{naive} = \left\lfloor \frac{\text{KV budget}}{\text{slot}} \right\rfloor, \qquad
  \text{internal} = \frac{B_{naive} \times (S_{max} - S_{actual}) \times \text{KV per token}}{\text{KV budget}}$$"""))
    b_naive = ledger.naive_concurrency(BUDGET, S_MAX, KV)
    print(f"{b_naive} slots of {fmt_bytes(S_MAX * KV)}; each leaves {fmt_bytes((S_MAX - PROMPT - OUTPUT) * KV)} "
          f"never filled; internal fragmentation {fmt_pct(b_naive * (S_MAX - PROMPT - OUTPUT) * KV / BUDGET)} of "
          f"the budget (the lecture's 84%)")

# %% [markdown]
# ### The same cache, over a sequence's life
#
# The utilization of 2.3 was read at the **end** of every sequence's life, when each holds all 640
# tokens. A busy card never sees that moment for every slot at once: a sequence is prefilled with its
# prompt and holds one more token after each of its decode steps, and when it finishes the next
# request takes its slot with a fresh prompt. What does the card hold on average, over a sequence's
# life?
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
    end_of_life = ledger.naive_utilization(BUDGET, S_MAX, PROMPT + OUTPUT, KV)
    over_life = ledger.naive_utilization_time_avg(BUDGET, S_MAX, PROMPT, OUTPUT, KV)
    print(f"end of life:   {fmt_pct(end_of_life)} of the budget")
    print(f"over the life: {fmt_pct(over_life)} of the budget (ledger), {fmt_pct(util_over_life)} (yours)")
    here = "here: it" if COURSE.is_lecture else f"here on {GPU.name} with {MODEL.name}; on its H100 it"
    display(Markdown(f"The lecture prints 15.2% (9.5 of 62.5 GB) at the end of life, {fmt_pct(end_of_life)} {here} "
                     f"reads 512 KiB as 512,000 B; its 14% (timing plan) and 86% empty (title) are the reading over "
                     f"the life, {fmt_pct(over_life)} here."))

# %% [markdown]
# ## 3. What the waste costs: concurrency and throughput
#
# Had each sequence held only what it uses — 640 tokens, in 16-token blocks — the same budget would
# hold several times more sequences (lab 03 builds that cache and counts them). Concurrency is not the
# end of it. During decode a step is memory-bound (Lecture 2 §2.15): it lasts as long as moving its
# bytes from HBM takes, and its arithmetic hides under that.
#
# ### Exercise 2.5 — the naive batch's throughput
#
# The naive allocator's batch is every slot the budget holds, each sequence at its last step, holding
# `PROMPT + OUTPUT` tokens. Set `naive_tok_s` to that batch's decode throughput, in tokens per second,
# on this card (`HBM_BW`), with the model of the givens.

# %%
### BEGIN SOLUTION 2.5: set naive_tok_s to the decode throughput (tokens/s) of the naive batch of full sequences
naive_tok_s = (BUDGET // (S_MAX * KV)) * HBM_BW / (
    PARAMS * DTYPE_BYTES + (BUDGET // (S_MAX * KV)) * (PROMPT + OUTPUT) * KV)
### END SOLUTION
check("2.5", naive_tok_s)

# %% [markdown]
# Once 2.5 passes, the ledger's step for the naive batch (the next cell waits for it):

# %%
if revealed("2.5"):
    b_naive = ledger.naive_concurrency(BUDGET, S_MAX, KV)
    t = ledger.tpot_s(MODEL, b_naive, PROMPT + OUTPUT, GPU.hbm_bandwidth)
    print(f"reserve-to-max: B = {b_naive}, step {1e3 * t:5.2f} ms "
          f"({fmt_gb(MODEL.weight_bytes)} of weights + {b_naive} x {fmt_gb((PROMPT + OUTPUT) * KV)} of KV at "
          f"{GPU.hbm_bandwidth / 1e9:,.0f} GB/s), {ledger.throughput_tok_s(b_naive, t):,.0f} tok/s")

# %% [markdown]
# A paged cache's larger batch (lab 03 counts it) gains less in throughput than in concurrency,
# because the weights are read once per step whoever is in the batch, and each extra sequence adds
# its own KV to the step (§10.6 returns to this: your neighbours set your cadence; lab 07 sets the
# lecture's "a third of the throughput" beside the exact ratio).

# %% [markdown]
# ## 4. Advertising long context
#
# The service raises its limit to `S_MAX_LONG` tokens. The workload does not change: every request is
# still `PROMPT + OUTPUT` tokens. The lecture: *"…the same chat workload's utilization falls to 1.9%,
# because the slot grew 8× and the occupancy did not."* Rather than redo the arithmetic for each limit,
# build it once; this section and the next read every limit and model through your function.
#
# ### Exercise 2.6 — reserve-to-max utilization, for any limit
#
# Write `reserve_to_max_utilization(budget_bytes, s_max, seq_tokens, kv_bytes)`: the utilization (a
# fraction: bytes holding tokens over `budget_bytes`) of a reserve-to-max allocator on that budget
# that has admitted every request it can, each sequence `seq_tokens` long, at `kv_bytes` per token. A
# slot cannot grow: a sequence longer than `s_max` stops at `s_max`. The checkoff tries limits,
# models and budgets the lab never shows, some where not even one slot fits.

# %%
def reserve_to_max_utilization(budget_bytes, s_max, seq_tokens, kv_bytes):
    """Utilization of a reserve-to-max allocator filled with seq_tokens-long sequences, a fraction of the budget."""
    ### BEGIN SOLUTION 2.6: return the share of budget_bytes that the admitted sequences' tokens occupy
    slots = budget_bytes // (s_max * kv_bytes)  # only whole slots hold a sequence
    return slots * min(seq_tokens, s_max) * kv_bytes / budget_bytes
    ### END SOLUTION


check("2.6", reserve_to_max_utilization)

# %% [markdown]
# Your function at the advertised limit, beside the real allocator filled at it (the two limits side
# by side wait for 2.7, whose question their ratio answers):

# %%
if unlocked("2.6"):
    m = naive_measurement(fill_reserve_to_max(BUDGET, S_MAX_LONG, PROMPT + OUTPUT, KV), BUDGET)
    yours = reserve_to_max_utilization(BUDGET, S_MAX_LONG, PROMPT + OUTPUT, KV)
    print(f"S_max = {S_MAX_LONG:,}: yours {fmt_pct(yours)}, the real allocator {fmt_pct(m['utilization'])}")
    print(f"The lecture prints 1.9%; over the budget it is {fmt_pct(m['utilization'])}: 1.9% is one slot's "
          f"occupancy, {PROMPT + OUTPUT:,} of {S_MAX_LONG:,} positions ({fmt_pct((PROMPT + OUTPUT) / S_MAX_LONG)}), "
          f"cut short, and the budget holds whole slots only.")

# %% [markdown]
# ### Exercise 2.7 — what the advertisement cost
#
# The lecture's reasoning — the slot grew 8×, the occupancy did not — is about one slot. What a service
# sells is sequences served at once. Set `long_context_cost` to the factor by which raising the limit
# from `S_MAX` to `S_MAX_LONG` divides the number of chat sequences the card serves at once.

# %%
### BEGIN SOLUTION 2.7: set long_context_cost to the factor S_MAX_LONG divides the chat workload's concurrency by
long_context_cost = (BUDGET // (S_MAX * KV)) / (BUDGET // (S_MAX_LONG * KV))
### END SOLUTION
check("2.7", long_context_cost)

# %% [markdown]
# Where the budget goes at each limit, on the real allocator, through your 2.2 and 2.6: the slot grew
# 8×, and whatever the count lost beyond that went into the remainder no whole slot can use.

# %%
if unlocked("2.2", "2.6", "2.7"):
    for s_max in (S_MAX, S_MAX_LONG):
        a = fill_reserve_to_max(BUDGET, s_max, PROMPT + OUTPUT, KV)
        tokens = reserve_to_max_utilization(BUDGET, s_max, PROMPT + OUTPUT, KV)
        print(f"S_max = {s_max:>6,}: {a.num_seqs:>2} slots of {fmt_gb(s_max * KV)}; tokens {fmt_pct(tokens)}, "
              f"internal fragmentation {fmt_pct(internal_share(a, BUDGET))}, too small for another slot "
              f"{fmt_pct(1 - tokens - internal_share(a, BUDGET))}")
    print(f"concurrency divided by {long_context_cost:.4g} for a slot {S_MAX_LONG // S_MAX}x larger")

# %% [markdown]
# ## 5. Exercise 1 — the long-context brochure
#
# Your service advertises a 128K context window: $S_{max}$ = `S_MAX_BROCHURE`. The workload is
# unchanged. First the slot under MHA, against the budget, and the real allocator filled with it:

# %%
mha_128k = fill_reserve_to_max(BUDGET, S_MAX_BROCHURE, PROMPT + OUTPUT, KV)
print(f"MHA at S_max = {S_MAX_BROCHURE:,}: one slot is {S_MAX_BROCHURE:,} x {KV:,} B = "
      f"{fmt_gb(S_MAX_BROCHURE * KV, 2)}, the KV budget {fmt_gb(BUDGET, 2)}; {mha_128k.num_seqs} "
      f"request{'' if mha_128k.num_seqs == 1 else 's'} admitted")
viz_memory.slot_stack_figure(mha_128k, BUDGET).show()

# %% [markdown]
# Relax to {{ gqa.attention }} (`GQA_KV_HEADS` KV heads per layer instead of `KV_HEADS`). The KV
# budget is the same — the lecture keeps the parameter count fixed so that only the cache changes.
# Your 2.6 reads both models at the brochure's limit:

# %%
KV_GQA = 2 * LAYERS * GQA_KV_HEADS * HEAD_DIM * DTYPE_BYTES  # the GQA model's KV bytes per token
if unlocked("2.6"):
    for name, kv in (("MHA", KV), (f"GQA-{GQA_KV_HEADS}", KV_GQA)):
        m = naive_measurement(fill_reserve_to_max(BUDGET, S_MAX_BROCHURE, PROMPT + OUTPUT, kv), BUDGET)
        print(f"{name:>5}, S_max = {S_MAX_BROCHURE:,}: slot {fmt_gb(S_MAX_BROCHURE * kv)}, {m['concurrency']} "
              f"slot{'' if m['concurrency'] == 1 else 's'}, "
              f"utilization {fmt_pct(reserve_to_max_utilization(BUDGET, S_MAX_BROCHURE, PROMPT + OUTPUT, kv), 3)} "
              f"(yours), {fmt_pct(m['utilization'], 3)} (the real allocator)")
    if COURSE.is_lecture:
        print(f"The lecture's sketch prints 0.39%; exactly it is {fmt_pct(m['utilization'], 3)}: it takes a "
              f"{PROMPT + OUTPUT}-token sequence as 0.082 GB, 128 KiB read as 128,000 B, where "
              f"{PROMPT + OUTPUT} x {KV_GQA:,} B is {fmt_gb((PROMPT + OUTPUT) * KV_GQA, 4)}.")
    else:  # the lecture's sketch is its H100's, with its 7B at GQA-8
        print(f"The lecture's sketch prints 0.39% on its H100 (it takes a 640-token sequence as 0.082 GB, 128 KiB "
              f"read as 128,000 B); here, on {GPU.name} with {COURSE.gqa.name}, exactly it is "
              f"{fmt_pct(m['utilization'], 3)}.")

# %% [markdown]
# Now paging, with the real block allocator (lab 03 builds it): the same budget cut into whole blocks
# of `BLOCK` tokens (`BLOCK * KV_GQA` bytes each), a sequence holding whole blocks.
# `BlockAllocator(num_blocks, BLOCK)` is such a pool; `pool.blocks_needed(n)` is the blocks n tokens
# take, `pool.can_allocate(k)` says whether k more are free, `pool.allocate(seq_id, n)` takes the blocks of n
# tokens (a token count, not a block count).
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
    print(f"paged, GQA, b = {BLOCK}: {pool.num_blocks:,} blocks of {BLOCK * KV_GQA:,} B; {paged_gqa:,} sequences "
          f"of {PROMPT + OUTPUT} tokens; {pool.num_free_blocks} blocks left")
    if COURSE.is_lecture:
        sketch = (f"The lecture's sketch prints ≈ 744 sequences and a cost of 248×; whole blocks give "
                  f"{paged_gqa:,} and {brochure_cost:.2f}: it divides the printed 62.5 GB by a rounded 0.084 GB "
                  f"a sequence.")
    else:  # the lecture's sketch is its H100's, with its 7B at GQA-8
        sketch = (f"The lecture's sketch prints ≈ 744 sequences and a cost of 248× on its H100 (it divides "
                  f"the printed 62.5 GB by a rounded 0.084 GB a sequence); here, on {GPU.name} with "
                  f"{COURSE.gqa.name}, whole blocks give {paged_gqa:,} and {brochure_cost:.2f}.")
    display(Markdown(sketch))

# %% [markdown]
# ### The knobs: S_max, the workload, the model, the card
#
# Every number below is measured on a real `ReserveToMaxAllocator` filled by the panel (the readout
# puts the ledger's closed form and your `reserve_to_max_utilization` beside it). It confirms 2.6 and
# 2.7 at any limit, model and card; predict before you move anything:
#
# * **Advertise long context.** Slide $S_{max}$ to 32,768. The workload did not change. What happens to
#   the number of slots and to utilization?
# * **The brochure.** Slide $S_{max}$ to 131,072 (Exercise 1).
# * **{{ gqa.attention }}.** Switch the model to `{{ gqa.name }}`: which numbers move, and by what factor?
# * **Short limits.** $S_{max}$ = 512 with 640-token sequences: utilization looks great. Why is that
#   configuration still wrong? (Read the readout's note.)

# %%
# It opens at the lecture's 4,096, on the card's GPU and the lab's model (the card's in MHA form, as the cells above);
# once 2.6 passes its readout also runs your function at every setting. (What a paged pool holds is lab 03's question.)
viz_memory.naive_panel(model=MODEL.name, paged=False,
                       utilization_fn=reserve_to_max_utilization if unlocked("2.6") else None)

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
# never fills: the empty positions of each slot above (2.2 measures them), proportional to
# $S_{max} - S_{actual}$.
#
# **External fragmentation** is free space *between* allocations, too small for the next request.
# With uniform slots there is none — the one virtue of reserving to the maximum. The real allocator
# shows it: retire a random third of the {{ N.naive_concurrency }} sequences and every freed slot
# fits the next arrival.

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
# budget. The lecture asks how many requests the card then serves at once, on average.
#
# ### Exercise 2.9 — how many requests a budget holds, on average
#
# Write `concurrency_estimate(budget_bytes, mix, kv_bytes)`: about how many requests a KV budget of
# `budget_bytes` holds at once when each reserves a slot of its own declared $S_{max}$ at `kv_bytes`
# per token, the declarations coming in the proportions of `mix`, a list of `(S_max, share of
# requests)` pairs whose shares add up to 1. Return the unrounded estimate or a whole number of
# requests: the checkoff accepts either. Below, the lab sets your estimate beside a real allocator
# serving the lecture's mix; the checkoff tries mixes, models and budgets the lab never shows.

# %%
MIX = ((S_MAX_SHORT, SHARE_SHORT), (S_MAX, 1 - SHARE_SHORT - SHARE_LONG), (S_MAX_LONG, SHARE_LONG))  # (S_max, share)


def concurrency_estimate(budget_bytes, mix, kv_bytes):
    """About how many requests, each reserving its own declared S_max from `mix`, a KV budget holds at once."""
    ### BEGIN SOLUTION 2.9: return about how many requests declaring S_max values in the mix's proportions fit
    per_request = sum(share * s_max * kv_bytes for s_max, share in mix)  # what one reserves, on average
    return budget_bytes / per_request
    ### END SOLUTION


check("2.9", concurrency_estimate)

# %% [markdown]
# ### Exercise 2.10 — who holds the memory
#
# Residents finish at random, whatever they declared. Set `long_share` to the share of the memory the
# residents hold reserved at once, on average, that belongs to the requests that declared `S_MAX_LONG`
# (a fraction).

# %%
### BEGIN SOLUTION 2.10: set long_share to the share of the reserved memory the S_MAX_LONG requests hold
long_share = SHARE_LONG * S_MAX_LONG / sum(share * s_max for s_max, share in MIX)
### END SOLUTION
check("2.10", long_share)

# %%
if revealed("2.9", "2.10"):
    display(Markdown(r"""$$\overline{\text{slot}} = \sum_i p_i \, S_{max,i} \times \text{KV per token}, \qquad
  \bar B \approx \frac{\text{KV budget}}{\overline{\text{slot}}}, \qquad
  \text{share}_{long} = \frac{p_{long} \, S_{max,long}}{\sum_i p_i \, S_{max,i}}$$"""))
    mean_slot = sum(share * s_max * KV for s_max, share in MIX)
    lecture = ("The lecture prints a mean slot of 1.586 GB; its own terms, 0.7 x 0.268 + 0.25 x 2.147 + 0.05 x 17.2, "
               "add up to 1.584 GB")
    if COURSE.is_lecture:
        print(f"{lecture} ({fmt_gb(mean_slot, 4)} exactly), and {fmt_gb(BUDGET, 2)} / {fmt_gb(mean_slot, 4)} = "
              f"{BUDGET / mean_slot:.2f}: its ≈ 39 holds.")
    else:  # the lecture's terms and its ≈ 39 are its H100's and its 7B's
        print(f"{lecture}, and its H100 holds ≈ 39; here, on {GPU.name} with {MODEL.name}, a mean slot is "
              f"{fmt_gb(mean_slot, 4)}, and {fmt_gb(BUDGET, 2)} / {fmt_gb(mean_slot, 4)} = {BUDGET / mean_slot:.2f}.")

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
# Your estimate assumed the residents pack the budget. The same kind of run, kept going past its
# first fragmented refusal, measures what a full card held each time it said no: the residents, the
# share of the budget they had reserved, and the long requests' share of that.

# %%
if unlocked("2.9", "2.10"):
    sizes, shares = [s for s, _ in MIX], [p for _, p in MIX]
    draw, space = random.Random(0), ContiguousAllocator(int(BUDGET // KV), place=placement)  # the card's budget
    residents, reserved, long_held = [], [], []
    for arrival in range(20_000):
        size = draw.choices(sizes, shares)[0]
        while not space.fits(size):  # refused: read the full card, then a random 30% of the residents finish
            held = [slot.size for slot in space.slots.values()]
            residents.append(len(held))
            reserved.append(sum(held) / space.capacity_tokens)
            long_held.append(sum(h for h in held if h == S_MAX_LONG) / sum(held))
            for sid in draw.sample(sorted(space.slots), max(1, int(0.3 * len(held)))):
                space.free(sid)
        space.allocate(arrival, size)
        if len(residents) >= 300:
            break
    n = max(1, len(residents))  # (20,000 arrivals refuse some on any card the givens describe)
    estimate = concurrency_estimate(BUDGET, MIX, KV)
    print(f"your estimate: {estimate:.2f} requests at once; the real allocator, at its {n} refusals: "
          f"{sum(residents) / n:.2f} residents on average, with {fmt_pct(sum(reserved) / n)} of the budget reserved "
          f"(your estimate x that share: {estimate * sum(reserved) / n:.2f})")
    print(f"your share of the memory held by {S_MAX_LONG:,}-token requests: {fmt_pct(long_share)}; at those "
          f"refusals: {fmt_pct(sum(long_held) / n)}")

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
# (Patel et al., ISCA 2024) through each real allocator on the card's
# {{ N.kv_budget_bytes / GB:.2f }} GB pool (`labsupport.measure.fig2.fig2_breakdown`: every request waiting
# from the start, iteration-level admission, samples taken while memory is the bottleneck). Max is
# run at two context windows: 8,192 (the smallest power of two holding these 1,000 requests) and
# 16,384 (what the whole trace needs).

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
                             title="Azure conversation trace, " + ("lecture's H100 pool" if COURSE.is_lecture else
                                                                   f"the card's pool ({GPU.name}, {MODEL.name})"))
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
# The rows use the paper's categories, the ones your 2.2 sorts a slot by: the empty slots of a last
# block that its sequence will fill count as **reservation**, so paged reads "internal 0.0%"; 2.11 and
# 2.12 follow §10.3, which calls those same slots internal fragmentation, the waste paging bounds to
# under one block per sequence.

# %% [markdown]
# ## Self-check
#
# 1. Raise $S_{max}$ from 4,096 to 32,768 with the same workload. Internal fragmentation is
#    proportional to $S_{max} - S_{actual}$: why does its share of the budget not grow in proportion?
# 2. *"Allocate lazily and realloc when it grows."* Price one realloc of a 4K MHA slot: a copy reads and
#    writes the whole slot at `HBM_BW`. How many decode steps of the naive batch is that?
# 3. On paper, per-request $S_{max}$ holds more requests at once than the reserve-to-max batch (2.9).
#    Name two ways it still fails.
# 4. Which waste does paging eliminate, which does it bound, and which — the space for tokens not yet
#    emitted — can no allocator remove?
#
# The answers, once the exercises they lean on have passed:

# %%
if revealed("2.2", "2.5", "2.7", "2.9", "2.11", "2.12", "2.14"):
    seq = PROMPT + OUTPUT
    short_slots, long_slots = BUDGET // (S_MAX * KV), BUDGET // (S_MAX_LONG * KV)
    step = (PARAMS * DTYPE_BYTES + short_slots * seq * KV) / HBM_BW  # the naive batch's decode step
    copy = 2 * S_MAX * KV / HBM_BW
    why = ("why the count falls by more than the slot grows" if short_slots * S_MAX > long_slots * S_MAX_LONG else
           "internal fragmentation, what the slots reserve less their tokens, grows toward the budget, never past it")
    display(Markdown(f"""1. Per slot it does grow: a slot's empty share goes from {fmt_pct(1 - seq / S_MAX)} to \
   {fmt_pct(1 - seq / S_MAX_LONG)}. But the whole slots that fit fall from {short_slots} to {long_slots}, so over the \
   budget internal fragmentation goes from {fmt_pct(short_slots * (S_MAX - seq) * KV / BUDGET)} to \
   {fmt_pct(long_slots * (S_MAX_LONG - seq) * KV / BUDGET)}, while the remainder no whole slot can use goes from \
   {fmt_pct(1 - short_slots * S_MAX * KV / BUDGET)} to {fmt_pct(1 - long_slots * S_MAX_LONG * KV / BUDGET)}: waste \
   all the same, and {why}.
2. $2 \\times$ {fmt_gb(S_MAX * KV)} / {HBM_BW / 1e9:,.0f} GB/s = {1e3 * copy:.2f} ms, {copy / step:.2f} of a \
   {1e3 * step:.2f} ms step, *per sequence that grows*, while the others wait; and it needs a free slot twice the \
   size to copy into, which is exactly what a full card does not have.
3. External fragmentation (a request refused with gigabytes free, as your run showed), and sequences
   still cannot grow past their declared guess (truncate the under-guessers, waste memory on the
   over-guessers).
4. Paging eliminates external fragmentation, bounds internal fragmentation to less than one block per
   sequence, and does not touch the third waste: a sequence that will emit {OUTPUT} tokens needs space
   for {OUTPUT - 1} it has not emitted yet. Paging makes that space available to whoever needs it *now* —
   and can promise it twice, which is §10.5's problem."""))

# %% [markdown]
# Next: **Lab 03 — PagedAttention's block table.**
