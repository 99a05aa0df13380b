# %% [markdown]
# # Lab 01 — Five jobs, and the lecture's 29 against 295 (§10.1)
#
# Lecture 2 left one collision on the board: on an H100, the lecture's 7B MHA model's decode arithmetic
# **wants a batch of 295**, and its KV cache **permits 29**. Part II is about that gap. First you take a
# real run of this course's serving engine apart, step by step, and charge what it did to the five jobs
# of §10.1. Then you derive both numbers from what the hardware does (each formula appears once your code
# passes), on the course's card: `{{ mha.name }}` on `{{ gpu.name }}`, the card's model in its MHA form, with a
# KV head for every query head as the lecture's 7B has. And you move the GPU, the model (`{{ gqa.name }}`, its
# {{ gqa.attention }} form, among them) and the maximum sequence length to see which of the two walls moves, and
# whether a gap is left.
#
# **Learning objectives served** (the lecture's numbering)
#
# * **Objective 1** — list the five jobs a serving engine performs on every request, and name the
#   resource each one contends for: here you measure each job's resource on a run of the real engine
#   (1.5), name it (1.1), and predict and measure what a smaller KV cache moves (1.4).
# * The ground for **objective 2** — the reserve-to-maximum allocator's memory arithmetic, which lab 02
#   turns into wasted memory, lost concurrency and lost throughput.
#
# Timing in the lecture: minutes 0–6. Here: about 40 minutes.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
from dataclasses import replace

from labsupport import card, ledger, viz
from IPython.display import Markdown, display

from labsupport.costmodel import CostModel
from labsupport.course.checkoff import check, revealed, unlocked
from labsupport.measure.engine_runs import job_run
from labsupport.specs import GB, LECTURE_RESERVED_BYTES
from labsupport.units import fmt_bytes, fmt_gb
from labsupport.viz import roofline

COURSE = card.card()  # the course's card (course.toml): COURSE.mha / COURSE.gqa, its model with MHA / GQA attention
GPU = COURSE.gpu
print(f"model: {COURSE.mha.name}, {COURSE.mha.num_params / 1e9:.2f}e9 parameters, "
      f"{COURSE.mha.num_layers} layers × {COURSE.mha.num_heads} heads × {COURSE.mha.head_dim}, bf16")
print(f"GPU:   {GPU.name}, {fmt_gb(GPU.hbm_bytes, 0)} HBM at {GPU.hbm_bandwidth / GB:,.0f} GB/s, "
      f"{GPU.peak_flops / 1e12:,.0f} TFLOP/s dense bf16")

# %% [markdown]
# ## 1. What a serving engine is asked to do
#
# A serving engine is the thing between an HTTP request and 201 forward passes. It does five jobs,
# and each contends for a different resource — which is why they are usually five pieces of code
# that fight each other.
#
# | job | what it decides |
# |---|---|
# | **Admit** | accept a request now, queue it, or reject it |
# | **Allocate** | where the sequence's KV goes, for its prefill and for its growth |
# | **Batch** | which sequences run in the next forward pass |
# | **Run** | launching the kernels: prefill for arrivals, decode for everyone else |
# | **Stream** | returning each token as it is produced |
#
# Read §10.1 again with one question per row: *what does this job hand out, and what runs out first
# if it hands out too much?* Then find out on a real run.
#
# ### 1b. One run of the engine, step by step
#
# `labsupport.engine.Engine` is this course's serving engine (lab 06 builds its loop with you): here it
# runs without a model, on the cost-model clock — each step's time priced from the card's model in MHA
# form (`{{ mha.name }}`) on its GPU (`{{ gpu.name }}`) — over a pool of 600 blocks of 16 tokens. Twelve
# chat requests arrive while it runs.
# `job_run` records the run as plain data, `trace`:
#
# * `trace["num_params"]`, `trace["kv_bytes_per_token"]`, `trace["block_size"]`: the run's constants;
# * `trace["requests"][r]`: request `r`'s `prompt_tokens` and `max_new_tokens` (it emits exactly that
#   many tokens);
# * `trace["steps"]`: one record per iteration of the engine's loop, in order, with `start_s` and
#   `end_s` (the step's start and end, seconds), `admitted` (the requests whose prefill ran in this
#   step), `tokens` (every token the step streamed, as `[request, index]`, index 0 being the request's
#   first output token; all of a step's tokens leave at its end), `finished` (the requests whose last
#   token this step streamed) and `blocks_in_use` (the pool's blocks held after the step).

