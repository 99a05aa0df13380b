# %% [markdown]
# # Lab 06 — The engine loop, admission, and the two ways to break a promise (§10.5, Exercise 4)
#
# An engine admits a sequence knowing its prompt and not its output length, hands out blocks on
# demand, and can therefore be fully admitted and still run out when the resident sequences keep
# going. This lab runs the loop for real on the tiny model and watches it stream; overloads it with a
# real trace to see the watermark trade refusals for preemptions; has you derive the break-even between
# swapping a preempted sequence and recomputing it — the rule that then decides the engine's
# preemptions; and then measures *your* machine to find your own break-even.
#
# **Learning objectives served** (the lecture's numbering)
#
# * **Objective 6** — derive the swap-versus-recompute threshold for a preempted sequence from its KV
#   bytes, a link bandwidth and its recompute cost, and say in what sense that threshold is a property
#   of the model and the machine rather than of the request: the curve $W^\ast(S)$ is fixed by the model
#   and the machine, and a request enters only through its length $S$, where the curve is read.
# * **Objective 1**, continued — the five jobs become a loop of six verbs.
# * Groundwork for **objective 7** (lab 07): queueing is what refusing a request costs.
#
# Timing in the lecture: minutes 46–58. Here: about 45 minutes.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
import math
import time

import torch

from labsupport import card, ledger, viz
from labsupport.costmodel import CostModel
from labsupport.course.checkoff import check, revealed, unlocked
from labsupport.engine import Engine
from labsupport.measure.engine_runs import run_requests, stream_engine
from labsupport.measure.machine import measure_copy_bandwidth, measure_prefill_rate
from labsupport.model import load_tiny_model
from labsupport.measure.replay import watermark_sweep
from labsupport.sampling import SamplingParams
# LECTURE_* only where a line states what the lecture printed (its errata); the lab runs on the course card
from labsupport.specs import GB, LECTURE_7B, LECTURE_7B_GQA8, LECTURE_GPU, LECTURE_MFU, ModelSpec
from labsupport.viz import engine as viz_engine
from labsupport.workloads import load_azure
from IPython.display import Markdown, display

# The tiny model's matrices are far too small to gain from several threads, and on a shared
# machine extra threads only wait for each other: one thread is fastest and reproducible.
torch.set_num_threads(1)
model, tok, trained = load_tiny_model()
# The course card (course.toml): the GPU and the model this lab is posed on; on the lecture's card, §10.5's H100 and
# 7B. COURSE.mha and COURSE.gqa are the model's MHA and GQA forms (the lecture's 7B and its GQA-8 variant).
COURSE = card.card()
GPU = COURSE.gpu
GPU_LABEL = GPU.name.split("-")[0].upper()  # how a printed line names the card's GPU ("H100" on the lecture's)
# Prompts for the tiny model, from §10.5 itself (the model was trained on the lecture, so it continues them).
LECTURE_TEXT = (
    "Assemble the pieces into the loop an engine actually runs. Every iteration: pick the set of sequences "
    "to run, allocate any blocks they need to grow, run one forward pass, append the emitted tokens, retire "
    "anyone who finished, and admit new arrivals into the freed space. The batch is re-chosen every "
    "iteration, not every request. A finished sequence leaves at the end of the step that finished it, and "
    "its blocks are available to the next arrival immediately, rather than when the slowest member of some "
    "fixed batch completes. Paging is what makes this cheap: adding and removing a sequence is editing a "
    "table, not repacking a tensor. Admission is a promise the engine can be forced to break. The engine "
    "admits a sequence knowing its prompt length and not its output length. Blocks are handed out on "
    "demand, so a card can be fully admitted and still run out when the resident sequences all decide to "
    "keep going. Something has to give, and the engine has exactly three moves: refuse new arrivals, "
    "preempt a resident sequence, or crash. Real engines do the first two and reserve a watermark of free "
    "blocks so that the second is rare. Preemption is the interesting one, because it has two "
    "implementations and choosing between them is an arithmetic problem you can do from Lecture 2's "
    "numbers alone. Evict a sequence's KV and you must either swap it to host memory and bring it back, or "
    "discard it and recompute the prefill when the sequence is rescheduled.")
print(f"tiny model: {model.cfg.num_params:,} parameters, {'trained on the lecture' if trained else 'RANDOM weights'}; "
      f"{'lecture' if COURSE.is_lecture else 'course'} model: {COURSE.mha.name} on {GPU.name}")

# %% tags=["givens"]
# The givens: the quantities Exercise 4 (6.3) is posed on. Compute your answers from these names; the
# grader re-runs your code on other values of them.
LAYERS = 32  # card=mha.num_layers: the course's model ({mha}): transformer layers
HEADS = 32  # card=mha.num_heads: query heads per layer (its MHA form has as many KV heads)
GQA_KV_HEADS = 8  # card=gqa.num_kv_heads: KV heads per layer of its GQA form ({gqa})
HEAD_DIM = 128  # card=mha.head_dim: dimensions per head
DTYPE_BYTES = 2  # card=mha.dtype_bytes: bf16: bytes per weight and per cached value
PARAMS = 6.74e9  # card=mha.num_params: parameters
PEAK_FLOPS = 989e12  # card=gpu.peak_flops: the {gpu}'s bf16 peak, FLOP/s
MFU = 0.5  # the share of peak a prefill achieves
LINK_BW = 64e9  # card=gpu.link_bandwidth: the {gpu}'s host link, B/s per direction
SLOW_LINK_BW = 32e9  # card=card.slow_link_bandwidth: the slower link of the crossover question, B/s per direction
LONG_SEQ = 16_384  # the long GQA sequence, tokens

# %% [markdown]
# ## 1. The loop as six verbs
#
# §10.5 assembles the pieces into the loop an engine runs **every iteration**:
#
# | verb | what `labsupport.engine.Engine.step()` does | the phase to read |
# |---|---|---|
# | **pick** | the batch is re-chosen: every resident sequence, oldest first | `_take_arrivals`, `_reserve_next_slots` |
# | **allocate** | each reserves the slot of its next token (a new block when its last is full; a copy if shared); if the pool runs dry, **preempt** the newest | `_reserve_next_slots`, `_preempt`, `_swap_in` |
# | **admit** | waiting arrivals join, first come first served, while the free blocks stay above the **watermark** | `_admit` |
# | **run** | one forward pass: prefills of the admitted, one decode token for everyone else | `_forward` |
# | **append** | each sequence appends the token it sampled — and **streams** it | `_stream` |
# | **retire** | finished sequences leave at the end of this step; their blocks serve the next one | `_retire` |
#
# Open `labsupport/engine.py` beside this notebook: `step()` is those phases in order, one method each.
#
# (The lecture lists admit last, "into the freed space"; the engine admits *before* the forward pass,
# into the space freed by the previous step's retirements — the same cycle, cut at a different point.)
#
# Six requests arrive at different steps; at most four sequences run at once. Watch the box below
# while the cell runs: tokens appear step by step, as a user of a streaming API would see them.

# %%
import html as _html

import ipywidgets as widgets

openings = ("Assemble", "The batch", "Paging is", "The engine admits", "Real engines", "Evict a")
prompts = [LECTURE_TEXT[LECTURE_TEXT.index(w):LECTURE_TEXT.index(w) + 40] for w in openings]
schedule = [(step, dict(prompt_ids=tok.encode(p, errors="replace"), max_new_tokens=n,
                        sampling=SamplingParams(temperature=0.6, seed=1)))
            for step, p, n in zip([0, 0, 2, 5, 9, 14], prompts, [12, 30, 20, 24, 16, 20])]
live = widgets.HTML(value="<i>the engine has not started</i>")
display(live)
streamed: dict = {}

