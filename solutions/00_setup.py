# %% [markdown]
# # Lab 00 — Setup: your machine, the labs, and how they are graded
#
# Lecture 10 opens Part II with one number, **29 against 295**, and spends seventy-five minutes
# showing that most of the gap is a data structure. These labs rebuild that argument with real
# mechanisms you can poke at: an allocator, a paged KV cache on real tensors, a Triton kernel, a tiny
# transformer and an engine loop. This lab makes sure your machine can run them and shows you how a
# lab works, in ten minutes.
#
# **By the end of this lab you can**
#
# 1. run `labsupport`'s doctor and read what it says about your machine (GPU or CPU-only);
# 2. recognise the three kinds of cell in every lab — prose, runnable code, and exercises with a
#    checkoff — and grade yourself;
# 3. keep GB, GiB and KiB apart, which every later lab depends on (learning objective 2 of the
#    lecture asks you to *compute* memory waste, and a units slip is the most common way to get it wrong).

# %% [markdown]
# ## 1. What is this machine?
#
# Always import `labsupport` first, before anything that imports Triton: on a machine without a CUDA
# GPU it switches Triton to its interpreter, which must happen before Triton loads. Then ask the
# doctor. Its output depends on your machine, so yours will differ from your neighbour's.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
from labsupport import card, ledger
from labsupport.cli import doctor
from labsupport.course.checkoff import check, revealed, unlocked
from IPython.display import Markdown, display
from labsupport.specs import LLAMA3_8B, LLAMA3_70B
from labsupport.units import fmt_bytes, fmt_gb, fmt_gib
from labsupport.viz import roofline

COURSE = card.card()  # the course's GPU and model (course.toml); the lecture's are an H100 SXM and its 7B MHA model

# %% tags=["givens"]
# The givens: the quantities this lab's exercises are posed on. Compute your answers from these names;
# the grader re-runs your code on other values of them.
KV_KIB = 512  # card=model.kv_kib_per_token: KV per token of the course's model ({model}), in KiB (binary kilobytes)

# %% tags=["nbval-ignore-output"]
report = doctor.report()
print(doctor.format_report(report))

# %% [markdown]
# The same report is one command away in a terminal: `python -m labsupport doctor`. Read the last
# line first: **OK** means every lab can run here. A `PROBLEM` line says what to fix.
#
# ### CPU-only mode
#
# Most of you will run these labs on a laptop. That is fine, and it is a deliberate design choice:
#
# * **Every number derived in the labs is the same on every machine.** Memory budgets, slot sizes,
#   utilization, the swap-versus-recompute break-even: they are arithmetic on the *course's* card — the GPU
#   and the model it names, `{{ gpu.name }}` and `{{ model.name }}` (the lecture's are an H100 and a 7B MHA
#   model) — computed exactly by `labsupport.ledger`, not measured on your machine.
# * **Mechanisms run for real, at small sizes.** The block allocator, the paged cache's tensors, the
#   copy-on-write fork and the engine loop all run on CPU tensors; the labs shrink the sizes so each
#   notebook finishes in under a minute.
# * **Kernels run through Triton's interpreter.** The same Triton source that compiles for a GPU runs
#   on the CPU, slowly (seconds for what a GPU does in microseconds). Timings measured on a CPU say
#   nothing about a GPU, and the labs say so wherever they show one.
#
# The cell below tells you which mode this kernel is in.

# %% tags=["nbval-ignore-output"]
if report["cuda"]:
    print(f"GPU mode: {report['gpu']['name']}; Triton kernels are compiled.")
else:
    print(f"CPU-only mode: Triton runs in its interpreter ({report['triton_mode']}); sizes are kept small.")

