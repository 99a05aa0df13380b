"""Lab 04's checkoffs on the new grading design.

4.3, posed as what one decode step's attention must move (not as its terms): two different correct
derivations pass, and the plausible wrong counts are rejected with a remark naming the slip.
By hand, the lecture's headline point (B = 64, S = 8,192, GQA-8, D = 128, bf16): K and V 2 × 64 × 8,192 × 8 × 128
× 2 = 2,147,483,648 B, query and output 2 × 64 × 32 × 128 × 2 = 1,048,576 B; gather-then-attend moves the
K/V bytes three times: 3 × 2,147,483,648 + 1,048,576 = 6,443,499,520 B.  4.4's givens are one layer of the course
card's GQA form at that point (on A100-80GB + Qwen2.5-7B, GQA-4 with 28 query heads: 3 × 1,073,741,824 + 917,504 =
3,222,142,976 B); its slips are worked out here on the card's givens.

4.1 and 4.2: their cases are data only (4.2's tensors are made from a seed where the student's line runs,
and its expected outputs are the kernels' torch references outside); the slips the old graders named
(int32 offsets, a product that overflows near 2**31, a line that is not @triton.jit, an unfinished one)
are still named.
"""
from __future__ import annotations

import json

import pytest
import torch

import labsupport  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
from labsupport import card
from labsupport.course import checkoff as C
from labsupport.course import record
from labsupport.course.checkoff import check
from labsupport.course.checkoffs import get
from labsupport.course.judge import Mismatch, Unfinished, close
from labsupport.course.registry import GIVENS, case_rng, namespace

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_results")


def _problem(cid: str, answer) -> str:
    checkoff = get(cid)
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(answer, checkoff.prepare(case_rng(cid)))
    return str(err.value)


def kv(b, s, hkv, d, e):
    return 2 * b * s * hkv * d * e


def q_out(b, hq, d, e):
    return 2 * b * hq * d * e


def test_4_3_headline_by_hand():
    assert kv(64, 8192, 8, 128, 2) + q_out(64, 32, 128, 2) == 2_147_483_648 + 1_048_576


def test_4_3_two_derivations_pass(capsys):
    check("4.3", lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e) + q_out(b, hq, d, e))

    def per_sequence(b, s, hq, hkv, d, e):  # walk the batch: each sequence's cache, then its q row and out row
        total = 0
        for _ in range(b):
            total += sum(s * d * e for _tensor in ("K", "V") for _head in range(hkv))
            total += sum(d * e for _row in ("q", "out") for _head in range(hq))
        return total

    check("4.3", per_sequence)
    assert capsys.readouterr().out.count("passed") == 2


@pytest.mark.parametrize("fn, words", [
    (lambda b, s, hq, hkv, d, e: kv(b, s, hq, d, e) + q_out(b, hq, d, e), "once per *query* head"),
    (lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e), "the query and the output cross HBM too"),
    (lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e) + q_out(b, hq, d, e) // 2, "not the output written"),
    (lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e) // 2 + q_out(b, hq, d, e), "keys but not the values"),
])
def test_4_3_names_the_slip(fn, words):
    assert words in _problem("4.3", fn)


# --- 4.4 -------------------------------------------------------------------------------------------

# The lecture's headline point: one layer of its GQA-8 7B (32 query heads, 8 KV heads of 128, bf16), B = 64, S = 8,192
LECTURE_GIVENS = dict(BATCH=64, SEQ_LEN=8192, Q_HEADS=32, KV_HEADS=8, HEAD_DIM=128, DTYPE_BYTES=2)


def _card_givens() -> dict:
    """Lab 04's givens on the course card, from its spec fields: one layer of the card's GQA form at the benchmark's
    headline point (the lab's workload, B = 64 and S = 8,192, stays the lecture's)."""
    m = card.card().gqa
    return dict(BATCH=64, SEQ_LEN=8192, Q_HEADS=m.num_heads, KV_HEADS=m.num_kv_heads, HEAD_DIM=m.head_dim,
                DTYPE_BYTES=m.dtype_bytes)