def show_step(rec):
    for rid, branch, token, _ in rec.emitted:
        streamed[rid] = streamed.get(rid, "") + tok.decode([token])
    rows = "".join(f"<tr><td><b>r{r}</b>&nbsp;</td><td><code>{_html.escape(t)}</code></td></tr>"
                   for r, t in sorted(streamed.items()))
    live.value = (f"<div style='font-size:16px'>step {rec.step}: batch of {len(rec.emitted)}, "
                  f"{rec.blocks_in_use} blocks in use<table>{rows}</table></div>")

engine = Engine(model, num_blocks=48, block_size=8, max_num_seqs=4)
log = stream_engine(engine, schedule, on_step=show_step)
print(viz_engine.stream_text(log, tok.decode))

# %% [markdown]
# Read the log by column. **B** changes from step to step: the batch is re-chosen every iteration.
# When a request finishes it is *retired* in that step, the block count drops, and in the next step a
# waiting request is admitted into the space (r4 arrives before step 10 and waits for a slot: four
# sequences are already running). Nothing waits for the slowest member of a batch — that is Orca's
# iteration-level scheduling (Oct 7), and paging is what makes it cheap: adding and removing a
# sequence edits a table, it does not repack a tensor.
#
# Replay the run: drag the step slider or press play. Blue cells are prefills (the step a request was
# admitted), green ones decode steps, pale orange ones a request waiting for admission.

# %%
viz_engine.stream_panel(log, tok.decode, upto=12)

# %% [markdown]
# ### The same loop, streaming real text
#
# The tiny model spells out the lecture one character at a time. Nothing in the loop knows whose weights it
# runs, so give it a real checkpoint: **SmolLM2-135M-Instruct** (Hugging Face, Apache-2.0; 30 layers, 9
# query heads sharing 3 KV heads, bf16; installed by `make lab`), through the same `Engine` and `PagedKVCache`.
# Four chat requests arrive together, each with its own limit of new tokens, decoded greedily (the likeliest
# token every step). Each line below is printed as its step ends: the batch, the pool's blocks in use, and the
# piece of text each request got in that step (⏹: its end-of-turn token). All four prefill in step 1; after
# that each gets one token per step, and a request that ends its turn, or reaches its limit, retires in that
# step and its blocks go back to the pool.

# %%
from labsupport import pretrained

smol = pretrained.try_load_smollm2()  # (model, tokenizer); None, after one line naming the install command
if smol is not None:
    smol_model, smol_tok = smol
    questions = {"What is a page table?": 32, "What is the capital of Japan?": 12,
                 "What is the opposite of hot?": 20, "Why is the sky blue?": 28}  # each with its own limit
    greedy = SamplingParams(temperature=0.0, stop_token_ids=smol_tok.stop_ids)  # the likeliest token every step
    chat_schedule = [(0, dict(prompt_ids=smol_tok.chat(q), max_new_tokens=limit, sampling=greedy))
                     for q, limit in questions.items()]
    chat_engine = Engine(smol_model, num_blocks=32, block_size=16)
    texts = [pretrained.TextStream(smol_tok) for _ in questions]  # request r's text so far, piece by piece

    def print_step(rec):
        got = "  ".join(f"r{r} " + ("⏹" if token in smol_tok.stop_ids else repr(texts[r].push(token)))
                        for r, _, token, _ in rec.emitted)
        print(f"step {rec.step:>2} | B={len(rec.emitted)} | {rec.blocks_in_use:>2} of {chat_engine.num_blocks} "
              f"blocks | {got}", flush=True)

    chat_log = stream_engine(chat_engine, chat_schedule, on_step=print_step)
    for r, q in enumerate(questions):
        ended = chat_log.result.requests[r].outputs[0][-1] in smol_tok.stop_ids  # else cut at its limit: …
        print(f"r{r} {q!r} -> {' '.join(smol_tok.decode(texts[r].ids, skip_special=True).split())}"
              f"{'' if ended else ' …'}")

# %% [markdown]
# ## 2. Admission is a promise the engine can be forced to break
#
# Blocks are handed out on demand, so a card can be fully admitted and still run out when the
# resident sequences all keep going. The engine has exactly three moves: **refuse** new arrivals
# (safe; costs queueing), **preempt** a resident sequence (costs a stall), or crash. Real engines do
# the first two and keep a **watermark** of free blocks at admission so that the second is rare.
#
# Overload the {{ "lecture's" if card.is_lecture else "course's" }} engine — the {{ "7B" if card.is_lecture else mha.name }} on an {{ gpu.name.split("-")[0].upper() }}, {{ N.num_blocks:, }} blocks of 16 tokens — with real traffic:
# the first 600 requests of the Azure LLM inference trace (conversation), arriving 8× faster than
# recorded. The engine runs on its **cost-model clock** (each step priced by the roofline at {{ gpu.name.split("-")[0].upper() }}
# scale), so this replay takes a fraction of a second per setting and is exactly reproducible.

# %% tags=["needs-traces"]
azure = load_azure("conv")
summary = azure.summary()
print(f"{azure.name} ({'SYNTHETIC stand-in: the real file is missing' if azure.synthetic else 'real trace'}): "
      f"{summary['count']:,} requests over {summary['duration_s']:,.0f} s; prompt median {summary['prompt_median']:,.0f}"
      f", output median {summary['output_median']:,.0f} tokens")
burst = azure.requests[:600]
pool = ledger.num_blocks(ledger.kv_budget_bytes(COURSE.mha, GPU), 16, COURSE.mha.kv_bytes_per_token)
watermarks = [0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2]
sweep = watermark_sweep(burst, watermarks, num_blocks=pool, preemption="swap", speedup=8.0,
                        cost_model=CostModel(COURSE.mha, GPU))
print(f"{'watermark':>9} | {'refused':>7} | {'preempted':>9} | {'mean queueing':>13} | {'p99 TPOT':>8} | makespan")
for r in sweep:
    print(f"{100 * r.watermark:8.1f}% | {r.waited:7d} | {r.total_preemptions:9d} | {r.mean_queueing_s:11.2f} s | "
          f"{1e3 * r.p99_tpot_s:5.1f} ms | {r.makespan_s:6.1f} s")

# %% [markdown]
# Read the table from its own numbers:

# %% tags=["needs-traces"]
by_w = {r.watermark: r for r in sweep}
none, vllm, five, big = by_w[0.0], by_w[0.01], by_w[0.05], by_w[0.2]
print(f"preemptions: {none.total_preemptions} with no watermark, {vllm.total_preemptions} at vLLM's 1%, "
      f"{five.total_preemptions} at 5%")
queue_anyway = "nearly everyone queues" if none.waited > 0.6 * len(burst) else f"{none.waited / len(burst):.0%} queue"
print(f"requests refused at least once: {none.waited} -> {vllm.waited} -> {five.waited} -> {big.waited} at 20% "
      f"(of {len(burst)}: at 8x the recorded rate {queue_anyway} anyway)")
print(f"mean queueing: {none.mean_queueing_s:.2f} s -> {vllm.mean_queueing_s:.2f} s at 1% -> "
      f"{five.mean_queueing_s:.2f} s at 5% -> {big.mean_queueing_s:.2f} s at 20%")
print(f"p99 TPOT: {1e3 * none.p99_tpot_s:.1f} ms -> {1e3 * vllm.p99_tpot_s:.1f} ms at 1% -> "
      f"{1e3 * big.p99_tpot_s:.1f} ms at 20%")

