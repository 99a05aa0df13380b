# %% [markdown]
# # Lab 08 — What paging did not fix: the map of Part II (§10.7, discussion seeds)
#
# Today removed **one term from one equation**: the memory a reserve-to-maximum allocator reserved and
# never used. This lab puts the rest of the semester against what remains — every later date is a
# specific quantity in today's arithmetic that is still wrong — and recomputes each of those quantities
# here, live, with the same mechanisms the earlier labs built. Then it maps the four vLLM knobs you will
# set in Assignment 4 onto quantities of these labs, and gives each of the lecture's five discussion
# seeds the data to argue from.
#
# **Learning objective served** (the lecture's numbering)
#
# * **Objective 8** — place each remaining Part II topic against the specific quantity in today's
#   arithmetic that it attacks: read off the table (8.1), then done by changing the quantity on the
#   model or the card (8.8) and measuring which output moves (8.2); the vLLM knobs (8.3–8.6) and a
#   workload of your own (8.7) tie it to the engine.
#
# Timing in the lecture: minutes 68–75 (the table itself is reading-only). Here: about 45 minutes.

# %% tags=["needs-traces"]
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
import math
from dataclasses import replace

import numpy as np
from IPython.display import HTML, Markdown, display

from labsupport import card, ledger, workloads
from labsupport.course.checkoff import check, revealed, unlocked
from labsupport.measure.part_two import (attention_intensity, interference_spike, length_prediction_cost, map_rows, outputs,
                                  tlb_bytes, trace_numbers)
from labsupport.measure.replay import ReplayConfig, chat_requests, replay, tlb_replay, utilization_run, utilization_sweep
from labsupport.measure.sharing import measure_fanout, measure_fork_cost
from labsupport.specs import GB
from labsupport.viz import board as viz_board
from labsupport.viz import slo as viz_slo

COURSE = card.card()  # the course's card (course.toml); the lecture's is its 7B MHA model on an H100 SXM
GPU, MHA = COURSE.gpu, COURSE.mha  # the card's GPU, and its model with a KV head for every query head
azure = workloads.load_azure("conv")
azure_code = workloads.load_azure("code")
mooncake = workloads.load_mooncake("conversation")
for w in (azure, azure_code, mooncake):
    print(f"{w.name} ({'SYNTHETIC stand-in' if w.synthetic else 'real trace'}): {len(w):,} requests")

# %% [markdown]
# ## 1. The table of what paging did not fix
#
# §10.7's table has a column the lecture could not print: **each quantity's value**, recomputed here
# from the real traces (Azure LLM Inference 2023, Patel et al., ISCA 2024; Mooncake FAST'25, Qin et
# al., FAST 2025), the engine (cost-model clock, {{ "the lecture's 7B on an H100" if card.is_lecture else "`" + model.name + "` on `" + gpu.name + "`" }}) and the ledger. Below
# are the nine values alone, in an order of their own (not the lecture's), each with the lab where
# you first met it. Exercise 8.1 asks which quantity each one measures.

# %% tags=["needs-traces"]
numbers = trace_numbers(azure, mooncake)
rows = map_rows(numbers)  # in the lecture's order
VALUES_ORDER = (4, 0, 6, 2, 8, 1, 5, 3, 7)  # the order the values are shown in (lecture row numbers, from 0)
HTML(viz_board.map_table_html([rows[i] for i in VALUES_ORDER], columns=("its value here", "computed in")))

# %% [markdown]
# How each value was computed — read these before arguing with the table.
#
# **Attention's 1 FLOP/byte** (lab 04). A decode token attends to every cached key: $2d$ FLOPs for
# $q\cdot k$ and $2d$ for the weighted sum of $v$, per head and layer, while reading $2 \cdot d \cdot b$
# bytes of K and V per KV head and layer. For MHA that is $4LHd / 2LH_{kv}db = 1$ FLOP/byte; {{ gqa.attention }}
# reads each KV head for {{ gqa.gqa_group }} query heads, so **{{ gqa.gqa_group }}** FLOP/byte. Either way far below the {{ "H100" if card.is_lecture else "`" + gpu.name + "`" }}'s ridge of {{ gpu.peak_flops / gpu.hbm_bandwidth:.0f }}:
# attention is bandwidth, and after paging it is the *gather's* bandwidth.

# %%
gpu_name = "H100" if COURSE.is_lecture else GPU.name  # the lecture's word for its own card
for m in (MHA, COURSE.gqa):
    print(f"{m.name:>16}: {attention_intensity(m):.0f} FLOP per KV byte; "
          f"the {gpu_name}'s ridge is {GPU.peak_flops / GPU.hbm_bandwidth:.0f} FLOP/byte")

# %% [markdown]
# **Effective B under request-level batching** (lab 06). Take the Azure trace's requests in arrival
# order, 186 at a time (the memory ceiling on the lecture's card), and run each batch until its longest member finishes —
# what an engine that re-chooses the batch only per request does. The tokens produced divided by the
# steps run is the batch you actually got:

