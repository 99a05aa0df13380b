"""The paged KV cache on real tensors: gather must return exactly the K/V each sequence was given.

The reference is a plain Python list of per-token (k, v) tensors per sequence; no cache code is
involved in building it.  Values are integers below 2^24 (exact in float32; the dtype test uses
random values), so comparisons are bit for bit (torch.equal).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from labsupport.kvcache import ContiguousKVCache, PagedKVCache
from labsupport.memory_stats import OutOfBlocks, ReservationExceeded, SwappedOut, UnknownSequence

L, H, D = 2, 2, 3


def token_kv(key: int):
    """One token's (k, v), each [L, H, D] float32: a distinct pattern per key (mod 1,000,003, so two
    tokens of one test never collide by accident), every value an integer below 2^24, so exact."""
    base = torch.arange(L * H * D, dtype=torch.float32).reshape(L, H, D)
    k = base + (key % 1_000_003) * 16
    return k, (-k - 1)


def stack(tokens, dtype=torch.float32):
    """[(k, v), ...] -> k, v each [L, T, H, D] (T may be 0)."""
    if not tokens:
        z = torch.zeros(L, 0, H, D, dtype=dtype)
        return z, z.clone()
    return torch.stack([t[0] for t in tokens], 1), torch.stack([t[1] for t in tokens], 1)


def state_of(cache: PagedKVCache):
    snap = cache.allocator.snapshot()
    data = {s: cache.gather(s) for s in cache.allocator.block_tables}
    return snap, data


def assert_unchanged(cache, before):
    snap, data = state_of(cache)
    assert snap == before[0]
    assert data.keys() == before[1].keys()
    for s in data:
        assert torch.equal(data[s][0], before[1][s][0]) and torch.equal(data[s][1], before[1][s][1])
    cache.check_invariants()


# ---------------------------------------------------------------------------------------------
# Targeted behaviour
# ---------------------------------------------------------------------------------------------


def test_slot_mapping_follows_the_block_table():
    cache = PagedKVCache(8, 4, L, H, D)
    assert cache.prepare_prefill("a", 6).tolist() == [0, 1, 2, 3, 4, 5]  # blocks 0, 1
    cache.free("a")  # free list is now 2..7, then 1, 0 (released tail first)
    assert cache.prepare_prefill("b", 5).tolist() == [8, 9, 10, 11, 12]  # blocks 2, 3
    assert cache.prepare_decode(["b"]).tolist() == [13]  # block 3, offset 1
    assert cache.block_table_tensor(["b"]).tolist() == [[2, 3]]


def test_copy_on_write_copies_the_tensor_block_on_first_divergent_write():
    cache = PagedKVCache(8, 4, L, H, D)
    prompt = [token_kv(i) for i in range(6)]  # block 0 full, block 1 holds 2 tokens
    cache.add_sequence("p", *stack(prompt))
    cache.fork("p", "c")
    shared = cache.block_table("p")[1]
    assert cache.ref_counts()[shared] == 2
    k1, v1 = token_kv(50)
    cache.append(["c"], k1[:, None], v1[:, None])
    c_last = cache.block_table("c")[1]
    assert c_last != shared and cache.block_table("c")[0] == cache.block_table("p")[0]
    assert torch.equal(cache.k_cache[0][c_last, :2], cache.k_cache[0][shared, :2])  # the copy
    assert torch.equal(cache.gather("p")[0], stack(prompt)[0])  # the parent never saw the child's token
    assert torch.equal(cache.gather("c")[0], stack(prompt + [(k1, v1)])[0])
    k2, v2 = token_kv(60)
    cache.append(["p"], k2[:, None], v2[:, None])  # ref_count is 1 again: written in place
    assert cache.block_table("p")[1] == shared
    cache.check_invariants()


def test_swap_in_lands_in_other_blocks_with_identical_content():
    cache = PagedKVCache(4, 2, L, H, D)
    toks = [token_kv(i) for i in range(4)]
    cache.add_sequence("a", *stack(toks))
    old = cache.swap_out("a")
    assert cache.is_swapped("a") and cache.allocator.num_free_blocks == 4
    assert torch.equal(cache.host_copy("a")[0], stack(toks)[0])
    assert old == [0, 1]
    cache.add_sequence("b", *stack([token_kv(9)] * 5))  # free list 2, 3, 1, 0: b takes 2, 3, 1
    before = state_of(cache)
    with pytest.raises(OutOfBlocks):
        cache.swap_in("a")  # one block free, a needs two: nothing changes, the host copy stays
    assert_unchanged(cache, before)
    assert cache.is_swapped("a")
    cache.free("b")  # free list 0, 1, 3, 2
    cache.add_sequence("c", *stack([token_kv(8)]))  # takes block 0
    new = cache.swap_in("a")
    assert new == [1, 3]
    assert torch.equal(cache.gather("a")[0], stack(toks)[0]) and torch.equal(cache.gather("a")[1], stack(toks)[1])
    cache.check_invariants()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_any_float_dtype_round_trips_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache(6, 4, L, H, D, dtype=dtype)
    k = torch.randn(L, 7, H, D, generator=g).to(dtype)
    v = torch.randn(L, 7, H, D, generator=g).to(dtype)
    cache.add_sequence(0, k, v)
    cache.fork(0, 1)
    k1 = torch.randn(L, 2, H, D, generator=g).to(dtype)
    v1 = torch.randn(L, 2, H, D, generator=g).to(dtype)
    cache.append([0, 1], k1, v1)
    cache.swap_out(1)
    cache.swap_in(1)
    for s in (0, 1):
        gk, gv = cache.gather(s)
        assert gk.dtype == dtype
        assert torch.equal(gk, torch.cat([k, k1[:, s:s + 1]], 1)) and torch.equal(gv, torch.cat([v, v1[:, s:s + 1]], 1))
    assert cache.kv_bytes_per_token == 2 * L * H * D * torch.empty((), dtype=dtype).element_size()


def test_tables_and_lengths_for_the_kernel():
    cache = PagedKVCache(8, 2, L, H, D)
    cache.add_sequence("x", *stack([token_kv(i) for i in range(5)]))  # 3 blocks
    cache.add_sequence("y", *stack([token_kv(i) for i in range(1)]))  # 1 block
    bt = cache.block_table_tensor(["x", "y"])
    assert bt.dtype == torch.int32 and bt.tolist() == [[0, 1, 2], [3, 0, 0]]
    sl = cache.seq_lens_tensor(["x", "y"])
    assert sl.dtype == torch.int32 and sl.tolist() == [5, 1]
    assert cache.k_cache[0].shape == (8, 2, H, D) and len(cache.v_cache) == L
    assert cache.occupancy() == 4 / 8 and cache.pool_bytes == 8 * 2 * (2 * L * H * D * 4)


def test_prefix_cached_prompt_is_not_rewritten():
    cache = PagedKVCache(8, 2, L, H, D, enable_prefix_caching=True)
    ids = [3, 1, 4, 1, 5]
    toks = [token_kv(i) for i in range(5)]
    cache.add_sequence("a", *stack(toks), token_ids=ids)
    # same ids, different K/V values: the shared blocks must keep what "a" wrote
    other = [token_kv(i + 40) for i in range(5)]
    cache.add_sequence("b", *stack(other), token_ids=ids)
    assert cache.allocator.num_cached_tokens["b"] == 4
    assert cache.block_table("a")[:2] == cache.block_table("b")[:2]
    assert torch.equal(cache.gather("b")[0], stack(toks[:4] + other[4:])[0])
    assert torch.equal(cache.gather("a")[0], stack(toks)[0])


def test_drop_for_recompute_frees_everything():
    cache = PagedKVCache(4, 2, L, H, D)
    cache.add_sequence("a", *stack([token_kv(i) for i in range(3)]))
    assert cache.drop("a") == 3
    assert cache.allocator.num_free_blocks == 4
    with pytest.raises(UnknownSequence):
        cache.gather("a")


def test_bad_input_is_rejected_and_changes_nothing():
    with pytest.raises(ValueError, match="power of two, got 3"):
        PagedKVCache(4, 3, L, H, D)
    with pytest.raises(ValueError, match="floating-point"):
        PagedKVCache(4, 2, L, H, D, dtype=torch.int32)
    cache = PagedKVCache(4, 2, L, H, D)
    cache.add_sequence("a", *stack([token_kv(i) for i in range(3)]))
    cache.add_sequence("s", *stack([token_kv(1)]))
    cache.swap_out("s")
    k, v = token_kv(7)
    good_k, good_v = k[:, None], v[:, None]
    before = state_of(cache)
    cases = [
        (ValueError, "expected \\(2, 1, 2, 3\\)", lambda: cache.append(["a"], good_k[:, :, :1], good_v)),
        (ValueError, "dtype torch.float64", lambda: cache.append(["a"], good_k.double(), good_v)),
        (ValueError, "appears twice", lambda: cache.append(["a", "a"], torch.cat([good_k] * 2, 1), torch.cat([good_v] * 2, 1))),
        (SwappedOut, "swapped out", lambda: cache.append(["s"], good_k, good_v)),
        (UnknownSequence, "unknown sequence 'zz'", lambda: cache.append(["zz"], good_k, good_v)),
        (UnknownSequence, "unknown sequence", lambda: cache.free("zz")),
        (ValueError, "already exists", lambda: cache.add_sequence("a", good_k, good_v)),
        (ValueError, "4-D tensor", lambda: cache.add_sequence("n", k, v)),
        (OutOfBlocks, "needs 4", lambda: cache.add_sequence("big", *stack([token_kv(0)] * 8))),
        (ValueError, "layer must be < num_layers=2, got 2", lambda: cache.write(2, torch.tensor([0]), k[0][None], v[0][None])),
        (ValueError, "outside the pool", lambda: cache.write(0, torch.tensor([8]), k[0][None], v[0][None])),
        (ValueError, "int64", lambda: cache.write(0, torch.tensor([0], dtype=torch.int32), k[0][None], v[0][None])),
        (ValueError, "not swapped out", lambda: cache.swap_in("a")),
        (SwappedOut, "swapped out", lambda: cache.gather("s")),
        (SwappedOut, "swapped out", lambda: cache.block_table_tensor(["s"])),
    ]
    for exc, match, fn in cases:
        with pytest.raises(exc, match=match):
            fn()
        assert_unchanged(cache, before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_swap_uses_pinned_host_memory_on_cuda():
    cache = PagedKVCache(16, 16, L, H, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(L, 40, H, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(L, 40, H, D, device="cuda", dtype=torch.bfloat16)
    cache.add_sequence("a", k, v)
    cache.swap_out("a")
    hk, _ = cache.host_copy("a")
    assert hk.device.type == "cpu" and hk.is_pinned()
    cache.add_sequence("b", k, v)  # takes the freed blocks
    cache.swap_in("a")
    assert cache.block_table("a") != cache.block_table("b")
    assert torch.equal(cache.gather("a")[0], k) and torch.equal(cache.gather("a")[1], v)


# ---------------------------------------------------------------------------------------------
# The contiguous baseline
# ---------------------------------------------------------------------------------------------


def test_contiguous_cache_round_trip_and_limits():
    cache = ContiguousKVCache(2, 4, L, H, D)
    toks = [token_kv(i) for i in range(3)]
    assert cache.add_sequence("a", *stack(toks)) == 0
    k, v = token_kv(9)
    cache.append(["a"], k[:, None], v[:, None])
    assert torch.equal(cache.gather("a")[0], stack(toks + [(k, v)])[0])
    assert cache.k_cache[0].shape == (2, 4, H, D)
    with pytest.raises(ReservationExceeded, match="S_max=4"):
        cache.append(["a"], k[:, None], v[:, None])  # slot full: cannot grow
    assert cache.gather("a")[0].shape[1] == 4
    cache.add_sequence("b", *stack(toks[:1]))
    with pytest.raises(OutOfBlocks, match="all 2 slots"):
        cache.add_sequence("c", *stack(toks[:1]))
    with pytest.raises(ValueError, match="exceeds S_max=4"):
        cache.add_sequence("d", *stack(toks * 2))
    st_ = cache.stats()
    assert st_.reserved_tokens == 8 and st_.occupied_tokens == 5 and st_.internal_tokens == 3
    assert cache.slot_indices_tensor(["a", "b"]).tolist() == [0, 1]
    cache.free("a")
    assert cache.add_sequence("c", *stack(toks[:1])) == 0  # the freed slot is reused
    cache.check_invariants()


def test_contiguous_cache_rejects_bad_input_and_changes_nothing():
    cache = ContiguousKVCache(2, 4, L, H, D)
    toks = [token_kv(i) for i in range(3)]
    cache.add_sequence("a", *stack(toks))
    cache.add_sequence("full", *stack(toks + [token_kv(3)]))  # at S_max already
    k, v = token_kv(9)
    one_k, one_v = k[:, None], v[:, None]

    def state():
        a = cache.gather("a")
        return cache.allocator.layout(), {s: sl.length for s, sl in cache.allocator.slots.items()}, a

    before = state()
    cases = [
        (UnknownSequence, "unknown sequence 'zz'", lambda: cache.append(["zz"], one_k, one_v)),
        (ValueError, "appears twice", lambda: cache.append(["a", "a"], torch.cat([one_k] * 2, 1),
                                                          torch.cat([one_v] * 2, 1))),
        (ValueError, "expected \\(2, 2, 2, 3\\)", lambda: cache.append(["a", "full"], one_k, one_v)),
        # all or nothing: "a" has room, "full" does not, so "a" must not grow either
        (ReservationExceeded, "'full' is at S_max=4", lambda: cache.append(["a", "full"], torch.cat([one_k] * 2, 1),
                                                                           torch.cat([one_v] * 2, 1))),
        (ValueError, "already holds a slot", lambda: cache.add_sequence("a", *stack(toks[:1]))),
        (OutOfBlocks, "all 2 slots", lambda: cache.add_sequence("c", *stack(toks[:1]))),
        (UnknownSequence, "unknown sequence", lambda: cache.free("zz")),
    ]
    for exc, match, fn in cases:
        with pytest.raises(exc, match=match):
            fn()
        after = state()
        assert after[:2] == before[:2], match
        assert torch.equal(after[2][0], before[2][0]) and torch.equal(after[2][1], before[2][1])
        cache.check_invariants()


def test_same_workload_reads_back_the_same_from_both_caches():
    paged = PagedKVCache(16, 4, L, H, D)
    contiguous = ContiguousKVCache(3, 16, L, H, D)
    for i, n in enumerate([5, 1, 9]):
        toks = stack([token_kv(10 * i + j) for j in range(n)])
        paged.add_sequence(i, *toks)
        contiguous.add_sequence(i, *toks)
    for step in range(6):
        k = torch.stack([token_kv(100 + 3 * step + i)[0] for i in range(3)], 1)
        v = torch.stack([token_kv(100 + 3 * step + i)[1] for i in range(3)], 1)
        paged.append([0, 1, 2], k, v)
        contiguous.append([0, 1, 2], k, v)
    for i in range(3):
        assert torch.equal(paged.gather(i)[0], contiguous.gather(i)[0])
        assert torch.equal(paged.gather(i)[1], contiguous.gather(i)[1])
    assert paged.stats().occupied_tokens == contiguous.stats().occupied_tokens == 15 + 18
    assert paged.stats().reserved_tokens == (3 + 2 + 4) * 4 < contiguous.stats().reserved_tokens == 48


# ---------------------------------------------------------------------------------------------
# Random operation sequences on real tensors
# ---------------------------------------------------------------------------------------------


class CacheMachine(RuleBasedStateMachine):
    """Random prefill/decode/fork/free/swap/drop/prefix-hit sequences; gather vs. a list of K/V."""

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(3, 16), prefix=st.booleans())
    def setup(self, block_size, num_blocks, prefix):
        self.cache = PagedKVCache(num_blocks, block_size, L, H, D, enable_prefix_caching=prefix)
        self.model: dict[int, list] = {}
        self.ids: dict[int, list | None] = {}
        self.swapped: dict[int, list] = {}
        self.counter = 0

    def _kv(self, sid, pos):
        ids = self.ids.get(sid)
        if ids is not None and len(ids) > pos:  # K/V is a function of the prefix, as in a real model
            return token_kv(hash(tuple(ids[: pos + 1])))
        self.counter += 1
        return token_kv(self.counter)

    def _new_id(self):
        self.counter += 1
        return self.counter

    def _add(self, ids, n):
        sid = self._new_id()
        self.ids[sid] = ids
        toks = [self._kv(sid, i) for i in range(n)]
        before = state_of(self.cache)
        try:
            self.cache.add_sequence(sid, *stack(toks), token_ids=ids)
        except OutOfBlocks:
            del self.ids[sid]
            assert_unchanged(self.cache, before)
            return
        if self.cache.allocator.cached_tokens(sid):
            event("prefix hit")
        self.model[sid] = toks

    @rule(n=st.integers(0, 9), vocab=st.sampled_from([None, 1, 2]), data=st.data())
    def add(self, n, vocab, data):
        ids = None if vocab is None else data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
        self._add(ids, n)

    @precondition(lambda self: any(self.ids.get(s) for s in self.model))
    @rule(data=st.data(), extra=st.lists(st.integers(0, 2), max_size=4))
    def add_same_prefix(self, data, extra):
        src = data.draw(st.sampled_from([s for s in sorted(self.model) if self.ids.get(s)]))
        ids = self.ids[src][: data.draw(st.integers(1, len(self.ids[src])))] + extra
        self._add(ids, len(ids))

    def _append(self, seqs, with_ids):
        ids = [s % 3 for s in seqs] if with_ids else None
        for s, t in zip(seqs, ids or [None] * len(seqs)):
            if self.ids.get(s) is not None:
                self.ids[s] = self.ids[s] + [t] if t is not None else None
        toks = [self._kv(s, len(self.model[s])) for s in seqs]
        before = state_of(self.cache)
        try:
            self.cache.append(seqs, torch.stack([t[0] for t in toks], 1), torch.stack([t[1] for t in toks], 1), ids)
        except OutOfBlocks:
            assert_unchanged(self.cache, before)
            return
        for s, t in zip(seqs, toks):
            self.model[s].append(t)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), with_ids=st.booleans())
    def append(self, data, with_ids):
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, max_size=4, unique=True))
        saved = {s: self.ids.get(s) for s in seqs}
        n_before = {s: len(self.model[s]) for s in seqs}
        self._append(seqs, with_ids)
        if any(len(self.model[s]) == n_before[s] for s in seqs):  # rejected: restore the id lists
            self.ids.update(saved)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), diverge=st.booleans())
    def fork(self, data, diverge):
        parent = data.draw(st.sampled_from(sorted(self.model)))
        child = self._new_id()
        self.cache.fork(parent, child)
        self.model[child] = list(self.model[parent])
        self.ids[child] = None if self.ids.get(parent) is None else list(self.ids[parent])
        if diverge:
            table = self.cache.block_table(parent)
            n = len(self.model[parent])
            if n % self.cache.block_size and len(table):
                event("copy-on-write")
            saved = {s: self.ids.get(s) for s in (parent, child)}
            self._append([parent, child], False)
            if len(self.model[child]) == n:
                self.ids.update(saved)

    @precondition(lambda self: self.model or self.swapped)
    @rule(data=st.data(), how=st.sampled_from(["free", "drop"]))
    def free(self, data, how):
        sid = data.draw(st.sampled_from(sorted(self.model) + sorted(self.swapped)))
        getattr(self.cache, how)(sid)
        self.model.pop(sid, None)
        self.swapped.pop(sid, None)
        self.ids.pop(sid, None)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def swap_out(self, data):
        sid = data.draw(st.sampled_from(sorted(self.model)))
        self.cache.swap_out(sid)
        self.swapped[sid] = self.model.pop(sid)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        sid = data.draw(st.sampled_from(sorted(self.swapped)))
        before = state_of(self.cache)
        try:
            self.cache.swap_in(sid)
        except OutOfBlocks:
            assert_unchanged(self.cache, before)
            return
        event("swap in")
        self.model[sid] = self.swapped.pop(sid)

    @rule(data=st.data())
    def rejected(self, data):
        before = state_of(self.cache)
        k, v = token_kv(0)
        ops = ["bad_shape", "unknown"] + (["swapped"] if self.swapped else [])
        op = data.draw(st.sampled_from(ops))
        if op == "bad_shape":
            with pytest.raises(ValueError):
                self.cache.add_sequence(self._new_id(), k, v)
        elif op == "unknown":
            with pytest.raises(UnknownSequence):
                self.cache.append([-1], k[:, None], v[:, None])
        else:
            with pytest.raises(SwappedOut):
                self.cache.append([next(iter(self.swapped))], k[:, None], v[:, None])
        assert_unchanged(self.cache, before)

    @invariant()
    def reads_back_exactly(self):
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants()
        for sid, toks in self.model.items():
            k, v = self.cache.gather(sid)
            ek, ev = stack(toks)
            assert torch.equal(k, ek) and torch.equal(v, ev), f"sequence {sid} reads back wrong K/V"
        for sid, toks in self.swapped.items():
            hk, hv = self.cache.host_copy(sid)
            assert torch.equal(hk, stack(toks)[0]) and torch.equal(hv, stack(toks)[1])


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
