# %% [markdown]
# # Lab 07 — Sizing, SLOs, and where the time actually goes (§10.6, Exercise 5)
#
# Paging changed **capacity**. An operator is not asked for capacity; they are asked for a *service
# level*: the first token within so many milliseconds, and every token after it at a steady cadence.
# This lab turns the capacity of labs 02–06 into that ledger — the one Assignment 4 will ask you for —
# with the real engine loop of lab 06 running the {{ "lecture's H100" if card.is_lecture else f"course's {gpu.name}" }} on its **cost-model clock** (each
# step priced by the roofline, so the same scheduler replays a real trace at {{ "H100" if card.is_lecture else gpu.name }} scale on a laptop).
#
# **Learning objective served** (the lecture's numbering)
#
# * **Objective 7** — decompose a TTFT budget into queueing, prefill, and scheduling delay (you read the
#   three terms off the engine's own step log, 7.7), and explain why goodput and throughput can move in
#   opposite directions (you count goodput from the engine's request records, 7.3).
#
# Timing in the lecture: minutes 58–68. Here: about 55 minutes. Sections follow §10.6: TTFT (1),
# TPOT (2), goodput and the three-column table (3), a real trace (4), then Exercise 5 (5).

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
import math

from IPython.display import HTML, Markdown, display

from labsupport import card, ledger, workloads
from labsupport.block_allocator import BlockAllocator
from labsupport.contiguous import ReserveToMaxAllocator
from labsupport.costmodel import CostModel
from labsupport.course.checkoff import check, passed, revealed, unlocked
from labsupport.engine import Engine
from labsupport.memory_stats import OutOfBlocks
from labsupport.measure.replay import ReplayConfig, chat_with_probe, replay, steady_batch_tpot
from labsupport.slo import memory_ceiling, three_columns
from labsupport.specs import GB, LECTURE_7B, LECTURE_7B_GQA8, LECTURE_GPU  # LECTURE_*: the lecture's errata only
from labsupport.units import fmt_bytes, fmt_gb
from labsupport.viz import slo as viz_slo

COURSE = card.card()  # the course card (course.toml): its GPU, and its model in MHA and GQA form
GPU, MHA = COURSE.gpu, COURSE.mha
GPU_NAME = "H100" if COURSE.is_lecture else GPU.name  # how the lines below name the card (the lecture's "H100")
KV = MHA.kv_bytes_per_token  # the card's KV bytes per token (524,288 B = 512 KiB on the lecture's card)
SEQ = 512 + 128  # the lecture's chat sequence: 512-token prompt, 128 output tokens
BUDGET = ledger.kv_budget_bytes(MHA, GPU)
POOL = ledger.num_blocks(BUDGET, 16, KV)
print(f"{MHA.name} on {GPU.name}: weights {fmt_gb(MHA.weight_bytes, 2)}, KV budget {fmt_gb(BUDGET, 2)}, "
      f"{POOL:,} blocks of 16 tokens")

# %% [markdown]
# ## 1. TTFT decomposes into three terms, and only one of them is the model
#
# From the moment a request arrives to its first token:
#
# $$\text{TTFT} \;=\; \underbrace{t_{\text{queue}}}_{\text{waiting for blocks and a slot}}
#   \;+\; \underbrace{t_{\text{prefill}}}_{\text{the forward pass over the prompt}}
#   \;+\; \underbrace{t_{\text{sched}}}_{\text{waiting for the next iteration boundary}}$$
#
# * **Prefill** is the only term Lecture 2 priced: $2NS + 4LHd\,S^2$ FLOPs at 50% of peak, **{{ 1e3 * N.recompute_s:.0f }} ms**
#   for a 4,096-token prompt{{ "" if card.is_lecture else f" on the {gpu.name} (the lecture prints 129 ms for its H100)" }}.
# * **Scheduling delay** is the wait until the running step ends, because the batch is re-chosen only
#   at step boundaries: at most one step — one decode step of the whole batch (section 2 prices it), more
#   if that step is carrying someone else's prefill.
# * **Queueing** is the admission policy's output: how long the request waits for blocks (behind the
#   watermark of lab 06) and for a slot. On a loaded engine it is usually the largest term.
#
# The engine records all three for every request (`RequestResult.scheduling_delay_s`, `.queueing_s`,
# `.prefill_s`). First the two terms we can predict in closed form, read off real engine runs:

# %%
prefill_4k = ledger.recompute_s(MHA, 4096, GPU.peak_flops)
idle = Engine(cost_model=CostModel(MHA, GPU), num_blocks=POOL, block_size=16)
you = idle.add_request(prompt_len=4096, max_new_tokens=128, arrival_time=0.0)
r = idle.run().requests[you]
print(f"idle card, one 4,096-token prompt: queueing {1e3 * r.queueing_s:.1f} ms + prefill {1e3 * r.prefill_s:.2f} ms "
      f"+ scheduling delay {1e3 * r.scheduling_delay_s:.1f} ms = TTFT {1e3 * r.ttft_s:.2f} ms")
print(f"ledger: prefill of 4,096 tokens = {ledger.prefill_flops(MHA, 4096) / 1e12:.1f} TFLOP "
      f"/ (0.5 × {GPU.peak_flops / 1e12:.0f} TFLOP/s) = {1e3 * prefill_4k:.2f} ms")

