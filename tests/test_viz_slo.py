"""labsupport.viz.slo (lab 07, §10.6): figures and panels against hand arithmetic and the engine's own ledger.

Hand numbers: weights 6.74e9 x 2 B = 13.48e9 B; KV 2 x 32 x 32 x 128 x 2 = 524,288 B per token; a
640-token sequence holds 335,544,320 B; the H100 streams 3.35e12 B/s.  TPOT(B) = (13.48e9 + B x
335,544,320) / 3.35e12: 6.93 ms at B = 29, 22.65 ms at B = 186; the largest B under 20 ms is
floor((0.020 x 3.35e12 - 13.48e9) / 335,544,320) = floor(159.5) = 159; the paged pool holds
floor(62.52e9 / (16 x 524,288)) = 7,452 blocks, 7,452 // 40 = 186 sequences; reserve-to-max holds
floor(62.52e9 / 2^31) = 29.
"""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest

from labsupport import card
from labsupport.measure import replay as R
from labsupport import slo as S
from labsupport.costmodel import CostModel
from labsupport.engine import Engine
from labsupport.specs import GPUS, LECTURE_7B, LECTURE_7B_GQA8, LECTURE_GPU, LLAMA3_70B
from labsupport.viz import slo as viz_slo
from labsupport.workloads import Request, Workload

W = 6.74e9 * 2
SEQ_BYTES = 640 * 524_288
BW = 3.35e12


def hand_tpot(batch: int, seq_bytes: float = SEQ_BYTES) -> float:
    return (W + batch * seq_bytes) / BW


