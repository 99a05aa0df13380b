"""Lab 01 checkoffs: §10.1's five jobs, and Lecture 2's collision of 295 against 29."""
from __future__ import annotations

from dataclasses import replace

from labsupport import card
from labsupport.course.checkoffs._hidden import kv_blocks, kv_per_token, random_pair
from labsupport.course.registry import case, choice, function, value
from labsupport.costmodel import CostModel
from labsupport.measure.engine_runs import job_run
from labsupport.specs import GPUS, LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, LLAMA3_70B

JOBS = ("admit", "allocate", "batch", "run", "stream")
# What each job hands out (§10.1); "places" in the next forward pass, so that no option spells out a job.
RESOURCES = ("memory", "arithmetic", "places", "latency")
_RESOURCE_OF = {"admit": "memory", "allocate": "memory", "batch": "places", "run": "arithmetic", "stream": "latency"}
_RESOURCE_REMARKS = {
    ("batch", "memory"): "Batching is limited by memory (§2.15), but what it hands out is a place in the next "
                         "forward pass: it is re-chosen every iteration.",
    ("admit", "places"): "Admission is a promise of KV space for the request's whole life, not a place in "
                         "one step.",
    ("admit", "arithmetic"): "The lecture is explicit: admission's resource is memory, not compute.",
    ("run", "memory"): "The kernels read memory, but what running them spends is the GPU's arithmetic "
                       "(and bandwidth): it is the one job about compute.",
    ("stream", "memory"): "Streaming only forwards tokens already made; what the user feels is each step's time.",
    ("allocate", "places"): "Allocation finds KV space for the prefill and for the growth.",
}

_FP32 = replace(LECTURE_7B, name="lecture-7b-fp32-weights", dtype_bytes=4)
_FP8 = replace(LECTURE_7B, name="lecture-7b-fp8-weights", dtype_bytes=1)

value(
    "1.1", "The resource each of the five jobs contends for",
    expected=lambda: dict(_RESOURCE_OF), judge_name="matching", options=RESOURCES, noun="job",
    remarks={f"{job}={resource}": why for (job, resource), why in _RESOURCE_REMARKS.items()},
    fixed="a map from the lecture's five jobs to named resources: a reading of §10.1, nothing to vary",
    hint="For each verb ask what the engine hands out when it does this job, and what runs out first if it "
         "hands out too much: a promise or a grant of KV space, arithmetic, a place in the next forward pass, "
         "or time the user waits for. The lecture counts two jobs about memory and one about arithmetic.",
)


@function(
    "1.2", "The ridge-point batch",
    hint="In one decode step every weight is read once from HBM (num_params × dtype_bytes bytes) and each of "
         "the B sequences does 2 FLOP per weight (a multiply and an add). Write the step's FLOP per byte as a "
         "function of B, and find the B at which it equals the ratio the GPU can sustain: peak FLOP/s over HBM "
         "bytes/s. Use the model's and the GPU's fields, not typed-in constants.",
    forbid=("labsupport.ledger.ridge_batch", "labsupport.ledger.ridge_batch_with_kv"),
    derive="set the step's FLOP per byte, 2B / dtype_bytes, equal to peak / bandwidth and solve for B",
    name="ridge_batch",
)
def _ridge_batch(rng):
    pairs = [(m, g) for m in (LECTURE_7B, LLAMA3_70B, _FP32, _FP8)
             for g in (GPUS["h100"], GPUS["a100-80gb"], GPUS["l4"], GPUS["t4"])]
    pairs += [random_pair(rng) for _ in range(6)]
    for model, gpu in pairs:  # B * 2 * N FLOP over N * b bytes equals peak / bandwidth; rounding either way is fine
        yield case(model, gpu, want=gpu.peak_flops / gpu.hbm_bandwidth * model.dtype_bytes / 2, abs_tol=1.0)


_MEMORY_CASES = [(LECTURE_7B, "h100", 4096), (LECTURE_7B_GQA8, "h100", 4096), (LECTURE_7B, "h100", 32_768),
                 (LECTURE_7B, "h100", 131_072), (LECTURE_7B_GQA8, "h100", 131_072), (LLAMA3_8B, "a100-40gb", 8192),
                 (LLAMA3_8B, "l4", 2048), (LLAMA3_70B, "h200", 4096), (LLAMA3_70B, "h100", 4096),
                 (LECTURE_7B, "t4", 512)]


