"""The course tooling: lab sources into notebooks, feedback in the notebook, and the grade.

    build.py      solutions/NN_topic.py -> the executed solution and the student copy, and the lab's public record
    record.py     the public record check() reads (records/labNN.json): expected values on the lecture's givens
    checkoff.py   check("N.M", answer): instant feedback in the student's notebook
    judge.py      an answer against its expected value, in one line (check() and grade alike)
    harness/      a handed-in function run on a checkoff's cases, wherever it lives (public): the shared core,
                  and per lab harness/labNN.py, its harnesses and judges, beside its grader checkoffs/labNN.py
    scan.py       derive, don't call: the one static scan of an exercise's cells
    data.py       the plain data that crosses into and out of a sandbox
    registry.py   how a lab's graders declare checkoffs (checkoffs/labNN.py: expected formulas, hidden givens)
    grade.py      python -m labsupport grade: each notebook run whole on hidden givens, judged outside
    runner.py     what runs inside a grading sandbox: the notebook's cells, once per set of givens
    sandbox.py    bubblewrap or a container, every resource bounded
    report.py     the grade's table, JSON, CSV and Gradescope results, with student text made safe
    scaffold.py   python -m labsupport checkoff new N.M: a new checkoff in its two files
    release.py    python -m labsupport release: what students get, without the graders
    autograder.py python -m labsupport autograder: the Gradescope bundle
    scoreboard.py the closing cell of every lab

Students never need to open this package: the mechanisms the labs teach are the modules at the top
of `labsupport`.  Adding a checkoff: COURSE_AUTHORING.md.
"""
