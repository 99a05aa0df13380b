"""The cost-model clock: one engine step's time from the roofline (§10.5, §10.6; Lecture 2 §2.15–§2.16).

A step reads every weight once plus the KV of every decoding sequence, and does the FLOPs of its
prefills and decodes.  By default compute and memory traffic overlap perfectly, so the step takes
whichever of the two is longer at the GPU's bandwidth and at ``mfu`` of its peak; with
``overlap=False`` it takes their sum, Lecture 2 §2.16's additive model (the one behind the lecture's
6.7x spike).  Bytes moved over the host link for swaps are added on top (the step waits for them),
plus ``block_transfer_s`` for every separate block copy when that is set (the vLLM paper's §7.3:
swapping is slow at small block sizes, because each block of each layer's K and V is its own copy).  With the lecture's 7B on an H100 a decode-only step of B sequences of S tokens takes
(13.48e9 + B * S * 524,288) / 3.35e12 s, the ledger's ``tpot_s``; a lone 4,096-token prefill
takes the ledger's ``recompute_s`` (129 ms).  The preemption choice is the ledger's break-even.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from labsupport import ledger
from labsupport.checks import as_count, as_flag, as_fraction, as_real
from labsupport import card
from labsupport.specs import LECTURE_MFU, GPUSpec, ModelSpec, get_gpu, get_model


@dataclass(frozen=True)
class StepTime:
    """Where one step's time goes (seconds)."""

    memory_s: float  # weights + KV bytes over HBM bandwidth
    compute_s: float  # prefill + decode FLOPs at mfu x peak
    swap_s: float  # bytes over the host link
    overhead_s: float

    overlap: bool = True

    @property
    def total_s(self) -> float:
        busy = max(self.memory_s, self.compute_s) if self.overlap else self.memory_s + self.compute_s
        return busy + self.swap_s + self.overhead_s