# %% [markdown]
# A small watermark is nearly free here. It removes most of the preemptions, so the queue drains about
# as fast as before or faster. Refusals barely move, because at eight times the recorded rate many
# requests wait for admission whatever the watermark. Only a large watermark costs: memory held
# back for growth nobody needs yet admits fewer sequences per step, and queueing grows — which is TTFT
# (lab 07).
#
# **Why the p99 TPOT falls as the watermark rises.** Two reasons, both in the engine's clock. A swap is
# a copy of the victim's KV over the link made *inside* a decode step, so every resident of that step
# gets its next token later; fewer preemptions, fewer stretched steps, and the slowest 1% of requests
# were the ones that sat through them. And a decode step's time grows with the KV it reads (lab 07: a
# TPOT is a property of the batch), so at 20% the smaller batches the watermark admits make every step
# shorter — bought with queueing. Move the slider; the right panel shows the pool filling, with the
# watermark line.

# %% tags=["needs-traces"]
viz_engine.watermark_panel(sweep, watermark=0.01)

# %% [markdown]
# *Ask the room:* "Which of your three moves is cheapest for the user?" Refusing new arrivals —
# nobody resident is hurt. That is why watermarks exist. But how expensive is the second move?
#
# ## 3. Two ways to break a promise: swap or recompute
#
# Evict a sequence's KV and you must either **swap** it to host memory and bring it back, or
# **discard** it and recompute its prefill when the sequence is rescheduled (§10.5). Which way is
# cheaper is an arithmetic problem, and its answer is a link bandwidth: the swap's stall depends on the
# host link, the recompute's does not.
#
# ### Exercise 6.1 — the break-even bandwidth
#
# A sequence of `seq_tokens` tokens of `model` is preempted on a card of `peak_flops` FLOP/s whose
# prefills run at the fraction `mfu` of that peak. At what host-link bandwidth $W^\ast$ (bytes/s) do
# its two ways back cost it the same time? Write `breakeven_bandwidth(model, seq_tokens, peak_flops,
# mfu)` from the model's fields (`num_layers`, `num_heads`, `num_kv_heads`, `head_dim`, `dtype_bytes`,
# `num_params`). Count a prefill's arithmetic as the lecture does: the weights for every token, and
# attention with each of the $S$ queries meeting all $S$ keys (not only the earlier ones, as a causal
# kernel would).
#
# The checkoff tries ten models, lengths and GPUs, including GQA and an fp8 cache, and hidden ones.
# Your function then decides preemptions in the engine (section 4): a victim is swapped when the link
# is faster than your $W^\ast$ at its length, and recomputed otherwise.

# %%
def breakeven_bandwidth(model, seq_tokens, peak_flops, mfu=LECTURE_MFU):
    """The host-link bandwidth (bytes/s) at which swapping and recomputing a sequence cost the same."""
    ### BEGIN SOLUTION 6.1: return the link bandwidth W* (bytes/s) at which swapping and recomputing cost the same
    kv_bytes = seq_tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    flops = 2 * model.num_params * seq_tokens + 4 * model.num_layers * model.num_heads * model.head_dim * seq_tokens ** 2
    return 2 * kv_bytes * mfu * peak_flops / flops
    ### END SOLUTION


check("6.1", breakeven_bandwidth)

# %% [markdown]
# Once 6.1 passes, the cell below writes the pair of stalls out and prices the lecture's live
# derivation{{ "" if card.is_lecture else " on the course's card" }}: a 4,096-token sequence of the {{ "7B" if card.is_lecture else mha.name }} on an {{ gpu.name.split("-")[0].upper() }}.

# %%
S = 4096
m = COURSE.mha
kv_per_token = m.kv_bytes_per_token  # lab 00's count
rate = LECTURE_MFU * GPU.peak_flops  # what a prefill achieves
swap_s = ledger.swap_round_trip_s(S * kv_per_token, GPU.link_bandwidth)
if revealed("6.1"):  # the formula, once your own derivation has passed
    display(Markdown(r"""For a sequence of $S$ tokens,
$\text{KV} = S \cdot 2\,L\,n_{kv}\,d_{head}\,b$, $\;t_{swap} = 2\,\text{KV}/W_{link}$,
$\;t_{recompute} = (2NS + 4\,L\,n_{heads}\,d_{head}\,S^2)/(\text{MFU} \cdot F_{peak})$; setting them equal,
$W^\ast = 2\,\text{KV}\cdot\text{MFU}\cdot F_{peak}/(2NS + 4\,L\,n_{heads}\,d_{head}\,S^2)$.
"""))
    kv = S * kv_per_token
    weight_flops = 2 * m.num_params * S
    attention_flops = 4 * m.num_layers * m.num_heads * m.head_dim * S ** 2
    recompute_s = (weight_flops + attention_flops) / rate
    print(f"KV        = {S:,} × {kv_per_token:,} B = {kv:,} B = {kv / GB:.3f} GB")
    print(f"swap      = 2 × {kv / GB:.3f} GB ÷ {GPU.link_bandwidth / GB:.0f} GB/s = {1e3 * swap_s:.1f} ms")
    print(f"recompute = ({weight_flops / 1e12:.1f} + {attention_flops / 1e12:.1f}) TFLOP ÷ {rate / 1e12:.1f} TFLOP/s "
          f"= {1e3 * recompute_s:.1f} ms")
    print(f"ledger:     swap {1e3 * ledger.swap_round_trip_s(kv, GPU.link_bandwidth):.1f} ms, "
          f"recompute {1e3 * ledger.recompute_s(m, S, GPU.peak_flops):.1f} ms")
    print(f"{'swap' if swap_s < recompute_s else 'recompute'} wins at 4K on the {GPU_LABEL} by "
          f"{max(recompute_s, swap_s) / min(recompute_s, swap_s):.1f}×; counted causally (each query against the "
          f"keys before it) the recompute would be {1e3 * (weight_flops + attention_flops / 2) / rate:.1f} ms")

# %% [markdown]
# Your $W^\ast$ on the {{ "lecture's" if card.is_lecture else "course's" }} model, MHA and {{ gqa.attention }}. Before the figure below draws it against $S$: does
# it rise or fall as sequences grow, and which term of your function decides that? (Self-check 4.)

# %%
if unlocked("6.1"):
    for mdl in (COURSE.mha, COURSE.gqa):
        mine = breakeven_bandwidth(mdl, 4096, GPU.peak_flops)
        print(f"{mdl.name:>16}, 4K: W* = {mine / GB:.2f} GB/s (ledger {ledger.breakeven_link_bandwidth(mdl, 4096, GPU.peak_flops) / GB:.2f})")
    # the erratum is the lecture's own arithmetic: on its 7B and H100 (LECTURE_*), whatever the card
    kv_4k, rec_4k = 4096 * LECTURE_7B.kv_bytes_per_token, ledger.recompute_s(LECTURE_7B, 4096, LECTURE_GPU.peak_flops)
    on_lecture = "" if COURSE.is_lecture else " (on the lecture's 7B and H100)"
    print(f"Erratum{on_lecture}: the lecture prints 33.3 GB/s; exact arithmetic gives "
          f"{ledger.breakeven_link_bandwidth(LECTURE_7B, 4096, LECTURE_GPU.peak_flops) / GB:.2f} GB/s: it divides 2 × "
          f"{kv_4k / GB:.3f} GB by the recompute rounded to {1e3 * rec_4k:.0f} ms "
          f"({2 * kv_4k / (round(1e3 * rec_4k) / 1e3) / GB:.1f} GB/s), not by {1e3 * rec_4k:.1f} ms.")