# %%
# (the step before which a request arrives, its prompt tokens, its max new tokens)
REQUESTS = [(0, 512, 24), (0, 380, 40), (1, 600, 12), (3, 512, 30), (4, 90, 48), (6, 1_000, 20),
            (9, 256, 36), (10, 512, 16), (14, 700, 28), (15, 128, 40), (20, 512, 24), (24, 2_048, 8)]
trace, _ = job_run(CostModel(COURSE.mha, GPU), REQUESTS, num_blocks=600)
print(f"{len(trace['steps'])} steps, {len(trace['requests'])} requests; the first three steps:")
for step in trace["steps"][:3]:
    print({k: v if k != "tokens" else v[:4] + (["..."] if len(v) > 4 else []) for k, v in step.items()})

# %% [markdown]
# ### Exercise 1.5 — charge the run to the five jobs
#
# Write `job_ledger(trace)`: a dict from each of the five verbs (lower case) to what that job handed
# out over this run, read from the step records alone:
#
# * `"admit"`: admitting a request is a promise of KV space for everything it will hold, from the step
#   that admits it until the step that finishes it. The most bytes the engine had promised at once,
#   counted after each step.
# * `"allocate"`: the most bytes of the pool's blocks that were held at once after a step.
# * `"batch"`: places in a forward pass — a sequence has a place in a step when it gets a token out
#   of it. The mean number of places per step.
# * `"run"`: the arithmetic of the weights, in FLOP: each token pushed through the model costs one
#   multiply and one add per parameter. Count every token a step pushes through, not only those it
#   emits. (Leave attention's arithmetic out.)
# * `"stream"`: the longest a user waited between two consecutive tokens of their request, in seconds.
#
# The checkoff runs your function on other runs (other models, block sizes, arrivals) and compares it
# with what the engine itself counted.

# %%
def job_ledger(trace):
    """Each of the five jobs' resource, measured on one engine run's step records."""
    ### BEGIN SOLUTION 1.5: return {"admit": ..., "allocate": ..., "batch": ..., "run": ..., "stream": ...} read from trace["steps"]
    kv, n = trace["kv_bytes_per_token"], trace["num_params"]
    lengths, steps = trace["requests"], trace["steps"]
    live, promised, last_token, longest, pushed = set(), 0, {}, 0.0, 0
    for step in steps:
        live = (live | set(step["admitted"])) - set(step["finished"])
        promised = max(promised, sum((lengths[r]["prompt_tokens"] + lengths[r]["max_new_tokens"]) * kv
                                     for r in live))
        for r, index in step["tokens"]:
            pushed += lengths[r]["prompt_tokens"] if index == 0 else 1  # a prefill pushes the whole prompt
            if index > 0:
                longest = max(longest, step["end_s"] - last_token[r])
            last_token[r] = step["end_s"]
    return {"admit": promised,
            "allocate": max(step["blocks_in_use"] for step in steps) * trace["block_size"] * kv,
            "batch": sum(len(step["tokens"]) for step in steps) / len(steps),
            "run": 2 * n * pushed,
            "stream": longest}
    ### END SOLUTION


check("1.5", job_ledger)

# %%
if unlocked("1.5"):  # your job_ledger, on the run above
    ledger_mha = job_ledger(trace)
    display(Markdown(f"""
| job | on this run | unit |
|---|---|---|
| Admit | {fmt_bytes(ledger_mha["admit"])} promised at the peak | bytes of KV |
| Allocate | {fmt_bytes(ledger_mha["allocate"])} held at the peak | bytes of KV |
| Batch | {ledger_mha["batch"]:.2f} sequences per forward pass | places |
| Run | {ledger_mha["run"] / 1e12:,.1f} TFLOP | arithmetic |
| Stream | {1e3 * ledger_mha["stream"]:.1f} ms, the longest wait between two tokens | time a user waits |

Two of the five are bytes of the same pool: what admission promised and what allocation actually handed
out. Under paging the second trails the first, because a block is handed out only when a sequence
grows into it; a reserve-to-max engine would hold the whole promise from the first step. And the
longest wait is not an ordinary decode step: look at which step it is."""))
    worst = max(range(1, len(trace["steps"])), key=lambda k: trace["steps"][k]["end_s"] - trace["steps"][k]["start_s"])
    step = trace["steps"][worst]
    print(f"the longest step, {1e3 * (step['end_s'] - step['start_s']):.1f} ms, admitted {step['admitted']} "
          f"({sum(trace['requests'][r]['prompt_tokens'] for r in step['admitted']):,} prompt tokens)")