# %% [markdown]
# On an idle card the TTFT *is* the prefill. Now load the card. The panel below runs the engine on
# the lecture's chat workload (512-token prompts, 128-token outputs, Poisson arrivals for 10 s)
# and drops **your** request — a 4,096-token prompt — into it at t = 8 s. The bars are real requests'
# splits: yours, the median chat request's, and the p99 one's. The panel opens at 62 requests/s, near
# what the {{ "card" if card.is_lecture else "lecture's card" }} can decode (section 3 counts its throughput); move the load across it.
#
# *Board (minutes 58–68): TTFT as three stacked bars, queueing biggest.*

# %%
viz_slo.ttft_panel(rate_per_s=62, probe_prompt=4096)

# %% [markdown]
# What to see: at low load your TTFT is your prefill ({{ 1e3 * N.recompute_s:.0f }} ms) plus a few ms of scheduling delay.
# Past about 55 requests/s{{ "" if card.is_lecture else " on the lecture's card (the readout shows yours)" }} the pool is full (peak blocks ≈ 7,450 of 7,452) and **queueing** takes
# over — seconds, against a prefill of a tenth of a second. Notice also that the scheduling delay can
# exceed one decode step: the step you arrive during may be carrying another request's prefill.
# *An engine that reports "{{ 1e3 * N.recompute_s:.0f }} ms TTFT" is reporting the term it controls least.*
#
# The same three terms on the real clock: the tiny character model of lab 06 actually runs on this
# CPU, and the engine times each step with the wall clock. Six requests arrive together; the numbers
# depend on your machine, so yours will differ.

# %% tags=["nbval-ignore-output"]
import torch

from labsupport.model import load_tiny_model

torch.set_num_threads(1)  # as in lab 06: the tiny model's matrices gain nothing from threads that wait on each other
tiny, tok, trained = load_tiny_model()
warm = Engine(tiny, num_blocks=64, block_size=16)  # one throwaway request: a process's first forward pass pays
warm.add_request(tok.encode("warm up ", errors="replace"), max_new_tokens=2)  # one-off start-up costs
warm.run()
real = Engine(tiny, num_blocks=64, block_size=16)
for i, text in enumerate(["The allocator was the easy ", "Goodput counts only ", "Your neighbours set "] * 2):
    real.add_request(tok.encode(text, errors="replace"), max_new_tokens=4, arrival_time=0.0 if i < 3 else 0.001)
real_steps = []  # the engine's log: one StepOutput per iteration
while (out := real.step()) is not None:
    real_steps.append(out)
for k, st in enumerate(real_steps):
    print(f"step {k}: {1e3 * st.start:7.1f} -> {1e3 * st.end:7.1f} ms, prefills of {st.admitted or 'nobody'}, "
          f"{st.num_tokens} tokens")
real_run = real.result()
for rid, rr in real_run.requests.items():
    print(f"request {rid}: queueing {1e3 * rr.queueing_s:7.1f} ms + prefill {1e3 * rr.prefill_s:7.1f} ms + "
          f"scheduling delay {1e3 * rr.scheduling_delay_s:7.1f} ms; TPOT {1e3 * rr.tpot_s:6.1f} ms")

# %% [markdown]
# Requests 3–5 arrived 1 ms after the first step began, so they waited for its end: that wait is their
# scheduling delay, a whole step of the real model. Read the step log for the other difference: step 1
# carries the prefills of 3–5 *and* the first decode of 0–2, and that one step is both 3–5's prefill and
# the first of 0–2's three token gaps. So 0–2's TPOT includes a step with prefills in it, while 3–5's
# gaps are all plain decode steps: a prefill landing in decode steps (Lecture 2 §2.16), on your CPU.
# (These are wall-clock times of a tiny model on a shared machine: they vary from run to run, and a
# step of a few milliseconds can be stretched by whatever else the machine is doing. The cell runs
# one thread and a throwaway request first; without them the first step also paid the process's
# start-up costs, and threads waiting on each other made every step slower and noisier.)
#
# ### Exercise 7.7 — TTFT, read off the engine's log
#
# The engine above reported each request's three terms. Get them yourself from what the loop did:
# write `ttft_split(steps, request_id, arrival_time)`, where `steps` is the engine's list of
# `StepOutput`s in order (each has `start`, `end` in seconds and `admitted`, the ids of the requests
# whose prefill ran in that step), and return a dict `{"scheduling_delay_s": ..., "queueing_s": ...,
# "prefill_s": ...}` for a request that finished. Use the definitions at the top of this section; an
# engine that is idle when a request arrives starts its next step at the arrival. The checkoff reads
# the logs of engine runs under load on the {{ "lecture's H100" if card.is_lecture else f"course's {gpu.name}" }}.

# %%
def ttft_split(steps, request_id, arrival_time):
    """The three terms of one request's TTFT, read off the engine's step log."""
    ### BEGIN SOLUTION 7.7: return {"scheduling_delay_s": ..., "queueing_s": ..., "prefill_s": ...} from the step log
    boundary = next(st.start for st in steps if st.start >= arrival_time)  # the first boundary after it arrived
    admit = next(st for st in steps if request_id in st.admitted)  # the step that ran its prefill
    return {"scheduling_delay_s": boundary - arrival_time, "queueing_s": admit.start - boundary,
            "prefill_s": admit.end - admit.start}
    ### END SOLUTION


check("7.7", ttft_split)

# %% [markdown]
# Your function on the tiny model's log above, beside the engine's own record of each request:

