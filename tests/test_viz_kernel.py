"""Lab 04's figures and panels (labsupport.viz.kernel): addresses, bytes, bandwidth (§10.3 step three).

Expected values are worked out by hand here (block tables a fresh allocator must hand out, the
address formula, byte counts); the results files are produced by labsupport.bench.kernel's own
row functions, with a fixed fake timer so every figure value is known in advance.
"""
import json

import pytest
import torch

import labsupport  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
from labsupport.measure import addresses
from labsupport.bench import kernel as KB
from labsupport.specs import get_gpu, get_model
from labsupport.viz import kernel as VK


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


# --- kernel_excerpt ----------------------------------------------------------------------------

def _sample(x):
    a = x + 1
    b = a * 2
    c = b - 3
    return c


def test_kernel_excerpt_cuts_between_anchors_and_dedents():
    assert VK.kernel_excerpt(_sample, "b = a", "return") == "b = a * 2\nc = b - 3\nreturn c"
    assert VK.kernel_excerpt(_sample, "c = b") == "c = b - 3"


def test_kernel_excerpt_names_a_missing_anchor():
    with pytest.raises(ValueError, match="no line of _sample contains 'nowhere'"):
        VK.kernel_excerpt(_sample, "nowhere")
    with pytest.raises(ValueError, match="after 'b = a' contains 'a = x'"):
        VK.kernel_excerpt(_sample, "b = a", "a = x")  # the end anchor only appears earlier


def test_kernel_excerpt_reads_the_real_kernels():
    from labsupport import kernels as K

    text = VK.kernel_excerpt(K._decode_attention_kernel, "for tile_start in range", "k = tl.load(k_ptr")
    assert "kv_token_offset(" in text and text.splitlines()[0].startswith("for tile_start")


# --- contiguous runs and the allocator histories --------------------------------------------------

def test_contiguous_runs_by_hand():
    assert addresses.contiguous_runs([0, 4, 8, 100, 104, 12], 4) == [3, 2, 1]
    assert addresses.contiguous_runs([7], 4) == [1]
    assert addresses.contiguous_runs([], 4) == []
    assert addresses.contiguous_runs([8, 4, 0], 4) == [1, 1, 1]  # backwards is not a run
    with pytest.raises(ValueError, match="stride must be positive"):
        addresses.contiguous_runs([0, 1], 0)


def test_prefill_in_a_fresh_pool_hands_out_blocks_in_order():
    alloc = addresses.allocate_batch([5, 3], block_size=2, history="prefill", pool_tokens=16)
    assert alloc.table(0) == [0, 1, 2] and alloc.table(1) == [3, 4]


def test_decoding_together_interleaves_blocks():
    # prompts of max(1, n // 4) = 1 token each: A -> [0], B -> [1]; each fills its block with the
    # next token, then they take blocks 2 and 3 in turn on the step after.
    alloc = addresses.allocate_batch([4, 4], block_size=2, history="decode together", pool_tokens=16)
    assert alloc.table(0) == [0, 2] and alloc.table(1) == [1, 3]
    assert alloc.seq_lens[0] == 4 and alloc.seq_lens[1] == 4


def test_churn_leaves_valid_scattered_tables():
    alloc = addresses.allocate_batch([300, 220, 130], block_size=16, history="after churn", pool_tokens=2048, seed=3)
    alloc.check_invariants()
    tables = [alloc.table(i) for i in range(3)]
    assert [len(t) for t in tables] == [19, 14, 9]  # ceil(n / 16)
    ids = [b for t in tables for b in t]
    assert len(set(ids)) == len(ids) and all(0 <= b < 128 for b in ids)
    assert any(b - a != 1 for t in tables for a, b in zip(t, t[1:]))  # not one neat stripe


def test_allocate_batch_rejects_bad_input():
    with pytest.raises(ValueError, match="history must be one of"):
        addresses.allocate_batch([4], 2, history="sideways")
    with pytest.raises(ValueError, match="blocks of 16 tokens are needed"):
        addresses.allocate_batch([300, 300], 16, history="prefill", pool_tokens=256)
    with pytest.raises(ValueError, match="positive token counts"):
        addresses.allocate_batch([4, 0], 2)


