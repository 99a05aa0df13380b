"""Checkoffs of labs 07 and 08: right answers pass, typical wrong ones fail with a teaching message.

The right answers here are written from the lecture's formulas (not imported from the graders), and
the wrong ones are the slips students make: forgetting the weights, ignoring memory, a GB/GiB mix.
"""
from __future__ import annotations

import math

import numpy as np

from labsupport.course.checkoff import check
from labsupport.viz import slo as viz_slo

GB = 1e9
# §10.7's second column, row by row, as the lecture prints it.
LECTURE_MAP_QUANTITIES = ["achieved bandwidth on an indirect access", "effective B over time",
                          "§2.16's 6.7× TPOT spike", "which card a request lands on", "KV bytes per token",
                          "the 92% re-send of Lecture 5", "bytes per weight and per cached value",
                          "tokens per pass over the weights", "the dependence between requests"]


def kv(m):
    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes


def tpot(m, g, b, s):
    return (m.num_params * m.dtype_bytes + b * s * kv(m)) / g.hbm_bandwidth


def blocks(m, g, u, bs=16, activation_bytes=4e9):
    return max(0, math.floor((u * g.hbm_bytes - m.num_params * m.dtype_bytes - activation_bytes) / (bs * kv(m))))


def max_batch(m, g, s, slo, bs=16):
    slo_b = max(0, math.floor((slo * g.hbm_bandwidth - m.num_params * m.dtype_bytes) / (s * kv(m))))
    return min(blocks(m, g, 1.0, bs) // math.ceil(s / bs), slo_b)


def ttft_tail(requests, slo):
    """By hand: numpy's percentile over the finished requests' TTFTs."""
    t = np.array([r.first_token_time - r.arrival_time for r in requests if r.status == "finished"])
    return {"mean_s": float(t.mean()), "p99_s": float(np.percentile(t, 99)), "miss_share": float((t > slo).mean())}


def test_lab07_right_answers_pass(capsys):
    check("7.1", tpot)
    check("7.2", max_batch)

    def goodput(reqs, ttft, tp):
        fin = [r for r in reqs if r.status == "finished"]
        good = sum(sum(r.num_output_tokens) for r in fin
                   if r.ttft_s <= ttft and (r.tpot_s is None or r.tpot_s <= tp))
        return good / (max(r.finish_time for r in fin) - min(r.arrival_time for r in reqs))

    check("7.3", goodput)

    def session(m, g, ctx, submitted, bs=16):
        return {"peak_kv_bytes": ctx * kv(m), "sessions": blocks(m, g, 1.0, bs) // math.ceil(ctx / bs),
                "prefill_s": submitted * 2 * m.num_params / (0.5 * g.peak_flops)}

    check("7.5", session)
    check("7.6", "sessions")
    check("7.4", ttft_tail)
    assert capsys.readouterr().out.count("passed") == 6


def test_lab07_wrong_answers_teach(fails):
    with fails("too low"):
        check("7.1", lambda m, g, b, s: b * s * kv(m) / g.hbm_bandwidth)  # forgot the weights
    with fails("tpot_slo_s=0.03.*returned 259"):  # names the call where memory binds
        check("7.2", lambda m, g, s, slo, bs=16: max(0, math.floor((slo * g.hbm_bandwidth - m.num_params * m.dtype_bytes)
                                                                  / (s * kv(m)))))  # ignores memory
    with fails("Hint"):
        check("7.3", lambda reqs, ttft, tp: sum(sum(r.num_output_tokens) for r in reqs))  # a count, not a rate
    with fails("keys"):
        check("7.5", lambda m, g, c, s, bs=16: (c * kv(m), 0, 0))
    with fails("bytes per token"):
        check("7.6", "peak_kv_bytes")
    with fails("nearest-rank"):
        check("7.4", lambda reqs, slo: dict(ttft_tail(reqs, slo), p99_s=float(np.percentile(
            [r.first_token_time - r.arrival_time for r in reqs if r.status == "finished"], 99, method="inverted_cdf"))))
    with fails("rejected ones included"):
        check("7.4", lambda reqs, slo: dict(ttft_tail(reqs, slo), miss_share=ttft_tail(reqs, slo)["miss_share"] * sum(
            r.status == "finished" for r in reqs) / len(reqs)))
    with fails("counts the rejected requests as misses"):  # rejected counted as misses, top and bottom
        check("7.4", lambda reqs, slo: dict(ttft_tail(reqs, slo), miss_share=(
            sum(r.status != "finished" or r.first_token_time - r.arrival_time > slo for r in reqs) / len(reqs))))
    with fails("too low"):  # the median is not the tail
        check("7.4", lambda reqs, slo: dict(ttft_tail(reqs, slo), p99_s=float(np.median(
            [r.first_token_time - r.arrival_time for r in reqs if r.status == "finished"]))))


def test_lab08_right_answers_pass(capsys):
    check("8.3", blocks)

    def max_num_seqs(m, g, u, s, slo, bs=16):
        slo_b = max(0, math.floor((slo * g.hbm_bandwidth - m.num_params * m.dtype_bytes) / (s * kv(m))))
        return min(blocks(m, g, u, bs) // math.ceil(s / bs), slo_b)

    check("8.4", max_num_seqs)
    check("8.5", lambda m, g, slo, mfu=0.5: math.floor(slo * mfu * g.peak_flops / (2 * m.num_params)))
    check("8.6", lambda lengths, b: 1 - sum(lengths) / sum(-(-n // b) * b for n in lengths))
    check("8.7", lambda: viz_slo.chat_requests(20, 300))  # 28 of 29 naive slots at its busiest
    check("8.2", "disaggregation")
    check("8.1", LECTURE_MAP_QUANTITIES)
    check("8.1", [f"  {q.upper()} " for q in LECTURE_MAP_QUANTITIES])  # as printed, case and spaces aside
    assert capsys.readouterr().out.count("passed") == 8


def test_lab08_wrong_answers_teach(fails):
    with fails("GiB|too"):
        check("8.3", lambda m, g, u, bs=16, activation_bytes=4e9: max(0, math.floor(
            (u * g.hbm_bytes - m.num_params * m.dtype_bytes - activation_bytes) / (bs * kv(m) * 1.0737))))
    with fails("negative|too"):
        check("8.3", lambda m, g, u, bs=16, activation_bytes=4e9: math.floor(
            (u * g.hbm_bytes - m.num_params * m.dtype_bytes - activation_bytes) / (bs * kv(m))))
    with fails("too low"):  # mean tail b/2 instead of the measured waste
        check("8.6", lambda lengths, b: 0.0)
    with fails("should barely move"):  # past 29 slots the naive engine queues
        check("8.7", lambda: viz_slo.chat_requests(60, 300))
    with fails("S_max"):
        check("8.7", lambda: [(0.0, 5000, 10)] * 100)
    with fails("runs only 5 sequences of its 29 slots"):  # a lightly loaded card: nothing could move throughput
        check("8.7", lambda: viz_slo.chat_requests(2, 300))
    with fails("sequences so short"):  # 20-token sequences: 0.3% of a reserve-to-max slot
        check("8.7", lambda: [(i * 0.5, 10, 10) for i in range(200)])
    with fails("later lecture covers both"):
        check("8.2", "batching")
    swapped = list(LECTURE_MAP_QUANTITIES)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    with fails(r"2 of the nine rows are matched to the wrong quantity \(rows 2, 3\)"):
        check("8.1", swapped)
    with fails("not one of the nine quantities"):
        check("8.1", LECTURE_MAP_QUANTITIES[:8] + ["the block size"])
    with fails("a list of 9 quantities"):
        check("8.1", LECTURE_MAP_QUANTITIES[:8])