def hand_card(m=None, gpu=None, seq_tokens: int = 640, s_max: int = 4096, b: int = 16, slo_s: float = 0.020) -> dict:
    """§10.2–§10.6 by hand on a card (the course card unless told): KV per token 2 L n_kv d_head bytes, budget HBM -
    weights - 4 GB, reserve-to-max slots, paged blocks and ceiling, the memory-bound TPOT and the SLO's batch."""
    c = card.card()
    m, gpu = m or c.model, gpu or c.gpu
    kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes
    weights = m.num_params * m.dtype_bytes
    budget = gpu.hbm_bytes - weights - 4e9
    blocks = int(budget // (b * kv))
    ceiling = blocks // -(-seq_tokens // b)
    tpot = lambda batch: (weights + batch * seq_tokens * kv) / gpu.hbm_bandwidth
    slo_b = min(ceiling, math.floor((slo_s * gpu.hbm_bandwidth - weights) / (seq_tokens * kv)))
    return dict(kv=kv, weights=weights, budget=budget, naive=int(budget // (s_max * kv)), blocks=blocks,
                ceiling=ceiling, slo_b=slo_b, tpot=tpot)


def test_tpot_terms_split_the_step_into_weights_you_and_neighbours():
    terms = S.tpot_terms(LECTURE_7B, LECTURE_GPU, 186, 640)
    assert terms["weights"] == pytest.approx(W / BW)
    assert terms["your KV"] == pytest.approx(SEQ_BYTES / BW)
    assert terms["neighbours' KV"] == pytest.approx(185 * SEQ_BYTES / BW)
    assert sum(terms.values()) == pytest.approx(hand_tpot(186))
    assert 1e3 * sum(terms.values()) == pytest.approx(22.654, abs=1e-3)
    with pytest.raises(ValueError, match="batch"):
        S.tpot_terms(LECTURE_7B, LECTURE_GPU, 0, 640)


def test_three_columns_are_the_lectures_table_exactly():
    naive, ceiling, slo = S.three_columns(LECTURE_7B, LECTURE_GPU)
    assert (naive.batch, ceiling.batch, slo.batch) == (29, 186, 159)
    assert (naive.printed_batch, ceiling.printed_batch, slo.printed_batch) == ("29", "199", "164")
    for col in (naive, ceiling, slo):
        assert col.tpot_s == pytest.approx(hand_tpot(col.batch))
        assert col.throughput_tok_s == pytest.approx(col.batch / hand_tpot(col.batch))
    assert naive.meets_slo and slo.meets_slo and not ceiling.meets_slo
    assert ceiling.goodput_tok_s == 0 and ceiling.throughput_tok_s == pytest.approx(8210.4, abs=0.1)
    assert naive.goodput_tok_s == pytest.approx(4185.6, abs=0.1)
    # at 25 ms the middle column meets the SLO and keeps its throughput; the SLO-limited one rises to it
    loose = S.three_columns(LECTURE_7B, LECTURE_GPU, tpot_slo_s=0.025)
    assert loose[1].goodput_tok_s == loose[1].throughput_tok_s and loose[2].batch == 186
    # GQA-8: memory ceiling 29,812 // 40 = 745, SLO bound floor((0.02 x 3.35e12 - 13.48e9) / (640 x 131,072)) = 638
    assert [c.batch for c in S.three_columns(LECTURE_7B_GQA8, LECTURE_GPU)] == [116, 745, 638]
    with pytest.raises(ValueError, match="no KV budget"):
        S.three_columns(LLAMA3_70B, GPUS["h100"])


def test_three_columns_default_to_the_card():
    h = hand_card()  # the lecture's card: 29, 186, 159
    cols = S.three_columns()
    assert [c.batch for c in cols] == [h["naive"], h["ceiling"], h["slo_b"]]
    for col in cols:
        assert col.tpot_s == pytest.approx(h["tpot"](col.batch))
    assert [c.meets_slo for c in cols] == [h["tpot"](c.batch) <= 0.020 for c in cols]
    lecture = card.card().is_lecture  # the printed 29 / 199 / 164 stand beside the lecture's own card only
    assert [c.printed_batch for c in cols] == (["29", "199", "164"] if lecture else ["", "", ""])


def test_goodput_table_strikes_the_middle_column():
    cols = S.three_columns(LECTURE_7B, LECTURE_GPU)  # the lecture's table, its printed 8,470 beside the exact 8,210
    fig = viz_slo.goodput_table_figure(cols)
    throughput, goodput = fig.data
    assert list(throughput.y) == pytest.approx([c.batch / hand_tpot(c.batch) for c in cols])
    assert list(goodput.y) == pytest.approx([4185.55, 0.0, 159 / hand_tpot(159)], rel=1e-5)
    assert throughput.text[1].startswith("<s>") and not throughput.text[0].startswith("<s>")
    assert "goodput 0" in goodput.text[1]
    assert len(fig.layout.shapes) == 1  # the strike across the one failing bar
    html = viz_slo.goodput_table_html(cols)
    assert html.count("<s>") == 1 and "8,210 tok/s" in html and "8,470 tok/s" in html  # exact and printed
    rows = viz_slo.goodput_table_rows(cols)
    assert rows[1]["throughput"] == "~~8,210 tok/s~~" and rows[1]["goodput"] == "0 tok/s"


def test_goodput_table_panel_reacts_to_the_slo():
    h = hand_card()  # the panel opens on the card at 20 ms: the ceiling's step misses it (22.65 ms at B = 186)
    assert h["tpot"](h["ceiling"]) > 0.020
    panel = viz_slo.goodput_table_panel()
    before = list(panel.figure.data[1].y)
    assert before[1] == 0
    loose_ms = math.ceil(1e3 * h["tpot"](h["ceiling"])) + 2  # 25 ms on the lecture's card
    assert loose_ms <= 60  # the slider's end
    panel.controls["tpot_slo_ms"].value = loose_ms
    after = list(panel.figure.data[1].y)
    assert after[1] == pytest.approx(h["ceiling"] / h["tpot"](h["ceiling"]))  # 186 / 22.65 ms = 8,210
    assert f"meets the SLO), throughput {h['ceiling'] / h['tpot'](h['ceiling']):,.0f}" in panel.text()
    assert 70.6e9 * 2 + 4e9 > card.gpu().hbm_bytes  # 141.2 GB of weights and the reserve overflow the card
    panel.controls["model"].value = "llama-3-70b"
    assert panel.error and "no KV budget" in panel.error
    assert list(panel.figure.data[1].y) == after  # the figure keeps its last good state


def test_tpot_figure_and_panel_follow_the_slider():
    measured = {29: hand_tpot(29), 186: hand_tpot(186)}
    fig = viz_slo.tpot_vs_batch_figure(LECTURE_7B, LECTURE_GPU, 640, 186, 0.020, measured=measured)
    weights, yours, others, you, engine = fig.data
    assert weights.y[0] == pytest.approx(1e3 * W / BW)
    assert yours.y[0] == pytest.approx(1e3 * SEQ_BYTES / BW)
    assert list(you.x) == [186] and you.y[0] == pytest.approx(1e3 * hand_tpot(186))
    assert list(engine.x) == [29, 186]
    assert any("B ≤ 159" in a.text for a in fig.layout.annotations)
    assert any("memory ceiling 186" in a.text for a in fig.layout.annotations)

    panel = viz_slo.tpot_panel(measured=measured, model=LECTURE_7B.name, gpu=LECTURE_GPU.name)
    assert len(panel.figure.data) == 5  # the engine's markers, on the card the panel opens on
    panel.controls["batch"].value = 29
    assert panel.figure.data[3].y[0] == pytest.approx(1e3 * hand_tpot(29))
    assert "TPOT at B = 29" in panel.text() and "meets the 20 ms SLO" in panel.text()
    panel.controls["model"].value = "lecture-7b-gqa8"  # engine markers belong to the lecture's configuration
    assert len(panel.figure.data) == 4


def test_tpot_panel_opens_on_the_card():
    C, h = card.card(), hand_card()
    panel = viz_slo.tpot_panel(measured={29: 0.005})
    assert len(panel.figure.data) == 5  # markers measured on the configuration the panel opens on
    panel.controls["batch"].value = 29
    assert panel.figure.data[3].y[0] == pytest.approx(1e3 * h["tpot"](29))
    verdict = "meets" if h["tpot"](29) <= 0.020 else "misses"
    assert f"TPOT at B = 29: {1e3 * h['weights'] / C.gpu.hbm_bandwidth:.2f} ms weights" in panel.text()
    assert f"{verdict} the 20 ms SLO" in panel.text()
    assert f"largest B under the SLO: {math.floor((0.020 * C.gpu.hbm_bandwidth - h['weights']) / (640 * h['kv']))}; " \
           f"memory ceiling (b = 16): {h['ceiling']}" in panel.text()
    panel.controls["model"].value = C.contrast.name
    assert len(panel.figure.data) == 4


def test_steady_batch_on_the_engine_matches_the_closed_form():
    measured = R.steady_batch_tpot([1, 29, 186], seq_tokens=640, model=LECTURE_7B, gpu=LECTURE_GPU)
    for b, t in measured.items():
        assert t == pytest.approx(hand_tpot(b), rel=1e-9)
    with pytest.raises(ValueError, match="do not fit"):
        R.steady_batch_tpot([200], seq_tokens=640, model=LECTURE_7B, gpu=LECTURE_GPU)  # 200 x 40 blocks > 7,452
    h = hand_card()  # with no model named, the card's; at B = 1 a step is the weights and one sequence's KV
    (alone,) = R.steady_batch_tpot([1], seq_tokens=640).values()
    assert alone == pytest.approx(h["tpot"](1), rel=1e-9)


def test_ttft_bars_stack_the_three_terms():
    splits = [S.TTFTSplit("idle", 0.0, 0.1294, 0.0), S.TTFTSplit("loaded", 2.0, 0.135, 0.02)]
    fig = viz_slo.ttft_bars_figure(splits)
    assert [t.name for t in fig.data] == ["queueing", "prefill", "scheduling delay"]
    assert list(fig.data[0].x) == pytest.approx([0, 2000]) and list(fig.data[1].x) == pytest.approx([129.4, 135])
    shares = viz_slo.ttft_bars_figure(splits, normalize=True)
    for i in range(2):
        assert sum(t.x[i] for t in shares.data) == pytest.approx(100)
    assert splits[1].total_s == pytest.approx(2.155)
    with pytest.raises(ValueError, match="scheduling_s"):
        S.TTFTSplit("bad", 0.0, 0.1, -1.0)
    with pytest.raises(ValueError):
        viz_slo.ttft_bars_figure([])


def test_probe_run_queueing_takes_over_under_load():
    light = R.chat_with_probe(5)
    heavy = R.chat_with_probe(80)
    for run in (light, heavy):
        probe = run.result.requests[run.probe_id]
        split = run.splits()[0]
        assert split.total_s == pytest.approx(probe.ttft_s)
        assert probe.finished
    lone = light.splits()[0]
    assert lone.queueing_s == 0
    # at least the 4,096-token prefill: (2 x 6.74e9 x 4096 + 4 x 32 x 32 x 128 x 4096^2) / (0.5 x 989e12) = 129.44 ms
    assert lone.prefill_s >= 0.12944
    loaded = heavy.splits()[0]
    assert loaded.queueing_s > loaded.prefill_s + loaded.scheduling_s  # the board: queueing biggest
    panel = viz_slo.ttft_panel(rate_per_s=10)
    first = [list(t.x) for t in panel.figure.data]
    panel.controls["rate_per_s"].value = 80
    assert [list(t.x) for t in panel.figure.data] != first
    assert "queueing" in panel.text()


def _tiny_trace() -> Workload:
    rng = np.random.default_rng(3)
    reqs = [Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(1 / 30, 120)), rng.integers(50, 3000, 120), rng.integers(1, 300, 120)))]
    return Workload("tiny", reqs, "test", True)


