"""The engine loop (§10.5) and the SLO ledger (§10.6): admission, preemption, fan-out, two clocks."""
from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labsupport  # noqa: F401
from labsupport import ledger
from labsupport.costmodel import CostModel
from labsupport.engine import Engine
from labsupport.model import ModelConfig, TinyTransformer
from labsupport.sampling import SamplingParams, sample_token
from labsupport.slo import slo_report
from labsupport.specs import GB, LECTURE_7B, LECTURE_GPU, GPUSpec


pytestmark = pytest.mark.usefixtures("one_thread")


H100 = CostModel(LECTURE_7B, LECTURE_GPU)


def cost_engine(num_blocks, block_size=16, **kw):
    return Engine(cost_model=kw.pop("cost_model", H100), num_blocks=num_blocks, block_size=block_size, **kw)


# --- tokens never depend on the pool, the batch or preemption ----------------------------------

@pytest.fixture(scope="module")
def model():
    return TinyTransformer(ModelConfig(init_std=0.3, seed=3))


def _requests():
    rng = random.Random(7)
    reqs = []
    for i in range(7):
        prompt = [rng.randrange(1, 110) for _ in range(rng.randint(3, 26))]
        n = 3 if i == 2 else 1
        temp = 0.0 if i % 2 == 0 and n == 1 else 0.9
        reqs.append((prompt, rng.randint(6, 16), n, SamplingParams(temperature=temp, seed=100 + i)))
    return reqs


def _run(model, num_blocks, preemption, cost_model=None, **kw):
    spec = model.spec()
    eng = Engine(model, num_blocks=num_blocks, block_size=4, preemption=preemption, watermark=0.0,
                 cost_model=cost_model or CostModel(spec, LECTURE_GPU), **kw)
    ids = [eng.add_request(p, m, n=n, sampling=sp) for p, m, n, sp in _requests()]
    res = eng.run()
    assert eng.allocator.num_used_blocks == 0 and res.counters.leaked_blocks == 0
    assert not eng.allocator.block_tables and not eng.allocator.seq_lens
    return [res.requests[i].outputs for i in ids], res


@pytest.fixture(scope="module")
def baseline(model):
    return _run(model, 400, "swap")


def test_baseline_has_no_preemption_and_greedy_matches_the_model(model, baseline):
    outs, res = baseline
    assert res.counters.total_preemptions == 0
    for (prompt, m, n, sp), out in zip(_requests(), outs):
        assert [len(o) for o in out] == [m] * n
        if sp.temperature == 0:  # an independent reference: the model's own contiguous decode
            assert out[0] == model.generate_contiguous(prompt, m).tokens
    fan = outs[2]
    assert len({tuple(b) for b in fan}) == 3  # sampled branches diverge (seeded per branch)


@pytest.mark.parametrize("mode", ["swap", "recompute", "auto"])
def test_tiny_pool_forces_preemption_but_not_different_tokens(model, baseline, mode):
    spec = model.spec()
    cm = None
    if mode == "auto":
        # choose the link so the §10.5 break-even falls at 20 tokens: below it recompute, above swap.
        # 2 S kv / W = (2 N S + 4 L H d S^2) / F at S = 20  =>  W = 2 kv F / (2 N + 4 L H d 20)
        f = LECTURE_GPU.peak_flops * 0.5
        link = 2 * spec.kv_bytes_per_token * f / (2 * spec.num_params + 4 * 4 * 4 * 32 * 20)
        cm = CostModel(spec, LECTURE_GPU, link_bandwidth=link)
        assert cm.crossover_tokens() == pytest.approx(20)
    outs, res = _run(model, 14, mode, cost_model=cm)
    p = res.counters.preemptions
    if mode == "auto":
        assert p["swap"] > 0 and p["recompute"] > 0, p
    else:
        assert p[mode] >= 3 and sum(p.values()) == p[mode], p
    assert outs == baseline[0]
    if p["swap"]:
        assert res.counters.swapped_out_bytes > 0 and res.counters.swapped_in_bytes == res.counters.swapped_out_bytes
    if p["recompute"]:
        assert res.counters.recomputed_tokens > 0


def test_real_clock_gives_the_same_tokens(model, baseline):
    eng = Engine(model, num_blocks=400, block_size=4, watermark=0.0)
    ids = [eng.add_request(p, m, n=n, sampling=sp) for p, m, n, sp in _requests()]
    res = eng.run()
    assert res.clock == "real" and res.clock_s > 0
    assert [res.requests[i].outputs for i in ids] == baseline[0]


def test_streaming_callback_sees_every_token_in_order(model, baseline):
    events = []
    eng = Engine(model, num_blocks=400, block_size=4, cost_model=CostModel(model.spec(), LECTURE_GPU),
                 on_token=events.append)
    ids = [eng.add_request(p, m, n=n, sampling=sp) for p, m, n, sp in _requests()]
    res = eng.run()
    for rid, want in zip(ids, baseline[0]):
        for b, toks in enumerate(want):
            evs = [e for e in events if e.request_id == rid and e.branch == b]
            assert [e.token for e in evs] == toks
            assert [e.index for e in evs] == list(range(len(toks)))
            assert [e.finished for e in evs] == [False] * (len(toks) - 1) + [True]
            assert [e.time for e in evs] == res.requests[rid].token_times[b]
    assert [e.time for e in events] == sorted(e.time for e in events)


