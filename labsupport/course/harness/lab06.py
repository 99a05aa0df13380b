"""Lab 06's harness: the engine loop, preemption, and swap versus recompute (§10.5), beside checkoffs/lab06.py.

Checkoff 6.2: the judge "preemption_plan" (which sequences the engine preempts, in its order, and how).
"""
from __future__ import annotations

from labsupport.course.harness.base import judge
from labsupport.course.judge import Mismatch, echo


@judge("preemption_plan")
def _preemption_plan(got, spec) -> None:
    """6.2: the victims in the engine's order, each swapped or recomputed.  spec: want, what, blocks_needed, tokens."""
    want, what, need = spec["want"], spec["what"], spec["blocks_needed"]
    if isinstance(got, str) or not isinstance(got, list):
        raise Mismatch(f"{what} returned {echo(got)}; return a list of (name, 'swap' or 'recompute') pairs.")
    if any(not isinstance(x, list) or len(x) != 2 for x in got):
        raise Mismatch(f"{what} returned {echo(got)}; each entry is a pair (name, 'swap' or 'recompute').")
    names_got, names_want = [x[0] for x in got], [x[0] for x in want]
    if names_got != names_want:
        if sorted(map(repr, names_got)) == sorted(map(repr, names_want)):
            raise Mismatch(f"{what}: you preempt the right sequences in the wrong order.")
        raise Mismatch(f"{what}: you preempt {echo(names_got, 200)}; that is "
                       f"{'too many' if len(names_got) > len(names_want) else 'not the right set'} for {need} "
                       "block(s) under the engine's first-come-first-served policy.")
    for (name, kind), (_, want_kind) in zip(got, want):
        if not isinstance(kind, str) or kind.strip().lower() not in ("swap", "recompute"):
            raise Mismatch(f"{what}: the decision for {name!r} is {echo(kind)}; answer 'swap' or 'recompute'.")
        if kind.strip().lower() != want_kind:
            raise Mismatch(f"{what}: {name!r} ({spec['tokens'][name]:,} tokens) should not be preempted by "
                           f"{kind!r} on this link.")