def test_replay_goodput_agrees_with_the_engines_ledger():
    trace = _tiny_trace()
    rp = R.replay(trace, R.ReplayConfig("paged"), speedup=1.5, window_s=3.0)
    window = [r for r in trace if r.arrival_s < 3.0]
    assert rp.counters["requests"] == len(window) == rp.counters["finished"]
    # the same requests, straight into the engine: its own slo_report is the reference
    # the card's whole pool at b = 16, as replay takes it: 62.52e9 // (16 x 524,288) = 7,452 on the lecture's
    engine = Engine(cost_model=CostModel(), num_blocks=hand_card()["blocks"], block_size=16, record_token_times=False)
    for r in window:
        engine.add_request(prompt_len=r.prompt_tokens, max_new_tokens=r.output_tokens, arrival_time=r.arrival_s / 1.5)
    result = engine.run()
    for ttft, tpot in ((0.2, 0.015), (1.0, 0.030), (1e9, 1e9)):
        rep = result.slo(ttft, tpot)
        assert rp.goodput_tok_s(ttft, tpot) == pytest.approx(rep.goodput_tok_s, rel=1e-12)
        assert rp.goodput_frac(ttft, tpot) == pytest.approx(rep.goodput_req_frac, rel=1e-12)
    assert rp.throughput_tok_s == pytest.approx(result.slo(1, 1).throughput_tok_s, rel=1e-12)
    assert rp.mean_split().total_s == pytest.approx(np.mean([r.ttft_s for r in result.requests.values()]))
    with pytest.raises(ValueError, match="no request"):
        R.replay(trace, R.ReplayConfig("x"), window_s=0.0)
    with pytest.raises(ValueError, match="speedup"):
        R.replay(trace, R.ReplayConfig("x"), speedup=0)