def test_a_request_alone_or_in_a_crowd_samples_the_same(model):
    sp = SamplingParams(temperature=1.0, seed=5)
    alone = Engine(model, num_blocks=100, block_size=8, cost_model=H100)
    a = alone.add_request([9, 8, 7, 6], 12, sampling=sp)
    crowd = Engine(model, num_blocks=100, block_size=8, cost_model=H100)
    for k in range(3):
        crowd.add_request([k + 1] * (k + 2), 10, sampling=SamplingParams(temperature=0.7, seed=k))
    b = crowd.add_request([9, 8, 7, 6], 12, sampling=sp)
    assert alone.run().requests[a].outputs == crowd.run().requests[b].outputs


def test_sampling_follows_the_distribution():
    # logits (0, ln 3) at temperature 1 are probabilities (1/4, 3/4)
    logits = torch.tensor([0.0, math.log(3.0)])
    sp = SamplingParams(temperature=1.0)
    draws = [sample_token(logits, sp, 11, 0, pos) for pos in range(4000)]
    assert abs(draws.count(0) / 4000 - 0.25) < 0.03
    assert draws == [sample_token(logits, sp, 11, 0, pos) for pos in range(4000)]  # pure function
    assert draws != [sample_token(logits, sp, 11, 1, pos) for pos in range(4000)]  # another branch
    assert sample_token(torch.tensor([0.0, 5.0, 1.0]), SamplingParams(), 0, 0, 0) == 1  # greedy


# --- fan-out shares the prompt's blocks (§10.4) -------------------------------------------------------

def test_fanout_shares_prompt_blocks_and_copies_the_tail_on_write():
    eng = cost_engine(100, 16, watermark=0.0)
    eng.add_request(prompt_len=40, max_new_tokens=5, n=4)
    eng.step()  # prefill once, fork three times
    a = eng.allocator
    assert a.num_used_blocks == 3  # ceil(40 / 16), not 4 x 3 = 12
    tables = list(a.block_tables.values())
    assert len(tables) == 4 and all(t == tables[0] for t in tables)
    assert [a.ref_count(b) for b in tables[0]] == [4, 4, 4]
    eng.step()  # each branch writes position 40, inside the shared third block: three copies, one in place
    assert a.num_used_blocks == 2 + 4
    tables = list(a.block_tables.values())
    assert all(t[:2] == tables[0][:2] for t in tables) and len({t[2] for t in tables}) == 4
    assert [a.ref_count(b) for b in tables[0][:2]] == [4, 4]
    res = eng.run()
    assert res.requests[0].num_output_tokens == [5] * 4 and res.counters.leaked_blocks == 0
    # by the end each branch holds 44 tokens: still the 2 shared blocks plus its own third block
    assert res.counters.peak_blocks == 6 == ledger.fanout_blocks(4, 40, 5, 16)[1]


def test_fanout_copy_on_write_moves_the_right_kv_on_real_tensors(model):
    prompt = [7, 3, 9, 1, 4, 4, 2, 8, 5, 6]  # 10 tokens at b = 4: blocks of 4, 4, 2
    eng = Engine(model, num_blocks=40, block_size=4, cost_model=H100, watermark=0.0)
    rid = eng.add_request(prompt, 9, n=3)  # greedy: all three branches must agree
    eng.step()
    assert eng.allocator.num_used_blocks == 3
    eng.step()  # position 10 lands in the shared third block: two copies, one write in place
    assert eng.allocator.num_used_blocks == 2 + 3
    out = eng.run().requests[rid].outputs
    # a copied block missing tokens 8 and 9 (or the wrong ones) would change the branches' tokens
    assert out == [model.generate_contiguous(prompt, 9).tokens] * 3


def test_fanout_of_a_block_aligned_prompt_needs_no_copy():
    eng = cost_engine(100, 16, watermark=0.0)
    eng.add_request(prompt_len=32, max_new_tokens=3, n=3)
    eng.step()
    assert eng.allocator.num_used_blocks == 2
    eng.step()
    assert eng.allocator.num_used_blocks == 2 + 3  # a fresh block each, the prompt blocks untouched


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_fanout_in_a_full_pool_evicts_a_sharer_then_writes_in_place(model, mode):
    # n = 2 off a 3-token prompt at b = 4 in a pool of ONE block: after the prefill both branches hold
    # that block (ref 2) and want position 3 inside it.  No block is free, so the later branch is
    # evicted; the earlier one is then the block's only holder and writes in place, no copy needed.
    # (Counting the copy it no longer needs once made the engine evict it too and stall.)
    for eng in (cost_engine(1, 4, watermark=0.0, preemption=mode),
                Engine(model, num_blocks=1, block_size=4, watermark=0.0, preemption=mode, cost_model=H100)):
        prompt = [5, 6, 7]
        rid = (eng.add_request(prompt, 2, n=2) if eng.model is not None
               else eng.add_request(prompt_len=3, max_new_tokens=2, n=2))
        res = eng.run()
        r = res.requests[rid]
        assert r.finished and r.num_output_tokens == [2, 2]
        assert res.counters.preemptions == {"swap": int(mode == "swap"), "recompute": int(mode == "recompute")}
        assert res.counters.leaked_blocks == 0 and res.counters.peak_blocks == 1
        if eng.model is not None:
            assert r.outputs == [model.generate_contiguous(prompt, 2).tokens] * 2


