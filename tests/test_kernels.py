"""The Triton paged-attention kernels (§10.3 step three) against answers computed here, independently.

Every expected value comes from per-sequence contiguous K/V that this file draws first and then
scatters into a NaN-filled pool with its own loops; attention is recomputed in float64 from those
contiguous tensors.  Nothing expected is read back from labsupport.kernels.  On CPU the kernels run
through Triton's interpreter, so shapes stay tiny; the GPU cases are marked and skipped without CUDA.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import labsupport  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
from labsupport import kernel_args
from labsupport import kernels as K

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

FP32_TOL = dict(rtol=1e-5, atol=1e-5)
LOW_TOL = {torch.bfloat16: dict(rtol=1e-2, atol=1e-2), torch.float16: dict(rtol=5e-3, atol=5e-3)}


# ------------------------------------------------------------------------------------------------
# Building a paged pool from ground truth, the way an allocator would, with plain loops
# ------------------------------------------------------------------------------------------------
class Case:
    """q, a NaN-filled pool holding each sequence's K/V at shuffled blocks, and the truth."""

    def __init__(self, seed, lens, hq, hkv, d, bs, dtype=torch.float32, device="cpu", spare=3,
                 share_first_block=False, high_ids=False, table_pad=2):
        g = torch.Generator().manual_seed(seed)
        self.lens, self.bs, self.dtype = list(lens), bs, dtype
        need = [-(-n // bs) for n in lens]
        num_blocks = sum(need) + spare
        # physical ids: a random permutation of the pool, or (high_ids) the pool's last ids
        ids = torch.randperm(num_blocks, generator=g).tolist()
        if high_ids:
            ids = list(range(num_blocks - 1, -1, -1))
        self.keys, self.values = [], []
        kc = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=dtype)
        vc = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=dtype)
        # padding entries past each sequence's blocks hold junk that must never be read
        table = torch.full((len(lens), max(need, default=0) + table_pad), 2**31 - 1, dtype=torch.int32)
        table[:, -1] = -5
        cursor = 0
        donor = None  # the first sequence with a full block; later ones may share that block
        for b, n in enumerate(lens):
            k = torch.randn(n, hkv, d, generator=g).to(dtype)
            v = torch.randn(n, hkv, d, generator=g).to(dtype)
            for j in range(need[b]):
                if share_first_block and j == 0 and n >= bs and donor is not None:
                    # a fork: this sequence's first block *is* the donor's (same id, same data)
                    table[b, 0] = table[donor, 0]
                    k[:bs], v[:bs] = self.keys[donor][:bs], self.values[donor][:bs]
                    continue
                blk = ids[cursor]
                cursor += 1
                table[b, j] = blk
                for slot in range(min(bs, n - j * bs)):
                    kc[blk, slot] = k[j * bs + slot]
                    vc[blk, slot] = v[j * bs + slot]
            if donor is None and n >= bs:
                donor = b
            self.keys.append(k)
            self.values.append(v)
        self.q = torch.randn(len(lens), hq, d, generator=g).to(dtype).to(device)
        self.k_cache, self.v_cache = kc.to(device), vc.to(device)
        self.block_tables = table.to(device)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        self.num_blocks = num_blocks

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens

    def truth(self, scale=None):
        """softmax(scale * q K^T) V in float64, per sequence, from the contiguous originals."""
        q = self.q.cpu().double()
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        out = torch.empty_like(q)
        for b, (k, v) in enumerate(zip(self.keys, self.values)):
            for h in range(q.shape[1]):
                kv_head = h // (q.shape[1] // k.shape[1])
                scores = (k[:, kv_head].double() @ q[b, h]) * scale
                w = torch.exp(scores - scores.max())
                out[b, h] = (w / w.sum()) @ v[:, kv_head].double()
        return out

    def poisoned_out(self):
        return torch.full_like(self.q, float("nan"))


