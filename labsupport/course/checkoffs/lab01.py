"""Lab 01 checkoffs: §10.1's five jobs, and Lecture 2's collision of 295 against 29."""
from __future__ import annotations

from dataclasses import replace

from labsupport.course.checkoffs._hidden import kv_blocks, random_pair
from labsupport.course.registry import case, choice, function, value
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


choice(
    "1.4", "The job the engine cannot take back",
    answer="admit", options=JOBS,
    hint="Ask of each job: if the engine gets it wrong at this step, can the next iteration quietly fix it? "
         "Which decision is a promise made to a request before anyone knows how long it will run?",
    mistakes={"allocate": "A bad allocation can be undone: free the blocks, or preempt and reallocate later.",
              "batch": "The batch is re-chosen every iteration (Oct 7): a bad choice costs one step.",
              "run": "A slow step costs latency once; the next step is a fresh start.",
              "stream": "Streaming only forwards tokens already produced."},
)
