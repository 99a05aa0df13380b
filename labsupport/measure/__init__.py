"""Measurements: the lecture's claims read off the real mechanisms (§10.2–§10.7).

Each module here drives the mechanisms at the top of `labsupport/` (the allocators, the paged cache, the engine,
the cost-model clock) and reports what they did: the quantity a lab or the board shows beside the ledger's closed
form.  Nothing here is a mechanism of its own, and no mechanism imports from here.

    fragmentation.py  §10.2  the naive allocators filled to their refusal (Exercise 2)
    fig2.py           §10.3  the vLLM paper's Fig. 2: how much of a loaded pool holds real token states
    block_size.py     §10.3  the block-size trade-off on the real BlockAllocator over real traces
    addresses.py      §10.3  where a decode kernel reads a batch's keys, through the kernels' address line
    sharing.py        §10.4  fan-out, fork cost and a trace's prefix hits, counted on the real allocator
    engine_runs.py    §10.5  the engine's loop streamed step by step; a batch run to the end
    machine.py        §10.5  this machine's copy bandwidth and prefill rate (the personal break-even)
    replay.py         §10.5–6  a trace through the engine on the cost-model clock: goodput, utilization, TLB
    part_two.py       §10.7  each row of the map of Part II, read off the mechanisms and engine runs
"""
