"""The harness: a handed-in function run on a checkoff's cases, in the process the function lives in (every lab).

A function checkoff's case is plain data (labsupport.course.data): the call's arguments, objects as
their recipes, never the expected result.  `observe` builds the arguments, calls the function and
writes down what it saw, as plain data again:

    {"result": ...}                    what it returned (and, when the case asks, {"after": {i: ...}}:
                                       argument i as the call left it)
    {"raised": [type, message]}        it raised
    {"unfinished": prompt}             it still raises the student copy's NotImplementedError
    {"timeout": seconds}               it ran past the case's time

In a notebook `check()` observes the lab's own cases; while grading, the sandbox's runner observes
the hidden ones; either way the observations are judged outside the function's reach
(labsupport.course.judge).  A case whose function must be driven step by step (a lockstep run against
the real allocator, a Triton kernel compiled with the student's line) names a harness of `HARNESSES`
instead; its comparison, when no generic rule fits, is a judge of `judge.JUDGES`.
"""
from __future__ import annotations

import contextlib
import signal
import threading

from labsupport.course import data
from labsupport.course.judge import JUDGES, Mismatch, echo

CASE_SECONDS = 60  # one call of a student's function, at most (a hang fails its case, not the notebook)
HARNESSES: dict = {}
LAST_ERROR: BaseException | None = None  # the last exception a student's function raised (check() shows its frames)


