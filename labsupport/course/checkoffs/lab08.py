"""Lab 08 checkoffs: §10.7 and the vLLM knobs — each knob mapped to a quantity of the labs.  8.7 is an open
question: its judge (labsupport.course.harness.lab08's "utilization_workload") runs the engine on the workload."""
from __future__ import annotations

import functools
import math
from dataclasses import replace

from labsupport.block_allocator import BlockAllocator
from labsupport.course.harness.lab08 import load_bar
from labsupport.course.checkoffs._hidden import RESERVE, kv_blocks, random_pair, tpot_batch, weight_bytes
from labsupport.course.registry import case, function, value
from labsupport import card, ledger
from labsupport.specs import GB, GPUS, LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, LLAMA3_70B

_BLOCKS = ("labsupport.ledger.num_blocks", "labsupport.ledger.kv_budget_bytes", "labsupport.measure.replay.lecture_pool",
           "labsupport.viz.slo.lecture_pool")


# §10.7's table as the lecture prints it: each row's "still broken after today", then "the quantity".
LECTURE_MAP = (
    ("The gather kernel paging created, and attention's 1 FLOP/byte", "achieved bandwidth on an indirect access"),
    ("The batch is re-chosen per request, wasting every batch's tail", "effective B over time"),
    ("One 129 ms prefill wrecks 199 decodes' cadence", "§2.16's 6.7× TPOT spike"),
    ("A cache hit on the wrong replica is a cache miss", "which card a request lands on"),
    ("512 KiB per token, paid in full for every position", "KV bytes per token"),
    ("Identical prefixes across requests are prefilled twice", "the 92% re-send of Lecture 5"),
    ("13.5 GB of weights re-read every step, b = 2", "bytes per weight and per cached value"),
    ("One forward pass yields one token", "tokens per pass over the weights"),
    ("The engine sees finished strings, not the agent's structure", "the dependence between requests"),
)
QUANTITIES = tuple(sorted(q for _, q in LECTURE_MAP))  # what the lab offers, in no telling order
# The order lab 08 shows the nine measured values in (lecture rows, from 0): not the lecture's, so that 8.1 is a
# reading of what each number measures, not a copy of §10.7's table.  The lab source keeps the same tuple.
VALUES_ORDER = (4, 0, 6, 2, 8, 1, 5, 3, 7)

value(
    "8.1", "§10.7: the quantity each of the nine measured values is",
    expected=lambda: [LECTURE_MAP[i][1] for i in VALUES_ORDER], judge_name="matching", options=QUANTITIES,
    noun="row",
    fixed="a reading of nine measured values against §10.7's nine quantities: no given to vary",
    hint="Each row names something paging left broken; its quantity is the number you would measure to see "
         "it get better. Ask what each failure costs, and in which unit: bytes, a bandwidth, a batch, a "
         "latency ratio, a share of tokens, a count per pass, or which machine.",
)


_BLOCK_CASES = [(LECTURE_7B, "h100", 1.0, 16), (LECTURE_7B, "h100", 0.9, 16), (LECTURE_7B, "h100", 0.9, 32),
                (LECTURE_7B_GQA8, "h100", 0.9, 16), (LLAMA3_8B, "a100-40gb", 0.92, 16), (LLAMA3_8B, "l4", 0.9, 16),
                (LLAMA3_70B, "h200", 0.95, 16), (LLAMA3_70B, "h100", 0.9, 16), (LECTURE_7B, "t4", 0.9, 16)]