def test_tail_copies_are_counted_exactly_with_a_model(model):
    # n = 3 off a 3-token prompt at b = 4: one shared block (ref 3).  The first decode needs exactly
    # 3 - 1 = 2 copies (the last holder writes in place), and the pool has exactly 2 more blocks,
    # so nobody is preempted on either path.
    prompt = [5, 6, 7]
    eng = Engine(model, num_blocks=3, block_size=4, watermark=0.0, preemption="swap", cost_model=H100)
    rid = eng.add_request(prompt, 2, n=3)
    res = eng.run()
    assert res.counters.total_preemptions == 0
    assert res.requests[rid].outputs == [model.generate_contiguous(prompt, 2).tokens] * 3
    eng = cost_engine(3, 4, watermark=0.0, preemption="swap")
    eng.add_request(prompt_len=3, max_new_tokens=2, n=3)
    assert eng.run().counters.total_preemptions == 0


# --- the cost-model clock against the ledger ----------------------------------------------------------

def test_cost_clock_reproduces_ledger_tpot_for_a_steady_batch():
    b, prompt = 16, 639
    eng = cost_engine(7452, 16, watermark=0.0)
    ids = [eng.add_request(prompt_len=prompt, max_new_tokens=3) for _ in range(b)]
    res = eng.run()
    w, kv, bw = 13.48e9, 524_288, 3350e9
    n_params, attn = 6.74e9, 4 * 32 * 32 * 128
    f = 989e12 * 0.5
    # step 1: 16 prefills of 639 tokens, compute-bound: (2 N S + 4 L H d S^2) each over 50% of peak
    prefill = b * (2 * n_params * prompt + attn * prompt**2) / f
    assert prefill > w / bw
    # step 2: every sequence attends to 640 tokens: the lecture's (13.48 GB + B x 640 x 512 KiB) / 3.35 TB/s
    step2 = (w + b * 640 * kv) / bw
    step3 = (w + b * 641 * kv) / bw
    assert step2 > b * (2 * n_params + attn * 640) / f  # memory-bound, as §10.6 assumes
    for i in ids:
        t = res.requests[i].token_times[0]
        assert t[0] == pytest.approx(prefill, rel=1e-12)
        assert t[1] - t[0] == pytest.approx(step2, rel=1e-9)
        assert t[2] - t[1] == pytest.approx(step3, rel=1e-9)
        assert res.requests[i].tpot_s == pytest.approx((step2 + step3) / 2, rel=1e-9)
    assert step2 == pytest.approx(ledger.tpot_s(LECTURE_7B, b, 640, LECTURE_GPU.hbm_bandwidth), rel=1e-12)


def test_cost_model_prices_the_lecture_preemption_numbers():
    # §10.5: a 4,096-token MHA sequence swaps in 67 ms round trip and recomputes in 129 ms
    assert H100.swap_round_trip_s(4096) == pytest.approx(2 * 4096 * 524_288 / 64e9)
    assert H100.recompute_s(4096) == pytest.approx((2 * 6.74e9 * 4096 + 4 * 32 * 32 * 128 * 4096**2) / 494.5e12)
    assert H100.preempt_choice(4096) == "swap"
    slow = CostModel(LECTURE_7B, LECTURE_GPU, link_bandwidth=8 * GB)  # below the 33 GB/s break-even
    assert slow.preempt_choice(4096) == "recompute"
    st = H100.step(decode_seqs=0, prefill_lens=[4096])
    assert st.total_s == pytest.approx(H100.recompute_s(4096))


def test_cost_model_step_terms_by_hand():
    # 3 decodes attending to 1,000 tokens in all, one 200-token prefill and 1 GB over the link
    st = H100.step(decode_seqs=3, decode_context_tokens=1000, prefill_lens=[200], swap_bytes=1e9)
    assert st.memory_s == pytest.approx((13.48e9 + 1000 * 524_288) / 3350e9)
    flops = (2 * 6.74e9 * 200 + 4 * 32 * 32 * 128 * 200**2) + 3 * 2 * 6.74e9 + 1000 * 4 * 32 * 32 * 128
    assert st.compute_s == pytest.approx(flops / 494.5e12)
    assert st.swap_s == pytest.approx(1e9 / 64e9)
    assert st.total_s == pytest.approx(max(st.memory_s, st.compute_s) + 1e9 / 64e9)
    assert H100.step_s(3, 1000, H100.prefill_flops(200), 1e9) == pytest.approx(st.total_s)
    # a compute-bound decode step: a card with near-infinite bandwidth is priced by its FLOPs alone
    fast = CostModel(LECTURE_7B, GPUSpec("fast-hbm", 80e9, 1e30, 989e12, 64e9))
    assert fast.step_s(8, 8 * 4096, 0.0, 0.0) == pytest.approx(
        (8 * 2 * 6.74e9 + 8 * 4096 * 4 * 32 * 32 * 128) / 494.5e12)
    idle = H100.step(swap_bytes=64e9)  # a swap-only step reads no weights
    assert (idle.memory_s, idle.compute_s, idle.total_s) == (0.0, 0.0, pytest.approx(1.0))