def _parts(n) -> tuple[int, int]:
    """(K/V bytes of every sequence, query and output bytes) on givens `n`, by hand."""
    return kv(n.BATCH, n.SEQ_LEN, n.KV_HEADS, n.HEAD_DIM, n.DTYPE_BYTES), q_out(n.BATCH, n.Q_HEADS, n.HEAD_DIM,
                                                                              n.DTYPE_BYTES)


def test_4_4_headline_by_hand_and_two_derivations_on_hidden_givens():
    c = get("4.4")
    assert c.expect(namespace(LECTURE_GIVENS)) == 3 * 2_147_483_648 + 1_048_576 == 6_443_499_520  # the lecture's
    assert GIVENS[4].lecture == _card_givens()  # the build set the givens cell from the card
    k_v, q_o = _parts(namespace(_card_givens()))
    assert c.expect() == 3 * k_v + q_o  # pool read, buffer write, buffer read; the query and the output once
    for g in [GIVENS[4].lecture, *GIVENS[4].draw(case_rng("givens", b"lab04 test", "x"), 4)]:
        n = namespace(g)
        fused = kv(n.BATCH, n.SEQ_LEN, n.KV_HEADS, n.HEAD_DIM, n.DTYPE_BYTES) + q_out(n.BATCH, n.Q_HEADS, n.HEAD_DIM,
                                                                                     n.DTYPE_BYTES)
        # pool read, buffer write, buffer read; then the query and the output once
        c.verdict(3 * fused - 2 * q_out(n.BATCH, n.Q_HEADS, n.HEAD_DIM, n.DTYPE_BYTES), c.expect(n))
        per_sequence = sum(3 * 2 * n.SEQ_LEN * n.KV_HEADS * n.HEAD_DIM * n.DTYPE_BYTES
                           + 2 * n.Q_HEADS * n.HEAD_DIM * n.DTYPE_BYTES for _ in range(n.BATCH))
        c.verdict(per_sequence, c.expect(n))


SLIPS_4_4 = {  # the remark's words: the slip's answer on givens n, by hand
    "fused paged kernel": lambda n: _parts(n)[0] + _parts(n)[1],
    "gather's read and write": lambda n: 2 * _parts(n)[0] + _parts(n)[1],
    "query and the output cross HBM too": lambda n: 3 * _parts(n)[0],
    "copies only K and V": lambda n: 3 * (_parts(n)[0] + _parts(n)[1]),
    "KV heads, not query heads": lambda n: 3 * kv(n.BATCH, n.SEQ_LEN, n.Q_HEADS, n.HEAD_DIM, n.DTYPE_BYTES)
    + _parts(n)[1],
}


@pytest.mark.parametrize("words", SLIPS_4_4)
def test_4_4_names_the_slip(words, fails):
    """check() grades on the givens lab 04's record publishes (the card it was built for: the lecture's 2**31 + 2**20
    B is the fused count on its card)."""
    n = namespace(record.read(4)["givens"])
    with fails(words):
        check("4.4", SLIPS_4_4[words](n))


def test_4_4_no_listed_mistake_is_right_on_any_givens():
    """On the card's givens and on hidden ones no slip is the answer, and no two slips coincide (each remark can fire:
    the card's GQA form has fewer KV heads than query heads, so the query-heads count differs from the right one)."""
    c = get("4.4")
    for g in [_card_givens(), LECTURE_GIVENS, *GIVENS[4].draw(case_rng("givens", b"lab04 mistakes", "x"), 8)]:
        n = namespace(g)
        spec = c.value_spec(n)
        assert spec["mistakes"] and not any(close(w, spec["want"]) for w, _ in spec["mistakes"])
        slips = [slip(n) for slip in SLIPS_4_4.values()]
        assert len(set(slips)) == len(slips) and spec["want"] not in slips, g
        assert sorted(w for w, _ in spec["mistakes"]) == sorted(slips), g  # every slip named here is listed


# Item 4: each step 4.4's prompt names, dropped from a derivation on the givens' names, fails on hidden givens.
def _gta(n, crossings=3, q_and_out=True, cache_heads=None, q_out_crossings=1, layers=1):
    heads = n.KV_HEADS if cache_heads is None else cache_heads
    kv_bytes = kv(n.BATCH, n.SEQ_LEN, heads, n.HEAD_DIM, n.DTYPE_BYTES)
    return layers * (crossings * kv_bytes + q_out_crossings * q_and_out * q_out(n.BATCH, n.Q_HEADS, n.HEAD_DIM,
                                                                                    n.DTYPE_BYTES))