# %% [markdown]
# The lecture's three remarks, each checkable here:
#
# 1. *The threshold is a property of the model and the machine, not of the request*: the curve
#    $W^\ast(S)$ is fixed by the model's fields and the card's FLOP rate, so it can be computed offline,
#    once. A request enters only through its length $S$, the point at which the curve is read: every 4K
#    MHA sequence on this card has the same pair of stalls, whoever sent it. (Exercise 4 below says
#    "a single global policy is wrong": the same statement seen from the link's side — one fixed link
#    crosses the falling curve $W^\ast(S)$ at some length, so sequences on either side of it get
#    different answers. One rule, "compare the link with $W^\ast$ at this sequence's length", is right
#    for all of them; one answer, "always swap" or "always recompute", is not.)
# 2. *GQA changes the answer, not just the magnitude*: {{ gqa.attention }} shrinks the cache {{ mha.num_kv_heads // gqa.num_kv_heads }}× and leaves the
#    prefill's FLOPs alone. On a{{ "n" if 2 ** (int(ledger.breakeven_link_bandwidth(mha, 4096, gpu.peak_flops) / 2 / GB).bit_length() - 1) == 8 else "" }} {{ 2 ** (int(ledger.breakeven_link_bandwidth(mha, 4096, gpu.peak_flops) / 2 / GB).bit_length() - 1) }} GB/s link{{ " (PCIe Gen3 x16, a T4's)" if card.is_lecture else "" }}, a 4K MHA sequence should be
#    recomputed and the same-length {{ gqa.attention }} sequence swapped — a pretraining decision rewrote the
#    engine's preemption policy.
# 3. *Both are stalls*: the swap alone lasts about {{ ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten or more")[min(10, round(N.swap_round_trip_s / N.tpot_s))] }} decode steps of the ambient batch (lab 07 prices
#    a step).
#
# Once 6.1 passes, the cell below checks the second and third on the {{ "lecture's" if card.is_lecture else "course's" }} model, and draws
# $W^\ast(S)$ for MHA and {{ gqa.attention }}:

# %%
if revealed("6.1"):
    # a link between the two forms' W* at 4K: the largest power of two (GB/s) at most half the MHA one
    # (16 GB/s on the lecture's card, PCIe Gen3 x16)
    split = GB * 2 ** math.floor(math.log2(ledger.breakeven_link_bandwidth(COURSE.mha, 4096, GPU.peak_flops) / 2 / GB))
    for mdl in (COURSE.mha, COURSE.gqa):
        sw = ledger.swap_round_trip_s(4096 * mdl.kv_bytes_per_token, split)
        rc = ledger.recompute_s(mdl, 4096, GPU.peak_flops)
        print(f"{mdl.name:>16} on {split / GB:g} GB/s: swap {1e3 * sw:6.1f} ms, recompute {1e3 * rc:6.1f} ms → "
              f"{ledger.preempt_choice(mdl, 4096, split, GPU.peak_flops)}")
    # the ambient batch: as many 640-token sequences as the card's pool holds (lab 03)
    ambient = ledger.paged_concurrency(ledger.kv_budget_bytes(COURSE.mha, GPU), 640, 16, COURSE.mha.kv_bytes_per_token)
    tpot = ledger.tpot_s(COURSE.mha, ambient, 640, GPU.hbm_bandwidth)
    print(f"the 4K swap lasts {swap_s / tpot:.1f} decode steps of a B = {ambient} batch of 640-token sequences")
    viz_engine.breakeven_figure([COURSE.mha, COURSE.gqa], GPU).show()

# %% [markdown]
# ## 4. Which sequence, and how: preemption in the engine
#
# When a running sequence needs a block and none is free, `labsupport`'s engine (like vLLM) gives up on
# the sequence of the **latest-arriving** request — the one first-come-first-served ranks last — and
# repeats until the blocks are there. `preemption="auto"` then decides *per victim*, at the victim's
# length, which of the two stalls is smaller: the comparison your 6.1 settles.
#
# ### Exercise 6.2 — the preemption plan
#
# Write `preemption_plan(running, blocks_needed, block_size, model, gpu, link_bandwidth, mfu)`.
# `running` is a list of `(name, arrival_time, tokens)`; return the victims in eviction order, each as
# `(name, "swap" or "recompute")`, stopping as soon as their blocks (a sequence of $S$ tokens holds
# $\lceil S/b \rceil$) cover `blocks_needed`. Two requests can arrive at the same time: then the engine
# ranks them in the order it received them, which is their order in `running`, so of two equal arrivals
# the one listed **later** is preempted first. Your `breakeven_bandwidth` is the tool for the second half.