def test_cost_model_additive_and_per_copy_terms_by_hand():
    """overlap=False adds compute to memory (Lecture 2 §2.16's model); block_transfer_s charges every
    block copy of every layer's K and V (the vLLM paper's §7.3)."""
    mem = (13.48e9 + 186 * 640 * 524_288) / 3350e9
    prefill = (2 * 6.74e9 * 4096 + 4 * 32 * 32 * 128 * 4096**2) / 494.5e12
    decode = (186 * 2 * 6.74e9 + 186 * 640 * 4 * 32 * 32 * 128) / 494.5e12
    additive = CostModel(LECTURE_7B, LECTURE_GPU, overlap=False)  # the lecture's card, whatever course.toml names
    st = additive.step(decode_seqs=186, decode_context_tokens=186 * 640, prefill_lens=[4096])
    assert st.total_s == pytest.approx(mem + prefill + decode)
    assert additive.step_s(186, 186 * 640, additive.prefill_flops(4096), 0.0) == pytest.approx(st.total_s)
    assert H100.step(decode_seqs=186, decode_context_tokens=186 * 640, prefill_lens=[4096]).total_s == pytest.approx(
        max(mem, prefill + decode))
    copies = CostModel(LECTURE_7B, LECTURE_GPU, block_transfer_s=5e-6)
    assert copies.step_s(0, 0, 0.0, 1e9, swap_blocks=10) == pytest.approx(1e9 / 64e9 + 10 * 2 * 32 * 5e-6)
    assert copies.swap_round_trip_s(4096, 16) == pytest.approx(2 * (4096 * 524_288 / 64e9 + 2 * 32 * 256 * 5e-6))
    assert copies.preempt_choice(4096, 16) == "recompute" and copies.preempt_choice(4096, 256) == "swap"
    with pytest.raises(ValueError, match="overlap"):
        CostModel(overlap="yes")
    with pytest.raises(ValueError, match="block_transfer_s"):
        CostModel(block_transfer_s=-1.0)


def test_engine_clock_charges_every_swapped_block_copy():
    """The same forced-swap run with and without a per-copy cost differs by exactly copies x cost.  The clock
    prices the course card's model (CostModel's default): a block of 16 tokens is 16 x 2 x L x n_kv x d x b bytes
    (8 MiB for the lecture's 7B), copied as 2 x L tensors (K and V of every layer)."""
    from labsupport import card

    m = card.card().model
    block_bytes = 16 * 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes
    runs = {}
    for t0 in (0.0, 7e-6):
        eng = Engine(cost_model=CostModel(block_transfer_s=t0), num_blocks=24, block_size=16, watermark=0.0,
                     preemption="swap", record_token_times=False)
        for i in range(4):
            eng.add_request(prompt_len=60, max_new_tokens=70, arrival_time=0.0)
        runs[t0] = eng.run()
    a, b = runs[0.0], runs[7e-6]
    assert a.counters.preemptions == b.counters.preemptions and a.counters.preemptions["swap"] > 0
    assert (a.counters.swapped_out_bytes + a.counters.swapped_in_bytes) % block_bytes == 0  # whole blocks move
    blocks = (a.counters.swapped_out_bytes + a.counters.swapped_in_bytes) // block_bytes
    assert b.clock_s - a.clock_s == pytest.approx(blocks * 2 * m.num_layers * 7e-6)


def test_ttft_splits_into_scheduling_delay_queueing_and_prefill():
    eng = cost_engine(7452, 16, watermark=0.0)
    a = eng.add_request(prompt_len=4096, max_new_tokens=3, arrival_time=0.0)
    b = eng.add_request(prompt_len=100, max_new_tokens=2, arrival_time=0.05)  # arrives mid-step
    res = eng.run()
    n_params, attn, f = 6.74e9, 4 * 32 * 32 * 128, 494.5e12
    step1 = (2 * n_params * 4096 + attn * 4096**2) / f  # A's prefill, 129 ms
    # step 2: B's prefill alongside A's first decode (4,097 tokens attended)
    mem2 = (13.48e9 + 4097 * 524_288) / 3350e9
    cmp2 = (2 * n_params * 100 + attn * 100**2 + 2 * n_params + attn * 4097) / f
    step2 = max(mem2, cmp2)
    rb = res.requests[b]
    assert rb.scheduling_delay_s == pytest.approx(step1 - 0.05, rel=1e-12)
    assert rb.queueing_s == 0
    assert rb.prefill_s == pytest.approx(step2, rel=1e-9)
    assert rb.ttft_s == pytest.approx(rb.scheduling_delay_s + rb.queueing_s + rb.prefill_s)
    ra = res.requests[a]
    assert ra.scheduling_delay_s == 0 and ra.queueing_s == 0 and ra.prefill_s == pytest.approx(step1)


def test_queueing_behind_the_watermark():
    def run(watermark):
        eng = cost_engine(100, 16, watermark=watermark)
        a = eng.add_request(prompt_len=80 * 16, max_new_tokens=2)  # 80 blocks, then one more
        b = eng.add_request(prompt_len=15 * 16, max_new_tokens=1)  # 15 blocks
        res = eng.run()
        assert res.counters.leaked_blocks == 0
        return res.requests[a], res.requests[b]

    # watermark 10% = 10 blocks: 100 - 80 - 15 = 5 < 10, so B waits until A leaves
    a, b = run(0.10)
    assert b.admitted_time == a.finish_time and b.queueing_s == a.finish_time > 0
    a, b = run(0.0)  # 5 >= 0: both in the first step
    assert b.admitted_time == 0 and b.queueing_s == 0


