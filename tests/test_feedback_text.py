"""Feedback is plain text with exact, readable numbers, and no lab types a count it could be wrong about."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from labsupport.course import checkoff as C
from labsupport.course.checkoff import FAIL_LINE, NOT_ATTEMPTED_LINE, check, load_lab, plain
from labsupport.units import fmt_number

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("x, text", [
    (335_544_320, "335,544,320"),  # 320 MiB, which printed as 3.35544e+08
    (335_544_320.0, "335,544,320"),
    (2**40, "1,099,511,627,776"),
    (-7, "-7"),
    (0, "0"),
    (0.155634, "0.155634"),
    (1234.5678, "1,234.57"),
    (123456.78, "123,456.8"),
    (0.0000123456789, "0.0000123457"),
    (0.5, "0.5"),
])
def test_fmt_number_writes_numbers_as_a_sentence_would(x, text):
    assert fmt_number(x) == text


def test_fmt_number_never_writes_e_notation():
    for exponent in range(-12, 19):
        for mantissa in (1, 1.5, 3.35544, 9.99999):
            assert "e" not in fmt_number(mantissa * 10.0 ** exponent).lower(), (mantissa, exponent)


def test_a_wrong_byte_count_is_printed_exactly(capsys):
    C.reset_results()
    check("0.1", 320 * 2**20)  # 335,544,320 B, far from 524,288
    line = capsys.readouterr().out.strip()
    assert line.startswith("❌ Checkoff 0.1: you gave 335,544,320 B,"), line
    assert "e+" not in line


@pytest.mark.parametrize("markdown, text", [
    ("the allocator's slots (`alloc.slots`, a dict of `Slot`s)", "the allocator's slots (alloc.slots, a dict of Slots)"),
    ("costs of *reading* the cache and of **holding** it", "costs of reading the cache and of holding it"),
    ("``@triton.jit``", "@triton.jit"),
    ("block ids just below 2**31, and a * b", "block ids just below 2**31, and a * b"),  # not emphasis
    ("(*case, expected)", "(*case, expected)"),
])
def test_plain_drops_markdown_marks_only(markdown, text):
    assert plain(markdown) == text


def _emphasis_or_code(text: str) -> list[str]:
    return re.findall(r"`[^`]+`|(?<![\w*])\*[^\s*][^*]*\*(?![\w*])", text)


def test_no_feedback_line_shows_markdown():
    """Every checkoff's failure line (with its hint) and not-attempted line (with its title and each of its
    prompts), every lab, as check() prints them from the lab's record."""
    entries = [e for lab in range(9) for e in load_lab(lab)]
    lines = []
    for e in entries:
        lines.append(plain(FAIL_LINE.format(id=e["id"], problem="x.", hint=e["hint"])))
        for prompt in [e["title"], *e["prompts"]]:
            lines.append(plain(NOT_ATTEMPTED_LINE.format(id=e["id"], prompt=prompt)))
    assert len(entries) > 40 and len(lines) > 2 * 40
    marked = [m for line in lines for m in _emphasis_or_code(line)]
    assert not marked, marked[:5]
    # and the hints and prompts did carry some: the stripping is what keeps them out
    assert [m for e in entries for m in _emphasis_or_code(e["hint"])]
    assert [m for e in entries for p in e["prompts"] for m in _emphasis_or_code(p)]


def test_a_printed_hint_carries_no_markdown(capsys):
    hinted = next(e for lab in range(9) for e in load_lab(lab) if _emphasis_or_code(e["hint"]) and e["kind"] == "choice")
    C.reset_results()
    check(hinted["id"], "certainly not an option")
    out = capsys.readouterr().out
    assert out.startswith(f"❌ Checkoff {hinted['id']}:") and not _emphasis_or_code(out), out


_COUNT_WORDS = ("two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
                "seventeen eighteen nineteen twenty").split()


def test_no_lab_types_how_many_checkoffs_it_has():
    """A typed count goes stale (lab 02 said eleven while its scoreboard listed 12): the scoreboard counts."""
    count = re.compile(rf"\b(\d+|{'|'.join(_COUNT_WORDS)})\s+(checkoffs|exercises)\b", re.I)
    for source in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        found = count.findall(source.read_text(encoding="utf-8"))
        assert not found, (source.name, found)


@pytest.mark.parametrize("rel_tol, abs_tol, text", [
    (1e-6, 0.0, "within 0.0001% of"),  # 3.6's tolerance, which printed as "0.00%"
    (1e-3, 0.0, "within 0.1% of"),
    (5e-5, 0.0, "within 0.005% of"),
    (2.5e-4, 0.5, "within ±0.5 or 0.025% of"),
    (0.0, 0.0, "not exactly right"),
])
def test_a_tolerance_is_printed_with_its_significant_digits(rel_tol, abs_tol, text):
    from labsupport.course.judge import tolerance_text

    assert text in tolerance_text(rel_tol, abs_tol)
