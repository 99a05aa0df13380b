"""Lab 07 checkoffs: §10.6's SLO ledger, Exercise 5.  7.3, 7.4 and 7.7 judge small real engine runs
(`live(engine_requests, ...)`): check() rebuilds a run from its recipe, while `grade` runs it here and sends
the sandbox only its records (`data.as_input`), never the seed from which every other output follows."""
from __future__ import annotations

import functools
import math

from labsupport import card
from labsupport.course.checkoffs._hidden import kv_blocks, kv_per_token, random_pair, tpot_batch, weight_bytes
from labsupport.course.data import live
from labsupport.course.harness.lab07 import engine_requests, engine_run, engine_run_requests, engine_run_steps
from labsupport.course.registry import case, choice, function
from labsupport.specs import GPUS, LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, LLAMA3_70B

# Exercise 5's "mha" change on the course card: the KV per token of its MHA form over its GQA form's (4 for the
# lecture's 7B and its GQA-8); the lab's 7.6 runs on the card's models
_MHA_OVER_GQA = card.card().mha.kv_bytes_per_token // card.card().gqa.kv_bytes_per_token
_POOL = ("labsupport.ledger.paged_concurrency", "labsupport.slo.memory_ceiling", "labsupport.viz.slo.memory_ceiling")


@functools.lru_cache(maxsize=32)
def _live_run(make, config: tuple):
    """One engine run as a case's input (a `live` object: the grader's copy, and the recipe the sandbox rebuilds),
    made once per plan and shared by the cases on it; the fixed configs' runs, the same for everyone, once per
    process.  Planning reads them only (a `live` is changed through its methods, and no case calls one)."""
    return live(make, *config)


@functools.lru_cache(maxsize=32)
def _finished(config: tuple) -> tuple:
    """The finished requests of `engine_run(*config)`, in the engine's order (7.7's answers come from them)."""
    return tuple(r for r in engine_run(*config)[1] if r.status == "finished")


_TPOT_CASES = [(LECTURE_7B, "h100", 186, 640), (LECTURE_7B, "h100", 1, 640), (LECTURE_7B, "h100", 29, 640),
               (LECTURE_7B, "h100", 199, 640), (LECTURE_7B_GQA8, "h100", 400, 4096), (LLAMA3_8B, "a100-80gb", 64, 2048),
               (LLAMA3_70B, "h200", 32, 8192), (LECTURE_7B, "l4", 4, 512)]


@function(
    "7.1", "TPOT at batch B",
    hint="Start from lab 01: is a decode step waiting on the chip's arithmetic or on its memory? Whichever it "
         "is, the step lasts as long as that work takes. Then list what the step must bring in to give each of "
         "the B sequences its next token, and ask of each item: does every sequence need it (so one step fetches "
         "it once for all of them), or only one sequence (so it is fetched once per sequence)? Count each item "
         "from the spec fields, in the unit the card's rate is given in, as lab 00 counted bytes from a shape.",
    forbid=("labsupport.ledger.tpot_s", "labsupport.ledger.decode_step_bytes", "labsupport.slo.tpot_terms",
            "labsupport.viz.slo.tpot_terms", "labsupport.slo.step_tpot_s", "labsupport.viz.slo.step_tpot_s"),
    derive="decide what binds a decode step and count what one step must move yourself, from the spec fields",
    name="tpot",
)
def _tpot(rng):
    cases = [(model, GPUS[name], batch, seq) for model, name, batch, seq in _TPOT_CASES]
    cases += [(*random_pair(rng), rng.randint(1, 1000), rng.randint(1, 100_000)) for _ in range(6)]
    for model, gpu, batch, seq in cases:
        kv_all = batch * seq * kv_per_token(model)
        want = (weight_bytes(model) + kv_all) / gpu.hbm_bandwidth
        # at B = 1 the slips are other slips' numbers too (the weights once per sequence is once): no remark there
        mistakes = [] if batch <= 1 else [
            ((batch * weight_bytes(model) + kv_all) / gpu.hbm_bandwidth,
             "That streams the weights once per sequence; one step reads each weight once and every sequence in "
             "the batch uses it."),
            (kv_all / gpu.hbm_bandwidth, "That leaves out the weights, which every step streams too."),
            (weight_bytes(model) / gpu.hbm_bandwidth, "That leaves out the KV of the B sequences in the step."),
            ((weight_bytes(model) + kv_all * model.num_heads / model.num_kv_heads) / gpu.hbm_bandwidth,
             "That reads the KV of every query head; the cache holds only the KV heads (GQA shares them).")]
        yield case(model, gpu, batch, seq, want=want, rel_tol=1e-6, mistakes=mistakes,
                   what=f"tpot({model.name}, {gpu.name}, batch={batch}, seq_tokens={seq})")