# --- preemption policy, overload, rejection, leaks ----------------------------------------------------

def test_victim_is_the_latest_arrival_not_the_sequence_that_needs_the_block():
    eng = cost_engine(6, 4, watermark=0.0, preemption="recompute")
    r0 = eng.add_request(prompt_len=8, max_new_tokens=4)  # 2 full blocks: needs a third at once
    r1 = eng.add_request(prompt_len=5, max_new_tokens=2)  # 2 blocks, room in the second
    r2 = eng.add_request(prompt_len=5, max_new_tokens=2)
    eng.step()  # all three prefilled: 6 of 6 blocks used
    assert eng.allocator.num_free_blocks == 0
    eng.step()  # r0 needs a block: r2, the latest arrival, is evicted, not r1 and not r0
    res = eng.run()
    assert [res.requests[r].preemptions for r in (r0, r1, r2)] == [0, 0, 1]
    assert res.counters.preemptions == {"swap": 0, "recompute": 1}
    assert res.counters.recomputed_tokens == 5  # its prompt; its first token was never cached
    assert all(r.finished for r in res.requests.values()) and res.counters.leaked_blocks == 0


@pytest.mark.parametrize("record", [True, False])
def test_each_step_says_what_it_did(record):
    # The scenario above, step by step, by hand: 6 blocks of 4 tokens.
    # 1: r0 (8 tokens, 2 blocks), r1 and r2 (5 tokens, 2 blocks each) are admitted; each emits its first token.
    # 2: r0's 9th token needs a third block, none is free: r2 (latest) is dropped to recompute; r0 and r1
    #    decode; r1 has its 2 tokens and finishes.  Nothing is admitted in a step that preempted.
    # 3: r0 decodes (9 cached: room in its third block); r2 comes back (5 + 1 tokens = 2 blocks of the 3
    #    free), is prefilled again and emits its second token: it finishes.
    # 4: r0's fourth token: it finishes.  Then nothing is left.
    eng = cost_engine(6, 4, watermark=0.0, preemption="recompute", record_token_times=record)
    for p, m in ((8, 4), (5, 2), (5, 2)):
        eng.add_request(prompt_len=p, max_new_tokens=m)
    outs = []
    while (out := eng.step()) is not None:
        outs.append(out)
    assert [o.admitted for o in outs] == [[0, 1, 2], [], [], []]
    assert [o.preempted for o in outs] == [[], [(2, 0, "recompute")], [], []]
    assert [o.recomputed for o in outs] == [[], [], [(2, 0)], []]
    assert [o.finished for o in outs] == [[], [1], [2], [0]]
    assert [o.num_tokens for o in outs] == [3, 2, 2, 1]
    assert all(o.swapped_in == [] and not o.idle and o.end > o.start for o in outs)
    if record:  # the tokens themselves: (request, index in its output, finished)
        assert [[(t.request_id, t.index, t.finished) for t in o.tokens] for o in outs] == [
            [(0, 0, False), (1, 0, False), (2, 0, False)], [(0, 1, False), (1, 1, True)],
            [(2, 1, True), (0, 2, False)], [(0, 3, True)]]
    else:  # the replay's fast path counts the tokens and keeps none
        assert all(o.tokens is None for o in outs)


def test_a_step_that_waits_for_an_arrival_is_idle():
    eng = cost_engine(10, 4)
    eng.add_request(prompt_len=3, max_new_tokens=1, arrival_time=2.5)
    first = eng.step()
    assert first.idle and first.end == 2.5 and first.admitted == [] and first.tokens == []
    second = eng.step()
    assert second.admitted == [0] and second.finished == [0] and not second.idle
    assert eng.step() is None


@pytest.mark.parametrize("link_gbs, kind", [(64, "swap"), (32, "recompute")])
def test_auto_preemption_follows_the_break_even_for_the_victims_length(link_gbs, kind):
    # The victim below is r2 with 5 cached tokens.  §10.5 / Exercise 4 by hand for the lecture 7B at
    # 50% of 989 TFLOP/s: swapping S tokens costs 2 S 524,288 / W, recomputing them
    # (2 x 6.74e9 S + 4 x 32 x 32 x 128 S^2) / 494.5e12.  At S = 5: recompute = 136.3 us;
    # swap = 81.9 us on 64 GB/s (swap wins) and 163.8 us on 32 GB/s (recompute wins: the 32 GB/s
    # crossover is 5,195 tokens, below which recomputing is cheaper).
    s = 5
    rec = (2 * 6.74e9 * s + 4 * 32 * 32 * 128 * s**2) / 494.5e12
    swap = 2 * s * 524_288 / (link_gbs * 1e9)
    assert (swap < rec) == (kind == "swap")
    cm = CostModel(LECTURE_7B, LECTURE_GPU, link_bandwidth=link_gbs * GB)
    eng = cost_engine(6, 4, watermark=0.0, preemption="auto", cost_model=cm)
    rids = [eng.add_request(prompt_len=p, max_new_tokens=m) for p, m in ((8, 4), (5, 2), (5, 2))]
    res = eng.run()
    assert [res.requests[r].preemptions for r in rids] == [0, 0, 1]
    assert res.counters.preemptions == {"swap": int(kind == "swap"), "recompute": int(kind == "recompute")}
    if kind == "swap":  # two blocks of 4 tokens out and back, 524,288 B per token
        assert res.counters.swapped_out_bytes == res.counters.swapped_in_bytes == 2 * 4 * 524_288


