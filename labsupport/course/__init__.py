"""The course tooling: turning lab sources into notebooks, checkoffs, and grading.

    build.py        solutions/NN_topic.py -> the executed solution notebook and the student copy
    checkoff.py     check("N.M", answer): instant feedback in the student's notebook
    checkoffs/      one module per lab registering its checkoffs (labNN.py): expected values, cases
    grade.py        python -m labsupport grade: verdicts decided outside the student's kernel
    answers.py      a notebook read as a file: its check() calls, each answer's code, derive-don't-call
    codec.py        the plain data that crosses from a student's process to the grader
    worker.py       the throw-away process a function answer is tried in
    sandbox.py      the sandbox student code is graded in (bubblewrap; else a user id of its own)
    release.py      python -m labsupport release: what students get, without answers
    formative.py    check() in the release: sealed records of each lab's own cases
    open_answers.py judges of open questions (no answer to hide)
    autograder.py   python -m labsupport autograder: the Gradescope bundle

Students never need to open this package: the mechanisms the labs teach are the modules at the top
of `labsupport`.
"""
