"""`python -m labsupport bench plans`: grading plans drawn at scale, every failure counted and named.

The command the issue's 100,000-plan one-off runs by (a machine with more cores than CI's runs it with --jobs);
here a few dozen plans a lab, a planted failure, and bad flags.
"""
from __future__ import annotations

import pytest

from labsupport import bench
from labsupport.course.grade import Grader


def test_a_small_sweep_builds_every_plan(capsys):
    assert bench.main(["plans", "--labs", "00,02", "--count", "30", "--start", "5", "--jobs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["00_setup", "02_naive_allocator"], out
    assert all("30 plans (students 5..34), 0 failures;" in line for line in out), out


def test_a_plan_that_fails_is_counted_and_named(capsys, monkeypatch):
    real = Grader.plan

    def failing(self, lab, student):
        if student == "student7":
            raise ValueError("Sample larger than population")
        return real(self, lab, student)

    monkeypatch.setattr(Grader, "plan", failing)  # the workers are forked after this, and inherit it
    assert bench.main(["plans", "--labs", "01", "--count", "10"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert "10 plans" in line and "1 failures (student7: ValueError: Sample larger than population)" in line, line


@pytest.mark.parametrize("argv, says", [
    (["--count", "0"], "--count"), (["--labs", "42"], "42"), (["--labs", "99"], "board"),
    (["--jobs", "x"], "--jobs"), (["--start", "-1"], "--start"),
])
def test_a_bad_flag_is_one_line_and_exit_2(capsys, argv, says):
    assert bench.main(["plans", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
