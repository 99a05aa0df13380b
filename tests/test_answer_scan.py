"""No answer before its question (issue "Teaching truth, third pass"): what a student reads and sees on Run All.

For every value checkoff, the number `check()` would accept on the lecture's givens (within the
checkoff's own tolerance, or as a percentage) must not appear in the text a student has in front of
them before the checkoff: every cell of the student copy above it (markdown and code, the checkoff
cell's own prompt included), what those cells print on Run All (the executed solution's outputs of
the same cells: text, HTML, Markdown, plotly titles, annotations and labels), and all of every
earlier lab.  The README's ledger stays the reference it is; lab 00 tells students to try the
exercises before reading it.  The numbers in a lab's givens cell are the exercise's inputs, not
answers, and are not scanned.

A function checkoff's answer is the function, but what it returns on the lab's own inputs (the
lecture's) is a number the exercise makes the student find, so it is scanned the same way: its
`want` in the first of the lab's own cases (the record's, which the graders' `cases(case_rng(id))` wrote),
or where `LECTURE_RESULT` says it sits; every function checkoff is listed there or in
`NO_LECTURE_NUMBER`, so a new one needs a decision.  A number an earlier lab's checkoff already asked
for is not scanned again in a later lab.  And an answer is also given away by a stated multiplier
("moves 3.00× the fused kernel's bytes") that turns the answer of a checkoff this lab already passed
into it, within the multiplier's printed precision (when that is 1% or finer).

The expected values are the build's record (labsupport/course/records: what check() itself reads), and a
number is read with its context: one printed with a unit ("1.81 GB", "22.65 ms", "1,024 MiB") is taken in
that unit, so it gives away an answer in bytes or seconds written in another scale (to the precision it is
printed with), and it is no reading of an answer of another kind (1,024 MiB of scratch disk is not a
1,024-byte table).  A number an answer of unknown kind could be is read both ways.

A number that only coincides with an answer (a block size, a count that means something else) is
allowlisted in `COINCIDENCES` with the reason it is not the answer (COURSE_AUTHORING.md, rule 6).

Also here: a cell that shows a note `if revealed("N.M")` shows it once N.M passed (the executed
solutions pass every checkoff, so each such cell has output there).
"""
from __future__ import annotations

import html
import math
import re
from pathlib import Path

import nbformat
import pytest

from labsupport.course import record

ROOT = Path(__file__).resolve().parents[1]
STUDENTS = sorted((ROOT / "notebooks").glob("0[0-9]_*.ipynb"))
NUMBER = re.compile(r"(?<![\w.])(?P<number>[-−]?\d[\d,_]*(?:\.(?P<digits>\d+))?(?:[eE][-+]?\d+)?)"
                    r"(?:\s*(?P<unit>%|[KMGT]i?B/s|B/s|[KMGT]i?B\b|B\b|ms\b|µs|us\b|ns\b|s\b|tok/s))?")
# a unit a number is printed in: (its kind, its scale to the kind's base: bytes, bytes/s, seconds, tokens/s)
UNITS = {"B": ("bytes", 1), "KB": ("bytes", 1e3), "MB": ("bytes", 1e6), "GB": ("bytes", 1e9), "TB": ("bytes", 1e12),
         "KiB": ("bytes", 2**10), "MiB": ("bytes", 2**20), "GiB": ("bytes", 2**30), "TiB": ("bytes", 2**40),
         "s": ("seconds", 1), "ms": ("seconds", 1e-3), "µs": ("seconds", 1e-6), "us": ("seconds", 1e-6),
         "ns": ("seconds", 1e-9), "tok/s": ("tokens/s", 1)}
UNITS.update({f"{u}/s": ("bytes/s", k) for u, (kind, k) in list(UNITS.items()) if kind == "bytes"})
# the kind of an answer, from the unit its checkoff prints it with (the record's spec), where it has one
ANSWER_KIND = {" B": "bytes", " B/s": "bytes/s", " s": "seconds", " tok/s": "tokens/s"}
COARSEST = 0.01  # a number printed to coarser than 1% in another scale ("2 GB") gives no exact answer away
PLOTLY = "application/vnd.plotly.v1+json"
TEXT_KEYS = ("text", "title", "name", "hovertext", "texttemplate")
SMALL = 16  # integer answers up to this collide with every block size and step count in the prose
MULTIPLIER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*×")


def _first(cases):
    """The want of the first of the lab's own cases (the record's): the graders list the lecture's inputs first."""
    return cases[0]["spec"]["want"]


