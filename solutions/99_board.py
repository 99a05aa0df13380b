# %%
# Lecture 10, the board: one segment at a time (→ / Page Down: the next result, then the next segment; ← back).
# The instructor's notes for each segment are folded under the picture; INSTRUCTORS.md has the timing plan.
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
from labsupport.viz import board as viz_board

viz_board.Board()

# %% [markdown]
# ## Lecture 10: the KV cache as virtual memory