# %% tags=["needs-traces"]
rb = numbers["request_batching"]
print(f"{rb['batches']} batches of {rb['batch']}: effective B mean {rb['mean_effective_b']:.1f}, median "
      f"{rb['median_effective_b']:.1f} — {100 * rb['mean_effective_b'] / rb['batch']:.0f}% of "
      f"{'the slots paging bought' if COURSE.is_lecture else 'the batch'}, because each batch waits for its "
      f"longest output (mean output {rb['mean_output']:.0f} tokens)")

# %% [markdown]
# **The interference spike** (lab 07). 186 chat sequences decode (the memory batch on the lecture's card); one
# 4,096-token prompt arrives. The lecture *adds* the prefill to the decode step, on its own card:
# $(129.4 + 22.65)/22.65 = 6.71\times$. Whether a step's
# arithmetic and its memory traffic add up or overlap is an assumption about the hardware, and the
# engine's cost model can take either: by default it lets them overlap perfectly (the step takes the
# longer of the two), the kindest case; `CostModel(overlap=False)` adds them, the lecture's model,
# which also makes the ordinary decode steps a little longer (their own arithmetic is added). Both,
# on the engine:

# %%
for label, sp in (("overlapped (the engine's default)", numbers["spike"]),
                  ("added (§2.16's model)", interference_spike(overlap=False))):
    print(f"{label:>34}: a neighbour's usual gap {1e3 * sp['usual_gap_s']:6.2f} ms, the gap with the prefill "
          f"in it {1e3 * sp['spike_gap_s']:6.2f} ms = {sp['engine_ratio']:.2f}x")
print(f"{'the lecture, by hand':>34}: {numbers['spike']['lecture_additive_ratio']:.2f}x")

# %% [markdown]
# **A hit on the wrong replica** (lab 05). The Mooncake conversation trace's `hash_ids` name 512-token
# prompt blocks. With one card and an unbounded prefix cache, 36.6% of requested blocks were already
# seen. Spread the same requests round-robin over more cards, each with its own cache:

# %% tags=["needs-traces"]
for k, rate in numbers["routing"].items():
    print(f"{int(k):2d} card(s), round-robin: {100 * rate:5.1f}% of prompt blocks hit a prefix cache")

# %% [markdown]
# **Dependence between requests** (lab 05's trace): the share of Mooncake requests that re-send at least
# half of their prompt blocks as a prefix an earlier request already sent — to the engine, strangers:
# **42.5%** (see the table). Together with the agent session's 92.06% re-send (lab 07, Exercise 5), this
# is the case for the prefix cache (Nov 9) and for agent-aware serving (Nov 18 and 23).

# %% [markdown]
# ### Exercise 8.1 — the quantity behind each row
#
# Objective 8 asks you to map what paging left broken onto the quantity that tracks it. The lecture's
# second column holds nine quantities, listed below in alphabetical order. Each value in the table at
# the top of this section *is* one of them, measured. Set `row_quantities` to a list of nine of them,
# copied as printed: the quantity the table's first value measures, then the second's, and so on. The
# notes above on how each value was computed are your evidence; the lecture's table pairs each
# quantity with what it leaves broken, not with these numbers.

# %%
for q in sorted(r.quantity for r in rows):
    print(f"  {q}")

# %%
### BEGIN SOLUTION 8.1: set row_quantities to the nine quantities, in the order of the values table
row_quantities = ["KV bytes per token", "achieved bandwidth on an indirect access",
                  "bytes per weight and per cached value", "§2.16's 6.7× TPOT spike",
                  "the dependence between requests", "effective B over time", "the 92% re-send of Lecture 5",
                  "which card a request lands on", "tokens per pass over the weights"]
### END SOLUTION
check("8.1", row_quantities)

# %% [markdown]
# ### 1b. Place a row by changing its quantity
#
# A row of the map is placed when you can change its quantity and say which output of today's
# arithmetic moves. Three of the nine quantities are fields of the model or the card: **KV bytes per
# token** (`model.num_kv_heads`: GQA shares each KV head among several query heads), **bytes per weight
# and per cached value** (`model.dtype_bytes`) and **achieved bandwidth on an indirect access**
# (`gpu.hbm_bandwidth`: what a gather kernel reaches). `part_two.outputs(model, gpu)` reads four outputs
# off the mechanisms for the lecture's chat workload:
#
# * `"memory batch"`: 640-token sequences a `BlockAllocator` over the card's KV budget holds
#   (16-token blocks, a 4 GB reserve);
# * `"TPOT"`: the engine's cost-model step for 186 of them decoding (the memory batch on the lecture's card,
#   kept on every card; seconds);
# * `"longest gap"`: a neighbour's longest wait between two tokens when a 4,096-token prompt joins the
#   186 (an engine run, seconds);
# * `"prefill"`: that prompt's prefill step alone (seconds).

# %%
baseline = outputs(MHA, GPU)
print({k: round(v, 5) for k, v in baseline.items()},
      "(the lecture's 7B on the H100)" if COURSE.is_lecture else f"({MHA.name} on the {GPU.name})")

# %% [markdown]
# ### Exercise 8.8 — change the quantity a row attacks
#
# Write `attacked(model, gpu, quantity, factor)`: the model and the card, returned as a pair
# `(model, gpu)`, with `quantity` (one of the three above, spelled as in the table) made `factor` times
# better — and nothing else changed: the same weights, the same query heads, the same names.

