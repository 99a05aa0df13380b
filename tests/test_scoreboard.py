"""labsupport.course.scoreboard: the last cell of every lab, read from this kernel's check() results."""
from __future__ import annotations

import contextlib
import io

import pytest

from labsupport.course import checkoff as C
from labsupport.course import record
from labsupport.course.scoreboard import scoreboard

pytestmark = pytest.mark.usefixtures("fresh_results")


def _quietly(checkoff_id, answer) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        C.check(checkoff_id, answer)


def _kv_bytes_as_given() -> int:
    """0.1's answer on the givens lab 00's record publishes (what check() grades against): KV_KIB KiB in bytes, by
    hand (512 x 1,024 = 524,288 B on the lecture's card, 56 x 1,024 = 57,344 B on A100-80GB + Qwen2.5-7B)."""
    return record.read(0)["givens"]["KV_KIB"] * 1024


def test_scoreboard_counts_what_this_kernel_checked():
    _quietly("0.1", _kv_bytes_as_given())  # right
    board = scoreboard("00_setup")
    assert [(r.id, r.status) for r in board.rows] == [("0.1", "passed"), ("0.2", "not attempted")]  # 0.2 never ran
    _quietly("0.2", lambda layers, heads, dim, nbytes: 1)  # wrong
    board = scoreboard("00_setup")
    assert [(r.id, r.status) for r in board.rows] == [("0.1", "passed"), ("0.2", "failed")]
    assert board.summary == "1 of 2 passed, 1 failed, 0 not attempted in this kernel"
    text = repr(board)
    assert text.splitlines()[1] == "  ✅ 0.1   passed         KV per token in bytes"
    assert "❌ 0.2   failed" in text
    assert "python -m labsupport grade notebooks/00_setup.ipynb" in text and "feedback" in text
    page = board._repr_html_()
    assert page.count("<tr>") == 3 and "python -m labsupport grade notebooks/00_setup.ipynb" in page


def test_the_placeholder_and_unfinished_functions_count_as_not_attempted():
    _quietly("0.1", ...)
    _quietly("0.2", lambda *a: (_ for _ in ()).throw(NotImplementedError("not yet")))
    board = scoreboard("00_setup")
    assert board.count("not attempted") == 2 and board.count("passed") == 0


def test_titles_are_escaped_and_names_checked(tmp_path, monkeypatch):
    """The scoreboard lists what the lab's record lists; a title is text, never markup."""
    entry = {"id": "97.1", "title": "a <b>bold</b> & odd title", "hint": "one", "kind": "value", "prompts": [],
             "cells": [], "forbid": [], "derive": "", "sealed": record.seal({"spec": {"want": 1}}, 97)}
    (tmp_path / "lab97.json").write_text(record.dumps({"lab": 97, "checkoffs": [entry]}), encoding="utf-8")
    monkeypatch.setattr(record, "FOLDER", tmp_path)
    record.read.cache_clear()
    try:
        board = scoreboard("97_test")
        assert [(r.id, r.title, r.status) for r in board.rows] == [("97.1", "a <b>bold</b> & odd title", "not attempted")]
        page = board._repr_html_()
        assert "a &lt;b&gt;bold&lt;/b&gt; &amp; odd title" in page and "<b>bold</b>" not in page
        assert scoreboard("96_no_record").rows == ()  # a lab without a record has nothing to score
    finally:
        record.read.cache_clear()
    with pytest.raises(ValueError, match="like '02_naive_allocator'"):
        scoreboard("lab two")
