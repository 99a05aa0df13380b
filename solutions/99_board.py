# %% [markdown]
# # The board — Lecture 10 in 75 minutes (for instructors)
#
# One notebook for the projector, following the lecture's timing plan. Each segment below is **one
# panel**: the segment's board picture (the same figures and sliders the labs use), its *ask the room*
# question, and — folded away — the answer and the confusion to expect. Nothing here runs anything slow:
# the pictures are closed-form or read off small allocator states, and the two that need engine runs or
# real traces (the TTFT bars, the map of Part II) read `labsupport/viz/board_data.json`, which
# `python -m labsupport.viz.board --write` regenerates and a test keeps current.
#
# **Live use.** *Run → Run All Cells* before class: the kernel's part takes seconds, but drawing a
# dozen interactive charts takes a laptop's browser about half a minute, so start it before the room
# fills (`make board` opens this notebook). In class, scroll segment by segment; the charts follow the
# window's width (at 1920 × 1080 their text reads 26 px), and *View → Appearance → Simple Interface*
# hides the rest. Or present it with no code at all: `make present` serves this board through Voilà
# (every cell runs on load, about twenty seconds; then only prose and live panels). The sliders work live. Every
# number on the board is the exact figure, with the lecture's printed figure beside it where they differ
# (`python -m labsupport ledger` prints the errata).
#
# | minutes | segment | the lab behind it |
# |---|---|---|
# | 0–6 | Part II opens: 29 against 295 (§10.1) | [01](01_five_jobs.ipynb) |
# | 6–16 | The naive allocator (§10.2) — *protected* | [02](02_naive_allocator.ipynb) |
# | 16–36 | PagedAttention, the paper (§10.3) — *protected, never cut* | [03](03_block_tables.ipynb), [04](04_paged_kernel.ipynb) |
# | 36–46 | Sharing: copy-on-write (§10.4) | [05](05_copy_on_write.ipynb) |
# | 46–58 | The engine loop, admission, preemption (§10.5) | [06](06_engine_loop.ipynb) |
# | 58–68 | Sizing and the SLO ledger (§10.6) | [07](07_slo_ledger.ipynb) |
# | 68–75 | The map of Part II, and close (§10.7) | [08](08_map_of_part_two.ipynb) |
#
# **If running long** (the lecture's own advice): compress §10.6 to the TTFT decomposition and drop the
# goodput table; cut §10.4 to the copy-on-write picture and the 5.7×. Never cut §10.2 or §10.3.

# %%
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
from labsupport.viz import board as viz_board

board_data = viz_board.load_board_data()
for s in viz_board.SEGMENTS:
    print(f"{s.start:>2}–{s.end:<2} min  {s.title}{'  (protected)' if s.protected else ''}")

# %% [markdown]
# ## 0–6 · Part II opens: 29 against 295

# %%
viz_board.segment_view(0, board_data)

# %% [markdown]
# ## 6–16 · The naive allocator — where 86% of the cache goes

# %%
viz_board.segment_view(1, board_data)

# %% [markdown]
# ## 16–36 · PagedAttention: the KV cache as virtual memory
#
# Step the explorer: grow A by one token and let the room say what happens before you click.

# %%
viz_board.segment_view(2, board_data)

# %% [markdown]
# ## 36–46 · What paging buys next: blocks can be shared

# %%
viz_board.segment_view(3, board_data)

# %% [markdown]
# ## 46–58 · The engine loop, admission, and the two ways to break a promise
#
# Derive 67 ms against 129 ms on the board first; show the chart after.

# %%
viz_board.segment_view(4, board_data)

# %% [markdown]
# ## 58–68 · Sizing, SLOs, and where the time actually goes

# %%
viz_board.segment_view(5, board_data)

# %% [markdown]
# ## 68–75 · What paging did not fix: the map of Part II

# %%
viz_board.segment_view(6, board_data)

# %%
from IPython.display import Markdown  # noqa: E402
from labsupport import ledger  # noqa: E402
from labsupport.cli import ledger as staff_ledger  # noqa: E402

gain = staff_ledger.compute(staff_ledger.Scenario())
Markdown(f"*\"Paging was the easy 7× — a known solution to a known problem, findable by anyone who had looked at "
         "where the memory went. Nobody had measured the utilization.\"* (The lecture's 7× is its printed 199 "
         f"over 29; exact: {gain['naive_concurrency']} → {gain['paged_concurrency']} is "
         f"{gain['concurrency_gain']:.2f}×.)")