# %% [markdown]
# ### Exercise 1.1 — the resource each job contends for
#
# Objective 1 in words: set `job_resources` to a dict from each of the five verbs (lower case) to the
# one resource that job hands out, chosen from `"memory"` (bytes that stay spoken for as long as
# their holder lives), `"arithmetic"` (work the chip does per second while code executes on it),
# `"places"` (a fixed number of seats that is dealt out afresh each time round) and `"latency"`
# (time someone outside the machine spends waiting). A resource may serve more than one job. Your
# ledger above measured each one in its own unit; §10.1 gives each job a paragraph.

# %%
### BEGIN SOLUTION 1.1: set job_resources to {"admit": ..., "allocate": ..., "batch": ..., "run": ..., "stream": ...}, each value one of the four resources
job_resources = {"admit": "memory", "allocate": "memory", "batch": "places", "run": "arithmetic",
                 "stream": "latency"}
### END SOLUTION
check("1.1", job_resources)

# %% [markdown]
# Once your map passes, the next cell boards the whole table as the lecture does (it stays hidden
# until then, so that it is your answer first).

# %%
if revealed("1.1"):
    display(Markdown("""
| job | resource it contends for |
|---|---|
| Admit | **memory** — admitting a request promises it KV space for as long as it lives |
| Allocate | **memory** — finding KV space for the prefill and for the growth |
| Batch | places in the next forward pass: *as many as possible* (§2.14), *memory will not allow it* (§2.15) |
| Run | **arithmetic** (and HBM bandwidth) — the kernels themselves |
| Stream | user-visible latency — each step's duration is what the user feels |

Memory twice, arithmetic once. *"It is a memory-management problem wearing a scheduler's clothes."*
The rest of this lab computes the two numbers that make that sentence true."""))

# %% [markdown]
# ### Exercise 1.4 — what a smaller KV cache moves
#
# The {{ gqa.attention }} form of the card's model (`COURSE.gqa`, `{{ gqa.name }}`) has the same weights and the same
# {{ gqa.num_heads }} query heads, but {{ gqa.num_kv_heads }} KV heads instead of {{ mha.num_kv_heads }}. Replay the same twelve requests, arriving before the same
# steps, on it, with the same pool of 600 blocks. **Predict first** — write your guess down — then
# measure with your `job_ledger`: set `gqa_moves` to the set of ledger entries (of `"admit"`,
# `"allocate"`, `"batch"`, `"run"`, `"stream"`) that change by more than 0.1%.

# %%
trace_gqa, _ = job_run(CostModel(COURSE.gqa, GPU), REQUESTS, num_blocks=600)

# %%
### BEGIN SOLUTION 1.4: set gqa_moves to the set of ledger entries that change on the GQA form (measure them with your job_ledger)
mha, gqa = job_ledger(trace), job_ledger(trace_gqa)
gqa_moves = {job for job in mha if abs(gqa[job] - mha[job]) > 1e-3 * abs(mha[job])}
### END SOLUTION
check("1.4", gqa_moves)

# %%
if revealed("1.4"):
    shrink = COURSE.mha.kv_bytes_per_token // COURSE.gqa.kv_bytes_per_token  # MHA's KV heads over GQA's
    part = {2: "a half", 4: "a quarter"}.get(shrink, f"1/{shrink}")
    times = {2: "twice", 4: "four times"}.get(shrink, f"{shrink} times")
    display(Markdown(f"""Only the two memory jobs move, each by {shrink}×: every other number is the same, the longest wait
included. The pool holds the same 600 blocks and the arrivals come at the same steps, so every step
seats the same sequences and pushes the same tokens through the same weights. A decode step does get
faster (it reads {part} of the KV), but the longest wait is a step that carries a prefill, and a
prefill is arithmetic: 2 FLOP per weight per prompt token, which GQA does not touch. The user's worst
wait is set by someone else's prompt — §2.16's spike, and the Oct 14 lecture's subject.
(Had the pool been the card's whole KV budget instead of 600 blocks, {COURSE.gqa.attention} would hold {times} the
blocks, and the batch would have moved too: that is section 4's GQA bar.)"""))