def assert_matches(out, expected, dtype):
    assert not torch.isnan(out).any(), "output has NaN: a slot was left unwritten or a NaN slot was read"
    tol = FP32_TOL if dtype == torch.float32 else LOW_TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), expected, **tol)


def lengths_for(bs, k=2):
    """1, k*bs - 1, k*bs, k*bs + 1 — the edges of a block boundary."""
    return [1, k * bs - 1, k * bs, k * bs + 1]


# ------------------------------------------------------------------------------------------------
# Paged decode attention, fp32 (<= 1e-5) across block sizes, GQA ratios and head dims
# ------------------------------------------------------------------------------------------------
HEADS = [(4, 4), (8, 2), (8, 1), (5, 1)]  # GQA ratios 1, 4, 8, and 5 query heads on 1 KV head
MATRIX = [(hq, hkv, d, bs) for (hq, hkv) in HEADS for d, bs in [(16, 8), (32, 16), (64, 32), (16, 64), (32, 256)]]


@pytest.mark.parametrize("hq,hkv,d,bs", MATRIX)
def test_paged_attention_fp32_matches_float64_truth(hq, hkv, d, bs):
    case = Case(seed=hq * 1000 + d * 10 + bs, lens=lengths_for(bs, k=1 if bs == 256 else 2),
                hq=hq, hkv=hkv, d=d, bs=bs, share_first_block=True)
    out = case.poisoned_out()
    returned = K.paged_decode_attention(*case.args(), out=out)
    assert returned is out
    assert_matches(out, case.truth(), torch.float32)