def _case_with(*inputs):
    """The want of the record's case called with `inputs` (positional, then keyword values, in order)."""
    return lambda cases: next(c["spec"]["want"] for c in cases
                              if (*c["input"]["args"], *c["input"]["kwargs"].values()) == inputs)


# Where, among a function checkoff's own cases (the record's), its result on the lecture's inputs is.
LECTURE_RESULT = {
    "0.2": _first,                                            # KV bytes per token of the lecture's 7B
    "2.2": _first,                                            # internal fragmentation of the served pool: 84%
    "2.3": _first,                                            # utilization of the lecture-pool allocator
    "2.6": _first,                                            # utilization at S_max = 32,768: the lecture's 1.9%
    "2.9": _first,                                            # Exercise 2's mean concurrency: the lecture's ≈ 39
    "3.5": _first,                                            # 640-token sequences in the lecture's pool: 186
    "3.7": _first,                                            # the table of a 4,096-token sequence: 1,024 B
    "4.3": _case_with(64, 8192, 32, 8, 128, 2),               # the headline point, GQA-8 (lab 04's givens)
    "6.1": _first,                                            # W* of the 4K MHA sequence on the H100 (33.18 GB/s)
    "7.1": _first,                                            # TPOT at B = 186, 640 tokens
    "7.2": _first,                                            # the largest B under 20 ms
    "7.5": _first,                                            # Exercise 5 on GQA-8
    "8.4": _first,                                            # max_num_seqs at 20 ms
    "8.5": _first,                                            # max_num_batched_tokens
}
# Function checkoffs without one lecture number: traces, offsets, op replays, engine runs of their own.
# 1.2 and 1.3 are the lecture's own "295 against 29" (Lecture 2's figures it opens with), and 8.3's is the
# 7,452-block pool labs 03-07 run on: the exercise is the function (vLLM's knob), not the number.  5.2's lecture case
# is whole blocks (its tokens ÷ 16, which lab 05's section 3 works out); the exercise is the prompt that ends mid-block.
# 1.5's ledger is of a run of the engine the lab itself sets up (twelve requests, 600 blocks): the lecture prints none of it.
# 8.8 returns a changed (model, card) pair, not a number.
# 2.13's result is an offset in an address space taken mid-serve: where a slot goes, no quantity of the lecture.
# 7.7's TTFT terms are read off each engine run's own step log.
NO_LECTURE_NUMBER = {"1.2", "1.3", "1.5", "2.13", "5.2", "3.1", "3.2", "3.3", "3.10", "4.1", "4.2", "5.1", "5.4",
                     "6.2", "7.3", "7.4", "7.7", "8.3", "8.6", "8.7", "8.8"}


# Numbers in a lab that coincide with an answer and are not it (COURSE_AUTHORING.md, rule 6): (checkoff id, the
# number as the text prints it, unit included) -> why that number there is not the answer.  The scan skips that
# printed number for that checkoff only.  (A multiplier that gives an answer away is never a coincidence.)
def _kv_kib_as_lab_00_prints_it() -> str:
    """Lab 00's given KV_KIB (the card's KV per token in KiB; 512 on the lecture's card, 56 on A100-80GB +
    Qwen2.5-7B) as its prose prints it, `{{ G.KV_KIB:,g }} KiB`: read from the build's record, the same build as
    the notebooks this file scans (a course card set by $LABSUPPORT_COURSE alone does not rebuild them)."""
    rec = record.read(0)
    return f"{rec['givens']['KV_KIB']:,g} KiB"


COINCIDENCES: dict[tuple[str, str], str] = {
    # the lab states its given before 0.1 asks for it in bytes: the question, not the answer (57,344 B on Qwen2.5-7B)
    ("0.1", _kv_kib_as_lab_00_prints_it()): "the card's per-token KV size is 0.1's given (KV_KIB): it is given in "
                                            "KiB and asked in bytes",
    ("0.2", "512 KiB"): "0.2 asks where the lecture's stated 512 KiB comes from: the function is the exercise",
    ("4.3", "2.15 GB"): "lab 02's 4,096-token slot (2,147,483,648 B) is not a decode step's bytes (2,148,532,224 B)",
    ("3.7", "1,024 MiB"): "lab 00's doctor prints the grading sandbox's 1,024 MiB of scratch disk, not a table's bytes",
}