@function(
    "1.3", "The memory-limited batch",
    hint="Start from the card's HBM and take away the weights (num_params × dtype_bytes) and the 4 GB reserve: "
         "that is the KV budget. A reserve-to-max slot holds S_max tokens at the model's KV bytes per token, "
         "however short the sequence really is. The batch is the number of whole slots that fit in the budget — "
         "and zero when the weights leave no budget at all.",
    forbid=("labsupport.ledger.naive_concurrency", "labsupport.ledger.kv_budget_bytes"),
    derive="subtract the weights and the reserve from the card's memory and count whole S_max slots yourself",
    name="memory_batch",
)
def _memory_batch(rng):
    cases = [(model, GPUS[name], s_max) for model, name, s_max in _MEMORY_CASES]
    cases += [(*random_pair(rng, fits=True), rng.choice((256, 1000, 2048, 4096, 6000, 8192, 32_768)))
              for _ in range(5)]
    cases.append((*random_pair(rng, fits=False), 4096))  # the weights leave nothing: zero sequences
    for model, gpu, s_max in cases:
        yield case(model, gpu, s_max, want=kv_blocks(model, gpu, s_max), whole=True, at_least=0,
                   what=f"memory_batch({model.name}, {gpu.name}, s_max={s_max})")


# --- 1.5: the five jobs, attributed from a run of the real engine (objective 1, built) ----------------------

# The lab's own run: a dozen chat requests arriving by step on the course card's model in MHA form and its GPU (the
# lab source builds the same list; the graders keep their own copy).  (step it arrives before, prompt tokens, max new
# tokens)
LAB_REQUESTS = ((0, 512, 24), (0, 380, 40), (1, 600, 12), (3, 512, 30), (4, 90, 48), (6, 1_000, 20),
                (9, 256, 36), (10, 512, 16), (14, 700, 28), (15, 128, 40), (20, 512, 24), (24, 2_048, 8))
LAB_POOL = 600  # blocks of 16 tokens: room for everyone, so nobody is preempted
LEDGER_KEYS = ("admit", "allocate", "batch", "run", "stream")


def _ledger_of(result, model, block_size: int) -> dict:
    """The five numbers, read off the engine's own result and counters (not off the step records the student reads)."""
    kv, c = kv_per_token(model), result.counters
    reqs = [r for r in result.requests.values() if r.finished]
    promised = max((sum((r.prompt_len + r.max_new_tokens) * kv for r in reqs  # default: a run with no block time
                        if r.first_token_time <= end < r.finish_time) for end in c.block_times), default=0)
    gaps = [b - a for r in reqs for a, b in zip(r.token_times[0], r.token_times[0][1:])]
    return {"admit": promised, "allocate": c.peak_blocks * block_size * kv,
            "batch": sum(r.total_output_tokens for r in reqs) / max(1, c.steps),
            "run": 2 * model.num_params * (c.prefill_tokens + c.decode_tokens),
            "stream": max(gaps, default=0.0)}


def _ledger_slips(result, model, block_size: int, trace: dict) -> dict:
    """Per key, the answers of the known slips, worked out the same way (from the result), with their remarks."""
    kv, c = kv_per_token(model), result.counters
    reqs = [r for r in result.requests.values() if r.finished]
    prompt_only = max((sum(r.prompt_len * kv for r in reqs if r.first_token_time <= end < r.finish_time)
                       for end in c.block_times), default=0)
    gaps = [b - a for r in reqs for a, b in zip(r.token_times[0], r.token_times[0][1:])]
    return {
        "admit": [(prompt_only, "That is the prompts' KV; admission promises each request room for everything "
                                "it will ever hold, its outputs included.")],
        "allocate": [(c.peak_blocks * block_size, "That is tokens' worth of blocks; the memory is in bytes.")],
        "batch": [(c.decode_tokens / max(1, c.steps), "A sequence whose prefill runs in the step has a place in "
                                                      "that forward pass too.")],
        "run": [(model.num_params * (c.prefill_tokens + c.decode_tokens), "A weight costs a multiply and an add "
                                                                          "per token: two FLOP."),
                (2 * model.num_params * c.decode_tokens, "The prefills are arithmetic too: every prompt token "
                                                         "goes through every weight once."),
                (2 * model.num_params * sum(r.total_output_tokens for r in reqs), "The first output token comes "
                 "out of the prefill, which pushed the whole prompt through the weights, not one token.")],
        "stream": [(sum(gaps) / len(gaps) if gaps else 0.0, "That is the mean gap; what a user feels is the "
                                                            "longest wait between two of their tokens.")],
    }