_MAX_BATCH_CASES = [(LECTURE_7B, "h100", 640, 0.020, 16), (LECTURE_7B, "h100", 640, 0.030, 16),
                    (LECTURE_7B, "h100", 640, 0.003, 16), (LECTURE_7B, "h100", 2048, 0.025, 16),
                    (LECTURE_7B_GQA8, "h100", 640, 0.020, 16), (LECTURE_7B_GQA8, "h100", 4000, 0.040, 32),
                    (LLAMA3_8B, "a100-80gb", 1500, 0.035, 16), (LLAMA3_70B, "h200", 4096, 0.045, 16),
                    (LECTURE_7B, "h100", 640, 0.020, 256)]


@function(
    "7.2", "The largest B that meets the TPOT SLO",
    hint="Two ceilings, and the batch must fit under both. Memory: the paged pool holds "
         "floor(KV budget / block bytes) blocks and each sequence needs ceil(S / block_size) of them. Latency: "
         "write TPOT(B) from 7.1, set it equal to the SLO and solve for B, rounding the way a count of whole "
         "sequences must be rounded (or search your 7.1's tpot for the last batch that clears the SLO: it grows "
         "with B). When the weights alone take longer than the SLO, no batch meets it.",
    forbid=("labsupport.ledger.max_batch_for_tpot", *_POOL, "labsupport.slo.three_columns",
            "labsupport.viz.slo.three_columns", "labsupport.slo.largest_batch_meeting", "labsupport.slo.slo_batch",
            "labsupport.viz.slo.slo_batch"),
    derive="take the smaller of the pool's whole-block ceiling and TPOT(B) = SLO solved for a whole B",
    name="max_batch",
)
def _max_batch(rng):
    cases = [(model, GPUS[name], seq, slo, bs) for model, name, seq, slo, bs in _MAX_BATCH_CASES]
    for _ in range(6):
        model, gpu = random_pair(rng, fits=True)
        weights_s = weight_bytes(model) / gpu.hbm_bandwidth  # SLOs around the weights' own read time
        cases.append((model, gpu, rng.randint(16, 20_000), round(weights_s * rng.uniform(0.8, 6.0), 6),
                      rng.choice((1, 8, 16, 32, 128))))
    for model, gpu, seq, slo, bs in cases:
        want = min(kv_blocks(model, gpu, bs) // math.ceil(seq / bs), tpot_batch(model, gpu, seq, slo))
        # whole: a batch counts whole sequences; at_least: when nothing meets the SLO the answer is zero sequences
        yield case(model, gpu, seq, slo, bs, want=want, whole=True, at_least=0,
                   what=f"max_batch({model.name}, {gpu.name}, seq_tokens={seq}, tpot_slo_s={slo}, block_size={bs})")


def _run_configs(rng):
    """(seed, rate, blocks, n_req) of small engine runs on the course card (the harness's CostModel: its model and
    GPU), in pools of up to 7,452 blocks (the lecture's whole pool): three fixed, one nobody has seen."""
    return [(1, 40.0, 7452, 60), (2, 400.0, 400, 80), (3, 5.0, 7452, 30),
            (rng.getrandbits(32), rng.choice((10.0, 80.0, 300.0)), rng.choice((300, 900, 7452)), rng.randint(20, 70))]


def _run_configs_7_3(rng):
    """(seed, rate, blocks, n_req) of `engine_run`s: three fixed, one nobody has seen."""
    return [(11, 40.0, 7452, 50), (12, 300.0, 400, 60), (14, 80.0, 900, 40),
            (rng.getrandbits(32), rng.choice((20.0, 80.0, 300.0)), rng.choice((400, 900, 7452)), rng.randint(25, 60))]


@function(
    "7.3", "Goodput of a run",
    hint="Goodput counts only what met its SLO. Walk the finished requests; keep one only if its TTFT "
         "(first_token_time - arrival_time) is within the TTFT SLO and its TPOT (tpot_s; None means it produced "
         "a single token, so it has no TPOT to miss) is within the TPOT SLO. Add up the output tokens of the "
         "requests you kept, every branch's, and divide by the run's duration — from the first arrival of any "
         "request (a refused one included: the run began when it arrived) to the last finish — the same "
         "duration throughput uses. Rejected requests earn nothing.",
    forbid=("labsupport.slo.slo_report", "labsupport.measure.replay.Replay.goodput_tok_s"),
    derive="walk the finished requests, keep those within both SLOs, and divide their tokens by the run's span",
    name="goodput",
)
def _goodput(rng):
    # every run opens with a request that is refused (the first arrival never finishes, so the span starts before
    # any finished request arrived), and holds requests with one output token (no TPOT) and with several branches
    for i, config in enumerate(_run_configs_7_3(rng)):
        run = _live_run(engine_run_requests, tuple(config))
        requests = run.real
        finish = [r.finish_time for r in requests if r.status == "finished"]
        if not finish:  # never for these sizes (a pool holds any one request); a case needs a run to read
            continue
        span = max(finish) - min(r.arrival_time for r in requests)
        for ttft, tpot in [(0.5, 0.020), (2.0, 0.050), (0.2, 0.012), (100.0, 1.0),
                           (rng.uniform(0.05, 5), rng.uniform(0.005, 0.1))]:
            good = [r for r in requests if r.status == "finished" and r.first_token_time - r.arrival_time <= ttft
                    and (r.tpot_s is None or r.tpot_s <= tpot)]
            yield case(run, ttft, tpot, want=sum(r.total_output_tokens for r in good) / span,
                       rel_tol=1e-9,
                       what=f"goodput(run {i + 1}'s requests, ttft_slo_s={ttft:.6g}, tpot_slo_s={tpot:.6g})")


@function(
    "7.4", "Why a mean is a lie: TTFT's mean, its p99, and who missed",
    hint="An SLO is a promise to each request, so look at the distribution, not its centre. Use the finished "
         "requests only (a rejected request has no first token). TTFT is first_token_time - arrival_time; the "
         "p99 is the value 99% of them are at or under, interpolated between the two closest ranks as "
         "numpy.percentile does by default; the miss share is the fraction of the finished requests whose TTFT is "
         "over the SLO.",
    forbid=("labsupport.slo.slo_report", "labsupport.slo._pct"),
    derive="collect the finished requests' TTFTs, sort them, and read the mean, the p99 and the share over the SLO",
    name="ttft_tail",
)
def _ttft_tail(rng):
    for i, config in enumerate(_run_configs(rng)):
        run = _live_run(engine_requests, tuple(config))
        requests = run.real
        ttfts = sorted(r.first_token_time - r.arrival_time for r in requests if r.status == "finished")
        if not ttfts:  # never for these sizes; a mean and a p99 need a finished request
            continue
        nearest = ttfts[max(0, math.ceil(0.99 * len(ttfts)) - 1)]  # the nearest-rank p99, a known variant
        rejected = len(requests) - len(ttfts)
        pos = (len(ttfts) - 1) * 0.99  # numpy's default: linear between the two closest ranks
        lo, hi = math.floor(pos), min(math.floor(pos) + 1, len(ttfts) - 1)
        p99 = ttfts[lo] + (ttfts[hi] - ttfts[lo]) * (pos - lo)
        for slo in (0.5, 0.2, 2.0, rng.uniform(0.02, 5)):
            want = {"mean_s": sum(ttfts) / len(ttfts), "p99_s": p99,
                    "miss_share": sum(t > slo for t in ttfts) / len(ttfts)}
            share = []
            if want["miss_share"]:  # at a share of 0, dividing by every request is right too
                share.append([want["miss_share"] * len(ttfts) / len(requests),
                              "That divides by every request, rejected ones included; a rejected request has no "
                              "TTFT, so the share is over the finished ones."])
            share.append([(want["miss_share"] * len(ttfts) + rejected) / len(requests),
                          "That counts the rejected requests as misses, in the numerator and the denominator; the "
                          "share asked for is of the finished requests only. A rejected request has no TTFT to miss "
                          "(goodput, 7.3, is where it counts against the card)."])
            keys = {"mean_s": {"rel_tol": 1e-6},
                    "p99_s": {"rel_tol": 1e-6, "mistakes": [
                        [nearest, "That is the nearest-rank p99; interpolate between the two closest ranks "
                                  "(numpy.percentile's default), as the engine's own ledger does."]]},
                    "miss_share": {"rel_tol": 1e-6, "mistakes": share}}
            yield case(run, slo, want=want, rel_tol=1e-6, keys=keys,
                       what=f"ttft_tail(run {i + 1}'s requests, ttft_slo_s={slo:.6g})")


_SESSION = [2_000 + 300 * i for i in range(20)]  # Lecture 5's agent: 97,000 submitted, 7,700 at the last step


def _prefill_flops(model, prompts, attention_coef: int = 4, heads: int | None = None) -> float:
    # every step's prompt from scratch: 2 N p for the weights, c·L·H·d·p² for attention over its own prompt
    return sum(2 * model.num_params * p + attention_coef * model.num_layers * (heads or model.num_heads)
               * model.head_dim * p * p for p in prompts)


def _random_session(rng) -> list[int]:
    steps, first, growth = rng.randint(1, 40), rng.randint(50, 20_000), rng.randint(0, 2_000)
    return [first + growth * i for i in range(steps)]


@function(
    "7.5", "Exercise 5: the agent session's peak KV, sessions per card and prefill cost",
    hint="Three separate quantities. Peak KV: the largest context the session holds, times the KV bytes per "
         "token (GQA shrinks that). Sessions per card: the paged pool's blocks divided by the blocks one session's "
         "peak context needs (whole blocks, whole sessions; none when the weights leave no KV budget). Prefill: "
         "each step prefills its own prompt from scratch — the weights' 2 FLOP per parameter per token, and "
         "attention's QK^T and PV, every query head against all the keys of that step's prompt; divide by the rate "
         "actually achieved, half of peak.",
    forbid=("labsupport.ledger.exercise5", "labsupport.ledger.prefill_flops", "labsupport.ledger.recompute_s",
            *_POOL),
    derive="compute the peak context's bytes, the whole sessions the pool holds, and every step's prefill FLOPs",
    name="agent_session_ledger",
)
def _exercise5(rng):
    cases = [(model, GPUS[name], prompts, bs) for model, name, prompts, bs in (
        (LECTURE_7B_GQA8, "h100", _SESSION, 16), (LECTURE_7B, "h100", _SESSION, 16),
        (LECTURE_7B_GQA8, "h100", [3_000 + 450 * i for i in range(20)], 32), (LLAMA3_8B, "h200", [30_000], 16),
        (LLAMA3_70B, "h200", _SESSION[:10], 16))]
    cases += [(*random_pair(rng), _random_session(rng), rng.choice((1, 16, 64))) for _ in range(4)]
    for model, gpu, prompts, bs in cases:
        ctx, rate = max(prompts), 0.5 * gpu.peak_flops
        kv, heads = kv_per_token(model), model.num_heads / model.num_kv_heads
        want = {"peak_kv_bytes": ctx * kv, "sessions": kv_blocks(model, gpu, bs) // math.ceil(ctx / bs),
                "prefill_s": _prefill_flops(model, prompts) / rate}
        peak = [[ctx * kv / 2, "That keeps one tensor; every layer caches a key and a value."],
                [sum(prompts) * kv, "That is every submitted token's KV; the session holds its context once, at "
                                    "most its largest prompt."]]
        if heads != 1:
            peak.insert(0, [ctx * kv * heads, "That keeps K and V for every query head; the cache holds only the KV "
                                              "heads."])
        prefill = [[2 * model.num_params * sum(prompts) / rate,
                    "That is the weights' arithmetic alone, as the lecture's sketch counts it; this exercise adds "
                    "attention's, over each step's own prompt."],
                   [_prefill_flops(model, prompts, attention_coef=2) / rate,
                    "That counts attention causally (2·L·H·d·p²); count it as lab 06 did, every query against all "
                    "the keys of its prompt (4·L·H·d·p²)."],
                   [_prefill_flops(model, prompts) / gpu.peak_flops, "That runs at the card's peak; it achieves "
                                                                     "half of it."]]
        if len(prompts) > 1:
            prefill.append([(2 * model.num_params * sum(prompts) + 4 * model.num_layers * model.num_heads
                             * model.head_dim * sum(prompts) ** 2) / rate,
                            "That squares the submitted total; each step's attention runs over its own prompt."])
        if heads != 1:
            prefill.append([_prefill_flops(model, prompts, heads=model.num_kv_heads) / rate,
                            "That counts attention over the KV heads; every query head attends (GQA shares K and V, "
                            "not the arithmetic)."])
        keys = {"peak_kv_bytes": {"rel_tol": 1e-6, "mistakes": peak},
                "sessions": {"rel_tol": 1e-6, "mistakes": [
                    [kv_blocks(model, gpu, bs, 0) // math.ceil(ctx / bs),
                     "That leaves out the 4 GB reserve for activations and workspace."],
                    [kv_blocks(model, gpu, ctx),
                     "That divides the bytes by the session's bytes; a paged session holds whole blocks, so its last "
                     "block is held in full."]]},
                "prefill_s": {"rel_tol": 1e-6, "mistakes": prefill}}
        yield case(model, gpu, list(prompts), bs, want=want, rel_tol=1e-6, keys=keys,
                   what=f"agent_session_ledger({model.name}, {gpu.name}, prompts=<{len(prompts)} steps, "
                        f"{prompts[0]:,} to {ctx:,} tokens>, block_size={bs})")


choice(
    "7.6", "Exercise 5: which change raises paging's gain in sessions per card the most?",
    answer="steps", options=("mha", "memory", "blocks", "s_max", "steps"),
    hint="Write both session counts as a budget divided by what one session holds: a reserve-to-max slot holds "
         "S_max tokens whatever the session does, a paged session its peak context in whole blocks. Their ratio "
         "is then nearly one quantity over another; ask which change moves that ratio, not the two counts.",
    mistakes={"mha": f"MHA makes every token {_MHA_OVER_GQA}× bigger in both allocators: both counts fall about "
                     f"{_MHA_OVER_GQA}×, and their ratio barely moves.",
              "memory": "Twice the budget holds about twice as many sessions in both allocators: the ratio barely "
                        "moves.",
              "blocks": "A larger block wastes a little more of each session's last block: the gain falls, "
                        "slightly.",
              "s_max": "A smaller S_max shrinks the reserved slot toward the session's real context: the gain falls "
                       "toward 1."},
)


def _split_cases(rng):
    """(config, [request ids]) of `engine_run`s: three fixed, one nobody has seen; each run's requests chosen to
    include one that arrived at an idle engine, one that queued the longest, and one whose arrival fell inside
    a step."""
    configs = [(12, 300.0, 400, 60), (13, 5.0, 7452, 25), (14, 80.0, 900, 40),
               (rng.getrandbits(32), rng.choice((20.0, 80.0, 300.0)), rng.choice((400, 900, 7452)), rng.randint(25, 60))]
    for config in configs:
        finished = _finished(tuple(config))
        if not finished:  # never for these sizes; a case needs a request that ran
            continue
        chosen = {finished[0].request_id, max(finished, key=lambda r: r.queueing_s).request_id,
                  max(finished, key=lambda r: r.scheduling_delay_s).request_id,
                  min(finished, key=lambda r: r.scheduling_delay_s).request_id,
                  *(r.request_id for r in rng.sample(finished, min(3, len(finished))))}
        yield config, {r.request_id: r for r in finished if r.request_id in chosen}


@function(
    "7.7", "TTFT decomposed, read off the engine's step log",
    hint="Walk the steps in order. A request that arrives waits for the next step to begin (the batch is chosen "
         "only at a step boundary): that wait is its scheduling delay. From that boundary it waits, step after "
         "step, until a step admits it (its id is in that step's `admitted`): that is queueing. The step that "
         "admits it runs its prefill and emits its first token when it ends: that step's length is the prefill.",
    name="ttft_split",
)
def _ttft_split(rng):
    for i, (config, chosen) in enumerate(_split_cases(rng)):
        steps = _live_run(engine_run_steps, tuple(config))
        for rid, r in sorted(chosen.items()):
            want = {"scheduling_delay_s": r.scheduled_time - r.arrival_time,
                    "queueing_s": r.admitted_time - r.scheduled_time,
                    "prefill_s": r.first_token_time - r.admitted_time}
            keys = {k: {"rel_tol": 1e-9, "abs_tol": 1e-12} for k in want}
            yield case(steps, rid, r.arrival_time, want=want, rel_tol=1e-9, abs_tol=1e-12,
                       keys=keys, what=f"ttft_split(run {i + 1}'s steps, request_id={rid}, "
                                       f"arrival_time={r.arrival_time:.6g})")
