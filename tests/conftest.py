"""Shared fixtures."""
from __future__ import annotations

import contextlib
import io
import re

import pytest


@pytest.fixture
def fails():
    """`with fails("too low"): check(...)`: the block must print one ❌ line (check() never raises for
    an answer) whose text matches the pattern; the context's value collects everything it printed."""

    @contextlib.contextmanager
    def expect(match: str = ""):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            yield out
        text = out.getvalue()
        assert text.startswith("❌ Checkoff "), text
        assert "Hint: " in text.splitlines()[0], text
        assert re.search(match, text), f"{match!r} not in {text!r}"

    return expect