def _coincidence(cid: str, token: str) -> bool:
    return (cid, " ".join(token.split())) in COINCIDENCES


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
    """(the text as printed, its value, its unit's kind or None, the unit's scale, its relative printed precision)
    per number in `text`; a percentage is its fraction, of no unit."""
    for match in NUMBER.finditer(text):
        try:
            x = float(match["number"].replace("−", "-").replace(",", "").replace("_", ""))
        except ValueError:
            continue
        unit = match["unit"]
        if unit == "%":
            yield match.group().strip(), x / 100, None, 1, 0.0
            continue
        kind, scale = UNITS.get(unit, (None, 1))
        precision = 0.5 * 10 ** -len(match["digits"] or "") / abs(x) if x else 1.0
        yield match.group().strip(), x, kind, scale, precision


def _readings_of(x: float, kind, scale: float, precision: float, answer_kind, rel: float):
    """(value, rel_tol) a printed number may be read as, against an answer of `answer_kind` (None: unknown)."""
    if kind is None:
        return [(x, rel)]
    if answer_kind is not None and kind != answer_kind:
        return []  # a byte count is no reading of a time or a count
    if scale == 1:
        return [(x, rel)]  # the base unit: read as printed, like a bare number
    converted = [(x * scale, max(rel, precision))] if precision <= COARSEST else []
    return converted if answer_kind is not None else [(x, rel), *converted]


def _texts(student_path: Path):
    """(cell id, text the student sees from it) for every cell of a student notebook, in order."""
    student = nbformat.read(student_path, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / student_path.name, as_version=4)
    # a cell tagged nbval-ignore-output prints this machine's wall-clock measurements, other on every run: a figure
    # there that lands on an answer (a 22.7 ms step beside 7.1's 22.65 ms TPOT) is chance, not a number to copy
    outputs = {c.get("id"): "" if "nbval-ignore-output" in c.metadata.get("tags", []) else _output_text(c)
               for c in solution.cells}
    for cell in student.cells:
        if "givens" in cell.metadata.get("tags", []):
            continue
        seen = cell.source if "checkoff" not in cell.metadata.get("tags", []) else cell.source
        yield cell, seen, "" if "checkoff" in cell.metadata.get("tags", []) else outputs.get(cell.get("id"), "")


def _answers(lab: int):
    """(checkoff id, a number it accepts on the lecture's givens, rel_tol, abs_tol, its kind or None) per value
    checkoff, and per function checkoff its result on the lecture's inputs: read from the build's record."""
    rec = record.read(lab)
    for c in rec["checkoffs"] if rec else []:
        if c["kind"] == "function" and c["id"] in LECTURE_RESULT:
            want = LECTURE_RESULT[c["id"]](c["cases"])
            rel, abs_, kind = 1e-4, 0.0, None  # a number the function returns: matched to five figures
        elif c["kind"] == "value":
            spec = c["spec"]
            want, rel, abs_ = spec["want"], spec.get("rel_tol", 1e-3), spec.get("abs_tol", 0.0)
            kind = ANSWER_KIND.get(spec.get("unit", ""))
        else:
            continue
        leaves = [want] if isinstance(want, (int, float)) else \
            [v for v in (want.values() if isinstance(want, dict) else want) if isinstance(v, (int, float))] \
            if isinstance(want, (dict, list, tuple)) else []
        for v in leaves:
            for reading in _readings(v, rel, abs_):
                yield (c["id"], *reading, kind)


def _readings(v, rel: float, abs_: float):
    """(number, rel_tol, abs_tol) a text may give answer `v` away as; none for a small count, zero or a flag."""
    if isinstance(v, bool) or not math.isfinite(v) or (float(v).is_integer() and abs(v) <= SMALL) or v == 0:
        return
    if abs_ >= 0.5 and not float(v).is_integer():
        # a window of a whole unit or so (2.10: the ratio, its floor or its round) also holds neighbours
        # nobody would write for this answer (40 blocks a sequence near 39.48): scan for its readings
        for reading, tol in {(float(v), max(rel, 1e-9)), (float(math.floor(v)), 1e-9), (float(round(v)), 1e-9)}:
            yield reading, tol, 0.0
        return
    yield float(v), max(rel, 1e-9), abs_
    if 0 < v < 1:
        # a share gives its complement away: "84.05% of the budget never filled" is 15.95% used
        yield 1.0 - float(v), 1e-9, max(rel * float(v), abs_)