def test_goodput_panel_recounts_without_rerunning():
    trace = _tiny_trace()
    replays = [R.replay(trace, R.ReplayConfig("paged")),
               R.replay(trace, R.ReplayConfig("naive", block_size=4096))]
    fig = viz_slo.goodput_vs_slo_figure(replays, 20.0, 1.0)
    curve = fig.data[0]
    assert list(curve.y) == sorted(curve.y)  # goodput never falls as the SLO loosens
    assert curve.y[-1] <= replays[0].throughput_tok_s + 1e-9
    panel = viz_slo.goodput_slo_panel(replays, tpot_slo_ms=5.0)
    low = panel.figure.data[2].y[0]
    panel.controls["tpot_slo_ms"].value = 60.0
    assert panel.figure.data[2].y[0] == pytest.approx(replays[0].goodput_tok_s(1.0, 0.060))
    assert panel.figure.data[2].y[0] >= low
    assert "TPOT SLO 60 ms" in panel.figure.layout.annotations[0].text


def test_utilization_is_what_the_allocator_holds():
    reqs = [(0.0, 512, 128)]
    exact = R.utilization_run(reqs, 1)  # block size 1: every reserved slot holds a token
    naive = R.utilization_run(reqs, 4096)
    paged = R.utilization_run(reqs, 16)
    assert exact.utilization == pytest.approx(1.0)
    assert 512 / 4096 <= naive.utilization <= 639 / 4096  # one 4,096-token slot holding 512..639 tokens
    assert 512 / 528 <= paged.utilization <= 1.0
    assert naive.throughput_tok_s == exact.throughput_tok_s == paged.throughput_tok_s  # same steps, same clock
    slots = hand_card()["naive"]  # the card's 4,096-token slots: 29 on the lecture's
    with pytest.raises(ValueError, match="rejected"):
        R.utilization_run([(0.0, slots * 4096 + 1, 10)], 4096)  # slots + 1 slots of 4,096 > the pool's
    assert R.chat_requests(10, 5)[0][1:] == (512, 128)


