"""One module per lab, ``labNN.py``, registering that lab's checkoffs (see labsupport.course.checkoff).

`labsupport.course.checkoff.get("N.M")` imports ``labsupport.course.checkoffs.labNN`` on first use, so adding a
lab's checkoffs means adding its module here and nothing else.  A module looks like::

    from labsupport.course.checkoff import Mismatch, call, expect_close, function, value

    value("2.1", "Bytes in one reserve-to-max slot",
          expected=lambda: 4096 * 2 * 32 * 32 * 128 * 2,   # derived here, not by calling the lab's code
          hint="A slot holds S_max tokens whatever the sequence uses ...", unit=" B",
          forbid=("labsupport.ledger.naive_slot_bytes",), derive="multiply S_max by the KV bytes per token")

    def _cases(rng):                                       # the lab's own inputs, plus random ones from rng
        return [(case, expected_for(case)) for case in LAB_CASES + [random_case(rng) for _ in range(5)]]

    @function("3.2", "Slot mapping", hint="...", cases=_cases, forbid=(...), derive="...")
    def _(student_fn, case):                               # one prepared case at a time
        args, want = case
        expect_close(call(student_fn, *args), want, f"slot_mapping{args}")   # the student's errors become a Mismatch

Cases are prepared before the student's function is seen: `grade` draws `rng` from a secret (so the
random cases are hidden), a notebook's check() from a fixed public seed.  The judge must reach the
student's function only through `call` (or `call_with`, to run a library function with it inside),
since when grading it lives in another process; `_hidden.py` draws models and cards no preset has.

These modules are the graders: they hold the expected values and the hidden-input generators, so the
student release leaves this package out, and `grade` never copies it where student code runs.

In the lab's source the exercise is a solution region naming the checkoff, and the checkoff cell
calls ``check("3.2", slot_mapping)``; `python -m labsupport build` refuses a lab whose regions,
``check()`` calls and registered checkoffs do not match one to one.
"""