# %% tags=["nbval-ignore-output"]
if unlocked("7.7"):
    for rid, rr in real_run.requests.items():
        mine = ttft_split(real_steps, rid, rr.arrival_time)
        print(f"request {rid}: yours {1e3 * mine['scheduling_delay_s']:6.1f} + {1e3 * mine['queueing_s']:6.1f} + "
              f"{1e3 * mine['prefill_s']:6.1f} ms; engine {1e3 * rr.scheduling_delay_s:6.1f} + "
              f"{1e3 * rr.queueing_s:6.1f} + {1e3 * rr.prefill_s:6.1f} ms")

# %% [markdown]
# ## 2. TPOT is a property of the batch, not of the request
#
# After its first token, your request gets one token per decode step, and the engine runs each step for
# the whole batch at once: your time per output token is the length of a step you share with everyone
# else in the batch. How long is that step?
#
# ### Exercise 7.1 — TPOT at B
#
# Write `tpot(model, gpu, batch, seq_tokens)`: the seconds one decode step takes when `batch` sequences,
# each holding `seq_tokens` tokens, produce their next token together on `gpu`. You have the model's and
# the card's specs: `model.num_params`, `model.dtype_bytes`, `model.num_layers`, `model.num_heads`,
# `model.num_kv_heads`, `model.head_dim`, `gpu.hbm_bandwidth` (bytes/s) and `gpu.peak_flops` (FLOP/s).
# Lab 01 placed a decode step against this card's ridge point; start from what it found, and decide which
# of the specs the answer needs. The checkoff tries other models and cards. Once it passes, your function
# prices every step in the rest of this section: the engine's clock is compared with it, the TPOT chart
# draws it, 7.2 searches it for the largest batch under the SLO, and it prices the columns of section 3.

# %%
def tpot(model, gpu, batch, seq_tokens):
    """Seconds per output token when `batch` sequences of `seq_tokens` tokens each decode one step together."""
    ### BEGIN SOLUTION 7.1: return the seconds one decode step of `batch` sequences of `seq_tokens` tokens takes on `gpu`
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    return (model.num_params * model.dtype_bytes + batch * seq_tokens * kv_per_token) / gpu.hbm_bandwidth
    ### END SOLUTION


check("7.1", tpot)

# %% [markdown]
# Does the engine agree with you? Below, B sequences that each hold 640 tokens decode one step together
# on the cost-model clock (`steady_batch_tpot`: a 639-token prompt, then one pure decode step), and each
# request's TPOT is read off its timeline — shown beside your function once 7.1 passes.

# %%
NAIVE_B = ledger.naive_concurrency(BUDGET, 4096, KV)  # reserve-to-max slots of S_max = 4,096 (section 3's naive B)
CEILING = memory_ceiling(MHA, GPU, SEQ)  # the paged pool's sequences of 640 tokens
batches = sorted({b for b in (1, NAIVE_B, min(100, CEILING), CEILING) if b >= 1})  # 1, 29, 100, 186 on the lecture's
measured = steady_batch_tpot(batches, seq_tokens=SEQ, model=MHA, gpu=GPU)
if unlocked("7.1"):
    display(Markdown("The step streams every weight once, shared by the whole batch, plus the KV of **every** "
                     "sequence in it — the rest of your step is your **neighbours'** KV."))
    for b, t in measured.items():
        print(f"B = {b:3d}: engine {1e3 * t:6.3f} ms, your tpot() {1e3 * tpot(MHA, GPU, b, SEQ):6.3f} ms")
    lecture_gb = 640 * 512_000 / 1e9  # the lecture's "0.328 GB" per sequence: 512 KiB read as 512,000 B
    # the erratum is the lecture's: its 23.5 ms was printed for its own 7B on its H100, so exact is on those
    print(f"The lecture prints 23.5 ms at B = 199; exact, {1e3 * tpot(LECTURE_7B, LECTURE_GPU, 199, SEQ):.2f} ms: its "
          f"{lecture_gb:.3f} GB per 640-token sequence reads 512 KiB as 512,000 B.")

# %% [markdown]
# ### Exercise 7.2 — the largest B that meets the SLO
#
# The operating point to deploy is the largest B that fits in the paged pool (the KV budget is
# $\text{HBM} - W - 4$ GB, as in §10.2, cut into whole blocks) **and** whose TPOT clears the SLO. Write
# `max_batch(model, gpu, seq_tokens, tpot_slo_s, block_size)`; return 0 when nothing meets the SLO or
# nothing fits. You have a TPOT: your own `tpot` from 7.1, which a function here may call (the checkoff
# runs yours).

# %%
def max_batch(model, gpu, seq_tokens, tpot_slo_s, block_size=16):
    """Largest B of `seq_tokens`-token sequences that fits the paged pool and meets the TPOT SLO."""
    ### BEGIN SOLUTION 7.2: return the largest whole batch that both fits the paged pool and meets the TPOT SLO (0 if none)
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    budget = gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4 * GB
    fits = max(0, math.floor(budget / (block_size * kv))) // math.ceil(seq_tokens / block_size)
    lo, hi = 0, fits + 1  # B = lo meets the SLO (none trivially does); B = hi does not fit
    while hi - lo > 1:  # your tpot grows with B: bisect for the last batch it clears
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if tpot(model, gpu, mid, seq_tokens) <= tpot_slo_s else (lo, mid)
    return lo
    ### END SOLUTION


check("7.2", max_batch)

# %% [markdown]
# Slide B. The stack shows whose bytes the step is moving: the weights (paid once, shared by
# everyone), your KV (a sliver), and your neighbours'. The dotted line is your `tpot`, and the SLO's
# batch is searched on it; the white circles are the engine's measurements from above. *Your neighbours
# set your cadence.*