def _leaks(texts: list[tuple[str, str]], cid: str, want: float, rel: float, abs_: float,
           known: tuple[tuple[str, float], ...] = (), kind: str | None = None) -> list[str]:
    """Where `want` (an answer of `kind`) appears in `texts`, read in the units it is printed in, or a multiplier
    there turns a `known` (earlier) answer into it."""
    found = []
    for where, text in texts:
        for token, x, unit_kind, scale, precision in _numbers(text):
            if any(math.isclose(value, want, rel_tol=tol, abs_tol=abs_)
                   for value, tol in _readings_of(x, unit_kind, scale, precision, kind, rel)) \
                    and not _coincidence(cid, token):
                found.append(f"{cid} = {want:g} is given away by {token!r} in {where}")
        for match in MULTIPLIER.finditer(text):
            k, digits = float(match.group(1)), match.group(1).partition(".")[2]
            precision = 0.5 * 10 ** -len(digits) / k if k else 1.0
            if k == 1 or precision > 0.01:
                continue
            for other, r in known:
                if math.isclose(k * r, want, rel_tol=max(rel, precision), abs_tol=abs_):
                    found.append(f"{cid} = {want:g} is given away by {match.group()!r} × {other}'s {r:g} in {where}")
    return found


def _asked_before(lab: int) -> list[tuple[str, float]]:
    """(checkoff id, number) for every answer an earlier lab's checkoffs asked for."""
    return [(cid, want) for other in range(lab) for cid, want, *_ in _answers(other)]


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_no_answer_appears_before_its_question(path):
    lab = int(path.name[:2])
    earlier = []
    for other in STUDENTS:
        if int(other.name[:2]) < lab:
            earlier += [(f"{other.stem} (an earlier lab)", src + "\n" + out) for _, src, out in _texts(other)]
    cells = list(_texts(path))
    asked = _asked_before(lab)
    problems = []
    for cid, want, rel, abs_, kind in _answers(lab):
        if any(math.isclose(want, x, rel_tol=rel, abs_tol=abs_) for _, x in asked):
            continue  # an earlier lab asked for this number: its later labs may use it
        before, passed_here = [], []
        for cell, src, out in cells:
            found = re.findall(r"check\(\s*['\"](\d+\.\d+)['\"]", cell.source)
            if cid in found:
                before.append((f"{path.stem}'s checkoff cell for {cid}", src))
                break
            passed_here += found
            before.append((f"{path.stem} cell {cell.get('id')}", src + "\n" + out))
        known = tuple((o, x) for o, x, *_ in _answers(lab) if o in passed_here)  # this lab's, already passed
        problems += _leaks(earlier, cid, want, rel, abs_, kind=kind) + _leaks(before, cid, want, rel, abs_, known, kind)
    assert not problems, "\n".join(problems)


def _on_lecture_data(cell) -> bool:
    """Whether a cell's outputs are drawn from the lecture's data: a cell tagged needs-traces shows the real traces
    only where they are here; without them it shows a labelled stand-in, whose numbers can only coincide with an
    answer (issue 35: a stand-in's mean TTFT of 61 ms is no reading of 7.5's 61)."""
    from labsupport import workloads

    return "needs-traces" not in cell.metadata.get("tags", []) or \
        all(workloads.find_trace(name) is not None for name in workloads.TRACES)


def _seen_after_run_all(executed) -> list[tuple[str, str]]:
    """(cell id, what a person reads in it) for every cell of an executed student copy: markdown, code and every
    output (text, HTML, Markdown, chart titles, labels and annotations) drawn from the lecture's data; the givens
    cell holds inputs, not answers."""
    return [(cell.get("id"), cell.source + "\n" + (_output_text(cell) if cell.cell_type == "code"
                                                    and _on_lecture_data(cell) else ""))
            for cell in executed.cells if "givens" not in cell.metadata.get("tags", [])]


@pytest.mark.slow
@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_a_fresh_run_all_shows_no_answer_outside_a_reveal(path, run_all):
    """Issue 27's scan: the student copy after a fresh Run All, every cell of it (not only those above the
    question: a student scrolls), and every earlier lab's: no checkoff's accepted answer on the lecture's givens
    (nor a share's complement) is on screen.  With every exercise unfinished, a cell behind `if revealed(...)`
    shows only its wait line, so whatever this finds is outside a reveal."""
    lab = int(path.name[:2])
    shown = [(f"{other.stem} after Run All, cell {cell}", text) for other in STUDENTS if int(other.name[:2]) <= lab
             for cell, text in _seen_after_run_all(run_all(other))]
    asked = _asked_before(lab)
    problems = [leak for cid, want, rel, abs_, kind in _answers(lab)
                if not any(math.isclose(want, x, rel_tol=rel, abs_tol=abs_) for _, x in asked)
                for leak in _leaks(shown, cid, want, rel, abs_, kind=kind)]
    assert not problems, "\n".join(problems)