def test_swapped_branches_come_back_oldest_first():
    # n = 3 off a full 4-token block, pool of 2 blocks.  Step 2: each branch needs a fresh block and
    # one is free: branch 0 takes it; branch 1 needs one, so the latest (branch 2) is swapped out -
    # which frees nothing, the prompt block is still shared - and then branch 1 itself.  When
    # branch 0 finishes, 2 blocks are free: enough for one branch (4 tokens + its next slot = 2
    # blocks).  The oldest, branch 1, must come back first, though it was swapped out last.
    eng = cost_engine(2, 4, watermark=0.0, preemption="swap")
    rid = eng.add_request(prompt_len=4, max_new_tokens=4, n=3)
    res = eng.run()
    t = res.requests[rid].token_times
    assert res.counters.preemptions == {"swap": 2, "recompute": 0}
    assert t[0][-1] < t[1][1] and t[1][-1] < t[2][1]  # 0 finishes, then 1 runs, then 2


def test_a_swap_costs_its_bytes_over_the_link_on_the_clock():
    # the victim scenario with preemption="swap": r2's 2 blocks of 4 tokens go out and come back,
    # 2 x 8 x 524,288 B in all; everything else about the schedule is the same on an infinite link
    def clock(link):
        eng = cost_engine(6, 4, watermark=0.0, preemption="swap",
                          cost_model=CostModel(LECTURE_7B, LECTURE_GPU, link_bandwidth=link))
        for p, m in ((8, 4), (5, 2), (5, 2)):
            eng.add_request(prompt_len=p, max_new_tokens=m)
        res = eng.run()
        assert res.counters.preemptions["swap"] == 1
        return res.clock_s

    assert clock(64e9) - clock(1e30) == pytest.approx(2 * 8 * 524_288 / 64e9, rel=1e-9)


@pytest.mark.parametrize("mode", ["swap", "recompute", "auto"])
def test_overload_finishes_everything_and_leaks_nothing(mode):
    rng = random.Random(3)
    eng = cost_engine(40, 16, preemption=mode, max_num_seqs=64)
    want = {}
    for i in range(60):
        p, o, n = rng.randint(1, 300), rng.randint(1, 200), rng.choice([1, 1, 1, 2])
        want[eng.add_request(prompt_len=p, max_new_tokens=o, n=n, arrival_time=rng.uniform(0, 0.5))] = [o] * n
    res = eng.run()
    assert res.counters.total_preemptions > 10
    assert {i: r.num_output_tokens for i, r in res.requests.items()} == want
    assert all(r.finished for r in res.requests.values())
    assert eng.allocator.num_used_blocks == 0 and res.counters.leaked_blocks == 0
    assert res.counters.blocks_in_use[-1] == 0 and max(res.counters.blocks_in_use) == res.counters.peak_blocks <= 40
    assert res.counters.peak_running <= 64


@settings(max_examples=150, deadline=None)
@given(block_size=st.sampled_from([1, 2, 4, 8]), num_blocks=st.integers(1, 12),
       mode=st.sampled_from(["swap", "recompute", "auto"]), watermark=st.sampled_from([0.0, 0.1]),
       max_num_seqs=st.sampled_from([2, 4, 256]),
       reqs=st.lists(st.tuples(st.integers(1, 24), st.integers(1, 24), st.integers(1, 3),
                               st.floats(0, 0.01)), min_size=1, max_size=6))
def test_any_small_pool_finishes_every_request_it_accepts(block_size, num_blocks, mode, watermark, max_num_seqs,
                                                           reqs):
    """Random tiny pools, fan-outs and arrivals: whatever add_request accepts, run() finishes with
    every branch's tokens, the bookkeeping consistent and no block in use (a stalled or leaking
    engine fails here)."""
    eng = cost_engine(num_blocks, block_size, watermark=watermark, preemption=mode, max_num_seqs=max_num_seqs)
    ids = {eng.add_request(prompt_len=p, max_new_tokens=o, n=n, arrival_time=t): (o, n) for p, o, n, t in reqs}
    res = eng.run(max_steps=100_000)
    assert not eng.has_unfinished
    for rid, (o, n) in ids.items():
        r = res.requests[rid]
        assert r.status in ("finished", "rejected")
        if r.finished:
            assert r.num_output_tokens == [o] * n
    eng.allocator.check_invariants()
    assert eng.allocator.num_used_blocks == 0 and res.counters.leaked_blocks == 0