@function(
    "8.3", "gpu_memory_utilization → the KV pool",
    hint="vLLM lets the engine use gpu_memory_utilization × the card's memory in all. Out of that come the "
         "weights (num_params × dtype_bytes) and the activations (activation_bytes); what is left is the KV "
         "cache, cut into blocks of block_size tokens at the model's KV bytes per token. Whole blocks only, "
         "and none at all when the weights and activations already take everything.",
    forbid=_BLOCKS,
    derive="take the weights and activations from gpu_memory_utilization × HBM and count whole blocks yourself",
    name="num_gpu_blocks",
)
def _num_gpu_blocks(rng):
    cases = [(model, GPUS[name], util, bs, None) for model, name, util, bs in _BLOCK_CASES]
    cases.append((LECTURE_7B, GPUS["h100"], 0.9, 16, 1 * GB))
    cases += [(*random_pair(rng), rng.choice((0.5, 0.8, 0.9, 0.95, 1.0)), rng.choice((1, 8, 16, 32)),
               rng.choice((None, rng.randint(0, 8) * GB))) for _ in range(5)]
    for model, gpu, util, bs, activation_bytes in cases:
        want = kv_blocks(model, gpu, bs, RESERVE if activation_bytes is None else activation_bytes, util)
        # the activation reserve is an argument, not a constant
        kwargs = {} if activation_bytes is None else {"activation_bytes": activation_bytes}
        tail = "" if activation_bytes is None else f", activation_bytes={activation_bytes:,.0f}"
        yield case(model, gpu, util, bs, kwargs=kwargs, want=want, whole=True, at_least=0,
                   what=f"num_gpu_blocks({model.name}, {gpu.name}, gpu_memory_utilization={util}, "
                        f"block_size={bs}{tail})")


@function(
    "8.4", "max_num_seqs → the B of §10.6",
    hint="max_num_seqs caps the decode batch. Set it to the largest B the card can actually serve within the "
         "TPOT SLO: it must fit the block pool (8.3's blocks ÷ the blocks one sequence of seq_tokens needs) and "
         "its memory-bound step must clear the SLO (lab 07's TPOT(B) solved for B). The smaller of the two "
         "binds.",
    forbid=(*_BLOCKS, "labsupport.ledger.paged_concurrency", "labsupport.ledger.max_batch_for_tpot",
            "labsupport.slo.memory_ceiling", "labsupport.viz.slo.memory_ceiling"),
    derive="take the smaller of the pool's ceiling (8.3's blocks) and lab 07's TPOT(B) = SLO solved for a whole B",
    name="max_num_seqs_for",
)
def _max_num_seqs(rng):
    cases = [(model, GPUS[name], util, seq, slo, bs) for model, name, util, seq, slo, bs in (
        (LECTURE_7B, "h100", 0.9, 640, 0.020, 16), (LECTURE_7B, "h100", 0.9, 640, 0.030, 16),
        (LECTURE_7B, "h100", 1.0, 640, 0.020, 16), (LECTURE_7B_GQA8, "h100", 0.9, 2048, 0.025, 16),
        (LLAMA3_8B, "a100-80gb", 0.9, 1200, 0.030, 32), (LECTURE_7B, "h100", 0.9, 640, 0.003, 16))]
    for _ in range(5):
        model, gpu = random_pair(rng, fits=True)
        weights_s = weight_bytes(model) / gpu.hbm_bandwidth
        cases.append((model, gpu, rng.choice((0.8, 0.9, 1.0)), rng.randint(16, 20_000),
                      round(weights_s * rng.uniform(0.8, 6.0), 6), rng.choice((8, 16, 32))))
    for model, gpu, util, seq, slo, bs in cases:
        memory = kv_blocks(model, gpu, bs, util=util) // math.ceil(seq / bs)
        want = min(memory, tpot_batch(model, gpu, seq, slo))
        yield case(model, gpu, util, seq, slo, bs, want=want, whole=True, at_least=0,
                   what=f"max_num_seqs_for({model.name}, {gpu.name}, gpu_memory_utilization={util}, "
                        f"seq_tokens={seq}, tpot_slo_s={slo}, block_size={bs})")


