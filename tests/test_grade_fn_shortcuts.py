"""Derive-style function checkoffs refuse the library entry points that compute what the function returns.

tests/test_grade_shortcuts.py covers the value checkoffs; this is its pattern for the function ones.  An
audit answered lab 01's 1.3 (the memory-limited batch) with `ReserveToMaxAllocator.from_budget(...).max_seqs`,
and found the same kind of door open in labs 00, 01, 03, 04, 07 and 08: a cache's own KV bytes per token,
the ridge batch with no KV, the pool's private slot arithmetic, the whole-block count (`blocks_for`,
`num_blocks`, `naive_concurrency` at S_max = b), a private copy of the interpolated percentile.  Each lab
that gained forbids gets one notebook here: its solution, with the affected checkoffs' `check()` moved into a
new cell after the honest one that defines a shortcut function and hands that in (the honest function stays
defined, so the cells after it still run).  Each notebook is graded once; every shortcut must fail as
"derive, don't call" naming what it used, and every other checkoff of the solution must still pass.  Every
shortcut returns the right values on the lab's and the hidden cases (it passed before these forbids): the
failure is the forbid, not a wrong answer.
"""
from __future__ import annotations

import pytest
from test_grade_shortcuts import grade_shortcuts

pytestmark = pytest.mark.slow