# %%
if unlocked("7.1", "7.2"):  # the panel draws your TPOT(B) and the largest B under the SLO: it opens once both pass
    # named, not left to the panel's default: `measured` ran on the card's MHA form (the panel's default model is
    # the card's model), and the panel draws the engine's markers only on the configuration named here
    display(viz_slo.tpot_panel(batch=CEILING, seq_tokens=SEQ, tpot_slo_ms=20, measured=measured, tpot_fn=tpot,
                               model=MHA.name, gpu=GPU.name))

# %% [markdown]
# ## 3. Goodput is the metric; throughput is not
#
# **Goodput** counts only the requests that met their SLO. Put three configurations of the same card
# side by side — the lecture's three-column table:
#
# | column | B | why |
# |---|---|---|
# | naive | reserve-to-max, S_max = 4,096 | {{ N.naive_concurrency }} slots of {{ N.naive_slot_bytes / GB:.3f }} GB |
# | paged at the memory ceiling | {{ N.num_blocks:, }} blocks ÷ 40 per sequence | {{ N.paged_concurrency }} {{ "(the lecture prints 199)" if card.is_lecture else "(the lecture's card: 186, printed 199)" }} |
# | paged at the SLO-limited B | the largest B with TPOT ≤ 20 ms | your 7.2 |
#
# Throughput of a steady batch is $B / \text{TPOT}(B)$; its goodput is the same number if
# TPOT ≤ SLO and **zero** if not — every request in the step gets the same TPOT, so a steady batch
# meets the SLO together or misses it together. Each column's TPOT is your `tpot` once 7.1 passes (the
# library's stand-in until then), and the SLO-limited B is searched on it.

# %%
if unlocked("7.1"):  # your TPOT prices every column, and the SLO-limited B is searched on it
    columns = three_columns(MHA, GPU, SEQ, s_max=4096, block_size=16, tpot_slo_s=0.020, tpot_fn=tpot)
else:  # the library's stand-in until 7.1 passes
    columns = three_columns(MHA, GPU, SEQ, s_max=4096, block_size=16, tpot_slo_s=0.020)
if revealed("7.1", "7.2"):  # the table's TPOTs are 7.1's answers and its third column is 7.2's
    display(HTML(viz_slo.goodput_table_html(columns)))

# %% [markdown]
# *Board: the three-column table, then strike out the middle column's throughput and write
# "goodput 0".* The middle column moves the most tokens and serves nobody within the SLO; the naive
# column, at {{ 100 * N.naive_concurrency / ledger.tpot_s(mha, N.naive_concurrency, 640, gpu.hbm_bandwidth) / N.throughput_tok_s:.0f }}% of its throughput, serves everyone. **"Which column would you deploy?"** —
# the only correct first answer is a question: *what is the SLO?* Move it:

# %%
if unlocked("7.1", "7.2"):  # every column priced by your tpot
    display(viz_slo.goodput_table_panel(tpot_slo_ms=20, tpot_fn=tpot, model=MHA.name))  # the table's model above

# %% [markdown]
# At {{ int(-(-1e3 * N.tpot_s // 5) * 5) }} ms the middle column is the best; at 20 ms it is worthless; below the naive column's own TPOT
# (the table gives it) even the naive column fails. Neither configuration is wrong — *"what is this
# engine's throughput?"* is the wrong
# question, because throughput without a latency constraint can always be raised by making the
# service worse.
#
# Where does the SLO bind, against the memory ceiling — for the MHA model, and for {{ gqa.attention }}, whose
# sequences are {{ mha.kv_bytes_per_token // gqa.kv_bytes_per_token }}× smaller? Once 7.1 and 7.2 pass, on your functions:

# %%
if unlocked("7.1", "7.2"):
    for model in (MHA, COURSE.gqa):
        ceiling = memory_ceiling(model, GPU, SEQ)
        print(f"{model.name:>16}: memory ceiling {ceiling:4d}, largest B under 20 ms {max_batch(model, GPU, SEQ, 0.020):4d}")
    display(Markdown("*After paging, the SLO usually binds before the memory does* — the clearest sign that the "
                     "allocator problem is solved, and why the next eight weeks are about scheduling, kernels and bytes."))
    # the lecture's erratum, on the lecture's own card: its sum on its printed figures, and exact on its 7B and H100
    printed = (0.020 * LECTURE_GPU.hbm_bandwidth - 13.5e9) / 0.328e9
    print(f"The lecture prints 164; exact, {max_batch(LECTURE_7B, LECTURE_GPU, SEQ, 0.020)}: its 0.328 GB per sequence reads 512 KiB "
          f"as 512,000 B, and (20 ms × 3,350 GB/s − 13.5 GB) ÷ 0.328 GB = {printed:.1f} is then rounded up.")
    naive, ceiling_col = columns[0], columns[1]
    print(f"The lecture gives the naive column a third of the middle column's throughput; here it has "
          f"{naive.throughput_tok_s / ceiling_col.throughput_tok_s:.2f} of it: its {naive.batch} sequences share a "
          f"{1e3 * naive.tpot_s:.2f} ms step, mostly the weights, against {1e3 * ceiling_col.tpot_s:.2f} ms for "
          f"{ceiling_col.batch}.")