# %%
def preemption_plan(running, blocks_needed, block_size, model, gpu, link_bandwidth, mfu=LECTURE_MFU):
    """Victims in the order the engine preempts them, each with the cheaper way to do it."""
    ### BEGIN SOLUTION 6.2: return [(name, "swap" or "recompute"), ...] in the order the engine preempts, until blocks_needed are freed
    plan, freed = [], 0
    order = sorted(range(len(running)), key=lambda i: (running[i][1], i), reverse=True)  # latest first; ties: later listed
    for name, arrival, tokens in (running[i] for i in order):
        if freed >= blocks_needed:
            break
        faster = link_bandwidth > breakeven_bandwidth(model, tokens, gpu.peak_flops, mfu)
        plan.append((name, "swap" if faster else "recompute"))
        freed += -(-tokens // block_size)
    return plan
    ### END SOLUTION


check("6.2", preemption_plan)

# %% [markdown]
# Your plan for a batch of mixed lengths on a 32 GB/s link. One rule (compare the link with each
# victim's $W^\ast(S)$) is right for all of them; one answer for all of them ("always swap", "always
# recompute") is wrong wherever the crossover falls between the batch's shorter and longer sequences
# — and, as Exercise 4 will show, {{ "it does" if 300 < ledger.crossover_tokens(mha, 32 * GB, gpu.peak_flops) < 12_000 else "on this card it does not (on the lecture's card it does)" }}:

# %%
batch = [("a", 0.0, 9000), ("b", 0.5, 700), ("c", 1.25, 5400), ("d", 2.0, 300), ("e", 3.0, 12_000), ("f", 3.5, 2048)]
if unlocked("6.2"):
    print(preemption_plan(batch, 900, 16, COURSE.mha, GPU, 32 * GB))

# %% [markdown]
# ### Preemption loses the cache, never the tokens
#
# Now run the real thing. Six requests of the tiny model, prompts of 50 to 280 tokens, 32 sampled
# tokens each, go through the engine four times: once with a pool big enough that nothing is ever
# preempted, then with a pool of 64 blocks (of 16) under **swap**, **recompute** and **auto**.
#
# For `auto` the engine needs prices. We price the tiny model as if it ran on the {{ "lecture's" if card.is_lecture else "course's" }} {{ gpu.name.split("-")[0].upper() }} and
# give it a made-up host link, chosen so that the break-even falls at 160 tokens, inside this batch —
# so auto has a real choice to make. (On the {{ gpu.name.split("-")[0].upper() }}'s real {{ gpu.link_bandwidth / GB:.0f }} GB/s link a model this small would
# recompute anything under about {{ round(ledger.crossover_tokens(mha.__class__("tiny", 4, 4, 2, 32, 803_968, 4), gpu.link_bandwidth, gpu.peak_flops), -2):,.0f }} tokens: its prefill is cheap next to its cache.) Those prices are
# also the engine's clock here, so the run is reproducible.

# %%
tiny = model.spec()
demo_link = ledger.breakeven_link_bandwidth(tiny, 160, GPU.peak_flops)
pricing = CostModel(tiny, GPU, link_bandwidth=demo_link)
print(f"demo link {demo_link / GB:,.0f} GB/s: crossover {pricing.crossover_tokens():.0f} tokens "
      f"(on the real {GPU.link_bandwidth / GB:.0f} GB/s link: "
      f"{ledger.crossover_tokens(tiny, GPU.link_bandwidth, GPU.peak_flops):,.0f})")
lengths = [220, 50, 280, 100, 180, 70]
requests = [dict(prompt_ids=tok.encode(LECTURE_TEXT[190 * i:190 * i + n], errors="replace"),
                 max_new_tokens=32, sampling=SamplingParams(temperature=0.8, seed=40 + i))
            for i, n in enumerate(lengths)]
enough = sum(-(-(n + 31) // 16) for n in lengths)
wall = {}
t = time.perf_counter()
reference = run_requests(requests, num_blocks=enough, model=model, cost_model=pricing)
wall["no pressure"] = time.perf_counter() - t
pressured = {}
for mode in ("swap", "recompute", "auto"):
    t = time.perf_counter()
    pressured[mode] = run_requests(requests, num_blocks=64, model=model, cost_model=pricing, preemption=mode)
    wall[mode] = time.perf_counter() - t
for row in viz_engine.stall_rows(pressured, reference):
    print(f"{row['label']:>9}: {row['swap']} swapped, {row['recompute']} recomputed; {row['swapped_bytes']:,} B over the "
          f"link, {row['recomputed_tokens']} tokens recomputed; identical tokens: {row['same_tokens']}")
print("request 0's 32 tokens, in every run:", {k: tok.decode(v.requests[0].outputs[0])
                                                for k, v in {"no pressure": reference, **pressured}.items()})

# %% [markdown]
# The same tokens, every time, whichever way the cache was lost: the tokens are the state, and
# sampling draws one random number per (request, branch, position), so a resumed sequence draws the
# numbers it would have drawn anyway. The wall-clock time of those runs on your machine (it varies):

# %% tags=["nbval-ignore-output"]
for label, seconds in wall.items():
    print(f"{label:>11}: {seconds:.2f} s of real time for {len(requests)} requests")

# %% [markdown]
# ### What each way costs, at the lecture's scale
#
# The tokens cannot tell swap from recompute; the clock can. {{ "Forty" if N.num_blocks // 256 + 11 == 40 else N.num_blocks // 256 + 11 }} requests with 4,096-token prompts
# and 256-token outputs arrive at once on the {{ "lecture's" if card.is_lecture else "course's" }} {{ gpu.name.split("-")[0].upper() }} ({{ N.num_blocks:, }} blocks): {{ N.num_blocks // 256 }} prompts fit, they
# grow, and the engine must preempt. Price the same burst on the {{ gpu.name.split("-")[0].upper() }}'s {{ gpu.link_bandwidth / GB:.0f }} GB/s link and on a
# {{ (32 if gpu.link_bandwidth > 32 * GB else gpu.link_bandwidth / 2 / GB):g }} GB/s one, three ways: always swap, always recompute, and victim by victim from the break-even —
# **your `breakeven_bandwidth`** once 6.1 passes (a victim is swapped when the link is faster than your
# $W^\ast$ at its length), the engine's own `auto` until then:

# %%
fits = pool // 256  # the 4,096-token prompts (256 blocks each) the card's pool holds
# eleven more requests than fit (40 on the lecture's card): they queue, and the residents' growth forces preemptions
lecture_burst = [dict(prompt_len=4096, max_new_tokens=256, arrival_time=0.0) for _ in range(fits + 11)]
# the second link: Exercise 4's slower 32 GB/s, or half the card's own link where 32 GB/s is not slower
slow_link = 32 * GB if GPU.link_bandwidth > 32 * GB else GPU.link_bandwidth / 2


def by_your_breakeven(link):
    """A preemption policy from your 6.1: swap when the link beats your W* at the victim's cached length."""
    return lambda num_tokens: ("swap" if link > breakeven_bandwidth(COURSE.mha, max(1, num_tokens), GPU.peak_flops)
                               else "recompute")


ways = {"swap": "swap", "recompute": "recompute", "auto": "auto"}
if unlocked("6.1"):  # from here on, your break-even chooses in the engine
    ways = {"swap": "swap", "recompute": "recompute", "your W*": by_your_breakeven}
rows = []
for link in (GPU.link_bandwidth, slow_link):
    cm = CostModel(COURSE.mha, GPU, link_bandwidth=link)
    roomy = run_requests(lecture_burst, num_blocks=len(lecture_burst) * 272, cost_model=cm)
    runs = {f"{label}, {link / GB:g} GB/s": run_requests(lecture_burst, num_blocks=pool, cost_model=cm,
                                                           preemption=way(link) if callable(way) else way)
            for label, way in ways.items()}
    for row in viz_engine.stall_rows(runs, roomy):
        rows.append(row)
        print(f"{row['label']:>19}: {row['swap']} swap + {row['recompute']} recompute; run took {row['clock_s']:.3f} s, "
              f"{1e3 * row['stall_s']:6.1f} ms more than with room for all {len(lecture_burst)}")
swap64, rec64, victims = rows[0]["clock_s"], rows[1]["clock_s"], rows[0]["swap"]
print(f"recompute − swap on {GPU.link_bandwidth / GB:g} GB/s: {1e3 * (rec64 - swap64):.1f} ms for {victims} preemptions = "
      f"{1e3 * (rec64 - swap64) / victims:.1f} ms each")
if revealed("6.1"):
    one_swap = ledger.swap_round_trip_s(4096 * COURSE.mha.kv_bytes_per_token, GPU.link_bandwidth)
    one_recompute = ledger.recompute_s(COURSE.mha, 4096, GPU.peak_flops)
    print(f"the derivation at 4,096 tokens: {1e3 * one_recompute:.1f} − {1e3 * one_swap:.1f} = "
          f"{1e3 * (one_recompute - one_swap):.1f} ms (one of the engine's victims had already grown past 4,096 tokens)")
viz_engine.stall_figure(rows, "ms", title="Extra time the burst took because memory ran out").show()
cm64 = CostModel(COURSE.mha, GPU)  # the card's own link
timeline = {f"room for all {len(lecture_burst)}": run_requests(lecture_burst, num_blocks=len(lecture_burst) * 272,
                                                               cost_model=cm64),
            f"{pool:,} blocks, swap": run_requests(lecture_burst, num_blocks=pool, cost_model=cm64, preemption="swap"),
            f"{pool:,} blocks, recompute": run_requests(lecture_burst, num_blocks=pool, cost_model=cm64,
                                                        preemption="recompute")}
viz_engine.blocks_figure(timeline, pool, title=f"Blocks in use: the burst on the {GPU_LABEL}'s pool "
                                               f"({GPU.link_bandwidth / GB:g} GB/s link)").show()

# %% [markdown]
# On {{ gpu.link_bandwidth / GB:.0f }} GB/s swapping is cheaper, and the break-even swaps. On {{ (32 if gpu.link_bandwidth > 32 * GB else gpu.link_bandwidth / 2 / GB):g }} GB/s
# {{ "the stalls above favour recompute, barely, and the break-even recomputes" if ledger.breakeven_link_bandwidth(mha, 4096, gpu.peak_flops) > (32 if gpu.link_bandwidth > 32 * GB else gpu.link_bandwidth / 2 / GB) * GB else "swapping is still cheaper on this card, and the break-even swaps again" }};
# at what length the two costs cross on {{ "that link" if gpu.link_bandwidth > 32 * GB else "a 32 GB/s link" }} is
# Exercise 4's question (6.3). And the extra time is more than the two stalls of the mechanism: a
# preempted sequence also waits for blocks to come back — which is why the right goal is to preempt
# *rarely*, not cheaply.

# %% [markdown]
# ### Your policy in the engine
#
# The engine's `preemption=` also takes a policy of your own: a function of the victim's cached tokens
# that returns `"swap"` or `"recompute"`, asked for every victim as the pool runs dry. Below, your
# `preemption_plan` decides each victim of a mixed-length burst — {{ 6 * round(1.8 * N.num_blocks / sum(-(-(p + 1024) // 16) for p in (700, 9000, 2048, 12_000, 300, 5400))) }} requests whose prompts cycle
# through lengths from 300 to 12,000 tokens, 1,024 output tokens each, arriving 10 ms apart — on the
# {{ N.num_blocks:, }}-block pool over a 32 GB/s link. It runs against the two single answers and against your own
# choice flipped; the extra time is against the same burst with room for everyone.

# %%
mixed_lengths = (700, 9000, 2048, 12_000, 300, 5400)
# as many rounds of the six lengths as need about 1.8 pools at full length (six rounds, 36 requests, on the
# lecture's card), so that the pool runs dry on any card
rounds = round(1.8 * pool / sum(-(-(n + 1024) // 16) for n in mixed_lengths))
mixed = [dict(prompt_len=mixed_lengths[i % 6], max_new_tokens=1024, arrival_time=0.01 * i) for i in range(6 * rounds)]
cm32 = CostModel(COURSE.mha, GPU, link_bandwidth=32 * GB)
if unlocked("6.2"):
    def your_policy(num_tokens):  # your 6.2, asked about one victim
        return preemption_plan([("victim", 0.0, num_tokens)], 1, 16, COURSE.mha, GPU, 32 * GB)[0][1]

    def flipped(num_tokens):
        return "swap" if your_policy(num_tokens) == "recompute" else "recompute"

    room = run_requests(mixed, num_blocks=sum(-(-(r["prompt_len"] + 1024) // 16) for r in mixed), cost_model=cm32)
    print(f"with room for all, the burst takes {room.clock_s:.1f} s")
    for label, policy in (("always swap", "swap"), ("always recompute", "recompute"), ("your policy", your_policy),
                          ("yours, flipped", flipped)):
        res = run_requests(mixed, num_blocks=pool, cost_model=cm32, preemption=policy)
        print(f"{label:>16}: {res.counters.preemptions['swap']} swapped, {res.counters.preemptions['recompute']} "
              f"recomputed; {1e3 * (res.clock_s - room.clock_s):6.1f} ms more than with room for all")

# %% [markdown]
# Which of the four is cheapest, and by how much? A correct plan picks the smaller stall victim by
# victim, so no single answer can beat it on this burst. Set the margins beside the run's length with
# room for all (the first line): §10.5's third remark again — the goal is to preempt *rarely*, which
# the watermark does, more than to preempt cheaply.
#
# ### What the paper found: the block size changes the answer (§7.3)
#
# The derivation priced a swap by its bytes alone. A real engine moves a paged cache block by block:
# vLLM copies each block of each layer's K and V on its own, $2L$ copies per block, and every copy has
# a fixed cost $t_0$ on top of its bytes (a `cudaMemcpyAsync` call, of the order of microseconds). The
# vLLM paper's ablation (Kwon et al., SOSP 2023, §7.3, Fig. 19) found exactly that: swapping is slow
# at small block sizes, where the copies are many and tiny, while recomputation does not care about
# the block size — and it was never more than 20% slower than swapping at any size they tried. With
# $t_0$ in the model, a 4K MHA sequence of the {{ "7B" if card.is_lecture else mha.name }} on the {{ gpu.name.split("-")[0].upper() }}'s {{ gpu.link_bandwidth / GB:.0f }} GB/s link:
#
# $$t_{swap} = 2\left(\frac{\text{KV}}{W} + 2L\left\lceil \frac{S}{b} \right\rceil t_0\right)$$
#
# The table shows once 6.1 passes: its first row is the derivation's pair.

# %%
if revealed("6.1"):
    rec_4k = ledger.recompute_s(COURSE.mha, 4096, GPU.peak_flops)
    print(f"{'t0':>6} | " + " | ".join(f"b = {b:>3}" for b in (1, 4, 16, 64, 256)) + f" | recompute {1e3 * rec_4k:.1f} ms")
    for t0 in (0.0, 1e-6, 5e-6, 20e-6):
        cells = []
        for b in (1, 4, 16, 64, 256):
            sw = ledger.swap_round_trip_s(4096 * kv_per_token, GPU.link_bandwidth,
                                          ledger.swap_transfers(COURSE.mha, 4096, b), t0)
            cells.append(f"{1e3 * sw:5.0f} ms {'S' if sw < rec_4k else 'R'}")
        print(f"{1e6 * t0:4.0f} µs | " + " | ".join(cells))

# %% [markdown]
# (S: swap is cheaper, R: recompute.) With no per-copy cost, swap wins at every block size;
# {{ "at a few microseconds per copy the 16-token blocks vLLM uses by default make recompute the cheaper way back, and only large blocks keep swap ahead" if ledger.swap_round_trip_s(4096 * mha.kv_bytes_per_token, gpu.link_bandwidth, ledger.swap_transfers(mha, 4096, 16), 5e-6) > ledger.recompute_s(mha, 4096, gpu.peak_flops) else "on this card the 16-token blocks vLLM uses by default keep swap ahead at 5 µs per copy, and only smaller blocks or costlier copies make recompute the cheaper way back" }}
# — the §7.3 picture. The engine's `auto` mode prices the same
# term when its cost model is given a `block_transfer_s`, so the choice follows the block size. The
# lecture burst of section 4 again, at $t_0 = 5$ µs:

# %%
for b in (16, 256):
    cm_copies = CostModel(COURSE.mha, GPU, block_transfer_s=5e-6)
    pool_b = ledger.num_blocks(ledger.kv_budget_bytes(COURSE.mha, GPU), b, COURSE.mha.kv_bytes_per_token)
    res = run_requests(lecture_burst, num_blocks=pool_b, block_size=b, cost_model=cm_copies,
                                  preemption="auto")
    print(f"b = {b:>3}: auto chose swap {res.counters.preemptions['swap']} times and recompute "
          f"{res.counters.preemptions['recompute']} times; the burst took {res.clock_s:.3f} s")

# %% [markdown]
# ### All or nothing, and a whole group at a time (§4.5)
#
# The reading guide asks you to check the paper's eviction policy against this break-even. The paper
# evicts **all** of a sequence's blocks or none — a sequence with half its KV gone would have to
# recompute anyway, since attention needs every key — and it evicts a **sequence group** (the n
# branches of a parallel-sampling request, or a beam) together, because the branches share their
# prompt's blocks. Price the lecture's fan-out, 8 branches off a 4,096-token prompt with 256 tokens
# each generated, both ways back, as a group and one branch at a time:

# %%
group_cost = {}
for together in (True, False):
    swap_b = ledger.group_swap_bytes(8, 4096, 256, 16, COURSE.mha.kv_bytes_per_token, together)
    rec_f = ledger.group_recompute_flops(COURSE.mha, 8, 4096, 256, together)
    group_cost[together] = swap_b, rec_f
    w_star = ledger.group_breakeven_link_bandwidth(COURSE.mha, 8, 4096, 256, 16, GPU.peak_flops, together=together)
    print(f"{'as one group' if together else 'branch by branch':>17}: swap {swap_b / GB:6.2f} GB each way = "
          f"{1e3 * ledger.swap_round_trip_s(swap_b, GPU.link_bandwidth):6.1f} ms; recompute {rec_f / 1e12:6.1f} TFLOP "
          f"= {1e3 * rec_f / rate:7.1f} ms; break-even {w_star / GB:.1f} GB/s")
print(f"one 4,352-token sequence alone: break-even "
      f"{ledger.breakeven_link_bandwidth(COURSE.mha, 4352, GPU.peak_flops) / GB:.1f} GB/s")
print(f"the group together moves {group_cost[False][0] / group_cost[True][0]:.1f}× fewer bytes and computes "
      f"{group_cost[False][1] / group_cost[True][1]:.1f}× fewer FLOPs than branch by branch")

# %% [markdown]
# Evicting the group together moves and recomputes the shared prompt once instead of eight times —
# the last line's ratios — and its break-even is within a few percent of a single sequence's: so the paper's all-or-nothing group policy and §10.5's per-sequence arithmetic agree, the
# group just costs less. Branch by branch (what `labsupport`'s engine does: it evicts one sequence at a
# time) pays the unshared price, and the branches come back as private copies. What does *not* match
# the break-even is vLLM's default choice between the two: it recomputes every single-sequence group
# and swaps every multi-sequence group (recomputation of a group is not supported), whatever the
# length and the link. On the {{ gpu.name.split("-")[0].upper() }}'s {{ gpu.link_bandwidth / GB:.0f }} GB/s link the byte arithmetic says swap for every length of
# the {{ "MHA 7B" if card.is_lecture else mha.name }}; {{ "with a few microseconds per copy at $b = 16$ it says recompute — the default is right for the second reading" if ledger.swap_round_trip_s(4096 * mha.kv_bytes_per_token, gpu.link_bandwidth, ledger.swap_transfers(mha, 4096, 16), 5e-6) > ledger.recompute_s(mha, 4096, gpu.peak_flops) else "with 5 µs per copy at $b = 16$ it still says swap at 4K on this card — the default is wrong for both readings here" }},
# and only the break-even knows which machine you are on.
#
# ## 5. Exercise 4 — the break-even you will actually hit
#
# Exercise 4 asks two things of the {{ "lecture's" if card.is_lecture else "course's" }} model, on the givens at the top of the lab:
#
# 1. A **long GQA** sequence (`LONG_SEQ` tokens of the model with `GQA_KV_HEADS` KV heads): its
#    recompute time, how many times cheaper its swap is over the card's link (`LINK_BW`), and the
#    break-even bandwidth at which the two would cost the same. GQA shrinks what crosses the link;
#    think about what it does to what the prefill computes.
# 2. The length at which swapping stops winning on a {{ "**slower**" if G.SLOW_LINK_BW < G.LINK_BW else "**second**" }} link (`SLOW_LINK_BW`), for the **MHA**
#    form of the model (as many KV heads as query heads, `HEADS`). Both sides of "swap = recompute"
#    are functions of $S$; look at their powers of $S$ before you reach for a solver.
#
# ### Exercise 6.3 — Exercise 4's numbers
#
# Compute the four numbers from the givens (`LAYERS`, `HEADS`, `GQA_KV_HEADS`, `HEAD_DIM`,
# `DTYPE_BYTES`, `PARAMS`, `PEAK_FLOPS`, `MFU`, `LINK_BW`, `SLOW_LINK_BW`, `LONG_SEQ`; your
# `breakeven_bandwidth` may help, on a `ModelSpec` you build from them) and set `exercise4` to a dict
# with exactly these four keys:
#
# * `"recompute_ms"` — the long GQA sequence's recompute time, in **milliseconds**;
# * `"swap_advantage"` — its recompute time divided by its swap round trip over `LINK_BW` (a ratio);
# * `"breakeven_gbs"` — its break-even link bandwidth, in **GB/s** (1e9 B/s);
# * `"crossover_tokens"` — the MHA sequence length at which swap and recompute cost the same on
#   `SLOW_LINK_BW`, in **tokens** (exact, not rounded to a printed figure).

# %%
### BEGIN SOLUTION 6.3: compute the four numbers of Exercise 4 (ms, ratio, GB/s, tokens) from the givens
achieved = MFU * PEAK_FLOPS  # FLOP/s a prefill actually gets
attention_per_s2 = 4 * LAYERS * HEADS * HEAD_DIM  # QK^T and PV, every query head against all S keys
gqa_kv_per_token = 2 * LAYERS * GQA_KV_HEADS * HEAD_DIM * DTYPE_BYTES
mha_kv_per_token = 2 * LAYERS * HEADS * HEAD_DIM * DTYPE_BYTES
long_kv = LONG_SEQ * gqa_kv_per_token
long_swap_s = 2 * long_kv / LINK_BW
long_recompute_s = (2 * PARAMS * LONG_SEQ + attention_per_s2 * LONG_SEQ ** 2) / achieved
# 2 S kv / W = (2 N S + a S^2) / F: divide by S, and S is linear
crossover = (2 * mha_kv_per_token * achieved / SLOW_LINK_BW - 2 * PARAMS) / attention_per_s2
exercise4 = {
    "recompute_ms": 1e3 * long_recompute_s,
    "swap_advantage": long_recompute_s / long_swap_s,
    "breakeven_gbs": 2 * long_kv / long_recompute_s / 1e9,
    "crossover_tokens": crossover,
}
### END SOLUTION
check("6.3", exercise4)

# %% [markdown]
# Once 6.1 and 6.3 pass, the cell below shows the derivation term by term on the lecture's numbers,
# and the one place where the lecture's printed figure parts from it.

# %%
if revealed("6.1", "6.3"):
    display(Markdown(r"""Setting $2 S\,\text{kv}/W = (2NS + 4LHdS^2)/F$ and dividing by $S$ leaves a linear
equation, $S^\ast = (2\,\text{kv}\,F/W - 2N)/(4\,L\,H\,d)$. The lecture's 16K GQA-8 sequence holds
$16{,}384 \times 128$ KiB, exactly the bytes of a 4K MHA sequence, so its swap is the 4K MHA sequence's,
while its prefill's weights term grows 4× and its attention 16×."""))
    # the lecture's own numbers (LECTURE_*), whatever the card: this cell sets them beside what the lecture printed
    whose = "" if COURSE.is_lecture else "the lecture's "
    lecture_rate = LECTURE_MFU * LECTURE_GPU.peak_flops
    kv16 = 16_384 * LECTURE_7B_GQA8.kv_bytes_per_token
    swap16 = ledger.swap_round_trip_s(kv16, LECTURE_GPU.link_bandwidth)
    recompute16 = ledger.recompute_s(LECTURE_7B_GQA8, 16_384, LECTURE_GPU.peak_flops)
    w16 = 2 * LECTURE_7B_GQA8.num_params * 16_384
    print(f"{whose}16K GQA-8: KV {kv16 / GB:.3f} GB; swap {1e3 * swap16:.1f} ms; recompute "
          f"({w16 / 1e12:.1f} + {(ledger.prefill_flops(LECTURE_7B_GQA8, 16_384) - w16) / 1e12:.1f}) TFLOP ÷ "
          f"{lecture_rate / 1e12:.1f} TFLOP/s = {1e3 * recompute16:.1f} ms; swap wins {recompute16 / swap16:.1f}×; "
          f"W* = {ledger.breakeven_link_bandwidth(LECTURE_7B_GQA8, 16_384, LECTURE_GPU.peak_flops) / GB:.2f} GB/s (printed 5.9)")
    crossover_32 = ledger.crossover_tokens(LECTURE_7B, 32 * GB, LECTURE_GPU.peak_flops)
    print(f"{whose}MHA crossover on 32 GB/s: {crossover_32:,.2f} tokens")
    attention_per_s2 = 4 * LECTURE_7B.num_layers * LECTURE_7B.num_heads * LECTURE_7B.head_dim
    doubled = (2 * LECTURE_7B.kv_bytes_per_token * lecture_rate / (32 * GB) - 2 * LECTURE_7B.num_params) / (2 * attention_per_s2)
    print(f"Erratum: the lecture prints S ≈ 2,600; the root of its own equation is {crossover_32:,.0f}: ≈ 2,600 is "
          f"what twice the attention term (8·L·H·d·S²) gives, {doubled:,.0f} tokens.")

# %% [markdown]
# Either way the lesson of the exercise survives, and is sharper with the exact number: on a 32 GB/s
# link {{ "most chat-length sequences (the Azure trace's median prompt is 1,020 tokens) should be **recomputed**, and long ones swapped" if ledger.crossover_tokens(mha, 32 * GB, gpu.peak_flops) > 1020 else "the lecture's card should **recompute** most chat-length sequences (the Azure trace's median prompt is 1,020 tokens) and swap long ones, while this card " + ("recomputes only sequences shorter than most chat prompts" if ledger.crossover_tokens(mha, 32 * GB, gpu.peak_flops) > 0 else "swaps every length") }}. "A single global policy is wrong" and "the threshold is a
# property of the model and the machine" do not contradict each other: the threshold curve $W^\ast(S)$
# — equivalently the crossover length on a given link — is fixed by the model and the machine, and the
# one property of a request that enters is its length, at which the curve is read. So no single answer
# (always swap, always recompute) fits a mixed workload, and one offline rule does.

# %% [markdown]
# Now explore. The panel draws both stalls against $S$ for the chosen model, GPU and link, marks the
# crossover, and states the derivation at the chosen $S$ (it opens once 6.1 and 6.3 pass: it prices
# 6.1's pair and marks 6.3's crossover). Try: MHA on 32 GB/s at 4K, then at your crossover, then 8K; switch to {{ gqa.attention }} (does a
# crossover remain?); put the 70B on an A100's 32 GB/s link.

# %%
if revealed("6.1", "6.3"):
    display(viz_engine.swap_recompute_panel(seq_tokens=4096, link_gbs=32))

# %% [markdown]
# ## 6. Your machine
#
# The threshold curve is a property of the model and the machine (a request only picks the point $S$
# on it), so compute yours. Two measurements:
#
# * **the copy bandwidth a swap would use** — on a CUDA GPU, pinned host→device and device→host
#   copies over the real link. On a machine without a GPU **there is no link**: KV already lives in
#   host memory and "swapping" would be a host memcpy, so that is what we time, labelled as a
#   stand-in;
# * **the tiny model's prefill rate** — what a recompute redoes, timed through a fresh paged cache.
#
# Your break-even for a sequence of $S$ tokens then follows from 6.1's reasoning, with the timed
# prefill in place of a FLOP count. These numbers are measurements: they differ on every machine and
# from run to run.

# %% tags=["nbval-ignore-output"]
bandwidths = measure_copy_bandwidth()
for bw in bandwidths:
    print(f"{bw.label}: {bw.bytes_per_s / GB:.2f} GB/s ({bw.nbytes / 2**20:.0f} MiB, median of {len(bw.seconds)})")
# on a GPU machine, time the prefill where a real engine would run it: on the device
device_model = load_tiny_model(device="cuda")[0] if torch.cuda.is_available() else model
prefill = measure_prefill_rate(device_model, lengths=(64, 128, 256, 512))
print(f"prefill timed on {device_model.device}")
for n, s, f, w in zip(prefill.lengths, prefill.seconds, prefill.flop_rates, prefill.breakeven()):
    print(f"prefill of {n:>3} tokens: {1e3 * s:7.2f} ms = {f / 1e9:6.2f} GFLOP/s achieved; your W*({n}) = "
          f"{w / 1e6:8.2f} MB/s")
link = bandwidths[0]
verdict = "swap" if all(link.bytes_per_s > w for w in prefill.breakeven()) else "mixed"
print(f"with {link.bytes_per_s / GB:.2f} GB/s {'over your link' if link.is_link else '(memcpy stand-in)'} the tiny "
      f"model should {'always swap' if verdict == 'swap' else 'swap some lengths and recompute others'}: "
      f"{link.bytes_per_s / max(prefill.breakeven()):,.0f}× above the largest break-even")
if unlocked("6.1"):  # your formula on the tiny model, at the FLOP rate this machine achieved (mfu = 1 of it)
    for n, f, w in zip(prefill.lengths, prefill.flop_rates, prefill.breakeven()):
        print(f"your breakeven_bandwidth(tiny, {n}, measured rate): {breakeven_bandwidth(device_model.spec(), n, f, 1.0) / 1e6:8.2f} MB/s "
              f"against the timed {w / 1e6:8.2f} MB/s")
viz_engine.personal_breakeven_figure(prefill, link).show()

# %% [markdown]
# Compare with the {{ "lecture's" if card.is_lecture else "course's" }} {{ gpu.name.split("-")[0].upper() }} (the cell below, once 6.1 passes). For the tiny model on a CPU the
# factor between link and break-even is far larger: its "link" is memory itself, and its prefill runs
# at a few GFLOP/s. Same formula, different machine, different answer — which is the point of
# objective 6.

# %%
if revealed("6.1"):
    w_gpu = ledger.breakeven_link_bandwidth(COURSE.mha, 4096, GPU.peak_flops)
    print(f"the {'lecture' if COURSE.is_lecture else 'course'}'s {GPU_LABEL}: a 4K MHA sequence breaks even at "
          f"{w_gpu / GB:.2f} GB/s against its {GPU.link_bandwidth / GB:.0f} GB/s link, a factor of "
          f"{GPU.link_bandwidth / w_gpu:.2f}")

# %% [markdown]
# ## Self-check
#
# 1. The lecture asks the room: "The engine admitted 199 sequences and they all keep generating. What
#    breaks?" And which of the three moves is cheapest for the user?
# 2. Why does a watermark reduce preemptions, and what does it cost instead?
# 3. Derive the swap and the recompute stalls of a 4K MHA sequence of the {{ "7B" if card.is_lecture else mha.name }} on the {{ gpu.name.split("-")[0].upper() }}. Which term of
#    the recompute does {{ gqa.attention }} change?
# 4. Why does $W^\ast$ fall as $S$ grows?
# 5. A preempted sequence resumes. Can its next token differ from the one it would have produced?
#
# The answers show once 6.1 passes (3 and 4 are its derivation):

# %%
if revealed("6.1"):
    kv_4k = 4096 * COURSE.mha.kv_bytes_per_token
    weights_4k = 2 * COURSE.mha.num_params * 4096
    attention_4k = 4 * COURSE.mha.num_layers * COURSE.mha.num_heads * COURSE.mha.head_dim * 4096 ** 2
    display(Markdown(f"""1. Blocks run out mid-decode. Refusing new arrivals is cheapest: nobody resident is hurt; it costs
   the newcomers queueing time (TTFT).
2. Admission stops while the free blocks would drop below the watermark, so the residents have room
   to grow before anyone must be evicted. It costs refusals: requests wait longer to be admitted.
3. Swap: 2 × 4,096 × {COURSE.mha.kv_kib_per_token:,g} KiB ÷ {GPU.link_bandwidth / GB:.0f} GB/s =
   {1e3 * ledger.swap_round_trip_s(kv_4k, GPU.link_bandwidth):.1f} ms. Recompute: ({weights_4k / 1e12:.1f} +
   {attention_4k / 1e12:.1f}) TFLOP ÷ {rate / 1e12:.1f} TFLOP/s = {1e3 * (weights_4k + attention_4k) / rate:.1f} ms.
   {COURSE.gqa.attention} changes none of the recompute's terms: it shrinks the KV (so the swap), not the prefill FLOPs.
4. The KV (numerator) is linear in S, the prefill FLOPs (denominator) quadratic, because of attention.
5. No. Preemption loses the cache, never the tokens; the engine's sampling depends only on the
   request, the branch and the position, so the resumed sequence continues exactly (section 4)."""))

# %% [markdown]
# Next: **Lab 07 — sizing, SLOs, and where the time actually goes.**
