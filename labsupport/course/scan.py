"""Derive, don't call: the one static scan of an exercise's own cells (every lab).

Some exercises ask for a quantity a library function would hand over in one call; their checkoff
names those functions (``forbid=``).  The scan reads the cells that are the exercise — the cell that
hands the answer to check() and, for a function, the cell that defines it — and reports each direct
use of a listed name: through an import, an alias (``from labsupport import ledger as L``) or its
dotted path; a listed method is found by its name after a dot.  `check()` in the notebook and `grade`
run this same scan, so a student learns of a hit as soon as they check.

It is a hint and can be bypassed (a name built at run time, a helper in another cell, code run from
a string): GRADING.md says so.  The grade rests on the hidden re-runs, which a call on the lab's own
givens does not survive only when the function reads them differently — so the library keeps out of
the student's package the functions that answer an exercise whole (the ledger's exerciseN).
"""
from __future__ import annotations

import ast

MAX_SCANNED = 200_000  # characters of one cell; a longer one is not scanned (the scan is linear in what it reads)


def _tree(source: str) -> ast.AST | None:
    if not isinstance(source, str) or len(source) > MAX_SCANNED:
        return None
    lines = [("pass  # " + line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def aliases(sources: list[str]) -> tuple[dict[str, str], list[str]]:
    """Local name -> dotted path, from every import in `sources`; and the modules star-imported."""
    alias: dict[str, str] = {}
    stars: list[str] = []
    for source in sources:
        tree = _tree(source)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                for a in node.names:
                    alias[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name == "*":
                        stars.append(node.module)
                    else:
                        alias[a.asname or a.name] = f"{node.module}.{a.name}"
    return alias, stars


def _dotted(node) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def hits(exercise: list[str], everything: list[str], forbidden) -> list[str]:
    """The listed names the `exercise` cells use directly, resolved through the imports of `everything`."""
    forbidden = tuple(dict.fromkeys(forbidden))
    if not forbidden:
        return []
    alias, stars = aliases(everything)
    methods = {name.rsplit(".", 1)[1]: name for name in forbidden if name.rsplit(".", 2)[-2][:1].isupper()}
    found: list[str] = []
    for source in exercise:
        tree = _tree(source)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Attribute) and node.attr in methods and isinstance(node.ctx, ast.Load):
                found.append(methods[node.attr])
            chain = _dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if not chain:
                continue
            heads = [alias[chain[0]]] if chain[0] in alias else [f"{m}.{chain[0]}" for m in stars] or [chain[0]]
            for head in heads:
                path = ".".join([head, *chain[1:]])
                found += [name for name in forbidden if path == name or path.startswith(name + ".")]
    return list(dict.fromkeys(found))