# %% [markdown]
# ## 4. Your workload: the Azure conversation trace, replayed at {{ "H100" if card.is_lecture else gpu.name }} scale
#
# A steady batch of identical sequences meets the SLO all together or not at all. Real traffic does
# not: lengths vary, arrivals are bursty, and prefills land in the middle of everyone's decode. Below,
# the real engine replays the **Azure LLM Inference Trace 2023** (conversation; Patel et al., ISCA 2024,
# CC BY 4.0) through its cost-model clock with {{ "the lecture's 7B on an H100" if card.is_lecture else f"the card's {mha.name} on the {gpu.name}" }}, in three configurations:
#
# * **reserve-to-max** — the engine with one block of S_max = 4,096 tokens per sequence, which is
#   exactly a reserve-to-max allocator: {{ N.naive_concurrency }} slots. A reserve-to-max engine has a context window, so it
#   does what a real one must with the requests longer than 4,096 tokens (counted below): it stops
#   their generation at the window, and refuses the few whose prompt alone fills it. A sequence then
#   never outgrows its slot, and nobody is ever preempted;
# * **paged, b = 16** — {{ N.num_blocks:, }} blocks, the engine's default `max_num_seqs` of 256;
# * **paged, SLO-limited B** — the same, with `max_num_seqs` set to the largest B whose TPOT meets
#   20 ms at this trace's mean sequence length (§10.6's operating point).
#
# **Sample, stated:** replaying the whole trace (19,366 requests over 58 minutes) three times does not
# fit this notebook's one-minute CPU budget. We compare the three configurations on its **first 10
# minutes** (2,867 real requests, in their real order and with their real lengths) with arrival times
# **divided by 2** — the same requests at twice the real rate, which is where {{ "this card" if card.is_lecture else "the lecture's card" }} starts to be
# loaded — and then replay the **whole trace once**, paged, at the same rate. (The command line does the
# same: `python -m labsupport simulate --trace azure-conv --rate-scale 2 --ttft-slo-ms 1000
# --tpot-slo-ms 20`.)

# %% tags=["needs-traces"]
azure = workloads.load_azure("conv")
print(f"{azure.name} ({'SYNTHETIC stand-in' if azure.synthetic else 'real trace'}): {len(azure):,} requests over "
      f"{azure.summary()['duration_s'] / 60:.0f} minutes")
window = [q for q in azure if q.arrival_s < 600]
mean_len = sum(q.prompt_tokens + q.output_tokens for q in window) / len(window)
b_slo = ledger.max_batch_for_tpot(MHA, round(mean_len), 0.020, GPU.hbm_bandwidth)
long = sum(q.prompt_tokens + q.output_tokens > 4096 for q in window)
print(f"first 600 s: {len(window):,} requests, mean sequence {mean_len:,.0f} tokens -> SLO-limited B = {b_slo}")
print(f"{long} of them ({100 * long / len(window):.1f}%) are longer than S_max = 4,096 tokens")

# %% tags=["needs-traces"]
configs = [ReplayConfig(f"reserve-to-max ({NAIVE_B} slots)", s_max=4096),
           ReplayConfig("paged, b = 16"),
           ReplayConfig(f"paged, max_num_seqs = {b_slo}", max_num_seqs=b_slo)]
CLOCK = CostModel(MHA, GPU)  # every replay on the card's MHA form, the model of sections 1-3
replays = [replay(azure, c, cost_model=CLOCK, speedup=2.0, window_s=600) for c in configs]
for rp in replays:
    c = rp.counters
    print(f"{rp.label}: {c['finished']:,}/{c['requests']:,} finished, {c['steps']:,} steps, peak batch "
          f"{c['peak_running']}, preemptions {c['preemptions']}, leaked blocks {c['leaked_blocks']}")
print(f"reserve-to-max: {replays[0].note.split('; ')[-1]}")

# %% [markdown]
# And the whole trace, once, paged (a few seconds):

# %% tags=["needs-traces"]
whole = replay(azure, ReplayConfig("paged, b = 16, whole trace"), cost_model=CLOCK, speedup=2.0)
c = whole.counters
print(f"{whole.note}: {c['finished']:,}/{c['requests']:,} finished, {c['steps']:,} steps, peak batch "
      f"{c['peak_running']}, peak blocks {c['peak_blocks']:,} of {c['num_blocks']:,}, leaked blocks {c['leaked_blocks']}")
print(f"mean TTFT: queueing {c['queueing_mean_s']:.3f} s + prefill {c['prefill_mean_s']:.3f} s + "
      f"scheduling delay {c['scheduling_mean_s']:.3f} s")
replays.append(whole)

# %% [markdown]
# Where the TTFT went, on average, in each configuration (bars drawn as shares, totals written at the
# end — the reserve-to-max column's total is in seconds, not milliseconds):

# %% tags=["needs-traces"]
viz_slo.FigureView(viz_slo.ttft_bars_figure([rp.mean_split() for rp in replays], normalize=True,
                                            title="Mean TTFT split, Azure conversation (10 min, 2× rate)"),
                   "mean TTFT split per configuration")

# %% [markdown]
# Now the SLO slider. Nothing is re-run when you move it: goodput is re-counted from the requests'
# recorded TTFT and TPOT. Dotted lines are each configuration's throughput; the gap between a dotted
# line and its curve is throughput that bought nobody their SLO.

# %% tags=["needs-traces"]
viz_slo.goodput_slo_panel(replays, tpot_slo_ms=20, ttft_slo_s=1.0)