def test_requests_that_can_never_fit_are_rejected_and_the_rest_run():
    eng = cost_engine(10, 16, watermark=0.2)  # 10 blocks; new admissions keep 2 free
    ok1 = eng.add_request(prompt_len=30, max_new_tokens=20)
    too_long = eng.add_request(prompt_len=100, max_new_tokens=100)  # 199 cached tokens = 13 blocks
    too_wide = eng.add_request(prompt_len=150, max_new_tokens=1)  # 10 blocks + 2 watermark > 10
    ok2 = eng.add_request(prompt_len=8 * 16, max_new_tokens=33)  # 8 + 2 blocks to enter; grows to exactly 10
    res = eng.run()
    assert res.requests[too_long].status == "rejected"
    assert "13 blocks" in res.requests[too_long].reason and "has 10" in res.requests[too_long].reason
    assert res.requests[too_wide].status == "rejected" and "watermark" in res.requests[too_wide].reason
    assert res.requests[ok1].finished and res.requests[ok2].finished
    assert res.counters.rejected == 2 and res.counters.leaked_blocks == 0
    rep = res.slo(10.0, 1.0)
    assert rep.rejected == 2 and rep.finished == 2 and len(rep.rejections) == 2


def test_token_budget_caps_prefills_per_step_but_never_starves_a_long_prompt():
    eng = cost_engine(1000, 16, max_num_batched_tokens=1000)
    a = eng.add_request(prompt_len=600, max_new_tokens=2)
    b = eng.add_request(prompt_len=600, max_new_tokens=2)
    c = eng.add_request(prompt_len=3000, max_new_tokens=2)  # longer than the budget: runs alone
    res = eng.run()
    r = res.requests
    assert r[a].admitted_time == 0 and r[b].admitted_time > 0 and r[c].admitted_time > r[b].admitted_time
    assert all(x.finished for x in r.values())


def test_token_budget_counts_the_decode_tokens_too():
    # budget 1,000: step 1 prefills A (600; B's 500 would make 1,100).  Step 2 decodes A (1 token),
    # leaving 999: B (500) fits, C (500) would make 1,001 and waits for step 3.
    eng = cost_engine(1000, 16, max_num_batched_tokens=1000)
    a, b, c = (eng.add_request(prompt_len=p, max_new_tokens=3) for p in (600, 500, 500))
    r = eng.run().requests
    t1, t2 = r[a].admitted_time, r[b].admitted_time
    assert t1 == 0 < t2 < r[c].admitted_time
    assert r[c].admitted_time == r[a].token_times[0][1]  # the end of step 2 (A's second token)


def test_model_engine_runs_on_the_cost_clock_like_the_ledger(model):
    # real tokens, cost-model time: a 5-token prompt, then decodes attending to 6 and 7 tokens
    eng = Engine(model, num_blocks=10, block_size=4, cost_model=H100, watermark=0.0)
    rid = eng.add_request([1, 2, 3, 4, 5], 3)
    t = eng.run().requests[rid].token_times[0]
    assert t[0] == pytest.approx(13.48e9 / 3350e9)  # a 5-token prefill is memory-bound: the weights
    assert t[1] - t[0] == pytest.approx((13.48e9 + 6 * 524_288) / 3350e9, rel=1e-9)
    assert t[2] - t[1] == pytest.approx((13.48e9 + 7 * 524_288) / 3350e9, rel=1e-9)


def test_max_num_seqs_bounds_the_batch():
    eng = cost_engine(1000, 16, max_num_seqs=3)
    for _ in range(8):
        eng.add_request(prompt_len=10, max_new_tokens=5)
    res = eng.run()
    assert res.counters.peak_running == 3 and all(r.finished for r in res.requests.values())


def test_bad_arguments_are_clear_errors(model):
    with pytest.raises(ValueError, match="needs a model"):
        Engine(num_blocks=10)
    with pytest.raises(ValueError, match="preemption"):
        cost_engine(10, preemption="evict")
    with pytest.raises(ValueError, match="watermark"):
        cost_engine(10, watermark=1.5)
    with pytest.raises(ValueError, match="num_blocks"):
        cost_engine(0)
    eng = cost_engine(10)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.add_request(prompt_len=5, max_new_tokens=0)
    with pytest.raises(ValueError, match="n must"):
        eng.add_request(prompt_len=5, max_new_tokens=1, n=0)
    with pytest.raises(ValueError, match="at least one token"):
        eng.add_request(prompt_len=0, max_new_tokens=1)
    with pytest.raises(ValueError, match="arrival_time"):
        eng.add_request(prompt_len=5, max_new_tokens=1, arrival_time=-1)
    assert eng.run().requests == {}  # the rejected calls left nothing behind
    real = Engine(model, num_blocks=10, block_size=4, cost_model=H100)
    with pytest.raises(ValueError, match="prompt_ids"):
        real.add_request(prompt_len=5, max_new_tokens=1)
    with pytest.raises(ValueError, match="vocabulary"):
        real.add_request([1, 999], 3)
    with pytest.raises(ValueError, match="prompt token id must be an integer"):
        real.add_request([1, 2.5], 3)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_model_engine_rejects_requests_past_the_context_window():
    m = TinyTransformer(ModelConfig(max_seq_len=16, init_std=0.3))
    eng = Engine(m, num_blocks=50, block_size=4, cost_model=H100)
    ok = eng.add_request([1, 2, 3], 14)  # 3 + 14 - 1 = 16 positions
    too_long = eng.add_request([1, 2, 3], 15)
    res = eng.run()
    assert res.requests[ok].finished and len(res.requests[ok].outputs[0]) == 14
    assert res.requests[too_long].status == "rejected" and "max_seq_len=16" in res.requests[too_long].reason


