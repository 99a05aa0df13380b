"""`python -m labsupport simulate`: real traces through the scheduler on the cost-model clock (§10.5, §10.6)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import labsupport  # noqa: F401
from labsupport.bench import engine as bench_engine
from labsupport.cli import simulate
from labsupport.measure.replay import replay
from labsupport.specs import LECTURE_7B, LECTURE_GPU
from labsupport.workloads import REPO_ROOT
from real_traces import real_trace

AZURE_CONV = real_trace("azure-conv")  # $LABSUPPORT_DATA, data/ or ../shared/traces/, as the labs find it
MOONCAKE_CONV = real_trace("mooncake-conversation")
needs_azure = pytest.mark.skipif(AZURE_CONV is None, reason="the Azure trace is not present, or hidden")


def run_json(capsys, *args) -> dict:
    rc = simulate.main([*args, "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


def _card_by_hand():
    """The course card's model and GPU, its KV bytes per token (2 x L x n_kv x d x b) and its KV budget
    (HBM - weights - 4 GB), by hand: 524,288 B and 62.52 GB on the lecture's H100 with its 7B."""
    from labsupport import card

    m, g = card.card().model, card.card().gpu
    return m, g, 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes, \
        g.hbm_bytes - m.num_params * m.dtype_bytes - 4e9


def _azure_rows(limit=None):
    with open(AZURE_CONV, newline="") as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    return rows[:limit] if limit else rows