# %% [markdown]
# Three things to read off it{{ "" if card.is_lecture else " (as they read on the lecture's card; check each against your card's readout)" }}:
#
# 1. **Reserve-to-max collapses on TTFT, not on TPOT.** With 29 slots the requests queue for tens of
#    seconds; its TPOT is excellent, and nobody cares.
# 2. **Paged meets a loose TPOT SLO for nearly everyone and misses a 20 ms one for a large share** (read
#    the readout). The misses are not caused by too large a batch: the peak batch is under 100. They
#    are caused by **prefills landing in the decode steps** — §2.16's interference spike, on real
#    traffic. Over the whole hour the bursts are worse: queueing appears, and goodput at a 1 s TTFT SLO
#    drops further.
# 3. **Capping B at the SLO-limited value does not help here**, because B was not the problem. The fix
#    for this one is to bound the tokens a step may carry — `max_num_batched_tokens`, lab 08 — and,
#    properly, to stop prefills and decodes from sharing a step at all (which Part II lecture does that
#    is lab 08's question).
#
# How much of point 2 rests on the clock? The engine's cost model lets a step's arithmetic and its
# memory traffic overlap perfectly (the step takes the longer of the two), the kindest assumption for
# a step that mixes a prefill into decodes. Lecture 2 §2.16 adds them instead, which is where its
# 6.7× spike comes from. Replay the paged column on the additive clock:

# %% tags=["needs-traces"]
additive = replay(azure, ReplayConfig("paged, b = 16, additive clock", overlap=False),
                  cost_model=CostModel(MHA, GPU, overlap=False), speedup=2.0, window_s=600)
for rp in (replays[1], additive):
    print(f"{rp.label:>32}: goodput at TTFT <= 1 s, TPOT <= 20 ms: {100 * rp.goodput_frac(1.0, 0.020):5.1f}% of "
          f"requests; at TPOT <= 40 ms: {100 * rp.goodput_frac(1.0, 0.040):5.1f}%")

# %% [markdown]
# The two clocks bracket a real GPU, which overlaps some of a mixed step's arithmetic with its memory
# traffic but not all of it. Under the additive clock nearly every step that carries a prefill is
# late for everyone in it, and most requests miss a 20 ms SLO: how much goodput mixing costs depends
# on that overlap, which is why the question of *whether* to mix (chunked prefill, lab 08) or to
# separate the two kinds of work is worth a lecture of its own.
#
# ### Exercise 7.3 — goodput of a run
#
# Write `goodput(requests, ttft_slo_s, tpot_slo_s)`: given an engine run's `RequestResult`s, return
# its goodput in output tokens per second. The run's time span is the one its throughput is measured
# on: from the **first arrival** of any request in the run (finished or not) to the **last finish** of
# any finished request. Decide from the definition above which requests count. A `RequestResult` has `status`,
# `arrival_time`, `first_token_time`, `finish_time`, `tpot_s` (`None` after a single output token)
# and `num_output_tokens` (one count per sampled branch).

# %%
def goodput(requests, ttft_slo_s, tpot_slo_s):
    """Output tokens per second of the requests that met both SLOs."""
    ### BEGIN SOLUTION 7.3: return the run's goodput in output tokens per second
    good = 0
    for q in requests:
        if q.status != "finished":
            continue
        if q.first_token_time - q.arrival_time <= ttft_slo_s and (q.tpot_s is None or q.tpot_s <= tpot_slo_s):
            good += sum(q.num_output_tokens)
    start = min(q.arrival_time for q in requests)
    end = max(q.finish_time for q in requests if q.status == "finished")
    return good / (end - start)
    ### END SOLUTION


check("7.3", goodput)

# %% [markdown]
# Your function against the engine's own SLO ledger (`EngineResult.slo`), on the lecture's chat
# workload at rising load, with a 0.5 s TTFT SLO and a 20 ms TPOT SLO:

# %%
for rate in (30, 40, 50, 62):
    run = chat_with_probe(rate, model=MHA, gpu=GPU).result
    report = run.slo(0.5, 0.020)
    yours = f"; your function {goodput(list(run.requests.values()), 0.5, 0.020):7,.0f}" if passed("7.3") else ""
    print(f"{rate:3d} req/s: throughput {report.throughput_tok_s:7,.0f} tok/s, goodput {report.goodput_tok_s:7,.0f} "
          f"tok/s (engine ledger{yours}), TPOT p50 {1e3 * report.tpot['p50']:5.2f} ms")

# %% [markdown]
# **Goodput and throughput move in opposite directions**: from 50 to 62 requests/s {{ "the card" if card.is_lecture else "the lecture's card" }} moves
# more tokens, and every one of them is late. Past the SLO-limited batch, extra load buys throughput
# by spending everybody's latency.

# %% [markdown]
# ### Why a mean is a lie
#
# A latency SLO is a promise to **each** request, and a dashboard that reports the mean TTFT averages
# the promise away: hundreds of requests that got their first token in 30 ms hide the few that waited a
# second. Between 50 and 62 requests/s{{ " above, the card" if card.is_lecture else ", the lecture's card" }} passes from "everyone is fast" to "half are late";
# somewhere on the way the mean still looks fine while a tenth of the users do not.
#
# ### Exercise 7.4 — the mean, the p99, and who missed
#
# Write `ttft_tail(requests, ttft_slo_s)`: over a run's `RequestResult`s, return a dict with the mean
# TTFT (`"mean_s"`), the 99th-percentile TTFT (`"p99_s"`, interpolated between the two closest ranks,
# as `numpy.percentile` does by default) and the share of the **finished** requests whose TTFT is over
# the SLO (`"miss_share"`: finished requests over the SLO ÷ finished requests). Only a request that
# finished has a first token, so a rejected one is in neither count.

