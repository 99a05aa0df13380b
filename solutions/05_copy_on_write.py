# %% [markdown]
# # Lab 05 — Copy-on-write: n completions for the price of one prompt (§10.4)
#
# Paging was motivated by capacity, but the part that reshapes the rest of the semester is that a
# sequence's KV is now a **list of references to blocks** rather than an owned array — so two
# sequences can name the same block. Reference-count the blocks, copy one only when someone is about
# to write into it while others still read it, and you have **copy-on-write for KV**.
#
# This lab runs that mechanism for real: the tiny transformer samples eight completions off one
# prompt through the paged cache, and every number below is read off the allocator's reference
# counts and block counts, then compared with the closed form.
#
# **Learning objectives served** (the lecture's numbering)
#
# * **Objective 5** — explain copy-on-write sharing for parallel sampling, and compute the sharing
#   factor for a fan-out of n completions off a common prompt.
# * **Objective 4**, revisited — what a block table makes possible beyond capacity.
# * A preview of the prefix-cache lecture (Nov 9): the same mechanism across requests, measured on a
#   real trace.
#
# Timing in the lecture: minutes 36–46. Here: about 30 minutes.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
import torch

from labsupport import card, ledger
from labsupport.course.checkoff import check, revealed, unlocked
from IPython.display import Markdown, display
from labsupport.engine import Engine
from labsupport.kvcache import PagedKVCache
from labsupport.model import load_tiny_model
from labsupport.sampling import SamplingParams, sample_token
from labsupport.measure.sharing import fanout_in_pool, measure_fanout, measure_fork_cost, replay_prefix_cache
from labsupport.specs import GB, LECTURE_7B, MiB  # LECTURE_7B: only where a line states what the lecture printed
from labsupport.units import fmt_gb
from labsupport.viz import sharing as viz_sharing
from labsupport.workloads import FETCH_COMMAND, load_mooncake

# The tiny model's matrices are far too small to gain from several threads, and on a shared
# machine extra threads only wait for each other: one thread is fastest and reproducible.
torch.set_num_threads(1)
COURSE = card.card()  # the course card (course.toml): its GPU, and its model in MHA form (the lecture's 7B by default)
GPU = COURSE.gpu
# How the printouts name them: the lecture's words on the lecture's card, the catalogue's names on another.
MODEL_NAME = "the lecture's 7B" if COURSE.is_lecture else COURSE.mha.name
GPU_NAME = "H100" if COURSE.is_lecture else GPU.name
model, tok, trained = load_tiny_model()
cfg = model.cfg
print(f"tiny model: {cfg.num_layers} layers, {cfg.num_heads} query heads, {cfg.num_kv_heads} KV heads × "
      f"{cfg.head_dim}, {cfg.num_params:,} parameters, {'trained on the lecture' if trained else 'RANDOM weights'}")
print(f"KV per token: 2 × {cfg.num_layers} × {cfg.num_kv_heads} × {cfg.head_dim} × 4 B (fp32) = "
      f"{model.spec().kv_bytes_per_token:,} B")

# %% tags=["givens"]
# The givens: the quantities the exercises below are posed on. Compute your answers from these
# names; the grader re-runs your code on other values of them.
N_BRANCHES = 8  # completions forked off one prompt
BLOCK = 16  # tokens per KV block
PROMPT_TOKENS = 100  # Exercise 5.3's shared prompt, in tokens
WRITERS = 5  # Exercise 5.3: branches 0 .. WRITERS - 1 have written their first token

# %% [markdown]
# ## 1. One prompt, eight branches: the board
#
# Prefill one prompt into a real `PagedKVCache` as branch 0, then **fork** the other branches off it
# (the vLLM paper's convention: the prompt's own sequence is the first branch). A fork copies no
# tensor at all: the child gets a copy of the parent's *block table*, and every block it names gets
# one more reference. The prompt below is 41 characters — 41 tokens for the character-level model —
# so at block size 16 it fills two blocks and 9 slots of a third.