# %% [markdown]
# ## 2. How a lab works
#
# Every lab follows the lecture section by section. You will meet three kinds of code cell:
#
# 1. **Cells you just run.** They compute the lecture's quantities on the course's card with `labsupport`,
#    draw charts, and show sliders. Change their inputs freely.
# 2. **Exercises.** A comment `# TODO N.M: …` marks the code you write. Where the answer is a value,
#    the line below it reads `name = ...` (Python's `...`, a placeholder); inside a function it is
#    `raise NotImplementedError(…)`. Replace the placeholder with your code. Until you do, nothing
#    breaks: *Run → Run All Cells* runs the whole lab, charts and sliders included, and each
#    unfinished exercise's checkoff says so in one line. A cell that runs *your* function waits, in
#    one line, until its checkoff has passed.
# 3. **Checkoffs.** `check("N.M", answer)` grades your answer — a number, a choice, or your function
#    itself. A function checkoff calls your code on inputs you have not seen (other GPUs, other models)
#    and compares with `labsupport`'s real mechanisms. When it passes you see exactly one line:
#
#    ```
#    ✅ Checkoff N.M passed
#    ```
#
#    Until you have written it, the line is `⬜ Checkoff N.M not attempted — <the exercise>`. A wrong
#    answer gets one line that says what was wrong and gives a hint, never the answer — and, if your
#    own code raised an error, the lines of *your* code it came from. For example, answering {{ G.KV_KIB * 1000:, }}
#    to the first checkoff below says
#
#    ```
#    ❌ Checkoff 0.1: you gave {{ G.KV_KIB * 1000:, }} B, which is not exactly right; it is too low. That reads KiB as the decimal kB, … Hint: KiB is the binary kilobyte, …
#    ```
#
# **Givens.** Near the top of every lab a cell marked `givens` binds the quantities its exercises are
# posed on (the course's GPU and model, the lecture's lengths, ...). Compute every answer *from those names*: when
# your notebook is graded, your code is re-run on other values of them, so a number typed in or copied
# from the prose, the README or a neighbour is right only once. Try each exercise before reading the
# README's ledger, which is the lecture's numbers worked out.
#
#    The last cell of every lab is a scoreboard of this kernel's checkoffs.
#
# **Grading yourself.** From a terminal in the repository:
#
# ```
# python -m labsupport grade notebooks/00_setup.ipynb          # scoreboard: passed / failed / not attempted
# python -m labsupport grade notebooks/*.ipynb --json          # the same for every lab, as JSON
# pytest --nbval-lax notebooks/00_setup.ipynb                  # runs it, and compares each checkoff's line
# ```
#
# `grade` runs your saved notebook from top to bottom in a sandbox (Linux's bubblewrap; on a machine
# without it, add `--trusted`: it is your own notebook), once on the course's givens and again on
# hidden ones, ignoring whatever outputs are stored in it, so **save before grading**, and make sure the
# notebook runs from a fresh start (*Kernel → Restart Kernel and Run All Cells*), not only in the order
# you happened to run it.

# %% [markdown]
# ## 3. Bytes, and the three ways to write a thousand of them
#
# The course's model (`{{ model.name }}`) stores **{{ G.KV_KIB:,g }} KiB** of keys and values for every token it
# holds. Its GPU (`{{ gpu.name }}`) has **{{ gpu.hbm_bytes / GB:g }} GB** of memory on its box. Those two prefixes
# are not the same kind of thousand:
#
# | prefix | means | example |
# |---|---|---|
# | kB, MB, GB | powers of 10: $10^3, 10^6, 10^9$ bytes | the card's "{{ gpu.hbm_bytes / GB:g }} GB", the {{ N.kv_budget_bytes / GB:.1f }} GB KV budget |
# | KiB, MiB, GiB | powers of 2: $2^{10}, 2^{20}, 2^{30}$ bytes | {{ G.KV_KIB:,g }} KiB per token, a {{ 16 * gqa.kv_bytes_per_token / MiB:g }} MiB block |
#
# Mixing them costs 2.4% at the kilo level and 7.4% at the giga level — enough to turn the lecture's
# 29 reserve-to-max slots on its H100 (lab 01) into 28 if the 4 GB reserve is read as 4 GiB. The labs
# write every byte count exactly and name its unit; `labsupport.units` prints both readings:

# %%
hbm, budget = COURSE.gpu.hbm_bytes, ledger.kv_budget_bytes(COURSE.model, COURSE.gpu)  # the card's memory, its KV budget
print(f"{hbm / 1e9:g} GB".ljust(11) + "=", fmt_bytes(hbm))
print("2 GiB      =", fmt_bytes(2 * 2**30))
print(f"{budget / 1e9:g}e9 B".ljust(11) + "=", fmt_gb(budget), "=", fmt_gib(budget))

# %% [markdown]
# ### Exercise 0.1 — your first checkoff
#
# The givens cell says the model keeps `KV_KIB` KiB of keys and values per token. Set `kv_bytes` to
# that amount **in bytes**, written as a Python expression of `KV_KIB` (let Python do the
# arithmetic), then run the cell.

# %%
### BEGIN SOLUTION 0.1: set kv_bytes to KV_KIB KiB in bytes, as a Python expression of KV_KIB
kv_bytes = KV_KIB * 2**10
### END SOLUTION
check("0.1", kv_bytes)

