"""The engine loop of §10.5: admit, allocate, batch, run, stream — with a watermark and preemption.

§10.1's five jobs and §10.5's loop, built for real.  `Engine.step` is one iteration (iteration-level
scheduling, Orca), and each of its phases is one method, in the lecture's order:

1. `_take_arrivals`: arrivals join the waiting queue (the wait for the step boundary is their
   *scheduling delay*);
2. `_reserve_next_slots`: every running sequence reserves the slot of its next token, oldest
   first; when the pool runs dry the **victim is the running sequence of the latest-arriving
   request** (ties: the highest branch), the one first-come-first-served ranks last — vLLM's
   policy.  `_preempt` swaps it to host memory or drops it to be recomputed
   (``preemption="swap" | "recompute" | "auto"``; ``auto`` asks the ledger's §10.5 break-even for
   that sequence's length: 2 x KV bytes / link against prefill FLOPs at mfu x peak; or a policy of
   your own, a function of the victim's cached tokens that returns "swap" or "recompute");
3. `_swap_in`: if nobody was preempted this step, swapped-out sequences come back first;
4. `_admit`: if nothing is swapped out, waiting requests are admitted first come first served while
   the free blocks stay at or above the **watermark** (new arrivals only; a preempted sequence is
   taken back as soon as its blocks fit), up to ``max_num_seqs`` sequences and a per-step token
   budget ``max_num_batched_tokens`` (a prefill longer than the budget runs alone in its step);
5. `_forward`: one forward pass — prefills of the admitted, one decode token for everyone else;
6. `_stream` and `_retire`: tokens stream out; finished sequences leave at the end of this step
   and their blocks serve the next one.

Phases 2–4 only count: they promise blocks against the free pool (`_Step.free`), and the forward
pass takes them, so a step is decided before anything is allocated.  (The lecture lists admission
last, "into the freed space"; admitting before the pass, into the space the previous step freed,
is the same cycle cut at another point.)

A request that can never fit (its longest sequence needs more blocks than the pool has, or its
prompt plus the watermark does) is rejected with a reason; the others continue.

``n > 1`` prefills the prompt once and forks it: the branches share the prompt's blocks and
copy-on-write the partly filled last one on their first token (§10.4).

Tokens never depend on batching or preemption (`labsupport.sampling`): a swapped or recomputed
sequence continues with exactly the tokens it would have produced (§10.5: preemption loses the
cache, never tokens).

Two clocks.  With a ``model`` and no ``cost_model`` the clock advances by each step's measured
wall time (the tiny model really runs).  With a :class:`~labsupport.costmodel.CostModel` each
step is priced by the roofline for any ModelSpec/GPUSpec, so the same scheduler replays a real
trace at H100 scale on a laptop; without a model it needs no tensors at all (token ids are not
produced, only counted, by `_count_tokens`, the replay's fast path).  Both can be combined: real
tokens, cost-model time.  §10.6's ledger of a run is `labsupport.slo`.
"""
from __future__ import annotations

import bisect
import heapq
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from labsupport.block_allocator import BlockAllocator
from labsupport.checks import as_count, as_flag, as_fraction, as_real, shown
from labsupport.costmodel import CostModel
from labsupport.sampling import GREEDY, SamplingParams, sample_token
from labsupport.slo import SLOReport, slo_report

PREEMPTION_MODES = ("auto", "swap", "recompute")


# --- requests, sequences, results -----------------------------------------------------------------

class _Seq:
    """One branch of a request: what the scheduler moves between running, swapped and waiting."""

    __slots__ = ("seq_id", "req", "branch", "tokens", "num_out", "max_new", "num_cached", "shared_tail",
                 "first_t", "last_t", "times", "done", "key")

    def __init__(self, seq_id: int, req: "_Request", branch: int):
        self.seq_id = seq_id
        self.req = req
        self.branch = branch
        self.tokens = None if req.prompt is None else list(req.prompt)  # prompt + outputs (real tokens)
        self.num_out = 0
        self.max_new = req.max_new
        self.num_cached = 0  # tokens whose K/V are in the pool (prompt + outputs - 1 while running)
        self.shared_tail = False  # forked, last block maybe still shared: the next append may copy it
        self.first_t = None
        self.last_t = None
        self.times = None
        self.done = False
        self.key = (req.arrival, req.order, branch)  # first-come-first-served priority


