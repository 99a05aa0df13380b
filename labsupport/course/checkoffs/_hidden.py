"""Models and cards the labs never show, for the function checkoffs' hidden cases: `grade` seeds them
from a secret per run, so constants tuned to the lecture's presets cannot pass (a notebook uses a public seed).
Also the KV and weight arithmetic several labs' graders share.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

from labsupport.specs import GB, GPUSpec, ModelSpec

_HEADS = (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)
_HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128, 160, 192, 256)
_MEMORIES_GB = (8, 12, 16, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 180, 192, 288)
RESERVE = 4 * GB  # the lecture's reserve for activations and workspace: 80 - 13.48 - 4 = 62.52 GB of KV on an H100


def random_model(rng: random.Random, *, max_params: float = 4e11) -> ModelSpec:
    """A transformer shape no preset has: any head count, GQA group, head dim, size and dtype."""
    heads = rng.choice(_HEADS)
    kv_heads = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
    params = float(round(10 ** rng.uniform(8.0, min(11.6, math.log10(max_params))), -4))
    return ModelSpec(f"hidden-model-{rng.randrange(10**6):06d}", num_layers=rng.randint(1, 96), num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=rng.choice(_HEAD_DIMS), num_params=params,
                     dtype_bytes=rng.choice((1, 2, 2, 4)))


def random_gpu(rng: random.Random) -> GPUSpec:
    """An accelerator with memory, bandwidth, peak and link drawn over a wide range."""
    return GPUSpec(f"hidden-gpu-{rng.randrange(10**6):06d}",
                   hbm_bytes=rng.choice(_MEMORIES_GB) * GB + rng.randrange(0, 10**6) * 1000,
                   hbm_bandwidth=float(round(10 ** rng.uniform(11.0, 13.0), -6)),
                   peak_flops=float(round(10 ** rng.uniform(13.0, 15.5), -9)),
                   link_bandwidth=rng.choice((8, 16, 25, 32, 50, 64, 128)) * GB)


def random_pair(rng: random.Random, *, fits: bool | None = None, max_params: float = 4e11) -> tuple[ModelSpec, GPUSpec]:
    """A model and a card; `fits=True` keeps the weights (plus a 4 GB reserve) inside the card's memory, `fits=False`
    does not.  Bounded: past 200 draws the last card's memory is set so that it does as asked."""
    for _ in range(200):
        model, gpu = random_model(rng, max_params=max_params), random_gpu(rng)
        room = gpu.hbm_bytes - model.weight_bytes - RESERVE
        if fits is None or (room > 0) == fits:
            return model, gpu
    need = math.floor(model.weight_bytes + RESERVE)  # the weights and the reserve: more fits, this much does not
    return model, replace(gpu, hbm_bytes=need + GB if fits else need)


# The graders' own KV and weight arithmetic (labs 01, 02, 03, 06, 07, 08), not read from ModelSpec or the ledger.
def givens_kv(g, kv_heads: int | None = None) -> int:
    """KV bytes per token on a lab's givens (LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES), or on `kv_heads` KV heads."""
    return 2 * g.LAYERS * (g.KV_HEADS if kv_heads is None else kv_heads) * g.HEAD_DIM * g.DTYPE_BYTES


def kv_per_token(m: ModelSpec) -> int:
    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes


def weight_bytes(m: ModelSpec) -> float:
    return m.num_params * m.dtype_bytes


def kv_blocks(model: ModelSpec, gpu: GPUSpec, block_size: int, reserve: float = RESERVE, util: float = 1.0) -> int:
    """Whole blocks (or slots) in what `util` of the card leaves after the weights and `reserve`; none if nothing."""
    kv_cache = util * gpu.hbm_bytes - weight_bytes(model) - reserve
    return max(0, math.floor(kv_cache / (block_size * kv_per_token(model))))


def tpot_batch(model: ModelSpec, gpu: GPUSpec, seq_tokens: int, slo: float) -> int:
    """The largest whole batch whose memory-bound step (every weight, each sequence's KV) meets the TPOT `slo`."""
    return max(0, math.floor((slo * gpu.hbm_bandwidth - weight_bytes(model)) / (seq_tokens * kv_per_token(model))))


def distinct_mistakes(want, found, *, rel: float = 0.0, floor: float = 0.0) -> list:
    """The (value, remark) slips of `found` that give a number other than `want` and than every slip kept before
    them, within `rel` of max(`floor`, |number|) (0: exactly): a remark on a slip that lands on the right answer, or
    on an earlier slip's number, would tell the student the wrong story.  A value of None is no slip here."""
    kept, seen = [], [want]
    for value, remark in found:
        if value is not None and all(abs(value - v) > rel * max(floor, abs(v)) for v in seen):
            kept.append((value, remark))
            seen.append(value)
    return kept
