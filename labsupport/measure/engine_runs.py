"""Lab 06's runs of the real engine (§10.5): the loop streamed step by step, and a batch of requests run to the end.

`stream_engine` is a loop over `Engine.step`'s `StepOutput`s, kept as a log a figure can replay one step at a
time; `run_requests` runs the same requests on a fresh engine (any preemption mode) and checks nothing leaked.
`labsupport.viz.engine` draws them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence



@dataclass
class StepRecord:
    """What one iteration of the engine did, as seen from outside it."""

    step: int  # 1-based
    clock_s: float  # the engine's clock at the end of the step
    emitted: list[tuple[int, int, int | None, bool]]  # (request, branch, token, finished)
    blocks_in_use: int
    waiting: int
    running: int
    swapped: int
    preempted: dict[str, int]  # preemptions this step, by kind
    arrived: list[int]  # requests added just before this step


@dataclass
class StreamLog:
    """A whole run, step by step: the streaming view replays it."""

    steps: list[StepRecord]
    prompts: dict[int, list[int] | None]
    max_new: dict[int, int]
    n: dict[int, int]
    num_blocks: int
    block_size: int
    result: object = None  # the EngineResult at the end

    def sequences(self) -> list[tuple[int, int]]:
        return [(r, b) for r in sorted(self.n) for b in range(self.n[r])]

    def tokens(self, upto: int | None = None) -> dict[tuple[int, int], list[int | None]]:
        """Tokens each sequence has streamed by the end of step `upto` (all steps by default)."""
        out: dict[tuple[int, int], list[int | None]] = {s: [] for s in self.sequences()}
        for rec in self.steps[: len(self.steps) if upto is None else upto]:
            for rid, branch, tok, _ in rec.emitted:
                out[(rid, branch)].append(tok)
        return out

    def phases(self) -> dict[tuple[int, int], list[str]]:
        """Per sequence, its state in every step: not here, waiting, prefill, decode, preempted, done."""
        arrival = {rid: k for k, rec in enumerate(self.steps) for rid in rec.arrived}
        out = {}
        for seq in self.sequences():
            rid = seq[0]
            states, started, finished = [], False, False
            for k, rec in enumerate(self.steps):
                mine = [e for e in rec.emitted if (e[0], e[1]) == seq]
                if finished:
                    states.append("done")
                elif mine:
                    states.append("decode" if started else "prefill")
                    started = True
                    finished = mine[0][3]
                elif k < arrival.get(rid, 0):
                    states.append("not here")
                else:
                    states.append("preempted" if started else "waiting")
            out[seq] = states
        return out


def stream_engine(engine, schedule: Sequence[tuple[int, dict]], max_steps: int = 100_000,
                  on_step: Callable[[StepRecord], None] | None = None) -> StreamLog:
    """Run `engine` step by step; `schedule` holds (step index, add_request keyword arguments) pairs.

    A request scheduled at step k is added just before the k-th step (0-based), at the engine's
    clock, so it is waiting at that step boundary.  `on_step` sees each StepRecord as it happens
    (a live view can redraw there).  Returns the log, with the engine's result attached.
    """
    prompts, max_new, fan = {}, {}, {}

    def joined(rid: int, kw: dict) -> None:
        prompts[rid] = list(kw["prompt_ids"]) if kw.get("prompt_ids") is not None else None
        max_new[rid] = kw.get("max_new_tokens", 16)
        fan[rid] = kw.get("n", 1)

    steps: list[StepRecord] = []
    for out, arrived in engine.iterations(schedule, max_steps=max_steps, on_arrival=joined):
        if out.tokens is None:
            raise ValueError("stream_engine shows every token: give the Engine a model, or record_token_times=True")
        preempted = {"swap": 0, "recompute": 0}
        for _, _, kind in out.preempted:
            preempted[kind] += 1
        rec = StepRecord(
            step=len(steps) + 1, clock_s=out.end,
            emitted=[(e.request_id, e.branch, e.token, e.finished) for e in out.tokens],
            blocks_in_use=engine.allocator.num_used_blocks, waiting=engine.num_waiting,
            running=engine.num_running, swapped=engine.num_swapped, preempted=preempted, arrived=arrived)
        steps.append(rec)
        if on_step is not None:
            on_step(rec)
    res = engine.result()
    return StreamLog(steps, prompts, max_new, fan, engine.num_blocks, engine.block_size, res)


def run_requests(requests: Sequence[Mapping], *, num_blocks: int, model=None, cost_model=None, block_size: int = 16,
                 preemption: str = "auto", watermark: float = 0.0, max_num_seqs: int = 256):
    """A fresh engine, every request added (keyword arguments of `add_request`), run to the end."""
    from labsupport.engine import Engine

    eng = Engine(model, num_blocks, block_size, cost_model=cost_model, watermark=watermark, preemption=preemption,
                 max_num_seqs=max_num_seqs)
    for kw in requests:
        eng.add_request(**kw)
    res = eng.run()
    if res.counters.leaked_blocks:
        raise RuntimeError(f"{res.counters.leaked_blocks} blocks leaked after the run")
    return res


def job_run(cost_model, requests: Sequence[tuple[int, int, int]], *, num_blocks: int, block_size: int = 16,
            max_num_seqs: int = 256):
    """Lab 01's engine trace: a fresh engine on the cost-model clock, run step by step, kept as plain data.

    requests: (step, prompt_tokens, max_new_tokens) triples; each request is added just before that step
    (0-based), so the run is the same whatever the clock says.  Returns (trace, the EngineResult).  The
    trace holds the run's constants (num_params, kv_bytes_per_token, block_size, num_blocks), each request's
    lengths (a list: a request's id is its index), and one record per iteration of §10.5's loop: its start and end (s), the requests it admitted
    (their prefill ran in it), the tokens it streamed as [request, index] (index 0: the first output token;
    every token of a step is streamed at its end), the requests it finished, and the blocks held after it.
    """
    from labsupport.engine import Engine

    engine = Engine(cost_model=cost_model, num_blocks=num_blocks, block_size=block_size, watermark=0.0,
                    max_num_seqs=max_num_seqs, record_token_times=True)
    schedule = [(int(k), {"prompt_len": int(p), "max_new_tokens": int(m)}) for k, p, m in requests]
    lengths = {}  # by request id: the engine numbers requests in the order its loop adds them

    def joined(rid: int, kw: dict) -> None:
        lengths[rid] = {"prompt_tokens": kw["prompt_len"], "max_new_tokens": kw["max_new_tokens"]}

    steps = []
    for out, _ in engine.iterations(schedule, on_arrival=joined):
        if out.preempted:
            raise ValueError("job_run keeps runs without preemption: give the pool more blocks")
        steps.append({"start_s": out.start, "end_s": out.end, "admitted": list(out.admitted),
                      "tokens": [[e.request_id, e.index] for e in out.tokens], "finished": list(out.finished),
                      "blocks_in_use": engine.allocator.num_used_blocks})
    model = cost_model.model
    trace = {"num_params": int(model.num_params), "kv_bytes_per_token": int(model.kv_bytes_per_token),
             "block_size": block_size, "num_blocks": num_blocks, "requests": [lengths[r] for r in sorted(lengths)],
             "steps": steps}
    return trace, engine.result()