# --- the SLO ledger -----------------------------------------------------------------------------------

def test_percentiles_match_numpy():
    # the SLO ledger's p50/p99 against an independent reference (numpy's default, linear)
    import numpy as np

    from labsupport.slo import _pct

    rng = random.Random(1)
    for n in (1, 2, 7, 100):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 99, 100):
            assert _pct(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)
    assert _pct([], 50) is None  # undefined, never NaN (strict JSON carries it as null)


def test_goodput_counts_only_requests_meeting_both_slos():
    # a GPU of round numbers: weights 1 s per step, so every decode step takes 1 s plus KV
    gpu = GPUSpec("toy", 1e12, 13.48e9, 1e30, 1e9)
    eng = cost_engine(10_000, 16, cost_model=CostModel(LECTURE_7B, gpu), watermark=0.0)
    fast = eng.add_request(prompt_len=10, max_new_tokens=2, arrival_time=0.0)
    slow = eng.add_request(prompt_len=10, max_new_tokens=4, arrival_time=10.0)
    res = eng.run()
    kv = 524_288 / 13.48e9  # seconds per cached token per step
    # fast: prefill step 1 s (compute is free) -> TTFT 1; one decode at 11 tokens attended
    assert res.requests[fast].ttft_s == pytest.approx(1.0)
    assert res.requests[fast].tpot_s == pytest.approx(1 + 11 * kv)
    # slow: same TTFT; three decodes at 11, 12, 13 tokens
    assert res.requests[slow].tpot_s == pytest.approx(1 + 12 * kv)
    rep = slo_report(res, ttft_slo_s=1.5, tpot_slo_s=1 + 11.5 * kv)
    assert rep.good_requests == 1 and rep.goodput_req_frac == 0.5
    assert rep.good_tokens == 2 and rep.goodput_tok_frac == pytest.approx(2 / 6)
    assert rep.output_tokens == 6 and rep.finished == 2
    assert rep.duration_s == pytest.approx(res.requests[slow].finish_time)
    assert slo_report(res, 0.5, 10).good_requests == 0  # TTFT of 1 s misses a 0.5 s SLO
    with pytest.raises(ValueError, match="ttft_slo_s"):
        slo_report(res, 0, 1)


def test_a_policy_function_decides_each_victim_and_a_bad_answer_is_refused():
    # The pool of the auto test above (6 blocks of 4): r2, 5 tokens cached, is the one victim.  A policy of
    # one's own is asked with the victim's cached tokens, and its answer is what the engine does.
    asked = []

    def policy(num_tokens):
        asked.append(num_tokens)
        return "recompute" if num_tokens < 100 else "swap"

    eng = cost_engine(6, 4, watermark=0.0, preemption=policy)
    for p, m in ((8, 4), (5, 2), (5, 2)):
        eng.add_request(prompt_len=p, max_new_tokens=m)
    res = eng.run()
    assert asked == [5] and res.counters.preemptions == {"swap": 0, "recompute": 1}
    eng = cost_engine(6, 4, watermark=0.0, preemption=lambda n: "evict")
    for p, m in ((8, 4), (5, 2), (5, 2)):
        eng.add_request(prompt_len=p, max_new_tokens=m)
    with pytest.raises(ValueError, match="must return 'swap' or 'recompute'"):
        eng.run()
    with pytest.raises(ValueError, match="or a function"):
        cost_engine(6, 4, preemption="sometimes")


def test_iterations_hand_on_the_arrivals_of_a_skipped_idle_step():
    """A request refused at once makes an idle step; the requests that joined before it are still handed to the
    next iteration yielded, so a caller that records arrivals (stream_engine) loses none and stays in step."""
    from labsupport.costmodel import CostModel

    eng = Engine(cost_model=CostModel(), num_blocks=8, block_size=16)
    schedule = [(0, dict(prompt_len=10_000, max_new_tokens=2)), (1, dict(prompt_len=16, max_new_tokens=2))]
    seen = [rid for _, arrived in eng.iterations(schedule) for rid in arrived]
    assert seen == [0, 1]


def test_an_arrival_that_no_iteration_follows_still_reaches_on_arrival():
    """The last request is refused at once (10,000 tokens in a pool of 8 x 16 = 128 slots) and nothing runs after it:
    no iteration is yielded to carry it, yet on_arrival saw it, and stream_engine records its lengths."""
    from labsupport.costmodel import CostModel
    from labsupport.measure.engine_runs import stream_engine

    schedule = [(0, dict(prompt_len=16, max_new_tokens=2)), (5, dict(prompt_len=10_000, max_new_tokens=3))]
    eng = Engine(cost_model=CostModel(), num_blocks=8, block_size=16, record_token_times=True)
    joined = []
    yielded = [rid for _, arrived in eng.iterations(schedule, on_arrival=lambda rid, kw: joined.append((rid, kw)))
               for rid in arrived]
    assert yielded == [0] and joined == [(0, schedule[0][1]), (1, schedule[1][1])]
    eng = Engine(cost_model=CostModel(), num_blocks=8, block_size=16, record_token_times=True)
    log = stream_engine(eng, schedule)
    assert log.max_new == {0: 2, 1: 3} and log.result.requests[1].finished is False