def test_the_scan_finds_a_complement():
    """A share's complement is scanned for, in the share's own window: 15.95% used (within 0.1%) is given away by
    "84.05% never filled", not by "84.1%" (0.05 points off, more than 0.1% of 15.95%)."""
    (share, *_), (complement, rel, abs_) = _readings(0.1595, 1e-3, 0.0)
    assert share == 0.1595 and math.isclose(complement, 0.8405) and math.isclose(abs_, 0.1595e-3)
    assert _leaks([("a cell", "84.05% of the budget is never filled")], "2.x", complement, rel, abs_)
    assert not _leaks([("a cell", "84.1% of the budget is never filled")], "2.x", complement, rel, abs_)
    assert len(list(_readings(40.0, 1e-3, 0.0))) == 1  # a count has no complement


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


def test_the_scan_finds_a_function_result_and_a_multiplier():
    """The two leaks the value-only scan missed: a function checkoff's lecture result (7.2's 159) and a
    ratio to an earlier answer ("moves 3.00× the fused kernel's bytes" before 4.4)."""
    assert ("7.2", 159.0) in [(cid, want) for cid, want, *_ in _answers(7)]
    assert _leaks([("a cell", "B = 159: 19.950 ms")], "7.2", 159.0, 1e-3, 0)
    # 4.3 on lab 04's own givens (the card's heads), by hand: K and V of every token, 2·B·S·n_kv·d·b, plus the query
    # and output, 2·B·n_q·d·b; gather-then-attend (4.4, the record's) also writes and rereads the gathered K and V
    # (three times the K and V bytes): 3.00× on any card whose K and V outweigh q and o
    g = record.read(4)["givens"]
    fused = (2 * g["BATCH"] * g["SEQ_LEN"] * g["KV_HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"]
             + 2 * g["BATCH"] * g["Q_HEADS"] * g["HEAD_DIM"] * g["DTYPE_BYTES"])
    gta = dict((cid, want) for cid, want, *_ in _answers(4))["4.4"]
    text = [("a panel", "gather-then-attend moves 3.00× the fused kernel's bytes")]
    assert _leaks(text, "4.4", gta, 1e-9, 0, (("4.3", fused),))
    assert not _leaks([("a panel", "about 3× as long")], "4.4", gta, 1e-9, 0, (("4.3", fused),))


def test_the_lecture_results_are_the_lectures_numbers():
    """LECTURE_RESULT reads the lecture's case, worked out here by hand: 0.2 is 2 x 32 x 32 x 128 x 2 B = 524,288;
    4.3 at the headline point is 2·64·8192·8·128·2 B of K and V (2**31) plus 2·64·32·128·2 B of query and output
    (2**20); 7.2 is 159 sequences under 20 ms."""
    found = {(cid, want) for lab in (0, 4, 7) for cid, want, *_ in _answers(lab)}
    assert {("0.2", 524_288.0), ("4.3", float(2**31 + 2**20)), ("7.2", 159.0)} <= found


def test_a_coincidence_is_skipped_for_its_checkoff_only(monkeypatch):
    """An allowlisted number is not a leak of its checkoff; the same number still leaks another checkoff's
    answer, and another number still leaks this one's."""
    texts = [("a cell", "blocks of 4,096 tokens, and 8,192 more")]
    assert _leaks(texts, "3.9", 4096.0, 1e-9, 0) and _leaks(texts, "3.8", 4096.0, 1e-9, 0)
    monkeypatch.setitem(COINCIDENCES, ("3.9", "4,096"), "the block size of the prose, not the count 3.9 asks for")
    assert not _leaks(texts, "3.9", 4096.0, 1e-9, 0)
    assert _leaks(texts, "3.8", 4096.0, 1e-9, 0)
    assert _leaks(texts, "3.9", 8192.0, 1e-9, 0)


def test_every_coincidence_names_an_answer_and_says_why():
    """An entry allowlists a printed number that the scan reads as one of its checkoff's answers (else it hides
    nothing and is stale), and gives the reason it is not the answer."""
    answers = {}
    for lab in range(9):
        for cid, want, rel, abs_, kind in _answers(lab):
            answers.setdefault(cid, []).append((want, rel, abs_, kind))
    for (cid, printed), reason in COINCIDENCES.items():
        assert len(reason.split()) >= 4, (cid, printed, "say why the number is not the answer")
        assert any(_leaks([("entry", printed)], "not " + cid, want, rel, abs_, kind=kind)
                   for want, rel, abs_, kind in answers.get(cid, ())), \
            (cid, printed, "coincides with no answer of that checkoff: drop the entry")