@pytest.mark.parametrize("history", addresses.HISTORIES)
def test_address_map_follows_the_paged_formula(history):
    lens, bs, hkv, d = [37, 20], 8, 2, 16
    amap = addresses.address_map(lens, bs, history, num_kv_heads=hkv, head_dim=d, pool_tokens=256)
    stride = hkv * d
    for seq, n in enumerate(lens):
        table = amap.block_tables[seq].tolist()
        want = [table[t // bs] * bs * stride + (t % bs) * stride for t in range(n)]
        assert amap.offsets[seq, :n].tolist() == want
        assert amap.offsets[seq, n:].tolist() == [-1] * (max(lens) - n)
    assert amap.row_bytes == hkv * d * 2


# --- the address panel ----------------------------------------------------------------------------

def test_address_panel_redraws_on_block_size_and_history():
    panel = VK.address_panel(seq_lens=(40, 30), block_size=8, history="decode together")
    before = [list(t.y) for t in panel.figure.data]
    text = panel.text()
    panel.controls["block_size"].value = 32
    after = [list(t.y) for t in panel.figure.data]
    assert after != before and panel.text() != text and "block_size=32" in panel.text()
    panel.controls["history"].value = "prefill"
    # a fresh pool, allocated whole: each sequence is one run on the right-hand plot
    assert "1 contiguous runs" in panel.text() and panel.updates == 2


def test_address_readout_counts_table_entries_and_runs():
    amap = addresses.address_map([24, 8], 8, "decode together", num_kv_heads=1, head_dim=16, pool_tokens=128)
    text = VK.address_readout(amap)
    assert "sequence A: 24 tokens in 3 blocks" in text and "sequence B: 8 tokens in 1 blocks" in text
    assert f"{len(amap.runs(0))} contiguous runs" in text


# --- bytes of a decode step -------------------------------------------------------------------------

def test_step_bytes_by_hand():
    # B=1, S=3, Hq=2, Hkv=1, D=4, 2-byte elements, blocks of 2: K/V 2*1*3*1*4*2 = 48 B,
    # q + out 2*1*2*4*2 = 32 B, table ceil(3/2) = 2 entries * 4 B = 8 B.
    got = VK.step_bytes(1, 3, 2, 1, 4, 2, block_size=2)
    assert got == {"kv": 48, "q_out": 32, "table": 8, "fused": 88, "gather_then_attend": 3 * 48 + 32 + 8}
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer"):
        VK.step_bytes(1, 3, 2, 0, 4, 2, block_size=2)


def test_step_bytes_figure_totals_match_the_hand_count():
    model, gpu = get_model("lecture-7b-gqa8"), get_gpu("h100")
    fig = VK.step_bytes_figure(64, 4096, model, gpu, block_size=16)
    # one layer: K/V 2*64*4096*8*128*2 = 1,073,741,824 B; q+out 2*64*32*128*2 = 1,048,576 B;
    # table 64*256*4 = 65,536 B; 32 layers
    fused = 32 * (1_073_741_824 + 1_048_576 + 65_536)
    gta = 32 * (3 * 1_073_741_824 + 1_048_576 + 65_536)
    totals = [sum(t.y[i] for t in fig.data) * 1e9 for i in range(2)]
    assert totals == pytest.approx([fused, gta], rel=1e-12)


def test_step_bytes_panel_redraws():
    panel = VK.step_bytes_panel()
    y = [list(t.y) for t in panel.figure.data]
    panel.controls["batch"].value = 8
    assert [list(t.y) for t in panel.figure.data] != y and "batch=8" in panel.text()
    panel.controls["model"].value = "lecture-7b"
    assert "1.00 FLOP per byte" in panel.text()  # MHA attention: §2.15's 1 FLOP/byte


# --- bandwidth results ------------------------------------------------------------------------------

FAKE_MS = 2.0  # every timing the fake timer reports


@pytest.fixture(scope="module")
def results_file(tmp_path_factory):
    """A results file shaped as `bench gpu` writes it, from kernel_bench's own row functions on CPU."""
    timer = lambda fn: (fn(), FAKE_MS)[1]  # noqa: E731  (run once, report a known time)
    copy_bandwidth = 1e9
    gather = KB.gather_rows(copy_bandwidth, torch.float32, (8, 16), shape=dict(batch=1, seq_len=32, num_kv_heads=1),
                            head_dim=16, device="cpu", timer=timer)
    decode = KB.decode_rows([(1, 32, 1, (8, 16)), (2, 16, 1, (16,))], copy_bandwidth, torch.float32, 1,
                            num_q_heads=2, head_dim=16, device="cpu", timer=timer)
    meta = dict(KB.environment(), gpu="Test GPU", date="2025-01-02T03:04:05+00:00", interpreter=False)
    path = tmp_path_factory.mktemp("data") / "gpu_results.json"
    path.write_text(json.dumps(dict(meta=meta, copy=dict(copy_bandwidth=copy_bandwidth), gather=gather,
                                    decode=decode, targets=[]), default=str))
    return path


def test_load_gpu_results(results_file, tmp_path):
    assert VK.load_gpu_results(tmp_path / "absent.json") is None
    results = VK.load_gpu_results(results_file)
    assert results.label == "Test GPU, 2025-01-02" and results.copy_bandwidth == 1e9
    assert results.decode_case() == (1, 32, 1)  # the case measured at the most block sizes
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"meta": {}}))
    with pytest.raises(ValueError, match="no copy, gather, decode"):
        VK.load_gpu_results(bad)