def job_case(model, requests, num_blocks: int, block_size: int = 16, what: str = ""):
    """One case of 1.5: the engine run on `model` (cost-model clock, the course card's GPU) as the student's input."""
    trace, result = job_run(CostModel(model), requests, num_blocks=num_blocks, block_size=block_size)
    slips = _ledger_slips(result, model, block_size, trace)
    keys = {k: {"rel_tol": 1e-6, "mistakes": slips[k]} for k in LEDGER_KEYS}
    return case(trace, want=_ledger_of(result, model, block_size), keys=keys, rel_tol=1e-6,
                what=what or f"job_ledger(<{model.name}, {len(requests)} requests, {block_size}-token blocks>)")


def _random_requests(rng) -> list[tuple[int, int, int]]:
    return [(rng.randint(0, 12), rng.randint(1, 900), rng.randint(1, 20)) for _ in range(rng.randint(3, 7))]


@function(
    "1.5", "The five jobs, attributed from an engine trace",
    hint="Read each job off what the steps record: admission is a promise that lasts from the step that admits a "
         "request to the step that finishes it, for everything the request will ever hold; allocation is what the "
         "pool actually holds after a step; a place in a forward pass is a sequence that gets a token out of it; "
         "the arithmetic is every token pushed through the weights, prompt tokens included; and a user waits "
         "from one of their tokens to the next. Peaks are maxima over the steps; the batch is a mean over them.",
    derive="walk the step records yourself: the engine's counters and results are what the checkoff compares with",
    name="job_ledger",
)
def _job_ledger(rng):
    yield job_case(card.card().mha, LAB_REQUESTS[:6], 200, what="job_ledger(<the lab's first six requests>)")
    yield job_case(LECTURE_7B_GQA8, [(0, 30, 5), (0, 17, 1), (2, 100, 7), (3, 1, 3)], 40, block_size=8)
    yield job_case(LLAMA3_8B, [(0, 700, 6), (5, 16, 9), (5, 33, 2)], 120, block_size=32)
    for _ in range(2):
        model = rng.choice((LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, _FP8))
        yield job_case(model, _random_requests(rng), 1_000, block_size=rng.choice((8, 16, 32)))


# --- 1.4: a question the lecture does not answer, answered by the trace --------------------------------------------

def _ledger_changes() -> frozenset:
    """Which of the five numbers move when the lab's run (the card's model in MHA form) is replayed on its GQA form
    with the same pool: measured here, on the card's GPU, as the lab runs it."""
    course = card.card()
    mha = _ledger_of(job_run(CostModel(course.mha), LAB_REQUESTS, num_blocks=LAB_POOL)[1], course.mha, 16)
    gqa = _ledger_of(job_run(CostModel(course.gqa), LAB_REQUESTS, num_blocks=LAB_POOL)[1], course.gqa, 16)
    return frozenset(k for k in LEDGER_KEYS if abs(gqa[k] - mha[k]) > 1e-3 * abs(mha[k]))


GQA_MOVES = _ledger_changes()

choice(
    "1.4", f"What {card.card().gqa.attention} moves in the five jobs' ledger",
    answer=GQA_MOVES, options=LEDGER_KEYS,
    hint=f"{card.card().gqa.attention} keeps every weight and every query head and shrinks only the KV each token "
         "leaves behind. Ask of each job's number: is it counted in KV bytes, in places, in weight arithmetic, or in "
         "time — and if in time, which of a step's two costs sets its longest step, the bytes it reads or the "
         "arithmetic it does?",
    mistakes={"batch": "The pool has the same number of blocks and the arrivals come at the same steps: every "
                       "forward pass seats the same sequences.",
              "run": "The weights and the query heads are unchanged, so each token costs the same FLOP.",
              "stream": "The longest wait is a step that carries a prefill: it is set by arithmetic, which GQA "
                        "leaves alone."},
)
