"""Lab 07's harness: §10.6's SLO ledger (Exercise 5), beside checkoffs/lab07.py.

Checkoffs 7.3, 7.4 and 7.7 take small runs of the real engine as their input: `engine_run_requests` (7.3),
`engine_requests` (7.4) and `engine_run_steps` (7.7) build them, their requests drawn by `request_draws`.  The
grader names them in its cases' recipes (`live(...)`), which check() rebuilds here; `grade` runs them on the staff
side and sends the sandbox only their records.  No harness or judge of its own: the runs are the input.
"""
from __future__ import annotations

import random


def request_draws(seed: int, rate: float, n_req: int, branches: bool = True) -> list[tuple[float, int, int, int]]:
    """`n_req` random requests at `rate` per second, the same anywhere for a seed: (arrival_s, prompt_len,
    max_new_tokens, n), arrivals a Poisson process from t = 0, prompts of 16 to 3,000 tokens, 1, 2, 40 or 200 new
    tokens, and n (the branches sampled) 1, 2 or 3, mostly 1.  Without `branches` every n is 1 and none is drawn,
    so the draws before it are those of a run without branches (7.4's)."""
    rng, t, draws = random.Random(seed), 0.0, []
    for _ in range(n_req):
        t += rng.expovariate(rate)
        prompt_len, max_new_tokens = rng.randint(16, 3000), rng.choice([1, 2, 40, 200])
        draws.append((t, prompt_len, max_new_tokens, rng.choice([1, 1, 1, 2, 3]) if branches else 1))
    return draws


def engine_requests(seed: int, rate: float, blocks: int, n_req: int) -> list:
    """7.4's input: the RequestResults of a small run of the real engine (cost-model clock), the same anywhere:
    `n_req` random requests at `rate` per second (one branch each), then one that never fits, on `blocks` blocks
    of 16."""
    from labsupport.measure.replay import replay

    requests = [(t, prompt_len, new) for t, prompt_len, new, _ in request_draws(seed, rate, n_req, branches=False)]
    requests.append((requests[-1][0] if requests else 0.0, 200_000, 10))  # never fits: rejected
    return list(replay(requests, num_blocks=blocks, record_token_times=True).result.requests.values())


def engine_run(seed: int, rate: float, blocks: int, n_req: int) -> tuple[list, list]:
    """A small run of the real engine (cost-model clock, the lecture's 7B on its H100, `blocks` blocks of 16) whose
    first arrival, at t = 0, never fits and is refused, so it never finishes; then `n_req` random requests at `rate`
    per second, some ending after one token (no TPOT), some sampling two or three branches.  Returns every step's
    `StepOutput` and every request's `RequestResult`."""
    from labsupport.costmodel import CostModel
    from labsupport.engine import Engine

    engine = Engine(cost_model=CostModel(), num_blocks=blocks, block_size=16, record_token_times=True)
    engine.add_request(prompt_len=200_000, max_new_tokens=10, arrival_time=0.0)  # never fits: refused
    for t, prompt_len, max_new_tokens, n in request_draws(seed, rate, n_req):
        engine.add_request(prompt_len=prompt_len, max_new_tokens=max_new_tokens, n=n, arrival_time=t)
    steps = [out for out, _ in engine.iterations(idle=True)]
    return steps, list(engine.result().requests.values())


def engine_run_requests(seed: int, rate: float, blocks: int, n_req: int) -> list:
    """7.3's input: the RequestResults of `engine_run`."""
    return engine_run(seed, rate, blocks, n_req)[1]


def engine_run_steps(seed: int, rate: float, blocks: int, n_req: int) -> list:
    """7.7's input: the StepOutputs of `engine_run`, the engine's log of its iterations."""
    return engine_run(seed, rate, blocks, n_req)[0]