@function(
    "8.5", "max_num_batched_tokens → the tokens one step may carry",
    hint="Every token a step processes — a decode token or a prompt token of a prefill — costs about 2 × N "
         "FLOP for the weights. At mfu × peak FLOP/s, how many tokens fit in one TPOT SLO? A step that carries "
         "more is compute-bound past the SLO however small its batch. Neglect the attention FLOPs and round "
         "down to whole tokens.",
    forbid=("labsupport.ledger.prefill_flops", "labsupport.ledger.recompute_s", "labsupport.ledger.exercise5"),
    derive="divide what mfu × peak FLOP/s does in one SLO by the 2 × N FLOP a token costs, and round down",
    name="max_num_batched_tokens_for",
)
def _max_batched_tokens(rng):
    cases = [(model, GPUS[name], slo, mfu) for model, name, slo, mfu in (
        (LECTURE_7B, "h100", 0.020, 0.5), (LECTURE_7B, "h100", 0.050, 0.5), (LECTURE_7B, "h100", 0.020, 0.4),
        (LLAMA3_8B, "a100-80gb", 0.030, 0.5), (LLAMA3_70B, "h200", 0.060, 0.5), (LECTURE_7B_GQA8, "l4", 0.1, 0.6))]
    cases += [(*random_pair(rng), round(rng.uniform(0.002, 0.2), 5), rng.choice((0.3, 0.5, 0.7, 1.0)))
              for _ in range(5)]
    for model, gpu, slo, mfu in cases:
        rate = slo * mfu * gpu.peak_flops
        want = math.floor(rate / (2 * model.num_params))
        slips = [(math.floor(rate / model.num_params), "That counts one FLOP per parameter per token; a multiply "
                  "and an add are two."),
                 (math.floor(slo * gpu.peak_flops / (2 * model.num_params)), "That runs the step at the card's "
                  "peak; it achieves only mfu of it."),
                 (math.ceil(rate / (2 * model.num_params)), "That rounds up: one token more than fits makes the "
                  "step late. Round down."),
                 (math.floor(rate / (2 * model.num_params * model.dtype_bytes)), "That divides by the weights' "
                  "bytes; a step carrying many tokens is bound by their FLOPs, not by reading the weights.")]
        yield case(model, gpu, slo, mfu, want=want, whole=True, at_least=0,
                   mistakes=[(wrong, remark) for wrong, remark in slips if wrong != want],
                   what=f"max_num_batched_tokens_for({model.name}, {gpu.name}, tpot_slo_s={slo}, mfu={mfu})")