class _Request:
    __slots__ = ("request_id", "order", "prompt", "prompt_len", "max_new", "n", "sampling", "seed", "arrival",
                 "seqs", "status", "reason", "t_sched", "t_admit", "t_first", "t_finish", "preemptions",
                 "remaining")

    def __init__(self, request_id, order, prompt, prompt_len, max_new, n, sampling, arrival):
        self.request_id = request_id
        self.order = order
        self.prompt = prompt
        self.prompt_len = prompt_len
        self.max_new = max_new
        self.n = n
        self.sampling = sampling
        self.seed = request_id if sampling.seed is None else sampling.seed
        self.arrival = arrival
        self.seqs: list[_Seq] = []
        self.status = "pending"
        self.reason = ""
        self.t_sched = self.t_admit = self.t_first = self.t_finish = None
        self.preemptions = 0
        self.remaining = n


@dataclass
class RequestResult:
    """One request's outputs and timeline (seconds on the engine's clock).

    TTFT = scheduling delay (arrival -> the next step boundary) + queueing (-> the step that
    admitted it) + prefill (that step's duration) (§10.6).  tpot_s is the worst branch's mean
    time per output token after the first; token_times (when recorded) has every token's time.
    """

    request_id: int
    status: str  # "finished" or "rejected"
    reason: str
    prompt_len: int
    max_new_tokens: int
    n: int
    arrival_time: float
    outputs: list[list[int]]  # per branch; empty lists when the engine ran without a model
    num_output_tokens: list[int]
    scheduled_time: float | None = None
    admitted_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[list[float]] | None = None
    preemptions: int = 0
    tpot_s: float | None = None

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def scheduling_delay_s(self) -> float | None:
        return None if self.scheduled_time is None else self.scheduled_time - self.arrival_time

    @property
    def queueing_s(self) -> float | None:
        return None if self.admitted_time is None else self.admitted_time - self.scheduled_time

    @property
    def prefill_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.admitted_time

    @property
    def total_output_tokens(self) -> int:
        return sum(self.num_output_tokens)

    def per_token_tpot(self) -> list[list[float]]:
        """Gaps between consecutive tokens of each branch (needs record_token_times)."""
        if self.token_times is None:
            raise ValueError("token times were not recorded: Engine(record_token_times=True)")
        return [[b - a for a, b in zip(t, t[1:])] for t in self.token_times]


@dataclass
class TokenEvent:
    """What the streaming callback receives for every token as its step ends."""

    request_id: int
    branch: int
    index: int  # 0 for the first output token
    token: int | None  # None when the engine runs without a model
    time: float
    finished: bool


@dataclass(slots=True)
class StepOutput:
    """What one iteration of §10.5's loop did: `Engine.step` returns it, and None once nothing is left.

    Streaming is a loop over it (`labsupport.measure.engine_runs.stream_engine`).  An idle step (nobody to run,
    the clock jumps to the next arrival) admits, preempts and emits nothing.
    """

    start: float
    end: float
    admitted: list[int]  # requests prefilled for the first time
    recomputed: list[tuple[int, int]]  # (request, branch) prefilled again after a recompute preemption
    swapped_in: list[tuple[int, int]]  # (request, branch) brought back from host memory
    preempted: list[tuple[int, int, str]]  # (request, branch, "swap" or "recompute")
    finished: list[int]  # requests whose last branch finished
    num_tokens: int  # tokens emitted: one per prefilled branch, one per decoding sequence
    # every token in emission order; None on the cost-model replay's fast path (no model, no
    # on_token, record_token_times=False), which only counts them
    tokens: list[TokenEvent] | None

    @property
    def idle(self) -> bool:
        return self.num_tokens == 0 and not self.preempted

    @classmethod
    def of(cls, plan: "_Step", end: float, finished: list[int], tokens: list | None) -> "StepOutput":
        admitted, recomputed, num_tokens = [], [], len(plan.decode)
        for seq, children in plan.prefills:
            num_tokens += 1 + len(children)
            if seq.num_out == 1:  # its first token came from this prefill
                admitted.append(seq.req.request_id)
            else:
                recomputed.append((seq.req.request_id, seq.branch))
        return cls(plan.start, end, admitted, recomputed, plan.swapped_in, plan.preempted, finished, num_tokens,
                   tokens)


@dataclass
class Counters:
    steps: int = 0
    busy_s: float = 0.0  # clock time spent in steps (the rest is idle, waiting for arrivals)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: dict = field(default_factory=lambda: {"swap": 0, "recompute": 0})
    swapped_out_bytes: int = 0
    swapped_in_bytes: int = 0
    recomputed_tokens: int = 0
    peak_blocks: int = 0
    peak_running: int = 0
    rejected: int = 0
    leaked_blocks: int = 0
    block_times: array = field(default_factory=lambda: array("d"))  # step end times
    blocks_in_use: array = field(default_factory=lambda: array("l"))  # used blocks after each step

    @property
    def total_preemptions(self) -> int:
        return sum(self.preemptions.values())


