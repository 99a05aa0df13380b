"""Lab 08 checkoffs: §10.7 and the vLLM knobs — each knob mapped to a quantity of the labs."""
from __future__ import annotations

import math
import random

from labsupport.course.checkoff import Mismatch, as_number, call, choice, expect_close, function
from labsupport.specs import GB, GPUS, LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, LLAMA3_70B

_ACTIVATIONS = 4 * GB  # the lecture's reserve for activations and workspace


def _kv_per_token(m) -> int:
    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes


def _blocks_hand(model, gpu, util, block_size, activation_bytes=_ACTIVATIONS) -> int:
    kv_cache = util * gpu.hbm_bytes - model.num_params * model.dtype_bytes - activation_bytes
    return max(0, math.floor(kv_cache / (block_size * _kv_per_token(model))))


def _whole(got, what: str) -> float:
    x = as_number(got, f"{what} returned a value that")
    if not x.is_integer():
        raise Mismatch(f"{what} returned {x:,.4g}: the knob takes a whole number.")
    if x < 0:
        raise Mismatch(f"{what} returned {x:g}: when nothing fits the answer is 0, not a negative number.")
    return x


_BLOCK_CASES = [(LECTURE_7B, "h100", 1.0, 16), (LECTURE_7B, "h100", 0.9, 16), (LECTURE_7B, "h100", 0.9, 32),
                (LECTURE_7B_GQA8, "h100", 0.9, 16), (LLAMA3_8B, "a100-40gb", 0.92, 16), (LLAMA3_8B, "l4", 0.9, 16),
                (LLAMA3_70B, "h200", 0.95, 16), (LLAMA3_70B, "h100", 0.9, 16), (LECTURE_7B, "t4", 0.9, 16)]


@function(
    "8.1", "gpu_memory_utilization → the KV pool",
    hint="vLLM lets the engine use gpu_memory_utilization × the card's memory in all. Out of that come the "
         "weights (num_params × dtype_bytes) and the activations (activation_bytes); what is left is the KV "
         "cache, cut into blocks of block_size tokens at the model's KV bytes per token. Whole blocks only, "
         "and none at all when the weights and activations already take everything.",
)
def _num_gpu_blocks(fn):
    for model, gpu_name, util, bs in _BLOCK_CASES:
        gpu = GPUS[gpu_name]
        what = f"num_gpu_blocks({model.name}, {gpu.name}, gpu_memory_utilization={util}, block_size={bs})"
        got = _whole(call(fn, model, gpu, util, bs), what)
        expect_close(got, _blocks_hand(model, gpu, util, bs), what)
    # the activation reserve is an argument, not a constant
    got = _whole(call(fn, LECTURE_7B, GPUS["h100"], 0.9, 16, activation_bytes=1 * GB), "num_gpu_blocks(..., activation_bytes=1e9)")
    expect_close(got, _blocks_hand(LECTURE_7B, GPUS["h100"], 0.9, 16, 1 * GB),
                 "num_gpu_blocks(lecture-7b, h100, 0.9, 16, activation_bytes=1 GB)")


@function(
    "8.2", "max_num_seqs → the B of §10.6",
    hint="max_num_seqs caps the decode batch. Set it to the largest B the card can actually serve within the "
         "TPOT SLO: it must fit the block pool (8.1's blocks ÷ the blocks one sequence of seq_tokens needs) and "
         "its memory-bound step must clear the SLO (lab 07's TPOT(B) solved for B). The smaller of the two "
         "binds.",
)
def _max_num_seqs(fn):
    cases = [(LECTURE_7B, "h100", 0.9, 640, 0.020, 16), (LECTURE_7B, "h100", 0.9, 640, 0.030, 16),
             (LECTURE_7B, "h100", 1.0, 640, 0.020, 16), (LECTURE_7B_GQA8, "h100", 0.9, 2048, 0.025, 16),
             (LLAMA3_8B, "a100-80gb", 0.9, 1200, 0.030, 32), (LECTURE_7B, "h100", 0.9, 640, 0.003, 16)]
    for model, gpu_name, util, seq, slo, bs in cases:
        gpu = GPUS[gpu_name]
        kv = _kv_per_token(model)
        memory = _blocks_hand(model, gpu, util, bs) // math.ceil(seq / bs)
        by_slo = max(0, math.floor((slo * gpu.hbm_bandwidth - model.num_params * model.dtype_bytes) / (seq * kv)))
        what = (f"max_num_seqs_for({model.name}, {gpu.name}, gpu_memory_utilization={util}, seq_tokens={seq}, "
                f"tpot_slo_s={slo}, block_size={bs})")
        got = _whole(call(fn, model, gpu, util, seq, slo, bs), what)
        expect_close(got, min(memory, by_slo), what)


@function(
    "8.3", "max_num_batched_tokens → the tokens one step may carry",
    hint="Every token a step processes — a decode token or a prompt token of a prefill — costs about 2 × N "
         "FLOP for the weights. At mfu × peak FLOP/s, how many tokens fit in one TPOT SLO? A step that carries "
         "more is compute-bound past the SLO however small its batch. Neglect the attention FLOPs and round "
         "down to whole tokens.",
)
def _max_batched_tokens(fn):
    cases = [(LECTURE_7B, "h100", 0.020, 0.5), (LECTURE_7B, "h100", 0.050, 0.5), (LECTURE_7B, "h100", 0.020, 0.4),
             (LLAMA3_8B, "a100-80gb", 0.030, 0.5), (LLAMA3_70B, "h200", 0.060, 0.5), (LECTURE_7B_GQA8, "l4", 0.1, 0.6)]
    for model, gpu_name, slo, mfu in cases:
        gpu = GPUS[gpu_name]
        want = math.floor(slo * mfu * gpu.peak_flops / (2 * model.num_params))
        what = f"max_num_batched_tokens_for({model.name}, {gpu.name}, tpot_slo_s={slo}, mfu={mfu})"
        got = _whole(call(fn, model, gpu, slo, mfu), what)
        expect_close(got, want, what)