class TimeLimit(BaseException):
    """The case ran past its time (a BaseException: `except Exception` in the student's code lets it through)."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeLimit

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def observe(fn, case: dict, seconds: float | None = CASE_SECONDS) -> dict:
    """What `fn` does on one case (plain data, see the module's docstring)."""
    try:
        with time_limit(seconds):
            if "harness" in case:
                return HARNESSES[case["harness"]](fn, case.get("data"))
            args, kwargs = data.build(case.get("args", [])), data.build(case.get("kwargs", {}))
            result = fn(*args, **kwargs)
            seen = {"result": data.plain(result)}
            if case.get("after"):
                seen["after"] = {str(i): data.plain(args[i]) for i in case["after"]}
            return seen
    except TimeLimit:
        return {"timeout": seconds}
    except NotImplementedError as exc:
        return {"unfinished": str(exc)[:500]}
    except data.DataError as exc:
        return {"raised": ["an answer too large", str(exc)]}
    except Exception as exc:  # noqa: BLE001 - the student's bug, reported as the call that met it
        global LAST_ERROR
        LAST_ERROR = exc
        return {"raised": [type(exc).__name__, _last_line(exc)]}


def _last_line(exc: BaseException) -> str:
    try:
        text = str(exc).strip()
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        return ""
    return (text.splitlines() or [""])[-1][:300]


def harness(name: str):
    def register(fn):
        HARNESSES[name] = fn
        return fn
    return register


def judge(name: str):
    def register(fn):
        JUDGES[name] = fn
        return fn
    return register


# --- 3.2: append, in lockstep with the real allocator ---------------------------------------------------------

def append_steps(block_size: int, seed: int, steps: int = 300):
    """The random traffic 3.2's append is driven through: yields (the allocator before the step, the sequence).

    The real BlockAllocator decides every state; the caller appends to it after asking the student."""
    import random

    from labsupport.block_allocator import BlockAllocator

    rng, alloc, made = random.Random(seed), BlockAllocator(80, block_size), 0
    for step in range(steps):
        live = list(alloc.block_tables)
        if rng.random() < 0.15 or not live:
            n = rng.randint(0, 2 * block_size + 3)
            if alloc.can_allocate(alloc.blocks_needed(n)):
                alloc.allocate(f"s{made}", n)
                made += 1
            continue
        seq = rng.choice(live)
        if alloc.seq_lens[seq] % block_size == 0 and not alloc.num_free_blocks:
            alloc.free(seq)
            continue
        yield alloc, seq


@harness("append")
def _append(fn, case) -> dict:
    """Per step: the table and length the function was given, how often it took a block, the table it left
    and the slot it returned.  The real allocator appends after the function has answered: when the
    function takes a block the real append hands it the block it takes, else it runs once the call returns."""
    steps = []
    for alloc, seq in append_steps(case["block_size"], case["seed"]):
        before, n = list(alloc.block_tables[seq]), alloc.seq_lens[seq]
        full = n == len(before) * case["block_size"]
        given: list[int] = []

        def take_free_block():
            if full and not given:
                alloc.append_slot(seq)
                given.append(alloc.block_tables[seq][-1])
            else:
                given.append(alloc.num_blocks + 1000)  # a block no pool has: the call was not needed
            return given[-1]

        table = list(before)
        result = fn(table, n, case["block_size"], take_free_block)
        if not (full and given):
            alloc.append_slot(seq)
        steps.append({"table": before, "seq_len": n, "took": len(given), "after": data.plain(table),
                      "slot": data.plain(result)})
    return {"result": steps}


@judge("append")
def _append_steps(got, spec) -> None:
    """3.2, step by step against the real allocator's: took a block exactly when the last one was full,
    left the table as the allocator's, returned its slot."""
    want = spec["want"]
    if not isinstance(got, list) or len(got) != len(want):
        raise Mismatch("append(...) did not answer every step of the run.")
    for seen, real in zip(got, want):
        what = (f"append(table={real['table']}, seq_len={real['seq_len']}, block_size={spec['block_size']}, "
                "take_free_block)")
        if seen["took"] > real["took"]:
            raise Mismatch(f"{what} asked for a new block "
                           f"{'a second time' if real['took'] else 'although its last block still had room'}.")
        if seen["took"] < real["took"]:
            raise Mismatch(f"{what} did not take a new block, but the last block was full ({len(real['table'])} "
                           f"blocks x {spec['block_size']} slots hold {len(real['table']) * spec['block_size']} tokens).")
        if seen["after"] != real["after"]:
            raise Mismatch(f"{what} left the table as {echo(seen['after'])}; the real allocator's table is now "
                           f"{real['after']}. Append the new block to the table you were given (modify it in place).")
        if seen["slot"] != real["slot"]:
            raise Mismatch(f"{what} returned {echo(seen['slot'])}, which is not the slot the real allocator writes "
                           "this token to.")


def _normal(text):
    return " ".join(text.split()).lower() if isinstance(text, str) else text


@judge("matching")
def _matching(got, spec) -> None:
    """Items matched to options: a dict (key -> option) or a list (one option per row, in order).

    spec: want, options, noun ("job", "row"), remarks {"key=option": why that match is wrong}."""
    want, options, noun = spec["want"], {_normal(o) for o in spec["options"]}, spec.get("noun", "item")
    if isinstance(want, dict):
        if not isinstance(got, dict):
            raise Mismatch(f"answer with a dict from each {noun} to its match; you gave {echo(got)}.")
        answer = {}
        for key, value in got.items():
            if _normal(key) not in want:
                raise Mismatch(f"{echo(key)} is not one of the {noun}s: {', '.join(want)}.")
            answer[_normal(key)] = value
        missing = [k for k in want if k not in answer]
        if missing:
            raise Mismatch(f"{len(missing)} of the {len(want)} {noun}s {'is' if len(missing) == 1 else 'are'} "
                           f"missing: {', '.join(missing)}.")
        pairs = [(k, answer[k], want[k]) for k in want]
    else:
        if not isinstance(got, list) or len(got) != len(want):
            raise Mismatch(f"answer with a list of {len(want)}, one per {noun} in its order; you gave {echo(got)}.")
        pairs = [(str(i), g, w) for i, (g, w) in enumerate(got, start=1)]
    for key, value, _ in pairs:
        if _normal(value) not in options:
            raise Mismatch(f"{noun} {key}: {echo(value)} is not one of the options listed above the exercise.")
    wrong = [(k, _normal(v)) for k, v, w in pairs if _normal(v) != _normal(w)]
    if wrong:
        remarks = " ".join(spec.get("remarks", {}).get(f"{k}={v}", "") for k, v in wrong).strip()
        raise Mismatch(f"{len(wrong)} of the {len(pairs)} {'is' if len(wrong) == 1 else 'are'} not right "
                       f"({', '.join(k for k, _ in wrong)})." + (f" {remarks}" if remarks else ""))