def test_bandwidth_figure_values(results_file):
    results = VK.load_gpu_results(results_file)
    # gather: 2 * 32 tokens * 16 floats * 4 B = 4,096 B in 2 ms = 2.048e6 B/s = 0.2048% of 1e9 B/s
    gather = _trace(VK.bandwidth_figure(results), "gather kernel")
    assert list(gather.x) == [8, 16] and list(gather.y) == pytest.approx([0.2048, 0.2048])
    # decode, B=1 S=32 Hkv=1 Hq=2 D=16 fp32: K/V 2*32*16*4 = 4,096 B + q/out 2*2*16*4 = 256 B
    paged = _trace(VK.bandwidth_figure(results, "GB/s"), "paged attention (fused)")
    assert list(paged.x) == [8, 16] and list(paged.y) == pytest.approx([4352 / 2e-3 / 1e9] * 2)
    assert _trace(VK.bandwidth_figure(results), "gather, then attend").y[0] == pytest.approx(100 * 4352 / 2e-3 / 1e9)
    with pytest.raises(ValueError, match="metric must be one of"):
        VK.bandwidth_figure(results, "furlongs")


def test_placeholder_has_no_numbers():
    fig = VK.bandwidth_placeholder_figure()
    assert fig.data and all(len(t.x) == 0 and len(t.y) == 0 for t in fig.data)
    assert "no GPU results shipped yet" in fig.layout.title.text
    assert not fig.layout.annotations or all(a.y is None or a.y >= 1 for a in fig.layout.annotations)  # nothing over the axes


def test_the_chart_says_what_it_cannot_show(results_file):
    """No GPU data: paged ≈ contiguous is unmeasured; interpreter timings cannot check it; and gather-then-attend's
    3× is 4.4's byte count (K/V read, written, read again), never a measured ratio."""
    def title(fig):
        return fig.layout.title.text

    none = title(VK.bandwidth_placeholder_figure())
    assert "unmeasured" in none and "byte count" in none and "not a measurement" in none
    gpu = VK.load_gpu_results(results_file)
    assert "byte count" in title(VK.bandwidth_figure(gpu)) and "interpreter" not in title(VK.bandwidth_figure(gpu))
    cpu = VK.BenchResults("CPU", gpu.copy_bandwidth, gpu.gather, gpu.decode, dict(gpu.meta, interpreter=True))
    assert "cannot be checked" in title(VK.bandwidth_figure(cpu)) and "byte count" in title(VK.bandwidth_figure(cpu))
    assert "cannot check paged ≈ contiguous" in VK.bandwidth_readout(cpu)
    assert "byte count" in VK.bandwidth_readout(None) and "not checked here" in VK.bandwidth_readout(None)


def test_bandwidth_panel_switches_source_and_metric(results_file):
    results = VK.load_gpu_results(results_file)
    panel = VK.bandwidth_panel({"none yet": None, "test": results})
    assert "No data/gpu_results.json" in panel.text()
    assert all(len(t.y) == 0 for t in panel.figure.data)
    panel.controls["source"].value = "test"
    assert "Test GPU" in panel.text() and any(len(t.y) for t in panel.figure.data)
    percent = [list(t.y) for t in panel.figure.data]
    panel.controls["metric"].value = "GB/s"
    assert [list(t.y) for t in panel.figure.data] != percent
    with pytest.raises(ValueError, match="at least one source"):
        VK.bandwidth_panel({})


# --- lab 04's checkoffs accept the right answers and reject the classic wrong ones --------------------

import triton  # noqa: E402  (after labsupport, so the interpreter is set on CPU)
import triton.language as tl  # noqa: E402

from labsupport.course.checkoff import check, results  # noqa: E402