# %% [markdown]
# ## 2. What the arithmetic wants: the ridge-point batch (Lecture 2's 295)
#
# During decode each sequence in the batch produces one token per step. To do it, the GPU streams
# **every weight once** from HBM, whatever the batch size, and each sequence in the batch does a
# multiply and an add with every weight. A weight is `model.dtype_bytes` bytes.
#
# The GPU is balanced — its **ridge point** — when a step asks for as many FLOPs per byte it reads
# as the card can do per byte it can move: peak FLOP/s over HBM bytes/s. Below that the step waits on
# memory; above it, on arithmetic. A larger batch does more arithmetic on the same bytes.
# (Count weight bytes only, as Lecture 2 did. Section 2b puts back the KV reads each sequence adds.)
#
# ### Exercise 1.2 — the ridge-point batch
#
# Write `ridge_batch(model, gpu)`: the batch at which a decode step reaches the ridge point, from
# the fields `gpu.peak_flops` (FLOP/s), `gpu.hbm_bandwidth` (bytes/s) and `model.dtype_bytes` (work
# out the step's FLOPs and bytes for a batch of $B$ first). The checkoff runs it on 16 model/GPU
# pairs, including fp32 and fp8 weights, so typed-in constants will not pass.

# %%
def ridge_batch(model, gpu):
    """The decode batch at which a step's FLOP per byte reaches the GPU's ridge point."""
    ### BEGIN SOLUTION 1.2: return the batch at which a decode step's FLOP per byte equals the GPU's ridge point
    return gpu.peak_flops / gpu.hbm_bandwidth * model.dtype_bytes / 2
    ### END SOLUTION


check("1.2", ridge_batch)

# %% [markdown]
# The ledger (`labsupport.ledger`, which every later lab uses) computes the same quantity; the next
# cell shows the formula and its arithmetic once your function passes:

# %%
ridge = ledger.ridge_batch(COURSE.mha, GPU)
if revealed("1.2"):
    display(Markdown(r"""With $N$ parameters of $b$ bytes and a batch of $B$: FLOP per step $= 2NB$, bytes per step
$\approx Nb$, so the intensity is $2B/b$ FLOP/byte. Setting it equal to the ridge, peak $P$ over
bandwidth $W$:

$$B^\ast = \frac{P}{W}\cdot\frac{b}{2}.$$"""))
    print(f"B* = {GPU.peak_flops / 1e12:,.0f} TFLOP/s ÷ {GPU.hbm_bandwidth / GB:,.0f} GB/s × {COURSE.mha.dtype_bytes} B ÷ 2 "
          f"= {ridge:.1f}")

# %% [markdown]
# On a log–log plot of attainable FLOP/s against the batch, the ridge point is the corner of the
# roofline. The shaded region is where memory will not let you go — the subject of the next section.

# %%
roofline.decode_roofline_figure(COURSE.mha, GPU, s_max=4096).show()

# %% [markdown]
# ### 2b. With the KV reads counted, the ridge is out of reach
#
# A decode step also reads every cached key and value of every sequence in the batch, and does
# attention's arithmetic on them: $4\,L\,H\,d$ FLOPs per cached token (the $q \cdot k$ and the weighted
# sum of $v$, two FLOPs per multiply-add, every layer and query head) against $2\,L\,H_{kv}\,d\,b$ bytes.
# For $B$ sequences of $S$ tokens:
#
# $$\text{intensity}(B) = \frac{B\,(2N + 4LHd\,S)}{Nb + B\,S\cdot\text{KV per token}}
#   \;\xrightarrow{\;B\to\infty\;}\; \frac{2N + 4LHd\,S}{S\cdot\text{KV per token}}.$$
#
# Past some batch each extra sequence brings as many bytes as FLOPs, and the line goes flat. For the
# card's model in MHA form (`{{ mha.name }}`), $4LHd = {{ '{:,}'.format(4 * mha.num_layers * mha.num_heads * mha.head_dim).replace(',', '{,}') }}$ FLOPs per token is numerically its KV bytes per token, so the
# flat level is $2N / (S\cdot\text{KV}) + 1$: it reaches the ridge only if $S$ is under about {{ round(ledger.ridge_reachable_tokens(mha, gpu)) }}
# tokens. Every chat sequence is longer.

# %%
for mdl in (COURSE.mha, COURSE.gqa):
    print(f"{mdl.name:>16}: at S = 640 the intensity flattens at {ledger.decode_intensity_limit(mdl, 640):6.1f} "
          f"FLOP/byte (ridge {GPU.peak_flops / GPU.hbm_bandwidth:.0f}); any batch reaches the ridge only for "
          f"S < {ledger.ridge_reachable_tokens(mdl, GPU):.0f} tokens; at B = 200 it is "
          f"{ledger.decode_intensity(mdl, 200, 640):.1f}")