@dataclass
class EngineResult:
    requests: dict[int, RequestResult]
    counters: Counters
    clock_s: float
    clock: str  # "cost-model" or "real"
    num_blocks: int
    block_size: int

    def outputs(self) -> dict[int, list[list[int]]]:
        return {rid: r.outputs for rid, r in self.requests.items()}

    def slo(self, ttft_slo_s: float, tpot_slo_s: float) -> "SLOReport":
        return slo_report(self, ttft_slo_s, tpot_slo_s)


class _Step:
    """What one iteration has decided so far, phase by phase (`Engine.step`)."""

    __slots__ = ("start", "free", "decode", "prefills", "copies", "swap_bytes", "swap_blocks", "prefill_flops",
                 "preempted", "swapped_in")

    def __init__(self, start: float, free: int):
        self.start = start
        self.free = free  # blocks of the pool not yet promised to anyone in this step
        self.decode: list[_Seq] = []  # sequences decoding one token, in the order they reserved
        self.prefills: list[tuple[_Seq, list[_Seq]]] = []  # (sequence to prefill, branches forked from it)
        self.copies: dict[int, int] = {}  # shared last block -> branches promised a copy of it
        self.swap_bytes = 0  # bytes over the host link, both ways
        self.swap_blocks = 0  # the blocks those bytes were in (the cost model may charge each copy)
        self.prefill_flops = 0.0
        self.preempted: list[tuple[int, int, str]] = []  # (request, branch, kind)
        self.swapped_in: list[tuple[int, int]] = []


# --- the engine ------------------------------------------------------------------------------------