@dataclass(frozen=True)
class CostModel:
    """Prices engine steps for a ModelSpec on a GPUSpec.

    link_bandwidth overrides the GPU's host link (the §10.5 knob); step_overhead_s is a fixed
    per-step scheduler/launch cost (0 by default, so the clock matches the ledger exactly).
    overlap: compute and memory traffic overlap (max) or add up (§2.16's model).  block_transfer_s:
    the fixed cost of one block copy over the link; a swapped block of b tokens is 2 * L copies.
    """

    model: ModelSpec | None = None  # None: the course card's (course.toml)
    gpu: GPUSpec | None = None
    mfu: float = LECTURE_MFU
    link_bandwidth: float | None = None
    step_overhead_s: float = 0.0
    overlap: bool = True
    block_transfer_s: float = 0.0

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)
        if self.model is None:
            set_("model", card.model())
        if self.gpu is None:
            set_("gpu", card.gpu())
        if not isinstance(self.model, ModelSpec) or not isinstance(self.gpu, GPUSpec):
            raise ValueError(f"CostModel needs a ModelSpec and a GPUSpec, got {type(self.model).__name__} and "
                             f"{type(self.gpu).__name__}")
        set_("mfu", as_fraction("mfu", self.mfu, include_zero=False, include_one=True))
        if self.link_bandwidth is not None:
            set_("link_bandwidth", as_real("link_bandwidth", self.link_bandwidth, above=0))
        set_("step_overhead_s", as_real("step_overhead_s", self.step_overhead_s, minimum=0))
        set_("overlap", as_flag("overlap", self.overlap))
        set_("block_transfer_s", as_real("block_transfer_s", self.block_transfer_s, minimum=0))
        # constants of the hot path (step_s runs once per engine step, hundreds of thousands of times);
        # each must be a finite time, or a step's price would be inf or NaN in the middle of a run
        m, g = self.model, self.gpu
        flop_rate = g.peak_flops * self.mfu
        constants = {
            "_weight_s": ("the weights' read time (weights / HBM bandwidth)", m.weight_bytes, g.hbm_bandwidth),
            "_kv_s_per_token": ("one token's KV read time", m.kv_bytes_per_token, g.hbm_bandwidth),
            "_decode_flop_s": ("one decode token's compute time", 2 * m.num_params, flop_rate),
            "_attn_flop_s": ("the attention time per key", 4 * m.num_layers * m.num_heads * m.head_dim, flop_rate),
            "_link_s_per_byte": ("a byte's time over the host link", 1.0, self.link),
            "_block_swap_s": ("one swapped block's copy overheads", 2 * m.num_layers * self.block_transfer_s, 1.0),
        }
        for name, (what, numerator, rate) in constants.items():
            seconds = numerator / rate if rate > 0 else math.inf
            if not math.isfinite(seconds):
                raise ValueError(f"CostModel: {what} is {numerator:g} / {rate:g} = {seconds!r} s for "
                                 f"{m.name} on {g.name} at mfu={self.mfu:g}: the rates are too small to price a step")
            set_(name, seconds)

    @classmethod
    def from_names(cls, model: str, gpu: str, **kw) -> "CostModel":
        return cls(get_model(model), get_gpu(gpu), **kw)

    @property
    def link(self) -> float:
        return self.gpu.link_bandwidth if self.link_bandwidth is None else self.link_bandwidth

    @property
    def flop_rate(self) -> float:
        return self.gpu.peak_flops * self.mfu

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    @property
    def attn_flops_per_key(self) -> int:
        """FLOPs one query token spends per key it attends to: QK^T and PV, 2 * 2 * L * H * d."""
        m = self.model
        return 4 * m.num_layers * m.num_heads * m.head_dim

    def step(self, decode_seqs: int = 0, decode_context_tokens: int = 0, prefill_lens=(),
             swap_bytes: float = 0.0, swap_blocks: int = 0) -> StepTime:
        """Price one step, term by term.

        decode_seqs: sequences decoding one token; decode_context_tokens: the sum over them of the
        tokens each attends to (its length including the new token); prefill_lens: the length of
        each prefill in the step (the ledger's prefill FLOPs each); swap_bytes: bytes over the link;
        swap_blocks: the blocks those bytes were in (each one 2 * L copies of block_transfer_s).
        """
        decode_seqs = as_count("decode_seqs", decode_seqs, 0)
        decode_context_tokens = as_count("decode_context_tokens", decode_context_tokens, 0)
        prefill = sum(self.prefill_flops(as_count("prefill length", s, 0)) for s in prefill_lens)
        swap_bytes = as_real("swap_bytes", swap_bytes, minimum=0)
        swap_blocks = as_count("swap_blocks", swap_blocks, 0)
        return StepTime(*self._terms(decode_seqs, decode_context_tokens, prefill, swap_bytes, swap_blocks),
                        overlap=self.overlap)

    def step_s(self, decode_seqs: int, decode_context_tokens: int, prefill_flops: float, swap_bytes: float,
               swap_blocks: int = 0) -> float:
        """:meth:`step`'s total for the engine's hot path (prefill FLOPs already summed)."""
        memory, compute, swap, overhead = self._terms(decode_seqs, decode_context_tokens, prefill_flops, swap_bytes,
                                                      swap_blocks)
        if self.overlap:
            return (memory if memory > compute else compute) + swap + overhead
        return memory + compute + swap + overhead

    def _terms(self, decode_seqs, decode_context_tokens, prefill_flops, swap_bytes, swap_blocks=0):
        # an idle step (only a swap) reads no weights; the divisions are precomputed in __post_init__
        busy = decode_seqs or prefill_flops
        memory = (self._weight_s if busy else 0.0) + decode_context_tokens * self._kv_s_per_token
        compute = (prefill_flops / self.flop_rate + decode_seqs * self._decode_flop_s
                   + decode_context_tokens * self._attn_flop_s)
        overhead = self.step_overhead_s if busy or swap_bytes else 0.0
        swap = swap_bytes * self._link_s_per_byte + swap_blocks * self._block_swap_s
        return memory, compute, swap, overhead

    def prefill_flops(self, tokens: int) -> float:
        return ledger.prefill_flops(self.model, tokens)

    def swap_round_trip_s(self, tokens: int, block_size: int | None = None) -> float:
        """Out and back in; with block_transfer_s set, the block size decides how many copies that is."""
        transfers = ledger.swap_transfers(self.model, tokens, block_size) if self.block_transfer_s else 0
        return ledger.swap_round_trip_s(tokens * self.model.kv_bytes_per_token, self.link, transfers,
                                        self.block_transfer_s)

    def recompute_s(self, tokens: int) -> float:
        return ledger.recompute_s(self.model, tokens, self.gpu.peak_flops, self.mfu)

    def preempt_choice(self, tokens: int, block_size: int | None = None) -> str:
        """§10.5's per-sequence break-even: 'swap' when 2 * KV / link < prefill FLOPs / (mfu * peak)
        (plus the per-copy overhead of its blocks, when block_transfer_s is set)."""
        return ledger.preempt_choice(self.model, tokens, self.link, self.gpu.peak_flops, self.mfu,
                                     block_size, self.block_transfer_s)

    def crossover_tokens(self, block_size: int | None = None) -> float:
        return ledger.crossover_tokens(self.model, self.link, self.gpu.peak_flops, self.mfu, block_size,
                                       self.block_transfer_s)