# %%
prompt_text = "Copy-on-write: one prompt, eight branches"
prompt_ids = tok.encode(prompt_text)
cache = PagedKVCache(32, BLOCK, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
first_logits = model.forward_paged(cache, prefills=[(0, prompt_ids)])  # one prefill, for branch 0
for branch in range(1, N_BRANCHES):
    cache.fork(0, branch)  # a table copy and a reference each: no K/V moves
alloc = cache.allocator
print(f"{len(prompt_ids)} prompt tokens → block table {alloc.table(0)}; every branch names the same blocks")
print("ref counts:", {b: alloc.ref_count(b) for b in alloc.table(0)}, "| blocks in use:", alloc.num_used_blocks)
viz_sharing.refcount_board_figure(alloc, range(N_BRANCHES), title="One prompt's blocks, eight arrows each: refcount 8").show()

# %% [markdown]
# Now **one branch writes a token**. Its next token belongs in slot 9 of block 2 — a block the other
# branches still read. Writing in place would change their history, so the allocator takes a fresh
# block, the cache copies the shared block into it (the 9 prompt tokens come along), and the branch's
# table now names the copy. What that does to the reference counts is Exercise 5.3's question: the
# board after this write shows once 5.3 passes.

# %%
writer = 3
before = alloc.table(writer)
token = sample_token(first_logits[0], SamplingParams(temperature=0.8), seed=7, branch=writer, position=0)
model.forward_paged(cache, decodes=[(writer, token)])  # one decode step for branch 3 alone
after = alloc.table(writer)
src, dst = before[-1], after[-1]
print(f"branch {writer}: table {before} → {after}: its last entry now names block {dst}, a copy of block {src}")
same = all(torch.equal(pool[dst, :9], pool[src, :9]) for pool in (*cache.k_cache, *cache.v_cache))
print(f"the copy holds the same 9 prompt tokens' K and V, bit for bit: {same}")

# %% [markdown]
# Two things to notice. The **full** blocks 0 and 1 were not touched: nobody ever writes into a full
# block again, so they stay shared for as long as the branches live. And only the writer paid: the
# other branches did not copy anything.
#
# ### Exercise 5.1 — the copy-on-write append
#
# Write the piece of the allocator that does this. `cow_append` reserves the slot for one more token
# of sequence `seq`, working on plain Python structures:
#
# * `tables[seq]` — the sequence's block table (a list of block ids), edited in place;
# * `seq_lens[seq]` — how many tokens it holds;
# * `ref_counts[b]` — how many table entries name block `b` (0 for a free block);
# * `free_blocks` — a list of free block ids; take one with `free_blocks.pop(0)`.
#
# Return `(slot, cow)`: `slot = block_id * block_size + offset` for the new token, and `cow` either
# `None` or `(src, dst)`, the block to copy from and the block to copy into (the cache does the
# tensor copy). **Copy only when you must.** The checkoff replays fork/append/free histories through
# your function and the real `BlockAllocator` side by side and compares every table and count.

# %%
def cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
    """Reserve the slot of one more token of `seq`; copy-on-write its last block if it is shared."""
    ### BEGIN SOLUTION 5.1: reserve the new token's slot, copying the last block only when you must; return (slot, cow)
    table = tables[seq]
    n = seq_lens[seq]
    offset = n % block_size
    cow = None
    if offset == 0:  # the last block is full (or there is none): the token starts a new block
        block = free_blocks.pop(0)
        ref_counts[block] = 1
        table.append(block)
    else:
        block = table[-1]
        if ref_counts[block] > 1:  # someone else still reads this block: copy before writing
            new = free_blocks.pop(0)
            ref_counts[new] = 1
            ref_counts[block] -= 1
            table[-1] = new
            cow = (block, new)
            block = new
    seq_lens[seq] = n + 1
    return block * block_size + offset, cow
    ### END SOLUTION


check("5.1", cow_append)

# %% [markdown]
# Your function on the board's situation — eight holders of a 41-token prompt, branch 3 writes:

# %%
if unlocked("5.1"):
    tables = {b: [0, 1, 2] for b in range(N_BRANCHES)}
    seq_lens = {b: len(prompt_ids) for b in range(N_BRANCHES)}
    ref_counts = [N_BRANCHES] * 3 + [0] * 29
    free_blocks = list(range(3, 32))
    print("append to branch 3 →", cow_append(writer, tables, seq_lens, ref_counts, free_blocks, BLOCK),
          "| its table", tables[writer])
    print("append to branch 3 again →", cow_append(writer, tables, seq_lens, ref_counts, free_blocks, BLOCK),
          "(its block is private now: no copy)")

# %% [markdown]
# ## 2. Parallel sampling through the engine
#
# The engine does all of this for a request with `n > 1`: it prefills the prompt **once**, forks it
# into n branches, and each branch samples its own continuation (each draws its own random numbers,
# seeded by request, branch and position). The tiny model learned the lecture almost by heart, so a
# prompt copied from the lecture pins its continuation and the branches would mostly agree. This
# prompt is a sentence the model never read — five full blocks and three tokens of a sixth — so the
# next tokens are genuinely uncertain and the eight branches go their own ways:

# %%
fanout_prompt = tok.encode("Copy-on-write: every branch below shares this prompt's blocks until it writes. The ",
                           errors="replace")
NEW_TOKENS = 48
engine = Engine(model, num_blocks=256, block_size=BLOCK)
rid = engine.add_request(fanout_prompt, max_new_tokens=NEW_TOKENS, n=N_BRANCHES,
                         sampling=SamplingParams(temperature=0.8, seed=2026))
result = engine.run()
outputs = result.requests[rid].outputs
for branch, out in enumerate(outputs):
    print(f"branch {branch}: …{tok.decode(out)!r}")
print(f"{len({tuple(o) for o in outputs})} distinct continuations of {N_BRANCHES}; the prompt's "
      f"{len(fanout_prompt) // BLOCK} full blocks are stored once")

# %% [markdown]
# How many blocks did that take? The engine recorded the blocks in use after every step; Exercise 5.2
# below has you count them yourself, and then compares your count with the engine's.

# %% [markdown]
# ### The same fork, on a real model
#
# The tiny model's branches are gibberish because the model is, not because of the fork. Nothing in the
# engine knows whose weights it runs, so give it a real checkpoint: **SmolLM2-135M-Instruct** (Hugging
# Face, Apache-2.0; 30 layers, 9 query heads sharing 3 KV heads; installed by `make lab`), in bf16 — on a
# 2-core CPU it ran this fan-out in about half of float32's time. One chat prompt, `n=8`: the prompt (the chat
# template's system turn included) is prefilled once and forked; each branch samples its own reply, up to
# 24 tokens, and a branch that writes its end-of-turn token retires early. The board is the pool as the first
# step left it — the prompt prefilled, the seven forks made, each branch's first token sampled but not yet
# written:

# %%
import copy

from labsupport import pretrained

smol = pretrained.try_load_smollm2()  # (model, tokenizer); None, after one line naming the install command
if smol is not None:
    smol_model, smol_tok = smol
    chat_prompt = smol_tok.chat("Finish this sentence: a good teacher is")
    smol_engine = Engine(smol_model, num_blocks=32, block_size=16)
    smol_rid = smol_engine.add_request(chat_prompt, max_new_tokens=24, n=8, sampling=SamplingParams(
        temperature=0.8, seed=2026, stop_token_ids=smol_tok.stop_ids))
    pools = []  # the allocator as each step left it, while all eight branches still held their blocks
    for _ in smol_engine.iterations():
        if len(smol_engine.allocator.block_tables) == 8:
            pools.append(copy.deepcopy(smol_engine.allocator))
    smol_result = smol_engine.result()
    for branch, out in enumerate(smol_result.requests[smol_rid].outputs):
        ended = bool(out) and out[-1] in smol_tok.stop_ids  # wrote its end-of-turn token (else cut at 24)
        print(f"branch {branch}: {' '.join(smol_tok.decode(out, skip_special=True).split())}{'' if ended else ' …'}")
    print(f"{len(chat_prompt)} prompt tokens = {len(chat_prompt) // 16} full blocks of 16 and {len(chat_prompt) % 16} "
          f"tokens of one more; the eight replies took {smol_result.counters.steps} engine steps")
    viz_sharing.refcount_board_figure(pools[0], sorted(pools[0].block_tables),
                                      title="SmolLM2-135M, n = 8, after the fork: every branch names the prompt's "
                                            "blocks").show()

# %% [markdown]
# Every block the prompt filled, the partly filled last one too, is named eight times and stored once.
# What the branches' first writes do to those counts is Exercise 5.3's question (the board of this fan-out
# after the writes shows once 5.3 passes). And what does one of those slots hold? §10.2's ledger
# says $2 \times L \times n_{kv} \times d_{head} \times b$ bytes per token; compute it from the loaded
# model's shape, and read what the live cache's K and V tensors really hold per token slot:

# %%
if smol is not None:
    smol_spec = smol_model.spec()  # a ModelSpec of the loaded checkpoint: its shape, and the bytes of its dtype
    ledger_bytes = ledger.kv_bytes_per_token(smol_spec)
    smol_cache = smol_engine.cache
    kv_tensors = (*smol_cache.k_cache, *smol_cache.v_cache)  # a K and a V pool per layer: [blocks, slots, KV heads, D]
    pool_bytes = sum(t.nbytes for t in kv_tensors)
    slots = smol_cache.num_blocks * smol_cache.block_size
    print(f"the ledger: 2 × {smol_spec.num_layers} layers × {smol_spec.num_kv_heads} KV heads × {smol_spec.head_dim} × "
          f"{smol_spec.dtype_bytes} B ({str(smol_cache.dtype).removeprefix('torch.')}) = {ledger_bytes:,} B per token")
    print(f"the cache:  {len(kv_tensors)} tensors of {list(kv_tensors[0].shape)} hold {pool_bytes:,} B for "
          f"{smol_cache.num_blocks} blocks × {smol_cache.block_size} slots = {pool_bytes // slots:,} B per token slot")
    mha_bytes = 2 * smol_spec.num_layers * smol_spec.num_heads * smol_spec.head_dim * smol_spec.dtype_bytes
    print(f"with a KV head per query head (MHA, {smol_spec.num_heads}) it would be {mha_bytes:,} B: GQA-"
          f"{smol_spec.num_kv_heads} keeps {smol_spec.num_kv_heads / smol_spec.num_heads:.0%} of it")

# %% [markdown]
# ## 3. The sharing factor
#
# n completions of $O$ tokens off a $P$-token prompt hold, in tokens,
#
# $$\text{unshared} = n\,(P + O), \qquad \text{shared} = P + n\,O, \qquad
# \text{factor} = \frac{n\,(P+O)}{P + n\,O}.$$
#
# The lecture's case, n = 8 off a 4,096-token prompt with 256-token completions:
# $8 \times 4{,}352 = 34{,}816$ tokens against $4{,}096 + 8 \times 256 = 6{,}144$, a factor of
# $34{,}816 / 6{,}144 = 5.667$ — the lecture prints **5.7×**. In blocks of 16, both lengths are whole blocks, so the
# allocator agrees exactly: 2,176 against 384 blocks.{{ "" if card.is_lecture else " The bytes below are %s's, %g KiB per token (the card's model in its MHA form)." % (mha.name, mha.kv_kib_per_token) }}

# %%
for n, p, o in ((8, 4096, 256), (16, 8192, 512)):
    unshared_tok, shared_tok = ledger.fanout_tokens(n, p, o)
    m = measure_fanout(n, p, o, 16)
    kv_block = 16 * COURSE.mha.kv_bytes_per_token
    print(f"n = {n} off {p:,}, {o} each: tokens {unshared_tok:,} → {shared_tok:,} = {unshared_tok / shared_tok:.4f}×; "
          f"allocator blocks {m.unshared_blocks:,} → {m.shared_blocks:,} = {m.factor:.4f}×; "
          f"{fmt_gb(m.unshared_blocks * kv_block, 2)} → {fmt_gb(m.shared_blocks * kv_block, 2)}")
kv7b = LECTURE_7B.kv_bytes_per_token  # the lecture's 7B, whatever the card: this line checks what the lecture printed
unshared_8, shared_8 = ledger.fanout_tokens(8, 4096, 256)
of_lecture = "" if COURSE.is_lecture else " of the lecture's 7B"
print(f"Erratum: the lecture's board prints 17.9 GB against 3.2 GB for n = 8; the bytes{of_lecture} are "
      f"{fmt_gb(unshared_8 * kv7b, 2)} against {fmt_gb(shared_8 * kv7b, 2)}: 17.9 is no reading of "
      f"{unshared_8:,} × {kv7b:,} B ({unshared_8 * kv7b / 2**30:.1f} GiB; 512 KiB as 512,000 B gives "
      f"{unshared_8 * 512_000 / 1e9:.1f} GB).")

# %% [markdown]
# The second line is the lecture's other row (the lecture prints **n = 16 off 8K, 73.0 GB → 8.6 GB**), and the unshared
# fan-out {{ ("does not fit in the %.2f GB budget at all" if ledger.fanout_blocks(16, 8192, 512, 16)[0] > N.num_blocks else "fits in this card's %.2f GB budget (on the lecture's card, its 7B on an H100, it does not)") % (N.kv_budget_bytes / GB) }}. Push both into the real allocator with the
# {{ "lecture's" if card.is_lecture else "card's" }} pool — {{ N.num_blocks:, }} blocks of 16 tokens of {{ mha.kv_kib_per_token:g }} KiB each:

# %%
pool_blocks = ledger.num_blocks(ledger.kv_budget_bytes(COURSE.mha, GPU), 16, COURSE.mha.kv_bytes_per_token)
for share in (False, True):
    run = fanout_in_pool(16, 8192, 512, 16, pool_blocks, share=share)
    what = "shared  " if share else "unshared"
    outcome = "fits" if run.fits else f"REFUSED — {run.refusal}"
    print(f"{what}: {run.branches_admitted} of 16 branches admitted, {run.used_blocks:,} of {pool_blocks:,} blocks "
          f"in use: {outcome}")

# %% [markdown]
# ### Exercise 5.2 — the fan-out in blocks
#
# The token formula ignores blocks; the allocator does not. Which of the prompt's blocks can the forks
# keep naming for as long as they live, and which does each branch end up holding on its own? Write
# `fanout_blocks(n, prompt, output, block_size)` returning `(unshared_blocks, shared_blocks)` — the
# blocks in use once each of the n branches holds `prompt + output` tokens, without and with sharing.
# The checkoff compares with the real allocator on twelve cases and on hidden ones, including prompts
# that end mid-block; the cell after it sets your count beside the engine's run of section 2.

# %%
def fanout_blocks(n, prompt, output, block_size):
    """(unshared, shared) blocks held by n branches of prompt + output tokens each."""
    ### BEGIN SOLUTION 5.2: return (unshared_blocks, shared_blocks) for n branches of prompt + output tokens
    per_branch = -(-(prompt + output) // block_size)  # ceil
    full_prompt = prompt // block_size  # shared for ever
    return n * per_branch, full_prompt + n * (per_branch - full_prompt)
    ### END SOLUTION


check("5.2", fanout_blocks)

# %% [markdown]
# Your count against the engine's. A branch caches its prompt plus every output token but the last (the
# last one is emitted, never attended to), so each branch of section 2 holds $P + O - 1$ tokens at its
# peak. `labsupport.measure.sharing.measure_fanout` replays the same fan-out on two real allocators, forked and
# unshared:

# %%
if unlocked("5.2"):
    P, O = len(fanout_prompt), NEW_TOKENS - 1
    measured = measure_fanout(N_BRANCHES, P, O, BLOCK)
    yours = fanout_blocks(N_BRANCHES, P, O, BLOCK)
    block_bytes = BLOCK * model.spec().kv_bytes_per_token
    print(f"prompt {P} tokens, {O} cached output tokens per branch, block size {BLOCK}")
    print(f"engine peak blocks:           {result.counters.peak_blocks}")
    print(f"allocator, forked:            {measured.shared_blocks} blocks")
    print(f"allocator, unshared:          {measured.unshared_blocks} blocks")
    print(f"your fanout_blocks:           {yours[1]} shared, {yours[0]} unshared")
    print(f"at the tiny model's size:     {measured.shared_blocks * block_bytes / MiB:.2f} MiB shared vs "
          f"{measured.unshared_blocks * block_bytes / MiB:.2f} MiB unshared — {measured.factor:.3f}× "
          f"(blocks of {BLOCK} tokens × {model.spec().kv_bytes_per_token:,} B = {block_bytes:,} B)")

# %% [markdown]
# Now move the sliders. Before you do, predict: which control moves the factor most? What happens as
# n grows without bound (the factor tends to $(P+O)/O$)? Why does {{ gqa.attention }} not change the factor, only
# whether the unshared bar fits?

# %%
viz_sharing.fanout_panel()

# %% [markdown]
# ### Exercise 5.3 — reference counts after a divergence
#
# `N_BRANCHES` branches (the givens cell) share a `PROMPT_TOKENS`-token prompt at block size `BLOCK`,
# forked as in section 1 — the vLLM paper's convention: the prompt's own sequence is the first branch,
# and the others are forked off it — so every block of the prompt is named by every branch and by
# nothing else. Now branches 0 to `WRITERS` − 1, one after the other, each write one token. A written
# token goes into the slot after the branch's last token; a branch may write into a block only if no
# other branch still names it. Give
#
# * `refcounts`: the ref_count of every block in use at that moment (any order), and
# * `copies`: how many block copies copy-on-write will have made once **all** `N_BRANCHES` branches
#   have written one token each.
#
# Work it out on paper first, from the four names; section 1's first board is the picture before anyone
# writes.

# %%
### BEGIN SOLUTION 5.3: set refcounts (every in-use block's ref_count after branches 0 .. WRITERS - 1 write) and copies (after all write)
full, tail = divmod(PROMPT_TOKENS, BLOCK)
if tail:  # the last prompt block is partly filled and shared: each writer that finds it shared copies it
    copied = min(WRITERS, N_BRANCHES - 1)  # the last branch of all finds it private and writes in place
    still_shared = N_BRANCHES - copied  # holders left on the original tail
    refcounts = [N_BRANCHES] * full + [still_shared] + [1] * copied
    copies = N_BRANCHES - 1
else:  # every prompt block is full: each first token starts a fresh block, nothing is copied
    refcounts = [N_BRANCHES] * full + [1] * WRITERS
    copies = 0
### END SOLUTION
check("5.3", {"refcounts": refcounts, "copies": copies})

# %% [markdown]
# Section 1's write on the board, the copies of section 2's fan-out, and — once 5.1 passes too — 5.3's
# divergence replayed through your own `cow_append`:

# %%
if revealed("5.3"):
    viz_sharing.refcount_board_figure(alloc, range(N_BRANCHES), highlight={src, dst},
                                      title=f"One branch wrote a token: new block, refcount "
                                            f"{alloc.ref_count(src)} + {alloc.ref_count(dst)}").show()
    fanned = measure_fanout(N_BRANCHES, len(fanout_prompt), NEW_TOKENS - 1, BLOCK)
    print(f"section 2's fan-out, replayed on the allocator: {fanned.cow_copies} copy-on-write copies for "
          f"{N_BRANCHES} branches off its {len(fanout_prompt)}-token prompt")
    if unlocked("5.1"):
        prompt_blocks = -(-PROMPT_TOKENS // BLOCK)
        tables = {b: list(range(prompt_blocks)) for b in range(N_BRANCHES)}
        seq_lens = dict.fromkeys(range(N_BRANCHES), PROMPT_TOKENS)
        ref_counts = [N_BRANCHES] * prompt_blocks + [0] * (N_BRANCHES + 1)
        free_blocks = list(range(prompt_blocks, prompt_blocks + N_BRANCHES + 1))
        cows = [cow_append(b, tables, seq_lens, ref_counts, free_blocks, BLOCK)[1] for b in range(WRITERS)]
        after_writers = sorted((r for r in ref_counts if r), reverse=True)
        cows += [cow_append(b, tables, seq_lens, ref_counts, free_blocks, BLOCK)[1] for b in range(WRITERS, N_BRANCHES)]
        print(f"your cow_append on 5.3's givens: ref counts {after_writers} once {WRITERS} branches wrote; "
              f"{sum(c is not None for c in cows)} copies once all {N_BRANCHES} did")

# %% [markdown]
# Section 2's SmolLM2 fan-out once every branch had written (the last step all eight still ran): the prompt's
# full blocks still named eight times, and each branch's own last block.

# %%
if smol is not None and revealed("5.3"):
    viz_sharing.refcount_board_figure(pools[-1], sorted(pools[-1].block_tables),
                                      title=f"SmolLM2-135M, n = 8, after step {len(pools)}: the full blocks still "
                                            "shared, each branch's last block its own").show()

# %% [markdown]
# ## 4. Block size × fork cost
#
# §10.3 said block size trades tail waste against the kernel's contiguous run. Sharing adds a third
# term: **copy-on-write duplicates a whole block on a single divergent token** — and how many such
# copies one divergence of n branches makes is what you counted in Exercise 5.3.

# %%
if revealed("5.3"):
    display(Markdown(r"""When n branches each write their first token into a shared, partly filled tail, the first
n − 1 writers each copy it; the last finds refcount 1 and writes in place. Averaged over prompt lengths
(every tail fill equally likely, a full tail copying nothing), one divergence copies $(n-1)\,(b-1)/b$
blocks of $b$ tokens, of which on average $(b-1)/2$ slots hold prompt tokens — the rest is the empty end
of the block, copied anyway."""))

# %% [markdown]
#
# The allocator's copy-on-write events, counted at each block size (n = 8, prompts of 4,096 … 4,096 + b − 1
# tokens), priced at {{ "the lecture's" if card.is_lecture else mha.name + "'s" }} {{ mha.kv_kib_per_token:g }} KiB per token, and the lecture's own price of $b = 256$ (its
# Exercise 3) beside them — once 5.3 passes, since each row is a count of 5.3's copies:

# %%
if revealed("5.3"):
    costs = [measure_fork_cost(b, n=8) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    kv = COURSE.mha.kv_bytes_per_token
    for c in costs:
        print(f"b = {c.block_size:>3}: {c.copies:5.3f} copies per divergence, "
              f"{c.copied_bytes(kv) / 1e6:8.1f} MB copied, of which {c.filled_bytes(kv) / 1e6:7.1f} MB prompt tokens")
    viz_sharing.fork_cost_figure(costs, kv, "MB", title=f"Fork cost grows with the block ({MODEL_NAME.removeprefix('the ')}, n = 8)").show()
    half = measure_fork_cost(256, n=8, prompts=4096 + 128)  # one prompt whose last block is half filled
    kv7b = LECTURE_7B.kv_bytes_per_token  # the lecture's 7B, whatever the card: the erratum checks the lecture's price
    allocator = "the allocator" if COURSE.is_lecture else "on the lecture's 7B the allocator"
    display(Markdown(f"Erratum: the lecture prints 8 × 64 MB = 512 MB; {allocator} copies "
                     f"{half.copies:.0f} × {256 * kv7b / 1e6:.1f} MB = {half.copied_bytes(kv7b) / 1e6:.1f} MB: a copy "
                     f"takes a whole block, not its filled half ({half.filled_tokens / half.copies:.0f} tokens × 512 KiB = "
                     f"{half.filled_bytes(kv7b) / half.copies / 2**20:.0f} MiB, written MB), and in the vLLM paper's "
                     "convention the prompt's own sequence is the first branch, so the last writer copies nothing."))

# %% [markdown]
# On this machine, with the tiny model's real tensors, the copy is a real `index_copy_` per layer.
# Timings vary from run to run; the trend is what to read:

# %% tags=["nbval-ignore-output"]
import time


def time_divergence(block_size, n=8, prompt=1001, repeats=20):
    """Mean seconds for one decode-slot reservation of n forked branches (copies included)."""
    total = 0.0
    for _ in range(repeats):
        c = PagedKVCache(-(-prompt // block_size) + n, block_size, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        c.prepare_prefill(0, prompt)
        for b in range(1, n):
            c.fork(0, b)
        t = time.perf_counter()
        c.prepare_decode(list(range(n)))
        total += time.perf_counter() - t
    return total / repeats

for b in (1, 16, 256):
    print(f"b = {b:>3}: {1e6 * time_divergence(b):8.1f} µs per divergence of 8 branches (tiny model, this machine)")

# %% [markdown]
# ## 5. Sharing is exact: the tokens do not change
#
# Blocks are shared because the tokens are identical, so their keys and values are identical: no
# output changes. Check it the direct way. Sample eight branches twice — once off a single prefill
# forked eight ways, once with eight private prefills of the same prompt (each its own forward pass,
# so the arithmetic is the same shape) — with the same random numbers per branch and position:

# %%
def sample_branches(prompt, n, steps, share, temperature=0.8, seed=11):
    """n sampled continuations off `prompt`, prefilling it once (forked) or once per branch."""
    c = PagedKVCache(64, BLOCK, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    params = SamplingParams(temperature=temperature)
    if share:
        rows = [model.forward_paged(c, prefills=[(0, prompt)])[0]] * n
        for b in range(1, n):
            c.fork(0, b)
    else:
        rows = [model.forward_paged(c, prefills=[(b, prompt)])[0] for b in range(n)]
    tokens = [[sample_token(rows[b], params, seed, b, 0)] for b in range(n)]
    logits = [rows]
    for pos in range(1, steps):
        out = model.forward_paged(c, decodes=[(b, tokens[b][-1]) for b in range(n)])
        logits.append(list(out))
        for b in range(n):
            tokens[b].append(sample_token(out[b], params, seed, b, pos))
    kv = [c.gather(b) for b in range(n)]
    return tokens, logits, kv, c.allocator.num_used_blocks

shared_run = sample_branches(prompt_ids, N_BRANCHES, 24, share=True)
private_run = sample_branches(prompt_ids, N_BRANCHES, 24, share=False)
same_tokens = shared_run[0] == private_run[0]
same_logits = all(torch.equal(a, b) for sa, sb in zip(shared_run[1], private_run[1]) for a, b in zip(sa, sb))
same_kv = all(torch.equal(ka, kb) and torch.equal(va, vb)
              for (ka, va), (kb, vb) in zip(shared_run[2], private_run[2]))
print(f"token ids identical: {same_tokens}; logits bit-identical: {same_logits}; every branch's K/V bit-identical: {same_kv}")
print(f"blocks in use: {shared_run[3]} shared vs {private_run[3]} private")
for b in range(3):
    print(f"branch {b}: {tok.decode(shared_run[0][b])!r}")

# %% [markdown]
# ## 6. Does anything in this mechanism know the branches came from the same request?
#
# No. The allocator shares a block because its *content* is the same — nothing in the block table
# says "request". Two requests from two users that begin with the same system prompt could share
# those blocks just as soundly. That is the prefix cache of the Nov 9 lecture, and the block
# allocator already carries its index: a full block is entered under a hash **chained** with the hash
# of the block before it (the same tokens after a different prefix have different keys and values),
# and a later allocation that starts with the same tokens reuses the blocks.
#
# How much would it save on real traffic? The Mooncake FAST'25 **conversation** trace is an hour of
# production requests; each prompt is described by `hash_ids`, one id per 512-token block, equal ids
# meaning equal content *and* equal prefix. The trace, and its citation as `labsupport` records it (the
# README's *Data and citations* lists it too):

# %% tags=["needs-traces"]
trace = load_mooncake("conversation")
summary = trace.summary()
print(f"{trace.name} ({'SYNTHETIC stand-in: the real file is missing' if trace.synthetic else 'real trace'}): "
      f"{summary['count']:,} requests over {summary['duration_s']:,.0f} s; prompt median {summary['prompt_median']:,.0f} "
      f"/ p99 {summary['prompt_p99']:,.0f} tokens; {sum(len(r.hash_ids) for r in trace):,} prompt blocks in all")
print(trace.citation)
if trace.synthetic:  # the stand-in fits the lengths and the rate, not the sharing: every prompt block is new
    print(f"The stand-in gives every prompt fresh block ids, so every hit count below is 0; `{FETCH_COMMAND}` "
          f"fetches the real trace, whose sessions share their prefixes.")

# %% [markdown]
# ### Exercise 5.4 — count the prefix hits yourself
#
# How many of those prompt blocks would an unbounded prefix index serve? Write
# `prefix_hit_blocks(requests)`: `requests` is a list of requests in arrival order, each a list of block
# ids; return how many blocks an unbounded prefix index would serve. A block counts only if the
# request's **whole prefix** up to and including it was seen before — an id seen after a *different*
# prefix is a different block. Keep it linear in the number of blocks. The checkoff compares with the
# allocator's index on small tricky lists, on a 2,000-request history shaped like the trace's
# conversations (shared system prompts, multi-turn sessions) and on hidden histories; the cell after it
# runs yours on the trace, and the allocator's own index follows.

# %%
def prefix_hit_blocks(requests):
    """Blocks an unbounded prefix index would serve, replaying `requests` (lists of block ids) in order."""
    ### BEGIN SOLUTION 5.4: return the number of leading blocks whose whole prefix was seen before
    seen = set()
    hits = 0
    for ids in requests:
        key = None
        leading = True
        for block_id in ids:
            key = hash((key, block_id))  # the prefix ending here, chained: O(1) per block
            if leading and key in seen:
                hits += 1
            else:
                leading = False
            seen.add(key)
    return hits
    ### END SOLUTION


check("5.4", prefix_hit_blocks)

# %% tags=["needs-traces"]
if unlocked("5.4"):
    mine = prefix_hit_blocks([list(r.hash_ids) for r in trace])
    requested = sum(len(r.hash_ids) for r in trace)
    print(f"your count on the whole trace: {mine:,} of {requested:,} prompt blocks = {100 * mine / requested:.2f}%")

# %% [markdown]
# The allocator's own index on the same trace: every request's blocks replayed, in arrival order,
# through a prefix-caching `BlockAllocator` (one allocator block per 512-token trace block, the hash id
# as its content), with a pool large enough that nothing is ever evicted — the course's reference figure
# for this trace — and the prefill its hits spare:

# %% tags=["needs-traces"]
if revealed("5.4"):
    replay = replay_prefix_cache(trace)
    print(f"prompt blocks requested: {replay.requested_blocks:,}; served by the prefix index: {replay.hit_blocks:,} "
          f"= {100 * replay.hit_rate:.2f}%; allocated: {replay.allocated_blocks:,}")
    saved_tokens = replay.hit_blocks * replay.block_tokens
    saved_flops = 2 * COURSE.mha.num_params * saved_tokens  # the weights' FLOPs alone
    print(f"prefill not redone: {saved_tokens:,} tokens ≈ {saved_flops / 1e18:.2f} EFLOP of {MODEL_NAME}, "
          f"{saved_flops / (0.5 * GPU.peak_flops) / 3600:.2f} {GPU_NAME}-hours at 50% of peak, over a one-hour trace")
    viz_sharing.prefix_sharing_figure(replay, title="Mooncake conversation trace: blocks a prefix index serves").show()

# %% [markdown]
# An unbounded index is the best case. A 512-token block of {{ "the lecture's 7B" if card.is_lecture else mha.name }} is 512 × {{ mha.kv_kib_per_token:g }} KiB =
# {{ 512 * mha.kv_bytes_per_token / 1e6:.0f }} MB of KV, so one {{ "H100" if card.is_lecture else gpu.name }}'s whole {{ N.kv_budget_bytes / GB:.2f }} GB budget holds only {{ int(N.kv_budget_bytes // (512 * mha.kv_bytes_per_token)) }} of them — and it is also where the
# running sequences live. The allocator keeps freed indexed blocks until the pool needs them (least
# recently freed first). Give the index the KV budget of one {{ "H100" if card.is_lecture else gpu.name }}, of a host's DRAM (ten times that)
# and of an SSD (a hundred times), and watch the hit rate (first 3,000 requests, to keep this quick).
# That is the trade in Mooncake's title — *more storage for less computation* — and the Nov 9 lecture.

# %% tags=["needs-traces"]
block_bytes_512 = 512 * COURSE.mha.kv_bytes_per_token  # one 512-token trace block of the card's model
gpu_blocks = int(ledger.kv_budget_bytes(COURSE.mha, GPU) // block_bytes_512)
head = trace.head(3000)
tiers = {f"one {GPU_NAME}'s KV budget": gpu_blocks, "× 10 (a host's DRAM)": 10 * gpu_blocks,
         "× 100 (an SSD)": 100 * gpu_blocks}
bounded = [replay_prefix_cache(head, num_blocks=cap) for cap in tiers.values()]
head_unbounded = replay_prefix_cache(head)
for name, r in zip(tiers, bounded):
    print(f"{name:>22}: {r.num_blocks:>6,} blocks = {r.num_blocks * block_bytes_512 / GB:7.1f} GB → {100 * r.hit_rate:5.2f}% hit")
print(f"{'unbounded':>22}: {100 * head_unbounded.hit_rate:5.2f}% hit")
viz_sharing.prefix_capacity_figure(bounded, head_unbounded).show()

# %% [markdown]
# ## Self-check
#
# 1. A fork of a 4,096-token sequence at block size 16: how many bytes of K/V does it copy?
# 2. Eight branches each write one token into a shared, half-full tail block. How many copies, and
#    what is the original block's refcount afterwards?
# 3. Why is the sharing factor for n = 8 off 4K 5.67 and not 8?
# 4. Raising the block size from 16 to 256 barely changes the 5.67× — so what does it cost a fan-out?
# 5. Does prefix sharing across requests change any request's output tokens? Why not?
#
# The answers show once 5.1, 5.2 and 5.3 pass (answer 2 is 5.3's count), worked on the real allocator:

# %%
if revealed("5.1", "5.2", "5.3"):
    entries = -(-4096 // 16)
    kv = COURSE.mha.kv_bytes_per_token
    half = {b: measure_fork_cost(b, n=8, prompts=4096 + b // 2) for b in (16, 256)}  # 8 branches, half-full tails
    unshared_tok, shared_tok = ledger.fanout_tokens(8, 4096, 256)
    display(Markdown(f"""1. None. A fork copies the block table ({entries} entries) and bumps {entries} reference counts; K/V
   is copied later, one block at a time, only when a branch writes into a block others still name.
2. {half[16].copies:.0f} copies; the last branch to write finds refcount 1 and writes in place, so the original ends
   with refcount 1, held by that branch (the vLLM paper's convention: the prompt's own sequence is the first branch).
3. Only the prompt is shared; each branch's 256 output tokens are its own. {unshared_tok:,} / {shared_tok:,} =
   {unshared_tok / shared_tok:.2f}, tending to (P + O)/O = {(4096 + 256) / 256:.0f} as n grows.
4. Each divergence copies whole blocks: {half[256].copied_bytes(kv) / 1e6:.1f} MB at b = 256 against
   {half[16].copied_bytes(kv) / 1e6:.1f} MB at b = 16 (8 branches, a half-full tail), and the tail waste of every
   sequence grows too.
5. No: a block is shared only when its content — the same tokens after the same prefix — is
   identical, so its K and V are identical; the outputs are bit-for-bit the same (section 5)."""))

# %% [markdown]
# Next: **Lab 06 — the engine loop, admission, and the two ways to break a promise.**
