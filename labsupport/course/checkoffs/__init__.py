"""The graders: one module per lab, ``labNN.py``, declaring that lab's givens and checkoffs (the staff side).

These modules hold the expected formulas, the hidden givens' generators and the hidden cases, so
the student release leaves this package out and `grade` masks it (bubblewrap) or deletes it
(a container) before any student code runs.  What check() needs of them, the build writes into each
lab's public record (labsupport.course.record).  How to add a checkoff: COURSE_AUTHORING.md.
"""
from __future__ import annotations

import importlib
import importlib.util

from labsupport.course.registry import REGISTRY, Checkoff, validate_id


def load_lab(lab: int) -> list[Checkoff]:
    """Import lab `lab`'s grader module (when it has one); its checkoffs, in order."""
    if importlib.util.find_spec(f"{__name__}.lab{lab:02d}") is not None:  # lab 99, the board, has none
        importlib.import_module(f"{__name__}.lab{lab:02d}")
    return sorted((c for c in REGISTRY.values() if c.lab == lab), key=lambda c: c.order)


def get(checkoff_id: str) -> Checkoff:
    lab = int(validate_id(checkoff_id).split(".")[0])
    if checkoff_id not in REGISTRY:
        load_lab(lab)
    if checkoff_id not in REGISTRY:
        known = ", ".join(c.id for c in load_lab(lab)) or "none"
        raise KeyError(f"unknown checkoff {checkoff_id!r}; lab {lab} registers: {known}")
    return REGISTRY[checkoff_id]
