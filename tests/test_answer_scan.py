"""No answer before its question (issue "Teaching truth, third pass"): what a student reads and sees on Run All.

For every value checkoff, the number `check()` would accept on the lecture's givens (within the
checkoff's own tolerance, or as a percentage) must not appear in the text a student has in front of
them before the checkoff: every cell of the student copy above it (markdown and code, the checkoff
cell's own prompt included), what those cells print on Run All (the executed solution's outputs of
the same cells: text, HTML, Markdown, plotly titles, annotations and labels), and all of every
earlier lab.  The README's ledger stays the reference it is; lab 00 tells students to try the
exercises before reading it.  The numbers in a lab's givens cell are the exercise's inputs, not
answers, and are not scanned.

Also here: a cell that shows a note `if revealed("N.M")` shows it once N.M passed (the executed
solutions pass every checkoff, so each such cell has output there).
"""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import nbformat
import pytest

from labsupport.course.checkoff import case_rng, load_lab

ROOT = Path(__file__).resolve().parents[1]
STUDENTS = sorted((ROOT / "notebooks").glob("0[0-9]_*.ipynb"))
NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,_]*(?:\.\d+)?(?:[eE][-+]?\d+)?\s*%?")
PLOTLY = "application/vnd.plotly.v1+json"
TEXT_KEYS = ("text", "title", "name", "hovertext", "texttemplate")
SMALL = 16  # integer answers up to this collide with every block size and step count in the prose


def _plotly_text(node) -> list[str]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in TEXT_KEYS and isinstance(value, (str, list)):
                out += [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]
            elif key not in ("x", "y", "z", "customdata", "values"):
                out += _plotly_text(value)
    elif isinstance(node, list):
        for item in node:
            out += _plotly_text(item)
    return out


def _output_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        data = out.get("data") or {}
        for kind in ("text/plain", "text/markdown"):
            if kind in data:
                parts.append(data[kind] if isinstance(data[kind], str) else "".join(data[kind]))
        if "text/html" in data and PLOTLY not in data:  # a figure's HTML copy embeds its data arrays: read its JSON
            raw = data["text/html"] if isinstance(data["text/html"], str) else "".join(data["text/html"])
            parts.append(html.unescape(re.sub(r"<[^>]+>", " ", raw)))
        if PLOTLY in data:
            parts += _plotly_text(data[PLOTLY].get("layout", {})) + _plotly_text(data[PLOTLY].get("data", []))
    return "\n".join(parts)


def _numbers(text: str):
    for match in NUMBER.finditer(text):
        token = match.group().replace("−", "-").replace(",", "").replace("_", "").strip()
        percent = token.endswith("%")
        try:
            x = float(token.rstrip("%").strip())
        except ValueError:
            continue
        yield match.group().strip(), (x / 100 if percent else x)


def _texts(student_path: Path):
    """(cell id, text the student sees from it) for every cell of a student notebook, in order."""
    student = nbformat.read(student_path, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / student_path.name, as_version=4)
    outputs = {c.get("id"): _output_text(c) for c in solution.cells}
    for cell in student.cells:
        if "givens" in cell.metadata.get("tags", []):
            continue
        seen = cell.source if "checkoff" not in cell.metadata.get("tags", []) else cell.source
        yield cell, seen, "" if "checkoff" in cell.metadata.get("tags", []) else outputs.get(cell.get("id"), "")


def _answers(lab: int):
    """(checkoff id, the numbers it accepts on the lecture's givens, rel_tol, abs_tol) per value checkoff."""
    for c in load_lab(lab):
        if c.kind != "value":
            continue
        want = c.prepare(case_rng(c.id))
        spec = c.formative
        rel, abs_ = spec.get("rel_tol", 1e-3), spec.get("abs_tol", 0.0)
        leaves = [want] if isinstance(want, (int, float)) else \
            [v for v in (want.values() if isinstance(want, dict) else want) if isinstance(v, (int, float))] \
            if isinstance(want, (dict, list, tuple)) else []
        for v in leaves:
            if isinstance(v, bool) or not math.isfinite(v) or (float(v).is_integer() and abs(v) <= SMALL) or v == 0:
                continue
            yield c.id, float(v), max(rel, 1e-9), abs_


def _leaks(texts: list[tuple[str, str]], cid: str, want: float, rel: float, abs_: float) -> list[str]:
    found = []
    for where, text in texts:
        for token, x in _numbers(text):
            if math.isclose(x, want, rel_tol=rel, abs_tol=abs_):
                found.append(f"{cid} = {want:g} is given away by {token!r} in {where}")
    return found


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_no_answer_appears_before_its_question(path):
    lab = int(path.name[:2])
    earlier = []
    for other in STUDENTS:
        if int(other.name[:2]) < lab:
            earlier += [(f"{other.stem} (an earlier lab)", src + "\n" + out) for _, src, out in _texts(other)]
    cells = list(_texts(path))
    problems = []
    for cid, want, rel, abs_ in _answers(lab):
        before = []
        for cell, src, out in cells:
            if re.search(rf"check\(\s*['\"]{re.escape(cid)}['\"]", cell.source):
                before.append((f"{path.stem}'s checkoff cell for {cid}", src))
                break
            before.append((f"{path.stem} cell {cell.get('id')}", src + "\n" + out))
        problems += _leaks(earlier + before, cid, want, rel, abs_)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("0[0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_a_revealed_cell_shows_its_note_once_its_checkoff_passed(path):
    nb = nbformat.read(path, as_version=4)
    silent = []
    for c in nb.cells:
        if c.cell_type != "code" or not re.search(r"^if (?:revealed|unlocked)\(", c.source, re.M):
            continue
        notes = len(re.findall(r"\b(?:errata_note|display)\(", c.source))  # each shows one rich output
        shown = sum(o.get("output_type") in ("display_data", "execute_result") for o in c.outputs)
        if shown < notes or not _output_text(c).strip():
            silent.append(f"{c.get('id')} ({shown} of {notes} notes shown)")
    assert not silent, f"cells that do not show their notes although their checkoffs passed: {silent}"


def test_the_scan_finds_a_planted_answer():
    """The scan itself: a number within tolerance, a percentage and a thousands-separated integer are found."""
    texts = [("a cell", "the batch streams 4,186 tok/s"), ("b", "utilization 15.56%"), ("c", "2147483648 B")]
    assert _leaks(texts, "x", 4186.4, 1e-3, 0)
    assert _leaks(texts, "y", 0.15556, 1e-3, 0)
    assert _leaks(texts, "z", 2**31, 1e-9, 0)
    assert not _leaks(texts, "w", 0.152, 1e-4, 0)