GTA_DROPS = {
    "the gather's write to the buffer": lambda n: _gta(n, crossings=2),
    "the attention kernel's read of the buffer (the fused count)": lambda n: _gta(n, crossings=1),
    "the query read and the output write": lambda n: _gta(n, q_and_out=False),
    "the query and output once, not through the gather": lambda n: _gta(n, q_out_crossings=3),
    "the cache holding KV heads, not query heads": lambda n: _gta(n, cache_heads=n.Q_HEADS),
    "one layer": lambda n: _gta(n, layers=32),
    "bytes per element": lambda n: _gta(n) // n.DTYPE_BYTES,
}


@pytest.mark.parametrize("dropped", GTA_DROPS)
def test_4_4_each_named_step_fails_on_every_hidden_set(dropped):
    c = get("4.4")
    derive = GTA_DROPS[dropped]
    for secret in (b"grade-1", b"grade-2", b"grade-3"):
        for g in GIVENS[4].draw(case_rng("givens", secret, "lab04"), 2):
            with pytest.raises(Mismatch):
                c.verdict(derive(namespace(g)), c.expect(namespace(g)))


# --- 4.1 -------------------------------------------------------------------------------------------

def kv_offsets(block_tables, positions, block_size, stride_block, stride_slot):
    physical = torch.gather(block_tables.long(), 1, positions // block_size)
    return physical * stride_block + positions % block_size * stride_slot


def kv_offsets_by_loops(block_tables, positions, block_size, stride_block, stride_slot):
    """The other derivation: one Python integer per position, then a tensor."""
    rows = [[int(block_tables[b, int(p) // block_size]) * stride_block + int(p) % block_size * stride_slot
             for p in row] for b, row in enumerate(positions)]
    return torch.tensor(rows, dtype=torch.int64)


def test_4_1_two_derivations_pass_on_the_labs_and_on_hidden_cases():
    c = get("4.1")
    for rng in (case_rng("4.1"), case_rng("4.1", b"a grading secret", "nb")):
        cases = c.prepare(rng)
        for fn in (kv_offsets, kv_offsets_by_loops):
            c.verdict(fn, cases)


def test_4_1_cases_are_data_and_one_pool_sits_near_2_31():
    cases = get("4.1").prepare(case_rng("4.1"))
    for k in cases:
        assert '"want"' not in json.dumps(k.input()) and "mistakes" not in json.dumps(k.input())
    assert any(k.spec["huge"] for k in cases) and any(not k.spec["huge"] for k in cases)
    # by hand, the pool near 2**31: block id 2**31 - 1 - i times 16 x 8 x 128 = 16,384 elements per block
    huge = next(k for k in cases if k.spec["huge"])
    assert huge.args[3] == 16_384 and int(huge.args[0].max()) >= 2**31 - 6


@pytest.mark.parametrize("fn, words", [
    (lambda t, p, b, sb, ss: kv_offsets(t, p, b, sb, ss).to(torch.int32), "int64"),
    # the product in int32 first (it wraps near 2**31), widened only afterwards
    (lambda t, p, b, sb, ss: (torch.gather(t, 1, p // b) * sb).long() + p % b * ss, "overflow a 32-bit integer"),
    (lambda t, p, b, sb, ss: (lambda out: (t.zero_(), out)[1])(kv_offsets(t, p, b, sb, ss)), "changed the block table"),
    (lambda t, p, b, sb, ss: kv_offsets(t, p, b, sb, ss).tolist(), "return a tensor of offsets"),
    (lambda t, p, b, sb, ss: torch.gather(t.long(), 1, p // b) * sb + p * ss, "not where that token's keys are"),
])
def test_4_1_names_the_slip(fn, words):
    assert words in _problem("4.1", fn)


# --- 4.2 -------------------------------------------------------------------------------------------

@triton.jit
def my_kv_token_offset(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    logical_block = token // BLOCK_SIZE
    physical_block = tl.load(table_row + logical_block, mask=valid, other=0)
    slot = token % BLOCK_SIZE
    return physical_block.to(tl.int64) * stride_block + slot.to(tl.int64) * stride_slot


@triton.jit
def through_slots(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    """The other derivation: the pool slot (block * b + offset) times the elements per slot."""
    block = tl.load(table_row + token // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    return (block * BLOCK_SIZE + (token % BLOCK_SIZE).to(tl.int64)) * (stride_block // BLOCK_SIZE)


@triton.jit
def narrow_product(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    block = tl.load(table_row + token // BLOCK_SIZE, mask=valid, other=0)
    return (block * stride_block + (token % BLOCK_SIZE) * stride_slot).to(tl.int64)


@triton.jit
def next_entry(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    block = tl.load(table_row + token // BLOCK_SIZE + 1, mask=valid, other=0)
    return block.to(tl.int64) * stride_block + (token % BLOCK_SIZE).to(tl.int64) * stride_slot


@triton.jit
def unfinished(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    raise NotImplementedError("exercise 4.2: the same four steps in Triton")


def not_jit(table_row, token, valid, BLOCK_SIZE, stride_block, stride_slot):
    return table_row


def test_4_2_two_derivations_pass():
    c = get("4.2")
    cases = c.prepare(case_rng("4.2"))
    for fn in (my_kv_token_offset, through_slots):
        c.verdict(fn, cases)


def test_4_2_cases_are_data_and_the_kernels_see_nan_where_no_sequence_lives():
    from labsupport.course.harness.lab04 import kernel_case_tensors

    cases = get("4.2").prepare(case_rng("4.2"))
    kinds = [k.data["kind"] for k in cases]
    assert "addresses" in kinds and "kernels" in kinds
    for k in cases:
        assert '"want"' not in json.dumps(k.input())
    run = next(k.data for k in cases if k.data["kind"] == "kernels")
    q, k_cache, v_cache, table, seq_lens = kernel_case_tensors(run)
    again = kernel_case_tensors(run)  # the same seed makes the same tensors (here and in the sandbox)
    assert torch.equal(q, again[0]) and torch.equal(table, again[3])
    owned = sum(-(-n // run["block_size"]) for n in run["seq_lens"])
    assert int(torch.isnan(k_cache).any(dim=(1, 2, 3)).sum()) >= k_cache.shape[0] - owned


@pytest.mark.parametrize("fn, words", [
    (narrow_product, "widen before you multiply"),
    (next_entry, "not the address of its keys"),
    (not_jit, "decorate yours with @triton.jit"),
])
def test_4_2_names_the_slip(fn, words):
    assert words in _problem("4.2", fn)


def test_4_2_an_unfinished_line_is_not_attempted():
    c = get("4.2")
    with pytest.raises(Unfinished, match="the same four steps"):
        c.verdict(unfinished, c.prepare(case_rng("4.2"))[:1])


def test_4_2_a_wrong_kernel_read_is_named_by_the_judge():
    """The gather and attention judges by themselves: a token read from the wrong slot, NaN from a slot no
    sequence owns (the observations as the harness writes them)."""
    from labsupport.course.judge import JUDGES

    spec = {"block_size": 4, "seq_lens": [5], "q_heads": 2, "kv_heads": 1,
            "want": {"paged_gather": {"shape": [1, 2], "values": [1.0, 2.0]},
                     "paged_decode_attention": {"shape": [1, 2], "values": [0.5, 0.25]}}}

    def seen(gather, attention, nan=False):
        return {"name": "mine", "runs": {"paged_gather": {"result": {"shape": [1, 2], "values": gather}},
                                         "paged_decode_attention": {"result": {"shape": [1, 2], "values": attention,
                                                                              "nan": nan}}}}

    JUDGES["triton_offset"](seen([1.0, 2.0], [0.5, 0.25]), spec)
    with pytest.raises(Mismatch, match="read from the wrong slot"):
        JUDGES["triton_offset"](seen([2.0, 2.0], [0.5, 0.25]), spec)
    with pytest.raises(Mismatch, match="It produced NaN"):
        JUDGES["triton_offset"](seen([1.0, 2.0], [None, 0.25], nan=True), spec)
    with pytest.raises(Mismatch, match="differs from the reference by up to 0.001"):
        JUDGES["triton_offset"](seen([1.0, 2.0], [0.501, 0.25]), spec)