# %%
def ttft_tail(requests, ttft_slo_s):
    """TTFT's mean, its p99 and the share over the SLO, for the finished requests of a run."""
    ### BEGIN SOLUTION 7.4: return {"mean_s": ..., "p99_s": ..., "miss_share": ...} over the finished requests
    ttfts = sorted(q.first_token_time - q.arrival_time for q in requests if q.status == "finished")
    pos = (len(ttfts) - 1) * 0.99
    lo, frac = int(pos), pos - int(pos)
    hi = min(lo + 1, len(ttfts) - 1)
    return {"mean_s": sum(ttfts) / len(ttfts), "p99_s": ttfts[lo] + (ttfts[hi] - ttfts[lo]) * frac,
            "miss_share": sum(t > ttft_slo_s for t in ttfts) / len(ttfts)}
    ### END SOLUTION


check("7.4", ttft_tail)

# %% [markdown]
# Your function on the same chat workload at rising load, against a 0.5 s TTFT SLO (the engine's own
# ledger, `EngineResult.slo`, beside it):

# %%
if unlocked("7.4"):
    for rate in (50, 55, 62):
        run = chat_with_probe(rate, model=MHA, gpu=GPU).result
        tail = ttft_tail(list(run.requests.values()), 0.5)
        report = run.slo(0.5, 0.020)
        verdict = "meets" if tail["mean_s"] <= 0.5 else "misses"
        print(f"{rate} req/s: mean TTFT {1e3 * tail['mean_s']:6.1f} ms ({verdict} the SLO), p99 "
              f"{1e3 * tail['p99_s']:7.1f} ms, {100 * tail['miss_share']:4.1f}% of finished requests late "
              f"(engine ledger: mean {1e3 * report.ttft['ttft']['mean']:6.1f} ms, p99 {1e3 * report.ttft['ttft']['p99']:7.1f} ms)")

# %% [markdown]
# At 55 requests/s{{ "" if card.is_lecture else " on the lecture's card" }} the mean sits well inside the SLO while about one request in twelve misses it: the mean is a statement about the card, the p99 about the users. This is why the
# SLO ledger reports percentiles and goodput counts requests one by one, never an average.
#
# ## 5. Exercise 5 — what paging did and did not buy, on the agent ledger
#
# Lecture 5's 20-step agent: every step re-sends the whole context, **97,000** prompt tokens submitted,
# **7,700** distinct, about 80 output tokens per step, on the {{ gqa.attention }} model ({{ gqa.kv_bytes_per_token // KiB }} KiB per token).
# `labsupport.workloads.agent_session` builds it:

# %%
session = workloads.agent_session()
submitted = sum(q.prompt_tokens for q in session)
distinct = session.requests[-1].prompt_tokens
print(f"{len(session)} steps, prompts {session.requests[0].prompt_tokens:,} -> {distinct:,} tokens; submitted "
      f"{submitted:,}, distinct {distinct:,}: {100 * (1 - distinct / submitted):.2f}% of submitted tokens are re-sent")

# %% [markdown]
# ### Exercise 7.5 — peak KV, sessions per card, prefill cost
#
# Write `agent_session_ledger(model, gpu, prompts, block_size)`, where `prompts` lists the prompt
# tokens each step of a session submits (the context only grows, so the last is the largest),
# returning a dict with
#
# * `"peak_kv_bytes"` — the KV the session holds at its largest prompt (lab 00's per-token count, on
#   this model);
# * `"sessions"` — how many such sessions a **paged** card holds at once. The card's memory first holds
#   the weights and the lecture's 4 GB (decimal) reserve for activations and workspace; the rest is the
#   pool of `block_size`-token blocks, and a session runs only with all of its peak context resident
#   (none at all when the weights leave nothing);
# * `"prefill_s"` — the time to prefill every step's prompt from scratch, on a card that achieves half
#   its peak FLOP rate. Count a prefill's arithmetic as lab 06 did: the weights' work for every token
#   and attention's, every query against all the keys of **its own step's** prompt. (The lecture's
#   sketch drops attention; this exercise does not.)

# %%
def agent_session_ledger(model, gpu, prompts, block_size=16):
    """Exercise 5's three numbers for one agent session whose steps submit `prompts` tokens."""
    ### BEGIN SOLUTION 7.5: return {"peak_kv_bytes": ..., "sessions": ..., "prefill_s": ...}
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    budget = gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4 * GB
    blocks = max(0, math.floor(budget / (block_size * kv)))
    context = max(prompts)
    flops = sum(2 * model.num_params * p + 4 * model.num_layers * model.num_heads * model.head_dim * p * p
                for p in prompts)
    return {"peak_kv_bytes": context * kv, "sessions": blocks // math.ceil(context / block_size),
            "prefill_s": flops / (0.5 * gpu.peak_flops)}
    ### END SOLUTION


check("7.5", agent_session_ledger)

# %% [markdown]
# ### Exercise 7.6 — what sets paging's gain?
#
# Paging's gain here is the paged card's sessions over those of a card that reserves a 16,384-token
# slot per session up front (reserve-to-max, S_max = 16,384), same model, same budget. Which one of
# these changes would raise that gain the most?
#
# * `"mha"` — serve the MHA model instead of {{ gqa.attention }} ({{ mha.kv_bytes_per_token // gqa.kv_bytes_per_token }}× the KV per token);
# * `"memory"` — a card with twice the memory;
# * `"blocks"` — blocks of 256 tokens instead of 16;
# * `"s_max"` — reserve 8,192-token slots instead of 16,384;
# * `"steps"` — sessions that end after their 10th step (their prompts stop at 4,700 tokens).
#
# You have the allocators of labs 02 and 03 and your 7.5 to try them with.

