# %% [markdown]
# ## Lecture 10: the KV cache as virtual memory

# %% jupyter={"source_hidden": true}
# Lecture 10, the board: one segment at a time (→ / Page Down: the next result, then the next segment; ← back).
# S opens the presenter view (the notes, the next segment, a clock) in a second window; INSTRUCTORS.md has the plan.
import labsupport  # first: on a CPU-only machine this routes Triton kernels through its interpreter
from labsupport.viz import board as viz_board

viz_board.Board()

# %% jupyter={"source_hidden": true}
# The live demo, folded below the board and out of its segments: SmolLM2-135M-Instruct streams a reply through the
# labs' Engine and PagedKVCache when its button is pressed (nothing loads or runs at Run All). INSTRUCTORS.md.
from labsupport.viz.board.live import LiveDemo

LiveDemo()