def test_figure_view_has_a_deterministic_text():
    view = viz_slo.FigureView(go.Figure(go.Bar(x=[1], y=[2])), "one bar")
    bundle = view._repr_mimebundle_()
    assert bundle["text/plain"] == "one bar"
    # plotly's own output, not a widget: it draws in a notebook reopened without a kernel
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    assert bundle["application/vnd.plotly.v1+json"]["data"] == [{"type": "bar", "x": [1], "y": [2]}]


def test_reserve_to_max_replay_never_preempts():
    """A reserve-to-max engine holds one S_max slot per sequence: it refuses and truncates, never preempts."""
    rng = np.random.default_rng(7)
    reqs = [Request(i, 0.001 * i, int(p), int(o)) for i, (p, o) in
            enumerate(zip(rng.integers(100, 5000, 300), rng.integers(1, 900, 300)))]
    trace = Workload("mixed", reqs, "test", True)
    lecture = CostModel(LECTURE_7B, LECTURE_GPU)  # the lecture's 29-slot pool, named: the old emulation's contrast
    rp = R.replay(trace, R.ReplayConfig("naive", s_max=4096), cost_model=lecture)  # needs a pool under pressure
    refused = sum(r.prompt_tokens >= 4096 for r in reqs)
    cut = sum(r.prompt_tokens < 4096 < r.prompt_tokens + r.output_tokens for r in reqs)
    c = rp.counters
    assert c["preemptions"] == {"swap": 0, "recompute": 0}
    assert c["num_blocks"] == 62_520_000_000 // (4096 * 524_288) == 29
    assert c["peak_running"] <= 29
    assert c["requests"] == 300 and c["finished"] == 300 - refused and c["truncated"] == cut > 0
    assert refused > 0 and (~rp.finished).sum() == refused and np.isnan(rp.ttft_s[~rp.finished]).all()
    kept = [r for r in reqs if r.prompt_tokens < 4096]
    assert rp.tokens.sum() == sum(min(r.output_tokens, 4096 - r.prompt_tokens) for r in kept)
    # the old emulation (a 4,096-token block, no window) lets long requests take a second block and preempt
    old = R.replay(trace, R.ReplayConfig("naive", block_size=4096), cost_model=lecture)
    assert sum(old.counters["preemptions"].values()) > 0