def test_every_function_checkoff_is_classified():
    ids = {c["id"] for lab in range(9) for c in record.read(lab)["checkoffs"] if c["kind"] == "function"}
    assert ids == set(LECTURE_RESULT) | NO_LECTURE_NUMBER, (ids ^ (set(LECTURE_RESULT) | NO_LECTURE_NUMBER))


def test_the_readme_says_what_each_lab_does_not_what_it_finds():
    """The README is read before any lab: no checkoff's accepted answer on the lecture's givens is in it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    labs = sorted({int(p.name[:2]) for p in STUDENTS})
    problems = [leak for lab in labs for cid, want, rel, abs_, kind in _answers(lab)
                for leak in _leaks([("README.md", readme)], cid, want, rel, abs_, kind=kind)]
    assert not problems, "\n".join(problems)


def test_the_readme_scan_finds_a_result_written_into_it():
    """The scan above can fail: 2.2's answer, as the old README's lab table printed it, is found."""
    (cid, want, rel, abs_, kind), = [a for a in _answers(2) if a[0] == "2.2"][:1]
    assert _leaks([("README.md", f"utilization ({100 * want:.2f}% at the end of a sequence's life)")],
                  cid, want, rel, abs_, kind=kind)


def test_a_number_is_read_in_the_unit_it_is_printed_in():
    """Context (issue 35): 2.1's 1,811,939,328 B is given away by "1.81 GB" and "1,728 MiB" as well as by its digits;
    1,024 MiB of scratch disk is no 1,024-byte block table; "22.65 ms" gives a TPOT of 0.02265 s away, "22.65 GB"
    does not; "2 GB" (printed to 25%) gives no exact byte count away; a number of unknown kind is read both ways."""
    assert _leaks([("a", "each leaves 1.81 GB unfilled")], "2.1", 1_811_939_328, 1e-9, 0, kind="bytes")
    assert _leaks([("a", "each leaves 1,728 MiB unfilled")], "2.1", 1_811_939_328, 1e-9, 0, kind="bytes")
    assert _leaks([("a", "1,811,939,328 unfilled")], "2.1", 1_811_939_328, 1e-9, 0, kind="bytes")
    assert not _leaks([("a", "each leaves 1.81 ms")], "2.1", 1_811_939_328, 1e-9, 0, kind="bytes")
    assert not _leaks([("a", "1,024 MiB of scratch disk")], "3.7", 1024, 1e-9, 0, kind="bytes")
    assert _leaks([("a", "a table of 1,024 B")], "3.7", 1024, 1e-9, 0, kind="bytes")
    assert _leaks([("a", "TPOT 22.65 ms")], "7.x", 0.02265, 1e-3, 0, kind="seconds")
    assert not _leaks([("a", "22.65 GB")], "7.x", 0.02265, 1e-3, 0, kind="seconds")
    assert not _leaks([("a", "about 2 GB")], "2.x", 2_147_483_648, 1e-3, 0, kind="bytes")
    assert _leaks([("a", "22.65 ms")], "7.x", 0.02265, 1e-3, 0) and _leaks([("a", "22.65 ms")], "7.x", 22.65, 1e-3, 0)
    assert _leaks([("a", "33.18 GB/s")], "6.x", 33.18e9, 1e-3, 0, kind="bytes/s")


def test_the_scan_reads_a_panels_readout_as_run_all_stores_it():
    """A widget's readout is part of what the scan reads: a `viz.Panel` stores its title, settings and readout as its
    output's text/plain (the widget view itself carries no text), and an answer in that readout is found there."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labsupport.viz import Panel

    panel = Panel(lambda s_max: go.Figure(), {"s_max": widgets.IntSlider(value=32_768, min=512, max=131_072)},
                  readout=lambda s_max: f"3 slots; utilization {100 * 3 * 640 / s_max / 29.8:.2f}%", title="S_max")
    stored = {"outputs": [{"output_type": "display_data", "data": panel._repr_mimebundle_()}]}
    text = _output_text(stored)
    assert "s_max=32768" in text and "utilization 0.20%" in text
    assert _leaks([("the panel", text)], "2.x", 0.00199, 1e-2, 0)