def _allocator_waste(lengths, block_size) -> float:
    """Tail waste measured on the real block allocator: unfilled slots over allocated slots."""
    from labsupport.block_allocator import BlockAllocator

    blocks = sum(-(-n // block_size) for n in lengths) + 1
    alloc = BlockAllocator(blocks, block_size)
    for i, n in enumerate(lengths):
        alloc.allocate(i, n)
    slots = alloc.num_used_blocks * block_size
    return (slots - sum(lengths)) / slots


@function(
    "8.4", "block_size → §10.3's tail waste, on a length distribution",
    hint="Each sequence holds ceil(length / block_size) whole blocks; only its last block can be partly empty. "
         "Over the whole set of sequences, the waste fraction is the unfilled slots divided by all the slots "
         "the blocks hold. Lengths that are exact multiples of the block size waste nothing.",
)
def _tail_waste(fn):
    rng = random.Random(8)
    sets = [[640] * 10, [1, 17, 33], [16, 32, 48], [rng.randint(1, 5000) for _ in range(300)],
            [int(rng.lognormvariate(math.log(800), 1.9)) + 1 for _ in range(300)]]
    for lengths in sets:
        for bs in (1, 8, 16, 64, 256):
            want = _allocator_waste(lengths, bs)
            shown = lengths if len(lengths) <= 10 else f"<{len(lengths)} lengths>"
            expect_close(call(fn, list(lengths), bs), want, f"tail_waste_fraction({shown}, block_size={bs})",
                         rel_tol=1e-9, abs_tol=1e-12)


# --- 8.5: a workload whose utilization goes ~15% -> 99% while throughput barely moves ---------

def _measure(requests, block_size: int) -> tuple[float, float]:
    """(time-averaged share of reserved KV slots holding tokens, output tokens/s), read off the real
    engine on the lecture's H100 pool (cost-model clock)."""
    from labsupport.viz.slo import utilization_run

    try:
        run = utilization_run(requests, block_size)
    except ValueError as exc:
        raise Mismatch(f"your workload does not run: {exc}") from None
    return run.utilization, run.throughput_tok_s


@function(
    "8.5", "Discussion seed 4: utilization 15% → 99%, throughput unmoved",
    hint="Utilization is the share of reserved KV that holds tokens; throughput is tokens per second. Paging "
         "raises the first by reserving only what a sequence uses. It raises the second only if the naive "
         "engine was turning requests away for lack of slots. So: keep every sequence far shorter than S_max "
         "(a reserve-to-max slot is then mostly empty), and make sure the naive engine never needs more than "
         "its 29 slots at once — think about the arrival rate.",
)
def _utilization_workload(fn):
    workload = call(fn)
    try:
        requests = [(float(a), int(p), int(o)) for a, p, o in workload]
    except (TypeError, ValueError):
        raise Mismatch("utilization_workload() must return a list of (arrival_s, prompt_tokens, output_tokens) "
                       "tuples.") from None
    if not 100 <= len(requests) <= 1500:
        raise Mismatch(f"your workload has {len(requests)} requests; use between 100 and 1,500 so the "
                       "comparison means something and the grader stays quick.")
    for a, p, o in requests:
        if a < 0 or p < 1 or o < 1 or p + o > 4096:
            raise Mismatch(f"request (arrival {a}, prompt {p}, output {o}) is not allowed: arrivals >= 0, at "
                           "least one prompt and one output token, and prompt + output within S_max = 4,096.")
    if sum(p + o for _, p, o in requests) > 3_000_000:
        raise Mismatch("your workload holds more than 3 million tokens in all; a smaller one makes the point.")
    naive_util, naive_tput = _measure(requests, 4096)  # one block of S_max tokens per sequence: reserve-to-max
    paged_util, paged_tput = _measure(requests, 16)
    if naive_util > 0.20:
        raise Mismatch(f"under reserve-to-max your workload already uses {naive_util:.1%} of what it reserves; the "
                       "claim starts near 15%.")
    if paged_util < 0.95:
        raise Mismatch(f"paged utilization is only {paged_util:.1%}; the claim ends near 99%.")
    if abs(paged_tput / naive_tput - 1) > 0.05:
        raise Mismatch(f"throughput moved from {naive_tput:,.0f} to {paged_tput:,.0f} tok/s "
                       f"({paged_tput / naive_tput - 1:+.1%}); it should barely move (within 5%).")


choice(
    "8.6", "Which Part II topic attacks §2.16's 6.7× TPOT spike?",
    answer="disaggregation",
    options=("kernels", "batching", "disaggregation", "routing", "kv compression", "prefix cache",
             "quantization", "speculative decoding", "agent serving"),
    hint="The spike is one long prefill sharing a step with hundreds of decodes. Which lecture separates the "
         "two kinds of work so that neither waits for the other?",
    mistakes={"batching": "Iteration-level batching re-chooses the batch every step, but a prefill that joins a "
                          "step still stalls everyone in it; the fix is to stop mixing the two kinds of work.",
              "kernels": "A faster kernel shortens the prefill, but it still lands inside the decoders' step.",
              "prefix cache": "A prefix cache skips prefill for re-sent prefixes only; a fresh 4K prompt still "
                              "lands in the decode steps."},
)
