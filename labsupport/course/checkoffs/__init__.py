"""One module per lab, ``labNN.py``, registering that lab's checkoffs (see labsupport.course.checkoff).

`labsupport.course.checkoff.get("N.M")` imports ``labsupport.course.checkoffs.labNN`` on first use, so adding a
lab's checkoffs means adding its module here and nothing else.  A module looks like::

    from labsupport.course.checkoff import Mismatch, call, choice, expect_close, function, value

    value("2.1", "Bytes in one reserve-to-max slot",
          expected=lambda: 4096 * 2 * 32 * 32 * 128 * 2,   # derived here, not by calling the lab's code
          hint="A slot holds S_max tokens whatever the sequence uses ...", unit=" B")

    @function("3.2", "Slot mapping", hint="...")
    def _(student_fn):
        for case in cases:                                 # random workloads, other block sizes
            got = call(student_fn, *case.args)             # the student's errors become a Mismatch
            expect_close(got, case.expected, f"slot_mapping{case.args}")

In the lab's source the exercise is a solution region naming the checkoff, and the checkoff cell
calls ``check("3.2", slot_mapping)``; `python -m labsupport build` refuses a lab whose regions,
``check()`` calls and registered checkoffs do not match one to one.
"""
