"""The course tooling: turning lab sources into notebooks, checkoffs, and grading.

    build.py     solutions/NN_topic.py -> the executed solution notebook and the student copy
    checkoff.py  check("N.M", answer): instant feedback in the student's notebook
    grade.py     python -m labsupport grade: the scoreboard from a fresh kernel
    checkoffs/   one module per lab registering its checkoffs (labNN.py)

Students never need to open this package: the mechanisms the labs teach are the modules at the top
of `labsupport`.
"""