def _allocator_waste(lengths, block_size) -> float:
    """The real allocator's waste on `lengths`.  Every block before a sequence's last is full, so the allocator is
    asked only about the last one: each sequence's tokens past its whole blocks (a whole block where it has
    none past them), which keeps planning cheap on 300 long-tailed lengths at block size 1."""
    whole = [max(0, n - 1) // block_size for n in lengths]  # the full blocks before each last one
    alloc = BlockAllocator(len(lengths) + 1, block_size)
    for i, (n, k) in enumerate(zip(lengths, whole)):
        alloc.allocate(i, n - k * block_size)
    slots = (sum(whole) + alloc.num_used_blocks) * block_size
    return (slots - sum(lengths)) / slots


@function(
    "8.6", "block_size → §10.3's tail waste, on a length distribution",
    hint="Each sequence holds ceil(length / block_size) whole blocks; only its last block can be partly empty. "
         "Over the whole set of sequences, the waste fraction is the unfilled slots divided by all the slots "
         "the blocks hold. Lengths that are exact multiples of the block size waste nothing.",
    forbid=("labsupport.ledger.tail_waste_tokens", "labsupport.ledger.blocks_for",
            "labsupport.block_allocator.BlockAllocator", "labsupport.measure.block_size.measure_block_size",
            "labsupport.viz.memory.measure_block_size"),
    derive="count each length's whole blocks, and divide the unfilled slots by all the slots",
    name="tail_waste_fraction",
)
def _tail_waste(rng):
    sets = [[640] * 10, [1, 17, 33], [16, 32, 48], [rng.randint(1, 5000) for _ in range(300)],
            [int(rng.lognormvariate(math.log(800), 1.9)) + 1 for _ in range(300)],
            [rng.randint(1, 200) for _ in range(rng.randint(1, 40))]]
    for lengths in sets:
        for bs in (1, 8, 16, 64, 256, rng.choice((2, 3, 12, 100))):
            shown = lengths if len(lengths) <= 10 else f"<{len(lengths)} lengths>"
            yield case(list(lengths), bs, want=_allocator_waste(lengths, bs), rel_tol=1e-9, abs_tol=1e-12,
                       what=f"tail_waste_fraction({shown}, block_size={bs})")


# Seed 4 runs on the card's model (replay.utilization_run): its reserve-to-max slots at S_max = 4,096, the lecture's 29
# on the lecture's card, and the load bar the judge sets (more than two thirds of them at the naive engine's busiest).
_SLOTS = ledger.naive_concurrency(ledger.kv_budget_bytes(card.model(), card.gpu()), 4096,
                                  card.model().kv_bytes_per_token)
_BUSY = load_bar(_SLOTS)[1]  # the judge's own bar (the engine's max_num_seqs binds above 256 slots)


@function(
    "8.7", "Discussion seed 4: utilization 15% → 99%, throughput unmoved, decode-heavy",
    hint="Utilization is the share of reserved KV that holds tokens; throughput is tokens per second. Paging "
         "raises the first by reserving only what a sequence uses. It raises the second only if the naive "
         "engine was turning requests away for lack of slots. So: keep every sequence far shorter than S_max "
         "(a reserve-to-max slot is then mostly empty, near 15% full), and load the card until the naive engine "
         f"runs at least {_BUSY} of its {_SLOTS} slots at its busiest — an idle card proves nothing — "
         "without turning requests away for lack of slots. How many sequences run at once is the arrival rate times "
         "how long each one lives on the card, and a decode-heavy request lives as many steps as it has output "
         "tokens: scale the sweep's measured rate by that.",
    name="utilization_workload",
)
def _utilization_workload(rng):
    yield case(judge="utilization_workload", what="utilization_workload()")


# --- 8.8 and 8.2: place a row by changing its quantity and reading which output moves ----------------------------

# The three rows whose quantity is a field of the model or the card (the others need a trace or a new engine).
ATTACKED = ("KV bytes per token", "bytes per weight and per cached value", "achieved bandwidth on an indirect access")


def _attacked(model, gpu, quantity: str, factor: int):
    """By hand: GQA shares each KV head among `factor` times more query heads; quantization stores every weight and
    cached value in 1/factor the bytes; a better gather kernel achieves `factor` times the bandwidth."""
    if quantity == ATTACKED[0]:
        return replace(model, num_kv_heads=model.num_kv_heads // factor), gpu
    if quantity == ATTACKED[1]:
        return replace(model, dtype_bytes=model.dtype_bytes // factor), gpu
    return model, replace(gpu, hbm_bandwidth=gpu.hbm_bandwidth * factor)


def _fields(pair) -> list:
    """A (model, gpu) pair as the harness hands it back: each spec's fields under its type's name."""
    return [{type(spec).__name__: dict(vars(spec))} for spec in pair]


@function(
    "8.8", "Change the quantity a Part II row attacks",
    hint="Each of the three quantities is one field of the model or of the card. KV bytes per token shrink when "
         "more query heads share each KV head (the query heads and the weights stay); bytes per weight and per "
         "cached value are the bytes every number is stored in; achieved bandwidth is what the card's HBM "
         "delivers. Make it `factor` times better and leave every other field, names included, as it was.",
    derive="build the changed ModelSpec or GPUSpec yourself (dataclasses.replace keeps the other fields)",
    name="attacked",
)
def _attacked_cases(rng):
    pairs = [(LECTURE_7B, GPUS["h100"]), (LLAMA3_8B, GPUS["a100-80gb"]), (LLAMA3_70B, GPUS["h200"])]
    for _ in range(3):
        model, gpu = random_pair(rng)
        pairs.append((replace(model, num_kv_heads=model.num_heads, dtype_bytes=rng.choice((2, 4))), gpu))
    for model, gpu in pairs:
        for quantity in ATTACKED:
            for factor in (2, 4) if model.num_kv_heads % 4 == 0 and model.dtype_bytes % 4 == 0 else (2,):
                if quantity == ATTACKED[0] and model.num_kv_heads % factor:
                    continue
                slips = [((model, gpu), "That is the machine as it was: the quantity did not change.")]
                if quantity == ATTACKED[0]:
                    slips.append(((replace(model, num_heads=model.num_heads // factor,
                                           num_kv_heads=model.num_kv_heads // factor), gpu),
                                  "GQA keeps every query head: only the KV heads are shared."))
                if quantity == ATTACKED[2]:
                    slips.append(((model, replace(gpu, hbm_bandwidth=gpu.hbm_bandwidth / factor)),
                                  "Better means more bytes per second, not fewer."))
                yield case(harness="spec_fields", data={"args": [model, gpu, quantity, factor]},
                           want=_fields(_attacked(model, gpu, quantity, factor)), rel_tol=1e-9,
                           mistakes=[(_fields(pair), remark) for pair, remark in slips],
                           what=f"attacked({model.name}, {gpu.name}, {quantity!r}, {factor})")


@functools.lru_cache(maxsize=1)
def _measured_moves() -> tuple:
    return tuple(_largest_moves_uncached().items())


def _largest_moves() -> dict:
    return dict(_measured_moves())


def _largest_moves_uncached() -> dict:
    """Measured here: which of part_two.outputs' four moves by the largest factor when each quantity doubles, on
    the course card's MHA model and GPU, as lab 08's section 1b measures it (MHA, GPU)."""
    from labsupport.measure.part_two import outputs

    c = card.card()
    base = outputs(c.mha, c.gpu)
    out = {}
    for quantity in ATTACKED:
        after = outputs(*_attacked(c.mha, c.gpu, quantity, 2))
        out[quantity.lower()] = max(base, key=lambda k: max(after[k] / base[k], base[k] / after[k]))
    return out


OUTPUT_NAMES = ("memory batch", "TPOT", "longest gap", "prefill")
_ON_CARD = ("the lecture's 7B and H100" if card.card().is_lecture
            else f"the course card's {card.card().mha.name} and {card.card().gpu.name}")
value(
    "8.2", "Which output each change moves the most",
    expected=_largest_moves, judge_name="matching", options=OUTPUT_NAMES, noun="change",
    remarks={k.lower(): why for k, why in {
        f"{ATTACKED[1]}=TPOT": "TPOT does halve; the pool gains twice the tokens per byte and also the bytes the "
                               "smaller weights gave back.",
        f"{ATTACKED[0]}=TPOT": "The weights are still read whole every step; the KV is only part of the bytes.",
        f"{ATTACKED[2]}=memory batch": "Bandwidth is bytes per second: the card holds the same bytes.",
        **{f"{q}=longest gap": "The longest gap is a step that carries a 4,096-token prefill: it is arithmetic, "
                               "and none of these three changes the FLOP." for q in ATTACKED},
        **{f"{q}=prefill": "A lone prefill is arithmetic: 2 FLOP per weight per token, at the card's peak."
           for q in ATTACKED}}.items()},
    fixed=f"measured on {_ON_CARD} (section 1b): each quantity doubled once; no given to vary",
    hint="For each change, compare its four outputs with section 1b's baseline, as factors (whichever way they move), "
         "and take the largest. Then ask why: is that output set by bytes held, bytes read per step, or FLOP?",
)
