"""labsupport.viz.sharing and lab 05's checkoffs: copy-on-write fan-out and prefix sharing (§10.4).

Expected numbers are worked out by hand from the lecture's formulas: n = 8 off a 4,096-token prompt
with 256-token outputs holds 8 x 272 = 2,176 blocks unshared and 256 + 8 x 16 = 384 shared
(34,816 / 6,144 tokens = 5.667x); n = 16 off 8,192 with 512 holds 16 x 544 = 8,704 blocks
(73.01 GB at 8 MiB per block) against 512 + 16 x 32 = 1,024 (8.59 GB).  The lecture's pool is
62.52e9 // 8,388,608 = 7,452 blocks, so only 7,452 // 512 = 14 of the 16 unshared 8K prompts fit.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labsupport import card, ledger
from labsupport.measure import sharing as S
from labsupport.block_allocator import BlockAllocator
from labsupport.course import checkoff as C
from labsupport.course.checkoff import check
from labsupport.viz import sharing as V
from real_traces import real_trace

pytestmark = pytest.mark.usefixtures("fresh_results")

MOONCAKE = real_trace("mooncake-conversation")  # $LABSUPPORT_DATA, data/ or ../shared/traces/, as the labs find it
KV_7B = 524_288  # 2 x 32 layers x 32 heads x 128 x 2 B


def ceil_div(a, b):
    return -(-a // b)


# --- the board --------------------------------------------------------------------------------------

def _forked(n=8, prompt=10, block_size=4):
    alloc = BlockAllocator(32, block_size)
    alloc.allocate(0, prompt)
    for b in range(1, n):
        alloc.fork(0, b)
    return alloc


def test_board_after_a_fork_shows_refcount_n():
    alloc = _forked()  # 10 tokens at b = 4: blocks of 4, 4 and 2 tokens
    blocks = V.board_blocks(alloc, range(8))
    assert [b.ref_count for b in blocks] == [8, 8, 8]
    assert [b.filled for b in blocks] == [4, 4, 2]
    assert all(len(b.holders) == 8 for b in blocks)
    fig = V.refcount_board_figure(alloc, range(8))
    shared, private, seqs, blk = fig.data
    assert shared.name == "names a shared block" and private.name == "names a private block"
    assert len(shared.x) == 8 * 3 * 3  # 24 table entries, each (start, end, gap)
    assert len(private.x) == 0
    assert [row[1] for row in blk.customdata] == [8, 8, 8]
    assert "refcount 8" in fig.layout.title.text


def test_board_after_one_branch_writes_shows_7_plus_1():
    alloc = _forked()
    src = alloc.table(3)[-1]
    result = alloc.append_slot(3)
    assert result.cow is not None and result.cow[0] == src
    dst = result.cow[1]
    blocks = V.board_blocks(alloc, range(8))
    assert sorted(b.ref_count for b in blocks) == [1, 7, 8, 8]
    fig = V.refcount_board_figure(alloc, range(8), highlight={src, dst})
    shared, private, _, blk = fig.data
    assert len(private.x) == 3  # branch 3 -> its copy
    refs = {row[0]: row[1] for row in blk.customdata}
    assert refs[src] == 7 and refs[dst] == 1
    widths = dict(zip([row[0] for row in blk.customdata], blk.marker.line.width))
    assert widths[src] == widths[dst] == 5 and sorted(widths.values())[:2] == [1, 1]


def test_board_rejects_a_sequence_that_is_not_resident():
    alloc = _forked(n=2)
    with pytest.raises(ValueError, match="not resident"):
        V.refcount_board_figure(alloc, [0, 99])
    with pytest.raises(ValueError, match="at least one"):
        V.refcount_board_figure(alloc, [])


# --- fan-out -----------------------------------------------------------------------------------------

def hand_fanout(n, p, o, b):
    per_branch = ceil_div(p + o, b)
    return n * per_branch, p // b + n * (per_branch - p // b)


@pytest.mark.parametrize("n, p, o, b, unshared, shared", [
    (8, 4096, 256, 16, 2176, 384),
    (16, 8192, 512, 16, 8704, 1024),
    (8, 100, 1, 16, 8 * 7, 6 + 8),  # six full prompt blocks shared, every branch copies the 4-token tail
    (3, 33, 40, 8, 3 * 10, 4 + 3 * 6),
    (1, 50, 10, 16, 4, 4),
])
def test_measure_fanout_counts_blocks_like_the_hand_formula(n, p, o, b, unshared, shared):
    m = S.measure_fanout(n, p, o, b)
    assert (m.unshared_blocks, m.shared_blocks) == (unshared, shared)
    assert m.cow_copies == (n - 1 if p % b else 0)
    assert m.factor == pytest.approx(unshared / shared)


def test_lecture_fanouts_in_bytes():
    m8 = S.measure_fanout(8, 4096, 256, 16)
    assert m8.factor == pytest.approx(34_816 / 6_144)  # 5.667, printed 5.7
    assert m8.bytes(KV_7B) == (2176 * 8 * 2**20, 384 * 8 * 2**20)  # 18.25 GB, 3.22 GB
    un, sh = S.measure_fanout(16, 8192, 512, 16).bytes(KV_7B)
    assert round(un / 1e9, 1) == 73.0 and round(sh / 1e9, 1) == 8.6


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), p=st.integers(1, 200), o=st.integers(1, 60), b=st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_closed_form_and_allocator_agree(n, p, o, b):
    m = S.measure_fanout(n, p, o, b)
    assert (m.unshared_blocks, m.shared_blocks) == hand_fanout(n, p, o, b) == ledger.fanout_blocks(n, p, o, b)


def test_unshared_16_off_8k_does_not_fit_the_lecture_pool():
    pool = 62_520_000_000 // (16 * KV_7B)
    assert pool == 7452
    unshared = S.fanout_in_pool(16, 8192, 512, 16, pool, share=False)
    assert not unshared.fits and unshared.branches_admitted == 14 and unshared.used_blocks == 14 * 512
    assert "needs 512 free block(s), 284 of 7452 free" in unshared.refusal
    shared = S.fanout_in_pool(16, 8192, 512, 16, pool, share=True)
    assert shared.fits and shared.used_blocks == 1024 and shared.tokens_written == 512


def test_fanout_figure_bars_and_budget():
    fig = V.fanout_figure(8, 4096, 256, 16, KV_7B, budget_bytes=62.52e9)
    per_block_gb = 16 * KV_7B / 1e9
    totals = {}
    for bar in fig.data:
        for x, y in zip(bar.x, bar.y):
            totals[x] = totals.get(x, 0) + y
    assert totals["unshared: n copies"] == pytest.approx(2176 * per_block_gb)
    assert totals["shared: copy-on-write"] == pytest.approx(384 * per_block_gb)
    assert fig.layout.shapes[0].y0 == pytest.approx(62.52)
    assert any("×5.67" in a.text for a in fig.layout.annotations)


def test_fanout_panel_reacts_and_reads_out_the_factor():
    panel = V.fanout_panel()
    assert "factor 5.667×" in panel.text()
    before = [list(b.y) for b in panel.figure.data]
    panel.controls["n"].value = 16  # 16 x 4,352 = 69,632 tokens against 4,096 + 16 x 256 = 8,192
    assert [list(b.y) for b in panel.figure.data] != before
    assert "factor 8.5×" in panel.text()
    gqa = card.card().gqa  # the card's fewer-KV-heads form (lecture-7b-gqa8: a quarter of the bytes), the same factor
    per_token = 2 * gqa.num_layers * gqa.num_kv_heads * gqa.head_dim * gqa.dtype_bytes  # 131,072 B on the lecture's
    panel.controls["model"].value = gqa.name
    assert f"{per_token:,} B per token" in panel.text() and "factor 8.5×" in panel.text()


# --- fork cost ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("b", [1, 2, 16, 256])
def test_fork_cost_means_over_tail_fills(b):
    c = S.measure_fork_cost(b, n=8)  # prompts 4,096 ... 4,096 + b - 1
    assert c.copies == pytest.approx(7 * (b - 1) / b)  # the last writer finds refcount 1
    assert c.copied_tokens == pytest.approx(7 * (b - 1))  # whole blocks: b slots per copy
    assert c.filled_tokens == pytest.approx(7 * (b - 1) / 2)
    assert c.new_blocks == pytest.approx(7 * (b - 1) / b + 8 / b)  # copies, or 8 fresh blocks when b | prompt


def test_fork_cost_single_prompt_and_figure():
    c = S.measure_fork_cost(256, n=8, prompts=4097)
    assert (c.copies, c.copied_tokens, c.filled_tokens) == (7, 7 * 256, 7)
    costs = [S.measure_fork_cost(b, 8) for b in (16, 256)]
    fig = V.fork_cost_figure(costs, KV_7B, "MB")
    copied, filled = fig.data
    assert list(copied.x) == ["16", "256"]
    assert copied.y[1] == pytest.approx(7 * 255 * KV_7B / 1e6)  # 935.9 MB
    assert filled.y[1] == pytest.approx(7 * 127.5 * KV_7B / 1e6)  # 467.9 MB
    with pytest.raises(ValueError):
        V.fork_cost_figure([], KV_7B)


# --- prefix sharing across requests --------------------------------------------------------------

def test_prefix_replay_counts_only_whole_prefixes():
    reqs = [[1, 2, 3], [1, 2, 4], [5, 2, 3], [1, 2, 3, 9], [1], [2, 3]]
    r = S.replay_prefix_cache(reqs)
    # hits: 0; 1,2 -> 2; 5 misses so 2,3 after it are new -> 0; 1,2,3 -> 3; 1 -> 1; (2) at the root is new -> 0
    assert r.hit_blocks == 6 and r.requested_blocks == 16 and r.allocated_blocks == 10
    assert list(r.cum_hits) == [0, 2, 2, 5, 6, 6]
    assert list(r.cum_requested) == [3, 6, 9, 13, 14, 16]
    assert r.hit_rate == pytest.approx(6 / 16)


def test_prefix_replay_bounded_pool_evicts_least_recently_freed():
    reqs = [[1, 2], [3, 4], [1, 2]]
    assert S.replay_prefix_cache(reqs, num_blocks=4).hit_blocks == 2  # room for both: the third hits
    assert S.replay_prefix_cache(reqs, num_blocks=2).hit_blocks == 0  # [3, 4] evicted [1, 2]
    r = S.replay_prefix_cache([[1, 2, 3], [1]], num_blocks=2)
    assert r.skipped == 1 and r.requested_blocks == 1


def test_prefix_replay_rejects_requests_without_hash_ids():
    with pytest.raises(ValueError, match="no hash ids"):
        S.replay_prefix_cache([[1], []])


def _independent_hits(lists):
    seen, hits = set(), 0
    for ids in lists:
        prefixes = [tuple(ids[: i + 1]) for i in range(len(ids))]
        k = 0
        while k < len(prefixes) and prefixes[k] in seen:
            k += 1
        hits += k
        seen.update(prefixes)
    return hits


@pytest.mark.skipif(MOONCAKE is None, reason="the Mooncake trace is not present, or hidden")
def test_mooncake_conversation_trace_reproduces_the_published_hit_rate():
    from labsupport.workloads import load_mooncake

    trace = load_mooncake("conversation", path=MOONCAKE)
    head = trace.head(800)
    assert S.replay_prefix_cache(head).hit_blocks == _independent_hits([list(r.hash_ids) for r in head])
    full = S.replay_prefix_cache(trace)
    assert full.requested_blocks == sum(ceil_div(r.prompt_tokens, 512) for r in trace)
    assert round(100 * full.hit_rate, 1) == 36.6  # SOURCES.md: 36.6% with an unbounded cache
    fig = V.prefix_sharing_figure(full)
    requested, allocated = fig.data
    assert requested.y[-1] == full.requested_blocks and allocated.y[-1] == full.allocated_blocks
    cap = V.prefix_capacity_figure([S.replay_prefix_cache(head, num_blocks=k) for k in (4000, 500)],
                                   S.replay_prefix_cache(head))
    assert list(cap.data[0].x) == [500, 4000] and cap.data[0].y[0] <= cap.data[0].y[1]


# --- lab 05's checkoffs: the solution passes, known mistakes fail ---------------------------------------

def _cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size, copy_always=False):
    table, n = tables[seq], seq_lens[seq]
    off, cow = n % block_size, None
    if off == 0:
        b = free_blocks.pop(0)
        ref_counts[b] = 1
        table.append(b)
    else:
        b = table[-1]
        if ref_counts[b] > 1 or copy_always:
            new = free_blocks.pop(0)
            ref_counts[new] = 1
            ref_counts[b] -= 1
            if ref_counts[b] == 0:
                free_blocks.append(b)
            table[-1], cow, b = new, (b, new), new
    seq_lens[seq] = n + 1
    return b * block_size + off, cow


def test_checkoff_5_1_cow_append(capsys, fails):
    check("5.1", _cow_append)
    assert capsys.readouterr().out == "✅ Checkoff 5.1 passed\n"
    with fails("must write without copying"):
        check("5.1", lambda *a: _cow_append(*a, copy_always=True))

    def no_refcount_drop(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
        slot, cow = _cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size)
        if cow:
            ref_counts[cow[0]] += 1  # forgets that the writer stopped naming the old block
        return slot, cow

    with fails("ref_count"):
        check("5.1", no_refcount_drop)


def test_checkoff_5_2_fanout_blocks(capsys, fails):
    check("5.2", hand_fanout)
    assert capsys.readouterr().out == "✅ Checkoff 5.2 passed\n"
    with fails("partly filled prompt block stayed shared"):
        check("5.2", lambda n, p, o, b: (n * ceil_div(p + o, b), ceil_div(p, b) + n * ceil_div(o, b)))
    with fails("count of tokens"):
        check("5.2", lambda n, p, o, b: (n * (p + o), p + n * o))


def test_checkoff_5_3_refcounts_after_divergence(capsys, fails):
    # 100 tokens at b = 16: six full blocks (ref 8 for ever) and a 4-token tail; branches 0-4 copy it
    # (five private copies, the original keeps 3 holders); once all 8 write, 7 copies were made.
    check("5.3", {"refcounts": [1, 1, 1, 1, 1, 3, 8, 8, 8, 8, 8, 8], "copies": 7})
    assert capsys.readouterr().out == "✅ Checkoff 5.3 passed\n"
    with fails("reference counts"):
        check("5.3", {"refcounts": [1] * 5 + [8] * 7, "copies": 7})
    with fails("too many"):
        check("5.3", {"refcounts": [1] * 5 + [3] + [8] * 6, "copies": 8})
    with fails("dict"):
        check("5.3", [1, 2, 3])


def test_checkoff_5_4_prefix_hits(capsys, fails):
    check("5.4", _independent_hits)
    assert capsys.readouterr().out == "✅ Checkoff 5.4 passed\n"

    def by_id_only(reqs):  # counts an id seen after a different prefix
        seen, hits = set(), 0
        for ids in reqs:
            lead = True
            for x in ids:
                if lead and x in seen:
                    hits += 1
                else:
                    lead = False
                seen.add(x)
        return hits

    with fails("serves fewer"):
        check("5.4", by_id_only)
