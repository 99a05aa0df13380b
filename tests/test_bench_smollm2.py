"""`python -m labsupport bench smollm2`: the paged engine beside transformers' batched generate (issue 38).

A tiny configuration (4 requests, prompts of at most 24 tokens, outputs of at most 6) runs both sides in float32,
where they must write the same tokens; the JSON's fields, the token counts and both KV figures are checked against
what the requests imply.  Skipped, with the reason, without the model or transformers; bad flags need neither.
"""
from __future__ import annotations

import json

import pytest

from labsupport import bench
from test_pretrained import TEST_ONLY, missing


MISSING = missing(*TEST_ONLY)


@pytest.mark.slow  # 20 to 60 s on 2 cores: transformers dequantizes the GGUF itself at every load
@pytest.mark.skipif(MISSING is not None, reason=f"bench smollm2: {MISSING}")
@pytest.mark.usefixtures("one_thread", "gguf_read_once")
def test_a_tiny_batch_runs_on_both_sides(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["smollm2", "--requests", "4", "--max-prompt", "24", "--max-output", "6", "--dtype", "float32",
            "--threads", "1", "--json", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    for label in ("output tokens/s", "peak KV memory", "TTFT median", "goal:", f"wrote {out}"):
        assert label in printed, printed
    r = json.loads(out.read_text())  # strict JSON: json.loads would take NaN, so check for it below
    assert "NaN" not in out.read_text() and "Infinity" not in out.read_text()
    assert {"bench", "command", "model", "dtype", "machine", "workload", "engine", "transformers", "comparison",
            "method", "notes"} <= set(r)
    w, e, t, c = r["workload"], r["engine"], r["transformers"], r["comparison"]
    assert r["dtype"] == "float32" and r["machine"]["torch_threads"] == 1
    assert w["requests"] == len(w["scaled"]) == len(w["original"]) == 4
    assert max(p for p, _ in w["scaled"]) <= 24 and max(o for _, o in w["scaled"]) <= 6
    assert all(p >= 1 and o >= 1 for p, o in w["scaled"])
    if w["synthetic"]:
        assert "SYNTHETIC" in printed
    outputs = [o for _, o in w["scaled"]]
    # both sides generated, and counted, each request's own output length
    assert e["output_tokens"] == t["output_tokens"] == sum(outputs) == w["output_tokens"]
    assert c["counts_equal"] is True
    assert t["computed_tokens"] == 4 * max(outputs) and t["steps"] == t["max_new_tokens"] == max(outputs)
    # float32 on both sides: the same greedy tokens, request for request
    assert c["identical_requests"] == 4 and c["agreeing_prefix"] == outputs
    # KV: transformers' cache is the padded batch x the longest sequence; the engine's is the blocks it held
    layers, kv_heads, head_dim = 30, 3, 64
    longest = max(p for p, _ in w["scaled"]) + max(outputs) - 1
    assert t["cache_shape"] == [4, kv_heads, longest, head_dim]
    assert t["peak_kv_bytes"] == 4 * longest * 2 * layers * kv_heads * head_dim * 4
    assert e["kv_bytes_per_token"] == 2 * layers * kv_heads * head_dim * 4
    assert e["peak_kv_bytes"] == e["peak_blocks"] * e["block_bytes"] == e["peak_blocks"] * 16 * e["kv_bytes_per_token"]
    held = [-(-(p + o - 1) // 16) for p, o in w["scaled"]]
    assert max(held) <= e["peak_blocks"] <= sum(held) <= e["pool_blocks"]
    assert e["preemptions"] == 0
    assert len(e["ttft_s"]) == 4 and all(x > 0 for x in e["ttft_s"]) and t["first_step_s"] > 0
    assert e["tokens_per_s"] > 0 and t["tokens_per_s"] > 0
    assert c["tokens_per_s_ratio"] == pytest.approx(e["tokens_per_s"] / t["tokens_per_s"])
    assert c["kv_ratio"] == pytest.approx(e["peak_kv_bytes"] / t["peak_kv_bytes"])


@pytest.mark.parametrize("argv, says", [
    (["--requests", "0"], "--requests"), (["--requests", "x"], "--requests"), (["--dtype", "float16"], "--dtype"),
    (["--block-size", "12"], "power of two"), (["--max-prompt", "8000", "--max-output", "500"], "context"),
    (["--threads", "0"], "--threads"), (["--max-output", "nan"], "--max-output"), (["--bogus"], "--bogus"),
])
def test_a_bad_flag_is_one_line_and_exit_2(capsys, argv, says):
    assert bench.main(["smollm2", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_a_folder_for_the_json_is_refused(capsys, tmp_path):
    assert bench.main(["smollm2", "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--json" in err, err
