"""Issue 15's hard edges, one test per defect: bad input is one line and exit 2, JSON is strict, nothing is lost.

Each expected value is derived here from the input (a byte count, a block count, the flag's range),
not read back from the code under test.  The Hypothesis sweep over every command is
tests/test_cli_properties.py.
"""
from __future__ import annotations

import codecs
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import labsupport  # noqa: F401  (TRITON_INTERPRET before triton)
from labsupport import checks
from labsupport.__main__ import main as labsupport_main
from labsupport.block_allocator import BlockAllocator
from labsupport.prefix_cache import PrefixCachingAllocator
from labsupport.cli import ledger as ledger_cli
from labsupport.cli import simulate
from labsupport.costmodel import CostModel
from labsupport.engine import Engine
from labsupport.memory_stats import UnknownSequence
from labsupport.sampling import SamplingParams
from labsupport.workloads import TraceFormatError, read_azure_csv, read_mooncake_jsonl

ROOT = Path(__file__).resolve().parents[1]
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"
MOON = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'


def strict_loads(text: str):
    """json.loads that refuses NaN and Infinity, as a strict parser (JavaScript's JSON.parse) does."""
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def run(capsys, main, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def refused(capsys, main, *argv, needle: str) -> str:
    """The command refuses with exit 2 and exactly one line on stderr that contains `needle`."""
    rc, out, err = run(capsys, main, *argv)
    assert rc == 2, (rc, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    return err


# --- ledger ---------------------------------------------------------------------------------------

def _card_kv_and_budget() -> tuple[int, float]:
    """The course card's KV bytes per token (2 x L x n_kv x d x b) and KV budget (HBM - weights - 4 GB), by hand:
    524,288 B and 62.52 GB on the lecture's card."""
    from labsupport import card

    m, g = card.card().model, card.card().gpu
    return (2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes,
            g.hbm_bytes - m.num_params * m.dtype_bytes - 4e9)


def test_ledger_json_is_strict_when_no_naive_slot_fits(capsys):
    # S_max one token past what the whole budget holds: 62.52e9 // 524,288 + 1 = 119,248 tokens on the lecture's card
    # (922,699 on H200 + Llama-3-8B; 1,059,920 on A100-80GB + Qwen2.5-7B, where even a 1M-token slot fits): naive
    # concurrency 0, so the gain paged/naive is undefined: null with a note, and n/a in the table (was Infinity / "infx")
    kv, budget = _card_kv_and_budget()
    s_max = int(budget // kv) + 1
    assert budget < s_max * kv  # the premise: on the course card no slot of s_max tokens fits
    rc, out, _ = run(capsys, ledger_cli.main, "--s-max", str(s_max), "--json")
    assert rc == 0
    d = strict_loads(out)
    assert d["naive_concurrency"] == 0
    assert d["concurrency_gain"] is None
    assert any("concurrency_gain" in n for n in d["notes"])
    rc, out, _ = run(capsys, ledger_cli.main, "--s-max", str(s_max))
    assert rc == 0 and "inf" not in out.lower().replace("info", "")
    paged = int(budget // (16 * kv)) // 40  # 7,452 blocks // 40 blocks per 640-token sequence = 186 (lecture)
    assert f"0 -> {paged} (n/a" in out


def test_ledger_json_default_is_strict_and_has_no_notes(capsys):
    kv, budget = _card_kv_and_budget()
    naive, paged = int(budget // (4096 * kv)), int(budget // (16 * kv)) // 40  # 29 and 186 on the lecture's card
    rc, out, _ = run(capsys, ledger_cli.main, "--json")
    d = strict_loads(out)
    assert rc == 0 and d["notes"] == [] and d["concurrency_gain"] == pytest.approx(paged / naive)


def test_ledger_zero_token_fanout_is_one_line_not_zero_division(capsys):
    refused(capsys, ledger_cli.main, "--fanout-prompt", "0", "--fanout-output", "0", needle="--fanout-prompt")


def test_ledger_s_max_below_the_sequence_is_refused(capsys):
    # 100 < 512 + 128: before, it printed 99.96% utilization and "1192 -> 186 (0.16x)"
    refused(capsys, ledger_cli.main, "--s-max", "100", needle="--s-max 100 is below --prompt + --output = 640")
    refused(capsys, ledger_cli.main, "--s-max", "639", needle="--s-max 639")
    assert run(capsys, ledger_cli.main, "--s-max", "640")[0] == 0


@pytest.mark.parametrize("flag, value", [
    ("--s-max", "nan"), ("--s-max", "1e3"), ("--prompt", "١٢"), ("--prompt", "True"), ("--params", "inf"),
    ("--hbm-gb", "1e300"), ("--bandwidth-gbs", "1e-320"), ("--mfu", "nan"), ("--mfu", "0"), ("--link-gbs", "-1"),
    ("--tpot-slo-ms", "1e999"), ("--layers", "9" * 5000), ("--kv-heads", "0"), ("--dtype-bytes", "1_0"),
])
def test_ledger_flag_values_outside_their_range_name_the_flag(capsys, flag, value):
    err = refused(capsys, ledger_cli.main, flag, value, needle=flag)
    assert len(err) < 500  # a 5,000-digit value is cut, not echoed


def test_scenario_checks_its_fields():
    from labsupport import ledger as L

    for kwargs, needle in [(dict(s_max=100), "s_max=100"), (dict(fanout_prompt=0, fanout_output=0), "fanout"),
                           (dict(prompt=True), "prompt"), (dict(mfu=math.nan), "mfu"),
                           (dict(kv_budget=math.inf), "kv_budget"), (dict(tpot_slo_s="0.02"), "tpot_slo_s")]:
        with pytest.raises(ValueError, match=needle):
            ledger_cli.Scenario(**kwargs)
    with pytest.raises(ValueError, match="0 prompt and 0 output"):
        L.sharing_factor(4, 0, 0)
    with pytest.raises(ValueError, match="block_size"):
        L.blocks_for(10, True)  # a bool is not a block size


# --- simulate: undefined statistics ----------------------------------------------------------------

def _csv(tmp_path: Path, text: str, name="t.csv", encoding="utf-8") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return p


def test_simulate_json_is_strict_for_an_empty_trace(tmp_path, capsys):
    p = _csv(tmp_path, HEADER)
    rc, out, _ = run(capsys, simulate.main, "--trace-file", str(p), "--json")
    d = strict_loads(out)
    assert rc == 0 and d["requests"] == 0
    assert d["throughput_tok_s"] is None and d["goodput_req_frac"] is None and d["tpot"]["p50"] is None
    assert any("no requests" in n for n in d["notes"])
    rc, out, _ = run(capsys, simulate.main, "--trace-file", str(p))
    assert rc == 0 and "nan" not in out and "n/a" in out


def test_simulate_json_is_strict_when_no_request_has_a_second_token(tmp_path, capsys):
    p = _csv(tmp_path, HEADER + "2023-11-16 18:15:46.1,10,1\n2023-11-16 18:15:47.1,20,1\n")
    rc, out, _ = run(capsys, simulate.main, "--trace-file", str(p), "--json")
    d = strict_loads(out)
    assert rc == 0 and d["finished"] == 2 and d["output_tokens"] == 2
    assert d["tpot"] == {"p50": None, "p99": None, "mean": None}
    assert any("second token" in n for n in d["notes"])
    assert d["throughput_tok_s"] > 0  # defined: two tokens over a positive duration


def test_simulate_when_every_request_is_rejected(capsys):
    # 0.0084 GB = 8.4e6 B holds floor(8.4e6 / (16 x 524,288)) = 1 block: every request needs more
    assert 8_400_000 // (16 * 524_288) == 1
    rc, out, _ = run(capsys, simulate.main, "--trace", "synthetic", "--synthetic-requests", "5",
                     "--kv-budget-gb", "0.0084", "--json")
    d = strict_loads(out)
    assert rc == 0 and d["rejected"] == 5 and d["finished"] == 0
    assert d["goodput_req_frac"] == 0.0 and d["throughput_tok_s"] is None and d["ttft"]["ttft"]["p50"] is None
    rc, out, _ = run(capsys, simulate.main, "--trace", "synthetic", "--synthetic-requests", "5",
                     "--kv-budget-gb", "0.0084")
    assert rc == 0 and "nan" not in out and "0.0% of requests" in out and "n/a" in out


@pytest.mark.parametrize("args, flag", [
    (["--kv-budget-gb", "1e300"], "--kv-budget-gb"), (["--link-gbs", "1e300"], "--link-gbs"),
    (["--rate-scale", "1e-310"], "--rate-scale"), (["--trace", "synthetic", "--synthetic-rate", "1e-320"],
                                                   "--synthetic-rate"),
    (["--watermark", "1"], "--watermark"), (["--limit", "0"], "--limit"), (["--seed", "-1"], "--seed"),
    (["--max-num-batched-tokens", "True"], "--max-num-batched-tokens"), (["--ttft-slo-ms", "nan"], "--ttft-slo-ms"),
])
def test_simulate_values_that_used_to_overflow_later_are_refused_up_front(capsys, args, flag):
    refused(capsys, simulate.main, *args, needle=flag)


def test_simulate_pool_larger_than_the_machine_is_refused_with_the_memory_it_needs(capsys, monkeypatch):
    # the course card's model (no --model): on the lecture's, 1e9 GB / (16 x 524,288 B) = 119,209,289,550 blocks,
    # 8.6 TB of bookkeeping at 72 B each, on any machine (Llama-3-8B's 131,072 B: 476,837,158,203 blocks, 34.3 TB)
    kv, _ = _card_kv_and_budget()
    blocks = 10**18 // (16 * kv)
    err = refused(capsys, simulate.main, "--kv-budget-gb", "1e9", needle="--kv-budget-gb")
    assert f"{blocks:,} blocks" in err and f"{blocks * 72 / 1e12:.1f} TB" in err
    # and the bound is this machine's memory: with 1 GB free, 1e6 GB (119,209,289 blocks, 8.6 GB on the lecture's
    # card; 476,837,158 blocks, 34.3 GB on Llama-3-8B's) does not fit
    monkeypatch.setattr(checks, "memory_available_bytes", lambda: 10**9)
    blocks = 10**15 // (16 * kv)
    refused(capsys, simulate.main, "--kv-budget-gb", "1e6", needle=f"{blocks:,} blocks")
    refused(capsys, simulate.main, "--kv-budget-gb", "1e6", needle=f"{blocks * 72 / 1e9:.1f} GB of memory")


def test_engine_and_allocator_refuse_a_pool_the_machine_cannot_hold():
    with pytest.raises(ValueError, match="72.0 TB"):  # 1e12 blocks x 72 B
        Engine(cost_model=CostModel(), num_blocks=10**12)
    with pytest.raises(ValueError, match="blocks would need"):
        BlockAllocator(10**12, 16)
    with pytest.raises(ValueError, match="KV pool"):  # 1e7 blocks x 16 tokens x 2 x 2 x 4 x 64 x 4 B = 5.2 TB
        from labsupport.kvcache import PagedKVCache
        PagedKVCache(10**7, 16, 2, 4, 64)


# --- trace loaders --------------------------------------------------------------------------------

def test_a_token_count_past_int64_is_a_file_line_error_not_a_crash_after_the_replay(tmp_path, capsys):
    p = _csv(tmp_path, HEADER + ROW + f"2023-11-16 18:15:47.0,{2**63},5\n")
    err = refused(capsys, simulate.main, "--trace-file", str(p), "--json", needle=f"{p}:3")
    assert "ContextTokens" in err
    rc, out, err = run(capsys, simulate.main, "--trace-file", str(p), "--json", "--bad-rows", "skip")
    assert rc == 0 and strict_loads(out)["requests"] == 1 and f"{p}:3" in err


def test_a_csv_field_over_the_csv_modules_limit_is_a_file_line_error(tmp_path):
    p = _csv(tmp_path, HEADER + ROW + "2023-11-16 18:15:47.0," + "7" * 131_073 + ",5\n" + ROW)
    with pytest.raises(TraceFormatError, match=f"{p}:3: not a CSV row"):
        read_azure_csv(p)
    with pytest.warns(UserWarning):
        w = read_azure_csv(p, skip_malformed=True)
    assert len(w) == 2 and all(len(n) < 400 for n in w.notes)  # the 131 KB field is not echoed


def test_a_400_digit_mooncake_timestamp_is_a_file_line_error(tmp_path):
    p = _csv(tmp_path, MOON + '{"timestamp": ' + "9" * 400 + ', "input_length": 5, "output_length": 3, '
             '"hash_ids": [1]}\n', "m.jsonl")
    with pytest.raises(TraceFormatError, match=f"{p}:2: timestamp .* ms is beyond"):
        read_mooncake_jsonl(p)


def test_a_deeply_nested_json_line_and_a_5000_digit_number_are_file_line_errors(tmp_path):
    p = _csv(tmp_path, MOON + "[" * 100_000 + "]" * 100_000 + "\n" + '{"timestamp": ' + "1" * 5000 + "}\n",
             "m.jsonl")
    with pytest.raises(TraceFormatError, match=f"{p}:2: not a trace record: JSON nested too deeply"):
        read_mooncake_jsonl(p)
    with pytest.warns(UserWarning):
        w = read_mooncake_jsonl(p, skip_malformed=True)
    assert len(w) == 1 and f"{p}:3: not a trace record" in "\n".join(w.notes)


def test_a_line_longer_than_a_megabyte_is_refused_unread(tmp_path):
    p = _csv(tmp_path, MOON + '{"pad": "' + "x" * (2 << 20) + '"}\n' + MOON, "m.jsonl")
    with pytest.warns(UserWarning):
        w = read_mooncake_jsonl(p, skip_malformed=True)
    assert len(w) == 2 and f"{p}:2: line longer than 1,048,576 characters" in "\n".join(w.notes)


@pytest.mark.parametrize("value", ["١٢", "１２", "12\u0663", "²"])  # Arabic-Indic, fullwidth, mixed, superscript
def test_non_ascii_digits_are_not_token_counts(tmp_path, value):
    p = _csv(tmp_path, HEADER + f"2023-11-16 18:15:46.1,{value},5\n")
    with pytest.raises(TraceFormatError, match=f"{p}:2: ContextTokens is not an integer"):
        read_azure_csv(p)


def test_non_ascii_digits_in_a_timestamp_are_refused(tmp_path):
    p = _csv(tmp_path, HEADER + "٢٠٢٣-11-16 18:15:46.1,10,5\n")
    with pytest.raises(TraceFormatError, match=f"{p}:2: TIMESTAMP .* non-ASCII"):
        read_azure_csv(p)


def test_string_lengths_in_mooncake_records_are_refused(tmp_path):
    p = _csv(tmp_path, '{"timestamp": 0, "input_length": "600", "output_length": 5, "hash_ids": [1, 2]}\n', "m.jsonl")
    with pytest.raises(TraceFormatError, match=f"{p}:1: input_length is not an integer: '600' is a JSON string"):
        read_mooncake_jsonl(p)


def test_duplicated_columns_and_keys_are_refused_not_resolved_silently(tmp_path):
    p = _csv(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:15:46.1,10,5,999\n")
    with pytest.raises(TraceFormatError, match=r"header names ContextTokens more than once \(columns \[2, 4\]\)"):
        read_azure_csv(p)
    q = _csv(tmp_path, '{"timestamp": 0, "input_length": 600, "input_length": 1, "output_length": 5, '
             '"hash_ids": [1, 2]}\n', "m.jsonl")
    with pytest.raises(TraceFormatError, match=f"{q}:1: .*'input_length' appears more than once"):
        read_mooncake_jsonl(q)


def test_a_utf8_bom_header_is_read(tmp_path):
    p = _csv(tmp_path, codecs.BOM_UTF8 + (HEADER + ROW).encode())
    w = read_azure_csv(p)
    assert [(r.prompt_tokens, r.output_tokens) for r in w] == [(374, 44)]
    q = _csv(tmp_path, codecs.BOM_UTF8 + MOON.encode(), "m.jsonl")
    assert [(r.prompt_tokens, r.hash_ids) for r in read_mooncake_jsonl(q)] == [(600, (1, 2))]


def test_other_encodings_are_named(tmp_path, capsys):
    p = _csv(tmp_path, HEADER + ROW, encoding="utf-16")
    refused(capsys, simulate.main, "--trace-file", str(p), needle=f"{p}:1: the file is UTF-16 text")
    q = _csv(tmp_path, (HEADER + ROW).encode() + b"2023-11-16 18:15:47.0,1\xff2,5\n", "latin.csv")
    with pytest.raises(TraceFormatError, match=f"{q}:3: not UTF-8 text \\(byte 0xff"):
        read_azure_csv(q)


def test_a_trace_path_that_is_a_directory_fifo_or_unreadable_is_one_line(tmp_path, capsys):
    refused(capsys, simulate.main, "--trace-file", str(tmp_path), needle="holds neither")
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    refused(capsys, simulate.main, "--trace-file", str(fifo), needle="is not a regular file")
    p = _csv(tmp_path, HEADER + ROW)
    p.chmod(0)
    try:
        if not os.access(p, os.R_OK):  # root reads anything: then there is nothing to refuse
            refused(capsys, simulate.main, "--trace-file", str(p), needle="Permission denied")
    finally:
        p.chmod(0o644)


# --- the engine and its cost model -----------------------------------------------------------------

def test_cost_model_refuses_infinite_link_and_overhead():
    for kwargs, needle in [(dict(link_bandwidth=math.inf), "link_bandwidth"),
                           (dict(step_overhead_s=math.inf), "step_overhead_s"),
                           (dict(link_bandwidth=1e-320), "host link"), (dict(mfu=True), "mfu"),
                           (dict(step_overhead_s=math.nan), "step_overhead_s"), (dict(model="7b"), "ModelSpec")]:
        with pytest.raises(ValueError, match=needle):
            CostModel(**kwargs)


def _queues(eng: Engine) -> list:
    return [*eng._running, *eng._swapped, *(w for w in eng._waiting if not hasattr(w, "seqs"))]


def test_a_step_that_fails_while_preempting_leaves_every_sequence_in_one_queue():
    """The victim used to be taken off the running list before its preemption was priced; a pricing failure
    then left a sequence holding blocks that no queue knew.  Now the failure leaves it running."""
    class Failing(CostModel):
        fail = False

        def preempt_choice(self, tokens, block_size=None):
            if Failing.fail:
                raise ValueError("pricing failed")
            return super().preempt_choice(tokens, block_size)

    eng = Engine(cost_model=Failing(), num_blocks=6, block_size=4, watermark=0.0)
    for i in range(3):
        eng.add_request(prompt_len=7, max_new_tokens=12, arrival_time=0.0)  # 2 blocks each: the pool fills
    eng.step()
    running = {s.seq_id for s in eng._running}
    assert len(running) == 3 and eng.allocator.num_free_blocks == 0
    while all(s.num_cached % 4 for s in eng._running):  # step until someone needs a new block
        eng.step()
    Failing.fail = True
    with pytest.raises(ValueError, match="pricing failed"):
        eng.step()
    seqs = [s.seq_id for s in _queues(eng)]
    assert sorted(seqs) == sorted(running)  # every sequence in exactly one queue
    assert set(eng.allocator.block_tables) == {s.seq_id for s in eng._running}
    eng.allocator.check_invariants()
    Failing.fail = False
    res = eng.run()  # and the run goes on to the end with nothing leaked
    assert all(r.finished for r in res.requests.values()) and res.counters.leaked_blocks == 0


@pytest.mark.parametrize("kwargs, needle", [
    (dict(arrival_time="5"), "arrival_time"), (dict(arrival_time=True), "arrival_time"),
    (dict(arrival_time=math.inf), "arrival_time"), (dict(prompt_len=True), "prompt_len"),
    (dict(max_new_tokens=2.0), "max_new_tokens"), (dict(n=True), "n must"),
])
def test_engine_add_request_refuses_loose_types(kwargs, needle):
    eng = Engine(cost_model=CostModel(), num_blocks=16)
    args = dict(prompt_len=5, max_new_tokens=3) | kwargs
    with pytest.raises(ValueError, match=needle):
        eng.add_request(**args)
    with pytest.raises(ValueError, match="prompt token id"):
        eng.add_request([1, True, 3], 3)  # a bool is not a token id
    assert eng.run().requests == {}  # the refused calls left nothing behind


@pytest.mark.parametrize("kwargs, needle", [
    (dict(max_num_batched_tokens=True), "max_num_batched_tokens"), (dict(watermark=True), "watermark"),
    (dict(watermark=math.nan), "watermark"), (dict(block_size=16.0), "block_size"),
    (dict(num_blocks="8"), "num_blocks"), (dict(cost_model={"mfu": 0.5}), "cost_model"),
    (dict(on_token=5), "on_token"), (dict(record_token_times="yes"), "record_token_times"),
    (dict(attention="fast"), "attention"), (dict(preemption=["swap"]), "preemption"),
])
def test_engine_constructor_refuses_loose_types(kwargs, needle):
    args = dict(cost_model=CostModel(), num_blocks=16) | kwargs
    with pytest.raises(ValueError, match=needle):
        Engine(**args)


def test_sampling_params_refuse_bools_and_truncation():
    for kwargs, needle in [(dict(temperature=True), "temperature"), (dict(stop_token_ids=(1.7,)), "stop token id"),
                           (dict(stop_token_ids="12"), "stop_token_ids"), (dict(stop_token_ids=(True,)), "stop"),
                           (dict(stop_token_ids=5), "stop_token_ids"), (dict(temperature=math.inf), "temperature")]:
        with pytest.raises(ValueError, match=needle):
            SamplingParams(**kwargs)
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


# --- the block allocator and the caches: unhashable ids --------------------------------------------

@pytest.mark.parametrize("call", ["append_slot", "free", "swap_out", "swap_in", "is_swapped", "table",
                                  "slot_mapping", "append_slots", "fork_parent"])
def test_unhashable_sequence_ids_get_a_clear_error_from_every_allocator_method(call):
    a = BlockAllocator(8, 4)
    a.allocate("x", 5)
    before = a.snapshot()
    bad = ["a", "list"]
    calls = {"append_slot": lambda: a.append_slot(bad), "free": lambda: a.free(bad),
             "swap_out": lambda: a.swap_out(bad), "swap_in": lambda: a.swap_in(bad),
             "is_swapped": lambda: a.is_swapped(bad), "table": lambda: a.table(bad),
             "slot_mapping": lambda: a.slot_mapping(bad, 0, 1), "append_slots": lambda: a.append_slots(["x", bad]),
             "fork_parent": lambda: a.fork(bad, "y")}
    with pytest.raises(UnknownSequence, match="must be hashable, and a list is not"):
        calls[call]()
    assert a.snapshot() == before


def test_unhashable_ids_in_the_caches_and_contiguous_allocators():
    from labsupport.contiguous import ContiguousAllocator
    from labsupport.kvcache import ContiguousKVCache, PagedKVCache

    c = ContiguousAllocator(64)
    with pytest.raises(ValueError, match="hashable"):
        c.allocate({}, 8)
    cache = PagedKVCache(4, 4, 1, 1, 2)
    for call in (lambda: cache.drop([1]), lambda: cache.host_copy([1]), lambda: cache.free([1])):
        with pytest.raises(UnknownSequence, match="hashable"):
            call()
    cc = ContiguousKVCache(2, 4, 1, 1, 2)
    with pytest.raises(UnknownSequence, match="hashable"):
        cc.append([[1]], torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


# --- kernels -------------------------------------------------------------------------------------

def test_meta_tensors_are_refused_before_the_kernels():
    from labsupport import kernels as K

    q = torch.empty(2, 4, 16, device="meta")
    cache = torch.empty(6, 8, 2, 16, device="meta")
    tables = torch.empty(2, 3, dtype=torch.int32, device="meta")
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="meta tensors"):
        K.paged_decode_attention(q, cache, cache, tables, lens)
    with pytest.raises(ValueError, match="meta tensors"):
        K.paged_gather(cache, tables, lens)


def test_kv_token_offsets_refuses_a_bool_block_size_and_names_a_1d_table():
    from labsupport import kernels as K

    tables = torch.zeros(2, 3, dtype=torch.int32)
    lens = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="block_size must be a power of two .* got True"):
        K.kv_token_offsets(tables, lens, True, 64, 8)
    with pytest.raises(ValueError, match="stride_slot"):
        K.kv_token_offsets(tables, lens, 16, 64, True)
    with pytest.raises(ValueError, match=r"block_tables must be 2-D \[B, max_blocks\], got shape \(3,\)") as info:
        K.kv_token_offsets(tables[0], lens, 16, 64, 8)
    assert "B=-1" not in str(info.value)


# --- every command: one line, exit 2 ----------------------------------------------------------------

def test_unknown_command_is_one_line(capsys):
    err = refused(capsys, labsupport_main, "nope", needle="unknown command 'nope'")
    assert "simulate" in err  # the choices are on the same line
    refused(capsys, labsupport_main, needle="no command given")


def test_doctor_refuses_unknown_flags_and_gives_strict_json(capsys):
    refused(capsys, labsupport_main, "doctor", "--bogus", needle="--bogus")
    rc, out, _ = run(capsys, labsupport_main, "doctor", "--json")
    d = strict_loads(out)
    assert rc == 0 and d["ok"] is True and "torch" in d["packages"]


@pytest.mark.parametrize("argv, needle", [
    (["bench"], "choose one of"), (["bench", "nope"], "unknown benchmark 'nope'"),
    (["bench", "allocator", "--seconds", "nan"], "--seconds"), (["bench", "allocator", "--block-size", "12"],
                                                                "power of two"),
    (["bench", "allocator", "--num-blocks", "64", "--batch", "13"], "--batch 13 needs 5 x 13 = 65 blocks"),
    (["bench", "engine", "--limit", "-3"], "--limit"), (["bench", "viz", "--repeats", "0"], "--repeats"),
    (["bench", "kernel", "--kv-heads", "3"], "must divide 32"), (["bench", "kernel", "--tile-tokens", "24"],
                                                                 "--tile-tokens"),
    (["bench", "notebooks", "--bogus"], "lab names only"), (["bench", "notebooks", "77"], "no lab source matches"),
])
def test_bench_bad_flags_are_one_line(capsys, argv, needle):
    refused(capsys, labsupport_main, *argv, needle=needle)


def test_train_tiny_flags_and_corpus(tmp_path, capsys):
    from labsupport.cli import train_tiny

    assert train_tiny.DEFAULT_CORPUS == ROOT.parent / "shared" / "seeds" / "000_5d5041c35860fb3d.txt"
    refused(capsys, train_tiny.main, "--steps", "0", needle="--steps")
    refused(capsys, train_tiny.main, "--lr", "inf", needle="--lr")
    bad = tmp_path / "c.txt"
    bad.write_bytes(b"abc\xff\xfe" * 100)
    refused(capsys, train_tiny.main, "--corpus", str(bad), needle="not UTF-8 text")
    refused(capsys, train_tiny.main, "--corpus", str(tmp_path), needle="is not a file")


@pytest.mark.parametrize("argv, needle", [
    (["nope"], "unknown command"), (["ledger", "--s-max", "nan"], "--s-max"),
    (["simulate", "--rate-scale", "1e-310"], "--rate-scale"), (["bench", "gpu", "--workers", "x"], "--workers"),
    (["doctor", "--bogus"], "--bogus"),
])
def test_python_dash_m_gives_one_line_and_exit_2(argv, needle):
    """The real entry point, in a fresh interpreter: what an instructor types."""
    out = subprocess.run([sys.executable, "-m", "labsupport", *argv], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr and out.stdout == ""


def test_devices_presets_and_run_limits_are_checked_at_the_boundary():
    from labsupport.kvcache import PagedKVCache
    from labsupport.model import ModelConfig, TinyTransformer
    from labsupport.specs import get_gpu

    if not torch.cuda.is_available():  # torch would raise AssertionError('Torch not compiled with CUDA')
        with pytest.raises(ValueError, match="not on this machine"):
            PagedKVCache(4, 4, 1, 1, 2, device="cuda")
        with pytest.raises(ValueError, match="not on this machine"):
            TinyTransformer(ModelConfig(), device="cuda")
    with pytest.raises(ValueError, match="torch device"):
        PagedKVCache(4, 4, 1, 1, 2, device="gpu0")
    with pytest.raises(ValueError, match="dtype"):
        TinyTransformer(ModelConfig(), dtype="float64")  # was a KeyError
    with pytest.raises(ValueError, match="named by a string"):
        get_gpu(80)  # was AttributeError: 'int' object has no attribute 'strip'
    with pytest.raises(ValueError, match="max_steps"):
        Engine(cost_model=CostModel(), num_blocks=4).run(max_steps=True)
    with pytest.raises(ValueError, match="hash_fn"):
        PrefixCachingAllocator(4, 4, hash_fn="sha256")