@pytest.mark.parametrize("hq,hkv,d,bs", [(4, 4, 32, 16), (8, 1, 16, 8), (5, 1, 64, 64)])
def test_reference_matches_float64_truth(hq, hkv, d, bs):
    """The torch reference the labs compare with is itself right, on the same NaN-poisoned pool."""
    case = Case(seed=7 + bs, lens=lengths_for(bs), hq=hq, hkv=hkv, d=d, bs=bs, share_first_block=True)
    assert_matches(K.paged_decode_attention_reference(*case.args()), case.truth(), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq,hkv,d,bs", [(4, 4, 32, 16), (8, 2, 16, 8), (9, 3, 64, 16), (5, 1, 64, 64)])
def test_batched_torch_path_matches_float64_truth(dtype, hq, hkv, d, bs):
    """The CPU path a model decodes with (one gather for the batch, then fused attention) reads the same
    NaN-poisoned pool through the same junk-padded tables, and never a slot past a sequence's length."""
    case = Case(seed=23 + d + bs, lens=lengths_for(bs) + [3 * bs + 5], hq=hq, hkv=hkv, d=d, bs=bs, dtype=dtype,
                share_first_block=True)
    out = K.paged_decode_attention_torch(*case.args())
    assert out.dtype == dtype and out.shape == case.q.shape
    assert_matches(out, case.truth(), dtype)
    fast = K.paged_decode_attention_torch(*case.args(), validate=False)
    assert torch.equal(fast, out)
    if dtype == torch.float32:  # the same numbers as the per-sequence reference, to float32 rounding
        torch.testing.assert_close(out, K.paged_decode_attention_reference(*case.args()), **FP32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_torch_path_groups_a_mixed_batch_by_length(dtype):
    """A mixed batch attends in groups of similar length (no group pads to more than twice its tokens), in any
    order of the batch, with the same result as one padded call would give."""
    lens = [100, 2, 37, 1, 101, 3]
    groups = K.length_groups(lens)
    assert [sorted(lens[i] for i in g) for g in groups] == [[1, 2, 3], [37, 100, 101]]
    assert all(len(g) * max(lens[i] for i in g) <= 2 * sum(lens[i] for i in g) for g in groups)
    case = Case(seed=31, lens=lens, hq=6, hkv=2, d=32, bs=8, dtype=dtype)
    assert_matches(K.paged_decode_attention_torch(*case.args()), case.truth(), dtype)
    assert K.length_groups([]) == [] and K.length_groups([5, 5, 5]) == [[0, 1, 2]]
    assert K.length_groups([10, 1, 2, 3], power=2) == [[1, 2, 3], [0]]  # a prompt's attention grows as its square


def test_batched_torch_path_refuses_what_the_kernel_refuses():
    case = Case(seed=5, lens=[3, 20], hq=4, hkv=2, d=16, bs=8)
    q, kc, vc, table, lens = case.args()
    with pytest.raises(ValueError, match="seq_lens"):
        K.paged_decode_attention_torch(q, kc, vc, table, torch.tensor([0, 20], dtype=torch.int32))
    bad = table.clone()
    bad[1, 0] = case.num_blocks + 4
    with pytest.raises(ValueError, match="outside the pool"):
        K.paged_decode_attention_torch(q, kc, vc, bad, lens)
    with pytest.raises(IndexError):  # unvalidated, torch's indexing still refuses it
        K.paged_decode_attention_torch(q, kc, vc, bad, lens, validate=False)
    assert K.paged_decode_attention_torch(q[:0], kc, vc, table[:0], lens[:0]).shape == (0, 4, 16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq,hkv,d,bs", [(4, 4, 32, 16), (8, 1, 64, 8), (5, 1, 16, 256)])
def test_paged_attention_half_precision(dtype, hq, hkv, d, bs):
    case = Case(seed=11 + d, lens=lengths_for(bs, k=1), hq=hq, hkv=hkv, d=d, bs=bs, dtype=dtype)
    out = case.poisoned_out()
    K.paged_decode_attention(*case.args(), out=out)
    assert out.dtype == dtype
    assert_matches(out, case.truth(), dtype)


def test_custom_scale_and_default_scale():
    case = Case(seed=3, lens=[5, 17], hq=4, hkv=2, d=32, bs=8)
    assert_matches(K.paged_decode_attention(*case.args(), scale=0.3), case.truth(scale=0.3), torch.float32)
    assert_matches(K.paged_decode_attention(*case.args()), case.truth(scale=32 ** -0.5), torch.float32)


def test_dot_and_broadcast_paths_agree_on_the_same_gqa_input():
    # GQA normally takes the tl.dot path (group padded to 16 rows); the broadcast path must agree.
    case = Case(seed=5, lens=[1, 33, 64], hq=8, hkv=2, d=32, bs=16)
    layout, _ = kernel_args.check_paged_attention(*case.args(), None, 1, None, None, True, K._INTERPRETING)
    results = []
    for use_dot in (True, False):
        out = case.poisoned_out()
        K._launch_attention(*case.args(), out, layout, 32 ** -0.5, 1, paged=True, use_dot=use_dot)
        assert_matches(out, case.truth(), torch.float32)
        results.append(out)
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tile", [16, 128])
def test_tile_larger_and_smaller_than_block(tile):
    case = Case(seed=tile, lens=[1, 31, 32, 33, 100], hq=4, hkv=1, d=16, bs=32)
    assert_matches(K.paged_decode_attention(*case.args(), tile_tokens=tile), case.truth(), torch.float32)


# ------------------------------------------------------------------------------------------------
# Split-K (flash-decoding): any number of splits gives the same answer
# ------------------------------------------------------------------------------------------------
def test_split_k_invariance():
    case = Case(seed=21, lens=[1, 63, 257], hq=8, hkv=2, d=32, bs=16)
    truth = case.truth()
    outs = {}
    for splits in (1, 2, 3, 8):  # 8 splits of a 1-token sequence: 7 empty partials to merge
        out = case.poisoned_out()
        K.paged_decode_attention(*case.args(), num_splits=splits, out=out)
        assert_matches(out, truth, torch.float32)
        outs[splits] = out
    for splits, out in outs.items():
        torch.testing.assert_close(out, outs[1], rtol=2e-6, atol=2e-6, msg=f"num_splits={splits}")


def test_one_split_through_the_merge_equals_the_unsplit_kernel(monkeypatch):
    case = Case(seed=22, lens=[9, 70], hq=4, hkv=4, d=16, bs=8)
    layout, _ = kernel_args.check_paged_attention(*case.args(), None, 1, None, None, True, K._INTERPRETING)
    direct = K.paged_decode_attention(*case.args())
    merged = case.poisoned_out()
    K._launch_attention(*case.args(), merged, layout, 16 ** -0.5, 1, paged=True, force_split=True)
    torch.testing.assert_close(merged, direct, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Block ids at the pool's edge, and addresses past int32
# ------------------------------------------------------------------------------------------------
def test_block_ids_near_num_blocks():
    case = Case(seed=31, lens=[40, 17, 64], hq=4, hkv=2, d=16, bs=16, spare=0, high_ids=True)
    assert int(case.block_tables[0, 0]) == case.num_blocks - 1  # the pool's last block is in use
    assert_matches(K.paged_decode_attention(*case.args()), case.truth(), torch.float32)
    bad = case.block_tables.clone()
    bad[2, 1] = case.num_blocks
    with pytest.raises(ValueError, match=r"block_tables\[2, 1\] = %d is outside the pool" % case.num_blocks):
        K.paged_decode_attention(case.q, case.k_cache, case.v_cache, bad, case.seq_lens)


# Block 16, Hkv 8, D 128: stride_block = 16,384 elements, so any id above 131,071 overflows int32.
STRIDE_SLOT = 8 * 128
STRIDE_BLOCK = 16 * STRIDE_SLOT


def _huge_table():
    ids = [2**31 - 1, 2**31 - 2, 131_072, 3]
    table = torch.tensor([ids + [-1], [7, 2**30, 0, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([4 * 16, 2 * 16 - 3], dtype=torch.int32)
    expected = torch.full((2, 64), -1, dtype=torch.int64)
    for b in range(2):
        for t in range(int(lens[b])):
            expected[b, t] = int(table[b, t // 16]) * STRIDE_BLOCK + (t % 16) * STRIDE_SLOT
    return table, lens, expected


def test_token_offsets_are_int64_for_a_pool_beyond_int32():
    table, lens, expected = _huge_table()
    assert int(expected.max()) > 2**31 * 1000  # these offsets really do not fit in int32
    got = K.kv_token_offsets(table, lens, 16, STRIDE_BLOCK, STRIDE_SLOT)
    assert torch.equal(got, expected)


@triton.jit
def _offset_without_widening(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    block = tl.load(table_row + token // BLOCK_SIZE, mask=valid, other=0)
    return (block * stride_block + (token % BLOCK_SIZE) * stride_slot).to(tl.int64)


def test_the_int64_test_catches_an_int32_address_line():
    table, lens, expected = _huge_table()
    got = K.kv_token_offsets(table, lens, 16, STRIDE_BLOCK, STRIDE_SLOT, token_offset_fn=_offset_without_widening)
    assert not torch.equal(got, expected)


# ------------------------------------------------------------------------------------------------
# The lab hook: a student's address line drives the real kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _student_offset(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    physical = tl.load(table_row + token // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    return physical * stride_block + (token % BLOCK_SIZE).to(tl.int64) * stride_slot


@triton.jit
def _offset_ignoring_table(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    return (token // BLOCK_SIZE).to(tl.int64) * stride_block + (token % BLOCK_SIZE) * stride_slot


def test_token_offset_fn_replaces_the_address_line():
    case = Case(seed=41, lens=[20, 33], hq=4, hkv=2, d=16, bs=8, spare=0)
    right = K.paged_gather(case.k_cache, case.block_tables, case.seq_lens, token_offset_fn=_student_offset)
    for b, n in enumerate(case.lens):
        assert torch.equal(right[b, :n], case.keys[b])
    wrong = K.paged_gather(case.k_cache, case.block_tables, case.seq_lens, token_offset_fn=_offset_ignoring_table)
    assert not torch.equal(wrong[0, :20], case.keys[0])
    out = K.paged_decode_attention(*case.args(), token_offset_fn=_student_offset)
    assert_matches(out, case.truth(), torch.float32)
    with pytest.raises(ValueError, match="triton.jit"):
        K.paged_gather(case.k_cache, case.block_tables, case.seq_lens, token_offset_fn=lambda *a: 0)


# ------------------------------------------------------------------------------------------------
# The gather kernel, the contiguous kernel, and gather-then-attend
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bs", [8, 16, 32, 64, 256])
def test_paged_gather_is_bit_exact(dtype, bs):
    lens = [1, bs - 1, bs, bs + 1, 0]
    case = Case(seed=bs, lens=lens, hq=2, hkv=2, d=16, bs=bs, dtype=dtype, share_first_block=True)
    out = torch.full((5, bs + 1, 2, 16), float("nan"), dtype=dtype)
    K.paged_gather(case.k_cache, case.block_tables, case.seq_lens, out=out)
    for b, n in enumerate(lens):
        assert torch.equal(out[b, :n], case.keys[b])
        assert torch.equal(out[b, n:], torch.zeros_like(out[b, n:]))


def test_paged_gather_allocates_max_len_and_accepts_a_longer_out():
    case = Case(seed=2, lens=[3, 12], hq=2, hkv=1, d=32, bs=8)
    got = K.paged_gather(case.v_cache, case.block_tables, case.seq_lens)
    assert got.shape == (2, 12, 1, 32)
    assert torch.equal(got[1], case.values[1])
    longer = torch.full((2, 30, 1, 32), float("nan"))
    K.paged_gather(case.v_cache, case.block_tables, case.seq_lens, out=longer)
    assert torch.equal(longer[:, :12], got) and torch.equal(longer[:, 12:], torch.zeros(2, 18, 1, 32))
    with pytest.raises(ValueError, match="out must have shape"):
        K.paged_gather(case.v_cache, case.block_tables, case.seq_lens, out=torch.zeros(2, 11, 1, 32))


@pytest.mark.parametrize("hq,hkv,dtype", [(4, 4, torch.float32), (8, 1, torch.float32), (5, 1, torch.bfloat16)])
def test_contiguous_kernel_reads_only_the_first_seq_len_tokens(hq, hkv, dtype):
    case = Case(seed=51, lens=[1, 15, 16, 17], hq=hq, hkv=hkv, d=32, bs=8, dtype=dtype)
    s_max = 24
    k = torch.full((4, s_max, hkv, 32), float("nan"), dtype=dtype)
    v = torch.full((4, s_max, hkv, 32), float("nan"), dtype=dtype)
    for b, n in enumerate(case.lens):
        k[b, :n], v[b, :n] = case.keys[b], case.values[b]
    for splits in (1, 3):
        out = case.poisoned_out()
        K.contiguous_decode_attention(case.q, k, v, case.seq_lens, num_splits=splits, out=out)
        assert_matches(out, case.truth(), dtype)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 25 must be in 1..S_max=24"):
        K.contiguous_decode_attention(case.q, k, v, torch.tensor([25, 1, 1, 1], dtype=torch.int32))


def test_gather_then_attend_matches_truth_with_and_without_workspace():
    case = Case(seed=61, lens=[1, 31, 32, 33], hq=8, hkv=2, d=16, bs=16, share_first_block=True)
    assert_matches(K.gather_then_attend(*case.args()), case.truth(), torch.float32)
    ws = (torch.full((4, 40, 2, 16), float("nan")), torch.full((4, 40, 2, 16), float("nan")))
    out = case.poisoned_out()
    K.gather_then_attend(*case.args(), num_splits=2, out=out, workspace=ws)
    assert_matches(out, case.truth(), torch.float32)


# ------------------------------------------------------------------------------------------------
# Validation: a clear ValueError before any launch
# ------------------------------------------------------------------------------------------------
def _valid():
    c = Case(seed=71, lens=[5, 9], hq=4, hkv=2, d=16, bs=8)
    return dict(q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, block_tables=c.block_tables, seq_lens=c.seq_lens)


BAD = {
    "q rank": (lambda a: a.update(q=a["q"][0]), r"q must be \[B, Hq, D\]"),
    "dtype mismatch": (lambda a: a.update(q=a["q"].half()), "must share a dtype"),
    "int8 cache": (lambda a: a.update(k_cache=a["k_cache"].to(torch.int8), v_cache=a["v_cache"].to(torch.int8)),
                   "not supported"),
    "v shape": (lambda a: a.update(v_cache=a["v_cache"][:, :, :1].contiguous()), "v_cache shape"),
    "int64 table": (lambda a: a.update(block_tables=a["block_tables"].long()), "block_tables must be int32"),
    "int64 lens": (lambda a: a.update(seq_lens=a["seq_lens"].long()), "seq_lens must be int32"),
    "table rows": (lambda a: a.update(block_tables=a["block_tables"][:1]), r"block_tables must be \[B=2"),
    "non-contiguous q": (lambda a: a.update(q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)),
                         "q must be contiguous"),
    "heads": (lambda a: a.update(q=torch.zeros(2, 3, 16)), r"Hq \(3\) must be a positive multiple of Hkv \(2\)"),
    "head dim": (lambda a: a.update(q=torch.zeros(2, 4, 8)), "q head dim 8 does not match"),
    "D not pow2": (lambda a: a.update(q=torch.zeros(2, 4, 24), k_cache=torch.zeros(6, 8, 2, 24),
                                      v_cache=torch.zeros(6, 8, 2, 24)), "must be a power of two <= 256, got 24"),
    "block not pow2": (lambda a: a.update(k_cache=torch.zeros(6, 12, 2, 16), v_cache=torch.zeros(6, 12, 2, 16)),
                       "block_size .* got 12"),
    "len zero": (lambda a: a["seq_lens"].__setitem__(1, 0), r"seq_lens\[1\] = 0"),
    "len over capacity": (lambda a: a["seq_lens"].__setitem__(0, 8 * a["block_tables"].shape[1] + 1),
                          "exceeds the block table's capacity"),
    "negative id in use": (lambda a: a["block_tables"].__setitem__((1, 1), -1), r"block_tables\[1, 1\] = -1"),
    "device": (lambda a: a.update(seq_lens=a["seq_lens"].to("meta")), "one device"),
    "not a tensor": (lambda a: a.update(seq_lens=[5, 9]), "seq_lens must be a torch.Tensor"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_arguments_raise_value_error_naming_the_problem(name):
    args = _valid()
    mutate, message = BAD[name]
    mutate(args)
    with pytest.raises(ValueError, match=message):
        K.paged_decode_attention(**args)


@pytest.mark.parametrize("kwargs,message", [
    (dict(scale=float("nan")), "scale must be a finite"),
    (dict(num_splits=0), "num_splits must be an int"),
    (dict(num_splits=2.0), "num_splits must be an int"),
    (dict(out=torch.zeros(2, 4, 8)), "out must have shape"),
    (dict(out=torch.zeros(2, 4, 16, dtype=torch.float64)), "out must be torch.float32"),
    (dict(tile_tokens=8), "tile_tokens must be a power of two in 16..256"),
])
def test_bad_options_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        K.paged_decode_attention(**_valid(), **kwargs)


def test_table_entries_past_seq_len_may_hold_anything():
    args = _valid()
    args["block_tables"][:, -2:] = torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32)  # never read
    case_out = K.paged_decode_attention(**args)
    assert not torch.isnan(case_out).any()


def test_rejected_call_leaves_out_untouched():
    args = _valid()
    out = torch.full((2, 4, 16), 7.0)
    args["block_tables"][0, 0] = 10**6
    with pytest.raises(ValueError):
        K.paged_decode_attention(**args, out=out)
    assert torch.equal(out, torch.full((2, 4, 16), 7.0))


def test_suggest_num_splits_by_hand():
    # 132 SMs: B=1, Hkv=8 gives 8 programs; 2*132/8 = 33 splits, allowed by 8192 // (4*64) = 32 tiles
    assert K.suggest_num_splits(1, 8, 8192, 132) == 32
    assert K.suggest_num_splits(64, 8, 8192, 132) == 1  # 512 programs already fill the GPU
    assert K.suggest_num_splits(1, 32, 512, 132) == 2  # 512 // 256 = 2 caps the wanted 9
    assert K.suggest_num_splits(2, 8, 100, 132) == 1  # too short to split


# ------------------------------------------------------------------------------------------------
# Without triton: the torch reference, with one warning that says why
# ------------------------------------------------------------------------------------------------
FALLBACK_SCRIPT = textwrap.dedent("""
    import sys, warnings
    {prelude}
    import torch
    import labsupport
    from labsupport import kernels as K
    warnings.simplefilter("always")
    q = torch.randn(2, 4, 16); kc = torch.randn(4, 8, 2, 16); vc = torch.randn(4, 8, 2, 16)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32); lens = torch.tensor([9, 5], dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        a = K.paged_decode_attention(q, kc, vc, table, lens)
        b = K.paged_decode_attention(q, kc, vc, table, lens, num_splits=2)
        g = K.paged_gather(kc, table, lens)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1, msgs
    print(msgs[0])
    # by hand: sequence 0 is pool block 2 (tokens 0-7) then block 0 slot 0 (token 8)
    keys = torch.cat([kc[2], kc[0, :1]]).repeat_interleave(2, dim=1)
    vals = torch.cat([vc[2], vc[0, :1]]).repeat_interleave(2, dim=1)
    w = torch.softmax(torch.einsum("hd,nhd->hn", q[0], keys) / 4.0, dim=-1)
    torch.testing.assert_close(a[0], torch.einsum("hn,nhd->hd", w, vals))
    torch.testing.assert_close(a, b)
    assert torch.equal(g[1, :5], kc[1, :5])
    print("ok")
""")


@pytest.mark.slow  # a subprocess that imports torch and triton afresh
@pytest.mark.parametrize("prelude,reason", [
    ("sys.modules['triton'] = None", "triton is not importable"),
    ("import os; os.environ.pop('TRITON_INTERPRET', None); import triton", "without TRITON_INTERPRET=1"),
])
def test_fallback_warns_once_and_uses_the_reference(prelude, reason):
    if CUDA and "TRITON_INTERPRET" in prelude:
        pytest.skip("with CUDA present, CPU tensors without the interpreter is not the situation under test")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT.format(prelude=prelude)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    warning, ok = run.stdout.strip().splitlines()[-2:]
    assert reason in warning and "torch reference" in warning
    assert ok == "ok"


# ------------------------------------------------------------------------------------------------
# GPU: the same checks compiled for CUDA, at real sizes (skipped without a GPU)
# ------------------------------------------------------------------------------------------------
@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq,hkv", [(32, 32), (32, 8), (32, 4), (5, 1)])
@pytest.mark.parametrize("bs", [8, 16, 32, 64, 128, 256])
def test_gpu_paged_attention_matrix(dtype, hq, hkv, bs):
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 needs sm_80+")
    case = Case(seed=bs + hq, lens=lengths_for(bs) + [1000], hq=hq, hkv=hkv, d=128, bs=bs, dtype=dtype,
                device="cuda", share_first_block=True)
    for splits in (1, 4):
        out = case.poisoned_out()
        K.paged_decode_attention(*case.args(), num_splits=splits, out=out)
        assert_matches(out, case.truth(), dtype)
    out = K.gather_then_attend(*case.args())
    assert_matches(out, case.truth(), dtype)


@gpu
@needs_cuda
def test_gpu_token_offsets_are_int64():
    table, lens, expected = _huge_table()
    got = K.kv_token_offsets(table.cuda(), lens.cuda(), 16, STRIDE_BLOCK, STRIDE_SLOT)
    assert torch.equal(got.cpu(), expected)


@gpu
@needs_cuda
def test_gpu_bf16_rejected_before_sm80():
    if torch.cuda.get_device_capability()[0] >= 8:
        pytest.skip("this GPU supports bf16")
    case = Case(seed=1, lens=[4], hq=2, hkv=2, d=16, bs=8, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="use fp16"):
        K.paged_decode_attention(*case.args())


# ------------------------------------------------------------------------------------------------
# The benchmark's bookkeeping, run on CPU with a stand-in timer (its figures are checked by hand)
# ------------------------------------------------------------------------------------------------
def test_decode_rows_bytes_and_ratios_by_hand():
    from labsupport.bench import kernel as KB

    # call order per combo: contiguous, SDPA, then per block size: paged, gather-then-attend
    times = iter([1.0, 4.0, 2.0, 6.0, 2.5, 5.0])

    def timer(fn):
        fn()
        return next(times)

    rows = KB.decode_rows([(2, 32, 2, (8, 16))], copy_bandwidth=1e7, dtype=torch.float32, num_sms=4,
                          num_q_heads=4, head_dim=16, device="cpu", timer=timer)
    # K and V: 2 tensors x B=2 x S=32 x Hkv=2 x D=16 x 4 B = 16,384 B; q and out: 2 x (2 x 4 x 16 x 4 B) = 1,024 B
    assert [r["bytes_moved"] for r in rows] == [17_408, 17_408]
    assert [r["table_bytes"] for r in rows] == [2 * 4 * 4, 2 * 2 * 4]  # 32/8 and 32/16 int32 entries per sequence
    first, second = rows
    assert first["paged_gbps"] == pytest.approx(17_408 / 2e-3 / 1e9)
    assert first["pct_of_copy"] == pytest.approx(17_408 / 2e-3 / 1e7)
    ratios = (first["paged_over_contiguous"], first["gather_then_attend_over_paged"], first["sdpa_over_paged"])
    assert ratios == (2.0, 3.0, 2.0)
    assert (second["paged_over_contiguous"], second["gather_then_attend_over_paged"]) == (2.5, 2.0)
    assert max(r["max_abs_diff_vs_contiguous"] for r in rows) < 1e-6


def test_decode_rows_skip_what_does_not_fit(monkeypatch):
    from labsupport.bench import kernel as KB

    monkeypatch.setattr(KB, "_free_bytes", lambda device: 10_000)  # 2 x 16,384 B needed > 80% of 10 kB
    rows = KB.decode_rows([(2, 32, 2, (8, 16))], 1e9, torch.float32, 4, num_q_heads=4, head_dim=16, device="cpu",
                          timer=lambda fn: pytest.fail("nothing should be timed"))
    assert [r["block_size"] for r in rows] == [8, 16] and all("needs 0.0 GB" in r["skipped"] for r in rows)


def test_gpu_check_matrix_runs_on_cpu_and_passes():
    from labsupport.bench import kernel as KB

    results = KB.correctness_matrix(configs=[(torch.float32, 8, 5, 1, 3), (torch.bfloat16, 16, 4, 2, 1)],
                                    head_dim=16, long_len=40, device="cpu", progress=None)
    assert [r["passed"] for r in results] == [True, True]
    assert results[0]["seq_lens"] == [1, 15, 16, 17, 40]


@pytest.mark.skipif(CUDA, reason="checks the CPU behaviour of the bench commands")
def test_bench_commands_on_cpu(tmp_path, capsys):
    from labsupport import bench

    out = tmp_path / "cpu.json"
    assert bench.main(["kernel", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "say nothing about GPU performance" in printed
    import json

    payload = json.loads(out.read_text())
    assert {r["function"] for r in payload["cpu_interpreter"]} >= {"paged_gather", "paged_decode_attention",
                                                                   "contiguous_decode_attention", "gather_then_attend"}
    assert bench.main(["gpu", "--out", str(tmp_path / "gpu.json")]) == 2  # one line, like any refused input
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "gpu.json").exists()
