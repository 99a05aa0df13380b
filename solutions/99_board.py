# %% [markdown]
# ## Lecture 10: the KV cache as virtual memory

# %% jupyter={"source_hidden": true}
# Lecture 10, the board: one segment at a time (→ / Page Down: the next result, then the next segment; ← back).
# S opens the presenter view (the notes, the next segment, a clock) in a second window; INSTRUCTORS.md has the plan.
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
from labsupport.viz import board as viz_board

viz_board.Board()