def _offsets_right(tables, positions, block_size, stride_block, stride_slot):
    blocks = torch.gather(tables.long(), 1, positions // block_size)
    return blocks * stride_block + (positions % block_size) * stride_slot


def _offsets_int32(tables, positions, block_size, stride_block, stride_slot):
    blocks = torch.gather(tables, 1, (positions // block_size))  # stays int32: wraps past 2**31
    return (blocks * stride_block + (positions % block_size) * stride_slot).long()


def _offsets_list(tables, positions, block_size, stride_block, stride_slot):
    return _offsets_right(tables, positions, block_size, stride_block, stride_slot).tolist()


@triton.jit
def _line_right(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    block = tl.load(table_row + token // BLOCK_SIZE, mask=valid, other=0)
    return block.to(tl.int64) * stride_block + (token % BLOCK_SIZE).to(tl.int64) * stride_slot


@triton.jit
def _line_narrow(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    block = tl.load(table_row + token // BLOCK_SIZE, mask=valid, other=0)
    return block * stride_block + (token % BLOCK_SIZE) * stride_slot


@triton.jit
def _line_no_table(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    return token.to(tl.int64) * stride_slot  # reads the pool as if it were contiguous


@triton.jit
def _line_unfinished(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    raise NotImplementedError("exercise 4.2")


def _fails(checkoff_id, answer, *words):
    check(checkoff_id, answer)  # prints its ❌ line and returns: Run All goes on
    outcome = results()[checkoff_id]
    assert outcome["status"] == "failed"
    problem = outcome["detail"].split("\nHint: ")[0]
    for word in words:
        assert word in problem


def test_checkoff_4_1(capsys):
    check("4.1", _offsets_right)
    assert capsys.readouterr().out == "✅ Checkoff 4.1 passed\n"
    _fails("4.1", _offsets_int32, "close to 2**31")
    _fails("4.1", _offsets_list, "returned a list")


def test_checkoff_4_2(capsys):
    check("4.2", _line_right)
    assert capsys.readouterr().out == "✅ Checkoff 4.2 passed\n"
    _fails("4.2", _line_narrow, "widen before you multiply")
    _fails("4.2", _line_no_table, "not the address of its keys")
    _fails("4.2", _offsets_right, "@triton.jit")
    capsys.readouterr()
    check("4.2", _line_unfinished)  # the exercise still open: one line, and the run goes on
    assert capsys.readouterr().out.startswith("⬜ Checkoff 4.2 not attempted — ")
    assert results()["4.2"]["status"] == "not attempted"


def _gather_bytes() -> tuple[int, int]:
    """4.4's (K/V bytes, query and output bytes) by hand, on the givens lab 04's record publishes (what check() grades
    against: one layer of the course card's GQA form at B = 64, S = 8,192).  On the lecture's card (Hkv = 8, Hq = 32,
    D = 128, bf16): K/V = 2 x 64 x 8,192 x 8 x 128 x 2 = 2**31 B; q + out = 2 x 64 x 32 x 128 x 2 = 2**20 B."""
    from labsupport.course import record

    g = record.read(4)["givens"]
    return (2 * g["BATCH"] * g["SEQ_LEN"] * g["KV_HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"],
            2 * g["BATCH"] * g["Q_HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"])


def test_checkoffs_4_3_to_4_5(capsys):
    check("4.3", lambda b, s, hq, hkv, d, e: 2 * b * s * hkv * d * e + 2 * b * hq * d * e)
    _fails("4.3", lambda b, s, hq, hkv, d, e: 2 * b * s * hq * d * e + 2 * b * hq * d * e, "per *query* head")
    _fails("4.3", lambda b, s, hq, hkv, d, e: 2 * b * s * hkv * d * e, "the query and the output")
    kv, q_out = _gather_bytes()  # 2**31 and 2**20 B on the lecture's card
    check("4.4", 3 * kv + q_out)
    _fails("4.4", kv + q_out, "fused paged kernel")
    _fails("4.4", 2 * kv + q_out, "read and write")
    check("4.5", {"table reads", "short contiguous runs"})
    _fails("4.5", {"tail waste", "table reads", "short contiguous runs"}, "no kernel can give it back")
    assert capsys.readouterr().out.count("passed") == 3


def test_4_4_two_derivations_and_4_5_names_the_table_cost_no_kernel_removes(capsys):
    # 4.4 another way: count the crossings one by one. K/V: 2 x 64 x 8,192 x 8 x 128 x 2 B = 2**31 B each crossing on
    # the lecture's card (the record's givens: the card's)
    kv, q_out = _gather_bytes()
    check("4.4", sum((kv, kv, kv)) + q_out)  # pool read, buffer write, buffer read
    check("4.4", 3 * (kv + q_out) - 2 * q_out)
    _fails("4.4", 3 * (kv + q_out), "query is read and the output written once")
    # 4.5: the lab's self-check says building and shipping longer tables survives any kernel; the choice agrees
    _fails("4.5", {"short contiguous runs", "table reads", "table building"}, "engine's CPU work")
    _fails("4.5", {"short contiguous runs"}, "1 is missing")
    _fails("4.5", {"fork copies", "table reads", "short contiguous runs"}, "allocator's")
    check("4.5", {"Table Reads ", "short contiguous runs"})
    assert capsys.readouterr().out.count("passed") == 3