# %%
### BEGIN SOLUTION 7.6: set biggest_gain to the change ("mha", "memory", "blocks", "s_max" or "steps") that raises paging's gain the most
biggest_gain = "steps"
### END SOLUTION
check("7.6", biggest_gain)

# %% [markdown]
# Now count sessions with the real allocators instead of a formula: a paged pool takes sessions until it
# refuses one; a reserve-to-max allocator must promise each session a whole slot. Once 7.5 and 7.6 pass,
# for the lecture's session and for each change of 7.6:

# %%
def sessions_held(model, hbm_scale=1.0, block_size=16, s_max=16_384, context=7_700):
    """Sessions of `context` tokens the real allocators hold: (paged, reserve-to-max)."""
    budget = ledger.kv_budget_bytes(model, GPU) + (hbm_scale - 1) * GPU.hbm_bytes
    paged = BlockAllocator(ledger.num_blocks(budget, block_size, model.kv_bytes_per_token), block_size)
    naive = ReserveToMaxAllocator.from_budget(budget, model.kv_bytes_per_token, s_max=s_max)
    counts = []
    for pool in (paged, naive):
        n = 0
        while True:
            try:
                pool.allocate(n, context)
            except OutOfBlocks:
                break
            n += 1
        counts.append(n)
    return tuple(counts)


gqa = COURSE.gqa
if unlocked("7.5") and revealed("7.6"):  # runs your 7.5 and prints each change's gain, 7.6's answer
    ex5 = agent_session_ledger(gqa, GPU, [q.prompt_tokens for q in session])
    sketch = "the lecture's weights-only count" if COURSE.is_lecture else "the weights alone, as the lecture counts"
    print(f"peak KV {fmt_bytes(ex5['peak_kv_bytes'])}; prefill {ex5['prefill_s']:.2f} s of exclusive {GPU_NAME} time "
          f"({sketch}: {submitted * 2 * gqa.num_params / (0.5 * GPU.peak_flops):.2f} s)")
    for label, kw in (("the lecture's session", {}), ("mha", dict(model=MHA)), ("memory", dict(hbm_scale=2.0)),
                      ("blocks", dict(block_size=256)), ("s_max", dict(s_max=8_192)), ("steps", dict(context=4_700))):
        paged, naive = sessions_held(**{"model": gqa, **kw})
        gain = f"{paged / naive:.2f}x" if naive else "unbounded (no reserved slot fits on this card)"
        print(f"{label:>22}: paged {paged:4d}, reserve-to-max {naive:3d} -> gain {gain}")
    display(Markdown("""The gain is nearly S_max over the session's peak context: what a reserved slot holds against what
a session uses. Bytes per token and the budget scale both counts alike. Paging did nothing to the prefill
time — and most of it is re-sent prompt, because every step re-prefills a context the card already
computed. That is the whole argument for the prefix cache (Nov 9)."""))
    lecture5 = agent_session_ledger(LECTURE_7B_GQA8, LECTURE_GPU, [q.prompt_tokens for q in session])  # its card's
    print(f"The lecture prints 0.985 GB and 63 sessions; exact, {lecture5['peak_kv_bytes'] / 1e9:.3f} GB and "
          f"{lecture5['sessions']}: it reads 128 KiB as 128,000 B ({distinct:,} × 128,000 B = {distinct * 128_000 / 1e9:.4f} "
          "GB), and its 62.5 / 0.985 = 63 sessions follows from that.")

# %% [markdown]
# ## Self-check
#
# 1. A dashboard reports "TTFT {{ 1e3 * N.recompute_s:.0f }} ms". Which of the three terms is that, and which is usually larger
#    on a loaded engine?
# 2. Your request's TPOT doubled and nothing about your request changed. What did?
# 3. Configuration A has twice B's throughput. Can B have more goodput? Construct the case.
# 4. The memory ceiling is {{ N.paged_concurrency }} and the SLO-limited B is your 7.2's answer. Which number should
#    `max_num_seqs` be, and what does it mean that the second is smaller?
# 5. On the Azure replay{{ "" if card.is_lecture else " of the lecture's card" }}, capping B did not raise goodput at 20 ms. Why not, and what would?
#
# The answers show once the checkoffs they lean on pass (7.7's TTFT terms, 7.1's TPOT, 7.2's batch, 7.3's
# goodput):

# %%
if revealed("7.1", "7.2", "7.3", "7.7"):
    naive, ceiling_col, slo_col = columns
    display(Markdown(f"""1. Prefill ({1e3 * prefill_4k:.0f} ms for 4,096 tokens at 50% of peak). Queueing — waiting for blocks
   and a slot.
2. The batch: more neighbours, or longer ones, in the same step (your 7.1 says by how much).
3. Yes: the three-column table. At a {1e3 * naive.tpot_slo_s:g} ms SLO the paged-at-ceiling column
   ({ceiling_col.throughput_tok_s:,.0f} tok/s) has goodput {ceiling_col.goodput_tok_s:,.0f} and the naive column
   ({naive.throughput_tok_s:,.0f} tok/s) keeps all of its throughput as goodput.
4. The SLO-limited one, {slo_col.batch} (for that workload and SLO), not the memory ceiling of {ceiling_col.batch}: the
   SLO binds before memory does — after paging, the allocator is no longer the constraint.
5. The misses came from prefills sharing steps with decodes, not from the batch size. Bounding the
   tokens per step (chunked prefill, `max_num_batched_tokens`) or separating prefill from decode
   addresses it (lab 08 places both on the map)."""))

# %% [markdown]
# Next: **Lab 08 — the map of Part II: what paging did not fix.**