# the S curves drawn: weights only, the longest S that still reaches this card's ridge, a chat, S_max
roofline.intensity_figure(COURSE.mha, GPU, seq_lengths=(0, round(ledger.ridge_reachable_tokens(COURSE.mha, GPU)), 640,
                                                        4096)).show()

# %% [markdown]
# So the ridge-point batch, Lecture 2's 295, is a number for the weights alone. With real sequence lengths
# an MHA decode step never becomes compute-bound, however large the batch — which is why the rest of Part II
# attacks the *bytes* (GQA's smaller cache lifts the flat level {{ mha.kv_bytes_per_token / gqa.kv_bytes_per_token:g }}×; the KV-cache lecture of Oct 28 goes further),
# and why the batch memory permits still matters: it sets how many sequences share each pass over the
# weights.

# %% [markdown]
# ## 3. What the memory permits (Lecture 2's 29)
#
# The first KV cache anyone writes reserves, for every request, room for the longest sequence it is
# allowed — $S_{max}$ tokens — because its keys and values are one tensor whose shape must be fixed
# when it is allocated, however short the sequence turns out to be.
#
# The card's memory holds three things: the weights (every parameter, `model.dtype_bytes` bytes
# each), a **reserve** of 4 GB for activations and workspace (`reserved_bytes`, default
# `labsupport.specs.LECTURE_RESERVED_BYTES`), and the KV cache in whatever is left. Watch the units:
# the card's memory is decimal GB (its marketed {{ gpu.hbm_bytes / GB:g }} GB), the per-token KV is binary KiB.
#
# ### Exercise 1.3 — the memory-limited batch
#
# Write `memory_batch(model, gpu, s_max)`: how many sequences a reserve-to-max cache can hold at
# once. You need `gpu.hbm_bytes`, `model.num_params`, `model.dtype_bytes`, and the KV bytes per token
# from lab 00 (`model.kv_bytes_per_token` has it). A card whose weights leave no room holds zero
# sequences. The checkoff tries sixteen model/GPU/S_max combinations.

