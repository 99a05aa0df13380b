"""Prose that follows the course card (issue 37): a lab's markdown says ``{{ expr }}`` where a number is its own.

A lab states numbers in prose as well as in code: the slots a card holds, the bytes of a block.  Written by
hand they stay the lecture's when `course.toml` names another card.  In a lab source's markdown cells,
``{{ expr }}`` is a Python f-string field (``{{ N.naive_concurrency:, }}``), evaluated at build on the names
below, so the built notebook states the card's number.  What the lecture printed stays literal text and says
so ("the lecture prints 29"): a quote is the lecture's, whatever the card.

Names:
    card, gpu, model, mha, gqa   the course card, its GPU, its model, and the model with more / fewer KV heads
    N, NG                        the ledger's headline numbers (`python -m labsupport ledger --json`'s keys) for
                                 the lecture's workload on `mha` and on `gqa`, e.g. N.naive_concurrency
    G                            the lab's givens as the card sets them (G.S_MAX), where the lab has givens
    ledger, GB, GiB, KiB, MiB    the closed forms and the units
    fmt_bytes, fmt_gb, fmt_pct   how the labs print bytes, GB and percentages
"""
from __future__ import annotations

import functools
import re
import types

FIELD = re.compile(r"\{\{(.+?)\}\}", re.S)


@functools.lru_cache(maxsize=None)
def _headline(model_name: str, gpu_name: str) -> types.SimpleNamespace:
    from labsupport import card
    from labsupport.cli import ledger as staff_ledger

    scenario = staff_ledger.Scenario(model=card.model(model_name), gpu=card.gpu(gpu_name))
    return types.SimpleNamespace(**staff_ledger.compute(scenario))


def names(givens: dict | None = None) -> dict:
    """What a ``{{ }}`` field may name (see the module's docstring)."""
    from labsupport import card as course_card
    from labsupport import ledger
    from labsupport.specs import GB, KiB, MiB, GiB
    from labsupport.units import fmt_bytes, fmt_gb, fmt_pct

    c = course_card.card()
    return {"card": c, "gpu": c.gpu, "model": c.model, "mha": c.mha, "gqa": c.gqa,
            "N": _headline(c.mha.name, c.gpu.name), "NG": _headline(c.gqa.name, c.gpu.name),
            "G": types.SimpleNamespace(**(givens or {})), "ledger": ledger, "GB": GB, "GiB": GiB, "KiB": KiB,
            "MiB": MiB, "fmt_bytes": fmt_bytes, "fmt_gb": fmt_gb, "fmt_pct": fmt_pct, "round": round, "min": min,
            "max": max, "abs": abs, "int": int, "len": len, "sum": sum}


def render(text: str, where: str, values: dict) -> str:
    """`text` with each ``{{ expr }}`` replaced by its value; ValueError naming `where` and the field otherwise."""
    def one(found: re.Match) -> str:
        field = found[1].strip()
        try:
            return eval(f"f'''{{{field}}}'''", {"__builtins__": {}}, values)  # noqa: S307 - the course's own source
        except Exception as exc:  # noqa: BLE001 - any slip in a field is the author's, named in one line
            raise ValueError(f"{where}: the prose field {{{{ {field} }}}} does not render: "
                             f"{type(exc).__name__}: {exc}") from None
    return FIELD.sub(one, text)