# %% [markdown]
# ### Exercise 0.2 — your first function checkoff
#
# Where do {{ G.KV_KIB:,g }} KiB per token come from? When the model produces a new token, attention in each of its
# `num_layers` layers scores that token against every earlier token and mixes what the earlier
# tokens contributed; the cache keeps, for each earlier token, exactly what that step reads back
# instead of recomputing it. The arguments name the shape of what attention reads: `num_kv_heads`
# heads of `head_dim` elements, each element `dtype_bytes` bytes (2 for bf16).
#
# Write `kv_bytes_per_token`: the bytes the cache stores for one token, over
# the whole model. The checkoff calls it on fourteen shapes — the lecture's 7B, its GQA-8 variant,
# Llama 3 70B, fp32 and fp8 caches, toy shapes and six you have not seen — and compares each with an
# independent count.

# %%
def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes=2):
    """Bytes the KV cache stores per token, over the whole model."""
    ### BEGIN SOLUTION 0.2: return the KV bytes per token from the four arguments
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes
    ### END SOLUTION


check("0.2", kv_bytes_per_token)

# %%
if revealed("0.2"):
    display(Markdown(r"""Two tensors (K and V) × layers × KV heads × head dim × bytes per element:

$$\text{KV bytes per token} \;=\; 2 \times L \times n_{kv} \times d_{head} \times b$$"""))

# %% [markdown]
# `labsupport` has the same quantity on every model preset, which is what the later labs use. The cell
# below runs **your** `kv_bytes_per_token` on the shapes of the course's presets and sets it beside the
# preset's own count (it waits for 0.1 and 0.2: the card's model is among them, and its count is their answer):

# %%
if revealed("0.1") and unlocked("0.2"):
    for model in dict.fromkeys((COURSE.mha, COURSE.gqa, LLAMA3_8B, LLAMA3_70B)):  # the card's model, MHA and GQA
        per_token = kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, model.dtype_bytes)
        agrees = "agrees" if per_token == model.kv_bytes_per_token else f"labsupport has {model.kv_bytes_per_token:,} B"
        print(f"{model.name:>16}: yours {per_token:,} B per token = {per_token / 2**10:,.0f} KiB ({agrees}); "
              f"a 4,096-token sequence holds {fmt_gb(4096 * per_token)}")

# %% [markdown]
# ## 4. Do sliders and charts work here?
#
# Every lab has panels like the one below: controls on top, a chart that redraws when you move them,
# and a line stating the exact numbers. Drag the slider (or click it and use the arrow keys). If you
# see the slider and the chart redraws, JupyterLab's widgets work on your machine. If you see
# *"Error displaying widget"* instead, run the cell again; if that does not help, restart JupyterLab
# from the repository's environment (`make lab`).
#
# The panel appears once Exercise 0.2 has passed (its readout spells out the count 0.2 asks for).
# The slider is the number of KV heads. Grouped-query attention (GQA) lets several query heads share
# one KV head; the cache shrinks by the group size, which is why the lecture keeps returning to a
# "GQA-8" variant of its model.

# %%
if revealed("0.2"):  # its readout writes out 0.2's count: it shows once yours passes
    display(roofline.kv_heads_panel())

# %% [markdown]
# ## Self-check
#
# 1. Your laptop has no GPU. Will the labs' figure for the naive allocator's concurrency on the course's
#    card be different from your neighbour's, who has a GPU?
# 2. Which is larger, {{ gpu.hbm_bytes / GB:g }} GB or {{ gpu.hbm_bytes / GB:g }} GiB, and by how many bytes?
# 3. A checkoff prints `⬜ Checkoff 1.2 not attempted — …`. Did something break?
#
# The answers show once 0.1 (the units they lean on) passes:

# %%
if revealed("0.1"):
    hbm = round(COURSE.gpu.hbm_bytes / 10**9)  # the card's box figure, in (decimal) GB
    gib, gb = hbm * 2**30, hbm * 10**9
    # the lecture's card is named as the lecture's; another card by its catalogue names
    on = ("the lecture's H100 and model" if COURSE.is_lecture
          else f"the course's {COURSE.gpu.name} and {COURSE.model.name}")
    display(Markdown(f"""1. No. It is arithmetic on {on} (`labsupport.ledger`), identical everywhere.
   Only measured timings depend on your machine.
2. {hbm} GiB = {gib:,} B, larger than {hbm} GB = {gb:,} B by {gib - gb:,} B ({100 * (gib - gb) / gb:.1f}%).
3. No: that is exercise 1.2 waiting for you. Replace the placeholder under its comment with your code."""))

# %% [markdown]
# Next: **Lab 01 — five jobs, and the lecture's 29 against 295.**