# %%
def memory_batch(model, gpu, s_max, reserved_bytes=LECTURE_RESERVED_BYTES):
    """How many S_max-token reserve-to-max KV slots fit beside the weights and the reserve."""
    ### BEGIN SOLUTION 1.3: return how many sequences a reserve-to-max cache holds beside the weights and the reserve (0 if none)
    budget = gpu.hbm_bytes - model.num_params * model.dtype_bytes - reserved_bytes
    slot = s_max * model.kv_bytes_per_token
    return max(0, int(budget // slot))
    ### END SOLUTION


check("1.3", memory_batch)

# %% [markdown]
# And from the ledger, with the formula and every byte written out once your function passes:

# %%
kv = ledger.kv_bytes_per_token(COURSE.mha)
budget = ledger.kv_budget_bytes(COURSE.mha, GPU)
slot = ledger.naive_slot_bytes(4096, kv)
memory = ledger.naive_concurrency(budget, 4096, kv)
if revealed("1.3"):
    display(Markdown(r"""$$\text{KV budget} = \text{HBM} - \text{weights} - \text{reserve}, \qquad
\text{slot} = S_{max} \times \text{KV per token}, \qquad
B_{mem} = \left\lfloor \frac{\text{KV budget}}{\text{slot}} \right\rfloor$$"""))
    print(f"weights    {fmt_bytes(COURSE.mha.weight_bytes)}")
    print(f"KV budget  {fmt_bytes(budget)}")
    print(f"slot       {fmt_bytes(slot)}  (4,096 tokens × {kv:,} B)")
    print(f"B_mem      {budget / slot:.2f} slots → {memory}")
    print(f"the gap    {ridge:.1f} / {memory} = {ridge / memory:.1f}×")

# %% [markdown]
# ## 4. The collision, on any card
#
# Both bars come from the ledger. Before you touch anything, predict: which controls move the blue
# bar, and which move the orange one?
#
# Then try:
#
# * **GQA.** Switch the model to `{{ card.contrast.name }}` ({{ card.contrast.num_kv_heads }} KV heads instead of {{ model.num_kv_heads }}). Which bar moves, and
#   by how much? Why not the other?
# * **Long context.** Slide S_max to 32,768, the "advertise long context" setting of §10.2. Then to
#   131,072 (Exercise 1's brochure).
# * **A bigger card.** The H200 has 141 GB at 4.8 TB/s and the H100's peak (the H100: 80 GB at 3.35 TB/s).
#   From the H100 to the H200 the ridge *falls*; why?
# * **A bigger model.** `llama-3-70b` on an H100: what is left for the cache?

# %%
roofline.batch_gap_panel()

# %% [markdown]
# What you should have seen: the ridge point is a property of the GPU (and of bytes per weight); it
# does not care about the model's shape or the sequence length. The memory batch depends on
# everything else — the model's KV bytes per token, the card's memory, and above all **S_max**, a
# number that says nothing about how long sequences really are. On this card at S_max = 4,096, the
# MHA form's {{ N.naive_concurrency }} slots stand against a ridge of {{ N.ridge_batch:.0f }}; the {{ gqa.attention }} form holds {{ NG.naive_concurrency }},
# {{ 'still short of it' if NG.naive_concurrency < NG.ridge_batch else 'past it: GQA alone closes the gap, until S_max grows' }}.
# Lab 02 measures how much of section 3's {{ N.naive_concurrency }} slots is ever filled.

# %% [markdown]
# ## 5. The job that cannot be undone
#
# Admission in an LLM engine is a bet on an unknown length: the engine knows the prompt but not how
# many tokens the model will emit. The lecture asks the room which of the five jobs the engine can get
# wrong in a way it cannot recover from, and answers: **admit** — the promise has already been made.
# A bad batch costs one step (it is re-chosen every iteration), a bad allocation can be freed, a slow
# kernel costs latency once. Your ledger shows the promise and the blocks side by side: when the
# resident sequences grow into what was promised and the pool runs dry, the engine's only moves are to
# refuse others, preempt someone, or crash. That is §10.5, and lab 06.

# %% [markdown]
# ## 6. Two walls, one of them made of software
#
# Lecture 2 presented 29 as a hardware fact. It is not one wall but two, and one is a data structure.
# Had the cache held only what each sequence *uses* — a 512-token prompt and 128 generated tokens,
# packed in 16-token blocks, which is §10.3 — the same budget would hold several times more
# sequences: the lecture says "29 to 200, 68% of the way to the ridge point". Lab 03 builds that
# cache and counts them exactly; until then, the round figure is enough to see that the
# second wall is software.

# %% [markdown]
# ## Self-check
#
# 1. Name the five jobs and the resource each contends for. Which two are about memory?
# 2. Why does a {{ gqa.attention }} model move the memory bar but not the compute bar?
# 3. Double the HBM bandwidth of a card and keep its peak FLOP/s. What happens to the ridge-point
#    batch, and is that good news?
# 4. Raise S_max from 4,096 to 32,768 with the same workload. By what factor does the memory batch
#    fall, and has anything about the requests changed?
#
# The answers show once the checkoffs they lean on (1.1's map, 1.2's ridge, 1.3's memory batch) pass:

# %%
if revealed("1.1", "1.2", "1.3"):
    shrink = COURSE.mha.kv_bytes_per_token / COURSE.gqa.kv_bytes_per_token
    wider = replace(GPU, hbm_bandwidth=2 * GPU.hbm_bandwidth)  # the same card, twice the bandwidth
    on = "the lecture's card" if COURSE.is_lecture else f"the course's card, {GPU.name}"
    long_batch = ledger.naive_concurrency(budget, 32_768, kv)
    display(Markdown(f"""1. Admit (memory: a promise of KV space), allocate (memory: the KV space itself), batch (the next
   forward pass), run (arithmetic and bandwidth), stream (user-visible latency). Admit and allocate.
2. GQA shrinks KV bytes per token (by {shrink:g}× here); the ridge point depends only on the GPU's peak over
   bandwidth and the bytes per weight, which GQA leaves alone.
3. It halves ({ridge:.1f} → {ledger.ridge_batch(COURSE.mha, wider):.1f} on {on}): the card is balanced at
   a smaller batch. Good news for latency, but only if memory can hold even that many sequences.
4. The slot grows {32_768 // 4096}×, so {memory} becomes {long_batch} — a factor of {memory / long_batch:.1f} (floors).
   Nothing about the requests changed: that is §10.2's point, and lab 02's."""))

# %% [markdown]
# Next: **Lab 02 — the naive allocator, and where the cache goes.**