@pytest.mark.slow  # the whole trace: 19,366 requests
@needs_azure
def test_full_azure_conv_replay_accounts_for_every_request(capsys):
    d = run_json(capsys, "--trace", "azure-conv")  # the course card's (lecture: lecture-7b on H100, 62.52 GB), b = 16
    m, g, kv, budget = _card_by_hand()
    rows = _azure_rows()
    assert d["requests"] == len(rows) == 19_366
    assert d["finished"] + d["rejected"] == 19_366 and d["rejected"] == 0
    assert d["output_tokens"] == sum(o for _, o in rows)
    assert d["leaked_blocks"] == 0
    assert d["num_blocks"] == int(budget // (16 * kv))  # 62.52e9 // (16 x 524,288) = 7,452 on the lecture's card
    assert 0 < d["peak_blocks"] <= d["num_blocks"]
    t = d["ttft"]
    for k in ("p50", "p99"):  # every part is a time, and the parts are no larger than the whole
        assert 0 <= t["queueing"][k] <= t["ttft"][k] and 0 < t["prefill"][k] <= t["ttft"][k]
    assert t["ttft"]["mean"] == pytest.approx(t["queueing"]["mean"] + t["prefill"]["mean"]
                                              + t["scheduling_delay"]["mean"])
    # a lone decode step moves at least the weights: 13.48 GB / 3.35 TB/s = 4.02 ms for the lecture's 7B on its H100
    assert d["tpot"]["p50"] >= m.num_params * m.dtype_bytes / g.hbm_bandwidth
    assert 0 <= d["goodput_req_frac"] <= 1


@pytest.mark.slow  # the whole trace: 19,366 requests
@needs_azure
def test_azure_conv_replay_figures_are_unchanged():
    """The lecture's configuration on the whole Azure conversation trace: the figures §10.6's lab quotes.

    Request and token counts come from the CSV itself; goodput is re-counted here from each request's
    own TTFT and TPOT.  The peak of 4,055 blocks and goodput 99.46% are what the scheduler gave before
    Engine.step was split into named phases (commit 3e5e967): the split must not move them.
    """
    from labsupport.costmodel import CostModel
    from labsupport.workloads import load_trace

    rows = _azure_rows()
    # the lecture's 7B on its H100, named: these are the lecture's figures whatever course.toml names
    rp = replay(load_trace("azure-conv").requests, cost_model=CostModel(LECTURE_7B, LECTURE_GPU), num_blocks=7452)
    res, rep = rp.result, rp.report(1.0, 0.020)
    assert rep.finished == len(rows) == 19_366 and rep.rejected == 0
    assert rep.output_tokens == sum(o for _, o in rows) == 4_088_665
    assert rep.peak_blocks == 4_055 and rep.leaked_blocks == 0
    good = [r for r in res.requests.values() if r.ttft_s <= 1.0 and (r.tpot_s is None or r.tpot_s <= 0.020)]
    assert len(good) == rep.good_requests
    assert round(100 * len(good) / 19_366, 2) == 99.46
    assert rep.preemptions == {"swap": 0, "recompute": 0}


def test_engine_step_reads_as_the_loop():
    """§10.5's loop in one screen: step() at most 40 lines, no Engine method over 80."""
    import ast
    import inspect

    from labsupport import engine

    tree = ast.parse(inspect.getsource(engine.Engine))
    methods = {f.name: f.end_lineno - f.lineno + 1 for f in tree.body[0].body if isinstance(f, ast.FunctionDef)}
    assert methods["step"] <= 40, methods["step"]
    assert max(methods.values()) <= 80, max(methods.items(), key=lambda kv: kv[1])
    step = next(f for f in tree.body[0].body if getattr(f, "name", "") == "step")
    calls = sorted((n.lineno, n.col_offset, n.func.attr) for n in ast.walk(step)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr.startswith("_"))
    phases = [name for _, _, name in calls]
    assert phases == ["_take_arrivals", "_reserve_next_slots", "_swap_in", "_admit", "_stall_message", "_forward",
                      "_step_seconds", "_stream", "_retire", "_record"]


@needs_azure
def test_requests_longer_than_the_pool_are_rejected_the_rest_complete(capsys):
    # the lecture's 7B, named (a card's smaller KV per token holds every one of these 300 in 1 GB): 1 GB of KV =
    # floor(1e9 / 8 MiB) = 119 blocks of 16 tokens; admission keeps int(0.01 x 119) = 1 free
    d = run_json(capsys, "--trace", "azure-conv", "--limit", "300", "--kv-budget-gb", "1", "--model", LECTURE_7B.name,
                 "--gpu", LECTURE_GPU.name)
    rows = _azure_rows(300)
    blocks = lambda t: -(-t // 16)
    pool = 10**9 // (16 * 2 * 32 * 32 * 128 * 2)
    never = [(p, o) for p, o in rows if blocks(p + o - 1) > pool or blocks(p) + 1 > pool]
    assert d["num_blocks"] == pool == 119
    assert 0 < d["rejected"] == len(never) and d["finished"] == 300 - len(never)
    assert d["leaked_blocks"] == 0 and len(d["rejections"]) == len(never)
    assert "blocks" in d["rejections"][0]


def _write_bad_csv(tmp_path: Path) -> Path:
    p = tmp_path / "bad.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:47.0000000,-5,10\n"  # line 3: negative
                 "2023-11-16 18:15:48.0000000,,10\n"  # line 4: missing
                 "2023-11-16 18:15:49.0000000,12,abc\n"  # line 5: not a number
                 "2023-11-16 18:15:50.0000000,100,20\n")
    return p


def test_malformed_rows_rejected_with_file_and_line(tmp_path, capsys):
    p = _write_bad_csv(tmp_path)
    rc = simulate.main(["--trace", "azure-conv", "--trace-file", str(p)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{p}:3" in err and "ContextTokens" in err and len(err.strip().splitlines()) == 1


def test_a_nan_timestamp_is_a_malformed_row_not_a_traceback(tmp_path, capsys):
    p = tmp_path / "nan.jsonl"
    p.write_text('{"timestamp": NaN, "input_length": 5, "output_length": 3, "hash_ids": [1]}\n'
                 '{"timestamp": 10, "input_length": 5, "output_length": 3, "hash_ids": [1]}\n')
    assert simulate.main(["--trace", "mooncake-conv", "--trace-file", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:1" in err and "timestamp" in err and len(err.strip().splitlines()) == 1
    d = run_json(capsys, "--trace", "mooncake-conv", "--trace-file", str(p), "--bad-rows", "skip")
    assert d["requests"] == d["finished"] == 1


def test_malformed_rows_skipped_and_reported(tmp_path, capsys):
    p = _write_bad_csv(tmp_path)
    rc = simulate.main(["--trace", "azure-conv", "--trace-file", str(p), "--bad-rows", "skip", "--json"])
    cap = capsys.readouterr()
    assert rc == 0
    for line in (3, 4, 5):
        assert f"{p}:{line}" in cap.err
    d = json.loads(cap.out)
    assert d["requests"] == 2 and d["finished"] == 2 and d["output_tokens"] == 44 + 20


def test_synthetic_chat_workload(capsys):
    d = run_json(capsys, "--trace", "synthetic", "--synthetic-requests", "40", "--synthetic-rate", "100")
    assert d["requests"] == d["finished"] == 40 and d["output_tokens"] == 40 * 128
    assert d["synthetic"] is True and d["leaked_blocks"] == 0
    _, _, kv, budget = _card_by_hand()  # the course card's pool, by hand
    assert d["num_blocks"] == int(budget // (16 * kv))  # 62.52e9 // (16 x 524,288) = 7,452 on the lecture's card
    d = run_json(capsys, "--trace", "synthetic", "--synthetic-requests", "40", "--block-size", "32",
                 "--kv-budget-gb", "10")
    assert d["num_blocks"] == 10_000_000_000 // (32 * kv) and d["block_size"] == 32  # 596 on the lecture's card


def test_rate_scale_compresses_arrivals():
    from labsupport.costmodel import CostModel
    from labsupport.workloads import Request

    reqs = [Request(0, 0.0, 100, 3), Request(1, 10.0, 100, 3), Request(2, 30.0, 50, 2)]
    rp = replay(reqs, cost_model=CostModel(), num_blocks=7452, speedup=2.0)
    assert [rp.result.requests[i].arrival_time for i in range(3)] == [0.0, 5.0, 15.0]
    assert rp.report(1.0, 0.020).finished == 3 and rp.report(1.0, 0.020).output_tokens == 8


@pytest.mark.skipif(MOONCAKE_CONV is None, reason="the Mooncake trace is not present, or hidden")
def test_mooncake_conversation_overload_with_both_preemption_modes(capsys):
    # long Mooncake prompts on a pool of the tokens 10 GB holds of the lecture's model (10e9 // (16 x 524,288) = 1,192
    # blocks of 16), at the card's model's KV bytes per token (1.09 GB for Qwen2.5-7B's 57,344 B; a plain 10 GB holds
    # 10,899 of its blocks, and nothing runs dry), arrivals 20x faster: the pool runs dry
    _, _, kv, _ = _card_by_hand()
    for mode in ("swap", "recompute"):
        d = run_json(capsys, "--trace", "mooncake-conv", "--limit", "120", "--kv-budget-gb", repr(10 * kv / 524_288),
                     "--rate-scale", "20", "--preemption", mode)
        assert d["num_blocks"] == 1_192
        assert d["finished"] + d["rejected"] == 120
        assert d["preemptions"][mode] > 0 and d["leaked_blocks"] == 0


@pytest.mark.parametrize("args, needle", [
    (["--block-size", "0"], "--block-size"),
    (["--trace", "nope"], "--trace"),
    (["--gpu", "b200x"], "unknown GPU"),
    (["--watermark", "2"], "--watermark"),
    (["--frobnicate"], "unrecognized"),
    (["--trace", "synthetic", "--trace-file", "x.csv"], "--trace-file"),
    (["--trace-file", "/nonexistent/trace.csv"], "does not exist"),
])
def test_bad_flags_are_one_line_errors(capsys, args, needle):
    assert simulate.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("simulate: error:")


@needs_azure
def test_bench_prints_its_figures(capsys):
    assert bench_engine.bench(["--limit", "300", "--profile-requests", "100"]) == 0
    out = capsys.readouterr().out
    assert "steps/s" in out and "where the time goes" in out and "300 finished" in out


def test_a_leak_fails_the_command(monkeypatch, capsys):
    # a leak cannot be produced through the public API (that is the point), so fake one in the report
    real = simulate.replay

    def leaky(*args, **kwargs):
        rp = real(*args, **kwargs)
        rp.result.counters.leaked_blocks = 3
        return rp

    monkeypatch.setattr(simulate, "replay", leaky)
    assert simulate.main(["--trace", "synthetic", "--synthetic-requests", "5"]) == 1
    assert "LEAK: 3 blocks still in use" in capsys.readouterr().out