class Engine:
    """A paged-KV serving engine: ``add_request`` then ``step()`` or ``run()``.

    model: a :class:`labsupport.model.TinyTransformer` (real tokens through a PagedKVCache), or None.
    cost_model: a :class:`CostModel` for the cost-model clock (required without a model).
    num_blocks / block_size: the KV pool.  watermark: the fraction of blocks new admissions must
    leave free.  preemption: "auto", "swap", "recompute", or a function num_tokens -> "swap" | "recompute"
    (a policy of your own, asked per victim).  on_token: streaming callback.
    ``auto`` prices the break-even with ``cost_model``, or, without one, with the model's own
    shape on the lecture's H100.
    """

    def __init__(self, model=None, num_blocks: int | None = None, block_size: int = 16, *,
                 cost_model: CostModel | None = None, watermark: float = 0.01, preemption: str = "auto",
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None, attention: str = "auto",
                 on_token: Callable[[TokenEvent], None] | None = None, record_token_times: bool = True):
        if isinstance(model, CostModel) and cost_model is None:
            model, cost_model = None, model
        if model is None and cost_model is None:
            raise ValueError("Engine needs a model (real tokens), a cost_model (cost-model clock), or both")
        if cost_model is not None and not isinstance(cost_model, CostModel):
            raise ValueError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
        if model is not None and not (hasattr(model, "forward_paged") and hasattr(model, "cfg")):
            raise ValueError(f"model must be a labsupport.model.TinyTransformer, got {type(model).__name__}")
        if num_blocks is None:
            raise ValueError("num_blocks is required")
        num_blocks = as_count("num_blocks", num_blocks, 1)
        block_size = as_count("block_size", block_size, 1)
        max_num_seqs = as_count("max_num_seqs", max_num_seqs, 1)
        if max_num_batched_tokens is not None:
            max_num_batched_tokens = as_count("max_num_batched_tokens", max_num_batched_tokens, 1)
        watermark = as_fraction("watermark", watermark)
        if not callable(preemption) and (not isinstance(preemption, str) or preemption not in PREEMPTION_MODES):
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES} or a function of the victim's cached "
                             f"tokens, got {shown(preemption)}")
        if not isinstance(attention, str) or attention not in ("auto", "triton", "reference"):
            raise ValueError(f"attention must be 'auto', 'triton' or 'reference', got {shown(attention)}")
        if on_token is not None and not callable(on_token):
            raise ValueError(f"on_token must be a function of one TokenEvent, got {shown(on_token)}")
        as_flag("record_token_times", record_token_times)
        self.model = model
        self.cost_model = cost_model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_blocks)
        self.preemption = preemption
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.attention = attention
        self.on_token = on_token
        self.record_token_times = record_token_times
        self.clock_kind = "cost-model" if cost_model is not None else "real"
        if model is not None:
            from labsupport.kvcache import PagedKVCache
            from labsupport.model import resolve_attention

            resolve_attention(attention, model.device)  # fail early on a bad name
            c = model.cfg
            self.cache = PagedKVCache(num_blocks, block_size, c.num_layers, c.num_kv_heads, c.head_dim,
                                      dtype=model.dtype, device=model.device)
            self.allocator = self.cache.allocator
        else:
            self.cache = None
            self.allocator = BlockAllocator(num_blocks, block_size)
        self._kv = self.cache if self.cache is not None else self.allocator  # what frees and swaps the KV
        # what preemption prices, and what a swapped block weighs: the cost model's spec, or the
        # model's real shape and dtype (on the lecture GPU)
        self._pricing = cost_model or CostModel(model.spec())
        self.kv_bytes_per_token = self._pricing.model.kv_bytes_per_token
        self.clock = 0.0
        self.counters = Counters()
        self._requests: dict[int, _Request] = {}
        self._pending: list = []  # heap of (arrival, order, request)
        self._waiting: deque = deque()  # _Request (new) or _Seq (preempted, to recompute)
        self._swapped: list[_Seq] = []  # sorted by priority
        self._running: list[_Seq] = []  # sorted by priority
        self._next_request = 0
        self._next_seq = 0
        self._unfinished = 0

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int] | None = None, max_new_tokens: int = 16, *, n: int = 1,
                    sampling: SamplingParams | None = None, arrival_time: float | None = None,
                    prompt_len: int | None = None) -> int:
        """Queue a request; returns its id.  Without a model pass ``prompt_len`` instead of ids.

        A request that can never fit is not an exception: it is recorded as rejected, with the
        reason, at its arrival, and the rest of the run is unaffected.
        """
        sampling = GREEDY if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        if prompt_ids is not None:
            if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__iter__"):
                raise ValueError(f"prompt_ids must be a sequence of integer token ids, got {shown(prompt_ids)}")
            prompt = [as_count("prompt token id", t, 0) for t in prompt_ids]
            if prompt_len is not None and as_count("prompt_len", prompt_len) != len(prompt):
                raise ValueError(f"prompt_len={prompt_len} disagrees with {len(prompt)} prompt ids")
            if self.model is not None:
                vocab = self.model.cfg.vocab_size
                bad = [t for t in prompt if not 0 <= t < vocab]
                if bad:
                    raise ValueError(f"prompt token id {bad[0]} is outside the model's vocabulary [0, {vocab})")
            plen = len(prompt)
        else:
            if self.model is not None:
                raise ValueError("this engine runs a model: pass prompt_ids (token ids), not just a length")
            prompt = None
            plen = prompt_len
        if plen is None:
            raise ValueError("pass prompt_ids (token ids) or prompt_len (a length)")
        if as_count("prompt_len", plen) < 1:
            raise ValueError(f"the prompt must have at least one token, got length {plen}")
        max_new_tokens = as_count("max_new_tokens", max_new_tokens, 1)
        n = as_count("n", n, 1)
        arrival = self.clock if arrival_time is None else as_real("arrival_time", arrival_time, minimum=0)
        rid = self._next_request
        self._next_request += 1
        req = _Request(rid, rid, prompt, plen, max_new_tokens, n, sampling, arrival)
        self._requests[rid] = req
        reason = self._never_fits(req)
        if reason:
            req.status = "rejected"
            req.reason = reason
            req.t_finish = arrival
            self.counters.rejected += 1
            return rid
        heapq.heappush(self._pending, (arrival, req.order, req))
        self._unfinished += 1
        return rid

    def _never_fits(self, req: _Request) -> str:
        bs, nb = self.block_size, self.num_blocks
        # a branch holds prompt + max_new - 1 tokens at most (the last token is never cached)
        longest = req.prompt_len + req.max_new - 1
        need = -(-longest // bs)
        if need > nb:
            return (f"request needs {need:,} blocks ({req.prompt_len:,} prompt + {req.max_new:,} output tokens "
                    f"at block size {bs}) but the whole pool has {nb:,}")
        prompt_blocks = -(-req.prompt_len // bs)
        if prompt_blocks + self.watermark_blocks > nb:
            return (f"prompt needs {prompt_blocks:,} blocks and admission keeps a watermark of "
                    f"{self.watermark_blocks:,} free, more than the pool's {nb:,}")
        if req.n > self.max_num_seqs:
            return f"n={req.n} branches exceed max_num_seqs={self.max_num_seqs}"
        if self.model is not None and longest > self.model.cfg.max_seq_len:
            return (f"{req.prompt_len:,} prompt + {req.max_new:,} output tokens exceed the model's "
                    f"max_seq_len={self.model.cfg.max_seq_len:,}")
        return ""

    # -- state ------------------------------------------------------------------------------------
    @property
    def has_unfinished(self) -> bool:
        return self._unfinished > 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_swapped(self) -> int:
        return len(self._swapped)

    # -- one iteration: §10.5's loop --------------------------------------------------------------
    def step(self) -> StepOutput | None:
        """One iteration of §10.5's loop: what it did, or None when there is nothing left to do.

        Pick the batch and reserve the blocks it grows into (preempting when the pool runs dry),
        bring swapped-out sequences back, admit new arrivals behind the watermark, run one forward
        pass, stream the emitted tokens, and retire whoever finished.
        """
        start = self.clock
        wall0 = time.perf_counter()
        self._take_arrivals(start)
        if not (self._running or self._waiting or self._swapped):
            if not self._pending:
                return None
            self.clock = self._pending[0][0]  # idle: jump to the next arrival
            return StepOutput(start, self.clock, [], [], [], [], [], 0, [])

        plan = _Step(start, self.allocator.num_free_blocks)
        self._reserve_next_slots(plan)
        if not plan.preempted:
            self._swap_in(plan)  # swapped-out sequences come back before anyone new is admitted
            if not self._swapped:
                self._admit(plan)
        if not plan.decode and not plan.prefills:
            raise RuntimeError(self._stall_message())

        emitted = self._forward(plan)
        dt = self._step_seconds(plan, wall0)
        end = self.clock = start + dt
        finished, tokens = self._stream(plan, emitted, end)
        batch = len(self._running)
        done = self._retire(finished, end)
        self._record(plan, dt, batch)
        return StepOutput.of(plan, end, done, tokens)

    def _take_arrivals(self, now: float) -> None:
        """Requests whose arrival time has come join the waiting queue at this step boundary (the
        wait for the boundary is their scheduling delay, §10.6)."""
        pending, waiting = self._pending, self._waiting
        while pending and pending[0][0] <= now:
            req = heapq.heappop(pending)[2]
            req.status = "waiting"
            req.t_sched = now
            waiting.append(req)

    def _reserve_next_slots(self, plan: "_Step") -> None:
        """Every running sequence, oldest first, reserves the slot of its next token.

        A full last block means one fresh block; a forked branch whose partly filled last block is
        still shared needs a copy of it (copy-on-write), except the block's last holder, which
        writes in place.  When the pool runs dry the victim is the running sequence that
        first-come-first-served ranks last (the latest arrival: vLLM's policy), until the sequence
        at hand fits or was itself the victim.
        """
        running, decode, copies, bs = self._running, plan.decode, plan.copies, self.block_size
        i = 0
        while i < len(running):
            seq = running[i]
            partly_filled = seq.num_cached % bs
            cow = seq.shared_tail and partly_filled
            need = self._cow_need(seq, copies) if cow else 0 if partly_filled else 1
            while need > plan.free:
                victim = self._preempt(plan)
                if victim is seq:
                    break
                if cow:  # the victim may have held the shared tail: then there is less to copy
                    need = self._cow_need(seq, copies)
            else:
                plan.free -= need
                if cow and need:  # this branch copies the tail away: one holder fewer shares it
                    last = self.allocator.block_tables[seq.seq_id][-1]
                    copies[last] = copies.get(last, 0) + 1
                decode.append(seq)
                i += 1

    def _cow_need(self, seq: _Seq, copies: dict[int, int]) -> int:
        """1 when the next append of a forked branch must copy its partly filled last block (someone
        else still holds it), 0 for its last holder.  `copies` counts branches already promised a
        copy of that block this step."""
        last = self.allocator.block_tables[seq.seq_id][-1]
        return 1 if self.allocator.ref_count(last) - copies.get(last, 0) > 1 else 0

    def preempt_kind(self, num_tokens: int) -> str:
        """'swap' or 'recompute' for a sequence of num_tokens: the mode, §10.5's break-even when auto, or
        what the policy function says."""
        if callable(self.preemption):
            kind = self.preemption(num_tokens)
            if kind not in ("swap", "recompute"):
                raise ValueError(f"the preemption policy returned {shown(kind)} for a {num_tokens}-token sequence; "
                                 "it must return 'swap' or 'recompute'")
            return kind
        if self.preemption != "auto":
            return self.preemption
        return self._pricing.preempt_choice(max(1, num_tokens), self.block_size)

    def _preempt(self, plan: "_Step") -> _Seq:
        """Evict the last running sequence (first-come-first-served's last): swap its KV to host memory,
        or drop it to be recomputed; returns it.

        It loses its cache, never its tokens.  The blocks it releases go back to this step's pool.  What
        can fail (pricing the choice, copying the KV out) happens before it leaves the running list, so
        a failure leaves it running, in exactly one queue."""
        seq = self._running[-1]
        kind = self.preempt_kind(seq.num_cached)
        free_before = self.allocator.num_free_blocks
        if kind == "swap":
            held = len(self.allocator.block_tables[seq.seq_id])
            nbytes = held * self.block_size * self.kv_bytes_per_token
            self._kv.swap_out(seq.seq_id)
            self._running.pop()
            bisect.insort(self._swapped, seq, key=_priority)
            plan.swap_bytes += nbytes
            plan.swap_blocks += held
            self.counters.swapped_out_bytes += nbytes
        else:
            self._kv.free(seq.seq_id)
            self._running.pop()
            seq.num_cached = 0
            self._waiting.appendleft(seq)
        seq.shared_tail = False
        self.counters.preemptions[kind] += 1
        seq.req.preemptions += 1
        plan.free += self.allocator.num_free_blocks - free_before
        plan.preempted.append((seq.req.request_id, seq.branch, kind))
        return seq

    def _swap_in(self, plan: "_Step") -> None:
        """Swapped-out sequences come back, oldest first, while their blocks and the slot of this
        step's token fit (into possibly different blocks); they decode in this step."""
        swapped, running, bs = self._swapped, self._running, self.block_size
        while swapped and len(running) < self.max_num_seqs:
            seq = swapped[0]
            held = -(-seq.num_cached // bs)
            need = -(-(seq.num_cached + 1) // bs)
            if need > plan.free:
                break
            self._kv.swap_in(seq.seq_id)  # before it leaves the swapped list: a failure keeps it there
            swapped.pop(0)
            nbytes = held * bs * self.kv_bytes_per_token
            plan.swap_bytes += nbytes
            plan.swap_blocks += held
            self.counters.swapped_in_bytes += nbytes
            plan.free -= need
            bisect.insort(running, seq, key=_priority)
            plan.decode.append(seq)
            plan.swapped_in.append((seq.req.request_id, seq.branch))

    def _admit(self, plan: "_Step") -> None:
        """Admit waiting requests first come first served while the free blocks stay at or above the
        watermark, up to max_num_seqs sequences and max_num_batched_tokens of prefill (a longer
        prompt runs alone).  A preempted sequence is taken back as soon as its blocks fit."""
        waiting, running, bs = self._waiting, self._running, self.block_size
        budget_left = None if self.max_num_batched_tokens is None else self.max_num_batched_tokens - len(plan.decode)
        while waiting:
            item = waiting[0]
            if isinstance(item, _Request):
                tokens, nseq, floor = item.prompt_len, item.n, self.watermark_blocks
            else:  # preempted to be recomputed: its prompt and every token it has emitted
                tokens, nseq, floor = item.req.prompt_len + item.num_out, 1, 0
            need = -(-tokens // bs)
            if plan.free - need < floor or len(running) + nseq > self.max_num_seqs:
                break
            if budget_left is not None and tokens > budget_left and plan.prefills:
                break
            flops = self._pricing.prefill_flops(tokens)  # priced before the item leaves the waiting queue
            waiting.popleft()
            plan.free -= need
            if budget_left is not None:
                budget_left -= tokens
            plan.prefills.append(self._start(item, plan.start))
            plan.prefill_flops += flops

    def _start(self, item, now: float) -> tuple[_Seq, list[_Seq]]:
        """Put an admitted request's branches (or a preempted sequence) into the running batch;
        returns the sequence to prefill and the branches that will fork from it."""
        if isinstance(item, _Request):
            item.status = "running"
            item.t_admit = now
            seqs = item.seqs = [self._new_seq(item, b) for b in range(item.n)]
            for s in seqs:
                bisect.insort(self._running, s, key=_priority)
            return seqs[0], seqs[1:]
        self.counters.recomputed_tokens += item.req.prompt_len + item.num_out - 1
        bisect.insort(self._running, item, key=_priority)
        return item, []

    def _new_seq(self, req: _Request, branch: int) -> _Seq:
        seq = _Seq(self._next_seq, req, branch)
        self._next_seq += 1
        return seq

    def _stall_message(self) -> str:
        return (f"engine stalled with {len(self._running)} running, {len(self._waiting)} waiting, "
                f"{len(self._swapped)} swapped and {self.allocator.num_free_blocks} free blocks "
                f"(a request that can never fit was not rejected)")

    def _forward(self, plan: "_Step") -> list[tuple[_Seq, int]] | None:
        """One forward pass: prefill the admitted, decode one token for everyone else.

        With a model the paged cache takes each reserved slot as it writes it, and every sequence
        samples its next token: returns (sequence, token) in emission order.  Without a model the
        allocator alone stands in for the pass, and nothing is sampled (None)."""
        if self.model is None:
            self._allocate_only(plan)
            return None
        return self._run_model(plan)

    def _allocate_only(self, plan: "_Step") -> None:
        alloc = self.allocator
        for seq in plan.decode:
            alloc.append_slot(seq.seq_id)
            seq.num_cached += 1
            seq.shared_tail = False
        for seq, children in plan.prefills:
            tokens = seq.req.prompt_len + seq.num_out
            alloc.allocate(seq.seq_id, tokens)
            seq.num_cached = tokens
            for child in children:
                alloc.fork(seq.seq_id, child.seq_id)
                child.num_cached = tokens
                child.shared_tail = seq.shared_tail = True

    def _run_model(self, plan: "_Step") -> list[tuple[_Seq, int]]:
        logits = self.model.forward_paged(
            self.cache,
            prefills=[(seq.seq_id, seq.tokens) for seq, _ in plan.prefills],
            decodes=[(seq.seq_id, seq.tokens[-1]) for seq in plan.decode],
            attention=self.attention)
        emitted, row = [], 0
        for seq, children in plan.prefills:
            seq.num_cached = len(seq.tokens)
            for s in (seq, *children):
                emitted.append((s, sample_token(logits[row], s.req.sampling, s.req.seed, s.branch, s.num_out)))
            for child in children:
                self.cache.fork(seq.seq_id, child.seq_id)
                child.num_cached = seq.num_cached
                child.shared_tail = seq.shared_tail = True
            row += 1
        for seq in plan.decode:
            seq.num_cached += 1
            seq.shared_tail = False
            emitted.append((seq, sample_token(logits[row], seq.req.sampling, seq.req.seed, seq.branch, seq.num_out)))
            row += 1
        return emitted

    def _step_seconds(self, plan: "_Step", wall0: float) -> float:
        """The step's duration: the cost model's price for what it did, or the wall time it took."""
        if self.cost_model is None:
            return time.perf_counter() - wall0
        context = sum(seq.num_cached for seq in plan.decode)  # tokens the decode batch attends to
        return self.cost_model.step_s(len(plan.decode), context, plan.prefill_flops, plan.swap_bytes, plan.swap_blocks)

    def _stream(self, plan: "_Step", emitted, end: float) -> tuple[list[_Seq], list[TokenEvent] | None]:
        """Each sequence of the step appends the token it emitted and streams it to `on_token`; returns
        those that finished (max_new_tokens reached, or a stop token) and the step's tokens."""
        if emitted is None and self.on_token is None and not self.record_token_times:
            return self._count_tokens(plan, end), None
        tokens = []
        if emitted is None:  # no model: the tokens are counted, not known
            emitted = [(s, None) for seq, children in plan.prefills for s in (seq, *children)]
            emitted += [(seq, None) for seq in plan.decode]
        on_token, record = self.on_token, self.record_token_times
        finished = []
        for seq, tok in emitted:
            n = seq.num_out = seq.num_out + 1
            if tok is not None:
                seq.tokens.append(tok)
            if seq.first_t is None:
                seq.first_t = end
                if record:
                    seq.times = [end]
                if seq.req.t_first is None:
                    seq.req.t_first = end
            elif record:
                seq.times.append(end)
            done = n >= seq.max_new or (tok is not None and tok in seq.req.sampling.stop_token_ids)
            event = TokenEvent(seq.req.request_id, seq.branch, n - 1, tok, end, done)
            tokens.append(event)
            if on_token is not None:
                on_token(event)
            if done:
                finished.append(seq)
        return finished, tokens

    def _count_tokens(self, plan: "_Step", end: float) -> list[_Seq]:
        """`_stream`'s fast path for the cost-model replay: no token ids, no callback, no per-token
        times, so only counts and first-token times are kept."""
        finished = []
        for seq in plan.decode:
            n = seq.num_out = seq.num_out + 1
            if n >= seq.max_new:
                finished.append(seq)
        for seq, children in plan.prefills:
            for s in (seq, *children):
                s.num_out += 1
                if s.first_t is None:  # a recomputed sequence had its first token long ago
                    s.first_t = end
                if s.num_out >= s.max_new:
                    finished.append(s)
            if seq.req.t_first is None:
                seq.req.t_first = end
        return finished

    def _retire(self, finished: list[_Seq], end: float) -> list[int]:
        """Finished sequences leave at the end of the step that finished them; their blocks serve
        the next step's arrivals.  Returns the requests this finished."""
        done = []
        for seq in finished:
            seq.done = True
            seq.last_t = end
            self._kv.free(seq.seq_id)
            req = seq.req
            req.remaining -= 1
            if req.remaining == 0:
                req.status = "finished"
                req.t_finish = end
                self._unfinished -= 1
                done.append(req.request_id)
        if finished:
            self._running = [s for s in self._running if not s.done]
        return done

    def _record(self, plan: "_Step", dt: float, batch: int) -> None:
        c = self.counters
        c.steps += 1
        c.busy_s += dt
        c.decode_tokens += len(plan.decode)
        for seq, _ in plan.prefills:
            c.prefill_tokens += seq.num_cached
        used = self.allocator.num_used_blocks
        c.block_times.append(self.clock)
        c.blocks_in_use.append(used)
        if used > c.peak_blocks:
            c.peak_blocks = used
        if batch > c.peak_running:
            c.peak_running = batch

    # -- the whole run --------------------------------------------------------------------------------
    def iterations(self, schedule=(), max_steps: int | None = None, idle: bool = False, on_arrival=None):
        """§10.5's loop as an iterator: every caller that walks a run step by step walks this one loop.

        Yields `(StepOutput, arrived)` for each iteration, `arrived` being the ids of the requests added just
        before it.  `schedule` holds `(k, add_request keyword arguments)` pairs: each request joins just before
        iteration k (0-based), so such a run is the same whatever the clock says.  An idle step (the clock jumps
        to the next arrival) is yielded only with `idle=True`, and is not counted as an iteration.  Stops when
        nothing is left to do or after `max_steps` iterations.  `on_arrival(request_id, kwargs)` sees each
        scheduled request as it is added, even one refused at once after which nothing more runs (no iteration
        follows to carry it).
        """
        if max_steps is not None:
            max_steps = as_count("max_steps", max_steps, 1)
        pending = sorted(((int(k), i, kw) for i, (k, kw) in enumerate(schedule)), key=lambda x: x[:2])
        k, arrived = 0, []
        while max_steps is None or k < max_steps:
            while pending and pending[0][0] <= k:
                kwargs = pending.pop(0)[2]
                arrived.append(self.add_request(**kwargs))
                if on_arrival is not None:
                    on_arrival(arrived[-1], kwargs)
            out = self.step()
            if out is None:
                if not pending:
                    return
                k = pending[0][0]  # nothing runs until the next scheduled arrival
                continue
            if out.idle and not idle:
                continue  # its arrivals (a request refused at once, say) go with the next iteration yielded
            yield out, arrived
            arrived = []
            if not out.idle:
                k += 1

    def run(self, max_steps: int | None = None, progress: bool = False) -> EngineResult:
        """Step until every request has finished or been rejected (or `max_steps` iterations); then check nothing
        leaked."""
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self._unfinished, desc="requests", unit="req")
        last = self._unfinished
        for _ in self.iterations(max_steps=max_steps):
            if bar is not None and self._unfinished != last:
                bar.update(last - self._unfinished)
                last = self._unfinished
        if bar is not None:
            bar.close()
        if not self.has_unfinished:
            self.allocator.check_invariants()
            self.counters.leaked_blocks = self.allocator.num_used_blocks
        return self.result()

    def result(self) -> EngineResult:
        out = {}
        for rid, req in self._requests.items():
            seqs = req.seqs
            tpot = None
            for s in seqs:
                if s.num_out > 1:
                    t = (s.last_t - s.first_t) / (s.num_out - 1)
                    tpot = t if tpot is None else max(tpot, t)
            out[rid] = RequestResult(
                request_id=rid, status=req.status, reason=req.reason, prompt_len=req.prompt_len,
                max_new_tokens=req.max_new, n=req.n, arrival_time=req.arrival,
                outputs=[s.tokens[req.prompt_len:] if s.tokens is not None else [] for s in seqs],
                num_output_tokens=[s.num_out for s in seqs], scheduled_time=req.t_sched,
                admitted_time=req.t_admit, first_token_time=req.t_first, finish_time=req.t_finish,
                token_times=[list(s.times or ()) for s in seqs] if self.record_token_times else None,
                preemptions=req.preemptions, tpot_s=tpot)
        return EngineResult(out, self.counters, self.clock, self.clock_kind, self.num_blocks, self.block_size)


def _priority(seq: _Seq):
    return seq.key