# %%
def attacked(model, gpu, quantity, factor):
    """(model, gpu) with one of §10.7's quantities made `factor` times better, all else as it was."""
    ### BEGIN SOLUTION 8.8: return (model, gpu) with `quantity` made `factor` times better and nothing else changed
    if quantity == "KV bytes per token":
        return replace(model, num_kv_heads=model.num_kv_heads // factor), gpu
    if quantity == "bytes per weight and per cached value":
        return replace(model, dtype_bytes=model.dtype_bytes // factor), gpu
    return model, replace(gpu, hbm_bandwidth=gpu.hbm_bandwidth * factor)
    ### END SOLUTION


check("8.8", attacked)

# %% [markdown]
# ### Exercise 8.2 — which output each change moves
#
# The lecture places each row by the quantity it attacks; it does not say what that buys. Predict first,
# then measure: for each of the three quantities, double it (`factor=2`) on {{ "the lecture's 7B and H100" if card.is_lecture else "the card's `" + mha.name + "` and `" + gpu.name + "`" }}
# (`MHA` and `GPU`) with your `attacked`, read `outputs` again, and set `largest_move` to a dict from the quantity to the
# output that moved by the largest factor, whichever way (`"memory batch"`, `"TPOT"`, `"longest gap"`
# or `"prefill"`).

# %%
QUANTITIES_ON_THE_SPECS = ("KV bytes per token", "bytes per weight and per cached value",
                           "achieved bandwidth on an indirect access")

# %%
### BEGIN SOLUTION 8.2: set largest_move to {quantity: the output that moves by the largest factor} for the three quantities
largest_move = {}
for quantity in QUANTITIES_ON_THE_SPECS:
    after = outputs(*attacked(MHA, GPU, quantity, 2))
    largest_move[quantity] = max(after, key=lambda k: max(after[k] / baseline[k], baseline[k] / after[k]))
### END SOLUTION
check("8.2", largest_move)

# %%
if revealed("8.2"):
    for quantity in QUANTITIES_ON_THE_SPECS:
        after = outputs(*attacked(MHA, GPU, quantity, 2))
        print(f"{quantity:>42}: " + ", ".join(f"{k} {max(after[k] / baseline[k], baseline[k] / after[k]):.3f}x"
                                               for k in baseline))
    display(Markdown(f"""Halving the bytes of every number moves the memory batch *more* than 2×: the pool holds
twice the tokens per byte, and the halved weights give back {MHA.weight_bytes / 2 / GB:.2f} GB to the pool as well. TPOT moves at most
2× (the weights and the KV are all the bytes a decode step reads). And no change to bytes moves the longest
gap or the prefill: a step that carries a 4,096-token prompt is arithmetic. That row — §2.16's spike —
is placed by moving the prefill off the decode step, which is what disaggregation (Oct 14) and chunked
prefill (section 2) do; the other rows need a trace or a new engine (the notes above)."""))

# %% [markdown]
# The whole table in the lecture's order — with the quantity and the date of Part II that attacks each
# row once 8.1 passes. Its first column quotes the lecture, numbers included (its 129 ms, 199 decodes,
# 512 KiB and 13.5 GB are the lecture's card's); the values are this lab's:

# %% tags=["needs-traces"]
shown = ["still broken after today", "the quantity", "its value here", "where it goes", "computed in"]
if not revealed("8.1"):
    shown.remove("the quantity")
    shown.remove("where it goes")
HTML(viz_board.map_table_html(rows, columns=shown))

# %% [markdown]
# ## 2. The knobs you were given: vLLM's four, mapped onto these labs
#
# The reading guide asks for one sentence per knob. Here each is also a function you write and a
# number the engine checks.
#
# | vLLM knob | the quantity it sets | computed in |
# |---|---|---|
# | `gpu_memory_utilization` | the KV budget, hence the pool's block count ({{ N.kv_budget_bytes / GB:.2f }} GB at 1.0 with a 4 GB activation reserve) | lab 02 |
# | `max_num_seqs` | the decode batch B of §10.6 — the SLO-limited B, when it is below the memory ceiling | lab 07 |
# | `max_num_batched_tokens` | the tokens one step may carry: the chunked-prefill limit Oct 14 explains | labs 06, 07 |
# | `block_size` | §10.3's table: tail waste against table length and the kernel's contiguous run | labs 03, 04 |
#
# ### Exercise 8.3 — `gpu_memory_utilization` → the pool
#
# vLLM lets the engine use `gpu_memory_utilization × HBM` in all; the weights and the activations come
# out of that, and the rest is cut into KV blocks. Write `num_gpu_blocks(model, gpu,
# gpu_memory_utilization, block_size=16, activation_bytes=4e9)` (0 when nothing is left).

# %%
def num_gpu_blocks(model, gpu, gpu_memory_utilization, block_size=16, activation_bytes=4e9):
    """KV blocks of `block_size` tokens that fit in gpu_memory_utilization × HBM after weights and activations."""
    ### BEGIN SOLUTION 8.3: return the whole number of KV blocks left after weights and activations (never negative)
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    left = gpu_memory_utilization * gpu.hbm_bytes - model.num_params * model.dtype_bytes - activation_bytes
    return max(0, math.floor(left / (block_size * kv)))
    ### END SOLUTION


check("8.3", num_gpu_blocks)

# %%
if unlocked("8.3"):
    for u in (1.0, 0.95, 0.9):
        blocks = num_gpu_blocks(MHA, GPU, u)
        print(f"gpu_memory_utilization={u}: {blocks:,} blocks of 16 tokens = {blocks * 16 * MHA.kv_bytes_per_token / GB:.2f} GB "
              f"of KV -> {blocks // 40} sequences of 640 tokens")

# %% [markdown]
# vLLM's default of 0.9 leaves {{ 0.1 * gpu.hbm_bytes / GB:g }} GB of the card unused by design (other processes, fragmentation in the
# allocator beneath PyTorch); the KV budget of the lecture's arithmetic ({{ N.kv_budget_bytes / GB:.2f }} GB here) is
# `gpu_memory_utilization = 1.0`.
#
# ### Exercise 8.4 — `max_num_seqs` → the B of §10.6
#
# Write `max_num_seqs_for(model, gpu, gpu_memory_utilization, seq_tokens, tpot_slo_s, block_size=16)`:
# the largest batch that fits the pool (8.3, with the 4 GB activation reserve) and whose memory-bound
# step meets the TPOT SLO (lab 07).

# %%
def max_num_seqs_for(model, gpu, gpu_memory_utilization, seq_tokens, tpot_slo_s, block_size=16):
    """The max_num_seqs to configure: min(memory ceiling of the pool, largest B meeting the TPOT SLO)."""
    ### BEGIN SOLUTION 8.4: return the batch to configure: what the pool holds and what the TPOT SLO allows, whichever binds (never below 0)
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    by_memory = num_gpu_blocks(model, gpu, gpu_memory_utilization, block_size) // math.ceil(seq_tokens / block_size)
    by_slo = math.floor((tpot_slo_s * gpu.hbm_bandwidth - model.num_params * model.dtype_bytes) / (seq_tokens * kv))
    return max(0, min(by_memory, by_slo))
    ### END SOLUTION


check("8.4", max_num_seqs_for)

# %% [markdown]
# ### Exercise 8.5 — `max_num_batched_tokens` → what one step may carry
#
# A step that carries a prefill pushes every one of its prompt tokens through the model alongside the
# decode tokens, and with enough of them the step stops being memory-bound: its length is set by the
# arithmetic its tokens need, done at $\text{mfu} \times$ peak. Everyone in that step waits for it —
# that is the spike. Write `max_num_batched_tokens_for(model, gpu, tpot_slo_s, mfu=0.5)`: the most
# tokens one step may carry and still end within the TPOT SLO, counting only the weights' arithmetic
# (neglect attention's), in whole tokens.

# %%
def max_num_batched_tokens_for(model, gpu, tpot_slo_s, mfu=0.5):
    """The most tokens one step may carry and still end within the TPOT SLO."""
    ### BEGIN SOLUTION 8.5: return the most tokens one step may process and still finish within the TPOT SLO
    return math.floor(tpot_slo_s * mfu * gpu.peak_flops / (2 * model.num_params))
    ### END SOLUTION


check("8.5", max_num_batched_tokens_for)

# %%
if revealed("8.5"):
    display(Markdown(r"""Each token costs the step about $2N$ FLOP for the weights, a decode token and a prompt
token alike, so a step of $T$ tokens takes $2NT / (\text{mfu} \cdot F_{peak})$ and the cap is
$\lfloor \text{SLO} \cdot \text{mfu} \cdot F_{peak} / 2N \rfloor$."""))

# %% [markdown]
# Now set the knobs on the real engine and watch the ledger. The card runs at
# `gpu_memory_utilization = 0.9`; the lecture's chat workload arrives at 50 requests/s for 20 s; the
# SLOs are 1 s TTFT and 20 ms TPOT. (Our engine does not split a prompt across steps: with a token
# budget, a prompt that does not fit waits for a step with room, and one longer than the whole budget
# runs alone. {{ "The 512-token prompts here always fit." if 0.020 * 0.5 * gpu.peak_flops // (2 * mha.num_params) >= 512 else "On this card a 512-token prompt is longer than the whole budget: each runs alone." }})

# %%
if unlocked("8.3", "8.4", "8.5"):
    pool = num_gpu_blocks(MHA, GPU, 0.9)
    b_knob = max_num_seqs_for(MHA, GPU, 0.9, 640, 0.020)
    t_knob = max_num_batched_tokens_for(MHA, GPU, 0.020)
    chat = chat_requests(50, num_requests=1000)
    settings = [("defaults (256 seqs, no token budget)", 256, None), (f"max_num_seqs={b_knob}", b_knob, None),
                (f"max_num_seqs={b_knob}, max_num_batched_tokens={t_knob}", b_knob, t_knob)]
    for label, seqs, tokens in settings:
        result = replay(chat, ReplayConfig(label, max_num_seqs=seqs, max_num_batched_tokens=tokens), num_blocks=pool,
                        record_token_times=True).result
        rep = result.slo(1.0, 0.020)
        longest = max(max(np.diff(q.token_times[0])) for q in result.requests.values())
        print(f"{label:>48}: throughput {rep.throughput_tok_s:6,.0f}, goodput {rep.goodput_tok_s:6,.0f} tok/s "
              f"({100 * rep.goodput_req_frac:5.1f}% good); TPOT p99 {1e3 * rep.tpot['p99']:5.2f} ms; longest gap "
              f"{1e3 * longest:6.1f} ms")

# %% [markdown]
# Capping the batch alone barely helps: the late tokens come from the steps that carry prefills. Capping
# the **tokens per step** is what shortens the longest gap. On the lecture's card it removes the spike —
# every gap stays under 20 ms, with room to spare (the attention FLOPs the closed form neglects grow with
# context and can eat into it) — and even *raises* throughput, because steps stop stalling 150 decoders
# behind a pile of prompts{{ "" if card.is_lecture else "; on this card, read the three lines above: a capped step may still run late, and a card that cannot prefill 50 requests/s misses the SLOs under any cap" }}.
# The same knob on lab 07's Azure replay (first 10 minutes at twice the real rate):

# %% tags=["needs-traces"]
if unlocked("8.5"):
    budget_tokens = max_num_batched_tokens_for(MHA, GPU, 0.020)
    azure_runs = [replay(azure, ReplayConfig("paged, b = 16"), speedup=2.0, window_s=600),
                  replay(azure, ReplayConfig(f"max_num_batched_tokens = {budget_tokens}",
                                                                   max_num_batched_tokens=budget_tokens),
                                       speedup=2.0, window_s=600)]
    print(viz_slo.goodput_slo_readout(azure_runs, 20, 1.0))

# %% [markdown]
# ### Exercise 8.6 — `block_size` → §10.3's tail waste, on your workload
#
# Write `tail_waste_fraction(lengths, block_size)`: over a set of sequences, the share of the slots their
# blocks hold that hold no token. The checkoff compares it with the real `BlockAllocator`.

# %%
def tail_waste_fraction(lengths, block_size):
    """Unfilled slots over all slots of the blocks that sequences of `lengths` tokens hold."""
    ### BEGIN SOLUTION 8.6: return the share of the slots the sequences' blocks hold that hold no token
    slots = sum(-(-n // block_size) * block_size for n in lengths)
    return (slots - sum(lengths)) / slots
    ### END SOLUTION


check("8.6", tail_waste_fraction)

# %% [markdown]
# ## 3. The five discussion seeds, with data
#
# ### Seed 1 — the knob you were given
#
# *vLLM exposes `block_size`. Using §10.3's table and your agent's actual sequence-length distribution,
# what would you set it to, and what measurement would change your mind?* The data: tail waste (your
# function) and block-table length on three real length distributions, and what one copy-on-write
# divergence of 8 branches copies (lab 05's measurement on the real allocator).

# %% tags=["needs-traces"]
traces = {"Azure conversation": azure.total_lengths(), "Azure code": azure_code.total_lengths(),
          "Mooncake conversation": mooncake.total_lengths()}
sizes = (8, 16, 32, 64, 128, 256)
yours = unlocked("8.6")  # the tail-waste rows are your function's
print(f"{'block size':>26} " + " ".join(f"{b:>8}" for b in sizes))
for name, lengths in traces.items():
    lengths = [int(n) for n in lengths]
    if yours:
        print(f"{name + ' tail waste':>26} " + " ".join(f"{100 * tail_waste_fraction(lengths, b):7.2f}%" for b in sizes))
    p50 = int(np.median(lengths))
    print(f"{'  table entries at p50':>26} " + " ".join(f"{ledger.block_table_entries(p50, b):>8,}" for b in sizes))
fork = {b: measure_fork_cost(b, n=8) for b in sizes}
print(f"{'CoW copy per divergence':>26} " + " ".join(f"{fork[b].copied_bytes(MHA.kv_bytes_per_token) / 2**20:6.0f}MiB"
                                                for b in sizes))

# %% [markdown]
# What would change your mind: the gather kernel's achieved bandwidth against its contiguous run
# (lab 04 — measured on a GPU), and how often your agent forks. On memory alone the answer is small
# blocks; neither of those two measurements is about memory.
#
# ### Seed 2 — admission without lengths
#
# *With a perfect predictor of output length, which of §10.5's three moves would you stop needing, and
# what would a wrong prediction cause?* With exact lengths an engine could reserve each request's final
# length at admission and never preempt — at the price of holding the not-yet-generated tokens idle.
# First the baseline: how often the watermark policy preempts on an overloaded replay.

# %% tags=["needs-traces"]
overload = replay(azure, ReplayConfig("paged, b = 16"), speedup=3.0, window_s=600)
print(f"watermark policy, 3x rate: preemptions {overload.counters['preemptions']}, "
      f"{overload.counters['finished']:,} requests served")

# %% [markdown]
# Now price a predictor on the whole Azure trace's real lengths (`length_prediction_cost`):
# each request reserves its prompt plus a predicted output, `margin` × the true output × a lognormal
# error of spread `sigma`. **Under**-predicted, it outgrows its reservation and must be preempted (its
# prompt and tokens so far recomputed); **over**-predicted, the unfilled reservation sits idle all its
# life. A safety margin trades the first for the second:

# %% tags=["needs-traces"]
print(f"{'sigma':>5} {'margin':>6} | {'preempted':>9} | {'recomputed / prompt tokens':>26} | idle share of reserved KV")
for sigma, margin in ((0.0, 1.0), (0.25, 1.0), (0.5, 1.0), (0.5, 2.0), (0.5, 3.0), (1.0, 1.0), (1.0, 3.0)):
    cost = length_prediction_cost(azure, sigma, margin)
    print(f"{sigma:5.2f} {margin:6.1f} | {100 * cost['preempted_share']:8.1f}% | "
          f"{100 * cost['recompute_share']:25.1f}% | {100 * cost['idle_share']:.1f}%")

# %% [markdown]
# A perfect predictor removes preemption and still idles about an eighth of what it reserves (the
# tokens not generated yet: the third waste of §10.2, which no allocator removes). Any error that is
# symmetric in the log preempts about half the requests; buying that down with a margin costs idle
# memory fast. Paging's on-demand growth is the other answer: nothing is reserved ahead, so nothing is
# idle, and the watermark keeps preemption rare.
#
# ### Seed 3 — where the analogy breaks
#
# *LLM paging has no TLB and no demand paging. Which absence costs more, and what would a KV "TLB" even
# be?* The data first: what a decode step reads from block tables against what it reads from the cache,
# and what a "page fault" — bringing one sequence's blocks in from host memory mid-step — would stall.

# %%
# tlb_bytes prices the card's model (COURSE.model): a step of as many 640-token sequences as its KV budget holds
resident = ledger.paged_concurrency(ledger.kv_budget_bytes(COURSE.model, GPU), 640, 16, COURSE.model.kv_bytes_per_token)
tlb = tlb_bytes(resident)
print(f"per decode step at B = {resident:,}: block tables {tlb['table_bytes']:,} B (int32, re-read per layer) against "
      f"{tlb['kv_bytes'] / GB:.2f} GB of KV: a ratio of {tlb['ratio']:.1e}, one part in {1 / tlb['ratio']:,.0f}")
print(f"one 640-token sequence swapped in over {GPU.link_bandwidth / GB:g} GB/s: {1e3 * tlb['swap_in_one_way_s']:.2f} "
      f"ms, against a {1e3 * tlb['step_s']:.2f} ms step — a fault stalls all {resident:,} sequences")

# %% [markdown]
# A KV "TLB" would be a small cache of block-table entries, keyed by (sequence, logical block), next to
# the attention kernel. Its hit rate on a real run (`labsupport.measure.replay.tlb_replay`): the first 10 minutes of the
# Azure trace at twice the recorded rate, where every decode step reads each resident block's
# translation once per layer.

# %% tags=["needs-traces"]
loaded = [type(r)(r.request_id, r.arrival_s / 2, r.prompt_tokens, r.output_tokens) for r in azure
          if r.arrival_s < 600]
pool_blocks = ledger.num_blocks(ledger.kv_budget_bytes(COURSE.model, GPU), 16, COURSE.model.kv_bytes_per_token)
sizes_tlb = (256, 1024, 2048, 4096, pool_blocks)  # the largest holds a translation for every block of the pool
tlb_run = tlb_replay(loaded, sizes_tlb, num_blocks=pool_blocks, max_steps=8_000)
print(f"{tlb_run.steps:,} steps, {tlb_run.lookups:,} table lookups; working set up to {tlb_run.peak_working_set:,} "
      f"translations; {tlb_run.new_translations:,} first-time translations")
for e in sizes_tlb:
    print(f"  an LRU TLB of {e:>5,} entries ({e * 12 / 1024:5.1f} KiB at 8 B of key + 4 B of block id): "
          f"{100 * tlb_run.hit_rate(e):6.2f}% of lookups served")

# %% [markdown]
# A TLB that holds the whole working set serves nearly every lookup: a table is read once per layer
# and changes by a block now and then, so only first-time translations miss. In a step whose working
# set is larger than the TLB, LRU serves nothing, because each layer sweeps the same entries in the
# same order and evicts each one just before it is needed: a smaller TLB is only as good as the share
# of steps whose working set happens to fit.
# Either way it saves reads that were one part in {{ "tens of thousands" if 640 * model.kv_bytes_per_token >= 20_000 * model.num_layers * ledger.block_table_bytes(640, 16) else "thousands" }} of the step's bytes (the ratio above); what it could save is latency
# (the dependent load before each K/V read, lab 04). Demand paging is the absence that costs more: a
# fault mid-step stalls the whole batch for a swap-in of milliseconds, which is why engines preempt
# between steps instead.
#
# ### Seed 4 — utilization as the claim
#
# *Construct a workload on which utilization goes from 15% to 99% and throughput barely moves.* Below:
# the lecture's chat workload at rising arrival rates, on reserve-to-max (one block of S_max = 4,096
# tokens per sequence: {{ ledger.naive_concurrency(ledger.kv_budget_bytes(model, gpu), 4096, model.kv_bytes_per_token) }} slots) and on paging (b = 16). Utilization is measured after every engine step
# as tokens held over the slots handed out, and averaged over the run: the **share of what is
# reserved**, over the sequences' lives. That is the right reading here, because at these loads the
# pool is not full. Lab 02's checkoffs 2.3 and 2.4 read the share of the whole budget (at the end of
# life, then over the life), a different denominator that agrees with this one only when every slot is
# taken; each convention is fair, and each reproduces one of the lecture's printed pairs.

# %%
# the sweep runs on the card's model (COURSE.model); its reserve-to-max engine has this many slots
slots = ledger.naive_concurrency(ledger.kv_budget_bytes(COURSE.model, GPU), 4096, COURSE.model.kv_bytes_per_token)
# arrival rates from a sixth of the slot count per second to twice it, rounded to whole 5/s where they are that large
unit = 5 if slots >= 15 else 0.5
rates = [unit * round(slots * f / unit) for f in (1 / 6, 1 / 3, 2 / 3, 5 / 6, 1, 4 / 3, 2)]
sweep = utilization_sweep(rates, num_requests=max(300, 10 * slots))
viz_slo.FigureView(viz_slo.utilization_figure(rates, sweep), "utilization and throughput against offered load")

# %%
for label, runs in sweep.items():
    print(label + ": " + ", ".join(f"{r.label} {100 * r.utilization:.1f}% / {r.throughput_tok_s:,.0f} tok/s"
                                    for r in runs))

# %% [markdown]
# ### Exercise 8.7 — your construction
#
# Write `utilization_workload()` returning a list of `(arrival_s, prompt_tokens, output_tokens)` (100 to
# 1,500 requests, each within S_max = 4,096 tokens) that is **decode-heavy** — every request's output at
# least as long as its prompt, the other way round from the sweep's chat requests — and on which the
# engine measures reserve-to-max utilization between 10% and 20% (the claim starts near 15%), paged
# utilization ≥ 95%, throughputs within 5% of each other — and a card that is actually busy: at its
# busiest the reserve-to-max engine runs at least {{ ledger.naive_concurrency(ledger.kv_budget_bytes(model, gpu), 4096, model.kv_bytes_per_token) * 2 // 3 + 1 }} of its {{ ledger.naive_concurrency(ledger.kv_budget_bytes(model, gpu), 4096, model.kv_bytes_per_token) }} slots at once. (A nearly idle card keeps
# its throughput under any allocator; the claim is interesting only where slots could have been the
# limit.) The sweep above measured where the chat workload's slots fill; your requests live on the card
# for a different number of steps, so read its measurement, do not copy its rate.
# `chat_requests(rate, num_requests, prompt=..., output=...)` builds Poisson arrivals of fixed
# lengths if you want it.

# %%
def utilization_workload():
    """A workload whose KV utilization jumps under paging while its throughput does not."""
    ### BEGIN SOLUTION 8.7: return a list of (arrival_s, prompt_tokens, output_tokens) tuples
    # the sweep: chat requests (128 output tokens) fill the naive engine's slots at the first rate whose run peaks
    # near them; 512 output tokens live about 4x the steps, so start a little above a quarter of that rate, and
    # raise it, measured on the engine, until the naive engine is busy (a compute-bound card needs more)
    naive = sweep["reserve-to-max (S_max 4,096)"]
    fills = next((r for r, run in zip(rates, naive) if run.peak_running >= 0.9 * run.slots), rates[-1])
    rate, n = fills * 128 / 512 * 1.25, min(1_500, max(300, 10 * naive[0].slots))
    while utilization_run(chat_requests(rate, n, prompt=256, output=512), 4096).peak_running <= naive[0].slots * 2 // 3:
        rate *= 1.25
    return chat_requests(rate, num_requests=n, prompt=256, output=512)
    ### END SOLUTION


check("8.7", utilization_workload)

# %% [markdown]
# On the sweep's chat workload the two utilizations measure **14.0% and 98.7%**, both averaged over the
# run: the timing plan's "14%", and a match for §10.3's printed 98.7%, which the lecture itself derives
# as 100% minus its 1.3% internal fragmentation (lab 03) — while the throughputs agree to the token until
# {{ "25 requests/s" if card.is_lecture else "the reserve-to-max engine's slots fill (the printout above)" }}.

# %%
if revealed("8.7"):
    display(Markdown(f"""Yours hold the same pattern at a different rate: concurrency is arrival rate × how long
a request lives on the card, and a decode-heavy request lives about as many steps as it emits tokens,
so four times the output fills the same {slots} slots at about a quarter of the rate. What the construction
tells you about when to deploy paging: utilization converts into throughput only when the naive engine
was **turning requests away for lack of slots** — when memory, not arrivals and not the SLO, is the
binding constraint. On an under-loaded card the win is invisible; the paper leads with utilization
because that is the quantity paging changes everywhere."""))
#
# ### Seed 5 — the fan-out you will actually run
#
# *Lecture 5 put the single-context-versus-fan-out crossover at k ≈ 6 on token cost alone. Redo it with
# §10.4's sharing factor.* Token cost alone charged each of the k branches for the whole context it
# re-sends: $k\,(C + o)$ prefill-and-cache tokens. With copy-on-write the context is prefilled and held
# once and each branch adds only its own output: $C + k\,o$ — their ratio is §10.4's sharing factor.
# The data: k branches off the agent's 7,700-token context, 80 output tokens each, {{ gqa.attention }}, blocks
# counted on the real allocator:

# %%
gqa = COURSE.gqa  # the card's model with grouped KV heads
C, o = 7_700, 80
for k in (1, 2, 4, 6, 8, 16):
    counted = measure_fanout(k, C, o, 16)
    unshared_b, shared_b = counted.bytes(gqa.kv_bytes_per_token)
    flops_unshared = k * ledger.prefill_flops(gqa, C)
    flops_shared = ledger.prefill_flops(gqa, C)
    print(f"k = {k:2d}: KV {unshared_b / GB:6.2f} GB unshared vs {shared_b / GB:5.2f} GB shared "
          f"({unshared_b / shared_b:4.2f}x); prefill {flops_unshared / 1e15:5.2f} vs {flops_shared / 1e15:4.2f} PFLOP; "
          f"sharing factor {ledger.sharing_factor(k, C, o):.2f}")
print(f"cost of one more branch: {C + o:,} tokens unshared, {o} shared ({(C + o) / o:.0f}x less)")
at6 = measure_fanout(6, C, o, 16).bytes(gqa.kv_bytes_per_token)
print(f"at k = 6: prefill {6 * ledger.prefill_flops(gqa, C) / ledger.prefill_flops(gqa, C):.1f}x cheaper shared, "
      f"KV held {at6[0] / at6[1]:.2f}x less")

# %% [markdown]
# Whatever the single-context plan costs, the fan-out side of the comparison changed: at Lecture 5's
# k = 6 it is cheaper by the factors on the last line: k times in prefill (every unshared branch
# prefilled the whole context again), a little less in KV held (each branch still keeps its own
# output), and each extra branch costs its 80 output tokens instead of 7,780. A crossover priced at k ≈ 6 with every branch paying for its context moves out by
# about that factor — cheap fan-out makes wide fan-out the default for a server that shares blocks.
# For Assignment 3 it changes nothing yet: A3 runs outside the API, where you pay per token sent and
# the provider, not you, decides whether the branches share a prefix (Lecture 10's levers become
# yours in Assignment 4).
#
# ## Self-check
#
# 1. Name the quantity each of these attacks: disaggregation; the prefix cache; speculative decoding;
#    quantization.
# 2. `gpu_memory_utilization` goes from 0.9 to 0.95 on {{ "the lecture's card" if card.is_lecture else "this card (`" + gpu.name + "`)" }}. How many more 640-token
#    sequences fit, and will `max_num_seqs` change for a 20 ms SLO?
# 3. Why does capping `max_num_batched_tokens` raise goodput on a workload where capping `max_num_seqs`
#    does not?
# 4. Your workload's utilization jumps from 15% to 99% under paging and throughput does not move. Was
#    paging useless?
#
# The answers show once the checkoffs they lean on (8.1's map, 8.3's pool, 8.4's batch) pass:

# %%
if revealed("8.1", "8.3", "8.4"):
    per_seq = math.ceil(640 / 16)  # blocks one 640-token sequence holds
    pools = {u: num_gpu_blocks(MHA, GPU, u) for u in (0.9, 0.95)}
    seqs = {u: blocks // per_seq for u, blocks in pools.items()}
    knob = {u: max_num_seqs_for(MHA, GPU, u, 640, 0.020) for u in (0.9, 0.95)}
    moves = ("does not change" if knob[0.9] == knob[0.95] else f"moves from {knob[0.9]} to {knob[0.95]}")
    binds = "the SLO binds first" if knob[0.95] < seqs[0.95] else "the pool binds, not the SLO"
    display(Markdown(f"""1. The prefill-in-decode TPOT spike; re-sent identical prefixes (92%); tokens per pass over the
   weights (one); bytes per weight and per cached value.
2. 0.05 × {GPU.hbm_bytes / GB:.0f} GB = {0.05 * GPU.hbm_bytes / GB:g} GB more: {pools[0.95] - pools[0.9]:,} more blocks
   ({pools[0.9]:,} → {pools[0.95]:,}), {seqs[0.95] - seqs[0.9]} more sequences ({seqs[0.9]} → {seqs[0.95]} at b = 16) —
   and `max_num_seqs` {moves} ({knob[0.95]} at a 20 ms SLO), because {binds}.
3. The late tokens came from steps that carried prefills, not from large batches; a token budget bounds
   each step's compute, the batch cap does not.
4. No: the card was not memory-bound at that load. The same change raises throughput as soon as
   arrivals need more than {slots} slots — and it made long context affordable."""))

# %% [markdown]
# This is the last lab of Lecture 10. Instructors: `99_board` runs the lecture's 75 minutes on a projector.