# lab notebook -> {checkoff: (a shortcut function named `short`, a word its detail names)}
SHORTCUTS = {
    "00_setup.ipynb": {
        "0.2": ("def short(num_layers, num_kv_heads, head_dim, dtype_bytes=2):\n"
                "    import torch\n"
                "    from labsupport.kvcache import PagedKVCache\n"
                "    dtype = {1: torch.float8_e4m3fn, 2: torch.float16, 4: torch.float32, 8: torch.float64}[dtype_bytes]\n"
                "    return PagedKVCache(1, 1, num_layers, num_kv_heads, head_dim, dtype=dtype).kv_bytes_per_token",
                "PagedKVCache"),
    },
    "01_five_jobs.ipynb": {
        "1.2": ("def short(model, gpu):\n"
                "    from labsupport import ledger\n"
                "    return ledger.ridge_batch_with_kv(model, gpu, 0)  # no KV read: Lecture 2's ridge",
                "ridge_batch_with_kv"),
        "1.3": ("def short(model, gpu, s_max, reserved_bytes=4 * 10**9):\n"
                "    from labsupport.contiguous import ReserveToMaxAllocator\n"
                "    budget = gpu.hbm_bytes - model.num_params * model.dtype_bytes - reserved_bytes\n"
                "    if budget <= 0:\n"
                "        return 0\n"
                "    return ReserveToMaxAllocator.from_budget(budget, model.kv_bytes_per_token, s_max=s_max).max_seqs",
                "from_budget"),
    },
    "03_block_tables.ipynb": {
        "3.1": ("def short(block_table, block_size, start, end):\n"
                "    from labsupport.kvcache import PagedKVCache\n"
                "    class Pool:  # all the pool's own slot arithmetic reads\n"
                "        pass\n"
                "    pool = Pool()\n"
                "    pool.block_size, pool.device = block_size, 'cpu'\n"
                "    return PagedKVCache._slots(pool, list(block_table), start, end).tolist()",
                "_slots"),
        "3.3": ("def short(seq_len, block_size):\n"
                "    from labsupport import ledger\n"
                "    return ledger.blocks_for(seq_len, block_size) * block_size - seq_len",
                "blocks_for"),
        "3.10": ("def short(block_size, batch):\n"
                 "    from labsupport import ledger\n"
                 "    tail = sum(ledger.tail_waste_tokens(n, block_size) for n in range(block_size)) / block_size * KV\n"
                 "    return (tail, batch * tail / BUDGET, ledger.blocks_for(MEDIAN_TOKENS, block_size),\n"
                 "            ledger.blocks_for(TAIL_TOKENS, block_size))",
                 "blocks_for"),
    },
    "04_paged_kernel.ipynb": {
        "4.1": ("def short(block_tables, positions, block_size, stride_block, stride_slot):\n"
                "    import torch\n"
                "    from labsupport.kvcache import PagedKVCache\n"
                "    class Pool:\n"
                "        pass\n"
                "    pool = Pool()\n"
                "    pool.block_size, pool.device = block_size, 'cpu'\n"
                "    rows = []\n"
                "    for b, pos in enumerate(positions):\n"
                "        slots = PagedKVCache._slots(pool, block_tables[b].tolist(), 0, int(pos.max()) + 1)\n"
                "        rows.append(slots[pos] * stride_slot)  # stride_block is block_size * stride_slot\n"
                "    return torch.stack(rows)",
                "_slots"),
    },
    "07_slo_ledger.ipynb": {
        "7.2": ("def short(model, gpu, seq_tokens, tpot_slo_s, block_size=16):\n"
                "    import math\n"
                "    from labsupport import ledger\n"
                "    kv, weights = model.kv_bytes_per_token, model.num_params * model.dtype_bytes\n"
                "    budget = max(0, gpu.hbm_bytes - weights - 4 * 10**9)\n"
                "    by_memory = ledger.num_blocks(budget, block_size, kv) // ledger.blocks_for(seq_tokens, block_size)\n"
                "    by_slo = max(0, math.floor((tpot_slo_s * gpu.hbm_bandwidth - weights) / (seq_tokens * kv)))\n"
                "    return min(by_memory, by_slo)",
                "num_blocks"),
        "7.4": ("def short(requests, ttft_slo_s):\n"
                "    from labsupport.viz.engine import _percentile\n"
                "    ttfts = [q.first_token_time - q.arrival_time for q in requests if q.status == 'finished']\n"
                "    return {'mean_s': sum(ttfts) / len(ttfts), 'p99_s': _percentile(ttfts, 99),\n"
                "            'miss_share': sum(t > ttft_slo_s for t in ttfts) / len(ttfts)}",
                "_percentile"),
        "7.5": ("def short(model, gpu, context_tokens, submitted_tokens, block_size=16):\n"
                "    from labsupport import ledger\n"
                "    kv = model.kv_bytes_per_token\n"
                "    budget = max(0, gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4 * 10**9)\n"
                "    return {'peak_kv_bytes': context_tokens * kv,\n"
                "            'sessions': ledger.num_blocks(budget, block_size, kv) // ledger.blocks_for(context_tokens, block_size),\n"
                "            'prefill_s': submitted_tokens * 2 * model.num_params / (0.5 * gpu.peak_flops)}",
                "num_blocks"),
    },
    "08_map_of_part_two.ipynb": {
        "8.3": ("def short(model, gpu, gpu_memory_utilization, block_size=16, activation_bytes=4e9):\n"
                "    from labsupport import ledger\n"
                "    left = gpu_memory_utilization * gpu.hbm_bytes - model.num_params * model.dtype_bytes - activation_bytes\n"
                "    return ledger.naive_concurrency(max(0.0, left), block_size, model.kv_bytes_per_token)  # S_max = b",
                "naive_concurrency"),
        "8.6": ("def short(lengths, block_size):\n"
                "    from labsupport import ledger\n"
                "    slots = sum(ledger.blocks_for(n, block_size) * block_size for n in lengths)\n"
                "    return (slots - sum(lengths)) / slots",
                "blocks_for"),
    },
}


def _function_cell(cid: str, code: str) -> str:
    """The shortcut function, renamed for its checkoff, then check() on the function itself."""
    name = "short_" + cid.replace(".", "_")
    return f"{code.replace('def short(', f'def {name}(', 1)}\n\n\ncheck({cid!r}, {name})"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_shortcuts(SHORTCUTS, tmp_path_factory, _function_cell)


CASES = [(name, cid) for name, shortcuts in SHORTCUTS.items() for cid in shortcuts]


@pytest.mark.parametrize("name,cid", CASES)
def test_a_library_shortcut_fails_as_derive_dont_call(graded, name, cid):
    row = graded[name][cid]
    assert row.status == "failed", row.detail
    assert "derive, don't call" in row.detail and SHORTCUTS[name][cid][1] in row.detail, row.detail


@pytest.mark.parametrize("name", list(SHORTCUTS))
def test_the_solutions_own_answers_still_pass(graded, name):
    others = {cid: row for cid, row in graded[name].items() if cid not in SHORTCUTS[name]}
    assert others
    bad = {cid: row.detail for cid, row in others.items() if row.status != "passed"}
    assert not bad, bad
